"""Steps without a kernel, run op by op through PyTorch where their tensors are.

A fusion region that does not lower to a kernel (a cat, an integer division, a matrix product
on the CPU) was run by kiln's reference interpreter, which on CUDA works on host copies of the
tensors. kiln._C runs such a step here instead: each node of the step's body is the torch
function of the same name on the same arguments (kiln's ops are torch's, with torch's
signatures), on the device. DESIGN.md section 7: every CUDA step on the device.

    (t3,) = kilnFusion2(x, y)            run_node("cat", [[x, y], 0], {})
      # t2 = ltorch.cat([x, y], 0)  ->   run_node("div", [t2, 3], {"rounding_mode": "floor"})
      # t3 = ltorch.div(t2, 3, rounding_mode="floor")

Requires: the op names and signatures of src/kiln/ir/ops.def (tests/python/test_ops_table.py
checks every op has a torch function here). Ensures: results that would share memory with a
step input are copies (a step's outputs are values).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=4096)
def constant(text: str) -> Any:
    """The Python value of a constant as kiln prints it (src/kiln/ir/constant.cpp)."""
    return eval(text, {"__builtins__": {}}, {"torch": torch, "slice": slice, "float": float, "Ellipsis": Ellipsis})  # noqa: S307


def _reduce(fn: Callable) -> Callable:
    def call(self: torch.Tensor, dim: Any = None, keepdim: bool = False, **kwargs: Any) -> Any:
        if dim is None:
            return fn(self, **kwargs)
        return fn(self, dim, keepdim, **kwargs)

    return call


def _squeeze(self: torch.Tensor, dim: Any = None) -> torch.Tensor:
    return self.squeeze() if dim is None else self.squeeze(dim)


def _full(size: list, fill_value: Any, *, dtype: Any = None, device: Any = "cpu") -> torch.Tensor:
    return torch.full(size, fill_value, dtype=dtype, device=device)


def _var(fn: Callable) -> Callable:
    def call(self: torch.Tensor, dim: Any = None, *, correction: Any = 1, keepdim: bool = False) -> torch.Tensor:
        return fn(self, dim, correction=correction, keepdim=keepdim)

    return call


def _scatter(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, *, reduce: Any = None, include_self: bool = True) -> torch.Tensor:
    if reduce is None:
        return torch.scatter(self, dim, index, src)
    return torch.scatter_reduce(self, dim, index, src, reduce, include_self=include_self)


# kiln ops whose torch function has another name or form; every other op is torch.<name>,
# else torch.Tensor.<name>.
_SPECIAL: dict[str, Callable] = {
    "getitem": lambda self, index: self[index],
    "slice": lambda self, dim=0, start=None, end=None, step=1: torch.ops.aten.slice.Tensor(self, dim, start, end, step),
    "alias": lambda self: torch.ops.aten.alias.default(self),
    # kiln's empty_like is zeros (reproducible runs); the interpreter and the kernels agree.
    "empty_like": torch.zeros_like,
    "full": _full,
    "sum": _reduce(torch.sum),
    "mean": _reduce(torch.mean),
    "prod": _reduce(torch.prod),
    "argmax": _reduce(torch.argmax),
    "argmin": _reduce(torch.argmin),
    "var": _var(torch.var),
    "std": _var(torch.std),
    "squeeze": _squeeze,
    "to": lambda self, dtype: self.to(dtype),
    # view_dtype is Tensor.view(dtype); bitcast, its functional form, is the same view, which
    # `detached` copies (the copy keeps every bit: no arithmetic touches the elements).
    "view_dtype": lambda self, dtype: self.view(dtype),
    "bitcast": lambda self, dtype: self.view(dtype),
    "linear": F.linear,
    "layer_norm": F.layer_norm,
    "rms_norm": F.rms_norm,
    "gelu": F.gelu,
    "silu": F.silu,
    "scatter": _scatter,
    # copy(self, src): src's values in self's shape and dtype (functionalization's copy_).
    "copy": lambda self, src: torch.ops.aten.copy.default(self.to(torch.promote_types(self.dtype, src.dtype)), src),
    "wrap_index": lambda index, size: torch.where((index < 0) & (index >= -size), index + size, index),
}


@functools.lru_cache(maxsize=None)
def torch_function(op: str) -> Callable:
    fn = _SPECIAL.get(op) or getattr(torch, op, None) or getattr(torch.Tensor, op, None)
    if fn is None:
        raise NotImplementedError(f"kiln bug: no torch function runs kiln's {op}")
    return fn


def _scatter_(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, *, reduce: Any = None, include_self: bool = True) -> torch.Tensor:
    if reduce is None:
        return self.scatter_(dim, index, src)
    return self.scatter_reduce_(dim, index, src, reduce, include_self=include_self)


# The in-place forms of the index writes, for a self that is the step's own fresh tensor and read
# by nothing else (torch_steps.cpp's writes_in_place): the out-of-place form is a copy of self
# and then the same in-place write.
IN_PLACE: dict[str, Callable] = {
    "index_add": lambda self, dim, index, source, *, alpha=1: self.index_add_(dim, index, source, alpha=alpha),
    "index_copy": lambda self, dim, index, source: self.index_copy_(dim, index, source),
    "scatter": _scatter_,
}


def run_node(op: str, args: list, kwargs: dict, indices_checked: bool = False, in_place: bool = False) -> Any:
    if op in _INDEX_OPS and args[0].is_cuda and not indices_checked:
        # PyTorch's CUDA kernels device-assert on an index out of range: check it first.
        from ._lowering_index import INDEX_CHECKS

        INDEX_CHECKS[getattr(torch, op)](tuple(args), kwargs)
    if in_place:
        return IN_PLACE[op](*args, **kwargs)
    return torch_function(op)(*args, **kwargs)


_INDEX_OPS = {"index_select", "gather", "index_copy", "index_add", "scatter"}


def detached(outputs: list, inputs: list) -> list:
    """The outputs, each that shares memory with an input copied."""
    memory = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes()}
    out = []
    for t in outputs:
        if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() and t.untyped_storage().data_ptr() in memory:
            t = t.clone(memory_format=torch.preserve_format)  # a new storage, whatever t's layout
        out.append(t)
    return out

