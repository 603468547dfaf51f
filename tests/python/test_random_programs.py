"""Random programs mixing in-place ops, views, setitem and aliased inputs, generated as Python
source, traced with kiln.trace and run with kiln-opt against eager PyTorch. A failure prints
the program (a reproducer: paste it, call it on the inputs shown).

KILN_RANDOM_PROGRAMS sets how many programs per mode (default 100); KILN_GRADIENT_PROGRAMS how
many test_autograd.py differentiates (default 1000); KILN_RANDOM_SEED_START the first seed
(default 0: CI's fixed programs; another start runs programs no run has seen).
"""

from __future__ import annotations

import os
import random
from typing import Callable

import pytest
import torch

from kiln_opt_tool import needs_kiln_opt, run_against_eager

COUNT = int(os.environ.get("KILN_RANDOM_PROGRAMS", "100"))
SEEDS = range(int(os.environ.get("KILN_RANDOM_SEED_START", "0")), int(os.environ.get("KILN_RANDOM_SEED_START", "0")) + COUNT)

_UNARY = ["sin", "cos", "tanh", "sigmoid", "neg", "abs", "relu"]
_KEYS = ["1:", ":2", "0", "..., 1", ":, ::2", "-1", "None, 1:"]


def _inputs(kind: int) -> list[torch.Tensor]:
    base = (torch.arange(24, dtype=torch.float32) % 7 - 3) / 4
    if kind == 0:
        return [base[:12].reshape(3, 4).clone()]
    if kind == 1:
        return [base[:12].reshape(3, 4).clone(), base[12:16].clone()]
    if kind == 2:  # two overlapping views of one buffer
        return [base[0:12].view(3, 4), base[4:16].view(3, 4)]
    return [base.view(4, 6)[:, 1::2], base[:4].clone()]  # a strided input


# Ops kiln has no lowering for (kiln.jit runs them eagerly, as eager_call steps): only in the
# programs test_jit.py runs through kiln.jit, not in those traced for kiln-opt.
_FALLBACK_STEPS = [
    "{new} = torch.cumsum({v}, -1)",
    "{new} = torch.flip({v}, [0])",
    "{new} = torch.sort({v}, -1)[0]",
    # Index reads and writes with index tensors (eager steps; writes on clones, copied back).
    "{new} = {v}.index_select(-1, torch.tensor([1, 0, 1]))",
    "{v}.index_fill_(0, torch.tensor([0, -1]), {c})",
    "{v}[torch.tensor([0, 0])] += {c}",
    "{v}.index_add_(0, torch.tensor([1, 1]), {v}[:2] * 2)",
    "{v}.scatter_add_(-1, ({v} > 0).long(), {v}.clone())",
    "{v}.scatter_reduce_(-1, ({v} > 0).long(), {v} * 2, 'amax', include_self=False)",
    "{new} = {v}.gather(-1, ({v} < 0).long())",
    "{v}.index_put_((torch.tensor([0, 1, 0]),), torch.tensor({c}), accumulate=True)",
]


# For the gradient tests (test_autograd.py): leaves that require grad, and a wrapper `g` that
# makes from them intermediates laid out and aliased as _inputs(kind) lays out its tensors, then
# calls the program `f` on them (in-place ops on a leaf that requires grad raise in eager).
_GRADIENT_WRAPPERS = {
    0: ("def g(x0):\n    return f(x0 * 1)\n", lambda base: [base[:12].reshape(3, 4)]),
    1: ("def g(x0, y0):\n    return f(x0 * 1, y0 * 1)\n", lambda base: [base[:12].reshape(3, 4), base[12:16]]),
    2: ("def g(b0):\n    b = b0 * 1\n    return f(b[0:12].view(3, 4), b[4:16].view(3, 4))\n", lambda base: [base[:16]]),
    3: ("def g(b0, y0):\n    return f((b0 * 1).view(4, 6)[:, 1::2], y0 * 1)\n", lambda base: [base, base[:4]]),
}


def gradient_program(seed: int) -> tuple[str, Callable[[], list]]:
    """random_program(seed, fallback_ops=True) as `g`, a function of leaves that require grad."""
    source, _ = random_program(seed, fallback_ops=True)
    wrapper, leaves = _GRADIENT_WRAPPERS[random.Random(seed).randrange(4)]

    def make_leaves() -> list[torch.Tensor]:
        base = (torch.arange(24, dtype=torch.float32) % 7 - 3) / 4
        return [t.clone().requires_grad_() for t in leaves(base)]

    return source + wrapper, make_leaves


def random_program(seed: int, fallback_ops: bool = False) -> tuple[str, Callable[[], list]]:
    rng = random.Random(seed)
    kind = rng.randrange(4)
    make_args = lambda: _inputs(kind)  # noqa: E731
    names = ["x", "y"][: len(make_args())]
    lines: list[str] = []
    env: dict = {}

    def replay() -> dict:
        # On the CPU whatever the test device: an invalid step (an index out of range) raises
        # there, where a CUDA kernel would device-assert and end the process's CUDA context. The
        # arguments are made there too (not moved: .cpu() of two views of one CUDA storage gives
        # two storages, and a step eager refuses for overlap would pass).
        default = torch.get_default_device()
        torch.set_default_device("cpu")
        try:
            env = {"torch": torch, **dict(zip(names, make_args()))}
            exec("\n".join(lines), env)
        finally:
            torch.set_default_device(default)
        return env

    counter = 0
    for _ in range(rng.randint(3, 9)):
        env = replay()
        tensors = [n for n, v in env.items() if isinstance(v, torch.Tensor)]
        v, w = rng.choice(tensors), rng.choice(tensors)
        c = rng.choice(["0.5", "2", "-1.25", "3"])
        new = f"v{counter}"
        choice = rng.randrange(19)
        key = rng.choice(_KEYS)
        value = rng.choice([w, c])
        step = [
            f"{new} = {v}.{rng.choice(_UNARY)}()",
            f"{v}.{rng.choice(_UNARY)}_()",
            f"{new} = {v} {rng.choice('+-*')} {w}",
            f"{new} = {v} {rng.choice('+-*')} {c}",
            f"{v}.{rng.choice(['add_', 'sub_', 'mul_'])}({w})",
            f"{v}.{rng.choice(['add_', 'mul_'])}({c})",
            f"{new} = {v}.t()",
            f"{new} = {v}[{rng.choice(_KEYS)}]",
            f"{new} = {v}.view(-1)",
            f"{new} = {v}.unsqueeze(0).transpose(0, -1)",
            f"{v}[{key}] = {value}",
            f"{v}.t_()",
            f"{new} = {v}.clone()",
            f"{new} = {v}.{rng.choice(['sum', 'mean', 'amax'])}(-1, keepdim=True)",
            # (Masks compare with 0.1, not 0: the inputs are symmetric quarters, so a sum of
            # an odd function of them cancels to 0 exactly, and whether eager's float sum lands
            # on +-1e-8 or on 0 depends on its order of additions, which kiln need not share.)
            f"{new} = torch.where({v} > 0.1, {v}, {w})",
            f"{v}.copy_({w})",
            f"{v}.{rng.choice(['zero_()', 'fill_(1.5)'])}",
            f"{v}.masked_fill_({v} {rng.choice('<>')} {w}, {c})",
            f"{v}[{v} {rng.choice('<>')} 0.1] = {c}",
        ][choice]
        if fallback_ops and rng.randrange(5) == 0:
            step = rng.choice(_FALLBACK_STEPS).format(new=new, v=v, c=c)
        lines.append(step)
        try:
            replay()
        except (RuntimeError, IndexError, TypeError, ValueError):  # not a valid eager program (shapes, views, overlap): drop the step
            lines.pop()
            continue
        counter += 1
    env = replay()
    results = [n for n, v in env.items() if isinstance(v, torch.Tensor) and n not in names]
    returned = rng.sample(results, k=min(len(results), rng.randint(0, 3))) + rng.sample(names, k=rng.randint(0, len(names)))
    body = "\n".join("    " + line for line in lines)
    source = f"def f({', '.join(names)}):\n{body}\n    return ({', '.join(returned)}{',' if returned else ''})\n"
    return source, make_args


def _compile(source: str, seed: int, name: str = "f") -> Callable:
    env = {"torch": torch}
    exec(compile(source, f"<random program {seed}>", "exec"), env)
    return env[name]


@needs_kiln_opt
@pytest.mark.parametrize("pipeline", [False, True], ids=["interpreter", "pipeline"])
def test_random_programs_run_like_eager(pipeline: bool):
    failures = []
    for seed in SEEDS:
        source, make_args = random_program(seed)
        fn = _compile(source, seed)
        try:
            run_against_eager(fn, make_args, pipeline)
        except AssertionError as e:
            args = ", ".join(f"{tuple(t.shape)} strides={t.stride()}" for t in make_args())
            failures.append(f"--- seed {seed} (inputs {args}):\n{source}{str(e).splitlines()[0]}")
    assert not failures, f"{len(failures)} of {COUNT} programs differ from eager:\n" + "\n".join(failures[:5])


def test_generator_is_deterministic_and_varied():
    sources = [random_program(seed)[0] for seed in range(30)]
    assert sources == [random_program(seed)[0] for seed in range(30)]
    assert len(set(sources)) == 30
    assert any("] = " in s for s in sources) and any("_(" in s for s in sources)
