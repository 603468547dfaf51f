// The executor's multi-tensor groups (plan.h, MultiTensorGroup): a group's steps run by one
// multi-tensor kernel when every tensor they read or write is dense, else one by one.
#include <algorithm>
#include <chrono>

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
  std::vector<MultiTensorMemberRun>& members = multi_tensor_members_;
  members.resize(group.count);
  for (size_t k = 0; k < group.count; ++k) {
    const size_t s = group.first + k;
    const Step& step = program_.plan.steps[s];
    const codegen::Kernel* kernel = kernel_of(s);
    if (!kernel || !kernel->index_checks.empty()) return false;
    MultiTensorMemberRun& member = members[k];
    member.inputs.clear();
    member.stored.clear();
    for (const Value* v : step.inputs) {
      member.inputs.push_back(env_.at(v));
      const auto* t = std::get_if<TensorHandle>(&member.inputs.back());
      if (t && !dense(**t)) return false;
    }
    kernel_buffers(s, *kernel, member.inputs, member.buffers, member.in_caller, member.stored);
    for (const TensorHandle& b : member.buffers)
      if (!dense(*b)) return false;
  }
  std::vector<MultiTensorMember> args(group.count);
  for (size_t k = 0; k < group.count; ++k)
    args[k] = MultiTensorMember{&members[k].inputs, &members[k].buffers};
  if (cuda)
    stats_->kernel_steps += cuda::run_cuda_multi_tensor(*cuda_groups[g], args, memory_.stream());
  else
    cpu::run_cpu_multi_tensor(*cpu_groups[g], args), ++stats_->kernel_steps;
  stats_->multi_tensor_steps += static_cast<int>(group.count);
  for (size_t k = 0; k < group.count; ++k) {
    const size_t s = group.first + k;
    const Step& step = program_.plan.steps[s];
    MultiTensorMemberRun& member = members[k];
    bind_kernel_results(s, member.buffers, member.in_caller, member.stored);
    stats_->writebacks_in_kernel += static_cast<int>(member.stored.size());
    for (const Step::Writeback& wb : step.writebacks) {
      if (std::find(member.stored.begin(), member.stored.end(), wb.target) != member.stored.end())
        continue;
      write_back(wb.target, env_.at(wb.value), wb.window);
      ++stats_->writebacks_copied;
    }
    member.inputs.clear();
    member.buffers.clear();
  }
  if (timed)
    stats_->step_times.push_back(
        {static_cast<int>(group.first), "multi-tensor",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
  return true;
}

}  // namespace kiln::detail
