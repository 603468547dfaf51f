// make_gradient_program: see gradient_program.h.
#include "kiln/passes/gradient_program.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"
#include "kiln/passes/differentiate.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

// The results as differentiate sees them: the fresh value each is, or the value it is a view of.
std::vector<ResultValue> result_values(const Trace& functional, const ProgramInterface& interface,
                                       const Trace& eager) {
  std::vector<ResultValue> results;
  auto input_named = [&](const std::string& name) -> Value* {
    for (Value* v : functional.inputs())
      if (v->name() == name) return v;
    return nullptr;
  };
  for (const ReturnBinding& r : interface.returns) {
    const auto index = static_cast<size_t>(r.index);
    switch (r.kind) {
      case ReturnBinding::Kind::kValue: {
        Value* v = functional.outputs().at(index);
        results.push_back({v->is_tensor() ? v : nullptr, false, std::nullopt});
        break;
      }
      case ReturnBinding::Kind::kFreshView:
        results.push_back({functional.outputs().at(index), false,
                           FreshView{r.geometry, r.storage_numel, r.storage_geometry}});
        break;
      case ReturnBinding::Kind::kInputObject:
        results.push_back({input_named(eager.inputs().at(index)->name()), true, std::nullopt});
        break;
      case ReturnBinding::Kind::kInputView:
        results.push_back({functional.inputs().at(index), true, std::nullopt});
        break;
    }
  }
  return results;
}

// A fresh copy of a value, exact (cat of one tensor allocates; no arithmetic touches a bit).
Value* copy_of(Trace& trace, Value* v) {
  Builder b(trace);
  const Shape& shape = v->tensor_type().shape;
  Value* flat = b.call1(OpId::kReshape, {v, Constant(IntList{-1})});
  Value* copy = b.call1(OpId::kCat, {std::vector<Value*>{flat}});
  return b.call1(OpId::kReshape, {copy, Constant(IntList(shape.begin(), shape.end()))});
}

// Why a program with a view_dtype is not differentiated ("" when it has none). Eager's
// view(dtype) is not differentiable (its result never requires grad), and a write through it
// changes the base's values without a gradient: kiln has no rule that says so, and a returned
// view of an input would carry the input's gradient. Eager PyTorch runs such a program.
std::string view_dtype_refusal(const std::vector<std::unique_ptr<Node>>& nodes) {
  for (const auto& n : nodes) {
    if (n->id() == OpId::kViewDtype)
      return "kiln has no derivative rule for view_dtype" +
             (n->loc.empty() ? std::string() : " (" + n->loc.str() + ")");
    if (std::string why = view_dtype_refusal(n->subsymbols); !why.empty()) return why;
  }
  return "";
}

// Which functional inputs require grad, and the eager input whose gradient each one's is (the
// first of its group: every other member is that same tensor). Empty `refused` when fine.
struct GradInputs {
  std::vector<bool> requires_grad;        // per functional input
  std::unordered_map<int, int> eager_of;  // functional input -> eager input
  std::string refused;
};

GradInputs grad_inputs_of(size_t functional_inputs, const AliasPattern& pattern, const Trace& eager,
                          const std::vector<bool>& eager_requires_grad) {
  GradInputs out;
  out.requires_grad.assign(functional_inputs, false);
  for (size_t i = 0; i < eager.inputs().size(); ++i) {
    if (!eager_requires_grad.at(i)) continue;
    const AliasPattern::Input& in = pattern.inputs.at(i);
    const auto group = static_cast<size_t>(in.group);
    // Every member of the group must be this tensor itself: a base shared by different
    // tensors would merge their gradients.
    for (size_t j = 0; j < pattern.inputs.size(); ++j) {
      const AliasPattern::Input& other = pattern.inputs[j];
      if (j == i || other.group != in.group) continue;
      const int first = in.duplicate_of >= 0 ? in.duplicate_of : static_cast<int>(i);
      const int other_first = other.duplicate_of >= 0 ? other.duplicate_of : static_cast<int>(j);
      if (first != other_first) {
        out.refused = "argument " + eager.inputs()[i]->name() +
                      " requires grad and shares memory with another argument";
        return out;
      }
    }
    if (pattern.groups.at(group).synthetic &&
        !is_non_overlapping_and_dense(in.geometry.sizes, in.geometry.strides)) {
      out.refused = "argument " + eager.inputs()[i]->name() +
                    " requires grad and overlaps itself (an expanded tensor)";
      return out;
    }
    out.requires_grad[group] = true;
    out.eager_of.try_emplace(static_cast<int>(group), static_cast<int>(i));
  }
  return out;
}

// The saved values as results: inputs are the caller's own tensors (a copy where the program
// writes the input: the backward needs it as it was), intermediates fresh results after the
// function's own (or the function's own result that already is that value).
std::string connect_saved(Trace& f, ProgramInterface& interface, const Trace& eager,
                          const std::vector<Value*>& saved, size_t own_outputs,
                          std::vector<int>& saved_results) {
  std::unordered_map<std::string, int> eager_input;
  for (size_t i = 0; i < eager.inputs().size(); ++i)
    eager_input[eager.inputs()[i]->name()] = static_cast<int>(i);
  std::unordered_set<Value*> written;
  for (const auto& [input, value] : f.writebacks)
    written.insert(input);
  for (Value* v : saved) {
    bool is_input = std::find(f.inputs().begin(), f.inputs().end(), v) != f.inputs().end();
    if (is_input && (written.contains(v) || !eager_input.contains(v->name()))) {
      // Written, or a synthetic base the caller has no tensor for: the forward returns a copy.
      v = copy_of(f, v);
      std::vector<Value*> outputs = f.outputs();
      outputs.push_back(v);
      f.set_outputs(std::move(outputs));
      is_input = false;
    }
    ReturnBinding r;
    if (is_input) {
      r.kind = ReturnBinding::Kind::kInputObject;
      r.index = eager_input.at(v->name());
    } else {
      auto at = std::find(f.outputs().begin(), f.outputs().end(), v);
      if (at == f.outputs().end()) return "internal: differentiate did not return " + v->name();
      r.index = static_cast<int>(at - f.outputs().begin());
      auto same = std::find_if(interface.returns.begin(), interface.returns.end(),
                               [&](const ReturnBinding& b) {
                                 return b.kind == ReturnBinding::Kind::kValue && b.index == r.index;
                               });
      if (static_cast<size_t>(r.index) < own_outputs && same != interface.returns.end()) {
        saved_results.push_back(static_cast<int>(same - interface.returns.begin()));
        continue;
      }
      if (v->is_tensor()) {
        r.geometry = contiguous_geometry(v->tensor_type().shape);
        r.storage_numel = v->tensor_type().numel();
        r.any_layout = true;  // only the backward reads it (compiled for the layout it gets)
      }
    }
    saved_results.push_back(static_cast<int>(interface.returns.size()));
    interface.returns.push_back(r);
  }
  return "";
}

// An argument that is a view of its synthetic base gets the base's gradient as it lies there.
void view_base_gradients(Trace& backward, const Gradient& g, const AliasPattern& pattern,
                         const GradInputs& grads) {
  Builder b(backward);
  std::vector<Value*> outputs = backward.outputs();
  for (size_t k = 0; k < g.grad_inputs.size(); ++k) {
    const int input = g.grad_inputs[k];
    if (!pattern.groups.at(static_cast<size_t>(input)).synthetic) continue;
    const Geometry& v = pattern.inputs.at(static_cast<size_t>(grads.eager_of.at(input))).geometry;
    auto ints = [](const std::vector<int64_t>& x) { return Constant(IntList(x.begin(), x.end())); };
    outputs[k] =
        b.call1(OpId::kAsStrided, {outputs[k], ints(v.sizes), ints(v.strides), Operand(v.offset)});
  }
  backward.set_outputs(std::move(outputs));
}

}  // namespace

GradientProgram make_gradient_program(Trace& f, ProgramInterface& interface,
                                      const AliasPattern& pattern, const Trace& eager,
                                      const std::vector<bool>& requires_grad) {
  GradientProgram out;
  out.own_results = static_cast<int>(interface.returns.size());
  for (size_t i = 0; i < interface.returns.size(); ++i) {
    const ReturnBinding::Kind kind = interface.returns[i].kind;
    if (kind == ReturnBinding::Kind::kInputObject || kind == ReturnBinding::Kind::kInputView)
      out.caller_results.push_back(static_cast<int>(i));
  }
  out.refused = view_dtype_refusal(eager.nodes());
  if (!out.refused.empty()) return out;
  GradInputs grads = grad_inputs_of(f.inputs().size(), pattern, eager, requires_grad);
  if (!grads.refused.empty()) {
    out.refused = grads.refused;
    return out;
  }
  const size_t own_outputs = f.outputs().size();
  std::unordered_set<std::string> eager_names;
  for (Value* e : eager.inputs())
    eager_names.insert(e->name());
  std::vector<bool> caller_has;  // an input that is its own base keeps its eager name
  for (Value* v : f.inputs())
    caller_has.push_back(eager_names.contains(v->name()));
  Gradient g =
      differentiate(f, grads.requires_grad, result_values(f, interface, eager), caller_has);
  if (!g.refused.empty()) {
    out.refused = g.refused;
    return out;
  }
  out.refused = connect_saved(f, interface, eager, g.saved, own_outputs, out.saved_results);
  if (!out.refused.empty()) return out;
  view_base_gradients(g.backward, g, pattern, grads);
  out.differentiable_results = g.differentiable_results;
  for (int i : g.grad_inputs)
    out.grad_inputs.push_back(grads.eager_of.at(i));
  for (Value* v : g.backward.inputs())
    out.backward_inputs.push_back(v->name());
  verify_trace(g.backward);
  out.backward = print_trace(g.backward);
  return out;
}

}  // namespace kiln
