// A library step: a plan step whose body is one opaque node that a library runs (a matrix
// product: cuBLAS on CUDA, ATen on the CPU), the views it reads its operands through, and views
// of its result:
//   t18 = reshape(x, [24, 64]); t19 = t(weight); t20 = linear(t18, t19, bias); t21 = reshape(t20,
//   ..)
// GPT-2's every Conv1D is one. The views run in the reference interpreter, which only changes
// metadata, except a reshape that no view expresses: that one copies (in device memory, on the
// given copier's stream, for device tensors). Without this, such a step went through the
// Python step runner (tens of microseconds a call).
#pragma once

#include <functional>
#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

// Whether `body` is a library step's: views, one opaque node, views of its result, one output.
bool is_library_body(const Trace& body);

// Whether `body` only views its inputs: a view step, which moves no data (executor.cpp).
bool only_views(const Trace& body);

// Runs a library step's body on `inputs`: the views in the interpreter (`device_copy` makes a
// reshape's copy of a device tensor; unused on the CPU), the opaque node by `run_node` with its
// operands in order (None for an absent one: a linear without a bias). Returns the body's
// output, or nullptr when `body` is not a library step's or run_node returns nullptr.
TensorHandle run_library_body(
    const Trace& body, const std::vector<RtValue>& inputs,
    const std::function<TensorHandle(const Node&, const std::vector<RtValue>&)>& run_node,
    const std::function<TensorHandle(const RtTensor&)>& device_copy = nullptr);

}  // namespace kiln
