// What every generated CUDA kernel starts with (compiled by NVRTC with -default-device, without
// any include path): the integer types, the standard math names ops.def and scalar_math.h use
// (mapped onto the CUDA math library), typed loads and stores, and the conversions PyTorch's CUDA
// kernels apply. Codegen embeds this file, then elementwise_params.h and scalar_math.h without
// their standard includes (embed_prelude.cmake).
//
// A kernel holds every value in a register type: float for float32, float16 and bfloat16 (the
// math PyTorch's CUDA kernels do in `opmath_t`), double for float64, int64_t for integral dtypes
// and bool; the held value is always exactly a value of its dtype. Names end in the dtype's short
// name (f16, bf16, f32, f64, bool, i32, i64), so the emitter picks them by dtype, as for the CPU
// prelude (cpu_prelude.h).

typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

// A kernel's entries are named KILN_CAT(KILN_KERNEL_NAME, _n0_s32) and so on.
#define KILN_CAT_(a, b) a##b
#define KILN_CAT(a, b) KILN_CAT_(a, b)

namespace std {
using ::acos;
using ::asin;
using ::atan;
using ::atan2;
using ::ceil;
using ::copysign;
using ::cos;
using ::cosh;
using ::erf;
using ::exp;
using ::exp2;
using ::expm1;
using ::fabs;
using ::floor;
using ::fmod;
using ::isnan;
using ::log;
using ::log1p;
using ::log2;
using ::nearbyint;
using ::pow;
using ::sin;
using ::sinh;
using ::sqrt;
using ::tan;
using ::tanh;
using ::trunc;
}  // namespace std

namespace kiln {

// ---- IEEE half and bfloat16, with the hardware's round-to-nearest-even ------------------------
inline float half_to_float(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
inline uint16_t float_to_half(float f) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
inline float bfloat16_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}
inline uint16_t float_to_bfloat16(float f) {
  uint16_t b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
}

// Floating to integer as the reference interpreter converts (dtype_convert.h): NaN and values out
// of range give the type's minimum, in range truncation toward zero.
template <class I>
inline I float_to_int(double v) {
  const double lo = sizeof(I) == 8 ? -9223372036854775808.0 : -2147483648.0;
  if (!(v >= lo && v < -lo))
    return sizeof(I) == 8 ? static_cast<I>(0x8000000000000000ULL) : static_cast<I>(0x80000000U);
  return static_cast<I>(v);
}

namespace kernel {

// ---- loads --------------------------------------------------------------------------------------
template <class I>
inline int64_t ld_bool(const void* p, I i) {
  return static_cast<const uint8_t*>(p)[i] != 0;
}
template <class I>
inline int64_t ld_i32(const void* p, I i) {
  return static_cast<const int32_t*>(p)[i];
}
template <class I>
inline int64_t ld_i64(const void* p, I i) {
  return static_cast<const int64_t*>(p)[i];
}
template <class I>
inline float ld_f16(const void* p, I i) {
  return half_to_float(static_cast<const uint16_t*>(p)[i]);
}
template <class I>
inline float ld_bf16(const void* p, I i) {
  return bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
}
template <class I>
inline float ld_f32(const void* p, I i) {
  return static_cast<const float*>(p)[i];
}
template <class I>
inline double ld_f64(const void* p, I i) {
  return static_cast<const double*>(p)[i];
}

// ---- stores of a held value (exact in the dtype) ------------------------------------------------
template <class I>
inline void st_bool(void* p, I i, int64_t v) {
  static_cast<uint8_t*>(p)[i] = v != 0 ? 1 : 0;
}
template <class I>
inline void st_i32(void* p, I i, int64_t v) {
  static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
}
template <class I>
inline void st_i64(void* p, I i, int64_t v) {
  static_cast<int64_t*>(p)[i] = v;
}
template <class I>
inline void st_f16(void* p, I i, float v) {
  static_cast<uint16_t*>(p)[i] = float_to_half(v);
}
// The held value is exactly a bfloat16 (its low 16 bits are zero), so its high half is the
// bfloat16: no conversion instruction, which costs a slot of the F2F unit (16 a clock per SM).
template <class I>
inline void st_bf16(void* p, I i, float v) {
  static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
}
template <class I>
inline void st_f32(void* p, I i, float v) {
  static_cast<float*>(p)[i] = v;
}
template <class I>
inline void st_f64(void* p, I i, double v) {
  static_cast<double*>(p)[i] = v;
}

// ---- a floating value into a dtype (the store then the load) ------------------------------------
// From double (a Python float, a float64 value) as from float: c10::Half and c10::BFloat16 are
// built from a float, so a double rounds twice, as on the CPU.
inline float f_f32(float v) {
  return v;
}
inline float f_f32(double v) {
  return static_cast<float>(v);
}

// ---- an int64 into a dtype: one rounding from the integer ---------------------------------------
inline float i_f32(int64_t v) {
  return static_cast<float>(v);
}

// The 16-bit conversions and a held float read as a number: shared_prelude.h, embedded after
// this file.

// ---- vector loads and stores of `Bytes` bytes (16, 8, 4, 2 or 1), aligned to their size --------
template <int Bytes>
struct VectorWord;
template <>
struct VectorWord<16> {
  typedef uint4 type;
};
template <>
struct VectorWord<8> {
  typedef uint2 type;
};
template <>
struct VectorWord<4> {
  typedef unsigned int type;
};
template <>
struct VectorWord<2> {
  typedef unsigned short type;
};
template <>
struct VectorWord<1> {
  typedef unsigned char type;
};
template <int Bytes>
inline void vector_load(void* registers, const void* memory) {
  typedef typename VectorWord<Bytes>::type W;
  *static_cast<W*>(registers) = *static_cast<const W*>(memory);
}
template <int Bytes>
inline void vector_store(void* memory, const void* registers) {
  typedef typename VectorWord<Bytes>::type W;
  *static_cast<W*>(memory) = *static_cast<const W*>(registers);
}

inline double kernel_infinity() {
  return __longlong_as_double(0x7ff0000000000000LL);
}
inline double kernel_nan() {  // the quiet NaN std::nan("") gives
  return __longlong_as_double(0x7ff8000000000000LL);
}

}  // namespace kernel
}  // namespace kiln
