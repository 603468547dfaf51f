// place_layouts: lays out a fusion region's output the way the eager step that reads it was
// handed it in eager, where that is a dense permutation other than row-major: the activations
// a channels-last convolution reads (cuDNN's NHWC kernels, oneDNN's), which a row-major buffer
// would send through the library's own transposes, or a copy before the step.
//
//   (t3,) = kilnFusion1(t2)        # relu of the last convolution's result
//   (t5,) = eager_call(t3, w)      # eager_call(..., input_layouts="... strides=(288, 1, 48, 8)")
//   ->  (t3,) = kilnFusion1(t2)  # t3 laid out in dim order (0, 2, 3, 1)
//
// A fresh CPU result of the program is laid out as eager lays it out for the caller, where that is
// such a permutation (relu(x + y) of channels-last x and y): handed out as it is, not copied.
//
// The kernel iterates in that order (its stores coalesce) and the executor allocates the output
// so (executor.cpp, kernel_buffers). Values whose layout something else decides keep row-major:
// the program's other outputs and its writebacks (the caller's layouts), values read through their
// storage (as_strided, a bitcast) or by a library product, members of a multi-tensor group (dense
// row-major tensors), and a value two eager steps want in different orders.
//
// Requires: a plan after group_multi_tensor. Ensures: Step::output_orders set as above, and each
// eager step's Step::input_orders (the orders it was handed its inputs in, which the executor
// copies an input into when it is not so laid out); nothing else changed.
// Tests: tests/lit/passes/place_layouts.trace, tests/python/test_fallback.py.
#pragma once

#include <optional>
#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/passes/functionalize.h"
#include "kiln/passes/plan.h"

namespace kiln {

// The dims of a dense layout from outermost to innermost (size-1 dims first), or nullopt where
// the strides are not a dense permutation or are row-major.
std::optional<std::vector<int>> permuted_dense_order(const Shape& sizes,
                                                     const std::vector<int64_t>& strides);

void place_layouts(const Trace& functional, const ProgramInterface& interface, ExecutionPlan& plan);

}  // namespace kiln
