// The CPU backend's link to the executor: compiled kernels for the fusion steps of a plan
// (codegen's CPU emitter + the kernel cache), and running one on real tensors.
//
// KILN_CPU_KERNELS=1 runs every fusion step that lowers as a compiled kernel, =0 interprets every
// step (the reference interpreter); unset, the default below. Steps that do not lower are always
// interpreted.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/codegen/kernel.h"
#include "kiln/passes/plan.h"
#include "kiln/runtime/cpu/kernel_cache.h"
#include "kiln/runtime/interpreter/rt_tensor.h"
#include "kiln/runtime/kernel_inputs.h"

namespace kiln::cpu {

// Whether CPU kernels are on when KILN_CPU_KERNELS is unset.
inline constexpr bool kCpuKernelsByDefault = true;
bool cpu_kernels_enabled();

struct StepKernel {
  codegen::Kernel kernel;
  codegen::CpuKernelFn fn = nullptr;
};

struct MultiTensorStepKernel {
  codegen::MultiTensorKernel kernel;
  codegen::CpuKernelFn fn = nullptr;
};

struct PlanKernels {
  std::vector<std::optional<StepKernel>> steps;  // one per plan step
  std::vector<std::string> why_not;              // per step without a kernel (fusion steps)
  // One per plan.multi_tensor_groups: none where a step of the group has no kernel of its own
  // (the executor falls back to those) or the group's does not lower.
  std::vector<std::optional<MultiTensorStepKernel>> groups;
};

// Lowers every fusion step and gets its kernel from `cache`, compiling the missing ones together.
PlanKernels prepare_cpu_kernels(const ExecutionPlan& plan, KernelCache& cache = kernel_cache());

// The kernels of several plans compiled together into the disk cache (KernelCache::warm), so that
// later runs of them, in this process or others, only load them: tests and warm-ups that have
// many programs at hand. Steps that do not lower are skipped.
void warm_cpu_kernels(const std::vector<const ExecutionPlan*>& plans,
                      KernelCache& cache = kernel_cache());

// Runs the kernel on the step's input values and output buffers (one per step output, of its
// dtype and shape, any strides; a buffer may be an input's memory under the same-index rule).
// Returns false without running anything when an as_strided read would leave its storage: the
// interpreter then raises eager's error.
bool run_cpu_kernel(const StepKernel& k, const std::vector<RtValue>& inputs,
                    const std::vector<TensorHandle>& outputs);

// Runs the multi-tensor kernel over `members` (each member's tensors dense, its buffers of its
// outputs' dtypes and shapes; kernel_inputs.h).
void run_cpu_multi_tensor(const MultiTensorStepKernel& k,
                          const std::vector<MultiTensorMember>& members);

}  // namespace kiln::cpu
