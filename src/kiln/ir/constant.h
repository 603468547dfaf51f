// Compile-time constant arguments of ops (Python literals in the printed trace): None, bools,
// ints, floats, dtypes, int lists, strings, devices and __getitem__ keys.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/ir/dtype.h"

namespace kiln {

struct NoneValue {
  bool operator==(const NoneValue&) const = default;
};

// One element of a __getitem__ key: an int, a slice, None (new axis) or Ellipsis.
struct IndexItem {
  enum class Kind : uint8_t { kInt, kSlice, kNone, kEllipsis };
  Kind kind = Kind::kInt;
  int64_t index = 0;             // kInt
  std::optional<int64_t> start;  // kSlice
  std::optional<int64_t> stop;   // kSlice
  std::optional<int64_t> step;   // kSlice
  bool operator==(const IndexItem&) const = default;

  static IndexItem integer(int64_t i) { return {Kind::kInt, i, {}, {}, {}}; }
  static IndexItem slice(std::optional<int64_t> start = {}, std::optional<int64_t> stop = {},
                         std::optional<int64_t> step = {}) {
    return {Kind::kSlice, 0, start, stop, step};
  }
  static IndexItem new_axis() { return {Kind::kNone, 0, {}, {}, {}}; }
  static IndexItem ellipsis() { return {Kind::kEllipsis, 0, {}, {}, {}}; }
};
using IndexKey = std::vector<IndexItem>;

using IntList = std::vector<int64_t>;

using Constant =
    std::variant<NoneValue, bool, int64_t, double, DType, IntList, std::string, Device, IndexKey>;

// Python source for a constant: None, True, 3, 2.5, float('inf'), torch.float32, [1, 2], "floor",
// "cuda:0" (devices print as strings, as torch accepts them), (0, slice(None, None, 2), None, ...).
std::string constant_str(const Constant& c);

// Python-style repr of a float that reads back to the same double.
std::string float_str(double value);

inline bool is_none(const Constant& c) {
  return std::holds_alternative<NoneValue>(c);
}
// A Python number (bool, int or float) as a double / int; asserts on other kinds.
bool is_number(const Constant& c);
double number_as_double(const Constant& c);

}  // namespace kiln
