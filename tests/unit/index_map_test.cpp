// Index arithmetic for kernels (codegen/index_map.h): the bounds an index expression carries, and
// the exact quotient of a strided scatter's slot, which the matching strided slice maps back to
// the element itself only where that stays inside the slice's input. The kernels that rely on
// them are checked end to end by cpu_backend_test.cpp, the differential tests and
// tests/lit/codegen.
#include <gtest/gtest.h>

#include "kiln/codegen/index_map.h"
#include "kiln/kiln.h"

namespace kiln::codegen {
namespace {

using Range = std::pair<int64_t, int64_t>;

TEST(IndexMap, LoopIndicesCarryTheirExtent) {
  Index at = loop_index({4, 1, 7});
  ASSERT_EQ(at.size(), 3u);
  EXPECT_EQ(at[0].text, "i0");
  EXPECT_EQ(at[0].range, Range(0, 3));
  EXPECT_TRUE(at[1].is_zero());  // a dim of size 1 is index 0
  EXPECT_EQ(at[2].range, Range(0, 6));
  EXPECT_TRUE(inside_shape(at, {4, 1, 7}));
  EXPECT_FALSE(inside_shape(at, {4, 1, 6}));
  EXPECT_FALSE(inside_shape(at, {3, 1, 7}));
}

TEST(IndexMap, OperatorsCarryBounds) {
  Index at = loop_index({4, 7});
  const IndexExpr& i0 = at[0];
  const IndexExpr& i1 = at[1];
  EXPECT_EQ((i0 * 7 + i1).range, Range(0, 27));
  EXPECT_EQ((i1 - 2).range, Range(-2, 4));
  EXPECT_EQ((i1 / 2).range, Range(0, 3));
  EXPECT_EQ((i1 % 4).range, Range(0, 3));
  EXPECT_EQ((i0 % 8).range, Range(0, 3));  // below the modulus: unchanged
  // Truncating division is monotonic, also below zero: -2 / 2 = -1, 4 / 2 = 2.
  EXPECT_EQ(((i1 - 2) / 2).range, Range(-1, 2));
  // A modulo of a value that may be negative is not bounded (C++ keeps the dividend's sign).
  EXPECT_FALSE(((i1 - 2) % 4).range.has_value());
  // An unknown variable bounds nothing it takes part in.
  EXPECT_FALSE((IndexExpr::var("q") + i0).range.has_value());
  EXPECT_FALSE(inside_shape({IndexExpr::var("q")}, {8}));
  EXPECT_EQ(IndexExpr::number(5).range, Range(5, 5));
}

TEST(IndexMap, OverflowingBoundsAreDropped) {
  IndexExpr big = IndexExpr::bounded("b", 0, int64_t{1} << 62);
  EXPECT_FALSE((big * 4).range.has_value());
  EXPECT_FALSE((big + big + big + big).range.has_value());
}

// The node of a slice along dim 1 with this start and step, of a [4, n] input.
const Node& slice_node(const Trace& t) {
  for (const auto& n : t.nodes())
    if (n->id() == OpId::kSlice && n->arg("dim").as_int() == 1) return *n;
  ADD_FAILURE() << "no slice along dim 1 in the trace";
  return *t.nodes().front();
}

TEST(IndexMap, TheMatchingStridedSliceMapsAnExactQuotientBackToItsDividend) {
  // x[:, ::2] of a [4, 8] x, read at the slot of a scatter with step 2 (i1 / 2, exact where the
  // scatter writes): the slice reads x at i1 itself.
  Trace t = trace([](Tensor x) { return x.slice(1, 0, 8, 2); }, {TensorSpec(f32, {4, 8})});
  Index at = loop_index({4, 8});
  Index slot = {at[0], exact_div(at[1], 2)};
  std::optional<Index> from = view_source_index(slice_node(t), 0, slot);
  ASSERT_TRUE(from.has_value());
  EXPECT_EQ((*from)[1].text, "i1");
  EXPECT_EQ((*from)[1].range, Range(0, 7));

  // A plain quotient is a floor division: it is not undone.
  Index floor_slot = {at[0], at[1] / 2};
  from = view_source_index(slice_node(t), 0, floor_slot);
  ASSERT_TRUE(from.has_value());
  EXPECT_EQ((*from)[1].text, "(i1 / 2)*2");
}

TEST(IndexMap, AnExactQuotientIsNotUndoneWhereTheDividendWouldLeaveTheInput) {
  // x[:, 1::2] of a [4, 8] x: start 1 + i1 reaches 8 at i1 = 7, outside x (off the scatter's
  // condition the load must still be in bounds), so the slice keeps 1 + (i1 / 2)*2.
  Trace t = trace([](Tensor x) { return x.slice(1, 1, 8, 2); }, {TensorSpec(f32, {4, 8})});
  Index at = loop_index({4, 8});
  Index slot = {at[0], exact_div(at[1], 2)};
  std::optional<Index> from = view_source_index(slice_node(t), 0, slot);
  ASSERT_TRUE(from.has_value());
  EXPECT_NE((*from)[1].text, "1 + i1");
  ASSERT_TRUE((*from)[1].range.has_value());
  EXPECT_LE((*from)[1].range->second, 7);

  // A slice with another step does not match the quotient's divisor.
  Trace t3 = trace([](Tensor x) { return x.slice(1, 0, 8, 3); }, {TensorSpec(f32, {4, 8})});
  from = view_source_index(slice_node(t3), 0, {at[0], exact_div(at[1], 2)});
  ASSERT_TRUE(from.has_value());
  EXPECT_EQ((*from)[1].text, "(i1 / 2)*3");
}

}  // namespace
}  // namespace kiln::codegen
