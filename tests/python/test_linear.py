"""F.linear with a bias through kiln.jit against eager PyTorch, over the layouts that decide how
kiln's CUDA product runs it (src/kiln/runtime/cuda/cublas.cpp): with the bias added in cuBLASLt's
epilogue when the input's batches are rows of one matrix and the bias is one unit-stride row
(cublas_lt.h), else as the bias copied into the output and a product with beta = 1. Values,
dtypes, layouts and inputs are eager's either way; on the CPU the same programs check kiln's
CPU product.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from against_eager import check_against_eager

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(*shape, generator=gen, device="cpu") / 4).to(device=torch.get_default_device(), dtype=dtype)


# name -> (input, weight, bias) makers; each a layout the product reads differently.
def _contiguous_batches(dtype):  # [B, L, k]: one [B * L, k] matrix
    return _randn(3, 7, 64, dtype=dtype, seed=0), _randn(48, 64, dtype=dtype, seed=1), _randn(48, dtype=dtype, seed=2)


def _one_matrix(dtype):
    return _randn(33, 64, dtype=dtype, seed=0), _randn(40, 64, dtype=dtype, seed=1), _randn(40, dtype=dtype, seed=2)


def _transposed_input(dtype):  # the input read column-major
    return _randn(64, 33, dtype=dtype, seed=0).t(), _randn(40, 64, dtype=dtype, seed=1), _randn(40, dtype=dtype, seed=2)


def _batches_not_rows(dtype):  # [L, B, k] viewed from [B, L, k]: batches that are not one matrix's rows
    return _randn(3, 7, 64, dtype=dtype, seed=0).transpose(0, 1), _randn(48, 64, dtype=dtype, seed=1), _randn(48, dtype=dtype, seed=2)


def _transposed_weight(dtype):  # weight [m, k] stored as [k, m]
    return _randn(5, 64, dtype=dtype, seed=0), _randn(64, 40, dtype=dtype, seed=1).t(), _randn(40, dtype=dtype, seed=2)


def _bias_at_an_odd_offset(dtype):  # the bias's address is 2-byte (bf16) / 4-byte (f32) aligned
    return _randn(9, 64, dtype=dtype, seed=0), _randn(40, 64, dtype=dtype, seed=1), _randn(41, dtype=dtype, seed=2)[1:]


def _strided_bias(dtype):  # a bias of stride 2: not one unit-stride row
    return _randn(9, 64, dtype=dtype, seed=0), _randn(40, 64, dtype=dtype, seed=1), _randn(80, dtype=dtype, seed=2)[::2]


def _one_output(dtype):
    return _randn(6, 64, dtype=dtype, seed=0), _randn(1, 64, dtype=dtype, seed=1), _randn(1, dtype=dtype, seed=2)


def _unaligned_features(dtype):  # k and m not multiples of 8: 16-bit products run padded or plainly, never through the epilogue
    return _randn(4, 9, 37, dtype=dtype, seed=0), _randn(21, 37, dtype=dtype, seed=1), _randn(21, dtype=dtype, seed=2)


LAYOUTS = [_contiguous_batches, _one_matrix, _transposed_input, _batches_not_rows, _transposed_weight, _bias_at_an_odd_offset, _strided_bias, _one_output, _unaligned_features]


# Eager's own CUDA addmm picks between cuBLASLt's bias epilogue and a product with beta = 1 by the
# operands' layout, and in 16-bit the two can round differently: the epilogue may round the
# product to the dtype before adding the bias. Where kiln picks the other path, a result whose
# product and bias nearly cancel differs by one rounding of the product (H200: 2^-10 in bf16 and
# 2^-13 in f16 at products of about 0.25; 1-2% of the elements). So 16-bit values are compared
# within one unit in the last place of the product's magnitude, not of the result's.
_PRODUCT_ROUNDING = {torch.bfloat16: dict(rtol=1.6e-2, atol=2e-3), torch.float16: dict(rtol=1e-3, atol=2.5e-4)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: f.__name__.lstrip("_"))
def test_linear_with_a_bias_runs_like_eager(layout, dtype):
    def linear(x, w, b):
        return F.linear(x, w, b)

    check_against_eager(linear, lambda: layout(dtype), **_PRODUCT_ROUNDING.get(dtype, {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_linear_whose_result_feeds_a_fused_epilogue(dtype):
    # The product's output is read by the fused GELU and residual add after it, and written into
    # a caller's tensor in place: the epilogue's bias is in the values the kernels read.
    def block(x, w, b, out):
        out.add_(F.gelu(F.linear(x, w, b)))
        return out.sum(-1)

    check_against_eager(block, lambda: (*_contiguous_batches(dtype), _randn(3, 7, 48, dtype=dtype, seed=3)), **_PRODUCT_ROUNDING.get(dtype, {}))


# A 16-bit product whose result rows are not 16-byte multiples (m = 201) runs padded for tensor
# cores; where every reader indexes the result through its strides, the padded buffer's [n, m]
# corner is the result (no copy out of it: src/kiln/runtime/cuda/cublas.h). Each reader below
# must see eager's values: fused kernels, another product, a view, as_strided (which reads the
# storage, so the product keeps eager's layout), steps PyTorch runs (given eager's layout by a
# copy), and the caller (results laid out as eager's).
def _lm_head(dtype):
    return _randn(256, 392, dtype=dtype, seed=0), _randn(201, 392, dtype=dtype, seed=1) / 5, _randn(64, 201, dtype=dtype, seed=2) / 5


PADDED_READERS = {
    "fused_softmax": lambda h, w, w2: F.linear(h, w).float().softmax(-1),
    "returned": lambda h, w, w2: F.linear(h, w),
    "returned_and_fused": lambda h, w, w2: (lambda y: (y, y.float().sum(-1)))(F.linear(h, w)),
    "view_in_a_kernel": lambda h, w, w2: F.linear(h, w).view(-1) * 2,
    "view_returned": lambda h, w, w2: F.linear(h, w).view(-1),
    "as_strided": lambda h, w, w2: torch.as_strided(F.linear(h, w), (100, 50), (3, 7), 5).float() + 1,
    "another_product": lambda h, w, w2: F.linear(F.linear(h, w), w2),
    "step_pytorch_runs": lambda h, w, w2: torch.roll(F.linear(h, w).view(-1), 3) + 1,
    "batched": lambda h, w, w2: torch.matmul(h.view(4, 64, 392), w.t()).float().amax(-1),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reader", PADDED_READERS, ids=str)
def test_a_padded_products_result_reaches_every_reader_as_eagers(reader, dtype):
    jitted = check_against_eager(PADDED_READERS[reader], lambda: _lm_head(dtype), rtol=2e-2, atol=2e-2)
    if torch.get_default_device().type == "cuda":
        assert kiln.last_stats(jitted)["aligned_products"] >= 1


# A kernel's 16-bit result with rows of 201 elements that only products and kernels read is laid
# out on CUDA with its rows padded with zeros to 208 (src/kiln/runtime/prepared_program.cpp,
# padded_rows), and a product whose reduced dim (or padded result dim) it is reads it in place.
# Each reader must see eager's values: the product as A (k padded) and as A.T (n padded),
# batched through a view, beside a fused reduction, and where the result is returned or a step
# PyTorch runs reads it (then it keeps eager's layout).
KERNEL_RESULT_READERS = {
    "product": lambda x, w, h: (x * 2).tanh() @ w,
    "product_of_transpose": lambda x, w, h: (x * 2).tanh().t() @ h,
    "product_and_reduction": lambda x, w, h: (lambda y: (y @ w, y.float().sum(-1)))((x * 2).tanh()),
    "batched_view": lambda x, w, h: (x * 2).tanh().view(4, 64, 201) @ w,
    "returned": lambda x, w, h: (lambda y: (y, y @ w))((x * 2).tanh()),
    "step_pytorch_runs": lambda x, w, h: torch.roll((x * 2).tanh(), 3, 0) @ w,
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reader", KERNEL_RESULT_READERS, ids=str)
def test_a_kernels_unaligned_result_reaches_every_reader_as_eagers(reader, dtype):
    make = lambda: (_randn(256, 201, dtype=dtype, seed=0), _randn(201, 64, dtype=dtype, seed=1), _randn(256, 48, dtype=dtype, seed=2))
    jitted = check_against_eager(KERNEL_RESULT_READERS[reader], make, rtol=2e-2, atol=2e-2)
    if torch.get_default_device().type == "cuda" and reader == "product":
        # Only w is copied, padded to 208 rows; tanh's result is read where the kernel stored it.
        assert kiln.last_stats(jitted)["alignment_copy_bytes"] == 2 * 208 * 64 * dtype.itemsize
