#include "kiln/passes/place_writebacks.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "kiln/analysis/store_index_rule.h"
#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

bool reads(const Step& s, const Value* v) {
  return std::find(s.inputs.begin(), s.inputs.end(), v) != s.inputs.end();
}
bool defines(const Step& s, const Value* v) {
  return std::find(s.outputs.begin(), s.outputs.end(), v) != s.outputs.end();
}

// Orders steps by their data edges plus `extra` (a, b): a before b. False if impossible.
bool schedule(std::vector<Step>& steps, const std::vector<std::pair<size_t, size_t>>& extra) {
  size_t n = steps.size();
  std::vector<std::set<size_t>> preds(n);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (i != j)
        for (const Value* v : steps[i].inputs)
          if (defines(steps[j], v)) preds[i].insert(j);
  for (const auto& [a, b] : extra)
    preds[b].insert(a);
  std::vector<size_t> order;
  std::vector<bool> done(n, false);
  while (order.size() < n) {
    bool progressed = false;
    for (size_t i = 0; i < n && !progressed; ++i) {
      if (done[i] ||
          !std::all_of(preds[i].begin(), preds[i].end(), [&](size_t p) { return done[p]; }))
        continue;
      done[i] = true;
      order.push_back(i);
      progressed = true;
    }
    if (!progressed) return false;
  }
  std::vector<Step> sorted;
  for (size_t i : order)
    sorted.push_back(std::move(steps[i]));
  steps = std::move(sorted);
  return true;
}

// The part of its base a slice_scatter / select_scatter / as_strided_scatter writes, or a slice /
// select / as_strided views.
std::optional<Step::Window> window_of(const Node& n) {
  const TensorType& self = n.input(0)->tensor_type();
  Step::Window w;
  if (n.id() == OpId::kAsStridedScatter || n.id() == OpId::kAsStrided) {
    w.kind = Step::Window::Kind::kAsStrided;
    w.sizes = n.arg("size").as_ints();
    w.strides = n.arg("stride").as_ints();
    w.offset = n.arg("storage_offset").as_optional_int();
    return w;
  }
  bool select = n.id() == OpId::kSelectScatter || n.id() == OpId::kSelect;
  if (!select && n.id() != OpId::kSliceScatter && n.id() != OpId::kSlice) return std::nullopt;
  w.dim = wrap_dim(n.arg("dim").as_int(), self.rank());
  int64_t size = self.shape[static_cast<size_t>(w.dim)];
  if (select) {
    int64_t index = n.arg("index").as_int();
    w.kind = Step::Window::Kind::kSelect;
    w.start = index < 0 ? index + size : index;
    return w;
  }
  int64_t end = 0;
  normalize_slice(size, n.arg("start").as_optional_int(), n.arg("end").as_optional_int(), &w.start,
                  &end);
  w.step = n.arg("step").as_int();
  w.length = slice_length(w.start, end, w.step);
  return w;
}
std::optional<Step::Window> scatter_window(const Node& n) {
  return n.op->kind == OpKind::kScatter ? window_of(n) : std::nullopt;
}
std::optional<Step::Window> view_window(const Node& n) {
  return n.op->kind == OpKind::kView ? window_of(n) : std::nullopt;
}

// A writeback of `slice_scatter(target, src, dim, start, end, step)` computed by a region of only
// that (`x[:, :512] = v`; a key over several dims nests one scatter per dim, each into the slice
// the one around it replaces): it changes only the slice. The region would read and rewrite all
// of the target; storing src into the target's slice does the same with the slice's bytes.
//   (t12,) = kilnFusion1(x, t8)  # writes x <- t12
//     # t0 = ltorch.slice(x, 0, 0, 64)
//     # t11 = ltorch.slice_scatter(t0, t8, 1, 0, 512)
//     # t12 = ltorch.slice_scatter(x, t11, 0, 0, 64)
// is the write of t8 into x[slice 0, 0::1][slice 1, 0::1]. Nothing when the writeback is not of
// that form.
struct WindowedWrite {
  size_t scatter_step = 0;  // the region of only the scatters
  Value* src = nullptr;     // computed by a step of the plan, into memory of its own
  std::vector<Step::Window> window;
};
std::optional<WindowedWrite> windowed_write(const Trace& functional, const ExecutionPlan& plan,
                                            const Value* target, const Value* value) {
  auto producer = std::find_if(plan.steps.begin(), plan.steps.end(),
                               [&](const Step& s) { return defines(s, value); });
  if (producer == plan.steps.end() || producer->kind != Step::Kind::kFusion ||
      producer->outputs.size() != 1)
    return std::nullopt;
  const Trace& body = producer->body;
  auto outer = [&](const Value* inner) -> Value* {  // the step input behind a body input
    const auto& ins = body.inputs();
    auto at = std::find(ins.begin(), ins.end(), inner);
    return at == ins.end() ? nullptr : producer->inputs[static_cast<size_t>(at - ins.begin())];
  };
  // Peel the scatters from the outside in: each writes into `base` (the target, then the slice
  // of it the scatter around replaces) at one window.
  WindowedWrite write;
  write.scatter_step = static_cast<size_t>(producer - plan.steps.begin());
  const Value* base = nullptr;
  const Value* at = body.outputs().front();
  size_t nodes = 0;
  while (true) {
    const Node* scatter = at->producer();
    if (!scatter) return std::nullopt;
    ++nodes;
    // (a region of a creation op has no tensor operand 0: `a.copy_(torch.ones(1, 1))`)
    std::optional<Step::Window> w = scatter_window(*scatter);
    // (as_strided addresses the storage: only as the outermost window)
    if (!w || (w->kind == Step::Window::Kind::kAsStrided && !write.window.empty()))
      return std::nullopt;
    const Value* scatter_base = scatter->input(0);
    if (base == nullptr) {
      if (outer(scatter_base) != target) return std::nullopt;
    } else if (scatter_base != base) {
      return std::nullopt;
    }
    write.window.push_back(*w);
    const Value* inner = scatter->input(1);
    if ((write.src = outer(inner)) != nullptr) break;
    // An inner scatter must write into exactly this window of this base: the matching view.
    const Node* next = inner->producer();
    if (!next || !scatter_window(*next)) return std::nullopt;
    const Node* view = next->input(0)->producer();
    if (!view || view->input(0) != scatter_base || view_window(*view) != *w) return std::nullopt;
    ++nodes;
    base = next->input(0);
    at = inner;
  }
  // Only those nodes: anything else in the region would be computed for nothing.
  if (body.nodes().size() != nodes) return std::nullopt;
  // src computed by a step into memory of its own: an input of the program lives in the caller's
  // memory, which another writeback may change before the copies run (x[-1] = y; y.tanh_()).
  if (std::none_of(plan.steps.begin(), plan.steps.end(),
                   [&](const Step& s) { return defines(s, write.src); }))
    return std::nullopt;
  // The scattered value itself must be needed only by the writeback: not by an output, a step,
  // or the writeback of another target (b[-1] = v; a.copy_(b) writes the new b into a too).
  for (const Value* out : functional.outputs())
    if (out == value) return std::nullopt;
  for (const auto& [other, other_value] : functional.writebacks)
    if (other_value == value && other != target) return std::nullopt;
  for (const Step& s : plan.steps)
    if (reads(s, value)) return std::nullopt;
  return write;
}

// Removes step `erased`, renumbering the ordering constraints (none may name it).
void erase_step(ExecutionPlan& plan, size_t erased,
                std::vector<std::pair<size_t, size_t>>& constraints) {
  plan.steps.erase(plan.steps.begin() + static_cast<std::ptrdiff_t>(erased));
  for (auto& [a, b] : constraints) {
    KILN_ASSERT(a != erased && b != erased) << "a step with an ordering constraint was removed";
    a -= a > erased ? 1 : 0;
    b -= b > erased ? 1 : 0;
  }
}

// Rule 5 for a store into `target` by step `r`: every other step that reads its old contents can
// run first (`skip`: a step about to be removed). The constraints with those added, or nothing.
std::optional<std::vector<std::pair<size_t, size_t>>> readers_first(
    const ExecutionPlan& plan, size_t r, const Value* target,
    const std::vector<std::pair<size_t, size_t>>& constraints,
    std::optional<size_t> skip = std::nullopt) {
  std::vector<std::pair<size_t, size_t>> extra = constraints;
  for (size_t q = 0; q < plan.steps.size(); ++q)
    if (q != r && q != skip && reads(plan.steps[q], target)) extra.emplace_back(q, r);
  // The trial numbers the steps as the plan does; a skipped step keeps its place, unlinked.
  std::vector<Step> trial;
  for (size_t q = 0; q < plan.steps.size(); ++q) {
    const Step& s = plan.steps[q];
    Step light{s.kind, s.name, Trace(), s.inputs, s.outputs, {}, {}, {}};
    if (q == skip) light.inputs.clear(), light.outputs.clear();
    trial.push_back(std::move(light));
  }
  if (!schedule(trial, extra)) return std::nullopt;
  return extra;
}

}  // namespace

WritebackCounts place_writebacks(const Trace& functional, ExecutionPlan& plan) {
  WritebackCounts counts;
  std::vector<std::pair<size_t, size_t>> constraints;
  std::vector<Step::Writeback> temporaries;
  // Windowed writes first: they remove steps, which the constraints below number. The region
  // that computes src stores it into the window itself where every other reader of the target's
  // old contents can run before it (the kernel and the executor check rule 4 on the loads it
  // makes, and copy after the step where it fails). Otherwise a copy of src into the window
  // after everything, except on CUDA for a window of a third of the target or more: the copy is
  // kiln_strided_copy, which moved bytes about 3x slower than a region's kernel does (H200,
  // 2026-11-30: x[:, :512] = softmax(...) of x [65536, 1024] went from 0.246 to 0.290 ms with
  // the half of x copied), so the region of scatters stays.
  std::vector<Step> windowed;
  // The writebacks they take care of (target, value).
  std::set<std::pair<const Value*, const Value*>> written_in_window;
  for (const auto& [target, value] : functional.writebacks) {
    std::optional<WindowedWrite> write = windowed_write(functional, plan, target, value);
    if (!write) continue;
    size_t producer = 0;
    while (!defines(plan.steps[producer], write->src))
      ++producer;
    // Not on CUDA yet: a CUDA row nest's row-local stores (kernel.h) have not run on a GPU, and
    // until they have, CUDA keeps the copy or the region of scatters (bench/NOTES.md, session 5).
    const bool cuda = target->tensor_type().device.kind == Device::Kind::kCuda;
    std::optional<std::vector<std::pair<size_t, size_t>>> ordered;
    if (plan.steps[producer].kind == Step::Kind::kFusion && !cuda)
      ordered = readers_first(plan, producer, target, constraints, write->scatter_step);
    bool small =
        3 * shape_numel(write->src->tensor_type().shape) < shape_numel(target->tensor_type().shape);
    if (!ordered && cuda && !small) continue;
    written_in_window.insert({target, value});
    if (ordered) {
      constraints = *ordered;
      plan.steps[producer].writebacks.push_back({target, write->src, write->window});
      erase_step(plan, write->scatter_step, constraints);
      ++counts.in_kernel;
      continue;
    }
    erase_step(plan, write->scatter_step, constraints);
    Step copy;
    copy.kind = Step::Kind::kCopy;
    copy.name = "writeback";
    copy.inputs = {write->src};
    copy.writebacks = {{target, write->src, write->window}};
    windowed.push_back(std::move(copy));
    ++counts.with_temporary;
  }
  for (const auto& [target, value] : functional.writebacks) {
    if (written_in_window.contains({target, value})) continue;
    auto in_kernel = [&]() -> std::optional<size_t> {
      size_t r = 0;
      while (r < plan.steps.size() && !defines(plan.steps[r], value))
        ++r;
      if (r == plan.steps.size() || plan.steps[r].kind != Step::Kind::kFusion) return std::nullopt;
      const Step& step = plan.steps[r];
      // Rule 4: the region's own loads of the target are at the store's index.
      size_t out_k = 0;
      while (step.outputs[out_k] != value)
        ++out_k;
      const Value* stored = step.body.outputs()[out_k];
      // Row-local stores on the CPU only, as windowed ones (above).
      const bool cuda = target->tensor_type().device.kind == Device::Kind::kCuda;
      for (size_t k = 0; k < step.inputs.size(); ++k) {
        if (step.inputs[k] != target) continue;
        StoreIndexRule rule = store_index_rule(step.body, step.body.inputs()[k], stored);
        if (rule == StoreIndexRule::kNone || (rule == StoreIndexRule::kRowLocal && cuda))
          return std::nullopt;
      }
      std::optional<std::vector<std::pair<size_t, size_t>>> ordered =
          readers_first(plan, r, target, constraints);
      if (!ordered) return std::nullopt;
      constraints = *ordered;
      return r;
    }();
    if (in_kernel) {
      plan.steps[*in_kernel].writebacks.push_back({target, value, {}});
      ++counts.in_kernel;
    } else {
      temporaries.push_back({target, value, {}});
      ++counts.with_temporary;
    }
  }
  bool ok = schedule(plan.steps, constraints);
  KILN_ASSERT(ok) << "place_writebacks could not order the steps it accepted";
  // Copies after everything: every reader of old contents has run by then.
  for (Step& copy : windowed)
    plan.steps.push_back(std::move(copy));
  for (const Step::Writeback& wb : temporaries) {
    Step copy;
    copy.kind = Step::Kind::kCopy;
    copy.name = "writeback";
    copy.inputs = {wb.value};
    copy.writebacks = {wb};
    plan.steps.push_back(std::move(copy));
  }
  int fusion = 0;
  for (Step& s : plan.steps) {
    if (s.kind == Step::Kind::kFusion) s.name = "kilnFusion" + std::to_string(fusion++);
    if (s.kind == Step::Kind::kOpaque) s.name = s.body.nodes().front()->op->name;
  }
  return counts;
}

}  // namespace kiln
