"""Eager steps (kiln._fallback) that write into their arguments, against eager PyTorch: the write
lands, whatever way the step receives the written tensor (contiguous, strided, at an offset,
sharing memory with another argument, a view made inside the program), for an op whose schema
declares the write (cumsum_) and for one whose schema does not (native_batch_norm's running
statistics: the lost write this file was written for). conftest.py sets
KILN_CHECK_FALLBACK_WRITES=1, so every eager step of every test also checks that it wrote into no
argument kiln did not find written.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from test_cases import ar
from against_eager import check_against_eager

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


def _cumsum_in_place(x, y):
    x.cumsum_(0)
    return x * 2 + y


def _batch_norm_train(x, running_mean, running_var):
    return F.batch_norm(x, running_mean, running_var, training=True, momentum=0.3) + 1


# How the written argument reaches the step: (make_args for cumsum_, make_args for batch_norm).
LAYOUTS = {
    "contiguous": (
        lambda: [ar(4, 5), ar(4, 5)],
        lambda: [ar(6, 4) - 1, ar(4), ar(4) + 1],
    ),
    "strided": (
        lambda: [ar(4, 10)[:, ::2], ar(4, 5)],
        lambda: [ar(6, 4) - 1, ar(8)[::2], (ar(8) + 1)[1::2]],
    ),
    "offset": (
        lambda: [ar(5, 5)[1:], ar(4, 5)],
        lambda: [ar(6, 4) - 1, ar(6)[2:], ar(7)[3:] + 1],
    ),
    # Disjoint parts of one buffer: the written one and another argument.
    "aliased": (
        lambda: (lambda b: [b[:4], b[4:]])(ar(8, 5)),
        lambda: (lambda b: [ar(6, 4) - 1, b[0], b[1]])(ar(2, 4) + 1),
    ),
    # A read-only argument that is expanded (stride 0).
    "expanded": (
        lambda: [ar(4, 5), ar(5).expand(4, 5)],
        lambda: [ar(4).expand(6, 4), ar(4), ar(4) + 1],
    ),
    # (batch_norm's CPU kernel lays out its result for a transposed input unlike its meta
    # kernel, which kiln takes the layout from: a difference of strides, not of values or writes.)
    "transposed": (lambda: [ar(5, 4).t(), ar(4, 5)], None),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_eager_step_that_declares_its_write(layout):
    jitted = check_against_eager(_cumsum_in_place, LAYOUTS[layout][0])
    assert kiln.last_stats(jitted)["fallback_ops"] == 1


@pytest.mark.parametrize("layout", [k for k, v in LAYOUTS.items() if v[1] is not None])
def test_an_eager_step_whose_schema_hides_its_write(layout):
    jitted = check_against_eager(_batch_norm_train, LAYOUTS[layout][1])
    assert kiln.last_stats(jitted)["fallback_ops"] == 1


def test_the_write_lands_on_every_call_not_only_the_first():
    jitted = kiln.jit(_batch_norm_train)
    x = ar(6, 4) - 1
    stats, eager_stats = [ar(8)[::2], ar(8)[1::2] + 1], [ar(8)[::2], ar(8)[1::2] + 1]
    for _ in range(3):
        torch.testing.assert_close(jitted(x, *stats), _batch_norm_train(x, *eager_stats))
        for got, want in zip(stats, eager_stats):
            torch.testing.assert_close(got, want)
    assert kiln.last_stats(jitted)["cache_hits"] == 2


def test_a_write_into_a_view_the_program_makes_of_an_input():
    def f(x):
        v = x[1:, ::2]
        v.cumsum_(1)
        return x.sum(0)

    check_against_eager(f, lambda: [ar(4, 6)])


def test_a_write_into_an_intermediate_is_seen_by_later_reads():
    def f(x):
        y = x * 2
        y.cumsum_(0)
        return y + 1, x

    check_against_eager(f, lambda: [ar(3, 4)])


def test_an_in_place_method_returns_the_argument_itself():
    def f(x):
        y = x.cumsum_(0)
        return y is x, y

    got, _ = kiln.jit(f)(ar(3, 2))
    assert got is True
    check_against_eager(f, lambda: [ar(3, 2)])


def test_one_object_passed_twice_to_a_writing_step():
    # torch.Tensor.cumsum_ of x, and x as the out= of cumsum: one object, written once.
    def f(x):
        torch.cumsum(x, 0, out=x)
        return x + 1

    check_against_eager(f, lambda: [ar(3, 4)])


def test_a_written_argument_that_overlaps_another_argument_is_refused():
    def f(x, y):
        torch.cumsum(y, 0, out=x)
        return x

    base = ar(6)
    with pytest.raises(kiln.UnsupportedError, match="shares memory with another of its arguments"):
        kiln.jit(f)(base[:4], base[2:])


def test_a_write_into_an_expanded_argument_raises_like_eager():
    def f(x):
        x.cumsum_(0)

    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        f(torch.zeros(4).expand(3, 4))
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        kiln.jit(f)(torch.zeros(4).expand(3, 4))


# An op with a schema that only writes its argument and no meta kernel (a user's custom op).
_LIB = torch.library.Library("kiln_test_fallback", "DEF")
_LIB.define("scale_(Tensor(a!) x, float s) -> ()")


def _scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


for _key in ("CPU", "CUDA"):  # no Meta kernel
    _LIB.impl("scale_", _scale_, _key)


def test_an_op_that_only_writes_its_arguments_needs_no_meta_kernel():
    def f(x, y):
        z = y + 1
        torch.ops.kiln_test_fallback.scale_(z, 3.0)
        torch.ops.kiln_test_fallback.scale_(x[1:], 2.0)
        return z * x

    with pytest.raises(NotImplementedError):  # PyTorch's meta run has nothing to run
        torch.ops.kiln_test_fallback.scale_(torch.ones(2, device="meta"), 2.0)
    jitted = check_against_eager(f, lambda: [ar(4), ar(4) - 1])
    assert kiln.last_stats(jitted)["fallback_ops"] == 2


@pytest.mark.parametrize("write", [False, True], ids=["reads", "writes"])
def test_an_eager_step_through_a_reshape_that_copies(write):
    """An eager step reads its argument through views the step evaluates itself; a reshape of an
    expanded tensor is no view, but a copy (on CUDA a copy in device memory: the host
    interpreter's copy of it crashed the process, in Llama's repeat_kv before attention)."""

    def f(x):
        y = x.unsqueeze(0).expand(2, 3, 4).reshape(6, 4)
        if write:
            y.cumsum_(-1)
            return y * 2
        return torch.cumsum(y, -1)

    jitted = check_against_eager(f, lambda: [ar(3, 4)])
    assert kiln.last_stats(jitted)["fallback_ops"] == 1


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, y: torch.cumsum(x, -1) + 1,
        lambda x, y: F.scaled_dot_product_attention(x.view(1, 1, 3, 4), y.view(1, 1, 3, 4), x.view(1, 1, 3, 4), scale=0.5),
        lambda x, y: torch.sort(x, -1)[0] * y,  # two results: the general run
        lambda x, y: torch.cumsum(x, dim=-1, dtype=torch.float64),  # keyword arguments
        lambda x, y: torch.flip(x.t(), [0]) - y.t(),
    ],
    ids=["cumsum", "attention", "sort", "keywords", "flip-of-a-view"],
)
def test_the_one_result_run_without_write_checks(fn, monkeypatch):
    """Eager steps that write nothing and return one tensor take a shorter run than the general
    one when KILN_CHECK_FALLBACK_WRITES is off (as for users; conftest.py turns it on)."""
    import kiln._fallback as fallback

    monkeypatch.setattr(fallback, "CHECK_WRITES", False)
    check_against_eager(fn, lambda: [ar(3, 4), ar(3, 4) + 1])


def test_the_one_result_run_keeps_eagers_error(monkeypatch):
    import kiln._fallback as fallback

    monkeypatch.setattr(fallback, "CHECK_WRITES", False)
    f = kiln.jit(lambda x: torch.linalg.cholesky(x) * 2)
    torch.testing.assert_close(f(torch.eye(3) * 4), torch.eye(3) * 4)
    with pytest.raises(torch.linalg.LinAlgError, match="(?s)not positive-definite.*run by PyTorch as an eager step"):
        f(-torch.eye(3))  # raised by the op when it runs, not while tracing


# A convolution's result layout is its backend's: channels-last where an argument is (cuDNN,
# oneDNN), which meta kernels do not say. The result, and a region's output read by a second
# convolution, are laid out as eager lays them out.
def _conv_twice(x, w, b):
    y = torch.relu(F.conv2d(x, w, b, padding=1))
    return F.conv2d(y, w, padding=1), y


def _conv3d(x, w, b):
    return F.conv3d(x, w, b, padding=1) * 2


@pytest.mark.parametrize("x_last,w_last", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("fn", [_conv_twice, _conv3d], ids=["conv2d twice", "conv3d"])
def test_a_convolution_of_channels_last_arguments_is_laid_out_as_eager(fn, x_last, w_last):
    rank = 4 if fn is _conv_twice else 5
    last = torch.channels_last if rank == 4 else torch.channels_last_3d

    def make_args():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 8, *[5] * (rank - 2), generator=g, device="cpu")
        w = torch.randn(8, 8, *[3] * (rank - 2), generator=g, device="cpu") * 0.1
        b = torch.randn(8, generator=g, device="cpu")
        x, w = (x.contiguous(memory_format=last) if x_last else x), (w.contiguous(memory_format=last) if w_last else w)
        return [t.to(torch.get_default_device()) for t in (x, w, b)]

    check_against_eager(fn, make_args, atol=1e-4, rtol=1e-4)


# Convolutions of row-major arguments handed their input channels-last (on CUDA for 16-bit
# dtypes, _lowering_nn.channels_last_convolution; here on every device, to check the mechanism):
# the regions between convolutions store their activations channels-last (place_layouts), the
# caller's input is copied once, and everything the caller sees is as eager's.
@pytest.fixture
def channels_last_everywhere(monkeypatch):
    import kiln._lowering_nn as lowering_nn

    monkeypatch.setattr(
        lowering_nn, "channels_last_convolution", lambda x, w: x.dim() == 4 and x.is_contiguous() and (w is None or (w.dim() == 4 and w.is_contiguous()))
    )
    # cuDNN picks other algorithms for channels-last float32 convolutions than for row-major ones;
    # with TF32 their results differ by about 1e-3 (an H100), without it by float rounding.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield


class _Residual(torch.nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.c2, self.b2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + x)


def _residual_net() -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 1, 1), _Residual(8), _Residual(8),
        torch.nn.Conv2d(8, 4, 1, stride=2), torch.nn.AvgPool2d(2, ceil_mode=True),
    )
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return net.to(torch.get_default_device())


def _images(seed: int) -> torch.Tensor:
    return torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(seed), device="cpu").to(torch.get_default_device())


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_convolutions_made_channels_last_agree_with_eager(channels_last_everywhere, train):
    import copy

    net = _residual_net().train(train)
    eager = copy.deepcopy(net)
    jitted = kiln.jit(net)
    for seed in range(2):
        with torch.no_grad():
            got, want = jitted(_images(seed)), eager(_images(seed))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert got.stride() == want.stride()
        for (name, g), w in zip(net.state_dict().items(), eager.state_dict().values()):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")
    trace = kiln.last_traces(jitted)[-1]
    assert "laid out in dim order (0, 2, 3, 1)" in trace, trace
    stats = kiln.last_stats(jitted)
    if not train and stats["interpreted_steps"] == stats["torch_steps"] == 0:
        # the caller's image into the first convolution, the last one's result out (a region's
        # output the interpreter makes is row-major: copied for the convolution reading it)
        assert stats["layout_copies"] == 2, trace


def test_a_training_step_through_channels_last_convolutions_agrees_with_eager(channels_last_everywhere):
    import copy

    net = _residual_net()
    eager = copy.deepcopy(net)
    jitted = kiln.jit(net)
    for seed in range(2):
        for model in (jitted, eager):
            model(_images(seed)).square().mean().backward()
    for (name, p), q in zip(net.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")
