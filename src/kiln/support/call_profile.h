// Host time per phase of kiln.jit calls, for bench/bench.py's split of a small call's time
// (Python / kiln's C++ by phase / inside cuLaunchKernel). Off unless the environment variable
// KILN_PROFILE_CALLS is set when kiln loads; then a phase costs two steady_clock reads.
//
// Phases nest: kExecute (the executor's whole run) contains kAllocate and kKernel, and kKernel
// contains kLaunch. One call of S1 enters them as
//   key, arguments, execute { allocate, kernel { launch } }, results
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::call_profile {

enum class Phase : int {
  kKey,        // the specialization key of the call and its cache lookup
  kArguments,  // the caller's tensors as kiln tensors
  kExecute,    // the executor's whole run, including the three below
  kAllocate,   // new buffers (PyTorch's allocator)
  kKernel,     // a CUDA kernel step: its parameter block, grid, variant and launch
  kLaunch,     // inside cuLaunchKernel
  kResults,    // the results as Python objects
  kCount,
};

extern const bool kEnabled;

// Per-step host times of each run (ExecutionStats::step_times, kiln._C.set_step_times): off
// unless turned on, then a step costs two steady_clock reads. On the CPU a step's time is its
// work; on CUDA it is the host's part of it (preparing and launching, or a synchronization).
void set_step_times(bool on);
bool step_times();

void add(Phase phase, int64_t nanoseconds);

// (phase name, seconds so far) for each phase.
std::vector<std::pair<std::string, double>> seconds();

class Scope {
 public:
  explicit Scope(Phase phase) : phase_(phase) {
    if (kEnabled) start_ = std::chrono::steady_clock::now();
  }
  ~Scope() {
    if (kEnabled)
      add(phase_, std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count());
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Phase phase_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kiln::call_profile
