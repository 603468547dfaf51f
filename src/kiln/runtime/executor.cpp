#include "kiln/runtime/executor.h"

#include "kiln/support/error.h"

namespace kiln {

std::vector<RtValue> execute(const CompiledProgram&, const std::vector<RtValue>&) {
  KILN_ASSERT(false) << "the executor is not written yet";
  return {};
}

}  // namespace kiln
