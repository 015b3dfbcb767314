#include "kernel_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "oscarkv/cuda/decode_runner.h"
#include "extend_internal.h"  // kernels/cuda/src: the extend kernels' diagnostics
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/cuda/internal/decode_launch.h"
#include "oscarkv/cuda/internal/quantize_launch.h"
#include "oscarkv/cuda/extend_attention.h"
#include "oscarkv/cuda/quantize_write.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/page_set.h"
#include "oscarkv/kernels/rotation.h"

namespace oscarkv::bench {
namespace {

using cuda::DeviceBuffer;

#define BENCH_RETURN_IF_ERROR(expr)            \
  do {                                         \
    absl::Status _st = (expr);                 \
    if (!_st.ok()) return _st;                 \
  } while (0)

constexpr int kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageTokens = 64;

__global__ void CopyKernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

__device__ uint32_t Hash(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Roughly normal bf16 values (sum of four uniforms), std ~ `scale`.
__global__ void FillBf16(uint16_t* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = Hash(static_cast<uint32_t>(i) * 2654435761u ^ seed);
    const float u = ((h & 0xff) + ((h >> 8) & 0xff) + ((h >> 16) & 0xff) + (h >> 24)) / 255.0f - 2.0f;
    const float v = u * 1.7320508f * scale;
    const uint32_t bits = __float_as_uint(v);
    p[i] = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
  }
}

__global__ void FillFloat(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    p[i] = (Hash(static_cast<uint32_t>(i) ^ seed) & 0xffff) / 32768.0f - 1.0f;
  }
}

// Median over `samples` of the per-call time (µs) of a batch of back-to-back calls sized to
// ~2 ms, so launch gaps do not dominate short kernels.
template <typename F>
absl::StatusOr<double> TimeMedianUs(F&& call, int samples) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  auto batch = [&](int reps) -> absl::StatusOr<double> {
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i) {
      absl::Status s = call();
      if (!s.ok()) return s;
    }
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return 1000.0 * ms / reps;
  };
  auto warm = batch(3);
  if (!warm.ok()) return warm.status();
  const int reps = std::clamp(static_cast<int>(2000.0 / std::max(*warm, 1.0)), 3, 200);
  std::vector<double> v;
  for (int s = 0; s < samples; ++s) {
    auto t = batch(reps);
    if (!t.ok()) return t.status();
    v.push_back(*t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "timed launches"));
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The same measurement under CUDA-graph replay, the way engines run a decode step: `call(stream)`
// enqueues one launch; a graph of `reps` back-to-back calls (reps sized as above) is captured on a
// private stream, and the median over `samples` replays of the per-call time is returned. Each
// capture calls `call` reps times, so a call that cycles through inputs (page-pool copies) is
// captured with the same cycle as the eager batches.
template <typename F>
absl::StatusOr<double> TimeGraphMedianUs(F&& call, int samples) {
  cudaStream_t st = nullptr;
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "graph stream"));
  cudaEvent_t a = nullptr, b = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<double> v;
  absl::Status status = [&]() -> absl::Status {
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&a), "event"));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&b), "event"));
    // Eager warm-up on the stream (first-launch attribute setting stays out of the capture).
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(a, st), "event"));
    for (int i = 0; i < 3; ++i) BENCH_RETURN_IF_ERROR(call(st));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(b, st), "event"));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(b), "warm-up"));
    float ms = 0;
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, a, b), "event"));
    const int reps = std::clamp(static_cast<int>(2000.0 / std::max(1000.0 * ms / 3, 1.0)), 3, 200);
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture"));
    absl::Status cs = absl::OkStatus();
    for (int i = 0; i < reps && cs.ok(); ++i) cs.Update(call(st));
    const cudaError_t ce = cudaStreamEndCapture(st, &graph);
    BENCH_RETURN_IF_ERROR(cs);
    BENCH_RETURN_IF_ERROR(CudaStatus(ce, "end capture"));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "instantiate"));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(exec, st), "replay"));  // warm replay
    for (int s = 0; s < samples; ++s) {
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(a, st), "event"));
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(exec, st), "replay"));
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(b, st), "event"));
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(b), "replay"));
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, a, b), "event"));
      v.push_back(1000.0 * ms / reps);
    }
    return CudaStatus(cudaGetLastError(), "graph replays");
  }();
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (a != nullptr) cudaEventDestroy(a);
  if (b != nullptr) cudaEventDestroy(b);
  cudaStreamDestroy(st);
  if (!status.ok()) return status;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

CodecProfile BenchProfile(int layers) {
  CodecProfile p;
  p.model_id = "bench/qwen3-8b-shape";
  p.model_revision = "1";
  p.num_layers = layers;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.page_tokens = kPageTokens;
  p.group_size = 128;
  return p;
}

// A batch of sequences' pages in device pools, replicated `copies` times.
struct PagedBatch {
  std::unique_ptr<cuda::PagedDecoder> decoder;
  DeviceBuffer int2_pool, bf16_pool, kinds, counts, indptr, ids;
  std::vector<DeviceBuffer> ptr_tables;  // one per copy
  int copies = 1;
  // The torch op's decoder for the same batch (KernelBenchOptions::capture_timing): made by
  // CreateForCapture for 2B sequences, planned by Update; capture_indptr: the CSR offsets padded
  // to its capacity (sequences past the batch have no pages).
  std::unique_ptr<cuda::PagedDecoder> capture;
  DeviceBuffer capture_indptr;
};

// K/V copies a decode side cycles over so that one cycle reads >= 4x the L2 (no launch finds
// its pages there), 1 with warm_l2; at most 64 copies and ~8 GB of pool.
int DecodeCopies(const KernelBenchOptions& o, double bytes_read, double pool_bytes_per_copy) {
  if (o.warm_l2) return 1;
  int l2 = 0;
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0) != cudaSuccess || l2 <= 0) l2 = 64 << 20;
  const int want = static_cast<int>(std::ceil(4.0 * l2 / std::max(bytes_read, 1.0)));
  const int room = static_cast<int>(8e9 / std::max(pool_bytes_per_copy, 1.0));
  return std::clamp(std::min(want, std::max(room, 1)), 1, 64);
}

absl::Status BuildBatch(const KernelBenchOptions& o, int B, int L, bool all_bf16, int sms, int target,
                        const DeviceBuffer& ksrc, const DeviceBuffer& vsrc, const void* rot_frag,
                        const float* clips, PagedBatch* out) {
  const CodecProfile prof = BenchProfile(o.layers);
  std::vector<PlannedPage> plan = PlanSequencePages(prof, L);
  if (all_bf16) {
    for (auto& pp : plan) pp.kind = PageKind::kBf16;
  }
  std::vector<int32_t> indptr = {0}, ids;
  std::vector<uint8_t> kinds;
  std::vector<uint16_t> counts;
  for (int b = 0; b < B; ++b) {
    for (const auto& pp : plan) {
      ids.push_back(static_cast<int32_t>(kinds.size()));
      kinds.push_back(static_cast<uint8_t>(pp.kind));
      counts.push_back(static_cast<uint16_t>(pp.token_count));
    }
    indptr.push_back(static_cast<int32_t>(ids.size()));
  }
  cuda::DecodeShape shape{static_cast<uint32_t>(o.layers), kKvHeads, kQHeads, kHeadDim, 128, kPageTokens, 0};
  auto dec = cuda::CreatePagedDecoder(shape, indptr, ids, kinds, sms, {target});
  if (!dec.ok()) return dec.status();
  out->decoder = std::make_unique<cuda::PagedDecoder>(*std::move(dec));
  const double bytes = cuda::DecoderPlan(*out->decoder).page_bytes_read;
  const PageGeometry g2 = GeometryFor(prof, PageKind::kInt2), gb = GeometryFor(prof, PageKind::kBf16);
  size_t n2 = 0, nb = 0;
  for (uint8_t k : kinds) (k == 1 ? n2 : nb)++;
  out->copies = DecodeCopies(o, bytes, double(n2) * g2.page_bytes() + double(nb) * gb.page_bytes());
  if (o.capture_timing) {
    // As python/oscarkv/torch/cache.py makes it: capacity 2B sequences of ceil((L + 64) / 64)
    // pages (max_seq_tokens = context + 64 in `bench model`), re-planned by Update.
    const int pages = (L + 64 + kPageTokens - 1) / kPageTokens;
    // (a diagnostic row: a decoder that cannot be made is reported and skipped, not fatal)
    auto cap = cuda::PagedDecoder::CreateForCapture(shape, {2 * B, pages}, sms);
    absl::Status st = cap.ok() ? cap->Update(indptr, ids, kinds, nullptr) : cap.status();
    std::vector<int32_t> padded = indptr;
    padded.resize(size_t(2 * B) + 1, indptr.back());
    auto pi = DeviceBuffer::FromHost(padded);
    if (st.ok() && !pi.ok()) st = pi.status();
    if (st.ok()) {
      out->capture = std::make_unique<cuda::PagedDecoder>(*std::move(cap));
      out->capture_indptr = *std::move(pi);
    } else {
      std::fprintf(stderr, "[bench] capture decoder B=%d L=%d skipped: %s\n", B, L, std::string(st.message()).c_str());
    }
  }
  const int C = out->copies;
  auto p2 = DeviceBuffer::Create(n2 * C * g2.page_bytes());
  auto pb = DeviceBuffer::Create(nb * C * gb.page_bytes());
  if (!p2.ok()) return p2.status();
  if (!pb.ok()) return pb.status();
  out->int2_pool = *std::move(p2);
  out->bf16_pool = *std::move(pb);
  // Pages placed in shuffled pool slots, as after allocator churn.
  std::mt19937 rng(B * 7919 + L);
  std::vector<size_t> slot2(n2 * C), slotb(nb * C);
  std::iota(slot2.begin(), slot2.end(), 0);
  std::iota(slotb.begin(), slotb.end(), 0);
  std::shuffle(slot2.begin(), slot2.end(), rng);
  std::shuffle(slotb.begin(), slotb.end(), rng);
  size_t i2 = 0, ib = 0;
  std::vector<int32_t> dst_page(L), dst_slot(L);
  for (int t = 0; t < L; ++t) dst_slot[t] = t % kPageTokens;
  DeviceBuffer d_kinds_seq;
  {
    auto k = DeviceBuffer::FromHost(kinds);
    if (!k.ok()) return k.status();
    d_kinds_seq = *std::move(k);
  }
  for (int c = 0; c < C; ++c) {
    std::vector<uint8_t*> ptrs(kinds.size());
    for (size_t e = 0; e < kinds.size(); ++e) {
      ptrs[e] = kinds[e] == 1 ? out->int2_pool.as<uint8_t>() + slot2[i2++] * g2.page_bytes()
                              : out->bf16_pool.as<uint8_t>() + slotb[ib++] * gb.page_bytes();
    }
    auto t = DeviceBuffer::FromHost(ptrs);
    if (!t.ok()) return t.status();
    // Fill every sequence's pages (layer 0) through quantize-on-write from the shared source.
    for (int b = 0; b < B; ++b) {
      for (int tk = 0; tk < L; ++tk) dst_page[tk] = indptr[b] + tk / kPageTokens;
      auto dp = DeviceBuffer::FromHost(dst_page);
      auto ds = DeviceBuffer::FromHost(dst_slot);
      if (!dp.ok() || !ds.ok()) return absl::InternalError("upload");
      cuda::QuantizeWriteParams q;
      q.num_layers = o.layers;
      q.num_kv_heads = kKvHeads;
      q.page_tokens = kPageTokens;
      q.k_src = ksrc.as<uint16_t>();
      q.v_src = vsrc.as<uint16_t>();
      q.src_token_stride = kKvHeads * kHeadDim;
      q.src_head_stride = kHeadDim;
      q.num_tokens = L;
      q.page_ptrs = t->as<uint8_t*>();
      q.page_kinds = d_kinds_seq.as<uint8_t>();
      q.dst_page = dp->as<int32_t>();
      q.dst_slot = ds->as<int32_t>();
      q.rot_fragments = rot_frag;
      q.clips = clips;
      BENCH_RETURN_IF_ERROR(cuda::LaunchQuantizeWrite(q, nullptr));
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "fill pages"));
    }
    out->ptr_tables.push_back(*std::move(t));
  }
  auto k = DeviceBuffer::FromHost(kinds);
  auto cn = DeviceBuffer::FromHost(counts);
  auto ip = DeviceBuffer::FromHost(indptr);
  auto id = DeviceBuffer::FromHost(ids);
  if (!k.ok() || !cn.ok() || !ip.ok() || !id.ok()) return absl::InternalError("upload table");
  out->kinds = *std::move(k);
  out->counts = *std::move(cn);
  out->indptr = *std::move(ip);
  out->ids = *std::move(id);
  return absl::OkStatus();
}

absl::StatusOr<double> TimeDecode(const KernelBenchOptions& o, PagedBatch& pb, int B,
                                  const float* rot_k,
                                  cuda::DecodeVariant variant = cuda::DecodeParams{}.variant,
                                  bool precise_query = true,
                                  std::vector<float>* out_host = nullptr,
                                  bool merge_kernel = false, int rotation = 0,
                                  bool linear_w_rows = false, uint32_t debug_flags = 0,
                                  std::FILE* timeline = nullptr, const std::string& timeline_label = "",
                                  const std::string& options = "", bool graph = false,
                                  bool capture = false, const float* unrotate_rot_v = nullptr) {
  // capture: pb.capture (the torch op's decoder), whose q / out / lse hold its capacity (2B rows;
  // the first B are the batch's, so sequence 0's output is checked as for the others).
  if (capture && pb.capture == nullptr) return absl::InternalError("no capture decoder built");
  const cuda::PagedDecoder& decoder = capture ? *pb.capture : *pb.decoder;
  const int rows = capture ? 2 * B : B;
  auto q = DeviceBuffer::Create(size_t(rows) * kQHeads * kHeadDim * 4);
  auto out = DeviceBuffer::Create(size_t(rows) * kQHeads * kHeadDim * 4);
  auto lse = DeviceBuffer::Create(size_t(rows) * kQHeads * 4);
  if (!q.ok() || !out.ok() || !lse.ok()) return absl::InternalError("alloc q/out");
  FillFloat<<<64, 256>>>(q->as<float>(), size_t(B) * kQHeads * kHeadDim, 99);
  if (rows > B) {
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemset(q->as<float>() + size_t(B) * kQHeads * kHeadDim, 0,
                                                size_t(rows - B) * kQHeads * kHeadDim * 4), "q rows"));
  }
  std::vector<cuda::DecodeParams> params;
  for (int c = 0; c < pb.copies; ++c) {
    cuda::DecodeParams p = cuda::DecoderParams(decoder);
    p.table.page_ptrs = pb.ptr_tables[c].as<const uint8_t*>();
    p.table.page_kinds = pb.kinds.as<uint8_t>();
    p.table.page_token_counts = pb.counts.as<uint16_t>();
    p.table.seq_page_indptr = capture ? pb.capture_indptr.as<int32_t>() : pb.indptr.as<int32_t>();
    p.table.seq_page_ids = pb.ids.as<int32_t>();
    p.q = q->as<float>();
    p.rot_k = rot_k;
    if (unrotate_rot_v != nullptr) {  // the output back in the model's basis (as the torch op asks)
      p.rot_v = unrotate_rot_v;
      p.unrotate_output = true;
    }
    p.precise_query = precise_query;
    p.variant = variant;
    if (merge_kernel) p.fused_merge = false;  // the separate log-sum-exp merge kernel
    // rotation 1: every CTA rotates its queries; 2: the rotation kernel; 0: PagedDecoder's choice.
    if (rotation != 0) p.rotate_in_cta = rotation == 1;
    p.linear_w_rows = linear_w_rows;
    p.debug_flags = debug_flags;
    // --ab option sets.
    if (options.find("shared_rotation") != std::string::npos) p.share_rotation = true;
    if (options.find("early_copies") != std::string::npos) p.copies_after_queries = false;
    if (options.find("rotation_kernel") != std::string::npos) p.rotate_in_cta = false;
    if (options.find("cta_rotation") != std::string::npos) p.rotate_in_cta = true;
    if (options.find("cta_fragments") != std::string::npos) p.prepared_fragments = false;
    if (options.find("two_per_sm") != std::string::npos) p.int2_ctas_per_sm = 2;
    if (options.find("no_cap") != std::string::npos) p.int2_ctas_per_sm = 0;
    if (options.find("early_rotation") != std::string::npos) p.early_rotation = true;
    if (options.find("bulk_merge") != std::string::npos) p.bulk_merge = true;
    if (options.find("copy_merge") != std::string::npos) p.bulk_merge = false;
    if (options.find("late_rotation") != std::string::npos) p.early_rotation = false;
    if (options.find("frags_first") != std::string::npos) p.fragments_before_copies = true;
    if (options.find("frags_after") != std::string::npos) p.fragments_before_copies = false;
    // earlyN: DecodeParams::early_slices = N (a whole '+' entry: early_rotation / early_copies
    // share the prefix).
    for (absl::string_view f : absl::StrSplit(options, '+')) {
      if (absl::ConsumePrefix(&f, "early") && f.size() == 1 && absl::ascii_isdigit(f[0])) p.early_slices = f[0] - '0';
    }
    if (options.find("evict_first") != std::string::npos) p.stream_evict_first = true;
    if (options.find("evict_normal") != std::string::npos) p.stream_evict_first = false;
    // warpsN: DecodeParams::int2_warps = N.
    if (size_t at = options.find("warps"); at != std::string::npos) p.int2_warps = std::atoi(options.c_str() + at + 5);
    // l2pfN: DecodeParams::l2_prefetch_slices = N.
    if (size_t at = options.find("l2pf"); at != std::string::npos) {
      p.l2_prefetch_slices = std::atoi(options.c_str() + at + 4);
    }

    p.out = out->as<float>();
    p.lse = lse->as<float>();
    params.push_back(p);
  }
  int c = 0;
  auto us = graph ? TimeGraphMedianUs([&](cudaStream_t st) {
                      return cuda::LaunchDecodeAttention(params[c++ % params.size()], st);
                    }, o.samples)
                  : TimeMedianUs([&] { return cuda::LaunchDecodeAttention(params[c++ % params.size()], nullptr); },
                                 o.samples);
  if (us.ok() && timeline != nullptr) {
    // Two consecutive launches with timestamps, between untimed back-to-back launches (as in
    // the timing): the second one's records are labelled LABEL#2, so the gap from one launch's
    // last CTA to the next one's first (and the entry-to-entry period) can be read.
    const int ctas = params[0].num_int2_items;  // the INT2 grid (a capture decoder: its capacity)
    const size_t words = size_t(std::max(ctas, 1)) * cuda::kDecodeTimelineWords;
    auto tl = DeviceBuffer::Create(2 * words * 8);
    if (!tl.ok()) return tl.status();
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemset(tl->get(), 0, tl->bytes()), "timeline"));
    for (int i = 0; i < 24; ++i) {
      cuda::DecodeParams p = params[c++ % params.size()];
      if (i == 20 || i == 21) p.debug_timeline = tl->as<uint64_t>() + (i - 20) * words;
      BENCH_RETURN_IF_ERROR(cuda::LaunchDecodeAttention(p, nullptr));
    }
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "timeline run"));
    auto h = tl->ToHost<uint64_t>();
    if (!h.ok()) return h.status();
    for (int l = 0; l < 2; ++l) {
      for (int cta = 0; cta < ctas; ++cta) {
        std::fprintf(timeline, "%s%s,%d,%.2f,%d", timeline_label.c_str(), l ? "#2" : "", B, *us, cta);
        for (int w = 0; w < cuda::kDecodeTimelineWords; ++w)
          std::fprintf(timeline, ",%llu",
                       static_cast<unsigned long long>((*h)[l * words + size_t(cta) * cuda::kDecodeTimelineWords + w]));
        std::fprintf(timeline, "\n");
      }
    }
  }
  if (!us.ok() || out_host == nullptr) return us;
  // One more launch on poisoned output, for the caller's cross-check of variants.
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemset(out->get(), 0xff, out->bytes()), "poison"));
  BENCH_RETURN_IF_ERROR(cuda::LaunchDecodeAttention(params[0], nullptr));
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "decode check run"));
  auto h = out->ToHost<float>();
  if (!h.ok()) return h.status();
  *out_host = *std::move(h);
  return us;
}

// Decode attention of sequence 0 of an INT2 batch (pages of copy 0) in double on the CPU, as the
// kernels compute it: q' = q · R_K (the bench's queries, FillFloat seed 99), softmax of
// q'·k / sqrt(d) over the dequantized page rows, output in the rotated basis. [Hq][d].
absl::StatusOr<std::vector<double>> ReferenceSeq0(const KernelBenchOptions& o, const PagedBatch& pb,
                                                  int B, const RotationSet& rot) {
  const CodecProfile prof = BenchProfile(o.layers);
  auto indptr = pb.indptr.ToHost<int32_t>();
  auto ids = pb.ids.ToHost<int32_t>();
  auto kinds = pb.kinds.ToHost<uint8_t>();
  auto counts = pb.counts.ToHost<uint16_t>();
  auto ptrs = pb.ptr_tables[0].ToHost<const uint8_t*>();
  auto qd = DeviceBuffer::Create(size_t(B) * kQHeads * kHeadDim * 4);
  if (!indptr.ok() || !ids.ok() || !kinds.ok() || !counts.ok() || !ptrs.ok() || !qd.ok()) {
    return absl::InternalError("reference: download table");
  }
  FillFloat<<<64, 256>>>(qd->as<float>(), size_t(B) * kQHeads * kHeadDim, 99);
  std::vector<float> q(kQHeads * kHeadDim);
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(q.data(), qd->get(), q.size() * 4, cudaMemcpyDeviceToHost), "q"));
  // Dequantized rows of layer 0: k[h][t][d], v[h][t][d].
  std::vector<std::vector<double>> kr(kKvHeads), vr(kKvHeads);
  std::vector<uint8_t> seg;
  for (int32_t e = (*indptr)[0]; e < (*indptr)[1]; ++e) {
    const int32_t id = (*ids)[e];
    const PageKind kind = static_cast<PageKind>((*kinds)[id]);
    const PageGeometry g = GeometryFor(prof, kind);
    const int n = (*counts)[id];
    seg.resize(2 * kKvHeads * g.segment_bytes());
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(seg.data(), (*ptrs)[id] + g.segment_offset(0, 0, 0), seg.size(),
                                            cudaMemcpyDeviceToHost), "page"));
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < kKvHeads; ++h) {
        const uint8_t* sg = seg.data() + (size_t(kv) * kKvHeads + h) * g.segment_bytes();
        auto& rows = kv == 0 ? kr[h] : vr[h];
        for (int t = 0; t < n; ++t)
          for (int c = 0; c < kHeadDim; ++c) {
            double x;
            if (kind == PageKind::kInt2) {
              const int code = (sg[g.code_row_offset(t) + c / 4] >> (2 * (c % 4))) & 3;
              uint16_t sm[2];
              std::memcpy(sm, sg + g.scale_offset(t, c / g.group_size), 4);
              x = double(HalfToFloat(sm[1])) + code * double(HalfToFloat(sm[0]));
            } else {
              uint16_t b;
              std::memcpy(&b, sg + g.bf16_row_offset(t) + 2 * c, 2);
              x = Bf16ToFloat(b);
            }
            rows.push_back(x);
          }
      }
  }
  const int T = static_cast<int>(kr[0].size() / kHeadDim);
  std::vector<double> out(kQHeads * kHeadDim, 0.0);
  const double scale = 1.0 / std::sqrt(double(kHeadDim));
  for (int hq = 0; hq < kQHeads; ++hq) {
    const int h = hq / (kQHeads / kKvHeads);
    const float* R = rot.matrix(0, KV::kKey, h);
    std::vector<double> qr(kHeadDim, 0.0), sc(T);
    for (int i = 0; i < kHeadDim; ++i)
      for (int j = 0; j < kHeadDim; ++j) qr[j] += double(q[hq * kHeadDim + i]) * R[i * kHeadDim + j];
    double mx = -1e300;
    for (int t = 0; t < T; ++t) {
      double d = 0;
      for (int c = 0; c < kHeadDim; ++c) d += qr[c] * kr[h][size_t(t) * kHeadDim + c];
      sc[t] = d * scale;
      mx = std::max(mx, sc[t]);
    }
    double l = 0;
    for (int t = 0; t < T; ++t) {
      const double w = std::exp(sc[t] - mx);
      l += w;
      for (int c = 0; c < kHeadDim; ++c) out[hq * kHeadDim + c] += w * vr[h][size_t(t) * kHeadDim + c];
    }
    for (int c = 0; c < kHeadDim; ++c) out[hq * kHeadDim + c] /= l;
  }
  return out;
}

}  // namespace

absl::StatusOr<KernelBenchReport> RunKernelBench(const KernelBenchOptions& o) {
  KernelBenchReport r;
  cudaDeviceProp prop{};
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA device (", e != cudaSuccess ? cudaGetErrorString(e) : "none found",
        "): the kernel bench runs on a GPU machine, e.g. through scripts/gpu/run_all.sh"));
  }
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, 0), "device properties"));
  r.device = prop.name;
  r.sms = prop.multiProcessorCount;
  r.decode_ctas_per_sm = cuda::DecodeKernelOccupancy(128);
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&r.l2_bytes, cudaDevAttrL2CacheSize, 0), "L2 size"));
  r.warm_l2 = o.warm_l2;

  // SDPA first (its own process; frees its memory when it exits).
  if (!o.sdpa_command.empty() && !o.shapes.empty()) {
    auto rows = RunSdpaBaseline(o);
    if (!rows.ok()) {
      r.sdpa_error = std::string(rows.status().message());
    } else {
      r.decode = *std::move(rows);
    }
  }
  if (r.decode.empty()) {
    for (auto [b, l] : o.shapes) r.decode.push_back(DecodeRow{b, l});
  }

  // Copy bandwidth: 2 GiB read + 2 GiB written.
  {
    const size_t bytes = size_t{2} << 30;
    auto src = DeviceBuffer::Create(bytes);
    auto dst = DeviceBuffer::Create(bytes);
    if (!src.ok() || !dst.ok()) return absl::ResourceExhaustedError("copy buffers");
    cudaMemset(src->get(), 1, bytes);
    const int blocks = r.sms * 8;
    auto us = TimeMedianUs([&] {
      CopyKernel<<<blocks, 512>>>(src->as<uint4>(), dst->as<uint4>(), bytes / 16);
      return absl::OkStatus();
    }, o.samples);
    if (!us.ok()) return us.status();
    r.copy_gbps = 2.0 * bytes / (*us * 1e-6) / 1e9;
  }

  // Shared inputs: source rows (for page fills and quantize-on-write), rotations, clips.
  int max_len = o.quant_tokens;
  for (auto [b, l] : o.shapes) max_len = std::max(max_len, l);
  for (const ExtendShape& e : o.extend_shapes) max_len = std::max({max_len, e.prefix, e.batch * e.new_tokens});
  const size_t src_elems = size_t(max_len) * kKvHeads * kHeadDim;
  auto ksrc = DeviceBuffer::Create(src_elems * 2);
  auto vsrc = DeviceBuffer::Create(src_elems * 2);
  if (!ksrc.ok() || !vsrc.ok()) return absl::ResourceExhaustedError("source rows");
  FillBf16<<<1024, 256>>>(ksrc->as<uint16_t>(), src_elems, 1, 1.0f);
  FillBf16<<<1024, 256>>>(vsrc->as<uint16_t>(), src_elems, 2, 0.5f);
  RotationSet rot = RotationSet::Hadamard(1, kKvHeads, kHeadDim, 0.96f, 0.92f);
  auto mats = DeviceBuffer::FromHost(rot.matrices());  // [1][2][8][128][128]
  auto frags = DeviceBuffer::Create(size_t{2} * kKvHeads * cuda::kRotationFragmentBytes);
  std::vector<float> clip_v(2 * kKvHeads), noclip(2 * kKvHeads, 1.0f);
  for (int i = 0; i < 2 * kKvHeads; ++i) clip_v[i] = i < kKvHeads ? 0.96f : 0.92f;
  auto clips = DeviceBuffer::FromHost(clip_v);
  auto noclips = DeviceBuffer::FromHost(noclip);
  // The engine's launch: a per-head range-mode table (here every head unbiased) and clips.
  std::vector<uint8_t> unbiased_modes(2 * kKvHeads, static_cast<uint8_t>(RangeMode::kUnbiased));
  auto mode_table = DeviceBuffer::FromHost(unbiased_modes);
  // The same with unbiased-fixed modes (candidates 6 and 7, what `oscarkv calibrate --range
  // fixed` picks on the reference model).
  std::vector<uint8_t> fixed_modes(2 * kKvHeads);
  for (int i = 0; i < 2 * kKvHeads; ++i) fixed_modes[i] = static_cast<uint8_t>(UnbiasedFixed(6 + i % 2));
  auto fixed_table = DeviceBuffer::FromHost(fixed_modes);
  if (!mode_table.ok() || !fixed_table.ok()) return absl::InternalError("range modes");
  if (!mats.ok() || !frags.ok() || !clips.ok() || !noclips.ok()) return absl::InternalError("rotations");
  BENCH_RETURN_IF_ERROR(cuda::PrepareRotationFragments(mats->as<float>(), 2 * kKvHeads, frags->get(), nullptr));
  const float* rot_k = mats->as<float>();  // layer 0, K matrices are the first 8

  std::unique_ptr<std::FILE, int (*)(std::FILE*)> timeline(nullptr, &std::fclose);
  if (!o.timeline_csv.empty()) {
    timeline.reset(std::fopen(o.timeline_csv.c_str(), "w"));
    if (timeline == nullptr) return absl::InvalidArgumentError("cannot write --timeline file");
    std::fprintf(timeline.get(), "config,batch,us,cta");
    for (int w = 0; w < cuda::kDecodeTimelineWords; ++w) std::fprintf(timeline.get(), ",w%d", w);
    std::fprintf(timeline.get(), "\n");
  }
  for (DecodeRow& d : r.decode) {
    for (bool all_bf16 : {true, false}) {
      if (all_bf16 && !o.bf16_pages) continue;
      std::fprintf(stderr, "[bench] decode B=%d L=%d %s pages\n", d.batch, d.length,
                   all_bf16 ? "BF16" : "OSCAR INT2");
      PagedBatch pb;
      BENCH_RETURN_IF_ERROR(BuildBatch(o, d.batch, d.length, all_bf16, r.sms, o.target_ctas[0],
                                       *ksrc, *vsrc, frags->get(), clips->as<float>(), &pb));
      // The reported INT2 configuration (re-planned for the other CTA targets below).
      cuda::DecodeVariant best_v = cuda::DecodeParams{}.variant;
      bool best_merge_kernel = false;
      int best_rotation = 0;
      if (!all_bf16) {
        // The default launch (PagedDecoder::Run's options), then the alternatives of each of its
        // per-plan choices on the same pages: the report's INT2 figure is the default's; the
        // fastest configuration within the tolerance is named beside it (int2_best), so the
        // table shows whether the default is the fastest.
        struct Config {
          cuda::DecodeVariant v;
          bool precise;
          bool merge_kernel = false;
          int rotation = 0;  // TimeDecode's
          bool linear_w_rows = false;
          uint32_t debug_flags = 0;
          bool no_rotation = false;        // diagnostics: rot_k = nullptr
          const char* timeline = nullptr;  // diagnostics: label of a timeline record
          std::string options;             // a --ab option set: never the reported figure
          bool graph = false;              // the default launch under graph replay (int2_graph_us)
          bool capture = false;            // the default launch via the torch op's decoder
          bool unrotate = false;           // ... also unrotating the output (the torch op's launch)
        };
        std::vector<Config> configs;
        const cuda::DecodeVariant dv = cuda::DecodeParams{}.variant;
        configs.push_back({dv, o.precise_query});  // the default launch
        if (o.graph_timing) {
          Config g{dv, o.precise_query};
          g.graph = true;
          configs.push_back(g);
        }
        if (pb.capture != nullptr) {
          Config cc{dv, o.precise_query};
          cc.capture = true;
          configs.push_back(cc);
          cc.unrotate = true;
          configs.push_back(cc);
        }
        if (o.all_variants) {
          // The separate merge kernel instead of the fused merge, the queries rotated in every
          // CTA and by the rotation kernel (instead of the decoder's choice), and both.
          configs.push_back({dv, o.precise_query, true, 0});
          configs.push_back({dv, o.precise_query, false, 1});
          configs.push_back({dv, o.precise_query, false, 2});
          configs.push_back({dv, o.precise_query, true, 1});
          for (const std::string& ab : o.ab_configs)
            configs.push_back({dv, o.precise_query, false, 0, false, 0, false,
                               o.diagnostics ? ab.c_str() : nullptr, ab});
          if (o.diagnostics) {
            configs.push_back({dv, o.precise_query, false, 0, false, 0, false, "default"});
            configs.push_back({dv, o.precise_query, false, 2, false, 0, false, "rotation_kernel"});
            configs.push_back({dv, o.precise_query, false, 0, false, cuda::kDecodeDebugNoMerge, false, "no_merge"});
            configs.push_back({dv, o.precise_query, false, 0, false, 0, true, "no_rotation"});
          }
        }
        d.int2_us = 0;
        std::vector<float> base_out;
        // Every configuration's output (sequence 0) against the CPU in double.
        auto ref = ReferenceSeq0(o, pb, d.batch, rot);
        if (!ref.ok()) return ref.status();
        // Rounds: every configuration in turn, `rounds` times; a configuration's figure is the
        // median of its rounds' medians (its output is checked in the first round).
        std::vector<std::vector<double>> round_us(configs.size());
        std::vector<std::vector<float>> outs(configs.size());
        // An untimed run of the default first: the first configuration timed after the pages are
        // built measured up to 7% slower than the same launch timed later (H200, B=1 x 32K).
        if (!configs.empty()) {
          auto warm = TimeDecode(o, pb, d.batch, rot_k, configs[0].v, configs[0].precise);
          if (!warm.ok()) return warm.status();
        }
        for (int round = 0; round < std::max(o.rounds, 1); ++round) {
          for (size_t ci = 0; ci < configs.size(); ++ci) {
            const Config& cfg = configs[ci];
            // Timeline records (diagnostics) in the first round only.
            const std::string label = cfg.timeline != nullptr && round == 0
                                          ? absl::StrCat(cfg.timeline, "/", d.batch, "x", d.length)
                                          : "";
            auto t = TimeDecode(o, pb, d.batch, cfg.no_rotation ? nullptr : rot_k, cfg.v, cfg.precise,
                                round == 0 ? &outs[ci] : nullptr, cfg.merge_kernel, cfg.rotation,
                                cfg.linear_w_rows, cfg.debug_flags,
                                label.empty() ? nullptr : timeline.get(), label, cfg.options, cfg.graph,
                                cfg.capture, cfg.unrotate ? rot_k + size_t(kKvHeads) * kHeadDim * kHeadDim : nullptr);
            if (!t.ok()) return t.status();
            round_us[ci].push_back(*t);
          }
        }
        for (size_t ci = 0; ci < configs.size(); ++ci) {
          const Config& cfg = configs[ci];
          std::vector<float>& vout = outs[ci];
          if (cfg.unrotate) {
            // Back to the rotated basis for the checks: o[k] = Σ_i out[i] · R_V[i][k] (R_V
            // orthogonal), per query head of sequence 0 (kv head = q head / GQA).
            const float* rv_all = rot.matrices().data() + size_t(kKvHeads) * kHeadDim * kHeadDim;
            for (int hq = 0; hq < kQHeads && size_t(hq + 1) * kHeadDim <= vout.size(); ++hq) {
              const float* rv = rv_all + size_t(hq / (kQHeads / kKvHeads)) * kHeadDim * kHeadDim;
              std::vector<double> o(kHeadDim, 0.0);
              for (int i = 0; i < kHeadDim; ++i)
                for (int k = 0; k < kHeadDim; ++k) o[k] += double(vout[size_t(hq) * kHeadDim + i]) * rv[size_t(i) * kHeadDim + k];
              for (int k = 0; k < kHeadDim; ++k) vout[size_t(hq) * kHeadDim + k] = static_cast<float>(o[k]);
            }
          }
          std::vector<double> rs = round_us[ci];
          std::sort(rs.begin(), rs.end());
          VariantTime vt;
          vt.name = std::string(cuda::DecodeVariantName(cfg.v)) + (cfg.precise ? "" : "+fast_query") +
                    (cfg.merge_kernel ? "+merge_kernel" : "") + (cfg.rotation == 1   ? "+cta_rotation"
                     : cfg.rotation == 2 ? "+rotation_kernel"
                                         : "") +
                    (cfg.linear_w_rows ? "+linear_w_rows" : "") +
                    (cfg.debug_flags & cuda::kDecodeDebugNoMerge ? "+DIAG_no_merge" : "") +
                    (cfg.no_rotation ? "+DIAG_no_rotation" : "") +
                    (cfg.timeline != nullptr ? "+timeline" : "") + (cfg.graph ? "+graph_replay" : "") +
                    (cfg.capture ? "+capture_decoder" : "") +
                    (cfg.unrotate ? "+unrotate_output" : "") + (cfg.options.empty() ? "" : "+" + cfg.options);
          vt.approximate = !cfg.precise && o.precise_query;
          vt.us = rs.size() % 2 ? rs[rs.size() / 2] : 0.5 * (rs[rs.size() / 2 - 1] + rs[rs.size() / 2]);
          vt.round_us = round_us[ci];
          // Cross-check against the first (baseline) configuration on the same pages: a
          // variant that disagrees is reported but never counted as the best.
          double max_rel = 0;
          if (base_out.empty()) {
            base_out = vout;
          } else {
            for (size_t i = 0; i < vout.size() && i < base_out.size(); ++i) {
              const double e = std::fabs(double(vout[i]) - base_out[i]) / (1.0 + std::fabs(base_out[i]));
              max_rel = std::isfinite(e) ? std::max(max_rel, e) : 1e30;
            }
          }
          double ref_rel = 0;
          for (size_t i = 0; i < ref->size() && i < vout.size(); ++i) {
            const double e = std::fabs(double(vout[i]) - (*ref)[i]) / (1.0 + std::fabs((*ref)[i]));
            ref_rel = std::isfinite(e) ? std::max(ref_rel, e) : 1e30;
          }
          vt.check_error = ref_rel;
          vt.check_ok = ref_rel <= (vt.approximate ? 2e-2 : 4e-3);
          std::string rounds;
          if (vt.round_us.size() > 1) {
            for (double x : vt.round_us) {
              char buf[32];
              std::snprintf(buf, sizeof buf, " %.1f", x);
              rounds += buf;
            }
            rounds = "  rounds:" + rounds;
          }
          std::fprintf(stderr, "[bench]   INT2 %-40s %9.1f us  max diff vs CPU (seq 0) %.2e, vs baseline %.2e%s%s\n",
                       vt.name.c_str(), vt.us, ref_rel, max_rel, vt.check_ok ? "" : "  MISMATCH", rounds.c_str());
          if (ci == 0) {
            d.int2_us = vt.us;  // the default launch
            d.int2_default_ok = vt.check_ok;
          }
          if (cfg.graph) d.int2_graph_us = vt.us;
          if (cfg.capture && !cfg.unrotate) d.int2_capture_us = vt.us;
          if (cfg.capture && cfg.unrotate) d.int2_capture_unrotate_us = vt.us;
          // (the graph-replay and capture-decoder rows are the default launch timed another way /
          // through another plan: not configurations)
          if (vt.check_ok && !vt.approximate && cfg.timeline == nullptr && cfg.options.empty() && !cfg.graph &&
              !cfg.capture &&
              (d.int2_best_us == 0 || vt.us < d.int2_best_us)) {
            d.int2_best_us = vt.us;
            d.int2_best = vt.name;
            best_v = cfg.v;
            best_merge_kernel = cfg.merge_kernel;
            best_rotation = cfg.rotation;
          }
          d.int2_variants.push_back(vt);
        }
      }
      absl::StatusOr<double> us =
          all_bf16 ? TimeDecode(o, pb, d.batch, rot_k) : absl::StatusOr<double>(d.int2_us);
      if (!us.ok()) return us.status();
      const auto& plan = cuda::DecoderPlan(*pb.decoder);
      if (all_bf16) {
        auto mk = TimeDecode(o, pb, d.batch, rot_k, cuda::DecodeParams{}.variant, true, nullptr, true);
        if (!mk.ok()) return mk.status();
        d.bf16_merge_kernel_us = *mk;
        if (o.graph_timing) {
          auto g = TimeDecode(o, pb, d.batch, rot_k, cuda::DecodeParams{}.variant, true, nullptr, false, 0, false,
                              0, nullptr, "", "", true);
          if (!g.ok()) return g.status();
          d.bf16_graph_us = *g;
        }
        if (pb.capture != nullptr) {
          // The torch op's launch on these pages (its capture decoder runs BF16 items in the INT2
          // kernel), output unrotated as the op asks.
          auto cu = TimeDecode(o, pb, d.batch, rot_k, cuda::DecodeParams{}.variant, true, nullptr, false, 0,
                               false, 0, nullptr, "", "", false, true,
                               rot_k + size_t(kKvHeads) * kHeadDim * kHeadDim);
          if (!cu.ok()) return cu.status();
          d.bf16_capture_unrotate_us = *cu;
        }
        d.bf16_us = *us;
        d.bf16_bytes = plan.page_bytes_read;
        d.bf16_items = static_cast<int>(plan.items.size());
        continue;
      }
      d.int2_us = *us;
      d.int2_bytes = plan.page_bytes_read;
      d.int2_items = static_cast<int>(plan.items.size());
      d.copies = pb.copies;
      if (pb.capture != nullptr) {
        d.int2_capture_grid = cuda::DecoderParams(*pb.capture).num_items;
        d.int2_capture_items = static_cast<int>(cuda::DecoderPlan(*pb.capture).items.size());
      }
      // Other plan targets on the same pages (re-planned; the pages stay).
      for (size_t ti = 1; ti < o.target_ctas.size(); ++ti) {
        cuda::DecodeShape shape{static_cast<uint32_t>(o.layers), kKvHeads, kQHeads, kHeadDim, 128,
                                kPageTokens, 0};
        std::vector<int32_t> indptr, ids;
        std::vector<uint8_t> kinds;
        {
          auto ip = pb.indptr.ToHost<int32_t>();
          auto id = pb.ids.ToHost<int32_t>();
          auto kk = pb.kinds.ToHost<uint8_t>();
          if (!ip.ok() || !id.ok() || !kk.ok()) return absl::InternalError("download table");
          indptr = *ip;
          ids = *id;
          kinds = *kk;
        }
        const int target = o.target_ctas[ti];
        const int tail = target <= kTailTarget ? kTailTarget - target : 0;
        const int wide = target >= kWideTarget ? target - kWideTarget : 0;
        auto dec = cuda::CreatePagedDecoder(shape, indptr, ids, kinds, r.sms,
                                            {wide > 0 ? 0 : std::max(target, 0), target < 0 && tail == 0, tail, wide});
        if (!dec.ok()) return dec.status();
        pb.decoder = std::make_unique<cuda::PagedDecoder>(*std::move(dec));
        // The fastest configuration within the tolerance, re-planned.
        auto t = TimeDecode(o, pb, d.batch, rot_k, best_v, o.precise_query, nullptr, best_merge_kernel,
                            best_rotation, false, 0, timeline.get(),
                            absl::StrCat("target", target, "/", d.batch, "x", d.length));
        if (!t.ok()) return t.status();
        d.int2_by_target.push_back({o.target_ctas[ti], *t});
        if (target == -1) {
          // The session-5 default as a whole: that planner, the merge kernel, the queries
          // rotated in every CTA.
          auto t5 = TimeDecode(o, pb, d.batch, rot_k, cuda::DecodeParams{}.variant, o.precise_query,
                               nullptr, true, 1);
          if (!t5.ok()) return t5.status();
          d.int2_by_target.push_back({-2, *t5});
        }
      }
    }
  }

  // Extend attention: per shape, B sequences of OSCAR pages of `prefix` tokens (none: plain
  // prefill) and `new_tokens` new tokens each (the shared source rows as their K/V), beside
  // SDPA on dense BF16 K/V of the same shape and mask (run first, in its own process).
  if (!o.extend_shapes.empty()) {
    for (const ExtendShape& e : o.extend_shapes) {
      ExtendRow row;
      row.batch = e.batch;
      row.prefix = e.prefix;
      row.new_tokens = e.new_tokens;
      row.flops = 4.0 * e.batch * e.new_tokens * (e.prefix + e.new_tokens / 2.0) * kHeadDim * kQHeads;
      r.extend.push_back(row);
    }
    if (!o.sdpa_command.empty()) {
      if (absl::Status s = RunSdpaExtendBaseline(o, &r.extend); !s.ok()) {
        r.sdpa_error += std::string(r.sdpa_error.empty() ? "" : "; ") + "extend: " + std::string(s.message());
      }
    }
  }
  for (ExtendRow& row : r.extend) {
    const int B = row.batch, P = row.prefix, C = row.new_tokens;
    std::fprintf(stderr, "[bench] extend B=%d prefix=%d new=%d\n", B, P, C);
    PagedBatch pb;
    DeviceBuffer empty_indptr, empty_table;
    cuda::DecodeShape shape{static_cast<uint32_t>(o.layers), kKvHeads, kQHeads, kHeadDim, 128, kPageTokens, 0};
    cuda::ExtendParams e;
    e.shape = shape;
    if (P > 0) {
      BENCH_RETURN_IF_ERROR(BuildBatch(o, B, P, false, r.sms, 0, *ksrc, *vsrc, frags->get(), clips->as<float>(), &pb));
      e.table.page_ptrs = pb.ptr_tables[0].as<const uint8_t*>();
      e.table.page_kinds = pb.kinds.as<uint8_t>();
      e.table.page_token_counts = pb.counts.as<uint16_t>();
      e.table.seq_page_indptr = pb.indptr.as<int32_t>();
      e.table.seq_page_ids = pb.ids.as<int32_t>();
    } else {  // plain prefill: every sequence without pages
      auto ip = DeviceBuffer::FromHost(std::vector<int32_t>(B + 1, 0));
      auto tb = DeviceBuffer::Create(64);
      if (!ip.ok() || !tb.ok()) return absl::InternalError("extend table");
      empty_indptr = *std::move(ip);
      empty_table = *std::move(tb);
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemset(empty_table.get(), 0, 64), "extend table"));
      e.table.page_ptrs = empty_table.as<const uint8_t*>();
      e.table.page_kinds = empty_table.as<uint8_t>();
      e.table.page_token_counts = empty_table.as<uint16_t>();
      e.table.seq_page_indptr = empty_indptr.as<int32_t>();
      e.table.seq_page_ids = empty_table.as<int32_t>();
    }
    const size_t total = size_t(B) * C;
    auto q = DeviceBuffer::Create(total * kQHeads * kHeadDim * 4);
    auto out = DeviceBuffer::Create(total * kQHeads * kHeadDim * 4);
    auto lse = DeviceBuffer::Create(total * kQHeads * 4);
    std::vector<int32_t> q_indptr(B + 1);
    for (int b = 0; b <= B; ++b) q_indptr[b] = b * C;
    auto qi = DeviceBuffer::FromHost(q_indptr);
    if (!q.ok() || !out.ok() || !lse.ok() || !qi.ok()) return absl::InternalError("extend buffers");
    FillFloat<<<256, 256>>>(q->as<float>(), total * kQHeads * kHeadDim, 7);
    e.table.num_seqs = B;
    e.q_indptr = qi->as<int32_t>();
    e.max_new_tokens = C;
    e.q = q->as<float>();
    e.k_new = ksrc->as<uint16_t>();  // [B·C][8][128] bf16 rows (the shared source rows)
    e.v_new = vsrc->as<uint16_t>();
    e.rot_k = rot_k;
    e.out = out->as<float>();
    e.lse = lse->as<float>();
    auto plan = cuda::PlanExtend(shape, B, C);
    if (!plan.ok()) return plan.status();
    row.tensor_cores = plan->tensor_cores;
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemset(e.out, 0xff, total * kQHeads * kHeadDim * 4), "poison"));
    BENCH_RETURN_IF_ERROR(cuda::LaunchExtendAttention(*plan, e, nullptr));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "extend"));
    {  // every output written and finite (the GPU tests check the values)
      auto h = out->ToHost<float>();
      if (!h.ok()) return h.status();
      for (float v : *h) {
        if (!std::isfinite(v)) return absl::InternalError("extend bench: non-finite or unwritten output");
      }
    }
    auto us = TimeMedianUs([&] { return cuda::LaunchExtendAttention(*plan, e, nullptr); }, o.samples);
    if (!us.ok()) return us.status();
    row.us = *us;
    if (plan->tensor_cores && B == 1 && P == 32768) {
      for (int diag : {1, 2}) {
        auto d = TimeMedianUs([&] { return cuda::detail::LaunchExtendWgmma(e, C, nullptr, diag); }, o.samples);
        if (!d.ok()) return d.status();
        (diag == 1 ? row.diag_no_dequant_us : row.diag_no_copies_us) = *d;
      }
    }
    if (plan->tensor_cores && P == 0) {
      auto ref = out->ToHost<float>();  // the reported kernel's outputs, which 3 and 4 reproduce
      if (!ref.ok()) return ref.status();
      for (int diag : {3, 4, 5}) {
        auto d = TimeMedianUs([&] { return cuda::detail::LaunchExtendWgmma(e, C, nullptr, diag); }, o.samples);
        if (!d.ok()) return d.status();
        double* at[] = {&row.diag_dense_per_item_us, &row.diag_dense_persistent_us, &row.diag_dense_no_copies_us};
        *at[diag - 3] = *d;
        if (diag == 5) continue;
        auto h = out->ToHost<float>();
        if (!h.ok()) return h.status();
        double diff = 0;
        for (size_t i = 0; i < h->size(); ++i) diff = std::max(diff, double(std::fabs((*h)[i] - (*ref)[i])));
        // (printed, not fatal: the GPU tests check the reported kernel; a diagnostic's time
        // counts only with equal outputs)
        std::fprintf(stderr, "[bench] extend B=%d new=%d diag %d: max |out - reported kernel's| %.3g%s\n", B, C, diag, diff,
                     diff <= 1e-3 ? "" : " MISMATCH");
      }
    }
  }

  // Quantize-on-write: quant_tokens tokens of one layer, 8 KV heads, K and V.
  if (o.quantize) {
    const CodecProfile prof = BenchProfile(o.layers);
    const int T = o.quant_tokens, pages = (T + kPageTokens - 1) / kPageTokens;
    for (PageKind kind : {PageKind::kInt2, PageKind::kBf16}) {
      const PageGeometry g = GeometryFor(prof, kind);
      auto pool = DeviceBuffer::Create(size_t(pages) * g.page_bytes());
      if (!pool.ok()) return pool.status();
      std::vector<uint8_t*> ptrs(pages);
      for (int i = 0; i < pages; ++i) ptrs[i] = pool->as<uint8_t>() + size_t(i) * g.page_bytes();
      std::vector<uint8_t> kinds(pages, static_cast<uint8_t>(kind));
      std::vector<int32_t> dp(T), ds(T);
      for (int t = 0; t < T; ++t) {
        dp[t] = t / kPageTokens;
        ds[t] = t % kPageTokens;
      }
      auto d_ptrs = DeviceBuffer::FromHost(ptrs);
      auto d_kinds = DeviceBuffer::FromHost(kinds);
      auto d_dp = DeviceBuffer::FromHost(dp);
      auto d_ds = DeviceBuffer::FromHost(ds);
      if (!d_ptrs.ok() || !d_kinds.ok() || !d_dp.ok() || !d_ds.ok()) return absl::InternalError("upload");
      using LP = cuda::QuantizeWriteArgs::LoadPath;
      struct Variant {
        const char* name;
        bool rotate, clip, precise = true;
        RangeMode mode = RangeMode::kMinMax;
        LP load = LP::kAuto;
        // 0: `clips` as above, `range_mode`; 1: the engine's launch (a per-head mode table, clip
        // ratios 1.0 passed); 2: a per-head mode table, no clips; 3: the unbiased-fixed mode
        // table (promised min-max / fixed only), no clips.
        int tables = 0;
      };
      std::vector<Variant> variants;
      // The first row is the write a calibrated codec performs (`oscarkv calibrate` defaults:
      // K and V rotated -- V is not absorbed unless `calibrate absorb` ran --, no quantile clip
      // (`--clip none`), unbiased-fixed ranges with the candidate chosen per head (`--range
      // fixed`)), launched as the engine launches it (a per-head mode table it promises holds
      // only min-max / unbiased-fixed modes, no clip table): the streaming kernel. The JSON's
      // quant_bw_fraction is that row. Rows naming a load path force it; "unbiased v2" rows are
      // the previous default rule (8 candidates per group) on its kernels; "round-N kernel" rows
      // are those rounds' kernels as they were, side by side.
      const RangeMode kUb = RangeMode::kUnbiased, kMm = RangeMode::kMinMax, kFx = UnbiasedFixed(6);
      if (kind == PageKind::kInt2) {
        variants = {{"int2 default codec: rotate+unbiased-fixed per head (no clip)", true, false, true, kFx, LP::kAuto, 3},
                    {"int2 default codec, one mode for every head (fixed 6)", true, false, true, kFx},
                    {"int2 default codec, streaming kernel with 3 warpgroups (kStream3)", true, false, true, kFx, LP::kStream3, 3},
                    {"int2 default codec, wgmma 8-warp kernel (kWgmma8)", true, false, true, kFx, LP::kWgmma8, 3},
                    {"int2 default codec, R bf16 hi only (diagnostic)", true, false, false, kFx, LP::kStream, 3},
                    {"int2 default codec (run 2)", true, false, true, kFx, LP::kAuto, 3},
                    {"int2 unbiased v2 (previous default): rotate+unbiased (no clip)", true, false, true, kUb},
                    {"int2 unbiased v2, wgmma with the clip code (kWgmma8)", true, false, true, kUb, LP::kWgmma8},
                    {"int2 unbiased v2, mma.sync rotation (round 3)", true, false, true, kUb, LP::kPrefetchL1},
                    {"int2 unbiased v2, engine launch (mode table, clip ratios 1.0)", true, false, true, kUb, LP::kAuto, 1},
                    {"int2 unbiased v2, R fp16 only", true, false, false, kUb},
                    {"int2 prerotated+unbiased-fixed (flush / R_V absorbed)", false, false, true, kFx},
                    {"int2 prerotated+unbiased v2 (flush / R_V absorbed)", false, false, true, kUb},
                    {"int2 rotate+clip+unbiased v2 (OSCAR clips)", true, true, true, kUb},
                    {"int2 rotate+clip, min-max", true, true, true, kMm},
                    {"int2 rotate, min-max", true, false, true, kMm},
                    {"int2 rotate, min-max, streaming kernel with 3 warpgroups (kStream3)", true, false, true, kMm, LP::kStream3},
                    {"int2 rotate, min-max, mma.sync staged (kStaged)", true, false, true, kMm, LP::kStaged},
                    {"int2 rotate, min-max, wgmma (staged)", true, false, true, kMm, LP::kWgmma4},
                    {"int2 rotate, min-max, R bf16 hi only (diagnostic)", true, false, false, kMm, LP::kStream},
                    {"int2 rotate, min-max, round-1 kernel", true, false, true, kMm, LP::kRound1},
                    {"int2 prerotated, min-max", false, false, true, kMm},
                    {"int2 prerotated+clip, min-max", false, true, true, kMm},
                    {"int2 rotate+clip, range search", true, true, true, RangeMode::kSearch}};
      } else {
        // The engine writes its BF16 pages with its per-head range-mode table: the "engine launch"
        // rows (the streaming kernel with the default codec's table).
        variants = {{"bf16 rotate (sink/tail)", true, false},
                    {"bf16 rotate (sink/tail), streaming kernel with 3 warpgroups (kStream3)", true, false, true, kMm, LP::kStream3},
                    {"bf16 rotate (sink/tail), mma.sync staged (kStaged)", true, false, true, kMm, LP::kStaged},
                    {"bf16 rotate (sink/tail), round-1 kernel", true, false, true, kMm, LP::kRound1},
                    {"bf16 rotate (sink/tail), R fp16 only", true, false, false},
                    {"bf16 rotate, engine launch (default codec's mode table)", true, false, true, kFx, LP::kAuto, 3},
                    {"bf16 rotate, engine launch (unbiased v2 table, clip ratios 1.0)", true, false, true, kUb, LP::kAuto, 1}};
      }
      for (const Variant& v : variants) {
        if (!o.quant_rows.empty() &&
            std::none_of(o.quant_rows.begin(), o.quant_rows.end(),
                         [&](const std::string& s) { return std::string(v.name).find(s) != std::string::npos; })) {
          continue;
        }
        cuda::QuantizeWriteArgs q;
        q.num_layers = o.layers;
        q.num_kv_heads = kKvHeads;
        q.page_tokens = kPageTokens;
        q.k_src = ksrc->as<uint16_t>();
        q.v_src = vsrc->as<uint16_t>();
        q.src_token_stride = kKvHeads * kHeadDim;
        q.src_head_stride = kHeadDim;
        q.num_tokens = T;
        q.page_ptrs = d_ptrs->as<uint8_t*>();
        q.page_kinds = d_kinds->as<uint8_t>();
        q.dst_page = d_dp->as<int32_t>();
        q.dst_slot = d_ds->as<int32_t>();
        q.rot_fragments = v.rotate ? frags->get() : nullptr;
        q.clips = v.clip ? clips->as<float>() : v.tables == 1 ? noclips->as<float>() : nullptr;
        if (v.tables != 0) q.range_modes = (v.tables == 3 ? fixed_table : mode_table)->as<uint8_t>();
        q.range_modes_fixed_only = v.tables == 3;
        q.precise_rotation = v.precise;
        q.load_path = v.load;
        q.range_mode = v.mode;
        auto us = TimeMedianUs([&] { return cuda::LaunchQuantizeWrite(q, nullptr); }, o.samples);
        if (!us.ok()) return us.status();
        const double row_out = kind == PageKind::kInt2 ? 32 + 4 : 256;
        const double bytes = 2.0 * T * kKvHeads * (256 + row_out);
        r.quant.push_back({v.name, *us, bytes});
      }
    }
    // The write beside the attention and projections of the same prefill step.
    BENCH_RETURN_IF_ERROR(MeasurePrefillStep(o, ksrc->as<uint16_t>(), vsrc->as<uint16_t>(), rot_k, &r));
  }
  return r;
}

}  // namespace oscarkv::bench
