#include "kiln/runtime/interpreter/rt_tensor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "kiln/runtime/interpreter/layout.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

template <class T>
T read(const Storage& s, int64_t i) {
  T v;
  std::memcpy(&v, s.data() + static_cast<size_t>(i) * sizeof(T), sizeof(T));
  return v;
}

template <class T>
void write(Storage& s, int64_t i, T v) {
  std::memcpy(s.data() + static_cast<size_t>(i) * sizeof(T), &v, sizeof(T));
}

void check_index(const Storage& s, int64_t i) {
  KILN_ASSERT(i >= 0 && i < s.numel())
      << "storage index " << i << " out of range for a storage of " << s.numel() << " elements";
}

}  // namespace

double Storage::load_double(int64_t i) const {
  check_index(*this, i);
  switch (dtype) {
    case DType::kBool:
      return read<uint8_t>(*this, i) != 0 ? 1.0 : 0.0;
    case DType::kInt32:
      return read<int32_t>(*this, i);
    case DType::kInt64:
      return static_cast<double>(read<int64_t>(*this, i));
    case DType::kFloat16:
      return half_to_float(read<uint16_t>(*this, i));
    case DType::kBFloat16:
      return bfloat16_to_float(read<uint16_t>(*this, i));
    case DType::kFloat32:
      return read<float>(*this, i);
    case DType::kFloat64:
      return read<double>(*this, i);
  }
  KILN_ASSERT(false) << "bad dtype";
  return 0;
}

int64_t Storage::load_int(int64_t i) const {
  check_index(*this, i);
  switch (dtype) {
    case DType::kBool:
      return read<uint8_t>(*this, i) != 0 ? 1 : 0;
    case DType::kInt32:
      return read<int32_t>(*this, i);
    case DType::kInt64:
      return read<int64_t>(*this, i);
    default:
      return float_to_int<int64_t>(load_double(i));
  }
}

void Storage::store_double(int64_t i, double v) {
  check_index(*this, i);
  switch (dtype) {
    case DType::kBool:
      write<uint8_t>(*this, i, v != 0 ? 1 : 0);
      return;  // NaN != 0: true
    case DType::kInt32:
      write<int32_t>(*this, i, float_to_int<int32_t>(v));
      return;
    case DType::kInt64:
      write<int64_t>(*this, i, float_to_int<int64_t>(v));
      return;
    // c10::Half and c10::BFloat16 are built from a float, so a double is rounded twice.
    case DType::kFloat16:
      write<uint16_t>(*this, i, float_to_half(static_cast<float>(v)));
      return;
    case DType::kBFloat16:
      write<uint16_t>(*this, i, float_to_bfloat16(static_cast<float>(v)));
      return;
    case DType::kFloat32:
      write<float>(*this, i, static_cast<float>(v));
      return;
    case DType::kFloat64:
      write<double>(*this, i, v);
      return;
  }
  KILN_ASSERT(false) << "bad dtype";
}

void Storage::store_int(int64_t i, int64_t v) {
  check_index(*this, i);
  switch (dtype) {
    case DType::kBool:
      write<uint8_t>(*this, i, v != 0 ? 1 : 0);
      return;
    case DType::kInt32:
      write<int32_t>(*this, i, static_cast<int32_t>(v));
      return;  // wraps
    case DType::kInt64:
      write<int64_t>(*this, i, v);
      return;
    // One rounding from the integer, as static_cast<float>(int64_t) does in PyTorch.
    case DType::kFloat16:
      write<uint16_t>(*this, i, float_to_half(static_cast<float>(v)));
      return;
    case DType::kBFloat16:
      write<uint16_t>(*this, i, float_to_bfloat16(static_cast<float>(v)));
      return;
    case DType::kFloat32:
      write<float>(*this, i, static_cast<float>(v));
      return;
    case DType::kFloat64:
      write<double>(*this, i, static_cast<double>(v));
      return;
  }
  KILN_ASSERT(false) << "bad dtype";
}

void copy_element(const Storage& src, int64_t si, Storage& dst, int64_t di) {
  if (src.dtype == dst.dtype) {
    check_index(src, si);
    check_index(dst, di);
    auto size = static_cast<size_t>(dtype_size(src.dtype));
    std::memcpy(dst.data() + static_cast<size_t>(di) * size,
                src.data() + static_cast<size_t>(si) * size, size);
  } else if (is_floating(src.dtype)) {
    dst.store_double(di, src.load_double(si));
  } else {
    dst.store_int(di, src.load_int(si));
  }
}

double round_to_dtype(double v, DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return v;
    case DType::kFloat32:
      return static_cast<float>(v);
    case DType::kFloat16:
      return half_to_float(float_to_half(static_cast<float>(v)));
    case DType::kBFloat16:
      return bfloat16_to_float(float_to_bfloat16(static_cast<float>(v)));
    case DType::kBool:
      return v != 0 ? 1.0 : 0.0;
    case DType::kInt32:
      return float_to_int<int32_t>(v);
    case DType::kInt64:
      return static_cast<double>(float_to_int<int64_t>(v));
  }
  return v;
}

int64_t cast_int_to_dtype(int64_t v, DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return v != 0 ? 1 : 0;
    case DType::kInt32:
      return static_cast<int32_t>(v);
    default:
      return v;
  }
}

bool RtTensor::is_contiguous() const {
  return kiln::is_contiguous(sizes, strides);
}

int64_t RtTensor::storage_index(const std::vector<int64_t>& index) const {
  KILN_ASSERT(index.size() == sizes.size()) << "index rank mismatch";
  int64_t at = offset;
  for (size_t d = 0; d < index.size(); ++d)
    at += index[d] * strides[d];
  return at;
}

int64_t RtTensor::storage_index_of_linear(int64_t linear) const {
  int64_t at = offset;
  for (size_t d = sizes.size(); d-- > 0;) {
    at += (linear % sizes[d]) * strides[d];
    linear /= sizes[d];
  }
  return at;
}

TensorType RtTensor::type() const {
  return TensorType{dtype(), sizes, device(), Layout{strides, offset}};
}

std::vector<int64_t> RtTensor::element_indices() const {
  return kiln::element_indices(sizes, strides, offset);
}

namespace {
TensorHandle new_tensor(DType dtype, const Shape& shape, Device device) {
  auto storage = std::make_shared<Storage>();
  storage->dtype = dtype;
  storage->device = device;
  storage->bytes.resize(static_cast<size_t>(shape_numel(shape) * dtype_size(dtype)));
  auto t = std::make_shared<RtTensor>();
  t->storage = std::move(storage);
  t->sizes = shape;
  t->strides = contiguous_strides(shape);
  return t;
}
}  // namespace

TensorHandle make_tensor(DType dtype, const Shape& shape, const std::vector<double>& values,
                         Device device) {
  TensorHandle t = new_tensor(dtype, shape, device);
  KILN_CHECK(static_cast<int64_t>(values.size()) == t->numel())
      << "make_tensor got " << values.size() << " values for shape " << shape_str(shape)
      << "; give one value per element.";
  for (size_t i = 0; i < values.size(); ++i)
    t->storage->store_double(static_cast<int64_t>(i), values[i]);
  return t;
}

TensorHandle make_int_tensor(DType dtype, const Shape& shape, const std::vector<int64_t>& values) {
  TensorHandle t = new_tensor(dtype, shape, Device::cpu());
  KILN_CHECK(static_cast<int64_t>(values.size()) == t->numel())
      << "make_int_tensor got " << values.size() << " values for shape " << shape_str(shape)
      << "; give one value per element.";
  for (size_t i = 0; i < values.size(); ++i)
    t->storage->store_int(static_cast<int64_t>(i), values[i]);
  return t;
}

TensorHandle make_strided(DType dtype, const Shape& shape, const std::vector<int64_t>& strides,
                          int64_t offset, int64_t storage_numel) {
  auto storage = std::make_shared<Storage>();
  storage->dtype = dtype;
  storage->bytes.resize(static_cast<size_t>(storage_numel * dtype_size(dtype)));
  auto t = std::make_shared<RtTensor>();
  t->storage = std::move(storage);
  KILN_CHECK(strides.size() == shape.size())
      << "make_strided got " << strides.size() << " strides for shape " << shape_str(shape) << ".";
  t->sizes = shape;
  t->strides = strides;
  t->offset = offset;
  check_in_bounds(*t);
  return t;
}

TensorHandle tensor_over(std::shared_ptr<Storage> storage, const Shape& shape,
                         const std::vector<int64_t>& strides, int64_t offset) {
  auto t = std::make_shared<RtTensor>();
  t->storage = std::move(storage);
  t->sizes = shape;
  t->strides = strides;
  t->offset = offset;
  return t;
}

TensorHandle make_view(const TensorHandle& base, const Shape& shape,
                       const std::vector<int64_t>& strides, int64_t offset) {
  auto t = std::make_shared<RtTensor>();
  t->storage = base->storage;
  t->sizes = shape;
  t->strides = strides;
  t->offset = offset;
  check_in_bounds(*t);
  return t;
}

TensorHandle reinterpret_as(const RtTensor& t, DType dtype) {
  KILN_ASSERT(dtype_size(dtype) == dtype_size(t.dtype()))
      << "reinterpret_as: " << dtype_name(t.dtype()) << " as " << dtype_name(dtype)
      << " changes the element size";
  if (dtype == t.dtype()) return tensor_over(t.storage, t.sizes, t.strides, t.offset);
  std::shared_ptr<Storage> owner = t.storage->reinterprets ? t.storage->reinterprets : t.storage;
  if (owner->dtype == dtype) return tensor_over(owner, t.sizes, t.strides, t.offset);
  auto s = std::make_shared<Storage>();
  s->dtype = dtype;
  s->device = owner->device;
  s->from_allocator = owner->from_allocator;
  s->reinterprets = owner;
  if (owner->on_device()) {
    s->device_data = owner->device_data;
    s->device_numel = owner->device_numel;
    s->device_owner = owner;
  } else {
    s->borrowed = owner->data();
    s->borrowed_numel = owner->numel();
    s->borrowed_owner = owner;
  }
  return tensor_over(s, t.sizes, t.strides, t.offset);
}

std::vector<double> to_vector(const RtTensor& t) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(t.numel()));
  for (int64_t i : t.element_indices())
    out.push_back(t.storage->load_double(i));
  return out;
}

std::vector<int64_t> to_int_vector(const RtTensor& t) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(t.numel()));
  for (int64_t i : t.element_indices())
    out.push_back(t.storage->load_int(i));
  return out;
}

namespace {
thread_local const std::function<TensorHandle(const RtTensor&)>* device_copy = nullptr;
}  // namespace

DeviceCopyScope::DeviceCopyScope(std::function<TensorHandle(const RtTensor&)> copy)
    : copy_(std::move(copy)), previous_(device_copy) {
  device_copy = &copy_;
}

DeviceCopyScope::~DeviceCopyScope() {
  device_copy = previous_;
}

TensorHandle clone(const RtTensor& t) {
  if (t.storage->on_device()) {
    KILN_ASSERT(device_copy != nullptr)
        << "the interpreter was asked to copy a tensor in device memory outside an eager step";
    return (*device_copy)(t);
  }
  TensorHandle out = new_tensor(t.dtype(), t.sizes, t.device());
  // By rows (a reshape of an expanded key, as repeat_kv makes one, was copied element by
  // element: a third of a small Llama's forward through the backend on the CPU).
  if (copy_disjoint_same_dtype(*out, t)) return out;
  int64_t k = 0;
  for (int64_t i : t.element_indices())
    copy_element(*t.storage, i, *out->storage, k++);
  return out;
}

void copy_into(RtTensor& dst, const RtTensor& src) {
  if (&dst == &src) return;
  if (&dst.storage->memory_owner() == &src.storage->memory_owner() && dst.offset == src.offset &&
      dst.strides == src.strides && dst.sizes == src.sizes && dst.dtype() == src.dtype()) {
    return;  // copy_impl's "views of the same data" exit
  }
  check_no_internal_overlap(dst);
  check_no_partial_overlap(dst, src);
  // Same dtype, same sizes, disjoint memory: rows of bytes (a clone of 2^20 floats element by
  // element took 35 ms, 600 times eager's).
  if (copy_disjoint_same_dtype(dst, src)) return;
  std::vector<int64_t> from =
      element_indices(dst.sizes, broadcast_strides(src, dst.sizes), src.offset);
  std::vector<int64_t> to = dst.element_indices();
  Storage staged;
  staged.dtype = dst.dtype();
  staged.bytes.resize(static_cast<size_t>(dst.numel() * dtype_size(dst.dtype())));
  for (size_t k = 0; k < from.size(); ++k)
    copy_element(*src.storage, from[k], staged, static_cast<int64_t>(k));
  for (size_t k = 0; k < to.size(); ++k)
    copy_element(staged, static_cast<int64_t>(k), *dst.storage, to[k]);
}

namespace {

// The bytes [first, last) the elements of `t` occupy (strides are non-negative here).
std::pair<const std::byte*, const std::byte*> byte_range(const RtTensor& t) {
  int64_t last = t.offset;
  for (size_t d = 0; d < t.sizes.size(); ++d)
    last += (t.sizes[d] - 1) * t.strides[d];
  const auto size = static_cast<size_t>(dtype_size(t.dtype()));
  const std::byte* base = t.storage->data();
  return {base + static_cast<size_t>(t.offset) * size, base + static_cast<size_t>(last + 1) * size};
}

template <class T>
void copy_row(std::byte* to, int64_t to_stride, const std::byte* from, int64_t from_stride,
              int64_t n) {
  auto* d = reinterpret_cast<T*>(to);
  const auto* s = reinterpret_cast<const T*>(from);
  for (int64_t k = 0; k < n; ++k)
    std::memcpy(d + k * to_stride, s + k * from_stride, sizeof(T));
}

}  // namespace

bool copy_disjoint_same_dtype(RtTensor& dst, const RtTensor& src) {
  if (dst.dtype() != src.dtype() || dst.sizes != src.sizes || dst.storage->on_device() ||
      src.storage->on_device())
    return false;
  const int64_t n = dst.numel();
  if (n == 0) return true;
  for (const RtTensor* t : {static_cast<const RtTensor*>(&dst), &src}) {
    if (t->offset < 0) return false;
    for (int64_t st : t->strides)
      if (st < 0) return false;
  }
  auto [d0, d1] = byte_range(dst);
  auto [s0, s1] = byte_range(src);
  if (d0 < s1 && s0 < d1) return false;  // overlapping bytes: copy_into stages them
  KILN_ASSERT(d1 <= dst.storage->data() + dst.storage->numel() * dtype_size(dst.dtype()) &&
              s1 <= src.storage->data() + src.storage->numel() * dtype_size(src.dtype()))
      << "a tensor reaches past its storage";
  const auto size = static_cast<size_t>(dtype_size(dst.dtype()));
  const size_t rank = dst.sizes.size();
  const int64_t inner = rank == 0 ? 1 : dst.sizes[rank - 1];
  const int64_t dst_step = rank == 0 ? 1 : dst.strides[rank - 1];
  const int64_t src_step = rank == 0 ? 1 : src.strides[rank - 1];
  std::vector<int64_t> at(rank == 0 ? 0 : rank - 1, 0);  // the row's index over the outer dims
  int64_t dst_at = dst.offset, src_at = src.offset;
  for (int64_t row = 0; row < n / inner; ++row) {
    std::byte* to = dst.storage->data() + static_cast<size_t>(dst_at) * size;
    const std::byte* from = src.storage->data() + static_cast<size_t>(src_at) * size;
    if (dst_step == 1 && src_step == 1) {
      std::memcpy(to, from, static_cast<size_t>(inner) * size);
    } else {
      switch (size) {
        case 1:
          copy_row<uint8_t>(to, dst_step, from, src_step, inner);
          break;
        case 2:
          copy_row<uint16_t>(to, dst_step, from, src_step, inner);
          break;
        case 4:
          copy_row<uint32_t>(to, dst_step, from, src_step, inner);
          break;
        default:
          copy_row<uint64_t>(to, dst_step, from, src_step, inner);
          break;
      }
    }
    // The next row: an odometer over the outer dims, offsets kept incrementally.
    for (size_t d = at.size(); d-- > 0;) {
      dst_at += dst.strides[d];
      src_at += src.strides[d];
      if (++at[d] < dst.sizes[d]) break;
      dst_at -= dst.strides[d] * dst.sizes[d];
      src_at -= src.strides[d] * src.sizes[d];
      at[d] = 0;
    }
  }
  return true;
}

TensorHandle empty_strided(DType dtype, const Shape& shape, const std::vector<int64_t>& strides,
                           Device device) {
  TensorHandle t = new_tensor(dtype, {required_storage_numel(shape, strides, 0)}, device);
  t->sizes = shape;
  t->strides = strides;
  return t;
}

}  // namespace kiln
