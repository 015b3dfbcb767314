// Write-time range selection (RangeMode::kSearch, kUnbiased and the unbiased-fixed modes,
// docs/FORMAT.md §1.3.1).
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
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
// and the score as the spec writes them (no FMA contraction: x86-64 baseline build). only >= 0:
// the unbiased-fixed mode of that candidate (the one candidate, no score needed).
// Returns the chosen candidate.
int SpecUnbiasedGroup(const float* x, uint32_t g, uint8_t* codes, uint16_t* sm, int only = -1) {
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
  int chosen = 0;
  for (int i = only < 0 ? 0 : only; i < (only < 0 ? 8 : only + 1); ++i) {
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
    if (i == 0 || i == only || e < best) {
      best = e;
      chosen = i;
      sm[0] = p.scale16;
      sm[1] = p.min16;
      std::copy(c, c + g, codes);
    }
  }
  return chosen;
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

// Rows of many kinds for the unbiased-fixed tests: Gaussian at scales 2^-15..2^14, shifted,
// outliers, ties (few distinct values), constant rows and groups, +-inf, huge values (saturating
// at +-65504), subnormals, signed zeros, two-valued rows.
std::vector<float> EdgeRow(std::mt19937& rng, int kind) {
  std::normal_distribution<float> nd;
  std::vector<float> x(128);
  const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 30) - 15);
  for (auto& v : x) v = nd(rng) * scale;
  const float inf = std::numeric_limits<float>::infinity();
  switch (kind % 10) {
    case 0: break;
    case 1: for (auto& v : x) v += 3.0f * scale; break;
    case 2: for (int t = 0; t < 4; ++t) x[rng() % 128] *= 30.0f; break;
    case 3: for (auto& v : x) v = std::round(v / scale * 2.0f) * scale; break;
    case 4: std::fill(x.begin() + (kind % 20 == 4 ? 0 : 64), x.end(), x[0]); break;
    case 5: x[rng() % 128] = inf; x[rng() % 128] = -inf; break;
    case 6: x[rng() % 128] = 1e30f; x[rng() % 128] = -7e4f; break;
    case 7: for (auto& v : x) v = nd(rng) * 1e-39f; break;
    case 8: for (int j = 0; j < 128; j += 2) x[j] = (j % 4) ? 0.0f : -0.0f; break;
    case 9: for (auto& v : x) v = (rng() & 1) ? scale : -0.5f * scale; break;
  }
  return x;
}

bool SameGroup(const std::vector<uint8_t>& ca, const std::vector<uint16_t>& pa,
               const std::vector<uint8_t>& cb, const std::vector<uint16_t>& pb, uint32_t g0,
               uint32_t g) {
  if (pa[2 * (g0 / g)] != pb[2 * (g0 / g)] || pa[2 * (g0 / g) + 1] != pb[2 * (g0 / g) + 1]) return false;
  for (uint32_t j = g0; j < g0 + g; ++j) {
    if (((ca[j / 4] >> (2 * (j % 4))) & 3) != ((cb[j / 4] >> (2 * (j % 4))) & 3)) return false;
  }
  return true;
}

TEST(RangeUnbiasedFixed, ModeBytes) {
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(static_cast<int>(UnbiasedFixed(i)), 16 + i);
    EXPECT_TRUE(IsUnbiasedFixed(UnbiasedFixed(i)));
    EXPECT_EQ(FixedCandidate(UnbiasedFixed(i)), i);
    EXPECT_EQ(std::string(RangeModeName(UnbiasedFixed(i))), "fixed" + std::to_string(i));
  }
  for (int m = 0; m < 256; ++m) {
    const bool known = m == 0 || m == 1 || m == 3 || (m >= 16 && m <= 23);
    EXPECT_EQ(IsRangeMode(static_cast<uint8_t>(m)), known) << m;
    EXPECT_EQ(IsUnbiasedFixed(static_cast<RangeMode>(m)), m >= 16 && m <= 23) << m;
  }
  EXPECT_EQ(std::string(RangeModeName(RangeMode::kUnbiased)), "unbiased");
  EXPECT_EQ(std::string(RangeModeName(static_cast<RangeMode>(2))), "?");
}

// Mode 16+i against the rule written out (SpecUnbiasedGroup restricted to candidate i).
TEST(RangeUnbiasedFixed, FollowsTheSpecifiedRule) {
  std::mt19937 rng(61);
  int groups = 0;
  for (uint32_t g : {32u, 64u, 128u}) {
    for (int trial = 0; trial < 1500; ++trial) {
      const std::vector<float> x = EdgeRow(rng, trial);
      for (int i = 0; i < 8; ++i) {
        std::vector<uint8_t> c(32);
        std::vector<uint16_t> p(2 * 128 / g);
        QuantizeRowInt2(x.data(), 128, g, UnbiasedFixed(i), c.data(), p.data());
        for (uint32_t g0 = 0; g0 < 128; g0 += g) {
          uint8_t sc[128];
          uint16_t sp[2];
          ASSERT_EQ(SpecUnbiasedGroup(x.data() + g0, g, sc, sp, i), i);
          ASSERT_EQ(p[2 * (g0 / g)], sp[0]) << "G" << g << " trial " << trial << " i " << i;
          ASSERT_EQ(p[2 * (g0 / g) + 1], sp[1]) << "G" << g << " trial " << trial << " i " << i;
          for (uint32_t j = 0; j < g; ++j) {
            ASSERT_EQ((c[(g0 + j) / 4] >> (2 * ((g0 + j) % 4))) & 3, sc[j])
                << "G" << g << " trial " << trial << " i " << i;
          }
          ++groups;
        }
      }
    }
  }
  EXPECT_EQ(groups, 8 * 1500 * (4 + 2 + 1));
}

// Whenever unbiased v2 picks candidate i for a group, mode 16+i stores the same bytes. The winner
// comes from the independent spec code and from AddUnbiasedScores (they must agree), and is
// among the fixed modes whose output matches v2's.
TEST(RangeUnbiasedFixed, EqualsUnbiasedWhereItsCandidateWins) {
  std::mt19937 rng(57);
  int winners[8] = {};
  int matched_others = 0;
  for (uint32_t g : {64u, 128u}) {
    for (int trial = 0; trial < 4000; ++trial) {
      const std::vector<float> x = EdgeRow(rng, trial);
      const uint32_t ng = 128 / g;
      std::vector<uint8_t> cu(32);
      std::vector<uint16_t> pu(2 * ng);
      QuantizeRowInt2(x.data(), 128, g, RangeMode::kUnbiased, cu.data(), pu.data());
      std::vector<std::vector<uint8_t>> cf(8, std::vector<uint8_t>(32));
      std::vector<std::vector<uint16_t>> pf(8, std::vector<uint16_t>(2 * ng));
      for (int i = 0; i < 8; ++i) {
        QuantizeRowInt2(x.data(), 128, g, UnbiasedFixed(i), cf[i].data(), pf[i].data());
      }
      for (uint32_t g0 = 0; g0 < 128; g0 += g) {
        uint8_t sc[128];
        uint16_t sp[2];
        const int win = SpecUnbiasedGroup(x.data() + g0, g, sc, sp);
        double scores[8] = {};
        AddUnbiasedScores(x.data() + g0, g, g, scores);
        const int argmin = static_cast<int>(std::min_element(scores, scores + 8) - scores);
        ASSERT_EQ(argmin, win) << "G" << g << " trial " << trial;
        ASSERT_TRUE(SameGroup(cf[win], pf[win], cu, pu, g0, g))
            << "G" << g << " trial " << trial << " winner " << win;
        for (int i = 0; i < 8; ++i) matched_others += i != win && SameGroup(cf[i], pf[i], cu, pu, g0, g);
        ++winners[win];
      }
    }
  }
  // Every candidate wins somewhere (the test covers all eight modes), and rows where several
  // candidates give the same bytes (constant groups, two-valued rows) occur.
  for (int i = 0; i < 8; ++i) EXPECT_GT(winners[i], 0) << "candidate " << i;
  EXPECT_GT(matched_others, 0);
}

// The refit makes the error orthogonal to the row and to the constant (up to the fp16 rounding
// of scale and min) for every fixed candidate; without it, the clipped candidates shrink rows.
TEST(RangeUnbiasedFixed, RefitKeepsRowsUnbiased) {
  std::mt19937 rng(71);
  std::normal_distribution<float> nd;
  double bias[8] = {}, sse[8] = {}, sse_v2 = 0, bias_norefit7 = 0, worst_row = 0;
  const int rows = 400;
  for (int trial = 0; trial < rows; ++trial) {
    std::vector<float> x(128);
    for (auto& v : x) v = nd(rng) + (trial % 2 ? 0.5f : 0.0f);
    double xx = 0;
    for (float v : x) xx += double{v} * v;
    std::vector<uint8_t> c(32);
    std::vector<uint16_t> p(2);
    std::vector<float> y(128);
    auto row_bias = [&](RangeMode m) {
      QuantizeRowInt2(x.data(), 128, 128, m, c.data(), p.data());
      DequantizeRowInt2(c.data(), p.data(), 128, 128, y.data());
      double ex = 0;
      for (int j = 0; j < 128; ++j) ex += (double{y[j]} - x[j]) * x[j];
      return ex / xx;
    };
    for (int i = 0; i < 8; ++i) {
      const double b = row_bias(UnbiasedFixed(i));
      bias[i] += b;
      worst_row = std::max(worst_row, std::fabs(b));
      sse[i] += Sse(x, y);
    }
    row_bias(RangeMode::kUnbiased);
    sse_v2 += Sse(x, y);
    // Candidate 7's codes with its range parameters (no refit).
    const float mn = *std::min_element(x.begin(), x.end()), mx = *std::max_element(x.begin(), x.end());
    const float w = mx - mn, f = 7.0f / 32.0f;
    const GroupParams r = ComputeRangeParams(mn + f * w, mx - f * w);
    QuantizeRowInt2(x.data(), 128, 128, UnbiasedFixed(7), c.data(), p.data());
    p = {r.scale16, r.min16};
    DequantizeRowInt2(c.data(), p.data(), 128, 128, y.data());
    double ex = 0;
    for (int j = 0; j < 128; ++j) ex += (double{y[j]} - x[j]) * x[j];
    bias_norefit7 += ex / xx / rows;
  }
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(bias[i] / rows, 0.0, 2e-4) << "candidate " << i;
    // v2 keeps the smallest score per group: never worse in total than one fixed candidate.
    EXPECT_LE(sse_v2, sse[i] * 1.001) << "candidate " << i;
  }
  EXPECT_LT(worst_row, 3e-3);
  EXPECT_LT(bias_norefit7, -0.01);  // what the check would see without the refit
  // Gaussian rows: the best single candidate is within a few percent of v2.
  EXPECT_LT(*std::min_element(sse, sse + 8), 1.05 * sse_v2);
}

TEST(RangeUnbiasedFixed, AddUnbiasedScoresSumsGroups) {
  std::mt19937 rng(83);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> x = EdgeRow(rng, trial);
    double whole[8] = {}, parts[8] = {}, best = 0, best_parts = 0;
    AddUnbiasedScores(x.data(), 128, 64, whole, &best);
    for (uint32_t g0 : {0u, 64u}) {
      double one[8] = {};
      AddUnbiasedScores(x.data() + g0, 64, 64, one);
      for (int i = 0; i < 8; ++i) parts[i] += one[i];
      best_parts += *std::min_element(one, one + 8);
    }
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(whole[i], parts[i]) << trial;
      EXPECT_LE(best, whole[i]) << trial;
      EXPECT_GE(whole[i], 0.0) << trial;
    }
    EXPECT_EQ(best, best_parts) << trial;
  }
}

// Codes of +-inf (the comparison rule of §1.3 step 3) and signed zeros (-0 counts as +0), in
// every range mode: the parameters stay finite and do not depend on the order of the zeros.
TEST(Quantize, InfinitiesAndSignedZeros) {
  const float inf = std::numeric_limits<float>::infinity();
  for (RangeMode mode : {RangeMode::kMinMax, RangeMode::kSearch, RangeMode::kUnbiased,
                         UnbiasedFixed(0), UnbiasedFixed(6), UnbiasedFixed(7)}) {
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
  // Each fixed candidate is its own byte in the digest.
  RotationSet c = b;
  c.set_range_mode(1, KV::kValue, 0, UnbiasedFixed(6));
  RotationSet e = b;
  e.set_range_mode(1, KV::kValue, 0, UnbiasedFixed(7));
  EXPECT_NE(c.Digest(), b.Digest());
  EXPECT_NE(c.Digest(), e.Digest());
  EXPECT_EQ(c.range_mode(1, KV::kValue, 0), UnbiasedFixed(6));
}

}  // namespace
}  // namespace oscarkv
