// The first part of every generated CPU kernel (embedded before cpu_prelude.h; never included by
// kiln itself, which does not link libmvec): glibc's vector math library. With these declarations
// a flat `omp simd` loop calls _ZGV..._tanh and friends on several elements at once instead of
// tanh one element at a time (glibc's <math.h> declares them only under -ffast-math, which kiln
// does not use). Double precision for float32 and float64 values, single for 16-bit ones (the
// kernels' register types, cpu_prelude.h); kernels link -lmvec (runtime/cpu/compiler.cpp).
#pragma once

#include <cmath>

#if defined(__x86_64__) && defined(__GLIBC__)
#define KILN_VECTOR_MATH __attribute__((simd("notinbranch")))
extern "C" {
KILN_VECTOR_MATH double sin(double) noexcept;
KILN_VECTOR_MATH double cos(double) noexcept;
KILN_VECTOR_MATH double exp(double) noexcept;
KILN_VECTOR_MATH double log(double) noexcept;
KILN_VECTOR_MATH double pow(double, double) noexcept;
KILN_VECTOR_MATH float sinf(float) noexcept;
KILN_VECTOR_MATH float cosf(float) noexcept;
KILN_VECTOR_MATH float expf(float) noexcept;
KILN_VECTOR_MATH float logf(float) noexcept;
KILN_VECTOR_MATH float powf(float, float) noexcept;
#if __GLIBC_PREREQ(2, 35)
KILN_VECTOR_MATH double tan(double) noexcept;
KILN_VECTOR_MATH double tanh(double) noexcept;
KILN_VECTOR_MATH double asin(double) noexcept;
KILN_VECTOR_MATH double acos(double) noexcept;
KILN_VECTOR_MATH double atan(double) noexcept;
KILN_VECTOR_MATH double atan2(double, double) noexcept;
KILN_VECTOR_MATH double sinh(double) noexcept;
KILN_VECTOR_MATH double cosh(double) noexcept;
KILN_VECTOR_MATH double exp2(double) noexcept;
KILN_VECTOR_MATH double expm1(double) noexcept;
KILN_VECTOR_MATH double log2(double) noexcept;
KILN_VECTOR_MATH double log1p(double) noexcept;
KILN_VECTOR_MATH double erf(double) noexcept;
KILN_VECTOR_MATH float tanf(float) noexcept;
KILN_VECTOR_MATH float tanhf(float) noexcept;
KILN_VECTOR_MATH float asinf(float) noexcept;
KILN_VECTOR_MATH float acosf(float) noexcept;
KILN_VECTOR_MATH float atanf(float) noexcept;
KILN_VECTOR_MATH float atan2f(float, float) noexcept;
KILN_VECTOR_MATH float sinhf(float) noexcept;
KILN_VECTOR_MATH float coshf(float) noexcept;
KILN_VECTOR_MATH float exp2f(float) noexcept;
KILN_VECTOR_MATH float expm1f(float) noexcept;
KILN_VECTOR_MATH float log2f(float) noexcept;
KILN_VECTOR_MATH float log1pf(float) noexcept;
KILN_VECTOR_MATH float erff(float) noexcept;
#endif
}
#undef KILN_VECTOR_MATH
#endif
