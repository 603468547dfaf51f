// The index ops (ops.def, "index reads and writes") as eager runs them on the CPU: positions
// along one dim picked by an integer index tensor; an index out of range is the user's error,
// raised before anything is written (eager's message).
#include "kiln/runtime/interpreter/layout.h"
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/support/error.h"

#include <cmath>
#include <limits>
#include <map>

namespace kiln {

namespace {

// The index's values, each checked against the size of the dim it addresses.
std::vector<int64_t> checked_indices(const Node& node, const RtTensor& index, int64_t size,
                                     int64_t dim) {
  std::vector<int64_t> values = to_int_vector(index);
  for (int64_t v : values)
    KILN_CHECK(v >= 0 && v < size)
        << node.op->name << ": index " << v << " is out of bounds for dimension " << dim
        << " with size " << size << ".";
  return values;
}

int64_t dim_of(const Node& node, const RtTensor& self) {
  return wrap_dim(node.arg("dim").as_int(), std::max<int64_t>(self.rank(), 1));
}
int64_t size_at(const RtTensor& t, int64_t dim) {
  return t.rank() == 0 ? 1 : t.sizes[static_cast<size_t>(dim)];
}

// Calls f(out_linear, in_linear) for every element of `shape` (row-major), where the element's
// coordinate along `dim` goes through `map` to give the element of a tensor of `in_shape`.
template <typename F>
void for_each_mapped(const Shape& shape, const Shape& in_shape, int64_t dim,
                     const std::vector<int64_t>& map, F f) {
  int64_t n = shape_numel(shape);
  std::vector<int64_t> at(shape.size(), 0);
  for (int64_t linear = 0; linear < n; ++linear) {
    int64_t in = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t c = static_cast<int64_t>(d) == dim ? map[static_cast<size_t>(at[d])] : at[d];
      in = in * in_shape[d] + c;
    }
    f(linear, in);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++at[d] < shape[d]) break;
      at[d] = 0;
    }
  }
}

}  // namespace

// wrap_index: index + size where negative (a value out of [-size, size) is left for the op
// that uses it to report, as eager does).
void ref_WrapIndex(Env& env, const Node& node) {
  const RtTensor& index = *env.tensor(node.arg(0));
  int64_t size = node.arg(1).as_int();
  const TensorType& type = node.outputs[0]->tensor_type();
  TensorHandle out =
      empty_strided(type.dtype, type.shape, contiguous_strides(type.shape), index.device());
  std::vector<int64_t> values = to_int_vector(index);
  for (size_t i = 0; i < values.size(); ++i) {
    int64_t v = values[i];
    out->storage->store_int(static_cast<int64_t>(i), v < 0 && v >= -size ? v + size : v);
  }
  env.bind(node.outputs[0], out);
}

void ref_IndexSelect(Env& env, const Node& node) {
  const RtTensor& self = *env.tensor(node.arg(0));
  int64_t dim = dim_of(node, self);
  std::vector<int64_t> index =
      checked_indices(node, *env.tensor(node.arg(2)), size_at(self, dim), dim);
  const TensorType& type = node.outputs[0]->tensor_type();
  TensorHandle out =
      empty_strided(type.dtype, type.shape, contiguous_strides(type.shape), self.device());
  if (self.rank() == 0) {
    for (int64_t i = 0; i < out->numel(); ++i)
      copy_element(*self.storage, self.offset, *out->storage, i);
  } else {
    for_each_mapped(type.shape, self.sizes, dim, index, [&](int64_t o, int64_t in) {
      copy_element(*self.storage, self.storage_index_of_linear(in), *out->storage, o);
    });
  }
  env.bind(node.outputs[0], out);
}

void ref_Gather(Env& env, const Node& node) {
  const RtTensor& self = *env.tensor(node.arg(0));
  const RtTensor& index = *env.tensor(node.arg(2));
  int64_t dim = dim_of(node, self);
  std::vector<int64_t> values = checked_indices(node, index, size_at(self, dim), dim);
  const TensorType& type = node.outputs[0]->tensor_type();
  TensorHandle out =
      empty_strided(type.dtype, type.shape, contiguous_strides(type.shape), self.device());
  std::vector<int64_t> at(type.shape.size(), 0);
  for (int64_t linear = 0; linear < out->numel(); ++linear) {
    std::vector<int64_t> from = at;
    if (!from.empty()) from[static_cast<size_t>(dim)] = values[static_cast<size_t>(linear)];
    int64_t si = self.rank() == 0 ? self.offset : self.storage_index(from);
    copy_element(*self.storage, si, *out->storage, linear);
    for (size_t d = at.size(); d-- > 0;) {
      if (++at[d] < type.shape[d]) break;
      at[d] = 0;
    }
  }
  env.bind(node.outputs[0], out);
}

namespace {

// index_copy and index_add: a copy of self, then each source slice i written into
// (or added to) self's slice index[i], in order.
void index_write(Env& env, const Node& node, bool add) {
  const RtTensor& self = *env.tensor(node.arg(0));
  const RtTensor& source = *env.tensor(node.arg(3));
  int64_t dim = dim_of(node, self);
  std::vector<int64_t> index =
      checked_indices(node, *env.tensor(node.arg(2)), size_at(self, dim), dim);
  // A clone of self laid out as empty_like(self) (eager's index_copy is
  // self.clone().index_copy_(...)).
  TensorHandle out = empty_strided(self.dtype(), self.sizes, strides_like(self), self.device());
  copy_into(*out, self);
  RtScalar alpha = add ? env.number(node.arg("alpha")) : RtScalar(int64_t{1});
  bool floating = is_floating(self.dtype());
  auto write = [&](int64_t src_linear, int64_t out_linear) {
    int64_t si = source.storage_index_of_linear(src_linear);
    out_linear = out->storage_index_of_linear(out_linear);
    if (!add) {
      copy_element(*source.storage, si, *out->storage, out_linear);
    } else if (floating) {
      out->storage->store_double(out_linear,
                                 out->storage->load_double(out_linear) +
                                     scalar_to_double(alpha) * source.storage->load_double(si));
    } else {
      out->storage->store_int(out_linear, out->storage->load_int(out_linear) +
                                              scalar_to_int(alpha) * source.storage->load_int(si));
    }
  };
  if (self.rank() == 0) {
    for (int64_t i = 0; i < static_cast<int64_t>(index.size()); ++i)
      write(i, 0);
  } else {
    // Source slice by slice (index order), each element to its place in out.
    const Shape& shape = source.sizes;
    int64_t slices = static_cast<int64_t>(index.size());
    for (int64_t i = 0; i < slices; ++i) {
      Shape one = shape;
      one[static_cast<size_t>(dim)] = 1;
      std::vector<int64_t> to_out = {index[static_cast<size_t>(i)]};
      for_each_mapped(one, self.sizes, dim, to_out, [&](int64_t o, int64_t out_linear) {
        // The same element of `one`, read from source at slice i.
        std::vector<int64_t> at(one.size());
        int64_t rest = o;
        for (size_t d = one.size(); d-- > 0;) {
          at[d] = rest % one[d];
          rest /= one[d];
        }
        int64_t src_linear = 0;
        for (size_t d = 0; d < shape.size(); ++d)
          src_linear = src_linear * shape[d] + (static_cast<int64_t>(d) == dim ? i : at[d]);
        write(src_linear, out_linear);
      });
    }
  }
  env.bind(node.outputs[0], out);
}

}  // namespace

void ref_IndexCopy(Env& env, const Node& node) {
  index_write(env, node, false);
}

void ref_IndexAdd(Env& env, const Node& node) {
  index_write(env, node, true);
}

// scatter as eager's scatter / scatter_reduce on the CPU: a copy of self; without include_self
// the positions the index names first hold the reduction's identity; then every index position
// p in row-major order writes (or reduces) src[p] into its target; "mean" divides by the number
// of values (self's counted with include_self), flooring for integers.
void ref_Scatter(Env& env, const Node& node) {
  const RtTensor& self = *env.tensor(node.arg(0));
  const RtTensor& index = *env.tensor(node.arg(2));
  const RtTensor& src = *env.tensor(node.arg(3));
  int64_t dim = dim_of(node, self);
  std::vector<int64_t> values = checked_indices(node, index, size_at(self, dim), dim);
  const Operand& reduce_arg = node.arg("reduce");
  const std::string reduce = reduce_arg.is_none() ? "" : reduce_arg.as_string();
  const bool include_self = node.arg("include_self").as_bool();
  TensorHandle out = empty_strided(self.dtype(), self.sizes, strides_like(self), self.device());
  copy_into(*out, self);
  const bool floating = is_floating(self.dtype());
  Storage& o = *out->storage;
  // The storage index of each index position's target, and of its src element.
  std::vector<int64_t> targets, sources;
  std::vector<int64_t> at(index.sizes.size(), 0);
  for (int64_t linear = 0; linear < static_cast<int64_t>(values.size()); ++linear) {
    std::vector<int64_t> to = at;
    if (!to.empty()) to[static_cast<size_t>(dim)] = values[static_cast<size_t>(linear)];
    targets.push_back(self.rank() == 0 ? out->offset : out->storage_index(to));
    sources.push_back(src.rank() == 0 ? src.offset : src.storage_index(at));
    for (size_t d = at.size(); d-- > 0;) {
      if (++at[d] < index.sizes[d]) break;
      at[d] = 0;
    }
  }
  if (reduce.empty()) {
    for (size_t i = 0; i < targets.size(); ++i)
      copy_element(*src.storage, sources[i], o, targets[i]);
    env.bind(node.outputs[0], out);
    return;
  }
  const bool mean = reduce == "mean";
  std::map<int64_t, int64_t> counts;  // storage index -> values reduced there
  if (!include_self) {
    double fid = reduce == "prod"   ? 1.0
                 : reduce == "amax" ? -std::numeric_limits<double>::infinity()
                 : reduce == "amin" ? std::numeric_limits<double>::infinity()
                                    : 0.0;
    int64_t iid = reduce == "prod"   ? 1
                  : reduce == "amax" ? std::numeric_limits<int64_t>::min()
                  : reduce == "amin" ? std::numeric_limits<int64_t>::max()
                                     : 0;
    for (int64_t t : targets) {
      if (floating)
        o.store_double(t, fid);
      else
        o.store_int(t, iid);
    }
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    int64_t t = targets[i], si = sources[i];
    counts[t] += 1;
    if (floating) {
      double a = o.load_double(t), b = src.storage->load_double(si);
      double r = reduce == "prod"   ? a * b
                 : reduce == "amax" ? (std::isnan(b) ? b : (a < b ? b : a))
                 : reduce == "amin" ? (std::isnan(b) ? b : (b < a ? b : a))
                                    : a + b;
      o.store_double(t, r);
    } else {
      auto a = static_cast<uint64_t>(o.load_int(t));
      auto b = static_cast<uint64_t>(src.storage->load_int(si));
      int64_t ia = static_cast<int64_t>(a), ib = static_cast<int64_t>(b);
      int64_t r = reduce == "prod"   ? static_cast<int64_t>(a * b)
                  : reduce == "amax" ? std::max(ia, ib)
                  : reduce == "amin" ? std::min(ia, ib)
                                     : static_cast<int64_t>(a + b);
      o.store_int(t, r);
    }
  }
  if (mean) {
    for (auto [t, n] : counts) {
      int64_t c = n + (include_self ? 1 : 0);
      if (floating) {
        o.store_double(t, o.load_double(t) / static_cast<double>(c));
      } else {
        int64_t a = o.load_int(t);
        o.store_int(t, a / c - ((a % c != 0) && (a < 0)));
      }
    }
  }
  env.bind(node.outputs[0], out);
}

}  // namespace kiln
