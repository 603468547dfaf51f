// Compiled CPU kernels, cached in memory and on disk (DESIGN.md 3, "Caches").
//
// In memory: kernel source (by its content hash) -> function. On disk, under the cache folder
// ($KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln):
//   m-<module key>.so   a shared object with one or more kernels, followed by a checksum trailer
//   k-<kernel key>.idx  for one kernel: its module, its symbol, its source, and a checksum
// Keys hash the source with the toolchain identity (compiler path and --version, flags, CPU) and
// the kernel prelude, so a new compiler, machine or kiln never loads an old object. Files are
// written to a temporary name and renamed into place: concurrent processes sharing the folder
// see whole files or none. A file whose checksum or recorded source does not match is never
// loaded; its kernel is compiled again and the file replaced.
//
// Kernels missing from both caches are compiled together: one compiler run for up to
// `kernels_per_module` kernels (compiling the prelude once instead of once per kernel), with up
// to `jobs` compiler runs at a time. A compile failure raises an InternalError that names the
// file the module's source was saved to.
//
// Thread-safe. Tests: tests/unit/cpu_backend_test.cpp.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/codegen/kernel.h"
#include "kiln/runtime/cpu/compiler.h"

namespace kiln::cpu {

struct KernelCacheOptions {
  std::string cache_dir;  // empty: no disk cache (objects go to a temporary folder)
  CompilerConfig compiler;
  int jobs = 2;
  int kernels_per_module = 96;
};
// From the environment: the cache folder above; KILN_COMPILE_JOBS (default 2).
KernelCacheOptions default_kernel_cache_options();

struct KernelCacheStats {
  int compiler_runs = 0;     // modules compiled
  int kernels_compiled = 0;  // kernels in them
  int memory_hits = 0;
  int disk_hits = 0;
  int corrupt_files = 0;  // cache files rejected (checksum, format or source mismatch)
};

class KernelCache {
 public:
  explicit KernelCache(KernelCacheOptions options);
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The functions for kernel sources as codegen::lower_kernel emits them, in order.
  std::vector<codegen::CpuKernelFn> get(const std::vector<const std::string*>& sources);
  codegen::CpuKernelFn get(const std::string& source) { return get({&source}).at(0); }

  // Compiles the kernels missing from the disk cache, together, without loading any into this
  // process: for a process that forks workers, which then load only what they run (loading
  // thousands of objects here would make every fork slower). Without a disk cache, get().
  void warm(const std::vector<const std::string*>& sources);

  KernelCacheStats stats() const;
  const std::string& cache_dir() const { return options_.cache_dir; }

 private:
  struct Module;
  struct IndexEntry {
    std::string module;  // file name
    std::string symbol;
  };
  std::string identity();
  // The disk key of a kernel (its source with the toolchain).
  std::string kernel_key(const std::string& source_hash);
  // The kernel's index entry when it is whole and records `source` (a bad one is removed).
  std::optional<IndexEntry> read_index(const std::string& key, const std::string& source);
  codegen::CpuKernelFn from_disk(const std::string& key, const std::string& source);
  // Whether a module file is whole (checked once per file and cache).
  bool verify_module(const std::string& module_name);
  Module* load_module(const std::string& module_name);
  // Compiles (key, source) pairs into modules and writes their index entries; with `fns`, also
  // loads them into `fns` and the memory cache.
  void compile(const std::vector<std::pair<std::string, const std::string*>>& kernels,
               std::vector<codegen::CpuKernelFn>* fns);
  std::string work_dir();

  KernelCacheOptions options_;
  mutable std::mutex mutex_;
  std::string identity_;       // computed on first use (runs the compiler's --version)
  std::string identity_hash_;  // its content hash, part of every key
  std::string temp_dir_;       // where modules go without a disk cache
  std::unordered_map<std::string, codegen::CpuKernelFn> memory_;  // by content_hash(source)
  std::map<std::string, std::unique_ptr<Module>> modules_;        // loaded, by file name
  std::set<std::string> verified_;                                // whole module files
  KernelCacheStats stats_;
};

// The process's cache, with default_kernel_cache_options().
KernelCache& kernel_cache();

}  // namespace kiln::cpu
