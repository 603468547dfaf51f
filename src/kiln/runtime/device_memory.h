// The memory operations of one execute call on its device: the interpreter's for CPU tensors,
// the CUDA runtime's for CUDA tensors (allocation from the caller's allocator where it has one,
// copies on the caller's stream). A step that has no CUDA kernel runs in the interpreter on host
// copies of its inputs (each device storage copied down once per step), and its results are
// copied up.
//
// Ensures: every copy that changes a layout (clone_of, materialize) is counted in the call's
// ExecutionStats (layout_copies, layout_copy_bytes), every host round trip in host_copies.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "kiln/runtime/executor.h"

namespace kiln {

class DeviceMemoryOps {
 public:
  DeviceMemoryOps(Device device, const ExecuteOptions& options, ExecutionStats* stats)
      : device_(device), allocator_(options.allocator), stream_(options.stream), stats_(stats) {}
  bool cuda() const { return device_.kind == Device::Kind::kCuda; }
  Device device() const { return device_; }
  void* stream() const { return stream_; }
  Allocator* allocator() const { return allocator_; }

  // A contiguous copy (counted as a layout copy), and the same uncounted.
  TensorHandle clone_of(const RtTensor& t) const;
  TensorHandle uncounted_clone(const RtTensor& t) const;
  // A clone as a function, for the interpreter's views of device tensors (DeviceCopyScope).
  std::function<TensorHandle(const RtTensor&)> device_copier() const;
  // dst's elements from src's (eager's copy_: its errors for a dst with repeated elements).
  void copy(RtTensor& dst, const RtTensor& src) const;
  // A fresh contiguous tensor.
  TensorHandle empty(DType dtype, const Shape& shape) const;
  // A fresh dense tensor whose dims lie in memory in `order`, outermost first (a permutation of
  // the dims: Step::output_orders).
  TensorHandle empty_in_order(DType dtype, const Shape& shape, std::span<const int> order) const;
  // A fresh CUDA tensor whose rows (the last dim) are `row_pitch` elements apart, the elements
  // between the end of a row and the next zeroed (Storage::row_length: a matrix product's
  // operand read in place at tensor-core alignment).
  TensorHandle empty_padded_rows(DType dtype, const Shape& shape, int64_t row_pitch) const;
  // A fresh tensor of this layout holding `value`'s elements (a layout may repeat elements).
  TensorHandle materialize(const RtTensor& value, const Geometry& g, int64_t storage_numel) const;

  // Runs `body` in the interpreter; on CUDA, on host copies.
  std::vector<RtValue> interpret_step(const Trace& body, const std::vector<RtValue>& inputs,
                                      ExecutionStats& stats) const;
  // A device tensor's host copy (each storage copied once through `down`), and back.
  RtValue to_host_value(const RtValue& v,
                        std::map<const Storage*, std::shared_ptr<Storage>>& down) const;
  RtValue to_device_value(const RtValue& v,
                          std::map<const Storage*, std::shared_ptr<Storage>>& up) const;

 private:
  TensorHandle host_tensor(DType dtype, const Shape& shape, const Strides& strides, int64_t offset,
                           int64_t storage_numel, bool zero) const;
  static TensorHandle rebase(const RtTensor& t, std::shared_ptr<Storage> storage);
  void count_copy(const RtTensor& t) const;

  Device device_;
  Allocator* allocator_;
  void* stream_;
  ExecutionStats* stats_;
};

}  // namespace kiln
