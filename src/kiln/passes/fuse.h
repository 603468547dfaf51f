// fuse: partitions a functional trace into fusion regions (DESIGN.md 2.4).
//
// Greedy along producer -> consumer edges: a node joins its producer's region while the
// iteration spaces agree and no path leaves the region and comes back (a cycle through an
// outside node). Elementwise ops, creation, scatters, cat/stack and reductions fuse; a reduction
// fuses with its elementwise prologue and epilogue when they run over the reduction's input
// shape or its reduced shape (a row normalization is one region). Views are index remappings:
// they are not regions of their own but are copied into each region that reads through them.
// Opaque ops (matmul, bmm, linear) stand alone.
//
// With `inline_across_domains`, a region of element-by-element ops (no reduction) that only one
// other region reads joins that region although their iteration spaces differ: the kernel
// recomputes each element where it is read (through a strided view or a scatter's src). That
// saves a launch and a round trip through memory, but it can turn a store into an input into one
// that needs a temporary (a shifted read, H1); the pipeline keeps it only when it launches fewer
// steps after place_writebacks.
//
// After the greedy merge, an element-by-element value other regions read is recomputed in each
// of them, from what its own region reads, when their new reads cost no more bytes than storing
// the value and reading it (at most 8 nodes, each element once per nest iteration, never through
// a broadcast); its region then no longer stores it. A layer norm's backward, a column nest for
// its weight gradient and a row nest for its input gradient, reads its bf16 inputs in both
// instead of handing float32 intermediates from one to the other. Then two regions that reduce
// over one loop nest (same shape, same reduced dims, no argmax or argmin) and read a value in
// common become one when neither reaches the other: a layer norm's weight and bias gradients are
// one column nest over its output gradient.
//
// Requires: a functional trace (after functionalize, cse, dce).
// Ensures: every compute node is in one step (or recomputed in each step that reads it); steps
// are in a valid data order; each region's body is a verified trace of its nodes (views
// included) over the region's inputs, and a step outputs only values it stores itself.
// Code: the state shared by the stages in fuser.h; the greedy and sibling merges in fuse.cpp, the
// recomputation in fuse_recompute.cpp, the plan's steps in fuse_build.cpp.
// Tests: tests/lit/passes/fuse*.trace.
#pragma once

#include "kiln/ir/trace.h"
#include "kiln/passes/plan.h"

namespace kiln {

struct FuseOptions {
  bool inline_across_domains = false;
};

ExecutionPlan fuse(const Trace& functional, const FuseOptions& options = {});

}  // namespace kiln
