// The quantize-on-write kernel (quantize_write.cu; internal to kernels/cuda/src): a CTA per
// (layer, K|V, KV head) loops over its tiles of 16 tokens per warp -- rows loaded (directly or
// through a cp.async ring), rotated (mma.sync or wgmma), clipped, quantized (QuantizeStore) and
// stored into their page slots.
#pragma once

#include "quantize_write_select.cuh"

namespace oscarkv::cuda {
namespace {

using namespace detail;

// Staged loads (kStaged): every warp streams its 16-row tiles through a private ring of
// kStagesOf stages (4 KiB each) in shared memory, filled by cp.async (coalesced: a warp's
// instruction copies two whole 256-byte rows) kStagesOf - 1 tiles ahead, so the next tiles'
// bytes are in flight while this one is rotated and quantized, at no register cost (the
// selecting kernels could not afford a register prefetch). Rows are stored with their 16-byte
// chunks XOR-swizzled (chunk c of row r at c ^ 2·bit3(c) ^ (r & 1)) so that the lanes' 16-byte
// reads of their 64-byte slices are conflict-free. The grid is one balanced wave (tiles split
// evenly over the CTAs that fit at once), which also loads each CTA's rotation fragments once.
constexpr int kStageBytes = 16 * 256;  // one warp's 16 rows of bf16
template <bool kSelect, bool kRotate>
constexpr int kStagesOf = kRotate ? 2 : 3;
__host__ __device__ constexpr int BinBytes(bool select, int warps) {
  return select ? warps * kBins * 32 * 4 : 0;
}

// kSelect (some head uses search / unbiased) and kRotate (rot_fragments set) are template
// arguments so that the simpler kernels keep their registers (occupancy); the selecting kernels
// are capped at 168 registers (3 CTAs per SM), measured faster than 2 CTAs of 255. kStaged:
// staged loads (above); false is the round-1 kernel (direct loads, a register prefetch of the
// next tile in the min-max kernels, none in the selecting ones), kept for side-by-side benches.
// kAhead (direct round-3 selecting kernels): 1 loads the next tile's rows one tile ahead
// (between this tile's two rows), 2 prefetches them into L1 there, 0 neither: each tile's rows
// are loaded when it is reached; see the loop below.
// kWg (rotating selecting kernels, sm_90a): warps per CTA of the wgmma rotation (whole
// warpgroups, see WgmmaF16N128), 0 for mma.sync.
template <int kWg>
constexpr int kWgMinBlocks = kWg == 12 ? 1 : 2;
template <int G, bool kSelect, bool kRotate, bool kStaged, bool kRound1 = false, int kAhead = 0,
          int kWg = 0, bool kClip = true>
__global__ void __launch_bounds__(32 * WarpsOf(kSelect, kRotate, kRound1, kWg),
                                  kWg != 0 ? kWgMinBlocks<kWg>
                                  : kSelect ? (kRotate && !kRound1 ? 2 : 3) : (kStaged && !kRotate ? 4 : 2))
    QuantizeWriteKernel(const QuantizeWriteArgs p, int per_cta) {
  static_assert(kWg % 4 == 0 && (kWg == 0 || (kRotate && (kSelect ? !kStaged : kStaged && kWg == 4))));
  constexpr int kWarps = WarpsOf(kSelect, kRotate, kRound1, kWg), kThreads = 32 * kWarps;
  constexpr int kTileTokens = 16 * kWarps;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int head = blockIdx.y;
  const int li = blockIdx.z >> 1, kv = blockIdx.z & 1;
  const int H = static_cast<int>(p.num_kv_heads);
  const int mat = (li * 2 + kv) * H + head;
  constexpr bool rotate = kRotate;
  const uint4* frag = reinterpret_cast<const uint4*>(smem);    // hi + lo parts
  const uint2* frag_hi = reinterpret_cast<const uint2*>(smem);  // hi parts only, packed
  const bool precise = p.precise_rotation;
  const int frag_bytes = rotate ? (precise ? kFragSmem : kFragSmem / 2) : 0;
  if (rotate) {
    const uint8_t* src = static_cast<const uint8_t*>(p.rot_fragments) + size_t(mat) * kRotationFragmentBytes;
    if constexpr (kWg != 0) {
      // Rearranged into the wgmma tiles (WgmmaFragOffset); the tensor cores read them through
      // the async proxy, hence the proxy fence before the barrier.
      // Eight 16-byte loads in flight per thread (one at a time left the CTA's start waiting
      // on L2: ~2% of the stall samples on these stores, ncu).
      const uint4* s4 = reinterpret_cast<const uint4*>(src);
      constexpr int kBatch = 8, kChunks = kFragSmem / 16;
      for (int c0 = tid; c0 < kChunks; c0 += kBatch * kThreads) {
        uint4 v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int c = c0 + u * kThreads;
          v[u] = c < kChunks ? s4[c] : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int c = c0 + u * kThreads;
          const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (c < kChunks && (precise || e < 2)) {
              *reinterpret_cast<uint32_t*>(smem + WgmmaFragOffset(c, e, precise)) = w[e];
            }
          }
        }
      }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    } else if (precise) {
      for (int c = tid; c < kFragSmem / 16; c += kThreads) CpAsync16(smem + c * 16, src + c * 16, true);
      CpAsyncCommit();
      CpAsyncWait<0>();
    } else {
      // Only the fp16 high parts, packed (8 bytes per lane and step: conflict-free loads).
      const uint2* s2 = reinterpret_cast<const uint2*>(src);
      uint2* d2 = reinterpret_cast<uint2*>(smem);
      for (int c = tid; c < kFragSmem / 16; c += kThreads) d2[c] = s2[2 * c];
    }
    __syncthreads();
  }
  // Unbiased range selection: private bins per lane after the fragments ([bin][lane]).
  uint32_t bins = 0;  // shared-memory address of this lane's bin 0
  if constexpr (kSelect) {
    uint32_t* b = reinterpret_cast<uint32_t*>(smem + frag_bytes) + warp * kBins * 32 + lane;
#pragma unroll
    for (int l = 0; l < kBins; ++l) b[l << 5] = 0u;
    bins = static_cast<uint32_t>(__cvta_generic_to_shared(b)) - 7u * 128u;  // bin -7
  }
  // kClip = false: compiled without the quantile clip (launched when `clips` is null).
  const float clip = kClip && p.clips != nullptr ? p.clips[mat] : 1.0f;
  const QuantilePos qpos = QuantilePosition(clip);
  const RangeMode mode = p.range_modes != nullptr ? static_cast<RangeMode>(p.range_modes[mat]) : p.range_mode;
  const uint16_t* base = (kv ? p.v_src : p.k_src) + li * p.src_layer_stride + head * p.src_head_stride;
  const uint32_t layer = p.first_layer + li;
  const PageGeometry g2{p.num_layers, p.num_kv_heads, 128, G, p.page_tokens, PageKind::kInt2};
  const PageGeometry gb{p.num_layers, p.num_kv_heads, 128, G, p.page_tokens, PageKind::kBf16};
  const size_t seg2 = g2.segment_offset(layer, kv, head), segb = gb.segment_offset(layer, kv, head);
  const int codes_bytes = static_cast<int>(g2.codes_bytes());
  const int tiles = (p.num_tokens + kTileTokens - 1) / kTileTokens;

  // Destinations of the lane's two rows of a tile (page-table entry and slot).
  struct TileDst {
    int pid[2], slot[2];
  };
  auto load_dst = [&](int tile, TileDst& d) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tk = tile * kTileTokens + warp * 16 + gid + 8 * r;
      const bool valid = tile < tiles && tk < p.num_tokens;
      d.pid[r] = valid ? p.dst_page[tk] : 0;
      d.slot[r] = valid ? p.dst_slot[tk] : 0;
    }
  };
  // Rotates (or converts) the lane's rows of one tile and writes them to their page slots.
  // `dst`: the rows' destinations, loaded ahead (then the page kinds and pointers are loaded
  // before the rotation, which hides their latency), or nullptr to load them per row after it.
  // `mid` runs between the two rows (the prefetching loop loads the next tile there).
  auto body = [&](int tile, const uint32_t (&xw)[2][16], const TileDst* dst, auto&& mid) {
    const int t0 = tile * kTileTokens + warp * 16;
    int tok[2] = {t0 + gid, t0 + gid + 8};
    uint8_t kind_pre[2] = {0, 0};
    uint8_t* page_pre[2] = {nullptr, nullptr};
    if (dst != nullptr) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const bool valid = tok[r] < p.num_tokens;
        kind_pre[r] = valid ? p.page_kinds[dst->pid[r]] : 0;
        page_pre[r] = valid ? p.page_ptrs[dst->pid[r]] : nullptr;
      }
    }
    float y[2][32];
    if constexpr (rotate) {
      uint32_t a[2][16];  // fp16x2 of the same words
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int q = 0; q < 16; ++q) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xw[r][q]));
          const __half2 h = __float22half2_rn(f);
          a[r][q] = *reinterpret_cast<const uint32_t*>(&h);
        }
      // y accumulates in place: 16 independent mma chains (one per 8 output channels), k
      // steps outer, so consecutive mmas never wait on each other.
#pragma unroll
      for (int i = 0; i < 32; ++i) y[0][i] = y[1][i] = 0.f;
      if constexpr (kWg != 0) {
        const uint64_t desc0 = WgmmaDesc(static_cast<uint32_t>(__cvta_generic_to_shared(smem)));
        // No branch between the wgmmas (ptxas would serialize them).
        WgmmaFence(y[0], y[1], a);
        if (precise) {
#pragma unroll
          for (int t = 0; t < 16; ++t) {
            const int s = t / 2;
            WgmmaF16N128(y[0], y[1], a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1],
                         desc0 + static_cast<uint64_t>((t * kWgTileBytes) >> 4));
          }
        } else {
#pragma unroll
          for (int s = 0; s < 8; ++s) {
            WgmmaF16N128(y[0], y[1], a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1],
                         desc0 + static_cast<uint64_t>((s * kWgTileBytes) >> 4));
          }
        }
        WgmmaCommitWait(y[0], y[1]);
      } else if (precise) {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const uint4 b = frag[(j * 8 + s) * 32 + lane];
            float acc[4] = {y[0][2 * j], y[0][2 * j + 1], y[1][2 * j], y[1][2 * j + 1]};
            MmaF16(acc, a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1], b.x, b.y);
            MmaF16(acc, a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1], b.z, b.w);
            y[0][2 * j] = acc[0];
            y[0][2 * j + 1] = acc[1];
            y[1][2 * j] = acc[2];
            y[1][2 * j + 1] = acc[3];
          }
        }
      } else {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const uint2 b = frag_hi[(j * 8 + s) * 32 + lane];
            float acc[4] = {y[0][2 * j], y[0][2 * j + 1], y[1][2 * j], y[1][2 * j + 1]};
            MmaF16(acc, a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1], b.x, b.y);
            y[0][2 * j] = acc[0];
            y[0][2 * j + 1] = acc[1];
            y[1][2 * j] = acc[2];
            y[1][2 * j + 1] = acc[3];
          }
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int q = 0; q < 16; ++q) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xw[r][q]));
          y[r][2 * q] = f.x;
          y[r][2 * q + 1] = f.y;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (r == 1) mid();
      const bool valid = tok[r] < p.num_tokens;
      const int tc = valid ? tok[r] : 0;
      const int pid = dst != nullptr ? dst->pid[r] : valid ? p.dst_page[tc] : 0;
      const int slot = dst != nullptr ? dst->slot[r] : valid ? p.dst_slot[tc] : 0;
      const bool int2 = valid && (dst != nullptr ? kind_pre[r] : p.page_kinds[pid]) ==
                                     static_cast<uint8_t>(PageKind::kInt2);
      uint8_t* page = dst != nullptr ? page_pre[r] : valid ? p.page_ptrs[pid] : nullptr;
      if (valid && !int2) {
        uint32_t packed[16];
#pragma unroll
        for (int q = 0; q < 16; ++q) {
          const __nv_bfloat162 b = __floats2bfloat162_rn(y[r][2 * q], y[r][2 * q + 1]);
          packed[q] = *reinterpret_cast<const uint32_t*>(&b);
        }
        uint4* dst = reinterpret_cast<uint4*>(page + segb + size_t(slot) * 256 + 64 * tig);
#pragma unroll
        for (int q = 0; q < 4; ++q)
          dst[q] = make_uint4(packed[4 * q], packed[4 * q + 1], packed[4 * q + 2], packed[4 * q + 3]);
      }
      // The quad's 4 lanes share the row, so `int2` is uniform within a quad; shuffles below
      // stay within quads, and whole quads skip together.
      if (!__any_sync(0xffffffffu, int2)) continue;
      if (kClip && clip < 1.0f) {
        const float t = QuadAbsQuantile(y[r], qpos);
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const float v = y[r][i];
          y[r][i] = v < -t ? -t : (t < v ? t : v);
        }
      }
      uint8_t scratch[32];
      uint8_t* codes_row = int2 ? page + seg2 + size_t(slot) * 32 : scratch;
      uint8_t* params_row = int2 ? page + seg2 + codes_bytes + size_t(slot) * (128 / G) * 4 : scratch;
      if (int2) {
        QuantizeStore<G, kSelect>(y[r], tig, codes_row, params_row, mode, bins);
      } else {
        // Keep the quad's shuffles convergent: lanes with nothing to write still take part.
        float dummy[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) dummy[i] = 0.f;
        QuantizeStore<G, kSelect>(dummy, tig, scratch, scratch, mode, bins);
      }
    }
  };

  if constexpr (kStaged) {
    constexpr int S = kStagesOf<kSelect, kRotate>;
    uint8_t* ring = smem + frag_bytes + BinBytes(kSelect, kWarps) + warp * S * kStageBytes;
    const int tile_begin = blockIdx.x * per_cta;
    const int n = min(per_cta, tiles - tile_begin);
    // Copier lane: rows 2i + (lane >> 4), chunk lane & 15 (swizzled once per lane).
    const int crow = lane >> 4, cchunk = lane & 15;
    const int cdst = crow * 256 + 16 * (cchunk ^ (((cchunk >> 3) & 1) << 1) ^ crow);
    auto issue = [&](int k, int stage) {
      if (k < n) {
        const int t0 = (tile_begin + k) * kTileTokens + warp * 16;
        uint8_t* st = ring + stage * kStageBytes + cdst;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int tk = t0 + 2 * i + crow;
          const bool ok = tk < p.num_tokens;
          CpAsync16(st + i * 512, base + int64_t(ok ? tk : 0) * p.src_token_stride + 8 * cchunk, ok);
        }
      }
      CpAsyncCommit();
    };
    // Reader lane: chunks 4·tig + q of rows gid, gid + 8 (row parity = gid & 1).
    const int rx = (((tig >> 1) & 1) << 1) ^ (gid & 1);
#pragma unroll
    for (int s = 0; s < S - 1; ++s) issue(s, s);
    int stage = 0;
    for (int k = 0; k < n; ++k) {
      CpAsyncWait<S - 2>();
      __syncwarp();
      uint32_t xw[2][16];
      const uint8_t* st = ring + stage * kStageBytes;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint4 v = *reinterpret_cast<const uint4*>(st + (gid + 8 * r) * 256 + 16 * (4 * tig + (q ^ rx)));
          xw[r][4 * q] = v.x;
          xw[r][4 * q + 1] = v.y;
          xw[r][4 * q + 2] = v.z;
          xw[r][4 * q + 3] = v.w;
        }
      __syncwarp();  // every lane has read the stage before it is refilled
      issue(k + S - 1, stage == 0 ? S - 1 : stage - 1);
      stage = stage == S - 1 ? 0 : stage + 1;
      body(tile_begin + k, xw, nullptr, [] {});
    }
    CpAsyncWait<0>();
  } else {
    // Loads the lane's 32 input channels of rows gid and gid+8 of a tile (16 bf16x2 words each).
    auto load = [&](int tile, uint32_t (&xw)[2][16]) {
      const int t0 = tile * kTileTokens + warp * 16;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int tk = t0 + gid + 8 * r;
        if (tile < tiles && tk < p.num_tokens) {
          const uint4* src = reinterpret_cast<const uint4*>(base + tk * p.src_token_stride + 32 * tig);
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const uint4 v = src[q];
            xw[r][4 * q] = v.x;
            xw[r][4 * q + 1] = v.y;
            xw[r][4 * q + 2] = v.z;
            xw[r][4 * q + 3] = v.w;
          }
        } else {
#pragma unroll
          for (int q = 0; q < 16; ++q) xw[r][q] = 0u;
        }
      }
    };
    if constexpr (kSelect && !kRound1) {
      // Round 3: the next tile's destinations are loaded between this tile's two rows, its page
      // kinds and pointers before the rotation (the ncu profile of round 2's loop had ~11% of
      // its stall samples on those two dependent loads, issued per row after the rotation).
      // kAhead == 1 also loads the next tile's rows there (the first row's registers are free
      // by then), kAhead == 2 prefetches them into L1 there (no registers), kAhead == 0 loads
      // each tile's rows when it is reached. Measured on an H200 (default write / flush, us):
      // 1: 234.6-237.1 / 119.3-120.2, 2: 220.7-222.7 / -, 0: 222.5-225.9 / 123.0-124.4 -- with
      // the rotation the 32 extra live registers of 1 spill (168-register cap), and a load
      // pinned (volatile asm) after the second row's positions measured 239.5 -- so kAuto
      // takes 2 rotated, 1 unrotated.
      TileDst d;
      load_dst(blockIdx.x, d);
      if constexpr (kAhead != 1) {
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
          TileDst dn;
          uint32_t xs[2][16];
          load(tile, xs);
          body(tile, xs, &d, [&] {
            load_dst(tile + gridDim.x, dn);
            if constexpr (kAhead == 2) {  // the lane's own 2 x 64 bytes of the next tile
              const int tn = tile + gridDim.x;
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                const int tk = tn * kTileTokens + warp * 16 + gid + 8 * r;
                if (tn < tiles && tk < p.num_tokens) {
                  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(base + int64_t(tk) * p.src_token_stride + 32 * tig));
                }
              }
            }
          });
          d = dn;
        }
      } else {
        uint32_t xs[2][16];
        load(blockIdx.x, xs);
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
          TileDst dn;
          uint32_t xn[2][16];
          body(tile, xs, &d, [&] {
            load(tile + gridDim.x, xn);
            load_dst(tile + gridDim.x, dn);
          });
          d = dn;
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int q = 0; q < 16; ++q) xs[r][q] = xn[r][q];
        }
      }
      return;
    }
    uint32_t xw[2][16];
    load(blockIdx.x, xw);
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      // Prefetch the next tile's rows while this one is rotated and quantized.
      // (The selecting kernels are compute-bound: they load each tile when they reach it and
      // spend the 32 registers on the range selection instead.)
      uint32_t xn[2][16];
      if constexpr (kSelect) {
        if (tile != blockIdx.x) load(tile, xw);
      } else {
        load(tile + gridDim.x, xn);
      }
      body(tile, xw, nullptr, [] {});
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int q = 0; q < 16; ++q) xw[r][q] = kSelect ? xw[r][q] : xn[r][q];
    }
  }
}

}  // namespace
}  // namespace oscarkv::cuda
