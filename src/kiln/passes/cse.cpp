#include "kiln/passes/cse.h"

#include <unordered_map>
#include <unordered_set>

#include "kiln/support/error.h"

namespace kiln {

namespace {

// The node's op and operands as text: values by identity, constants by their printed form.
std::string node_key(const Node& node) {
  std::string key = node.op->name + "(";
  for (const Operand& op : node.operands) {
    if (op.is_value()) {
      key += "%" + std::to_string(op.value()->id());
    } else if (op.is_value_list()) {
      key += "[";
      for (const Value* v : op.values())
        key += "%" + std::to_string(v->id()) + ",";
      key += "]";
    } else {
      key += constant_str(op.constant());
    }
    key += ";";
  }
  return key + ")";
}

}  // namespace

int cse(Trace& trace) {
  std::unordered_map<std::string, const Node*> seen;
  std::unordered_set<const Node*> merged;
  for (const auto& node : trace.nodes()) {
    KILN_ASSERT(!node->op->is_mutation())
        << "cse needs a functional trace, found " << node->op->name;
    // Replacements made for earlier nodes already show in this node's operands.
    std::string key = node_key(*node);
    auto [it, inserted] = seen.emplace(key, node.get());
    if (inserted) continue;
    const Node& kept = *it->second;
    for (size_t i = 0; i < node->outputs.size(); ++i)
      trace.replace_all_uses(node->outputs[i], kept.outputs[i]);
    merged.insert(node.get());
  }
  trace.erase_nodes([&](const Node& n) { return merged.contains(&n); });
  return static_cast<int>(merged.size());
}

}  // namespace kiln
