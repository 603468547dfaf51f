// pass_stores on printed regions: which regions' reductions may store the values over their
// domain in their pass, and which may not (each condition of pass_stores.h, one case each).
#include "kiln/analysis/pass_stores.h"

#include <gtest/gtest.h>

#include "kiln/ir/parser.h"

namespace kiln {
namespace {

std::optional<PassStores> of(const char* text) {
  return pass_stores(parse_trace(text));
}

TEST(PassStores, AnInPlaceWriteThenAColumnSum) {
  Trace t = parse_trace(R"(def f(x):
  # x: "cpu f32[30, 10]"
  t0 = ltorch.mul(x, 2)  # t0: "cpu f32[30, 10]"
  t1 = ltorch.sum(t0, [0])  # t1: "cpu f32[10]"
  t2 = ltorch.add(t1, 1)  # t2: "cpu f32[10]"
  return {"output": (t0, t2)}
)");
  std::optional<PassStores> p = pass_stores(t);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->reduction->id(), OpId::kSum);
  EXPECT_EQ(p->domain, (Shape{30, 10}));
  EXPECT_FALSE(p->along_last_dim);  // a column's pass: across rows
}

TEST(PassStores, RowsAndWholeTensorsAreAlongTheLastDim) {
  std::optional<PassStores> row = of(R"(def f(x):
  # x: "cpu f32[30, 10]"
  t0 = ltorch.mul(x, 2)  # t0: "cpu f32[30, 10]"
  t1 = ltorch.sum(t0, [-1])  # t1: "cpu f32[30]"
  return {"output": (t0, t1)}
)");
  ASSERT_TRUE(row.has_value());
  EXPECT_TRUE(row->along_last_dim);
  std::optional<PassStores> whole = of(R"(def f(x):
  # x: "cpu f32[30, 10]"
  t0 = ltorch.abs(x)  # t0: "cpu f32[30, 10]"
  t1 = ltorch.amax(t0)  # t1: "cpu f32[]"
  return {"output": (t0, t1)}
)");
  ASSERT_TRUE(whole.has_value());
  EXPECT_TRUE(whole->along_last_dim);
}

TEST(PassStores, NotForTwoPassesOrTwoReductions) {
  EXPECT_FALSE(of(R"(def f(x):
  # x: "cpu f32[30, 10]"
  t0 = ltorch.mul(x, 2)  # t0: "cpu f32[30, 10]"
  t1 = ltorch.var(t0, [0])  # t1: "cpu f32[10]"
  return {"output": (t0, t1)}
)"));
  EXPECT_FALSE(of(R"(def f(x):
  # x: "cpu f32[30, 10]"
  t0 = ltorch.mul(x, 2)  # t0: "cpu f32[30, 10]"
  t1 = ltorch.sum(t0, [0])  # t1: "cpu f32[10]"
  t2 = ltorch.amax(t0, [0])  # t2: "cpu f32[10]"
  return {"output": (t0, t1, t2)}
)"));
}

TEST(PassStores, NotWhenADomainOutputNeedsTheReduction) {
  // t2 = x - sum(x, 0): its elements need the whole column first.
  EXPECT_FALSE(of(R"(def f(x):
  # x: "cpu f32[30, 10]"
  t1 = ltorch.sum(x, [0], keepdim=True)  # t1: "cpu f32[1, 10]"
  t2 = ltorch.sub(x, t1)  # t2: "cpu f32[30, 10]"
  return {"output": (t2, t1)}
)"));
}

TEST(PassStores, NotWhenTheReductionIsReadAtOtherElements) {
  // The sum broadcast to [4, 10]: each of its elements would run the pass four times.
  EXPECT_FALSE(of(R"(def f(x, y):
  # x: "cpu f32[30, 10]"
  # y: "cpu f32[4, 10]"
  t0 = ltorch.mul(x, 2)  # t0: "cpu f32[30, 10]"
  t1 = ltorch.sum(t0, [0])  # t1: "cpu f32[10]"
  t2 = ltorch.add(y, t1)  # t2: "cpu f32[4, 10]"
  return {"output": (t0, t2)}
)"));
  // Through a view: not an elementwise op at the element.
  EXPECT_FALSE(of(R"(def f(x):
  # x: "cpu f32[30, 10]"
  t0 = ltorch.mul(x, 2)  # t0: "cpu f32[30, 10]"
  t1 = ltorch.sum(t0, [0])  # t1: "cpu f32[10]"
  t2 = ltorch.slice(t1, 0, 0, 10)  # t2: "cpu f32[10]"
  return {"output": (t0, t2)}
)"));
}

TEST(PassStores, NotWithoutAnOutputOverTheDomain) {
  EXPECT_FALSE(of(R"(def f(x):
  # x: "cpu f32[30, 10]"
  t0 = ltorch.mul(x, 2)  # t0: "cpu f32[30, 10]"
  t1 = ltorch.sum(t0, [0])  # t1: "cpu f32[10]"
  return {"output": (t1,)}
)"));
}

}  // namespace
}  // namespace kiln
