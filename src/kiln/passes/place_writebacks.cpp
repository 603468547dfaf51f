#include "kiln/passes/place_writebacks.h"

#include <algorithm>
#include <set>

#include "kiln/support/error.h"

namespace kiln {

namespace {

// Whether `v` (a region input standing for the written tensor, or a view of it) is only ever
// read at the index the region stores to: identity views, and elementwise or scatter-self
// operands of the tensor's own shape. Ops that read only the shape (zeros_like, ...) do not load.
bool only_identity_reads(const Trace& body, const Value* v, const Shape& shape) {
  for (const auto& node : body.nodes()) {
    for (size_t k = 0; k < node->operands.size(); ++k) {
      const Operand& op = node->operands[k];
      bool uses = (op.is_value() && op.value() == v) ||
                  (op.is_value_list() &&
                   std::find(op.values().begin(), op.values().end(), v) != op.values().end());
      if (!uses) continue;
      const OpInfo& info = *node->op;
      const Shape& out = node->outputs.empty() ? shape : node->outputs[0]->tensor_type().shape;
      switch (info.kind) {
        case OpKind::kCreation:
          if (info.id == OpId::kFill && k == 1) return false;  // a 0-dim value, broadcast
          break;                                               // *_like: shape only
        case OpKind::kElementwise:
          if (out != shape || v->tensor_type().shape != shape) return false;
          break;
        case OpKind::kScatter:
          if (k != 0 || out != shape) return false;  // src lands somewhere else
          break;
        case OpKind::kView: {
          // An identity view (same shape, same elements) keeps the index; anything else moves it.
          bool identity =
              out == shape && v->tensor_type().shape == shape &&
              (info.id == OpId::kAlias || info.id == OpId::kDetach || info.id == OpId::kReshape ||
               info.id == OpId::kView || (info.id == OpId::kSlice && node->arg(4).as_int() == 1));
          if (!identity || !only_identity_reads(body, node->outputs[0], shape)) return false;
          break;
        }
        default:
          return false;  // reductions, joins, opaque ops read other indices
      }
    }
  }
  return true;
}

bool reads(const Step& s, const Value* v) {
  return std::find(s.inputs.begin(), s.inputs.end(), v) != s.inputs.end();
}
bool defines(const Step& s, const Value* v) {
  return std::find(s.outputs.begin(), s.outputs.end(), v) != s.outputs.end();
}

// Orders steps by their data edges plus `extra` (a, b): a before b. False if impossible.
bool schedule(std::vector<Step>& steps, const std::vector<std::pair<size_t, size_t>>& extra) {
  size_t n = steps.size();
  std::vector<std::set<size_t>> preds(n);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (i != j)
        for (const Value* v : steps[i].inputs)
          if (defines(steps[j], v)) preds[i].insert(j);
  for (const auto& [a, b] : extra)
    preds[b].insert(a);
  std::vector<size_t> order;
  std::vector<bool> done(n, false);
  while (order.size() < n) {
    bool progressed = false;
    for (size_t i = 0; i < n && !progressed; ++i) {
      if (done[i] ||
          !std::all_of(preds[i].begin(), preds[i].end(), [&](size_t p) { return done[p]; }))
        continue;
      done[i] = true;
      order.push_back(i);
      progressed = true;
    }
    if (!progressed) return false;
  }
  std::vector<Step> sorted;
  for (size_t i : order)
    sorted.push_back(std::move(steps[i]));
  steps = std::move(sorted);
  return true;
}

}  // namespace

WritebackCounts place_writebacks(const Trace& functional, ExecutionPlan& plan) {
  WritebackCounts counts;
  std::vector<std::pair<size_t, size_t>> constraints;
  std::vector<std::pair<Value*, Value*>> temporaries;
  for (const auto& [target, value] : functional.writebacks) {
    auto in_kernel = [&]() -> std::optional<size_t> {
      size_t r = 0;
      while (r < plan.steps.size() && !defines(plan.steps[r], value))
        ++r;
      if (r == plan.steps.size() || plan.steps[r].kind != Step::Kind::kFusion) return std::nullopt;
      const Step& step = plan.steps[r];
      const Shape& shape = target->tensor_type().shape;
      // Rule 4: the region's own loads of the target are at the store's index.
      for (size_t k = 0; k < step.inputs.size(); ++k) {
        if (step.inputs[k] == target &&
            !only_identity_reads(step.body, step.body.inputs()[k], shape))
          return std::nullopt;
      }
      // Rule 5: every other step reading the old contents can run first.
      std::vector<std::pair<size_t, size_t>> extra = constraints;
      for (size_t q = 0; q < plan.steps.size(); ++q)
        if (q != r && reads(plan.steps[q], target)) extra.emplace_back(q, r);
      std::vector<Step> trial;
      for (Step& s : plan.steps)
        trial.push_back(Step{s.kind, s.name, Trace(), s.inputs, s.outputs, {}});
      if (!schedule(trial, extra)) return std::nullopt;
      constraints = extra;
      return r;
    }();
    if (in_kernel) {
      plan.steps[*in_kernel].writebacks.emplace_back(target, value);
      ++counts.in_kernel;
    } else {
      temporaries.emplace_back(target, value);
      ++counts.with_temporary;
    }
  }
  bool ok = schedule(plan.steps, constraints);
  KILN_ASSERT(ok) << "place_writebacks could not order the steps it accepted";
  // Copies after everything: every reader of old contents has run by then.
  for (const auto& wb : temporaries) {
    Step copy;
    copy.kind = Step::Kind::kCopy;
    copy.name = "writeback";
    copy.inputs = {wb.second};
    copy.writebacks = {wb};
    plan.steps.push_back(std::move(copy));
  }
  int fusion = 0;
  for (Step& s : plan.steps) {
    if (s.kind == Step::Kind::kFusion) s.name = "kilnFusion" + std::to_string(fusion++);
    if (s.kind == Step::Kind::kOpaque) s.name = s.body.nodes().front()->op->name;
  }
  return counts;
}

}  // namespace kiln
