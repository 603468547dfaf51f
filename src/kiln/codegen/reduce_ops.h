// How a reduction's accumulator takes in an element, for generated kernels (the CPU and the CUDA
// prelude both embed this file): floats accumulate in double, integers in int64 with wrap-around,
// and max and min propagate NaN, as the reference interpreter's reductions do.
#pragma once

#include <cstdint>

namespace kiln::kernel {

inline double red_sum(double a, double b) {
  return a + b;
}
inline int64_t red_sum(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
inline double red_prod(double a, double b) {
  return a * b;
}
inline int64_t red_prod(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
inline double red_max(double a, double b) {
  return a != a ? a : (b != b || b > a) ? b : a;
}
inline int64_t red_max(int64_t a, int64_t b) {
  return b > a ? b : a;
}
inline double red_min(double a, double b) {
  return a != a ? a : (b != b || b < a) ? b : a;
}
inline int64_t red_min(int64_t a, int64_t b) {
  return b < a ? b : a;
}

}  // namespace kiln::kernel
