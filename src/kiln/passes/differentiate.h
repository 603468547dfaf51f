// differentiate: reverse mode on the functional trace (DESIGN.md 8). The trace has no mutation
// left, so this is the textbook transform: a forward sweep marks the values that depend on an
// input that requires grad, a reverse sweep applies each node's derivative rule
// (ir/derivative_rules.h) to the gradients of its outputs and sums the contributions per value.
//
//   def f(x, w):                      backward(g0, s_x, s_w):
//     t0 = ltorch.mul(x, w)             t1 = ltorch.mul(g0, s_w)     # gradient of x
//     t1 = ltorch.sum(t0)               ...
//     return (t1,)                      return (gx, gw)
//
// What the backward reads of the forward it reads as saved values: inputs, and intermediates the
// forward program returns besides its own results. Which values are saved and which the backward
// computes again (views and elementwise ops, in its fused kernels) is a minimum cut over the bytes
// saving them moves (save_or_recompute.h).
//
// Requires: a functional trace (after functionalize, cse and dce: no mutation, no subsymbols);
// one flag per trace input; the trace values of the program's results (nullptr for a result
// that is not a fresh value: a number, the caller's tensor, a view of it).
// Ensures: `refused` says why when the program cannot be differentiated (an op without a rule,
// a result that is a view of the caller's memory and needs a gradient, a write into an argument
// that requires grad or of a value that does: eager would rebase that tensor's history); otherwise
// the forward trace's outputs gain the saved intermediates (appended after its own, each once) and
// `backward` is a functional trace: inputs g0.. (the gradients of the differentiable results, in
// order) then the saved values (named s_<forward name>); outputs the gradients of the inputs in
// `grad_inputs`, each of its input's shape and dtype. An input that requires grad but no result
// depends on gets none (as eager leaves its .grad None). Tests:
// tests/lit/passes/differentiate*.trace, tests/python/test_autograd.py.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/analysis/geometry.h"
#include "kiln/ir/trace.h"

namespace kiln {

struct Gradient {
  std::string refused;  // non-empty: the program cannot be differentiated, and why
  Trace backward;
  std::vector<int> differentiable_results;  // indices into the results, one per g input
  std::vector<Value*> saved;                // forward values, one per saved backward input
  std::vector<int> grad_inputs;             // forward trace inputs, one per backward output
};

// A result that is one of several views of one fresh storage (ReturnBinding::kFreshView): its
// place in the storage, and where the storage's whole value (the result's `value`) lies in it.
struct FreshView {
  Geometry view;
  int64_t storage_numel = 0;
  Geometry storage;
};

struct ResultValue {
  Value* value = nullptr;  // the fresh trace value the result is (nullptr: it is not one)
  bool is_view = false;    // the result is a view of the caller's memory (refused if it needs
                           // a gradient)
  std::optional<FreshView> fresh_view;  // the result is this view of `value`'s storage
};

// `caller_has` (one flag per trace input; empty: all): the inputs the caller holds as tensors,
// which cost nothing to save (a synthetic base does: the forward would return a copy).
Gradient differentiate(Trace& forward, const std::vector<bool>& requires_grad,
                       const std::vector<ResultValue>& results,
                       const std::vector<bool>& caller_has = {});

}  // namespace kiln
