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
// Tests: tests/unit/cpu_backend_test.cpp (through the kernels that use them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/ir/trace.h"

namespace kiln::codegen {

// One coordinate: non-negative int64 arithmetic in C++ text, or a known constant.
struct IndexExpr {
  std::string text;
  std::optional<int64_t> constant;

  static IndexExpr number(int64_t v) { return {std::to_string(v), v}; }
  static IndexExpr var(std::string name) { return {std::move(name), std::nullopt}; }
  bool is_zero() const { return constant && *constant == 0; }
  bool operator==(const IndexExpr& o) const { return text == o.text; }
};
using Index = std::vector<IndexExpr>;

IndexExpr operator+(const IndexExpr& a, const IndexExpr& b);
IndexExpr operator-(const IndexExpr& a, int64_t k);
IndexExpr operator*(const IndexExpr& a, int64_t k);
IndexExpr operator/(const IndexExpr& a, int64_t k);
IndexExpr operator%(const IndexExpr& a, int64_t k);

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
