#include "oscarkv/kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/kernels/numeric.h"

namespace oscarkv {
namespace {

std::vector<float> RandomRow(std::mt19937& rng, uint32_t d, bool outliers) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(d);
  for (auto& v : x) v = n(rng);
  if (outliers) {
    for (int i = 0; i < 3; ++i) x[rng() % d] *= 20.0f;
  }
  return x;
}

TEST(Quantize, PackUnpackRoundTripOfCodes) {
  // Rows whose values are exactly representable on the 4-level grid come back exactly.
  std::mt19937 rng(7);
  for (uint32_t d : {64u, 128u, 256u}) {
    for (uint32_t g : {32u, 64u, 128u}) {
      if (g > d) continue;
      std::vector<float> x(d);
      std::vector<int> codes(d);
      for (uint32_t j = 0; j < d; ++j) {
        codes[j] = static_cast<int>(rng() % 4);
        x[j] = -1.0f + 0.5f * codes[j];
      }
      for (uint32_t g0 = 0; g0 < d; g0 += g) {  // make every group span the full range
        x[g0] = -1.0f, codes[g0] = 0;
        x[g0 + 1] = 0.5f, codes[g0 + 1] = 3;
      }
      std::vector<uint8_t> packed(d / 4);
      std::vector<uint16_t> sm(2 * d / g);
      QuantizeRowInt2(x.data(), d, g, packed.data(), sm.data());
      for (uint32_t j = 0; j < d; ++j) {
        ASSERT_EQ((packed[j / 4] >> (2 * (j % 4))) & 3, codes[j]) << d << " " << g << " " << j;
      }
      std::vector<float> y(d);
      DequantizeRowInt2(packed.data(), sm.data(), d, g, y.data());
      for (uint32_t j = 0; j < d; ++j) ASSERT_EQ(y[j], x[j]);
    }
  }
}

TEST(Quantize, ErrorBoundedByHalfScaleAfterClipping) {
  std::mt19937 rng(11);
  for (uint32_t g : {32u, 64u, 128u}) {
    for (float clip : {1.0f, 0.96f, 0.9f}) {
      for (int trial = 0; trial < 300; ++trial) {
        std::vector<float> x = RandomRow(rng, 128, trial % 2);
        ClipRowAtQuantile(x, clip);
        std::vector<uint8_t> packed(32);
        std::vector<uint16_t> sm(2 * 128 / g);
        QuantizeRowInt2(x.data(), 128, g, packed.data(), sm.data());
        std::vector<float> y(128);
        DequantizeRowInt2(packed.data(), sm.data(), 128, g, y.data());
        for (uint32_t j = 0; j < 128; ++j) {
          const float scale = HalfToFloat(sm[2 * (j / g)]);
          ASSERT_LE(std::fabs(x[j] - y[j]), scale / 2 * (1 + 1e-5f) + 1e-6f)
              << "g=" << g << " clip=" << clip << " j=" << j;
        }
      }
    }
  }
}

TEST(Quantize, ConstantGroupIsNearlyExact) {
  std::vector<float> x(128, 0.3f);
  std::vector<uint8_t> packed(32);
  std::vector<uint16_t> sm(2);
  QuantizeRowInt2(x.data(), 128, 128, packed.data(), sm.data());
  std::vector<float> y(128);
  DequantizeRowInt2(packed.data(), sm.data(), 128, 128, y.data());
  for (float v : y) EXPECT_NEAR(v, 0.3f, 3e-4f);
}

TEST(Quantize, QuantileMatchesLinearInterpolation) {
  std::vector<float> x = {-4, 1, 2, 3, 0};  // |x| sorted: 0 1 2 3 4
  EXPECT_FLOAT_EQ(AbsQuantile(x, 0.5f), 2.0f);
  EXPECT_FLOAT_EQ(AbsQuantile(x, 0.9f), 3.6f);
  EXPECT_TRUE(std::isinf(AbsQuantile(x, 1.0f)));
  ClipRowAtQuantile(x, 0.75f);
  EXPECT_FLOAT_EQ(x[0], -3.0f);
  EXPECT_FLOAT_EQ(x[3], 3.0f);
}

TEST(Quantize, HugeValuesSaturateInsteadOfProducingInf) {
  std::vector<float> x(128, 0.0f);
  x[0] = 1e9f;
  x[1] = -1e9f;
  std::vector<uint8_t> packed(32);
  std::vector<uint16_t> sm(2);
  QuantizeRowInt2(x.data(), 128, 128, packed.data(), sm.data());
  EXPECT_TRUE(std::isfinite(HalfToFloat(sm[0])));
  EXPECT_TRUE(std::isfinite(HalfToFloat(sm[1])));
}

}  // namespace
}  // namespace oscarkv
