// The form of a reduction's pass that one thread runs (a CPU pass; a CUDA thread's serial one):
// the order it takes the reduced dims in, a nest of an inner block, a merged form and a divided
// one, the nest's column block; and its loops. Part of the kernel emitter (kernel_emitter.h);
// reduction (emit_reduction.cpp) builds the pass's body and accumulators and asks for them here.
// Requires: the pass's body at level `depth` + 1, its variables declared (rl, ro).
// Ensures:  its loops at `depth`, in one form, or in two where a merge of its addresses holds
//           only for some strides (merged where it holds, a constant in each nest copy).
#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

// The form of the pass at `depth` over `reduced` (in the pass's order) of `in`, `count`
// elements; `shared` where the pass is a CUDA row's or column's, which none of this applies to.
// A CPU pass over reduced dims that are not one block of adjacent dims (a batch norm's mean over
// n, h, w) runs as a loop over the outer ones around a pass over the innermost block: its
// position decomposes into the block's indices alone, which merged_address makes one linear
// position, where all of them decomposed took divisions and gathers at every element.
//   for (ro < N) { for (rl < H * W) { rd = rl % W; rq = rl / W; ...; rd0 = ro; ... } }
// A CPU reduction at the nest's element whose input is laid out with the nest's last dim
// innermost (a channels-last x.mean((2, 3)): c's stride 1, w's C) runs in the nest's column
// block as one that keeps its last dim does: each position of (h, w) read for 64 consecutive
// channels, where a pass for each channel read one element of each position (8x eager's time).
// And the converse: one whose reduced dims are innermost (a channels-last x.sum(1)) takes its
// pass at each element, along them, not a column block whose columns are C apart (33x eager's
// time for [32, 64, 28, 28], 130x for [32, 256, 14, 14]).
// Where the input is not contiguous over the block's dims (a slice x[..., :27] of [.., 28, 32]:
// merged_address's conditions fail), the divisions of the position stay, a gather at every
// element (x[..., :27].sum((2, 3)) took 3.5-4x eager's time, x[:, :1000].sum() 10.7x). Such a
// pass also has a divided form: a loop over the innermost reduced dim inside one over the others
// (cpu_divided_pass), which runs where the merged form does not (rl<k>_merged). Even rows of 2
// took it under eager's time.
KernelEmitter::PassForm KernelEmitter::pass_form(const Value* in,
                                                 const std::vector<int64_t>& reduced, int depth,
                                                 bool shared, bool arg) const {
  const Shape& shape = in->tensor_type().shape;
  const auto rank = static_cast<int64_t>(shape.size());
  int64_t count = 1;
  for (int64_t d : reduced)
    count *= shape[static_cast<size_t>(d)];
  PassForm form;
  form.block = count;
  form.last_dim_reduced = std::find(reduced.begin(), reduced.end(), rank - 1) != reduced.end();
  for (size_t r = reduced.size(); r-- > 0 && form.innermost_size == 1;)
    form.innermost_size = shape[static_cast<size_t>(reduced[r])];
  const bool cpu = target_ == Target::kCpu && !shared;
  if (!cpu) return form;
  const std::optional<bool> kept_innermost =
      depth == nest_rank_ ? last_kept_dim_innermost(in, reduced) : std::nullopt;
  form.columns_innermost = form.last_dim_reduced && kept_innermost == true;
  form.reduced_innermost = !form.last_dim_reduced && kept_innermost == false;
  if (arg || !form.last_dim_reduced || form.columns_innermost) return form;
  if (depth > 0) form.block = inner_reduced_block(shape, reduced);
  form.nested = form.block >= kMinSplitInner && form.block < count;
  form.two_forms = form.innermost_size < (form.nested ? form.block : count);
  return form;
}

// The loops of a pass one thread runs: in the nest's column block where it fits
// (column_block_fits), else a loop over its positions (in pieces between its guards' bounds: a
// loop each; a float sum in float chunks: cpu_float_chunks), inside a loop over the outer dims
// where nested, and in its divided form too where it has two (cpu_divided_pass). True where the
// pass runs in the column block.
bool KernelEmitter::serial_pass_loops(const SerialPass& pass) {
  const int depth = pass.depth;
  const int64_t count = pass.count;
  const PassForm& form = pass.form;
  // (A CPU team's work, over the pass's extent where its loop reads it: cpu_nest_work.)
  auto work_term = [&](const std::string& length, bool in_column_block) {
    if (target_ == Target::kCpu) pass_works_.push_back({depth, in_column_block, count, length});
  };
  if (std::optional<std::string> element = column_block_fits(
          pass.body, depth,
          (form.last_dim_reduced && !form.columns_innermost) || form.reduced_innermost,
          pass.accs)) {
    work_term(pass.count_text(), true);
    cpu_column_block(pass.rl, count, pass.count_text(), pass.body, pass.accs, *element, pass.simd,
                     pass.float_sum ? pass.combines : decltype(pass.combines){});
    for (const Accumulator& a : pass.accs)
      emit(depth, a.name + " = " + a.name + "_b[i" + std::to_string(nest_rank_ - 1) + " - cb];");
    return true;
  }
  if (target_ == Target::kCpu && pass.stores_in_pass && !pass_stores_->along_last_dim)
    throw PassOutsideColumnBlock{};
  // A pass outside the nest's loops (a full reduction) is shared by the cores when long.
  // One loop per piece between the pass's guards' bounds (pieces_between_cuts).
  const bool nested = form.nested;
  const int64_t along = nested ? form.block : count;  // rl's positions
  std::vector<int64_t> pieces = pass.split ? std::vector<int64_t>{0, count / pass.split}
                                : target_ == Target::kCpu
                                    ? pieces_between_cuts(pass.same_as_rl, along)
                                    : std::vector<int64_t>{0, count};
  if (pieces.size() > 2) {
    std::string bounds;
    for (size_t piece = 1; piece + 1 < pieces.size(); ++piece)
      bounds += (bounds.empty() ? "" : ", ") + std::to_string(pieces[piece]);
    emit(depth, "// the pass in pieces at its guards' bounds: " + bounds);
  }
  const bool chunked = pass.float_sum && along >= 32;
  // One piece of the whole length: its bound the pass's runtime extent (where it has one).
  const bool whole = !nested && pass.runtime_count && pieces.size() == 2 && pieces[1] == count;
  const std::string length = whole ? pass.count_text() : std::to_string(along);
  work_term(nested ? std::to_string(count) : length, false);
  // Two forms: the merged one where every merge its addresses took holds (a constant in each
  // of the nest's copies: emit_nest_loops), else the divided one.
  // (Made only for a pass with two forms: the outer loop's bound registers the pass's
  // runtime extent, a kernel argument.)
  const std::string& rl = pass.rl;
  const std::string& ro = pass.ro;
  auto divided_pass = [&] {
    const int64_t inner = form.innermost_size;
    return DividedPass{rl,
                       ro,
                       pass.runtime_count
                           ? "(" + pass.count_text() + " / " + std::to_string(inner) + ")"
                           : std::to_string(count / inner),
                       inner,
                       count,
                       pass.body,
                       pass.simd,
                       pass.float_sum ? pass.accs.front().name : "",
                       pass.combines};
  };
  const std::string merged = rl + "_merged";
  if (form.two_forms) {
    const std::string merges = pass_merge_flags(pass.merged_positions);
    emit(depth, "constexpr bool " + merged + " = " + merges + ";");
    if (merges == "false") {
      cpu_divided_pass(divided_pass(), depth);
      return false;
    }
    emit(depth, "if constexpr (" + merged + ") {");
    if (!nested) emit(depth, "[[maybe_unused]] constexpr int64_t " + ro + " = 0;");
  }
  if (nested)
    emit(depth, "for (int64_t " + ro + " = 0; " + ro + " < " + std::to_string(count / form.block) +
                    "; ++" + ro + ") {");
  for (size_t piece = 0; piece + 1 < pieces.size(); ++piece) {
    if (chunked) {
      cpu_float_chunks(rl, pieces[piece], pieces[piece + 1], whole ? length : "",
                       std::max<int64_t>(pass.split, 1), pass.body, pass.combines,
                       pass.accs.front().name, depth);
      continue;
    }
    if (target_ == Target::kCpu && !pass.simd.empty())
      emit(depth, depth == 0 && parallel_worth(count)
                      ? "#pragma omp parallel for simd " + pass.simd + team_clause({count, length})
                      : "#pragma omp simd " + pass.simd);
    emit(depth, "for (int64_t " + rl + " = " + std::to_string(pieces[piece]) + "; " + rl + " < " +
                    (whole ? length : std::to_string(pieces[piece + 1])) + "; ++" + rl + ") {");
    levels_.at(static_cast<size_t>(depth)) += indented(pass.body, 1);
    emit(depth, "}");
  }
  if (nested) emit(depth, "}");
  if (form.two_forms) {
    emit(depth, "} else {");
    cpu_divided_pass(divided_pass(), depth);
    emit(depth, "}");
  }
  return false;
}

// The positions of the innermost block of a reduction's reduced dims that are adjacent in its
// input (dims of size 1 between them do not part them), `reduced` in the pass's order (outermost
// first; memory_order_of_reduced may have permuted it): the pass's inner loop (reduction:
// `nested`), whose indices merged_address joins into one position where the input is
// contiguous over them. The longest tail of the order whose dims span no kept dim.
//   [N, C, H, W] over (0, 2, 3): H * W; over (0, 3, 2) (h, w transposed): W * H too
int64_t KernelEmitter::inner_reduced_block(const Shape& shape,
                                           const std::vector<int64_t>& reduced) {
  auto kept_between = [&](int64_t low, int64_t high) {
    for (int64_t d = low + 1; d < high; ++d)
      if (shape[static_cast<size_t>(d)] != 1 &&
          std::find(reduced.begin(), reduced.end(), d) == reduced.end())
        return true;
    return false;
  };
  int64_t block = 1, low = -1, high = -1;  // the block's dims not of size 1: [low, high]
  for (size_t r = reduced.size(); r-- > 0;) {
    const int64_t d = reduced[r], size = shape[static_cast<size_t>(d)];
    if (size == 1) continue;
    const int64_t new_low = low < 0 ? d : std::min(low, d), new_high = std::max(high, d);
    if (kept_between(new_low, new_high)) break;
    low = new_low;
    high = new_high;
    block *= size;
  }
  return block;
}

// The order a CPU pass takes a reduction's reduced dims in (outermost first): their memory order
// where the strides the input is read with are known (read_strides), the largest stride first,
// so that the pass's inner loop walks the smallest (an h, w-transposed x.mean((2, 3)) read its
// rows 28 floats apart: 4.2x eager's time), and merged_address may join them into one position;
// else, and for argmax and argmin (whose result is a position in row-major order), `reduced`.
// Dims of size 1 go first (they are not looped over).
std::vector<int64_t> KernelEmitter::memory_order_of_reduced(const Value* in,
                                                            std::vector<int64_t> reduced) {
  ReadStrides seen;
  const std::optional<std::vector<int64_t>> strides = read_strides(in, seen);
  const Shape& shape = in->tensor_type().shape;
  if (!strides || strides->size() != shape.size()) return reduced;
  auto key = [&](int64_t d) {
    const auto at = static_cast<size_t>(d);
    return shape[at] == 1 ? INT64_MAX : (*strides)[at];
  };
  std::stable_sort(reduced.begin(), reduced.end(),
                   [&](int64_t a, int64_t b) { return key(a) > key(b); });
  return reduced;
}

// The strides a region's value is read with, where that is known from the region: a strided
// view of a region input (as_strided with constant strides, the form functionalize gives a
// caller's non-contiguous tensor: channels-last, transposed), or an elementwise op whose
// operands of its shape are all read so, with the same innermost dim (the first's strides).
// `seen` holds the values asked already: a chain t = t * t reads each value twice, and without
// it the walk doubled at every op.
std::optional<std::vector<int64_t>> KernelEmitter::read_strides(const Value* v, ReadStrides& seen) {
  if (auto it = seen.find(v); it != seen.end()) return it->second;
  std::optional<std::vector<int64_t>>& known = seen[v];
  const Node* node = defining_node(v);
  if (!node) return std::nullopt;
  if (node->id() == OpId::kAsStrided && !defining_node(node->input(0)))
    return known = std::vector<int64_t>(node->arg("stride").as_ints().begin(),
                                        node->arg("stride").as_ints().end());
  if (node->op->kind != OpKind::kElementwise) return std::nullopt;
  const Shape& shape = v->tensor_type().shape;
  auto innermost = [&](const std::vector<int64_t>& strides) {
    size_t best = strides.size();
    for (size_t d = 0; d < strides.size(); ++d)
      if (shape[d] != 1 && (best == strides.size() || strides[d] < strides[best])) best = d;
    return best;
  };
  std::optional<std::vector<int64_t>> first;
  for (const Operand& o : node->operands) {
    if (!o.is_value() || !o.value()->is_tensor() || o.value()->tensor_type().shape != shape)
      continue;
    std::optional<std::vector<int64_t>> strides = read_strides(o.value(), seen);
    if (!strides || (first && innermost(*strides) != innermost(*first))) return std::nullopt;
    if (!first) first = strides;
  }
  return seen[v] = first;
}

// Whether a reduction's input is read with the last of its kept dims innermost (the smallest
// stride of its dims not of size 1: its column block reads consecutive elements across the
// block's columns), false where a reduced dim is, nullopt where its strides are not known.
std::optional<bool> KernelEmitter::last_kept_dim_innermost(const Value* in,
                                                           const std::vector<int64_t>& reduced) {
  ReadStrides seen;
  const std::optional<std::vector<int64_t>> strides = read_strides(in, seen);
  const Shape& shape = in->tensor_type().shape;
  if (!strides || strides->size() != shape.size()) return std::nullopt;
  auto is_reduced = [&](size_t d) {
    return std::find(reduced.begin(), reduced.end(), static_cast<int64_t>(d)) != reduced.end();
  };
  std::optional<size_t> last, innermost;  // the last kept dim; the dim of the smallest stride
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!is_reduced(d)) last = d;
    if (!innermost || (*strides)[d] < (*strides)[*innermost]) innermost = d;
  }
  if (!last || !innermost) return std::nullopt;
  if (is_reduced(*innermost)) return false;
  return *innermost == *last;
}

// The reduced dims' indices in a pass's divided form: the innermost reduced dim's is the inner
// loop's rl; the others' decompose the outer loop's ro, which runs over them in their order, so
// their divisions run once a row of the inner loop (where one loop over all of them divided its
// position at every element, and read the input through a gather).
//   [N, 64, 28, 27] over (1, 2, 3): {3: "rl1", 2: "ro2 % 28", 1: "(ro2 / 28)"}
std::map<int64_t, std::string> KernelEmitter::divided_pass_indices(
    const Shape& shape, const std::vector<int64_t>& reduced, const std::string& ro,
    const std::string& rl) {
  std::vector<int64_t> dims;  // the reduced dims not of size 1, innermost first
  for (size_t r = reduced.size(); r-- > 0;)
    if (shape[static_cast<size_t>(reduced[r])] != 1) dims.push_back(reduced[r]);
  std::map<int64_t, std::string> index;
  int64_t within = 1;  // ro's positions inside one of the dim's
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i == 0) {
      index[dims[i]] = rl;
      continue;
    }
    const int64_t size = shape[static_cast<size_t>(dims[i])];
    const std::string quotient = within == 1 ? ro : "(" + ro + " / " + std::to_string(within) + ")";
    index[dims[i]] = i + 1 == dims.size() ? quotient : quotient + " % " + std::to_string(size);
    within *= size;
  }
  return index;
}

// The flags of the merges that a pass's addresses took (merged_terms), over the positions of the
// pass's merged form: where all of them hold, the merged form runs (one position over the merged
// dims); "false" where it took none. "mg0 && mg2"
std::string KernelEmitter::pass_merge_flags(const std::set<std::string>& positions) const {
  std::set<std::string> flags;
  for (const std::string& position : positions)
    if (auto it = merge_flags_by_dividend_.find(position); it != merge_flags_by_dividend_.end())
      flags.insert(it->second.begin(), it->second.end());
  std::string all;
  for (const std::string& flag : flags)
    all += (all.empty() ? "" : " && ") + flag;
  return all.empty() ? "false" : all;
}

// A pass's divided form: for (ro < outer) { for (rl < inner) { body } }. A float sum takes each
// row of the inner loop in float (cpu_float_chunks, its chunks at most the row); a full
// reduction's team shares the outer loop (the inner is a row: a team for it would start once a
// row).
//   #pragma omp parallel for reduction(+:acc0) num_threads(...)
//   for (int64_t ro2 = 0; ro2 < (e0 / 1000); ++ro2) { { float acc0_f = 0; ... acc0 += acc0_f; } }
void KernelEmitter::cpu_divided_pass(const DividedPass& pass, int depth) {
  if (depth == 0 && !pass.simd.empty() && parallel_worth(pass.count))
    emit(depth, "#pragma omp parallel for " + pass.simd +
                    team_clause({pass.count, pass.outer, pass.inner}));
  emit(depth, "for (int64_t " + pass.ro + " = 0; " + pass.ro + " < " + pass.outer + "; ++" +
                  pass.ro + ") {");
  if (!pass.float_sum.empty()) {
    cpu_float_chunks(pass.rl, 0, pass.inner, "", 1, pass.body, pass.combines, pass.float_sum, depth,
                     /*team=*/false);
  } else {
    if (!pass.simd.empty()) emit(depth, "#pragma omp simd " + pass.simd);
    emit(depth, "for (int64_t " + pass.rl + " = 0; " + pass.rl + " < " +
                    std::to_string(pass.inner) + "; ++" + pass.rl + ") {");
    levels_.at(static_cast<size_t>(depth)) += indented(pass.body, 1);
    emit(depth, "}");
  }
  emit(depth, "}");
}

}  // namespace kiln::codegen::detail
