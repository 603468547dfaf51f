// The OpenMP reductions of the CPU kernels' vectorized reduction passes (lower_kernel.cpp:
// `#pragma omp simd reduction(kiln_max:acc)`): max and min that propagate NaN as red_max and
// red_min do (OpenMP's own max and min need not). Embedded after shared_prelude.h.
#pragma once

#include <limits>

#include "kiln/codegen/shared_prelude.h"

#pragma omp declare reduction(kiln_max:double                                     \
                              : omp_out = kiln::kernel::red_max(omp_out, omp_in)) \
    initializer(omp_priv = -std::numeric_limits <double>::infinity())
#pragma omp declare reduction(kiln_min:double                                     \
                              : omp_out = kiln::kernel::red_min(omp_out, omp_in)) \
    initializer(omp_priv = std::numeric_limits <double>::infinity())
