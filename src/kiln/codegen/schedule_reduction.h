// The schedule of a CUDA nest whose elements are reductions: how the threads of a nest over a
// reduction's output (`x.sum(-1)`, `x.sum(0)`, a layer norm's weight gradient) share the
// reduced elements.
//
// Requires: the facts of the nest's element-level reductions, gathered by a first (flat)
// emission of the nest: reductions whose output index is the nest's own element. (Reductions at
// row level, a row statistic below the nest's last dim, make a row nest and are not chosen here.)
// Ensures: a schedule the emitter can express for those facts, and its parameters:
// - kSerial: one thread per element loops over the reduced elements (short reductions, argmax
//   and argmin, and outer reductions with enough elements to fill the device: their loops read
//   neighbouring addresses in neighbouring threads);
// - kRowPerElement: an inner reduction (over the input's last dim, which is contiguous in the
//   common layout): the nest runs as a row nest with one row per element, a warp or a block of
//   threads over its reduced elements, combined by warp shuffles or a block reduction;
// - kColumns: an outer reduction over few elements: a block of `tile` consecutive elements x
//   `lanes` threads each, the lanes splitting the reduced elements and combined through shared
//   memory; the tile's threads read neighbouring addresses (coalesced), and the tile is narrowed
//   (down to 32 bytes a row, one memory sector) until the blocks fill the device; then the lanes
//   are doubled (up to 1024 threads a block, 64 elements a lane) while the device holds the
//   threads, so that enough loads are in flight.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::codegen {

struct ElementReductions {
  int count = 0;        // reductions whose output index is the nest's element
  int arg = 0;          // ... of them argmax or argmin (kept serial: no cooperative form)
  bool inner = false;   // one of them reduces its input's last dim
  int64_t longest = 0;  // the most elements one of them combines
  int64_t numel = 0;    // the nest's elements
  int64_t widest = 1;   // bytes of the widest dtype the kernel reads
};

struct ReductionSchedule {
  enum class Kind { kSerial, kRowPerElement, kColumns };
  Kind kind = Kind::kSerial;
  int tile = 0;   // kColumns: elements per block
  int lanes = 0;  // kColumns: threads per element (tile * lanes threads a block)
  // As the kernel's comment shows it: "columns (tile 16, 16 lanes)".
  std::string describe() const;
};

// The H200's multiprocessors: a nest of at least this many blocks keeps every one busy.
constexpr int64_t kDeviceMultiprocessors = 132;

// `block` is the kernel's threads per block.
ReductionSchedule choose_reduction_schedule(const ElementReductions& facts, int block);

// Whether an outer reduction (one not over its input's last dim) into `outputs` elements takes
// the column schedule (when longer than a few elements and not an argmax).
bool outer_reduction_in_columns(int64_t outputs);

// Whether a reduction nest of `blocks` blocks that reads `bytes` leaves the device so empty that
// it would run slower than eager PyTorch's kernels (which split such reductions across the
// device): fewer blocks than the H200 has SMs, each reading more than kMaxBytesPerLoneBlock. A
// row nest then splits its rows across blocks (schedule_cuda_rows.cpp); a column nest is not
// lowered and runs as PyTorch ops on the device.
bool leaves_the_device_idle(int64_t blocks, int64_t bytes);

// About the elements each of `threads` threads of a split row nest of `rows` rows takes of a
// row's `count` (the device's multiprocessors shared by the rows, a block each at least).
int64_t split_row_elements_per_thread(int64_t count, int64_t rows, int threads);

}  // namespace kiln::codegen
