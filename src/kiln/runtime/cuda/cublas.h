// The matrix products of CUDA programs (matmul, bmm, linear: the plan's opaque steps) through
// cuBLAS, loaded with dlopen (libcublas.so.13 or .12) like the driver and NVRTC. Floating dtypes
// only, computed as PyTorch's CUDA matmul computes them by default: float32 in full float32 (no
// TF32), float16 and bfloat16 with float32 accumulation, float64 in double. Any operand layout:
// one whose matrices have a unit stride (row- or column-major: a transposed weight) and whose
// batch dims collapse into one stride (a broadcast operand: stride 0) is read in place, any
// other is first copied into contiguous batches. A 16-bit product whose operands or result are not
// aligned for tensor cores runs padded when that pays (cublas.cpp, "tensor-core alignment").
#pragma once

#include <string>
#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cuda/driver.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln::cuda {

// Whether cuBLAS could be loaded; `why` says why not.
bool cublas_available(std::string* why = nullptr);

// The ops run_matrix_product runs: matmul, bmm, linear.
inline bool is_matrix_product(OpId id) {
  return id == OpId::kMatmul || id == OpId::kBmm || id == OpId::kLinear;
}

// How a 16-bit product ran: padded to tensor-core alignment or as it was, and the bytes the
// copies that padded its operands and result moved (none for an operand whose storage holds the
// padding: Storage::row_length).
struct ProductAlignment {
  bool padded = false;
  int64_t copy_bytes = 0;
};

// Runs the opaque node `node` (matmul, bmm or linear) on CUDA tensors `inputs` (the node's
// operands in order) and returns its output; nullptr when cuBLAS cannot (no cuBLAS, an integral
// dtype): the executor then runs the node in the interpreter on host copies. `alignment`, when
// given, gets how the product was aligned.
// `any_layout`: the result may be returned with any strides (its readers index it through its
// strides); a product computed padded then returns its padded buffer's [n, m] corner as a view,
// without the copy out of it (GPT-2's [8192, 50257] logits: 1.6 GB a step not moved).
TensorHandle run_matrix_product(const Node& node, const std::vector<RtValue>& inputs,
                                Allocator* allocator, Stream stream,
                                ProductAlignment* alignment = nullptr, bool any_layout = false);

}  // namespace kiln::cuda
