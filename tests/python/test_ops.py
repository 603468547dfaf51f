"""Op coverage: small programs over every torch form the tracer lowers, traced and run with
kiln-opt (reference interpreter, and the whole pipeline), compared with eager PyTorch: outputs,
inputs afterwards, and which outputs are (views of) inputs. A program here that kiln cannot
parse or run is a gap between the tracer and the C++ side."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln_opt_tool import checked, needs_kiln_opt, run_against_eager, without_subsymbols


def u(*s: int, dtype=torch.float32) -> torch.Tensor:
    """Values in [0.1, 0.7]: inside every unary op's domain."""
    return ((torch.arange(math.prod(s)) % 7 + 1).to(torch.float64) / 10).reshape(s).to(dtype)


def sv(*s: int, dtype=torch.float32) -> torch.Tensor:
    """Signed values in [-1.5, 1.5]."""
    return ((torch.arange(math.prod(s)) % 7 - 3).to(torch.float64) / 2).reshape(s).to(dtype)


def ints(*s: int, dtype=torch.int64) -> torch.Tensor:
    return (torch.arange(math.prod(s)) % 5 - 2).reshape(s).to(dtype)


UNARY = [
    "abs", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "sin", "cos",
    "tan", "tanh", "asin", "acos", "atan", "sinh", "cosh", "sigmoid", "relu", "erf",
    "reciprocal", "floor", "ceil", "round", "trunc", "sign", "square",
]

PROGRAMS: list[tuple[str, object, object]] = []


def program(name: str, make_args):
    def register(fn):
        PROGRAMS.append((name, fn, make_args))
        return fn

    return register


for _op in UNARY:
    PROGRAMS.append((f"torch.{_op}", (lambda op: lambda x: getattr(torch, op)(x))(_op), lambda: [u(2, 3)]))
    PROGRAMS.append((f"Tensor.{_op}_", (lambda op: lambda x: getattr(x, op + "_")())(_op), lambda: [u(2, 3)]))
PROGRAMS += [
    ("gelu", lambda x: F.gelu(x), lambda: [sv(2, 3)]),
    ("gelu-tanh", lambda x: F.gelu(x, approximate="tanh"), lambda: [sv(2, 3)]),
    ("silu-inplace", lambda x: F.silu(x, inplace=True), lambda: [sv(2, 3)]),
    ("relu-inplace", lambda x: F.relu(x, inplace=True), lambda: [sv(2, 3)]),
    # the sign of a zero relu keeps (-0 stays -0 in eager's clamp_min), NaN kept
    ("relu-signed-zeros", lambda x: (torch.relu(x), F.relu(x * -1)), lambda: [torch.tensor([-0.0, 0.0, -1.5, float("nan"), 2.0])]),
    ("isnan-logical_not", lambda x: (x.isnan(), (x > 0).logical_not()), lambda: [sv(4)]),
    ("bitwise_not", lambda i, b: (~i, ~b), lambda: [ints(4), ints(4) > 0]),
    ("round-half", lambda x: torch.round(x), lambda: [sv(7)]),
    ("torch-aliases", lambda x, y: (torch.subtract(x, y), torch.multiply(x, y), torch.divide(x, y), torch.true_divide(x, 2), torch.greater(x, y), torch.less_equal(x, y), torch.not_equal(x, y), torch.clip(x, 0, 1), torch.absolute(y), torch.negative(x), torch.arcsin(x), torch.fix(y), torch.special.expit(y), torch.arctan2(x, y)), lambda: [u(4), sv(4) + 2]),
    ("inplace-aliases", lambda x: (x.subtract_(0.5), x.multiply_(3), x.clip_(-1, 1), x.absolute_(), x.negative_(), x.fix_())[-1], lambda: [u(5)]),
    # binary, tensor and number operands, promotion
    ("arith", lambda x, y: (x + y, x - y, x * y, x / y, x ** 2, x % 0.3, torch.fmod(x, 0.3)), lambda: [u(2, 3), sv(2, 3)]),
    ("alpha", lambda x, y: (torch.add(x, y, alpha=2), x.sub(y, alpha=0.5)), lambda: [u(3), sv(3)]),
    ("div-rounding", lambda x, y: (x.div(y, rounding_mode="floor"), x.div(y, rounding_mode="trunc"), x // 0.25), lambda: [sv(6), u(6) * 4]),
    ("int-arith", lambda i, j: (i + j, i * 3, i // 2, i % 3, i / 2, i.div(2, rounding_mode="floor")), lambda: [ints(5), ints(5) + 3]),
    ("mixed-dtypes", lambda x, i, h: (x + i, i + 2.5, h * 3, h + x, i * True), lambda: [u(3), ints(3, dtype=torch.int32), u(3, dtype=torch.float16)]),
    ("bf16", lambda x, y: (x * y, x.exp(), (x + 1).sum()), lambda: [u(4, dtype=torch.bfloat16), u(4, dtype=torch.bfloat16)]),
    ("f64", lambda x: x.sin() + x.double(), lambda: [u(3, dtype=torch.float64)]),
    ("max-min-atan2", lambda x, y: (torch.maximum(x, y), torch.minimum(x, y), torch.atan2(x, y), x.max(y)), lambda: [u(4), sv(4)]),
    ("compare", lambda x, y: (x == y, x != 0.1, x < y, x <= 0.3, x > y, x >= 0.4, x.eq(y)), lambda: [u(6), u(6).flip(0)]),
    ("logical", lambda a, b: (a.logical_and(b), torch.logical_or(a, b), a.logical_xor(b), a & b, a | b, a ^ b), lambda: [sv(6) > 0, sv(6) < 1]),
    ("bitwise", lambda i, j: (i & j, i | 3, i ^ j, i.bitwise_and(6)), lambda: [ints(5) + 2, ints(5) + 4]),
    ("reflected", lambda x: (2 - x, 2 / x, 2 ** x, 1 + x, 3 * x, 0.5 // x, 1.5 % x), lambda: [u(4)]),
    ("reflected-int", lambda i: (2 - i, 7 // (i + 3), 2 ** (i + 2), 10 % (i + 3)), lambda: [ints(5)]),
    ("inplace-binary", lambda x, y: (x.add_(y), x.mul_(2), x.sub_(y, alpha=2), x.div_(4), x.pow_(2), x.clamp_(0.1, 0.5)), lambda: [u(4), sv(4)]),
    ("inplace-operators", lambda x: [x.__iadd__(1), x.__imul__(2), x.__isub__(0.5), x.__itruediv__(3)][-1], lambda: [u(4)]),
    ("inplace-int", lambda i: [i.__iand__(3), i.__ior__(4), i.__ixor__(1), i.__ifloordiv__(2)][-1], lambda: [ints(5) + 3]),
    ("inplace-compare", lambda x, y: x.gt_(y), lambda: [u(4), u(4).flip(0)]),
    # ternary
    ("where", lambda c, x, y: (torch.where(c, x, y), torch.where(c, x, 0.0), x.where(c, y), torch.where(c, 1.0, 2.0)), lambda: [sv(5) > 0, u(5), sv(5)]),
    ("clamp", lambda x: (x.clamp(-0.5, 0.5), torch.clamp(x, min=0), x.clamp(max=1), x.clamp_min(0.2), x.clamp_max(0.2), torch.clip(x, -1, 1)), lambda: [sv(7)]),
    ("lerp-addcmul-addcdiv", lambda x, y, z: (torch.lerp(x, y, 0.3), torch.lerp(x, y, z), x.addcmul(y, z, value=2), torch.addcdiv(x, y, z + 1)), lambda: [u(4), sv(4), u(4)]),
    # casts and copies
    ("casts", lambda x: (x.to(torch.float16), x.to(torch.int32), x.double(), x.long(), x.bool(), x.half(), x.bfloat16(), x.int(), x.type_as(torch.ones(1, dtype=torch.float64))), lambda: [sv(5)]),
    ("to-copy", lambda x: x.to(torch.float32, copy=True).add_(1), lambda: [u(3)]),
    ("clone-contiguous", lambda x: (x.clone().mul_(2), x.t().contiguous().add_(1), x.contiguous()), lambda: [u(2, 3)]),
    # creation
    ("creation", lambda x: (torch.zeros(2, 3), torch.ones((3,), dtype=torch.int32), torch.full((2,), 1.5), torch.full((2,), 7), torch.empty(2).fill_(3)), lambda: [u(1)]),
    ("arange", lambda x: (torch.arange(5), torch.arange(1, 4, 0.5), torch.arange(2.0, 5.0), torch.arange(6, dtype=torch.float32) * x), lambda: [u(6)]),
    ("like", lambda x: (torch.zeros_like(x), torch.ones_like(x, dtype=torch.int64), torch.full_like(x, 2.5), torch.empty_like(x).fill_(1), x.new_zeros(2), x.new_ones((2, 2)), x.new_full((3,), 4.0)), lambda: [u(2, 3)]),
    ("tensor-scalar", lambda x: x + torch.tensor(2.5) + torch.tensor(3) + torch.scalar_tensor(1), lambda: [u(3)]),
    # reductions
    ("sum-mean-prod", lambda x: (x.sum(), x.sum(0), x.sum((0, 1)), torch.sum(x, 1, keepdim=True), x.mean(), x.mean(-1), x.prod(), x.prod(1), x.sum(dtype=torch.float64)), lambda: [u(2, 3)]),
    ("int-sum", lambda i: (i.sum(), i.prod(0), i.sum(1)), lambda: [ints(2, 3, dtype=torch.int32)]),
    ("amax-amin-arg", lambda x: (x.amax(), x.amax(1), x.amin(0, keepdim=True), x.argmax(), x.argmax(1), x.argmin(0, keepdim=True)), lambda: [sv(3, 4)]),
    ("max-min", lambda x: (x.max(), x.min(), *x.max(1), *torch.min(x, 0, keepdim=True)), lambda: [sv(3, 4)]),
    ("var-std", lambda x: (x.var(), x.var(0), x.var(1, unbiased=False), x.std(), x.std(0, correction=0, keepdim=True), torch.var(x, 1, True, True)), lambda: [sv(3, 4)]),
    # views
    ("views", lambda x: (x.view(6, 2), x.view(-1), x.reshape(3, 4), x.permute(2, 0, 1), x.transpose(0, 2), x.unsqueeze(1), x.flatten(), x.flatten(1), x.unflatten(2, (2, 1)), x.narrow(2, 0, 1), x.select(0, 1), x.diagonal(0, 1, 2), x[1]), lambda: [sv(2, 3, 2)]),
    ("views-2d", lambda x: (x.t(), x.T, x.mT, x.expand(3, 2, 4), x.unsqueeze(0).expand(2, 2, 4), x.squeeze(), x.view(2, 1, 4).squeeze(1), x.movedim(0, 1), x.swapaxes(0, 1), x.view_as(torch.ones(4, 2)), x.reshape_as(torch.ones(8)), x.as_strided((2, 2), (1, 2), 1)), lambda: [sv(2, 4)]),
    ("split-chunk-unbind", lambda x: (*x.split(2), *torch.split(x, [1, 3], dim=1), *x.chunk(2, 1), *x.unbind(1), *list(x)), lambda: [sv(4, 4)]),
    ("detach-alias", lambda x: x.detach().add_(1), lambda: [u(3)]),
    ("write-through-views", lambda x: (x[1:].mul_(2), x.t()[0].add_(1), x.view(-1)[2].fill_(0))[0], lambda: [u(3, 3)]),
    ("view-of-strided-input", lambda x: (x.add_(1), x.unsqueeze(0).mul_(2)), lambda: [u(4, 4)[:, 1::2]]),
    ("reshape-copy", lambda x: x.t().reshape(-1).add_(1), lambda: [u(2, 3)]),
    # An elementwise result keeps its input's permuted layout in eager: reshaping it copies in
    # the first program and views in the second, and the write must land (or not) accordingly.
    ("reshape-intermediate-copies", lambda x: (lambda z: (z, z.reshape(-1).add_(1)))(x.t() + 1), lambda: [u(2, 3)]),
    ("reshape-intermediate-views", lambda x: (lambda z: (z, z.t().reshape(-1).add_(1)))(x.t() + 1), lambda: [u(2, 3)]),
    # mutation
    ("fill-zero-copy", lambda x, y: (x[0].fill_(2), x[1].zero_(), x[2].copy_(y), torch.fill(y, 3)), lambda: [u(3, 2), sv(2)]),
    ("copy-cast-broadcast", lambda x, y: x.copy_(y), lambda: [u(2, 3), ints(3)]),
    ("setitem", lambda x, v: (x.__setitem__((slice(None), 0), v), x.__setitem__((1, slice(1, None)), 9.5), x.__setitem__((Ellipsis, -1), x[:, 0] + 1))[0], lambda: [u(3, 3), sv(3)]),
    ("setitem-0d-tensor", lambda x, v: x.__setitem__(0, v), lambda: [u(3), torch.tensor(4.0)]),
    ("metadata", lambda x: (x.t_(), x.unsqueeze_(1), x.squeeze_(1), x.transpose_(0, 1), x.as_strided_((3,), (2,), 0))[-1].add_(1), lambda: [u(2, 3)]),
    ("squeeze_", lambda x: x.squeeze_(), lambda: [u(1, 3, 1)]),
    # joins, matrix products, composites
    ("cat-stack", lambda x, y: (torch.cat([x, y]), torch.cat((x, y), dim=1), torch.stack([x, y]), torch.stack([x, y], -1), torch.concat([x, x])), lambda: [u(2, 3), sv(2, 3)]),
    ("matmul", lambda a, b, c: (a @ b, torch.matmul(a, b), a.mm(b), torch.bmm(c, c.transpose(1, 2)), b.t() @ a.t(), a @ b[:, 0]), lambda: [u(2, 3), sv(3, 4), u(2, 3, 3)]),
    ("linear", lambda x, w, b: (F.linear(x, w, b), F.linear(x, w)), lambda: [u(2, 3), sv(4, 3), u(4)]),
    # A product and the views around it are one library step (GPT-2's Conv1D), the reshape of a
    # transpose a copy inside it.
    ("linear-through-reshapes", lambda x, w, b: F.linear(x.reshape(6, 4), w, b).reshape(2, 3, 5), lambda: [u(2, 3, 4), sv(5, 4), u(5)]),
    ("matmul-of-a-copying-reshape", lambda x, w: (x.transpose(0, 1).reshape(6, 4) @ w.t()).view(3, 2, 5), lambda: [u(2, 3, 4), sv(5, 4)]),
    # constant pads: a full tensor with x (cropped where a pad is negative) copied into it
    ("pad", lambda x, y: (F.pad(x, (1, 2)) * 2, F.pad(x, (-1, 2, 1, -1), value=0.5), torch.constant_pad_nd(y, (0, 0, 2, 1), -3), F.pad(x, (-3, 1), value=4.0)), lambda: [sv(3, 3), ints(2, 3)]),
    ("pad-int-value-and-shift", lambda t: F.pad(t, (0, 1), value=-100)[..., 1:] + F.pad(t, (2, -2), value=2.7), lambda: [ints(2, 4)]),
    ("pad-written-input", lambda x: (x.mul_(2), F.pad(x[:, 1:], (1, 0, 0, 2)).add_(1))[1], lambda: [u(2, 3)]),
    ("addmm", lambda b, x, w: (torch.addmm(b, x, w), b.addmm(x, w) * 2), lambda: [u(4), sv(2, 3), u(3, 4)]),
    # an empty list is a creation op (a static cache starts as torch.tensor([]); cat skips it)
    ("tensor-empty", lambda x: (torch.cat([torch.tensor([]), x]), torch.tensor([[]], dtype=torch.int64).shape[1] + x), lambda: [u(3)]),
    ("softmax", lambda x: (x.softmax(-1), F.softmax(x, dim=0), torch.log_softmax(x, 1), F.log_softmax(x, dim=-1, dtype=torch.float64)), lambda: [sv(3, 4)]),
    ("layer_norm", lambda x, w, b: (F.layer_norm(x, (4,)), F.layer_norm(x, [4], w, b, eps=1e-3)), lambda: [sv(3, 4), u(4), sv(4)]),
    ("rms_norm", lambda x, w: (F.rms_norm(x, (4,)), F.rms_norm(x, [4], w, eps=1e-6)), lambda: [sv(3, 4), u(4)]),
    ("batch_norm-eval", lambda x, m, v, w, b: (F.batch_norm(x, m, v, w, b, False, 0.1, 1e-3).relu(), F.batch_norm(x[:, :, 0], m, v)), lambda: [sv(2, 3, 4), sv(3), u(3), u(3), sv(3)]),
    ("batch_norm-eval-bf16", lambda x, m, v: F.batch_norm(x, m, v, training=False), lambda: [sv(2, 3, 4, dtype=torch.bfloat16), sv(3, dtype=torch.bfloat16), u(3, dtype=torch.bfloat16)]),
    ("dropout-eval", lambda x: F.dropout(x, 0.5, training=False) * 2, lambda: [u(3)]),
    # shapes
    ("zero-size", lambda x, y: (x + 1, x.sum(0), y.sum(), torch.cat([x, x])), lambda: [u(0, 3), u(0)]),
    ("zero-dim", lambda x, y: (x + y, x * 2, y.add_(x), x.exp()), lambda: [torch.tensor(0.5), u(3)]),
    ("broadcast-inplace", lambda x, y: x.add_(y).mul_(y[0]), lambda: [u(3, 4), sv(4)]),
]


@needs_kiln_opt
@pytest.mark.parametrize("pipeline", [False, True], ids=["interpreter", "pipeline"])
@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_float32_div_with_rounding_mode_rounds_the_float32_quotient(pipeline, mode):
    # trunc(-1.5f / 0.1f) is -15 in eager: the float32 quotient -15.0000005 rounds to -15.0f.
    run_against_eager(lambda x, y: x.div(y, rounding_mode=mode), lambda: [sv(6), u(6)], pipeline)


@needs_kiln_opt
@pytest.mark.parametrize("pipeline", [False, True], ids=["interpreter", "pipeline"])
@pytest.mark.parametrize("name, fn, make_args", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_op_runs_like_eager(name, fn, make_args, pipeline):
    run_against_eager(fn, make_args, pipeline)


@needs_kiln_opt
@pytest.mark.parametrize("name, fn, make_args", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_op_trace_prints_back(name, fn, make_args):
    text = kiln.trace(fn, *make_args())
    assert without_subsymbols(checked(text)) == text


@needs_kiln_opt
@pytest.mark.parametrize("pipeline", [False, True], ids=["interpreter", "pipeline"])
def test_setitem_value_with_leading_unit_dims(pipeline):
    # Eager strips the value's leading size-1 dims: x[..., 1] = v with v of shape [1, 3].
    def f(x, v):
        x[..., 1] = v
        return x

    run_against_eager(f, lambda: [u(3, 4), sv(1, 3)], pipeline=pipeline)


@pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built")
@pytest.mark.parametrize("op", [torch.sin, torch.cos], ids=["sin", "cos"])
def test_float32_sin_and_cos_stay_within_a_few_ulp_at_every_magnitude(op):
    # float32 sin and cos stay within a few ulp of the exact result and of eager's (Sleef, within
    # 1 ulp) at every magnitude of the argument, through the argument reductions of large ones,
    # and at the special values.
    gen = torch.Generator(device="cpu").manual_seed(0)
    parts = [(torch.rand(1 << 12, generator=gen, device="cpu") * 2 - 1) * 10.0**e for e in range(-3, 39, 3)]
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, math.pi, 2.0**17, 2.0**-140], device="cpu")
    x = torch.cat([*parts, specials]).to(torch.empty(0).device)
    got, want = kiln.jit(lambda a: op(a) * 1)(x), op(x) * 1
    exact = op(x.double())
    ulp = torch.finfo(torch.float32).eps * exact.abs().clamp(min=2.0**-126)
    assert torch.equal(got.isnan(), want.isnan())
    finite = ~want.isnan()
    assert ((got - exact).abs() <= 3 * ulp)[finite].all()
    torch.testing.assert_close(got, want, rtol=5e-7, atol=0.0, equal_nan=True)


@pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built")
@pytest.mark.parametrize(
    "op, exact_of, scale_of",
    [
        (torch.erf, torch.erf, lambda x, exact: exact.abs()),
        # GELU computes 1 + erf(x / sqrt(2)) in float, as eager's formula does: the sum's rounding
        # (an ulp of 1) scaled by x bounds its error, not the result's size (GELU(-5.6) is
        # -5.8e-8 exactly and -0.0 in eager's float32).
        (
            F.gelu,
            lambda x: x * 0.5 * (1 + torch.erf(x * 0.5**0.5)),
            lambda x, exact: torch.maximum(exact.abs(), x.abs()),
        ),
        (
            lambda x: F.gelu(x, approximate="tanh"),
            lambda x: 0.5 * x * (1 + torch.tanh((2 / math.pi) ** 0.5 * (x + 0.044715 * x * x * x))),
            lambda x, exact: torch.maximum(exact.abs(), x.abs()),
        ),
    ],
    ids=["erf", "gelu", "gelu-tanh"],
)
def test_float32_erf_and_gelu_stay_within_a_few_ulp_at_every_magnitude(op, exact_of, scale_of):
    # float32 erf and GELU, at every magnitude of the argument and across erf's switch from its
    # polynomial to 1 - erfc (|x| = 0.875) and to 1 (3.92): within a few ulp of the exact result
    # (computed in float64) and of eager's; NaN where eager's is NaN, signs of zero kept.
    gen = torch.Generator(device="cpu").manual_seed(0)
    parts = [(torch.rand(1 << 12, generator=gen, device="cpu") * 2 - 1) * 10.0**e for e in range(-30, 3)]
    dense = torch.linspace(-6, 6, 1 << 16, device="cpu")
    specials = torch.tensor([0.0, -0.0, -math.inf, math.nan, 2.0**-140, -(2.0**-140), 0.875, 3.92], device="cpu")
    x = torch.cat([*parts, dense, specials]).to(torch.empty(0).device)
    got, want = kiln.jit(lambda a: op(a) * 1)(x), op(x) * 1
    exact = exact_of(x.double())
    assert torch.equal(got.isnan(), want.isnan())
    finite = ~want.isnan()
    # An ulp of the scale, at least the smallest normal's (tiny results ask float32's absolute
    # rounding only).
    ulp = torch.finfo(torch.float32).eps * scale_of(x.double(), exact).clamp(min=2.0**-126)
    assert ((got - exact).abs() <= 3 * ulp)[finite].all()
    assert ((got - want).abs() <= 4 * ulp)[finite].all()
    # Eager's own sign of a zero result can depend on whether its vectorized loop or its scalar
    # tail computed it (GELU(-0.0) is +0.0 in ATen's vectorized GELU, -0.0 in its scalar one, and
    # the specials fall in one or the other with the machine's vector width): compared with
    # eager's scalar result, each zero alone.
    zeros = x[x == 0]
    alone = torch.cat([op(zeros[i : i + 1]) * 1 for i in range(len(zeros))])
    assert torch.equal(got[x == 0].signbit(), alone.signbit())
