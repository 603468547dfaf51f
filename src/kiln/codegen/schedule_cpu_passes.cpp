// CPU reduction passes: column blocks, float chunks, pieces between guards, row buffers (the
// form a pass takes: schedule_cpu_pass_forms.cpp).
// Part of the kernel emitter (kernel_emitter.h).
#include <cctype>

#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

namespace {

// `text` with the variable `from` (a whole identifier, never part of a longer one) named `to`.
std::string renamed_variable(const std::string& text, const std::string& from,
                             const std::string& to) {
  auto identifier = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t found = text.find(from, at);
    if (found == std::string::npos) break;
    const size_t end = found + from.size();
    const bool whole = (found == 0 || !identifier(text[found - 1])) &&
                       (end == text.size() || !identifier(text[end]));
    out += text.substr(at, found - at) + (whole ? to : from);
    at = end;
  }
  return out + text.substr(at);
}

}  // namespace

// The opening of a CPU nest's last loop split into column blocks of kCpuColumnBlock positions
// (cb, cw of them), whose column reductions' passes run first (cpu_column_block); the caller
// opens the loop over the block's positions and closes both.
std::string KernelEmitter::column_block_loop(const std::string& length, const std::string& passes,
                                             const std::string& pad) {
  const std::string width = std::to_string(kCpuColumnBlock);
  std::string out = pad + "  for (int64_t cb = 0; cb < " + length + "; cb += " + width + ") {\n";
  out += pad + "    const int64_t cw = " + length + " - cb < " + width + " ? " + length +
         " - cb : " + width + ";\n";
  return out + indented(passes, static_cast<int>(pad.size() / 2) + 2);
}

// A CPU row pass's value `x` of `v` at `index` (the row's indices, then the pass's variable
// along the last dim), offered to the row's elements, which then read it back instead of
// computing it again: softmax's exp(x - max), summed in the pass, then divided by the sum,
// computed each exp twice. The pass holds a marker where the value's store goes; the row's first
// read decides where it is kept (read_kept_row_value), and a value nothing reads (a variance's
// squares, whose pass keeps them as softmax's exp, though only the centered values are read
// again) costs neither a store nor a buffer (place_kept_row_values). Not for a value that is a
// load (a second load costs what the buffer would).
//   pass:    e = exp(x[r, rl] - m); /* kept row value 0: store */ s += e
//   element: y = row_buffer0[i1] * (1 / s)      (the marker now: row_buffer0[rl] = e;)
// A column pass's value (`across_rows`: the dims it runs over, the last kept) likewise, kept in an
// output alone (keep_in_output): the column block runs its passes over all of the block's rows
// before its last loop, so each element's value is stored before the element reads it. Offered
// as the pass is made, and withdrawn (withdraw_kept_values) where it does not run in the block.
// softmax(x, 0) of 640 x 64 floats computed each exp twice, and took 1.2x eager's time.
void KernelEmitter::keep_row_value(const Value* v, const Val& x, const Index& index, int level,
                                   int depth, int64_t count,
                                   const std::vector<int64_t>& across_rows) {
  const Node* node = defining_node(v);
  if (!node || node->op->kind == OpKind::kView) return;
  if (v->tensor_type().shape != nest_shape_) return;
  const std::optional<std::string> key = row_element_key(v, index, across_rows);
  if (!key) return;
  KeptRowValue kept;
  kept.key = *key;
  kept.value = x;
  kept.index = index;
  kept.count = count;
  kept.across_rows = across_rows;
  kept.marker = "kept row value " + std::to_string(kept_row_values_.size());
  if (kept.across_rows.empty()) emit(depth, "/* " + kept.marker + ": declaration */");
  emit(level, "/* " + kept.marker + ": store */");
  kept_row_values_.push_back(std::move(kept));
}

// The values offered from the kept_row_values_[from] on, taken back before any element read
// them: their pass runs outside the column block, at each element, where a store at every row of
// the column would overwrite the elements stored before.
void KernelEmitter::withdraw_kept_values(size_t from) {
  for (size_t i = from; i < kept_row_values_.size(); ++i) {
    KILN_ASSERT(!kept_row_values_[i].read) << "a kept value read before its pass was placed";
    kept_row_values_[i].withdrawn = true;
  }
}

// Throws ColumnValueKeptUnderItsRows where a column pass's value is kept in an output and the
// nest's column block opens inside a loop over a dim the pass runs down.
void KernelEmitter::check_kept_column_values(const Shape& shape, const NestBody& body) const {
  std::optional<size_t> outside;  // (column_block_outside, once a nest)
  for (const KeptRowValue& k : kept_row_values_) {
    if (k.across_rows.empty() || k.withdrawn || k.store.empty()) continue;
    KILN_ASSERT(!body.column_block.empty()) << "a column pass's kept value without a column block";
    if (!outside) outside = column_block_outside(shape, body);
    for (int64_t d : k.across_rows)
      if (static_cast<size_t>(d) < *outside) throw ColumnValueKeptUnderItsRows{};
  }
}

// The value a row pass keeps (keep_row_value) for the memo key `key` at the row's element, if
// any: at its first read kept in a row buffer, past kMaxRowBufferBytes for the nest's buffers
// together (each thread's stack holds them) in the row's own place in an output, or, where
// neither may hold it, nowhere (the row's element computes it again). A column pass's value in
// an output alone.
std::optional<Val> KernelEmitter::read_kept_row_value(const std::string& key) {
  auto kept = std::find_if(kept_row_values_.begin(), kept_row_values_.end(),
                           [&](const KeptRowValue& k) { return k.key == key; });
  if (kept == kept_row_values_.end() || kept->withdrawn) return std::nullopt;
  if (!kept->read) {
    kept->read = true;
    if (!kept->across_rows.empty() || !keep_in_row_buffer(*kept)) keep_in_output(*kept);
  }
  if (kept->load.empty()) return std::nullopt;
  return Val{kept->load, kept->value.dtype};
}

bool KernelEmitter::keep_in_row_buffer(KeptRowValue& kept) {
  const Val& x = kept.value;
  const int64_t bytes = kept.count * (reg(x.dtype) == "float" ? 4 : 8);  // in its register type
  if (row_buffer_bytes_ + bytes > kMaxRowBufferBytes) return false;
  row_buffer_bytes_ += bytes;
  const std::string buffer = fresh("row_buffer");
  kept.declaration =
      "alignas(64) " + reg(x.dtype) + " " + buffer + "[" + std::to_string(kept.count) + "];";
  kept.store = buffer + "[" + kept.index.back().text + "] = " + x.expr + ";";
  kept.load = buffer + "[i" + std::to_string(nest_rank_ - 1) + "]";
  return true;
}

// A row pass's value kept in an output of the nest instead of a row buffer, at the element the
// pass is at, as eager's CPU softmax keeps exp(x - max) in its result between its sum and its
// scaling: for rows of 2^20 floats, computing each exp twice took 1.26x eager's time. The output
// must be a buffer of the nest's own (no writeback's value, which the executor may store into an
// input's memory that the nest reads after the pass: x[:, :n] = softmax(x[:, :n]) * x[:, :n]), of
// the value's dtype exactly (float32 or float64: stored and loaded back unrounded), held for no
// other value, and stored by the nest only after its iteration has read it back: the element loop
// computes every value before it stores any (emit_body), and no pass of the region stores
// (pass_stores_).
//   pass:    e = exp(x[r, rl] - m); st(out0, r, rl, e); s += e
//   element: y = ld(out0, r, i1) * (1 / s); st(out0, r, i1, y)
bool KernelEmitter::keep_in_output(KeptRowValue& kept) {
  const DType dtype = kept.value.dtype;
  if (pass_stores_ || (dtype != DType::kFloat32 && dtype != DType::kFloat64)) return false;
  for (size_t j = 0; j < kernel_->outputs.size(); ++j) {
    const bool taken = std::any_of(kept_row_values_.begin(), kept_row_values_.end(),
                                   [&](const KeptRowValue& k) { return k.output == j; });
    if (kernel_->outputs[j].shape != nest_shape_ || kernel_->outputs[j].dtype != dtype ||
        written_back(j) || taken)
      continue;
    const std::string n = std::to_string(j), d = suffix(dtype);
    kept.output = j;
    kept.store = "st_" + d + "(out" + n + ", " + output_address(j, kept.index).text + ", " +
                 kept.value.expr + ");";
    kept.load =
        "ld_" + d + "(out" + n + ", " + output_address(j, loop_index(nest_shape_)).text + ")";
    return true;
  }
  return false;
}

// The row passes' markers (keep_row_value) made the kept values' stores and buffers'
// declarations, or taken out with their lines where nothing holds the value. The pass's text has
// moved out of its level into its loop by now (at the level above), once or more
// (cpu_float_chunks' lanes and the rest of the chunk).
void KernelEmitter::place_kept_row_values() {
  // Each line holding `marker` (with its indentation) made `line`, or taken out if it is empty.
  std::vector<std::string*> texts;
  for (std::string& text : levels_)
    texts.push_back(&text);
  for (ColumnPass& pass : column_passes_)  // (a column pass's text is its block's by now)
    texts.push_back(&pass.element);
  auto replace_lines = [&texts](const std::string& marker, const std::string& line) {
    bool found = false;
    for (std::string* held : texts) {
      std::string& text = *held;
      for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at)) {
        found = true;
        const size_t newline = text.rfind('\n', at);
        const size_t start = newline == std::string::npos ? 0 : newline + 1;
        const size_t end = text.find('\n', at);
        KILN_ASSERT(end != std::string::npos) << "a kept row value's marker ends no line";
        const std::string indent = text.substr(start, at - start);
        const std::string made = line.empty() ? "" : indent + line + "\n";
        text.replace(start, end + 1 - start, made);
        at = start + made.size();
      }
    }
    return found;
  };
  for (const KeptRowValue& k : kept_row_values_) {
    KILN_ASSERT((!k.across_rows.empty() ||
                 replace_lines("/* " + k.marker + ": declaration */", k.declaration)) &&
                replace_lines("/* " + k.marker + ": store */", k.store))
        << "a row pass's kept value: its marker is not in the nest's text";
  }
}

// The memo key of `v` at the row's element whose last index a row pass's `index` runs over (the
// same indices but the last; a column pass's: but the dims `along` it runs): none where `index`
// is not that, or where v is known there already or is computed under a guard
// (keep_in_row_buffer, keep_in_row_registers).
std::optional<std::string> KernelEmitter::row_element_key(const Value* v, const Index& index,
                                                          const std::vector<int64_t>& along) const {
  Index element = index;
  if (along.empty()) element.back() = IndexExpr::var("i" + std::to_string(nest_rank_ - 1));
  for (int64_t d : along)
    if (!index.at(static_cast<size_t>(d)).constant)  // (a dim of 1 is 0 in both)
      element.at(static_cast<size_t>(d)) = IndexExpr::var("i" + std::to_string(d));
  const Index loop = loop_index(nest_shape_);
  if (index_key(element) != index_key(loop)) return std::nullopt;
  std::string key = std::to_string(v->id()) + "@" + index_key(loop);
  const bool offered = std::any_of(kept_row_values_.begin(), kept_row_values_.end(),
                                   [&](const KeptRowValue& k) { return k.key == key; });
  if (guard_depth_ > 0 || memo_.contains(key) || offered) return std::nullopt;
  return key;
}

// A guard that compares the loop variable `x` with `at` (a slice_scatter's, select_scatter's or
// cat's bounds): a CPU pass over x may run as one loop per piece between such bounds.
void KernelEmitter::note_cut(const IndexExpr& x, int64_t at) {
  const std::vector<std::string_view> names = variables_in(x.text);
  if (names.size() == 1 && names[0] == x.text) cuts_[x.text].insert(at);
}

// The bounds of the pieces of a CPU pass over [0, count) whose variable `var` its guards
// compare with constants (note_cut): {0, cut, ..., count}. In each piece the compiler knows
// every guard's value from the loop's bounds, so the selects fold and the loop is a plain
// vector loop. In one loop, x[:, :2048].clamp_(-1, 1) before x.sum(-1) loaded the clamped
// half at `c ? rd : 0`, a masked gather GCC did not vectorize: the row sum of 1024 x 4096
// floats took 3.3 ms against eager's 0.34. At most kMaxPassPieces pieces (the body is repeated).
std::vector<int64_t> KernelEmitter::pieces_between_cuts(const std::string& var,
                                                        int64_t count) const {
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
std::optional<std::string> KernelEmitter::column_block_fits(
    const std::string& body, int depth, bool last_dim_reduced,
    const std::vector<Accumulator>& accs) const {
  if (target_ != Target::kCpu || mode_ != NestMode::kCpuLoops || nest_rank_ == 0 ||
      depth != nest_rank_ || last_dim_reduced)
    return std::nullopt;
  const std::string last = "i" + std::to_string(nest_rank_ - 1);
  if (!level_of_.contains(last)) return std::nullopt;  // a last dim of 1
  for (std::string_view name : variables_in(body)) {
    if (name == last ||
        std::any_of(accs.begin(), accs.end(), [&](const Accumulator& a) { return a.name == name; }))
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
// A pass over as many rows that needs nothing of the element's code and no accumulator of the
// block's earlier passes joins the last pass's loop, its loop variable renamed: the rows are
// read once for both. (A layer norm's weight and bias gradients, (g * xhat).sum(0) and
// g.sum(0), read g twice, and the columns' rows are a new page each.)
//   for (rl1 < 4096) { omp simd for (cj < cw) { ... acc0 ...; ... acc7 ... } }
void KernelEmitter::cpu_column_block(
    const std::string& rl, int64_t count, const std::string& count_text, const std::string& body,
    const std::vector<Accumulator>& accs, const std::string& element, const std::string& simd,
    const std::vector<std::pair<std::string, std::string>>& float_sum) {
  const std::string width = std::to_string(kCpuColumnBlock);
  std::string arrays, take = element, keep, summed = body;
  // A float sum (its one accumulator's combine lines given, each with its element in float):
  // summed in float over a chunk's rows, as cpu_float_chunks sums a row's: a double accumulator
  // took a conversion and half the vector lanes a float. (A channels-last x.mean((2, 3)): 2.3-3.3x
  // eager's time in double; 0.76x in float chunks, with GCC's unroll-and-jam off: compiler.cpp.)
  std::vector<std::string> float_sums;
  if (!float_sum.empty()) {
    const std::string part = accs.front().name + "_f";
    for (const auto& [combined, in_float] : float_sum) {
      const size_t at = summed.find(combined);
      KILN_ASSERT(at != std::string::npos) << "a sum's pass without its combine";
      summed.replace(at, combined.size(), part + " = red_sum(" + part + ", " + in_float + ");");
    }
    float_sums.push_back(accs.front().name);
  }
  // The pass's reductions over its rows as its arrays' ("reduction(+:acc0)" ->
  // "reduction(+:acc0_b[:64])"), where it has them.
  std::optional<std::string> row_reductions;
  if (!simd.empty()) row_reductions = simd;
  for (const Accumulator& a : accs) {
    arrays += a.type + " " + a.name + "_b[" + width + "];\n";
    arrays +=
        "for (int64_t cj = 0; cj < " + width + "; ++cj) " + a.name + "_b[cj] = " + a.init + ";\n";
    if (!float_sums.empty()) {  // (the chunk's float sum, not the accumulator)
      take += "float " + a.name + "_f = " + a.name + "_f_b[cj];\n";
      keep += a.name + "_f_b[cj] = " + a.name + "_f;\n";
    } else {
      take += (element.empty() ? a.type + " " : "") + a.name + " = " + a.name + "_b[cj];\n";
      keep += a.name + "_b[cj] = " + a.name + ";\n";
    }
    const std::string item = ":" + a.name + ")";
    if (!row_reductions) continue;
    const size_t at = row_reductions->find(item);
    if (at == std::string::npos) {
      row_reductions.reset();
      continue;
    }
    row_reductions->replace(at, item.size(), ":" + a.name + "_b[:" + width + "])");
  }
  auto uses_earlier_accumulator = [this](const std::string& text) {
    for (std::string_view name : variables_in(text))
      for (const std::string& acc : column_block_accumulators_)
        if (name == acc || name == acc + "_b") return true;
    return false;
  };
  const bool joins = !column_passes_.empty() && column_passes_.back().count == count &&
                     element.empty() && !uses_earlier_accumulator(body);
  for (const Accumulator& a : accs)
    column_block_accumulators_.push_back(a.name);
  if (!joins) {
    column_passes_.push_back(ColumnPass{rl, count, count_text, arrays, take + summed + keep,
                                        row_reductions, float_sums});
    return;
  }
  ColumnPass& joined = column_passes_.back();
  joined.arrays += arrays;
  joined.element += renamed_variable(take + summed + keep, rl, joined.rl);
  joined.float_sums.insert(joined.float_sums.end(), float_sums.begin(), float_sums.end());
  if (joined.row_reductions && row_reductions)
    *joined.row_reductions += " " + *row_reductions;
  else
    joined.row_reductions.reset();
}

// A column pass's loop over its rows (`rows`, from 0 to its count) in chunks of
// kCpuColumnChunkRows, its float sums zeroed before each chunk and added to their double
// accumulators after it:
//   for (rl1_c = 0; rl1_c < e1; rl1_c += 64) { float acc0_f_b[64] = 0...; rl1_e = ...;
//     for (rl1 = rl1_c; rl1 < rl1_e; ++rl1) {...}  for (cj) acc0_b[cj] += acc0_f_b[cj]; }
std::string KernelEmitter::column_float_chunks(const ColumnPass& pass, std::string rows) {
  const std::string chunk = pass.rl + "_c", end = pass.rl + "_e", n = pass.count_text;
  const std::string height = std::to_string(kCpuColumnChunkRows);
  const std::string head = "for (int64_t " + pass.rl + " = 0;";
  KILN_ASSERT(rows.rfind(head, 0) == 0) << "a column pass's loop";
  rows.replace(0, head.size(), "for (int64_t " + pass.rl + " = " + chunk + ";");
  const std::string bound = pass.rl + " < " + n + ";";
  rows.replace(rows.find(bound), bound.size(), pass.rl + " < " + end + ";");
  std::string out = "for (int64_t " + chunk + " = 0; " + chunk + " < " + n + "; " + chunk +
                    " += " + height + ") {\n";
  for (const std::string& acc : pass.float_sums)
    out += "  float " + acc + "_f_b[" + std::to_string(kCpuColumnBlock) +
           "];\n  for (int64_t cj = 0; cj < " + std::to_string(kCpuColumnBlock) + "; ++cj) " + acc +
           "_f_b[cj] = 0;\n";
  out += "  const int64_t " + end + " = " + n + " - " + chunk + " < " + height + " ? " + n + " : " +
         chunk + " + " + height + ";\n";
  out += indented(rows, 1);
  for (const std::string& acc : pass.float_sums)
    out += "  #pragma omp simd\n  for (int64_t cj = 0; cj < cw; ++cj) " + acc + "_b[cj] += " + acc +
           "_f_b[cj];\n";
  return out + "}\n";
}

// The column block's passes as code: each pass's arrays, then its loop over the rows, a vector
// loop over the block's columns inside. With `shared_rows`, every pass's rows shared by the team
// of the region cpu_column_block_loops opens (empty where a pass cannot be): the arrays first,
// outside it (the team's partial arrays combine into them at the end of each pass's loop):
//   float acc3_b[64]; ...; double acc0_b[64]; ...
//   [#pragma omp parallel ... {]  #pragma omp for reduction(max:acc3_b[:64])  for (rl5 < e1) ...
std::string KernelEmitter::column_block_text(bool shared_rows) const {
  std::string arrays, loops;
  for (const ColumnPass& pass : column_passes_) {
    if (shared_rows && !pass.row_reductions) return "";
    std::string loop = shared_rows ? "#pragma omp for " + *pass.row_reductions + "\n" : "";
    std::string rows = "for (int64_t " + pass.rl + " = 0; " + pass.rl + " < " + pass.count_text +
                       "; ++" + pass.rl + ") {\n";
    rows += "#pragma omp simd\n  for (int64_t cj = 0; cj < cw; ++cj) {\n";
    rows +=
        "    [[maybe_unused]] const int64_t i" + std::to_string(nest_rank_ - 1) + " = cb + cj;\n";
    rows += indented(pass.element, 2) + "  }\n}\n";
    loop += pass.float_sums.empty() ? rows : column_float_chunks(pass, rows);
    if (shared_rows) {
      arrays += pass.arrays;
      loops += loop;
    } else {
      loops += pass.arrays + loop;
    }
  }
  return arrays + loops;
}

// A CPU sum's pass over [from, to) whose elements are float (or half, bfloat16) into a double
// accumulator, in chunks of kCpuFloatChunk elements (rl takes `group` of them a step: a pass
// split by residue): each chunk is summed in float (the vector loop adds floats, no
// conversions), and the chunk's sum is added to the double accumulator. The body's combine
// lines (`combines`: each with its element's value in float) are its double sums; here float.
//   for (rc = 0; rc < 4096; rc += 1024) { float acc0_f = 0; const int64_t rc_end = ...;
//     #pragma omp simd reduction(+:acc0_f)  for (rl1 = rc; rl1 < rc_end; ++rl1) {... acc0_f += x}
//     acc0 += acc0_f; }
// A chunk of at least kCpuMinLaneBlocks blocks of lanes sums them in lanes first (cpu_sum_lanes).
// A pass at the nest's top over many elements (a full sum) shares its chunks among the cores.
void KernelEmitter::cpu_float_chunks(
    const std::string& rl, int64_t from, int64_t to, const std::string& to_text, int64_t group,
    const std::string& body, const std::vector<std::pair<std::string, std::string>>& combines,
    const std::string& acc, int depth, bool team) {
  const std::string part = acc + "_f", chunk = rl + "_c", end = rl + "_e";
  std::string in_chunk = body;
  for (const auto& [combined, in_float] : combines) {
    const size_t at = in_chunk.find(combined);
    KILN_ASSERT(at != std::string::npos) << "a sum's pass without its combine";
    in_chunk.replace(at, combined.size(), part + " = red_sum(" + part + ", " + in_float + ");");
  }
  const int64_t steps = std::max<int64_t>(kCpuFloatChunk / group, 1);
  const std::string f = std::to_string(from), width = std::to_string(steps);
  const std::string t = to_text.empty() ? std::to_string(to) : to_text;
  const bool one_chunk = to - from <= steps;  // then a block, not a loop over chunks
  if (team && !one_chunk && depth == 0 && parallel_worth((to - from) * group))
    emit(depth, "#pragma omp parallel for reduction(+:" + acc + ")" +
                    team_clause({(to - from) * group,
                                 to_text.empty() ? std::to_string(to - from) : to_text, group}));
  emit(depth, one_chunk ? "{"
                        : "for (int64_t " + chunk + " = " + f + "; " + chunk + " < " + t + "; " +
                              chunk + " += " + width + ") {");
  emit(depth, "  float " + part + " = 0;");
  if (!one_chunk)
    emit(depth, "  const int64_t " + end + " = " + t + " - " + chunk + " < " + width + " ? " + t +
                    " : " + chunk + " + " + width + ";");
  const std::string first = one_chunk ? f : chunk, last = one_chunk ? t : end;
  // A long chunk's elements in lanes of partial sums first (cpu_sum_lanes), the rest after them.
  const bool in_lanes = std::min(to - from, steps) >= kCpuMinLaneBlocks * kCpuSumLanes;
  const std::string rest =
      in_lanes ? cpu_sum_lanes(rl, first, last, body, combines, part, depth) : first;
  emit(depth, "  #pragma omp simd reduction(+:" + part + ")");
  emit(depth,
       "  for (int64_t " + rl + " = " + rest + "; " + rl + " < " + last + "; ++" + rl + ") {");
  levels_.at(static_cast<size_t>(depth)) += indented(in_chunk, 2);
  emit(depth, "  }");
  if (in_lanes)
    emit(depth, "  #pragma omp simd reduction(+:" + part + ")\n  for (int64_t k = 0; k < " +
                    std::to_string(kCpuSumLanes) + "; ++k) " + part + " += " + part + "_l[k];");
  emit(depth, "  " + acc + " += " + part + ";");
  emit(depth, "}");
}

// cpu_float_chunks' chunk over [first, last) in blocks of kCpuSumLanes elements, each element
// summed into its lane's float (part_l[k]: independent vector adds, where one accumulator waits
// for its last add); returns the variable where the chunk's rest starts, which the caller sums
// into `part` before the lanes' sum.
//   alignas(64) float acc0_f_l[32] = {};
//   int64_t rl1_b = rl1_c;
//   for (; rl1_b + 32 <= rl1_e; rl1_b += 32) {
//     #pragma omp simd
//     for (int64_t rl1_k = 0; rl1_k < 32; ++rl1_k) { const int64_t rl1 = rl1_b + rl1_k; ...
//       acc0_f_l[rl1_k] = red_sum(acc0_f_l[rl1_k], x); } }
std::string KernelEmitter::cpu_sum_lanes(
    const std::string& rl, const std::string& first, const std::string& last,
    const std::string& body, const std::vector<std::pair<std::string, std::string>>& combines,
    const std::string& part, int depth) {
  const std::string lanes = part + "_l", block = rl + "_b", lane = rl + "_k";
  const std::string width = std::to_string(kCpuSumLanes);
  std::string in_lane = body;
  for (const auto& [combined, in_float] : combines) {
    const size_t at = in_lane.find(combined);
    KILN_ASSERT(at != std::string::npos) << "a sum's pass without its combine";
    in_lane.replace(
        at, combined.size(),
        lanes + "[" + lane + "] = red_sum(" + lanes + "[" + lane + "], " + in_float + ");");
  }
  emit(depth, "  alignas(64) float " + lanes + "[" + width + "] = {};");
  emit(depth, "  int64_t " + block + " = " + first + ";");
  emit(depth,
       "  for (; " + block + " + " + width + " <= " + last + "; " + block + " += " + width + ") {");
  emit(depth, "    #pragma omp simd");
  emit(depth, "    for (int64_t " + lane + " = 0; " + lane + " < " + width + "; ++" + lane + ") {");
  emit(depth, "      const int64_t " + rl + " = " + block + " + " + lane + ";");
  levels_.at(static_cast<size_t>(depth)) += indented(in_lane, 3);
  emit(depth, "    }");
  emit(depth, "  }");
  return block;
}

// The residue split of a CPU pass over the last dim alone (its `count` positions): the step of a
// slice_scatter along a last dim of that length in the region (x[:, ::2].copy_(y) before
// x.sum(-1)), when the positions divide into groups of it; 0 for none. The pass then runs over
// groups, the element emitted once for each residue, where whether a position is on the step
// and its src's index are known (IndexExpr's residue): no per-element test, no gather of src at
// rd / 2 (1024 x 4096 floats on 2 cores, measured by hand: 0.82 -> 0.22 ms; eager 0.36).
// Steps of 2 to 8, and at least 16 groups.
int64_t KernelEmitter::cpu_residue_split(int64_t count) const {
  for (const auto& n : body_.nodes()) {
    if (n->id() != OpId::kSliceScatter) continue;
    const Shape& shape = n->input(0)->tensor_type().shape;
    const auto rank = static_cast<int64_t>(shape.size());
    const int64_t step = n->arg("step").as_int();
    if (rank == 0 || wrap_dim(n->arg("dim").as_int(), rank) != rank - 1 || shape.back() != count)
      continue;
    if (step >= 2 && step <= 8 && count % step == 0 && count / step >= 16) return step;
  }
  return 0;
}

}  // namespace kiln::codegen::detail
