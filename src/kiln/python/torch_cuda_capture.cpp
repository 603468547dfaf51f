#include "kiln/python/torch_cuda_capture.h"

#ifdef KILN_TORCH_CUDA
#include <ATen/cuda/MemPool.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>
#endif

namespace kiln::pyext {

#ifdef KILN_TORCH_CUDA
namespace {

class TorchCapturePool : public EagerCapturePool {
 public:
  TorchCapturePool(cudaStream_t stream, int device)
      : device_(static_cast<c10::DeviceIndex>(device)),
        id_(at::cuda::MemPool::graph_pool_handle(/*is_user_created=*/false)) {
    // Only the capture stream's allocations: another thread's work on other streams keeps
    // PyTorch's usual pools.
    c10::cuda::CUDACachingAllocator::beginAllocateToPool(
        device_, id_, [stream](cudaStream_t s) { return s == stream; });
    stream_.emplace(c10::cuda::getStreamFromExternal(stream, device_));
  }
  ~TorchCapturePool() override {
    try {
      end_capture();
      c10::cuda::CUDACachingAllocator::releasePool(device_, id_);
    } catch (...) {  // at exit, after PyTorch's allocator: nothing is left to give back to
    }
  }
  void end_capture() override {
    if (!stream_) return;
    stream_.reset();  // PyTorch's current stream as before
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device_, id_);
  }

 private:
  c10::DeviceIndex device_;
  c10::MempoolId_t id_;
  std::optional<c10::cuda::CUDAStreamGuard> stream_;
};

}  // namespace

const EagerCaptureJoin* torch_capture_join() {
  static const EagerCaptureJoin join = [](void* stream, int device) {
    return std::unique_ptr<EagerCapturePool>(
        new TorchCapturePool(static_cast<cudaStream_t>(stream), device));
  };
  return &join;
}
#else
const EagerCaptureJoin* torch_capture_join() {
  return nullptr;
}
#endif

}  // namespace kiln::pyext
