// Running the differential harness on CUDA: the eager trace retyped to a CUDA device, the
// caller's tensors copied to the device with their sharing intact (one device storage per host
// storage, one device object per host object), compile + execute there, and every effect brought
// back: input storages and metadata copied into the host tensors, outputs mapped to the host
// objects, views and fresh tensors they are on the device.
#pragma once

#include "kiln/ir/trace.h"
#include "support/random_program.h"

namespace kiln::test {

// The trace with every tensor on `device` (types and device arguments of creation ops).
Trace on_device(const Trace& trace, Device device);

// The system under test on CUDA device `index` (for fuzz::CheckOptions::runner).
fuzz::Runner cuda_runner(int index = 0);

}  // namespace kiln::test
