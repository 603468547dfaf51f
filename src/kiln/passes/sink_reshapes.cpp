// sink_reshapes: see sink_reshapes.h.
#include "kiln/passes/sink_reshapes.h"

#include <optional>
#include <unordered_set>

#include "kiln/ir/builder.h"

namespace kiln {

namespace {

bool is_reshape(const Node& n) {
  return keeps_row_major_order(n.id()) && n.subsymbols.empty();
}

// The shape every reshaped operand of `n` comes from, when `n` can be computed before them.
std::optional<Shape> reshaped_from(const Node& n) {
  if (n.op->kind != OpKind::kElementwise || n.outputs.size() != 1 || !n.outputs[0]->is_tensor())
    return std::nullopt;
  const Shape& shape = n.outputs[0]->tensor_type().shape;
  std::optional<Shape> from;
  for (const Operand& o : n.operands) {
    if (o.is_value_list()) return std::nullopt;
    if (!o.is_value() || !o.value()->is_tensor()) continue;
    const TensorType& t = o.value()->tensor_type();
    if (t.rank() == 0) continue;
    const Node* p = o.value()->producer();
    if (t.shape != shape || !p || !is_reshape(*p)) return std::nullopt;
    const Shape& in = p->input(0)->tensor_type().shape;
    if (from && *from != in) return std::nullopt;
    from = in;
  }
  if (!from || *from == shape) return std::nullopt;
  return from;
}

}  // namespace

int sink_reshapes(Trace& trace) {
  std::unordered_set<const Value*> kept;
  for (const auto& [input, value] : trace.writebacks)
    kept.insert(value);
  int moved = 0;
  // Indices, not iterators: each move inserts two nodes before the current one.
  for (size_t i = 0; i < trace.nodes().size(); ++i) {
    const Node& n = *trace.nodes()[i];
    if (kept.contains(n.outputs.empty() ? nullptr : n.outputs[0])) continue;
    if (!reshaped_from(n)) continue;
    std::vector<Operand> operands;
    for (const Operand& o : n.operands) {
      const bool reshaped =
          o.is_value() && o.value()->is_tensor() && o.value()->tensor_type().rank() > 0;
      operands.push_back(reshaped ? Operand(o.value()->producer()->input(0)) : o);
    }
    Value* out = n.outputs[0];
    IntList shape(out->tensor_type().shape.begin(), out->tensor_type().shape.end());
    Builder b(trace);
    Value* inner = b.call_bound(n.id(), std::move(operands), n.loc).at(0);
    // A functionalized in-place op keeps its input's dtype where its type rule would promote
    // (a.addcmul_(f64, f64) on float32 a): the op, then the cast into that dtype, as eager does.
    size_t added = 2;
    if (DType d = out->tensor_type().dtype; inner->tensor_type().dtype != d) {
      inner = b.call1(OpId::kTo, {inner, Constant(d)}, {}, n.loc);
      ++added;
    }
    Value* outer = b.call_bound(OpId::kReshape, {Operand(inner), Constant(shape)}, n.loc).at(0);
    trace.replace_all_uses(out, outer);
    trace.move_last_nodes_before(added, &n);
    i += added;  // past the new nodes, to the replaced one
    ++moved;
  }
  return moved;
}

}  // namespace kiln
