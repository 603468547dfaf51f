// kiln._C: the nanobind extension behind kiln.jit (issue 5). It compiles trace text for the alias
// pattern of a call's tensors, and runs the compiled program on PyTorch tensors without copying
// them. PyTorch is not linked: Python passes each tensor as plain numbers (its storage's base
// address and size, its layout, its object id), tensors on one storage become views of ONE kiln
// Storage over the borrowed memory (so aliasing and object identity are what the caller has), and
// the tensors kiln makes come from a Python callback (torch.empty) through an Allocator, so that
// outputs are torch memory. Results go back as descriptions that python/kiln/_jit.py turns into
// the caller's own objects, real views of them, or views of the allocated buffers.
// A CUDA tensor passes its device address (Storage::device_data), the allocator hands out
// torch.empty(..., device="cuda:N") blocks, and kernels run on the stream Python names (PyTorch's
// current stream), so that kiln's work is ordered with the caller's.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/ir/parser.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/executor.h"
#include "kiln/support/error.h"

namespace nb = nanobind;

namespace kiln {
namespace {

// One tensor argument as Python describes it (see _jit.py `_describe`):
// (dtype name, sizes, strides, storage offset, storage base address (host or device), storage
//  size in elements, id of the tensor object, CUDA device index or -1 for the CPU).
using TensorArg = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>, int64_t,
                             uintptr_t, int64_t, uintptr_t, int>;

// The kiln view of a call's tensors: one Storage per distinct storage address (an empty storage,
// address 0, is its tensor's own), one TensorHandle per distinct tensor object.
struct CallArgs {
  std::vector<RtValue> values;
  std::map<const Storage*, int> storage_arg;  // a storage -> the first argument on it
};

std::shared_ptr<void> borrowed_device_memory() {
  static const std::shared_ptr<void> token = std::make_shared<int>(0);
  return token;
}

CallArgs make_args(const std::vector<TensorArg>& descs) {
  CallArgs call;
  std::map<uintptr_t, std::shared_ptr<Storage>> storages;
  std::map<uintptr_t, TensorHandle> objects;
  for (size_t i = 0; i < descs.size(); ++i) {
    const auto& [dtype_text, sizes, strides, offset, base, numel, object, device] = descs[i];
    auto found = objects.find(object);
    if (found != objects.end()) {
      call.values.emplace_back(found->second);
      continue;
    }
    std::optional<DType> dtype = dtype_from_name(dtype_text);
    if (!dtype) throw UnsupportedError("kiln: unsupported dtype " + dtype_text);
    std::shared_ptr<Storage>& storage = storages[base ? base : object];
    if (!storage) {
      storage = std::make_shared<Storage>();
      storage->dtype = *dtype;
      if (device < 0) {
        storage->borrowed = reinterpret_cast<std::byte*>(base);
        storage->borrowed_numel = numel;
      } else {
        // The caller's tensor keeps the memory alive for the call; the owner only marks the
        // storage as a device one (Storage::on_device).
        storage->device = Device::cuda(device);
        storage->device_data = base;
        storage->device_numel = numel;
        storage->device_owner = borrowed_device_memory();
      }
      call.storage_arg[storage.get()] = static_cast<int>(i);
    } else if (storage->dtype != *dtype) {
      throw UnsupportedError(
          "kiln: two arguments share memory with different dtypes; kiln does not support that.");
    }
    TensorHandle t = tensor_over(storage, Shape(sizes.begin(), sizes.end()), strides, offset);
    objects[object] = t;
    call.values.emplace_back(t);
  }
  return call;
}

// Blocks from empty(nbytes, device) (torch.empty(nbytes, dtype=torch.uint8, device=...), so
// PyTorch's caching allocator on CUDA): each keeps its torch tensor alive for as long as a kiln
// Storage uses it, and is remembered by address so that a result can name its buffer.
class TorchAllocator : public Allocator {
 public:
  explicit TorchAllocator(nb::callable empty) : empty_(std::move(empty)) {}
  Block allocate(Device device, size_t bytes) override {
    int index = device.kind == Device::Kind::kCuda ? device.index : -1;
    // At least 16 bytes, so that a zero-size tensor still gets an address.
    nb::object buffer = empty_(std::max<size_t>(bytes, 16), index);
    auto address = nb::cast<uintptr_t>(buffer.attr("data_ptr")());
    buffers_[address] = buffer;
    std::shared_ptr<void> owner(new nb::object(buffer), [](void* p) {
      nb::gil_scoped_acquire gil;
      delete static_cast<nb::object*>(p);
    });
    if (index >= 0) return Block{nullptr, address, owner};
    return Block{reinterpret_cast<std::byte*>(address), 0, owner};
  }
  nb::object buffer_of(const Storage& s) const {
    auto address = s.on_device() ? static_cast<uintptr_t>(s.device_data)
                                 : reinterpret_cast<uintptr_t>(s.borrowed);
    auto it = buffers_.find(address);
    return it == buffers_.end() ? nb::none() : it->second;
  }

 private:
  nb::callable empty_;
  std::map<uintptr_t, nb::object> buffers_;
};

// A compiled program and the facts Python reports about it.
struct Program {
  CompiledProgram compiled;
  double compile_seconds = 0;
};

Program compile_program(const std::string& text, const std::vector<TensorArg>& descs) {
  auto start = std::chrono::steady_clock::now();
  Trace trace = parse_trace(text, "<kiln.jit>");
  CallArgs call = make_args(descs);
  Program p{compile(trace, alias_pattern_of(call.values)), 0};
  p.compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return p;
}

// Runs `program` on the described tensors. Returns (results, metadata, stats):
//  results: per returned value, one of
//    ("input", arg)                                 the caller's own object
//    ("view", arg, sizes, strides, offset)          a view of argument arg's storage
//    ("fresh", buffer, dtype, sizes, strides, offset) a view of a torch.empty buffer
//    ("number", value)
//  metadata: (arg, sizes, strides, offset) for each input whose tensor object changed layout.
// `stream`: the CUstream CUDA work goes on (PyTorch's current stream; 0 for the CPU or the
// default stream).
nb::tuple run_program(const Program& program, const std::vector<TensorArg>& descs,
                      nb::callable empty, uintptr_t stream) {
  CallArgs call = make_args(descs);
  TorchAllocator allocator(std::move(empty));
  ExecutionStats stats;
  std::vector<RtValue> results = execute(
      program.compiled, call.values,
      ExecuteOptions{&allocator, reinterpret_cast<void*>(stream), &stats});

  auto layout = [](const RtTensor& t) {
    return nb::make_tuple(std::vector<int64_t>(t.sizes.begin(), t.sizes.end()), t.strides,
                          t.offset);
  };
  nb::list out;
  for (const RtValue& v : results) {
    if (const auto* s = std::get_if<RtScalar>(&v)) {
      nb::object number = std::visit([](auto x) { return nb::cast(x); }, *s);
      out.append(nb::make_tuple("number", number));
      continue;
    }
    const TensorHandle& t = std::get<TensorHandle>(v);
    bool done = false;
    for (size_t i = 0; i < call.values.size() && !done; ++i) {
      if (std::get<TensorHandle>(call.values[i]) == t) {
        out.append(nb::make_tuple("input", i));
        done = true;
      }
    }
    if (done) continue;
    auto arg = call.storage_arg.find(t->storage.get());
    nb::tuple l = layout(*t);
    if (arg != call.storage_arg.end()) {
      out.append(nb::make_tuple("view", arg->second, l[0], l[1], l[2]));
      continue;
    }
    nb::object buffer = allocator.buffer_of(*t->storage);
    KILN_ASSERT(!buffer.is_none()) << "a fresh result is not in memory from the torch allocator";
    out.append(
        nb::make_tuple("fresh", buffer, std::string(dtype_name(t->dtype())), l[0], l[1], l[2]));
  }
  nb::list metadata;
  for (const MetadataUpdate& m : program.compiled.interface.metadata) {
    const RtTensor& t = *std::get<TensorHandle>(call.values.at(static_cast<size_t>(m.arg)));
    nb::tuple l = layout(t);
    metadata.append(nb::make_tuple(m.arg, l[0], l[1], l[2]));
  }
  nb::dict st;
  st["kernel_steps"] = stats.kernel_steps;
  st["library_steps"] = stats.library_steps;
  st["interpreted_steps"] = stats.interpreted_steps;
  st["writebacks_in_kernel"] = stats.writebacks_in_kernel;
  st["writebacks_copied"] = stats.writebacks_copied;
  return nb::make_tuple(out, metadata, st);
}

}  // namespace
}  // namespace kiln

NB_MODULE(_C, m) {
  using namespace kiln;
  nb::exception<UserError>(m, "UserError", PyExc_RuntimeError);
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
      .def_prop_ro("compile_seconds", [](const Program& p) { return p.compile_seconds; });
  m.def("compile", &compile_program, nb::arg("text"), nb::arg("tensors"),
        "Compiles trace text for the alias pattern of the described tensors.");
  m.def("run", &run_program, nb::arg("program"), nb::arg("tensors"), nb::arg("empty"),
        nb::arg("stream"),
        "Runs a program on the described tensors; see module.cpp for the result format.");
}
