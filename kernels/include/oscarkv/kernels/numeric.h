// Bit-exact float <-> fp16 / bf16 conversions with explicit rounding, shared by the CPU codec
// and the CUDA kernels (which use the matching intrinsics, e.g. __float2half_rd).
//
// The INT2 quantizer rounds the group minimum DOWN and the scale UP when it stores them as fp16,
// so every value of a group lies inside [min, min + 3*scale] of the stored parameters and the
// per-element error bound |x - x_hat| <= scale/2 holds for the stored (not the ideal) scale.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace oscarkv {

enum class RoundMode : uint8_t { kNearestEven, kDown, kUp };

inline uint32_t FloatBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline float BitsToFloat(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000 | (mant << 13));
  return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t FloatToHalfNearestEven(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t absx = x & 0x7fffffff;
  if (absx >= 0x7f800000) {  // inf / nan
    return sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0);
  }
  if (absx >= 0x477ff000) return sign | 0x7c00;  // >= 65520 rounds to inf
  if (absx < 0x38800000) {                        // below 2^-14: subnormal half
    const float a = BitsToFloat(absx);
    // a * 2^24 is exact; nearbyint rounds to nearest even in the default FP environment.
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  const uint32_t mant = absx & 0x7fffff;
  const uint32_t exp = (absx >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

// The fp16 value one step toward -inf (for finite h).
inline uint16_t HalfNextDown(uint16_t h) {
  if (h == 0x0000) return 0x8001;
  if (h & 0x8000) return h + 1;
  return h - 1;
}
inline uint16_t HalfNextUp(uint16_t h) {
  if (h == 0x8000) return 0x0001;
  if (h & 0x8000) return h - 1;
  return h + 1;
}

// float -> fp16 with the given rounding. NaN maps to NaN. kDown/kUp never return a value on the
// wrong side of f, except that results saturate at +-inf past the fp16 range.
inline uint16_t FloatToHalf(float f, RoundMode mode = RoundMode::kNearestEven) {
  uint16_t h = FloatToHalfNearestEven(f);
  if (mode == RoundMode::kNearestEven || std::isnan(f)) return h;
  const float back = HalfToFloat(h);
  if (mode == RoundMode::kDown && back > f) h = HalfNextDown(h);
  if (mode == RoundMode::kUp && back < f) h = HalfNextUp(h);
  return h;
}

inline uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding_bias = 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding_bias) >> 16);
}
inline float Bf16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }
inline float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

}  // namespace oscarkv
