#include "kiln/support/call_profile.h"

#include <array>
#include <atomic>
#include <cstdlib>

namespace kiln::call_profile {

const bool kEnabled = std::getenv("KILN_PROFILE_CALLS") != nullptr;

namespace {
std::atomic<bool> step_times_on{false};
std::array<std::atomic<int64_t>, static_cast<size_t>(Phase::kCount)> nanoseconds{};
constexpr std::array<const char*, static_cast<size_t>(Phase::kCount)> kNames = {
    "key", "arguments", "execute", "allocate", "kernel", "launch", "results"};
}  // namespace

void set_step_times(bool on) {
  step_times_on.store(on, std::memory_order_relaxed);
}

bool step_times() {
  return step_times_on.load(std::memory_order_relaxed);
}

void add(Phase phase, int64_t ns) {
  nanoseconds[static_cast<size_t>(phase)].fetch_add(ns, std::memory_order_relaxed);
}

std::vector<std::pair<std::string, double>> seconds() {
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < kNames.size(); ++i)
    out.emplace_back(kNames[i], static_cast<double>(nanoseconds[i].load()) * 1e-9);
  return out;
}

}  // namespace kiln::call_profile
