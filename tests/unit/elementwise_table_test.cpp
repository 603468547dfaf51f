// Every elementwise op of the table, functional and in-place, run by the interpreter on the same
// inputs and compared with the math written out again here with <cmath> (an independent
// implementation). The in-place form must also write its target and return the caller's object.
// An elementwise op added to ops.def without a row here fails EveryElementwiseOpHasARow.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "kiln/kiln.h"

namespace kiln {
namespace {

using Fn = std::function<double(double, double, double)>;

struct Row {
  Fn f;                      // expected value from the operands a, b, c
  KeywordArgs kwargs = {};   // extra arguments
  bool bool_inputs = false;  // operate on bool tensors (logical ops)
  bool int_inputs = false;   // operate on i64 tensors (bitwise ops)
};

double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

const std::map<std::string, Row>& rows() {
  static const std::map<std::string, Row> r = {
      {"abs", {[](double a, double, double) { return std::fabs(a); }}},
      {"neg", {[](double a, double, double) { return -a; }}},
      {"exp", {[](double a, double, double) { return std::exp(a); }}},
      {"exp2", {[](double a, double, double) { return std::pow(2.0, a); }}},
      {"expm1", {[](double a, double, double) { return std::exp(a) - 1; }}},
      {"log", {[](double a, double, double) { return std::log(a); }}},
      {"log1p", {[](double a, double, double) { return std::log(1 + a); }}},
      {"log2", {[](double a, double, double) { return std::log(a) / std::log(2.0); }}},
      {"sqrt", {[](double a, double, double) { return std::sqrt(a); }}},
      {"rsqrt", {[](double a, double, double) { return 1 / std::sqrt(a); }}},
      {"sin", {[](double a, double, double) { return std::sin(a); }}},
      {"cos", {[](double a, double, double) { return std::cos(a); }}},
      {"tan", {[](double a, double, double) { return std::sin(a) / std::cos(a); }}},
      {"tanh", {[](double a, double, double) { return std::sinh(a) / std::cosh(a); }}},
      {"asin", {[](double a, double, double) { return std::asin(a); }}},
      {"acos", {[](double a, double, double) { return M_PI / 2 - std::asin(a); }}},
      {"atan", {[](double a, double, double) { return std::atan(a); }}},
      {"sinh", {[](double a, double, double) { return (std::exp(a) - std::exp(-a)) / 2; }}},
      {"cosh", {[](double a, double, double) { return (std::exp(a) + std::exp(-a)) / 2; }}},
      {"sigmoid", {[](double a, double, double) { return std::exp(a) / (std::exp(a) + 1); }}},
      {"relu", {[](double a, double, double) { return a > 0 ? a : 0.0; }}},
      {"gelu",
       {[](double a, double, double) { return 0.5 * a * (1 + std::erf(a / std::sqrt(2.0))); }}},
      {"silu", {[](double a, double, double) { return a * std::exp(a) / (std::exp(a) + 1); }}},
      {"erf", {[](double a, double, double) { return std::erf(a); }}},
      {"reciprocal", {[](double a, double, double) { return 1 / a; }}},
      {"floor", {[](double a, double, double) { return std::floor(a); }}},
      {"ceil", {[](double a, double, double) { return std::ceil(a); }}},
      {"round", {[](double a, double, double) { return std::nearbyint(a); }}},
      {"trunc", {[](double a, double, double) { return a < 0 ? std::ceil(a) : std::floor(a); }}},
      {"sign", {[](double a, double, double) { return a > 0 ? 1.0 : (a < 0 ? -1.0 : 0.0); }}},
      {"square", {[](double a, double, double) { return a * a; }}},
      {"logical_not", {[](double a, double, double) { return a == 0 ? 1.0 : 0.0; }, {}, true}},
      {"bitwise_not",
       {[](double a, double, double) { return static_cast<double>(~static_cast<int64_t>(a)); },
        {},
        false,
        true}},
      {"isnan", {[](double a, double, double) { return a != a ? 1.0 : 0.0; }}},
      {"add", {[](double a, double b, double) { return a + 2 * b; }, {{"alpha", 2}}}},
      {"sub", {[](double a, double b, double) { return a - b; }}},
      {"mul", {[](double a, double b, double) { return a * b; }}},
      {"div",
       {[](double a, double b, double) { return std::floor(a / b); },
        {{"rounding_mode", Constant(std::string("floor"))}}}},
      {"pow", {[](double a, double b, double) {
         return std::exp(b * std::log(std::fabs(a))) * (a < 0 ? std::nan("") : 1.0);
       }}},
      {"remainder", {[](double a, double b, double) { return a - b * std::floor(a / b); }}},
      {"fmod", {[](double a, double b, double) { return a - b * std::trunc(a / b); }}},
      {"maximum", {[](double a, double b, double) { return a > b ? a : b; }}},
      {"minimum", {[](double a, double b, double) { return a < b ? a : b; }}},
      {"atan2", {[](double a, double b, double) { return std::atan2(a, b); }}},
      {"eq", {[](double a, double b, double) { return a == b ? 1.0 : 0.0; }}},
      {"ne", {[](double a, double b, double) { return a != b ? 1.0 : 0.0; }}},
      {"lt", {[](double a, double b, double) { return a < b ? 1.0 : 0.0; }}},
      {"le", {[](double a, double b, double) { return a <= b ? 1.0 : 0.0; }}},
      {"gt", {[](double a, double b, double) { return a > b ? 1.0 : 0.0; }}},
      {"ge", {[](double a, double b, double) { return a >= b ? 1.0 : 0.0; }}},
      {"logical_and", {[](double a, double b, double) { return a && b ? 1.0 : 0.0; }, {}, true}},
      {"logical_or", {[](double a, double b, double) { return a || b ? 1.0 : 0.0; }, {}, true}},
      {"logical_xor",
       {[](double a, double b, double) { return (a != 0) != (b != 0) ? 1.0 : 0.0; }, {}, true}},
      {"bitwise_and",
       {[](double a, double b, double) {
          return static_cast<double>(static_cast<int64_t>(a) & static_cast<int64_t>(b));
        },
        {},
        false,
        true}},
      {"bitwise_or",
       {[](double a, double b, double) {
          return static_cast<double>(static_cast<int64_t>(a) | static_cast<int64_t>(b));
        },
        {},
        false,
        true}},
      {"copy", {[](double, double b, double) { return b; }}},
      {"bitwise_xor",
       {[](double a, double b, double) {
          return static_cast<double>(static_cast<int64_t>(a) ^ static_cast<int64_t>(b));
        },
        {},
        false,
        true}},
      {"where", {[](double a, double b, double c) { return a != 0 ? b : c; }, {}, true}},
      // torch.clamp is min(max(a, lo), hi): with lo > hi the result is hi.
      {"clamp", {[](double a, double b, double c) { return std::min(std::max(a, b), c); }}},
      {"lerp", {[](double a, double b, double c) { return a + c * (b - a); }}},
      {"addcmul", {[](double a, double b, double c) { return a + 0.5 * b * c; }, {{"value", 0.5}}}},
      {"addcdiv", {[](double a, double b, double c) { return a - b / c; }, {{"value", -1}}}},
      {"to",
       {[](double a, double, double) { return static_cast<double>(static_cast<int64_t>(a)); }, {}}},
  };
  return r;
}

// Operands: a in (-1, 1) away from the singular points, b and c positive or mixed.
const std::vector<double> kA = {-0.75, -0.25, 0.3, 0.5, 0.9, 2.5};
const std::vector<double> kB = {0.5, 1.25, -0.4, 0.5, 2.0, -1.5};
const std::vector<double> kC = {1.5, 0.75, 0.2, 0.25, 0.6, 3.0};
const std::vector<double> kBoolA = {1, 0, 1, 0, 1, 1};
const std::vector<double> kBoolB = {1, 1, 0, 0, 1, 0};
const std::vector<double> kIntA = {-3, 0, 5, 12, 7, -8};
const std::vector<double> kIntB = {6, 1, 3, 10, -2, 5};

bool near(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return std::fabs(got - want) <= 2e-6 + 2e-6 * std::fabs(want);
}

TEST(ElementwiseTable, EveryElementwiseOpHasARow) {
  for (const OpInfo& op : all_ops()) {
    if (op.kind == OpKind::kElementwise) {
      EXPECT_TRUE(rows().contains(op.name)) << op.name;
    }
  }
}

// Runs `op` (functional or in-place) on fresh inputs; returns the values of its result and
// checks the in-place contract.
std::vector<double> run(const OpInfo& op, const Row& row) {
  Trace t;
  Builder b(t);
  DType dtype = row.bool_inputs ? kbool : (row.int_inputs ? i64 : f32);
  int arity = op.arity;
  std::vector<TensorHandle> inputs;
  std::vector<Operand> args;
  for (int i = 0; i < arity; ++i) {
    DType d = dtype;
    if (op.dtype_rule == DTypeRule::kWhere && i > 0) d = f32;
    const std::vector<double>& values = row.bool_inputs && d == kbool ? (i == 0 ? kBoolA : kBoolB)
                                        : row.int_inputs              ? (i == 0 ? kIntA : kIntB)
                                                         : (i == 0 ? kA : (i == 1 ? kB : kC));
    std::vector<double> v = values;
    if (op.dtype_rule == DTypeRule::kWhere && i > 0) v = i == 1 ? kB : kC;
    inputs.push_back(make_tensor(d, {2, 3}, v));
    args.push_back(b.add_input(std::string(1, static_cast<char>('a' + i)),
                               TensorType{d, {2, 3}, Device::cpu(), std::nullopt}));
  }
  if (op.dtype_rule == DTypeRule::kCast) args.push_back(Constant(i64));
  Value* out = b.call1(op.id, args, row.kwargs);
  b.set_outputs({out});
  std::vector<RtValue> rt(inputs.begin(), inputs.end());
  auto outs = interpret(t, rt);
  TensorHandle result = std::get<TensorHandle>(outs[0]);
  if (op.is_inplace_elementwise()) {
    EXPECT_EQ(result, inputs[0]) << op.name << " returns the caller's object";
  }
  return to_vector(*result);
}

TEST(ElementwiseTable, FunctionalAndInPlaceFormsMatchTheMath) {
  int checked = 0;
  for (const OpInfo& op : all_ops()) {
    if (op.kind != OpKind::kElementwise && !op.is_inplace_elementwise()) {
      continue;
    }
    const Row& row = rows().at(op_info(op.functional_form).name);
    SCOPED_TRACE(op.name);
    std::vector<double> got = run(op, row);
    bool bool_out = op.dtype_rule == DTypeRule::kCompare || op.dtype_rule == DTypeRule::kLogical ||
                    op.dtype_rule == DTypeRule::kUnaryToBool;
    for (size_t i = 0; i < got.size(); ++i) {
      double a = row.bool_inputs ? kBoolA[i] : row.int_inputs ? kIntA[i] : kA[i];
      double b = row.bool_inputs && op.dtype_rule != DTypeRule::kWhere ? kBoolB[i]
                 : row.int_inputs                                      ? kIntB[i]
                                                                       : kB[i];
      double want = row.f(a, b, kC[i]);
      // An in-place op stores into its f32 (or bool / i64) target: comparisons give 0 or 1,
      // and everything else rounds to f32.
      if (!row.bool_inputs && !row.int_inputs && !bool_out) want = static_cast<float>(want);
      EXPECT_TRUE(near(got[i], want)) << "element " << i << ": got " << got[i] << ", want " << want;
    }
    ++checked;
  }
  EXPECT_GE(checked, 100);
}

TEST(ElementwiseTable, GeluTanhApproximation) {
  Trace t;
  Builder b(t);
  Value* x = b.add_input("x", TensorType{f32, {3}, Device::cpu(), std::nullopt});
  b.set_outputs({b.call1(OpId::kGelu, {x}, {{"approximate", Constant(std::string("tanh"))}})});
  auto outs = interpret(t, {make_tensor(f32, {3}, {-1.5, 0.5, 2.0})});
  std::vector<double> got = to_vector(*std::get<TensorHandle>(outs[0]));
  EXPECT_NEAR(got[0], gelu_tanh(-1.5), 1e-6);
  EXPECT_NEAR(got[1], gelu_tanh(0.5), 1e-6);
  EXPECT_NEAR(got[2], gelu_tanh(2.0), 1e-6);
}

}  // namespace
}  // namespace kiln
