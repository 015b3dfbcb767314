// The BF16-slice part of the paged decode attention (one work item of BF16 pages), shared by
// the BF16 kernel (decode_attention.cu) and the INT2 kernel (decode_int2.cu), which runs the BF16
// items itself in INT2-dominated batches. Internal to kernels/cuda/src.
#pragma once

#include "decode_common.cuh"

namespace oscarkv::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// BF16 slices: K rows feed ldmatrix directly; V rows through ldmatrix.trans. Rows are stored in
// shared memory with the 16-byte chunk index XOR-swizzled by (row & 7), so the 8 row addresses
// of each ldmatrix hit distinct banks.

//
// kStages 3: the BF16 kernel's layout (96 KiB of stages, 2 CTAs/SM). kStages 2: the layout that
// fits the INT2 kernel's shared memory (64 KiB of stages, then the P exchange; the query
// staging and the rotation scratch live in stage 1 until the loop first issues it), so the INT2
// kernel runs the few BF16 items of an INT2-dominated batch itself.
// kW: warps of the CTA (the INT2 kernel's DecodeParams::int2_warps, only with the rotation
// kernel's queries loaded ahead); warps past the fourth take no tokens (a slice is 4 x 16).
template <int kStages, int kW = kWarps>
__device__ void Bf16Item(const DecodeParams& p, int item, const DecodeWorkItem& it, uint8_t* smem,
                         SliceTable tab) {
  static_assert(kStages == 2 || kStages == 3, "BF16 stages");
  constexpr int kArea = kStages * kBf16Stage;
  constexpr int kPxBytes = kStages == 3 ? kWarpXchg : 2 * 8 * 24 * 2;  // per warp
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
    for (int c = tid; c < 2048; c += 32 * kW) {
      const int kv = c >> 10, t = (c >> 4) & 63, j = c & 15;
      const uint8_t* src = page + (kv ? seg_v : seg_k) + size_t(tok0 + t) * 256 + j * 16;
      const bool ok = t < valid;
      CpAsync16(sbase + kv * 16384 + t * 256 + ((j ^ (t & 7)) * 16), ok ? src : page, ok);
    }
  };
  // fragments_before_copies with the rotation kernel (INT2 kernel, kStages 2): the rotated
  // queries are loaded into registers before the first copies are issued, not behind them.
  // (CTAs of more than 4 warps always: the rotation kernel's queries are their only source.)
  const bool ahead = kStages == 2 && !p.rotate_in_cta && (p.fragments_before_copies || kW != kWarps);
  float4 qa[2];
  if (ahead) {
    const float4* pub = reinterpret_cast<const float4*>(
        RotatedQueries(p) + (size_t(it.seq) * sh.num_q_heads + size_t(it.kv_head) * gqa) * 128);
    asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int i = tid + 32 * kW * j;
      if (i < gqa * 32) {
        asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(qa[j].x), "=f"(qa[j].y), "=f"(qa[j].z), "=f"(qa[j].w)
                     : "l"(pub + i));
      }
    }
  }
  // First copies, then the query rotation while they are in flight (its scratch is the last
  // stage, which the loop issues only after the rotation).
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n) issue(s, s);
    CpAsyncCommit();
  }
  uint8_t* last_stage = smem + (kStages - 1) * kBf16Stage;
  float* qs = reinterpret_cast<float*>(kStages == 3 ? smem + kArea : last_stage);
  float* scratch = reinterpret_cast<float*>(kStages == 3 ? last_stage : last_stage + 8192);
  // The INT2 kernel's BF16 items (kStages 2) take the rotation kernel's queries; the BF16
  // kernel always rotates its own.
  if (ahead) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int i = tid + 32 * kW * j;
      if (i < gqa * 32) reinterpret_cast<float4*>(qs)[i] = qa[j];
    }
    __syncthreads();
  } else if constexpr (kW != kWarps) {
    __trap();  // the launch checks: more warps only with the queries loaded ahead
  } else if (kStages == 2) {
    CtaQueries(p, it, qs + 8 * 128, qs, scratch, 8 * 128);
  } else {
    RotateQueries(p, it, qs + 8 * 128, qs, scratch, 8 * 128);
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
  __nv_bfloat16* px = reinterpret_cast<__nv_bfloat16*>(smem + kArea + warp * kPxBytes);
  constexpr int kPStride = 24;

  for (int u = 0; u < n; ++u) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    if (u + kStages - 1 < n) issue(u + kStages - 1, (u + kStages - 1) % kStages);
    CpAsyncCommit();
    const uint8_t* ks = smem + (u % kStages) * kBf16Stage;
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
  FinishItem<kW>(p, item, it, st, smem,
                 [&](int i, int r) { return 16 * i + gid + 8 * r; });
}

}  // namespace
}  // namespace oscarkv::cuda
