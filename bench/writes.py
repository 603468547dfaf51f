"""Writes into an input after a row statistic, into part of an input, or through a copy: kiln
against eager PyTorch, side by side in one process (bench/NOTES.md, session 5).

    KILN_EXT_DIR=build/py/python/kiln PYTHONPATH=python python bench/writes.py [--device cpu|cuda]
        [--repeat 15]

Each program mutates its argument, so every call gets a fresh clone of one random input (the
clone is made outside the timed call). Prints the median time per call of each, the ratio, and
how kiln ran the last call (kernel steps, writebacks stored by a kernel or copied after one).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import kiln


def softmax_slice(x):
    x[:, :512] = torch.softmax(x[:, :512], -1)


def center(x):
    x.sub_(x.mean(-1, keepdim=True))


def tanh_quarter(x):
    x[:, :256] = x[:, :256].tanh()


def transposed_copy(x):
    x.copy_(x.t() * 2)


PROGRAMS = [
    ("x[:, :512] = softmax(x[:, :512], -1)", softmax_slice, (16384, 1024)),
    ("x.sub_(x.mean(-1, keepdim=True))", center, (16384, 1024)),
    ("x[:, :256] = x[:, :256].tanh()", tanh_quarter, (4096, 4096)),
    ("x.copy_(x.t() * 2)", transposed_copy, (4096, 4096)),
]


def median_seconds(fn, base: torch.Tensor, repeat: int) -> float:
    sync = torch.cuda.synchronize if base.is_cuda else (lambda: None)
    fn(base.clone())
    times = []
    for _ in range(repeat):
        x = base.clone()
        sync()
        t = time.perf_counter()
        fn(x)
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| program | shape | eager | kiln | eager / kiln | kiln's last call |")
    print("|---|---|---|---|---|---|")
    for name, fn, shape in PROGRAMS:
        base = torch.randn(*shape, device=args.device)
        jitted = kiln.jit(fn)
        eager = median_seconds(fn, base, args.repeat)
        ours = median_seconds(jitted, base, args.repeat)
        s = jitted._cache.last_run_stats
        how = f"{s['kernel_steps']} kernels, {s['writebacks_in_kernel']} stored, {s['writebacks_copied']} copied"
        print(f"| `{name}` | {list(shape)} | {eager * 1e3:.2f} ms | {ours * 1e3:.2f} ms | {eager / ours:.2f}x | {how} |")


if __name__ == "__main__":
    main()
