// Plain prefill (the sequences of an extend launch without prefix pages) on Hopper tensor cores
// (wgmma, sm_90a): the second launch of LaunchExtendWgmma (extend_attention_wgmma.cu, whose
// paged kernel skips these sequences; see extend_attention.h for the function).
//
// Work items as the paged kernel's CTAs: 128 query rows (the KV head's GQA group of query heads
// for 128 / gqa consecutive new tokens), sequence, KV head. Persistent CTAs, one per SM, four
// warpgroups:
//   * warpgroups 0 and 1 (producers, 96 registers per thread after setmaxnreg) convert each
//     item's R_K into one of two rotation buffers and load its key tiles of 64 new tokens --
//     bf16 rows by TMA (four boxes, one thread; 16-byte cp.async by all producers for a
//     sequence's partial last tile, which a box would overrun) -- straight into a 5-stage ring of
//     wgmma operand tiles (natural channel order, 128-byte swizzle), handed over with mbarriers.
//   * warpgroups 2 and 3 (consumers, 160 registers) as in the paged kernel, with bf16 query,
//     keys, values and probabilities (no conversion pass).

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "device_util.cuh"
#include "extend_internal.h"
#include "extend_wgmma.cuh"

namespace oscarkv::cuda::detail {
namespace {

constexpr int kXProducers = 256;  // two producer warpgroups
constexpr int kXThreads = kXProducers + 256;
// Registers per thread after setmaxnreg: the producers give theirs to the consumers (the CTA's
// 65536 = 256 x 96 + 256 x 160).
constexpr int kXProducerRegs = 96, kXConsumerRegs = 160;
constexpr int kXTile = 16384;        // 64 keys x 128 fp16: two 64-channel halves of 8 KiB
constexpr int kXStage = 2 * kXTile;  // K and V
constexpr int kXRot = 32768;         // a 128 x 128 fp16 rotation as a B operand
// Shared memory: the stages, two rotation / query buffers (the producers convert the next work
// item's R_K into one while the consumers run the current item out of the other), the tiles'
// (valid, first token), barriers: full and empty per stage, then full and empty per buffer.
constexpr int kXDenseStages = 5;
constexpr int kXDenseRotOff = kXDenseStages * kXStage;
constexpr int kXDenseInfoOff = kXDenseRotOff + 2 * kXRot;
constexpr int kXDenseBarOff = kXDenseInfoOff + 8 * kXDenseStages;
constexpr int kXDenseSmemBytes = kXDenseBarOff + 8 * (2 * kXDenseStages + 4) + 1024;
static_assert(kXDenseRotOff % 1024 == 0 && kXDenseSmemBytes <= 232448, "dense shared memory layout");
constexpr float kXLog2e = 1.4426950408889634f;
constexpr float kXLn2 = 0.6931471805599453f;
constexpr int kBarConsumers = 2, kBarTurn0 = 3;  // named barrier ids (3, 4: turns)

// Tensor maps of the new tokens' K and V rows ([rows][num_kv_heads][128] bf16) for the dense
// kernel's TMA tile loads: boxes of 64 channels x 1 head x 64 rows, 128-byte swizzle.
struct XMaps {
  CUtensorMap k, v;
};

__device__ __forceinline__ float XEx2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// kDiag 5 (bench diagnostic, outputs wrong): the producers hand over tiles without loading them.
// CTA c of G runs work items c, 2G - 1 - c, 2G + c, ... (each round in the other direction, the
// items of a round of similar weight) with one ring over all of them, so that the producers load
// the next item's first tiles and convert its R_K while the consumers finish the current one.
template <int kDiag = 0>
__global__ void __launch_bounds__(kXThreads, 1) ExtendDenseKernel(const ExtendParams p, const int items_x,
                                                                   const __grid_constant__ XMaps maps) {
  constexpr int kSt = kXDenseStages;
  constexpr bool kTma = kDiag != 5;
#if OSCARKV_HAVE_WGMMA
  extern __shared__ uint8_t smem_raw_base[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw_base) + 1023) & ~uintptr_t(1023));
  const DecodeShape& sh = p.shape;
  const int H = static_cast<int>(sh.num_kv_heads), Hq = static_cast<int>(sh.num_q_heads);
  const int gqa = static_cast<int>(sh.gqa());
  const int tpc = kExtendWgmmaRows / gqa;  // tokens per item
  const int total_items = static_cast<int>(p.table.num_seqs) * H * items_x;
  // The items of this CTA in order: calls f(item) for each that this kernel runs.
  auto for_items = [&](auto&& f) {
    const int c = blockIdx.x, g = gridDim.x;
    for (int k = 0; k * g < total_items; ++k) {
      const int i = k * g + ((k & 1) ? g - 1 - c : c);
      XItem it;
      if (i < total_items && XLoadItem(p, i, items_x, tpc, true, it)) f(it);
    }
  };
  const int role = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);  // warpgroup
  const uint32_t sbase = SmemAddr(smem);
  const uint32_t full_bar = sbase + kXDenseBarOff, empty_bar = full_bar + 8 * kSt;
  // R_K of a buffer written (by the producers), the buffer released (by the consumers).
  const uint32_t rfull_bar = empty_bar + 8 * kSt, rempty_bar = rfull_bar + 16;
  int2* info = reinterpret_cast<int2*>(smem + kXDenseInfoOff);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSt; ++s) {
      MbarInit(full_bar + 8 * s, kXProducers);
      MbarInit(empty_bar + 8 * s, 256);
    }
    for (int b = 0; b < 2; ++b) {
      MbarInit(rfull_bar + 8 * b, kXProducers);
      MbarInit(rempty_bar + 8 * b, 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (role < 2) {
    // ---------------- producers ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kXProducerRegs));
    const int tid = threadIdx.x;
    {
      // Per item n of the CTA: R_K of its KV head into rotation buffer n % 2 (once the
      // consumers released the buffer's previous item), an L2 prefetch of its query rows, then
      // its tiles: tile x = new tokens [64x, 64x + 64), bf16 rows loaded into the ring's next
      // stage once the consumers released the stage's previous tile. A TMA tile completes its
      // full barrier by itself (transaction bytes); a cp.async tile is handed over once its
      // copies have landed -- at once when TMA loads the others (diag 5: kSt - 2 tiles later) --
      // and every pending tile before an item's R_K wait, which may block on the consumers
      // finishing the item before.
      int issued = 0, arrived = 0, n = 0;
      auto hand_over = [&]() {
        FenceProxyAsync();
        MbarArrive(full_bar + 8 * (arrived % kSt));
        ++arrived;
      };
      for_items([&](const XItem& it) {
        CpAsyncWait<0>();
        while (arrived < issued) hand_over();
        const int b = n & 1;
        MbarWaitParity(rempty_bar + 8 * b, ((n >> 1) & 1) ^ 1);
        if (p.rot_k != nullptr) XStoreRotK<true, 2>(smem + kXDenseRotOff + b * kXRot, p.rot_k + size_t(it.h) * 128 * 128, tid);
        FenceProxyAsync();
        MbarArrive(rfull_bar + 8 * b);
        const int last_tok = min(it.num_new, it.tok0 + tpc) - 1;
        const int num_tiles = (last_tok + 64) / 64;
        {  // the query rows: (last_tok - tok0 + 1) tokens of gqa heads, 512 bytes per head
          const float* q = p.q + (size_t(it.q_begin + it.tok0) * Hq + size_t(it.h) * gqa) * 128;
          const int lines = (last_tok - it.tok0 + 1) * gqa * 4;
          for (int l = tid; l < lines; l += kXProducers) {
            const int per_tok = gqa * 4;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(q + size_t(l / per_tok) * Hq * 128 + (l % per_tok) * 32));
          }
        }
        for (int x = 0; x < num_tiles; ++x) {
          const int stage = issued % kSt;
          MbarWaitParity(empty_bar + 8 * stage, ((issued / kSt) & 1) ^ 1);
          const int n0 = 64 * x, valid = min(64, it.num_new - n0);
          if (kTma && valid == 64) {  // one box per 64-channel half of K and V, on the full barrier
            if (tid == 0) {
              info[stage] = make_int2(valid, n0);
              const uint32_t st = sbase + stage * kXStage, bar = full_bar + 8 * stage;
              MbarArriveExpectTx(bar, kXStage);
#pragma unroll
              for (int u = 0; u < 4; ++u) {
                TmaLoad3d(st + (u >> 1) * kXTile + (u & 1) * 8192, (u >> 1) ? &maps.v : &maps.k, 64 * (u & 1), it.h,
                          it.q_begin + n0, bar);
              }
            } else {
              MbarArrive(full_bar + 8 * stage);
            }
            ++issued;
            ++arrived;
            continue;
          }
          uint8_t* st = smem + stage * kXStage;
          for (int c = tid; c < (kDiag == 5 ? 0 : 2048); c += kXProducers) {
            const int kv = c >> 10, row = (c >> 4) & 63, ch = c & 15;
            const bool ok = row < valid;
            const uint16_t* base = kv ? p.v_new : p.k_new;
            const uint16_t* src = ok ? base + (size_t(it.q_begin + n0 + row) * H + it.h) * 128 + ch * 8 : base;
            CpAsync16(st + kv * kXTile + (ch >> 3) * 8192 + Swizzle128(row, ch & 7), src, ok);
          }
          if (tid == 0) info[stage] = make_int2(valid, n0);
          CpAsyncCommit();
          ++issued;
          if (kTma) {  // (the TMA tiles count on no pending copies)
            CpAsyncWait<0>();
            while (arrived < issued) hand_over();
          } else if (issued - arrived > kSt - 2) {
            CpAsyncWait<kSt - 2>();
            hand_over();
          }
        }
        ++n;
      });
      CpAsyncWait<0>();
      while (arrived < issued) hand_over();
      return;
    }
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kXConsumerRegs));
  const int ctid = threadIdx.x - kXProducers, wg = role - 2, warp = (ctid >> 5) & 3, lane = ctid & 31;
  const int gid = lane >> 2, tig = lane & 3;
  const int used_rows = tpc * gqa;
  const int r0 = 64 * wg + 16 * warp + gid, r1 = r0 + 8;
  const float scale = (p.softmax_scale > 0 ? p.softmax_scale : 0.08838834764831845f) * kXLog2e;
  const int my_turn = kBarTurn0 + wg, other_turn = kBarTurn0 + (wg ^ 1);
  // One item: its query rotated by the R_K at rot_off (written by the producers), then written
  // over it as the score product's A operand; its tiles are the ring's gbase, gbase + 1, ...;
  // returns how many.
  auto run_item = [&](const XItem& it, const int rot_off, const int gbase) -> int {
    const int h = it.h, q_begin = it.q_begin, num_new = it.num_new, tok0 = it.tok0;
    const int num_tiles = (min(num_new, tok0 + tpc) - 1 + 64) / 64;
    auto row_tok = [&](int r) { return r < used_rows ? tok0 + r / gqa : -1; };
    const int tok_r0 = row_tok(r0), tok_r1 = row_tok(r1);
    const int wg_first_tok = row_tok(64 * wg);
    const int wg_last_tok = min(row_tok(min(64 * wg + 63, used_rows - 1)), num_new - 1);
    auto q_row = [&](int r, int tok) -> const float* {
      return p.q + (size_t(q_begin + tok) * Hq + size_t(h) * gqa + r % gqa) * 128;
    };
    const bool ok_r0 = tok_r0 >= 0 && tok_r0 < num_new, ok_r1 = tok_r1 >= 0 && tok_r1 < num_new;
    const uint32_t rot_addr = sbase + rot_off;

    // The scaled, rotated query of the warpgroup's 64 rows as the score product's A operand: a
    // K-major 64 x 128 fp16 tile (two swizzled 64-position halves) in the rotation area, once
    // both warpgroups' R_K products are done.
    uint8_t* q_tile = smem + rot_off + wg * kXTile;
    const int qrow0 = 16 * warp + gid;  // rows r0, r1 within the warpgroup's tile
    auto store_q = [&](int row, int pos, float a, float b) {
      *reinterpret_cast<uint32_t*>(q_tile + (pos >> 6) * 8192 + Swizzle128(row, (pos & 63) >> 3) + 2 * (pos & 7)) =
          PackPair<true>(a, b);
    };
    if (p.rot_k != nullptr) {
      uint32_t ah[8][4], al[8][4];
#pragma unroll
      for (int s = 0; s < 8; ++s) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool ok = (j & 1) ? ok_r1 : ok_r0;
          const int col = 16 * s + 8 * (j >> 1) + 2 * tig;
          const float2 v = ok ? *reinterpret_cast<const float2*>(q_row((j & 1) ? r1 : r0, (j & 1) ? tok_r1 : tok_r0) + col)
                              : make_float2(0.f, 0.f);
          const __half2 hv = __floats2half2_rn(v.x, v.y);
          const float2 back = __half22float2(hv);
          ah[s][j] = Half2Bits(hv);
          al[s][j] = Half2Bits(__floats2half2_rn(v.x - back.x, v.y - back.y));
        }
      }
      float y0[32], y1[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) y0[i] = y1[i] = 0.f;
      WgmmaFenceAcc(y0, y1);
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const uint64_t d = SwizzledDesc(SwizzledDescLo(rot_addr + (s >> 2) * 16384 + (s & 3) * 32));
        WgmmaF16N128R<1, 0>(y0, y1, ah[s], d);
        WgmmaF16N128R<1, 0>(y0, y1, al[s], d);
      }
      WgmmaCommit();
      WgmmaWait(y0, y1);
      NamedBarrier(kBarConsumers, 256);  // both warpgroups' R_K products are done
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        store_q(qrow0, 8 * j + 2 * tig, y0[2 * j] * scale, y0[2 * j + 1] * scale);
        store_q(qrow0 + 8, 8 * j + 2 * tig, y1[2 * j] * scale, y1[2 * j + 1] * scale);
      }
    } else {
#pragma unroll 4
      for (int j = 0; j < 16; ++j) {
        const int pos = 8 * j + 2 * tig;
        const float* q0 = ok_r0 ? q_row(r0, tok_r0) : nullptr;
        const float* q1 = ok_r1 ? q_row(r1, tok_r1) : nullptr;
        store_q(qrow0, pos, ok_r0 ? q0[pos] * scale : 0.f, ok_r0 ? q0[pos + 1] * scale : 0.f);
        store_q(qrow0 + 8, pos, ok_r1 ? q1[pos] * scale : 0.f, ok_r1 ? q1[pos + 1] * scale : 0.f);
      }
    }
    FenceProxyAsync();
    NamedBarrier(kBarConsumers, 256);
    const uint32_t q_addr = SmemAddr(q_tile);

    // Main loop. Per tile x (warpgroups taking turns to issue, through two named barriers, so that
    // one's softmax runs while the other's products are on the tensor cores): issue S_x = Q·K_xᵀ
    // and O += P_{x-1}·V_{x-1}; wait for S_x; mask and softmax it; wait for the value product
    // (releasing tile x-1's stage), rescale O and keep P_x for the next turn.
    float o0[32], o1[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) o0[i] = o1[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    uint32_t pa[4][4];
    if (wg == 1) NamedBarrierArrive(kBarTurn0, 256);  // warpgroup 0 issues first
    auto issue_scores = [&](int stage, float (&s0)[16], float (&s1)[16]) {
      const uint32_t kt = sbase + stage * kXStage;
      WgmmaFence32(s0, s1);
      WgmmaF16N64SS<0, true>(s0, s1, SwizzledDesc(SwizzledDescLo(q_addr)), SwizzledDesc(SwizzledDescLo(kt)));
#pragma unroll
      for (int s = 1; s < 8; ++s) {
        const uint32_t off = (s >> 2) * 8192 + (s & 3) * 32;
        WgmmaF16N64SS<1, true>(s0, s1, SwizzledDesc(SwizzledDescLo(q_addr + off)), SwizzledDesc(SwizzledDescLo(kt + off)));
      }
      WgmmaCommit();
    };
    auto issue_values = [&](int stage) {
      const uint32_t vt = sbase + stage * kXStage + kXTile;
      WgmmaFence64(o0, o1, pa);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) WgmmaF16N128R<1, 1, true>(o0, o1, pa[kk], ValueTileDesc(vt + kk * 2048));
      WgmmaCommit();
    };
    // Masks and the online softmax of one tile's scores (in place: s becomes p); returns the
    // factors the output rows are rescaled by.
    auto softmax = [&](float (&s0)[16], float (&s1)[16], int valid, int new0, float& f0, float& f1) {
      if (valid < 64 || (new0 >= 0 && new0 + 63 > wg_first_tok)) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int k = 8 * j + 2 * tig + e;
            const bool in = k < valid;
            if (!(in && (new0 < 0 || new0 + k <= tok_r0))) s0[2 * j + e] = -INFINITY;
            if (!(in && (new0 < 0 || new0 + k <= tok_r1))) s1[2 * j + e] = -INFINITY;
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
      const float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);
      const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
      f0 = XEx2(m[0] - mu0);
      f1 = XEx2(m[1] - mu1);
      m[0] = mn0;
      m[1] = mn1;
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        s0[i] = XEx2(s0[i] - mu0);
        s1[i] = XEx2(s1[i] - mu1);
        sum0 += s0[i];
        sum1 += s1[i];
      }
      l[0] = l[0] * f0 + sum0;
      l[1] = l[1] * f1 + sum1;
    };
    auto make_p = [&](const float (&s0)[16], const float (&s1)[16]) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        pa[kk][0] = PackPair<true>(s0[4 * kk], s0[4 * kk + 1]);
        pa[kk][1] = PackPair<true>(s1[4 * kk], s1[4 * kk + 1]);
        pa[kk][2] = PackPair<true>(s0[4 * kk + 2], s0[4 * kk + 3]);
        pa[kk][3] = PackPair<true>(s1[4 * kk + 2], s1[4 * kk + 3]);
      }
    };
    auto tile_info = [&](int stage, int& valid, int& new0) {
      const int2 ti = info[stage];
      valid = __shfl_sync(0xffffffffu, ti.x, 0);
      new0 = __shfl_sync(0xffffffffu, ti.y, 0);
    };
    {  // tile 0
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
    // Tile x (warpgroups taking turns to issue, through two named barriers, so that one's
    // softmax runs while the other's products are on the tensor cores): issue S_x = Q·K_xᵀ and
    // O += P_{x-1}·V_{x-1}; wait for S_x; mask and softmax it; wait for the value product
    // (releasing tile x-1's stage); rescale O and keep P_x for the next turn.
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
      WgmmaWaitValues(o0, o1, pa);
      MbarArrive(empty_bar + 8 * prev);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        o0[i] *= f0;
        o1[i] *= f1;
      }
      make_p(s0, s1);
    }
    // The last value product, in turn (the turn barriers end balanced: warpgroup 0 then takes the
    // arrival warpgroup 1 leaves after its last issue).
    NamedBarrier(my_turn, 256);
    issue_values((gbase + num_tiles - 1) % kSt);
    NamedBarrierArrive(other_turn, 256);
    WgmmaWaitValues(o0, o1, pa);
    MbarArrive(empty_bar + 8 * ((gbase + num_tiles - 1) % kSt));
    if (wg == 0) NamedBarrier(my_turn, 256);

    // Epilogue: normalize, optionally unrotate (O·R_Vᵀ on tensor cores), write.
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
      inv[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;
    }
    const int hg0 = h * gqa + r0 % gqa, hg1 = h * gqa + r1 % gqa;
    float* out0 = ok_r0 ? p.out + (size_t(q_begin + tok_r0) * Hq + hg0) * 128 : nullptr;
    float* out1 = ok_r1 ? p.out + (size_t(q_begin + tok_r1) * Hq + hg1) * 128 : nullptr;
    if (tig == 0 && p.lse != nullptr) {
      if (ok_r0) p.lse[size_t(q_begin + tok_r0) * Hq + hg0] = l[0] > 0.f ? (m[0] + log2f(l[0])) * kXLn2 : -INFINITY;
      if (ok_r1) p.lse[size_t(q_begin + tok_r1) * Hq + hg1] = l[1] > 0.f ? (m[1] + log2f(l[1])) * kXLn2 : -INFINITY;
    }
    if (p.unrotate_output) {
      NamedBarrier(kBarConsumers, 256);  // both warpgroups are past their R_K product
      // R_V as a K-major B operand: n-row = output channel i, k = position (R_V[i][ExtendChannel(k)]).
      const float4* r = reinterpret_cast<const float4*>(p.rot_v + size_t(h) * 128 * 128);
      for (int v0 = ctid; v0 < 128 * 32; v0 += 256 * 8) {
        float4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = r[v0 + 256 * u];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const float e4[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            const int idx = 4 * (v0 + 256 * u) + t, i = idx >> 7, k = idx & 127;
            *reinterpret_cast<__half*>(smem + rot_off + (k >> 6) * 16384 + Swizzle128(i, (k & 63) >> 3) + 2 * (k & 7)) =
                __float2half_rn(e4[t]);
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
          const float a0 = o0[at] * inv[0], b0 = o0[at + 1] * inv[0];
          const float a1 = o1[at] * inv[1], b1 = o1[at + 1] * inv[1];
          const __half2 h0 = __floats2half2_rn(a0, b0), h1 = __floats2half2_rn(a1, b1);
          const float2 k0 = __half22float2(h0), k1 = __half22float2(h1);
          oh[s][2 * j] = Half2Bits(h0);
          oh[s][2 * j + 1] = Half2Bits(h1);
          ol[s][2 * j] = Half2Bits(__floats2half2_rn(a0 - k0.x, b0 - k0.y));
          ol[s][2 * j + 1] = Half2Bits(__floats2half2_rn(a1 - k1.x, b1 - k1.y));
        }
      }
      float u0[32], u1[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) u0[i] = u1[i] = 0.f;
      WgmmaFenceAcc(u0, u1);
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const uint64_t d = SwizzledDesc(SwizzledDescLo(rot_addr + (s >> 2) * 16384 + (s & 3) * 32));
        WgmmaF16N128R<1, 0>(u0, u1, oh[s], d);
        WgmmaF16N128R<1, 0>(u0, u1, ol[s], d);
      }
      WgmmaCommit();
      WgmmaWait(u0, u1);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (out0 != nullptr) *reinterpret_cast<float2*>(out0 + 8 * j + 2 * tig) = make_float2(u0[2 * j], u0[2 * j + 1]);
        if (out1 != nullptr) *reinterpret_cast<float2*>(out1 + 8 * j + 2 * tig) = make_float2(u1[2 * j], u1[2 * j + 1]);
      }
    } else {  // natural channel order: adjacent pairs (full 32-byte sectors per quad)
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (out0 != nullptr) *reinterpret_cast<float2*>(out0 + 8 * j + 2 * tig) = make_float2(o0[2 * j] * inv[0], o0[2 * j + 1] * inv[0]);
        if (out1 != nullptr) *reinterpret_cast<float2*>(out1 + 8 * j + 2 * tig) = make_float2(o1[2 * j] * inv[1], o1[2 * j + 1] * inv[1]);
      }
    }
    return num_tiles;
  };
  int n = 0, g = 0;
  for_items([&](const XItem& it) {
    const int b = n & 1;
    MbarWaitParity(rfull_bar + 8 * b, (n >> 1) & 1);  // the producers wrote its R_K
    g += run_item(it, kXDenseRotOff + b * kXRot, g);
    MbarArrive(rempty_bar + 8 * b);  // done with the buffer (query, R_V)
    ++n;
  });
#else
  __trap();
#endif
}

// The tensor map of rows [rows][heads][128] bf16 at base (TMA boxes of 64 channels x 1 head x 64
// rows, 128-byte swizzle). The kernel reads only full tiles through it (rows of the sequence).
absl::Status EncodeRowMap(CUtensorMap* map, const uint16_t* base, uint32_t heads, uint64_t rows) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return absl::InternalError("extend attention: cuTensorMapEncodeTiled unavailable");
  const cuuint64_t dims[3] = {128, heads, rows};
  const cuuint64_t strides[2] = {256, cuuint64_t(heads) * 256};  // bytes, of dims 1 and 2
  const cuuint32_t box[3] = {64, 1, 64}, elem[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint16_t*>(base), dims, strides, box, elem,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return absl::InternalError(absl::StrCat("extend attention: tensor map encode error ", static_cast<int>(r)));
  return absl::OkStatus();
}
}  // namespace

absl::Status PrepareExtendDense() {
  for (auto* k : {ExtendDenseKernel<0>, ExtendDenseKernel<5>}) {
    if (absl::Status s = CudaStatus(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kXDenseSmemBytes),
                                    "extend attention (plain prefill) shared memory");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status LaunchExtendDense(const ExtendParams& p, int max_new_tokens, int items_x, cudaStream_t stream, int diag) {
  int dev = 0, sms = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return CudaStatus(e, "extend attention (plain prefill) device");
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev); e != cudaSuccess) {
    return CudaStatus(e, "extend attention (plain prefill) SM count");
  }
  const int items = items_x * p.table.num_seqs * static_cast<int>(p.shape.num_kv_heads);
  const int ctas = diag == 3 ? items : std::max(1, std::min(items, sms));
  if (diag == 5) {
    ExtendDenseKernel<5><<<ctas, kXThreads, kXDenseSmemBytes, stream>>>(p, items_x, XMaps{});
  } else {
    // The tensor maps span num_seqs · max_new_tokens rows (>= the rows of the launch).
    XMaps maps;
    const uint64_t rows = uint64_t(p.table.num_seqs) * uint64_t(max_new_tokens);
    if (absl::Status s = EncodeRowMap(&maps.k, p.k_new, p.shape.num_kv_heads, rows); !s.ok()) return s;
    if (absl::Status s = EncodeRowMap(&maps.v, p.v_new, p.shape.num_kv_heads, rows); !s.ok()) return s;
    ExtendDenseKernel<0><<<ctas, kXThreads, kXDenseSmemBytes, stream>>>(p, items_x, maps);
  }
  return CudaStatus(cudaGetLastError(), "extend attention (plain prefill) launch");
}

}  // namespace oscarkv::cuda::detail
