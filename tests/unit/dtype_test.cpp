// dtypes: PyTorch's promotion table, can_cast, and the f16/bf16 bit conversions.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/ir/dtype.h"

namespace kiln {
namespace {

using D = DType;

// Expected values are torch.promote_types / torch.can_cast results, written out by hand.
TEST(DType, PromoteTypesMatchesPyTorch) {
  EXPECT_EQ(promote_types(D::kBool, D::kBool), D::kBool);
  EXPECT_EQ(promote_types(D::kBool, D::kInt32), D::kInt32);
  EXPECT_EQ(promote_types(D::kInt32, D::kInt64), D::kInt64);
  EXPECT_EQ(promote_types(D::kInt64, D::kFloat16), D::kFloat16);
  EXPECT_EQ(promote_types(D::kFloat16, D::kBFloat16), D::kFloat32);
  EXPECT_EQ(promote_types(D::kBFloat16, D::kFloat32), D::kFloat32);
  EXPECT_EQ(promote_types(D::kFloat32, D::kFloat64), D::kFloat64);
  EXPECT_EQ(promote_types(D::kInt32, D::kBool), D::kInt32);
  EXPECT_EQ(promote_types(D::kFloat64, D::kInt64), D::kFloat64);
}

TEST(DType, CanCastMatchesPyTorch) {
  EXPECT_TRUE(can_cast(D::kInt64, D::kFloat16));
  EXPECT_TRUE(can_cast(D::kFloat64, D::kBFloat16));  // same category: allowed
  EXPECT_TRUE(can_cast(D::kBool, D::kInt32));
  EXPECT_FALSE(can_cast(D::kFloat32, D::kInt64));
  EXPECT_FALSE(can_cast(D::kInt32, D::kBool));
  EXPECT_FALSE(can_cast(D::kFloat16, D::kBool));
}

TEST(DType, NamesRoundTrip) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto d = static_cast<DType>(i);
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
    EXPECT_EQ(dtype_from_name(dtype_torch_name(d)), d);
  }
  EXPECT_EQ(dtype_from_name("torch.float"), D::kFloat32);
  EXPECT_FALSE(dtype_from_name("f99").has_value());
  EXPECT_EQ(Device::parse("cuda:12")->index, 12);
  EXPECT_FALSE(Device::parse("tpu").has_value());
  EXPECT_FALSE(Device::parse("cuda:x").has_value());
}

// IEEE binary16 bit patterns, from the format's definition.
TEST(DType, HalfConversionRoundsToNearestEven) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);                          // largest finite
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);                          // rounds to inf
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -26)), 0x0000);             // below half of it: zero
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie: to even
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie: to even (up)
  EXPECT_EQ(float_to_half(0.1f), 0x2e66);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(half_to_float(0xfc00)) && half_to_float(0xfc00) < 0);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
}

TEST(DType, BFloat16ConversionRoundsToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(3.140625f), 0x4049);
  EXPECT_EQ(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie: to even
  EXPECT_EQ(float_to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie: to even (up)
  EXPECT_EQ(bfloat16_to_float(0xc040), -3.0f);
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(NAN))));
}

}  // namespace
}  // namespace kiln
