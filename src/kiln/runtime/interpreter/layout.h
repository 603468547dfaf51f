// The interpreter's tensors through ATen's stride logic. The logic itself is pure and lives in
// analysis/geometry.h, shared with the static storage analysis so that the two cannot disagree;
// these are its forms for RtTensor. The interpreter must reproduce PyTorch's layouts exactly, not
// just its values: whether a later `view` succeeds, whether an in-place op raises for overlapping
// memory, and which strides a returned tensor has all follow from them.
#pragma once

#include <span>

#include "kiln/analysis/geometry.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

// The strides of `t` broadcast to `shape` (right-aligned; 0 on new and expanded dims).
Strides broadcast_strides(const RtTensor& t, const Shape& shape);

// User error if `t` reaches past the end of its storage (as_strided, make_view).
void check_in_bounds(const RtTensor& t);

// elementwise_output_strides over the operands' layouts; nullptr stands for a wrapped Python
// number.
Strides elementwise_output_strides(const Shape& shape, std::span<const RtTensor* const> inputs);
// The strides of empty_like(t) (memory_format=torch.preserve_format).
Strides strides_like(const RtTensor& t);

// The checks TensorIterator runs before writing into `target` (DESIGN.md section 1): user errors
// when the target has internal overlap (a stride-0 dim of size > 1) or when an input partially
// overlaps it.
void check_no_internal_overlap(const RtTensor& target);
void check_no_partial_overlap(const RtTensor& target, const RtTensor& input);

}  // namespace kiln
