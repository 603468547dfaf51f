// Bit-for-bit comparison of two tensors' elements, shared by the tests that hold a kernel to the
// reference interpreter exactly.
#pragma once

#include <cmath>
#include <optional>
#include <string>

#include "kiln/kiln.h"

namespace kiln::test {

// Element-wise equality, bit for bit up to NaN payloads (NaN equals NaN; signed zeros differ).
inline std::optional<std::string> differs(const RtTensor& a, const RtTensor& b) {
  if (a.dtype() != b.dtype() || a.sizes != b.sizes)
    return "type " + a.type().str() + " vs " + b.type().str();
  for (int64_t i = 0; i < a.numel(); ++i) {
    int64_t ia = a.storage_index_of_linear(i), ib = b.storage_index_of_linear(i);
    if (is_floating(a.dtype())) {
      double x = a.storage->load_double(ia), y = b.storage->load_double(ib);
      bool same =
          (std::isnan(x) && std::isnan(y)) || (x == y && std::signbit(x) == std::signbit(y));
      if (!same)
        return "element " + std::to_string(i) + ": " + std::to_string(x) + " vs " +
               std::to_string(y);
    } else if (a.storage->load_int(ia) != b.storage->load_int(ib)) {
      return "element " + std::to_string(i) + ": " + std::to_string(a.storage->load_int(ia)) +
             " vs " + std::to_string(b.storage->load_int(ib));
    }
  }
  return std::nullopt;
}

}  // namespace kiln::test
