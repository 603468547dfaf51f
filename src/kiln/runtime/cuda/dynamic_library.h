// What the CUDA libraries kiln loads with dlopen (the driver, NVRTC, cuBLAS, cuBLASLt) share:
// binding a symbol to a typed function pointer, opening the first library of a list that exists,
// and one library handle per device, made on first use.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <map>
#include <mutex>

#include "kiln/runtime/cuda/driver.h"

namespace kiln::cuda {

// `*fn` = the symbol `name` of the library `handle`; false when it has none.
template <class F>
bool bind_symbol(void* handle, const char* name, F** fn) {
  *fn = reinterpret_cast<F*>(dlsym(handle, name));
  return *fn != nullptr;
}

// The first of `names` that dlopen finds (nullptr: none).
inline void* open_first(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return handle;
  return nullptr;
}

// One handle per device made by `create(device)` with the device current, kept for the
// process: cublasCreate's and cublasLtCreate's (`Tag` tells the libraries' maps apart).
template <class Tag, class Handle, class Create>
Handle handle_per_device(int device, Create create) {
  static std::mutex mutex;
  static std::map<int, Handle> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  use_device(device);
  Handle h = create();
  handles[device] = h;
  return h;
}

}  // namespace kiln::cuda
