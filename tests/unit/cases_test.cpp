// The programs of ../shared/CASES.md, written with the C++ API and run in the reference
// interpreter. Expected values are the eager results CASES.md lists or formulas computed here
// with <cmath>; every case checks outputs, every input's contents afterwards, and which outputs
// are the caller's objects or views of them.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "kiln/kiln.h"
#include "support/case_inputs.h"

namespace kiln {
namespace {

using test::ar;
using test::spec_of;

TensorHandle handle(const RtValue& v) {
  return std::get<TensorHandle>(v);
}

std::vector<double> map(const std::vector<double>& xs, double (*f)(double)) {
  std::vector<double> out;
  for (double x : xs)
    out.push_back(f(x));
  return out;
}

void expect_values(const RtTensor& t, const std::vector<double>& expected, double tol = 1e-5) {
  std::vector<double> got = to_vector(t);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], tol + tol * std::fabs(expected[i])) << "at element " << i;
}

bool shares_storage(const TensorHandle& a, const TensorHandle& b) {
  return a->storage == b->storage;
}

// ---- seeds ----

TEST(Cases, S1_TanhInPlaceThenPower) {
  Trace t = trace(
      [](Tensor a) {
        a.tanh_();
        return a * a * a * a;
      },
      {TensorSpec(f32, {2, 3})});
  TensorHandle a = ar({2, 3});
  std::vector<double> a0 = to_vector(*a);
  auto outs = interpret(t, {a});
  expect_values(*handle(outs[0]), map(a0, [](double x) { return std::pow(std::tanh(x), 4); }));
  expect_values(*a, map(a0, [](double x) { return std::tanh(x); }));
  EXPECT_FALSE(shares_storage(handle(outs[0]), a)) << "the output is a new tensor";
}

TEST(Cases, S2_ExpSinThenCos) {
  Trace t = trace(
      [](Tensor x) {
        x.exp_();
        x.sin_();
        return x.cos();
      },
      {TensorSpec(f32, {2, 3})});
  TensorHandle x = ar({2, 3});
  std::vector<double> x0 = to_vector(*x);
  auto outs = interpret(t, {x});
  expect_values(*handle(outs[0]),
                map(x0, [](double v) { return std::cos(std::sin(std::exp(v))); }));
  expect_values(*x, map(x0, [](double v) { return std::sin(std::exp(v)); }));
}

// ---- in-place on inputs ----

TEST(Cases, I1_ChainedInPlaceReturnsTheCallersObject) {
  Trace t = trace(
      [](Tensor x) {
        x.add_(1).sin_().mul_(5);
        return x;
      },
      {TensorSpec(f32, {4})});
  TensorHandle x = ar({4});
  auto outs = interpret(t, {x});
  EXPECT_EQ(handle(outs[0]), x);
  expect_values(*x, map({0, 0.1, 0.2, 0.3}, [](double v) { return 5 * std::sin(v + 1); }));
}

TEST(Cases, I2_MutationOfADeadTemporary) {
  Trace t = trace(
      [](Tensor x) {
        x.add_(1).sin().mul_(5);
        return x;
      },
      {TensorSpec(f32, {4})});
  TensorHandle x = ar({4});
  auto outs = interpret(t, {x});
  EXPECT_EQ(handle(outs[0]), x);
  expect_values(*x, {1.0, 1.1, 1.2, 1.3});
}

TEST(Cases, I3_MutateAnInputWithAValueComputedFromIt) {
  Trace t = trace(
      [](Tensor a, Tensor b) {
        Tensor c = a + b;
        b.mul_(c);
        return b;
      },
      {TensorSpec(f32, {3}), TensorSpec(f32, {3})});
  TensorHandle a = make_tensor(f32, {3}, {1, 2, 3});
  TensorHandle b = make_tensor(f32, {3}, {4, 5, 6});
  auto outs = interpret(t, {a, b});
  EXPECT_EQ(handle(outs[0]), b);
  expect_values(*b, {4 * 5, 5 * 7, 6 * 9});
  expect_values(*a, {1, 2, 3});
}

TEST(Cases, I4_NoReturnValue) {
  Trace t = trace([](Tensor a) { a += 1; }, {TensorSpec(f32, {3})});
  TensorHandle a = make_tensor(f32, {3}, {1, 2, 3});
  EXPECT_TRUE(interpret(t, {a}).empty());
  expect_values(*a, {2, 3, 4});
}

TEST(Cases, I5_Bf16PlusF32IsComputedInF32AndCastBack) {
  Trace t =
      trace([](Tensor x, Tensor y) { x.add_(y); }, {TensorSpec(bf16, {3}), TensorSpec(f32, {3})});
  TensorHandle x = make_tensor(bf16, {3}, {1.0, 256.0, -2.0});
  // 1 + 1.5*2^-8 lies 3/4 of the way to the next bf16 (1 + 2^-7); 256 + 1.5 lies 3/4 of the way
  // from 256 to 258; -2 + 2^-7 is exactly representable.
  TensorHandle y = make_tensor(f32, {3}, {0.005859375, 1.5, 0.0078125});
  interpret(t, {x, y});
  EXPECT_EQ(x->dtype(), bf16);
  expect_values(*x, {1.0078125, 258.0, -1.9921875}, 0);
}

TEST(Cases, I6_ResidualThenRelu) {
  Trace t = trace(
      [](Tensor h, Tensor r) {
        h.add_(r);
        h.relu_();
        return h * 0.5;
      },
      {TensorSpec(f32, {4}), TensorSpec(f32, {4})});
  TensorHandle h = make_tensor(f32, {4}, {1, -2, 3, -4});
  TensorHandle r = make_tensor(f32, {4}, {0.5, 1, -4, 5});
  auto outs = interpret(t, {h, r});
  expect_values(*h, {1.5, 0, 0, 1});
  expect_values(*handle(outs[0]), {0.75, 0, 0, 0.5});
}

// ---- in-place on intermediates ----

TEST(Cases, M1_IntermediateMutationLeavesInputsAlone) {
  Trace t = trace(
      [](Tensor a, Tensor b) {
        Tensor c = a + b;
        c.add_(1);
        return c;
      },
      {TensorSpec(f32, {2}), TensorSpec(f32, {2})});
  TensorHandle a = make_tensor(f32, {2}, {1, 2});
  TensorHandle b = make_tensor(f32, {2}, {10, 20});
  auto outs = interpret(t, {a, b});
  expect_values(*handle(outs[0]), {12, 23});
  expect_values(*a, {1, 2});
  expect_values(*b, {10, 20});
}

TEST(Cases, M2_IntermediatesMutatedInTurn) {
  Trace t = trace(
      [](Tensor a, Tensor b) {
        Tensor c = a + b;
        c.add_(1);
        Tensor d = c + c;
        d.add_(1);
        c.add_(d);
        return std::make_tuple(c, d);
      },
      {TensorSpec(f32, {2}), TensorSpec(f32, {2})});
  auto outs = interpret(t, {make_tensor(f32, {2}, {1, 1}), make_tensor(f32, {2}, {1, 1})});
  expect_values(*handle(outs[0]), {10, 10});
  expect_values(*handle(outs[1]), {7, 7});
}

// ---- views of inputs ----

TEST(Cases, V1_WriteThroughAViewIsSeenByLaterReads) {
  Trace t = trace(
      [](Tensor x) {
        Tensor y = x.view({4, 2});
        y.add_(ones({4, 2}));
        Tensor z = x * x;
        return std::make_tuple(y, z);
      },
      {TensorSpec(f32, {8})});
  TensorHandle x = ar({8});
  auto outs = interpret(t, {x});
  std::vector<double> after = to_vector(*x);
  EXPECT_NEAR(after[0], 1.0, 1e-6);
  EXPECT_NEAR(after[1], 1.1, 1e-6);
  EXPECT_NEAR(after[2], 1.2, 1e-6);
  std::vector<double> squares;
  for (double v : after)
    squares.push_back(v * v);
  expect_values(*handle(outs[1]), squares);
  EXPECT_TRUE(shares_storage(handle(outs[0]), x)) << "y is a view of the caller's x";
  EXPECT_EQ(handle(outs[0])->sizes, Shape({4, 2}));
}

TEST(Cases, V2_AViewTakenBeforeTheMutationSeesIt) {
  Trace t = trace(
      [](Tensor x) {
        Tensor y = x.view({8});
        x.add_(1);
        return y;
      },
      {TensorSpec(f32, {4, 2})});
  TensorHandle x = ar({4, 2});
  auto outs = interpret(t, {x});
  EXPECT_TRUE(shares_storage(handle(outs[0]), x));
  expect_values(*handle(outs[0]), {1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7});
}

TEST(Cases, V3_StridedInputIsWrittenThroughItsStridesOnly) {
  TensorHandle base = make_tensor(f32, {4}, {1, 1, 1, 1});
  TensorHandle v = make_view(base, {2}, {2}, 0);  // base[0::2]
  Trace t = trace([](Tensor a) { a.add_(1); }, {spec_of(v)});
  interpret(t, {v});
  expect_values(*base, {2, 1, 2, 1});
}

TEST(Cases, V4_TransposeInPlaceChangesTheCallersTensor) {
  Trace t = trace(
      [](Tensor x) {
        x.transpose_(1, 0);
        x[0].add_(1);
        return x;
      },
      {TensorSpec(f32, {4, 2})});
  TensorHandle x = ar({4, 2});
  auto outs = interpret(t, {x});
  EXPECT_EQ(handle(outs[0]), x);
  EXPECT_EQ(x->sizes, Shape({2, 4}));
  EXPECT_EQ(x->strides, std::vector<int64_t>({1, 2}));
  // x[0] is the old column 0: [0, 0.2, 0.4, 0.6] + 1; row 1 (old column 1) is untouched.
  expect_values(*x, {1.0, 1.2, 1.4, 1.6, 0.1, 0.3, 0.5, 0.7});
}

TEST(Cases, V5_SetitemThroughAViewOfAView) {
  Trace t = trace(
      [](Tensor x) {
        Tensor y = x.view({3, 2});
        y[0].index_put_({0}, 0);
        return x;
      },
      {TensorSpec(f32, {6})});
  TensorHandle x = make_tensor(f32, {6}, {5, 6, 7, 8, 9, 10});
  auto outs = interpret(t, {x});
  EXPECT_EQ(handle(outs[0]), x);
  expect_values(*x, {0, 6, 7, 8, 9, 10});
}

// ---- aliased inputs ----

TEST(Cases, A1_TheSameTensorPassedTwice) {
  // Python evaluates a.exp_() before b.tanh_(); C++ leaves operand order open, so sequence it.
  Trace t = trace(
      [](Tensor a, Tensor b) {
        Tensor e = a.exp_();
        Tensor h = b.tanh_();
        return std::make_tuple(e + h, a);
      },
      {TensorSpec(f32, {3}), TensorSpec(f32, {3})});
  TensorHandle x = make_tensor(f32, {3}, {-0.5, 0, 0.5});
  auto outs = interpret(t, {x, x});
  auto te = [](double v) { return std::tanh(std::exp(v)); };
  expect_values(*handle(outs[0]), {2 * te(-0.5), 2 * te(0), 2 * te(0.5)});
  expect_values(*x, {te(-0.5), te(0), te(0.5)});
  EXPECT_EQ(handle(outs[1]), x);
  // The same trace on two distinct tensors gives exp(a0) + tanh(b0).
  TensorHandle a = make_tensor(f32, {3}, {-0.5, 0, 0.5});
  TensorHandle b = make_tensor(f32, {3}, {-0.5, 0, 0.5});
  auto outs2 = interpret(t, {a, b});
  expect_values(*handle(outs2[0]),
                {std::exp(-0.5) + std::tanh(-0.5), 1.0, std::exp(0.5) + std::tanh(0.5)});
}

TEST(Cases, A2_DisjointSlicesOfOneBuffer) {
  TensorHandle x = ar({4, 4});
  std::vector<double> x0 = to_vector(*x);
  TensorHandle a = make_view(x, {2, 4}, {4, 1}, 0);
  TensorHandle b = make_view(x, {2, 4}, {4, 1}, 8);
  Trace t = trace(
      [](Tensor a, Tensor b) {
        a.mul_(3);
        b.mul_(2);
        return a + b;
      },
      {spec_of(a), spec_of(b)});
  auto outs = interpret(t, {a, b});
  std::vector<double> expected_x = x0, expected_out(8);
  for (size_t i = 0; i < 8; ++i) {
    expected_x[i] = 3 * x0[i];
    expected_x[i + 8] = 2 * x0[i + 8];
    expected_out[i] = 3 * x0[i] + 2 * x0[i + 8];
  }
  expect_values(*x, expected_x);
  expect_values(*handle(outs[0]), expected_out);
}

TEST(Cases, A3_OverlappingStridedViews) {
  TensorHandle base = make_tensor(f32, {64}, std::vector<double>(64, 1.0));
  TensorHandle a = make_view(base, {4, 4}, {9, 1}, 0);
  TensorHandle b = make_view(base, {4, 4}, {9, 1}, 24);
  Trace t = trace(
      [](Tensor a, Tensor b) {
        a.mul_(3);
        b.mul_(2);
        return a.clone().view({-1}) + b.clone().view({-1});
      },
      {spec_of(a), spec_of(b)});
  auto outs = interpret(t, {a, b});
  std::vector<double> all = to_vector(*base);
  EXPECT_EQ(std::vector<double>(all.begin() + 24, all.begin() + 28),
            std::vector<double>({2, 2, 2, 6}));
  std::vector<double> out = to_vector(*handle(outs[0]));
  EXPECT_EQ(std::accumulate(out.begin(), out.end(), 0.0), 87.0);
}

TEST(Cases, A4_TransposedAliasIsNotAReshape) {
  Trace t = trace(
      [](Tensor x, Tensor y) {
        Tensor first = x + 1;  // before the mul_, as Python evaluates the tuple left to right
        return std::make_tuple(first, y.mul_(2));
      },
      {TensorSpec(f32, {2, 2}), TensorSpec(f32, {2, 2}).strided({1, 2})});
  TensorHandle a = make_tensor(f32, {2, 2}, {1, 2, 3, 4});
  TensorHandle at = make_view(a, {2, 2}, {1, 2}, 0);  // a.t()
  auto outs = interpret(t, {a, at});
  expect_values(*handle(outs[0]), {2, 3, 4, 5});
  expect_values(*a, {2, 4, 6, 8});
  EXPECT_EQ(handle(outs[1]), at);
  expect_values(*at, {2, 6, 4, 8});
}

// ---- hazards and errors ----

TEST(Cases, H1_ShiftedSelfAssignmentReadsBeforeWriting) {
  Trace t = trace(
      [](Tensor a) {
        a.index_put_({Slice(), Slice(2, 7)}, a.index({Slice(), Slice(1, 6)}) + 2);
      },
      {TensorSpec(f32, {1, 16})});
  TensorHandle a = ar({1, 16});
  interpret(t, {a});
  std::vector<double> v = to_vector(*a);
  std::vector<double> first8(v.begin(), v.begin() + 8);
  std::vector<double> expected = {0.0, 0.1, 2.1, 2.2, 2.3, 2.4, 2.5, 0.7};
  for (size_t i = 0; i < 8; ++i)
    EXPECT_NEAR(first8[i], expected[i], 1e-6) << i;
}

TEST(Cases, H2_BroadcastReadBeforeTheWrite) {
  Trace t = trace(
      [](Tensor w, Tensor x) {
        Tensor out = w + x;
        x.mul_(10);
        return out;
      },
      {TensorSpec(f32, {2, 3}), TensorSpec(f32, {2, 1})});
  TensorHandle w = ar({2, 3});
  TensorHandle x = ar({2, 1});
  auto outs = interpret(t, {w, x});
  expect_values(*handle(outs[0]), {0.0, 0.1, 0.2, 0.4, 0.5, 0.6});
  expect_values(*x, {0, 1});
}

TEST(Cases, H3_WriteIntoAnExpandedTensorRaises) {
  Trace t = trace([](Tensor x) { x.expand({2, 4}).add_(1); }, {TensorSpec(f32, {4})});
  TensorHandle x = make_tensor(f32, {4}, {0, 0, 0, 0});
  try {
    interpret(t, {x});
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("more than one element of the written-to tensor refers to a single memory "
                       "location"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("add_ at cases_test.cpp:"), std::string::npos) << msg;
  }
  expect_values(*x, {0, 0, 0, 0});  // nothing was written
}

}  // namespace
}  // namespace kiln
