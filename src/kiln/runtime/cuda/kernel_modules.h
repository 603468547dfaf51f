// Within the CUDA runtime: the module cache's request (a module's source, compiled once per
// device and architecture, kept in memory and on disk: cuda_kernels.h) and the launch geometry
// the region kernels and the copy kernels share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/runtime/cuda/driver.h"

namespace kiln::cuda {

constexpr unsigned kBlock = 256;  // threads per block (the emitter's __launch_bounds__)

struct ModuleRequest {
  std::string source;  // the whole module (prelude included)
  std::string key;
  Module module = nullptr;
};

// Loads or compiles the modules of `requests` for `device`, compiling the missing ones in
// parallel (KILN_COMPILE_JOBS threads).
void get_modules(std::vector<ModuleRequest>& requests, int device);

// Blocks of kBlock threads for `work` units of work, one thread each.
unsigned grid_for(int64_t work, int device);

}  // namespace kiln::cuda
