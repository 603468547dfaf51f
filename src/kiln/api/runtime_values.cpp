// Making and showing real tensors for the interpreter: inputs that match a trace's input types
// (random or given), and a readable form of results.
#include <cmath>
#include <cstdio>
#include <random>

#include "kiln/kiln.h"
#include "kiln/support/error.h"

namespace kiln {

TensorHandle make_input(const TensorType& type, const std::vector<double>& values) {
  std::vector<int64_t> strides =
      type.layout ? type.layout->strides : contiguous_strides(type.shape);
  int64_t offset = type.layout ? type.layout->offset : 0;
  // The storage must reach the last element the layout can address.
  int64_t extent = offset + 1;
  for (size_t i = 0; i < type.shape.size(); ++i) {
    if (type.shape[i] == 0) {
      extent = offset;
      break;
    }
    extent += (type.shape[i] - 1) * strides[i];
  }
  TensorHandle t =
      make_strided(type.dtype, type.shape, strides, offset, std::max<int64_t>(extent, 0));
  KILN_CHECK(static_cast<int64_t>(values.size()) == t->numel())
      << "got " << values.size() << " values for an input of shape " << shape_str(type.shape)
      << " (" << t->numel() << " elements); give one value per element, in row-major order.";
  for (int64_t i = 0; i < t->numel(); ++i)
    t->storage->store_double(t->storage_index_of_linear(i), values[static_cast<size_t>(i)]);
  return t;
}

TensorHandle make_random_input(const TensorType& type, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<int64_t> integer(-5, 5);
  std::vector<double> values(static_cast<size_t>(type.numel()));
  for (double& v : values) {
    if (type.dtype == DType::kBool)
      v = static_cast<double>(integer(rng) > 0);
    else if (is_integral(type.dtype, false))
      v = static_cast<double>(integer(rng));
    else
      v = std::round(real(rng) * 1000.0) / 1000.0;  // short, readable values
  }
  return make_input(type, values);
}

namespace {
void append_element(std::string& out, const RtTensor& t, int64_t storage_index) {
  char buf[64];
  if (t.dtype() == DType::kBool) {
    out += t.storage->load_int(storage_index) ? "True" : "False";
  } else if (is_integral(t.dtype(), false)) {
    out += std::to_string(t.storage->load_int(storage_index));
  } else {
    std::snprintf(buf, sizeof buf, "%.6g", t.storage->load_double(storage_index));
    out += buf;
  }
}

void append_dim(std::string& out, const RtTensor& t, size_t dim, int64_t base) {
  if (dim == t.sizes.size()) {
    append_element(out, t, base);
    return;
  }
  out += "[";
  for (int64_t i = 0; i < t.sizes[dim]; ++i) {
    if (i) out += ", ";
    append_dim(out, t, dim + 1, base + i * t.strides[dim]);
  }
  out += "]";
}
}  // namespace

std::string tensor_str(const RtTensor& t) {
  std::string out = t.type().str() + " ";
  append_dim(out, t, 0, t.offset);
  return out;
}

std::string value_str(const RtValue& v) {
  if (auto* t = std::get_if<TensorHandle>(&v)) return tensor_str(**t);
  const RtScalar& s = std::get<RtScalar>(v);
  if (auto* b = std::get_if<bool>(&s)) return *b ? "True" : "False";
  if (auto* i = std::get_if<int64_t>(&s)) return std::to_string(*i);
  return float_str(std::get<double>(s));
}

}  // namespace kiln
