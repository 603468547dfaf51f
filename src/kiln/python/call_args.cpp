#include "kiln/python/call_args.h"

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <string>

#include "kiln/python/first_seen.h"
#include "kiln/python/torch_values.h"
#include "kiln/support/error.h"

namespace kiln::pyext {

namespace {

std::shared_ptr<void> borrowed_device_memory() {
  // The caller's tensors keep their memory alive during the call; a device storage only needs a
  // non-null owner to count as one (Storage::on_device).
  static const std::shared_ptr<void> token = std::make_shared<int>(0);
  return token;
}

// Points `storage` at `t`'s memory.
void borrow_memory(Storage& storage, const at::Tensor& t) {
  auto numel = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
  auto* base = static_cast<std::byte*>(const_cast<void*>(t.storage().data()));
  if (storage.device == Device::cpu()) {
    storage.borrowed = base;
    storage.borrowed_numel = numel;
  } else {
    storage.device_data = reinterpret_cast<uint64_t>(base);
    storage.device_numel = numel;
    storage.device_owner = borrowed_device_memory();
  }
}

void take_layout(RtTensor& handle, const at::Tensor& t) {
  handle.sizes.assign(t.sizes().begin(), t.sizes().end());
  handle.strides.assign(t.strides().begin(), t.strides().end());
  handle.offset = t.storage_offset();
}

}  // namespace

int CallArgs::first_leaf_over(const Storage* storage) const {
  auto it = std::lower_bound(storage_arg.begin(), storage_arg.end(), std::make_pair(storage, -1));
  return it != storage_arg.end() && it->first == storage ? it->second : -1;
}

CallArgs make_args(const std::vector<PyObject*>& tensor_leaves) {
  CallArgs call;
  thread_local FirstSeenNumbers storage_numbers, object_numbers;
  storage_numbers.reset(tensor_leaves.size());
  object_numbers.reset(tensor_leaves.size());
  std::vector<std::shared_ptr<Storage>> storages;  // by first-seen number
  call.values.reserve(tensor_leaves.size());
  call.objects = tensor_leaves;
  for (size_t i = 0; i < tensor_leaves.size(); ++i) {
    PyObject* object = tensor_leaves[i];
    auto k = static_cast<size_t>(object_numbers(object));
    if (k < call.distinct.size()) {  // an object seen at an earlier leaf
      ++call.distinct[k].leaves;
      call.values.push_back(call.values[call.distinct[k].first_leaf]);
      continue;
    }
    const at::Tensor& t = THPVariable_Unpack(object);
    std::optional<DType> dtype = kiln_dtype(t.scalar_type());
    if (!dtype)
      throw UnsupportedError(std::string("kiln does not support tensors of dtype ") +
                             c10::toString(t.scalar_type()) + ".");
    if (t.layout() != at::kStrided)
      throw UnsupportedError("kiln supports strided (dense) tensors only.");
    auto n = static_cast<size_t>(storage_numbers(storage_identity(t, object)));
    if (n == storages.size()) {
      auto storage = std::make_shared<Storage>();
      storage->dtype = *dtype;
      storage->device = kiln_device(t.device());
      borrow_memory(*storage, t);
      storages.push_back(storage);
      call.storage_arg.emplace_back(storage.get(), static_cast<int>(i));
    } else if (storages[n]->dtype != *dtype) {
      throw UnsupportedError(
          "kiln: two arguments share memory with different dtypes; kiln does not support that.");
    }
    auto handle = std::make_shared<RtTensor>();
    handle->storage = storages[n];
    take_layout(*handle, t);
    call.values.emplace_back(std::move(handle));
    call.distinct.push_back({i, 1, 0});
  }
  for (CallArgs::Object& o : call.distinct)
    o.objects_on_storage = std::get<TensorHandle>(call.values[o.first_leaf])->storage.use_count() -
                           1;  // less `storages`' own reference
  std::sort(call.storage_arg.begin(), call.storage_arg.end());
  return call;
}

// A kept argument is reused when the program's run left no reference to it (a result of the
// call that is a view of the caller's memory is a torch view by then) and its storage is still
// the caller's borrowed memory. A reference elsewhere makes new arguments: never wrong, only
// slower.
CallArgs ArgumentPool::take(const std::vector<PyObject*>& tensor_leaves) {
  if (!kept_) return make_args(tensor_leaves);
  CallArgs call = std::move(*kept_);
  kept_.reset();
  bool reusable = call.values.size() == tensor_leaves.size();
  for (size_t k = 0; reusable && k < call.distinct.size(); ++k) {
    const CallArgs::Object& o = call.distinct[k];
    const TensorHandle& h = std::get<TensorHandle>(call.values[o.first_leaf]);
    const Storage& s = *h->storage;
    reusable = h.use_count() == o.leaves && h->storage.use_count() == o.objects_on_storage &&
               call.first_leaf_over(&s) >= 0 && s.bytes.empty() && !s.borrowed_owner &&
               !s.reinterprets && !s.from_allocator;
  }
  if (!reusable) return make_args(tensor_leaves);
  call.objects = tensor_leaves;
  for (const CallArgs::Object& o : call.distinct) {
    const at::Tensor& t = THPVariable_Unpack(tensor_leaves[o.first_leaf]);
    RtTensor& handle = *std::get<TensorHandle>(call.values[o.first_leaf]);
    take_layout(handle, t);
    borrow_memory(*handle.storage, t);
  }
  return call;
}

}  // namespace kiln::pyext
