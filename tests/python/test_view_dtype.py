"""Tensor.view(dtype) through kiln.jit against eager PyTorch: a view that reads its base's bytes as
another dtype of the same element size (kiln's view_dtype; functionalization replays it as a
bitcast on a read and casts the bytes back on a write). Outputs, inputs afterwards and aliasing
are compared by check_against_eager (test_jit.py); `check_bits` also compares every bit, since a
bit reinterpretation that went through a float conversion would change NaN payloads unseen by
assert_close(equal_nan=True).
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

import kiln
from against_eager import check_against_eager, tensors, whole_storage

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")

# An integer dtype of each float's size, to compare bits.
_BITS = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.int32: torch.int32,
    torch.int64: torch.int64,
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.dtype])


def check_bits(fn, make_args, arithmetic: tuple = ()) -> kiln.JitFunction:
    """check_against_eager, then another call (a cache hit) whose outputs and inputs, storages
    included, must equal eager's bit for bit. Outputs listed in `arithmetic` are compared by value
    only: a signaling NaN that goes through arithmetic keeps its bits in kiln's kernels (the
    compiler folds `x * 1`), where eager's quiets it; that holds with or without view(dtype)."""
    jitted = check_against_eager(fn, make_args)
    args, eager_args = make_args(), make_args()
    got, want = jitted(*args), fn(*eager_args)
    got_leaves, want_leaves = pytree.tree_leaves(got), pytree.tree_leaves(want)
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        if isinstance(w, torch.Tensor) and i not in arithmetic:
            assert g.dtype == w.dtype, f"output {i}"
            assert torch.equal(_bits(g), _bits(w)), f"output {i}: bits differ"
    for k, (a, e) in enumerate(zip(tensors(args), tensors(eager_args))):
        assert torch.equal(_bits(a), _bits(e)), f"input {k} afterwards: bits differ"
        assert torch.equal(_bits(whole_storage(a)), _bits(whole_storage(e))), f"storage of input {k}: bits differ"
    return jitted


def floats(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values with every kind of bit pattern: signs, zeros of both signs, infinities, NaN,
    subnormals and ordinary numbers."""
    special = [0.0, -0.0, 1.0, -2.5, float("inf"), float("-inf"), float("nan"), 3.0e-41, 1.0e-7, 65504.0]
    n = 1
    for s in shape:
        n *= s
    values = [special[i % len(special)] * (1 + i // len(special)) for i in range(n)]
    return torch.tensor(values, dtype=torch.float64).to(dtype).reshape(shape)


def ints(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Bit patterns that are floats of every kind when read as float32/float64, a signaling NaN
    (0x7f800001) and the largest int (which add_(1) wraps) among them."""
    if dtype == torch.int32:
        special = [0, 1, -1, 0x3F800000, 0x7F800000, 0x7F800001, 0x7FC00000, -0x00800000, 0x7FFFFFFF, 12345]
    else:
        special = [0, 1, -1, 0x3FF0000000000000, 0x7FF0000000000000, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF, 12345]
    n = 1
    for s in shape:
        n *= s
    return torch.tensor([special[i % len(special)] for i in range(n)], dtype=dtype).reshape(shape)


# ---- reads ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, to",
    [
        (lambda: floats(3, 4), torch.int32),
        (lambda: ints(3, 4), torch.float32),
        (lambda: floats(3, 4, dtype=torch.float64), torch.int64),
        (lambda: ints(3, 4, dtype=torch.int64), torch.float64),
        (lambda: floats(3, 4, dtype=torch.bfloat16), torch.float16),
        (lambda: floats(3, 4, dtype=torch.float16), torch.bfloat16),
        (lambda: floats(3, 4), torch.float32),
    ],
    ids=["f32-i32", "i32-f32", "f64-i64", "i64-f64", "bf16-f16", "f16-bf16", "f32-f32"],
)
def test_read_only_view(make, to):
    def f(x):
        y = x.view(to)
        return y.clone(), (y == y).sum(), x + 1

    check_bits(f, lambda: (make(),))


def test_read_feeds_arithmetic():
    def f(x):
        bits = x.view(torch.int32)
        exponent = bits.bitwise_and(0x7F800000)
        return exponent, bits + 1, x * 2

    check_bits(f, lambda: (floats(4, 5),))


def test_dtype_keyword():
    def f(x):
        return x.view(dtype=torch.int32) * 3

    check_bits(f, lambda: (floats(6),))


# ---- writes through the view ----------------------------------------------------------------------


def test_add_through_the_view_changes_the_base():
    def f(x):
        y = x.view(torch.int32)
        y.add_(1)  # the next float up; inf + 1 ulp is a signaling NaN
        return x * 2

    x = floats(3, 4)
    before = x.clone()
    out = kiln.jit(f)(x)
    assert torch.equal(x.view(torch.int32), before.view(torch.int32) + 1), "the write did not land in x"
    assert not torch.equal(_bits(x), _bits(before))
    torch.testing.assert_close(out, x * 2, equal_nan=True)
    check_bits(f, lambda: (floats(3, 4),))


def test_setitem_through_the_view():
    def f(x):
        y = x.view(torch.int32)
        y[0] = 0x7F800001  # a signaling NaN, written as bits
        y[2, 1:3] = 7
        return x.clone()

    check_bits(f, lambda: (floats(3, 4),))


def test_bitwise_and_through_the_view_is_abs():
    def f(x):
        x.view(torch.int32).bitwise_and_(0x7FFFFFFF)
        return x

    x = floats(2, 5)
    want = f(x.clone())  # eager's bits (CUDA's abs would make a NaN canonical, the mask does not)
    got = kiln.jit(f)(x)
    assert got is x
    assert torch.equal(_bits(x), _bits(want))
    torch.testing.assert_close(x, want.abs(), equal_nan=True)
    check_bits(f, lambda: (floats(2, 5),))


def test_write_into_the_base_is_seen_through_the_view():
    def f(x):
        y = x.view(torch.float32)
        x.add_(1)
        return y * 1, y.clone()

    check_bits(f, lambda: (ints(3, 4),), arithmetic=(0,))


def test_write_through_a_half_precision_view():
    def f(x):
        y = x.view(torch.bfloat16)
        y.mul_(2)
        return x + 0

    check_bits(f, lambda: (floats(8, dtype=torch.float16),), arithmetic=(0,))


def test_float64_write():
    def f(x):
        y = x.view(torch.int64)
        y.sub_(1)
        return x.sum()

    check_bits(f, lambda: (floats(2, 3, dtype=torch.float64),), arithmetic=(0,))


# ---- views of views --------------------------------------------------------------------------------


def test_view_of_a_slice():
    def f(x):
        y = x[1:].view(torch.int32)
        y.add_(1)
        return y.clone()

    check_bits(f, lambda: (floats(4, 3),))


def test_slice_of_the_view():
    def f(x):
        x.view(torch.int32)[:, ::2].bitwise_xor_(-0x80000000)  # flips the sign bit
        return x

    check_bits(f, lambda: (floats(3, 4),))


def test_view_of_a_transpose_and_back():
    def f(x):
        y = x.t().view(torch.int32)
        y[0].add_(3)
        z = y.view(torch.float32)
        return z * 1, x.clone()

    check_bits(f, lambda: (floats(3, 4),), arithmetic=(0,))


def test_as_strided_of_the_view():
    def f(x):
        y = x.view(torch.int32).as_strided((2, 2), (1, 2), 1)
        y.add_(1)
        return y.clone()

    check_bits(f, lambda: (floats(8),))


def test_aliased_inputs():
    def f(a, b):
        a.view(torch.int32).add_(1)
        return b * 1

    def make():
        base = floats(8)
        return base[:6], base[2:]

    check_bits(f, make, arithmetic=(0,))


# ---- returned views -------------------------------------------------------------------------------


def test_returned_view_is_a_view_of_the_callers_tensor():
    def f(x):
        x.mul_(2)
        return x.view(torch.int32)

    x = floats(3, 4)
    out = kiln.jit(f)(x)
    assert out.dtype == torch.int32 and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    out.add_(1)  # a real view: the caller's x sees it
    assert torch.equal(x.view(torch.int32), out)
    check_bits(f, lambda: (floats(3, 4),))


def test_returned_view_of_a_slice_and_the_input_itself():
    def f(x):
        x.add_(1)
        return x, x[1:].view(torch.int32), x.view(torch.int32)[:, 1]

    check_bits(f, lambda: (floats(3, 4),))


def test_returned_view_of_an_integer_input_as_float():
    def f(x):
        return x.view(torch.float32)

    check_bits(f, lambda: (ints(5),))


# ---- fresh intermediates --------------------------------------------------------------------------


def test_view_of_an_intermediate():
    def f(x):
        y = x * 2
        z = y.view(torch.int32)
        z.add_(1)
        return y

    check_bits(f, lambda: (floats(3, 4),))


def test_returned_view_of_an_intermediate():
    def f(x):
        y = x * 2
        return y.view(torch.int32)

    check_bits(f, lambda: (floats(3, 4),))


def test_intermediate_returned_with_its_view():
    def f(x):
        y = x + 1
        z = y.view(torch.int32)
        z.add_(1)
        return y, z

    jitted = check_bits(f, lambda: (floats(3, 4),))
    y, z = jitted(floats(3, 4))
    assert y.untyped_storage().data_ptr() == z.untyped_storage().data_ptr()


# ---- what kiln refuses ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, to",
    [(lambda: floats(4), torch.bfloat16), (lambda: ints(4, dtype=torch.int64), torch.int32), (lambda: floats(4), torch.float64)],
    ids=["f32-bf16", "i64-i32", "f32-f64"],
)
def test_other_element_size_is_unsupported(make, to):
    def f(x):
        return x.view(to) + 1

    with pytest.raises(kiln.UnsupportedError, match=r"view at .*test_view_dtype\.py:\d+.*element size.*outside the compiled function"):
        kiln.jit(f)(make())


def test_dtype_kiln_lacks_raises_at_its_type():
    def f(x):
        return x.view(torch.uint8)

    with pytest.raises(kiln.UnsupportedError, match="dtype torch.uint8"):
        kiln.jit(f)(floats(4))


def test_gradients_run_eagerly():
    """Eager's view(dtype) is not differentiable; kiln does not differentiate such a program and
    runs it eagerly, with the gradient eager gives."""

    def f(x):
        y = x * 2
        y.view(torch.int32).bitwise_and_(0x7FFFFFFF)
        return (y * x).sum()

    base = torch.tensor([-1.0, 2.0, -3.0])
    x = base.clone().requires_grad_(True)
    ex = base.clone().requires_grad_(True)
    with pytest.warns(UserWarning):
        got = kiln.jit(f)(x)
    want = f(ex)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, ex.grad)
