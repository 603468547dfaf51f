// An independent check of the same-index rule (DESIGN.md section 4, rule 4) by perturbation.
// The executor runs a region as a whole, so the differential tests cannot see a region that
// stores into an input while loading other elements of it; this test can. For every writeback
// placed in a kernel, in random programs: change one element e of the written input, run the
// region again in the interpreter, and require the stored value to change at element e only —
// the store of any other element must not depend on the element e a kernel may already have
// overwritten.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kiln/kiln.h"
#include "kiln/passes/pipeline.h"
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

bool same_bits(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
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
    for (const Step& step : compiled.plan.steps) {
      for (const Step::Writeback& wb : step.writebacks) {
        // A store into a window is placed by the plan without rule 4, which the kernel's loads
        // decide (kernel.h, row-local loads) and executor_test checks.
        if (!wb.window.empty()) continue;
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
        std::vector<RtValue> base = body_inputs(step.body, i * 31 + 7);
        std::vector<double> before;
        try {
          before = to_vector(*std::get<TensorHandle>(interpret(step.body, base)[out]));
        } catch (const UserError&) {
          continue;
        }
        SCOPED_TRACE(compiled.history.back().printed);
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
            ASSERT_TRUE(same_bits(before[j], after[j]))
                << step.name << " stores " << target->name() << "[" << j << "] from "
                << target->name() << "[" << e << "]";
          }
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100) << "too few in-kernel writebacks were checked";
}

}  // namespace
}  // namespace kiln
