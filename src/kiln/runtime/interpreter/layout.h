// Strides as eager PyTorch computes them. The interpreter must reproduce PyTorch's layouts exactly,
// not just its values: whether a later `view` succeeds, whether an in-place op raises for
// overlapping memory, and which strides a returned tensor has all follow from them.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

using Strides = std::vector<int64_t>;

// Storage indices of every element of a strided view, in row-major order of `sizes`.
std::vector<int64_t> element_indices(const Shape& sizes, const Strides& strides, int64_t offset);

// The strides of `t` broadcast to `shape` (right-aligned; 0 on new and expanded dims).
Strides broadcast_strides(const RtTensor& t, const Shape& shape);

// c10's is_contiguous: size-1 dims are ignored, an empty tensor is contiguous.
bool is_contiguous(const Shape& sizes, const Strides& strides);
// c10's is_non_overlapping_and_dense: some permutation of the dims is contiguous.
bool is_non_overlapping_and_dense(const Shape& sizes, const Strides& strides);

// Elements a storage needs for this view: offset + the largest reachable index + 1 (the offset
// alone when the view is empty).
int64_t required_storage_numel(const Shape& sizes, const Strides& strides, int64_t offset);
// User error if `t` reaches past the end of its storage (as_strided, make_view).
void check_in_bounds(const RtTensor& t);

// ATen's computeStride: the strides of `t` viewed as `new_sizes` without copying, or nullopt when
// some group of merged dims is not contiguous with respect to each other (view raises, reshape
// copies).
std::optional<Strides> compute_view_strides(const Shape& sizes, const Strides& strides,
                                            const Shape& new_sizes);

// The strides TensorIterator gives the freshly allocated output of an elementwise op over
// `shape`. `inputs` are the op's tensor operands in order; nullptr stands for a wrapped Python
// number (a 0-dim operand that only disables the same-shape fast path).
Strides elementwise_output_strides(const Shape& shape, std::span<const RtTensor* const> inputs);
// The strides of empty_like(t) (memory_format=torch.preserve_format): t's own strides when it is
// non-overlapping and dense, else dense strides ordered like t's.
Strides strides_like(const RtTensor& t);

// The checks TensorIterator runs before writing into `target` (DESIGN.md section 1): user errors
// when the target has internal overlap (a stride-0 dim of size > 1) or when an input partially
// overlaps it.
void check_no_internal_overlap(const RtTensor& target);
void check_no_partial_overlap(const RtTensor& target, const RtTensor& input);

}  // namespace kiln
