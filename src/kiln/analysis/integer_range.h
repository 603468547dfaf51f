// The values an integer tensor can hold, known from how the trace computes it: an arange's
// positions, a constant, their sums and products with constants, views of them, a selection
// between them. What lets an index op whose index is known in range go unchecked (codegen's
// index checks read the index back to the host before each kernel, which also keeps the
// program out of CUDA graphs when the index is computed): GPT-2's position ids are
// arange(0, 12) + 0, always inside its 1024-row table.
//
// Requires: a verified trace (each value's producer, if any, is a node of it).
// Ensures: a range is returned only when every element of `v` lies in it whatever the inputs
// hold (an input's own range only where the trace declares it: Value::known_range); otherwise
// nullopt (inputs, floating values, ops without a rule).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "kiln/ir/trace.h"

namespace kiln {

struct IntegerRange {
  int64_t lo = 0, hi = 0;  // inclusive
};

// `outer`: where a value without a producer comes from (a step body's input: the step's input in
// the functional trace), or null when nothing is known of it.
std::optional<IntegerRange> integer_range(
    const Value* v, const std::function<const Value*(const Value*)>& outer = {});

// The trace inputs whose elements include every element of `v`: `v` only selects among their
// values (views of them, gathers and index_selects from them, cats, wheres and slice scatters of
// such) and constants (a where's number, a full tensor scattered into) for which
// `constant_allowed` holds, or which a where's guard keeps out of what it selects (where(ne(t,
// -100), t, 0): t's -100s are never selected). What lets an index the program computes from a
// caller's tensor be checked before the program runs (or a CUDA graph's replay), on that
// tensor, instead of being read back in the middle of the program (BERT's token type ids: a
// gather from a buffer; a language model's labels, padded with -100, shifted and masked). The
// check is sufficient, not exact: a value of the input that `v` does not select may be out of
// range where `v` is not.
// `outer`: as integer_range's (a step body's input: the step's input in the functional trace);
// a value without a producer and without an `outer` value is a trace input.
// Ensures: empty when `v` is not drawn from trace inputs and allowed constants alone (a computed
// value, a constant not allowed); each returned value has no producer and no `outer` value.
// An input `v` is drawn from, and the values of it `v` never selects (a where's guard keeps them
// out on every path from the input: a loss's labels' -100s), which may be out of range.
struct DrawnInput {
  const Value* input = nullptr;
  std::vector<int64_t> never_selected;  // ascending
  bool operator==(const DrawnInput&) const = default;
};
std::vector<DrawnInput> drawn_from(const Value* v,
                                   const std::function<bool(int64_t)>& constant_allowed = {},
                                   const std::function<const Value*(const Value*)>& outer = {});

}  // namespace kiln
