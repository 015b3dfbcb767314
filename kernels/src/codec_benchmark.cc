// CPU codec throughput, one thread: GB/s of BF16-equivalent K/V (2 bytes per element), so the
// figures compare directly with the bytes an engine would otherwise move.
#include <random>

#include "benchmark/benchmark.h"
#include "oscarkv/kernels/page_codec.h"
#include "oscarkv/kernels/quantize.h"

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

}  // namespace
}  // namespace oscarkv

BENCHMARK_MAIN();
