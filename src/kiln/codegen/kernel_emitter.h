// The kernel emitter: lowers a fusion region (a Step of kind kFusion) to the source of one CPU or
// CUDA kernel, or says why it does not (kernel.h: lower_kernel). Internal to codegen/.
//
// Requires: a region whose body is functional (no in-place ops), its writebacks placed
// (place_writebacks), every value of one device.
// Ensures: a kernel whose nests compute every output of the region, one nest per output shape
// (the nest with the writebacks last), each nest scheduled by the schedule that fits it; or a
// NotLowered reason, and the executor interprets the region instead.
//
// The emitter walks the region's values from its outputs, writing each value's code at the
// outermost loop level whose variables it uses (a row statistic once per row). Its parts:
// - lower_kernel.cpp: the driver (a nest per output shape, the kernel's declarations, layout);
// - emit_values.cpp: a value at an index (code placement by loop level, loads and views,
//   numbers, elementwise and creation ops);
// - emit_reduction.cpp: reductions (passes, accumulators, combines, the outputs a pass stores);
// - emit_index.cpp: index ops (gathers, index writes), scatters into views, cat and stack;
// - a file per schedule, each with the test of whether it fits a nest and its parameters:
//   schedule_cpu_loops.cpp (CPU loops shared by the cores, the flat vector loop, broadcast
//   tables), schedule_cpu_tiles.cpp (operands read transposed), schedule_cpu_passes.cpp (column
//   blocks, pieces between guards, row buffers), schedule_cuda_pointwise.cpp (grid-stride loops,
//   16-byte vectors), schedule_cuda_rows.cpp (a warp or a block per row, the row cache),
//   schedule_cuda_columns.cpp (tiles of outputs, lanes splitting each reduction;
//   schedule_reduction.h chooses), schedule_cuda_tiles.cpp (operands read transposed through
//   shared memory).
#pragma once

#include "kiln/codegen/kernel.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include "kiln/analysis/integer_range.h"
#include "kiln/analysis/pass_stores.h"
#include "kiln/analysis/storage_analysis.h"
#include "kiln/codegen/broadcast_tables.h"
#include "kiln/codegen/index_map.h"
#include "kiln/codegen/schedule_reduction.h"
#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln::codegen::detail {

// Loop nests with at least this much work run on all cores (OpenMP); smaller ones on the calling
// thread, where starting a team would cost more than the work. Work is iterations times the cost
// of an element (KernelEmitter::element_cost_): a loop of simple arithmetic shares 65536 elements,
// one computing a libm-class function (kCostlyOpWeight) about 3,900.
constexpr int64_t kParallelIterations = int64_t{1} << 16;
// What an element of exp, sin, tanh, erf, ... costs in simple operations' units, about: on a
// 2-core AVX2 VM a team's start cost 1.1 us a call, tanh(x) * 2 over 5120 floats ran 9.3 us on
// one thread and 7.9 on two, x + 1 over as many 3.9 and 5.0 (2026-12-06).
constexpr int64_t kCostlyOpWeight = 16;
// The fewest consecutive elements for which a flat loop splits around its broadcast values
// (flat_loop_split): below, the split's outer loop costs more than the values it hoists.
constexpr int64_t kMinSplitInner = 16;
// The positions of a CPU column block (cpu_column_block): each row's part of the block is read as
// one vector loop of this many elements, their accumulators held in arrays.
constexpr int64_t kCpuColumnBlock = 64;
// The elements of a CPU sum's chunk summed in float before the chunk's sum is added to the
// double accumulator (cpu_float_chunks): 64 a vector lane, each lane's rounding errors those of
// 64 float additions, and one horizontal sum per 1024 elements. (Converting every float to
// double took a clamp_ then row sum of 1024 x 4096 floats from 0.12 to 0.23 ms on 2 cores:
// eager's float cascade takes 0.15.)
constexpr int64_t kCpuFloatChunk = 1024;
// The partial sums of a long chunk (cpu_float_chunks): each vector add of one waits for the
// last (3-4 cycles), so a single vector accumulator sums 8 floats in that time; 32 lanes keep
// four such chains apart on AVX2 (two on AVX-512). A row of 8192 floats in L1: 0.78 us with one
// accumulator, 0.36 with 32 lanes (this VM's EPYC, 2026-12-06).
constexpr int64_t kCpuSumLanes = 32;
// The rows of a CPU column block's chunk, each column's floats summed in float over them before
// the chunk's sums are added to the double accumulators (cpu_column_block): each sum's rounding
// errors those of 64 float additions, as a row sum's lanes (kCpuFloatChunk).
constexpr int64_t kCpuColumnChunkRows = 64;
// ... for chunks of at least this many blocks of the lanes: the lanes' zeros and their sum cost a
// short row about what they save (rows of 64 floats: a layer norm of 65536 of them took 2.0 ms
// in lanes of blocks of 32 against 1.3 in one accumulator, this VM, 2026-12-06).
constexpr int64_t kCpuMinLaneBlocks = 8;
// The side of a CPU nest's tiles where an input is read transposed (cpu_tiled_loops): 16 x 16
// floats of it are 16 cache lines, held in L1 while a tile's rows are stored (x.add_(y.t()) of
// 2048 x 2048 floats on 2 cores: 4.1 ms in tiles of 16, 6.6 of 32, 7.7 of 64; 12.3 untiled).
constexpr int64_t kCpuTile = 16;
// The most bytes of row buffers one CPU nest keeps (keep_in_row_buffer), on each thread's stack:
// 256 KiB, within a core's L2, and far inside a thread's stack however many passes buffer.
constexpr int64_t kMaxRowBufferBytes = int64_t{256} << 10;
// A flat CPU loop of at least kCpuPrefetchElements runs in blocks of kCpuPrefetchBlock elements,
// each block first asking for the memory of its input lanes kCpuPrefetchAhead elements on
// (cpu_prefetched_flat_loop). A loop that computes more than it loads (an exp, a tanh) left the
// hardware's prefetchers behind: x.mul_(0.5).exp_() of 2^22 floats out of cache took 4.4 ms on 2
// cores against 1.5 in cache; prefetched 16 KiB ahead, 1.7 (and 1.3 in cache). A loop that only
// loads and stores (a scale, a copy) is as fast either way. The outputs are not prefetched: asking
// for them too made s1, sigmoid and tanh of 2^22 floats 10-20% slower.
constexpr int64_t kCpuPrefetchElements = int64_t{1} << 16;
constexpr int64_t kCpuPrefetchBlock = 1024;
constexpr int64_t kCpuPrefetchAhead = 4096;
// The most pieces a CPU pass is split into at its guards' bounds (pieces_between_cuts).
constexpr size_t kMaxPassPieces = 4;

// ops.def's elementwise expressions as text: the same table the interpreter compiles.
struct ExprText {
  const char* f;
  const char* i;
};
inline const ExprText& expr_text(OpId id) {
  static const std::unordered_map<OpId, ExprText> table = {
#define KILN_UNARY(Id, name, rule, inplace, fexpr, iexpr) {OpId::k##Id, {#fexpr, #iexpr}},
#define KILN_BINARY(Id, name, sig, rule, inplace, fexpr, iexpr) {OpId::k##Id, {#fexpr, #iexpr}},
#define KILN_TERNARY(Id, name, sig, rule, inplace, fexpr, iexpr) {OpId::k##Id, {#fexpr, #iexpr}},
#include "kiln/ir/ops.def"
  };
  auto it = table.find(id);
  KILN_ASSERT(it != table.end()) << op_info(id).name << " is not elementwise";
  return it->second;
}

// A region kiln does not lower (yet): the executor interprets it.
struct NotLowered {
  std::string why;
};
[[noreturn]] inline void not_lowered(std::string why) {
  throw NotLowered{std::move(why)};
}

inline std::string double_literal(double v) {
  // Through the preludes' functions: NVRTC has no __builtin_inf (a CUDA kernel of
  // masked_fill(-inf) did not compile).
  if (std::isnan(v)) return std::signbit(v) ? "(-kernel_nan())" : "kernel_nan()";
  if (std::isinf(v)) return v < 0 ? "(-kernel_infinity())" : "kernel_infinity()";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);  // exact
  return v < 0 || std::signbit(v) ? std::string("(") + buf + ")" : buf;
}

inline std::string int_literal(int64_t v) {
  if (v == INT64_MIN) return "(-9223372036854775807LL - 1)";
  std::string s = std::to_string(v) + "LL";
  return v < 0 ? "(" + s + ")" : s;
}

inline std::string suffix(DType d) {
  return std::string(dtype_name(d));
}

// A value as a kernel holds it: an expression (usually a variable) of register type double
// (floating dtypes) or int64_t (integral dtypes and bool).
struct Val {
  std::string expr;
  DType dtype = DType::kFloat32;
  bool floating() const { return is_floating(dtype); }
};

// A Python number argument: a constant of the trace or a number input of the step.
// A CPU pass across rows that stores (analysis/pass_stores.h) but cannot run in a column block:
// the region is lowered again with its domain's outputs in a nest of their own.
struct PassOutsideColumnBlock {};
// A column pass's value kept in an output (keep_row_value, across_rows) in a nest whose column
// block opens inside a loop over the rows the pass runs down (column_block_outside: the block's
// passes read that loop's variable, or code of its own sits there): the passes run again at each
// of those rows, and the kept value's stores would overwrite the elements stored before
// ((x + 1) * softmax(x, 0)). The region is lowered again keeping no column pass's value.
struct ColumnValueKeptUnderItsRows {};
// A CPU float sum the kernel computes at two places (two nests, or a nest's element and a
// gathered one: x.softmax(0) and x.softmax(0)[:, idx]): their forms may sum in different orders
// (a column block's float chunks, a pass's vector lanes), so the same value could differ by an
// ulp between them, where the interpreter computes it once (a - a[:, idx] at idx = identity was
// not 0: kiln_fuzz, program 5778650035662575516). The region is lowered again with that sum in
// double wherever it runs (exact_sums_).
struct SumComputedTwice {
  const Node* sum;
};

// A reduction pass's accumulator: its variable, register type and initial value.
struct Accumulator {
  std::string name, type, init;
};

struct Number {
  std::string as_double;  // scalar_to_double
  std::string as_int;     // scalar_to_int
  bool is_float = false;  // a Python float (store_scalar stores it as a double)
};

// A CUDA nest's vectorized variant being emitted: the lane `l` of the thread's elements, with the
// inputs loaded in registers lane_in<k> and the outputs stored in lane_out<j>.
struct Lanes {
  std::set<size_t> inputs;  // step inputs read from registers
  // A CPU flat loop's inputs read along its inner block's lanes (suffix_lanes): at `within`.
  std::set<size_t> suffix_inputs;
  // A multi-tensor kernel's: its 0-d results are stored once a member, outside the loop
  // (NestBody::stores_once). A flat nest's vector variant stores only what its scalar variant
  // does (a 0-d result of the region belongs to another nest).
  bool results_0d_once = false;
  // A CUDA nest's vector variant whose `width` lanes lie along nest dim `inner_dim` at
  // consecutive indices (its size a multiple of width, every other index the same): a broadcast
  // table indexed by that dim alone is read for all lanes at once (lane_tables_).
  int width = 0;
  int inner_dim = -1;
};

// A nest's body: the code that computes every output at the iteration's index, by loop level
// (level 0 runs before the nest's loops, level d inside loop d - 1: a value is placed at the
// outermost level whose loop variables it uses, so a row statistic is computed once per row),
// then the stores (innermost).
struct NestBody {
  std::vector<std::string> levels;
  std::string stores;
  // A multi-tensor kernel's 0-d results, stored once a member, outside its loop (their values
  // are: they depend on no element).
  std::string stores_once;
  // A CPU nest's column block (cpu_column_block): the passes of its column reductions, run for a
  // block of consecutive positions of the last dim before the last loop runs over them. And the
  // same with the passes' rows shared by a team (OpenMP's `for` with the accumulators' arrays'
  // reductions), where every pass can be: cpu_column_block_loops takes it where the blocks are too
  // few for the team (empty where a pass cannot).
  std::string column_block;
  std::string column_block_shared_rows;
  std::string flat() const {  // every level in order: for a nest that runs as one flat loop
    std::string all;
    for (const std::string& l : levels)
      all += l;
    return all;
  }
  // A 1-D nest's code outside its loop (what no element index reaches: 0-d loads and the math
  // on them), and inside it.
  std::string outside_loop() const { return levels.empty() ? "" : levels[0]; }
  std::string inside_loop() const {
    std::string all;
    for (size_t l = 1; l < levels.size(); ++l)
      all += levels[l];
    return all;
  }
};

// A region that is one index write stored in place, run as a scatter nest
// (schedule_scatter.cpp): the write, its dim, the input of its self, and the nest (self's shape
// with the dim taken out; the index's positions are walked inside an iteration).
struct ScatterStore {
  const Node* write = nullptr;
  size_t dim = 0;
  size_t base = 0;
  Shape nest;
};

// How a nest runs: CPU loops (one per dim), one flat CUDA grid-stride loop over its elements,
// CUDA rows (a block or a warp per row of the dims before the last, its threads over the last
// dim; the reductions at row level are computed by the row's threads together), or CUDA columns
// (a block per tile of consecutive elements, several threads per element sharing its reductions:
// schedule_reduction.h), or CUDA tiles (a block per tile of the last two dims, the inputs read
// transposed through shared memory: schedule_cuda_tiles.cpp).
enum class NestMode { kCpuLoops, kFlat, kRows, kColumns, kTiles };

// CUDA threads per block.
constexpr int kCudaBlock = 256;
// The shared memory a CUDA pointwise nest's broadcast tables may take (cuda_tables): 32 KiB
// leaves an H100's multiprocessor room for 7 blocks of them.
constexpr int64_t kCudaTableBytes = 32 * 1024;
// The threads that run one row of a row nest: a warp for rows of up to 512 elements (8 rows to a
// block; fewer, several rows a warp, for rows of a few vectors: packed_row_threads), else a
// block of 64 to kCudaBlock threads, the most that still leaves each thread two
// vectors of `vector` elements (row_lanes). A row's threads hold its elements in registers (the
// row cache, KernelEmitter::row_cached_load): fewer threads a row keep more rows, and more bytes,
// in flight on an SM, and spread each row's fixed work (its setup, its barriers) over more
// elements. On the H200 (bench/NOTES.md):
// - the normalization of rows of 1024 with 256 threads a row and no row cache was latency bound:
//   8 rows in flight per SM, and bf16 took the time f32 took;
// - a warp per row without the cache needed 174 registers a thread at rows of 1024 (32 trips,
//   loads of x, w and b each);
// - two rows of 128 threads in one block, each on its own named barrier, limited an SM to 4
//   blocks (ncu: "Block Limit Barriers"), so a row that is not a warp is a block.
inline int row_threads_for(int64_t length, int vector) {
  if (length <= 512) return 32;
  int threads = 64;
  while (threads < kCudaBlock && threads * 2 * vector * 2 <= length)
    threads *= 2;
  return threads;
}
// The threads of a row of 2 to 16 vectors of `vector` elements (a power of 2 of them): one vector
// a thread, several rows to a warp (0: a row that is not). A warp a row of 64 floats held two
// scalar loads a lane in flight, and the softmax over such rows ran at 1.25x eager's time.
inline int packed_row_threads(int64_t length, int vector) {
  if (vector <= 1 || length % vector != 0) return 0;
  const int64_t vectors = length / vector;
  return vectors >= 2 && vectors < 32 && (vectors & (vectors - 1)) == 0 ? static_cast<int>(vectors)
                                                                        : 0;
}
// The elements a row's thread takes at a time: the widest power of 2 up to `vector` (16 bytes)
// that divides the row, so that each is one aligned load where the row is contiguous (rows of 196
// bf16 take 4, 8 bytes a load, where 8 would not divide them).
inline int row_vector_lanes(int64_t length, int vector) {
  int lanes = std::max(vector, 1);
  while (lanes > 1 && length % lanes != 0)
    lanes /= 2;
  return lanes;
}
// The threads of a row per element (a reduction with one output a row, x.mean((2, 3))): a power
// of 2 from 4 to kCudaBlock, about four of the row's vectors (row_vector_lanes) a thread; rows
// under 32 threads are packed several to a warp. Measured on an H100 (bench/NOTES.md, session
// 43: a mean over rows of 49 to 8192 float32 and bf16 elements, 2^26 in all): one row a block of
// 64 took 0.83 ms over rows of 49, 8 rows a warp 0.097 (eager 0.311); at 196, 784 and 3136, 2 to
// 6 vectors a thread were within 5% of the best.
inline int unit_row_threads(int64_t length, int vector) {
  const int64_t vectors = length / row_vector_lanes(length, vector);
  int threads = 4;
  while (threads < kCudaBlock && threads * 2 * 4 <= vectors)
    threads *= 2;
  return threads;
}
// The fewest elements each thread of a split row takes (KernelNest::max_split): fewer, and the
// blocks' combines cost more than their loads.
constexpr int64_t kMinSplitElements = 16;
// Trips of a row loop (elements per thread) up to which the loop is unrolled completely, so its
// row cache is held in registers.
constexpr int64_t kRowCacheTrips = 16;
// The most 32-bit registers a thread spends on row caches.
constexpr int64_t kRowCacheWords = 64;

class KernelEmitter {
 public:
  KernelEmitter(const Step& step, Target target) : step_(step), body_(step.body), target_(target) {}
  KernelLowering run();
  // A multi-tensor kernel of a step whose tensors are all 1-D of one size (lower_multi_tensor
  // flattens a group's step so).
  MultiTensorLowering run_multi_tensor();

 private:
  // Types of the emitter's state and results.

  // A loop of the row's threads (a block's or a warp's) over [0, count): thread t takes t,
  // t + threads, ... Its trip count is a constant, so the compiler unrolls it and issues the loads
  // of every trip before it waits for the first. (A loop stepping by blockDim.x issued one load at
  // a time, and the row nests ran at about twice their byte floor on the H200: bench/NOTES.md.)
  // Over the row itself with a row vector width V (row_lanes), thread t takes V neighbours at a
  // time: (t + trip * threads) * V + lane, so that the row cache loads, and the final loop
  // stores, V elements with one instruction.
  struct BlockLoop {
    std::string open, close;  // the body goes between, as complete lines
    // With lanes: the trip loop alone (open_trip + lane loop + close_trip is the whole loop).
    std::string open_trip, close_trip;
  };

  // The row cache (row_cached_load): the loop variables that run over a row's positions, by
  // name, with their loop's trip variable and count; the cached arrays by input, index and count;
  // the code that fills them; the registers they take.
  struct RowPosition {
    std::string trip;  // the loop's current register in a row cache (cache_slot)
    int64_t count = 0;
    std::string loop = "";   // the loop's variable (block_loop's `var`)
    std::string first = "";  // a split row's: the trip's first position (empty: `<loop>_base`)
  };
  struct RowCache {
    std::string array;
    bool as_stored = false;  // holds the elements in their storage type (row_cached_load)
  };

  // lower_kernel.cpp: the driver: a nest per output shape, the kernel's declarations and layout
  Kernel lower();
  void declare_arguments(Kernel& k);
  std::string cpu_source(const std::vector<Shape>& shapes, Kernel& k);
  static std::string cpu_entry(const std::string& sd, const std::string& si);
  std::string describe_step() const;
  void check_device(const Value* v) const;
  // Whether the nest over `nest` stores an output of shape `output`: the same shape, or on CUDA
  // the same elements with a trailing dim of 1 more or less (a row's statistic [R, 1] and a
  // per-row result [R], one nest: rows reduced once, not once per shape).
  bool nest_stores(const Shape& output, const Shape& nest) const;
  NestBody emit_body(const Shape& shape, Kernel& k, bool is_last, NestMode mode,
                     const Lanes* lanes = nullptr, bool unit_row = false);
  void begin_body(const Shape& shape, const Kernel& k, NestMode mode, const Lanes* lanes);
  void record_last_nest_loads(const Shape& shape, Kernel& k);
  std::string cuda_source(const std::vector<Shape>& shapes, Kernel& k);
  std::string cuda_decls(const Kernel& k) const;
  std::string layout_decls(const Kernel& k, const std::string& from,
                           const std::string& index) const;
  // The nest's extents read at run time (Kernel::extents), so that its source is the same at
  // every size of its size class: registered when a nest begins (sizes > 1 only); a dim's
  // extent, a count that is a multiple of them, and the nest's shape as kernel text.
  void begin_nest_extents(const Shape& shape, Kernel& k);
  std::string extent_text(const Shape& shape, size_t d) const;
  std::string rows_times(int64_t count) const;
  std::string dims_product_text(const Shape& shape, size_t from) const;
  // A reduction pass's length or a join's bound read at run time as well: one extent per value.
  std::string runtime_size(int64_t count);
  std::string nest_shape_text(const Shape& shape) const;
  static std::string decompose(const Shape& shape, const std::string& indent);
  static std::string decompose_in_order(const Shape& shape, const std::vector<int>& order,
                                        const std::string& indent);
  static const char* storage_type(DType d);

  // emit_values.cpp: a value at an index: code placement by loop level, loads and views, numbers,
  // elementwise and creation ops
  static std::string indented(const std::string& code, int depth);
  static IndexExpr mul(const IndexExpr& index, const std::string& stride);
  static std::vector<std::string_view> variables_in(std::string_view text);
  static std::set<size_t> nest_indices_read(std::string_view text, size_t below);
  static std::string flat_indices(const Shape& shape, const std::string& body,
                                  const std::string& indent);
  static bool reads_multi_index(const Shape& shape, const std::string& body);
  static size_t leading_ones(const Shape& shape);
  size_t suffix_lanes(const Shape& shape, const Kernel& k, Lanes& lanes) const;
  int depth_of(std::string_view text) const;
  int depth_of(const Index& index) const;
  void emit(int level, const std::string& line, const std::string& defines = "");
  std::string close_level(int level);
  void declare(const std::string& type, const std::string& name, const std::string& expr);
  Val define(DType dtype, const std::string& expr);
  std::string reg(DType d) const;
  std::string compute_reg(DType d) const;
  static bool same_in_float_op(const Node& node, int rounding);
  static const Node* defining_node(const Value* v);
  Val eval(const Value* v, const Index& at);
  Val compute(const Value* v, const Index& at);
  Val load(size_t k, const Index& at);
  std::string load_address(size_t k, const Index& at);
  std::string strided_address(const std::string& base, const std::string& strides,
                              const Shape& shape, const Index& at);
  std::optional<std::string> merged_address(const std::string& base, const std::string& strides,
                                            const Shape& shape, const Index& at,
                                            std::vector<std::string>& flags);
  struct AddressTerm {
    IndexExpr index;
    size_t dim;  // the index is multiplied by this dim's stride
  };
  // (`constant`: the strides themselves where they are constants, as an as_strided view's)
  std::optional<std::vector<AddressTerm>> merged_terms(const std::string& strides,
                                                       const Shape& shape, const Index& at,
                                                       std::vector<std::string>& flags,
                                                       const Strides* constant = nullptr);
  void note_divmod_alias(const std::string& alias, const std::string& of);
  struct MergeFlags {
    std::string cond, on, off;
  };
  static MergeFlags merge_flags(const std::vector<std::string>& merges);
  Val as_strided(const Node& node, const Index& at);
  static bool inside(const Geometry& window, int64_t storage_numel);
  void require_whole_storage(const Value* v);
  Number number(const Operand& o);
  static bool number_is_bool(const Operand& o);
  static std::string store_number(const Number& n, DType out);
  static std::string copy_convert(const Val& v, DType out);
  static std::optional<std::string> pow_by_constant(const Operand& exponent);
  Val elementwise(const Node& node, const Index& at);
  void reductions_first(const Node& node, const Index& at);
  // Whether `iterations` of the nest's elements are worth a team of threads (kParallelIterations),
  // and the team's size clause: a thread for each half of kParallelIterations of work.
  bool parallel_worth(int64_t iterations) const;
  // The iterations a team of threads shares, and the same as text over the kernel's runtime
  // extents: `units` (empty: the iterations written over the nest's extent, rows_times) of
  // `per_unit` iterations each.
  struct TeamWork {
    int64_t iterations = 0;
    std::string units;
    int64_t per_unit = 1;
    // `iterations` of the nest's elements, its rows' extents written in (rows_times).
    static TeamWork of_nest(int64_t iterations) { return {iterations, "", 1}; }
  };
  std::string team_clause(const TeamWork& work) const;
  Val creation(const Node& node, const Index& at);

  // emit_reduction.cpp: reductions: their passes, accumulators and combines, and the outputs a pass
  // stores
  Val reduction(const Node& node, const Index& at);
  bool holds_reduction(const Value* v);
  bool written_back(size_t j) const;
  void store_in_pass(int level, const Index& at, int lanes, const std::string& lane, int outer);
  static IndexExpr output_address(size_t j, const Index& at);

  // emit_index.cpp: index ops (index_select, gathers, index writes), scatters into views, cat and
  // stack
  Val indexed(const Node& node, const Index& at);
  void check_scan_length(const Node& node, int64_t length);
  void check_index_values(const Node& node, const Value* index, int64_t size, size_t dim);
  IndexExpr clamped_position(const Val& j, int64_t size);
  IndexCheck index_check(const Node& node, const Value* index, int64_t size, int64_t dim,
                         const std::string& where);
  static bool keeps_every_element(const Node* view);
  Val scattered(const Node& node, const Index& at, size_t dim);
  Val join(const Node& node, const Index& at);
  static std::string copy_convert_item(const Val& v, DType out);
  Val scatter(const Node& node, const Index& at);
  bool as_strided_slot(const Node& node, const Index& at, std::string* cond, Index* slot);

  // schedule_cpu_loops.cpp: CPU nests: their loops (shared by the cores), the flat vector loop,
  // broadcast tables
  std::string cpu_tables(Kernel& k);
  static std::string table_position(const Value* v, const Index& at);
  bool lanes_along_table(const Value* v, const Index& at) const;
  std::string emit_nest(const Shape& shape, Kernel& k, bool is_last);
  std::string emit_nest_loops(const Shape& shape, Kernel& k, bool is_last);
  std::string cpu_loops(const Shape& shape, const NestBody& body, const TeamWork& work) const;
  std::string cpu_column_block_loops(const Shape& shape, const NestBody& body,
                                     const TeamWork& work) const;
  static std::vector<size_t> cpu_loop_order(const Shape& shape, const NestBody& body);
  static size_t column_block_outside(const Shape& shape, const NestBody& body);
  TeamWork cpu_nest_work(const Shape& shape, const NestBody& body) const;
  std::string cpu_loop_open(const Shape& shape, size_t d, const NestBody& body, size_t depth) const;
  static std::string cpu_loops_close(size_t depth);
  std::string cpu_ordered_loops(const Shape& shape, const std::vector<int>& order,
                                const NestBody& body, const TeamWork& work, bool is_last);
  std::vector<std::string> unit_inner_strides(const Shape& shape, const Kernel& k,
                                              int64_t work) const;
  std::string cpu_flat_loop(const Shape& shape, Kernel& k, bool is_last);
  std::string cpu_split_flat_loop(const Shape& shape, size_t split, const NestBody& lane,
                                  const std::optional<std::string>& team) const;
  // The input lanes' addresses (lane_in0, ...) and element sizes a prefetched loop asks for.
  struct LaneMemory {
    std::string pointer;
    int64_t element_bytes = 0;
  };
  std::string cpu_prefetched_flat_loop(int64_t numel, const std::vector<LaneMemory>& lanes,
                                       const std::string& body) const;
  bool flat_loop_prefetched_ = false;  // the last cpu_flat_loop's (for the schedule comment)
  static size_t flat_loop_split(const Shape& shape, const NestBody& body);

  // schedule_multi_tensor.cpp: one step's elementwise computation over many members
  MultiTensorKernel multi_tensor();
  std::string cpu_multi_tensor_source(const Kernel& k, const NestBody& lane,
                                      const MultiTensorKernel& mt);
  std::string cuda_multi_tensor_source(const Kernel& k, const NestBody& lane,
                                       MultiTensorKernel& mt);

  // schedule_cpu_tiles.cpp: CPU nests in tiles, for an operand read transposed
  bool tiles_fit(const Shape& shape, const NestBody& body) const;
  std::string cpu_tiled_loops(const Shape& shape, const NestBody& body, const TeamWork& work) const;

  // schedule_cpu_pass_forms.cpp: the form of a pass one thread runs, and its loops
  struct PassForm {
    bool last_dim_reduced = false;
    bool columns_innermost = false;  // (CPU, at the nest's element) its last kept dim innermost
    bool reduced_innermost = false;  // a reduced dim innermost, the last dim kept
    int64_t block = 0;               // the positions of its inner loop (all of them: not nested)
    bool nested = false;             // a loop over the outer reduced dims around the block's
    bool two_forms = false;          // a merged form and a divided one (rl<k>_merged)
    int64_t innermost_size = 1;      // the innermost reduced dim's size (the divided inner loop)
  };
  PassForm pass_form(const Value* in, const std::vector<int64_t>& reduced, int depth, bool shared,
                     bool arg) const;
  // A pass's loops (reduction's pass): its body, accumulators and combine lines, its variables
  // (rl; ro, the outer loop's, where nested or in two forms) and the merged form's positions.
  struct SerialPass {
    int depth = 0;
    int64_t count = 0;
    std::function<std::string()> count_text;  // (registers the runtime extent where it reads one)
    bool runtime_count = false;
    std::string rl, ro;
    std::set<std::string> merged_positions;
    std::string body, simd;
    std::vector<Accumulator> accs;
    std::vector<std::pair<std::string, std::string>> combines;
    bool float_sum = false;  // a float sum into double, in float chunks (cpu_float_chunks)
    bool stores_in_pass = false;
    int64_t split = 0;  // cpu_residue_split's
    std::string same_as_rl;
    PassForm form;
  };
  // (true: the pass runs in the nest's column block, cpu_column_block)
  bool serial_pass_loops(const SerialPass& pass);
  static int64_t inner_reduced_block(const Shape& shape, const std::vector<int64_t>& reduced);
  static std::vector<int64_t> memory_order_of_reduced(const Value* in,
                                                      std::vector<int64_t> reduced);
  using ReadStrides = std::map<const Value*, std::optional<std::vector<int64_t>>>;
  static std::optional<std::vector<int64_t>> read_strides(const Value* v, ReadStrides& seen);
  static std::optional<bool> last_kept_dim_innermost(const Value* in,
                                                     const std::vector<int64_t>& reduced);
  // A pass's divided form (reduction: two_forms): the loop over the innermost reduced dim (rl,
  // `inner` positions) inside one over the others (ro, `outer` positions as kernel text).
  struct DividedPass {
    std::string rl, ro, outer;
    int64_t inner = 0, count = 0;
    std::string body, simd;
    std::string float_sum;  // a float sum's accumulator, summed a row in float (cpu_float_chunks)
    std::vector<std::pair<std::string, std::string>> combines;
  };
  static std::map<int64_t, std::string> divided_pass_indices(const Shape& shape,
                                                             const std::vector<int64_t>& reduced,
                                                             const std::string& ro,
                                                             const std::string& rl);
  void cpu_divided_pass(const DividedPass& pass, int depth);
  std::string pass_merge_flags(const std::set<std::string>& positions) const;

  // schedule_cpu_passes.cpp: CPU reduction passes: column blocks, pieces between guards, row
  // buffers
  static std::string column_block_loop(const std::string& length, const std::string& passes,
                                       const std::string& pad);
  struct KeptRowValue;
  void keep_row_value(const Value* v, const Val& x, const Index& index, int level, int depth,
                      int64_t count, const std::vector<int64_t>& across_rows = {});
  void withdraw_kept_values(size_t from);
  void check_kept_column_values(const Shape& shape, const NestBody& body) const;
  std::optional<Val> read_kept_row_value(const std::string& key);
  bool keep_in_row_buffer(KeptRowValue& kept);
  bool keep_in_output(KeptRowValue& kept);
  void place_kept_row_values();
  void note_cut(const IndexExpr& x, int64_t at);
  std::vector<int64_t> pieces_between_cuts(const std::string& var, int64_t count) const;
  std::optional<std::string> column_block_fits(const std::string& body, int depth,
                                               bool last_dim_reduced,
                                               const std::vector<Accumulator>& accs) const;
  void cpu_column_block(const std::string& rl, int64_t count, const std::string& count_text,
                        const std::string& body, const std::vector<Accumulator>& accs,
                        const std::string& element, const std::string& simd,
                        const std::vector<std::pair<std::string, std::string>>& float_sum);
  // (to_text: `to` as kernel text, the pass's runtime extent; empty: the literal)
  void cpu_float_chunks(const std::string& rl, int64_t from, int64_t to, const std::string& to_text,
                        int64_t group, const std::string& body,
                        const std::vector<std::pair<std::string, std::string>>& combines,
                        const std::string& acc, int depth, bool team = true);
  std::string cpu_sum_lanes(const std::string& rl, const std::string& first,
                            const std::string& last, const std::string& body,
                            const std::vector<std::pair<std::string, std::string>>& combines,
                            const std::string& part, int depth);
  int64_t cpu_residue_split(int64_t count) const;

  // schedule_scatter.cpp: an index write stored in place, a nest over the positions it writes
  std::optional<ScatterStore> scatter_store() const;
  NestBody emit_scatter_body(const ScatterStore& scatter, Kernel& k, NestMode mode);
  void record_scatter_loads(const Shape& nest, Kernel& k);
  std::string scatter_schedule(const ScatterStore& scatter) const;
  std::string cpu_scatter_nest(const ScatterStore& scatter, Kernel& k);
  std::string cuda_scatter_nest(const ScatterStore& scatter, Kernel& k, std::string* entries);
  std::optional<ScatterStore> scatter_;  // the region's, if it is one (lower)

  // schedule_cuda_pointwise.cpp: CUDA flat nests: a grid-stride loop, scalar and 16-byte vector
  // variants
  static std::string cuda_entries(size_t index, char variant, int block_threads,
                                  const std::string& body);
  std::string cuda_nest(size_t index, const Shape& shape, Kernel& k, bool is_last,
                        std::string* entries);
  // An output of this nest laid out in another dim order (Step::output_orders): the order the
  // nest iterates in, so that its stores coalesce; nullptr: row-major.
  const std::vector<int>* stored_order(const Shape& shape, const Kernel& k) const;
  std::string cuda_tables(const Shape& shape, Kernel& k, int64_t& entries);
  std::string cuda_vector_variant(const std::string& name, const Shape& shape, Kernel& k,
                                  bool is_last, const std::vector<int>* order,
                                  const std::string& prologue, const NestBody& scalar,
                                  KernelNest& nest);
  std::string lane_table_loads(const Shape& shape, const Lanes& lanes) const;

  // schedule_cuda_rows.cpp: CUDA row nests: a warp or a block per row, its reductions shared, the
  // row cache
  std::string cuda_rows_nest(size_t index, const Shape& shape, Kernel& k, bool is_last,
                             KernelNest& nest, std::string* entries, bool unit_row = false);
  std::string cuda_row_loop(const Shape& shape, const NestBody& rows, const KernelNest& nest,
                            const Kernel& k);
  std::string specialized_on_merges(const std::string& code) const;
  BlockLoop block_loop(const std::string& var, const std::string& type, int64_t count) const;
  int row_lanes(int64_t count) const;
  int64_t row_trips(int64_t count) const;
  static std::string cache_slot(const std::string& var, int lanes);
  std::string row_vector_store(size_t j, const Shape& shape, const std::string& var, int lanes,
                               std::string* flush) const;
  std::string trip_first(const std::string& var, int lanes, const std::string& type) const;
  std::string row_thread() const;
  std::string row_combine(const std::string& op, const std::string& acc);
  std::optional<Val> row_cached_load(size_t k, const Index& at);
  std::optional<Val> merged_row_cached_load(size_t k, const Index& at);
  std::optional<std::string> row_cache_slot(size_t k, const std::vector<AddressTerm>& prefix,
                                            const RowPosition& position,
                                            const std::string& condition);
  void keep_in_row_registers(const Value* v, const Val& x, const Index& index, int level, int depth,
                             int64_t count);
  // (`along`: the dims the pass runs over; none: the last alone)
  std::optional<std::string> row_element_key(const Value* v, const Index& index,
                                             const std::vector<int64_t>& along = {}) const;
  std::optional<Val> split_trip_load(size_t k, const Index& at, const RowPosition& position);
  bool uses_only_row_indices(const std::string& text) const;

  // schedule_cuda_tiles.cpp: CUDA nests in tiles, the inputs read transposed through shared memory
  static bool read_transposed(const std::string& key, size_t rank);
  std::vector<size_t> transposed_inputs(const Shape& shape) const;
  std::string cuda_tiles_nest(size_t index, const Shape& shape, Kernel& k, bool is_last,
                              KernelNest& nest, const std::vector<size_t>& transposed,
                              std::string* entries);
  std::optional<Val> tile_load(size_t k, const Index& at);

  // schedule_cuda_columns.cpp: CUDA column nests: tiles of outputs, lanes splitting each reduction
  // (schedule_reduction.h)
  int64_t widest_dtype_bytes(const Kernel& k) const;
  std::string cuda_columns_nest(size_t index, const Shape& shape, Kernel& k, bool is_last,
                                KernelNest& nest, const ReductionSchedule& schedule,
                                std::string* entries);

  // The emitter's state, and helpers small enough to stay here.
  std::string fresh(const char* prefix) { return prefix + std::to_string(next_++); }

  // An index write lowers as a gather: each output element scans the index for the positions
  // that land on it, `length` of them, so the kernel does output x length work. That is what a
  // KV cache's one-token index_copy_ wants (fused, in place); past kMaxScannedIndex positions
  // (an embedding's gradient: 8192 tokens into 50257 rows) PyTorch's scatter of the slices, work
  // of the slices alone, is faster, and the step runs through PyTorch.
  static constexpr int64_t kMaxScannedIndex = 16;
  const Step& step_;
  const Trace& body_;
  const Target target_;
  const Lanes* lanes_ = nullptr;
  std::unordered_map<const Value*, size_t> input_index_;

  // The nest being emitted.
  std::vector<std::string> levels_;  // code by level (NestBody::levels)
  static constexpr size_t kMaxKernelSource = size_t{1} << 20;
  size_t emitted_ = 0;                             // bytes emitted so far (emit)
  std::unordered_map<std::string, int> level_of_;  // the level of every variable defined so far
  int nest_rank_ = 0;
  NestMode mode_ = NestMode::kCpuLoops;
  int row_threads_ = kCudaBlock;  // a row nest's threads per row: a block's or a warp's
  int row_reductions_ = 0;        // reductions at row level (below the nest's last dim) so far
  int64_t row_reduce_count_ = 0;  // the most elements a row-level reduction combines
  std::unordered_map<std::string, RowPosition> row_positions_;
  int64_t row_length_ = 0;  // a row nest's row: the positions its row loops run over
  int row_vector_ = 1;      // ... and its row vector width (row_lanes)
  // A row nest whose rows are split across blocks (KernelNest::split_rows), its grid combines so
  // far, and its row-level reductions no block can share (an argmax: such a nest is not split).
  bool split_rows_ = false;
  int64_t split_row_count_ = 0;  // ... its rows
  int grid_combines_ = 0;
  int row_serial_reductions_ = 0;
  std::map<std::string, RowCache> row_caches_;
  std::string row_fills_;
  // By row loop variable: the merge conditions under which its loop reads merged rows' caches
  // (merged_row_cached_load; block_loop unrolls it where one holds).
  std::map<std::string, std::set<std::string>> merged_row_reads_;
  std::map<std::string, std::string> trip_fills_;  // a split row loop's loads, by its variable
  std::set<std::string> trip_variables_;           // ... and the variables they declare once a trip
  int64_t row_cache_words_ = 0;
  int reductions_ = 0;  // reductions in the nest so far

  // The nest being emitted, and the iterations of its reduction passes so far (each pass's
  // elements times the nest iterations it runs in): a CPU nest of 16 row sums over 4096 elements
  // has 16 iterations but 65536 of work (emit_nest's parallel loop).
  Shape nest_shape_;
  // The nest's extents as the kernel reads them (begin_nest_extents): e<k>, its value, its dim.
  struct NestExtent {
    std::string name;
    int64_t value = 0;
    size_t dim = 0;
  };
  std::vector<NestExtent> nest_extents_;
  const NestExtent* nest_extent(const Shape& shape, size_t d) const;
  std::map<int64_t, std::string> runtime_sizes_;  // runtime_size's, by value
  bool runtime_extents_ = false;  // lowering a kernel whose extents are passed (not multi-tensor)
  // A CPU nest's reduction passes, for the work its team shares (cpu_nest_work): each at its
  // level, run in the column block or not, over `count` elements (`length`: as kernel text).
  struct PassWork {
    int depth = 0;
    bool in_column_block = false;
    int64_t count = 0;
    std::string length;
  };
  std::vector<PassWork> pass_works_;
  // A CPU pass's divided positions (reduction over several dims): (quotient, remainder) as
  // text -> the position divided and the divisor; merged_address joins them back.
  struct Divmod {
    std::string dividend;
    int64_t divisor = 0;
  };
  std::map<std::pair<std::string, std::string>, Divmod> divmods_;
  // The flags (mg<i>) of the merges merged_terms took, by the position they read (a dividend).
  std::map<std::string, std::set<std::string>> merge_flags_by_dividend_;
  // The stride conditions of the nest's merged addresses, flag mg<i> for condition i
  // (emit_nest_loops and specialized_on_merges specialize the nest on them); merged addresses
  // only while merge_reduced_dims_ (a CPU nest's loops, a CUDA row nest's body).
  std::vector<std::string> merge_conditions_;
  // Those of them between constant strides, which hold (a nest of no others takes one copy).
  std::set<std::string> constant_merge_conditions_;
  bool merge_reduced_dims_ = false;
  // What an element of the nest costs so far: 1, plus kCostlyOpWeight for each libm-class
  // function in its body (costly_op). It scales the iterations parallel_worth compares.
  int64_t element_cost_ = 1;
  ElementReductions element_;     // the nest's element-level reductions so far (reduction)
  int column_tile_ = 0;           // a column nest's elements per block
  int column_lanes_ = 0;          // ... and threads per element
  bool split_columns_ = false;    // ... and whether its tiles are split across blocks
  int64_t row_buffer_bytes_ = 0;  // the nest's row buffers so far (keep_in_row_buffer)
  // The values a CPU row pass offers to keep for the row's elements (keep_row_value): its memo
  // key at the row's element, its value and index in the pass, the row's length, and the marker
  // the pass holds where its store goes; once the row's elements read it (read_kept_row_value),
  // where it is kept: a row buffer (its declaration at the pass's depth) or an output, the pass's
  // store line and the load that reads it back (none where neither holds it). A column pass's
  // value (across_rows: the pass runs down the nest's columns in its column block) is kept in an
  // output alone, and withdrawn where the pass does not run in the block.
  struct KeptRowValue {
    std::string key;
    Val value;
    Index index;
    int64_t count = 0;
    std::string marker;
    std::vector<int64_t> across_rows;  // a column pass's: the dims it runs down
    bool withdrawn = false;
    bool read = false;
    std::optional<size_t> output;
    std::string declaration, store, load;
  };
  std::vector<KeptRowValue> kept_row_values_;
  // A CPU nest's column block so far (cpu_column_block), pass by pass, so that the next pass
  // over the same rows may join the last one's loop: its loop variable and length, its
  // accumulators' arrays and its vector loop's body, and the OpenMP reductions of the arrays
  // under which a team may share its rows (none where its order matters: an argmax); and every
  // accumulator of the block's passes so far.
  struct ColumnPass {
    std::string rl;
    int64_t count = 0;
    std::string count_text, arrays, element;
    std::optional<std::string> row_reductions;
    std::vector<std::string> float_sums;  // the accumulators summed in float chunks of rows
  };
  std::vector<ColumnPass> column_passes_;
  std::vector<std::string> column_block_accumulators_;
  std::string column_block_text(bool shared_rows) const;
  static std::string column_float_chunks(const ColumnPass& pass, std::string rows);

  // The constants the guards of the nest so far compare each loop variable with (note_cut).
  std::map<std::string, std::set<int64_t>> cuts_;
  std::unordered_map<const Value*, bool> holds_reduction_;
  // A CUDA tiles nest's inputs read through shared memory, by input: the index they are read at
  // (index_key), and their tile arrays (schedule_cuda_tiles.cpp).
  std::map<size_t, std::string> tile_keys_;  // holds_reduction's answers

  // Whether a CPU pass across rows may store (lower: cleared when one cannot run in its block).
  bool cpu_column_pass_stores_ = true;
  // Whether a CPU column pass may keep its value for the elements (ColumnValueKeptUnderItsRows).
  bool cpu_keep_column_values_ = true;
  // The CPU float sums summed in double wherever they run (SumComputedTwice), and where each sum
  // of the kernel was computed so far (its nest and output index).
  std::set<const Node*> exact_sums_;
  std::map<const Node*, std::set<std::string>> sum_sites_;
  std::unordered_map<std::string, Val> memo_;
  // The accumulators of the nest's sums so far, by what they sum (reduction: summed_key).
  std::unordered_map<std::string, std::string> sums_;
  std::optional<PassStores> pass_stores_;  // the region's, if its reduction's pass stores
  // The indices the nest's pass stores at (index_key), if it does: one, or one for each residue
  // of a pass split by residue (cpu_residue_split).
  std::set<std::string> pass_store_keys_;
  Kernel* kernel_ = nullptr;   // the kernel being lowered
  bool nest_is_last_ = false;  // whether the nest being emitted is the kernel's last

  // The tables filled so far, by value: the CPU kernel's (cpu_tables), or the CUDA nest's being
  // emitted (cuda_tables).
  std::unordered_map<const Value*, std::string> table_name_;
  // The tables a vector variant's lanes read as one vector each (Lanes::inner_dim), by name:
  // loaded into lane_<name>[width] before the lanes' loop.
  std::set<std::string> lane_tables_;
  // CUDA: values an earlier nest of the kernel stored whole into a fresh output buffer (value ->
  // output): a later nest, launched after it, reads them there instead of computing them again
  // (a GELU's gradient stored by the pointwise nest, summed down columns by the next).
  std::unordered_map<const Value*, size_t> stored_by_earlier_nest_;
  std::vector<IndexCheck> index_checks_;      // of the index ops lowered so far (one per use)
  std::vector<std::set<std::string>> loads_;  // per input: the indices it is loaded at
  std::vector<bool> raw_loads_;               // per input: read through as_strided

  // Per input: the indices of its loads outside any scatter's src, and whether it is loaded
  // inside one (where the load's value is used only under the scatter's condition).
  std::vector<std::set<std::string>> unguarded_loads_;
  std::vector<bool> guarded_loads_;
  int guard_depth_ = 0;  // > 0 while evaluating a scatter's src

  // Per input: the indices of its loads outside a row's passes (all of them but those a pass that
  // precedes every store of its row makes while row_pass_depth_ > 0; record_last_nest_loads).
  std::vector<std::set<std::string>> loads_outside_row_passes_;
  int row_pass_depth_ = 0;
  std::vector<std::vector<StorageWindow>> windows_;
  std::vector<bool> whole_storage_;  // per input: indexed as its storage (require_whole_storage)
  int next_ = 0;
};

}  // namespace kiln::codegen::detail
