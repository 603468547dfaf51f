// Index arithmetic for kernels: an element index of a value as symbolic expressions over the loop
// variables (C++ text, folded when constant), and the map each view op applies to it — the index
// of the view's input that a given index of its output reads. A fused kernel never materializes a
// view: it evaluates the viewed value at the mapped index (DESIGN.md 3, "each load carries the
// index map of its view chain").
//
//   t1 = transpose(t0, 0, 1)   ; t0 [2, 3]
//   t1 at (i0, i1)  reads  t0 at (i1, i0)
//   t2 = reshape(t0, [6])
//   t2 at (i0)      reads  t0 at (i0 / 3, i0 % 3)
//
// Tests: tests/unit/index_map_test.cpp (bounds, exact quotients), and through the kernels that use
// them tests/unit/cpu_backend_test.cpp and tests/lit/codegen.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ir/trace.h"

namespace kiln::codegen {

// One coordinate: non-negative int64 arithmetic in C++ text, or a known constant.
//
// `range` bounds its value (inclusive) wherever the kernel evaluates it, when that is known: loop
// indices and reduction indices have their extent, and the operators below carry bounds through.
// Under a scatter's condition a load whose index is inside the tensor needs no guard.
//
// `exact_dividend` marks a quotient made by exact_div, which is exact wherever its value is used
// (under the scatter condition that the dividend is a multiple): a slice with that step maps it
// back to the dividend, where that is inside the slice's input. So a strided scatter's src read
// through the matching strided slice,
//   x[:, ::2].mul_(0.5):  slot j = i1 / 2 (exact where i1 % 2 == 0), src at (j * 2) = i1
// loads x at the iteration's own element, which a vector load can do.
//
// `modulus` > 0: the value is modulus * quotient + residue (0 <= residue < modulus), where
// `quotient` is C++ text: a position of a CPU pass split by residue (cpu_residue_split), and
// what is computed from it by adding constants. Whether it is a multiple of a divisor of the
// modulus is known (known_multiple), and its exact quotient by the modulus is `quotient`:
//   rd = 2*q + 1: (rd) % 2 == 0 is false; rd = 2*q: exact_div(rd, 2) is q.
struct IndexExpr {
  std::string text;
  std::optional<int64_t> constant = std::nullopt;
  std::optional<std::pair<int64_t, int64_t>> range = std::nullopt;
  std::shared_ptr<const IndexExpr> exact_dividend = nullptr;
  int64_t exact_divisor = 0;
  int64_t modulus = 0, residue = 0;
  std::string quotient = {};

  static IndexExpr number(int64_t v) { return {std::to_string(v), v, std::pair{v, v}}; }
  static IndexExpr var(std::string name) { return {std::move(name)}; }
  static IndexExpr bounded(std::string name, int64_t lo, int64_t hi) {
    return {std::move(name), std::nullopt, std::pair{lo, hi}};
  }
  bool is_zero() const { return constant && *constant == 0; }
  bool operator==(const IndexExpr& o) const { return text == o.text; }
};
using Index = std::vector<IndexExpr>;

IndexExpr operator+(const IndexExpr& a, const IndexExpr& b);
IndexExpr operator-(const IndexExpr& a, int64_t k);
// a - `name`, a size the kernel reads at run time whose value is `value` in this lowering (its
// range moves by that, as for a - value; the text reads the name).
IndexExpr minus_runtime(const IndexExpr& a, const std::string& name, int64_t value);
IndexExpr operator*(const IndexExpr& a, int64_t k);
IndexExpr operator/(const IndexExpr& a, int64_t k);
IndexExpr operator%(const IndexExpr& a, int64_t k);
// a / k, where the caller guarantees that a is a multiple of k wherever the quotient's value is
// used (elsewhere only its bounds matter): see IndexExpr.
IndexExpr exact_div(const IndexExpr& a, int64_t k);
// Whether a is a multiple of k, where its residue says (a position of a pass split by residue).
std::optional<bool> known_multiple(const IndexExpr& a, int64_t k);
// Whether every coordinate is known to lie inside `shape`.
bool inside_shape(const Index& index, const Shape& shape);

// "i0, i1" — a memo key for a value evaluated at this index.
std::string index_key(const Index& index);

// The index of a loop nest over `shape`: i0, i1, ... (0 on dims of size 1).
Index loop_index(const Shape& shape);

// An operand of shape `from`, broadcast (right-aligned) to the shape `at` indexes.
Index broadcast_index(const Index& at, const Shape& from);

// The same elements in row-major order under another shape (reshape, view, flatten, unflatten,
// squeeze, unsqueeze): dims are matched in groups of equal element count, so only a group that
// really merges or splits dims divides.
Index reshape_index(const Index& at, const Shape& at_shape, const Shape& to_shape);

// For output `output` of the view node `node` evaluated at `at`: the index of its input (operand
// 0) it reads. nullopt for as_strided, which reads its input's storage and not its elements.
std::optional<Index> view_source_index(const Node& node, size_t output, const Index& at);

}  // namespace kiln::codegen
