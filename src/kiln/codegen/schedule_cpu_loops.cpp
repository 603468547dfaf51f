// CPU nests: their loops (shared by the cores), the flat vector loop, broadcast tables.
// Part of the kernel emitter (kernel_emitter.h).
#include <numeric>
#include <set>

#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

// The CPU kernel's tables (broadcast_tables.h), each filled by a serial nest over its value's
// own shape before the kernel's nests, which load its entries:
//   alignas(64) float tbl0[64];   (the value's register type: reg)
//   for (i1 < 64) { v3 = ... rsqrt(var[i1] + eps) * w[i1] ...; tbl0[i1] = v3; }
//   ... nest over [32, 64, 16, 16]: v9 = ld(x, ...) * tbl0[i1] ...
std::string KernelEmitter::cpu_tables(Kernel& k) {
  std::string src;
  for (const Value* v : broadcast_tables(body_)) {
    const TensorType& type = v->tensor_type();
    const std::string name = "tbl" + std::to_string(table_name_.size());
    begin_body(type.shape, k, NestMode::kCpuLoops, nullptr);
    const Index at = loop_index(type.shape);
    Val r = eval(v, at);
    NestBody body{levels_, name + "[" + table_position(v, at) + "] = " + r.expr + ";\n", "",
                  column_block_text(false), ""};
    src += "  alignas(64) " + reg(type.dtype) + " " + name + "[" + std::to_string(type.numel()) +
           "];\n";
    src += "  {  // table " + name + " " + shape_str(type.shape) + "\n" +
           indented(body.levels[0], 2) + cpu_loops(type.shape, body, TeamWork{}) + "  }\n";
    table_name_[v] = name;  // filled: from here on its uses load it
  }
  return src;
}

// The entry of v's table at `at` (an index into v's shape): row-major.
std::string KernelEmitter::table_position(const Value* v, const Index& at) {
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

std::string KernelEmitter::emit_nest(const Shape& shape, Kernel& k, bool is_last) {
  begin_nest_extents(shape, k);
  std::string nest = emit_nest_loops(shape, k, is_last);
  nest_extents_.clear();
  return nest;
}

std::string KernelEmitter::emit_nest_loops(const Shape& shape, Kernel& k, bool is_last) {
  merge_reduced_dims_ = true;
  NestBody body = emit_body(shape, k, is_last, NestMode::kCpuLoops);
  merge_reduced_dims_ = false;
  const std::vector<std::string> merges = merge_conditions_;
  bool has_reductions = reductions_ > 0;
  if (is_last) record_last_nest_loads(shape, k);
  const TeamWork work = cpu_nest_work(shape, body);
  if (const std::vector<int>* order = has_reductions ? nullptr : stored_order(shape, k))
    return cpu_ordered_loops(shape, *order, body, work, is_last);
  std::vector<std::string> unit = unit_inner_strides(shape, k, work.iterations);
  const bool tiled = !has_reductions && tiles_fit(shape, body);
  std::string flat = has_reductions || tiled ? "" : cpu_flat_loop(shape, k, is_last);
  // A flat loop of one dim is taken exactly when the inner strides are 1: the loops' unit
  // variant would be dead code.
  if (!flat.empty() && shape.size() == 1) unit.clear();

  // The schedule, for the reader (and lit tests): the loops' form; a flat vector loop taken
  // where the tensors are contiguous.
  std::string schedule =
      tiled ? "tiles of " + std::to_string(kCpuTile) + " x " + std::to_string(kCpuTile)
      : !body.column_block.empty() ? "column blocks of " + std::to_string(kCpuColumnBlock)
                                   : "loops";
  if (!flat.empty())
    schedule += flat_loop_prefetched_ ? ", a flat loop where contiguous, prefetched blocks of " +
                                            std::to_string(kCpuPrefetchBlock)
                                      : ", a flat loop where contiguous";
  std::string out = "  {  // " + std::string(is_last ? "last nest" : "nest") + " over " +
                    nest_shape_text(shape) + " (schedule: " + schedule + ")\n";
  if (!flat.empty()) out += flat + "  } else {\n";
  // The code outside the loops (a full reduction's passes) is specialized with them.
  const std::string loops =
      indented(body.levels[0], 2) +
      (tiled ? cpu_tiled_loops(shape, body, work) : cpu_loops(shape, body, work));
  // The loops twice: for unit inner strides and merged reduced dims (merged_address), their
  // conditions constants there, and for any strides.
  std::string cond, declare;
  for (const std::string& n : unit) {
    cond += (cond.empty() ? "" : " && ") + n + " == 1LL";
    declare += (declare.empty() ? "" : ", ") + n + " = 1";
  }
  const MergeFlags flags = merge_flags(merges);
  if (!flags.cond.empty()) cond += (cond.empty() ? "" : " && ") + flags.cond;
  const bool constant = unit.empty() && std::all_of(merges.begin(), merges.end(), [&](auto& m) {
                          return constant_merge_conditions_.contains(m);
                        });
  if (cond.empty()) {
    out += loops;
  } else if (constant) {  // (merges between constant strides alone: they hold)
    out += "  {\n" + flags.on + indented(loops, 1) + "  }\n";
  } else {
    if (!declare.empty()) declare = "    constexpr int64_t " + declare + ";\n";
    out += "  if (" + cond + ") {\n" + declare + flags.on + indented(loops, 1) + "  } else {\n" +
           flags.off + indented(loops, 1) + "  }\n";
  }
  if (!flat.empty()) out += "  }\n";
  out += "  }\n";
  return out;
}

// A nest whose output is laid out in another dim order (place_layouts.h: channels-last): its
// loops in that order, the body whole in the innermost (its levels assume row-major loops), so
// that the stores and the loads of inputs laid out alike are consecutive:
//   order (0, 2, 3, 1) over [N, C, H, W]: for i0 { for i2 { for i3 { simd for i1 { ... } } } }
std::string KernelEmitter::cpu_ordered_loops(const Shape& shape, const std::vector<int>& order,
                                             const NestBody& body, const TeamWork& work,
                                             bool is_last) {
  std::string walk;
  for (size_t d = 0; d < order.size(); ++d)
    walk += (d ? ", " : "") + std::to_string(order[d]);
  std::string out = "  {  // " + std::string(is_last ? "last nest" : "nest") + " over " +
                    nest_shape_text(shape) + " (schedule: loops in dim order (" + walk + "))\n";
  const size_t n = order.size();
  const int collapse = n > 2 ? 2 : 1;
  if (parallel_worth(work.iterations) && n > 1)
    out += "#pragma omp parallel for collapse(" + std::to_string(collapse) + ")" +
           team_clause(work) + "\n";
  for (size_t k = 0; k < n; ++k) {
    const std::string i = "i" + std::to_string(order[k]), pad(2 + 2 * k, ' ');
    if (k + 1 == n && n > 1) out += pad + "  #pragma omp simd\n";
    out += pad + "  for (int64_t " + i + " = 0; " + i + " < " +
           extent_text(shape, static_cast<size_t>(order[k])) + "; ++" + i + ") {\n";
  }
  out += indented(body.flat() + body.stores, static_cast<int>(n) + 2);
  return out + cpu_loops_close(n) + "  }\n";
}

// A CPU nest's loops around its body: the outer ones shared by the cores (OpenMP) when the
// nest's iterations and its reductions' elements, weighed by their cost, are worth it
// (parallel_worth).
std::string KernelEmitter::cpu_loops(const Shape& shape, const NestBody& body,
                                     const TeamWork& work) const {
  if (!body.column_block.empty()) return cpu_column_block_loops(shape, body, work);
  const size_t n = shape.size();
  const std::vector<size_t> order = cpu_loop_order(shape, body);
  bool between_loops = false;  // code between the loops: they cannot collapse
  for (size_t k = 0; k + 1 < n; ++k)
    between_loops = between_loops || !body.levels[order[k] + 1].empty();
  const int collapse = between_loops ? 1 : std::max<int>(1, static_cast<int>(n) - 1);
  int64_t shared = 1;  // the iterations the threads share
  for (size_t k = 0; k < static_cast<size_t>(collapse) && k < n; ++k)
    shared *= shape[order[k]];
  const bool parallel = parallel_worth(work.iterations) && shared > 1;
  // The innermost loop of a nest whose row passes ran before it (a softmax's division by the row
  // sum): its iterations are independent (each stores its own element; an input stored into in
  // the kernel is read there only at that element, kernel.h), so the compiler may run them in
  // vector lanes, exp and all, where it would not prove the pointers apart by itself. Not over a
  // loop holding loops of its own (a pass with its own simd clause).
  const std::string& innermost = body.levels[n];
  const bool simd_innermost = n > 0 && shape.back() >= 16 &&
                              innermost.find("for (") == std::string::npos &&
                              innermost.find("#pragma") == std::string::npos;
  std::string out;
  if (parallel) {
    out += "#pragma omp parallel for";
    if (collapse > 1) out += " collapse(" + std::to_string(collapse) + ")";
    if (simd_innermost && n == 1) out += " simd";  // one loop: shared and in lanes
    out += team_clause(work) + "\n";
  }
  for (size_t k = 0; k < n; ++k) {
    const size_t d = order[k];
    if (simd_innermost && k + 1 == n && !(parallel && k == 0))
      out += std::string(2 + 2 * k, ' ') + "  #pragma omp simd\n";
    out += cpu_loop_open(shape, d, body, k);
  }
  out += indented(body.stores, static_cast<int>(n) + 2);
  return out + cpu_loops_close(n);
}

// A nest's loop over dim d opened at `depth` loops deep, with its own code (body.levels[d + 1]).
std::string KernelEmitter::cpu_loop_open(const Shape& shape, size_t d, const NestBody& body,
                                         size_t depth) const {
  const std::string i = "i" + std::to_string(d);
  return std::string(2 + 2 * depth, ' ') + "  for (int64_t " + i + " = 0; " + i + " < " +
         extent_text(shape, d) + "; ++" + i + ") {\n" +
         indented(body.levels[d + 1], static_cast<int>(depth) + 3);
}

// The closing braces of `depth` loops.
std::string KernelEmitter::cpu_loops_close(size_t depth) {
  std::string out;
  for (size_t k = depth; k-- > 0;)
    out += std::string(2 + 2 * k, ' ') + "  }\n";
  return out;
}

// The order of a CPU nest's loops: row-major, but for the outer loops whose index the first code
// between the loops does not read (a batch norm's per-channel statistics over [N, C, H, W] read
// i1 alone): those open after that code's loop, so that it runs once for each of its own indices
// rather than again for each of theirs (32 times the reads for a batch of 32: 20x eager's time).
//   order (1, 0, 2, 3): for (i1 < C) { mean over n, h, w; for (i0 < N) { for (i2) { for (i3) } } }
// The loops moved hold no code of their own (the first code is the first), and the last loop
// stays last.
std::vector<size_t> KernelEmitter::cpu_loop_order(const Shape& shape, const NestBody& body) {
  const size_t n = shape.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  size_t first = 1;  // levels[first]: the first code between the loops, inside loop first - 1
  while (first < n && body.levels[first].empty())
    ++first;
  if (first >= n) return order;
  const std::set<size_t> read = nest_indices_read(body.levels[first], first - 1);
  std::vector<size_t> before, moved;
  for (size_t d = 0; d + 1 < first; ++d)
    (read.contains(d) || shape[d] == 1 ? before : moved).push_back(d);
  if (moved.empty()) return order;
  order = before;
  order.push_back(first - 1);
  order.insert(order.end(), moved.begin(), moved.end());
  for (size_t d = first; d < n; ++d)
    order.push_back(d);
  return order;
}

// The work a CPU nest's team shares: its elements and its passes' iterations, each pass run for
// the loops it sits in as cpu_loops orders them (a statistic moved out of a batch's loop runs
// once per channel, not once per element), as text over the runtime extents too:
//   (e0 * 256LL + e0 * e1)
KernelEmitter::TeamWork KernelEmitter::cpu_nest_work(const Shape& shape,
                                                     const NestBody& body) const {
  TeamWork work = TeamWork::of_nest(shape_numel(shape));
  if (pass_works_.empty()) return work;
  // (A column block's nest keeps its loops in row-major order around and inside the block.)
  std::vector<size_t> order(shape.size());
  std::iota(order.begin(), order.end(), 0);
  if (body.column_block.empty()) order = cpu_loop_order(shape, body);
  const size_t outside = body.column_block.empty() ? 0 : column_block_outside(shape, body);
  work.units = "(" + rows_times(shape_numel(shape));
  for (const PassWork& pass : pass_works_) {
    std::vector<size_t> loops;  // the dims whose loops the pass runs in
    if (pass.in_column_block) {
      for (size_t d = 0; d < outside; ++d)
        loops.push_back(d);
      loops.push_back(shape.size() - 1);  // each block's columns
    } else if (pass.depth > 0) {
      const auto within = static_cast<size_t>(pass.depth - 1);
      for (size_t k = 0; k < order.size(); ++k) {
        loops.push_back(order[k]);
        if (order[k] == within) break;
      }
    }
    int64_t runs = 1;
    std::string runs_text;
    for (size_t d : loops) {
      runs *= shape[d];
      if (shape[d] == 1) continue;
      const NestExtent* e = nest_extent(shape, d);
      runs_text += (runs_text.empty() ? "" : " * ") + (e ? e->name : int_literal(shape[d]));
    }
    work.iterations += runs * pass.count;
    work.units += " + " + (runs_text.empty() ? "" : runs_text + " * ") + pass.length;
  }
  work.units += ")";
  return work;
}

// The outer loops a CPU nest's column block opens inside (cpu_column_block_loops): up to the
// last one its passes read, or all of them where a loop it would hold has code of its own (a
// value its passes might read).
size_t KernelEmitter::column_block_outside(const Shape& shape, const NestBody& body) {
  const size_t last = shape.size() - 1;
  const std::set<size_t> read = nest_indices_read(body.column_block, last);
  const size_t outside = read.empty() ? 0 : *read.rbegin() + 1;
  for (size_t d = outside; d < last; ++d)
    if (!body.levels[d + 1].empty()) return last;
  return outside;
}

// A CPU nest whose last dim runs in column blocks (cpu_column_block: the column reductions'
// passes over each block first). The block's loop opens inside the outer loops whose index its
// passes read, and the other outer loops inside it: a softmax over dim 1 of [B, T, C] computes a
// block's column statistics once for each b, then its T rows, where inside every loop it computed
// them again for each t (T times the reads: 240x eager's time for [32, 512, 64]).
//   for (i0 < B) { for (cb < C; cb += 64) { passes over t; for (i1 < T) { for (i2 in block) } } }
// Where the loops before the block (or, with none, the blocks) are too few for a team, the team
// shares each pass's rows and then the loops inside the block (column_block_shared_rows): a
// softmax over dim 0 of [65536, 64], one block, ran on one core at 1.3x eager's time.
//   for (cb) { arrays; #pragma omp parallel { #pragma omp for reduction(max:acc3_b[:64])
//     for (rl5 < e1) {...}  ...  #pragma omp for  for (i0 < e0) { for (i1 in block) } } }
std::string KernelEmitter::cpu_column_block_loops(const Shape& shape, const NestBody& body,
                                                  const TeamWork& work) const {
  const size_t n = shape.size(), last = n - 1;
  const size_t outside = column_block_outside(shape, body);
  // The team shares the outer loops before the block (those without code between them), or,
  // with none, the blocks.
  size_t team_loops = 0;
  int64_t team_iterations = 1;
  for (size_t d = 0; d < outside && (d == 0 || body.levels[d].empty()); ++d, ++team_loops)
    team_iterations *= shape[d];
  if (outside == 0) team_iterations = (shape[last] + kCpuColumnBlock - 1) / kCpuColumnBlock;
  const bool parallel = parallel_worth(work.iterations) && team_iterations > 1;
  const bool shared_rows =
      !parallel && parallel_worth(work.iterations) && !body.column_block_shared_rows.empty();
  const std::string pragma =
      "#pragma omp parallel for" +
      (team_loops > 1 ? " collapse(" + std::to_string(team_loops) + ")" : std::string()) +
      team_clause(work) + "\n";
  std::string out = parallel ? pragma : "";
  size_t depth = 0;  // loops open
  for (size_t d = 0; d < outside; ++d)
    out += cpu_loop_open(shape, d, body, depth++);
  std::string passes = body.column_block;
  if (shared_rows) {  // the team's region opens before the first pass's loop
    passes = body.column_block_shared_rows;
    const size_t first = passes.find("#pragma omp for ");
    KILN_ASSERT(first != std::string::npos) << "a column block's shared rows without a pass";
    passes.insert(first, "#pragma omp parallel" + team_clause(work) + "\n{\n");
  }
  out += column_block_loop(extent_text(shape, last), passes, std::string(2 * depth, ' '));
  const size_t block_depth = depth++;  // the block's loop
  // (the first loop inside the block shared by the team where it shares the rows)
  const std::string shared_loop = std::string(2 + 2 * depth, ' ') + "  #pragma omp for";
  for (size_t d = outside; d < last; ++d)
    out += (shared_rows && d == outside ? shared_loop + "\n" : "") +
           cpu_loop_open(shape, d, body, depth++);
  const std::string i = "i" + std::to_string(last);
  // The block's columns in vector lanes, as cpu_loops' innermost loop (its iterations are
  // independent), where it holds no loop of its own.
  const std::string& innermost = body.levels[n];
  const bool columns_shared = shared_rows && outside == last;
  if (innermost.find("for (") == std::string::npos &&
      innermost.find("#pragma") == std::string::npos)
    out += columns_shared ? shared_loop + " simd\n"
                          : std::string(2 + 2 * depth, ' ') + "  #pragma omp simd\n";
  else if (columns_shared)
    out += shared_loop + "\n";
  out += std::string(2 + 2 * depth, ' ') + "  for (int64_t " + i + " = cb; " + i +
         " < cb + cw; ++" + i + ") {\n";
  out += indented(body.levels[n], static_cast<int>(depth) + 3);
  out += indented(body.stores, static_cast<int>(depth) + 3);
  if (!shared_rows) return out + cpu_loops_close(depth + 1);
  // The loops inside the block, the team's region, then the block's loop and those outside it.
  for (size_t k = depth + 1; k-- > block_depth + 1;)
    out += std::string(2 + 2 * k, ' ') + "  }\n";
  out += std::string(2 + 2 * block_depth, ' ') + "  }  // the team's region\n";
  return out + cpu_loops_close(block_depth + 1);
}

// The innermost strides of the tensors a CPU nest reads or writes (s0_1, os0_1; none when the
// nest is too small to matter). The nest's loops are then emitted twice: once for strides
// known to be 1 (declared so in the loops' scope, shadowing the kernel's), and once for any.
// With unit inner strides the loads of a row are contiguous to the compiler, and the innermost
// loop and the reductions' simd passes vectorize (runtime strides made every load a gather,
// which GCC does not vectorize for float).
std::vector<std::string> KernelEmitter::unit_inner_strides(const Shape& shape, const Kernel& k,
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
    const bool stored_in_pass = !pass_store_keys_.empty() && out == pass_stores_->domain;
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
std::string KernelEmitter::cpu_flat_loop(const Shape& shape, Kernel& k, bool is_last) {
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
  const size_t suffix = suffix_lanes(shape, k, lanes);
  std::vector<std::vector<StorageWindow>> windows = windows_;
  std::vector<bool> whole = whole_storage_;
  NestBody lane = emit_body(shape, k, is_last, NestMode::kFlat, &lanes);
  size_t split = flat_loop_split(shape, lane);
  if (suffix > 0 && split > shape.size() - suffix) {
    // A value hoisted out of a shorter inner block than the suffix lanes': no suffix lanes.
    lanes.suffix_inputs.clear();
    lane = emit_body(shape, k, is_last, NestMode::kFlat, &lanes);
    split = flat_loop_split(shape, lane);
  } else if (suffix > 0) {
    split = shape.size() - suffix;
  }
  windows_ = windows;
  whole_storage_ = whole;

  std::string cond;
  auto require_contiguous = [&](const std::string& strides) {
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      cond += std::string(cond.empty() ? "" : " && ") + strides + std::to_string(d) +
              " == " + dims_product_text(shape, d + 1);
    }
  };
  std::string text;
  std::vector<LaneMemory> memory;
  for (size_t i : lanes.suffix_inputs) {  // contiguous over the inner block
    const std::string n = std::to_string(i);
    const Shape& own = body_.inputs()[i]->tensor_type().shape;
    const size_t lead = leading_ones(own), rank = own.size() - lead, first = shape.size() - rank;
    for (size_t d = 0; d < rank; ++d)
      if (shape[first + d] != 1)
        cond += std::string(cond.empty() ? "" : " && ") + "s" + n + "_" + std::to_string(lead + d) +
                " == " + dims_product_text(shape, first + d + 1);
    text += "    const char* const lane_in" + n + " = static_cast<const char*>(in" + n + ") + o" +
            n + " * " + std::to_string(dtype_size(body_.inputs()[i]->tensor_type().dtype)) + ";\n";
  }
  for (size_t i : lanes.inputs) {
    std::string n = std::to_string(i);
    require_contiguous("s" + n + "_");
    const int64_t size = dtype_size(body_.inputs()[i]->tensor_type().dtype);
    text += "    const char* const lane_in" + n + " = static_cast<const char*>(in" + n + ") + o" +
            n + " * " + std::to_string(size) + ";\n";
    memory.push_back({"lane_in" + n, size});
  }
  for (size_t j : outs) {
    std::string n = std::to_string(j);
    require_contiguous("os" + n + "_");
    text += "    char* const lane_out" + n + " = static_cast<char*>(out" + n + ") + oo" + n +
            " * " + std::to_string(dtype_size(k.outputs[j].dtype)) + ";\n";
  }
  // A body that reads its element's multi-index (a transposed operand: the heads' layout) would
  // divide by the nest's runtime middle extents at every element: its outer positions become
  // loops instead, split at the last dim.
  if (split == 0 && nest_extents_.size() > 1 &&
      reads_multi_index(shape, lane.flat() + lane.stores)) {
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] != 1) split = d;
  }
  flat_loop_prefetched_ = split == 0 && numel >= kCpuPrefetchElements && !memory.empty();
  if (flat_loop_prefetched_) {
    const std::string body = indented(lane.flat(), 3) + indented(lane.stores, 3);
    text += cpu_prefetched_flat_loop(numel, memory,
                                     "      [[maybe_unused]] const int64_t l = lin;\n" +
                                         flat_indices(shape, body, "      ") + body);
  } else if (split == 0) {
    const std::string body = indented(lane.flat(), 3) + indented(lane.stores, 3);
    text += parallel_worth(numel)
                ? "#pragma omp parallel for simd" + team_clause(TeamWork::of_nest(numel)) + "\n"
                : "#pragma omp simd\n";
    text += "    for (int64_t lin = 0; lin < " + rows_times(numel) + "; ++lin) {\n";
    text += "      [[maybe_unused]] const int64_t l = lin;\n" + flat_indices(shape, body, "      ");
    text += body + "    }\n";
  } else {
    text += cpu_split_flat_loop(shape, split, lane,
                                parallel_worth(numel) ? team_clause(TeamWork::of_nest(numel))
                                                      : std::optional<std::string>());
  }
  return "  if (" + (cond.empty() ? std::string("true") : cond) + ") {\n" +
         "    using I [[maybe_unused]] = int64_t;\n" + text;
}

// The inputs of a flat loop over `shape` that are read, contiguous, along a block of its last
// dims at the iteration's own element of the block, broadcast over the dims before it (a
// positional embedding [T, C] or [1, T, C] added to [B, T, C]; a column statistic [1, C] of
// [R, C], which was gathered at every element: exp(x - m) / s 2.7x slower): put in `lanes` as
// suffix lanes, read at the
// inner block's position `within` (cpu_split_flat_loop: the loop splits before the block), where
// their index would otherwise be the multi-index recovered from the flat position. Returns the
// block's rank: that of the longest such inputs, which are the ones taken (0: none).
size_t KernelEmitter::suffix_lanes(const Shape& shape, const Kernel& k, Lanes& lanes) const {
  const Index loop = loop_index(shape);
  auto suffix_of = [&](size_t i) -> size_t {
    if (!k.inputs[i].is_tensor || raw_loads_[i] || loads_[i].size() != 1) return 0;
    const TensorType& t = body_.inputs()[i]->tensor_type();
    const size_t lead = leading_ones(t.shape), rank = t.shape.size() - lead;
    if (rank == 0 || rank >= shape.size() || lanes.inputs.contains(i)) return 0;
    const size_t first = shape.size() - rank;
    if (!std::equal(t.shape.begin() + static_cast<int64_t>(lead), t.shape.end(),
                    shape.begin() + static_cast<int64_t>(first)))
      return 0;
    Index at(lead, IndexExpr::number(0));  // (the dims of 1 before the block: index 0)
    at.insert(at.end(), loop.begin() + static_cast<int64_t>(first), loop.end());
    return *loads_[i].begin() == index_key(at) ? rank : 0;
  };
  size_t longest = 0;
  for (size_t i = 0; i < k.inputs.size(); ++i)
    longest = std::max(longest, suffix_of(i));
  if (longest == 0) return 0;
  for (size_t i = 0; i < k.inputs.size(); ++i)
    if (suffix_of(i) == longest) lanes.suffix_inputs.insert(i);
  return longest;
}

// The number of leading dims of 1 of a shape ([1, 1, 64]: 2).
size_t KernelEmitter::leading_ones(const Shape& shape) {
  size_t lead = 0;
  while (lead < shape.size() && shape[lead] == 1)
    ++lead;
  return lead;
}

// The multi-index of a flat loop's position `lin` over `shape`, where its `body` reads it (a
// broadcast operand, a view): none where the body reads and writes every tensor as a lane, so
// the loop's text holds no size but its length (the same source at every size of its class).
// Its sizes are literals: a division by a runtime size at every element would cost more than the
// element (the compiler turns a constant's into a multiplication, and vectorizes it).
std::string KernelEmitter::flat_indices(const Shape& shape, const std::string& body,
                                        const std::string& indent) {
  return reads_multi_index(shape, body) ? decompose(shape, indent) : "";
}

// Whether `body` reads an index i<d> of a nest over `shape`.
bool KernelEmitter::reads_multi_index(const Shape& shape, const std::string& body) {
  return !nest_indices_read(body, shape.size()).empty();
}

// cpu_flat_loop's loop split at dim `split`: loops over the outer dims [0, split), each outer
// position's values once, then the inner dims as one vectorized loop over consecutive elements.
// The outer positions are loops, not a flat position decomposed by divisions, so that their
// extents may be runtime ones (a heads' layout [1, H, T, D] at every T). `team`: the parallel
// loop's clause, if the nest is worth a team.
//   #pragma omp parallel for collapse(2) num_threads(...)
//   for (int64_t i1 = 0; i1 < e0; ++i1) for (int64_t i2 = 0; i2 < e1; ++i2) {
//     const I outer = (i1) * e1 + i2;  hoisted
//     #pragma omp simd
//     for (int64_t within = 0; within < 16LL; ++within) { l = outer * 16LL + within; ... } }
std::string KernelEmitter::cpu_split_flat_loop(const Shape& shape, size_t split,
                                               const NestBody& lane,
                                               const std::optional<std::string>& team) const {
  Shape inner = shape;
  std::fill(inner.begin(), inner.begin() + static_cast<std::ptrdiff_t>(split), 1);
  const std::string inner_n = dims_product_text(shape, split);
  std::string hoisted, inside;
  for (size_t d = 0; d < lane.levels.size(); ++d)
    (d <= split ? hoisted : inside) += lane.levels[d];
  std::string loops, position;
  int opened = 0;
  for (size_t d = 0; d < split; ++d) {
    if (shape[d] == 1) continue;
    const std::string i = "i" + std::to_string(d), size = extent_text(shape, d);
    loops += "    for (int64_t " + i + " = 0; " + i + " < " + size + "; ++" + i + ")\n";
    position = position.empty() ? i : "(" + position + ") * " + size + " + " + i;
    ++opened;
  }
  std::string text;
  if (team && opened > 0)  // (no outer loop: the block runs once, on this thread)
    text += "#pragma omp parallel for" +
            (opened > 1 ? " collapse(" + std::to_string(opened) + ")" : std::string()) + *team +
            "\n";
  text += loops + "    {\n";
  text += "      [[maybe_unused]] const I outer = " + (position.empty() ? "0" : position) + ";\n";
  text += indented(hoisted, 3) + "#pragma omp simd\n";
  text += "      for (int64_t within = 0; within < " + inner_n + "; ++within) {\n";
  text += "        [[maybe_unused]] const int64_t l = outer * " + inner_n + " + within;\n";
  const std::string body = indented(inside, 4) + indented(lane.stores, 4);
  text +=
      "        [[maybe_unused]] const I lin = within;\n" + flat_indices(inner, body, "        ");
  return text + body + "      }\n    }\n";
}

// The flat loop in blocks, each block's iterations one vector loop after the prefetches of the
// input lanes' memory kCpuPrefetchAhead elements on (blocks whose prefetches would pass the
// tensors' end ask for nothing):
//   #pragma omp parallel for
//   for (int64_t blk = 0; blk < N; blk += 1024) {
//     if (blk + 5120 <= N)
//       for (int64_t b = 0; b < 4096; b += 64) __builtin_prefetch(lane_in0 + (blk + 4096) * 4 + b);
//     const int64_t end = ...;
//     #pragma omp simd
//     for (int64_t lin = blk; lin < end; ++lin) { body }
//   }
std::string KernelEmitter::cpu_prefetched_flat_loop(int64_t numel,
                                                    const std::vector<LaneMemory>& lanes,
                                                    const std::string& body) const {
  const std::string n = rows_times(numel), block = std::to_string(kCpuPrefetchBlock);
  std::string text = parallel_worth(numel)
                         ? "#pragma omp parallel for" + team_clause(TeamWork::of_nest(numel)) + "\n"
                         : "";
  text += "    for (int64_t blk = 0; blk < " + n + "; blk += " + block + ") {\n";
  // (Only blocks inside the tensors: an address past an array's end is not one to compute.)
  text += "      if (blk + " + std::to_string(kCpuPrefetchAhead + kCpuPrefetchBlock) + " <= " + n +
          ") {\n";
  for (const LaneMemory& m : lanes) {
    const std::string size = std::to_string(m.element_bytes);
    text += "        for (int64_t b = 0; b < " +
            std::to_string(kCpuPrefetchBlock * m.element_bytes) + "; b += 64) __builtin_prefetch(" +
            m.pointer + " + (blk + " + std::to_string(kCpuPrefetchAhead) + ") * " + size +
            " + b);\n";
  }
  text += "      }\n";
  text += "      const int64_t end = blk + " + block + " < " + n + " ? blk + " + block + " : " + n +
          ";\n";
  text += "#pragma omp simd\n      for (int64_t lin = blk; lin < end; ++lin) {\n" +
          indented(body, 1) + "      }\n    }\n";
  return text;
}

// Where a flat loop splits in two (0: it does not): at the innermost loop level with code of
// its own before the innermost, or the nearest level outside it whose dims hold enough
// consecutive elements for a vector loop. A broadcast operand's values (a batch norm's
// per-channel scale, a rsqrt of it) are then computed once per outer position instead of once per
// element:
//   x[128, 256, 8, 8] * s.view(1, -1, 1, 1).rsqrt(): split 2, 32768 x rsqrt, then 64 lanes
size_t KernelEmitter::flat_loop_split(const Shape& shape, const NestBody& body) {
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

}  // namespace kiln::codegen::detail
