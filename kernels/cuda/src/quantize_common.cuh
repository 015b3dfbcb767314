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
template <int G>
__device__ __forceinline__ unsigned long long GroupSumU64(unsigned long long v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  if (G == 128) v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}
template <int G>
__device__ __forceinline__ int GroupSumInt(int v) {
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
// operations, stored as fp16_rn(fp32_rn(clamp(·, ±65504))).
template <int G>
__device__ __forceinline__ DevParams UnbiasedRefit(long long num, long long det, double z1, long long c1,
                                                   double delta, float mn) {
  const double s = __ddiv_rn(static_cast<double>(num), static_cast<double>(det));
  // Division by G (a power of two) is the product with 1/G, exactly.
  const double mnum = __dsub_rn(z1, __dmul_rn(s, static_cast<double>(c1)));
  const double m = __dmul_rn(mnum, 1.0 / G);
  const double scale = __dmul_rn(s, delta);
  const double minv = __dadd_rn(static_cast<double>(mn), __dmul_rn(m, delta));
  const auto sat = [](double t) { return __double2float_rn(fmin(fmax(t, -65504.0), 65504.0)); };
  return {__half_as_ushort(__float2half_rn(sat(scale))), __half_as_ushort(__float2half_rn(sat(minv)))};
}

template <int G>
__device__ __forceinline__ uint32_t GroupSumU32(uint32_t v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  if (G == 128) v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// The unbiased-fixed rule for candidate ci on this lane's 32 values of a group (mn, mx: the
// group's saturated minimum and maximum), bit for bit with the CPU codec: returns the group's
// parameters and this lane's codes (channel j at bits 2·(j % 16) of word j / 16).
template <int G>
__device__ __forceinline__ DevParams SelectUnbiasedFixed(const float (&y)[32], int ci, float mn, float mx,
                                                         uint32_t (&cw)[2]) {
  cw[0] = cw[1] = 0u;
  // Unbiased-fixed candidate ci: positions v = floor(98304·sat(fma(x, 1/w, −mn/w))) as the bits
  // vb = 2^23's bits + v (an FFMA rounding down onto 2^23); codes [L >= 8+ci] + [L >= 24] +
  // [L >= 40−ci] compared on vb; sums of vb over all elements and over each threshold's elements
  // (count · 0x4B000000 + Σv mod 2^32: the count comes back as 99·(top byte) mod 256, Σv < 2^24
  // stays in the low bits) and Σvb² (mod 2^64).
  const float w = __fsub_rn(mx, mn);
  const float k = w > 0.f ? __frcp_rn(w) : 0.f;
  const float b = -__fmul_rn(mn, k);
  const uint32_t a1 = kMagic + static_cast<uint32_t>(8 + ci) * kUnbiasedStepsPerLevel;
  const uint32_t a2 = kMagic + 24u * kUnbiasedStepsPerLevel;
  const uint32_t a3 = kMagic + static_cast<uint32_t>(40 - ci) * kUnbiasedStepsPerLevel;
  uint32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  unsigned long long sq = 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const float u = __saturatef(__fmaf_rn(y[j], k, b));
    const uint32_t vb = __float_as_uint(__fmaf_rd(u, 98304.0f, 8388608.0f));
    const bool p1 = vb >= a1, p2 = vb >= a2, p3 = vb >= a3;
    const uint32_t bit = 1u << (2 * (j % 16));
    s0 += vb;
    s1 += p1 ? vb : 0u;
    s2 += p2 ? vb : 0u;
    s3 += p3 ? vb : 0u;
    sq += static_cast<unsigned long long>(vb) * vb;
    cw[j / 16] += (p1 ? bit : 0u) + (p2 ? bit : 0u) + (p3 ? bit : 0u);
  }
  s0 = GroupSumU32<G>(s0);
  s1 = GroupSumU32<G>(s1);
  s2 = GroupSumU32<G>(s2);
  s3 = GroupSumU32<G>(s3);
  sq = GroupSumU64<G>(sq);
  constexpr unsigned long long kM = kMagic;
  const long long V1 = static_cast<long long>(s0 - static_cast<uint32_t>(G) * kMagic);
  const long long V2 = static_cast<long long>(sq - 2ull * kM * static_cast<unsigned long long>(V1) -
                                              static_cast<unsigned long long>(G) * kM * kM);
  const long long n1 = DecodeCount(s1), n2 = DecodeCount(s2), n3 = DecodeCount(s3);
  const long long c1 = n1 + n2 + n3;
  const long long y1 = static_cast<long long>(s1 & 0xffffffu) + (s2 & 0xffffffu) + (s3 & 0xffffffu);
  const long long num = G * V2 - V1 * V1, det = G * y1 - c1 * V1;
  if (det > 0 && num > 0) {
    const double delta = __ddiv_rn(static_cast<double>(w), 98304.0);
    const double z1 = __dadd_rn(static_cast<double>(V1), static_cast<double>(G) / 2.0);
    return UnbiasedRefit<G>(num, det, z1, c1, delta, mn);
  }
  return CandidateParams(ci, mn, mx, w);
}

}  // namespace
}  // namespace oscarkv::cuda::detail
