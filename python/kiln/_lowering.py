"""How each torch function the tracer meets becomes kiln ops.

RULES maps a torch function (as the tracing mode receives it: `torch.add`, `torch.Tensor.add`,
`torch.nn.functional.relu`, or ("property", "T") for a property read) to a rule. A rule runs the
torch function on the meta tensors (`call.run_meta()`), which checks the arguments and gives the
result's dtype, shape and strides exactly as eager does, then records kiln op(s) with
`call.emit(op, args, kwargs, results)`.

Where kiln has no op of the same form, a rule writes the eager computation with kiln's ops:
`2 / x` is `x.reciprocal() * 2` (eager's own definition in torch/_tensor.py), `x.clone()` is
`empty_like` + `copy_`, `x.max(0)` is `amax` + `argmax`. Only forms whose results are exactly
eager's are written this way; anything else raises UnsupportedError.

This module holds the core families (elementwise ops, casts and copies, mutation, views,
reductions, joins and matrix products); the others register into the same RULES from their own
modules: _lowering_views.py (views, splits, the constant pad), _lowering_creation.py (factories),
_lowering_nn.py (softmax, the norms, dropout) and _lowering_index.py (index reads and writes).

PASSTHROUGH holds metadata questions the meta tensors answer (x.shape, x.dim(), len(x)).
NEEDS_VALUE holds functions that need a tensor's contents, which do not exist while tracing.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ._errors import UnsupportedError
from ._metadata import FAST_RULES, elementwise_result, mean_result
from ._tracer import Call, IndexKey, Proxy

RULES: dict[Any, Callable[[Call], Any]] = {}

_OVERLAP_MESSAGE = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)


def _key(func: Any) -> Any:
    from ._tracer import _func_key

    return _func_key(func)


def _register(rule: Callable[[Call], Any], *funcs: Any) -> None:
    for f in funcs:
        if f is not None:
            RULES[_key(f)] = rule


def _register_elementwise(rule: Callable[[Call], Any], *funcs: Any) -> None:
    """A rule for torch functions that eager runs as TensorIterator elementwise ops: their
    result metadata comes from _metadata's rules, not from PyTorch's Python meta kernels."""
    _register(rule, *funcs)
    for f in funcs:
        if f is not None:
            FAST_RULES[f] = elementwise_result


def _torch_fns(*names: str) -> list[Any]:
    """torch.<name> and torch.Tensor.<name> for each name, where they exist."""
    out = []
    for n in names:
        out.append(getattr(torch, n, None))
        out.append(getattr(torch.Tensor, n, None))
    return out


def _bind(call: Call, template: Callable) -> dict[str, Any]:
    """Binds the call's arguments to a Python signature describing the torch form, e.g.
    `lambda self, dim=None, keepdim=False, *, dtype=None: None`. The meta run has already
    accepted the arguments, so a failure here is a form kiln does not handle."""
    kwargs = dict(call.kwargs)
    sig = inspect.signature(template)
    first = next(iter(sig.parameters))
    if "input" in kwargs and "input" not in sig.parameters:
        kwargs[first] = kwargs.pop("input")
    try:
        bound = sig.bind(*call.args, **kwargs)
    except TypeError as e:
        raise call.unsupported(f"this form of the call is not supported by kiln ({e}).") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _sizes(values: tuple) -> list:
    """`x.view(4, 2)` and `x.view((4, 2))` alike."""
    if len(values) == 1 and isinstance(values[0], (tuple, list, torch.Size)):
        return list(values[0])
    return list(values)


def _check_write(call: Call, target: Any) -> None:
    # Eager refuses an in-place op on a leaf that requires grad while grad mode is on; the fast
    # metadata rules (kiln._metadata) skip the meta kernels that would say so, so it is checked
    # here, with eager's message.
    if isinstance(target, torch.Tensor) and target.requires_grad and target.is_leaf and torch.is_grad_enabled():
        raise RuntimeError(
            "a leaf Variable that requires grad is being used in an in-place operation."
            f"\n(kiln: raised by {call.name} at {call.where()} while tracing)"
        )
    # Eager refuses to write through an expanded (internally overlapping) tensor (CASES.md H3);
    # meta tensors do not check it, so the tracer does, with eager's message.
    if isinstance(target, torch.Tensor) and torch._debug_has_internal_overlap(target) == 1:
        raise RuntimeError(f"{_OVERLAP_MESSAGE}\n(kiln: raised by {call.name} at {call.where()} while tracing)")


def _same_object(call: Call, result: Any) -> bool:
    # Eager returns the argument itself for no-op forms (x.to(x.dtype), x.contiguous() of a
    # contiguous x, x.flatten(0, 0)); the user's `y is x` must stay true, and no op is recorded.
    return isinstance(result, Proxy) and any(result is a for a in call.args)


# ---- elementwise -------------------------------------------------------------------------------

_UNARY = [
    "abs", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "sin", "cos",
    "tan", "tanh", "asin", "acos", "atan", "sinh", "cosh", "sigmoid", "relu", "erf", "reciprocal",
    "floor", "ceil", "trunc", "sign", "square", "logical_not", "bitwise_not",
]
_BINARY = [
    "add", "sub", "mul", "div", "pow", "remainder", "fmod", "maximum", "minimum", "atan2", "eq",
    "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and",
    "bitwise_or", "bitwise_xor",
]
_TERNARY = ["clamp", "lerp", "addcmul", "addcdiv"]
# Other torch names of the same ops.
_ALIASES = {
    "absolute": "abs", "negative": "neg", "arcsin": "asin", "arccos": "acos", "arctan": "atan",
    "fix": "trunc", "subtract": "sub", "multiply": "mul", "divide": "div",
    "true_divide": "div", "greater": "gt", "greater_equal": "ge", "less": "lt",
    "less_equal": "le", "not_equal": "ne", "clip": "clamp", "arctan2": "atan2",
}
_DUNDERS = {
    "__add__": "add", "__iadd__": "add_", "__sub__": "sub", "__isub__": "sub_",
    "__mul__": "mul", "__imul__": "mul_", "__truediv__": "div", "__itruediv__": "div_",
    "__div__": "div", "__idiv__": "div_", "__pow__": "pow", "__ipow__": "pow_",
    "__mod__": "remainder", "__imod__": "remainder_", "__eq__": "eq", "__ne__": "ne",
    "__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge", "__and__": "bitwise_and",
    "__iand__": "bitwise_and_", "__or__": "bitwise_or", "__ior__": "bitwise_or_",
    "__xor__": "bitwise_xor", "__ixor__": "bitwise_xor_", "__neg__": "neg", "__abs__": "abs",
    "__invert__": "bitwise_not",
}


def _elementwise(op: str) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        result = call.run_meta()
        if not isinstance(call.args[0] if call.args else call.kwargs.get("input"), Proxy) and op != "where":
            if op == "pow" and len(call.args) == 2 and isinstance(call.args[1], Proxy):
                # torch.pow(number, exponent) is eager's `number ** exponent` (torch/_tensor.py's
                # __rpow__ calls it): the number as a tensor of the result's dtype (_reflected)
                filled = _full_like_number(call, call.args[1], call.args[0], result.dtype)
                return call.emit("pow", [filled, call.args[1]], {}, result)
            raise call.unsupported(f"kiln's {op} needs a tensor as its first argument, not a number.")
        if op.endswith("_"):
            _check_write(call, call.args[0])
        return call.emit(op, call.args, call.kwargs, result)

    return rule


for _name in _UNARY + _BINARY + _TERNARY:
    _register_elementwise(_elementwise(_name), *_torch_fns(_name))
    _register_elementwise(_elementwise(_name + "_"), *_torch_fns(_name + "_"))
for _name, _op in _ALIASES.items():
    _register_elementwise(_elementwise(_op), *_torch_fns(_name))
    _register_elementwise(_elementwise(_op + "_"), getattr(torch.Tensor, _name + "_", None))
for _name, _op in _DUNDERS.items():
    _register_elementwise(_elementwise(_op), getattr(torch.Tensor, _name, None))
_register_elementwise(_elementwise("isnan"), *_torch_fns("isnan"))
_register_elementwise(_elementwise("sigmoid"), torch.special.expit)
_register_elementwise(_elementwise("gelu"), F.gelu)
_register_elementwise(_elementwise("where"), torch.where)
_register_elementwise(_elementwise("relu_"), F.relu_)


def _round(call: Call) -> Any:
    args = _bind(call, lambda self, *, decimals=0: None)
    if args["decimals"] != 0:
        raise call.unsupported("round with decimals is not supported by kiln.")
    inplace = call.name.endswith("_")
    result = call.run_meta()
    if inplace:
        _check_write(call, args["self"])
    return call.emit("round_" if inplace else "round", [args["self"]], {}, result)


_register_elementwise(_round, *_torch_fns("round", "round_"))


def _tensor_where(call: Call) -> Any:  # x.where(cond, y) is torch.where(cond, x, y)
    args = _bind(call, lambda self, condition, other: None)
    result = call.run_meta()
    return call.emit("where", [args["condition"], args["self"], args["other"]], {}, result)


_register_elementwise(_tensor_where, torch.Tensor.where)


def _activation(op: str) -> Callable[[Call], Any]:
    # F.relu(x, inplace=True) and F.silu(x, inplace=True) are the in-place ops.
    def rule(call: Call) -> Any:
        args = _bind(call, lambda input, inplace=False: None)
        result = call.run_meta()
        if args["inplace"]:
            _check_write(call, args["input"])
        return call.emit(op + "_" if args["inplace"] else op, [args["input"]], {}, result)

    return rule


_register_elementwise(_activation("relu"), F.relu)
_register_elementwise(_activation("silu"), F.silu)


def _clamp_bound(which: str) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        args = _bind(call, lambda self, bound: None)
        result = call.run_meta()
        inplace = call.name.endswith("_")
        if inplace:
            _check_write(call, args["self"])
        return call.emit("clamp_" if inplace else "clamp", [args["self"]], {which: args["bound"]}, result)

    return rule


_register_elementwise(_clamp_bound("min"), *_torch_fns("clamp_min", "clamp_min_"))
_register_elementwise(_clamp_bound("max"), *_torch_fns("clamp_max", "clamp_max_"))


def _floor_divide(call: Call) -> Any:
    # torch.floor_divide is div(rounding_mode="floor") (since PyTorch 1.13).
    args = _bind(call, lambda self, other: None)
    result = call.run_meta()
    inplace = result is args["self"]
    if inplace:
        _check_write(call, args["self"])
    return call.emit("div_" if inplace else "div", [args["self"], args["other"]], {"rounding_mode": "floor"}, result)


_register_elementwise(_floor_divide, *_torch_fns("floor_divide", "floor_divide_"), torch.Tensor.__floordiv__)


def _swapped(op: str) -> Callable[[Call], Any]:
    # `other (op) self` for a commutative op: the same as `self (op) other`, bit for bit.
    def rule(call: Call) -> Any:
        self, other = call.args[0], call.args[1]
        result = call.run_meta()
        return call.emit(op, [self, other], {}, result)

    return rule


for _name, _op in {"__radd__": "add", "__rmul__": "mul", "__rand__": "bitwise_and", "__ror__": "bitwise_or", "__rxor__": "bitwise_xor"}.items():
    _register_elementwise(_swapped(_op), getattr(torch.Tensor, _name, None))


def _full_like_number(call: Call, like: Proxy, value: Any, dtype: torch.dtype) -> Proxy:
    meta = call.run_meta(torch.full_like, (like, value), {"dtype": dtype})
    kwargs = {"dtype": dtype} if dtype != like.dtype else {}
    return call.emit("full_like", [like, value], kwargs, meta)


def _reflected(op: str, **op_kwargs: Any) -> Callable[[Call], Any]:
    """`number (op) self` for ops eager defines as op(other, self) (torch/_tensor.py: __rpow__,
    __rfloordiv__, __rmod__). kiln's op needs a tensor first: the number becomes a tensor of
    the result's dtype (for float16/bfloat16 a number that dtype cannot hold exactly is rounded
    first, where eager may compute with it in float32)."""

    def rule(call: Call) -> Any:
        self, other = call.args[0], call.args[1]
        result = call.run_meta()
        if isinstance(other, Proxy):
            return call.emit(op, [other, self], op_kwargs, result)
        filled = _full_like_number(call, self, other, result.dtype)
        return call.emit(op, [filled, self], op_kwargs, result)

    return rule


_register_elementwise(_reflected("pow"), torch.Tensor.__rpow__)
_register_elementwise(_reflected("div", rounding_mode="floor"), torch.Tensor.__rfloordiv__)
_register_elementwise(_reflected("remainder"), torch.Tensor.__rmod__)


def _rsub(call: Call) -> Any:
    # `number - x` is eager's rsub(x, number) = number - x: written as (-x) + number, which is
    # the same in every dtype (negation is exact and addition commutes).
    args = _bind(call, lambda self, other, alpha=1: None)
    self, other = args["self"], args["other"]
    result = call.run_meta()
    if args["alpha"] != 1:
        raise call.unsupported("rsub with alpha is not supported by kiln.")
    if isinstance(other, Proxy):
        return call.emit("sub", [other, self], {}, result)
    negated = call.emit("neg", [self], {}, call.run_meta(torch.neg, (self,), {}))
    return call.emit("add", [negated, other], {}, result)


_register_elementwise(_rsub, torch.Tensor.__rsub__, torch.rsub)


def _rdiv(call: Call) -> Any:
    # Eager's own definition (torch/_tensor.py): `other / self` is self.reciprocal() * other.
    self, other = call.args[0], call.args[1]
    result = call.run_meta()
    if isinstance(other, Proxy):
        return call.emit("div", [other, self], {}, result)
    recip = call.emit("reciprocal", [self], {}, call.run_meta(torch.reciprocal, (self,), {}))
    return call.emit("mul", [recip, other], {}, result)


_register_elementwise(_rdiv, getattr(torch.Tensor, "__rdiv__", None), torch.Tensor.__rtruediv__)


# ---- casts and copies --------------------------------------------------------------------------


_CHANNELS_LAST = {torch.channels_last: 4, torch.channels_last_3d: 5}  # memory format -> its rank


def _emit_clone(call: Call, self: Proxy, memory_format: Any = None) -> Proxy:
    """A copy of `self` (kiln has no clone op): a new tensor, then `copy_`. For eager's default
    (preserve_format: a dense input keeps its strides) the new tensor is `empty_like`, which kiln
    lays out the same way; for an explicit contiguous_format (reshape's and contiguous()'s copy)
    it is `zeros` of the shape, which is contiguous."""
    if memory_format is torch.contiguous_format and not self.is_contiguous():
        meta = call.run_meta(torch.empty, (list(self.shape),), {"dtype": self.dtype, "device": "meta"})
        empty = call.emit("zeros", [list(self.shape)], {"dtype": self.dtype, "device": self.device}, meta)
    elif memory_format in _CHANNELS_LAST and self.dim() == _CHANNELS_LAST[memory_format]:
        # Channels last: laid out as a contiguous tensor with the channels moved last, viewed
        # back (its strides are eager's; empty_like of it is a tensor of its own, not a view).
        order = [0, *range(2, self.dim()), 1]
        moved = [self.shape[d] for d in order]
        meta = call.run_meta(torch.empty, (moved,), {"dtype": self.dtype, "device": "meta"})
        layout = call.emit("zeros", [moved], {"dtype": self.dtype, "device": self.device}, meta)
        layout = _via(call, torch.Tensor.permute, layout, [order.index(d) for d in range(self.dim())])
        empty = call.emit("empty_like", [layout], {}, call.run_meta(torch.empty_like, (layout,), {}))
    else:
        kwargs = {} if memory_format is None else {"memory_format": memory_format}
        empty = call.emit("empty_like", [self], {}, call.run_meta(torch.empty_like, (self,), kwargs))
    return call.emit("copy_", [empty, self], {}, empty)


def _clone(call: Call) -> Any:
    args = _bind(call, lambda self, *, memory_format=None: None)
    call.run_meta()
    return _emit_clone(call, args["self"], args["memory_format"])


_register(_clone, *_torch_fns("clone"))


def _contiguous(call: Call) -> Any:
    args = _bind(call, lambda self, memory_format=torch.contiguous_format: None)
    result = call.run_meta()
    if _same_object(call, result):
        return result
    return _emit_clone(call, args["self"], args["memory_format"])


_register(_contiguous, torch.Tensor.contiguous)


def _cast(call: Call, self: Proxy, dtype: torch.dtype | None, copy: bool = False, memory_format: Any = None) -> Any:
    """self as dtype in memory_format (None: preserved), as `Tensor.to` gives it: self itself
    when nothing changes and no copy is asked for."""
    kwargs = {} if memory_format is None else {"memory_format": memory_format}
    if dtype is None or dtype == self.dtype:
        # Eager returns the tensor itself unless asked for a copy or a memory format that is not
        # the one its strides suggest (the meta run applies eager's rule).
        if not copy and call.run_meta(torch.Tensor.to, (self, self.dtype), kwargs) is self:
            return self
        return _emit_clone(call, self, memory_format)
    result = call.run_meta(torch.Tensor.to, (self, dtype), kwargs)
    cast = call.emit("to", [self, dtype], {}, call.run_meta(torch.Tensor.to, (self, dtype), {}))
    # kiln's `to` keeps self's strides (preserve_format); another format is a copy of the cast.
    return cast if cast.stride() == result.stride() else _emit_clone(call, cast, memory_format)


def _to(call: Call) -> Any:
    self = call.args[0]
    try:
        device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*call.args[1:], **{k: v for k, v in call.kwargs.items() if k != "copy"})
    except TypeError as e:
        raise call.unsupported(f"this form of .to() is not supported by kiln ({e}).") from None
    if device is not None and torch.device(device) != self.device:
        # The same device spelled differently ("cuda" for cuda:0) is no move.
        from ._tracer import device_str

        if device_str(torch.device(device)) != device_str(self.device):
            raise call.unsupported("moving a tensor to another device is not supported inside a kiln function.")
    return _cast(call, self, dtype, bool(call.kwargs.get("copy", False)), memory_format)


_register(_to, torch.Tensor.to)


def _fixed_cast(dtype: torch.dtype) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        args = _bind(call, lambda self, memory_format=None: None)
        return _cast(call, args["self"], dtype, memory_format=args["memory_format"])

    return rule


for _name, _dtype in {
    "float": torch.float32, "double": torch.float64, "half": torch.float16,
    "bfloat16": torch.bfloat16, "int": torch.int32, "long": torch.int64, "bool": torch.bool,
}.items():
    _register(_fixed_cast(_dtype), getattr(torch.Tensor, _name))


def _type_as(call: Call) -> Any:
    args = _bind(call, lambda self, other: None)
    return _cast(call, args["self"], args["other"].dtype)


_register(_type_as, torch.Tensor.type_as)


def _same_device(call: Call) -> Any:
    # x.cpu() / x.cuda() on a tensor already there return it itself; a move is not supported.
    self = call.args[0]
    wanted = "cuda" if call.name.endswith(".cuda") else "cpu"
    if self.device.type != wanted:
        raise call.unsupported("moving a tensor to another device is not supported inside a kiln function.")
    return self


_register(_same_device, torch.Tensor.cpu, torch.Tensor.cuda)


# ---- mutation ----------------------------------------------------------------------------------


def _write(op: str, check_overlap: bool) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        result = call.run_meta()
        if check_overlap:
            _check_write(call, call.args[0])
        args = list(call.args)
        kwargs = {k: v for k, v in call.kwargs.items() if not (k == "non_blocking" and not v)}
        if op == "copy_" and len(args) > 2 and args[2] is False:
            args = args[:2]  # copy_(src, non_blocking=False)
        return call.emit(op, args, kwargs, result)

    return rule


# Eager checks internal overlap for copy_ but not for fill_ and zero_ (they write every
# location with the same value).
_register(_write("fill_", False), torch.Tensor.fill_, torch.fill_)
_register(_write("zero_", False), torch.Tensor.zero_, torch.zero_)
_register(_write("copy_", True), torch.Tensor.copy_)
_register(_elementwise("fill"), torch.fill)


def _metadata(op: str) -> Callable[[Call], Any]:
    # t_, transpose_, unsqueeze_, squeeze_, as_strided_: the meta run changes the proxy's own
    # sizes and strides; the proxy keeps its identity and names the op's result.
    def rule(call: Call) -> Any:
        result = call.run_meta()
        args = list(call.args)
        return call.emit(op, args, call.kwargs, result)

    return rule


for _name in ("t_", "transpose_", "unsqueeze_", "squeeze_", "as_strided_"):
    _register(_metadata(_name), getattr(torch.Tensor, _name))
_register(_metadata("transpose_"), torch.Tensor.swapaxes_, torch.Tensor.swapdims_)


def _getitem(call: Call) -> Any:
    self, key = call.args
    try:
        index = IndexKey(key)
    except UnsupportedError as e:
        raise call.unsupported(str(e)) from None
    result = call.run_meta()
    return call.emit("getitem", [self, index], {}, result)


def _setitem(call: Call) -> Any:
    self, key, value = call.args
    try:
        index = IndexKey(key)
    except UnsupportedError as e:
        raise call.unsupported(str(e)) from None
    if not isinstance(value, (Proxy, bool, int, float)):
        raise call.unsupported("kiln assigns a tensor or a Python number, not a list or other value.")
    call.run_meta()
    # The region written must not overlap itself (eager's check, as for in-place ops).
    target = call.run_meta(torch.Tensor.__getitem__, (self, key), {})
    _check_write(call, target)
    call.emit("setitem_", [self, index, value], {}, None)
    return None


_register(_getitem, torch.Tensor.__getitem__)
_register(_setitem, torch.Tensor.__setitem__)


# ---- ops whose torch form is kiln's (views, matrix products) -----------------------------------


def _view_op(op: str, template: Callable, order: list[str]) -> Callable[[Call], Any]:
    """A view whose torch form matches kiln's parameters one to one."""

    def rule(call: Call) -> Any:
        args = _bind(call, template)
        result = call.run_meta()
        if _same_object(call, result):
            return result
        return call.emit(op, [args[n] for n in order], {}, result)

    return rule


# ---- reductions --------------------------------------------------------------------------------


def _dims(dim: Any) -> Any:
    return list(dim) if isinstance(dim, (tuple, list)) else dim


def _sum_like(op: str) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        args = _bind(call, lambda self, dim=None, keepdim=False, *, dtype=None: None)
        result = call.run_meta()
        kwargs = {"dtype": args["dtype"]} if args["dtype"] is not None else {}
        return call.emit(op, [args["self"], _dims(args["dim"]), args["keepdim"]], kwargs, result)

    return rule


_register(_sum_like("sum"), *_torch_fns("sum"))
_register(_sum_like("mean"), *_torch_fns("mean"))
FAST_RULES.update({f: mean_result for f in _torch_fns("mean") if f is not None})
_register(_sum_like("prod"), *_torch_fns("prod"))


def _amax_like(op: str) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        args = _bind(call, lambda self, dim=(), keepdim=False: None)
        result = call.run_meta()
        return call.emit(op, [args["self"], _dims(args["dim"]), args["keepdim"]], {}, result)

    return rule


_register(_amax_like("amax"), *_torch_fns("amax"))
_register(_amax_like("amin"), *_torch_fns("amin"))


def _argmax_like(op: str) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        args = _bind(call, lambda self, dim=None, keepdim=False: None)
        result = call.run_meta()
        return call.emit(op, [args["self"], args["dim"], args["keepdim"]], {}, result)

    return rule


_register(_argmax_like("argmax"), *_torch_fns("argmax"))
_register(_argmax_like("argmin"), *_torch_fns("argmin"))


def _max_like(which: str) -> Callable[[Call], Any]:
    """x.max() is amax over all dims; x.max(dim) is (amax, argmax) as torch.return_types.max
    (both give the first index of the extreme value); x.max(other) is maximum."""
    reduce_op, arg_op, binary_op = ("amax", "argmax", "maximum") if which == "max" else ("amin", "argmin", "minimum")

    def rule(call: Call) -> Any:
        result = call.run_meta()
        rest = list(call.args[1:]) + list(call.kwargs.values())
        self = call.args[0] if call.args else call.kwargs["input"]
        if not rest:
            return call.emit(reduce_op, [self], {}, result)
        if isinstance(call.args[1] if len(call.args) > 1 else call.kwargs.get("other"), Proxy):
            return call.emit(binary_op, [self, rest[0]], {}, result)
        args = _bind(call, lambda self, dim, keepdim=False: None)
        values = call.emit(reduce_op, [self, [args["dim"]], args["keepdim"]], {}, result[0])
        indices = call.emit(arg_op, [self, args["dim"], args["keepdim"]], {}, result[1])
        return type(result)((values, indices))

    return rule


_register(_max_like("max"), *_torch_fns("max"))
_register(_max_like("min"), *_torch_fns("min"))


def _var_like(op: str) -> Callable[[Call], Any]:
    # var(dim=None, *, correction=None, keepdim=False), var(dim, unbiased, keepdim) and
    # var(unbiased): kiln has the correction form.
    def rule(call: Call) -> Any:
        result = call.run_meta()
        pos = list(call.args[1:])
        kw = dict(call.kwargs)
        self = call.args[0] if call.args else kw.pop("input")
        dim, unbiased, keepdim, correction = None, None, False, None
        if pos and isinstance(pos[0], bool):
            unbiased = pos.pop(0)
        elif pos:
            dim = pos.pop(0)
            if pos:
                unbiased = pos.pop(0)
            if pos:
                keepdim = pos.pop(0)
        dim = kw.pop("dim", dim)
        unbiased = kw.pop("unbiased", unbiased)
        keepdim = kw.pop("keepdim", keepdim)
        correction = kw.pop("correction", correction)
        if kw:
            raise call.unsupported(f"the arguments {sorted(kw)} are not supported by kiln's {op}.")
        if correction is None:
            correction = 0 if unbiased is False else 1
        kwargs = {"correction": correction, "keepdim": keepdim}
        return call.emit(op, [self, _dims(dim)], kwargs, result)

    return rule


_register(_var_like("var"), *_torch_fns("var"))
_register(_var_like("std"), *_torch_fns("std"))


# ---- joins, matrix products, composites --------------------------------------------------------


def _join(op: str) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        args = _bind(call, lambda tensors, dim=0: None)
        result = call.run_meta()
        tensors = list(args["tensors"])
        if op == "cat":
            # ATen's legacy rule: a 1-d empty tensor (shape (0,)) is skipped whatever the other
            # tensors' ranks (a cache started as torch.tensor([]), then cat along dim -2); it
            # still takes part in the result's dtype.
            kept = [t for t in tensors if tuple(t.shape) != (0,)]
            if kept and len(kept) < len(tensors):
                tensors = [_cast(call, t, result.dtype) if isinstance(t, Proxy) else t for t in kept]
        return call.emit(op, [tensors, args["dim"]], {}, result)

    return rule


_register(_join("cat"), torch.cat, getattr(torch, "concat", None), getattr(torch, "concatenate", None))
_register(_join("stack"), torch.stack)


def _matmul(call: Call) -> Any:
    args = _bind(call, lambda self, other: None)
    result = call.run_meta()
    return call.emit("matmul", [args["self"], args["other"]], {}, result)


def _rmatmul(call: Call) -> Any:
    self, other = call.args[0], call.args[1]
    result = call.run_meta()
    return call.emit("matmul", [other, self], {}, result)


# mm is matmul restricted to 2-d operands (the meta run rejects others, as eager does).
_register(_matmul, *_torch_fns("matmul", "mm"), torch.Tensor.__matmul__)
_register(_rmatmul, torch.Tensor.__rmatmul__)
_register(_view_op("bmm", lambda self, mat2: None, ["self", "mat2"]), *_torch_fns("bmm"))
_register(_view_op("linear", lambda input, weight, bias=None: None, ["input", "weight", "bias"]), F.linear)


def _addmm(call: Call) -> Any:
    """addmm(bias, x, w) with a 1-d bias and beta = alpha = 1 (GPT-2's Conv1D) is linear(x, w.t(),
    bias): a matrix product kiln runs as a library step; other forms run as eager steps."""
    args = _bind(call, lambda input, mat1, mat2, *, beta=1, alpha=1: None)
    result = call.run_meta()
    bias, x, w = args["input"], args["mat1"], args["mat2"]
    tensors = (bias, x, w)
    if (
        args["beta"] != 1
        or args["alpha"] != 1
        or not all(isinstance(t, Proxy) for t in tensors)
        or bias.dim() != 1
        or len({t.dtype for t in tensors}) != 1
    ):
        from ._fallback import eager_fallback

        return eager_fallback(call)
    wt = _via(call, torch.Tensor.t, w)
    return call.emit("linear", [x, wt, bias], {}, result)


_register(_addmm, torch.addmm, torch.Tensor.addmm)


def _via(call: Call, fn: Any, *args: Any) -> Any:
    """fn(*args) through its rule, at the user's line (a rule written with other rules)."""
    return RULES[_key(fn)](Call(call.tracer, fn, args, {}, call.loc))


# ---- metadata and values -----------------------------------------------------------------------

PASSTHROUGH: set[Any] = set()
for _f in (
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.ndimension, torch.Tensor.numel,
    torch.Tensor.nelement, torch.Tensor.stride, torch.Tensor.is_contiguous,
    torch.Tensor.storage_offset, torch.Tensor.element_size, torch.Tensor.is_floating_point,
    torch.Tensor.is_complex, torch.Tensor.is_signed, torch.Tensor.__len__, torch.Tensor.__hash__,
    torch.Tensor.is_inference, torch.numel, torch.is_floating_point, torch.is_complex,
    torch.result_type, torch.Tensor.__format__, torch.Tensor.__repr__,
):
    PASSTHROUGH.add(_key(_f))
for _p in (
    "shape", "dtype", "ndim", "requires_grad", "is_leaf", "grad_fn", "layout", "is_sparse",
    "is_quantized", "is_nested", "is_mkldnn", "itemsize", "nbytes", "grad", "names",
):
    PASSTHROUGH.add(("property", _p))

NEEDS_VALUE: dict[Any, str] = {}
for _f, _what in (
    (torch.Tensor.__bool__, "bool() of a tensor, as in `if tensor:` or `while tensor:`"),
    (torch.Tensor.__float__, "float() of a tensor"),
    (torch.Tensor.__int__, "int() of a tensor"),
    (torch.Tensor.__index__, "a tensor used as a Python int"),
    (torch.Tensor.__complex__, "complex() of a tensor"),
    (torch.Tensor.item, "tensor.item()"),
    (torch.Tensor.tolist, "tensor.tolist()"),
    (torch.Tensor.numpy, "tensor.numpy()"),
    (torch.Tensor.__array__, "converting a tensor to a NumPy array"),
    (torch.Tensor.__contains__, "`in` on a tensor"),
    (torch.Tensor.data_ptr, "tensor.data_ptr()"),
    (torch.equal, "torch.equal"),
    (torch.allclose, "torch.allclose"),
    (torch.is_nonzero, "torch.is_nonzero"),
):
    NEEDS_VALUE[_key(_f)] = _what
