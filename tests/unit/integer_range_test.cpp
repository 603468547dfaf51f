// integer_range against the reference interpreter: each trace's output range, where the
// analysis gives one, must hold every element the interpreter computes for any input; where an
// input or a wrap-around could put a value anywhere, the analysis must give none.
#include "kiln/analysis/integer_range.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "kiln/ir/parser.h"
#include "kiln/runtime/interpreter/interpreter.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {
namespace {

std::optional<IntegerRange> range_of_output(const Trace& t) {
  return integer_range(t.outputs().at(0));
}

// Runs the trace on random integer inputs in [-50, 50) and checks every output element.
void expect_inside(const Trace& t, IntegerRange r) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<RtValue> inputs;
    for (const Value* in : t.inputs()) {
      const TensorType& type = in->tensor_type();
      std::vector<int64_t> values(static_cast<size_t>(type.numel()));
      for (int64_t& v : values)
        v = static_cast<int64_t>(gen() % 100) - 50;
      inputs.emplace_back(make_int_tensor(type.dtype, type.shape, values));
    }
    TensorHandle out = std::get<TensorHandle>(interpret(t, inputs).at(0));
    for (int64_t i = 0; i < out->numel(); ++i) {
      int64_t v = out->storage->load_int(out->storage_index_of_linear(i));
      EXPECT_GE(v, r.lo) << "element " << i;
      EXPECT_LE(v, r.hi) << "element " << i;
    }
  }
}

TEST(IntegerRange, AnArangeShiftedScaledAndViewed) {
  Trace t = parse_trace(R"(def f():
  t0 = ltorch.arange(3, 15, 2, dtype=torch.int64)  # t0: "cpu i64[6]"
  t1 = ltorch.mul(t0, -2)  # t1: "cpu i64[6]"
  t2 = ltorch.add(t1, 40)  # t2: "cpu i64[6]"
  t3 = ltorch.unsqueeze(t2, 0)  # t3: "cpu i64[1, 6]"
  t4 = ltorch.slice(t3, 1, 1, 4)  # t4: "cpu i64[1, 3]"
  return {"output": (t4,)}
)");
  std::optional<IntegerRange> r = range_of_output(t);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->lo, 14);  // 40 - 2 * 13
  EXPECT_EQ(r->hi, 34);  // 40 - 2 * 3
  expect_inside(t, *r);
}

TEST(IntegerRange, ASelectionClampAndWrapOfKnownValues) {
  Trace t = parse_trace(R"(def f(c):
  # c: "cpu bool[4]"
  t0 = ltorch.arange(-4, 0, dtype=torch.int64)  # t0: "cpu i64[4]"
  t1 = ltorch.wrap_index(t0, 4)  # t1: "cpu i64[4]"
  t2 = ltorch.full([4], 9, dtype=torch.int64)  # t2: "cpu i64[4]"
  t3 = ltorch.where(c, t1, t2)  # t3: "cpu i64[4]"
  t4 = ltorch.clamp(t3, 1, 7)  # t4: "cpu i64[4]"
  return {"output": (t4,)}
)");
  std::optional<IntegerRange> r = range_of_output(t);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->lo, 1);
  EXPECT_EQ(r->hi, 7);
  expect_inside(t, *r);
}

TEST(IntegerRange, InputsWrapAroundAndOtherDtypesAreUnknown) {
  // An input's values are the caller's.
  EXPECT_FALSE(range_of_output(parse_trace(R"(def f(i):
  # i: "cpu i64[4]"
  t0 = ltorch.add(i, 1)  # t0: "cpu i64[4]"
  return {"output": (t0,)}
)")));
  // 2^31 - 3 + [0, 4) wraps around in int32.
  EXPECT_FALSE(range_of_output(parse_trace(R"(def f():
  t0 = ltorch.arange(0, 4, dtype=torch.int32)  # t0: "cpu i32[4]"
  t1 = ltorch.add(t0, 2147483645)  # t1: "cpu i32[4]"
  return {"output": (t1,)}
)")));
  // A float's bits read as an int32.
  EXPECT_FALSE(range_of_output(parse_trace(R"(def f():
  t0 = ltorch.arange(0, 4, dtype=torch.float32)  # t0: "cpu f32[4]"
  t1 = ltorch.view_dtype(t0, torch.int32)  # t1: "cpu i32[4]"
  return {"output": (t1,)}
)")));
}

// drawn_from: every element the interpreter computes must be an element of the inputs named.
TEST(DrawnFrom, GathersSelectionsViewsAndJoinsOfInputs) {
  Trace t = parse_trace(R"(def f(a, b, p, c):
  # a: "cpu i64[8]"
  # b: "cpu i64[1, 4]"
  # p: "cpu i64[3]"
  # c: "cpu bool[7]"
  t0 = ltorch.gather(a, 0, p)  # t0: "cpu i64[3]"
  t1 = ltorch.expand(b, [2, 4])  # t1: "cpu i64[2, 4]"
  t2 = ltorch.index_select(t1, 0, p)  # t2: "cpu i64[3, 4]"
  t3 = ltorch.select(t2, 1, 2)  # t3: "cpu i64[3]"
  t4 = ltorch.cat([t0, t3, t0], 0)  # t4: "cpu i64[9]"
  t5 = ltorch.slice(t4, 0, 1, 8)  # t5: "cpu i64[7]"
  t6 = ltorch.slice(t4, 0, 2, 9)  # t6: "cpu i64[7]"
  t7 = ltorch.where(c, t5, t6)  # t7: "cpu i64[7]"
  return {"output": (t7,)}
)");
  std::vector<DrawnInput> drawn = drawn_from(t.outputs().at(0));
  std::vector<const Value*> sources;
  for (const DrawnInput& d : drawn) {
    sources.push_back(d.input);
    EXPECT_TRUE(d.never_selected.empty());
  }
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(std::set<const Value*>(sources.begin(), sources.end()),
            (std::set<const Value*>{t.inputs()[0], t.inputs()[1]}));
  std::mt19937 gen(3);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<int64_t> a(8), b(4), p(3), c(7);
    for (int64_t& v : a)
      v = static_cast<int64_t>(gen() % 1000);
    for (int64_t& v : b)
      v = 1000 + static_cast<int64_t>(gen() % 1000);
    for (int64_t& v : p)
      v = static_cast<int64_t>(gen() % 2);  // in range of both gathers
    for (int64_t& v : c)
      v = static_cast<int64_t>(gen() % 2);
    std::set<int64_t> allowed(a.begin(), a.end());
    allowed.insert(b.begin(), b.end());
    TensorHandle out = std::get<TensorHandle>(
        interpret(
            t, {make_int_tensor(DType::kInt64, {8}, a), make_int_tensor(DType::kInt64, {1, 4}, b),
                make_int_tensor(DType::kInt64, {3}, p), make_int_tensor(DType::kBool, {7}, c)})
            .at(0));
    for (int64_t i = 0; i < out->numel(); ++i)
      EXPECT_TRUE(allowed.contains(out->storage->load_int(out->storage_index_of_linear(i))))
          << "element " << i;
  }
}

TEST(DrawnFrom, ComputedConstantAndReinterpretedValuesAreNotDrawn) {
  auto none = [](const char* text) {
    return drawn_from(parse_trace(text).outputs().at(0)).empty();
  };
  EXPECT_TRUE(none(R"(def f(a):
  # a: "cpu i64[4]"
  t0 = ltorch.add(a, 1)  # t0: "cpu i64[4]"
  return {"output": (t0,)}
)"));
  EXPECT_TRUE(none(R"(def f(a, c):
  # a: "cpu i64[4]"
  # c: "cpu bool[4]"
  t0 = ltorch.where(c, a, 3)  # t0: "cpu i64[4]"
  return {"output": (t0,)}
)"));
  EXPECT_TRUE(none(R"(def f(a):
  # a: "cpu f64[4]"
  t0 = ltorch.view_dtype(a, torch.int64)  # t0: "cpu i64[4]"
  return {"output": (t0,)}
)"));
  // An index_copy writes values of its source among self's.
  EXPECT_TRUE(none(R"(def f(a, p, s):
  # a: "cpu i64[4]"
  # p: "cpu i64[1]"
  # s: "cpu i64[1]"
  t0 = ltorch.index_copy(a, 0, p, s)  # t0: "cpu i64[4]"
  return {"output": (t0,)}
)"));
}

// A language model's labels: padded with -100 (a full tensor the tokens are scattered into),
// shifted, and masked to 0 where they are -100. The -100s are never selected (the where's guard)
// and 0 is in range: the tokens alone decide.
constexpr const char* kMaskedLabels = R"(def f(tokens):
  # tokens: "cpu i64[2, 4]"
  t0 = ltorch.full([2, 5], -100, dtype=torch.int64)  # t0: "cpu i64[2, 5]"
  t1 = ltorch.slice_scatter(t0, tokens, 1, 0, 4)  # t1: "cpu i64[2, 5]"
  t2 = ltorch.slice(t1, 1, 1, 5)  # t2: "cpu i64[2, 4]"
  t3 = ltorch.ne(t2, -100)  # t3: "cpu bool[2, 4]"
  t4 = ltorch.where(t3, t2, 0)  # t4: "cpu i64[2, 4]"
  return {"output": (t4,)}
)";

TEST(DrawnFrom, ConstantsInRangeAndValuesAWhereKeepsOut) {
  auto in_range = [](int64_t c) { return c >= 0 && c < 10; };
  Trace t = parse_trace(kMaskedLabels);
  const std::vector<DrawnInput> want{{t.inputs()[0], {-100}}};
  EXPECT_EQ(drawn_from(t.outputs().at(0), in_range), want);
  EXPECT_TRUE(drawn_from(t.outputs().at(0)).empty()) << "0 is allowed only when in range";
  // Every element the interpreter computes is a token or 0.
  std::mt19937 gen(5);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<int64_t> tokens(8);
    for (int64_t& v : tokens)
      v = 1 + static_cast<int64_t>(gen() % 9);
    std::set<int64_t> allowed(tokens.begin(), tokens.end());
    allowed.insert(0);
    TensorHandle out = std::get<TensorHandle>(
        interpret(t, {make_int_tensor(DType::kInt64, {2, 4}, tokens)}).at(0));
    for (int64_t i = 0; i < out->numel(); ++i)
      EXPECT_TRUE(allowed.contains(out->storage->load_int(out->storage_index_of_linear(i))));
  }
  auto none = [&](const char* text) {
    return drawn_from(parse_trace(text).outputs().at(0), in_range).empty();
  };
  // Labels that hold -100 themselves (a data collator's padding): never selected either; an
  // input also reached on a path without the guard keeps nothing out.
  Trace labels = parse_trace(R"(def f(labels, c):
  # labels: "cpu i64[8]"
  # c: "cpu bool[8]"
  t0 = ltorch.ne(labels, -100)  # t0: "cpu bool[8]"
  t1 = ltorch.where(t0, labels, 0)  # t1: "cpu i64[8]"
  t2 = ltorch.where(c, t1, labels)  # t2: "cpu i64[8]"
  return {"output": (t1, t2)}
)");
  const std::vector<DrawnInput> guarded{{labels.inputs()[0], {-100}}};
  const std::vector<DrawnInput> unguarded{{labels.inputs()[0], {}}};
  EXPECT_EQ(drawn_from(labels.outputs().at(0), in_range), guarded);
  EXPECT_EQ(drawn_from(labels.outputs().at(1), in_range), unguarded);
  // The guard the other way round selects the -100s.
  EXPECT_TRUE(none(R"(def f(tokens):
  # tokens: "cpu i64[2, 4]"
  t0 = ltorch.full([2, 5], -100, dtype=torch.int64)  # t0: "cpu i64[2, 5]"
  t1 = ltorch.slice_scatter(t0, tokens, 1, 0, 4)  # t1: "cpu i64[2, 5]"
  t3 = ltorch.eq(t1, -100)  # t3: "cpu bool[2, 5]"
  t4 = ltorch.where(t3, t1, 0)  # t4: "cpu i64[2, 5]"
  return {"output": (t4,)}
)"));
  // A guard on another value than the one selected keeps nothing out.
  EXPECT_TRUE(none(R"(def f(tokens, other):
  # tokens: "cpu i64[2, 5]"
  # other: "cpu i64[2, 5]"
  t0 = ltorch.full([2, 5], -100, dtype=torch.int64)  # t0: "cpu i64[2, 5]"
  t3 = ltorch.ne(other, -100)  # t3: "cpu bool[2, 5]"
  t4 = ltorch.where(t3, t0, tokens)  # t4: "cpu i64[2, 5]"
  return {"output": (t4,)}
)"));
  // A constant an int32 index does not hold as it is.
  EXPECT_TRUE(none(R"(def f(c, a):
  # c: "cpu bool[4]"
  # a: "cpu i32[4]"
  t0 = ltorch.where(c, a, 4294967297)  # t0: "cpu i32[4]"
  return {"output": (t0,)}
)"));
}

}  // namespace
}  // namespace kiln
