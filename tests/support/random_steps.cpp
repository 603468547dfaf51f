// The random program generator's steps (random_generator.h): one move per op family, each
// drawing its operands from the live handles, and the step's meta facts.
#include "support/random_generator.h"

namespace kiln::fuzz::generator {

bool Generator::emit(Step s, Meta meta, int max_results) {
  s.line = static_cast<int>(r_.steps.size()) + 1;
  const OpInfo& info = op_info(s.op);
  if (!info.is_mutation()) {
    for (int k = 0; k < max_results; ++k)
      s.results.push_back(next_id_ + k);
  }
  size_t n = 0;
  if (rep_.apply(s, &n) != Applied::kApplied) return false;
  if (!info.is_mutation()) {
    s.results.resize(std::min(n, s.results.size()));
    next_id_ += static_cast<int>(s.results.size());
    meta.made_at = static_cast<int>(r_.steps.size()) + 1;
    for (int id : s.results)
      meta_[id] = meta;
  }
  r_.steps.push_back(std::move(s));
  return true;
}

Step Generator::step(OpId op, std::vector<StepArg> args,
                     std::vector<std::pair<std::string, StepArg>> kwargs) {
  Step s;
  s.op = op;
  s.args = std::move(args);
  s.kwargs = std::move(kwargs);
  return s;
}

Meta Generator::view_meta(int h) const {
  Meta m;
  const Meta& src = meta_.at(h);
  m.on_input = src.on_input;
  m.overlapping = src.overlapping;
  return m;
}

bool Generator::move_unary(bool inplace) {
  auto h = inplace ? pick_target() : pick_any();
  if (!h) return false;
  OpId op = rng_.pick(unary_ops());
  if (inplace) {
    if (!op_info(op).has_inplace_form) return false;
    op = inplace_form(op);
  }
  std::vector<std::pair<std::string, StepArg>> kwargs;
  if (op == OpId::kGelu || op == OpId::kGelu_)
    kwargs.emplace_back("approximate", Constant(std::string(rng_.chance(0.5) ? "tanh" : "none")));
  return emit(step(op, {HandleRef{*h}}, kwargs), fresh());
}

bool Generator::move_binary(bool inplace) {
  auto h = inplace ? pick_target() : pick_any();
  if (!h) return false;
  OpId op = rng_.pick(binary_ops());
  StepArg other = tensor_or_number(shape_of(*h), inplace, takes_number(op) ? 0.35 : 0.0);
  if (std::holds_alternative<Constant>(other) && !takes_number(op)) return false;
  std::vector<std::pair<std::string, StepArg>> kwargs;
  if ((op == OpId::kAdd || op == OpId::kSub) && rng_.chance(0.2))
    kwargs.emplace_back("alpha", rng_.chance(0.5) ? StepArg(C(2)) : StepArg(Constant(-0.5)));
  bool rounding = op == OpId::kDiv && rng_.chance(0.2);
  if (rounding) {
    kwargs.emplace_back("rounding_mode",
                        Constant(std::string(rng_.chance(0.5) ? "floor" : "trunc")));
  }
  // Integer division by zero raises in eager even when the result is never used, which a
  // compiler that removes dead code cannot match without computing it: divide integers by
  // nonzero numbers only.
  bool divides = op == OpId::kRemainder || op == OpId::kFmod || rounding;
  if (divides && !is_floating(dtype_of(*h))) {
    const auto* ref = std::get_if<HandleRef>(&other);
    const auto* c = std::get_if<Constant>(&other);
    bool integral_tensor =
        ref && rep_.value(ref->id)->is_tensor() && !is_floating(dtype_of(ref->id));
    bool integral_number = c && !std::holds_alternative<double>(*c);
    if (integral_tensor || integral_number)
      other = C(rng_.pick(std::vector<int64_t>{-3, -2, 2, 3}));
  }
  if (inplace) op = inplace_form(op);
  return emit(step(op, {HandleRef{*h}, other}, kwargs), fresh());
}

bool Generator::move_ternary(bool inplace) {
  auto h = inplace ? pick_target() : pick_any();
  if (!h) return false;
  const Shape& shape = shape_of(*h);
  size_t which = rng_.weighted({inplace ? 0.0 : 3.0, 3, 2, 2, 1});
  OpId op;
  std::vector<StepArg> args;
  std::vector<std::pair<std::string, StepArg>> kwargs;
  switch (which) {
    case 0: {  // where(cond, self, other)
      std::vector<int> conds = tensors([&](int c) {
        if (dtype_of(c) != DType::kBool) return false;
        try {
          broadcast_shapes(shape, shape_of(c));
          return true;
        } catch (const UserError&) {
          return false;
        }
      });
      if (conds.empty()) return false;
      op = OpId::kWhere;
      args = {HandleRef{rng_.pick(conds)}, HandleRef{*h}, tensor_or_number(shape, false, 0.5)};
      break;
    }
    case 1: {  // clamp(self, min, max)
      op = OpId::kClamp;
      auto bound = [&](double lo, double hi) -> StepArg {
        if (rng_.chance(0.2)) return tensor_or_number(shape, inplace, 0.0);
        return Constant(static_cast<double>(rng_.uniform(static_cast<int64_t>(lo * 4),
                                                         static_cast<int64_t>(hi * 4))) /
                        4.0);
      };
      size_t form = rng_.index(3);
      args = {HandleRef{*h}, form == 1 ? StepArg(none()) : bound(-1, 0),
              form == 2 ? StepArg(none()) : bound(0, 1)};
      break;
    }
    case 2:  // lerp(self, end, weight)
      op = OpId::kLerp;
      args = {HandleRef{*h}, tensor_or_number(shape, inplace, 0.0),
              rng_.chance(0.7) ? StepArg(Constant(0.25)) : tensor_or_number(shape, inplace, 0.0)};
      if (std::holds_alternative<Constant>(args[1])) return false;
      break;
    case 3:  // addcmul(self, t1, t2, value=)
    default:
      op = which == 3 ? OpId::kAddcmul : OpId::kAddcdiv;
      args = {HandleRef{*h}, tensor_or_number(shape, inplace, 0.0),
              tensor_or_number(shape, inplace, 0.0)};
      if (std::holds_alternative<Constant>(args[1]) || std::holds_alternative<Constant>(args[2]))
        return false;
      if (rng_.chance(0.5)) kwargs.emplace_back("value", Constant(0.5));
      break;
  }
  if (inplace) op = inplace_form(op);
  return emit(step(op, args, kwargs), fresh());
}

StepArg Generator::random_dims(int64_t rank, bool allow_none) {
  if (allow_none && rng_.chance(0.3)) return none();
  IntList dims;
  for (int64_t d = 0; d < rank; ++d)
    if (rng_.chance(0.5)) dims.push_back(rng_.chance(0.2) ? d - rank : d);
  if (dims.empty() && rank > 0 && rng_.chance(0.7)) dims.push_back(rng_.uniform(0, rank - 1));
  return Constant(dims);
}

bool Generator::move_reduction() {
  auto h = pick_any();
  if (!h) return false;
  int64_t rank = rank_of(*h);
  bool keepdim = rng_.chance(0.4);
  switch (rng_.weighted({3, 2, 2, 1, 1, 1, 1})) {
    case 0: {
      std::vector<std::pair<std::string, StepArg>> kw;
      if (rng_.chance(0.1)) kw.emplace_back("dtype", Constant(DType::kFloat64));
      return emit(step(OpId::kSum, {HandleRef{*h}, random_dims(rank, true), keepdim}, kw), fresh());
    }
    case 1:
      return emit(step(OpId::kMean, {HandleRef{*h}, random_dims(rank, true), keepdim}), fresh());
    case 2:
      return emit(step(OpId::kAmax, {HandleRef{*h}, random_dims(rank, false), keepdim}), fresh());
    case 3:
      return emit(step(OpId::kAmin, {HandleRef{*h}, random_dims(rank, false), keepdim}), fresh());
    case 4:
      return emit(
          step(OpId::kProd,
               {HandleRef{*h}, rng_.chance(0.3) ? StepArg(none()) : StepArg(C(random_dim(rank))),
                keepdim}),
          fresh());
    default:
      return emit(
          step(rng_.chance(0.5) ? OpId::kVar : OpId::kStd, {HandleRef{*h}, random_dims(rank, true)},
               {{"correction", C(rng_.uniform(0, 1))}, {"keepdim", Constant(keepdim)}}),
          fresh());
  }
}

bool Generator::move_view() {
  std::optional<int> h;
  if (rng_.chance(0.5)) {
    std::vector<int> hs = tensors([&](int x) { return meta_[x].on_input; });
    if (!hs.empty()) h = pick_recent(hs);
  }
  if (!h) h = pick_any();
  if (!h) return false;
  const Shape shape = shape_of(*h);
  int64_t rank = static_cast<int64_t>(shape.size());
  Meta m = view_meta(*h);
  HandleRef self{*h};
  switch (rng_.weighted({4, 3, 1, 2, 1, 1, 1, 2, 2, 1, 1, 2, 1, 2, 3, 1, 0.5})) {
    case 0: {  // slice
      int64_t d = random_dim(rank);
      int64_t size = rank == 0 ? 1 : shape[static_cast<size_t>(d < 0 ? d + rank : d)];
      StepArg start = rng_.chance(0.3) ? StepArg(none()) : StepArg(C(rng_.uniform(-size, size)));
      StepArg end = rng_.chance(0.3) ? StepArg(none()) : StepArg(C(rng_.uniform(-size, size + 1)));
      return emit(step(OpId::kSlice,
                       {self, C(d), start, end, C(rng_.pick(std::vector<int64_t>{1, 1, 2, 3}))}),
                  m);
    }
    case 1: {  // select
      if (rank == 0) return false;
      int64_t d = random_dim(rank);
      int64_t size = shape[static_cast<size_t>(d < 0 ? d + rank : d)];
      if (size == 0) return false;
      return emit(step(OpId::kSelect, {self, C(d), C(rng_.uniform(-size, size - 1))}), m);
    }
    case 2: {  // narrow
      if (rank == 0) return false;
      int64_t d = random_dim(rank);
      int64_t size = shape[static_cast<size_t>(d < 0 ? d + rank : d)];
      int64_t start = rng_.uniform(0, size);
      return emit(step(OpId::kNarrow, {self, C(d), C(start), C(rng_.uniform(0, size - start))}), m);
    }
    case 3:  // transpose
      return emit(step(OpId::kTranspose, {self, C(random_dim(rank)), C(random_dim(rank))}), m);
    case 4: {  // permute
      IntList perm(static_cast<size_t>(rank));
      for (int64_t i = 0; i < rank; ++i)
        perm[static_cast<size_t>(i)] = i;
      for (size_t i = perm.size(); i > 1; --i)
        std::swap(perm[i - 1], perm[rng_.index(i)]);
      return emit(step(OpId::kPermute, {self, Constant(perm)}), m);
    }
    case 5:
      return emit(step(OpId::kT, {self}), m);
    case 6:  // diagonal
      return emit(step(OpId::kDiagonal,
                       {self, C(rng_.uniform(-1, 1)), C(random_dim(rank)), C(random_dim(rank))}),
                  m);
    case 7:
      return emit(step(OpId::kReshape, {self, Constant(random_reshape(shape_numel(shape)))}), m);
    case 8:
      return emit(step(OpId::kView, {self, Constant(random_reshape(shape_numel(shape)))}), m);
    case 9: {  // flatten of at least two dims (flatten of one dim returns the same object)
      if (rank < 2) return false;
      int64_t s = rng_.uniform(0, rank - 2);
      int64_t e = rng_.uniform(s + 1, rank - 1);
      return emit(step(OpId::kFlatten, {self, C(s), C(rng_.chance(0.3) ? e - rank : e)}), m);
    }
    case 10: {  // unflatten
      if (rank == 0) return false;
      int64_t d = random_dim(rank);
      int64_t size = shape[static_cast<size_t>(d < 0 ? d + rank : d)];
      return emit(step(OpId::kUnflatten, {self, C(d), Constant(random_reshape(size))}), m);
    }
    case 11:
      return emit(step(OpId::kUnsqueeze, {self, C(rng_.uniform(-rank - 1, rank))}), m);
    case 12: {  // squeeze
      StepArg dims =
          rng_.chance(0.4) ? StepArg(none()) : StepArg(Constant(IntList{random_dim(rank)}));
      return emit(step(OpId::kSqueeze, {self, dims}), m);
    }
    case 13: {  // expand: size-1 dims grow, maybe a new leading dim (reads only, mostly)
      IntList sizes;
      bool grew = false;
      if (rng_.chance(0.3)) {
        sizes.push_back(rng_.uniform(2, 3));
        grew = true;
      }
      for (int64_t s : shape) {
        if (s == 1 && rng_.chance(0.6)) {
          sizes.push_back(rng_.uniform(2, 3));
          grew = true;
        } else {
          sizes.push_back(rng_.chance(0.5) ? -1 : s);
        }
      }
      m.overlapping = m.overlapping || grew;
      return emit(step(OpId::kExpand, {self, Constant(sizes)}), m);
    }
    case 14:
      return emit(step(OpId::kGetitem, {self, Constant(random_key(shape))}), m);
    case 15:
      return emit(step(OpId::kAlias, {self}), m);
    default:
      return emit(step(OpId::kDetach, {self}), m);
  }
}

bool Generator::move_split() {
  auto h = pick_any();
  if (!h) return false;
  int64_t rank = rank_of(*h);
  if (rank == 0) return false;
  Meta m = view_meta(*h);
  int64_t d = random_dim(rank);
  int64_t size = shape_of(*h)[static_cast<size_t>(d < 0 ? d + rank : d)];
  switch (rng_.index(3)) {
    case 0:
      return emit(
          step(OpId::kSplit, {HandleRef{*h}, C(rng_.uniform(1, std::max<int64_t>(size, 1))), C(d)}),
          m, 8);
    case 1:
      return emit(step(OpId::kChunk, {HandleRef{*h}, C(rng_.uniform(1, 3)), C(d)}), m, 8);
    default:
      if (size > 6) return false;
      return emit(step(OpId::kUnbind, {HandleRef{*h}, C(d)}), m, 8);
  }
}

bool Generator::move_fill() {
  auto h = pick_target();
  if (!h) return false;
  if (rng_.chance(0.25)) return emit(step(OpId::kZero_, {HandleRef{*h}}), fresh());
  StepArg value = random_number();
  if (rng_.chance(0.2)) {
    std::vector<int> scalars = tensors([&](int x) { return rank_of(x) == 0; });
    if (!scalars.empty()) value = HandleRef{rng_.pick(scalars)};
  }
  return emit(step(OpId::kFill_, {HandleRef{*h}, value}), fresh());
}

bool Generator::move_copy() {
  auto h = pick_target();
  if (!h) return false;
  std::vector<int> srcs = broadcast_partners(shape_of(*h), true);
  if (srcs.empty()) return false;
  return emit(step(OpId::kCopy_, {HandleRef{*h}, HandleRef{pick_recent(srcs)}}), fresh());
}

bool Generator::move_clone() {
  auto h = pick_any();
  if (!h) return false;
  if (!emit(step(OpId::kEmptyLike, {HandleRef{*h}}), fresh())) return false;
  int copy = r_.steps.back().results.at(0);
  return emit(step(OpId::kCopy_, {HandleRef{copy}, HandleRef{*h}}), fresh());
}

bool Generator::move_setitem() {
  auto h = pick_target();
  if (!h) return false;
  IndexKey key = random_key(shape_of(*h));
  Shape view;
  try {
    lower_index_key(shape_of(*h), key, &view);
  } catch (const UserError&) {
    return false;
  }
  StepArg value = rng_.chance(0.4) ? random_number() : tensor_or_number(view, true, 0.0);
  return emit(step(OpId::kSetitem_, {HandleRef{*h}, Constant(key), value}), fresh());
}

bool Generator::move_metadata() {
  std::vector<int> hs = tensors([&](int x) { return !meta_[x].fixed; });
  if (hs.empty()) return false;
  // Inputs half of the time: the caller must see the new sizes and strides.
  std::vector<int> inputs = tensors([&](int x) { return !meta_[x].fixed && meta_[x].is_input; });
  int h = (!inputs.empty() && rng_.chance(0.5)) ? rng_.pick(inputs) : pick_recent(hs);
  int64_t rank = rank_of(h);
  switch (rng_.weighted({3, 2, 2, 2})) {
    case 0:
      return emit(step(OpId::kTranspose_, {HandleRef{h}, C(random_dim(rank)), C(random_dim(rank))}),
                  fresh());
    case 1:
      return emit(step(OpId::kT_, {HandleRef{h}}), fresh());
    case 2:
      return emit(step(OpId::kUnsqueeze_, {HandleRef{h}, C(rng_.uniform(-rank - 1, rank))}),
                  fresh());
    default: {
      StepArg dims =
          rng_.chance(0.4) ? StepArg(none()) : StepArg(Constant(IntList{random_dim(rank)}));
      return emit(step(OpId::kSqueeze_, {HandleRef{h}, dims}), fresh());
    }
  }
}

bool Generator::move_cat() {
  auto h = pick_any();
  if (!h) return false;
  const Shape shape = shape_of(*h);
  int64_t rank = static_cast<int64_t>(shape.size());
  bool stack = rng_.chance(0.25);
  int64_t d = stack ? rng_.uniform(-rank - 1, rank) : random_dim(rank);
  size_t wd = static_cast<size_t>(d < 0 ? d + rank : d);
  std::vector<int> partners = tensors([&](int x) {
    const Shape& s = shape_of(x);
    if (s.size() != shape.size()) return false;
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] != shape[i] && (stack || i != wd)) return false;
    return true;
  });
  std::vector<HandleRef> list = {HandleRef{*h}};
  int64_t more = rng_.uniform(1, 2);
  for (int64_t k = 0; k < more; ++k)
    list.push_back(HandleRef{partners.empty() ? *h : rng_.pick(partners)});
  return emit(step(stack ? OpId::kStack : OpId::kCat, {list, C(d)}), fresh());
}

bool Generator::move_index() {
  if (r_.steps.size() + 8 > kMaxSteps) return false;  // it makes up to 8
  auto h = pick_any();
  if (!h || rank_of(*h) == 0) return false;
  const Shape shape = shape_of(*h);
  int64_t d = random_dim(rank_of(*h));
  int64_t n = shape[static_cast<size_t>(d < 0 ? d + rank_of(*h) : d)];
  if (n == 0) return false;
  std::vector<std::pair<std::string, StepArg>> kw = {{"dtype", Constant(DType::kInt64)}};
  bool reversed = rng_.chance(0.4);
  int64_t start = reversed ? n - 1 : rng_.uniform(0, n - 1);
  int64_t end = reversed ? -1 : rng_.uniform(start + 1, n);
  // A third of the time the positions count from the end (-n..-1), through wrap_index.
  bool from_end = rng_.chance(0.3);
  int64_t shift = from_end ? n : 0;
  if (!emit(step(OpId::kArange, {C(start - shift), C(end - shift), C(reversed ? -1 : 1)}, kw),
            fresh()))
    return false;
  int index = r_.steps.back().results.at(0);
  if (from_end) {
    if (!emit(step(OpId::kWrapIndex, {HandleRef{index}, C(n)}), fresh())) return false;
    index = r_.steps.back().results.at(0);
  }
  if (!emit(step(OpId::kIndexSelect, {HandleRef{*h}, C(d), HandleRef{index}}), fresh()))
    return false;
  if (rng_.chance(0.4)) return true;
  // The selected rows, changed, written back at the same positions.
  int rows = r_.steps.back().results.at(0);
  if (!emit(step(OpId::kNeg, {HandleRef{rows}}), fresh())) return false;
  int source = r_.steps.back().results.at(0);
  if (rng_.chance(0.35)) return scatter_rows(*h, d, index, rows, source);
  bool add = rng_.chance(0.5);
  std::vector<std::pair<std::string, StepArg>> alpha;
  if (add && rng_.chance(0.5)) alpha.emplace_back("alpha", C(2));
  if (!emit(step(add ? OpId::kIndexAdd : OpId::kIndexCopy,
                 {HandleRef{*h}, C(d), HandleRef{index}, HandleRef{source}}, alpha),
            fresh()))
    return false;
  if (rng_.chance(0.5)) return true;
  int written = r_.steps.back().results.at(0);
  return emit(step(OpId::kCopy_, {HandleRef{*h}, HandleRef{written}}), fresh());
}

bool Generator::scatter_rows(int h, int64_t d, int index, int rows, int source) {
  const Shape rows_shape = shape_of(rows);
  IntList along(rows_shape.size(), 1);
  size_t wd = static_cast<size_t>(d < 0 ? d + static_cast<int64_t>(rows_shape.size()) : d);
  along[wd] = rows_shape[wd];
  if (!emit(step(OpId::kView, {HandleRef{index}, Constant(along)}), fresh())) return false;
  int viewed = r_.steps.back().results.at(0);
  IntList full(rows_shape.begin(), rows_shape.end());
  if (!emit(step(OpId::kExpand, {HandleRef{viewed}, Constant(full)}), fresh())) return false;
  int expanded = r_.steps.back().results.at(0);
  std::vector<std::pair<std::string, StepArg>> kw;
  static const char* const kReductions[] = {"sum", "prod", "mean", "amax", "amin"};
  if (dtype_of(h) != DType::kBool && rng_.chance(0.7)) {
    kw.emplace_back("reduce", Constant(std::string(kReductions[rng_.uniform(0, 4)])));
    if (rng_.chance(0.4)) kw.emplace_back("include_self", Constant(false));
  }
  if (!emit(step(OpId::kScatter, {HandleRef{h}, C(d), HandleRef{expanded}, HandleRef{source}}, kw),
            fresh()))
    return false;
  if (rng_.chance(0.5)) return true;
  int written = r_.steps.back().results.at(0);
  return emit(step(OpId::kCopy_, {HandleRef{h}, HandleRef{written}}), fresh());
}

bool Generator::move_softmax() {
  auto h = pick_any();
  if (!h) return false;
  std::vector<StepArg> args = {HandleRef{*h}, C(random_dim(rank_of(*h)))};
  if (rng_.chance(0.15)) args.push_back(Constant(DType::kFloat64));
  return emit(step(rng_.chance(0.7) ? OpId::kSoftmax : OpId::kLogSoftmax, args), fresh());
}

bool Generator::move_creation() {
  auto h = pick_any();
  if (!h) return false;
  const Shape& shape = shape_of(*h);
  switch (rng_.index(6)) {
    case 0:
      return emit(step(OpId::kZerosLike, {HandleRef{*h}}), fresh());
    case 1:
      return emit(step(OpId::kOnesLike, {HandleRef{*h}},
                       {{"dtype",
                         rng_.chance(0.3) ? StepArg(Constant(DType::kFloat32)) : StepArg(none())}}),
                  fresh());
    case 2:
      return emit(step(OpId::kFullLike, {HandleRef{*h}, random_number()}), fresh());
    case 3: {  // full(shape) of a trailing part of a handle's shape: a broadcast partner
      Shape tail(shape.begin() + static_cast<ptrdiff_t>(rng_.index(shape.size() + 1)), shape.end());
      return emit(step(OpId::kFull, {Constant(IntList(tail.begin(), tail.end())), random_number()}),
                  fresh());
    }
    case 4: {  // arange(n) along the last dim
      int64_t n = shape.empty() ? 1 : shape.back();
      std::vector<std::pair<std::string, StepArg>> kw;
      if (rng_.chance(0.5)) kw.emplace_back("dtype", Constant(DType::kFloat32));
      return emit(step(OpId::kArange, {C(0), C(n), C(1)}, kw), fresh());
    }
    default:
      return emit(step(rng_.chance(0.5) ? OpId::kZeros : OpId::kOnes,
                       {Constant(IntList(shape.begin(), shape.end()))}),
                  fresh());
  }
}

bool Generator::move_cast() {
  auto h = pick_any();
  if (!h) return false;
  DType d = random_dtype();
  if (d == dtype_of(*h)) return false;  // to() of the same dtype returns the same object
  return emit(step(OpId::kTo, {HandleRef{*h}, Constant(d)}), fresh());
}

bool Generator::move_matmul() {
  std::vector<int> as = tensors(
      [&](int x) { return is_floating(dtype_of(x)) && rank_of(x) >= 1 && rank_of(x) <= 2; });
  if (as.empty()) return false;
  int a = pick_recent(as);
  int64_t k = shape_of(a).back();
  std::vector<int> bs = tensors([&](int x) {
    const Shape& s = shape_of(x);
    if (!is_floating(dtype_of(x)) || s.empty() || s.size() > 2) return false;
    return (s.size() == 1 ? s[0] : s[0]) == k;
  });
  if (bs.empty()) return false;
  return emit(step(OpId::kMatmul, {HandleRef{a}, HandleRef{rng_.pick(bs)}}), fresh());
}

bool Generator::move_norm() {
  auto h = pick_any();
  if (!h || rank_of(*h) == 0) return false;
  IntList ns = {shape_of(*h).back()};
  if (rng_.chance(0.5)) return emit(step(OpId::kLayerNorm, {HandleRef{*h}, Constant(ns)}), fresh());
  return emit(step(OpId::kRmsNorm, {HandleRef{*h}, Constant(ns)}), fresh());
}

bool Generator::move_as_strided() {
  auto h = pick_any();
  if (!h) return false;
  int64_t n = std::max<int64_t>(type_of(*h).numel(), 1);
  IntList sizes, strides;
  int64_t rank = rng_.uniform(1, 2);
  for (int64_t d = 0; d < rank; ++d) {
    sizes.push_back(rng_.uniform(1, 3));
    strides.push_back(rng_.uniform(0, 2));
  }
  StepArg offset = rng_.chance(0.5) ? StepArg(none()) : StepArg(C(rng_.uniform(0, n - 1)));
  Meta m = view_meta(*h);
  m.overlapping = true;  // as_strided views may overlap themselves
  return emit(step(OpId::kAsStrided, {HandleRef{*h}, Constant(sizes), Constant(strides), offset}),
              m);
}

bool Generator::try_move(Move move) {
  switch (move) {
    case Move::kUnary:
      return move_unary(false);
    case Move::kUnaryInplace:
      return move_unary(true);
    case Move::kBinary:
      return move_binary(false);
    case Move::kBinaryInplace:
      return move_binary(true);
    case Move::kTernary:
      return move_ternary(false);
    case Move::kTernaryInplace:
      return move_ternary(true);
    case Move::kReduction:
      return move_reduction();
    case Move::kView:
      return move_view();
    case Move::kSplit:
      return move_split();
    case Move::kFill:
      return move_fill();
    case Move::kCopy:
      return move_copy();
    case Move::kClone:  // two steps
      return r_.steps.size() + 2 <= kMaxSteps && move_clone();
    case Move::kSetitem:
      return move_setitem();
    case Move::kMetadata:
      return move_metadata();
    case Move::kCat:
      return move_cat();
    case Move::kSoftmax:
      return move_softmax();
    case Move::kCreation:
      return move_creation();
    case Move::kCast:
      return move_cast();
    case Move::kMatmul:
      return move_matmul();
    case Move::kNorm:
      return move_norm();
    case Move::kAsStrided:
      return move_as_strided();
    case Move::kIndex:
      return move_index();
    case Move::kCount:
      break;
  }
  return false;
}

void Generator::make_steps() {
  size_t target = static_cast<size_t>(rng_.uniform(3, static_cast<int64_t>(kMaxSteps)));
  std::vector<double> weights(std::begin(kMoveWeights), std::end(kMoveWeights));
  for (int attempts = 0; r_.steps.size() < target && attempts < 40 * static_cast<int>(target);
       ++attempts)
    try_move(static_cast<Move>(rng_.weighted(weights)));
}

void Generator::choose_returns() {
  size_t count = rng_.weighted({1, 4, 3, 2});
  for (size_t k = 0; k < count; ++k) {
    std::vector<int> hs;
    size_t kind = rng_.weighted({25, 20, 55});
    if (kind == 0) hs = tensors([&](int x) { return meta_[x].is_input; });
    if (kind == 1) hs = tensors([&](int x) { return meta_[x].on_input && !meta_[x].is_input; });
    if (hs.empty()) hs = all_tensors();
    if (hs.empty()) return;
    int h = pick_recent(hs);
    bool seen = std::find(r_.returns.begin(), r_.returns.end(), h) != r_.returns.end();
    if (!seen || rng_.chance(0.1)) r_.returns.push_back(h);
  }
}

}  // namespace kiln::fuzz::generator
