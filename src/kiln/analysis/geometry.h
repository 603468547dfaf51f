// A view's placement in memory, in elements: what `as_strided(size, stride, offset)` names, and
// ATen's stride logic over it, with no data. Layouts are semantics, not a detail: whether a later
// `view` succeeds, whether an in-place op raises for overlapping memory, which strides a returned
// tensor has and which elements an `as_strided` addresses all follow from them. The reference
// interpreter (runtime/interpreter/layout.h wraps these for its tensors) and the static storage
// analysis (storage_analysis.h) both compute layouts here, so they cannot disagree.
//
// The view functions compute sizes, strides and offset as ATen does (strides of size-1 dims
// included: later layout decisions look at them). The type rules have already checked the
// arguments; dims may still be negative and are wrapped here.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kiln/ir/constant.h"
#include "kiln/ir/op.h"
#include "kiln/ir/types.h"

namespace kiln {

using Strides = std::vector<int64_t>;

struct Geometry {
  Shape sizes;
  Strides strides;
  int64_t offset = 0;
  bool operator==(const Geometry&) const = default;
};

// The row-major layout of `sizes` at offset 0.
Geometry contiguous_geometry(const Shape& sizes);

// Storage indices of every element of a strided view, in row-major order of `sizes`.
std::vector<int64_t> element_indices(const Shape& sizes, const Strides& strides, int64_t offset);

// The strides of a tensor of `sizes`/`strides` broadcast to `shape` (right-aligned; 0 on new and
// expanded dims).
Strides broadcast_strides(const Shape& sizes, const Strides& strides, const Shape& shape);

// c10's is_contiguous: size-1 dims are ignored, an empty tensor is contiguous.
bool is_contiguous(const Shape& sizes, const Strides& strides);
// c10's is_non_overlapping_and_dense: some permutation of the dims is contiguous.
bool is_non_overlapping_and_dense(const Shape& sizes, const Strides& strides);

// Elements a storage needs for this view: offset + the largest reachable index + 1 (0 when the
// view is empty).
int64_t required_storage_numel(const Shape& sizes, const Strides& strides, int64_t offset);
inline int64_t required_storage_numel(const Geometry& g) {
  return required_storage_numel(g.sizes, g.strides, g.offset);
}
// User error if `g` reaches past the end of a storage of `storage_numel` elements of `dtype`
// (ATen's setStorage check: as_strided, as_strided_, make_view).
void check_in_bounds(const Geometry& g, int64_t storage_numel, DType dtype);

// ATen's computeStride: the strides of sizes/strides viewed as `new_sizes` without copying, or
// nullopt when some group of merged dims is not contiguous with respect to each other (view
// raises, reshape copies).
std::optional<Strides> compute_view_strides(const Shape& sizes, const Strides& strides,
                                            const Shape& new_sizes);

// The strides TensorIterator gives the freshly allocated output of an elementwise op over
// `shape`. `inputs` are the op's tensor operands in order; nullptr stands for a wrapped Python
// number (a 0-dim operand that only disables the same-shape fast path).
Strides elementwise_output_strides(const Shape& shape, std::span<const Geometry* const> inputs);
// The strides of empty_like(t) (memory_format=torch.preserve_format): t's own strides when it is
// non-overlapping and dense, else dense strides ordered like t's.
Strides strides_like(const Shape& sizes, const Strides& strides);
// The strides of a dense tensor whose dims lie in memory in `order`, outermost first.
Strides strides_in_order(const Shape& shape, std::span<const int> order);
// The strides of empty_like(t, t.suggest_memory_format()): channels-last (or channels-last 3-D)
// where t's strides are like those (c10's is_channels_last_strides_2d / _3d), else row-major.
Strides suggested_format_strides(const Shape& sizes, const Strides& strides);
// The strides ATen lays out the result of an op kiln decomposes in, where they are not its
// subsymbols' (ops.def's result layout of a KILN_COMPOSITE row); `sizes` and `strides` are its
// first input's. nullopt: laid out as its subsymbols are. Storage analysis and the interpreter
// both apply it.
std::optional<Strides> decomposed_result_strides(OpId id, const Shape& sizes,
                                                 const Strides& strides);

// The checks TensorIterator runs before writing into a target (DESIGN.md section 1).
// Internal overlap: some dim of size > 1 has stride 0 (an expanded view). Other self-overlapping
// layouts (as_strided with small strides) are "too hard" for PyTorch to prove and are allowed.
bool has_internal_overlap(const Geometry& target);
void check_no_internal_overlap(const Geometry& target);  // user error if has_internal_overlap
// Partial overlap of two views of *one* storage: both non-overlapping and dense (else PyTorch
// gives up and allows it), both non-empty, and their element ranges intersect without being the
// same elements in the same order. The identical view (the same tensor) is full overlap: allowed.
bool partially_overlaps(const Geometry& target, const Geometry& input);
// User error if `input` partially overlaps `target`; views of different storages never do.
void check_no_partial_overlap(const Geometry& target, const Geometry& input, bool same_storage);

// ---- the view ops
// -------------------------------------------------------------------------------- The ATen view:
// nullopt when the strides do not allow viewing as `sizes` without a copy.
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
