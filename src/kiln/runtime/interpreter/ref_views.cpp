// Views, metadata mutations and the scatters that invert views. A view is a new tensor object
// over the same storage; a metadata mutation changes the tensor object itself (the caller sees
// it); a scatter is a copy of its input with the viewed positions overwritten.
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/runtime/interpreter/view_geometry.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

const TensorHandle& self_of(const Env& env, const Node& node) {
  return env.tensor(node.arg(0));
}
Geometry self_geometry(const Env& env, const Node& node) {
  return geometry_of(*self_of(env, node));
}
const Shape& output_shape(const Node& node, size_t i = 0) {
  return node.outputs.at(i)->tensor_type().shape;
}

void bind_view(Env& env, const Node& node, const Geometry& g) {
  env.bind(node.outputs[0], view_of(self_of(env, node), g));
}

// reshape: a view when the strides allow one, else a view of a contiguous copy.
TensorHandle reshape(const TensorHandle& self, const Shape& shape) {
  if (auto g = view_geometry(geometry_of(*self), shape)) return view_of(self, *g);
  TensorHandle copy = clone(*self);
  auto g = view_geometry(geometry_of(*copy), shape);
  KILN_ASSERT(g.has_value()) << "a contiguous tensor must be viewable as any shape of its numel";
  return view_of(copy, *g);
}

std::optional<int64_t> optional_int(const Node& node, std::string_view name) {
  return node.arg(name).as_optional_int();
}

}  // namespace

// ---- views ------------------------------------------------------------------------------------

void ref_View(Env& env, const Node& node) {
  std::optional<Geometry> g = view_geometry(self_geometry(env, node), output_shape(node));
  KILN_CHECK(g.has_value())
      << "view size is not compatible with input tensor's size and stride (at least one "
         "dimension spans across two contiguous subspaces). Use .reshape(...) instead.";
  bind_view(env, node, *g);
}

void ref_Reshape(Env& env, const Node& node) {
  env.bind(node.outputs[0], reshape(self_of(env, node), output_shape(node)));
}

void ref_Permute(Env& env, const Node& node) {
  bind_view(env, node, permute_geometry(self_geometry(env, node), node.arg("dims").as_ints()));
}

void ref_Transpose(Env& env, const Node& node) {
  bind_view(env, node,
            transpose_geometry(self_geometry(env, node), node.arg("dim0").as_int(),
                               node.arg("dim1").as_int()));
}

void ref_T(Env& env, const Node& node) {
  bind_view(env, node, t_geometry(self_geometry(env, node)));
}

void ref_Expand(Env& env, const Node& node) {
  bind_view(env, node, expand_geometry(self_geometry(env, node), node.arg("size").as_ints()));
}

void ref_Unsqueeze(Env& env, const Node& node) {
  bind_view(env, node, unsqueeze_geometry(self_geometry(env, node), node.arg("dim").as_int()));
}

void ref_Squeeze(Env& env, const Node& node) {
  bind_view(env, node,
            squeeze_geometry(self_geometry(env, node), node.arg("dim").as_optional_ints()));
}

void ref_Flatten(Env& env, const Node& node) {
  const TensorHandle& self = self_of(env, node);
  if (self->rank() > 0) {
    int64_t s = wrap_dim(node.arg("start_dim").as_int(), self->rank());
    int64_t e = wrap_dim(node.arg("end_dim").as_int(), self->rank());
    // ATen's flatten returns the tensor itself (the same object) when there is nothing to merge.
    if (s == e) {
      env.bind(node.outputs[0], self);
      return;
    }
  }
  env.bind(node.outputs[0], reshape(self, output_shape(node)));
}

void ref_Unflatten(Env& env, const Node& node) {
  ref_View(env, node);
}

void ref_Slice(Env& env, const Node& node) {
  bind_view(env, node,
            slice_geometry(self_geometry(env, node), node.arg("dim").as_int(),
                           optional_int(node, "start"), optional_int(node, "end"),
                           node.arg("step").as_int()));
}

void ref_Narrow(Env& env, const Node& node) {
  bind_view(env, node,
            narrow_geometry(self_geometry(env, node), node.arg("dim").as_int(),
                            node.arg("start").as_int(), node.arg("length").as_int()));
}

void ref_Select(Env& env, const Node& node) {
  bind_view(env, node,
            select_geometry(self_geometry(env, node), node.arg("dim").as_int(),
                            node.arg("index").as_int()));
}

void ref_Diagonal(Env& env, const Node& node) {
  bind_view(env, node,
            diagonal_geometry(self_geometry(env, node), node.arg("offset").as_int(),
                              node.arg("dim1").as_int(), node.arg("dim2").as_int()));
}

void ref_AsStrided(Env& env, const Node& node) {
  bind_view(
      env, node,
      as_strided_geometry(self_geometry(env, node), node.arg("size").as_ints(),
                          node.arg("stride").as_ints(), optional_int(node, "storage_offset")));
}

namespace {
// split / chunk: consecutive narrows along `dim`, with the piece sizes the type rule chose.
void split_along(Env& env, const Node& node, int64_t dim) {
  const TensorHandle& self = self_of(env, node);
  int64_t d = wrap_dim(dim, self->rank());
  int64_t start = 0;
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    int64_t length = output_shape(node, i)[static_cast<size_t>(d)];
    env.bind(node.outputs[i], view_of(self, narrow_geometry(geometry_of(*self), d, start, length)));
    start += length;
  }
}
}  // namespace

void ref_Split(Env& env, const Node& node) {
  split_along(env, node, node.arg("dim").as_int());
}
void ref_Chunk(Env& env, const Node& node) {
  split_along(env, node, node.arg("dim").as_int());
}

void ref_Unbind(Env& env, const Node& node) {
  const TensorHandle& self = self_of(env, node);
  int64_t d = node.arg("dim").as_int();
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    env.bind(node.outputs[i],
             view_of(self, select_geometry(geometry_of(*self), d, static_cast<int64_t>(i))));
  }
}

void ref_Detach(Env& env, const Node& node) {
  bind_view(env, node, self_geometry(env, node));
}
void ref_Alias(Env& env, const Node& node) {
  bind_view(env, node, self_geometry(env, node));
}

// Tensor.view(dtype): the same memory and layout, each element's bytes read as `dtype`.
void ref_ViewDtype(Env& env, const Node& node) {
  env.bind(node.outputs[0], reinterpret_as(*self_of(env, node), node.arg("dtype").as_dtype()));
}

// bitcast: a fresh contiguous copy of those bytes (clone copies equal dtypes byte for byte, so
// every bit pattern survives, a signaling NaN included).
void ref_Bitcast(Env& env, const Node& node) {
  env.bind(node.outputs[0],
           clone(*reinterpret_as(*self_of(env, node), node.arg("dtype").as_dtype())));
}

// ---- metadata mutations: the tensor object itself changes, and the output is that object -------

namespace {
void restride(Env& env, const Node& node, const Geometry& g) {
  const TensorHandle& self = self_of(env, node);
  set_geometry(*self, g);
  env.bind(node.outputs[0], self);
}
}  // namespace

void ref_T_(Env& env, const Node& node) {
  restride(env, node, t_geometry(self_geometry(env, node)));
}

void ref_Transpose_(Env& env, const Node& node) {
  restride(env, node,
           transpose_geometry(self_geometry(env, node), node.arg("dim0").as_int(),
                              node.arg("dim1").as_int()));
}

void ref_Unsqueeze_(Env& env, const Node& node) {
  restride(env, node, unsqueeze_geometry(self_geometry(env, node), node.arg("dim").as_int()));
}

void ref_Squeeze_(Env& env, const Node& node) {
  restride(env, node,
           squeeze_geometry(self_geometry(env, node), node.arg("dim").as_optional_ints()));
}

void ref_AsStrided_(Env& env, const Node& node) {
  restride(env, node,
           as_strided_geometry(self_geometry(env, node), node.arg("size").as_ints(),
                               node.arg("stride").as_ints(), optional_int(node, "storage_offset")));
}

// ---- scatters -----------------------------------------------------------------------------------

namespace {

// ATen's clone_preserve_strides (Note [*_scatter ops preserve strides]): the scatter's result has
// its input's sizes, strides and storage offset over a copy of the whole storage, so that a view
// replayed on it (functionalization's "read") behaves exactly as it did on the original, and
// as_strided offsets still name the same elements. An input with internal overlap cannot keep
// its layout (the copy_ below would raise) and is cloned contiguously instead.
TensorHandle clone_preserve_strides(const RtTensor& self) {
  bool overlapping = false;
  for (size_t d = 0; d < self.sizes.size(); ++d)
    overlapping = overlapping || (self.sizes[d] > 1 && self.strides[d] == 0);
  if (overlapping && !is_non_overlapping_and_dense(self.sizes, self.strides)) return clone(self);
  auto out = std::make_shared<RtTensor>(self);
  out->storage = std::make_shared<Storage>(*self.storage);
  return out;
}

// Writes src (argument 1) into the positions `view` selects of a copy of self.
template <class ViewFn>
void scatter(Env& env, const Node& node, ViewFn view) {
  TensorHandle out = clone_preserve_strides(*self_of(env, node));
  TensorHandle slot = view_of(out, view(geometry_of(*out)));
  copy_into(*slot, *env.tensor(node.arg(1)));
  env.bind(node.outputs[0], out);
}

}  // namespace

void ref_SliceScatter(Env& env, const Node& node) {
  scatter(env, node, [&](const Geometry& g) {
    return slice_geometry(g, node.arg("dim").as_int(), optional_int(node, "start"),
                          optional_int(node, "end"), node.arg("step").as_int());
  });
}

void ref_SelectScatter(Env& env, const Node& node) {
  scatter(env, node, [&](const Geometry& g) {
    return select_geometry(g, node.arg("dim").as_int(), node.arg("index").as_int());
  });
}

void ref_DiagonalScatter(Env& env, const Node& node) {
  scatter(env, node, [&](const Geometry& g) {
    return diagonal_geometry(g, node.arg("offset").as_int(), node.arg("dim1").as_int(),
                             node.arg("dim2").as_int());
  });
}

void ref_AsStridedScatter(Env& env, const Node& node) {
  scatter(env, node, [&](const Geometry& g) {
    return as_strided_geometry(g, node.arg("size").as_ints(), node.arg("stride").as_ints(),
                               optional_int(node, "storage_offset"));
  });
}

}  // namespace kiln
