#include "kiln/ir/printer.h"

#include <cstdio>

namespace kiln {

namespace {

std::string operand_str(const Operand& op) {
  if (op.is_value()) return op.value()->name();
  if (op.is_value_list()) {
    std::string s = "[";
    for (size_t i = 0; i < op.values().size(); ++i)
      s += (i ? ", " : "") + op.values()[i]->name();
    return s + "]";
  }
  return constant_str(op.constant());
}

bool equals_default(const Param& p, const Operand& op) {
  return p.has_default && op.is_constant() &&
         constant_str(op.constant()) == constant_str(p.default_value);
}

void print_node(std::string& out, const Node& node, int indent) {
  std::string pad(static_cast<size_t>(indent), ' ');
  std::string line = pad + (indent > 2 ? "# " : "") + print_statement(node);
  std::string types;
  for (Value* v : node.outputs) {
    types += (types.empty() ? "" : ", ") + v->name() + ": \"" + type_str(v->type()) + "\"";
  }
  std::string comment = types;
  // Subsymbols share their parent's location; print it once, on the parent.
  if (indent == 2 && !node.loc.empty()) {
    comment += (comment.empty() ? "" : "  ") + node.loc.str();
    if (!node.loc.text.empty()) comment += "  " + node.loc.text;
  }
  if (!comment.empty()) line += "  # " + comment;
  out += line + "\n";
  for (const auto& sub : node.subsymbols)
    print_node(out, *sub, indent + 2);
}

}  // namespace

std::string print_statement(const Node& node) {
  std::string s;
  for (size_t i = 0; i < node.outputs.size(); ++i)
    s += (i ? ", " : "") + node.outputs[i]->name();
  if (!node.outputs.empty()) s += " = ";
  s += "ltorch." + node.op->name + "(";
  const auto& params = node.op->params;
  // Positional parameters up to the last one that is not at its default.
  size_t last = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].keyword_only && !equals_default(params[i], node.operands[i])) last = i + 1;
  }
  std::string args;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].keyword_only) {
      if (equals_default(params[i], node.operands[i])) continue;
      args += (args.empty() ? "" : ", ") + params[i].name + "=" + operand_str(node.operands[i]);
    } else if (i < last) {
      args += (args.empty() ? "" : ", ") + operand_str(node.operands[i]);
    }
  }
  return s + args + ")";
}

std::string print_signature(const Trace& trace) {
  char header[128];
  std::snprintf(header, sizeof header, "# Constructed by %s (%.2f ms)\n",
                trace.constructed_by.c_str(), trace.construction_ms);
  std::string out = header;
  out += "def " + trace.name + "(";
  for (size_t i = 0; i < trace.inputs().size(); ++i)
    out += (i ? ", " : "") + trace.inputs()[i]->name();
  out += "):\n";
  for (Value* in : trace.inputs()) {
    out += "  # " + in->name() + ": \"" + type_str(in->type()) + "\"\n";
    if (const auto& r = in->known_range())
      out += "  # " + in->name() + " in [" + std::to_string(r->first) + ", " +
             std::to_string(r->second) + "]\n";
  }
  return out;
}

std::string print_trace(const Trace& trace) {
  std::string out = print_signature(trace);
  for (const auto& node : trace.nodes())
    print_node(out, *node, 2);
  for (const std::string& note : trace.notes)
    out += "  # " + note + "\n";
  out += "  return {\"output\": (";
  for (size_t i = 0; i < trace.outputs().size(); ++i)
    out += (i ? ", " : "") + trace.outputs()[i]->name();
  if (trace.outputs().size() == 1) out += ",";
  out += ")";
  if (!trace.writebacks.empty()) {
    out += ", \"writebacks\": {";
    for (size_t i = 0; i < trace.writebacks.size(); ++i) {
      out += (i ? ", " : "") + trace.writebacks[i].first->name() + ": " +
             trace.writebacks[i].second->name();
    }
    out += "}";
  }
  out += "}\n";
  return out;
}

}  // namespace kiln
