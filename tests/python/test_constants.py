"""Values known while tracing (kiln._constants): a tensor computed from no input has its value
beside its proxy, and an attention mask known to mask nothing is dropped (what Hugging Face
materializes under Dynamo). Every program is checked against eager; a mask that is written,
depends on an input, or masks something is kept.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import kiln

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


def _qkv(b=2, h=3, length=5, e=4):
    g = torch.Generator(device="cpu").manual_seed(0)
    return [torch.randn(b, h, length, e, generator=g, device="cpu").to(torch.get_default_device()) for _ in range(3)]


def _eager_call_inputs(jitted) -> list[int]:
    """The number of tensors each eager step of the last program takes."""
    text = kiln.last_traces(jitted)[0]
    return [len(m.group(1).split(", ")) for m in re.finditer(r"ltorch\.eager_call\(\d+, \[([^\]]*)\]", text)]


def _all_true_mask(q, k, v):  # Hugging Face's sdpa_mask under Dynamo, for an unpadded batch
    length = q.shape[2]
    mask = (torch.arange(length, device=q.device)[None, None, :, None] >= 0).expand(q.shape[0], -1, length, length)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _zero_float_mask(q, k, v):
    mask = torch.zeros(q.shape[2], q.shape[2], device=q.device)
    return F.scaled_dot_product_attention(q, k, v, mask * 2)


def _causal_mask(q, k, v):  # masks something: kept
    n = q.shape[2]
    i = torch.arange(n, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=i[:, None] >= i[None, :])


def _written_mask(q, k, v):  # all true when made, then written: kept
    mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool, device=q.device)
    row = mask[0]
    row[1:].fill_(False)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _input_mask(q, k, v):  # depends on an input: kept
    return F.scaled_dot_product_attention(q, k, v, attn_mask=q @ k.transpose(-1, -2) > -100)


@pytest.mark.parametrize(
    "fn, inputs",
    [(_all_true_mask, 3), (_zero_float_mask, 3), (_causal_mask, 4), (_written_mask, 4), (_input_mask, 4)],
    ids=["all_true", "zero_float", "causal", "written", "input"],
)
def test_a_mask_is_dropped_only_where_it_masks_nothing(fn, inputs):
    # Values only: on CUDA the layout of SDPA's result depends on the kernel PyTorch picks for
    # the device (a masked call's memory-efficient kernel returns [B, L, H, E] transposed), where
    # kiln's eager step lays its result out as tracing on meta tensors found it.
    jitted = kiln.jit(fn)
    got, want = jitted(*_qkv()), fn(*_qkv())
    torch.testing.assert_close(got, want)
    assert kiln.last_stats(jitted)["host_copies"] == 0
    assert _eager_call_inputs(jitted) == [inputs]


def test_an_all_true_mask_expanded_past_the_size_kept_for_values_is_dropped():
    # The mask's storage holds L elements and its expanded view B * L * L (past MAX_ELEMENTS, as
    # at BERT's batch 64): the view of a known value is known whatever its size.
    from kiln._constants import MAX_ELEMENTS

    qkv = _qkv(b=4, h=1, length=160, e=4)
    assert 4 * 160 * 160 > MAX_ELEMENTS
    jitted = kiln.jit(_all_true_mask)
    torch.testing.assert_close(jitted(*qkv), _all_true_mask(*qkv))
    assert _eager_call_inputs(jitted) == [3]


def test_a_known_value_follows_pure_ops_only():
    from kiln._constants import known_value
    from kiln._tracer import Tracer, _TracingMode

    tracer = Tracer()
    with _TracingMode(tracer):
        a = torch.arange(6)
        b = (a.view(2, 3) * 2)[1]
        c = torch.ones(3)
        c.add_(1)
    assert known_value(b).tolist() == [6, 8, 10]
    assert known_value(c) is None  # written
    assert known_value(a) is not None


def test_the_mask_hugging_face_makes_under_dynamo_is_dropped(fresh_dynamo):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=128)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 128, (2, 12))
    compiled = torch.compile(model, backend=kiln.backend)
    with torch.no_grad():
        got = compiled(ids).last_hidden_state
        want = model(ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    graphs = [g for g in kiln.backend_graphs() if g.eager_reason is None]
    assert graphs
    counts = [n for g in graphs for n in _eager_call_inputs(g)]
    assert counts and all(n == 3 for n in counts), counts  # every attention without its mask
