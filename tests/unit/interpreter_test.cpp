// Tests of the reference interpreter against hand-computed values: every elementwise op, type
// promotion and low-precision rounding, in-place ops through views and aliased inputs, the
// overlap errors eager PyTorch raises, views and their strides, reductions, scatters, joins and
// matrix products.
#include "kiln/runtime/interpreter/interpreter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>

#include "kiln/ir/builder.h"
#include "kiln/support/error.h"

namespace kiln {
namespace {

using Strides = std::vector<int64_t>;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kE = std::numbers::e;
constexpr double kPi = std::numbers::pi;

// A trace under construction plus a way to run it.
class Program {
 public:
  Program() : b(trace) {}
  Value* tensor(const std::string& name, DType dtype, Shape shape) {
    return b.add_input(name, TensorType{dtype, std::move(shape), Device::cpu(), std::nullopt});
  }
  Value* number(const std::string& name, ScalarKind kind) {
    return b.add_input(name, ScalarType{kind});
  }
  std::vector<RtValue> run(std::vector<Value*> outputs, std::vector<RtValue> inputs) {
    b.set_outputs(std::move(outputs));
    return interpret(trace, inputs);
  }
  RtValue run1(Value* output, std::vector<RtValue> inputs) { return run({output}, inputs)[0]; }

  Trace trace;
  Builder b;
};

Operand ints(std::initializer_list<int64_t> v) {
  return Constant(IntList(v));
}
Operand dtype(DType d) {
  return Constant(d);
}
Operand str(const char* s) {
  return Constant(std::string(s));
}

const TensorHandle& handle(const RtValue& v) {
  return std::get<TensorHandle>(v);
}

TensorHandle f32(const Shape& shape, const std::vector<double>& values) {
  return make_tensor(DType::kFloat32, shape, values);
}
TensorHandle f64(const Shape& shape, const std::vector<double>& values) {
  return make_tensor(DType::kFloat64, shape, values);
}
TensorHandle i64(const Shape& shape, const std::vector<int64_t>& values) {
  return make_int_tensor(DType::kInt64, shape, values);
}
TensorHandle boolean(const Shape& shape, const std::vector<int64_t>& values) {
  return make_int_tensor(DType::kBool, shape, values);
}
std::vector<double> iota(int64_t n) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i)
    v.push_back(static_cast<double>(i));
  return v;
}

// Values equal up to a relative tolerance; NaN matches NaN, infinities match exactly.
void expect_values(const RtTensor& t, const std::vector<double>& want, double rel = 0) {
  std::vector<double> got = to_vector(t);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i << ": got " << got[i];
    } else if (std::isinf(want[i]) || rel == 0) {
      EXPECT_EQ(got[i], want[i]) << "element " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], rel * std::max(1.0, std::abs(want[i]))) << "element " << i;
    }
  }
}
void expect_values(const RtValue& v, const std::vector<double>& want, double rel = 0) {
  expect_values(*handle(v), want, rel);
}
void expect_ints(const RtValue& v, const std::vector<int64_t>& want) {
  EXPECT_EQ(to_int_vector(*handle(v)), want);
}

// Runs `fn` and expects a UserError whose message contains `text`.
template <class Fn>
void expect_user_error(Fn fn, const std::string& text) {
  try {
    fn();
    ADD_FAILURE() << "expected a UserError containing: " << text;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

// One op over one input tensor; returns the result.
RtValue unary(OpId op, const TensorHandle& x, KeywordArgs kwargs = {}) {
  Program p;
  Value* in = p.tensor("x", x->dtype(), x->sizes);
  return p.run1(p.b.call1(op, {in}, std::move(kwargs)), {x});
}

RtValue binary(OpId op, const TensorHandle& x, Operand y_operand, const RtValue* y,
               KeywordArgs kwargs = {}) {
  Program p;
  Value* a = p.tensor("x", x->dtype(), x->sizes);
  std::vector<RtValue> inputs = {x};
  Operand other = y_operand;
  if (y) {
    const TensorHandle& yt = handle(*y);
    other = p.tensor("y", yt->dtype(), yt->sizes);
    inputs.push_back(*y);
  }
  return p.run1(p.b.call1(op, {a, other}, std::move(kwargs)), inputs);
}
// Tensor-tensor and tensor-number shorthands.
RtValue binary(OpId op, const TensorHandle& x, const TensorHandle& y, KeywordArgs kwargs = {}) {
  RtValue yv = y;
  return binary(op, x, Operand(), &yv, std::move(kwargs));
}
RtValue binary(OpId op, const TensorHandle& x, Operand number, KeywordArgs kwargs = {}) {
  return binary(op, x, std::move(number), nullptr, std::move(kwargs));
}

// ---- storage -----------------------------------------------------------------------------------

TEST(RtTensor, StoreConvertsLikePyTorch) {
  TensorHandle i = make_tensor(DType::kInt32, {4}, {2.7, -2.7, 0.5, -0.5});
  EXPECT_EQ(to_int_vector(*i), (std::vector<int64_t>{2, -2, 0, 0}));  // truncation toward zero
  TensorHandle b = make_tensor(DType::kBool, {4}, {0.0, 0.5, -3.0, kNan});
  EXPECT_EQ(to_int_vector(*b), (std::vector<int64_t>{0, 1, 1, 1}));  // != 0, NaN included
  TensorHandle w = make_int_tensor(DType::kInt32, {2}, {(int64_t{1} << 32) + 5, -1});
  EXPECT_EQ(to_int_vector(*w), (std::vector<int64_t>{5, -1}));  // int32 wraps
  TensorHandle big = i64({1}, {(int64_t{1} << 62) + 1});
  EXPECT_EQ(to_int_vector(*big)[0], (int64_t{1} << 62) + 1);
  EXPECT_EQ(to_int_vector(*clone(*big))[0], (int64_t{1} << 62) + 1);  // no trip through double
}

TEST(RtTensor, HalfAndBfloat16RoundToNearestEven) {
  // f16 has 10 mantissa bits: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 and goes to the even
  // 1; 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  TensorHandle h = make_tensor(DType::kFloat16, {3},
                               {1 + std::ldexp(1, -11), 1 + 3 * std::ldexp(1, -11), 65520.0});
  expect_values(*h, {1.0, 1 + std::ldexp(1, -9), kInf});
  // bf16 has 7: the same halfway cases at 2^-8.
  TensorHandle bf =
      make_tensor(DType::kBFloat16, {2}, {1 + std::ldexp(1, -8), 1 + 3 * std::ldexp(1, -8)});
  expect_values(*bf, {1.0, 1.015625});
}

TEST(RtTensor, StridedHelpers) {
  TensorHandle base = f32({6}, iota(6));
  TensorHandle v = make_view(base, {2, 2}, {1, 3}, 1);  // [[1, 4], [2, 5]]
  EXPECT_EQ(to_vector(*v), (std::vector<double>{1, 4, 2, 5}));
  EXPECT_FALSE(v->is_contiguous());
  EXPECT_EQ(v->storage_index({1, 1}), 5);
  EXPECT_EQ(v->storage_index_of_linear(2), 2);
  TensorHandle c = clone(*v);
  EXPECT_TRUE(c->is_contiguous());
  EXPECT_NE(c->storage, base->storage);
  EXPECT_EQ(to_vector(*c), (std::vector<double>{1, 4, 2, 5}));
  TensorHandle s = make_strided(DType::kFloat32, {2, 3}, {1, 2}, 1, 7);
  EXPECT_EQ(s->storage->numel(), 7);
  EXPECT_EQ(to_vector(*s), std::vector<double>(6, 0.0));
  EXPECT_THROW(make_view(base, {2, 2}, {3, 1}, 3), UserError);  // reaches element 7 of 6
}

// The executor's fast copy agrees with copy_into (the interpreter's copy_) on every layout it
// takes, and declines what it does not: another dtype or shape, overlapping bytes.
TEST(RtTensor, DisjointSameDtypeCopyAgreesWithCopyInto) {
  struct Layout {
    Shape sizes;
    std::vector<int64_t> strides;
    int64_t offset;
  };
  const std::vector<Layout> layouts = {
      {{}, {}, 3},                        // a scalar
      {{7}, {1}, 0},                      // dense
      {{7}, {3}, 2},                      // strided
      {{3, 4}, {4, 1}, 0},                // dense rows
      {{3, 4}, {1, 3}, 1},                // transposed
      {{3, 4}, {9, 2}, 1},                // both strided
      {{2, 3, 2}, {12, 4, 1}, 5},         // dense rows of a bigger tensor
      {{2, 1, 3, 2}, {13, 99, 4, 1}, 0},  // a size-1 dim with any stride
      {{2, 0, 3}, {3, 3, 1}, 0},          // empty
  };
  for (DType dtype : {DType::kBool, DType::kFloat16, DType::kFloat32, DType::kInt64}) {
    for (size_t a = 0; a < layouts.size(); ++a) {
      for (size_t b = 0; b < layouts.size(); ++b) {
        const Layout& dl = layouts[a];
        const Layout& sl = layouts[b];
        if (dl.sizes != sl.sizes) continue;
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " layouts " + std::to_string(a) + " <- " +
                     std::to_string(b));
        TensorHandle src = make_strided(dtype, sl.sizes, sl.strides, sl.offset, 64);
        for (int64_t i = 0; i < 64; ++i)
          src->storage->store_double(i, static_cast<double>((i * 7) % 5));
        TensorHandle fast = make_strided(dtype, dl.sizes, dl.strides, dl.offset, 64);
        TensorHandle slow = make_strided(dtype, dl.sizes, dl.strides, dl.offset, 64);
        ASSERT_TRUE(copy_disjoint_same_dtype(*fast, *src));
        copy_into(*slow, *src);
        EXPECT_EQ(fast->storage->bytes, slow->storage->bytes);  // untouched elements included
      }
    }
  }
  TensorHandle x = f32({8}, iota(8));
  TensorHandle y = make_strided(DType::kFloat32, {4}, {1}, 0, 4);
  EXPECT_FALSE(copy_disjoint_same_dtype(*make_view(x, {4}, {1}, 2), *make_view(x, {4}, {1}, 0)));
  EXPECT_FALSE(copy_disjoint_same_dtype(*y, *make_view(x, {2}, {1}, 0)));  // another shape
  TensorHandle i64 = make_strided(DType::kInt64, {4}, {1}, 0, 4);
  EXPECT_FALSE(copy_disjoint_same_dtype(*i64, *make_view(x, {4}, {1}, 0)));  // another dtype
  EXPECT_EQ(to_vector(*y), std::vector<double>(4, 0.0));                     // nothing copied
  EXPECT_TRUE(copy_disjoint_same_dtype(*make_view(x, {4}, {1}, 4), *make_view(x, {4}, {1}, 0)));
  EXPECT_EQ(to_vector(*x), (std::vector<double>{0, 1, 2, 3, 0, 1, 2, 3}));  // disjoint halves
}

// ---- elementwise: every op
// -----------------------------------------------------------------------

struct UnaryCase {
  OpId op;
  std::vector<double> in;
  std::vector<double> out;
};

TEST(Elementwise, FloatUnaryOps) {
  const double third_pi = kPi / 3;
  std::vector<UnaryCase> cases = {
      {OpId::kAbs, {-1.5, 0, 2}, {1.5, 0, 2}},
      {OpId::kNeg, {-1.5, 0, 2}, {1.5, 0, -2}},
      {OpId::kExp, {0, 1, -1}, {1, kE, 1 / kE}},
      {OpId::kExp2, {0, 3, -1}, {1, 8, 0.5}},
      {OpId::kExpm1, {0, 1}, {0, kE - 1}},
      {OpId::kLog, {1, kE, 0, -1}, {0, 1, -kInf, kNan}},
      {OpId::kLog1p, {0, kE - 1}, {0, 1}},
      {OpId::kLog2, {1, 8, 0.5}, {0, 3, -1}},
      {OpId::kSqrt, {4, 2.25, -1}, {2, 1.5, kNan}},
      {OpId::kRsqrt, {4, 0.25, 0}, {0.5, 2, kInf}},
      {OpId::kSin, {0, kPi / 2, kPi / 6}, {0, 1, 0.5}},
      {OpId::kCos, {0, kPi, third_pi}, {1, -1, 0.5}},
      {OpId::kTan, {0, kPi / 4}, {0, 1}},
      {OpId::kTanh, {0, 1, -1}, {0, 0.7615941559557649, -0.7615941559557649}},
      {OpId::kAsin, {0, 1, 0.5}, {0, kPi / 2, kPi / 6}},
      {OpId::kAcos, {1, 0, 0.5}, {0, kPi / 2, third_pi}},
      {OpId::kAtan, {0, 1, -1}, {0, kPi / 4, -kPi / 4}},
      {OpId::kSinh, {0, 1}, {0, (kE - 1 / kE) / 2}},
      {OpId::kCosh, {0, 1}, {1, (kE + 1 / kE) / 2}},
      {OpId::kSigmoid, {0, std::log(3.0)}, {0.5, 0.75}},
      {OpId::kRelu, {-1, 0, 2, kNan}, {0, 0, 2, kNan}},
      {OpId::kGelu, {0, 1, -1}, {0, 0.8413447460685429, -0.15865525393145707}},  // x * Phi(x)
      {OpId::kSilu, {0, std::log(3.0)}, {0, 0.75 * std::log(3.0)}},              // x * sigmoid(x)
      {OpId::kErf, {0, 1, -1}, {0, 0.8427007929497149, -0.8427007929497149}},
      {OpId::kReciprocal, {2, -0.5, 0}, {0.5, -2, kInf}},
      {OpId::kFloor, {-1.5, 1.5, 2}, {-2, 1, 2}},
      {OpId::kCeil, {-1.5, 1.5, 2}, {-1, 2, 2}},
      {OpId::kRound, {0.5, 1.5, 2.5, -0.5, -1.5, 2.4}, {0, 2, 2, 0, -2, 2}},  // half to even
      {OpId::kTrunc, {-1.7, 1.7}, {-1, 1}},
      {OpId::kSign, {-3, 0, 2, kNan}, {-1, 0, 1, 0}},
      {OpId::kSquare, {-3, 1.5}, {9, 2.25}},
  };
  for (const UnaryCase& c : cases) {
    SCOPED_TRACE(op_info(c.op).name);
    RtValue r = unary(c.op, f64({static_cast<int64_t>(c.in.size())}, c.in));
    EXPECT_EQ(handle(r)->dtype(), DType::kFloat64);
    expect_values(r, c.out, 1e-12);
  }
}

TEST(Elementwise, GeluTanhApproximation) {
  // 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))) at x = 1 and 2.
  RtValue r = unary(OpId::kGelu, f64({2}, {1, 2}), {{"approximate", str("tanh")}});
  expect_values(r, {0.8411919906082768, 1.954597694087775}, 1e-12);
  EXPECT_THROW(unary(OpId::kGelu, f64({1}, {1}), {{"approximate", str("exact")}}), UserError);
}

TEST(Elementwise, PredicatesGiveBool) {
  RtValue n = unary(OpId::kIsnan, f32({3}, {kNan, 1, kInf}));
  EXPECT_EQ(handle(n)->dtype(), DType::kBool);
  expect_ints(n, {1, 0, 0});
  RtValue l = unary(OpId::kLogicalNot, f32({3}, {0, 2, -0.5}));
  EXPECT_EQ(handle(l)->dtype(), DType::kBool);
  expect_ints(l, {1, 0, 0});
  expect_ints(unary(OpId::kLogicalNot, make_int_tensor(DType::kInt32, {2}, {0, 7})), {1, 0});
}

TEST(Elementwise, IntegerUnaryOps) {
  TensorHandle x = i64({4}, {-3, 0, 4, -1});
  expect_ints(unary(OpId::kAbs, x), {3, 0, 4, 1});
  expect_ints(unary(OpId::kNeg, x), {3, 0, -4, 1});
  expect_ints(unary(OpId::kRelu, x), {0, 0, 4, 0});
  expect_ints(unary(OpId::kSign, x), {-1, 0, 1, -1});
  expect_ints(unary(OpId::kSquare, x), {9, 0, 16, 1});
  for (OpId op : {OpId::kFloor, OpId::kCeil, OpId::kRound, OpId::kTrunc}) {
    RtValue r = unary(op, x);
    EXPECT_EQ(handle(r)->dtype(), DType::kInt64);
    expect_ints(r, {-3, 0, 4, -1});
  }
  expect_ints(unary(OpId::kBitwiseNot, x), {2, -1, -5, 0});  // ~a = -a - 1
  // Float-only math promotes integers to the default float.
  RtValue e = unary(OpId::kExp, make_int_tensor(DType::kInt32, {2}, {0, 1}));
  EXPECT_EQ(handle(e)->dtype(), DType::kFloat32);
  expect_values(e, {1, kE}, 1e-7);
  RtValue s = unary(OpId::kSqrt, boolean({2}, {1, 0}));
  EXPECT_EQ(handle(s)->dtype(), DType::kFloat32);
  expect_values(s, {1, 0});
}

TEST(Elementwise, BoolUnaryOps) {
  TensorHandle b = boolean({2}, {1, 0});
  expect_ints(unary(OpId::kBitwiseNot, b), {0, 1});  // logical not on bool
  RtValue s = unary(OpId::kSign, b);
  EXPECT_EQ(handle(s)->dtype(), DType::kBool);
  expect_ints(s, {1, 0});
  EXPECT_THROW(unary(OpId::kNeg, b), UserError);  // PyTorch rejects neg on bool
}

TEST(Elementwise, AddSubMulWithAlpha) {
  expect_values(binary(OpId::kAdd, f32({2}, {1, 2}), f32({2}, {3, 4}), {{"alpha", 2.0}}), {7, 10});
  expect_values(binary(OpId::kSub, f32({2}, {5, 1}), f32({2}, {2, 3})), {3, -2});
  expect_values(binary(OpId::kSub, f32({2}, {5, 1}), Operand(0.5), {{"alpha", 4}}), {3, -1});
  expect_ints(binary(OpId::kAdd, i64({2}, {1, 2}), i64({2}, {3, 4}), {{"alpha", 3}}), {10, 14});
  expect_ints(binary(OpId::kMul, i64({3}, {2, -3, 4}), Operand(5)), {10, -15, 20});
  // Bool: add saturates to true, mul is `and`.
  RtValue s = binary(OpId::kAdd, boolean({3}, {1, 1, 0}), boolean({3}, {1, 0, 0}));
  EXPECT_EQ(handle(s)->dtype(), DType::kBool);
  expect_ints(s, {1, 1, 0});
  expect_ints(binary(OpId::kMul, boolean({3}, {1, 1, 0}), boolean({3}, {1, 0, 0})), {1, 0, 0});
  // PyTorch's alpha checks.
  expect_user_error(
      [] {
        binary(OpId::kAdd, i64({1}, {1}), i64({1}, {1}), {{"alpha", 0.5}});
      },
      "argument alpha must not be a floating point number");
  expect_user_error(
      [] {
        binary(OpId::kAdd, f32({1}, {1}), f32({1}, {1}), {{"alpha", true}});
      },
      "Boolean alpha only supported for Boolean results");
  // int64 arithmetic wraps like PyTorch's.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  expect_ints(binary(OpId::kAdd, i64({1}, {kMax}), Operand(1)),
              {std::numeric_limits<int64_t>::min()});
}

TEST(Elementwise, Division) {
  RtValue t = binary(OpId::kDiv, i64({2}, {7, -7}), Operand(2));
  EXPECT_EQ(handle(t)->dtype(), DType::kFloat32);  // true division of integers
  expect_values(t, {3.5, -3.5});
  RtValue tr = binary(OpId::kDiv, i64({2}, {7, -7}), Operand(2), {{"rounding_mode", str("trunc")}});
  EXPECT_EQ(handle(tr)->dtype(), DType::kInt64);
  expect_ints(tr, {3, -3});
  expect_ints(binary(OpId::kDiv, i64({4}, {7, -7, 7, -7}), i64({4}, {2, 2, -2, -2}),
                     {{"rounding_mode", str("floor")}}),
              {3, -4, -4, 3});
  expect_values(binary(OpId::kDiv, f32({3}, {7.5, -7.5, 1}), f32({3}, {2, 2, 0}),
                       {{"rounding_mode", str("floor")}}),
                {3, -4, kInf});
  expect_values(binary(OpId::kDiv, f32({4}, {1, -1, 0, 6}), f32({4}, {0, 0, 0, 4})),
                {kInf, -kInf, kNan, 1.5});
  expect_user_error(
      [] {
        binary(OpId::kDiv, i64({2}, {1, 2}), i64({2}, {1, 0}), {{"rounding_mode", str("trunc")}});
      },
      "ZeroDivisionError");
}

TEST(Elementwise, PowRemainderFmod) {
  expect_values(binary(OpId::kPow, f32({3}, {2, 9, -8}), f32({3}, {3, 0.5, 1.0 / 3})),
                {8, 3, kNan});
  expect_ints(binary(OpId::kPow, i64({3}, {2, 3, -2}), i64({3}, {10, 0, 3})), {1024, 1, -8});
  // A negative tensor exponent follows PyTorch's powi; a negative number exponent raises.
  expect_ints(binary(OpId::kPow, i64({4}, {2, 1, -1, -1}), i64({4}, {-1, -2, -3, -2})),
              {0, 1, -1, 1});
  expect_user_error([] { binary(OpId::kPow, i64({1}, {2}), Operand(-1)); },
                    "Integers to negative integer powers are not allowed");
  RtValue pf = binary(OpId::kPow, i64({1}, {2}), Operand(-1.0));  // float exponent promotes
  EXPECT_EQ(handle(pf)->dtype(), DType::kFloat32);
  expect_values(pf, {0.5});

  TensorHandle a = i64({4}, {5, -5, 5, -5}), b = i64({4}, {3, 3, -3, -3});
  expect_ints(binary(OpId::kRemainder, a, b), {2, 1, -1, -2});  // sign of the divisor
  expect_ints(binary(OpId::kFmod, a, b), {2, -2, 2, -2});       // sign of the dividend
  expect_values(binary(OpId::kRemainder, f32({2}, {-5.5, 5.5}), Operand(2.0)), {0.5, 1.5});
  expect_values(binary(OpId::kFmod, f32({2}, {-5.5, 5.5}), Operand(2.0)), {-1.5, 1.5});
  expect_user_error([] { binary(OpId::kRemainder, i64({1}, {1}), Operand(0)); },
                    "ZeroDivisionError");
  expect_user_error([] { binary(OpId::kFmod, i64({1}, {1}), Operand(0)); }, "ZeroDivisionError");
}

TEST(Elementwise, MaximumMinimumAtan2) {
  TensorHandle a = f32({3}, {1, kNan, 3}), b = f32({3}, {2, 0, kNan});
  expect_values(binary(OpId::kMaximum, a, b), {2, kNan, kNan});
  expect_values(binary(OpId::kMinimum, a, b), {1, kNan, kNan});
  expect_ints(binary(OpId::kMaximum, i64({2}, {1, 7}), i64({2}, {4, -2})), {4, 7});
  expect_ints(binary(OpId::kMinimum, i64({2}, {1, 7}), i64({2}, {4, -2})), {1, -2});
  expect_values(binary(OpId::kAtan2, f64({3}, {1, 1, 0}), f64({3}, {1, -1, 1})),
                {kPi / 4, 3 * kPi / 4, 0}, 1e-12);
  RtValue at = binary(OpId::kAtan2, i64({1}, {1}), i64({1}, {0}));
  EXPECT_EQ(handle(at)->dtype(), DType::kFloat32);
  expect_values(at, {kPi / 2}, 1e-7);
}

TEST(Elementwise, Comparisons) {
  TensorHandle a = f32({3}, {1, 2, kNan});
  TensorHandle b = f32({3}, {2, 2, kNan});
  struct Case {
    OpId op;
    std::vector<int64_t> tensor, number;  // against b, against 2
  };
  std::vector<Case> cases = {
      {OpId::kEq, {0, 1, 0}, {0, 1, 0}}, {OpId::kNe, {1, 0, 1}, {1, 0, 1}},
      {OpId::kLt, {1, 0, 0}, {1, 0, 0}}, {OpId::kLe, {1, 1, 0}, {1, 1, 0}},
      {OpId::kGt, {0, 0, 0}, {0, 0, 0}}, {OpId::kGe, {0, 1, 0}, {0, 1, 0}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(op_info(c.op).name);
    RtValue r = binary(c.op, a, b);
    EXPECT_EQ(handle(r)->dtype(), DType::kBool);
    expect_ints(r, c.tensor);
    expect_ints(binary(c.op, a, Operand(2)), c.number);
  }
  // Integers compare exactly, without a trip through float: 2^53 + 1 != 2^53.
  int64_t big = (int64_t{1} << 53);
  expect_ints(binary(OpId::kEq, i64({1}, {big + 1}), i64({1}, {big})), {0});
  // An int tensor against a float number compares in float.
  expect_ints(binary(OpId::kLt, i64({2}, {1, 2}), Operand(1.5)), {1, 0});
}

TEST(Elementwise, LogicalAndBitwise) {
  TensorHandle a = f32({4}, {0, 1, 2, 0}), b = f32({4}, {0, 0, 3, 5});
  expect_ints(binary(OpId::kLogicalAnd, a, b), {0, 0, 1, 0});
  expect_ints(binary(OpId::kLogicalOr, a, b), {0, 1, 1, 1});
  expect_ints(binary(OpId::kLogicalXor, a, b), {0, 1, 0, 1});
  TensorHandle x = i64({2}, {12, 10}), y = i64({2}, {10, 6});
  expect_ints(binary(OpId::kBitwiseAnd, x, y), {8, 2});
  expect_ints(binary(OpId::kBitwiseOr, x, y), {14, 14});
  expect_ints(binary(OpId::kBitwiseXor, x, y), {6, 12});
  expect_ints(binary(OpId::kBitwiseAnd, x, Operand(4)), {4, 0});
  RtValue bb = binary(OpId::kBitwiseXor, boolean({3}, {1, 1, 0}), boolean({3}, {1, 0, 0}));
  EXPECT_EQ(handle(bb)->dtype(), DType::kBool);
  expect_ints(bb, {0, 1, 0});
  EXPECT_THROW(binary(OpId::kBitwiseAnd, a, b), UserError);
}

TEST(Elementwise, Where) {
  Program p;
  Value* c = p.tensor("c", DType::kBool, {3});
  Value* x = p.tensor("x", DType::kFloat32, {3});
  Value* y = p.tensor("y", DType::kInt64, {3});
  Value* w = p.b.call1(OpId::kWhere, {c, x, y});
  Value* w0 = p.b.call1(OpId::kWhere, {c, x, 0.0});
  std::vector<RtValue> r =
      p.run({w, w0}, {boolean({3}, {1, 0, 1}), f32({3}, {1.5, 2, 3}), i64({3}, {10, 20, 30})});
  EXPECT_EQ(handle(r[0])->dtype(), DType::kFloat32);
  expect_values(r[0], {1.5, 20, 3});
  expect_values(r[1], {1.5, 0, 3});
}

TEST(Elementwise, Clamp) {
  TensorHandle x = f32({4}, {-2, 0.5, 3, kNan});
  Program p;
  Value* in = p.tensor("x", DType::kFloat32, {4});
  Value* both = p.b.call1(OpId::kClamp, {in, 0.0, 1.0});
  Value* lo = p.b.call1(OpId::kClamp, {in}, {{"min", 0.0}});
  Value* hi = p.b.call1(OpId::kClamp, {in}, {{"max", 1.0}});
  Value* crossed = p.b.call1(OpId::kClamp, {in, 2.0, 1.0});  // min > max gives max
  Value* nan_bound = p.b.call1(OpId::kClamp, {in}, {{"min", kNan}});
  std::vector<RtValue> r = p.run({both, lo, hi, crossed, nan_bound}, {x});
  expect_values(r[0], {0, 0.5, 1, kNan});
  expect_values(r[1], {0, 0.5, 3, kNan});
  expect_values(r[2], {-2, 0.5, 1, kNan});
  expect_values(r[3], {1, 1, 1, kNan});
  expect_values(r[4], {kNan, kNan, kNan, kNan});
  expect_ints(binary(OpId::kClamp, i64({3}, {-5, 2, 9}), Operand(0), {{"max", 4}}), {0, 2, 4});
  // A float bound promotes an integer tensor (result_type over self, min and max).
  RtValue f = binary(OpId::kClamp, i64({2}, {-5, 2}), Operand(0.5));
  EXPECT_EQ(handle(f)->dtype(), DType::kFloat32);
  expect_values(f, {0.5, 2});
}

TEST(Elementwise, LerpAddcmulAddcdiv) {
  Program p;
  Value* a = p.tensor("a", DType::kFloat32, {2});
  Value* b = p.tensor("b", DType::kFloat32, {2});
  Value* c = p.tensor("c", DType::kFloat32, {2});
  Value* l1 = p.b.call1(OpId::kLerp, {a, b, 0.25});
  Value* l2 = p.b.call1(OpId::kLerp, {a, b, 0.75});
  Value* l3 = p.b.call1(OpId::kLerp, {a, b, c});
  Value* m = p.b.call1(OpId::kAddcmul, {a, b, c}, {{"value", 0.5}});
  Value* d = p.b.call1(OpId::kAddcdiv, {a, b, c}, {{"value", 2}});
  std::vector<RtValue> r =
      p.run({l1, l2, l3, m, d}, {f32({2}, {0, 10}), f32({2}, {8, 20}), f32({2}, {0.5, 1})});
  expect_values(r[0], {2, 12.5});
  expect_values(r[1], {6, 17.5});
  expect_values(r[2], {4, 20});
  expect_values(r[3], {0 + 0.5 * 8 * 0.5, 10 + 0.5 * 20 * 1});
  expect_values(r[4], {0 + 2 * 8 / 0.5, 10 + 2 * 20 / 1.0});

  Program q;
  Value* x = q.tensor("x", DType::kInt64, {2});
  Value* y = q.tensor("y", DType::kInt64, {2});
  Value* z = q.tensor("z", DType::kInt64, {2});
  Value* im = q.b.call1(OpId::kAddcmul, {x, y, z}, {{"value", 2}});
  expect_ints(q.run1(im, {i64({2}, {1, 1}), i64({2}, {2, 4}), i64({2}, {3, 5})}), {13, 41});
}

TEST(Elementwise, CastsAndToSameDtype) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {4});
  Value* i = p.b.call1(OpId::kTo, {x, dtype(DType::kInt32)});
  Value* b = p.b.call1(OpId::kTo, {x, dtype(DType::kBool)});
  Value* h = p.b.call1(OpId::kTo, {x, dtype(DType::kFloat16)});
  Value* same = p.b.call1(OpId::kTo, {x, dtype(DType::kFloat32)});
  TensorHandle in = f32({4}, {1.7, -1.7, 0, 1 + 3 * std::ldexp(1, -11)});
  std::vector<RtValue> r = p.run({i, b, h, same}, {in});
  expect_ints(r[0], {1, -1, 0, 1});
  expect_ints(r[1], {1, 1, 0, 1});
  // 1.7 in f16 is 1.7001953125 (nearest of 1 + k/1024); 1 + 3 * 2^-11 ties to the even 1 + 2^-9.
  expect_values(r[2], {1.7001953125, -1.7001953125, 0, 1 + std::ldexp(1, -9)});
  // x.to(x.dtype) is x itself in eager.
  EXPECT_EQ(handle(r[3]), in);
}

TEST(Elementwise, TypePromotion) {
  // int tensor + float number -> default float.
  RtValue a = binary(OpId::kAdd, i64({2}, {1, 2}), Operand(2.5));
  EXPECT_EQ(handle(a)->dtype(), DType::kFloat32);
  expect_values(a, {3.5, 4.5});
  // A 0-dim tensor of a wider dtype in the same category does not promote a dim tensor.
  TensorHandle i32 = make_int_tensor(DType::kInt32, {2}, {1, 2});
  RtValue b = binary(OpId::kAdd, i32, i64({}, {3}));
  EXPECT_EQ(handle(b)->dtype(), DType::kInt32);
  expect_ints(b, {4, 5});
  // ... but a dim tensor does.
  RtValue c = binary(OpId::kAdd, i32, i64({2}, {3, 3}));
  EXPECT_EQ(handle(c)->dtype(), DType::kInt64);
  // bool + int number -> i64; f16 + f32 0-dim -> f16; f16 + bf16 -> f32.
  RtValue d = binary(OpId::kAdd, boolean({2}, {1, 0}), Operand(3));
  EXPECT_EQ(handle(d)->dtype(), DType::kInt64);
  expect_ints(d, {4, 3});
  RtValue e = binary(OpId::kMul, make_tensor(DType::kFloat16, {1}, {3}), f32({}, {0.5}));
  EXPECT_EQ(handle(e)->dtype(), DType::kFloat16);
  expect_values(e, {1.5});
  RtValue f = binary(OpId::kAdd, make_tensor(DType::kFloat16, {1}, {1}),
                     make_tensor(DType::kBFloat16, {1}, {2}));
  EXPECT_EQ(handle(f)->dtype(), DType::kFloat32);
  expect_values(f, {3});
}

TEST(Elementwise, LowPrecisionResultsRound) {
  // f16: 1 + 2^-11 is a tie and rounds to 1; 2048 + 1 is a tie (ulp 2) and rounds to 2048.
  expect_values(binary(OpId::kAdd, make_tensor(DType::kFloat16, {2}, {1, 2048}),
                       make_tensor(DType::kFloat16, {2}, {std::ldexp(1, -11), 1})),
                {1, 2048});
  // bf16: 1 + 3 * 2^-8 ties to 1 + 2^-6.
  expect_values(
      binary(OpId::kAdd, make_tensor(DType::kBFloat16, {1}, {1}), Operand(3 * std::ldexp(1, -8))),
      {1.015625});
  // f32 (a 0-dim f64 does not promote): 1 + 2^-24 is a tie and rounds to 1; 1 + 3 * 2^-24 ties
  // to the even 1 + 2^-22. Between two dim tensors f64 wins and nothing rounds.
  expect_values(binary(OpId::kAdd, f32({1}, {1}), f64({}, {std::ldexp(1, -24)})), {1});
  expect_values(binary(OpId::kAdd, f32({1}, {1}), f64({}, {3 * std::ldexp(1, -24)})),
                {1 + std::ldexp(1, -22)});
  expect_values(binary(OpId::kAdd, f32({1}, {1}), f64({1}, {std::ldexp(1, -24)})),
                {1 + std::ldexp(1, -24)});
  expect_values(binary(OpId::kAdd, f32({2}, {1, 1}), Operand(3 * std::ldexp(1, -24))),
                {1 + std::ldexp(1, -22), 1 + std::ldexp(1, -22)});
}

TEST(Elementwise, ScalarInputsBroadcast) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {2, 2});
  Value* s = p.number("s", ScalarKind::kFloat);
  Value* k = p.number("k", ScalarKind::kInt);
  Value* y = p.b.call1(OpId::kMul, {x, s});
  Value* z = p.b.call1(OpId::kAdd, {y, k}, {{"alpha", k}});
  std::vector<RtValue> r =
      p.run({y, z}, {f32({2, 2}, {1, 2, 3, 4}), RtScalar(0.5), RtScalar(int64_t{3})});
  expect_values(r[0], {0.5, 1, 1.5, 2});
  expect_values(r[1], {9.5, 10, 10.5, 11});
  // Broadcasting a row against a column.
  expect_values(binary(OpId::kSub, f32({2, 1}, {10, 20}), f32({3}, {1, 2, 3})),
                {9, 8, 7, 19, 18, 17});
}

// ---- elementwise output layout ------------------------------------------------------------------

TEST(ElementwiseLayout, FollowsTensorIterator) {
  Program p;
  Value* a = p.tensor("a", DType::kFloat32, {2, 3});
  Value* c = p.tensor("c", DType::kFloat32, {3, 2});
  Value* at = p.b.call1(OpId::kT, {a});          // [3, 2] strides (1, 3)
  Value* e = p.b.call1(OpId::kExp, {at});        // like its only input
  Value* s1 = p.b.call1(OpId::kAdd, {c, at});    // the first operand decides: row-major
  Value* s2 = p.b.call1(OpId::kAdd, {at, c});    // ... transposed
  Value* s3 = p.b.call1(OpId::kMul, {at, 2.0});  // a wrapped number does not vote
  Value* v1 = p.b.call1(OpId::kView, {s1, ints({6})});
  std::vector<RtValue> r = p.run({e, s1, s2, s3, v1}, {f32({2, 3}, iota(6)), f32({3, 2}, iota(6))});
  EXPECT_EQ(handle(r[0])->strides, (Strides{1, 3}));
  EXPECT_EQ(handle(r[1])->strides, (Strides{2, 1}));
  EXPECT_EQ(handle(r[2])->strides, (Strides{1, 3}));
  EXPECT_EQ(handle(r[3])->strides, (Strides{1, 3}));
  // s1 = c + a.t(): c = [[0,1],[2,3],[4,5]], a.t() = [[0,3],[1,4],[2,5]].
  expect_values(r[4], {0, 4, 3, 7, 6, 10});
  expect_values(r[2], {0, 4, 3, 7, 6, 10});

  // A view of the transposed-layout result fails exactly as in eager.
  Program q;
  Value* qa = q.tensor("a", DType::kFloat32, {2, 3});
  Value* qc = q.tensor("c", DType::kFloat32, {3, 2});
  Value* qs = q.b.call1(OpId::kAdd, {q.b.call1(OpId::kT, {qa}), qc});
  Value* qv = q.b.call1(OpId::kView, {qs, ints({6})});
  expect_user_error(
      [&] {
        q.run1(qv, {f32({2, 3}, iota(6)), f32({3, 2}, iota(6))});
      },
      "view size is not compatible with input tensor's size and stride");
}

TEST(ElementwiseLayout, NonDenseInputsGiveDenseOutputs) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {4, 4});
  Value* s = p.b.call1(OpId::kSlice, {x, 1, 0, 4, 2});  // [4, 2] strides (4, 2)
  Value* st = p.b.call1(OpId::kT, {s});                 // [2, 4] strides (2, 4)
  Value* e = p.b.call1(OpId::kNeg, {s});
  Value* et = p.b.call1(OpId::kNeg, {st});
  std::vector<RtValue> r = p.run({e, et}, {f32({4, 4}, iota(16))});
  EXPECT_EQ(handle(r[0])->strides, (Strides{2, 1}));
  EXPECT_EQ(handle(r[1])->strides, (Strides{1, 2}));  // dims ordered like the input's strides
  expect_values(r[1], {-0, -4, -8, -12, -2, -6, -10, -14});
}

// ---- in-place ops, views and aliasing ---------------------------------------------------------

TEST(InPlace, ReturnsAndMutatesTheCallersTensor) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {3});
  Value* y = p.b.call1(OpId::kAdd_, {x, 1.0});
  Value* z = p.b.call1(OpId::kMul_, {y, y});  // full overlap with itself is fine
  TensorHandle in = f32({3}, {1, 2, 3});
  std::vector<RtValue> r = p.run({y, z}, {in});
  EXPECT_EQ(handle(r[0]), in);
  EXPECT_EQ(handle(r[1]), in);
  expect_values(*in, {4, 9, 16});
}

TEST(InPlace, ThroughViewsChangesBaseAndOtherViews) {
  Program p;
  Value* base = p.tensor("base", DType::kFloat32, {2, 3});
  Value* row = p.b.call1(OpId::kSelect, {base, 0, 1});     // base[1]
  Value* cols = p.b.call1(OpId::kSlice, {base, 1, 1, 3});  // base[:, 1:3]
  p.b.call(OpId::kMul_, {row, 10.0});
  Value* col0 = p.b.call1(OpId::kSelect, {cols, 1, 0});  // base[:, 1]
  p.b.call(OpId::kSub_, {col0, 1.0});
  TensorHandle in = f32({2, 3}, iota(6));
  std::vector<RtValue> r = p.run({cols, row}, {in});
  expect_values(*in, {0, 0, 2, 30, 39, 50});
  expect_values(r[0], {0, 2, 39, 50});
  expect_values(r[1], {30, 39, 50});
  EXPECT_EQ(handle(r[0])->storage, in->storage);
}

TEST(InPlace, ConvertsToTheTargetDtype) {
  Program p;
  Value* h = p.tensor("h", DType::kFloat16, {2});
  Value* f = p.tensor("f", DType::kFloat32, {2});
  Value* i = p.tensor("i", DType::kInt32, {2});
  p.b.call(OpId::kAdd_, {h, f});  // computed in f32, stored as f16
  p.b.call(OpId::kMul_, {i, 3});
  p.b.call(OpId::kDiv_, {i, 2}, {{"rounding_mode", str("floor")}});
  TensorHandle hv = make_tensor(DType::kFloat16, {2}, {1, 2048});
  TensorHandle iv = make_int_tensor(DType::kInt32, {2}, {-3, 5});
  p.run({}, {hv, f32({2}, {std::ldexp(1, -10), 1}), iv});
  expect_values(*hv, {1 + std::ldexp(1, -10), 2048});
  expect_ints(iv, {-5, 7});
  // An int target cannot take a float result (type rule).
  Program q;
  Value* qi = q.tensor("i", DType::kInt64, {2});
  EXPECT_THROW(q.b.call(OpId::kAdd_, {qi, 1.5}), UserError);
}

TEST(InPlace, WriteIntoExpandedViewRaises) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {1, 3});
  Value* e = p.b.call1(OpId::kExpand, {x, ints({2, 3})});
  p.b.call(OpId::kAdd_, {e, 1.0});
  TensorHandle in = f32({1, 3}, {1, 2, 3});
  expect_user_error([&] { p.run({}, {in}); },
                    "unsupported operation: more than one element of the written-to tensor "
                    "refers to a single memory location. Please clone() the tensor before "
                    "performing the operation.");
  expect_values(*in, {1, 2, 3});  // nothing written

  Program q;
  Value* qx = q.tensor("x", DType::kFloat32, {1, 3});
  Value* qe = q.b.call1(OpId::kExpand, {qx, ints({2, 3})});
  q.b.call(OpId::kCopy_, {qe, q.b.call1(OpId::kOnes, {ints({2, 3})})});
  expect_user_error([&] { q.run({}, {f32({1, 3}, {1, 2, 3})}); }, "more than one element");
}

TEST(InPlace, FillOfExpandedViewIsAllowedAsInEager) {
  // ATen's fill_ skips the overlap check: filling is idempotent.
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {1, 3});
  Value* e = p.b.call1(OpId::kExpand, {x, ints({2, 3})});
  p.b.call(OpId::kFill_, {e, 7.0});
  TensorHandle in = f32({1, 3}, {1, 2, 3});
  p.run({}, {in});
  expect_values(*in, {7, 7, 7});
}

TEST(InPlace, PartialOverlapRaises) {
  Program p;
  Value* base = p.tensor("base", DType::kFloat32, {4});
  Value* a = p.b.call1(OpId::kSlice, {base, 0, 0, 3});
  Value* b = p.b.call1(OpId::kSlice, {base, 0, 1, 4});
  p.b.call(OpId::kAdd_, {a, b});
  expect_user_error([&] { p.run({}, {f32({4}, iota(4))}); },
                    "unsupported operation: some elements of the input tensor and the "
                    "written-to tensor refer to a single memory location. Please clone() the "
                    "tensor before performing the operation.");

  // Same memory, other strides: x.copy_(x.t()).
  Program q;
  Value* x = q.tensor("x", DType::kFloat32, {2, 2});
  q.b.call(OpId::kCopy_, {x, q.b.call1(OpId::kT, {x})});
  expect_user_error(
      [&] {
        q.run({}, {f32({2, 2}, iota(4))});
      },
      "some elements of the input tensor");
}

TEST(InPlace, CopyOntoItselfIsANoOp) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {3});
  Value* alias = p.b.call1(OpId::kAlias, {x});
  p.b.call(OpId::kCopy_, {x, alias});
  p.b.call(OpId::kCopy_, {x, x});
  TensorHandle in = f32({3}, {1, 2, 3});
  p.run({}, {in});
  expect_values(*in, {1, 2, 3});
}

TEST(InPlace, CopyBroadcastsAndConverts) {
  Program p;
  Value* x = p.tensor("x", DType::kInt32, {2, 3});
  Value* src = p.tensor("s", DType::kFloat64, {3});
  p.b.call(OpId::kCopy_, {x, src});
  TensorHandle in = make_int_tensor(DType::kInt32, {2, 3}, {0, 0, 0, 0, 0, 0});
  p.run({}, {in, f64({3}, {1.9, -2.9, 3})});
  expect_ints(in, {1, -2, 3, 1, -2, 3});
}

TEST(InPlace, FillAndZero) {
  Program p;
  Value* x = p.tensor("x", DType::kInt64, {2, 2});
  Value* v = p.tensor("v", DType::kFloat32, {});
  Value* col = p.b.call1(OpId::kSelect, {x, 1, 0});
  p.b.call(OpId::kFill_, {col, v});  // a 0-dim tensor value, truncated
  p.b.call(OpId::kZero_, {p.b.call1(OpId::kSelect, {x, 0, 1})});
  TensorHandle in = i64({2, 2}, {5, 5, 5, 5});
  p.run({}, {in, f32({}, {-2.5})});
  expect_ints(in, {-2, 5, 0, 0});
}

TEST(MetadataMutation, TransposeChangesTheCallersHandle) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {4, 2});
  Value* y = p.b.call1(OpId::kTranspose_, {x, 0, 1});
  TensorHandle in = f32({4, 2}, iota(8));
  RtValue r = p.run1(y, {in});
  EXPECT_EQ(handle(r), in);
  EXPECT_EQ(in->sizes, (Shape{2, 4}));
  EXPECT_EQ(in->strides, (Strides{1, 2}));
  expect_values(*in, {0, 2, 4, 6, 1, 3, 5, 7});
}

TEST(MetadataMutation, OtherForms) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {2, 3});
  Value* xt = p.b.call1(OpId::kT_, {x});
  Value* t = p.b.call1(OpId::kUnsqueeze_, {xt, 0});
  TensorHandle in = f32({2, 3}, iota(6));
  p.run({t}, {in});
  EXPECT_EQ(in->sizes, (Shape{1, 3, 2}));
  EXPECT_EQ(in->strides, (Strides{3, 1, 3}));  // unsqueeze at d: stride sizes[d] * strides[d]

  Program q;
  Value* qx = q.tensor("x", DType::kFloat32, {1, 3, 1});
  Value* s = q.b.call1(OpId::kSqueeze_, {qx, 0});
  Value* a = q.b.call1(OpId::kAsStrided_, {s, ints({2, 2}), ints({1, 0}), 1});
  TensorHandle qin = f32({1, 3, 1}, {10, 11, 12});
  q.run({a}, {qin});
  EXPECT_EQ(qin->sizes, (Shape{2, 2}));
  EXPECT_EQ(qin->strides, (Strides{1, 0}));
  EXPECT_EQ(qin->offset, 1);
  expect_values(*qin, {11, 11, 12, 12});

  Program bad;
  Value* bx = bad.tensor("x", DType::kFloat32, {3});
  bad.b.call(OpId::kAsStrided_, {bx, ints({3}), ints({2})});
  TensorHandle bin = f32({3}, {1, 2, 3});
  expect_user_error([&] { bad.run({}, {bin}); }, "out of bounds for storage");
  EXPECT_EQ(bin->strides, (Strides{1}));  // unchanged after the error
}

// ---- views
// ----------------------------------------------------------------------------------------

TEST(Views, ViewOfTransposedRaisesWhileReshapeCopies) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {2, 3});
  Value* t = p.b.call1(OpId::kT, {x});
  Value* r = p.b.call1(OpId::kReshape, {t, ints({6})});
  Value* f = p.b.call1(OpId::kFlatten, {t});
  TensorHandle in = f32({2, 3}, iota(6));
  std::vector<RtValue> out = p.run({r, f}, {in});
  expect_values(out[0], {0, 3, 1, 4, 2, 5});
  EXPECT_NE(handle(out[0])->storage, in->storage);
  EXPECT_NE(handle(out[1])->storage, in->storage);

  Program q;
  Value* qx = q.tensor("x", DType::kFloat32, {2, 3, 1, 1});
  Value* qt = q.b.call1(OpId::kT, {q.b.call1(OpId::kView, {qx, ints({2, 3})})});
  Value* qv = q.b.call1(OpId::kView, {qt, ints({-1})}, {}, SourceLoc{"main.py", 7, ""});
  expect_user_error(
      [&] {
        q.run1(qv, {f32({2, 3, 1, 1}, iota(6))});
      },
      "kiln: view at main.py:7: view size is not compatible with input tensor's "
      "size and stride (at least one dimension spans across two contiguous "
      "subspaces). Use .reshape(...) instead.");
}

// view_dtype reads the same memory as another dtype: a write through it is seen in the base, a
// write into the base through it; bitcast copies the bytes (every bit) into a tensor of its own.
TEST(Views, ViewDtypeSharesTheBytesAndBitcastCopiesThem) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {3});
  Value* bits = p.b.call1(OpId::kViewDtype, {x, Constant(DType::kInt32)});
  p.b.call(OpId::kAdd_, {p.b.call1(OpId::kSelect, {bits, 0, 0}), 1});  // 1.0 + one ulp
  Value* copy = p.b.call1(OpId::kBitcast, {x, Constant(DType::kInt32)});
  p.b.call(OpId::kFill_, {p.b.call1(OpId::kSelect, {x, 0, 2}), 2.0});
  TensorHandle in = f32({3}, {1, 2, 3});
  std::vector<RtValue> r = p.run({bits, copy}, {in});
  expect_ints(r[0], {0x3F800001, 0x40000000, 0x40000000});
  expect_ints(r[1], {0x3F800001, 0x40000000, 0x40400000});
  EXPECT_EQ(&handle(r[0])->storage->memory_owner(), in->storage.get());
  EXPECT_NE(&handle(r[1])->storage->memory_owner(), in->storage.get());
  EXPECT_EQ(to_vector(*in)[0], 1.0000001192092896);
}

TEST(Views, ViewAndReshapeShareStorageWhenPossible) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {4, 6});
  Value* s = p.b.call1(OpId::kSlice, {x, 1, 0, 3});         // [4, 3] strides (6, 1)
  Value* v = p.b.call1(OpId::kView, {s, ints({2, 2, 3})});  // merges only compatible groups
  Value* r = p.b.call1(OpId::kReshape, {x, ints({3, -1})});
  p.b.call(OpId::kFill_, {p.b.call1(OpId::kSelect, {r, 0, 0}), -1.0});
  TensorHandle in = f32({4, 6}, iota(24));
  std::vector<RtValue> out = p.run({v, r}, {in});
  EXPECT_EQ(handle(out[0])->strides, (Strides{12, 6, 1}));
  EXPECT_EQ(handle(out[0])->storage, in->storage);
  EXPECT_EQ(handle(out[1])->strides, (Strides{8, 1}));
  EXPECT_EQ(to_vector(*in)[0], -1);  // written through the reshape
  Program q;
  Value* qx = q.tensor("x", DType::kFloat32, {4, 6});
  Value* qs = q.b.call1(OpId::kSlice, {qx, 1, 0, 3});
  q.b.call1(OpId::kView, {qs, ints({12})});
  expect_user_error([&] { q.run({}, {f32({4, 6}, iota(24))}); }, "view size is not compatible");
}

TEST(Views, StridesOfEachViewOp) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {2, 3});
  std::vector<Value*> outs = {
      p.b.call1(OpId::kPermute, {x, ints({1, 0})}),
      p.b.call1(OpId::kExpand, {p.b.call1(OpId::kUnsqueeze, {x, 0}), ints({4, -1, 3})}),
      p.b.call1(OpId::kUnsqueeze, {x, 1}),
      p.b.call1(OpId::kUnsqueeze, {x, 2}),
      p.b.call1(OpId::kSlice, {x, 1, 1, Operand(), 2}),
      p.b.call1(OpId::kNarrow, {x, 1, -2, 2}),
      p.b.call1(OpId::kSelect, {x, 1, -1}),
      p.b.call1(OpId::kAsStrided, {x, ints({2}), ints({4})}, {{"storage_offset", 1}}),
      p.b.call1(OpId::kSqueeze, {p.b.call1(OpId::kUnsqueeze, {x, 0})}),
      p.b.call1(OpId::kDetach, {x}),
      p.b.call1(OpId::kUnflatten, {x, 1, ints({3, 1})}),
  };
  TensorHandle in = f32({2, 3}, iota(6));
  std::vector<RtValue> r = p.run(outs, {in});
  for (const RtValue& v : r)
    EXPECT_EQ(handle(v)->storage, in->storage);
  EXPECT_EQ(handle(r[0])->strides, (Strides{1, 3}));
  EXPECT_EQ(handle(r[1])->strides, (Strides{0, 3, 1}));
  EXPECT_EQ(handle(r[2])->strides, (Strides{3, 3, 1}));
  EXPECT_EQ(handle(r[3])->strides, (Strides{3, 1, 1}));
  expect_values(r[4], {1, 4});
  EXPECT_EQ(handle(r[4])->strides, (Strides{3, 2}));
  EXPECT_EQ(handle(r[4])->offset, 1);
  expect_values(r[5], {1, 2, 4, 5});
  expect_values(r[6], {2, 5});
  expect_values(r[7], {1, 5});
  EXPECT_EQ(handle(r[8])->sizes, (Shape{2, 3}));
  EXPECT_NE(handle(r[9]), in);  // a new tensor object over the same memory
  EXPECT_EQ(handle(r[10])->strides, (Strides{3, 1, 1}));
}

TEST(Views, DiagonalSplitChunkUnbindFlatten) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {3, 3});
  Value* d1 = p.b.call1(OpId::kDiagonal, {x, 1});
  Value* dm = p.b.call1(OpId::kDiagonal, {x, -1});
  std::vector<Value*> sp = p.b.call(OpId::kSplit, {x, 2, 1});
  std::vector<Value*> spl = p.b.call(OpId::kSplit, {x, ints({1, 2})});
  std::vector<Value*> ch = p.b.call(OpId::kChunk, {x, 2});
  std::vector<Value*> ub = p.b.call(OpId::kUnbind, {x, 1});
  Value* same = p.b.call1(OpId::kFlatten, {x, 1, 1});
  ASSERT_EQ(sp.size(), 2u);
  ASSERT_EQ(ub.size(), 3u);
  TensorHandle in = f32({3, 3}, iota(9));
  std::vector<RtValue> r = p.run({d1, dm, sp[0], sp[1], spl[1], ch[0], ch[1], ub[2], same}, {in});
  expect_values(r[0], {1, 5});
  EXPECT_EQ(handle(r[0])->strides, (Strides{4}));
  expect_values(r[1], {3, 7});
  expect_values(r[2], {0, 1, 3, 4, 6, 7});
  expect_values(r[3], {2, 5, 8});
  expect_values(r[4], {3, 4, 5, 6, 7, 8});
  expect_values(r[5], {0, 1, 2, 3, 4, 5});
  expect_values(r[6], {6, 7, 8});
  expect_values(r[7], {2, 5, 8});
  EXPECT_EQ(handle(r[8]), in);  // flatten with nothing to merge returns the tensor itself
}

TEST(Views, AsStridedOutOfBoundsRaises) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {6});
  p.b.call1(OpId::kAsStrided, {x, ints({2, 2}), ints({3, 1}), 3});
  expect_user_error([&] { p.run({}, {f32({6}, iota(6))}); },
                    "requiring a storage size of 32 are out of bounds for storage of size 24");
}

TEST(Views, GetitemAndSetitem) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {2, 4});
  Value* v = p.tensor("v", DType::kFloat32, {2});
  IndexKey key = {IndexItem::integer(1), IndexItem::slice(std::nullopt, std::nullopt, 2)};
  Value* g = p.b.call1(OpId::kGetitem, {x, Constant(key)});
  IndexKey col = {IndexItem::slice(), IndexItem::integer(1)};
  p.b.call(OpId::kSetitem_, {x, Constant(col), v});
  p.b.call(OpId::kSetitem_,
           {x, Constant(IndexKey{IndexItem::integer(0), IndexItem::integer(0)}), 9.0});
  TensorHandle in = f32({2, 4}, iota(8));
  RtValue r = p.run1(g, {in, f32({2}, {-1, -2})});
  expect_values(*in, {9, -1, 2, 3, 4, -2, 6, 7});
  expect_values(r, {4, 6});
  EXPECT_EQ(handle(r)->storage, in->storage);
}

// ---- creation
// ---------------------------------------------------------------------------------------

TEST(Creation, FullZerosOnesArange) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {2, 3});
  Value* xt = p.b.call1(OpId::kT, {x});
  std::vector<Value*> outs = {
      p.b.call1(OpId::kFull, {ints({2}), 7}),
      p.b.call1(OpId::kZeros, {ints({2})}, {{"dtype", dtype(DType::kInt32)}}),
      p.b.call1(OpId::kOnes, {ints({1, 2})}),
      p.b.call1(OpId::kArange, {0, 1, 0.25}),
      p.b.call1(OpId::kArange, {1, 10, 3}),
      p.b.call1(OpId::kFullLike, {xt, 2.5}),
      p.b.call1(OpId::kZerosLike, {xt}, {{"dtype", dtype(DType::kInt64)}}),
      p.b.call1(OpId::kFill, {xt, 4}),
      p.b.call1(OpId::kEmptyLike, {p.b.call1(OpId::kSlice, {x, 1, 0, 3, 2})}),
  };
  std::vector<RtValue> r = p.run(outs, {f32({2, 3}, iota(6))});
  EXPECT_EQ(handle(r[0])->dtype(), DType::kInt64);
  expect_ints(r[0], {7, 7});
  EXPECT_EQ(handle(r[1])->dtype(), DType::kInt32);
  expect_ints(r[1], {0, 0});
  expect_values(r[2], {1, 1});
  expect_values(r[3], {0, 0.25, 0.5, 0.75});
  expect_ints(r[4], {1, 4, 7});
  // *_like and fill keep a dense input's layout (preserve_format).
  expect_values(r[5], {2.5, 2.5, 2.5, 2.5, 2.5, 2.5});
  EXPECT_EQ(handle(r[5])->strides, (Strides{1, 3}));
  EXPECT_EQ(handle(r[6])->strides, (Strides{1, 3}));
  EXPECT_EQ(handle(r[6])->dtype(), DType::kInt64);
  EXPECT_EQ(handle(r[7])->strides, (Strides{1, 3}));
  expect_values(r[7], {4, 4, 4, 4, 4, 4});
  EXPECT_EQ(handle(r[8])->strides, (Strides{2, 1}));  // a non-dense input gets dense strides
}

// ---- reductions
// ------------------------------------------------------------------------------------

TEST(Reductions, SumProdMean) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {2, 3});
  std::vector<Value*> outs = {
      p.b.call1(OpId::kSum, {x}),
      p.b.call1(OpId::kSum, {x, ints({0})}),
      p.b.call1(OpId::kSum, {x, ints({-1}), true}),
      p.b.call1(OpId::kProd, {x, 1}),
      p.b.call1(OpId::kMean, {x, ints({-1})}),
      p.b.call1(OpId::kMean, {x, ints({0, 1})}),
      p.b.call1(OpId::kSum, {x}, {{"dtype", dtype(DType::kFloat64)}}),
      p.b.call1(OpId::kSum, {p.b.call1(OpId::kT, {x}), ints({1})}),
  };
  std::vector<RtValue> r = p.run(outs, {f32({2, 3}, {1, 2, 3, 4, 5, 6})});
  EXPECT_EQ(handle(r[0])->sizes, Shape{});
  expect_values(r[0], {21});
  expect_values(r[1], {5, 7, 9});
  EXPECT_EQ(handle(r[2])->sizes, (Shape{2, 1}));
  expect_values(r[2], {6, 15});
  expect_values(r[3], {6, 120});
  expect_values(r[4], {2, 5});
  expect_values(r[5], {3.5});
  EXPECT_EQ(handle(r[6])->dtype(), DType::kFloat64);
  expect_values(r[7], {5, 7, 9});

  RtValue si = unary(OpId::kSum, make_int_tensor(DType::kInt32, {3}, {1, 2, 3}));
  EXPECT_EQ(handle(si)->dtype(), DType::kInt64);
  expect_ints(si, {6});
  expect_ints(unary(OpId::kSum, boolean({4}, {1, 0, 1, 1})), {3});
  expect_ints(unary(OpId::kProd, i64({3}, {-2, 3, 4})), {-24});
  expect_values(unary(OpId::kMean, f32({0}, {})), {kNan});
}

TEST(Reductions, AmaxAminPropagateNan) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {2, 3});
  Value* mx = p.b.call1(OpId::kAmax, {x, ints({1})});
  Value* mn = p.b.call1(OpId::kAmin, {x});  // dim=[] reduces everything
  Value* mk = p.b.call1(OpId::kAmax, {x, ints({0}), true});
  std::vector<RtValue> r = p.run({mx, mn, mk}, {f32({2, 3}, {1, kNan, 3, -4, 5, 6})});
  expect_values(r[0], {kNan, 6});
  expect_values(r[1], {kNan});
  EXPECT_EQ(handle(r[2])->sizes, (Shape{1, 3}));
  expect_values(r[2], {1, kNan, 6});
  expect_ints(unary(OpId::kAmin, i64({3}, {4, -7, 2})), {-7});
}

TEST(Reductions, VarStdWithCorrection) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat64, {4});
  std::vector<Value*> outs = {
      p.b.call1(OpId::kVar, {x}),
      p.b.call1(OpId::kVar, {x}, {{"correction", 0}}),
      p.b.call1(OpId::kStd, {x}),
      p.b.call1(OpId::kVar, {x}, {{"correction", 4}}),
      p.b.call1(OpId::kVar, {x, ints({0})}, {{"keepdim", true}}),
  };
  std::vector<RtValue> r = p.run(outs, {f64({4}, {1, 2, 3, 4})});
  // mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5.
  expect_values(r[0], {5.0 / 3}, 1e-15);
  expect_values(r[1], {1.25}, 1e-15);
  expect_values(r[2], {std::sqrt(5.0 / 3)}, 1e-15);
  expect_values(r[3], {kInf});  // divisor max(4 - 4, 0) = 0
  EXPECT_EQ(handle(r[4])->sizes, (Shape{1}));
  expect_values(unary(OpId::kVar, f32({1}, {3})), {kNan});  // 0 / 0
}

TEST(Reductions, ArgmaxArgminTakeTheFirstExtreme) {
  expect_ints(unary(OpId::kArgmax, f32({4}, {1, 3, 3, 2})), {1});
  expect_ints(unary(OpId::kArgmin, f32({4}, {2, 1, 1, 5})), {1});
  expect_ints(unary(OpId::kArgmax, f32({4}, {1, kNan, 5, kNan})), {1});  // NaN is the max
  expect_ints(unary(OpId::kArgmin, f32({3}, {1, kNan, -5})), {1});       // ... and the min
  expect_ints(unary(OpId::kArgmax, f32({2, 2}, {1, 5, 9, 9})), {2});     // flattened index
  Program p;
  Value* x = p.tensor("x", DType::kInt64, {2, 3});
  Value* a = p.b.call1(OpId::kArgmax, {x, 1});
  Value* k = p.b.call1(OpId::kArgmin, {x, 0, true});
  std::vector<RtValue> r = p.run({a, k}, {i64({2, 3}, {1, 5, 5, 7, 7, 0})});
  EXPECT_EQ(handle(r[0])->dtype(), DType::kInt64);
  expect_ints(r[0], {1, 0});
  EXPECT_EQ(handle(r[1])->sizes, (Shape{1, 3}));
  expect_ints(r[1], {0, 0, 1});
}

// ---- scatters
// ----------------------------------------------------------------------------------------

TEST(Scatters, WriteIntoACopy) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {2, 3});
  Value* s1 = p.tensor("s1", DType::kFloat32, {2, 1});
  Value* s2 = p.tensor("s2", DType::kFloat32, {3});
  Value* s3 = p.tensor("s3", DType::kFloat32, {2});
  std::vector<Value*> outs = {
      p.b.call1(OpId::kSliceScatter, {x, s1, 1, 1, 3, 2}),
      p.b.call1(OpId::kSelectScatter, {x, s2, 0, -1}),
      p.b.call1(OpId::kDiagonalScatter, {x, s3, 1}),
      p.b.call1(OpId::kAsStridedScatter, {x, s3, ints({2}), ints({3}), 1}),
  };
  TensorHandle in = f32({2, 3}, std::vector<double>(6, 0.0));
  std::vector<RtValue> r =
      p.run(outs, {in, f32({2, 1}, {1, 2}), f32({3}, {7, 8, 9}), f32({2}, {5, 6})});
  expect_values(r[0], {0, 1, 0, 0, 2, 0});
  expect_values(r[1], {0, 0, 0, 7, 8, 9});
  expect_values(r[2], {0, 5, 0, 0, 0, 6});
  expect_values(r[3], {0, 5, 0, 0, 6, 0});
  expect_values(*in, std::vector<double>(6, 0.0));  // the input is untouched
  for (const RtValue& v : r)
    EXPECT_NE(handle(v)->storage, in->storage);
}

TEST(Scatters, PreserveTheInputsStridesAndOffset) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {3, 4});
  Value* v = p.b.call1(OpId::kT, {p.b.call1(OpId::kSlice, {x, 1, 1, 3})});  // [2, 3], offset 1
  Value* src = p.tensor("s", DType::kFloat32, {3});
  Value* out = p.b.call1(OpId::kSelectScatter, {v, src, 0, 0});
  // as_strided offsets name storage elements of the original: element 6 is x[1, 2].
  Value* as = p.b.call1(OpId::kAsStridedScatter,
                        {v, p.tensor("one", DType::kFloat32, {1}), ints({1}), ints({1}), 6});
  std::vector<RtValue> r =
      p.run({out, as}, {f32({3, 4}, iota(12)), f32({3}, {-1, -2, -3}), f32({1}, {-9})});
  EXPECT_EQ(handle(r[0])->strides, (Strides{1, 4}));
  EXPECT_EQ(handle(r[0])->offset, 1);
  expect_values(r[0], {-1, -2, -3, 2, 6, 10});
  expect_values(r[1], {1, 5, 9, 2, -9, 10});
}

// ---- joins and matrix products
// --------------------------------------------------------------------

TEST(Joins, CatAndStack) {
  Program p;
  Value* a = p.tensor("a", DType::kFloat32, {2, 1});
  Value* b = p.tensor("b", DType::kInt32, {2, 2});
  Value* c1 = p.b.call1(OpId::kCat, {std::vector<Value*>{a, b}, 1});
  Value* c0 = p.b.call1(OpId::kCat, {std::vector<Value*>{b, b}});
  Value* s0 = p.b.call1(OpId::kStack, {std::vector<Value*>{a, a}});
  Value* s2 = p.b.call1(OpId::kStack, {std::vector<Value*>{b, b}, -1});
  std::vector<RtValue> r =
      p.run({c1, c0, s0, s2},
            {f32({2, 1}, {1, 2}), make_int_tensor(DType::kInt32, {2, 2}, {3, 4, 5, 6})});
  EXPECT_EQ(handle(r[0])->dtype(), DType::kFloat32);
  EXPECT_EQ(handle(r[0])->sizes, (Shape{2, 3}));
  expect_values(r[0], {1, 3, 4, 2, 5, 6});
  expect_ints(r[1], {3, 4, 5, 6, 3, 4, 5, 6});
  EXPECT_EQ(handle(r[2])->sizes, (Shape{2, 2, 1}));
  expect_values(r[2], {1, 2, 1, 2});
  EXPECT_EQ(handle(r[3])->sizes, (Shape{2, 2, 2}));
  expect_ints(r[3], {3, 3, 4, 4, 5, 5, 6, 6});
}

TEST(MatrixProducts, MatmulRankCases) {
  Program p;
  Value* m23 = p.tensor("m23", DType::kFloat32, {2, 3});
  Value* m32 = p.tensor("m32", DType::kFloat32, {3, 2});
  Value* v3 = p.tensor("v3", DType::kFloat32, {3});
  Value* w3 = p.tensor("w3", DType::kFloat32, {3});
  Value* v2 = p.tensor("v2", DType::kFloat32, {2});
  std::vector<Value*> outs = {
      p.b.call1(OpId::kMatmul, {m23, m32}),
      p.b.call1(OpId::kMatmul, {v3, w3}),
      p.b.call1(OpId::kMatmul, {v2, m23}),
      p.b.call1(OpId::kMatmul, {m23, w3}),
      p.b.call1(OpId::kMatmul, {p.b.call1(OpId::kT, {m32}), v3}),
  };
  std::vector<RtValue> r =
      p.run(outs, {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({3, 2}, {7, 8, 9, 10, 11, 12}),
                   f32({3}, {1, 2, 3}), f32({3}, {1, 0, -1}), f32({2}, {1, 2})});
  expect_values(r[0], {58, 64, 139, 154});
  EXPECT_EQ(handle(r[1])->sizes, Shape{});
  expect_values(r[1], {-2});
  expect_values(r[2], {9, 12, 15});
  expect_values(r[3], {-2, -2});
  expect_values(r[4], {7 + 18 + 33, 8 + 20 + 36});
}

TEST(MatrixProducts, BatchedBroadcasting) {
  // a[i] = (i + 1) * I, b[j] = [[j, 1], [0, j]]: out[i][j] = (i + 1) * b[j].
  Program p;
  Value* a = p.tensor("a", DType::kFloat32, {2, 1, 2, 2});
  Value* b = p.tensor("b", DType::kFloat32, {3, 2, 2});
  Value* ones = p.tensor("ones", DType::kFloat32, {2});
  Value* ab = p.b.call1(OpId::kMatmul, {a, b});
  Value* vb = p.b.call1(OpId::kMatmul, {ones, b});
  Value* bv = p.b.call1(OpId::kMatmul, {b, ones});
  Value* bmm = p.b.call1(OpId::kBmm, {b, b});
  std::vector<RtValue> r = p.run(
      {ab, vb, bv, bmm}, {f32({2, 1, 2, 2}, {1, 0, 0, 1, 2, 0, 0, 2}),
                          f32({3, 2, 2}, {0, 1, 0, 0, 1, 1, 0, 1, 2, 1, 0, 2}), f32({2}, {1, 1})});
  EXPECT_EQ(handle(r[0])->sizes, (Shape{2, 3, 2, 2}));
  expect_values(r[0], {0, 1, 0, 0, 1, 1, 0, 1, 2, 1, 0, 2, 0, 2, 0, 0, 2, 2, 0, 2, 4, 2, 0, 4});
  EXPECT_EQ(handle(r[1])->sizes, (Shape{3, 2}));
  expect_values(r[1], {0, 1, 1, 2, 2, 3});
  expect_values(r[2], {1, 0, 2, 1, 3, 2});
  // b[j] @ b[j] = [[j^2, 2j], [0, j^2]].
  expect_values(r[3], {0, 0, 0, 0, 1, 2, 0, 1, 4, 4, 0, 4});
}

TEST(MatrixProducts, IntegersAndLinear) {
  Program p;
  Value* a = p.tensor("a", DType::kInt64, {2, 2});
  Value* x = p.tensor("x", DType::kFloat32, {1, 2});
  Value* w = p.tensor("w", DType::kFloat32, {3, 2});
  Value* bias = p.tensor("bias", DType::kFloat32, {3});
  Value* aa = p.b.call1(OpId::kMatmul, {a, a});
  Value* lin = p.b.call1(OpId::kLinear, {x, w, bias});
  Value* nob = p.b.call1(OpId::kLinear, {x, w});
  std::vector<RtValue> r =
      p.run({aa, lin, nob}, {i64({2, 2}, {1, 2, 3, 4}), f32({1, 2}, {1, 2}),
                             f32({3, 2}, {1, 0, 0, 1, 1, 1}), f32({3}, {10, 20, 30})});
  expect_ints(r[0], {7, 10, 15, 22});
  EXPECT_EQ(handle(r[1])->sizes, (Shape{1, 3}));
  expect_values(r[1], {11, 22, 33});
  expect_values(r[2], {1, 2, 3});
}

// ---- decompositions
// ----------------------------------------------------------------------------------

TEST(Composites, RunThroughTheirSubsymbols) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {3});
  Value* sm = p.b.call1(OpId::kSoftmax, {x, 0});
  Value* lsm = p.b.call1(OpId::kLogSoftmax, {x, 0});
  Value* ln = p.b.call1(OpId::kLayerNorm, {x, ints({3})});
  std::vector<RtValue> r = p.run({sm, lsm, ln}, {f32({3}, {1, 2, 3})});
  // e^-2, e^-1, 1 over their sum 1.5032147...
  double z = std::exp(-2.0) + std::exp(-1.0) + 1;
  expect_values(r[0], {std::exp(-2.0) / z, std::exp(-1.0) / z, 1 / z}, 1e-6);
  expect_values(r[1], {-2 - std::log(z), -1 - std::log(z), -std::log(z)}, 1e-6);
  // (x - 2) / sqrt(2/3 + 1e-5)
  double s = 1 / std::sqrt(2.0 / 3 + 1e-5);
  expect_values(r[2], {-s, 0, s}, 1e-6);
}

TEST(Composites, NormalizationsWithWeightAndBias) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {2, 2});
  Value* w = p.tensor("w", DType::kFloat32, {2});
  Value* bias = p.tensor("bias", DType::kFloat32, {2});
  Value* rms = p.b.call1(OpId::kRmsNorm, {x, ints({2}), w, 0.0});
  Value* ln = p.b.call1(OpId::kLayerNorm, {x, ints({2}), w, bias, 0.0});
  std::vector<RtValue> r =
      p.run({rms, ln}, {f32({2, 2}, {3, 4, -1, 1}), f32({2}, {2, 0.5}), f32({2}, {1, -1})});
  // Row [3, 4]: rms = sqrt(12.5); row [-1, 1]: rms = 1. Then times w.
  double r0 = std::sqrt(12.5);
  expect_values(r[0], {2 * 3 / r0, 0.5 * 4 / r0, -2, 0.5}, 1e-6);
  // Each row normalizes to [-1, 1] (mean in the middle, population std 0.5 or 1); then * w + b.
  expect_values(r[1], {-2 + 1, 0.5 - 1, -2 + 1, 0.5 - 1}, 1e-5);
}

TEST(Views, TransposeAndOnesLike) {
  Program p;
  Value* x = p.tensor("x", DType::kInt32, {2, 3});
  Value* t = p.b.call1(OpId::kTranspose, {x, 0, -1});
  Value* o = p.b.call1(OpId::kOnesLike, {t});
  TensorHandle in = make_int_tensor(DType::kInt32, {2, 3}, {1, 2, 3, 4, 5, 6});
  std::vector<RtValue> r = p.run({t, o}, {in});
  EXPECT_EQ(handle(r[0])->storage, in->storage);
  EXPECT_EQ(handle(r[0])->strides, Strides({1, 3}));
  EXPECT_EQ(to_int_vector(*handle(r[0])), std::vector<int64_t>({1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(handle(r[1])->dtype(), DType::kInt32);
  EXPECT_EQ(handle(r[1])->sizes, Shape({3, 2}));
  EXPECT_EQ(to_int_vector(*handle(r[1])), std::vector<int64_t>(6, 1));
}

// ---- aliased inputs
// -----------------------------------------------------------------------------------

TEST(AliasedInputs, SameHandleTwice) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {3});
  Value* y = p.tensor("y", DType::kFloat32, {3});
  p.b.call(OpId::kMul_, {x, 2.0});
  Value* z = p.b.call1(OpId::kAdd, {y, 0.5});
  TensorHandle in = f32({3}, {1, 2, 3});
  std::vector<RtValue> r = p.run({z, y}, {in, in});
  expect_values(r[0], {2.5, 4.5, 6.5});
  EXPECT_EQ(handle(r[1]), in);
}

TEST(AliasedInputs, OverlappingStridedViewsOfOneStorage) {
  // base = ones(64); a = base.as_strided((4,4),(9,1),0); b = base.as_strided((4,4),(9,1),24);
  // a *= 3; b *= 2. Element 27 is a[3, 0] and b[0, 3]: it becomes 6.
  TensorHandle base = f32({64}, std::vector<double>(64, 1.0));
  TensorHandle a = make_view(base, {4, 4}, {9, 1}, 0);
  TensorHandle b = make_view(base, {4, 4}, {9, 1}, 24);
  Program p;
  Value* va = p.tensor("a", DType::kFloat32, {4, 4});
  Value* vb = p.tensor("b", DType::kFloat32, {4, 4});
  p.b.call(OpId::kMul_, {va, 3.0});
  p.b.call(OpId::kMul_, {vb, 2.0});
  p.run({}, {a, b});
  std::vector<double> all = to_vector(*base);
  EXPECT_EQ(std::vector<double>(all.begin() + 24, all.begin() + 28),
            (std::vector<double>{2, 2, 2, 6}));
  EXPECT_EQ(std::vector<double>(all.begin() + 27, all.begin() + 31),
            (std::vector<double>{6, 3, 3, 3}));
  EXPECT_EQ(all[22], 1);
  EXPECT_EQ(all[33], 2);
  EXPECT_EQ(to_vector(*a)[12], 6);  // a[3, 0] sees b's write
}

TEST(AliasedInputs, DisjointAndOverlappingDenseViews) {
  // Interleaved disjoint views: a = [[0,1],[4,5]], b = [[2,3],[6,7]] of arange(8).
  TensorHandle base = f32({8}, iota(8));
  Program p;
  Value* va = p.tensor("a", DType::kFloat32, {2, 2});
  Value* vb = p.tensor("b", DType::kFloat32, {2, 2});
  p.b.call(OpId::kAdd_, {va, vb});
  p.run({}, {make_view(base, {2, 2}, {4, 1}, 0), make_view(base, {2, 2}, {4, 1}, 2)});
  expect_values(*base, {2, 4, 2, 3, 10, 12, 6, 7});

  // Dense views that share part of their memory: eager raises.
  TensorHandle base2 = f32({6}, iota(6));
  Program q;
  Value* qa = q.tensor("a", DType::kFloat32, {4});
  Value* qb = q.tensor("b", DType::kFloat32, {4});
  q.b.call(OpId::kAdd_, {qa, qb});
  expect_user_error(
      [&] {
        q.run({}, {make_view(base2, {4}, {1}, 0), make_view(base2, {4}, {1}, 2)});
      },
      "some elements of the input tensor and the written-to tensor");
}

// ---- input checking
// ------------------------------------------------------------------------------------

TEST(Inputs, AreCheckedAgainstTheTrace) {
  Program p;
  Value* x = p.tensor("x", DType::kFloat32, {2});
  Value* s = p.number("s", ScalarKind::kInt);
  Value* y = p.b.call1(OpId::kMul, {x, s});
  p.b.set_outputs({y});
  expect_user_error([&] { interpret(p.trace, {f32({2}, {1, 2})}); }, "takes 2 inputs but 1");
  expect_user_error(
      [&] {
        interpret(p.trace, {f64({2}, {1, 2}), RtScalar(int64_t{1})});
      },
      "input 0 ('x') must be cpu f32[2], but got cpu f64[2]");
  expect_user_error(
      [&] {
        interpret(p.trace, {f32({3}, {1, 2, 3}), RtScalar(int64_t{1})});
      },
      "input 0 ('x') must be cpu f32[2]");
  expect_user_error(
      [&] {
        interpret(p.trace, {f32({2}, {1, 2}), RtScalar(1.5)});
      },
      "input 1 ('s') must be an int, but got a float");
  expect_values(interpret(p.trace, {f32({2}, {1, 2}), RtScalar(int64_t{3})})[0], {3, 6});

  Program q;
  Value* qx =
      q.b.add_input("x", TensorType{DType::kFloat32, {2, 2}, Device::cpu(), Layout{{1, 2}, 0}});
  q.b.set_outputs({qx});
  expect_user_error([&] { interpret(q.trace, {f32({2, 2}, iota(4))}); }, "strides=(1, 2) offset=0");
  TensorHandle ok = make_view(f32({4}, iota(4)), {2, 2}, {1, 2}, 0);
  EXPECT_EQ(handle(interpret(q.trace, {ok})[0]), ok);
}

}  // namespace
}  // namespace kiln
