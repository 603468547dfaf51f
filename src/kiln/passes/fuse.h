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
// Requires: a functional trace (after functionalize, cse, dce).
// Ensures: every compute node is in exactly one step; steps are in a valid data order; each
// region's body is a verified trace of its nodes (views included) over the region's inputs.
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
