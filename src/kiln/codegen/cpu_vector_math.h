// The first part of every generated CPU kernel (embedded before cpu_prelude.h; never included by
// kiln itself, which does not link libmvec): glibc's vector math library. With these declarations
// a flat `omp simd` loop calls _ZGV..._tanh and friends on several elements at once instead of
// tanh one element at a time (glibc's <math.h> declares them only under -ffast-math, which kiln
// does not use). Double precision only, as the kernels compute; kernels link -lmvec
// (runtime/cpu/compiler.cpp).
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
#endif
}
#undef KILN_VECTOR_MATH
#endif
