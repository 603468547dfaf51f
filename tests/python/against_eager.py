"""The differential check every kiln.jit test makes: a function run through kiln.jit and eagerly on
equal fresh arguments, comparing everything the caller can see (outputs, their identity and
aliasing, every input and every storage behind it afterwards). Imported by the test modules."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

import kiln


def whole_storage(t: torch.Tensor) -> torch.Tensor:
    """Every element of the storage behind t (1-D, t's dtype)."""
    return torch.tensor([], dtype=t.dtype, device=t.device).set_(t.untyped_storage())


def tensors(tree) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().nbytes() > 0 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def strides(t: torch.Tensor) -> tuple:
    """The strides that address memory: those of dims of size 1 do not (PyTorch's is_contiguous
    ignores them too), and PyTorch itself does not agree on them: for a [4, 1] column, sort's
    meta kernel, which kiln traces with, says (1, 1) where its CPU kernel gives (1, 4)."""
    return tuple(s if n != 1 else None for s, n in zip(t.stride(), t.shape))


def check_against_eager(fn, make_args, jitted=None, **tolerance) -> kiln.JitFunction:
    """Runs fn through kiln.jit (or `jitted`, a kiln.jit of fn called before) and eagerly on equal
    fresh arguments and compares everything the caller can see. Returns the jitted function (for
    its stats). `tolerance` (rtol=, atol=) is for the outputs' values, where eager itself may
    round otherwise (assert_close's defaults else)."""
    jitted = jitted or kiln.jit(fn)
    args, eager_args = make_args(), make_args()
    got = jitted(*args)
    want = fn(*eager_args)
    inputs, eager_inputs = tensors(args), tensors(eager_args)

    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    assert got_spec == want_spec
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        if not isinstance(w, torch.Tensor):
            assert g == w, f"output {i}"
            continue
        assert isinstance(g, torch.Tensor), f"output {i}: {g!r}"
        assert (g.dtype, g.shape, strides(g)) == (w.dtype, w.shape, strides(w)), f"output {i}"
        torch.testing.assert_close(g, w, equal_nan=True, msg=lambda m: f"output {i}: {m}", **tolerance)
        # Identity, as in eager: the caller's own object, a view of a caller's tensor, or fresh.
        for k, (inp, einp) in enumerate(zip(inputs, eager_inputs)):
            assert (g is inp) == (w is einp), f"output {i} vs input {k}: object identity"
            assert same_storage(g, inp) == same_storage(w, einp), f"output {i} vs input {k}: storage sharing"
            if same_storage(g, inp):
                assert g.storage_offset() == w.storage_offset() - einp.storage_offset() + inp.storage_offset()
    for k, (inp, einp) in enumerate(zip(inputs, eager_inputs)):
        assert (inp.shape, inp.stride(), inp.storage_offset()) == (einp.shape, einp.stride(), einp.storage_offset()), f"input {k} layout"
        torch.testing.assert_close(inp, einp, equal_nan=True, msg=lambda m: f"input {k} afterwards: {m}")
        torch.testing.assert_close(whole_storage(inp), whole_storage(einp), equal_nan=True, msg=lambda m: f"storage of input {k}: {m}")
    # On CUDA every step runs on the device (DESIGN.md 7): nothing goes through host copies.
    stats = kiln.last_stats(jitted)
    assert (stats["host_copies"], stats["host_copy_bytes"]) == (0, 0), "steps interpreted on host copies"
    return jitted
