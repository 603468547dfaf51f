// The system C++ compiler, run on generated kernel sources (DESIGN.md 3, CPU backend).
//
// The compiler is $KILN_CXX (default `c++`). Flags: -O3 -march=native -fopenmp -shared -fPIC,
// plus what keeps the kernels' values equal to the interpreter's: -fwrapv (integer arithmetic
// wraps, as the interpreter's is compiled), -ffp-contract=off (no fused multiply-add: every op
// rounds), -fno-math-errno and -fno-trapping-math (no errno, no exception flags: neither changes
// a value), and nothing else of -ffast-math.
#pragma once

#include <string>
#include <vector>

namespace kiln::cpu {

struct CompilerConfig {
  std::string compiler;
  std::vector<std::string> flags;
  // After the source: libmvec, glibc's vector math (the flat loops' std::tanh, std::exp, ... of
  // several elements at once; cpu_prelude.h declares them).
  std::vector<std::string> libraries;
};

CompilerConfig default_compiler_config();

// Everything besides the source that changes the compiled code: the compiler's resolved path and
// `--version` text, the flags, and the CPU (-march=native). Part of every cache key.
std::string toolchain_identity(const CompilerConfig& config);

// Compiles `source_path` into the shared object `output_path`. Returns the exit status (0: done);
// the compiler's output goes to `log` (at most a few kilobytes of it).
int compile_shared_object(const CompilerConfig& config, const std::string& source_path,
                          const std::string& output_path, std::string* log);

}  // namespace kiln::cpu
