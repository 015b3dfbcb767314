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
#include "extend_consumer.cuh"
#include "extend_wgmma.cuh"

namespace oscarkv::cuda::detail {
namespace {

// (CTA shape, registers, tile and rotation sizes: extend_wgmma.cuh.)
constexpr int kXStages = 5;     // fp16 operand tiles: the producers run up to 3 tiles ahead
constexpr int kXRawSlots = 3;   // raw copies run two tiles ahead of the dequantization
// One INT2 tile's raw bytes, K and V (codes, then the (scale, min) pairs). BF16 tiles (prefix
// pages, new tokens) are not staged: the converting threads load their rows from global memory
// (prefetched into L2 when the tile's raw copies would have been issued).
constexpr int kXRaw = 5120;
constexpr int kXRawOff = kXStages * kXStage;
constexpr int kXRotOff = kXRawOff + kXRawSlots * kXRaw;
constexpr int kXInfoOff = kXRotOff + kXRot;
constexpr int kXBarOff = kXInfoOff + 8 * kXStages;
constexpr int kXSmemBytes = kXBarOff + 16 * kXStages + 1024;  // + slack to align the base to 1 KiB
static_assert(kXRotOff % 1024 == 0 && kXSmemBytes <= 232448, "shared memory layout");
constexpr int kBarProducers = 1;  // named barrier id (the consumers': extend_consumer.cuh)

// The producer's view of key tile x: a prefix slice or a block of new tokens.
struct XTile {
  const uint8_t* page;  // nullptr: new tokens
  int kind;             // PageKind of a prefix slice
  int tok0;             // first token in the page, or first new token
  int valid;            // tokens of the tile (0..64)
};

// kDiag (bench diagnostics, outputs wrong): 1 the producer hands over tiles without dequantizing
// them, 2 without copying their raw bytes.
// Sequences without prefix pages (plain prefill) are the other launch's
// (extend_dense_wgmma.cu): this kernel's CTAs of them return at once.
template <int G, int kDiag = 0>
__global__ void __launch_bounds__(kXThreads, 1) ExtendWgmmaKernel(const ExtendParams p) {
  constexpr int kSt = kXStages;
#if OSCARKV_HAVE_WGMMA
  extern __shared__ uint8_t smem_raw_base[];
  uint8_t* smem = XAlignedSmem(smem_raw_base);
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
  // (XLoadItem's work spelled out: through it the setup above is ~20 instructions longer.)
  const XItem it{seq, h, q_begin, num_new, tok0, p0, p1};
  const int role = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);  // warpgroup
  const int prefix_slices = (p1 - p0) * spp;
  const int num_tiles = prefix_slices + (last_tok + 64) / 64;
  const uint32_t sbase = SmemAddr(smem);
  const uint32_t full_bar = sbase + kXBarOff, empty_bar = full_bar + 8 * kSt;
  int2* info = reinterpret_cast<int2*>(smem + kXInfoOff);
  if (threadIdx.x == 0) {
    XInitRing(full_bar, empty_bar, kSt);
    MbarInitFence();
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
  const XRows w = XRowsOf(static_cast<int>(threadIdx.x) - kXProducers, role - 2, gqa, Hq, tpc, tok0, num_new);
  uint8_t* q_tile = smem + kXRotOff + w.wg * kXTile;
  XStageQuery<false>(p, it, w, q_tile, sbase + kXRotOff, [&] {  // R_K into the rotation area
    XStoreRotK<false, 1>(smem + kXRotOff, p.rot_k + size_t(h) * 128 * 128, w.ctid);
    FenceProxyAsync();
    NamedBarrier(kBarConsumers, 256);
  });
  XAcc acc;
  XAttendTiles<false, kSt>(acc, w, sbase, SmemAddr(q_tile), info, full_bar, empty_bar, 0, num_tiles);
  XEpilogue<false>(p, acc, it, w, smem + kXRotOff, sbase + kXRotOff);
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
