#include "kiln/passes/dce.h"

#include <unordered_set>

#include "kiln/support/error.h"

namespace kiln {

int dce(Trace& trace) {
  std::unordered_set<const Value*> live(trace.outputs().begin(), trace.outputs().end());
  for (const auto& [target, value] : trace.writebacks)
    live.insert(value);
  std::unordered_set<const Node*> dead;
  // One backward sweep: a node is live when one of its outputs is; then its operands are.
  for (auto it = trace.nodes().rbegin(); it != trace.nodes().rend(); ++it) {
    const Node& node = **it;
    KILN_ASSERT(!node.op->is_mutation()) << "dce needs a functional trace, found " << node.op->name;
    bool used = false;
    for (const Value* o : node.outputs)
      used = used || live.contains(o);
    if (!used) {
      dead.insert(&node);
      continue;
    }
    for (const Operand& op : node.operands) {
      if (op.is_value()) live.insert(op.value());
      if (op.is_value_list()) live.insert(op.values().begin(), op.values().end());
    }
  }
  trace.erase_nodes([&](const Node& n) { return dead.contains(&n); });
  return static_cast<int>(dead.size());
}

}  // namespace kiln
