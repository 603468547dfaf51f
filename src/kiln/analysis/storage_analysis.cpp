#include "kiln/analysis/storage_analysis.h"

#include "kiln/support/error.h"

namespace kiln {

StorageAnalysis analyze_storage(const Trace&, const AliasPattern&) {
  KILN_ASSERT(false) << "analyze_storage is not written yet";
  return {};
}

}  // namespace kiln
