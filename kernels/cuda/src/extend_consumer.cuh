// The consumer warpgroups of the two wgmma extend-attention kernels (extend_attention_wgmma.cu,
// sequences with prefix pages, fp16 operands in the channel order of extend_wgmma.cuh; and
// extend_dense_wgmma.cu, plain prefill, bf16 operands in natural channel order; kDense picks
// the latter): the rows a consumer thread owns, the query staged as the score product's A
// operand, the tile loop (masks, online softmax in base 2, the two warpgroups taking turns at
// the tensor cores) and the epilogue. Each kernel keeps its own schedule (which tiles, which
// ring stages, where the rotation lives) and calls these; all of them are forced inline, so a
// kernel compiles as it did with the code written out in it (same registers, no local memory).
// Internal to kernels/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "extend_wgmma.cuh"

namespace oscarkv::cuda::detail {
namespace {

constexpr float kXLog2e = 1.4426950408889634f;
constexpr float kXLn2 = 0.6931471805599453f;
// Named barrier ids of the consumers: both warpgroups, and the turns (kBarTurn0 + warpgroup).
constexpr int kBarConsumers = 2, kBarTurn0 = 3;

__device__ __forceinline__ float XEx2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A consumer thread (ctid 0..255: warpgroup wg, warp, gid = lane / 4, tig = lane % 4) and the
// rows it holds of one work item: accumulator rows r0 = 64·wg + 16·warp + gid and r1 = r0 + 8
// of the item's 128, row r being token tok0 + r / gqa of query head h·gqa + r % gqa (rows past
// tpc·gqa unused: token -1).
struct XRows {
  int ctid, wg, warp, gid, tig, r0, r1;
  int gqa, Hq;
  int tok_r0, tok_r1, wg_first_tok;  // tokens of rows r0, r1 and of the warpgroup's first row
  bool ok_r0, ok_r1;                 // rows r0, r1 hold a new token of the sequence
};
__device__ __forceinline__ XRows XRowsOf(int ctid, int wg, int gqa, int Hq, int tpc, int tok0, int num_new) {
  XRows w;
  w.ctid = ctid;
  w.wg = wg;
  w.warp = (ctid >> 5) & 3;
  w.gid = (ctid & 31) >> 2;
  w.tig = ctid & 3;
  w.r0 = 64 * wg + 16 * w.warp + w.gid;
  w.r1 = w.r0 + 8;
  w.gqa = gqa;
  w.Hq = Hq;
  const int used_rows = tpc * gqa;
  auto row_tok = [&](int r) { return r < used_rows ? tok0 + r / gqa : -1; };
  w.tok_r0 = row_tok(w.r0);
  w.tok_r1 = row_tok(w.r1);
  w.wg_first_tok = row_tok(64 * wg);
  w.ok_r0 = w.tok_r0 >= 0 && w.tok_r0 < num_new;
  w.ok_r1 = w.tok_r1 >= 0 && w.tok_r1 < num_new;
  return w;
}

// (a, b) as an fp16 pair plus the fp16 pair of what that rounding lost: hi + lo carries ~22 bits.
__device__ __forceinline__ void XSplitHiLo(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 back = __half22float2(h);
  hi = Half2Bits(h);
  lo = Half2Bits(__floats2half2_rn(a - back.x, b - back.y));
}

// y = (hi + lo) · R on the tensor cores: hi and lo the warpgroup's 64 x 128 rows as fp16 A
// fragments (8 k-steps of 16), R the K-major 128 x 128 fp16 B operand at rot_addr.
__device__ __forceinline__ void XRotateHiLo(float (&y0)[32], float (&y1)[32], const uint32_t (&hi)[8][4],
                                            const uint32_t (&lo)[8][4], uint32_t rot_addr) {
#pragma unroll
  for (int i = 0; i < 32; ++i) y0[i] = y1[i] = 0.f;
  WgmmaFenceAcc(y0, y1);
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const uint64_t d = SwizzledDesc(SwizzledDescLo(rot_addr + (s >> 2) * 16384 + (s & 3) * 32));
    WgmmaF16N128R<1, 0>(y0, y1, hi[s], d);
    WgmmaF16N128R<1, 0>(y0, y1, lo[s], d);
  }
  WgmmaCommit();
  WgmmaWait(y0, y1);
}

// The scaled (softmax scale · log2 e), rotated query of the warpgroup's 64 rows as the score
// product's A operand: a K-major 64 x 128 tile of the kernel's element type (two swizzled
// 64-position halves) at q_tile, written once both warpgroups' R_K products are done (q_tile
// lies in the rotation area). With p.rot_k, R_K must be at rot_addr (K-major B operand, as
// XStoreRotK writes it) and visible to the async proxy once put_rot_k() returns (the paged
// kernel's consumers write it there; the dense kernel's producers did already: a no-op);
// without, the query is taken as rotated and put_rot_k is not called. Ends with both
// warpgroups past the barrier that publishes their tiles.
template <bool kDense, typename PutRotK>
__device__ __forceinline__ void XStageQuery(const ExtendParams& p, const XItem& it, const XRows& w, uint8_t* q_tile,
                                            uint32_t rot_addr, PutRotK&& put_rot_k) {
  const float scale = (p.softmax_scale > 0 ? p.softmax_scale : 0.08838834764831845f) * kXLog2e;
  auto q_row = [&](int r, int tok) -> const float* {
    return p.q + (size_t(it.q_begin + tok) * w.Hq + size_t(it.h) * w.gqa + r % w.gqa) * 128;
  };
  const int qrow0 = 16 * w.warp + w.gid;  // rows r0, r1 within the warpgroup's tile
  auto store_q = [&](int row, int pos, float a, float b) {
    *reinterpret_cast<uint32_t*>(q_tile + (pos >> 6) * 8192 + Swizzle128(row, (pos & 63) >> 3) + 2 * (pos & 7)) =
        PackPair<kDense>(a, b);
  };
  if (p.rot_k != nullptr) {
    put_rot_k();
    uint32_t ah[8][4], al[8][4];
#pragma unroll
    for (int s = 0; s < 8; ++s) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool ok = (j & 1) ? w.ok_r1 : w.ok_r0;
        const int col = 16 * s + 8 * (j >> 1) + 2 * w.tig;
        const float2 v = ok ? *reinterpret_cast<const float2*>(q_row((j & 1) ? w.r1 : w.r0, (j & 1) ? w.tok_r1 : w.tok_r0) + col)
                            : make_float2(0.f, 0.f);
        XSplitHiLo(v.x, v.y, ah[s][j], al[s][j]);
      }
    }
    float y0[32], y1[32];
    XRotateHiLo(y0, y1, ah, al, rot_addr);
    NamedBarrier(kBarConsumers, 256);  // both warpgroups' R_K products are done
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      store_q(qrow0, 8 * j + 2 * w.tig, y0[2 * j] * scale, y0[2 * j + 1] * scale);
      store_q(qrow0 + 8, 8 * j + 2 * w.tig, y1[2 * j] * scale, y1[2 * j + 1] * scale);
    }
  } else {
    auto channel_of = [](int pos) { return kDense ? pos : ExtendChannel(pos); };
#pragma unroll 4
    for (int j = 0; j < 16; ++j) {
      const int pos = 8 * j + 2 * w.tig;
      const float* q0 = w.ok_r0 ? q_row(w.r0, w.tok_r0) : nullptr;
      const float* q1 = w.ok_r1 ? q_row(w.r1, w.tok_r1) : nullptr;
      store_q(qrow0, pos, w.ok_r0 ? q0[channel_of(pos)] * scale : 0.f, w.ok_r0 ? q0[channel_of(pos + 1)] * scale : 0.f);
      store_q(qrow0 + 8, pos, w.ok_r1 ? q1[channel_of(pos)] * scale : 0.f, w.ok_r1 ? q1[channel_of(pos + 1)] * scale : 0.f);
    }
  }
  FenceProxyAsync();
  NamedBarrier(kBarConsumers, 256);
}

// What the tile loop leaves for the epilogue, per thread.
struct XAcc {
  float o0[32], o1[32];  // output rows r0, r1, unnormalized (columns in the value product's order)
  float m[2], l[2];      // their running maxima (base 2) and this thread's share of their sums
  uint32_t pa[4][4];     // the last tile's probabilities: the value product's A operand
};

// The tile loop over the ring's tiles gbase, gbase + 1, ..., gbase + num_tiles - 1 (stage
// g % kSt of parity (g / kSt) & 1; K at sbase + stage·kXStage, V kXTile after it, the tile's
// (valid keys, first new token or -1 for a prefix slice) at info[stage]), the query tile at
// q_addr. Per tile x the warpgroups take turns to issue, through two named barriers, so that
// one's softmax runs while the other's products are on the tensor cores: issue S_x = Q·K_xᵀ and
// O += P_{x-1}·V_{x-1}; wait for S_x; mask and softmax it; wait for the value product (releasing
// tile x-1's stage: empty barrier); rescale O and keep P_x for the next turn. The turn barriers
// end balanced, so the loop can run again for the next item.
template <bool kDense, int kSt>
__device__ __forceinline__ void XAttendTiles(XAcc& a, const XRows& w, uint32_t sbase, uint32_t q_addr, const int2* info,
                                             uint32_t full_bar, uint32_t empty_bar, int gbase, int num_tiles) {
#pragma unroll
  for (int i = 0; i < 32; ++i) a.o0[i] = a.o1[i] = 0.f;
  a.m[0] = a.m[1] = -INFINITY;
  a.l[0] = a.l[1] = 0.f;
  const int my_turn = kBarTurn0 + w.wg, other_turn = kBarTurn0 + (w.wg ^ 1);
  if (w.wg == 1) NamedBarrierArrive(kBarTurn0, 256);  // warpgroup 0 issues first
  auto issue_scores = [&](int stage, float (&s0)[16], float (&s1)[16]) {
    const uint32_t kt = sbase + stage * kXStage;
    WgmmaFence32(s0, s1);
    WgmmaF16N64SS<0, kDense>(s0, s1, SwizzledDesc(SwizzledDescLo(q_addr)), SwizzledDesc(SwizzledDescLo(kt)));
#pragma unroll
    for (int s = 1; s < 8; ++s) {
      const uint32_t off = (s >> 2) * 8192 + (s & 3) * 32;
      WgmmaF16N64SS<1, kDense>(s0, s1, SwizzledDesc(SwizzledDescLo(q_addr + off)), SwizzledDesc(SwizzledDescLo(kt + off)));
    }
    WgmmaCommit();
  };
  auto issue_values = [&](int stage) {
    const uint32_t vt = sbase + stage * kXStage + kXTile;
    WgmmaFence64(a.o0, a.o1, a.pa);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) WgmmaF16N128R<1, 1, kDense>(a.o0, a.o1, a.pa[kk], ValueTileDesc(vt + kk * 2048));
    WgmmaCommit();
  };
  // Masks (keys past `valid`; for new tokens, keys after the row's token) and the online
  // softmax of one tile's scores (in place: s becomes p); returns the factors the output rows
  // are rescaled by.
  auto softmax = [&](float (&s0)[16], float (&s1)[16], int valid, int new0, float& f0, float& f1) {
    if (valid < 64 || (new0 >= 0 && new0 + 63 > w.wg_first_tok)) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int k = 8 * j + 2 * w.tig + e;
          const bool in = k < valid;
          if (!(in && (new0 < 0 || new0 + k <= w.tok_r0))) s0[2 * j + e] = -INFINITY;
          if (!(in && (new0 < 0 || new0 + k <= w.tok_r1))) s1[2 * j + e] = -INFINITY;
        }
      }
    }
    float mx0 = s0[0], mx1 = s1[0];
#pragma unroll
    for (int i = 1; i < 16; ++i) {
      mx0 = fmaxf(mx0, s0[i]);
      mx1 = fmaxf(mx1, s1[i]);
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(a.m[0], mx0), mn1 = fmaxf(a.m[1], mx1);
    const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
    f0 = XEx2(a.m[0] - mu0);
    f1 = XEx2(a.m[1] - mu1);
    a.m[0] = mn0;
    a.m[1] = mn1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      s0[i] = XEx2(s0[i] - mu0);
      s1[i] = XEx2(s1[i] - mu1);
      sum0 += s0[i];
      sum1 += s1[i];
    }
    a.l[0] = a.l[0] * f0 + sum0;
    a.l[1] = a.l[1] * f1 + sum1;
  };
  auto make_p = [&](const float (&s0)[16], const float (&s1)[16]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      a.pa[kk][0] = PackPair<kDense>(s0[4 * kk], s0[4 * kk + 1]);
      a.pa[kk][1] = PackPair<kDense>(s1[4 * kk], s1[4 * kk + 1]);
      a.pa[kk][2] = PackPair<kDense>(s0[4 * kk + 2], s0[4 * kk + 3]);
      a.pa[kk][3] = PackPair<kDense>(s1[4 * kk + 2], s1[4 * kk + 3]);
    }
  };
  auto tile_info = [&](int stage, int& valid, int& new0) {
    const int2 ti = info[stage];
    valid = __shfl_sync(0xffffffffu, ti.x, 0);
    new0 = __shfl_sync(0xffffffffu, ti.y, 0);
  };
  {  // tile 0: the score product alone
    const int stage = gbase % kSt;
    MbarWaitParity(full_bar + 8 * stage, (gbase / kSt) & 1);
    int valid, new0;
    tile_info(stage, valid, new0);
    float s0[16], s1[16], f0, f1;
    NamedBarrier(my_turn, 256);
    issue_scores(stage, s0, s1);
    NamedBarrierArrive(other_turn, 256);
    WgmmaCommitWait32(s0, s1);
    softmax(s0, s1, valid, new0, f0, f1);
    make_p(s0, s1);
  }
  for (int x = 1; x < num_tiles; ++x) {
    const int stage = (gbase + x) % kSt, prev = (gbase + x - 1) % kSt;
    MbarWaitParity(full_bar + 8 * stage, ((gbase + x) / kSt) & 1);
    int valid, new0;
    tile_info(stage, valid, new0);
    float s0[16], s1[16], f0, f1;
    NamedBarrier(my_turn, 256);
    issue_scores(stage, s0, s1);
    issue_values(prev);
    NamedBarrierArrive(other_turn, 256);
    WgmmaWait1Scores(s0, s1);
    softmax(s0, s1, valid, new0, f0, f1);
    WgmmaWaitValues(a.o0, a.o1, a.pa);
    MbarArrive(empty_bar + 8 * prev);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      a.o0[i] *= f0;
      a.o1[i] *= f1;
    }
    make_p(s0, s1);
  }
  // The last value product, in turn (warpgroup 0 then takes the arrival warpgroup 1 leaves
  // after its last issue).
  const int last = (gbase + num_tiles - 1) % kSt;
  NamedBarrier(my_turn, 256);
  issue_values(last);
  NamedBarrierArrive(other_turn, 256);
  WgmmaWaitValues(a.o0, a.o1, a.pa);
  MbarArrive(empty_bar + 8 * last);
  if (w.wg == 0) NamedBarrier(my_turn, 256);
}

// Epilogue: normalize, write the log-sum-exp (natural log) when p.lse, and the output rows,
// unrotated by R_Vᵀ on tensor cores when p.unrotate_output (R_V converted into the rotation
// area `rot` / rot_addr once both warpgroups are past their R_K product, which it overwrites).
template <bool kDense>
__device__ __forceinline__ void XEpilogue(const ExtendParams& p, XAcc& a, const XItem& it, const XRows& w, uint8_t* rot,
                                          uint32_t rot_addr) {
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    a.l[r] += __shfl_xor_sync(0xffffffffu, a.l[r], 1);
    a.l[r] += __shfl_xor_sync(0xffffffffu, a.l[r], 2);
    inv[r] = a.l[r] > 0.f ? 1.f / a.l[r] : 0.f;
  }
  const int Hq = w.Hq, tig = w.tig;
  const int hg0 = it.h * w.gqa + w.r0 % w.gqa, hg1 = it.h * w.gqa + w.r1 % w.gqa;
  float* out0 = w.ok_r0 ? p.out + (size_t(it.q_begin + w.tok_r0) * Hq + hg0) * 128 : nullptr;
  float* out1 = w.ok_r1 ? p.out + (size_t(it.q_begin + w.tok_r1) * Hq + hg1) * 128 : nullptr;
  if (tig == 0 && p.lse != nullptr) {
    if (w.ok_r0) p.lse[size_t(it.q_begin + w.tok_r0) * Hq + hg0] = a.l[0] > 0.f ? (a.m[0] + log2f(a.l[0])) * kXLn2 : -INFINITY;
    if (w.ok_r1) p.lse[size_t(it.q_begin + w.tok_r1) * Hq + hg1] = a.l[1] > 0.f ? (a.m[1] + log2f(a.l[1])) * kXLn2 : -INFINITY;
  }
  if (p.unrotate_output) {
    NamedBarrier(kBarConsumers, 256);  // both warpgroups are past their R_K product
    // R_V as a K-major B operand: n-row = output channel i, k = position of input channel c
    // (R_V[i][ExtendChannel(k)] in the paged kernel's channel order).
    const float4* r = reinterpret_cast<const float4*>(p.rot_v + size_t(it.h) * 128 * 128);
    for (int v0 = w.ctid; v0 < 128 * 32; v0 += 256 * 8) {
      float4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = r[v0 + 256 * u];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float e4[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const int idx = 4 * (v0 + 256 * u) + t, i = idx >> 7, c = idx & 127, k = kDense ? c : ExtendPosition(c);
          *reinterpret_cast<__half*>(rot + (k >> 6) * 16384 + Swizzle128(i, (k & 63) >> 3) + 2 * (k & 7)) = __float2half_rn(e4[t]);
        }
      }
    }
    FenceProxyAsync();
    NamedBarrier(kBarConsumers, 256);
    uint32_t oh[8][4], ol[8][4];
#pragma unroll
    for (int s = 0; s < 8; ++s) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int at = 4 * s + 2 * j;
        XSplitHiLo(a.o0[at] * inv[0], a.o0[at + 1] * inv[0], oh[s][2 * j], ol[s][2 * j]);
        XSplitHiLo(a.o1[at] * inv[1], a.o1[at + 1] * inv[1], oh[s][2 * j + 1], ol[s][2 * j + 1]);
      }
    }
    float u0[32], u1[32];
    XRotateHiLo(u0, u1, oh, ol, rot_addr);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if (out0 != nullptr) *reinterpret_cast<float2*>(out0 + 8 * j + 2 * tig) = make_float2(u0[2 * j], u0[2 * j + 1]);
      if (out1 != nullptr) *reinterpret_cast<float2*>(out1 + 8 * j + 2 * tig) = make_float2(u1[2 * j], u1[2 * j + 1]);
    }
  } else if constexpr (kDense) {  // natural channel order: adjacent pairs (full 32-byte sectors per quad)
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if (out0 != nullptr) *reinterpret_cast<float2*>(out0 + 8 * j + 2 * tig) = make_float2(a.o0[2 * j] * inv[0], a.o0[2 * j + 1] * inv[0]);
      if (out1 != nullptr) *reinterpret_cast<float2*>(out1 + 8 * j + 2 * tig) = make_float2(a.o1[2 * j] * inv[1], a.o1[2 * j + 1] * inv[1]);
    }
  } else {  // back from the tiles' channel order
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = ExtendChannel(8 * j + 2 * tig + e);
        if (out0 != nullptr) out0[c] = a.o0[2 * j + e] * inv[0];
        if (out1 != nullptr) out1[c] = a.o1[2 * j + e] * inv[1];
      }
    }
  }
}

}  // namespace
}  // namespace oscarkv::cuda::detail
