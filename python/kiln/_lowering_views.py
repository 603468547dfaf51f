"""Views, splits and the constant pad: the torch functions that change a tensor's shape or the
window it is seen through (see _lowering.py for what a rule is). A view is a kiln view op on the
same meta tensors eager would give; a reshape that eager copies is a copy; a constant pad is a
full tensor with x copied into its middle.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from ._lowering import _bind, _emit_clone, _register, _same_object, _sizes, _torch_fns, _via, _view_op
from ._tracer import _DTYPE_NAMES, Call, Proxy

def _sized_view(op: str) -> Callable[[Call], Any]:
    """view/reshape/permute/expand: sizes as varargs or one sequence."""

    def rule(call: Call) -> Any:
        self = call.args[0] if call.args else call.kwargs["input"]
        rest = call.args[1:]
        kw = {k: v for k, v in call.kwargs.items() if k != "input"}
        if op == "view" and (any(isinstance(r, torch.dtype) for r in rest) or "dtype" in kw):
            return _view_dtype(call, self, rest[0] if rest else kw["dtype"])
        if kw.pop("implicit", False):
            raise call.unsupported("expand(implicit=True) is not supported by kiln.")
        if kw:
            (sizes,) = kw.values()
        else:
            sizes = _sizes(tuple(rest))
        result = call.run_meta()
        if _same_object(call, result):
            return result
        return call.emit(op, [self, list(sizes)], {}, result)

    return rule


def _view_dtype(call: Call, self: Any, dtype: torch.dtype) -> Any:
    """x.view(dtype): x's bytes read as `dtype`, a view of x (kiln's view_dtype). kiln keeps to
    dtypes of x's element size, where the view has x's sizes and strides; between sizes eager
    reshapes the last dim, which kiln does not model."""
    result = call.run_meta()  # eager's errors first
    if dtype in _DTYPE_NAMES and dtype.itemsize != self.dtype.itemsize:
        raise call.unsupported(
            f"viewing a {self.dtype} tensor as {dtype} changes the element size ({self.dtype.itemsize} to "
            f"{dtype.itemsize} bytes), which kiln does not support (it reinterprets between dtypes of one "
            "size: float32/int32, float64/int64, float16/bfloat16). View it outside the compiled function."
        )
    return call.emit("view_dtype", [self, dtype], {}, result)  # a dtype kiln lacks raises here


_register(_sized_view("view"), torch.Tensor.view)
_register(_sized_view("permute"), *_torch_fns("permute"))
_register(_sized_view("expand"), torch.Tensor.expand)


def _maybe_copy_view(op: str, template: Callable, order: list[str]) -> Callable[[Call], Any]:
    """reshape and flatten return a view when eager can make one, else a copy. The meta run
    says which; a copy is written explicitly (clone, then view) so the trace does not depend on
    kiln guessing the layout eager gave an intermediate (a TensorIterator result keeps its
    input's permuted strides, which kiln's analysis does not model)."""

    def rule(call: Call) -> Any:
        if template is None:
            self = call.args[0] if call.args else call.kwargs["input"]
            kw = {k: v for k, v in call.kwargs.items() if k != "input"}
            sizes = list(kw.values())[0] if kw else _sizes(tuple(call.args[1:]))
            operands = [self, list(sizes)]
        else:
            args = _bind(call, template)
            self = args[order[0]]
            operands = [args[n] for n in order]
        result = call.run_meta()
        if _same_object(call, result):
            return result
        if result._is_view() or self.numel() == 0:
            return call.emit(op, operands, {}, result)
        copy = _emit_clone(call, self, torch.contiguous_format)
        return call.emit("view", [copy, list(result.shape)], {}, result)

    return rule


_register(_maybe_copy_view("reshape", None, []), *_torch_fns("reshape"))
_register(
    _maybe_copy_view("flatten", lambda self, start_dim=0, end_dim=-1: None, ["self", "start_dim", "end_dim"]),
    *_torch_fns("flatten"),
)

_register(_view_op("transpose", lambda self, dim0, dim1: None, ["self", "dim0", "dim1"]), *_torch_fns("transpose"))
_register(_view_op("transpose", lambda self, axis0, axis1: None, ["self", "axis0", "axis1"]), *_torch_fns("swapaxes"))
_register(_view_op("transpose", lambda self, dim0, dim1: None, ["self", "dim0", "dim1"]), *_torch_fns("swapdims"))
_register(_view_op("t", lambda self: None, ["self"]), *_torch_fns("t"))
_register(_view_op("unsqueeze", lambda self, dim: None, ["self", "dim"]), *_torch_fns("unsqueeze"))
_register(_view_op("squeeze", lambda self, dim=None: None, ["self", "dim"]), *_torch_fns("squeeze"))
_register(_view_op("unflatten", lambda self, dim, sizes: None, ["self", "dim", "sizes"]), *_torch_fns("unflatten"))
_register(_view_op("narrow", lambda self, dim, start, length: None, ["self", "dim", "start", "length"]), *_torch_fns("narrow"))
_register(_view_op("select", lambda self, dim, index: None, ["self", "dim", "index"]), *_torch_fns("select"))
_register(
    _view_op("diagonal", lambda self, offset=0, dim1=0, dim2=1: None, ["self", "offset", "dim1", "dim2"]),
    *_torch_fns("diagonal"),
)
_register(
    _view_op("as_strided", lambda self, size, stride, storage_offset=None: None, ["self", "size", "stride", "storage_offset"]),
    *_torch_fns("as_strided"),
)
_register(_view_op("detach", lambda self: None, ["self"]), *_torch_fns("detach"))


def _view_like(op: str) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        args = _bind(call, lambda self, other: None)
        result = call.run_meta()
        if _same_object(call, result):
            return result
        sizes = list(args["other"].shape)
        if op == "reshape" and not result._is_view() and args["self"].numel() != 0:
            copy = _emit_clone(call, args["self"], torch.contiguous_format)
            return call.emit("view", [copy, sizes], {}, result)
        return call.emit(op, [args["self"], sizes], {}, result)

    return rule


_register(_view_like("view"), torch.Tensor.view_as)
_register(_view_like("reshape"), torch.Tensor.reshape_as)
_register(_view_like("expand"), torch.Tensor.expand_as)


def _movedim(call: Call) -> Any:
    args = _bind(call, lambda self, source, destination: None)
    result = call.run_meta()
    # The permutation movedim makes, read off the meta result's strides would be fragile;
    # compute it as ATen does.
    rank = args["self"].dim()
    src = args["source"] if isinstance(args["source"], (tuple, list)) else [args["source"]]
    dst = args["destination"] if isinstance(args["destination"], (tuple, list)) else [args["destination"]]
    src = [s % rank if rank else 0 for s in src]
    dst = [d % rank if rank else 0 for d in dst]
    order = [-1] * rank
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(i for i in range(rank) if i not in src)
    order = [o if o != -1 else next(rest) for o in order]
    return call.emit("permute", [args["self"], order], {}, result)


_register(_movedim, *_torch_fns("movedim", "moveaxis"))


def _transpose_property(op: str) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        self = call.args[0]
        result = call.run_meta()
        if op == "T":  # all dims reversed (deprecated for rank != 2, still eager's meaning)
            return call.emit("permute", [self, list(reversed(range(self.dim())))], {}, result)
        return call.emit("transpose", [self, -2, -1], {}, result)

    return rule


_register(_transpose_property("T"), ("property", "T"), ("property", "H"))
_register(_transpose_property("mT"), ("property", "mT"), ("property", "mH"))


def _split(call: Call) -> Any:
    args = _bind(call, lambda self, split_size_or_sections, dim=0: None)
    result = call.run_meta()
    return call.emit("split", [args["self"], args["split_size_or_sections"], args["dim"]], {}, result)


def _tensor_split_method(call: Call) -> Any:
    args = _bind(call, lambda self, split_size, dim=0: None)
    result = call.run_meta()
    return call.emit("split", [args["self"], args["split_size"], args["dim"]], {}, result)


_register(_split, torch.split, torch.functional.split)
_register(_tensor_split_method, torch.Tensor.split)
_register(_view_op("chunk", lambda self, chunks, dim=0: None, ["self", "chunks", "dim"]), *_torch_fns("chunk"))
_register(_view_op("unbind", lambda self, dim=0: None, ["self", "dim"]), *_torch_fns("unbind"))


def _constant_pad(call: Call) -> Any:
    """pad(x, pad, mode="constant", value) as eager's constant_pad_nd builds it: a tensor of
    `value` of the padded shape, x (cropped where a pad is negative) copied into its middle.
    Functionalized, the copy is a slice_scatter: it fuses with x's producer and with the readers,
    and its gradient is a slice of the result's (a language model's labels, padded with
    ignore_index and shifted, were an eager step). Other modes (reflect, replicate, circular)
    and a result eager lays out otherwise than contiguously (a channels-last input) run as an
    eager step."""
    from ._fallback import eager_fallback

    if call.func is torch.constant_pad_nd:
        args = _bind(call, lambda input, pad, value=0: None)
        args["mode"] = "constant"
    else:
        args = _bind(call, lambda input, pad, mode="constant", value=None: None)
    x, pad = args["input"], list(args["pad"])
    result = call.run_meta()  # eager's checks (an even pad list, no negative size)
    if args["mode"] != "constant" or not isinstance(x, Proxy) or not result.is_contiguous() or result.numel() == 0:
        # (an empty result keeps the strides of eager's narrow)
        return eager_fallback(call, what=f"pad with mode={args['mode']!r}" if args["mode"] != "constant" else "this pad")
    value = 0 if args["value"] is None else args["value"]
    out = call.emit("full", [list(result.shape), value], {"dtype": result.dtype, "device": x.device}, result, device=x.device)
    src, dst = x, out
    for k in range(len(pad) // 2):
        d = x.dim() - 1 - k
        before, after = pad[2 * k], pad[2 * k + 1]
        kept = x.shape[d] - max(-before, 0) - max(-after, 0)
        if kept <= 0:
            return out  # nothing of x is left: all padding
        if before < 0 or after < 0:
            src = _via(call, torch.narrow, src, d, max(-before, 0), kept)
        if before > 0 or after > 0:
            dst = _via(call, torch.narrow, dst, d, max(before, 0), kept)
    if x.numel() == 0:
        return out
    call.emit("copy_", [dst, src], {}, dst)
    return out


_register(_constant_pad, F.pad, torch._C._nn.pad, torch.constant_pad_nd)
