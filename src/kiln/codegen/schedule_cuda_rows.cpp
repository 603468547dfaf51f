// CUDA row nests: a warp or a block per row, its reductions shared, the row cache.
// Part of the kernel emitter (kernel_emitter.h).
#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

// A nest with a row statistic (a reduction that does not depend on the last dim): one block per
// row of the dims before the last, the statistic computed by the block together, then each
// thread computes and stores the row's elements at its own positions of the last dim.
// With `unit_row`, `shape` is the outputs' shape and a dim of 1 (emit_body): a row per element.
std::string KernelEmitter::cuda_rows_nest(size_t index, const Shape& shape, Kernel& k, bool is_last,
                                          KernelNest& nest, std::string* entries, bool unit_row) {
  std::vector<std::vector<StorageWindow>> windows = windows_;
  std::vector<bool> whole = whole_storage_;
  const int64_t length = !shape.empty() && shape.back() > 1 ? shape.back()
                         : unit_row                         ? element_.longest
                                                            : row_reduce_count_;
  // The row vector width: 16 bytes of the kernel's widest tensor dtype.
  const int64_t widest = widest_dtype_bytes(k);
  row_length_ = length;
  row_vector_ = static_cast<int>(std::min<int64_t>(8, 16 / widest));
  // Rows packed several to a warp (fewer than 32 threads a row) compute the last row again in
  // the lanes past it, which must store nothing: not where a pass stores (x.mul_(2) then
  // x.sum(-1): a duplicate lane's pass would read the doubled row and write it doubled again).
  row_threads_ =
      unit_row ? unit_row_threads(length, row_vector_) : row_threads_for(length, row_vector_);
  if (unit_row && pass_stores_) row_threads_ = std::max(row_threads_, 32);
  // Short rows of whole vectors packed several to a warp (not a row per element, whose threads
  // are chosen above: its pass runs outside the packed rows' guard, only its store is guarded).
  const int packed = packed_row_threads(length, row_vector_);
  if (packed > 0 && !unit_row && !shape.empty() && shape.back() == length && !pass_stores_)
    row_threads_ = packed;
  nest.block_threads = row_threads_ <= 32 ? kCudaBlock : row_threads_;
  nest.rows_per_block = nest.block_threads / row_threads_;
  Shape outer(shape.begin(), shape.end() - (shape.empty() ? 0 : 1));
  nest.rows = std::max<int64_t>(shape_numel(outer), 1);
  // Too few rows to fill the device: each row split across blocks, as many as the device holds
  // at once (the executor chooses), each thread at least kMinSplitElements of its row.
  split_rows_ = leaves_the_device_idle((nest.rows + nest.rows_per_block - 1) / nest.rows_per_block,
                                       nest.rows * length * widest);
  if (split_rows_) {
    row_threads_ = nest.block_threads = kCudaBlock;
    nest.rows_per_block = 1;
    nest.split_rows = true;
    split_row_count_ = nest.rows;
    const int64_t per_block = int64_t{kCudaBlock} * kMinSplitElements;
    nest.max_split = std::max<int64_t>(1, (length + per_block - 1) / per_block);
  }
  merge_reduced_dims_ = true;
  NestBody rows = emit_body(shape, k, is_last, NestMode::kRows, nullptr, unit_row);
  merge_reduced_dims_ = false;
  if (split_rows_ && row_serial_reductions_ > 0)
    not_lowered("a reduction over " + std::to_string(nest.rows * length * widest) + " bytes in " +
                std::to_string(nest.rows) +
                " rows would leave the GPU idle (an argmax or argmin is not split across blocks)");
  nest.grid_combines = grid_combines_;
  if (is_last) record_last_nest_loads(unit_row ? Shape(shape.begin(), shape.end() - 1) : shape, k);
  windows_ = windows;
  whole_storage_ = whole;
  std::string name = "nest" + std::to_string(index);
  std::string src = "template <class I>\n__device__ __forceinline__ void " + name +
                    "_rows(const Args& a) {\n" + cuda_decls(k);
  if (unit_row) src += "  // schedule: row per element\n";
  if (split_rows_)
    src +=
        "  // schedule: rows split across blocks (grid = rows x split, a grid barrier at each "
        "of the row's " +
        std::to_string(grid_combines_) + " statistics)\n";
  src += specialized_on_merges(cuda_row_loop(shape, rows, nest, k));
  src += "}\n";
  *entries += cuda_entries(index, 's', nest.block_threads, name + "_rows");
  k.nests.push_back(std::move(nest));
  return src;
}

// `code` in two copies where the nest's addresses have merged forms (merged_address): one where
// every merge condition holds, its flags constants true, and one where they are false; the
// conditions are the kernel's arguments, the same for every thread, so the branch is uniform.
// Else `code` as it is.
//   if (s0_2 == 28LL * s0_3) { constexpr bool mg0 = true; ... } else { constexpr bool mg0 = false;
//   ... }
std::string KernelEmitter::specialized_on_merges(const std::string& code) const {
  if (merge_conditions_.empty()) return code;
  const MergeFlags flags = merge_flags(merge_conditions_);
  return "  if (" + flags.cond + ") {\n" + flags.on + indented(code, 1) + "  } else {\n" +
         flags.off + indented(code, 1) + "  }\n";
}

// A CUDA row nest's loop over its rows (cuda_rows_nest): each row's levels, passes and stores.
std::string KernelEmitter::cuda_row_loop(const Shape& shape, const NestBody& rows,
                                         const KernelNest& nest, const Kernel& k) {
  Shape outer(shape.begin(), shape.end() - (shape.empty() ? 0 : 1));
  std::string src = "  const I rows = static_cast<I>(" + rows_times(nest.rows) + ");\n";
  if (split_rows_) {  // one part of one row per block: every block reaches every grid barrier
    src += "  char* const ws = static_cast<char*>(a.ws);\n";
    src += "  const I split = static_cast<I>(gridDim.x) / rows;\n";
    src += "  const I row = static_cast<I>(blockIdx.x) / split;\n";
    src += "  const I part = static_cast<I>(blockIdx.x) % split;\n";
    src += "  {\n";
  } else if (nest.rows_per_block == 1) {
    src +=
        "  for (I row = static_cast<I>(blockIdx.x); row < rows; row += "
        "static_cast<I>(gridDim.x)) {\n";
  } else if (row_threads_ == 32) {  // a warp per row: the loop is uniform over each warp
    std::string per = std::to_string(nest.rows_per_block);
    src += "  for (I row = static_cast<I>(blockIdx.x) * " + per +
           " + static_cast<I>(threadIdx.x >> 5); row < rows; row += static_cast<I>(gridDim.x) * " +
           per + ") {\n";
  } else {  // rows packed in a warp: the loop stays uniform over the warp, whose shuffles every
    // lane joins; a row past the last computes the last row again and stores nothing (row_ok)
    std::string per = std::to_string(nest.rows_per_block),
                per_warp = std::to_string(32 / row_threads_),
                threads = std::to_string(row_threads_);
    src += "  for (I warp_row = (static_cast<I>(blockIdx.x) * " + std::to_string(kCudaBlock / 32) +
           " + static_cast<I>(threadIdx.x >> 5)) * " + per_warp +
           "; warp_row < rows; warp_row += static_cast<I>(gridDim.x) * " + per + ") {\n";
    src += "    const I packed_row = warp_row + static_cast<I>((threadIdx.x & 31) / " + threads +
           ");\n";
    src += "    const bool row_ok = packed_row < rows;\n";
    src += "    const I row = row_ok ? packed_row : rows - 1;\n";
  }
  const bool packed_rows = row_threads_ < 32;
  src += "    [[maybe_unused]] const I lin = row;\n" + decompose(outer, "    ");
  for (size_t d = 0; d < shape.size(); ++d)
    src += indented(rows.levels[d], 2);
  if (shape.empty() || shape.back() == 1) {
    src += indented(rows.levels[shape.size()], 2);
    // (packed rows: a row past the last computes the last row again and stores nothing)
    std::string first = row_thread() + " == 0";
    if (split_rows_) first = "part == 0 && " + first;
    if (packed_rows) first = "row_ok && " + first;
    src += "    if (" + first + ") {\n" + indented(rows.stores, 3) + "    }\n";
  } else {
    std::string var = "i" + std::to_string(shape.size() - 1);
    BlockLoop loop = block_loop(var, "I", shape.back());
    const int lanes = row_lanes(shape.back());
    if (packed_rows) src += "    if (row_ok) {\n";
    if (lanes == 1) {
      src += indented(loop.open + rows.levels[shape.size()] + rows.stores + loop.close, 2);
    } else {  // the lanes store into registers, then as one vector (row_lane_stores)
      std::string body = loop.open_trip, flush;
      for (size_t j = 0; j < k.outputs.size(); ++j) {
        if (k.outputs[j].shape != shape) continue;
        body += row_vector_store(j, shape, var, lanes, &flush);
      }
      size_t lane_open = loop.open.find("#pragma unroll", loop.open_trip.size());
      // (a bounded last trip: the lanes' guard closes with them, and the flush has its own)
      const bool bounded = !split_rows_ && shape.back() % (int64_t{row_threads_} * lanes) != 0;
      if (bounded)
        flush = "if (" + trip_first(var, lanes, "I") + " < " + std::to_string(shape.back()) +
                ") {\n" + flush + "}\n";
      body += loop.open.substr(lane_open) + rows.levels[shape.size()] + rows.stores +
              (bounded ? "}\n}\n" : "}\n") + flush + loop.close_trip;
      src += indented(body, 2);
    }
    if (packed_rows) src += "    }\n";
  }
  return src + "  }\n";
}

KernelEmitter::BlockLoop KernelEmitter::block_loop(const std::string& var, const std::string& type,
                                                   int64_t count) const {
  const int lanes = row_lanes(count);
  BlockLoop loop;
  std::string lane_open;
  if (lanes > 1) {
    std::string lane = var + "_lane", v = std::to_string(lanes);
    lane_open = "#pragma unroll\nfor (int " + lane + " = 0; " + lane + " < " + v + "; ++" + lane +
                ") {\n[[maybe_unused]] const " + type + " " + var + " = " +
                trip_first(var, lanes, type) + " + " + lane + ";\n";
  }
  if (split_rows_) {
    // This block's part of the row: thread t of part p takes (p * threads + t) * V, then every
    // split * threads * V further (lanes > 1 divide the row exactly: no bound within a trip).
    // The trip's vector loads (split_trip_load) go first.
    std::string base = var + "_base", threads = std::to_string(row_threads_),
                v = std::to_string(lanes);
    auto cast = [&](const std::string& x) { return "static_cast<" + type + ">(" + x + ")"; };
    std::string first = cast("part") + " * " + threads + " + " + cast(row_thread());
    if (lanes > 1) first = "(" + first + ") * " + v;
    loop.open_trip = "#pragma unroll 4\nfor (" + type + " " + base + " = " + first + "; " + base +
                     " < " + std::to_string(count) + "; " + base + " += " + cast("split") + " * " +
                     std::to_string(int64_t{row_threads_} * lanes) + ") {\n";
    loop.close_trip = "}\n";
    if (auto fills = trip_fills_.find(var); fills != trip_fills_.end())
      loop.open_trip += fills->second;
    loop.open = loop.open_trip +
                (lanes > 1 ? lane_open
                           : "[[maybe_unused]] const " + type + " " + var + " = " + base + ";\n");
    loop.close = (lanes > 1 ? "}\n" : "") + loop.close_trip;
    return loop;
  }
  int64_t trips = (count + row_threads_ * lanes - 1) / (row_threads_ * lanes);
  std::string trip = var + "_trip";
  std::string unroll = trips <= kRowCacheTrips ? "#pragma unroll\n" : "#pragma unroll 4\n";
  // A loop that reads merged rows' registers is unrolled in the nest's copy where they are read;
  // in the other copy, one trip at a time: its divided loads of every trip unrolled took
  // x.mean((2, 3))'s kernel from 32 registers a thread to 175 (both copies share them).
  if (auto merged = merged_row_reads_.find(var); merged != merged_row_reads_.end()) {
    std::string any;
    for (const std::string& condition : merged->second)
      any += (any.empty() ? "" : " || ") + condition;
    unroll = "#pragma unroll (" + any + " ? " + std::to_string(trips) + " : 1)\n";
  }
  loop.open_trip = unroll + "for (int " + trip + " = 0; " + trip + " < " + std::to_string(trips) +
                   "; ++" + trip + ") {\n";
  loop.close_trip = "}\n";
  if (lanes == 1) {
    loop.open =
        loop.open_trip + "const " + type + " " + var + " = " + trip_first(var, 1, type) + ";\n";
    loop.close = loop.close_trip;
  } else {
    loop.open = loop.open_trip + lane_open;
    loop.close = "}\n" + loop.close_trip;
  }
  if (count % (row_threads_ * lanes) != 0) {  // (with lanes, a whole vector in or out)
    loop.open += "if (" + var + " < " + std::to_string(count) + ") {\n";
    loop.close = "}\n" + loop.close;
  }
  return loop;
}

// The first position of a row loop's current trip (of its `lanes` neighbours), as block_loop
// runs it: this thread's (t + trip * threads) * V, or in a split row its part's `<var>_base`.
std::string KernelEmitter::trip_first(const std::string& var, int lanes,
                                      const std::string& type) const {
  if (split_rows_) return var + "_base";
  std::string first = "static_cast<" + type + ">(" + row_thread() + ") + static_cast<" + type +
                      ">(" + var + "_trip) * " + std::to_string(row_threads_);
  return lanes == 1 ? first : "(" + first + ") * " + std::to_string(lanes);
}

// The elements a row loop over `count` positions takes at a time: for a loop over the nest's
// whole row, the widest vector that divides it (row_vector_lanes), else 1. (Where the row's
// threads do not divide it into vectors, the last trip is bounded: block_loop's guard takes or
// leaves a whole vector. Rows of 784 floats, 64 threads of 4, read 13 scalars a thread before.)
int KernelEmitter::row_lanes(int64_t count) const {
  if (mode_ != NestMode::kRows || row_vector_ <= 1 || count != row_length_) return 1;
  return row_vector_lanes(count, row_vector_);
}

// The trips of a row loop over `count` positions (block_loop): each takes the row's threads x
// lanes positions.
int64_t KernelEmitter::row_trips(int64_t count) const {
  const int64_t per = int64_t{row_threads_} * row_lanes(count);
  return (count + per - 1) / per;
}

// The position (in the row cache's registers) of a row loop's current element.
std::string KernelEmitter::cache_slot(const std::string& var, int lanes) {
  if (lanes == 1) return var + "_trip";
  return var + "_trip * " + std::to_string(lanes) + " + " + var + "_lane";
}

// Output j's lanes of a row loop's trip: the registers they are stored into (returned, for the
// trip's start) and the code that writes them out after the lanes (appended to `flush`): one
// vector store where the output's row is contiguous and aligned, else a store of each lane.
std::string KernelEmitter::row_vector_store(size_t j, const Shape& shape, const std::string& var,
                                            int lanes, std::string* flush) const {
  const DType d = body_.outputs()[j]->tensor_type().dtype;
  std::string n = std::to_string(j), v = std::to_string(lanes),
              size = std::to_string(dtype_size(d));
  std::string base = "oo" + n, last = "os" + n + "_" + std::to_string(shape.size() - 1);
  for (size_t dim = 0; dim + 1 < shape.size(); ++dim)
    if (shape[dim] != 1)
      base += " + i" + std::to_string(dim) + "*os" + n + "_" + std::to_string(dim);
  std::string first = trip_first(var, lanes, "I");
  *flush += "if (" + last + " == 1 && (" + base + ") % " + v +
            " == 0 && reinterpret_cast<uint64_t>(out" + n + ") % 16 == 0) {\n  vector_store<" +
            std::to_string(dtype_size(d) * lanes) + ">(static_cast<char*>(out" + n +
            ") + static_cast<int64_t>(" + base + " + " + first + ") * " + size + ", row_out" + n +
            ");\n} else {\n" + "  for (int l = 0; l < " + v + "; ++l)\n    st_" + suffix(d) +
            "(out" + n + ", " + base + " + (" + first + " + l) * " + last + ", ld_" + suffix(d) +
            "(row_out" + n + ", l));\n}\n";
  return "alignas(16) " + std::string(storage_type(d)) + " row_out" + n + "[" + v + "];\n";
}

// This thread's place among its row's threads.
std::string KernelEmitter::row_thread() const {
  if (row_threads_ < 32) return "(threadIdx.x & " + std::to_string(row_threads_ - 1) + ")";
  return row_threads_ == 32 ? "(threadIdx.x & 31)" : "threadIdx.x";
}

// The call that combines a row's partial results `acc`: warp_<op>, block_<op> or, in a row split
// across blocks, grid_<op> through the workspace's slots of the nest's next combine
// (cuda_block_reduce.cuh).
std::string KernelEmitter::row_combine(const std::string& op, const std::string& acc) {
  if (split_rows_)
    return "grid_" + op + "<" + std::to_string(row_threads_) + ">(" + acc + ", ws, " +
           std::to_string(grid_combines_++) + ", rows, split, row, part)";
  if (row_threads_ == 32) return "warp_" + op + "(" + acc + ")";
  if (row_threads_ < 32)
    return "warp_" + op + "<" + std::to_string(row_threads_) + ">(" + acc + ")";
  return "block_" + op + "<" + std::to_string(row_threads_) + ">(" + acc + ")";
}

// The row cache of a CUDA row nest: an input read along the row at a row loop's position, at
// an index that otherwise depends only on the row, is loaded once per row into registers, each
// thread its own positions (those of block_loop), before the row's first reduction. Every later
// pass over the row reads the registers: the normalization's mean pass and its final loop load
// x once, and w and b are loaded before the mean's barrier instead of after it.
//   float rc3[8];
//   for (int rc3_t = 0; rc3_t < 8; ++rc3_t) { const I rc3_j = (threadIdx.x & 127) + rc3_t * 128;
//     rc3[rc3_t] = ld_f32(in0, o0 + i0*s0_0 + rc3_j*s0_1); }
//   ... acc5 = red_sum(acc5, rc3[rl4_trip]) ...   v9 = rc3[i1_trip]
// Only where every loop over those positions is unrolled completely (the registers are indexed
// by constants), within kRowCacheWords registers a thread, and where the index is inside the
// tensor wherever the row runs (so loading it unconditionally is safe).
std::optional<Val> KernelEmitter::row_cached_load(size_t k, const Index& at) {
  if (mode_ != NestMode::kRows || at.empty()) return std::nullopt;
  if (std::optional<Val> merged = merged_row_cached_load(k, at)) return merged;
  auto position = row_positions_.find(at.back().text);
  if (position == row_positions_.end()) return std::nullopt;
  if (split_rows_) return split_trip_load(k, at, position->second);
  const TensorType& t = body_.inputs()[k]->tensor_type();
  if (!inside_shape(at, t.shape)) return std::nullopt;
  std::vector<AddressTerm> prefix;
  for (size_t d = 0; d + 1 < at.size(); ++d) {
    if (!uses_only_row_indices(at[d].text)) return std::nullopt;
    prefix.push_back({at[d], d});
  }
  std::optional<std::string> slot = row_cache_slot(k, prefix, position->second, "");
  if (!slot) return std::nullopt;
  return define(t.dtype, *slot);
}

// A row per element over adjacent reduced dims (a mean over (h, w)) reads them, where the input
// is contiguous over them, as one linear position of the pass (merged_address): that position
// is a row position, so the row is cached as any row is, its trips loaded as vectors, under the
// merge's flags (the nest's copy where they hold; the other reads the divided form):
//   (mg0 ? rc3[rl1_trip * 4 + rl1_lane] : ld_f32(in0, o0 + ... + rd4*s0_2 + rd2*s0_3))
// (Scalar loads of 784 floats a row by 64 threads, 13 trips each, left x.mean((2, 3)) at 1.23x
// eager's time on an H100, and 2.55x in bf16.)
std::optional<Val> KernelEmitter::merged_row_cached_load(size_t k, const Index& at) {
  if (split_rows_ || !merge_reduced_dims_ || divmods_.empty()) return std::nullopt;
  const TensorType& t = body_.inputs()[k]->tensor_type();
  if (!inside_shape(at, t.shape)) return std::nullopt;
  std::vector<std::string> flags;
  const std::string n = std::to_string(k);
  std::optional<std::vector<AddressTerm>> terms = merged_terms("s" + n + "_", t.shape, at, flags);
  if (!terms || terms->empty() || terms->back().dim + 1 != at.size()) return std::nullopt;
  auto position = row_positions_.find(terms->back().index.text);
  if (position == row_positions_.end() || position->second.trip.empty()) return std::nullopt;
  terms->pop_back();
  for (const AddressTerm& term : *terms)
    if (!uses_only_row_indices(term.index.text)) return std::nullopt;
  std::string condition;
  for (const std::string& flag : flags)
    condition += (condition.empty() ? "" : " && ") + flag;
  std::optional<std::string> slot = row_cache_slot(k, *terms, position->second, condition);
  if (!slot) return std::nullopt;
  merged_row_reads_[position->second.loop].insert(condition);
  IndexExpr divided = IndexExpr::var("o" + n);
  for (size_t d = 0; d < at.size(); ++d)
    divided = divided + mul(at[d], "s" + n + "_" + std::to_string(d));
  return define(t.dtype, "(" + condition + " ? " + *slot + " : ld_" + suffix(t.dtype) + "(in" + n +
                             ", " + divided.text + "))");
}

// The register of input k's row cache that holds the element at `prefix` (the row's indices,
// each with the dim whose stride it takes) and the row position `position` along the input's
// last dim; the cache is made, and its fill added to the row's, on first use. Under
// `condition` (empty: always) the fill runs; elsewhere its registers are not read.
std::optional<std::string> KernelEmitter::row_cache_slot(size_t k,
                                                         const std::vector<AddressTerm>& prefix,
                                                         const RowPosition& position,
                                                         const std::string& condition) {
  const TensorType& t = body_.inputs()[k]->tensor_type();
  const int64_t count = position.count;
  const int64_t trips = row_trips(count);
  if (trips > kRowCacheTrips) return std::nullopt;
  const std::string n = std::to_string(k);
  IndexExpr base = IndexExpr::var("o" + n);
  for (const AddressTerm& term : prefix)
    base = base + mul(term.index, "s" + n + "_" + std::to_string(term.dim));
  std::string key = n + "@" + base.text + "#" + std::to_string(count) + "|" + condition;
  auto cache = row_caches_.find(key);
  if (cache == row_caches_.end()) {
    // Half and bfloat16 elements are held as loaded, two to a register (converted where they
    // are read, a shift each): the normalization of bf16 rows held x, w and b as floats, 48
    // registers a thread for its 16 elements of each.
    const bool as_stored = dtype_size(t.dtype) == 2 && is_floating(t.dtype);
    const std::string type = as_stored ? storage_type(t.dtype) : reg(t.dtype);
    const int lanes = row_lanes(count);
    const int64_t slots = trips * lanes;
    const int64_t words = as_stored ? (slots + 1) / 2 : slots * (type == "float" ? 1 : 2);
    if (row_cache_words_ + words > kRowCacheWords) return std::nullopt;
    row_cache_words_ += words;
    std::string array = fresh("rc"), trip = array + "_t", j = array + "_j",
                last = "s" + n + "_" + std::to_string(t.rank() - 1);
    auto scalar = [&](const std::string& position) {
      std::string address = base.text + " + " + position + "*" + last;
      if (as_stored) return "static_cast<const " + type + "*>(in" + n + ")[" + address + "]";
      return "ld_" + suffix(t.dtype) + "(in" + n + ", " + address + ")";
    };
    std::string first = "static_cast<I>(" + row_thread() + ") + static_cast<I>(" + trip + ") * " +
                        std::to_string(row_threads_);
    std::string loop = "#pragma unroll\nfor (int " + trip + " = 0; " + trip + " < " +
                       std::to_string(trips) + "; ++" + trip + ") {\n";
    std::string fill;
    if (lanes == 1) {
      std::string element = scalar(j);
      if (count % row_threads_ != 0)
        element = j + " < " + std::to_string(count) + " ? " + element + " : " + type + "(0)";
      fill += loop + "  const I " + j + " = " + first + ";\n  " + array + "[" + trip +
              "] = " + element + ";\n}\n";
    } else {  // V neighbours: one vector load where the row is contiguous and aligned
      std::string v = std::to_string(lanes), size = std::to_string(dtype_size(t.dtype));
      // (a trip past the row's last vector, where the threads' vectors do not divide the row,
      // loads nothing: the loops over the row do not read its registers)
      const std::string trip_open = count % (int64_t{row_threads_} * lanes) == 0
                                        ? loop
                                        : loop + "if ((" + first + ") * " + v +
                                              " >= " + std::to_string(count) + ") continue;\n";
      std::string slot = array + "[" + trip + " * " + v + " + l]";
      std::string vector = "vector_load<" + std::to_string(dtype_size(t.dtype) * lanes) + ">(";
      std::string from = "static_cast<const char*>(in" + n + ") + static_cast<int64_t>(" +
                         base.text + " + (" + first + ") * " + v + ") * " + size + ");\n";
      fill += "if (" + last + " == 1 && (" + base.text + ") % " + v +
              " == 0 && reinterpret_cast<uint64_t>(in" + n + ") % 16 == 0) {\n" + trip_open;
      if (as_stored) {
        fill += "  " + vector + "&" + array + "[" + trip + " * " + v + "], " + from;
      } else {
        fill += "  alignas(16) " + std::string(storage_type(t.dtype)) + " raw[" + v + "];\n  " +
                vector + "raw, " + from + "#pragma unroll\n  for (int l = 0; l < " + v + "; ++l) " +
                slot + " = ld_" + suffix(t.dtype) + "(raw, l);\n";
      }
      fill += "}\n} else {\n" + trip_open + "#pragma unroll\n  for (int l = 0; l < " + v +
              "; ++l) " + slot + " = " + scalar("((" + first + ") * " + v + " + l)") + ";\n}\n}\n";
    }
    row_fills_ += "alignas(16) " + type + " " + array + "[" + std::to_string(slots) + "];\n" +
                  (condition.empty() ? fill : "if (" + condition + ") {\n" + fill + "}\n");
    cache = row_caches_.emplace(key, RowCache{array, as_stored}).first;
  }
  const RowCache& c = cache->second;
  if (c.as_stored) return "ld_" + suffix(t.dtype) + "(" + c.array + ", " + position.trip + ")";
  return c.array + "[" + position.trip + "]";
}

// A CUDA row pass's value `x` of `v` at `index` (the row's indices, then the pass's position
// along the last dim), kept in registers as the pass computes it, so that the row's elements
// read it back instead of computing it again: softmax's exp(x - max), summed in the pass, then
// divided by the sum (over rows of 64 floats, the exp computed twice made the kernel compute
// bound: 1.3x eager's time on the H200). The registers are indexed as the row cache's are (the
// pass's loop and the row's last loop take the same positions a trip, both unrolled), within
// the same kRowCacheWords a thread.
//   float rb7[2];  ... rb7[rl5_trip] = v9; acc4 = red_sum(acc4, v9); ...  v12 = rb7[i1_trip] / sum
void KernelEmitter::keep_in_row_registers(const Value* v, const Val& x, const Index& index,
                                          int level, int depth, int64_t count) {
  const Node* node = defining_node(v);
  if (!node || node->op->kind == OpKind::kView || nest_shape_.empty()) return;
  if (v->tensor_type().shape != nest_shape_ || nest_shape_.back() != count) return;
  const std::string last = "i" + std::to_string(nest_rank_ - 1);
  auto in_pass = row_positions_.find(index.back().text);
  auto in_row = row_positions_.find(last);
  if (in_pass == row_positions_.end() || in_row == row_positions_.end() ||
      in_pass->second.trip.empty() || in_row->second.trip.empty())
    return;
  const int64_t trips = row_trips(count);
  const int64_t slots = trips * row_lanes(count);
  const int64_t words = slots * (reg(x.dtype) == "float" ? 1 : 2);
  if (trips > kRowCacheTrips || row_cache_words_ + words > kRowCacheWords) return;
  const std::optional<std::string> key = row_element_key(v, index);
  if (!key) return;
  row_cache_words_ += words;
  const std::string registers = fresh("rb");
  emit(depth, reg(x.dtype) + " " + registers + "[" + std::to_string(slots) + "];");
  emit(level, registers + "[" + in_pass->second.trip + "] = " + x.expr + ";");
  memo_[*key] = Val{registers + "[" + in_row->second.trip + "]", x.dtype};
}

// A split row's loop takes V neighbours a trip (block_loop): an input read at the loop's
// position, at an index that otherwise depends only on the row, is loaded for the trip's V
// positions at its start, as one 16-byte vector where the row is contiguous and aligned, and
// each lane reads its register (a split row's part is not known when the kernel is compiled, so
// there is no cache of the whole row as row_cached_load keeps):
//   for (I i1_base = ...) { alignas(16) uint16_t tc3[8];
//     if (s0_1 == 1 && (o0 + i0*s0_0) % 8 == 0 && in0 aligned) vector_load<16>(tc3, ...);
//     else for (l) tc3[l] = in0[o0 + i0*s0_0 + (i1_base + l)*s0_1];
//     for (int i1_lane = 0; i1_lane < 8; ++i1_lane) { ... ld_bf16(tc3, i1_lane) ... } }
std::optional<Val> KernelEmitter::split_trip_load(size_t k, const Index& at,
                                                  const RowPosition& position) {
  const TensorType& t = body_.inputs()[k]->tensor_type();
  const int lanes = row_lanes(position.count);
  if (lanes == 1 || position.loop.empty() || !inside_shape(at, t.shape)) return std::nullopt;
  Index prefix(at.begin(), at.end() - 1);
  for (const IndexExpr& e : prefix) {
    std::string rest;  // the text less the variables a trip declares before its loads
    for (std::string_view name : variables_in(e.text))
      if (!trip_variables_.contains(std::string(name))) rest += std::string(name) + " ";
    if (!uses_only_row_indices(rest)) return std::nullopt;
  }
  std::string key = std::to_string(k) + "@" + index_key(prefix) + "@" + position.loop;
  auto cache = row_caches_.find(key);
  if (cache == row_caches_.end()) {
    const bool as_stored = dtype_size(t.dtype) == 2 && is_floating(t.dtype);
    const std::string type = as_stored ? storage_type(t.dtype) : reg(t.dtype);
    std::string array = fresh("tc"), n = std::to_string(k),
                last = "s" + n + "_" + std::to_string(at.size() - 1), v = std::to_string(lanes),
                size = std::to_string(dtype_size(t.dtype)),
                first = position.first.empty() ? position.loop + "_base" : position.first;
    IndexExpr base = IndexExpr::var("o" + n);
    for (size_t d = 0; d + 1 < at.size(); ++d)
      base = base + mul(at[d], "s" + n + "_" + std::to_string(d));
    std::string from = "static_cast<const char*>(in" + n + ") + static_cast<int64_t>(" + base.text +
                       " + " + first + ") * " + size;
    std::string address = base.text + " + (" + first + " + l)*" + last;
    std::string fill = "alignas(16) " + type + " " + array + "[" + v + "];\n";
    fill += "if (" + last + " == 1 && (" + base.text + ") % " + v +
            " == 0 && reinterpret_cast<uint64_t>(in" + n + ") % 16 == 0) {\n";
    std::string vector = "vector_load<" + std::to_string(dtype_size(t.dtype) * lanes) + ">(";
    if (as_stored) {
      fill += "  " + vector + array + ", " + from + ");\n";
    } else {
      fill += "  alignas(16) " + std::string(storage_type(t.dtype)) + " raw[" + v + "];\n  " +
              vector + "raw, " + from + ");\n#pragma unroll\n  for (int l = 0; l < " + v +
              "; ++l) " + array + "[l] = ld_" + suffix(t.dtype) + "(raw, l);\n";
    }
    fill += "} else {\n#pragma unroll\n  for (int l = 0; l < " + v + "; ++l) " + array + "[l] = " +
            (as_stored ? "static_cast<const " + type + "*>(in" + n + ")[" + address + "]"
                       : "ld_" + suffix(t.dtype) + "(in" + n + ", " + address + ")") +
            ";\n}\n";
    trip_fills_[position.loop] += fill;
    cache = row_caches_.emplace(key, RowCache{array, as_stored}).first;
  }
  const RowCache& c = cache->second;
  const std::string lane = position.loop + "_lane";
  return define(t.dtype, c.as_stored ? "ld_" + suffix(t.dtype) + "(" + c.array + ", " + lane + ")"
                                     : c.array + "[" + lane + "]");
}

// Whether `text` names no variable but the row nest's row indices i0 ... i<rank - 2> (which
// decompose declares before any level's code, where the row cache is filled).
bool KernelEmitter::uses_only_row_indices(const std::string& text) const {
  for (std::string_view name : variables_in(text)) {
    if (name.size() < 2 || name[0] != 'i' ||
        !std::all_of(name.begin() + 1, name.end(), [](char d) { return std::isdigit(d); }) ||
        std::stoll(std::string(name.substr(1))) + 1 >= nest_rank_)
      return false;
  }
  return true;
}

}  // namespace kiln::codegen::detail
