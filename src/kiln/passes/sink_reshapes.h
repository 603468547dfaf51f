// sink_reshapes: an elementwise op whose tensor operands are all one reshape of same-shaped
// values is computed before the reshape, so that it shares the loop nest of what it reads.
// fuse merges regions whose iteration spaces agree; a reshape between a reduction's region and
// the elementwise op after it (a loss's gradient over [B * T, V] cast to the logits' [B, T, V])
// made the op a region of its own, a round trip of the whole tensor through memory.
//
//   t21 = add(t10, t20)             [8192, 50257] f32, in a row-reduction region
//   t22 = reshape(t21, [8, 1024, 50257])
//   t23 = to(t22, bf16)             a second region: 1.65 GB read, 0.82 GB written
// becomes
//   t23' = to(t21, bf16)            [8192, 50257], in the row region
//   t23 = reshape(t23', [8, 1024, 50257])
//
// Reshapes are reshape, view, flatten, unflatten, squeeze and unsqueeze: the elements in the
// same row-major order, so op(reshape(x)) == reshape(op(x)) for an op applied element by element.
// A 0-dim tensor operand or a number may stand beside them (it is the same at every element).
// An op whose value is a writeback keeps its shape (place_writebacks stores a region's own
// values); a trace output may become a reshape (fuse has the region store it in its shape).
// Repeats down a chain (neg(to(reshape(x)))).
//
// Requires: a functional trace (before fuse).
// Ensures: values and the trace's outputs and writebacks are unchanged; the replaced ops are left
// unused (dce removes them). Returns how many ops moved. Tests:
// tests/lit/passes/sink_reshapes.trace.
#pragma once

#include "kiln/ir/trace.h"

namespace kiln {

int sink_reshapes(Trace& trace);

}  // namespace kiln
