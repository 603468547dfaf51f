// The reference implementation of every op in ops.def. Elementwise rows (and their in-place
// forms) share one generic implementation driven by the table's math expressions; every KILN_OP
// row has a `ref_<Id>` function, so a new row without one fails to link.
#pragma once

#include "kiln/ir/trace.h"
#include "kiln/runtime/interpreter/env.h"

namespace kiln {

// Reads the node's operands from `env`, does what eager PyTorch does (including its errors and
// the strides of what it returns), and binds the node's outputs.
using RefFn = void (*)(Env& env, const Node& node);

// elementwise.cpp: every elementwise op, functional or in place.
void run_elementwise(Env& env, const Node& node);

// ref_*.cpp, one per KILN_OP row.
#define KILN_OP(Id, name, kind, sig, rule, outputs, alias) \
  void ref_##Id(Env& env, const Node& node);
#include "kiln/ir/ops.def"

// fill_'s value argument: a number, or a 0-dim tensor's item() (ref_mutations.cpp).
RtScalar fill_value(const Env& env, const Operand& value);

// The implementation of `id` (interpreter.cpp).
RefFn reference_fn(OpId id);

}  // namespace kiln
