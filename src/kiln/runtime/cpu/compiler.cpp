#include "kiln/runtime/cpu/compiler.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

extern char** environ;

namespace kiln::cpu {

namespace {

// The compiler as the shell would find it.
std::string resolve(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::filesystem::path p = std::filesystem::path(dir.empty() ? "." : dir) / program;
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  return program;
}

// argv run to completion with stdout and stderr into `output_file`; the exit status, or -1.
int run(const std::vector<std::string>& argv, const std::string& output_file) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_text(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > limit) text = text.substr(0, limit) + "\n[...]";
  return text;
}

// The first processor's model name and feature flags: what -march=native compiles for.
std::string cpu_identity() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.empty() && !out.empty()) break;
    if (line.starts_with("model name") || line.starts_with("flags") ||
        line.starts_with("vendor_id") || line.starts_with("Features") ||
        line.starts_with("CPU part"))
      out += line + "\n";
  }
  return out;
}

// `compiler --version`: its exit status and the start of its output, asked once a process.
const std::pair<int, std::string>& compiler_version(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::pair<int, std::string>> versions;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = versions.find(path); it != versions.end()) return it->second;
  std::pair<int, std::string> version{-1, ""};
  char log[] = "/tmp/kiln-cxx-version-XXXXXX";
  int fd = mkstemp(log);
  if (fd >= 0) {
    close(fd);
    version.first = run({path, "--version"}, log);
    version.second = read_text(log, 4096);
    std::remove(log);
  }
  return versions.emplace(path, version).first->second;
}

}  // namespace

CompilerConfig default_compiler_config() {
  CompilerConfig c;
  const char* cxx = std::getenv("KILN_CXX");
  c.compiler = cxx && *cxx ? cxx : "c++";
  // -fno-trapping-math: kernels never read the floating-point exception flags, and without it
  // GCC 12 does not if-convert a select in a loop that also widens to double, so a clamp or a
  // slice_scatter's choice before a row sum's double accumulator ran scalar (clamp_ then sum(-1)
  // of 1024 x 4096 floats: 2.5 ms against eager's 0.27). It changes no value (clang's default).
  // -mprefer-vector-width=512: GCC's -march=native for AVX-512 server cores prefers 256-bit
  // vectors; the kernels' loops are long and their vector math (exp_f32, libmvec's sinf) ran at
  // half the lanes eager's kernels use. On 2 cores at 2^22 floats: S2 3.98 -> 2.84 ms (eager
  // 3.00), softmax long rows 2.24 -> 1.72, norm weight grads 4.41 -> 2.75 (bench/NOTES.md,
  // session 29). An x86 core without AVX-512 ignores it; other targets have no such option.
  c.flags = {"-std=c++20", "-O3",     "-march=native",     "-fopenmp",        "-shared",
             "-fPIC",      "-fwrapv", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
             "-w"};
  // GCC: -fno-loop-unroll-and-jam. The kernels' loop orders are chosen (a column block's vector
  // loop over 64 columns inside its loop over the rows); GCC 12 jammed two rows of a
  // channels-last x.mean((2, 3))'s block into one scalar loop over the columns: 0.43 against
  // 0.07 ms a call. (Clang has no such pass by default, and rejects the flag.)
  if (compiler_version(resolve(c.compiler)).second.find("Free Software Foundation") !=
      std::string::npos)
    c.flags.push_back("-fno-loop-unroll-and-jam");
#if defined(__x86_64__)
  c.flags.push_back("-mprefer-vector-width=512");
#endif
  c.libraries = {"-lmvec"};
  return c;
}

std::string toolchain_identity(const CompilerConfig& config) {
  std::string path = resolve(config.compiler);
  std::string id = "compiler " + path + "\n";
  const auto& [status, version] = compiler_version(path);
  if (status != -1 || !version.empty()) id += "version (" + std::to_string(status) + ") " + version;
  id += "flags";
  for (const std::string& f : config.libraries)
    id += " " + f;
  for (const std::string& f : config.flags)
    id += " " + f;
  id += "\n" + cpu_identity();
  return id;
}

int compile_shared_object(const CompilerConfig& config, const std::string& source_path,
                          const std::string& output_path, std::string* log) {
  std::vector<std::string> argv = {config.compiler};
  argv.insert(argv.end(), config.flags.begin(), config.flags.end());
  argv.insert(argv.end(), {"-x", "c++", source_path, "-o", output_path});
  argv.insert(argv.end(), config.libraries.begin(), config.libraries.end());
  std::string log_path = output_path + ".log";
  int status = run(argv, log_path);
  if (log) *log = read_text(log_path, 8192);
  std::remove(log_path.c_str());
  return status;
}

}  // namespace kiln::cpu
