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

#include <functional>
#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

std::vector<RtValue> interpret(const Trace& trace, const std::vector<RtValue>& inputs);

// Called with every value as it is defined: each input when it is bound, then the outputs of
// every node that runs (subsymbols included; a decomposed node's outputs are its subsymbols'), with
// the runtime value at that moment. A tensor's geometry may change later (a metadata mutation
// changes the handle), so an observer that wants the layout a value was defined with copies it.
using ValueObserver = std::function<void(const Value* v, const RtValue& value)>;
// interpret, reporting every value to `observer` (tests compare static analyses with it).
std::vector<RtValue> interpret_observed(const Trace& trace, const std::vector<RtValue>& inputs,
                                        const ValueObserver& observer);

}  // namespace kiln
