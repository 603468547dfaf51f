#include "kiln/runtime/kernel_inputs.h"

#include <algorithm>

#include "kiln/analysis/geometry.h"
#include "kiln/support/error.h"

namespace kiln {

bool kernel_can_read(const codegen::KernelInput& input, const RtTensor& t) {
  for (const codegen::StorageWindow& w : input.windows) {
    Geometry g{w.sizes, w.strides, w.offset.value_or(t.offset)};
    if (g.offset < 0 ||
        std::any_of(g.strides.begin(), g.strides.end(), [](int64_t st) { return st < 0; }))
      return false;
    try {
      check_in_bounds(g, t.storage->numel(), t.dtype());
    } catch (const UserError&) {
      return false;
    }
  }
  return !input.whole_storage ||
         (t.rank() == 1 && t.offset == 0 && (t.sizes[0] <= 1 || t.strides[0] == 1) &&
          t.storage->numel() == t.sizes[0]);
}

bool dense_in_order(const RtTensor& t, std::span<const int> order) {
  KILN_ASSERT(order.empty() || order.size() == t.sizes.size()) << "a dim order of another rank";
  int64_t expected = 1;
  for (size_t k = t.sizes.size(); k-- > 0;) {
    const auto d = order.empty() ? k : static_cast<size_t>(order[k]);
    if (t.sizes[d] == 1) continue;
    if (t.strides[d] != expected) return false;
    expected *= t.sizes[d];
  }
  return true;
}

bool dense(const RtTensor& t) {
  return dense_in_order(t, {});
}

}  // namespace kiln
