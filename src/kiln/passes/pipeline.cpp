// The pipeline: the ordered list of passes, each line saying why it sits where it does.
#include "kiln/passes/pipeline.h"

#include "kiln/support/dump.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "kiln/analysis/storage_analysis.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"
#include "kiln/passes/cse.h"
#include "kiln/passes/dce.h"
#include "kiln/passes/fuse.h"
#include "kiln/passes/group_multi_tensor.h"
#include "kiln/passes/place_layouts.h"
#include "kiln/passes/place_writebacks.h"
#include "kiln/passes/sink_reshapes.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

class History {
 public:
  explicit History(CompiledProgram& p) : p_(p) {}
  // Runs `pass` on the program's trace, verifies the result and records it.
  // `plan`: the pass works on the execution plan; the record prints the plan.
  template <class F>
  void run(const std::string& name, F&& pass, bool plan = false) {
    auto start = std::chrono::steady_clock::now();
    pass();
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    p_.execution.constructed_by = name;
    p_.execution.construction_ms = ms;
    verify_trace(p_.execution);
    if (plan) {
      for (const Step& s : p_.plan.steps)
        verify_trace(s.body);
    }
    p_.history.push_back(
        {name, ms, plan ? print_plan(p_.execution, p_.plan) : print_trace(p_.execution)});
    dump("traces", name + ".trace", p_.history.back().printed);
  }

 private:
  CompiledProgram& p_;
};

// fuse, with or without inlining element-by-element regions across iteration spaces (fuse.h):
// the plan that launches fewer steps once place_writebacks has placed every write (a store that
// loses its same-index guarantee to inlining comes back as a copy step). On a tie the plain plan
// wins: it recomputes nothing.
//   v = x[:, ::2]; v.mul_(0.5); return x * 2 + 1   inlined: 1 step     plain: 2 steps
//   a[:, 2:7] = a[:, 1:6] + 2                       inlined: 1 + copy   plain: 2 steps
ExecutionPlan fuse_for_fewest_launches(const Trace& functional) {
  const FuseOptions inlining{.inline_across_domains = true};
  ExecutionPlan plain = fuse(functional);
  if (fuse(functional, inlining).steps.size() == plain.steps.size()) return plain;
  // Plans are not copied (their bodies are traces): place a second fuse of each.
  ExecutionPlan plain_placed = fuse(functional), inlined_placed = fuse(functional, inlining);
  place_writebacks(functional, plain_placed);
  place_writebacks(functional, inlined_placed);
  return inlined_placed.steps.size() < plain_placed.steps.size() ? fuse(functional, inlining)
                                                                 : std::move(plain);
}

}  // namespace

const std::vector<std::string>& pipeline_passes() {
  static const std::vector<std::string> passes = {
      "functionalize",      "cse",          "dce", "sink_reshapes", "fuse", "place_writebacks",
      "group_multi_tensor", "place_layouts"};
  return passes;
}

CompiledProgram compile(const Trace& eager, const AliasPattern& pattern,
                        const std::string& stop_after, const std::vector<bool>* requires_grad) {
  KILN_CHECK(stop_after.empty() || std::find(pipeline_passes().begin(), pipeline_passes().end(),
                                             stop_after) != pipeline_passes().end())
      << "there is no pass '" << stop_after << "' in the pipeline.";
  verify_trace(eager);
  CompiledProgram p;
  p.pattern = pattern;
  p.history.push_back({"trace", eager.construction_ms, print_trace(eager)});
  History history(p);
  // The layouts eager gives every value decide which handles share memory and what each view
  // addresses; functionalization reads them.
  StorageAnalysis storage = analyze_storage(eager, pattern);
  // Mutation goes first: with it gone, nothing orders the ops but their data dependences.
  history.run("functionalize", [&] {
    FunctionalProgram f =
        functionalize(eager, pattern, storage, {.for_gradients = requires_grad != nullptr});
    p.execution = std::move(f.trace);
    p.interface = std::move(f.interface);
  });
  // Reads replay view chains on every use; merge the replays before anything counts them.
  if (stop_after == "functionalize") return p;
  history.run("cse", [&] { cse(p.execution); });
  if (stop_after == "cse") return p;
  // Dead temporaries (a mutated value nobody reads, I2) go before fusion sees them.
  history.run("dce", [&] { dce(p.execution); });
  if (stop_after == "dce") return p;
  // On the pure program, before fusion: the forward's saved values are outputs fusion must keep.
  if (requires_grad) {
    history.run("differentiate", [&] {
      p.gradient =
          make_gradient_program(p.execution, p.interface, p.pattern, eager, *requires_grad);
    });
    if (p.gradient->refused.empty()) p.history.push_back({"backward", 0, p.gradient->backward});
  }
  // Elementwise ops before the reshapes they read, so they share their producers' loop nests.
  history.run("sink_reshapes", [&] {
    if (sink_reshapes(p.execution) > 0) dce(p.execution);
  });
  if (stop_after == "sink_reshapes") return p;
  // Regions over the pure program: no mutation is left to cut them.
  history.run(
      "fuse", [&] { p.plan = fuse_for_fewest_launches(p.execution); }, true);
  p.stats.fusion_regions = 0;
  for (const Step& s : p.plan.steps)
    p.stats.fusion_regions += s.kind == Step::Kind::kFusion;
  if (stop_after == "fuse") return p;
  // Last: where each write lands depends on which region computes it and who else reads.
  history.run(
      "place_writebacks",
      [&] {
        WritebackCounts c = place_writebacks(p.execution, p.plan);
        p.stats.writebacks_in_kernel = c.in_kernel;
        p.stats.writebacks_with_temporary = c.with_temporary;
      },
      true);
  if (stop_after == "place_writebacks") return p;
  // After the order is final: which neighbouring steps may share one launch. (KILN_MULTI_TENSOR=0
  // leaves each step its own kernel: for side-by-side comparisons.)
  const char* multi_tensor = std::getenv("KILN_MULTI_TENSOR");
  if (!multi_tensor || std::string(multi_tensor) != "0")
    history.run(
        "group_multi_tensor",
        [&] { p.stats.multi_tensor_steps = group_multi_tensor(p.execution, p.plan); }, true);
  if (stop_after == "group_multi_tensor") return p;
  // After the groups (whose members stay dense row-major): the layouts eager steps were handed.
  history.run(
      "place_layouts", [&] { place_layouts(p.execution, p.interface, p.plan); }, true);
  return p;
}

}  // namespace kiln
