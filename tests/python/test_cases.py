"""The programs of CASES.md, written as ordinary PyTorch functions, traced with kiln.trace and
checked with the C++ tool: the trace parses and prints back unchanged, the seeds (and I6, M1)
fuse into one region, and running the trace (in the reference interpreter, and compiled through
the whole pipeline) leaves outputs, inputs and output identity exactly as eager PyTorch does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import pytest
import torch

import kiln
from kiln._tracer import device_str
from kiln_opt_tool import checked, fusion_regions, needs_kiln_opt, run_against_eager, without_subsymbols


def ar(*s: int) -> torch.Tensor:
    return torch.arange(math.prod(s), dtype=torch.float32).reshape(s) / 10


# ---- the programs ------------------------------------------------------------------------------


def s1(a):
    a.tanh_()
    return a * a * a * a


def s2(x):
    x.exp_()
    x.sin_()
    return x.cos()


def i1(x):
    x.add_(1).sin_().mul_(5)
    return x


def i2(x):
    x.add_(1).sin().mul_(5)
    return x


def i3(a, b):
    c = a + b
    b.mul_(c)
    return b


def i4(a):
    a += 1


def i5(x, y):
    x.add_(y)


def i6(h, r):
    h.add_(r)
    h.relu_()
    return h * 0.5


def m1(a, b):
    c = a + b
    c.add_(1)
    return c


def m2(a, b):
    c = a + b
    c.add_(1)
    d = c + c
    d.add_(1)
    c.add_(d)
    return c, d


def v1(x):
    y = x.view(4, 2)
    y.add_(torch.ones(4, 2))
    z = x * x
    return y, z


def v2(x):
    y = x.view(8)
    x.add_(1)
    return y


def v3(a):
    a.add_(1)


def v4(x):
    x.transpose_(1, 0)
    x[0].add_(1)
    return x


def v5(x):
    y = x.view(3, 2)
    y[0][0] = 0
    return x


def a1(a, b):
    return a.exp_() + b.tanh_(), a


def a2(a, b):
    a.mul_(3)
    b.mul_(2)
    return a + b


def a3(a, b):
    a.mul_(3)
    b.mul_(2)
    return a.clone().view(-1) + b.clone().view(-1)


def a4(x, y):
    return x + 1, y.mul_(2)


def h1(a):
    a[:, 2:7] = a[:, 1:6] + 2


def h2(w, x):
    out = w + x
    x.mul_(10)
    return out


def h3(x):
    x.expand(2, 4).add_(1)


def _same(x: torch.Tensor) -> list[torch.Tensor]:
    return [x, x]


def _halves() -> list[torch.Tensor]:
    x = ar(4, 4)
    return [x[0:2], x[2:4]]


def _a3_inputs() -> list[torch.Tensor]:
    base = torch.ones(64)
    return [base.as_strided((4, 4), (9, 1), 0), base.as_strided((4, 4), (9, 1), 24)]


def _a4_inputs() -> list[torch.Tensor]:
    a = ar(4, 4)
    return [a, a.t()]


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable
    make_args: Callable[[], list]
    one_region: bool = False


CASES = [
    Case("S1", s1, lambda: [ar(5, 5)], one_region=True),
    Case("S2", s2, lambda: [ar(5, 5)], one_region=True),
    Case("I1", i1, lambda: [ar(3)]),
    Case("I2", i2, lambda: [ar(3)]),
    Case("I3", i3, lambda: [ar(3), ar(3) + 1]),
    Case("I4", i4, lambda: [ar(3)]),
    Case("I5", i5, lambda: [ar(4).bfloat16(), ar(4) + 0.01]),
    Case("I6", i6, lambda: [ar(6) - 0.3, ar(6) - 0.4], one_region=True),
    Case("M1", m1, lambda: [ar(4), ar(4)], one_region=True),
    Case("M2", m2, lambda: [torch.ones(2), torch.ones(2)]),
    Case("V1", v1, lambda: [ar(8)]),
    Case("V2", v2, lambda: [ar(4, 2)]),
    Case("V3", v3, lambda: [torch.ones(4)[0::2]]),
    Case("V4", v4, lambda: [ar(4, 2)]),
    Case("V5", v5, lambda: [ar(6) + 1]),
    Case("A1", a1, lambda: _same(ar(4, 4))),
    Case("A2", a2, _halves),
    Case("A3", a3, _a3_inputs),
    Case("A4", a4, _a4_inputs),
    Case("H1", h1, lambda: [ar(1, 16)]),
    Case("H2", h2, lambda: [ar(2, 3), ar(2, 1)]),
]
CASE_IDS = [c.name for c in CASES]


# ---- checks ------------------------------------------------------------------------------------


@needs_kiln_opt
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_trace_parses_and_prints_back(case: Case):
    text = kiln.trace(case.fn, *case.make_args())
    printed = checked(text)  # parse + verify; every statement's type comment is checked
    assert without_subsymbols(printed) == text
    assert checked(printed) == printed  # and kiln's own print is a fixed point


def test_seed_traces_record_mutation_in_place():
    # S1 exactly as DESIGN.md 2.1 shows it: the in-place op stays in-place, later reads of `a`
    # read its result.
    text = kiln.trace(s1, ar(5, 5))
    body = [line.split("  #")[0].strip() for line in text.splitlines()[2:]]
    assert body == [
        "",  # the input's type comment
        "t0 = ltorch.tanh_(a)",
        "t1 = ltorch.mul(t0, t0)",
        "t2 = ltorch.mul(t1, t0)",
        "t3 = ltorch.mul(t2, t0)",
        'return {"output": (t3,)}',
    ]
    assert f'# a: "{device_str(torch.empty(0).device)} f32[5, 5] strides=(5, 1) offset=0"' in text
    assert "test_cases.py:" in text and "a.tanh_()" in text and "return a * a * a * a" in text


@needs_kiln_opt
@pytest.mark.parametrize("case", [c for c in CASES if c.one_region], ids=[c.name for c in CASES if c.one_region])
def test_fuses_into_one_region(case: Case):
    printed = checked(kiln.trace(case.fn, *case.make_args()), "--pipeline")
    assert fusion_regions(printed) == 1, printed


@needs_kiln_opt
@pytest.mark.parametrize("pipeline", [False, True], ids=["interpreter", "pipeline"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_runs_like_eager(case: Case, pipeline: bool):
    run_against_eager(case.fn, case.make_args, pipeline)


def test_h3_write_into_expanded_tensor_raises_like_eager():
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor") as info:
        kiln.trace(h3, torch.zeros(4))
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        h3(torch.zeros(4))
    assert "x.expand(2, 4).add_(1)" in str(info.value)
    assert "test_cases.py:" in str(info.value)
