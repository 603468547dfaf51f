// fuse's state while it partitions a trace (fuse.h), shared by its stages, one file each:
//   fuse.cpp             the regions as a union-find over the trace's compute nodes; the greedy
//                        merge along producer -> consumer edges, and the merge of sibling
//                        reductions
//   fuse_recompute.cpp   recomputation of element-by-element values in the regions that read them
//   fuse_build.cpp       the plan: regions in data order, each a step with a body of its own
// A region is named by its root node; domain_[root] is its loop nest. Private to src/kiln/passes.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/passes/plan.h"

namespace kiln::fusion {

bool is_view(const Node& n);
bool is_opaque(const Node& n);

// The space a region iterates over: a full shape, and the dims its reductions reduce.
struct Domain {
  Shape full;
  std::vector<int64_t> reduced;
  bool opaque = false;
  bool cuda = false;  // computed on a CUDA device
};

Shape keep_shape(const Domain& d);
Shape drop_shape(const Domain& d);
Domain node_domain(const Node& n);
// The merged domain, if `a` and `b` can share one loop nest.
std::optional<Domain> merge_domains(const Domain& a, const Domain& b);

class Fuser {
 public:
  Fuser(const Trace& t, bool inline_across_domains);
  ExecutionPlan run();

 private:
  // ---- the regions and the greedy merge (fuse.cpp)
  void find_checked_indices();
  bool keeps_apart(int a, int b);
  bool rereads_reduction(int b, int a, int dep) const;
  int find(int i);
  // Compute nodes whose values node i reads, looking through views (computed once: the greedy
  // loop and the cycle test ask for them again and again).
  const std::vector<int>& compute_deps(size_t i) { return deps_[i]; }
  std::vector<int> find_compute_deps(const Node& node);
  bool inlinable(int producer, int consumer);
  void join(int a, int b, const Domain& merged);
  std::vector<bool> needed_nodes();
  std::set<int> successors(int r);
  bool creates_cycle(int producer, int consumer);
  void merge_sibling_reductions();
  bool has_arg_reduction(int r);

  // ---- recomputation in readers (fuse_recompute.cpp)
  static constexpr size_t kMostRecomputedNodes = 8;
  void recompute_in_readers();
  bool recomputable(int i) const;
  bool holds(int r, int node);
  std::vector<int> region_nodes(int r);
  std::set<int> readers_of(int d);
  std::set<const Value*> values_read(const std::vector<int>& nodes,
                                     const std::function<bool(int)>& inside);
  static int64_t bytes_of(const Value* v);
  std::vector<int> cone_for(int d, int home, int r, int64_t* new_bytes_read);
  void drop_dead_nodes(int r, const std::vector<bool>& needed);

  // ---- the plan (fuse_build.cpp)
  ExecutionPlan build();
  Step make_step(const std::vector<int>& compute, const std::vector<const Value*>& views,
                 const std::set<const Value*>& used_outside, const std::set<int>& recomputed);

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

}  // namespace kiln::fusion
