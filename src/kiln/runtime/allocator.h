// Where the executor puts the tensors it makes (kernel outputs, copies, returned outputs). By
// default kiln's own memory (host vectors, cuMemAlloc); the Python front end plugs in PyTorch's
// caching allocator so that outputs are ordinary torch tensors and no call pays for
// cudaMalloc/cudaFree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kiln/ir/dtype.h"

namespace kiln {

class Allocator {
 public:
  struct Block {
    std::byte* host = nullptr;    // CPU memory
    uint64_t device = 0;          // device memory (CUDA)
    std::shared_ptr<void> owner;  // frees the block when the last storage using it goes
  };
  virtual ~Allocator() = default;
  // At least `bytes` bytes on `device`, aligned to 16 bytes at least.
  virtual Block allocate(Device device, size_t bytes) = 0;
};

}  // namespace kiln
