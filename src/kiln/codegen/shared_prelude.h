// What the CPU and the CUDA prelude define alike (both embed this file after their own, which
// supplies float_to_int): the conversions of held values that do not depend on the target, and
// how a reduction's accumulator takes in an element.
#pragma once

#include <cstdint>

// float_to_int (kernels get it from their prelude; the embedding drops kiln includes).
#include "kiln/ir/dtype_convert.h"

namespace kiln::kernel {

// ---- float16 and bfloat16, held in float on both targets: a float or a double into the dtype
// (the store then the load; c10::Half and c10::BFloat16 are built from a float, so a double
// rounds twice, as in PyTorch), an int64 into it (one rounding from the integer), and a held
// float read as a floating or integral value.
inline float f_f16(float v) {
  return half_to_float(float_to_half(v));
}
inline float f_f16(double v) {
  return f_f16(static_cast<float>(v));
}
inline float f_bf16(float v) {
  return bfloat16_to_float(float_to_bfloat16(v));
}
inline float f_bf16(double v) {
  return f_bf16(static_cast<float>(v));
}
inline float i_f16(int64_t v) {
  return f_f16(static_cast<float>(v));
}
inline float i_bf16(int64_t v) {
  return f_bf16(static_cast<float>(v));
}
inline float as_f(float v) {
  return v;
}
inline int64_t as_i(float v) {
  return float_to_int<int64_t>(v);
}

// ---- a double into float64, bool or an integral dtype: the store then the load ----------------
inline double f_f64(double v) {
  return v;
}
inline int64_t f_bool(double v) {
  return v != 0 ? 1 : 0;  // NaN != 0: true
}
inline int64_t f_i32(double v) {
  return float_to_int<int32_t>(v);
}
inline int64_t f_i64(double v) {
  return float_to_int<int64_t>(v);
}

// ---- an int64 into float64, bool or an integral dtype -----------------------------------------
inline double i_f64(int64_t v) {
  return static_cast<double>(v);
}
inline int64_t i_bool(int64_t v) {
  return v != 0 ? 1 : 0;
}
inline int64_t i_i32(int64_t v) {
  return static_cast<int32_t>(v);  // wraps
}
inline int64_t i_i64(int64_t v) {
  return v;
}

// A held integral value read as a double, and a held double read as an integer (Storage::
// load_double of an integer tensor, Storage::load_int of a floating one).
inline double as_f(int64_t v) {
  return static_cast<double>(v);
}
inline double as_f(double v) {
  return v;
}
inline int64_t as_i(int64_t v) {
  return v;
}
inline int64_t as_i(double v) {
  return float_to_int<int64_t>(v);
}

// ---- reductions: floats accumulate in double, integers in int64 with wrap-around, and max and
// min propagate NaN, as the reference interpreter's reductions do.

inline double red_sum(double a, double b) {
  return a + b;
}
// float accumulators: CUDA's short reductions of float, half and bfloat16 (emit_reduction.cpp).
inline float red_sum(float a, float b) {
  return a + b;
}
inline float red_prod(float a, float b) {
  return a * b;
}
inline float red_max(float a, float b) {
  return a != a ? a : (b != b || b > a) ? b : a;
}
inline float red_min(float a, float b) {
  return a != a ? a : (b != b || b < a) ? b : a;
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
