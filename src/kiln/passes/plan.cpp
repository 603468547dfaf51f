#include "kiln/passes/plan.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "kiln/ir/printer.h"

namespace kiln {

namespace {
std::string names(const std::vector<Value*>& vs) {
  std::string s;
  for (size_t i = 0; i < vs.size(); ++i)
    s += (i ? ", " : "") + vs[i]->name();
  return s;
}
}  // namespace

bool reads_through_storage(const Step& step) {
  return std::any_of(step.body.nodes().begin(), step.body.nodes().end(), [](const auto& n) {
    const OpId id = n->id();
    return id == OpId::kAsStrided || id == OpId::kAsStridedScatter || id == OpId::kViewDtype ||
           id == OpId::kBitcast;
  });
}

int64_t group_elements(const ExecutionPlan& plan, const MultiTensorGroup& group) {
  int64_t elements = 0;
  for (size_t s = group.first; s < group.first + group.count; ++s) {
    int64_t most = 1;  // a step's elements: its largest result's (the others are 0-d)
    for (const Value* out : plan.steps[s].outputs)
      most = std::max(most, out->tensor_type().numel());
    elements += most;
  }
  return elements;
}

std::string print_plan(const Trace& functional, const ExecutionPlan& plan) {
  std::string out = print_signature(functional);
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const Step& step = plan.steps[s];
    for (const MultiTensorGroup& g : plan.multi_tensor_groups)
      if (g.first == s)
        out += "  # multi-tensor group: " + step.name + " .. " +
               plan.steps[g.first + g.count - 1].name + " (" + std::to_string(g.count) +
               " steps, one kernel)\n";
    std::string line = "  ";
    if (!step.outputs.empty())
      line += "(" + names(step.outputs) + (step.outputs.size() == 1 ? ",) = " : ") = ");
    line += step.name + "(" + names(step.inputs) + ")";
    std::string writes;
    for (const Step::Writeback& wb : step.writebacks) {
      writes += (writes.empty() ? "" : ", ") + wb.target->name();
      for (const Step::Window& w : wb.window) {
        if (w.kind == Step::Window::Kind::kSelect)
          writes += "[select " + std::to_string(w.dim) + ", " + std::to_string(w.start) + "]";
        else if (w.kind == Step::Window::Kind::kSlice)
          writes += "[slice " + std::to_string(w.dim) + ", " + std::to_string(w.start) + ":" +
                    std::to_string(w.start + std::max<int64_t>(w.length - 1, 0) * w.step +
                                   (w.length > 0 ? 1 : 0)) +
                    (w.step != 1 ? ":" + std::to_string(w.step) : "") + "]";
        else
          writes += "[as_strided]";
      }
      writes += " <- " + wb.value->name();
    }
    if (!writes.empty()) line += "  # writes " + writes;
    auto dims = [](const std::vector<int>& order) {
      std::string text;
      for (int d : order)
        text += (text.empty() ? "" : ", ") + std::to_string(d);
      return "(" + text + ")";
    };
    for (size_t j = 0; j < step.output_orders.size(); ++j)
      if (!step.output_orders[j].empty())
        line += "  # " + step.outputs.at(j)->name() + " laid out in dim order " +
                dims(step.output_orders[j]);
    for (size_t j = 0; j < step.input_orders.size(); ++j)
      if (!step.input_orders[j].empty())
        line += "  # reads " + step.inputs.at(j)->name() + " in dim order " +
                dims(step.input_orders[j]);
    out += line + "\n";
    for (const auto& node : step.body.nodes()) {
      std::string types;
      for (Value* v : node->outputs)
        types += (types.empty() ? "" : ", ") + v->name() + ": \"" + type_str(v->type()) + "\"";
      out += "    # " + print_statement(*node) + (types.empty() ? "" : "  # " + types) + "\n";
    }
  }
  for (const std::string& note : functional.notes)
    out += "  # " + note + "\n";
  out += "  return {\"output\": (" + names(functional.outputs()) +
         (functional.outputs().size() == 1 ? ",)" : ")");
  if (!functional.writebacks.empty()) {
    out += ", \"writebacks\": {";
    for (size_t i = 0; i < functional.writebacks.size(); ++i)
      out += (i ? ", " : "") + functional.writebacks[i].first->name() + ": " +
             functional.writebacks[i].second->name();
    out += "}";
  }
  return out + "}\n";
}

}  // namespace kiln
