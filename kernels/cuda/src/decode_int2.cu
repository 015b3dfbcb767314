// Mixed-precision paged decode attention: the INT2 kernel (one CTA per work item: the BF16 items
// of an INT2-dominated plan, Bf16Item, or an INT2 item, Int2Item in decode_int2_item.cuh), the
// rotation kernel ahead of it, and their launch. The operands' encoding is described in
// decode_int2_operands.cuh.
#include <algorithm>

#include "decode_int2_item.cuh"

namespace oscarkv::cuda {
namespace {

// One CTA per work item; blockIdx.x indexes the plan's order (its first num_int2_items entries).
// kW warps per CTA (DecodeParams::int2_warps): 4 (3 CTAs per SM at most), or 8 for the
// rotation kernel's path (one CTA per SM: 142 registers per thread, no spills).
template <int kW>
constexpr int Int2MinBlocks() { return kW == 4 ? 3 : 1; }
template <int G, bool kV8, int kW = kWarps>
__global__ void __launch_bounds__(32 * kW, Int2MinBlocks<kW>()) DecodeInt2Kernel(const DecodeParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  // The BF16 kernel or the merge kernel (launched next, programmatic serialization) may start
  // now (the BF16 kernel does not depend on this one: it starts as soon as SMs free up);
  // without them, each CTA lets the next kernel on the stream start after its main loop
  // (FinishItem), e.g. the next launch's rotation kernel (DecodeParams::early_rotation), whose
  // CTAs then wait on SMs that the last CTAs of this grid no longer need.
  if (!p.fused_merge || p.num_items > p.num_int2_items) asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0) {
    MarkNs(p, kTlEntryNs);
    MarkClock(p, kTlEntry);
  }
  int item;
  const DecodeWorkItem it = FetchItem(p, blockIdx.x, &item);
  // A capture decoder's padding slot: no work, no partial, no arrival (an exited CTA also
  // counts as having let the next kernel start).
  if (it.kind == kPaddingItemKind) return;
  const bool int2_item = it.kind == static_cast<int32_t>(PageKind::kInt2);
  // A capture decoder's empty item (the one item of a pair without tokens: a sequence past the
  // batch, or an empty one) writes what the merge of its empty partial gives -- output 0, lse
  // -inf -- and exits: no query staging, R_K, rotation, partial, arrival or merge (H200, 8 x 32K
  // through a capture decoder of capacity 16: 64 such CTAs in the tail, after the real items).
  if (int2_item && it.num_slices == 0) {
    const int pair = it.seq * static_cast<int>(p.shape.num_kv_heads) + it.kv_head;
    if (p.item_indptr[pair + 1] - p.item_indptr[pair] == 1) {
      WriteEmptyPair<kW>(p, it);
      return;
    }
  }
  PrefetchSharedRotation(p, it, item);
  int ticket = -1;
  if (kW == kWarps && int2_item && p.rotate_in_cta) {
    // INT2 items: the query rows (into Int2Item's query area) start loading, and the rotation
    // ticket is taken, before the slice table's dependent loads.
    StageQueries(p, it, reinterpret_cast<float*>(smem + kInt2StageArea) + 8 * 128);
    CpAsyncCommit();
    ticket = TakeRotationTicket(p, it);
  }
  uint8_t* t = smem + Int2StageArea<kW>() + kW * kWarpXchg;
  SliceTable tab{reinterpret_cast<const uint8_t**>(t), reinterpret_cast<int32_t*>(t + kMaxItemSlices * 8)};
  LoadSliceTable<kW>(p, it, tab);
  if (kW == kWarps && int2_item && threadIdx.x == 0) *reinterpret_cast<int*>(smem + kTicketSmemOffset) = ticket;
  __syncthreads();
  if (threadIdx.x == 0) {
    MarkClock(p, kTlTable);
    if (p.debug_timeline != nullptr) {
      const int pair = it.seq * static_cast<int>(p.shape.num_kv_heads) + it.kv_head;
      p.debug_timeline[size_t(blockIdx.x) * kDecodeTimelineWords + kTlMeta] =
          uint64_t(it.kind) << 8 | uint64_t(it.num_slices) << 16 |
          uint64_t(p.item_indptr[pair + 1] - p.item_indptr[pair]) << 40;
      MarkMeta(p, 0);
    }
  }
  // An INT2-dominated plan runs its few BF16 items (sink, recent tokens) here too, in the
  // 2-stage layout that fits this kernel's shared memory, instead of in a BF16 kernel whose
  // CTAs could start only as INT2 CTAs leave (a tail after the INT2 work).
  static_assert(2 * kBf16Stage + kW * 2 * 8 * 24 * 2 <= Int2StageArea<kW>() + kW * kWarpXchg,
                "2-stage BF16 layout must fit below the slice table");
  static_assert(kW == kWarps || kMergeStageBytes + 16 <= Int2StageArea<kW>(),
                "the merge's stage and mbarrier lie in the stage area");
  if (it.kind == static_cast<int32_t>(PageKind::kBf16)) {
    Bf16Item<2, kW>(p, item, it, smem, tab);
  } else {
    Int2Item<G, kV8, kW>(p, item, it, smem, tab);
  }
  if (threadIdx.x == 0) {
    MarkClock(p, kTlEnd);
    MarkNs(p, kTlEndNs);
  }
}

// ---------------------------------------------------------------------------------------------
// The rotation kernel (DecodeParams::rotate_in_cta = false): one CTA of kPrepThreads per
// (sequence, KV head) rotates the pair's GQA queries once (q' = q·R_K·softmax_scale·log2 e) into
// the workspace (RotatedQueries, read by the BF16 items and the fp16-query variants) and, for
// the int8 score variants with prepared_fragments, builds the pair's int8 query fragments
// (QueryFragmentArea: 4 x 32 uint4, chunk c of lane l at [c][l]; the lane's words 4c..4c+3 of:
// 0..7 qb[v][hh][rr] at 4v + 2hh + rr, 8 + e qinv[e], 10 + e + 2g Q0i[e][g], so G = 128 needs
// chunks 0..2 only). The INT2 kernel is its
// programmatic dependent: its CTAs load their item and slice table and issue their first K/V
// copies while this grid runs.
constexpr int kPrepThreads = 256;

// early_rotation: the kernel before this one on the stream is done (its writes visible): only
// R_K is read before this. Then the INT2 kernel (programmatic dependent) may start.
__device__ __forceinline__ void PrepWait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
}

// The rotation for kHeads >= gqa heads: warp w sums input rows [16w, 16w+16) for output
// channels [4·lane, 4·lane+4) into part[w][h][128]; its 16 R rows are loaded at once, before the
// query rows (into qin, [gqa][128]), so both loads are in flight together.
template <int kHeads>
__device__ __forceinline__ void PrepRotate(const DecodeParams& p, int kv_head, const float* q, float* qin,
                                           float* part, uint64_t (&marks)[3]) {
  const int gqa = static_cast<int>(p.shape.gqa());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float4* r = reinterpret_cast<const float4*>(p.rot_k + size_t(kv_head) * 128 * 128 +
                                                    size_t(16 * warp) * 128) + lane;
  float4 rv[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) rv[i] = __ldg(r + 32 * i);
  // ptxas issued all but the first of these loads after griddepcontrol.wait, so R_K (64 KiB per
  // CTA) was read after the previous kernel ended instead of while it ran (H200, B=1 x 100K: the
  // rotation took 0.93 µs after the queries arrived). A branch on every loaded row keeps the
  // wait behind them: its store (into this CTA's shared memory, written again after the wait)
  // happens only for one NaN payload of the sum, which changes nothing.
  float probe = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) probe = fmaf(rv[i].x, 0.f, probe);
  if (__float_as_uint(probe) == 0x7fc00001u) qin[threadIdx.x] = probe;
  PrepWait();
  if (p.debug_timeline != nullptr) marks[0] = GlobalNs();
  for (int i = threadIdx.x; i < gqa * 32; i += kPrepThreads)
    reinterpret_cast<float4*>(qin)[i] = reinterpret_cast<const float4*>(q)[i];
  __syncthreads();
  if (p.debug_timeline != nullptr) marks[1] = GlobalNs();
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (h < gqa) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 x = *reinterpret_cast<const float4*>(qin + h * 128 + 16 * warp + 4 * j);
        const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float4 rr = rv[4 * j + u];
          acc.x = fmaf(xs[u], rr.x, acc.x);
          acc.y = fmaf(xs[u], rr.y, acc.y);
          acc.z = fmaf(xs[u], rr.z, acc.z);
          acc.w = fmaf(xs[u], rr.w, acc.w);
        }
      }
      reinterpret_cast<float4*>(part + (warp * gqa + h) * 128)[lane] = acc;
    }
  }
}

// The rotation kernel's int8 query fragments (the words Int8QueryFragments gives every lane,
// in QueryFragmentArea's layout), built by its 8 warps at once: each warp computes the heads'
// scales and sums (max |q| and Σ q: the same shuffle chains in every warp), warp w then word w
// (qb[w >> 2][(w >> 1) & 1][w & 1]) of every lane and warp 0 also the scale and sum words --
// one warp's chain of 32 element conversions becomes 4 per warp. Same bits.
static_assert(kPrepThreads == 256, "PrepFragments: one fragment word per warp");
template <int G>
__device__ __forceinline__ void PrepFragments(const float* qrot, int gqa, uint4* f) {
  constexpr int NG = Int2Layout<G>::NG;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float S[4], sum[4];
  Int8QueryScales<G>(qrot, gqa, lane, S, sum);
  uint32_t* fl = reinterpret_cast<uint32_t*>(f + lane);  // chunk c of this lane at f[32c + lane]
  fl[128 * (warp >> 2) + (warp & 3)] = Int8QueryWord<G>(qrot, gqa, lane, S, warp >> 2, (warp >> 1) & 1, warp & 1);
  if (warp == 0) {
    // Words 8..15: qinv[e] (8 + e), Q0i[e][g] (10 + e + 2g), zeros after.
    float qinv[2], Q0i[2][NG];
    Int8QueryHeadWords<G>(S, sum, lane, qinv, Q0i);
    uint32_t w[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      w[e] = __float_as_uint(qinv[e]);
#pragma unroll
      for (int g = 0; g < NG; ++g) w[2 + e + 2 * g] = __float_as_uint(Q0i[e][g]);
    }
    f[32 * 2 + lane] = make_uint4(w[0], w[1], w[2], w[3]);
    f[32 * 3 + lane] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

// Shared memory: (2 + kPrepThreads / 32) · gqa · 128 floats (query rows, rotated queries, the
// warps' partial sums). blockIdx.x = seq · num_kv_heads + kv head.
template <int G>
__global__ void __launch_bounds__(kPrepThreads) QueryPrepKernel(const DecodeParams p, bool fragments) {
  extern __shared__ __align__(16) float psm[];
  const int gqa = static_cast<int>(p.shape.gqa()), H = static_cast<int>(p.shape.num_kv_heads);
  const int seq = static_cast<int>(blockIdx.x) / H, h = static_cast<int>(blockIdx.x) % H;
  const int t = threadIdx.x;
  const size_t row0 = (size_t(seq) * p.shape.num_q_heads + size_t(h) * gqa) * 128;
  const float* q = p.q + row0;
  float* qin = psm;
  float* qs = psm + gqa * 128;
  float* part = qs + gqa * 128;
  float* dst = RotatedQueries(p) + row0;
  const float scale = (p.softmax_scale > 0 ? p.softmax_scale : 0.08838834764831845f) * kLog2e;
  uint64_t marks[3] = {0, 0, 0};  // diagnostics: wait returned, queries loaded, rotated
  // A capture decoder's pair past the planned batch: its one item is empty and reads no query.
  // (active_pairs is Update's copy, complete before the kernel ahead of this one started.) CTA 0
  // always waits (PrepWait): the INT2 kernel's wait for this grid then also orders it after
  // the kernel ahead (e.g. the previous launch's merges in the same workspace).
  if (blockIdx.x != 0 && p.active_pairs != nullptr && static_cast<int>(blockIdx.x) >= __ldg(p.active_pairs)) {
    return;
  }
  if (p.rot_k == nullptr) {
    PrepWait();
    for (int i = t; i < gqa * 128; i += kPrepThreads) {
      qs[i] = q[i] * scale;
      dst[i] = qs[i];
    }
  } else {
    if (gqa <= 1) {
      PrepRotate<1>(p, h, q, qin, part, marks);
    } else if (gqa <= 2) {
      PrepRotate<2>(p, h, q, qin, part, marks);
    } else if (gqa <= 4) {
      PrepRotate<4>(p, h, q, qin, part, marks);
    } else {
      PrepRotate<8>(p, h, q, qin, part, marks);
    }
    __syncthreads();
    for (int i = t; i < gqa * 128; i += kPrepThreads) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kPrepThreads / 32; ++w) v += part[w * gqa * 128 + i];
      qs[i] = v * scale;
      dst[i] = v * scale;
    }
  }
  if (p.debug_timeline != nullptr) marks[2] = GlobalNs();
  if (fragments) {
    __syncthreads();
    PrepFragments<G>(qs, gqa, QueryFragmentArea(p) + size_t(blockIdx.x) * 128);
  }
  if (p.debug_timeline != nullptr && t == 0 && blockIdx.x < p.num_int2_items) {
    // Diagnostics, in INT2 CTA blockIdx.x's record: this CTA's end (%globaltimer) in word 22,
    // and how long before it the wait returned / the queries were loaded / rotated (ns, 21 bits
    // each) in word 23.
    const uint64_t end = GlobalNs();
    uint64_t* rec = p.debug_timeline + size_t(blockIdx.x) * kDecodeTimelineWords;
    rec[kTlRotationEndNs] = end;
    uint64_t packed = 0;
    for (int i = 0; i < 3; ++i) packed |= (std::min<uint64_t>(end - marks[i], 0x1fffff)) << (21 * i);
    rec[kTlRotationMarks] = packed;
  }
}

// Raises an INT2 kernel's dynamic shared-memory limit on its first launch (one static per
// instantiation: the kernel is a template argument, not a value of the shared pointer type).
// int2_ctas_per_sm: dynamic shared memory of 228 KiB / (cap + 1) per CTA keeps a (cap + 1)-th
// CTA (with its 1 KiB of reserved shared memory) off every SM.
constexpr int kSmPaddedSmem = 228 * 1024;
template <int G, bool kV8, int kW = kWarps>
absl::Status LaunchInt2(const DecodeParams& p, int blocks, cudaStream_t stream) {
  constexpr int kSmem = Int2SmemBytes<kW>();
  static const bool once = SetSmem(DecodeInt2Kernel<G, kV8, kW>, std::max(kSmem, kSmPaddedSmem / 2));
  (void)once;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(32 * kW);
  // 8 warps per CTA: the registers already keep a second CTA off an SM.
  const int cap = kW == kWarps ? p.int2_ctas_per_sm : 0;
  cfg.dynamicSmemBytes = cap == 1 || cap == 2 ? std::max(kSmem, kSmPaddedSmem / (cap + 1)) : kSmem;
  cfg.stream = stream;
  // A programmatic dependent of the rotation kernel (launched just before it unless
  // rotate_in_cta): CTAs start while it runs and wait for its output in CtaQueries.
  cudaLaunchAttribute attr;
  SetProgrammaticDependent(cfg, attr, !p.rotate_in_cta);
  return CudaStatus(cudaLaunchKernelEx(&cfg, DecodeInt2Kernel<G, kV8, kW>, p), "int2 decode launch");
}

template <int G>
absl::Status LaunchInt2Group(const DecodeParams& p, int n2, bool v8, cudaStream_t stream) {
  if (p.int2_warps != kWarps) return LaunchInt2<G, true, 8>(p, n2, stream);  // checked by the caller
  return v8 ? LaunchInt2<G, true>(p, n2, stream) : LaunchInt2<G, false>(p, n2, stream);
}
}  // namespace

absl::Status LaunchDecodeInt2Kernels(const DecodeParams& p, int n2, cudaStream_t stream) {
  // GQA > 4 has no packed kernel: the baseline's one query head per mma column.
  const bool v8 = p.variant == DecodeVariant::kPackedInt8Values && p.shape.gqa() <= 4;
  if (!p.rotate_in_cta) {
    const int gqa = static_cast<int>(p.shape.gqa());
    const int ctas = p.table.num_seqs * static_cast<int>(p.shape.num_kv_heads);
    const size_t smem = size_t(2 + kPrepThreads / 32) * gqa * 128 * sizeof(float);
    const bool fragments = v8 && p.prepared_fragments;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(ctas);
    cfg.blockDim = dim3(kPrepThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr;
    SetProgrammaticDependent(cfg, attr, p.early_rotation);
    const cudaError_t e = p.shape.group_size == 128
                              ? cudaLaunchKernelEx(&cfg, QueryPrepKernel<128>, p, fragments)
                              : cudaLaunchKernelEx(&cfg, QueryPrepKernel<64>, p, fragments);
    if (absl::Status st = CudaStatus(e, "query rotation launch"); !st.ok()) return st;
  }
  return p.shape.group_size == 128 ? LaunchInt2Group<128>(p, n2, v8, stream)
                                   : LaunchInt2Group<64>(p, n2, v8, stream);
}

int DecodeKernelOccupancy(int group_size) {
  int blocks = 0;
  if (group_size == 128) {
    cudaFuncSetAttribute(DecodeInt2Kernel<128, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemBytes<true>());
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, DecodeInt2Kernel<128, false>, kThreads, SmemBytes<true>());
  } else {
    cudaFuncSetAttribute(DecodeInt2Kernel<64, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemBytes<true>());
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, DecodeInt2Kernel<64, false>, kThreads, SmemBytes<true>());
  }
  return blocks;
}

}  // namespace oscarkv::cuda
