"""The classification losses (cross_entropy, nll_loss) with class-index targets: kiln computes
them as eager's nll_loss does (a gather of the log-probabilities at the targets, ignored targets
masked, weights, the three reductions, label smoothing), fused and differentiated by kiln itself.
Values, gradients and errors are compared with eager's; other forms (probability targets) run as
eager steps and still agree."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from gradient_check import check_gradients


def _device():
    return torch.empty(0).device


def _targets(shape, classes, *, ignored=(), seed=3):
    gen = torch.Generator(device=_device()).manual_seed(seed)
    t = torch.randint(0, classes, shape, generator=gen, device=_device())
    flat = t.view(-1)
    for position, value in ignored:
        flat[position % flat.numel()] = value
    return t


def _inputs(shape, dtype, targets, weight=None):
    def make():
        gen = torch.Generator(device=_device()).manual_seed(1)
        x = (torch.randn(shape, generator=gen, device=_device()) * 3).to(dtype).requires_grad_()
        args = [x, targets.clone()]
        if weight is not None:
            args.append(weight.clone().to(dtype))
        return args

    return make


FORMS = {
    # name: (input shape, target shape, loss keywords, ignored (position, value) pairs)
    "rows": ((16, 37), (16,), {}, ()),
    "rows_ignored": ((16, 37), (16,), {}, ((3, -100), (9, -100))),
    "sum": ((16, 37), (16,), {"reduction": "sum"}, ((0, -100),)),
    "none": ((16, 37), (16,), {"reduction": "none"}, ((5, -100),)),
    "own_ignore_index": ((8, 11), (8,), {"ignore_index": 4}, ((2, 4),)),
    "one_sample": ((37,), (), {}, ()),
    "spatial": ((4, 7, 5), (4, 5), {}, ((6, -100),)),
    "spatial_none": ((3, 6, 2, 4), (3, 2, 4), {"reduction": "none"}, ((1, -100),)),
    "smoothing": ((16, 37), (16,), {"label_smoothing": 0.1}, ((3, -100),)),
    "smoothing_sum": ((16, 37), (16,), {"label_smoothing": 0.2, "reduction": "sum"}, ()),
    "smoothing_none": ((16, 37), (16,), {"label_smoothing": 0.3, "reduction": "none"}, ((1, -100),)),
}


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_cross_entropy_values_and_gradients(form, weighted):
    x_shape, t_shape, keywords, ignored = FORMS[form]
    classes = x_shape[1] if len(x_shape) >= 2 else x_shape[0]
    targets = _targets(t_shape, classes, ignored=ignored)
    weight = torch.linspace(0.5, 2.0, classes, device=_device()) if weighted else None

    if weighted:
        def fn(x, t, w):
            return F.cross_entropy(x, t, weight=w, **keywords) * 2
    else:
        def fn(x, t):
            return F.cross_entropy(x, t, **keywords) * 2

    jitted = check_gradients(fn, _inputs(x_shape, torch.float32, targets, weight), rtol=1e-4, atol=1e-5)
    stats = kiln.last_stats(jitted)
    assert stats["eager_steps"] == 0 and stats["torch_steps"] == 0, stats
    backward = stats["backward"]
    assert backward["eager_steps"] == 0 and backward["torch_steps"] == 0, backward


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_of_log_softmax(reduction):
    targets = _targets((12,), 9, ignored=((4, -100),))

    def fn(x, t):
        return F.nll_loss(torch.log_softmax(x, -1), t, reduction=reduction)

    jitted = check_gradients(fn, _inputs((12, 9), torch.float32, targets), rtol=1e-4, atol=1e-5)
    assert kiln.last_stats(jitted)["eager_steps"] == 0


def test_a_causal_lm_loss_in_bfloat16():
    """A language model's loss as Hugging Face computes it: bf16 logits made float32, labels
    shifted with an ignored last position, a sum divided by the number of items."""
    targets = _targets((4, 10), 53)
    targets[:, -1] = -100

    def fn(logits, labels):
        logits = logits.float()
        shifted = labels.view(-1)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), shifted, ignore_index=-100, reduction="sum") / 36

    check_gradients(fn, _inputs((4, 10, 53), torch.bfloat16, targets), rtol=2e-2, atol=2e-2)


def test_bfloat16_logits_without_a_cast():
    targets = _targets((16,), 37, ignored=((2, -100),))

    def fn(x, t):
        return F.cross_entropy(x, t, label_smoothing=0.1)

    out = check_gradients(fn, _inputs((16, 37), torch.bfloat16, targets), rtol=2e-2, atol=2e-2)
    assert kiln.last_stats(out)["eager_steps"] == 0


def test_all_targets_ignored_is_nan_as_eager():
    targets = torch.full((6,), -100, device=_device())
    x = torch.randn(6, 5, device=_device())
    got = kiln.jit(lambda x, t: F.cross_entropy(x, t))(x, targets)
    assert torch.isnan(got) and torch.isnan(F.cross_entropy(x, targets))


def test_a_masked_class_of_minus_infinity_under_an_ignored_target():
    """An ignored target stands in for class 0 in the gather: its -inf must not make a NaN."""
    x = torch.randn(4, 6, device=_device())
    x[:, 0] = float("-inf")
    targets = torch.tensor([1, -100, 2, 3], device=_device())
    for reduction in ("mean", "none"):
        got = kiln.jit(lambda x, t: F.cross_entropy(x, t, reduction=reduction))(x, targets)
        torch.testing.assert_close(got, F.cross_entropy(x, targets, reduction=reduction))


@pytest.mark.parametrize("bad", [37, -1, -7])
def test_a_target_out_of_range_raises_index_error_and_names_the_line(bad):
    if _device().type == "cuda":
        pytest.skip("eager's CUDA kernel asserts on the device; kiln's check is the CPU's")
    x = torch.randn(5, 37, device=_device())
    targets = torch.tensor([0, 3, bad, 1, -100], device=_device())
    with pytest.raises(IndexError) as eager:
        F.cross_entropy(x, targets)
    assert str(bad) in str(eager.value)

    def fn(x, t):
        return F.cross_entropy(x, t)

    with pytest.raises(IndexError) as got:
        kiln.jit(fn)(x, targets)
    message = str(got.value)
    assert f"index {bad} is out of bounds" in message and "F.cross_entropy(x, t)" in message, message


def test_forms_kiln_does_not_lower_run_as_eager_steps():
    x = torch.randn(6, 5, device=_device())
    probabilities = torch.softmax(torch.randn(6, 5, device=_device()), -1)
    got = kiln.jit(lambda x, p: F.cross_entropy(x, p))(x, probabilities)
    torch.testing.assert_close(got, F.cross_entropy(x, probabilities))
    int32_targets = torch.zeros(6, dtype=torch.int32, device=_device())
    with pytest.raises(RuntimeError) as eager:  # eager's message differs by device
        F.cross_entropy(x, int32_targets)
    with pytest.raises(RuntimeError) as got:
        kiln.jit(lambda x, t: F.cross_entropy(x, t))(x, int32_targets)
    assert type(got.value) is type(eager.value) and str(got.value).startswith(str(eager.value)), got.value


def test_cross_entropy_fuses_with_the_log_softmax():
    """The log-softmax, the gather at the targets and the masking are one region; the masked
    index (a where) is computed by the region before it, whose result the gather's check reads."""
    targets = _targets((16,), 37, ignored=((3, -100),))
    x = torch.randn(16, 37, device=_device())
    fn = kiln.jit(lambda x, t: F.cross_entropy(x, t))
    torch.testing.assert_close(fn(x, targets), F.cross_entropy(x, targets))
    stats = kiln.last_stats(fn)
    assert stats["torch_steps"] == 0 and stats["eager_steps"] == 0, stats
    assert stats["kernels"] <= 3, stats
