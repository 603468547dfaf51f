#include "kiln/python/call_key.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>

#include "kiln/python/first_seen.h"
#include "kiln/python/torch_values.h"
#include "kiln/support/error.h"

namespace kiln::pyext {

namespace {

void mix(size_t& h, size_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
}

bool is_container(PyObject* o) {
  return PyList_Check(o) || PyTuple_Check(o) || PyDict_Check(o);
}

}  // namespace

// The key of a call with these leaves; nullopt when a leaf is a container (the fast path hands
// such calls to Python, which flattens them). `tensor_leaves` receives the tensor leaves.
std::optional<CallKey> call_key(nb::handle structure, nb::handle leaves,
                                std::vector<PyObject*>& tensor_leaves) {
  CallKey key;
  PyObject* seq = leaves.ptr();
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  key.facts.reserve(static_cast<size_t>(n) * 24 + 1);
  key.facts.push_back(c10::GradMode::is_enabled());
  key.values.push_back(nb::borrow(structure));
  // First-seen numbers of storages and objects (tables this thread reuses: call_key never
  // runs inside itself).
  thread_local FirstSeenNumbers storages, objects;
  PyObject** items = PySequence_Fast_ITEMS(seq);
  storages.reset(static_cast<size_t>(n));
  objects.reset(static_cast<size_t>(n));
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

}  // namespace kiln::pyext
