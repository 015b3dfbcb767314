// One INT2 work item of the decode kernel (decode_int2.cu; internal to kernels/cuda/src): each
// warp streams its slices through its ring, computes the scores of its 64-token slices on the
// tensor cores, runs the online softmax and the value product, and FinishItem merges the warps'
// states and writes the item's partial (or merges the pair's partials when it is the last).
// Stages, in order: the first copies and the query fragments (from the rotation kernel, or
// rotated here), the main loop (score product, softmax, weights, value product), the epilogue
// (code offsets removed, Σ p·min added).
#pragma once

#include "decode_int2_operands.cuh"

namespace oscarkv::cuda {
namespace {

// kV8: DecodeVariant::kPackedInt8Values (GQA <= 4: query heads packed two parts per head into
// the mma columns, int8 score and value products); false: kBaseline (fp16 products, one head
// per column). See decode_launch.h.
// kW: warps of the CTA (DecodeParams::int2_warps); more than 4 only with prepared fragments
// (the launch falls back to 4 warps otherwise).
template <int G, bool kV8, int kW = kWarps>
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
  __half* wx = reinterpret_cast<__half*>(smem + Int2StageArea<kW>() + warp * kWarpXchg);
  uint8_t* ring = smem + warp * (kInt2WarpStages * kInt2Slot);

  const int n = it.num_slices;
  const int mine = n > warp ? (n - warp + kW - 1) / kW : 0;  // slices of this warp
  const size_t v_minus_k = seg_v - seg_k;
  const uint32_t ring_addr = SmemAddr(ring) + lane * 16;
  // kV8: V code chunk c (token c >> 1, half c & 1) lands at chunk c ^ ((c >> 4) & 1), so the
  // value product's ldmatrix rows (tokens q, q + 8 of 4 quads) hit 8 distinct bank groups.
  const uint32_t ring_addr_v = kV8 ? SmemAddr(ring) + 16 * (lane ^ ((lane >> 4) & 1)) : ring_addr;
  // Copies slice k of this warp into stage `stage`: the K codes (2 KiB contiguous), K params,
  // V codes, V params. Chunks past the valid tokens are zero-filled (src-size 0) and not read.
  // (Bulk/TMA copies issued by one lane, with an mbarrier per stage, measured 7-11% slower here:
  // the single-lane issue and the barrier wait cost as many instructions per slice and add latency.)
  // 8-warp CTAs: the copies carry an L2 policy, evict_first with stream_evict_first, else
  // evict_normal (as without a hint; one form of the copy either way).
  // (Both policies are created and one is selected without a branch: with the creation under a
  // branch, nvcc 13.0 issued some copies with a descriptor register it had not set, an illegal
  // instruction on the device.)
  uint64_t policy = 0;
  if constexpr (kW != kWarps) {
    uint64_t first, normal;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(normal));
    policy = p.stream_evict_first ? first : normal;
  }
  auto copy16 = [&](uint32_t dst, const uint8_t* src, int bytes) {
    if constexpr (kW != kWarps) {
      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                   "r"(bytes), "l"(policy));
    } else {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
    }
  };
  auto issue = [&](int k, int stage) {
    const int sl = warp + kW * k;
    const int info = tab.info[sl], tok0 = info >> 16, valid = info & 0xffff;
    const uint8_t* pk = tab.ptr[sl] + seg_k;
    const uint8_t* ck = pk + tok0 * 32 + lane * 16;
    const uint8_t* cv = ck + v_minus_k;
    const uint32_t d = ring_addr + stage * kInt2Slot;
    const uint32_t dv = ring_addr_v + stage * kInt2Slot;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int bytes = ((lane >> 1) + 16 * i) < valid ? 16 : 0;
      copy16(d + 512 * i, ck + 512 * i, bytes);
      copy16(dv + Lay::kHalf + 512 * i, cv + 512 * i, bytes);
    }
    if (lane < 16 * NG) {  // params: 4·NG bytes per token, 16/(4·NG) tokens per chunk
      const int bytes = lane * 4 / NG < valid ? 16 : 0;
      const uint8_t* pp = pk + codes_bytes + tok0 * 4 * NG + lane * 16;
      copy16(d + Lay::kCodes, pp, bytes);
      copy16(d + Lay::kHalf + Lay::kCodes, pp + v_minus_k, bytes);
    }
  };

  // Start the first copies, then get the rotated queries (from the rotation kernel, or rotated
  // here with rotate_in_cta) and build their fragments while the copies are in flight (the
  // in-CTA rotation's per-warp scratch is each warp's last stage, not issued yet).
  // The kernel's entry started the query rows' copy as the oldest group (RotateQueries waits
  // for it, with the slices' kInt2WarpStages - 1 = 2 groups still pending if they were issued
  // first). copies_after_queries: the first slices are issued after the queries, so the
  // rotation's R_K loads do not queue behind every CTA's first copies.
  static_assert(kInt2WarpStages == 3, "RotateQueries' q_staged wait counts 2 slice groups");
  float* qs = reinterpret_cast<float*>(smem + Int2StageArea<kW>());
  auto first_copies = [&](int from) {
#pragma unroll
    for (int k = 0; k < kInt2WarpStages - 1; ++k) {
      if (kW == kWarps || k >= from) {  // (from is 0 with 4 warps)
        if (k < mine) issue(k, k);
        CpAsyncCommit();
      }
    }
  };
  const bool late_copies = p.copies_after_queries && p.rotate_in_cta;
  // prepared_fragments: the rotation kernel built this pair's int8 query fragments; each lane
  // loads its 64 bytes of them after the first copies (no query area, no CTA barrier).
  const bool prepared = kV8 && !p.rotate_in_cta && p.prepared_fragments;
  // fragments_before_copies: the fragment loads go out before the first copies (volatile, so
  // they stay ahead of the cp.async issue).
  const bool frags_first = prepared && p.fragments_before_copies;
  const uint4* frag_src =
      QueryFragmentArea(p) + size_t(it.seq * static_cast<int>(sh.num_kv_heads) + it.kv_head) * 128 + lane;
  uint4 fw[4] = {};
  // early_slices (8-warp CTAs, fragments before the copies): each warp's first this-many
  // slices go out before the wait for the rotation kernel, the rest of its first copies after
  // the fragment loads.
  const int early = kW != kWarps && frags_first ? min(p.early_slices, kInt2WarpStages - 1) : 0;
#pragma unroll
  for (int k = 0; k < kInt2WarpStages - 1; ++k) {
    if (k < early) {
      if (k < mine) issue(k, k);
      CpAsyncCommit();
    }
  }
  if (frags_first) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
    for (int c = 0; c < 2 + NG; ++c) {
      asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(fw[c].x), "=r"(fw[c].y), "=r"(fw[c].z), "=r"(fw[c].w)
                   : "l"(frag_src + 32 * c));
    }
  }
  if (!late_copies) first_copies(early);
  // l2_prefetch_slices: this warp's next slices after the first copies are prefetched into L2
  // while the CTA waits for its queries (HBM otherwise idles in that prologue); lanes 0-15 take
  // the K code lines, 16-31 the V code lines, lanes 0-1 / 2-3 the K / V parameter lines.
  if (p.l2_prefetch_slices > 0) {
    const int last = min(mine, kInt2WarpStages - 1 + p.l2_prefetch_slices);
    for (int k = kInt2WarpStages - 1; k < last; ++k) {
      const int sl = warp + kW * k;
      const int info = tab.info[sl], tok0 = info >> 16, valid = info & 0xffff;
      const uint8_t* pk = tab.ptr[sl] + seg_k;
      const int line = 128 * (lane & 15);
      if (line < valid * 32) {
        const uint8_t* a = pk + tok0 * 32 + line + (lane >= 16 ? v_minus_k : 0);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
      }
      const int pline = 128 * (lane & 1);
      if (lane < 4 && pline < valid * 4 * NG) {
        const uint8_t* a = pk + codes_bytes + tok0 * 4 * NG + pline + (lane >= 2 ? v_minus_k : 0);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
      }
    }
  }
  if (frags_first) {
  } else if (prepared) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
  } else if constexpr (kW != kWarps) {
    __trap();  // the launch checks: more warps only with prepared fragments
  } else {
    // Query fragments (B operand of the score product): lane (gid, tig) holds query head gid.
    CtaQueries(p, it, qs + 8 * 128, qs,
               reinterpret_cast<float*>(smem + (kInt2WarpStages - 1) * kInt2Slot),
               kInt2WarpStages * kInt2Slot / 4, late_copies ? 0 : kInt2WarpStages - 1,
               *reinterpret_cast<const int*>(smem + kTicketSmemOffset));
  }
  if (late_copies) first_copies(0);
  if (tid == 0) MarkClock(p, kTlQuery);
  const float* qrot = qs;
  uint32_t qhi[8][2], qlo[8][2];
  // For this lane's accumulator columns (query heads 2·tig, 2·tig+1): Σ q per group, and the
  // accumulator start value −1024·Σ q·2^-k that removes the code offset inside the mma.
  float Q0[2][NG], Cinit[2][NG];
  // kV8: int8 query fragments qb[v][h][reg]; for the heads this lane owns after the packed
  // exchange, 1 / (4·S) and Σ q per group.
  uint32_t qb[2][2][2];
  float qinv[2], Q0i[2][NG];
  if constexpr (!kV8) {
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
        const float used = __half2float(h_lo) + __half2float(l_lo) + __half2float(h_hi) +
                           __half2float(l_hi);
        const int g = (G == 64) ? v : 0;
        qhi[s][b] = PackHalf2(h_lo, h_hi);
        qlo[s][b] = PackHalf2(l_lo, l_hi);
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
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        Q0[e][g] = __shfl_sync(0xffffffffu, q0[g], (2 * tig + e) * 4);
        Cinit[e][g] = -1024.f * __shfl_sync(0xffffffffu, q1[g], (2 * tig + e) * 4);
      }
    }
  } else if (prepared) {
    uint4 w[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) w[c] = frags_first ? fw[c] : c < 2 + NG ? __ldcg(frag_src + 32 * c) : make_uint4(0u, 0u, 0u, 0u);
    const uint32_t* wv = reinterpret_cast<const uint32_t*>(w);
#pragma unroll
    for (int i = 0; i < 8; ++i) qb[i >> 2][(i >> 1) & 1][i & 1] = wv[i];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      qinv[e] = __uint_as_float(wv[8 + e]);
#pragma unroll
      for (int g = 0; g < NG; ++g) Q0i[e][g] = __uint_as_float(wv[10 + e + 2 * g]);
    }
  } else if constexpr (kW == kWarps) {
    Int8QueryFragments<G>(qrot, gqa, lane, qb, qinv, Q0i);
  }
  if (!prepared) __syncthreads();  // the query area becomes the W exchange
  // fp16 value product: the W row of query head h in its group (DecodeParams::linear_w_rows).
  auto wrow = [&](int h) { return p.linear_w_rows ? h : ((h & 1) << 2) | (h >> 1); };
  // kV8: the value accumulators (int32; [mt][0/1]: high / low part of head tig, row gid;
  // [mt][2/3]: row gid + 8; in units 1/c of that head), the weight units c of this lane's
  // softmax heads (+inf until the first weights set them), the code-word offsets of the 4
  // slots, the transpose selectors, and the W word offsets this lane stores (high and low
  // part, per head e) and loads.
  int vacc[8][4];
  float cref[2] = {INFINITY, INFINITY};
  int voff[4] = {0, 0, 0, 0};
  int wsth[2] = {0, 0}, wstl[2] = {0, 0}, wld = 0;
  const int vsrc = (lane & ~3) | (tig >> 1);  // a lane whose softmax heads include head tig
  if constexpr (kV8) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) vacc[i][c] = 0;
    // This lane's ldmatrix row: matrix m = lane >> 3 (half m >> 1; tokens +32 if m is odd),
    // row rr = lane & 7 (quad of lane tig' = rr >> 1 in the mma, token +8 if rr is odd).
    const int m = lane >> 3, rr = lane & 7, tq = rr >> 1;
#pragma unroll
    for (int sl = 0; sl < 4; ++sl) {
      const int tok = 16 * (tq >> 1) + 4 * (tq & 1) + ((sl + tq) & 3) + 8 * (rr & 1) + 32 * (m & 1);
      voff[sl] = Opaque(tok * 32 + 16 * ((m >> 1) ^ ((tok >> 3) & 1)));
    }
    const int tr = 2 * (tig >> 1) + (gid >> 2), pos = 4 * tr + (((gid & 3) - tr) & 3);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      wsth[e] = Opaque(32 * (2 * (tig & 1) + e) + 16 * (e ^ (tig & 1)) + pos);
      wstl[e] = Opaque(32 * (2 * (tig & 1) + e) + 16 * (1 ^ e ^ (tig & 1)) + pos);
    }
    wld = Opaque(32 * (gid >> 1) + 16 * ((gid ^ (gid >> 1) ^ (gid >> 2)) & 1) + 4 * tig);
  }

  if (tid == 0) {
    MarkClock(p, kTlLoop);
    MarkNs(p, kTlLoopNs);
  }
  int stage_c = 0;                         // stage of the slice computed next
  int stage_i = kInt2WarpStages - 1;       // stage the next issue writes
  for (int k = 0; k < mine; ++k) {
    CpAsyncWait<kInt2WarpStages - 2>();
    __syncwarp();
    if (k + kInt2WarpStages - 1 < mine) issue(k + kInt2WarpStages - 1, stage_i);
    CpAsyncCommit();
    stage_i = stage_i + 1 == kInt2WarpStages ? 0 : stage_i + 1;
    const int sl = warp + kW * k;
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
    constexpr int NT = kV8 ? 2 : 4;
    float ps[NT][4];
    if constexpr (kV8) {
      int acc[4][NG][4];
      uint32_t wd[4][2][2];  // [m-tile][row gid / gid+8][word v]
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int g = 0; g < NG; ++g)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[mt][g][c] = 0;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint8_t* row = kc + (mt * 16 + gid + 8 * r) * 32;
          if (G == 128) {
            const uint2 w = *reinterpret_cast<const uint2*>(row + 8 * tig);
            wd[mt][r][0] = w.x;
            wd[mt][r][1] = w.y;
          } else {
#pragma unroll
            for (int v = 0; v < 2; ++v) wd[mt][r][v] = *reinterpret_cast<const uint32_t*>(row + Lay::KWordByte(tig, v));
          }
        }
      }
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int g = (G == 64) ? v : 0;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            const uint32_t x0 = hh ? wd[mt][0][v] >> 4 : wd[mt][0][v];
            const uint32_t x1 = hh ? wd[mt][1][v] >> 4 : wd[mt][1][v];
            MmaU8S8(acc[mt][g], And(x0, 0x03030303u), And(x1, 0x03030303u), And(x0, 0x0C0C0C0Cu),
                    And(x1, 0x0C0C0C0Cu), qb[v][hh][0], qb[v][hh][1]);
          }
        }
      }
      // The packed exchange: 256·high + low of each head (lanes tig 0, 1 hold the high parts
      // and keep the even m-tiles, tig 2, 3 the low parts and the odd m-tiles), then the
      // query scale 1 / (4·S), the K scale and Σ q·min per token.
      const bool upper = tig >= 2;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float tot[NG][4];
#pragma unroll
        for (int g = 0; g < NG; ++g)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const float a = static_cast<float>(acc[2 * j][g][c]);
            const float b = static_cast<float>(acc[2 * j + 1][g][c]);
            const float other = __shfl_xor_sync(0xffffffffu, upper ? a : b, 2);
            // upper: own low part b + 256 · the partner's high part; lower: 256 · a + low.
            tot[g][c] = upper ? fmaf(other, 256.f, b) : fmaf(a, 256.f, other);
          }
        const int mt = 2 * j + (tig >> 1);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int t = mt * 16 + gid + 8 * r;
          float sv[2];
#pragma unroll
          for (int g = 0; g < NG; ++g) {
            const float2 sm = __half22float2(*reinterpret_cast<const __half2*>(kp + (t * NG + g) * 4));
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float x = fmaf(sm.x * qinv[e], tot[g][2 * r + e], sm.y * Q0i[e][g]);
              sv[e] = g == 0 ? x : sv[e] + x;
            }
          }
#pragma unroll
          for (int e = 0; e < 2; ++e) ps[j][2 * r + e] = sv[e];
        }
      }
      if (valid < static_cast<int>(kSliceTokens)) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c)
            if ((2 * j + (tig >> 1)) * 16 + gid + 8 * (c >> 1) >= valid) ps[j][c] = -INFINITY;
      }
    } else {
      // Accumulators per m-tile: one per group.
      float acc[4][NG][4];
      uint32_t wd[4][2][2], w8[4][2][2];  // [m-tile][row gid / gid+8][word v], and >> 8
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int a = 0; a < NG; ++a) {
          acc[mt][a][0] = acc[mt][a][2] = Cinit[0][a];
          acc[mt][a][1] = acc[mt][a][3] = Cinit[1][a];
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
          float sv[2];
#pragma unroll
          for (int g = 0; g < NG; ++g) {
            const float2 sm = __half22float2(*reinterpret_cast<const __half2*>(kp + (t * NG + g) * 4));
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float x = fmaf(sm.x, acc[mt][g][2 * r + e], sm.y * Q0[e][g]);
              sv[e] = g == 0 ? x : sv[e] + x;
            }
          }
#pragma unroll
          for (int e = 0; e < 2; ++e) sc[mt][2 * r + e] = sv[e];
        }
      }
    }
    if (!kV8 && valid < static_cast<int>(kSliceTokens)) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (mt * 16 + gid + 8 * (c >> 1) >= valid) sc[mt][c] = -INFINITY;
    }
    // kV8 (packed heads) left each lane the scores of tiles mt = 2j + (tig >> 1), heads
    // 2·(tig & 1) + e, in ps already.
    if constexpr (!kV8) {
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
      if (kV8) cm[e] = fmaxf(cm[e], __shfl_xor_sync(0xffffffffu, cm[e], 2));
    }
    if (__any_sync(0xffffffffu, cm[0] > st.m[0] || cm[1] > st.m[1])) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float f;
        if constexpr (kV8) {
          // The int32 value accumulators keep their units: c = 2^(m - R) follows the max.
          const float m_new = fmaxf(st.m[e], cm[e]);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;
          f = Ex2(st.m[e] - m_use);
          cref[e] *= Ex2(m_use - st.m[e]);
          st.m[e] = m_new;
          st.l[e] *= f;
        } else {
          Rescale(st, e, cm[e], &f);
        }
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
    if constexpr (kV8) {
      // Weights of this lane's tokens (j, r) -> byte i = 2j + r, as 2^23 + round(p·scale·c).
      uint32_t y[NG][2][4];
      float prv[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = (2 * (i >> 1) + (tig >> 1)) * 16 + gid + 8 * (i & 1);
        float pc[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          prv[i][e] = Ex2(ps[i >> 1][2 * (i & 1) + e] - mu[e]);
          st.l[e] += prv[i][e];
          pc[e] = prv[i][e] * cref[e];
        }
#pragma unroll
        for (int g = 0; g < NG; ++g) {
          const float2 sm = __half22float2(*reinterpret_cast<const __half2*>(vp + (t * NG + g) * 4));
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            pm[e][g] = fmaf(prv[i][e], sm.y, pm[e][g]);
            y[g][e][i] = __float_as_uint(fmaf(pc[e], sm.x, kV8Magic));
          }
        }
      }
      uint32_t bits = 0;
#pragma unroll
      for (int g = 0; g < NG; ++g)
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
          for (int i = 0; i < 4; ++i) bits |= y[g][e][i];
      // A weight past 65535 (or the units not set yet: c = inf): new units for that head, the
      // accumulators shifted to them (once per warp item, then when a weight grows past 2x the
      // one that set the units).
      if (__any_sync(0xffffffffu, (bits & 0x00FF0000u) != 0)) {
        bool set = false, shifted = false;
        int d[2] = {0, 0};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float M = 0.f;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int t = (2 * (i >> 1) + (tig >> 1)) * 16 + gid + 8 * (i & 1);
#pragma unroll
            for (int g = 0; g < NG; ++g)
              M = fmaxf(M, prv[i][e] * __half2float(*reinterpret_cast<const __half*>(vp + (t * NG + g) * 4)));
          }
          M = WarpMaxOverGid(M);
          M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 2));  // the head's other tokens
          const float need = M * cref[e];
          if (M > 0.f && !(need <= 65535.f)) {
            d[e] = 64;
            if (!isinf(cref[e])) {
              d[e] = ((__float_as_int(need) >> 23) & 0xff) - 127 + 1 - kV8RefBits;
              shifted = true;
            } else {
              set = true;
            }
            if (d[e] >= 64) {
              d[e] = 64;
              cref[e] = static_cast<float>(1 << kV8RefBits) / M;
            } else {
              cref[e] *= __int_as_float((127 - d[e]) << 23);
            }
          }
          const float cu = M > 0.f ? cref[e] : 0.f;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int t = (2 * (i >> 1) + (tig >> 1)) * 16 + gid + 8 * (i & 1);
#pragma unroll
            for (int g = 0; g < NG; ++g) {
              const float sc = __half2float(*reinterpret_cast<const __half*>(vp + (t * NG + g) * 4));
              y[g][e][i] = __float_as_uint(fmaf(prv[i][e] * cu, sc, kV8Magic));
            }
          }
        }
        // Accumulators of head tig to the new units: floor((256·high + low) / 2^d), as a
        // canonical pair again (low < 256). A head's first units find them zero.
        if (__any_sync(0xffffffffu, shifted)) {
          const int d0 = __shfl_sync(0xffffffffu, d[0], vsrc), d1 = __shfl_sync(0xffffffffu, d[1], vsrc);
          const int dh = (tig & 1) ? d1 : d0;
          if (dh > 0) {
#pragma unroll
            for (int mt = 0; mt < 8; ++mt)
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                uint64_t v = (static_cast<uint64_t>(static_cast<uint32_t>(vacc[mt][2 * r])) << 8) +
                             static_cast<uint32_t>(vacc[mt][2 * r + 1]);
                v = dh >= 64 ? 0 : v >> dh;
                vacc[mt][2 * r] = static_cast<int>(v >> 8);
                vacc[mt][2 * r + 1] = static_cast<int>(v & 0xffu);
              }
          }
        }
        if (p.int8_value_stats != nullptr) {
          set = __any_sync(0xffffffffu, set);
          shifted = __any_sync(0xffffffffu, shifted);
          if (lane == 0 && set) atomicAdd(p.int8_value_stats, 1u);
          if (lane == 0 && shifted) atomicAdd(p.int8_value_stats + 1, 1u);
        }
      }
      uint32_t* wx32 = reinterpret_cast<uint32_t*>(wx);
#pragma unroll
      for (int g = 0; g < NG; ++g)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const uint32_t x01 = __byte_perm(y[g][e][0], y[g][e][1], 0x5410);
          const uint32_t x23 = __byte_perm(y[g][e][2], y[g][e][3], 0x5410);
          wx32[g * 128 + wsth[e]] = __byte_perm(x01, x23, 0x7531);  // high bytes
          wx32[g * 128 + wstl[e]] = __byte_perm(x01, x23, 0x6420);  // low bytes
        }
      __syncwarp();
      uint32_t wb[NG][4];
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        const uint4 x = *reinterpret_cast<const uint4*>(wx32 + g * 128 + wld);
        wb[g][0] = x.x;
        wb[g][1] = x.y;
        wb[g][2] = x.z;
        wb[g][3] = x.w;
      }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        uint32_t R[2][4];  // [register b of the k-step][byte b]
#pragma unroll
        for (int rb = 0; rb < 2; ++rb) {
          uint32_t x[4];
          LdMatrixX4Trans(x, SmemAddr(vc) + voff[2 * ks + rb]);
          R[rb][0] = __byte_perm(x[0], x[1], 0x6420);
          R[rb][1] = __byte_perm(x[0], x[1], 0x7531);
          R[rb][2] = __byte_perm(x[2], x[3], 0x6420);
          R[rb][3] = __byte_perm(x[2], x[3], 0x7531);
        }
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) {
          const int b = mt >> 1, g = G == 64 ? mt >> 2 : 0;
          const uint32_t m0 = 0x03030303u << (4 * (mt & 1)), m1 = m0 << 2;
          MmaU8U8(vacc[mt], And(R[0][b], m0), And(R[0][b], m1), And(R[1][b], m0),
                  And(R[1][b], m1), wb[g][2 * ks], wb[g][2 * ks + 1]);
        }
      }
    } else {
      // W columns are stored in the value product's token order (see below), so each lane's
      // B operand is one 32-bit load and its code loads hit 32 distinct banks.
      const int wcol0 = gid < 4 ? 2 * gid : 2 * gid - 7;
      const int head0 = 2 * tig;
      const int wr0 = wrow(head0), wr1 = wrow(head0 + 1), wrl = wrow(gid);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int mt = j;
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
            wx[(g * 8 + wr0) * kWStride + wc] = __low2half(w2);
            wx[(g * 8 + wr1) * kWStride + wc] = __high2half(w2);
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
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(wx + (g * 8 + wrl) * kWStride + wcb);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(wx + (g * 8 + wrl) * kWStride + wcb + 8);
#pragma unroll
          for (int ii = 0; ii < 4; ++ii) {
            const int i = half * 4 + ii;
            MmaF16(st.o[i], ra[2 * ii], ra[2 * ii + 1], rb[2 * ii], rb[2 * ii + 1], b0, b1);
          }
          // 1024·Σ W: the same product with every code 0 (exactly what the offsets added).
          if (G == 64 || half == 0) MmaF16(sw[g], magic, magic, magic, magic, b0, b1);
        }
      }
    }
    __syncwarp();
  }
  if constexpr (kW == kWarps) {
    if (lane == 0) MarkClock(p, kTlWarpEnd + warp);
  } else if (lane == 0) {
    MarkClock(p, warp < 4 ? kTlWarpEnd + warp : kTlWarpEnd4 + warp - 4);
  }
  CpAsyncWait<0>();
  // 4 warps: the states are written over the first rings (FinishItem), after every warp's loop.
  // More warps: each warp writes its state into its own ring; the first barrier is FinishItem's
  // after the states.
  if constexpr (kW == kWarps) __syncthreads();
  if (kW != kWarps && tid == 0) MarkClock(p, kTlLoopsDone);

  // Remove the code offsets and factors, add Σ p·min.
#pragma unroll
  for (int e = 0; e < 2; ++e) {
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      pm[e][g] = WarpSumOverGid(pm[e][g]);
      // Packed: lanes tig and tig ^ 2 hold the same head's partial sums (even / odd tiles).
      if (kV8) pm[e][g] += __shfl_xor_sync(0xffffffffu, pm[e][g], 2);
    }
    if (kV8) st.l[e] += __shfl_xor_sync(0xffffffffu, st.l[e], 2);
  }
  if constexpr (kV8) {
    // Σ W·code of head tig = (256·high + low) / c, each row times 4^-j; then lanes tig 0, 1
    // take heads 2·tig + e from lanes 2·tig + e (FinishItem's layout; lanes tig 2, 3 end up
    // with heads >= 4, which it ignores at GQA <= 4).
    if (p.int8_value_stats != nullptr && lane == 0) atomicAdd(p.int8_value_stats + 2, static_cast<uint32_t>(mine));
    const float c0 = __shfl_sync(0xffffffffu, cref[0], vsrc), c1 = __shfl_sync(0xffffffffu, cref[1], vsrc);
    // c = inf: no weights (unit 0; the fast division gives 0 for a divisor past 2^126 too).
    const float unit = FinishDiv<kW>(1.f, (tig & 1) ? c1 : c0);
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      const int g = (G == 64) ? mt >> 2 : 0;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float inv = 1.0f / static_cast<float>(1 << (2 * (2 * (mt & 1) + r)));
        const float v = fmaf(static_cast<float>(vacc[mt][2 * r]), 256.f, static_cast<float>(vacc[mt][2 * r + 1])) *
                        (unit * inv);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = __shfl_sync(0xffffffffu, v, (lane & ~3) | ((2 * tig + e) & 3));
          st.o[mt][2 * r + e] = x + pm[e][g];
        }
      }
    }
    if (kW == 8 && tid == 0) MarkClock(p, kTlEpilogue);
    FinishItem<kW, kW != kWarps>(p, item, it, st, smem,
                                 [&](int i, int r) { return 64 * (i >> 2) + 8 * gid + 2 * (i & 3) + r; });
  } else {
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
    FinishItem<kW, kW != kWarps>(p, item, it, st, smem, [&](int i, int r) {
      const int half = i >> 2, cidx = 2 * (i & 3) + r;
      return G == 128 ? 16 * gid + 8 * half + cidx : 64 * half + 8 * gid + cidx;
    });
  }
}

}  // namespace
}  // namespace oscarkv::cuda
