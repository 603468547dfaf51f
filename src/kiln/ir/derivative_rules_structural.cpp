// The derivative rules of the structural ops: views (a view's gradient is its inverse scatter
// into zeros), the functional scatters functionalization makes (the gradient splits between the
// positions the scatter kept and the ones it wrote), index reads and writes, joins, and the
// matrix products. The formulas are PyTorch's (derivatives.yaml).
//
//   y = slice(a, 1, 2, 7)                ->  ga = slice_scatter(zeros(a), g, 1, 2, 7)
//   y = slice_scatter(s, src, 1, 2, 7)   ->  gs = slice_scatter(g, zeros(src), 1, 2, 7)
//                                            gsrc = slice(g, 1, 2, 7)
#include <algorithm>
#include <unordered_map>

#include "kiln/ir/derivative_rules.h"
#include "kiln/ir/dtype.h"
#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

using grad::shape_of;
using grad::zeros_of;

Value* call(GradContext& c, OpId op, std::vector<Operand> args, KeywordArgs kwargs = {}) {
  return c.b.call1(op, std::move(args), std::move(kwargs));
}
IntList ints(const Shape& s) {
  return IntList(s.begin(), s.end());
}
int64_t rank_of(Value* v) {
  return static_cast<int64_t>(shape_of(v).size());
}

// ---- views ------------------------------------------------------------------------------------

void view(GradContext& c, const Node& n, std::span<Value* const> grads) {
  Value* a = n.input(0);
  if (!c.needs(a)) return;
  if (n.outputs.size() > 1) {  // split, chunk, unbind: the pieces joined back, zeros for none
    std::vector<Value*> pieces;
    for (size_t i = 0; i < n.outputs.size(); ++i)
      pieces.push_back(grads[i] ? grads[i] : zeros_of(c.b, n.outputs[i]));
    const int64_t dim = n.arg("dim").as_int();
    c.accumulate(
        a, call(c, n.id() == OpId::kUnbind ? OpId::kStack : OpId::kCat, {Operand(pieces), dim}));
    return;
  }
  Value* g = grads[0];
  if (!g) return;
  auto args_from = [&](size_t first) {
    std::vector<Operand> args{zeros_of(c.b, a), g};
    for (size_t i = first; i < n.operands.size(); ++i)
      args.push_back(n.operands[i]);
    return args;
  };
  switch (n.id()) {
    case OpId::kView:
    case OpId::kReshape:
    case OpId::kFlatten:
    case OpId::kUnflatten:
    case OpId::kSqueeze:
    case OpId::kUnsqueeze:
      c.accumulate(a, call(c, OpId::kReshape, {g, Constant(ints(shape_of(a)))}));
      return;
    case OpId::kPermute: {
      const IntList& dims = n.arg("dims").as_ints();
      IntList inverse(dims.size());
      for (size_t i = 0; i < dims.size(); ++i)
        inverse[static_cast<size_t>(wrap_dim(dims[i], rank_of(a)))] = static_cast<int64_t>(i);
      c.accumulate(a, call(c, OpId::kPermute, {g, Constant(inverse)}));
      return;
    }
    case OpId::kTranspose:
      c.accumulate(a, call(c, OpId::kTranspose, {g, n.arg(1), n.arg(2)}));
      return;
    case OpId::kT:
      c.accumulate(a, call(c, OpId::kT, {g}));
      return;
    case OpId::kExpand:
    case OpId::kAlias:
      c.accumulate(a, g);
      return;  // accumulate sums what expand broadcast
    case OpId::kSlice:
      c.accumulate(a, call(c, OpId::kSliceScatter, args_from(1)));
      return;
    case OpId::kSelect:
      c.accumulate(a, call(c, OpId::kSelectScatter, args_from(1)));
      return;
    case OpId::kDiagonal:
      c.accumulate(a, call(c, OpId::kDiagonalScatter, args_from(1)));
      return;
    case OpId::kNarrow: {
      const int64_t dim = n.arg("dim").as_int();
      const int64_t size = shape_of(a)[static_cast<size_t>(wrap_dim(dim, rank_of(a)))];
      int64_t start = n.arg("start").as_int();
      if (start < 0) start += size;
      const int64_t end = start + n.arg("length").as_int();
      c.accumulate(a, call(c, OpId::kSliceScatter, {zeros_of(c.b, a), g, dim, start, end, 1}));
      return;
    }
    default:
      throw NoDerivative("kiln has no derivative rule for " + n.op->name);
  }
}

// Whether a strided view reaches any element twice (then its gradient would be a scatter-add,
// which kiln's as_strided_scatter is not): dims by stride, each stride past the others' extent.
bool overlaps_itself(const IntList& sizes, const IntList& strides) {
  std::vector<size_t> dims;
  for (size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] > 1) dims.push_back(d);
  std::sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return strides[a] < strides[b]; });
  int64_t extent = 0;  // the largest offset the smaller dims reach
  for (size_t d : dims) {
    if (strides[d] <= extent) return true;
    extent += (sizes[d] - 1) * strides[d];
  }
  return false;
}

// as_strided(self, size, stride, offset) and its scatter, on the 1-D storage-order values
// functionalization applies them to.
void as_strided(GradContext& c, const Node& n, std::span<Value* const> grads) {
  Value* g = grads[0];
  if (!g) return;
  const Operand size = n.arg("size"), stride = n.arg("stride"), offset = n.arg("storage_offset");
  if (overlaps_itself(size.as_ints(), stride.as_ints()))
    throw NoDerivative(
        "kiln differentiates as_strided only for views that reach each element once");
  Value* self = n.input(0);
  if (n.id() == OpId::kAsStrided) {
    if (c.needs(self))
      c.accumulate(
          self, call(c, OpId::kAsStridedScatter, {zeros_of(c.b, self), g, size, stride, offset}));
    return;
  }
  Value* src = n.input(1);
  if (c.needs(self))
    c.accumulate(self,
                 call(c, OpId::kAsStridedScatter, {g, zeros_of(c.b, src), size, stride, offset}));
  if (c.needs(src)) c.accumulate(src, call(c, OpId::kAsStrided, {g, size, stride, offset}));
}

// slice_scatter / select_scatter / diagonal_scatter(self, src, view arguments...).
void scatter_of_view(GradContext& c, const Node& n, std::span<Value* const> grads) {
  Value* g = grads[0];
  if (!g) return;
  Value* self = n.input(0);
  Value* src = n.input(1);
  std::vector<Operand> view_args(n.operands.begin() + 2, n.operands.end());
  if (c.needs(self)) {
    std::vector<Operand> args{g, zeros_of(c.b, src)};
    args.insert(args.end(), view_args.begin(), view_args.end());
    c.accumulate(self, call(c, n.id(), std::move(args)));
  }
  if (c.needs(src)) {
    const OpId view_op = n.id() == OpId::kSliceScatter    ? OpId::kSlice
                         : n.id() == OpId::kSelectScatter ? OpId::kSelect
                                                          : OpId::kDiagonal;
    std::vector<Operand> args{g};
    args.insert(args.end(), view_args.begin(), view_args.end());
    c.accumulate(src, call(c, view_op, std::move(args)));
  }
}

// ---- index reads and writes -------------------------------------------------------------------

// scatter(self, dim, index, src, reduce, include_self): replace and sum pass the gradient to the
// positions each value reached; amax and amin share it evenly among the values equal to the
// result (PyTorch's scatter_reduce backward).
void scatter(GradContext& c, const Node& n, Value* g) {
  Value* self = n.input(0);
  Value* src = n.arg("src").value();
  const Operand dim = n.arg("dim");
  auto index = [&] { return c.forward(n.arg("index").value()); };
  const Operand& reduce_arg = n.arg("reduce");
  const std::string reduce = reduce_arg.is_none() ? "" : reduce_arg.as_string();
  const bool include_self = n.arg("include_self").as_bool();
  if (c.needs(src) && shape_of(n.arg("index").value()) != shape_of(src))
    throw NoDerivative("kiln differentiates scatter's src only when the index has its shape");
  auto zero_where_reached = [&](Value* v) {
    return call(c, OpId::kScatter, {v, dim, index(), zeros_of(c.b, src)});
  };
  if (reduce.empty() || reduce == "sum") {
    if (c.needs(self))
      c.accumulate(self, reduce == "sum" && include_self ? g : zero_where_reached(g));
    if (c.needs(src)) c.accumulate(src, call(c, OpId::kGather, {g, dim, index()}));
    return;
  }
  if (reduce != "amax" && reduce != "amin")
    throw NoDerivative("kiln has no derivative rule for scatter with reduce=\"" + reduce + "\"");
  const DType dtype = g->tensor_type().dtype;
  Value* y = c.forward(n.outputs[0]);
  Value* self_hit = call(c, OpId::kEq, {c.forward(self), y});
  Value* src_hit = call(c, OpId::kEq, {c.forward(src), call(c, OpId::kGather, {y, dim, index()})});
  Value* count =
      call(c, OpId::kScatter,
           {grad::cast_to(c.b, self_hit, dtype), dim, index(), grad::cast_to(c.b, src_hit, dtype)},
           {{"reduce", Constant(std::string("sum"))}});
  Value* share = call(c, OpId::kDiv, {g, count});
  // Eager counts a self equal to the result even where include_self=False left it out, then
  // gives self nothing there: so does this.
  if (c.needs(self)) {
    Value* gs = call(c, OpId::kWhere, {self_hit, share, 0.0});
    c.accumulate(self, include_self ? gs : zero_where_reached(gs));
  }
  if (c.needs(src))
    c.accumulate(
        src, call(c, OpId::kWhere, {src_hit, call(c, OpId::kGather, {share, dim, index()}), 0.0}));
}

void index_op(GradContext& c, const Node& n, std::span<Value* const> grads) {
  Value* g = grads[0];
  if (!g) return;
  Value* self = n.input(0);
  const Operand dim = n.arg("dim");
  auto index = [&] { return c.forward(n.arg("index").value()); };
  switch (n.id()) {
    case OpId::kIndexSelect:
      if (c.needs(self))
        c.accumulate(self, call(c, OpId::kIndexAdd, {zeros_of(c.b, self), dim, index(), g}));
      return;
    case OpId::kGather:
      if (c.needs(self))
        c.accumulate(self, call(c, OpId::kScatter, {zeros_of(c.b, self), dim, index(), g},
                                {{"reduce", Constant(std::string("sum"))}}));
      return;
    case OpId::kIndexCopy:
    case OpId::kIndexAdd: {
      Value* source = n.arg("source").value();
      const bool copy = n.id() == OpId::kIndexCopy;
      if (c.needs(self))
        c.accumulate(
            self, copy ? call(c, OpId::kIndexCopy, {g, dim, index(), zeros_of(c.b, source)}) : g);
      if (c.needs(source)) {
        Value* picked = call(c, OpId::kIndexSelect, {g, dim, index()});
        if (!copy) picked = call(c, OpId::kMul, {picked, grad::operand(c, n.arg("alpha"))});
        c.accumulate(source, rank_of(source) == 0
                                 ? call(c, OpId::kReshape, {picked, Constant(IntList{})})
                                 : picked);
      }
      return;
    }
    case OpId::kScatter:
      return scatter(c, n, g);
    default:
      throw NoDerivative("kiln has no derivative rule for " + n.op->name);
  }
}

// ---- joins ------------------------------------------------------------------------------------

void join(GradContext& c, const Node& n, std::span<Value* const> grads) {
  Value* g = grads[0];
  if (!g) return;
  const std::vector<Value*>& parts = n.arg(0).values();
  const int64_t dim = n.arg(1).as_int();
  int64_t offset = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    Value* p = parts[i];
    if (n.id() == OpId::kStack) {
      if (c.needs(p)) c.accumulate(p, call(c, OpId::kSelect, {g, dim, static_cast<int64_t>(i)}));
      continue;
    }
    // cat skips 1-D empty tensors whatever the dim (a legacy rule eager keeps).
    if (shape_of(p) == Shape{0} && rank_of(g) != 1) continue;
    const int64_t d = wrap_dim(dim, rank_of(g));
    const int64_t size = shape_of(p)[static_cast<size_t>(d)];
    if (c.needs(p)) c.accumulate(p, call(c, OpId::kSlice, {g, d, offset, offset + size, 1}));
    offset += size;
  }
}

// ---- matrix products --------------------------------------------------------------------------

Value* transpose_last(GradContext& c, Value* v) {
  return call(c, OpId::kTranspose, {v, -2, -1});
}

// Rows of a [..., k] value as one [rows, k] matrix.
Value* as_rows(GradContext& c, Value* v) {
  return call(c, OpId::kReshape, {v, Constant(IntList{-1, shape_of(v).back()})});
}

void matmul(GradContext& c, const Node& n, std::span<Value* const> grads) {
  Value* g = grads[0];
  if (!g) return;
  Value* a0 = n.input(0);
  Value* b0 = n.input(1);
  const bool need_a = c.needs(a0), need_b = c.needs(b0);
  if (n.id() == OpId::kBmm) {
    if (need_a) c.accumulate(a0, call(c, OpId::kBmm, {g, transpose_last(c, c.forward(b0))}));
    if (need_b) c.accumulate(b0, call(c, OpId::kBmm, {transpose_last(c, c.forward(a0)), g}));
    return;
  }
  const int64_t ra = rank_of(a0), rb = rank_of(b0);
  if (ra == 1 && rb == 1) {  // a dot product
    if (need_a) c.accumulate(a0, call(c, OpId::kMul, {g, c.forward(b0)}));
    if (need_b) c.accumulate(b0, call(c, OpId::kMul, {g, c.forward(a0)}));
    return;
  }
  // Vectors become matrices (a row on the left, a column on the right), as matmul treats them.
  Value* gm = g;
  if (ra == 1) gm = call(c, OpId::kUnsqueeze, {gm, -2});
  if (rb == 1) gm = call(c, OpId::kUnsqueeze, {gm, -1});
  auto a = [&] { return ra == 1 ? call(c, OpId::kUnsqueeze, {c.forward(a0), 0}) : c.forward(a0); };
  auto b = [&] { return rb == 1 ? call(c, OpId::kUnsqueeze, {c.forward(b0), -1}) : c.forward(b0); };
  if (need_a) {
    Value* ga = call(c, OpId::kMatmul, {gm, transpose_last(c, b())});
    if (ra == 1) ga = call(c, OpId::kSqueeze, {ga, Constant(IntList{-2})});
    c.accumulate(a0, ga);
  }
  if (need_b) {
    // A batch of rows times a matrix: one [k, rows] x [rows, n] product, not a batched one
    // summed afterwards.
    Value* gb = ra > 2 && rb == 2
                    ? call(c, OpId::kMatmul, {transpose_last(c, as_rows(c, a())), as_rows(c, gm)})
                    : call(c, OpId::kMatmul, {transpose_last(c, a()), gm});
    if (rb == 1) gb = call(c, OpId::kSqueeze, {gb, Constant(IntList{-1})});
    c.accumulate(b0, gb);
  }
}

// linear(x, W, b) = x W^T + b.
void linear(GradContext& c, const Node& n, std::span<Value* const> grads) {
  Value* g = grads[0];
  if (!g) return;
  Value* x = n.input(0);
  Value* w = n.input(1);
  if (rank_of(w) != 2) throw NoDerivative("kiln differentiates linear only with a 2-D weight");
  if (c.needs(x)) c.accumulate(x, call(c, OpId::kMatmul, {g, c.forward(w)}));
  if (c.needs(w)) {
    Value* g_rows = rank_of(g) == 1 ? call(c, OpId::kUnsqueeze, {g, 0}) : as_rows(c, g);
    Value* x_rows =
        rank_of(x) == 1 ? call(c, OpId::kUnsqueeze, {c.forward(x), 0}) : as_rows(c, c.forward(x));
    c.accumulate(w, call(c, OpId::kMatmul, {call(c, OpId::kT, {g_rows}), x_rows}));
  }
  const Operand& bias = n.arg("bias");
  if (!bias.is_none() && c.needs(bias.value())) c.accumulate(bias.value(), g);
}

// ---- eager steps
// ----------------------------------------------------------------------------------

// eager_call: its gradient is PyTorch's, an eager step of the backward (the `vjp` function the
// tracer registered runs the op again with grad on and returns torch.autograd.grad of it).
void eager_step(GradContext& c, const Node& n, std::span<Value* const> grads) {
  const int64_t vjp = n.arg("vjp").as_int();
  if (vjp < 0) throw NoDerivative("an op PyTorch runs as an eager step has no gradient here");
  const std::vector<Value*>& inputs = n.arg(1).values();
  std::vector<Value*> args;
  for (Value* v : inputs)
    args.push_back(c.forward(v));
  for (int64_t i : n.arg("vjp_outputs").as_ints()) {
    Value* g = grads[static_cast<size_t>(i)];
    args.push_back(g ? g : zeros_of(c.b, n.outputs[static_cast<size_t>(i)]));
  }
  std::vector<Value*> got =
      c.b.call(OpId::kEagerCall, {Operand(vjp), Operand(args), n.arg("vjp_results")});
  size_t k = 0;
  for (Value* v : inputs) {
    if (!is_floating(v->tensor_type().dtype)) continue;
    KILN_ASSERT(k < got.size())
        << "eager_call's vjp_results has fewer entries than floating inputs";
    c.accumulate(v, got[k++]);
  }
}

}  // namespace

DerivativeRule find_structural_derivative_rule(OpId id) {
  static const std::unordered_map<OpId, DerivativeRule> table = {
      {OpId::kView, &view},
      {OpId::kReshape, &view},
      {OpId::kFlatten, &view},
      {OpId::kUnflatten, &view},
      {OpId::kSqueeze, &view},
      {OpId::kUnsqueeze, &view},
      {OpId::kPermute, &view},
      {OpId::kTranspose, &view},
      {OpId::kT, &view},
      {OpId::kExpand, &view},
      {OpId::kAlias, &view},
      {OpId::kSlice, &view},
      {OpId::kSelect, &view},
      {OpId::kDiagonal, &view},
      {OpId::kNarrow, &view},
      {OpId::kSplit, &view},
      {OpId::kChunk, &view},
      {OpId::kUnbind, &view},
      {OpId::kAsStrided, &as_strided},
      {OpId::kAsStridedScatter, &as_strided},
      {OpId::kSliceScatter, &scatter_of_view},
      {OpId::kSelectScatter, &scatter_of_view},
      {OpId::kDiagonalScatter, &scatter_of_view},
      {OpId::kIndexSelect, &index_op},
      {OpId::kGather, &index_op},
      {OpId::kIndexCopy, &index_op},
      {OpId::kIndexAdd, &index_op},
      {OpId::kScatter, &index_op},
      {OpId::kCat, &join},
      {OpId::kStack, &join},
      {OpId::kMatmul, &matmul},
      {OpId::kBmm, &matmul},
      {OpId::kLinear, &linear},
      {OpId::kEagerCall, &eager_step},
  };
  auto it = table.find(id);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace kiln
