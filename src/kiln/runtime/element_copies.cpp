// The executor's runs of single-element writeback copies on CUDA (plan.h, Step::Kind::kCopy):
// consecutive copies of one element each go to the device as one launch
// (cuda_copy_single_elements), not a copy each.
//
//   writeback(t0)  # writes steps_0 <- t0     one kiln_element_copies launch
//   writeback(t1)  # writes steps_1 <- t1  -> for all of them
//   ...
//
// AdamW's step counts make such runs: a parameter's region adds one to its 0-d count and reads
// the new count at every element, so the region may not store the count where its other
// elements read it, and place_writebacks copies it after everything. 148 parameters were 148
// copies a step.
#include <algorithm>
#include <chrono>

#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/program_run.h"
#include "kiln/support/call_profile.h"

namespace kiln::detail {

namespace {

struct ByteRange {
  uint64_t first = 0, end = 0;
  bool overlaps(const ByteRange& o) const { return first < o.end && o.first < end; }
};

ByteRange element_bytes(const RtTensor& t) {
  const auto size = static_cast<uint64_t>(dtype_size(t.dtype()));
  const uint64_t first = t.storage->device_data + static_cast<uint64_t>(t.offset) * size;
  return {first, first + size};
}

}  // namespace

// Requires: memory_.cuda(). The run stops before a copy that is not one element of the same
// dtype on each side, or that reads or writes memory an earlier copy of the run writes (or
// writes memory one reads): then the copies of the run commute, and one launch is running them
// in order.
size_t ProgramRun::run_element_copies(size_t s) {
  const std::vector<Step>& steps = program_.plan.steps;
  std::vector<cuda::ElementCopy> copies;
  std::vector<ByteRange> read, written;
  size_t end = s;
  for (; end < steps.size(); ++end) {
    const Step& step = steps[end];
    if (step.kind != Step::Kind::kCopy || step.writebacks.size() != 1) break;
    const Step::Writeback& wb = step.writebacks[0];
    const auto* value = std::get_if<TensorHandle>(&env_.at(wb.value));
    if (!value) break;
    const TensorHandle dst = window_of(wb.target, wb.window);
    const RtTensor& src = **value;
    if (dst->numel() != 1 || src.numel() != 1 || dst->dtype() != src.dtype() ||
        !src.storage->on_device() || !dst->storage->on_device() || dst->device() != src.device())
      break;
    const ByteRange r = element_bytes(src), w = element_bytes(*dst);
    auto touches = [](const std::vector<ByteRange>& ranges, const ByteRange& b) {
      return std::any_of(ranges.begin(), ranges.end(),
                         [&b](const ByteRange& a) { return a.overlaps(b); });
    };
    if (touches(written, r) || touches(written, w) || touches(read, w) || r.overlaps(w)) break;
    read.push_back(r);
    written.push_back(w);
    copies.push_back({r.first, w.first, static_cast<int64_t>(w.end - w.first)});
  }
  if (copies.size() < 2) return 0;
  const bool timed = call_profile::step_times();
  const auto start =
      timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  cuda::cuda_copy_single_elements(copies, memory_.device().index, memory_.stream());
  stats_->writebacks_copied += static_cast<int>(copies.size());
  if (timed)
    stats_->step_times.push_back(
        {static_cast<int>(s), "element copies",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
  return copies.size();
}

}  // namespace kiln::detail
