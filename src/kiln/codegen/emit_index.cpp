// Index ops (index_select, gathers, index writes), scatters into views, cat and stack.
// Part of the kernel emitter (kernel_emitter.h).
#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

// ---- index ops ---------------------------------------------------------------------------

// index_select reads self with the iteration's coordinate along dim replaced by the index's
// value there. index_copy and index_add start from self at the iteration's element and loop
// over the index (its length is compiled in): where index[k] is the iteration's coordinate,
// source's slice k replaces the value (the last such k wins, as on eager's CPU) or is added to
// it (in k's order). The index must be a kernel input: the executor checks its values before
// the kernel runs (Kernel::index_checks); the clamp below only keeps a load in bounds.
//   t1 = index_copy(c, 2, pos, k)  ->  v = c[i]; for (ik = 0; ik < 1; ++ik)
//                                          if (pos[ik] == i2) v = k[i0, i1, ik, i3];
Val KernelEmitter::indexed(const Node& node, const Index& at) {
  if (node.id() == OpId::kWrapIndex) {  // elementwise: index + size where negative
    Val j = eval(node.input(0), at);
    const std::string size = std::to_string(node.arg(1).as_int());
    return define(node.outputs[0]->tensor_type().dtype, "(" + j.expr + ") < 0 && (" + j.expr +
                                                            ") >= -" + size + " ? (" + j.expr +
                                                            ") + " + size + " : (" + j.expr + ")");
  }
  const Value* self = node.input(0);
  const Value* index = node.input(2);
  const TensorType& st = self->tensor_type();
  const int64_t rank = st.rank();
  const auto dim = static_cast<size_t>(wrap_dim(node.arg(1).as_int(), std::max<int64_t>(rank, 1)));
  const int64_t size = rank == 0 ? 1 : st.shape[dim];
  const int64_t count = index->tensor_type().numel();
  const DType out = node.outputs[0]->tensor_type().dtype;
  check_index_values(node, index, size, dim);
  const bool scalar_index = index->tensor_type().rank() == 0;
  auto index_at = [&](const IndexExpr& k) { return scalar_index ? Index{} : Index{k}; };
  auto in_range = [&](const Val& j) { return clamped_position(j, size); };
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

// Registers the executor's check of `index`'s values against dim `dim` of size `size` for the
// index op `node`, unless the trace computes them in range (an arange's positions).
void KernelEmitter::check_index_values(const Node& node, const Value* index, int64_t size,
                                       size_t dim) {
  // The op and the user's line, with its text (`x[i] = v` lowers to index_copy).
  std::string where = node.op->name;
  if (node.loc.line > 0) where += " at " + node.loc.str();
  if (!node.loc.text.empty()) where += " (`" + node.loc.text + "`)";
  std::optional<IntegerRange> known = integer_range(index, [&](const Value* v) -> const Value* {
    auto in = input_index_.find(v);
    return in == input_index_.end() ? nullptr : step_.inputs.at(in->second);
  });
  if (!known || known->lo < 0 || known->hi >= size)
    index_checks_.push_back(index_check(node, index, size, static_cast<int64_t>(dim), where));
}

// An index value as a position in [0, size): the executor checked the values before the kernel
// ran; the clamp only keeps a load or a store in bounds.
IndexExpr KernelEmitter::clamped_position(const Val& j, int64_t size) {
  std::string c = fresh("ix");
  declare("int64_t", c,
          "(" + j.expr + ") < 0 ? 0 : ((" + j.expr + ") > " + std::to_string(size - 1) + " ? " +
              std::to_string(size - 1) + " : (" + j.expr + "))");
  return IndexExpr::bounded(c, 0, size - 1);
}

void KernelEmitter::check_scan_length(const Node& node, int64_t length) {
  if (length > kMaxScannedIndex)
    not_lowered(node.op->name + ": " + std::to_string(length) +
                " index positions (a kernel scans at most " + std::to_string(kMaxScannedIndex) +
                " per element)");
}

// The index's values are a step input's, the input itself or a view of it (an embedding's
// reshape(-1), a gather's index.unsqueeze(-1).expand(...), i[:, :2]), which the executor can
// check before the kernel runs: exactly the viewed elements, found by applying the views to
// the input's row-major positions.
IndexCheck KernelEmitter::index_check(const Node& node, const Value* index, int64_t size,
                                      int64_t dim, const std::string& where) {
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
  const int64_t lowest = negative ? -size : 0;
  check.drawn_from =
      drawn_from(step_.inputs.at(in->second), [&](int64_t c) { return c >= lowest && c < size; });
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
bool KernelEmitter::keeps_every_element(const Node* view) {
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
Val KernelEmitter::scattered(const Node& node, const Index& at, size_t dim) {
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
                         : fl           ? (op == "max" ? "-kernel_infinity()" : "kernel_infinity()")
                              : (op == "max" ? int_literal(INT64_MIN) : int_literal(INT64_MAX));
  emit(depth, compute_reg(out) + " " + acc + " = " + (include_self ? base.expr : identity) + ";",
       acc);
  if (!include_self) emit(depth, "bool " + found + " = false;", found);
  if (mean) emit(depth, "int64_t " + count + " = " + (include_self ? "1" : "0") + ";", count);
  const int64_t positions = rank == 0 ? index_shape.empty() ? 1 : index_shape[0] : index_shape[dim];
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
  std::string update = acc + " = " + value + ";" + (include_self ? "" : " " + found + " = true;") +
                       (mean ? " ++" + count + ";" : "");
  emit(level, "if (" + (inside.empty() ? "" : inside + " && ") + "(" + j.expr + ") == (" +
                  coordinate + ")) { " + update + " }");
  std::string body = close_level(level);
  emit(depth,
       "for (int64_t " + k + " = 0; " + k + " < " + std::to_string(positions) + "; ++" + k + ") {");
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
Val KernelEmitter::join(const Node& node, const Index& at) {
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
  // A bound along the joined dim: read at run time on the CPU (runtime_size), so that a join
  // whose parts grow (a KV cache's cat of [1, H, T, D] and the new token's [1, H, 1, D] at every
  // T) is the same source at every size.
  const bool runtime_bounds = target_ == Target::kCpu && !stack;
  auto bound_text = [&](int64_t bound) {
    return runtime_bounds ? runtime_size(bound) : std::to_string(bound);
  };
  auto part_index = [&](const Part& part) {
    Index slot = at;
    if (stack)
      slot.erase(slot.begin() + static_cast<int64_t>(d));
    else if (runtime_bounds && part.first > 1)
      slot[d] = minus_runtime(x, runtime_size(part.first), part.first);
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
      bounds.push_back("(" + x.text + ") >= " + bound_text(part.first));
      note_cut(x, part.first);
    }
    if (!x.range ? end < first : x.range->second >= end) {
      bounds.push_back("(" + x.text + ") < " + bound_text(end));
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
std::string KernelEmitter::copy_convert_item(const Val& v, DType out) {
  return v.floating() ? "f_" + suffix(out) + "(" + v.expr + ")"
                      : "i_" + suffix(out) + "(" + v.expr + ")";
}

// A scatter is `condition ? src at its index : self`. Both sides are always evaluated (at an
// in-bounds index: src's is 0 where the condition is false), so the loops stay branch-free.
Val KernelEmitter::scatter(const Node& node, const Index& at) {
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
      // (A position of a pass split by residue knows whether it is on the step: the src
      // element, or self's, without a test.)
      std::optional<bool> on_step = step == 1 ? std::optional(true) : known_multiple(rel, step);
      if (on_step == false) return eval(self, at);
      if (!on_step) parts.push_back("(" + rel.text + ") % " + std::to_string(step) + " == 0");
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
bool KernelEmitter::as_strided_slot(const Node& node, const Index& at, std::string* cond,
                                    Index* slot) {
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
  std::sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return strides[a] > strides[b]; });
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

}  // namespace kiln::codegen::detail
