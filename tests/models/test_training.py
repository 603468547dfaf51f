"""Training through kiln (kiln._autograd): a GPT (Hugging Face's GPT-2 architecture, small) and a
ResNet-18 with BatchNorm in train mode, trained with AdamW from the same initial weights and
batches under kiln and under eager, through kiln.jit(model) and torch.compile(model,
backend="kiln"). The loss equals eager's at every step within float32's tolerance, the running
statistics too, and every step's forward ran as kiln's differentiated program (not an eager
refusal). KILN_TRAINING_STEPS sets the steps (default 50).

On the CPU in CI; KILN_TEST_DEVICE=cuda runs them on the GPU (tests/conftest.py).
"""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln

transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")

pytestmark = [
    pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)"),
    pytest.mark.usefixtures("fresh_dynamo"),
]

STEPS = int(os.environ.get("KILN_TRAINING_STEPS", "50"))




def _gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(config).train()


def _resnet18() -> torch.nn.Module:
    return torchvision.models.resnet18(num_classes=10).train()


def _gpt2_batch(gen: torch.Generator) -> tuple:
    tokens = torch.randint(0, 128, (2, 16), generator=gen, device="cpu").to(torch.empty(0).device)
    return (tokens,), lambda model, tokens: model(input_ids=tokens, labels=tokens).loss


def _resnet_batch(gen: torch.Generator) -> tuple:
    x = torch.randn(4, 3, 32, 32, generator=gen, device="cpu").to(torch.empty(0).device)
    y = torch.randint(0, 10, (4,), generator=gen, device="cpu").to(x.device)
    return (x, y), lambda model, x, y: F.cross_entropy(model(x), y)


def _kiln_node(loss: torch.Tensor) -> bool:
    """Whether the loss comes from kiln's autograd node (kiln._autograd), however many eager
    ops (a loss function outside the compiled forward) follow it."""
    seen, stack = set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if type(fn).__name__ == "CompiledFunctionBackward":
            return True
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return False


@pytest.mark.parametrize("door", ["kiln.jit", "torch.compile"])
@pytest.mark.parametrize("name", ["gpt2", "resnet18"])
def test_trains_like_eager(name, door):
    build, batch = {"gpt2": (_gpt2, _gpt2_batch), "resnet18": (_resnet18, _resnet_batch)}[name]
    torch.manual_seed(0)
    model = build().to(torch.empty(0).device)
    reference = copy.deepcopy(model)
    compiled = kiln.jit(model) if door == "kiln.jit" else torch.compile(model, backend=kiln.backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(eagerly|eager PyTorch).*")  # kiln refused
        for step in range(STEPS):
            inputs, loss_of = batch(gen)
            loss = loss_of(compiled, *inputs)
            ref_loss = loss_of(reference, *inputs)
            assert _kiln_node(loss), f"step {step}: the forward did not run as kiln's program"
            torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5, msg=lambda m: f"step {step}: {m}")
            for o, l in ((opt, loss), (ref_opt, ref_loss)):
                o.zero_grad(set_to_none=True)
                l.backward()
                o.step()
    for (n, b), c in zip(model.named_buffers(), reference.buffers()):
        torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-5, msg=lambda m: f"buffer {n}: {m}")
