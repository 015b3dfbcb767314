// GPU tests of CUDA-graph capture (label gpu; skipped without a device): a decode step
// (PagedDecoder::CreateForCapture + Update) and a quantize-on-write step are captured once in a
// CUDA graph (cudaStreamCaptureModeGlobal: the capture fails on any synchronising or allocating
// call), then replayed over new batches -- other sequence counts, lengths (empty sequences and
// lengths that are not page multiples included), page tables and inputs, written into the same
// device buffers. Every replay's output must equal, byte for byte, an eager launch of the same
// step after the same Update; the decode output must also match the CPU reference
// (ReferencePagedDecode, |out - ref| <= 2e-3·(1 + |ref|)), and rows past the batch must be 0 with
// lse -inf. Outputs are poisoned (NaN) before every launch.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/cuda/decode_runner.h"
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/cuda/quantize_write.h"
#include "oscarkv/cuda/reference.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/page_set.h"

namespace oscarkv::cuda {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device: GPU test skipped"

// A stream and a graph captured on it, released at scope exit.
struct Captured {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Captured() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

// Captures fn(stream) (which returns absl::Status) into c->graph and instantiates it.
template <typename F>
void Capture(Captured* c, F fn) {
  ASSERT_EQ(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const absl::Status st = fn(c->stream);
  const cudaError_t end = cudaStreamEndCapture(c->stream, &c->graph);
  ASSERT_TRUE(st.ok()) << "launch during capture: " << st;
  ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  ASSERT_EQ(cudaGraphInstantiate(&c->exec, c->graph, 0), cudaSuccess);
}

struct DecodeBatch {
  std::vector<uint32_t> lengths;
};

TEST(GraphCaptureGpu, DecodeReplaysWithNewLengthsAndPageTables) {
  SKIP_WITHOUT_GPU();
  for (uint32_t gqa : {4u, 8u}) {  // the packed int8 kernel (GQA <= 4) and the baseline (GQA 8)
    SCOPED_TRACE("gqa " + std::to_string(gqa));
    CodecProfile prof;
    prof.model_id = "test";
    prof.model_revision = "1";
    prof.num_layers = 2;
    prof.num_kv_heads = 2;
    prof.head_dim = 128;
    prof.page_tokens = 64;
    prof.group_size = 128;
    prof.sink_tokens = 64;
    prof.recent_tokens = 256;
    ASSERT_TRUE(prof.Validate().ok());
    const uint32_t layer = 1, d = 128, H = prof.num_kv_heads, Hq = H * gqa;
    RotationSet rot = RotationSet::Hadamard(prof.num_layers, H, d, 0.95f, 0.92f);
    std::mt19937 rng(7 + gqa);
    std::normal_distribution<float> nd;
    // Batches replayed in turn (the first also warms up and is captured).
    const std::vector<DecodeBatch> batches = {
        {{700, 64}}, {{1500, 0, 333, 129}}, {{2500}}, {{5, 1200, 64}}, {{3000, 2000, 1, 900}}};
    const int32_t max_seqs = 4;
    const int32_t max_pages = (3000 + 63) / 64 + 2;
    const size_t pool_pages = size_t(max_seqs) * max_pages;
    const size_t page_bytes = std::max(GeometryFor(prof, PageKind::kInt2).page_bytes(),
                                       GeometryFor(prof, PageKind::kBf16).page_bytes());
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    const DecodeShape shape{prof.num_layers, H, Hq, d, prof.group_size, prof.page_tokens, layer};
    auto dec = PagedDecoder::CreateForCapture(shape, {max_seqs, max_pages}, sms);
    ASSERT_TRUE(dec.ok()) << dec.status();

    // Fixed device buffers, rewritten for every batch.
    auto pool = DeviceBuffer::Create(pool_pages * page_bytes);
    auto d_ptrs = DeviceBuffer::Create(pool_pages * sizeof(uint8_t*));
    auto d_kinds = DeviceBuffer::Create(pool_pages);
    auto d_counts = DeviceBuffer::Create(pool_pages * 2);
    auto d_indptr = DeviceBuffer::Create((max_seqs + 1) * 4);
    auto d_ids = DeviceBuffer::Create(pool_pages * 4);
    auto d_q = DeviceBuffer::Create(size_t(max_seqs) * Hq * d * 4);
    auto d_out = DeviceBuffer::Create(size_t(max_seqs) * Hq * d * 4);
    auto d_lse = DeviceBuffer::Create(size_t(max_seqs) * Hq * 4);
    std::vector<float> rk(rot.matrix(layer, KV::kKey, 0), rot.matrix(layer, KV::kKey, 0) + H * d * d);
    std::vector<float> rv(rot.matrix(layer, KV::kValue, 0), rot.matrix(layer, KV::kValue, 0) + H * d * d);
    auto d_rk = DeviceBuffer::FromHost(rk);
    auto d_rv = DeviceBuffer::FromHost(rv);
    for (auto* b : {&pool, &d_ptrs, &d_kinds, &d_counts, &d_indptr, &d_ids, &d_q, &d_out, &d_lse,
                    &d_rk, &d_rv}) {
      ASSERT_TRUE(b->ok()) << b->status();
    }
    DecodeInputs in;
    in.table.page_ptrs = d_ptrs->as<const uint8_t* const>();
    in.table.page_kinds = d_kinds->as<uint8_t>();
    in.table.page_token_counts = d_counts->as<uint16_t>();
    in.table.seq_page_indptr = d_indptr->as<int32_t>();
    in.table.seq_page_ids = d_ids->as<int32_t>();
    in.q = d_q->as<float>();
    in.rot_k = d_rk->as<float>();
    in.rot_v = d_rv->as<float>();
    in.unrotate_output = true;
    in.out = d_out->as<float>();
    in.lse = d_lse->as<float>();
    Captured cap;
    ASSERT_EQ(cudaStreamCreateWithFlags(&cap.stream, cudaStreamNonBlocking), cudaSuccess);
    const size_t out_elems = size_t(max_seqs) * Hq * d, lse_elems = size_t(max_seqs) * Hq;

    for (size_t bi = 0; bi < batches.size(); ++bi) {
      const DecodeBatch& batch = batches[bi];
      SCOPED_TRACE("batch " + std::to_string(bi));
      // Pages of this batch, in a shuffled order of pool slots (a new page table).
      std::vector<std::vector<uint8_t>> pages;
      std::vector<uint8_t> kinds;
      std::vector<uint16_t> counts;
      HostPagedKV host;
      host.seq_page_indptr.push_back(0);
      for (uint32_t n : batch.lengths) {
        std::vector<float> kvdata(size_t{prof.num_layers} * 2 * n * H * d);
        for (auto& v : kvdata) v = nd(rng) * 0.8f + 0.1f;
        KVSequenceView view{kvdata.data(), prof.num_layers, H, d, n};
        for (const PlannedPage& pp : PlanSequencePages(prof, n)) {
          auto page = EncodePage(prof, &rot, pp.kind, view, pp.first_token, pp.token_count);
          ASSERT_TRUE(page.ok()) << page.status();
          host.seq_page_ids.push_back(static_cast<int32_t>(pages.size()));
          pages.push_back(*std::move(page));
          kinds.push_back(static_cast<uint8_t>(pp.kind));
          counts.push_back(static_cast<uint16_t>(pp.token_count));
        }
        host.seq_page_indptr.push_back(static_cast<int32_t>(host.seq_page_ids.size()));
      }
      for (const auto& pg : pages) host.pages.emplace_back(pg);
      ASSERT_LE(pages.size(), pool_pages);
      std::vector<size_t> slot(pool_pages);
      for (size_t i = 0; i < slot.size(); ++i) slot[i] = i;
      std::shuffle(slot.begin(), slot.end(), rng);
      std::vector<const uint8_t*> ptrs(pages.size());
      for (size_t i = 0; i < pages.size(); ++i) {
        ptrs[i] = pool->as<uint8_t>() + slot[i] * page_bytes;
        ASSERT_EQ(cudaMemcpy(const_cast<uint8_t*>(ptrs[i]), pages[i].data(), pages[i].size(),
                             cudaMemcpyHostToDevice), cudaSuccess);
      }
      const size_t B = batch.lengths.size();
      std::vector<float> q(B * Hq * d);
      for (auto& v : q) v = nd(rng) * 2.0f;
      ASSERT_EQ(cudaMemcpy(d_ptrs->get(), ptrs.data(), ptrs.size() * sizeof(uint8_t*), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d_kinds->get(), kinds.data(), kinds.size(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d_counts->get(), counts.data(), counts.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d_indptr->get(), host.seq_page_indptr.data(), host.seq_page_indptr.size() * 4,
                           cudaMemcpyHostToDevice), cudaSuccess);
      if (!host.seq_page_ids.empty()) {
        ASSERT_EQ(cudaMemcpy(d_ids->get(), host.seq_page_ids.data(), host.seq_page_ids.size() * 4,
                             cudaMemcpyHostToDevice), cudaSuccess);
      }
      ASSERT_EQ(cudaMemcpy(d_q->get(), q.data(), q.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_TRUE(dec->Update(host.seq_page_indptr, host.seq_page_ids, kinds, cap.stream).ok());

      auto launch = [&](bool graph) -> std::pair<std::vector<float>, std::vector<float>> {
        EXPECT_EQ(cudaMemsetAsync(d_out->get(), 0xff, out_elems * 4, cap.stream), cudaSuccess);
        EXPECT_EQ(cudaMemsetAsync(d_lse->get(), 0xff, lse_elems * 4, cap.stream), cudaSuccess);
        if (graph) {
          EXPECT_EQ(cudaGraphLaunch(cap.exec, cap.stream), cudaSuccess);
        } else {
          const absl::Status st = dec->Run(in, cap.stream);
          EXPECT_TRUE(st.ok()) << st;
        }
        EXPECT_EQ(cudaStreamSynchronize(cap.stream), cudaSuccess);
        auto o = d_out->ToHost<float>();
        auto l = d_lse->ToHost<float>();
        EXPECT_TRUE(o.ok() && l.ok());
        return {o.ok() ? *o : std::vector<float>(), l.ok() ? *l : std::vector<float>()};
      };
      if (bi == 0) {
        // Eager warm-up (first launches set kernel attributes), then the capture.
        launch(false);
        Capture(&cap, [&](cudaStream_t s) { return dec->Run(in, s); });
        if (HasFatalFailure()) return;
      }
      const auto [out_g, lse_g] = launch(true);
      const auto [out_e, lse_e] = launch(false);
      ASSERT_EQ(out_g.size(), out_elems);
      ASSERT_EQ(out_e.size(), out_elems);
      EXPECT_EQ(0, std::memcmp(out_g.data(), out_e.data(), out_elems * 4)) << "graph replay != eager output";
      EXPECT_EQ(0, std::memcmp(lse_g.data(), lse_e.data(), lse_elems * 4)) << "graph replay != eager lse";

      auto ref = ReferencePagedDecode(prof, rot, host, layer, q, Hq, true);
      ASSERT_TRUE(ref.ok()) << ref.status();
      int bad = 0;
      double max_scaled = 0;
      for (size_t i = 0; i < out_elems; ++i) {
        const bool in_batch = i < B * Hq * d;
        const double r = in_batch ? ref->out[i] : 0.0, g = out_g[i];
        const double e = std::fabs(g - r) / (1 + std::fabs(r));
        if (!(e <= 2e-3) && ++bad < 5) ADD_FAILURE() << "out[" << i << "] graph " << g << " ref " << r;
        if (std::isfinite(e)) max_scaled = std::max(max_scaled, e);
      }
      for (size_t i = 0; i < lse_elems; ++i) {
        const float r = i < B * Hq ? ref->lse[i] : -INFINITY, g = lse_g[i];
        if (std::isinf(r)) {
          EXPECT_TRUE(std::isinf(g) && g < 0) << "lse[" << i << "] " << g;
        } else if (!(std::fabs(g - r) <= 2e-3) && ++bad < 10) {
          ADD_FAILURE() << "lse[" << i << "] graph " << g << " ref " << r;
        }
      }
      EXPECT_EQ(bad, 0);
      std::printf("[ graph ] decode gqa %u batch %zu (B=%zu): replay == eager, max |out - ref| / (1 + |ref|) = %.3g\n",
                  gqa, bi, B, max_scaled);
    }
  }
}

TEST(GraphCaptureGpu, QuantizeWriteReplaysWithNewRowsAndDestinations) {
  SKIP_WITHOUT_GPU();
  const uint32_t layers = 2, H = 2, d = 128, page_tokens = 64;
  const int32_t T = 48;  // tokens per step (one decode step of 48 sequences, say)
  const uint32_t n_pages = 6;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<uint8_t> kinds(n_pages);
  std::vector<size_t> sizes(n_pages);
  size_t total = 0;
  for (uint32_t i = 0; i < n_pages; ++i) {
    kinds[i] = static_cast<uint8_t>(i % 3 == 1 ? PageKind::kBf16 : PageKind::kInt2);
    sizes[i] = PageGeometry{layers, H, d, 128, page_tokens, static_cast<PageKind>(kinds[i])}.page_bytes();
    total += sizes[i];
  }
  auto pool = DeviceBuffer::Create(total);
  auto d_ptrs = DeviceBuffer::Create(n_pages * sizeof(uint8_t*));
  auto d_kinds = DeviceBuffer::FromHost(kinds);
  auto d_page = DeviceBuffer::Create(T * 4);
  auto d_slot = DeviceBuffer::Create(T * 4);
  auto d_k = DeviceBuffer::Create(size_t(T) * H * d * 2);
  auto d_v = DeviceBuffer::Create(size_t(T) * H * d * 2);
  RotationSet rot = RotationSet::Hadamard(layers, H, d);
  auto d_mats = DeviceBuffer::FromHost(std::vector<float>(rot.matrices()));
  auto d_frag = DeviceBuffer::Create(size_t(layers) * 2 * H * kRotationFragmentBytes);
  // Unbiased-fixed ranges per head (the default codec's write, as the engine launches it).
  std::vector<uint8_t> modes(2 * H);
  for (size_t i = 0; i < modes.size(); ++i) modes[i] = static_cast<uint8_t>(UnbiasedFixed(6 + i % 2));
  auto d_modes = DeviceBuffer::FromHost(modes);
  for (auto* b : {&pool, &d_ptrs, &d_kinds, &d_page, &d_slot, &d_k, &d_v, &d_mats, &d_frag, &d_modes}) {
    ASSERT_TRUE(b->ok()) << b->status();
  }
  std::vector<uint8_t*> ptrs(n_pages);
  size_t off = 0;
  for (uint32_t i = 0; i < n_pages; ++i) {
    ptrs[i] = pool->as<uint8_t>() + off;
    off += sizes[i];
  }
  ASSERT_EQ(cudaMemcpy(d_ptrs->get(), ptrs.data(), n_pages * sizeof(uint8_t*), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(PrepareRotationFragments(d_mats->as<float>(), static_cast<int>(layers * 2 * H), d_frag->get(), nullptr).ok());
  QuantizeWriteParams p;
  p.num_layers = layers;
  p.num_kv_heads = H;
  p.page_tokens = page_tokens;
  p.first_layer = 1;
  p.layer_count = 1;
  p.k_src = d_k->as<uint16_t>();
  p.v_src = d_v->as<uint16_t>();
  p.src_token_stride = H * d;
  p.src_head_stride = d;
  p.num_tokens = T;
  p.page_ptrs = d_ptrs->as<uint8_t* const>();
  p.page_kinds = d_kinds->as<uint8_t>();
  p.dst_page = d_page->as<int32_t>();
  p.dst_slot = d_slot->as<int32_t>();
  p.rot_fragments = d_frag->as<uint8_t>() + size_t{2} * H * kRotationFragmentBytes;  // layer 1
  p.range_modes = d_modes->as<uint8_t>();
  p.range_modes_fixed_only = true;
  Captured cap;
  ASSERT_EQ(cudaStreamCreateWithFlags(&cap.stream, cudaStreamNonBlocking), cudaSuccess);
  auto run = [&](bool graph) {
    EXPECT_EQ(cudaMemsetAsync(pool->get(), 0x5a, total, cap.stream), cudaSuccess);
    if (graph) {
      EXPECT_EQ(cudaGraphLaunch(cap.exec, cap.stream), cudaSuccess);
    } else {
      const absl::Status st = LaunchQuantizeWrite(p, cap.stream);
      EXPECT_TRUE(st.ok()) << st;
    }
    EXPECT_EQ(cudaStreamSynchronize(cap.stream), cudaSuccess);
    auto h = pool->ToHost<uint8_t>();
    EXPECT_TRUE(h.ok());
    return h.ok() ? *h : std::vector<uint8_t>();
  };
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    // New rows and new destinations (shuffled slots of the pool's pages), written in place.
    std::vector<uint16_t> k(size_t(T) * H * d), v(k.size());
    for (auto& x : k) x = FloatToBf16(nd(rng));
    for (auto& x : v) x = FloatToBf16(nd(rng) * 0.5f);
    std::vector<int32_t> slots(n_pages * page_tokens);
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(i);
    std::shuffle(slots.begin(), slots.end(), rng);
    std::vector<int32_t> dp(T), ds(T);
    for (int32_t t = 0; t < T; ++t) {
      dp[t] = slots[t] / static_cast<int32_t>(page_tokens);
      ds[t] = slots[t] % static_cast<int32_t>(page_tokens);
    }
    ASSERT_EQ(cudaMemcpy(d_k->get(), k.data(), k.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_v->get(), v.data(), v.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_page->get(), dp.data(), T * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_slot->get(), ds.data(), T * 4, cudaMemcpyHostToDevice), cudaSuccess);
    if (step == 0) {
      run(false);  // eager warm-up (the first launch probes the device), then the capture
      Capture(&cap, [&](cudaStream_t s) { return LaunchQuantizeWrite(p, s); });
      if (HasFatalFailure()) return;
    }
    const std::vector<uint8_t> g = run(true), e = run(false);
    ASSERT_EQ(g.size(), total);
    ASSERT_EQ(e.size(), total);
    EXPECT_TRUE(g == e) << "graph replay wrote other bytes than the eager launch";
    // The tokens' bytes were written (not the poison): each destination slot's first code row.
    size_t written = 0;
    for (int32_t t = 0; t < T; ++t) {
      const PageGeometry geo{layers, H, d, 128, page_tokens, static_cast<PageKind>(kinds[dp[t]])};
      const size_t base = size_t(ptrs[dp[t]] - ptrs[0]) + geo.segment_offset(1, 0, 0);
      const size_t row = geo.kind == PageKind::kInt2 ? size_t(ds[t]) * geo.code_row_bytes() : size_t(ds[t]) * d * 2;
      bool poison = true;
      for (size_t b = 0; b < 8; ++b) poison = poison && g[base + row + b] == 0x5a;
      written += !poison;
    }
    EXPECT_EQ(written, static_cast<size_t>(T));
    std::printf("[ graph ] quantize-on-write step %d: replay == eager (%zu page bytes)\n", step, total);
  }
}

}  // namespace
}  // namespace oscarkv::cuda
