// Index checks on the host: an index's values read (on CUDA back from the device, a
// synchronization) and compared with the dim it indexes, before the step that uses it runs, so
// that an index out of range raises with every tensor as it was (codegen::IndexCheck; the
// executor's checks before the first step and at a step, and a CUDA graph's before a replay).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/codegen/kernel.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

// The elements of `index` in row-major order; a device tensor's are read back to the host (only
// the storage span they lie in).
std::vector<int64_t> index_values(const RtTensor& index);
// The first of `values` (an index's, row-major; in check.view's order) outside the check's
// range, if any.
std::optional<int64_t> first_index_out_of_range(const codegen::IndexCheck& check,
                                                const std::vector<int64_t>& values);
std::optional<int64_t> first_index_out_of_range(const codegen::IndexCheck& check,
                                                const RtTensor& index);
// Raises IndexOutOfRange (naming the check's op and line) when an element of `index` that the
// check covers is outside its dim.
void check_index_values(const codegen::IndexCheck& check, const RtTensor& index);

}  // namespace kiln
