// The executor's multi-tensor groups (plan.h, MultiTensorGroup): a group's steps run by one
// multi-tensor kernel when every tensor they read or write is dense, else one by one.
#include <algorithm>
#include <chrono>
#include <span>

#include "kiln/runtime/cpu/cpu_kernels.h"
#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/kernel_inputs.h"
#include "kiln/runtime/program_run.h"
#include "kiln/support/call_profile.h"

namespace kiln::detail {

// Each step gets its output buffers as its own kernel would (the caller's memory where a
// writeback may be stored there: the group's kernel reads and writes each element as the step's
// kernel does, at the iteration's own element), then one call runs them all, then each step's
// results are bound and its remaining writebacks copied, in step order. Running the steps at
// once is running them in order: group_multi_tensor.h's rule 3.
bool ProgramRun::run_multi_tensor(size_t g) {
  const MultiTensorGroup& group = program_.plan.multi_tensor_groups[g];
  const bool cuda = memory_.cuda();
  const auto& cpu_groups = prepared_->cpu.groups;
  const auto& cuda_groups = prepared_->cuda.groups;
  if (cuda ? g >= cuda_groups.size() || !cuda_groups[g] : g >= cpu_groups.size() || !cpu_groups[g])
    return false;
  const bool timed = call_profile::step_times();
  const auto start =
      timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  // Refused: the scratch arrays run_step expects empty are left so.
  auto refuse = [this] {
    step_inputs_.clear();
    step_stored_.clear();
    return false;
  };
  GroupRun& run = group_run_;
  run.inputs.clear();
  run.buffers.clear();
  run.in_caller.clear();
  run.stored.clear();
  run.members.clear();
  for (size_t k = 0; k < group.count; ++k) {
    const size_t s = group.first + k;
    const Step& step = program_.plan.steps[s];
    const codegen::Kernel* kernel = kernel_of(s);
    if (!kernel || !kernel->index_checks.empty()) return refuse();
    run.members.push_back({run.inputs.size(), run.buffers.size(), run.stored.size()});
    std::vector<RtValue>& inputs = step_inputs_;
    inputs.clear();
    for (const Value* v : step.inputs) {
      inputs.push_back(env_.at(v));
      const auto* t = std::get_if<TensorHandle>(&inputs.back());
      if (t && !dense(**t)) return refuse();
    }
    step_stored_.clear();
    kernel_buffers(s, *kernel, inputs, step_buffers_, step_in_caller_, step_stored_);
    for (const TensorHandle& b : step_buffers_)
      if (!dense(*b)) return refuse();
    run.inputs.insert(run.inputs.end(), inputs.begin(), inputs.end());
    run.buffers.insert(run.buffers.end(), step_buffers_.begin(), step_buffers_.end());
    run.in_caller.insert(run.in_caller.end(), step_in_caller_.begin(), step_in_caller_.end());
    run.stored.insert(run.stored.end(), step_stored_.begin(), step_stored_.end());
  }
  step_inputs_.clear();
  step_stored_.clear();
  run.members.push_back({run.inputs.size(), run.buffers.size(), run.stored.size()});
  auto part = [](const auto& all, size_t from, size_t to) {
    return std::span(all.data() + from, to - from);
  };
  std::vector<MultiTensorMember> args(group.count);
  for (size_t k = 0; k < group.count; ++k) {
    const GroupRun::Member& m = run.members[k];
    const GroupRun::Member& next = run.members[k + 1];
    args[k] = MultiTensorMember{part(run.inputs, m.inputs, next.inputs),
                                part(run.buffers, m.buffers, next.buffers)};
  }
  if (cuda)
    stats_->kernel_steps += cuda::run_cuda_multi_tensor(*cuda_groups[g], args, memory_.stream());
  else
    cpu::run_cpu_multi_tensor(*cpu_groups[g], args), ++stats_->kernel_steps;
  stats_->multi_tensor_steps += static_cast<int>(group.count);
  for (size_t k = 0; k < group.count; ++k) {
    const size_t s = group.first + k;
    const Step& step = program_.plan.steps[s];
    const GroupRun::Member& m = run.members[k];
    const GroupRun::Member& next = run.members[k + 1];
    const std::span<const Value* const> stored = part(run.stored, m.stored, next.stored);
    bind_kernel_results(s, part(run.buffers, m.buffers, next.buffers),
                        part(run.in_caller, m.buffers, next.buffers), stored);
    stats_->writebacks_in_kernel += static_cast<int>(stored.size());
    for (const Step::Writeback& wb : step.writebacks) {
      if (std::find(stored.begin(), stored.end(), wb.target) != stored.end()) continue;
      write_back(wb.target, env_.at(wb.value), wb.window);
      ++stats_->writebacks_copied;
    }
  }
  if (timed)
    stats_->step_times.push_back(
        {static_cast<int>(group.first), "multi-tensor",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
  return true;
}

}  // namespace kiln::detail
