// cse: merges nodes that compute the same thing — the same op on the same operands — keeping the
// first. Functionalization replays a view chain at every read; this is what makes that free.
//
//   t1 = ltorch.slice(a, 0, 0, 2)        t1 = ltorch.slice(a, 0, 0, 2)
//   t2 = ltorch.exp(t1)            ->    t2 = ltorch.exp(t1)
//   t3 = ltorch.slice(a, 0, 0, 2)        t4 = ltorch.mul(t2, t1)
//   t4 = ltorch.mul(t2, t3)
//
// Requires: a functional trace (ops are pure). Ensures: no two nodes with equal op and operands;
// uses of a removed node's outputs (writebacks and outputs included) point at the kept node's.
// Returns how many nodes it merged. Tests: tests/lit/passes/dce_cse.trace.
#pragma once

#include "kiln/ir/trace.h"

namespace kiln {

int cse(Trace& trace);

}  // namespace kiln
