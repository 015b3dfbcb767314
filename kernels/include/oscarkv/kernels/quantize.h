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
// kUnbiased ("unbiased v2", docs/FORMAT.md §1.3.1): the same 8 candidate ranges, each with its
// codes refit: (min, scale) solve  sum_j (x_hat_j - x_j) = 0  and  sum_j (x_hat_j - x_j) x_j = 0,
// i.e. the error is orthogonal to the row and to the constant, so q.x_hat is an unbiased estimate
// of q.x for q along x (clipping alone shrinks every logit, which costs long-range recall).
// Every element gets one integer position v = floor(98304 * sat(fma(x, 1/w, -(mn/w)))) in
// [0, 98304] and level L = v / 2048 = floor(48 u); candidate i's codes are
// [L >= 8+i] + [L >= 24] + [L >= 40-i] (the code thresholds of its range, in 48ths of the
// width), so the per-candidate sums come from per-level counts and sums of v computed once
// (exact integers, any order). The refit and the score (squared error of the stored fp16
// parameters against x~ = mn + (v + 1/2) w/98304) are fp64 expressions of those sums; the
// first candidate with the smallest score wins. Value 2 was the earlier rule ("unbiased v1":
// per-candidate codes from the fp16 range parameters, fp32/fp64 sums in a fixed order); it is
// retired and artifacts that carry it are rejected (re-run `oscarkv calibrate`).
//
// UnbiasedFixed(i) = 16 + i, i = 0..7 ("unbiased-fixed i", docs/FORMAT.md §1.3.1): unbiased v2
// restricted to candidate i, chosen per (layer, K|V, head) at calibration time instead of per
// group at write time: the same positions, levels and codes [L >= 8+i] + [L >= 24] + [L >= 40-i],
// the same refit (or candidate i's range parameters when it does not apply), no score. Its
// output is bit for bit kUnbiased's whenever kUnbiased's winner is i.
enum class RangeMode : uint8_t { kMinMax = 0, kSearch = 1, kUnbiased = 3, kUnbiasedFixed0 = 16 };
inline constexpr uint32_t kRangeSearchCandidates = 8;
inline constexpr uint32_t kUnbiasedSteps = 98304;        // positions v in [0, kUnbiasedSteps]
inline constexpr uint32_t kUnbiasedStepsPerLevel = 2048;  // L = v / 2048 in [0, 48]
inline constexpr uint32_t kUnbiasedLevels = 49;
// The byte of "unbiased-fixed i" (i in [0, 8)).
inline constexpr RangeMode UnbiasedFixed(int i) {
  return static_cast<RangeMode>(static_cast<uint8_t>(RangeMode::kUnbiasedFixed0) + i);
}
inline constexpr bool IsUnbiasedFixed(RangeMode m) {
  return static_cast<uint8_t>(m) >= 16 && static_cast<uint8_t>(m) < 16 + kRangeSearchCandidates;
}
// The candidate i of an unbiased-fixed mode (only meaningful when IsUnbiasedFixed(m)).
inline constexpr int FixedCandidate(RangeMode m) { return static_cast<int>(m) - 16; }
// True for the byte values of RangeMode (0, 1, 3, 16..23).
inline constexpr bool IsRangeMode(uint8_t m) {
  return m == 0 || m == 1 || m == 3 || IsUnbiasedFixed(static_cast<RangeMode>(m));
}
// A short name: "minmax", "search", "unbiased", "fixed0".."fixed7"; "?" for other bytes.
const char* RangeModeName(RangeMode m);

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

// Calibration of the unbiased-fixed modes: adds to scores[i], i = 0..7, candidate i's unbiased
// v2 score E (docs/FORMAT.md §1.3.1, what kUnbiased minimises per group) summed over the row's
// d/group groups; best (if not null) gets the sum of each group's smallest score, i.e. the
// score of kUnbiased itself. A NaN score counts as +inf.
void AddUnbiasedScores(const float* x, uint32_t d, uint32_t group, double* scores,
                       double* best = nullptr);

}  // namespace oscarkv
