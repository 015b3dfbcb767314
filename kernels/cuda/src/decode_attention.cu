// Mixed-precision paged decode attention: the BF16-slice kernel, the log-sum-exp merge kernel and
// the launch sequence (optional rotation kernel, INT2 items, then
// BF16 items overlapping them through programmatic serialization, then the merge kernel unless
// the last CTA of each (sequence, KV head) merges). The INT2 kernel and its variants are in
// decode_int2.cu; the shared pieces (and the fused merge) in decode_common.cuh.
//
// Work decomposition: one CTA (4 warps) per work item = (sequence, KV head, run of 64-token
// slices of one kind). K/V bytes of the item's slices stream through shared memory with
// cp.async in a multi-stage ring; each warp keeps its own online-softmax state for all GQA
// query heads of the KV head (the n = 8 columns of the mma tiles), and the 4 warps' states are
// merged before the item's partial result is written.
#include "absl/strings/str_cat.h"
#include "decode_bf16.cuh"

namespace oscarkv::cuda {
namespace {

__global__ void __launch_bounds__(kThreads, 2) DecodeBf16Kernel(const DecodeParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  // The merge kernel (next, programmatic serialization) may start its CTAs now; they wait
  // for this grid's completion before reading the partials.
  asm volatile("griddepcontrol.launch_dependents;");
  int item;
  const DecodeWorkItem it = FetchItem(p, p.num_int2_items + blockIdx.x, &item);
  if (it.kind == kPaddingItemKind) {
    asm volatile("griddepcontrol.wait;" ::: "memory");  // as below: complete after the INT2 grid
    return;
  }
  uint8_t* t = smem + kBf16StageArea + kWarps * kWarpXchg;
  SliceTable tab{reinterpret_cast<const uint8_t**>(t), reinterpret_cast<int32_t*>(t + kMaxItemSlices * 8)};
  LoadSliceTable(p, it, tab);
  __syncthreads();
  Bf16Item<kBf16Stages>(p, item, it, smem, tab);
  // This grid (launched as a dependent of the INT2 kernel) completes only after the INT2
  // kernel has: the merge waits on this grid alone.
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Merges the partials of every item of (sequence, KV head) for one query head; optionally
// multiplies by R_Vᵀ. Items are processed 128 at a time: weights 2^(m_i - M)·l_i in parallel,
// then each thread (one channel) sums independent loads of the items' partial outputs.
__device__ __forceinline__ float BlockReduce(float v, float* red, bool is_max) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < 4; ++w) v = is_max ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

__global__ void __launch_bounds__(128) MergeKernel(const DecodeParams p) {
  __shared__ float os[128];
  __shared__ float wsm[128];
  __shared__ float red[4];
  const int sq = blockIdx.x;
  const int seq = sq / p.shape.num_q_heads, qh = sq % p.shape.num_q_heads;
  const int gqa = p.shape.gqa(), h = qh / gqa, j = qh % gqa;
  const int t = threadIdx.x;
  // Launched as a programmatic dependent of the decode kernel(s): wait for their partials.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const float* part_o = static_cast<const float*>(p.workspace);
  const float* part_ml =
      reinterpret_cast<const float*>(static_cast<const uint8_t*>(p.workspace) + PartialOBytes(p));
  const int i0 = p.item_indptr[seq * p.shape.num_kv_heads + h];
  const int i1 = p.item_indptr[seq * p.shape.num_kv_heads + h + 1];
  float mx = -INFINITY;
  for (int i = i0 + t; i < i1; i += 128) {
    if (__ldcg(&part_ml[(size_t(i) * gqa + j) * 2 + 1]) > 0.f) mx = fmaxf(mx, __ldcg(&part_ml[(size_t(i) * gqa + j) * 2]));
  }
  mx = BlockReduce(mx, red, true);
  float L = 0.f, O = 0.f;
  if (mx != -INFINITY) {
    for (int c0 = i0; c0 < i1; c0 += 128) {
      const int i = c0 + t;
      float w = 0.f;
      if (i < i1) {
        const float l = __ldcg(&part_ml[(size_t(i) * gqa + j) * 2 + 1]);
        if (l > 0.f) w = exp2f(__ldcg(&part_ml[(size_t(i) * gqa + j) * 2]) - mx) * l;
      }
      __syncthreads();
      wsm[t] = w;
      L += w;
      __syncthreads();
      const int n = min(128, i1 - c0);
      int k = 0;
      // 16 independent loads in flight per round (a long split, e.g. 46 items per head at
      // B=1 x 100K, otherwise costs one L2 round trip per 4 items).
      for (; k + 16 <= n; k += 16) {
        const float* base = part_o + (size_t(c0 + k) * gqa + j) * 128 + t;
        float v[16];
#pragma unroll
        for (int u = 0; u < 16; ++u) v[u] = __ldcg(base + size_t(u) * gqa * 128);
#pragma unroll
        for (int u = 0; u < 16; ++u) O = fmaf(wsm[k + u], v[u], O);
      }
      for (; k + 4 <= n; k += 4) {
        const float* base = part_o + (size_t(c0 + k) * gqa + j) * 128 + t;
        const float o0 = __ldcg(base), o1 = __ldcg(base + size_t(gqa) * 128),
                    o2 = __ldcg(base + size_t(2 * gqa) * 128), o3 = __ldcg(base + size_t(3 * gqa) * 128);
        O += wsm[k] * o0 + wsm[k + 1] * o1 + wsm[k + 2] * o2 + wsm[k + 3] * o3;
      }
      for (; k < n; ++k) O += wsm[k] * __ldcg(&part_o[(size_t(c0 + k) * gqa + j) * 128 + t]);
    }
    L = BlockReduce(L, red, false);
  }
  const float o = L > 0.f ? O / L : 0.f;
  if (t == 0 && p.lse != nullptr) p.lse[sq] = L > 0.f ? (mx + log2f(L)) * kLn2 : -INFINITY;
  if (t == 0 && j == 0) {  // re-arm share_rotation's ticket of the pair (the decode grids are done)
    int* tk = RotationTicket(p, seq * p.shape.num_kv_heads + h);
    tk[0] = 0;
    tk[1] = 0;
  }
  if (!p.unrotate_output || p.rot_v == nullptr) {
    p.out[size_t(sq) * 128 + t] = o;
    return;
  }
  os[t] = o;
  __syncthreads();
  // out[i] = Σ_k o[k] · R_V[i][k]: warp w computes outputs i = w, w+4, ...
  const float* r = p.rot_v + size_t(h) * 128 * 128;
  const int warp = t >> 5, lane = t & 31;
  const float4 ov = *reinterpret_cast<const float4*>(os + 4 * lane);
  for (int i = warp; i < 128; i += 4) {
    const float4 rv = *reinterpret_cast<const float4*>(r + size_t(i) * 128 + 4 * lane);
    float s = ov.x * rv.x + ov.y * rv.y + ov.z * rv.z + ov.w * rv.w;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) p.out[size_t(sq) * 128 + i] = s;
  }
}

}  // namespace

absl::Status LaunchDecodeAttention(const DecodeParams& params, cudaStream_t stream) {
  if (params.int2_warps != 4 && params.int2_warps != 8) {
    return absl::InvalidArgumentError(absl::StrCat("int2_warps must be 4 or 8, got ", params.int2_warps));
  }
  DecodeParams p = params;
  // The larger CTAs exist for one path only; other options run the 4-warp kernel.
  if (p.variant != DecodeVariant::kPackedInt8Values || p.shape.gqa() > 4 || p.rotate_in_cta ||
      !p.prepared_fragments) {
    p.int2_warps = kWarps;
  }
  if (absl::Status s = ValidateDecodeShape(p.shape); !s.ok()) return s;
  if (p.table.num_seqs <= 0) return absl::OkStatus();
  if (p.num_items > 0 && (p.items == nullptr || p.item_order == nullptr)) {
    return absl::InvalidArgumentError("no work items / item order");
  }
  if (p.q == nullptr || p.out == nullptr || p.workspace == nullptr || p.item_indptr == nullptr) {
    return absl::InvalidArgumentError("decode attention: q, out, workspace and plan are required");
  }
  if (p.unrotate_output && p.rot_v == nullptr) {
    return absl::InvalidArgumentError("unrotate_output needs rot_v");
  }
  if (p.fused_merge && reinterpret_cast<uintptr_t>(p.out) % 16 != 0) {
    return absl::InvalidArgumentError("fused_merge needs a 16-byte aligned out");
  }
  const int sq = p.table.num_seqs * static_cast<int>(p.shape.num_q_heads);
  const int n2 = p.num_int2_items, nb = p.num_items - p.num_int2_items;
  // The INT2 kernel (after the rotation kernel unless rotate_in_cta).
  if (n2 > 0) {
    if (absl::Status st = LaunchDecodeInt2Kernels(p, n2, stream); !st.ok()) return st;
  }
  if (nb > 0) {
    static const bool once = SetSmem(DecodeBf16Kernel, SmemBytes<false>());
    (void)once;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(nb);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = SmemBytes<false>();
    cfg.stream = stream;
    // A programmatic dependent of this launch's INT2 kernel only: without INT2 items the
    // previous kernel on the stream is another launch's (with the fused merge, its decode
    // kernel, whose CTAs may still be merging in the same workspace).
    cudaLaunchAttribute attr;
    SetProgrammaticDependent(cfg, attr, n2 > 0);
    DecodeParams pb = p;
    pb.debug_timeline = nullptr;  // the timeline records the INT2 kernel's CTAs only
    if (absl::Status st = CudaStatus(cudaLaunchKernelEx(&cfg, DecodeBf16Kernel, pb), "bf16 decode launch");
        !st.ok()) {
      return st;
    }
  }
  if (!p.fused_merge) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(sq);
    cfg.blockDim = dim3(128);
    cfg.stream = stream;
    cudaLaunchAttribute attr;
    SetProgrammaticDependent(cfg, attr, true);
    if (absl::Status st = CudaStatus(cudaLaunchKernelEx(&cfg, MergeKernel, p), "merge launch"); !st.ok()) {
      return st;
    }
  }
  return CudaStatus(cudaGetLastError(), "decode attention launch");
}

const char* DecodeVariantName(DecodeVariant v) {
  switch (v) {
    case DecodeVariant::kBaseline: return "baseline";
    case DecodeVariant::kPackedInt8Values: return "packed_int8_values";
  }
  return "unknown";
}

}  // namespace oscarkv::cuda
