// Torch ops run by PyTorch for kiln (kiln._C): eager_call's functions (a Python callable per
// op kiln has no lowering for, registered by python/kiln/_tracer.py) and the steps without a
// kernel, run op by op through kiln._torch_steps (matrix products through ATen directly).
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln::pyext {

// Registers a Python function that takes a list of tensors and returns a list of tensors (made
// by python/kiln/_fallback.py for each eager fallback it records) and returns its number;
// `capture_refusal`: why it may not be recorded into a CUDA graph, empty when it may
// (eager_calls.h).
int register_eager(nanobind::callable callable, std::string capture_refusal);

// A fusion step without a kernel, run by PyTorch on the device (the executor's StepRunner). On
// CUDA each index op checks its index first (PyTorch's kernels would device-assert) unless
// `indices_checked`.
std::vector<RtValue> run_step_with_torch(const Trace& body, const std::vector<RtValue>& inputs,
                                         bool indices_checked);

}  // namespace kiln::pyext
