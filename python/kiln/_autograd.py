"""kiln's autograd (DESIGN.md 8): a kiln.jit call in grad mode with a tensor that requires grad
runs a forward program that kiln differentiated (src/kiln/passes/differentiate.h) inside one
torch.autograd.Function, whose backward runs the backward program, compiled by kiln like any
program. PyTorch's engine sees an ordinary op: `.grad` accumulation, hooks, retain_graph, the
version checks of saved tensors and optimizers work as they do for eager ops.

A call kiln cannot differentiate (an op without a derivative rule, torch.no_grad() inside the
function, a result that is a view and needs a gradient, ...) runs eagerly, with a warning that
says why: slow, never wrong.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable

import torch

from . import _kept_graphs
from ._errors import UnsupportedError
from ._tracer import layout_type_str

_MISS = object()
_TUPLE = 1  # module.cpp's OutputForm::kTuple


class GradientPlan:
    """What kiln compiled for one specialization key of a differentiated call: how the forward
    program's results split into the function's own and the saved values, and the backward
    program (compiled per layout of its inputs, in its own cache)."""

    def __init__(self, finish: Callable[[list], Any], tensor_positions: list[int], refused: str = "") -> None:
        self.finish = finish  # the function's own results -> its return value
        self.tensor_positions = tensor_positions  # the leaf position of each tensor leaf
        self.refused = refused

    def set_gradient(self, gradient: dict | None) -> None:
        """Takes what compile made (kiln._C.Program.gradient)."""
        from . import _C

        if not self.refused:
            self.refused = gradient["refused"] if gradient else "kiln did not differentiate it"
        if self.refused:
            return
        self.own = gradient["own_results"]
        # The function's results that are the caller's tensors or views of them pass around
        # the autograd node, so that they are the caller's objects as in eager.
        caller = set(gradient["caller_results"])
        self.through_node = [i for i in range(self.own) if i not in caller]
        self.around_node = [i for i in range(self.own) if i in caller]
        self.differentiable = gradient["differentiable_results"]
        differentiable = set(self.differentiable)
        # Per call, without rebuilding them: the node's outputs that carry no gradient, and
        # where among the node's outputs each differentiable result is.
        self.non_differentiable = [i for i in self.through_node if i not in differentiable]
        position = {result: k for k, result in enumerate(self.through_node)}
        self.gradient_positions = [position[i] for i in self.differentiable]
        self.saved = gradient["saved_results"]
        self.grad_inputs = gradient["grad_inputs"]  # tensor-leaf index per backward output
        self.backward_text = gradient["backward"]
        self.backward_inputs = gradient["backward_inputs"]
        self.backward_cache = _C.JitCache()

    def backward_program_text(self, inputs: list[torch.Tensor]) -> str:
        """The backward trace with its inputs declared as this call's tensors are laid out."""
        text = self.backward_text
        for name, t in zip(self.backward_inputs, inputs):
            text = re.sub(
                rf'^(\s*# {re.escape(name)}: )"[^"]*"$',
                lambda m: f'{m.group(1)}"{layout_type_str(t, t.device)}"',
                text,
                count=1,
                flags=re.M,
            )
        return text


class CompiledFunction(torch.autograd.Function):
    """One kiln program as one autograd node: forward runs the differentiated forward program,
    backward the backward program."""

    @staticmethod
    def forward(ctx, plan: GradientPlan, cache: Any, around: list, program: Any, *leaves: Any) -> Any:  # type: ignore[override]
        with _kept_graphs.forward_of_node() as kept:  # the eager steps' graphs (_kept_graphs.py)
            results = cache.run_program(program, list(leaves))  # found for these leaves a moment ago
        around.extend(results[i] for i in plan.around_node)
        saved = [results[i] for i in plan.saved]
        ctx.plan = plan
        ctx.n_leaves = len(leaves)
        if kept.graphs:
            kept.settle([results[i] for i in range(plan.own)])
        ctx.kept_graphs = bool(kept.graphs)
        ctx.save_for_backward(*saved, *([kept.holder()] if kept.graphs else []))
        ctx.mark_non_differentiable(*[results[i] for i in plan.non_differentiable if isinstance(results[i], torch.Tensor)])
        return tuple(results[i] for i in plan.through_node)

    @staticmethod
    def backward(ctx, *grads: Any) -> Any:  # type: ignore[override]
        if torch.is_grad_enabled():
            raise UnsupportedError(
                "kiln.jit does not compute higher-order gradients (backward with create_graph=True "
                "through a kiln program); call the function outside kiln.jit for them."
            )
        plan: GradientPlan = ctx.plan
        saved = list(ctx.saved_tensors)
        holder = saved.pop() if ctx.kept_graphs else None
        inputs = [grads[k] for k in plan.gradient_positions] + saved
        with _kept_graphs.backward_of_node(holder):
            computed = run_backward(plan, inputs) if plan.grad_inputs else ()
        out: list[Any] = [None] * (4 + ctx.n_leaves)
        for tensor_index, g in zip(plan.grad_inputs, computed):
            out[4 + plan.tensor_positions[tensor_index]] = g
        return tuple(out)


def run_differentiated(plan: GradientPlan, cache: Any, program: Any, leaves: list) -> list:
    """The function's own results of one call (`program`, the forward program the cache found
    for the leaves): kiln's node's outputs, and the caller's tensors the program returns, in the
    order the program returns them."""
    around: list = []
    through = CompiledFunction.apply(plan, cache, around, program, *leaves)
    own: list = [None] * plan.own
    for i, r in zip(plan.through_node, through):
        own[i] = r
    for i, r in zip(plan.around_node, around):
        own[i] = r
    return own


def run_backward(plan: GradientPlan, inputs: list[torch.Tensor]) -> Any:
    cache = plan.backward_cache
    out = cache.run(len(inputs), inputs, _MISS)
    if out is _MISS:
        out = cache.insert_and_run(len(inputs), inputs, plan.backward_program_text(inputs), 0.0, _TUPLE, None, 0)
    return out


def warn_eager(fn: Callable, why: str) -> None:
    warnings.warn(
        f"kiln.jit runs {getattr(fn, '__qualname__', fn)} eagerly for this call, which needs "
        f"gradients: {why}.",
        stacklevel=4,
    )
