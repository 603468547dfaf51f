// kiln._C: the nanobind extension behind kiln.jit (issue 5). It holds each jitted function's
// cache of compiled programs and runs a cached program on PyTorch tensors without copying them:
// the specialization key is computed, looked up and run here, in C++, so that a call that hits
// the cache costs a few microseconds of host time (python/kiln/_jit.py only traces and compiles
// on a miss).
//
// PyTorch's tensors are read through ATen (libtorch is linked; nothing of it is copied): tensors
// on one storage become views of ONE kiln Storage over the borrowed memory (host or device), so
// that aliasing and object identity are what the caller has; the tensors kiln makes come from
// PyTorch's allocators (the caching allocator on CUDA), and CUDA kernels run on PyTorch's current
// stream. Results are the caller's own objects, real views of the caller's tensors, or tensors
// over the allocated buffers.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/ir/parser.h"
#include "kiln/passes/pipeline.h"
#include "kiln/python/call_args.h"
#include "kiln/python/call_key.h"
#include "kiln/python/dict_watch.h"
#include "kiln/python/torch_cuda_capture.h"
#include "kiln/python/torch_steps.h"
#include "kiln/python/torch_values.h"
#include "kiln/runtime/cpu/kernel_cache.h"
#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/cuda/driver.h"
#include "kiln/runtime/cuda/graph_replay.h"
#include "kiln/runtime/executor.h"
#include "kiln/runtime/interpreter/eager_calls.h"
#include "kiln/support/call_profile.h"
#include "kiln/support/error.h"

namespace nb = nanobind;

namespace kiln {
namespace {

using namespace pyext;  // NOLINT(google-build-using-namespace): the extension's own parts

// ---- programs and the cache
// ----------------------------------------------------------------------

// How a call's results become its return value: the single result, a tuple of the results, or
// Python's `assemble(results)` (constants among the outputs, nested structures).
enum class OutputForm { kSingle = 0, kTuple = 1, kAssemble = 2 };

struct Program {
  ~Program() {
    // Its eager_call functions go with it (the numbers are never reused).
    for (const auto& n : compiled.execution.nodes())
      if (n->id() == OpId::kEagerCall)
        unregister_eager_function(static_cast<int>(n->arg(0).as_int()));
  }
  CompiledProgram compiled;
  double compile_seconds = 0;     // tracing (measured by Python) and compiling
  double first_run_seconds = -1;  // the first run, which prepares the kernels
  OutputForm form = OutputForm::kAssemble;
  nb::object assemble;
  int fallback_ops = 0;  // torch ops PyTorch runs (eager_call)
  // The caller's tensors whose memory the program writes: their version counters are bumped
  // after each run, as an in-place op's are, so that autograd's saved-tensor checks see kiln's
  // writes.
  std::vector<size_t> written_args;
  cuda::GraphReplay graphs;  // on CUDA: replays the program as one CUDA graph when it can
  ArgumentPool arguments;    // the last call's arguments, for the next
};

struct LastRun {
  std::shared_ptr<Program> program;
  ExecutionStats stats;
  uint64_t sequence = 0;  // when, among all caches' runs (kiln.last_stats picks the latest)
};

uint64_t next_run_sequence() {
  static uint64_t counter = 0;  // under the GIL
  return ++counter;
}

class JitCache {
 public:
  // Runs the cached program for this call, or returns `miss` when there is none (or, on the
  // positional fast path, when a leaf is a container).
  nb::object run(nb::handle structure, nb::handle leaves, nb::handle miss) {
    nb::object seq = nb::steal(PySequence_Fast(leaves.ptr(), "kiln: leaves must be a sequence"));
    if (!seq.is_valid()) throw nb::python_error();
    std::vector<PyObject*> tensor_leaves;
    std::unordered_map<CallKey, std::shared_ptr<Program>, CallKeyHash>::iterator it;
    {
      call_profile::Scope timed(call_profile::Phase::kKey);
      std::optional<CallKey> key = call_key(structure, seq, tensor_leaves);
      if (!key) return nb::borrow(miss);
      it = entries_.find(*key);
      if (it == entries_.end()) return nb::borrow(miss);
    }
    ++hits_;
    return execute_program(it->second, tensor_leaves);
  }

  // Compiles trace text for this call's tensors, caches it under the call's key, and runs it.
  nb::object insert_and_run(nb::handle structure, nb::handle leaves, const std::string& text,
                            double trace_seconds, int form, nb::object assemble, int fallback_ops) {
    std::vector<PyObject*> tensor_leaves;
    std::shared_ptr<Program> program =
        insert(structure, leaves, text, trace_seconds, form, std::move(assemble), fallback_ops,
               nullptr, &tensor_leaves);
    return execute_program(program, tensor_leaves);
  }

  // Compiles and caches without running. `requires_grad` (one flag per tensor leaf): compile
  // the forward of a differentiated call (Program.gradient says what the backward is).
  std::shared_ptr<Program> insert(nb::handle structure, nb::handle leaves, const std::string& text,
                                  double trace_seconds, int form, nb::object assemble,
                                  int fallback_ops, const std::vector<bool>* requires_grad,
                                  std::vector<PyObject*>* tensor_leaves_out = nullptr) {
    nb::object seq = nb::steal(PySequence_Fast(leaves.ptr(), "kiln: leaves must be a sequence"));
    if (!seq.is_valid()) throw nb::python_error();
    std::vector<PyObject*> tensor_leaves;
    std::optional<CallKey> key = call_key(structure, seq, tensor_leaves);
    KILN_CHECK(key.has_value()) << "kiln.jit passed a container as a leaf";
    auto start = std::chrono::steady_clock::now();
    auto program = std::make_shared<Program>();
    Trace trace = parse_trace(text, "<kiln.jit>");
    CallArgs call = make_args(tensor_leaves);
    program->compiled = compile(trace, alias_pattern_of(call.values), "", requires_grad);
    program->compile_seconds =
        trace_seconds +
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    program->form = static_cast<OutputForm>(form);
    program->assemble = std::move(assemble);
    program->fallback_ops = fallback_ops;
    program->written_args = written_arguments(program->compiled);
    ++misses_;
    entries_[std::move(*key)] = program;
    if (tensor_leaves_out) *tensor_leaves_out = std::move(tensor_leaves);
    return program;
  }

  // The cached Program for this call, or None: a lookup that runs nothing (kiln's autograd runs
  // it inside a torch.autograd.Function, with run_program: the call is keyed once). An empty
  // cache answers without computing the key.
  nb::object find(nb::handle structure, nb::handle leaves) {
    if (entries_.empty()) return nb::none();
    nb::object seq = nb::steal(PySequence_Fast(leaves.ptr(), "kiln: leaves must be a sequence"));
    if (!seq.is_valid()) throw nb::python_error();
    std::vector<PyObject*> tensor_leaves;
    std::optional<CallKey> key = call_key(structure, seq, tensor_leaves);
    if (!key) return nb::none();
    auto it = entries_.find(*key);
    if (it == entries_.end()) return nb::none();
    return nb::cast(it->second);
  }

  // Runs a Program find() returned for these very leaves (not keyed again).
  nb::object run_program(const std::shared_ptr<Program>& program, nb::handle leaves) {
    nb::object seq = nb::steal(PySequence_Fast(leaves.ptr(), "kiln: leaves must be a sequence"));
    if (!seq.is_valid()) throw nb::python_error();
    std::vector<PyObject*> tensor_leaves;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    tensor_leaves.reserve(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i)
      if (THPVariable_Check(items[i])) tensor_leaves.push_back(items[i]);
    ++hits_;
    return execute_program(program, tensor_leaves);
  }

  uint64_t last_sequence() const { return last_.sequence; }
  int hits() const { return hits_; }
  int misses() const { return misses_; }
  const LastRun& last() const {
    if (!last_.program) throw std::runtime_error("the function has not been called yet");
    return last_;
  }

 private:
  nb::object execute_program(const std::shared_ptr<Program>& program,
                             const std::vector<PyObject*>& tensor_leaves) {
    std::optional<call_profile::Scope> arguments_timed(std::in_place,
                                                       call_profile::Phase::kArguments);
    CallArgs call = program->arguments.take(tensor_leaves);
    arguments_timed.reset();
    // The arguments go back to the program's pool when the call returns (not when it raises:
    // the next call makes new ones then).
    struct GiveBack {
      ArgumentPool& pool;
      CallArgs& call;
      int exceptions = std::uncaught_exceptions();
      ~GiveBack() {
        if (std::uncaught_exceptions() == exceptions) pool.give_back(std::move(call));
      }
    } give_back{program->arguments, call};
    TorchAllocator allocator;
    ExecutionStats stats;
    static const StepRunner torch_steps = run_step_with_torch;
    auto start = std::chrono::steady_clock::now();
    TorchAllocator* outer = current_allocator;  // an eager_call may run another kiln program
    current_allocator = &allocator;
    std::vector<RtValue> results;
    try {
      ExecuteOptions options{&allocator, current_stream(call.values), &stats,
                             /*pattern_known=*/true, &torch_steps};
      options.eager_capture = torch_capture_join();
      results = program->graphs.run(program->compiled, call.values, options);
    } catch (...) {
      current_allocator = outer;
      throw;
    }
    current_allocator = outer;
    if (program->first_run_seconds < 0)
      program->first_run_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    last_ = LastRun{program, stats, next_run_sequence()};

    call_profile::Scope results_timed(call_profile::Phase::kResults);
    for (size_t i : program->written_args) {
      const at::Tensor& t = THPVariable_Unpack(call.objects.at(i));
      if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
    }
    // Metadata mutations (transpose_, ...) of the caller's tensor objects.
    for (const MetadataUpdate& m : program->compiled.interface.metadata) {
      const RtTensor& t = *std::get<TensorHandle>(call.values.at(static_cast<size_t>(m.arg)));
      const at::Tensor& caller = THPVariable_Unpack(call.objects.at(static_cast<size_t>(m.arg)));
      caller.as_strided_(std::vector<int64_t>(t.sizes.begin(), t.sizes.end()), t.strides, t.offset);
    }
    // One result needs no list: every container made here is one more object for Python's
    // cyclic garbage collector, which showed up in the per-call profile.
    if (program->form == OutputForm::kSingle) return result_object(results.at(0), call, allocator);
    nb::list out;
    for (const RtValue& v : results)
      out.append(result_object(v, call, allocator));
    if (program->form == OutputForm::kTuple) return nb::tuple(out);
    return program->assemble(out);
  }

  static std::vector<size_t> written_arguments(const CompiledProgram& p) {
    const Trace& f = p.execution;
    std::vector<bool> written(f.inputs().size(), false);
    for (const auto& [input, value] : f.writebacks)
      written[static_cast<size_t>(std::find(f.inputs().begin(), f.inputs().end(), input) -
                                  f.inputs().begin())] = true;
    std::vector<size_t> args;
    for (size_t i = 0; i < p.pattern.inputs.size(); ++i)
      if (int g = p.pattern.inputs[i].group; g >= 0 && written.at(static_cast<size_t>(g)))
        args.push_back(i);
    return args;
  }

  // A result as the caller sees it: the caller's own object, a view of the caller's tensor, or a
  // tensor over memory kiln allocated.
  static nb::object result_object(const RtValue& v, const CallArgs& call,
                                  const TorchAllocator& allocator) {
    if (const auto* s = std::get_if<RtScalar>(&v))
      return std::visit([](auto x) { return nb::cast(x); }, *s);
    const TensorHandle& t = std::get<TensorHandle>(v);
    for (size_t i = 0; i < call.values.size(); ++i)
      if (std::get<TensorHandle>(call.values[i]) == t) return nb::borrow(call.objects[i]);
    // (A view_dtype result reads its memory's storage as another dtype: memory_owner.)
    const Storage& memory = t->storage->memory_owner();
    if (int arg = call.first_leaf_over(&memory); arg >= 0) {
      at::Tensor base = THPVariable_Unpack(call.objects.at(static_cast<size_t>(arg)));
      if (t->dtype() != memory.dtype) base = base.view(torch_dtype(t->dtype()));
      at::Tensor view = base.as_strided(std::vector<int64_t>(t->sizes.begin(), t->sizes.end()),
                                        t->strides, t->offset);
      return nb::steal(THPVariable_Wrap(view));
    }
    const c10::Storage* storage = allocator.storage_of(memory);
    KILN_ASSERT(storage) << "a fresh result is not in memory from PyTorch's allocator";
    return nb::steal(THPVariable_Wrap(tensor_over_storage(*storage, *t)));
  }

  std::unordered_map<CallKey, std::shared_ptr<Program>, CallKeyHash> entries_;
  int hits_ = 0, misses_ = 0;
  LastRun last_;
};

}  // namespace
}  // namespace kiln

NB_MODULE(_C, m) {
  using namespace kiln;
  // Python does not free every module global at exit, and a kiln.jit function at module level
  // holds its JitCache: nanobind's exit-time check would report those as leaks to every user.
  nb::set_leak_warnings(false);
  nb::exception<UserError>(m, "UserError", PyExc_RuntimeError);
  // An index out of range: eager raises IndexError from some index ops and RuntimeError from
  // others (index_select, gather, scatter), so kiln's error is both, and an `except` written
  // for eager's catches it.
  PyObject* index_error = PyErr_NewException(
      "kiln._C.IndexOutOfRangeError",
      nb::make_tuple(nb::handle(PyExc_IndexError), nb::handle(PyExc_RuntimeError)).ptr(), nullptr);
  m.attr("IndexOutOfRangeError") = nb::steal(index_error);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* type) {
        try {
          std::rethrow_exception(p);
        } catch (const IndexOutOfRange& e) {
          PyErr_SetString(static_cast<PyObject*>(type), e.what());
        }
      },
      index_error);
  nb::class_<Program>(m, "Program")
      .def_prop_ro("history",
                   [](const Program& p) {
                     std::vector<std::pair<std::string, std::string>> h;
                     for (const PassRecord& r : p.compiled.history)
                       h.emplace_back(r.pass, r.printed);
                     return h;
                   })
      .def_prop_ro("fusion_regions",
                   [](const Program& p) { return p.compiled.stats.fusion_regions; })
      .def_prop_ro("writebacks_in_kernel",
                   [](const Program& p) { return p.compiled.stats.writebacks_in_kernel; })
      .def_prop_ro("writebacks_with_temporary",
                   [](const Program& p) { return p.compiled.stats.writebacks_with_temporary; })
      .def_prop_ro("compile_seconds", [](const Program& p) { return p.compile_seconds; })
      .def_prop_ro("first_run_seconds", [](const Program& p) { return p.first_run_seconds; })
      .def_prop_ro("fallback_ops", [](const Program& p) { return p.fallback_ops; })
      .def_prop_ro("graph_refused", [](const Program& p) { return p.graphs.refused(); })
      .def_prop_ro("assemble", [](const Program& p) { return p.assemble; })
      .def_prop_ro("gradient", [](const Program& p) -> nb::object {
        if (!p.compiled.gradient) return nb::none();
        const GradientProgram& g = *p.compiled.gradient;
        nb::dict d;
        d["refused"] = g.refused;
        d["backward"] = g.backward;
        d["backward_inputs"] = g.backward_inputs;
        d["differentiable_results"] = g.differentiable_results;
        d["saved_results"] = g.saved_results;
        d["grad_inputs"] = g.grad_inputs;
        d["own_results"] = g.own_results;
        d["caller_results"] = g.caller_results;
        return d;
      });
  m.def(
      "kernel_cache_stats",
      [] {
        const cpu::KernelCacheStats c = cpu::kernel_cache().stats();
        const cuda::CudaCacheStats g = cuda::cuda_cache_stats();
        nb::dict cpu_stats, cuda_stats, d;
        cpu_stats["compiled"] = c.kernels_compiled;
        cpu_stats["compiler_runs"] = c.compiler_runs;
        cpu_stats["disk_hits"] = c.disk_hits;
        cpu_stats["memory_hits"] = c.memory_hits;
        cuda_stats["compiled"] = g.compiled;
        cuda_stats["disk_hits"] = g.disk_hits;
        cuda_stats["memory_hits"] = g.memory_hits;
        d["cpu"] = cpu_stats;
        d["cuda"] = cuda_stats;
        return d;
      },
      "This process's kernel caches so far: kernels compiled, found on disk and found in memory "
      "(and CPU compiler runs), by target.");
  m.def("set_step_times", &call_profile::set_step_times, nb::arg("on"),
        "Records each step's host seconds in last_run_stats['step_times'] (off by default).");
  m.def("call_phase_seconds", &call_profile::seconds,
        "Host seconds so far in each phase of kiln.jit calls, as (phase, seconds) pairs; counted "
        "only when KILN_PROFILE_CALLS is set (see src/kiln/support/call_profile.h).");
  kiln::python::bind_dict_watch(m);
  m.def("register_eager", &register_eager, nb::arg("fn"),
        nb::arg("capture_refusal") = "has no rule for CUDA graph capture",
        "Registers fn(list of tensors) -> list of tensors for eager_call; returns its number. "
        "capture_refusal: why its device work may not be recorded once into a CUDA graph and "
        "replayed (as \"draws random numbers\"); empty when it may.");
  nb::class_<JitCache>(m, "JitCache")
      .def(nb::init<>())
      .def("run", &JitCache::run, nb::arg("structure"), nb::arg("leaves"), nb::arg("miss"),
           "Runs the cached program for the call's key, or returns `miss`.")
      .def("insert_and_run", &JitCache::insert_and_run, nb::arg("structure"), nb::arg("leaves"),
           nb::arg("text"), nb::arg("trace_seconds"), nb::arg("form"), nb::arg("assemble").none(),
           nb::arg("fallback_ops"),
           "Compiles trace text for the call, caches it under the call's key and runs it.")
      .def(
          "insert",
          [](JitCache& c, nb::handle structure, nb::handle leaves, const std::string& text,
             double trace_seconds, int form, nb::object assemble, int fallback_ops,
             std::optional<std::vector<bool>> requires_grad) {
            return c.insert(structure, leaves, text, trace_seconds, form, std::move(assemble),
                            fallback_ops, requires_grad ? &*requires_grad : nullptr);
          },
          nb::arg("structure"), nb::arg("leaves"), nb::arg("text"), nb::arg("trace_seconds"),
          nb::arg("form"), nb::arg("assemble").none(), nb::arg("fallback_ops"),
          nb::arg("requires_grad").none(),
          "Compiles trace text for the call and caches it under the call's key; returns the "
          "Program. requires_grad: one flag per tensor leaf, to differentiate.")
      .def("find", &JitCache::find, nb::arg("structure"), nb::arg("leaves"),
           "The cached Program for the call, or None (runs nothing).")
      .def("run_program", &JitCache::run_program, nb::arg("program"), nb::arg("leaves"),
           "Runs a Program find() returned for these leaves, without keying the call again.")
      .def_prop_ro("last_sequence", &JitCache::last_sequence)
      .def_prop_ro("hits", &JitCache::hits)
      .def_prop_ro("misses", &JitCache::misses)
      .def_prop_ro("last_program", [](const JitCache& c) { return c.last().program; })
      .def_prop_ro("last_run_stats", [](const JitCache& c) {
        const ExecutionStats& s = c.last().stats;
        nb::dict d;
        d["kernel_steps"] = s.kernel_steps;
        d["multi_tensor_steps"] = s.multi_tensor_steps;
        d["library_steps"] = s.library_steps;
        d["interpreted_steps"] = s.interpreted_steps;
        d["eager_steps"] = s.eager_steps;
        d["torch_steps"] = s.torch_steps;
        d["view_steps"] = s.view_steps;
        d["writebacks_in_kernel"] = s.writebacks_in_kernel;
        d["writebacks_copied"] = s.writebacks_copied;
        d["index_checks_first"] = s.index_checks_first;
        d["index_checks_at_steps"] = s.index_checks_at_steps;
        d["layout_copies"] = s.layout_copies;
        d["layout_copy_bytes"] = s.layout_copy_bytes;
        d["aligned_products"] = s.aligned_products;
        d["alignment_copy_bytes"] = s.alignment_copy_bytes;
        d["host_copies"] = s.host_copies;
        d["host_copy_bytes"] = s.host_copy_bytes;
        d["graph_captures"] = s.graph_captures;
        d["graph_replays"] = s.graph_replays;
        d["graph_results_rebound"] = s.graph_results_rebound;
        d["graph_results_copied"] = s.graph_results_copied;
        // (step, how, seconds, its body's ops) per step, with kiln._C.set_step_times(True).
        nb::list steps;
        const std::vector<Step>& plan = c.last().program->compiled.plan.steps;
        for (const ExecutionStats::StepTime& t : s.step_times) {
          std::string ops;
          for (const auto& n : plan.at(static_cast<size_t>(t.step)).body.nodes())
            ops += (ops.empty() ? "" : " ") + n->op->name;
          steps.append(nb::make_tuple(t.step, t.how, t.seconds, ops));
        }
        d["step_times"] = steps;
        return d;
      });
}
