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
// name(double) and its single-precision form namef(float), both with vector variants.
#define KILN_VECTOR_UNARY(name)                  \
  KILN_VECTOR_MATH double name(double) noexcept; \
  KILN_VECTOR_MATH float name##f(float) noexcept;
#define KILN_VECTOR_BINARY(name)                         \
  KILN_VECTOR_MATH double name(double, double) noexcept; \
  KILN_VECTOR_MATH float name##f(float, float) noexcept;
extern "C" {
KILN_VECTOR_UNARY(sin)
KILN_VECTOR_UNARY(cos)
KILN_VECTOR_UNARY(exp)
KILN_VECTOR_UNARY(log)
KILN_VECTOR_BINARY(pow)
#if __GLIBC_PREREQ(2, 35)
KILN_VECTOR_UNARY(tan)
KILN_VECTOR_UNARY(tanh)
KILN_VECTOR_UNARY(asin)
KILN_VECTOR_UNARY(acos)
KILN_VECTOR_UNARY(atan)
KILN_VECTOR_BINARY(atan2)
KILN_VECTOR_UNARY(sinh)
KILN_VECTOR_UNARY(cosh)
KILN_VECTOR_UNARY(exp2)
KILN_VECTOR_UNARY(expm1)
KILN_VECTOR_UNARY(log2)
KILN_VECTOR_UNARY(log1p)
KILN_VECTOR_UNARY(erf)
#endif
}
#undef KILN_VECTOR_UNARY
#undef KILN_VECTOR_BINARY
#undef KILN_VECTOR_MATH
#endif
