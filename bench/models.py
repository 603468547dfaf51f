"""Whole models: kiln against eager PyTorch and torch.compile, side by side in one process (issue 15).

    KILN_EXT_DIR=build/py/python/kiln PYTHONPATH=python python bench/models.py [--device cuda|cpu]
        [--small] [--models gpt2,llama,...] [--json out.json]

Per zoo model (random weights; tests/models/test_zoo.py runs the same architectures small), at
batch 1 and at a large batch: the median device time per forward (CUDA events around back-to-back
calls; on the CPU, wall time), the wall time per forward from Python (back-to-back calls,
synchronized at the end) and the kernels launched per forward (the profiler's device events, CUDA
only), for
  kiln            torch.compile(model, backend=kiln.backend)
  kiln.jit        kiln.jit(model), where the model's forward traces whole
  eager           the model itself
  compile         torch.compile(model)
  compile-ro      torch.compile(model, mode="reduce-overhead") (CUDA graphs)
and, for the decoder with a static KV cache (the zoo's, at about 1B parameters in bfloat16 with
the default sizes), decode tokens per second at batch 1 and the byte floor: every weight read
once per token at the measured copy bandwidth. Prints a markdown table and writes JSON.
--small uses the test configurations (a quick run, or the CPU); --profile N prints each forward's N
costliest kernels and kiln's program facts (CUDA); --rounds N measures every system N times in
interleaved rounds and keeps each one's median. Forwards run under
torch.inference_mode() semantics via torch.no_grad().
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from typing import Callable

import torch

import kiln

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import copy_bandwidth, kernels_per_call, time_calls  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tests", "models"))


# ---- the models, at benchmark sizes (and at the test's with --small) ------------------------------


def _transformers():
    import transformers

    return transformers


def gpt2(small: bool):
    t = _transformers()
    size = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=128) if small else dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257)
    return t.GPT2LMHeadModel(t.GPT2Config(n_positions=1024, bos_token_id=0, eos_token_id=0, **size))


def llama(small: bool):
    t = _transformers()
    if small:
        size = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=128)
    else:
        size = dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, intermediate_size=5632, vocab_size=32000)
    return t.LlamaForCausalLM(t.LlamaConfig(max_position_embeddings=1024, **size))


def bert(small: bool):
    t = _transformers()
    size = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=128) if small else {}
    return t.BertModel(t.BertConfig(**size))


def resnet50(small: bool):
    import torchvision

    return torchvision.models.resnet50(num_classes=10 if small else 1000)


def vit(small: bool):
    import torchvision

    if small:
        return torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10)
    return torchvision.models.vit_b_16()


def _tokens(batch: int, small: bool, device) -> tuple:
    return (torch.randint(0, 128, (batch, 12 if small else 128), device=device),)


def _images(batch: int, small: bool, device) -> tuple:
    side = 32 if small else 224
    return (torch.randn(batch, 3, side, side, device=device),)


# name -> (builder, inputs, (small batch, large batch))
MODELS: dict[str, tuple[Callable, Callable, tuple[int, int]]] = {
    "gpt2": (gpt2, _tokens, (1, 32)),
    "llama": (llama, _tokens, (1, 16)),
    "bert": (bert, _tokens, (1, 64)),
    "resnet50": (resnet50, _images, (1, 128)),
    "vit": (vit, _images, (1, 128)),
}


SYSTEMS = ("kiln", "kiln.jit", "eager", "compile", "compile-ro")
_chosen_systems: tuple[str, ...] = SYSTEMS  # --systems
_profile_top = 0  # --profile N: the N costliest kernels of each forward (CUDA)


def _forward_systems(model: torch.nn.Module, device) -> dict[str, Callable]:
    torch._dynamo.reset()
    kiln.clear_backend_graphs()
    makers = {
        "kiln": lambda: torch.compile(copy.deepcopy(model), backend=kiln.backend),
        "kiln.jit": lambda: kiln.jit(copy.deepcopy(model)),
        "eager": lambda: model,
        "compile": lambda: torch.compile(copy.deepcopy(model)),
    }
    if device.type == "cuda":  # CUDA graphs
        makers["compile-ro"] = lambda: torch.compile(copy.deepcopy(model), mode="reduce-overhead")
    return {name: make() for name, make in makers.items() if name in _chosen_systems}


def _wall(call: Callable[[], object], device, repeat: int) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        call()
    sync()
    t = time.perf_counter()
    for _ in range(repeat):
        call()
    sync()
    return (time.perf_counter() - t) / repeat


def bench_forward(name: str, small: bool, dtype: torch.dtype, device, repeat: int, rounds: int = 1) -> list[dict]:
    """Each system's median over `rounds` interleaved rounds (every system once per round, so a
    drift of the host or the GPU's clocks during the run reaches all of them alike)."""
    build, inputs, batches = MODELS[name]
    torch.manual_seed(0)
    model = build(small).to(device=device, dtype=dtype).eval()
    rows = []
    with torch.no_grad():
        for batch in batches:
            args = inputs(batch, small, device)
            args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
            systems = _forward_systems(model, device)
            by_system = {s: {"model": name, "dtype": str(dtype).removeprefix("torch."), "batch": batch, "system": s} for s in systems}
            samples: dict[str, dict[str, list[float]]] = {s: {"device_ms": [], "wall_ms": []} for s in systems}
            for _ in range(rounds):
                for system, fn in systems.items():
                    row = by_system[system]
                    if "error" in row:
                        continue
                    try:
                        call = lambda: fn(*args)  # noqa: E731
                        samples[system]["device_ms"].append(statistics.median(time_calls(call, device, repeat, batch=3)) * 1e3)
                        samples[system]["wall_ms"].append(_wall(call, device, repeat) * 1e3)
                    except Exception as e:  # a system that cannot run the model is a row that says why
                        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            for system, fn in systems.items():
                row = by_system[system]
                if "error" not in row:
                    row["device_ms"] = statistics.median(samples[system]["device_ms"])
                    row["wall_ms"] = statistics.median(samples[system]["wall_ms"])
                    if device.type == "cuda":
                        row["kernels"] = kernels_per_call(fn, list(args))
                rows.append(row)
                print(_format_row(row), flush=True)
                if _profile_top and device.type == "cuda" and "error" not in row:
                    _print_profile(f"{name} {row['dtype']} batch {batch} {system}", fn, args, _profile_top)
    return rows


def _print_profile(title: str, fn: Callable, args: tuple, top: int) -> None:
    """The `top` kernels of one forward by device time, and what kiln ran (its programs' stats)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e.device_time_total / 1e3)
    total = sum(sum(v) for v in by_name.values())
    print(f"-- profile of {title}: {len(events)} device events, {total:.3f} ms")
    for kernel, times in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"   {sum(times):8.3f} ms {len(times):4d}x  {kernel[:110]}")
    jitted = [fn] if hasattr(fn, "_kiln_forward") or isinstance(fn, kiln.JitFunction) else []
    if not jitted and hasattr(fn, "_orig_mod") and "kiln" in title.split()[-1]:
        jitted = kiln.backend_graphs()
    for g in jitted:
        try:
            stats = kiln.last_stats(g)
        except Exception:  # a graph that ran eagerly has no program
            continue
        facts = ("fusion_regions", "kernels", "torch_steps", "eager_steps", "layout_copies", "cuda_graph", "cuda_graph_refused")
        print("   kiln program:", {k: stats[k] for k in facts})


def bench_decode(small: bool, device, tokens: int) -> list[dict]:
    """Decode tokens per second at batch 1 for the zoo's static-KV-cache decoder."""
    from test_zoo import Decoder

    dtype = torch.float32 if small else torch.bfloat16
    size = dict(vocab=50, dim=32, heads=4, layers=2, length=64) if small else dict(vocab=32000, dim=2048, heads=16, layers=20, length=256)
    torch.manual_seed(0)
    model = Decoder(**size).to(device=device, dtype=dtype).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    floor_s = weights / copy_bandwidth(device) if device.type == "cuda" else float("nan")
    rows = []
    steps = min(tokens, size["length"])
    with torch.no_grad():
        for system, fn in _forward_systems(model, device).items():
            row = {"model": "decoder", "params": sum(p.numel() for p in model.parameters()), "dtype": str(dtype).removeprefix("torch."), "batch": 1, "system": system}
            try:
                ids = torch.tensor([[1]], device=device)
                positions = [torch.tensor([p], device=device) for p in range(size["length"])]
                for p in range(3):  # warm-up (compiles)
                    ids = fn(ids, positions[p]).argmax(-1)
                sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
                sync()
                t = time.perf_counter()
                for p in range(steps):
                    ids = fn(ids, positions[p]).argmax(-1)
                sync()
                per_token = (time.perf_counter() - t) / steps
                row["tokens_per_s"] = 1 / per_token
                row["ms_per_token"] = per_token * 1e3
                row["x_floor"] = per_token / floor_s if device.type == "cuda" else None
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            rows.append(row)
            print(_format_row(row), flush=True)
            if _profile_top and device.type == "cuda" and "error" not in row:
                _print_profile(f"decoder {row['dtype']} one token {system}", fn, (ids, positions[steps % size["length"]]), _profile_top)
    return rows


def _format_row(row: dict) -> str:
    keys = [k for k in ("device_ms", "wall_ms", "kernels", "tokens_per_s", "ms_per_token", "x_floor", "error") if k in row]
    values = ", ".join(f"{k}={row[k]:.3f}" if isinstance(row[k], float) else f"{k}={row[k]}" for k in keys)
    return f"{row['model']} {row['dtype']} batch {row['batch']} {row['system']}: {values}"


def markdown(rows: list[dict]) -> str:
    forward = [r for r in rows if "tokens_per_s" not in r and r["model"] != "decoder"]
    out = ["| model | dtype | batch | system | device ms | wall ms | kernels | vs eager (device) |", "|---|---|---|---|---|---|---|---|"]
    eager = {(r["model"], r["dtype"], r["batch"]): r.get("device_ms") for r in forward if r["system"] == "eager"}
    for r in forward:
        if "error" in r:
            out.append(f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['system']} | {r['error']} | | | |")
            continue
        base = eager.get((r["model"], r["dtype"], r["batch"]))
        ratio = f"{r['device_ms'] / base:.2f}x" if base else ""
        out.append(f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['system']} | {r['device_ms']:.3f} | {r['wall_ms']:.3f} | {r.get('kernels', '')} | {ratio} |")
    decode = [r for r in rows if r["model"] == "decoder"]
    if decode:
        out += ["", "| decoder | params | dtype | system | tokens/s | ms/token | x byte floor |", "|---|---|---|---|---|---|---|"]
        for r in decode:
            if "error" in r:
                out.append(f"| decoder | {r['params']} | {r['dtype']} | {r['system']} | {r['error']} | | |")
            else:
                floor = f"{r['x_floor']:.2f}x" if r.get("x_floor") else ""
                out.append(f"| decoder | {r['params']} | {r['dtype']} | {r['system']} | {r['tokens_per_s']:.1f} | {r['ms_per_token']:.3f} | {floor} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="the test configurations")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ",".join(MODELS) + ",decoder")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds per forward row (its median)")
    parser.add_argument("--tokens", type=int, default=128, help="decode steps timed")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated: " + ",".join(SYSTEMS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", type=int, default=0, help="print the N costliest kernels of each forward (CUDA)")
    args = parser.parse_args()
    global _chosen_systems, _profile_top
    _chosen_systems = tuple(s for s in args.systems.split(",") if s)
    _profile_top = args.profile
    device = torch.device(args.device)
    names = [n for n in args.models.split(",") if n]
    rows: list[dict] = []
    for name in names:
        if name == "decoder":
            continue
        for dtype_name in args.dtypes.split(","):
            rows += bench_forward(name, args.small, getattr(torch, dtype_name), device, args.repeat, args.rounds)
    if "decoder" in names or args.models == ",".join(MODELS):
        rows += bench_decode(args.small, device, args.tokens)
    header = f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
    print("\n" + header + "\n\n" + markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": header, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
