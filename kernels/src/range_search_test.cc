// Write-time range selection (RangeMode::kSearch, docs/FORMAT.md §1.3.1).
#include <cmath>
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
