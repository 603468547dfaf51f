// CUDA column nests: tiles of outputs, lanes splitting each reduction (schedule_reduction.h).
// Part of the kernel emitter (kernel_emitter.h).
#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

// Bytes of the widest dtype the kernel reads or writes.
int64_t KernelEmitter::widest_dtype_bytes(const Kernel& k) const {
  int64_t widest = 1;
  for (size_t i = 0; i < k.inputs.size(); ++i)
    if (k.inputs[i].is_tensor)
      widest = std::max<int64_t>(widest, dtype_size(body_.inputs()[i]->tensor_type().dtype));
  for (const KernelOutput& o : k.outputs)
    widest = std::max<int64_t>(widest, dtype_size(o.dtype));
  return widest;
}

// A nest whose elements are outer reductions over few elements (ReductionSchedule::kColumns):
// a block per tile of consecutive elements, the tile's threads at neighbouring elements and
// each element's lanes splitting its reduced elements, combined by column_<op>. The tile loop is
// uniform over the block (the combines' barriers); a thread past the last element computes the
// last one's again and stores nothing.
//   for (tile ...) { column = tile * 16 + threadIdx.x % 16; lin = min(column, n - 1); ...
//     for (rl = column_lane; rl < 8192; rl += 16) acc = red_sum(acc, x[rl, i0]);
//     acc = column_sum<16, 16>(acc); if (column < n && column_lane == 0) store }
// Too few tiles to fill the device, each reducing many bytes (leaves_the_device_idle: a layer
// norm's weight gradients, 768 columns of 87381 rows, made 96 tiles), and each tile is split
// across blocks as a split row nest is (KernelNest::split_rows; the executor chooses the split
// and launches cooperatively): the grid is tiles x split, a block takes its part's turns of the
// lanes' elements, and grid_column_<op> combines the parts' columns through the workspace.
//   tile = blockIdx.x / split; part = blockIdx.x % split; column = tile * 8 + threadIdx.x % 8;
//     for (rl = column_lane + part * 128; rl < 87381; rl += split * 128) acc = red_sum(...);
//     acc = grid_column_sum<8, 128>(acc, ws, 0, tiles, split, tile, part);
//     if (column < n && column_lane == 0 && part == 0) store
std::string KernelEmitter::cuda_columns_nest(size_t index, const Shape& shape, Kernel& k,
                                             bool is_last, KernelNest& nest,
                                             const ReductionSchedule& schedule,
                                             std::string* entries) {
  std::vector<std::vector<StorageWindow>> windows = windows_;
  std::vector<bool> whole = whole_storage_;
  nest.rows = (nest.numel + schedule.tile - 1) / schedule.tile;
  column_tile_ = schedule.tile;
  column_lanes_ = schedule.lanes;
  split_columns_ =
      leaves_the_device_idle(nest.rows, nest.numel * element_.longest * element_.widest);
  if (split_columns_) {
    nest.split_rows = true;
    nest.slots_per_block = schedule.tile;
    split_row_count_ = nest.rows;
    const int64_t per_block = int64_t{schedule.lanes} * kMinSplitElements;
    nest.max_split = std::max<int64_t>(1, (element_.longest + per_block - 1) / per_block);
  }
  NestBody body = emit_body(shape, k, is_last, NestMode::kColumns);
  nest.grid_combines = grid_combines_;
  if (is_last) record_last_nest_loads(shape, k);
  windows_ = windows;
  whole_storage_ = whole;
  const std::string tile = std::to_string(schedule.tile);
  nest.block_threads = schedule.tile * schedule.lanes;
  std::string name = "nest" + std::to_string(index);
  std::string src = "template <class I>\n__device__ __forceinline__ void " + name +
                    "_columns(const Args& a) {\n" + cuda_decls(k);
  src += "  // schedule: " + schedule.describe() + "\n";
  src += "  const I n = static_cast<I>(" + rows_times(nest.numel) + ");\n";
  src += "  const I tiles = (n + " + tile + " - 1) / " + tile + ";\n";  // KernelNest::rows
  src +=
      "  [[maybe_unused]] const int column_lane = static_cast<int>(threadIdx.x) / " + tile + ";\n";
  if (split_columns_) {  // one part of one tile per block: every block reaches every barrier
    src +=
        "  // schedule: tiles split across blocks (grid = tiles x split, a grid barrier at each "
        "of the tile's " +
        std::to_string(nest.grid_combines) + " reductions)\n";
    src += "  char* const ws = static_cast<char*>(a.ws);\n";
    src += "  const I split = static_cast<I>(gridDim.x) / tiles;\n";
    src += "  const I part = static_cast<I>(blockIdx.x) % split;\n";
    src += "  {\n    const I tile = static_cast<I>(blockIdx.x) / split;\n";
  } else {
    src +=
        "  for (I tile = static_cast<I>(blockIdx.x); tile < tiles; tile += "
        "static_cast<I>(gridDim.x)) {\n";
  }
  src += "    const I column = tile * " + tile + " + static_cast<I>(threadIdx.x % " + tile + ");\n";
  src += "    const I lin = column < n ? column : n - 1;\n";
  src += decompose(shape, "    ") + indented(body.flat(), 2);
  src += std::string("    if (column < n && column_lane == 0") +
         (split_columns_ ? " && part == 0" : "") + ") {\n" + indented(body.stores, 3) + "    }\n";
  src += "  }\n}\n";
  *entries += cuda_entries(index, 's', nest.block_threads, name + "_columns");
  k.nests.push_back(std::move(nest));
  return src;
}

}  // namespace kiln::codegen::detail
