// Steps without a kernel, run op by op through ATen's C++ API instead of the Python step runner
// (kiln._torch_steps, tens of microseconds a call): the ops such steps are made of in a model's
// programs (an embedding's gradient: zeros, arange, add, reshape, index_add; views; cat), each
// the ATen function of the same name on the same arguments, on the tensors where they are.
//
//   (t44,) = kilnFusion43(t3, ids)       at::zeros([50257, 768], bf16 on the device)
//     # t40 = ltorch.zeros([50257, 768])  ->  t40.index_add_(0, ids, t3)  (t40 is the step's own)
//     # t44 = ltorch.index_add(t40, 0, ids, t3)
//
// Requires: the body's values typed by kiln's type rules (a creation's dtype and device are its
// result's). Ensures: the results the Python runner gives, or nullopt where this runner does
// not take the step: an op it has no entry for; on CUDA an index op whose index is not checked
// yet (PyTorch's CUDA kernels would device-assert; the Python runner checks on the host); or an
// ATen error other than an index out of range (the Python runner runs the step again and raises
// eager's own error: the step writes nothing of its inputs). An index out of range raises
// IndexOutOfRange with ATen's message. Results over an input's memory are copies.
#pragma once

#include <optional>
#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln::pyext {

// Per node of a step's body: whether PyTorch may run its in-place form. An index write whose
// self is a fresh tensor this step made (a creation op's, or another index write's) and that
// nothing else reads writes into it instead of into a copy: an embedding's gradient,
// index_add(zeros(...), ...), spent as long copying the zeros as filling them.
std::vector<bool> writes_in_place(const Trace& body);

std::optional<std::vector<RtValue>> run_step_with_aten(const Trace& body,
                                                       const std::vector<RtValue>& inputs,
                                                       bool indices_checked);

}  // namespace kiln::pyext
