// Runs a compiled program on the caller's tensors: builds the alias groups' bases from the
// caller's storages, runs the execution trace (regions in the reference interpreter for now),
// performs the writebacks into the caller's memory, applies metadata mutations to the caller's
// tensor objects, and returns outputs that are fresh tensors, the caller's own objects, or real
// views of the caller's tensors, exactly as eager would.
#pragma once

#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

// How an argument looks to the alias analysis.
TensorDescription describe(const RtValue& arg);
AliasPattern alias_pattern_of(const std::vector<RtValue>& args);

// Requires: `args` has the dtypes, shapes and layouts the program was compiled for, and the alias
// pattern `program.pattern` (alias_pattern_of(args) == program.pattern).
std::vector<RtValue> execute(const CompiledProgram& program, const std::vector<RtValue>& args);

}  // namespace kiln
