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

// What x[:, start::step] of a [4, 8] x reads of x on dim 1 when it is read at (i0, j).
IndexExpr slice_reads(int64_t start, int64_t step, const IndexExpr& j) {
  Trace t = trace([&](Tensor x) { return x.slice(1, start, 8, step); }, {TensorSpec(f32, {4, 8})});
  for (const auto& n : t.nodes()) {
    if (n->id() != OpId::kSlice || n->arg("dim").as_int() != 1) continue;
    std::optional<Index> from = view_source_index(*n, 0, {loop_index({4, 8})[0], j});
    if (!from) break;
    return (*from)[1];
  }
  ADD_FAILURE() << "no slice along dim 1 that maps its index";
  return IndexExpr::number(-1);
}

TEST(IndexMap, TheMatchingStridedSliceMapsAnExactQuotientBackToItsDividend) {
  // x[:, ::2] read at the slot of a scatter with step 2 (i1 / 2, exact where the scatter writes):
  // the slice reads x at i1 itself.
  const IndexExpr i1 = loop_index({4, 8})[1];
  IndexExpr exact = slice_reads(0, 2, exact_div(i1, 2));
  EXPECT_EQ(exact.text, "i1");
  EXPECT_EQ(exact.range, Range(0, 7));
  // A plain quotient is a floor division: it is not undone.
  EXPECT_EQ(slice_reads(0, 2, i1 / 2).text, "(i1 / 2)*2");
}

TEST(IndexMap, AnExactQuotientIsNotUndoneWhereTheDividendWouldLeaveTheInput) {
  // x[:, 1::2]: start 1 + i1 reaches 8 at i1 = 7, outside x (off the scatter's condition the load
  // must still be in bounds), so the slice keeps 1 + (i1 / 2)*2.
  const IndexExpr i1 = loop_index({4, 8})[1];
  IndexExpr kept = slice_reads(1, 2, exact_div(i1, 2));
  EXPECT_EQ(kept.text, "1 + (i1 / 2)*2");
  ASSERT_TRUE(kept.range.has_value());
  EXPECT_LE(kept.range->second, 7);
  // A slice with another step does not match the quotient's divisor.
  EXPECT_EQ(slice_reads(0, 3, exact_div(i1, 2)).text, "(i1 / 2)*3");
}

TEST(IndexMap, APositionWithAKnownResidueFoldsItsStepTestAndQuotient) {
  // rd = 3*q + 1, a position of a pass split by residue (cpu_residue_split).
  IndexExpr rd = IndexExpr::bounded("rd", 1, 94);
  rd.modulus = 3;
  rd.residue = 1;
  rd.quotient = "q";
  EXPECT_EQ(known_multiple(rd, 3), false);
  EXPECT_EQ(known_multiple(rd, 2), std::nullopt);  // 2 does not divide the modulus
  // x[:, 1::3]: rd - 1 is on the step, its slot the quotient q itself.
  IndexExpr rel = rd - 1;
  EXPECT_EQ(known_multiple(rel, 3), true);
  IndexExpr slot = exact_div(rel, 3);
  EXPECT_EQ(slot.text, "q");
  ASSERT_TRUE(slot.range.has_value());
  EXPECT_EQ(slot.range->first, 0);
  EXPECT_EQ(slot.range->second, 31);
  // x[:, 2::3]: rd - 2 = 3*(q - 1) + 2, off the step.
  IndexExpr off = rd - 2;
  EXPECT_EQ(off.residue, 2);
  EXPECT_EQ(off.quotient, "(q - 1)");
  EXPECT_EQ(known_multiple(off, 3), false);
  // rd + 5 = 3*(q + 2) + 0: on the step.
  IndexExpr ahead = rd + IndexExpr::number(5);
  EXPECT_EQ(known_multiple(ahead, 3), true);
  EXPECT_EQ(exact_div(ahead, 3).text, "(q + 2)");
  // Without a residue nothing is known, and the quotient is a division.
  EXPECT_EQ(known_multiple(IndexExpr::bounded("i1", 0, 7), 2), std::nullopt);
  EXPECT_EQ(exact_div(IndexExpr::bounded("i1", 0, 7), 2).text, "i1 / 2");
}

}  // namespace
}  // namespace kiln::codegen
