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

// The group's minimum and maximum, saturated to the finite fp16 range.
void SaturatedMinMax(const float* x, uint32_t n, float* mn_out, float* mx_out) {
  float mn = x[0], mx = x[0];
  for (uint32_t i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  *mn_out = std::clamp(mn, -65504.0f, 65504.0f);
  *mx_out = std::clamp(mx, -65504.0f, 65504.0f);
}

}  // namespace

GroupParams ComputeGroupParams(const float* x, uint32_t n) {
  float mn, mx;
  SaturatedMinMax(x, n, &mn, &mx);  // ComputeRangeParams saturates too
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

// One group's positions and per-level sums for the unbiased rules (docs/FORMAT.md §1.3.1).
struct UnbiasedLevels {
  uint32_t n = 0;
  float mn = 0, mx = 0, w = 0;
  uint32_t v[256];
  // Suffix counts and sums N(t) = #{L >= t}, Y(t) = sum of v over L >= t.
  uint32_t nsuf[kUnbiasedLevels + 1] = {}, ysuf[kUnbiasedLevels + 1] = {};
  int64_t V1 = 0, V2 = 0;
};

// mn, mx: the group's saturated minimum and maximum.
void ComputeLevels(const float* x, uint32_t n, float mn, float mx, UnbiasedLevels* s) {
  const float w = mx - mn;
  s->n = n;
  s->mn = mn;
  s->mx = mx;
  s->w = w;
  // Levels: u = sat(fma(x, k, b)) with k = 1/w, b = -(mn*k); v = floor(98304*u) in [0, 98304],
  // L = v / 2048 = floor(48u) in [0, 48]. Candidate i's codes are [L >= 8+i] + [L >= 24] +
  // [L >= 40-i], the code thresholds (in 48ths of the width) of its range [mn + wi/32, mx - wi/32].
  const float k = w > 0.0f ? 1.0f / w : 0.0f;
  const float b = -(mn * k);
  uint32_t cnt[kUnbiasedLevels] = {}, vsum[kUnbiasedLevels] = {};
  uint64_t v1 = 0, v2 = 0;
  for (uint32_t j = 0; j < n; ++j) {
    float u = std::fma(x[j], k, b);
    if (!(u > 0.0f)) u = 0.0f;  // NaN and negatives -> 0 (CUDA's .sat)
    if (u > 1.0f) u = 1.0f;
    const uint32_t vj = static_cast<uint32_t>(std::floor(static_cast<double>(u) * kUnbiasedSteps));  // exact
    s->v[j] = vj;
    const uint32_t level = vj / kUnbiasedStepsPerLevel;
    ++cnt[level];
    vsum[level] += vj;
    v1 += vj;
    v2 += uint64_t{vj} * vj;
  }
  for (int l = static_cast<int>(kUnbiasedLevels) - 1; l >= 0; --l) {
    s->nsuf[l] = s->nsuf[l + 1] + cnt[l];
    s->ysuf[l] = s->ysuf[l + 1] + vsum[l];
  }
  s->V1 = static_cast<int64_t>(v1);
  s->V2 = static_cast<int64_t>(v2);
}

// Candidate i of the unbiased rules: its refit parameters, or its range parameters when the
// refit does not apply; with `score`, also its score E (NaN -> +inf).
GroupParams UnbiasedCandidate(const UnbiasedLevels& s, int i, double* score) {
  const int t1 = 8 + i, t3 = 40 - i;
  const int64_t G = s.n, V1 = s.V1, V2 = s.V2;
  const int64_t n1 = s.nsuf[t1], n2 = s.nsuf[24], n3 = s.nsuf[t3];
  const int64_t c1 = n1 + n2 + n3;
  const int64_t y1 = int64_t{s.ysuf[t1]} + s.ysuf[24] + s.ysuf[t3];
  const float mn = s.mn, mx = s.mx, w = s.w;
  const float f = static_cast<float>(i) / 32.0f;
  GroupParams p = ComputeRangeParams(i == 0 ? mn : mn + f * w, i == 0 ? mx : mx - f * w);
  const int64_t num = G * V2 - V1 * V1;  // exact
  const int64_t det = G * y1 - c1 * V1;  // exact
  const double delta = static_cast<double>(w) / static_cast<double>(kUnbiasedSteps);
  const double gd = static_cast<double>(s.n), z1 = static_cast<double>(V1) + gd / 2.0;
  if (det > 0 && num > 0) {
    const double sc = static_cast<double>(num) / static_cast<double>(det);
    const double m = (z1 - sc * static_cast<double>(c1)) / gd;
    const double scale = sc * delta;
    const double minv = static_cast<double>(mn) + m * delta;
    const auto sat = [](double t) { return static_cast<float>(std::clamp(t, -65504.0, 65504.0)); };
    p = {FloatToHalf(sat(scale)), FloatToHalf(sat(minv))};
  }
  if (score != nullptr) {
    // Sum over the group of (min16 + c*scale16 - x~)^2 with x~ = mn + (v + 1/2)*delta, from the
    // sums, left to right (fp64, no fused operations); NaN counts as +inf.
    const int64_t c2 = n1 + 3 * n2 + 5 * n3;
    const double z2 = static_cast<double>(V2) + static_cast<double>(V1) + gd / 4.0;
    const double pm = static_cast<double>(HalfToFloat(p.min16)) - static_cast<double>(mn);
    const double q = HalfToFloat(p.scale16);
    const double dc1 = static_cast<double>(c1), dc2 = static_cast<double>(c2);
    const double zy = static_cast<double>(y1) + dc1 / 2.0;
    double err = gd * pm * pm + 2.0 * pm * q * dc1 + q * q * dc2 - 2.0 * pm * delta * z1 -
                 2.0 * q * delta * zy + delta * delta * z2;
    if (std::isnan(err)) err = std::numeric_limits<double>::infinity();
    *score = err;
  }
  return p;
}

// Candidate i's codes (one byte per element).
void UnbiasedCodes(const UnbiasedLevels& s, int i, uint8_t* codes) {
  const uint32_t a1 = (8 + i) * kUnbiasedStepsPerLevel, a2 = 24 * kUnbiasedStepsPerLevel,
                 a3 = (40 - i) * kUnbiasedStepsPerLevel;
  for (uint32_t j = 0; j < s.n; ++j) {
    codes[j] = static_cast<uint8_t>((s.v[j] >= a1) + (s.v[j] >= a2) + (s.v[j] >= a3));
  }
}

// RangeMode::kUnbiased ("unbiased v2") and the unbiased-fixed modes, docs/FORMAT.md §1.3.1.
// mn, mx: the group's saturated minimum and maximum. Writes the chosen candidate's codes (one
// byte per element) and parameters.
void UnbiasedGroup(const float* x, uint32_t n, float mn, float mx, RangeMode mode, uint8_t* codes,
                   GroupParams* out) {
  UnbiasedLevels s;
  ComputeLevels(x, n, mn, mx, &s);
  int best_i = 0;
  if (IsUnbiasedFixed(mode)) {
    best_i = FixedCandidate(mode);
    *out = UnbiasedCandidate(s, best_i, nullptr);
  } else {
    double best_err = 0.0;
    for (int i = 0; i < static_cast<int>(kRangeSearchCandidates); ++i) {
      double err = 0.0;
      const GroupParams p = UnbiasedCandidate(s, i, &err);
      if (i == 0 || err < best_err) {
        best_err = err;
        best_i = i;
        *out = p;
      }
    }
  }
  UnbiasedCodes(s, best_i, codes);
}

// RangeMode::kSearch, docs/FORMAT.md §1.3.1. mn, mx: the group's saturated minimum and maximum.
// Writes the chosen candidate's codes (one byte per element) and parameters.
void SearchGroup(const float* xg, uint32_t group, float mn, float mx, uint8_t* best,
                 GroupParams* out) {
  const float width = mx - mn;
  GroupParams best_p = ComputeRangeParams(mn, mx);
  uint8_t cand[256];
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
  *out = best_p;
}


}  // namespace

void QuantizeRowInt2(const float* x, uint32_t d, uint32_t group, RangeMode mode, uint8_t* codes,
                     uint16_t* scale_min) {
  if (mode == RangeMode::kMinMax) {
    QuantizeRowInt2(x, d, group, codes, scale_min);
    return;
  }
  std::fill(codes, codes + d / 4, uint8_t{0});
  uint8_t best[256];
  for (uint32_t g0 = 0, gi = 0; g0 < d; g0 += group, ++gi) {
    const float* xg = x + g0;
    float mn, mx;
    SaturatedMinMax(xg, group, &mn, &mx);
    GroupParams best_p{};
    if (mode == RangeMode::kUnbiased || IsUnbiasedFixed(mode)) {
      UnbiasedGroup(xg, group, mn, mx, mode, best, &best_p);
    } else {
      SearchGroup(xg, group, mn, mx, best, &best_p);
    }
    scale_min[2 * gi] = best_p.scale16;
    scale_min[2 * gi + 1] = best_p.min16;
    for (uint32_t j = 0; j < group; ++j) {
      codes[(g0 + j) / 4] |= static_cast<uint8_t>(best[j] << (2 * ((g0 + j) % 4)));
    }
  }
}

void AddUnbiasedScores(const float* x, uint32_t d, uint32_t group, double* scores, double* best) {
  for (uint32_t g0 = 0; g0 < d; g0 += group) {
    float mn, mx;
    SaturatedMinMax(x + g0, group, &mn, &mx);
    UnbiasedLevels s;
    ComputeLevels(x + g0, group, mn, mx, &s);
    double smallest = 0.0;
    for (int i = 0; i < static_cast<int>(kRangeSearchCandidates); ++i) {
      double e = 0.0;
      UnbiasedCandidate(s, i, &e);
      scores[i] += e;
      if (i == 0 || e < smallest) smallest = e;
    }
    if (best != nullptr) *best += smallest;
  }
}

const char* RangeModeName(RangeMode m) {
  static constexpr const char* kFixed[] = {"fixed0", "fixed1", "fixed2", "fixed3",
                                           "fixed4", "fixed5", "fixed6", "fixed7"};
  if (IsUnbiasedFixed(m)) return kFixed[FixedCandidate(m)];
  switch (m) {
    case RangeMode::kMinMax: return "minmax";
    case RangeMode::kSearch: return "search";
    case RangeMode::kUnbiased: return "unbiased";
    default: return "?";
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
