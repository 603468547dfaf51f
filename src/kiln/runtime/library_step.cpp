#include "kiln/runtime/library_step.h"

#include <algorithm>
#include <optional>
#include <set>

#include "kiln/runtime/interpreter/env.h"
#include "kiln/runtime/interpreter/reference_ops.h"

namespace kiln {

namespace {

// The view ops a library step's body may hold: metadata, or (reshape) a copy when no view
// expresses it.
bool is_step_view(const Node& n) {
  static const std::set<OpId> views = {
      OpId::kTranspose, OpId::kT,        OpId::kPermute,   OpId::kSelect,  OpId::kSlice,
      OpId::kNarrow,    OpId::kExpand,   OpId::kUnsqueeze, OpId::kSqueeze, OpId::kAlias,
      OpId::kDetach,    OpId::kDiagonal, OpId::kReshape,   OpId::kView};
  return views.contains(n.id()) && n.subsymbols.empty();
}

}  // namespace

bool only_views(const Trace& body) {
  return !body.nodes().empty() &&
         std::all_of(body.nodes().begin(), body.nodes().end(),
                     [](const auto& n) { return n->op->kind == OpKind::kView; });
}

bool is_library_body(const Trace& body) {
  if (body.outputs().size() != 1) return false;
  int opaque = 0;
  for (const auto& n : body.nodes()) {
    if (is_step_view(*n)) continue;
    if (n->op->kind != OpKind::kOpaque || n->outputs.size() != 1 || ++opaque > 1) return false;
  }
  return opaque == 1;
}

TensorHandle run_library_body(
    const Trace& body, const std::vector<RtValue>& inputs,
    const std::function<TensorHandle(const Node&, const std::vector<RtValue>&)>& run_node,
    const std::function<TensorHandle(const RtTensor&)>& device_copy) {
  if (!is_library_body(body)) return nullptr;
  std::optional<DeviceCopyScope> copies;
  if (device_copy) copies.emplace(device_copy);
  Env env;
  for (size_t i = 0; i < body.inputs().size(); ++i)
    env.bind(body.inputs()[i], inputs[i]);
  for (const auto& n : body.nodes()) {
    if (is_step_view(*n)) {
      reference_fn(n->id())(env, *n);
      continue;
    }
    std::vector<RtValue> operands;
    for (const Operand& o : n->operands) {
      if (o.is_none())
        operands.emplace_back(RtScalar(false));
      else if (o.is_value())
        operands.push_back(env.at(o.value()));
      else
        return nullptr;
    }
    TensorHandle out = run_node(*n, operands);
    if (!out) return nullptr;
    env.bind(n->outputs[0], out);
  }
  const auto* out = std::get_if<TensorHandle>(&env.at(body.outputs()[0]));
  if (!out) return nullptr;
  // A step's value is never memory of its inputs (the output is a view of the product, or of a
  // copy): a body whose output is a view of an input is not a library step's.
  for (const RtValue& v : inputs)
    if (const auto* t = std::get_if<TensorHandle>(&v); t && (*t)->storage == (*out)->storage)
      return nullptr;
  return *out;
}

}  // namespace kiln
