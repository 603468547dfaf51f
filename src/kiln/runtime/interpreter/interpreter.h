// The reference interpreter: runs an eager trace op by op on the CPU with real storages, sizes,
// strides, offsets and aliasing, as eager PyTorch does. It is the oracle for every C++ test.
//
// Requires: a verified trace; inputs whose dtypes and shapes match the trace's input types (and
// whose strides/offset match an input's layout when the type records one). Inputs may share
// storage with each other (aliased inputs): writes through one are seen through the others.
// Ensures: returns the trace's outputs; an output that is an input (or an in-place result of
// one) is the very same TensorHandle; views share their base's storage; inputs carry every
// mutation, including metadata mutations (transpose_ changes the caller's handle). Errors eager
// PyTorch raises (writes into internally overlapping memory, partially overlapping in-place
// operands, views whose strides do not allow it) are UserErrors naming the op and source line.
#pragma once

#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

std::vector<RtValue> interpret(const Trace& trace, const std::vector<RtValue>& inputs);

}  // namespace kiln
