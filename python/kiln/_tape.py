"""The autograd graphs of a differentiated forward's eager steps, kept for its backward.

An op kiln runs as an eager step (cross entropy, attention, a library call) gets its gradient
from PyTorch (kiln._fallback, eager_call's vjp). Without a record, the vjp would run the op's
forward again with grad on in the backward (the H200 profile of a GPT-2 step: the softmax
forward twice, 1.5 ms, the attention forward 24 calls instead of 12). While a differentiated
forward program runs (kiln._autograd.CompiledFunction.forward), its eager steps run with grad on
instead and record their inputs and outputs here, one tape per call; its backward reads the
tape, so each vjp is torch.autograd.grad over the graph the forward built, as eager's backward
is. The tape lives as long as the call's autograd node.

A graph is kept only when what it saves beyond the step's own inputs and outputs is no larger
than its outputs (worth_keeping): attention's graph saves its log-sum-exp, and is kept; cross
entropy's saves the log-softmax of the logits, twice the bf16 logits' bytes in float32 for GPT-2
(1.6 GB), and its vjp runs the op again instead, as it did before the tape.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import torch

# The tape of the differentiated call whose forward or backward program is running, if any:
# site (an eager step of a traced program) -> (its inputs as the graph saw them, its outputs).
_current: contextvars.ContextVar[dict | None] = contextvars.ContextVar("kiln_tape", default=None)


@contextlib.contextmanager
def active(tape: dict | None) -> Iterator[None]:
    token = _current.set(tape)
    try:
        yield
    finally:
        _current.reset(token)


def current() -> dict | None:
    return _current.get()


def record(site: Any, inputs: list, outputs: list) -> None:
    tape = _current.get()
    if tape is not None:
        tape[site] = (inputs, outputs)


def worth_keeping(inputs: list, outputs: list) -> bool:
    """Whether the graph the step's op built over `inputs` saves at most as many bytes beyond
    its inputs and outputs as its outputs hold (read from the nodes' saved tensors, each
    storage once)."""
    tensors = [t for t in (*inputs, *outputs) if isinstance(t, torch.Tensor)]
    known = {t.untyped_storage().data_ptr() for t in tensors}
    output_bytes = sum(t.untyped_storage().nbytes() for t in outputs if isinstance(t, torch.Tensor))
    extra, seen_nodes, seen_storages = 0, set(), set()
    stack = [t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen_nodes:
            continue
        seen_nodes.add(node)
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            try:
                value = getattr(node, name)
            except RuntimeError:  # freed, or not a tensor PyTorch hands out
                continue
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    ptr = t.untyped_storage().data_ptr()
                    if ptr not in known and ptr not in seen_storages:
                        seen_storages.add(ptr)
                        extra += t.untyped_storage().nbytes()
        stack.extend(f for f, _ in node.next_functions)
    return extra <= output_bytes
