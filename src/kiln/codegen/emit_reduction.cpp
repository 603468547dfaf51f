// Reductions: their passes, accumulators and combines, and the outputs a pass stores.
// Part of the kernel emitter (kernel_emitter.h).
#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

// ---- reductions ----------------------------------------------------------------------------

// One output element of a reduction: a loop over the reduced elements (in row-major order of
// the reduced dims, as the interpreter groups them; on the CPU in memory order where the input's
// strides are known: memory_order_of_reduced), floats accumulated in double and integers
// in wrapping int64, each element first converted to the output dtype. The loop sits at the
// level of the output index, so a row statistic is computed once per row; in a CUDA row nest a
// reduction at row level is split over the row's threads and combined with block_<op> or
// warp_<op>.
Val KernelEmitter::reduction(const Node& node, const Index& at) {
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
  // A CPU float sum computed at a second place in the kernel: lowered again, summed in double at
  // both (SumComputedTwice).
  const bool chunkable = (id == OpId::kSum || id == OpId::kMean) && target_ == Target::kCpu;
  if (chunkable && !exact_sums_.contains(&node)) {
    std::set<std::string>& sites = sum_sites_[&node];
    sites.insert(nest_shape_text(nest_shape_) + "@" + index_key(at));
    if (sites.size() > 1) throw SumComputedTwice{&node};
  }
  // A CPU pass takes the reduced dims in their memory order where it is known (below, `reduced`
  // is the pass's order, outermost first).
  if (target_ == Target::kCpu && !arg) reduced = memory_order_of_reduced(self, reduced);
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
    element_.inner =
        element_.inner || std::find(reduced.begin(), reduced.end(), in.rank() - 1) != reduced.end();
    element_.longest = std::max(element_.longest, count);
  }
  const bool cooperative = mode_ == NestMode::kRows && row_level && !arg;
  if (mode_ == NestMode::kRows && row_level && !cooperative) ++row_serial_reductions_;
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
  // A column nest's lane sums count / lanes of the elements before the lanes combine, a row's
  // thread count / threads (a split row's its share of the blocks of its row), as eager's CUDA
  // reductions split theirs. (A layer norm over rows of 8192 bf16 in double accumulators was
  // bound by the conversions to double: 1.5x eager's time, 2.8x the byte floor.)
  const int64_t serial = columnar && split_columns_
                             ? split_row_elements_per_thread(count, split_row_count_, column_lanes_)
                         : columnar ? (count + column_lanes_ - 1) / column_lanes_
                         : split_rows_ && cooperative
                             ? split_row_elements_per_thread(count, split_row_count_, row_threads_)
                         : cooperative ? (count + row_threads_ - 1) / row_threads_
                                       : count;
  // On the CPU: max and min of float-held values in float (exact, twice the vector lanes), and
  // short sums of half and bfloat16 values in float as eager's CPU kernels take them (a bf16 row
  // sum of rows of 4096 took 0.72 ms on 2 cores against eager's 0.37 with a double accumulator).
  const bool extreme = id == OpId::kAmax || id == OpId::kAmin;
  // A sum of the elements a variance of the region sums too goes into the variance's double
  // accumulator, so one pass serves both (x.mean() and x.var() read x twice, not three times).
  const bool variance_sum =
      (id == OpId::kSum || id == OpId::kMean) && target_ == Target::kCuda && fl &&
      std::any_of(body_.nodes().begin(), body_.nodes().end(), [&](const auto& n) {
        return (n->id() == OpId::kVar || n->id() == OpId::kStd) && n->input(0) == self &&
               reduction_dims(n->arg(1).as_optional_ints(), in.rank()) == reduced;
      });
  const bool float_acc = fl && reg(held) == "float" && !variance_sum &&
                         (target_ == Target::kCuda
                              ? extreme || serial <= 4096
                              : extreme || ((held == DType::kBFloat16 || held == DType::kFloat16) &&
                                            count <= 4096 && id != OpId::kVar && id != OpId::kStd));
  const std::string acc_type = fl ? (float_acc ? "float" : "double") : "int64_t";
  // The type each element enters the accumulator in (red_<op> has float and double forms).
  // (A variance's passes in float on CUDA alone, as eager's CUDA kernels compute it.)
  const bool spread = id == OpId::kVar || id == OpId::kStd;
  const std::string element_type =
      fl && float_acc && (!spread || target_ == Target::kCuda) ? "float" : "double";

  // One pass over the reduced elements: `combine(x, rl)` is the line that takes in the element
  // x (converted), the rl-th of the group.
  using Combine = std::function<std::string(const std::string& x, const std::string& rl)>;
  const bool last_dim_reduced =
      std::find(reduced.begin(), reduced.end(), in.rank() - 1) != reduced.end();
  // The pass's length as kernel text: read at run time (runtime_size) where it is not a row's
  // length, whose constant trip count GCC's vector loops and CUDA's row caches are shaped by: a
  // column pass, a full reduction, a CUDA column nest's lanes. A sum over a batch's rows (a bias
  // gradient) then compiles once for every batch size of its size class. Registered where a
  // loop bound, a team's work or a mean's division reads it (not by a pass in pieces).
  const bool runtime_count = !cooperative && (columnar || depth == 0 || !last_dim_reduced);
  auto count_text = [&] { return runtime_count ? runtime_size(count) : std::to_string(count); };
  auto count_double = [&] {
    return runtime_count ? "static_cast<double>(" + count_text() + ")"
                         : std::to_string(count) + ".0";
  };
  // The pass's variable along the last dim, when it reduces the last dim alone (set in pass).
  std::string last_dim_reduced_alone;
  // `simd`: on the CPU, the OpenMP reduction clauses ("reduction(+:acc3)") under which the
  // compiler may split the pass across vector lanes; empty for a pass whose order matters
  // (argmax).
  // `accs`: the pass's accumulators, declared at `depth` with their initial values.
  // `float_chunks`: a plain sum whose elements are float, half or bfloat16 into a double
  // accumulator; on the CPU its pass may run in chunks summed in float (cpu_float_chunks).
  // Its form where one thread runs it (schedule_cpu_pass_forms.cpp: a nest of an inner block, a
  // merged and a divided form, the nest's column block).
  const PassForm form = pass_form(self, reduced, depth, cooperative || columnar, arg);
  const bool nested = form.nested, two_forms = form.two_forms;
  const int64_t block = form.block;
  // A CPU pass down the nest's columns, which may run in its column block (cpu_column_block):
  // it offers its value to the elements as a row pass does (keep_row_value). (Not in a scatter
  // nest, whose body stores at the index's positions, not at its element.)
  const bool column_pass = target_ == Target::kCpu && mode_ == NestMode::kCpuLoops &&
                           cpu_keep_column_values_ && !scatter_ && element_level &&
                           !last_dim_reduced && !arg;
  auto pass = [&](const Combine& combine, const std::string& simd,
                  const std::vector<Accumulator>& accs, bool float_chunks = false) {
    std::string rl = fresh("rl");
    const size_t kept_from = kept_row_values_.size();
    const std::string ro = nested || two_forms ? fresh("ro") : "";
    const std::string merged = rl + "_merged";  // two_forms: whether the merged form runs
    // The divided form's index of each reduced dim. The merged form's positions over the dims
    // outside the innermost (rq, rl / 27) are positions of the divided form too (ro): a merge of
    // those dims (merged_terms) reads right in either form. A merge of rl's dims does not: the
    // merged form runs where those hold (merged_positions; in a nested pass, where every merge
    // holds: its ro is another position in each form).
    const std::map<int64_t, std::string> divided =
        two_forms ? divided_pass_indices(in.shape, reduced, ro, rl)
                  : std::map<int64_t, std::string>{};
    std::set<std::string> merged_positions{rl};
    if (nested) merged_positions.insert(ro);
    int64_t divided_within = 1;  // the divided form: ro's positions in one of the next rq's
    auto in_form = [&](const std::string& merged_expr, const std::string& divided_expr) {
      return two_forms ? "(" + merged + " ? " + merged_expr + " : " + divided_expr + ")"
                       : merged_expr;
    };
    const int level = static_cast<int>(levels_.size());
    levels_.emplace_back();
    level_of_[rl] = level;
    if (cooperative) {  // rl runs over the row's positions as block_loop(rl, count) does
      row_positions_[rl] = RowPosition{cache_slot(rl, row_lanes(count)), count, rl};
      level_of_[rl + "_trip"] = level_of_[rl + "_lane"] = level;
    }
    if (nested || two_forms) level_of_[ro] = level;
    Index index(static_cast<size_t>(in.rank()));
    std::string rest = rl;
    int64_t left = nested ? block : count;  // the positions rest runs over
    bool in_block = nested;                 // rest is a position in the inner block
    // A split row whose V lanes stay within the innermost reduced dim (its size a multiple of V)
    // indexes the other reduced dims once a trip.
    int64_t innermost = -1;  // the reduced dim that varies fastest with rl
    for (size_t r = reduced.size(); r-- > 0 && innermost < 0;)
      if (in.shape[static_cast<size_t>(reduced[r])] != 1) innermost = reduced[r];
    const bool trip_level = cooperative && split_rows_ && row_lanes(count) > 1 && innermost >= 0 &&
                            in.shape[static_cast<size_t>(innermost)] % row_lanes(count) == 0 &&
                            in.shape[static_cast<size_t>(innermost)] != count;
    auto declare_for_trip = [&](const std::string& name, const std::string& expr) {
      trip_fills_[rl] += "const int64_t " + name + " = " + expr + ";\n";
      level_of_[name] = level;
      trip_variables_.insert(name);
    };
    std::string same_as_rl;  // the reduced dim's variable, when it is rl itself
    size_t k = 0;
    for (int64_t d = 0; d < in.rank(); ++d) {
      if (std::find(reduced.begin(), reduced.end(), d) == reduced.end()) {
        index[static_cast<size_t>(d)] = at.at(k++);
      } else if (keepdim) {
        ++k;
      }
    }
    // A CPU pass over the last dim alone, with a strided scatter along it: rl runs over groups
    // of `split` positions, the element once for each residue (cpu_residue_split).
    const int64_t split = target_ == Target::kCpu && !cooperative && !columnar &&
                                  reduced.size() == 1 && reduced[0] == in.rank() - 1
                              ? cpu_residue_split(count)
                              : 0;
    for (size_t r = split ? 0 : reduced.size(); r-- > 0;) {
      int64_t d = reduced[r], size = in.shape[static_cast<size_t>(d)];
      if (size == 1) {
        index[static_cast<size_t>(d)] = IndexExpr::number(0);
        continue;
      }
      std::string var = fresh("rd");
      // (The last dim of the inner block takes the rest of rl; the dims outside it, ro's.)
      const bool last_needed = left == size;
      left /= size;
      if (last_needed) {
        if (rest == rl || !trip_level) {
          declare("int64_t", var, two_forms ? in_form(rest, divided.at(d)) : rest);
          note_divmod_alias(var, rest);
        } else {
          declare_for_trip(var, rest);
        }
        if (rest == rl) same_as_rl = var;
        if (rest == rl && d == in.rank() - 1 && !nested) last_dim_reduced_alone = var;
        if (auto p = row_positions_.find(rest); p != row_positions_.end())
          row_positions_[var] = p->second;  // the only reduced dim: var is rl
        if (in_block) {                     // the block's dims are indexed: the outer ones by ro
          rest = ro;
          left = count / block;
          in_block = false;
        }
      } else if (trip_level) {
        // A split row's trip: its lanes share every reduced dim's index but the innermost's
        // (whose size the lanes divide), so those are computed once a trip, from its first
        // position, before its vector loads (split_trip_load); the innermost is the trip's
        // first plus the lane.
        std::string from = rest == rl ? rl + "_base" : rest;
        if (rest == rl) {
          std::string first = fresh("rf");
          declare_for_trip(first, from + " % " + std::to_string(size));
          declare("int64_t", var, first + " + " + rl + "_lane");
          row_positions_[var] = RowPosition{"", count, rl, first};
        } else {
          declare_for_trip(var, from + " % " + std::to_string(size));
        }
        std::string next = fresh("rq");
        declare_for_trip(next, from + " / " + std::to_string(size));
        rest = next;
      } else {
        const std::string quotient = rest + " / " + std::to_string(size);
        std::string next = fresh("rq");
        if (two_forms) {
          declare("int64_t", var, in_form(rest + " % " + std::to_string(size), divided.at(d)));
          if (d != innermost) divided_within *= size;
          declare("int64_t", next,
                  nested ? quotient
                         : in_form(quotient,
                                   divided_within == 1
                                       ? ro
                                       : "(" + ro + " / " + std::to_string(divided_within) + ")"));
        } else {
          declare("int64_t", var, rest + " % " + std::to_string(size));
          declare("int64_t", next, quotient);
        }
        divmods_[{next, var}] = {rest, size};
        if (nested) merged_positions.insert(next);
        rest = next;
      }
      index[static_cast<size_t>(d)] = IndexExpr::bounded(var, 0, size - 1);
    }
    // The element at `index` (`position`: its place along the reduced dims, rl unless split):
    // its loads, the pass's stores, and its combine line, returned with its value in float.
    std::vector<std::pair<std::string, std::string>> combines;  // (line, value in float)
    DType element_dtype = DType::kFloat32;
    auto element = [&](const Index& index, const std::string& position) {
      if (before_row_stores) ++row_pass_depth_;
      Val x = eval(self, index);
      element_dtype = x.dtype;
      if (target_ == Target::kCpu && before_row_stores && !last_dim_reduced_alone.empty() && !split)
        keep_row_value(self, x, index, level, depth, count);
      if (column_pass) keep_row_value(self, x, index, level, depth, count, reduced);
      if (target_ == Target::kCuda && cooperative && !split_rows_ && before_row_stores &&
          !last_dim_reduced_alone.empty())
        keep_in_row_registers(self, x, index, level, depth, count);
      if (pass_stores_ && &node == pass_stores_->reduction) {
        // A row pass over the last dim alone, V neighbours a thread: the stores go out as vectors.
        // (In a split row's trip the lanes are neighbours along the innermost reduced dim too.)
        const bool row_vectors =
            cooperative && (reduced.size() == 1 || trip_level) && innermost == in.rank() - 1;
        store_in_pass(level, index, row_vectors ? row_lanes(count) : 1, rl + "_lane", depth);
      }
      if (before_row_stores) --row_pass_depth_;
      std::string converted = arg || x.dtype == out
                                  ? x.expr  // already exact in `out`, in its register type
                                  : (fl ? "f_" + suffix(out) + "(as_f(" + x.expr + "))"
                                        : "i_" + suffix(out) + "(as_i(" + x.expr + "))");
      const std::string in_float = "static_cast<float>(" + converted + ")";
      if (fl && !arg) converted = "static_cast<" + element_type + ">(" + converted + ")";
      combines.emplace_back(combine(converted, position), in_float);
      emit(level, combines.back().first);
    };
    if (!split) element(index, rl);
    const auto d = static_cast<size_t>(in.rank() - 1);
    for (int64_t r = 0; r < split; ++r) {  // rd = split * rl + r, its residue known
      std::string var = fresh("rd");
      declare("int64_t", var, rl + " * " + std::to_string(split) + " + " + std::to_string(r));
      IndexExpr at_residue = IndexExpr::bounded(var, r, count - split + r);
      at_residue.modulus = split;
      at_residue.residue = r;
      at_residue.quotient = rl;
      index[d] = at_residue;
      element(index, var);
    }
    std::string body = close_level(level);
    if (cooperative) {
      BlockLoop loop = block_loop(rl, "int64_t", count);
      levels_.at(static_cast<size_t>(depth)) += indented(loop.open + body + loop.close, 0);
    } else if (columnar) {  // this thread's lane takes every column_lanes_-th element
      // (of its part's, when the tile is split: the parts take turns, lanes elements each)
      const std::string lanes = std::to_string(column_lanes_);
      emit(depth, "#pragma unroll 4");
      if (split_columns_)
        emit(depth, "for (int64_t " + rl + " = column_lane + static_cast<int64_t>(part) * " +
                        lanes + "; " + rl + " < " + count_text() + "; " + rl +
                        " += static_cast<int64_t>(split) * " + lanes + ") {");
      else
        emit(depth, "for (int64_t " + rl + " = column_lane; " + rl + " < " + count_text() + "; " +
                        rl + " += " + lanes + ") {");
      levels_.at(static_cast<size_t>(depth)) += indented(body, 1);
      emit(depth, "}");
    } else {
      // (Not a sum into float64: sum(x, dtype=float64) adds its elements in double, as eager.)
      const bool float_sum = target_ == Target::kCpu && float_chunks && fl && !arg &&
                             element_type == "double" && dtype_size(element_dtype) <= 4 &&
                             is_floating(element_dtype) && dtype_size(out) <= 4 && accs.size() == 1;
      const bool in_column_block = serial_pass_loops(
          SerialPass{.depth = depth,
                     .count = count,
                     .count_text = count_text,
                     .runtime_count = runtime_count,
                     .rl = rl,
                     .ro = ro,
                     .merged_positions = merged_positions,
                     .body = body,
                     .simd = simd,
                     .accs = accs,
                     .combines = combines,
                     .float_sum = float_sum,
                     .stores_in_pass = pass_stores_ && &node == pass_stores_->reduction,
                     .split = split,
                     .same_as_rl = same_as_rl,
                     .form = form});
      if (column_pass && !in_column_block) withdraw_kept_values(kept_from);
    }
  };

  // The line that combines the threads' partial results `a` of a shared reduction, if any.
  auto combine = [&](const std::string& a, const std::string& op) {
    if (cooperative) emit(depth, a + " = " + row_combine(op, a) + ";");
    const std::string shape = std::to_string(column_tile_) + ", " + std::to_string(column_lanes_);
    if (columnar && split_columns_)
      emit(depth, a + " = grid_column_" + op + "<" + shape + ">(" + a + ", ws, " +
                      std::to_string(grid_combines_++) + ", tiles, split, tile, part);");
    else if (columnar)
      emit(depth, a + " = column_" + op + "<" + shape + ">(" + a + ");");
  };
  std::string acc = fresh("acc");
  auto finish = [&](const std::string& op) { combine(acc, op); };
  // A sum this nest already has, over the same elements at the same output element, in the same
  // accumulator: its accumulator is read again and its pass not run again. A layer norm summed
  // each row twice, for its mean and for its variance's own mean (the CPU's layer norm over rows
  // of 8192 read each row four times). Not where this reduction's pass stores values, nor
  // from a pass under a guard (its accumulator is out of scope after it).
  // The elements summed: the output element's index, `*` on each reduced dim (x.sum(0) and
  // x.sum(1) of a square x at the same i0 are different sums).
  std::string non_reduced;
  for (size_t d = 0, k = 0; d < static_cast<size_t>(in.rank()); ++d) {
    const bool is_reduced =
        std::find(reduced.begin(), reduced.end(), static_cast<int64_t>(d)) != reduced.end();
    non_reduced += (is_reduced ? std::string("*") : at.at(k).text) + ",";
    if (!is_reduced || keepdim) ++k;
  }
  const bool stores_in_pass = pass_stores_ && &node == pass_stores_->reduction;
  // (Into a double accumulator every element enters exactly, whatever type it is taken in.)
  auto summed_key = [&](const std::string& accumulator) {
    const bool exact = accumulator.rfind("double", 0) == 0;
    return std::to_string(self->id()) + "|" + suffix(out) + "|" + accumulator + "|" +
           (exact ? "" : element_type) + "|" + non_reduced;
  };
  auto summed_before = [&](const std::string& accumulator) -> std::optional<std::string> {
    auto it = sums_.find(summed_key(accumulator));
    if (stores_in_pass || it == sums_.end()) return std::nullopt;
    return it->second;
  };
  auto note_sum = [&](const std::string& accumulator, const std::string& name) {
    if (guard_depth_ == 0) sums_.emplace(summed_key(accumulator), name);
  };
  std::string result;
  switch (id) {
    case OpId::kSum:
    case OpId::kMean:
    case OpId::kProd: {
      bool prod = id == OpId::kProd;
      const char* op = prod ? "prod" : "sum";
      // (a variance's sum, element by element, serves as well: kept below)
      std::optional<std::string> before;
      if (!prod) before = summed_before(acc_type + " element by element");
      if (!prod && !before) before = summed_before(acc_type);
      if (before) {
        acc = *before;
      } else {
        emit(depth, acc_type + " " + acc + " = " + (prod ? "1" : "0") + ";", acc);
        pass([&](const std::string& x,
                 const std::string&) { return acc + " = red_" + op + "(" + acc + ", " + x + ");"; },
             std::string(prod ? "reduction(*:" : "reduction(+:") + acc + ")",
             {{acc, acc_type, prod ? "1" : "0"}}, !prod && !exact_sums_.contains(&node));
        finish(op);
        if (!prod) note_sum(acc_type, acc);
      }
      if (id == OpId::kMean)
        result = "f_" + suffix(out) + "(" + acc + " / " + count_double() + ")";
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
        // floats took 95 us instead of 16). The flag is as wide as the accumulator, so that both
        // fill a vector alike (an int64_t flag beside a float max: a softmax 8% slower).
        std::string nan = fresh("nan");
        const std::string flag_type = acc_type == "float" ? "int32_t" : "int64_t";
        emit(depth, flag_type + " " + nan + " = 0;", nan);
        pass(
            [&](const std::string& x, const std::string&) {
              return acc + " = " + x + (max ? " > " : " < ") + acc + " ? " + x + " : " + acc +
                     "; " + nan + " |= " + x + " != " + x + ";";
            },
            "reduction(" + std::string(op) + ":" + acc + ") reduction(|:" + nan + ")",
            {{acc, acc_type, init}, {nan, flag_type, "0"}});
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
      const std::string& vt = element_type;  // float on CUDA for short ones, else double
      // The mean's sum is exact where the elements are equal: in double (on CUDA too, where
      // the deviations are then taken in float), and on the CPU element by element, never a
      // float chunk's sum (cpu_float_chunks). With a rounded sum the deviations of a constant
      // row are not 0, and `v / v` of its variance was 1 where the interpreter's, and eager's
      // (Welford's mean stays the element), is 0 / 0 (kiln_fuzz, 2026-12-05; CUDA, the H200
      // suite). A sum kept for sharing says which it is.
      const bool exact = target_ == Target::kCpu;
      const std::string kept = exact ? "double element by element" : "double";
      if (std::optional<std::string> before = summed_before(kept)) {
        acc = *before;
      } else {
        emit(depth, "double " + acc + " = 0;", acc);
        pass(
            [&](const std::string& x, const std::string&) {
              return acc + " = red_sum(" + acc + ", " +
                     (vt == "double" ? x : "static_cast<double>(" + x + ")") + ");";
            },
            "reduction(+:" + acc + ")", {{acc, "double", "0"}}, !exact);
        finish("sum");
        note_sum(kept, acc);
      }
      std::string mean = fresh("mean");
      declare(vt, mean,
              vt == "double" ? acc + " / double(" + count_double() + ")"
                             : "static_cast<" + vt + ">(" + acc + " / " + count_double() + ")");
      std::string m2 = fresh("acc");
      emit(depth, vt + " " + m2 + " = 0;", m2);
      pass(
          [&](const std::string& x, const std::string&) {
            std::string dev = "(" + x + " - " + mean + ")";
            return m2 + " = red_sum(" + m2 + ", " + dev + " * " + dev + ");";
          },
          "reduction(+:" + m2 + ")", {{m2, vt, "0"}});
      combine(m2, "sum");
      // max(N - correction, 0), as a variable: a constant 0 would be a division-by-zero warning.
      std::string divisor = fresh("n");
      std::string excess = "(" + count_double() + " - " + correction.as_double + ")";
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
                                        ") && (" + xv + " != " + xv + " || " + xv + better + best +
                                        ")))"
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

// Whether v is a reduction of the region or computed from one.
bool KernelEmitter::holds_reduction(const Value* v) {
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

// The outputs over the domain of the region's one reduction (analysis/pass_stores.h), stored
// in its pass at the element `at` the pass loads, by the thread that loads it: each element of
// the domain once. A columns nest's threads past its last element repeat that element's pass
// and store nothing. In a row pass whose thread takes `lanes` neighbours at a time (lane
// variable `lane`), each lane's value waits in registers declared at `outer` (the pass's
// level), and the last lane stores them as one vector where the row is contiguous and aligned
// (scalar stores of every 8th bf16 made the bf16 row sum's pass slower than a nest of its own):
//   pass_out0[rl_lane] = v;  if (rl_lane == 7) { a0 = <address> - 7 * os0_1; vector_store }
void KernelEmitter::store_in_pass(int level, const Index& at, int lanes, const std::string& lane,
                                  int outer) {
  pass_store_keys_.insert(index_key(at));
  for (size_t j = 0; j < kernel_->outputs.size(); ++j) {
    if (kernel_->outputs[j].shape != pass_stores_->domain) continue;
    kernel_->outputs[j].in_last_nest = nest_is_last_;
    Val v = eval(body_.outputs()[j], at);
    const DType d = kernel_->outputs[j].dtype;
    std::string n = std::to_string(j);
    const IndexExpr address = output_address(j, at);
    if (lanes <= 1) {  // (on the CPU in its merged form where it has one: merged_address)
      const std::string at_address =
          strided_address("oo" + n, "os" + n + "_", kernel_->outputs[j].shape, at);
      std::string store = "st_" + suffix(d) + "(out" + n + ", " + at_address + ", " + v.expr + ");";
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

}  // namespace kiln::codegen::detail
