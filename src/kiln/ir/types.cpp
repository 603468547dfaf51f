#include "kiln/ir/types.h"

#include <sstream>

#include "kiln/support/error.h"

namespace kiln {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape)
    n *= s;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t running = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = running;
    running *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int64_t TensorType::numel() const {
  return shape_numel(shape);
}

std::string TensorType::str() const {
  std::string s = device.str() + " " + std::string(dtype_name(dtype)) + shape_str(shape);
  if (layout) {
    s += " strides=(";
    for (size_t i = 0; i < layout->strides.size(); ++i) {
      if (i) s += ", ";
      s += std::to_string(layout->strides[i]);
    }
    if (layout->strides.size() == 1) s += ",";
    s += ") offset=" + std::to_string(layout->offset);
  }
  return s;
}

std::string ScalarType::str() const {
  switch (kind) {
    case ScalarKind::kBool:
      return "bool";
    case ScalarKind::kInt:
      return "int";
    case ScalarKind::kFloat:
      return "float";
  }
  return "?";
}

DType ScalarType::default_dtype() const {
  switch (kind) {
    case ScalarKind::kBool:
      return DType::kBool;
    case ScalarKind::kInt:
      return DType::kInt64;
    case ScalarKind::kFloat:
      return kDefaultFloat;
  }
  return kDefaultFloat;
}

std::string type_str(const Type& type) {
  return std::visit([](const auto& t) { return t.str(); }, type);
}

int64_t wrap_dim(int64_t dim, int64_t rank) {
  int64_t r = rank == 0 ? 1 : rank;
  KILN_CHECK(dim >= -r && dim < r)
      << "dimension " << dim << " is out of range for a tensor of rank " << rank
      << " (expected a dim in [" << -r << ", " << r - 1 << "]); pass a dim in that range.";
  return dim < 0 ? dim + r : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(da == db || da == 1 || db == 1)
        << "shapes " << shape_str(a) << " and " << shape_str(b) << " do not broadcast (size " << da
        << " against " << db << " at dim " << i
        << " of the broadcast shape); make the sizes equal or 1, e.g. with unsqueeze or expand.";
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace kiln
