// Quantize-on-write kernel: rotate (tensor cores), clip, INT2-quantize or bf16-round, and store
// rows into their page slots.
//
// A CTA owns one (layer, K|V, KV head) and loops over tiles of 16 tokens per warp. Lane
// (gid, tig) ends up holding channels [32·tig, 32·tig+32) of tokens gid and gid+8 of its warp's
// tile: the mma k order (input channels) and n order (output channels) are permuted in the
// prepared fragments so that both the loads and the packed code stores are contiguous. The
// rotating selecting kernels (the default codec write) rotate on wgmma where this file is built
// for sm_90a (8-warp CTAs, see WgmmaF16N128), on mma.sync otherwise.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "device_util.cuh"
#include "quantize_common.cuh"
#include "quantize_stream.h"
#include "oscarkv/cuda/quantize_write.h"

namespace oscarkv::cuda {
namespace {

using namespace detail;

// Warps per CTA (16 tokens each): 6 for the rotating selecting kernels (the 64 KiB of R hi+lo
// fragments are shared by 6 warps; 2 CTAs = 12 warps per SM), 4 otherwise; `wg` (a multiple of
// 4, whole warpgroups) for the wgmma kernels.
__host__ __device__ constexpr int WarpsOf(bool select, bool rotate, bool round1, int wg = 0) {
  return wg != 0 ? wg : select && rotate && !round1 ? 6 : 4;
}
constexpr int kFragSmem = 16 * 8 * 32 * 16;  // [n-tile][k-step][lane] uint4 = 64 KiB

// Input channel of mma k index `k` at k-step `s`, for the lane layout above.
__host__ __device__ constexpr int KChannel(int s, int k) {
  return 32 * ((k % 8) / 2) + 4 * s + 2 * (k / 8) + (k % 2);
}
// Output channel of mma n index `n` of n-tile `j`.
__host__ __device__ constexpr int NChannel(int j, int n) { return 32 * (n / 2) + 2 * j + (n % 2); }

// Writes both prepared forms of matrix blockIdx.x: the mma fragments (first kFragSmem bytes of its
// kRotationFragmentBytes) and the streaming kernel's bf16 image after them (PrepareStreamImage).
__global__ void PrepareFragmentsKernel(const float* mats, uint8_t* prepared) {
  const int m = blockIdx.x;  // matrix
  const float* r = mats + size_t(m) * 128 * 128;
  uint4* out = reinterpret_cast<uint4*>(prepared + size_t(m) * kRotationFragmentBytes);
  static_assert(kStreamImageOffset == kFragSmem, "the image follows the fragments");
  PrepareStreamImage(r, prepared + size_t(m) * kRotationFragmentBytes + kStreamImageOffset);
  for (int idx = threadIdx.x; idx < 16 * 8 * 32; idx += blockDim.x) {
    const int j = idx / 256, s = (idx / 32) % 8, lane = idx % 32;
    const int gid = lane >> 2, tig = lane & 3;
    uint32_t hi[2], lo[2];
    for (int b = 0; b < 2; ++b) {
      __half h[2], l[2];
      for (int e = 0; e < 2; ++e) {
        const int k = 2 * tig + 8 * b + e;
        const float v = r[KChannel(s, k) * 128 + NChannel(j, gid)];
        h[e] = __float2half_rn(v);
        l[e] = __float2half_rn(v - __half2float(h[e]));
      }
      hi[b] = PackHalf2(h[0], h[1]);
      lo[b] = PackHalf2(l[0], l[1]);
    }
    out[idx] = make_uint4(hi[0], hi[1], lo[0], lo[1]);
  }
}

// ---- The rotation on wgmma (sm_90a; LoadPath::kWgmma*) ----------------------------------------
// A warpgroup (4 warps) rotates its 4 x 16 rows with wgmma.m64n128k16: A (the rows, fp16) from
// the registers mma.sync's A fragments use (the same layout per warp), B (R's hi and lo parts)
// read by the tensor cores from shared memory -- once per 64 rows instead of the ~4 KB of LDS.128
// per 16 rows of the mma.sync path --, the fp32 accumulators in y's registers (the m64nNk16 D
// layout per warp is mma.sync's C layout, n8 block j = the mma path's n-tile j). The products are
// chained in the same order as the mma.sync path (k-step s outer, hi then lo, starting from 0),
// so the GPU tests can require the same bytes. Shared memory per k-step s and part (hi, lo): a
// 16 (k) x 128 (n) tile of 4 KiB, K-major without swizzle: core matrix (n-block j, k-half kb) =
// 8 rows (n) x 16 bytes (8 k values) at j * 256 + kb * 128. Tile (s, part) at (2s + part) * 4 KiB
// (hi + lo) or s * 4 KiB (hi only).
constexpr int kWgTileBytes = 16 * 128 * 2;
// Shared-memory matrix descriptor: start address, leading byte offset 128 (k halves), stride
// byte offset 256 (n blocks), no swizzle.
__device__ __forceinline__ uint64_t WgmmaDesc(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr & 0x3ffffu) >> 4) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(256 >> 4) << 32);
}
// Word w (0..3) of prepared fragment uint4 `idx` (PrepareFragmentsKernel's [j][s][lane] order)
// -> its byte offset in the wgmma layout (hi + lo when `precise`, else hi words only).
__device__ __forceinline__ int WgmmaFragOffset(int idx, int w, bool precise) {
  const int j = idx / 256, s = (idx / 32) % 8, lane = idx % 32, gid = lane >> 2, tig = lane & 3;
  const int part = w >> 1, kb = w & 1;
  const int tile = precise ? 2 * s + part : s;
  return tile * kWgTileBytes + j * 256 + kb * 128 + gid * 16 + tig * 4;
}
// y += A(64 x 16, this warp's 16 rows in mma.sync A fragments) * B(16 x 128 at `desc`).
__device__ __forceinline__ void WgmmaF16N128(float (&y0)[32], float (&y1)[32], uint32_t a0, uint32_t a1,
                                             uint32_t a2, uint32_t a3, uint64_t desc) {
#if OSCARKV_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : OSCARKV_WG_ACC(y0, y1)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
#else
  __trap();
#endif
}
// wgmma.fence before the first wgmma of a tile (orders the accumulators' and A's register writes
// before the tensor cores read them); commit + wait after the last one, the accumulators named
// as operands so that no access to them moves across.
__device__ __forceinline__ void WgmmaFence(float (&y0)[32], float (&y1)[32], uint32_t (&a)[2][16]) {
#if OSCARKV_HAVE_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n"
               : OSCARKV_WG_ACC(y0, y1),
                 "+r"(a[0][0]), "+r"(a[0][1]), "+r"(a[0][2]), "+r"(a[0][3]),
                 "+r"(a[0][4]), "+r"(a[0][5]), "+r"(a[0][6]), "+r"(a[0][7]),
                 "+r"(a[0][8]), "+r"(a[0][9]), "+r"(a[0][10]), "+r"(a[0][11]),
                 "+r"(a[0][12]), "+r"(a[0][13]), "+r"(a[0][14]), "+r"(a[0][15]),
                 "+r"(a[1][0]), "+r"(a[1][1]), "+r"(a[1][2]), "+r"(a[1][3]),
                 "+r"(a[1][4]), "+r"(a[1][5]), "+r"(a[1][6]), "+r"(a[1][7]),
                 "+r"(a[1][8]), "+r"(a[1][9]), "+r"(a[1][10]), "+r"(a[1][11]),
                 "+r"(a[1][12]), "+r"(a[1][13]), "+r"(a[1][14]), "+r"(a[1][15])
               :
               : "memory");
#endif
}
// Whether this build's kernels for the current device carry the wgmma path (sm_90a code).
__global__ void WgmmaProbeKernel(int* out) { *out = OSCARKV_HAVE_WGMMA; }

// k-th smallest (0-based) of the 128 non-negative values (as bits) of one row held by the 4
// lanes of a quad (32 each): the largest r with #(a < r) <= k, built bit by bit.
__device__ __forceinline__ uint32_t QuadKth(const uint32_t (&a)[32], int k) {
  uint32_t r = 0;
  for (int bit = 30; bit >= 0; --bit) {
    const uint32_t t = r | (1u << bit);
    int c = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) c += a[i] < t;
    c += __shfl_xor_sync(0xffffffffu, c, 1);
    c += __shfl_xor_sync(0xffffffffu, c, 2);
    if (c <= k) r = t;
  }
  return r;
}

// Order statistics lo and lo + 1 (0-based, ascending) of the quad's 128 values when lo is near
// the top: walks the distinct values from the largest down (one quad max and one count per
// distinct value) until rank lo is reached. need = 127 - lo < kMaxTopWalk iterations at most,
// instead of 31 counting passes. Ties are counted with their multiplicity, as a sort would.
// `lo` is warp-uniform; quads that finish early keep taking part in the shuffles.
constexpr int kMaxTopWalk = 16;
__device__ __forceinline__ void QuadTopOrderStats(const uint32_t (&a)[32], int lo, uint32_t* rlo,
                                                  uint32_t* rhi) {
  const int need = 127 - lo;  // rank of order statistic lo counted from the top (0 = max)
  int above = 0;              // values strictly greater than the current level
  uint32_t level = 0xffffffffu;
  bool done = false;
  *rlo = 0;
  *rhi = 0;
  for (int it = 0; it < kMaxTopWalk; ++it) {
    if (__all_sync(0xffffffffu, done)) break;
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) m = a[i] < level ? max(m, a[i]) : m;
    m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
    int cnt = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) cnt += a[i] == m;
    cnt += __shfl_xor_sync(0xffffffffu, cnt, 1);
    cnt += __shfl_xor_sync(0xffffffffu, cnt, 2);
    // Values equal to m hold top ranks [above, above + cnt).
    if (!done) {
      if (need >= 1 && above <= need - 1 && need - 1 < above + cnt) *rhi = m;
      if (above <= need && need < above + cnt) {
        *rlo = m;
        if (need == 0) *rhi = m;
        done = true;
      }
      above += cnt;
      level = m;
    }
  }
}

// Sorting networks on |x| bits (non-negative floats order as unsigned integers). Cas leaves the
// larger value in `a`.
__device__ __forceinline__ void Cas(uint32_t& a, uint32_t& b) {
  const uint32_t hi = max(a, b);
  b = min(a, b);
  a = hi;
}
// Sorts v[0..8) descending (19 comparators).
__device__ __forceinline__ void Sort8Desc(uint32_t* v) {
  Cas(v[0], v[2]); Cas(v[1], v[3]); Cas(v[4], v[6]); Cas(v[5], v[7]);
  Cas(v[0], v[4]); Cas(v[1], v[5]); Cas(v[2], v[6]); Cas(v[3], v[7]);
  Cas(v[0], v[1]); Cas(v[2], v[3]); Cas(v[4], v[5]); Cas(v[6], v[7]);
  Cas(v[2], v[4]); Cas(v[3], v[5]);
  Cas(v[1], v[4]); Cas(v[3], v[6]);
  Cas(v[1], v[2]); Cas(v[3], v[4]); Cas(v[5], v[6]);
}
// a, b sorted descending: a becomes the top 8 of a ∪ b (as a multiset), sorted descending
// (max against the reversed b gives a bitonic sequence holding the top 8; a bitonic sorter
// orders it).
__device__ __forceinline__ void MergeTop8(uint32_t* a, const uint32_t* b) {
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = max(a[i], b[7 - i]);
  Cas(a[0], a[4]); Cas(a[1], a[5]); Cas(a[2], a[6]); Cas(a[3], a[7]);
  Cas(a[0], a[2]); Cas(a[1], a[3]); Cas(a[4], a[6]); Cas(a[5], a[7]);
  Cas(a[0], a[1]); Cas(a[2], a[3]); Cas(a[4], a[5]); Cas(a[6], a[7]);
}

// Sorts a bitonic sequence v[0..16) descending (32 comparators).
__device__ __forceinline__ void BitonicSort16Desc(uint32_t* v) {
#pragma unroll
  for (int half = 8; half >= 1; half /= 2) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if ((i & half) == 0) Cas(v[i], v[i + half]);
    }
  }
}

// Order statistics at top ranks need - 1 and need (0 = the quad's maximum; ties counted with
// their multiplicity, as a sort would) for need < 16. Every lane sorts its own top 8 (sorting
// networks); lane pairs (xor 1) merge their lists into a sorted 16, and the two pairs (xor 2)
// keep the top 16 of their 32: every lane ends with the top 16 of the union of the four lists.
// Those are the row's true top values down to rank `need` unless some lane's 8th value lies
// above rank need (its 9th, unknown, might too): such quads (*exact = false) take
// QuadTopOrderStats. Branch-free; `need` is warp-uniform.
__device__ __forceinline__ void QuadTopOrderStatsFast(const float (&y)[32], int need,
                                                      uint32_t* rlo, uint32_t* rhi, bool* exact) {
  uint32_t v[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = __float_as_uint(fabsf(y[i]));
#pragma unroll
  for (int b = 0; b < 4; ++b) Sort8Desc(v + 8 * b);
  MergeTop8(v, v + 8);
  MergeTop8(v + 16, v + 24);
  MergeTop8(v, v + 16);
  const uint32_t eighth = v[7];
  // Pair merge: mine descending, the partner's reversed (ascending) -> bitonic 16.
  uint32_t w[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    w[i] = v[i];
    w[15 - i] = __shfl_xor_sync(0xffffffffu, v[i], 1);
  }
  BitonicSort16Desc(w);
  // Quad: the top 16 of the two pairs' sorted 16s (max against the reversed other is bitonic).
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = __shfl_xor_sync(0xffffffffu, w[i], 2);
#pragma unroll
  for (int i = 0; i < 16; ++i) w[i] = max(w[i], v[15 - i]);
  BitonicSort16Desc(w);
  // Rank `need` and need - 1 by masks (an indexed read would go through local memory).
  uint32_t lo_v = 0, hi_v = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    lo_v |= w[i] & (0u - static_cast<uint32_t>(i == need));
    hi_v |= w[i] & (0u - static_cast<uint32_t>(i == need - 1));
  }
  uint32_t top_eighth = max(eighth, __shfl_xor_sync(0xffffffffu, eighth, 1));
  top_eighth = max(top_eighth, __shfl_xor_sync(0xffffffffu, top_eighth, 2));
  *rlo = lo_v;
  *rhi = need == 0 ? lo_v : hi_v;
  *exact = top_eighth <= lo_v;
}

// Where the c-quantile of a row's 128 |x| sits: order statistic `lo` (ascending, 0-based) and
// the interpolation weight `frac` (numpy's linear rule, as AbsQuantile computes them).
struct QuantilePos {
  int lo;
  float frac;
};
__device__ __forceinline__ QuantilePos QuantilePosition(float c) {
  const double pos = static_cast<double>(fmaxf(0.0f, c)) * 127.0;
  const int lo = static_cast<int>(pos);
  return {lo, static_cast<float>(pos - static_cast<double>(lo))};
}

// The c-quantile of |y| over the quad's 128 values, exactly as AbsQuantile (numpy linear).
// `qp` is warp-uniform.
__device__ float QuadAbsQuantile(const float (&y)[32], QuantilePos qp) {
  const int lo = qp.lo;
  const float frac = qp.frac;
  if (127 - lo < kMaxTopWalk) {  // the usual clips (c >= 0.89): top-8 lists merged
    uint32_t rlo, rhi;
    bool exact;
    QuadTopOrderStatsFast(y, 127 - lo, &rlo, &rhi, &exact);
    if (!__all_sync(0xffffffffu, exact)) {
      uint32_t a[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) a[i] = __float_as_uint(fabsf(y[i]));
      uint32_t wlo, whi;
      QuadTopOrderStats(a, lo, &wlo, &whi);
      if (!exact) {
        rlo = wlo;
        rhi = whi;
      }
    }
    const float a_lo = __uint_as_float(rlo), a_hi = __uint_as_float(rhi);
    return __fadd_rn(a_lo, __fmul_rn(frac, __fsub_rn(a_hi, a_lo)));
  }
  uint32_t a[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) a[i] = __float_as_uint(fabsf(y[i]));
  const uint32_t rlo = QuadKth(a, lo);
  int le = 0;
  uint32_t above = 0x7f800000u;  // +inf
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    le += a[i] <= rlo;
    if (a[i] > rlo) above = min(above, a[i]);
  }
  le += __shfl_xor_sync(0xffffffffu, le, 1);
  le += __shfl_xor_sync(0xffffffffu, le, 2);
  above = min(above, __shfl_xor_sync(0xffffffffu, above, 1));
  above = min(above, __shfl_xor_sync(0xffffffffu, above, 2));
  const float a_lo = __uint_as_float(rlo);
  const float a_hi = (lo + 1 >= 128 || le >= lo + 2) ? a_lo : __uint_as_float(above);
  return __fadd_rn(a_lo, __fmul_rn(frac, __fsub_rn(a_hi, a_lo)));
}


__device__ __forceinline__ int CodeAt(const uint32_t (&c)[2], int i) {
  return static_cast<int>((c[i / 16] >> (2 * (i % 16))) & 3u);
}


// RangeMode::kUnbiased ("unbiased v2", docs/FORMAT.md §1.3.1), bit for bit with QuantizeRowInt2,
// as rounds 1 and 2 computed it (kept for LoadPath::kRound1 / kRound2; the other paths run
// SelectUnbiasedSwar below, the same sums with fewer instructions per element).
// The group's G/32 lanes each hold one 32-channel chunk. Per element: one level position
// v = floor(98304·sat(fma(x, 1/w, −mn/w))) (an FFMA.SAT and an FFMA rounding down onto 2^23,
// whose bits hold v), one shared-memory atomic add of (1 << 24) + v into the lane's private bin
// clamp(L, 7, 40) of level L = v >> 11 (34 bins: L <= 7, one per L = 8..39, L >= 40 -- two
// integer min/max, cheaper than round 1's 19 bands, which needed ~10 instructions per element),
// and v² into a 64-bit sum. Every candidate threshold (8..15, 24, 33..40) is a bin boundary, so
// its suffix sum is a suffix of bin sums. Bins are [bin][lane]: conflict-free. Then each lane
// reads and clears its bins, a reduce-scatter across the group leaves each candidate's sums on the lane that owns it, which refits and scores it in
// fp64; an (error, index) minimum across the group picks the first smallest, and the winner's
// codes are three compares per element. Exact integer sums: the order of the atomics does not
// matter. `y` is overwritten with the positions' bits.
constexpr int kBins = 34;
// Round 1's bins (kept for side-by-side benches, LoadPath::kRound1): 19 bands, the level ranges
// between consecutive thresholds -- 0 for l < 8, 1..8 for l = 8..15, 9 for 16..23, 10 for
// 24..32, 11..17 for 33..39, 18 for l >= 40.
constexpr int kBands = 19;
__device__ __forceinline__ int BandOf(int l) {
  return min(max(l - 7, 0), 9) + (l >= 24 ? 1 : 0) + min(max(l - 32, 0), 8);
}
template <bool kRound1>
constexpr int kBinsOf = kRound1 ? kBands : kBins;
__device__ __forceinline__ void SharedRedAdd(uint32_t addr, uint32_t v) {
  asm volatile("red.shared.add.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t SharedLoad(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void SharedStoreZero(uint32_t addr) {
  asm volatile("st.shared.u32 [%0], 0;\n" ::"r"(addr) : "memory");
}
template <int G, bool kRound1>
__device__ DevParams SelectUnbiased(float (&y)[32], int tig, float mn, float mx, uint32_t bins,
                                    uint32_t (&best)[2]) {
  constexpr int L = G / 32, kOwn = 8 / L;
  const int sub = tig & (L - 1);
  const float w = __fsub_rn(mx, mn);
  const float k = w > 0.f ? __frcp_rn(w) : 0.f;
  const float b = -__fmul_rn(mn, k);
  unsigned long long v2 = 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const float u = __saturatef(__fmaf_rn(y[j], k, b));
    const uint32_t vb = __float_as_uint(__fmaf_rd(u, 98304.0f, 8388608.0f));
    const uint32_t v = vb - kMagic;
    // Bin clamp(L, 7, 40) - 7 (the -7 is folded into `bins`).
    const uint32_t lv = kRound1 ? static_cast<uint32_t>(BandOf(static_cast<int>(v >> 11)))
                                : min(max(v, 7u * kUnbiasedStepsPerLevel), 40u * kUnbiasedStepsPerLevel) >> 11;
    SharedRedAdd(bins + (lv << 7), v + (1u << 24));
    v2 += static_cast<unsigned long long>(v) * v;
    y[j] = __uint_as_float(vb);
  }
  __syncwarp();  // orders the atomics before the loads below
  // Suffix sums (count << 24 | sum of v) at the thresholds: lo[i] = P(8+i) (band 1+i),
  // hi[i] = P(40-i) (band 18-i), p24 = P(24) (band 10), tot = all.
  // Suffix sums (count << 24 | sum of v) at the thresholds: lo[i] = P(8+i) (bin 1+i),
  // hi[i] = P(40-i) (bin 33-i), p24 = P(24) (bin 17), tot = all. `bins` points at bin -7.
  uint32_t lo[8], hi[8], p24 = 0, tot = 0, run = 0;
#pragma unroll
  for (int bin = kBinsOf<kRound1> - 1; bin >= 0; --bin) {
    const uint32_t at = bins + ((kRound1 ? bin : bin + 7) << 7);
    run += SharedLoad(at);
    SharedStoreZero(at);
    if (kRound1) {  // bands
      if (bin >= 11) hi[18 - bin] = run;
      if (bin == 10) p24 = run;
      if (bin >= 1 && bin <= 8) lo[bin - 1] = run;
    } else {
      if (bin >= 26) hi[33 - bin] = run;
      if (bin == 17) p24 = run;
      if (bin >= 1 && bin <= 8) lo[bin - 1] = run;
    }
    if (bin == 0) tot = run;
  }
  // Group totals: p24, tot and v2 everywhere; lo/hi reduce-scattered so that lane `sub` keeps
  // candidates i = sub + L*r (after the xor-1 step those with (i & 1) == (tig & 1), after the
  // xor-2 step (G = 128) (i & 3) == (tig & 3)).
  p24 += __shfl_xor_sync(0xffffffffu, p24, 1);
  tot += __shfl_xor_sync(0xffffffffu, tot, 1);
  v2 += __shfl_xor_sync(0xffffffffu, v2, 1);
  if (L == 4) {
    p24 += __shfl_xor_sync(0xffffffffu, p24, 2);
    tot += __shfl_xor_sync(0xffffffffu, tot, 2);
    v2 += __shfl_xor_sync(0xffffffffu, v2, 2);
  }
  uint32_t lo1[4], hi1[4];
  const bool b0 = tig & 1;
#pragma unroll
  for (int pr = 0; pr < 4; ++pr) {
    const uint32_t sl = b0 ? lo[2 * pr] : lo[2 * pr + 1], kl = b0 ? lo[2 * pr + 1] : lo[2 * pr];
    const uint32_t sh = b0 ? hi[2 * pr] : hi[2 * pr + 1], kh = b0 ? hi[2 * pr + 1] : hi[2 * pr];
    lo1[pr] = kl + __shfl_xor_sync(0xffffffffu, sl, 1);
    hi1[pr] = kh + __shfl_xor_sync(0xffffffffu, sh, 1);
  }
  uint32_t lo_own[kOwn], hi_own[kOwn];
  if constexpr (L == 4) {
    const bool b1 = tig & 2;
#pragma unroll
    for (int pr = 0; pr < 2; ++pr) {
      const uint32_t sl = b1 ? lo1[2 * pr] : lo1[2 * pr + 1], kl = b1 ? lo1[2 * pr + 1] : lo1[2 * pr];
      const uint32_t sh = b1 ? hi1[2 * pr] : hi1[2 * pr + 1], kh = b1 ? hi1[2 * pr + 1] : hi1[2 * pr];
      lo_own[pr] = kl + __shfl_xor_sync(0xffffffffu, sl, 2);
      hi_own[pr] = kh + __shfl_xor_sync(0xffffffffu, sh, 2);
    }
  } else {
#pragma unroll
    for (int pr = 0; pr < kOwn; ++pr) {
      lo_own[pr] = lo1[pr];
      hi_own[pr] = hi1[pr];
    }
  }
  // Refit and score the owned candidates (ascending index), then the group minimum.
  const long long V1 = tot & 0xffffffu, V2 = static_cast<long long>(v2);
  const long long num = G * V2 - V1 * V1;
  const double gd = static_cast<double>(G), delta = __ddiv_rn(static_cast<double>(w), 98304.0);
  const double z1 = __dadd_rn(static_cast<double>(V1), gd / 2.0);
  const double z2 = __dadd_rn(__dadd_rn(static_cast<double>(V2), static_cast<double>(V1)), gd / 4.0);
  const long long n2 = p24 >> 24, y2 = p24 & 0xffffffu;
  double best_err = 0.0;
  int best_i = 0;
  uint32_t best_w = 0;
#pragma unroll
  for (int r = 0; r < kOwn; ++r) {
    const int i = sub + L * r;
    const long long n1 = lo_own[r] >> 24, n3 = hi_own[r] >> 24;
    const long long c1 = n1 + n2 + n3, c2 = n1 + 3 * n2 + 5 * n3;
    const long long y1 = (lo_own[r] & 0xffffffu) + y2 + (hi_own[r] & 0xffffffu);
    DevParams q = CandidateParams(i, mn, mx, w);
    const long long det = G * y1 - c1 * V1;
    if (det > 0 && num > 0) {
      const double s = __ddiv_rn(static_cast<double>(num), static_cast<double>(det));
      // Division by G (a power of two) is the product with 1/G, exactly.
      const double mnum = __dsub_rn(z1, __dmul_rn(s, static_cast<double>(c1)));
      const double m = kRound1 ? __ddiv_rn(mnum, gd) : __dmul_rn(mnum, 1.0 / G);
      const double scale = __dmul_rn(s, delta);
      const double minv = __dadd_rn(static_cast<double>(mn), __dmul_rn(m, delta));
      const auto sat = [](double t) { return __double2float_rn(fmin(fmax(t, -65504.0), 65504.0)); };
      q = {__half_as_ushort(__float2half_rn(sat(scale))), __half_as_ushort(__float2half_rn(sat(minv)))};
    }
    const double pm = __dsub_rn(static_cast<double>(H2F(q.min16)), static_cast<double>(mn));
    const double qs = H2F(q.scale16), dc1 = static_cast<double>(c1), dc2 = static_cast<double>(c2);
    const double zy = __dadd_rn(static_cast<double>(y1), dc1 / 2.0);
    double err = __dmul_rn(__dmul_rn(gd, pm), pm);
    err = __dadd_rn(err, __dmul_rn(__dmul_rn(__dmul_rn(2.0, pm), qs), dc1));
    err = __dadd_rn(err, __dmul_rn(__dmul_rn(qs, qs), dc2));
    err = __dsub_rn(err, __dmul_rn(__dmul_rn(__dmul_rn(2.0, pm), delta), z1));
    err = __dsub_rn(err, __dmul_rn(__dmul_rn(__dmul_rn(2.0, qs), delta), zy));
    err = __dadd_rn(err, __dmul_rn(__dmul_rn(delta, delta), z2));
    if (isnan(err)) err = __longlong_as_double(0x7ff0000000000000ll);  // +inf
    if (r == 0 || err < best_err) {
      best_err = err;
      best_i = i;
      best_w = PackParams(q);
    }
  }
#pragma unroll
  for (int off = 1; off < L; off *= 2) {
    const double oe = __shfl_xor_sync(0xffffffffu, best_err, off);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
    const uint32_t ow = __shfl_xor_sync(0xffffffffu, best_w, off);
    if (oe < best_err || (oe == best_err && oi < best_i)) {
      best_err = oe;
      best_i = oi;
      best_w = ow;
    }
  }
  // The winner's codes: [L >= 8+i] + [L >= 24] + [L >= 40-i], compared on the positions' bits.
  const uint32_t a1 = kMagic + static_cast<uint32_t>(8 + best_i) * kUnbiasedStepsPerLevel;
  const uint32_t a2 = kMagic + 24u * kUnbiasedStepsPerLevel;
  const uint32_t a3 = kMagic + static_cast<uint32_t>(40 - best_i) * kUnbiasedStepsPerLevel;
  best[0] = best[1] = 0u;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const uint32_t vb = __float_as_uint(y[j]);
    const uint32_t c = (vb >= a1) + (vb >= a2) + (vb >= a3);
    best[j / 16] |= c << (2 * (j % 16));
  }
  return UnpackParams(best_w);
}

// Round 3's unbiased selection (the default): the same sums and the same fp64 refit as
// SelectUnbiased, with fewer instructions per element --
//   * the level comes from its own FFMA rounding down onto 2^23 (floor(48u) = floor(v / 2048)
//     exactly, checked for every float u in [0, 1]), so the bin address is one IMAD of the
//     clamped level (magic bits included, folded into the base);
//   * the bins accumulate the positions' bits vb = 2^23's bits + v as they are: a bin holds
//     n·0x4B000000 + Σv (mod 2^32) and, as 0x4B is odd, n = 99·(x >> 24) mod 256 (99 = 0x4B^-1
//     mod 256) while Σv < 2^24 stays in the low bits (G·98304 < 2^24);
//   * Σv² comes from Σvb² (mod 2^64): Σv² = Σvb² − 2M·Σv − G·M² with M = 0x4B000000;
//   * the clamped levels (7..40, one byte each) are kept packed four to a word instead of the 32
//     positions, and the winner's codes are computed four at a time: byte + (128 − T) has bit 7
//     set iff level >= T, code = b1 + b2 + b3 has bit 0 = b1 ^ b2 ^ b3 (the thresholds are
//     ordered) and bit 1 = b2, and two high-half multiplies gather the eight bits into the
//     stored order (exhaustively checked on the CPU for every candidate and level).
// The candidate's fp16 parameters are computed only when its refit does not apply.
__device__ __forceinline__ uint32_t PackLevelBytes(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}
template <int G>
__device__ DevParams SelectUnbiasedSwar(const float (&y)[32], int tig, float mn, float mx,
                                        uint32_t bins, uint32_t (&best)[2]) {
  constexpr int L = G / 32, kOwn = 8 / L;
  const int sub = tig & (L - 1);
  const float w = __fsub_rn(mx, mn);
  const float k = w > 0.f ? __frcp_rn(w) : 0.f;
  const float b = -__fmul_rn(mn, k);
  // `bins` points at (absent) bin -7, like SelectUnbiased's; the clamped level's bits are
  // kMagic + 7..40 (mod 2^32 arithmetic).
  const uint32_t base = bins - (kMagic << 7);
  unsigned long long s2[4] = {0ull, 0ull, 0ull, 0ull};
  uint32_t lw[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    uint32_t lc[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = 4 * q + e;
      const float u = __saturatef(__fmaf_rn(y[j], k, b));
      const uint32_t vb = __float_as_uint(__fmaf_rd(u, 98304.0f, 8388608.0f));
      const uint32_t lm = __float_as_uint(__fmaf_rd(u, 48.0f, 8388608.0f));
      lc[e] = min(max(lm, kMagic + 7u), kMagic + 40u);
      SharedRedAdd(base + (lc[e] << 7), vb);
      s2[e] += static_cast<unsigned long long>(vb) * vb;
    }
    lw[q] = PackLevelBytes(lc[0], lc[1], lc[2], lc[3]);
  }
  unsigned long long sq = (s2[0] + s2[1]) + (s2[2] + s2[3]);
  __syncwarp();  // orders the atomics before the loads below
  // Suffix sums at the thresholds (raw bin words; counts decoded after the group reduction):
  // lo[i] = P(8+i) (bin 1+i), hi[i] = P(40-i) (bin 33-i), p24 = P(24) (bin 17), tot = all.
  uint32_t lo[8], hi[8], p24 = 0, tot = 0, run = 0;
#pragma unroll
  for (int bin = kBins - 1; bin >= 0; --bin) {
    const uint32_t at = bins + ((bin + 7) << 7);
    run += SharedLoad(at);
    SharedStoreZero(at);
    if (bin >= 26) hi[33 - bin] = run;
    if (bin == 17) p24 = run;
    if (bin >= 1 && bin <= 8) lo[bin - 1] = run;
    if (bin == 0) tot = run;
  }
  p24 += __shfl_xor_sync(0xffffffffu, p24, 1);
  tot += __shfl_xor_sync(0xffffffffu, tot, 1);
  sq += __shfl_xor_sync(0xffffffffu, sq, 1);
  if (L == 4) {
    p24 += __shfl_xor_sync(0xffffffffu, p24, 2);
    tot += __shfl_xor_sync(0xffffffffu, tot, 2);
    sq += __shfl_xor_sync(0xffffffffu, sq, 2);
  }
  uint32_t lo1[4], hi1[4];
  const bool b0 = tig & 1;
#pragma unroll
  for (int pr = 0; pr < 4; ++pr) {
    const uint32_t sl = b0 ? lo[2 * pr] : lo[2 * pr + 1], kl = b0 ? lo[2 * pr + 1] : lo[2 * pr];
    const uint32_t sh = b0 ? hi[2 * pr] : hi[2 * pr + 1], kh = b0 ? hi[2 * pr + 1] : hi[2 * pr];
    lo1[pr] = kl + __shfl_xor_sync(0xffffffffu, sl, 1);
    hi1[pr] = kh + __shfl_xor_sync(0xffffffffu, sh, 1);
  }
  uint32_t lo_own[kOwn], hi_own[kOwn];
  if constexpr (L == 4) {
    const bool b1 = tig & 2;
#pragma unroll
    for (int pr = 0; pr < 2; ++pr) {
      const uint32_t sl = b1 ? lo1[2 * pr] : lo1[2 * pr + 1], kl = b1 ? lo1[2 * pr + 1] : lo1[2 * pr];
      const uint32_t sh = b1 ? hi1[2 * pr] : hi1[2 * pr + 1], kh = b1 ? hi1[2 * pr + 1] : hi1[2 * pr];
      lo_own[pr] = kl + __shfl_xor_sync(0xffffffffu, sl, 2);
      hi_own[pr] = kh + __shfl_xor_sync(0xffffffffu, sh, 2);
    }
  } else {
#pragma unroll
    for (int pr = 0; pr < kOwn; ++pr) {
      lo_own[pr] = lo1[pr];
      hi_own[pr] = hi1[pr];
    }
  }
  const long long V1 = tot & 0xffffffu;
  constexpr unsigned long long kM = kMagic;
  const long long V2 = static_cast<long long>(sq - 2ull * kM * static_cast<unsigned long long>(V1) -
                                              static_cast<unsigned long long>(G) * kM * kM);
  const long long num = G * V2 - V1 * V1;
  const double gd = static_cast<double>(G), delta = __ddiv_rn(static_cast<double>(w), 98304.0);
  const double z1 = __dadd_rn(static_cast<double>(V1), gd / 2.0);
  const double z2 = __dadd_rn(__dadd_rn(static_cast<double>(V2), static_cast<double>(V1)), gd / 4.0);
  const long long n2 = DecodeCount(p24), y2 = p24 & 0xffffffu;
  double best_err = 0.0;
  int best_i = 0;
  uint32_t best_w = 0;
#pragma unroll
  for (int r = 0; r < kOwn; ++r) {
    const int i = sub + L * r;
    const long long n1 = DecodeCount(lo_own[r]), n3 = DecodeCount(hi_own[r]);
    const long long c1 = n1 + n2 + n3, c2 = n1 + 3 * n2 + 5 * n3;
    const long long y1 = (lo_own[r] & 0xffffffu) + y2 + (hi_own[r] & 0xffffffu);
    DevParams q;
    const long long det = G * y1 - c1 * V1;
    if (det > 0 && num > 0) {
      q = UnbiasedRefit<G>(num, det, z1, c1, delta, mn);
    } else {
      q = CandidateParams(i, mn, mx, w);
    }
    const double pm = __dsub_rn(static_cast<double>(H2F(q.min16)), static_cast<double>(mn));
    const double qs = H2F(q.scale16), dc1 = static_cast<double>(c1), dc2 = static_cast<double>(c2);
    const double zy = __dadd_rn(static_cast<double>(y1), dc1 / 2.0);
    double err = __dmul_rn(__dmul_rn(gd, pm), pm);
    err = __dadd_rn(err, __dmul_rn(__dmul_rn(__dmul_rn(2.0, pm), qs), dc1));
    err = __dadd_rn(err, __dmul_rn(__dmul_rn(qs, qs), dc2));
    err = __dsub_rn(err, __dmul_rn(__dmul_rn(__dmul_rn(2.0, pm), delta), z1));
    err = __dsub_rn(err, __dmul_rn(__dmul_rn(__dmul_rn(2.0, qs), delta), zy));
    err = __dadd_rn(err, __dmul_rn(__dmul_rn(delta, delta), z2));
    if (isnan(err)) err = __longlong_as_double(0x7ff0000000000000ll);  // +inf
    if (r == 0 || err < best_err) {
      best_err = err;
      best_i = i;
      best_w = PackParams(q);
    }
  }
#pragma unroll
  for (int off = 1; off < L; off *= 2) {
    const double oe = __shfl_xor_sync(0xffffffffu, best_err, off);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
    const uint32_t ow = __shfl_xor_sync(0xffffffffu, best_w, off);
    if (oe < best_err || (oe == best_err && oi < best_i)) {
      best_err = oe;
      best_i = oi;
      best_w = ow;
    }
  }
  // The winner's codes, four per word: thresholds T1 = 8+i, 24, T3 = 40-i on the level bytes.
  const uint32_t k1 = static_cast<uint32_t>(120 - best_i) * 0x01010101u;  // 128 - T1
  const uint32_t k2 = 104u * 0x01010101u;                                 // 128 - 24
  const uint32_t k3 = static_cast<uint32_t>(88 + best_i) * 0x01010101u;   // 128 - T3
  constexpr uint32_t kHi = 0x80808080u;
  constexpr uint32_t kMulA = (1u << 25) | (1u << 19) | (1u << 13) | (1u << 7), kMulB = kMulA << 1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t byte[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const uint32_t W = lw[4 * h + m];
      const uint32_t s1 = W + k1, s2w = W + k2, s3 = W + k3;
      const uint32_t bit0 = (s1 ^ s2w ^ s3) & kHi, bit1 = s2w & kHi;
      byte[m] = __umulhi(bit0, kMulA) + __umulhi(bit1, kMulB);
    }
    best[h] = __byte_perm(__byte_perm(byte[0], byte[1], 0x0040), __byte_perm(byte[2], byte[3], 0x0040), 0x5410);
  }
  return UnpackParams(best_w);
}

// RangeMode::kSearch, mirroring QuantizeRowInt2 bit for bit: the same 8 candidate ranges, the
// same integer error sums (exact, so any order), the same first-smallest choice. Returns the
// chosen parameters and the lane's codes.
template <int G, bool kRound1, bool kRound2>
__device__ DevParams SelectRange(float (&y)[32], int tig, float mn, float mx, RangeMode mode,
                                 uint32_t bins, uint32_t (&best)[2]) {
  if (IsUnbiasedFixed(mode)) return SelectUnbiasedFixed<G>(y, FixedCandidate(mode), mn, mx, best);
  if (mode == RangeMode::kUnbiased) {
    if constexpr (kRound1 || kRound2) return SelectUnbiased<G, kRound1>(y, tig, mn, mx, bins, best);
    else return SelectUnbiasedSwar<G>(y, tig, mn, mx, bins, best);
  }
  const float width = __fsub_rn(mx, mn);
  DevParams best_p = RangeParams(mn, mx);
  uint32_t cand[2];
  // kSearch.
  LaneCodes(y, best_p, best);
  const float s0 = H2F(best_p.scale16);
  // Groups with scale 0 keep min-max; they still run the loop (its shuffles span the warp).
  const bool search = s0 > 0.f;
  const float unit_inv = __fmul_rn(__frcp_rn(s0), 64.0f);
  unsigned long long best_err = ~0ull;
  for (int ci = 0; ci < static_cast<int>(kRangeSearchCandidates); ++ci) {
    const float f = static_cast<float>(ci) / 32.0f;
    const DevParams q = ci == 0 ? RangeParams(mn, mx)
                                : RangeParams(__fadd_rn(mn, __fmul_rn(f, width)),
                                              __fsub_rn(mx, __fmul_rn(f, width)));
    LaneCodes(y, q, cand);
    const float minf = H2F(q.min16), sf = H2F(q.scale16);
    unsigned long long err = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const float xhat = __fadd_rn(minf, __fmul_rn(static_cast<float>(CodeAt(cand, i)), sf));
      const float e = __fmul_rn(fabsf(__fsub_rn(y[i], xhat)), unit_inv);
      const unsigned long long qe = static_cast<unsigned long long>(fminf(floorf(e), 65535.0f));
      err += qe * qe;
    }
    err = GroupSum<G>(err);
    if (search && err < best_err) {
      best_err = err;
      best_p = q;
      best[0] = cand[0];
      best[1] = cand[1];
    }
  }
  return best_p;
}

// Quantizes this lane's 32 values of a row (group = G channels spread over G/32 lanes) and
// stores the codes (8 bytes) and, from the first lane of each group, the (scale, min) pair.
// kSelect: the CTA's mode (uniform) may be search / unbiased; false compiles min-max only.
template <int G, bool kSelect, bool kRound1, bool kRound2>
__device__ void QuantizeStore(float (&y)[32], int tig, uint8_t* codes_row, uint8_t* params_row,
                              RangeMode mode, uint32_t bins) {
  float mn = y[0], mx = y[0];
#pragma unroll
  for (int i = 1; i < 32; ++i) {
    mn = fminf(mn, y[i]);
    mx = fmaxf(mx, y[i]);
  }
  mn = GroupMin<G>(mn);
  mx = GroupMax<G>(mx);
  mn = fminf(fmaxf(mn, -65504.0f), 65504.0f);
  mx = fminf(fmaxf(mx, -65504.0f), 65504.0f);
  uint32_t packed[2] = {0u, 0u};
  DevParams q;
  if (!kSelect || mode == RangeMode::kMinMax) {
    q = RangeParams(mn, mx);
    LaneCodes(y, q, packed);
  } else {
    q = SelectRange<G, kRound1, kRound2>(y, tig, mn, mx, mode, bins, packed);
  }
  *reinterpret_cast<uint2*>(codes_row + 8 * tig) = make_uint2(packed[0], packed[1]);
  const int lanes_per_group = G / 32;
  if (tig % lanes_per_group == 0) {
    const int g = tig / lanes_per_group;
    *reinterpret_cast<uint32_t*>(params_row + 4 * g) =
        static_cast<uint32_t>(q.scale16) | (static_cast<uint32_t>(q.min16) << 16);
  }
}

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
__host__ __device__ constexpr int BinBytes(bool select, int warps, bool round1) {
  return select ? warps * (round1 ? kBands : kBins) * 32 * 4 : 0;
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
template <int G, bool kSelect, bool kRotate, bool kStaged, bool kRound1 = false, bool kRound2 = false,
          int kAhead = 0, int kWg = 0, bool kClip = true>
__global__ void __launch_bounds__(32 * WarpsOf(kSelect, kRotate, kRound1, kWg),
                                  kWg != 0 ? kWgMinBlocks<kWg>
                                  : kSelect ? (kRotate && !kRound1 ? 2 : 3) : (kStaged && !kRotate ? 4 : 2))
    QuantizeWriteKernel(const QuantizeWriteParams p, int per_cta) {
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
    uint32_t* b = reinterpret_cast<uint32_t*>(smem + frag_bytes) + warp * kBinsOf<kRound1> * 32 + lane;
#pragma unroll
    for (int l = 0; l < kBinsOf<kRound1>; ++l) b[l << 5] = 0u;
    bins = static_cast<uint32_t>(__cvta_generic_to_shared(b)) - (kRound1 ? 0u : 7u * 128u);  // bin -7
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
        QuantizeStore<G, kSelect, kRound1, kRound2>(y[r], tig, codes_row, params_row, mode, bins);
      } else {
        // Keep the quad's shuffles convergent: lanes with nothing to write still take part.
        float dummy[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) dummy[i] = 0.f;
        QuantizeStore<G, kSelect, kRound1, kRound2>(dummy, tig, scratch, scratch, mode, bins);
      }
    }
  };

  if constexpr (kStaged) {
    constexpr int S = kStagesOf<kSelect, kRotate>;
    uint8_t* ring = smem + frag_bytes + BinBytes(kSelect, kWarps, kRound1) + warp * S * kStageBytes;
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
    if constexpr (kSelect && !kRound1 && !kRound2) {
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

// Resident CTAs of `kernel` on the current device (SMs x CTAs per SM), cached.
cudaError_t CachedSlots(const void* kernel, int threads, int smem, int* slots) {
  struct Entry {
    const void* kernel;
    int smem, device, slots;
  };
  static std::mutex mu;
  static std::vector<Entry> cache;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  for (const Entry& c : cache) {
    if (c.kernel == kernel && c.smem == smem && c.device == device) {
      *slots = c.slots;
      return cudaSuccess;
    }
  }
  int sms = 0, per_sm = 0;
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  if (e != cudaSuccess) return e;
  *slots = sms * per_sm;
  cache.push_back({kernel, smem, device, *slots});
  return cudaSuccess;
}

// Whether the kernels of this build for the current device are the sm_90a ones (wgmma), from
// a one-thread probe kernel; cached per device.
cudaError_t WgmmaAvailable(bool* have) {
  static std::mutex mu;
  static std::vector<std::pair<int, bool>> cache;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [d, h] : cache) {
    if (d == device) {
      *have = h;
      return cudaSuccess;
    }
  }
  int* flag = nullptr;
  e = cudaMalloc(&flag, sizeof(int));
  if (e != cudaSuccess) return e;
  WgmmaProbeKernel<<<1, 1>>>(flag);
  int host = 0;
  e = cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost);
  const cudaError_t f = cudaFree(flag);
  if (e == cudaSuccess) e = f;
  if (e != cudaSuccess) return e;
  *have = host != 0;
  cache.emplace_back(device, *have);
  return cudaSuccess;
}

}  // namespace

bool QuantizeWriteHasWgmma() {
  bool have = false;
  return WgmmaAvailable(&have) == cudaSuccess && have;
}

absl::Status PrepareRotationFragments(const float* matrices, int count, void* fragments,
                                      cudaStream_t stream) {
  if (count <= 0) return absl::OkStatus();
  if (matrices == nullptr || fragments == nullptr) {
    return absl::InvalidArgumentError("PrepareRotationFragments: null buffer");
  }
  PrepareFragmentsKernel<<<count, 256, 0, stream>>>(matrices, static_cast<uint8_t*>(fragments));
  return CudaStatus(cudaGetLastError(), "prepare rotation fragments");
}

absl::Status LaunchQuantizeWrite(const QuantizeWriteParams& p, cudaStream_t stream) {
  if (p.head_dim != 128 || (p.group_size != 128 && p.group_size != 64)) {
    return absl::InvalidArgumentError("quantize-on-write needs head_dim 128 and group 128 or 64");
  }
  if (!IsRangeMode(static_cast<uint8_t>(p.range_mode))) {
    return absl::InvalidArgumentError("quantize-on-write: unknown range mode");
  }
  if (p.num_tokens <= 0 || p.layer_count == 0) return absl::OkStatus();
  if (p.k_src == nullptr || p.v_src == nullptr || p.page_ptrs == nullptr ||
      p.page_kinds == nullptr || p.dst_page == nullptr || p.dst_slot == nullptr) {
    return absl::InvalidArgumentError("quantize-on-write: missing buffer");
  }
  if (p.first_layer + p.layer_count > p.num_layers) {
    return absl::InvalidArgumentError("quantize-on-write: layers out of range");
  }
  if (p.src_token_stride % 8 != 0 || p.src_head_stride % 8 != 0 || p.src_layer_stride % 8 != 0) {
    return absl::InvalidArgumentError("quantize-on-write: source strides must be 16-byte multiples");
  }
  using LoadPath = QuantizeWriteParams::LoadPath;
  // The streaming kernel (quantize_stream.cu) takes every launch it supports under kAuto:
  // rotated (R hi + lo) or already rotated rows, no clip, min-max or unbiased-fixed ranges.
  const bool stream_path = p.load_path == LoadPath::kStream || p.load_path == LoadPath::kStream3;
  if (p.load_path == LoadPath::kAuto || stream_path) {
    const char* why = nullptr;
    const bool fits = StreamWriteSupports(p, &why);
    if (!fits && stream_path) {
      return absl::InvalidArgumentError(absl::StrCat("quantize-on-write: the streaming kernel does not take ", why));
    }
    if (fits) {
      bool have = false;
      cudaError_t e = WgmmaAvailable(&have);
      if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write wgmma probe");
      if (have) return LaunchStreamWrite(p, stream);
      if (stream_path) {
        return absl::UnimplementedError("quantize-on-write: this build has no sm_90a (wgmma) kernels");
      }
    }
  }
  const bool g128 = p.group_size == 128;
  // Per-head modes live in device memory (unknown here): any table takes the selecting kernel,
  // which handles min-max heads at run time too.
  const bool select = p.range_modes != nullptr || p.range_mode != RangeMode::kMinMax;
  const bool rot = p.rot_fragments != nullptr;
  const bool wg_path = p.load_path == LoadPath::kWgmma4 || p.load_path == LoadPath::kWgmma8 ||
                       p.load_path == LoadPath::kWgmma12;
  const bool staged = p.load_path == LoadPath::kStaged ||
                      (!select && (p.load_path == LoadPath::kAuto || wg_path));
  const bool round1 = p.load_path == LoadPath::kRound1 && select;  // min-max kernels: unchanged
  const bool round2 = p.load_path == LoadPath::kRound2 && select;
  // wgmma rotation (rotating kernels on sm_90a builds): warps per CTA, 0 for mma.sync. kAuto
  // takes 8-warp CTAs (2 per SM, 16 warps, 128 registers) for the selecting kernels -- measured
  // on an H200 (default codec write, us): 4 warps 248.5, 8 warps 174.9, 12 warps 199.3, mma.sync
  // 221.3 (session 13). The staged min-max / bf16 kernels take wgmma (4-warp CTAs, one
  // warpgroup) only when asked (kWgmma*): faster into INT2 pages (142.8 -> 113.4 us), slower
  // into BF16 pages (125.0 -> 141.7 us: the warpgroup's lock step exposes the ring's loads), and
  // the page kinds are not known here.
  bool have_wgmma = false;
  if (rot && (p.load_path == LoadPath::kAuto || wg_path)) {
    cudaError_t e = WgmmaAvailable(&have_wgmma);
    if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write wgmma probe");
    if (!have_wgmma && wg_path) {
      return absl::UnimplementedError("quantize-on-write: this build has no sm_90a (wgmma) kernels");
    }
  }
  const int wg = !have_wgmma                         ? 0
                 : !select                           ? (wg_path ? 4 : 0)
                 : p.load_path == LoadPath::kWgmma4  ? 4
                 : p.load_path == LoadPath::kWgmma12 ? 12
                                                     : 8;  // kWgmma8, kAuto
  // Round 3's selecting kernels (kAhead above): kAuto / kDirect take the rows one tile ahead
  // unrotated, an L1 prefetch one tile ahead rotated.
  const int ahead = p.load_path == LoadPath::kLoadAhead    ? 1
                    : p.load_path == LoadPath::kLoadAtTile ? 0
                    : p.load_path == LoadPath::kPrefetchL1 ? 2
                    : rot                                  ? 2
                                                           : 1;
  const int frag_bytes = !rot ? 0 : p.precise_rotation ? kFragSmem : kFragSmem / 2;
  // Shared memory: fragments, bins (selecting kernels), then the staged kernels' load rings.
  const int stages = !staged ? 0 : rot ? kStagesOf<true, true> : kStagesOf<true, false>;
  auto launch = [&](auto kernel, int warps) -> absl::Status {
    const int tile_tokens = 16 * warps, tiles = (p.num_tokens + tile_tokens - 1) / tile_tokens;
    const int smem = frag_bytes + BinBytes(select, warps, round1) + warps * stages * kStageBytes;
    const int items = static_cast<int>(p.num_kv_heads * 2 * p.layer_count);
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write smem attribute");
    int per_cta;
    if (staged) {
      // One balanced wave: the fewest tiles per CTA such that all CTAs fit on the device at
      // once (cached per kernel, shared-memory size and device).
      int slots = 0;
      e = CachedSlots(reinterpret_cast<const void*>(kernel), 32 * warps, smem, &slots);
      if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write occupancy");
      if (slots <= 0) return absl::InternalError("quantize-on-write: kernel does not fit an SM");
      const int x = std::max(1, slots / items);
      per_cta = (tiles + x - 1) / x;
    } else if (select && !round1) {
      // Direct selecting kernels: tiles per CTA (up to 8, at least 2 when rotated, to amortize
      // the fragment load) minimizing the modelled makespan, waves x tiles per CTA (CTAs take
      // equal time), the larger count on ties (fewer fragment loads).
      int slots = 0;
      e = CachedSlots(reinterpret_cast<const void*>(kernel), 32 * warps, smem, &slots);
      if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write occupancy");
      if (slots <= 0) return absl::InternalError("quantize-on-write: kernel does not fit an SM");
      long best = -1;
      per_cta = rot ? 2 : 1;
      for (int pc = per_cta; pc <= 8; ++pc) {
        const long ctas = static_cast<long>((tiles + pc - 1) / pc) * items;
        const long span = (ctas + slots - 1) / slots * pc;
        if (best < 0 || span <= best) {
          best = span;
          per_cta = pc;
        }
      }
    } else {
      // Round 1: rotated CTAs amortize the fragment load over several tiles; the rotated
      // selecting kernel takes 4 (measured side by side on an H200, default codec write: 4 tiles
      // 301.6 us, 8 tiles 313.9 us, 16 tiles 412.4 us -- a shorter last wave). The kernel
      // strides over tiles by the grid's width.
      per_cta = rot ? (select ? 4 : 8) : 2;
    }
    dim3 grid((tiles + per_cta - 1) / per_cta, p.num_kv_heads, 2 * p.layer_count);
    kernel<<<grid, 32 * warps, smem, stream>>>(p, per_cta);
    return absl::OkStatus();
  };
  // Template arguments: group, select, rotate, staged.
  absl::Status st;
  auto pick = [&](auto g, auto sel, auto rt) {
    constexpr int kG = decltype(g)::value;
    constexpr bool kSel = decltype(sel)::value, kRot = decltype(rt)::value;
    if (staged) {
      if constexpr (!kSel && kRot) {
        if (wg == 4) {
          st = launch(QuantizeWriteKernel<kG, false, true, true, false, false, 0, 4>, 4);
          return;
        }
      }
      st = launch(QuantizeWriteKernel<kG, kSel, kRot, true>, WarpsOf(kSel, kRot, false));
    } else if constexpr (kSel) {
      // The rotating selecting kernels' warp counts (wgmma), then the load-path variants that
      // every selecting kernel has.
      if constexpr (kRot) {
        if (wg == 4) {
          st = launch(QuantizeWriteKernel<kG, true, true, false, false, false, 2, 4>, 4);
          return;
        }
        if (wg == 8 && p.load_path == LoadPath::kAuto && p.clips == nullptr) {
          // Without the clip code: the default codec write (`--clip none`) 174.2 -> 169.0 us on
          // an H200 (session 13; a smaller kernel, fewer instruction-cache stalls).
          st = launch(QuantizeWriteKernel<kG, true, true, false, false, false, 2, 8, false>, 8);
          return;
        }
        if (wg == 8 || wg == 12) {
          st = wg == 8 ? launch(QuantizeWriteKernel<kG, true, true, false, false, false, 2, 8>, 8)
                       : launch(QuantizeWriteKernel<kG, true, true, false, false, false, 2, 12>, 12);
          return;
        }
      }
      if (round1) {
        st = launch(QuantizeWriteKernel<kG, kSel, kRot, false, true>, WarpsOf(kSel, kRot, true));
      } else if (round2) {
        st = launch(QuantizeWriteKernel<kG, kSel, kRot, false, false, true>, WarpsOf(kSel, kRot, false));
      } else if (ahead == 1) {
        st = launch(QuantizeWriteKernel<kG, kSel, kRot, false, false, false, 1>, WarpsOf(kSel, kRot, false));
      } else if (ahead == 2) {
        st = launch(QuantizeWriteKernel<kG, kSel, kRot, false, false, false, 2>, WarpsOf(kSel, kRot, false));
      } else {
        st = launch(QuantizeWriteKernel<kG, kSel, kRot, false>, WarpsOf(kSel, kRot, false));
      }
    } else {
      st = launch(QuantizeWriteKernel<kG, kSel, kRot, false>, WarpsOf(kSel, kRot, false));
    }
  };
  using T = std::true_type;
  using F = std::false_type;
  using G128 = std::integral_constant<int, 128>;
  using G64 = std::integral_constant<int, 64>;
  auto by_group = [&](auto sel, auto rt) { g128 ? pick(G128{}, sel, rt) : pick(G64{}, sel, rt); };
  if (select) {
    rot ? by_group(T{}, T{}) : by_group(T{}, F{});
  } else {
    rot ? by_group(F{}, T{}) : by_group(F{}, F{});
  }
  if (!st.ok()) return st;
  return CudaStatus(cudaGetLastError(), "quantize-on-write launch");
}

}  // namespace oscarkv::cuda
