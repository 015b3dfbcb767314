// Shared pieces of the paged decode kernels (decode_int2.cu, decode_attention.cu): constants and
// shared-memory budget, the per-warp online-softmax state and the merge of the 4 warps' states,
// the slice table, and the in-CTA query rotation. Internal to kernels/cuda/src.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "device_util.cuh"
#include "oscarkv/cuda/internal/decode_launch.h"

namespace oscarkv::cuda {

// Enqueues the rotation kernel (unless rotate_in_cta) and the INT2 kernel (p.variant) over the
// plan's first `blocks` items (decode_int2.cu).
absl::Status LaunchDecodeInt2Kernels(const DecodeParams& p, int blocks, cudaStream_t stream);

namespace {

using namespace detail;

constexpr int kThreads = 128;
constexpr int kWarps = 4;
constexpr int kInt2Slot = 5120;        // one 64-token slice, K and V, codes + params (G >= 64)
constexpr int kBf16Stage = 32768;      // one 64-token slice, K and V rows
constexpr int kBf16Stages = 3;
constexpr int kWStride = 72;           // halves per (group, query head) row of the W exchange
constexpr int kWarpXchg = 2 * 8 * kWStride * 2;  // bytes per warp (2 groups x 8 heads)
constexpr int kInt2StageArea = kWarps * 3 * kInt2Slot;            // 60 KiB
constexpr int kBf16StageArea = kBf16Stages * kBf16Stage;           // 96 KiB
// Shared memory: stage area, then the per-warp W/P exchange, then the slice table.
template <bool kInt2>
constexpr int SmemBytes() {
  return (kInt2 ? kInt2StageArea : kBf16StageArea) + kWarps * kWarpXchg + kMaxItemSlices * 12;
}
// The INT2 kernel with kW warps per CTA (DecodeParams::int2_warps; 4 is the layout above):
// kW rings of 3 slots, kW W exchanges, the slice table.
template <int kW>
constexpr int Int2StageArea() { return kW * 3 * kInt2Slot; }
template <int kW>
constexpr int Int2SmemBytes() { return Int2StageArea<kW>() + kW * kWarpXchg + kMaxItemSlices * 12; }
static_assert(Int2SmemBytes<kWarps>() == SmemBytes<true>(), "4-warp INT2 layout");
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Per-register bit offsets of the 8 codes a LOP3 extracts from one 16-bit half: codes 0..3 of
// byte 0 (bits 0,2,4,6), code 0 of byte 1 (bit 8), then codes 1..3 of byte 1 after a shift by
// 8 (bits 2,4,6).
__host__ __device__ constexpr int CodeShift(int r) { return r < 4 ? 2 * r : (r == 4 ? 8 : 2 * (r - 4)); }

// Diagnostics (DecodeParams::debug_timeline): this CTA's record word `slot` = clock64, or
// %globaltimer for the *_ns slots. The caller picks the one thread that writes.
__device__ __forceinline__ void MarkClock(const DecodeParams& p, int slot) {
  if (p.debug_timeline == nullptr) return;
  uint64_t c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  p.debug_timeline[size_t(blockIdx.x) * kDecodeTimelineWords + slot] = c;
}
__device__ __forceinline__ uint64_t GlobalNs() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}
__device__ __forceinline__ void MarkNs(const DecodeParams& p, int slot) {
  if (p.debug_timeline == nullptr) return;
  p.debug_timeline[size_t(blockIdx.x) * kDecodeTimelineWords + slot] = GlobalNs();
}
__device__ __forceinline__ void MarkMeta(const DecodeParams& p, uint64_t bits) {
  if (p.debug_timeline == nullptr) return;
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  p.debug_timeline[size_t(blockIdx.x) * kDecodeTimelineWords + kTlMeta] |= bits | sm;
}

struct SliceTable {
  const uint8_t** ptr;  // page base per slice of the item
  int32_t* info;        // (token offset in page) << 16 | valid tokens
};

__device__ __forceinline__ float WarpMaxOverGid(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
  return v;
}
__device__ __forceinline__ float WarpSumOverGid(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  v += __shfl_xor_sync(0xffffffffu, v, 16);
  return v;
}

__device__ __forceinline__ float Ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// exp2 and division after the main loop: the 4-warp kernel's exact ones (its code as
// measured), ex2.approx and fast division in CTAs of more warps (int2_warps 8).
template <int kW>
__device__ __forceinline__ float FinishExp2(float x) {
  if constexpr (kW == kWarps) {
    return exp2f(x);
  } else {
    return Ex2(x);
  }
}
template <int kW>
__device__ __forceinline__ float FinishDiv(float a, float b) {
  if constexpr (kW == kWarps) {
    return a / b;
  } else {
    return __fdividef(a, b);
  }
}

// Online-softmax state of one warp: lane (gid, tig) owns query heads 2·tig and 2·tig+1.
struct WarpState {
  float o[8][4];
  float m[2];
  float l[2];  // per-lane partial; summed over gid at the end
};

// Rescales the state to a new running max; returns the max to subtract from new scores.
__device__ __forceinline__ float Rescale(WarpState& st, int e, float chunk_max, float* factor) {
  const float m_new = fmaxf(st.m[e], chunk_max);
  const float m_use = m_new == -INFINITY ? 0.f : m_new;
  *factor = Ex2(st.m[e] - m_use);
  st.m[e] = m_new;
  st.l[e] *= *factor;
  #pragma unroll
  for (int i = 0; i < 8; ++i) {
    st.o[i][e] *= *factor;
    st.o[i][2 + e] *= *factor;
  }
  return m_use;
}

// Workspace layout: partial outputs [item][gqa][128], (max, sum) pairs [item][gqa][2], then the
// fused merge's arrival counters [seq][kv head] (DecodeWorkspaceBytes).
__device__ __forceinline__ size_t PartialOBytes(const DecodeParams& p) {
  return (sizeof(float) * size_t(p.num_items) * p.shape.gqa() * 128 + 255) / 256 * 256;
}
__device__ __forceinline__ size_t PartialMlBytes(const DecodeParams& p) {
  return (sizeof(float) * 2 * size_t(p.num_items) * p.shape.gqa() + 255) / 256 * 256;
}
// The rotated queries [seq][query head][128] (after the arrival counters).
__device__ __forceinline__ float* RotatedQueries(const DecodeParams& p) {
  const size_t counters = (sizeof(int32_t) * size_t(p.table.num_seqs) * p.shape.num_kv_heads + 255) / 256 * 256;
  return reinterpret_cast<float*>(static_cast<uint8_t*>(p.workspace) + PartialOBytes(p) +
                                  PartialMlBytes(p) + counters);
}

// Shared memory the fused merge stages partials in: both kernels have at least this much in
// front of the slice table.
constexpr int kMergeStageBytes = kInt2StageArea + kWarps * kWarpXchg;

// share_rotation's (ticket, published) int32 pair of (seq, kv head) `pair` (after the rotated
// queries).
__device__ __forceinline__ int* RotationTicket(const DecodeParams& p, int pair) {
  const size_t qrot = (sizeof(float) * size_t(p.table.num_seqs) * p.shape.num_q_heads * 128 + 255) / 256 * 256;
  return reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(RotatedQueries(p)) + qrot) + 2 * pair;
}
// The rotation kernel's int8 query fragments [seq][kv head][4][32] uint4 (after the tickets;
// DecodeParams::prepared_fragments).
__device__ __forceinline__ uint4* QueryFragmentArea(const DecodeParams& p) {
  const size_t tickets = (sizeof(int32_t) * 2 * size_t(p.table.num_seqs) * p.shape.num_kv_heads + 255) / 256 * 256;
  return reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(RotationTicket(p, 0)) + tickets);
}
// Where the INT2 kernel keeps a CTA's rotation ticket between its entry and CtaQueries: the last
// word of the W exchange area, idle until the main loop.
constexpr int kTicketSmemOffset = kInt2StageArea + kWarps * kWarpXchg - 4;

// fused_merge: the last CTA of (seq, kv head) merges the partials of its items for all GQA
// heads: warp w takes heads w, w+4; lane l channels [4l, 4l+4) of a head. Items are taken in
// chunks of up to 32 (lane i loads item i's (max, sum) once): a chunk's partial rows (contiguous
// in the workspace) are copied into shared memory with cp.async, all in flight together with the
// (max, sum) loads -- one L2 round trip per chunk (32 items at GQA 4, i.e. one for B=1 x 100K) --,
// then summed with the weights 2^(m_i - M)·l_i (broadcast by shuffles) and an online rescale
// between chunks. Then the optional R_Vᵀ product. Partials are read from L2 (.cg): other CTAs
// wrote them. smem: at least kMergeStageBytes, free (FinishItem's flag in it has been read).
// Items [i0, i1) of the pair (item_indptr, as FinishItem loaded it).
// bulk_merge: waits for phase `phase` of the mbarrier at shared address `mbar`.
__device__ __forceinline__ void MbarWait(uint32_t mbar, int phase) {
  asm volatile(
      "{\n .reg .pred P1;\n LAB_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      " @P1 bra DONE;\n bra LAB_WAIT;\n DONE:\n}\n" ::"r"(mbar),
      "r"(phase)
      : "memory");
}

// The merged rows' R_Vᵀ product in 8-warp CTAs (GQA <= 4): out[j][i] = Σ_k o[j][k] · R_V[i][k],
// warp w summing k in [16w, 16w+16) for the outputs i = 4·lane + u with all 16 of its lane's
// R_V pieces loaded at once (one L2 round trip; the 4-warp form below takes four, one per
// quarter of its 32 k), then the 8 warps' partial sums added through shared memory by all 256
// threads. os: [gqa][128] merged rows at the start of smem; the partial sums [8][8][128] follow.
__device__ __forceinline__ void MergeUnrotate8(const DecodeParams& p, int h, float* os, int qh0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gqa = static_cast<int>(p.shape.gqa());
  const float* r = p.rot_v + size_t(h) * 128 * 128;
  float* part = os + 8 * 128;
  const int k0 = 16 * warp;
  float4 rv[4][4];  // [row u][k piece m]
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int m = 0; m < 4; ++m) rv[u][m] = *reinterpret_cast<const float4*>(r + size_t(4 * lane + u) * 128 + k0 + 4 * m);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (j < gqa) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const float4 x = *reinterpret_cast<const float4*>(os + j * 128 + k0 + 4 * m);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          acc[u] = fmaf(x.x, rv[u][m].x, acc[u]);
          acc[u] = fmaf(x.y, rv[u][m].y, acc[u]);
          acc[u] = fmaf(x.z, rv[u][m].z, acc[u]);
          acc[u] = fmaf(x.w, rv[u][m].w, acc[u]);
        }
      }
      reinterpret_cast<float4*>(part + (warp * 8 + j) * 128)[lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    }
  }
  __syncthreads();
  for (int u = threadIdx.x; u < gqa * 128; u += 256) {
    const int j = u >> 7, i = u & 127;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) v += part[(w * 8 + j) * 128 + i];
    p.out[size_t(qh0 + j) * 128 + i] = v;
  }
}

// kW: warps of the CTA (kWarps, or DecodeParams::int2_warps in the INT2 kernel): warp w takes heads
// w, w + kW; warps past the fourth idle in the R_Vᵀ product.
template <int kW = kWarps>
__device__ void MergePairInCta(const DecodeParams& p, int seq, int h, uint8_t* smem, int i0, int i1) {
  constexpr int kT = 32 * kW, kJ = (8 + kW - 1) / kW;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = threadIdx.x;
  const int gqa = static_cast<int>(p.shape.gqa());
  const float* part_o = static_cast<const float*>(p.workspace);
  const float2* part_ml =
      reinterpret_cast<const float2*>(static_cast<const uint8_t*>(p.workspace) + PartialOBytes(p));
  const int qh0 = seq * static_cast<int>(p.shape.num_q_heads) + h * gqa;
  const bool unrot = p.unrotate_output && p.rot_v != nullptr;
  const int chunk = min(32, kMergeStageBytes / (gqa * 128 * 4));
  float4* stage = reinterpret_cast<float4*>(smem);
  if (unrot) {  // R_V[h] (64 KiB) into L2 while the partials are merged
    const uint8_t* r = reinterpret_cast<const uint8_t*>(p.rot_v + size_t(h) * 128 * 128);
    for (int i = t; i < 512; i += kT) asm volatile("prefetch.global.L2 [%0];" ::"l"(r + 128 * i));
  }
  // bulk_merge: one bulk (TMA) copy per chunk, completing on an mbarrier after the stage area
  // (the slice table's place in the INT2 kernel, stage space in the BF16 kernel: both idle now).
  const uint32_t mbar = SmemAddr(smem + kMergeStageBytes);
  if (p.bulk_merge) {
    if (t == 0) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(mbar) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
  }
  // 8 warps at GQA <= 4: warps w and w + 4 take the two 64-channel halves of head w (2 channels
  // per lane), so every warp merges.
  const bool split = kW == 8 && gqa <= 4;
  const int half = warp >> 2;
  auto head = [&](int jj) { return split ? (warp & 3) : warp + kW * jj; };
  int phase = 0;
  float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.f, 0.f};
  float4 O[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
  for (int c0 = i0; c0 < i1; c0 += chunk) {
    const int n = min(chunk, i1 - c0);
    const float4* src = reinterpret_cast<const float4*>(part_o + size_t(c0) * gqa * 128);
    if (p.bulk_merge) {
      if (t == 0) {
        // The stage was last accessed through the generic proxy, the partials written by other
        // CTAs (acquired by FinishItem's fence): order both before the async-proxy copy.
        asm volatile("fence.proxy.async;" ::: "memory");
        const uint32_t bytes = static_cast<uint32_t>(n * gqa * 128 * 4);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mbar), "r"(bytes) : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                SmemAddr(stage)),
            "l"(src), "r"(bytes), "r"(mbar)
            : "memory");
      }
    } else {
      for (int i = t; i < n * gqa * 32; i += kT) CpAsync16(stage + i, src + i, true);
      CpAsyncCommit();
    }
    float2 ml[2];
#pragma unroll
    for (int jj = 0; jj < kJ; ++jj) {
      const int j = head(jj);
      ml[jj] = j < gqa && lane < n ? __ldcg(part_ml + size_t(c0 + lane) * gqa + j)
                                   : make_float2(-INFINITY, 0.f);
    }
    if (p.bulk_merge) {
      MbarWait(mbar, phase);
      phase ^= 1;
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
#pragma unroll
    for (int jj = 0; jj < kJ; ++jj) {
      const int j = head(jj);
      const float m = ml[jj].y > 0.f ? ml[jj].x : -INFINITY, l = ml[jj].y > 0.f ? ml[jj].y : 0.f;
      float cm = m;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, off));
      const float mn = fmaxf(M[jj], cm);
      // Heads past gqa, and no tokens so far (both warp-uniform).
      if (j >= gqa || mn == -INFINITY) continue;
      const float f = FinishExp2<kW>(M[jj] - mn);  // 0 while M is -inf
      L[jj] *= f;
      O[jj].x *= f;
      O[jj].y *= f;
      O[jj].z *= f;
      O[jj].w *= f;
      M[jj] = mn;
      const float w = l > 0.f ? FinishExp2<kW>(m - mn) * l : 0.f;
      L[jj] += w;
      if (split) {
        const float2* stage2 = reinterpret_cast<const float2*>(stage) + 32 * half + lane;
#pragma unroll 4
        for (int u = 0; u < n; ++u) {
          const float wu = __shfl_sync(0xffffffffu, w, u);
          const float2 v = stage2[(u * gqa + j) * 64];
          O[jj].x = fmaf(wu, v.x, O[jj].x);
          O[jj].y = fmaf(wu, v.y, O[jj].y);
        }
      } else {
#pragma unroll 4
        for (int u = 0; u < n; ++u) {
          const float wu = __shfl_sync(0xffffffffu, w, u);
          const float4 v = stage[(u * gqa + j) * 32 + lane];
          O[jj].x = fmaf(wu, v.x, O[jj].x);
          O[jj].y = fmaf(wu, v.y, O[jj].y);
          O[jj].z = fmaf(wu, v.z, O[jj].z);
          O[jj].w = fmaf(wu, v.w, O[jj].w);
        }
      }
    }
    __syncthreads();  // the next chunk (or the R_Vᵀ product) overwrites the stage
  }
  float* os = reinterpret_cast<float*>(smem);  // [gqa][128] merged rows for the R_Vᵀ product
#pragma unroll
  for (int jj = 0; jj < kJ; ++jj) {
    const int j = head(jj);
    if (j >= gqa) continue;
    float Lj = L[jj];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) Lj += __shfl_xor_sync(0xffffffffu, Lj, off);
    const float inv = Lj > 0.f ? FinishDiv<kW>(1.f, Lj) : 0.f;
    const float4 o = make_float4(O[jj].x * inv, O[jj].y * inv, O[jj].z * inv, O[jj].w * inv);
    if (lane == 0 && (!split || half == 0) && p.lse != nullptr)
      p.lse[qh0 + j] = Lj > 0.f ? (M[jj] + log2f(Lj)) * kLn2 : -INFINITY;
    if (split) {
      float* row = unrot ? os + j * 128 : p.out + size_t(qh0 + j) * 128;
      reinterpret_cast<float2*>(row + 64 * half)[lane] = make_float2(o.x, o.y);
    } else if (unrot) {
      reinterpret_cast<float4*>(os + j * 128)[lane] = o;
    } else {
      reinterpret_cast<float4*>(p.out + size_t(qh0 + j) * 128)[lane] = o;
    }
  }
  if (!unrot) return;
  __syncthreads();
  if constexpr (kW == 8) {
    MergeUnrotate8(p, h, os, qh0);
    return;
  }
  // out[j][i] = Σ_k o[j][k] · R_V[i][k]: warp w sums k in [32w, 32w+32) for the outputs
  // i = 4·lane + u (rows of R_V; each quarter's 8 row pieces are loaded at once, from L2: they
  // were prefetched when the merge started), the four warps' partial sums are added through
  // shared memory.
  const float* r = p.rot_v + size_t(h) * 128 * 128;
  float* part = os + 8 * 128;  // [warp][8][128]
  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int u = 0; u < 4; ++u) acc[j][u] = 0.f;
#pragma unroll 1
  for (int quarter = 0; quarter < ((kW == kWarps || warp < kWarps) ? 4 : 0); ++quarter) {
    const int k0 = 32 * warp + 8 * quarter;
    float4 rv[4][2];  // [row u][k piece m]
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int m = 0; m < 2; ++m)
        rv[u][m] = *reinterpret_cast<const float4*>(r + size_t(4 * lane + u) * 128 + k0 + 4 * m);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (j < gqa) {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const float4 x = *reinterpret_cast<const float4*>(os + j * 128 + k0 + 4 * m);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            acc[j][u] = fmaf(x.x, rv[u][m].x, acc[j][u]);
            acc[j][u] = fmaf(x.y, rv[u][m].y, acc[j][u]);
            acc[j][u] = fmaf(x.z, rv[u][m].z, acc[j][u]);
            acc[j][u] = fmaf(x.w, rv[u][m].w, acc[j][u]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (j < gqa && (kW == kWarps || warp < kWarps))
      reinterpret_cast<float4*>(part + (warp * 8 + j) * 128)[lane] =
          make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
  __syncthreads();
  if (kW != kWarps && t >= 128) return;
  for (int j = 0; j < gqa; ++j) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += part[(w * 8 + j) * 128 + t];
    p.out[size_t(qh0 + j) * 128 + t] = v;
  }
}

// Merges the kW warps' states (written to smem by each warp) and writes the item's partial;
// with fused_merge, the last CTA of the item's (seq, kv head) then merges the pair.
// chan(i, r) is the channel of accumulator tile i, row half r (0: c0/c1, 1: c2/c3).
// kW: warps of the CTA (the INT2 kernel's DecodeParams::int2_warps); with more than 4 the
// partial's (head, channel) units spread over all threads.
// kOwnArea (INT2 items of 8-warp CTAs): warp w writes its state into its own ring (bytes
// [w, w + 1) · Int2StageArea / kW, free once its own copies have landed), so a warp may call
// this as soon as its main loop is done, without a CTA barrier after the loops: the warps that
// end first write their states while the others still stream. Otherwise the states lie at the
// start of smem, which the caller's barrier must have freed.
template <int kW = kWarps, bool kOwnArea = false, typename ChanFn>
__device__ void FinishItem(const DecodeParams& p, int item, const DecodeWorkItem& it,
                           WarpState& st, uint8_t* smem, ChanFn chan) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tig = lane & 3;
  const int gqa = static_cast<int>(p.shape.gqa());
  // The next kernel on the stream may start its CTAs once every CTA of this grid is here (the
  // INT2 kernel's trigger when no kernel of this launch follows it; a repeat is harmless).
  asm volatile("griddepcontrol.launch_dependents;");
  // fused_merge: the pair's item range, loaded while the partial is written.
  int i0 = 0, i1 = 0;
  if (threadIdx.x == 0 && p.fused_merge) {
    const int pair = it.seq * static_cast<int>(p.shape.num_kv_heads) + it.kv_head;
    i0 = __ldg(p.item_indptr + pair);
    i1 = __ldg(p.item_indptr + pair + 1);
  }
  // Warp w's rows [8][128] at osm + oi(w, 0, 0) and (max, sum) pairs [8][2] at mlsm + mi(w, 0):
  // [warp][8][128] and then [warp][8][2] at the start of smem, or kOwnArea in the warp's ring.
  constexpr int kArea = Int2StageArea<kW>() / kW / 4;  // floats
  static_assert(!kOwnArea || 8 * 128 + 16 <= kArea, "a warp's state fits its ring");
  float* osm = reinterpret_cast<float*>(smem);
  float* mlsm = kOwnArea ? osm + 8 * 128 : osm + kW * 8 * 128;
  auto oi = [&](int w, int qh, int c) { return kOwnArea ? w * kArea + qh * 128 + c : (w * 8 + qh) * 128 + c; };
  auto mi = [&](int w, int qh) { return kOwnArea ? w * kArea + qh * 2 : (w * 8 + qh) * 2; };
  #pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float l = WarpSumOverGid(st.l[e]);
    const int qh = 2 * tig + e;
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
      #pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int ch = chan(i, r);
        osm[oi(warp, qh, ch)] = st.o[i][2 * r + e];
      }
    }
    if ((lane >> 2) == 0) {
      mlsm[mi(warp, qh) + 0] = st.m[e];
      mlsm[mi(warp, qh) + 1] = l;
    }
  }
  __syncthreads();
  if (kW == 8 && threadIdx.x == 0) MarkClock(p, kTlStates);
  const int t = threadIdx.x;  // channel
  float* part_o = static_cast<float*>(p.workspace);
  float* part_ml = reinterpret_cast<float*>(static_cast<uint8_t*>(p.workspace) + PartialOBytes(p));
  // The item's partial of query head qh, channel c, from the kW warps' states.
  auto partial = [&](int qh, int c) {
    float mx = -INFINITY;
    #pragma unroll
    for (int w = 0; w < kW; ++w) mx = fmaxf(mx, mlsm[mi(w, qh)]);
    float L = 0.f, O = 0.f;
    if (mx != -INFINITY) {
      #pragma unroll
      for (int w = 0; w < kW; ++w) {
        const float f = FinishExp2<kW>(mlsm[mi(w, qh)] - mx);
        L += f * mlsm[mi(w, qh) + 1];
        O += f * osm[oi(w, qh, c)];
      }
    }
    part_o[(size_t(item) * gqa + qh) * 128 + c] = L > 0.f ? FinishDiv<kW>(O, L) : 0.f;
    if (c == 0) {
      part_ml[(size_t(item) * gqa + qh) * 2 + 0] = mx;
      part_ml[(size_t(item) * gqa + qh) * 2 + 1] = L;
    }
  };
  if constexpr (kW == kWarps) {
    for (int qh = 0; qh < gqa; ++qh) partial(qh, t);
  } else {
    // More warps: the (head, channel) units spread over all threads.
    for (int u = t; u < gqa * 128; u += 32 * kW) partial(u >> 7, u & 127);
  }
  if (t == 0) MarkClock(p, kTlPartial);
  if (!p.fused_merge) return;
  // Arrival: the barrier orders every thread's partial writes before thread 0's release fence
  // and count (cumulativity; one fence per CTA instead of one per thread); the CTA that brings
  // the count to the pair's item count merges (and re-zeroes the counter for the next launch; no
  // other CTA of the pair touches it after its own arrival), after an acquire fence by thread 0
  // that the next barrier extends to its other threads.
  __syncthreads();
  // The flag lives in the (now idle) dynamic shared memory: a static __shared__ variable would
  // shift the dynamic area -- the K/V stages -- off its alignment (measured: BF16 pages 15%
  // slower, the INT2 kernel 3%).
  // With the pair's item range (the merge needs it: one L2 round trip fewer on its path).
  int* is_last = kOwnArea ? reinterpret_cast<int*>(smem + Int2StageArea<kW>())
                          : reinterpret_cast<int*>(mlsm + kW * 8 * 2);
  if (t == 0) {
    const int pair = it.seq * static_cast<int>(p.shape.num_kv_heads) + it.kv_head;
    const int n = i1 - i0;
    is_last[1] = i0;
    is_last[2] = i1;
    int last = 1;
    if (n > 1) {
      int* ctr = reinterpret_cast<int*>(static_cast<uint8_t*>(p.workspace) + PartialOBytes(p) +
                                        PartialMlBytes(p)) + pair;
      if constexpr (kW == kWarps) {
        __threadfence();
        last = atomicAdd(ctr, 1) == n - 1;
        if (last) {
          *ctr = 0;
          __threadfence();
        }
      } else {
        // One acquire-release atomic: the release orders the CTA's partial (every thread's
        // writes, through the barrier above) before the count, the acquire the other CTAs'
        // partials before the merge's loads. The reset needs no fence: the next launch is
        // ordered by the kernel boundary. (The 4-warp kernel keeps its two fences: its code is
        // unchanged since its last measurements.)
        int old;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(ctr) : "memory");
        last = old == n - 1;
        if (last) *ctr = 0;
      }
    }
    // Every CTA of the pair is past its queries: re-arm share_rotation's ticket for the next
    // launch.
    if (last) {
      int* tk = RotationTicket(p, pair);
      tk[0] = 0;
      tk[1] = 0;
    }
    is_last[0] = last;
  }
  __syncthreads();
  const bool merge = is_last[0] != 0;
  const int mi0 = is_last[1], mi1 = is_last[2];
  if (t == 0 && merge) MarkMeta(p, uint64_t{1} << 32);
  if (kW != kWarps && t == 0 && merge) MarkClock(p, kTlMerge);
  if (merge && (p.debug_flags & kDecodeDebugNoMerge) == 0) {
    __syncthreads();  // every thread has read the flag, which lies in the merge's staging area
    MergePairInCta<kW>(p, it.seq, it.kv_head, smem, mi0, mi1);
  }
}

// A pair whose only item has no slices (capture decoders): its GQA output rows 0 and lse -inf,
// the bits MergePairInCta writes for one empty partial (and its R_V product of zero rows).
template <int kW = kWarps>
__device__ void WriteEmptyPair(const DecodeParams& p, const DecodeWorkItem& it) {
  const int gqa = static_cast<int>(p.shape.gqa());
  const size_t qh0 = size_t(it.seq) * p.shape.num_q_heads + size_t(it.kv_head) * gqa;
  for (int i = threadIdx.x; i < gqa * 32; i += 32 * kW)
    reinterpret_cast<float4*>(p.out + qh0 * 128)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (p.lse != nullptr && threadIdx.x < gqa) p.lse[qh0 + threadIdx.x] = -INFINITY;
}

// The work item of launch slot `slot` (an index into the plan's order) and its index.
__device__ __forceinline__ DecodeWorkItem FetchItem(const DecodeParams& p, int slot, int* item) {
  *item = p.item_order[slot];
  return p.launch_items != nullptr ? p.launch_items[slot] : p.items[*item];
}

// Fills the per-slice page pointer / token info of the item (smem) for all threads.
template <int kW = kWarps>
__device__ void LoadSliceTable(const DecodeParams& p, const DecodeWorkItem& it, SliceTable tab) {
  const int spp = static_cast<int>(p.shape.slices_per_page());
  const int32_t p0 = it.page_entry;  // == seq_page_indptr[it.seq]
  for (int s = threadIdx.x; s < it.num_slices; s += 32 * kW) {
    const int gs = it.first_slice + s;
    const int32_t pid = p.table.seq_page_ids[p0 + gs / spp];
    const int tok0 = (gs % spp) * static_cast<int>(kSliceTokens);
    const int count = p.table.page_token_counts[pid];
    const int valid = max(0, min(static_cast<int>(kSliceTokens), count - tok0));
    tab.ptr[s] = p.table.page_ptrs[pid];
    tab.info[s] = (tok0 << 16) | valid;
  }
}

// The query rows of the item's GQA heads (gqa · 128 floats) start copying into shared memory
// qin as their own cp.async group (16 B per thread; the caller commits), so their load does not
// queue behind the first K/V copies. RotateQueries(..., q_staged >= 0) waits for it.
__device__ __forceinline__ void StageQueries(const DecodeParams& p, const DecodeWorkItem& it, float* qin) {
  const int gqa = static_cast<int>(p.shape.gqa());
  const float* q = p.q + (size_t(it.seq) * p.shape.num_q_heads + size_t(it.kv_head) * gqa) * 128;
  for (int i = threadIdx.x; i < gqa * 32; i += kThreads) CpAsync16(qin + 4 * i, q + 4 * i, true);
}

// Waits for StageQueries' copy group, the oldest, with `newer` (0 or 2) groups after it
// allowed to stay pending.
__device__ __forceinline__ void WaitStagedQueries(int newer) {
  if (newer >= 2) {
    asm volatile("cp.async.wait_group 2;\n" ::: "memory");
  } else {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  }
}

// The rotation proper for kHeads >= gqa heads (heads >= gqa are skipped): warp w takes input
// rows [32w, 32w+32), lane l output channels [4l, 4l+4); the R rows of a batch (16, or 8 for
// kHeads 8: registers) are loaded at once, the query rows read 4 at a time.
template <int kHeads>
__device__ __forceinline__ void RotateRows(const DecodeParams& p, const DecodeWorkItem& it,
                                           const float* qin, float* scratch, int warp_stride) {
  constexpr int kRows = kHeads > 4 ? 8 : 16;
  const int gqa = static_cast<int>(p.shape.gqa());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float4* r = reinterpret_cast<const float4*>(p.rot_k + size_t(it.kv_head) * 128 * 128 +
                                                    size_t(32 * warp) * 128) + lane;
  float4 acc[kHeads];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) acc[h] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
  for (int b = 0; b < 32 / kRows; ++b) {
    float4 rv[kRows];
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) rv[ii] = r[(kRows * b + ii) * 32];
#pragma unroll
    for (int j = 0; j < kRows / 4; ++j) {
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        if (h < gqa) {
          const float4 x =
              *reinterpret_cast<const float4*>(qin + h * 128 + 32 * warp + kRows * b + 4 * j);
          const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const float4 rr = rv[4 * j + u];
            acc[h].x = fmaf(xs[u], rr.x, acc[h].x);
            acc[h].y = fmaf(xs[u], rr.y, acc[h].y);
            acc[h].z = fmaf(xs[u], rr.z, acc[h].z);
            acc[h].w = fmaf(xs[u], rr.w, acc[h].w);
          }
        }
      }
    }
  }
#pragma unroll
  for (int h = 0; h < kHeads; ++h)
    if (h < gqa) reinterpret_cast<float4*>(scratch + warp * warp_stride + h * 128)[lane] = acc[h];
}

// q' = q · R_K[kv head] · softmax_scale · log2(e) for the item's GQA query heads, into shared
// memory (qs, [gqa][128]). qin ([gqa][128], may be qs) is shared-memory scratch (with
// q_staged >= 0, StageQueries' destination, its copy group committed and followed by q_staged
// (0 or 2) newer groups that may stay pending), and warp w's partial sums go to
// scratch + w * warp_stride ([8][128] floats each, so the regions may lie in stages whose copies
// have not been issued yet). All of a thread's R loads of one half are in flight at once (one
// L2 round trip instead of 16 dependent ones); the rotation is compiled for the next power of two
// >= gqa (no issue slots for absent heads); the four warps' partial sums are added through
// `scratch`. All threads of the CTA take part.
__device__ void RotateQueries(const DecodeParams& p, const DecodeWorkItem& it, float* qin,
                              float* qs, float* scratch, int warp_stride, int q_staged = -1) {
  const int gqa = static_cast<int>(p.shape.gqa());
  const int t = threadIdx.x;
  if (q_staged >= 0) {
    WaitStagedQueries(q_staged);
  } else {
    const float* q = p.q + (size_t(it.seq) * p.shape.num_q_heads + size_t(it.kv_head) * gqa) * 128;
    for (int i = t; i < gqa * 128; i += kThreads) qin[i] = q[i];
  }
  __syncthreads();
  const float scale = (p.softmax_scale > 0 ? p.softmax_scale : 0.08838834764831845f) * kLog2e;
  if (p.rot_k == nullptr) {
#pragma unroll
    for (int h = 0; h < 8; ++h)
      if (h < gqa) qs[h * 128 + t] = qin[h * 128 + t] * scale;
    __syncthreads();
    return;
  }
  if (gqa <= 1) {
    RotateRows<1>(p, it, qin, scratch, warp_stride);
  } else if (gqa <= 2) {
    RotateRows<2>(p, it, qin, scratch, warp_stride);
  } else if (gqa <= 4) {
    RotateRows<4>(p, it, qin, scratch, warp_stride);
  } else {
    RotateRows<8>(p, it, qin, scratch, warp_stride);
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 8; ++h) {
    if (h < gqa) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += scratch[w * warp_stride + h * 128 + t];
      qs[h * 128 + t] = v * scale;
    }
  }
  __syncthreads();
}

// The CTA's rotated queries into qs ([gqa][128]): with rotate_in_cta, RotateQueries (same
// arguments), or with share_rotation (ticket >= 0, CtaTicket's) the CTA holding ticket 0 of its
// pair rotates and publishes them, the others wait for that and load them; otherwise the
// rotation kernel's output in the workspace, after waiting for that kernel (the INT2 kernel is
// launched as its programmatic dependent, so everything before this call -- item, slice table,
// first copies -- overlaps it).
__device__ void CtaQueries(const DecodeParams& p, const DecodeWorkItem& it, float* qin, float* qs,
                           float* scratch, int warp_stride, int q_staged = -1, int ticket = -1) {
  const int gqa = static_cast<int>(p.shape.gqa());
  float* pub = RotatedQueries(p) + (size_t(it.seq) * p.shape.num_q_heads + size_t(it.kv_head) * gqa) * 128;
  if (p.rotate_in_cta && ticket <= 0) {
    RotateQueries(p, it, qin, qs, scratch, warp_stride, q_staged);
    if (ticket == 0) {
      for (int i = threadIdx.x; i < gqa * 32; i += kThreads)
        __stcg(reinterpret_cast<float4*>(pub) + i, reinterpret_cast<const float4*>(qs)[i]);
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        int* flag = RotationTicket(p, it.seq * static_cast<int>(p.shape.num_kv_heads) + it.kv_head) + 1;
        asm volatile("st.release.gpu.global.b32 [%0], 1;" ::"l"(flag) : "memory");
      }
    }
    return;
  }
  if (p.rotate_in_cta) {
    // A later CTA of the pair: its staged query copy must land before the area is reused.
    if (q_staged >= 0) WaitStagedQueries(q_staged);
    if (threadIdx.x == 0) {
      const int* flag = RotationTicket(p, it.seq * static_cast<int>(p.shape.num_kv_heads) + it.kv_head) + 1;
      int v = 0;
      while (true) {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
        if (v != 0) break;
        __nanosleep(32);
      }
    }
    __syncthreads();
  } else {
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  for (int i = threadIdx.x; i < gqa * 32; i += kThreads)
    reinterpret_cast<float4*>(qs)[i] = __ldcg(reinterpret_cast<const float4*>(pub) + i);
  __syncthreads();
}

// share_rotation: the first item of each (seq, kv head) asks L2 for the pair's R_K (64 KiB) at
// its entry, so the rotating CTA's loads of it do not queue behind the first K/V copies.
__device__ __forceinline__ void PrefetchSharedRotation(const DecodeParams& p, const DecodeWorkItem& it,
                                                       int item) {
  if (!p.share_rotation || !p.rotate_in_cta || p.rot_k == nullptr) return;
  if (item != p.item_indptr[it.seq * static_cast<int>(p.shape.num_kv_heads) + it.kv_head]) return;
  const uint8_t* r = reinterpret_cast<const uint8_t*>(p.rot_k + size_t(it.kv_head) * 128 * 128);
  for (int i = threadIdx.x; i < 512; i += kThreads) asm volatile("prefetch.global.L2 [%0];" ::"l"(r + 128 * i));
}

// share_rotation: thread 0 of an INT2 item's CTA takes its pair's ticket (the caller stores it
// at kTicketSmemOffset once other loads are in flight); -1 when the rotation is not shared.
__device__ __forceinline__ int TakeRotationTicket(const DecodeParams& p, const DecodeWorkItem& it) {
  if (threadIdx.x != 0 || !p.share_rotation || !p.rotate_in_cta || p.rot_k == nullptr) return -1;
  return atomicAdd(RotationTicket(p, it.seq * static_cast<int>(p.shape.num_kv_heads) + it.kv_head), 1);
}

template <typename K>
bool SetSmem(K kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
}

}  // namespace
}  // namespace oscarkv::cuda
