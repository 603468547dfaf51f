#include "kiln/runtime/interpreter/view_geometry.h"

#include <algorithm>

#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {
size_t at(int64_t dim) {
  return static_cast<size_t>(dim);
}
int64_t rank_of(const Geometry& g) {
  return static_cast<int64_t>(g.sizes.size());
}
}  // namespace

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

std::optional<Geometry> view_geometry(const Geometry& g, const Shape& sizes) {
  std::optional<Strides> strides = compute_view_strides(g.sizes, g.strides, sizes);
  if (!strides) return std::nullopt;
  return Geometry{sizes, *strides, g.offset};
}

Geometry permute_geometry(const Geometry& g, const IntList& dims) {
  Geometry out{{}, {}, g.offset};
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, rank_of(g));
    out.sizes.push_back(g.sizes[at(w)]);
    out.strides.push_back(g.strides[at(w)]);
  }
  return out;
}

Geometry transpose_geometry(const Geometry& g, int64_t dim0, int64_t dim1) {
  if (g.sizes.empty()) return g;
  int64_t a = wrap_dim(dim0, rank_of(g)), b = wrap_dim(dim1, rank_of(g));
  Geometry out = g;
  std::swap(out.sizes[at(a)], out.sizes[at(b)]);
  std::swap(out.strides[at(a)], out.strides[at(b)]);
  return out;
}

Geometry t_geometry(const Geometry& g) {
  return g.sizes.size() < 2 ? g : transpose_geometry(g, 0, 1);
}

// ATen's inferExpandGeometry: existing dims keep their stride unless expanded (stride 0); a new
// leading dim gets the stride it would have in a contiguous layout of the dims after it, or 0
// if it is expanded; a 0-dim tensor expands with all strides 0.
Geometry expand_geometry(const Geometry& g, const IntList& sizes) {
  auto ndim = static_cast<int64_t>(sizes.size());
  int64_t tensor_dim = rank_of(g);
  Geometry out{Shape(sizes.begin(), sizes.end()), Strides(sizes.size(), 0), g.offset};
  if (tensor_dim == 0) return out;
  for (int64_t i = ndim - 1; i >= 0; --i) {
    int64_t dim = tensor_dim - 1 - (ndim - 1 - i);
    int64_t size = dim >= 0 ? g.sizes[at(dim)] : 1;
    int64_t stride = dim >= 0 ? g.strides[at(dim)] : out.sizes[at(i + 1)] * out.strides[at(i + 1)];
    int64_t target = sizes[at(i)] == -1 ? size : sizes[at(i)];
    if (size != target) {
      size = target;
      stride = 0;
    }
    out.sizes[at(i)] = size;
    out.strides[at(i)] = stride;
  }
  return out;
}

Geometry unsqueeze_geometry(const Geometry& g, int64_t dim) {
  int64_t d = wrap_dim(dim, rank_of(g) + 1);
  Geometry out = g;
  int64_t stride = d >= rank_of(g) ? 1 : g.sizes[at(d)] * g.strides[at(d)];
  out.sizes.insert(out.sizes.begin() + d, 1);
  out.strides.insert(out.strides.begin() + d, stride);
  return out;
}

Geometry squeeze_geometry(const Geometry& g, const std::optional<IntList>& dims) {
  std::vector<bool> drop(g.sizes.size(), false);
  if (!dims) {
    for (size_t i = 0; i < g.sizes.size(); ++i)
      drop[i] = g.sizes[i] == 1;
  } else if (!g.sizes.empty()) {
    for (int64_t d : *dims) {
      int64_t w = wrap_dim(d, rank_of(g));
      drop[at(w)] = g.sizes[at(w)] == 1;
    }
  }
  Geometry out{{}, {}, g.offset};
  for (size_t i = 0; i < g.sizes.size(); ++i) {
    if (drop[i]) continue;
    out.sizes.push_back(g.sizes[i]);
    out.strides.push_back(g.strides[i]);
  }
  return out;
}

Geometry slice_geometry(const Geometry& g, int64_t dim, std::optional<int64_t> start,
                        std::optional<int64_t> end, int64_t step) {
  int64_t d = wrap_dim(dim, rank_of(g));
  int64_t s, e;
  normalize_slice(g.sizes[at(d)], start, end, &s, &e);
  Geometry out = g;
  out.offset += s * g.strides[at(d)];
  out.sizes[at(d)] = slice_length(s, e, step);
  out.strides[at(d)] *= step;
  return out;
}

Geometry narrow_geometry(const Geometry& g, int64_t dim, int64_t start, int64_t length) {
  int64_t d = wrap_dim(dim, rank_of(g));
  if (start < 0) start += g.sizes[at(d)];
  return slice_geometry(g, d, start, start + length, 1);
}

Geometry select_geometry(const Geometry& g, int64_t dim, int64_t index) {
  int64_t d = wrap_dim(dim, rank_of(g));
  if (index < 0) index += g.sizes[at(d)];
  Geometry out = g;
  out.offset += index * g.strides[at(d)];
  out.sizes.erase(out.sizes.begin() + d);
  out.strides.erase(out.strides.begin() + d);
  return out;
}

Geometry diagonal_geometry(const Geometry& g, int64_t offset, int64_t dim1, int64_t dim2) {
  int64_t d1 = wrap_dim(dim1, rank_of(g)), d2 = wrap_dim(dim2, rank_of(g));
  int64_t len = diagonal_length(g.sizes, offset, d1, d2);
  Geometry out{{}, {}, g.offset};
  // An empty diagonal keeps the offset, as ATen does.
  if (len > 0) out.offset += offset >= 0 ? offset * g.strides[at(d2)] : -offset * g.strides[at(d1)];
  for (int64_t i = 0; i < rank_of(g); ++i) {
    if (i == d1 || i == d2) continue;
    out.sizes.push_back(g.sizes[at(i)]);
    out.strides.push_back(g.strides[at(i)]);
  }
  out.sizes.push_back(len);
  out.strides.push_back(g.strides[at(d1)] + g.strides[at(d2)]);
  return out;
}

Geometry as_strided_geometry(const Geometry& g, const IntList& sizes, const IntList& strides,
                             std::optional<int64_t> offset) {
  return Geometry{Shape(sizes.begin(), sizes.end()), Strides(strides.begin(), strides.end()),
                  offset.value_or(g.offset)};
}

}  // namespace kiln
