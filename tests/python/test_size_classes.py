"""A program called at a new row count compiles no new kernel while its schedules stay alike.

Every new shape is a new kiln program (traced and planned again), but a kernel's source keys the
kernel caches, and each nest reads its outermost extent at run time (codegen Kernel::extents):
a region whose schedules choose alike at two row counts (a size class: the same parallel loops,
the same split of rows across blocks) has one source there, compiled once. Each call is still
checked against eager PyTorch (values, in-place writes) at its own row count.

On the CPU every extent of a nest but its last is read at run time, and a join's bounds (a KV
cache's cat at every token count): the programs of INNER_PROGRAMS share their kernels across a
middle dim's sizes. (Inputs read through their storage, a channels-last one, keep their strides
in the text.)

Row counts of 9 to 13 lie in one size class on both targets (on the CPU far below a parallel
loop's work, on CUDA too few rows to fill the device). A reduction over the rows (a column sum, a
full reduction on the CPU) reads its length at run time too. A new row length changes the source:
the control case shows the counter counts.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from against_eager import check_against_eager

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


def _device() -> str:
    return torch.empty(0).device.type


def _loaded_anew() -> int:
    """Kernels this process compiled or read from the disk cache so far (not found loaded)."""
    stats = kiln.kernel_cache_stats()[_device()]
    return stats["compiled"] + stats["disk_hits"]


def _norm_gelu_residual(x, w, b, r):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) + r


def _softmax(x):
    return torch.softmax(x, -1)


def _scale_then_row_sum(x):
    x.mul_(2)
    return x.sum(-1)


def _strided_copy_then_sum(x, y):
    x[:, ::2].copy_(y)
    return x.sum(-1)


def _rms_norm_3d(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _broadcast_in_place(x, s, t):
    return x.mul_(s[:, None]).add_(t)


def _flattened_rows(x):
    return torch.tanh(x.reshape(-1, x.shape[-1])) * 0.5


def _batch_of_one_tokens(x, w, b):
    # [1, T, C]: the tokens of a batch of one are the rows
    return F.silu(F.layer_norm(x, (x.shape[-1],), w, b)) * 2


def _column_sum_and_mean(x):
    x.mul_(2)
    return x.sum(0), x.mean(0), x.amax(0)


def _full_amax(x):
    x.abs_()
    return x.amax()


# (function, maker of its arguments at R rows and a row length)
PROGRAMS = {
    "norm_gelu_residual": (_norm_gelu_residual, lambda R, C: [(R, C), (C,), (C,), (R, C)]),
    "softmax": (_softmax, lambda R, C: [(R, C)]),
    "scale_then_row_sum": (_scale_then_row_sum, lambda R, C: [(R, C)]),
    "strided_copy_then_sum": (_strided_copy_then_sum, lambda R, C: [(R, 2 * C), (R, C)]),
    "rms_norm_3d": (_rms_norm_3d, lambda R, C: [(R, 3, C), (C,)]),
    "broadcast_in_place": (_broadcast_in_place, lambda R, C: [(R, C), (R,), (C,)]),
    "flattened_rows": (_flattened_rows, lambda R, C: [(R, 5, C)]),
    "batch_of_one_tokens": (_batch_of_one_tokens, lambda R, C: [(1, R, C), (C,), (C,)]),
    "column_sum_and_mean": (_column_sum_and_mean, lambda R, C: [(R, C)]),
    "full_amax": (_full_amax, lambda R, C: [(R, C)]),
}
# A full reduction on CUDA runs as one cooperative row (a block's threads over all its elements),
# whose unrolled trips keep the length in the kernel's text: a new count compiles there.
CPU_ONLY_SHARING = {"full_amax"}


def _maker(shapes, seed):
    def make():
        gen = torch.Generator(device="cpu").manual_seed(seed)
        return [torch.randn(s, generator=gen, device="cpu").to(torch.empty(0).device) for s in shapes]

    return make


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_new_row_count_of_a_size_class_compiles_no_kernel(name):
    fn, shapes = PROGRAMS[name]
    if name in CPU_ONLY_SHARING and _device() != "cpu":
        pytest.skip("a CUDA full reduction's row keeps its length in the kernel's text")
    jitted = kiln.jit(fn)
    check_against_eager(fn, _maker(shapes(9, 48), 9), jitted, rtol=1e-4, atol=1e-4)
    before = _loaded_anew()
    for rows in (10, 11, 12, 13):
        check_against_eager(fn, _maker(shapes(rows, 48), rows), jitted, rtol=1e-4, atol=1e-4)
        assert kiln.last_stats(jitted)["kernels"] > 0, "the program ran compiled kernels"
    assert _loaded_anew() == before, f"{name}: a row count of the same size class compiled kernels"
    # The control: a new row length is new kernel text.
    check_against_eager(fn, _maker(shapes(9, 43), 43), jitted, rtol=1e-4, atol=1e-4)
    assert _loaded_anew() > before


def _heads_layout(x):
    # [1, T, H * D] -> [1, H, T, D]: the tokens are a middle dim
    return (x.view(1, x.shape[1], 4, 12).transpose(1, 2) * 0.5).contiguous()


def _kv_cache_cat(cache, new):
    # a dynamic KV cache's step: [1, H, T, D] and the new token's [1, H, 1, D] along T
    return torch.cat([cache, new * 2], dim=2)


def _sum_over_tokens(x):
    return torch.tanh(x).sum(1)


def _scale_each_token(x, w):
    # a value per token, broadcast along its features
    return x * w[:, None]


def _positional_embedding(x, pos):
    # [T, C] broadcast over the batch: a lane of the inner block
    return x + pos


# (function, maker of its arguments at T tokens): T is neither the first dim nor the last.
INNER_PROGRAMS = {
    "heads_layout": (_heads_layout, lambda T: [(1, T, 48)]),
    "kv_cache_cat": (_kv_cache_cat, lambda T: [(1, 4, T, 12), (1, 4, 1, 12)]),
    "sum_over_tokens": (_sum_over_tokens, lambda T: [(3, T, 48)]),
    "scale_each_token": (_scale_each_token, lambda T: [(3, T, 48), (T,)]),
    "positional_embedding": (_positional_embedding, lambda T: [(3, T, 48), (T, 48)]),
    # [1, T, C] (ViT's): a lane of the inner block past its dim of 1
    "positional_embedding_with_a_dim_of_1": (_positional_embedding, lambda T: [(3, T, 48), (1, T, 48)]),
}


# On the CPU a nest reads every extent but its last at run time, and a join its bounds: a
# program whose tokens are a middle dim compiles no kernel at a new token count of its class.
@pytest.mark.parametrize("name", sorted(INNER_PROGRAMS))
def test_a_new_inner_extent_of_a_size_class_compiles_no_kernel(name):
    if _device() != "cpu":
        pytest.skip("CUDA nests read only their outermost extent at run time")
    fn, shapes = INNER_PROGRAMS[name]
    jitted = kiln.jit(fn)
    check_against_eager(fn, _maker(shapes(9), 9), jitted, rtol=1e-4, atol=1e-4)
    before = _loaded_anew()
    for tokens in (10, 11, 12, 13):
        check_against_eager(fn, _maker(shapes(tokens), tokens), jitted, rtol=1e-4, atol=1e-4)
        assert kiln.last_stats(jitted)["kernels"] > 0, "the program ran compiled kernels"
    assert _loaded_anew() == before, f"{name}: a token count of the same size class compiled kernels"


def test_kernel_cache_stats_reports_each_target():
    stats = kiln.kernel_cache_stats()
    assert set(stats) == {"cpu", "cuda"}
    assert {"compiled", "disk_hits", "memory_hits"} <= set(stats["cpu"]) and set(stats["cuda"]) == {
        "compiled",
        "disk_hits",
        "memory_hits",
    }


# An operand broadcast over leading dims of 1 ([1, T, C], [1, C]) is read as a lane of the inner
# block where it is contiguous past them, and through its strides where not: the same kernel,
# both ways.
_LEADING_ONES_LAYOUTS = {
    "contiguous": lambda t: t,
    "transposed in memory": lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2),
    "every other column of a wider one": lambda t: torch.cat([t, t], -1)[..., ::2],
}


@pytest.mark.parametrize("shapes", [[(3, 9, 48), (1, 9, 48)], [(40, 64), (1, 64)]], ids=str)
def test_an_operand_with_leading_dims_of_1_agrees_with_eager_in_every_layout(shapes):
    fn = lambda x, m: torch.exp(x - m) * 2  # noqa: E731
    jitted = kiln.jit(fn)
    for name, lay_out in _LEADING_ONES_LAYOUTS.items():
        make = _maker(shapes, 3)
        check_against_eager(fn, lambda: [make()[0], lay_out(make()[1])], jitted, rtol=1e-5, atol=1e-5)
