"""Gradients against eager PyTorch, for the autograd tests (test_autograd.py, test_autograd_training.py,
test_losses.py): whether a result comes from kiln's node, and check_gradients, which compares a
kiln.jit function's outputs, gradients and accumulated .grad with eager's."""

from __future__ import annotations

import warnings

import torch
import torch.utils._pytree as pytree

import kiln


def tensors_of(tree) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def is_kiln_node(out) -> bool:
    nodes = {type(t.grad_fn).__name__ for t in tensors_of(out) if t.grad_fn is not None}
    return nodes == {"CompiledFunctionBackward"}


def check_gradients(fn, make_args, *, differentiated: bool = True, rtol=1e-5, atol=1e-6, seed=0):
    """Calls fn eagerly and through kiln.jit on equal fresh arguments (make_args gives leaves;
    those of a float dtype require grad unless make_args set otherwise), compares outputs and the
    gradients of one random weighting of all float outputs with respect to every input that
    requires grad (None where eager's is None), then accumulates a second backward into .grad."""
    jitted = kiln.jit(fn)
    args, eager_args = make_args(), make_args()
    with warnings.catch_warnings():
        warnings.simplefilter("error" if differentiated else "always")
        got = jitted(*args)
    if differentiated is None:  # either (the test only compares with eager)
        differentiated = False
    want = fn(*eager_args)
    got_t, want_t = tensors_of(got), tensors_of(want)
    assert len(got_t) == len(want_t)
    if differentiated:
        assert is_kiln_node(got), "kiln did not differentiate the program"
    gen = torch.Generator(device=want_t[0].device if want_t else "cpu").manual_seed(seed)
    weights = [torch.randn(w.shape, generator=gen, device=w.device, dtype=w.dtype) if w.requires_grad else None for w in want_t]
    for i, (g, w) in enumerate(zip(got_t, want_t)):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"output {i}: {m}")
        assert g.requires_grad == w.requires_grad, f"output {i}: requires_grad"
    inputs = [t for t in tensors_of(args) if t.requires_grad]
    eager_inputs = [t for t in tensors_of(eager_args) if t.requires_grad]
    pairs = [(g, w, k) for g, w, k in zip(got_t, want_t, weights) if k is not None]
    if not pairs:
        return jitted
    loss = sum((g * k).sum() for g, _, k in pairs)
    eager_loss = sum((w * k).sum() for _, w, k in pairs)
    grads = torch.autograd.grad(loss, inputs, allow_unused=True, retain_graph=True)
    eager_grads = torch.autograd.grad(eager_loss, eager_inputs, allow_unused=True, retain_graph=True)
    for i, (g, w) in enumerate(zip(grads, eager_grads)):
        assert (g is None) == (w is None), f"gradient of input {i}: {g} vs {w}"
        if w is not None:
            assert (g.dtype, g.shape) == (w.dtype, w.shape), f"gradient of input {i}"
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"gradient of input {i}: {m}")
    # .grad accumulates over two backwards, as eager's does.
    for _ in range(2):
        loss.backward(retain_graph=True)
        eager_loss.backward(retain_graph=True)
    for i, (a, b) in enumerate(zip(inputs, eager_inputs)):
        if b.grad is None:
            assert a.grad is None, f".grad of input {i}"
        else:
            torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f".grad of input {i}: {m}")
    return jitted


def leaves(*shapes, dtype=torch.float32, low=-2.0, high=2.0, requires_grad=True, seed=1):
    """Arguments: a fresh leaf per shape (an int tuple), values seeded so both calls agree."""

    def make():
        gen = torch.Generator(device=torch.empty(0).device).manual_seed(seed)
        out = []
        for s in shapes:
            t = torch.rand(s, generator=gen, device=torch.empty(0).device) * (high - low) + low
            out.append(t.to(dtype).requires_grad_(requires_grad))
        return out

    return make
