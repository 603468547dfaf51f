"""Max pools kiln computes itself (_lowering_nn._max_pool2d: the maximum of the window's strided
views of the input padded with -inf, fused with what computes the input), against eager PyTorch:
values (NaN and infinities included), strides, every window geometry (stride, padding, dilation,
ceil_mode, non-square), and the cases that stay eager steps (indices, a gradient). The choice is
made on CUDA (_lowering_nn.max_pool_as_maximum); here it is forced on every device, to check the
mechanism.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from against_eager import check_against_eager

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


@pytest.fixture
def pools_as_maximum(monkeypatch):
    import kiln._lowering_nn as lowering_nn

    monkeypatch.setattr(lowering_nn, "max_pool_as_maximum", lambda x, window: True)


def _input(shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, device="cpu").to(device=torch.get_default_device(), dtype=dtype)


def _pools_in_kiln(jitted) -> bool:
    """Whether the last program ran the pool in kiln (no eager step): as maximums of views, or
    a window of one element as a strided copy."""
    return kiln.last_stats(jitted)["eager_steps"] == 0


# (input shape, kernel_size, stride, padding, dilation, ceil_mode)
GEOMETRIES = [
    ((2, 3, 9, 9), 3, 2, 1, 1, False),  # a ResNet stem's
    ((2, 3, 10, 7), 3, 2, 1, 1, True),  # ceil_mode: a last window starting in the input
    ((1, 2, 11, 11), 3, 2, 1, 1, True),  # ceil_mode, the last window half in the right padding
    ((2, 4, 8, 8), 2, None, 0, 1, False),  # stride = kernel_size
    ((2, 2, 9, 12), (2, 3), (1, 2), (1, 0), 1, False),  # non-square everything
    ((1, 3, 12, 12), 3, 1, 1, 2, False),  # dilation
    ((1, 3, 10, 10), (3, 2), 3, 1, (2, 1), True),  # dilation and ceil_mode
    ((3, 7, 7), 3, 2, 1, 1, False),  # an unbatched input
    ((1, 2, 5, 5), 1, 2, 0, 1, False),  # a window of one element: a strided copy
    ((1, 1, 4, 4), 4, 1, 0, 1, False),  # one window
]


@pytest.mark.parametrize("shape,kernel,stride,padding,dilation,ceil", GEOMETRIES)
def test_a_max_pool_kiln_computes_agrees_with_eager(pools_as_maximum, shape, kernel, stride, padding, dilation, ceil):
    def fn(x):
        return F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode=ceil)

    jitted = check_against_eager(fn, lambda: (_input(shape),), rtol=0, atol=0)
    assert _pools_in_kiln(jitted), kiln.last_traces(jitted)[-1]


def test_nan_and_infinities_propagate_as_in_eager(pools_as_maximum):
    def make():
        x = _input((1, 2, 7, 7))
        x[0, 0, 1, 1] = float("nan")
        x[0, 0, 4, 4] = float("inf")
        x[0, 1, :3, :3] = float("-inf")  # a window of -inf only
        x[0, 1, 5, 6] = float("nan")
        return (x,)

    jitted = check_against_eager(lambda x: F.max_pool2d(x, 3, 2, 1), make, rtol=0, atol=0)
    assert _pools_in_kiln(jitted)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_pool_fuses_with_the_batch_norm_and_relu_before_it(pools_as_maximum, dtype):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(4).eval().to(device=torch.get_default_device(), dtype=dtype).requires_grad_(False)
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)

    def fn(x):
        return F.max_pool2d(F.relu(bn(x)), 3, 2, 1)

    # (the batch norm's float rounding is kiln's own, as without the pool)
    jitted = check_against_eager(fn, lambda: (_input((2, 4, 12, 12), dtype=dtype),))
    stats = kiln.last_stats(jitted)
    assert _pools_in_kiln(jitted)
    assert stats["eager_steps"] == 0 and stats["fusion_regions"] == 1, kiln.last_traces(jitted)[-1]


def test_indices_stay_an_eager_step(pools_as_maximum):
    jitted = check_against_eager(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), lambda: (_input((2, 3, 9, 9)),))
    assert not _pools_in_kiln(jitted)


def test_a_pool_a_gradient_flows_through_stays_an_eager_step(pools_as_maximum):
    # Values in halves tie within windows: the pool's gradient goes to each window's first
    # maximum, a chain of maximums would share it.
    def fn(x):
        return F.max_pool2d(x * 2, 3, 2, 1)

    x = _input((2, 3, 9, 9)).mul(2).round().div(2).requires_grad_()
    y = x.detach().clone().requires_grad_()
    weights = torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).view(2, 3, 5, 5)
    jitted = kiln.jit(fn)
    (jitted(x) * weights).sum().backward()
    (fn(y) * weights).sum().backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)
    assert not _pools_in_kiln(jitted)
    with torch.no_grad():
        torch.testing.assert_close(jitted(x), fn(y), rtol=0, atol=0)
    assert _pools_in_kiln(jitted)


def test_a_module_pool_through_the_backend_agrees_with_eager(pools_as_maximum):
    torch._dynamo.reset()
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)).to(torch.get_default_device()).eval()
    compiled = torch.compile(net, backend=kiln.backend)
    x = _input((2, 3, 10, 10))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), net(x), rtol=1e-5, atol=1e-5)
    # (the convolution is the graph's one eager step)
    traces = [kiln.last_traces(g)[0] for g in kiln.backend_graphs()]
    assert any("ltorch.maximum(" in t and t.count("eager_call(") == 1 for t in traces), traces
