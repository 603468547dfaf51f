// The compiler pipeline (DESIGN.md 2): the ordered list of passes from an eager trace to an
// execution trace, with the trace after each pass kept in the history.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/ir/trace.h"
#include "kiln/passes/functionalize.h"
#include "kiln/passes/gradient_program.h"
#include "kiln/passes/plan.h"

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
  int multi_tensor_steps = 0;  // steps in plan.multi_tensor_groups
};

struct CompiledProgram {
  Trace execution;     // the functional trace the plan's steps are cut from
  ExecutionPlan plan;  // empty until fuse has run
  AliasPattern pattern;
  ProgramInterface interface;
  std::vector<PassRecord> history;
  CompileStats stats;
  std::optional<GradientProgram> gradient;  // when compiled with inputs that require grad
  // The executor's prepared kernels for this program (runtime/executor.cpp's type, made on the
  // first execute and reused by every later call: the hot path does no lowering or lookups).
  mutable std::shared_ptr<const void> executor_cache;
};

// The passes in pipeline order (kiln-opt --passes names them).
const std::vector<std::string>& pipeline_passes();

// Requires: a verified eager trace; a pattern with one entry per trace input.
// `stop_after`: run the pipeline only up to and including that pass (empty: all of it).
// `requires_grad` (one flag per eager input; none: no autograd): differentiate after dce and
// fill `gradient` (when it refuses, the program is compiled without saved values).
CompiledProgram compile(const Trace& eager, const AliasPattern& pattern,
                        const std::string& stop_after = "",
                        const std::vector<bool>* requires_grad = nullptr);

}  // namespace kiln
