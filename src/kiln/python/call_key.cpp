#include "kiln/python/call_key.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>
#include <unordered_map>

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

}  // namespace kiln::pyext
