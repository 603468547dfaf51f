// Which program inputs share memory, and how (DESIGN.md 2.3). Whether inputs alias is a property
// of the call, not of the program: the pattern is computed from the actual tensors at call time,
// is part of the specialization key, and is an input of compilation. Inputs whose memory
// overlaps are compiled as views of one synthetic base (their common storage extent); disjoint
// views of one buffer stay separate; identical inputs are deduplicated.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/analysis/geometry.h"
#include "kiln/ir/trace.h"

namespace kiln {

// What the caller passed for one argument, as far as aliasing is concerned.
struct TensorDescription {
  bool is_tensor = true;     // false: a Python number (never aliases)
  uintptr_t storage = 0;     // identity of the storage (its base address)
  uintptr_t object = 0;      // identity of the tensor object (two views with one layout are
                             // still two objects: a metadata mutation of one spares the other)
  int64_t element_size = 4;  // bytes per element
  DType dtype = DType::kFloat32;
  Geometry geometry;  // offset relative to the storage's start
};

struct AliasPattern {
  // One group per storage extent that some inputs share (or one input alone).
  struct Group {
    DType dtype = DType::kFloat32;
    int64_t numel = 0;  // elements of the group's base
    // false: the group is a single input that is contiguous; it is its own base and keeps its
    // name. true: a synthetic 1-D base `baseN` covering the inputs' storage extent.
    bool synthetic = false;
    bool operator==(const Group&) const = default;
  };
  struct Input {
    int group = -1;         // -1 for a number argument
    Geometry geometry;      // the input as a view of its group's base
    int duplicate_of = -1;  // an earlier input that is exactly this tensor, or -1
    bool operator==(const Input&) const = default;
  };
  std::vector<Group> groups;
  std::vector<Input> inputs;  // one per trace input, in order

  bool operator==(const AliasPattern&) const = default;
  // The default for a trace whose inputs are all distinct, contiguous tensors.
  static AliasPattern distinct(const Trace& trace);
  // "a: base0[4, 4] strides=(9, 1) offset=0; b: base0[4, 4] strides=(9, 1) offset=24;
  //  base0: f32[64]". Inputs that are their own base print as "x: own". Round-trips through
  // parse (the names are the trace's input names; `kiln-opt --alias=...` reads it).
  std::string str(const Trace& trace) const;
  static AliasPattern parse(std::string_view text, const Trace& trace);
};

// The pattern of a call. Exact where it can be: two views of one storage alias only if some
// element address is in both (interval test, then a stride-lattice test, then enumeration for
// small views); when unsure, they are treated as overlapping (correct, only slower).
AliasPattern compute_alias_pattern(std::span<const TensorDescription> args);

// Whether two views of one storage share an element address (the test above, exposed for tests).
bool may_overlap(const Geometry& a, const Geometry& b);

}  // namespace kiln
