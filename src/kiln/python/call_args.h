// One call's tensor leaves as kiln values: one Storage per distinct storage, one TensorHandle per
// distinct tensor object, over the caller's memory (no copy). ArgumentPool keeps a program's
// from one call to the next: a call that hits a program's key has the same leaves' dtypes,
// layouts and sharing, so only the memory they point at changes. Making them afresh cost four
// allocations a tensor (its Storage, its RtTensor, its sizes and strides), a third of an
// optimizer step's host time over 50 parameters (bench/NOTES.md, session 25).
#pragma once

#include <Python.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln::pyext {

struct CallArgs {
  std::vector<RtValue> values;     // per tensor leaf
  std::vector<PyObject*> objects;  // the caller's objects, per tensor leaf (borrowed)
  // The first tensor leaf over each storage, sorted by storage.
  std::vector<std::pair<const Storage*, int>> storage_arg;
  // The leaf a storage is first seen at, or -1 when no leaf is over it.
  int first_leaf_over(const Storage* storage) const;

  // Per distinct tensor object: its first leaf, how many leaves are it, and how many distinct
  // objects share its storage (how many handles a reused argument may have: ArgumentPool).
  struct Object {
    size_t first_leaf = 0;
    long leaves = 0;
    long objects_on_storage = 0;
  };
  std::vector<Object> distinct;
};

CallArgs make_args(const std::vector<PyObject*>& tensor_leaves);

// The arguments of a program's last call, reused by its next one where nothing else holds them.
// Requires: every call of one pool has the same specialization key (the pool is its program's).
class ArgumentPool {
 public:
  // The arguments for these leaves: the kept ones over the leaves' memory, or new ones.
  CallArgs take(const std::vector<PyObject*>& tensor_leaves);
  // Keeps a call's arguments for the next call (once the call's results no longer use them).
  void give_back(CallArgs call) { kept_ = std::move(call); }

 private:
  std::optional<CallArgs> kept_;
};

}  // namespace kiln::pyext
