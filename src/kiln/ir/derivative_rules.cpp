// The derivative rules of the elementwise ops, casts, reductions and fill (the structural ops'
// are in derivative_rules_structural.cpp). The formulas are PyTorch's (tools/autograd's
// derivatives.yaml), so that gradients agree with eager's up to rounding: where eager's formula
// picks a subgradient (relu at 0, maximum at a tie, abs at 0), this one picks the same.
#include "kiln/ir/derivative_rules.h"

#include <cmath>
#include <numbers>
#include <unordered_map>

#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln {

namespace grad {

const Shape& shape_of(Value* v) {
  return v->tensor_type().shape;
}

Value* cast_to(Builder& b, Value* g, DType dtype) {
  if (g->tensor_type().dtype == dtype) return g;
  return b.call1(OpId::kTo, {g, Constant(dtype)});
}

Value* sum_to(Builder& b, Value* g, const Shape& shape) {
  const Shape& from = shape_of(g);
  if (from == shape) return g;
  // Sum the leading dims broadcasting added and the dims it stretched from 1, keeping them,
  // then drop the leading ones with a reshape: one reduction.
  const size_t lead = from.size() - shape.size();
  IntList dims;
  for (size_t i = 0; i < from.size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && from[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  Value* s = dims.empty() ? g : b.call1(OpId::kSum, {g, Constant(dims), true});
  return b.call1(OpId::kReshape, {s, Constant(IntList(shape.begin(), shape.end()))});
}

Value* zeros_of(Builder& b, Value* like) {
  const TensorType& t = like->tensor_type();
  return b.call1(OpId::kZeros, {Constant(IntList(t.shape.begin(), t.shape.end()))},
                 {{"dtype", Constant(t.dtype)}, {"device", Constant(t.device)}});
}

Operand operand(GradContext& c, const Operand& o) {
  if (o.is_value()) return c.forward(o.value());
  return o;
}

}  // namespace grad

namespace {

using grad::operand;

Value* call(GradContext& c, OpId op, std::vector<Operand> args, KeywordArgs kwargs = {}) {
  return c.b.call1(op, std::move(args), std::move(kwargs));
}
// g * 1 is g: a gradient is floating, and a number never changes a floating tensor's dtype (an
// add's alpha of 1 made every residual's gradient a multiply that kernels computed and rounded).
Value* mul(GradContext& c, Operand a, Operand b) {
  if (a.is_value() && a.value()->is_tensor() && is_floating(a.value()->tensor_type().dtype) &&
      b.is_constant() && is_number(b.constant()) && number_as_double(b.constant()) == 1.0)
    return a.value();
  return call(c, OpId::kMul, {a, b});
}
Value* div(GradContext& c, Operand a, Operand b) {
  return call(c, OpId::kDiv, {a, b});
}
Value* add(GradContext& c, Operand a, Operand b) {
  return call(c, OpId::kAdd, {a, b});
}
Value* sub(GradContext& c, Operand a, Operand b) {
  return call(c, OpId::kSub, {a, b});
}
Value* neg(GradContext& c, Operand a) {
  return call(c, OpId::kNeg, {a});
}
Value* one_minus(GradContext& c, Operand a) {
  return add(c, neg(c, a), 1.0);
}
Value* zero_where_not(GradContext& c, Value* mask, Value* g) {
  return call(c, OpId::kWhere, {mask, g, 0.0});
}

// Whether eager's backward kernel of `id` computes half and bfloat16 in float and rounds once
// (tanh_backward, sigmoid_backward, gelu_backward, silu_backward on the CPU; gelu and silu on
// CUDA). Eager's CUDA tanh_backward and sigmoid_backward compute in the 16-bit type, each op
// rounded (a * (1 - b * b), a * (1 - b) * b), as does its CPU sigmoid_backward for float16; the
// other ops' backward formulas are composites of ops, each rounded.
bool backward_rounds_once(OpId id, DType dtype, Device::Kind device) {
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16) return false;
  switch (id) {
    case OpId::kGelu:
    case OpId::kSilu:
      return true;
    case OpId::kTanh:
      return device == Device::Kind::kCpu;
    case OpId::kSigmoid:
      return device == Device::Kind::kCpu && dtype == DType::kBFloat16;
    default:
      return false;
  }
}

// d(op(a))/da as a factor of g, for the unary ops whose derivative is a function of a and y.
void unary(GradContext& c, const Node& n, std::span<Value* const> grads) {
  Value* g = grads[0];
  Value* a0 = n.input(0);
  if (!g || !c.needs(a0)) return;
  // As eager's: in float32 where eager's backward kernel computes in float (one rounding at the
  // end, and no conversion between the formula's ops in a fused kernel); elsewhere each op of the
  // formula rounded, in eager's order.
  const TensorType& type = a0->tensor_type();
  const DType dtype = type.dtype;
  const bool opmath =
      backward_rounds_once(n.id(), dtype, type.device.kind) && g->tensor_type().dtype == dtype;
  auto widened = [&](Value* v) { return opmath ? grad::cast_to(c.b, v, DType::kFloat32) : v; };
  if (opmath) g = widened(g);
  auto a = [&] { return widened(c.forward(a0)); };
  auto y = [&] { return widened(c.forward(n.outputs[0])); };
  constexpr double kLn2 = std::numbers::ln2;
  Value* r = nullptr;
  switch (n.id()) {
    case OpId::kAbs:
      r = mul(c, g, call(c, OpId::kSign, {a()}));
      break;
    case OpId::kNeg:
      r = neg(c, g);
      break;
    case OpId::kExp:
      r = mul(c, g, y());
      break;
    case OpId::kExp2:
      r = mul(c, g, mul(c, y(), kLn2));
      break;
    case OpId::kExpm1:
      r = mul(c, g, add(c, y(), 1.0));
      break;
    case OpId::kLog:
      r = div(c, g, a());
      break;
    case OpId::kLog1p:
      r = div(c, g, add(c, a(), 1.0));
      break;
    case OpId::kLog2:
      r = div(c, g, mul(c, a(), kLn2));
      break;
    case OpId::kSqrt:
      r = div(c, g, mul(c, y(), 2.0));
      break;
    case OpId::kRsqrt:
      r = mul(c, g, mul(c, call(c, OpId::kPow, {y(), 3.0}), -0.5));
      break;
    case OpId::kSin:
      r = mul(c, g, call(c, OpId::kCos, {a()}));
      break;
    case OpId::kCos:
      r = mul(c, g, neg(c, call(c, OpId::kSin, {a()})));
      break;
    case OpId::kTan:
      r = mul(c, g, add(c, call(c, OpId::kSquare, {y()}), 1.0));
      break;
    case OpId::kTanh:
      r = mul(c, g, one_minus(c, call(c, OpId::kSquare, {y()})));
      break;
    case OpId::kAsin:
      r = mul(c, g, call(c, OpId::kRsqrt, {one_minus(c, call(c, OpId::kSquare, {a()}))}));
      break;
    case OpId::kAcos:
      r = neg(c, mul(c, g, call(c, OpId::kRsqrt, {one_minus(c, call(c, OpId::kSquare, {a()}))})));
      break;
    case OpId::kAtan:
      r = div(c, g, add(c, call(c, OpId::kSquare, {a()}), 1.0));
      break;
    case OpId::kSinh:
      r = mul(c, g, call(c, OpId::kCosh, {a()}));
      break;
    case OpId::kCosh:
      r = mul(c, g, call(c, OpId::kSinh, {a()}));
      break;
    case OpId::kSigmoid:  // (g * (1 - y)) * y, in eager's order
      r = mul(c, mul(c, g, one_minus(c, y())), y());
      break;
    case OpId::kRelu:
      r = zero_where_not(c, call(c, OpId::kGt, {y(), 0.0}), g);
      break;
    case OpId::kErf:
      r = mul(c, g,
              mul(c, call(c, OpId::kExp, {neg(c, call(c, OpId::kSquare, {a()}))}),
                  2.0 / std::sqrt(std::numbers::pi)));
      break;
    case OpId::kReciprocal:
      r = mul(c, g, neg(c, call(c, OpId::kSquare, {y()})));
      break;
    case OpId::kSquare:
      r = mul(c, g, mul(c, a(), 2.0));
      break;
    case OpId::kSilu: {
      Value* s = call(c, OpId::kSigmoid, {a()});
      r = mul(c, g, mul(c, s, add(c, mul(c, a(), one_minus(c, s)), 1.0)));
      break;
    }
    case OpId::kGelu:
      if (n.arg("approximate").as_string() == "tanh") {
        // PyTorch's GeluBackward for the tanh approximation.
        const double beta = std::sqrt(2.0 / std::numbers::pi), kappa = 0.044715;
        Value* x = a();
        Value* x_sq = call(c, OpId::kSquare, {x});
        Value* inner = mul(c, add(c, x, mul(c, mul(c, x_sq, x), kappa)), beta);
        Value* t = call(c, OpId::kTanh, {inner});
        Value* left_d = mul(c, add(c, t, 1.0), 0.5);
        Value* right_d = mul(c, mul(c, mul(c, x, 0.5), one_minus(c, call(c, OpId::kSquare, {t}))),
                             mul(c, add(c, mul(c, x_sq, 3.0 * kappa), 1.0), beta));
        r = mul(c, g, add(c, left_d, right_d));
      } else {
        Value* x = a();
        Value* cdf =
            mul(c, add(c, call(c, OpId::kErf, {mul(c, x, std::numbers::sqrt2 / 2)}), 1.0), 0.5);
        Value* pdf = mul(c, call(c, OpId::kExp, {mul(c, call(c, OpId::kSquare, {x}), -0.5)}),
                         1.0 / std::sqrt(2.0 * std::numbers::pi));
        r = mul(c, g, add(c, cdf, mul(c, x, pdf)));
      }
      break;
    // Piecewise constant: eager's gradient is zeros.
    case OpId::kFloor:
    case OpId::kCeil:
    case OpId::kRound:
    case OpId::kTrunc:
    case OpId::kSign:
      r = grad::zeros_of(c.b, a0);
      break;
    case OpId::kTo:
      r = g;
      break;
    default:
      throw NoDerivative("kiln has no derivative rule for " + n.op->name);
  }
  c.accumulate(a0, opmath ? grad::cast_to(c.b, r, dtype) : r);
}

Value* value_of(const Operand& o) {
  return o.is_value() && o.value()->is_tensor() ? o.value() : nullptr;
}

void binary(GradContext& c, const Node& n, std::span<Value* const> grads) {
  Value* g = grads[0];
  if (!g) return;
  Value* a0 = n.input(0);
  Value* b0 = value_of(n.arg(1));
  const bool need_a = c.needs(a0), need_b = b0 && c.needs(b0);
  if (!need_a && !need_b) return;
  auto a = [&] { return c.forward(a0); };
  auto b = [&] { return operand(c, n.arg(1)); };
  switch (n.id()) {
    case OpId::kAdd:
    case OpId::kSub: {
      if (need_a) c.accumulate(a0, g);
      if (need_b) {
        Value* gb = mul(c, g, operand(c, n.arg("alpha")));
        c.accumulate(b0, n.id() == OpId::kSub ? neg(c, gb) : gb);
      }
      return;
    }
    case OpId::kMul:
      if (need_a) c.accumulate(a0, mul(c, g, b()));
      if (need_b) c.accumulate(b0, mul(c, g, a()));
      return;
    case OpId::kDiv:
      if (!n.arg("rounding_mode").is_none()) {  // piecewise constant
        if (need_a) c.accumulate(a0, grad::zeros_of(c.b, a0));
        if (need_b) c.accumulate(b0, grad::zeros_of(c.b, b0));
        return;
      }
      if (need_a) c.accumulate(a0, div(c, g, b()));
      if (need_b) c.accumulate(b0, neg(c, div(c, mul(c, g, a()), call(c, OpId::kSquare, {b()}))));
      return;
    case OpId::kPow: {
      // d/da = b * a^(b-1) (0 where b == 0); d/db = y * log(a) (0 where a == 0 and b >= 0).
      if (need_a) {
        Operand e = b();
        Value* base = e.is_value()
                          ? call(c, OpId::kPow, {a(), sub(c, e, 1.0)})
                          : call(c, OpId::kPow, {a(), number_as_double(e.constant()) - 1.0});
        Value* da = mul(c, base, e);
        if (e.is_value())
          da = call(c, OpId::kWhere, {call(c, OpId::kEq, {e, 0.0}), 0.0, da});
        else if (number_as_double(e.constant()) == 0.0)
          da = grad::zeros_of(c.b, a0);
        c.accumulate(a0, mul(c, g, da));
      }
      if (need_b) {
        Value* y = c.forward(n.outputs[0]);
        Value* db = mul(c, y, call(c, OpId::kLog, {a()}));
        Value* masked = call(c, OpId::kLogicalAnd,
                             {call(c, OpId::kEq, {a(), 0.0}), call(c, OpId::kGe, {b(), 0.0})});
        c.accumulate(b0, mul(c, g, call(c, OpId::kWhere, {masked, 0.0, db})));
      }
      return;
    }
    case OpId::kRemainder:
    case OpId::kFmod: {
      if (need_a) c.accumulate(a0, g);
      if (need_b) {
        Value* q = div(c, a(), b());
        q = call(c, n.id() == OpId::kRemainder ? OpId::kFloor : OpId::kTrunc, {q});
        c.accumulate(b0, neg(c, mul(c, g, q)));
      }
      return;
    }
    case OpId::kMaximum:
    case OpId::kMinimum: {
      // Eager splits a tie evenly: where(a == b, g / 2, g) masked where the operand lost.
      const OpId wins = n.id() == OpId::kMaximum ? OpId::kGt : OpId::kLt;
      Value* tie = call(c, OpId::kEq, {a(), b()});
      Value* half = mul(c, g, 0.5);
      if (need_a)
        c.accumulate(a0, call(c, OpId::kWhere,
                              {tie, half, zero_where_not(c, call(c, wins, {a(), b()}), g)}));
      if (need_b)
        c.accumulate(b0, call(c, OpId::kWhere,
                              {tie, half, zero_where_not(c, call(c, wins, {b(), a()}), g)}));
      return;
    }
    case OpId::kCopy:
      if (need_a) c.accumulate(a0, grad::zeros_of(c.b, a0));
      if (need_b) c.accumulate(b0, g);
      return;
    case OpId::kAtan2: {
      Value* r2 = add(c, call(c, OpId::kSquare, {a()}), call(c, OpId::kSquare, {b()}));
      if (need_a) c.accumulate(a0, mul(c, g, div(c, b(), r2)));
      if (need_b) c.accumulate(b0, neg(c, mul(c, g, div(c, a(), r2))));
      return;
    }
    default:
      throw NoDerivative("kiln has no derivative rule for " + n.op->name);
  }
}

void ternary(GradContext& c, const Node& n, std::span<Value* const> grads) {
  Value* g = grads[0];
  if (!g) return;
  auto fwd = [&](size_t i) { return operand(c, n.arg(i)); };
  auto need = [&](size_t i) {
    Value* v = value_of(n.arg(i));
    return v && c.needs(v) ? v : nullptr;
  };
  switch (n.id()) {
    case OpId::kWhere: {
      Value* cond = nullptr;
      if (Value* x = need(1))
        c.accumulate(x, call(c, OpId::kWhere, {cond = c.forward(n.input(0)), g, 0.0}));
      if (Value* y = need(2))
        c.accumulate(y, call(c, OpId::kWhere, {cond ? cond : c.forward(n.input(0)), 0.0, g}));
      return;
    }
    case OpId::kClamp: {
      // Eager passes g where min <= a <= max (a bound's gradient where it won).
      const bool has_min = !n.arg(1).is_none(), has_max = !n.arg(2).is_none();
      Value* a = c.forward(n.input(0));
      if (Value* x = need(0)) {
        Value* keep = nullptr;
        if (has_min) keep = call(c, OpId::kGe, {a, fwd(1)});
        if (has_max) {
          Value* le = call(c, OpId::kLe, {a, fwd(2)});
          keep = keep ? call(c, OpId::kLogicalAnd, {keep, le}) : le;
        }
        c.accumulate(x, keep ? zero_where_not(c, keep, g) : g);
      }
      if (Value* lo = need(1)) {
        Value* won = call(c, OpId::kLt, {a, fwd(1)});
        if (has_max) won = call(c, OpId::kLogicalAnd, {won, call(c, OpId::kLe, {fwd(1), fwd(2)})});
        c.accumulate(lo, zero_where_not(c, won, g));
      }
      if (Value* hi = need(2)) {
        Value* won = call(c, OpId::kGt, {a, fwd(2)});
        if (has_min) won = call(c, OpId::kLogicalOr, {won, call(c, OpId::kLt, {fwd(2), fwd(1)})});
        c.accumulate(hi, zero_where_not(c, won, g));
      }
      return;
    }
    case OpId::kLerp: {  // a + w * (end - a)
      const Operand& w = n.arg(2);
      if (Value* a = need(0))
        c.accumulate(a, mul(c, g,
                            w.is_constant() ? Operand(1.0 - number_as_double(w.constant()))
                                            : Operand(one_minus(c, fwd(2)))));
      if (Value* e = need(1)) c.accumulate(e, mul(c, g, fwd(2)));
      if (Value* w = need(2)) c.accumulate(w, mul(c, g, sub(c, fwd(1), fwd(0))));
      return;
    }
    case OpId::kAddcmul:
    case OpId::kAddcdiv: {
      Operand value = operand(c, n.arg("value"));
      const bool is_mul = n.id() == OpId::kAddcmul;
      if (Value* a = need(0)) c.accumulate(a, g);
      if (Value* t1 = need(1))
        c.accumulate(t1, mul(c, mul(c, g, value),
                             is_mul ? fwd(2) : Operand(call(c, OpId::kReciprocal, {fwd(2)}))));
      if (Value* t2 = need(2)) {
        Value* r = is_mul ? mul(c, mul(c, g, value), fwd(1))
                          : neg(c, div(c, mul(c, mul(c, g, value), fwd(1)),
                                       call(c, OpId::kSquare, {fwd(2)})));
        c.accumulate(t2, r);
      }
      return;
    }
    default:
      throw NoDerivative("kiln has no derivative rule for " + n.op->name);
  }
}

// ---- reductions -------------------------------------------------------------------------------

// The reduced dims of a reduction node and the shape of its output with them kept (size 1).
struct Reduced {
  std::vector<int64_t> dims;
  IntList kept_shape;
  int64_t count = 1;  // elements reduced into each output element
};

Reduced reduced_of(const Node& n) {
  const Shape& in = grad::shape_of(n.input(0));
  Reduced r;
  r.dims = reduction_dims(n.arg(1).as_optional_ints(), static_cast<int64_t>(in.size()));
  r.kept_shape.assign(in.begin(), in.end());
  for (int64_t d : r.dims) {
    r.count *= in[static_cast<size_t>(d)];
    r.kept_shape[static_cast<size_t>(d)] = 1;
  }
  return r;
}

// An output-shaped value with the reduced dims put back as size 1.
Value* kept(GradContext& c, Value* v, const Reduced& r) {
  return call(c, OpId::kReshape, {v, Constant(r.kept_shape)});
}

void reduction(GradContext& c, const Node& n, std::span<Value* const> grads) {
  Value* g = grads[0];
  Value* a0 = n.input(0);
  if (!g || !c.needs(a0)) return;
  const Reduced r = reduced_of(n);
  const Shape& shape = grad::shape_of(a0);
  auto expand = [&](Value* v) {
    return call(c, OpId::kExpand, {v, Constant(IntList(shape.begin(), shape.end()))});
  };
  switch (n.id()) {
    case OpId::kSum:
      c.accumulate(a0, expand(kept(c, g, r)));
      return;
    case OpId::kMean:
      c.accumulate(a0, expand(div(c, kept(c, g, r), static_cast<double>(r.count))));
      return;
    case OpId::kAmax:
    case OpId::kAmin: {
      // Eager spreads the gradient evenly over the elements equal to the extremum.
      Value* hit = call(c, OpId::kEq, {c.forward(a0), kept(c, c.forward(n.outputs[0]), r)});
      Value* gk = kept(c, g, r);
      Value* count = call(c, OpId::kSum,
                          {grad::cast_to(c.b, hit, gk->tensor_type().dtype),
                           Constant(IntList(r.dims.begin(), r.dims.end())), true});
      c.accumulate(a0, zero_where_not(c, hit, div(c, gk, count)));
      return;
    }
    case OpId::kVar:
    case OpId::kStd: {
      const double correction = number_as_double(n.arg("correction").constant());
      Value* gk = kept(c, g, r);
      if (n.id() == OpId::kStd) gk = div(c, gk, mul(c, kept(c, c.forward(n.outputs[0]), r), 2.0));
      Value* x = c.forward(a0);
      IntList dims(r.dims.begin(), r.dims.end());
      Value* centered = sub(c, x, call(c, OpId::kMean, {x, Constant(dims), true}));
      const double scale = 2.0 / (static_cast<double>(r.count) - correction);
      c.accumulate(a0, mul(c, mul(c, gk, scale), centered));
      return;
    }
    default:
      throw NoDerivative("kiln has no derivative rule for " + n.op->name);
  }
}

// fill(self, value): self gets zeros (eager's fill_ keeps it in the graph); a tensor value the sum.
void fill(GradContext& c, const Node& n, std::span<Value* const> grads) {
  if (!grads[0]) return;
  if (c.needs(n.input(0))) c.accumulate(n.input(0), grad::zeros_of(c.b, n.input(0)));
  Value* v = value_of(n.arg(1));
  if (v && c.needs(v)) c.accumulate(v, grads[0]);
}

}  // namespace

DerivativeRule find_derivative_rule(OpId id) {
  const OpInfo& op = op_info(id);
  if (op.kind == OpKind::kElementwise) {
    switch (op.arity) {
      case 1:
        return &unary;
      case 2:
        return &binary;
      default:
        return &ternary;
    }
  }
  switch (id) {
    case OpId::kSum:
    case OpId::kMean:
    case OpId::kAmax:
    case OpId::kAmin:
    case OpId::kVar:
    case OpId::kStd:
      return &reduction;
    case OpId::kFill:
      return &fill;
    default:
      return find_structural_derivative_rule(id);
  }
}

bool is_non_differentiable(OpId id) {
  switch (id) {
    case OpId::kDetach:
    case OpId::kArgmax:
    case OpId::kArgmin:
    case OpId::kWrapIndex:
    case OpId::kFull:
    case OpId::kZeros:
    case OpId::kOnes:
    case OpId::kFullLike:
    case OpId::kZerosLike:
    case OpId::kOnesLike:
    case OpId::kEmptyLike:
    case OpId::kArange:
      return true;
    default:
      return false;
  }
}

}  // namespace kiln
