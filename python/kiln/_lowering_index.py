"""Index reads and writes: masked_fill, and `x[key]` / `x[key] = v` with tensors, lists or bools
in the key (PyTorch's advanced indexing).

A write is functional like every other (DESIGN.md 2.2): its new value is computed, then copied
into the tensor, which functionalize turns into a scatter of the current value and a writeback
where the tensor is an input.

- `masked_fill(_)` is `where(mask, value, x)` in x's dtype, so it fuses with what is around it
  (an attention mask before a softmax, CASES.md X3).
- `x[mask] = v`, a boolean mask over x's leading dims and a number or one-element tensor v, is
  the same masked_fill with the mask's shape padded with ones (CASES.md X4).
- `x[i]`, `x[:, i]` and `x[i] = v` with one integer index tensor (negative indices counting
  from the end: wrap_index), index_put_ with one index tensor and index_fill_ lower to
  index_select, index_copy and index_add (below).
- `x[i, j]`, `x[:, i, j] = v`, index_put_((i, j), v, accumulate=) with several index tensors at
  adjacent dims of a contiguous x index the view of x with those dims merged, at the flat
  position i * J + j; each index is first checked against its own dim (_checked_positions).
- Every other advanced key, read or write, runs as an eager step (kiln._fallback): PyTorch
  indexes the program's tensors on their device, a write on a clone that is copied back. Its
  errors are PyTorch's (an index out of range raises IndexError, on the CPU at the op).
- A read whose size depends on values (`x[mask]`) cannot be traced (kiln needs every shape
  while tracing) and raises UnsupportedError naming the rewrite.

The ops with their own torch names (index_select, gather, scatter, index_copy_, index_put_,
...) lower to kiln's index ops where their form allows (below), else run as eager steps with
an index check on CUDA.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ._lowering import RULES, _bind, _cast, _check_write, _key, _register, _getitem, _setitem, _via
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
    return _via(call, torch.Tensor.copy_, target, value)


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
    lowered = _one_tensor_getitem(call, self, key)
    if lowered is not None:
        return lowered
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
    if not _one_tensor_setitem(call, self, key, value):
        _eager(call, "assigning through tensors or lists", _check_key)
    return None


def _eager(call: Call, what: str, check: Callable[[tuple, dict], None] | None = None) -> Any:
    from ._fallback import eager_fallback

    return eager_fallback(call, check, what)


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


def _check_take_along_dim(args: tuple, kwargs: dict) -> None:
    x = args[0] if args else kwargs["input"]
    index = args[1] if len(args) > 1 else kwargs["indices"]
    dim = args[2] if len(args) > 2 else kwargs.get("dim")
    if dim is None:  # (along a dim, eager takes the indices modulo its size)
        _check_range(index, x.numel(), 0, False, RuntimeError)


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
    torch.take_along_dim: _check_take_along_dim,
    torch.Tensor.take_along_dim: _check_take_along_dim,
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
# with a one-dim integer index, gather (and take_along_dim without a dim) and scatter (scatter_add,
# scatter_reduce) are kiln ops: they fuse, and the executor checks their indices before the kernel
# runs (kernel.h, IndexCheck). Other forms run as eager steps, as above.


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


def _take_along_dim(call: Call) -> Any:
    """take_along_dim without a dim is a gather of the flattened operands. Along a dim, eager
    takes the indices modulo the dim's size (an index out of range is no error): kiln's gather
    has no such mode, and that form runs as an eager step."""
    args = _bind(call, lambda input, indices, dim=None: None)
    x, index, dim = args["input"], args["indices"], args["dim"]
    call.run_meta()  # eager's checks (ranks, an integer index, shapes that broadcast)
    if not isinstance(x, Proxy) or not isinstance(index, Proxy) or index.dtype != torch.int64 or x.dim() == 0 or dim is not None:
        return _eager(call, "take_along_dim", _check_take_along_dim)
    x, index = _via(call, torch.Tensor.reshape, x, (-1,)), _via(call, torch.Tensor.reshape, index, (-1,))
    return call.emit("gather", [x, 0, index], {}, call.run_meta(torch.gather, (x, 0, index), {}))


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
            or index.numel() > MAX_KERNEL_INDEX_POSITIONS
            or self.dim() == 0
            or list(source.shape) != expected
            or source.dtype != self.dtype
        ):
            return _eager(call, op, INDEX_CHECKS[getattr(torch.Tensor, op)])
        if inplace:
            _check_write(call, self)
            _check_no_overlap(call, self, index, source)
        meta = result if not inplace else call.run_meta(getattr(torch, op), (self, dim, index, source), {k: v for k, v in args.items() if k == "alpha"})
        kwargs = {"alpha": args["alpha"]} if op == "index_add" and args["alpha"] != 1 else {}
        value = call.emit(op, [self, dim, index, source], kwargs, meta)
        return _copy_into(call, self, value) if inplace else value

    return rule


# The pull kernels of index_copy, index_add and scatter loop, for each element they produce,
# over the index positions along dim: at more than this many, that costs more than eager's
# scatter of the source, and the op runs as an eager step instead.
MAX_KERNEL_INDEX_POSITIONS = 16

# scatter's reduce names (the deprecated scatter(reduce=) ones, and scatter_reduce's) as kiln's
# scatter op takes them.
_SCATTER_REDUCE = {None: None, "add": "sum", "multiply": "prod", "sum": "sum", "prod": "prod", "mean": "mean", "amax": "amax", "amin": "amin"}


def _scatter(op: str) -> Callable[[Call], Any]:
    """scatter, scatter_add and scatter_reduce (and their in-place forms) as kiln's scatter op."""

    def rule(call: Call) -> Any:
        include_self = True
        if op == "scatter":
            args = _bind(call, lambda self, dim, index, src=None, value=None, *, reduce=None: None)
            src = args["src"] if args["src"] is not None else args["value"]
            reduce = args["reduce"]
        elif op == "scatter_add":
            args = _bind(call, lambda self, dim, index, src: None)
            src, reduce = args["src"], "sum"
        else:
            args = _bind(call, lambda self, dim, index, src, reduce, *, include_self=True: None)
            src, reduce, include_self = args["src"], args["reduce"], args["include_self"]
        self, dim, index = args["self"], args["dim"], args["index"]
        inplace = call.name.endswith("_")
        result = call.run_meta()  # eager's checks (ranks, sizes, dtypes, the reduce name)
        check = INDEX_CHECKS[getattr(torch.Tensor, op)]
        if (
            not isinstance(self, Proxy)
            or not isinstance(index, Proxy)
            or self.dim() == 0
            or index.dim() != self.dim()
            or index.shape[dim % self.dim()] > MAX_KERNEL_INDEX_POSITIONS
            or (isinstance(src, torch.Tensor) and (not isinstance(src, Proxy) or src.dtype != self.dtype or src.dim() != self.dim()))
            or (reduce is not None and self.dtype == torch.bool)
            or _SCATTER_REDUCE.get(reduce, "?") == "?"
        ):
            return _eager(call, op, check)
        if not isinstance(src, torch.Tensor):  # a value: src is that value at every index position
            full = Call(call.tracer, torch.full, (tuple(index.shape), src), {"dtype": self.dtype, "device": self.device}, call.loc)
            src = RULES[_key(torch.full)](full)
        if inplace:
            _check_write(call, self)
            _check_no_overlap(call, self, index, src)
            result = call.run_meta(torch.scatter, (self, dim, index, src), {})
        kwargs: dict[str, Any] = {}
        if reduce is not None:
            kwargs["reduce"] = _SCATTER_REDUCE[reduce]
            if not include_self:
                kwargs["include_self"] = False
        value = call.emit("scatter", [self, dim, index, src], kwargs, result)
        return _copy_into(call, self, value) if inplace else value

    return rule


# ---- advanced indexing with one integer tensor -----------------------------------------------
#
# x[i], x[:, i] (one integer index tensor after full slices, full slices after it) read
# index_select(x, d, wrap_index(i.reshape(-1))) viewed as x.shape[:d] + i.shape + x.shape[d+1:];
# x[i] = v, index_put_((i,), v, accumulate=) and index_fill_ write through index_copy or
# index_add. wrap_index counts negative indices from the end, as advanced indexing does (the
# executor checks the index against [-size, size)). On a contiguous x only: eager's result
# follows x's layout, kiln's index_select is contiguous.


def _dense_range(t: torch.Tensor) -> tuple[int, int] | None:
    """The elements [lo, hi) of its storage a non-overlapping and dense tensor covers, else None."""
    if t.numel() == 0:
        return None
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return None
        expected *= size
    return t.storage_offset(), t.storage_offset() + t.numel()


def _check_no_overlap(call: Call, target: Proxy, *others: Any) -> None:
    """Eager's assert_no_overlap for an index write: the written tensor shares no memory with
    its index or source (checked, as ATen does, where both are non-overlapping and dense)."""
    for other in others:
        if not isinstance(other, torch.Tensor) or other.untyped_storage()._cdata != target.untyped_storage()._cdata:
            continue
        a, b = _dense_range(target), _dense_range(other)
        if a is not None and b is not None and a[0] < b[1] and b[0] < a[1]:
            raise RuntimeError(
                "unsupported operation: some elements of the input tensor and the written-to tensor "
                "refer to a single memory location. Please clone() the tensor before performing the "
                f"operation.\n(kiln: raised by {call.name} at {call.where()} while tracing)"
            )


def _full_slice(k: Any) -> bool:
    return isinstance(k, slice) and k == slice(None)


def _one_tensor_key(self: Any, key: Any, write: bool = False) -> tuple[int, Proxy] | None:
    items = key if isinstance(key, tuple) else (key,)
    tensors = [k for k in items if isinstance(k, torch.Tensor)]
    if len(tensors) != 1 or not isinstance(self, Proxy) or not self.is_contiguous():
        return None
    index = tensors[0]
    # (index_copy and index_add take int64 indices only)
    if not isinstance(index, Proxy) or index.dtype not in ((torch.int64,) if write else (torch.int64, torch.int32)):
        return None
    d = next(k for k, item in enumerate(items) if item is index)
    if d >= self.dim() or not all(_full_slice(k) for k in items[:d]):
        return None
    if not all(_full_slice(k) or k is Ellipsis for k in items[d + 1 :]):
        return None
    return d, index


def _tensor_group_key(self: Any, key: Any, write: bool = False) -> tuple[int, list[Proxy]] | None:
    """`x[..., i, j, ...]`: two or more integer index tensors at adjacent dims d, d+1, ... of a
    contiguous x, whole slices elsewhere (`logits[torch.arange(n), labels]`). The result's index
    dims sit where the tensors were, as eager puts adjacent advanced indices."""
    items = key if isinstance(key, tuple) else (key,)
    if not isinstance(self, Proxy) or not self.is_contiguous():
        return None
    d = 0
    while d < len(items) and _full_slice(items[d]):
        d += 1
    end = d
    while end < len(items) and isinstance(items[end], torch.Tensor):
        end += 1
    tensors = list(items[d:end])
    if len(tensors) < 2 or end > self.dim() or not all(_full_slice(k) or k is Ellipsis for k in items[end:]):
        return None
    allowed = (torch.int64,) if write else (torch.int64, torch.int32)
    if not all(isinstance(t, Proxy) and t.dtype in allowed for t in tensors):
        return None
    return d, tensors


def _grouped(call: Call, self: Proxy, d: int, tensors: list[Proxy]) -> tuple[Proxy, Proxy, tuple]:
    """The view of self with the indexed dims merged into one, the flat positions into it (each
    index wrapped and checked against its own dim's size), and the indices' broadcast shape."""
    shape = tuple(torch.broadcast_shapes(*(tuple(t.shape) for t in tensors)))
    flat_positions = None
    stride = 1
    for k in reversed(range(len(tensors))):
        size = self.shape[d + k]
        t = _cast(call, tensors[k], torch.int64)
        if tuple(t.shape) != shape:
            t = _via(call, torch.Tensor.expand, t, shape)
        term = _checked_positions(call, t, size, d + k)
        if stride != 1:
            term = _via(call, torch.mul, term, stride)
        flat_positions = term if flat_positions is None else _via(call, torch.add, term, flat_positions)
        stride *= size
    merged = (*self.shape[:d], stride, *self.shape[d + len(tensors) :])
    return _via(call, torch.Tensor.view, self, merged), flat_positions, shape


def _checked_positions(call: Call, index: Proxy, size: int, dim: int) -> Proxy:
    """index wrapped into [0, size), flat, through an index_select of the positions 0..size-1
    laid along `dim`: the executor checks an index op's index before its kernel runs (eager's
    error, "index 4 is out of bounds for dimension 1 with size 4", with the tensor untouched),
    where a position merged into a flat index (i * J + j) would no longer show which dim it
    overran."""
    device = call.default_device()
    arange = Call(call.tracer, torch.arange, (size,), {"dtype": torch.int64, "device": device}, call.loc)
    positions = RULES[_key(torch.arange)](arange)
    positions = _via(call, torch.Tensor.view, positions, (*([1] * dim), size))
    w = _wrapped(call, index, size)
    picked = call.emit("index_select", [positions, dim, w], {}, call.run_meta(torch.index_select, (positions, dim, w), {}))
    return _via(call, torch.Tensor.reshape, picked, (-1,))


def _wrapped(call: Call, index: Proxy, size: int) -> Proxy:
    flat = _via(call, torch.Tensor.reshape, index, (-1,))
    return call.emit("wrap_index", [flat, size], {}, call.run_meta(torch.Tensor.clone, (flat,), {}))


def _one_tensor_getitem(call: Call, self: Any, key: Any) -> Proxy | None:
    found = _one_tensor_key(self, key)
    if found is None:
        return _tensor_group_getitem(call, self, key)
    d, index = found
    call.run_meta()  # eager's checks
    w = _wrapped(call, index, self.shape[d])
    rows = call.emit("index_select", [self, d, w], {}, call.run_meta(torch.index_select, (self, d, w), {}))
    return _via(call, torch.Tensor.view, rows, (*self.shape[:d], *index.shape, *self.shape[d + 1 :]))


def _tensor_group_getitem(call: Call, self: Any, key: Any) -> Proxy | None:
    found = _tensor_group_key(self, key)
    if found is None:
        return None
    d, tensors = found
    call.run_meta()  # eager's checks (the indices broadcast together)
    merged, positions, shape = _grouped(call, self, d, tensors)
    rows = call.emit("index_select", [merged, d, positions], {}, call.run_meta(torch.index_select, (merged, d, positions), {}))
    return _via(call, torch.Tensor.view, rows, (*self.shape[:d], *shape, *self.shape[d + len(tensors) :]))


def _index_source(call: Call, self: Proxy, d: int, index: Proxy, value: Any, index_shape: tuple) -> Proxy:
    """value as the source of an index_copy along d: in self's dtype, broadcast to the indexed
    shape (self.shape[:d] + index_shape + self.shape[d+1:]), the index dims flattened."""
    shape = (*self.shape[:d], *index_shape, *self.shape[d + 1 :])
    if isinstance(value, Proxy):
        value = _cast(call, value, self.dtype)
    else:
        full = Call(call.tracer, torch.full, ((), value), {"dtype": self.dtype, "device": self.device}, call.loc)
        value = RULES[_key(torch.full)](full)
    if tuple(value.shape) != shape:
        value = _via(call, torch.Tensor.expand, value, shape)
    flat = (*self.shape[:d], index.numel(), *self.shape[d + 1 :])
    return _via(call, torch.Tensor.reshape, value, flat)


def _write_rows(call: Call, self: Proxy, d: int, index: Proxy, source: Proxy, accumulate: bool) -> None:
    _check_write(call, self)
    _check_no_overlap(call, self, index, source)
    _write_positions(call, self, d, _wrapped(call, index, self.shape[d]), source, accumulate)


def _write_positions(call: Call, self: Proxy, d: int, positions: Proxy, source: Proxy, accumulate: bool) -> None:
    op = "index_add" if accumulate else "index_copy"
    meta = call.run_meta(getattr(torch, op), (self, d, positions, source), {})
    _copy_into(call, self, call.emit(op, [self, d, positions, source], {}, meta))


def _write_tensor_group(call: Call, self: Proxy, d: int, tensors: list[Proxy], value: Any, accumulate: bool) -> None:
    """x[..., i, j, ...] = value (or += with accumulate): index_copy/index_add into the view of x
    with the indexed dims merged."""
    _check_write(call, self)
    _check_no_overlap(call, self, *tensors, value)
    merged, positions, shape = _grouped(call, self, d, tensors)
    source = _index_source(call, merged, d, positions, value, shape)
    _write_positions(call, merged, d, positions, source, accumulate)


def _one_tensor_setitem(call: Call, self: Any, key: Any, value: Any) -> bool:
    if isinstance(value, torch.Tensor) and not isinstance(value, Proxy):
        return False
    group = _tensor_group_key(self, key, write=True)
    if group is not None and math.prod(torch.broadcast_shapes(*(tuple(t.shape) for t in group[1]))) <= MAX_KERNEL_INDEX_POSITIONS:
        call.run_meta()  # eager's checks (value broadcasts to the indexed shape)
        _write_tensor_group(call, self, group[0], group[1], value, False)
        return True
    found = _one_tensor_key(self, key, write=True)
    if found is None or found[1].numel() > MAX_KERNEL_INDEX_POSITIONS:
        return False
    if isinstance(value, torch.Tensor) and not isinstance(value, Proxy):
        return False
    d, index = found
    call.run_meta()  # eager's checks (value broadcasts to the indexed shape)
    _write_rows(call, self, d, index, _index_source(call, self, d, index, value, tuple(index.shape)), False)
    return True


def _index_put(call: Call) -> Any:
    args = _bind(call, lambda self, indices, values, accumulate=False: None)
    self, indices, values, accumulate = args["self"], args["indices"], args["values"], args["accumulate"]
    result = call.run_meta()
    group = _tensor_group_key(self, tuple(indices), write=True) if len(indices) > 1 else None
    if group is not None and isinstance(values, Proxy) and call.name.endswith("_"):
        if math.prod(torch.broadcast_shapes(*(tuple(t.shape) for t in group[1]))) <= MAX_KERNEL_INDEX_POSITIONS:
            _write_tensor_group(call, self, group[0], group[1], values, accumulate)
            return self
    found = _one_tensor_key(self, tuple(indices), write=True) if len(indices) == 1 else None
    if found is None or found[1].numel() > MAX_KERNEL_INDEX_POSITIONS or not isinstance(values, Proxy):
        return _eager(call, "index_put", _check_index_put)
    d, index = found
    source = _index_source(call, self, d, index, values, tuple(index.shape))
    if call.name.endswith("_"):
        _write_rows(call, self, d, index, source, accumulate)
        return self
    w = _wrapped(call, index, self.shape[d])
    op = "index_add" if accumulate else "index_copy"
    return call.emit(op, [self, d, w, source], {}, result)


def _index_fill(call: Call) -> Any:
    args = _bind(call, lambda self, dim, index, value: None)
    self, dim, index, value = args["self"], args["dim"], args["index"], args["value"]
    result = call.run_meta()
    if (
        not isinstance(self, Proxy)
        or self.dim() == 0
        or not _kernel_index(index)
        or index.numel() > MAX_KERNEL_INDEX_POSITIONS
        or (isinstance(value, torch.Tensor) and not isinstance(value, Proxy))
    ):
        return _eager(call, "index_fill", INDEX_CHECKS[torch.Tensor.index_fill])
    d = dim % self.dim()
    source = _index_source(call, self, d, index, value, (index.numel(),))
    if call.name.endswith("_"):
        _write_rows(call, self, d, index, source, False)
        return self
    w = _wrapped(call, index, self.shape[d])
    return call.emit("index_copy", [self, d, w, source], {}, result)


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
    flat = _via(call, torch.Tensor.reshape, index, (-1,))
    rows = call.emit("index_select", [weight, 0, flat], {}, call.run_meta(torch.index_select, (weight, 0, flat), {}))
    shape = (*index.shape, weight.shape[1])
    return _via(call, torch.Tensor.view, rows, shape)


_register(_index_select, torch.index_select, torch.Tensor.index_select)
_register(_gather, torch.gather, torch.Tensor.gather)
_register(_take_along_dim, torch.take_along_dim, torch.Tensor.take_along_dim)
for _op in ("index_copy", "index_add"):
    _register(_index_write(_op), getattr(torch, _op), getattr(torch.Tensor, _op), getattr(torch.Tensor, _op + "_"))
_register(_embedding, torch.nn.functional.embedding)
for _op in ("scatter", "scatter_add", "scatter_reduce"):
    _register(_scatter(_op), getattr(torch, _op), getattr(torch.Tensor, _op), getattr(torch.Tensor, _op + "_"))
_register(_index_put, torch.index_put, torch.Tensor.index_put, torch.Tensor.index_put_)
_register(_index_fill, torch.index_fill, torch.Tensor.index_fill, torch.Tensor.index_fill_)
