"""nn.MultiheadAttention through kiln.jit against eager: under tracing the module cannot take its
fast path, so kiln takes it for it (torch._native_multi_head_attention as the eager step) exactly
where eager's module would, and the slow path elsewhere. Values, layouts and which kernel ran.
"""

from __future__ import annotations

import pytest
import torch

import kiln
from against_eager import check_against_eager

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


def _module(batch_first: bool, heads: int = 4, bias: bool = True) -> torch.nn.MultiheadAttention:
    torch.manual_seed(0)
    return torch.nn.MultiheadAttention(16, heads, batch_first=batch_first, bias=bias).eval()


def _x():
    g = torch.Generator(device="cpu").manual_seed(1)
    return torch.randn(3, 5, 16, generator=g, device="cpu").to(torch.get_default_device())


@pytest.fixture
def no_default_device():
    """The test device without torch.set_default_device's function mode (conftest.py sets one on
    CUDA runs): under any torch function mode eager's module takes its slow path."""
    device = torch.get_default_device()
    torch.set_default_device(None)
    try:
        yield device
    finally:
        torch.set_default_device(device)


def _native_calls(monkeypatch) -> list:
    calls = []
    native = torch._native_multi_head_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return native(*args, **kwargs)

    monkeypatch.setattr(torch, "_native_multi_head_attention", counting)
    return calls


@pytest.mark.parametrize(
    "case, fast",
    [
        ("batch_first", True),
        ("sequence_first", False),
        ("odd_heads", False),
        ("no_bias", False),
        ("with_weights", True),
    ],
)
def test_the_fast_path_where_eagers_module_takes_it(case, fast, monkeypatch, no_default_device):
    if case == "odd_heads":
        torch.manual_seed(0)
        m = torch.nn.MultiheadAttention(15, 5, batch_first=True).eval().to(no_default_device)
    else:
        m = _module(batch_first=case != "sequence_first", bias=case != "no_bias").to(no_default_device)

    def f(x):
        x = x[..., : m.embed_dim]
        out, weights = m(x, x, x, need_weights=case == "with_weights")
        return out * 2 if weights is None else (out * 2, weights)

    with torch.no_grad():
        check_against_eager(f, lambda: [_x().to(no_default_device)])  # (eager's own call counts too)
        calls = _native_calls(monkeypatch)
        kiln.jit(f)(_x().to(no_default_device))
    assert bool(calls) == fast


def test_under_a_function_mode_the_slow_path_as_in_eager(monkeypatch, no_default_device):
    # `with torch.device(...)` is a torch function mode: the module's has_torch_function check
    # fails in eager, which takes the slow path and lays its result out sequence-first.
    m = _module(batch_first=True).to(no_default_device)

    def f(x):
        return m(x, x, x, need_weights=False)[0] * 2

    calls = _native_calls(monkeypatch)
    with torch.no_grad(), torch.device(no_default_device):
        check_against_eager(f, lambda: [_x().to(no_default_device)])
    assert not calls


def test_a_mask_takes_the_slow_path(monkeypatch):
    # (Eager's module takes its fast path for a boolean mask; the mask reaches the traced call
    # canonicalized to float, where kiln cannot tell, so it takes the slow path: the same values,
    # another layout of the result.)
    m = _module(batch_first=True)

    def f(x):
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        return m(x, x, x, need_weights=False, attn_mask=mask)[0]

    with torch.no_grad():
        want = f(_x())
        calls = _native_calls(monkeypatch)
        got = kiln.jit(f)(_x())
    assert not calls
    torch.testing.assert_close(got, want)


def test_a_vision_transformer_block_matches_eager():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator(device="cpu").manual_seed(2), device="cpu").to(torch.get_default_device())
    model = model.to(x.device)
    with torch.no_grad():
        torch.testing.assert_close(kiln.jit(model)(x), model(x))


def test_training_mode_takes_the_slow_path(monkeypatch):
    m = _module(batch_first=True).train()
    m.dropout = 0.0
    calls = _native_calls(monkeypatch)
    with torch.no_grad():
        got = kiln.jit(lambda x: m(x, x, x, need_weights=False)[0])(_x())
    assert not calls
    torch.testing.assert_close(got, m(_x(), _x(), _x(), need_weights=False)[0])
