"""The autograd graphs of eager steps that a differentiated forward keeps for its backward.

An eager step (an op PyTorch runs inside a kiln program: attention, a cumulative sum) is
differentiated by its vjp (_fallback._gradient_of), which runs the op again with grad on and
takes torch.autograd.grad: the op's forward twice a training step. While kiln's autograd node
runs its forward program (kiln._autograd.CompiledFunction), each eager step with a gradient runs
with grad on instead and keeps its graph here, and the step's vjp in that node's backward
differentiates the kept graph.

A kept graph is used only where it is the computation kiln's backward describes. Its saved
tensors are the step's inputs, its outputs and tensors of its own (an eager step never returns a
view of an argument). Its outputs are PyTorch's memory, which only kiln holds, so a graph whose
outputs a result the caller gets is over is dropped when the forward returns (the caller may
write into a result before the backward). Its inputs are views kiln made over its own memory,
which they do not keep alive: the vjp uses the graph only when every tensor it receives is at
the address, and has the layout, the step read in the forward. kiln hands the backward correct
values, so the graph's saved inputs, which read that very memory, are correct too (even where
the forward's buffer was freed and the backward's value took its place). Anything else runs the
op again, as before.
The graphs live with the node's saved tensors (KeptGraphs.holder is saved with them), so a
backward without retain_graph frees them as it frees the node's, and one with it keeps them.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch

_state = threading.local()


def _layout(t: Any) -> tuple | None:
    return (t.data_ptr(), tuple(t.shape), t.stride()) if isinstance(t, torch.Tensor) else None


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes t's elements lie in (an empty tensor has none). A tensor kiln hands PyTorch is
    made over its address (its storage starts at its first element), so memory is compared by
    address ranges, not by storages."""
    if t.numel() == 0:
        return (0, 0)
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return (t.data_ptr(), t.data_ptr() + extent * t.element_size())


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return (s.data_ptr(), s.data_ptr() + s.nbytes())


class KeptGraph:
    """One eager step's results (with their grad_fn), the inputs it differentiates, and the
    layout of every input it read."""

    __slots__ = ("outs", "xs", "layouts")

    def __init__(self, outs: list, xs: list, inputs: list) -> None:
        self.outs, self.xs = outs, xs
        self.layouts = [_layout(t) for t in inputs]


class KeptGraphs:
    """The graphs one call of a differentiated forward kept, by eager step."""

    def __init__(self) -> None:
        self.graphs: dict[object, KeptGraph] = {}

    def keep(self, step: object, outs: list, xs: list, inputs: list) -> None:
        self.graphs[step] = KeptGraph(outs, xs, inputs)

    def settle(self, returned: list) -> None:
        """Drops the graphs whose outputs are the memory of a result the caller gets (`returned`):
        the caller may write into it before the backward."""
        spans = [_span(t) for t in returned if isinstance(t, torch.Tensor) and t.numel()]

        def returned_over(t: torch.Tensor) -> bool:
            lo, hi = _storage_span(t)
            return any(a < hi and lo < b for a, b in spans)

        for step, g in list(self.graphs.items()):
            if any(returned_over(t) for t in g.outs if isinstance(t, torch.Tensor) and t.numel()):
                del self.graphs[step]

    def holder(self) -> torch.Tensor:
        """An empty tensor that carries these graphs, to be saved with the node's tensors."""
        h = torch.empty(0)
        h._kiln_kept_graphs = self  # type: ignore[attr-defined]
        return h


@contextlib.contextmanager
def forward_of_node() -> Iterator[KeptGraphs]:
    """While kiln's node runs its forward program: the eager steps keep their graphs here."""
    kept, outer = KeptGraphs(), getattr(_state, "forward", None)
    _state.forward = kept
    try:
        yield kept
    finally:
        _state.forward = outer


@contextlib.contextmanager
def backward_of_node(holder: torch.Tensor | None) -> Iterator[None]:
    """While kiln's node runs its backward program: the vjps find the forward's graphs here."""
    outer = getattr(_state, "backward", None)
    _state.backward = getattr(holder, "_kiln_kept_graphs", None) if holder is not None else None
    try:
        yield
    finally:
        _state.backward = outer


def recording() -> KeptGraphs | None:
    """Where an eager step keeps its graph now, or None (no node's forward runs, or a CUDA graph
    is being captured: its replays run no Python, so a kept graph would not be theirs)."""
    kept = getattr(_state, "forward", None)
    if kept is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return None
    return kept


def kept_for(step: object, inputs: list) -> KeptGraph | None:
    """The graph the forward kept for `step`, when the vjp's inputs are the memory it read."""
    kept = getattr(_state, "backward", None)
    g = kept.graphs.get(step) if kept is not None else None
    if g is None or len(g.layouts) != len(inputs):
        return None
    return g if all(_layout(t) == layout for t, layout in zip(inputs, g.layouts)) else None
