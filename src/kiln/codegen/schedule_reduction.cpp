#include "kiln/codegen/schedule_reduction.h"

#include <algorithm>

namespace kiln::codegen {

namespace {

// Reductions of fewer elements stay serial: a cooperative form's combine costs more than it
// spreads.
constexpr int64_t kShortestShared = 16;
// Outer reductions with at least this many elements keep one thread each: the loads of a warp's
// 32 threads are neighbours, and the elements fill the H200 (132 SMs x 2048 threads).
constexpr int64_t kSerialOuterElements = int64_t{1} << 18;
// The blocks a column schedule aims for (two per SM of the H200).
constexpr int64_t kColumnBlocks = 264;
// The narrowest row a column tile reads: one 32-byte memory sector.
constexpr int64_t kSectorBytes = 32;
// The row a column tile reads while the tiles give every SM a block: two sectors. A float32
// column sum of 16384 x 4096 read 64 bytes a row in 256 blocks in 0.214 ms, 32 bytes in 512
// blocks in 0.236 (eager 0.210; H200, 2026-12-04); a bf16 one at 64 bytes would have 128 blocks,
// and ran in 0.210 against 0.122 at 32 bytes in 256.
constexpr int64_t kTileBytes = 64;
// The threads the H200 holds resident (132 SMs x 2048), and the most a block may have.
constexpr int64_t kDeviceThreads = kDeviceMultiprocessors * 2048;
constexpr int64_t kMaxBlockThreads = 1024;
// The fewest elements a column lane takes (below it the combine costs more than the lane adds).
constexpr int64_t kMinColumnLaneElements = 64;

// One block of 256 threads reduces about 24 GB/s (the full amax of 2^26 float32 in one block:
// 10.9 ms on the H200, 2026-12-02, bench.py), where eager's launch costs about 5 us: past 256 KiB
// a lone block takes twice eager's time or more.
constexpr int64_t kMaxBytesPerLoneBlock = int64_t{256} << 10;

}  // namespace

bool leaves_the_device_idle(int64_t blocks, int64_t bytes) {
  return blocks < kDeviceMultiprocessors &&
         bytes > kMaxBytesPerLoneBlock * std::max<int64_t>(blocks, 1);
}

std::string ReductionSchedule::describe() const {
  switch (kind) {
    case Kind::kSerial:
      return "serial";
    case Kind::kRowPerElement:
      return "row per element";
    case Kind::kColumns:
      return "columns (tile " + std::to_string(tile) + ", " + std::to_string(lanes) + " lanes)";
  }
  return "";
}

int64_t split_row_elements_per_thread(int64_t count, int64_t rows, int threads) {
  const int64_t blocks = std::max<int64_t>(1, kDeviceMultiprocessors / std::max<int64_t>(rows, 1));
  return (count + blocks * threads - 1) / (blocks * threads);
}

bool outer_reduction_in_columns(int64_t outputs) {
  return outputs < kSerialOuterElements;
}

ReductionSchedule choose_reduction_schedule(const ElementReductions& facts, int block) {
  ReductionSchedule s;
  if (facts.count == 0 || facts.arg > 0 || facts.longest < kShortestShared) return s;
  if (facts.inner) {
    s.kind = ReductionSchedule::Kind::kRowPerElement;
    return s;
  }
  if (!outer_reduction_in_columns(facts.numel)) return s;
  const int64_t widest = std::max<int64_t>(facts.widest, 1);
  const int64_t narrowest = std::max<int64_t>(1, kSectorBytes / widest);
  auto tiles_of = [&](int64_t tile) { return (facts.numel + tile - 1) / tile; };
  int tile = 32;
  while (tile > narrowest && tiles_of(tile) < kColumnBlocks &&
         (tile * widest > kTileBytes || tiles_of(tile) < kDeviceMultiprocessors))
    tile /= 2;
  s.kind = ReductionSchedule::Kind::kColumns;
  s.tile = tile;
  s.lanes = block / tile;
  // More lanes while the device holds twice the threads: a column sum of 16384 x 4096 bf16 in
  // 256 blocks of 256 threads kept a quarter of the H200's threads busy, each with a 2-byte
  // load in flight, and read at a quarter of eager's speed.
  const int64_t tiles = tiles_of(tile);
  while (int64_t{s.tile} * s.lanes * 2 <= kMaxBlockThreads &&
         tiles * s.tile * s.lanes * 2 <= kDeviceThreads &&
         int64_t{s.lanes} * 2 * kMinColumnLaneElements <= facts.longest)
    s.lanes *= 2;
  return s;
}

}  // namespace kiln::codegen
