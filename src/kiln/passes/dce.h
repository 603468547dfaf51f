// dce: removes nodes whose values nobody uses. Roots are the trace's outputs and the values of
// its writebacks (a writeback is never dead).
//
// Requires: a functional trace (no mutating op: removing a node must not remove an effect).
// Ensures: every remaining node has an output that reaches a root. Returns how many it removed.
// Tests: tests/lit/passes/dce_cse.trace.
#pragma once

#include "kiln/ir/trace.h"

namespace kiln {

int dce(Trace& trace);

}  // namespace kiln
