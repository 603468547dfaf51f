// functionalize: removes mutation from an eager trace (DESIGN.md 2.2).
//
// Every tensor handle is a (storage, view chain) pair; each storage has a current value (an SSA
// value for its whole extent). A read replays the handle's view chain on the current value of
// its storage; a write computes the new value functionally and scatters it back through the
// inverse of the chain (slice_scatter, select_scatter, diagonal_scatter, permute or reshape back,
// as_strided_scatter for as_strided views), giving the storage a new current value. Mutation of
// an intermediate is therefore just a new SSA value, and nothing is left to order. A view_dtype
// step (x.view(torch.int32)) is a bitcast of the value on a read, and a write through it casts
// the written value's bits back to the storage's dtype before the rest of the scatters.
//
//   t0 = ltorch.tanh_(a)         ->   t0 = ltorch.tanh(a)
//   t1 = ltorch.mul(t0, t0)            t1 = ltorch.mul(t0, t0)
//   return {"output": (t1,)}           return {"output": (t1,), "writebacks": {a: t0}}
//
// Requires: a verified eager trace; its alias pattern; the storage analysis of both (layouts of
// every value as eager lays them out).
// Ensures: no mutating op remains and no node has subsymbols (decompositions are inlined); the
// trace's inputs are the pattern's groups (an input that is its own base keeps its name, a
// synthetic base is `baseN`, 1-D) followed by the number inputs; one writeback per input group
// whose memory the program changes; `returns` says how each eager output reaches the caller (a
// fresh value, the caller's own object, or a view of the caller's memory); `metadata` gives the
// final sizes/strides of every caller tensor a metadata mutation changed.
// Tests: tests/lit/functionalize/, tests/unit/differential_test.cpp.
#pragma once

#include <optional>
#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/analysis/storage_analysis.h"
#include "kiln/ir/trace.h"

namespace kiln {

// kFreshView: one of several outputs that share a storage the program allocates (`b = a * 2;
// return b, b.view(-1)`): `index` is the trace output holding that storage's whole value, laid
// out as `storage_geometry` says, and every such output is a view of one fresh buffer, as in
// eager, so a later write through one is seen through the others.
struct ReturnBinding {
  enum class Kind { kValue, kInputObject, kInputView, kFreshView };
  Kind kind = Kind::kValue;
  int index = 0;      // kValue, kFreshView: into trace.outputs(); kInputObject: caller argument;
                      // kInputView: alias group
  Geometry geometry;  // kInputView: the view, relative to the group's base; kValue: the layout
                      // eager gives the fresh tensor, in a storage of `storage_numel` elements;
                      // kFreshView: the view, relative to the fresh storage
  int64_t storage_numel = 0;
  Geometry storage_geometry;  // kFreshView: the storage's whole value within the storage
  // kInputView, kFreshView: the dtype the view reads the storage's bytes as, where it is not the
  // storage's own (a view_dtype view, `x.view(torch.int32)` of a float32 x).
  std::optional<DType> dtype;
  // kValue: a result no caller code sees (a value a differentiated forward saves for its
  // backward), handed out in whatever layout it has: a copy into `geometry` would buy nothing.
  bool any_layout = false;
};

struct MetadataUpdate {
  int arg = 0;        // caller argument whose tensor object changes
  Geometry geometry;  // its new sizes/strides/offset, relative to its group's base
};

// How a compiled program meets its caller: what the executor needs beyond the trace.
struct ProgramInterface {
  std::vector<ReturnBinding> returns;
  std::vector<MetadataUpdate> metadata;
};

struct FunctionalProgram {
  Trace trace;
  ProgramInterface interface;
};

// for_gradients: the program will be differentiated, so a write keeps the written tensor's place
// in eager's graph where eager's does: zero_ becomes fill(old, 0) and copy_ copy(old, src)
// (values as without it; the old value reaches the result, with a zero gradient).
struct FunctionalizeOptions {
  bool for_gradients = false;
};

FunctionalProgram functionalize(const Trace& eager, const AliasPattern& pattern,
                                const StorageAnalysis& storage,
                                const FunctionalizeOptions& options = {});

}  // namespace kiln
