// The interpreter's tensor objects as geometries (analysis/geometry.h computes what each view op
// gives, for the interpreter and the storage analysis alike) and back.
#pragma once

#include "kiln/analysis/geometry.h"
#include "kiln/runtime/interpreter/layout.h"

namespace kiln {

Geometry geometry_of(const RtTensor& t);
// Makes `t` (the very object) take geometry `g`: the metadata mutations (transpose_, ...).
void set_geometry(RtTensor& t, const Geometry& g);
// A new tensor object over `base`'s storage; user error if it reaches outside the storage.
TensorHandle view_of(const TensorHandle& base, const Geometry& g);

}  // namespace kiln
