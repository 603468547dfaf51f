// One call of execute() (executor.h), the executor's state while it runs a program: its
// steps are defined in executor.cpp, multi-tensor groups in multi_tensor_steps.cpp.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "kiln/runtime/device_memory.h"
#include "kiln/runtime/executor.h"
#include "kiln/runtime/prepared_program.h"
#include "kiln/runtime/value_slots.h"

namespace kiln::detail {

// Where each group's base starts in its caller storage.
struct GroupBase {
  TensorHandle caller;  // a caller tensor of the group
  int64_t start = 0;    // storage index of the base's element 0
};

// One call of execute(): the trace's inputs bound to the caller's tensors, the functional trace's
// values as the steps make them (env_), and the writebacks into the caller's memory.
//
//   ProgramRun run(program, args, options);   // checks the arguments, binds the inputs
//   run.run_plan();                           // each step, then its writebacks
//   return run.results();                     // outputs, metadata mutations, what is handed out
class ProgramRun {
 public:
  ProgramRun(const CompiledProgram& program, const std::vector<RtValue>& args,
             const ExecuteOptions& options, ExecutionStats* stats);
  // No plan (the pipeline stopped before fuse): the functional trace as one step.
  void run_whole_trace();
  void run_plan();
  bool has_plan() const { return !program_.plan.steps.empty(); }
  std::vector<RtValue> results();

 private:
  void bind_inputs();
  // A value that lives in the caller's memory (an input passed through, or a view of one) is
  // copied before any writeback can change that memory.
  RtValue detach(RtValue v) const;
  size_t group_of(const Value* target) const;
  // Where a writeback into `target` goes: the caller's tensor, or its group's storage extent.
  TensorHandle destination(const Value* target) const;
  // The part of `target` a writeback replaces (plan.h): its destination, through the window.
  TensorHandle window_of(const Value* target, const std::vector<Step::Window>& window) const;
  void write_back(const Value* target, const RtValue& value,
                  const std::vector<Step::Window>& window = {});

  // Index checks decided before the first step (check_drawn_indices) and at a kernel's step.
  void check_drawn_indices();
  void check_indices(size_t s, const codegen::Kernel& kernel, const std::vector<RtValue>& inputs);
  void run_step(size_t s);
  const codegen::Kernel* kernel_of(size_t s) const;
  // The step's compiled kernel, storing the writebacks it can into the caller's memory
  // (`stored`: their targets); false when there is none or it could not run.
  bool run_kernel(size_t s, const std::vector<RtValue>& inputs, std::vector<const Value*>& stored);
  // A kernel's output buffers: the caller's memory for each writeback the kernel may store
  // (its target recorded in `stored`), else fresh ones.
  void kernel_buffers(size_t s, const codegen::Kernel& kernel, const std::vector<RtValue>& inputs,
                      std::vector<TensorHandle>& buffers, std::vector<char>& in_caller,
                      std::vector<const Value*>& stored);
  // Binds what the kernel of step s made into env_ (kernel_buffers' buffers, after it ran).
  void bind_kernel_results(size_t s, std::span<const TensorHandle> buffers,
                           std::span<const char> in_caller, std::span<const Value* const> stored);
  // multi_tensor_steps.cpp: the steps of plan.multi_tensor_groups[g] as one multi-tensor
  // kernel, their writebacks included; false, with nothing run, where it cannot (a tensor that
  // is not dense, no kernel).
  bool run_multi_tensor(size_t g);
  // element_copies.cpp: on CUDA, the run of single-element writeback copies from step s as one
  // launch; returns how many steps it ran (0: none, run_step runs step s).
  size_t run_element_copies(size_t s);
  // A group's steps' inputs, buffers, their in_caller flags and stored targets, one after the
  // other (a vector each per step cost hundreds of allocations a call: 50 parameters, +12%).
  struct GroupRun {
    std::vector<RtValue> inputs;
    std::vector<TensorHandle> buffers;
    std::vector<char> in_caller;
    std::vector<const Value*> stored;
    struct Member {
      size_t inputs = 0, buffers = 0, stored = 0;  // where the step's start
    };
    std::vector<Member> members;  // one per step, then one past the last
  };
  GroupRun group_run_;
  void run_eager(size_t s, std::vector<RtValue>& inputs);
  // A step without a kernel: PyTorch's ops (the step runner) or the interpreter; says which
  // ("torch", "interpreted").
  const char* run_without_kernel(size_t s, std::vector<RtValue>& inputs);

  // The trace's outputs, two of them never one fresh tensor.
  std::vector<RtValue> output_values();
  void update_metadata();
  // Whether `value` is a buffer of the program's own (not the caller's), from the caller's
  // allocator where it has one.
  bool ours(const RtTensor& value) const;

  const CompiledProgram& program_;
  const std::vector<RtValue>& args_;
  const ExecuteOptions& options_;
  ExecutionStats* stats_;
  const AliasPattern& pattern_;
  const Trace& trace_;
  const DeviceMemoryOps memory_;
  std::vector<GroupBase> bases_;
  std::vector<RtValue> inputs_;
  // One step's inputs, output buffers, which of those are the caller's memory, and the
  // writeback targets its kernel stored into: arrays kept from step to step (a program of many
  // small steps spent a tenth of its host time allocating them).
  std::vector<RtValue> step_inputs_;
  std::vector<TensorHandle> step_buffers_;
  std::vector<char> step_in_caller_;
  std::vector<char> step_base_in_place_;
  std::vector<const Value*> step_stored_;
  std::vector<const Storage*> caller_storages_;  // sorted (a set's node a tensor cost a malloc)
  bool in_caller_memory(const Storage* s) const {
    return std::binary_search(caller_storages_.begin(), caller_storages_.end(), s);
  }
  std::shared_ptr<const PreparedKernels> prepared_;
  ValueSlots env_;
  std::set<std::pair<size_t, size_t>> checked_first_;  // (step, its kernel's check) decided
  std::set<size_t> torch_indices_checked_;  // steps without a kernel whose indices are known
  // Whether every element of each input is in [negative ? -size : 0, size), read once a call.
  // (input, values it never selects, size, negative)
  std::map<std::tuple<const Value*, std::vector<int64_t>, int64_t, bool>, bool> drawn_in_range_;
  std::map<const Value*, std::vector<int64_t>> drawn_values_;  // each input read once a call
  bool drawn_in_range(const std::vector<DrawnInput>& sources, int64_t size, bool negative);
  bool indices_in_range(size_t s);
};

}  // namespace kiln::detail
