// index_checks: see index_checks.h.
#include "kiln/runtime/index_checks.h"

#include <algorithm>
#include <string>

#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/support/error.h"

namespace kiln {

std::vector<int64_t> index_values(const RtTensor& t) {
  if (!t.storage->on_device()) return to_int_vector(t);  // row-major
  return to_int_vector(*cuda::elements_to_host(t));
}

std::optional<int64_t> first_index_out_of_range(const codegen::IndexCheck& c,
                                                const std::vector<int64_t>& values) {
  std::vector<int64_t> positions;
  if (c.view) positions = element_indices(c.view->sizes, c.view->strides, c.view->offset);
  for (size_t k = 0; k < (c.view ? positions.size() : values.size()); ++k) {
    int64_t v = values.at(c.view ? static_cast<size_t>(positions[k]) : k);
    if ((v < (c.negative ? -c.size : 0) || v >= c.size) &&
        !std::binary_search(c.never_selected.begin(), c.never_selected.end(), v))
      return v;
  }
  return std::nullopt;
}

std::optional<int64_t> first_index_out_of_range(const codegen::IndexCheck& c, const RtTensor& t) {
  return first_index_out_of_range(c, index_values(t));
}

void check_index_values(const codegen::IndexCheck& c, const RtTensor& t) {
  if (std::optional<int64_t> v = first_index_out_of_range(c, t))
    throw IndexOutOfRange(c.op + ": index " + std::to_string(*v) +
                          " is out of bounds for dimension " + std::to_string(c.dim) +
                          " with size " + std::to_string(c.size) + ".");
}

}  // namespace kiln
