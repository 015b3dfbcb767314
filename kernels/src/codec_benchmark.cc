// CPU codec throughput, one thread: GB/s of BF16-equivalent K/V (2 bytes per element), so the
// figures compare directly with the bytes an engine would otherwise move.
#include <algorithm>
#include <cstring>
#include <random>

#include "benchmark/benchmark.h"
#include "oscarkv/kernels/page_checksum.h"
#include "oscarkv/kernels/page_codec.h"
#include "oscarkv/kernels/quantize.h"
#include "page_checksum_fused.h"

namespace oscarkv {
namespace {

struct Workload {
  CodecProfile profile = *BuiltinProfile("qwen3-8b");
  std::vector<float> kv;
  KVSequenceView view;
  Workload() {
    std::mt19937 rng(1);
    std::normal_distribution<float> n;
    kv.resize(size_t{36} * 2 * 64 * 8 * 128);
    for (auto& v : kv) v = n(rng);
    view = {kv.data(), 36, 8, 128, 64};
  }
  size_t bf16_bytes() const { return kv.size() * 2; }
};

const Workload& W() {
  static const Workload* w = new Workload;
  return *w;
}

void BM_QuantizePackRows(benchmark::State& state) {
  const auto& w = W();
  std::vector<uint8_t> codes(32);
  std::vector<uint16_t> sm(2);
  const size_t rows = w.kv.size() / 128;
  for (auto _ : state) {
    for (size_t r = 0; r < rows; ++r) {
      QuantizeRowInt2(w.kv.data() + r * 128, 128, 128, codes.data(), sm.data());
      benchmark::DoNotOptimize(codes.data());
    }
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * w.bf16_bytes());
}
BENCHMARK(BM_QuantizePackRows)->Unit(benchmark::kMillisecond);

void BM_UnpackDequantizeRows(benchmark::State& state) {
  const auto& w = W();
  const size_t rows = w.kv.size() / 128;
  std::vector<uint8_t> codes(rows * 32);
  std::vector<uint16_t> sm(rows * 2);
  for (size_t r = 0; r < rows; ++r) {
    QuantizeRowInt2(w.kv.data() + r * 128, 128, 128, codes.data() + r * 32, sm.data() + r * 2);
  }
  std::vector<float> out(128);
  for (auto _ : state) {
    for (size_t r = 0; r < rows; ++r) {
      DequantizeRowInt2(codes.data() + r * 32, sm.data() + r * 2, 128, 128, out.data());
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * w.bf16_bytes());
}
BENCHMARK(BM_UnpackDequantizeRows)->Unit(benchmark::kMillisecond);

// Whole-page writer (header, checksum, layout) on pre-rotated rows, no clipping.
void BM_EncodeInt2Page(benchmark::State& state) {
  const auto& w = W();
  std::vector<uint8_t> page(GeometryFor(w.profile, PageKind::kInt2).page_bytes());
  for (auto _ : state) {
    auto s = EncodePage(w.profile, nullptr, PageKind::kInt2, w.view, 0, 64, page);
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * w.bf16_bytes());
}
BENCHMARK(BM_EncodeInt2Page)->Unit(benchmark::kMillisecond);

void BM_DecodeInt2Page(benchmark::State& state) {
  const auto& w = W();
  auto page = *EncodePage(w.profile, nullptr, PageKind::kInt2, w.view, 0, 64);
  for (auto _ : state) {
    auto d = DecodePage(w.profile, page);
    benchmark::DoNotOptimize(d);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * w.bf16_bytes());
}
BENCHMARK(BM_DecodeInt2Page)->Unit(benchmark::kMillisecond);

// Encode with a full rotation (d x d matvec per row) and per-row clipping: the complete
// OSCAR write path on the CPU.
void BM_EncodeInt2PageRotatedClipped(benchmark::State& state) {
  const auto& w = W();
  auto rot = RotationSet::Hadamard(36, 8, 128, 0.96f, 0.92f);
  std::vector<uint8_t> page(GeometryFor(w.profile, PageKind::kInt2).page_bytes());
  for (auto _ : state) {
    auto s = EncodePage(w.profile, &rot, PageKind::kInt2, w.view, 0, 64, page);
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * w.bf16_bytes());
}
BENCHMARK(BM_EncodeInt2PageRotatedClipped)->Unit(benchmark::kMillisecond);

// A page copied into the pool with its checksum (what the daemon does for every staged store,
// and the client for every verified load), side by side with a plain memcpy of the same pages:
// Qwen3-8B INT2 pages (1,327,168 bytes), 64 of them (85 MB, beyond the last-level cache), one
// thread. Arg: 0 memcpy, 1 copy then hash each 128 KiB piece while it is in L2 (the portable
// path), 2 the fused AVX2 loop, 3 the fused AVX-512F loop (skipped where the CPU lacks it).
void BM_PageCopy(benchmark::State& state) {
  using checksum_internal::FusedIsa;
  constexpr size_t kPage = 1327168, kPages = 64;
  const int mode = static_cast<int>(state.range(0));
  const FusedIsa isa = mode == 3 ? FusedIsa::kAvx512 : FusedIsa::kAvx2;
  if (mode >= 2 && !checksum_internal::FusedIsaSupported(isa)) {
    state.SkipWithError("this CPU does not run that instruction set");
    return;
  }
  std::vector<uint8_t> src(kPage * kPages), dst(kPage * kPages);
  std::mt19937 rng(3);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::memset(dst.data(), 0, dst.size());  // fault the destination in before timing
  uint64_t sink = 0;
  for (auto _ : state) {
    for (size_t i = 0; i < kPages; ++i) {
      uint8_t* d = dst.data() + i * kPage;
      const uint8_t* s = src.data() + i * kPage;
      if (mode == 0) {
        std::memcpy(d, s, kPage);
      } else if (mode == 1) {
        PageChecksummer h;
        for (size_t off = 0; off < kPage; off += kChecksumChunkBytes) {
          const size_t len = std::min(kChecksumChunkBytes, kPage - off);
          std::memcpy(d + off, s + off, len);
          h.Update(std::span<const uint8_t>(d + off, len));
        }
        sink += h.Digest();
      } else {
        checksum_internal::FusedCopyState st;
        checksum_internal::FusedCopyBegin(&st, kPage, isa);
        checksum_internal::FusedCopyNext(&st, d, s, kPage);
        sink += checksum_internal::FusedCopyDigest(st, d);
      }
    }
    benchmark::DoNotOptimize(sink);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kPage * kPages));
}
BENCHMARK(BM_PageCopy)->Arg(0)->Arg(1)->Arg(2)->Arg(3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace oscarkv

BENCHMARK_MAIN();
