// Extend attention on Hopper tensor cores (wgmma, sm_90a), warp-specialised: see
// extend_attention.h for the function.
//
// One CTA per (128 query rows, sequence, KV head); its rows are the KV head's GQA group of query
// heads for 128 / gqa consecutive new tokens (row r: token r / gqa, head r % gqa), so every key
// tile read serves all of them. Four warpgroups:
//   * warpgroups 0 and 1 (producers, 96 registers per thread after setmaxnreg) walk the key
//     tiles of 64 tokens -- the sequence's prefix slices (page by page, any mix of INT2 and BF16
//     pages), then the new tokens up to the CTA's last one -- sharing each tile's work: copying
//     an INT2 tile's raw bytes (codes + fp16 (scale, min) pairs) into a 3-slot ring with
//     cp.async two tiles ahead (a BF16 tile's rows are prefetched into L2 then and loaded from
//     global memory when converted), then dequantizing / converting it into fp16 K and V tiles
//     in the wgmma operand layout (128-byte swizzle, the channel order of extend_wgmma.cuh) in a
//     5-stage ring, handed over with mbarriers (full / empty). (With one producer warpgroup and
//     3 stages the dequantization was the bound: bench/results/EXTEND_NOTES.md.)
//   * warpgroups 2 and 3 (consumers, 160 registers) each own 64 rows: S = Q·Kᵀ (wgmma
//     m64n64k16, the query in shared memory), the causal and length masks, the online softmax in
//     base 2, and O += P·V (wgmma m64n128k16, P from registers, V transposed from shared memory);
//     the two take turns issuing (named barriers) and the score product of tile x runs beside
//     the value product of tile x-1.
// The query is rotated by R_K in the CTA on tensor cores (fp16 hi + lo query parts times R_K in
// fp16, fp32 accumulation) and the output by R_Vᵀ likewise when unrotate_output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

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
constexpr int kXStages = 5;          // fp16 operand tiles: the producers run up to 3 tiles ahead
constexpr int kXRawSlots = 3;       // raw copies run two tiles ahead of the dequantization
constexpr int kXTile = 16384;        // 64 keys x 128 fp16: two 64-channel halves of 8 KiB
constexpr int kXStage = 2 * kXTile;  // K and V
// One INT2 tile's raw bytes, K and V (codes, then the (scale, min) pairs). BF16 tiles (prefix
// pages, new tokens) are not staged: the converting threads load their rows from global memory
// (prefetched into L2 when the tile's raw copies would have been issued).
constexpr int kXRaw = 5120;
constexpr int kXRot = 32768;         // a 128 x 128 fp16 rotation as a B operand
constexpr int kXRawOff = kXStages * kXStage;
constexpr int kXRotOff = kXRawOff + kXRawSlots * kXRaw;
constexpr int kXInfoOff = kXRotOff + kXRot;
constexpr int kXBarOff = kXInfoOff + 8 * kXStages;
constexpr int kXSmemBytes = kXBarOff + 16 * kXStages + 1024;  // + slack to align the base to 1 KiB
static_assert(kXRotOff % 1024 == 0 && kXSmemBytes <= 232448, "shared memory layout");
constexpr float kXLog2e = 1.4426950408889634f;
constexpr float kXLn2 = 0.6931471805599453f;
constexpr int kBarProducers = 1, kBarConsumers = 2, kBarTurn0 = 3;  // named barrier ids (3, 4: turns)

// The producer's view of key tile x: a prefix slice or a block of new tokens.
struct XTile {
  const uint8_t* page;  // nullptr: new tokens
  int kind;             // PageKind of a prefix slice
  int tok0;             // first token in the page, or first new token
  int valid;            // tokens of the tile (0..64)
};

__device__ __forceinline__ float XEx2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// kDiag (bench diagnostics, outputs wrong): 1 the producer hands over tiles without dequantizing
// them, 2 without copying their raw bytes.
// Sequences without prefix pages (plain prefill) are the other launch's
// (extend_dense_wgmma.cu): this kernel's CTAs of them return at once.
template <int G, int kDiag = 0>
__global__ void __launch_bounds__(kXThreads, 1) ExtendWgmmaKernel(const ExtendParams p) {
  constexpr int kSt = kXStages;
#if OSCARKV_HAVE_WGMMA
  extern __shared__ uint8_t smem_raw_base[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw_base) + 1023) & ~uintptr_t(1023));
  const DecodeShape& sh = p.shape;
  const int H = static_cast<int>(sh.num_kv_heads), Hq = static_cast<int>(sh.num_q_heads);
  const int gqa = static_cast<int>(sh.gqa());
  const int tpc = kExtendWgmmaRows / gqa;  // tokens per CTA
  const int seq = blockIdx.y / H, h = blockIdx.y % H;
  // Scalars that steer the wgmma code are broadcast from lane 0: ptxas then knows them warp-
  // uniform and does not serialize the wgmmas behind divergent branches (warning C7520).
  // (The four loads first, so that a CTA that returns below waits for one round trip.)
  const int q_begin = __shfl_sync(0xffffffffu, p.q_indptr[seq], 0);
  const int num_new = __shfl_sync(0xffffffffu, p.q_indptr[seq + 1], 0) - q_begin;
  const int p0 = __shfl_sync(0xffffffffu, p.table.seq_page_indptr[seq], 0);
  const int p1 = __shfl_sync(0xffffffffu, p.table.seq_page_indptr[seq + 1], 0);
  const int tok0 = (gridDim.x - 1 - blockIdx.x) * tpc;  // the longest rows first
  if (tok0 >= num_new) return;  // uniform per CTA
  const int last_tok = min(num_new, tok0 + tpc) - 1;
  const int spp = static_cast<int>(sh.slices_per_page());
  if (p1 == p0) return;  // the other kernel's sequence (uniform per CTA)
  const int role = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);  // warpgroup
  const int prefix_slices = (p1 - p0) * spp;
  const int num_tiles = prefix_slices + (last_tok + 64) / 64;
  const uint32_t sbase = SmemAddr(smem);
  const uint32_t full_bar = sbase + kXBarOff, empty_bar = full_bar + 8 * kSt;
  int2* info = reinterpret_cast<int2*>(smem + kXInfoOff);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSt; ++s) {
      MbarInit(full_bar + 8 * s, kXProducers);
      MbarInit(empty_bar + 8 * s, 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (role < 2) {
    // ---------------- producers ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kXProducerRegs));
    const int tid = threadIdx.x, lane = tid & 31;
    const PageGeometry g2 = sh.geometry(PageKind::kInt2), gb = sh.geometry(PageKind::kBf16);
    const size_t seg2_k = g2.segment_offset(sh.layer, 0, h), seg2_v = g2.segment_offset(sh.layer, 1, h);
    const size_t segb_k = gb.segment_offset(sh.layer, 0, h), segb_v = gb.segment_offset(sh.layer, 1, h);
    const int codes_bytes = static_cast<int>(g2.codes_bytes());
    constexpr int NG = 128 / G;
    // Page info of prefix slices 32·blk + lane, one block of 32 in `cur`, the next loaded
    // halfway through the current one (no dependent load on the way to a tile's copies).
    auto entry_of = [&](int blk) { const int x = blk * 32 + lane; return x < prefix_slices ? p0 + x / spp : -1; };
    auto load_info = [&](int pid, bool ok, const uint8_t*& ptr, int& meta) {
      ptr = ok ? p.table.page_ptrs[pid] : nullptr;
      meta = ok ? (static_cast<int>(p.table.page_kinds[pid]) | (static_cast<int>(p.table.page_token_counts[pid]) << 8)) : 0;
    };
    const uint8_t* cur_ptr;
    const uint8_t* nxt_ptr = nullptr;
    int cur_meta, nxt_meta = 0, pid_nxt;
    int cur_blk = 0;
    bool nxt_ready = false;  // nxt_* hold block cur_blk + 1
    {
      const int e0 = entry_of(0);
      load_info(e0 >= 0 ? p.table.seq_page_ids[e0] : 0, e0 >= 0, cur_ptr, cur_meta);
      const int e1 = entry_of(1);
      pid_nxt = e1 >= 0 ? p.table.seq_page_ids[e1] : 0;
    }
    auto tile_of = [&](int x) {  // called for x = 0, 1, 2, ... in order
      XTile t;
      if (x < prefix_slices) {
        if ((x & 31) == 0 && x > 0) {
          cur_ptr = nxt_ptr;
          cur_blk = x / 32;
          nxt_ready = false;
          cur_meta = nxt_meta;
          const int e = entry_of(x / 32 + 1);
          pid_nxt = e >= 0 ? p.table.seq_page_ids[e] : 0;
        }
        if ((x & 31) == 16) {
          load_info(pid_nxt, entry_of(x / 32 + 1) >= 0, nxt_ptr, nxt_meta);
          nxt_ready = true;
        }
        const unsigned long long pp = __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(cur_ptr), x & 31);
        const int meta = __shfl_sync(0xffffffffu, cur_meta, x & 31);
        t.page = reinterpret_cast<const uint8_t*>(pp);
        t.kind = meta & 0xff;
        t.tok0 = (x % spp) * 64;
        t.valid = max(0, min(64, (meta >> 8) - t.tok0));
      } else {
        t.page = nullptr;
        t.kind = 0;
        t.tok0 = (x - prefix_slices) * 64;
        t.valid = min(64, num_new - t.tok0);
      }
      return t;
    };
    // Row `row` (128 bf16 channels) of a BF16 tile's K (kv 0) or V.
    auto bf16_row = [&](const XTile& t, int kv, int row) -> const uint16_t* {
      if (t.page != nullptr) {
        return reinterpret_cast<const uint16_t*>(t.page + (kv ? segb_v : segb_k) + size_t(t.tok0 + row) * 256);
      }
      return (kv ? p.v_new : p.k_new) + (size_t(q_begin + t.tok0 + row) * H + h) * 128;
    };
    auto issue_raw = [&](const XTile& t, uint8_t* raw) {
      if (t.valid <= 0) return;
      if (t.page != nullptr && t.kind == static_cast<int>(PageKind::kInt2)) {
        // codes: K at raw[0, 2048), V at [2048, 4096); (scale, min) pairs: K at 4096, V at 4608.
        for (int c = tid; c < 256 + 32 * NG; c += kXProducers) {
          if (c < 256) {
            const int kv = c >> 7, off = (c & 127) * 16;
            CpAsync16(raw + kv * 2048 + off, t.page + (kv ? seg2_v : seg2_k) + t.tok0 * 32 + off);
          } else {
            const int cc = c - 256, kv = cc / (16 * NG), off = (cc % (16 * NG)) * 16;
            CpAsync16(raw + 4096 + kv * 512 + off,
                      t.page + (kv ? seg2_v : seg2_k) + codes_bytes + t.tok0 * NG * 4 + off);
          }
        }
      } else {
        // BF16 rows: one L2 prefetch per 128-byte half row (K and V, 256 threads).
        const int kv = tid >> 7, row = (tid >> 1) & 63, half = tid & 1;
        if (row < t.valid) {
          const void* src = bf16_row(t, kv, row) + half * 64;
          asm volatile("prefetch.global.L2 [%0];" ::"l"(src));
        }
      }
    };
    // Tile t into the fp16 operand tiles of `stage`: INT2 codes from the raw slot, BF16 rows
    // from global memory (all of a thread's row loads in flight before it converts).
    auto dequant = [&](const XTile& t, const uint8_t* raw, uint8_t* stage) {
      auto store = [&](int u, uint4 lo, uint4 hi) {
        const int kv = u >> 9, row = (u >> 3) & 63, b = u & 7;
        uint8_t* dst = stage + kv * kXTile + (b >> 2) * 8192;
        *reinterpret_cast<uint4*>(dst + Swizzle128(row, 2 * (b & 3))) = lo;
        *reinterpret_cast<uint4*>(dst + Swizzle128(row, 2 * (b & 3) + 1)) = hi;
      };
      if (t.page != nullptr && t.kind == static_cast<int>(PageKind::kInt2)) {
#pragma unroll 1  // (unroll 2 spills at the producers' 96 registers)
        for (int u = tid; u < 1024; u += kXProducers) {
          const int kv = u >> 9, row = (u >> 3) & 63, b = u & 7;
          uint4 lo = make_uint4(0u, 0u, 0u, 0u), hi = lo;
          if (row < t.valid) {
            uint32_t w[8];
            const uint32_t codes = *reinterpret_cast<const uint32_t*>(raw + kv * 2048 + row * 32 + b * 4);
            const uint32_t sm = *reinterpret_cast<const uint32_t*>(raw + 4096 + kv * 512 + (row * NG + (b * 16) / G) * 4);
            const __half2 scale2 = BitsHalf2(__byte_perm(sm, 0, 0x1010));
            const __half2 min2 = BitsHalf2(__byte_perm(sm, 0, 0x3232));
            // Pair i (bits 2i, 2i+1 of each half) as fp16 2^e + code with e = 10 - 2j: the code
            // bits masked in place under the exponent of 2^e (j = i for pairs 0..4, whose bits
            // lie below the exponent field; pairs 5..7 from the word shifted by 10, j = i - 5),
            // then 2^e subtracted exactly: one LOP3 per pair, no shift.
            const uint32_t codes_hi = codes >> 10;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const int j = i < 5 ? i : i - 5;
              const uint32_t e = 25u - 2u * j, magic = (e << 10) | (e << 26);
              const uint32_t bits = ((i < 5 ? codes : codes_hi) & (0x00030003u << (2 * j))) | magic;
              const __half2 c = __hsub2(BitsHalf2(bits), BitsHalf2(magic));
              w[i] = Half2Bits(__hfma2(c, scale2, min2));
            }
            lo = make_uint4(w[0], w[1], w[2], w[3]);
            hi = make_uint4(w[4], w[5], w[6], w[7]);
          }
          store(u, lo, hi);
        }
      } else {
        constexpr int kU = 2;  // units loaded at once (4 spill at the producers' 96 registers)
#pragma unroll 1
        for (int u0 = tid; u0 < 1024; u0 += kU * kXProducers) {
          uint4 a[kU], c[kU];
#pragma unroll
          for (int k = 0; k < kU; ++k) {
            const int u = u0 + k * kXProducers, kv = u >> 9, row = (u >> 3) & 63, b = u & 7;
            a[k] = c[k] = make_uint4(0u, 0u, 0u, 0u);
            if (row < t.valid) {
              const uint4* src = reinterpret_cast<const uint4*>(bf16_row(t, kv, row) + b * 16);
              a[k] = src[0];
              c[k] = src[1];
            }
          }
#pragma unroll
          for (int k = 0; k < kU; ++k) {
            const uint32_t aw[4] = {a[k].x, a[k].y, a[k].z, a[k].w}, cw[4] = {c[k].x, c[k].y, c[k].z, c[k].w};
            uint32_t w[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const uint32_t x = aw[i >> 1], y = cw[i >> 1];
              const float fx = __uint_as_float((i & 1) ? (x & 0xffff0000u) : (x << 16));
              const float fy = __uint_as_float((i & 1) ? (y & 0xffff0000u) : (y << 16));
              w[i] = Half2Bits(__floats2half2_rn(fx, fy));
            }
            store(u0 + k * kXProducers, make_uint4(w[0], w[1], w[2], w[3]), make_uint4(w[4], w[5], w[6], w[7]));
          }
        }
      }
    };

    // Tiles x (dequantized now), x + 1 and x + 2 (raw copies in flight).
    XTile t0 = tile_of(0), t1{nullptr, 0, 0, 0};
    issue_raw(t0, smem + kXRawOff);
    CpAsyncCommit();
    if (num_tiles > 1) {
      t1 = tile_of(1);
      issue_raw(t1, smem + kXRawOff + kXRaw);
    }
    CpAsyncCommit();
    for (int x = 0; x < num_tiles; ++x) {
      CpAsyncWait<1>();
      NamedBarrier(kBarProducers, kXProducers);  // tile x's raw bytes landed; tile x-1's slot is free
      XTile t2{nullptr, 0, 0, 0};
      if (x + 2 < num_tiles) {
        t2 = tile_of(x + 2);
        if constexpr (kDiag != 2) issue_raw(t2, smem + kXRawOff + ((x + 2) % kXRawSlots) * kXRaw);
      }
      CpAsyncCommit();
      const int stage = x % kXStages;
      MbarWaitParity(empty_bar + 8 * stage, ((x / kXStages) & 1) ^ 1);
      if (kDiag != 1 && t0.valid > 0) dequant(t0, smem + kXRawOff + (x % kXRawSlots) * kXRaw, smem + stage * kXStage);
      if (tid == 0) info[stage] = make_int2(t0.valid, t0.page == nullptr ? t0.tok0 : -1);
      FenceProxyAsync();
      MbarArrive(full_bar + 8 * stage);
      t0 = t1;
      t1 = t2;
    }
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kXConsumerRegs));
  const int ctid = threadIdx.x - kXProducers, wg = role - 2, warp = (ctid >> 5) & 3, lane = ctid & 31;
  const int gid = lane >> 2, tig = lane & 3;
  const int used_rows = tpc * gqa;
  const int r0 = 64 * wg + 16 * warp + gid, r1 = r0 + 8;
  auto row_tok = [&](int r) { return r < used_rows ? tok0 + r / gqa : -1; };
  const int tok_r0 = row_tok(r0), tok_r1 = row_tok(r1);
  const int wg_first_tok = row_tok(64 * wg);
  const int wg_last_tok = min(row_tok(min(64 * wg + 63, used_rows - 1)), num_new - 1);
  auto q_row = [&](int r, int tok) -> const float* {
    return p.q + (size_t(q_begin + tok) * Hq + size_t(h) * gqa + r % gqa) * 128;
  };
  const bool ok_r0 = tok_r0 >= 0 && tok_r0 < num_new, ok_r1 = tok_r1 >= 0 && tok_r1 < num_new;
  const float scale = (p.softmax_scale > 0 ? p.softmax_scale : 0.08838834764831845f) * kXLog2e;
  const uint32_t rot_addr = sbase + kXRotOff;

  // The scaled, rotated query of the warpgroup's 64 rows as the score product's A operand: a
  // K-major 64 x 128 fp16 tile (two swizzled 64-position halves) in the rotation area, once
  // both warpgroups' R_K products are done.
  uint8_t* q_tile = smem + kXRotOff + wg * kXTile;
  const int qrow0 = 16 * warp + gid;  // rows r0, r1 within the warpgroup's tile
  auto store_q = [&](int row, int pos, float a, float b) {
    *reinterpret_cast<uint32_t*>(q_tile + (pos >> 6) * 8192 + Swizzle128(row, (pos & 63) >> 3) + 2 * (pos & 7)) =
        PackPair<false>(a, b);
  };
  if (p.rot_k != nullptr) {
    // R_K as a K-major B operand: n-row = position n (R_K column ExtendChannel(n)), k = input
    // channel i.
    // Each thread: input channels 8m..8m+7 (one 16-byte chunk of an operand row) of columns
    // 4cq..4cq+3, for two m; the lanes of a warp cover 8 chunks of 4 rows (conflict-free 16-byte
    // stores) and read 64 contiguous bytes of 8 rows per load; all 16 loads in flight at once.
    const float* r = p.rot_k + size_t(h) * 128 * 128;
    const int cq = (lane >> 3) + 4 * (ctid >> 5);
    float4 v[2][8];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
#pragma unroll
      for (int t = 0; t < 8; ++t) v[u][t] = *reinterpret_cast<const float4*>(r + (8 * ((lane & 7) + 8 * u) + t) * 128 + 4 * cq);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int m = (lane & 7) + 8 * u;
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        auto at = [&](int t) { return cc == 0 ? v[u][t].x : cc == 1 ? v[u][t].y : cc == 2 ? v[u][t].z : v[u][t].w; };
        const uint4 w = make_uint4(Half2Bits(__floats2half2_rn(at(0), at(1))), Half2Bits(__floats2half2_rn(at(2), at(3))),
                                   Half2Bits(__floats2half2_rn(at(4), at(5))), Half2Bits(__floats2half2_rn(at(6), at(7))));
        *reinterpret_cast<uint4*>(smem + kXRotOff + (m >> 3) * 16384 + Swizzle128(ExtendPosition(4 * cq + cc), m & 7)) = w;
      }
    }
    FenceProxyAsync();
    NamedBarrier(kBarConsumers, 256);
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
      store_q(qrow0, pos, ok_r0 ? q0[ExtendChannel(pos)] * scale : 0.f, ok_r0 ? q0[ExtendChannel(pos + 1)] * scale : 0.f);
      store_q(qrow0 + 8, pos, ok_r1 ? q1[ExtendChannel(pos)] * scale : 0.f, ok_r1 ? q1[ExtendChannel(pos + 1)] * scale : 0.f);
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
  const int my_turn = kBarTurn0 + wg, other_turn = kBarTurn0 + (wg ^ 1);
  if (wg == 1) NamedBarrierArrive(kBarTurn0, 256);  // warpgroup 0 issues first
  auto issue_scores = [&](int stage, float (&s0)[16], float (&s1)[16]) {
    const uint32_t kt = sbase + stage * kXStage;
    WgmmaFence32(s0, s1);
    WgmmaF16N64SS<0>(s0, s1, SwizzledDesc(SwizzledDescLo(q_addr)), SwizzledDesc(SwizzledDescLo(kt)));
#pragma unroll
    for (int s = 1; s < 8; ++s) {
      const uint32_t off = (s >> 2) * 8192 + (s & 3) * 32;
      WgmmaF16N64SS<1>(s0, s1, SwizzledDesc(SwizzledDescLo(q_addr + off)), SwizzledDesc(SwizzledDescLo(kt + off)));
    }
    WgmmaCommit();
  };
  auto issue_values = [&](int stage) {
    const uint32_t vt = sbase + stage * kXStage + kXTile;
    WgmmaFence64(o0, o1, pa);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) WgmmaF16N128R<1, 1>(o0, o1, pa[kk], ValueTileDesc(vt + kk * 2048));
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
      pa[kk][0] = PackPair<false>(s0[4 * kk], s0[4 * kk + 1]);
      pa[kk][1] = PackPair<false>(s1[4 * kk], s1[4 * kk + 1]);
      pa[kk][2] = PackPair<false>(s0[4 * kk + 2], s0[4 * kk + 3]);
      pa[kk][3] = PackPair<false>(s1[4 * kk + 2], s1[4 * kk + 3]);
    }
  };
  auto tile_info = [&](int stage, int& valid, int& new0) {
    const int2 ti = info[stage];
    valid = __shfl_sync(0xffffffffu, ti.x, 0);
    new0 = __shfl_sync(0xffffffffu, ti.y, 0);
  };
  {  // tile 0
    MbarWaitParity(full_bar, 0);
    int valid, new0;
    tile_info(0, valid, new0);
    float s0[16], s1[16], f0, f1;
    NamedBarrier(my_turn, 256);
    issue_scores(0, s0, s1);
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
    const int stage = x % kSt, prev = (x - 1) % kSt;
    MbarWaitParity(full_bar + 8 * stage, (x / kSt) & 1);
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
  issue_values((num_tiles - 1) % kSt);
  NamedBarrierArrive(other_turn, 256);
  WgmmaWaitValues(o0, o1, pa);
  MbarArrive(empty_bar + 8 * ((num_tiles - 1) % kSt));
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
          const int idx = 4 * (v0 + 256 * u) + t, i = idx >> 7, c = idx & 127, k = ExtendPosition(c);
          *reinterpret_cast<__half*>(smem + kXRotOff + (k >> 6) * 16384 + Swizzle128(i, (k & 63) >> 3) + 2 * (k & 7)) =
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
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = ExtendChannel(8 * j + 2 * tig + e);
        if (out0 != nullptr) out0[c] = o0[2 * j + e] * inv[0];
        if (out1 != nullptr) out1[c] = o1[2 * j + e] * inv[1];
      }
    }
  }
#else
  __trap();
#endif
}

__global__ void ExtendWgmmaProbe(int* out) { *out = OSCARKV_HAVE_WGMMA; }

}  // namespace

bool ExtendWgmmaAvailable() {
  static const bool available = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major != 9) {
      cudaGetLastError();
      return false;
    }
    int* d = nullptr;
    int h = 0;
    if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return false;
    ExtendWgmmaProbe<<<1, 1>>>(d);
    const bool ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
    cudaFree(d);
    cudaGetLastError();
    return ok && h == 1;
  }();
  return available;
}

namespace {
template <int G, int kDiag>
absl::Status SetSmem() {
  return CudaStatus(cudaFuncSetAttribute(ExtendWgmmaKernel<G, kDiag>, cudaFuncAttributeMaxDynamicSharedMemorySize, kXSmemBytes),
                    "extend attention (wgmma) shared memory");
}
template <int kDiag>
void Launch(const ExtendParams& p, dim3 grid, cudaStream_t stream) {
  if (p.shape.group_size == 128) {
    ExtendWgmmaKernel<128, kDiag><<<grid, kXThreads, kXSmemBytes, stream>>>(p);
  } else {
    ExtendWgmmaKernel<64, kDiag><<<grid, kXThreads, kXSmemBytes, stream>>>(p);
  }
}
}  // namespace

absl::Status PrepareExtendWgmma() {
  for (absl::Status s : {SetSmem<128, 0>(), SetSmem<64, 0>(), SetSmem<128, 1>(), SetSmem<128, 2>(),
                         PrepareExtendDense()}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status LaunchExtendWgmma(const ExtendParams& p, int max_new_tokens, cudaStream_t stream, int diag) {
  const int tpc = ExtendWgmmaTokensPerCta(static_cast<int>(p.shape.gqa()));
  const dim3 grid((max_new_tokens + tpc - 1) / tpc, p.table.num_seqs * p.shape.num_kv_heads);
  if (diag == 1 && p.shape.group_size == 128) {
    Launch<1>(p, grid, stream);
  } else if (diag == 2 && p.shape.group_size == 128) {
    Launch<2>(p, grid, stream);
  } else {
    // The sequences with prefix pages (this kernel), then those without (the plain-prefill
    // kernel's persistent CTAs; each kernel skips the other's sequences). Diagnostics 3..5: the
    // plain-prefill kernel alone.
    if (diag < 3) Launch<0>(p, grid, stream);
    if (absl::Status s = CudaStatus(cudaGetLastError(), "extend attention (wgmma) launch"); !s.ok()) return s;
    return LaunchExtendDense(p, max_new_tokens, static_cast<int>(grid.x), stream, diag);
  }
  return CudaStatus(cudaGetLastError(), "extend attention (wgmma) launch");
}

}  // namespace oscarkv::cuda::detail
