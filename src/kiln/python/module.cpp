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
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/Storage.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/ir/parser.h"
#include "kiln/passes/pipeline.h"
#include "kiln/python/dict_watch.h"
#include "kiln/runtime/cuda/driver.h"
#include "kiln/runtime/cuda/graph_replay.h"
#include "kiln/runtime/executor.h"
#include "kiln/runtime/interpreter/eager_calls.h"
#include "kiln/runtime/library_step.h"
#include "kiln/support/call_profile.h"
#include "kiln/support/error.h"

namespace nb = nanobind;

namespace kiln {
namespace {

// ---- PyTorch tensors as kiln values -------------------------------------------------------------

std::optional<DType> kiln_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool:
      return DType::kBool;
    case at::kInt:
      return DType::kInt32;
    case at::kLong:
      return DType::kInt64;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kFloat:
      return DType::kFloat32;
    case at::kDouble:
      return DType::kFloat64;
    default:
      return std::nullopt;
  }
}

at::ScalarType torch_dtype(DType t) {
  switch (t) {
    case DType::kBool:
      return at::kBool;
    case DType::kInt32:
      return at::kInt;
    case DType::kInt64:
      return at::kLong;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat64:
      return at::kDouble;
  }
  KILN_ASSERT(false) << "unknown dtype";
  return at::kFloat;
}

Device kiln_device(const at::Device& d) {
  if (d.is_cpu()) return Device::cpu();
  if (d.is_cuda()) return Device::cuda(d.index());
  throw UnsupportedError("kiln runs cpu and cuda tensors, not " + d.str() + " ones.");
}

// A storage is told apart by its memory: tensors over one allocation share a kiln Storage. An
// empty storage has no address; it is its own.
const void* storage_identity(const at::Tensor& t, PyObject* object) {
  const c10::Storage& s = t.storage();
  return s.nbytes() > 0 && s.data() ? s.data() : static_cast<const void*>(object);
}

// One call's tensors as kiln values: one Storage per distinct storage, one TensorHandle per
// distinct tensor object.
struct CallArgs {
  std::vector<RtValue> values;     // per tensor leaf
  std::vector<PyObject*> objects;  // the caller's objects, per tensor leaf (borrowed)
  std::unordered_map<const Storage*, int> storage_arg;  // a storage -> its first tensor leaf
};

std::shared_ptr<void> borrowed_device_memory() {
  // The caller's tensors keep their memory alive during the call; a device storage only needs a
  // non-null owner to count as one (Storage::on_device).
  static const std::shared_ptr<void> token = std::make_shared<int>(0);
  return token;
}

CallArgs make_args(const std::vector<PyObject*>& tensor_leaves) {
  CallArgs call;
  // Hash maps: a module's call has hundreds of leaves (its parameters and buffers).
  std::unordered_map<const void*, std::shared_ptr<Storage>> storages(tensor_leaves.size());
  std::unordered_map<PyObject*, TensorHandle> objects(tensor_leaves.size());
  call.storage_arg.reserve(tensor_leaves.size());
  call.values.reserve(tensor_leaves.size());
  call.objects.reserve(tensor_leaves.size());
  for (size_t i = 0; i < tensor_leaves.size(); ++i) {
    PyObject* object = tensor_leaves[i];
    call.objects.push_back(object);
    auto found = objects.find(object);
    if (found != objects.end()) {
      call.values.emplace_back(found->second);
      continue;
    }
    const at::Tensor& t = THPVariable_Unpack(object);
    std::optional<DType> dtype = kiln_dtype(t.scalar_type());
    if (!dtype)
      throw UnsupportedError(std::string("kiln does not support tensors of dtype ") +
                             c10::toString(t.scalar_type()) + ".");
    if (t.layout() != at::kStrided)
      throw UnsupportedError("kiln supports strided (dense) tensors only.");
    Device device = kiln_device(t.device());
    std::shared_ptr<Storage>& storage = storages[storage_identity(t, object)];
    if (!storage) {
      storage = std::make_shared<Storage>();
      storage->dtype = *dtype;
      int64_t numel = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
      auto* base = static_cast<std::byte*>(const_cast<void*>(t.storage().data()));
      if (device == Device::cpu()) {
        storage->borrowed = base;
        storage->borrowed_numel = numel;
      } else {
        storage->device = device;
        storage->device_data = reinterpret_cast<uint64_t>(base);
        storage->device_numel = numel;
        storage->device_owner = borrowed_device_memory();
      }
      call.storage_arg[storage.get()] = static_cast<int>(i);
    } else if (storage->dtype != *dtype) {
      throw UnsupportedError(
          "kiln: two arguments share memory with different dtypes; kiln does not support that.");
    }
    TensorHandle h = tensor_over(storage, Shape(t.sizes().begin(), t.sizes().end()),
                                 std::vector<int64_t>(t.strides().begin(), t.strides().end()),
                                 t.storage_offset());
    objects[object] = h;
    call.values.emplace_back(h);
  }
  return call;
}

// Blocks from PyTorch's allocators (c10's allocator for the device: the caching allocator on
// CUDA, whose blocks are ordered on the current stream, the one kiln's kernels run on). Each block
// is a c10 storage, which lives as long as a kiln Storage or a result uses it. Asking the
// allocator directly, not at::empty, skips the dispatcher and a tensor per buffer: at::empty cost
// 4.9 us of a 10 us S1 call at 5x1024 on the H200's host (bench/NOTES.md).
class TorchAllocator : public Allocator {
 public:
  Block allocate(Device device, size_t bytes) override {
    bool cuda = device.kind == Device::Kind::kCuda;
    c10::Device where =
        cuda ? c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device.index))
             : c10::Device(c10::DeviceType::CPU);
    c10::Allocator* allocator = c10::GetAllocator(where.type());
    // At least 16 bytes, so that a zero-size tensor still gets an address.
    bytes = std::max<size_t>(bytes, 16);
    c10::DataPtr data;
    if (cuda) {
      // The caching allocator allocates on the current device.
      c10::DeviceGuard on_device(where);
      data = allocator->allocate(bytes);
    } else {
      data = allocator->allocate(bytes);
    }
    auto address = reinterpret_cast<uintptr_t>(data.get());
    c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(bytes),
                         std::move(data), allocator, /*resizable=*/false);
    auto owner = std::make_shared<c10::Storage>(storage);
    storages_.emplace_back(address, std::move(storage));
    if (cuda) return Block{nullptr, address, owner};
    return Block{reinterpret_cast<std::byte*>(address), 0, owner};
  }
  // A tensor PyTorch made during the call (an eager_call's result): a result over its memory
  // is handed out as a tensor over its storage.
  void adopt(const at::Tensor& t) {
    storages_.emplace_back(reinterpret_cast<uintptr_t>(t.storage().data()), t.storage());
  }
  const c10::Storage* storage_of(const Storage& s) const {
    auto address = s.on_device() ? static_cast<uintptr_t>(s.device_data)
                                 : reinterpret_cast<uintptr_t>(s.borrowed);
    for (const auto& [at, storage] : storages_)
      if (at == address) return &storage;
    return nullptr;
  }

 private:
  std::vector<std::pair<uintptr_t, c10::Storage>> storages_;  // a call makes a few
};

// The allocator of the call being executed (an eager_call's results join its buffers).
thread_local TorchAllocator* current_allocator = nullptr;

// ---- eager_call: torch ops kiln has no lowering for, run by PyTorch
// -------------------------------

// A torch tensor over a kiln tensor's memory (no copy; valid while the kiln storage lives).
at::Tensor torch_view(const RtTensor& t) {
  at::TensorOptions options = at::TensorOptions().dtype(torch_dtype(t.dtype()));
  if (t.numel() == 0) {
    // No element to share (an empty CUDA storage may have no device address, which from_blob
    // refuses): an empty tensor of the same layout.
    if (t.storage->on_device()) options = options.device(at::kCUDA, t.device().index);
    return at::empty_strided(std::vector<int64_t>(t.sizes.begin(), t.sizes.end()), t.strides,
                             options);
  }
  auto bytes = static_cast<size_t>(t.offset * dtype_size(t.dtype()));
  void* data = nullptr;
  if (t.storage->on_device()) {
    options = options.device(at::kCUDA, t.device().index);
    data = reinterpret_cast<void*>(t.storage->device_data + bytes);
  } else {
    data = const_cast<std::byte*>(t.storage->data()) + bytes;
  }
  return at::from_blob(data, std::vector<int64_t>(t.sizes.begin(), t.sizes.end()), t.strides,
                       options);
}

// A kiln tensor over a torch tensor's memory, which it keeps alive.
TensorHandle kiln_view(const at::Tensor& r) {
  std::optional<DType> dtype = kiln_dtype(r.scalar_type());
  if (!dtype || r.layout() != at::kStrided)
    throw UnsupportedError(std::string("kiln: an op run by PyTorch returned a tensor of dtype ") +
                           c10::toString(r.scalar_type()) + ", which kiln does not support.");
  auto storage = std::make_shared<Storage>();
  storage->dtype = *dtype;
  storage->device = kiln_device(r.device());
  auto owner = std::make_shared<at::Tensor>(r);
  auto numel = static_cast<int64_t>(r.storage().nbytes() / r.element_size());
  auto* base = static_cast<std::byte*>(const_cast<void*>(r.storage().data()));
  if (r.is_cuda()) {
    storage->device_data = reinterpret_cast<uint64_t>(base);
    storage->device_numel = numel;
    storage->device_owner = owner;
  } else {
    storage->borrowed = base;
    storage->borrowed_numel = numel;
    storage->borrowed_owner = owner;
  }
  storage->from_allocator = true;  // torch memory: a result over it can be handed out
  if (current_allocator) current_allocator->adopt(r);
  return tensor_over(storage, Shape(r.sizes().begin(), r.sizes().end()),
                     std::vector<int64_t>(r.strides().begin(), r.strides().end()),
                     r.storage_offset());
}

// Registers a Python function that takes a list of tensors and returns a list of tensors (made
// by python/kiln/_tracer.py for each eager fallback it records) and returns its number.
int register_eager(nb::callable callable) {
  // The registry may outlive the interpreter (it is destroyed with the process's statics): the
  // last reference is dropped only while Python still runs.
  std::shared_ptr<PyObject> held(callable.release().ptr(), [](PyObject* o) {
    if (!Py_IsInitialized()) return;
    nb::gil_scoped_acquire gil;
    Py_DECREF(o);
  });
  return register_eager_function([held](const std::vector<TensorHandle>& inputs) {
    nb::gil_scoped_acquire gil;
    nb::handle fn(held.get());
    nb::list args;
    for (const TensorHandle& t : inputs)
      args.append(nb::steal(THPVariable_Wrap(torch_view(*t))));
    nb::object out = fn(args);
    std::vector<TensorHandle> results;
    for (nb::handle r : out) {
      if (!THPVariable_Check(r.ptr()))
        throw UnsupportedError("kiln: an op run by PyTorch returned something other than tensors");
      results.push_back(kiln_view(THPVariable_Unpack(r.ptr())));
    }
    return results;
  });
}

// ---- steps without a kernel, run by PyTorch op by op (kiln._torch_steps)
// ---------------------------------

// A constant operand as the Python value its printed form stands for (kiln._torch_steps parses
// and caches the text: None, 3, 2.5, torch.float32, [1, 2], "floor", (slice(1, None, None), 0)).
nb::object python_constant(const Constant& c) {
  if (is_none(c)) return nb::none();
  if (const auto* b = std::get_if<bool>(&c)) return nb::bool_(*b);
  if (const auto* i = std::get_if<int64_t>(&c)) return nb::int_(*i);
  if (const auto* d = std::get_if<double>(&c)) return nb::float_(*d);
  // Never released: a static nb::object would be destroyed after the interpreter at exit.
  static nb::handle constant =
      nb::object(nb::module_::import_("kiln._torch_steps").attr("constant")).release();
  return constant(constant_str(c));
}

// Runs a step's nodes in order through PyTorch, on the tensors where they are (device memory
// included): every step of a CUDA program stays on the device, and a CPU step runs ATen's
// kernels (a matrix product through its BLAS) instead of kiln's reference interpreter.
// A step that is one matrix product and the views around it (library_step.h; on the CPU no
// kernel lowers them) runs through ATen's C++ API, without Python: the Python step runner costs
// tens of microseconds a call. The product is fresh memory, never a view of an input (a step's
// values are SSA values).
TensorHandle aten_matrix_product(const Node& node, const std::vector<RtValue>& operands) {
  if (node.id() != OpId::kMatmul && node.id() != OpId::kBmm && node.id() != OpId::kLinear)
    return nullptr;
  std::vector<at::Tensor> args;
  for (const RtValue& v : operands)
    if (const auto* t = std::get_if<TensorHandle>(&v))
      args.push_back(torch_view(**t));  // else: no bias
  at::Tensor out;
  if (node.id() == OpId::kMatmul)
    out = at::matmul(args.at(0), args.at(1));
  else if (node.id() == OpId::kBmm)
    out = at::bmm(args.at(0), args.at(1));
  else
    out = at::linear(args.at(0), args.at(1),
                     args.size() > 2 ? std::optional<at::Tensor>(args[2]) : std::nullopt);
  for (const at::Tensor& a : args)
    if (out.numel() && a.numel() && out.storage().is_alias_of(a.storage())) out = out.clone();
  return kiln_view(out);
}

std::optional<std::vector<RtValue>> run_matrix_product(const Trace& body,
                                                       const std::vector<RtValue>& inputs) {
  // A reshape no view expresses copies through ATen (on the tensor's device and stream).
  TensorHandle out = run_library_body(body, inputs, aten_matrix_product, [](const RtTensor& t) {
    return kiln_view(torch_view(t).clone(at::MemoryFormat::Contiguous));
  });
  if (!out) return std::nullopt;
  return std::vector<RtValue>{out};
}

std::vector<RtValue> run_step_with_torch(const Trace& body, const std::vector<RtValue>& inputs) {
  if (std::optional<std::vector<RtValue>> product = run_matrix_product(body, inputs))
    return *product;
  nb::gil_scoped_acquire gil;
  static nb::handle run_node =
      nb::object(nb::module_::import_("kiln._torch_steps").attr("run_node")).release();
  static nb::handle detached =
      nb::object(nb::module_::import_("kiln._torch_steps").attr("detached")).release();
  std::unordered_map<const Value*, nb::object> env;
  auto python_value = [](const RtValue& v) -> nb::object {
    if (const auto* s = std::get_if<RtScalar>(&v))
      return std::visit([](auto x) { return nb::cast(x); }, *s);
    return nb::steal(THPVariable_Wrap(torch_view(*std::get<TensorHandle>(v))));
  };
  nb::list input_objects;
  for (size_t i = 0; i < inputs.size(); ++i) {
    env[body.inputs()[i]] = python_value(inputs[i]);
    input_objects.append(env[body.inputs()[i]]);
  }
  for (const auto& node : body.nodes()) {
    nb::list args;
    nb::dict kwargs;
    for (size_t i = 0; i < node->operands.size(); ++i) {
      const Operand& o = node->operands[i];
      const Param& p = node->op->params.at(i);
      nb::object value;
      if (o.is_value()) {
        value = env.at(o.value());
      } else if (o.is_value_list()) {
        nb::list list;
        for (const Value* v : o.values())
          list.append(env.at(v));
        value = list;
      } else {
        value = python_constant(o.constant());
      }
      if (p.keyword_only)
        kwargs[p.name.c_str()] = value;
      else
        args.append(value);
    }
    nb::object out = run_node(node->op->name, args, kwargs);
    if (node->outputs.size() == 1) {
      env[node->outputs[0]] = out;
    } else {
      nb::sequence outs = nb::borrow<nb::sequence>(out);
      for (size_t k = 0; k < node->outputs.size(); ++k)
        env[node->outputs[k]] = outs[k];
    }
  }
  // Results over memory of the inputs (a view op's output) are copied: the step's values are
  // SSA values, which later writes into the caller's memory must not change.
  nb::list outs;
  for (const Value* o : body.outputs())
    outs.append(env.at(o));
  nb::object results = detached(outs, input_objects);
  std::vector<RtValue> values;
  for (nb::handle r : results) {
    if (THPVariable_Check(r.ptr()))
      values.emplace_back(kiln_view(THPVariable_Unpack(r.ptr())));
    else if (PyBool_Check(r.ptr()))
      values.emplace_back(RtScalar(nb::cast<bool>(r)));
    else if (PyLong_Check(r.ptr()))
      values.emplace_back(RtScalar(nb::cast<int64_t>(r)));
    else
      values.emplace_back(RtScalar(nb::cast<double>(r)));
  }
  return values;
}

// A tensor of `dtype` with t's layout over the storage (no dispatcher call).
at::Tensor tensor_over_storage(const c10::Storage& storage, const RtTensor& t) {
  c10::DispatchKeySet keys(storage.device_type() == c10::DeviceType::CUDA ? c10::DispatchKey::CUDA
                                                                          : c10::DispatchKey::CPU);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(storage), keys, caffe2::TypeMeta::fromScalarType(torch_dtype(t.dtype())));
  impl->set_sizes_and_strides(std::vector<int64_t>(t.sizes.begin(), t.sizes.end()), t.strides,
                              t.offset);
  return at::Tensor(std::move(impl));
}

void* current_stream(const std::vector<RtValue>& values) {
  for (const RtValue& v : values) {
    const auto& t = std::get<TensorHandle>(v);
    if (t->device().kind == Device::Kind::kCuda) {
      const c10::impl::DeviceGuardImplInterface* cuda =
          c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
      return cuda->getStream(c10::Device(c10::DeviceType::CUDA, t->device().index)).native_handle();
    }
  }
  return nullptr;
}

// ---- the specialization key
// ----------------------------------------------------------------------

// What identifies a call: grad mode, the argument structure (a Python object: the number of
// positional arguments on the fast path, _jit.py's description otherwise), and per leaf either the
// tensor's dtype, layout, device, requires_grad, is_leaf, storage (by first-seen index) and object
// (by first-seen index), or the non-tensor value and its type (1, 1.0 and True trace differently).
struct CallKey {
  std::vector<int64_t> facts;
  std::vector<nb::object> values;  // the structure, then each non-tensor leaf
  size_t hash = 0;

  bool operator==(const CallKey& o) const {
    if (hash != o.hash || facts != o.facts || values.size() != o.values.size()) return false;
    for (size_t i = 0; i < values.size(); ++i)
      if (Py_TYPE(values[i].ptr()) != Py_TYPE(o.values[i].ptr()) || !values[i].equal(o.values[i]))
        return false;
    return true;
  }
};

struct CallKeyHash {
  size_t operator()(const CallKey& k) const { return k.hash; }
};

void mix(size_t& h, size_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
}

bool is_container(PyObject* o) {
  return PyList_Check(o) || PyTuple_Check(o) || PyDict_Check(o);
}

// The key of a call with these leaves; nullopt when a leaf is a container (the fast path hands
// such calls to Python, which flattens them). `tensor_leaves` receives the tensor leaves.
std::optional<CallKey> call_key(nb::handle structure, nb::handle leaves,
                                std::vector<PyObject*>& tensor_leaves) {
  CallKey key;
  key.facts.push_back(c10::GradMode::is_enabled());
  key.values.push_back(nb::borrow(structure));
  // First-seen numbers of storages and objects: a scan while there are few, then a hash map (a
  // module's call has hundreds of leaves; the scan made the key quadratic in them).
  struct FirstSeen {
    std::vector<const void*> order;
    std::unordered_map<const void*, int64_t> index;
    int64_t operator()(const void* item) {
      if (index.empty()) {
        for (size_t i = 0; i < order.size(); ++i)
          if (order[i] == item) return static_cast<int64_t>(i);
        order.push_back(item);
        if (order.size() > 16)
          for (size_t i = 0; i < order.size(); ++i)
            index.emplace(order[i], static_cast<int64_t>(i));
        return static_cast<int64_t>(order.size() - 1);
      }
      auto [it, added] = index.emplace(item, static_cast<int64_t>(index.size()));
      return it->second;
    }
  };
  FirstSeen storages, objects;
  PyObject* seq = leaves.ptr();
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  key.facts.reserve(static_cast<size_t>(n) * 24);
  tensor_leaves.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* leaf = items[i];
    if (THPVariable_Check(leaf)) {
      const at::Tensor& t = THPVariable_Unpack(leaf);
      tensor_leaves.push_back(leaf);
      key.facts.push_back(-1);  // a tensor
      key.facts.push_back(static_cast<int64_t>(t.scalar_type()));
      key.facts.push_back(static_cast<int64_t>(t.layout()));
      key.facts.push_back(static_cast<int64_t>(t.device().type()));
      key.facts.push_back(t.device().index());
      key.facts.push_back(t.dim());
      for (int64_t s : t.sizes())
        key.facts.push_back(s);
      for (int64_t s : t.strides())
        key.facts.push_back(s);
      key.facts.push_back(t.storage_offset());
      key.facts.push_back(t.requires_grad());
      key.facts.push_back(t.is_leaf());
      key.facts.push_back(storages(storage_identity(t, leaf)));
      key.facts.push_back(objects(leaf));
    } else if (is_container(leaf)) {
      return std::nullopt;
    } else {
      key.facts.push_back(-2);  // a value
      key.values.push_back(nb::borrow(leaf));
    }
  }
  size_t h = 0;
  for (int64_t f : key.facts)
    mix(h, std::hash<int64_t>()(f));
  for (const nb::object& v : key.values) {
    Py_hash_t vh = PyObject_Hash(v.ptr());
    if (vh == -1) {
      PyErr_Clear();
      throw UnsupportedError("kiln.jit: an argument of type " +
                             std::string(Py_TYPE(v.ptr())->tp_name) +
                             " is not hashable, so it cannot be part of the specialization key.");
    }
    mix(h, static_cast<size_t>(vh));
    mix(h, reinterpret_cast<size_t>(Py_TYPE(v.ptr())));
  }
  key.hash = h;
  return key;
}

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
    CallArgs call = make_args(tensor_leaves);
    arguments_timed.reset();
    TorchAllocator allocator;
    ExecutionStats stats;
    static const StepRunner torch_steps = run_step_with_torch;
    auto start = std::chrono::steady_clock::now();
    TorchAllocator* outer = current_allocator;  // an eager_call may run another kiln program
    current_allocator = &allocator;
    std::vector<RtValue> results;
    try {
      results = program->graphs.run(program->compiled, call.values,
                                    ExecuteOptions{&allocator, current_stream(call.values), &stats,
                                                   /*pattern_known=*/true, &torch_steps});
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
    auto arg = call.storage_arg.find(t->storage.get());
    if (arg != call.storage_arg.end()) {
      const at::Tensor& base =
          THPVariable_Unpack(call.objects.at(static_cast<size_t>(arg->second)));
      at::Tensor view = base.as_strided(std::vector<int64_t>(t->sizes.begin(), t->sizes.end()),
                                        t->strides, t->offset);
      return nb::steal(THPVariable_Wrap(view));
    }
    const c10::Storage* storage = allocator.storage_of(*t->storage);
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
  m.def("call_phase_seconds", &call_profile::seconds,
        "Host seconds so far in each phase of kiln.jit calls, as (phase, seconds) pairs; counted "
        "only when KILN_PROFILE_CALLS is set (see src/kiln/support/call_profile.h).");
  kiln::python::bind_dict_watch(m);
  m.def("register_eager", &register_eager, nb::arg("fn"),
        "Registers fn(list of tensors) -> list of tensors for eager_call; returns its number.");
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
        d["library_steps"] = s.library_steps;
        d["interpreted_steps"] = s.interpreted_steps;
        d["eager_steps"] = s.eager_steps;
        d["torch_steps"] = s.torch_steps;
        d["writebacks_in_kernel"] = s.writebacks_in_kernel;
        d["writebacks_copied"] = s.writebacks_copied;
        d["layout_copies"] = s.layout_copies;
        d["layout_copy_bytes"] = s.layout_copy_bytes;
        d["host_copies"] = s.host_copies;
        d["host_copy_bytes"] = s.host_copy_bytes;
        d["graph_captures"] = s.graph_captures;
        d["graph_replays"] = s.graph_replays;
        return d;
      });
}
