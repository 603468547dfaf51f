#include "kiln/passes/fuse.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "kiln/analysis/integer_range.h"
#include "kiln/ir/type_rules.h"
#include "kiln/passes/fuser.h"
#include "kiln/support/error.h"

namespace kiln {

namespace fusion {

bool is_view(const Node& n) {
  return n.op->kind == OpKind::kView;
}
bool is_opaque(const Node& n) {
  return n.op->kind == OpKind::kOpaque;
}

Shape keep_shape(const Domain& d) {
  Shape s = d.full;
  for (int64_t r : d.reduced)
    s[static_cast<size_t>(r)] = 1;
  return s;
}
Shape drop_shape(const Domain& d) {
  Shape s;
  for (size_t i = 0; i < d.full.size(); ++i)
    if (std::find(d.reduced.begin(), d.reduced.end(), static_cast<int64_t>(i)) == d.reduced.end())
      s.push_back(d.full[i]);
  return s;
}

// Whether a reduction's reduced dims are the last dims of its input (dims of size 1 aside): the
// rows of a nest over the input's shape.
bool reduces_trailing_dims(const Domain& d) {
  if (d.reduced.empty()) return false;
  for (size_t i = static_cast<size_t>(d.reduced.front()); i < d.full.size(); ++i)
    if (d.full[i] != 1 &&
        std::find(d.reduced.begin(), d.reduced.end(), static_cast<int64_t>(i)) == d.reduced.end())
      return false;
  return true;
}

Domain node_domain(const Node& n) {
  Domain d;
  d.opaque = is_opaque(n);
  for (const Value* v : n.outputs)
    if (v->is_tensor() && v->tensor_type().device.kind == Device::Kind::kCuda) d.cuda = true;
  if (n.op->kind == OpKind::kReduction) {
    const TensorType& in = n.input(0)->tensor_type();
    d.full = in.shape;
    std::optional<IntList> dims = n.arg(1).as_optional_ints();
    d.reduced = reduction_dims(dims, in.rank());
    if (d.reduced.empty() && in.rank() > 0) {  // a reduction of everything still reduces
      d.reduced.resize(static_cast<size_t>(in.rank()));
      std::iota(d.reduced.begin(), d.reduced.end(), 0);
    }
  } else if (!n.outputs.empty()) {
    d.full = n.outputs[0]->tensor_type().shape;
  }
  return d;
}

// The merged domain, if `a` and `b` can share one loop nest.
std::optional<Domain> merge_domains(const Domain& a, const Domain& b) {
  if (a.opaque || b.opaque) return std::nullopt;
  if (a.full == b.full) {
    if (!a.reduced.empty() && !b.reduced.empty() && a.reduced != b.reduced) return std::nullopt;
    return a.reduced.empty() ? b : a;
  }
  // Work over a reduction's reduced shape runs once per reduced row, inside its loop nest.
  auto under = [](const Domain& outer, const Domain& inner) {
    return !outer.reduced.empty() && inner.reduced.empty() &&
           (inner.full == keep_shape(outer) || inner.full == drop_shape(outer));
  };
  if (under(a, b)) return a;
  if (under(b, a)) return b;
  // A single element (a constant, a full reduction's result) is a broadcast load anywhere.
  if (shape_numel(b.full) == 1 && b.reduced.empty()) return a;
  if (shape_numel(a.full) == 1 && a.reduced.empty()) return b;
  return std::nullopt;
}

Fuser::Fuser(const Trace& t, bool inline_across_domains)
    : t_(t), inline_across_domains_(inline_across_domains) {
  for (size_t i = 0; i < t.nodes().size(); ++i) {
    const Node& n = *t.nodes()[i];
    for (const Value* o : n.outputs)
      producer_[o] = static_cast<int>(i);
  }
  const size_t n = t.nodes().size();
  deps_.resize(n);
  users_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    deps_[i] = find_compute_deps(*t.nodes()[i]);
    if (!is_view(*t.nodes()[i]))
      for (int d : deps_[i])
        users_[static_cast<size_t>(d)].push_back(static_cast<int>(i));
  }
}
ExecutionPlan Fuser::run() {
  const auto& nodes = t_.nodes();
  size_t n = nodes.size();
  parent_.resize(n);
  std::iota(parent_.begin(), parent_.end(), 0);
  members_.resize(n);
  last_member_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (!is_view(*nodes[i])) members_[i] = {static_cast<int>(i)};
    last_member_[i] = static_cast<int>(i);
  }
  domain_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (!is_view(*nodes[i])) domain_[i] = node_domain(*nodes[i]);
  }
  find_checked_indices();
  needed_ = needed_nodes();
  // Greedy: each compute node joins the region of a producer when the loop nests agree and
  // no path leaves that region and comes back. Until nothing changes: a producer that could
  // not be inlined while two regions read it can be once they have merged.
  //   alpha = rsqrt(var + eps) * w  [1, C, 1, 1]   y = x * alpha + beta: alpha and beta are
  //   read by the product and the sum, one region only after the first pass.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (is_view(*nodes[i]) || is_opaque(*nodes[i])) continue;
      for (int dep : compute_deps(i)) {
        int a = find(static_cast<int>(i)), b = find(dep);
        if (a == b || is_opaque(*nodes[static_cast<size_t>(b)])) continue;
        std::optional<Domain> merged =
            merge_domains(domain_[static_cast<size_t>(b)], domain_[static_cast<size_t>(a)]);
        if (!merged && inline_across_domains_ && inlinable(b, a))
          merged = domain_[static_cast<size_t>(a)];
        if (!merged || keeps_apart(a, b) || creates_cycle(b, a) || rereads_reduction(b, a, dep))
          continue;
        join(b, a, *merged);
        changed = true;
      }
    }
  }
  recompute_in_readers();
  merge_sibling_reductions();
  return build();
}

// An index op's index is checked before the kernel runs (codegen's IndexCheck), on a kernel
// input: one the trace computes (a where that masks a loss's ignored targets) must come from
// a region that runs before, not from the op's own. Looked at through views and a wrap_index,
// as the check looks at it; an index known to be in range (arange's positions) needs no check
// and stays where it is.
//   st = where(ne(t, -100), t, 0); picked = gather(logp, 1, st): two regions, not one that
//   cannot be lowered (it ran as PyTorch ops).
void Fuser::find_checked_indices() {
  const auto& nodes = t_.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = *nodes[i];
    if (n.op->kind != OpKind::kIndex || n.id() == OpId::kWrapIndex) continue;
    const Value* index = n.input(2);
    const TensorType& self = n.input(0)->tensor_type();
    const int64_t size =
        self.rank() == 0
            ? 1
            : self.shape[static_cast<size_t>(wrap_dim(n.arg(1).as_int(), self.rank()))];
    std::optional<IntegerRange> known = integer_range(index);
    if (known && known->lo >= 0 && known->hi < size) continue;
    const Value* checked = index;
    bool wrapped = false;  // (one wrap_index by the size indexed, as codegen's index_check)
    for (;;) {
      auto it = producer_.find(checked);
      if (it == producer_.end()) break;  // a trace input: checked as it is
      const Node& p = *nodes[static_cast<size_t>(it->second)];
      const bool wraps = p.id() == OpId::kWrapIndex && !wrapped && p.arg(1).as_int() == size;
      if ((is_view(p) && p.outputs.size() == 1) || wraps) {
        wrapped = wrapped || wraps;
        checked = p.input(0);
        continue;
      }
      apart_.emplace_back(static_cast<int>(i), it->second);
      break;
    }
  }
}

// Whether merging the regions rooted at `a` and `b` would compute a checked index in the
// region of the op that reads it.
// Whether region `a`, over the full shape of region `b`'s reduction and reducing nothing, reads
// from `b` (node `dep`'s value) a value at the reduced shape, on a CUDA device, where the
// reduction is not over the last dims. A CUDA nest over the full shape computes a reduction once
// a row of its last dims (the row nest: a normalization's statistics in the row's threads);
// one over other dims (a batch norm's statistics over (0, 2, 3), a softmax over dim 0) would
// run again for every row that reads it: at 2^26 elements 2.4M rows of 28, each summing 1M
// elements (the bench ran for minutes). The reader keeps a region of its own. (On the CPU the
// loop order takes such a statistic out of the loops it does not read: cpu_loop_order.)
bool Fuser::rereads_reduction(int b, int a, int dep) const {
  const Domain& r = domain_[static_cast<size_t>(b)];
  const Domain& reader = domain_[static_cast<size_t>(a)];
  if (!r.cuda || r.reduced.empty() || reduces_trailing_dims(r) || !reader.reduced.empty() ||
      reader.full != r.full)
    return false;
  for (const Value* v : t_.nodes()[static_cast<size_t>(dep)]->outputs)
    if (v->is_tensor() && v->tensor_type().shape != r.full) return true;
  return false;
}

bool Fuser::keeps_apart(int a, int b) {
  for (auto [op, index] : apart_) {
    int r = find(op), s = find(index);
    if ((r == a && s == b) || (r == b && s == a)) return true;
  }
  return false;
}

int Fuser::find(int i) {
  while (parent_[static_cast<size_t>(i)] != i)
    i = parent_[static_cast<size_t>(i)] =
        parent_[static_cast<size_t>(parent_[static_cast<size_t>(i)])];
  return i;
}

// Compute nodes whose values node i reads, looking through views (computed once: the greedy
// loop and the cycle test ask for them again and again).
std::vector<int> Fuser::find_compute_deps(const Node& node) {
  std::vector<int> deps;
  std::vector<const Value*> work;
  for (const Operand& op : node.operands) {
    if (op.is_value()) work.push_back(op.value());
    if (op.is_value_list()) work.insert(work.end(), op.values().begin(), op.values().end());
  }
  while (!work.empty()) {
    const Value* v = work.back();
    work.pop_back();
    auto it = producer_.find(v);
    if (it == producer_.end()) continue;  // a trace input
    const Node& p = *t_.nodes()[static_cast<size_t>(it->second)];
    if (is_view(p)) {
      for (const Operand& op : p.operands)
        if (op.is_value()) work.push_back(op.value());
    } else if (std::find(deps.begin(), deps.end(), it->second) == deps.end()) {
      deps.push_back(it->second);
    }
  }
  return deps;
}

// Whether `producer` can be computed inside `consumer`'s loop nest although their domains
// differ: the kernel evaluates each value at the index it is read at (a view or a scatter
// remaps it), so an element-by-element region is recomputed where the consumer reads it, at
// the cost of its expression per read and no round trip through memory. That holds when the
// producer has no reduction (recomputing one per read would multiply its work) and nothing
// but the consumer reads it: no other region, no output, no writeback.
//   v = x[:, ::2]; v.mul_(0.5); return x * 2 + 1
//   t2 = mul(slice(x), 0.5) over [R, C/2], read by slice_scatter(x, t2) over [R, C]: one region.
bool Fuser::inlinable(int producer, int consumer) {
  const Domain& d = domain_[static_cast<size_t>(producer)];
  if (d.opaque || !d.reduced.empty()) return false;
  const auto& nodes = t_.nodes();
  for (size_t j = 0; j < nodes.size(); ++j) {
    const Node& n = *nodes[j];
    if (is_view(n)) continue;
    int r = find(static_cast<int>(j));
    if (r == producer) {
      OpKind k = n.op->kind;
      if (k != OpKind::kElementwise && k != OpKind::kCreation && k != OpKind::kScatter &&
          n.id() != OpId::kWrapIndex)  // (elementwise over its index)
        return false;
      continue;
    }
    if (r == consumer) continue;
    for (int dep : compute_deps(j))
      if (find(dep) == producer) return false;
  }
  for (size_t j = 0; j < nodes.size(); ++j)
    if (needed_[j] && !is_view(*nodes[j]) && find(static_cast<int>(j)) == producer) return false;
  return true;
}

// Region b joins region a, whose loop nest becomes `merged` (with the nodes b recomputes).
void Fuser::join(int a, int b, const Domain& merged) {
  parent_[static_cast<size_t>(b)] = a;
  auto& into = members_[static_cast<size_t>(a)];
  auto& from = members_[static_cast<size_t>(b)];
  into.insert(into.end(), from.begin(), from.end());
  from.clear();
  if (!copies_.empty()) {
    for (int c : copies_[static_cast<size_t>(b)]) {
      copied_into_[static_cast<size_t>(c)].erase(b);
      if (find(c) == a && !dead_[static_cast<size_t>(c)]) continue;  // a computes it anyway
      copies_[static_cast<size_t>(a)].insert(c);
      copied_into_[static_cast<size_t>(c)].insert(a);
    }
    copies_[static_cast<size_t>(b)].clear();
    for (int c : std::set<int>(copies_[static_cast<size_t>(a)]))  // now a's own nodes
      if (find(c) == a && !dead_[static_cast<size_t>(c)]) {
        copies_[static_cast<size_t>(a)].erase(c);
        copied_into_[static_cast<size_t>(c)].erase(a);
      }
  }
  last_member_[static_cast<size_t>(a)] =
      std::max(last_member_[static_cast<size_t>(a)], last_member_[static_cast<size_t>(b)]);
  domain_[static_cast<size_t>(a)] = merged;
}

// Nodes whose values leave the program (results, writebacks, the values such views are of).
std::vector<bool> Fuser::needed_nodes() {
  std::vector<bool> out(t_.nodes().size(), false);
  std::vector<const Value*> values(t_.outputs().begin(), t_.outputs().end());
  for (const auto& wb : t_.writebacks)
    values.push_back(wb.second);
  for (const Value* v : values) {
    auto it = producer_.find(v);
    if (it == producer_.end()) continue;
    out[static_cast<size_t>(it->second)] = true;
    if (is_view(*t_.nodes()[static_cast<size_t>(it->second)]))
      for (int d : compute_deps(static_cast<size_t>(it->second)))
        out[static_cast<size_t>(d)] = true;
  }
  return out;
}

// Region-level successors of region r.
std::set<int> Fuser::successors(int r) {
  std::set<int> out;
  for (int m : members_[static_cast<size_t>(r)])
    for (int u : users_[static_cast<size_t>(m)])
      if (int s = find(u); s != r) out.insert(s);
  return out;
}

// Merging `producer` and `consumer` is a cycle if a path from producer reaches consumer
// through another region. Values flow forward in trace order, so a region whose nodes all come
// after the consumer's last one leads nowhere that matters.
bool Fuser::creates_cycle(int producer, int consumer) {
  const int horizon = last_member_[static_cast<size_t>(consumer)];
  std::vector<int> work;
  std::set<int> seen;
  for (int s : successors(producer))
    if (s != consumer) work.push_back(s);
  while (!work.empty()) {
    int r = work.back();
    work.pop_back();
    if (r == consumer) return true;
    if (!seen.insert(r).second) continue;
    const auto& m = members_[static_cast<size_t>(r)];
    if (!m.empty() && *std::min_element(m.begin(), m.end()) > horizon) continue;
    for (int s : successors(r))
      work.push_back(s);
  }
  return false;
}

// Sibling reductions: two regions that reduce over one loop nest (the same shape, the same
// reduced dims) and read a value in common run as one when neither reaches the other: the value
// is read once and the nest launched once.
// (After recompute_in_readers, which makes such readers of one input.)
//   b = sum(g, [0, 1]); w = sum(mul(g, xhat), [0, 1])   a layer norm's bias and weight
//   gradients: two column nests over the output gradient g, one after the merge
void Fuser::merge_sibling_reductions() {
  const auto& nodes = t_.nodes();
  for (bool changed = true; changed;) {
    changed = false;
    std::map<const Value*, std::set<int>> readers;  // a value -> the reduction regions reading it
    for (size_t i = 0; i < nodes.size(); ++i) {
      const int r = static_cast<int>(i);
      if (is_view(*nodes[i]) || find(r) != r || domain_[i].opaque || domain_[i].reduced.empty())
        continue;
      const std::vector<int> held = region_nodes(r);
      if (held.empty()) continue;
      for (const Value* v : values_read(held, [&](int j) { return holds(r, j); }))
        readers[v].insert(r);
    }
    for (const auto& [value, regions] : readers) {
      for (auto a = regions.begin(); a != regions.end() && !changed; ++a) {
        for (auto b = std::next(a); b != regions.end() && !changed; ++b) {
          if (find(*a) != *a || find(*b) != *b) continue;
          const Domain& da = domain_[static_cast<size_t>(*a)];
          const Domain& db = domain_[static_cast<size_t>(*b)];
          if (da.full != db.full || da.reduced != db.reduced || keeps_apart(*a, *b) ||
              has_arg_reduction(*a) || has_arg_reduction(*b))
            continue;
          const std::set<int> after_a = successors(*a), after_b = successors(*b);
          if (after_a.contains(*b) || after_b.contains(*a) || creates_cycle(*a, *b) ||
              creates_cycle(*b, *a))
            continue;
          join(*a, *b, da);
          changed = true;
        }
      }
      if (changed) break;
    }
  }
}

// An argmax or argmin has no cooperative form (codegen keeps it serial, or leaves a long one to
// PyTorch): joined to another reduction it would take that one's split schedule away.
bool Fuser::has_arg_reduction(int r) {
  for (int m : members_[static_cast<size_t>(r)]) {
    const OpId id = t_.nodes()[static_cast<size_t>(m)]->id();
    if (id == OpId::kArgmax || id == OpId::kArgmin) return true;
  }
  return false;
}

}  // namespace fusion

ExecutionPlan fuse(const Trace& functional, const FuseOptions& options) {
  return fusion::Fuser(functional, options.inline_across_domains).run();
}

}  // namespace kiln
