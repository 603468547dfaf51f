"""torch.compile(backend="kiln") against eager PyTorch (kiln._backend): outputs, parameters and
buffers after every call (a BatchNorm's running statistics, a static KV cache written in place),
graph breaks, recompiles on new shapes and on .eval(), the graphs kiln.backend_graphs() lists,
(whole models and a decoder with a static KV cache: tests/models/test_zoo.py)
the eager path (a graph kiln cannot trace), training through kiln's autograd and the `torch_dynamo_backends` entry point.

Dynamo's own caches are reset around each test (tests/conftest.py, fresh_dynamo).
"""

from __future__ import annotations

import sys
import tomllib
import warnings
from pathlib import Path

import pytest
import torch

import kiln
from test_state import _check_state, _pair

pytestmark = [
    pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)"),
    pytest.mark.usefixtures("fresh_dynamo"),
]




def _run_both(make, inputs, calls=3, backend=kiln.backend):
    m, eager = _pair(make)
    compiled = torch.compile(m, backend=backend)
    with torch.no_grad():
        for i in range(calls):
            args = inputs(i)
            got = compiled(*[a.clone() for a in args])
            want = eager(*[a.clone() for a in args])
            torch.testing.assert_close(got, want)
            _check_state(m, eager)
    return m, compiled


class _Branchy(torch.nn.Module):
    """Linear, BatchNorm (train mode: buffers written), a data-dependent branch (a graph break)."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.l2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.bn(self.l1(x)))
        if h.sum() > 0:
            h = h * 2
        return self.l2(h).softmax(-1)


def test_a_module_with_batch_norm_and_a_graph_break():
    m, eager = _pair(_Branchy)
    compiled = torch.compile(m, backend=kiln.backend)
    with torch.no_grad():
        for i in range(4):
            if i == 2:  # parameters are read on every call, never baked into a program
                for module in (m, eager):
                    module.l2.weight.mul_(-2)
                    module.l1.bias.add_(1)
            x = torch.randn(8, 16) * (i + 1)
            torch.testing.assert_close(compiled(x.clone()), eager(x.clone()))
            _check_state(m, eager)
    graphs = kiln.backend_graphs()
    assert len(graphs) == 2  # Dynamo breaks the graph at `if h.sum() > 0`
    assert m.bn.num_batches_tracked.item() == 4
    for g in graphs:
        stats = kiln.last_stats(g)
        assert stats["kernels"] >= 1 and stats["host_copies"] == 0
        assert g.eager_reason is None


def test_eval_and_new_shapes_compile_again():
    m, eager = _pair(_Branchy)
    compiled = torch.compile(m, backend="kiln" if _entry_point_installed() else kiln.backend)
    with torch.no_grad():
        for train, batch in [(True, 8), (False, 8), (False, 5), (True, 3)]:
            m.train(train)
            eager.train(train)
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), eager(x))
            _check_state(m, eager)


def test_mutated_inputs_and_aliased_outputs():
    def f(x, y):
        x.add_(1)
        v = x.view(-1)
        y[0].mul_(3)
        return v, x * y

    compiled = torch.compile(f, backend=kiln.backend)
    args, eager_args = [torch.randn(3, 4), torch.randn(3, 4)], None
    eager_args = [a.clone() for a in args]
    got, want = compiled(*args), f(*eager_args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    for a, e in zip(args, eager_args):
        torch.testing.assert_close(a, e)
    assert got[0].untyped_storage().data_ptr() == args[0].untyped_storage().data_ptr()  # a view of x, as in eager


def test_grad_mode_with_parameters_that_require_grad_is_differentiated():
    m, eager = _pair(lambda: torch.nn.Linear(8, 4))
    compiled = torch.compile(m, backend=kiln.backend)
    x = torch.randn(2, 8)
    got = compiled(x)
    assert type(got.grad_fn).__name__ == "CompiledFunctionBackward"  # kiln's node (kiln._autograd)
    want = eager(x)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(m.weight.grad, eager.weight.grad)


def test_a_graph_kiln_cannot_trace_runs_eagerly_and_says_why():
    def f(x):
        return torch.nonzero(x > 0).float().sum() + x.sum()

    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    try:
        compiled = torch.compile(f, backend=kiln.backend)
        x = torch.randn(6)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = compiled(x)
        torch.testing.assert_close(got, f(x))
        graphs = [g for g in kiln.backend_graphs() if g.eager_reason is not None]
        assert graphs and any("runs in eager PyTorch" in str(w.message) for w in caught)
    finally:
        torch._dynamo.config.capture_dynamic_output_shape_ops = False


def _entry_point() -> str:
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    return project["project"]["entry-points"]["torch_dynamo_backends"]["kiln"]


def _entry_point_installed() -> bool:
    from importlib.metadata import entry_points

    return "kiln" in entry_points(group="torch_dynamo_backends").names


def test_the_entry_point_names_the_backend(tmp_path, monkeypatch):
    # As `pip install` would: a dist-info whose entry_points.txt is pyproject.toml's.
    target = _entry_point()
    module, _, attr = target.partition(":")
    assert getattr(sys.modules[module], attr) is kiln.backend
    dist = tmp_path / "kiln_entry_point_test-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln-entry-point-test\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[torch_dynamo_backends]\nkiln = {target}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from torch._dynamo.backends import registry

    registry._discover_entrypoint_backends.cache_clear()
    registry._lazy_import.cache_clear()
    registry._BACKENDS.pop("kiln", None)
    registry._COMPILER_FNS.pop("kiln", None)
    assert registry.lookup_backend("kiln") is kiln.backend
    compiled = torch.compile(lambda x: (x.sin_() * 2).sum(-1), backend="kiln")
    x = torch.randn(3, 5)
    x0 = x.clone()
    torch.testing.assert_close(compiled(x), (x0.sin_() * 2).sum(-1))
    torch.testing.assert_close(x, x0)
    assert kiln.backend_graphs()
