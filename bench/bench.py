"""kiln against eager PyTorch and torch.compile, side by side in one process (issue 6).

    KILN_EXT_DIR=build/py/python/kiln PYTHONPATH=python python bench/bench.py [--device cuda|cpu]
        [--sizes 20,26] [--json out.json] [--quick]

Per workload and size: the byte floor (each input read once, each output and each written input
element written once, at the measured device-to-device copy bandwidth); the median device time
per call (CUDA events; on the CPU, wall time) for kiln, eager and torch.compile; kernels launched
per call (from the profiler, CUDA only); per-call wall time from Python at 5x1024 elements
(back-to-back calls, synchronized at the end); first-call latencies (kiln with an empty and with a
warm kiln cache folder, each in a fresh process, and torch.compile's first call). Prints a markdown
table and writes JSON.

Inputs are made fresh for every workload and cycle through several copies, so that a call does not
find its inputs in the L2 cache; mutation repeats on every call, as real code does (values drift,
which does not change the time of these kernels).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

# Count kiln's host time per phase of a call (read once, when kiln._C loads): host_split.
os.environ.setdefault("KILN_PROFILE_CALLS", "1")

import torch
import torch.nn.functional as F

import kiln

# The seeds S1 and S2, as the demo runs them (examples/seed.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from seed import s1, s2  # noqa: E402

# ---- workloads -----------------------------------------------------------------------------------


def view(x):
    v = x[:, ::2]
    v.mul_(0.5)
    return x * 2 + 1


def residual(h, r):
    h.add_(r)
    h.relu_()
    return h * 0.5


def normalization(x, w, b):
    y = x - x.mean(-1, keepdim=True)
    y.mul_(w)
    y.add_(b)
    return y


def rms_norm(x, w):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    y.mul_(w)
    return y


def softmax_slice(x):
    x[:, :512] = torch.softmax(x[:, :512], -1)


def adam(params, grads, ms, vs):
    lr, wd, b1, b2, eps = 1e-3, 1e-2, 0.9, 0.999, 1e-8
    for p, g, m, v in zip(params, grads, ms, vs):
        p.mul_(1 - lr * wd)
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        p.addcdiv_(m, v.sqrt().add_(eps), value=-lr)


# Reductions whose output is one element per column or per row (issue 16; the reduction schedules
# of src/kiln/codegen/schedule_reduction.h), and a full reduction.
def column_sum(x):
    x.mul_(2)
    return x.sum(0)


def row_sum(x):
    x[:, : x.shape[1] // 2].clamp_(-1, 1)
    return x.sum(-1)


def norm_weight_grads(g, xhat):
    return (g * xhat).sum(0), g.sum(0)


def full_amax(x):
    x.abs_()
    return x.amax()


# The rest of issue 16's workloads: softmax and layer norm at long and short rows, a transposed
# operand, broadcast operands, a write through a strided view before a row sum, and SGD with
# momentum over many parameters of mixed sizes (the multi-tensor case).
def softmax_rows(x):
    return torch.softmax(x, -1)


def layer_norm_rows(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def transposed_add(x, y):
    x.add_(y.t())
    return x


def broadcast_affine(x, s, t):
    x.mul_(s[:, None]).add_(t)
    return x


def strided_copy_row_sum(x, y):
    x[:, ::2].copy_(y)
    return x.sum(-1)


# Reductions over several dims of an image batch [N, C, H, W] and over the first dim: a global
# average pool (over h and w), a batch norm's training statistics and normalization (over n, h
# and w), and a softmax over columns.
def spatial_mean(x):
    return x.mean((2, 3))


def batch_norm_statistics(x):
    mean = x.mean((0, 2, 3), keepdim=True)
    var = x.var((0, 2, 3), keepdim=True, unbiased=False)
    return (x - mean) * torch.rsqrt(var + 1e-5)


def softmax_columns(x):
    return torch.softmax(x, 0)


def sgd_momentum(params, grads, bufs):
    lr, momentum = 0.01, 0.9
    for p, g, buf in zip(params, grads, bufs):
        buf.mul_(momentum).add_(g)
        p.add_(buf, alpha=-lr)


@dataclass
class Workload:
    name: str
    fn: Callable
    make: Callable[[int, torch.dtype, torch.device], list]  # (elements, dtype, device) -> args
    moved: Callable[[int], float]  # elements of traffic per element: reads + writes


def _rows(n: int) -> tuple[int, int]:
    return max(n // 1024, 1), 1024


def _wide(n: int, width: int = 4096) -> tuple[int, int]:
    return max(n // width, 1), width


def _images(n: int, channels: int = 64, side: int = 28) -> tuple[int, int, int, int]:
    return max(n // (channels * side * side), 1), channels, side, side


def _adam_sizes(n: int) -> list[int]:
    # Ten tensors of mixed sizes (weights, biases, embeddings) that add up to about n.
    shares = [16, 1, 8, 1, 4, 1, 2, 1, 1, 1]
    return [max(n * s // sum(shares), 1) for s in shares]


def _make_adam(n, dtype, device):
    sizes = _adam_sizes(n)
    r = lambda k: torch.randn(k, dtype=dtype, device=device)  # noqa: E731
    return [[r(k) for k in sizes], [r(k) for k in sizes], [r(k) for k in sizes], [r(k).abs() for k in sizes]]


def _square(n: int) -> tuple[int, int]:
    side = max(int(math.isqrt(n)), 1)
    return side, side


def _sgd_sizes(n: int) -> list[int]:
    # 50 parameters from 1 element to 2^22 (a geometric series), scaled to add up to about n.
    base = [round(2 ** (22 * i / 49)) for i in range(50)]
    scale = n / sum(base)
    return [max(int(k * scale), 1) for k in base]


def _make_sgd(n, dtype, device):
    sizes = _sgd_sizes(n)
    r = lambda k: torch.randn(k, dtype=dtype, device=device)  # noqa: E731
    return [[r(k) for k in sizes], [r(k) for k in sizes], [r(k) for k in sizes]]


def _make_layer_norm(width):
    def make(n, d, dev):
        rows = max(n // width, 1)
        return [torch.randn(rows, width, dtype=d, device=dev), torch.randn(width, dtype=d, device=dev),
                torch.randn(width, dtype=d, device=dev)]
    return make


WORKLOADS = [
    Workload("S1", s1, lambda n, d, dev: [torch.randn(n, dtype=d, device=dev)], lambda n: 3 * n),
    Workload("S2", s2, lambda n, d, dev: [torch.randn(n, dtype=d, device=dev)], lambda n: 3 * n),
    Workload("view", view, lambda n, d, dev: [torch.randn(*_rows(n), dtype=d, device=dev)], lambda n: 2.5 * n),
    Workload("residual", residual, lambda n, d, dev: [torch.randn(n, dtype=d, device=dev) for _ in range(2)], lambda n: 4 * n),
    Workload("normalization", normalization,
             lambda n, d, dev: [torch.randn(*_rows(n), dtype=d, device=dev), torch.randn(1024, dtype=d, device=dev), torch.randn(1024, dtype=d, device=dev)],
             lambda n: 2 * n),
    Workload("rms norm", rms_norm, lambda n, d, dev: [torch.randn(*_rows(n), dtype=d, device=dev), torch.randn(1024, dtype=d, device=dev)], lambda n: 2 * n),
    Workload("softmax slice", softmax_slice, lambda n, d, dev: [torch.randn(*_rows(n), dtype=d, device=dev)], lambda n: 1 * n),
    Workload("adam", adam, _make_adam, lambda n: 7 * sum(_adam_sizes(n)) / n * n),
    Workload("column sum", column_sum, lambda n, d, dev: [torch.randn(*_wide(n), dtype=d, device=dev)], lambda n: 2 * n),
    Workload("row sum", row_sum, lambda n, d, dev: [torch.randn(*_wide(n), dtype=d, device=dev)], lambda n: 1.5 * n),
    Workload("norm weight grads", norm_weight_grads,
             lambda n, d, dev: [torch.randn(*_wide(n, 768), dtype=d, device=dev) for _ in range(2)], lambda n: 2 * n),
    Workload("full amax", full_amax, lambda n, d, dev: [torch.randn(n, dtype=d, device=dev)], lambda n: 2 * n),
    Workload("softmax long rows", softmax_rows, lambda n, d, dev: [torch.randn(64, max(n // 64, 1), dtype=d, device=dev)],
             lambda n: 2 * n),
    Workload("softmax short rows", softmax_rows, lambda n, d, dev: [torch.randn(max(n // 64, 1), 64, dtype=d, device=dev)],
             lambda n: 2 * n),
    Workload("layer norm 64", layer_norm_rows, _make_layer_norm(64), lambda n: 2 * n),
    Workload("layer norm 8192", layer_norm_rows, _make_layer_norm(8192), lambda n: 2 * n),
    Workload("transposed add", transposed_add, lambda n, d, dev: [torch.randn(*_square(n), dtype=d, device=dev) for _ in range(2)],
             lambda n: 3 * n),
    Workload("broadcast affine", broadcast_affine,
             lambda n, d, dev: [torch.randn(*_rows(n), dtype=d, device=dev), torch.randn(_rows(n)[0], dtype=d, device=dev),
                                torch.randn(1024, dtype=d, device=dev)],
             lambda n: 2 * n),
    Workload("strided copy row sum", strided_copy_row_sum,
             lambda n, d, dev: [torch.randn(*_wide(n), dtype=d, device=dev),
                                torch.randn(_wide(n)[0], 2048, dtype=d, device=dev)],
             lambda n: 2 * n),
    Workload("sgd", sgd_momentum, _make_sgd, lambda n: 5 * sum(_sgd_sizes(n)) / n * n),
    Workload("spatial mean", spatial_mean, lambda n, d, dev: [torch.randn(*_images(n), dtype=d, device=dev)], lambda n: 1 * n),
    Workload("batch norm statistics", batch_norm_statistics, lambda n, d, dev: [torch.randn(*_images(n), dtype=d, device=dev)],
             lambda n: 2 * n),
    Workload("softmax columns", softmax_columns, lambda n, d, dev: [torch.randn(max(n // 64, 1), 64, dtype=d, device=dev)],
             lambda n: 2 * n),
]

# ---- timing --------------------------------------------------------------------------------------


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large device-to-device copy, read + write counted."""
    n = 1 << 28 if device.type == "cuda" else 1 << 25
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1)
    dst = torch.empty_like(src)
    times = time_calls(lambda: dst.copy_(src), device, 30)
    return 2 * n * 4 / statistics.median(times)


def time_calls(call: Callable[[], object], device: torch.device, repeat: int, batch: int = 10) -> list[float]:
    """Seconds per call: `repeat` samples, each of `batch` back-to-back calls between two CUDA
    events (on the CPU, wall time). Back to back, as the issue measures: while the device runs a
    call, the host prepares the next, so a host faster than the kernel is not counted; a host
    slower than the kernel is (at small sizes that is the true cost of a call)."""
    for _ in range(3):
        call()
    out = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(batch):
                call()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / batch)
    else:
        for _ in range(repeat):
            t = time.perf_counter()
            call()
            out.append(time.perf_counter() - t)
    return out


def wall_per_call(fn: Callable, args: list, device: torch.device, repeat: int = 2000) -> float:
    """Seconds per call of back-to-back calls from Python, synchronized at the end."""
    for _ in range(20):
        fn(*args)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(repeat):
        fn(*args)
    sync()
    return (time.perf_counter() - t) / repeat


def host_split(fn: Callable, args: list, device: torch.device, repeat: int) -> dict:
    """Where a small call's host time goes (microseconds per call, back to back): the whole call;
    the C++ part (kiln._C.JitCache.run called directly, without the Python wrapper); and, of the
    C++ part, each phase kiln._C counts when KILN_PROFILE_CALLS is set, as main() does
    (src/kiln/support/call_profile.h; the counting itself adds two clock reads per phase).
    Python wrapper = whole - C++."""
    from kiln import _C, _jit

    f = kiln.jit(fn)
    whole = wall_per_call(f, args, device, repeat)
    cache = f._cache
    # The key kiln.jit looks up: the arguments themselves, or, with lists among them (an
    # optimizer's parameters), their leaves and structure as the Python wrapper flattens them.
    if any(isinstance(a, (list, tuple)) for a in args):
        leaves, structure = _jit._flat_arguments(fn, tuple(args), {})
        run = lambda *a: cache.run(structure, leaves, _jit._MISS)  # noqa: E731
    else:
        run = lambda *a: cache.run(len(a), a, _jit._MISS)  # noqa: E731
    assert run(*args) is not _jit._MISS, "the direct call missed the cache"
    direct = wall_per_call(run, args, device, repeat)
    before = dict(_C.call_phase_seconds())
    wall_per_call(run, args, device, repeat)
    after = dict(_C.call_phase_seconds())
    calls = repeat + 20  # wall_per_call warms up with 20 calls
    out = {"split_whole_us": whole * 1e6, "split_cpp_us": direct * 1e6}
    for phase in after:
        out[f"split_{phase}_us"] = (after[phase] - before[phase]) / calls * 1e6
    out["split_launch_us"] = out.get("split_launch_us", 0.0)
    return out


def kernels_per_call(fn: Callable, args: list) -> int:
    from torch.profiler import ProfilerActivity, profile

    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    # Device-side events: kernels, and memcpy/memset work (both cost a launch).
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def systems(fn: Callable) -> dict[str, Callable]:
    return {"kiln": kiln.jit(fn), "eager": fn, "torch.compile": torch.compile(fn)}


# ---- first-call latency in a fresh process -------------------------------------------------------

_FIRST_CALL = r"""
import sys, time
import torch, kiln
sys.path.insert(0, {bench_dir!r})
from bench import s1
device = torch.device({device!r})
x = torch.randn(1 << 20, device=device)
if device.type == "cuda":
    torch.cuda.synchronize()
f = kiln.jit(s1) if {system!r} == "kiln" else torch.compile(s1)
t = time.perf_counter()
f(x)
if device.type == "cuda":
    torch.cuda.synchronize()
print(time.perf_counter() - t)
"""


def first_call(system: str, device: torch.device, cache_dir: str) -> float:
    code = _FIRST_CALL.format(bench_dir=os.path.dirname(os.path.abspath(__file__)), device=str(device), system=system)
    env = dict(os.environ, KILN_CACHE_DIR=cache_dir)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"first call ({system}) failed:\n{r.stderr[-2000:]}")
    return float(r.stdout.strip().splitlines()[-1])


# ---- size classes: kernels compiled at new sizes ---------------------------------------------------


def size_classes(workloads: list[Workload], device: torch.device, log2: int, steps: int = 6) -> list[dict]:
    """Each workload through one kiln.jit at `steps` element counts from 2^log2 up, 8192 elements
    apart (8 more rows of 1024, 2 more of 4096, a wider square, ...): the kernels each new count
    compiled or read from the disk cache (not found loaded), and its first call's wall time. A
    kernel reads each nest's outermost extent at run time, so a count that only adds rows of a
    size class compiles nothing; a count that changes a row's length or a schedule's choice does."""
    rows = []
    for w in workloads:
        f = kiln.jit(w.fn)
        loaded, first_ms = [], []
        for step in range(steps):
            args = w.make((1 << log2) + step * 8192, torch.float32, device)
            stats = kiln.kernel_cache_stats()[device.type]
            before = stats["compiled"] + stats["disk_hits"]
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            f(*args)
            if device.type == "cuda":
                torch.cuda.synchronize()
            first_ms.append((time.perf_counter() - t) * 1e3)
            stats = kiln.kernel_cache_stats()[device.type]
            loaded.append(stats["compiled"] + stats["disk_hits"] - before)
        row = {"workload": w.name, "kernels_loaded": loaded, "first_call_ms": [round(t, 1) for t in first_ms]}
        rows.append(row)
        print(row, flush=True)
    return rows


# ---- main ----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default=None, help="log2 of the element counts (default 20,26 on CUDA, 20,24 on the CPU)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a smoke test)")
    ap.add_argument("--workloads", default=None, help="comma-separated names (_ for a space: rms_norm)")
    ap.add_argument("--no-first-call", action="store_true", help="skip the first-call latencies")
    ap.add_argument("--size-classes", action="store_true",
                    help="only the kernels each workload compiles at new element counts (from the first size)")
    opts = ap.parse_args()
    device = torch.device(opts.device)
    cuda = device.type == "cuda"
    sizes = [int(s) for s in (opts.sizes or ("20,26" if cuda else "20,24")).split(",")]
    repeat = 5 if opts.quick else 30
    wanted = {name.replace("_", " ") for name in opts.workloads.split(",")} if opts.workloads else None
    workloads = [w for w in WORKLOADS if wanted is None or w.name in wanted]  # rms_norm: "rms norm"
    copies = 2 if opts.quick else 4

    info = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    bandwidth = copy_bandwidth(device)
    info["copy_GBps"] = bandwidth / 1e9
    print(f"# kiln bench: {info}")
    if opts.size_classes:
        report = {"info": info, "size_classes": size_classes(workloads, device, sizes[0])}
        if opts.json:
            with open(opts.json, "w") as fh:
                json.dump(report, fh, indent=1)
        return
    rows = []
    configs = [(s, torch.float32) for s in sizes] + ([(max(sizes), torch.bfloat16)] if cuda else [])
    for w in workloads:
        for log2, dtype in configs:
            n = 1 << log2
            sample = w.make(n, dtype, device)
            es = torch.empty((), dtype=dtype).element_size()
            floor = w.moved(n) * es / bandwidth
            inputs = [sample] + [w.make(n, dtype, device) for _ in range(copies - 1)]
            row = {"workload": w.name, "elements": f"2^{log2}", "dtype": str(dtype).removeprefix("torch."), "floor_ms": floor * 1e3}
            for name, f in systems(w.fn).items():
                k = iter(range(1 << 30))
                try:
                    times = time_calls(lambda: f(*inputs[next(k) % copies]), device, repeat)
                    row[f"{name}_ms"] = statistics.median(times) * 1e3
                except Exception as e:  # noqa: BLE001 (a system that fails is reported, not fatal)
                    row[f"{name}_ms"] = None
                    row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            rows.append(row)
            del inputs, sample
            if cuda:
                torch.cuda.empty_cache()
            print(_row_text(row), flush=True)

    small = []
    for w in workloads:
        args = w.make(5 * 1024, torch.float32, device)
        row = {"workload": w.name}
        for name, f in systems(w.fn).items():
            try:
                row[f"{name}_us"] = wall_per_call(f, args, device, 200 if opts.quick else 2000) * 1e6
                if cuda:
                    row[f"{name}_kernels"] = kernels_per_call(f, args)
            except Exception as e:  # noqa: BLE001
                row[f"{name}_us"] = None
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if row.get("kiln_us"):
            row.update(host_split(w.fn, args, device, 200 if opts.quick else 2000))
        small.append(row)
        print(row, flush=True)

    first = {}
    if not opts.no_first_call:
        with tempfile.TemporaryDirectory() as cache:
            first["kiln_empty_cache_s"] = first_call("kiln", device, cache)
            first["kiln_warm_cache_s"] = first_call("kiln", device, cache)
        first["torch.compile_s"] = first_call("torch.compile", device, tempfile.mkdtemp())
        print(first)

    report = {"info": info, "large": rows, "small": small, "first_call": first}
    print()
    print(markdown(report))
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(report, fh, indent=1)


def _ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def _row_text(r: dict) -> str:
    parts = [f"{r['workload']} {r['elements']} {r['dtype']}: floor {r['floor_ms']:.4f} ms"]
    for s in ("kiln", "eager", "torch.compile"):
        v = r.get(f"{s}_ms")
        parts.append(f"{s} {v:.4f} ms ({_ratio(v, r['floor_ms'])})" if v else f"{s} failed: {r.get(s + '_error')}")
    return "; ".join(parts)


def markdown(report: dict) -> str:
    info = report["info"]
    lines = [f"{info['date']}, {info['device']}, torch {info['torch']} (CUDA {info['cuda']}); copy {info['copy_GBps']:.0f} GB/s", ""]
    lines += ["| workload | elements | dtype | floor ms | kiln ms (x floor) | eager ms (x floor) | torch.compile ms (x floor) | kiln / compile |", "|---|---|---|---|---|---|---|---|"]
    for r in report["large"]:
        cells = []
        for s in ("kiln", "eager", "torch.compile"):
            v = r.get(f"{s}_ms")
            cells.append(f"{v:.4f} ({_ratio(v, r['floor_ms'])})" if v else "failed")
        lines.append(f"| {r['workload']} | {r['elements']} | {r['dtype']} | {r['floor_ms']:.4f} | " + " | ".join(cells) + f" | {_ratio(r.get('kiln_ms'), r.get('torch.compile_ms'))} |")
    lines += ["", "| workload (5x1024) | kiln us/call | eager us/call | torch.compile us/call | kernels kiln / eager / compile | kiln split: Python / C++ less launch / launch |", "|---|---|---|---|---|---|"]
    for r in report["small"]:
        us = [f"{r[k]:.1f}" if r.get(k) else "failed" for k in ("kiln_us", "eager_us", "torch.compile_us")]
        kernels = " / ".join(str(r.get(f"{s}_kernels", "-")) for s in ("kiln", "eager", "torch.compile"))
        split = "-"
        if "split_whole_us" in r:
            py = r["split_whole_us"] - r["split_cpp_us"]
            split = f"{py:.1f} / {r['split_cpp_us'] - r['split_launch_us']:.1f} / {r['split_launch_us']:.1f}"
        lines.append(f"| {r['workload']} | " + " | ".join(us) + f" | {kernels} | {split} |")
    phased = [r for r in report["small"] if "split_execute_us" in r]
    if phased:
        lines += ["", "| workload (5x1024), kiln's C++ per call, us | key | arguments | execute: allocate | kernel less launch | launch | rest | results | other (bindings) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in phased:
            g = lambda k: r.get(f"split_{k}_us", 0.0)  # noqa: E731
            rest = g("execute") - g("allocate") - g("kernel")
            other = r["split_cpp_us"] - g("key") - g("arguments") - g("execute") - g("results")
            cells = [g("key"), g("arguments"), g("allocate"), g("kernel") - g("launch"), g("launch"), rest, g("results"), other]
            lines.append(f"| {r['workload']} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    f = report["first_call"]
    if f:
        lines += ["", f"first call (S1, 2^20, fresh process): kiln empty cache {f['kiln_empty_cache_s']:.3f} s, kiln warm cache {f['kiln_warm_cache_s'] * 1e3:.1f} ms, torch.compile {f['torch.compile_s']:.2f} s"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
