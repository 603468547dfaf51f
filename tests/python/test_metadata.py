"""kiln's own result-metadata rules for elementwise ops (python/kiln/_metadata.py), checked
against eager: for each op, dtype pair and layout, the dtype, shape and layout the rules give
must be those of the eager result on real tensors. And a first call must not need PyTorch's
Python meta kernels, whose first use imports torch._dynamo (seconds)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln._metadata import elementwise_result, mean_result
from kiln._tracer import Proxy


def as_proxy(t: torch.Tensor) -> Proxy:
    """A proxy with t's dtype, sizes, strides and storage offset, as the tracer makes one."""
    storage = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device="meta")
    meta = storage.as_strided(t.shape, t.stride(), t.storage_offset())
    p = meta.as_subclass(Proxy)
    p._kiln_device = t.device
    return p


def layout(t: torch.Tensor) -> tuple:
    # Strides of size-1 dims never move a pointer (see _metadata._layout_strides).
    return (t.dtype, tuple(t.shape), tuple(s for n, s in zip(t.shape, t.stride()) if n != 1))


def real(shape_or_layout, dtype: torch.dtype) -> torch.Tensor:
    """Real CPU tensors in the layouts the rules distinguish."""
    kind, shape = shape_or_layout
    if dtype == torch.bool:  # no zeros anywhere: integer division by zero raises in eager
        base = torch.ones(shape, dtype=torch.bool)
    elif dtype.is_floating_point:
        base = torch.rand(shape, dtype=dtype) + 0.5
    else:
        base = torch.randint(1, 5, shape, dtype=dtype)
    if kind == "contiguous":
        return base
    if kind == "transposed":
        return base.t().contiguous().t()
    if kind == "strided":
        return torch.cat([base, base], -1)[..., ::2]
    if kind == "expanded":
        return base[..., :1].expand(shape)
    if kind == "channels_last":
        return base.contiguous(memory_format=torch.channels_last)
    if kind == "permuted":
        return base.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    raise AssertionError(kind)


LAYOUTS_2D = [("contiguous", (3, 4)), ("transposed", (3, 4)), ("strided", (3, 4)), ("expanded", (3, 4)), ("contiguous", (1, 4)), ("contiguous", (3, 1)), ("contiguous", ()), ("contiguous", (4,))]
LAYOUTS_4D = [("contiguous", (2, 3, 2, 5)), ("channels_last", (2, 3, 2, 5)), ("permuted", (2, 3, 2, 5)), ("contiguous", (1, 3, 1, 5))]
DTYPES = [torch.bool, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64]


def check(func, *args, **kwargs) -> None:
    """The rules' answer for func(*args) equals eager's result, or the rules decline (None)
    where eager raises."""
    proxies = [as_proxy(a) if isinstance(a, torch.Tensor) else a for a in args]
    fast = elementwise_result(func, tuple(proxies), kwargs, Proxy)
    try:
        expected = func(*args, **kwargs)
    except Exception:
        assert fast is None, f"{func.__name__} raises in eager but the rules gave {fast}"
        return
    if fast is None:
        return  # declined: the tracer asks the meta kernels
    in_place = [p for a, p in zip(args, proxies) if expected is a]
    if in_place:
        assert fast is in_place[0], f"{func.__name__} works in place in eager, not in the rules"
        return
    assert not isinstance(fast, Proxy)
    assert layout(fast) == layout(expected), (func.__name__, [layout(a) for a in args if isinstance(a, torch.Tensor)])


@pytest.mark.parametrize("func", [torch.add, torch.mul, torch.div, torch.sub, torch.maximum, torch.eq, torch.pow, torch.remainder, torch.bitwise_and, torch.atan2])
def test_binary_ops_promote_and_lay_out_as_eager(func):
    for (la, lb), (da, db) in itertools.product(itertools.product(LAYOUTS_2D, repeat=2), itertools.product(DTYPES, repeat=2)):
        check(func, real(la, da), real(lb, db))


@pytest.mark.parametrize("scalar", [2, 2.5, True])
@pytest.mark.parametrize("func", [torch.add, torch.mul, torch.div, torch.pow, torch.Tensor.__rsub__, torch.Tensor.__rmod__, torch.Tensor.__rtruediv__, torch.Tensor.__rpow__])
def test_tensor_and_scalar(func, scalar):
    for lay, dtype in itertools.product(LAYOUTS_2D, DTYPES):
        check(func, real(lay, dtype), scalar)


def test_a_number_to_a_tensor_power_is_contiguous_as_in_eager():
    for lay, dtype in itertools.product(LAYOUTS_2D, DTYPES):
        check(torch.pow, 2.5, real(lay, dtype))
        check(torch.pow, 2, real(lay, dtype))


@pytest.mark.parametrize("func", [torch.tanh, torch.exp, torch.neg, torch.abs, torch.sqrt, torch.sigmoid, torch.floor, torch.logical_not, torch.isnan, torch.nn.functional.gelu])
def test_unary_ops(func):
    for lay, dtype in itertools.product(LAYOUTS_2D + LAYOUTS_4D, DTYPES):
        check(func, real(lay, dtype))


def test_four_dimensional_layouts_mix_as_in_eager():
    for la, lb in itertools.product(LAYOUTS_4D, repeat=2):
        check(torch.add, real(la, torch.float32), real(lb, torch.float16))
        check(torch.where, real(la, torch.bool), real(lb, torch.float32), real(la, torch.float32))


def test_in_place_forms_return_the_written_tensor_and_check_the_cast_and_shape():
    for lay, (da, db) in itertools.product(LAYOUTS_2D, itertools.product(DTYPES, repeat=2)):
        # (a fresh target each time: eager writes into it)
        check(torch.Tensor.mul_, real(("contiguous", (3, 4)), da), real(lay, db))
        if lay[0] != "expanded":  # (writing into an expanded tensor is the lowering rule's check)
            check(torch.Tensor.add_, real(lay, da), real(("contiguous", (3, 4)), db))
    check(torch.Tensor.addcmul_, real(("transposed", (3, 4)), torch.float32), real(("contiguous", (3, 4)), torch.float32), real(("contiguous", (4,)), torch.float32), value=0.5)


def test_ternary_ops():
    for la, lb, lc in itertools.product(LAYOUTS_2D[:5], repeat=3):
        check(torch.where, real(la, torch.bool), real(lb, torch.float32), real(lc, torch.bfloat16))
        check(torch.lerp, real(la, torch.float32), real(lb, torch.float32), real(lc, torch.float32))
        check(torch.addcdiv, real(la, torch.float16), real(lb, torch.float16), real(lc, torch.float16), value=2)
        check(torch.clamp, real(la, torch.float32), real(lb, torch.float32), real(lc, torch.float32))


def test_mean_has_the_metadata_of_eager_mean():
    for lay, dtype in itertools.product(LAYOUTS_2D[:4], [torch.float16, torch.bfloat16, torch.float32, torch.float64]):
        x = real(lay, dtype)
        for args, kwargs in [((x, -1), {"keepdim": True}), ((x, 0), {}), ((x,), {}), ((x, [0, 1]), {"dtype": torch.float64})]:
            fast = mean_result(torch.mean, (as_proxy(x), *args[1:]), kwargs, Proxy)
            assert layout(fast) == layout(torch.mean(*args, **kwargs))
    assert mean_result(torch.mean, (as_proxy(real(LAYOUTS_2D[0], torch.int64)), -1), {}, Proxy) is None  # eager raises


@pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")
def test_a_first_call_does_not_import_dynamo(tmp_path):
    # The benchmark's workloads (bench/bench.py), each traced and run once in a fresh process.
    bench_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
    program = textwrap.dedent(
        f"""
        import sys, torch, kiln
        sys.path.insert(0, {bench_dir!r})
        from bench import normalization, rms_norm, s1, view

        x = torch.randn(4, 64, device=sys.argv[1])
        w = torch.randn(64, device=sys.argv[1])
        kiln.jit(s1)(x.clone())
        kiln.jit(normalization)(x, w, w)
        kiln.jit(rms_norm)(x, w)
        kiln.jit(view)(x.clone())
        print("torch._dynamo" in sys.modules)
        """
    )
    package_dir = os.path.dirname(os.path.dirname(kiln.__file__))
    env = dict(os.environ, KILN_CHECK_METADATA="0", KILN_CACHE_DIR=str(tmp_path), PYTHONPATH=package_dir)
    device = str(torch.empty(0).device)  # conftest.py: KILN_TEST_DEVICE
    done = subprocess.run([sys.executable, "-c", program, device], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# Copies into a named memory format (contiguous, clone, to, a cast): the result is laid out in
# that format as eager lays it out, or is the argument itself where eager returns it.
_FORMAT_COPIES = {
    "contiguous channels_last": lambda x: (x * 2).contiguous(memory_format=torch.channels_last),
    "clone channels_last": lambda x: x.clone(memory_format=torch.channels_last),
    "to channels_last": lambda x: x.to(memory_format=torch.channels_last),
    "to channels_last, then read": lambda x: x.to(memory_format=torch.channels_last) + 1,
    "cast into channels_last": lambda x: x.to(torch.float64, memory_format=torch.channels_last),
    "half into channels_last": lambda x: x.half(memory_format=torch.channels_last),
    "to contiguous_format": lambda x: x.to(memory_format=torch.contiguous_format),
    "slice into channels_last": lambda x: x[:, 1:].contiguous(memory_format=torch.channels_last),
    "into channels_last_3d": lambda x: x.unsqueeze(2).contiguous(memory_format=torch.channels_last_3d),
}


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "permuted"])
@pytest.mark.parametrize("name", list(_FORMAT_COPIES))
def test_a_copy_into_a_memory_format_is_laid_out_as_eager(name, layout):
    from against_eager import check_against_eager

    def make_args():
        torch.manual_seed(0)  # real() draws its values
        return [real((layout, (2, 3, 4, 5)), torch.float32).to(torch.get_default_device())]

    check_against_eager(_FORMAT_COPIES[name], make_args)


def test_a_memory_format_of_another_rank_raises_as_eager():
    with pytest.raises(RuntimeError, match="required rank 5 tensor"):
        kiln.jit(lambda x: x.contiguous(memory_format=torch.channels_last_3d))(torch.ones(2, 3, 4, 5))


# The ops kiln decomposes (softmax, log_softmax, layer_norm, rms_norm) return their results laid
# out as eager's do: ATen allocates softmax's and layer_norm's contiguous whatever the input's
# layout, and rms_norm's follows its elementwise ops. (kiln returned a channels-last softmax and
# layer norm of a channels-last input, where eager's are contiguous.)
_DECOMPOSED = {
    "softmax over channels": lambda x: torch.softmax(x, 1),
    "softmax over w": lambda x: torch.softmax(x, -1),
    "log_softmax over channels": lambda x: torch.log_softmax(x, 1),
    "layer_norm over h and w": lambda x: torch.nn.functional.layer_norm(x, (7, 20)),
    "layer_norm with weight and bias": lambda x: torch.nn.functional.layer_norm(x, (20,), torch.ones(20) * 2, torch.ones(20)),
    "rms_norm over h and w": lambda x: torch.nn.functional.rms_norm(x, (7, 20)),
}
_LAID_OUT = {
    "channels-last": lambda t: t.contiguous(memory_format=torch.channels_last),
    "h and w transposed": lambda t: t.transpose(2, 3).contiguous().transpose(2, 3),
    "a slice": lambda t: torch.cat([t, t], 1)[:, ::2],
    "channels-last, every other row": lambda t: torch.cat([t, t], 2).contiguous(memory_format=torch.channels_last)[:, :, ::2],
}


@pytest.mark.parametrize("layout", _LAID_OUT)
@pytest.mark.parametrize("name", _DECOMPOSED)
def test_decomposed_ops_lay_out_their_results_as_eager(name, layout):
    from against_eager import check_against_eager

    device = torch.empty(0).device
    make = lambda: [_LAID_OUT[layout](torch.randn(4, 6, 7, 20, generator=torch.Generator().manual_seed(0), device="cpu").to(device))]
    check_against_eager(_DECOMPOSED[name], make, rtol=1e-5, atol=1e-5)
