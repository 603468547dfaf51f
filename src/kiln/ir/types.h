// Types of trace values: tensors (dtype, shape, device, and for program inputs their layout) and
// Python scalars. Shape helpers follow PyTorch's rules (broadcasting, dim wrapping).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/ir/dtype.h"

namespace kiln {

using Shape = std::vector<int64_t>;

// Memory layout of a program input: strides (in elements) and storage offset. Part of the
// specialization key; intermediates have none (their layout is the interpreter's business).
struct Layout {
  std::vector<int64_t> strides;
  int64_t offset = 0;
  bool operator==(const Layout&) const = default;
};

struct TensorType {
  DType dtype = DType::kFloat32;
  Shape shape;
  Device device;
  std::optional<Layout> layout;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  bool operator==(const TensorType&) const = default;
  // "cpu f32[5, 5]", with " strides=(5, 1) offset=0" when a layout is present.
  std::string str() const;
};

// A Python number at trace time: bool, int or float.
enum class ScalarKind : uint8_t { kBool, kInt, kFloat };
struct ScalarType {
  ScalarKind kind = ScalarKind::kFloat;
  bool operator==(const ScalarType&) const = default;
  std::string str() const;  // "bool", "int", "float"
  // The dtype a scalar of this kind gets as a tensor on its own (bool, i64, default float).
  DType default_dtype() const;
};

using Type = std::variant<TensorType, ScalarType>;
std::string type_str(const Type& type);

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"
std::vector<int64_t> contiguous_strides(const Shape& shape);

// Wraps a possibly negative dim into [0, rank); a user error names the dim and the valid range.
// A rank-0 tensor accepts dims -1 and 0, as in PyTorch.
int64_t wrap_dim(int64_t dim, int64_t rank);

// PyTorch broadcasting of two shapes; user error if they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b);

}  // namespace kiln
