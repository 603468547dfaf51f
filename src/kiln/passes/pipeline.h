// The compiler pipeline (DESIGN.md 2): the ordered list of passes from an eager trace to an
// execution trace, with the trace after each pass kept in the history.
#pragma once

#include <string>
#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/ir/trace.h"

namespace kiln {

struct PassRecord {
  std::string pass;
  double ms = 0;
  std::string printed;  // the trace after the pass
};

struct CompileStats {
  int fusion_regions = 0;
  int writebacks_in_kernel = 0;
  int writebacks_with_temporary = 0;
};

struct CompiledProgram {
  Trace execution;
  AliasPattern pattern;
  std::vector<PassRecord> history;
  CompileStats stats;
};

// Requires: a verified eager trace; a pattern with one entry per trace input.
CompiledProgram compile(const Trace& eager, const AliasPattern& pattern);

}  // namespace kiln
