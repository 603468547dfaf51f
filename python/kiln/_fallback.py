"""Eager fallback: a torch op kiln has no lowering for runs through PyTorch in the middle of the
program, recorded as `ltorch.eager_call` (the ops around it still fuse).

Requires: a Call whose op the tracing mode found no rule for, and a tracer with register_eager.
Ensures: the trace stays functional. The registered function receives the current values of the
op's tensor arguments and returns new tensors only; it never writes into a tensor kiln owns or
the caller's memory behind kiln's back.

An op that writes into some of its arguments (`x.cumsum_(0)`, `F.batch_norm(x, running_mean,
running_var, training=True)`, `x.index_add_(0, i, v)`) is made functional here: at run time the
written arguments are cloned, the op writes into the clones, and the clones come back as extra
results; the trace then copies each clone into the argument it stands for, which
functionalization turns into an ordinary write (a writeback when the argument is, or is a view
of, a program input):

    F.batch_norm(x, rm, rv, training=True)
    # becomes
    (t0, t1, t2) = ltorch.eager_call(3, [x, rm, rv], "...")   # t1, t2: rm and rv as written
    t3 = ltorch.copy_(rm, t1)
    t4 = ltorch.copy_(rv, t2)

Which arguments an op writes is read from the schemas of the ATen ops it dispatches to while it
runs on the meta tensors (`Tensor(a!)` arguments), not only from version counters: a meta kernel
need not touch a running statistic it would update on a real device (that lost write was a silent
wrong result). Tests: tests/python/test_fallback.py.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import _kept_graphs
from ._metadata import _non_overlapping_and_dense
from ._tracer import Call, Proxy, layout_type_str


# ATen ops whose schemas do not say what they write: native_batch_norm and its cuDNN and MIOpen
# forms update running_mean and running_var (arguments 3 and 4) in training mode (argument 5),
# yet declare them `Tensor?`, not `Tensor(a!)?` (PyTorch's own functionalization special-cases
# them for the same reason). Each entry: the written argument positions, and the position of the
# flag that enables the write.
_UNANNOTATED_WRITES = {
    "aten::native_batch_norm": ((3, 4), 5),
    "aten::cudnn_batch_norm": ((3, 4), 5),
    "aten::miopen_batch_norm": ((3, 4), 5),
}

# Tests set KILN_CHECK_FALLBACK_WRITES=1: every eager step then checks, on every run, that the op
# left each argument kiln did not find written exactly as it was (the test that catches a write
# this module failed to see, whatever the op and however its arguments are laid out).
CHECK_WRITES = os.environ.get("KILN_CHECK_FALLBACK_WRITES") == "1"


def _without_dropout(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a seeded op draws nothing in this call: one whose only randomness is its dropout
    (the attention kernels, whose schemas all have `dropout_p`) called with dropout_p 0."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == "dropout_p":
            p = kwargs.get("dropout_p", args[i] if i < len(args) else a.default_value)
            return p == 0
    return False


class _WrittenArguments(TorchDispatchMode):
    """Watches the ATen ops a torch function dispatches to and collects the tensors their
    schemas say they write (alias_info.is_write), in place or as out= arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[torch.Tensor] = []
        self.seeded = ""  # an op that draws random numbers (its gradient cannot be replayed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.seeded and torch.Tag.nondeterministic_seeded in func.tags and not _without_dropout(func, args, kwargs):
            self.seeded = str(func)
        schema = func._schema
        bound = list(args) + [None] * (len(schema.arguments) - len(args))
        unannotated, flag = _UNANNOTATED_WRITES.get(schema.name, ((), None))
        enabled = flag is not None and flag < len(args) and bool(args[flag])
        for i, a in enumerate(schema.arguments):
            declared = a.alias_info is not None and a.alias_info.is_write
            if not declared and not (enabled and i in unannotated):
                continue
            value = kwargs.get(a.name, bound[i] if i < len(bound) else None)
            for leaf in pytree.tree_leaves(value):
                if isinstance(leaf, torch.Tensor):
                    self.written.append(leaf)
        return func(*args, **kwargs)


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The element range [lo, hi] t addresses in its storage."""
    lo = hi = t.storage_offset()
    for size, stride in zip(t.shape, t.stride()):
        if size == 0:
            return (0, -1)
        if stride > 0:
            hi += (size - 1) * stride
        else:
            lo += (size - 1) * stride
    return lo, hi


def _same_geometry(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.untyped_storage()._cdata == b.untyped_storage()._cdata
        and tuple(a.shape) == tuple(b.shape)
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
    )


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.untyped_storage()._cdata != b.untyped_storage()._cdata:
        return False
    (alo, ahi), (blo, bhi) = _extent(a), _extent(b)
    return alo <= bhi and blo <= ahi


def _written_proxies(call: Call, proxies: list[Proxy], versions: list[int], written: list[torch.Tensor]) -> list[int]:
    """Indices (into proxies) of the arguments the op wrote. A write into a tensor that is not
    one of the arguments but overlaps one (a view the op made of it) is refused: kiln would
    have to know which of the argument's elements it changed."""
    out = [i for i, (p, v) in enumerate(zip(proxies, versions)) if p._version != v]
    for w in written:
        exact = [i for i, p in enumerate(proxies) if w is p or _same_geometry(w, p)]
        if exact:
            out += exact
            continue
        if any(_overlaps(w, p) for p in proxies):
            raise call.unsupported(
                "kiln has no lowering for this op, and it writes into part of an argument through "
                "a view it makes itself, which kiln cannot run as a separate step; rewrite it "
                "with supported ops."
            )
    unique: list[int] = []  # one index per object (an object passed twice is one argument)
    for i in sorted(set(out)):
        if all(proxies[i] is not proxies[j] for j in unique):
            unique.append(i)
    for i in unique:
        p = proxies[i]
        if torch._debug_has_internal_overlap(p) == 1:
            raise RuntimeError(
                "unsupported operation: more than one element of the written-to tensor refers to "
                "a single memory location. Please clone() the tensor before performing the "
                f"operation.\n(kiln: raised by {call.name} at {call.where()} while tracing)"
            )
        for j, q in enumerate(proxies):
            if j != i and q is not p and _overlaps(p, q):
                raise call.unsupported(
                    "kiln has no lowering for this op, and it writes into an argument that shares "
                    "memory with another of its arguments, which kiln cannot run as a separate "
                    "step; pass a clone() of one of them."
                )
    return unique


def _schema_writes(call: Call) -> list[torch.Tensor] | None:
    """The arguments an ATen or custom op writes, when its schema says it returns nothing and
    writes only its arguments; None for any other op."""
    func = call.func
    if isinstance(func, torch._ops.OpOverloadPacket):
        overloads = func.overloads()
        if len(overloads) != 1:
            return None
        func = getattr(func, overloads[0])
    if not isinstance(func, torch._ops.OpOverload):
        return None
    schema = func._schema
    if schema.returns:
        return None
    written = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = call.args[i] if i < len(call.args) else call.kwargs.get(a.name)
        written += [t for t in pytree.tree_leaves(value) if isinstance(t, Proxy)]
    return written or None


def _unchanged(t: torch.Tensor, old: torch.Tensor) -> bool:
    if t.is_floating_point() or t.is_complex():
        return torch.allclose(t, old, rtol=0, atol=0, equal_nan=True)
    return torch.equal(t, old)


def eager_fallback(call: Call, check: Callable[[tuple, dict], None] | None = None, what: str | None = None) -> Any:
    """Records `call` as an eager_call (see the module docstring) and returns its results as
    proxies; a result that is a written argument itself (an in-place method's `self`) is that
    argument's proxy, now naming the written value. `check(args, kwargs)`, when given, runs
    before the op on CUDA tensors and raises for arguments PyTorch's CUDA kernel would meet with
    a device-side assert (which ends the process's CUDA context) instead of an exception.
    Without a way to run eager steps (kiln.trace's tracer) it raises UnsupportedError naming
    `what` (by default the op)."""
    tracer = call.tracer
    if tracer.register_eager is None:
        raise call.unsupported(f"{what or 'this op'} runs as an eager step, which only kiln.jit can run (kiln.trace alone cannot).")
    # One object may be passed twice (op(x, x)): it is one argument for what is written.
    arg_leaves, arg_spec = pytree.tree_flatten((call.args, call.kwargs))
    proxies = [leaf for leaf in arg_leaves if isinstance(leaf, Proxy)]
    versions = [p._version for p in proxies]
    geometries = [(tuple(p.shape), p.stride(), p.storage_offset()) for p in proxies]
    watch = _WrittenArguments()
    try:
        with watch:
            result = call.run_meta()
    except NotImplementedError as e:
        # No meta kernel: an op whose schema says it only writes its arguments (`Tensor(a!)`,
        # no result) needs none, since its writes change no shape.
        declared = _schema_writes(call)
        if declared is None:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise call.unsupported(
                "kiln cannot know this op's result shape while tracing: PyTorch has no meta kernel "
                f"for it ({reason}). An op whose result's size depends on values (nonzero, "
                "masked_select, unique, x[mask]) cannot be traced: keep shapes static (torch.where, "
                "masked_fill), or compute it outside the compiled function (torch.compile with "
                'backend="kiln" breaks the graph there).'
            ) from e
        result, watch.written = None, declared
    if any(isinstance(r, torch.Tensor) and r.is_complex() for r in pytree.tree_leaves(result)):
        from ._complex import eager_step  # complex results: the op runs on pairs' complex views

        return eager_step(call, result)
    if any((tuple(p.shape), p.stride(), p.storage_offset()) != g for p, g in zip(proxies, geometries)):
        raise call.unsupported(
            "kiln has no lowering for this op, and it changes the shape or strides of an argument, "
            "which kiln cannot run as a separate step; rewrite it with supported ops."
        )
    written = _written_proxies(call, proxies, versions, watch.written)
    written_objects = {id(proxies[i]) for i in written}

    flat, spec = pytree.tree_flatten(result)
    returned_written = [isinstance(r, Proxy) and id(r) in written_objects for r in flat]
    tensors = [r for r, w in zip(flat, returned_written) if isinstance(r, torch.Tensor) and not w]
    if not tensors and not written:
        raise call.unsupported("kiln has no lowering for this op, and it returns no tensor to run it for.")
    storages = {p.untyped_storage()._cdata for p in proxies}
    if any(r.untyped_storage()._cdata in storages for r in tensors):
        raise call.unsupported(
            "kiln has no lowering for this op, and it returns a view of an argument, so PyTorch "
            "cannot run it inside the compiled function; rewrite it with supported ops."
        )
    device = call.default_device() if proxies else tensors[0].device
    written_metas = [proxies[i].as_subclass(torch.Tensor).clone() for i in written]
    fresh_metas = [r.as_subclass(torch.Tensor) if isinstance(r, Proxy) else r for r in tensors]
    meta_results = _device_layouts(call.func, arg_leaves, arg_spec, fresh_metas, device) + written_metas
    results = "; ".join(layout_type_str(r, device) for r in meta_results)

    slots = [i for i, leaf in enumerate(arg_leaves) if isinstance(leaf, Proxy)]
    # The positions (among the proxies) of the written ones, and of each result that is one.
    written_slots = list(written)
    returned_index = [i for i, (r, w) in enumerate(zip(flat, returned_written)) if isinstance(r, torch.Tensor) and not w]
    func, name, where = call.func, call.name, call.where()
    # Every occurrence of a written object gets its clone (one object may be passed twice).
    occurrences = {k: [j for j, p in enumerate(proxies) if p is proxies[k]] for k in written_slots}
    # Arguments that are the call's own positional and keyword values (no lists or nesting), as
    # for most ops: rebuilt directly, without pytree (which costs tens of microseconds a call).
    flat_call = len(arg_leaves) == len(call.args) + len(call.kwargs) and all(
        a is leaf for a, leaf in zip((*call.args, *call.kwargs.values()), arg_leaves)
    )
    n_positional, keywords = len(call.args), list(call.kwargs)

    def prepare(inputs: list) -> tuple[tuple, dict, list, dict]:
        """The op's arguments for these input values, written ones cloned."""
        inputs = list(inputs)
        clones = {}
        for k in written_slots:
            clones[k] = inputs[k].clone(memory_format=torch.preserve_format)
            for other in occurrences[k]:
                inputs[other] = clones[k]
        leaves = list(arg_leaves)
        for i, t in zip(slots, inputs):
            leaves[i] = t
        if flat_call:
            args, kwargs = tuple(leaves[:n_positional]), dict(zip(keywords, leaves[n_positional:]))
        else:
            args, kwargs = pytree.tree_unflatten(leaves, arg_spec)
        return args, kwargs, inputs, clones

    def results_of(out: Any, clones: dict) -> list:
        out_flat = [out] if isinstance(out, torch.Tensor) else pytree.tree_leaves(out)
        fresh = [out_flat[i] for i in returned_index]
        return [r for r in fresh if isinstance(r, torch.Tensor)] + [clones[k] for k in written_slots]

    def apply_op(inputs: list) -> list:
        args, kwargs, _, clones = prepare(inputs)
        return results_of(func(*args, **kwargs), clones)

    def run(inputs: list) -> list:
        args, kwargs, inputs, clones = prepare(inputs)
        written_now = {id(c) for c in clones.values()}
        before = [(t, t.clone()) for t in inputs if id(t) not in written_now] if CHECK_WRITES else []
        try:
            if check is not None and any(t.is_cuda for t in inputs):
                check(args, kwargs)
            out = func(*args, **kwargs)
        except (RuntimeError, IndexError, ValueError, TypeError) as e:
            _raise_with_step(e, name, where)
        for t, old in before:
            if not _unchanged(t, old):
                raise AssertionError(f"kiln bug: {name}, run by PyTorch as an eager step, wrote into an argument kiln did not find written")
        return results_of(out, clones)

    # Most steps write nothing and return one tensor (attention, a cumsum): a run without the
    # general case's lists and dicts (it is on every call's path, a few microseconds a step).
    if not written_slots and not CHECK_WRITES and flat_call and isinstance(result, torch.Tensor) and returned_index == [0]:
        # The tensors first, then numbers and other constants (cumsum(x, 0), softmax(x, dim=-1),
        # attention(q, k, v)): the arguments are the inputs and a constant tail.
        leading = slots == list(range(len(slots))) and len(slots) <= n_positional
        tail = list(arg_leaves[len(slots) : n_positional])
        constant_kwargs = dict(zip(keywords, arg_leaves[n_positional:]))

        def run_one(inputs: list) -> list:
            if leading:
                args, kwargs = (inputs + tail if tail else inputs), constant_kwargs
            else:
                leaves = list(arg_leaves)
                for i, t in zip(slots, inputs):
                    leaves[i] = t
                args, kwargs = leaves[:n_positional], dict(zip(keywords, leaves[n_positional:]))
            try:
                if check is not None and any(t.is_cuda for t in inputs):
                    check(tuple(args), kwargs)
                return [func(*args, **kwargs)]
            except (RuntimeError, IndexError, ValueError, TypeError) as e:
                _raise_with_step(e, name, where)

        run = run_one  # noqa: F811

    # Its device work may be recorded once into a CUDA graph and replayed (kiln's graph replay)
    # unless a replay would not redo what a call does: draw new random numbers, check values on
    # the host (an index's range, the write check), or copy Python data to the device (an op
    # without tensor arguments, as torch.tensor of a list).
    refusal = (
        f"{name} draws random numbers ({watch.seeded})" if watch.seeded
        else f"{name} checks its indices' values on the host" if check is not None
        else f"{name} compares its arguments on the host (KILN_CHECK_FALLBACK_WRITES)" if CHECK_WRITES
        else f"{name} makes a tensor from Python data" if not proxies
        else ""
    )
    # Traced in grad mode, the step carries its gradient (kiln._autograd differentiates it).
    # A random op's gradient would need its draws again: none (the differentiated program is
    # refused and runs eagerly).
    differentiable = torch.is_grad_enabled() and not watch.seeded
    step = object()  # names the step's graph between its run and its vjp (_kept_graphs.py)
    gradient, wrt = _gradient_of(apply_op, proxies, device, tracer.register_eager, name, where, step) if differentiable else ({}, [])
    if wrt and not written_slots:
        run = _keeping_graph(run, step, wrt)
    fn_id = tracer.register_eager(run, capture_refusal=refusal)
    tracer.fallback_ops += 1
    # A channels-last input (a convolution's activation): the op is handed its inputs laid out
    # as eager had them, which decides its backend's kernels (cuDNN's NHWC convolutions).
    if any(_channels_last_like(p) for p in proxies):
        gradient = {**gradient, "input_layouts": "; ".join(layout_type_str(p, device) for p in proxies)}
    made = call.emit("eager_call", [fn_id, proxies, results], gradient, results=meta_results, device=device)
    made = list(made) if isinstance(made, (list, tuple)) else [made]
    fresh_made, written_made = made[: len(tensors)], made[len(tensors) :]
    _copy_written_values(call, [proxies[i] for i in written], written_made)
    it = iter(fresh_made)
    out = [r if w else (next(it) if isinstance(r, torch.Tensor) else r) for r, w in zip(flat, returned_written)]
    return pytree.tree_unflatten(out, spec)


def _channels_last_like(t: torch.Tensor) -> bool:
    return t.dim() in (4, 5) and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)


def _device_layouts(func: Any, arg_leaves: list, arg_spec: Any, metas: list, device: torch.device) -> list:
    """The op's fresh results laid out as on `device`. A meta kernel need not lay a result out as
    the device's kernel does: a convolution of a channels-last argument gives a channels-last
    result from cuDNN and oneDNN and a contiguous one on meta tensors. Where an argument is
    channels-last, the layouts are PyTorch's fake tensors' on the device (they select the
    convolution's backend as the device would; imported only then, as they import torch._dynamo);
    the meta results' otherwise, or where the fake run fails or disagrees in shape or dtype."""
    if not any(isinstance(a, Proxy) and _channels_last_like(a) for a in arg_leaves):
        return metas
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode():
            leaves = [
                torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=device) if isinstance(a, Proxy) else a
                for a in arg_leaves
            ]
            args, kwargs = pytree.tree_unflatten(leaves, arg_spec)
            fakes = [r for r in pytree.tree_leaves(func(*args, **kwargs)) if isinstance(r, torch.Tensor)]
    except Exception:
        return metas
    if len(fakes) < len(metas) or any(f.shape != m.shape or f.dtype != m.dtype for f, m in zip(fakes, metas)):
        return metas
    return [m if f.stride() == m.stride() else torch.empty_strided(m.shape, f.stride(), dtype=m.dtype, device="meta") for f, m in zip(fakes, metas)]


def _keeping_graph(run: Callable[[list], list], step: object, wrt: list[int]) -> Callable[[list], list]:
    """`run`, which inside a differentiated forward (kiln._autograd's node) runs the op with grad
    on for the inputs `wrt` and keeps its graph for the step's vjp (_kept_graphs.py)."""

    def run_keeping_graph(inputs: list) -> list:
        kept = _kept_graphs.recording()
        if kept is None:
            return run(inputs)
        xs = list(inputs)
        with torch.enable_grad():
            for i in wrt:
                xs[i] = inputs[i].detach().requires_grad_()
            outs = run(xs)
        kept.keep(step, outs, xs, inputs)
        return outs

    return run_keeping_graph


def _gradient_of(
    apply_op: Callable[[list], list], proxies: list, device: torch.device, register: Callable, name: str, where: str, step: object
) -> tuple[dict, list[int]]:
    """eager_call's vjp arguments (ops.def): a function of the step's inputs and the gradients of
    the results autograd tracks that runs the op again with grad on and returns
    torch.autograd.grad for each floating input, laid out as that input (grad_layouts), and the
    inputs it differentiates. Where the forward kept the step's graph (_kept_graphs.py), the vjp
    differentiates that graph instead of running the op again. Which results autograd tracks is
    found by running the op on the meta tensors with grad on (a batch norm's updated running
    statistics are not tracked)."""
    floating = [i for i, p in enumerate(proxies) if p.dtype.is_floating_point]
    if not floating:
        return {}, []

    def tracked_with(grad_inputs: list[int]) -> list[int] | None:
        """The results autograd tracks when these inputs require grad; None if PyTorch refuses
        (an argument the op is not differentiable in, as batch norm's running statistics)."""
        with torch.enable_grad():
            metas = [p.as_subclass(torch.Tensor).detach() for p in proxies]
            for i in grad_inputs:
                metas[i].requires_grad_()
            try:
                return [i for i, r in enumerate(apply_op(metas)) if r.requires_grad]
            except RuntimeError:
                return None

    differentiable = floating
    tracked = tracked_with(floating)
    if tracked is None:
        differentiable = [i for i in floating if tracked_with([i]) is not None]
        tracked = tracked_with(differentiable) or []
    n_inputs = len(proxies)
    layouts = {i: _grad_layout(proxies[i]) for i in floating}

    def vjp(tensors: list) -> list:
        inputs, grads = tensors[:n_inputs], tensors[n_inputs:]
        try:
            kept = _kept_graphs.kept_for(step, inputs)
            with torch.enable_grad():
                if kept is not None:  # the forward's graph (retained: the backward may run again)
                    xs, outs = kept.xs, kept.outs
                else:
                    xs = list(inputs)
                    for i in differentiable:
                        xs[i] = inputs[i].detach().requires_grad_()
                    outs = apply_op(xs)
                pairs = [(outs[i], g) for i, g in zip(tracked, grads) if outs[i].requires_grad]
                wrt = [xs[i] for i in differentiable]
                got = (
                    torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True, retain_graph=kept is not None)
                    if pairs and wrt
                    else []
                )
        except (RuntimeError, IndexError, ValueError, TypeError) as e:
            _raise_with_step(e, f"the gradient of {name}", where)
        by_input = dict(zip(differentiable, got))
        return [_in_layout(by_input.get(i), inputs[i], *layouts[i]) for i in floating]

    shapes = [torch.empty_strided(*layouts[i], dtype=proxies[i].dtype, device="meta") for i in floating]
    return {
        "vjp": register(vjp),
        "vjp_results": "; ".join(layout_type_str(t, device) for t in shapes),
        "vjp_outputs": tracked,
    }, differentiable


def _grad_layout(p: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape and strides the gradient of input p is declared with: dense, with p's order of
    strides (torch.empty_like's preserve_format), which is what eager's backward kernels give
    (attention's gradient of a q that is a transposed view of a projection is that transpose: a
    contiguous declaration copied it once per input and layer)."""
    meta = torch.empty_strided(tuple(p.shape), tuple(p.stride()), dtype=p.dtype, device="meta")
    return tuple(p.shape), tuple(torch.empty_like(meta, memory_format=torch.preserve_format).stride())


def _in_layout(g: torch.Tensor | None, like: torch.Tensor, shape: tuple, strides: tuple) -> torch.Tensor:
    """The gradient autograd gave (zeros with these strides where it gave none), as it is when it
    is dense and does not overlap: kiln reads an eager step's results through their own strides,
    as it reads the forward's eager results (the CPU's attention backward gives every gradient
    in (batch, sequence, head) order whatever the input's). One with repeated or skipped
    elements (an expanded gradient) is copied into the declared strides."""
    if g is None:
        return torch.empty_strided(shape, strides, dtype=like.dtype, device=like.device).zero_()
    if _non_overlapping_and_dense(tuple(g.shape), tuple(g.stride())):
        return g
    return torch.empty_strided(shape, strides, dtype=g.dtype, device=g.device).copy_(g)


def _raise_with_step(e: Exception, name: str, where: str) -> None:
    """Raises PyTorch's error type and message, with the op and the user's line added."""
    try:
        err = type(e)(f"{e}\n(kiln: raised by {name} at {where}, run by PyTorch as an eager step)")
    except Exception:
        raise e from None
    raise err from e


def _copy_written_values(call: Call, targets: list[Proxy], values: list[Proxy]) -> None:
    """`target.copy_(value)` for each written argument, so functionalize sees the write."""
    from . import _lowering

    copy_rule: Callable[[Call], Any] = _lowering.RULES[_lowering._key(torch.Tensor.copy_)]
    seen: set[int] = set()
    for target, value in zip(targets, values):
        if id(target) in seen:
            continue
        seen.add(id(target))
        copy_rule(Call(call.tracer, torch.Tensor.copy_, (target, value), {}, call.loc))
