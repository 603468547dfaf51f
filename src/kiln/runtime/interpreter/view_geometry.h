// The sizes, strides and storage offset each view op gives, computed as ATen computes them
// (strides of size-1 dims included: later layout decisions look at them). The type rules have
// already checked the arguments; dims may still be negative and are wrapped here.
#pragma once

#include <optional>

#include "kiln/ir/constant.h"
#include "kiln/runtime/interpreter/layout.h"

namespace kiln {

struct Geometry {
  Shape sizes;
  Strides strides;
  int64_t offset = 0;
};

Geometry geometry_of(const RtTensor& t);
// Makes `t` (the very object) take geometry `g`: the metadata mutations (transpose_, ...).
void set_geometry(RtTensor& t, const Geometry& g);
// A new tensor object over `base`'s storage; user error if it reaches outside the storage.
TensorHandle view_of(const TensorHandle& base, const Geometry& g);

// The ATen view: nullopt when the strides do not allow viewing as `sizes` without a copy.
std::optional<Geometry> view_geometry(const Geometry& g, const Shape& sizes);
Geometry permute_geometry(const Geometry& g, const IntList& dims);
Geometry transpose_geometry(const Geometry& g, int64_t dim0, int64_t dim1);
Geometry t_geometry(const Geometry& g);
Geometry expand_geometry(const Geometry& g, const IntList& sizes);
Geometry unsqueeze_geometry(const Geometry& g, int64_t dim);
Geometry squeeze_geometry(const Geometry& g, const std::optional<IntList>& dims);
Geometry slice_geometry(const Geometry& g, int64_t dim, std::optional<int64_t> start,
                        std::optional<int64_t> end, int64_t step);
Geometry narrow_geometry(const Geometry& g, int64_t dim, int64_t start, int64_t length);
Geometry select_geometry(const Geometry& g, int64_t dim, int64_t index);
Geometry diagonal_geometry(const Geometry& g, int64_t offset, int64_t dim1, int64_t dim2);
// as_strided: the offset defaults to the tensor's own.
Geometry as_strided_geometry(const Geometry& g, const IntList& sizes, const IntList& strides,
                             std::optional<int64_t> offset);

}  // namespace kiln
