#include "kiln/runtime/cuda/nvrtc.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include "kiln/runtime/cache_files.h"
#include "kiln/runtime/cuda/dynamic_library.h"
#include "kiln/support/error.h"

namespace kiln::cuda {

namespace {

// The slice of nvrtc.h kiln uses (the C API is stable across CUDA releases).
using nvrtcResult = int;
using nvrtcProgram = void*;

struct Nvrtc {
  void* handle = nullptr;
  std::string why_not;
  const char* (*GetErrorString)(nvrtcResult) = nullptr;
  nvrtcResult (*Version)(int*, int*) = nullptr;
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*) = nullptr;
  nvrtcResult (*DestroyProgram)(nvrtcProgram*) = nullptr;
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*) = nullptr;
};

const Nvrtc& nvrtc() {
  static const Nvrtc lib = [] {
    Nvrtc n;
    std::vector<std::string> names;
    if (const char* env = std::getenv("KILN_NVRTC_LIBRARY"); env && *env) names.emplace_back(env);
    for (const char* base : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) {
      names.emplace_back(base);
      names.emplace_back(std::string("/usr/local/cuda/lib64/") + base);
    }
    for (const std::string& name : names) {
      n.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (n.handle) break;
    }
    if (!n.handle) {
      n.why_not =
          "NVRTC was not found (tried libnvrtc.so.13, libnvrtc.so.12 and libnvrtc.so; "
          "set KILN_NVRTC_LIBRARY to its path)";
      return n;
    }
    bool ok = bind_symbol(n.handle, "nvrtcGetErrorString", &n.GetErrorString) &&
              bind_symbol(n.handle, "nvrtcVersion", &n.Version) &&
              bind_symbol(n.handle, "nvrtcCreateProgram", &n.CreateProgram) &&
              bind_symbol(n.handle, "nvrtcDestroyProgram", &n.DestroyProgram) &&
              bind_symbol(n.handle, "nvrtcCompileProgram", &n.CompileProgram) &&
              bind_symbol(n.handle, "nvrtcGetProgramLogSize", &n.GetProgramLogSize) &&
              bind_symbol(n.handle, "nvrtcGetProgramLog", &n.GetProgramLog) &&
              bind_symbol(n.handle, "nvrtcGetCUBINSize", &n.GetCUBINSize) &&
              bind_symbol(n.handle, "nvrtcGetCUBIN", &n.GetCUBIN);
    if (!ok) {
      n.why_not = "the NVRTC library found lacks nvrtcGetCUBIN (CUDA 11.1 or newer is needed)";
      n.handle = nullptr;
    }
    return n;
  }();
  return lib;
}

const Nvrtc& loaded() {
  const Nvrtc& n = nvrtc();
  KILN_CHECK(n.handle) << "CUDA kernels need NVRTC: " << n.why_not << ".";
  return n;
}

void check(const Nvrtc& n, nvrtcResult r, const char* call) {
  KILN_ASSERT(r == 0) << call << " failed: " << n.GetErrorString(r);
}

}  // namespace

bool nvrtc_available(std::string* why) {
  const Nvrtc& n = nvrtc();
  if (!n.handle && why) *why = n.why_not;
  return n.handle != nullptr;
}

std::string nvrtc_version() {
  const Nvrtc& n = loaded();
  int major = 0, minor = 0;
  check(n, n.Version(&major, &minor), "nvrtcVersion");
  return std::to_string(major) + "." + std::to_string(minor);
}

NvrtcOutput nvrtc_compile(const std::string& source, int arch, const std::string& name) {
  const Nvrtc& n = loaded();
  nvrtcProgram program = nullptr;
  std::string file = name + ".cu";
  check(n, n.CreateProgram(&program, source.c_str(), file.c_str(), 0, nullptr, nullptr),
        "nvrtcCreateProgram");
  // -arch=sm_XX (not compute_XX) makes NVRTC emit SASS for exactly that architecture.
  std::string arch_option = "-arch=sm_" + std::to_string(arch);
  const char* options[] = {arch_option.c_str(), "-std=c++20", "-default-device", kNvrtcMathOption};
  nvrtcResult compiled = n.CompileProgram(program, 4, options);
  size_t log_size = 0;
  check(n, n.GetProgramLogSize(program, &log_size), "nvrtcGetProgramLogSize");
  std::string log(log_size, '\0');
  if (log_size > 0) check(n, n.GetProgramLog(program, log.data()), "nvrtcGetProgramLog");
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n'))
    log.pop_back();
  if (compiled != 0) {
    n.DestroyProgram(&program);
    std::filesystem::path saved =
        std::filesystem::temp_directory_path() / ("kiln-failed-" + content_hash(source) + ".cu");
    bool written = write_file(saved, source);
    KILN_ASSERT(false) << "NVRTC could not compile a generated kernel ("
                       << n.GetErrorString(compiled) << "); its source is "
                       << (written ? "saved in " + saved.string() : std::string("not saved"))
                       << ". NVRTC said:\n"
                       << log.substr(0, 4000);
  }
  size_t cubin_size = 0;
  check(n, n.GetCUBINSize(program, &cubin_size), "nvrtcGetCUBINSize");
  NvrtcOutput out;
  out.cubin.resize(cubin_size);
  check(n, n.GetCUBIN(program, out.cubin.data()), "nvrtcGetCUBIN");
  n.DestroyProgram(&program);
  out.log = std::move(log);
  return out;
}

}  // namespace kiln::cuda
