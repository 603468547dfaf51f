#include "kiln/runtime/executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <tuple>

#include "kiln/runtime/cpu/cpu_kernels.h"
#include "kiln/runtime/cuda/cublas.h"
#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/device_memory.h"
#include "kiln/runtime/index_checks.h"
#include "kiln/runtime/interpreter/env.h"
#include "kiln/runtime/interpreter/interpreter.h"
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/runtime/library_step.h"
#include "kiln/runtime/prepared_program.h"
#include "kiln/runtime/program_run.h"
#include "kiln/runtime/store_in_caller.h"
#include "kiln/runtime/value_slots.h"
#include "kiln/support/call_profile.h"
#include "kiln/support/error.h"

namespace kiln {

TensorDescription describe(const RtValue& arg) {
  TensorDescription d;
  const auto* t = std::get_if<TensorHandle>(&arg);
  if (!t) {
    d.is_tensor = false;
    return d;
  }
  const RtTensor& r = **t;
  d.storage = reinterpret_cast<uintptr_t>(r.storage.get());
  d.object = reinterpret_cast<uintptr_t>(&r);
  d.element_size = dtype_size(r.dtype());
  d.dtype = r.dtype();
  d.geometry = Geometry{r.sizes, r.strides, r.offset};
  return d;
}

AliasPattern alias_pattern_of(const std::vector<RtValue>& args) {
  std::vector<TensorDescription> ds;
  for (const RtValue& a : args)
    ds.push_back(describe(a));
  return compute_alias_pattern(ds);
}

namespace {

// An opaque step on CUDA through a library (cuBLAS for the matrix products; library_step.h): the
// views around its one product on the device tensors, the product in the library; its output
// is bound in `env`. False when the library cannot run the step (the step runner then does).
bool run_library_step(const Step& step, const std::vector<RtValue>& inputs,
                      const DeviceMemoryOps& memory, bool any_layout, ValueSlots& env,
                      ExecutionStats& stats) {
  if (step.outputs.size() != 1) return false;
  TensorHandle out = run_library_body(
      step.body, inputs,
      [&memory, &stats, any_layout](const Node& n, const std::vector<RtValue>& operands) {
        cuda::ProductAlignment alignment;
        TensorHandle product = cuda::run_matrix_product(n, operands, memory.allocator(),
                                                        memory.stream(), &alignment, any_layout);
        if (product && alignment.padded) {
          ++stats.aligned_products;
          stats.alignment_copy_bytes += alignment.copy_bytes;
        }
        return product;
      },
      memory.device_copier());
  if (!out) return false;
  env[step.outputs[0]] = out;
  return true;
}

// A step PyTorch or the interpreter runs reads its inputs as eager laid them out (its view()
// needs strides a padded product's result does not have): such a result is copied first.
void with_eager_layouts(const Step& step, const std::set<const Value*>& any_layout,
                        const DeviceMemoryOps& memory, std::vector<RtValue>& inputs) {
  for (size_t j = 0; j < inputs.size(); ++j) {
    const auto* t = std::get_if<TensorHandle>(&inputs[j]);
    if (t && any_layout.contains(step.inputs[j]) && (*t)->storage->on_device() &&
        ((*t)->offset != 0 || (*t)->strides != contiguous_strides((*t)->sizes)))
      inputs[j] = memory.clone_of(**t);
  }
}

// An eager step's inputs laid out as eager handed them to it, where that was a dense
// permutation (a channels-last activation for a convolution: passes/place_layouts.h): one that
// is not so laid out (a program input, a step's result place_layouts left row-major) is copied.
void in_eager_orders(const std::vector<std::vector<int>>& orders, const DeviceMemoryOps& memory,
                     std::vector<RtValue>& inputs) {
  for (size_t j = 0; j < orders.size() && j < inputs.size(); ++j) {
    const auto* t = std::get_if<TensorHandle>(&inputs[j]);
    if (!t || orders[j].empty()) continue;
    const RtTensor& in = **t;
    if (!dense_in_order(in, orders[j]))
      inputs[j] = memory.materialize(
          in, Geometry{in.sizes, strides_in_order(in.sizes, orders[j]), 0}, in.numel());
  }
}

// A step that only views its inputs (the q, k and v an attention reads from one product, a
// weight's gradient that is the transpose of a product) runs no kernel: its views are made on
// the tensors where they are, as the interpreter makes them; a reshape no view expresses is
// copied on the device (under a graph capture, that refuses the capture: the copy's buffer is
// not the graph's). The caller detaches what views the caller's memory, which a later writeback
// may change.
std::vector<RtValue> run_view_step(const Step& step, const std::vector<RtValue>& inputs,
                                   const DeviceMemoryOps& memory, ExecutionCapture* capture) {
  std::optional<DeviceCopyScope> device_copies;
  if (memory.cuda())
    device_copies.emplace([&memory, capture](const RtTensor& t) {
      if (capture) capture->refuse("a reshape that copies its input");
      return memory.device_copier()(t);
    });
  return interpret(step.body, inputs);
}

// A returned view read as the dtype its binding names (view_dtype), else as its storage's.
TensorHandle as_dtype(const TensorHandle& view, const std::optional<DType>& dtype) {
  return dtype ? reinterpret_as(*view, *dtype) : view;
}

// An opaque step that runs a torch op through PyTorch (ops.def, eager_call).
bool is_eager_call(const Step& step) {
  if (step.kind != Step::Kind::kOpaque) return false;
  for (const auto& n : step.body.nodes())
    if (n->id() == OpId::kEagerCall) return true;
  return false;
}

// The device of a call: its tensors' (kiln never mixes devices in one program).
Device device_of(const std::vector<RtValue>& args) {
  for (const RtValue& a : args)
    if (const auto* t = std::get_if<TensorHandle>(&a)) return (*t)->device();
  return Device::cpu();
}

}  // namespace

namespace detail {

ProgramRun::ProgramRun(const CompiledProgram& program, const std::vector<RtValue>& args,
                       const ExecuteOptions& options, ExecutionStats* stats)
    : program_(program),
      args_(args),
      options_(options),
      stats_(stats),
      pattern_(program.pattern),
      trace_(program.execution),
      memory_(device_of(args), options, stats),
      env_(program.execution) {
  KILN_CHECK(args.size() == pattern_.inputs.size())
      << "the program takes " << pattern_.inputs.size() << " arguments but got " << args.size()
      << ".";
  KILN_CHECK(options.pattern_known || alias_pattern_of(args) == pattern_)
      << "the arguments share memory differently from the call the program was compiled for; "
         "compile it for this alias pattern.";
  prepared_ = prepared_kernels(program, memory_.device());
  bind_inputs();
  caller_storages_.reserve(args.size());
  for (const RtValue& a : args)
    if (auto* t = std::get_if<TensorHandle>(&a)) caller_storages_.push_back((*t)->storage.get());
  std::sort(caller_storages_.begin(), caller_storages_.end());
  for (size_t i = 0; i < inputs_.size(); ++i)
    env_[trace_.inputs()[i]] = inputs_[i];
  // An input that is itself an output or a writeback value is read before any writeback runs.
  for (size_t i : prepared_->kept_inputs) {
    const Value* in = trace_.inputs()[i];
    env_[in] = detach(env_.at(in));
  }
}

// The trace's inputs: one per group (the caller's tensor itself, or for a synthetic base the
// storage extent: the caller's memory where no step writes into it and the extent starts the
// storage, else a copy, since the functional trace reads its inputs as they were before any
// writeback), then numbers.
void ProgramRun::bind_inputs() {
  bases_.resize(pattern_.groups.size());
  inputs_.reserve(trace_.inputs().size());
  for (size_t g = 0; g < pattern_.groups.size(); ++g) {
    size_t j = prepared_->group_first_arg[g];
    TensorHandle caller = std::get<TensorHandle>(args_[j]);
    bases_[g].caller = caller;
    bases_[g].start = caller->offset - pattern_.inputs[j].geometry.offset;
    if (pattern_.groups[g].synthetic) {
      TensorHandle extent = make_view(caller, {pattern_.groups[g].numel}, {1}, bases_[g].start);
      // (The trace addresses the base's storage from 0, as_strided's offsets included: a view
      // serves only where the extent starts the caller's storage.)
      bool read_in_place = !prepared_->group_written[g] && bases_[g].start == 0;
      inputs_.emplace_back(read_in_place ? extent : memory_.clone_of(*extent));
    } else {
      inputs_.emplace_back(caller);
    }
  }
  for (size_t j = 0; j < args_.size(); ++j)
    if (pattern_.inputs[j].group < 0) inputs_.push_back(args_[j]);
}

RtValue ProgramRun::detach(RtValue v) const {
  if (auto* t = std::get_if<TensorHandle>(&v))
    if (in_caller_memory((*t)->storage.get())) return RtValue(memory_.clone_of(**t));
  return v;
}

size_t ProgramRun::group_of(const Value* target) const {
  int g = prepared_->group_of_value.at(static_cast<size_t>(target->id()));
  KILN_ASSERT(g >= 0 && trace_.inputs()[static_cast<size_t>(g)] == target)
      << "a writeback into %" << target->name() << ", which is not an input of the program";
  return static_cast<size_t>(g);
}

TensorHandle ProgramRun::destination(const Value* target) const {
  size_t g = group_of(target);
  const GroupBase& base = bases_[g];
  return pattern_.groups[g].synthetic
             ? make_view(base.caller, {pattern_.groups[g].numel}, {1}, base.start)
             : base.caller;
}

TensorHandle ProgramRun::window_of(const Value* target,
                                   const std::vector<Step::Window>& window) const {
  TensorHandle dest = destination(target);
  for (const Step::Window& w : window) {
    if (w.kind == Step::Window::Kind::kAsStrided) {
      // Storage offsets: of the group's storage extent for a synthetic base (its element 0 is
      // the extent's), of the caller's storage otherwise.
      size_t g = group_of(target);
      int64_t origin = pattern_.groups[g].synthetic ? bases_[g].start : 0;
      dest = make_view(bases_[g].caller, w.sizes, w.strides,
                       w.offset ? origin + *w.offset : dest->offset);
      continue;
    }
    auto d = static_cast<size_t>(w.dim);
    Shape sizes = dest->sizes;
    std::vector<int64_t> strides = dest->strides;
    int64_t offset = dest->offset + w.start * strides[d];
    if (w.kind == Step::Window::Kind::kSelect) {
      sizes.erase(sizes.begin() + w.dim);
      strides.erase(strides.begin() + w.dim);
    } else {
      sizes[d] = w.length;
      strides[d] *= w.step;
    }
    dest = make_view(dest, sizes, strides, offset);
  }
  return dest;
}

void ProgramRun::write_back(const Value* target, const RtValue& value,
                            const std::vector<Step::Window>& window) {
  memory_.copy(*window_of(target, window), *std::get<TensorHandle>(value));
}

void ProgramRun::run_whole_trace() {
  if (options_.capture) options_.capture->refuse("a program without a plan");
  std::set<const Value*> wanted(trace_.outputs().begin(), trace_.outputs().end());
  for (const auto& wb : trace_.writebacks)
    wanted.insert(wb.second);
  if (memory_.cuda()) {
    std::map<const Storage*, std::shared_ptr<Storage>> down, up;
    std::vector<RtValue> host_inputs;
    for (const RtValue& v : inputs_)
      host_inputs.push_back(memory_.to_host_value(v, down));
    interpret_observed(trace_, host_inputs, [&](const Value* v, const RtValue& rv) {
      if (wanted.contains(v) && !env_.contains(v))
        env_[v] = detach(memory_.to_device_value(rv, up));
    });
  } else {
    // (The inputs are observed too: those kept are in env_ already, detached once.)
    interpret_observed(trace_, inputs_, [&](const Value* v, const RtValue& rv) {
      if (wanted.contains(v) && !env_.contains(v)) env_[v] = detach(rv);
    });
  }
  for (const auto& [target, value] : trace_.writebacks) {
    write_back(target, env_.at(value));
    ++stats_->writebacks_copied;
  }
}

// The steps in plan order, each writeback when its step says: a region that stores into an input
// does it as it runs, so a later step reading that input would see the new data — exactly what
// place_writebacks must rule out. A fusion step runs as its compiled kernel when it has one
// (cpu_kernels.h, cuda_kernels.h), else through PyTorch or in the interpreter.
void ProgramRun::run_plan() {
  check_drawn_indices();
  const std::vector<MultiTensorGroup>& groups = program_.plan.multi_tensor_groups;
  size_t g = 0;
  for (size_t s = 0; s < program_.plan.steps.size(); ++s) {
    if (g < groups.size() && groups[g].first == s && run_multi_tensor(g++)) {
      s += groups[g - 1].count - 1;
      continue;
    }
    if (memory_.cuda() && program_.plan.steps[s].kind == Step::Kind::kCopy) {
      if (const size_t copied = run_element_copies(s)) {
        s += copied - 1;
        continue;
      }
    }
    run_step(s);
  }
}

// An index the program draws from its inputs (IndexCheck::drawn_from: token ids, a language
// model's labels masked where they are ignored) is in range when every element of those inputs
// is: one read of each before the first step decides its kernels' checks, and those of the index
// ops PyTorch runs in steps without a kernel, instead of a read at each (on CUDA a
// synchronization in the middle of the program, which leaves the device idle until the host has
// queued the next kernels). Where an input holds a value out of range (one the index may never
// select), the check stays with its step, exact. A capture defers every check to the replay
// instead. Inputs past kMostElementsReadFirst elements are left to the steps, which read only the
// index (a large table a few positions are drawn from would cost more to copy to the host than
// the synchronization it saves).
void ProgramRun::check_drawn_indices() {
  if (options_.capture) return;
  for (size_t s = 0; s < program_.plan.steps.size(); ++s) {
    const Step& step = program_.plan.steps[s];
    const codegen::Kernel* kernel = kernel_of(s);
    if (!kernel) {
      if (step.kind == Step::Kind::kFusion && options_.step_runner && indices_in_range(s))
        torch_indices_checked_.insert(s);
      continue;
    }
    for (size_t k = 0; k < kernel->index_checks.size(); ++k) {
      const codegen::IndexCheck& c = kernel->index_checks[k];
      if (c.drawn_from.empty() || !drawn_in_range(c.drawn_from, c.size, c.negative)) continue;
      checked_first_.insert({s, k});
      ++stats_->index_checks_first;
    }
  }
}

bool ProgramRun::drawn_in_range(const std::vector<DrawnInput>& sources, int64_t size,
                                bool negative) {
  constexpr int64_t kMostElementsReadFirst = int64_t{1} << 16;  // 512 KiB of int64 ids
  bool all = true;
  for (const DrawnInput& source : sources) {
    auto key = std::make_tuple(source.input, source.never_selected, size, negative);
    auto it = drawn_in_range_.find(key);
    if (it == drawn_in_range_.end()) {
      const auto* t = std::get_if<TensorHandle>(&env_.at(source.input));
      bool ok = t && (*t)->numel() <= kMostElementsReadFirst;
      if (ok) {
        codegen::IndexCheck whole;
        whole.size = size;
        whole.negative = negative;
        whole.never_selected = source.never_selected;
        // One read of an input however many checks it decides (a language model's token ids
        // are its labels too: one synchronization, not two).
        auto values = drawn_values_.find(source.input);
        if (values == drawn_values_.end())
          values = drawn_values_.emplace(source.input, index_values(**t)).first;
        ok = !first_index_out_of_range(whole, values->second);
      }
      it = drawn_in_range_.emplace(key, ok).first;
    }
    all = all && it->second;
  }
  return all;
}

// A step PyTorch runs op by op (an index write with more positions than a kernel scans: an
// embedding's gradient) checks each index on the host before its op (a synchronization on CUDA)
// unless every index is known in range (PreparedKernels::runner_index_checks), here by a read of
// the inputs it is drawn from.
bool ProgramRun::indices_in_range(size_t s) {
  const std::optional<std::vector<codegen::IndexCheck>>& checks = prepared_->runner_index_checks[s];
  if (!checks) return false;
  for (const codegen::IndexCheck& c : *checks)
    if (!drawn_in_range(c.drawn_from, c.size, c.negative)) return false;
  stats_->index_checks_first += static_cast<int>(checks->size());
  return true;
}

// Kernel::index_checks: every index a kernel uses is inside its dim before the kernel runs, so
// an index out of range is an error that leaves every tensor as it was before the step. While a
// call is captured the capture makes the checks before each replay.
void ProgramRun::check_indices(size_t s, const codegen::Kernel& kernel,
                               const std::vector<RtValue>& inputs) {
  for (size_t k = 0; k < kernel.index_checks.size(); ++k) {
    if (checked_first_.contains({s, k})) continue;
    const codegen::IndexCheck& c = kernel.index_checks[k];
    const TensorHandle& t = std::get<TensorHandle>(inputs.at(static_cast<size_t>(c.input)));
    if (options_.capture) {
      options_.capture->defer_index_check(c, t);
    } else {
      check_index_values(c, *t);
      ++stats_->index_checks_at_steps;
    }
  }
}

void ProgramRun::run_step(size_t s) {
  const Step& step = program_.plan.steps[s];
  const bool timed = call_profile::step_times();
  const auto start =
      timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  const char* how = "copy";
  std::vector<const Value*>& stored = step_stored_;  // writeback targets the kernel stored into
  auto was_stored = [&stored](const Value* target) {
    return std::find(stored.begin(), stored.end(), target) != stored.end();
  };
  if (step.kind != Step::Kind::kCopy) {
    std::vector<RtValue>& inputs = step_inputs_;
    for (const Value* v : step.inputs)
      inputs.push_back(env_.at(v));
    if (is_eager_call(step)) {
      run_eager(s, inputs);
      ++stats_->eager_steps;
      how = "eager";
    } else if (run_kernel(s, inputs, stored)) {
      ++stats_->kernel_steps;
      stats_->writebacks_in_kernel += static_cast<int>(stored.size());
      how = "kernel";
    } else if (memory_.cuda() && step.kind == Step::Kind::kOpaque &&
               run_library_step(step, inputs, memory_,
                                prepared_->any_layout.contains(step.outputs.at(0)), env_,
                                *stats_)) {
      ++stats_->library_steps;
      how = "library";
      if (options_.capture) {
        std::vector<RtValue> outputs;
        for (const Value* v : step.outputs)
          if (env_.contains(v)) outputs.push_back(env_.at(v));
        options_.capture->note_foreign_step(inputs, outputs);
      }
    } else if (only_views(step.body)) {
      std::vector<RtValue> outs = run_view_step(step, inputs, memory_, options_.capture);
      for (size_t k = 0; k < outs.size(); ++k)
        env_[step.outputs[k]] = detach(outs[k]);
      ++stats_->view_steps;
      how = "view";
    } else {
      how = run_without_kernel(s, inputs);
    }
  }
  for (const Step::Writeback& wb : step.writebacks) {
    if (was_stored(wb.target)) continue;
    write_back(wb.target, env_.at(wb.value), wb.window);
    ++stats_->writebacks_copied;
  }
  step_inputs_.clear();
  step_stored_.clear();
  if (timed)
    stats_->step_times.push_back(
        {static_cast<int>(s), how,
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
}

const codegen::Kernel* ProgramRun::kernel_of(size_t s) const {
  if (memory_.cuda()) {
    const cuda::CudaPlanKernels& kernels = prepared_->cuda;
    return s < kernels.steps.size() && kernels.steps[s] ? &kernels.steps[s]->kernel : nullptr;
  }
  const cpu::PlanKernels& kernels = prepared_->cpu;
  return s < kernels.steps.size() && kernels.steps[s] ? &kernels.steps[s]->kernel : nullptr;
}

bool ProgramRun::run_kernel(size_t s, const std::vector<RtValue>& inputs,
                            std::vector<const Value*>& stored) {
  const codegen::Kernel* kernel = kernel_of(s);
  if (!kernel) return false;
  check_indices(s, *kernel, inputs);
  kernel_buffers(s, *kernel, inputs, step_buffers_, step_in_caller_, stored);
  bool ran = memory_.cuda()
                 ? cuda::run_cuda_kernel(*prepared_->cuda.steps[s], inputs, step_buffers_,
                                         memory_.stream(), memory_.allocator())
                 : cpu::run_cpu_kernel(*prepared_->cpu.steps[s], inputs, step_buffers_);
  if (!ran) {
    stored.clear();
    return false;
  }
  bind_kernel_results(s, step_buffers_, step_in_caller_, stored);
  return true;
}

void ProgramRun::kernel_buffers(size_t s, const codegen::Kernel& kernel,
                                const std::vector<RtValue>& inputs,
                                std::vector<TensorHandle>& buffers, std::vector<char>& in_caller,
                                std::vector<const Value*>& stored) {
  const Step& step = program_.plan.steps[s];
  buffers.assign(step.outputs.size(), nullptr);
  in_caller.assign(step.outputs.size(), false);
  // Whether an output with a base (a scatter nest) runs on the base's own memory: decided once,
  // with the destination, and read again below to skip the fill.
  step_base_in_place_.assign(step.outputs.size(), false);
  for (const Step::Writeback& wb : step.writebacks) {
    size_t j = 0;
    while (j < step.outputs.size() && (step.outputs[j] != wb.value || buffers[j]))
      ++j;
    if (j == step.outputs.size()) continue;
    TensorHandle dest = window_of(wb.target, wb.window);
    if (!can_store_in_kernel(kernel, j, *dest, inputs)) continue;
    if (const int base = kernel.outputs[j].base; base >= 0) {
      const BaseFill fill =
          base_fill(*dest, *std::get<TensorHandle>(inputs.at(static_cast<size_t>(base))));
      if (fill == BaseFill::kRefuse) continue;
      step_base_in_place_[j] = fill == BaseFill::kInPlace;
    }
    buffers[j] = dest;
    in_caller[j] = true;
    stored.push_back(wb.target);
  }
  for (size_t j = 0; j < buffers.size(); ++j) {
    const codegen::KernelOutput& o = kernel.outputs[j];
    if (!buffers[j]) {
      auto padded = prepared_->padded_rows.find(step.outputs[j]);
      if (padded != prepared_->padded_rows.end())
        buffers[j] = memory_.empty_padded_rows(o.dtype, o.shape, padded->second);
      else if (j < step.output_orders.size() && !step.output_orders[j].empty())
        buffers[j] = memory_.empty_in_order(o.dtype, o.shape, step.output_orders[j]);
      else
        buffers[j] = memory_.empty(o.dtype, o.shape);
    }
    // A kernel storing only some elements (a scatter nest): the others are the base's, in place
    // or copied in first.
    if (o.base >= 0 && !step_base_in_place_[j])
      memory_.copy(*buffers[j], *std::get<TensorHandle>(inputs.at(static_cast<size_t>(o.base))));
  }
}

void ProgramRun::bind_kernel_results(size_t s, std::span<const TensorHandle> buffers,
                                     std::span<const char> in_caller,
                                     std::span<const Value* const> stored) {
  const Step& step = program_.plan.steps[s];
  // Values read after the step that makes them: a value a kernel stored only into the caller's
  // memory is bound (copied out of it) when, and only when, it is one of these, or written back
  // by a copy after all.
  auto bound = [&](const Value* v) {
    if (prepared_->read_later.contains(v)) return true;
    for (const Step::Writeback& wb : step.writebacks)
      if (wb.value == v && std::find(stored.begin(), stored.end(), wb.target) == stored.end())
        return true;
    return false;
  };
  // A value read where the kernel stored it has the layout of a fresh buffer there (a view at
  // an offset would move the storage offsets as_strided reads at).
  auto as_fresh = [](const RtTensor& t) {
    return t.offset == 0 && t.strides == contiguous_strides(t.sizes);
  };
  for (size_t j = 0; j < buffers.size(); ++j) {
    const Value* v = step.outputs[j];
    if (!in_caller[j] ||
        (bound(v) && prepared_->stays_in_caller.contains(v) && as_fresh(*buffers[j])))
      env_[v] = buffers[j];
    else if (bound(v))
      env_[v] = detach(buffers[j]);
  }
}

// PyTorch runs it, on the tensors where they are (device memory included): the interpreter only
// hands them to the registered function (eager_calls.h), after the views it reads through (a
// reshape no view expresses copies on the device).
void ProgramRun::run_eager(size_t s, std::vector<RtValue>& inputs) {
  const Step& step = program_.plan.steps[s];
  with_eager_layouts(step, prepared_->any_layout, memory_, inputs);
  in_eager_orders(step.input_orders, memory_, inputs);
  if (options_.capture) options_.capture->admit_eager_step(step.body, inputs);
  std::optional<DeviceCopyScope> device_copies;
  if (memory_.cuda()) device_copies.emplace(memory_.device_copier());
  std::vector<RtValue> outs = interpret(step.body, inputs);
  for (size_t k = 0; k < outs.size(); ++k) {
    const auto* t = std::get_if<TensorHandle>(&outs[k]);
    if (options_.capture && t && !(*t)->storage->on_device())
      options_.capture->refuse("a step PyTorch runs returned a tensor in host memory");
    env_[step.outputs[k]] = outs[k];
  }
  if (options_.capture) options_.capture->note_foreign_step(inputs, outs);
}

const char* ProgramRun::run_without_kernel(size_t s, std::vector<RtValue>& inputs) {
  const Step& step = program_.plan.steps[s];
  if (options_.capture) options_.capture->refuse("a step without a kernel");
  // PyTorch's ops or the interpreter: both read eager's layouts (a channels-last activation
  // place_layouts laid out is row-major in eager: a view() of it may need that).
  with_eager_layouts(step, prepared_->any_layout, memory_, inputs);
  for (size_t j = 0; j < inputs.size(); ++j)
    if (const auto* t = std::get_if<TensorHandle>(&inputs[j]);
        t && prepared_->laid_out.contains(step.inputs[j]) && !dense(**t))
      inputs[j] = memory_.clone_of(**t);
  if (options_.step_runner) {
    ++stats_->torch_steps;
    std::vector<RtValue> outs =
        (*options_.step_runner)(step.body, inputs, torch_indices_checked_.contains(s));
    for (size_t k = 0; k < outs.size(); ++k)
      env_[step.outputs[k]] = outs[k];
    return "torch";
  }
  ++stats_->interpreted_steps;
  std::vector<RtValue> outs = memory_.interpret_step(step.body, inputs, *stats_);
  for (size_t k = 0; k < outs.size(); ++k)
    env_[step.outputs[k]] = detach(outs[k]);
  return "interpreted";
}

std::vector<RtValue> ProgramRun::output_values() {
  std::vector<RtValue> values;
  std::set<const RtTensor*> returned;
  for (const Value* o : trace_.outputs()) {
    RtValue v = detach(env_.at(o));
    if (auto* t = std::get_if<TensorHandle>(&v))
      if (!returned.insert(t->get()).second) v = memory_.clone_of(**t);
    values.push_back(v);
  }
  return values;
}

// Metadata mutations of the caller's tensor objects.
void ProgramRun::update_metadata() {
  for (const MetadataUpdate& m : program_.interface.metadata) {
    TensorHandle t = std::get<TensorHandle>(args_[static_cast<size_t>(m.arg)]);
    const GroupBase& base =
        bases_[static_cast<size_t>(pattern_.inputs[static_cast<size_t>(m.arg)].group)];
    t->sizes = m.geometry.sizes;
    t->strides = m.geometry.strides;
    t->offset = base.start + m.geometry.offset;
  }
}

bool ProgramRun::ours(const RtTensor& value) const {
  return (!options_.allocator || value.storage->from_allocator) &&
         !in_caller_memory(value.storage.get());
}

// What the caller gets back, as the interface's return bindings say.
std::vector<RtValue> ProgramRun::results() {
  const std::vector<RtValue> values = output_values();
  update_metadata();
  std::vector<RtValue> results;
  std::set<const RtTensor*> handed_out;        // fresh tensors returned as they are
  std::set<const Storage*> visible_storages;   // the storages of those the caller sees
  std::map<int, TensorHandle> fresh_storages;  // kFreshView: one buffer per shared storage
  // Whether `value` can be handed to the caller as it is, laid out as `g` in a storage of
  // `numel` elements: a buffer of the program's own in that very layout. (Results that are
  // views of one value share its storage, as eager's views of one tensor do: a forward's saved
  // q, k and v.)
  auto hand_out_as_is = [&](const RtTensor& value, const Geometry& g, int64_t numel) {
    return ours(value) && value.sizes == g.sizes && value.strides == g.strides &&
           value.offset == g.offset && value.storage->numel() == numel;
  };
  for (const ReturnBinding& r : program_.interface.returns) {
    switch (r.kind) {
      case ReturnBinding::Kind::kFreshView: {
        TensorHandle& buffer = fresh_storages[r.index];
        if (!buffer) {
          const auto& value = std::get<TensorHandle>(values.at(static_cast<size_t>(r.index)));
          // The storage's value in its own buffer (a kernel's output, usually) is that buffer,
          // unless another result already holds it (two fresh storages are two buffers).
          if (hand_out_as_is(*value, r.storage_geometry, r.storage_numel) &&
              !visible_storages.contains(value->storage.get())) {
            buffer = value;
            visible_storages.insert(value->storage.get());
          } else {
            buffer = memory_.materialize(*value, r.storage_geometry, r.storage_numel);
          }
        }
        results.emplace_back(as_dtype(
            make_view(buffer, r.geometry.sizes, r.geometry.strides, r.geometry.offset), r.dtype));
        break;
      }
      case ReturnBinding::Kind::kValue: {
        const RtValue& v = values.at(static_cast<size_t>(r.index));
        const auto* t = std::get_if<TensorHandle>(&v);
        if (!t) {
          results.push_back(v);
          break;
        }
        // A fresh tensor, laid out as eager lays it out (its strides are visible to the caller).
        // The value itself when it already is one (a kernel's output buffer, usually), else a
        // copy. A layout with repeated elements (stride 0) is legal here: every copy gets the
        // same value.
        const RtTensor& value = **t;
        // A value saved for the backward in the memory of a result the caller sees would change
        // with the caller's in-place writes to that result (its version counter is not the
        // saved tensor's): such a one is copied. (The saved results follow the caller's, so
        // visible_storages is complete by then.)
        bool as_it_is = r.any_layout
                            ? ours(value) && !visible_storages.contains(value.storage.get())
                            : hand_out_as_is(value, r.geometry, r.storage_numel);
        if (as_it_is && handed_out.insert(t->get()).second) {
          if (!r.any_layout) visible_storages.insert(value.storage.get());
          results.push_back(v);
          break;
        }
        results.emplace_back(memory_.materialize(value, r.geometry, r.storage_numel));
        break;
      }
      case ReturnBinding::Kind::kInputObject:
        results.push_back(args_.at(static_cast<size_t>(r.index)));
        break;
      case ReturnBinding::Kind::kInputView: {
        const GroupBase& base = bases_.at(static_cast<size_t>(r.index));
        results.emplace_back(as_dtype(make_view(base.caller, r.geometry.sizes, r.geometry.strides,
                                                base.start + r.geometry.offset),
                                      r.dtype));
        break;
      }
    }
  }
  return results;
}

}  // namespace detail

std::vector<RtValue> execute(const CompiledProgram& program, const std::vector<RtValue>& args,
                             const ExecuteOptions& options) {
  call_profile::Scope timed(call_profile::Phase::kExecute);
  ExecutionStats local;
  detail::ProgramRun run(program, args, options, options.stats ? options.stats : &local);
  if (run.has_plan())
    run.run_plan();
  else
    run.run_whole_trace();
  return run.results();
}

}  // namespace kiln
