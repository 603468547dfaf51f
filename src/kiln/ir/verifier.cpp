#include "kiln/ir/verifier.h"

#include <algorithm>
#include <set>

#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

class Verifier {
 public:
  std::vector<std::string> problems;

  void check_nodes(const std::vector<std::unique_ptr<Node>>& nodes, std::set<const Value*>& defined,
                   bool top_level) {
    for (const auto& node : nodes) {
      std::string where = "'" + print_statement(*node) + "'";
      if (!node->op) {
        problems.push_back("a node has no op");
        continue;
      }
      if (node->operands.size() != node->op->params.size()) {
        problems.push_back(where + " has " + std::to_string(node->operands.size()) +
                           " operands but " + node->op->name + " takes " +
                           std::to_string(node->op->params.size()));
        continue;
      }
      for (const Operand& op : node->operands) {
        std::vector<Value*> used;
        if (op.is_value()) used.push_back(op.value());
        if (op.is_value_list()) used = op.values();
        for (Value* v : used) {
          if (!defined.contains(v))
            problems.push_back(where + " uses '" + v->name() + "' before it is defined");
        }
      }
      try {
        std::vector<TensorType> types = infer_types(*node->op, node->operands);
        if (types.size() != node->outputs.size()) {
          problems.push_back(where + " has " + std::to_string(node->outputs.size()) +
                             " outputs but its type rule gives " + std::to_string(types.size()));
        } else {
          for (size_t i = 0; i < types.size(); ++i) {
            const Value* v = node->outputs[i];
            if (!v->is_tensor() || !(v->tensor_type() == types[i]))
              problems.push_back(where + ": '" + v->name() + "' has type " + type_str(v->type()) +
                                 " but the type rule infers " + types[i].str());
          }
        }
      } catch (const UserError& e) {
        problems.push_back(where + " fails its type rule: " + e.what());
      }
      if (!node->subsymbols.empty()) {
        std::set<const Value*> inner = defined;
        check_nodes(node->subsymbols, inner, false);
        for (Value* out : node->outputs) {
          if (!inner.contains(out))
            problems.push_back(where + ": its subsymbols do not define '" + out->name() + "'");
        }
      } else if (find_decomposition(node->id()) != nullptr) {
        problems.push_back(where + " has a decomposition but no subsymbols");
      }
      for (Value* out : node->outputs) {
        if (top_level && defined.contains(out))
          problems.push_back("'" + out->name() + "' is defined twice");
        defined.insert(out);
        if (top_level && out->producer() != node.get())
          problems.push_back("'" + out->name() + "' does not record " + where + " as its producer");
      }
    }
  }
};

}  // namespace

std::vector<std::string> verify_trace_problems(const Trace& trace) {
  Verifier v;
  std::set<const Value*> defined;
  std::set<std::string> names;
  for (Value* in : trace.inputs()) {
    if (!names.insert(in->name()).second)
      v.problems.push_back("input '" + in->name() + "' appears twice");
    defined.insert(in);
  }
  v.check_nodes(trace.nodes(), defined, true);
  for (const auto& [target, value] : trace.writebacks) {
    bool is_input =
        std::find(trace.inputs().begin(), trace.inputs().end(), target) != trace.inputs().end();
    if (!is_input)
      v.problems.push_back("writeback target '" + target->name() + "' is not an input");
    if (!defined.contains(value))
      v.problems.push_back("writeback value '" + value->name() + "' is never defined");
    if (value->is_tensor() && target->is_tensor() &&
        (value->tensor_type().shape != target->tensor_type().shape ||
         value->tensor_type().dtype != target->tensor_type().dtype))
      v.problems.push_back("writeback of '" + value->name() + "' into '" + target->name() +
                           "' changes its dtype or shape");
  }
  for (Value* out : trace.outputs()) {
    if (!defined.contains(out))
      v.problems.push_back("the trace returns '" + out->name() + "', which is never defined");
  }
  return v.problems;
}

void verify_trace(const Trace& trace) {
  std::vector<std::string> problems = verify_trace_problems(trace);
  if (problems.empty()) return;
  std::string msg;
  for (const auto& p : problems)
    msg += "\n  " + p;
  KILN_ASSERT(false) << "the trace is malformed:" << msg << "\n" << print_trace(trace);
}

}  // namespace kiln
