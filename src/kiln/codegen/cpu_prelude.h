// What every generated CPU kernel starts with: typed loads and stores of storage elements, and the
// conversions the interpreter's storages apply (rt_tensor.cpp), built on dtype_convert.h. Codegen
// embeds this file and the kiln headers it names in each kernel's source (embed_prelude.cmake),
// so a kernel compiles without kiln's include path and its cache key covers this code.
//
// A kernel holds every value in a register type: float16 and bfloat16 as float, float32 and
// float64 as double, integral dtypes and bool as int64_t, and the held value is always exactly a
// value of its dtype — what the interpreter would read back from a tensor of that dtype. The
// function names end in the dtype's short name (f16, bf16, f32, f64, bool, i32, i64), so the
// emitter picks them by dtype.
#pragma once

#include <bit>
#include <cstdint>

#include "kiln/ir/dtype_convert.h"

extern "C" int omp_get_max_threads(void);  // (libgomp: kernels compile with -fopenmp)

namespace kiln::kernel {

// ---- loads (Storage::load_double / load_int) ---------------------------------------------------
inline int64_t ld_bool(const void* p, int64_t i) {
  return static_cast<const uint8_t*>(p)[i] != 0;
}
inline int64_t ld_i32(const void* p, int64_t i) {
  return static_cast<const int32_t*>(p)[i];
}
inline int64_t ld_i64(const void* p, int64_t i) {
  return static_cast<const int64_t*>(p)[i];
}
inline float ld_f16(const void* p, int64_t i) {
  return half_to_float(static_cast<const uint16_t*>(p)[i]);
}
inline float ld_bf16(const void* p, int64_t i) {
  return bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
}
inline double ld_f32(const void* p, int64_t i) {
  return static_cast<const float*>(p)[i];
}
inline double ld_f64(const void* p, int64_t i) {
  return static_cast<const double*>(p)[i];
}

// ---- stores of a held value (exact in the dtype, so every conversion here is exact) ----------
inline void st_bool(void* p, int64_t i, int64_t v) {
  static_cast<uint8_t*>(p)[i] = v != 0 ? 1 : 0;
}
inline void st_i32(void* p, int64_t i, int64_t v) {
  static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
}
inline void st_i64(void* p, int64_t i, int64_t v) {
  static_cast<int64_t*>(p)[i] = v;
}
inline void st_f16(void* p, int64_t i, float v) {
  static_cast<uint16_t*>(p)[i] = float_to_half(v);
}
// The held value is exactly a bfloat16 (its low 16 bits are zero): its high half is the
// bfloat16, with no second rounding (half the work of a bf16 x.abs()).
inline void st_bf16(void* p, int64_t i, float v) {
  static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(v) >> 16);
}
inline void st_f32(void* p, int64_t i, double v) {
  static_cast<float*>(p)[i] = static_cast<float>(v);
}
inline void st_f64(void* p, int64_t i, double v) {
  static_cast<double*>(p)[i] = v;
}

// ---- a double into float32: Storage::store_double followed by a load (also round_to_dtype, the
// conversion of an operand to a floating compute dtype), and an int64 into float32: one
// rounding from the integer, as static_cast<float>(int64_t) does in PyTorch.
inline double f_f32(double v) {
  return static_cast<float>(v);
}
// A float32 value held in float (an op computed in float: one correctly rounded operation).
inline float f_f32(float v) {
  return v;
}
inline double i_f32(int64_t v) {
  return static_cast<float>(v);
}

// The conversions that do not depend on the target (f_f64, f_bf16, i_i32, as_f, ...) are in
// shared_prelude.h, embedded after this file.

inline double kernel_infinity() {
  return __builtin_inf();
}
inline double kernel_nan() {
  return __builtin_nan("");
}

// The team of a parallel loop of `work` (its iterations times an element's cost,
// KernelEmitter::team_clause): a thread for each kTeamWorkPerThread of it, half of
// kernel_emitter.h's kParallelIterations (less work runs on one thread), at least 2, and no more
// than OpenMP has, so a machine of many cores does not wake them all for a loop that pays for two.
constexpr int64_t kTeamWorkPerThread = 32768;
inline int team_of(int64_t work) {
  const int64_t threads = work / kTeamWorkPerThread < 2 ? 2 : work / kTeamWorkPerThread;
  const int most = omp_get_max_threads();
  return threads < most ? static_cast<int>(threads) : most;
}

}  // namespace kiln::kernel
