#include "kiln/codegen/broadcast_tables.h"

#include <functional>
#include <map>
#include <set>

#include "kiln/ir/op.h"

namespace kiln::codegen {

namespace {

// Every node of the body, decompositions' subsymbols included (the emitter evaluates a
// decomposed op through them), in order.
void each_node(const std::vector<std::unique_ptr<Node>>& nodes,
               const std::function<void(const Node&)>& visit) {
  for (const auto& n : nodes) {
    visit(*n);
    each_node(n->subsymbols, visit);
  }
}

// The tensor values a node reads.
std::vector<const Value*> tensor_operands(const Node& n) {
  std::vector<const Value*> values;
  for (const Operand& o : n.operands) {
    if (o.is_value() && o.value()->is_tensor()) values.push_back(o.value());
    if (o.is_value_list())
      for (const Value* v : o.values())
        if (v->is_tensor()) values.push_back(v);
  }
  return values;
}

}  // namespace

std::vector<const Value*> broadcast_tables(const Trace& body) {
  // Where each value is defined (its producer, or the subsymbol of a decomposition).
  std::map<const Value*, const Node*> defined_by;
  std::vector<const Node*> order;
  each_node(body.nodes(), [&](const Node& n) {
    order.push_back(&n);
    if (!n.subsymbols.empty()) return;  // its outputs are its subsymbols'
    for (const Value* out : n.outputs)
      defined_by[out] = &n;
  });
  const std::set<const Value*> inputs(body.inputs().begin(), body.inputs().end());

  // Per value: whether its elements depend on its own index and the inputs alone (pure), and
  // whether some op of it is not a view (computes).
  struct Facts {
    bool pure = false, computes = false;
  };
  std::map<const Value*, Facts> facts;
  std::function<Facts(const Value*)> facts_of = [&](const Value* v) -> Facts {
    if (auto it = facts.find(v); it != facts.end()) return it->second;
    Facts f;
    if (!v->is_tensor()) {
      f.pure = true;  // a number: the same at every element
    } else if (inputs.contains(v)) {
      f.pure = true;
    } else if (auto d = defined_by.find(v); d != defined_by.end()) {
      const Node& n = *d->second;
      const OpKind kind = n.op->kind;
      bool allowed = kind == OpKind::kElementwise || kind == OpKind::kCreation ||
                     (kind == OpKind::kView && n.id() != OpId::kAsStrided);
      if (n.id() == OpId::kEmptyLike) allowed = false;
      f.pure = allowed;
      f.computes = allowed && kind != OpKind::kView;
      for (const Operand& o : n.operands) {
        if (!f.pure) break;
        if (o.is_value_list()) {
          f.pure = false;  // (no elementwise op takes a list)
        } else if (o.is_value()) {
          Facts in = facts_of(o.value());
          f.pure = in.pure;
          f.computes = f.computes || in.computes;
        }
      }
    }
    facts[v] = f;
    return f;
  };

  // Values some op reads at many of its elements per element of theirs.
  std::set<const Value*> broadcast;
  for (const Node* n : order) {
    int64_t widest = 0;
    for (const Value* out : n->outputs)
      if (out->is_tensor()) widest = std::max(widest, out->tensor_type().numel());
    for (const Value* in : tensor_operands(*n))
      if (in->tensor_type().numel() * kTableBroadcast <= widest) broadcast.insert(in);
  }

  // A view of a computed value with the same elements (the reshape of a batch norm's [C] scale
  // to [1, C, 1, 1]) is tabled as the value it views: its other readers (the shift, computed
  // from the scale) then load the table too, where the view's table left them recomputing it.
  auto viewed = [&](const Value* v) {
    for (auto d = defined_by.find(v); d != defined_by.end(); d = defined_by.find(v)) {
      const Node& n = *d->second;
      if (n.op->kind != OpKind::kView || n.id() == OpId::kAsStrided) break;
      const std::vector<const Value*> in = tensor_operands(n);
      // (The same elements in the same dtype: a reshape or a permutation, not a dtype view.)
      if (in.size() != 1 || in[0]->tensor_type().numel() != v->tensor_type().numel() ||
          in[0]->tensor_type().dtype != v->tensor_type().dtype || !facts_of(in[0]).computes ||
          inputs.contains(in[0]))
        break;
      v = in[0];
    }
    return v;
  };
  std::set<const Value*> chosen;
  for (const Node* n : order) {
    for (const Value* v : n->outputs) {
      if (!v->is_tensor() || !broadcast.contains(v)) continue;
      if (v->tensor_type().numel() == 0 || v->tensor_type().numel() > kMaxTableElements) continue;
      Facts f = facts_of(v);
      if (f.pure && f.computes) chosen.insert(viewed(v));
    }
  }
  std::vector<const Value*> tables;  // in the body's order: a table's own tables come first
  for (const Node* n : order)
    for (const Value* v : n->outputs)
      if (chosen.erase(v) > 0) tables.push_back(v);
  return tables;
}

}  // namespace kiln::codegen
