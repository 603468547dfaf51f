// PyTorch tensors as kiln values and back (kiln._C): dtypes and devices (one call's tensors as
// kiln values: call_args.h), kiln tensors over PyTorch's
// allocators (TorchAllocator) and torch tensors over kiln's memory (torch_view, kiln_view), with
// no copy either way.
#pragma once

#include <ATen/ATen.h>
#include <Python.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "kiln/runtime/executor.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln::pyext {

std::optional<DType> kiln_dtype(at::ScalarType t);
at::ScalarType torch_dtype(DType t);
Device kiln_device(const at::Device& d);
// What makes two tensor leaves one storage: its data address, or the object for an empty one.
const void* storage_identity(const at::Tensor& t, PyObject* object);

// Blocks from PyTorch's allocators (c10's allocator for the device: the caching allocator on
// CUDA, whose blocks are ordered on the current stream, the one kiln's kernels run on). Each block
// is a c10 storage, which lives as long as a kiln Storage or a result uses it. Asking the
// allocator directly, not at::empty, skips the dispatcher and a tensor per buffer: at::empty cost
// 4.9 us of a 10 us S1 call at 5x1024 on the H200's host (bench/NOTES.md).
class TorchAllocator : public Allocator {
 public:
  Block allocate(Device device, size_t bytes) override {
    bool cuda = device.kind == Device::Kind::kCuda;
    c10::Device where =
        cuda ? c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device.index))
             : c10::Device(c10::DeviceType::CPU);
    c10::Allocator* allocator = c10::GetAllocator(where.type());
    // At least 16 bytes, so that a zero-size tensor still gets an address.
    bytes = std::max<size_t>(bytes, 16);
    c10::DataPtr data;
    if (cuda) {
      // The caching allocator allocates on the current device.
      c10::DeviceGuard on_device(where);
      data = allocator->allocate(bytes);
    } else {
      data = allocator->allocate(bytes);
    }
    auto address = reinterpret_cast<uintptr_t>(data.get());
    c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(bytes),
                         std::move(data), allocator, /*resizable=*/false);
    auto owner = std::make_shared<c10::Storage>(storage);
    storages_.emplace_back(address, std::move(storage));
    if (cuda) return Block{nullptr, address, owner};
    return Block{reinterpret_cast<std::byte*>(address), 0, owner};
  }
  // A tensor PyTorch made during the call (an eager_call's result): a result over its memory
  // is handed out as a tensor over its storage.
  void adopt(const at::Tensor& t) {
    storages_.emplace_back(reinterpret_cast<uintptr_t>(t.storage().data()), t.storage());
  }
  const c10::Storage* storage_of(const Storage& s) const {
    auto address = s.on_device() ? static_cast<uintptr_t>(s.device_data)
                                 : reinterpret_cast<uintptr_t>(s.borrowed);
    for (const auto& [at, storage] : storages_)
      if (at == address) return &storage;
    return nullptr;
  }

 private:
  std::vector<std::pair<uintptr_t, c10::Storage>> storages_;  // a call makes a few
};

// The allocator of the call being executed (an eager_call's results join its buffers).
extern thread_local TorchAllocator* current_allocator;

// A torch tensor over a kiln tensor's memory (no copy; valid while the kiln storage lives).
at::Tensor torch_view(const RtTensor& t);
// A kiln tensor over a torch tensor's memory, which it keeps alive.
TensorHandle kiln_view(const at::Tensor& r);
// A tensor of `dtype` with t's layout over the storage (no dispatcher call).
at::Tensor tensor_over_storage(const c10::Storage& storage, const RtTensor& t);
// PyTorch's current stream on the device of the first CUDA tensor among `values` (else null).
void* current_stream(const std::vector<RtValue>& values);

}  // namespace kiln::pyext
