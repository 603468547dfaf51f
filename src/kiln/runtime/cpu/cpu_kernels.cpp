#include "kiln/runtime/cpu/cpu_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kiln/runtime/interpreter/env.h"
#include "kiln/runtime/kernel_inputs.h"
#include "kiln/support/dump.h"
#include "kiln/support/error.h"

namespace kiln::cpu {

bool cpu_kernels_enabled() {
  const char* v = std::getenv("KILN_CPU_KERNELS");
  if (!v || !*v) return kCpuKernelsByDefault;
  return std::strcmp(v, "0") != 0;
}

PlanKernels prepare_cpu_kernels(const ExecutionPlan& plan, KernelCache& cache) {
  PlanKernels pk;
  pk.steps.resize(plan.steps.size());
  pk.why_not.resize(plan.steps.size());
  std::vector<const std::string*> sources;
  std::vector<size_t> at;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const Step& step = plan.steps[s];
    if (step.kind != Step::Kind::kFusion) continue;
    codegen::KernelLowering lowered = codegen::lower_kernel(step, codegen::Target::kCpu);
    if (!lowered.kernel) {
      pk.why_not[s] = lowered.why_not;
      dump("kernels", "step" + std::to_string(s) + "-not-lowered.txt", lowered.why_not + "\n");
      continue;
    }
    dump("kernels", "step" + std::to_string(s) + ".cpp", lowered.kernel->source);
    pk.steps[s] = StepKernel{std::move(*lowered.kernel), nullptr};
    at.push_back(s);
  }
  for (size_t s : at)
    sources.push_back(&pk.steps[s]->kernel.source);
  // The groups whose steps all have kernels (a step's own is the fallback).
  pk.groups.resize(plan.multi_tensor_groups.size());
  std::vector<size_t> groups_at;
  for (size_t g = 0; g < plan.multi_tensor_groups.size(); ++g) {
    const MultiTensorGroup& group = plan.multi_tensor_groups[g];
    bool all = true;
    for (size_t s = group.first; s < group.first + group.count; ++s)
      all = all && pk.steps[s].has_value();
    if (!all || group_elements(plan, group) < codegen::kCpuMultiTensorElements) continue;
    codegen::MultiTensorLowering lowered =
        codegen::lower_multi_tensor(plan.steps[group.first], codegen::Target::kCpu);
    if (!lowered.kernel) {
      dump("kernels", "group" + std::to_string(g) + "-not-lowered.txt", lowered.why_not + "\n");
      continue;
    }
    dump("kernels", "group" + std::to_string(g) + ".cpp", lowered.kernel->source);
    pk.groups[g] = MultiTensorStepKernel{std::move(*lowered.kernel), nullptr};
    groups_at.push_back(g);
  }
  for (size_t g : groups_at)
    sources.push_back(&pk.groups[g]->kernel.source);
  if (sources.empty()) return pk;
  std::vector<codegen::CpuKernelFn> fns = cache.get(sources);
  for (size_t i = 0; i < at.size(); ++i)
    pk.steps[at[i]]->fn = fns[i];
  for (size_t i = 0; i < groups_at.size(); ++i)
    pk.groups[groups_at[i]]->fn = fns[at.size() + i];
  return pk;
}

void warm_cpu_kernels(const std::vector<const ExecutionPlan*>& plans, KernelCache& cache) {
  std::vector<std::string> sources;
  for (const ExecutionPlan* plan : plans)
    for (const Step& step : plan->steps) {
      if (step.kind != Step::Kind::kFusion) continue;
      codegen::KernelLowering lowered = codegen::lower_kernel(step, codegen::Target::kCpu);
      if (lowered.kernel) sources.push_back(std::move(lowered.kernel->source));
    }
  for (const ExecutionPlan* plan : plans)
    for (const MultiTensorGroup& group : plan->multi_tensor_groups) {
      if (group_elements(*plan, group) < codegen::kCpuMultiTensorElements) continue;
      codegen::MultiTensorLowering lowered =
          codegen::lower_multi_tensor(plan->steps[group.first], codegen::Target::kCpu);
      if (lowered.kernel) sources.push_back(std::move(lowered.kernel->source));
    }
  std::vector<const std::string*> refs;
  for (const std::string& s : sources)
    refs.push_back(&s);
  if (!refs.empty()) cache.warm(refs);
}

namespace {

void* data_of(const RtTensor& t) {
  return t.storage->numel() == 0 ? nullptr : t.storage->data();
}

void append_layout(const RtTensor& t, std::vector<int64_t>& meta) {
  meta.push_back(t.offset);
  meta.insert(meta.end(), t.strides.begin(), t.strides.end());
}

}  // namespace

bool run_cpu_kernel(const StepKernel& k, const std::vector<RtValue>& inputs,
                    const std::vector<TensorHandle>& outputs) {
  const codegen::Kernel& kernel = k.kernel;
  KILN_ASSERT(inputs.size() == kernel.inputs.size() && outputs.size() == kernel.outputs.size())
      << "a CPU kernel called with " << inputs.size() << " inputs and " << outputs.size()
      << " outputs";
  // The argument arrays are this thread's, reused from call to call: six vectors a kernel were
  // six allocations, a tenth of an optimizer step's host time over 50 parameters. (A kernel
  // function never calls back into kiln, so one set of arrays a thread is enough.)
  thread_local struct {
    std::vector<void*> ins, outs;
    std::vector<int64_t> in_meta, out_meta, si;
    std::vector<double> sd;
  } args;
  auto& [ins, outs, in_meta, out_meta, si, sd] = args;
  ins.assign(inputs.size(), nullptr);
  in_meta.clear();
  sd.assign(inputs.size(), 0);
  si.assign(inputs.size(), 0);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (kernel.inputs[i].is_tensor) {
      const RtTensor& t = *std::get<TensorHandle>(inputs[i]);
      KILN_ASSERT(static_cast<int64_t>(in_meta.size()) == kernel.inputs[i].meta)
          << "kernel input layout";
      if (!kernel_can_read(kernel.inputs[i], t)) return false;
      ins[i] = data_of(t);
      append_layout(t, in_meta);
    } else {
      const RtScalar& s = std::get<RtScalar>(inputs[i]);
      sd[i] = scalar_to_double(s);
      si[i] = scalar_to_int(s);
    }
  }
  outs.assign(outputs.size(), nullptr);
  out_meta.clear();
  for (size_t j = 0; j < outputs.size(); ++j) {
    const RtTensor& t = *outputs[j];
    KILN_ASSERT(t.dtype() == kernel.outputs[j].dtype && t.sizes == kernel.outputs[j].shape)
        << "a CPU kernel output buffer of the wrong type";
    outs[j] = data_of(t);
    append_layout(t, out_meta);
  }
  KILN_ASSERT(static_cast<int64_t>(out_meta.size()) == kernel.extents_meta)
      << "kernel output layout";
  out_meta.insert(out_meta.end(), kernel.extents.begin(), kernel.extents.end());
  k.fn(ins.data(), in_meta.data(), sd.data(), si.data(), outs.data(), out_meta.data());
  return true;
}

void run_cpu_multi_tensor(const MultiTensorStepKernel& k,
                          const std::vector<MultiTensorMember>& members) {
  const codegen::MultiTensorKernel& kernel = k.kernel;
  const size_t ni = kernel.input_is_tensor.size(), no = kernel.output_dtypes.size();
  thread_local struct {
    std::vector<void*> ins, outs;
    std::vector<int64_t> in_meta, si;
    std::vector<double> sd;
  } args;
  auto& [ins, outs, in_meta, si, sd] = args;
  ins.assign(members.size() * ni, nullptr);
  outs.assign(members.size() * no, nullptr);
  sd.assign(members.size() * ni, 0);
  si.assign(members.size() * ni, 0);
  in_meta.assign(1 + members.size(), 0);
  in_meta[0] = static_cast<int64_t>(members.size());
  auto first_element = [](const RtTensor& t) -> void* {
    return t.numel() == 0
               ? nullptr
               : reinterpret_cast<char*>(t.storage->data()) + t.offset * dtype_size(t.dtype());
  };
  for (size_t m = 0; m < members.size(); ++m) {
    const std::span<const RtValue> inputs = members[m].inputs;
    const std::span<const TensorHandle> outputs = members[m].outputs;
    KILN_ASSERT(inputs.size() == ni && outputs.size() == no && !outputs.empty())
        << "a multi-tensor member with " << inputs.size() << " inputs and " << outputs.size()
        << " outputs";
    in_meta[1 + m] = codegen::multi_tensor_member_numel(kernel, outputs);
    for (size_t i = 0; i < ni; ++i) {
      if (kernel.input_is_tensor[i]) {
        const RtTensor& t = *std::get<TensorHandle>(inputs[i]);
        const int64_t elements = kernel.input_is_scalar[i] ? 1 : in_meta[1 + m];
        KILN_ASSERT(dense(t) && t.numel() == elements && t.dtype() == kernel.input_dtypes[i])
            << "a multi-tensor member's input is not dense or not of its size";
        ins[m * ni + i] = first_element(t);
      } else {
        const RtScalar& s = std::get<RtScalar>(inputs[i]);
        sd[m * ni + i] = scalar_to_double(s);
        si[m * ni + i] = scalar_to_int(s);
      }
    }
    for (size_t j = 0; j < no; ++j) {
      const RtTensor& t = *outputs[j];
      const int64_t elements = kernel.output_is_scalar[j] ? 1 : in_meta[1 + m];
      KILN_ASSERT(dense(t) && t.numel() == elements && t.dtype() == kernel.output_dtypes[j])
          << "a multi-tensor member's output buffer is not dense or not of its size";
      outs[m * no + j] = first_element(t);
    }
  }
  const int64_t unused_out_meta = 0;
  k.fn(ins.data(), in_meta.data(), sd.data(), si.data(), outs.data(), &unused_out_meta);
}

}  // namespace kiln::cpu
