// The CUDA driver API, loaded with dlopen (libcuda.so.1) so that kiln builds and runs on
// machines without a GPU or driver: CUDA tensors then raise a clear UserError while the CPU path
// keeps working. Every call's status is checked and a failure names the call.
//
// One context per device (the device's primary context, the one the CUDA runtime and PyTorch
// use), made current on the calling thread before each use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kiln::cuda {

using DevicePtr = uint64_t;  // CUdeviceptr
using Stream = void*;        // CUstream; nullptr is the legacy default stream
using Function = void*;      // CUfunction
using Module = void*;        // CUmodule

// Whether a CUDA device can be used; when not, `why` says why (no driver, no device, ...).
bool cuda_available(std::string* why = nullptr);
int device_count();

struct DeviceInfo {
  int compute_capability = 0;  // 90 for sm_90
  int multiprocessors = 0;
  std::string name;
};
// Raises a UserError naming the device when there is no usable CUDA device `index`.
const DeviceInfo& device_info(int index);

// Makes the device's primary context current on this thread.
void use_device(int index);

// Device memory, freed when the last owner lets go.
struct DeviceMemory {
  DevicePtr ptr = 0;
  size_t bytes = 0;
  int device = 0;
  ~DeviceMemory();
};
std::shared_ptr<DeviceMemory> allocate(int device, size_t bytes);

void copy_to_device(DevicePtr dst, const void* src, size_t bytes, int device);
void copy_to_host(void* dst, DevicePtr src, size_t bytes, int device);
void copy_on_device(DevicePtr dst, DevicePtr src, size_t bytes, int device, Stream stream);
void fill_zero(DevicePtr dst, size_t bytes, int device, Stream stream);
void synchronize(int device);

Module load_module(const std::string& cubin, int device);
Function get_function(Module module, const std::string& name);
// Launches with one parameter: the `param_bytes` bytes at `param` (an argument block).
void launch(Function f, unsigned grid, unsigned block, const void* param, size_t param_bytes,
            Stream stream);

// Device time between two points of a stream, for benchmarks.
class EventTimer {
 public:
  explicit EventTimer(int device);
  ~EventTimer();
  void start(Stream stream = nullptr);
  float stop_ms(Stream stream = nullptr);  // synchronizes

 private:
  int device_;
  void* begin_ = nullptr;
  void* end_ = nullptr;
};

}  // namespace kiln::cuda
