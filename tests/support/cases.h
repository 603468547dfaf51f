// The CASES.md programs (../shared/CASES.md), each traced through the C++ API with the call
// CASES.md gives it: one table for every test that runs them (the differential tests on the CPU
// and on CUDA).
#pragma once

#include <functional>
#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln::test {

using CaseFn = std::function<void(const Trace& trace, const std::vector<RtValue>& inputs)>;
void for_each_case(const CaseFn& fn);

}  // namespace kiln::test
