#include "kiln/analysis/alias_pattern.h"

#include "kiln/support/error.h"

namespace kiln {

// Placeholder until the alias analysis lands: every input distinct.
AliasPattern AliasPattern::distinct(const Trace& trace) {
  AliasPattern p;
  for (Value* in : trace.inputs()) {
    AliasPattern::Input entry;
    if (in->is_tensor()) {
      const TensorType& t = in->tensor_type();
      entry.group = static_cast<int>(p.groups.size());
      entry.geometry = Geometry{t.shape, contiguous_strides(t.shape), 0};
      p.groups.push_back({t.dtype, t.numel(), false});
    }
    p.inputs.push_back(entry);
  }
  return p;
}

}  // namespace kiln
