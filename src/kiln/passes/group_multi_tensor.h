// group_multi_tensor: finds runs of consecutive fusion steps that one multi-tensor kernel may run
// together (DESIGN.md 9, "multi-tensor apply"): an optimizer written as a loop over its
// parameters is one region per parameter, each the same few elementwise ops over a tensor of its
// own size, and a kernel launch each (50 parameters: 50 launches, most of them a few elements).
//
//   for p, g, buf in zip(params, grads, bufs):        kilnFusion0(bufs_0, grads_0, params_0) f32[1]
//       buf.mul_(momentum).add_(g)                     kilnFusion1(bufs_1, grads_1, params_1)
//       f32[2] p.add_(buf, alpha=-lr)                         ...  one group of 50 steps, one
//       kernel
//
// A step joins the run before it when
//   1. it is elementwise over one shape: every node (and subsymbol) an elementwise op, a fill
//      like another tensor or a 0-d fill; every result of that shape, with at least one
//      element, or 0-d (AdamW's step count: the kernel stores it once, at the member's first
//      element); every other tensor it reads or makes of that shape or 0-d (a value every
//      element reads; numbers allowed too); none of its writebacks into part of a tensor; and
//      where it has more than one element, no 0-d result stored into its target by the kernel
//      (other elements may read that memory meanwhile);
//   2. it is the run's first step's computation up to that shape: the same ops with the same
//      constants, the same dtypes, devices and number types, wired the same way;
//   3. it is independent of every step of the run: it reads no value one of them makes, and no
//      step of the run reads or writes the memory another writes back into (by the inputs'
//      alias groups: a view of an input, or a value stored into an input's memory, is that
//      input's memory).
// Running such steps at once, in any order, then is running them one after the other. Whether
// they do is the executor's choice, call by call (the tensors must be dense; multi_tensor.h).
//
// Requires: a plan after place_writebacks. Ensures: plan.multi_tensor_groups holds disjoint runs
// of at least two steps, in step order; the steps themselves are unchanged. Returns the number of
// steps grouped.
// Tests: tests/lit/passes/group_multi_tensor.trace.
#pragma once

#include "kiln/ir/trace.h"
#include "kiln/passes/plan.h"

namespace kiln {

int group_multi_tensor(const Trace& functional, ExecutionPlan& plan);

}  // namespace kiln
