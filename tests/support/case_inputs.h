// Inputs of the CASES.md programs, shared by the tests that run them.
#pragma once

#include <vector>

#include "kiln/kiln.h"

namespace kiln::test {

// ar(*s): arange(prod(s), dtype=float32).reshape(s) / 10, as CASES.md writes it.
inline TensorHandle ar(Shape shape) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(static_cast<float>(i) / 10.0f);
  return make_tensor(DType::kFloat32, shape, v);
}

// The spec of a real tensor: its dtype, shape and layout.
inline TensorSpec spec_of(const TensorHandle& t) {
  return TensorSpec(t->dtype(), t->sizes).strided(t->strides, t->offset);
}

}  // namespace kiln::test
