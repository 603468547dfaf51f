#include "kiln/analysis/storage_analysis.h"

#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln {

int StorageAnalysis::new_handle(const Value* v, Placement p) {
  handles_.push_back(p);
  int id = static_cast<int>(handles_.size()) - 1;
  handle_of_[v] = id;
  place(v, std::move(p));
  return id;
}

void StorageAnalysis::name_handle(const Value* v, int handle) {
  handle_of_[v] = handle;
  place(v, handles_.at(static_cast<size_t>(handle)));
}

void StorageAnalysis::restride(int handle, Geometry g) {
  handles_.at(static_cast<size_t>(handle)).geometry = std::move(g);
}

namespace {

using Placement = StorageAnalysis::Placement;

std::optional<int64_t> optional_int(const Node& node, std::string_view name) {
  return node.arg(name).as_optional_int();
}

}  // namespace

Geometry apply_view(OpId view, const Node& node, const Geometry& g, int64_t origin) {
  switch (view) {
    case OpId::kPermute:
      return permute_geometry(g, node.arg("dims").as_ints());
    case OpId::kTranspose:
      return transpose_geometry(g, node.arg("dim0").as_int(), node.arg("dim1").as_int());
    case OpId::kT:
      return t_geometry(g);
    case OpId::kExpand:
      return expand_geometry(g, node.arg("size").as_ints());
    case OpId::kUnsqueeze:
      return unsqueeze_geometry(g, node.arg("dim").as_int());
    case OpId::kSqueeze:
      return squeeze_geometry(g, node.arg("dim").as_optional_ints());
    case OpId::kSlice:
      return slice_geometry(g, node.arg("dim").as_int(), optional_int(node, "start"),
                            optional_int(node, "end"), node.arg("step").as_int());
    case OpId::kNarrow:
      return narrow_geometry(g, node.arg("dim").as_int(), node.arg("start").as_int(),
                             node.arg("length").as_int());
    case OpId::kSelect:
      return select_geometry(g, node.arg("dim").as_int(), node.arg("index").as_int());
    case OpId::kDiagonal:
      return diagonal_geometry(g, node.arg("offset").as_int(), node.arg("dim1").as_int(),
                               node.arg("dim2").as_int());
    case OpId::kAsStrided: {
      std::optional<int64_t> offset = optional_int(node, "storage_offset");
      if (offset) *offset -= origin;
      return as_strided_geometry(g, node.arg("size").as_ints(), node.arg("stride").as_ints(),
                                 offset);
    }
    case OpId::kDetach:
    case OpId::kAlias:
    case OpId::kViewDtype:  // elements of one size: the same positions, another dtype
      return g;
    default:
      KILN_ASSERT(false) << op_info(view).name << " is not a single-output view with a fixed "
                         << "geometry";
      return g;
  }
}

namespace {

// The view a metadata mutation applies to its tensor object.
OpId view_of_metadata_mutation(OpId id) {
  switch (id) {
    case OpId::kT_:
      return OpId::kT;
    case OpId::kTranspose_:
      return OpId::kTranspose;
    case OpId::kUnsqueeze_:
      return OpId::kUnsqueeze;
    case OpId::kSqueeze_:
      return OpId::kSqueeze;
    case OpId::kAsStrided_:
      return OpId::kAsStrided;
    default:
      KILN_ASSERT(false) << op_info(id).name << " is not a metadata mutation";
      return id;
  }
}

// The view whose positions a scatter overwrites.
OpId view_of_scatter(OpId id) {
  switch (id) {
    case OpId::kSliceScatter:
      return OpId::kSlice;
    case OpId::kSelectScatter:
      return OpId::kSelect;
    case OpId::kDiagonalScatter:
      return OpId::kDiagonal;
    case OpId::kAsStridedScatter:
      return OpId::kAsStrided;
    default:
      KILN_ASSERT(false) << op_info(id).name << " is not a scatter";
      return id;
  }
}

// Python numbers that ATen passes to the kernel as parameters instead of wrapping them as 0-dim
// operands of the TensorIterator: clamp's bounds, pow's scalar exponent, lerp's scalar weight.
// They do not take part in choosing the output's layout. (The interpreter's elementwise.cpp has
// the same list; the differential tests keep the two in step.)
bool number_is_kernel_parameter(OpId id) {
  return id == OpId::kClamp || id == OpId::kPow || id == OpId::kLerp;
}

bool is_tensor_operand(const Operand& o) {
  return o.is_value() && o.value()->is_tensor();
}

// Abstract eager execution: the interpreter's reference functions with layouts and no data.
class Analyzer {
 public:
  explicit Analyzer(StorageAnalysis& sa) : sa_(sa) {}

  void bind_inputs(const Trace& trace, const AliasPattern& pattern);
  void run_node(const Node& node);

 private:
  // The current placement of the object `v` names (a metadata mutation may have moved it since
  // `v` was defined).
  const Placement& read(const Value* v) const { return sa_.final_placement(sa_.handle_of(v)); }
  const Placement& read(const Operand& o) const { return read(o.value()); }
  const StorageInfo& storage_of(const Placement& p) const { return sa_.storage(p.storage); }

  // `out` is a new object over `storage` (make_view: user error outside the storage).
  // A view of an input may reach caller memory outside the inputs kiln was given (eager allows
  // it when the caller's storage is larger): kiln cannot see that memory, so it says so.
  static void check_view_in_bounds(const Geometry& g, const StorageInfo& info) {
    bool outside =
        g.offset < 0 || (shape_numel(g.sizes) > 0 &&
                         required_storage_numel(g.sizes, g.strides, g.offset) > info.numel);
    KILN_UNSUPPORTED(info.input_group < 0 || !outside)
        << "this view reaches memory outside the input tensors kiln was given (the caller's "
           "storage may be larger); pass the whole base tensor as an input instead.";
    check_in_bounds(g, info.numel, info.dtype);
  }

  void define_view(const Value* out, int storage, Geometry g) {
    const StorageInfo& info = sa_.storage(storage);
    check_view_in_bounds(g, info);
    sa_.new_handle(out, Placement{storage, std::move(g)});
  }
  // `out` names the same object as `of` (in-place ops return their target).
  void define_same(const Value* out, const Value* of) { sa_.name_handle(out, sa_.handle_of(of)); }
  int new_storage(DType dtype, int64_t numel) {
    return sa_.add_storage(StorageInfo{numel, dtype, -1});
  }
  // `out` is a new tensor over a fresh storage just large enough for `strides` (empty_strided).
  void define_fresh(const Value* out, const Strides& strides) {
    const TensorType& t = out->tensor_type();
    Geometry g{t.shape, strides, 0};
    int storage = new_storage(t.dtype, required_storage_numel(g));
    sa_.new_handle(out, Placement{storage, std::move(g)});
  }
  void define_contiguous(const Value* out) {
    define_fresh(out, contiguous_strides(out->tensor_type().shape));
  }

  // dst.copy_(src) (rt_tensor.cpp copy_into): nothing to check when src is dst's exact memory,
  // else the TensorIterator overlap checks.
  static void check_copy(const Placement& dst, const Placement& src) {
    bool same_storage = dst.storage == src.storage;
    if (same_storage && dst.geometry == src.geometry) return;
    check_no_internal_overlap(dst.geometry);
    check_no_partial_overlap(dst.geometry, src.geometry, same_storage);
  }

  void elementwise(const Node& node);
  void view(const Node& node);
  void reshape(const Value* out, const Value* self);
  void scatter(const Node& node);
  void mutation(const Node& node);

  StorageAnalysis& sa_;
};

void Analyzer::bind_inputs(const Trace& trace, const AliasPattern& pattern) {
  KILN_CHECK(pattern.inputs.size() == trace.inputs().size())
      << "the alias pattern describes " << pattern.inputs.size() << " inputs but " << trace.name
      << " takes " << trace.inputs().size() << "; give one entry per input.";
  for (size_t g = 0; g < pattern.groups.size(); ++g) {
    const AliasPattern::Group& group = pattern.groups[g];
    sa_.add_storage(StorageInfo{group.numel, group.dtype, static_cast<int>(g)});
  }
  // Where each group's base starts in the caller's storage: the input types' layouts say where
  // the inputs are (no layout: offset 0), the pattern where they are in the base.
  for (size_t i = 0; i < trace.inputs().size(); ++i) {
    const Value* v = trace.inputs()[i];
    const AliasPattern::Input& in = pattern.inputs[i];
    if (!v->is_tensor() || in.group < 0 || static_cast<size_t>(in.group) >= pattern.groups.size())
      continue;
    int64_t caller = v->tensor_type().layout ? v->tensor_type().layout->offset : 0;
    sa_.storage_mut(in.group).caller_offset = caller - in.geometry.offset;
  }
  for (size_t i = 0; i < trace.inputs().size(); ++i) {
    const Value* v = trace.inputs()[i];
    const AliasPattern::Input& in = pattern.inputs[i];
    std::string what = "input " + std::to_string(i) + " ('" + v->name() + "')";
    if (!v->is_tensor()) {
      KILN_CHECK(in.group < 0) << "the alias pattern gives the number " << what << " a storage.";
      continue;
    }
    KILN_CHECK(in.group >= 0 && static_cast<size_t>(in.group) < pattern.groups.size())
        << "the alias pattern gives the tensor " << what << " no storage group.";
    const TensorType& t = v->tensor_type();
    KILN_CHECK(in.geometry.sizes == t.shape && in.geometry.strides.size() == t.shape.size() &&
               pattern.groups[static_cast<size_t>(in.group)].dtype == t.dtype)
        << "the alias pattern describes " << what << " as " << shape_str(in.geometry.sizes)
        << " of a " << dtype_name(pattern.groups[static_cast<size_t>(in.group)].dtype)
        << " base, but the trace takes " << t.str() << "; compute the pattern for this trace.";
    if (in.duplicate_of >= 0) {
      // The same tensor passed twice: one object, so a metadata mutation through either name is
      // seen through the other.
      KILN_CHECK(static_cast<size_t>(in.duplicate_of) < i &&
                 pattern.inputs[static_cast<size_t>(in.duplicate_of)].group == in.group &&
                 pattern.inputs[static_cast<size_t>(in.duplicate_of)].geometry == in.geometry)
          << "the alias pattern says " << what << " is input " << in.duplicate_of
          << ", but their storage or layout differ.";
      define_same(v, trace.inputs()[static_cast<size_t>(in.duplicate_of)]);
      continue;
    }
    KILN_CHECK(in.geometry.offset >= 0) << what << " has a negative storage offset.";
    Geometry g = in.geometry;
    // An input that is its own base is described as contiguous; its type's layout still has the
    // caller's real strides, which differ on size-1 dims and decide eager's overlap checks and
    // the strides of returned views.
    if (!pattern.groups[static_cast<size_t>(in.group)].synthetic && t.layout &&
        is_contiguous(t.shape, t.layout->strides))
      g.strides = t.layout->strides;
    define_view(v, in.group, g);
  }
}

void Analyzer::run_node(const Node& node) {
  ScopedErrorContext context(node.op->name, node.loc.str());
  // A decomposed op is exactly its subsymbols (as in the interpreter), but for its result's
  // layout where ATen's is not theirs (decomposed_result_strides). The result then gets a storage
  // of its own and the last subsymbol's stays behind, unread: storages here are names, nothing is
  // allocated from them, and the last subsymbol's result may be a view (`to` of the same dtype)
  // whose storage must keep its layout.
  if (!node.subsymbols.empty()) {
    for (const auto& sub : node.subsymbols)
      run_node(*sub);
    const Geometry& in = read(node.arg(0)).geometry;
    if (auto strides = decomposed_result_strides(node.id(), in.sizes, in.strides))
      define_fresh(node.outputs[0], *strides);
    return;
  }
  const OpInfo& op = *node.op;
  if (op.dtype_rule != DTypeRule::kNotElementwise) return elementwise(node);
  switch (op.kind) {
    case OpKind::kView:
      return view(node);
    case OpKind::kScatter:
      return scatter(node);
    case OpKind::kMutation:
      return mutation(node);
    case OpKind::kCreation:
      // The *_like ops and fill keep their input's layout (memory_format=preserve_format);
      // full/zeros/ones/arange are contiguous.
      if (op.params.at(0).kind == ParamKind::kTensor)
        return define_fresh(node.outputs[0], strides_like(read(node.arg(0)).geometry.sizes,
                                                          read(node.arg(0)).geometry.strides));
      return define_contiguous(node.outputs[0]);
    case OpKind::kIndex:
      // index_select, gather and wrap_index allocate their results contiguous; index_copy,
      // index_add and scatter are a clone of self (preserve_format) written into.
      if (node.id() == OpId::kIndexSelect || node.id() == OpId::kGather ||
          node.id() == OpId::kWrapIndex)
        return define_contiguous(node.outputs[0]);
      return define_fresh(node.outputs[0], strides_like(read(node.arg(0)).geometry.sizes,
                                                        read(node.arg(0)).geometry.strides));
    case OpKind::kOpaque:
      if (node.id() == OpId::kEagerCall) {
        // PyTorch makes these; tracing on meta tensors saw their layouts.
        std::vector<EagerResult> results = parse_eager_results(node.arg(2).as_string());
        for (size_t k = 0; k < node.outputs.size(); ++k)
          define_fresh(node.outputs[k], results.at(k).strides);
        return;
      }
      [[fallthrough]];
    case OpKind::kReduction:
    case OpKind::kJoin:
      // ATen allocates reductions, cat/stack and the matrix products contiguous; they only read
      // their operands (cat's and stack's copies go into the fresh output).
      return define_contiguous(node.outputs[0]);
    case OpKind::kElementwise:
    case OpKind::kComposite:
      break;
  }
  KILN_ASSERT(false) << op.name << " has no storage rule; a composite op must carry subsymbols";
}

void Analyzer::elementwise(const Node& node) {
  const OpInfo& op = *node.op;
  const Value* out = node.outputs[0];
  if (op.functional_form == OpId::kTo) {
    // Tensor.to(dtype) of a tensor that already has that dtype returns the tensor itself; else
    // it copies with memory_format=preserve_format, like empty_like.
    const Placement& self = read(node.arg(0));
    if (out->tensor_type().dtype == node.input(0)->tensor_type().dtype)
      return define_same(out, node.input(0));
    return define_fresh(out, strides_like(self.geometry.sizes, self.geometry.strides));
  }
  if (op.is_inplace_elementwise()) {
    // TensorIterator's memory-overlap checks, before anything is written.
    const Placement& target = read(node.arg(0));
    check_no_internal_overlap(target.geometry);
    for (int i = 1; i < op.arity; ++i) {
      const Operand& o = node.arg(static_cast<size_t>(i));
      if (!is_tensor_operand(o)) continue;
      const Placement& in = read(o);
      check_no_partial_overlap(target.geometry, in.geometry, in.storage == target.storage);
    }
    return define_same(out, node.input(0));
  }
  // A fresh output laid out by TensorIterator over the operands; a wrapped number is a 0-dim
  // operand (nullptr) unless the kernel takes it as a parameter.
  std::vector<const Geometry*> operands;
  for (int i = 0; i < op.arity; ++i) {
    const Operand& o = node.arg(static_cast<size_t>(i));
    if (o.is_none()) continue;
    if (is_tensor_operand(o))
      operands.push_back(&read(o).geometry);
    else if (!number_is_kernel_parameter(op.functional_form))
      operands.push_back(nullptr);
  }
  const Shape& shape = out->tensor_type().shape;
  define_fresh(out, elementwise_output_strides(shape, operands));
}

// reshape: a view when the strides allow one, else a view of a contiguous copy (a fresh storage
// that only the result refers to).
void Analyzer::reshape(const Value* out, const Value* self) {
  const Placement& p = read(self);
  const Shape& shape = out->tensor_type().shape;
  if (std::optional<Geometry> g = view_geometry(p.geometry, shape))
    return define_view(out, p.storage, *g);
  const Shape& sizes = p.geometry.sizes;
  int copy = new_storage(out->tensor_type().dtype, shape_numel(sizes));
  std::optional<Geometry> g = view_geometry(contiguous_geometry(sizes), shape);
  KILN_ASSERT(g.has_value()) << "a contiguous tensor must be viewable as any shape of its numel";
  define_view(out, copy, *g);
}

void Analyzer::view(const Node& node) {
  const Value* self = node.input(0);
  const Placement p = read(self);    // a copy: defining outputs may grow the handle table
  if (node.outputs.empty()) return;  // split/unbind of an empty dim: nothing to place
  const Value* out = node.outputs[0];
  switch (node.id()) {
    case OpId::kView:
    case OpId::kUnflatten: {
      std::optional<Geometry> g = view_geometry(p.geometry, out->tensor_type().shape);
      // The interpreter's ref_View message.
      KILN_CHECK(g.has_value())
          << "view size is not compatible with input tensor's size and stride (at least one "
             "dimension spans across two contiguous subspaces). Use .reshape(...) instead.";
      return define_view(out, p.storage, *g);
    }
    case OpId::kReshape:
      return reshape(out, self);
    case OpId::kFlatten: {
      auto rank = static_cast<int64_t>(p.geometry.sizes.size());
      // ATen's flatten returns the tensor itself (the same object) when there is nothing to merge.
      if (rank > 0 && wrap_dim(node.arg("start_dim").as_int(), rank) ==
                          wrap_dim(node.arg("end_dim").as_int(), rank)) {
        return define_same(out, self);
      }
      return reshape(out, self);
    }
    case OpId::kSplit:
    case OpId::kChunk: {
      // Consecutive narrows along `dim`, with the piece sizes the type rule chose.
      int64_t d = wrap_dim(node.arg("dim").as_int(), static_cast<int64_t>(p.geometry.sizes.size()));
      int64_t start = 0;
      for (const Value* piece : node.outputs) {
        int64_t length = piece->tensor_type().shape[static_cast<size_t>(d)];
        define_view(piece, p.storage, narrow_geometry(p.geometry, d, start, length));
        start += length;
      }
      return;
    }
    case OpId::kUnbind: {
      int64_t d = node.arg("dim").as_int();
      for (size_t i = 0; i < node.outputs.size(); ++i) {
        define_view(node.outputs[i], p.storage,
                    select_geometry(p.geometry, d, static_cast<int64_t>(i)));
      }
      return;
    }
    case OpId::kGetitem:
      KILN_ASSERT(false) << "getitem runs through its subsymbols, but this node has none";
      return;
    default:
      return define_view(out, p.storage,
                         apply_view(node.id(), node, p.geometry, storage_of(p).caller_offset));
  }
}

// A scatter is a copy of its input with the viewed positions overwritten by src. The copy is
// ATen's clone_preserve_strides (the input's layout over a copy of its whole storage) unless the
// input has internal overlap, which cannot keep its layout and is cloned contiguously.
void Analyzer::scatter(const Node& node) {
  const Placement self = read(node.arg(0));
  const Value* out = node.outputs[0];
  DType dtype = out->tensor_type().dtype;
  Placement result;
  if (has_internal_overlap(self.geometry)) {
    result.storage = new_storage(dtype, shape_numel(self.geometry.sizes));
    result.geometry = contiguous_geometry(self.geometry.sizes);
  } else {
    result.storage = new_storage(dtype, storage_of(self).numel);
    result.geometry = self.geometry;
    sa_.storage_mut(result.storage).caller_offset = storage_of(self).caller_offset;
  }
  Geometry slot = apply_view(view_of_scatter(node.id()), node, result.geometry,
                             sa_.storage(result.storage).caller_offset);
  check_in_bounds(slot, sa_.storage(result.storage).numel, dtype);
  check_copy(Placement{result.storage, slot}, read(node.arg(1)));
  sa_.new_handle(out, std::move(result));
}

void Analyzer::mutation(const Node& node) {
  const OpInfo& op = *node.op;
  const Value* self = node.input(0);
  if (op.is_metadata_mutation()) {
    // The tensor object itself takes the new layout (set_geometry: checked against its storage
    // first), and every name of the object sees it from now on.
    const Placement p = read(self);
    Geometry g = apply_view(view_of_metadata_mutation(node.id()), node, p.geometry,
                            storage_of(p).caller_offset);
    const StorageInfo& info = sa_.storage(p.storage);
    check_view_in_bounds(g, info);
    sa_.restride(sa_.handle_of(self), std::move(g));
    return define_same(node.outputs[0], self);
  }
  KILN_ASSERT(op.mutates_arg0()) << op.name << " is a mutation of an unknown kind";
  switch (node.id()) {
    case OpId::kFill_:
    case OpId::kZero_:
      // fill_ does not check for overlap: filling is idempotent, so
      // `x.expand(3, 3).fill_(1)` works in eager.
      break;
    case OpId::kCopy_:
      check_copy(read(self), read(node.arg(1)));
      break;
    default:
      KILN_ASSERT(false) << op.name << " runs through its subsymbols, but this node has none";
  }
  define_same(node.outputs[0], self);
}

}  // namespace

StorageAnalysis analyze_storage(const Trace& trace, const AliasPattern& pattern) {
  ScopedErrorContext context("analyze_storage", "");
  StorageAnalysis sa;
  Analyzer analyzer(sa);
  analyzer.bind_inputs(trace, pattern);
  for (const auto& node : trace.nodes())
    analyzer.run_node(*node);
  return sa;
}

}  // namespace kiln
