// Type rules: result dtypes and shapes as PyTorch computes them (expected values written from
// PyTorch's documented rules, not from kiln), and user errors where PyTorch raises.
#include <gtest/gtest.h>

#include "kiln/kiln.h"

namespace kiln {
namespace {

TensorSpec spec(DType d, Shape s) {
  return TensorSpec(d, std::move(s));
}

template <class F>
TensorType out(F fn, std::vector<TensorSpec> specs, size_t i = 0) {
  Trace t = trace(fn, specs);
  verify_trace(t);
  return t.outputs().at(i)->tensor_type();
}

// The message of the UserError `fn` raises while tracing, or "" if none.
template <class F>
std::string error(F fn, std::vector<TensorSpec> specs) {
  try {
    trace(fn, specs);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_TYPE(t, dtype_, ...)          \
  do {                                       \
    TensorType tt = (t);                     \
    EXPECT_EQ(tt.dtype, dtype_);             \
    EXPECT_EQ(tt.shape, Shape(__VA_ARGS__)); \
  } while (0)

#define EXPECT_ERROR(msg, substring) EXPECT_NE((msg).find(substring), std::string::npos) << (msg)

TEST(TypePromotion, PythonNumbersAreWeak) {
  EXPECT_TYPE(out([](Tensor a) { return a + 2.5; }, {spec(i32, {2})}), f32, {2});
  EXPECT_TYPE(out([](Tensor a) { return a + 5; }, {spec(i32, {2})}), i32, {2});
  EXPECT_TYPE(out([](Tensor a) { return a + 1; }, {spec(kbool, {2})}), i64, {2});
  EXPECT_TYPE(out([](Tensor a) { return a + true; }, {spec(kbool, {2})}), kbool, {2});
  EXPECT_TYPE(out([](Tensor a) { return a * 2.5; }, {spec(f16, {2})}), f16, {2});
  EXPECT_TYPE(out([](Tensor a) { return a * 2.5; }, {spec(f64, {2})}), f64, {2});
  EXPECT_TYPE(out([](Tensor a) { return 2 - a; }, {spec(bf16, {2})}), bf16, {2});
}

TEST(TypePromotion, ZeroDimTensorsRankBelowDimensionedOnes) {
  // Same category: the dimensioned tensor's dtype wins.
  EXPECT_TYPE(out([](Tensor a, Tensor b) { return a + b; }, {spec(f16, {3}), spec(f32, {})}), f16,
              {3});
  EXPECT_TYPE(out([](Tensor a, Tensor b) { return a + b; }, {spec(i32, {3}), spec(i64, {})}), i32,
              {3});
  // Higher category in the 0-dim tensor: its dtype.
  EXPECT_TYPE(out([](Tensor a, Tensor b) { return a + b; }, {spec(i32, {3}), spec(f64, {})}), f64,
              {3});
  // Both dimensioned: ordinary promotion, f16 with bf16 gives f32.
  EXPECT_TYPE(out([](Tensor a, Tensor b) { return a * b; }, {spec(f16, {3}), spec(bf16, {3})}), f32,
              {3});
  EXPECT_TYPE(out([](Tensor a, Tensor b) { return a - b; }, {spec(i64, {3}), spec(f16, {1})}), f16,
              {3});
}

TEST(TypePromotion, OpCategories) {
  EXPECT_TYPE(out([](Tensor a) { return a.sin(); }, {spec(i64, {2})}), f32, {2});
  EXPECT_TYPE(out([](Tensor a) { return a.sin(); }, {spec(f16, {2})}), f16, {2});
  EXPECT_TYPE(out([](Tensor a) { return a.abs(); }, {spec(i32, {2})}), i32, {2});
  EXPECT_TYPE(out([](Tensor a, Tensor b) { return a.eq(b); }, {spec(f32, {2}), spec(i64, {2})}),
              kbool, {2});
  EXPECT_TYPE(out([](Tensor a, Tensor b) { return a / b; }, {spec(i64, {2}), spec(i64, {2})}), f32,
              {2});
  EXPECT_TYPE(
      out([](Tensor a, Tensor b) { return a.div(b, "floor"); }, {spec(i64, {2}), spec(i32, {2})}),
      i64, {2});
  EXPECT_TYPE(out([](Tensor a) { return a.logical_not(); }, {spec(f32, {2})}), kbool, {2});
  EXPECT_TYPE(out([](Tensor a) { return a.isnan(); }, {spec(f32, {2})}), kbool, {2});
  EXPECT_TYPE(out([](Tensor a) { return a.atan2(a); }, {spec(i32, {2})}), f32, {2});
  EXPECT_TYPE(out([](Tensor a) { return a.to(bf16); }, {spec(i32, {2})}), bf16, {2});
  EXPECT_TYPE(out([](Tensor c, Tensor a) { return where(c, a, 2.5); },
                  {spec(kbool, {2, 1}), spec(i32, {3})}),
              f32, {2, 3});
  EXPECT_TYPE(
      out([](Tensor a, Tensor b) { return a.clamp(b, 3); }, {spec(i32, {2}), spec(i64, {2})}), i64,
      {2});
}

TEST(TypePromotion, RejectedDtypes) {
  EXPECT_ERROR(error([](Tensor a) { return a.abs(); }, {spec(kbool, {2})}),
               "does not support bool");
  EXPECT_ERROR(error([](Tensor a) { return a - a; }, {spec(kbool, {2})}),
               "subtraction of two bool");
  EXPECT_ERROR(error([](Tensor a) { return a & 1; }, {spec(f32, {2})}), "needs integer or bool");
  EXPECT_ERROR(error([](Tensor a) { return a.gelu(); }, {spec(i64, {2})}), "floating-point");
  EXPECT_ERROR(error([](Tensor a) { return where(a, a, a); }, {spec(f32, {2})}), "bool condition");
  EXPECT_ERROR(error([](Tensor a) { return a.div(a, "round"); }, {spec(f32, {2})}),
               "rounding_mode");
  EXPECT_ERROR(error([](Tensor a) { return a.clamp(std::nullopt); }, {spec(f32, {2})}),
               "at least one of 'min' or 'max'");
}

TEST(InPlace, ResultMustCastBackAndKeepTheShape) {
  // I5: bf16 += f32 is computed in f32 and cast back into bf16.
  EXPECT_TYPE(out([](Tensor x, Tensor y) { return x.add_(y); }, {spec(bf16, {4}), spec(f32, {4})}),
              bf16, {4});
  EXPECT_TYPE(out([](Tensor x, Tensor y) { return x.mul_(y); }, {spec(f32, {4}), spec(i64, {4})}),
              f32, {4});
  std::string cast = error([](Tensor x) { return x.add_(1.5); }, {spec(i64, {4})});
  EXPECT_ERROR(cast, "kiln: add_ at type_rules_test.cpp:");
  EXPECT_ERROR(cast, "result type f32 can't be cast to the desired output type i64");
  EXPECT_ERROR(error([](Tensor x) { return x.sin_(); }, {spec(i32, {4})}), "can't be cast");
  std::string grow =
      error([](Tensor x, Tensor y) { return x.add_(y); }, {spec(f32, {4}), spec(f32, {2, 4})});
  EXPECT_ERROR(grow, "output with shape [4] doesn't match the broadcast shape [2, 4]");
  EXPECT_ERROR(
      error([](Tensor x, Tensor y) { return x.copy_(y); }, {spec(f32, {4}), spec(f32, {3})}),
      "shapes [4] and [3] do not broadcast");
  EXPECT_ERROR(
      error([](Tensor x, Tensor y) { return x.copy_(y); }, {spec(f32, {4}), spec(f32, {2, 4})}),
      "cannot be broadcast to the target's shape [4]");
  EXPECT_ERROR(
      error([](Tensor x, Tensor y) { return x.fill_(y); }, {spec(f32, {4}), spec(f32, {1})}),
      "0-dimensional value tensor");
}

TEST(Broadcasting, Shapes) {
  EXPECT_TYPE(
      out([](Tensor a, Tensor b) { return a + b; }, {spec(f32, {2, 1, 3}), spec(f32, {4, 3})}), f32,
      {2, 4, 3});
  EXPECT_TYPE(out([](Tensor a, Tensor b) { return a * b; }, {spec(f32, {0, 1}), spec(f32, {1, 5})}),
              f32, {0, 5});
  std::string msg =
      error([](Tensor a, Tensor b) { return a + b; }, {spec(f32, {2, 3}), spec(f32, {4, 3})});
  EXPECT_ERROR(msg, "kiln: add at type_rules_test.cpp:");
  EXPECT_ERROR(msg, "shapes [2, 3] and [4, 3] do not broadcast");
}

TEST(Reductions, DtypesAndShapes) {
  EXPECT_TYPE(out([](Tensor a) { return a.sum(); }, {spec(i32, {2, 3})}), i64, {});
  EXPECT_TYPE(out([](Tensor a) { return a.sum(IntList{1}, true); }, {spec(kbool, {2, 3})}), i64,
              {2, 1});
  EXPECT_TYPE(out(
                  [](Tensor a) {
                    return a.sum(IntList{0, -1}, false, f64);
                  },
                  {spec(f32, {2, 3, 4})}),
              f64, {3});
  EXPECT_TYPE(out([](Tensor a) { return a.prod(1); }, {spec(f16, {2, 3})}), f16, {2});
  EXPECT_TYPE(out([](Tensor a) { return a.mean(IntList{0}); }, {spec(f32, {2, 3})}), f32, {3});
  EXPECT_TYPE(out([](Tensor a) { return a.amax(IntList{}, true); }, {spec(i32, {2, 3})}), i32,
              {1, 1});
  EXPECT_TYPE(out([](Tensor a) { return a.var(IntList{1}, 0); }, {spec(f32, {2, 3})}), f32, {2});
  EXPECT_TYPE(out([](Tensor a) { return a.argmax(); }, {spec(f32, {2, 3})}), i64, {});
  EXPECT_TYPE(out([](Tensor a) { return a.argmin(0, true); }, {spec(f32, {2, 3})}), i64, {1, 3});
  EXPECT_ERROR(error([](Tensor a) { return a.mean(); }, {spec(i64, {2})}), "mean could not infer");
  EXPECT_ERROR(error([](Tensor a) { return a.std(); }, {spec(i64, {2})}), "floating-point");
  EXPECT_ERROR(error(
                   [](Tensor a) {
                     return a.sum(IntList{0, -2});
                   },
                   {spec(f32, {2, 3})}),
               "appears multiple times");
  EXPECT_ERROR(error([](Tensor a) { return a.sum(IntList{2}); }, {spec(f32, {2, 3})}),
               "dimension 2 is out of range for a tensor of rank 2");
  EXPECT_ERROR(error([](Tensor a) { return a.amax(IntList{0}); }, {spec(f32, {0, 3})}), "size 0");
}

TEST(Views, Shapes) {
  EXPECT_TYPE(out([](Tensor a) { return a.view({-1, 2}); }, {spec(f32, {3, 4})}), f32, {6, 2});
  EXPECT_TYPE(out(
                  [](Tensor a) {
                    return a.reshape({2, 2, 3});
                  },
                  {spec(f32, {3, 4})}),
              f32, {2, 2, 3});
  EXPECT_TYPE(out(
                  [](Tensor a) {
                    return a.permute({2, 0, 1});
                  },
                  {spec(f32, {2, 3, 4})}),
              f32, {4, 2, 3});
  EXPECT_TYPE(out([](Tensor a) { return a.transpose(-1, 0); }, {spec(f32, {2, 3, 4})}), f32,
              {4, 3, 2});
  EXPECT_TYPE(out([](Tensor a) { return a.t(); }, {spec(f32, {3})}), f32, {3});
  EXPECT_TYPE(out(
                  [](Tensor a) {
                    return a.expand({2, 3, -1});
                  },
                  {spec(f32, {3, 1})}),
              f32, {2, 3, 1});
  EXPECT_TYPE(out([](Tensor a) { return a.unsqueeze(-1); }, {spec(f32, {2, 3})}), f32, {2, 3, 1});
  EXPECT_TYPE(out([](Tensor a) { return a.squeeze(); }, {spec(f32, {1, 2, 1})}), f32, {2});
  EXPECT_TYPE(out([](Tensor a) { return a.squeeze(IntList{1}); }, {spec(f32, {1, 2, 1})}), f32,
              {1, 2, 1});
  EXPECT_TYPE(out([](Tensor a) { return a.flatten(1); }, {spec(f32, {2, 3, 4})}), f32, {2, 12});
  EXPECT_TYPE(out([](Tensor a) { return a.flatten(); }, {spec(f32, {})}), f32, {1});
  EXPECT_TYPE(out(
                  [](Tensor a) {
                    return a.unflatten(1, {-1, 2});
                  },
                  {spec(f32, {3, 4})}),
              f32, {3, 2, 2});
  EXPECT_TYPE(out([](Tensor a) { return a.slice(0, -3); }, {spec(f32, {10})}), f32, {3});
  EXPECT_TYPE(out([](Tensor a) { return a.slice(0, 1, 8, 3); }, {spec(f32, {10})}), f32, {3});
  EXPECT_TYPE(out([](Tensor a) { return a.slice(0, 7, 2); }, {spec(f32, {10})}), f32, {0});
  EXPECT_TYPE(out([](Tensor a) { return a.narrow(1, -2, 2); }, {spec(f32, {2, 5})}), f32, {2, 2});
  EXPECT_TYPE(out([](Tensor a) { return a.select(1, -1); }, {spec(f32, {2, 5})}), f32, {2});
  EXPECT_TYPE(out(
                  [](Tensor a) {
                    return a.index({0, Ellipsis, None, Slice(1, 3)});
                  },
                  {spec(f32, {2, 3, 4})}),
              f32, {3, 1, 2});
  EXPECT_TYPE(out([](Tensor a) { return a[-1]; }, {spec(f32, {2, 3})}), f32, {3});
  EXPECT_TYPE(out([](Tensor a) { return a.diagonal(1); }, {spec(f32, {3, 4})}), f32, {3});
  EXPECT_TYPE(out([](Tensor a) { return a.diagonal(-1); }, {spec(f32, {3, 4})}), f32, {2});
  EXPECT_TYPE(out([](Tensor a) { return a.diagonal(0, 0, 2); }, {spec(f32, {3, 5, 4})}), f32,
              {5, 3});
  EXPECT_TYPE(out(
                  [](Tensor a) {
                    return a.as_strided({2, 2}, {1, 2}, 1);
                  },
                  {spec(f32, {6})}),
              f32, {2, 2});

  Trace split = trace([](Tensor a) { return a.split(3); }, {spec(f32, {10, 2})});
  ASSERT_EQ(split.outputs().size(), 4u);
  EXPECT_EQ(split.outputs()[3]->tensor_type().shape, Shape({1, 2}));
  // chunk(6, 4): chunks of ceil(6/4) = 2, so three chunks, as in PyTorch.
  Trace chunk = trace([](Tensor a) { return a.chunk(4); }, {spec(f32, {6})});
  EXPECT_EQ(chunk.outputs().size(), 3u);
  Trace unbind = trace([](Tensor a) { return a.unbind(1); }, {spec(f32, {2, 3})});
  EXPECT_EQ(unbind.outputs().size(), 3u);
  EXPECT_EQ(unbind.outputs()[0]->tensor_type().shape, Shape({2}));
}

TEST(Views, Errors) {
  EXPECT_ERROR(error([](Tensor a) { return a.view({5}); }, {spec(f32, {3, 4})}),
               "shape '[5]' is invalid for input of size 12");
  EXPECT_ERROR(error(
                   [](Tensor a) {
                     return a.view({-1, -1});
                   },
                   {spec(f32, {3, 4})}),
               "only one dimension can be inferred");
  EXPECT_ERROR(error(
                   [](Tensor a) {
                     return a.permute({0, 0});
                   },
                   {spec(f32, {3, 4})}),
               "repeated dim");
  EXPECT_ERROR(error([](Tensor a) { return a.t(); }, {spec(f32, {2, 3, 4})}), "<= 2 dimensions");
  EXPECT_ERROR(error(
                   [](Tensor a) {
                     return a.expand({3, 4});
                   },
                   {spec(f32, {3, 2})}),
               "must match the existing size (2) at non-singleton dimension 1");
  EXPECT_ERROR(error([](Tensor a) { return a.slice(0, 0, 4, 0); }, {spec(f32, {4})}),
               "slice step must be positive");
  EXPECT_ERROR(error([](Tensor a) { return a.narrow(0, 2, 3); }, {spec(f32, {4})}),
               "exceeds dimension size");
  EXPECT_ERROR(error([](Tensor a) { return a.select(0, 4); }, {spec(f32, {4})}),
               "index 4 is out of range for dimension 0 with size 4");
  EXPECT_ERROR(error(
                   [](Tensor a) {
                     return a.index({0, 0, 0});
                   },
                   {spec(f32, {2, 3})}),
               "too many indices for tensor of dimension 2");
  EXPECT_ERROR(error([](Tensor a) { return a.index({Slice(None, None, -1)}); }, {spec(f32, {2})}),
               "slice step must be positive");
  EXPECT_ERROR(error([](Tensor a) { return a.diagonal(0, 1, 1); }, {spec(f32, {2, 3})}),
               "diagonal dimensions cannot be identical");
  EXPECT_ERROR(error(
                   [](Tensor a) {
                     return a.split(IntList{1, 2});
                   },
                   {spec(f32, {4})}),
               "sum exactly to 4");
  EXPECT_ERROR(error([](Tensor a) { return a.chunk(0); }, {spec(f32, {4})}), "greater than 0");
  EXPECT_ERROR(error(
                   [](Tensor a) {
                     return a.as_strided({2, 2}, {1});
                   },
                   {spec(f32, {4})}),
               "mismatch in length of strides and shape");
  EXPECT_ERROR(error([](Tensor a) { return a.unsqueeze(3); }, {spec(f32, {4})}),
               "dimension 3 is out of range for a tensor of rank 2");
}

TEST(Scatters, SrcMustHaveTheViewsShape) {
  EXPECT_TYPE(out([](Tensor a, Tensor s) { return slice_scatter(a, s, 1, 0, 4, 2); },
                  {spec(f32, {3, 4}), spec(f32, {3, 2})}),
              f32, {3, 4});
  EXPECT_TYPE(out([](Tensor a, Tensor s) { return select_scatter(a, s, 0, 1); },
                  {spec(f32, {3, 4}), spec(f32, {4})}),
              f32, {3, 4});
  EXPECT_TYPE(out([](Tensor a, Tensor s) { return diagonal_scatter(a, s, 1); },
                  {spec(f32, {3, 4}), spec(f32, {3})}),
              f32, {3, 4});
  EXPECT_TYPE(out([](Tensor a, Tensor s) { return as_strided_scatter(a, s, {2}, {5}); },
                  {spec(f32, {3, 4}), spec(f32, {2})}),
              f32, {3, 4});
  EXPECT_ERROR(error([](Tensor a, Tensor s) { return slice_scatter(a, s, 1, 0, 4, 2); },
                     {spec(f32, {3, 4}), spec(f32, {3, 3})}),
               "expected src to have a size equal to the slice of self [3, 2]");
  EXPECT_ERROR(error([](Tensor a, Tensor s) { return select_scatter(a, s, 0, 1); },
                     {spec(f32, {3, 4}), spec(f64, {4})}),
               "dtype");
}

TEST(Joins, CatStackMatmul) {
  EXPECT_TYPE(out(
                  [](Tensor a, Tensor b) {
                    return cat({a, b});
                  },
                  {spec(f32, {2, 3}), spec(f64, {1, 3})}),
              f64, {3, 3});
  EXPECT_TYPE(out(
                  [](Tensor a, Tensor b) {
                    return stack({a, b}, -1);
                  },
                  {spec(f32, {2, 3}), spec(f32, {2, 3})}),
              f32, {2, 3, 2});
  EXPECT_ERROR(error(
                   [](Tensor a, Tensor b) {
                     return cat({a, b}, 1);
                   },
                   {spec(f32, {2, 3}), spec(f32, {1, 3})}),
               "sizes of tensors must match except in dimension 1");
  EXPECT_ERROR(error(
                   [](Tensor a, Tensor b) {
                     return stack({a, b});
                   },
                   {spec(f32, {2}), spec(f32, {3})}),
               "equal size");
  EXPECT_TYPE(
      out([](Tensor a, Tensor b) { return matmul(a, b); }, {spec(f32, {3}), spec(f32, {3})}), f32,
      {});
  EXPECT_TYPE(
      out([](Tensor a, Tensor b) { return matmul(a, b); }, {spec(f32, {2, 3}), spec(f32, {3})}),
      f32, {2});
  EXPECT_TYPE(
      out([](Tensor a, Tensor b) { return matmul(a, b); }, {spec(f32, {3}), spec(f32, {3, 4})}),
      f32, {4});
  EXPECT_TYPE(out([](Tensor a, Tensor b) { return matmul(a, b); },
                  {spec(f32, {5, 1, 2, 3}), spec(f32, {4, 3, 2})}),
              f32, {5, 4, 2, 2});
  EXPECT_ERROR(error([](Tensor a, Tensor b) { return matmul(a, b); },
                     {spec(f32, {2, 3}), spec(f32, {2, 3})}),
               "cannot be multiplied");
  EXPECT_ERROR(error([](Tensor a, Tensor b) { return matmul(a, b); },
                     {spec(f32, {2, 3}), spec(f64, {3, 3})}),
               "same dtype");
  EXPECT_TYPE(out([](Tensor a, Tensor b) { return bmm(a, b); },
                  {spec(f32, {2, 3, 4}), spec(f32, {2, 4, 5})}),
              f32, {2, 3, 5});
  EXPECT_TYPE(out([](Tensor x, Tensor w, Tensor b) { return linear(x, w, b); },
                  {spec(f32, {7, 2, 3}), spec(f32, {5, 3}), spec(f32, {5})}),
              f32, {7, 2, 5});
}

TEST(Creation, DtypesFromTheFillValue) {
  auto one = [](auto fn) { return out(fn, {spec(f32, {2})}); };
  EXPECT_TYPE(one([](Tensor) { return full({2, 3}, 3); }), i64, {2, 3});
  EXPECT_TYPE(one([](Tensor) { return full({2}, true); }), kbool, {2});
  EXPECT_TYPE(one([](Tensor) { return full({2}, 1.5); }), f32, {2});
  EXPECT_TYPE(one([](Tensor) { return zeros({0, 4}); }), f32, {0, 4});
  EXPECT_TYPE(one([](Tensor) { return ones({3}, i32); }), i32, {3});
  EXPECT_TYPE(one([](Tensor) { return arange(0, 10, 3); }), i64, {4});
  EXPECT_TYPE(one([](Tensor) { return arange(0, 1, 0.25); }), f32, {4});
  EXPECT_TYPE(one([](Tensor) { return arange(5, 0, -2); }), i64, {3});
  EXPECT_TYPE(one([](Tensor a) { return full_like(a, 2, i64); }), i64, {2});
  EXPECT_TYPE(one([](Tensor a) { return empty_like(a); }), f32, {2});
  EXPECT_ERROR(error([](Tensor) { return arange(0, 10, -1); }, {spec(f32, {2})}),
               "inconsistent with step sign");
  EXPECT_ERROR(error(
                   [](Tensor) {
                     return zeros({2, -1});
                   },
                   {spec(f32, {2})}),
               "negative dimension");
}

TEST(Decompositions, RecordTheirSubsymbols) {
  Trace t = trace([](Tensor x, Tensor w) { return layer_norm(x, {4}, w, w); },
                  {spec(bf16, {3, 4}), spec(bf16, {4})});
  verify_trace(t);
  const Node& node = *t.nodes().back();
  EXPECT_EQ(node.op->name, "layer_norm");
  EXPECT_EQ(t.outputs()[0]->tensor_type().dtype, bf16);
  // bf16 is normalized in f32 and cast back, as PyTorch's kernel does.
  EXPECT_EQ(node.subsymbols.front()->op->name, "to");
  EXPECT_EQ(node.subsymbols.back()->op->name, "to");
  EXPECT_EQ(node.subsymbols.back()->outputs[0], t.outputs()[0]);
  EXPECT_ERROR(error([](Tensor x) { return x.softmax(0); }, {spec(i64, {3})}), "floating-point");
  EXPECT_ERROR(error([](Tensor x) { return layer_norm(x, {3}); }, {spec(f32, {3, 4})}),
               "normalized_shape=[3]");
}

TEST(Signature, BindingErrorsNameTheParameter) {
  Trace t;
  Builder b(t);
  Value* x = b.add_input("x", TensorType{f32, {2}, Device::cpu(), std::nullopt});
  auto msg = [&](auto fn) {
    try {
      fn();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_ERROR(msg([&] { b.call(OpId::kAdd, {x}); }), "missing the required argument 'other'");
  EXPECT_ERROR(msg([&] {
                 b.call(OpId::kAdd, {x, x}, {{"beta", 1}});
               }),
               "unexpected keyword argument 'beta'");
  EXPECT_ERROR(msg([&] {
                 b.call(OpId::kSum, {x, Constant(std::string("a"))});
               }),
               "argument 'dim' of sum must be a list of ints or None");
  EXPECT_ERROR(msg([&] { b.call(OpId::kExp, {x, x}); }), "at most 1 positional");
  EXPECT_ERROR(msg([&] { b.add_input("x", ScalarType{}); }), "defined twice");
  EXPECT_ERROR(msg([&] { b.add_input("2x", ScalarType{}); }), "not a Python identifier");
}

}  // namespace
}  // namespace kiln
