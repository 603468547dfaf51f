"""The seeds S1 and S2 (CASES.md) through kiln.jit: prints the first and the last trace, checks
the results and the mutated inputs against eager PyTorch, and prints per-call times of kiln and
eager side by side. On the GPU when there is one, else on the CPU.

    KILN_EXT_DIR=build/py/python/kiln PYTHONPATH=python python examples/seed.py
"""

import time

import torch

import kiln


def s1(a):
    a.tanh_()
    return a * a * a * a


def s2(x):
    x.exp_()
    x.sin_()
    return x.cos()


def per_call_us(f, make, device, repeat=200):
    """Wall time per call of back-to-back calls on fresh inputs, synchronized at the end."""
    inputs = [make() for _ in range(repeat)]
    f(make())  # warm-up (kiln: trace and compile)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for x in inputs:
        f(x)
    sync()
    return (time.perf_counter() - start) / repeat * 1e6


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}")
    torch.manual_seed(0)
    for name, fn in [("S1", s1), ("S2", s2)]:
        jitted = kiln.jit(fn)
        x = torch.randn(5, 5, device=device)
        x_eager = x.clone()
        out = jitted(x)
        want = fn(x_eager)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(x, x_eager)
        traces = kiln.last_traces(jitted)
        print(f"==== {name}: first and last trace")
        print(traces[0])
        print(traces[-1])
        print(f"{name}: stats {kiln.last_stats(jitted)}")
        for n in (25, 1 << 20):
            make = lambda n=n: torch.randn(n, device=device)
            k, e = per_call_us(jitted, make, device), per_call_us(fn, make, device)
            print(f"{name}: {n} elements: kiln {k:.1f} us/call, eager {e:.1f} us/call")
        print()
    print("results and side effects match eager")


if __name__ == "__main__":
    main()
