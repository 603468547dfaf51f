#include "kiln/ir/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "kiln/support/error.h"

namespace kiln {

namespace {
struct DTypeInfo {
  std::string_view name;
  std::string_view torch_name;
  int64_t size;
};
constexpr DTypeInfo kInfo[kNumDTypes] = {
    {"bool", "torch.bool", 1},   {"i32", "torch.int32", 4},     {"i64", "torch.int64", 8},
    {"f16", "torch.float16", 2}, {"bf16", "torch.bfloat16", 2}, {"f32", "torch.float32", 4},
    {"f64", "torch.float64", 8},
};
const DTypeInfo& info(DType d) {
  return kInfo[static_cast<int>(d)];
}
}  // namespace

std::string_view dtype_name(DType dtype) {
  return info(dtype).name;
}
std::string_view dtype_torch_name(DType dtype) {
  return info(dtype).torch_name;
}
int64_t dtype_size(DType dtype) {
  return info(dtype).size;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kInfo[i].name == name || kInfo[i].torch_name == name) return static_cast<DType>(i);
  }
  // A few aliases PyTorch users write.
  if (name == "torch.float" || name == "float32") return DType::kFloat32;
  if (name == "torch.double" || name == "float64") return DType::kFloat64;
  if (name == "torch.half" || name == "float16") return DType::kFloat16;
  if (name == "torch.long" || name == "int64") return DType::kInt64;
  if (name == "torch.int" || name == "int32") return DType::kInt32;
  if (name == "bfloat16") return DType::kBFloat16;
  return std::nullopt;
}

int dtype_category(DType d) {
  if (d == DType::kBool) return 0;
  if (is_integral(d, false)) return 1;
  return 2;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  int ca = dtype_category(a), cb = dtype_category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 1) return dtype_size(a) >= dtype_size(b) ? a : b;
  // Both floating and different.
  if ((a == DType::kFloat16 && b == DType::kBFloat16) ||
      (a == DType::kBFloat16 && b == DType::kFloat16))
    return DType::kFloat32;
  return dtype_size(a) >= dtype_size(b) ? a : b;
}

bool can_cast(DType from, DType to) {
  return dtype_category(from) <= dtype_category(to);
}

std::string Device::str() const {
  return kind == Kind::kCpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::optional<Device> Device::parse(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view rest = text.substr(5);
    if (rest.empty() || rest.size() > 4) return std::nullopt;
    int index = 0;
    for (char c : rest) {
      if (c < '0' || c > '9') return std::nullopt;
      index = index * 10 + (c - '0');
    }
    return Device::cuda(index);
  }
  return std::nullopt;
}

uint16_t float_to_half(float value) {
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

float half_to_float(uint16_t bits) {
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

uint16_t float_to_bfloat16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  uint32_t rounding_bias = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding_bias) >> 16);
}

float bfloat16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

}  // namespace kiln
