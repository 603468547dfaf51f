// CUDA column nests: tiles of outputs, lanes splitting each reduction (schedule_reduction.h).
// Part of the kernel emitter (kernel_emitter.h).
#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

// A reduction nest of `blocks` blocks over `bytes` that would be slower than eager's kernels
// (leaves_the_device_idle) is not lowered: PyTorch runs the region's ops on the device.
void KernelEmitter::refuse_an_idle_device(int64_t blocks, int64_t bytes) const {
  if (leaves_the_device_idle(blocks, bytes))
    not_lowered("a reduction over " + std::to_string(bytes) + " bytes in " +
                std::to_string(blocks) +
                " blocks would leave the GPU idle (no reduction split across blocks yet)");
}

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
std::string KernelEmitter::cuda_columns_nest(size_t index, const Shape& shape, Kernel& k,
                                             bool is_last, KernelNest& nest,
                                             const ReductionSchedule& schedule,
                                             std::string* entries) {
  std::vector<std::vector<StorageWindow>> windows = windows_;
  std::vector<bool> whole = whole_storage_;
  nest.rows = (nest.numel + schedule.tile - 1) / schedule.tile;
  refuse_an_idle_device(nest.rows, nest.numel * element_.longest * element_.widest);
  column_tile_ = schedule.tile;
  column_lanes_ = schedule.lanes;
  NestBody body = emit_body(shape, k, is_last, NestMode::kColumns);
  if (is_last) record_last_nest_loads(shape, k);
  windows_ = windows;
  whole_storage_ = whole;
  const std::string tile = std::to_string(schedule.tile);
  nest.block_threads = schedule.tile * schedule.lanes;
  std::string name = "nest" + std::to_string(index);
  std::string src = "template <class I>\n__device__ __forceinline__ void " + name +
                    "_columns(const Args& a) {\n" + cuda_decls(k);
  src += "  // schedule: " + schedule.describe() + "\n";
  src += "  const I n = static_cast<I>(" + std::to_string(nest.numel) + "LL);\n";
  src += "  const I tiles = static_cast<I>(" + std::to_string(nest.rows) + "LL);\n";
  src +=
      "  [[maybe_unused]] const int column_lane = static_cast<int>(threadIdx.x) / " + tile + ";\n";
  src +=
      "  for (I tile = static_cast<I>(blockIdx.x); tile < tiles; tile += "
      "static_cast<I>(gridDim.x)) {\n";
  src += "    const I column = tile * " + tile + " + static_cast<I>(threadIdx.x % " + tile + ");\n";
  src += "    const I lin = column < n ? column : n - 1;\n";
  src += decompose(shape, "    ") + indented(body.flat(), 2);
  src += "    if (column < n && column_lane == 0) {\n" + indented(body.stores, 3) + "    }\n";
  src += "  }\n}\n";
  *entries += cuda_entries(index, 's', nest.block_threads, name + "_columns");
  k.nests.push_back(std::move(nest));
  return src;
}

}  // namespace kiln::codegen::detail
