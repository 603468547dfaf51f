// integer_range against the reference interpreter: each trace's output range, where the
// analysis gives one, must hold every element the interpreter computes for any input; where an
// input or a wrap-around could put a value anywhere, the analysis must give none.
#include "kiln/analysis/integer_range.h"

#include <gtest/gtest.h>

#include <random>

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

}  // namespace
}  // namespace kiln
