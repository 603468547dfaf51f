// The values an integer tensor can hold, known from how the trace computes it: an arange's
// positions, a constant, their sums and products with constants, views of them, a selection
// between them. What lets an index op whose index is known in range go unchecked (codegen's
// index checks read the index back to the host before each kernel, which also keeps the
// program out of CUDA graphs when the index is computed): GPT-2's position ids are
// arange(0, 12) + 0, always inside its 1024-row table.
//
// Requires: a verified trace (each value's producer, if any, is a node of it).
// Ensures: a range is returned only when every element of `v` lies in it whatever the inputs
// hold; otherwise nullopt (inputs, floating values, ops without a rule).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "kiln/ir/trace.h"

namespace kiln {

struct IntegerRange {
  int64_t lo = 0, hi = 0;  // inclusive
};

// `outer`: where a value without a producer comes from (a step body's input: the step's input in
// the functional trace), or null when nothing is known of it.
std::optional<IntegerRange> integer_range(
    const Value* v, const std::function<const Value*(const Value*)>& outer = {});

}  // namespace kiln
