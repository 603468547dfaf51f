"""Foreach ops (torch._foreach_add_, torch._foreach_mul, ...) as the per-tensor ops they apply.

`torch._foreach_mul_(ps, 0.9)` is `p.mul_(0.9)` for each p of ps, in order: eager's CPU kernels
run exactly that loop, and its CUDA kernels the same computation in one launch where the tensors
allow. kiln records the per-tensor ops, so each parameter's chain of foreach ops fuses into one
region, and those regions, the same computation over tensors of different sizes, run as one
multi-tensor kernel (passes/group_multi_tensor.h):

    torch._foreach_mul_(bufs, 0.9)              kilnFusion0(bufs_0, grads_0, params_0) ...
    torch._foreach_add_(bufs, grads)      ->    one group of len(params) regions, one kernel
    torch._foreach_add_(params, bufs, alpha=-lr)

Results are eager's: the in-place forms return their first argument (the list itself), the others
a tuple. Each argument that is a list or tuple gives its i-th element to the i-th op (a list of tensors
or of numbers); any other argument (a number, one tensor) goes to every op. Every per-tensor op
goes through the tracing mode like any call of the user's (an op kiln has no lowering for runs
eagerly, as elsewhere). A foreach function without a per-tensor op of the same name and form
(_foreach_norm, _foreach_max, _foreach_powsum, the in-place maximum and minimum) has no rule
here: kiln.jit runs it eagerly.
"""

from __future__ import annotations

from typing import Any

import torch

from ._lowering import RULES, _key
from ._tracer import Call


# Foreach forms whose trailing positional parameters are keyword-only in the per-tensor op:
# _foreach_addcmul_(self, tensor1, tensor2, scalars) is self[i].addcmul_(t1[i], t2[i], value=...).
_KEYWORD_TAIL = {"addcmul": (3, "value"), "addcdiv": (3, "value")}


def _lists(call: Call) -> list[Any]:
    return [a for a in (*call.args, *call.kwargs.values()) if isinstance(a, (list, tuple))]


def _foreach_rule(name: str, per_tensor: Any, in_place: bool):
    def rule(call: Call) -> Any:
        from ._tracer import _TracingMode

        lists = _lists(call)
        lengths = sorted({len(v) for v in lists})
        if len(lengths) > 1:
            # eager's own error (and type), with where kiln met it
            raise RuntimeError(
                f"Tensor lists must have the same number of tensors, got {lengths[-1]} and {lengths[0]}"
                f"\n(kiln: raised by {call.name} at {call.where()} while tracing)"
            )
        count = lengths[0] if lengths else 0
        mode = _TracingMode(call.tracer)

        def nth(v: Any, i: int) -> Any:
            return v[i] if isinstance(v, (list, tuple)) else v

        positional, keyword = call.args, dict(call.kwargs)
        tail = _KEYWORD_TAIL.get(name.rstrip("_"))
        if tail is not None and len(positional) > tail[0]:
            positional, keyword[tail[1]] = positional[: tail[0]], positional[tail[0]]
        results = []
        for i in range(count):
            args = tuple(nth(a, i) for a in positional)
            kwargs = {k: nth(v, i) for k, v in keyword.items()}
            results.append(mode.__torch_function__(per_tensor, (), args, kwargs))
        # as eager: an in-place form returns its first argument, the list itself; the other
        # forms a tuple of new tensors
        return call.args[0] if in_place else tuple(results)

    rule.__name__ = f"foreach_{name}"
    return rule


def _register_all() -> None:
    for full in dir(torch):
        if not full.startswith("_foreach_"):
            continue
        op = full[len("_foreach_"):]
        in_place = op.endswith("_")
        base = op.rstrip("_")
        per_tensor = getattr(torch.Tensor, base + "_", None) if in_place else getattr(torch, base, None)
        if per_tensor is None or base in ("norm", "max", "powsum"):
            continue
        RULES[_key(getattr(torch, full))] = _foreach_rule(op, per_tensor, in_place)


_register_all()
