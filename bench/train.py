"""Training steps: kiln against eager PyTorch and torch.compile, side by side in one process
(issue 17).

    KILN_EXT_DIR=build/py/python/kiln PYTHONPATH=python python bench/train.py [--device cuda|cpu]
        [--small] [--systems kiln.jit,eager,compile] [--json out.json]

One step is forward (the language-model loss), backward and torch.optim.AdamW's step (eager's
foreach implementation for every system; with --compiled-optimizer, compiled by kiln.backend for
kiln.jit and by Inductor for compile) on GPT-2 small (124M parameters, Hugging Face's
GPT2LMHeadModel with random weights, dropout off) in bfloat16 at batch 8 x 1024 tokens
(--small: the test configuration, float32, batch 2 x 32). Per system:
  step_ms       median wall time of a step (synchronized after each; the optimizer included)
  saved_mb      bytes the forward saves for the backward (autograd's saved-tensor hooks, each
                storage once; kiln's node saves through ctx.save_for_backward like any op)
  loss          the loss at each of the first --check steps from the same initial weights and
                batches, and the largest difference from eager's
  kiln          for kiln.jit: whether the step's forward ran as kiln's differentiated program
Systems: kiln.jit (kiln.jit(model)), eager (the model), compile (torch.compile(model)).
--profile N prints, per system, the N kernels of one step that took the most device time
(torch.profiler); --gaps N the device's idle time in one step and its N longest gaps with what
the host was running then; --steps N, for kiln.jit, the host time of its programs' steps by
kind and the N costliest (on the CPU a step's whole time); with KILN_DUMP=kernels KILN_DUMP_DIR=dir, a kiln kernel's source is the file
of dir whose name holds the kernel's symbol.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings
import weakref

import torch

import kiln


def gpt2(small: bool, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    import transformers

    size = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=128) if small else dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257)
    config = transformers.GPT2Config(
        n_positions=1024, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **size
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).to(device=device, dtype=dtype).train()


class LossOf(torch.nn.Module):
    """The model's language-model loss as the module's one output."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, labels=tokens).loss


def saved_bytes(step_forward) -> int:
    """Bytes the forward saves for the backward, each byte counted once: the memory of the saved
    tensors the graph still holds when the forward returns (a tensor saved by a graph the forward
    dropped is freed, and its address may be another's), kiln's kept graphs of eager steps
    (kiln/_kept_graphs.py) included."""
    saved: list[weakref.ref] = []

    def pack(t: torch.Tensor):
        if isinstance(t, torch.Tensor):
            saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step_forward()
    # Memory, not storage objects: a tensor kiln hands PyTorch is made over its own address (its
    # storage starts at its first element), so the storages' byte ranges are merged.
    spans = []
    for ref in saved:
        t = ref()
        if t is not None and t.untyped_storage().nbytes():
            s = t.untyped_storage()
            spans.append((s.data_ptr(), s.data_ptr() + s.nbytes()))
    loss.backward()
    total, reach = 0, 0
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def top_kernels(step, count: int) -> tuple[list[dict], dict]:
    """The `count` kernels of one call of `step` that took the most device time, and the step's
    device totals: kernels launched and their summed time (next to the wall time, what the host
    costs)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    totals: dict[str, list] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = totals.setdefault(e.name, [0.0, 0])
            t[0] += e.device_time_total / 1e3
            t[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:count]
    summary = {"kernels": sum(n for _, n in totals.values()), "device_ms": sum(ms for ms, _ in totals.values())}
    return [{"kernel": k, "ms": ms, "calls": n} for k, (ms, n) in ranked], summary


def device_idle_gaps(step, count: int) -> dict:
    """Where one call of `step` leaves the GPU idle: the device's busy intervals (kernels and
    copies, merged) from the step's first to its last, the gaps between them, and for the
    `count` longest the host's activity at the gap's start (the innermost and the outermost
    CPU-side event then running: a synchronization, an index check's host read, Python between
    programs). The wall time less the device time is the sum of these gaps and of the time
    before the first kernel."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = list(prof.events())
    device = [(e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    host = [(e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    return idle_gaps(device, host, count)


def idle_gaps(device: list[tuple], host: list[tuple], count: int) -> dict:
    """device_idle_gaps on (start us, end us, name) intervals of the device and of the host."""
    device = sorted(device)
    gaps, busy_until, last_name = [], None, ""
    for start, end, name in device:
        if busy_until is not None and start > busy_until:
            gaps.append((start - busy_until, busy_until, last_name, name))
        if busy_until is None or end > busy_until:
            busy_until, last_name = end, name
    longest = []
    for length, at, before, after in sorted(gaps, reverse=True)[:count]:
        running = sorted((e - s, n) for s, e, n in host if s <= at + 1 < e)
        longest.append({
            "us": length, "after_kernel": before[:60], "before_kernel": after[:60],
            "host_innermost": [n[:60] for _, n in running[:3]], "host_outermost": running[-1][1][:60] if running else "",
        })
    return {"idle_ms": sum(g[0] for g in gaps) / 1e3, "gaps": len(gaps), "over_50us": sum(g[0] > 50 for g in gaps), "longest": longest}


def kiln_step_times(forward, step, count: int) -> dict:
    """Host time of each step of kiln's forward and backward programs in one call of `step`
    (kiln._C.set_step_times; on CUDA the host's part of a step: preparing, launching, a
    synchronization): per program, the total by how a step ran and the `count` costliest."""
    from kiln import _C, _jit

    _C.set_step_times(True)
    try:
        step()
    finally:
        _C.set_step_times(False)
    jitted = _jit._jitted(forward)
    cache = _jit._last_cache(jitted)
    programs = {"forward": cache.last_run_stats["step_times"]}
    if cache is jitted._grad_cache:
        programs["backward"] = cache.last_program.assemble.backward_cache.last_run_stats["step_times"]
    out = {}
    for part, times in programs.items():
        by_how: dict[str, list] = {}
        for _, how, seconds, _ in times:
            total = by_how.setdefault(how, [0.0, 0])
            total[0] += seconds * 1e3
            total[1] += 1
        costliest = sorted(times, key=lambda t: -t[2])[:count]
        out[part] = {
            "ms": sum(t[2] for t in times) * 1e3,
            "by_how": {how: {"ms": ms, "steps": n} for how, (ms, n) in sorted(by_how.items(), key=lambda kv: -kv[1][0])},
            "costliest": [{"step": s, "how": how, "ms": sec * 1e3, "ops": ops[:80]} for s, how, sec, ops in costliest],
        }
    return out


def run_system(name: str, base: torch.nn.Module, batches: list[torch.Tensor], repeat: int, profile: int = 0, gaps: int = 0,
               steps: int = 0, compiled_optimizer: bool = False) -> dict:
    model = copy.deepcopy(base)
    wrapped = LossOf(model)
    forward = {"kiln.jit": lambda: kiln.jit(wrapped), "eager": lambda: wrapped, "compile": lambda: torch.compile(wrapped)}[name]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    # --compiled-optimizer: the step compiled by the system's own compiler (eager's stays eager)
    opt_step = opt.step
    if compiled_optimizer and name != "eager":
        opt_step = torch.compile(opt.step, backend=kiln.backend if name == "kiln.jit" else "inductor")
    device = batches[0].device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(tokens: torch.Tensor) -> torch.Tensor:
        loss = forward(tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt_step()
        return loss.detach()

    losses = []
    differentiated = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for tokens in batches:
            losses.append(float(step(tokens)))
        stats = None
        if name == "kiln.jit":
            try:
                stats = kiln.last_stats(forward)
                differentiated = stats["differentiated"]
            except RuntimeError:  # no kiln program ran: every call ran eagerly
                differentiated = False
    refusals = sorted({str(w.message) for w in caught if "eagerly" in str(w.message)})
    times = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        step(batches[0])
        sync()
        times.append(time.perf_counter() - start)
    kernels, device_totals = top_kernels(lambda: step(batches[0]), profile) if profile and device.type == "cuda" else ([], None)
    idle = device_idle_gaps(lambda: step(batches[0]), gaps) if gaps and device.type == "cuda" else None
    step_times = kiln_step_times(forward, lambda: (step(batches[0]), sync()), steps) if steps and name == "kiln.jit" else None
    saved = saved_bytes(lambda: forward(batches[0]))
    opt.zero_grad(set_to_none=True)
    return {
        "top_kernels": kernels,
        "idle": idle,
        "step_times": step_times,
        "device_totals": device_totals,
        "system": name,
        "compiled_optimizer": compiled_optimizer and name != "eager",
        "step_ms": statistics.median(times) * 1e3,
        "saved_mb": saved / 2**20,
        "losses": losses,
        "differentiated": differentiated,
        "refusals": refusals,
        "kiln_stats": _step_facts(stats),
    }


def _step_facts(stats: dict | None) -> dict | None:
    """What kiln's forward and backward programs of a step ran (kiln.last_stats)."""
    if not stats:
        return None
    keys = ["kernels", "eager_steps", "torch_steps", "view_steps", "interpreted_steps", "layout_copies", "layout_copy_bytes"]
    keys += ["index_checks_first", "index_checks_at_steps", "host_copies", "host_copy_bytes", "aligned_products", "alignment_copy_bytes", "cuda_graph", "cuda_graph_refused"]
    forward = {k: stats[k] for k in keys if k in stats}
    return {"forward": forward, "backward": stats.get("backward")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="the test configuration (float32)")
    parser.add_argument("--systems", default="kiln.jit,eager,compile")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--check", type=int, default=5, help="steps whose losses are compared")
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", type=int, default=0, help="kernels to list per system (CUDA)")
    parser.add_argument("--gaps", type=int, default=0, help="longest device idle gaps of a step to list per system (CUDA)")
    parser.add_argument("--compiled-optimizer", action="store_true",
                        help="AdamW's step compiled by each system's compiler (kiln.backend, Inductor); eager's stays eager")
    parser.add_argument("--steps", type=int, default=0, help="kiln's costliest program steps (host time) to list, forward and backward")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.float32 if args.small else torch.bfloat16
    batch, seq = (2, 32) if args.small else (8, 1024)
    base = gpt2(args.small, dtype, device)
    vocab = base.config.vocab_size
    gen = torch.Generator(device=device).manual_seed(1)
    batches = [torch.randint(0, vocab, (batch, seq), generator=gen, device=device) for _ in range(args.check)]
    results = [run_system(name, base, batches, args.repeat, args.profile, args.gaps, args.steps, args.compiled_optimizer)
               for name in args.systems.split(",")]
    eager = next((r for r in results if r["system"] == "eager"), None)
    print(f"GPT-2 {'small test config' if args.small else '124M'} {str(dtype).removeprefix('torch.')} batch {batch}x{seq} on {device}"
          + (", AdamW compiled by each system's compiler" if args.compiled_optimizer else ", AdamW eager (foreach)"))
    print("| system | step ms | vs eager | saved MB | largest loss difference from eager | kiln's node |")
    print("|---|---|---|---|---|---|")
    for r in results:
        ratio = r["step_ms"] / eager["step_ms"] if eager else float("nan")
        diff = max(abs(a - b) for a, b in zip(r["losses"], eager["losses"])) if eager else float("nan")
        r["max_loss_difference"] = diff
        print(f"| {r['system']} | {r['step_ms']:.2f} | {ratio:.2f}x | {r['saved_mb']:.1f} | {diff:.3g} | {r['differentiated']} |")
        for why in r["refusals"]:
            print(f"  {r['system']} ran eagerly: {why}")
        if r.get("kiln_stats"):
            for part, facts in r["kiln_stats"].items():
                print(f"  {r['system']} {part}: {facts}")
    for r in results:
        if r["top_kernels"]:
            totals = r["device_totals"]
            print(f"{r['system']}: {totals['kernels']} kernels, {totals['device_ms']:.2f} ms of device time in one step;"
                  " those with the most:")
            for t in r["top_kernels"]:
                print(f"  {t['ms']:9.3f} ms {t['calls']:5d} calls  {t['kernel'][:110]}")
    for r in results:
        if r["idle"]:
            i = r["idle"]
            print(f"{r['system']}: device idle {i['idle_ms']:.2f} ms in {i['gaps']} gaps ({i['over_50us']} over 50 us) in one step; the longest:")
            for g in i["longest"]:
                print(f"  {g['us']:8.0f} us after {g['after_kernel']!r} before {g['before_kernel']!r}; host: {g['host_innermost']} in {g['host_outermost']!r}")
    for r in results:
        for part, t in (r["step_times"] or {}).items():
            hows = ", ".join(f"{how} {v['ms']:.2f} ms / {v['steps']}" for how, v in t["by_how"].items())
            print(f"{r['system']} {part}: {t['ms']:.2f} ms of host time in its steps ({hows}); the costliest:")
            for c in t["costliest"]:
                print(f"  {c['ms']:8.3f} ms  step {c['step']:4d} {c['how']:8s} {c['ops']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "dtype": str(dtype), "batch": [batch, seq], "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
