"""The creation rules: factories (torch.zeros, torch.full, torch.arange, torch.tensor of numbers),
their _like and new_ forms. A factory's result depends only on its arguments, so each becomes a
kiln creation op with the dtype, device and layout eager would give it (see _lowering.py for
what a rule is).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ._lowering import _bind, _register, _sizes
from ._tracer import Call, Proxy


def _creation_device(call: Call, device: Any) -> torch.device:
    if device is None:
        device = torch.get_default_device()
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise call.unsupported(f"kiln makes tensors on cpu or cuda, not on {device.type}.")
    return device


def _check_factory_kwargs(call: Call, args: dict) -> None:
    if args.get("requires_grad"):
        raise call.unsupported("making tensors that require grad is not supported by kiln.")
    if args.get("layout") not in (None, torch.strided):
        raise call.unsupported("kiln makes only strided tensors.")


def _run_factory(call: Call, func: Any, pos: list, kw: dict) -> torch.Tensor:
    """Runs a factory on the meta device (the real device is recorded separately)."""
    kw = {k: v for k, v in kw.items() if k not in ("device", "pin_memory", "requires_grad", "names")}
    return call.run_meta(func, pos, {**kw, "device": "meta"})


def _factory(op: str) -> Callable[[Call], Any]:
    # torch.zeros(2, 3) and torch.zeros((2, 3)); torch.empty is zeros (its values are
    # unspecified in eager, so zeros is one valid choice).
    def rule(call: Call) -> Any:
        kw = dict(call.kwargs)
        size = _sizes(call.args) if call.args else list(kw.pop("size"))
        _check_factory_kwargs(call, kw)
        if kw.get("memory_format") not in (None, torch.contiguous_format):
            raise call.unsupported("kiln makes contiguous tensors only.")
        device = _creation_device(call, kw.get("device"))
        meta = _run_factory(call, getattr(torch, op), [size], {"dtype": kw.get("dtype")})
        return call.emit(op, [size], {"dtype": meta.dtype, "device": device}, meta, device=device)

    return rule


_register(_factory("zeros"), torch.zeros)
_register(_factory("ones"), torch.ones)
_register(lambda call: _factory("zeros")(call), torch.empty)


def _full(call: Call) -> Any:
    args = _bind(call, lambda size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False: None)
    _check_factory_kwargs(call, args)
    device = _creation_device(call, args["device"])
    meta = _run_factory(call, torch.full, [list(args["size"]), args["fill_value"]], {"dtype": args["dtype"]})
    return call.emit("full", [list(args["size"]), args["fill_value"]], {"dtype": meta.dtype, "device": device}, meta, device=device)


_register(_full, torch.full)


def _scalar_tensor(call: Call) -> Any:
    # torch.tensor(2.5) and torch.scalar_tensor(2.5): a 0-d tensor of one number.
    value = call.args[0] if call.args else call.kwargs.get("data", call.kwargs.get("s"))
    if isinstance(value, (list, tuple)) and call.func is torch.tensor:
        kw = {k: v for k, v in call.kwargs.items() if k != "data"}
        _check_factory_kwargs(call, kw)
        meta = _run_factory(call, torch.tensor, [value], {"dtype": kw.get("dtype")})
        if meta.numel() == 0:  # (torch.tensor([]), a cache's start): no contents, a creation op
            device = _creation_device(call, kw.get("device"))
            return call.emit("full", [list(meta.shape), 0], {"dtype": meta.dtype, "device": device}, meta, device=device)
    if isinstance(value, (list, tuple)) and call.func is torch.tensor and call.tracer.register_eager is not None:
        # Nested and empty lists: PyTorch makes the tensor on its device on every call (an
        # eager step without tensor arguments), so its contents are never a baked-in buffer.
        from ._fallback import eager_fallback

        if call.kwargs.get("device") is None:
            # The device it is made on when the program runs is the one it was traced for.
            call.kwargs["device"] = _creation_device(call, None)
        return eager_fallback(call)
    if isinstance(value, Proxy) or not isinstance(value, (bool, int, float)):
        raise call.unsupported(
            "kiln.trace makes tensors from a single Python number only (torch.tensor(2.5)); "
            "kiln.jit also from lists."
        )
    kw = {k: v for k, v in call.kwargs.items() if k not in ("data", "s")}
    _check_factory_kwargs(call, kw)
    device = _creation_device(call, kw.get("device"))
    meta = _run_factory(call, call.func, [value], {"dtype": kw.get("dtype")})
    return call.emit("full", [[], value], {"dtype": meta.dtype, "device": device}, meta, device=device)


_register(_scalar_tensor, torch.tensor, torch.scalar_tensor)


def _arange(call: Call) -> Any:
    kw = dict(call.kwargs)
    pos = list(call.args)
    for name in ("start", "end", "step"):
        if name in kw:
            pos.append(kw.pop(name))
    if len(pos) == 1:
        pos = [0] + pos
    if any(isinstance(p, Proxy) for p in pos):
        raise call.unsupported("arange needs Python numbers, not tensors.")
    _check_factory_kwargs(call, kw)
    device = _creation_device(call, kw.get("device"))
    meta = _run_factory(call, torch.arange, pos, {"dtype": kw.get("dtype")})
    return call.emit("arange", pos, {"dtype": meta.dtype, "device": device}, meta, device=device)


_register(_arange, torch.arange)


def _like(op: str, with_value: bool = False) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        if with_value:
            args = _bind(call, lambda self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False, memory_format=None: None)
        else:
            args = _bind(call, lambda self, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False, memory_format=None: None)
        _check_factory_kwargs(call, args)
        self = args["self"]
        if args["device"] is not None:
            from ._tracer import device_str

            if device_str(torch.device(args["device"])) != device_str(self.device):
                raise call.unsupported("making a tensor on another device is not supported inside a kiln function.")
        meta_kw = {"dtype": args["dtype"], "memory_format": args["memory_format"] or torch.preserve_format}
        pos = [self, args["fill_value"]] if with_value else [self]
        meta = call.run_meta(getattr(torch, op), pos, meta_kw)
        kwargs = {"dtype": meta.dtype} if meta.dtype != self.dtype else {}
        return call.emit(op, pos, kwargs, meta)

    return rule


_register(_like("zeros_like"), torch.zeros_like)
_register(_like("ones_like"), torch.ones_like)
_register(_like("empty_like"), torch.empty_like)
_register(_like("full_like", with_value=True), torch.full_like)


def _new(op: str) -> Callable[[Call], Any]:
    # x.new_zeros(size): a new tensor with x's dtype and device unless told otherwise.
    def rule(call: Call) -> Any:
        self = call.args[0]
        kw = dict(call.kwargs)
        rest = list(call.args[1:])
        fill = None
        if op == "full":
            fill = rest.pop() if len(rest) > 1 else kw.pop("fill_value")
        size = _sizes(tuple(rest)) if rest else list(kw.pop("size"))
        _check_factory_kwargs(call, kw)
        device = self.device if kw.get("device") is None else _creation_device(call, kw["device"])
        dtype = kw.get("dtype") or self.dtype
        pos = [size] if fill is None else [size, fill]
        meta = _run_factory(call, getattr(torch, op), pos, {"dtype": dtype})
        return call.emit(op, pos, {"dtype": meta.dtype, "device": device}, meta, device=device)

    return rule


_register(_new("zeros"), torch.Tensor.new_zeros, torch.Tensor.new_empty)
_register(_new("ones"), torch.Tensor.new_ones)
_register(_new("full"), torch.Tensor.new_full)
