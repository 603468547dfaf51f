// Checks a trace's invariants: every operand is defined before it is used, every value is
// defined once, the recorded types are what the op's type rule infers, operands match the op's
// signature, subsymbols define their node's outputs, and the returned values exist.
// Run after every pass in tests and debug builds.
#pragma once

#include <string>
#include <vector>

#include "kiln/ir/trace.h"

namespace kiln {

// Every problem found, one sentence each; empty when the trace is well formed.
std::vector<std::string> verify_trace_problems(const Trace& trace);
// Throws InternalError (with the problems and the printed trace) if there are any.
void verify_trace(const Trace& trace);

}  // namespace kiln
