#include "kiln/runtime/store_in_caller.h"

#include <algorithm>
#include <utility>

namespace kiln {

namespace {

// Elements [first, last] of the storage a tensor can touch (strides are non-negative here).
std::pair<int64_t, int64_t> element_range(const RtTensor& t) {
  int64_t last = t.offset;
  for (size_t d = 0; d < t.sizes.size(); ++d)
    last += (t.sizes[d] - 1) * t.strides[d];
  return {t.offset, last};
}
bool disjoint(const RtTensor& a, const RtTensor& b) {
  if (a.storage != b.storage || a.numel() == 0 || b.numel() == 0) return true;
  auto [a0, a1] = element_range(a);
  auto [b0, b1] = element_range(b);
  return a1 < b0 || b1 < a0;
}
// No two elements share an address (every stride passes the reach of the smaller dims).
bool injective(const RtTensor& t) {
  if (t.numel() == 0) return true;
  std::vector<size_t> dims;
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] <= 1) continue;
    if (t.strides[d] <= 0) return false;
    dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end(),
            [&](size_t a, size_t b) { return t.strides[a] < t.strides[b]; });
  int64_t reach = 0;
  for (size_t d : dims) {
    if (t.strides[d] <= reach) return false;
    reach += (t.sizes[d] - 1) * t.strides[d];
  }
  return true;
}

// Whether every element of `inner` is the element of `outer` at the same index, and `outer` has
// no two elements at one address.
bool addresses_within(const RtTensor& inner, const RtTensor& outer) {
  if (inner.storage != outer.storage || inner.sizes.size() != outer.sizes.size() ||
      inner.offset != outer.offset || !injective(outer))
    return false;
  for (size_t d = 0; d < inner.sizes.size(); ++d) {
    if (inner.sizes[d] > outer.sizes[d]) return false;
    if (outer.sizes[d] > 1 && inner.strides[d] != outer.strides[d]) return false;
  }
  return true;
}

}  // namespace

// Whether output `j` of the kernel may be stored straight into `dest`, the caller's memory of a
// writeback (DESIGN.md 4). place_writebacks decided the step may do it; this checks it again on
// the real tensors and on the loads the kernel actually makes: `dest` has the output's dtype and
// shape and no repeated elements, the output is stored by the kernel's last loop nest (after every
// other nest read the old contents), and every input that shares bytes with `dest` is read there
// only at the very element the same iteration stores. Otherwise the executor copies the value
// into `dest` after the kernel, as it does for an interpreted step.
bool can_store_in_kernel(const codegen::Kernel& kernel, size_t j, const RtTensor& dest,
                         const std::vector<RtValue>& inputs) {
  const codegen::KernelOutput& out = kernel.outputs[j];
  if (!out.in_last_nest || dest.dtype() != out.dtype || dest.sizes != out.shape) return false;
  if (!injective(dest)) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const codegen::KernelInput& in = kernel.inputs[i];
    if (!in.is_tensor) continue;
    const RtTensor& t = *std::get<TensorHandle>(inputs[i]);
    if (t.storage != dest.storage) continue;
    switch (in.last_nest_loads) {
      case codegen::KernelInput::Loads::kNone:
        continue;
      case codegen::KernelInput::Loads::kIdentity:
        if ((t.sizes == dest.sizes && t.strides == dest.strides && t.offset == dest.offset) ||
            disjoint(t, dest))
          continue;
        return false;
      case codegen::KernelInput::Loads::kIdentityOrGuarded:
        // The plan placed this store in the kernel: its same-index rule covers the loads under
        // a scatter's condition, for the target tensor itself.
        if ((t.sizes == dest.sizes && t.strides == dest.strides && t.offset == dest.offset) ||
            disjoint(t, dest))
          continue;
        return false;
      case codegen::KernelInput::Loads::kRowLocal:
        // Loads at the stored element or anywhere in its row before the row stores (kernel.h):
        // safe where `t` addresses its elements exactly as `dest` does (one offset, one stride
        // wherever `t` has more than one element, `dest` inside `t`'s sizes) and no two elements
        // of `t` share an address, so that other rows' stores miss every element of this row.
        if (disjoint(t, dest) || addresses_within(dest, t)) continue;
        return false;
      case codegen::KernelInput::Loads::kOther:
        if (in.windows.empty() && disjoint(t, dest)) continue;
        return false;
    }
  }
  return true;
}

BaseFill base_fill(const RtTensor& dest, const RtTensor& base) {
  if (base.storage == dest.storage && base.sizes == dest.sizes && base.strides == dest.strides &&
      base.offset == dest.offset && base.dtype() == dest.dtype())
    return BaseFill::kInPlace;
  return disjoint(base, dest) ? BaseFill::kFillFirst : BaseFill::kRefuse;
}

}  // namespace kiln
