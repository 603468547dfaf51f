// save_or_recompute: see save_or_recompute.h.
#include "kiln/passes/save_or_recompute.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <unordered_map>

#include "kiln/ir/dtype.h"

namespace kiln {

namespace {

constexpr int64_t kInfinite = std::numeric_limits<int64_t>::max() / 4;

// Maximum flow by Dinic's blocking flows: the graphs are a few nodes per trace value.
class FlowGraph {
 public:
  explicit FlowGraph(size_t nodes) : edges_of_(nodes) {}

  void add_edge(size_t from, size_t to, int64_t capacity) {
    edges_of_[from].push_back(edges_.size());
    edges_.push_back({to, capacity});
    edges_of_[to].push_back(edges_.size());
    edges_.push_back({from, 0});  // the residual edge: an edge e's reverse is e ^ 1
  }

  void max_flow(size_t source, size_t sink) {
    while (levels_from(source, sink)) {
      next_.assign(edges_of_.size(), 0);
      while (push(source, sink, kInfinite) > 0) {
      }
    }
  }

  // The nodes from which the sink is reachable in the residual graph: the sink's side of the
  // minimum cut nearest the sink.
  std::vector<bool> reaching(size_t sink) const {
    std::vector<bool> seen(edges_of_.size(), false);
    std::deque<size_t> queue{sink};
    seen[sink] = true;
    while (!queue.empty()) {
      size_t y = queue.front();
      queue.pop_front();
      for (size_t e : edges_of_[y]) {
        size_t x = edges_[e].to;
        if (!seen[x] && edges_[e ^ 1].residual > 0) {  // x -> y still has room
          seen[x] = true;
          queue.push_back(x);
        }
      }
    }
    return seen;
  }

 private:
  struct Edge {
    size_t to;
    int64_t residual;
  };

  bool levels_from(size_t source, size_t sink) {
    level_.assign(edges_of_.size(), -1);
    level_[source] = 0;
    std::deque<size_t> queue{source};
    while (!queue.empty()) {
      size_t x = queue.front();
      queue.pop_front();
      for (size_t e : edges_of_[x]) {
        if (edges_[e].residual > 0 && level_[edges_[e].to] < 0) {
          level_[edges_[e].to] = level_[x] + 1;
          queue.push_back(edges_[e].to);
        }
      }
    }
    return level_[sink] >= 0;
  }

  int64_t push(size_t x, size_t sink, int64_t limit) {
    if (x == sink) return limit;
    for (size_t& i = next_[x]; i < edges_of_[x].size(); ++i) {
      size_t e = edges_of_[x][i];
      size_t y = edges_[e].to;
      if (edges_[e].residual <= 0 || level_[y] != level_[x] + 1) continue;
      int64_t pushed = push(y, sink, std::min(limit, edges_[e].residual));
      if (pushed > 0) {
        edges_[e].residual -= pushed;
        edges_[e ^ 1].residual += pushed;
        return pushed;
      }
    }
    return 0;
  }

  std::vector<std::vector<size_t>> edges_of_;
  std::vector<Edge> edges_;
  std::vector<int> level_;
  std::vector<size_t> next_;
};

// as_strided indexes its operand's storage, which a saved tensor need not lay out as eager's
// (a padded product's result): it is saved, not recomputed. A tensor made from numbers alone (an
// arange of positions, a full tensor) reads nothing: recomputing it is free, and an index the
// backward draws from an arange is known in range there.
bool is_recomputable(const Node& n) {
  if (n.outputs.size() != 1 || n.id() == OpId::kAsStrided) return false;
  switch (n.id()) {
    case OpId::kArange:
    case OpId::kFull:
    case OpId::kZeros:
    case OpId::kOnes:
      return true;
    default:
      return n.op->kind == OpKind::kElementwise || n.op->kind == OpKind::kView;
  }
}

// The tensors opaque ops read, and through views the values those views are of, each with
// whether it is read by an eager step whose autograd graph kiln keeps for the backward: that
// graph's vjp runs only on the tensors the step read, so a recomputed operand would run the op
// again.
std::unordered_map<Value*, bool> opaque_operands(const Trace& forward) {
  std::unordered_map<Value*, bool> out;
  for (const auto& n : forward.nodes()) {
    if (n->op->kind != OpKind::kOpaque) continue;
    const bool kept_graph = n->id() == OpId::kEagerCall && n->arg("vjp").as_int() >= 0;
    n->for_each_value_operand([&](Value* u) {
      for (;; u = u->producer()->input(0)) {
        out[u] = out[u] || kept_graph;
        if (!u->producer() || u->producer()->op->kind != OpKind::kView) break;
      }
    });
  }
  return out;
}

// The values some op reads after an opaque op that itself depends on them, with each one's base
// through views: no kernel spans an opaque step, so the forward stores them whatever is saved.
//   x1 = add(x0, d0); h = layer_norm(x1); d1 = matmul(h, w); x2 = add(x1, d1)
//   x1 is live across the matmul: a residual stream is stored between its layers anyway
std::unordered_set<const Value*> live_across_opaque_ops(const Trace& forward) {
  using Bits = std::vector<uint64_t>;
  size_t opaque_count = 0;
  for (const auto& n : forward.nodes())
    opaque_count += n->op->kind == OpKind::kOpaque;
  const size_t words = opaque_count / 64 + 1;
  auto join = [](Bits& into, const Bits& from) {
    for (size_t w = 0; w < into.size(); ++w)
      into[w] |= from[w];
  };
  // after[v]: the opaque ops v depends on; before[v]: the opaque ops that depend on v.
  std::unordered_map<const Value*, Bits> after, before;
  auto bits = [&](std::unordered_map<const Value*, Bits>& of, const Value* v) -> Bits& {
    return of.try_emplace(v, words, 0).first->second;
  };
  std::vector<size_t> opaque_index(forward.nodes().size(), SIZE_MAX);
  for (size_t i = 0, next = 0; i < forward.nodes().size(); ++i) {
    const Node& n = *forward.nodes()[i];
    Bits depends(words, 0);
    n.for_each_value_operand([&](const Value* u) { join(depends, bits(after, u)); });
    if (n.op->kind == OpKind::kOpaque) {
      opaque_index[i] = next++;
      depends[opaque_index[i] / 64] |= uint64_t{1} << (opaque_index[i] % 64);
    }
    for (const Value* v : n.outputs)
      bits(after, v) = depends;
  }
  for (size_t i = forward.nodes().size(); i-- > 0;) {
    const Node& n = *forward.nodes()[i];
    Bits dependents(words, 0);
    for (const Value* v : n.outputs)
      join(dependents, bits(before, v));
    if (opaque_index[i] != SIZE_MAX)
      dependents[opaque_index[i] / 64] |= uint64_t{1} << (opaque_index[i] % 64);
    n.for_each_value_operand([&](const Value* u) { join(bits(before, u), dependents); });
  }
  std::unordered_set<const Value*> out;
  for (const auto& n : forward.nodes()) {
    if (n->op->kind == OpKind::kOpaque) continue;  // its operands are stored for it anyway
    Bits preceding(words, 0);
    n->for_each_value_operand([&](const Value* u) { join(preceding, bits(after, u)); });
    n->for_each_value_operand([&](const Value* u) {
      const Bits& dependents = bits(before, u);
      bool across = false;
      for (size_t w = 0; w < words && !across; ++w)
        across = (preceding[w] & dependents[w]) != 0;
      if (!across) return;
      while (u->producer() && u->producer()->op->kind == OpKind::kView)
        u = u->producer()->input(0);
      out.insert(u);
    });
  }
  return out;
}

// Values the forward writes to memory whatever is saved: reading them in the backward is the
// only cost of saving them.
std::unordered_set<const Value*> materialized(const Trace& forward,
                                              const std::vector<bool>& caller_has) {
  std::unordered_set<const Value*> written;
  for (const auto& [input, value] : forward.writebacks)
    written.insert(input);
  std::unordered_set<const Value*> out(forward.outputs().begin(), forward.outputs().end());
  for (size_t i = 0; i < forward.inputs().size(); ++i) {
    const Value* v = forward.inputs()[i];
    if (!written.contains(v) && (caller_has.empty() || caller_has[i])) out.insert(v);
  }
  out.merge(live_across_opaque_ops(forward));
  for (const auto& n : forward.nodes()) {
    if (n->op->kind != OpKind::kOpaque) continue;
    out.insert(n->outputs.begin(), n->outputs.end());
    // What an opaque op reads through a view is its base's memory: the view itself is not
    // written anywhere (saving it would return a view, or a copy, of the base).
    n->for_each_value_operand([&](const Value* u) {
      while (u->producer() && u->producer()->op->kind == OpKind::kView)
        u = u->producer()->input(0);
      out.insert(u);
    });
  }
  return out;
}

int64_t save_cost(const Value* v, bool is_materialized) {
  if (!v->is_tensor()) return 1;
  const TensorType& t = v->tensor_type();
  int64_t bytes = std::max<int64_t>(1, t.numel() * dtype_size(t.dtype));
  return is_materialized ? bytes : 2 * bytes;
}

}  // namespace

std::unordered_set<Value*> values_to_recompute(const Trace& forward,
                                               const std::vector<Value*>& needed,
                                               const std::vector<bool>& caller_has) {
  // Node numbering: the source, the sink, then each value's in and out.
  std::unordered_map<const Value*, size_t> index;
  std::vector<Value*> values;
  auto number = [&](Value* v) {
    if (index.emplace(v, values.size()).second) values.push_back(v);
  };
  for (Value* v : forward.inputs())
    number(v);
  for (const auto& n : forward.nodes())
    for (Value* v : n->outputs)
      number(v);
  constexpr size_t kSource = 0, kSink = 1;
  auto in = [&](const Value* v) { return 2 + 2 * index.at(v); };
  auto out = [&](const Value* v) { return 3 + 2 * index.at(v); };

  FlowGraph graph(2 + 2 * values.size());
  const std::unordered_set<const Value*> anyway = materialized(forward, caller_has);
  for (Value* v : values)
    graph.add_edge(in(v), out(v), save_cost(v, anyway.contains(v)));
  for (Value* v : forward.inputs())
    graph.add_edge(kSource, in(v), kInfinite);
  std::vector<Value*> candidates;
  for (const auto& n : forward.nodes()) {
    if (!is_recomputable(*n)) {
      for (Value* v : n->outputs)
        graph.add_edge(kSource, in(v), kInfinite);
      continue;
    }
    Value* v = n->outputs[0];
    candidates.push_back(v);
    n->for_each_value_operand([&](Value* u) {
      if (index.contains(u)) graph.add_edge(out(u), in(v), kInfinite);
    });
  }
  for (Value* v : needed)
    if (index.contains(v)) graph.add_edge(out(v), kSink, kInfinite);
  // A needed operand of an opaque op (a matmul's input, which its gradient's products read
  // again) is stored by the backward if it is recomputed there. That store is priced one byte
  // under the operand's bytes: recomputing it wins only where everything it is computed from is
  // saved anyway, so the memory held between the passes shrinks by its bytes for one store and
  // read more in the backward (AOTAutograd's partitioner recomputes such a copy too); where
  // recomputing it needs one byte more saved, it is saved. An eager step's operand is priced
  // one byte over: its kept graph holds it anyway, and only the tensor it read lets the vjp use
  // that graph.
  //   ln = layer_norm(x); y = ln @ w   x, mean, rstd saved for the norm's gradient anyway:
  //   ln is recomputed from them and stored for the weight gradient's product
  std::unordered_set<Value*> needed_through_views;
  for (Value* v : needed)
    for (Value* u = v;; u = u->producer()->input(0)) {
      needed_through_views.insert(u);
      if (!u->producer() || u->producer()->op->kind != OpKind::kView) break;
    }
  for (const auto& [v, kept_graph] : opaque_operands(forward)) {
    const bool is_view = v->producer() && v->producer()->op->kind == OpKind::kView;
    if (index.contains(v) && !is_view && needed_through_views.contains(v))
      graph.add_edge(kSource, in(v), save_cost(v, true) + (kept_graph ? 1 : -1));
  }

  graph.max_flow(kSource, kSink);
  const std::vector<bool> sink_side = graph.reaching(kSink);
  std::unordered_set<Value*> recompute;
  for (Value* v : candidates)
    if (sink_side[in(v)]) recompute.insert(v);
  return recompute;
}

}  // namespace kiln
