// Row-level codec primitives: magnitude clipping at a quantile, asymmetric INT2 quantization
// with fp16 (scale, min) per group, bit packing, and dequantization. These are the reference
// semantics the CUDA write kernel reproduces bit for bit (codes and fp16 parameters).
//
// Quantization of one group x[0..G):
//   min16   = fp16_round_down(min x)                 (so min16 <= every x)
//   scale16 = fp16_round_up((max x - min16) / 3)     (so min16 + 3*scale16 >= every x)
//   code    = clamp(floor((x - min16) * (1/scale16) + 0.5), 0, 3)   (0 when scale16 == 0;
//             +inf gives 3, -inf 0; a -0 min or max counts as +0)
//   x_hat   = min16 + code * scale16
// which gives |x - x_hat| <= scale16/2 (up to fp32 rounding) for every element.
// Packing: code of channel j goes to byte j/4, bits 2*(j%4)..2*(j%4)+1.
#pragma once

#include <cstdint>
#include <span>

namespace oscarkv {

// Threshold = the c-quantile of |x| (linear interpolation between order statistics, as
// numpy/torch `quantile` default). c >= 1 returns +inf (no clipping).
float AbsQuantile(std::span<const float> x, float c);

// Clamps x to [-t, t] with t = AbsQuantile(x, c). No-op when c >= 1.
void ClipRowAtQuantile(std::span<float> x, float c);

// Quantizes one row of `d` values with group size `group` (d % group == 0). Writes d/4 packed
// bytes to `codes` and d/group (scale, min) fp16 pairs to `scale_min` (scale first).
void QuantizeRowInt2(const float* x, uint32_t d, uint32_t group, uint8_t* codes,
                     uint16_t* scale_min);

// Write-time range selection per group (docs/FORMAT.md §1.3.1). kMinMax is the rule above.
// kSearch tries 8 candidate ranges [lo_i, hi_i] = [mn + f_i*(mx-mn), mx - f_i*(mx-mn)],
// f_i = i/32 for i = 0..7 (i = 0 is exactly min-max), quantizes the group with each (same
// directed-rounding parameters and code rule, values outside the range clamp to code 0 or 3),
// scores each by the integer error sum_j floor(|x_j - x_hat_j| * (64/scale16_0))^2 (scale16_0
// the i = 0 scale; element terms saturate at 65535 before squaring) and keeps the first
// candidate with the smallest score. The stored (scale16, min16) are the chosen candidate's,
// so readers need nothing new and the format is unchanged (2 + 32/G bits per element).
//
// kUnbiased: the same 8 candidate ranges, but each candidate's codes c_j are then refit:
// (min, scale) solve  sum_j (x_hat_j - x_j) = 0  and  sum_j (x_hat_j - x_j) x_j = 0, i.e. the
// error is orthogonal to the row and to the constant, so q.x_hat is an unbiased estimate of
// q.x for q along x (clipping alone shrinks every logit, which costs long-range recall). With
// S1 = sum x, S2 = sum x^2, C1 = sum c, C2 = sum c^2, X1 = sum c x (summation order fixed by
// docs/FORMAT.md §1.3.1: 32-channel chunks, S1/S2 in fp64 and X1 in fp32 per chunk, chunks
// combined by a fixed fp64 tree), det = G*X1 - C1*S1; if det > 0 and the solution
// scale = (G*S2 - S1^2)/det is > 0, then min = (S1 - scale*C1)/G and both are stored as fp16
// round-to-nearest (saturated); otherwise the candidate keeps its range parameters. The
// candidate with the smallest sum of squared errors of its stored parameters (evaluated in fp64
// from the sums; NaN counts as +inf) wins (first on ties).
enum class RangeMode : uint8_t { kMinMax = 0, kSearch = 1, kUnbiased = 2 };
inline constexpr uint32_t kRangeSearchCandidates = 8;

void QuantizeRowInt2(const float* x, uint32_t d, uint32_t group, RangeMode mode, uint8_t* codes,
                     uint16_t* scale_min);

// Inverse of QuantizeRowInt2 (the dequantized row, not the original).
void DequantizeRowInt2(const uint8_t* codes, const uint16_t* scale_min, uint32_t d,
                       uint32_t group, float* out);

// Per-group quantization parameters of one group (exposed for tests and kernels).
struct GroupParams {
  uint16_t scale16;
  uint16_t min16;
};
GroupParams ComputeGroupParams(const float* x, uint32_t n);
// Parameters for an explicit range [lo, hi] with the same directed rounding and saturation.
GroupParams ComputeRangeParams(float lo, float hi);

}  // namespace oscarkv
