#include "kiln/runtime/device_memory.h"

#include <algorithm>
#include <cstring>

#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/cuda/driver.h"
#include "kiln/runtime/interpreter/interpreter.h"
#include "kiln/support/call_profile.h"
#include "kiln/support/error.h"

namespace kiln {

TensorHandle DeviceMemoryOps::clone_of(const RtTensor& t) const {
  count_copy(t);
  return uncounted_clone(t);
}

TensorHandle DeviceMemoryOps::uncounted_clone(const RtTensor& t) const {
  if (cuda()) return cuda::cuda_clone(t, stream_, allocator_);
  TensorHandle out =
      host_tensor(t.dtype(), t.sizes, contiguous_strides(t.sizes), 0, t.numel(), false);
  copy_into(*out, t);
  return out;
}

std::function<TensorHandle(const RtTensor&)> DeviceMemoryOps::device_copier() const {
  return [this](const RtTensor& t) { return uncounted_clone(t); };
}

void DeviceMemoryOps::copy(RtTensor& dst, const RtTensor& src) const {
  if (cuda())
    cuda::cuda_copy_into(dst, src, stream_);
  else
    copy_into(dst, src);  // (eager's error for a dst with repeated elements, else by rows)
}

TensorHandle DeviceMemoryOps::empty(DType dtype, const Shape& shape) const {
  call_profile::Scope timed(call_profile::Phase::kAllocate);
  if (cuda())
    return cuda::cuda_strided(dtype, shape, contiguous_strides(shape), 0, shape_numel(shape),
                              device_, false, allocator_, stream_);
  return host_tensor(dtype, shape, contiguous_strides(shape), 0, shape_numel(shape), false);
}

TensorHandle DeviceMemoryOps::empty_in_order(DType dtype, const Shape& shape,
                                             std::span<const int> order) const {
  call_profile::Scope timed(call_profile::Phase::kAllocate);
  const Strides strides = strides_in_order(shape, order);
  if (cuda())
    return cuda::cuda_strided(dtype, shape, strides, 0, shape_numel(shape), device_, false,
                              allocator_, stream_);
  return host_tensor(dtype, shape, strides, 0, shape_numel(shape), false);
}

TensorHandle DeviceMemoryOps::empty_padded_rows(DType dtype, const Shape& shape,
                                                int64_t row_pitch) const {
  call_profile::Scope timed(call_profile::Phase::kAllocate);
  KILN_ASSERT(cuda() && !shape.empty() && row_pitch >= shape.back())
      << "padded rows of a " << shape.size() << "-dim tensor";
  const int64_t row_length = shape.back(),
                rows = shape_numel(shape) / std::max<int64_t>(row_length, 1);
  Strides strides = contiguous_strides(shape);
  for (size_t d = 0; d + 1 < shape.size(); ++d)
    strides[d] = strides[d] / row_length * row_pitch;
  TensorHandle out = cuda::cuda_strided(dtype, shape, strides, 0, rows * row_pitch, device_, false,
                                        allocator_, stream_);
  const auto el = static_cast<size_t>(dtype_size(dtype));
  cuda::fill_zero_2d(out->storage->device_data + row_length * el, row_pitch * el,
                     (row_pitch - row_length) * el, rows, device_.index, stream_);
  out->storage->row_length = row_length;
  out->storage->row_pitch = row_pitch;
  return out;
}

TensorHandle DeviceMemoryOps::materialize(const RtTensor& value, const Geometry& g,
                                          int64_t storage_numel) const {
  count_copy(value);
  bool covers = g.offset == 0 && shape_numel(g.sizes) == storage_numel &&
                contiguous_strides(g.sizes) == g.strides;
  if (cuda()) {
    TensorHandle out = cuda::cuda_strided(value.dtype(), g.sizes, g.strides, g.offset,
                                          storage_numel, device_, !covers, allocator_, stream_);
    cuda::cuda_copy_elements(*out, value, stream_);
    return out;
  }
  TensorHandle out =
      host_tensor(value.dtype(), g.sizes, g.strides, g.offset, storage_numel, !covers);
  if (copy_disjoint_same_dtype(*out, value)) return out;
  for (int64_t i = 0; i < out->numel(); ++i)
    copy_element(*value.storage, value.storage_index_of_linear(i), *out->storage,
                 out->storage_index_of_linear(i));
  return out;
}

std::vector<RtValue> DeviceMemoryOps::interpret_step(const Trace& body,
                                                     const std::vector<RtValue>& inputs,
                                                     ExecutionStats& stats) const {
  if (!cuda()) return interpret(body, inputs);
  // The transfers are synchronous copies outside `stream_`, which may be a non-blocking
  // stream (PyTorch's): wait for the work queued on it before reading, and for the uploads
  // before later kernels on it read them.
  cuda::synchronize(device_.index);
  std::map<const Storage*, std::shared_ptr<Storage>> down;
  std::vector<RtValue> host_inputs;
  for (const RtValue& v : inputs)
    host_inputs.push_back(to_host_value(v, down));
  std::vector<RtValue> outs = interpret(body, host_inputs);
  std::map<const Storage*, std::shared_ptr<Storage>> up;
  for (RtValue& v : outs)
    v = to_device_value(v, up);
  cuda::synchronize(device_.index);
  for (const auto* copies : {&down, &up}) {
    for (const auto& [from, to] : *copies) {
      int64_t bytes = to->numel() * static_cast<int64_t>(dtype_size(to->dtype));
      if (bytes == 0) continue;  // an empty tensor moves nothing
      ++stats.host_copies;
      stats.host_copy_bytes += bytes;
    }
  }
  return outs;
}

RtValue DeviceMemoryOps::to_host_value(
    const RtValue& v, std::map<const Storage*, std::shared_ptr<Storage>>& down) const {
  const auto* t = std::get_if<TensorHandle>(&v);
  if (!t || !(*t)->storage->on_device()) return v;
  auto it = down.find((*t)->storage.get());
  if (it == down.end()) it = down.emplace((*t)->storage.get(), cuda::to_host(**t)->storage).first;
  return RtValue(rebase(**t, it->second));
}

RtValue DeviceMemoryOps::to_device_value(
    const RtValue& v, std::map<const Storage*, std::shared_ptr<Storage>>& up) const {
  const auto* t = std::get_if<TensorHandle>(&v);
  if (!t || (*t)->storage->on_device()) return v;
  auto it = up.find((*t)->storage.get());
  if (it == up.end())
    it = up.emplace((*t)->storage.get(), cuda::to_device(**t, device_)->storage).first;
  return RtValue(rebase(**t, it->second));
}

// A host tensor of this layout, from the allocator when there is one (zero-filled when `zero`;
// kiln's own memory always is).
TensorHandle DeviceMemoryOps::host_tensor(DType dtype, const Shape& shape, const Strides& strides,
                                          int64_t offset, int64_t storage_numel, bool zero) const {
  if (!allocator_) return make_strided(dtype, shape, strides, offset, storage_numel);
  auto bytes = static_cast<size_t>(storage_numel * dtype_size(dtype));
  Allocator::Block block = allocator_->allocate(device_, bytes);
  KILN_ASSERT(block.owner && (block.host || bytes == 0))
      << "an allocator returned no host memory for a CPU tensor";
  if (zero && bytes > 0) std::memset(block.host, 0, bytes);
  auto storage = std::make_shared<Storage>();
  storage->dtype = dtype;
  storage->device = device_;
  storage->borrowed = block.host;
  storage->borrowed_numel = storage_numel;
  storage->borrowed_owner = block.owner;
  storage->from_allocator = true;
  return tensor_over(std::move(storage), shape, strides, offset);
}

TensorHandle DeviceMemoryOps::rebase(const RtTensor& t, std::shared_ptr<Storage> storage) {
  auto out = std::make_shared<RtTensor>(t);
  out->storage = std::move(storage);
  return out;
}

void DeviceMemoryOps::count_copy(const RtTensor& t) const {
  ++stats_->layout_copies;
  stats_->layout_copy_bytes += t.numel() * dtype_size(t.dtype());
}

}  // namespace kiln
