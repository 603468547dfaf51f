// The pipeline on the CASES.md programs: how many regions each compiles to and where its
// writebacks land (the fusion-critical cases asserted), and a table of all of them. Whether the
// results are right is differential_test.cpp's business.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "kiln/kiln.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/executor.h"
#include "support/cases.h"

namespace kiln {
namespace {

struct Case {
  std::string name;
  CompiledProgram program;
};

// The CASES.md programs (support/cases.h) compiled for their calls; H3, which eager rejects,
// has no program.
std::vector<Case> cases() {
  std::vector<Case> out;
  test::for_each_case(
      [&](const std::string& name, const Trace& t, const std::vector<RtValue>& inputs) {
        if (name == "H3" || name == "A1 distinct") return;
        out.push_back({name, compile(t, alias_pattern_of(inputs))});
      });
  return out;
}

// The cases of these names (each must exist: a renamed case is not silently skipped).
std::vector<Case> named(std::initializer_list<const char*> names) {
  std::vector<Case> all = cases(), out;
  for (const char* name : names) {
    auto it = std::find_if(all.begin(), all.end(), [&](const Case& c) { return c.name == name; });
    EXPECT_NE(it, all.end()) << "no CASES program " << name;
    if (it != all.end()) out.push_back(std::move(*it));
  }
  return out;
}

TEST(Pipeline, SeedsAreOneRegionWithTheWritebackInside) {
  for (const Case& c : named({"S1", "S2"})) {
    const CompiledProgram& p = c.program;
    EXPECT_EQ(p.stats.fusion_regions, 1) << c.name << "\n" << p.history.back().printed;
    EXPECT_EQ(p.plan.steps.size(), 1u) << c.name;
    EXPECT_EQ(p.stats.writebacks_in_kernel, 1) << c.name;
    EXPECT_EQ(p.stats.writebacks_with_temporary, 0) << c.name;
  }
}

TEST(Pipeline, ElementwiseChainsAreOneRegion) {
  for (const Case& c : named({"I1", "I6", "M1", "M2"})) {
    const CompiledProgram& p = c.program;
    EXPECT_EQ(p.stats.fusion_regions, 1) << c.name << "\n" << p.history.back().printed;
    EXPECT_EQ(p.stats.writebacks_with_temporary, 0) << c.name;
  }
}

TEST(Pipeline, SameIndexHazardsAreNotOneKernel) {
  for (const Case& c : named({"H1", "H2"})) {
    const CompiledProgram& p = c.program;
    EXPECT_GE(p.stats.fusion_regions, 2) << c.name << "\n" << p.history.back().printed;
    // The region that stores into the input never also reads it at another index, and every
    // region reading its old contents runs before the store.
    size_t writer = p.plan.steps.size();
    for (size_t i = 0; i < p.plan.steps.size(); ++i)
      if (!p.plan.steps[i].writebacks.empty()) writer = i;
    ASSERT_LT(writer, p.plan.steps.size());
    const Value* target = p.plan.steps[writer].writebacks[0].target;
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
    const CompiledProgram& p = c.program;
    std::printf("%-4s %8d %10d %10d\n", c.name.c_str(), p.stats.fusion_regions,
                p.stats.writebacks_in_kernel, p.stats.writebacks_with_temporary);
    EXPECT_EQ(p.stats.writebacks_in_kernel + p.stats.writebacks_with_temporary,
              static_cast<int>(p.execution.writebacks.size()));
  }
}

}  // namespace
}  // namespace kiln
