// Creation ops. full/zeros/ones/arange are contiguous; the *_like ops and fill keep their input's
// layout (memory_format=torch.preserve_format), which later views can observe.
#include "kiln/runtime/interpreter/layout.h"
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

const TensorType& output_type(const Node& node) {
  return node.outputs[0]->tensor_type();
}

void create(Env& env, const Node& node, const Strides& strides, const RtScalar& value) {
  const TensorType& type = output_type(node);
  TensorHandle t = empty_strided(type.dtype, type.shape, strides, type.device);
  for (int64_t i : t->element_indices())
    store_scalar(*t->storage, i, value);
  env.bind(node.outputs[0], t);
}

void create_contiguous(Env& env, const Node& node, const RtScalar& value) {
  create(env, node, contiguous_strides(output_type(node).shape), value);
}

void create_like(Env& env, const Node& node, const RtScalar& value) {
  create(env, node, strides_like(*env.tensor(node.arg(0))), value);
}

}  // namespace

void ref_Full(Env& env, const Node& node) {
  create_contiguous(env, node, env.number(node.arg("fill_value")));
}
void ref_Zeros(Env& env, const Node& node) {
  create_contiguous(env, node, int64_t{0});
}
void ref_Ones(Env& env, const Node& node) {
  create_contiguous(env, node, int64_t{1});
}

void ref_FullLike(Env& env, const Node& node) {
  create_like(env, node, env.number(node.arg("fill_value")));
}
void ref_ZerosLike(Env& env, const Node& node) {
  create_like(env, node, int64_t{0});
}
void ref_OnesLike(Env& env, const Node& node) {
  create_like(env, node, int64_t{1});
}
// Uninitialized memory in eager; zeros here, so that runs are reproducible.
void ref_EmptyLike(Env& env, const Node& node) {
  create_like(env, node, int64_t{0});
}

// torch.fill(self, value) is empty_like(self).fill_(value).
void ref_Fill(Env& env, const Node& node) {
  create_like(env, node, fill_value(env, node.arg("value")));
}

// ATen computes start + step * i in the output's accumulation type: double for floating dtypes,
// int64 for integral ones (where float bounds are truncated first).
void ref_Arange(Env& env, const Node& node) {
  const TensorType& type = output_type(node);
  RtScalar start = env.number(node.arg("start")), step = env.number(node.arg("step"));
  TensorHandle t =
      empty_strided(type.dtype, type.shape, contiguous_strides(type.shape), type.device);
  for (int64_t i = 0; i < t->numel(); ++i) {
    if (is_floating(type.dtype)) {
      t->storage->store_double(
          i, scalar_to_double(start) + scalar_to_double(step) * static_cast<double>(i));
    } else {
      t->storage->store_int(i, scalar_to_int(start) + scalar_to_int(step) * i);
    }
  }
  env.bind(node.outputs[0], t);
}

}  // namespace kiln
