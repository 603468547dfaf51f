// store_index_rule: whether a fusion region may store a value straight into a tensor it also
// reads (DESIGN.md 4, the same-index rule), decided in affine index arithmetic over the region's
// iteration. place_writebacks asks it for each writeback a region could make in its kernel.
//
// Rule 4 for a store of `stored` into `target`: in each iteration, every load of `target` in the
// region reaches the element the store of that iteration writes (kSameIndex). Or the weaker
// row-local form (kRowLocal, the kernel's KernelInput::Loads::kRowLocal): loads outside any
// reduction as before, and loads inside reductions over the last dim at any element of the
// iteration's own row, where the store is the iteration's own element (no view between). A
// kernel does a row's reductions before it stores any of the row's elements; it decides itself,
// on the loads it makes, and the executor copies after it where it cannot.
//
// Requires: `body` a region's trace (a fusion step's), `target` one of its inputs, `stored` one of
// its outputs. Ensures: kSameIndex or kRowLocal only where the rule holds for every output of the
// region over the store's domain, and no output over another domain (another nest) reads the
// target; kNone whenever a map is not affine (a temporary is always safe).
// Tests: tests/lit/passes/place_writebacks*.trace.
#pragma once

#include "kiln/ir/trace.h"

namespace kiln {

enum class StoreIndexRule { kNone, kSameIndex, kRowLocal };

StoreIndexRule store_index_rule(const Trace& body, const Value* target, const Value* stored);

}  // namespace kiln
