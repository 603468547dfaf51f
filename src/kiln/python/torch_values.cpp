#include "kiln/python/torch_values.h"

#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <memory>
#include <string>

#include "kiln/support/error.h"

namespace kiln::pyext {

std::optional<DType> kiln_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool:
      return DType::kBool;
    case at::kInt:
      return DType::kInt32;
    case at::kLong:
      return DType::kInt64;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kFloat:
      return DType::kFloat32;
    case at::kDouble:
      return DType::kFloat64;
    default:
      return std::nullopt;
  }
}

at::ScalarType torch_dtype(DType t) {
  switch (t) {
    case DType::kBool:
      return at::kBool;
    case DType::kInt32:
      return at::kInt;
    case DType::kInt64:
      return at::kLong;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat64:
      return at::kDouble;
  }
  KILN_ASSERT(false) << "unknown dtype";
  return at::kFloat;
}

Device kiln_device(const at::Device& d) {
  if (d.is_cpu()) return Device::cpu();
  if (d.is_cuda()) return Device::cuda(d.index());
  throw UnsupportedError("kiln runs cpu and cuda tensors, not " + d.str() + " ones.");
}

// A storage is told apart by its memory: tensors over one allocation share a kiln Storage. An
// empty storage has no address; it is its own.
const void* storage_identity(const at::Tensor& t, PyObject* object) {
  const c10::Storage& s = t.storage();
  return s.nbytes() > 0 && s.data() ? s.data() : static_cast<const void*>(object);
}

thread_local TorchAllocator* current_allocator = nullptr;

// A torch tensor over a kiln tensor's memory (no copy; valid while the kiln storage lives).
at::Tensor torch_view(const RtTensor& t) {
  at::TensorOptions options = at::TensorOptions().dtype(torch_dtype(t.dtype()));
  if (t.numel() == 0) {
    // No element to share (an empty CUDA storage may have no device address, which from_blob
    // refuses): an empty tensor of the same layout.
    if (t.storage->on_device()) options = options.device(at::kCUDA, t.device().index);
    return at::empty_strided(std::vector<int64_t>(t.sizes.begin(), t.sizes.end()), t.strides,
                             options);
  }
  auto bytes = static_cast<size_t>(t.offset * dtype_size(t.dtype()));
  void* data = nullptr;
  if (t.storage->on_device()) {
    options = options.device(at::kCUDA, t.device().index);
    data = reinterpret_cast<void*>(t.storage->device_data + bytes);
  } else {
    data = const_cast<std::byte*>(t.storage->data()) + bytes;
  }
  return at::from_blob(data, std::vector<int64_t>(t.sizes.begin(), t.sizes.end()), t.strides,
                       options);
}

// A kiln tensor over a torch tensor's memory, which it keeps alive.
TensorHandle kiln_view(const at::Tensor& r) {
  std::optional<DType> dtype = kiln_dtype(r.scalar_type());
  if (!dtype || r.layout() != at::kStrided)
    throw UnsupportedError(std::string("kiln: an op run by PyTorch returned a tensor of dtype ") +
                           c10::toString(r.scalar_type()) + ", which kiln does not support.");
  auto storage = std::make_shared<Storage>();
  storage->dtype = *dtype;
  storage->device = kiln_device(r.device());
  auto owner = std::make_shared<at::Tensor>(r);
  auto numel = static_cast<int64_t>(r.storage().nbytes() / r.element_size());
  auto* base = static_cast<std::byte*>(const_cast<void*>(r.storage().data()));
  if (r.is_cuda()) {
    storage->device_data = reinterpret_cast<uint64_t>(base);
    storage->device_numel = numel;
    storage->device_owner = owner;
  } else {
    storage->borrowed = base;
    storage->borrowed_numel = numel;
    storage->borrowed_owner = owner;
  }
  storage->from_allocator = true;  // torch memory: a result over it can be handed out
  if (current_allocator) current_allocator->adopt(r);
  return tensor_over(storage, Shape(r.sizes().begin(), r.sizes().end()),
                     std::vector<int64_t>(r.strides().begin(), r.strides().end()),
                     r.storage_offset());
}

// Registers a Python function that takes a list of tensors and returns a list of tensors (made
// by python/kiln/_tracer.py for each eager fallback it records) and returns its number.
at::Tensor tensor_over_storage(const c10::Storage& storage, const RtTensor& t) {
  c10::DispatchKeySet keys(storage.device_type() == c10::DeviceType::CUDA ? c10::DispatchKey::CUDA
                                                                          : c10::DispatchKey::CPU);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(storage), keys, caffe2::TypeMeta::fromScalarType(torch_dtype(t.dtype())));
  impl->set_sizes_and_strides(std::vector<int64_t>(t.sizes.begin(), t.sizes.end()), t.strides,
                              t.offset);
  return at::Tensor(std::move(impl));
}

void* current_stream(const std::vector<RtValue>& values) {
  for (const RtValue& v : values) {
    const auto& t = std::get<TensorHandle>(v);
    if (t->device().kind == Device::Kind::kCuda) {
      const c10::impl::DeviceGuardImplInterface* cuda =
          c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
      return cuda->getStream(c10::Device(c10::DeviceType::CUDA, t->device().index)).native_handle();
    }
  }
  return nullptr;
}

}  // namespace kiln::pyext
