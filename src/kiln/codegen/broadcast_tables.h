// Which values of a CPU fusion region are computed once into a table before the kernel's loop
// nests, instead of once per element that broadcasts them.
//
// A batch norm in eval mode computes a per-channel scale and shift (rsqrt(var + eps) * weight,
// bias - mean * scale) and applies them to every element of an [N, C, H, W] activation. Inlined
// into the elementwise nest (the emitter never materializes a value), the per-channel chain runs
// N * H * W times per channel; at a ResNet's later stages (H = W = 1 or 2) no loop level hoists
// it, and a bf16 ResNet-50 on the CPU spent 3x eager's time in those kernels. A table holds such
// a value at each of its own elements (a [1, C, 1, 1] value: C entries), computed by a small nest
// before the others, and every use loads the entry its index selects.
//
// Requires: a verified region body (a fusion step's trace).
// Ensures: each returned value is a tensor of at most kMaxTableElements elements, computed from
// the region's inputs by elementwise ops, views (not as_strided) and creation ops only (no
// reduction, index op or scatter: its elements depend on its own index alone), with at least one
// op that is not a view, and used by an op of at least kTableBroadcast times its elements (a
// broadcast), or viewed with the same elements by such a value (the table is the viewed value's,
// so its other readers load it too). Values are in the body's order, so a table's own inputs
// that are tables come first.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/ir/trace.h"

namespace kiln::codegen {

// Tables are arrays on the kernel's stack (at most 8 bytes an entry).
constexpr int64_t kMaxTableElements = 8192;
// The fewest uses per entry for which a table pays for its own nest.
constexpr int64_t kTableBroadcast = 4;

std::vector<const Value*> broadcast_tables(const Trace& body);

}  // namespace kiln::codegen
