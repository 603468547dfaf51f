#include "kiln/passes/group_multi_tensor.h"

#include <algorithm>
#include <map>
#include <set>

namespace kiln {

namespace {

// Elementwise ops, and the creations that are elementwise too: a tensor like another filled
// with one number (torch.pow(0.9, step) fills a 0-d 0.9 like the step), and 0-d fills.
bool all_elementwise(const std::vector<std::unique_ptr<Node>>& nodes) {
  return std::all_of(nodes.begin(), nodes.end(), [](const std::unique_ptr<Node>& n) {
    const bool like =
        n->id() == OpId::kFullLike || n->id() == OpId::kZerosLike || n->id() == OpId::kOnesLike;
    const bool scalar_fill = n->op->kind == OpKind::kCreation && n->outputs.size() == 1 &&
                             n->outputs[0]->is_tensor() && n->outputs[0]->tensor_type().rank() == 0;
    return (n->op->kind == OpKind::kElementwise || like || scalar_fill) &&
           all_elementwise(n->subsymbols);
  });
}

// Rule 1: the shape every tensor of the step has (an input, an intermediate value or a result
// may also be a 0-d tensor: a value every element reads, as AdamW's step size from its step
// count, or a result the kernel stores once), or nullopt.
std::optional<Shape> uniform_shape(const Step& step) {
  if (step.kind != Step::Kind::kFusion || step.body.outputs().empty()) return std::nullopt;
  if (!all_elementwise(step.body.nodes())) return std::nullopt;
  for (const Step::Writeback& wb : step.writebacks)
    if (!wb.window.empty()) return std::nullopt;
  auto rank = [](const Value* v) { return v->tensor_type().rank(); };
  Shape shape;  // the first result's of rank 1 or more, else the 0-d one
  for (const Value* out : step.body.outputs()) {
    if (!out->is_tensor()) return std::nullopt;
    if (rank(out) > 0) {
      shape = out->tensor_type().shape;
      break;
    }
  }
  if (shape_numel(shape) == 0) return std::nullopt;
  auto scalar_or_agrees = [&](const Value* v) {
    return !v->is_tensor() || rank(v) == 0 || v->tensor_type().shape == shape;
  };
  for (const Value* out : step.body.outputs())
    if (!scalar_or_agrees(out)) return std::nullopt;
  for (const Value* in : step.body.inputs())
    if (!scalar_or_agrees(in)) return std::nullopt;
  for (const auto& n : step.body.nodes())
    for (const Value* out : n->outputs)
      if (!out->is_tensor() || !scalar_or_agrees(out)) return std::nullopt;
  // A 0-d result stored into its target by the kernel, while other elements may read it there.
  if (shape_numel(shape) > 1)
    for (const Step::Writeback& wb : step.writebacks)
      if (wb.value->is_tensor() && wb.value->tensor_type().rank() == 0) return std::nullopt;
  return shape;
}

// Where a value of the body sits: input k is {-1, k}, output o of node n is {n, o}.
using Position = std::pair<int64_t, int64_t>;
std::map<const Value*, Position> positions(const Trace& body) {
  std::map<const Value*, Position> at;
  for (size_t i = 0; i < body.inputs().size(); ++i)
    at[body.inputs()[i]] = {-1, static_cast<int64_t>(i)};
  for (size_t n = 0; n < body.nodes().size(); ++n)
    for (size_t o = 0; o < body.nodes()[n]->outputs.size(); ++o)
      at[body.nodes()[n]->outputs[o]] = {static_cast<int64_t>(n), static_cast<int64_t>(o)};
  return at;
}

// The value's type with its shape left out (rule 2 compares everything else), except whether it
// is 0-d: a 0-d input of one step is read by every element, of the other element by element.
bool same_type_but_shape(const Value* a, const Value* b) {
  if (a->is_tensor() != b->is_tensor()) return false;
  if (!a->is_tensor()) return a->type() == b->type();
  const TensorType& ta = a->tensor_type();
  const TensorType& tb = b->tensor_type();
  return ta.dtype == tb.dtype && ta.device == tb.device && (ta.rank() == 0) == (tb.rank() == 0);
}

// Rule 2.
bool same_computation(const Trace& a, const Trace& b) {
  if (a.inputs().size() != b.inputs().size() || a.nodes().size() != b.nodes().size() ||
      a.outputs().size() != b.outputs().size())
    return false;
  for (size_t i = 0; i < a.inputs().size(); ++i)
    if (!same_type_but_shape(a.inputs()[i], b.inputs()[i])) return false;
  const std::map<const Value*, Position> at_a = positions(a), at_b = positions(b);
  auto same_value = [&](const Value* va, const Value* vb) {
    auto pa = at_a.find(va), pb = at_b.find(vb);
    return pa != at_a.end() && pb != at_b.end() && pa->second == pb->second;
  };
  for (size_t n = 0; n < a.nodes().size(); ++n) {
    const Node& na = *a.nodes()[n];
    const Node& nb = *b.nodes()[n];
    if (na.op != nb.op || na.operands.size() != nb.operands.size() ||
        na.outputs.size() != nb.outputs.size())
      return false;
    for (size_t o = 0; o < na.operands.size(); ++o) {
      const Operand& oa = na.operands[o];
      const Operand& ob = nb.operands[o];
      if (oa.data.index() != ob.data.index()) return false;
      if (oa.is_constant() && !(oa.constant() == ob.constant())) return false;
      if (oa.is_value() && !same_value(oa.value(), ob.value())) return false;
      if (oa.is_value_list()) {
        if (oa.values().size() != ob.values().size()) return false;
        for (size_t k = 0; k < oa.values().size(); ++k)
          if (!same_value(oa.values()[k], ob.values()[k])) return false;
      }
    }
    for (size_t o = 0; o < na.outputs.size(); ++o)
      if (!same_type_but_shape(na.outputs[o], nb.outputs[o])) return false;
  }
  for (size_t o = 0; o < a.outputs().size(); ++o)
    if (!same_value(a.outputs()[o], b.outputs()[o])) return false;
  return true;
}

// Rule 3's memory: the trace input (an alias group's base) whose memory a value may be, or null
// for memory of the program's own. A view is its input's memory; a writeback's value may be
// stored in its target's memory and read there (PreparedKernels::stays_in_caller).
class MemoryOf {
 public:
  MemoryOf(const Trace& functional, const ExecutionPlan& plan) {
    for (const auto& [target, value] : functional.writebacks)
      stored_into_[value] = target;
    for (const Step& step : plan.steps)
      for (const Step::Writeback& wb : step.writebacks)
        stored_into_[wb.value] = wb.target;
  }
  const Value* operator()(const Value* v) const {
    while (true) {
      if (auto it = stored_into_.find(v); it != stored_into_.end()) return it->second;
      const Node* producer = v->producer();
      if (!producer) return v;  // a trace input
      if (producer->op->kind != OpKind::kView) return nullptr;
      v = producer->input(0);
    }
  }

 private:
  std::map<const Value*, const Value*> stored_into_;
};

// What the steps of a run so far make, read and write.
struct RunFootprint {
  std::set<const Value*> made, read, written;

  static RunFootprint of(const Step& step, const MemoryOf& memory) {
    RunFootprint f;
    f.made.insert(step.outputs.begin(), step.outputs.end());
    for (const Value* in : step.inputs)
      if (const Value* m = memory(in)) f.read.insert(m);
    for (const Step::Writeback& wb : step.writebacks)
      f.written.insert(wb.target);
    return f;
  }
  bool independent_of(const RunFootprint& other, const Step& step) const {
    auto meets = [](const std::set<const Value*>& a, const std::set<const Value*>& b) {
      return std::any_of(a.begin(), a.end(), [&](const Value* v) { return b.contains(v); });
    };
    for (const Value* in : step.inputs)
      if (other.made.contains(in)) return false;
    return !meets(written, other.read) && !meets(written, other.written) &&
           !meets(read, other.written);
  }
  void add(const RunFootprint& other) {
    made.insert(other.made.begin(), other.made.end());
    read.insert(other.read.begin(), other.read.end());
    written.insert(other.written.begin(), other.written.end());
  }
};

}  // namespace

int group_multi_tensor(const Trace& functional, ExecutionPlan& plan) {
  plan.multi_tensor_groups.clear();
  const MemoryOf memory(functional, plan);
  int grouped = 0;
  size_t s = 0;
  while (s < plan.steps.size()) {
    if (!uniform_shape(plan.steps[s])) {
      ++s;
      continue;
    }
    RunFootprint run = RunFootprint::of(plan.steps[s], memory);
    size_t end = s + 1;
    for (; end < plan.steps.size(); ++end) {
      const Step& next = plan.steps[end];
      if (!uniform_shape(next) || !same_computation(plan.steps[s].body, next.body)) break;
      RunFootprint f = RunFootprint::of(next, memory);
      if (!f.independent_of(run, next)) break;
      run.add(f);
    }
    if (end - s >= 2) {
      plan.multi_tensor_groups.push_back({s, end - s});
      grouped += static_cast<int>(end - s);
    }
    s = end;
  }
  return grouped;
}

}  // namespace kiln
