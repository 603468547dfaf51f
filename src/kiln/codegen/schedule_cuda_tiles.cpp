// CUDA nests in tiles: the inputs read transposed go through shared memory.
// Part of the kernel emitter (kernel_emitter.h).
//
// Fits: a CUDA nest without reductions over at least two dims, each of the last two at least a
// tile, that reads an input transposed (the input's last index is the nest's second-to-last loop
// variable, and its last loop variable indexes another dim of the input: y.t() in x.add_(y.t())).
// A flat nest reads such an input down a column, 4 bytes of each 32-byte sector a warp's loads
// touch (x.add_(y.t()) of 8192 x 8192 floats: 0.511 ms on the H200 against torch.compile's
// 0.212, 2026-12-04).
// Parameters: tiles of kCudaTile x kCudaTile elements of the last two dims, a block of 256
// threads (kCudaTile wide, 8 rows) per tile. Each transposed input's tile is loaded along the
// input's own last dim (coalesced) into shared memory, then every element of the tile is
// computed, and stored, along the nest's last dim (coalesced), reading the input from shared
// memory across (padded a column, so a warp's reads hit 32 banks).
#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

namespace {

// The side of a CUDA tile, and the rows of threads of its block.
constexpr int64_t kCudaTile = 32;
constexpr int64_t kCudaTileRows = 8;

std::vector<std::string> index_entries(const std::string& key) {
  std::vector<std::string> entries;
  for (size_t at = 0; at <= key.size();) {
    size_t end = key.find(", ", at);
    if (end == std::string::npos) end = key.size();
    entries.push_back(key.substr(at, end - at));
    at = end + 2;
  }
  return entries;
}

}  // namespace

// Whether a load at `key` (index_key) in a nest of `rank` dims reads its input transposed: the
// index's last entry is not the nest's last loop variable, which indexes another of its dims.
bool KernelEmitter::read_transposed(const std::string& key, size_t rank) {
  if (rank < 2 || key.empty()) return false;
  const std::string last = "i" + std::to_string(rank - 1);
  std::vector<std::string> entries = index_entries(key);
  return entries.back() != last &&
         std::find(entries.begin(), entries.end() - 1, last) != entries.end() - 1;
}

// The inputs a CUDA nest (emitted once, flat) reads transposed, each at one index whose last
// entry is the nest's second-to-last loop variable and whose entries are loop variables or 0,
// where the tiles fit the nest. None where the tiles do not fit.
std::vector<size_t> KernelEmitter::transposed_inputs(const Shape& shape) const {
  const size_t n = shape.size();
  if (n < 2 || shape[n - 1] < kCudaTile || shape[n - 2] < kCudaTile) return {};
  const std::string second = "i" + std::to_string(n - 2);
  std::vector<size_t> inputs;
  for (size_t k = 0; k < loads_.size(); ++k) {
    if (loads_[k].size() != 1 || raw_loads_[k] || guarded_loads_[k]) continue;
    const std::string& key = *loads_[k].begin();
    if (!read_transposed(key, n)) continue;
    std::vector<std::string> entries = index_entries(key);
    if (entries.back() != second) continue;
    bool plain = std::all_of(entries.begin(), entries.end(), [&](const std::string& e) {
      return e == "0" ||
             (e.size() > 1 && e[0] == 'i' &&
              std::all_of(e.begin() + 1, e.end(), [](char c) { return std::isdigit(c); }));
    });
    if (plain) inputs.push_back(k);
  }
  return inputs;
}

// In a tiles nest, input k's element at `at` (the index it was found read transposed at) from
// its tile in shared memory: row (the nest's last dim) - its tile's first, column likewise.
std::optional<Val> KernelEmitter::tile_load(size_t k, const Index& at) {
  if (mode_ != NestMode::kTiles) return std::nullopt;
  auto it = tile_keys_.find(k);
  if (it == tile_keys_.end() || it->second != index_key(at)) return std::nullopt;
  const size_t n = nest_shape_.size();
  const std::string a = std::to_string(n - 2), b = std::to_string(n - 1);
  return define(body_.inputs()[k]->tensor_type().dtype,
                "tile" + std::to_string(k) + "[i" + b + " - t" + b + "][i" + a + " - t" + a + "]");
}

// The nest as tiles (this file's header):
//   __shared__ float tile0[32][33];
//   for (tile ...) { t0 = ... * 32; t1 = ... * 32;  __syncthreads();
//     for (r = ty; r < 32; r += 8) { i0 = t0 + tx; i1 = t1 + r; if (in range) tile0[r][tx] = y[i1,
//     i0]; }
//     __syncthreads();
//     for (r = ty; r < 32; r += 8) { i0 = t0 + r; i1 = t1 + tx; if (in range) { ... tile0[i1 -
//     t1][i0 - t0] ...; store } } }
std::string KernelEmitter::cuda_tiles_nest(size_t index, const Shape& shape, Kernel& k,
                                           bool is_last, KernelNest& nest,
                                           const std::vector<size_t>& transposed,
                                           std::string* entries) {
  std::vector<std::vector<StorageWindow>> windows = windows_;
  std::vector<bool> whole = whole_storage_;
  tile_keys_.clear();
  for (size_t in : transposed)
    tile_keys_[in] = *loads_[in].begin();
  NestBody body = emit_body(shape, k, is_last, NestMode::kTiles);
  if (is_last) record_last_nest_loads(shape, k);
  windows_ = windows;
  whole_storage_ = whole;

  const size_t n = shape.size();
  const std::string a = std::to_string(n - 2), b = std::to_string(n - 1);
  const std::string side = std::to_string(kCudaTile), rows = std::to_string(kCudaTileRows);
  const int64_t tiles_a = (shape[n - 2] + kCudaTile - 1) / kCudaTile;
  const int64_t tiles_b = (shape[n - 1] + kCudaTile - 1) / kCudaTile;
  int64_t outer = 1;
  for (size_t d = 0; d + 2 < n; ++d)
    outer *= shape[d];
  nest.rows = outer * tiles_a * tiles_b;
  nest.block_threads = static_cast<int>(kCudaTile * kCudaTileRows);
  const std::string inside = "i" + a + " < " + std::to_string(shape[n - 2]) + " && i" + b + " < " +
                             std::to_string(shape[n - 1]);

  std::string name = "nest" + std::to_string(index);
  std::string src = "template <class I>\n__device__ __forceinline__ void " + name +
                    "_tiles(const Args& a) {\n" + cuda_decls(k);
  src += "  // schedule: tiles (" + side + " x " + side + ", inputs";
  for (size_t in : transposed)
    src += " " + std::to_string(in);
  src += " through shared memory)\n";
  for (size_t in : transposed)
    src += "  __shared__ " + reg(body_.inputs()[in]->tensor_type().dtype) + " tile" +
           std::to_string(in) + "[" + side + "][" + side + " + 1];\n";
  src += "  const int tx = static_cast<int>(threadIdx.x) % " + side +
         ", ty = static_cast<int>(threadIdx.x) / " + side + ";\n";
  src += "  const I tiles = static_cast<I>(" + rows_times(nest.rows) + ");\n";
  src +=
      "  for (I tile = static_cast<I>(blockIdx.x); tile < tiles; tile += "
      "static_cast<I>(gridDim.x)) {\n";
  src += "    const I t" + b + " = tile % " + std::to_string(tiles_b) + " * " + side + ";\n";
  src += "    const I t" + a + " = tile / " + std::to_string(tiles_b) + " % " +
         std::to_string(tiles_a) + " * " + side + ";\n";
  src += "    [[maybe_unused]] I rest = tile / " + std::to_string(tiles_a * tiles_b) + ";\n";
  for (size_t d = n - 2; d-- > 0;) {
    if (shape[d] == 1) continue;
    src += "    const I i" + std::to_string(d) + " = rest % " + extent_text(shape, d) + ";\n";
    src += "    rest /= " + extent_text(shape, d) + ";\n";
  }
  // The previous tile's reads of shared memory are done before it is overwritten.
  src += "    __syncthreads();\n";
  src += "    for (int r = ty; r < " + side + "; r += " + rows + ") {\n";
  src += "      const I i" + a + " = t" + a + " + tx, i" + b + " = t" + b + " + r;\n";
  src += "      if (" + inside + ") {\n";
  for (size_t in : transposed) {
    Index at;
    for (const std::string& e : index_entries(tile_keys_.at(in)))
      at.push_back(e == "0" ? IndexExpr::number(0) : IndexExpr::var(e));
    const DType d = body_.inputs()[in]->tensor_type().dtype;
    src += "        tile" + std::to_string(in) + "[r][tx] = ld_" + suffix(d) + "(in" +
           std::to_string(in) + ", " + load_address(in, at) + ");\n";
  }
  src += "      }\n    }\n    __syncthreads();\n";
  src += "    for (int r = ty; r < " + side + "; r += " + rows + ") {\n";
  src += "      const I i" + a + " = t" + a + " + r, i" + b + " = t" + b + " + tx;\n";
  src += "      if (" + inside + ") {\n" + indented(body.flat(), 4) + indented(body.stores, 4) +
         "      }\n    }\n  }\n}\n";
  *entries += cuda_entries(index, 's', nest.block_threads, name + "_tiles");
  k.nests.push_back(std::move(nest));
  return src;
}

}  // namespace kiln::codegen::detail
