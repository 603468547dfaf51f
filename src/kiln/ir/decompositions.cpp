// Decompositions: ops recorded with the primitives they lower to as subsymbols. The reference
// interpreter runs the subsymbols; later passes may inline them.
#include <cmath>
#include <unordered_map>

#include "kiln/ir/builder.h"
#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

DType type_of(Value* v) {
  return v->tensor_type().dtype;
}

IntList trailing_dims(int64_t rank, size_t count) {
  IntList dims;
  for (int64_t i = rank - static_cast<int64_t>(count); i < rank; ++i)
    dims.push_back(i);
  return dims;
}

// f16 and bf16 softmaxes and normalizations compute in f32, as PyTorch's kernels do.
bool needs_upcast(DType d) {
  return d == DType::kFloat16 || d == DType::kBFloat16;
}

std::vector<Value*> decompose_softmax(Builder& b, const Node& n) {
  const SourceLoc& loc = n.loc;
  Value* x = n.input(0);
  int64_t dim = n.arg("dim").as_int();
  if (auto d = n.arg("dtype").as_optional_dtype())
    x = b.call1(OpId::kTo, {x, Constant(*d)}, {}, loc);
  // f16 and bf16 in f32, rounded once at the end, as PyTorch's softmax kernels do (rounding
  // every step put 2% errors into the bf16 softmax of rows of 8).
  const DType dtype = type_of(x);
  if (needs_upcast(dtype)) x = b.call1(OpId::kTo, {x, Constant(DType::kFloat32)}, {}, loc);
  // The row's max only shifts the exponentials against overflow: the result does not depend on
  // it, and it is detached so that differentiating the decomposition gives eager's gradient
  // (g - softmax * sum(g)) without a gradient through the max (which is zero, but computed as a
  // difference of rounded sums, two more passes over the row, and not exactly zero).
  Value* m = b.call1(OpId::kDetach,
                     {b.call1(OpId::kAmax, {x, Constant(IntList{dim}), true}, {}, loc)}, {}, loc);
  Value* s = b.call1(OpId::kSub, {x, m}, {}, loc);
  Value* e = b.call1(OpId::kExp, {s}, {}, loc);
  Value* z = b.call1(OpId::kSum, {e, Constant(IntList{dim}), true}, {}, loc);
  // The normalization as eager's kernel for the device does it: on the CPU the row's exponentials
  // times the sum's reciprocal (ATen's vectorized softmax; it matched eager's float32 softmax of
  // random 2-element rows at 95.6% of the elements against the quotient's 86.3%, and a multiply
  // is cheaper than a division), on CUDA their quotient by the sum.
  // (Statements, not one conditional expression: GCC 12 destroys the braced operand lists of a
  // ?: twice when a call in it throws, as a bad trace's type error does; ASan caught it.)
  Value* y = nullptr;
  if (n.id() == OpId::kLogSoftmax) {
    y = b.call1(OpId::kSub, {s, b.call1(OpId::kLog, {z}, {}, loc)}, {}, loc);
  } else if (x->tensor_type().device.kind == Device::Kind::kCpu) {
    Value* r = b.call1(OpId::kReciprocal, {z}, {}, loc);
    y = b.call1(OpId::kMul, {e, r}, {}, loc);
  } else {
    y = b.call1(OpId::kDiv, {e, z}, {}, loc);
  }
  if (type_of(y) != dtype) y = b.call1(OpId::kTo, {y, Constant(dtype)}, {}, loc);
  return {y};
}

std::vector<Value*> decompose_norm(Builder& b, const Node& n) {
  const SourceLoc& loc = n.loc;
  Value* x = n.input(0);
  DType dtype = type_of(x);
  const IntList& ns = n.arg("normalized_shape").as_ints();
  Constant dims = trailing_dims(x->tensor_type().rank(), ns.size());
  if (needs_upcast(dtype)) x = b.call1(OpId::kTo, {x, Constant(DType::kFloat32)}, {}, loc);
  Value* y;
  if (n.id() == OpId::kLayerNorm) {
    Value* mean = b.call1(OpId::kMean, {x, dims, true}, {}, loc);
    Value* centered = b.call1(OpId::kSub, {x, mean}, {}, loc);
    // The variance as the mean of the centered squares, not a var node: its pass reads the
    // centered row the output needs anyway, and the row's mean is summed once (a var node's own
    // mean is summed exactly, in double on CUDA too: emit_reduction.cpp).
    Value* squares = b.call1(OpId::kMul, {centered, centered}, {}, loc);
    Value* var = b.call1(OpId::kMean, {squares, dims, true}, {}, loc);
    Value* shifted = b.call1(OpId::kAdd, {var, n.arg("eps")}, {}, loc);
    Value* r = b.call1(OpId::kRsqrt, {shifted}, {}, loc);
    y = b.call1(OpId::kMul, {centered, r}, {}, loc);
  } else {
    Operand eps = n.arg("eps");
    if (eps.is_none()) {
      // torch.finfo(dtype).eps of the input's dtype.
      double e = dtype == DType::kFloat64    ? 2.220446049250313e-16
                 : dtype == DType::kFloat16  ? 0.0009765625
                 : dtype == DType::kBFloat16 ? 0.0078125
                                             : 1.1920928955078125e-07;
      eps = Operand(e);
    }
    Value* sq = b.call1(OpId::kMul, {x, x}, {}, loc);
    Value* ms = b.call1(OpId::kMean, {sq, dims, true}, {}, loc);
    Value* shifted = b.call1(OpId::kAdd, {ms, eps}, {}, loc);
    Value* r = b.call1(OpId::kRsqrt, {shifted}, {}, loc);
    y = b.call1(OpId::kMul, {x, r}, {}, loc);
  }
  int wi = n.op->param_index("weight"), bi = n.op->param_index("bias");
  if (wi >= 0 && !n.arg(static_cast<size_t>(wi)).is_none())
    y = b.call1(OpId::kMul, {y, n.arg(static_cast<size_t>(wi))}, {}, loc);
  if (bi >= 0 && !n.arg(static_cast<size_t>(bi)).is_none())
    y = b.call1(OpId::kAdd, {y, n.arg(static_cast<size_t>(bi))}, {}, loc);
  if (type_of(y) != dtype) y = b.call1(OpId::kTo, {y, Constant(dtype)}, {}, loc);
  return {y};
}

// x[key] as select / slice / unsqueeze steps; an empty key is an alias of x.
Value* index_view(Builder& b, Value* x, const IndexKey& key, const SourceLoc& loc) {
  std::vector<IndexStep> steps = lower_index_key(x->tensor_type().shape, key, nullptr);
  if (steps.empty()) return b.call1(OpId::kAlias, {x}, {}, loc);
  for (const IndexStep& s : steps) {
    switch (s.op) {
      case OpId::kSelect:
        x = b.call1(OpId::kSelect, {x, s.dim, s.a}, {}, loc);
        break;
      case OpId::kSlice:
        x = b.call1(OpId::kSlice, {x, s.dim, s.a, s.b, s.step}, {}, loc);
        break;
      default:
        x = b.call1(OpId::kUnsqueeze, {x, s.dim}, {}, loc);
        break;
    }
  }
  return x;
}

std::vector<Value*> decompose_getitem(Builder& b, const Node& n) {
  return {index_view(b, n.input(0), n.arg("index").as_index(), n.loc)};
}

std::vector<Value*> decompose_setitem(Builder& b, const Node& n) {
  Value* view = index_view(b, n.input(0), n.arg("index").as_index(), n.loc);
  const Operand& value = n.arg("value");
  if (value.is_value() && value.value()->is_tensor()) {
    // As eager's copy_to assigns it, which decides which overlap checks apply: a value of the
    // view's shape is copied as it is (copy_'s checks); a 0-dim value in host memory fills the
    // view (no check: y[1:] = y[-1] works); any other is copied broadcast, without its leading
    // size-1 dims (infer_setitem_), through an expand that leaves its stride-0 form to copy_'s
    // checks (which do not decide for it, as eager's do not).
    Value* v = value.value();
    const TensorType& vt = v->tensor_type();
    const Shape& target = view->tensor_type().shape;
    if (vt.shape == target) {
      b.call(OpId::kCopy_, {view, v}, {}, n.loc);
      return {};
    }
    // (A host value written into device memory is copied: no overlap to check across devices.)
    if (vt.rank() == 0 && vt.device.kind == Device::Kind::kCpu &&
        view->tensor_type().device.kind == Device::Kind::kCpu) {
      b.call(OpId::kFill_, {view, v}, {}, n.loc);
      return {};
    }
    IntList leading;
    for (int64_t d = 0; d < vt.rank() && vt.shape[d] == 1; ++d)
      leading.push_back(d);
    if (!leading.empty()) v = b.call1(OpId::kSqueeze, {v, Constant(leading)}, {}, n.loc);
    if (v->tensor_type().shape != target)
      v = b.call1(OpId::kExpand, {v, Constant(IntList(target.begin(), target.end()))}, {}, n.loc);
    b.call(OpId::kCopy_, {view, v}, {}, n.loc);
  } else
    b.call(OpId::kFill_, {view, value}, {}, n.loc);
  return {};
}

}  // namespace

Decomposition find_decomposition(OpId id) {
  static const std::unordered_map<OpId, Decomposition> table = {
      {OpId::kSoftmax, &decompose_softmax}, {OpId::kLogSoftmax, &decompose_softmax},
      {OpId::kLayerNorm, &decompose_norm},  {OpId::kRmsNorm, &decompose_norm},
      {OpId::kGetitem, &decompose_getitem}, {OpId::kSetitem_, &decompose_setitem},
  };
  auto it = table.find(id);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace kiln
