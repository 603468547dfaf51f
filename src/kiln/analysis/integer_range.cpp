#include "kiln/analysis/integer_range.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <set>

#include "kiln/ir/op.h"

namespace kiln {

namespace {

// Beyond this magnitude a sum or product could overflow int64: unknown.
constexpr int64_t kLimit = int64_t{1} << 60;
// A chain longer than this is not followed (the walk recurses).
constexpr int kMaxDepth = 64;

using Range = std::optional<IntegerRange>;

Range bounded(int64_t lo, int64_t hi) {
  if (lo < -kLimit || hi > kLimit) return std::nullopt;
  return IntegerRange{lo, hi};
}

Range join(const Range& a, const Range& b) {
  if (!a || !b) return std::nullopt;
  return IntegerRange{std::min(a->lo, b->lo), std::max(a->hi, b->hi)};
}

Range scaled(const Range& r, int64_t k) {
  if (!r || k > kLimit || k < -kLimit) return std::nullopt;
  if ((r->lo != 0 && kLimit / std::max<int64_t>(1, std::abs(r->lo)) < std::abs(k)) ||
      (r->hi != 0 && kLimit / std::max<int64_t>(1, std::abs(r->hi)) < std::abs(k)))
    return std::nullopt;
  int64_t a = r->lo * k, b = r->hi * k;
  return bounded(std::min(a, b), std::max(a, b));
}

class RangeOf {
 public:
  explicit RangeOf(const std::function<const Value*(const Value*)>& outer) : outer_(outer) {}

  Range of(const Value* v, int depth) {
    if (depth > kMaxDepth || !v->is_tensor()) return std::nullopt;
    if (!is_integral(v->tensor_type().dtype, /*include_bool=*/false)) return std::nullopt;
    const Node* p = v->producer();
    if (!p) {
      if (const Value* from = outer_ ? outer_(v) : nullptr) return of(from, depth + 1);
      if (const auto& known = v->known_range()) return bounded(known->first, known->second);
      return std::nullopt;
    }
    Range r = node_range(*p, depth);
    // A sum past int32's range wraps around in an int32 tensor: unknown.
    if (r && v->tensor_type().dtype == DType::kInt32 && (r->lo < INT32_MIN || r->hi > INT32_MAX))
      return std::nullopt;
    return r;
  }

 private:
  // A tensor operand's range, or a number's.
  Range operand(const Operand& o, int depth) {
    if (o.is_value()) {
      const Value* v = o.value();
      if (v->is_tensor()) return of(v, depth + 1);
      return std::nullopt;  // a number only known when the program runs
    }
    if (o.is_constant() && std::holds_alternative<int64_t>(o.constant()))
      return bounded(o.as_int(), o.as_int());
    return std::nullopt;
  }

  Range node_range(const Node& n, int depth) {
    const OpInfo& op = *n.op;
    if (op.kind == OpKind::kView) {
      // Every element of a view is an element of its input (as_strided may reach others, and a
      // view as another dtype reads other values).
      if (n.id() == OpId::kAsStrided || n.outputs.size() != 1 || !n.input(0)->is_tensor() ||
          n.input(0)->tensor_type().dtype != n.outputs[0]->tensor_type().dtype)
        return std::nullopt;
      return of(n.input(0), depth + 1);
    }
    switch (n.id()) {
      case OpId::kArange: {
        const Operand &start = n.arg("start"), &step = n.arg("step");
        if (!start.is_constant() || !step.is_constant() ||
            !std::holds_alternative<int64_t>(start.constant()) ||
            !std::holds_alternative<int64_t>(step.constant()))
          return std::nullopt;
        const int64_t count = n.outputs[0]->tensor_type().numel();
        if (count == 0) return std::nullopt;
        return join(bounded(start.as_int(), start.as_int()),
                    operand_shifted(start.as_int(), step.as_int(), count - 1));
      }
      case OpId::kFull: {
        const Operand& fill = n.arg("fill_value");
        return operand(fill, depth);
      }
      case OpId::kAdd:
      case OpId::kSub: {
        Range a = operand(n.operands.at(0), depth), b = operand(n.operands.at(1), depth);
        const Operand& alpha = n.arg("alpha");
        if (!a || !b || !alpha.is_constant() || !std::holds_alternative<int64_t>(alpha.constant()))
          return std::nullopt;
        Range term = scaled(b, n.id() == OpId::kSub ? -alpha.as_int() : alpha.as_int());
        if (!term) return std::nullopt;
        return bounded(a->lo + term->lo, a->hi + term->hi);
      }
      case OpId::kMul: {
        Range a = operand(n.operands.at(0), depth);
        const Operand& k = n.operands.at(1);
        if (!k.is_constant() || !std::holds_alternative<int64_t>(k.constant())) return std::nullopt;
        return scaled(a, k.as_int());
      }
      case OpId::kClamp: {
        Range a = operand(n.operands.at(0), depth);
        if (!a) return std::nullopt;
        int64_t lo = a->lo, hi = a->hi;
        if (Range m = n.operands.at(1).is_none() ? Range{} : operand(n.operands.at(1), depth)) {
          if (m->lo != m->hi) return std::nullopt;
          lo = std::max(lo, m->lo), hi = std::max(hi, m->lo);
        } else if (!n.operands.at(1).is_none()) {
          return std::nullopt;
        }
        if (Range m = n.operands.at(2).is_none() ? Range{} : operand(n.operands.at(2), depth)) {
          if (m->lo != m->hi) return std::nullopt;
          lo = std::min(lo, m->lo), hi = std::min(hi, m->lo);
        } else if (!n.operands.at(2).is_none()) {
          return std::nullopt;
        }
        return IntegerRange{lo, hi};
      }
      case OpId::kWhere:
        return join(operand(n.operands.at(1), depth), operand(n.operands.at(2), depth));
      case OpId::kCat:
      case OpId::kStack: {
        Range r;
        bool first = true;
        for (const Value* in : n.arg(0).values()) {
          if (in->tensor_type().numel() == 0) continue;
          Range part = of(in, depth + 1);
          r = first ? part : join(r, part);
          first = false;
          if (!r) return std::nullopt;
        }
        return r;
      }
      case OpId::kWrapIndex: {  // index + size where negative, for an index in [-size, size)
        Range a = operand(n.operands.at(0), depth);
        const int64_t size = n.arg(1).as_int();
        if (!a || a->lo < -size || a->hi >= size) return std::nullopt;
        return a->lo >= 0 ? a : Range{IntegerRange{0, size - 1}};
      }
      default:
        return std::nullopt;
    }
  }

  // start + step * last, as a one-point range (nullopt on overflow).
  static Range operand_shifted(int64_t start, int64_t step, int64_t last) {
    Range s = scaled(IntegerRange{last, last}, step);
    if (!s) return std::nullopt;
    return bounded(start + s->lo, start + s->hi);
  }

  const std::function<const Value*(const Value*)>& outer_;
};

// drawn_from's walk: true when every element of `v` is an element of the values it collects or a
// constant the walk allows (constant_allowed, or one of `excluded`: a value a where's guard
// keeps out of the operand it selects).
struct DrawnWalk {
  const std::function<bool(int64_t)>& constant_allowed;
  const std::function<const Value*(const Value*)>& outer;
  std::vector<DrawnInput> sources;

  // A number taken as an element of dtype `d`: an int64 one, which `d` holds as it is (an int32
  // index's elements are int32).
  bool constant(const Operand& o, DType d, const std::set<int64_t>& excluded) const {
    const auto* c = o.is_constant() ? std::get_if<int64_t>(&o.constant()) : nullptr;
    if (!c || (d != DType::kInt64 && (d != DType::kInt32 || *c != static_cast<int32_t>(*c))))
      return false;
    return excluded.contains(*c) || (constant_allowed && constant_allowed(*c));
  }

  // The constant a where's condition keeps out of its operand `k`: where(ne(x, c), x, y) selects
  // from x only where x != c, as where(eq(x, c), y, x) does (a loss's ignore_index masked to 0).
  static std::optional<int64_t> guarded(const Node& where, int k) {
    const Operand& cond = where.operands.at(0);
    if (!cond.is_value() || !cond.value()->producer()) return std::nullopt;
    const Node& test = *cond.value()->producer();
    const bool keeps = (test.id() == OpId::kNe && k == 1) || (test.id() == OpId::kEq && k == 2);
    const Operand& selected = where.operands.at(static_cast<size_t>(k));
    if (!keeps || !selected.is_value() || test.operands.at(0).value() != selected.value())
      return std::nullopt;
    const Operand& c = test.operands.at(1);
    const auto* value = c.is_constant() ? std::get_if<int64_t>(&c.constant()) : nullptr;
    if (!value) return std::nullopt;
    return *value;
  }

  bool collect(const Value* v, int depth, const std::set<int64_t>& excluded) {
    if (depth > kMaxDepth || !v->is_tensor()) return false;
    const Node* p = v->producer();
    if (!p) {
      if (outer)
        if (const Value* from = outer(v)) return collect(from, depth + 1, excluded);
      // An input reached on several paths keeps out only what every path keeps out.
      std::vector<int64_t> kept_out(excluded.begin(), excluded.end());
      auto seen = std::find_if(sources.begin(), sources.end(),
                               [&](const DrawnInput& d) { return d.input == v; });
      if (seen == sources.end()) {
        sources.push_back({v, std::move(kept_out)});
      } else {
        std::vector<int64_t> both;
        std::set_intersection(seen->never_selected.begin(), seen->never_selected.end(),
                              kept_out.begin(), kept_out.end(), std::back_inserter(both));
        seen->never_selected = std::move(both);
      }
      return true;
    }
    auto same_dtype = [&](const Value* in) {
      return in->is_tensor() && in->tensor_type().dtype == v->tensor_type().dtype;
    };
    auto from = [&](const Operand& o, const std::set<int64_t>& out) {
      if (o.is_value()) return same_dtype(o.value()) && collect(o.value(), depth + 1, out);
      return constant(o, v->tensor_type().dtype, out);
    };
    if (p->op->kind == OpKind::kView) {
      // (as_strided may reach elements outside its input's; a view as another dtype reads bytes)
      if (p->id() == OpId::kAsStrided || p->outputs.size() != 1 || !same_dtype(p->input(0)))
        return false;
      return collect(p->input(0), depth + 1, excluded);
    }
    switch (p->id()) {
      case OpId::kGather:
      case OpId::kIndexSelect:
        return same_dtype(p->input(0)) && collect(p->input(0), depth + 1, excluded);
      case OpId::kCopy:  // src, broadcast to self's shape
        return from(p->operands.at(1), excluded);
      case OpId::kSliceScatter:  // self where src does not land, src where it does
      case OpId::kSelectScatter:
        return from(p->operands.at(0), excluded) && from(p->operands.at(1), excluded);
      case OpId::kFull:
      case OpId::kFullLike:
        return from(p->arg("fill_value"), excluded);
      case OpId::kZeros:
      case OpId::kZerosLike:
        return from(Operand(Constant(int64_t{0})), excluded);
      case OpId::kWhere:
        for (int k = 1; k <= 2; ++k) {
          std::set<int64_t> out = excluded;
          if (std::optional<int64_t> kept_out = guarded(*p, k)) out.insert(*kept_out);
          if (!from(p->operands.at(static_cast<size_t>(k)), out)) return false;
        }
        return true;
      case OpId::kCat:
      case OpId::kStack:
        for (const Value* in : p->arg(0).values())
          if (!same_dtype(in) || !collect(in, depth + 1, excluded)) return false;
        return true;
      default:
        return false;
    }
  }
};

}  // namespace

std::vector<DrawnInput> drawn_from(const Value* v,
                                   const std::function<bool(int64_t)>& constant_allowed,
                                   const std::function<const Value*(const Value*)>& outer) {
  DrawnWalk walk{constant_allowed, outer, {}};
  if (!walk.collect(v, 0, {})) return {};
  return walk.sources;
}

std::optional<IntegerRange> integer_range(const Value* v,
                                          const std::function<const Value*(const Value*)>& outer) {
  return RangeOf(outer).of(v, 0);
}

}  // namespace kiln
