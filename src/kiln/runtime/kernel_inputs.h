// What a generated kernel (CPU or CUDA) needs to know about a real input before it reads it: that
// every as_strided window it reads through stays inside the input's storage, and that an input it
// indexes as a whole storage is one (kernel.h, KernelInput). When not, the executor runs the step
// in the interpreter instead, which raises eager's error or computes the case.
#pragma once

#include <span>

#include "kiln/codegen/kernel.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

bool kernel_can_read(const codegen::KernelInput& input, const RtTensor& t);

// Whether t's elements lie one after the other in its storage from its offset, in row-major
// order (a dim of size 1 may have any stride): how a multi-tensor kernel reads and writes each
// member's tensors (codegen::MultiTensorKernel).
bool dense(const RtTensor& t);
// The same with t's dims in memory in `order`, outermost first (empty: row-major): a
// channels-last activation is dense in order (0, 2, 3, 1).
bool dense_in_order(const RtTensor& t, std::span<const int> order);

// One member of a multi-tensor kernel's call: its step's inputs and output buffers, dense.
struct MultiTensorMember {
  std::span<const RtValue> inputs;
  std::span<const TensorHandle> outputs;
};

}  // namespace kiln
