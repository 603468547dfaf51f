#include "kiln/runtime/cpu/kernel_cache.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "kiln/runtime/cache_files.h"
#include "kiln/support/error.h"

namespace kiln::cpu {

namespace fs = std::filesystem;

struct KernelCache::Module {
  void* handle = nullptr;
};

namespace {

std::string symbol_for(const std::string& key) {
  return "kiln_kernel_" + key;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

}  // namespace

KernelCacheOptions default_kernel_cache_options() {
  KernelCacheOptions o;
  o.cache_dir = default_cache_dir();
  o.compiler = default_compiler_config();
  o.jobs = std::max(1, std::atoi(env_or("KILN_COMPILE_JOBS", "2").c_str()));
  return o;
}

KernelCache::KernelCache(KernelCacheOptions options) : options_(std::move(options)) {
  if (options_.cache_dir.empty()) return;
  std::error_code ec;
  fs::create_directories(options_.cache_dir, ec);
  if (ec || access(options_.cache_dir.c_str(), W_OK) != 0) {
    std::cerr << "kiln: the kernel cache folder " << options_.cache_dir
              << " cannot be written; kernels are compiled without a disk cache (set "
                 "KILN_CACHE_DIR to a writable folder)\n";
    options_.cache_dir.clear();
  }
}

KernelCache::~KernelCache() {
  // Loaded modules stay loaded: functions handed out may still be called.
  if (!temp_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(temp_dir_, ec);
  }
}

KernelCacheStats KernelCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::string KernelCache::identity() {
  if (identity_.empty()) {
    // The prelude is compiled into every module but is not part of a kernel's source: without
    // it in the key, a kiln whose prelude changed would load kernels built with the old one.
    identity_ = toolchain_identity(options_.compiler) + "prelude " +
                content_hash(codegen::cpu_kernel_prelude()) + "\n";
    identity_hash_ = content_hash(identity_);
  }
  return identity_;
}

std::string KernelCache::kernel_key(const std::string& source_hash) {
  identity();
  return content_hash(identity_hash_ + ":" + source_hash);
}

std::string KernelCache::work_dir() {
  if (!options_.cache_dir.empty()) return options_.cache_dir;
  if (temp_dir_.empty()) {
    std::string pattern = (fs::temp_directory_path() / "kiln-kernels-XXXXXX").string();
    KILN_ASSERT(mkdtemp(pattern.data()) != nullptr)
        << "cannot create a temporary folder for CPU kernels at " << pattern;
    temp_dir_ = pattern;
  }
  return temp_dir_;
}

bool KernelCache::verify_module(const std::string& module_name) {
  if (verified_.contains(module_name)) return true;
  fs::path path = fs::path(work_dir()) / module_name;
  std::optional<std::string> bytes = read_file(path);
  if (!bytes) return false;
  if (!verified_payload(*bytes)) {
    ++stats_.corrupt_files;
    std::error_code ec;
    fs::remove(path, ec);
    return false;
  }
  verified_.insert(module_name);
  return true;
}

KernelCache::Module* KernelCache::load_module(const std::string& module_name) {
  auto it = modules_.find(module_name);
  if (it != modules_.end()) return it->second.get();
  if (!verify_module(module_name)) return nullptr;
  fs::path path = fs::path(work_dir()) / module_name;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    ++stats_.corrupt_files;
    verified_.erase(module_name);
    return nullptr;
  }
  auto m = std::make_unique<Module>();
  m->handle = handle;
  Module* raw = m.get();
  modules_[module_name] = std::move(m);
  return raw;
}

std::optional<KernelCache::IndexEntry> KernelCache::read_index(const std::string& key,
                                                               const std::string& source) {
  fs::path path = fs::path(options_.cache_dir) / ("k-" + key + ".idx");
  std::optional<std::string> bytes = read_file(path);
  if (!bytes) return std::nullopt;
  // "kiln-kernel 1\nmodule <file>\nsymbol <name>\n<source>", then the trailer.
  std::optional<std::string_view> payload = verified_payload(*bytes);
  IndexEntry entry;
  bool ok = payload.has_value();
  if (ok) {
    std::string_view p = *payload;
    auto line = [&](std::string_view prefix, std::string* value) {
      if (!p.starts_with(prefix)) return false;
      size_t end = p.find('\n');
      if (end == std::string_view::npos) return false;
      *value = std::string(p.substr(prefix.size(), end - prefix.size()));
      p.remove_prefix(end + 1);
      return true;
    };
    std::string version;
    ok = line("kiln-kernel ", &version) && version == "1" && line("module ", &entry.module) &&
         line("symbol ", &entry.symbol) && p == source &&
         entry.module.find('/') == std::string::npos;
  }
  if (!ok) {
    ++stats_.corrupt_files;
    std::error_code ec;
    fs::remove(path, ec);
    return std::nullopt;
  }
  return entry;
}

codegen::CpuKernelFn KernelCache::from_disk(const std::string& key, const std::string& source) {
  std::optional<IndexEntry> entry = read_index(key, source);
  if (!entry) return nullptr;
  Module* m = load_module(entry->module);
  if (!m) return nullptr;
  return reinterpret_cast<codegen::CpuKernelFn>(dlsym(m->handle, entry->symbol.c_str()));
}

void KernelCache::compile(const std::vector<std::pair<std::string, const std::string*>>& kernels,
                          std::vector<codegen::CpuKernelFn>* fns) {
  // Modules: few enough to share the prelude's cost, enough to keep `jobs` compilers busy.
  size_t n = kernels.size();
  size_t per = static_cast<size_t>(std::max(1, options_.kernels_per_module));
  size_t count = std::max((n + per - 1) / per,
                          std::min<size_t>(static_cast<size_t>(options_.jobs), (n + 3) / 4));
  count = std::max<size_t>(1, std::min(count, n));
  struct Job {
    std::vector<size_t> members;  // indices into `kernels`
    std::string name;             // m-<key>.so
    std::string source;
    bool cached = false;
    std::string error;
  };
  std::vector<Job> jobs(count);
  for (size_t i = 0; i < n; ++i)
    jobs[i * count / n].members.push_back(i);
  const std::string dir = work_dir();
  const bool disk = !options_.cache_dir.empty();
  for (Job& job : jobs) {
    std::vector<std::pair<std::string, const std::string*>> named;
    for (size_t i : job.members)
      named.emplace_back(symbol_for(kernels[i].first), kernels[i].second);
    job.source = codegen::module_source(codegen::Target::kCpu, named);
    job.name = "m-" + content_hash(identity_hash_ + ":" + job.source) + ".so";
    // Another process may have compiled this very module already.
    job.cached = disk && verify_module(job.name);
  }
  auto build = [&](Job& job) {
    fs::path src = temporary_path(dir, job.name + ".cpp");
    fs::path obj = temporary_path(dir, job.name);
    std::string log;
    if (!write_file(src, job.source)) {
      job.error = "cannot write the kernel source to " + src.string();
      return;
    }
    int status = compile_shared_object(options_.compiler, src.string(), obj.string(), &log);
    std::error_code ec;
    if (status != 0) {
      fs::path saved = fs::path(dir) / ("failed-" + job.name.substr(2, 32) + ".cpp");
      fs::rename(src, saved, ec);
      if (ec) saved = src;
      fs::remove(obj, ec);
      job.error = "the C++ compiler (" + options_.compiler.compiler + ") failed with status " +
                  std::to_string(status) + " on generated CPU kernels; the source is saved at " +
                  saved.string() + "\n" + log;
      return;
    }
    fs::remove(src, ec);
    std::optional<std::string> bytes = read_file(obj);
    bool ok = bytes && write_file(obj, *bytes + checksum_trailer(*bytes));
    if (ok) {
      fs::rename(obj, fs::path(dir) / job.name, ec);
      ok = !ec;
    }
    if (!ok) {
      fs::remove(obj, ec);
      job.error = "cannot write the compiled kernels to " + (fs::path(dir) / job.name).string();
    }
  };
  std::vector<Job*> pending;
  for (Job& job : jobs)
    if (!job.cached) pending.push_back(&job);
  for (size_t start = 0; start < pending.size();) {
    size_t batch = std::min(pending.size() - start, static_cast<size_t>(options_.jobs));
    std::vector<std::thread> threads;
    for (size_t t = 1; t < batch; ++t)
      threads.emplace_back(build, std::ref(*pending[start + t]));
    build(*pending[start]);
    for (std::thread& th : threads)
      th.join();
    start += batch;
  }
  for (Job* job : pending) {
    KILN_ASSERT(job->error.empty()) << job->error;
    ++stats_.compiler_runs;
    stats_.kernels_compiled += static_cast<int>(job->members.size());
    verified_.insert(job->name);
  }
  for (Job& job : jobs) {
    // The index entries, once their module is in place.
    if (disk) {
      for (size_t i : job.members) {
        const auto& [key, source] = kernels[i];
        std::string index =
            "kiln-kernel 1\nmodule " + job.name + "\nsymbol " + symbol_for(key) + "\n" + *source;
        write_atomically(fs::path(dir) / ("k-" + key + ".idx"), index + checksum_trailer(index));
      }
    }
    if (!fns) continue;
    Module* m = load_module(job.name);
    KILN_ASSERT(m != nullptr) << "cannot load the compiled CPU kernels " << dir << "/" << job.name
                              << ": " << dlerror();
    for (size_t i : job.members) {
      const auto& [key, source] = kernels[i];
      std::string symbol = symbol_for(key);
      auto fn = reinterpret_cast<codegen::CpuKernelFn>(dlsym(m->handle, symbol.c_str()));
      KILN_ASSERT(fn != nullptr) << "kernel " << symbol << " is missing from " << job.name;
      (*fns)[i] = fn;
      memory_[content_hash(*source)] = fn;
    }
  }
}

std::vector<codegen::CpuKernelFn> KernelCache::get(const std::vector<const std::string*>& sources) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<codegen::CpuKernelFn> fns(sources.size(), nullptr);
  std::vector<std::string> hashes;
  std::vector<std::pair<std::string, const std::string*>> missing;
  std::unordered_map<std::string, size_t> missing_at;  // source hash -> position in `missing`
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string& source = *sources[i];
    hashes.push_back(content_hash(source));
    auto it = memory_.find(hashes[i]);
    if (it != memory_.end()) {
      fns[i] = it->second;
      ++stats_.memory_hits;
      continue;
    }
    if (missing_at.contains(hashes[i])) continue;
    std::string key = kernel_key(hashes[i]);
    if (!options_.cache_dir.empty()) {
      if (codegen::CpuKernelFn fn = from_disk(key, source)) {
        memory_[hashes[i]] = fn;
        fns[i] = fn;
        ++stats_.disk_hits;
        continue;
      }
    }
    missing_at[hashes[i]] = missing.size();
    missing.emplace_back(key, &source);
  }
  if (!missing.empty()) {
    std::vector<codegen::CpuKernelFn> compiled(missing.size(), nullptr);
    compile(missing, &compiled);
  }
  for (size_t i = 0; i < sources.size(); ++i)
    if (!fns[i]) fns[i] = memory_.at(hashes[i]);
  return fns;
}

void KernelCache::warm(const std::vector<const std::string*>& sources) {
  if (options_.cache_dir.empty()) {
    get(sources);
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, const std::string*>> missing;
  std::set<std::string> seen;
  for (const std::string* source : sources) {
    std::string hash = content_hash(*source);
    if (memory_.contains(hash) || !seen.insert(hash).second) continue;
    std::string key = kernel_key(hash);
    std::optional<IndexEntry> entry = read_index(key, *source);
    if (entry && verify_module(entry->module)) continue;
    missing.emplace_back(key, source);
  }
  if (!missing.empty()) compile(missing, nullptr);
}

KernelCache& kernel_cache() {
  static KernelCache cache(default_kernel_cache_options());
  return cache;
}

}  // namespace kiln::cpu
