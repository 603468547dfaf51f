"""Reductions at the shapes that choose each of a CUDA nest's reduction schedules
(src/kiln/codegen/schedule_reduction.h), against eager PyTorch: outer reductions over few outputs
(the column schedule: tiles of consecutive outputs, lanes splitting the reduced rows; a last tile
that is partly past the end), inner reductions of one output per row (a row per element: a warp
for short rows, a block for long ones), the reductions kept serial (argmax, short ones, many
outputs), and each with a prologue, an epilogue, several outputs and in-place writes fused in.
On the CPU the same programs check the CPU kernels.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

import kiln
from against_eager import check_against_eager

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


def _randn(*shape, dtype=torch.float32, seed=0):
    """Multiples of 1/8 in [-2, 2): their sums and products of pairs are exact in float32 in any
    order (kiln's order differs from eager's), so the comparison is exact where it can be."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randint(-16, 16, shape, generator=gen, device="cpu") / 8
    return x.to(dtype=dtype, device=torch.empty(0).device)


# name: (function, argument shapes). Columns: 100 outputs (tiles of 8 float32, the last half
# past the end), 3000 rows; rows per element: rows of 1000 (a block) and of 40 (a warp).
PROGRAMS = {
    "column sum": (lambda x: x.sum(0), [(3000, 100)]),
    "column mean": (lambda x: x.mean(0), [(3000, 100)]),
    "column amax": (lambda x: x.amax(0), [(3000, 100)]),
    "column amin of a product": (lambda x, y: (x * y).amin(0), [(3000, 100), (100,)]),
    "column prod": (lambda x: (1 + x / 64).prod(0), [(700, 33)]),
    "column var": (lambda x: x.var(0), [(3000, 100)]),
    "column std without correction": (lambda x: x.std(0, correction=0), [(3000, 100)]),
    "column argmax (serial)": (lambda x: x.argmax(0), [(3000, 100)]),
    "middle dim": (lambda x: x.sum(1), [(4, 500, 30)]),
    "two outer dims": (lambda x: x.sum((0, 1)), [(20, 150, 37)]),
    "layer norm's weight and bias gradients": (
        lambda g, xhat: ((g * xhat).sum(0), g.sum(0)),
        [(2048, 96), (2048, 96)],
    ),
    "column sum and epilogue": (lambda x, b: x.sum(0) * 2 + b, [(3000, 100), (100,)]),
    "in place, then a column sum": (lambda x: (x.mul_(2), x.sum(0))[1], [(3000, 100)]),
    "column sum of a transposed input": (lambda x: x.t().sum(1), [(100, 3000)]),
    "column sum of a strided view": (lambda x: x[::2, 1::3].sum(0), [(3000, 301)]),
    "few rows (serial)": (lambda x: x.sum(0), [(5, 100)]),
    "row sum, rows of 1000": (lambda x: x.sum(-1), [(300, 1000)]),
    "row amax, rows of 40": (lambda x: x.amax(-1), [(300, 40)]),
    "row var, rows of 1000": (lambda x: x.var(-1), [(300, 1000)]),
    "row sum of an expression": (lambda x, w: (x * w).abs().sum(-1), [(300, 1000), (1000,)]),
    "row sum, rows of 5000": (lambda x: x.sum(-1), [(40, 5000)]),
    "row mean then epilogue": (lambda x: x.mean(-1) * 3 - 1, [(300, 1000)]),
    "inner and outer together": (lambda x: (x.sum(-1), x.sum(0)), [(300, 1000)]),
    "row argmax (serial)": (lambda x: x.argmax(-1), [(300, 1000)]),
    # CPU column blocks of 64 (codegen/schedule_cpu_passes.cpp): three and a part of one.
    "column argmin of an expression, 200 columns": (lambda x, y: (x - y).argmin(0), [(500, 200), (500, 200)]),
    "column amax and sum, 200 columns": (lambda x: (x.amax(0), x.sum(0, keepdim=True)), [(500, 200)]),
    # CUDA rows of a few vectors packed several to a warp (packed_row_threads): 37 rows leave the
    # last warp's other rows past the end; a row's in-place update stored by its last loop.
    "softmax, rows of 64 packed": (lambda x: torch.softmax(x, -1), [(37, 64)]),
    "row var and mean, rows of 32 packed": (lambda x: (x.var(-1), x.mean(-1, keepdim=True) - x), [(37, 32)]),
    "in place, then a row max, rows of 128 packed": (lambda x: (x.mul_(2), x - x.amax(-1, keepdim=True))[1], [(37, 128)]),
    # CPU column blocks too few for the team (one block of 64 or fewer columns): the team shares
    # each pass's rows, its partial accumulators combined (an OpenMP array reduction), then the
    # rows of the block's last loop; a pass whose order matters (argmax) keeps its rows serial.
    "softmax over dim 0, one block": (lambda x: torch.softmax(x, 0), [(3000, 64)]),
    "column sum, amax and var, one block": (lambda x: (x.sum(0), x.amax(0), x.var(0)), [(3000, 50)]),
    "column amax of columns all -inf, one block": (
        lambda x: torch.cat([torch.full_like(x[:, :2], float("-inf")), x], 1).amax(0),
        [(3000, 30)],
    ),
    "column argmax and sum, one block": (lambda x: (x.argmax(0), x.sum(0)), [(3000, 64)]),
    "softmax over dim 1 of one batch": (lambda x: torch.softmax(x, 1), [(1, 3000, 64)]),
    # A CPU pass in pieces between its guards' bounds (pieces_between_cuts).
    "row sum of a cat": (lambda a, b: torch.cat([a.exp(), b], -1).sum(-1), [(300, 300), (300, 700)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", PROGRAMS)
def test_reduction_schedules_agree_with_eager(name, dtype):
    fn, shapes = PROGRAMS[name]
    if dtype == torch.bfloat16 and "prod" in name:
        pytest.skip("a product of 700 bf16 factors differs from eager's by its rounding order")

    def make():
        return [_randn(*s, dtype=dtype, seed=k) for k, s in enumerate(shapes)]

    if dtype == torch.bfloat16:  # eager sums bf16 in float and rounds once, as kiln does
        jitted = kiln.jit(fn)
        got, want = jitted(*make()), fn(*make())
        got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2)
        return
    check_against_eager(fn, make)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_integer_column_and_row_sums_are_exact(dtype):
    def make():
        gen = torch.Generator(device="cpu").manual_seed(3)
        return [torch.randint(-1000, 1000, (3000, 100), generator=gen, device="cpu").to(dtype=dtype, device=torch.empty(0).device)]

    check_against_eager(lambda x: (x.sum(0), x.sum(-1), x.amax(0)), make)


@pytest.mark.parametrize("length", [7, 40, 1000, 70000])
def test_max_and_min_propagate_nan_and_keep_infinities_as_eager(length):
    # The CPU kernels vectorize amax/amin as OpenMP's max and min plus a flag of the NaNs seen
    # (codegen/emit_reduction.cpp): a row with a NaN anywhere (first, last, among infinities) reduces to
    # NaN, one of infinities and zeros of both signs to eager's value. 70000 elements make the
    # full reduction's pass parallel.
    def make():
        gen = torch.Generator(device="cpu").manual_seed(length)
        x = torch.randn(6, length, generator=gen, device="cpu")
        x[0, 0] = float("nan")
        x[1, -1] = float("nan")
        x[2, :] = 0.0
        x[2, ::2] = -0.0
        x[3, length // 2] = float("inf")
        x[3, 0] = float("-inf")
        x[4, :] = float("-inf")
        x[5, length // 3] = float("nan")
        x[5, 0] = float("inf")
        return [x.to(torch.empty(0).device)]

    check_against_eager(lambda x: (x.amax(-1), x.amin(-1), x.amax(), x.amin(), x[1:4].amax()), make)


# An in-place write of the tensor a reduction then reads: the reduction's pass stores the written
# values at the element it loads (analysis/pass_stores.h), with no nest of their own and no
# temporary. Columns of 100 (the column schedule's last tile partly past the end, whose threads
# repeat the last column's pass and must store nothing), rows of 1000 and of 40, full reductions.
PASS_STORES = {  # name: (function, argument shapes)
    "column sum": (lambda x: (x.mul_(2), x.sum(0))[1], [(3000, 100)]),
    "column amax, keepdim": (lambda x: (x.abs_(), x.amax(0, keepdim=True))[1], [(3000, 100)]),
    "middle dim mean": (lambda x: (x.sub_(1), x.mean(1))[1], [(4, 500, 30)]),
    "row sum, rows of 1000": (lambda x: (x.clamp_(-1, 1), x.sum(-1))[1], [(300, 1000)]),
    "row amin, rows of 40": (lambda x: (x.neg_(), x.amin(-1))[1], [(300, 40)]),
    # (33 short rows: a CUDA row per element packed several to a warp would have lanes past the
    # last row run its pass again, reading the doubled row and storing it doubled twice)
    "row sum, 33 rows of 30": (lambda x: (x.mul_(2), x.sum(-1))[1], [(33, 30)]),
    "row argmax": (lambda x: (x.add_(1), x.argmax(-1))[1], [(300, 1000)]),
    "full amax": (lambda x: (x.abs_(), x.amax())[1], [(300, 1000)]),
    "full sum, small": (lambda x: (x.mul_(3), x.sum())[1], [(7, 5)]),
    "through a broadcast operand": (lambda x, s: (x.mul_(s[:, None]), x.sum(0))[1], [(3000, 100), (3000,)]),
    "into part of the tensor": (lambda x: (x[:, :50].clamp_(-1, 1), x.sum(-1))[1], [(300, 100)]),
    "strided copy, then a row sum": (lambda x, y: (x[:, ::2].copy_(y), x.sum(-1))[1], [(300, 100), (300, 50)]),
    "epilogue after the sum": (lambda x, b: (x.mul_(2), x.sum(0) * 3 + b)[1], [(3000, 100), (100,)]),
    "two tensors written": (lambda x, y: (x.mul_(2), y.add_(x), (x + y).sum(-1))[2], [(3000, 100), (3000, 100)]),
    # A column's own operand (s[i1], computed once per column outside a CPU column block's pass):
    # the CPU kernel is lowered again with the written values in its last nest.
    "through a column operand": (lambda x, s: (x.mul_(s[None, :]), x.sum(0))[1], [(3000, 100), (100,)]),
    "into the middle of each row": (lambda x: (x[:, 30:70].mul_(2), x.sum(-1))[1], [(300, 100)]),
    "into one element of each row": (lambda x: (x[:, 5].zero_(), x.amax(-1))[1], [(300, 100)]),
    # Strided writes along the reduced rows (the CPU splits the pass by residue: a group of
    # `step` positions a step of the loop, cpu_residue_split): steps of 2, 3 and 4, from
    # positions 0 and 1, into part of the row, before a sum, an amax, an argmax, a mean.
    "every third, from 1, then a row sum": (lambda x, y: (x[:, 1::3].copy_(y), x.sum(-1))[1], [(64, 96), (64, 32)]),
    "every fourth, from 1 to 61, then amax": (lambda x: (x[:, 1:61:4].mul_(-3), x.amax(-1))[1], [(64, 96)]),
    "every second, then argmax": (lambda x: (x[:, ::2].add_(2), x.argmax(-1))[1], [(64, 64)]),
    "every second from 1, then a mean of rows of 2^14": (lambda x: (x[:, 1::2].zero_(), x.mean(-1))[1], [(8, 1 << 14)]),
    "strided copy, then a full sum": (lambda x, y: (x[:, ::2].copy_(y), x.sum())[1], [(64, 4096), (64, 2048)]),
}


def _stats_of_table_program(table, name, dtype, float32_tolerance):
    """Runs table[name] through kiln.jit against eager on _randn inputs of `dtype` (bf16 to 2e-2)
    and returns the jitted call's stats."""
    fn, shapes = table[name]

    def make():
        return [_randn(*s, dtype=dtype, seed=k) for k, s in enumerate(shapes)]

    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else float32_tolerance
    return kiln.last_stats(check_against_eager(fn, make, **tolerance))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", PASS_STORES)
def test_writes_before_a_reduction_are_stored_by_its_pass(name, dtype):
    stats = _stats_of_table_program(PASS_STORES, name, dtype, {})
    # Every write of a whole tensor goes into the caller's memory from the kernel: from the pass
    # where it runs along rows, else from the kernel's last nest (pass_stores.h).
    if not any(word in name for word in ("part", "strided", "middle", "element")):
        assert stats["writebacks_with_temporary"] == 0, stats
        # One step: a kernel, or PyTorch's ops where a kernel would leave the GPU idle.
        assert stats["kernels"] + stats["torch_steps"] == 1, stats


@pytest.mark.parametrize("name", ["reads the written tensor elsewhere", "a row of it as a second argument",
                                  "the reduction then the written value", "variance (two passes)"])
def test_a_pass_store_that_would_overwrite_what_is_still_read_is_not_made(name):
    # Where the kernel still reads the written tensor away from the pass's element (another
    # output reading a row of it, an argument that is a view of it, a second pass), the value
    # goes to a temporary and is copied after the kernel, or the region is split: the results are
    # eager's either way.
    base = lambda: _randn(3000, 100, seed=1)  # noqa: E731
    programs = {
        "reads the written tensor elsewhere": (lambda x: (x.mul_(2), x.sum(0) + x[7])[1], lambda: [base()]),
        "a row of it as a second argument": (lambda x, r: (x.mul_(2), x.sum(0) + r)[1], lambda: (lambda b: [b, b[7]])(base())),
        "the reduction then the written value": (lambda x: (x.mul_(2), x.sum(0), x.add_(x.sum(0)))[1], lambda: [base()]),
        "variance (two passes)": (lambda x: (x.mul_(2), x.var(0))[1], lambda: [base()]),
    }
    fn, make = programs[name]
    check_against_eager(fn, make)


# Rows too few to fill the GPU with a block each (schedule_cuda_rows.cpp: a reduction of more
# than 256 KiB a block in fewer blocks than the H200 has SMs): each row is split across blocks
# that meet at a grid barrier at each of its statistics, launched cooperatively. Full
# reductions (one row), a few long rows with an epilogue over the row (softmax, a normalization
# written in place), two statistics (variance), in-place writes stored by the pass, a row length
# that is no multiple of the vector width, strided and broadcast operands. On the CPU the same
# programs check the CPU kernels.
SPLIT_ROWS = {  # name: (function, argument shapes)
    "full sum": (lambda x: x.sum(), [(512, 300)]),
    "full amax after abs_": (lambda x: (x.abs_(), x.amax())[1], [(512, 300)]),
    "full mean of a product, odd length": (lambda x, y: (x * y).mean(), [(100003,), (100003,)]),
    "full sum of a strided view": (lambda x: x[::2, 1:].sum(), [(1000, 301)]),
    "full min and max together": (lambda x: (x.amin(), x.amax() * 2), [(512, 300)]),
    "softmax over 6 long rows": (lambda x: torch.softmax(x, -1), [(6, 120000)]),
    "row variance, 5 long rows": (lambda x: x.var(-1), [(5, 120000)]),
    "normalize rows in place": (
        lambda x: (x.sub_(x.mean(-1, keepdim=True)), x.div_((x * x).mean(-1, keepdim=True).add(1e-5).sqrt()))[1],
        [(4, 131072)],
    ),
    "scale by the full sum": (lambda x, w: x * w / (x * w).abs().sum(), [(300, 600), (600,)]),
    "integer full sum": (lambda x: (x.to(torch.int64) * 3).sum(), [(512, 300)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", SPLIT_ROWS)
def test_rows_split_across_blocks_agree_with_eager(name, dtype):
    stats = _stats_of_table_program(SPLIT_ROWS, name, dtype, {"rtol": 1e-5, "atol": 1e-5})
    # A kernel runs the reduction (before the split, PyTorch's ops ran it on the GPU).
    assert stats["torch_steps"] == 0 and stats["interpreted_steps"] == 0, stats


# Column reductions with too few tiles of columns to fill the GPU, each over many rows (a layer
# norm's weight gradients): each tile is split across blocks, whose columns meet at a grid
# barrier (grid_column_<op>). A few columns or an odd number, two reductions in one kernel,
# keepdim, an epilogue, the middle dim, written values, integers. On the CPU the same programs
# check the CPU kernels.
SPLIT_COLUMNS = {  # name: (function, argument shapes)
    "column sum": (lambda x: x.sum(0), [(20000, 100)]),
    "column sum after mul_": (lambda x: (x.mul_(2), x.sum(0))[1], [(20000, 100)]),
    "weight gradients": (lambda g, h: ((g * h).sum(0), g.sum(0)), [(20000, 96), (20000, 96)]),
    "column amax, keepdim": (lambda x: (x.abs_(), x.amax(0, keepdim=True))[1], [(20000, 100)]),
    "column min and max": (lambda x: (x.amin(0), x.amax(0)), [(20000, 100)]),
    "column mean with an epilogue": (lambda x, b: x.mean(0) * 3 + b, [(20000, 100), (100,)]),
    "odd columns and rows": (lambda x: x.sum(0), [(20011, 37)]),
    "middle dim": (lambda x: x.sum(1), [(3, 20000, 40)]),
    "integer column sum": (lambda x: (x.to(torch.int64) * 3).sum(0), [(20000, 100)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", SPLIT_COLUMNS)
def test_columns_split_across_blocks_agree_with_eager(name, dtype):
    stats = _stats_of_table_program(SPLIT_COLUMNS, name, dtype, {"rtol": 1e-4, "atol": 1e-3})
    # A kernel runs the reduction (before the split, PyTorch's ops ran it on the GPU).
    assert stats["torch_steps"] == 0 and stats["interpreted_steps"] == 0, stats


def test_a_split_row_argmax_runs_through_pytorch():
    # An argmax is not split across blocks: the region runs as PyTorch's ops on the GPU, and on
    # the CPU as a kernel; the results are eager's either way.
    check_against_eager(lambda x: (x.abs_(), x.argmax())[1], lambda: [_randn(512, 300, seed=4)])


@pytest.mark.parametrize(
    "shape, dims",
    [((1 << 20,), None), ((64, 1 << 14), -1), ((300, 3000), -1), ((8, 96, 700), (0, 2)), ((1 << 22,), None)],
    ids=["full", "rows", "odd_rows", "two_dims", "long_full"],
)
def test_float32_sums_are_as_accurate_as_eagers(shape, dims):
    """A float32 sum's error against the exact (float64) sum is within a few times eager's own,
    or one float rounding of the sum of the magnitudes (the scale of a sum's error where its terms
    cancel), however kiln's kernels accumulate (the CPU sums chunks of 1024 elements in float
    before adding them in double; CUDA threads sum in float)."""
    gen = torch.Generator(device=torch.empty(0).device).manual_seed(5)
    x = torch.randn(shape, generator=gen, device=torch.empty(0).device) * 100 + 3

    def fn(x):
        return x.sum() if dims is None else x.sum(dims)

    exact, magnitude = fn(x.double()), fn(x.double().abs())
    got, eager = kiln.jit(fn)(x).double(), fn(x).double()
    bound = torch.maximum(4 * (eager - exact).abs(), magnitude * torch.finfo(torch.float32).eps)
    assert bool(((got - exact).abs() <= bound).all()), ((got - exact).abs() / magnitude).max()


RESIDUE_SPLITS = [  # (step, start, end or None, row length, reduction, in-place op)
    (2, 0, None, 64, "sum", "copy"),
    (2, 1, None, 100, "amax", "mul"),
    (3, 0, None, 96, "mean", "copy"),
    (3, 2, 80, 99, "argmax", "mul"),
    (4, 1, 61, 96, "amin", "copy"),
    (5, 4, None, 160, "var", "mul"),
    (8, 3, None, 256, "sum", "copy"),
    (8, 0, 200, 4096, "sum", "mul"),
    (2, 0, None, 70, "prod", "mul"),
]


@pytest.mark.parametrize("step, start, end, length, reduction, op", RESIDUE_SPLITS, ids=str)
def test_strided_writes_before_a_row_reduction(step, start, end, length, reduction, op):
    """Strided writes along the rows a reduction then reads (the CPU splits the pass by residue:
    a group of `step` positions a step of its loop): values and the written tensor as eager's,
    whether or not the row length divides by the step or the slice ends early."""
    count = len(range(start, length if end is None else end, step))

    def fn(x, y):
        view = x[:, start:end:step]
        view.copy_(y) if op == "copy" else view.mul_(y)
        if reduction == "var":
            return x.var(-1)
        if reduction == "prod":
            return (x * 0.1 + 1).prod(-1)
        return getattr(x, reduction)(-1)

    def make():
        return [_randn(12, length, seed=1), _randn(12, count, seed=2)]

    check_against_eager(fn, make, rtol=1e-5, atol=1e-5)


def test_the_variance_of_equal_elements_is_exactly_zero():
    # A CPU kernel's mean summed in float chunks left a constant row's deviations off 0: its
    # variance came out tiny, `v / v` 1 where eager's is 0 / 0 (kiln_fuzz, 2026-12-05).
    def fn(x):
        v = x.expm1().var(correction=0)
        s = x.expm1().std(dim=-1)
        return v / v, s / s

    check_against_eager(fn, lambda: [torch.full((4, 9), -1.5, device=torch.get_default_device())])


def _softmax_into_its_slice(x):
    x[:, :70000] = torch.softmax(x[:, :70000], -1)


def _softmax_times_input_into_its_slice(x):
    # The row's last loop reads x at the element it stores: x must hold x there, not exp(x - max).
    x[:, :70000] = torch.softmax(x[:, :70000], -1) * x[:, :70000]


# Rows past the CPU's stack row buffers (256 KiB a nest): a value the row's passes compute and
# its last loop reads again (softmax's exp(x - max)) is kept in the row's place in an output of
# the kernel's own (codegen keep_in_output), never in an output stored into the caller's memory
# (the slice written in place is read by the passes), nor in one that holds another value.
# On CUDA the same programs check its row kernels.
LONG_ROWS = {  # name: function of x [3, 70001]
    "softmax": lambda x: torch.softmax(x, -1),
    "softmax into the slice it reads": _softmax_into_its_slice,
    "softmax times its input into the slice": _softmax_times_input_into_its_slice,
    "softmax and log_softmax": lambda x: (torch.softmax(x, -1), torch.log_softmax(x, -1)),
    "softmax times its input": lambda x: torch.softmax(x, -1) * x,
    "two softmaxes of the row": lambda x: (torch.softmax(x, -1), torch.softmax(x * 2, -1)),
    "softmax as float64": lambda x: torch.softmax(x, -1).double(),
    # The variance's pass computes squares no later loop reads: kept nowhere (the store dropped).
    "normalized rows": lambda x: (x - x.mean(-1, keepdim=True)) * ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True).add(1e-5).rsqrt(),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", LONG_ROWS)
def test_long_rows_keep_a_pass_value_in_an_output_and_agree_with_eager(name, dtype):
    def make_args():
        g = torch.Generator().manual_seed(7)
        return [torch.randn(3, 70001, generator=g, device="cpu").to(device=torch.get_default_device(), dtype=dtype)]

    jitted = check_against_eager(LONG_ROWS[name], make_args)
    stats = jitted._cache.last_run_stats
    assert stats["interpreted_steps"] == 0 and stats["torch_steps"] == 0, stats


def _softmax_of_columns_into_their_slice(x):
    x[:, :40] = torch.softmax(x[:, :40], 0)


def _softmax_of_columns_times_input_into_their_slice(x):
    # The block's last loop reads x at the element it stores: x must hold x there, not exp(x - max).
    x[:, :40] = torch.softmax(x[:, :40], 0) * x[:, :40]


def _softmax_over_two_dims(x):
    e = (x - x.amax((0, 1), keepdim=True)).exp()
    return e / e.sum((0, 1), keepdim=True)


def _softmax_and_its_exp(x):
    e = (x - x.amax(0, keepdim=True)).exp()
    return e / e.sum(0, keepdim=True), e


# The same for column passes (a reduction down the columns, run in a CPU nest's column block
# before its last loop): the value the pass computes and the block's last loop reads again is
# kept in the element's place in an output of the kernel's own (codegen keep_row_value,
# across_rows), never in an output stored into the caller's memory, and not where the pass runs
# outside the block (a reduced dim innermost in memory: the value is withdrawn and computed
# again). Columns of x [300, 70]: a block of 64 and one of 6; 3-D inputs [4, 30, 70].
COLUMN_PASSES = {  # name: (function, shape)
    "softmax": (lambda x: torch.softmax(x, 0), (300, 70)),
    "softmax into the slice it reads": (_softmax_of_columns_into_their_slice, (300, 70)),
    "softmax times its input into the slice": (_softmax_of_columns_times_input_into_their_slice, (300, 70)),
    "softmax and log_softmax": (lambda x: (torch.softmax(x, 0), torch.log_softmax(x, 0)), (300, 70)),
    "softmax times its input": (lambda x: torch.softmax(x, 0) * x, (300, 70)),
    "two softmaxes of the columns": (lambda x: (torch.softmax(x, 0), torch.softmax(x * 2, 0)), (300, 70)),
    "softmax and the exp it divides": (_softmax_and_its_exp, (300, 70)),
    "softmax as float64": (lambda x: torch.softmax(x, 0).double(), (300, 70)),
    "softmax plus a column sum of squares": (lambda x: torch.softmax(x, 0) + (x * x).sum(0), (300, 70)),
    "softmax of the transposed input": (lambda x: torch.softmax(x.t(), 0), (70, 300)),
    # Passes outside the column block, at each element of the nest: their values are withdrawn.
    "softmax of a view whose reduced dim is innermost in memory": (lambda x: torch.softmax(x.as_strided((300, 70), (1, 300)), 0), (70, 300)),
    "softmax of a single column": (lambda x: torch.softmax(x, 0), (300, 1)),
    # Column blocks opened inside the loop over the rows (the passes read the row's index, or the
    # row has code of its own): the passes run again at each row, so nothing is kept (a kept exp
    # stored at every row overwrote the rows stored before: (x + 1) * softmax(x, 0) off by 0.9).
    "softmax times its input plus 1": (lambda x: (x + 1) * torch.softmax(x, 0), (300, 70)),
    "softmax times a row sum": (lambda x: torch.softmax(x, 0) * x.sum(1, keepdim=True), (300, 70)),
    "softmax over the middle dim": (lambda x: torch.softmax(x, 1), (4, 30, 70)),
    "softmax over the first two dims": (_softmax_over_two_dims, (4, 30, 70)),
    "normalized columns": (lambda x: (x - x.mean(0)) * ((x - x.mean(0)) ** 2).mean(0).add(1e-5).rsqrt(), (300, 70)),
}


# (bfloat16: its values are not kept, an output holds them rounded; not "as float64", which
# compares bf16's roundings of float values at float64's tolerance.)
@pytest.mark.parametrize(
    "name, dtype",
    [(n, d) for n in COLUMN_PASSES for d in (torch.float32, torch.float64, torch.bfloat16)
     if not (n == "softmax as float64" and d == torch.bfloat16)],
    ids=str,
)
def test_column_passes_keep_a_pass_value_in_an_output_and_agree_with_eager(name, dtype):
    fn, shape = COLUMN_PASSES[name]

    def make_args():
        g = torch.Generator().manual_seed(11)
        return [torch.randn(*shape, generator=g, device="cpu").to(device=torch.get_default_device(), dtype=dtype)]

    jitted = check_against_eager(fn, make_args)
    stats = jitted._cache.last_run_stats
    assert stats["interpreted_steps"] == 0 and stats["torch_steps"] == 0, stats


# Reductions over several dims (the CPU's passes: adjacent reduced dims taken as one linear
# position where the tensor is contiguous over them, merged_address; a loop over the outer ones
# around a pass over the innermost block where they are not adjacent, reduction's `nested`).
# Each runs on one jitted function with inputs laid out four ways, so that one kernel takes
# both its contiguous and its strided branch: contiguous, channels-last, h and w transposed in
# memory, and a slice of a wider tensor (contiguous over neither).
SEVERAL_DIMS = {
    "mean over h and w": (lambda x: x.mean((2, 3)), [(4, 6, 7, 20)]),
    "sum over c, h and w": (lambda x: x.sum((1, 2, 3)), [(4, 6, 7, 20)]),
    "batch norm's centring, over n, h and w": (lambda x: (x - x.mean((0, 2, 3), keepdim=True)) * 2, [(4, 6, 7, 20)]),
    "variance over n, h and w": (lambda x: x.var((0, 2, 3)), [(4, 6, 7, 20)]),
    "amax over n and w": (lambda x: x.amax((0, 3)), [(4, 6, 7, 20)]),
    "layer norm over h and w": (lambda x: torch.nn.functional.layer_norm(x, (7, 20)), [(4, 6, 7, 20)]),
    "mean over h and w of a product with an operand broadcast over w": (lambda x, y: (x * y).mean((2, 3)), [(4, 6, 7, 20), (1, 6, 7, 1)]),
    "mean over n, h and w of a product with an operand broadcast over h": (lambda x, y: (x * y).mean((0, 2, 3)), [(4, 6, 7, 20), (1, 6, 1, 20)]),
    "abs_ then a full amax (the pass stores)": (lambda x: (x.abs_(), x.amax())[1], [(4, 6, 7, 20)]),
    "mul_ then a sum over n, h and w": (lambda x: (x.mul_(2), x.sum((0, 2, 3)))[1], [(4, 6, 7, 20)]),
    # A slice inside the program: (c, h) merge where the input is contiguous, (h, w) never; a
    # full sum of a slice, its team over the rows of w (300,000 elements).
    "sum over c, h and a slice of w": (lambda x: x[..., :13].sum((1, 2, 3)), [(4, 6, 7, 20)]),
    "full sum of a slice": (lambda x: x[..., :500].sum(), [(2, 3, 100, 512)]),
    # A CPU reduction at each element reads the input in its memory order where its strides are
    # known: channels-last c innermost, a column block over c for a sum over (h, w), a pass along
    # c for a sum over c.
    "sum over c": (lambda x: x.sum(1), [(4, 6, 7, 20)]),
    "amax over c, h and w, and softmax over c": (lambda x: (x.amax((1, 2, 3)), torch.softmax(x, 1)), [(4, 6, 7, 20)]),
    "mean over h and w of a relu": (lambda x: x.relu().mean((2, 3)), [(4, 70, 7, 20)]),
}

LAYOUTS = {
    "contiguous": lambda t: t,
    "channels-last": lambda t: t.contiguous(memory_format=torch.channels_last),
    "h and w transposed": lambda t: t.transpose(2, 3).contiguous().transpose(2, 3),
    "slice of a wider tensor": lambda t: torch.cat([t, torch.zeros_like(t[..., :3])], -1)[..., : t.shape[-1]],
}


# A row per element (one output a row; CUDA's unit_row_threads): its threads a power of 2 by the
# row's length, rows of a few vectors packed several to a warp (a lane past the last row computes
# it again and stores nothing), each thread's loads the widest vector that divides the row, the
# last trip bounded where the threads do not divide it. 33 rows leave the last warp part full;
# the lengths reach every rule (3 x 3 to 56 x 56; 5 x 60 in bf16 takes vectors of 4, not 8), in
# every layout (the merged row read as vectors, or divided).
ROW_PER_ELEMENT_SIDES = [(3, 3), (7, 7), (1, 30), (14, 14), (5, 60), (28, 28), (3, 100), (56, 56)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("sides", ROW_PER_ELEMENT_SIDES, ids=str)
def test_row_per_element_at_every_length_agrees_with_eager_in_every_layout(sides, dtype):
    def mean_and_sum(x):
        return x.mean((2, 3)), (x * 2).sum(-1)

    jitted = kiln.jit(mean_and_sum)
    for lay_out in LAYOUTS.values():
        check_against_eager(mean_and_sum, lambda: [lay_out(_randn(3, 11, *sides, dtype=dtype))], jitted=jitted)


@pytest.mark.parametrize("name", SEVERAL_DIMS)
def test_reductions_over_several_dims_agree_with_eager_in_every_layout(name):
    fn, shapes = SEVERAL_DIMS[name]
    jitted = kiln.jit(fn)
    for layout, lay_out in LAYOUTS.items():

        def make():
            return [lay_out(_randn(*s, seed=k)) for k, s in enumerate(shapes)]

        check_against_eager(fn, make, jitted=jitted)


# Reductions over one or several dims of inputs in random layouts: the dims reduced, the layout
# (a slice of a wider tensor along any dims, permuted strides, channels-last, a dim broadcast by
# expand, an offset view), a slice inside the program, and an in-place write before the
# reduction (its pass stores it) drawn from a seed. A CPU pass over several dims takes a merged form (one
# position over dims the input is contiguous over) or a divided form (a loop over the innermost
# reduced dim inside one over the others), chosen by the strides at run time; a merge of only
# some of its dims reads right in both. Where the strides are known (a caller's strided tensor),
# a reduction at each element reads in memory order: a column block over the innermost kept dim,
# or a pass along the innermost reduced one. A fixed set of seeds; KILN_SEVERAL_DIMS_SEEDS for
# more.
SEVERAL_DIMS_SEEDS = range(int(os.environ.get("KILN_SEVERAL_DIMS_SEEDS", "40")))

_SEVERAL_DIMS_OPS = ["sum", "mean", "amax", "amin", "var", "sum_of_product", "argmax_of_flat", "mul_then_sum", "abs_then_amax"]


def _random_layout(rng: random.Random, shape: tuple[int, ...], seed: int, dtype) -> torch.Tensor:
    choice = rng.choice(["contiguous", "wider", "permuted", "channels_last", "expanded", "offset"])
    if choice == "wider":  # a slice of a tensor wider along some dims
        wide = [s + rng.choice([0, 1, 3]) for s in shape]
        return _randn(*wide, dtype=dtype, seed=seed)[tuple(slice(0, s) for s in shape)]
    if choice == "permuted":
        order = list(range(len(shape)))
        rng.shuffle(order)
        base = _randn(*[shape[d] for d in order], dtype=dtype, seed=seed)
        return base.permute(*[order.index(d) for d in range(len(shape))])
    if choice == "channels_last" and len(shape) == 4:
        return _randn(*shape, dtype=dtype, seed=seed).contiguous(memory_format=torch.channels_last)
    if choice == "expanded":  # one dim of 1 broadcast (a stride of 0)
        d = rng.randrange(len(shape))
        small = list(shape)
        small[d] = 1
        return _randn(*small, dtype=dtype, seed=seed).expand(*shape)
    if choice == "offset":
        return _randn(shape[0] + 1, *shape[1:], dtype=dtype, seed=seed)[1:]
    return _randn(*shape, dtype=dtype, seed=seed)


@pytest.mark.parametrize("seed", SEVERAL_DIMS_SEEDS)
def test_random_reductions_over_several_dims_agree_with_eager(seed):
    rng = random.Random(seed)
    rank = rng.choice([3, 4])
    shape = tuple(rng.choice([1, 2, 3, 5, 7, 8, 13, 20, 27]) for _ in range(rank))
    dims = tuple(sorted(rng.sample(range(rank), rng.randint(1, rank))))
    keepdim = rng.random() < 0.3
    dtype = rng.choice([torch.float32, torch.float32, torch.bfloat16])
    op = rng.choice(_SEVERAL_DIMS_OPS)
    inner_slice = rng.random() < 0.3  # a slice of the last dim inside the program
    writes = op in ("mul_then_sum", "abs_then_amax")

    def fn(x, y):
        if inner_slice:
            x = x[..., : max(x.shape[-1] - 1, 1)]
            y = y[..., : max(y.shape[-1] - 1, 1)]
        if op == "sum_of_product":
            return (x * y).sum(dims, keepdim=keepdim)
        if op == "argmax_of_flat":
            return x.sum(dims, keepdim=keepdim), x.flatten().argmax()
        if op == "mul_then_sum":
            x.mul_(2)
            return x.sum(dims, keepdim=keepdim)
        if op == "abs_then_amax":
            x.abs_()
            return x.amax(dims, keepdim=keepdim)
        if op == "var":
            return x.var(dims, keepdim=keepdim)
        return getattr(x, op)(dims, keepdim=keepdim)

    def make():
        r = random.Random(seed)  # the same layouts for kiln's arguments and eager's
        x = _random_layout(r, shape, 2 * seed, dtype)
        if writes and x.stride().count(0) > 0:
            x = x.contiguous()  # (an in-place write into an expanded tensor raises in eager)
        return [x, _random_layout(r, shape, 2 * seed + 1, dtype)]

    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
    check_against_eager(fn, make, **tolerance)


# A CPU pass takes the reduced dims in their memory order where the strides are known (a
# caller's permuted tensor): its inner loop along the smallest stride, and one position over
# dims the input is contiguous over in that order. The sum of a permuted tensor and one of
# another layout reads each in its own form; argmax's position stays row-major.
MEMORY_ORDER = {
    "hw transposed mean": ((6, 5, 12, 9), (0, 1, 3, 2), (2, 3)),
    "batch norm stats of a transposed image": ((4, 3, 10, 7), (0, 1, 3, 2), (0, 2, 3)),
    "nchw viewed from nhwc over c, h, w": ((3, 8, 6, 5), (0, 2, 3, 1), (1, 2, 3)),
    "reversed dims, full": ((5, 7, 9), (2, 1, 0), (0, 1, 2)),
    "reversed dims, two of three": ((5, 7, 9), (2, 1, 0), (1, 2)),
    "rotated, outer two": ((6, 4, 11), (1, 2, 0), (0, 1)),
}


@pytest.mark.parametrize("name", MEMORY_ORDER)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_reductions_of_permuted_inputs_agree_with_eager(name, dtype):
    shape, order, dims = MEMORY_ORDER[name]

    def permuted(seed):  # a tensor of `shape` whose memory runs in `order`
        base = _randn(*[shape[d] for d in order], seed=seed)
        if dtype == torch.int64:
            base = (base * 10).to(torch.int64)
        return base.permute(*[order.index(d) for d in range(len(shape))])

    def contiguous(seed):
        return permuted(seed).contiguous()

    def fn(x, y):
        if dtype == torch.int64:
            return x.sum(dims), (x + y).sum(dims), x.amax(dims), x.flatten().argmax()
        return x.mean(dims), (x + y).sum(dims), x.var(dims), x.amin(dims), x.flatten().argmax()

    check_against_eager(fn, lambda: [permuted(0), contiguous(1)])
    check_against_eager(fn, lambda: [contiguous(0), permuted(1)])
    check_against_eager(fn, lambda: [permuted(0), permuted(1)])


# A value the kernel computes at two places must be the same value: y = softmax(softmax(x, 0), 0)
# read at each column and at a gathered one (y.index_select(1, idx), idx reversed) sums each column
# twice in one kernel, once in the nest's column block and once in a pass at the gathered element.
# Eager computes y once, so y.index_add(1, idx, -y[:, idx]) is exactly 0 and the remainder by it
# NaN; the two sums in different orders (float chunks in the block, double in the pass) left an
# ulp here and there, and a 0 where eager has NaN (kiln_fuzz program 5778650035662575516).
@pytest.mark.parametrize("rows", [5, 20, 40, 100])
def test_a_sum_computed_twice_in_a_kernel_is_one_value(rows):
    def fn(x):
        y = torch.softmax(torch.softmax(x, 0), 0)
        idx = torch.arange(x.shape[1] - 1, -1, -1)
        gathered = y.index_select(1, idx)
        return torch.remainder(gathered, y.index_add(1, idx, -gathered))

    jitted = kiln.jit(fn)
    for seed in range(6):
        x = _randn(rows, 10, seed=seed)
        want = fn(x)
        assert torch.isnan(want).all()
        got = jitted(x)
        assert torch.isnan(got).all(), (rows, seed, (~torch.isnan(got)).sum().item())
