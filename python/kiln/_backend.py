"""kiln as a torch.compile backend: `torch.compile(model, backend="kiln")` or `backend=kiln.backend`.

Dynamo captures the tensor code of any Python program as FX graphs, with graph breaks where it
cannot (data-dependent control flow, unsupported Python), and guards that re-capture when the
program would take another path. Each graph it hands to `backend` is compiled as `kiln.jit`
compiles a module: the GraphModule's generated `forward` goes through kiln's own tracer and
pipeline (functionalization, fusion, writebacks, eager steps, errors), specialized per call on
its arguments' metadata like any kiln.jit function.

    graph 0:  linear -> num_batches_tracked.add_(1) -> batch_norm -> relu -> sum > 0
                          (graph break: `if h.sum() > 0`)
    graph 1:  h * 2 -> linear -> softmax

Dynamo lifts parameters and buffers to graph inputs (its `inline_inbuilt_nn_modules`), so they
are arguments of the kiln program, read on every call and written back where mutated (a
BatchNorm's running statistics); a constant the graph reads as an attribute is an implicit
input (kiln._state), never a value baked into a kernel.

A graph called with grad enabled and an argument that requires grad (a training step's
forward: Dynamo hands the backend the forward graph and leaves autograd to it) is differentiated
by kiln.jit like any call (kiln._autograd: one autograd node whose backward is a kiln program).
A graph kiln cannot compile (kiln.UnsupportedError or TraceError while tracing: a
value-dependent shape, say) runs as its GraphModule, eager PyTorch; it says so once with a
warning naming the reason. Every graph the backend
compiled is listed by `kiln.backend_graphs()`, for `kiln.last_traces`/`kiln.last_stats`.

Registered for `backend="kiln"` through the `torch_dynamo_backends` entry point (pyproject.toml).
"""

from __future__ import annotations

import collections
import functools
import warnings
from typing import Any, Callable

import torch

from ._errors import TraceError, UnsupportedError

# The graphs the backend compiled in this process, oldest first (the last 256: a graph module
# and its programs stay alive while listed here).
_GRAPHS: collections.deque[CompiledGraph] = collections.deque(maxlen=256)


class CompiledGraph:
    """One FX graph as the backend runs it: through kiln.jit, or eagerly where it must."""

    def __init__(self, gm: torch.fx.GraphModule, index: int) -> None:
        from ._jit import JitFunction

        self.graph_module = gm
        self.index = index
        # A plain function of the graph's inputs, not gm's bound forward: Dynamo lifts
        # parameters and buffers to inputs and guards the module state itself, so no per-call
        # module guards are needed; a constant the graph reads (a get_attr) is found while
        # tracing and read on every call as an implicit input (kiln._state).
        forward = gm.forward

        @functools.wraps(forward)  # (its signature: one parameter per graph input)
        def graph(*args: Any) -> Any:
            return forward(*args)

        self.jitted = JitFunction(graph, True)
        self._kiln_forward = self.jitted  # for kiln.last_traces / last_stats
        self.eager_reason: str | None = None  # set once the graph runs eagerly for good

    def __call__(self, *args: Any) -> Any:
        if self.eager_reason is not None:
            return self.graph_module(*args)
        try:
            return self.jitted(*args)
        except (UnsupportedError, TraceError) as e:
            # Raised while tracing, before anything ran: the graph runs eagerly from now on.
            self.eager_reason = str(e)
            warnings.warn(f"kiln backend: graph {self.index} runs in eager PyTorch: {e}", stacklevel=2)
            return self.graph_module(*args)


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A torch.compile backend (Dynamo's `(GraphModule, example_inputs) -> callable`)."""
    graph = CompiledGraph(gm, len(_GRAPHS))
    _GRAPHS.append(graph)
    return graph


def backend_graphs() -> list[CompiledGraph]:
    """The graphs `backend` compiled in this process, oldest first: each works with
    kiln.last_traces and kiln.last_stats, and has `graph_module` (Dynamo's FX graph) and
    `eager_reason` (why it runs eagerly, or None)."""
    return list(_GRAPHS)


def clear_backend_graphs() -> None:
    """Forgets the listed graphs (torch._dynamo.reset() forgets Dynamo's side)."""
    _GRAPHS.clear()
