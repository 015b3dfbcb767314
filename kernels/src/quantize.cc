#include "oscarkv/kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "oscarkv/kernels/numeric.h"

namespace oscarkv {

float AbsQuantile(std::span<const float> x, float c) {
  if (c >= 1.0f || x.empty()) return std::numeric_limits<float>::infinity();
  std::vector<float> a(x.size());
  for (size_t i = 0; i < x.size(); ++i) a[i] = std::fabs(x[i]);
  const double pos = static_cast<double>(std::max(0.0f, c)) * static_cast<double>(a.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const float frac = static_cast<float>(pos - static_cast<double>(lo));
  // Order statistics lo and lo+1 without a full sort: after nth_element, a[lo] is in place and
  // the next order statistic is the minimum of the elements after it.
  std::nth_element(a.begin(), a.begin() + lo, a.end());
  const float a_lo = a[lo];
  const float a_hi = lo + 1 < a.size() ? *std::min_element(a.begin() + lo + 1, a.end()) : a_lo;
  return a_lo + frac * (a_hi - a_lo);
}

void ClipRowAtQuantile(std::span<float> x, float c) {
  if (c >= 1.0f) return;
  const float t = AbsQuantile(x, c);
  for (float& v : x) v = std::clamp(v, -t, t);
}

namespace {

// clamp(floor(t), 0, 3) for finite t, written as comparisons so that +inf gives 3 and -inf or
// NaN give 0 (docs/FORMAT.md §1.3 step 3; the CUDA kernels' saturating conversion agrees).
inline int CodeOf(float t) { return (t >= 1.0f) + (t >= 2.0f) + (t >= 3.0f); }

}  // namespace

GroupParams ComputeGroupParams(const float* x, uint32_t n) {
  float mn = x[0], mx = x[0];
  for (uint32_t i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  return ComputeRangeParams(mn, mx);
}

GroupParams ComputeRangeParams(float mn, float mx) {
  // Saturate to the finite fp16 range so stored parameters are never inf.
  mn = std::clamp(mn, -65504.0f, 65504.0f);
  mx = std::clamp(mx, -65504.0f, 65504.0f);
  // -0 counts as +0 (min/max of a row mixing signed zeros may return either).
  if (mn == 0.0f) mn = 0.0f;
  if (mx == 0.0f) mx = 0.0f;
  uint16_t min16 = FloatToHalf(mn, RoundMode::kDown);
  if (min16 == 0xfc00) min16 = 0xfbff;  // -inf -> -65504
  const float minf = HalfToFloat(min16);
  uint16_t scale16 = FloatToHalf((mx - minf) / 3.0f, RoundMode::kUp);
  if (scale16 == 0x7c00) scale16 = 0x7bff;
  if (scale16 & 0x8000) scale16 = 0;  // -0
  return {scale16, min16};
}

void QuantizeRowInt2(const float* x, uint32_t d, uint32_t group, uint8_t* codes,
                     uint16_t* scale_min) {
  std::fill(codes, codes + d / 4, uint8_t{0});
  for (uint32_t g0 = 0, gi = 0; g0 < d; g0 += group, ++gi) {
    const GroupParams p = ComputeGroupParams(x + g0, group);
    scale_min[2 * gi] = p.scale16;
    scale_min[2 * gi + 1] = p.min16;
    const float minf = HalfToFloat(p.min16), sf = HalfToFloat(p.scale16);
    const float inv = sf > 0 ? 1.0f / sf : 0.0f;
    for (uint32_t j = g0; j < g0 + group; ++j) {
      // Written as separate multiply and add (no FMA) to match the CUDA kernel bit for bit;
      // this file is compiled with -ffp-contract=off.
      const int c = CodeOf((x[j] - minf) * inv + 0.5f);
      codes[j / 4] |= static_cast<uint8_t>(c << (2 * (j % 4)));
    }
  }
}

namespace {

// Codes of x[0..n) for the given parameters into `codes` (one byte per element, 0..3).
void GroupCodes(const float* x, uint32_t n, GroupParams p, uint8_t* out) {
  const float minf = HalfToFloat(p.min16), sf = HalfToFloat(p.scale16);
  const float inv = sf > 0 ? 1.0f / sf : 0.0f;
  for (uint32_t j = 0; j < n; ++j) out[j] = static_cast<uint8_t>(CodeOf((x[j] - minf) * inv + 0.5f));
}

// Sum of the per-chunk partials p[0..n) (n = G/32 chunks of 32 channels) by the fixed tree of
// docs/FORMAT.md §1.3.1: ((p0 + p1) + (p2 + p3)) for four chunks, p0 + p1 for two.
double ChunkTree(const double* p, uint32_t n) {
  if (n == 1) return p[0];
  if (n == 2) return p[0] + p[1];
  return (p[0] + p[1]) + (p[2] + p[3]);
}

}  // namespace

void QuantizeRowInt2(const float* x, uint32_t d, uint32_t group, RangeMode mode, uint8_t* codes,
                     uint16_t* scale_min) {
  if (mode == RangeMode::kMinMax) {
    QuantizeRowInt2(x, d, group, codes, scale_min);
    return;
  }
  std::fill(codes, codes + d / 4, uint8_t{0});
  uint8_t cand[256], best[256];
  for (uint32_t g0 = 0, gi = 0; g0 < d; g0 += group, ++gi) {
    const float* xg = x + g0;
    float mn = xg[0], mx = xg[0];
    for (uint32_t i = 1; i < group; ++i) {
      mn = std::min(mn, xg[i]);
      mx = std::max(mx, xg[i]);
    }
    mn = std::clamp(mn, -65504.0f, 65504.0f);
    mx = std::clamp(mx, -65504.0f, 65504.0f);
    const float width = mx - mn;
    GroupParams best_p = ComputeRangeParams(mn, mx);
    if (mode == RangeMode::kUnbiased) {
      // docs/FORMAT.md §1.3.1: chunk partials (32 consecutive channels, ascending) combined by
      // a fixed tree, X1 partials in fp32, the score from the sums. The CUDA kernel evaluates
      // the same expressions in the same order (one lane per chunk, an xor butterfly).
      const uint32_t chunks = group / 32;
      double s1p[4] = {}, s2p[4] = {};
      for (uint32_t k = 0; k < chunks; ++k) {
        double a = 0, b = 0;
        for (uint32_t j = 32 * k; j < 32 * k + 32; ++j) {
          const double xj = xg[j];
          a += xj;
          b += xj * xj;  // exact: a product of two floats fits a double
        }
        s1p[k] = a;
        s2p[k] = b;
      }
      const double s1 = ChunkTree(s1p, chunks), s2 = ChunkTree(s2p, chunks), n = group;
      double best_err = 0;
      for (uint32_t i = 0; i < kRangeSearchCandidates; ++i) {
        const float f = static_cast<float>(i) / 32.0f;
        GroupParams p = ComputeRangeParams(i == 0 ? mn : mn + f * width, i == 0 ? mx : mx - f * width);
        GroupCodes(xg, group, p, cand);
        double x1p[4] = {};
        int32_t c1i = 0, c2i = 0;
        for (uint32_t k = 0; k < chunks; ++k) {
          float a = 0.0f;
          for (uint32_t j = 32 * k; j < 32 * k + 32; ++j) {
            const float cf = static_cast<float>(cand[j]);
            a = a + cf * xg[j];  // fp32, unfused (-ffp-contract=off)
            c1i += cand[j];
            c2i += cand[j] * cand[j];
          }
          x1p[k] = a;
        }
        const double x1 = ChunkTree(x1p, chunks), c1 = c1i, c2 = c2i;
        const double det = n * x1 - c1 * s1;
        if (det > 0) {
          const double scale = (n * s2 - s1 * s1) / det;
          if (scale > 0) {
            const double mn_fit = (s1 - scale * c1) / n;
            const auto sat = [](double v) { return static_cast<float>(std::clamp(v, -65504.0, 65504.0)); };
            p = {FloatToHalf(sat(scale)), FloatToHalf(sat(mn_fit))};
          }
        }
        // Σ (m + c·s − x)² expanded over the sums, left to right (NaN counts as +inf).
        const double m = HalfToFloat(p.min16), sc = HalfToFloat(p.scale16);
        double err = n * m * m + 2.0 * m * sc * c1 + sc * sc * c2 - 2.0 * m * s1 - 2.0 * sc * x1 + s2;
        if (std::isnan(err)) err = std::numeric_limits<double>::infinity();
        if (i == 0 || err < best_err) {
          best_err = err;
          best_p = p;
          std::copy_n(cand, group, best);
        }
      }
      scale_min[2 * gi] = best_p.scale16;
      scale_min[2 * gi + 1] = best_p.min16;
      for (uint32_t j = 0; j < group; ++j) {
        codes[(g0 + j) / 4] |= static_cast<uint8_t>(best[j] << (2 * ((g0 + j) % 4)));
      }
      continue;
    }
    GroupCodes(xg, group, best_p, best);
    const float s0 = HalfToFloat(best_p.scale16);
    if (s0 > 0) {
      const float unit_inv = (1.0f / s0) * 64.0f;
      uint64_t best_err = UINT64_MAX;
      for (uint32_t i = 0; i < kRangeSearchCandidates; ++i) {
        const float f = static_cast<float>(i) / 32.0f;
        const GroupParams p = i == 0 ? best_p : ComputeRangeParams(mn + f * width, mx - f * width);
        GroupCodes(xg, group, p, cand);
        const float minf = HalfToFloat(p.min16), sf = HalfToFloat(p.scale16);
        uint64_t err = 0;
        for (uint32_t j = 0; j < group; ++j) {
          const float xhat = minf + static_cast<float>(cand[j]) * sf;
          const float e = std::fabs(xg[j] - xhat) * unit_inv;
          const uint64_t q = static_cast<uint64_t>(std::min(std::floor(e), 65535.0f));
          err += q * q;
        }
        if (err < best_err) {
          best_err = err;
          best_p = p;
          std::copy_n(cand, group, best);
        }
      }
    }
    scale_min[2 * gi] = best_p.scale16;
    scale_min[2 * gi + 1] = best_p.min16;
    for (uint32_t j = 0; j < group; ++j) {
      codes[(g0 + j) / 4] |= static_cast<uint8_t>(best[j] << (2 * ((g0 + j) % 4)));
    }
  }
}

void DequantizeRowInt2(const uint8_t* codes, const uint16_t* scale_min, uint32_t d,
                       uint32_t group, float* out) {
  for (uint32_t g0 = 0, gi = 0; g0 < d; g0 += group, ++gi) {
    const float sf = HalfToFloat(scale_min[2 * gi]), minf = HalfToFloat(scale_min[2 * gi + 1]);
    for (uint32_t j = g0; j < g0 + group; ++j) {
      const int c = (codes[j / 4] >> (2 * (j % 4))) & 3;
      out[j] = minf + static_cast<float>(c) * sf;
    }
  }
}

}  // namespace oscarkv
