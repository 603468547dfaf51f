// Real tensors for the reference interpreter: a storage (bytes of one dtype) and a strided view
// of it, exactly as a torch.Tensor is. A TensorHandle is a Python tensor *object*: in-place ops
// return the same handle, metadata mutations (transpose_, ...) change it, and views share the
// storage.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <variant>
#include <vector>

#include "kiln/ir/types.h"

namespace kiln {

struct Storage {
  DType dtype = DType::kFloat32;
  Device device;
  std::vector<std::byte> bytes;  // a CPU storage's elements, when kiln owns them
  // A CPU storage over memory kiln borrows (a caller's tensor: the Python front end passes
  // PyTorch's memory without copies): its first byte, its size, and what keeps it alive.
  std::byte* borrowed = nullptr;
  int64_t borrowed_numel = 0;
  std::shared_ptr<void> borrowed_owner;
  // A storage in device memory (`bytes` stays empty): its device address, its size and its
  // owner. Only the executor and the CUDA runtime touch it; the interpreter never sees one. (A
  // host copy of a CUDA storage keeps its `device` label but holds its elements in `bytes`, so
  // that the interpreter can run a CUDA program's step on it.)
  uint64_t device_data = 0;
  int64_t device_numel = 0;
  std::shared_ptr<void> device_owner;
  // Memory from the executor's Allocator (ExecuteOptions::allocator): a caller that plugs one in
  // can hand such a storage out as its own tensor.
  bool from_allocator = false;
  // view_dtype: a storage that reads another storage's bytes as its own dtype (of the same
  // element size). Its memory is that storage's (`borrowed` or `device_data` point there, and
  // this keeps it alive), so whose memory a tensor is asks memory_owner(), not the pointer.
  std::shared_ptr<Storage> reinterprets;
  // A device storage of rows `row_pitch` elements apart whose elements [row_length, row_pitch)
  // of every row are zero (0: no such rows): a kernel's 16-bit result laid out for a matrix
  // product to read in place at tensor-core alignment (executor.cpp, padded_rows), the padding
  // standing in for the product's zero padding of its reduced dim.
  int64_t row_length = 0, row_pitch = 0;

  bool on_device() const { return device_owner != nullptr; }
  // The host elements (owned or borrowed); null for a device storage.
  std::byte* data() { return borrowed ? borrowed : bytes.data(); }
  const std::byte* data() const { return borrowed ? borrowed : bytes.data(); }
  int64_t numel() const {
    if (on_device()) return device_numel;
    if (borrowed) return borrowed_numel;
    return static_cast<int64_t>(bytes.size()) / dtype_size(dtype);
  }

  // Element i of the storage as a double / int64 (bool is 0 or 1; f16 and bf16 are widened).
  double load_double(int64_t i) const;
  int64_t load_int(int64_t i) const;
  // Stores with PyTorch's conversion: to an integer truncates toward zero, to bool is `!= 0`,
  // to f16/bf16 rounds to nearest even.
  void store_double(int64_t i, double v);
  void store_int(int64_t i, int64_t v);
  // The storage that owns this one's memory: itself, or the one it reinterprets.
  const Storage& memory_owner() const { return reinterprets ? *reinterprets : *this; }
};

// Copies element `si` of `src` to element `di` of `dst`, converting the dtype as PyTorch's copy_
// does (bytes are copied unchanged when the dtypes agree, so large int64 values survive).
void copy_element(const Storage& src, int64_t si, Storage& dst, int64_t di);
// Rounds a double to the nearest value representable in `dtype` (the value a floating tensor of
// that dtype would hold); integral dtypes convert as a store would.
double round_to_dtype(double v, DType dtype);
int64_t cast_int_to_dtype(int64_t v, DType dtype);

struct RtTensor {
  std::shared_ptr<Storage> storage;
  Shape sizes;
  std::vector<int64_t> strides;  // in elements
  int64_t offset = 0;            // in elements

  DType dtype() const { return storage->dtype; }
  Device device() const { return storage->device; }
  int64_t rank() const { return static_cast<int64_t>(sizes.size()); }
  int64_t numel() const { return shape_numel(sizes); }
  bool is_contiguous() const;
  // Storage index of the element at a multi-index / at a row-major linear position.
  int64_t storage_index(const std::vector<int64_t>& index) const;
  int64_t storage_index_of_linear(int64_t linear) const;
  TensorType type() const;  // with the layout filled in
  // Storage indices of all elements in row-major order of `sizes`.
  std::vector<int64_t> element_indices() const;
};

using TensorHandle = std::shared_ptr<RtTensor>;
using RtScalar = std::variant<bool, int64_t, double>;
using RtValue = std::variant<TensorHandle, RtScalar>;

// A new contiguous tensor holding `values` in row-major order, converted to `dtype`.
TensorHandle make_tensor(DType dtype, const Shape& shape, const std::vector<double>& values,
                         Device device = Device::cpu());
TensorHandle make_int_tensor(DType dtype, const Shape& shape, const std::vector<int64_t>& values);
// A new tensor of the given layout over a fresh storage of `storage_numel` elements (zeroed).
TensorHandle make_strided(DType dtype, const Shape& shape, const std::vector<int64_t>& strides,
                          int64_t offset, int64_t storage_numel);
// A new zero-filled tensor with the given strides over a storage just large enough for them.
TensorHandle empty_strided(DType dtype, const Shape& shape, const std::vector<int64_t>& strides,
                           Device device = Device::cpu());
// A tensor object over `storage` with this layout (no bounds check: the caller made the storage
// for it).
TensorHandle tensor_over(std::shared_ptr<Storage> storage, const Shape& shape,
                         const std::vector<int64_t>& strides, int64_t offset);
// A view of an existing tensor's storage with another shape/strides/offset (as_strided).
TensorHandle make_view(const TensorHandle& base, const Shape& shape,
                       const std::vector<int64_t>& strides, int64_t offset);
// A tensor over `t`'s memory with `t`'s layout whose elements are read as `dtype`, of the same
// element size (Tensor.view(dtype)): writes through either are seen through the other.
TensorHandle reinterpret_as(const RtTensor& t, DType dtype);
// The elements in row-major order.
std::vector<double> to_vector(const RtTensor& t);
std::vector<int64_t> to_int_vector(const RtTensor& t);
// A contiguous copy (new storage). A tensor in device memory is copied by the current
// DeviceCopyScope's function; without one, copying it is a kiln bug (an internal error).
TensorHandle clone(const RtTensor& t);

// The interpreter reads and writes host memory. The executor hands it device tensors only for an
// eager step, whose other nodes are the views the eager call reads through: metadata, except a
// reshape no view expresses, which copies. Around such a step the executor says how a device
// tensor is copied (on its stream, from its allocator); the scopes nest, per thread.
class DeviceCopyScope {
 public:
  explicit DeviceCopyScope(std::function<TensorHandle(const RtTensor&)> copy);
  ~DeviceCopyScope();
  DeviceCopyScope(const DeviceCopyScope&) = delete;
  DeviceCopyScope& operator=(const DeviceCopyScope&) = delete;

 private:
  std::function<TensorHandle(const RtTensor&)> copy_;
  const std::function<TensorHandle(const RtTensor&)>* previous_;
};
// dst.copy_(src) as eager runs it: src broadcast to dst's shape and converted to dst's dtype;
// nothing happens when src is dst's exact memory; user errors when dst has internal overlap or
// src partially overlaps it. All of src is read before dst is written.
void copy_into(RtTensor& dst, const RtTensor& src);
// The executor's copy between host tensors of one dtype and one shape whose bytes do not overlap:
// a strided loop over the rows (a memcpy each where both rows are dense), at memory speed, where
// copy_into stages every element through index vectors (about 40 ns an element: a writeback of
// 2^24 floats took 0.64 s). False, and nothing copied, when it does not apply.
bool copy_disjoint_same_dtype(RtTensor& dst, const RtTensor& src);

}  // namespace kiln
