// kiln's float exp, tanh and erf (scalar_math.h's exp_f32, tanh_f32 and erf_f32, what the
// interpreter and the CPU kernels compute a float32, float16 or bfloat16 exp, tanh or erf with)
// against the correctly rounded ones: libm's double exp, tanh and erf rounded to float, which are
// correctly rounded for every float argument but a vanishing few.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kiln/ir/scalar_math.h"

namespace kiln {
namespace {

float rounded_exp(float x) {
  return static_cast<float>(std::exp(static_cast<double>(x)));
}

// The distance in units in the last place between two finite floats of one sign (or zeros).
int64_t ulps(float a, float b) {
  return std::abs(int64_t{std::bit_cast<int32_t>(a)} - int64_t{std::bit_cast<int32_t>(b)});
}

// The fraction of a sample of every sign, exponent and mantissa (each 4099th bit pattern: a prime
// stride, so the low mantissa bits vary too; about a million floats) where `got` equals
// `rounded`, failing at the first one more than 1 ulp from it (and where `rounded` is NaN and
// `got` is not).
template <class Got, class Rounded>
double exact_within_one_ulp(const char* name, Got got, Rounded rounded) {
  int64_t total = 0, exact = 0;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) {
    float x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    float want = rounded(x), have = got(x);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(have)) << std::hexfloat << name << "(" << x << ")";
      continue;
    }
    ++total;
    int64_t d = ulps(have, want);
    EXPECT_LE(d, 1) << std::hexfloat << name << "(" << x << ") = " << have << ", not " << want;
    if (d > 1) return 0;
    exact += d == 0;
  }
  return static_cast<double>(exact) / static_cast<double>(total);
}

// Every float was checked the same way when exp_f32 was written: 99.2% exact, the rest 1 ulp.
TEST(ScalarMath, ExpF32IsWithinOneUlpOfTheRoundedExp) {
  EXPECT_GE(exact_within_one_ulp("exp", math::exp_f32, rounded_exp), 0.99);
}

// erf_f32's exp: exp_f32's bits over [-87, 0] (each 127th float of it, and the ends), without
// exp_f32's clamps and second scale factor.
TEST(ScalarMath, ExpNonpositiveF32IsExpF32WhereEvery2ToTheNIsNormal) {
  const uint32_t zero = std::bit_cast<uint32_t>(-0.0f), last = std::bit_cast<uint32_t>(-87.0f);
  for (uint32_t bits = zero; bits <= last; bits += 127) {
    const float x = std::bit_cast<float>(bits);
    ASSERT_EQ(math::exp_nonpositive_f32(x), math::exp_f32(x)) << std::hexfloat << x;
  }
  EXPECT_EQ(math::exp_nonpositive_f32(-87.0f), math::exp_f32(-87.0f));
  EXPECT_EQ(math::exp_nonpositive_f32(0.0f), 1.0f);
}

TEST(ScalarMath, ExpF32AtTheEdges) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(math::exp_f32(inf), inf);
  EXPECT_EQ(math::exp_f32(-inf), 0.0f);
  EXPECT_TRUE(std::isnan(math::exp_f32(std::nanf(""))));
  EXPECT_EQ(math::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(math::exp_f32(-0.0f), 1.0f);
  // The largest finite result and the first argument that overflows.
  EXPECT_EQ(math::exp_f32(0x1.62e42ep+6f), rounded_exp(0x1.62e42ep+6f));
  EXPECT_EQ(math::exp_f32(0x1.62e430p+6f), inf);
  EXPECT_EQ(math::exp_f32(1e30f), inf);
  // Subnormal results round once (from 2^-126 down to the smallest, 2^-149), then 0.
  for (float x = -87.0f; x > -105.0f; x -= 0.0625f)
    EXPECT_LE(ulps(math::exp_f32(x), rounded_exp(x)), 1) << x;
  EXPECT_EQ(math::exp_f32(-104.0f), 0.0f);
  EXPECT_EQ(math::exp_f32(-1e30f), 0.0f);
}

float rounded_tanh(float x) {
  return static_cast<float>(std::tanh(static_cast<double>(x)));
}

// Every float was checked the same way when tanh_f32 was written: 99.87% exact, the rest 1 ulp
// (the most near 0.00064, at the top of the polynomial's binades).
TEST(ScalarMath, TanhF32IsWithinOneUlpOfTheRoundedTanh) {
  EXPECT_GE(exact_within_one_ulp("tanh", math::tanh_f32, rounded_tanh), 0.99);
}

TEST(ScalarMath, TanhF32AtTheEdges) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(math::tanh_f32(inf), 1.0f);
  EXPECT_EQ(math::tanh_f32(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(math::tanh_f32(std::nanf(""))));
  EXPECT_TRUE(std::signbit(math::tanh_f32(-0.0f)));
  EXPECT_EQ(math::tanh_f32(0.0f), 0.0f);
  EXPECT_FALSE(std::signbit(math::tanh_f32(0.0f)));
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(math::tanh_f32(tiny), tiny);
  EXPECT_EQ(math::tanh_f32(-tiny), -tiny);
  // Either side of the switch from the polynomial to exp, and where tanh reaches 1.
  for (float x : {0x1.3ffffep-1f, 0.625f, 0x1.400002p-1f, 9.0f, 9.01f, 9.02f, 50.0f, 100.0f})
    EXPECT_LE(ulps(math::tanh_f32(x), rounded_tanh(x)), 1) << std::hexfloat << x;
  EXPECT_EQ(math::tanh_f32(10.0f), 1.0f);
  EXPECT_EQ(math::tanh_f32(-10.0f), -1.0f);
}

float rounded_erf(float x) {
  return static_cast<float>(std::erf(static_cast<double>(x)));
}

// 94.4% exact on this sample when erf_f32 was written, the rest 1 ulp (the most near the
// switch to 1 - erfc and where the result nears 1).
TEST(ScalarMath, ErfF32IsWithinOneUlpOfTheRoundedErf) {
  EXPECT_GE(exact_within_one_ulp("erf", math::erf_f32, rounded_erf), 0.9);
}

TEST(ScalarMath, ErfF32AtTheEdges) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(math::erf_f32(inf), 1.0f);
  EXPECT_EQ(math::erf_f32(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(math::erf_f32(std::nanf(""))));
  EXPECT_EQ(math::erf_f32(0.0f), 0.0f);
  EXPECT_FALSE(std::signbit(math::erf_f32(0.0f)));
  EXPECT_TRUE(std::signbit(math::erf_f32(-0.0f)));
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_LE(ulps(math::erf_f32(tiny), rounded_erf(tiny)), 1);
  EXPECT_LE(ulps(-math::erf_f32(-tiny), rounded_erf(tiny)), 1);
  // Either side of each switch, densely: 0.875 (the polynomial to 1 - erfc) and 3.92 (to 1).
  for (float c : {0.875f, 3.92f})
    for (float x = c - 0x1p-10f; x < c + 0x1p-10f; x = std::nextafter(x, inf)) {
      EXPECT_LE(ulps(math::erf_f32(x), rounded_erf(x)), 1) << std::hexfloat << x;
      EXPECT_EQ(math::erf_f32(-x), -math::erf_f32(x)) << std::hexfloat << x;
    }
  EXPECT_EQ(math::erf_f32(10.0f), 1.0f);
  EXPECT_EQ(math::erf_f32(-10.0f), -1.0f);
}

}  // namespace
}  // namespace kiln
