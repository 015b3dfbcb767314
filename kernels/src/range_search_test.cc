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
