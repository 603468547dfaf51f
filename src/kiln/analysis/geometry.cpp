#include "kiln/analysis/geometry.h"

#include <algorithm>
#include <numeric>

#include "kiln/ir/type_rules.h"
#include "kiln/support/error.h"

namespace kiln {

Geometry contiguous_geometry(const Shape& sizes) {
  return Geometry{sizes, contiguous_strides(sizes), 0};
}

std::vector<int64_t> element_indices(const Shape& sizes, const Strides& strides, int64_t offset) {
  int64_t n = shape_numel(sizes);
  std::vector<int64_t> out;
  if (n == 0) return out;
  out.reserve(static_cast<size_t>(n));
  // A row-major odometer that keeps the storage index up to date incrementally.
  std::vector<int64_t> index(sizes.size(), 0);
  int64_t at = offset;
  for (int64_t k = 0; k < n; ++k) {
    out.push_back(at);
    for (size_t d = sizes.size(); d-- > 0;) {
      if (++index[d] < sizes[d]) {
        at += strides[d];
        break;
      }
      at -= strides[d] * (sizes[d] - 1);
      index[d] = 0;
    }
  }
  return out;
}

Strides broadcast_strides(const Shape& sizes, const Strides& strides, const Shape& shape) {
  KILN_ASSERT(sizes.size() <= shape.size())
      << "cannot broadcast " << shape_str(sizes) << " to " << shape_str(shape);
  Strides out(shape.size(), 0);
  size_t lead = shape.size() - sizes.size();
  for (size_t i = 0; i < sizes.size(); ++i) {
    KILN_ASSERT(sizes[i] == shape[lead + i] || sizes[i] == 1)
        << "cannot broadcast " << shape_str(sizes) << " to " << shape_str(shape);
    out[lead + i] = sizes[i] == shape[lead + i] ? strides[i] : 0;
  }
  return out;
}

bool is_contiguous(const Shape& sizes, const Strides& strides) {
  if (shape_numel(sizes) == 0) return true;
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

bool is_non_overlapping_and_dense(const Shape& sizes, const Strides& strides) {
  size_t rank = sizes.size();
  if (rank == 1) return sizes[0] < 2 || strides[0] == 1;
  std::vector<size_t> perm(rank);
  std::iota(perm.begin(), perm.end(), 0);
  // Size-0/1 dims sort last: their strides do not matter.
  std::sort(perm.begin(), perm.end(), [&](size_t a, size_t b) {
    if (sizes[a] < 2) return false;
    if (sizes[b] < 2) return true;
    return strides[a] < strides[b];
  });
  int64_t require = 1;
  for (size_t d : perm) {
    if (sizes[d] < 2) return true;
    if (strides[d] != require) return false;
    require *= sizes[d];
  }
  return true;
}

int64_t required_storage_numel(const Shape& sizes, const Strides& strides, int64_t offset) {
  if (shape_numel(sizes) == 0) return 0;
  int64_t last = offset;
  for (size_t d = 0; d < sizes.size(); ++d)
    last += (sizes[d] - 1) * strides[d];
  return last + 1;
}

void check_in_bounds(const Geometry& g, int64_t storage_numel, DType dtype) {
  int64_t need = required_storage_numel(g);
  int64_t item = dtype_size(dtype);
  KILN_CHECK(need <= storage_numel)
      << "setStorage: sizes " << shape_str(g.sizes) << ", strides " << shape_str(g.strides)
      << ", storage offset " << g.offset << ", and itemsize " << item
      << " requiring a storage size of " << need * item << " are out of bounds for storage of size "
      << storage_numel * item
      << "; choose sizes, strides and an offset that stay inside the storage.";
}

std::optional<Strides> compute_view_strides(const Shape& sizes, const Strides& strides,
                                            const Shape& new_sizes) {
  if (sizes.empty()) return Strides(new_sizes.size(), 1);
  int64_t numel = shape_numel(sizes);
  // With no elements the strides are arbitrary: NumPy keeps them if the shape is unchanged and
  // otherwise uses contiguous-like strides (sizes 0 counted as 1).
  if (numel == 0 && sizes == new_sizes) return strides;
  Strides out(new_sizes.size());
  if (numel == 0) {
    for (size_t d = new_sizes.size(); d-- > 0;) {
      out[d] = d + 1 == new_sizes.size() ? 1 : std::max<int64_t>(new_sizes[d + 1], 1) * out[d + 1];
    }
    return out;
  }
  // Walk the old dims from the innermost, grouping them into chunks that are contiguous with
  // respect to each other; each chunk must be covered exactly by a run of new dims, which then
  // take strides within the chunk.
  auto view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (auto tensor_d = static_cast<int64_t>(sizes.size()) - 1; tensor_d >= 0; --tensor_d) {
    auto td = static_cast<size_t>(tensor_d);
    tensor_numel *= sizes[td];
    if (tensor_d == 0 ||
        (sizes[td - 1] != 1 && strides[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 &&
             (view_numel < tensor_numel || new_sizes[static_cast<size_t>(view_d)] == 1)) {
        out[static_cast<size_t>(view_d)] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[static_cast<size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

namespace {

// TensorIterator's reorder_dimensions: a permutation of the dims, fastest-moving first. It
// starts from the reversed order (row-major) and insertion-sorts by the operands' strides; the
// first operand with a strict preference between two dims decides, broadcast (stride 0) dims
// leave the decision to later operands, and equal strides put the smaller size first. An
// ambiguous comparison stops nothing, a preference to keep the order stops the insertion.
std::vector<size_t> iteration_order(const Shape& shape, const std::vector<Strides>& operands,
                                    bool skip_zero_per_operand) {
  size_t ndim = shape.size();
  std::vector<size_t> perm(ndim);
  for (size_t i = 0; i < ndim; ++i)
    perm[i] = ndim - 1 - i;
  auto should_swap = [&](size_t dim0, size_t dim1) {
    for (const Strides& s : operands) {
      int64_t s0 = s[dim0], s1 = s[dim1];
      if (s0 == 0 || s1 == 0) {
        if (skip_zero_per_operand) continue;
        return 0;
      }
      if (s0 < s1) return -1;
      if (s0 > s1) return 1;
      if (shape[dim0] > shape[dim1]) return 1;
    }
    return 0;
  };
  for (size_t i = 1; i < ndim; ++i) {
    size_t dim1 = i;
    for (size_t dim0 = i; dim0-- > 0;) {
      int c = should_swap(perm[dim0], perm[dim1]);
      if (c > 0) {
        std::swap(perm[dim0], perm[dim1]);
        dim1 = dim0;
      } else if (c < 0) {
        break;
      }
    }
  }
  return perm;
}

}  // namespace

Strides elementwise_output_strides(const Shape& shape, std::span<const Geometry* const> inputs) {
  // Fast setup: every operand has the output's shape and they are all contiguous, or all
  // non-overlapping and dense with one set of strides; the output copies that layout.
  bool same_shape = true, contiguous = true, dense = true;
  for (const Geometry* t : inputs) {
    if (!t || t->sizes != shape) {
      same_shape = false;
      break;
    }
    contiguous = contiguous && is_contiguous(t->sizes, t->strides);
    dense = dense && is_non_overlapping_and_dense(t->sizes, t->strides);
  }
  if (same_shape && !inputs.empty()) {
    if (contiguous) return contiguous_strides(shape);
    bool same_strides = std::all_of(inputs.begin(), inputs.end(), [&](const Geometry* t) {
      return t->strides == inputs[0]->strides;
    });
    if (dense && same_strides) return inputs[0]->strides;
  }
  size_t ndim = shape.size();
  if (ndim <= 1) return contiguous_strides(shape);
  // Operand strides over the output shape; broadcast dims (and wrapped numbers) get 0.
  std::vector<Strides> operands;
  for (const Geometry* t : inputs) {
    if (!t) continue;
    Strides s(ndim, 0);
    size_t lead = ndim - t->sizes.size();
    for (size_t i = 0; i < t->sizes.size(); ++i) {
      bool broadcast = t->sizes[i] == 1 && shape[lead + i] != 1;
      s[lead + i] = broadcast ? 0 : t->strides[i];
    }
    operands.push_back(std::move(s));
  }
  std::vector<size_t> perm = iteration_order(shape, operands, /*skip_zero_per_operand=*/true);
  bool row_major = true;
  for (size_t j = 0; j < ndim; ++j)
    row_major = row_major && perm[j] == ndim - 1 - j;
  if (row_major) return contiguous_strides(shape);
  // Dense strides in iteration order (TensorIterator's compatible_stride, sizes not clamped).
  Strides out(ndim);
  int64_t next = 1;
  for (size_t dim : perm) {
    out[dim] = next;
    next *= shape[dim];
  }
  return out;
}

Strides strides_like(const Shape& sizes, const Strides& strides) {
  if (is_non_overlapping_and_dense(sizes, strides)) return strides;
  // infer_dense_strides: the same ordering as TensorIterator with one operand, where a stride-0
  // dim never moves; sizes 0 and 1 do not grow the stride.
  std::vector<size_t> perm = iteration_order(sizes, {strides}, /*skip_zero_per_operand=*/false);
  Strides out(sizes.size());
  int64_t next = 1;
  for (size_t dim : perm) {
    out[dim] = next;
    if (sizes[dim] > 1) next *= sizes[dim];
  }
  return out;
}

// c10's is_channels_last_strides_2d_s4 / _3d_s5 over `order` (channel dim first, then the
// spatial dims innermost first, then the batch): ambiguous layouts (an N111 tensor) are not.
static bool strides_like_order(const Shape& sizes, const Strides& strides,
                               std::initializer_list<size_t> order) {
  if (strides[1] == 0) return false;
  int64_t min = 0;
  for (size_t d : order) {
    if (sizes[d] == 0 || strides[d] < min) return false;
    if (d == 0 && min == strides[1]) return false;
    min = strides[d];
    if (sizes[d] > 1) min *= sizes[d];
  }
  return true;
}

Strides strides_in_order(const Shape& shape, std::span<const int> order) {
  Strides strides(shape.size(), 0);
  int64_t inner = 1;
  for (size_t k = order.size(); k-- > 0;) {
    const auto d = static_cast<size_t>(order[k]);
    strides[d] = inner;
    inner *= shape[d];
  }
  return strides;
}

Strides suggested_format_strides(const Shape& sizes, const Strides& strides) {
  // (strides_like_order rejects a dim of size 0, so the dense strides below are c10's.)
  if (sizes.size() == 4 && strides_like_order(sizes, strides, {1, 3, 2, 0}))
    return strides_in_order(sizes, std::initializer_list<int>{0, 2, 3, 1});
  if (sizes.size() == 5 && strides_like_order(sizes, strides, {1, 4, 3, 2, 0}))
    return strides_in_order(sizes, std::initializer_list<int>{0, 2, 3, 4, 1});
  return contiguous_strides(sizes);
}

std::optional<Strides> decomposed_result_strides(OpId id, const Shape& sizes,
                                                 const Strides& strides) {
  switch (op_info(id).result_layout) {
    case ResultLayout::kAsComputed:
      return std::nullopt;
    case ResultLayout::kContiguous:
      return contiguous_strides(sizes);
    case ResultLayout::kSuggestedFormat:
      return suggested_format_strides(sizes, strides);
  }
  return std::nullopt;
}

bool has_internal_overlap(const Geometry& target) {
  if (is_non_overlapping_and_dense(target.sizes, target.strides)) return false;
  for (size_t d = 0; d < target.sizes.size(); ++d) {
    if (target.sizes[d] > 1 && target.strides[d] == 0) return true;
  }
  return false;
}

void check_no_internal_overlap(const Geometry& target) {
  KILN_CHECK(!has_internal_overlap(target))
      << "unsupported operation: more than one element of the written-to tensor refers to a "
         "single memory location. Please clone() the tensor before performing the operation.";
}

bool partially_overlaps(const Geometry& target, const Geometry& input) {
  int64_t target_numel = shape_numel(target.sizes), input_numel = shape_numel(input.sizes);
  if (target_numel == 0 || input_numel == 0) return false;
  // PyTorch only decides for two non-overlapping-and-dense tensors; anything else is "too hard"
  // and allowed.
  if (!is_non_overlapping_and_dense(target.sizes, target.strides) ||
      !is_non_overlapping_and_dense(input.sizes, input.strides)) {
    return false;
  }
  int64_t a_begin = target.offset, a_end = target.offset + target_numel;
  int64_t b_begin = input.offset, b_end = input.offset + input_numel;
  if (a_begin == b_begin && a_end == b_end) return target.strides != input.strides;
  return a_begin < b_end && b_begin < a_end;
}

void check_no_partial_overlap(const Geometry& target, const Geometry& input, bool same_storage) {
  KILN_CHECK(!same_storage || !partially_overlaps(target, input))
      << "unsupported operation: some elements of the input tensor and the written-to tensor "
         "refer to a single memory location. Please clone() the tensor before performing the "
         "operation.";
}

// ---- the view ops -------------------------------------------------------------------------------

namespace {
size_t at(int64_t dim) {
  return static_cast<size_t>(dim);
}
int64_t rank_of(const Geometry& g) {
  return static_cast<int64_t>(g.sizes.size());
}
}  // namespace

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
