// The element conversions PyTorch applies when it stores a number into a tensor: IEEE half and
// bfloat16 with round-to-nearest-even, and floating to integer as x86 converts. One definition,
// included by kiln (dtype.h, the interpreter's storages) and compiled into every generated CPU
// kernel (codegen embeds this file in the kernel prelude), so that the two cannot disagree.
//
// Only standard headers may be included here: generated kernels are compiled without kiln's
// include path.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace kiln {

inline uint16_t float_to_half(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): value = abs * 2^24 rounded to an integer, ties to even.
    float f = std::bit_cast<float>(abs);
    float scaled = f * 16777216.0f;    // exact: f < 2^-14, so scaled < 2^10
    float r = std::nearbyint(scaled);  // default rounding mode is to nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t half = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // carries into exp correctly
  return static_cast<uint16_t>(sign | half);
}

inline float half_to_float(uint16_t bits) {
  uint32_t sign = (bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  if (exp == 0) {
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

inline uint16_t float_to_bfloat16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  uint32_t rounding_bias = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding_bias) >> 16);
}

inline float bfloat16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// C++ leaves the conversion of NaN and out-of-range floats to integers undefined. x86's cvttsd2si
// (what PyTorch's CPU kernels compile to) gives the "integer indefinite" value, the type's
// minimum; in range, the conversion truncates toward zero.
//
// The value converted is trunc(v) + 0.0, an integral double that is never -0.0, rather than v:
// the integer is the same, but GCC 12 with -fno-trapping-math (the CPU kernels' flags) folds
// (double)(int64_t)v into trunc(v), which keeps the sign of zero: x.to(int64).to(float64) of
// -0.6 gave -0.0 instead of 0.0 (atan2 and division then told them apart). With trunc(v) + 0.0
// the fold yields trunc(trunc(v) + 0.0), which is +0.0 there too; the addition cannot be dropped,
// since trunc(v) may be -0.0.
template <class I>
inline I float_to_int(double v) {
  constexpr double lo = static_cast<double>(std::numeric_limits<I>::min());
  constexpr double hi = -lo;  // 2^31 or 2^63, exactly representable
  if (!(v >= lo && v < hi)) return std::numeric_limits<I>::min();
  return static_cast<I>(std::trunc(v) + 0.0);
}

}  // namespace kiln
