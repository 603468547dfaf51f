"""kiln on PyTorch code: `kiln.jit` on a function with in-place ops, and
`torch.compile(backend="kiln")` on a model (a small GPT-2 from transformers with random weights
when transformers is installed, else a small MLP), each checked against eager PyTorch. On the
GPU when there is one, else on the CPU.

    KILN_EXT_DIR=build/py/python/kiln PYTHONPATH=python python examples/model_demo.py
"""

import copy

import torch

import kiln


def s1(a):
    a.tanh_()
    return a * a * a * a


def small_model() -> tuple[str, torch.nn.Module, torch.Tensor]:
    try:
        import transformers
    except ImportError:
        mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256), torch.nn.Linear(256, 64))
        return "an MLP", mlp, torch.randn(8, 64)
    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=128, bos_token_id=0, eos_token_id=0)
    return "GPT-2 (2 layers, width 128)", transformers.GPT2LMHeadModel(config), torch.randint(0, 512, (2, 32))


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}")
    torch.manual_seed(0)

    print("==== kiln.jit(s1): a.tanh_(); return a * a * a * a")
    jitted = kiln.jit(s1)
    x = torch.randn(5, 5, device=device)
    x_eager = x.clone()
    torch.testing.assert_close(jitted(x), s1(x_eager))
    torch.testing.assert_close(x, x_eager)  # the in-place tanh_ is seen by the caller
    print(kiln.last_traces(jitted)[-1])
    print(f"stats: {kiln.last_stats(jitted)}")

    name, model, inputs = small_model()
    model, inputs = model.to(device).eval(), inputs.to(device)
    eager = copy.deepcopy(model)
    # backend="kiln" once kiln is pip-installed (its torch_dynamo_backends entry point); from
    # the source tree, the function itself.
    from importlib.metadata import entry_points

    backend = "kiln" if "kiln" in entry_points(group="torch_dynamo_backends").names else kiln.backend
    print(f"==== torch.compile({name}, backend={'kiln.backend' if backend is kiln.backend else repr(backend)})")
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        got, want = compiled(inputs), eager(inputs)
    got, want = getattr(got, "logits", got), getattr(want, "logits", want)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for g in kiln.backend_graphs():
        stats = kiln.last_stats(g)
        print(f"graph {g.index}: {stats['fusion_regions']} fusion regions, {stats['kernels']} kernels, {stats['torch_steps']} torch steps, {stats['fallback_ops']} eager steps")
    print("results and side effects match eager")


if __name__ == "__main__":
    main()
