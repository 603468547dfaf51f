// The facts of a compiled program that every execute needs, computed on its first execute for a
// device and kept in CompiledProgram::executor_cache: its kernels for that device and which of
// its values later steps read, where results may stay, what layout readers need.
#pragma once

#include <map>
#include <memory>
#include <set>

#include "kiln/passes/pipeline.h"
#include "kiln/runtime/cpu/cpu_kernels.h"
#include "kiln/runtime/cuda/cuda_kernels.h"

namespace kiln {

// A program's kernels for one device, prepared on its first execute (CompiledProgram::
// executor_cache) and reused: a later call neither lowers nor looks anything up.
struct PreparedKernels {
  Device device;
  bool cpu_kernels = false;  // KILN_CPU_KERNELS when they were prepared
  cpu::PlanKernels cpu;
  cuda::CudaPlanKernels cuda;
  // Facts of the program that every call needs (computed once, not per call):
  std::set<const Value*> inputs_kept;  // outputs and writeback values (read before writebacks)
  std::set<const Value*> read_later;   // values read after the step that makes them
  // Values a step stores into the caller's memory (its writebacks) that later steps may read
  // there: no later step writes that target again, and the value is not an output (a KV cache
  // after its index_copy_, read by the attention: copying it out cost a copy of the cache per
  // layer and token).
  std::set<const Value*> stays_in_caller;
  // Opaque steps' results that every reader indexes through their strides (fused kernels,
  // cuBLAS, the writebacks' copies; results are laid out for the caller at the end): a product
  // computed padded may stay in its padded buffer (cublas.h).
  std::set<const Value*> any_layout;
  // CUDA kernels' 16-bit results that only matrix products and kernels read, laid out with
  // their rows padded to tensor-core alignment (the row pitch in elements): the products read
  // them in place instead of through a padded copy (cublas.cpp, reads_zero_padded).
  std::map<const Value*, int64_t> padded_rows;
  // Fusion steps' outputs laid out in another dim order (Step::output_orders).
  std::set<const Value*> laid_out;
  // Per fusion step without a kernel (one PyTorch runs op by op): what decides its index ops'
  // indices before the first step, one IndexCheck per index drawn from the program's inputs
  // (none for an index known in range), or nullopt when an index is neither (its op checks it).
  std::vector<std::optional<std::vector<codegen::IndexCheck>>> runner_index_checks;
  // The trace's inputs (one per alias group, then numbers; analysis/alias_pattern.h): each
  // group's first argument, whether the program writes back into the group, and the group of
  // a trace input by its Value's id (-1 for a value that is not a group's input). Looked up
  // by a search over the arguments at each call, these were quadratic in the arguments (an
  // optimizer's step has hundreds).
  std::vector<size_t> group_first_arg;
  std::vector<bool> group_written;
  std::vector<int> group_of_value;
  std::vector<size_t> kept_inputs;  // indices of the trace's inputs in inputs_kept
};

// The program's prepared kernels and facts for `device` (made once, then the cached ones).
std::shared_ptr<const PreparedKernels> prepared_kernels(const CompiledProgram& program,
                                                        Device device);

}  // namespace kiln
