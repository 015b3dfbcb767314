// Device helpers shared by the quantize-on-write kernels (quantize_write.cu, quantize_stream.cu):
// the wgmma accumulator operand list, the fp16 range parameters of docs/FORMAT.md §1.3 / §1.3.1,
// group reductions over the lanes that hold one group, and the unbiased refit. Internal to
// kernels/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "oscarkv/kernels/quantize.h"

namespace oscarkv::cuda::detail {
namespace {

// sm_90a code (wgmma, setmaxnreg) is compiled only where the build targets it.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OSCARKV_HAVE_WGMMA 1
#else
#define OSCARKV_HAVE_WGMMA 0
#endif

// The 64 fp32 accumulators of one wgmma.m64n128 per thread, in the instruction's order: y0 holds
// row gid, y1 row gid + 8 of the warp's 16 rows, y0[2j + e] column 8j + 2·tig + e.
#define OSCARKV_WG_ACC(y0, y1) \
  "+f"(y0[0]), "+f"(y0[1]), "+f"(y1[0]), "+f"(y1[1]), \
  "+f"(y0[2]), "+f"(y0[3]), "+f"(y1[2]), "+f"(y1[3]), \
  "+f"(y0[4]), "+f"(y0[5]), "+f"(y1[4]), "+f"(y1[5]), \
  "+f"(y0[6]), "+f"(y0[7]), "+f"(y1[6]), "+f"(y1[7]), \
  "+f"(y0[8]), "+f"(y0[9]), "+f"(y1[8]), "+f"(y1[9]), \
  "+f"(y0[10]), "+f"(y0[11]), "+f"(y1[10]), "+f"(y1[11]), \
  "+f"(y0[12]), "+f"(y0[13]), "+f"(y1[12]), "+f"(y1[13]), \
  "+f"(y0[14]), "+f"(y0[15]), "+f"(y1[14]), "+f"(y1[15]), \
  "+f"(y0[16]), "+f"(y0[17]), "+f"(y1[16]), "+f"(y1[17]), \
  "+f"(y0[18]), "+f"(y0[19]), "+f"(y1[18]), "+f"(y1[19]), \
  "+f"(y0[20]), "+f"(y0[21]), "+f"(y1[20]), "+f"(y1[21]), \
  "+f"(y0[22]), "+f"(y0[23]), "+f"(y1[22]), "+f"(y1[23]), \
  "+f"(y0[24]), "+f"(y0[25]), "+f"(y1[24]), "+f"(y1[25]), \
  "+f"(y0[26]), "+f"(y0[27]), "+f"(y1[26]), "+f"(y1[27]), \
  "+f"(y0[28]), "+f"(y0[29]), "+f"(y1[28]), "+f"(y1[29]), \
  "+f"(y0[30]), "+f"(y0[31]), "+f"(y1[30]), "+f"(y1[31])
__device__ __forceinline__ void WgmmaCommitWait(float (&y0)[32], float (&y1)[32]) {
#if OSCARKV_HAVE_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n"
               : OSCARKV_WG_ACC(y0, y1) : : "memory");
#endif
}

// Group-wide reductions over the G/32 lanes that hold one group (quads for G = 128, lane pairs
// for G = 64).
template <int G>
__device__ __forceinline__ float GroupMin(float v) {
  v = fminf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  if (G == 128) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  return v;
}
template <int G>
__device__ __forceinline__ float GroupMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  if (G == 128) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  return v;
}
// Sum over the group's lanes (integers: exact, wrapping where the type wraps; floats rounded).
template <int G, class T>
__device__ __forceinline__ T GroupSum(T v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  if (G == 128) v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// ComputeRangeParams (kernels/src/quantize.cc) with the same directed rounding and saturation.
struct DevParams {
  uint16_t scale16, min16;
};
__device__ __forceinline__ DevParams RangeParams(float mn, float mx) {
  mn = fminf(fmaxf(mn, -65504.0f), 65504.0f);
  mx = fminf(fmaxf(mx, -65504.0f), 65504.0f);
  mn = mn == 0.f ? 0.f : mn;  // -0 counts as +0 (fminf's choice between signed zeros differs)
  mx = mx == 0.f ? 0.f : mx;
  uint16_t min16 = __half_as_ushort(__float2half_rd(mn));
  if (min16 == 0xfc00) min16 = 0xfbff;
  const float minf = __half2float(__ushort_as_half(min16));
  uint16_t scale16 = __half_as_ushort(__float2half_ru(__fdiv_rn(__fsub_rn(mx, minf), 3.0f)));
  if (scale16 == 0x7c00) scale16 = 0x7bff;
  if (scale16 & 0x8000) scale16 = 0;
  return {scale16, min16};
}
__device__ __forceinline__ float H2F(uint16_t h) { return __half2float(__ushort_as_half(h)); }
// Codes of the lane's 32 values for parameters q (GroupCodes: unfused multiply then add),
// packed as stored: value i at bits 2·(i % 16) of word i / 16.
__device__ __forceinline__ void LaneCodes(const float (&y)[32], DevParams q, uint32_t (&c)[2]) {
  const float minf = H2F(q.min16), sf = H2F(q.scale16);
  const float inv = sf > 0.f ? __frcp_rn(sf) : 0.f;
  c[0] = c[1] = 0u;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const float t = __fadd_rn(__fmul_rn(__fsub_rn(y[i], minf), inv), 0.5f);
    c[i / 16] |= static_cast<uint32_t>(min(max(static_cast<int>(floorf(t)), 0), 3)) << (2 * (i % 16));
  }
}
// Candidate range i of §1.3.1 (i = 0 is exactly [mn, mx]).
__device__ __forceinline__ DevParams CandidateParams(int i, float mn, float mx, float width) {
  const float f = static_cast<float>(i) / 32.0f;
  return i == 0 ? RangeParams(mn, mx)
                : RangeParams(__fadd_rn(mn, __fmul_rn(f, width)), __fsub_rn(mx, __fmul_rn(f, width)));
}
__device__ __forceinline__ uint32_t PackParams(DevParams q) {
  return static_cast<uint32_t>(q.scale16) | (static_cast<uint32_t>(q.min16) << 16);
}
__device__ __forceinline__ DevParams UnpackParams(uint32_t w) {
  return {static_cast<uint16_t>(w & 0xffffu), static_cast<uint16_t>(w >> 16)};
}

constexpr uint32_t kMagic = 0x4B000000u;  // bits of 2^23
__device__ __forceinline__ uint32_t DecodeCount(uint32_t x) { return ((x >> 24) * 99u) & 0xffu; }

// The unbiased refit of docs/FORMAT.md §1.3.1 for one candidate whose refit applies (det > 0 and
// num > 0): s = num/det, m = (z1 − s·c1)/G, scale = s·δ, min = mn + m·δ in fp64 without fused
// operations, stored as fp16_rn(fp32_rn(clamp(·, ±65504))). UnbiasedRefitFrom takes s and δ
// already divided (correctly rounded, __ddiv_rn).
template <int G>
__device__ __forceinline__ DevParams UnbiasedRefitFrom(double s, double delta, double z1, long long c1, float mn) {
  // Division by G (a power of two) is the product with 1/G, exactly.
  const double mnum = __dsub_rn(z1, __dmul_rn(s, static_cast<double>(c1)));
  const double m = __dmul_rn(mnum, 1.0 / G);
  const double scale = __dmul_rn(s, delta);
  const double minv = __dadd_rn(static_cast<double>(mn), __dmul_rn(m, delta));
  const auto sat = [](double t) { return __double2float_rn(fmin(fmax(t, -65504.0), 65504.0)); };
  return {__half_as_ushort(__float2half_rn(sat(scale))), __half_as_ushort(__float2half_rn(sat(minv)))};
}
template <int G>
__device__ __forceinline__ DevParams UnbiasedRefit(long long num, long long det, double z1, long long c1,
                                                   double delta, float mn) {
  return UnbiasedRefitFrom<G>(__ddiv_rn(static_cast<double>(num), static_cast<double>(det)), delta, z1, c1, mn);
}

// The unbiased-fixed rule (docs/FORMAT.md §1.3.1, candidate ci), bit for bit with the CPU codec.
// Per element: the position's bits vb = 2^23's bits + v, v = floor(98304·sat(fma(x, 1/w, −mn/w)))
// (an FFMA rounding down onto 2^23), and the code c = [L >= 8+ci] + [L >= 24] + [L >= 40−ci]. The
// three thresholds are evenly spaced, O + D, O + 2D, O + 3D in steps of v with O = 2048·(2ci − 8)
// and D = 2048·(16 − ci), so c = clamp(floor((v − O)/D), 0, 3), computed on the FMA pipes without
// integer work: wq = sat(fma(2^23 + v, r4, cb)) with r4 = rn(1/(4D)) and cb = rn(r4/2 − (2^23 + O)·r4)
// (FixedCodeBias), and kMagic + c = the bits of fma_rd(wq, 4 − 2^-18, 2^23): wq is (v − O + 1/2)/(4D)
// up to the roundings of cb and of the fma, and (v − O + 1/2)/D is never an integer; the scale
// 4 − 2^-18 maps wq = 1 (v − O beyond 4D) to code 3. The margins are narrow (for some candidates
// only this cb works), so cuda_reference_test's UnbiasedFixedCode test checks every v of every
// candidate. The lane sums Σvb, Σ(kMagic + c)·vb and Σvb² (all mod 2^32), and
// the packed words Σ(kMagic + c_j) << 2j, carry the magic; FixedLaneDone removes it from the
// words and Σc·vb. After the group reduction the exact integers are V1 = Σvb − G·M and
// Y1 = Σc·vb − (Σc)·M (M = 0x4B000000), both below 2^32, and V2 = Σv² mod 2^32 =
// Σvb² − 2M·V1 − G·M². V2 itself needs up to 41 bits; a 64-bit IMAD.WIDE per element costs ~4
// cycles of the FMA-heavy pipe (bench/write_probe.cu, bench/results/NOTES.md session 26), so its
// high part comes from a float sum instead: sf = Σ rn(u² + ·) over the lane's elements, then rn
// sums over the group. v = floor(98304·u), so 0 ≤ (98304u)² − v² < 2·98304 per element (< 2^24.6
// over a group), and each of the ≤ 35 roundings of partial sums below 128 errs by ≤ 2^-18, i.e.
// < 2^15.2 after the scale 98304² < 2^33.2: 98304²·sf is within 2^25 of Σv² -- far inside ±2^31,
// where the low 32 bits decide V2 exactly (FixedTotalsOf; cuda_reference_test's
// UnbiasedFixedSquares test replays it on extreme rows).
struct FixedRange {
  float mn, mx, w, k, b;
  float r4, cb;  // rn(1/(4D)) and the code's bias rn(r4/2 − (2^23 + O)·r4)
};
// r4 and cb of candidate ci. In double, (2^23 + O)·r4 (24 x 24 bits) and the difference (48
// bits) are exact, so cb is rounded once.
__host__ __device__ inline float FixedCodeR4(int ci) {
  return 1.0f / (4.0f * static_cast<float>(static_cast<int>(kUnbiasedStepsPerLevel) * (16 - ci)));
}
__host__ __device__ inline float FixedCodeBias(int ci) {
  const double r4 = FixedCodeR4(ci);
  const double off = 8388608.0 + static_cast<double>(static_cast<int>(kUnbiasedStepsPerLevel) * (2 * ci - 8));
  return static_cast<float>(0.5 * r4 - off * r4);
}
__device__ __forceinline__ FixedRange MakeFixedRange(float mn, float mx, int ci) {
  FixedRange f;
  f.mn = mn;
  f.mx = mx;
  f.w = __fsub_rn(mx, mn);
  f.k = f.w > 0.f ? __frcp_rn(f.w) : 0.f;
  f.b = -__fmul_rn(mn, f.k);
  f.r4 = FixedCodeR4(ci);
  f.cb = FixedCodeBias(ci);
  return f;
}
constexpr float kFixedCodeScale = 4.0f - 1.0f / 262144.0f;  // 4 − 2^-18
// Σ_j (kMagic << 2j) mod 2^32 over a word's 16 codes.
constexpr uint32_t FixedWordBias() {
  uint32_t s = 0;
  for (int j = 0; j < 16; ++j) s += kMagic << (2 * j);
  return s;
}
struct FixedSums {
  uint32_t s0 = 0, sy = 0, sq = 0;  // Σvb, Σqb·vb, Σvb² (mod 2^32)
  float sf = 0.f;                    // ≈ Σu² (98304²·Σu² ≈ Σv²)
};
// One element: returns kMagic + c (to be shifted into the lane's packed word).
__device__ __forceinline__ uint32_t FixedElement(float x, const FixedRange& f, FixedSums& a) {
  const float u = __saturatef(__fmaf_rn(x, f.k, f.b));
  const float vbf = __fmaf_rd(u, 98304.0f, 8388608.0f);
  const uint32_t vb = __float_as_uint(vbf);
  const float wq = __saturatef(__fmaf_rn(vbf, f.r4, f.cb));
  const uint32_t qb = __float_as_uint(__fmaf_rd(wq, kFixedCodeScale, 8388608.0f));
  a.s0 += vb;
  a.sy += qb * vb;
  a.sq += vb * vb;
  a.sf = __fmaf_rn(u, u, a.sf);
  return qb;
}
// Removes the magic from a lane's two packed words (Σ_j qb_j << 2j) and from Σqb·vb.
__device__ __forceinline__ void FixedLaneDone(uint32_t (&cw)[2], FixedSums& a) {
  constexpr uint32_t kBias = FixedWordBias();
  cw[0] -= kBias;
  cw[1] -= kBias;
  a.sy -= kMagic * a.s0;
}
// Σ of the 2-bit codes in two packed words.
__device__ __forceinline__ uint32_t CodeSum(const uint32_t (&cw)[2]) {
  return __popc(cw[0] & 0x55555555u) + __popc(cw[1] & 0x55555555u) +
         2u * (__popc(cw[0] & 0xaaaaaaaau) + __popc(cw[1] & 0xaaaaaaaau));
}
// The group's exact integers from the group's sums.
struct FixedTotals {
  long long V1, C1, num, det;
  bool refit;  // det > 0 and num > 0
};
template <int G>
__device__ __forceinline__ FixedTotals FixedTotalsOf(const FixedSums& a, uint32_t c1) {
  FixedTotals t;
  t.V1 = static_cast<long long>(a.s0 - static_cast<uint32_t>(G) * kMagic);
  t.C1 = c1;
  const long long Y1 = static_cast<long long>(a.sy - c1 * kMagic);
  // Σv² mod 2^32 exactly, and Σv² within 2^25 from 98304²·sf: the one integer that agrees with
  // both (the product is exact in double).
  const uint32_t lo = a.sq - 2u * kMagic * static_cast<uint32_t>(t.V1) - static_cast<uint32_t>(G) * kMagic * kMagic;
  const long long approx = __double2ll_rn(static_cast<double>(a.sf) * 9663676416.0);
  const long long V2 = approx + static_cast<int32_t>(lo - static_cast<uint32_t>(approx));
  t.num = G * V2 - t.V1 * t.V1;
  t.det = G * Y1 - t.C1 * t.V1;
  t.refit = t.det > 0 && t.num > 0;
  return t;
}
// The lane sums reduced over the group's lanes, then the totals.
template <int G>
__device__ __forceinline__ FixedTotals FixedReduce(FixedSums a, uint32_t c1) {
  a.s0 = GroupSum<G>(a.s0);
  a.sy = GroupSum<G>(a.sy);
  a.sq = GroupSum<G>(a.sq);
  a.sf = GroupSum<G>(a.sf);
  c1 = GroupSum<G>(c1);
  return FixedTotalsOf<G>(a, c1);
}
// The stored parameters given s = num/det and δ = w/98304 (fp64, correctly rounded).
template <int G>
__device__ __forceinline__ DevParams FixedParams(const FixedTotals& t, const FixedRange& f, int ci, double s,
                                                 double delta) {
  if (!t.refit) return CandidateParams(ci, f.mn, f.mx, f.w);
  const double z1 = __dadd_rn(static_cast<double>(t.V1), static_cast<double>(G) / 2.0);
  return UnbiasedRefitFrom<G>(s, delta, z1, t.C1, f.mn);
}

// The rule on this lane's 32 values of one group (mn, mx: the group's saturated minimum and
// maximum): returns the group's parameters and this lane's codes (channel j at bits 2·(j % 16)
// of word j / 16).
template <int G>
__device__ __forceinline__ DevParams SelectUnbiasedFixed(const float (&y)[32], int ci, float mn, float mx,
                                                         uint32_t (&cw)[2]) {
  const FixedRange f = MakeFixedRange(mn, mx, ci);
  FixedSums a;
  cw[0] = cw[1] = 0u;
#pragma unroll
  for (int j = 0; j < 32; ++j) cw[j / 16] += FixedElement(y[j], f, a) << (2 * (j % 16));
  FixedLaneDone(cw, a);
  const FixedTotals t = FixedReduce<G>(a, CodeSum(cw));
  double s = 0.0, delta = 0.0;
  if (t.refit) {
    s = __ddiv_rn(static_cast<double>(t.num), static_cast<double>(t.det));
    delta = __ddiv_rn(static_cast<double>(f.w), 98304.0);
  }
  return FixedParams<G>(t, f, ci, s, delta);
}

}  // namespace
}  // namespace oscarkv::cuda::detail
