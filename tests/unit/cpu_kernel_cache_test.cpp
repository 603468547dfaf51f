// The CPU kernels' disk cache (runtime/cpu/kernel_cache.h): a second process (a fresh cache over
// the same folder) compiles nothing, a corrupt or truncated file is detected and compiled again,
// and a compile failure says where the source is saved.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kiln/codegen/kernel.h"
#include "kiln/ir/parser.h"
#include "kiln/passes/fuse.h"
#include "kiln/runtime/cpu/kernel_cache.h"
#include "kiln/support/error.h"
#include "support/temp_dir.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// ---- the disk cache -------------------------------------------------------------------------

// A compiler that counts its compile runs in a file, then runs the real one.
struct CountingCompiler {
  TempDir dir;
  fs::path log;
  cpu::KernelCacheOptions options;
  CountingCompiler() {
    log = dir.path / "invocations";
    fs::path script = dir.path / "cxx";
    std::ofstream(script) << "#!/bin/sh\ncase \"$*\" in *-shared*) echo run >> '" << log.string()
                          << "';; esac\nexec " << cpu::default_compiler_config().compiler
                          << " \"$@\"\n";
    fs::permissions(script, fs::perms::owner_all);
    options = cpu::default_kernel_cache_options();
    options.compiler.compiler = script.string();
    options.cache_dir = (dir.path / "cache").string();
  }
  int runs() const {
    std::ifstream in(log);
    int n = 0;
    for (std::string line; std::getline(in, line);)
      ++n;
    return n;
  }
};

// Three regions of one kernel each (elementwise, a view, a reduction).
const char* const kRegions[] = {
    R"(def f(x, y):
  # x: "cpu f32[6, 5]"
  # y: "cpu f32[6, 5]"
  t0 = ltorch.mul(x, y)
  t1 = ltorch.add(t0, 1.5)
  return {"output": (t1,)}
)",
    R"(def f(x):
  # x: "cpu bf16[4, 9]"
  t0 = ltorch.transpose(x, 0, 1)
  t1 = ltorch.tanh(t0)
  return {"output": (t1,)}
)",
    R"(def f(x):
  # x: "cpu f64[3, 11]"
  t0 = ltorch.exp(x)
  t1 = ltorch.sum(t0, [1])
  return {"output": (t1,)}
)"};

// Their kernels' sources.
std::vector<std::string> some_kernel_sources() {
  std::vector<std::string> sources;
  for (const char* text : kRegions) {
    Trace t = parse_trace(text, "region");
    ExecutionPlan plan = fuse(t);
    codegen::KernelLowering l = codegen::lower_kernel(plan.steps.at(0), codegen::Target::kCpu);
    EXPECT_TRUE(l.kernel.has_value()) << l.why_not;
    if (l.kernel) sources.push_back(l.kernel->source);
  }
  return sources;
}

std::vector<const std::string*> refs(const std::vector<std::string>& v) {
  std::vector<const std::string*> r;
  for (const std::string& s : v)
    r.push_back(&s);
  return r;
}

TEST(CpuKernelCache, ASecondProcessWithTheSameFolderCompilesNothing) {
  CountingCompiler cc;
  std::vector<std::string> sources = some_kernel_sources();
  ASSERT_EQ(sources.size(), 3u);
  {
    cpu::KernelCache first(cc.options);
    std::vector<codegen::CpuKernelFn> fns = first.get(refs(sources));
    EXPECT_EQ(cc.runs(), 1);  // three kernels, one compiler run
    EXPECT_EQ(first.stats().kernels_compiled, 3);
    for (auto fn : fns)
      EXPECT_NE(fn, nullptr);
    first.get(refs(sources));  // now from memory
    EXPECT_EQ(first.stats().memory_hits, 3);
  }
  cpu::KernelCache second(cc.options);  // a fresh in-memory cache over the same folder
  std::vector<codegen::CpuKernelFn> fns = second.get(refs(sources));
  EXPECT_EQ(cc.runs(), 1);
  EXPECT_EQ(second.stats().compiler_runs, 0);
  EXPECT_EQ(second.stats().disk_hits, 3);
  for (auto fn : fns)
    EXPECT_NE(fn, nullptr);
}

// Rewrites a file with one byte changed, through a new file (the old one may be loaded).
void corrupt(const fs::path& path, size_t at) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  ASSERT_LT(at, bytes.size());
  bytes[at] = static_cast<char>(bytes[at] ^ 0x5a);
  fs::path tmp = path.string() + ".corrupt";
  std::ofstream(tmp, std::ios::binary) << bytes;
  fs::rename(tmp, path);
}

std::vector<fs::path> files_like(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with(prefix)) out.push_back(e.path());
  return out;
}

TEST(CpuKernelCache, ACorruptModuleIsCompiledAgainNotLoaded) {
  CountingCompiler cc;
  std::vector<std::string> sources = some_kernel_sources();
  { cpu::KernelCache(cc.options).get(refs(sources)); }
  ASSERT_EQ(cc.runs(), 1);
  std::vector<fs::path> modules = files_like(cc.options.cache_dir, "m-");
  ASSERT_EQ(modules.size(), 1u);
  corrupt(modules[0], fs::file_size(modules[0]) / 2);
  cpu::KernelCache again(cc.options);
  std::vector<codegen::CpuKernelFn> fns = again.get(refs(sources));
  EXPECT_EQ(cc.runs(), 2);
  EXPECT_GE(again.stats().corrupt_files, 1);
  for (auto fn : fns)
    EXPECT_NE(fn, nullptr);
  // The replaced module is whole again: a third cache loads it.
  cpu::KernelCache third(cc.options);
  third.get(refs(sources));
  EXPECT_EQ(cc.runs(), 2);
  EXPECT_EQ(third.stats().corrupt_files, 0);
}

TEST(CpuKernelCache, ACorruptOrTruncatedIndexIsCompiledAgain) {
  CountingCompiler cc;
  std::vector<std::string> sources = some_kernel_sources();
  { cpu::KernelCache(cc.options).get(refs(sources)); }
  std::vector<fs::path> index = files_like(cc.options.cache_dir, "k-");
  ASSERT_EQ(index.size(), 3u);
  corrupt(index[0], 40);
  fs::resize_file(index[1], fs::file_size(index[1]) - 7);
  cpu::KernelCache again(cc.options);
  again.get(refs(sources));
  EXPECT_EQ(again.stats().corrupt_files, 2);
  EXPECT_EQ(again.stats().disk_hits, 1);
  EXPECT_EQ(cc.runs(), 2);
}

TEST(CpuKernelCache, ACompileFailureSaysWhereTheSourceIs) {
  CountingCompiler cc;
  cpu::KernelCache cache(cc.options);
  std::string bad = "extern \"C\" void KILN_KERNEL_NAME() { this is not C++ }\n";
  try {
    cache.get(bad);
    FAIL() << "a broken kernel compiled";
  } catch (const InternalError& e) {
    std::string what = e.what();
    size_t at = what.find("saved at ");
    ASSERT_NE(at, std::string::npos) << what;
    std::string path = what.substr(at + 9, what.find('\n', at) - at - 9);
    EXPECT_TRUE(fs::exists(path)) << path;
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("this is not C++"), std::string::npos);
  }
}

}  // namespace
}  // namespace kiln
