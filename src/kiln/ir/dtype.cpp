#include "kiln/ir/dtype.h"

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

}  // namespace kiln
