// fill_, zero_ and copy_. (The in-place elementwise ops live in elementwise.cpp, the metadata
// mutations with the views in ref_views.cpp.)
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

// Tensor.item(): a 0-dim tensor's value as the Python number of its dtype's kind.
RtScalar item(const RtTensor& t) {
  int64_t i = t.storage_index({});
  if (is_floating(t.dtype())) return t.storage->load_double(i);
  if (t.dtype() == DType::kBool) return t.storage->load_int(i) != 0;
  return t.storage->load_int(i);
}

// fill_ does not check for overlap: ATen builds its TensorIterator with check_mem_overlap(false)
// because filling is idempotent, so `x.expand(3, 3).fill_(1)` works in eager.
void fill(RtTensor& t, const RtScalar& value) {
  for (int64_t i : t.element_indices())
    store_scalar(*t.storage, i, value);
}

}  // namespace

// A number or a 0-dim tensor (read before anything is written, so it may alias the target).
RtScalar fill_value(const Env& env, const Operand& value) {
  if (value.is_value() && value.value()->is_tensor()) return item(*env.tensor(value));
  return env.number(value);
}

void ref_Fill_(Env& env, const Node& node) {
  const TensorHandle& self = env.tensor(node.arg(0));
  fill(*self, fill_value(env, node.arg(1)));
  env.bind(node.outputs[0], self);
}

void ref_Zero_(Env& env, const Node& node) {
  const TensorHandle& self = env.tensor(node.arg(0));
  fill(*self, int64_t{0});
  env.bind(node.outputs[0], self);
}

void ref_Copy_(Env& env, const Node& node) {
  const TensorHandle& self = env.tensor(node.arg(0));
  copy_into(*self, *env.tensor(node.arg(1)));
  env.bind(node.outputs[0], self);
}

}  // namespace kiln
