// Abstract eager execution: for every value of an eager trace, the storage it lives in and its
// geometry (sizes, strides, offset) exactly as eager PyTorch — and the reference interpreter —
// would lay it out, without computing any data. Functionalization needs it: whether `reshape`
// was a view, which handles share memory, what `as_strided` addresses, and what a returned view
// of an input looks like all follow from these layouts.
//
// Requires: a verified eager trace and an alias pattern for its inputs.
// Ensures: storage_of / geometry_of for every tensor value (subsymbol values included). Input
// storages are the pattern's groups (ids 0 .. groups-1); every op that allocates gets a fresh id.
// Raises the UserErrors eager raises for layouts (`view` of incompatible strides, writes into
// internally overlapping memory) at the op's source line.
// Tests: tests/unit/storage_analysis_test.cpp (checked against the interpreter's real layouts).
#pragma once

#include <unordered_map>
#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/ir/trace.h"

namespace kiln {

struct StorageInfo {
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  int input_group = -1;  // the alias-pattern group for input storages, else -1
};

class StorageAnalysis {
 public:
  int storage_of(const Value* v) const { return placement_.at(v).storage; }
  const Geometry& geometry_of(const Value* v) const { return placement_.at(v).geometry; }
  const StorageInfo& storage(int id) const { return storages_.at(static_cast<size_t>(id)); }
  size_t num_storages() const { return storages_.size(); }

  // Used while analyzing.
  struct Placement {
    int storage = -1;
    Geometry geometry;
  };
  int add_storage(StorageInfo info) {
    storages_.push_back(info);
    return static_cast<int>(storages_.size()) - 1;
  }
  void place(const Value* v, Placement p) { placement_[v] = std::move(p); }
  bool has(const Value* v) const { return placement_.contains(v); }

 private:
  std::vector<StorageInfo> storages_;
  std::unordered_map<const Value*, Placement> placement_;
};

StorageAnalysis analyze_storage(const Trace& trace, const AliasPattern& pattern);

}  // namespace kiln
