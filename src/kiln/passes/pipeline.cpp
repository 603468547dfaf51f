#include "kiln/passes/pipeline.h"

#include "kiln/support/error.h"

namespace kiln {

CompiledProgram compile(const Trace&, const AliasPattern&) {
  KILN_ASSERT(false) << "the pipeline is not written yet";
  return {};
}

}  // namespace kiln
