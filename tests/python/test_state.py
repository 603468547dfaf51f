"""Module state and implicit inputs (kiln._state, kiln._module) against eager PyTorch: a module's
parameters and buffers, globals and captured tensors are read on every call, written back when
mutated, replayed when rebound, and a changed module compiles again. CASES.md M1-M3 (module
state) and a static KV cache written with index_copy_ at a position tensor.

Modules run under torch.no_grad() here: their parameters require grad, and a call in grad mode is
differentiated (test_autograd.py; test_grad_mode_with_parameters_that_require_grad_trains).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import kiln
from against_eager import check_against_eager

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def _pair(make):
    """Two equal modules: one for kiln, one for eager."""
    torch.manual_seed(0)
    m = make()
    return m, copy.deepcopy(m)


def _check_state(got: torch.nn.Module, want: torch.nn.Module) -> None:
    g, w = got.state_dict(), want.state_dict()
    assert list(g) == list(w)
    for k in w:
        torch.testing.assert_close(g[k], w[k], msg=lambda m: f"{k}: {m}")


def _run_both(make, inputs, calls=3):
    m, eager = _pair(make)
    jm = kiln.jit(m)
    for i in range(calls):
        x = inputs(i)
        torch.testing.assert_close(jm(x.clone()), eager(x.clone()))
        _check_state(m, eager)
    return m, jm, eager


def test_linear_returns_a_module_sharing_the_originals_state():
    m, jm, eager = _run_both(lambda: torch.nn.Linear(64, 32), lambda i: torch.randn(4, 64))
    assert isinstance(jm, torch.nn.Module)
    assert list(jm.state_dict()) == list(m.state_dict()) == ["weight", "bias"]
    assert all(a is b for a, b in zip(jm.parameters(), m.parameters()))
    assert kiln.last_stats(jm)["cache_misses"] == 1 and kiln.last_stats(jm)["cache_hits"] == 2


def test_sequential():
    make = lambda: torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    _run_both(make, lambda i: torch.randn(3, 8))


@pytest.mark.parametrize("make", [lambda: torch.nn.BatchNorm1d(4), lambda: torch.nn.BatchNorm2d(3, affine=False)], ids=["1d", "2d"])
def test_batch_norm_in_train_mode_updates_its_running_statistics_as_eager(make):
    # CASES.md M1: outputs and running_mean, running_var, num_batches_tracked after each call.
    shape = (8, 4) if isinstance(make(), torch.nn.BatchNorm1d) else (2, 3, 4, 5)
    m, jm, eager = _run_both(make, lambda i: torch.randn(*shape) * (i + 1) + i)
    assert m.num_batches_tracked.item() == 3


def test_batch_norm_with_a_cumulative_average_needs_a_value_and_says_so():
    # momentum=None makes BatchNorm's forward compute float(self.num_batches_tracked) in Python.
    jm = kiln.jit(torch.nn.BatchNorm1d(4, momentum=None))
    with pytest.raises(kiln.TraceError, match=r"float\(\) of a tensor"):
        jm(torch.randn(8, 4))


def test_eval_between_calls_compiles_again_and_train_restores():
    m, jm, eager = _run_both(lambda: torch.nn.BatchNorm1d(4), lambda i: torch.randn(8, 4) + i, calls=2)
    jm.eval()
    eager.eval()
    assert m.training is False and jm.training is False
    x = torch.randn(8, 4)
    torch.testing.assert_close(jm(x), eager(x))
    _check_state(m, eager)
    assert kiln.last_stats(jm)["cache_misses"] == 2
    m.train()  # through the original: the wrapper sees it
    eager.train()
    assert jm.training is True
    torch.testing.assert_close(jm(x), eager(x))
    _check_state(m, eager)
    assert kiln.last_stats(jm)["cache_misses"] == 2  # the train program again


def test_load_state_dict_between_calls():
    m, jm, eager = _run_both(lambda: torch.nn.Linear(6, 3), lambda i: torch.randn(2, 6), calls=1)
    torch.manual_seed(5)
    new = torch.nn.Linear(6, 3).state_dict()
    jm.load_state_dict(new)
    eager.load_state_dict(new)
    x = torch.randn(2, 6)
    torch.testing.assert_close(jm(x), eager(x))
    m.load_state_dict({k: v * 2 for k, v in new.items()}, assign=True)  # new tensor objects
    eager.load_state_dict({k: v * 2 for k, v in new.items()}, assign=True)
    torch.testing.assert_close(jm(x), eager(x))


def test_a_replaced_parameter_is_read_not_the_old_one():
    m, jm, eager = _run_both(lambda: torch.nn.Linear(5, 2), lambda i: torch.randn(3, 5), calls=1)
    for mod in (m, eager):
        mod.weight = torch.nn.Parameter(torch.ones(2, 5))
    x = torch.randn(3, 5)
    torch.testing.assert_close(jm(x), eager(x))
    for mod in (m, eager):
        mod.weight = torch.nn.Parameter(torch.ones(2, 5, dtype=torch.float64))  # another dtype
        mod.bias = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    x = torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(jm(x), eager(x))


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count = self.count + 1  # rebinds the buffer to a new tensor
        return x * self.count


def test_a_forward_that_rebinds_a_buffer():
    # CASES.md M3.
    m, jm, eager = _run_both(_Counter, lambda i: torch.ones(3))
    assert m.count.item() == 3 and "count" in dict(m.named_buffers())
    assert kiln.last_stats(jm)["cache_misses"] == 1


class _PlainAttribute(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.full((3,), 2.0)  # a tensor attribute that is not a buffer
        self.offset = 1.5

    def forward(self, x):
        self.scale.mul_(2)
        return x * self.scale + self.offset


def test_a_plain_tensor_attribute_and_a_python_attribute():
    m, jm, eager = _run_both(_PlainAttribute, lambda i: torch.ones(3))
    torch.testing.assert_close(m.scale, eager.scale)
    m.offset = eager.offset = -4.0  # a changed Python attribute the trace read: compiles again
    x = torch.ones(3)
    torch.testing.assert_close(jm(x), eager(x))
    assert kiln.last_stats(jm)["cache_misses"] == 2


def test_a_global_is_an_implicit_input_never_a_constant():
    # CASES.md M2.
    w = torch.randn(8)

    def f(x):
        return x * w

    jitted = kiln.jit(f)
    x = torch.randn(8)
    torch.testing.assert_close(jitted(x), x * w)
    w.mul_(2)
    torch.testing.assert_close(jitted(x), x * w)
    assert kiln.last_stats(jitted)["cache_hits"] == 1


_GLOBAL_BIAS = torch.zeros(4)


def _add_global(x):
    _GLOBAL_BIAS.add_(1)  # a write into a global: a writeback
    return x + _GLOBAL_BIAS


def test_a_written_global_and_a_rebound_global():
    global _GLOBAL_BIAS
    jitted = kiln.jit(_add_global)
    x = torch.zeros(4)
    torch.testing.assert_close(jitted(x), torch.ones(4))
    torch.testing.assert_close(_GLOBAL_BIAS, torch.ones(4))
    _GLOBAL_BIAS = torch.full((4,), 10.0)  # a new object in the slot: read, not the old one
    torch.testing.assert_close(jitted(x), torch.full((4,), 11.0))
    torch.testing.assert_close(_GLOBAL_BIAS, torch.full((4,), 11.0))


def test_a_module_used_by_a_function_and_a_returned_parameter():
    lin = torch.nn.Linear(3, 3)

    def f(x):
        return lin(x), lin.weight

    jitted = kiln.jit(f)
    x = torch.randn(2, 3)
    out, w = jitted(x)
    torch.testing.assert_close(out, lin(x))
    assert w is lin.weight
    lin.eval()  # a flag of a module the function reaches is a guard too
    jitted(x)
    assert kiln.last_stats(jitted)["cache_misses"] == 2


def test_grad_mode_with_parameters_that_require_grad_trains():
    lin = torch.nn.Linear(3, 3)
    m = kiln.jit(lin)
    x = torch.randn(2, 3)
    with torch.enable_grad():
        m(x).square().sum().backward()
    grads = [p.grad.clone() for p in lin.parameters()]
    lin.zero_grad(set_to_none=True)
    with torch.enable_grad():
        lin(x).square().sum().backward()
    for got, want in zip(grads, (p.grad for p in lin.parameters())):
        torch.testing.assert_close(got, want)


def test_to_and_train_act_on_the_original():
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5))
    jm = kiln.jit(m)
    jm.eval()
    assert not m.training and not m[1].training
    jm.to(torch.float64)
    assert m[0].weight.dtype == torch.float64
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(jm(x), m(x))


class _KVCache(torch.nn.Module):
    """A decoder attention step with a static cache: index_copy_ at a position tensor."""

    def __init__(self, heads=2, length=64, dim=8):
        super().__init__()
        self.q = torch.nn.Linear(heads * dim, heads * dim)
        self.k = torch.nn.Linear(heads * dim, heads * dim)
        self.v = torch.nn.Linear(heads * dim, heads * dim)
        self.heads, self.dim = heads, dim
        self.register_buffer("k_cache", torch.zeros(1, heads, length, dim))
        self.register_buffer("v_cache", torch.zeros(1, heads, length, dim))

    def forward(self, x, pos, mask):
        b, t, _ = x.shape
        split = lambda y: y.view(b, t, self.heads, self.dim).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        scores = q @ self.k_cache.transpose(-1, -2) / math.sqrt(self.dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        out = scores.softmax(-1) @ self.v_cache
        return out.transpose(1, 2).reshape(b, t, -1)


def test_a_kv_cache_written_with_index_copy_over_64_positions():
    m, eager = _pair(_KVCache)
    jm = kiln.jit(m)
    length = m.k_cache.shape[2]
    for p in range(length):
        x = torch.randn(1, 1, 16)
        pos = torch.tensor([p])
        mask = (torch.arange(length) <= p).view(1, 1, 1, length)
        torch.testing.assert_close(jm(x, pos, mask), eager(x, pos, mask))
    _check_state(m, eager)
    stats = kiln.last_stats(jm)
    assert stats["cache_misses"] == 1  # one program for every position: pos is an input
    # index_copy_ is a kernel (no eager step), and the caches are written by their kernels. (The
    # matrix products are library steps on CUDA, ATen's on the CPU.)
    assert stats["fallback_ops"] == 0 and stats["interpreted_steps"] == 0
    assert jm._kiln_forward._cache.last_run_stats["writebacks_in_kernel"] == 2


_SHIFT = torch.zeros(4)


class _Nested(torch.nn.Module):
    """A child two levels down, a plain attribute on it, and a global the forward reads."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.nn.ReLU())
        self.body[0][0].gain = 1.0

    def forward(self, x):
        inner = self.body[0][0]
        return self.body(x) * inner.gain + _SHIFT


def test_every_change_between_calls_is_seen_deep_in_the_module_tree():
    """Calls that change nothing reuse the last walk of the module tree (kiln._state's
    DictWatch); each change below, made between calls, must still be seen."""
    global _SHIFT
    m, eager = _pair(_Nested)
    jm = kiln.jit(m)
    x = torch.randn(3, 4)

    def same():
        torch.testing.assert_close(jm(x), eager(x))

    same()
    same()  # unchanged: the same program, the walk reused
    assert kiln.last_stats(jm)["cache_misses"] == 1
    changes = [
        lambda mod: setattr(mod.body[0][0], "gain", 3.0),  # a plain attribute two levels down
        lambda mod: setattr(mod.body[0][0], "weight", torch.nn.Parameter(torch.ones(4, 4))),  # a new parameter
        lambda mod: mod.body[0][0].bias.data.fill_(2.0),  # in place: no dict changes
        lambda mod: setattr(mod.body[0][0].weight, "data", torch.full((4, 4), 0.5)),  # new data
        lambda mod: mod.body[0][0].eval(),  # one child's flag
        lambda mod: mod.body[0][0].train(),
    ]
    for change in changes:
        change(m)
        change(eager)
        same()
        same()
    _SHIFT = torch.full((4,), 7.0)  # a rebound global (no module dict changes)
    same()
    _SHIFT = torch.zeros(4)
    same()
    m.body[0][0].weight = torch.nn.Parameter(torch.ones(4, 4, dtype=torch.float64))  # another dtype
    m.body[0][0].bias = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    eager.body[0][0].weight = torch.nn.Parameter(torch.ones(4, 4, dtype=torch.float64))
    eager.body[0][0].bias = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    x = x.double()
    _SHIFT = torch.zeros(4, dtype=torch.float64)
    same()
    _SHIFT = torch.zeros(4)


_NET = torch.nn.Linear(3, 2)


def test_a_global_or_captured_module_rebound_between_calls():
    """The modules a function reaches through a global or a captured variable are found again
    when that name is bound to another module (the program read the first module's parameters,
    a silent wrong result, before)."""
    global _NET
    f = kiln.jit(lambda x: _NET(x) * 2)
    x = torch.randn(4, 3)
    torch.testing.assert_close(f(x), _NET(x) * 2)
    _NET = torch.nn.Linear(3, 2)
    torch.testing.assert_close(f(x), _NET(x) * 2)

    m = torch.nn.Linear(3, 2)

    def g(x):
        return m(x) + 1

    jg = kiln.jit(g)
    torch.testing.assert_close(jg(x), m(x) + 1)
    m = torch.nn.Linear(3, 2)  # the cell g captured now holds another module
    torch.testing.assert_close(jg(x), m(x) + 1)
