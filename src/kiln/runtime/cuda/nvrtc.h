// NVRTC, loaded with dlopen so that kiln builds and runs on machines without the CUDA toolkit:
// CUDA C++ source to a cubin (real SASS for one compute capability, not PTX).
//
// The library is the first of $KILN_NVRTC_LIBRARY, libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so
// and the same names under /usr/local/cuda/lib64 that loads.
#pragma once

#include <string>

namespace kiln::cuda {

// Whether NVRTC is there; when it is not, `why` (if given) says what was tried.
bool nvrtc_available(std::string* why = nullptr);
// "13.0"; raises a UserError when NVRTC is missing.
std::string nvrtc_version();

// The compiler's math option, part of every kernel's cache identity: no contraction of a product
// and a sum into one fused multiply-add. Eager rounds each op's result to its dtype before the next
// op reads it; a kernel that fuses x.mul_(0.9).add_(0.9) must round the product too, which an
// FMA skips (float32 results differed from eager's in a fifth of the elements on the H200,
// tests/python/test_numbers.py).
inline constexpr const char* kNvrtcMathOption = "--fmad=false";

struct NvrtcOutput {
  std::string cubin;
  std::string log;  // warnings, if any (empty for a clean compile)
};

// Compiles `source` for sm_<arch> (90 for the H200). A failed compile raises an InternalError
// with the log and the path the source was saved to; a missing NVRTC raises a UserError.
NvrtcOutput nvrtc_compile(const std::string& source, int arch, const std::string& name);

}  // namespace kiln::cuda
