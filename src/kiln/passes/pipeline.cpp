// The pipeline: the ordered list of passes, each line saying why it sits where it does.
#include "kiln/passes/pipeline.h"

#include "kiln/support/dump.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <unordered_set>

#include "kiln/analysis/storage_analysis.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"
#include "kiln/passes/cse.h"
#include "kiln/passes/dce.h"
#include "kiln/passes/differentiate.h"
#include "kiln/passes/fuse.h"
#include "kiln/passes/place_writebacks.h"
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

// The results as differentiate sees them: the fresh value each is, or the value it is a view of.
std::vector<ResultValue> result_values(const Trace& functional, const ProgramInterface& interface,
                                       const Trace& eager) {
  std::vector<ResultValue> results;
  auto input_named = [&](const std::string& name) -> Value* {
    for (Value* v : functional.inputs())
      if (v->name() == name) return v;
    return nullptr;
  };
  for (const ReturnBinding& r : interface.returns) {
    const auto index = static_cast<size_t>(r.index);
    switch (r.kind) {
      case ReturnBinding::Kind::kValue: {
        Value* v = functional.outputs().at(index);
        results.push_back({v->is_tensor() ? v : nullptr, false, std::nullopt});
        break;
      }
      case ReturnBinding::Kind::kFreshView:
        results.push_back({functional.outputs().at(index), false,
                           FreshView{r.geometry, r.storage_numel, r.storage_geometry}});
        break;
      case ReturnBinding::Kind::kInputObject:
        results.push_back({input_named(eager.inputs().at(index)->name()), true, std::nullopt});
        break;
      case ReturnBinding::Kind::kInputView:
        results.push_back({functional.inputs().at(index), true, std::nullopt});
        break;
    }
  }
  return results;
}

// A fresh copy of a value, exact (cat of one tensor allocates; no arithmetic touches a bit).
Value* copy_of(Trace& trace, Value* v) {
  Builder b(trace);
  const Shape& shape = v->tensor_type().shape;
  Value* flat = b.call1(OpId::kReshape, {v, Constant(IntList{-1})});
  Value* copy = b.call1(OpId::kCat, {std::vector<Value*>{flat}});
  return b.call1(OpId::kReshape, {copy, Constant(IntList(shape.begin(), shape.end()))});
}

// Runs differentiate on the functional trace and connects its saved values to results: an input
// is the caller's own tensor (kInputObject), an intermediate a fresh result after the function's.
GradientProgram differentiate_program(CompiledProgram& p, const Trace& eager,
                                      const std::vector<bool>& eager_requires_grad) {
  GradientProgram out;
  Trace& f = p.execution;
  std::unordered_map<std::string, int> eager_input;
  for (size_t i = 0; i < eager.inputs().size(); ++i)
    eager_input[eager.inputs()[i]->name()] = static_cast<int>(i);
  std::vector<bool> requires_grad(f.inputs().size(), false);
  for (size_t i = 0; i < eager.inputs().size(); ++i) {
    if (!eager_requires_grad.at(i)) continue;
    const std::string& name = eager.inputs()[i]->name();
    auto own = std::find_if(f.inputs().begin(), f.inputs().end(),
                            [&](Value* v) { return v->name() == name; });
    if (own == f.inputs().end()) {
      // Its value is a view of a synthetic base (alias_pattern.h), which has no derivative rule.
      out.refused = "argument " + name +
                    " requires grad and is not contiguous or shares memory with another argument";
      return out;
    }
    requires_grad[static_cast<size_t>(own - f.inputs().begin())] = true;
  }
  const size_t own_outputs = f.outputs().size();
  Gradient g = differentiate(f, requires_grad, result_values(f, p.interface, eager));
  out.own_results = static_cast<int>(p.interface.returns.size());
  if (!g.refused.empty()) {
    out.refused = g.refused;
    return out;
  }
  std::unordered_set<Value*> written;
  for (const auto& [input, value] : f.writebacks)
    written.insert(input);
  for (Value* v : g.saved) {
    auto in = std::find(f.inputs().begin(), f.inputs().end(), v);
    ReturnBinding r;
    if (in != f.inputs().end() && written.contains(v)) {
      // The backward needs the argument as it was before the program wrote it (a batch norm's
      // running statistics, which its eager step's gradient reads): the forward keeps a copy.
      v = copy_of(f, v);
      f.set_outputs([&] {
        std::vector<Value*> outputs = f.outputs();
        outputs.push_back(v);
        return outputs;
      }());
      in = f.inputs().end();
    }
    if (in != f.inputs().end()) {
      auto arg = eager_input.find(v->name());
      if (arg == eager_input.end()) {
        out.refused = "the backward needs " + v->name() + ", which is a view of a synthetic base";
        return out;
      }
      r.kind = ReturnBinding::Kind::kInputObject;
      r.index = arg->second;
    } else {
      auto at = std::find(f.outputs().begin(), f.outputs().end(), v);
      KILN_ASSERT(at != f.outputs().end()) << "differentiate did not return saved " << v->name();
      r.index = static_cast<int>(at - f.outputs().begin());
      auto same = std::find_if(p.interface.returns.begin(), p.interface.returns.end(),
                               [&](const ReturnBinding& b) {
                                 return b.kind == ReturnBinding::Kind::kValue && b.index == r.index;
                               });
      if (static_cast<size_t>(r.index) < own_outputs && same != p.interface.returns.end()) {
        out.saved_results.push_back(static_cast<int>(same - p.interface.returns.begin()));
        continue;
      }
      if (v->is_tensor()) {
        r.geometry = contiguous_geometry(v->tensor_type().shape);
        r.storage_numel = v->tensor_type().numel();
      }
    }
    out.saved_results.push_back(static_cast<int>(p.interface.returns.size()));
    p.interface.returns.push_back(r);
  }
  out.differentiable_results = g.differentiable_results;
  for (int i : g.grad_inputs)
    out.grad_inputs.push_back(eager_input.at(f.inputs().at(static_cast<size_t>(i))->name()));
  for (Value* v : g.backward.inputs())
    out.backward_inputs.push_back(v->name());
  verify_trace(g.backward);
  out.backward = print_trace(g.backward);
  return out;
}

}  // namespace

const std::vector<std::string>& pipeline_passes() {
  static const std::vector<std::string> passes = {"functionalize", "cse", "dce", "fuse",
                                                  "place_writebacks"};
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
    history.run("differentiate",
                [&] { p.gradient = differentiate_program(p, eager, *requires_grad); });
    if (p.gradient->refused.empty()) p.history.push_back({"backward", 0, p.gradient->backward});
  }
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
  return p;
}

}  // namespace kiln
