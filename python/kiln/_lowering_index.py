"""Index reads and writes: masked_fill, and `x[key]` / `x[key] = v` with tensors, lists or bools
in the key (PyTorch's advanced indexing).

A write is functional like every other (DESIGN.md 2.2): its new value is computed, then copied
into the tensor, which functionalize turns into a scatter of the current value and a writeback
where the tensor is an input.

- `masked_fill(_)` is `where(mask, value, x)` in x's dtype, so it fuses with what is around it
  (an attention mask before a softmax, CASES.md X3).
- `x[mask] = v`, a boolean mask over x's leading dims and a number or one-element tensor v, is
  the same masked_fill with the mask's shape padded with ones (CASES.md X4).
- Every other advanced key, read or write, runs as an eager step (kiln._fallback): PyTorch
  indexes the program's tensors on their device, a write on a clone that is copied back. Its
  errors are PyTorch's (an index out of range raises IndexError, on the CPU at the op).
- A read whose size depends on values (`x[mask]`) cannot be traced (kiln needs every shape
  while tracing) and raises UnsupportedError naming the rewrite.

The ops with their own torch names (index_select, gather, scatter, index_copy_, index_put_,
...) have no rule here: they reach the eager fallback directly.
"""

from __future__ import annotations

from typing import Any

import torch

from ._lowering import RULES, _bind, _cast, _check_write, _key, _register, _getitem, _setitem
from ._tracer import Call, Proxy


def _is_advanced(key: Any) -> bool:
    items = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (torch.Tensor, list, bool)) for k in items)


def _in_dtype(call: Call, value: Any, dtype: torch.dtype) -> Any:
    """A fill value as eager's masked_fill converts it: into the filled tensor's dtype."""
    if isinstance(value, Proxy):
        return _cast(call, value, dtype)
    if dtype == torch.bool:
        return bool(value)
    if not dtype.is_floating_point and not dtype.is_complex:
        return int(value)  # a C cast truncates toward zero, as Python's int() does
    return value


def _emit_masked_fill(call: Call, self: Proxy, mask: Proxy, value: Any) -> Proxy:
    value = _in_dtype(call, value, self.dtype)
    where = call.run_meta(torch.where, (mask, value, self), {})
    return call.emit("where", [mask, value, self], {}, where)


def _masked_fill(call: Call) -> Any:
    args = _bind(call, lambda self, mask, value: None)
    self, mask, value = args["self"], args["mask"], args["value"]
    call.run_meta()  # eager's checks: a bool mask that broadcasts, a one-element value
    if not isinstance(self, Proxy) or not isinstance(mask, Proxy):
        raise call.unsupported("kiln's masked_fill needs tensors as self and mask.")
    filled = _emit_masked_fill(call, self, mask, value)
    if not call.name.endswith("_"):
        return filled
    _check_write(call, self)
    return _copy_into(call, self, filled)


def _copy_into(call: Call, target: Proxy, value: Proxy) -> Proxy:
    copy = Call(call.tracer, torch.Tensor.copy_, (target, value), {}, call.loc)
    return RULES[_key(torch.Tensor.copy_)](copy)


_register(_masked_fill, torch.masked_fill, torch.Tensor.masked_fill, torch.Tensor.masked_fill_)


def _advanced_getitem(call: Call) -> Any:
    self, key = call.args
    if not _is_advanced(key):
        return _getitem(call)
    items = key if isinstance(key, tuple) else (key,)
    if any(isinstance(k, torch.Tensor) and k.dtype == torch.bool for k in items) or any(k is True or k is False for k in items):
        raise call.unsupported(
            "indexing with a boolean mask gives a tensor whose size depends on the mask's values, "
            "which kiln cannot know while tracing. Keep the shape instead: torch.where(mask, x, 0), "
            "x.masked_fill(~mask, 0), or compute the selection outside the compiled function."
        )
    return _eager(call, "indexing with tensors or lists")


def _advanced_setitem(call: Call) -> Any:
    self, key, value = call.args
    if not _is_advanced(key):
        return _setitem(call)
    mask = key[0] if isinstance(key, tuple) and len(key) == 1 else key
    if (
        isinstance(mask, Proxy)
        and mask.dtype == torch.bool
        and 0 < mask.dim() <= self.dim()
        and tuple(mask.shape) == tuple(self.shape[: mask.dim()])
        and (isinstance(value, (bool, int, float)) or (isinstance(value, Proxy) and value.numel() == 1))
    ):
        call.run_meta()
        _check_write(call, self)
        target = mask
        if mask.dim() < self.dim():  # a mask over the leading dims selects whole rows
            view = Call(call.tracer, torch.Tensor.view, (mask, *mask.shape, *([1] * (self.dim() - mask.dim()))), {}, call.loc)
            target = RULES[_key(torch.Tensor.view)](view)
        if isinstance(value, Proxy) and value.dim() != 0:
            reshape = Call(call.tracer, torch.Tensor.reshape, (value, ()), {}, call.loc)
            value = RULES[_key(torch.Tensor.reshape)](reshape)
        _copy_into(call, self, _emit_masked_fill(call, self, target, value))
        return None
    _eager(call, "assigning through tensors or lists")
    return None


def _eager(call: Call, what: str) -> Any:
    if call.tracer.register_eager is None:
        raise call.unsupported(
            f"{what} runs as an eager step, which only kiln.jit can run (kiln.trace alone cannot)."
        )
    from ._fallback import eager_fallback

    return eager_fallback(call)


_register(_advanced_getitem, torch.Tensor.__getitem__)
_register(_advanced_setitem, torch.Tensor.__setitem__)
