// Pass stores: a fusion region that computes values over a domain D and one reduction of a value
// over D, whose kernel stores the D-shaped outputs inside the reduction's pass instead of in a
// nest of their own. The pass visits every element of D exactly once, loads it, and can store the
// values of that element there: the region reads and writes D's memory once, as eager's in-place
// op followed by its reduction does (bench.py's `x.mul_(2); return x.sum(0)`, H200 2026-12-03:
// 0.366 ms with a second nest and a temporary's copy against eager's 0.213):
//   for (i1 < 4096) { acc = 0; for (rd < 16384) { v = ld(x, rd, i1) * 2; st(t0, rd, i1, v);
//                                                  acc += v; }  st(t1, i1, acc); }
// The store is at the element the pass loads, so a writeback of t0 into x is a same-index store
// (place_writebacks' rule 4; the kernel records the pass's loads for the executor). Whether the
// pass stores is the kernel's choice (where its pass runs across rows, a CUDA column schedule's
// or a CPU column pass outside a column block, it does not: codegen/lower_kernel.cpp and
// schedule_cpu_passes.cpp): otherwise the D-shaped outputs get the kernel's last nest, after the
// reduction's nest read D, and the same-index store holds there too.
//
// Requires: a verified region body. Ensures: a result only when
//   - the outputs have exactly two shapes, D and R, D != R;
//   - the region has exactly one reduction node, of a single pass (sum, mean, prod, amax, amin,
//     argmax, argmin; not var or std, which pass twice), reading a value of shape D and
//     producing a value of shape R;
//   - no output of shape D depends on that reduction (its values are computed before the pass's
//     accumulation, from loads at the pass's element);
//   - the reduction's value reaches the R-shaped outputs only through elementwise ops of shape R,
//     so that the nest over R evaluates it once per element, at the element (each element of D
//     is visited by one pass exactly once).
// Tests: tests/unit/pass_stores_test.cpp, tests/lit/codegen/pass_store*.trace.
#pragma once

#include <optional>

#include "kiln/ir/trace.h"

namespace kiln {

struct PassStores {
  const Node* reduction = nullptr;  // the one reduction; its pass stores the D-shaped outputs
  Shape domain;                     // D: the reduction's operand's shape
  bool along_last_dim = false;      // the reduction takes in D's last dim (a row's, a tensor's)
};

std::optional<PassStores> pass_stores(const Trace& body);

}  // namespace kiln
