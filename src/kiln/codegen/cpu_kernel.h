// The CPU emitter (DESIGN.md 3): lowers one fusion step of an execution plan into the C++ source
// of one kernel, and describes how to call it.
//
// A kernel is a few loop nests, one per distinct output shape. Each nest iterates over its
// output's elements and evaluates every output of that shape at the iteration's index as one
// expression over indexed loads of the step's inputs: view ops remap the index (index_map.h),
// elementwise ops are ops.def's own expressions (as text), scatters are index conditions and
// creation ops are constants or index expressions. A value is never materialized inside the
// kernel; a value read at two different indices is computed twice. Every value of an iteration is
// computed before the iteration stores anything, and the nest that holds the step's writebacks
// runs last, so a store into an input (a writeback done in the kernel, DESIGN.md 4) happens after
// every read of the old contents the kernel makes elsewhere and, under the same-index rule, after
// its own iteration's reads.
//
// Values follow the reference interpreter exactly: floating math in double with each op's result
// rounded to its dtype (f16/bf16 with round-to-nearest-even, through dtype_convert.h), integer
// math in int64 with the interpreter's conversions, operands converted to the op's compute dtype.
//
// Not lowered (the executor interprets the step instead; `why_not` says why): reductions,
// cat/stack, opaque ops, as_strided and as_strided_scatter except of an input or of a 1-D value
// that is a whole storage (as functionalize makes them) with a window that does not repeat
// elements, integer div/remainder/fmod/pow (they can raise), arguments the interpreter would
// reject, non-CPU tensors.
//
// Requires: a kFusion step whose body is a verified functional trace.
// Tests: tests/unit/cpu_backend_test.cpp.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/analysis/geometry.h"
#include "kiln/passes/plan.h"

namespace kiln::codegen {

// The kernel function is
//   extern "C" void NAME(void* const* ins, const int64_t* in_meta, const double* sd,
//                        const int64_t* si, void* const* outs, const int64_t* out_meta);
// ins[k]: the start of step input k's storage (not of its first element); in_meta from
// in_meta[meta]: its storage offset, then one stride per dim (elements). sd[k] / si[k]: step input
// k as a double / an int64 when it is a number. outs[k], out_meta: the same for step output k's
// buffer. Every stride and offset is read at run time; sizes are compiled in.
using CpuKernelFn = void (*)(void* const* ins, const int64_t* in_meta, const double* sd,
                             const int64_t* si, void* const* outs, const int64_t* out_meta);

// A storage region an input is read through with as_strided (its storage, not its elements):
// the executor checks it is inside the storage before running the kernel.
struct StorageWindow {
  Shape sizes;
  Strides strides;
  std::optional<int64_t> offset;  // none: the input's own storage offset
};

struct CpuKernelInput {
  bool is_tensor = false;
  int meta = -1;  // where its offset and strides start in in_meta (tensors)
  // How the last loop nest reads it: not at all, only at exactly the element the iteration
  // stores into a same-shaped output (the same-index rule's "identity"), or otherwise.
  enum class Loads { kNone, kIdentity, kOther };
  Loads last_nest_loads = Loads::kNone;
  std::vector<StorageWindow> windows;
  // Indexed as a storage (by as_strided_scatter, or as_strided of a value computed from it): the
  // executor runs the kernel only when the input is 1-D, dense from offset 0 and its storage's
  // only content.
  bool whole_storage = false;
};

struct CpuKernelOutput {
  DType dtype = DType::kFloat32;
  Shape shape;
  int meta = -1;              // where its offset and strides start in out_meta
  bool in_last_nest = false;  // stored by the last nest (where an in-kernel writeback can be)
};

struct CpuKernel {
  // The function, named by the macro KILN_KERNEL_NAME (cpu_module_source defines it).
  std::string source;
  std::vector<CpuKernelInput> inputs;    // one per step input
  std::vector<CpuKernelOutput> outputs;  // one per step output
  int64_t in_meta_size = 0;
  int64_t out_meta_size = 0;
};

struct CpuLowering {
  std::optional<CpuKernel> kernel;
  std::string why_not;  // when there is no kernel: the op and the reason
};

CpuLowering lower_cpu_kernel(const Step& step);

// One translation unit with several kernels: the prelude (kernel_prelude.h and the headers it
// names), then each kernel's source under its own symbol name.
std::string cpu_module_source(
    const std::vector<std::pair<std::string, const std::string*>>& kernels);

// The embedded prelude text (generated at build time from the headers by embed_prelude.cmake).
const char* cpu_kernel_prelude();

}  // namespace kiln::codegen
