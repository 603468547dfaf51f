// The scalar helpers ops.def's elementwise expressions call, written to match PyTorch's CPU
// kernels element for element (NaN handling, signs of zero, integer rounding and errors). The
// reference interpreter calls them, and codegen embeds this file in every generated kernel.
// Kernels are compiled with KILN_GENERATED_KERNEL defined and without kiln's include path: the
// integer helpers that raise (division by zero) are left out there, and codegen never lowers a
// region that would need them (it stays interpreted). The floating helpers are templates over
// the type the math runs in (K in ops.def: double, or float in CUDA kernels); CUDA kernels get
// this file without its standard includes, and their prelude supplies the math functions.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#ifndef KILN_GENERATED_KERNEL
#include "kiln/support/error.h"
#endif

namespace kiln::math {

// (0 < a) - (a < 0): NaN gives 0 and -0.0 gives +0.0, as PyTorch's vectorized sign kernel.
template <class T>
inline T sign(T a) {
  return static_cast<T>((0 < a) - (a < 0));
}

// True division, or rounded: 1 truncates, 2 floors (PyTorch's div_floor_floating, which is
// Python's // on floats: exact for large quotients and signed zeros).
template <class T>
inline T div(T a, T b, int rounding) {
  if (rounding == 0) return a / b;
  if (rounding == 1) return std::trunc(a / b);
  if (b == 0) return a / b;
  T mod = std::fmod(a, b);
  T q = (a - mod) / b;
  if (mod != 0 && (b < 0) != (mod < 0)) q -= 1;
  if (q == 0) return std::copysign(T(0), a / b);
  T floor_q = std::floor(q);
  if (q - floor_q > T(0.5)) floor_q += 1;
  return floor_q;
}

// div as eager computes it in the op's dtype: a rounded quotient (trunc, floor) of float32,
// float16 or bfloat16 operands is computed in float, where its intermediates round (trunc(-1.5f /
// 0.1f) is -15: the float quotient is -15.0000005f rounded to -15.0f), not in double.
template <class T>
inline T div_in(T a, T b, int rounding, bool single_precision) {
  if (rounding == 0 || !single_precision) return div(a, b, rounding);
  return static_cast<T>(div(static_cast<float>(a), static_cast<float>(b), rounding));
}

#ifndef __CUDACC__
// exp(x) / 2^n for n = rint(x / ln 2): the reduction and polynomial exp_f32 and
// exp_nonpositive_f32 share (inlined into both: their vector code is one loop body).
inline float exp_f32_mantissa(float x, float n) {
  float r = std::fma(n, -0x1.62e430p-1f, x);  // ln 2 in two parts: r to about 2^-24 |r|
  r = std::fma(n, 0x1.05c610p-29f, r);
  float q = 0x1.6a2176p-10f;
  q = std::fma(q, r, 0x1.123b8ap-7f);
  q = std::fma(q, r, 0x1.5558fcp-5f);
  q = std::fma(q, r, 0x1.555490p-3f);
  q = std::fma(q, r, 0x1.fffffcp-2f);
  return std::fma(r * r, q, r) + 1.0f;
}

// exp of a float in float, within 1 ulp of the correctly rounded result (99.2% of all floats
// exactly it; checked over every float by hand and on a sample in tests/unit/scalar_math_test.cpp),
// the accuracy of eager's CPU exp (Sleef's expf, 1 ulp). Written once for the interpreter and the
// CPU kernels alike, in operations that round the same in both (explicit fma, no other
// contraction, a select for NaN), so both give the same bits; and in a loop GCC vectorizes it:
// 16 a vector with AVX-512, where a float32 exp through double ran at half that width in libm's
// double exp (softmax over rows of 64 was 2.6x eager's time on the CPU).
//   exp(x) = 2^n exp(r), n = rint(x / ln 2), r = x - n ln 2 in [-ln 2 / 2, ln 2 / 2],
//   exp(r) = 1 + r + r^2 q(r), q of degree 4 fitted near minimax (relative error 2^-27.9);
//   2^n in two factors, so that a subnormal result rounds once and n = 128 does not overflow
//   the factor (x is clamped to [-104, 89], past which the result is 0 or inf either way).
inline float exp_f32(float x) {
  float c = x > -104.0f ? x : -104.0f;  // NaN too: the last select returns it
  c = c < 89.0f ? c : 89.0f;
  const float n = std::rint(c * 0x1.715476p+0f);
  const float p = exp_f32_mantissa(c, n);
  const auto k = static_cast<int32_t>(n);
  const int32_t half = k >> 1;
  const float e =
      p * std::bit_cast<float>((half + 127) << 23) * std::bit_cast<float>((k - half + 127) << 23);
  return x != x ? x : e;
}

// exp_f32 for x in [-87, 0], where every 2^n is a normal float: the same bits with no clamp and
// one scale factor. erf_f32's exp(-x^2) takes it: exp_f32's clamps, computed under erf's own
// selects, made GCC's vector code of a float32 GELU about 40% longer (75 instructions for 8
// elements; 1.42 against 1.00 ns an element on one AVX2 core, 2026-12-06).
inline float exp_nonpositive_f32(float x) {
  const float n = std::rint(x * 0x1.715476p+0f);
  return exp_f32_mantissa(x, n) * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}
#endif

#ifndef __CUDACC__
// tanh of a float in float, within 1 ulp of the correctly rounded result (99.9% of all floats
// exactly it; checked over every float when written, on a sample in
// tests/unit/scalar_math_test.cpp), the accuracy of eager's CPU tanh (Sleef's tanhf, 1 ulp).
// Written for the interpreter and the CPU kernels alike, as exp_f32 is (explicit fma, selects,
// one formula GCC vectorizes: a float32 GELU computing tanh in libm's double took twice eager's
// time).
//   |x| < 0.625: x + x^3 p(x^2), p of degree 5 fitted near minimax (relative error 2^-32.6)
//   else:        1 - 2 / (exp(2|x|) + 1), with x's sign (exp_f32; 1 past |x| = 9.01)
inline float tanh_f32(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float p = 0x1.18e12ep-9f;
  p = std::fma(p, z, -0x1.0bf4c8p-7f);
  p = std::fma(p, z, 0x1.638b4ep-6f);
  p = std::fma(p, z, -0x1.b9ee8ep-5f);
  p = std::fma(p, z, 0x1.111066p-3f);
  p = std::fma(p, z, -0x1.555554p-2f);
  const float near_zero = std::copysign(std::fma(x * z, p, x), x);  // -0 stays -0
  const float e = exp_f32(a + a);
  const float far = std::copysign(1.0f - 2.0f / (e + 1.0f), x);
  return a < 0.625f ? near_zero : far;  // NaN: exp_f32 returns it
}
#endif

#ifndef __CUDACC__
// erf of a float in float, within 1 ulp of the correctly rounded result (94% of a sample of every
// float exactly it; tests/unit/scalar_math_test.cpp), the accuracy of eager's CPU erf (MKL's
// vsErf, 1 ulp). Written for the interpreter and the CPU kernels alike, as exp_f32 is (explicit
// fma, selects, no branch: GCC vectorizes it 16 a vector; through libm's double erf a float32
// erf or GELU took 1.5 times eager's time).
//   |x| < 0.875: x + x q(x^2), q of degree 5 fitted near minimax to erf(x)/x - 1 (relative error
//                2^-26.8; the correction is at most an eighth of the result, so its rounding
//                errors shrink by as much)
//   |x| < 3.92:  1 - exp(-x^2) g(t), t = 1 / (1 + |x| / 2), g of degree 5 fitted to
//                erfc(|x|) exp(x^2) (absolute error of erfc 2^-32.4), with x's sign
//   else:        +-1 (erfc(3.92) is under half an ulp of 1)
inline float erf_f32(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float q = -0x1.45404p-11f;
  q = std::fma(q, z, 0x1.49cb78p-8f);
  q = std::fma(q, z, -0x1.b6f3d2p-6f);
  q = std::fma(q, z, 0x1.ce2124p-4f);
  q = std::fma(q, z, -0x1.81270cp-2f);
  q = std::fma(q, z, 0x1.06eba6p-3f);
  const float near_zero = std::fma(x, q, x);  // -0 stays -0
  const float t = 1.0f / std::fma(a, 0.5f, 1.0f);
  float g = -0x1.d299b2p-3f;
  g = std::fma(g, t, 0x1.4184e6p-1f);
  g = std::fma(g, t, -0x1.bc91fcp-5f);
  g = std::fma(g, t, 0x1.903e28p-2f);
  g = std::fma(g, t, 0x1.0bb312p-2f);
  g = std::fma(g, t, 0x1.a970d6p-10f);
  // (z clamped where the select below discards far: exp's argument stays in [-15.5, 0].)
  const float e = exp_nonpositive_f32(-(z < 15.5f ? z : 15.5f));
  const float far = a < 3.92f ? std::fma(-e, g, 1.0f) : 1.0f;
  const float result = a < 0.875f ? near_zero : std::copysign(far, x);
  return x != x ? x : result;
}
#endif

// erf in the precision eager's CPU kernel computes it: erf_f32 for float32, float16 and bfloat16
// (held in float), libm's erf for float64; CUDA's erff or erf on the device.
template <class T>
inline T erf_in(T a, bool single_precision) {
#ifndef __CUDACC__
  if (single_precision) return static_cast<T>(erf_f32(static_cast<float>(a)));
#endif
  return std::erf(a);
}

// tanh in the precision eager's CPU kernel computes it: tanh_f32 for float32, float16 and
// bfloat16 (held in float), libm's tanh for float64; CUDA's tanhf or tanh on the device.
template <class T>
inline T tanh_in(T a, bool single_precision) {
#ifndef __CUDACC__
  if (single_precision) return static_cast<T>(tanh_f32(static_cast<float>(a)));
#endif
  return std::tanh(a);
}

// GELU as eager's CPU kernels compute it. For float32, float16 and bfloat16 in float whatever T
// holds the value in (the interpreter's double, a kernel's float: the same bits), with eager's
// formulas and order: x * 0.5 * (1 + erf(x * sqrt(1/2))), and with approximate="tanh"
// 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x * x * x))).
template <class T>
inline T gelu(T x, bool approximate_tanh, bool single_precision) {
#ifndef __CUDACC__
  if (single_precision) {
    const float f = static_cast<float>(x);
    if (approximate_tanh) {
      const float inner = 0x1.988454p-1f * (f + 0.044715f * (f * f * f));
      return static_cast<T>(0.5f * f * (1.0f + tanh_f32(inner)));
    }
    return static_cast<T>(f * 0.5f * (1.0f + erf_f32(f * 0x1.6a09e6p-1f)));
  }
#endif
  if (approximate_tanh) {
    constexpr T kBeta = T(0.7978845608028654);  // sqrt(2 / pi)
    constexpr T kKappa = T(0.044715);
    return T(0.5) * x * (T(1) + tanh_in(kBeta * (x + kKappa * x * x * x), single_precision));
  }
  return T(0.5) * x * (T(1) + std::erf(x * T(0.7071067811865476)));  // x / sqrt(2)
}

// exp in the precision eager's CPU kernel computes it: exp_f32 for float32, float16 and
// bfloat16 (held in float), libm's exp for float64; CUDA's expf or exp on the device.
template <class T>
inline T exp_in(T a, bool single_precision) {
#ifndef __CUDACC__
  if (single_precision) return static_cast<T>(exp_f32(static_cast<float>(a)));
#endif
  return std::exp(a);
}

// sigmoid and silu in the precision eager's CPU kernels compute them: for float32, float16 and
// bfloat16, 1 + exp_f32(-x) and one division, each rounded to float (eager's vectorized kernels:
// (1 + exp(-x)).reciprocal() and x / (1 + exp(-x)) in float). Computed in float whatever T holds
// the value in, so the interpreter (T double) and a kernel (T float, 16 lanes a vector) give the
// same bits; in double a float32 silu ran at half the vector width.
template <class T>
inline T sigmoid_in(T a, bool single_precision) {
#ifndef __CUDACC__
  if (single_precision) return static_cast<T>(1.0f / (1.0f + exp_f32(-static_cast<float>(a))));
#endif
  return T(1) / (T(1) + std::exp(-a));
}
template <class T>
inline T silu_in(T a, bool single_precision) {
#ifndef __CUDACC__
  if (single_precision) {
    const float x = static_cast<float>(a);
    return static_cast<T>(x / (1.0f + exp_f32(-x)));
  }
#endif
  return a / (T(1) + std::exp(-a));
}

// Python's %: the result has the divisor's sign.
template <class T>
inline T remainder(T a, T b) {
  T mod = std::fmod(a, b);
  if (mod != 0 && (b < 0) != (mod < 0)) mod += b;
  return mod;
}

#ifndef KILN_GENERATED_KERNEL
inline void check_int_divisor(int64_t b) {
  KILN_CHECK(b != 0) << "ZeroDivisionError";
}

// Integer division with a rounding mode (true division of integers computes in float). The
// lowest value divided by -1 wraps, as two's complement does.
inline int64_t div_int(int64_t a, int64_t b, int rounding) {
  KILN_ASSERT(rounding != 0) << "integer true division must compute in a floating dtype";
  check_int_divisor(b);
  if (b == -1) return static_cast<int64_t>(0 - static_cast<uint64_t>(a));
  int64_t q = a / b;
  if (rounding == 2 && (a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

inline int64_t remainder_int(int64_t a, int64_t b) {
  check_int_divisor(b);
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && (r < 0) != (b < 0)) r += b;
  return r;
}

// C's %: the result has the dividend's sign.
inline int64_t fmod_int(int64_t a, int64_t b) {
  check_int_divisor(b);
  if (b == -1) return 0;
  return a % b;
}

#endif  // KILN_GENERATED_KERNEL

// PyTorch's powi. A negative exponent gives 1 for base 1, +-1 for base -1 and 0 otherwise; the
// interpreter raises before getting here when the exponent is a Python number (pow.Tensor_Scalar
// rejects it). Squaring wraps like the int64 multiply it is.
inline int64_t pow_int(int64_t a, int64_t b) {
  if (b < 0) {
    if (a == 1) return 1;
    if (a == -1) return (b % 2 == 0) ? 1 : -1;
    return 0;
  }
  uint64_t base = static_cast<uint64_t>(a), result = 1;
  for (auto e = static_cast<uint64_t>(b); e; e >>= 1) {
    if (e & 1) result *= base;
    base *= base;
  }
  return static_cast<int64_t>(result);
}

// NaN-propagating maximum/minimum (torch.maximum, torch.minimum): a NaN operand is the result.
template <class T>
inline T maximum(T a, T b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return a > b ? a : b;
}
template <class T>
inline T minimum(T a, T b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return a < b ? a : b;
}

// clamp with optional bounds: a NaN bound gives NaN, a NaN input stays NaN, and min > max gives
// max (min(max(a, lo), hi) applied in that order).
template <class T>
inline T clamp(T a, T lo, T hi, bool has_lo, bool has_hi) {
  if (has_lo && std::isnan(lo)) return lo;
  if (has_hi && std::isnan(hi)) return hi;
  // A NaN input fails both comparisons and is returned as it is: no test of its own, which
  // took three more compares and mask operations a vector of elements in a vectorized loop.
  if (has_lo && a < lo) a = lo;
  if (has_hi && a > hi) a = hi;
  return a;
}
inline int64_t clamp_int(int64_t a, int64_t lo, int64_t hi, bool has_lo, bool has_hi) {
  if (has_lo && a < lo) a = lo;
  if (has_hi && a > hi) a = hi;
  return a;
}

// torch.lerp's two-sided formula, exact at weight 0 and 1.
template <class T>
inline T lerp(T self, T end, T weight) {
  return std::fabs(weight) < T(0.5) ? self + weight * (end - self)
                                    : end - (end - self) * (1 - weight);
}

}  // namespace kiln::math
