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

const Node* eager_call_of(const Step& step) {
  if (step.kind != Step::Kind::kOpaque) return nullptr;
  for (const auto& n : step.body.nodes())
    if (n->id() == OpId::kEagerCall) return n.get();
  return nullptr;
}

// The position among the step's inputs of the one a body input stands for.
std::optional<size_t> input_position(const Step& step, const Value* inner) {
  for (size_t i = 0; i < step.body.inputs().size(); ++i)
    if (step.body.inputs()[i] == inner) return i;
  return std::nullopt;
}

// Records in step.input_orders the dim orders its eager_call was handed its inputs in (those
// that were dense permutations other than row-major); the inputs wanted row-major go to `fixed`.
void record_input_orders(const Node& call, Step& step, std::set<const Value*>& fixed) {
  const std::string& text = call.arg("input_layouts").as_string();
  if (text.empty()) return;
  const std::vector<EagerResult> layouts = parse_eager_results(text);
  const std::vector<Value*>& args = call.arg(1).values();
  for (size_t k = 0; k < args.size() && k < layouts.size(); ++k) {
    const std::optional<size_t> i = input_position(step, args[k]);
    if (!i || !args[k]->is_tensor()) continue;
    std::optional<std::vector<int>> order =
        permuted_dense_order(args[k]->tensor_type().shape, layouts[k].strides);
    if (!order) {
      fixed.insert(step.inputs[*i]);  // wanted row-major (or as it is) here
      continue;
    }
    step.input_orders.resize(step.inputs.size());
    step.input_orders[*i] = *order;
  }
}

// The dim orders the caller gets the program's fresh CPU results in, where eager's layout of one
// is a dense permutation other than row-major (`relu(x + y)` of channels-last x and y is
// channels-last): the kernel computing it stores it so and walks in that order, where a row-major
// buffer would read every input across its rows and then be copied into eager's layout
// (8.3x eager's time for [16, 64, 56, 56] floats on the CPU). Other results keep row-major, as
// does any result on CUDA: its walk in the caller's order has not run on a GPU yet.
std::map<const Value*, std::vector<int>> returned_orders(const Trace& functional,
                                                         const ProgramInterface& interface) {
  std::map<const Value*, std::vector<int>> orders;
  for (const ReturnBinding& r : interface.returns) {
    if (r.kind != ReturnBinding::Kind::kValue || r.any_layout || r.geometry.offset != 0) continue;
    const Value* v = functional.outputs().at(static_cast<size_t>(r.index));
    if (!v->is_tensor() || v->tensor_type().device != Device::cpu() ||
        r.storage_numel != v->tensor_type().numel())
      continue;
    if (auto order = permuted_dense_order(r.geometry.sizes, r.geometry.strides))
      orders.emplace(v, std::move(*order));
  }
  return orders;
}

}  // namespace

void place_layouts(const Trace& functional, const ProgramInterface& interface,
                   ExecutionPlan& plan) {
  std::set<const Value*> fixed(functional.outputs().begin(), functional.outputs().end());
  std::map<const Value*, std::vector<int>> wanted = returned_orders(functional, interface);
  for (const auto& [v, order] : wanted)
    fixed.erase(v);
  for (const auto& wb : functional.writebacks)
    fixed.insert(wb.second);
  for (Step& step : plan.steps) {
    for (const Step::Writeback& wb : step.writebacks)
      fixed.insert(wb.value);
    const Node* call = eager_call_of(step);
    if (!call) {
      // Read through their storage or by a library product: row-major, as eager's.
      if (step.kind != Step::Kind::kFusion || reads_through_storage(step))
        fixed.insert(step.inputs.begin(), step.inputs.end());
      continue;
    }
    record_input_orders(*call, step, fixed);
    for (size_t i = 0; i < step.input_orders.size(); ++i) {
      if (step.input_orders[i].empty()) continue;
      auto [it, inserted] = wanted.emplace(step.inputs[i], step.input_orders[i]);
      if (!inserted && it->second != step.input_orders[i]) fixed.insert(step.inputs[i]);
    }
  }
  std::vector<bool> grouped(plan.steps.size(), false);
  for (const MultiTensorGroup& g : plan.multi_tensor_groups)
    for (size_t s = g.first; s < g.first + g.count; ++s)
      grouped[s] = true;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    Step& step = plan.steps[s];
    if (step.kind != Step::Kind::kFusion || grouped[s]) continue;
    for (size_t j = 0; j < step.outputs.size(); ++j) {
      auto it = wanted.find(step.outputs[j]);
      if (it == wanted.end() || fixed.contains(step.outputs[j])) continue;
      step.output_orders.resize(step.outputs.size());
      step.output_orders[j] = it->second;
    }
  }
}

}  // namespace kiln
