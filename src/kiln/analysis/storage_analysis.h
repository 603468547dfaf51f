// Abstract eager execution: for every value of an eager trace, the storage it lives in and its
// geometry (sizes, strides, offset) exactly as eager PyTorch — and the reference interpreter —
// would lay it out, without computing any data. Functionalization needs it: whether `reshape`
// was a view, which handles share memory, what `as_strided` addresses, and what a returned view
// of an input looks like all follow from these layouts.
//
// Requires: a verified eager trace and an alias pattern for its inputs.
// Ensures: storage_of / geometry_of for every tensor value (subsymbol values included). Input
// storages are the pattern's groups (ids 0 .. groups-1); every op that allocates gets a fresh id,
// with the element count the interpreter allocates (a scatter copies its input's whole storage).
// Raises the UserErrors eager raises for layouts (`view` of incompatible strides, `as_strided`
// outside the storage, writes into internally overlapping memory, partially overlapping in-place
// operands) at the op's source line.
//
// Values are SSA names of tensor *objects* (handles) at one point in program order, and
// geometry_of(v) is the layout v had when it was defined. A metadata mutation (`x.t_()`) changes
// the object itself, so in eager every name of that object sees the new layout from then on: the
// analysis tracks objects too (handle_of), reads every operand through its object's current
// layout as the interpreter does, and final_placement gives each object's layout after the trace
// (what the caller's input tensor looks like afterwards). In-place ops, `to` to the same dtype,
// flatten(d, d) and the duplicates of an input (AliasPattern::Input::duplicate_of) name the object
// of their argument; every other op makes a new object.
// Tests: tests/unit/storage_analysis_test.cpp (checked against the interpreter's real layouts).
#pragma once

#include <unordered_map>
#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/analysis/geometry.h"
#include "kiln/ir/trace.h"

namespace kiln {

// The geometry view op `view` gives `g`, with the arguments read by name from `node`: a view node
// itself, or a metadata mutation or scatter whose parameters are named as its view's are
// (transpose_ and transpose, slice_scatter and slice, ...). `origin`: where the storage's element
// 0 sits in the caller's storage (as_strided offsets are absolute there). The views with one
// output and a geometry fixed by their arguments only (not view/reshape, getitem or the splits).
Geometry apply_view(OpId view, const Node& node, const Geometry& g, int64_t origin);

struct StorageInfo {
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  int input_group = -1;  // the alias-pattern group for input storages, else -1
  // For storages that stand for (part of) a caller's storage — input groups, and scatter copies
  // of them — where their element 0 sits in the caller's storage. as_strided's storage_offset
  // counts from the caller's storage start, so it is rebased by this.
  int64_t caller_offset = 0;
};

class StorageAnalysis {
 public:
  int storage_of(const Value* v) const { return placement_.at(v).storage; }
  const Geometry& geometry_of(const Value* v) const { return placement_.at(v).geometry; }
  const StorageInfo& storage(int id) const { return storages_.at(static_cast<size_t>(id)); }
  StorageInfo& storage_mut(int id) { return storages_.at(static_cast<size_t>(id)); }
  size_t num_storages() const { return storages_.size(); }

  // The tensor object `v` names; values of one object share the id (0 .. num_handles-1).
  int handle_of(const Value* v) const { return handle_of_.at(v); }
  size_t num_handles() const { return handles_.size(); }

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
  const Placement& placement_of(const Value* v) const { return placement_.at(v); }
  // An object's storage and layout after the whole trace (its latest metadata mutation).
  const Placement& final_placement(int handle) const {
    return handles_.at(static_cast<size_t>(handle));
  }
  // Objects: `v` names a new one placed at `p`, or the existing object `handle`; restride moves
  // an object to a new layout (a metadata mutation).
  int new_handle(const Value* v, Placement p);
  void name_handle(const Value* v, int handle);
  void restride(int handle, Geometry g);

 private:
  std::vector<StorageInfo> storages_;
  std::unordered_map<const Value*, Placement> placement_;
  std::vector<Placement> handles_;  // each object's current placement
  std::unordered_map<const Value*, int> handle_of_;
};

StorageAnalysis analyze_storage(const Trace& trace, const AliasPattern& pattern);

}  // namespace kiln
