// The CUDA backend's link to the executor: compiled kernels for the fusion steps of a plan (the
// kernel emitter for Target::kCuda, NVRTC and the CUDA kernel cache), running one on device
// tensors, and the device memory operations the executor needs (allocation, strided copies with
// dtype conversion, transfers).
//
// CUDA kernel cache: in memory (source -> loaded functions, per device) and on disk under the
// cache folder (cache_files.h) as cu-<key>.cubin with a checksum trailer, keyed by the source,
// NVRTC's version and the architecture. A corrupt file is never loaded: it is compiled again and
// replaced. A second process with a warm cache compiles nothing.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/codegen/kernel.h"
#include "kiln/passes/plan.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cuda/driver.h"
#include "kiln/runtime/interpreter/rt_tensor.h"
#include "kiln/runtime/kernel_inputs.h"

namespace kiln::cuda {

struct NestEntries {
  Function scalar32 = nullptr, scalar64 = nullptr;
  Function vector32 = nullptr, vector64 = nullptr;  // null without a vectorized variant
};

struct CudaStepKernel {
  codegen::Kernel kernel;
  std::vector<NestEntries> nests;
  int device = 0;
};

struct CudaMultiTensorKernel {
  codegen::MultiTensorKernel kernel;
  Function entry = nullptr;  // <symbol>_mt
  int device = 0;
};

struct CudaPlanKernels {
  std::vector<std::optional<CudaStepKernel>> steps;  // one per plan step
  std::vector<std::string> why_not;                  // per fusion step without a kernel
  // One per plan.multi_tensor_groups, as cpu::PlanKernels::groups.
  std::vector<std::optional<CudaMultiTensorKernel>> groups;
};

struct CudaCacheStats {
  int compiled = 0;     // NVRTC runs
  int disk_hits = 0;    // cubins loaded from the disk cache
  int memory_hits = 0;  // kernels found loaded
  int corrupt_files = 0;
};
CudaCacheStats cuda_cache_stats();

// Lowers every fusion step of `plan` for CUDA and gets its kernel, compiling the missing ones
// (in parallel, KILN_COMPILE_JOBS threads).
CudaPlanKernels prepare_cuda_kernels(const ExecutionPlan& plan, int device);

// Compiles a kernel module source with NVRTC (for tests and tools): the cubin and NVRTC's log.
struct CompiledModule {
  std::string cubin;
  std::string log;
};
CompiledModule compile_cuda_kernel(const codegen::Kernel& kernel, int arch);
// The same for a kernel's source alone (a multi-tensor kernel's).
CompiledModule compile_cuda_source(const std::string& kernel_source, int arch);
// The module source of the copy kernels kiln's CUDA writebacks, clones and padded products run
// (device_copies.cpp; for the test that compiles it).
std::string copy_module_source();

// Runs the kernel's nests in order on `stream` (inputs and output buffers as for the CPU kernel;
// the workspace of split row nests from `allocator`, else kiln's own memory). Returns false
// without running anything when an as_strided read would leave its storage, or when the device
// cannot hold a split row nest's blocks at once.
bool run_cuda_kernel(const CudaStepKernel& k, const std::vector<RtValue>& inputs,
                     const std::vector<TensorHandle>& outputs, Stream stream = nullptr,
                     Allocator* allocator = nullptr);

// Runs the multi-tensor kernel over `members` (as cpu::run_cpu_multi_tensor) on `stream`, in
// launches of at most members_per_launch members; returns the number of launches.
int run_cuda_multi_tensor(const CudaMultiTensorKernel& k,
                          const std::vector<MultiTensorMember>& members, Stream stream = nullptr);

// ---- device tensors -----------------------------------------------------------------------------

// A new CUDA tensor with this layout over a storage of `storage_numel` elements (zero-filled when
// `zero`).
// From `allocator` when given, else cuMemAlloc.
TensorHandle cuda_strided(DType dtype, const Shape& shape, const std::vector<int64_t>& strides,
                          int64_t offset, int64_t storage_numel, Device device, bool zero,
                          Allocator* allocator = nullptr, Stream stream = nullptr);
// The same view over a copy of the tensor's whole storage on `device` / on the host (the host
// copy keeps the device label: Storage::on_device() tells them apart).
TensorHandle to_device(const RtTensor& host, Device device);
TensorHandle to_host(const RtTensor& device_tensor);
// A host copy of only the storage span `device_tensor`'s elements lie in, laid out as they are
// there (an index read back for its check: a few ids of a large buffer).
TensorHandle elements_to_host(const RtTensor& device_tensor);
// dst.copy_(src) on the device (both CUDA tensors of one device): broadcast, dtype conversion
// and eager's overlap errors as copy_into; src is read whole before dst is written.
void cuda_copy_into(RtTensor& dst, const RtTensor& src, Stream stream = nullptr);
// The elements of src (broadcast to dst's shape) into dst's, with no overlap checks: dst may
// repeat elements (every copy gets the same value); src must not share memory with dst.
void cuda_copy_elements(RtTensor& dst, const RtTensor& src, Stream stream = nullptr);
// Single elements (of 1, 2, 4 or 8 bytes each) copied from device address src to dst, all in one
// launch (for up to kMaxElementCopies of them). Requires: no destination overlaps another copy's
// source or destination.
struct ElementCopy {
  uint64_t src = 0, dst = 0;
  int64_t bytes = 0;
};
constexpr size_t kMaxElementCopies = 128;  // 3 KiB of kernel parameters, of the 4 KiB a launch has
void cuda_copy_single_elements(std::span<const ElementCopy> copies, int device,
                               Stream stream = nullptr);
// A contiguous copy on the device.
TensorHandle cuda_clone(const RtTensor& t, Stream stream = nullptr, Allocator* allocator = nullptr);

}  // namespace kiln::cuda
