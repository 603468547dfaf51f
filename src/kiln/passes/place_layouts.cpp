// place_layouts: see place_layouts.h.
#include "kiln/passes/place_layouts.h"

#include <algorithm>
#include <map>
#include <set>

#include "kiln/ir/type_rules.h"

namespace kiln {

std::optional<std::vector<int>> permuted_dense_order(const Shape& sizes,
                                                     const std::vector<int64_t>& strides) {
  if (strides.size() != sizes.size()) return std::nullopt;
  std::vector<int> order, ones;
  for (size_t d = 0; d < sizes.size(); ++d)
    (sizes[d] == 1 ? ones : order).push_back(static_cast<int>(d));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return strides[static_cast<size_t>(a)] > strides[static_cast<size_t>(b)];
  });
  int64_t expected = 1;
  for (size_t k = order.size(); k-- > 0;) {
    const auto d = static_cast<size_t>(order[k]);
    if (strides[d] != expected) return std::nullopt;
    expected *= sizes[d];
  }
  if (std::is_sorted(order.begin(), order.end())) return std::nullopt;  // row-major
  ones.insert(ones.end(), order.begin(), order.end());
  return ones;
}

namespace {

bool reads_storage(const Step& step) {
  for (const auto& n : step.body.nodes()) {
    const OpId id = n->id();
    if (id == OpId::kAsStrided || id == OpId::kAsStridedScatter || id == OpId::kViewDtype ||
        id == OpId::kBitcast)
      return true;
  }
  return false;
}

const Node* eager_call_of(const Step& step) {
  if (step.kind != Step::Kind::kOpaque) return nullptr;
  for (const auto& n : step.body.nodes())
    if (n->id() == OpId::kEagerCall) return n.get();
  return nullptr;
}

// The outer value a step's body input stands for.
const Value* outer(const Step& step, const Value* inner) {
  for (size_t i = 0; i < step.body.inputs().size(); ++i)
    if (step.body.inputs()[i] == inner) return step.inputs.at(i);
  return nullptr;
}

}  // namespace

int place_layouts(const Trace& functional, ExecutionPlan& plan) {
  std::set<const Value*> fixed(functional.outputs().begin(), functional.outputs().end());
  for (const auto& wb : functional.writebacks)
    fixed.insert(wb.second);
  std::map<const Value*, std::vector<int>> wanted;
  for (const Step& step : plan.steps) {
    for (const Step::Writeback& wb : step.writebacks)
      fixed.insert(wb.value);
    const Node* call = eager_call_of(step);
    if (!call) {
      // Read through their storage or by a library product: row-major, as eager's.
      if (step.kind != Step::Kind::kFusion || reads_storage(step))
        fixed.insert(step.inputs.begin(), step.inputs.end());
      continue;
    }
    const std::string& text = call->arg("input_layouts").as_string();
    if (text.empty()) continue;
    const std::vector<EagerResult> layouts = parse_eager_results(text);
    const std::vector<Value*>& inputs = call->arg(1).values();
    for (size_t k = 0; k < inputs.size() && k < layouts.size(); ++k) {
      const Value* v = outer(step, inputs[k]);
      if (!v || !v->is_tensor()) continue;
      std::optional<std::vector<int>> order =
          permuted_dense_order(v->tensor_type().shape, layouts[k].strides);
      if (!order) {
        fixed.insert(v);  // wanted row-major (or as it is) here
        continue;
      }
      auto [it, inserted] = wanted.emplace(v, *order);
      if (!inserted && it->second != *order) fixed.insert(v);
    }
  }
  std::vector<bool> grouped(plan.steps.size(), false);
  for (const MultiTensorGroup& g : plan.multi_tensor_groups)
    for (size_t s = g.first; s < g.first + g.count; ++s)
      grouped[s] = true;
  int placed = 0;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    Step& step = plan.steps[s];
    if (step.kind != Step::Kind::kFusion || grouped[s]) continue;
    for (size_t j = 0; j < step.outputs.size(); ++j) {
      auto it = wanted.find(step.outputs[j]);
      if (it == wanted.end() || fixed.contains(step.outputs[j])) continue;
      step.output_orders.resize(step.outputs.size());
      step.output_orders[j] = it->second;
      ++placed;
    }
  }
  return placed;
}

}  // namespace kiln
