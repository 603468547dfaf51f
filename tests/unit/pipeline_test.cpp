// The pipeline on the CASES.md programs: how many regions each compiles to and where its
// writebacks land (the fusion-critical cases asserted), and a table of all of them. Whether the
// results are right is differential_test.cpp's business.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>

#include "kiln/kiln.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/executor.h"
#include "support/case_inputs.h"

namespace kiln {
namespace {

using test::ar;
using test::spec_of;

struct Case {
  std::string name;
  std::function<Trace(const std::vector<TensorSpec>&)> program;
  std::vector<TensorHandle> inputs;
};

std::vector<TensorSpec> specs_of(const std::vector<TensorHandle>& in) {
  std::vector<TensorSpec> specs;
  for (const TensorHandle& t : in)
    specs.push_back(spec_of(t));
  return specs;
}

std::vector<Case> cases() {
  TensorHandle x44 = ar({4, 4});
  TensorHandle ones64 = make_tensor(f32, {64}, std::vector<double>(64, 1.0));
  TensorHandle a22 = ar({2, 2});
  TensorHandle base4 = make_tensor(f32, {4}, {1, 1, 1, 1});
  TensorHandle same = ar({3});
  return {
      {"S1",
       [](auto s) {
         return trace(
             [](Tensor a) {
               a.tanh_();
               return a * a * a * a;
             },
             s);
       },
       {ar({5, 5})}},
      {"S2",
       [](auto s) {
         return trace(
             [](Tensor x) {
               x.exp_();
               x.sin_();
               return x.cos();
             },
             s);
       },
       {ar({5, 5})}},
      {"I1",
       [](auto s) {
         return trace(
             [](Tensor x) {
               x.add_(1).sin_().mul_(5);
               return x;
             },
             s);
       },
       {ar({4})}},
      {"I2",
       [](auto s) {
         return trace(
             [](Tensor x) {
               x.add_(1).sin().mul_(5);
               return x;
             },
             s);
       },
       {ar({4})}},
      {"I3",
       [](auto s) {
         return trace(
             [](Tensor a, Tensor b) {
               Tensor c = a + b;
               b.mul_(c);
               return b;
             },
             s);
       },
       {ar({3}), ar({3})}},
      {"I4", [](auto s) { return trace([](Tensor a) { a += 1; }, s); }, {ar({3})}},
      {"I5",
       [](auto s) { return trace([](Tensor x, Tensor y) { x.add_(y); }, s); },
       {make_tensor(bf16, {3}, {1, 2, 3}), ar({3})}},
      {"I6",
       [](auto s) {
         return trace(
             [](Tensor h, Tensor r) {
               h.add_(r);
               h.relu_();
               return h * 0.5;
             },
             s);
       },
       {ar({4}), ar({4})}},
      {"M1",
       [](auto s) {
         return trace(
             [](Tensor a, Tensor b) {
               Tensor c = a + b;
               c.add_(1);
               return c;
             },
             s);
       },
       {ar({2}), ar({2})}},
      {"M2",
       [](auto s) {
         return trace(
             [](Tensor a, Tensor b) {
               Tensor c = a + b;
               c.add_(1);
               Tensor d = c + c;
               d.add_(1);
               c.add_(d);
               return std::make_tuple(c, d);
             },
             s);
       },
       {ar({2}), ar({2})}},
      {"V1",
       [](auto s) {
         return trace(
             [](Tensor x) {
               Tensor y = x.view({4, 2});
               y.add_(ones({4, 2}));
               Tensor z = x * x;
               return std::make_tuple(y, z);
             },
             s);
       },
       {ar({8})}},
      {"V2",
       [](auto s) {
         return trace(
             [](Tensor x) {
               Tensor y = x.view({8});
               x.add_(1);
               return y;
             },
             s);
       },
       {ar({4, 2})}},
      {"V3",
       [](auto s) { return trace([](Tensor a) { a.add_(1); }, s); },
       {make_view(base4, {2}, {2}, 0)}},
      {"V4",
       [](auto s) {
         return trace(
             [](Tensor x) {
               x.transpose_(1, 0);
               x[0].add_(1);
               return x;
             },
             s);
       },
       {ar({4, 2})}},
      {"V5",
       [](auto s) {
         return trace(
             [](Tensor x) {
               Tensor y = x.view({3, 2});
               y[0].index_put_({0}, 0);
               return x;
             },
             s);
       },
       {ar({6})}},
      {"A1",
       [](auto s) {
         return trace(
             [](Tensor a, Tensor b) {
               Tensor e = a.exp_();
               Tensor h = b.tanh_();
               return std::make_tuple(e + h, a);
             },
             s);
       },
       {same, same}},
      {"A2",
       [](auto s) {
         return trace(
             [](Tensor a, Tensor b) {
               a.mul_(3);
               b.mul_(2);
               return a + b;
             },
             s);
       },
       {make_view(x44, {2, 4}, {4, 1}, 0), make_view(x44, {2, 4}, {4, 1}, 8)}},
      {"A3",
       [](auto s) {
         return trace(
             [](Tensor a, Tensor b) {
               a.mul_(3);
               b.mul_(2);
               return a.clone().view({-1}) + b.clone().view({-1});
             },
             s);
       },
       {make_view(ones64, {4, 4}, {9, 1}, 0), make_view(ones64, {4, 4}, {9, 1}, 24)}},
      {"A4",
       [](auto s) {
         return trace(
             [](Tensor x, Tensor y) {
               Tensor first = x + 1;
               return std::make_tuple(first, y.mul_(2));
             },
             s);
       },
       {a22, make_view(a22, {2, 2}, {1, 2}, 0)}},
      {"H1",
       [](auto s) {
         return trace(
             [](Tensor a) {
               a.index_put_({Slice(), Slice(2, 7)}, a.index({Slice(), Slice(1, 6)}) + 2);
             },
             s);
       },
       {ar({1, 16})}},
      {"H2",
       [](auto s) {
         return trace(
             [](Tensor w, Tensor x) {
               Tensor out = w + x;
               x.mul_(10);
               return out;
             },
             s);
       },
       {ar({2, 3}), ar({2, 1})}},
  };
}

CompiledProgram compile_case(const Case& c) {
  Trace t = c.program(specs_of(c.inputs));
  std::vector<RtValue> in(c.inputs.begin(), c.inputs.end());
  return compile(t, alias_pattern_of(in));
}

TEST(Pipeline, SeedsAreOneRegionWithTheWritebackInside) {
  for (const Case& c : cases()) {
    if (c.name != "S1" && c.name != "S2") continue;
    CompiledProgram p = compile_case(c);
    EXPECT_EQ(p.stats.fusion_regions, 1) << c.name << "\n" << p.history.back().printed;
    EXPECT_EQ(p.plan.steps.size(), 1u) << c.name;
    EXPECT_EQ(p.stats.writebacks_in_kernel, 1) << c.name;
    EXPECT_EQ(p.stats.writebacks_with_temporary, 0) << c.name;
  }
}

TEST(Pipeline, ElementwiseChainsAreOneRegion) {
  for (const Case& c : cases()) {
    if (c.name != "I1" && c.name != "I6" && c.name != "M1" && c.name != "M2") continue;
    CompiledProgram p = compile_case(c);
    EXPECT_EQ(p.stats.fusion_regions, 1) << c.name << "\n" << p.history.back().printed;
    EXPECT_EQ(p.stats.writebacks_with_temporary, 0) << c.name;
  }
}

TEST(Pipeline, SameIndexHazardsAreNotOneKernel) {
  for (const Case& c : cases()) {
    if (c.name != "H1" && c.name != "H2") continue;
    CompiledProgram p = compile_case(c);
    EXPECT_GE(p.stats.fusion_regions, 2) << c.name << "\n" << p.history.back().printed;
    // The region that stores into the input never also reads it at another index, and every
    // region reading its old contents runs before the store.
    size_t writer = p.plan.steps.size();
    for (size_t i = 0; i < p.plan.steps.size(); ++i)
      if (!p.plan.steps[i].writebacks.empty()) writer = i;
    ASSERT_LT(writer, p.plan.steps.size());
    const Value* target = p.plan.steps[writer].writebacks[0].first;
    for (size_t i = writer + 1; i < p.plan.steps.size(); ++i) {
      const auto& ins = p.plan.steps[i].inputs;
      EXPECT_EQ(std::find(ins.begin(), ins.end(), target), ins.end())
          << c.name << ": step " << i << " reads the old contents after the store";
    }
  }
}

// The table the closing note quotes.
TEST(Pipeline, CasesTable) {
  std::printf("%-4s %8s %10s %10s\n", "case", "regions", "in-kernel", "temporary");
  for (const Case& c : cases()) {
    CompiledProgram p = compile_case(c);
    std::printf("%-4s %8d %10d %10d\n", c.name.c_str(), p.stats.fusion_regions,
                p.stats.writebacks_in_kernel, p.stats.writebacks_with_temporary);
    EXPECT_EQ(p.stats.writebacks_in_kernel + p.stats.writebacks_with_temporary,
              static_cast<int>(p.execution.writebacks.size()));
  }
}

}  // namespace
}  // namespace kiln
