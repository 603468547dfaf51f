// Derivative rules: for each op of the functional trace, how the gradient of its outputs becomes
// the gradient of its operands (a vector-Jacobian product), written with the ops of ops.def so
// that the backward program is a trace like any other and fuses like one. They live beside the
// type rules: one rule per op, found by its id (DESIGN.md 8).
//
// A rule reads forward values through `GradContext::forward` (the differentiate pass decides how
// the backward program gets them: a saved tensor, or the value computed again from saved ones)
// and gives each operand that needs a gradient its contribution through `accumulate`. It computes
// in the dtype promotion gives and returns contributions of the operand's shape and dtype (`sum_to`
// and `cast_to` below), as PyTorch's derivatives.yaml formulas do.
//
//   y = mul(a, b)       ->  accumulate(a, mul(g, forward(b)));  accumulate(b, mul(g, forward(a)))
//   y = sum(a, [1])     ->  accumulate(a, expand(unsqueeze(g, 1), a.shape))
#pragma once

#include <span>
#include <stdexcept>

#include "kiln/ir/builder.h"

namespace kiln {

class GradContext {
 public:
  explicit GradContext(Builder& backward) : b(backward) {}
  virtual ~GradContext() = default;
  Builder& b;  // builds the backward trace
  // A forward value (tensor or number) as the backward trace reads it.
  virtual Value* forward(Value* v) = 0;
  // Whether `v`, an operand of the node being differentiated, needs a gradient.
  virtual bool needs(Value* v) const = 0;
  // Adds `grad` (of v's shape; cast to v's dtype here) to v's gradient.
  virtual void accumulate(Value* v, Value* grad) = 0;
};

// `grads` has one entry per output of `n`: its gradient, or nullptr where the output has none.
using DerivativeRule = void (*)(GradContext& c, const Node& n, std::span<Value* const> grads);

// The rule of an op; nullptr when kiln cannot differentiate it (the differentiate pass refuses
// the program and says which op).
DerivativeRule find_derivative_rule(OpId id);

// Ops whose outputs carry no gradient to their inputs (comparisons, argmax, detach, creation,
// index arithmetic): eager's autograd does not track them.
bool is_non_differentiable(OpId id);

// What a rule throws for a case it does not cover (scatter of an index smaller than its source,
// a reduction kiln has no formula for): the differentiate pass refuses the program with `what`.
struct NoDerivative : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Helpers the rules share (derivative_rules.cpp, derivative_rules_structural.cpp).
namespace grad {
// `g` summed over the dims broadcasting added to reach its shape from `shape`.
Value* sum_to(Builder& b, Value* g, const Shape& shape);
Value* cast_to(Builder& b, Value* g, DType dtype);
// Zeros of a forward value's type (its shape, dtype and device; the value itself is not read).
Value* zeros_of(Builder& b, Value* like);
const Shape& shape_of(Value* v);
// A forward operand (a tensor or number value, or a literal) as the backward reads it.
Operand operand(GradContext& c, const Operand& o);
}  // namespace grad

// The rules of the structural ops (views, scatters, index ops, joins, matmul), registered into
// the table find_derivative_rule reads.
DerivativeRule find_structural_derivative_rule(OpId id);

}  // namespace kiln
