// PyTorch's part in kiln's CUDA graph captures (runtime/executor.h, EagerCapturePool): while a
// program with eager_call steps is captured, PyTorch's current stream is kiln's capture stream
// and its caching allocator serves that stream from a private pool, as torch.cuda.graph does
// for its own captures. The pool lives as long as the graph; its blocks are the addresses every
// replay reads and writes.
#pragma once

#include "kiln/runtime/executor.h"

namespace kiln::pyext {

// The join for ExecuteOptions::eager_capture, or null when this torch has no CUDA (then eager
// steps keep a program out of CUDA graphs).
const EagerCaptureJoin* torch_capture_join();

}  // namespace kiln::pyext
