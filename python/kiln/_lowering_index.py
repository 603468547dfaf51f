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

from typing import Any, Callable

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
    return _eager(call, "indexing with tensors or lists", _check_key)


def _advanced_setitem(call: Call) -> Any:
    self, key, value = call.args
    if not _is_advanced(key):
        return _setitem(call)
    mask = key[0] if isinstance(key, tuple) and len(key) == 1 else key
    if (
        isinstance(mask, Proxy)
        and mask.dtype == torch.bool
        and mask.dim() <= self.dim()
        and tuple(mask.shape) == tuple(self.shape[: mask.dim()])
        and (isinstance(value, (bool, int, float)) or (isinstance(value, Proxy) and value.numel() == 1))
    ):
        if mask.dim() > 0:  # (a 0-dim mask's meta run calls item(); its shape is checked above)
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
    _eager(call, "assigning through tensors or lists", _check_key)
    return None


def _eager(call: Call, what: str, check: Callable[[tuple, dict], None] | None = None) -> Any:
    if call.tracer.register_eager is None:
        raise call.unsupported(
            f"{what} runs as an eager step, which only kiln.jit can run (kiln.trace alone cannot)."
        )
    from ._fallback import eager_fallback

    return eager_fallback(call, check)


_register(_advanced_getitem, torch.Tensor.__getitem__)
_register(_advanced_setitem, torch.Tensor.__setitem__)


# ---- index bounds on CUDA ----------------------------------------------------------------------
#
# PyTorch's CUDA index kernels meet an index out of range with a device-side assert, which ends
# the process's CUDA context; on the CPU they raise. An eager index step on CUDA checks its
# indices first and raises as the CPU kernel would (its error type; eager's message). The check
# reads two numbers back (the smallest and largest index): a synchronization per step, paid only
# by these steps.


def _check_range(index: Any, size: int, dim: int, negative: bool, error: type) -> None:
    if not isinstance(index, torch.Tensor) or index.numel() == 0 or index.dtype == torch.bool:
        return
    lo, hi = torch.stack([index.min(), index.max()]).tolist()
    low = -size if negative else 0
    for bad in (lo, hi):
        if bad < low or bad >= size:
            raise error(f"index {bad} is out of bounds for dimension {dim} with size {size}")


def _size(t: torch.Tensor, dim: int) -> tuple[int, int]:
    if t.dim() == 0:
        return 1, 0
    dim = dim % t.dim()
    return t.shape[dim], dim


# (take_along_dim needs none: it takes its indices modulo the size, on every device.)
def _dim_check(self_pos: int, dim_pos: int, index_pos: int, negative: bool, error: type, names=("self", "dim", "index")):
    """An op(self, dim, index, ...) whose index addresses self's dim."""

    def check(args: tuple, kwargs: dict) -> None:
        def arg(pos: int, name: str) -> Any:
            return args[pos] if pos < len(args) else kwargs.get(name, kwargs.get("input") if name == "self" else None)

        self, dim, index = arg(self_pos, names[0]), arg(dim_pos, names[1]), arg(index_pos, names[2])
        size, d = _size(self, dim)
        _check_range(index, size, d, negative, error)

    return check


def _check_embedding(args: tuple, kwargs: dict) -> None:
    index = args[0] if args else kwargs["input"]
    weight = args[1] if len(args) > 1 else kwargs["weight"]
    _check_range(index, weight.shape[0], 0, False, IndexError)


def _check_index_tensors(self: torch.Tensor, items: list) -> None:
    """Tensor items of an advanced key (or index_put's indices), each at the dims it indexes."""
    consumed = sum(
        (k.dim() if isinstance(k, torch.Tensor) and k.dtype == torch.bool else 1)
        for k in items
        if k is not None and k is not Ellipsis
    )
    dim = 0
    for k in items:
        if k is Ellipsis:
            dim += self.dim() - consumed
        elif k is None:
            continue
        elif isinstance(k, torch.Tensor) and k.dtype == torch.bool:
            dim += k.dim()
        else:
            if isinstance(k, torch.Tensor) and dim < self.dim():
                _check_range(k, self.shape[dim], dim, True, IndexError)
            dim += 1


def _check_key(args: tuple, kwargs: dict) -> None:
    self, key = args[0], args[1]
    items = list(key) if isinstance(key, tuple) else [key]
    if any(isinstance(k, list) for k in items):
        return  # a list of Python ints is checked by PyTorch on the host
    _check_index_tensors(self, items)


def _check_index_put(args: tuple, kwargs: dict) -> None:
    self = args[0] if args else kwargs["input"]
    indices = args[1] if len(args) > 1 else kwargs["indices"]
    _check_index_tensors(self, list(indices))


def _eager_index(what: str, check: Callable[[tuple, dict], None]) -> Callable[[Call], Any]:
    return lambda call: _eager(call, what, check)


_INDEX_OPS: dict[tuple[str, ...], Callable[[tuple, dict], None]] = {
    ("index_select", "index_copy", "index_copy_"): _dim_check(0, 1, 2, False, IndexError),
    ("index_add", "index_add_"): _dim_check(0, 1, 2, False, RuntimeError),
    ("index_fill", "index_fill_"): _dim_check(0, 1, 2, True, IndexError),
    ("gather", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_"): _dim_check(
        0, 1, 2, False, RuntimeError
    ),
    ("index_put", "index_put_"): _check_index_put,
}
# The check of each torch function's eager step (tests compare them with the CPU kernels).
INDEX_CHECKS: dict[Any, Callable[[tuple, dict], None]] = {
    torch.Tensor.__getitem__: _check_key,
    torch.Tensor.__setitem__: _check_key,
    torch.nn.functional.embedding: _check_embedding,
}
for _names, _check in _INDEX_OPS.items():
    for _name in _names:
        for _fn in (getattr(torch, _name, None), getattr(torch.Tensor, _name, None)):
            if _fn is not None:
                INDEX_CHECKS[_fn] = _check
for _fn, _check in INDEX_CHECKS.items():
    if _fn not in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
        _register(_eager_index(getattr(_fn, "__name__", "an index op"), _check), _fn)


# ---- index ops kiln lowers into kernels ----------------------------------------------------------
#
# index_select, index_copy and index_add (and embedding, an index_select of the weight's rows)
# with a one-dim integer index, and gather, are kiln ops: they fuse, and the executor checks their indices
# before the kernel runs (kernel.h, IndexCheck). Other forms run as eager steps, as above.


def _kernel_index(index: Any) -> bool:
    return isinstance(index, Proxy) and index.dtype in (torch.int64, torch.int32) and index.dim() <= 1


def _index_select(call: Call) -> Any:
    args = _bind(call, lambda self, dim, index: None)
    self, dim, index = args["self"], args["dim"], args["index"]
    result = call.run_meta()
    if not isinstance(self, Proxy) or not _kernel_index(index):
        return _eager(call, "index_select", INDEX_CHECKS[torch.index_select])
    return call.emit("index_select", [self, dim, index], {}, result)


def _gather(call: Call) -> Any:
    args = _bind(call, lambda self, dim, index, *, sparse_grad=False: None)
    self, dim, index = args["self"], args["dim"], args["index"]
    result = call.run_meta()  # eager's checks (ranks, sizes, an int64 index)
    if not isinstance(self, Proxy) or not isinstance(index, Proxy) or self.dim() == 0:
        return _eager(call, "gather", INDEX_CHECKS[torch.gather])
    return call.emit("gather", [self, dim, index], {}, result)


def _index_write(op: str) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        if op == "index_add":
            args = _bind(call, lambda self, dim, index, source, *, alpha=1: None)
        else:
            args = _bind(call, lambda self, dim, index, source: None)
        self, dim, index, source = args["self"], args["dim"], args["index"], args["source"]
        inplace = call.name.endswith("_")
        result = call.run_meta()  # eager's checks (dtypes, shapes)
        expected = list(self.shape)
        if expected:
            expected[dim % len(expected)] = index.numel() if isinstance(index, torch.Tensor) else -1
        if (
            not isinstance(self, Proxy)
            or not isinstance(source, Proxy)
            or not _kernel_index(index)
            or self.dim() == 0
            or list(source.shape) != expected
            or source.dtype != self.dtype
        ):
            return _eager(call, op, INDEX_CHECKS[getattr(torch.Tensor, op)])
        if inplace:
            _check_write(call, self)
        meta = result if not inplace else call.run_meta(getattr(torch, op), (self, dim, index, source), {k: v for k, v in args.items() if k == "alpha"})
        kwargs = {"alpha": args["alpha"]} if op == "index_add" and args["alpha"] != 1 else {}
        value = call.emit(op, [self, dim, index, source], kwargs, meta)
        return _copy_into(call, self, value) if inplace else value

    return rule


def _embedding(call: Call) -> Any:
    args = _bind(
        call,
        lambda input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False: None,
    )
    index, weight = args["input"], args["weight"]
    call.run_meta()
    # max_norm renormalizes weight's rows in place; the rest only changes the backward pass.
    if args["max_norm"] is not None or not isinstance(weight, Proxy) or weight.dim() != 2 or not isinstance(index, Proxy) or index.dtype not in (torch.int64, torch.int32):
        return _eager(call, "embedding", _check_embedding)
    flat = RULES[_key(torch.Tensor.reshape)](Call(call.tracer, torch.Tensor.reshape, (index, (-1,)), {}, call.loc))
    rows = call.emit("index_select", [weight, 0, flat], {}, call.run_meta(torch.index_select, (weight, 0, flat), {}))
    shape = (*index.shape, weight.shape[1])
    return RULES[_key(torch.Tensor.view)](Call(call.tracer, torch.Tensor.view, (rows, shape), {}, call.loc))


_register(_index_select, torch.index_select, torch.Tensor.index_select)
_register(_gather, torch.gather, torch.Tensor.gather)
for _op in ("index_copy", "index_add"):
    _register(_index_write(_op), getattr(torch, _op), getattr(torch.Tensor, _op), getattr(torch.Tensor, _op + "_"))
_register(_embedding, torch.nn.functional.embedding)
