"""The model zoo: whole models through torch.compile(backend="kiln") and kiln.jit(module) against
eager PyTorch, random weights, small configurations. From transformers GPT-2, Llama (grouped-query
attention, RoPE, RMSNorm) and BERT; from torchvision ResNet-50 (BatchNorm in eval and in train
mode, whose running statistics must equal eager's) and a ViT (ViT-B/16's architecture, fewer and
narrower layers); and a small decoder-only transformer with a static KV cache updated in place.
Outputs and buffers equal eager's within the dtype's tolerance; greedy generation with Hugging
Face's static cache gives eager's tokens.

On the CPU in CI; KILN_TEST_DEVICE=cuda runs them on the GPU (tests/conftest.py).
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")

pytestmark = [
    pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)"),
    pytest.mark.usefixtures("fresh_dynamo"),
]

_DTYPES = [torch.float32, torch.bfloat16]


_TOLERANCE = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=4e-2, atol=4e-2)}


def _gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    return transformers.GPT2LMHeadModel(config)


def _llama():
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=128, max_position_embeddings=64
    )
    return transformers.LlamaForCausalLM(config)


def _bert():
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=128)
    return transformers.BertModel(config)


def _resnet50():
    return torchvision.models.resnet50(num_classes=10)


def _vit():
    return torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10)


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(seed), device="cpu").to(torch.get_default_device())


def _images(seed: int) -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed), device="cpu").to(torch.get_default_device())


MODELS = {"gpt2": (_gpt2, _tokens), "llama": (_llama, _tokens), "bert": (_bert, _tokens), "resnet50": (_resnet50, _images), "vit": (_vit, _images)}


def _pair(make, dtype):
    torch.manual_seed(0)
    m = make().to(dtype).eval()
    return m, copy.deepcopy(m)


def _output(out):
    for name in ("logits", "last_hidden_state"):
        if hasattr(out, name):
            return getattr(out, name)
    return out


def _check_state(got: torch.nn.Module, want: torch.nn.Module, tolerance: dict) -> None:
    g, w = got.state_dict(), want.state_dict()
    assert list(g) == list(w)
    for k in w:
        torch.testing.assert_close(g[k], w[k], **tolerance, msg=lambda m: f"{k}: {m}")


def _no_eager_graphs() -> None:
    reasons = [g.eager_reason for g in kiln.backend_graphs() if g.eager_reason]
    assert not reasons, reasons
    for g in kiln.backend_graphs():
        assert kiln.last_stats(g)["host_copies"] == 0


@pytest.mark.parametrize("dtype", _DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_torch_compile_with_the_kiln_backend(name, dtype):
    make, inputs = MODELS[name]
    m, eager = _pair(make, dtype)
    compiled = torch.compile(m, backend=kiln.backend)
    with torch.no_grad():
        for seed in range(2):
            x = inputs(seed)
            x = x.to(dtype) if x.is_floating_point() else x
            torch.testing.assert_close(_output(compiled(x)), _output(eager(x)), **_TOLERANCE[dtype])
    _check_state(m, eager, _TOLERANCE[dtype])
    _no_eager_graphs()
    # No graph break of kiln's making: Dynamo alone (torch._dynamo.explain, its eager backend)
    # captures as many graphs.
    graphs = len(kiln.backend_graphs())
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(copy.deepcopy(eager))(x)
    assert graphs == explained.graph_count, explained.break_reasons


@pytest.mark.parametrize("name", list(MODELS))
def test_kiln_jit_of_the_module(name):
    make, inputs = MODELS[name]
    m, eager = _pair(make, torch.float32)
    jm = kiln.jit(m)
    with torch.no_grad():
        for seed in range(2):
            x = inputs(seed)
            torch.testing.assert_close(_output(jm(x)), _output(eager(x)), **_TOLERANCE[torch.float32])
    assert kiln.last_stats(jm)["cache_hits"] == 1  # the second call reuses the program


def test_resnet50_in_train_mode_updates_the_running_statistics_as_eager():
    m, eager = _pair(_resnet50, torch.float32)
    m.train()
    eager.train()
    compiled = torch.compile(m, backend=kiln.backend)
    with torch.no_grad():
        for seed in range(3):
            x = _images(seed) * (seed + 1)
            torch.testing.assert_close(compiled(x), eager(x), **_TOLERANCE[torch.float32])
            _check_state(m, eager, _TOLERANCE[torch.float32])
    assert m.bn1.num_batches_tracked.item() == 3
    _no_eager_graphs()


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_generation_with_a_static_cache_gives_eagers_tokens(name):
    # As Hugging Face documents torch.compile: the model's forward compiled, a static cache.
    make, _ = MODELS[name]
    m, eager = _pair(make, torch.float32)
    m.forward = torch.compile(m.forward, backend=kiln.backend)
    prompt = _tokens(0)[:1, :5]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on generation settings
        got = m.generate(prompt, max_new_tokens=32, do_sample=False, cache_implementation="static")
        want = eager.generate(prompt, max_new_tokens=32, do_sample=False, cache_implementation="static")
    assert torch.equal(got, want)
    _no_eager_graphs()


class Decoder(torch.nn.Module):
    """A small decoder-only transformer with a static KV cache updated in place (index_copy_)."""

    def __init__(self, vocab=50, dim=32, heads=4, layers=2, length=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
            block = torch.nn.ModuleDict(
                {"norm1": torch.nn.LayerNorm(dim), "qkv": torch.nn.Linear(dim, 3 * dim), "out": torch.nn.Linear(dim, dim), "norm2": torch.nn.LayerNorm(dim), "mlp": mlp}
            )
            block.register_buffer("k_cache", torch.zeros(1, heads, length, dim // heads))
            block.register_buffer("v_cache", torch.zeros(1, heads, length, dim // heads))
            self.blocks.append(block)
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.heads, self.length = heads, length

    def forward(self, ids, pos):
        b, t = ids.shape
        x = self.embed(ids)
        mask = torch.arange(self.length, device=ids.device) <= pos[-1]
        for block in self.blocks:
            q, k, v = block["qkv"](block["norm1"](x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            block.k_cache.index_copy_(2, pos, k)
            block.v_cache.index_copy_(2, pos, v)
            scores = q @ block.k_cache.transpose(-1, -2) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(~mask, float("-inf"))
            attn = (scores.softmax(-1) @ block.v_cache).transpose(1, 2).reshape(b, t, -1)
            x = x + block["out"](attn)
            x = x + block["mlp"](block["norm2"](x))
        return self.head(self.norm(x))


@pytest.mark.parametrize("how", ["torch_compile", "kiln_jit"])
def test_a_decoder_with_a_static_kv_cache_decodes_as_eager(how):
    m, eager = _pair(Decoder, torch.float32)
    compiled = torch.compile(m, backend=kiln.backend) if how == "torch_compile" else kiln.jit(m)
    device = torch.get_default_device()
    with torch.no_grad():
        ids = want_ids = torch.tensor([[3]], device=device)
        for p in range(m.length):
            pos = torch.tensor([p], device=device)
            got, want = compiled(ids, pos), eager(want_ids, pos)
            torch.testing.assert_close(got, want, **_TOLERANCE[torch.float32])
            ids, want_ids = got.argmax(-1), want.argmax(-1)
            assert torch.equal(ids, want_ids)
    _check_state(m, eager, _TOLERANCE[torch.float32])
    if how == "torch_compile":
        graphs = kiln.backend_graphs()
        assert len(graphs) == 1  # one graph, one program for every position (pos is an input)
        stats = kiln.last_stats(graphs[0])
    else:
        stats = kiln.last_stats(compiled)
    assert stats["cache_misses"] == 1 and stats["host_copies"] == 0 and stats["fallback_ops"] == 0
    if device.type == "cuda":  # every step on the device: from the third position on, one CUDA graph
        assert stats["cuda_graph"] == "replayed", stats["cuda_graph_refused"]
