"""kiln.jit: trace a PyTorch function once per specialization key, compile it with the C++
pipeline (kiln._C), cache the program, and run it on the caller's tensors without copies.

The key (per call) holds every tensor argument's dtype, shape, strides, storage offset,
device and requires_grad, which tensor arguments share a storage and which are the same object
(by first-seen index), the values and types of the non-tensor arguments, and the structure of
the arguments. The alias pattern the program was compiled for follows from these facts; the
executor checks it again on every call and raises rather than run a program compiled for
another pattern. The lookup is a Python dict for now (the issue asks for a C++ lookup later).
"""

from __future__ import annotations

import functools
import inspect
import time
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from ._errors import UnsupportedError
from ._tracer import _DTYPE_NAMES, trace_program

try:
    from . import _C
except ImportError:  # the extension is not built; kiln.trace still works
    _C = None

_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}


def _flat_arguments(fn: Callable, args: tuple, kwargs: dict) -> tuple[list[Any], Any]:
    """The leaves of the arguments in the order trace_program numbers its inputs (signature
    order, each argument flattened), and a hashable description of their structure."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    leaves: list[Any] = []
    structure = []
    for param, value in bound.arguments.items():
        flat, spec = pytree.tree_flatten(value)
        leaves += flat
        structure.append((param, str(spec)))
    return leaves, tuple(structure)


def _storage_key(t: torch.Tensor) -> Any:
    storage = t.untyped_storage()
    return (t.device, storage.data_ptr()) if storage.nbytes() else ("empty", id(t))


def _key(leaves: list[Any], structure: Any) -> tuple:
    storages: dict[Any, int] = {}
    objects: dict[int, int] = {}
    parts: list[Any] = [structure]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            s = storages.setdefault(_storage_key(leaf), len(storages))
            o = objects.setdefault(id(leaf), len(objects))
            parts.append((leaf.dtype, tuple(leaf.shape), leaf.stride(), leaf.storage_offset(),
                          leaf.device, leaf.requires_grad, leaf.is_leaf, s, o))
        else:
            # type() too: 1, 1.0 and True are equal in Python but trace differently.
            try:
                hash(leaf)
            except TypeError:
                raise UnsupportedError(
                    f"kiln.jit: an argument of type {type(leaf).__name__} is not hashable, so it "
                    "cannot be part of the specialization key."
                ) from None
            parts.append((type(leaf), leaf))
    return tuple(parts)


def _describe(t: torch.Tensor) -> tuple:
    """A tensor as kiln._C reads it (module.cpp, TensorArg)."""
    storage = t.untyped_storage()
    return (
        _DTYPE_NAMES[t.dtype],
        list(t.shape),
        list(t.stride()),
        t.storage_offset(),
        storage.data_ptr(),
        storage.nbytes() // t.element_size(),
        id(t),
        t.device.index if t.device.type == "cuda" else -1,
    )


def _empty(nbytes: int, device: int) -> torch.Tensor:
    """Memory for a tensor kiln makes: PyTorch's allocator (on CUDA, its caching allocator, whose
    blocks are ordered on the current stream, the one kiln's kernels run on)."""
    if device < 0:
        return torch.empty(nbytes, dtype=torch.uint8, device="cpu")  # not the default device
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device))


def _stream(tensors: list[torch.Tensor]) -> int:
    """The CUstream of PyTorch's current stream on the call's CUDA device (0 on the CPU)."""
    for t in tensors:
        if t.device.type == "cuda":
            return torch.cuda.current_stream(t.device).cuda_stream
    return 0


class _Entry:
    def __init__(self, traced, program, trace_seconds: float) -> None:
        self.traced = traced
        self.program = program
        self.compile_seconds = trace_seconds + program.compile_seconds
        # The first run also prepares the kernels (C++ source, system compiler or the on-disk
        # kernel cache); its whole time is kept apart, since it includes running the program.
        self.first_run_seconds: float | None = None


class JitFunction:
    """What kiln.jit returns: calls run the compiled program for the call's key."""

    def __init__(self, fn: Callable) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.cache: dict[tuple, _Entry] = {}
        self.cache_hits = 0
        self.cache_misses = 0
        self.last_entry: _Entry | None = None
        self.last_run_stats: dict[str, int] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _C is None:
            raise UnsupportedError("kiln.jit needs the C++ extension kiln._C, which is not built.")
        leaves, structure = _flat_arguments(self.fn, args, kwargs)
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        # Grad mode is in the key: a program cached under no_grad must not run on tensors that
        # require grad while grad is on (that call misses and raises below).
        key = (torch.is_grad_enabled(), _key(leaves, structure))
        entry = self.cache.get(key)
        if entry is None:
            self.cache_misses += 1
            start = time.perf_counter()
            traced = trace_program(self.fn, *args, **kwargs)  # raises eager's errors
            trace_seconds = time.perf_counter() - start
            if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
                raise UnsupportedError("kiln.jit does not support autograd: an argument requires grad.")
            devices = {t.device for t in tensors}
            if len(devices) > 1:
                names = ", ".join(sorted(str(d) for d in devices))
                raise UnsupportedError(
                    f"kiln.jit: the tensor arguments are on several devices ({names}); one "
                    "program runs on one device. Move them to one device first (tensor.to(device))."
                )
            program = _C.compile(traced.text, [_describe(t) for t in tensors])
            entry = _Entry(traced, program, trace_seconds)
            self.cache[key] = entry
        else:
            self.cache_hits += 1
        self.last_entry = entry
        start = time.perf_counter()
        results, metadata, run_stats = _C.run(entry.program, [_describe(t) for t in tensors], _empty, _stream(tensors))
        if entry.first_run_seconds is None:
            entry.first_run_seconds = time.perf_counter() - start
        self.last_run_stats = run_stats
        # Metadata mutations (transpose_, ...) of the caller's tensor objects.
        for arg, sizes, strides, offset in metadata:
            tensors[arg].as_strided_(sizes, strides, offset)
        values = iter(self._value(r, tensors) for r in results)
        traced = entry.traced
        out = [next(values) if is_tensor else leaf for leaf, is_tensor in zip(traced.output_leaves, traced.output_is_tensor)]
        return pytree.tree_unflatten(out, traced.output_spec)

    @staticmethod
    def _value(result: tuple, tensors: list[torch.Tensor]) -> Any:
        kind = result[0]
        if kind == "input":
            return tensors[result[1]]
        if kind == "view":
            _, arg, sizes, strides, offset = result
            return tensors[arg].as_strided(sizes, strides, offset)
        if kind == "fresh":
            _, buffer, dtype, sizes, strides, offset = result
            dtype = _TORCH_DTYPES[dtype]
            size = torch.empty((), dtype=dtype).element_size()
            typed = buffer[: buffer.numel() // size * size].view(dtype)
            return typed.as_strided(sizes, strides, offset)
        if kind == "number":
            return result[1]
        raise AssertionError(f"kiln._C returned an unknown result kind {kind!r}")


def jit(fn: Callable) -> JitFunction:
    """Compiles `fn` with kiln on each new specialization key; see the module docstring."""
    return JitFunction(fn)


def _jitted(fn: Any) -> JitFunction:
    if not isinstance(fn, JitFunction):
        raise TypeError("expected a function made by kiln.jit")
    if fn.last_entry is None:
        raise RuntimeError("the function has not been called yet")
    return fn


def last_traces(fn: JitFunction) -> list[str]:
    """The trace after each pass of the program the last call ran (the first is the trace as
    traced; each starts with `# Constructed by <pass> (<time>)`)."""
    return [printed for _, printed in _jitted(fn).last_entry.program.history]


def last_stats(fn: JitFunction) -> dict[str, Any]:
    """Facts about the last call. fusion_regions, writebacks_*: of the compiled program;
    kernels: fusion steps the last call ran as compiled kernels (interpreted_steps: those it ran
    in kiln's reference interpreter); cache_hits/cache_misses: over all calls of fn;
    compile_seconds: tracing plus compiling of the program the last call ran (paid once, on its
    miss; the kernels themselves are prepared during the program's first run, whose whole time
    is first_run_seconds). fallback_ops is always 0: eager fallback for unknown ops is not implemented (an
    unknown op raises kiln.UnsupportedError at trace time)."""
    f = _jitted(fn)
    p = f.last_entry.program
    run = f.last_run_stats
    return {
        "fusion_regions": p.fusion_regions,
        "kernels": run["kernel_steps"] + run["library_steps"],
        "interpreted_steps": run["interpreted_steps"],
        "fallback_ops": 0,
        "writebacks_in_kernel": p.writebacks_in_kernel,
        "writebacks_with_temporary": p.writebacks_with_temporary,
        "cache_hits": f.cache_hits,
        "cache_misses": f.cache_misses,
        "compile_seconds": f.last_entry.compile_seconds,
        "first_run_seconds": f.last_entry.first_run_seconds,
    }
