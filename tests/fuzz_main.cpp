// kiln_fuzz: random programs through kiln and the reference interpreter (random_program.h).
//
//   kiln_fuzz --count N [--seed S]      N programs from seed S (default: a fresh seed); prints a
//                                       summary and every failure, shrunk
//   kiln_fuzz --program P               one program by its own seed (as failures print it)
//   options: --self-check               the interpreter against itself (checks the harness)
//            --reports K                shrink and print at most K failures (default 10)
//            --outputs-among-themselves also compare which outputs alias each other
//            --print                    with --program: print the program even if it passes
//            --in-process               run checks in this process (default: each in a child
//                                       process, so that a crash is a failure, not the end)
//            --echo                     print each program's seed before it runs (to find one
//                                       that crashes the process)
//            --kernel-coverage          with --count: only compile the programs and count the
//                                       fusion regions that lower to CPU kernels, and why not
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <string>

#include "kiln/codegen/kernel.h"
#include "kiln/passes/pipeline.h"
#include "support/random_program.h"

namespace {

int usage() {
  std::cerr << "usage: kiln_fuzz --count N [--seed S] [--self-check] [--reports K] "
               "[--outputs-among-themselves] [--in-process] [--echo]\n"
               "       kiln_fuzz --program P [--self-check] [--print] [--in-process]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln::fuzz;
  long long count = -1;
  uint64_t seed = std::random_device{}();
  seed = (seed << 32) ^ std::random_device{}();
  std::optional<uint64_t> program;
  int reports = 10;
  bool print = false;
  bool echo = false;
  bool coverage = false;
  CheckOptions options;
  options.isolate = true;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    try {
      if (arg == "--count") {
        auto v = value();
        if (!v) return usage();
        count = std::stoll(*v);
      } else if (arg == "--seed") {
        auto v = value();
        if (!v) return usage();
        seed = std::stoull(*v);
      } else if (arg == "--program") {
        auto v = value();
        if (!v) return usage();
        program = std::stoull(*v);
      } else if (arg == "--reports") {
        auto v = value();
        if (!v) return usage();
        reports = std::stoi(*v);
      } else if (arg == "--self-check") {
        options.runner = interpreter_runner();
      } else if (arg == "--outputs-among-themselves") {
        options.outputs_among_themselves = true;
      } else if (arg == "--print") {
        print = true;
      } else if (arg == "--in-process") {
        options.isolate = false;
      } else if (arg == "--echo") {
        echo = true;
      } else if (arg == "--kernel-coverage") {
        coverage = true;
      } else {
        return usage();
      }
    } catch (const std::exception&) {
      return usage();
    }
  }

  if (program) {
    RandomProgram p = generate_program(*program);
    std::optional<std::string> failure = check_program(p, options);
    if (!failure) {
      if (print) std::cout << describe(p);
      std::cout << "program " << *program << ": kiln agrees with the interpreter\n";
      return 0;
    }
    std::cout << "program " << *program << " failed: " << *failure << "\n" << describe(p);
    Shrunk small = shrink(p, *failure, options);
    std::cout << "\nshrunk (" << small.checks << " checks) to: " << small.failure << "\n"
              << describe(small.program);
    return 1;
  }
  if (count < 0) return usage();
  if (coverage) {
    int regions = 0, lowered = 0;
    std::map<std::string, int> why;
    for (long long i = 0; i < count; ++i) {
      RandomProgram p = generate_program(program_seed(seed, static_cast<uint64_t>(i)));
      kiln::CompiledProgram c;
      try {
        c = kiln::compile(p.trace, pattern_of_inputs(p.inputs));
      } catch (const std::exception&) {
        continue;
      }
      for (const kiln::Step& step : c.plan.steps) {
        if (step.kind != kiln::Step::Kind::kFusion) continue;
        ++regions;
        kiln::codegen::KernelLowering l =
            kiln::codegen::lower_kernel(step, kiln::codegen::Target::kCpu);
        if (l.kernel)
          ++lowered;
        else
          ++why[l.why_not];
      }
    }
    std::cout << lowered << " of " << regions << " fusion regions lower to CPU kernels\n";
    std::vector<std::pair<int, std::string>> sorted;
    for (const auto& [w, n] : why)
      sorted.emplace_back(n, w);
    std::sort(sorted.rbegin(), sorted.rend());
    for (const auto& [n, w] : sorted)
      std::cout << "  " << n << "  " << w << "\n";
    return 0;
  }
  if (echo) {
    int failed = 0;
    for (long long i = 0; i < count; ++i) {
      uint64_t ps = program_seed(seed, static_cast<uint64_t>(i));
      std::cerr << "program " << i << " seed " << ps << std::endl;
      RandomProgram p = generate_program(ps);
      if (auto f = check_program(p, options)) {
        ++failed;
        std::cout << "program " << i << " (seed " << ps << ") failed: " << *f << "\n";
      }
    }
    std::cout << failed << " of " << count << " failed\n";
    return failed ? 1 : 0;
  }

  std::cout << "kiln_fuzz: " << count << " programs from seed " << seed
            << (options.runner ? " (self-check: the interpreter against itself)" : "") << "\n"
            << std::flush;
  FuzzSummary s =
      run_fuzz(seed, static_cast<int>(count), options, reports, [](const FuzzSummary& so_far) {
        if (so_far.programs % 10000 == 0) {
          std::cerr << "  " << so_far.programs << " programs, " << so_far.failed << " failed, "
                    << so_far.seconds << " s\n";
        }
      });
  for (const std::string& r : s.reports)
    std::cout << "\n" << r;
  std::cout << "\n" << s.str();
  if (s.failed)
    std::cout << "seed " << seed << " (rerun: kiln_fuzz --count " << count << " --seed " << seed
              << ")\n";
  return s.failed ? 1 : 0;
}
