"""Tensors a traced program computes from no input: their values, known while tracing.

A tensor made by a creation op (torch.arange, torch.ones, torch.full, torch.tensor of numbers) and
anything computed from such tensors alone by pure ops has the same value on every call. The
tracer keeps that value, computed on the CPU, beside the proxy (`known_value`), so that a rule can
use it where eager PyTorch's result does not depend on it. The one use today: an attention mask
known to be all true (or all zero, for a float mask) is no mask, so scaled_dot_product_attention
runs without it, as eager does when the caller passes none. Hugging Face materializes such a mask
under Dynamo (`(arange(L)[None, None, :, None] >= 0).expand(B, -1, L, L)`), and a boolean mask
turns SDPA on CUDA from flash attention to its float32 math path.

    mask = torch.arange(12) >= 0            # known: twelve Trues
    mask = mask[None, None, :, None].expand(2, -1, 12, 12)   # known (pure views)
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # runs as attn_mask=None

Requires: the tracing mode calls `note_call` after every call it records, with the call's
arguments and results, and the tracer calls `note_written` for every tensor an op writes (in
place, through a view, its metadata, an eager step's written argument: Call.emit, for every op
of the table that mutates its first argument, which every write is recorded as). Ensures: a known value is the value eager would compute. Only the ops
in PURE propagate values, and a proxy whose storage was written has no known value from then on.
Values are kept only for tensors whose storage holds at most MAX_ELEMENTS elements (masks, index
ranges): an expanded view of a small value is kept whatever its size (a [B, 1, L, L] mask
expanded from L elements), a fresh tensor of that size is not.
Tests: tests/python/test_constants.py.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from ._tracer import Proxy, _func_key

MAX_ELEMENTS = 1 << 16

# Ops that make a tensor from numbers alone (torch.empty is not one: its values are unspecified).
_CREATION = {_func_key(f) for f in (torch.arange, torch.ones, torch.zeros, torch.full, torch.tensor, torch.scalar_tensor)}
# Ops that compute a new tensor, or a view, from their arguments and write nothing.
_PURE_NAMES = (
    "add sub mul div neg eq ne lt le gt ge logical_and logical_or logical_not logical_xor "
    "bitwise_and bitwise_or bitwise_not where abs clamp minimum maximum "
    "view reshape expand expand_as unsqueeze squeeze transpose permute t flatten unflatten select "
    "narrow contiguous clone to type_as bool int long float ones_like zeros_like full_like"
).split()
_PURE_DUNDERS = (
    "__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__ __neg__ __eq__ "
    "__ne__ __lt__ __le__ __gt__ __ge__ __and__ __or__ __invert__ __getitem__"
).split()
PURE: set[Any] = set(_CREATION)
for _name in _PURE_NAMES + _PURE_DUNDERS:
    for _owner in (torch, torch.Tensor):
        _f = getattr(_owner, _name, None)
        if _f is not None:
            PURE.add(_func_key(_f))


def known_value(t: Any) -> torch.Tensor | None:
    """The value of a proxy known while tracing (on the CPU), or None."""
    if not isinstance(t, Proxy):
        return None
    value = getattr(t, "_kiln_value", None)
    if value is None or _storage(t) in t._kiln_tracer.written_storages:
        return None
    return value


def note_written(tracer: Any, t: Proxy) -> None:
    # Keyed by the storage's address, and kept alive by the tracer: a freed meta storage's
    # address is reused by the next one made (a later proxy would otherwise read as written).
    with torch._C.DisableTorchFunction():
        storage = t.untyped_storage()
    tracer.written_storages[storage._cdata] = storage


def note_call(tracer: Any, func: Any, args: tuple, kwargs: dict, result: Any) -> None:
    """Propagates known values through a pure call; marks what an impure one may have written."""
    key = _func_key(func)
    if key not in PURE:
        return
    leaves = pytree.tree_leaves((args, kwargs))
    proxies = [leaf for leaf in leaves if isinstance(leaf, Proxy)]
    if kwargs.get("out") is not None or any(isinstance(leaf, torch.Tensor) and not isinstance(leaf, Proxy) for leaf in leaves):
        return
    values = [known_value(p) for p in proxies]
    if any(v is None for v in values) or (not proxies and key not in _CREATION):
        return
    fresh = [r for r in pytree.tree_leaves(result) if isinstance(r, Proxy) and not any(r is p for p in proxies)]
    if not fresh or any(_storage_elements(r) > MAX_ELEMENTS or r.dtype.is_complex for r in fresh):
        return
    swap = {id(p): v for p, v in zip(proxies, values)}
    cpu_args, cpu_kwargs = pytree.tree_map(lambda x: swap.get(id(x), x) if isinstance(x, Proxy) else x, (args, kwargs))
    if "device" in cpu_kwargs:
        cpu_kwargs["device"] = "cpu"
    if key == _func_key(torch.Tensor.to):
        cpu_args = tuple(a for a in cpu_args if not isinstance(a, (str, torch.device)))
    try:
        with torch._C.DisableTorchFunction():
            value = func(*cpu_args, **cpu_kwargs)
    except Exception:  # (eager's own errors were raised by the rule already)
        return
    computed = [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]
    results = [r for r in pytree.tree_leaves(result) if isinstance(r, Proxy)]
    if len(computed) != len(results):
        return
    for r, v in zip(results, computed):
        if any(r is p for p in proxies):
            continue  # an argument returned as it is (x.contiguous()): its value stands
        if tuple(v.shape) == tuple(r.shape) and v.dtype == r.dtype:
            r._kiln_value = v


def _storage_elements(t: torch.Tensor) -> int:
    # (A view's storage is its base's: an expand of a known value costs nothing to keep.)
    with torch._C.DisableTorchFunction():
        return t.untyped_storage().nbytes() // t.element_size()


def _storage(t: torch.Tensor) -> int:
    with torch._C.DisableTorchFunction():
        return t.untyped_storage()._cdata


def no_mask(mask: Any) -> bool:
    """Whether an attention mask is known to mask nothing: all true, or (added to the scores) all
    zero."""
    value = known_value(mask)
    if value is None:
        return False
    if value.dtype == torch.bool:
        return bool(value.all())
    return value.is_floating_point() and bool((value == 0).all())


