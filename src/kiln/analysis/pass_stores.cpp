#include "kiln/analysis/pass_stores.h"

#include <algorithm>
#include <set>

namespace kiln {

namespace {

bool single_pass(OpId id) {
  return id == OpId::kSum || id == OpId::kMean || id == OpId::kProd || id == OpId::kAmax ||
         id == OpId::kAmin || id == OpId::kArgmax || id == OpId::kArgmin;
}

// Whether the reduction takes in the last dim of its operand (every dim when none is named).
bool reduces_last_dim(const Node& reduction) {
  const auto rank = static_cast<int64_t>(reduction.input(0)->tensor_type().rank());
  if (rank == 0) return true;
  const Operand& dims = reduction.arg(1);
  if (dims.is_none()) return true;
  if (const auto* d = std::get_if<int64_t>(&dims.constant()))  // argmax's, argmin's, prod's dim
    return *d == -1 || *d == rank - 1;
  const IntList& list = dims.as_ints();
  return list.empty() ||
         std::any_of(list.begin(), list.end(), [&](int64_t d) { return d == -1 || d == rank - 1; });
}

}  // namespace

std::optional<PassStores> pass_stores(const Trace& body) {
  const Node* reduction = nullptr;
  for (const auto& n : body.nodes()) {
    if (n->op->kind != OpKind::kReduction) continue;
    if (reduction) return std::nullopt;
    reduction = n.get();
  }
  if (!reduction || !single_pass(reduction->id())) return std::nullopt;
  const Value* operand = reduction->input(0);
  const Value* result = reduction->outputs[0];
  if (!operand->is_tensor() || !result->is_tensor()) return std::nullopt;
  const Shape& domain = operand->tensor_type().shape;
  const Shape& reduced = result->tensor_type().shape;
  if (domain == reduced) return std::nullopt;
  bool has_domain_output = false;
  for (const Value* out : body.outputs()) {
    if (!out->is_tensor()) return std::nullopt;
    const Shape& s = out->tensor_type().shape;
    if (s != domain && s != reduced) return std::nullopt;
    has_domain_output = has_domain_output || s == domain;
  }
  if (!has_domain_output) return std::nullopt;
  // The values computed from the reduction (nodes in order, so a producer is seen first): only
  // elementwise ops of the reduced shape, and none of them an output of shape D.
  std::set<const Value*> after{result};
  for (const auto& n : body.nodes()) {
    bool uses = false;
    for (const Operand& op : n->operands) {
      if (op.is_value() && after.contains(op.value())) uses = true;
      if (op.is_value_list())
        for (const Value* v : op.values())
          uses = uses || after.contains(v);
    }
    if (!uses) continue;
    if (n->op->kind != OpKind::kElementwise) return std::nullopt;
    for (const Value* o : n->outputs) {
      if (!o->is_tensor() || o->tensor_type().shape != reduced) return std::nullopt;
      after.insert(o);
    }
  }
  for (const Value* out : body.outputs())
    if (out->tensor_type().shape == domain && after.contains(out)) return std::nullopt;
  return PassStores{reduction, domain, reduces_last_dim(*reduction)};
}

}  // namespace kiln
