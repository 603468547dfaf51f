#include "kiln/runtime/interpreter/layout.h"

#include <vector>

#include "kiln/runtime/interpreter/view_geometry.h"

namespace kiln {

Strides broadcast_strides(const RtTensor& t, const Shape& shape) {
  return broadcast_strides(t.sizes, t.strides, shape);
}

void check_in_bounds(const RtTensor& t) {
  check_in_bounds(geometry_of(t), t.storage->numel(), t.dtype());
}

Strides elementwise_output_strides(const Shape& shape, std::span<const RtTensor* const> inputs) {
  std::vector<Geometry> geometries;
  geometries.reserve(inputs.size());
  for (const RtTensor* t : inputs)
    geometries.push_back(t ? geometry_of(*t) : Geometry{});
  std::vector<const Geometry*> operands;
  for (size_t i = 0; i < inputs.size(); ++i)
    operands.push_back(inputs[i] ? &geometries[i] : nullptr);
  return elementwise_output_strides(shape, operands);
}

Strides strides_like(const RtTensor& t) {
  return strides_like(t.sizes, t.strides);
}

void check_no_internal_overlap(const RtTensor& target) {
  check_no_internal_overlap(geometry_of(target));
}

void check_no_partial_overlap(const RtTensor& target, const RtTensor& input) {
  check_no_partial_overlap(geometry_of(target), geometry_of(input),
                           &target.storage->memory_owner() == &input.storage->memory_owner());
}

}  // namespace kiln
