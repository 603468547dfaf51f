// store_index_rule: see store_index_rule.h.
#include "kiln/analysis/store_index_rule.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "kiln/analysis/pass_stores.h"
#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

// Rule 4 in index arithmetic. Every map here is affine in the region's iteration index i (one
// iteration per element of the stored value's producer): a load of the written tensor at
// iteration i must reach the very element the store of iteration i writes. Loads are traced from
// the op that reads them back through the views to the tensor; the store from its producer
// forward through the views to the written value. Anything not affine (a reduction, a src of a
// scatter, a reshape in the middle of a chain) fails the rule: a temporary is always safe.
//
//   t0 = transpose(x)   ; x [2, 3], store x <- t1
//   t1 = exp(t0)        -> stores  x[i1, i0] at i = (i0, i1)  (linear 3*i1 + i0 ... of x^T)
//                          loads   x[i1, i0]                  same element: in-kernel

// q rows of affine forms over the iteration index, all divided by `scale`: row d is
// (coef[d] . i + constant[d]) / scale. The scale is not 1 only between the src of a strided
// scatter and the strided view that undoes it (src j of slice_scatter(self, src, d, start, end, 2)
// lands at self[start + 2j], so at iteration i the src is read at (i_d - start) / 2, and a
// slice(x, d, start, end, 2) of that reads x at i_d again). A load under a scatter's false
// condition is never used, so only the exact quotient matters. Forms are kept in lowest terms.
struct AffineIndex {
  std::vector<std::vector<int64_t>> coef;
  std::vector<int64_t> constant;
  int64_t scale = 1;
  size_t rank() const { return constant.size(); }
};

struct AffineForm {
  std::vector<int64_t> coef;
  int64_t constant = 0;
  int64_t scale = 1;
  bool operator==(const AffineForm&) const = default;
};

// Divides every coefficient, constant and the scale by their greatest common divisor.
void reduce(AffineIndex& a) {
  int64_t g = a.scale;
  for (size_t d = 0; d < a.rank(); ++d) {
    g = std::gcd(g, a.constant[d]);
    for (int64_t c : a.coef[d])
      g = std::gcd(g, c);
  }
  if (g <= 1) return;
  a.scale /= g;
  for (size_t d = 0; d < a.rank(); ++d) {
    a.constant[d] /= g;
    for (int64_t& c : a.coef[d])
      c /= g;
  }
}
void reduce(AffineForm& f) {
  int64_t g = std::gcd(f.scale, f.constant);
  for (int64_t c : f.coef)
    g = std::gcd(g, c);
  if (g <= 1) return;
  f.scale /= g;
  f.constant /= g;
  for (int64_t& c : f.coef)
    c /= g;
}

// The iteration's own index over r dims, as forms over `vars` >= r variables.
AffineIndex identity_index(size_t r, size_t vars) {
  AffineIndex a;
  for (size_t k = 0; k < r; ++k) {
    a.coef.emplace_back(vars, 0);
    a.coef.back()[k] = 1;
    a.constant.push_back(0);
  }
  return a;
}

// The row-major linear index over `shape` of an index.
AffineForm linear(const AffineIndex& a, const Shape& shape, size_t r) {
  AffineForm f{std::vector<int64_t>(r, 0), 0, a.scale};
  std::vector<int64_t> rs = contiguous_strides(shape);
  for (size_t k = 0; k < a.rank(); ++k) {
    if (shape[k] == 1) continue;  // only index 0 exists
    for (size_t j = 0; j < r; ++j)
      f.coef[j] += a.coef[k][j] * rs[k];
    f.constant += a.constant[k] * rs[k];
  }
  reduce(f);
  return f;
}

std::vector<int64_t> zeros(size_t r) {
  return std::vector<int64_t>(r, 0);
}

// Through one view backwards: the index of the view's input read for its output index `out`.
// nullopt when not affine (reshape-like ops are handled by the caller).
// An operand of shape `to`, broadcast to a value read at `at` (over r variables): its own index.
AffineIndex broadcast_index(const AffineIndex& at, const Shape& to, size_t r) {
  AffineIndex b;
  b.scale = at.scale;
  size_t lead = at.rank() - to.size();
  for (size_t d = 0; d < to.size(); ++d) {
    bool broadcast = to[d] == 1;
    b.coef.push_back(broadcast ? zeros(r) : at.coef[d + lead]);
    b.constant.push_back(broadcast ? 0 : at.constant[d + lead]);
  }
  return b;
}

std::optional<AffineIndex> view_input(const Node& n, size_t output, const AffineIndex& out,
                                      size_t r) {
  const Shape& in_shape = n.input(0)->tensor_type().shape;
  auto rank = static_cast<int64_t>(in_shape.size());
  AffineIndex in;
  switch (n.id()) {
    case OpId::kAlias:
    case OpId::kDetach:
      return out;
    case OpId::kSlice: {
      int64_t dim = wrap_dim(n.arg(1).as_int(), rank), start, end;
      normalize_slice(in_shape[static_cast<size_t>(dim)], n.arg(2).as_optional_int(),
                      n.arg(3).as_optional_int(), &start, &end);
      in = out;
      for (int64_t& c : in.coef[static_cast<size_t>(dim)])
        c *= n.arg(4).as_int();
      in.constant[static_cast<size_t>(dim)] =
          start * out.scale + out.constant[static_cast<size_t>(dim)] * n.arg(4).as_int();
      reduce(in);
      return in;
    }
    case OpId::kSelect: {
      int64_t dim = wrap_dim(n.arg(1).as_int(), rank);
      int64_t index = n.arg(2).as_int();
      if (index < 0) index += in_shape[static_cast<size_t>(dim)];
      in = out;
      in.coef.insert(in.coef.begin() + dim, zeros(r));
      in.constant.insert(in.constant.begin() + dim, index * out.scale);
      return in;
    }
    case OpId::kPermute: {
      const IntList& dims = n.arg(1).as_ints();
      in = out;
      for (size_t k = 0; k < dims.size(); ++k) {
        size_t d = static_cast<size_t>(wrap_dim(dims[k], rank));
        in.coef[d] = out.coef[k];
        in.constant[d] = out.constant[k];
      }
      return in;
    }
    case OpId::kTranspose: {
      if (rank == 0) return out;
      size_t a = static_cast<size_t>(wrap_dim(n.arg(1).as_int(), rank));
      size_t b = static_cast<size_t>(wrap_dim(n.arg(2).as_int(), rank));
      in = out;
      std::swap(in.coef[a], in.coef[b]);
      std::swap(in.constant[a], in.constant[b]);
      return in;
    }
    case OpId::kT:
      in = out;
      std::reverse(in.coef.begin(), in.coef.end());
      std::reverse(in.constant.begin(), in.constant.end());
      return in;
    case OpId::kExpand:
      return broadcast_index(out, in_shape, r);
    case OpId::kUnsqueeze: {
      size_t dim = static_cast<size_t>(wrap_dim(n.arg(1).as_int(), rank + 1));
      in = out;
      in.coef.erase(in.coef.begin() + static_cast<int64_t>(dim));
      in.constant.erase(in.constant.begin() + static_cast<int64_t>(dim));
      return in;
    }
    case OpId::kDiagonal: {
      int64_t offset = n.arg(1).as_int();
      size_t d1 = static_cast<size_t>(wrap_dim(n.arg(2).as_int(), rank));
      size_t d2 = static_cast<size_t>(wrap_dim(n.arg(3).as_int(), rank));
      size_t last = out.rank() - 1, next = 0;
      in.scale = out.scale;
      for (size_t k = 0; k < in_shape.size(); ++k) {
        if (k == d1 || k == d2) {
          in.coef.push_back(out.coef[last]);
          in.constant.push_back(
              out.constant[last] +
              out.scale * (k == d1 ? std::max<int64_t>(-offset, 0) : std::max<int64_t>(offset, 0)));
        } else {
          in.coef.push_back(out.coef[next]);
          in.constant.push_back(out.constant[next]);
          ++next;
        }
      }
      return in;
    }
    case OpId::kSplit:
    case OpId::kChunk:
    case OpId::kUnbind: {
      int64_t dim = wrap_dim(n.arg(n.id() == OpId::kUnbind ? 1 : 2).as_int(), rank);
      if (n.id() == OpId::kUnbind) {
        in = out;
        in.coef.insert(in.coef.begin() + dim, zeros(r));
        in.constant.insert(in.constant.begin() + dim, static_cast<int64_t>(output) * out.scale);
        return in;
      }
      std::vector<int64_t> sizes =
          n.id() == OpId::kSplit
              ? split_sizes(in_shape[static_cast<size_t>(dim)], n.arg(1))
              : chunk_sizes(in_shape[static_cast<size_t>(dim)], n.arg(1).as_int());
      int64_t start = 0;
      for (size_t k = 0; k < output; ++k)
        start += sizes[k];
      in = out;
      in.constant[static_cast<size_t>(dim)] += start * out.scale;
      return in;
    }
    default:
      return std::nullopt;  // reshapes, squeeze (handled by the caller), as_strided
  }
}

// (unsqueeze has its own affine form above)
bool reshape_like(const Node& n) {
  return keeps_row_major_order(n.id()) && n.id() != OpId::kUnsqueeze;
}

// Follows one region's values backwards from its outputs, each evaluated at an affine index of
// the iteration i, and collects the elements of `target` it loads. The forms are over the r
// iteration variables and one more, the position of a reduction over the last dim: the element
// a row's reduction takes in (nested reductions share it).
//   t0 = mean(x, [-1], keepdim)   ; x [4, 8], store x <- t1 at (i0, i1)
//   t1 = sub(x, t0)               -> loads x[i0, i1] (linear 8*i0 + i1), and in a reduction
//                                    x[i0, r] (row_loads)
class LoadTracer {
 public:
  // r: the iteration's dims; the reduction's position is variable r.
  LoadTracer(const Value* target, size_t r) : target_(target), r_(r + 1), position_(r) {}

  // `v` evaluated at index `at`; false when a load of the target is not affine.
  bool visit(const Value* v, const AffineIndex& at) {
    if (v == target_) {
      if (reduction_depth_ > 0)
        row_loads.push_back(at);
      else
        loads.push_back(linear(at, v->tensor_type().shape, r_));
      return true;
    }
    if (!reaches(v)) return true;
    std::string key = std::to_string(v->id()) + ":" + key_of(at) +
                      (reduction_depth_ > 0 ? ":in a reduction" : "");
    if (!visited_.insert(key).second) return true;
    const Node& p = *v->producer();
    size_t output = 0;
    while (p.outputs[output] != v)
      ++output;
    const Shape& shape = v->tensor_type().shape;
    if (p.op->kind == OpKind::kView) {
      if (reshape_like(p)) {
        // Element order is kept: the linear index passes through, but a multi-index of
        // anything beyond the target itself would need a division.
        if (p.input(0) != target_) return false;
        loads.push_back(linear(at, shape, r_));
        return true;
      }
      std::optional<AffineIndex> in = view_input(p, output, at, r_);
      return in && visit(p.input(0), *in);
    }
    switch (p.op->kind) {
      case OpKind::kElementwise: {
        for (const Operand& op : p.operands) {
          if (!op.is_value() || !op.value()->is_tensor()) continue;
          if (!visit(op.value(), broadcast(at, op.value()->tensor_type().shape))) return false;
        }
        return true;
      }
      case OpKind::kScatter: {
        if (!visit(p.input(0), at)) return false;
        const Value* src = p.input(1);
        if (!reaches(src)) return true;
        if (p.id() == OpId::kSliceScatter) {
          // src[j] lands at self[start + step * j] along dim: read at (i_dim - start) / step.
          int64_t dim = wrap_dim(p.arg(2).as_int(), static_cast<int64_t>(shape.size())), start, end;
          int64_t step = p.arg(5).as_int();
          normalize_slice(shape[static_cast<size_t>(dim)], p.arg(3).as_optional_int(),
                          p.arg(4).as_optional_int(), &start, &end);
          AffineIndex s = at;
          for (size_t d = 0; d < s.rank(); ++d) {
            if (d == static_cast<size_t>(dim)) continue;
            s.constant[d] *= step;
            for (int64_t& c : s.coef[d])
              c *= step;
          }
          s.constant[static_cast<size_t>(dim)] -= start * at.scale;
          s.scale *= step;
          reduce(s);
          return visit(src, s);
        }
        if (p.id() == OpId::kSelectScatter) {
          int64_t dim = wrap_dim(p.arg(2).as_int(), static_cast<int64_t>(shape.size()));
          AffineIndex s = at;
          s.coef.erase(s.coef.begin() + dim);
          s.constant.erase(s.constant.begin() + dim);
          return visit(src, s);
        }
        return false;
      }
      case OpKind::kCreation:
        // *_like read only the shape; fill's value is one element loaded everywhere.
        if (p.id() == OpId::kFill && p.operands[1].is_value() && p.input(1)->is_tensor())
          return visit(p.input(1), AffineIndex{});
        return true;
      case OpKind::kReduction: {
        // Over the last dim alone: its input at `at` with that dim at the reduction's position.
        const Value* self = p.input(0);
        auto rank = static_cast<int64_t>(self->tensor_type().rank());
        std::vector<int64_t> dims = reduction_dims(p.arg(1).as_optional_ints(), rank);
        if (rank == 0 || dims.size() != 1 || dims[0] != rank - 1) return false;
        AffineIndex in = at;
        if (p.arg("keepdim").as_bool()) {
          in.coef.pop_back();
          in.constant.pop_back();
        }
        in.coef.push_back(zeros(r_));
        in.coef.back()[position_] = in.scale;
        in.constant.push_back(0);
        ++reduction_depth_;
        bool ok = visit(self, in);
        --reduction_depth_;
        return ok;
      }
      case OpKind::kIndex: {
        // index_copy / index_add / scatter read self at the element they produce; the index and the
        // source are read at positions that depend on values: they must not reach the target.
        //   k_cache <- index_copy(k_cache, 2, pos, k): loads k_cache[i] and stores k_cache[i]
        bool writes =
            p.id() == OpId::kIndexCopy || p.id() == OpId::kIndexAdd || p.id() == OpId::kScatter;
        for (size_t k = 0; k < p.operands.size(); ++k) {
          const Operand& op = p.operands[k];
          if (!op.is_value() || !op.value()->is_tensor()) continue;
          if (writes && k == 0) {
            if (!visit(op.value(), at)) return false;
          } else if (reaches(op.value())) {
            return false;
          }
        }
        return true;
      }
      default:
        return false;  // other reductions, joins, opaque ops: every element reads many
    }
  }

  std::vector<AffineForm> loads;       // outside any reduction: linear over the target
  std::vector<AffineIndex> row_loads;  // inside a reduction over the last dim

 private:
  // Whether the target is among the values `v` is computed from.
  bool reaches(const Value* v) {
    if (v == target_) return true;
    auto it = reaches_.find(v);
    if (it != reaches_.end()) return it->second;
    bool r = false;
    if (const Node* p = v->producer()) {
      for (const Operand& op : p->operands) {
        if (op.is_value()) r = r || reaches(op.value());
        if (op.is_value_list())
          for (const Value* u : op.values())
            r = r || reaches(u);
      }
    }
    reaches_[v] = r;
    return r;
  }

  // An operand of shape `to`, broadcast to the op's output and read at `at`.
  AffineIndex broadcast(const AffineIndex& at, const Shape& to) const {
    return broadcast_index(at, to, r_);
  }

  static std::string key_of(const AffineIndex& a) {
    std::string k;
    for (size_t i = 0; i < a.rank(); ++i) {
      for (int64_t c : a.coef[i])
        k += std::to_string(c) + ",";
      k += std::to_string(a.constant[i]) + ";";
    }
    return k + "/" + std::to_string(a.scale);
  }

  const Value* target_;
  size_t r_;         // variables of the forms
  size_t position_;  // the variable of a reduction's position
  int reduction_depth_ = 0;
  std::set<std::string> visited_;
  std::unordered_map<const Value*, bool> reaches_;
};

// The compute value a region output is made from, and the forward views from it to the output
// (only permutations, transposes, aliases and a final reshape, which store each element once).
struct StorePath {
  const Value* producer = nullptr;
  std::vector<const Node*> views;  // producer -> output order
};
std::optional<StorePath> store_path(const Value* out) {
  StorePath path;
  const Value* w = out;
  while (w->producer() && w->producer()->op->kind == OpKind::kView) {
    path.views.insert(path.views.begin(), w->producer());
    w = w->producer()->input(0);
  }
  if (!w->producer()) return std::nullopt;  // an input passed through: a copy
  for (size_t k = 0; k < path.views.size(); ++k) {
    const Node& n = *path.views[k];
    bool ok = n.id() == OpId::kAlias || n.id() == OpId::kDetach || n.id() == OpId::kPermute ||
              n.id() == OpId::kTranspose || n.id() == OpId::kT ||
              (reshape_like(n) && k + 1 == path.views.size());
    if (!ok) return std::nullopt;
  }
  path.producer = w;
  return path;
}

// The element of `stored` written at iteration i, as a linear index over the stored value.
AffineForm store_element(const StorePath& path, const Value* stored, size_t r) {
  AffineIndex idx = identity_index(r, r);
  for (const Node* n : path.views) {
    if (reshape_like(*n)) return linear(idx, n->input(0)->tensor_type().shape, r);
    AffineIndex next = idx;
    auto rank = static_cast<int64_t>(idx.rank());
    if (n->id() == OpId::kPermute) {
      next = AffineIndex{};
      next.scale = idx.scale;
      for (int64_t d : n->arg(1).as_ints()) {
        size_t k = static_cast<size_t>(wrap_dim(d, rank));
        next.coef.push_back(idx.coef[k]);
        next.constant.push_back(idx.constant[k]);
      }
    } else if (n->id() == OpId::kTranspose && rank > 0) {
      size_t a = static_cast<size_t>(wrap_dim(n->arg(1).as_int(), rank));
      size_t b = static_cast<size_t>(wrap_dim(n->arg(2).as_int(), rank));
      std::swap(next.coef[a], next.coef[b]);
      std::swap(next.constant[a], next.constant[b]);
    } else if (n->id() == OpId::kT) {
      std::reverse(next.coef.begin(), next.coef.end());
      std::reverse(next.constant.begin(), next.constant.end());
    }
    idx = next;
  }
  return linear(idx, stored->tensor_type().shape, r);
}

// Whether `v` is computed from `target` other than through `avoided` (`seen`: values already
// found not to).
bool reaches_avoiding(const Value* v, const Value* target, const Value* avoided,
                      std::set<const Value*>& seen) {
  if (v == target) return true;
  if (v == avoided || !v->producer() || !seen.insert(v).second) return false;
  for (const Operand& op : v->producer()->operands) {
    if (op.is_value() && reaches_avoiding(op.value(), target, avoided, seen)) return true;
    if (op.is_value_list())
      for (const Value* u : op.values())
        if (reaches_avoiding(u, target, avoided, seen)) return true;
  }
  return false;
}

}  // namespace

StoreIndexRule store_index_rule(const Trace& body, const Value* target, const Value* stored) {
  std::optional<StorePath> path = store_path(stored);
  if (!path) return StoreIndexRule::kNone;
  const Shape& domain = path->producer->tensor_type().shape;
  size_t r = domain.size();
  AffineForm store = store_element(*path, stored, r);
  store.coef.push_back(0);  // the reduction's position
  LoadTracer tracer(target, r);
  // A store over the domain of the region's reduction, made by the reduction's pass
  // (analysis/pass_stores.h) or by a last nest after the reduction's: the outputs of the reduced
  // shape read the target only in the pass, at the pass's element, which is the iteration of the
  // domain.
  std::optional<PassStores> pass = pass_stores(body);
  const bool in_pass = pass && domain == pass->domain;
  // Every output of the region is computed at iteration i from a producer over the domain.
  for (const Value* out : body.outputs()) {
    if (in_pass && out->tensor_type().shape != domain) {
      std::set<const Value*> seen;
      if (reaches_avoiding(out, target, pass->reduction->outputs[0], seen))
        return StoreIndexRule::kNone;
      continue;
    }
    std::optional<StorePath> p = store_path(out);
    if (!p || p->producer->tensor_type().shape != domain) {
      // An output over another domain (another nest of the kernel) that never reads the target
      // cannot see the store: AdamW's 0-d step count beside its parameter's update.
      std::set<const Value*> seen;
      if (reaches_avoiding(out, target, nullptr, seen)) return StoreIndexRule::kNone;
      continue;
    }
    if (!tracer.visit(p->producer, identity_index(r, r + 1))) return StoreIndexRule::kNone;
  }
  if (in_pass && !tracer.visit(pass->reduction->input(0), identity_index(r, r + 1)))
    return StoreIndexRule::kNone;
  if (!std::all_of(tracer.loads.begin(), tracer.loads.end(),
                   [&](const AffineForm& f) { return f == store; }))
    return StoreIndexRule::kNone;
  if (tracer.row_loads.empty()) return StoreIndexRule::kSameIndex;
  // Row-local: the store at the iteration's own element of the target, and every load in a
  // reduction at the iteration's row (its index i0 .. i_{r-2} on every dim but the last).
  bool own_element = r > 0 && stored->tensor_type().shape == domain &&
                     std::all_of(path->views.begin(), path->views.end(), [](const Node* n) {
                       return n->id() == OpId::kAlias || n->id() == OpId::kDetach;
                     });
  if (!own_element) return StoreIndexRule::kNone;
  AffineIndex row = identity_index(r, r + 1);
  for (const AffineIndex& load : tracer.row_loads) {
    if (load.rank() != r || load.scale != 1) return StoreIndexRule::kNone;
    for (size_t d = 0; d + 1 < r; ++d)
      if (domain[d] != 1 && (load.coef[d] != row.coef[d] || load.constant[d] != 0))
        return StoreIndexRule::kNone;
  }
  return StoreIndexRule::kRowLocal;
}

}  // namespace kiln
