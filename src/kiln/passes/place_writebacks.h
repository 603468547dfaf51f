// place_writebacks: decides, for each writeback, whether the region that computes its value
// stores it into the input directly, or computes it into a temporary that a later copy step
// writes back (DESIGN.md section 4, the same-index rule):
//   1. eager mutates the input (a writeback exists);
//   2. the store goes through the input's real layout with its dtype and element count;
//   3. the store is injective (the input has no overlapping elements);
//   4. every load of the input in that region uses exactly the store's index (an identity read,
//      in the region's iteration space) — a broadcast, shifted, transposed, gathered or reduced
//      read fails this — or, on the CPU, is row-local: loads in reductions over the last dim of
//      the stored element's own row, which a kernel makes before it stores any of the row
//      (x -= x.mean(-1, keepdim=True); kernel.h, KernelInput::Loads::kRowLocal);
//   5. every other region that reads the input's old contents can run before it.
// Then it orders the steps: readers of an input's old contents before the region that writes
// it; copy steps after the last reader of the old contents.
//
// A writeback whose value only scatters a computed value into part of the input (`x[:, :512] =
// v` makes slice_scatter(x, v, ...)) writes that part alone, never all of the input: on the CPU the
// region that computes v stores it into the window itself when rule 5 allows (rule 4 is then the
// kernel's and the executor's: row-local loads, kernel.h), else a copy step does; on CUDA a copy
// step does for a window under a third of the input, else the region of scatters stays.
//
// Requires: a plan from fuse. Ensures: every writeback of the trace is performed by exactly one
// step; counts in-kernel and temporary writebacks.
// Tests: tests/lit/passes/place_writebacks*.trace.
#pragma once

#include "kiln/ir/trace.h"
#include "kiln/passes/plan.h"

namespace kiln {

struct WritebackCounts {
  int in_kernel = 0;
  int with_temporary = 0;
};

WritebackCounts place_writebacks(const Trace& functional, ExecutionPlan& plan);

}  // namespace kiln
