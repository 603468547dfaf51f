// Element types and devices, and PyTorch's type promotion over them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/ir/dtype_convert.h"

namespace kiln {

enum class DType : uint8_t { kBool, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64 };
inline constexpr int kNumDTypes = 7;

// Short names as printed in traces: bool i32 i64 f16 bf16 f32 f64.
std::string_view dtype_name(DType dtype);
// PyTorch's names: torch.bool, torch.int32, ... (used in the printed op arguments).
std::string_view dtype_torch_name(DType dtype);
std::optional<DType> dtype_from_name(std::string_view name);  // accepts both forms
int64_t dtype_size(DType dtype);

inline bool is_floating(DType d) {
  return d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kFloat32 ||
         d == DType::kFloat64;
}
inline bool is_integral(DType d, bool include_bool) {
  return d == DType::kInt32 || d == DType::kInt64 || (include_bool && d == DType::kBool);
}

// The default float dtype (torch.get_default_dtype()).
inline constexpr DType kDefaultFloat = DType::kFloat32;

// torch.promote_types: the smallest dtype both can be converted to without losing their category
// (bool < integral < floating). f16 with bf16 gives f32, as in PyTorch.
DType promote_types(DType a, DType b);

// torch.can_cast: whether an in-place op may store a value of `from` into a tensor of `to`.
// Forbidden: floating into integral or bool, integral into bool.
bool can_cast(DType from, DType to);

// Category used by type promotion: 0 bool, 1 integral, 2 floating.
int dtype_category(DType d);

struct Device {
  enum class Kind : uint8_t { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // only meaningful for cuda

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {Kind::kCuda, index}; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
  static std::optional<Device> parse(std::string_view text);
};

// IEEE half and bfloat16 conversions (float_to_half, ...) are in dtype_convert.h.

}  // namespace kiln
