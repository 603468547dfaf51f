// The execution plan: the functional trace cut into steps (fusion regions, opaque ops, writeback
// copies), in the order they run. `fuse` makes the regions, `place_writebacks` decides where
// each writeback happens and orders the steps.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kiln/ir/trace.h"

namespace kiln {

struct Step {
  enum class Kind { kFusion, kOpaque, kCopy };
  Kind kind = Kind::kFusion;
  std::string name;  // kilnFusion0, ...
  // kFusion / kOpaque: the region as a trace of its own. Its inputs correspond to `inputs`, its
  // outputs to `outputs` (values of the functional trace).
  Trace body;
  std::vector<Value*> inputs;
  std::vector<Value*> outputs;
  // Writebacks this step performs: (functional-trace input, value). For kCopy the value was
  // computed by an earlier step into a temporary; for kFusion the region stores it itself.
  std::vector<std::pair<Value*, Value*>> writebacks;
};

struct ExecutionPlan {
  std::vector<Step> steps;
};

// The plan as Python-like text: each step a call `(outs) = kilnFusionN(ins)` with its nodes as
// comments beneath and the writebacks it performs.
std::string print_plan(const Trace& functional, const ExecutionPlan& plan);

}  // namespace kiln
