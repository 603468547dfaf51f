// Whether a kernel may store a writeback's value straight into the caller's memory (DESIGN.md 4)
// instead of the executor copying it there after the kernel: place_writebacks decided the step
// may; this decides it again on the real tensors of a call.
//
// Requires: tensors with non-negative strides (the executor's views of the caller's tensors).
#pragma once

#include <cstddef>
#include <vector>

#include "kiln/codegen/kernel.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

// Whether output `j` of the kernel may be stored into `dest` (see the definition).
bool can_store_in_kernel(const codegen::Kernel& kernel, size_t j, const RtTensor& dest,
                         const std::vector<RtValue>& inputs);

// An output whose kernel stores only some of its elements (codegen::KernelOutput::base): how the
// others come to hold the base input's values when the output is stored into `dest`.
//   kInPlace: `dest` is the base's own memory, element for element: they hold them already.
//   kFillFirst: the executor copies the base into `dest` before the kernel (no byte shared).
//   kRefuse: neither; the output goes to a fresh buffer, filled from the base first.
enum class BaseFill { kInPlace, kFillFirst, kRefuse };
BaseFill base_fill(const RtTensor& dest, const RtTensor& base);

}  // namespace kiln
