#include "kiln/passes/functionalize.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>

#include "kiln/analysis/geometry.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

// One view op of a handle's chain, replayable on a functional value and invertible.
struct ViewStep {
  OpId op;                    // kSlice kSelect kDiagonal kPermute kTranspose kT kReshape
                              // kExpand kAlias kDetach kAsStrided kBitcast (view_dtype)
  std::vector<Operand> args;  // constant arguments after `self`
};

// A handle: the storage it lives in and the views from the storage's current value to it. A
// chain `from_flat` starts at the storage in storage order, 1-D (after an as_strided).
struct Chain {
  int storage = -1;
  bool from_flat = false;
  std::vector<ViewStep> steps;
};

// A storage's current value and the geometry that value has in the storage.
struct StorageState {
  Value* current = nullptr;
  Geometry canon;
  bool synthetic = false;  // a 1-D synthetic base: always contiguous and in storage order
};

std::vector<int64_t> argsort_desc(const Strides& strides) {
  std::vector<int64_t> perm(strides.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  return perm;
}

bool is_identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

class Functionalizer {
 public:
  Functionalizer(const Trace& eager, const AliasPattern& pattern, const StorageAnalysis& sa,
                 const FunctionalizeOptions& options)
      : eager_(eager), pattern_(pattern), sa_(sa), options_(options), b_(out_.trace) {}

  FunctionalProgram run() {
    auto start = std::chrono::steady_clock::now();
    bind_inputs();
    for (const auto& node : eager_.nodes())
      visit(*node);
    finish();
    out_.trace.constructed_by = "functionalize";
    out_.trace.construction_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return std::move(out_);
  }

 private:
  // ---- inputs --------------------------------------------------------------------------------

  void bind_inputs() {
    const auto& args = eager_.inputs();
    next_object_ = static_cast<int>(args.size());
    KILN_ASSERT(pattern_.inputs.size() == args.size())
        << "the alias pattern has " << pattern_.inputs.size() << " entries for " << args.size()
        << " inputs";
    std::vector<Value*> group_inputs(pattern_.groups.size(), nullptr);
    for (size_t g = 0; g < pattern_.groups.size(); ++g) {
      const AliasPattern::Group& group = pattern_.groups[g];
      size_t first = 0;
      while (pattern_.inputs[first].group != static_cast<int>(g))
        ++first;
      const TensorType& t = args[first]->tensor_type();
      Value* base;
      if (group.synthetic) {
        base = b_.add_input("base" + std::to_string(g),
                            TensorType{group.dtype, {group.numel}, t.device, std::nullopt});
        states_[static_cast<int>(g)] = {base, Geometry{{group.numel}, {1}, 0}, true};
      } else {
        base =
            b_.add_input(args[first]->name(), TensorType{t.dtype, t.shape, t.device, std::nullopt});
        // The argument's known range is its base's when nothing else views that memory (counted
        // only for an argument that has one: a count per group would be quadratic in the
        // arguments of an optimizer's step).
        if (args[first]->known_range() &&
            std::count_if(pattern_.inputs.begin(), pattern_.inputs.end(),
                          [&](const AliasPattern::Input& in) {
                            return in.group == static_cast<int>(g);
                          }) == 1)
          base->set_known_range(args[first]->known_range());
        states_[static_cast<int>(g)] = {base, Geometry{t.shape, contiguous_strides(t.shape), 0},
                                        false};
      }
      group_inputs[g] = base;
      initial_.push_back(base);
    }
    for (size_t j = 0; j < args.size(); ++j) {
      Value* arg = args[j];
      const AliasPattern::Input& in = pattern_.inputs[j];
      int object = in.duplicate_of >= 0 ? in.duplicate_of : static_cast<int>(j);
      if (!arg->is_tensor()) {
        scalars_[arg] = b_.add_input(arg->name(), arg->type());
        continue;
      }
      object_[arg] = object;
      latest_[object] = arg;
      members_[object].push_back(arg);
      const StorageState& st = states_.at(in.group);
      Chain c{in.group, false, {}};
      if (st.synthetic) {
        c.from_flat = true;
        c.steps.push_back(as_strided_step(in.geometry, 0));
      }
      chains_[arg] = c;
    }
  }

  static ViewStep as_strided_step(const Geometry& g, int64_t origin) {
    return {
        OpId::kAsStrided,
        {Constant(IntList(g.sizes)), Constant(IntList(g.strides)), Constant(g.offset - origin)}};
  }

  // ---- the walk ------------------------------------------------------------------------------

  void visit(const Node& node) {
    ScopedErrorContext context(node.op->name, node.loc.str());
    if (!node.subsymbols.empty()) {
      for (const auto& sub : node.subsymbols)
        visit(*sub);
      return;
    }
    const OpInfo& op = *node.op;
    if (op.mutates_arg0()) return visit_write(node);
    if (op.is_metadata_mutation()) return visit_metadata(node);
    bool is_view = !node.outputs.empty() && node.operands[0].is_value() &&
                   node.input(0)->is_tensor() && node.outputs[0]->is_tensor() &&
                   sa_.storage_of(node.outputs[0]) == sa_.storage_of(node.input(0));
    if (is_view) return visit_view(node);
    visit_allocation(node);
  }

  // Operands of a functional op: tensors read now, number inputs mapped, constants kept.
  std::vector<Operand> read_operands(const Node& node, size_t from = 0) {
    std::vector<Operand> ops;
    for (size_t i = from; i < node.operands.size(); ++i)
      ops.push_back(map_operand(node.operands[i]));
    return ops;
  }

  Operand map_operand(const Operand& op) {
    if (op.is_value()) {
      Value* v = op.value();
      if (!v->is_tensor()) return Operand(scalars_.at(v));
      return Operand(read(v));
    }
    if (op.is_value_list()) {
      std::vector<Value*> vs;
      for (Value* v : op.values())
        vs.push_back(read(v));
      return Operand(vs);
    }
    return op;
  }

  void visit_allocation(const Node& node) {
    std::vector<Value*> outs = b_.call_bound(node.id(), read_operands(node), node.loc);
    KILN_ASSERT(outs.size() == node.outputs.size()) << node.op->name << " output count";
    for (size_t i = 0; i < outs.size(); ++i) {
      const Value* o = node.outputs[i];
      int s = sa_.storage_of(o);
      states_[s] = {outs[i], sa_.geometry_of(o), false};
      chains_[o] = Chain{s, false, {}};
      new_object(o);
    }
  }

  void visit_view(const Node& node) {
    Value* x = node.input(0);
    const Chain& base = chains_.at(x);
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const Value* o = node.outputs[i];
      Chain c = base;
      ViewStep step = view_step(node, i);
      if (step.op == OpId::kAsStrided) {
        // as_strided addresses the storage itself, whatever views led here.
        c.from_flat = true;
        c.steps.clear();
        const StorageState& st = states_.at(base.storage);
        step = as_strided_step(sa_.geometry_of(o), st.canon.offset);
      }
      bool restarted = step.op == OpId::kAsStrided;
      if (step.op != OpId::kAlias) c.steps.push_back(std::move(step));
      if (restarted) read_as(c, o->tensor_type().dtype);
      chains_[o] = std::move(c);
      new_object(o);
    }
  }

  void visit_metadata(const Node& node) {
    Value* x = node.input(0);
    const Value* y = node.outputs[0];
    Chain c = chains_.at(x);
    ViewStep step = view_step(node, 0);
    if (step.op == OpId::kAsStrided) {
      c.from_flat = true;
      c.steps.clear();
      step = as_strided_step(sa_.geometry_of(y), states_.at(c.storage).canon.offset);
    }
    bool restarted = step.op == OpId::kAsStrided;
    if (step.op != OpId::kAlias) c.steps.push_back(std::move(step));
    if (restarted) read_as(c, y->tensor_type().dtype);
    // Every name of this tensor object now sees the new sizes and strides, as in eager.
    inherit_object(x, y);
    for (const Value* v : members_.at(object_.at(x)))
      chains_[v] = c;
  }

  void visit_write(const Node& node) {
    const OpInfo& op = *node.op;
    Value* target = node.input(0);
    const TensorType& tt = target->tensor_type();
    Value* updated;
    if (op.is_inplace_elementwise()) {
      std::vector<Operand> args = read_operands(node);
      updated = b_.call_bound(op.functional_form, std::move(args), node.loc).at(0);
    } else if (node.id() == OpId::kFill_) {
      updated = b_.call1(OpId::kFill, {Operand(read(target)), map_operand(node.operands[1])}, {},
                         node.loc);
    } else if (node.id() == OpId::kZero_) {
      // For gradients, a fill of the old value: the tensor stays in eager's graph (with a zero
      // gradient), where zeros_like's result would not be.
      updated = options_.for_gradients
                    ? b_.call1(OpId::kFill, {Operand(read(target)), Operand(0.0)}, {}, node.loc)
                    : b_.call1(OpId::kZerosLike, {Operand(read(target))}, {}, node.loc);
    } else if (node.id() == OpId::kCopy_) {
      // For gradients, copy(old, src): src's values, and the old value's place in the graph.
      updated = options_.for_gradients
                    ? b_.call1(OpId::kCopy, {Operand(read(target)), Operand(read(node.input(1)))},
                               {}, node.loc)
                    : read(node.input(1));
    } else {
      KILN_ASSERT(false) << "functionalize does not know how to write with " << op.name;
      return;
    }
    if (updated->tensor_type().dtype != tt.dtype)
      updated = b_.call1(OpId::kTo, {updated, Constant(tt.dtype)}, {}, node.loc);
    if (updated->tensor_type().shape != tt.shape)
      updated = b_.call1(OpId::kExpand, {updated, Constant(IntList(tt.shape))}, {}, node.loc);
    // The target's layout at this write (its object's, after any metadata mutation).
    const Geometry& where = sa_.geometry_of(node.outputs.at(0));
    check_writable(node, where, op.is_inplace_elementwise() || node.id() == OpId::kCopy_);
    write(target, updated, where, node.loc);
    for (const Value* o : node.outputs) {
      chains_[o] = chains_.at(target);
      inherit_object(target, o);
    }
  }

  // Tensor objects: the caller's are 0 .. args-1, every view or allocation makes a new one, and
  // in-place ops and metadata mutations return the object they were given.
  void new_object(const Value* v) {
    int id = next_object_++;
    object_[v] = id;
    members_[id].push_back(v);
  }
  void inherit_object(const Value* from, const Value* to) {
    int id = object_.at(from);
    object_[to] = id;
    members_[id].push_back(to);
    if (id < static_cast<int>(eager_.inputs().size())) latest_[id] = to;
  }

  // ---- views ---------------------------------------------------------------------------------

  // A chain that an as_strided restarted from the storage reads the storage's dtype: an
  // as_strided of a view_dtype view (`x.view(torch.int32).as_strided(...)`) reads its bytes as
  // the view's dtype again, by a bit cast after it (casts commute with index views).
  void read_as(Chain& c, DType dtype) {
    if (states_.at(c.storage).current->tensor_type().dtype == dtype) return;
    c.steps.push_back({OpId::kBitcast, {Constant(dtype)}});
  }

  // The chain step for output `i` of a view node (or a metadata mutation).
  ViewStep view_step(const Node& node, size_t i) {
    const std::vector<Operand>& a = node.operands;
    const Value* out = node.outputs[i];
    const Shape& in_shape = node.input(0)->tensor_type().shape;
    auto out_shape = [&] { return Constant(IntList(out->tensor_type().shape)); };
    switch (node.id()) {
      case OpId::kSlice: {
        int64_t dim = wrap_dim(a[1].as_int(), static_cast<int64_t>(in_shape.size()));
        int64_t s, e;
        normalize_slice(in_shape[static_cast<size_t>(dim)], a[2].as_optional_int(),
                        a[3].as_optional_int(), &s, &e);
        return {OpId::kSlice, {dim, s, e, a[4].as_int()}};
      }
      case OpId::kNarrow: {
        int64_t dim = wrap_dim(a[1].as_int(), static_cast<int64_t>(in_shape.size()));
        int64_t start = a[2].as_int();
        if (start < 0) start += in_shape[static_cast<size_t>(dim)];
        return {OpId::kSlice, {dim, start, start + a[3].as_int(), int64_t{1}}};
      }
      case OpId::kSplit:
      case OpId::kChunk: {
        int64_t dim = wrap_dim(a[2].as_int(), static_cast<int64_t>(in_shape.size()));
        std::vector<int64_t> sizes =
            node.id() == OpId::kSplit
                ? split_sizes(in_shape[static_cast<size_t>(dim)], a[1])
                : chunk_sizes(in_shape[static_cast<size_t>(dim)], a[1].as_int());
        int64_t start = 0;
        for (size_t k = 0; k < i; ++k)
          start += sizes[k];
        return {OpId::kSlice, {dim, start, start + sizes[i], int64_t{1}}};
      }
      case OpId::kUnbind: {
        int64_t dim = wrap_dim(a[1].as_int(), static_cast<int64_t>(in_shape.size()));
        return {OpId::kSelect, {dim, static_cast<int64_t>(i)}};
      }
      case OpId::kSelect: {
        int64_t dim = wrap_dim(a[1].as_int(), static_cast<int64_t>(in_shape.size()));
        int64_t index = a[2].as_int();
        if (index < 0) index += in_shape[static_cast<size_t>(dim)];
        return {OpId::kSelect, {dim, index}};
      }
      case OpId::kDiagonal:
        return {OpId::kDiagonal, {a[1], a[2], a[3]}};
      case OpId::kPermute:
        return {OpId::kPermute, {a[1]}};
      case OpId::kTranspose:
      case OpId::kTranspose_:
        return {OpId::kTranspose, {a[1], a[2]}};
      case OpId::kT:
      case OpId::kT_:
        return {OpId::kT, {}};
      case OpId::kExpand:
        return {OpId::kExpand, {out_shape()}};
      case OpId::kAsStrided:
      case OpId::kAsStrided_:
        return {OpId::kAsStrided, {}};
      case OpId::kDetach:  // an identity for values, a boundary for gradients (differentiate)
        return {OpId::kDetach, {}};
      case OpId::kAlias:
      case OpId::kTo:
        return {OpId::kAlias, {}};
      case OpId::kViewDtype:  // the same bytes as another dtype: a bit cast of the value
        if (out->tensor_type().dtype == node.input(0)->tensor_type().dtype)
          return {OpId::kAlias, {}};
        return {OpId::kBitcast, {a[1]}};
      default:
        // view, reshape and flatten as views, unflatten, unsqueeze, squeeze: element order kept.
        if (out->tensor_type().shape == in_shape) return {OpId::kAlias, {}};
        return {OpId::kReshape, {out_shape()}};
    }
  }

  Value* apply(const ViewStep& step, Value* v, const SourceLoc& loc) {
    if (step.op == OpId::kAlias) return v;
    std::vector<Operand> args = {Operand(v)};
    args.insert(args.end(), step.args.begin(), step.args.end());
    return b_.call1(step.op, std::move(args), {}, loc);
  }

  // Writes `y` into the positions `step` views of `x`; returns the new whole of `x`.
  Value* unapply(const ViewStep& step, Value* x, Value* y, const SourceLoc& loc) {
    const auto& a = step.args;
    switch (step.op) {
      case OpId::kSlice:
        return b_.call1(OpId::kSliceScatter, {x, y, a[0], a[1], a[2], a[3]}, {}, loc);
      case OpId::kSelect:
        return b_.call1(OpId::kSelectScatter, {x, y, a[0], a[1]}, {}, loc);
      case OpId::kDiagonal:
        return b_.call1(OpId::kDiagonalScatter, {x, y, a[0], a[1], a[2]}, {}, loc);
      case OpId::kAsStrided: {
        // Eager may write through a view with repeated elements when every copy gets the same
        // value (fill_ of an expanded tensor); scatter one copy of each: the first along every
        // dim whose stride is 0.
        IntList sizes = a[0].as_ints();
        const IntList& strides = a[1].as_ints();
        for (size_t d = 0; d < sizes.size(); ++d) {
          if (strides[d] != 0 || sizes[d] <= 1) continue;
          y = b_.call1(OpId::kSlice, {y, static_cast<int64_t>(d), int64_t{0}, int64_t{1}}, {}, loc);
          sizes[d] = 1;
        }
        return b_.call1(OpId::kAsStridedScatter, {x, y, Constant(sizes), a[1], a[2]}, {}, loc);
      }
      case OpId::kPermute: {
        const IntList& dims = a[0].as_ints();
        IntList inverse(dims.size());
        for (size_t k = 0; k < dims.size(); ++k)
          inverse[static_cast<size_t>(wrap_dim(dims[k], static_cast<int64_t>(dims.size())))] =
              static_cast<int64_t>(k);
        return b_.call1(OpId::kPermute, {y, Constant(inverse)}, {}, loc);
      }
      case OpId::kTranspose:
        return b_.call1(OpId::kTranspose, {y, a[0], a[1]}, {}, loc);
      case OpId::kT:
        return b_.call1(OpId::kT, {y}, {}, loc);
      case OpId::kExpand: {
        // As for as_strided: keep the first copy along each broadcast dim (new leading dims and
        // size-1 dims that grew); eager only allows such writes when the copies agree.
        const Shape& from = x->tensor_type().shape;
        const Shape& to = y->tensor_type().shape;
        size_t lead = to.size() - from.size();
        for (size_t d = 0; d < to.size(); ++d) {
          bool broadcast = d < lead || (from[d - lead] == 1 && to[d] != 1);
          if (broadcast && to[d] != 1)
            y = b_.call1(OpId::kSlice, {y, static_cast<int64_t>(d), int64_t{0}, int64_t{1}}, {},
                         loc);
        }
        return b_.call1(OpId::kReshape, {y, Constant(IntList(from))}, {}, loc);
      }
      case OpId::kReshape:
        return b_.call1(OpId::kReshape, {y, Constant(IntList(x->tensor_type().shape))}, {}, loc);
      case OpId::kDetach:  // eager's base does not take the history of what a detached view got
        return b_.call1(OpId::kDetach, {y}, {}, loc);
      case OpId::kBitcast:  // the written bytes, read back as the viewed value's dtype
        return b_.call1(OpId::kBitcast, {y, Constant(x->tensor_type().dtype)}, {}, loc);
      default:
        KILN_ASSERT(false) << "no inverse for view step " << op_info(step.op).name;
        return nullptr;
    }
  }

  // ---- storages ------------------------------------------------------------------------------

  // The storage's contents as a fresh contiguous 1-D value in storage order (element i is the
  // storage's element canon.offset + i), which is what as_strided indexes.
  Value* flat(const StorageState& st, const SourceLoc& loc) {
    if (st.synthetic) return st.current;
    std::vector<int64_t> perm = argsort_desc(st.canon.strides);
    Value* v = st.current;
    if (!is_identity(perm)) v = b_.call1(OpId::kPermute, {v, Constant(IntList(perm))}, {}, loc);
    v = b_.call1(OpId::kReshape, {v, Constant(IntList{v->tensor_type().numel()})}, {}, loc);
    // cat of one tensor allocates: as_strided then indexes a contiguous buffer from offset 0,
    // whatever layout the reshape had.
    return b_.call1(OpId::kCat, {std::vector<Value*>{v}}, {}, loc);
  }

  // The inverse of flat: a storage-order 1-D value back in the storage's canonical shape.
  Value* unflat(const StorageState& st, Value* v, const SourceLoc& loc) {
    if (st.synthetic) return v;
    std::vector<int64_t> perm = argsort_desc(st.canon.strides);
    Shape permuted;
    for (int64_t p : perm)
      permuted.push_back(st.canon.sizes[static_cast<size_t>(p)]);
    v = b_.call1(OpId::kReshape, {v, Constant(IntList(permuted))}, {}, loc);
    if (is_identity(perm)) return v;
    IntList inverse(perm.size());
    for (size_t k = 0; k < perm.size(); ++k)
      inverse[static_cast<size_t>(perm[k])] = static_cast<int64_t>(k);
    return b_.call1(OpId::kPermute, {v, Constant(inverse)}, {}, loc);
  }

  Value* read(const Value* handle, const SourceLoc& loc = {}) {
    const Chain& c = chains_.at(handle);
    const StorageState& st = states_.at(c.storage);
    Value* v = c.from_flat ? flat(st, loc) : st.current;
    for (const ViewStep& step : c.steps)
      v = apply(step, v, loc);
    return v;
  }

  // Writes through a view that may repeat elements give an order-dependent result in eager
  // (TensorIterator writes one element after another); kiln computes writes as wholes, so it
  // says it cannot. Stride-0 repeats are eager's own error (raised by the storage analysis),
  // and fills write one value everywhere, so only value-dependent writes are checked.
  void check_writable(const Node& node, const Geometry& g, bool value_dependent) {
    if (!value_dependent) return;
    std::vector<size_t> dims;
    for (size_t d = 0; d < g.sizes.size(); ++d)
      if (g.sizes[d] > 1) dims.push_back(d);
    std::sort(dims.begin(), dims.end(),
              [&](size_t a, size_t b) { return g.strides[a] < g.strides[b]; });
    int64_t reach = 0;  // the largest offset the smaller dims span
    bool separated = true;
    for (size_t d : dims) {
      if (g.strides[d] <= reach) separated = false;
      reach += (g.sizes[d] - 1) * g.strides[d];
    }
    if (separated) return;
    std::vector<int64_t> seen = element_indices(g.sizes, g.strides, g.offset);
    std::sort(seen.begin(), seen.end());
    bool repeats = std::adjacent_find(seen.begin(), seen.end()) != seen.end();
    KILN_UNSUPPORTED(!repeats)
        << node.op->name << " writes into a tensor whose elements overlap in memory (sizes "
        << shape_str(g.sizes) << ", strides " << shape_str(g.strides)
        << "); eager's result depends on its write order. Clone the tensor first.";
  }

  void write(const Value* handle, Value* y, const Geometry& where, const SourceLoc& loc) {
    const Chain& c = chains_.at(handle);
    StorageState& st = states_.at(c.storage);
    bool repeats = std::any_of(c.steps.begin(), c.steps.end(),
                               [](const ViewStep& s) { return s.op == OpId::kExpand; });
    if (c.from_flat || repeats) {
      // Scatter into the storage directly, at the handle's own layout: unwinding the views one
      // by one would be ambiguous when they repeat elements (a view of an expanded tensor:
      // which copy holds the written value?), and a strided view of a base has no views to
      // unwind.
      Value* root = flat(st, loc);
      // The written value's bytes as the storage's dtype (the chain may read it as another).
      DType stored = root->tensor_type().dtype;
      if (y->tensor_type().dtype != stored)
        y = b_.call1(OpId::kBitcast, {y, Constant(stored)}, {}, loc);
      ViewStep step = as_strided_step(where, st.canon.offset);
      st.current = unflat(st, unapply(step, root, y, loc), loc);
      return;
    }
    Value* root = st.current;
    std::vector<Value*> xs = {root};
    for (const ViewStep& step : c.steps)
      xs.push_back(apply(step, xs.back(), loc));
    for (size_t i = c.steps.size(); i-- > 0;)
      y = unapply(c.steps[i], xs[i], y, loc);
    st.current = y;
  }

  // ---- the end: writebacks, returns, metadata ------------------------------------------------

  // Storages the program allocates that hold two or more of its returned tensor objects.
  std::set<int> shared_fresh_storages() const {
    std::map<int, std::set<int>> objects;  // storage -> returned objects in it
    for (const Value* o : eager_.outputs()) {
      if (!o->is_tensor()) continue;
      int storage = final_of(o).storage;
      if (sa_.storage(storage).input_group >= 0 || !states_.contains(storage)) continue;
      auto obj = object_.find(o);
      objects[storage].insert(obj != object_.end() ? obj->second
                                                   : -1 - static_cast<int>(objects.size()));
    }
    std::set<int> shared;
    for (const auto& [storage, objs] : objects)
      if (objs.size() > 1) shared.insert(storage);
    return shared;
  }

  void finish() {
    Trace& t = out_.trace;
    std::vector<Value*> values;
    std::vector<std::string> described;
    std::set<int> shared = shared_fresh_storages();
    std::map<int, int> storage_value;  // shared storage -> its whole value's index in values
    for (const Value* o : eager_.outputs()) {
      ReturnBinding r;
      auto obj = object_.find(o);
      if (obj != object_.end() && obj->second >= static_cast<int>(eager_.inputs().size()))
        obj = object_.end();  // an object the program made: not the caller's
      if (!o->is_tensor()) {
        r.kind = ReturnBinding::Kind::kValue;
        r.index = static_cast<int>(values.size());
        values.push_back(scalars_.at(o));
        described.push_back(values.back()->name());
      } else if (obj != object_.end()) {
        r.kind = ReturnBinding::Kind::kInputObject;
        r.index = obj->second;
        described.push_back("the caller's " +
                            eager_.inputs()[static_cast<size_t>(r.index)]->name());
      } else if (shared.contains(final_of(o).storage)) {
        int storage = final_of(o).storage;
        auto [at, fresh] = storage_value.try_emplace(storage, static_cast<int>(values.size()));
        if (fresh) values.push_back(states_.at(storage).current);
        r.kind = ReturnBinding::Kind::kFreshView;
        r.index = at->second;
        r.geometry = final_of(o).geometry;
        r.storage_numel = sa_.storage(storage).numel;
        r.storage_geometry = states_.at(storage).canon;
        r.dtype = view_dtype(o, sa_.storage(storage).dtype);
        described.push_back("a view of " + values[static_cast<size_t>(r.index)]->name() +
                            "'s storage " + geometry_str(r.geometry) + as_str(r.dtype));
      } else if (sa_.storage(final_of(o).storage).input_group >= 0) {
        r.kind = ReturnBinding::Kind::kInputView;
        r.index = sa_.storage(final_of(o).storage).input_group;
        r.geometry = final_of(o).geometry;
        r.dtype = view_dtype(o, sa_.storage(final_of(o).storage).dtype);
        described.push_back("a view of " + initial_[static_cast<size_t>(r.index)]->name() + " " +
                            geometry_str(r.geometry) + as_str(r.dtype));
      } else {
        r.kind = ReturnBinding::Kind::kValue;
        r.index = static_cast<int>(values.size());
        r.geometry = final_of(o).geometry;
        r.storage_numel = sa_.storage(final_of(o).storage).numel;
        values.push_back(read(o));
        described.push_back(values.back()->name());
      }
      out_.interface.returns.push_back(r);
    }
    for (const auto& [object, latest] : latest_) {
      const Geometry& now = final_of(latest).geometry;
      if (now == sa_.geometry_of(eager_.inputs()[static_cast<size_t>(object)])) continue;
      out_.interface.metadata.push_back({object, now});
    }
    std::sort(out_.interface.metadata.begin(), out_.interface.metadata.end(),
              [](const MetadataUpdate& a, const MetadataUpdate& b) { return a.arg < b.arg; });
    for (size_t g = 0; g < initial_.size(); ++g) {
      Value* now = states_.at(static_cast<int>(g)).current;
      if (now != initial_[g]) t.writebacks.emplace_back(initial_[g], now);
    }
    t.set_outputs(values);
    std::string returns = "returns: (";
    for (size_t i = 0; i < described.size(); ++i)
      returns += (i ? ", " : "") + described[i];
    t.notes.push_back(returns + ")");
    for (const MetadataUpdate& m : out_.interface.metadata) {
      t.notes.push_back("metadata: the caller's " +
                        eager_.inputs()[static_cast<size_t>(m.arg)]->name() + " becomes " +
                        geometry_str(m.geometry));
    }
  }

  // The layout the object `v` names has at the end of the program (after metadata mutations).
  const StorageAnalysis::Placement& final_of(const Value* v) const {
    return sa_.final_placement(sa_.handle_of(v));
  }

  // A returned view's dtype where it differs from its storage's (ReturnBinding::dtype).
  static std::optional<DType> view_dtype(const Value* o, DType storage) {
    DType d = o->tensor_type().dtype;
    return d == storage ? std::nullopt : std::optional<DType>(d);
  }

  static std::string as_str(const std::optional<DType>& d) {
    return d ? " as " + std::string(dtype_name(*d)) : "";
  }

  static std::string geometry_str(const Geometry& g) {
    TensorType t{DType::kFloat32, g.sizes, Device::cpu(), Layout{g.strides, g.offset}};
    std::string s = t.str();
    return s.substr(s.find('['));
  }

  const Trace& eager_;
  const AliasPattern& pattern_;
  const StorageAnalysis& sa_;
  const FunctionalizeOptions options_;
  FunctionalProgram out_;
  Builder b_;
  std::unordered_map<int, StorageState> states_;
  std::unordered_map<const Value*, Chain> chains_;
  std::unordered_map<const Value*, Value*> scalars_;
  std::unordered_map<const Value*, int> object_;                // tensor value -> its object
  std::unordered_map<int, std::vector<const Value*>> members_;  // object -> its names
  int next_object_ = 0;
  std::map<int, const Value*> latest_;  // caller object -> its latest value
  std::vector<Value*> initial_;         // each group's input value
};

}  // namespace

FunctionalProgram functionalize(const Trace& eager, const AliasPattern& pattern,
                                const StorageAnalysis& storage,
                                const FunctionalizeOptions& options) {
  return Functionalizer(eager, pattern, storage, options).run();
}

}  // namespace kiln
