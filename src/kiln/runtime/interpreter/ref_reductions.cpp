// Reductions. Their outputs are contiguous (ATen allocates them with at::empty); the input is
// converted to the output dtype first when a dtype is requested, floats accumulate in double and
// integers in int64 (wrapping).
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/ir/type_rules.h"
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/runtime/interpreter/view_geometry.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

// The input's elements grouped by output element: groups are consecutive runs of `group_size`
// storage indices, in row-major order of the kept dims, and each run lists the reduced elements
// in row-major order of the reduced dims (so a full argmax finds the flattened index).
struct Groups {
  std::vector<int64_t> indices;
  int64_t group_size = 1;
  int64_t count = 1;
};

Groups group_elements(const RtTensor& self, const Node& node) {
  std::vector<int64_t> reduced = reduction_dims(node.arg(1).as_optional_ints(), self.rank());
  IntList order;
  Groups g;
  for (int64_t d = 0; d < self.rank(); ++d) {
    bool r = std::find(reduced.begin(), reduced.end(), d) != reduced.end();
    if (!r) {
      order.push_back(d);
      g.count *= self.sizes[static_cast<size_t>(d)];
    }
  }
  for (int64_t d : reduced) {
    order.push_back(d);
    g.group_size *= self.sizes[static_cast<size_t>(d)];
  }
  Geometry p = permute_geometry(geometry_of(self), order);
  g.indices = element_indices(p.sizes, p.strides, p.offset);
  return g;
}

const TensorType& output_type(const Node& node) {
  return node.outputs[0]->tensor_type();
}

TensorHandle new_output(const Node& node) {
  const TensorType& t = output_type(node);
  return empty_strided(t.dtype, t.shape, contiguous_strides(t.shape), t.device);
}

// Reduces each group of the input, read as doubles rounded to `dtype`, with `fn(values)`.
template <class Fn>
void reduce_double(Env& env, const Node& node, DType dtype, Fn fn) {
  const RtTensor& self = *env.tensor(node.arg(0));
  Groups g = group_elements(self, node);
  TensorHandle out = new_output(node);
  std::vector<double> values(static_cast<size_t>(g.group_size));
  for (int64_t k = 0; k < g.count; ++k) {
    for (int64_t j = 0; j < g.group_size; ++j) {
      int64_t i = g.indices[static_cast<size_t>(k * g.group_size + j)];
      values[static_cast<size_t>(j)] = round_to_dtype(self.storage->load_double(i), dtype);
    }
    out->storage->store_double(k, fn(values));
  }
  env.bind(node.outputs[0], out);
}

template <class Fn>
void reduce_int(Env& env, const Node& node, DType dtype, Fn fn) {
  const RtTensor& self = *env.tensor(node.arg(0));
  Groups g = group_elements(self, node);
  TensorHandle out = new_output(node);
  std::vector<int64_t> values(static_cast<size_t>(g.group_size));
  for (int64_t k = 0; k < g.count; ++k) {
    for (int64_t j = 0; j < g.group_size; ++j) {
      int64_t i = g.indices[static_cast<size_t>(k * g.group_size + j)];
      values[static_cast<size_t>(j)] = cast_int_to_dtype(self.storage->load_int(i), dtype);
    }
    out->storage->store_int(k, fn(values));
  }
  env.bind(node.outputs[0], out);
}

double sum_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v)
    s += x;
  return s;
}

double mean_of(const std::vector<double>& v) {
  return sum_of(v) / static_cast<double>(v.size());  // 0 / 0 = NaN for an empty group
}

// Welford's divisor: max(N - correction, 0), so too large a correction gives inf or NaN.
double variance_of(const std::vector<double>& v, double correction) {
  double mean = mean_of(v), m2 = 0;
  for (double x : v)
    m2 += (x - mean) * (x - mean);
  auto n = static_cast<double>(v.size());
  return m2 / std::max(n - correction, 0.0);
}

// amax/amin: any NaN makes the result NaN.
template <class T, class Better>
T extreme_of(const std::vector<T>& v, Better better) {
  T best = v[0];
  for (T x : v) {
    if constexpr (std::is_same_v<T, double>) {
      if (std::isnan(x)) return x;
    }
    if (better(x, best)) best = x;
  }
  return best;
}

// argmax/argmin: the first index of the extreme; a NaN counts as more extreme than anything.
template <class T, class Better>
int64_t arg_extreme_of(const std::vector<T>& v, Better better) {
  size_t best = 0;
  for (size_t j = 0; j < v.size(); ++j) {
    if constexpr (std::is_same_v<T, double>) {
      if (std::isnan(v[j])) return static_cast<int64_t>(j);
    }
    if (better(v[j], v[best])) best = j;
  }
  return static_cast<int64_t>(best);
}

template <class Better>
void arg_reduce(Env& env, const Node& node, Better better) {
  // The values are compared in their own dtype; the output holds indices.
  const RtTensor& self = *env.tensor(node.arg(0));
  DType in = self.dtype();
  Groups g = group_elements(self, node);
  TensorHandle out = new_output(node);
  std::vector<double> dv(static_cast<size_t>(g.group_size));
  std::vector<int64_t> iv(static_cast<size_t>(g.group_size));
  for (int64_t k = 0; k < g.count; ++k) {
    for (int64_t j = 0; j < g.group_size; ++j) {
      int64_t i = g.indices[static_cast<size_t>(k * g.group_size + j)];
      if (is_floating(in))
        dv[static_cast<size_t>(j)] = self.storage->load_double(i);
      else
        iv[static_cast<size_t>(j)] = self.storage->load_int(i);
    }
    out->storage->store_int(
        k, is_floating(in) ? arg_extreme_of(dv, better) : arg_extreme_of(iv, better));
  }
  env.bind(node.outputs[0], out);
}

}  // namespace

void ref_Sum(Env& env, const Node& node) {
  DType d = output_type(node).dtype;
  if (is_floating(d)) return reduce_double(env, node, d, sum_of);
  reduce_int(env, node, d, [](const std::vector<int64_t>& v) {
    int64_t s = 0;
    for (int64_t x : v)
      s += x;
    return s;
  });
}

void ref_Prod(Env& env, const Node& node) {
  DType d = output_type(node).dtype;
  if (is_floating(d)) {
    return reduce_double(env, node, d, [](const std::vector<double>& v) {
      double s = 1;
      for (double x : v)
        s *= x;
      return s;
    });
  }
  reduce_int(env, node, d, [](const std::vector<int64_t>& v) {
    int64_t s = 1;
    for (int64_t x : v)
      s *= x;
    return s;
  });
}

void ref_Mean(Env& env, const Node& node) {
  reduce_double(env, node, output_type(node).dtype, mean_of);
}

namespace {
template <class Better>
void extreme(Env& env, const Node& node, Better better) {
  DType d = output_type(node).dtype;
  if (is_floating(d)) {
    return reduce_double(env, node, d,
                         [&](const std::vector<double>& v) { return extreme_of(v, better); });
  }
  reduce_int(env, node, d, [&](const std::vector<int64_t>& v) { return extreme_of(v, better); });
}
}  // namespace

void ref_Amax(Env& env, const Node& node) {
  extreme(env, node, [](auto a, auto b) { return a > b; });
}
void ref_Amin(Env& env, const Node& node) {
  extreme(env, node, [](auto a, auto b) { return a < b; });
}

void ref_Var(Env& env, const Node& node) {
  double correction = scalar_to_double(env.number(node.arg("correction")));
  reduce_double(env, node, output_type(node).dtype,
                [&](const std::vector<double>& v) { return variance_of(v, correction); });
}

void ref_Std(Env& env, const Node& node) {
  double correction = scalar_to_double(env.number(node.arg("correction")));
  reduce_double(env, node, output_type(node).dtype, [&](const std::vector<double>& v) {
    return std::sqrt(variance_of(v, correction));
  });
}

void ref_Argmax(Env& env, const Node& node) {
  arg_reduce(env, node, [](auto a, auto b) { return a > b; });
}
void ref_Argmin(Env& env, const Node& node) {
  arg_reduce(env, node, [](auto a, auto b) { return a < b; });
}

}  // namespace kiln
