// save_or_recompute: which forward values the backward computes again instead of reading them
// saved (DESIGN.md 8, "What to save"). A minimum cut over byte cost, as AOTAutograd's partitioner
// and Thunder's rematerialization choose: every value the backward needs is either saved or
// recomputed from saved values, and the saved set that moves the fewest bytes wins.
//
//   t1 = matmul(h, w)                 bf16 [8192, 50257]  (cuBLAS writes it anyway)
//   t2 = to(t1, f32); t3 = sub(t2, max); t4 = exp(t3)      the backward needs t4
//   saved t4: 2 x 1.65 GB (forward writes, backward reads)
//   saved t1 and max: 0.82 GB + 32 KB   <- the cut; t2, t3, t4 are recomputed in the backward
//
// The graph: each value is an edge in -> out whose capacity is the bytes saving it costs (read
// once by the backward; written once more by the forward unless the forward materializes it
// anyway: an input the caller holds and the program does not write, a result, the operand or
// result of an opaque op, a value read after an opaque op that depends on it). An op the backward
// may compute again (one output, elementwise or a view) joins its operands' outs to its in; any
// other value is joined to the source (it exists only in the forward); each needed value's out is
// joined to the sink. A needed operand of an opaque op is joined to the source by its bytes less
// one: recomputed, the backward stores it for its products to read, which is worth the memory it
// frees only where nothing more is saved to recompute it. An eager step's operand whose graph is
// kept is joined by its bytes and one: that graph holds it anyway and serves only that tensor.
// Among minimum cuts the one nearest the sink is taken, so a tie is saved rather than recomputed.
//
// Requires: a functional trace; `needed`, the values the backward's rules read; `caller_has`, one
// flag per trace input (empty: all).
// Ensures: the returned values are recomputable (single-output elementwise ops, views other than
// as_strided, and arange, full, zeros and ones, which read no tensor), and
// each one's tensor operands are returned too or are saved by the cut; a needed value not
// returned is saved. Tests: tests/lit/passes/differentiate*.trace, tests/python/test_autograd.py.
#pragma once

#include <unordered_set>
#include <vector>

#include "kiln/ir/trace.h"

namespace kiln {

std::unordered_set<Value*> values_to_recompute(const Trace& forward,
                                               const std::vector<Value*>& needed,
                                               const std::vector<bool>& caller_has);

}  // namespace kiln
