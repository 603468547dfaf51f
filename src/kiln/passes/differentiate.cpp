// differentiate: see differentiate.h.
#include "kiln/passes/differentiate.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "kiln/analysis/integer_range.h"
#include "kiln/ir/derivative_rules.h"
#include "kiln/ir/dtype.h"
#include "kiln/passes/save_or_recompute.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

bool is_floating_tensor(const Value* v) {
  return v->is_tensor() && is_floating(v->tensor_type().dtype);
}

// A value's type as a backward input: its layout is the caller's business (the saved tensor's
// or the incoming gradient's strides, known per call).
Type without_layout(const Value* v) {
  if (!v->is_tensor()) return v->type();
  TensorType t = v->tensor_type();
  t.layout.reset();
  return t;
}

std::string where(const Node& n) {
  return n.loc.empty() ? "" : " (" + n.loc.str() + ")";
}

// The forward values every element of which an index op of `forward` uses as an index, each with
// the range the op requires of it: [0, size) of the dim it indexes, [-size, size) before a
// wrap_index by that size, the same through views that keep every element (a reshape of the
// token ids to the embedding's one dim). A forward program that completes has checked them (an
// index out of range raises before any step writes), so the backward reads them saved in that
// range (Value::known_range) and does not check its index ops on them again (on CUDA each
// check reads the index back to the host, a synchronization: an embedding's gradient made one
// a training step).
std::unordered_map<const Value*, std::pair<int64_t, int64_t>> checked_indices(
    const Trace& forward) {
  std::unordered_map<const Value*, std::pair<int64_t, int64_t>> checked;
  auto note = [&](const Value* v, int64_t lo, int64_t hi) {
    auto [it, fresh] = checked.try_emplace(v, lo, hi);
    if (!fresh) it->second = {std::max(lo, it->second.first), std::min(hi, it->second.second)};
  };
  for (const auto& n : forward.nodes()) {
    if (n->op->kind != OpKind::kIndex || n->id() == OpId::kWrapIndex) continue;
    const TensorType& self = n->input(0)->tensor_type();
    const int64_t size =
        self.rank() == 0
            ? 1
            : self.shape[static_cast<size_t>(wrap_dim(n->arg(1).as_int(), self.rank()))];
    const Value* v = n->input(2);
    int64_t lo = 0;
    while (true) {
      note(v, lo, size - 1);
      const Node* p = v->producer();
      if (!p || p->outputs.size() != 1) break;
      const OpId id = p->id();
      if (id == OpId::kWrapIndex && lo == 0 && p->arg(1).as_int() == size) {
        lo = -size;
      } else if (!(id == OpId::kView || id == OpId::kReshape || id == OpId::kPermute ||
                   id == OpId::kTranspose || id == OpId::kT || id == OpId::kUnsqueeze ||
                   id == OpId::kSqueeze || id == OpId::kFlatten || id == OpId::kUnflatten ||
                   id == OpId::kDetach || id == OpId::kAlias)) {
        break;
      }
      v = p->input(0);
    }
  }
  return checked;
}

class Differentiator final : public GradContext {
 public:
  // `recompute`: forward values the backward computes again from other saved values instead of
  // reading them saved (save_or_recompute.h).
  Differentiator(Trace& forward, Gradient& out, std::unordered_set<Value*> recompute = {})
      : GradContext(builder_),
        forward_(forward),
        out_(out),
        builder_(out.backward),
        recompute_(std::move(recompute)),
        checked_(checked_indices(forward)) {
    // An index the forward checked is saved, where the backward reads it, not computed again:
    // saved, it is declared in range; recomputed (a loss's labels masked where ignored), the
    // backward would check it again. A view of a checked value stays recomputed (the view of
    // the saved value is in range too: a reshape of the token ids), as does an index known in
    // range whatever the inputs hold (an arange of positions).
    for (const auto& [v, range] : checked_) {
      const Node* p = v->producer();
      const std::optional<IntegerRange> known = integer_range(v);
      const bool view_of_checked =
          p && p->op->kind == OpKind::kView && checked_.contains(p->input(0));
      if (!view_of_checked && !(known && known->lo >= range.first && known->hi <= range.second))
        recompute_.erase(const_cast<Value*>(v));
    }
    out.backward.name = "backward";
    out.backward.constructed_by = "differentiate";
  }

  // The forward sweep: which values depend on an input that requires grad. Empty when some
  // such value meets an op without a rule (`refused` says which).
  bool mark(const std::vector<bool>& requires_grad) {
    KILN_ASSERT(requires_grad.size() == forward_.inputs().size())
        << "differentiate: one requires_grad flag per trace input";
    for (size_t i = 0; i < requires_grad.size(); ++i)
      if (requires_grad[i] && is_floating_tensor(forward_.inputs()[i]))
        requires_.insert(forward_.inputs()[i]);
    for (const auto& n : forward_.nodes()) {
      bool depends = false;
      n->for_each_value_operand([&](Value* v) { depends = depends || requires_.contains(v); });
      if (!depends || is_non_differentiable(n->id())) continue;
      if (!find_derivative_rule(n->id())) {
        out_.refused = "kiln has no derivative rule for " + n->op->name + where(*n);
        return false;
      }
      if (n->id() == OpId::kEagerCall) {
        // Only the results PyTorch's autograd tracks carry gradients (a batch norm's updated
        // running statistics do not).
        if (n->arg("vjp").as_int() < 0) {
          out_.refused = "an op PyTorch runs as an eager step" + where(*n) +
                         " has no gradient kiln can replay (it draws random numbers, or was "
                         "traced with grad mode off)";
          return false;
        }
        for (int64_t i : n->arg("vjp_outputs").as_ints())
          requires_.insert(n->outputs.at(static_cast<size_t>(i)));
        continue;
      }
      for (Value* o : n->outputs)
        if (is_floating_tensor(o)) requires_.insert(o);
    }
    return true;
  }

  bool needs(Value* v) const override { return requires_.contains(v); }

  // The gradient of a view of `value`'s storage as a gradient of `value`: scattered into the
  // storage in storage order (where as_strided indexes), then read as `value` lies there.
  Value* through_storage(Value* value, const FreshView& v, Value* g) {
    auto ints = [](const std::vector<int64_t>& x) { return Constant(IntList(x.begin(), x.end())); };
    Value* zeros = builder_.call1(OpId::kZeros, {Constant(IntList{v.storage_numel})},
                                  {{"dtype", Constant(g->tensor_type().dtype)},
                                   {"device", Constant(value->tensor_type().device)}});
    Value* flat = builder_.call1(OpId::kAsStridedScatter, {zeros, g, ints(v.view.sizes),
                                                           ints(v.view.strides), v.view.offset});
    return builder_.call1(OpId::kAsStrided,
                          {flat, ints(v.storage.sizes), ints(v.storage.strides), v.storage.offset});
  }

  Value* forward(Value* v) override {
    auto found = saved_.find(v);
    if (found != saved_.end()) return found->second;
    Value* got;
    if (recompute_.contains(v)) {
      // The producer again, on its operands as the backward has them.
      const Node& p = *v->producer();
      std::vector<Operand> operands;
      for (const Operand& o : p.operands)
        operands.push_back(o.is_value() ? Operand(forward(o.value())) : o);
      // A view's layout requirement was eager's, met by the forward's tensor; the saved tensor
      // the backward reads it from has whatever strides the forward left (a padded product's
      // result), so the recomputation is a reshape, which copies where no view expresses it.
      const OpId id = p.id() == OpId::kView ? OpId::kReshape : p.id();
      got = builder_.call_bound(id, std::move(operands), p.loc).at(0);
    } else {
      got = builder_.add_input("s_" + v->name(), without_layout(v));
      if (auto it = checked_.find(v); it != checked_.end()) got->set_known_range(it->second);
      out_.saved.push_back(v);
    }
    saved_.emplace(v, got);
    return got;
  }

  void accumulate(Value* v, Value* g) override {
    if (!needs(v)) return;
    const TensorType& t = v->tensor_type();
    if (g->tensor_type().shape != t.shape) g = grad::sum_to(builder_, g, t.shape);
    g = grad::cast_to(builder_, g, t.dtype);
    auto [it, fresh] = grads_.try_emplace(v, g);
    if (!fresh) it->second = builder_.call1(OpId::kAdd, {it->second, g});
  }

  // A write into the caller's memory changes that tensor's place in eager's graph (an in-place
  // op rebases its history); one autograd node cannot, so such a program is refused.
  bool check_writebacks() {
    for (const auto& [input, value] : forward_.writebacks) {
      if (needs(input) || needs(value)) {
        out_.refused =
            "the program writes into argument " + input->name() +
            (needs(input) ? ", which requires grad" : ", and what it writes requires grad");
        return false;
      }
    }
    return true;
  }

  // The reverse sweep, from the gradients of the results.
  bool sweep(const std::vector<ResultValue>& results) {
    for (size_t i = 0; i < results.size(); ++i) {
      const ResultValue& r = results[i];
      if (!r.value || !needs(r.value)) continue;
      if (r.is_view) {
        out_.refused =
            "a result that requires grad is a view of an argument; kiln differentiates the "
            "results the program makes";
        return false;
      }
      out_.differentiable_results.push_back(static_cast<int>(i));
    }
    // The gradient inputs come first: saved values are added as rules ask for them.
    std::vector<Value*> incoming;
    for (int i : out_.differentiable_results) {
      const ResultValue& r = results[static_cast<size_t>(i)];
      Type type = without_layout(r.value);
      if (r.fresh_view) std::get<TensorType>(type).shape = r.fresh_view->view.sizes;
      incoming.push_back(builder_.add_input("g" + std::to_string(i), type));
    }
    for (size_t k = 0; k < incoming.size(); ++k) {
      const ResultValue& r = results[static_cast<size_t>(out_.differentiable_results[k])];
      accumulate(r.value,
                 r.fresh_view ? through_storage(r.value, *r.fresh_view, incoming[k]) : incoming[k]);
    }
    const auto& nodes = forward_.nodes();
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
      const Node& n = **it;
      std::vector<Value*> grads;
      bool any = false;
      for (Value* o : n.outputs) {
        auto g = grads_.find(o);
        grads.push_back(g == grads_.end() ? nullptr : g->second);
        any = any || grads.back();
      }
      if (!any || is_non_differentiable(n.id())) continue;
      try {
        find_derivative_rule(n.id())(*this, n, grads);
      } catch (const NoDerivative& e) {
        out_.refused = e.what() + where(n);
        return false;
      }
    }
    std::vector<Value*> outputs;
    for (size_t i = 0; i < forward_.inputs().size(); ++i) {
      auto g = grads_.find(forward_.inputs()[i]);
      if (g == grads_.end()) continue;
      outputs.push_back(g->second);
      out_.grad_inputs.push_back(static_cast<int>(i));
    }
    builder_.set_outputs(outputs);
    return true;
  }

 private:
  Trace& forward_;
  Gradient& out_;
  Builder builder_;
  std::unordered_set<Value*> requires_;
  std::unordered_map<Value*, Value*> grads_;  // forward value -> its gradient so far
  std::unordered_map<Value*, Value*> saved_;  // forward value -> backward input or recomputation
  std::unordered_set<Value*> recompute_;
  std::unordered_map<const Value*, std::pair<int64_t, int64_t>> checked_;  // checked_indices
};

}  // namespace

Gradient differentiate(Trace& forward, const std::vector<bool>& requires_grad,
                       const std::vector<ResultValue>& results,
                       const std::vector<bool>& caller_has) {
  // A first sweep finds what the rules read; the cut of save_or_recompute decides which of
  // those the second sweep saves and which it computes again from saved values.
  Gradient probe;
  {
    Differentiator d(forward, probe);
    if (!d.mark(requires_grad) || !d.check_writebacks() || !d.sweep(results)) {
      probe.saved.clear();
      return probe;
    }
  }
  Gradient out;
  Differentiator d(forward, out, values_to_recompute(forward, probe.saved, caller_has));
  KILN_ASSERT(d.mark(requires_grad) && d.check_writebacks() && d.sweep(results))
      << "differentiate: the second sweep refused what the first did not";
  // The forward returns the saved intermediates after its own outputs (inputs the caller has).
  std::vector<Value*> outputs = forward.outputs();
  const std::unordered_set<Value*> inputs(forward.inputs().begin(), forward.inputs().end());
  for (Value* v : out.saved)
    if (!inputs.contains(v) && std::find(outputs.begin(), outputs.end(), v) == outputs.end())
      outputs.push_back(v);
  forward.set_outputs(std::move(outputs));
  return out;
}

}  // namespace kiln
