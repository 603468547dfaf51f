// The parameters ops.def's elementwise expressions read besides their operands a, b, c (the
// interpreter fills them per node; generated kernels embed this file and fill them as constants).
#pragma once

#include <cstdint>

namespace kiln {

// K: the floating type the math runs in (ops.def).
template <class K>
struct ElementwiseParamsOf {
  K alpha = 1;  // add/sub: a + alpha * b
  int64_t alpha_i = 1;
  K value = 1;  // addcmul/addcdiv: a + value * b * c
  int64_t value_i = 1;
  int rounding = 0;               // div: 0 true division, 1 trunc, 2 floor
  bool approximate_tanh = false;  // gelu(approximate="tanh")
  bool has_b = true;              // clamp: whether min / max are given
  bool has_c = true;
  bool bool_compute = false;  // the op computes in bool: `*` is `and`, `~` is `not`
  // The op computes in float32, float16 or bfloat16: where eager's result depends on the
  // precision of an intermediate (div's rounded quotient), it is computed in float.
  bool single_precision = false;
};
using ElementwiseParams = ElementwiseParamsOf<double>;

}  // namespace kiln
