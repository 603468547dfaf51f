// A product with its bias added in cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS), as ATen's CUDA
// addmm runs nn.Linear: the bias is added to each result in registers before the store, where
// cuBLAS's plain GEMM needs it copied into the output first and then read back (beta = 1): a write
// and a read of the whole output that a ViT-B/16 forward at batch 128 paid 1.9 ms for on an H200
// (bench/NOTES.md, session 13). cuBLASLt is loaded with dlopen (libcublasLt.so.13 or .12) like
// cuBLAS; the algorithm its heuristic picks is kept per shape.
//
// Requires: column-major operands as cuBLAS reads them (cublas.cpp maps kiln's row-major
// product onto that), one matrix (no batch), a bias of `m` elements with unit stride in the
// product's dtype. Ensures: C = op(A) op(B) + bias broadcast along C's columns, computed as
// cuBLAS's plain product is (float32 accumulation for 16-bit dtypes, full float32 for float32),
// or false with nothing run when cuBLASLt is missing or has no algorithm for the layout.
#pragma once

#include <cstdint>

#include "kiln/ir/dtype.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cuda/driver.h"

namespace kiln::cuda {

// C[m, n] (column-major, leading dim ldc) = op_a(A)[m, k] op_b(B)[k, n] + bias[m].
struct BiasProduct {
  int data_type = 0;       // cudaDataType of A, B, C and the bias: CUDA_R_32F, _16F or _16BF
  int op_a = 0, op_b = 0;  // CUBLAS_OP_N or CUBLAS_OP_T
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  const void* bias = nullptr;
  void* c = nullptr;
  int64_t ldc = 0;
};

// Runs `p` on `stream` of `device` (its workspace from `allocator`); false when it cannot.
bool run_bias_product(const BiasProduct& p, Device device, Allocator* allocator, Stream stream);

}  // namespace kiln::cuda
