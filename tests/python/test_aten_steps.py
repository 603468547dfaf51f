"""Steps without a kernel that kiln._C runs through ATen's C++ API (src/kiln/python/aten_steps.h)
against eager. A position embedding's gradient is one: the backward's zeros, arange, add,
reshape and index_add, its index made in the region and longer than a kernel scans
(kMaxScannedIndex), as in GPT-2's backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


def _device():
    return torch.empty(0).device


def positions_embedded(table, g, offset: int):
    positions = torch.arange(0, g.shape[0], device=g.device) + offset
    return (F.embedding(positions.reshape(1, -1), table) * g).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_position_embeddings_gradient_runs_as_eager(dtype):
    gen = torch.Generator(device="cpu").manual_seed(0)
    table = torch.randn(1024, 16, generator=gen, device="cpu").to(dtype=dtype, device=_device())
    g = torch.randn(40, 16, generator=gen, device="cpu").to(dtype=dtype, device=_device())
    jitted = kiln.jit(positions_embedded)
    grads = []
    for f in (jitted, positions_embedded):
        t = table.clone().requires_grad_()
        f(t, g, 3).backward()
        grads.append(t.grad)
    torch.testing.assert_close(grads[0], grads[1])
    backward = kiln.last_stats(jitted)["backward"]
    assert backward["torch_steps"] >= 1 and backward["eager_steps"] == 0
    # A second backward into an existing .grad accumulates, as eager's
    t = table.clone().requires_grad_()
    jitted(t, g, 3).backward()
    jitted(t, g, 5).backward()
    want = table.clone().requires_grad_()
    positions_embedded(want, g, 3).backward()
    positions_embedded(want, g, 5).backward()
    torch.testing.assert_close(t.grad, want.grad)
