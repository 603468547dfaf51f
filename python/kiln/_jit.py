"""kiln.jit: trace a PyTorch function once per specialization key, compile it with the C++
pipeline (kiln._C), cache the program, and run it on the caller's tensors without copies.

The key (per call) holds every tensor argument's dtype, shape, strides, storage offset,
device, requires_grad and is_leaf, which tensor arguments share a storage and which are the same
object (by first-seen index), the values and types of the non-tensor arguments, the structure of
the arguments, and grad mode. The alias pattern the program was compiled for follows from these
facts; the executor checks it again on every call and raises rather than run a program compiled
for another pattern.

The cache lives in C++ (kiln._C.JitCache): a call whose arguments are tensors and scalars passed
positionally is keyed, looked up and run there without any Python work; other calls (keyword
arguments, lists, tuples or dicts of tensors) are flattened here first. Only a miss traces and
compiles in Python.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from ._autograd import GradientPlan, run_differentiated, warn_eager
from ._errors import UnsupportedError
from ._state import ImplicitInputs
from ._tracer import TracedProgram, signature_of, trace_call

try:
    from . import _C
except ImportError:  # the extension is not built; kiln.trace still works
    _C = None

_MISS = object()  # what JitCache.run returns when it has no program for the call
_SINGLE, _TUPLE, _ASSEMBLE = 0, 1, 2  # output forms (module.cpp, OutputForm)


def _flat_arguments(fn: Callable, args: tuple, kwargs: dict) -> tuple[list[Any], Any]:
    """The leaves of the arguments in the order trace_program numbers its inputs (signature
    order, each argument flattened), and a hashable description of their structure."""
    if not kwargs:
        # Positional lists and tuples of leaves (an optimizer's parameter lists): flattened here
        # in their order, as pytree would, without binding the signature and printing pytree
        # specs (about 200 us a call for the Adam benchmark's four lists of ten tensors).
        leaves: list[Any] = []
        shape = []
        for a in args:
            if isinstance(a, (list, tuple)) and not _holds_containers(a):
                leaves += a
                shape.append((type(a) is list, len(a)))
            elif _is_container(a):
                break
            else:
                leaves.append(a)
                shape.append(None)
        else:
            return leaves, ("positional", tuple(shape))
    bound = signature_of(fn).bind(*args, **kwargs)
    leaves: list[Any] = []
    structure = []
    for param, value in bound.arguments.items():
        flat, spec = pytree.tree_flatten(value)
        leaves += flat
        structure.append((param, str(spec)))
    return leaves, tuple(structure)


def _is_container(x: Any) -> bool:
    return isinstance(x, (list, tuple, dict))


# Types that are leaves, never containers (a list of parameters holds only these).
_LEAF_TYPES = frozenset({torch.Tensor, torch.nn.Parameter, int, float, bool, type(None)})


def _holds_containers(items: list | tuple) -> bool:
    """Whether a list or tuple holds a list, tuple or dict (or a subclass of one). The types of
    its items are looked at once as a set first: 50 parameters took 5 us through _is_container
    a call, of about 100 for an optimizer step over 50 parameters."""
    if {type(x) for x in items} <= _LEAF_TYPES:
        return False
    return any(_is_container(x) for x in items)


def _output_form(traced: TracedProgram) -> tuple[int, Callable | None]:
    """How the program's results (its tensor and number outputs, in order) become the return
    value: the one result, a tuple of them, or `assemble`, which puts back the constant leaves
    and the nesting."""
    spec, is_tensor = traced.output_spec, traced.output_is_tensor
    leaves = traced.output_leaves
    returned = [leaf for leaf, t in zip(leaves, is_tensor) if t]
    plain = returned == traced.output_names  # each result once, in order, and nothing else
    if plain and spec.is_leaf() and is_tensor == [True]:
        return _SINGLE, None
    if plain and spec.type is tuple and all(is_tensor) and all(spec.child(i).is_leaf() for i in range(spec.num_children)):
        return _TUPLE, None
    index = {name: i for i, name in enumerate(traced.output_names)}

    def assemble(results: list) -> Any:
        out = [results[index[leaf]] if t else leaf for leaf, t in zip(leaves, is_tensor)]
        return pytree.tree_unflatten(out, spec)

    return _ASSEMBLE, assemble


class JitFunction:
    """What kiln.jit returns: calls run the compiled program for the call's key."""

    def __init__(self, fn: Callable, fallback: bool = True, module: torch.nn.Module | None = None) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.fallback = fallback
        self._cache = _C.JitCache() if _C is not None else None
        # Calls in grad mode with tensors that require grad: differentiated programs, whose
        # cache entries hold their GradientPlan (kiln._autograd).
        self._grad_cache = _C.JitCache() if _C is not None else None
        # Whether _grad_cache holds a program: until it does, a call skips looking there (the
        # lookup's torch.no_grad() costs about 2 us of a call's 10).
        self._differentiates = False
        # Parameters, buffers, globals and captured tensors the function reads (kiln._state).
        self._implicit = ImplicitInputs(fn, module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cache = self._cache
        if not self._implicit.empty():
            return self._call_with_state(args, kwargs)
        if self._differentiates and torch.is_grad_enabled() and not kwargs and not any(_is_container(a) for a in args):
            # A differentiated program first (once one is compiled).
            out = self._run_differentiated(args, kwargs, list(args), len(args))
            if out is not _MISS:
                return out
        if not kwargs:
            # The fast path: positional tensors and scalars are their own leaves.
            out = cache.run(len(args), args, _MISS) if cache is not None else _MISS
            if out is not _MISS:
                return out
        if cache is None:
            raise UnsupportedError("kiln.jit needs the C++ extension kiln._C, which is not built.")
        if not kwargs and not any(_is_container(a) for a in args):
            leaves, structure = list(args), len(args)
        else:
            leaves, structure = _flat_arguments(self.fn, args, kwargs)
            if torch.is_grad_enabled():
                out = self._run_differentiated(args, kwargs, leaves, structure)
                if out is not _MISS:
                    return out
            out = cache.run(structure, leaves, _MISS)
            if out is not _MISS:
                return out
        if _complex_positions(leaves):
            return self._call_complex(args, kwargs, leaves, structure, leaves, structure)
        return self._compile_and_run(args, kwargs, leaves, structure)

    def _call_with_state(self, args: tuple, kwargs: dict) -> Any:
        """A call of a function with implicit inputs: their current values follow the
        arguments' leaves, and the modules' flags join the key."""
        if self._cache is None:
            raise UnsupportedError("kiln.jit needs the C++ extension kiln._C, which is not built.")
        values, guards = self._implicit.read()
        if not kwargs and not any(_is_container(a) for a in args):
            leaves, structure = list(args), len(args)
        else:
            leaves, structure = _flat_arguments(self.fn, args, kwargs)
        if torch.is_grad_enabled():  # a differentiated program first (see __call__)
            out = self._run_differentiated(args, kwargs, leaves + values, (structure, guards))
            if out is not _MISS:
                return out
        out = self._cache.run((structure, guards), leaves + values, _MISS)
        if out is not _MISS:
            return out
        if _complex_positions(leaves + values):
            return self._call_complex(args, kwargs, leaves + values, (structure, guards), leaves, structure)
        return self._compile_and_run(args, kwargs, leaves, structure)

    def _call_complex(
        self, args: tuple, kwargs: dict, leaves: list, structure: Any, own_leaves: list, own_structure: Any
    ) -> Any:
        """A call with complex tensors among its leaves (the arguments' and the implicit
        inputs'): the program takes their view_as_real pairs (kiln._complex), keyed apart from a
        call with real tensors of the pairs' types."""
        positions = _complex_positions(leaves)
        if _needs_grad(leaves) and any(leaves[i].requires_grad for i in positions):
            warn_eager(self.fn, "a complex tensor requires grad, and kiln does not differentiate complex tensors")
            return self.fn(*args, **kwargs)
        pairs = _pairs(leaves, positions)
        key = ("complex", positions, structure)
        if _needs_grad(leaves):
            out = self._run_differentiated(args, kwargs, pairs, key)
        else:
            with _ComplexCall(pairs, leaves):
                out = self._cache.run(key, pairs, _MISS)
        if out is not _MISS:
            return out
        return self._compile_and_run(args, kwargs, own_leaves, own_structure)

    def _compile_and_run(self, args: tuple, kwargs: dict, leaves: list, structure: Any) -> Any:
        start = time.perf_counter()
        register = _C.register_eager if self.fallback else None
        implicit = self._implicit
        traced = trace_call(self.fn, args, kwargs, register, implicit, unique_outputs=True)  # raises eager's errors
        trace_seconds = time.perf_counter() - start
        if not implicit.empty():
            # The slots found while tracing are inputs too (the program takes them after the
            # arguments, in the order implicit.slots lists them).
            values, guards = implicit.read()
            leaves, structure = leaves + values, (structure, guards)
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            names = ", ".join(sorted(str(d) for d in devices))
            raise UnsupportedError(
                f"kiln.jit: the tensor arguments are on several devices ({names}); one "
                "program runs on one device. Move them to one device first (tensor.to(device))."
            )
        form, assemble = _output_form(traced)
        if traced.rebound_names:
            form, assemble = _ASSEMBLE, _replaying(implicit, traced, form, assemble)
        positions = _complex_positions(leaves)
        if _needs_grad(leaves) and any(leaves[i].requires_grad for i in positions):
            warn_eager(self.fn, "a complex tensor requires grad, and kiln does not differentiate complex tensors")
            return self.fn(*args, **kwargs)
        if traced.complex_outputs:
            form, assemble = _ASSEMBLE, _viewing_complex(traced, form, assemble)
        callers = leaves
        if positions:
            # The program takes the complex leaves' pairs (kiln._complex).
            leaves, structure = _pairs(leaves, positions), ("complex", positions, structure)
        if _needs_grad(tensors):
            self._compile_differentiated(traced, trace_seconds, leaves, structure, form, assemble)
            return self._run_differentiated(args, kwargs, leaves, structure)
        with _ComplexCall(leaves, callers):
            return self._cache.insert_and_run(
                structure, leaves, traced.text, trace_seconds, form, assemble, traced.fallback_ops
            )

    def _run_differentiated(self, args: tuple, kwargs: dict, leaves: list, structure: Any) -> Any:
        """A call in grad mode: the differentiated program as one autograd node (kiln._autograd),
        eager PyTorch where kiln refused to differentiate it, or _MISS when the key has no plan
        yet."""
        if not self._differentiates:
            return _MISS
        with torch.no_grad():  # the forward program runs (and was cached) with grad mode off
            program = self._grad_cache.find(structure, leaves)
        if program is None:
            return _MISS
        plan = program.assemble
        if plan.refused:
            return self.fn(*args, **kwargs)
        return plan.finish(run_differentiated(plan, self._grad_cache, program, leaves))

    def _compile_differentiated(
        self, traced: TracedProgram, trace_seconds: float, leaves: list, structure: Any, form: int, assemble: Callable | None
    ) -> None:
        # The function's own results -> its return value, as module.cpp's OutputForm does it.
        finish = (lambda own: own[0]) if form == _SINGLE else tuple if form == _TUPLE else assemble
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        refused = "an op in it runs under torch.no_grad()" if traced.ran_without_grad else ""
        if traced.complex_outputs:
            refused = "it returns complex tensors, which kiln does not differentiate"
        plan = GradientPlan(finish, positions, refused)
        requires_grad = None if refused else [bool(leaves[i].requires_grad) for i in positions]
        with torch.no_grad():
            program = self._grad_cache.insert(
                structure, leaves, traced.text, trace_seconds, _TUPLE, plan, traced.fallback_ops, requires_grad
            )
        self._differentiates = True
        plan.set_gradient(program.gradient)
        if plan.refused:
            warn_eager(self.fn, plan.refused)


def _needs_grad(leaves: list) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves)


def _complex_positions(leaves: list) -> tuple[int, ...]:
    return tuple(i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.is_complex())


def _pairs(leaves: list, positions: tuple[int, ...]) -> list:
    """The leaves with each complex tensor replaced by its view_as_real pair (its memory)."""
    from ._complex import pair_of_argument

    pairs = list(leaves)
    for i in positions:
        pairs[i] = pair_of_argument(leaves[i], "a complex argument")
    return pairs


class _ComplexCall:
    """The pairs and the caller's tensors of the complex call in progress (per thread), for
    _viewing_complex: a result that is a pair the call passed is the caller's own tensor."""

    current = threading.local()

    def __init__(self, pairs: list, leaves: list) -> None:
        self.value = {id(p): t for p, t in zip(pairs, leaves) if p is not t}

    def __enter__(self) -> None:
        self.previous = getattr(_ComplexCall.current, "value", None)
        _ComplexCall.current.value = self.value

    def __exit__(self, *exc: Any) -> None:
        _ComplexCall.current.value = self.previous


def _viewing_complex(traced: TracedProgram, form: int, assemble: Callable | None) -> Callable:
    """An assemble that views the program's complex outputs (their pairs) as complex tensors,
    then finishes as `form` says."""
    complex_index = [i for i, name in enumerate(traced.output_names) if name in traced.complex_outputs]
    finish = (lambda results: results[0]) if form == _SINGLE else tuple if form == _TUPLE else assemble

    def view_then_finish(results: list) -> Any:
        results = list(results)
        callers = getattr(_ComplexCall.current, "value", None) or {}
        for i in complex_index:
            r = results[i]
            own = callers.get(id(r))
            if own is not None:
                results[i] = own
            elif r.stride(-1) == 1 and r.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in r.stride()[:-1]):
                results[i] = torch.view_as_complex(r)
            else:  # a fresh result laid out otherwise (kiln._complex lays pairs out as eager's)
                results[i] = torch.view_as_complex(r.contiguous())
        return finish(results)

    return view_then_finish


def _replaying(implicit: ImplicitInputs, traced: TracedProgram, form: int, assemble: Callable | None) -> Callable:
    """An assemble that stores the results that are the new values of attributes the function
    rebinds into their slots, then returns the function's own results as `form` says (those
    come first among the results: trace_call puts the rebound values last)."""
    slots = list(implicit.rebinds)
    index = {name: i for i, name in enumerate(traced.output_names)}
    rebound = [index[name] for name in traced.rebound_names]
    own = len(traced.output_names) - len(set(traced.rebound_names) - set(traced.output_leaves))

    def replay_then_assemble(results: list) -> Any:
        for slot, i in zip(slots, rebound):
            slot.write(results[i])
        if form == _SINGLE:
            return results[0]
        if form == _TUPLE:
            return tuple(results[:own])
        return assemble(results)

    return replay_then_assemble


def jit(fn: Callable | None = None, *, fallback: bool = True) -> Any:
    """Compiles `fn` with kiln on each new specialization key; see the module docstring.

    fallback: a torch op kiln has no lowering for runs eagerly (PyTorch runs it in the middle of
    the program; the ops around it still fuse). With fallback=False it raises
    kiln.UnsupportedError naming the op and the line. Usable as @kiln.jit or
    @kiln.jit(fallback=False)."""
    if fn is None:
        return lambda f: jit(f, fallback=fallback)
    if isinstance(fn, torch.nn.Module):
        from ._module import JitModule

        return JitModule(fn, fallback)
    return JitFunction(fn, fallback)


def _jitted(fn: Any) -> JitFunction:
    fn = getattr(fn, "_kiln_forward", fn)  # a JitModule's compiled forward
    if not isinstance(fn, JitFunction):
        raise TypeError("expected a function made by kiln.jit")
    if fn._cache is None:
        raise UnsupportedError("kiln.jit needs the C++ extension kiln._C, which is not built.")
    return fn


def _last_cache(fn: JitFunction) -> Any:
    """The cache whose program ran last: the plain one, or the differentiated programs' (the
    forward program of a call in grad mode)."""
    plain, grad = fn._cache, fn._grad_cache
    return grad if grad.last_sequence > plain.last_sequence else plain


def kernel_cache_stats() -> dict[str, dict[str, int]]:
    """This process's kernel caches so far, by target ("cpu", "cuda"): kernels compiled, found
    in the disk cache (disk_hits) and found already loaded (memory_hits); on the CPU also the
    compiler runs (several kernels a run). A kernel's source keys both caches, and a nest reads
    its outermost extent at run time, so a program called at a new row count of a size class
    compiles nothing new."""
    if _C is None:
        raise RuntimeError("kiln.kernel_cache_stats needs kiln's C++ extension (kiln._C)")
    return _C.kernel_cache_stats()


def last_traces(fn: JitFunction) -> list[str]:
    """The trace after each pass of the program the last call ran (the first is the trace as
    traced; each starts with `# Constructed by <pass> (<time>)`)."""
    return [printed for _, printed in _last_cache(_jitted(fn)).last_program.history]


def last_stats(fn: JitFunction) -> dict[str, Any]:
    """Facts about the last call. fusion_regions, writebacks_*: of the compiled program;
    kernels: kernel launches of the last call (fusion steps it ran as compiled kernels, a
    multi-tensor kernel's launch once; multi_tensor_steps: the steps those ran; interpreted_steps: those it ran
    in kiln's reference interpreter; torch_steps: those without a kernel PyTorch ran op by op,
    on the device; view_steps: those that only view their inputs, made without moving data;
    eager_steps: torch ops PyTorch ran, as fallback_ops); cache_hits/cache_misses:
    over all calls of fn; compile_seconds: tracing plus compiling of the program the last call ran (paid once, on its
    miss; the kernels themselves are prepared during the program's first run, whose whole time
    is first_run_seconds); fallback_ops: torch ops of the program PyTorch runs eagerly; host_copies,
    host_copy_bytes: on CUDA, the storages the last call copied between device and host to
    interpret a step there, and their bytes (0 when every step ran on the device);
    index_checks_first, index_checks_at_steps: the kernels' index checks the last call decided
    before its first step (an index drawn from the call's inputs: one read of them) and those it
    made at their step (on CUDA each a synchronization in the middle of the program);
    layout_copies, layout_copy_bytes: other copies the last call made (a synthetic base's
    storage, a result in the caller's memory, a result laid out otherwise than eager's);
    aligned_products, alignment_copy_bytes: on CUDA, the 16-bit matrix products the last call ran
    padded for tensor cores (an unaligned vocabulary's LM head) and the bytes those copies moved;
    cuda_graph:
    on CUDA, "replayed" when the last call ran the program as one CUDA graph, "captured" when it
    made that graph, else "" (src/kiln/runtime/cuda/graph_replay.h; KILN_CUDA_GRAPHS=0 turns
    graphs off); cuda_graph_refused: why the program never runs as a graph ("" while it may);
    cuda_graph_results: for a graph, (rebound, copied): how many of its fresh results a replay
    writes into new memory and how many it copies out of the graph's own;
    differentiated: the last call ran a differentiated forward program (grad mode, an input that
    requires grad: kiln._autograd), whose facts these are; backward: then, the run facts of the
    last backward of that program (kernels, interpreted_steps, torch_steps, view_steps, eager_steps,
    index_checks_first, index_checks_at_steps, layout_copies, layout_copy_bytes, host_copies, host_copy_bytes, aligned_products,
    alignment_copy_bytes, cuda_graph, cuda_graph_refused, cuda_graph_results), None before its first
    backward."""
    jitted = _jitted(fn)
    cache = _last_cache(jitted)
    p = cache.last_program
    run = cache.last_run_stats
    return {
        "fusion_regions": p.fusion_regions,
        "kernels": run["kernel_steps"] + run["library_steps"],
        "multi_tensor_steps": run["multi_tensor_steps"],
        "interpreted_steps": run["interpreted_steps"],
        "torch_steps": run["torch_steps"],
        "view_steps": run["view_steps"],
        "eager_steps": run["eager_steps"],
        "fallback_ops": p.fallback_ops,
        "writebacks_in_kernel": p.writebacks_in_kernel,
        "writebacks_with_temporary": p.writebacks_with_temporary,
        "index_checks_first": run["index_checks_first"],
        "index_checks_at_steps": run["index_checks_at_steps"],
        "host_copies": run["host_copies"],
        "host_copy_bytes": run["host_copy_bytes"],
        "layout_copies": run["layout_copies"],
        "layout_copy_bytes": run["layout_copy_bytes"],
        "aligned_products": run["aligned_products"],
        "alignment_copy_bytes": run["alignment_copy_bytes"],
        "cache_hits": jitted._cache.hits + jitted._grad_cache.hits,
        "cache_misses": jitted._cache.misses + jitted._grad_cache.misses,
        "compile_seconds": p.compile_seconds,
        "first_run_seconds": p.first_run_seconds,
        "cuda_graph": "captured" if run["graph_captures"] else "replayed" if run["graph_replays"] else "",
        "cuda_graph_refused": p.graph_refused,
        "cuda_graph_results": (run["graph_results_rebound"], run["graph_results_copied"]),
        "differentiated": cache is jitted._grad_cache,
        "backward": _backward_run_stats(p) if cache is jitted._grad_cache else None,
    }


def _backward_run_stats(program: Any) -> dict[str, Any] | None:
    backward = program.assemble.backward_cache
    if backward.hits + backward.misses == 0:
        return None
    run = backward.last_run_stats
    facts = ["interpreted_steps", "torch_steps", "view_steps", "eager_steps", "layout_copies", "layout_copy_bytes"]
    facts += ["index_checks_first", "index_checks_at_steps"]
    facts += ["host_copies", "host_copy_bytes", "aligned_products", "alignment_copy_bytes"]
    graph = "captured" if run["graph_captures"] else "replayed" if run["graph_replays"] else ""
    return {
        "kernels": run["kernel_steps"] + run["library_steps"],
        **{k: run[k] for k in facts},
        "cuda_graph": graph,
        "cuda_graph_refused": backward.last_program.graph_refused,
        "cuda_graph_results": (run["graph_results_rebound"], run["graph_results_copied"]),
    }
