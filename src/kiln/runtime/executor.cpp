#include "kiln/runtime/executor.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "kiln/runtime/cpu/cpu_kernels.h"
#include "kiln/runtime/cuda/cublas.h"
#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/interpreter/env.h"
#include "kiln/runtime/interpreter/interpreter.h"
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/runtime/library_step.h"
#include "kiln/runtime/prepared_program.h"
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

// Where each group's base starts in its caller storage.
struct GroupBase {
  TensorHandle caller;  // a caller tensor of the group
  int64_t start = 0;    // storage index of the base's element 0
};

// Elements [first, last] of the storage a tensor can touch (strides are non-negative here).
std::pair<int64_t, int64_t> element_range(const RtTensor& t) {
  int64_t last = t.offset;
  for (size_t d = 0; d < t.sizes.size(); ++d)
    last += (t.sizes[d] - 1) * t.strides[d];
  return {t.offset, last};
}
bool disjoint(const RtTensor& a, const RtTensor& b) {
  if (a.storage != b.storage || a.numel() == 0 || b.numel() == 0) return true;
  auto [a0, a1] = element_range(a);
  auto [b0, b1] = element_range(b);
  return a1 < b0 || b1 < a0;
}
// No two elements share an address (every stride passes the reach of the smaller dims).
bool injective(const RtTensor& t) {
  if (t.numel() == 0) return true;
  std::vector<size_t> dims;
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] <= 1) continue;
    if (t.strides[d] <= 0) return false;
    dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end(),
            [&](size_t a, size_t b) { return t.strides[a] < t.strides[b]; });
  int64_t reach = 0;
  for (size_t d : dims) {
    if (t.strides[d] <= reach) return false;
    reach += (t.sizes[d] - 1) * t.strides[d];
  }
  return true;
}

// Whether every element of `inner` is the element of `outer` at the same index, and `outer` has
// no two elements at one address.
bool addresses_within(const RtTensor& inner, const RtTensor& outer) {
  if (inner.storage != outer.storage || inner.sizes.size() != outer.sizes.size() ||
      inner.offset != outer.offset || !injective(outer))
    return false;
  for (size_t d = 0; d < inner.sizes.size(); ++d) {
    if (inner.sizes[d] > outer.sizes[d]) return false;
    if (outer.sizes[d] > 1 && inner.strides[d] != outer.strides[d]) return false;
  }
  return true;
}

// Whether output `j` of the kernel may be stored straight into `dest`, the caller's memory of a
// writeback (DESIGN.md 4). place_writebacks decided the step may do it; this checks it again on
// the real tensors and on the loads the kernel actually makes: `dest` has the output's dtype and
// shape and no repeated elements, the output is stored by the kernel's last loop nest (after every
// other nest read the old contents), and every input that shares bytes with `dest` is read there
// only at the very element the same iteration stores. Otherwise the executor copies the value
// into `dest` after the kernel, as it does for an interpreted step.
bool can_store_in_kernel(const codegen::Kernel& kernel, size_t j, const RtTensor& dest,
                         const std::vector<RtValue>& inputs) {
  const codegen::KernelOutput& out = kernel.outputs[j];
  if (!out.in_last_nest || dest.dtype() != out.dtype || dest.sizes != out.shape) return false;
  if (!injective(dest)) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const codegen::KernelInput& in = kernel.inputs[i];
    if (!in.is_tensor) continue;
    const RtTensor& t = *std::get<TensorHandle>(inputs[i]);
    if (t.storage != dest.storage) continue;
    switch (in.last_nest_loads) {
      case codegen::KernelInput::Loads::kNone:
        continue;
      case codegen::KernelInput::Loads::kIdentity:
        if ((t.sizes == dest.sizes && t.strides == dest.strides && t.offset == dest.offset) ||
            disjoint(t, dest))
          continue;
        return false;
      case codegen::KernelInput::Loads::kIdentityOrGuarded:
        // The plan placed this store in the kernel: its same-index rule covers the loads under
        // a scatter's condition, for the target tensor itself.
        if ((t.sizes == dest.sizes && t.strides == dest.strides && t.offset == dest.offset) ||
            disjoint(t, dest))
          continue;
        return false;
      case codegen::KernelInput::Loads::kRowLocal:
        // Loads at the stored element or anywhere in its row before the row stores (kernel.h):
        // safe where `t` addresses its elements exactly as `dest` does (one offset, one stride
        // wherever `t` has more than one element, `dest` inside `t`'s sizes) and no two elements
        // of `t` share an address, so that other rows' stores miss every element of this row.
        if (disjoint(t, dest) || addresses_within(dest, t)) continue;
        return false;
      case codegen::KernelInput::Loads::kOther:
        if (in.windows.empty() && disjoint(t, dest)) continue;
        return false;
    }
  }
  return true;
}

// The memory operations of one execute call on its device: the interpreter's for CPU tensors,
// the CUDA runtime's for CUDA tensors. A step that has no CUDA kernel runs in the interpreter on
// host copies of its inputs (each device storage copied down once per step), and its results
// are copied up.
class DeviceMemoryOps {
 public:
  DeviceMemoryOps(Device device, const ExecuteOptions& options, ExecutionStats* stats)
      : device_(device), allocator_(options.allocator), stream_(options.stream), stats_(stats) {}
  bool cuda() const { return device_.kind == Device::Kind::kCuda; }
  Device device() const { return device_; }
  void* stream() const { return stream_; }
  Allocator* allocator() const { return allocator_; }

  TensorHandle clone_of(const RtTensor& t) const {
    count_copy(t);
    return uncounted_clone(t);
  }
  TensorHandle uncounted_clone(const RtTensor& t) const {
    if (cuda()) return cuda::cuda_clone(t, stream_, allocator_);
    TensorHandle out =
        host_tensor(t.dtype(), t.sizes, contiguous_strides(t.sizes), 0, t.numel(), false);
    copy_into(*out, t);
    return out;
  }
  // A clone as a function, for the interpreter's views of device tensors (DeviceCopyScope).
  std::function<TensorHandle(const RtTensor&)> device_copier() const {
    return [this](const RtTensor& t) { return uncounted_clone(t); };
  }
  void copy(RtTensor& dst, const RtTensor& src) const {
    if (cuda())
      cuda::cuda_copy_into(dst, src, stream_);
    else
      copy_into(dst, src);  // (eager's error for a dst with repeated elements, else by rows)
  }
  TensorHandle empty(DType dtype, const Shape& shape) const {
    call_profile::Scope timed(call_profile::Phase::kAllocate);
    if (cuda())
      return cuda::cuda_strided(dtype, shape, contiguous_strides(shape), 0, shape_numel(shape),
                                device_, false, allocator_, stream_);
    return host_tensor(dtype, shape, contiguous_strides(shape), 0, shape_numel(shape), false);
  }
  // A fresh tensor of this layout holding `value`'s elements (a layout may repeat elements).
  TensorHandle materialize(const RtTensor& value, const Geometry& g, int64_t storage_numel) const {
    count_copy(value);
    bool covers = g.offset == 0 && shape_numel(g.sizes) == storage_numel &&
                  contiguous_strides(g.sizes) == g.strides;
    if (cuda()) {
      TensorHandle out = cuda::cuda_strided(value.dtype(), g.sizes, g.strides, g.offset,
                                            storage_numel, device_, !covers, allocator_, stream_);
      cuda::cuda_copy_elements(*out, value, stream_);
      return out;
    }
    TensorHandle out =
        host_tensor(value.dtype(), g.sizes, g.strides, g.offset, storage_numel, !covers);
    if (copy_disjoint_same_dtype(*out, value)) return out;
    for (int64_t i = 0; i < out->numel(); ++i)
      copy_element(*value.storage, value.storage_index_of_linear(i), *out->storage,
                   out->storage_index_of_linear(i));
    return out;
  }

  // Runs `body` in the interpreter; on CUDA, on host copies.
  std::vector<RtValue> interpret_step(const Trace& body, const std::vector<RtValue>& inputs,
                                      ExecutionStats& stats) const {
    if (!cuda()) return interpret(body, inputs);
    // The transfers are synchronous copies outside `stream_`, which may be a non-blocking
    // stream (PyTorch's): wait for the work queued on it before reading, and for the uploads
    // before later kernels on it read them.
    cuda::synchronize(device_.index);
    std::map<const Storage*, std::shared_ptr<Storage>> down;
    std::vector<RtValue> host_inputs;
    for (const RtValue& v : inputs)
      host_inputs.push_back(to_host_value(v, down));
    std::vector<RtValue> outs = interpret(body, host_inputs);
    std::map<const Storage*, std::shared_ptr<Storage>> up;
    for (RtValue& v : outs)
      v = to_device_value(v, up);
    cuda::synchronize(device_.index);
    for (const auto* copies : {&down, &up}) {
      for (const auto& [from, to] : *copies) {
        int64_t bytes = to->numel() * static_cast<int64_t>(dtype_size(to->dtype));
        if (bytes == 0) continue;  // an empty tensor moves nothing
        ++stats.host_copies;
        stats.host_copy_bytes += bytes;
      }
    }
    return outs;
  }

  RtValue to_host_value(const RtValue& v,
                        std::map<const Storage*, std::shared_ptr<Storage>>& down) const {
    const auto* t = std::get_if<TensorHandle>(&v);
    if (!t || !(*t)->storage->on_device()) return v;
    auto it = down.find((*t)->storage.get());
    if (it == down.end()) it = down.emplace((*t)->storage.get(), cuda::to_host(**t)->storage).first;
    return RtValue(rebase(**t, it->second));
  }
  RtValue to_device_value(const RtValue& v,
                          std::map<const Storage*, std::shared_ptr<Storage>>& up) const {
    const auto* t = std::get_if<TensorHandle>(&v);
    if (!t || (*t)->storage->on_device()) return v;
    auto it = up.find((*t)->storage.get());
    if (it == up.end())
      it = up.emplace((*t)->storage.get(), cuda::to_device(**t, device_)->storage).first;
    return RtValue(rebase(**t, it->second));
  }

 private:
  // A host tensor of this layout, from the allocator when there is one (zero-filled when `zero`;
  // kiln's own memory always is).
  TensorHandle host_tensor(DType dtype, const Shape& shape, const Strides& strides, int64_t offset,
                           int64_t storage_numel, bool zero) const {
    if (!allocator_) return make_strided(dtype, shape, strides, offset, storage_numel);
    auto bytes = static_cast<size_t>(storage_numel * dtype_size(dtype));
    Allocator::Block block = allocator_->allocate(device_, bytes);
    KILN_ASSERT(block.owner && (block.host || bytes == 0))
        << "an allocator returned no host memory for a CPU tensor";
    if (zero && bytes > 0) std::memset(block.host, 0, bytes);
    auto storage = std::make_shared<Storage>();
    storage->dtype = dtype;
    storage->device = device_;
    storage->borrowed = block.host;
    storage->borrowed_numel = storage_numel;
    storage->borrowed_owner = block.owner;
    storage->from_allocator = true;
    return tensor_over(std::move(storage), shape, strides, offset);
  }

  static TensorHandle rebase(const RtTensor& t, std::shared_ptr<Storage> storage) {
    auto out = std::make_shared<RtTensor>(t);
    out->storage = std::move(storage);
    return out;
  }
  void count_copy(const RtTensor& t) const {
    ++stats_->layout_copies;
    stats_->layout_copy_bytes += t.numel() * dtype_size(t.dtype());
  }

  Device device_;
  Allocator* allocator_;
  void* stream_;
  ExecutionStats* stats_;
};

// An opaque step on CUDA through a library (cuBLAS for the matrix products; library_step.h): the
// views around its one product on the device tensors, the product in the library; its output
// is bound in `env`. False when the library cannot run the step (the step runner then does).
bool run_library_step(const Step& step, const std::vector<RtValue>& inputs,
                      const DeviceMemoryOps& memory, bool any_layout,
                      std::map<const Value*, RtValue>& env, ExecutionStats& stats) {
  if (step.outputs.size() != 1) return false;
  TensorHandle out = run_library_body(
      step.body, inputs,
      [&memory, &stats, any_layout](const Node& n, const std::vector<RtValue>& operands) {
        int64_t alignment_bytes = 0;
        TensorHandle product = cuda::run_matrix_product(
            n, operands, memory.allocator(), memory.stream(), &alignment_bytes, any_layout);
        if (product && alignment_bytes) {
          ++stats.aligned_products;
          stats.alignment_copy_bytes += alignment_bytes;
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

bool only_views(const Trace& body) {
  return !body.nodes().empty() &&
         std::all_of(body.nodes().begin(), body.nodes().end(),
                     [](const auto& n) { return n->op->kind == OpKind::kView; });
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

// Kernel::index_checks: every index a kernel uses is inside its dim before the kernel runs, so
// an index out of range is an error that leaves every tensor as it was before the step. While a
// call is captured the capture makes the checks before each replay.
void check_indices(const codegen::Kernel& kernel, const std::vector<RtValue>& inputs,
                   ExecutionCapture* capture) {
  for (const codegen::IndexCheck& c : kernel.index_checks) {
    const TensorHandle& t = std::get<TensorHandle>(inputs.at(static_cast<size_t>(c.input)));
    if (capture)
      capture->defer_index_check(c, t);
    else
      check_index_values(c, *t);
  }
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

// On CUDA the index is read back to the host (a synchronization; an index is short).
std::optional<int64_t> first_index_out_of_range(const codegen::IndexCheck& c, const RtTensor& t) {
  TensorHandle host;
  if (t.storage->on_device()) {
    cuda::synchronize(t.device().index);
    host = cuda::to_host(t);
  }
  std::vector<int64_t> values = to_int_vector(host ? *host : t);  // row-major
  std::vector<int64_t> positions;
  if (c.view) positions = element_indices(c.view->sizes, c.view->strides, c.view->offset);
  for (size_t k = 0; k < (c.view ? positions.size() : values.size()); ++k) {
    int64_t v = values.at(c.view ? static_cast<size_t>(positions[k]) : k);
    if (v < (c.negative ? -c.size : 0) || v >= c.size) return v;
  }
  return std::nullopt;
}

void check_index_values(const codegen::IndexCheck& c, const RtTensor& t) {
  if (std::optional<int64_t> v = first_index_out_of_range(c, t))
    throw IndexOutOfRange(c.op + ": index " + std::to_string(*v) +
                          " is out of bounds for dimension " + std::to_string(c.dim) +
                          " with size " + std::to_string(c.size) + ".");
}

std::vector<RtValue> execute(const CompiledProgram& program, const std::vector<RtValue>& args,
                             const ExecuteOptions& options) {
  call_profile::Scope timed(call_profile::Phase::kExecute);
  ExecutionStats local;
  ExecutionStats* stats = options.stats ? options.stats : &local;
  const AliasPattern& pattern = program.pattern;
  const Trace& trace = program.execution;
  KILN_CHECK(args.size() == pattern.inputs.size()) << "the program takes " << pattern.inputs.size()
                                                   << " arguments but got " << args.size() << ".";
  KILN_CHECK(options.pattern_known || alias_pattern_of(args) == pattern)
      << "the arguments share memory differently from the call the program was compiled for; "
         "compile it for this alias pattern.";

  // The trace's inputs: one per group (the caller's tensor itself, or for a synthetic base the
  // storage extent: the caller's memory where no step writes into it and the extent starts the
  // storage, else a copy, since the functional trace reads its inputs as they were before any
  // writeback), then numbers.
  const DeviceMemoryOps memory(device_of(args), options, stats);
  std::vector<GroupBase> bases(pattern.groups.size());
  std::vector<RtValue> inputs;
  for (size_t g = 0; g < pattern.groups.size(); ++g) {
    size_t j = 0;
    while (pattern.inputs[j].group != static_cast<int>(g))
      ++j;
    TensorHandle caller = std::get<TensorHandle>(args[j]);
    bases[g].caller = caller;
    bases[g].start = caller->offset - pattern.inputs[j].geometry.offset;
    if (pattern.groups[g].synthetic) {
      TensorHandle extent = make_view(caller, {pattern.groups[g].numel}, {1}, bases[g].start);
      // (The trace addresses the base's storage from 0, as_strided's offsets included: a view
      // serves only where the extent starts the caller's storage.)
      const Value* base = trace.inputs()[g];
      bool written = std::any_of(trace.writebacks.begin(), trace.writebacks.end(),
                                 [&](const auto& wb) { return wb.first == base; });
      bool read_in_place = !written && bases[g].start == 0;
      inputs.emplace_back(read_in_place ? extent : memory.clone_of(*extent));
    } else {
      inputs.emplace_back(caller);
    }
  }
  for (size_t j = 0; j < args.size(); ++j)
    if (pattern.inputs[j].group < 0) inputs.push_back(args[j]);

  std::set<const Storage*> caller_storages;
  for (const RtValue& a : args)
    if (auto* t = std::get_if<TensorHandle>(&a)) caller_storages.insert((*t)->storage.get());
  // A value that lives in the caller's memory (an input passed through, or a view of one) is
  // copied before any writeback can change that memory.
  auto detach = [&](RtValue v) {
    if (auto* t = std::get_if<TensorHandle>(&v))
      if (caller_storages.contains((*t)->storage.get())) return RtValue(memory.clone_of(**t));
    return v;
  };
  // Where a writeback into `target` goes: the caller's tensor, or its group's storage extent.
  auto destination = [&](const Value* target) {
    size_t g = 0;
    while (trace.inputs()[g] != target)
      ++g;
    const GroupBase& base = bases[g];
    return pattern.groups[g].synthetic
               ? make_view(base.caller, {pattern.groups[g].numel}, {1}, base.start)
               : base.caller;
  };
  // The part of `target` a writeback replaces (plan.h): its destination, through the window.
  auto window_of = [&](const Value* target, const std::vector<Step::Window>& window) {
    TensorHandle dest = destination(target);
    for (const Step::Window& w : window) {
      if (w.kind == Step::Window::Kind::kAsStrided) {
        // Storage offsets: of the group's storage extent for a synthetic base (its element 0 is
        // the extent's), of the caller's storage otherwise.
        size_t g = 0;
        while (trace.inputs()[g] != target)
          ++g;
        int64_t origin = pattern.groups[g].synthetic ? bases[g].start : 0;
        dest = make_view(bases[g].caller, w.sizes, w.strides,
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
  };
  auto write_back = [&](const Value* target, const RtValue& value,
                        const std::vector<Step::Window>& window = {}) {
    memory.copy(*window_of(target, window), *std::get<TensorHandle>(value));
  };

  std::shared_ptr<const PreparedKernels> prepared = prepared_kernels(program, memory.device());
  std::map<const Value*, RtValue> env;
  for (size_t i = 0; i < inputs.size(); ++i)
    env[trace.inputs()[i]] = inputs[i];
  // An input that is itself an output or a writeback value is read before any writeback runs.
  for (const Value* in : trace.inputs())
    if (prepared->inputs_kept.contains(in)) env[in] = detach(env.at(in));
  if (program.plan.steps.empty()) {
    // No plan (the pipeline stopped before fuse): the functional trace as one step.
    if (options.capture) options.capture->refuse("a program without a plan");
    std::set<const Value*> wanted(trace.outputs().begin(), trace.outputs().end());
    for (const auto& wb : trace.writebacks)
      wanted.insert(wb.second);
    if (memory.cuda()) {
      std::map<const Storage*, std::shared_ptr<Storage>> down, up;
      std::vector<RtValue> host_inputs;
      for (const RtValue& v : inputs)
        host_inputs.push_back(memory.to_host_value(v, down));
      interpret_observed(trace, host_inputs, [&](const Value* v, const RtValue& rv) {
        if (wanted.contains(v) && !env.contains(v)) env[v] = detach(memory.to_device_value(rv, up));
      });
    } else {
      // (The inputs are observed too: those kept are in env already, detached once.)
      interpret_observed(trace, inputs, [&](const Value* v, const RtValue& rv) {
        if (wanted.contains(v) && !env.contains(v)) env[v] = detach(rv);
      });
    }
    for (const auto& [target, value] : trace.writebacks) {
      write_back(target, env.at(value));
      ++stats->writebacks_copied;
    }
  } else {
    // The steps in plan order, each writeback when its step says: a region that stores into
    // an input does it as it runs, so a later step reading that input would see the new data —
    // exactly what place_writebacks must rule out. A fusion step runs as its compiled CPU kernel
    // when it has one (cpu_kernels.h), else in the interpreter.
    const cpu::PlanKernels& kernels = prepared->cpu;
    const cuda::CudaPlanKernels& cuda_kernels = prepared->cuda;
    // The kernel of step s, if it has one.
    auto kernel_of = [&](size_t s) -> const codegen::Kernel* {
      if (memory.cuda())
        return s < cuda_kernels.steps.size() && cuda_kernels.steps[s]
                   ? &cuda_kernels.steps[s]->kernel
                   : nullptr;
      return s < kernels.steps.size() && kernels.steps[s] ? &kernels.steps[s]->kernel : nullptr;
    };
    // Values read after the step that makes them: a value a kernel stored only into the caller's
    // memory is copied out of it when (and only when) it is one of these.
    const std::set<const Value*>& read_later = prepared->read_later;
    for (size_t s = 0; s < program.plan.steps.size(); ++s) {
      const Step& step = program.plan.steps[s];
      std::set<const Value*> stored;  // writeback targets the kernel stored into
      if (step.kind != Step::Kind::kCopy) {
        std::vector<RtValue> step_inputs;
        for (const Value* v : step.inputs)
          step_inputs.push_back(env.at(v));
        bool ran = false;
        if (const codegen::Kernel* kernel = kernel_of(s)) {
          check_indices(*kernel, step_inputs, options.capture);
          std::vector<TensorHandle> buffers(step.outputs.size());
          std::vector<bool> in_caller(step.outputs.size(), false);
          for (const Step::Writeback& wb : step.writebacks) {
            size_t j = 0;
            while (j < step.outputs.size() && (step.outputs[j] != wb.value || buffers[j]))
              ++j;
            if (j == step.outputs.size()) continue;
            TensorHandle dest = window_of(wb.target, wb.window);
            if (!can_store_in_kernel(*kernel, j, *dest, step_inputs)) continue;
            buffers[j] = dest;
            in_caller[j] = true;
            stored.insert(wb.target);
          }
          for (size_t j = 0; j < buffers.size(); ++j) {
            if (buffers[j]) continue;
            const codegen::KernelOutput& o = kernel->outputs[j];
            buffers[j] = memory.empty(o.dtype, o.shape);
          }
          ran = memory.cuda() ? cuda::run_cuda_kernel(*cuda_kernels.steps[s], step_inputs, buffers,
                                                      memory.stream(), memory.allocator())
                              : cpu::run_cpu_kernel(*kernels.steps[s], step_inputs, buffers);
          if (ran) {
            // Read later, or written back by a copy after all.
            auto bound = [&](const Value* v) {
              if (read_later.contains(v)) return true;
              for (const Step::Writeback& wb : step.writebacks)
                if (wb.value == v && !stored.contains(wb.target)) return true;
              return false;
            };
            // A value read where the kernel stored it has the layout of a fresh buffer there
            // (a view at an offset would move the storage offsets as_strided reads at).
            auto as_fresh = [](const RtTensor& t) {
              return t.offset == 0 && t.strides == contiguous_strides(t.sizes);
            };
            for (size_t j = 0; j < buffers.size(); ++j) {
              const Value* v = step.outputs[j];
              if (!in_caller[j] ||
                  (bound(v) && prepared->stays_in_caller.contains(v) && as_fresh(*buffers[j])))
                env[v] = buffers[j];
              else if (bound(v))
                env[v] = detach(buffers[j]);
            }
          } else {
            stored.clear();
          }
        }
        bool eager = is_eager_call(step);
        if (eager) with_eager_layouts(step, prepared->any_layout, memory, step_inputs);
        if (options.capture && eager) options.capture->admit_eager_step(step.body, step_inputs);
        if (eager) {
          // PyTorch runs it, on the tensors where they are (device memory included): the
          // interpreter only hands them to the registered function (eager_calls.h), after the
          // views it reads through (a reshape no view expresses copies on the device).
          std::optional<DeviceCopyScope> device_copies;
          if (memory.cuda()) device_copies.emplace(memory.device_copier());
          std::vector<RtValue> outs = interpret(step.body, step_inputs);
          for (size_t k = 0; k < outs.size(); ++k) {
            const auto* t = std::get_if<TensorHandle>(&outs[k]);
            if (options.capture && t && !(*t)->storage->on_device())
              options.capture->refuse("a step PyTorch runs returned a tensor in host memory");
            env[step.outputs[k]] = outs[k];
          }
          ran = true;
        }
        if (!ran && memory.cuda() && step.kind == Step::Kind::kOpaque)
          ran = run_library_step(step, step_inputs, memory,
                                 prepared->any_layout.contains(step.outputs.at(0)), env, *stats);
        if (!ran && !eager && only_views(step.body)) {
          std::vector<RtValue> outs = run_view_step(step, step_inputs, memory, options.capture);
          for (size_t k = 0; k < outs.size(); ++k)
            env[step.outputs[k]] = detach(outs[k]);
          ++stats->view_steps;
          ran = true;
        } else if (eager) {
          ++stats->eager_steps;
        } else if (ran && step.kind == Step::Kind::kOpaque) {
          ++stats->library_steps;
        } else if (ran) {
          ++stats->kernel_steps;
          stats->writebacks_in_kernel += static_cast<int>(stored.size());
        } else if (options.capture) {
          options.capture->refuse("a step without a kernel");
        } else {
          // PyTorch's ops or the interpreter: both read eager's layouts.
          with_eager_layouts(step, prepared->any_layout, memory, step_inputs);
          if (options.step_runner) {
            ++stats->torch_steps;
            std::vector<RtValue> outs = (*options.step_runner)(step.body, step_inputs);
            for (size_t k = 0; k < outs.size(); ++k)
              env[step.outputs[k]] = outs[k];
          } else {
            ++stats->interpreted_steps;
            std::vector<RtValue> outs = memory.interpret_step(step.body, step_inputs, *stats);
            for (size_t k = 0; k < outs.size(); ++k)
              env[step.outputs[k]] = detach(outs[k]);
          }
        }
      }
      for (const Step::Writeback& wb : step.writebacks) {
        if (stored.contains(wb.target)) continue;
        write_back(wb.target, env.at(wb.value), wb.window);
        ++stats->writebacks_copied;
      }
    }
  }
  // Two outputs are never one fresh tensor.
  std::vector<RtValue> values;
  std::set<const RtTensor*> returned;
  for (const Value* o : trace.outputs()) {
    RtValue v = detach(env.at(o));
    if (auto* t = std::get_if<TensorHandle>(&v))
      if (!returned.insert(t->get()).second) v = memory.clone_of(**t);
    values.push_back(v);
  }
  // Metadata mutations of the caller's tensor objects.
  for (const MetadataUpdate& m : program.interface.metadata) {
    TensorHandle t = std::get<TensorHandle>(args[static_cast<size_t>(m.arg)]);
    const GroupBase& base =
        bases[static_cast<size_t>(pattern.inputs[static_cast<size_t>(m.arg)].group)];
    t->sizes = m.geometry.sizes;
    t->strides = m.geometry.strides;
    t->offset = base.start + m.geometry.offset;
  }
  // What the caller gets back.
  std::vector<RtValue> results;
  std::set<const RtTensor*> handed_out;        // fresh tensors returned as they are
  std::set<const Storage*> visible_storages;   // the storages of those the caller sees
  std::map<int, TensorHandle> fresh_storages;  // kFreshView: one buffer per shared storage
  // Whether `value` can be handed to the caller as it is, laid out as `g` in a storage of
  // `numel` elements: a buffer of the program's own (not the caller's), from the caller's
  // allocator where it has one, in that very layout. (Results that are views of one value share
  // its storage, as eager's views of one tensor do: a forward's saved q, k and v.)
  auto ours = [&](const RtTensor& value) {
    return (!options.allocator || value.storage->from_allocator) &&
           !caller_storages.contains(value.storage.get());
  };
  auto hand_out_as_is = [&](const RtTensor& value, const Geometry& g, int64_t numel) {
    return ours(value) && value.sizes == g.sizes && value.strides == g.strides &&
           value.offset == g.offset && value.storage->numel() == numel;
  };
  for (const ReturnBinding& r : program.interface.returns) {
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
            buffer = memory.materialize(*value, r.storage_geometry, r.storage_numel);
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
        results.emplace_back(memory.materialize(value, r.geometry, r.storage_numel));
        break;
      }
      case ReturnBinding::Kind::kInputObject:
        results.push_back(args.at(static_cast<size_t>(r.index)));
        break;
      case ReturnBinding::Kind::kInputView: {
        const GroupBase& base = bases.at(static_cast<size_t>(r.index));
        results.emplace_back(as_dtype(make_view(base.caller, r.geometry.sizes, r.geometry.strides,
                                                base.start + r.geometry.offset),
                                      r.dtype));
        break;
      }
    }
  }
  return results;
}

}  // namespace kiln
