#include "kiln/codegen/index_map.h"

#include <algorithm>

#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln::codegen {

namespace {

bool is_sum_or_product(const std::string& t) {
  for (char c : t)
    if (c == ' ' || c == '*' || c == '/' || c == '%' || c == '+' || c == '-') return true;
  return false;
}
// Parenthesized when it is a compound expression.
std::string operand(const IndexExpr& e) {
  return is_sum_or_product(e.text) ? "(" + e.text + ")" : e.text;
}

using Range = std::optional<std::pair<int64_t, int64_t>>;

// Bounds of lo..hi under an operation, or none when one is unknown or would overflow.
Range add_ranges(const Range& a, const Range& b) {
  if (!a || !b) return std::nullopt;
  int64_t lo, hi;
  if (__builtin_add_overflow(a->first, b->first, &lo) ||
      __builtin_add_overflow(a->second, b->second, &hi))
    return std::nullopt;
  return std::pair{lo, hi};
}
Range scale_range(const Range& a, int64_t k) {  // k > 0
  if (!a) return std::nullopt;
  int64_t lo, hi;
  if (__builtin_mul_overflow(a->first, k, &lo) || __builtin_mul_overflow(a->second, k, &hi))
    return std::nullopt;
  return std::pair{lo, hi};
}

}  // namespace

namespace {

// a + k keeps a's residue: m*q + r + k = m*(q + o) + r' with 0 <= r' < m.
void shift_residue(const IndexExpr& a, int64_t k, IndexExpr& sum) {
  if (a.modulus <= 0) return;
  const int64_t m = a.modulus, r = ((a.residue + k) % m + m) % m, o = (a.residue + k - r) / m;
  sum.modulus = m;
  sum.residue = r;
  sum.quotient =
      o == 0 ? a.quotient
             : "(" + a.quotient + (o > 0 ? " + " : " - ") + std::to_string(o > 0 ? o : -o) + ")";
}

}  // namespace

IndexExpr operator+(const IndexExpr& a, const IndexExpr& b) {
  if (a.constant && b.constant) return IndexExpr::number(*a.constant + *b.constant);
  if (a.is_zero()) return b;
  if (b.is_zero()) return a;
  IndexExpr sum{a.text + " + " + b.text, std::nullopt, add_ranges(a.range, b.range)};
  if (b.constant) shift_residue(a, *b.constant, sum);
  if (a.constant) shift_residue(b, *a.constant, sum);
  return sum;
}

IndexExpr operator-(const IndexExpr& a, int64_t k) {
  if (a.constant) return IndexExpr::number(*a.constant - k);
  if (k == 0) return a;
  IndexExpr difference{a.text + " - " + std::to_string(k), std::nullopt,
                       add_ranges(a.range, std::pair{-k, -k})};
  shift_residue(a, -k, difference);
  return difference;
}

IndexExpr minus_runtime(const IndexExpr& a, const std::string& name, int64_t value) {
  return {operand(a) + " - " + name, std::nullopt, add_ranges(a.range, std::pair{-value, -value})};
}

IndexExpr operator*(const IndexExpr& a, int64_t k) {
  if (a.constant) return IndexExpr::number(*a.constant * k);
  if (k == 0) return IndexExpr::number(0);
  if (k == 1) return a;
  Range r = k > 0 ? scale_range(a.range, k) : std::nullopt;
  return {operand(a) + "*" + std::to_string(k), std::nullopt, r};
}

IndexExpr operator/(const IndexExpr& a, int64_t k) {
  KILN_ASSERT(k > 0) << "index division by " << k;
  if (a.constant) return IndexExpr::number(*a.constant / k);
  if (k == 1) return a;
  // C++ division truncates toward zero, which is monotonic: the bounds divide.
  Range r;
  if (a.range) r = std::pair{a.range->first / k, a.range->second / k};
  return {operand(a) + " / " + std::to_string(k), std::nullopt, r};
}

IndexExpr operator%(const IndexExpr& a, int64_t k) {
  KILN_ASSERT(k > 0) << "index modulo by " << k;
  if (a.constant) return IndexExpr::number(*a.constant % k);
  if (k == 1) return IndexExpr::number(0);
  Range r;
  if (a.range && a.range->first >= 0)
    r = a.range->second < k ? *a.range : std::pair<int64_t, int64_t>{0, k - 1};
  return {operand(a) + " % " + std::to_string(k), std::nullopt, r};
}

std::optional<bool> known_multiple(const IndexExpr& a, int64_t k) {
  if (a.constant) return *a.constant % k == 0;
  if (a.modulus > 0 && a.modulus % k == 0) return a.residue % k == 0;
  return std::nullopt;
}

IndexExpr exact_div(const IndexExpr& a, int64_t k) {
  // A multiple of its modulus k: the quotient, with the bounds of the division.
  if (k > 1 && a.modulus == k && a.residue == 0 && !a.constant) {
    IndexExpr q{
        a.quotient, std::nullopt,
        a.range ? std::optional(std::pair{a.range->first / k, a.range->second / k}) : std::nullopt};
    q.exact_dividend = std::make_shared<const IndexExpr>(a);
    q.exact_divisor = k;
    return q;
  }
  IndexExpr q = a / k;
  if (k > 1 && !q.constant) {
    q.exact_dividend = std::make_shared<const IndexExpr>(a);
    q.exact_divisor = k;
  }
  return q;
}

bool inside_shape(const Index& index, const Shape& shape) {
  if (index.size() != shape.size()) return false;
  for (size_t d = 0; d < index.size(); ++d) {
    const auto& r = index[d].range;
    if (!r || r->first < 0 || r->second >= shape[d]) return false;
  }
  return true;
}

std::string index_key(const Index& index) {
  std::string key;
  for (size_t d = 0; d < index.size(); ++d)
    key += (d ? ", " : "") + index[d].text;
  return key;
}

Index loop_index(const Shape& shape) {
  Index at;
  for (size_t d = 0; d < shape.size(); ++d)
    at.push_back(shape[d] == 1 ? IndexExpr::number(0)
                               : IndexExpr::bounded("i" + std::to_string(d), 0, shape[d] - 1));
  return at;
}

Index broadcast_index(const Index& at, const Shape& from) {
  KILN_ASSERT(from.size() <= at.size()) << "broadcast to a lower rank";
  size_t lead = at.size() - from.size();
  Index out;
  for (size_t d = 0; d < from.size(); ++d)
    out.push_back(from[d] == 1 ? IndexExpr::number(0) : at[d + lead]);
  return out;
}

Index reshape_index(const Index& at, const Shape& at_shape, const Shape& to_shape) {
  KILN_ASSERT(at.size() == at_shape.size()) << "index rank";
  KILN_ASSERT(shape_numel(at_shape) == shape_numel(to_shape)) << "reshape changes the numel";
  Index out(to_shape.size(), IndexExpr::number(0));
  if (shape_numel(to_shape) == 0) return out;  // nothing is ever read
  // Dims of size 1 have index 0 and take no part; the others are matched in groups.
  std::vector<size_t> from_dims, to_dims;
  for (size_t d = 0; d < at_shape.size(); ++d)
    if (at_shape[d] != 1) from_dims.push_back(d);
  for (size_t d = 0; d < to_shape.size(); ++d)
    if (to_shape[d] != 1) to_dims.push_back(d);
  size_t i = 0, j = 0;
  while (i < from_dims.size() && j < to_dims.size()) {
    std::vector<size_t> gi = {from_dims[i++]}, gj = {to_dims[j++]};
    int64_t pi = at_shape[gi[0]], pj = to_shape[gj[0]];
    while (pi != pj) {
      if (pi < pj) {
        gi.push_back(from_dims[i]);
        pi *= at_shape[from_dims[i++]];
      } else {
        gj.push_back(to_dims[j]);
        pj *= to_shape[to_dims[j++]];
      }
    }
    if (gi.size() == 1 && gj.size() == 1) {
      out[gj[0]] = at[gi[0]];
      continue;
    }
    // The group's linear position, then its digits in the target's sizes.
    IndexExpr linear = IndexExpr::number(0);
    for (size_t k = 0; k < gi.size(); ++k) {
      int64_t weight = 1;
      for (size_t l = k + 1; l < gi.size(); ++l)
        weight *= at_shape[gi[l]];
      linear = linear + at[gi[k]] * weight;
    }
    for (size_t k = 0; k < gj.size(); ++k) {
      int64_t weight = 1;
      for (size_t l = k + 1; l < gj.size(); ++l)
        weight *= to_shape[gj[l]];
      IndexExpr digit = linear / weight;
      out[gj[k]] = k == 0 ? digit : digit % to_shape[gj[k]];
    }
  }
  return out;
}

std::optional<Index> view_source_index(const Node& node, size_t output, const Index& at) {
  const Shape& in_shape = node.input(0)->tensor_type().shape;
  const Shape& out_shape = node.outputs.at(output)->tensor_type().shape;
  auto rank = static_cast<int64_t>(in_shape.size());
  auto dim_arg = [&](std::string_view name, int64_t r) {
    return static_cast<size_t>(wrap_dim(node.arg(name).as_int(), r));
  };
  Index in = at;
  switch (node.id()) {
    case OpId::kAlias:
    case OpId::kDetach:
      return in;
    case OpId::kView:
    case OpId::kReshape:
    case OpId::kFlatten:
    case OpId::kUnflatten:
    case OpId::kSqueeze:
    case OpId::kUnsqueeze:
      return reshape_index(at, out_shape, in_shape);
    case OpId::kSlice: {
      size_t d = dim_arg("dim", rank);
      int64_t start, end;
      normalize_slice(in_shape[d], node.arg("start").as_optional_int(),
                      node.arg("end").as_optional_int(), &start, &end);
      int64_t step = node.arg("step").as_int();
      in[d] = IndexExpr::number(start) + at[d] * step;
      // The slot of a strided scatter read through the matching strided slice: start + the
      // dividend itself, where that stays inside the input (elsewhere the product above is).
      if (at[d].exact_dividend && at[d].exact_divisor == step) {
        IndexExpr direct = IndexExpr::number(start) + *at[d].exact_dividend;
        if (inside_shape({direct}, {in_shape[d]})) in[d] = direct;
      }
      return in;
    }
    case OpId::kNarrow: {
      size_t d = dim_arg("dim", rank);
      int64_t start = node.arg("start").as_int();
      if (start < 0) start += in_shape[d];
      in[d] = IndexExpr::number(start) + at[d];
      return in;
    }
    case OpId::kSelect: {
      size_t d = dim_arg("dim", rank);
      int64_t index = node.arg("index").as_int();
      if (index < 0) index += in_shape[d];
      in.insert(in.begin() + static_cast<int64_t>(d), IndexExpr::number(index));
      return in;
    }
    case OpId::kPermute: {
      const IntList& dims = node.arg("dims").as_ints();
      for (size_t k = 0; k < dims.size(); ++k)
        in[static_cast<size_t>(wrap_dim(dims[k], rank))] = at[k];
      return in;
    }
    case OpId::kTranspose: {
      if (rank == 0) return in;
      std::swap(in[dim_arg("dim0", rank)], in[dim_arg("dim1", rank)]);
      return in;
    }
    case OpId::kT:
      std::reverse(in.begin(), in.end());
      return in;
    case OpId::kExpand:
      return broadcast_index(at, in_shape);
    case OpId::kDiagonal: {
      int64_t offset = node.arg("offset").as_int();
      size_t d1 = dim_arg("dim1", rank), d2 = dim_arg("dim2", rank);
      const IndexExpr& k = at.back();
      in.clear();
      size_t next = 0;
      for (size_t d = 0; d < in_shape.size(); ++d) {
        if (d == d1)
          in.push_back(k + IndexExpr::number(std::max<int64_t>(-offset, 0)));
        else if (d == d2)
          in.push_back(k + IndexExpr::number(std::max<int64_t>(offset, 0)));
        else
          in.push_back(at[next++]);
      }
      return in;
    }
    case OpId::kSplit:
    case OpId::kChunk: {
      size_t d = dim_arg("dim", rank);
      std::vector<int64_t> sizes = node.id() == OpId::kSplit
                                       ? split_sizes(in_shape[d], node.arg("split_size"))
                                       : chunk_sizes(in_shape[d], node.arg("chunks").as_int());
      int64_t start = 0;
      for (size_t k = 0; k < output; ++k)
        start += sizes[k];
      in[d] = at[d] + IndexExpr::number(start);
      return in;
    }
    case OpId::kUnbind: {
      size_t d = dim_arg("dim", rank);
      in.insert(in.begin() + static_cast<int64_t>(d),
                IndexExpr::number(static_cast<int64_t>(output)));
      return in;
    }
    default:
      return std::nullopt;
  }
}

}  // namespace kiln::codegen
