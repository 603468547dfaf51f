"""Result metadata of elementwise ops, without PyTorch's Python meta kernels.

Requires: a torch function that eager runs through TensorIterator (an elementwise op: its tensor
arguments broadcast together, its result has the promoted dtype), called on proxies.
Ensures: the meta tensor eager's op would return (dtype, shape, strides), the proxy itself for
an in-place form, or None where these rules do not decide (the caller then runs the op on the
meta tensors, which also raises eager's error for a bad call).

Why: since PyTorch 2.x the Meta kernels of most elementwise ops are Python references
(torch._refs) wrapped in `torch._disable_dynamo`, so the first one a process runs imports
torch._dynamo, about 1 s here and 3 s on the H200's host. A first call of `a.tanh_(); return a * a`
paid that in full. The three things the meta run gave are cheap to get otherwise:

- dtype: the op run on one-element CPU tensors of the arguments' dtypes and ranks (eager's own
  type promotion, 0-dim tensors included, and its in-place cast check);
- shape: the broadcast of the tensor arguments;
- strides: TensorIterator's layout rule (aten/src/ATen/TensorIterator.cpp: fast_set_up, then
  reorder_dimensions and allocate_or_resize_outputs), rewritten below.

Trace, `x.t() + y` with x: f32[3, 4] strides (4, 1) and y: f32[4, 3] strides (3, 1): the operands
disagree, reorder_dimensions sorts dims by x's strides first, so the result is laid out as x is:
f32[4, 3] strides (1, 4).

KILN_CHECK_METADATA=1 (the test suite sets it) runs the meta kernels as well and fails on any
difference, so every traced test program checks these rules against PyTorch's.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

CHECK = os.environ.get("KILN_CHECK_METADATA", "") not in ("", "0")

# torch function -> the rule that gives its result's metadata (filled in by _lowering as it
# registers its rules): elementwise_result for the TensorIterator elementwise ops, mean_result
# for mean.
FAST_RULES: dict[Any, Callable[..., Any]] = {}

_META = torch.device("meta")
_CPU = torch.device("cpu")


def elementwise_result(func: Callable, args: tuple, kwargs: dict, proxy_type: type) -> Any:
    """See the module docstring. `proxy_type` is the tracer's Proxy class."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    proxies = [leaf for leaf in leaves if isinstance(leaf, proxy_type)]
    if not proxies or any(isinstance(leaf, torch.Tensor) and not isinstance(leaf, proxy_type) for leaf in leaves):
        return None
    devices = {p._kiln_device for p in proxies}
    if len(devices) != 1:
        return None  # eager's device checks decide; the meta run reports them
    tiny_of: dict[int, Any] = {}
    tiny_leaves = []
    for leaf in leaves:
        if isinstance(leaf, proxy_type):
            tiny = torch.ones((1,) * leaf.dim(), dtype=leaf.dtype, device=_CPU)
            tiny_of[id(tiny)] = leaf
            tiny_leaves.append(tiny)
        else:
            tiny_leaves.append(leaf)
    tiny_args, tiny_kwargs = pytree.tree_unflatten(tiny_leaves, spec)
    try:
        with torch._C.DisableTorchFunction():
            tiny_result = func(*tiny_args, **tiny_kwargs)
    except Exception:
        return None  # the meta run gives eager's error (or decides what the tiny run could not)
    if not isinstance(tiny_result, torch.Tensor):
        return None
    shape = _broadcast_shape([tuple(p.shape) for p in proxies])
    if shape is None or len(shape) != tiny_result.dim() or 0 in shape:
        return None
    written = tiny_of.get(id(tiny_result))
    if written is not None:  # an in-place form: eager returns the written tensor itself
        return written if tuple(written.shape) == shape else None
    if _number_base_pow(func, args, proxy_type):
        # pow(number, tensor) is no TensorIterator op: its meta function allocates the output
        # contiguous (aten pow.Scalar), whatever the exponent's layout.
        strides = _strides_in_order(shape, range(len(shape) - 1, -1, -1))
    else:
        operands = _operands(func, args, kwargs, leaves, proxies, tiny_result.dtype, devices.pop(), proxy_type)
        strides = _output_strides(shape, operands)
    return torch.empty_strided(shape, strides, dtype=tiny_result.dtype, device=_META)


def _number_base_pow(func: Callable, args: tuple, proxy_type: type) -> bool:
    if func is torch.Tensor.__rpow__:
        return True  # `number ** tensor`; tensor ** tensor arrives as __pow__
    return func is torch.pow and len(args) > 0 and not isinstance(args[0], proxy_type)


# An operand as TensorIterator sees it: sizes, element strides, bytes per element.
Layout = tuple[tuple[int, ...], tuple[int, ...], int]


def _operands(func: Callable, args: tuple, kwargs: dict, leaves: list, proxies: list, out_dtype: torch.dtype, device: torch.device, proxy_type: type) -> list[Layout]:
    """The operands' layouts when TensorIterator orders the dims. An input of another dtype
    than the op computes in is first copied to that dtype (`.to()`, which makes a dense copy of
    a strided or expanded input) by eager's CPU kernels (TensorIterator's compute_types promotes
    inputs on the CPU only; CUDA kernels cast as they load) and by torch.where on every device.
    Trace, CPU: `b + a` with b: bool[3, 4] strides (4, 0) (expanded) and a: i32[3, 4] strides
    (1, 3): b's copy has strides (4, 1), which then decides the order: the result is (4, 1), where
    the meta kernels (and CUDA) say (1, 3)."""
    layouts = {id(p): (tuple(p.shape), tuple(p.stride()), p.element_size()) for p in proxies}
    if func in (torch.where, torch.Tensor.where):
        condition = args[0] if func is torch.where else (args[1] if len(args) > 1 else kwargs.get("condition"))
        converted = [p for p in proxies if p is not condition and p.dtype != out_dtype]
    elif device.type == "cpu":
        promoted = _result_type([leaf for leaf in leaves if isinstance(leaf, (proxy_type, bool, int, float))])
        common = out_dtype if out_dtype.is_floating_point and not promoted.is_floating_point else promoted
        converted = [p for p in proxies if p.dtype != common]
    else:
        converted = []
    for p in converted:
        shape, strides, itemsize = layouts[id(p)]
        if not _non_overlapping_and_dense(shape, strides):
            layouts[id(p)] = (shape, _output_strides(shape, [(shape, strides, itemsize)]), itemsize)
    return [layouts[id(p)] for p in proxies]


def mean_result(func: Callable, args: tuple, kwargs: dict, proxy_type: type) -> Any:
    """mean of a floating tensor (into a floating dtype) has the metadata of sum with the same
    arguments, whose meta kernel is C++ (mean's is a Python reference). Other forms: None."""
    self = args[0] if args else kwargs.get("input")
    dtype = kwargs.get("dtype")
    if not isinstance(self, proxy_type) or not self.dtype.is_floating_point:
        return None
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        return None
    if "input" in kwargs:
        return None
    try:
        with torch._C.DisableTorchFunction():
            return torch.sum(*args, **kwargs)
    except Exception:
        return None


def _broadcast_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for s in shapes:
        for i, size in enumerate(s, ndim - len(s)):
            if size == out[i] or size == 1:
                continue
            if out[i] != 1:
                return None  # not broadcastable: eager's error comes from the meta run
            out[i] = size
    return tuple(out)


def _result_type(values: list) -> torch.dtype:
    """torch.result_type over any number of tensors and numbers (c10's ResultTypeState; the
    Python version in torch._prims_common imports sympy, half a second): dims-ful tensors, then
    0-dim tensors, then numbers, each category promoted on its own; a lower category counts only
    where it is of a higher kind (float over int over bool)."""
    results: list[torch.dtype | None] = [None, None, None]
    for v in values:
        if isinstance(v, torch.Tensor):
            category, dtype = (0 if v.dim() > 0 else 1), v.dtype
        else:
            category = 2
            dtype = torch.bool if isinstance(v, bool) else torch.int64 if isinstance(v, int) else torch.get_default_dtype()
        current = results[category]
        results[category] = dtype if current is None else torch.promote_types(current, dtype)

    def combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
        if higher is None:
            return lower
        if lower is None or higher.is_floating_point:
            return higher
        if higher == torch.bool or lower.is_floating_point:
            return torch.promote_types(higher, lower)
        return higher

    result = combine(results[0], combine(results[1], results[2]))
    assert result is not None
    return result


def _output_strides(shape: tuple[int, ...], operands: list[Layout]) -> tuple[int, ...]:
    """The strides TensorIterator gives a new output of `shape` computed from `operands`."""
    ndim = len(shape)
    if ndim == 0:
        return ()
    if all(s == shape for s, _, _ in operands):
        # fast_set_up: all operands contiguous, all channels-last, or all non-overlapping and
        # dense with one layout.
        if all(_dense_in_order(s, st, range(ndim - 1, -1, -1)) for s, st, _ in operands):
            return _strides_in_order(shape, range(ndim - 1, -1, -1))
        for order in _CHANNELS_LAST.get(ndim, []):
            if all(_dense_in_order(s, st, order) for s, st, _ in operands):
                return _strides_in_order(shape, order)
        if all(_non_overlapping_and_dense(s, st) for s, st, _ in operands):
            first = operands[-1][1]
            if all(st == first for _, st, _ in operands):
                return first
    # compute_strides: byte strides over the broadcast shape, 0 where an operand broadcasts.
    byte_strides = []
    for own_shape, own_strides, itemsize in operands:
        offset = ndim - len(own_shape)
        row = [0] * ndim
        for i, (size, stride) in enumerate(zip(own_shape, own_strides)):
            row[offset + i] = 0 if size == 1 and shape[offset + i] != 1 else stride * itemsize
        byte_strides.append(row)

    # reorder_dimensions: perm[0] is the fastest-moving dim.
    def should_swap(dim0: int, dim1: int) -> int:
        for row in byte_strides:
            stride0, stride1 = row[dim0], row[dim1]
            if stride0 == 0 or stride1 == 0:
                continue
            if stride0 < stride1:
                return -1
            if stride0 > stride1:
                return 1
            if shape[dim0] > shape[dim1]:  # equal strides: the smaller dim goes first
                return 1
        return 0

    perm = list(reversed(range(ndim)))
    for i in range(1, ndim):
        dim1 = i
        for dim0 in reversed(range(i)):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    # allocate_or_resize_outputs: contiguous in the permuted order.
    return _strides_in_order(shape, perm)


# Channels-last orders, fastest dim first (c10's is_channels_last_strides / memory formats).
_CHANNELS_LAST = {4: [(1, 3, 2, 0)], 5: [(1, 4, 3, 2, 0)]}


def _strides_in_order(shape: tuple[int, ...], order: Any) -> tuple[int, ...]:
    """Dense strides with the dims laid out in `order`, fastest first."""
    strides = [0] * len(shape)
    next_stride = 1
    for dim in order:
        strides[dim] = next_stride
        next_stride *= shape[dim]
    return tuple(strides)


def _dense_in_order(shape: tuple[int, ...], strides: tuple[int, ...], order: Any) -> bool:
    # c10's contiguity tests: size-1 dims may have any stride.
    expected = 1
    for dim in order:
        if shape[dim] != 1:
            if strides[dim] != expected:
                return False
            expected *= shape[dim]
    return True


def _non_overlapping_and_dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    # c10's is_non_overlapping_and_dense: some order of the dims is contiguous.
    return _dense_in_order(shape, strides, sorted(range(len(shape)), key=lambda d: strides[d]))


def _layout_strides(t: torch.Tensor) -> tuple[int, ...]:
    # The stride of a size-1 dim never moves a pointer, and PyTorch's references do not always
    # pick eager's there: `torch.where(c, y, z)` with y: [3, 4] and z: [1, 3, 1] strides (1, 1, 3)
    # gives strides (4, 4, 1) in eager (and here), (12, 4, 1) from the meta kernel.
    return tuple(stride for size, stride in zip(t.shape, t.stride()) if size != 1)


def check_against_meta(fast: Any, meta: Any, what: str) -> None:
    """KILN_CHECK_METADATA: the fast rules must give exactly what the meta kernels gave."""

    def describe(t: Any) -> str:
        if not isinstance(t, torch.Tensor):
            return repr(t)
        return f"{t.dtype}{list(t.shape)} strides={tuple(t.stride())} offset={t.storage_offset()} id={id(t)}"

    same = (
        isinstance(fast, torch.Tensor)
        and isinstance(meta, torch.Tensor)
        and fast.dtype == meta.dtype
        and fast.shape == meta.shape
        and _layout_strides(fast) == _layout_strides(meta)
        and fast.storage_offset() == meta.storage_offset()
        and ((fast is meta) or (type(fast) is torch.Tensor and type(meta) is torch.Tensor))
    )
    if not same:
        raise AssertionError(f"kiln bug: metadata rules disagree with the meta kernels for {what}: {describe(fast)} against {describe(meta)}")
