// The CASES.md programs (../shared/CASES.md), each traced through the C++ API with the call
// CASES.md gives it: one table for every test that runs them (the differential tests on the CPU
// and on CUDA).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln::test {

// `name` is the case's CASES.md name ("S1", ...; "A1 distinct" for A1's call with two tensors).
using CaseFn = std::function<void(const std::string& name, const Trace& trace,
                                  const std::vector<RtValue>& inputs)>;
void for_each_case(const CaseFn& fn);

}  // namespace kiln::test
