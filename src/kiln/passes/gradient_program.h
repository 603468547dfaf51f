// make_gradient_program: differentiate (differentiate.h) on a program's functional trace, and
// how the result meets the caller (DESIGN.md 8): which results the backward gets gradients of,
// which results are its saved values (the caller's own tensors where a saved value is an input,
// fresh results after the function's own otherwise) and which arguments its outputs are the
// gradients of.
//
// Requires: the functional trace and interface functionalize made for `pattern` (after cse and
// dce); one requires_grad flag per eager input.
// Ensures: `refused` says why when kiln does not differentiate the program (it then runs
// eagerly); otherwise the functional trace returns the saved intermediates after its own
// outputs, the interface has a result for each, and `backward` is the printed backward trace.
// An argument that requires grad and is not its own base (a non-contiguous tensor, or one passed
// twice, as tied weights are) gets the gradient of its synthetic base viewed as the argument
// lies in it; a base shared by different tensors is refused.
// Tests: tests/python/test_autograd.py.
#pragma once

#include <string>
#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/ir/trace.h"
#include "kiln/passes/functionalize.h"

namespace kiln {

// What compile made of a call whose inputs require grad: the backward program, and how the
// forward program's results and the caller's arguments feed it.
struct GradientProgram {
  std::string refused;   // non-empty: not differentiated (why); the program runs eagerly
  std::string backward;  // the backward trace, printed; its inputs carry no layouts
  std::vector<std::string> backward_inputs;  // in order: the gradients, then the saved values
  std::vector<int> differentiable_results;   // the results whose gradients are its first inputs
  std::vector<int> saved_results;            // the results that are its saved inputs (the
                                             // forward returns them after its own results)
  std::vector<int> grad_inputs;              // the eager input each of its outputs is the
                                             // gradient of
  int own_results = 0;                       // the results the function itself returns
  std::vector<int> caller_results;           // those that are the caller's tensors or views of
                                             // them (they need no gradient: else refused)
};

GradientProgram make_gradient_program(Trace& functional, ProgramInterface& interface,
                                      const AliasPattern& pattern, const Trace& eager,
                                      const std::vector<bool>& requires_grad);

}  // namespace kiln
