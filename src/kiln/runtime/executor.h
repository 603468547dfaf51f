// Runs a compiled program on the caller's tensors, on their device: builds the alias groups'
// bases from the caller's storages, runs the execution trace (each fusion region as a compiled
// kernel — CUDA for CUDA tensors, CPU when KILN_CPU_KERNELS allows — when it lowers, else in the
// reference interpreter, for CUDA tensors on host copies),
// performs the writebacks into the caller's memory, applies metadata mutations to the caller's
// tensor objects, and returns outputs that are fresh tensors, the caller's own objects, or real
// views of the caller's tensors, exactly as eager would.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

namespace codegen {
struct IndexCheck;
}

// How an argument looks to the alias analysis.
TensorDescription describe(const RtValue& arg);
AliasPattern alias_pattern_of(const std::vector<RtValue>& args);

// What one execute call did, for tests and tools.
struct ExecutionStats {
  // Fusion steps run as compiled kernels (CPU or CUDA), a multi-tensor kernel's launch counting
  // once, whatever the steps it runs (multi_tensor_steps: those steps).
  int kernel_steps = 0;
  int multi_tensor_steps = 0;
  int library_steps = 0;         // opaque steps run by a library (cuBLAS)
  int interpreted_steps = 0;     // steps run in the reference interpreter (for CUDA: on the host)
  int eager_steps = 0;           // torch ops run by PyTorch (eager_call)
  int torch_steps = 0;           // steps without a kernel run op by op by a StepRunner
  int view_steps = 0;            // steps that only view their inputs: no data moves (metadata)
  int writebacks_in_kernel = 0;  // stored by a kernel straight into the caller's memory
  int writebacks_copied = 0;     // copied into the caller's memory after their step
  // Kernels' index checks (codegen::IndexCheck): decided before the first step from the inputs
  // the indices are drawn from, or made at their step (on CUDA each of those synchronizes).
  int index_checks_first = 0;
  int index_checks_at_steps = 0;
  // Copies the executor makes besides writebacks: a synthetic base's storage extent (read by the
  // trace), a result that lives in the caller's memory (detached from later writebacks), a
  // result laid out otherwise than eager lays it out (materialized), and their bytes.
  int layout_copies = 0;
  int64_t layout_copy_bytes = 0;
  // CUDA: 16-bit matrix products run padded for tensor cores (cuda/cublas.h), and the bytes the
  // copies into and out of the padded buffers moved.
  int aligned_products = 0;
  int64_t alignment_copy_bytes = 0;
  // CUDA: storages copied between the device and the host to interpret a step there, and their
  // bytes (both directions). DESIGN.md 7 wants none: every step on the device.
  int host_copies = 0;
  int64_t host_copy_bytes = 0;
  // CUDA graphs (cuda/graph_replay.h): the call captured the program into one, or replayed it
  // (then the counts above are those of the captured run).
  int graph_captures = 0;
  int graph_replays = 0;
  // Of a graph's fresh results, those its replays write into new memory (the launches that use
  // them pointed there) and those they copy out of the graph's memory.
  int graph_results_rebound = 0;
  int graph_results_copied = 0;
  // With call_profile::set_step_times(true): each step the run made, how (kernel, library,
  // eager, view, torch, interpreted, copy: a step with only writebacks), and its host seconds.
  struct StepTime {
    int step = 0;
    const char* how = "";
    double seconds = 0;
  };
  std::vector<StepTime> step_times;
};

// Set while a call is captured into a CUDA graph (cuda/graph_replay.h), when nothing runs: the
// executor hands each index check to it (it checks before every replay), asks it to refuse
// (throw cuda::CaptureRefused) at a step that needs the host, and to admit or refuse each step
// PyTorch runs (eager_call) before it runs, given the step's body and inputs. It is told the
// tensors of each step whose launches are not kiln's kernels (a library call, an eager step):
// their kernels may hold those addresses where kiln cannot see them.
class ExecutionCapture {
 public:
  virtual ~ExecutionCapture() = default;
  virtual void defer_index_check(const codegen::IndexCheck& check, const TensorHandle& index) = 0;
  virtual void admit_eager_step(const Trace& body, const std::vector<RtValue>& inputs) = 0;
  virtual void note_foreign_step(const std::vector<RtValue>& inputs,
                                 const std::vector<RtValue>& outputs) = 0;
  [[noreturn]] virtual void refuse(const std::string& why) = 0;
};

// PyTorch's part in a CUDA graph capture, which the Python front end provides: while a program
// with eager_call steps is captured, PyTorch's current stream is the capture stream and its
// allocations go to a memory pool of the graph's own (the ops' results and workspaces, at the
// addresses every replay uses). One per captured graph.
class EagerCapturePool {
 public:
  // Frees the pool's memory for PyTorch's other uses (after the graph is destroyed).
  virtual ~EagerCapturePool() = default;
  // PyTorch's current stream and allocations as they were before the capture.
  virtual void end_capture() = 0;
};
// Called before a capture begins on `stream` (a CUstream) of `device`.
using EagerCaptureJoin = std::function<std::unique_ptr<EagerCapturePool>(void* stream, int device)>;

// Runs a step that has no kernel op by op where its tensors are (the Python front end: through
// PyTorch, on the device), instead of kiln's reference interpreter, which on CUDA works on host
// copies. Returns the step body's outputs. `indices_checked`: the executor knows every index of
// the body's index ops in range (the runner need not read them back to check them).
using StepRunner = std::function<std::vector<RtValue>(
    const Trace& body, const std::vector<RtValue>& inputs, bool indices_checked)>;

struct ExecuteOptions {
  Allocator* allocator = nullptr;  // null: kiln's own memory
  void* stream = nullptr;          // the CUDA stream kernels run on (CUstream); null: the default
  ExecutionStats* stats = nullptr;
  // The caller has established alias_pattern_of(args) == program.pattern (kiln.jit's call key
  // holds everything the pattern is computed from), so execute need not compute it again.
  bool pattern_known = false;
  const StepRunner* step_runner = nullptr;  // null: the reference interpreter runs such steps
  ExecutionCapture* capture = nullptr;      // non-null while the call is captured
  // How PyTorch joins a capture; null: a program with eager_call steps is never a CUDA graph.
  const EagerCaptureJoin* eager_capture = nullptr;
};

// Requires: `args` has the dtypes, shapes and layouts the program was compiled for, and the alias
// pattern `program.pattern` (alias_pattern_of(args) == program.pattern).
std::vector<RtValue> execute(const CompiledProgram& program, const std::vector<RtValue>& args,
                             const ExecuteOptions& options);
inline std::vector<RtValue> execute(const CompiledProgram& program,
                                    const std::vector<RtValue>& args,
                                    ExecutionStats* stats = nullptr) {
  return execute(program, args, ExecuteOptions{nullptr, nullptr, stats});
}

}  // namespace kiln
