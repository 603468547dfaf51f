// Joins (cat, stack) and the matrix products (matmul, bmm, linear). All return contiguous
// tensors, as ATen does; products accumulate in double for floating dtypes and int64 otherwise.
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/runtime/interpreter/view_geometry.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

const TensorType& output_type(const Node& node) {
  return node.outputs[0]->tensor_type();
}

TensorHandle new_output(const Node& node) {
  const TensorType& t = output_type(node);
  return empty_strided(t.dtype, t.shape, contiguous_strides(t.shape), t.device);
}

}  // namespace

// ---- joins --------------------------------------------------------------------------------------

void ref_Cat(Env& env, const Node& node) {
  TensorHandle out = new_output(node);
  int64_t d = wrap_dim(node.arg("dim").as_int(), out->rank());
  int64_t start = 0;
  for (Value* v : node.arg("tensors").values()) {
    const TensorHandle& t = env.tensor(v);
    int64_t length = t->sizes[static_cast<size_t>(d)];
    TensorHandle slot = view_of(out, narrow_geometry(geometry_of(*out), d, start, length));
    copy_into(*slot, *t);  // converts to the promoted dtype
    start += length;
  }
  env.bind(node.outputs[0], out);
}

void ref_Stack(Env& env, const Node& node) {
  TensorHandle out = new_output(node);
  int64_t d = wrap_dim(node.arg("dim").as_int(), out->rank());
  int64_t i = 0;
  for (Value* v : node.arg("tensors").values()) {
    TensorHandle slot = view_of(out, select_geometry(geometry_of(*out), d, i++));
    copy_into(*slot, *env.tensor(v));
  }
  env.bind(node.outputs[0], out);
}

// ---- matrix products ----------------------------------------------------------------------------

namespace {

// Batched a @ b for geometries of rank >= 2 over a common broadcast batch: [..., n, k] @
// [..., k, m] -> row-major [..., n, m] values.
template <class T>
std::vector<T> batched_product(const RtTensor& a, Geometry ga, const RtTensor& b, Geometry gb) {
  Shape batch_a(ga.sizes.begin(), ga.sizes.end() - 2),
      batch_b(gb.sizes.begin(), gb.sizes.end() - 2);
  Shape batch = broadcast_shapes(batch_a, batch_b);
  int64_t n = ga.sizes[ga.sizes.size() - 2], k = ga.sizes.back(), m = gb.sizes.back();
  auto expand_to = [&](const Geometry& g, int64_t rows, int64_t cols) {
    IntList sizes(batch.begin(), batch.end());
    sizes.push_back(rows);
    sizes.push_back(cols);
    return expand_geometry(g, sizes);
  };
  ga = expand_to(ga, n, k);
  gb = expand_to(gb, k, m);
  auto load = [](const RtTensor& t, const Geometry& g) {
    std::vector<T> v;
    for (int64_t i : element_indices(g.sizes, g.strides, g.offset)) {
      if constexpr (std::is_same_v<T, double>)
        v.push_back(t.storage->load_double(i));
      else
        v.push_back(t.storage->load_int(i));
    }
    return v;
  };
  std::vector<T> av = load(a, ga), bv = load(b, gb);
  int64_t batches = shape_numel(batch);
  std::vector<T> out(static_cast<size_t>(batches * n * m));
  for (int64_t p = 0; p < batches; ++p) {
    const T* A = av.data() + p * n * k;
    const T* B = bv.data() + p * k * m;
    T* C = out.data() + p * n * m;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        T acc = 0;
        for (int64_t q = 0; q < k; ++q)
          acc += A[i * k + q] * B[q * m + j];
        C[i * m + j] = acc;
      }
    }
  }
  return out;
}

// torch.matmul's rank cases: a 1-D left operand is a row [1, k], a 1-D right operand a column
// [k, 1], and the added dims are dropped from the result (the type rule's shape).
template <class T>
std::vector<T> matmul_values(const RtTensor& a, const RtTensor& b) {
  Geometry ga = geometry_of(a), gb = geometry_of(b);
  if (a.rank() == 1) ga = unsqueeze_geometry(ga, 0);
  if (b.rank() == 1) gb = unsqueeze_geometry(gb, 1);
  return batched_product<T>(a, ga, b, gb);
}

void store_all(RtTensor& out, const std::vector<double>& dv, const std::vector<int64_t>& iv) {
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (is_floating(out.dtype()))
      out.storage->store_double(i, dv[static_cast<size_t>(i)]);
    else
      out.storage->store_int(i, iv[static_cast<size_t>(i)]);
  }
}

void matmul_node(Env& env, const Node& node, const RtTensor& a, const RtTensor& b) {
  TensorHandle out = new_output(node);
  std::vector<double> dv;
  std::vector<int64_t> iv;
  if (is_floating(out->dtype()))
    dv = matmul_values<double>(a, b);
  else
    iv = matmul_values<int64_t>(a, b);
  store_all(*out, dv, iv);
  env.bind(node.outputs[0], out);
}

}  // namespace

void ref_Matmul(Env& env, const Node& node) {
  matmul_node(env, node, *env.tensor(node.arg(0)), *env.tensor(node.arg(1)));
}

void ref_Bmm(Env& env, const Node& node) {
  matmul_node(env, node, *env.tensor(node.arg(0)), *env.tensor(node.arg(1)));
}

// input @ weight.T + bias, the bias broadcast over the leading dims.
void ref_Linear(Env& env, const Node& node) {
  const RtTensor& x = *env.tensor(node.arg("input"));
  const TensorHandle& w = env.tensor(node.arg("weight"));
  RtTensor wt = *w;
  Geometry g = t_geometry(geometry_of(wt));
  wt.sizes = g.sizes;
  wt.strides = g.strides;
  TensorHandle out = new_output(node);
  const Operand& bias = node.arg("bias");
  std::vector<int64_t> bias_idx;
  if (!bias.is_none()) {
    const RtTensor& bt = *env.tensor(bias);
    bias_idx = element_indices(out->sizes, broadcast_strides(bt, out->sizes), bt.offset);
  }
  std::vector<double> dv;
  std::vector<int64_t> iv;
  if (is_floating(out->dtype())) {
    dv = matmul_values<double>(x, wt);
    for (size_t i = 0; i < bias_idx.size(); ++i)
      dv[i] += env.tensor(bias)->storage->load_double(bias_idx[i]);
  } else {
    iv = matmul_values<int64_t>(x, wt);
    for (size_t i = 0; i < bias_idx.size(); ++i)
      iv[i] += env.tensor(bias)->storage->load_int(bias_idx[i]);
  }
  store_all(*out, dv, iv);
  env.bind(node.outputs[0], out);
}

}  // namespace kiln
