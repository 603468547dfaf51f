// An independent check of the same-index rule (DESIGN.md section 4, rule 4) by perturbation.
// The executor runs a region as a whole, so the differential tests cannot see a region that
// stores into an input while loading other elements of it; this test can. For every writeback
// placed in a kernel, in random programs: change one element e of the written input, run the
// region again in the interpreter, and require the stored value to change at element e only —
// the store of any other element must not depend on the element e a kernel may already have
// overwritten. A region with a reduction may be placed by the row-local rule (kernel.h): there
// the stores of e's own row may change too (its reductions read the row before any of its
// stores), never those of another row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "kiln/kiln.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/executor.h"
#include "support/case_inputs.h"
#include "support/random_program.h"

namespace kiln {
namespace {

std::vector<RtValue> body_inputs(const Trace& body, uint64_t seed) {
  std::vector<RtValue> in;
  for (const Value* v : body.inputs()) {
    if (v->is_tensor()) {
      TensorType t = v->tensor_type();
      t.layout.reset();
      in.emplace_back(make_random_input(t, seed++));
    } else if (v->scalar_type().kind == ScalarKind::kFloat) {
      in.emplace_back(RtScalar(0.75));
    } else if (v->scalar_type().kind == ScalarKind::kInt) {
      in.emplace_back(RtScalar(int64_t{2}));
    } else {
      in.emplace_back(RtScalar(true));
    }
  }
  return in;
}

// Whether a node of `nodes`, or of their decompositions, is a reduction.
bool has_reduction(const std::vector<std::unique_ptr<Node>>& nodes) {
  return std::any_of(nodes.begin(), nodes.end(), [](const std::unique_ptr<Node>& n) {
    return n->op->kind == OpKind::kReduction || has_reduction(n->subsymbols);
  });
}

bool same_bits(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

// The perturbation check of every whole writeback `compiled` places in a kernel (inputs from
// `seed`); returns how many it checked.
int check_in_kernel_stores(const CompiledProgram& compiled, uint64_t seed) {
  int checked = 0;
  for (const Step& step : compiled.plan.steps) {
    for (const Step::Writeback& wb : step.writebacks) {
      // A store into a window is placed by the plan without rule 4, which the kernel's loads
      // decide (kernel.h, row-local loads; cpu_backend_test.cpp checks both ways).
      if (!wb.window.empty() || step.kind != Step::Kind::kFusion) continue;
      const Value* target = wb.target;
      const Value* value = wb.value;
      auto found = std::find(step.inputs.begin(), step.inputs.end(), target);
      if (found == step.inputs.end()) continue;  // the region never loads the target
      size_t k = static_cast<size_t>(found - step.inputs.begin());
      size_t out = 0;
      while (step.outputs[out] != value)
        ++out;
      const TensorType& t = target->tensor_type();
      if (t.numel() > 48 || t.numel() == 0) continue;
      std::vector<RtValue> base = body_inputs(step.body, seed);
      std::vector<double> before;
      try {
        before = to_vector(*std::get<TensorHandle>(interpret(step.body, base)[out]));
      } catch (const UserError&) {
        continue;
      }
      SCOPED_TRACE(compiled.history.back().printed);
      const int64_t row = has_reduction(step.body.nodes()) && t.rank() > 0 ? t.shape.back() : 0;
      for (int64_t e = 0; e < t.numel(); ++e) {
        std::vector<RtValue> changed = base;
        TensorHandle in = clone(*std::get<TensorHandle>(base[k]));
        std::vector<double> v = to_vector(*in);
        v[static_cast<size_t>(e)] = t.dtype == DType::kBool ? 1 - v[static_cast<size_t>(e)]
                                                            : v[static_cast<size_t>(e)] + 1.5;
        changed[k] = make_tensor(t.dtype, t.shape, v);
        std::vector<double> after =
            to_vector(*std::get<TensorHandle>(interpret(step.body, changed)[out]));
        for (size_t j = 0; j < after.size(); ++j) {
          if (static_cast<int64_t>(j) == e) continue;
          if (row > 0 && static_cast<int64_t>(j) / row == e / row) continue;
          EXPECT_TRUE(same_bits(before[j], after[j]))
              << step.name << " stores " << target->name() << "[" << j << "] from "
              << target->name() << "[" << e << "]";
          if (!same_bits(before[j], after[j])) return checked;
        }
      }
      ++checked;
    }
  }
  return checked;
}

TEST(SameIndexRule, InKernelStoresDependOnlyOnTheirOwnElement) {
  int checked = 0;
  for (uint64_t i = 0; i < 600; ++i) {
    fuzz::RandomProgram prog = fuzz::generate_program(fuzz::program_seed(777, i));
    CompiledProgram compiled;
    try {
      compiled = compile(prog.trace, prog.pattern);
    } catch (const UserError&) {
      continue;  // eager raises (or kiln does not support it): nothing is stored
    }
    checked += check_in_kernel_stores(compiled, i * 31 + 7);
  }
  EXPECT_GT(checked, 100) << "too few in-kernel writebacks were checked";
}

// Row-local stores (a reduction over the row, then the row's elements stored into the input):
// placed in the kernel where every reduction reads the stored element's own row, and not where
// one reads a column, another row or a shifted row.
TEST(SameIndexRule, RowLocalStoresOnlyWhereEveryReductionReadsTheStoredRow) {
  struct Case {
    const char* name;
    std::function<void(Tensor)> program;
    bool in_kernel;
  };
  std::vector<Case> cases = {
      {"x -= x.mean(-1)", [](Tensor x) { x.sub_(x.mean(IntList{-1}, true)); }, true},
      {"x = softmax(x)", [](Tensor x) { x.copy_(x.softmax(-1)); }, true},
      {"x /= x.std(-1) of x * x", [](Tensor x) { x.div_((x * x).std(IntList{-1}, 1, true)); },
       true},
      {"x -= column means", [](Tensor x) { x.sub_(x.t().mean(IntList{-1}, true).t()); }, false},
      // (fuse puts the mean of row 0 in a region of its own: the store reads only its element)
      {"x -= the mean of row 0", [](Tensor x) { x.sub_(x.select(0, 0).mean(IntList{-1}, true)); },
       true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TensorHandle x = test::ar({4, 4});
    Trace t = trace([&](Tensor v) { c.program(v); }, {test::spec_of(x)});
    CompiledProgram compiled = compile(t, alias_pattern_of({RtValue(x)}));
    int in_kernel = 0;
    for (const Step& step : compiled.plan.steps)
      if (step.kind == Step::Kind::kFusion) in_kernel += static_cast<int>(step.writebacks.size());
    EXPECT_EQ(in_kernel, c.in_kernel ? 1 : 0) << print_plan(compiled.execution, compiled.plan);
    EXPECT_EQ(check_in_kernel_stores(compiled, 5), in_kernel);
  }
}

}  // namespace
}  // namespace kiln
