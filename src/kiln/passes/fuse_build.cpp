// fuse's last stage: the regions as the plan's steps, in data order (fuse.h).
#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "kiln/ir/builder.h"
#include "kiln/passes/fuser.h"
#include "kiln/support/error.h"

namespace kiln::fusion {

ExecutionPlan Fuser::build() {
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
        << "fuse: region " << r << " reads " << nodes[static_cast<size_t>(node)]->outputs[0]->name()
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
      bool ready = std::all_of(preds[r].begin(), preds[r].end(), [&](size_t p) { return done[p]; });
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
Step Fuser::make_step(const std::vector<int>& compute, const std::vector<const Value*>& views,
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
        !is_view(n) ||
        (!n.outputs.empty() && std::find(views.begin(), views.end(), n.outputs[0]) != views.end());
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

}  // namespace kiln::fusion
