// Write-time range selection (RangeMode::kSearch, docs/FORMAT.md §1.3.1).
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/quantize.h"
#include "oscarkv/kernels/rotation.h"

namespace oscarkv {
namespace {

double Sse(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0;
  for (size_t i = 0; i < x.size(); ++i) e += double(x[i] - y[i]) * (x[i] - y[i]);
  return e;
}

TEST(RangeSearch, NeverWorseThanMinMaxAndUsuallyBetter) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n;
  int better = 0;
  for (uint32_t g : {32u, 64u, 128u}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> x(128);
      for (auto& v : x) v = n(rng) * 0.3f + 0.01f * trial;
      std::vector<uint8_t> c0(32), c1(32);
      std::vector<uint16_t> p0(2 * 128 / g), p1(2 * 128 / g);
      QuantizeRowInt2(x.data(), 128, g, c0.data(), p0.data());
      QuantizeRowInt2(x.data(), 128, g, RangeMode::kSearch, c1.data(), p1.data());
      std::vector<float> y0(128), y1(128);
      DequantizeRowInt2(c0.data(), p0.data(), 128, g, y0.data());
      DequantizeRowInt2(c1.data(), p1.data(), 128, g, y1.data());
      // The integer score is a fine-grained proxy of the SSE; allow its rounding slack.
      EXPECT_LE(Sse(x, y1), Sse(x, y0) * 1.02 + 1e-6);
      better += Sse(x, y1) < 0.9 * Sse(x, y0);
    }
  }
  EXPECT_GT(better, 300);  // Gaussian rows: the MSE-optimal range is well inside min-max
}

TEST(RangeSearch, MinMaxModeIsTheOriginalQuantizer) {
  std::mt19937 rng(9);
  std::normal_distribution<float> n;
  std::vector<float> x(128);
  for (auto& v : x) v = n(rng);
  std::vector<uint8_t> c0(32), c1(32);
  std::vector<uint16_t> p0(2), p1(2);
  QuantizeRowInt2(x.data(), 128, 128, c0.data(), p0.data());
  QuantizeRowInt2(x.data(), 128, 128, RangeMode::kMinMax, c1.data(), p1.data());
  EXPECT_EQ(c0, c1);
  EXPECT_EQ(p0, p1);
}

TEST(RangeSearch, ConstantGroupIsExact) {
  std::vector<float> x(64, 0.75f);
  std::vector<uint8_t> c(16);
  std::vector<uint16_t> p(2);
  QuantizeRowInt2(x.data(), 64, 64, RangeMode::kSearch, c.data(), p.data());
  std::vector<float> y(64);
  DequantizeRowInt2(c.data(), p.data(), 64, 64, y.data());
  for (float v : y) EXPECT_NEAR(v, 0.75f, 1e-3f);
}

TEST(RangeUnbiased, ErrorIsOrthogonalToTheRowAndLowerThanMinMax) {
  // The refit makes sum(e) = 0 and sum(e*x) = 0 up to fp16 rounding of (scale, min), so the
  // dot product of the row with itself (a perfectly aligned query) is preserved; the MSE stays
  // below min-max's on Gaussian rows.
  std::mt19937 rng(13);
  std::normal_distribution<float> n;
  double bias_sum = 0, err_u = 0, err_mm = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<float> x(128);
    for (auto& v : x) v = n(rng);
    std::vector<uint8_t> c(32), c0(32);
    std::vector<uint16_t> p(2), p0(2);
    QuantizeRowInt2(x.data(), 128, 128, RangeMode::kUnbiased, c.data(), p.data());
    QuantizeRowInt2(x.data(), 128, 128, c0.data(), p0.data());
    std::vector<float> y(128), y0(128);
    DequantizeRowInt2(c.data(), p.data(), 128, 128, y.data());
    DequantizeRowInt2(c0.data(), p0.data(), 128, 128, y0.data());
    double xx = 0, xy = 0;
    for (int j = 0; j < 128; ++j) {
      xx += double(x[j]) * x[j];
      xy += double(x[j]) * y[j];
    }
    bias_sum += xy / xx - 1.0;
    err_u += Sse(x, y);
    err_mm += Sse(x, y0);
  }
  EXPECT_NEAR(bias_sum / 400, 0.0, 2e-3);
  EXPECT_LT(err_u, 0.85 * err_mm);
}

TEST(RangeUnbiased, DeterministicAndDecodable) {
  std::mt19937 rng(21);
  std::normal_distribution<float> n;
  for (uint32_t g : {32u, 64u, 128u}) {
    std::vector<float> x(128);
    for (auto& v : x) v = 3 * n(rng) + 1;
    std::vector<uint8_t> a(32), b(32);
    std::vector<uint16_t> pa(2 * 128 / g), pb(2 * 128 / g);
    QuantizeRowInt2(x.data(), 128, g, RangeMode::kUnbiased, a.data(), pa.data());
    QuantizeRowInt2(x.data(), 128, g, RangeMode::kUnbiased, b.data(), pb.data());
    EXPECT_EQ(a, b);
    EXPECT_EQ(pa, pb);
    std::vector<float> y(128);
    DequantizeRowInt2(a.data(), pa.data(), 128, g, y.data());
    for (float v : y) EXPECT_TRUE(std::isfinite(v));
  }
  std::vector<float> flat(64, -2.5f);
  std::vector<uint8_t> c(16);
  std::vector<uint16_t> p(2);
  QuantizeRowInt2(flat.data(), 64, 64, RangeMode::kUnbiased, c.data(), p.data());
  std::vector<float> y(64);
  DequantizeRowInt2(c.data(), p.data(), 64, 64, y.data());
  for (float v : y) EXPECT_NEAR(v, -2.5f, 1e-3f);
}

// docs/FORMAT.md §1.3.1 (unbiased v2), written out independently: per candidate, every
// element's code from its level, the sums element by element (no level histogram), the refit
// and the score as the spec writes them (no FMA contraction: x86-64 baseline build).
void SpecUnbiasedGroup(const float* x, uint32_t g, uint8_t* codes, uint16_t* sm) {
  float mn = x[0], mx = x[0];
  for (uint32_t j = 1; j < g; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
  mn = std::clamp(mn, -65504.0f, 65504.0f);
  mx = std::clamp(mx, -65504.0f, 65504.0f);
  const float w = mx - mn;
  std::vector<int64_t> v(g);
  for (uint32_t j = 0; j < g; ++j) {
    if (!(w > 0)) {
      v[j] = 0;
      continue;
    }
    const float k = 1.0f / w, b = -(mn * k);
    const float u = std::clamp(std::isnan(std::fma(x[j], k, b)) ? 0.0f : std::fma(x[j], k, b), 0.0f, 1.0f);
    v[j] = static_cast<int64_t>(std::floor(double{u} * 98304.0));
  }
  int64_t V1 = 0, V2 = 0;
  for (uint32_t j = 0; j < g; ++j) {
    V1 += v[j];
    V2 += v[j] * v[j];
  }
  const double G = g, delta = double{w} / 98304.0;
  double best = 0;
  for (int i = 0; i < 8; ++i) {
    uint8_t c[128];
    int64_t C1 = 0, C2 = 0, Y1 = 0;
    for (uint32_t j = 0; j < g; ++j) {
      const int64_t L = v[j] / 2048;
      c[j] = static_cast<uint8_t>((L >= 8 + i) + (L >= 24) + (L >= 40 - i));
      C1 += c[j];
      C2 += c[j] * c[j];
      Y1 += c[j] * v[j];
    }
    const float f = i / 32.0f;
    GroupParams p = ComputeRangeParams(i == 0 ? mn : mn + f * w, i == 0 ? mx : mx - f * w);
    const int64_t det = int64_t{g} * Y1 - C1 * V1, num = int64_t{g} * V2 - V1 * V1;
    if (det > 0 && num > 0) {
      const double s = double(num) / double(det);
      const double m = ((double(V1) + G / 2) - s * double(C1)) / G;
      p = {FloatToHalf(static_cast<float>(std::clamp(s * delta, -65504.0, 65504.0))),
           FloatToHalf(static_cast<float>(std::clamp(double{mn} + m * delta, -65504.0, 65504.0)))};
    }
    const double pm = double{HalfToFloat(p.min16)} - double{mn}, q = HalfToFloat(p.scale16);
    const double z1 = double(V1) + G / 2, z2 = (double(V2) + double(V1)) + G / 4;
    const double zy = double(Y1) + double(C1) / 2;
    const double t1 = (G * pm) * pm, t2 = ((2.0 * pm) * q) * double(C1), t3 = (q * q) * double(C2);
    const double t4 = ((2.0 * pm) * delta) * z1, t5 = ((2.0 * q) * delta) * zy, t6 = (delta * delta) * z2;
    double e = ((((t1 + t2) + t3) - t4) - t5) + t6;
    if (std::isnan(e)) e = INFINITY;
    if (i == 0 || e < best) {
      best = e;
      sm[0] = p.scale16;
      sm[1] = p.min16;
      std::copy(c, c + g, codes);
    }
  }
}

// Candidate i's level thresholds are its range's code thresholds: with exact (unrounded) range
// parameters, the §1.3 codes of the range and the level codes agree except within fp32 rounding
// of a threshold.
TEST(RangeUnbiased, LevelThresholdsAreTheCandidateRangesThresholds) {
  std::mt19937 rng(41);
  std::normal_distribution<float> nd;
  int64_t total = 0, differ = 0;
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<float> x(128);
    for (auto& t : x) t = nd(rng);
    const float mn = *std::min_element(x.begin(), x.end()), mx = *std::max_element(x.begin(), x.end());
    const float w = mx - mn, k = 1.0f / w, b = -(mn * k);
    for (int i = 0; i < 8; ++i) {
      const double lo = double{mn} + double{w} * i / 32.0, sc = double{w} * (1.0 - i / 16.0) / 3.0;
      for (float xj : x) {
        const double t = (double{xj} - lo) / sc + 0.5;
        const int exact = (t >= 1) + (t >= 2) + (t >= 3);
        const float u = std::clamp(std::fma(xj, k, b), 0.0f, 1.0f);
        const int64_t L = static_cast<int64_t>(std::floor(double{u} * 98304.0)) / 2048;
        const int level = (L >= 8 + i) + (L >= 24) + (L >= 40 - i);
        ++total;
        differ += exact != level;
      }
    }
  }
  EXPECT_LT(differ, total / 10000 + 1) << differ << " of " << total;
}

TEST(RangeUnbiased, FollowsTheSpecifiedRule) {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  int rows = 0;
  for (uint32_t g : {32u, 64u, 128u}) {
    for (int trial = 0; trial < 6000; ++trial) {
      std::vector<float> x(128);
      const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 30) - 15);
      for (auto& v : x) v = (nd(rng) + (trial % 3 == 0 ? 3.0f : 0.0f)) * scale;
      if (trial % 7 == 0) x[rng() % 128] = x[rng() % 128];  // ties
      std::vector<uint8_t> c(32);
      std::vector<uint16_t> p(2 * 128 / g);
      QuantizeRowInt2(x.data(), 128, g, RangeMode::kUnbiased, c.data(), p.data());
      for (uint32_t g0 = 0; g0 < 128; g0 += g) {
        uint8_t sc[128];
        uint16_t sp[2];
        SpecUnbiasedGroup(x.data() + g0, g, sc, sp);
        ASSERT_EQ(p[2 * (g0 / g)], sp[0]) << "G" << g << " trial " << trial;
        ASSERT_EQ(p[2 * (g0 / g) + 1], sp[1]) << "G" << g << " trial " << trial;
        for (uint32_t j = 0; j < g; ++j) {
          ASSERT_EQ((c[(g0 + j) / 4] >> (2 * ((g0 + j) % 4))) & 3, sc[j]) << "G" << g << " trial " << trial;
        }
      }
      ++rows;
    }
  }
  EXPECT_EQ(rows, 18000);
}

// Codes of +-inf (the comparison rule of §1.3 step 3) and signed zeros (-0 counts as +0), in
// every range mode: the parameters stay finite and do not depend on the order of the zeros.
TEST(Quantize, InfinitiesAndSignedZeros) {
  const float inf = std::numeric_limits<float>::infinity();
  for (RangeMode mode : {RangeMode::kMinMax, RangeMode::kSearch, RangeMode::kUnbiased}) {
    std::vector<float> x(128);
    for (int j = 0; j < 128; ++j) x[j] = 0.01f * static_cast<float>(j % 17) - 0.05f;
    x[5] = inf;
    x[77] = -inf;
    std::vector<uint8_t> c(32);
    std::vector<uint16_t> p(2);
    QuantizeRowInt2(x.data(), 128, 128, mode, c.data(), p.data());
    EXPECT_EQ((c[5 / 4] >> (2 * (5 % 4))) & 3, 3) << int(mode);
    EXPECT_EQ((c[77 / 4] >> (2 * (77 % 4))) & 3, 0) << int(mode);
    EXPECT_TRUE(std::isfinite(HalfToFloat(p[0])) && std::isfinite(HalfToFloat(p[1])));
    std::vector<float> z(64, 0.0f), zr(64, 0.0f);
    for (int j = 0; j < 64; ++j) (j % 3 ? z[j] : zr[j]) = -0.0f;
    std::vector<uint8_t> ca(16), cb(16);
    std::vector<uint16_t> pa(2), pb(2);
    QuantizeRowInt2(z.data(), 64, 64, mode, ca.data(), pa.data());
    QuantizeRowInt2(zr.data(), 64, 64, mode, cb.data(), pb.data());
    EXPECT_EQ(pa, pb) << int(mode);
    EXPECT_EQ(ca, cb) << int(mode);
    EXPECT_EQ(pa[1], 0u) << "min16 of zeros is +0";
  }
}

TEST(RangeSearch, DigestUnchangedUnlessAModeIsSet) {
  RotationSet a = RotationSet::Hadamard(2, 2, 64);
  RotationSet b = a;
  b.set_range_mode(1, KV::kValue, 0, RangeMode::kMinMax);
  EXPECT_EQ(a.Digest(), b.Digest());
  b.set_range_mode(1, KV::kValue, 0, RangeMode::kSearch);
  EXPECT_NE(a.Digest(), b.Digest());
  EXPECT_EQ(b.range_mode(1, KV::kValue, 0), RangeMode::kSearch);
  EXPECT_EQ(b.range_mode(1, KV::kKey, 0), RangeMode::kMinMax);
}

}  // namespace
}  // namespace oscarkv
