// Reads the printed form of a trace (printer.h) back into a Trace, through the Builder, so every
// statement is type-checked as it is read. The types written in the comments are checked against
// the inferred ones, and a node's subsymbols against its decomposition.
// A malformed file raises ParseError "file:line:col: error: ..." (never a crash).
#pragma once

#include <string>
#include <string_view>

#include "kiln/ir/trace.h"

namespace kiln {

Trace parse_trace(std::string_view text, const std::string& filename = "<trace>");

// "cpu f32[5, 5]" (optionally " strides=(5, 1) offset=0"), "float", "int", "bool".
// Returns false if `text` is not a type.
bool parse_type(std::string_view text, Type* type);

}  // namespace kiln
