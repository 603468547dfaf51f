// Shape and dtype rules shared by the type rules (type_rules.cpp), the decompositions and the
// reference interpreter, so that all three agree with PyTorch in one place.
#pragma once

#include <span>
#include <vector>

#include "kiln/ir/trace.h"

namespace kiln {

// torch.result_type over a list of operands: dim>0 tensors outrank 0-dim tensors, which outrank
// Python numbers (a float number counts as the default float, an int as i64).
DType result_type(std::span<const Operand> operands);

// The dtypes and shape of an elementwise op applied to `args`.
struct ElementwiseTyping {
  DType common;   // torch.result_type of the operands that take part in promotion
  DType compute;  // the dtype the math is done in (converted to `out` afterwards)
  DType out;
  Shape shape;  // broadcast shape
  Device device;
};
ElementwiseTyping elementwise_typing(const OpInfo& op, std::span<const Operand> args);

// The dtype a Python number operand of elementwise op `functional` (an OpId of the functional
// form) enters the math in, for math in `compute`, as eager's kernels on that device take it.
// For float16 and bfloat16 math most ATen kernels round the number to the dtype first (the
// TensorIterator's common dtype), but some take it in the math type, float (measured against
// eager, torch 2.11, 2026-12-03; bench/NOTES.md session 17): on the CPU mul and div, on CUDA add,
// sub, mul and div. `b.mul_(0.9)` on bf16 is b * 0.9f, not b * bf16(0.9) = b * 0.8984375, which
// differed in a third of the elements. Other dtypes: `compute`. An add's or a sub's alpha enters
// in the same dtype (on the CPU a bf16 add rounds its alpha to bf16, on CUDA it keeps a float).
DType number_operand_dtype(OpId functional, DType compute, bool cuda);

// Whether eager's CUDA kernel divides by a Python number `s` as a product with its reciprocal:
// a * r with r = 1 / s of the double s, held in the math type (float for float32, float16 and
// bfloat16, double for float64): x / 0.001 in float32 is x * 1000.0f, not x * (1.0f / 0.001f) =
// x * 999.99994f. True division only (no rounding mode), the number the divisor.
bool cuda_divides_by_reciprocal(OpId functional, int rounding_mode);

// eager_call's `results` argument: each result's type and strides, "; "-separated
// ("cpu f32[3, 4] strides=(4, 1) offset=0; cpu i64[3] strides=(1,) offset=0"). A malformed text
// is a user error.
struct EagerResult {
  TensorType type;
  std::vector<int64_t> strides;
};
std::vector<EagerResult> parse_eager_results(const std::string& text);

// One primitive view step a __getitem__ key lowers to.
struct IndexStep {
  OpId op;  // kSelect, kSlice or kUnsqueeze
  int64_t dim = 0;
  int64_t a = 0;     // select: index; slice: start
  int64_t b = 0;     // slice: end
  int64_t step = 1;  // slice: step
};
// Lowers a key against a shape: the view steps in order and the final shape. User errors for
// too many indices, out-of-range ints and non-positive steps.
std::vector<IndexStep> lower_index_key(const Shape& shape, const IndexKey& key,
                                       Shape* result_shape);

// PyTorch's slice bounds: negative start/end wrap once, then clamp to [0, size]; end >= start.
void normalize_slice(int64_t size, std::optional<int64_t> start, std::optional<int64_t> end,
                     int64_t* out_start, int64_t* out_end);
int64_t slice_length(int64_t start, int64_t end, int64_t step);

// The dims a reduction reduces (sorted, unique); `dims` None or empty means all.
std::vector<int64_t> reduction_dims(const std::optional<IntList>& dims, int64_t rank);

// view/reshape sizes with one -1 inferred; user error if the element count differs.
Shape infer_view_size(const IntList& size, int64_t numel);

// The length of diagonal(offset, dim1, dim2) of a shape.
int64_t diagonal_length(const Shape& shape, int64_t offset, int64_t dim1, int64_t dim2);

// Output shapes of split / chunk along `dim`.
std::vector<int64_t> split_sizes(int64_t dim_size, const Operand& split_size);
std::vector<int64_t> chunk_sizes(int64_t dim_size, int64_t chunks);

}  // namespace kiln
