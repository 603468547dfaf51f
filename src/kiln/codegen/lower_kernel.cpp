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

namespace kiln::codegen {

namespace {

// Loop nests with at least this many iterations run on all cores (OpenMP); smaller ones on the
// calling thread, where starting a team would cost more than the work.
constexpr int64_t kParallelIterations = int64_t{1} << 16;
// The fewest consecutive elements for which a flat loop splits around its broadcast values
// (flat_loop_split): below, the split's outer loop costs more than the values it hoists.
constexpr int64_t kMinSplitInner = 16;
// The positions of a CPU column block (cpu_column_block): each row's part of the block is read as
// one vector loop of this many elements, their accumulators held in arrays.
constexpr int64_t kCpuColumnBlock = 64;
// The side of a CPU nest's tiles where an input is read transposed (cpu_tiled_loops): 16 x 16
// floats of it are 16 cache lines, held in L1 while a tile's rows are stored (x.add_(y.t()) of
// 2048 x 2048 floats on 2 cores: 4.1 ms in tiles of 16, 6.6 of 32, 7.7 of 64; 12.3 untiled).
constexpr int64_t kCpuTile = 16;
// The longest row whose pass keeps its values in a buffer for the row's elements
// (keep_in_row_buffer): 256 KiB of float, within a core's L2 and a thread's stack.
constexpr int64_t kMaxRowBuffer = 65536;
// The most pieces a CPU pass is split into at its guards' bounds (pieces_between_cuts).
constexpr size_t kMaxPassPieces = 4;

// ops.def's elementwise expressions as text: the same table the interpreter compiles.
struct ExprText {
  const char* f;
  const char* i;
};
const ExprText& expr_text(OpId id) {
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
[[noreturn]] void not_lowered(std::string why) {
  throw NotLowered{std::move(why)};
}

std::string double_literal(double v) {
  // Through the preludes' functions: NVRTC has no __builtin_inf (a CUDA kernel of
  // masked_fill(-inf) did not compile).
  if (std::isnan(v)) return std::signbit(v) ? "(-kernel_nan())" : "kernel_nan()";
  if (std::isinf(v)) return v < 0 ? "(-kernel_infinity())" : "kernel_infinity()";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);  // exact
  return v < 0 || std::signbit(v) ? std::string("(") + buf + ")" : buf;
}

std::string int_literal(int64_t v) {
  if (v == INT64_MIN) return "(-9223372036854775807LL - 1)";
  std::string s = std::to_string(v) + "LL";
  return v < 0 ? "(" + s + ")" : s;
}

std::string suffix(DType d) {
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
};

// A nest's body: the code that computes every output at the iteration's index, by loop level
// (level 0 runs before the nest's loops, level d inside loop d - 1: a value is placed at the
// outermost level whose loop variables it uses, so a row statistic is computed once per row),
// then the stores (innermost).
struct NestBody {
  std::vector<std::string> levels;
  std::string stores;
  // A CPU nest's column block (cpu_column_block): the passes of its column reductions, run for a
  // block of consecutive positions of the last dim before the last loop runs over them.
  std::string column_block;
  std::string flat() const {  // every level in order: for a nest that runs as one flat loop
    std::string all;
    for (const std::string& l : levels)
      all += l;
    return all;
  }
};

// How a nest runs: CPU loops (one per dim), one flat CUDA grid-stride loop over its elements,
// CUDA rows (a block or a warp per row of the dims before the last, its threads over the last
// dim; the reductions at row level are computed by the row's threads together), or CUDA columns
// (a block per tile of consecutive elements, several threads per element sharing its reductions:
// schedule_reduction.h).
enum class NestMode { kCpuLoops, kFlat, kRows, kColumns };

// CUDA threads per block.
constexpr int kCudaBlock = 256;
// The threads that run one row of a row nest: a warp for rows of up to 512 elements (8 rows to a
// block), else a block of 64 to kCudaBlock threads, the most that still leaves each thread two
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
int row_threads_for(int64_t length, int vector) {
  if (length <= 512) return 32;
  int threads = 64;
  while (threads < kCudaBlock && threads * 2 * vector * 2 <= length)
    threads *= 2;
  return threads;
}
// Trips of a row loop (elements per thread) up to which the loop is unrolled completely, so its
// row cache is held in registers.
constexpr int64_t kRowCacheTrips = 16;
// The most 32-bit registers a thread spends on row caches.
constexpr int64_t kRowCacheWords = 64;

class KernelEmitter {
 public:
  KernelEmitter(const Step& step, Target target) : step_(step), body_(step.body), target_(target) {}

  KernelLowering run() {
    try {
      return KernelLowering{lower(), ""};
    } catch (const NotLowered& e) {
      return KernelLowering{std::nullopt, e.why};
    } catch (const PassOutsideColumnBlock&) {
      KernelEmitter again(step_, target_);
      again.cpu_column_pass_stores_ = false;
      return again.run();
    }
  }

 private:
  Kernel lower() {
    if (step_.kind != Step::Kind::kFusion) not_lowered("not a fusion region");
    Kernel k;
    k.target = target_;
    // Inputs: where each tensor's layout sits in in_meta.
    for (size_t i = 0; i < body_.inputs().size(); ++i) {
      const Value* in = body_.inputs()[i];
      input_index_[in] = i;
      KernelInput ki;
      ki.is_tensor = in->is_tensor();
      if (ki.is_tensor) {
        check_device(in);
        ki.meta = static_cast<int>(k.in_meta_size);
        k.in_meta_size += 1 + in->tensor_type().rank();
      }
      k.inputs.push_back(ki);
    }
    windows_.resize(k.inputs.size());
    whole_storage_.assign(k.inputs.size(), false);
    const std::vector<Value*>& outs = body_.outputs();
    if (outs.empty()) not_lowered("the region has no outputs");
    for (const Value* o : outs) {
      if (!o->is_tensor()) not_lowered("an output of the region is a number");
      check_device(o);
      KernelOutput ko;
      ko.dtype = o->tensor_type().dtype;
      ko.shape = o->tensor_type().shape;
      ko.meta = static_cast<int>(k.out_meta_size);
      k.out_meta_size += 1 + static_cast<int64_t>(ko.shape.size());
      k.outputs.push_back(ko);
    }
    if (std::none_of(body_.nodes().begin(), body_.nodes().end(),
                     [](const auto& n) { return n->op->kind != OpKind::kView; })) {
      not_lowered("the region only views its inputs (no kernel needed)");
    }

    // One nest per output shape; the nest with the writebacks last.
    std::vector<Shape> shapes;
    for (const KernelOutput& o : k.outputs)
      if (std::find(shapes.begin(), shapes.end(), o.shape) == shapes.end())
        shapes.push_back(o.shape);
    std::map<Shape, int> writebacks_per_shape;
    for (const Step::Writeback& wb : step_.writebacks)
      if (wb.value->is_tensor()) ++writebacks_per_shape[wb.value->tensor_type().shape];
    size_t last = shapes.size() - 1;
    int most = 0;
    for (size_t s = 0; s < shapes.size(); ++s) {
      int n = writebacks_per_shape[shapes[s]];
      if (n > most) most = n, last = s;
    }
    std::rotate(shapes.begin() + static_cast<int64_t>(last),
                shapes.begin() + static_cast<int64_t>(last) + 1, shapes.end());
    // Outputs over a reduction's domain stored by its pass: no nest of their own. On the CPU a
    // pass across rows stores only in a column block (cpu_column_block), whose vector loops store
    // a block's part of each row: down a column alone it would store one element a cache line
    // (bench.py's column sum at 2^22 on 2 cores: 37 ms, against 11.8 with a nest of their own);
    // a pass that cannot run in the block lowers the region again without pass stores. On the
    // H200 the column schedule's 32-byte row segments, loaded and stored, took 0.460 ms for the
    // column sum at 2^26 against 0.366 with a nest of their own (2026-12-03). There the outputs'
    // nest runs last, after the reduction's read D (a same-index store all the same).
    pass_stores_ = pass_stores(body_);
    if (pass_stores_ && !pass_stores_->along_last_dim &&
        (target_ == Target::kCpu ? !cpu_column_pass_stores_
                                 : outer_reduction_in_columns(shape_numel(
                                       pass_stores_->reduction->outputs[0]->tensor_type().shape))))
      pass_stores_.reset();
    if (pass_stores_) std::erase(shapes, pass_stores_->domain);

    k.source = target_ == Target::kCpu ? cpu_source(shapes, k) : cuda_source(shapes, k);
    for (const IndexCheck& c : index_checks_) {
      bool seen =
          std::any_of(k.index_checks.begin(), k.index_checks.end(),
                      [&](const IndexCheck& o) { return o.input == c.input && o.size == c.size; });
      if (!seen) k.index_checks.push_back(c);
    }
    // What the executor checks before the kernel runs, for the reader of the source.
    std::string checks;
    for (const IndexCheck& c : k.index_checks)
      checks += "// index check: input " + std::to_string(c.input) + " in [" +
                (c.negative ? "-" : "0, ") + (c.negative ? std::to_string(c.size) + ", " : "") +
                std::to_string(c.size) + ") for " + c.op + "\n";
    k.source = checks + k.source;
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      k.inputs[i].windows = windows_[i];
      k.inputs[i].whole_storage = whole_storage_[i];
    }
    return k;
  }

  std::string cpu_source(const std::vector<Shape>& shapes, Kernel& k) {
    std::string nests = cpu_tables(k);
    for (size_t s = 0; s < shapes.size(); ++s) {
      bool is_last = s + 1 == shapes.size();
      nests += emit_nest(shapes[s], k, is_last);
    }
    std::string src =
        "extern \"C\" void KILN_KERNEL_NAME(void* const* ins, const int64_t* in_meta, "
        "const double* sd, const int64_t* si, void* const* outs, const int64_t* "
        "out_meta) {\n";
    src += "  using namespace kiln;\n  using namespace kiln::kernel;\n";
    src += "  (void)ins; (void)in_meta; (void)sd; (void)si;\n";
    src += "  // " + describe_step() + "\n";
    src += layout_decls(k, "", "int64_t");
    src += nests + "}\n";
    return src;
  }

  // The region's ops (not its name or value names: equal regions of different programs should
  // have equal sources, and share one compiled kernel).
  std::string describe_step() const {
    std::string s = "ops:";
    for (const auto& n : body_.nodes())
      s += " " + n->op->name;
    return s;
  }

  void check_device(const Value* v) const {
    Device::Kind want = target_ == Target::kCpu ? Device::Kind::kCpu : Device::Kind::kCuda;
    if (v->tensor_type().device.kind != want)
      not_lowered("a tensor of the region is on " + v->tensor_type().device.str());
  }

  // ---- loop nests --------------------------------------------------------------------------

  // The body of the nest over `shape`, at the index loop_index(shape). With `lanes`, the body of
  // one lane of a vectorized CUDA nest: loads of lanes->inputs and every store use registers.
  // With `unit_row`, `shape` ends in a dim of 1 that the outputs do not have: a row nest with one
  // row per output element (ReductionSchedule::kRowPerElement), whose reductions are at row level.
  NestBody emit_body(const Shape& shape, Kernel& k, bool is_last, NestMode mode,
                     const Lanes* lanes = nullptr, bool unit_row = false) {
    begin_body(shape, k, mode, lanes);
    const Shape out_shape(shape.begin(), shape.end() - (unit_row ? 1 : 0));
    Index at = loop_index(out_shape);
    kernel_ = &k;
    nest_is_last_ = is_last;
    std::vector<std::pair<size_t, Val>> values;
    for (size_t j = 0; j < k.outputs.size(); ++j) {
      if (k.outputs[j].shape != out_shape) continue;
      k.outputs[j].in_last_nest = is_last;
      values.emplace_back(j, eval(body_.outputs()[j], at));
    }
    // Every value of the iteration is computed above; only now does it store.
    std::string stores;
    const bool lane_stores = mode == NestMode::kRows && !shape.empty() && shape.back() > 1 &&
                             row_lanes(shape.back()) > 1;
    for (const auto& [j, v] : values) {
      std::string n = std::to_string(j);
      IndexExpr address = IndexExpr::var("oo" + n);
      for (size_t d = 0; d < out_shape.size(); ++d)
        address = address + mul(at[d], "os" + n + "_" + std::to_string(d));
      std::string where = lanes ? "lane_out" + n + ", l"
                          : lane_stores
                              ? "row_out" + n + ", i" + std::to_string(shape.size() - 1) + "_lane"
                              : "out" + n + ", " + address.text;
      stores += "st_" + suffix(k.outputs[j].dtype) + "(" + where + ", " + v.expr + ");\n";
    }
    lanes_ = nullptr;
    levels_[0] = row_fills_ + levels_[0];  // each row's cached elements, loaded first
    return NestBody{levels_, stores, column_block_};
  }

  // The emitter's state for a new nest over `shape`.
  void begin_body(const Shape& shape, const Kernel& k, NestMode mode, const Lanes* lanes) {
    memo_.clear();
    loads_.assign(k.inputs.size(), {});
    unguarded_loads_.assign(k.inputs.size(), {});
    guarded_loads_.assign(k.inputs.size(), false);
    loads_outside_row_passes_.assign(k.inputs.size(), {});
    row_pass_depth_ = 0;
    pass_store_key_.clear();
    column_block_.clear();
    cuts_.clear();
    raw_loads_.assign(k.inputs.size(), false);
    windows_.resize(k.inputs.size());
    levels_.assign(shape.size() + 1, "");
    level_of_.clear();
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] != 1) level_of_["i" + std::to_string(d)] = static_cast<int>(d) + 1;
    nest_rank_ = static_cast<int>(shape.size());
    mode_ = mode;
    row_reductions_ = 0;
    row_reduce_count_ = 0;
    reductions_ = 0;
    pass_iterations_ = 0;
    nest_shape_ = shape;
    element_ = ElementReductions{};
    lanes_ = lanes;
    // A flat loop's position `l` is the innermost loop's variable: what uses it stays inside the
    // inner loop of a split flat loop (cpu_flat_loop).
    if (lanes) level_of_["l"] = static_cast<int>(shape.size());
    row_positions_.clear();
    row_caches_.clear();
    row_fills_.clear();
    row_cache_words_ = 0;
    if (mode == NestMode::kRows && !shape.empty() && shape.back() > 1) {
      std::string last = "i" + std::to_string(shape.size() - 1);  // the row loop's (block_loop)
      row_positions_[last] = RowPosition{cache_slot(last, row_lanes(shape.back())), shape.back()};
      level_of_[last + "_trip"] = level_of_[last + "_lane"] = static_cast<int>(shape.size());
    }
  }

  // The CPU kernel's tables (broadcast_tables.h), each filled by a serial nest over its value's
  // own shape before the kernel's nests, which load its entries:
  //   alignas(64) float tbl0[64];   (the value's register type: reg)
  //   for (i1 < 64) { v3 = ... rsqrt(var[i1] + eps) * w[i1] ...; tbl0[i1] = v3; }
  //   ... nest over [32, 64, 16, 16]: v9 = ld(x, ...) * tbl0[i1] ...
  std::string cpu_tables(Kernel& k) {
    std::string src;
    for (const Value* v : broadcast_tables(body_)) {
      const TensorType& type = v->tensor_type();
      const std::string name = "tbl" + std::to_string(table_name_.size());
      begin_body(type.shape, k, NestMode::kCpuLoops, nullptr);
      const Index at = loop_index(type.shape);
      Val r = eval(v, at);
      NestBody body{levels_, name + "[" + table_position(v, at) + "] = " + r.expr + ";\n",
                    column_block_};
      src += "  alignas(64) " + reg(type.dtype) + " " + name + "[" + std::to_string(type.numel()) +
             "];\n";
      src += "  {  // table of " + v->name() + " " + shape_str(type.shape) + "\n" +
             indented(body.levels[0], 2) + cpu_loops(type.shape, body, 0) + "  }\n";
      table_name_[v] = name;  // filled: from here on its uses load it
    }
    return src;
  }
  // The entry of v's table at `at` (an index into v's shape): row-major.
  static std::string table_position(const Value* v, const Index& at) {
    const Shape& shape = v->tensor_type().shape;
    const Strides strides = contiguous_strides(shape);
    std::string position;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      position += (position.empty() ? "" : " + ") + std::string("(") + at[d].text + ") * " +
                  std::to_string(strides[d]) + "LL";
    }
    return position.empty() ? "0" : position;
  }

  std::string emit_nest(const Shape& shape, Kernel& k, bool is_last) {
    NestBody body = emit_body(shape, k, is_last, NestMode::kCpuLoops);
    bool has_reductions = reductions_ > 0;
    if (is_last) record_last_nest_loads(shape, k);
    const int64_t work = shape_numel(shape) + pass_iterations_;
    std::vector<std::string> unit = unit_inner_strides(shape, k, work);
    const bool tiled = !has_reductions && tiles_fit(shape, body);
    std::string flat = has_reductions || tiled ? "" : cpu_flat_loop(shape, k, is_last);
    // A flat loop of one dim is taken exactly when the inner strides are 1: the loops' unit
    // variant would be dead code.
    if (!flat.empty() && shape.size() == 1) unit.clear();

    std::string out = "  {  // " + std::string(is_last ? "last nest" : "nest") + " over " +
                      shape_str(shape) + "\n";
    if (!flat.empty()) out += flat + "  } else {\n";
    // The code outside the loops (a full reduction's passes) is specialized with them.
    const std::string loops =
        indented(body.levels[0], 2) +
        (tiled ? cpu_tiled_loops(shape, body, work) : cpu_loops(shape, body, work));
    if (unit.empty()) {
      out += loops;
    } else {
      std::string cond, declare;
      for (const std::string& n : unit) {
        cond += (cond.empty() ? "" : " && ") + n + " == 1LL";
        declare += (declare.empty() ? "" : ", ") + n + " = 1";
      }
      out += "  if (" + cond + ") {\n    constexpr int64_t " + declare + ";\n" +
             indented(loops, 1) + "  } else {\n" + indented(loops, 1) + "  }\n";
    }
    if (!flat.empty()) out += "  }\n";
    out += "  }\n";
    return out;
  }

  // A CPU nest's loops around its body: the outer ones shared by the cores (OpenMP) when the
  // nest's iterations and its reductions' elements come to kParallelIterations.
  static std::string cpu_loops(const Shape& shape, const NestBody& body, int64_t work) {
    std::string out;
    bool between_loops = false;  // code between the loops: they cannot collapse
    for (size_t d = 1; d < shape.size(); ++d)
      between_loops = between_loops || !body.levels[d].empty();
    const int collapse = between_loops ? 1 : std::max<int>(1, static_cast<int>(shape.size()) - 1);
    int64_t shared = 1;  // the iterations the threads share
    for (int d = 0; d < collapse && d < static_cast<int>(shape.size()); ++d)
      shared *= shape[static_cast<size_t>(d)];
    if (work >= kParallelIterations && shared > 1) {
      out += "#pragma omp parallel for";
      if (collapse > 1) out += " collapse(" + std::to_string(collapse) + ")";
      out += "\n";
    }
    const bool blocked = !body.column_block.empty();
    for (size_t d = 0; d < shape.size(); ++d) {
      std::string i = "i" + std::to_string(d), pad(2 + 2 * d, ' ');
      if (blocked && d + 1 == shape.size()) {
        out += column_block_loop(shape[d], body.column_block, pad);
        out += pad + "  for (int64_t " + i + " = cb; " + i + " < cb + cw; ++" + i + ") {\n";
      } else {
        out += pad + "  for (int64_t " + i + " = 0; " + i + " < " + std::to_string(shape[d]) +
               "; ++" + i + ") {\n";
      }
      out += indented(body.levels[d + 1], static_cast<int>(d) + 3);
    }
    out += indented(body.stores, static_cast<int>(shape.size()) + 2);
    for (size_t d = shape.size(); d-- > 0;) {
      const std::string close = std::string(2 + 2 * d, ' ') + "  }\n";
      out += blocked && d + 1 == shape.size() ? close + close : close;  // and the block loop's
    }
    return out;
  }

  // Whether a CPU nest without reductions runs its last two dims in tiles (cpu_tiled_loops): an
  // input is read transposed (its index's last entry is not the nest's last loop variable, which
  // indexes another dim: y.t() in x.add_(y.t())), both dims hold a few tiles, and the code between
  // the two loops has no loop of its own.
  bool tiles_fit(const Shape& shape, const NestBody& body) const {
    const size_t n = shape.size();
    if (n < 2 || shape[n - 1] < 2 * kCpuTile || shape[n - 2] < 2 * kCpuTile) return false;
    if (body.levels[n - 1].find("for (") != std::string::npos) return false;
    const std::string last = "i" + std::to_string(n - 1);
    for (const std::set<std::string>& keys : loads_)
      for (const std::string& key : keys) {
        std::vector<std::string> entries;
        for (size_t at = 0; at <= key.size();) {
          size_t end = key.find(", ", at);
          if (end == std::string::npos) end = key.size();
          entries.push_back(key.substr(at, end - at));
          at = end + 2;
        }
        if (entries.back() != last &&
            std::find(entries.begin(), entries.end() - 1, last) != entries.end() - 1)
          return true;
      }
    return false;
  }

  // A CPU nest's loops with its last two dims in tiles of kCpuTile x kCpuTile, for an input read
  // transposed: a row of the nest reads down a column of it, one element a cache line and a page
  // every few elements (x.add_(y.t()) of 2048 x 2048 floats took 12.3 ms on 2 cores, as eager
  // did); a tile's columns stay in L1 while its rows are stored.
  //   omp parallel for collapse(2)
  //   for (t0 = 0; t0 < 2048; t0 += 16) for (t1 = 0; t1 < 2048; t1 += 16)
  //     for (i0 = t0; i0 < min(t0 + 16, 2048); ++i0) for (i1 = t1; ...) { ... }
  static std::string cpu_tiled_loops(const Shape& shape, const NestBody& body, int64_t work) {
    const size_t n = shape.size();
    bool outer_code = false;  // code between the outer loops: the tile loops cannot collapse
    for (size_t d = 1; d + 1 < n; ++d)
      outer_code = outer_code || !body.levels[d].empty();
    std::string out;
    if (work >= kParallelIterations)
      out += outer_code ? "#pragma omp parallel for\n"
                        : "#pragma omp parallel for collapse(" + std::to_string(n) + ")\n";
    size_t depth = 0;
    auto open = [&](const std::string& line, const std::string& code) {
      out += std::string(2 + 2 * depth, ' ') + "  " + line + "\n";
      ++depth;
      out += indented(code, static_cast<int>(depth) + 2);
    };
    for (size_t d = 0; d + 2 < n; ++d) {
      std::string i = "i" + std::to_string(d);
      open("for (int64_t " + i + " = 0; " + i + " < " + std::to_string(shape[d]) + "; ++" + i +
               ") {",
           body.levels[d + 1]);
    }
    const std::string tile = std::to_string(kCpuTile);
    for (size_t d = n - 2; d < n; ++d) {
      std::string t = "t" + std::to_string(d);
      open("for (int64_t " + t + " = 0; " + t + " < " + std::to_string(shape[d]) + "; " + t +
               " += " + tile + ") {",
           "");
    }
    for (size_t d = n - 2; d < n; ++d) {
      std::string i = "i" + std::to_string(d), t = "t" + std::to_string(d);
      std::string size = std::to_string(shape[d]);
      open("for (int64_t " + i + " = " + t + "; " + i + " < (" + t + " + " + tile + " < " + size +
               " ? " + t + " + " + tile + " : " + size + "); ++" + i + ") {",
           body.levels[d + 1]);
    }
    out += indented(body.stores, static_cast<int>(depth) + 2);
    while (depth-- > 0)
      out += std::string(2 + 2 * depth, ' ') + "  }\n";
    return out;
  }

  // The opening of a CPU nest's last loop split into column blocks of kCpuColumnBlock positions
  // (cb, cw of them), whose column reductions' passes run first (cpu_column_block); the caller
  // opens the loop over the block's positions and closes both.
  static std::string column_block_loop(int64_t length, const std::string& passes,
                                       const std::string& pad) {
    const std::string width = std::to_string(kCpuColumnBlock);
    std::string out = pad + "  for (int64_t cb = 0; cb < " + std::to_string(length) +
                      "; cb += " + width + ") {\n";
    out += pad + "    const int64_t cw = " + std::to_string(length) + " - cb < " + width + " ? " +
           std::to_string(length) + " - cb : " + width + ";\n";
    return out + indented(passes, static_cast<int>(pad.size() / 2) + 2);
  }

  // The innermost strides of the tensors a CPU nest reads or writes (s0_1, os0_1; none when the
  // nest is too small to matter). The nest's loops are then emitted twice: once for strides
  // known to be 1 (declared so in the loops' scope, shadowing the kernel's), and once for any.
  // With unit inner strides the loads of a row are contiguous to the compiler, and the innermost
  // loop and the reductions' simd passes vectorize (runtime strides made every load a gather,
  // which GCC does not vectorize for float).
  std::vector<std::string> unit_inner_strides(const Shape& shape, const Kernel& k,
                                              int64_t work) const {
    if (work < 16) return {};
    std::vector<std::string> names;
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      if (!k.inputs[i].is_tensor || loads_[i].empty()) continue;
      const TensorType& t = body_.inputs()[i]->tensor_type();
      if (t.rank() == 0 || t.shape.back() == 1) continue;
      names.push_back("s" + std::to_string(i) + "_" + std::to_string(t.rank() - 1));
    }
    for (size_t j = 0; j < k.outputs.size(); ++j) {
      const Shape& out = k.outputs[j].shape;
      const bool stored_in_pass = !pass_store_key_.empty() && out == pass_stores_->domain;
      if ((out != shape && !stored_in_pass) || out.empty() || out.back() == 1) continue;
      names.push_back("os" + std::to_string(j) + "_" + std::to_string(out.size() - 1));
    }
    return names;
  }

  // A CPU nest without reductions also gets one flat loop that the compiler vectorizes (`omp
  // simd`; vector math from libmvec, cpu_vector_math.h), taken at run time when every tensor read
  // or written at the iteration's own element is contiguous over the nest. Those are addressed
  // as arrays from their first element; anything else (a broadcast operand, a view) is read at
  // the multi-index recovered from the flat one. Empty when no tensor qualifies.
  //   if (s0_0 == 4LL && s0_1 == 1LL && os0_0 == 4LL && os0_1 == 1LL) {
  //     for (int64_t lin = 0; lin < 12; ++lin) { ... ld_f32(lane_in0, l) ... st_f32(lane_out0, l,
  //     v) }
  //   } else { the strided loops }
  std::string cpu_flat_loop(const Shape& shape, Kernel& k, bool is_last) {
    int64_t numel = shape_numel(shape);
    if (shape.empty() || numel < 16) return "";
    std::string identity = index_key(loop_index(shape));
    Lanes lanes;
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      if (!k.inputs[i].is_tensor || raw_loads_[i] || loads_[i].empty()) continue;
      if (loads_[i].size() != 1 || *loads_[i].begin() != identity) continue;
      if (body_.inputs()[i]->tensor_type().shape != shape) continue;
      lanes.inputs.insert(i);
    }
    std::vector<size_t> outs;
    for (size_t j = 0; j < k.outputs.size(); ++j)
      if (k.outputs[j].shape == shape) outs.push_back(j);
    if (lanes.inputs.empty() && outs.empty()) return "";
    std::vector<std::vector<StorageWindow>> windows = windows_;
    std::vector<bool> whole = whole_storage_;
    NestBody lane = emit_body(shape, k, is_last, NestMode::kFlat, &lanes);
    windows_ = windows;
    whole_storage_ = whole;

    Strides contiguous = contiguous_strides(shape);
    std::string cond;
    auto require_contiguous = [&](const std::string& strides) {
      for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] == 1) continue;
        cond += std::string(cond.empty() ? "" : " && ") + strides + std::to_string(d) +
                " == " + std::to_string(contiguous[d]) + "LL";
      }
    };
    std::string text;
    for (size_t i : lanes.inputs) {
      std::string n = std::to_string(i);
      require_contiguous("s" + n + "_");
      text += "    const char* const lane_in" + n + " = static_cast<const char*>(in" + n + ") + o" +
              n + " * " + std::to_string(dtype_size(body_.inputs()[i]->tensor_type().dtype)) +
              ";\n";
    }
    for (size_t j : outs) {
      std::string n = std::to_string(j);
      require_contiguous("os" + n + "_");
      text += "    char* const lane_out" + n + " = static_cast<char*>(out" + n + ") + oo" + n +
              " * " + std::to_string(dtype_size(k.outputs[j].dtype)) + ";\n";
    }
    const size_t split = flat_loop_split(shape, lane);
    if (split == 0) {
      text +=
          numel >= kParallelIterations ? "#pragma omp parallel for simd\n" : "#pragma omp simd\n";
      text += "    for (int64_t lin = 0; lin < " + std::to_string(numel) + "LL; ++lin) {\n";
      text += "      [[maybe_unused]] const int64_t l = lin;\n" + decompose(shape, "      ");
      text += indented(lane.flat(), 3) + indented(lane.stores, 3) + "    }\n";
    } else {
      // outer dims [0, split), each outer position's values once, then the inner dims as one
      // vectorized loop over consecutive elements.
      Shape outer = shape, inner = shape;
      std::fill(outer.begin() + static_cast<std::ptrdiff_t>(split), outer.end(), 1);
      std::fill(inner.begin(), inner.begin() + static_cast<std::ptrdiff_t>(split), 1);
      const std::string inner_n = std::to_string(shape_numel(inner)) + "LL";
      std::string hoisted, inside;
      for (size_t d = 0; d < lane.levels.size(); ++d)
        (d <= split ? hoisted : inside) += lane.levels[d];
      if (numel >= kParallelIterations) text += "#pragma omp parallel for\n";
      text += "    for (int64_t outer = 0; outer < " + std::to_string(shape_numel(outer)) +
              "LL; ++outer) {\n";
      text += "      [[maybe_unused]] const I lin = outer;\n" + decompose(outer, "      ");
      text += indented(hoisted, 3) + "#pragma omp simd\n";
      text += "      for (int64_t within = 0; within < " + inner_n + "; ++within) {\n";
      text += "        [[maybe_unused]] const int64_t l = outer * " + inner_n + " + within;\n";
      text += "        [[maybe_unused]] const I lin = within;\n" + decompose(inner, "        ");
      text += indented(inside, 4) + indented(lane.stores, 4) + "      }\n    }\n";
    }
    return "  if (" + (cond.empty() ? std::string("true") : cond) + ") {\n" +
           "    using I [[maybe_unused]] = int64_t;\n" + text;
  }

  // Where a flat loop splits in two (0: it does not): at the innermost loop level with code of
  // its own before the innermost, or the nearest level outside it whose dims hold enough
  // consecutive elements for a vector loop. A broadcast operand's values (a batch norm's
  // per-channel scale, a rsqrt of it) are then computed once per outer position instead of once per
  // element:
  //   x[128, 256, 8, 8] * s.view(1, -1, 1, 1).rsqrt(): split 2, 32768 x rsqrt, then 64 lanes
  static size_t flat_loop_split(const Shape& shape, const NestBody& body) {
    size_t split = 0;
    for (size_t d = 1; d < shape.size(); ++d)
      if (!body.levels[d].empty()) split = d;
    // Too few elements inside: the split moves out while its inner block is short (a table
    // entry per channel of [64, 2048, 1, 1]: outer 64, inner 2048 channels read as a vector).
    for (; split > 0; --split) {
      int64_t inner = 1;
      for (size_t d = split; d < shape.size(); ++d)
        inner *= shape[d];
      if (inner >= kMinSplitInner) return split;
    }
    return 0;
  }

  // `code` with every line indented by `depth` two-space steps.
  static std::string indented(const std::string& code, int depth) {
    std::string out, pad(static_cast<size_t>(2 * depth), ' ');
    size_t at = 0;
    while (at < code.size()) {
      size_t end = code.find('\n', at);
      if (end == std::string::npos) end = code.size();
      out += pad + code.substr(at, end - at) + "\n";
      at = end + 1;
    }
    return out;
  }

  // Which inputs the last nest reads at other elements than the one it stores (for in-kernel
  // writebacks, DESIGN.md 4).
  void record_last_nest_loads(const Shape& shape, Kernel& k) {
    const Index loop = loop_index(shape);
    std::string identity = index_key(loop);
    // "i0, i1, " of a nest over [A, B, C]: the row indices a row-local load starts with.
    std::string row = index_key(Index(loop.begin(), loop.end() - (loop.empty() ? 0 : 1)));
    row += row.empty() ? "" : ", ";
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      if (loads_[i].empty() && !raw_loads_[i]) continue;
      const Shape& in_shape = body_.inputs()[i]->tensor_type().shape;
      // An input over the domain of a pass that stores (store_in_pass): its own element is the
      // one the pass loads and stores.
      const bool in_pass = !pass_store_key_.empty() && in_shape == pass_stores_->domain;
      const std::string& own = in_pass ? pass_store_key_ : identity;
      bool same_shape = in_pass || in_shape == shape;
      bool same =
          !raw_loads_[i] && loads_[i].size() == 1 && *loads_[i].begin() == own && same_shape;
      const std::set<std::string>& unguarded = unguarded_loads_[i];
      bool guarded = !raw_loads_[i] && guarded_loads_[i] && same_shape &&
                     (unguarded.empty() || (unguarded.size() == 1 && *unguarded.begin() == own));
      // Row-local: at the iteration's own index, or in one of its row's passes at an index of
      // that row (the index starts with the row's indices; its last coordinate is free).
      bool row_local = !in_pass && !raw_loads_[i] && !guarded_loads_[i] && !shape.empty() &&
                       in_shape.size() == shape.size();
      for (const std::string& key : loads_[i]) {
        bool own = key == identity;
        bool in_row = !loads_outside_row_passes_[i].contains(key) && key.starts_with(row) &&
                      key.find(", ", row.size()) == std::string::npos;
        row_local = row_local && (own || in_row);
      }
      k.inputs[i].last_nest_loads = same        ? KernelInput::Loads::kIdentity
                                    : guarded   ? KernelInput::Loads::kIdentityOrGuarded
                                    : row_local ? KernelInput::Loads::kRowLocal
                                                : KernelInput::Loads::kOther;
    }
  }

  // ---- CUDA ----------------------------------------------------------------------------------

  std::string cuda_source(const std::vector<Shape>& shapes, Kernel& k) {
    auto words = [](int64_t n) { return std::to_string(std::max<int64_t>(n, 1)); };
    std::string src = "namespace KILN_KERNEL_NAME {\n";
    src += "using namespace kiln;\nusing namespace kiln::kernel;\n";
    src += "// " + describe_step() + "\n";
    src += "struct Args {\n  void* ins[" + words(static_cast<int64_t>(k.inputs.size())) +
           "];\n  void* outs[" + words(static_cast<int64_t>(k.outputs.size())) +
           "];\n  int64_t in_meta[" + words(k.in_meta_size) + "];\n  int64_t out_meta[" +
           words(k.out_meta_size) + "];\n  double sd[" +
           words(static_cast<int64_t>(k.inputs.size())) + "];\n  int64_t si[" +
           words(static_cast<int64_t>(k.inputs.size())) + "];\n};\n";
    std::string entries;
    for (size_t s = 0; s < shapes.size(); ++s) {
      bool is_last = s + 1 == shapes.size();
      src += cuda_nest(s, shapes[s], k, is_last, &entries);
    }
    src += entries;
    src += "}  // namespace KILN_KERNEL_NAME\n";
    return src;
  }

  // The argument declarations of a nest function, in the index type I.
  std::string cuda_decls(const Kernel& k) const {
    std::string src;
    src += "  [[maybe_unused]] const double* const sd = a.sd;\n";
    src += "  [[maybe_unused]] const int64_t* const si = a.si;\n";
    return src + layout_decls(k, "a.", "I");
  }

  // Each tensor's base pointer (in<k>, out<k>) and its offset and strides (o<k>, s<k>_<d>;
  // oo<k>, os<k>_<d>) as `index` values, from the arrays ins, in_meta, outs, out_meta (named
  // with `from` before them).
  std::string layout_decls(const Kernel& k, const std::string& from,
                           const std::string& index) const {
    std::string src;
    auto declare_layout = [&](const std::string& pointer, const std::string& array,
                              const std::string& offset, const std::string& stride, int meta,
                              size_t rank) {
      auto element = [&](int at) {
        return "static_cast<" + index + ">(" + from + array + "[" + std::to_string(at) + "])";
      };
      src += "  [[maybe_unused]] " + pointer + ";\n";
      src += "  [[maybe_unused]] const " + index + " " + offset + " = " + element(meta);
      for (size_t d = 0; d < rank; ++d)
        src += ", " + stride + std::to_string(d) + " = " + element(meta + 1 + static_cast<int>(d));
      src += ";\n";
    };
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      if (!k.inputs[i].is_tensor) continue;
      std::string n = std::to_string(i);
      declare_layout("const void* const in" + n + " = " + from + "ins[" + n + "]", "in_meta",
                     "o" + n, "s" + n + "_", k.inputs[i].meta,
                     static_cast<size_t>(body_.inputs()[i]->tensor_type().rank()));
    }
    for (size_t j = 0; j < k.outputs.size(); ++j) {
      std::string n = std::to_string(j);
      declare_layout("void* const out" + n + " = " + from + "outs[" + n + "]", "out_meta", "oo" + n,
                     "os" + n + "_", k.outputs[j].meta, k.outputs[j].shape.size());
    }
    return src;
  }

  // i0, i1, ... of the linear position `lin` (row-major over `shape`; dims of size 1 are 0, and a
  // shape with a size-0 dim never runs its body).
  static std::string decompose(const Shape& shape, const std::string& indent) {
    std::string src = indent + "[[maybe_unused]] I rest = lin;\n";
    if (shape_numel(shape) == 0) {  // the body never runs; its indices only need to exist
      for (size_t d = 0; d < shape.size(); ++d)
        if (shape[d] != 1) src += indent + "const I i" + std::to_string(d) + " = 0;\n";
      return src;
    }
    size_t first = shape.size();
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] != 1) {
        first = d;
        break;
      }
    for (size_t d = shape.size(); d-- > 0;) {
      if (shape[d] == 1) continue;  // loop_index has 0 there
      std::string i = "i" + std::to_string(d);
      if (d == first) {
        src += indent + "const I " + i + " = rest;\n";
      } else {
        std::string size = std::to_string(shape[d]);
        src += indent + "const I " + i + " = rest % " + size + ";\n";
        src += indent + "rest /= " + size + ";\n";
      }
    }
    return src;
  }

  static const char* storage_type(DType d) {
    switch (d) {
      case DType::kBool:
        return "uint8_t";
      case DType::kInt32:
        return "int32_t";
      case DType::kInt64:
        return "int64_t";
      case DType::kFloat16:
      case DType::kBFloat16:
        return "uint16_t";
      case DType::kFloat32:
        return "float";
      case DType::kFloat64:
        return "double";
    }
    return "uint8_t";
  }

  // A nest with a row statistic (a reduction that does not depend on the last dim): one block per
  // row of the dims before the last, the statistic computed by the block together, then each
  // thread computes and stores the row's elements at its own positions of the last dim.
  // With `unit_row`, `shape` is the outputs' shape and a dim of 1 (emit_body): a row per element.
  std::string cuda_rows_nest(size_t index, const Shape& shape, Kernel& k, bool is_last,
                             KernelNest& nest, std::string* entries, bool unit_row = false) {
    std::vector<std::vector<StorageWindow>> windows = windows_;
    std::vector<bool> whole = whole_storage_;
    const int64_t length = !shape.empty() && shape.back() > 1 ? shape.back()
                           : unit_row                         ? element_.longest
                                                              : row_reduce_count_;
    // The row vector width: 16 bytes of the kernel's widest tensor dtype.
    const int64_t widest = widest_dtype_bytes(k);
    row_length_ = length;
    row_vector_ = static_cast<int>(std::min<int64_t>(8, 16 / widest));
    row_threads_ = row_threads_for(length, row_vector_);
    nest.block_threads = row_threads_ == 32 ? kCudaBlock : row_threads_;
    nest.rows_per_block = nest.block_threads / row_threads_;
    Shape outer(shape.begin(), shape.end() - (shape.empty() ? 0 : 1));
    nest.rows = std::max<int64_t>(shape_numel(outer), 1);
    refuse_an_idle_device((nest.rows + nest.rows_per_block - 1) / nest.rows_per_block,
                          nest.rows * length * widest);
    NestBody rows = emit_body(shape, k, is_last, NestMode::kRows, nullptr, unit_row);
    if (is_last)
      record_last_nest_loads(unit_row ? Shape(shape.begin(), shape.end() - 1) : shape, k);
    windows_ = windows;
    whole_storage_ = whole;
    std::string name = "nest" + std::to_string(index);
    std::string src = "template <class I>\n__device__ __forceinline__ void " + name +
                      "_rows(const Args& a) {\n" + cuda_decls(k);
    if (unit_row) src += "  // schedule: row per element\n";
    src += "  const I rows = static_cast<I>(" + std::to_string(nest.rows) + "LL);\n";
    if (nest.rows_per_block == 1) {
      src +=
          "  for (I row = static_cast<I>(blockIdx.x); row < rows; row += "
          "static_cast<I>(gridDim.x)) {\n";
    } else {  // a warp per row: the loop is uniform over each warp, whose lanes reduce together
      std::string per = std::to_string(nest.rows_per_block);
      src +=
          "  for (I row = static_cast<I>(blockIdx.x) * " + per +
          " + static_cast<I>(threadIdx.x >> 5); row < rows; row += static_cast<I>(gridDim.x) * " +
          per + ") {\n";
    }
    src += "    [[maybe_unused]] const I lin = row;\n" + decompose(outer, "    ");
    for (size_t d = 0; d < shape.size(); ++d)
      src += indented(rows.levels[d], 2);
    if (shape.empty() || shape.back() == 1) {
      src += indented(rows.levels[shape.size()], 2);
      src += "    if (" + row_thread() + " == 0) {\n" + indented(rows.stores, 3) + "    }\n";
    } else {
      std::string var = "i" + std::to_string(shape.size() - 1);
      BlockLoop loop = block_loop(var, "I", shape.back());
      const int lanes = row_lanes(shape.back());
      if (lanes == 1) {
        src += indented(loop.open + rows.levels[shape.size()] + rows.stores + loop.close, 2);
      } else {  // the lanes store into registers, then as one vector (row_lane_stores)
        std::string body = loop.open_trip, flush;
        for (size_t j = 0; j < k.outputs.size(); ++j) {
          if (k.outputs[j].shape != shape) continue;
          body += row_vector_store(j, shape, var, lanes, &flush);
        }
        size_t lane_open = loop.open.find("#pragma unroll", loop.open_trip.size());
        body += loop.open.substr(lane_open) + rows.levels[shape.size()] + rows.stores + "}\n" +
                flush + loop.close_trip;
        src += indented(body, 2);
      }
    }
    src += "  }\n}\n";
    *entries += cuda_entries(index, 's', nest.block_threads, name + "_rows");
    k.nests.push_back(std::move(nest));
    return src;
  }

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
  BlockLoop block_loop(const std::string& var, const std::string& type, int64_t count) const {
    const int lanes = row_lanes(count);
    int64_t trips = (count + row_threads_ * lanes - 1) / (row_threads_ * lanes);
    std::string trip = var + "_trip", threads = std::to_string(row_threads_);
    BlockLoop loop;
    loop.open_trip =
        std::string(trips <= kRowCacheTrips ? "#pragma unroll\n" : "#pragma unroll 4\n") +
        "for (int " + trip + " = 0; " + trip + " < " + std::to_string(trips) + "; ++" + trip +
        ") {\n";
    loop.close_trip = "}\n";
    std::string first = "static_cast<" + type + ">(" + row_thread() + ") + static_cast<" + type +
                        ">(" + trip + ") * " + threads;
    if (lanes == 1) {
      loop.open = loop.open_trip + "const " + type + " " + var + " = " + first + ";\n";
      loop.close = loop.close_trip;
    } else {
      std::string lane = var + "_lane", v = std::to_string(lanes);
      std::string lane_open = "#pragma unroll\nfor (int " + lane + " = 0; " + lane + " < " + v +
                              "; ++" + lane + ") {\nconst " + type + " " + var + " = (" + first +
                              ") * " + v + " + " + lane + ";\n";
      loop.open = loop.open_trip + lane_open;
      loop.close = "}\n" + loop.close_trip;
    }
    if (count % (row_threads_ * lanes) != 0) {  // (lanes > 1 divide the row exactly)
      loop.open += "if (" + var + " < " + std::to_string(count) + ") {\n";
      loop.close = "}\n" + loop.close;
    }
    return loop;
  }
  // The elements a row loop over `count` positions takes at a time: the nest's row vector width
  // for a loop over its whole row when the row's threads divide it into whole vectors, else 1.
  int row_lanes(int64_t count) const {
    if (mode_ != NestMode::kRows || row_vector_ <= 1 || count != row_length_) return 1;
    return count % (row_threads_ * row_vector_) == 0 ? row_vector_ : 1;
  }
  // The position (in the row cache's registers) of a row loop's current element.
  static std::string cache_slot(const std::string& var, int lanes) {
    if (lanes == 1) return var + "_trip";
    return var + "_trip * " + std::to_string(lanes) + " + " + var + "_lane";
  }
  // Output j's lanes of a row loop's trip: the registers they are stored into (returned, for the
  // trip's start) and the code that writes them out after the lanes (appended to `flush`): one
  // vector store where the output's row is contiguous and aligned, else a store of each lane.
  std::string row_vector_store(size_t j, const Shape& shape, const std::string& var, int lanes,
                               std::string* flush) const {
    const DType d = body_.outputs()[j]->tensor_type().dtype;
    std::string n = std::to_string(j), v = std::to_string(lanes),
                size = std::to_string(dtype_size(d));
    std::string base = "oo" + n, last = "os" + n + "_" + std::to_string(shape.size() - 1);
    for (size_t dim = 0; dim + 1 < shape.size(); ++dim)
      if (shape[dim] != 1)
        base += " + i" + std::to_string(dim) + "*os" + n + "_" + std::to_string(dim);
    std::string first = "(static_cast<I>(" + row_thread() + ") + static_cast<I>(" + var +
                        "_trip) * " + std::to_string(row_threads_) + ") * " + v;
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
  std::string row_thread() const {
    return row_threads_ == 32 ? "(threadIdx.x & 31)" : "threadIdx.x";
  }
  // The function that combines a row's partial results: warp_<op> or block_<op>
  // (cuda_block_reduce.cuh).
  std::string row_combine(const std::string& op) const {
    if (row_threads_ == 32) return "warp_" + op;
    return "block_" + op + "<" + std::to_string(row_threads_) + ">";
  }

  // The kernel entries of nest `index`'s `variant` ('s' scalar, 'v' vector), in 32- and 64-bit
  // indexing (_n<index>_<variant>32, ...64), each calling the device function `body<I>`.
  static std::string cuda_entries(size_t index, char variant, int block_threads,
                                  const std::string& body) {
    std::string out;
    for (int bits : {32, 64}) {
      std::string entry = "_n" + std::to_string(index) + "_" + variant + std::to_string(bits);
      out += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(block_threads) +
             ") KILN_CAT(KILN_KERNEL_NAME, " + entry + ")(const Args a) {\n  " + body + "<" +
             (bits == 32 ? "int32_t" : "int64_t") + ">(a);\n}\n";
    }
    return out;
  }

  // A reduction nest of `blocks` blocks over `bytes` that would be slower than eager's kernels
  // (leaves_the_device_idle) is not lowered: PyTorch runs the region's ops on the device.
  void refuse_an_idle_device(int64_t blocks, int64_t bytes) const {
    if (leaves_the_device_idle(blocks, bytes))
      not_lowered("a reduction over " + std::to_string(bytes) + " bytes in " +
                  std::to_string(blocks) +
                  " blocks would leave the GPU idle (no reduction split across blocks yet)");
  }

  // Bytes of the widest dtype the kernel reads or writes.
  int64_t widest_dtype_bytes(const Kernel& k) const {
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
  std::string cuda_columns_nest(size_t index, const Shape& shape, Kernel& k, bool is_last,
                                KernelNest& nest, const ReductionSchedule& schedule,
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
    src += "  [[maybe_unused]] const int column_lane = static_cast<int>(threadIdx.x) / " + tile +
           ";\n";
    src +=
        "  for (I tile = static_cast<I>(blockIdx.x); tile < tiles; tile += "
        "static_cast<I>(gridDim.x)) {\n";
    src +=
        "    const I column = tile * " + tile + " + static_cast<I>(threadIdx.x % " + tile + ");\n";
    src += "    const I lin = column < n ? column : n - 1;\n";
    src += decompose(shape, "    ") + indented(body.flat(), 2);
    src += "    if (column < n && column_lane == 0) {\n" + indented(body.stores, 3) + "    }\n";
    src += "  }\n}\n";
    *entries += cuda_entries(index, 's', nest.block_threads, name + "_columns");
    k.nests.push_back(std::move(nest));
    return src;
  }

  // The nest's device functions and their entries (appended to `entries`).
  std::string cuda_nest(size_t index, const Shape& shape, Kernel& k, bool is_last,
                        std::string* entries) {
    KernelNest nest;
    nest.shape = shape;
    nest.numel = shape_numel(shape);
    std::string name = "nest" + std::to_string(index);
    std::string decls = cuda_decls(k);
    std::string numel = std::to_string(nest.numel);

    NestBody scalar = emit_body(shape, k, is_last, NestMode::kFlat);
    if (row_reductions_ > 0) return cuda_rows_nest(index, shape, k, is_last, nest, entries);
    element_.numel = nest.numel;
    element_.widest = widest_dtype_bytes(k);
    const ReductionSchedule schedule = choose_reduction_schedule(element_, kCudaBlock);
    if (schedule.kind == ReductionSchedule::Kind::kRowPerElement) {
      Shape rows = shape;
      rows.push_back(1);
      return cuda_rows_nest(index, rows, k, is_last, nest, entries, /*unit_row=*/true);
    }
    if (schedule.kind == ReductionSchedule::Kind::kColumns)
      return cuda_columns_nest(index, shape, k, is_last, nest, schedule, entries);
    if (is_last) record_last_nest_loads(shape, k);
    std::string src = "template <class I>\n__device__ __forceinline__ void " + name +
                      "_scalar(const Args& a) {\n" + decls;
    src += "  const I n = static_cast<I>(" + numel + "LL);\n";
    src += "  const I step = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);\n";
    src +=
        "  for (I lin = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + "
        "static_cast<I>(threadIdx.x); lin < n; lin += step) {\n";
    src += decompose(shape, "    ") + indented(scalar.flat(), 2) + indented(scalar.stores, 2) +
           "  }\n}\n";

    // The vectorized variant: inputs read only at the iteration's own element load as vectors.
    std::string identity = index_key(loop_index(shape));
    Lanes lanes;
    int64_t widest = 0;
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      if (!k.inputs[i].is_tensor || raw_loads_[i] || loads_[i].empty()) continue;
      if (loads_[i].size() != 1 || *loads_[i].begin() != identity) continue;
      if (body_.inputs()[i]->tensor_type().shape != shape) continue;
      lanes.inputs.insert(i);
      widest = std::max<int64_t>(widest, dtype_size(body_.inputs()[i]->tensor_type().dtype));
    }
    std::vector<size_t> outs;
    for (size_t j = 0; j < k.outputs.size(); ++j)
      if (k.outputs[j].shape == shape) {
        outs.push_back(j);
        widest = std::max<int64_t>(widest, dtype_size(k.outputs[j].dtype));
      }
    int width = static_cast<int>(std::min<int64_t>(8, 16 / std::max<int64_t>(widest, 1)));
    std::string variants = "s";
    if (width > 1 && nest.numel >= width) {
      std::vector<std::vector<StorageWindow>> windows = windows_;
      std::vector<bool> whole = whole_storage_;
      NestBody lane = emit_body(shape, k, is_last, NestMode::kFlat, &lanes);
      windows_ = windows;
      whole_storage_ = whole;
      nest.vector_width = width;
      for (size_t i : lanes.inputs)
        nest.vector_inputs.push_back(static_cast<int>(i));
      for (size_t j : outs)
        nest.vector_outputs.push_back(static_cast<int>(j));
      std::string v = std::to_string(width);
      src += "template <class I>\n__device__ __forceinline__ void " + name +
             "_vector(const Args& a) {\n" + decls;
      src += "  const I n = static_cast<I>(" + numel + "LL);\n";
      src +=
          "  const I step = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x) * " + v + ";\n";
      src +=
          "  for (I base = (static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + "
          "static_cast<I>(threadIdx.x)) * " +
          v + "; base < n; base += step) {\n";
      src += "    if (base + " + v + " <= n) {\n";
      for (size_t i : lanes.inputs) {
        DType d = body_.inputs()[i]->tensor_type().dtype;
        std::string n = std::to_string(i), size = std::to_string(dtype_size(d));
        src +=
            "      alignas(16) " + std::string(storage_type(d)) + " lane_in" + n + "[" + v + "];\n";
        src += "      vector_load<" + std::to_string(dtype_size(d) * width) + ">(lane_in" + n +
               ", static_cast<const char*>(in" + n + ") + static_cast<int64_t>(o" + n +
               " + base) * " + size + ");\n";
      }
      for (size_t j : outs) {
        std::string n = std::to_string(j);
        src += "      alignas(16) " + std::string(storage_type(k.outputs[j].dtype)) + " lane_out" +
               n + "[" + v + "];\n";
      }
      src += "#pragma unroll\n      for (int l = 0; l < " + v + "; ++l) {\n";
      src += "        const I lin = base + l;\n" + decompose(shape, "        ");
      src += "        {\n" + indented(lane.flat(), 5) + indented(lane.stores, 5) +
             "        }\n      }\n";
      for (size_t j : outs) {
        DType d = k.outputs[j].dtype;
        std::string n = std::to_string(j), size = std::to_string(dtype_size(d));
        src += "      vector_store<" + std::to_string(dtype_size(d) * width) +
               ">(static_cast<char*>(out" + n + ") + static_cast<int64_t>(oo" + n + " + base) * " +
               size + ", lane_out" + n + ");\n";
      }
      src += "    } else {\n      for (I lin = base; lin < n; ++lin) {\n" +
             decompose(shape, "        ") + "        {\n" + indented(scalar.flat(), 5) +
             indented(scalar.stores, 5) + "        }\n      }\n    }\n  }\n}\n";
      variants += "v";
    }
    for (char variant : variants) {
      *entries +=
          cuda_entries(index, variant, kCudaBlock, name + (variant == 's' ? "_scalar" : "_vector"));
    }
    k.nests.push_back(std::move(nest));
    return src;
  }

  static IndexExpr mul(const IndexExpr& index, const std::string& stride) {
    if (index.is_zero()) return IndexExpr::number(0);
    std::string t = index.text;
    if (t.find_first_of(" */%+-") != std::string::npos) t = "(" + t + ")";
    return IndexExpr::var(t + "*" + stride);
  }

  std::string fresh(const char* prefix) { return prefix + std::to_string(next_++); }

  // ---- code placement ----------------------------------------------------------------------

  // The variable names in a piece of C++ text (number literals such as 0x1p+0 or 1LL hold none).
  static std::vector<std::string_view> variables_in(std::string_view text) {
    std::vector<std::string_view> names;
    size_t at = 0;
    while (at < text.size()) {
      char c = text[at];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = at;
        while (end < text.size() &&
               (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_'))
          ++end;
        names.push_back(text.substr(at, end - at));
        at = end;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        while (at < text.size() && (std::isalnum(static_cast<unsigned char>(text[at])) ||
                                    text[at] == '.' || text[at] == '_'))
          ++at;
      } else {
        ++at;
      }
    }
    return names;
  }
  // The level a piece of code belongs at: the innermost level of the variables it uses.
  int depth_of(std::string_view text) const {
    int depth = 0;
    for (std::string_view name : variables_in(text)) {
      auto it = level_of_.find(std::string(name));
      if (it != level_of_.end()) depth = std::max(depth, it->second);
    }
    return depth;
  }
  int depth_of(const Index& index) const {
    int depth = 0;
    for (const IndexExpr& e : index)
      depth = std::max(depth, depth_of(e.text));
    return depth;
  }
  // Appends a line at `level`; `defines` (if any) is the variable it declares. A region whose
  // code outgrows kMaxKernelSource (inlined views and scatters evaluated at many different
  // indices multiply: a chain of as_strided_scatters made 16 MB of C++ that took the compiler
  // minutes) is not lowered, and runs as a step without a kernel instead.
  void emit(int level, const std::string& line, const std::string& defines = "") {
    emitted_ += line.size() + 1;
    if (emitted_ > kMaxKernelSource)
      not_lowered("the kernel's source would exceed " + std::to_string(kMaxKernelSource >> 10) +
                  " KiB (values inlined at many indices)");
    levels_.at(static_cast<size_t>(level)) += line + "\n";
    if (!defines.empty()) level_of_[defines] = level;
  }
  // Ends the innermost level (a loop's body, opened with levels_.emplace_back()): returns its
  // code and forgets the values defined in it, which exist only inside the loop.
  std::string close_level(int level) {
    std::string body = levels_.back();
    levels_.pop_back();
    for (auto it = memo_.begin(); it != memo_.end();) {
      auto l = level_of_.find(it->second.expr);
      it = l != level_of_.end() && l->second >= level ? memo_.erase(it) : std::next(it);
    }
    for (auto it = level_of_.begin(); it != level_of_.end();)
      it = it->second >= level ? level_of_.erase(it) : std::next(it);
    return body;
  }
  // Declares `name` = `expr` at the level `expr` needs.
  void declare(const std::string& type, const std::string& name, const std::string& expr) {
    emit(depth_of(expr), "[[maybe_unused]] const " + type + " " + name + " = " + expr + ";", name);
  }

  // Declares a new variable of v's register type.
  Val define(DType dtype, const std::string& expr) {
    Val v{fresh("v"), dtype};
    declare(reg(dtype), v.expr, expr);
    return v;
  }
  // The register type of a dtype's values (cpu_prelude.h, cuda_prelude.cuh): float64 in double,
  // the other floating dtypes in float (every value held is exactly one of the dtype's), at twice
  // the vector width of double (bf16 x.abs() was 4x eager's time). What an op computes in is
  // compute_reg's choice.
  std::string reg(DType d) const {
    if (!is_floating(d)) return "int64_t";
    if (d == DType::kFloat64) return "double";
    return "float";
  }
  // The type an op computes a value of dtype d in, where its result is rounded to d once: on the
  // CPU float32 in double (libm's double functions are nearer eager's than the float ones, and
  // `a + alpha * b` rounds once, as the interpreter does), except the ops that are one correctly
  // rounded float operation (single_rounding_op), which give the same float either way at twice
  // the vector width: a bf16 batch norm upcast to float32 ran at half eager's speed.
  std::string compute_reg(DType d) const {
    return target_ == Target::kCpu && d == DType::kFloat32 ? "double" : reg(d);
  }
  static bool single_rounding_op(const Node& node, int rounding) {
    auto unit_alpha = [&] {
      const Operand& a = node.arg("alpha");
      if (!a.is_constant()) return false;
      if (const auto* i = std::get_if<int64_t>(&a.constant())) return *i == 1;
      if (const auto* d = std::get_if<double>(&a.constant())) return *d == 1.0;
      return false;
    };
    switch (node.id()) {
      case OpId::kAdd:
      case OpId::kSub:
        return unit_alpha();
      case OpId::kDiv:
        return rounding == 0;
      case OpId::kMul:
      case OpId::kNeg:
      case OpId::kAbs:
      case OpId::kRelu:
      case OpId::kSqrt:
      case OpId::kMaximum:
      case OpId::kMinimum:
      case OpId::kClamp:
      case OpId::kWhere:
      case OpId::kEq:
      case OpId::kNe:
      case OpId::kLt:
      case OpId::kLe:
      case OpId::kGt:
      case OpId::kGe:
      case OpId::kCopy:
      case OpId::kTo:
        return true;
      default:
        return false;
    }
  }

  // ---- values ------------------------------------------------------------------------------

  // The node that computes `v`: its producer, or for a decomposed op the subsymbol that does.
  static const Node* defining_node(const Value* v) {
    const Node* p = v->producer();
    while (p && !p->subsymbols.empty()) {
      const Node* found = nullptr;
      for (const auto& s : p->subsymbols)
        if (std::find(s->outputs.begin(), s->outputs.end(), v) != s->outputs.end()) found = s.get();
      if (!found) not_lowered(p->op->name + ": a decomposition that does not define its output");
      p = found;
    }
    return p;
  }

  Val eval(const Value* v, const Index& at) {
    // A value used only under a scatter's condition is kept apart from the same value used
    // unconditionally, so that every unconditional load is seen as one (record_last_nest_loads).
    std::string key =
        std::to_string(v->id()) + "@" + index_key(at) + (guard_depth_ > 0 ? "|guarded" : "");
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    Val r = compute(v, at);
    memo_[key] = r;
    return r;
  }

  Val compute(const Value* v, const Index& at) {
    if (!v->is_tensor()) not_lowered("a number used as a tensor");
    if (auto table = table_name_.find(v); table != table_name_.end())
      return define(v->tensor_type().dtype, table->second + "[" + table_position(v, at) + "]");
    auto in = input_index_.find(v);
    if (in != input_index_.end()) return load(in->second, at);
    const Node* node = defining_node(v);
    KILN_ASSERT(node) << "'" << v->name() << "' has no producer and is not a region input";
    const OpInfo& op = *node->op;
    size_t output = 0;
    while (node->outputs[output] != v)
      ++output;
    switch (op.kind) {
      case OpKind::kView: {
        if (node->id() == OpId::kAsStrided) return as_strided(*node, at);
        std::optional<Index> from = view_source_index(*node, output, at);
        if (!from) not_lowered(op.name + ": this view is not lowered yet");
        return eval(node->input(0), *from);
      }
      case OpKind::kElementwise:
        return elementwise(*node, at);
      case OpKind::kCreation:
        return creation(*node, at);
      case OpKind::kScatter:
        return scatter(*node, at);
      case OpKind::kIndex:
        return indexed(*node, at);
      case OpKind::kReduction:
        return reduction(*node, at);
      case OpKind::kJoin:
        return join(*node, at);
      case OpKind::kOpaque:
        not_lowered(op.name + ": an opaque op runs on its own");
      default:
        not_lowered(op.name + ": " + std::string(op_kind_name(op.kind)) + " ops are not lowered");
    }
  }

  Val load(size_t k, const Index& at) {
    const TensorType& t = body_.inputs()[k]->tensor_type();
    std::string n = std::to_string(k);
    IndexExpr address = IndexExpr::var("o" + n);
    for (size_t d = 0; d < at.size(); ++d)
      address = address + mul(at[d], "s" + n + "_" + std::to_string(d));
    std::string key = index_key(at);
    loads_[k].insert(key);
    if (row_pass_depth_ == 0) loads_outside_row_passes_[k].insert(key);
    if (guard_depth_ > 0)
      guarded_loads_[k] = true;
    else
      unguarded_loads_[k].insert(key);
    if (lanes_ && lanes_->inputs.contains(k)) {
      KILN_ASSERT(key == index_key(loop_index(body_.inputs()[k]->tensor_type().shape)))
          << "a vector input loaded away from its element";
      return define(t.dtype, "ld_" + suffix(t.dtype) + "(lane_in" + n + ", l)");
    }
    if (std::optional<Val> cached = row_cached_load(k, at)) return *cached;
    return define(t.dtype, "ld_" + suffix(t.dtype) + "(in" + n + ", " + address.text + ")");
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
  std::optional<Val> row_cached_load(size_t k, const Index& at) {
    if (mode_ != NestMode::kRows || at.empty()) return std::nullopt;
    auto position = row_positions_.find(at.back().text);
    if (position == row_positions_.end()) return std::nullopt;
    const TensorType& t = body_.inputs()[k]->tensor_type();
    const int64_t count = position->second.count;
    const int64_t per = int64_t{row_threads_} * row_lanes(count);  // elements a trip takes
    const int64_t trips = (count + per - 1) / per;
    if (trips > kRowCacheTrips || !inside_shape(at, t.shape)) return std::nullopt;
    Index prefix(at.begin(), at.end() - 1);
    for (const IndexExpr& e : prefix)
      if (!uses_only_row_indices(e.text)) return std::nullopt;
    std::string key = std::to_string(k) + "@" + index_key(prefix) + "#" + std::to_string(count);
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
      std::string array = fresh("rc"), n = std::to_string(k), trip = array + "_t", j = array + "_j",
                  last = "s" + n + "_" + std::to_string(at.size() - 1);
      IndexExpr base = IndexExpr::var("o" + n);
      for (size_t d = 0; d + 1 < at.size(); ++d)
        base = base + mul(at[d], "s" + n + "_" + std::to_string(d));
      auto scalar = [&](const std::string& position) {
        std::string address = base.text + " + " + position + "*" + last;
        if (as_stored) return "static_cast<const " + type + "*>(in" + n + ")[" + address + "]";
        return "ld_" + suffix(t.dtype) + "(in" + n + ", " + address + ")";
      };
      std::string first = "static_cast<I>(" + row_thread() + ") + static_cast<I>(" + trip + ") * " +
                          std::to_string(row_threads_);
      std::string loop = "#pragma unroll\nfor (int " + trip + " = 0; " + trip + " < " +
                         std::to_string(trips) + "; ++" + trip + ") {\n";
      std::string fill = "alignas(16) " + type + " " + array + "[" + std::to_string(slots) + "];\n";
      if (lanes == 1) {
        std::string element = scalar(j);
        if (count % row_threads_ != 0)
          element = j + " < " + std::to_string(count) + " ? " + element + " : " + type + "(0)";
        fill += loop + "  const I " + j + " = " + first + ";\n  " + array + "[" + trip +
                "] = " + element + ";\n}\n";
      } else {  // V neighbours: one vector load where the row is contiguous and aligned
        std::string v = std::to_string(lanes), size = std::to_string(dtype_size(t.dtype));
        std::string slot = array + "[" + trip + " * " + v + " + l]";
        std::string vector = "vector_load<" + std::to_string(dtype_size(t.dtype) * lanes) + ">(";
        std::string from = "static_cast<const char*>(in" + n + ") + static_cast<int64_t>(" +
                           base.text + " + (" + first + ") * " + v + ") * " + size + ");\n";
        fill += "if (" + last + " == 1 && (" + base.text + ") % " + v +
                " == 0 && reinterpret_cast<uint64_t>(in" + n + ") % 16 == 0) {\n" + loop;
        if (as_stored) {
          fill += "  " + vector + "&" + array + "[" + trip + " * " + v + "], " + from;
        } else {
          fill += "  alignas(16) " + std::string(storage_type(t.dtype)) + " raw[" + v + "];\n  " +
                  vector + "raw, " + from + "#pragma unroll\n  for (int l = 0; l < " + v +
                  "; ++l) " + slot + " = ld_" + suffix(t.dtype) + "(raw, l);\n";
        }
        fill += "}\n} else {\n" + loop + "#pragma unroll\n  for (int l = 0; l < " + v + "; ++l) " +
                slot + " = " + scalar("((" + first + ") * " + v + " + l)") + ";\n}\n}\n";
      }
      row_fills_ += fill;
      cache = row_caches_.emplace(key, RowCache{array, as_stored}).first;
    }
    const RowCache& c = cache->second;
    std::string slot = c.array + "[" + position->second.trip + "]";
    if (c.as_stored)
      slot = "ld_" + suffix(t.dtype) + "(" + c.array + ", " + position->second.trip + ")";
    return define(t.dtype, slot);
  }
  // Whether `text` names no variable but the row nest's row indices i0 ... i<rank - 2> (which
  // decompose declares before any level's code, where the row cache is filled).
  bool uses_only_row_indices(const std::string& text) const {
    for (std::string_view name : variables_in(text)) {
      if (name.size() < 2 || name[0] != 'i' ||
          !std::all_of(name.begin() + 1, name.end(), [](char d) { return std::isdigit(d); }) ||
          std::stoll(std::string(name.substr(1))) + 1 >= nest_rank_)
        return false;
    }
    return true;
  }

  // as_strided reads its input's storage: storage_offset + sum(index * stride). Of a region input
  // the kernel reads that storage itself (the executor checks the window is inside it); of a
  // computed 1-D value that is a whole storage of its own, the value at that position.
  Val as_strided(const Node& node, const Index& at) {
    const Value* src = node.input(0);
    const IntList& sizes = node.arg("size").as_ints();
    const IntList& strides = node.arg("stride").as_ints();
    std::optional<int64_t> offset = node.arg("storage_offset").as_optional_int();
    auto in = input_index_.find(src);
    if (in == input_index_.end()) {
      if (src->tensor_type().rank() != 1)
        not_lowered("as_strided: of a computed value that is not 1-D");
      require_whole_storage(src);
      Geometry window{Shape(sizes.begin(), sizes.end()), Strides(strides.begin(), strides.end()),
                      offset.value_or(0)};
      if (!inside(window, src->tensor_type().numel()))
        not_lowered("as_strided: a window outside its storage (the interpreter raises)");
      IndexExpr position = IndexExpr::number(window.offset);
      for (size_t d = 0; d < at.size(); ++d)
        position = position + at[d] * strides[d];
      return eval(src, {position});
    }
    size_t k = in->second;
    windows_[k].push_back(StorageWindow{Shape(sizes.begin(), sizes.end()),
                                        Strides(strides.begin(), strides.end()), offset});
    raw_loads_[k] = true;
    std::string n = std::to_string(k);
    IndexExpr address = offset ? IndexExpr::number(*offset) : IndexExpr::var("o" + n);
    for (size_t d = 0; d < at.size(); ++d)
      address = address + at[d] * strides[d];
    DType dtype = src->tensor_type().dtype;
    return define(dtype, "ld_" + suffix(dtype) + "(in" + n + ", " + address.text + ")");
  }

  static bool inside(const Geometry& window, int64_t storage_numel) {
    if (window.offset < 0) return false;
    for (int64_t st : window.strides)
      if (st < 0) return false;
    return required_storage_numel(window) <= storage_numel;
  }

  // `v` (1-D) is indexed as a storage by as_strided(_scatter): position p must be element p,
  // which holds when the interpreter would have made `v` as a whole storage of its own, dense
  // from offset 0. Elementwise results and creations are fresh dense tensors (but `to` the same
  // dtype returns its input), a scatter keeps its input's storage, and for a region input the
  // executor checks it at run time.
  void require_whole_storage(const Value* v) {
    auto in = input_index_.find(v);
    if (in != input_index_.end()) {
      whole_storage_[in->second] = true;
      return;
    }
    const Node* node = defining_node(v);
    KILN_ASSERT(node) << "'" << v->name() << "' has no producer";
    switch (node->op->kind) {
      case OpKind::kElementwise:
        if (node->op->functional_form == OpId::kTo &&
            node->input(0)->tensor_type().dtype == v->tensor_type().dtype)
          return require_whole_storage(node->input(0));
        return;
      case OpKind::kCreation:
        return;
      case OpKind::kScatter:
        return require_whole_storage(node->input(0));
      default:
        not_lowered("as_strided: of a " + node->op->name + " result, which may be a view");
    }
  }

  // A number operand (constant or number input).
  Number number(const Operand& o) {
    Number n;
    if (o.is_value()) {
      const Value* v = o.value();
      auto in = input_index_.find(v);
      if (v->is_tensor() || in == input_index_.end()) not_lowered("a number that is not an input");
      std::string k = std::to_string(in->second);
      n.as_double = "sd[" + k + "]";
      n.as_int = "si[" + k + "]";
      n.is_float = v->scalar_type().kind == ScalarKind::kFloat;
      return n;
    }
    const Constant& c = o.constant();
    if (const bool* b = std::get_if<bool>(&c)) {
      n.as_double = *b ? "1.0" : "0.0";
      n.as_int = *b ? "1LL" : "0LL";
    } else if (const int64_t* i = std::get_if<int64_t>(&c)) {
      n.as_double = double_literal(static_cast<double>(*i));
      n.as_int = int_literal(*i);
    } else if (const double* d = std::get_if<double>(&c)) {
      n.as_double = double_literal(*d);
      n.as_int = int_literal(float_to_int<int64_t>(*d));
      n.is_float = true;
    } else {
      not_lowered("a constant that is not a number: " + constant_str(c));
    }
    return n;
  }

  // The scalar kind of a number operand, as the interpreter sees it (RtScalar's alternative).
  static bool number_is_bool(const Operand& o) {
    if (o.is_value()) return o.value()->scalar_type().kind == ScalarKind::kBool;
    return std::holds_alternative<bool>(o.constant());
  }

  // store_scalar: a Python float is stored as a double, anything else as an int64.
  static std::string store_number(const Number& n, DType out) {
    return n.is_float ? "f_" + suffix(out) + "(" + n.as_double + ")"
                      : "i_" + suffix(out) + "(" + n.as_int + ")";
  }

  // A held value converted as copy_element converts into `out` (bytes kept for equal dtypes).
  static std::string copy_convert(const Val& v, DType out) {
    if (v.dtype == out) return v.expr;
    return v.floating() ? "f_" + suffix(out) + "(" + v.expr + ")"
                        : "i_" + suffix(out) + "(" + v.expr + ")";
  }

  // pow with these constant exponents as PyTorch's pow_tensor_scalar computes them (a product,
  // sqrt, a reciprocal), not through powf: rms norm's x.pow(2) spent most of its kernel in powf.
  static std::optional<std::string> pow_by_constant(const Operand& exponent) {
    if (exponent.is_value() || exponent.is_none()) return std::nullopt;
    double e = 0;
    if (const double* d = std::get_if<double>(&exponent.constant()))
      e = *d;
    else if (const int64_t* i = std::get_if<int64_t>(&exponent.constant()))
      e = static_cast<double>(*i);
    else
      return std::nullopt;
    if (e == 2) return "a * a";
    if (e == 3) return "a * a * a";
    if (e == 0.5) return "std::sqrt(a)";
    if (e == -0.5) return "K(1) / std::sqrt(a)";
    if (e == -1) return "K(1) / a";
    if (e == -2) return "K(1) / (a * a)";
    return std::nullopt;
  }

  Val elementwise(const Node& node, const Index& at) {
    const OpInfo& op = *node.op;
    if (op.is_inplace_elementwise()) not_lowered(op.name + ": an in-place op in a region");
    const OpId fid = op.functional_form;
    ElementwiseTyping typing = elementwise_typing(op, node.operands);
    const bool fl = is_floating(typing.compute);
    if (!fl &&
        (fid == OpId::kDiv || fid == OpId::kRemainder || fid == OpId::kFmod || fid == OpId::kPow)) {
      not_lowered(op.name + ": integer " + op_info(fid).name +
                  " can raise (division by zero, negative powers); the interpreter runs it");
    }
    std::string expr = fl ? expr_text(fid).f : expr_text(fid).i;
    if (fid == OpId::kPow && fl) expr = pow_by_constant(node.arg(1)).value_or(expr);
    if (expr.starts_with("KILN_NO_"))
      not_lowered(op.name + ": no " + (fl ? "floating" : "integer") + " math for its dtypes");

    // ElementwiseParams as the interpreter's make_params fills it, with its argument checks
    // decided here: a region the interpreter would reject is left to the interpreter.
    std::string alpha = "1.0", alpha_i = "1LL", value = "1.0", value_i = "1LL";
    int rounding = 0;
    bool approximate_tanh = false;
    if (int i = op.param_index("alpha"); i >= 0) {
      const Operand& a = node.arg(static_cast<size_t>(i));
      Number n = number(a);
      if (number_is_bool(a) && typing.compute != DType::kBool)
        not_lowered(op.name + ": a bool alpha raises for non-bool results");
      if (!fl && n.is_float) not_lowered(op.name + ": a float alpha raises for integer inputs");
      // in the dtype eager's kernel takes a number of the op in (number_operand_dtype): float
      // for float32, bf16 for a CPU bf16 add
      alpha =
          fl && typing.compute != DType::kFloat64
              ? "f_" + suffix(number_operand_dtype(fid, typing.compute, target_ == Target::kCuda)) +
                    "(" + n.as_double + ")"
              : n.as_double;
      alpha_i = n.as_int;
    }
    if (int i = op.param_index("value"); i >= 0 && op.arity == 3) {
      Number n = number(node.arg(static_cast<size_t>(i)));
      value = fl && typing.compute != DType::kFloat64 ? "f_f32(" + n.as_double + ")" : n.as_double;
      value_i = n.as_int;
    }
    if (int i = op.param_index("rounding_mode"); i >= 0) {
      const Operand& mode = node.arg(static_cast<size_t>(i));
      rounding = mode.is_none() ? 0 : mode.as_string() == "trunc" ? 1 : 2;
    }
    if (int i = op.param_index("approximate"); i >= 0) {
      const std::string& a = node.arg(static_cast<size_t>(i)).as_string();
      if (a != "none" && a != "tanh") not_lowered(op.name + ": approximate='" + a + "' raises");
      approximate_tanh = a == "tanh";
    }
    bool has_b = true, has_c = true;
    if (op.dtype_rule == DTypeRule::kClamp) {
      has_b = !node.arg(1).is_none();
      has_c = !node.arg(2).is_none();
    }
    auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
    const std::string K = !fl                                  ? reg(DType::kFloat64)
                          : single_rounding_op(node, rounding) ? reg(typing.compute)
                                                               : compute_reg(typing.compute);
    std::string params =
        "const ElementwiseParamsOf<K> p{.alpha = K(" + alpha + "), .alpha_i = " + alpha_i +
        ", .value = K(" + value + "), .value_i = " + value_i +
        ", .rounding = " + std::to_string(rounding) +
        ", .approximate_tanh = " + flag(approximate_tanh) + ", .has_b = " + flag(has_b) +
        ", .has_c = " + flag(has_c) + ", .bool_compute = " + flag(typing.compute == DType::kBool) +
        ", .single_precision = " + flag(fl && typing.compute != DType::kFloat64) + "};";

    // The operands, converted to the compute dtype (where's condition is not); Python numbers to
    // the dtype eager's kernel takes them in (number_operand_dtype: float in a bf16 product).
    const std::string c = suffix(typing.compute);
    const std::string number_suffix =
        suffix(number_operand_dtype(fid, typing.compute, target_ == Target::kCuda));
    const bool reciprocal = target_ == Target::kCuda && fl &&
                            cuda_divides_by_reciprocal(fid, rounding) && op.arity >= 2 &&
                            !(node.arg(1).is_value() && node.arg(1).value()->is_tensor());
    std::vector<std::string> operands;
    std::string integer_condition;  // where's condition, when it is held apart (below)
    // The broadcast operands that hold a reduction (a row's statistic) first: its pass runs
    // before the other operands are computed at the element, so a CPU row pass can keep what
    // they share (keep_in_row_buffer: softmax's exp(x - max) divided by its sum). Values are
    // memoized: the loop below finds them.
    if (target_ == Target::kCpu)
      for (int i = 0; i < op.arity; ++i)
        if (const Operand& o = node.arg(static_cast<size_t>(i));
            o.is_value() && o.value()->is_tensor() &&
            o.value()->tensor_type().numel() < node.outputs[0]->tensor_type().numel() &&
            holds_reduction(o.value()))
          eval(o.value(), broadcast_index(at, o.value()->tensor_type().shape));
    for (int i = 0; i < op.arity; ++i) {
      const Operand& o = node.arg(static_cast<size_t>(i));
      bool convert = !(op.dtype_rule == DTypeRule::kWhere && i == 0);
      if (o.is_none()) {
        operands.push_back(fl ? "0.0" : "0LL");  // an absent clamp bound, never read
      } else if (o.is_value() && o.value()->is_tensor()) {
        Val v = eval(o.value(), broadcast_index(at, o.value()->tensor_type().shape));
        if (!convert && fl && !is_floating(v.dtype)) {
          // where's bool condition stays an integer: through a floating conversion a float32
          // where inside an H200 reduction loop lost elements, and the integer test is what
          // the expression means anyway.
          integer_condition = "as_i(" + v.expr + ")";
          operands.emplace_back();
          continue;
        }
        std::string held = fl ? "as_f(" + v.expr + ")" : "as_i(" + v.expr + ")";
        if (convert && v.dtype == typing.compute) {
          // Already exact in the compute dtype, in its register type: rounding it again would
          // change nothing and costs a conversion per operand (bf16: the F2F unit's 16 per
          // clock, which bounded S1 at 2^26 more than memory did).
          operands.push_back(v.expr);
        } else {
          operands.push_back(convert ? (fl ? "f_" : "i_") + c + "(" + held + ")" : held);
        }
      } else if (fl && i == 1 && reciprocal) {
        // eager's CUDA division by a number: a * (1 / s), the reciprocal in the math type
        Number n = number(o);
        operands.push_back(typing.compute == DType::kFloat64
                               ? "(1.0 / (" + n.as_double + "))"
                               : "f_f32(1.0 / (" + n.as_double + "))");
      } else {
        Number n = number(o);
        operands.push_back(fl ? "f_" + number_suffix + "(" + n.as_double + ")"
                              : "i_" + c + "(" + n.as_int + ")");
      }
    }
    if (reciprocal) expr = "a * b";
    // eager's CUDA add and sub compute a + alpha * b as one fused multiply-add (nvcc contracts
    // it); kiln's kernels do not contract (kNvrtcMathOption), so it is written out.
    if (target_ == Target::kCuda && fl && (fid == OpId::kAdd || fid == OpId::kSub))
      expr = fid == OpId::kAdd ? "fma(p.alpha, b, a)" : "fma(-p.alpha, b, a)";
    static const char* names[] = {"a", "b", "c"};
    std::string decl = std::string("[[maybe_unused]] ") + (fl ? "K" : "int64_t") + " ";
    size_t first = 0;
    if (!integer_condition.empty()) {
      decl = "[[maybe_unused]] const int64_t a = " + integer_condition + ";\n  " + decl;
      first = 1;
    }
    for (size_t i = first; i < operands.size(); ++i)
      decl += (i > first ? ", " : "") + std::string(names[i]) + " = " + operands[i];
    decl += ";";

    Val r{fresh("v"), typing.out};
    std::string result = fl ? "f_" + suffix(typing.out) + "(static_cast<K>(" + expr + "))"
                            : "i_" + suffix(typing.out) + "(static_cast<int64_t>(" + expr + "))";
    int level = std::max(depth_of(decl), depth_of(params));
    emit(level, reg(typing.out) + " " + r.expr + ";", r.expr);
    emit(level, "{  // " + op.name);
    emit(level, "  using K [[maybe_unused]] = " + K + ";");
    emit(level, "  [[maybe_unused]] " + params);
    emit(level, "  " + decl);
    emit(level, "  " + r.expr + " = " + result + ";");
    emit(level, "}");
    return r;
  }

  // ---- reductions ----------------------------------------------------------------------------

  // One output element of a reduction: a loop over the reduced elements (in row-major order of
  // the reduced dims, as the interpreter groups them), floats accumulated in double and integers
  // in wrapping int64, each element first converted to the output dtype. The loop sits at the
  // level of the output index, so a row statistic is computed once per row; in a CUDA row nest a
  // reduction at row level is split over the row's threads and combined with block_<op> or
  // warp_<op>.
  Val reduction(const Node& node, const Index& at) {
    const Value* self = node.input(0);
    const TensorType& in = self->tensor_type();
    DType out = node.outputs[0]->tensor_type().dtype;
    const OpId id = node.id();
    std::vector<int64_t> reduced = reduction_dims(node.arg(1).as_optional_ints(), in.rank());
    bool keepdim = node.arg("keepdim").as_bool();
    int64_t count = 1;
    for (int64_t d : reduced)
      count *= in.shape[static_cast<size_t>(d)];
    if (count == 0) not_lowered(node.op->name + ": a reduction over no elements");
    const bool arg = id == OpId::kArgmax || id == OpId::kArgmin;
    const DType held = arg ? in.dtype : out;  // the dtype the elements are compared or summed in
    const bool fl = is_floating(held);
    if (id == OpId::kMean && !fl) not_lowered("mean: of an integral dtype (eager raises)");
    if ((id == OpId::kVar || id == OpId::kStd) && !fl)
      not_lowered(node.op->name + ": of an integral dtype");

    const int depth = depth_of(at);
    // In a CUDA nest, a reduction below the last dim makes the nest a row nest (cuda_rows_nest).
    const bool row_level = depth < nest_rank_ || nest_rank_ == 0;
    if (row_level) {
      ++row_reductions_;
      row_reduce_count_ = std::max(row_reduce_count_, count);
    }
    ++reductions_;
    // At the nest's own element (not inside another reduction's pass): its threads may share it.
    const bool element_level = !row_level && depth == nest_rank_;
    if (element_level) {
      ++element_.count;
      element_.arg += arg ? 1 : 0;
      element_.inner = element_.inner ||
                       std::find(reduced.begin(), reduced.end(), in.rank() - 1) != reduced.end();
      element_.longest = std::max(element_.longest, count);
    }
    const bool cooperative = mode_ == NestMode::kRows && row_level && !arg;
    const bool columnar = mode_ == NestMode::kColumns && element_level && !arg;
    // A pass every load of which comes before any store of the row's elements: a CUDA row nest's
    // pass over the row ends at a barrier (block_<op>) or a warp's shuffles, which every thread of
    // the row reaches only after its loads; a CPU row's passes run before its last loop, in the
    // same thread.
    const bool before_row_stores =
        row_level && depth + 1 == nest_rank_ &&
        (cooperative || (mode_ == NestMode::kCpuLoops && target_ == Target::kCpu));

    // Sums and products accumulate in double, except CUDA's short reductions of float, half and
    // bfloat16, which accumulate in float as PyTorch's CUDA kernels do: a double accumulator costs
    // a float-to-double conversion per element (16 a clock per SM, the unit that also rounds to
    // bfloat16), which bounded the bf16 normalization at 2.6x its byte floor. Max and min are
    // exact in either.
    // A column nest's lane sums count / lanes of the elements before the lanes combine.
    const int64_t serial = columnar ? (count + column_lanes_ - 1) / column_lanes_ : count;
    const bool float_acc = target_ == Target::kCuda && fl && reg(held) == "float" &&
                           (id == OpId::kAmax || id == OpId::kAmin || serial <= 4096);
    const std::string acc_type = fl ? (float_acc ? "float" : "double") : "int64_t";
    // The type each element enters the accumulator in (red_<op> has float and double forms).
    const std::string element_type =
        fl && float_acc && id != OpId::kVar && id != OpId::kStd ? "float" : "double";

    // One pass over the reduced elements: `combine(x, rl)` is the line that takes in the element
    // x (converted), the rl-th of the group.
    using Combine = std::function<std::string(const std::string& x, const std::string& rl)>;
    const bool last_dim_reduced =
        std::find(reduced.begin(), reduced.end(), in.rank() - 1) != reduced.end();
    // The pass's variable along the last dim, when it reduces the last dim alone (set in pass).
    std::string last_dim_reduced_alone;
    // `simd`: on the CPU, the OpenMP reduction clauses ("reduction(+:acc3)") under which the
    // compiler may split the pass across vector lanes; empty for a pass whose order matters
    // (argmax).
    // `accs`: the pass's accumulators, declared at `depth` with their initial values.
    auto pass = [&](const Combine& combine, const std::string& simd,
                    const std::vector<Accumulator>& accs) {
      std::string rl = fresh("rl");
      const int level = static_cast<int>(levels_.size());
      levels_.emplace_back();
      level_of_[rl] = level;
      if (cooperative) {  // rl runs over the row's positions as block_loop(rl, count) does
        row_positions_[rl] = RowPosition{cache_slot(rl, row_lanes(count)), count};
        level_of_[rl + "_trip"] = level_of_[rl + "_lane"] = level;
      }
      Index index(static_cast<size_t>(in.rank()));
      std::string rest = rl;
      std::string same_as_rl;  // the reduced dim's variable, when it is rl itself
      size_t k = 0;
      for (int64_t d = 0; d < in.rank(); ++d) {
        if (std::find(reduced.begin(), reduced.end(), d) == reduced.end()) {
          index[static_cast<size_t>(d)] = at.at(k++);
        } else if (keepdim) {
          ++k;
        }
      }
      for (size_t r = reduced.size(); r-- > 0;) {
        int64_t d = reduced[r], size = in.shape[static_cast<size_t>(d)];
        if (size == 1) {
          index[static_cast<size_t>(d)] = IndexExpr::number(0);
          continue;
        }
        std::string var = fresh("rd");
        bool last_needed = true;
        for (size_t q = 0; q < r; ++q)
          if (in.shape[static_cast<size_t>(reduced[q])] != 1) last_needed = false;
        if (last_needed) {
          declare("int64_t", var, rest);
          if (rest == rl) same_as_rl = var;
          if (rest == rl && d == in.rank() - 1) last_dim_reduced_alone = var;
          if (auto p = row_positions_.find(rest); p != row_positions_.end())
            row_positions_[var] = p->second;  // the only reduced dim: var is rl
        } else {
          declare("int64_t", var, rest + " % " + std::to_string(size));
          std::string next = fresh("rq");
          declare("int64_t", next, rest + " / " + std::to_string(size));
          rest = next;
        }
        index[static_cast<size_t>(d)] = IndexExpr::bounded(var, 0, size - 1);
      }
      if (before_row_stores) ++row_pass_depth_;
      Val x = eval(self, index);
      if (target_ == Target::kCpu && before_row_stores && !last_dim_reduced_alone.empty())
        keep_in_row_buffer(self, x, index, level, depth, count);
      if (pass_stores_ && &node == pass_stores_->reduction) {
        // A row pass over the last dim alone, V neighbours a thread: the stores go out as vectors.
        const bool row_vectors = cooperative && reduced.size() == 1 && reduced[0] == in.rank() - 1;
        store_in_pass(level, index, row_vectors ? row_lanes(count) : 1, rl + "_lane", depth);
      }
      if (before_row_stores) --row_pass_depth_;
      std::string converted = arg || x.dtype == out
                                  ? x.expr  // already exact in `out`, in its register type
                                  : (fl ? "f_" + suffix(out) + "(as_f(" + x.expr + "))"
                                        : "i_" + suffix(out) + "(as_i(" + x.expr + "))");
      if (fl && !arg) converted = "static_cast<" + element_type + ">(" + converted + ")";
      emit(level, combine(converted, rl));
      std::string body = close_level(level);
      std::string n = std::to_string(count);
      if (cooperative) {
        BlockLoop loop = block_loop(rl, "int64_t", count);
        levels_.at(static_cast<size_t>(depth)) += indented(loop.open + body + loop.close, 0);
      } else if (columnar) {  // this thread's lane takes every column_lanes_-th element
        emit(depth, "#pragma unroll 4");
        emit(depth, "for (int64_t " + rl + " = column_lane; " + rl + " < " + n + "; " + rl +
                        " += " + std::to_string(column_lanes_) + ") {");
        levels_.at(static_cast<size_t>(depth)) += indented(body, 1);
        emit(depth, "}");
      } else {
        int64_t runs = 1;  // the nest iterations this pass runs in: the loops outside `depth`
        for (int d = 0; d < depth && d < static_cast<int>(nest_shape_.size()); ++d)
          runs *= nest_shape_[static_cast<size_t>(d)];
        pass_iterations_ += runs * count;
        if (std::optional<std::string> element =
                column_block_fits(body, depth, last_dim_reduced, accs)) {
          cpu_column_block(rl, count, body, accs, *element);
          for (const Accumulator& a : accs)
            emit(depth,
                 a.name + " = " + a.name + "_b[i" + std::to_string(nest_rank_ - 1) + " - cb];");
          return;
        }
        if (target_ == Target::kCpu && pass_stores_ && &node == pass_stores_->reduction &&
            !pass_stores_->along_last_dim)
          throw PassOutsideColumnBlock{};
        // A pass outside the nest's loops (a full reduction) is shared by the cores when long.
        // One loop per piece between the pass's guards' bounds (pieces_between_cuts).
        std::vector<int64_t> pieces = target_ == Target::kCpu
                                          ? pieces_between_cuts(same_as_rl, count)
                                          : std::vector<int64_t>{0, count};
        for (size_t piece = 0; piece + 1 < pieces.size(); ++piece) {
          if (target_ == Target::kCpu && !simd.empty())
            emit(depth, std::string(depth == 0 && count >= kParallelIterations
                                        ? "#pragma omp parallel for simd "
                                        : "#pragma omp simd ") +
                            simd);
          emit(depth, "for (int64_t " + rl + " = " + std::to_string(pieces[piece]) + "; " + rl +
                          " < " + std::to_string(pieces[piece + 1]) + "; ++" + rl + ") {");
          levels_.at(static_cast<size_t>(depth)) += indented(body, 1);
          emit(depth, "}");
        }
      }
    };

    // The line that combines the threads' partial results `a` of a shared reduction, if any.
    auto combine = [&](const std::string& a, const std::string& op) {
      if (cooperative) emit(depth, a + " = " + row_combine(op) + "(" + a + ");");
      if (columnar)
        emit(depth, a + " = column_" + op + "<" + std::to_string(column_tile_) + ", " +
                        std::to_string(column_lanes_) + ">(" + a + ");");
    };
    std::string acc = fresh("acc");
    auto finish = [&](const std::string& op) { combine(acc, op); };
    std::string result;
    switch (id) {
      case OpId::kSum:
      case OpId::kMean:
      case OpId::kProd: {
        bool prod = id == OpId::kProd;
        const char* op = prod ? "prod" : "sum";
        emit(depth, acc_type + " " + acc + " = " + (prod ? "1" : "0") + ";", acc);
        pass([&](const std::string& x,
                 const std::string&) { return acc + " = red_" + op + "(" + acc + ", " + x + ");"; },
             std::string(prod ? "reduction(*:" : "reduction(+:") + acc + ")",
             {{acc, acc_type, prod ? "1" : "0"}});
        finish(op);
        if (id == OpId::kMean)
          result = "f_" + suffix(out) + "(" + acc + " / " + std::to_string(count) + ".0)";
        else
          result = (fl ? "f_" : "i_") + suffix(out) + "(" + acc + ")";
        break;
      }
      case OpId::kAmax:
      case OpId::kAmin: {
        bool max = id == OpId::kAmax;
        const char* op = max ? "max" : "min";
        std::string init = fl ? (max ? "-kernel_infinity()" : "kernel_infinity()")
                              : (max ? int_literal(INT64_MIN) : int_literal(INT64_MAX));
        emit(depth, acc_type + " " + acc + " = " + init + ";", acc);
        if (fl && target_ == Target::kCpu) {
          // OpenMP's max or min (which need not keep a NaN) and a flag of the NaNs seen, so that
          // the pass vectorizes: red_max's NaN tests kept GCC from it (a full amax of 2^16
          // floats took 95 us instead of 16).
          std::string nan = fresh("nan");
          emit(depth, "int64_t " + nan + " = 0;", nan);
          pass(
              [&](const std::string& x, const std::string&) {
                return acc + " = " + x + (max ? " > " : " < ") + acc + " ? " + x + " : " + acc +
                       "; " + nan + " |= " + x + " != " + x + ";";
              },
              "reduction(" + std::string(op) + ":" + acc + ") reduction(|:" + nan + ")",
              {{acc, acc_type, init}, {nan, "int64_t", "0"}});
          result = "f_" + suffix(out) + "(" + nan + " ? __builtin_nan(\"\") : " + acc + ")";
          break;
        }
        pass([&](const std::string& x,
                 const std::string&) { return acc + " = red_" + op + "(" + acc + ", " + x + ");"; },
             "reduction(" + std::string(op) + ":" + acc + ")", {{acc, acc_type, init}});
        finish(op);
        result = (fl ? "f_" : "i_") + suffix(out) + "(" + acc + ")";
        break;
      }
      case OpId::kVar:
      case OpId::kStd: {
        Number correction = number(node.arg("correction"));
        emit(depth, "double " + acc + " = 0;", acc);
        pass([&](const std::string& x,
                 const std::string&) { return acc + " = red_sum(" + acc + ", " + x + ");"; },
             "reduction(+:" + acc + ")", {{acc, "double", "0"}});
        finish("sum");
        std::string mean = fresh("mean");
        declare("double", mean, acc + " / " + std::to_string(count) + ".0");
        std::string m2 = fresh("acc");
        emit(depth, "double " + m2 + " = 0;", m2);
        pass(
            [&](const std::string& x, const std::string&) {
              std::string dev = "(" + x + " - " + mean + ")";
              return m2 + " = red_sum(" + m2 + ", " + dev + " * " + dev + ");";
            },
            "reduction(+:" + m2 + ")", {{m2, "double", "0"}});
        combine(m2, "sum");
        // max(N - correction, 0), as a variable: a constant 0 would be a division-by-zero warning.
        std::string divisor = fresh("n");
        std::string excess = "(" + std::to_string(count) + ".0 - " + correction.as_double + ")";
        declare("double", divisor, excess + " > 0 ? " + excess + " : 0.0");
        std::string variance = m2 + " / " + divisor;
        result = "f_" + suffix(out) + "(" +
                 (id == OpId::kStd ? "std::sqrt(" + variance + ")" : variance) + ")";
        break;
      }
      case OpId::kArgmax:
      case OpId::kArgmin: {
        // The first index of the extreme; a NaN is more extreme than anything (the first NaN).
        std::string best = fresh("best"), at_best = fresh("ib");
        const char* better = id == OpId::kArgmax ? " > " : " < ";
        emit(depth, acc_type + " " + best + " = 0;", best);
        emit(depth, "int64_t " + at_best + " = -1;", at_best);
        pass(
            [&](const std::string& xv, const std::string& rl) {
              std::string take = fl ? "(" + at_best + " < 0 || (!(" + best + " != " + best +
                                          ") && (" + xv + " != " + xv + " || " + xv + better +
                                          best + ")))"
                                    : "(" + at_best + " < 0 || " + xv + better + best + ")";
              return "if " + take + " { " + best + " = " + xv + "; " + at_best + " = " + rl + "; }";
            },
            "", {{best, acc_type, "0"}, {at_best, "int64_t", "-1"}});
        result = at_best;
        break;
      }
      default:
        not_lowered(node.op->name + ": this reduction is not lowered");
    }
    return define(out, result);
  }

  // A CPU row pass's value `x` of `v` at `index` (the row's indices, then the pass's variable
  // along the last dim), kept in a buffer of the row as the pass computes it, so that the row's
  // elements read it back instead of computing it again: softmax's exp(x - max), summed in the
  // pass, then divided by the sum, computed each exp (in double: compute_reg) twice. Not for a
  // value that is a load (a second load costs what the buffer would), nor a row longer than
  // kMaxRowBuffer.
  void keep_in_row_buffer(const Value* v, const Val& x, const Index& index, int level, int depth,
                          int64_t count) {
    const Node* node = defining_node(v);
    if (!node || node->op->kind == OpKind::kView || count > kMaxRowBuffer) return;
    if (v->tensor_type().shape != nest_shape_) return;
    Index element = index;
    element.back() = IndexExpr::var("i" + std::to_string(nest_rank_ - 1));
    const Index loop = loop_index(nest_shape_);
    if (index_key(element) != index_key(loop)) return;
    const std::string key = std::to_string(v->id()) + "@" + index_key(loop);
    if (guard_depth_ > 0 || memo_.contains(key)) return;
    const std::string buffer = fresh("row_buffer");
    emit(depth, "alignas(64) " + reg(x.dtype) + " " + buffer + "[" + std::to_string(count) + "];");
    emit(level, buffer + "[" + index.back().text + "] = " + x.expr + ";");
    memo_[key] = Val{buffer + "[" + loop.back().text + "]", x.dtype};
  }

  // Whether v is a reduction of the region or computed from one.
  bool holds_reduction(const Value* v) {
    if (auto it = holds_reduction_.find(v); it != holds_reduction_.end()) return it->second;
    const Node* node = defining_node(v);
    bool holds = false;
    if (node) {
      holds = node->op->kind == OpKind::kReduction;
      for (const Operand& o : node->operands)
        holds = holds || (o.is_value() && o.value()->is_tensor() && holds_reduction(o.value()));
    }
    return holds_reduction_[v] = holds;
  }

  // A guard that compares the loop variable `x` with `at` (a slice_scatter's, select_scatter's or
  // cat's bounds): a CPU pass over x may run as one loop per piece between such bounds.
  void note_cut(const IndexExpr& x, int64_t at) {
    const std::vector<std::string_view> names = variables_in(x.text);
    if (names.size() == 1 && names[0] == x.text) cuts_[x.text].insert(at);
  }

  // The bounds of the pieces of a CPU pass over [0, count) whose variable `var` its guards
  // compare with constants (note_cut): {0, cut, ..., count}. In each piece the compiler knows
  // every guard's value from the loop's bounds, so the selects fold and the loop is a plain
  // vector loop. In one loop, x[:, :2048].clamp_(-1, 1) before x.sum(-1) loaded the clamped
  // half at `c ? rd : 0`, a masked gather GCC did not vectorize: the row sum of 1024 x 4096
  // floats took 3.3 ms against eager's 0.34. At most kMaxPassPieces pieces (the body is repeated).
  std::vector<int64_t> pieces_between_cuts(const std::string& var, int64_t count) const {
    std::vector<int64_t> pieces{0};
    if (auto it = cuts_.find(var); !var.empty() && it != cuts_.end())
      for (int64_t cut : it->second)
        if (cut > 0 && cut < count) pieces.push_back(cut);
    pieces.push_back(count);
    if (pieces.size() > kMaxPassPieces + 1) return {0, count};
    return pieces;
  }

  // Whether a reduction's pass at `depth` (its code `body`) runs in the CPU nest's column block:
  // a reduction at the nest's own element whose input keeps its last dim (the nest's last loop
  // walks the input's rows, as x.sum(0) does). Its value: the element's code the pass needs
  // repeated in the block (empty where the pass uses nothing of the element's but the last
  // loop's variable and its accumulators; the element's code so far where it uses more, as a
  // column operand s[i1] or a variance's mean, and that code has no loop of its own).
  std::optional<std::string> column_block_fits(const std::string& body, int depth,
                                               bool last_dim_reduced,
                                               const std::vector<Accumulator>& accs) const {
    if (target_ != Target::kCpu || mode_ != NestMode::kCpuLoops || nest_rank_ == 0 ||
        depth != nest_rank_ || last_dim_reduced)
      return std::nullopt;
    const std::string last = "i" + std::to_string(nest_rank_ - 1);
    if (!level_of_.contains(last)) return std::nullopt;  // a last dim of 1
    for (std::string_view name : variables_in(body)) {
      if (name == last || std::any_of(accs.begin(), accs.end(),
                                      [&](const Accumulator& a) { return a.name == name; }))
        continue;
      auto it = level_of_.find(std::string(name));
      if (it == level_of_.end() || it->second < depth) continue;
      const std::string& element = levels_.at(static_cast<size_t>(depth));
      if (element.find("for (") != std::string::npos) return std::nullopt;
      return element;
    }
    return std::string();
  }

  // A column reduction's pass run for the nest's column block (cb, cw positions of the last dim):
  // for each reduced position, one vector loop over the block's positions with their accumulators
  // in arrays, where a pass down each column alone would read one element a cache line (x.sum(0)
  // of 1024 x 4096 floats took 9.7 ms on 2 cores against eager's 0.9). Each position still takes
  // its elements in the pass's order. `element`: the element's code the pass needs (with the
  // accumulators' declarations), repeated in the vector loop. The element then reads its
  // accumulators back:
  //   double acc0_b[64]; for (cj < 64) acc0_b[cj] = 0;
  //   for (rl1 < 4096) { omp simd for (cj < cw) { i0 = cb + cj; double acc0 = acc0_b[cj];
  //     ... acc0 = red_sum(acc0, v4); acc0_b[cj] = acc0; } }
  //   for (i0 = cb; i0 < cb + cw; ++i0) { acc0 = acc0_b[i0 - cb]; ... }
  void cpu_column_block(const std::string& rl, int64_t count, const std::string& body,
                        const std::vector<Accumulator>& accs, const std::string& element) {
    const std::string width = std::to_string(kCpuColumnBlock);
    std::string code, take = element, keep;
    for (const Accumulator& a : accs) {
      code += a.type + " " + a.name + "_b[" + width + "];\n";
      code +=
          "for (int64_t cj = 0; cj < " + width + "; ++cj) " + a.name + "_b[cj] = " + a.init + ";\n";
      take += (element.empty() ? a.type + " " : "") + a.name + " = " + a.name + "_b[cj];\n";
      keep += a.name + "_b[cj] = " + a.name + ";\n";
    }
    code += "for (int64_t " + rl + " = 0; " + rl + " < " + std::to_string(count) + "; ++" + rl +
            ") {\n";
    code += "#pragma omp simd\n  for (int64_t cj = 0; cj < cw; ++cj) {\n";
    code +=
        "    [[maybe_unused]] const int64_t i" + std::to_string(nest_rank_ - 1) + " = cb + cj;\n";
    code += indented(take + body + keep, 2) + "  }\n}\n";
    column_block_ += code;
  }

  // The outputs over the domain of the region's one reduction (analysis/pass_stores.h), stored
  // in its pass at the element `at` the pass loads, by the thread that loads it: each element of
  // the domain once. A columns nest's threads past its last element repeat that element's pass
  // and store nothing. In a row pass whose thread takes `lanes` neighbours at a time (lane
  // variable `lane`), each lane's value waits in registers declared at `outer` (the pass's
  // level), and the last lane stores them as one vector where the row is contiguous and aligned
  // (scalar stores of every 8th bf16 made the bf16 row sum's pass slower than a nest of its own):
  //   pass_out0[rl_lane] = v;  if (rl_lane == 7) { a0 = <address> - 7 * os0_1; vector_store }
  void store_in_pass(int level, const Index& at, int lanes, const std::string& lane, int outer) {
    pass_store_key_ = index_key(at);
    for (size_t j = 0; j < kernel_->outputs.size(); ++j) {
      if (kernel_->outputs[j].shape != pass_stores_->domain) continue;
      kernel_->outputs[j].in_last_nest = nest_is_last_;
      Val v = eval(body_.outputs()[j], at);
      const DType d = kernel_->outputs[j].dtype;
      std::string n = std::to_string(j);
      IndexExpr address = IndexExpr::var("oo" + n);
      for (size_t dim = 0; dim < at.size(); ++dim)
        address = address + mul(at[dim], "os" + n + "_" + std::to_string(dim));
      if (lanes <= 1) {
        std::string store =
            "st_" + suffix(d) + "(out" + n + ", " + address.text + ", " + v.expr + ");";
        emit(level, mode_ == NestMode::kColumns ? "if (column < n) " + store : store);
        continue;
      }
      const std::string regs = fresh("pass_out"), first = fresh("a"), V = std::to_string(lanes);
      const std::string last = "os" + n + "_" + std::to_string(at.size() - 1);
      const std::string size = std::to_string(dtype_size(d));
      emit(outer, "alignas(16) " + std::string(storage_type(d)) + " " + regs + "[" + V + "];");
      emit(level, "st_" + suffix(d) + "(" + regs + ", " + lane + ", " + v.expr + ");");
      emit(level, "if (" + lane + " == " + std::to_string(lanes - 1) + ") {");
      emit(level, "  const int64_t " + first + " = (" + address.text + ") - " +
                      std::to_string(lanes - 1) + " * " + last + ";");
      emit(level, "  if (" + last + " == 1 && " + first + " % " + V +
                      " == 0 && reinterpret_cast<uint64_t>(out" + n + ") % 16 == 0) {");
      emit(level, "    vector_store<" + std::to_string(dtype_size(d) * lanes) +
                      ">(static_cast<char*>(out" + n + ") + " + first + " * " + size + ", " + regs +
                      ");");
      emit(level, "  } else {");
      emit(level, "    for (int l = 0; l < " + V + "; ++l) st_" + suffix(d) + "(out" + n + ", " +
                      first + " + l * " + last + ", ld_" + suffix(d) + "(" + regs + ", l));");
      emit(level, "  }");
      emit(level, "}");
    }
  }

  Val creation(const Node& node, const Index& at) {
    DType out = node.outputs[0]->tensor_type().dtype;
    switch (node.id()) {
      case OpId::kFull:
      case OpId::kFullLike:
        return define(out, store_number(number(node.arg("fill_value")), out));
      case OpId::kZeros:
      case OpId::kZerosLike:
      case OpId::kEmptyLike:  // the interpreter's empty_like is zeros, for reproducible runs
        return define(out, "i_" + suffix(out) + "(0LL)");
      case OpId::kOnes:
      case OpId::kOnesLike:
        return define(out, "i_" + suffix(out) + "(1LL)");
      case OpId::kFill: {
        const Operand& value = node.arg("value");
        if (value.is_value() && value.value()->is_tensor()) {
          // Tensor.item(): a float for floating dtypes, else a bool or an int.
          const Value* t = value.value();
          Val v =
              eval(t, Index(static_cast<size_t>(t->tensor_type().rank()), IndexExpr::number(0)));
          return define(out, copy_convert_item(v, out));
        }
        return define(out, store_number(number(value), out));
      }
      case OpId::kArange: {
        Number start = number(node.arg("start")), step = number(node.arg("step"));
        const std::string& i = at.at(0).text;
        if (is_floating(out))
          return define(out, "f_" + suffix(out) + "(" + start.as_double + " + " + step.as_double +
                                 " * static_cast<double>(" + i + "))");
        return define(
            out, "i_" + suffix(out) + "(" + start.as_int + " + " + step.as_int + " * (" + i + "))");
      }
      default:
        not_lowered(node.op->name + ": this creation op is not lowered yet");
    }
  }

  // ---- index ops ---------------------------------------------------------------------------

  // index_select reads self with the iteration's coordinate along dim replaced by the index's
  // value there. index_copy and index_add start from self at the iteration's element and loop
  // over the index (its length is compiled in): where index[k] is the iteration's coordinate,
  // source's slice k replaces the value (the last such k wins, as on eager's CPU) or is added to
  // it (in k's order). The index must be a kernel input: the executor checks its values before
  // the kernel runs (Kernel::index_checks); the clamp below only keeps a load in bounds.
  //   t1 = index_copy(c, 2, pos, k)  ->  v = c[i]; for (ik = 0; ik < 1; ++ik)
  //                                          if (pos[ik] == i2) v = k[i0, i1, ik, i3];
  Val indexed(const Node& node, const Index& at) {
    if (node.id() == OpId::kWrapIndex) {  // elementwise: index + size where negative
      Val j = eval(node.input(0), at);
      const std::string size = std::to_string(node.arg(1).as_int());
      return define(node.outputs[0]->tensor_type().dtype,
                    "(" + j.expr + ") < 0 && (" + j.expr + ") >= -" + size + " ? (" + j.expr +
                        ") + " + size + " : (" + j.expr + ")");
    }
    const Value* self = node.input(0);
    const Value* index = node.input(2);
    const TensorType& st = self->tensor_type();
    const int64_t rank = st.rank();
    const auto dim =
        static_cast<size_t>(wrap_dim(node.arg(1).as_int(), std::max<int64_t>(rank, 1)));
    const int64_t size = rank == 0 ? 1 : st.shape[dim];
    const int64_t count = index->tensor_type().numel();
    const DType out = node.outputs[0]->tensor_type().dtype;
    if (mode_ == NestMode::kRows) not_lowered(node.op->name + ": inside a row nest");
    // The op and the user's line, with its text (`x[i] = v` lowers to index_copy).
    std::string where = node.op->name;
    if (node.loc.line > 0) where += " at " + node.loc.str();
    if (!node.loc.text.empty()) where += " (`" + node.loc.text + "`)";
    // An index the trace computes in range (an arange's positions) needs no check.
    std::optional<IntegerRange> known = integer_range(index, [&](const Value* v) -> const Value* {
      auto in = input_index_.find(v);
      return in == input_index_.end() ? nullptr : step_.inputs.at(in->second);
    });
    if (!known || known->lo < 0 || known->hi >= size)
      index_checks_.push_back(index_check(node, index, size, static_cast<int64_t>(dim), where));
    const bool scalar_index = index->tensor_type().rank() == 0;
    auto index_at = [&](const IndexExpr& k) { return scalar_index ? Index{} : Index{k}; };
    auto in_range = [&](const Val& j) {
      std::string c = fresh("ix");
      declare("int64_t", c,
              "(" + j.expr + ") < 0 ? 0 : ((" + j.expr + ") > " + std::to_string(size - 1) + " ? " +
                  std::to_string(size - 1) + " : (" + j.expr + "))");
      return IndexExpr::bounded(c, 0, size - 1);
    };
    if (node.id() == OpId::kGather) {
      if (rank == 0) return eval(self, at);
      Index from = at;
      from[dim] = in_range(eval(index, at));  // the index has the output's shape
      return eval(self, from);
    }
    if (node.id() == OpId::kIndexSelect) {
      if (rank == 0) return eval(self, at);
      Index from = at;
      from[dim] = in_range(eval(index, index_at(at[dim])));
      return eval(self, from);
    }
    if (node.id() == OpId::kScatter) return scattered(node, at, dim);
    const Value* source = node.input(3);
    Val base = eval(self, at);
    if (count == 0) return base;
    check_scan_length(node, count);
    const bool add = node.id() == OpId::kIndexAdd;
    const bool fl = is_floating(out);
    // The accumulator starts from the base's value: at its level if deeper than the index's (a
    // CPU flat loop's base loaded at its position `l`).
    const int depth = std::max(depth_of(at), depth_of(base.expr));
    std::string acc = fresh("acc");
    emit(depth, compute_reg(out) + " " + acc + " = " + base.expr + ";", acc);
    std::string k = fresh("ik");
    const int level = static_cast<int>(levels_.size());
    levels_.emplace_back();
    level_of_[k] = level;
    IndexExpr kx = IndexExpr::bounded(k, 0, count - 1);
    Val j = eval(index, index_at(kx));
    Index slot = at;
    if (rank == 0)
      slot = source->tensor_type().rank() == 0 ? Index{} : Index{kx};
    else
      slot[dim] = kx;
    Val v = eval(source, slot);
    std::string coordinate = rank == 0 ? "0" : at[dim].text;
    std::string update;
    if (!add) {
      update = copy_convert(v, out);
    } else {
      Number alpha = number(node.arg("alpha"));
      update = fl ? "f_" + suffix(out) + "(" + acc + " + static_cast<" + compute_reg(out) + ">(" +
                        alpha.as_double + ") * " + v.expr + ")"
                  : "i_" + suffix(out) + "(" + acc + " + " + alpha.as_int + " * " + v.expr + ")";
    }
    emit(level, "if ((" + j.expr + ") == (" + coordinate + ")) " + acc + " = " + update + ";");
    std::string body = close_level(level);
    emit(depth,
         "for (int64_t " + k + " = 0; " + k + " < " + std::to_string(count) + "; ++" + k + ") {");
    levels_.at(static_cast<size_t>(depth)) += indented(body, 1);
    emit(depth, "}");
    return define(out, acc);
  }

  // An index write lowers as a gather: each output element scans the index for the positions
  // that land on it, `length` of them, so the kernel does output x length work. That is what a
  // KV cache's one-token index_copy_ wants (fused, in place); past kMaxScannedIndex positions
  // (an embedding's gradient: 8192 tokens into 50257 rows) PyTorch's scatter of the slices, work
  // of the slices alone, is faster, and the step runs through PyTorch.
  static constexpr int64_t kMaxScannedIndex = 16;
  void check_scan_length(const Node& node, int64_t length) {
    if (length > kMaxScannedIndex)
      not_lowered(node.op->name + ": " + std::to_string(length) +
                  " index positions (a kernel scans at most " + std::to_string(kMaxScannedIndex) +
                  " per element)");
  }

  // The index's values are a step input's, the input itself or a view of it (an embedding's
  // reshape(-1), a gather's index.unsqueeze(-1).expand(...), i[:, :2]), which the executor can
  // check before the kernel runs: exactly the viewed elements, found by applying the views to
  // the input's row-major positions.
  IndexCheck index_check(const Node& node, const Value* index, int64_t size, int64_t dim,
                         const std::string& where) {
    std::vector<const Node*> views;
    const Value* checked = index;
    bool negative = false;  // through a wrap_index (elementwise: the views still apply)
    while (!input_index_.contains(checked) && checked->producer()) {
      const Node* p = checked->producer();
      if (p->id() == OpId::kWrapIndex && !negative && p->arg(1).as_int() == size) {
        negative = true;
      } else if (p->op->kind == OpKind::kView && p->outputs.size() == 1) {
        views.push_back(p);
      } else {
        break;
      }
      checked = p->input(0);
    }
    auto in = input_index_.find(checked);
    if (in == input_index_.end())
      not_lowered(node.op->name +
                  ": an index computed in the same region (it must be checked first)");
    IndexCheck check{static_cast<int>(in->second), size, dim, where, negative, std::nullopt, {}};
    check.drawn_from = drawn_from(step_.inputs.at(in->second));
    if (views.empty()) return check;
    const Geometry whole = contiguous_geometry(checked->tensor_type().shape);
    Geometry g = whole;
    for (auto it = views.rbegin(); it != views.rend(); ++it) {
      const Node& v = **it;
      const Shape& out = v.outputs[0]->tensor_type().shape;
      std::optional<Geometry> next;
      switch (v.id()) {
        case OpId::kView:
        case OpId::kReshape:
        case OpId::kFlatten:
        case OpId::kUnflatten:
          next = view_geometry(g, out);
          break;
        case OpId::kGetitem:
        case OpId::kAsStrided:
          break;
        default:
          next = apply_view(v.id(), v, g, 0);
      }
      if (!next || next->sizes != out) {
        // A reshape of an expanded index (BERT's token types, expanded to the batch, then
        // flattened) has no geometry; where every view keeps all of its input's elements, the
        // index holds exactly the input's values.
        if (std::all_of(views.begin(), views.end(), keeps_every_element)) return check;
        not_lowered(node.op->name + ": an index viewed through " + v.op->name);
      }
      g = *next;
    }
    if (g != whole) check.view = g;
    return check;
  }

  // Whether each element of a view's input is an element of the view (a non-empty one).
  static bool keeps_every_element(const Node* view) {
    if (view->outputs[0]->tensor_type().numel() == 0) return false;
    switch (view->id()) {
      case OpId::kView:
      case OpId::kReshape:
      case OpId::kPermute:
      case OpId::kTranspose:
      case OpId::kT:
      case OpId::kExpand:
      case OpId::kUnsqueeze:
      case OpId::kSqueeze:
      case OpId::kFlatten:
      case OpId::kUnflatten:
      case OpId::kDetach:
      case OpId::kAlias:
        return true;
      default:
        return false;
    }
  }

  // scatter pulls too: the output element at `at` loops over the index positions p that share
  // its coordinates off dim (p = at with p[dim] = k), and takes src[p] where index[p] is its
  // coordinate along dim: the last such k replaces self's value, or every one is reduced into
  // it (include_self=False: into the reduction's identity, and self's value stays where no
  // position matches).
  //   scatter(x, 0, i, s, reduce="sum")  ->  acc = x[i0, i1]; for (ik = 0; ik < 2; ++ik)
  //                                            if (i1 < 4 && i[ik, i1] == i0) acc = red_sum(acc,
  //                                            s[ik, i1]);
  Val scattered(const Node& node, const Index& at, size_t dim) {
    const Value* self = node.input(0);
    const Value* index = node.input(2);
    const Value* src = node.input(3);
    const Shape& index_shape = index->tensor_type().shape;
    const DType out = node.outputs[0]->tensor_type().dtype;
    const bool fl = is_floating(out);
    const size_t rank = self->tensor_type().shape.size();
    Val base = eval(self, at);
    if (index->tensor_type().numel() == 0) return base;
    const Operand& reduce_arg = node.arg("reduce");
    const std::string reduce = reduce_arg.is_none() ? "" : reduce_arg.as_string();
    const bool include_self = node.arg("include_self").as_bool() || reduce.empty();
    const bool mean = reduce == "mean";
    const std::string op = mean             ? "sum"
                           : reduce.empty() ? ""
                                            : reduce.substr(reduce[0] == 'a' ? 1 : 0);
    // The coordinates off dim: the index's own where it spans self's, else clamped to it and
    // matched only inside it.
    std::string inside;
    Index p = rank == 0 ? Index{} : at;
    for (size_t e = 0; e < rank; ++e) {
      if (e == dim || index_shape[e] == self->tensor_type().shape[e]) continue;
      inside += (inside.empty() ? "" : " && ") +
                ("(" + at[e].text + ") < " + std::to_string(index_shape[e]));
      std::string c = fresh("ix");
      declare("int64_t", c,
              "(" + at[e].text + ") < " + std::to_string(index_shape[e]) + " ? (" + at[e].text +
                  ") : " + std::to_string(index_shape[e] - 1));
      p[e] = IndexExpr::bounded(c, 0, index_shape[e] - 1);
    }
    // The accumulator may start from the base's value: at its level if deeper than the index's
    // (a CPU flat loop's base loaded at its position `l`: `acc = v8` before v8 was loaded).
    const int depth = std::max(depth_of(at), depth_of(base.expr));
    std::string acc = fresh("acc"), found = fresh("found"), count = fresh("count");
    std::string identity = op == "sum"    ? "0"
                           : op == "prod" ? "1"
                           : fl ? (op == "max" ? "-kernel_infinity()" : "kernel_infinity()")
                                : (op == "max" ? int_literal(INT64_MIN) : int_literal(INT64_MAX));
    emit(depth, compute_reg(out) + " " + acc + " = " + (include_self ? base.expr : identity) + ";",
         acc);
    if (!include_self) emit(depth, "bool " + found + " = false;", found);
    if (mean) emit(depth, "int64_t " + count + " = " + (include_self ? "1" : "0") + ";", count);
    const int64_t positions =
        rank == 0 ? index_shape.empty() ? 1 : index_shape[0] : index_shape[dim];
    check_scan_length(node, positions);
    std::string k = fresh("ik");
    const int level = static_cast<int>(levels_.size());
    levels_.emplace_back();
    level_of_[k] = level;
    IndexExpr kx = IndexExpr::bounded(k, 0, positions - 1);
    if (rank == 0)
      p = index_shape.empty() ? Index{} : Index{kx};
    else
      p[dim] = kx;
    Val j = eval(index, p);
    Val v = eval(src, src->tensor_type().rank() == 0 ? Index{} : p);
    std::string coordinate = rank == 0 ? "0" : at[dim].text;
    std::string value = op.empty() ? copy_convert(v, out)
                                   : "red_" + op + "(" + acc + ", static_cast<" + compute_reg(out) +
                                         ">(" + v.expr + "))";
    std::string update = acc + " = " + value + ";" +
                         (include_self ? "" : " " + found + " = true;") +
                         (mean ? " ++" + count + ";" : "");
    emit(level, "if (" + (inside.empty() ? "" : inside + " && ") + "(" + j.expr + ") == (" +
                    coordinate + ")) { " + update + " }");
    std::string body = close_level(level);
    emit(depth, "for (int64_t " + k + " = 0; " + k + " < " + std::to_string(positions) + "; ++" +
                    k + ") {");
    levels_.at(static_cast<size_t>(depth)) += indented(body, 1);
    emit(depth, "}");
    std::string result = acc;
    if (mean) {  // eager divides by the count (at least 1), flooring for integers
      std::string n = "(" + count + " > 0 ? " + count + " : 1)";
      result =
          fl ? acc + " / static_cast<" + compute_reg(out) + ">" + n
             : "(" + acc + " / " + n + " - ((" + acc + " % " + n + " != 0) && (" + acc + " < 0)))";
    }
    if (!op.empty()) result = (fl ? "f_" : "i_") + suffix(out) + "(" + result + ")";
    if (!include_self) result = found + " ? " + result + " : " + base.expr;
    return define(out, result);
  }

  // cat and stack: the element of the input whose part of the joined dim holds the index, as
  // nested selections from the last input back, `x < 5 ? a : (x < 8 ? b : c)`. Like a scatter's
  // src, every input is evaluated, each at its own index where it is the one chosen and at 0 on
  // that dim elsewhere (in bounds, never used), so the loops stay branch-free.
  //   cat([a[2, 5], b[2, 3]], 1) at (i, x): x < 5 ? a(i, x) : b(i, x - 5)
  //   stack([a, b], 0) at (k, i):           k == 0 ? a(i) : b(i)
  Val join(const Node& node, const Index& at) {
    const bool stack = node.id() == OpId::kStack;
    DType out = node.outputs[0]->tensor_type().dtype;
    const auto rank = static_cast<int64_t>(node.outputs[0]->tensor_type().rank());
    const auto d = static_cast<size_t>(wrap_dim(node.arg("dim").as_int(), rank));
    const IndexExpr& x = at[d];
    struct Part {
      const Value* input;
      int64_t first, size;  // along the joined dim
    };
    std::vector<Part> parts;
    int64_t first = 0;
    for (const Value* in : node.arg(0).values()) {
      const TensorType& t = in->tensor_type();
      // (cat skips an empty input, as PyTorch does a legacy 1-D [0] of another rank)
      int64_t size = stack ? 1 : (t.numel() == 0 ? 0 : t.shape[d]);
      if (size > 0) parts.push_back({in, first, size});
      first += size;
    }
    if (parts.empty()) not_lowered(node.op->name + ": a join of empty tensors");
    auto part_index = [&](const Part& part) {
      Index slot = at;
      if (stack)
        slot.erase(slot.begin() + static_cast<int64_t>(d));
      else
        slot[d] = x - part.first;
      return slot;
    };
    if (parts.size() == 1 && (stack || parts[0].size == first))
      return define(out, copy_convert(eval(parts[0].input, part_index(parts[0])), out));
    std::string chosen;
    for (size_t k = parts.size(); k-- > 0;) {
      const Part& part = parts[k];
      const int64_t end = part.first + part.size;
      std::vector<std::string> bounds;  // those the index's range does not already decide
      if (!x.range ? part.first > 0 : x.range->first < part.first) {
        bounds.push_back("(" + x.text + ") >= " + std::to_string(part.first));
        note_cut(x, part.first);
      }
      if (!x.range ? end < first : x.range->second >= end) {
        bounds.push_back("(" + x.text + ") < " + std::to_string(end));
        note_cut(x, end);
      }
      std::string inside = bounds.empty() ? "true" : bounds[0];
      if (bounds.size() > 1) inside += " && " + bounds[1];
      std::string c = fresh("c");
      declare("bool", c, inside);
      Index slot = part_index(part);
      if (!stack) {
        std::string j = fresh("j");
        declare("int64_t", j, c + " ? (" + slot[d].text + ") : 0");
        slot[d] = IndexExpr::bounded(j, 0, part.size - 1);
      }
      ++guard_depth_;
      Val v = eval(part.input, slot);
      --guard_depth_;
      std::string value = copy_convert(v, out);
      chosen = chosen.empty() ? value : c + " ? " + value + " : " + chosen;
    }
    return define(out, chosen);
  }

  // fill(self, t) with a 0-dim tensor: item() then store_scalar.
  static std::string copy_convert_item(const Val& v, DType out) {
    return v.floating() ? "f_" + suffix(out) + "(" + v.expr + ")"
                        : "i_" + suffix(out) + "(" + v.expr + ")";
  }

  // A scatter is `condition ? src at its index : self`. Both sides are always evaluated (at an
  // in-bounds index: src's is 0 where the condition is false), so the loops stay branch-free.
  Val scatter(const Node& node, const Index& at) {
    const Value* self = node.input(0);
    const Value* src = node.input(1);
    const Shape& shape = self->tensor_type().shape;
    DType out = node.outputs[0]->tensor_type().dtype;
    if (out != self->tensor_type().dtype) not_lowered(node.op->name + ": a dtype-changing scatter");
    auto rank = static_cast<int64_t>(shape.size());
    std::string cond;
    Index slot;  // the index into the viewed slot where the condition holds
    switch (node.id()) {
      case OpId::kSliceScatter: {
        auto d = static_cast<size_t>(wrap_dim(node.arg("dim").as_int(), rank));
        int64_t start, end, step = node.arg("step").as_int();
        normalize_slice(shape[d], node.arg("start").as_optional_int(),
                        node.arg("end").as_optional_int(), &start, &end);
        if (slice_length(start, end, step) == 0) return eval(self, at);
        const IndexExpr& x = at[d];
        IndexExpr rel = x - start;
        // Only the parts the index's bounds do not already decide (x[:, ::2] has no bounds to
        // check, only the step).
        std::vector<std::string> parts;
        if (!x.range || x.range->first < start) {
          parts.push_back("(" + x.text + ") >= " + std::to_string(start));
          note_cut(x, start);
        }
        if (!x.range || x.range->second >= end) {
          parts.push_back("(" + x.text + ") < " + std::to_string(end));
          note_cut(x, end);
        }
        if (step != 1) parts.push_back("(" + rel.text + ") % " + std::to_string(step) + " == 0");
        for (const std::string& part : parts)
          cond += (cond.empty() ? "" : " && ") + part;
        slot = at;
        slot[d] = exact_div(rel, step);
        if (cond.empty())  // src covers self
          return define(
              out, copy_convert(eval(src, broadcast_index(slot, src->tensor_type().shape)), out));
        break;
      }
      case OpId::kSelectScatter: {
        auto d = static_cast<size_t>(wrap_dim(node.arg("dim").as_int(), rank));
        int64_t index = node.arg("index").as_int();
        if (index < 0) index += shape[d];
        cond = "(" + at[d].text + ") == " + std::to_string(index);
        note_cut(at[d], index);
        note_cut(at[d], index + 1);
        slot = at;
        slot.erase(slot.begin() + static_cast<int64_t>(d));
        break;
      }
      case OpId::kDiagonalScatter: {
        int64_t offset = node.arg("offset").as_int();
        auto d1 = static_cast<size_t>(wrap_dim(node.arg("dim1").as_int(), rank));
        auto d2 = static_cast<size_t>(wrap_dim(node.arg("dim2").as_int(), rank));
        if (diagonal_length(shape, offset, static_cast<int64_t>(d1), static_cast<int64_t>(d2)) == 0)
          return eval(self, at);
        cond = "(" + at[d2].text + ") - (" + at[d1].text + ") == " + std::to_string(offset);
        for (size_t d = 0; d < shape.size(); ++d)
          if (d != d1 && d != d2) slot.push_back(at[d]);
        slot.push_back(at[d1] - std::max<int64_t>(-offset, 0));
        break;
      }
      case OpId::kAsStridedScatter: {
        if (!as_strided_slot(node, at, &cond, &slot)) return eval(self, at);
        break;
      }
      default:
        not_lowered(node.op->name + ": this scatter is not lowered (the interpreter runs it)");
    }
    std::string c = fresh("c");
    declare("bool", c, cond);
    // Off the slot, a coordinate not known to be inside src reads src at 0 instead: in bounds,
    // and never used. (Every view and op under src maps an index inside src to indices inside
    // its inputs, so the loads beneath stay in bounds.)
    const Shape& src_shape = src->tensor_type().shape;
    Index guarded = broadcast_index(slot, src_shape);
    for (size_t d = 0; d < guarded.size(); ++d) {
      const IndexExpr& e = guarded[d];
      if (e.constant || inside_shape({e}, {src_shape[d]})) continue;
      std::string j = fresh("j");
      declare("int64_t", j, c + " ? (" + e.text + ") : 0");
      guarded[d] = IndexExpr::var(j);
    }
    ++guard_depth_;
    Val s = eval(src, guarded);
    --guard_depth_;
    Val base = eval(self, at);
    return define(out, c + " ? " + copy_convert(s, out) + " : " + base.expr);
  }

  // as_strided_scatter(self, src, size, stride, offset) of a 1-D self (a storage): whether
  // position p of self is in the window, and its index there. The window must not repeat
  // elements, so the index is unique: with the dims sorted by stride, each stride exceeds what
  // the smaller ones reach, and dividing by the strides from the largest down finds it. False
  // when the window is empty (the scatter is self).
  bool as_strided_slot(const Node& node, const Index& at, std::string* cond, Index* slot) {
    const Value* self = node.input(0);
    if (self->tensor_type().rank() != 1)
      not_lowered("as_strided_scatter: of a value that is not 1-D");
    require_whole_storage(self);
    const IntList& sizes = node.arg("size").as_ints();
    const IntList& strides = node.arg("stride").as_ints();
    Geometry window{Shape(sizes.begin(), sizes.end()), Strides(strides.begin(), strides.end()),
                    node.arg("storage_offset").as_optional_int().value_or(0)};
    if (!inside(window, self->tensor_type().numel()))
      not_lowered("as_strided_scatter: a window outside its storage (the interpreter raises)");
    if (shape_numel(window.sizes) == 0) return false;
    std::vector<size_t> dims;
    for (size_t d = 0; d < sizes.size(); ++d)
      if (sizes[d] > 1) dims.push_back(d);
    std::sort(dims.begin(), dims.end(),
              [&](size_t a, size_t b) { return strides[a] > strides[b]; });
    int64_t reach = 0;
    for (size_t k = dims.size(); k-- > 0;) {
      if (strides[dims[k]] <= reach)
        not_lowered("as_strided_scatter: a window that repeats elements");
      reach += (sizes[dims[k]] - 1) * strides[dims[k]];
    }
    std::string d = fresh("d");
    declare("int64_t", d, (at[0] - window.offset).text);
    std::string r = fresh("r");
    declare("int64_t", r, d + " < 0 ? 0 : " + d);
    *cond = d + " >= 0";
    slot->assign(sizes.size(), IndexExpr::number(0));
    for (size_t dim : dims) {
      std::string q = fresh("q");
      std::string next = fresh("r");
      std::string t = std::to_string(strides[dim]);
      declare("int64_t", q, r + " / " + t);
      declare("int64_t", next, r + " - " + q + " * " + t);
      *cond += " && " + q + " < " + std::to_string(sizes[dim]);
      (*slot)[dim] = IndexExpr::var(q);
      r = next;
    }
    *cond += " && " + r + " == 0";
    return true;
  }

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
  // The row cache (row_cached_load): the loop variables that run over a row's positions, by
  // name, with their loop's trip variable and count; the cached arrays by input, index and count;
  // the code that fills them; the registers they take.
  struct RowPosition {
    std::string trip;  // the loop's current register in a row cache (cache_slot)
    int64_t count = 0;
  };
  std::unordered_map<std::string, RowPosition> row_positions_;
  int64_t row_length_ = 0;  // a row nest's row: the positions its row loops run over
  int row_vector_ = 1;      // ... and its row vector width (row_lanes)
  struct RowCache {
    std::string array;
    bool as_stored = false;  // holds the elements in their storage type (row_cached_load)
  };
  std::map<std::string, RowCache> row_caches_;
  std::string row_fills_;
  int64_t row_cache_words_ = 0;
  int reductions_ = 0;  // reductions in the nest so far
  // The nest being emitted, and the iterations of its reduction passes so far (each pass's
  // elements times the nest iterations it runs in): a CPU nest of 16 row sums over 4096 elements
  // has 16 iterations but 65536 of work (emit_nest's parallel loop).
  Shape nest_shape_;
  int64_t pass_iterations_ = 0;
  ElementReductions element_;  // the nest's element-level reductions so far (reduction)
  int column_tile_ = 0;        // a column nest's elements per block
  int column_lanes_ = 0;       // ... and threads per element
  std::string column_block_;   // a CPU nest's column block so far (cpu_column_block)
  // The constants the guards of the nest so far compare each loop variable with (note_cut).
  std::map<std::string, std::set<int64_t>> cuts_;
  std::unordered_map<const Value*, bool> holds_reduction_;  // holds_reduction's answers
  // Whether a CPU pass across rows may store (lower: cleared when one cannot run in its block).
  bool cpu_column_pass_stores_ = true;
  std::unordered_map<std::string, Val> memo_;
  std::optional<PassStores> pass_stores_;  // the region's, if its reduction's pass stores
  std::string pass_store_key_;  // the index the nest's pass stores at (index_key), if it does
  Kernel* kernel_ = nullptr;    // the kernel being lowered
  bool nest_is_last_ = false;   // whether the nest being emitted is the kernel's last
  // The CPU kernel's tables filled so far, by value (cpu_tables).
  std::unordered_map<const Value*, std::string> table_name_;
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

}  // namespace

KernelLowering lower_kernel(const Step& step, Target target) {
  return KernelEmitter(step, target).run();
}

CudaArgsLayout cuda_args_layout(const Kernel& kernel) {
  auto words = [](int64_t n) { return std::max<int64_t>(n, 1); };
  auto ni = static_cast<int64_t>(kernel.inputs.size());
  auto no = static_cast<int64_t>(kernel.outputs.size());
  CudaArgsLayout l;
  l.ins = 0;
  l.outs = l.ins + words(ni);
  l.in_meta = l.outs + words(no);
  l.out_meta = l.in_meta + words(kernel.in_meta_size);
  l.sd = l.out_meta + words(kernel.out_meta_size);
  l.si = l.sd + words(ni);
  l.words = l.si + words(ni);
  return l;
}

std::string module_source(Target target,
                          const std::vector<std::pair<std::string, const std::string*>>& kernels) {
  std::string src = target == Target::kCpu ? cpu_kernel_prelude() : cuda_kernel_prelude();
  for (const auto& [symbol, source] : kernels) {
    src += "\n#define KILN_KERNEL_NAME " + symbol + "\n";
    src += *source;
    src += "#undef KILN_KERNEL_NAME\n";
  }
  return src;
}

}  // namespace kiln::codegen
