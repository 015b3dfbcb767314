#include "oscarkv/kernels/numeric.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace oscarkv {
namespace {

TEST(Numeric, HalfRoundTripsEveryFiniteHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    if (((v >> 10) & 0x1f) == 0x1f) continue;  // inf/nan
    EXPECT_EQ(FloatToHalf(HalfToFloat(v)), v == 0x8000 ? 0x8000 : v) << h;
  }
}

TEST(Numeric, DirectedRoundingBracketsTheValue) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  std::normal_distribution<float> small(0.0f, 1e-4f);
  for (int i = 0; i < 200000; ++i) {
    const float f = (i % 2) ? u(rng) : small(rng);
    if (std::fabs(f) > 65504.0f) continue;
    const float lo = HalfToFloat(FloatToHalf(f, RoundMode::kDown));
    const float hi = HalfToFloat(FloatToHalf(f, RoundMode::kUp));
    const float ne = HalfToFloat(FloatToHalf(f));
    ASSERT_LE(lo, f);
    ASSERT_GE(hi, f);
    ASSERT_TRUE(ne == lo || ne == hi);
    ASSERT_LE(std::fabs(ne - f), std::fabs(hi - lo) / 2 + 1e-30f);
  }
}

TEST(Numeric, KnownHalfValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);
  EXPECT_EQ(FloatToHalf(5.9604644775390625e-8f), 0x0001);
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3c00);  // tie to even
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3c02);
}

TEST(Numeric, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 1.0f / 256)), 1.0f);  // tie -> even
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
}

}  // namespace
}  // namespace oscarkv
