"""Writes into part of an input and results a kernel stores where the caller sees them, against
eager: a write through a strided view, a value scattered into a slice or a row of an input (by
the kernel that computes it, or by a copy after it, and never more of the input than eager
writes), rows normalized in place, and a buffer a kernel stored into that later steps read.
"""

from __future__ import annotations

import re

import pytest
import torch

import kiln
from against_eager import check_against_eager
from test_cases import ar

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


def test_write_through_a_strided_view_is_one_kernel_that_stores_in_place():
    def view(x):
        v = x[:, ::2]
        v.mul_(0.5)
        return x * 2 + 1

    jitted = check_against_eager(view, lambda: [ar(5, 8)])
    stats = kiln.last_stats(jitted)
    assert (stats["fusion_regions"], stats["kernels"], stats["writebacks_in_kernel"]) == (1, 1, 1)
    assert jitted._cache.last_run_stats["writebacks_copied"] == 0


def _window_writes(jitted) -> list[str]:
    # The plan's writes into part of an input: "... # writes x[slice 1, 0:2] <- t8", by the region
    # that computes the value or by a copy step (writeback(t8)).
    lines = kiln.last_traces(jitted)[-1].splitlines()
    return [line.strip() for line in lines if re.search(r"# writes \w+\[", line)]


@pytest.mark.parametrize(
    "name, fn, make_args, in_kernel",
    [
        # the row's passes read x[i, :2] before the row stores into it (row-local loads)
        ("softmax into a slice", lambda x: x.__setitem__((slice(None), slice(None, 2)), torch.softmax(x[:, :2], -1)), lambda: [ar(4, 8)], True),
        # the kernel reads x[i, j] and would store x[i, 6 + j]: copied after it
        ("negative start", lambda x: x.__setitem__((slice(None), slice(-2, None)), x[:, :2].tanh()), lambda: [ar(4, 8)], False),
        ("strided rows and columns", lambda x, y: x.__setitem__((slice(1, None), slice(None, None, 4)), torch.softmax(y, 0)), lambda: [ar(4, 16), ar(3, 4)], True),
        ("a selected row", lambda x: x.__setitem__(2, x[0].sin()), lambda: [ar(4, 8)], False),
        # x is a synthetic base (a transposed view): the kernel reads a copy of its storage
        ("a column of a transposed input", lambda x: x.__setitem__((slice(None), 1), x[:, 0] * 2), lambda: [ar(8, 4).t()], True),
    ],
)
def test_a_write_into_part_of_an_input_writes_only_that_part(name, fn, make_args, in_kernel):
    # The region of slice_scatter / select_scatter nodes alone is not run (it would rewrite all of
    # x): the region that computes the new values stores them into the part of x they replace,
    # where its loads of x allow (kernel.h, row-local loads), else they are copied there after it.
    # (Not yet on CUDA, where every one of these is copied: place_writebacks.cpp.)
    jitted = check_against_eager(fn, make_args)
    trace = kiln.last_traces(jitted)[-1]
    assert len(_window_writes(jitted)) == 1, trace
    assert "_scatter" not in trace, trace
    stats = jitted._cache.last_run_stats
    in_kernel = in_kernel and torch.get_default_device().type == "cpu"
    assert (stats["writebacks_in_kernel"], stats["writebacks_copied"]) == ((1, 0) if in_kernel else (0, 1)), trace


def test_a_write_into_part_of_an_input_through_an_aliasing_argument():
    # y is a view of x's storage: the writeback goes to the group's base, the window inside it.
    def f(x, y):
        x[:, :2] = y[:, :2].exp()

    def make_args():
        x = ar(4, 8)
        return [x, x[:, 4:]]

    jitted = check_against_eager(f, make_args)
    assert len(_window_writes(jitted)) == 1, kiln.last_traces(jitted)[-1]


def test_a_write_of_an_argument_into_part_of_another_one_that_it_then_changes():
    # The copies run last; y's old contents are gone by then (its own writeback), so the write of
    # y into x stays in the region that reads y first.
    def f(x, y):
        x[-1] = y
        y.tanh_()
        return y, x

    jitted = check_against_eager(f, lambda: [ar(3, 4), ar(4)])
    assert _window_writes(jitted) == []


@pytest.mark.parametrize("aliased", [False, True], ids=["separate", "one storage"])
def test_a_tensor_written_in_part_and_then_copied_whole_into_another(aliased):
    # One value is the writeback of two targets: b's (its last row changed) and a's (all of the
    # new b). The write of b's window alone must not stand for a's copy: a once kept its old
    # contents without an error (a fresh seed of the C++ random programs, 2026-12-04).
    def f(a, b):
        b[-1] = -2.5
        a.copy_(b)

    def make_args():
        if not aliased:
            return [ar(5, 2), ar(5, 2) + 100]
        buf = ar(30)
        return [buf[20:].view(5, 2), buf[10:20].view(5, 2)]

    check_against_eager(f, make_args)


def test_a_written_slice_whose_whole_result_is_also_read_is_not_narrowed():
    # The new x is read after the write (by the sum and through the aliasing y): the region that
    # makes it stays, and stores all of x.
    def f(x, y):
        x[:, :2] = y[:, :2].exp()
        return x.sum(-1), y * 1

    def make_args():
        x = ar(4, 8)
        return [x, x[:, 4:]]

    jitted = check_against_eager(f, make_args)
    assert _window_writes(jitted) == []


@pytest.mark.parametrize("length", [600, 2048, 3000, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_statistics_over_rows_of_many_lengths(length, dtype):
    # On CUDA the rows run a block of 128 or 256 threads each, hold up to 16 elements a thread in
    # registers, and may not fill their last trip (600, 3000); at 5000 a thread has too many
    # elements to hold. (The std's and amax's [3, 1] nests are rows with one element.)
    def f(x, w, b):
        y = x - x.mean(-1, keepdim=True)
        y.mul_(w).add_(b)
        return y, x.softmax(-1), x.std(-1), x.amax(-1, keepdim=True), (x * x).sum(-1, keepdim=True)

    def make_args():
        g = torch.Generator().manual_seed(length)
        x, w, b = (torch.randn(s, generator=g, device="cpu") for s in ((3, length), (length,), (length,)))
        return [t.to(device=torch.get_default_device(), dtype=dtype) for t in (x, w, b)]

    check_against_eager(f, make_args)


@pytest.mark.parametrize("length", [512, 1024])
def test_row_statistics_of_rows_that_are_not_aligned_or_contiguous(length):
    # x's rows start at odd offsets and w's elements are strided: on CUDA the row cache then loads
    # them element by element instead of as vectors; the result x - mean is stored into x itself.
    def f(x, w):
        y = x * w
        x.sub_(y.mean(-1, keepdim=True))
        return y.softmax(-1)

    def make_args():
        g = torch.Generator().manual_seed(length)
        base = torch.randn(5, length + 1, generator=g, device="cpu").to(torch.get_default_device())
        w = torch.randn(length, 2, generator=g, device="cpu").to(torch.get_default_device())
        return [base[:, 1:], w[:, 1]]

    check_against_eager(f, make_args)


@pytest.mark.parametrize("length", [8, 512, 1024, 3000, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_softmax_stored_into_the_slice_it_reads(length, dtype):
    # The bench's softmax slice at several row lengths: one kernel reads each row of x[:, :length]
    # in its max and sum passes and stores the softmax into that slice, in place (a warp a row up
    # to 512 elements, a block of 128 or 256 threads above; at 5000 the row is not held in
    # registers, so the last loop loads x again at the element it stores). Many rows, so that
    # rows run at once; the columns after the slice must keep their values. (Not yet on CUDA,
    # where the slice is copied, or a second region stores all of x: place_writebacks.cpp.)
    def f(x):
        x[:, :length] = torch.softmax(x[:, :length], -1)

    def make_args():
        g = torch.Generator().manual_seed(length)
        x = torch.randn(300, length + 24, generator=g, device="cpu")
        return [x.to(device=torch.get_default_device(), dtype=dtype)]

    jitted = check_against_eager(f, make_args)
    stats = jitted._cache.last_run_stats
    assert stats["interpreted_steps"] == 0
    if torch.get_default_device().type == "cpu":
        assert (stats["kernel_steps"], stats["writebacks_in_kernel"], stats["writebacks_copied"]) == (1, 1, 0)


@pytest.mark.parametrize(
    "name, fn",
    [
        ("center", lambda x: x.sub_(x.mean(-1, keepdim=True))),
        ("standardize", lambda x: x.sub_(x.mean(-1, keepdim=True)).div_(x.std(-1, keepdim=True))),
        ("softmax in place", lambda x: x.copy_(torch.softmax(x * 2, -1))),
        ("rms norm in place", lambda x: x.mul_(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))),
    ],
)
def test_a_row_normalized_in_place_is_stored_by_its_kernel(name, fn):
    # Every reduction reads the row it normalizes, before the row stores anything: on the CPU the
    # kernel stores into x itself (place_writebacks' row-local rule), with no copy after it. (Not
    # yet on CUDA, where the value is copied into x: place_writebacks.cpp.)
    def make_args():
        g = torch.Generator().manual_seed(7)
        return [torch.randn(64, 300, generator=g, device="cpu").to(torch.get_default_device())]

    jitted = check_against_eager(fn, make_args)
    stats = jitted._cache.last_run_stats
    assert stats["interpreted_steps"] == 0
    if torch.get_default_device().type == "cpu":
        assert (stats["writebacks_in_kernel"], stats["writebacks_copied"]) == (1, 0), kiln.last_traces(jitted)[-1]


@pytest.mark.parametrize("later_write", [False, True])
def test_a_buffer_written_in_place_is_read_later_where_its_kernel_stored_it(later_write):
    # A KV cache after its index_copy_ is read by the attention's product, a later step: the
    # kernel stored it into the caller's cache, and the product reads it there (a copy of the
    # whole cache per layer and token, before). Where a later step writes the cache again, the
    # product must still see the value it read in eager.
    def f(cache, pos, k, q):
        cache.index_copy_(0, pos, k * 2)
        scores = q @ cache.t()
        if later_write:
            cache.mul_(scores.mean())
        return scores.softmax(-1)

    def make_args():
        g = torch.Generator().manual_seed(3)
        args = [torch.randn(16, 32, generator=g, device="cpu"), torch.tensor([5], device="cpu"),
                torch.randn(1, 32, generator=g, device="cpu"), torch.randn(4, 32, generator=g, device="cpu")]
        return [a.to(torch.get_default_device()) for a in args]

    jitted = check_against_eager(f, make_args)
    if not later_write:
        assert jitted._cache.last_run_stats["layout_copies"] == 0, kiln.last_traces(jitted)[-1]


# ---- index writes stored in place: the scatter nest (codegen/schedule_scatter.cpp) ---------------


def _on_device(*tensors):
    return [t.to(torch.get_default_device()) for t in tensors]


def _decode_write(cache, pos, qkv, q):
    # A decode step's cache write: the new key, a view of the projection, stored at one position;
    # the attention then reads the whole cache.
    k = qkv.view(1, 3, 4, 1, 8)[:, 1] * 0.5
    cache.index_copy_(2, pos, k)
    return (q @ cache.transpose(-1, -2)).softmax(-1)


def _tanh_rows(cache, pos, k):
    cache.index_copy_(0, pos, k.tanh())


def _index_put_rows(cache, pos, k):
    cache[pos] = k + 1


def _two_positions(x, i, s):
    x.index_copy_(0, i, s)
    return x


_SCATTER_WRITES = {
    # name: (fn, make_args)
    "one position of a decode cache": (_decode_write, lambda: _on_device(torch.zeros(1, 4, 16, 8), torch.tensor([5]), ar(1, 1, 96), ar(1, 4, 1, 8))),
    "a cache of rows written with its source's tanh": (_tanh_rows, lambda: _on_device(ar(16, 8), torch.tensor([3]), ar(1, 8))),
    "x[i] = v of two rows": (_index_put_rows, lambda: _on_device(ar(10, 6), torch.tensor([7, 2]), ar(2, 6))),
    "a cache of bfloat16": (_tanh_rows, lambda: _on_device(ar(16, 8).bfloat16(), torch.tensor([9]), ar(1, 8).bfloat16())),
}


@pytest.mark.parametrize("name", _SCATTER_WRITES)
def test_an_index_write_stored_in_place_is_stored_by_its_kernel(name):
    # The region's kernel stores into the caller's tensor itself, with no copy after it;
    # everything else is as eager's. (Which form the kernel has, the scatter over the positions or
    # the gather over the whole tensor, the lit tests check: cpu_index_copy_scatter_kernel.trace.)
    fn, make_args = _SCATTER_WRITES[name]
    jitted = check_against_eager(fn, make_args)
    stats = jitted._cache.last_run_stats
    assert (stats["writebacks_in_kernel"], stats["writebacks_copied"], stats["layout_copies"]) == (1, 0, 0), kiln.last_traces(jitted)[-1]


def test_an_index_write_stored_in_place_keeps_the_last_of_a_repeated_position():
    # Eager on the CPU copies the positions in order (on CUDA which one lands is unspecified, so
    # the comparison is the CPU's): the scatter nest walks them in order in one iteration.
    if torch.get_default_device().type != "cpu":
        pytest.skip("eager's result for a repeated position is unspecified on CUDA")
    jitted = check_against_eager(_two_positions, lambda: [ar(8, 4), torch.tensor([3, 5, 3]), ar(3, 4) + 100])
    assert jitted._cache.last_run_stats["writebacks_in_kernel"] == 1


def test_an_index_write_stored_in_place_out_of_range_raises_and_leaves_the_tensor_untouched():
    x = ar(8, 4).to(torch.get_default_device())
    jitted = kiln.jit(_two_positions)
    jitted(x.clone(), torch.tensor([1], device=x.device), ar(1, 4).to(x.device))  # compiled, runs
    with pytest.raises(kiln.IndexOutOfRangeError, match=r"index_copy .*index 9 is out of bounds"):
        jitted(x, torch.tensor([9], device=x.device), ar(1, 4).to(x.device))
    torch.testing.assert_close(x, ar(8, 4).to(x.device))


def test_an_index_write_whose_source_overlaps_its_tensor_raises_as_eager():
    # The source a view of the written tensor's own memory: eager refuses the write; kiln must
    # not write part of it.
    def make_args():
        buf = ar(20, 4).to(torch.get_default_device())
        return [buf[:16], torch.tensor([5], device=buf.device), buf[2:3]]

    args = make_args()
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        _two_positions(*args)
    args = make_args()
    before = args[0]._base.clone()
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        kiln.jit(_two_positions)(*args)
    torch.testing.assert_close(args[0]._base, before)


def test_a_decode_loop_writes_every_position_of_its_cache_as_eager():
    # Position after position into one cache, the compiled program reused: the cache after each
    # call is eager's, and every call stores in its kernel.
    def step(cache, pos, k):
        cache.index_copy_(1, pos, k * 2)
        return cache.sum(1)

    cache, eager_cache = _on_device(torch.zeros(2, 12, 4), torch.zeros(2, 12, 4))
    jitted = kiln.jit(step)
    for p in range(12):
        pos, k = _on_device(torch.tensor([p]), ar(2, 1, 4) + p)
        torch.testing.assert_close(jitted(cache, pos, k), step(eager_cache, pos.clone(), k.clone()))
        torch.testing.assert_close(cache, eager_cache)


@pytest.mark.parametrize("seed", range(24))
def test_random_index_writes_stored_in_place_agree_with_eager(seed):
    # Index writes of drawn ranks, dims, sizes and positions into a tensor the caller sees, their
    # sources computed from another argument (elementwise, transposed, or as it is), sometimes
    # followed by a read of the whole tensor: the scatter nest where it applies, the gather where
    # not, each against eager.
    # The draws run on the CPU's generator whatever the test device is; _on_device moves the
    # arguments.
    g = torch.Generator().manual_seed(seed)

    def draw(n):
        return int(torch.randint(0, n, (1,), generator=g, device="cpu"))

    rank = 1 + draw(4)
    shape = [2 + draw(5) for _ in range(rank)]
    dim = draw(rank)
    shape[dim] = 4 + draw(12)
    count = 1 + draw(shape[dim] // 2)
    # Repeated positions only where eager's result is specified (the CPU copies them in order).
    repeated = torch.get_default_device().type == "cpu" and draw(3) == 0
    positions = (
        torch.randint(0, shape[dim], (count,), generator=g, device="cpu")
        if repeated
        else torch.randperm(shape[dim], generator=g, device="cpu")[:count]
    )
    source_shape = list(shape)
    source_shape[dim] = count
    transposed = rank >= 2 and draw(2) == 0
    dtype = [torch.float32, torch.bfloat16, torch.int64][draw(3)]
    form, read_after = draw(3), draw(2) == 0

    def f(x, i, y):
        s = y.transpose(0, 1) if transposed else y
        s = s * 3 - 1 if form == 0 else (s.abs() if form == 1 else s)
        x.index_copy_(dim, i, s.to(x.dtype))
        return x.sum(0) if read_after else None

    def make_args():
        y_shape = [source_shape[1], source_shape[0], *source_shape[2:]] if transposed else source_shape
        x = (torch.arange(0, torch.Size(shape).numel(), device="cpu") % 7).reshape(shape).to(dtype)
        y = (torch.arange(0, torch.Size(y_shape).numel(), device="cpu") % 5 + 10).reshape(y_shape).to(dtype)
        return _on_device(x, positions.clone(), y)

    check_against_eager(f, make_args)
