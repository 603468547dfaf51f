// fuse's recomputation of element-by-element values in the regions that read them (fuse.h).
#include <algorithm>
#include <set>

#include "kiln/ir/dtype.h"
#include "kiln/passes/fuser.h"

namespace kiln::fusion {

// After the greedy merge, an element-by-element value that other regions read is computed again
// inside each of them from what its own region reads, where that reads no more bytes than the
// value itself; its region then no longer stores it (and drops what only it needed).
//   A: t202 = to(x, f32); t209 = mul(mul(g, w), rstd)     x, g bf16; t202, t209 f32
//   B: s = sum(mul(t209, sub(t202, mean)), [2]) ...        read 8 bytes an element from A
//   after: B computes t202 and t209 from x, g, w and rstd (4 bytes an element); A stores neither
// A layer norm's backward was four regions handing four float32 tensors to each other.
void Fuser::recompute_in_readers() {
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

bool Fuser::recomputable(int i) const {
  const Node& n = *t_.nodes()[static_cast<size_t>(i)];
  return n.op->kind == OpKind::kElementwise && n.outputs.size() == 1 && n.outputs[0]->is_tensor();
}

bool Fuser::holds(int r, int node) {
  return (!dead_[static_cast<size_t>(node)] && find(node) == r) ||
         copies_[static_cast<size_t>(r)].contains(node);
}

std::vector<int> Fuser::region_nodes(int r) {
  std::vector<int> out;
  for (int m : members_[static_cast<size_t>(r)])
    if (!dead_[static_cast<size_t>(m)]) out.push_back(m);
  out.insert(out.end(), copies_[static_cast<size_t>(r)].begin(),
             copies_[static_cast<size_t>(r)].end());
  return out;
}

// The regions that read node d's value from memory.
std::set<int> Fuser::readers_of(int d) {
  std::set<int> out;
  for (int u : users_[static_cast<size_t>(d)]) {
    if (int h = find(u); !dead_[static_cast<size_t>(u)] && !holds(h, d)) out.insert(h);
    for (int r : copied_into_[static_cast<size_t>(u)])
      if (!holds(r, d)) out.insert(r);
  }
  return out;
}

// The values `nodes` read from outside `inside`, looking through views.
std::set<const Value*> Fuser::values_read(const std::vector<int>& nodes,
                                          const std::function<bool(int)>& inside) {
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

int64_t Fuser::bytes_of(const Value* v) {
  if (!v->is_tensor()) return 0;
  return shape_numel(v->tensor_type().shape) * dtype_size(v->tensor_type().dtype);
}

// The nodes region r computes again to have node d's value without reading it (d first) and
// the bytes it then reads that it did not; none where r cannot: more than
// kMostRecomputedNodes nodes, a loop nest r does not run, a checked index.
std::vector<int> Fuser::cone_for(int d, int home, int r, int64_t* new_bytes_read) {
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
void Fuser::drop_dead_nodes(int r, const std::vector<bool>& needed) {
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

}  // namespace kiln::fusion
