#include "kiln/runtime/interpreter/view_geometry.h"

namespace kiln {

Geometry geometry_of(const RtTensor& t) {
  return Geometry{t.sizes, t.strides, t.offset};
}

void set_geometry(RtTensor& t, const Geometry& g) {
  RtTensor next{t.storage, g.sizes, g.strides, g.offset};
  check_in_bounds(next);  // before touching t: an error leaves the caller's tensor as it was
  t = std::move(next);
}

TensorHandle view_of(const TensorHandle& base, const Geometry& g) {
  return make_view(base, g.sizes, g.strides, g.offset);
}

}  // namespace kiln
