#include "kiln/runtime/interpreter/layout.h"

#include <algorithm>
#include <numeric>

#include "kiln/support/error.h"

namespace kiln {

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

Strides broadcast_strides(const RtTensor& t, const Shape& shape) {
  KILN_ASSERT(t.sizes.size() <= shape.size())
      << "cannot broadcast " << shape_str(t.sizes) << " to " << shape_str(shape);
  Strides out(shape.size(), 0);
  size_t lead = shape.size() - t.sizes.size();
  for (size_t i = 0; i < t.sizes.size(); ++i) {
    KILN_ASSERT(t.sizes[i] == shape[lead + i] || t.sizes[i] == 1)
        << "cannot broadcast " << shape_str(t.sizes) << " to " << shape_str(shape);
    out[lead + i] = t.sizes[i] == shape[lead + i] ? t.strides[i] : 0;
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

void check_in_bounds(const RtTensor& t) {
  int64_t need = required_storage_numel(t.sizes, t.strides, t.offset);
  int64_t item = dtype_size(t.dtype());
  KILN_CHECK(need <= t.storage->numel())
      << "setStorage: sizes " << shape_str(t.sizes) << ", strides " << shape_str(t.strides)
      << ", storage offset " << t.offset << ", and itemsize " << item
      << " requiring a storage size of " << need * item << " are out of bounds for storage of size "
      << t.storage->numel() * item
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

Strides elementwise_output_strides(const Shape& shape, std::span<const RtTensor* const> inputs) {
  // Fast setup: every operand has the output's shape and they are all contiguous, or all
  // non-overlapping and dense with one set of strides; the output copies that layout.
  bool same_shape = true, contiguous = true, dense = true;
  for (const RtTensor* t : inputs) {
    if (!t || t->sizes != shape) {
      same_shape = false;
      break;
    }
    contiguous = contiguous && t->is_contiguous();
    dense = dense && is_non_overlapping_and_dense(t->sizes, t->strides);
  }
  if (same_shape && !inputs.empty()) {
    if (contiguous) return contiguous_strides(shape);
    bool same_strides = std::all_of(inputs.begin(), inputs.end(), [&](const RtTensor* t) {
      return t->strides == inputs[0]->strides;
    });
    if (dense && same_strides) return inputs[0]->strides;
  }
  size_t ndim = shape.size();
  if (ndim <= 1) return contiguous_strides(shape);
  // Operand strides over the output shape; broadcast dims (and wrapped numbers) get 0.
  std::vector<Strides> operands;
  for (const RtTensor* t : inputs) {
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

Strides strides_like(const RtTensor& t) {
  if (is_non_overlapping_and_dense(t.sizes, t.strides)) return t.strides;
  // infer_dense_strides: the same ordering as TensorIterator with one operand, where a stride-0
  // dim never moves; sizes 0 and 1 do not grow the stride.
  std::vector<size_t> perm = iteration_order(t.sizes, {t.strides}, /*skip_zero_per_operand=*/false);
  Strides out(t.sizes.size());
  int64_t next = 1;
  for (size_t dim : perm) {
    out[dim] = next;
    if (t.sizes[dim] > 1) next *= t.sizes[dim];
  }
  return out;
}

void check_no_internal_overlap(const RtTensor& target) {
  if (is_non_overlapping_and_dense(target.sizes, target.strides)) return;
  for (size_t d = 0; d < target.sizes.size(); ++d) {
    KILN_CHECK(!(target.sizes[d] > 1 && target.strides[d] == 0))
        << "unsupported operation: more than one element of the written-to tensor refers to a "
           "single memory location. Please clone() the tensor before performing the operation.";
  }
  // Other self-overlapping layouts (as_strided with small strides) are "too hard" for PyTorch to
  // prove and are allowed, as in eager.
}

void check_no_partial_overlap(const RtTensor& target, const RtTensor& input) {
  if (&target == &input) return;  // the same tensor object: full overlap
  if (target.numel() == 0 || input.numel() == 0) return;
  if (target.storage != input.storage) return;
  // PyTorch only decides for two non-overlapping-and-dense tensors; anything else is "too hard"
  // and allowed.
  if (!is_non_overlapping_and_dense(target.sizes, target.strides) ||
      !is_non_overlapping_and_dense(input.sizes, input.strides)) {
    return;
  }
  int64_t a_begin = target.offset, a_end = target.offset + target.numel();
  int64_t b_begin = input.offset, b_end = input.offset + input.numel();
  bool partial = (a_begin == b_begin && a_end == b_end) ? target.strides != input.strides
                                                        : (a_begin < b_end && b_begin < a_end);
  KILN_CHECK(!partial)
      << "unsupported operation: some elements of the input tensor and the written-to tensor "
         "refer to a single memory location. Please clone() the tensor before performing the "
         "operation.";
}

}  // namespace kiln
