"""Complex tensors through kiln.jit against eager PyTorch (kiln._complex: a complex tensor is
traced as its view_as_real pair): values, inputs and their storages afterwards, aliasing of
outputs, the caller's own object for a returned input, errors; rotary embeddings as models write
them (a complex buffer of a module, view_as_complex of an activation), fused into one kernel.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from against_eager import check_against_eager

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


def _c(*shape: int, dtype: torch.dtype = torch.complex64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    real = torch.randn(*shape, 2, generator=g, dtype=torch.float64, device="cpu")
    return torch.view_as_complex(real).to(dtype).to(torch.get_default_device())


def _r(*shape: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cpu").to(torch.get_default_device())


def _rope(x, freqs):  # Meta's Llama: apply_rotary_emb
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    f = freqs.view(1, xc.shape[1], 1, xc.shape[-1])
    return torch.view_as_real(xc * f).flatten(3).type_as(x)


def _freqs(seq: int, half: int) -> torch.Tensor:
    theta = 1.0 / (10000.0 ** (torch.arange(0, 2 * half, 2)[:half].float() / (2 * half)))
    t = torch.arange(seq, dtype=torch.float32)
    return torch.polar(torch.ones(seq, half), torch.outer(t, theta))


PROGRAMS = {
    "mul": (lambda z, w: z * w, lambda: [_c(4, 3), _c(4, 3, seed=2)]),
    "broadcast_mul_real": (lambda z, x: z * x + x, lambda: [_c(4, 3), _r(3)]),
    "scalars": (lambda z: (z * 2 + 1) * (0.5 - 2j) - 3j, lambda: [_c(5)]),
    "div": (lambda z, w: (z / w, w / 2, 1 / z, z / (3 - 4j)), lambda: [_c(6), _c(6, seed=3)]),
    "div_by_zero": (lambda z, w: z / w, lambda: [_c(3), torch.zeros(3, dtype=torch.complex64)]),
    "unary": (lambda z: (-z, z.abs(), z.angle(), z.exp(), z.conj_physical(), z.real * 2, z.imag + 1), lambda: [_c(2, 5)]),
    "abs_extremes": (lambda z: z.abs(), lambda: [torch.tensor([3e30 + 4e30j, 0j, complex("inf+nanj"), 1e-30 + 1e-30j])]),
    "complex128": (lambda z, w: (z * w).sum(-1), lambda: [_c(3, 4, dtype=torch.complex128), _c(4, dtype=torch.complex128)]),
    "promotion": (lambda z, x: z + x, lambda: [_c(4), _r(4).double()]),
    "rope": (_rope, lambda: [_r(2, 6, 3, 8), _freqs(6, 4)]),
    "rope_bf16": (_rope, lambda: [_r(2, 6, 3, 8).bfloat16(), _freqs(6, 4)]),
    "polar_and_complex": (lambda a, t: (torch.polar(a, t), torch.complex(a, t), torch.complex(a, t).abs()), lambda: [_r(5).abs(), _r(5, seed=4)]),
    "views": (
        lambda z: (z.t(), z[1:, None, ..., 0], z.reshape(-1), z.unsqueeze(0).transpose(0, 2), z.permute(1, 0), z.unbind(1)[2], z.chunk(2)[1]),
        lambda: [_c(4, 3)],
    ),
    "transposes": (lambda z: (z.T, z.mT, z.unsqueeze(0).mT.sum(0)), lambda: [_c(3, 4)]),
    "real_times_a_complex_number": (lambda x: (x * 1j, 2j + x, x / (1 + 1j)), lambda: [_r(4)]),
    "reductions": (lambda z: (z.sum(0), z.mean(), z.sum((0, 1), keepdim=True)), lambda: [_c(4, 3)]),
    "cast": (lambda z, x: (z.to(torch.complex128), x.to(torch.complex64) * z, z.type_as(x)), lambda: [_c(3), _r(3)]),
    "cat_stack": (lambda z, w: (torch.cat([z, w]), torch.stack([z, w], -1)), lambda: [_c(2, 3), _c(2, 3, seed=5)]),
    # writes into complex inputs: in place, through views, through the real and imaginary parts
    "in_place": (lambda z, w: z.mul_(w).add_(1), lambda: [_c(4, 3), _c(3, seed=2)]),
    "in_place_through_a_view": (lambda z: (z[1].mul_(2j), None)[1], lambda: [_c(3, 2)]),
    "write_the_real_part": (lambda z: (z.real.mul_(2), z.imag.zero_(), z * 1)[2], lambda: [_c(2, 3)]),
    "write_through_view_as_real": (lambda z: (torch.view_as_real(z)[..., 1].neg_(), z + 0)[1], lambda: [_c(4)]),
    "write_a_complex_view_of_a_real_input": (lambda x: (torch.view_as_complex(x).mul_(1j), x * 2)[1], lambda: [_r(3, 2)]),
    "setitem": (lambda z, w: (z.__setitem__((slice(None), 0), w[:, 0]), z.__setitem__(1, 2 - 1j), z)[2], lambda: [_c(3, 2), _c(3, 2, seed=6)]),
    "copy_and_fill": (lambda z, x: (z.copy_(x), z[0].fill_(1j), z)[2], lambda: [_c(2, 3), _r(2, 3)]),
    "complex_into_real": (lambda x, z: (x.__setitem__(0, z[1]), x.copy_(x + z.real), x)[2], lambda: [_r(3, 2), _c(3, 2)]),
    "strided_input": (lambda z: z.mul_(2), lambda: [_c(4, 6)[:, ::2]]),
    # outputs that alias: a returned view of an input, of an intermediate, and of each other
    "returned_views": (lambda z: (torch.view_as_real(z), z[0], (lambda y: (y, y.view(-1)))(z * 2)), lambda: [_c(2, 3)]),
    "aliased_inputs": (lambda a, b: (a.mul_(2), b + 1), lambda: (lambda z: [z[:2], z[1:]])(_c(4))),
    # ops kiln has no complex rule for run as eager steps on the device
    "eager_steps": (lambda z, x: (torch.fft.fft(x) * z, z @ z.t(), torch.fft.ifft(z).real), lambda: [_c(4, 4), _r(4, 4)]),
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_complex_program(name):
    fn, make_args = PROGRAMS[name]
    check_against_eager(fn, make_args)


def test_the_rotary_embedding_is_one_kernel():
    jitted = check_against_eager(_rope, PROGRAMS["rope"][1])
    stats = kiln.last_stats(jitted)
    assert stats["fusion_regions"] == 1 and stats["kernels"] == 1 and stats["eager_steps"] == 0


def test_a_returned_complex_input_is_the_callers_object_on_every_call():
    f = kiln.jit(lambda z: z.mul_(1j))
    for _ in range(3):
        z = _c(4)
        assert f(z) is z
    assert kiln.last_stats(f)["cache_hits"] == 2


def test_complex_and_real_calls_of_one_layout_are_keyed_apart():
    f = kiln.jit(lambda a: a * 2)
    z = _c(3)
    x = torch.view_as_real(z).clone()
    torch.testing.assert_close(f(z), z * 2)
    torch.testing.assert_close(f(x), x * 2)
    assert f(z).dtype == torch.complex64 and f(x).dtype == torch.float32


class _Attention(torch.nn.Module):
    """Meta's Llama attention's rotary part: a complex buffer read every call."""

    def __init__(self, seq: int, dim: int) -> None:
        super().__init__()
        self.wq = torch.nn.Linear(dim, dim, bias=False)
        self.register_buffer("freqs_cis", _freqs(seq, dim // 4), persistent=False)

    def forward(self, x, start: int):
        q = self.wq(x).view(x.shape[0], x.shape[1], 2, -1)
        freqs = self.freqs_cis[start : start + x.shape[1]]
        return _rope(q, freqs)


def test_a_module_with_a_complex_buffer():
    torch.manual_seed(0)
    module = _Attention(8, 16).eval()
    jitted = kiln.jit(module)
    x = _r(2, 4, 16)
    with torch.no_grad():
        for start in (0, 2, 4):
            torch.testing.assert_close(jitted(x, start), module(x, start))
        module.freqs_cis.mul_(1j)  # the buffer is an input, never a constant
        torch.testing.assert_close(jitted(x, 4), module(x, 4))


def test_a_module_that_writes_its_complex_buffer():
    class Phase(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("state", torch.ones(3, dtype=torch.complex64))

        def forward(self, x):
            self.state.mul_(torch.polar(torch.ones_like(x), x))
            return self.state.real

    module, reference = Phase(), Phase()
    jitted = kiln.jit(module)
    for k in range(3):
        x = _r(3, seed=k)
        torch.testing.assert_close(jitted(x), reference(x))
        torch.testing.assert_close(module.state, reference.state)


def test_errors_are_eagers_and_kilns_own():
    with pytest.raises(RuntimeError, match="size|broadcast"):
        kiln.jit(lambda z, w: z * w)(_c(3), _c(4))
    with pytest.raises(RuntimeError):  # eager: the last dim must be of size 2 with stride 1
        kiln.jit(lambda x: torch.view_as_complex(x))(_r(3, 3))
    with pytest.raises(kiln.UnsupportedError, match="resolve_conj"):
        kiln.jit(lambda z: z + 1)(_c(3).conj())
    # A lazily conjugated view would have to show later writes: kiln refuses it, loudly.
    with pytest.raises(kiln.UnsupportedError, match="conj_physical"):
        kiln.jit(lambda z: z.conj())(_c(3))
    with pytest.raises(kiln.UnsupportedError, match="view_as_real"):
        kiln.jit(lambda z: z.view(torch.float32))(_c(3))


def test_complex_tensors_that_require_grad_run_eagerly_with_a_warning():
    z = _c(3).requires_grad_()
    f = kiln.jit(lambda z: (z * z).abs().sum())
    with pytest.warns(UserWarning, match="complex"):
        out = f(z)
    out.backward()
    want = z.detach().clone().requires_grad_()
    (want * want).abs().sum().backward()
    torch.testing.assert_close(z.grad, want.grad)


def test_a_real_program_with_a_complex_intermediate_is_differentiated():
    x = _r(2, 6, 3, 8).requires_grad_()
    freqs = _freqs(6, 4)
    f = kiln.jit(_rope)
    weights = _r(2, 6, 3, 8, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        (f(x, freqs) * weights).sum().backward()
    want = x.detach().clone().requires_grad_()
    (_rope(want, freqs) * weights).sum().backward()
    torch.testing.assert_close(x.grad, want.grad)


def test_the_rotary_embedding_through_the_torch_compile_backend(fresh_dynamo):
    torch.manual_seed(0)
    module = _Attention(8, 16).eval()
    compiled = torch.compile(module, backend=kiln.backend)
    x = _r(2, 4, 16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no graph runs eagerly
        for start in (0, 4):
            torch.testing.assert_close(compiled(x, start), module(x, start))
    stats = [kiln.last_stats(g) for g in kiln.backend_graphs()]
    assert stats and all(s["host_copies"] == 0 and s["eager_steps"] == 0 for s in stats)
