// The specialization key of a kiln.jit call (kiln._C): what a cached program is looked up by.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace kiln::pyext {

namespace nb = nanobind;

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

// The key of a call with these leaves; nullopt when a leaf is a container (the fast path hands
// such calls to Python, which flattens them). `tensor_leaves` receives the tensor leaves.
std::optional<CallKey> call_key(nb::handle structure, nb::handle leaves,
                                std::vector<PyObject*>& tensor_leaves);

}  // namespace kiln::pyext
