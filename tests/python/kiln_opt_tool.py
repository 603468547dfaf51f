"""Driving the C++ tool `kiln-opt` from the Python tests: check that a trace parses (and prints
back unchanged), count fusion regions, and run a trace on given inputs to compare with eager.

The tool's path is $KILN_OPT, by default this checkout's release build. Tests that need it
are skipped, not failed, when it is missing (the Python front end can be tested alone).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess

from typing import Callable

import pytest
import torch
import torch.utils._pytree as pytree

import kiln

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_OPT = os.environ.get("KILN_OPT", os.path.join(_REPO, "build", "release", "tools", "kiln-opt", "kiln-opt"))
HAVE_KILN_OPT = os.path.isfile(KILN_OPT) and os.access(KILN_OPT, os.X_OK)
ON_CPU = torch.get_default_device().type == "cpu"  # see conftest.py, KILN_TEST_DEVICE
needs_kiln_opt = pytest.mark.skipif(
    not HAVE_KILN_OPT or not ON_CPU,
    reason=f"kiln-opt not found at {KILN_OPT} (set KILN_OPT)" if ON_CPU else "kiln-opt runs programs on the CPU",
)


def kiln_opt(text: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([KILN_OPT, "-", *args], input=text, capture_output=True, text=True, timeout=120)


def checked(text: str, *args: str) -> str:
    r = kiln_opt(text, *args)
    assert r.returncode == 0, f"kiln-opt {' '.join(args)} failed ({r.returncode}):\n{r.stderr}\n--- trace:\n{text}"
    return r.stdout


def without_subsymbols(text: str) -> str:
    """The printed trace less the subsymbol lines kiln adds under decomposed ops (getitem,
    setitem_, softmax, ...): the tracer writes the op, kiln owns its decomposition."""
    return "".join(line for line in text.splitlines(keepends=True) if not re.match(r"^    +# ", line))


def fusion_regions(printed: str) -> int:
    return len(set(re.findall(r"\bkilnFusion\d+\(", printed)))


# ---- --run -------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunValue:
    type: str  # "cpu f32[2, 2]"
    strides: tuple[int, ...]
    offset: int
    values: object  # nested lists, or a number for a 0-d tensor
    note: str  # "is input x", "shares memory with input x" or ""


_VALUE_LINE = re.compile(r"^(output \d+|\S+) = (\S+ \S+\[[^\]]*\]) strides=\(([^)]*)\) offset=(\d+) (.*?)(?:  # (.*))?$")


def _parse_values(text: str) -> object:
    env = {"nan": math.nan, "inf": math.inf, "true": True, "false": False, "__builtins__": {}}
    text = re.sub(r"-nan\b", "nan", text)
    text = re.sub(r"(?<![\w.])-0(?![\w.])", "-0.0", text)  # eval reads -0 as the integer 0
    return eval(text, env)  # the tool prints Python-like nested lists of numbers


def parse_run(stdout: str) -> tuple[list[RunValue], dict[str, RunValue]]:
    """(outputs, inputs after the call) from `kiln-opt --run` output."""
    outputs: list[RunValue] = []
    after: dict[str, RunValue] = {}
    section = None
    for line in stdout.splitlines():
        if line.startswith("# outputs"):
            section = "out"
            continue
        if line.startswith("# inputs after"):
            section = "after"
            continue
        if line.startswith("#"):
            section = None if line.startswith("# inputs before") else section
            continue
        m = _VALUE_LINE.match(line)
        if not m or section is None:
            continue
        name, type_, strides, offset, values, note = m.groups()
        v = RunValue(
            type_,
            tuple(int(s) for s in strides.replace(",", " ").split()),
            int(offset),
            _parse_values(values),
            note or "",
        )
        if section == "out":
            outputs.append(v)
        else:
            after[name] = v
    return outputs, after


def input_flag(name: str, t: torch.Tensor) -> str:
    values = t.detach().to(torch.float64).flatten().tolist() if t.dtype != torch.bool else t.flatten().int().tolist()
    return f"--input={name}=" + ",".join(repr(float(v)) for v in values)


def _addresses(t: torch.Tensor) -> set[int]:
    """The storage element offsets a (small) tensor covers."""
    numel = t.untyped_storage().nbytes() // t.element_size()
    index = torch.arange(numel).as_strided(t.shape, t.stride(), t.storage_offset())
    return set(index.flatten().tolist())


def alias_flag(names: list[str], tensors: list[torch.Tensor]) -> str | None:
    """kiln-opt's --alias text for the call's tensors, in the canonical form kiln computes for a
    call (compute_alias_pattern in src/kiln/analysis/alias_pattern.cpp), since the tool checks
    that the inputs it makes have the pattern it compiled for: inputs whose elements overlap form
    a group; the same object again is `same as`; a group of one contiguous input is `own`;
    other groups are views of a 1-D base spanning their extent. None when nothing aliases."""
    n = len(tensors)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    addresses = [_addresses(t) for t in tensors]
    for i in range(n):
        for j in range(i + 1, n):
            same_storage = tensors[i].untyped_storage().data_ptr() == tensors[j].untyped_storage().data_ptr()
            if same_storage and (tensors[i] is tensors[j] or addresses[i] & addresses[j]):
                parent[root(j)] = root(i)
    if all(root(i) == i for i in range(n)) :
        return None
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(root(i), []).append(i)
    entries: dict[int, str] = {}
    bases = []
    for k, members in enumerate(groups.values()):
        distinct = [i for i in members if not any(tensors[q] is tensors[i] for q in members if q < i)]
        for i in members:
            if i not in distinct:
                first = next(q for q in members if tensors[q] is tensors[i])
                entries[i] = f"{names[i]}: same as {names[first]}"
        if len(distinct) == 1 and tensors[distinct[0]].is_contiguous():
            entries[distinct[0]] = f"{names[distinct[0]]}: own"
            continue
        lo = min(min(addresses[i]) for i in distinct)
        hi = max(max(addresses[i]) for i in distinct)
        label = f"base{k}"
        bases.append(f"{label}: {_DTYPES[tensors[distinct[0]].dtype]}[{hi - lo + 1}]")
        for i in distinct:
            t = tensors[i]
            sizes = ", ".join(str(s) for s in t.shape)
            strides = ", ".join(str(s) for s in t.stride()) + ("," if t.dim() == 1 else "")
            entries[i] = f"{names[i]}: {label}[{sizes}] strides=({strides}) offset={t.storage_offset() - lo}"
    return "--alias=" + "; ".join([entries[i] for i in range(n)] + bases)


# ---- comparing with eager ----------------------------------------------------------------------


def _tensors(args: list) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor)]


def _assert_values(value: RunValue, eager: torch.Tensor, what: str) -> None:
    shape = tuple(int(n) for n in value.type.split("[", 1)[1].rstrip("]").replace(",", " ").split())
    assert shape == tuple(eager.shape), f"{what}: shape {shape} != eager {tuple(eager.shape)}"
    if eager.numel() == 0:
        return
    got = torch.tensor(value.values, dtype=torch.float64)
    want = eager.detach().to(torch.float64)
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != eager {tuple(want.shape)}"
    # kiln-opt prints 6 significant digits.
    rtol = max(1e-5, torch.finfo(eager.dtype).eps if eager.dtype.is_floating_point else 0)
    torch.testing.assert_close(got, want, rtol=rtol, atol=1e-6, equal_nan=True, msg=lambda m: f"{what}: {m}")
    assert_zero_signs(got, want, what)


def assert_zero_signs(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """assert_close takes -0.0 for 0.0, but later ops tell them apart (atan2, 1 / x): where both
    are zero, the signs must agree. (For the traced programs here, whose seeds are fixed: a max or
    min over equal zeros of both signs may return either, so with fresh random programs this
    check could fail on a choice eager leaves open.)"""
    if not (got.dtype.is_floating_point and want.dtype.is_floating_point) or got.shape != want.shape:
        return
    got, want = got.detach().cpu(), want.detach().cpu()
    zero_sign = (got == 0) & (want == 0) & (torch.signbit(got) != torch.signbit(want))
    assert not zero_sign.any(), f"{what}: the sign of zero differs from eager at {zero_sign.nonzero().tolist()[:5]}"


def run_against_eager(fn: Callable, make_args: Callable[[], list], pipeline: bool) -> None:
    """Traces fn, runs the trace with kiln-opt on the same input values (and the same aliasing
    of the inputs), runs fn eagerly on fresh inputs, and compares everything the caller sees."""
    args = make_args()
    program = kiln.trace_program(fn, *args)
    tensors = _tensors(args)
    names = program.input_names
    assert len(names) == len(tensors)
    # Values for each distinct tensor (a tensor passed twice gets them once).
    flags = [input_flag(n, t) for k, (n, t) in enumerate(zip(names, tensors)) if not any(t is u for u in tensors[:k])]
    alias = alias_flag(names, tensors)
    if alias:
        flags.append(alias)
    stdout = checked(program.text, *(["--pipeline"] if pipeline else []), "--run", *flags)
    outputs, after = parse_run(stdout)

    eager_args = make_args()
    eager_inputs = _tensors(eager_args)
    result = fn(*eager_args)
    eager_outputs = [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
    assert len(outputs) == len(eager_outputs), stdout
    for i, (got, want) in enumerate(zip(outputs, eager_outputs)):
        want_type = f"{want.device.type} {_dtype(want)}[{', '.join(str(n) for n in want.shape)}]"
        assert got.type == want_type, f"output {i}: kiln gives {got.type}, eager {want_type}"
        _assert_values(got, want, f"output {i}")
        # Identity: an output that *is* an input in eager is that input in kiln, one that shares
        # an input's memory is a view of it in kiln too.
        expected = set()
        for name, inp in zip(names, eager_inputs):
            if want is inp:
                expected.add(f"is input {name}")
            elif want.untyped_storage().nbytes() and want.untyped_storage().data_ptr() == inp.untyped_storage().data_ptr():
                expected.add(f"shares memory with input {name}")
        notes = {n.strip() for n in got.note.split("  # ")} - {""}
        assert notes == expected, f"output {i}: kiln says {notes}, eager {expected}\n{stdout}"
    for name, inp in zip(names, eager_inputs):
        got = after[name]
        _assert_values(got, inp, f"input {name} after the call")
        assert got.strides == tuple(inp.stride()), f"input {name}: strides {got.strides} != eager {inp.stride()}"


def _dtype(t: torch.Tensor) -> str:
    from kiln._tracer import dtype_name

    return dtype_name(t.dtype)



_DTYPES = {
    torch.bool: "bool", torch.int32: "i32", torch.int64: "i64", torch.float16: "f16",
    torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
}
