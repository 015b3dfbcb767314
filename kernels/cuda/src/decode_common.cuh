// Shared pieces of the paged decode kernels (decode_int2.cu, decode_attention.cu): constants and
// shared-memory budget, the per-warp online-softmax state and the merge of the 4 warps' states,
// the slice table, and the in-CTA query rotation. Internal to kernels/cuda/src.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "device_util.cuh"
#include "oscarkv/cuda/decode_attention.h"

namespace oscarkv::cuda {

// Enqueues the INT2 kernel (p.variant) over the plan's first `blocks` items (decode_int2.cu).
void LaunchDecodeInt2Kernels(const DecodeParams& p, int blocks, cudaStream_t stream);

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
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Per-register bit offsets of the 8 codes a LOP3 extracts from one 16-bit half: codes 0..3 of
// byte 0 (bits 0,2,4,6), code 0 of byte 1 (bit 8), then codes 1..3 of byte 1 after a shift by
// 8 (bits 2,4,6).
__host__ __device__ constexpr int CodeShift(int r) { return r < 4 ? 2 * r : (r == 4 ? 8 : 2 * (r - 4)); }

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

// fused_merge: the last CTA of (seq, kv head) merges the partials of its items for all GQA
// heads: warp w takes heads w, w+4; lane l channels [4l, 4l+4) of a head. Items are taken 32 at
// a time (lane i loads item i's (max, sum) once), with an online rescale between chunks, and
// 16 float4 partial loads in flight (the first 16 of a chunk with the (max, sum) loads), the weights 2^(m_i - M)·l_i broadcast by shuffles. Then
// the optional R_Vᵀ product (warp w: outputs w, w+4, ... of every head, one R row load for all
// heads). Partials are read from L2 (ld.global.cg): other CTAs wrote them.
__device__ void MergePairInCta(const DecodeParams& p, int seq, int h, float* os) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gqa = static_cast<int>(p.shape.gqa());
  const float* part_o = static_cast<const float*>(p.workspace);
  const float* part_ml =
      reinterpret_cast<const float*>(static_cast<const uint8_t*>(p.workspace) + PartialOBytes(p));
  const int pair = seq * static_cast<int>(p.shape.num_kv_heads) + h;
  const int i0 = p.item_indptr[pair], i1 = p.item_indptr[pair + 1];
  const int qh0 = seq * static_cast<int>(p.shape.num_q_heads) + h * gqa;
  const bool unrot = p.unrotate_output && p.rot_v != nullptr;
  for (int j = warp; j < gqa; j += kWarps) {
    float M = -INFINITY, L = 0.f;
    float4 O = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 v[16];
    // Loads of partials c0 + k .. c0 + k + 15 (zero past n), and their weighted sum.
    auto load = [&](int c0, int k, int n) {
#pragma unroll
      for (int u = 0; u < 16; ++u) {
        v[u] = k + u < n ? __ldcg(reinterpret_cast<const float4*>(
                               part_o + (size_t(c0 + k + u) * gqa + j) * 128) + lane)
                         : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    };
    auto accumulate = [&](int k, float w) {
#pragma unroll
      for (int u = 0; u < 16; ++u) {
        const float wu = __shfl_sync(0xffffffffu, w, (k + u) & 31);
        O.x = fmaf(wu, v[u].x, O.x);
        O.y = fmaf(wu, v[u].y, O.y);
        O.z = fmaf(wu, v[u].z, O.z);
        O.w = fmaf(wu, v[u].w, O.w);
      }
    };
    for (int c0 = i0; c0 < i1; c0 += 32) {
      const int i = c0 + lane;
      const int n = min(32, i1 - c0);
      float2 ml = make_float2(-INFINITY, 0.f);
      if (i < i1) ml = __ldcg(reinterpret_cast<const float2*>(part_ml) + size_t(i) * gqa + j);
      // The first 16 partials do not depend on the weights: their loads share the round trip
      // of the (max, sum) loads.
      load(c0, 0, n);
      const float m = ml.y > 0.f ? ml.x : -INFINITY, l = ml.y > 0.f ? ml.y : 0.f;
      float cm = m;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, off));
      const float mn = fmaxf(M, cm);
      if (mn == -INFINITY) continue;  // no tokens so far (warp-uniform)
      const float f = exp2f(M - mn);  // 0 while M is -inf
      L *= f;
      O.x *= f;
      O.y *= f;
      O.z *= f;
      O.w *= f;
      M = mn;
      const float w = l > 0.f ? exp2f(m - mn) * l : 0.f;
      L += w;
      accumulate(0, w);
      for (int k = 16; k < n; k += 16) {
        load(c0, k, n);
        accumulate(k, w);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) L += __shfl_xor_sync(0xffffffffu, L, off);
    const float inv = L > 0.f ? 1.f / L : 0.f;
    const float4 o = make_float4(O.x * inv, O.y * inv, O.z * inv, O.w * inv);
    if (lane == 0 && p.lse != nullptr) p.lse[qh0 + j] = L > 0.f ? (M + log2f(L)) * kLn2 : -INFINITY;
    if (unrot) {
      reinterpret_cast<float4*>(os + j * 128)[lane] = o;
    } else {
      reinterpret_cast<float4*>(p.out + size_t(qh0 + j) * 128)[lane] = o;
    }
  }
  if (!unrot) return;
  __syncthreads();
  // out[j][i] = Σ_k o[j][k] · R_V[i][k].
  const float* r = p.rot_v + size_t(h) * 128 * 128;
  for (int i = warp; i < 128; i += kWarps) {
    const float4 rv = reinterpret_cast<const float4*>(r + size_t(i) * 128)[lane];
    for (int j = 0; j < gqa; ++j) {
      const float4 ov = reinterpret_cast<const float4*>(os + j * 128)[lane];
      float s = ov.x * rv.x + ov.y * rv.y + ov.z * rv.z + ov.w * rv.w;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) p.out[size_t(qh0 + j) * 128 + i] = s;
    }
  }
}

// Merges the 4 warps' states (written to smem by each warp) and writes the item's partial;
// with fused_merge, the last CTA of the item's (seq, kv head) then merges the pair.
// chan(i, r) is the channel of accumulator tile i, row half r (0: c0/c1, 1: c2/c3).
template <typename ChanFn>
__device__ void FinishItem(const DecodeParams& p, int item, const DecodeWorkItem& it,
                           WarpState& st, uint8_t* smem, ChanFn chan) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tig = lane & 3;
  const int gqa = static_cast<int>(p.shape.gqa());
  float* osm = reinterpret_cast<float*>(smem);                   // [warp][8][128]
  float* mlsm = osm + kWarps * 8 * 128;                          // [warp][8][2]
  #pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float l = WarpSumOverGid(st.l[e]);
    const int qh = 2 * tig + e;
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
      #pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int ch = chan(i, r);
        osm[(warp * 8 + qh) * 128 + ch] = st.o[i][2 * r + e];
      }
    }
    if ((lane >> 2) == 0) {
      mlsm[(warp * 8 + qh) * 2 + 0] = st.m[e];
      mlsm[(warp * 8 + qh) * 2 + 1] = l;
    }
  }
  __syncthreads();
  const int t = threadIdx.x;  // channel
  float* part_o = static_cast<float*>(p.workspace);
  float* part_ml = reinterpret_cast<float*>(static_cast<uint8_t*>(p.workspace) + PartialOBytes(p));
  for (int qh = 0; qh < gqa; ++qh) {
    float mx = -INFINITY;
    #pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, mlsm[(w * 8 + qh) * 2]);
    float L = 0.f, O = 0.f;
    if (mx != -INFINITY) {
      #pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(mlsm[(w * 8 + qh) * 2] - mx);
        L += f * mlsm[(w * 8 + qh) * 2 + 1];
        O += f * osm[(w * 8 + qh) * 128 + t];
      }
    }
    part_o[(size_t(item) * gqa + qh) * 128 + t] = L > 0.f ? O / L : 0.f;
    if (t == 0) {
      part_ml[(size_t(item) * gqa + qh) * 2 + 0] = mx;
      part_ml[(size_t(item) * gqa + qh) * 2 + 1] = L;
    }
  }
  if (!p.fused_merge) return;
  // Arrival: every thread's partial writes are made visible device-wide before thread 0 counts
  // the item; the CTA that brings the count to the pair's item count merges (and re-zeroes the
  // counter for the next launch; no other CTA of the pair touches it after its own arrival).
  __threadfence();
  __syncthreads();
  // The flag lives in the (now idle) dynamic shared memory: a static __shared__ variable would
  // shift the dynamic area -- the K/V stages -- off its alignment (measured: BF16 pages 15%
  // slower, the INT2 kernel 3%).
  int& is_last = *reinterpret_cast<int*>(mlsm + kWarps * 8 * 2);
  if (t == 0) {
    const int pair = it.seq * static_cast<int>(p.shape.num_kv_heads) + it.kv_head;
    const int n = p.item_indptr[pair + 1] - p.item_indptr[pair];
    int last = 1;
    if (n > 1) {
      int* ctr = reinterpret_cast<int*>(static_cast<uint8_t*>(p.workspace) + PartialOBytes(p) +
                                        PartialMlBytes(p)) + pair;
      last = atomicAdd(ctr, 1) == n - 1;
      if (last) *ctr = 0;
    }
    is_last = last;
  }
  __syncthreads();
  if (is_last) {
    __threadfence();
    MergePairInCta(p, it.seq, it.kv_head, osm);  // osm is free again (read before the barrier)
  }
}

// The work item of launch slot `slot` (an index into the plan's order) and its index.
__device__ __forceinline__ DecodeWorkItem FetchItem(const DecodeParams& p, int slot, int* item) {
  *item = p.item_order[slot];
  return p.launch_items != nullptr ? p.launch_items[slot] : p.items[*item];
}

// Fills the per-slice page pointer / token info of the item (smem) for all threads.
__device__ void LoadSliceTable(const DecodeParams& p, const DecodeWorkItem& it, SliceTable tab) {
  const int spp = static_cast<int>(p.shape.slices_per_page());
  const int32_t p0 = it.page_entry;  // == seq_page_indptr[it.seq]
  for (int s = threadIdx.x; s < it.num_slices; s += kThreads) {
    const int gs = it.first_slice + s;
    const int32_t pid = p.table.seq_page_ids[p0 + gs / spp];
    const int tok0 = (gs % spp) * static_cast<int>(kSliceTokens);
    const int count = p.table.page_token_counts[pid];
    const int valid = max(0, min(static_cast<int>(kSliceTokens), count - tok0));
    tab.ptr[s] = p.table.page_ptrs[pid];
    tab.info[s] = (tok0 << 16) | valid;
  }
}

// q' = q · R_K[kv head] · softmax_scale · log2(e) for the item's GQA query heads, into shared
// memory (qs, [gqa][128]). qin ([gqa][128], may be qs) is shared-memory scratch, and warp w's partial sums
// go to scratch + w * warp_stride ([8][128] floats each, so the regions may lie in stages whose
// copies have not been issued yet). Warp w
// takes input rows [32w, 32w+32) and lane l output channels [4l, 4l+4), so all of a thread's R
// loads are in flight at once (one L2 round trip instead of 128 dependent ones); the four warps'
// partial sums are added through `scratch`. All threads of the CTA take part.
__device__ void RotateQueries(const DecodeParams& p, const DecodeWorkItem& it, float* qin,
                              float* qs, float* scratch, int warp_stride) {
  const int gqa = static_cast<int>(p.shape.gqa());
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const float* q = p.q + (size_t(it.seq) * p.shape.num_q_heads + size_t(it.kv_head) * gqa) * 128;
  for (int i = t; i < gqa * 128; i += kThreads) qin[i] = q[i];
  __syncthreads();
  const float scale = (p.softmax_scale > 0 ? p.softmax_scale : 0.08838834764831845f) * kLog2e;
  if (p.rot_k == nullptr) {
#pragma unroll
    for (int h = 0; h < 8; ++h)
      if (h < gqa) qs[h * 128 + t] = qin[h * 128 + t] * scale;
    __syncthreads();
    return;
  }
  const float4* r = reinterpret_cast<const float4*>(p.rot_k + size_t(it.kv_head) * 128 * 128 +
                                                    size_t(32 * warp) * 128) + lane;
  float4 acc[8];
#pragma unroll
  for (int h = 0; h < 8; ++h) acc[h] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float4 rv[16];
#pragma unroll
    for (int ii = 0; ii < 16; ++ii) rv[ii] = r[(16 * half + ii) * 32];
#pragma unroll
    for (int ii = 0; ii < 16; ++ii) {
      const int i = 32 * warp + 16 * half + ii;
#pragma unroll
      for (int h = 0; h < 8; ++h) {
        if (h < gqa) {
          const float x = qin[h * 128 + i];
          acc[h].x = fmaf(x, rv[ii].x, acc[h].x);
          acc[h].y = fmaf(x, rv[ii].y, acc[h].y);
          acc[h].z = fmaf(x, rv[ii].z, acc[h].z);
          acc[h].w = fmaf(x, rv[ii].w, acc[h].w);
        }
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 8; ++h)
    if (h < gqa) reinterpret_cast<float4*>(scratch + warp * warp_stride + h * 128)[lane] = acc[h];
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
// arguments); otherwise the rotation kernel's output in the workspace, after waiting for that
// kernel (the INT2 kernel is launched as its programmatic dependent, so everything before this
// call -- item, slice table, first copies -- overlaps it).
__device__ void CtaQueries(const DecodeParams& p, const DecodeWorkItem& it, float* qin, float* qs,
                           float* scratch, int warp_stride) {
  if (p.rotate_in_cta) {
    RotateQueries(p, it, qin, qs, scratch, warp_stride);
    return;
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int gqa = static_cast<int>(p.shape.gqa());
  const float4* src = reinterpret_cast<const float4*>(
      RotatedQueries(p) + (size_t(it.seq) * p.shape.num_q_heads + size_t(it.kv_head) * gqa) * 128);
  for (int i = threadIdx.x; i < gqa * 32; i += kThreads) reinterpret_cast<float4*>(qs)[i] = __ldcg(src + i);
  __syncthreads();
}

template <typename K>
bool SetSmem(K kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
}

}  // namespace
}  // namespace oscarkv::cuda
