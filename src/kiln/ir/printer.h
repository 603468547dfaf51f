// Prints a trace as Python-like source (DESIGN.md 2.1). The parser (parser.h) reads exactly this
// form back; `print_trace(parse_trace(print_trace(t))) == print_trace(t)` is a test.
//
//   # Constructed by trace (0.02 ms)
//   def computation(a):
//     # a: "cpu f32[5, 5]"
//     t0 = ltorch.tanh_(a)  # t0: "cpu f32[5, 5]"  seed.cpp:12
//     t1 = ltorch.mul(t0, t0)  # t1: "cpu f32[5, 5]"  seed.cpp:12
//     return {"output": (t1,)}
//
// Arguments follow the op's signature: positional parameters in order with trailing defaults left
// out, keyword-only parameters as name=value when they differ from their default. Subsymbols
// follow their node as comments indented two more spaces.
#pragma once

#include <string>

#include "kiln/ir/trace.h"

namespace kiln {

std::string print_trace(const Trace& trace);
// The header and inputs: "# Constructed by ...", "def <name>(<inputs>):" and each input's type
// comment (with its known range, `# ids in [0, 49]`, where it has one).
std::string print_signature(const Trace& trace);
// One statement without its trailing comment: "t1 = ltorch.mul(t0, t0)".
std::string print_statement(const Node& node);

}  // namespace kiln
