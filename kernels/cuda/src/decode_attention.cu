// Mixed-precision paged decode attention: query rotation, split-KV attention over INT2 and BF16
// page slices on tensor cores, and the log-sum-exp merge.
//
// Work decomposition: one CTA (4 warps) per work item = (sequence, KV head, run of 64-token
// slices of one kind). K/V bytes of the item's slices stream through shared memory with
// cp.async in a multi-stage ring; each warp keeps its own online-softmax state for all GQA
// query heads of the KV head (the n = 8 columns of the mma tiles), and the 4 warps' states are
// merged before the item's partial result is written.
//
// INT2 in registers, no dequantization pass: a code c is placed in an fp16 lane as the bit
// pattern 0x6400 | (c << k), i.e. the value 1024 + c·2^k, with one LOP3 per two codes (k is
// the code's bit offset inside its 16-bit half, 0..8, so no shift is needed for most codes).
// The offset and the 2^k factor are removed in fp32 afterwards:
//   scores  q·x̂ = scale·(Σ q_i 2^-k_i (1024 + 2^k_i c_i) − 1024·Σ q_i 2^-k_i) + min·Σ q_i
//   values  Σ_t p_t x̂_t = 2^-k·(Σ_t W_t (1024 + 2^k c_t) − 1024·Σ_t W_t) + Σ_t p_t·min_t,
//           W_t = fp16(p_t·scale_t),
// where the tensor cores compute the first sums; the score offset is removed by starting the
// accumulators at −1024·Σ q·2^-k, and 1024·Σ W comes from one more mma with every code 0. Channel orders inside the mma tiles are
// permuted so each lane's operands come from contiguous bytes; the query fragments and the
// output mapping use the same permutation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "device_util.cuh"
#include "oscarkv/cuda/decode_attention.h"

namespace oscarkv::cuda {
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

// Merges the 4 warps' states (written to smem by each warp) and writes the item's partial.
// chan(i, r) is the channel of accumulator tile i, row half r (0: c0/c1, 1: c2/c3).
template <typename ChanFn>
__device__ void FinishItem(const DecodeParams& p, int item, WarpState& st, uint8_t* smem,
                           ChanFn chan) {
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
  const size_t qrot_bytes = 0;
  float* part_o = reinterpret_cast<float*>(static_cast<uint8_t*>(p.workspace) + qrot_bytes);
  const size_t po_bytes = (sizeof(float) * size_t(p.num_items) * gqa * 128 + 255) / 256 * 256;
  float* part_ml = reinterpret_cast<float*>(static_cast<uint8_t*>(p.workspace) + qrot_bytes + po_bytes);
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
}

// Fills the per-slice page pointer / token info of the item (smem) for all threads.
__device__ void LoadSliceTable(const DecodeParams& p, const DecodeWorkItem& it, SliceTable tab) {
  const int spp = static_cast<int>(p.shape.slices_per_page());
  const int32_t p0 = p.table.seq_page_indptr[it.seq];
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
// memory (qs, [gqa][128]). qin ([gqa][128]) and scratch (16 KiB) are shared-memory scratch. Warp w
// takes input rows [32w, 32w+32) and lane l output channels [4l, 4l+4), so all of a thread's R
// loads are in flight at once (one L2 round trip instead of 128 dependent ones); the four warps'
// partial sums are added through `scratch`. All threads of the CTA take part.
__device__ void RotateQueries(const DecodeParams& p, const DecodeWorkItem& it, float* qin,
                              float* qs, float* scratch) {
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
    if (h < gqa) reinterpret_cast<float4*>(scratch + (warp * 8 + h) * 128)[lane] = acc[h];
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 8; ++h) {
    if (h < gqa) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += scratch[(w * 8 + h) * 128 + t];
      qs[h * 128 + t] = v * scale;
    }
  }
  __syncthreads();
}

// ---------------------------------------------------------------------------------------------
// INT2 slices. Each warp streams its own slices (w, w+4, ...) through a private 3-stage
// cp.async ring, so warps never wait for each other.

template <int G>
struct Int2Layout {
  static constexpr int NG = 128 / G;
  static constexpr int kCodes = 64 * 32;          // 64 rows x 32 bytes
  static constexpr int kParams = 64 * NG * 4;     // (scale, min) fp16 pairs
  static constexpr int kHalf = kCodes + kParams;  // K part, then V part
  // Byte offset inside a code row of word v (0, 1) of lane tig for the score product.
  __device__ static int KWordByte(int tig, int v) { return G == 128 ? 8 * tig + 4 * v : 16 * v + 4 * tig; }
};
constexpr int kInt2WarpStages = 3;

// r = (w & mask) | magic in one LOP3 (the magic lives in a register).
template <uint32_t kMask>
__device__ __forceinline__ uint32_t AndOr(uint32_t w, uint32_t magic) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "n"(kMask), "r"(magic));
  return r;
}
// Unpacks a 32-bit word whose two 16-bit halves each hold 8 codes (channel c of a half at bits
// 2c..2c+1) into 8 fp16x2 registers: r[c] = 1024 + 2^CodeShift(c)·code_c for both halves.
// Register r (0..7) of UnpackCodesM, from the word and the word >> 8 (r is a constant).
__device__ __forceinline__ uint32_t CodeReg(int r, uint32_t w, uint32_t w8, uint32_t magic) {
  switch (r) {
    case 0: return AndOr<0x00030003u>(w, magic);
    case 1: return AndOr<0x000C000Cu>(w, magic);
    case 2: return AndOr<0x00300030u>(w, magic);
    case 3: return AndOr<0x00C000C0u>(w, magic);
    case 4: return AndOr<0x03000300u>(w, magic);
    case 5: return AndOr<0x000C000Cu>(w8, magic);
    case 6: return AndOr<0x00300030u>(w8, magic);
    default: return AndOr<0x00C000C0u>(w8, magic);
  }
}
__device__ __forceinline__ void UnpackCodesM(uint32_t w, uint32_t magic, uint32_t (&r)[8]) {
  const uint32_t w8 = w >> 8;
  r[0] = AndOr<0x00030003u>(w, magic);
  r[1] = AndOr<0x000C000Cu>(w, magic);
  r[2] = AndOr<0x00300030u>(w, magic);
  r[3] = AndOr<0x00C000C0u>(w, magic);
  r[4] = AndOr<0x03000300u>(w, magic);
  r[5] = AndOr<0x000C000Cu>(w8, magic);
  r[6] = AndOr<0x00300030u>(w8, magic);
  r[7] = AndOr<0x00C000C0u>(w8, magic);
}

// kPack (DecodeVariant::kPackedHeads, GQA <= 4): see decode_attention.h.
template <int G, bool kPack>
__device__ void Int2Item(const DecodeParams& p, int item, const DecodeWorkItem& it, uint8_t* smem,
                         SliceTable tab) {
  using Lay = Int2Layout<G>;
  constexpr int NG = Lay::NG;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const DecodeShape& sh = p.shape;
  const int gqa = static_cast<int>(sh.gqa());
  const PageGeometry geo = sh.geometry(PageKind::kInt2);
  const size_t seg_k = geo.segment_offset(sh.layer, 0, it.kv_head);
  const size_t seg_v = geo.segment_offset(sh.layer, 1, it.kv_head);
  const int codes_bytes = static_cast<int>(geo.codes_bytes());
  uint32_t magic;
  asm volatile("mov.b32 %0, 0x64006400;" : "=r"(magic));

  WarpState st;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) st.o[i][j] = 0.f;
  float sw[NG][4];  // 1024·Σ W per (group, accumulator column) from the extra "offset" mma
  float pm[2][NG];  // Σ p·min per (query head, group), lane partials
#pragma unroll
  for (int g = 0; g < NG; ++g)
#pragma unroll
    for (int j = 0; j < 4; ++j) sw[g][j] = 0.f;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    st.m[e] = -INFINITY;
    st.l[e] = 0.f;
#pragma unroll
    for (int g = 0; g < NG; ++g) pm[e][g] = 0.f;
  }
  __half* wx = reinterpret_cast<__half*>(smem + kInt2StageArea + warp * kWarpXchg);
  uint8_t* ring = smem + warp * (kInt2WarpStages * kInt2Slot);

  const int n = it.num_slices;
  const int mine = n > warp ? (n - warp + kWarps - 1) / kWarps : 0;  // slices of this warp
  const size_t v_minus_k = seg_v - seg_k;
  const uint32_t ring_addr = SmemAddr(ring) + lane * 16;
  // Copies slice k of this warp into stage `stage`: the K codes (2 KiB contiguous), K params,
  // V codes, V params. Chunks past the valid tokens are zero-filled (src-size 0) and not read.
  auto issue = [&](int k, int stage) {
    const int sl = warp + kWarps * k;
    const int info = tab.info[sl], tok0 = info >> 16, valid = info & 0xffff;
    const uint8_t* pk = tab.ptr[sl] + seg_k;
    const uint8_t* ck = pk + tok0 * 32 + lane * 16;
    const uint8_t* cv = ck + v_minus_k;
    const uint32_t d = ring_addr + stage * kInt2Slot;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int bytes = ((lane >> 1) + 16 * i) < valid ? 16 : 0;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + 512 * i),
                   "l"(ck + 512 * i), "r"(bytes));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + Lay::kHalf + 512 * i),
                   "l"(cv + 512 * i), "r"(bytes));
    }
    if (lane < 16 * NG) {  // params: 4·NG bytes per token, 16/(4·NG) tokens per chunk
      const int bytes = lane * 4 / NG < valid ? 16 : 0;
      const uint8_t* pp = pk + codes_bytes + tok0 * 4 * NG + lane * 16;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + Lay::kCodes),
                   "l"(pp), "r"(bytes));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + Lay::kHalf + Lay::kCodes),
                   "l"(pp + v_minus_k), "r"(bytes));
    }
  };

  // Query fragments (B operand of the score product): lane (gid, tig) holds query head gid.
  float* qs = reinterpret_cast<float*>(smem + kInt2StageArea);
  RotateQueries(p, it, qs + 8 * 128, qs, reinterpret_cast<float*>(smem));  // ring not in use yet
  // Start the first copies, then build the query fragments while they are in flight.
#pragma unroll
  for (int k = 0; k < kInt2WarpStages - 1; ++k) {
    if (k < mine) issue(k, k);
    CpAsyncCommit();
  }
  const float* qrot = qs;
  uint32_t qhi[8][2], qlo[8][2];
  float q0[NG], q1[NG];  // Σ q (true) and Σ q·2^-k (as used), this lane's channels
#pragma unroll
  for (int g = 0; g < NG; ++g) q0[g] = q1[g] = 0.f;
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const int v = s >> 2, u = s & 3;
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int r = 2 * u + b;
      const int k = CodeShift(r);
      const float inv = 1.0f / static_cast<float>(1 << k);
      const int byte_lo = (r < 4 ? 0 : 1), idx = r & 3;
      const int base = Lay::KWordByte(tig, v);
      const int ch_lo = 4 * (base + byte_lo) + idx, ch_hi = 4 * (base + byte_lo + 2) + idx;
      const float x_lo = gid < gqa ? qrot[gid * 128 + ch_lo] * inv : 0.f;
      const float x_hi = gid < gqa ? qrot[gid * 128 + ch_hi] * inv : 0.f;
      const __half h_lo = __float2half_rn(x_lo), h_hi = __float2half_rn(x_hi);
      __half l_lo = __float2half_rn(0.f), l_hi = __float2half_rn(0.f);
      if (p.precise_query) {
        l_lo = __float2half_rn(x_lo - __half2float(h_lo));
        l_hi = __float2half_rn(x_hi - __half2float(h_hi));
      }
      qhi[s][b] = PackHalf2(h_lo, h_hi);
      qlo[s][b] = PackHalf2(l_lo, l_hi);
      const float used = __half2float(h_lo) + __half2float(l_lo) + __half2float(h_hi) +
                         __half2float(l_hi);
      const int g = (G == 64) ? v : 0;
      q1[g] += used;
      q0[g] += used * static_cast<float>(1 << k);
    }
  }
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    q0[g] += __shfl_xor_sync(0xffffffffu, q0[g], 1);
    q0[g] += __shfl_xor_sync(0xffffffffu, q0[g], 2);
    q1[g] += __shfl_xor_sync(0xffffffffu, q1[g], 1);
    q1[g] += __shfl_xor_sync(0xffffffffu, q1[g], 2);
  }
  // For this lane's accumulator columns (query heads 2·tig, 2·tig+1): Σ q per group, and the
  // accumulator start value −1024·Σ q·2^-k that removes the code offset inside the mma.
  float Q0[2][NG], Cinit[2][NG];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      Q0[e][g] = __shfl_sync(0xffffffffu, q0[g], (2 * tig + e) * 4);
      Cinit[e][g] = -1024.f * __shfl_sync(0xffffffffu, q1[g], (2 * tig + e) * 4);
    }
  }
  __syncthreads();  // the query area becomes the W exchange
  if (kPack) {
    // Rows of query heads 4..7 are never written in packed mode: zero them once (the value
    // product reads them as padding columns).
    for (int i = lane; i < NG * 4 * kWStride; i += 32) {
      const int g = i / (4 * kWStride), rem = i % (4 * kWStride);
      wx[(g * 8 + 4) * kWStride + rem] = __float2half_rn(0.f);
    }
    __syncwarp();
  }

  int stage_c = 0;                         // stage of the slice computed next
  int stage_i = kInt2WarpStages - 1;       // stage the next issue writes
  for (int k = 0; k < mine; ++k) {
    CpAsyncWait<kInt2WarpStages - 2>();
    __syncwarp();
    if (k + kInt2WarpStages - 1 < mine) issue(k + kInt2WarpStages - 1, stage_i);
    CpAsyncCommit();
    stage_i = stage_i + 1 == kInt2WarpStages ? 0 : stage_i + 1;
    const int sl = warp + kWarps * k;
    const uint8_t* slot = ring + stage_c * kInt2Slot;
    stage_c = stage_c + 1 == kInt2WarpStages ? 0 : stage_c + 1;
    const uint8_t* kc = slot;
    const uint8_t* kp = slot + Lay::kCodes;
    const uint8_t* vc = slot + Lay::kHalf;
    const uint8_t* vp = vc + Lay::kCodes;
    const int valid = tab.info[sl] & 0xffff;

    // Scores for the 64 tokens: sc[mt][c] (c: row half r = c/2, head e = c%2). The k-step
    // loop is outside the m-tile loop so the four accumulator chains interleave.
    float sc[4][4];
    {
      float acc[4][NG][4];
      uint32_t wd[4][2][2], w8[4][2][2];  // [m-tile][row gid / gid+8][word v], and >> 8
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int g = 0; g < NG; ++g) {
          acc[mt][g][0] = acc[mt][g][2] = Cinit[0][g];
          acc[mt][g][1] = acc[mt][g][3] = Cinit[1][g];
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint8_t* row = kc + (mt * 16 + gid + 8 * r) * 32;
          if (G == 128) {  // both words in one 8-byte load (no bank conflict)
            const uint2 w = *reinterpret_cast<const uint2*>(row + 8 * tig);
            wd[mt][r][0] = w.x;
            wd[mt][r][1] = w.y;
          } else {
#pragma unroll
            for (int v = 0; v < 2; ++v) wd[mt][r][v] = *reinterpret_cast<const uint32_t*>(row + Lay::KWordByte(tig, v));
          }
#pragma unroll
          for (int v = 0; v < 2; ++v) w8[mt][r][v] = wd[mt][r][v] >> 8;
        }
      }
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int g = (G == 64) ? v : 0;
#pragma unroll
        for (int uu = 0; uu < 4; ++uu) {
          const int s = 4 * v + uu;
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            uint32_t a[2][2];  // [row][even/odd register]
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              a[r][0] = CodeReg(2 * uu, wd[mt][r][v], w8[mt][r][v], magic);
              a[r][1] = CodeReg(2 * uu + 1, wd[mt][r][v], w8[mt][r][v], magic);
            }
            MmaF16(acc[mt][g], a[0][0], a[1][0], a[0][1], a[1][1], qhi[s][0], qhi[s][1]);
            if (p.precise_query) {
              MmaF16(acc[mt][g], a[0][0], a[1][0], a[0][1], a[1][1], qlo[s][0], qlo[s][1]);
            }
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int t = mt * 16 + gid + 8 * r;
          float sv[2] = {0.f, 0.f};
#pragma unroll
          for (int g = 0; g < NG; ++g) {
            const float2 sm = __half22float2(*reinterpret_cast<const __half2*>(kp + (t * NG + g) * 4));
#pragma unroll
            for (int e = 0; e < 2; ++e) sv[e] += fmaf(sm.x, acc[mt][g][2 * r + e], sm.y * Q0[e][g]);
          }
#pragma unroll
          for (int e = 0; e < 2; ++e) sc[mt][2 * r + e] = sv[e];
        }
      }
    }
    if (valid < static_cast<int>(kSliceTokens)) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (mt * 16 + gid + 8 * (c >> 1) >= valid) sc[mt][c] = -INFINITY;
    }
    // Packed mode: lanes tig 2, 3 (padding heads) take the scores of the odd m-tiles from lanes
    // tig 0, 1; lane (gid, tig) then owns tiles mt = 2j + (tig >> 1), heads 2·(tig & 1) + e.
    constexpr int NT = kPack ? 2 : 4;
    float ps[NT][4];
    if (kPack) {
      const bool upper = tig >= 2;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float other = __shfl_xor_sync(0xffffffffu, sc[2 * j + 1][c], 2);
          ps[j][c] = upper ? other : sc[2 * j][c];
        }
    } else {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) ps[j][c] = sc[j][c];
    }
    // Online softmax over the slice; rescale only when a running max grows.
    float cm[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float x = fmaxf(ps[0][e], ps[0][2 + e]);
#pragma unroll
      for (int j = 1; j < NT; ++j) x = fmaxf(x, fmaxf(ps[j][e], ps[j][2 + e]));
      cm[e] = WarpMaxOverGid(x);
      if (kPack) cm[e] = fmaxf(cm[e], __shfl_xor_sync(0xffffffffu, cm[e], 2));
    }
    if (__any_sync(0xffffffffu, cm[0] > st.m[0] || cm[1] > st.m[1])) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float f;
        Rescale(st, e, cm[e], &f);
#pragma unroll
        for (int g = 0; g < NG; ++g) {
          pm[e][g] *= f;
          sw[g][e] *= f;
          sw[g][2 + e] *= f;
        }
      }
    }
    float mu[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) mu[e] = st.m[e] == -INFINITY ? 0.f : st.m[e];
    // W columns are stored in the value product's token order (see below), so each lane's
    // B operand is one 32-bit load and its code loads hit 32 distinct banks.
    const int wcol0 = gid < 4 ? 2 * gid : 2 * gid - 7;
    const int head0 = kPack ? 2 * (tig & 1) : 2 * tig;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int mt = kPack ? 2 * j + (tig >> 1) : j;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int t = mt * 16 + gid + 8 * r;
        const int wc = mt * 16 + wcol0 + 8 * r;
        float pr[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          pr[e] = Ex2(ps[j][2 * r + e] - mu[e]);
          st.l[e] += pr[e];
        }
#pragma unroll
        for (int g = 0; g < NG; ++g) {
          const float2 sm = __half22float2(*reinterpret_cast<const __half2*>(vp + (t * NG + g) * 4));
          const __half2 w2 = __floats2half2_rn(pr[0] * sm.x, pr[1] * sm.x);
          pm[0][g] = fmaf(pr[0], sm.y, pm[0][g]);
          pm[1][g] = fmaf(pr[1], sm.y, pm[1][g]);
          wx[(g * 8 + head0) * kWStride + wc] = __low2half(w2);
          wx[(g * 8 + head0 + 1) * kWStride + wc] = __high2half(w2);
        }
      }
    }
    __syncwarp();
    // Values: O^T[channel][head] += V^T (codes, 16 channels x 16 tokens per tile) · W.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // k-slots 2·tig, 2·tig+1, 2·tig+8, 2·tig+9 of this 16-token step are tokens tig, tig+4,
      // tig+8, tig+12 (W columns were written in this order).
      const int ta = 16 * j + tig, tb = ta + 8;
      const int wcb = 16 * j + 2 * tig;
      uint32_t wa0, wa1, wb0, wb1;
      if (G == 128) {
        wa0 = *reinterpret_cast<const uint32_t*>(vc + ta * 32 + 4 * gid);
        wa1 = *reinterpret_cast<const uint32_t*>(vc + (ta + 4) * 32 + 4 * gid);
        wb0 = *reinterpret_cast<const uint32_t*>(vc + tb * 32 + 4 * gid);
        wb1 = *reinterpret_cast<const uint32_t*>(vc + (tb + 4) * 32 + 4 * gid);
      } else {
        auto ld = [&](int t) {
          const uint32_t lo = *reinterpret_cast<const uint16_t*>(vc + t * 32 + 2 * gid);
          const uint32_t hi = *reinterpret_cast<const uint16_t*>(vc + t * 32 + 16 + 2 * gid);
          return lo | (hi << 16);
        };
        wa0 = ld(ta);
        wa1 = ld(ta + 4);
        wb0 = ld(tb);
        wb1 = ld(tb + 4);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t sel = half ? 0x7632u : 0x5410u;
        uint32_t ra[8], rb[8];
        UnpackCodesM(__byte_perm(wa0, wa1, sel), magic, ra);
        UnpackCodesM(__byte_perm(wb0, wb1, sel), magic, rb);
        const int g = (G == 64) ? half : 0;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(wx + (g * 8 + gid) * kWStride + wcb);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(wx + (g * 8 + gid) * kWStride + wcb + 8);
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) {
          const int i = half * 4 + ii;
          MmaF16(st.o[i], ra[2 * ii], ra[2 * ii + 1], rb[2 * ii], rb[2 * ii + 1], b0, b1);
        }
        // 1024·Σ W: the same product with every code 0 (exactly what the offsets added).
        if (G == 64 || half == 0) MmaF16(sw[g], magic, magic, magic, magic, b0, b1);
      }
    }
    __syncwarp();
  }
  CpAsyncWait<0>();
  __syncthreads();

  // Remove the code offsets and factors, add Σ p·min.
#pragma unroll
  for (int e = 0; e < 2; ++e) {
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      pm[e][g] = WarpSumOverGid(pm[e][g]);
      // Packed: lanes tig and tig ^ 2 hold the same head's partial sums (even / odd tiles).
      if (kPack) pm[e][g] += __shfl_xor_sync(0xffffffffu, pm[e][g], 2);
    }
    if (kPack) st.l[e] += __shfl_xor_sync(0xffffffffu, st.l[e], 2);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int half = i >> 2, ii = i & 3;
    const int g = (G == 64) ? half : 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int cidx = 2 * ii + r;
      const float inv = 1.0f / static_cast<float>(1 << CodeShift(cidx));
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& o = st.o[i][2 * r + e];
        o = (o - sw[g][e]) * inv + pm[e][g];
      }
    }
  }
  FinishItem(p, item, st, smem, [&](int i, int r) {
    const int half = i >> 2, cidx = 2 * (i & 3) + r;
    return G == 128 ? 16 * gid + 8 * half + cidx : 64 * half + 8 * gid + cidx;
  });
}

// ---------------------------------------------------------------------------------------------
// BF16 slices: K rows feed ldmatrix directly; V rows through ldmatrix.trans. Rows are stored in
// shared memory with the 16-byte chunk index XOR-swizzled by (row & 7), so the 8 row addresses
// of each ldmatrix hit distinct banks.

__device__ void Bf16Item(const DecodeParams& p, int item, const DecodeWorkItem& it, uint8_t* smem,
                         SliceTable tab) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const DecodeShape& sh = p.shape;
  const int gqa = static_cast<int>(sh.gqa());
  const PageGeometry geo = sh.geometry(PageKind::kBf16);
  const size_t seg_k = geo.segment_offset(sh.layer, 0, it.kv_head);
  const size_t seg_v = geo.segment_offset(sh.layer, 1, it.kv_head);

  const int n = it.num_slices;
  auto issue = [&](int unit, int stage) {
    uint8_t* sbase = smem + stage * kBf16Stage;
    const int info = tab.info[unit], tok0 = info >> 16, valid = info & 0xffff;
    const uint8_t* page = tab.ptr[unit];
    for (int c = tid; c < 2048; c += kThreads) {
      const int kv = c >> 10, t = (c >> 4) & 63, j = c & 15;
      const uint8_t* src = page + (kv ? seg_v : seg_k) + size_t(tok0 + t) * 256 + j * 16;
      const bool ok = t < valid;
      CpAsync16(sbase + kv * 16384 + t * 256 + ((j ^ (t & 7)) * 16), ok ? src : page, ok);
    }
  };
  float* qs = reinterpret_cast<float*>(smem + kBf16StageArea);
  RotateQueries(p, it, qs + 8 * 128, qs, reinterpret_cast<float*>(smem));  // stages not in use yet
  for (int s = 0; s < kBf16Stages - 1; ++s) {
    if (s < n) issue(s, s);
    CpAsyncCommit();
  }
  const float* qrot = qs;
  uint32_t qhi[8][2], qlo[8][2];
  #pragma unroll
  for (int s = 0; s < 8; ++s) {
    #pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int ch = 16 * s + 8 * b + 2 * tig;
      const float x0 = gid < gqa ? qrot[gid * 128 + ch] : 0.f;
      const float x1 = gid < gqa ? qrot[gid * 128 + ch + 1] : 0.f;
      const __nv_bfloat16 h0 = __float2bfloat16_rn(x0), h1 = __float2bfloat16_rn(x1);
      qhi[s][b] = PackBf162(h0, h1);
      qlo[s][b] = PackBf162(__float2bfloat16_rn(x0 - __bfloat162float(h0)),
                            __float2bfloat16_rn(x1 - __bfloat162float(h1)));
    }
  }
  __syncthreads();  // the query area becomes the P exchange
  WarpState st;
  #pragma unroll
  for (int i = 0; i < 8; ++i)
    #pragma unroll
    for (int j = 0; j < 4; ++j) st.o[i][j] = 0.f;
  #pragma unroll
  for (int e = 0; e < 2; ++e) {
    st.m[e] = -INFINITY;
    st.l[e] = 0.f;
  }
  // P exchange: [plane hi/lo][head 8][24] bf16 per warp.
  __nv_bfloat16* px = reinterpret_cast<__nv_bfloat16*>(smem + kBf16StageArea + warp * kWarpXchg);
  constexpr int kPStride = 24;

  for (int u = 0; u < n; ++u) {
    CpAsyncWait<kBf16Stages - 2>();
    __syncthreads();
    if (u + kBf16Stages - 1 < n) issue(u + kBf16Stages - 1, (u + kBf16Stages - 1) % kBf16Stages);
    CpAsyncCommit();
    const uint8_t* ks = smem + (u % kBf16Stages) * kBf16Stage;
    const uint8_t* vs = ks + 16384;
    const int valid = tab.info[u] & 0xffff;
    const int t0 = warp * 16;
    if (t0 >= valid) continue;  // no valid token in this warp's tile
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    {
      const int mat = lane >> 3, rr = lane & 7;
      const int t = t0 + rr + 8 * (mat & 1);
      #pragma unroll
      for (int s = 0; s < 8; ++s) {
        const int chunk = 2 * s + (mat >> 1);
        uint32_t a[4];
        LdMatrixX4(a, ks + t * 256 + ((chunk ^ (t & 7)) * 16));
        MmaBf16(acc, a[0], a[1], a[2], a[3], qhi[s][0], qhi[s][1]);
        MmaBf16(acc, a[0], a[1], a[2], a[3], qlo[s][0], qlo[s][1]);
      }
    }
    float sc[4];
    #pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int t = t0 + gid + 8 * (c >> 1);
      sc[c] = t < valid ? acc[c] : -INFINITY;
    }
    float mu[2];
    #pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float cm = WarpMaxOverGid(fmaxf(sc[e], sc[2 + e]));
      float f;
      mu[e] = Rescale(st, e, cm, &f);
    }
    #pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int e = c & 1, r = c >> 1;
      const float pr = Ex2(sc[c] - mu[e]);
      st.l[e] += pr;
      const __nv_bfloat16 h = __float2bfloat16_rn(pr);
      const __nv_bfloat16 lo = __float2bfloat16_rn(pr - __bfloat162float(h));
      const int tok = gid + 8 * r, qh = 2 * tig + e;
      px[(0 * 8 + qh) * kPStride + tok] = h;
      px[(1 * 8 + qh) * kPStride + tok] = lo;
    }
    __syncwarp();
    const uint32_t bh0 = *reinterpret_cast<const uint32_t*>(px + (0 * 8 + gid) * kPStride + 2 * tig);
    const uint32_t bh1 = *reinterpret_cast<const uint32_t*>(px + (0 * 8 + gid) * kPStride + 2 * tig + 8);
    const uint32_t bl0 = *reinterpret_cast<const uint32_t*>(px + (1 * 8 + gid) * kPStride + 2 * tig);
    const uint32_t bl1 = *reinterpret_cast<const uint32_t*>(px + (1 * 8 + gid) * kPStride + 2 * tig + 8);
    {
      const int mat = lane >> 3, rr = lane & 7;
      const int t = t0 + rr + 8 * (mat >> 1);
      #pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int chunk = 2 * i + (mat & 1);
        uint32_t a[4];
        LdMatrixX4Trans(a, vs + t * 256 + ((chunk ^ (t & 7)) * 16));
        MmaBf16(st.o[i], a[0], a[1], a[2], a[3], bh0, bh1);
        MmaBf16(st.o[i], a[0], a[1], a[2], a[3], bl0, bl1);
      }
    }
    __syncwarp();
  }
  CpAsyncWait<0>();
  __syncthreads();
  FinishItem(p, item, st, smem,
             [&](int i, int r) { return 16 * i + gid + 8 * r; });
}

// One CTA per work item of one kind; blockIdx.x indexes the plan's per-kind order.
template <int G, bool kPack>
__global__ void __launch_bounds__(kThreads, 3) DecodeInt2Kernel(const DecodeParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  // The BF16 kernel (launched next, programmatic serialization) does not depend on this one:
  // let it start as soon as SMs free up.
  asm volatile("griddepcontrol.launch_dependents;");
  const int item = p.item_order[blockIdx.x];
  const DecodeWorkItem it = p.items[item];
  uint8_t* t = smem + kInt2StageArea + kWarps * kWarpXchg;
  SliceTable tab{reinterpret_cast<const uint8_t**>(t), reinterpret_cast<int32_t*>(t + kMaxItemSlices * 8)};
  LoadSliceTable(p, it, tab);
  __syncthreads();
  Int2Item<G, kPack>(p, item, it, smem, tab);
}

__global__ void __launch_bounds__(kThreads, 2) DecodeBf16Kernel(const DecodeParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int item = p.item_order[p.num_int2_items + blockIdx.x];
  const DecodeWorkItem it = p.items[item];
  uint8_t* t = smem + kBf16StageArea + kWarps * kWarpXchg;
  SliceTable tab{reinterpret_cast<const uint8_t**>(t), reinterpret_cast<int32_t*>(t + kMaxItemSlices * 8)};
  LoadSliceTable(p, it, tab);
  __syncthreads();
  Bf16Item(p, item, it, smem, tab);
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
  const size_t qrot_bytes = 0;
  const float* part_o = reinterpret_cast<const float*>(static_cast<const uint8_t*>(p.workspace) + qrot_bytes);
  const size_t po_bytes = (sizeof(float) * size_t(p.num_items) * gqa * 128 + 255) / 256 * 256;
  const float* part_ml =
      reinterpret_cast<const float*>(static_cast<const uint8_t*>(p.workspace) + qrot_bytes + po_bytes);
  const int i0 = p.item_indptr[seq * p.shape.num_kv_heads + h];
  const int i1 = p.item_indptr[seq * p.shape.num_kv_heads + h + 1];
  float mx = -INFINITY;
  for (int i = i0 + t; i < i1; i += 128) {
    if (part_ml[(size_t(i) * gqa + j) * 2 + 1] > 0.f) mx = fmaxf(mx, part_ml[(size_t(i) * gqa + j) * 2]);
  }
  mx = BlockReduce(mx, red, true);
  float L = 0.f, O = 0.f;
  if (mx != -INFINITY) {
    for (int c0 = i0; c0 < i1; c0 += 128) {
      const int i = c0 + t;
      float w = 0.f;
      if (i < i1) {
        const float l = part_ml[(size_t(i) * gqa + j) * 2 + 1];
        if (l > 0.f) w = exp2f(part_ml[(size_t(i) * gqa + j) * 2] - mx) * l;
      }
      __syncthreads();
      wsm[t] = w;
      L += w;
      __syncthreads();
      const int n = min(128, i1 - c0);
      int k = 0;
      for (; k + 4 <= n; k += 4) {
        const float* base = part_o + (size_t(c0 + k) * gqa + j) * 128 + t;
        const float o0 = base[0], o1 = base[size_t(gqa) * 128], o2 = base[size_t(2 * gqa) * 128],
                    o3 = base[size_t(3 * gqa) * 128];
        O += wsm[k] * o0 + wsm[k + 1] * o1 + wsm[k + 2] * o2 + wsm[k + 3] * o3;
      }
      for (; k < n; ++k) O += wsm[k] * part_o[(size_t(c0 + k) * gqa + j) * 128 + t];
    }
    L = BlockReduce(L, red, false);
  }
  const float o = L > 0.f ? O / L : 0.f;
  if (t == 0 && p.lse != nullptr) p.lse[sq] = L > 0.f ? (mx + log2f(L)) * kLn2 : -INFINITY;
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

template <typename K>
bool SetSmem(K kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
}
// Raises an INT2 kernel's dynamic shared-memory limit on its first launch (one static per
// instantiation: the kernel is a template argument, not a value of the shared pointer type).
template <int G, bool kPack>
void LaunchInt2(const DecodeParams& p, int blocks, cudaStream_t stream) {
  static const bool once = SetSmem(DecodeInt2Kernel<G, kPack>, SmemBytes<true>());
  (void)once;
  DecodeInt2Kernel<G, kPack><<<blocks, kThreads, SmemBytes<true>(), stream>>>(p);
}

}  // namespace

absl::Status LaunchDecodeAttention(const DecodeParams& p, cudaStream_t stream) {
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
  const float scale = p.softmax_scale > 0 ? p.softmax_scale : 1.0f / sqrtf(128.0f);
  const int sq = p.table.num_seqs * static_cast<int>(p.shape.num_q_heads);
  (void)scale;
  const int n2 = p.num_int2_items, nb = p.num_items - p.num_int2_items;
  if (n2 > 0) {
    const bool pack = p.variant == DecodeVariant::kPackedHeads && p.shape.gqa() <= 4;
    if (p.shape.group_size == 128) {
      pack ? LaunchInt2<128, true>(p, n2, stream) : LaunchInt2<128, false>(p, n2, stream);
    } else {
      pack ? LaunchInt2<64, true>(p, n2, stream) : LaunchInt2<64, false>(p, n2, stream);
    }
  }
  if (nb > 0) {
    static const bool once = SetSmem(DecodeBf16Kernel, SmemBytes<false>());
    (void)once;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(nb);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = SmemBytes<false>();
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (absl::Status st = CudaStatus(cudaLaunchKernelEx(&cfg, DecodeBf16Kernel, p), "bf16 decode launch");
        !st.ok()) {
      return st;
    }
  }
  MergeKernel<<<sq, 128, 0, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "decode attention launch");
}

const char* DecodeVariantName(DecodeVariant v) {
  switch (v) {
    case DecodeVariant::kBaseline: return "baseline";
    case DecodeVariant::kPackedHeads: return "packed_heads";
  }
  return "unknown";
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
