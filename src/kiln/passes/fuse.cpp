#include "kiln/passes/fuse.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>

#include "kiln/analysis/integer_range.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/dtype.h"
#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

bool is_view(const Node& n) {
  return n.op->kind == OpKind::kView;
}
bool is_opaque(const Node& n) {
  return n.op->kind == OpKind::kOpaque;
}

// The space a region iterates over: a full shape, and the dims its reductions reduce.
struct Domain {
  Shape full;
  std::vector<int64_t> reduced;
  bool opaque = false;
};

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

Domain node_domain(const Node& n) {
  Domain d;
  d.opaque = is_opaque(n);
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

class Fuser {
 public:
  Fuser(const Trace& t, bool inline_across_domains)
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

  ExecutionPlan run() {
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
          if (!merged || keeps_apart(a, b) || creates_cycle(b, a)) continue;
          join(b, a, *merged);
          changed = true;
        }
      }
    }
    recompute_in_readers();
    merge_sibling_reductions();
    return build();
  }

 private:
  // An index op's index is checked before the kernel runs (codegen's IndexCheck), on a kernel
  // input: one the trace computes (a where that masks a loss's ignored targets) must come from
  // a region that runs before, not from the op's own. Looked at through views and a wrap_index,
  // as the check looks at it; an index known to be in range (arange's positions) needs no check
  // and stays where it is.
  //   st = where(ne(t, -100), t, 0); picked = gather(logp, 1, st): two regions, not one that
  //   cannot be lowered (it ran as PyTorch ops).
  void find_checked_indices() {
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
  bool keeps_apart(int a, int b) {
    for (auto [op, index] : apart_) {
      int r = find(op), s = find(index);
      if ((r == a && s == b) || (r == b && s == a)) return true;
    }
    return false;
  }

  int find(int i) {
    while (parent_[static_cast<size_t>(i)] != i)
      i = parent_[static_cast<size_t>(i)] =
          parent_[static_cast<size_t>(parent_[static_cast<size_t>(i)])];
    return i;
  }

  // Compute nodes whose values node i reads, looking through views (computed once: the greedy
  // loop and the cycle test ask for them again and again).
  const std::vector<int>& compute_deps(size_t i) { return deps_[i]; }
  std::vector<int> find_compute_deps(const Node& node) {
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
  bool inlinable(int producer, int consumer) {
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

  // ---- sibling reductions
  // ------------------------------------------------------------------------ Two regions that
  // reduce over one loop nest (the same shape, the same reduced dims) and read a value in common
  // run as one when neither reaches the other: the value is read once and the nest launched once.
  // (After recompute_in_readers, which makes such readers of one input.)
  //   b = sum(g, [0, 1]); w = sum(mul(g, xhat), [0, 1])   a layer norm's bias and weight
  //   gradients: two column nests over the output gradient g, one after the merge
  void merge_sibling_reductions() {
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
  bool has_arg_reduction(int r) {
    for (int m : members_[static_cast<size_t>(r)]) {
      const OpId id = t_.nodes()[static_cast<size_t>(m)]->id();
      if (id == OpId::kArgmax || id == OpId::kArgmin) return true;
    }
    return false;
  }

  // Region b joins region a, whose loop nest becomes `merged` (with the nodes b recomputes).
  void join(int a, int b, const Domain& merged) {
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

  // ---- recomputation in the regions that read a value ------------------------------------------
  // After the greedy merge, an element-by-element value that other regions read is computed again
  // inside each of them from what its own region reads, where that reads no more bytes than the
  // value itself; its region then no longer stores it (and drops what only it needed).
  //   A: t202 = to(x, f32); t209 = mul(mul(g, w), rstd)     x, g bf16; t202, t209 f32
  //   B: s = sum(mul(t209, sub(t202, mean)), [2]) ...        read 8 bytes an element from A
  //   after: B computes t202 and t209 from x, g, w and rstd (4 bytes an element); A stores neither
  // A layer norm's backward was four regions handing four float32 tensors to each other.
  void recompute_in_readers() {
    const size_t n = t_.nodes().size();
    dead_.assign(n, false);
    copies_.assign(n, {});
    copied_into_.assign(n, {});
    const std::vector<bool>& needed = needed_;
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t d = 0; d < n; ++d) {
        if (dead_[d] || needed[d] || !recomputable(static_cast<int>(d))) continue;
        const int home = find(static_cast<int>(d));
        const std::set<int> readers = readers_of(static_cast<int>(d));
        if (readers.empty()) continue;
        // Worth it when the readers' new reads are no more than the value's store and reads.
        std::vector<std::vector<int>> cones;
        int64_t new_bytes = 0;
        for (int r : readers) {
          int64_t bytes = 0;
          cones.push_back(cone_for(static_cast<int>(d), home, r, &bytes));
          new_bytes += bytes;
          if (cones.back().empty()) break;
        }
        const int64_t value_bytes = bytes_of(t_.nodes()[d]->outputs[0]);
        if (cones.size() < readers.size() || cones.back().empty() ||
            new_bytes > value_bytes * static_cast<int64_t>(readers.size() + 1))
          continue;
        size_t k = 0;
        for (int r : readers) {
          for (int c : cones[k++]) {
            copies_[static_cast<size_t>(r)].insert(c);
            copied_into_[static_cast<size_t>(c)].insert(r);
          }
        }
        drop_dead_nodes(home, needed);
        changed = true;
      }
    }
  }

  // Nodes whose values leave the program (results, writebacks, the values such views are of).
  std::vector<bool> needed_nodes() {
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

  static constexpr size_t kMostRecomputedNodes = 8;

  bool recomputable(int i) const {
    const Node& n = *t_.nodes()[static_cast<size_t>(i)];
    return n.op->kind == OpKind::kElementwise && n.outputs.size() == 1 && n.outputs[0]->is_tensor();
  }
  bool holds(int r, int node) {
    return (!dead_[static_cast<size_t>(node)] && find(node) == r) ||
           copies_[static_cast<size_t>(r)].contains(node);
  }
  std::vector<int> region_nodes(int r) {
    std::vector<int> out;
    for (int m : members_[static_cast<size_t>(r)])
      if (!dead_[static_cast<size_t>(m)]) out.push_back(m);
    out.insert(out.end(), copies_[static_cast<size_t>(r)].begin(),
               copies_[static_cast<size_t>(r)].end());
    return out;
  }

  // The regions that read node d's value from memory.
  std::set<int> readers_of(int d) {
    std::set<int> out;
    for (int u : users_[static_cast<size_t>(d)]) {
      if (int h = find(u); !dead_[static_cast<size_t>(u)] && !holds(h, d)) out.insert(h);
      for (int r : copied_into_[static_cast<size_t>(u)])
        if (!holds(r, d)) out.insert(r);
    }
    return out;
  }

  // The values `nodes` read from outside `inside`, looking through views.
  template <class Inside>
  std::set<const Value*> values_read(const std::vector<int>& nodes, Inside inside) {
    std::set<const Value*> out;
    for (int i : nodes) {
      std::vector<const Value*> work;
      t_.nodes()[static_cast<size_t>(i)]->for_each_value_operand(
          [&](const Value* v) { work.push_back(v); });
      while (!work.empty()) {
        const Value* v = work.back();
        work.pop_back();
        auto it = producer_.find(v);
        if (it != producer_.end() && is_view(*t_.nodes()[static_cast<size_t>(it->second)])) {
          t_.nodes()[static_cast<size_t>(it->second)]->for_each_value_operand(
              [&](const Value* u) { work.push_back(u); });
        } else if (it == producer_.end() || !inside(it->second)) {
          out.insert(v);
        }
      }
    }
    return out;
  }

  static int64_t bytes_of(const Value* v) {
    if (!v->is_tensor()) return 0;
    return shape_numel(v->tensor_type().shape) * dtype_size(v->tensor_type().dtype);
  }

  // The nodes region r computes again to have node d's value without reading it (d first) and
  // the bytes it then reads that it did not; none where r cannot: more than
  // kMostRecomputedNodes nodes, a loop nest r does not run, a checked index.
  std::vector<int> cone_for(int d, int home, int r, int64_t* new_bytes_read) {
    std::vector<int> cone, work{d};
    std::set<int> seen;
    while (!work.empty()) {
      int c = work.back();
      work.pop_back();
      if (!seen.insert(c).second || holds(r, c) || !holds(home, c) || !recomputable(c)) continue;
      if (cone.size() == kMostRecomputedNodes) return {};
      cone.push_back(c);
      for (int dep : compute_deps(static_cast<size_t>(c)))
        work.push_back(dep);
    }
    // Each element once per nest iteration: as many as the nest's (or a reduction's rows'), read
    // through views that keep them (a reshape, a transpose) or pick some (a slice), never a
    // broadcast that would compute each again per element of the nest.
    const Domain& nest = domain_[static_cast<size_t>(r)];
    if (nest.opaque) return {};
    for (int c : cone) {
      const int64_t count =
          shape_numel(t_.nodes()[static_cast<size_t>(c)]->outputs[0]->tensor_type().shape);
      if (count != shape_numel(nest.full) &&
          (nest.reduced.empty() || count != shape_numel(keep_shape(nest))))
        return {};
    }
    for (auto [op, index] : apart_)
      if (holds(r, op) && std::find(cone.begin(), cone.end(), index) != cone.end()) return {};
    const std::set<int> in_cone(cone.begin(), cone.end());
    const std::set<const Value*> already =
        values_read(region_nodes(r), [&](int i) { return holds(r, i); });
    int64_t new_bytes = 0;
    for (const Value* leaf :
         values_read(cone, [&](int i) { return in_cone.contains(i) || holds(r, i); })) {
      if (already.contains(leaf)) continue;
      auto it = producer_.find(leaf);
      // A value only its own region uses yet is stored there too.
      const bool stored = it == producer_.end() || !readers_of(it->second).empty();
      new_bytes += stored ? bytes_of(leaf) : 2 * bytes_of(leaf);
    }
    *new_bytes_read = new_bytes;
    return cone;
  }

  // Removes from region r the element-by-element nodes whose values nothing reads any more.
  void drop_dead_nodes(int r, const std::vector<bool>& needed) {
    for (bool again = true; again;) {
      again = false;
      for (int m : region_nodes(r)) {
        if (needed[static_cast<size_t>(m)] || !recomputable(m)) continue;
        const bool copy = find(m) != r;
        bool used = !copy && !readers_of(m).empty();
        for (int u : users_[static_cast<size_t>(m)])
          used = used || (u != m && holds(r, u));
        if (used) continue;
        if (copy) {
          copies_[static_cast<size_t>(r)].erase(m);
          copied_into_[static_cast<size_t>(m)].erase(r);
        } else {
          dead_[static_cast<size_t>(m)] = true;
        }
        again = true;
      }
    }
  }

  // Region-level successors of region r.
  std::set<int> successors(int r) {
    std::set<int> out;
    for (int m : members_[static_cast<size_t>(r)])
      for (int u : users_[static_cast<size_t>(m)])
        if (int s = find(u); s != r) out.insert(s);
    return out;
  }

  // Merging `producer` and `consumer` is a cycle if a path from producer reaches consumer
  // through another region. Values flow forward in trace order, so a region whose nodes all come
  // after the consumer's last one leads nowhere that matters.
  bool creates_cycle(int producer, int consumer) {
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

  ExecutionPlan build() {
    const auto& nodes = t_.nodes();
    // Regions in data order: a region runs after every region it reads from.
    std::map<int, std::vector<int>> members;  // root -> compute nodes, in trace order
    for (size_t i = 0; i < nodes.size(); ++i)
      if (!is_view(*nodes[i]) && !dead_[i])
        members[find(static_cast<int>(i))].push_back(static_cast<int>(i));
    // Values needed outside any region: outputs and writebacks. A view among them is
    // materialized by the region of the value it views, or by a region of its own.
    std::set<const Value*> needed(t_.outputs().begin(), t_.outputs().end());
    for (const auto& wb : t_.writebacks)
      needed.insert(wb.second);
    std::map<int, std::vector<const Value*>> extra_views;  // region root -> view values it outputs
    std::vector<const Value*> lone_views;
    for (const Value* v : needed) {
      auto it = producer_.find(v);
      if (it == producer_.end() || !is_view(*nodes[static_cast<size_t>(it->second)])) continue;
      std::vector<int> deps = compute_deps(static_cast<size_t>(it->second));
      if (deps.size() == 1 && !is_opaque(*nodes[static_cast<size_t>(deps[0])]))
        extra_views[find(deps[0])].push_back(v);
      else
        lone_views.push_back(v);
    }
    std::vector<std::vector<int>> regions;
    std::vector<std::set<int>> recomputed;  // per region: its nodes another region stores
    std::vector<std::vector<const Value*>> region_views;
    // A region's home nodes map to it; the nodes it recomputes are its own but never its outputs.
    std::unordered_map<int, size_t> region_of;
    for (auto& [root, list] : members) {
      for (int i : list)
        region_of[i] = regions.size();
      const std::set<int>& copies = copies_[static_cast<size_t>(root)];
      recomputed.push_back(copies);
      list.insert(list.end(), copies.begin(), copies.end());
      std::sort(list.begin(), list.end());
      regions.push_back(list);
      region_views.push_back(extra_views[root]);
    }
    for (const Value* v : lone_views) {
      regions.push_back({});
      recomputed.push_back({});
      region_views.push_back({v});
    }
    auto outside = [&](int node, size_t r) {
      if (recomputed[r].contains(node)) return false;
      auto it = region_of.find(node);
      KILN_ASSERT(it != region_of.end())
          << "fuse: region " << r << " reads "
          << nodes[static_cast<size_t>(node)]->outputs[0]->name()
          << ", which no region computes (dead " << dead_[static_cast<size_t>(node)] << ")";
      return it->second != r;
    };
    // Topological order of the regions (Kahn, ties by first node).
    std::vector<std::set<size_t>> preds(regions.size());
    for (size_t r = 0; r < regions.size(); ++r) {
      for (int i : regions[r])
        for (int d : compute_deps(static_cast<size_t>(i)))
          if (outside(d, r)) preds[r].insert(region_of[d]);
      for (const Value* v : region_views[r])
        for (int d : compute_deps(static_cast<size_t>(producer_.at(v))))
          if (region_of[d] != r) preds[r].insert(region_of[d]);
    }
    std::vector<size_t> order;
    std::vector<bool> done(regions.size(), false);
    while (order.size() < regions.size()) {
      bool progressed = false;
      for (size_t r = 0; r < regions.size(); ++r) {
        if (done[r]) continue;
        bool ready =
            std::all_of(preds[r].begin(), preds[r].end(), [&](size_t p) { return done[p]; });
        if (!ready) continue;
        done[r] = true;
        order.push_back(r);
        progressed = true;
        break;
      }
      KILN_ASSERT(progressed) << "fuse made a cycle of regions";
    }
    // Which values each region must hand to others.
    std::set<const Value*> used_outside;
    for (const Value* v : needed)
      used_outside.insert(v);
    for (size_t r = 0; r < regions.size(); ++r)
      for (int i : regions[r])
        for (int d : compute_deps(static_cast<size_t>(i)))
          if (outside(d, r))
            for (const Value* o : nodes[static_cast<size_t>(d)]->outputs)
              used_outside.insert(o);
    for (const Value* v : needed) {  // a lone view reads its compute values from their regions
      if (std::find(lone_views.begin(), lone_views.end(), v) == lone_views.end()) continue;
      for (int d : compute_deps(static_cast<size_t>(producer_.at(v))))
        for (const Value* o : nodes[static_cast<size_t>(d)]->outputs)
          used_outside.insert(o);
    }
    ExecutionPlan plan;
    for (size_t r : order)
      plan.steps.push_back(make_step(regions[r], region_views[r], used_outside, recomputed[r]));
    return plan;
  }

  // The nodes of a region — its compute nodes, the views they read through and the views it
  // materializes — cloned into a trace of their own.
  Step make_step(const std::vector<int>& compute, const std::vector<const Value*>& views,
                 const std::set<const Value*>& used_outside, const std::set<int>& recomputed) {
    const auto& nodes = t_.nodes();
    std::set<int> include(compute.begin(), compute.end());
    std::vector<const Value*> work;
    auto add_operands = [&](const Node& n) {
      for (const Operand& op : n.operands) {
        if (op.is_value()) work.push_back(op.value());
        if (op.is_value_list()) work.insert(work.end(), op.values().begin(), op.values().end());
      }
    };
    for (int i : compute)
      add_operands(*nodes[static_cast<size_t>(i)]);
    for (const Value* v : views)
      work.push_back(v);
    while (!work.empty()) {
      const Value* v = work.back();
      work.pop_back();
      auto it = producer_.find(v);
      if (it == producer_.end() || !is_view(*nodes[static_cast<size_t>(it->second)])) continue;
      if (include.insert(it->second).second) add_operands(*nodes[static_cast<size_t>(it->second)]);
    }
    Step step;
    step.kind = compute.size() == 1 && is_opaque(*nodes[static_cast<size_t>(compute[0])])
                    ? Step::Kind::kOpaque
                    : Step::Kind::kFusion;
    Builder b(step.body);
    std::unordered_map<const Value*, Value*> map;
    auto get = [&](Value* v) -> Value* {
      auto it = map.find(v);
      if (it != map.end()) return it->second;
      Value* in = b.add_input(v->name(), v->type());
      map[v] = in;
      step.inputs.push_back(v);
      return in;
    };
    for (int i : include) {  // std::set: trace order
      const Node& n = *nodes[static_cast<size_t>(i)];
      std::vector<Operand> ops;
      for (const Operand& op : n.operands) {
        if (op.is_value()) {
          ops.emplace_back(get(op.value()));
        } else if (op.is_value_list()) {
          std::vector<Value*> vs;
          for (Value* v : op.values())
            vs.push_back(get(v));
          ops.emplace_back(vs);
        } else {
          ops.push_back(op);
        }
      }
      std::vector<std::string> names;
      for (const Value* o : n.outputs)
        names.push_back(o->name());
      std::vector<Value*> outs = b.call_bound(n.id(), ops, n.loc, &names);
      for (size_t k = 0; k < outs.size(); ++k)
        map[n.outputs[k]] = outs[k];
      bool outputs_value =
          !is_view(n) || (!n.outputs.empty() &&
                          std::find(views.begin(), views.end(), n.outputs[0]) != views.end());
      if (!outputs_value || recomputed.contains(i)) continue;
      for (Value* o : n.outputs) {
        if (!used_outside.contains(o)) continue;
        step.outputs.push_back(o);
      }
    }
    std::vector<Value*> body_outs;
    for (Value* o : step.outputs)
      body_outs.push_back(map.at(o));
    b.set_outputs(body_outs);
    return step;
  }

  const Trace& t_;
  bool inline_across_domains_;
  std::unordered_map<const Value*, int> producer_;
  std::vector<int> parent_;
  std::vector<std::pair<int, int>> apart_;  // (index op, its checked index's producer)
  std::vector<Domain> domain_;
  std::vector<std::vector<int>> deps_;   // node -> compute_deps
  std::vector<std::vector<int>> users_;  // node -> the compute nodes whose deps hold it
  // Per region root: its compute nodes, and the last one's trace index (every path into the
  // region ends at a node no later than that).
  std::vector<std::vector<int>> members_;
  std::vector<int> last_member_;
  std::vector<bool> needed_;  // needed_nodes(): never dropped, never inlined into a reader
  // recompute_in_readers: nodes no region computes any more; per region root, the nodes it
  // computes again although another region holds them; per node, the regions that do.
  std::vector<bool> dead_;
  std::vector<std::set<int>> copies_;
  std::vector<std::set<int>> copied_into_;
};

}  // namespace

ExecutionPlan fuse(const Trace& functional, const FuseOptions& options) {
  return Fuser(functional, options.inline_across_domains).run();
}

}  // namespace kiln
