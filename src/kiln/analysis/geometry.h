// A view's placement in memory, in elements: what `as_strided(size, stride, offset)` names.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/ir/types.h"

namespace kiln {

using Strides = std::vector<int64_t>;

struct Geometry {
  Shape sizes;
  Strides strides;
  int64_t offset = 0;
  bool operator==(const Geometry&) const = default;
};

}  // namespace kiln
