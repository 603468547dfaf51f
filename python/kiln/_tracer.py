"""The tracer: runs a PyTorch function on proxy tensors and writes kiln trace text.

A proxy is a meta tensor (torch's shape-only device) with the eager tensor's sizes, strides,
storage offset and dtype, a Python subclass of torch.Tensor so that user code sees a tensor.
It carries two things a meta tensor does not know: the SSA name of its current value in the
trace, and the device of the real tensor it stands for.

Every torch call made while tracing reaches one TorchFunctionMode (`_TracingMode`), whether the
user wrote `torch.add(x, y)`, `x.add(y)`, `x + y`, `x[1:3]`, `F.relu(x, inplace=True)` or
`torch.ones(4)` (which has no proxy argument, so a Tensor subclass alone would not see it).
The mode looks the call up in `_lowering.RULES`; a rule runs the original torch function on the
meta tensors, which gives the result's dtype and shape exactly as eager computes them (and
raises eager's errors), then records kiln op(s) with `Call.emit`.

Mutation is recorded as it happens, not removed: `a.tanh_()` becomes `t0 = ltorch.tanh_(a)`
and the proxy `a` now names `t0`, so later reads of `a` use the new value. kiln's functionalize
pass (C++) turns this into SSA. Object identity follows eager: an in-place op returns the same
proxy object, a view returns a new proxy (whose meta tensor shares storage with its base, so
later metadata questions, e.g. whether `.view()` is legal, get eager's answers).

Example (CASES.md S1):

    def f(a):
        a.tanh_()
        return a * a * a * a

    # Constructed by trace (0.31 ms)
    def computation(a):
      # a: "cpu f32[5, 5] strides=(5, 1) offset=0"
      t0 = ltorch.tanh_(a)  # t0: "cpu f32[5, 5]"  seed.py:2  a.tanh_()
      t1 = ltorch.mul(t0, t0)  # t1: "cpu f32[5, 5]"  seed.py:3  return a * a * a * a
      t2 = ltorch.mul(t1, t0)  # t2: "cpu f32[5, 5]"  seed.py:3  return a * a * a * a
      t3 = ltorch.mul(t2, t0)  # t3: "cpu f32[5, 5]"  seed.py:3  return a * a * a * a
      return {"output": (t3,)}
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import operator
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from . import _metadata
from ._errors import SourceLocation, TraceError, UnsupportedError, user_location
from ._ops import OPS, OpSchema

if TYPE_CHECKING:
    from ._state import ImplicitInputs

# kiln's dtypes (src/kiln/ir/dtype.cpp): short name for types, torch name for constants.
_DTYPE_NAMES = {
    torch.bool: "bool",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
}


_META = torch.device("meta")
# True while Call.run_meta runs a torch function on proxies (a list: a mutable module global).
_running_meta = [False]


class Proxy(torch.Tensor):
    """A tensor of the traced program (see the module docstring).

    Torch function handling is disabled on the class itself: the tracing mode sees every call
    first, and when it runs the original function on proxies they behave as the meta tensors
    they are.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    # Set right after construction by Tracer.wrap / Tracer.add_input.
    _kiln_name: str
    _kiln_device: torch.device
    _kiln_tracer: "Tracer"

    # A proxy reports the device of the real tensor, not "meta", so that user code such as
    # torch.ones(3, device=x.device) means what it means in eager. While an op runs on the
    # meta tensors (Call.run_meta), it reports "meta": PyTorch's Python meta kernels
    # (torch._refs, torch._prims) check devices through this property. FakeTensor does the same.
    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return _META if _running_meta[0] else self._kiln_device

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return not _running_meta[0] and self._kiln_device.type == "cuda"

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return not _running_meta[0] and self._kiln_device.type == "cpu"

    @property
    def is_meta(self) -> bool:  # type: ignore[override]
        return _running_meta[0]

    def get_device(self) -> int:  # type: ignore[override]
        if _running_meta[0]:
            return -1
        return -1 if self._kiln_device.type == "cpu" else (self._kiln_device.index or 0)

    def __repr__(self) -> str:  # type: ignore[override]
        name = getattr(self, "_kiln_name", "?")
        return f"kiln.Proxy({name}: {self.kiln_type()})"

    def __format__(self, spec: str) -> str:  # type: ignore[override]
        return repr(self)

    def kiln_type(self) -> str:
        """The type as a trace writes it: `cpu f32[4, 2]` (a complex tensor's: its pair's, see
        kiln._complex)."""
        pair = getattr(self, "_kiln_pair", None)
        if pair is not None:
            return f"{self.dtype} as {pair.kiln_type()}"
        return tensor_type_str(self, getattr(self, "_kiln_device", torch.device("cpu")))


def device_str(device: torch.device) -> str:
    """kiln's spelling of a device: `cpu` or `cuda:N`."""
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        index = device.index
        if index is None:
            index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return f"cuda:{index}"
    raise UnsupportedError(f"kiln supports cpu and cuda tensors, not {device.type} ones.")


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        raise UnsupportedError(
            f"kiln does not support tensors of dtype {dtype}; it supports "
            + ", ".join(str(d) for d in _DTYPE_NAMES)
            + "."
        )
    return name


def tensor_type_str(t: torch.Tensor, device: torch.device) -> str:
    return f"{device_str(device)} {dtype_name(t.dtype)}[{', '.join(str(s) for s in t.shape)}]"


def layout_type_str(t: torch.Tensor, device: torch.device) -> str:
    """The type with strides and storage offset: `cpu f32[5] strides=(2,) offset=1`."""
    strides = ", ".join(str(s) for s in t.stride()) + ("," if t.dim() == 1 else "")
    return f"{tensor_type_str(t, device)} strides=({strides}) offset={t.storage_offset()}"


def float_str(value: float) -> str:
    """A float as kiln's printer writes it (std::to_chars shortest form, constant.cpp), so that
    `kiln-opt` prints a trace back unchanged: the shortest digits that round-trip, in fixed or
    scientific notation, whichever is shorter (fixed on a tie); '.0' added to a bare integer."""
    if math.isnan(value):
        return "float('nan')"
    if math.isinf(value):
        return "float('inf')" if value > 0 else "-float('inf')"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    digits_text = repr(abs(value))  # Python's repr gives the shortest round-trip digits too
    mantissa, _, exp_text = digits_text.partition("e")
    exp = int(exp_text) if exp_text else 0
    int_part, _, frac_part = mantissa.partition(".")
    if frac_part == "0":
        frac_part = ""
    digits = (int_part + frac_part).lstrip("0")
    # The decimal point sits after digit `point` of `digits` (may be <= 0 or > len).
    if int_part != "0":
        point = len(int_part) + exp
    else:
        point = exp - (len(frac_part) - len(frac_part.lstrip("0")))
    if not digits:  # zero
        fixed = "0"
        sci = "0e+00"
    else:
        digits = digits.rstrip("0") or "0"
        if point <= 0:
            fixed = "0." + "0" * (-point) + digits
        elif point >= len(digits):
            fixed = digits + "0" * (point - len(digits))
        else:
            fixed = digits[:point] + "." + digits[point:]
        e = point - 1
        sci = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        sci += ("e-" if e < 0 else "e+") + f"{abs(e):02d}"
    text = fixed if len(fixed) <= len(sci) else sci
    if not any(c in text for c in ".en"):
        text += ".0"
    return sign + text


def _dtype_constant(dtype: torch.dtype) -> str:
    dtype_name(dtype)  # raises for dtypes kiln does not have
    return str(dtype)  # "torch.float32"


def _string_constant(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _index_item_str(item: Any) -> str:
    if item is None:
        return "None"
    if item is Ellipsis:
        return "..."
    if isinstance(item, slice):
        parts = [p if p is None else _as_int(p, "a slice bound") for p in (item.start, item.stop, item.step)]
        return "slice(" + ", ".join("None" if p is None else str(p) for p in parts) + ")"
    return str(_as_int(item, "an index"))


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or isinstance(value, torch.Tensor):
        raise UnsupportedError(
            f"kiln supports only ints, slices, None and ... as indices, but {what} is "
            f"{type(value).__name__}; indexing with tensors, lists or bools (advanced indexing) "
            "is not supported yet."
        )
    try:
        return operator.index(value)
    except TypeError:
        raise UnsupportedError(
            f"kiln supports only ints, slices, None and ... as indices, but {what} is "
            f"{type(value).__name__} ({value!r})."
        ) from None


def index_key_str(key: Any) -> str:
    """A __getitem__/__setitem__ key as a kiln index constant: `(slice(1, 3, None), 0)`."""
    items = key if isinstance(key, tuple) else (key,)
    text = ", ".join(_index_item_str(item) for item in items)
    return "(" + text + ("," if len(items) == 1 else "") + ")"


class IndexKey:
    """Marks a value for an `index` parameter (a tuple there is a key, not a list of ints)."""

    def __init__(self, key: Any):
        self.text = index_key_str(key)


@dataclasses.dataclass
class TracedProgram:
    """What tracing a function produced: the trace text, and the Python-side facts the trace
    does not hold (which leaf of which argument each input is, the structure of the result)."""

    text: str
    input_names: list[str]
    # One entry per leaf of the returned value: the output's trace name for a tensor, else the
    # constant itself (a Python number, None, ...).
    output_leaves: list[Any]
    output_spec: Any  # a torch.utils._pytree.TreeSpec
    output_is_tensor: list[bool]
    fallback_ops: int = 0  # ops recorded as eager_call (kiln.jit's fallback)
    ran_without_grad: bool = False  # some op ran with grad mode off
    # The program's outputs (each tensor object once), and the outputs that are the new values
    # of attributes the function rebound (kiln._state), in the order of its rebinds.
    output_names: list[str] = dataclasses.field(default_factory=list)
    rebound_names: list[str] = dataclasses.field(default_factory=list)
    # The outputs that are complex tensors (kiln._complex): the program returns their
    # view_as_real pairs, which kiln.jit views as complex again.
    complex_outputs: set[str] = dataclasses.field(default_factory=set)


class Tracer:
    """Collects the statements of one trace and hands out names."""

    def __init__(
        self,
        register_eager: Callable[..., int] | None = None,
        implicit: "ImplicitInputs | None" = None,
    ) -> None:
        # kiln.jit's eager fallback: registers a function that runs one torch op in PyTorch
        # (kiln._C.register_eager(fn, capture_refusal=...)) and returns its number; None: an unknown
        # op raises.
        self.register_eager = register_eager
        # Where tensors the function reaches without taking them as arguments come from
        # (kiln._state); None: such a tensor raises.
        self.implicit = implicit
        self.implicit_proxies: dict[int, Proxy] = {}  # id(tensor) -> its input's proxy
        self.fallback_ops = 0
        # Whether some op ran with grad mode off (torch.no_grad() inside the function): kiln's
        # autograd does not model grad mode per op, so it leaves such a call to eager.
        self.ran_without_grad = False
        self.lines: list[str] = []
        self.input_lines: list[str] = []
        self.input_names: list[str] = []
        self.input_tensors: list[torch.Tensor] = []  # the real tensors, in input order
        self.used_names: set[str] = set()
        self.next_temp = 0
        # One meta storage per real storage, so that inputs sharing memory share it here too.
        self.bases: dict[Any, torch.Tensor] = {}
        # The meta storages some op wrote (kiln._constants: their values are no longer known).
        self.written_storages: dict[int, Any] = {}

    def add_input(self, name: str, t: torch.Tensor) -> Proxy:
        """A proxy for a real input tensor. Inputs that share a storage become views of one
        meta storage, so that the meta run sees eager's aliasing (and eager's strides and
        offsets)."""
        if t.is_meta or t.device.type not in ("cpu", "cuda"):
            raise UnsupportedError(f"kiln: input '{name}' is on {t.device}; kiln supports cpu and cuda tensors.")
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            raise UnsupportedError(f"kiln: input '{name}' is not a dense strided tensor.")
        if t.is_complex():
            return self._add_complex_input(name, t)
        dtype_name(t.dtype)
        unique, n = name, 1
        while unique in self.used_names:
            unique, n = f"{name}_{n}", n + 1
        name = unique
        storage = t.untyped_storage()
        key = (t.device, storage.data_ptr()) if storage.nbytes() else ("empty", id(t))
        base = self.bases.get(key)
        if base is None:
            base = torch.empty(storage.nbytes() // t.element_size(), dtype=t.dtype, device="meta")
            self.bases[key] = base
        elif base.dtype != t.dtype:
            raise UnsupportedError(
                f"kiln: input '{name}' shares memory with another input of a different dtype "
                f"({base.dtype} and {t.dtype}); kiln does not support that."
            )
        meta = base.as_strided(t.shape, t.stride(), t.storage_offset())
        # An in-place op on a leaf that requires grad raises in eager; a leaf meta tensor that
        # requires grad raises the same way. (A non-leaf input that requires grad is traced as
        # not requiring it, since in-place ops are allowed on it.)
        proxy = torch.Tensor._make_subclass(Proxy, meta, bool(t.requires_grad and t.is_leaf))
        proxy._kiln_device = t.device
        proxy._kiln_tracer = self
        proxy._kiln_name = name
        self.used_names.add(name)
        self.input_names.append(name)
        self.input_tensors.append(t)
        self.input_lines.append(f'  # {name}: "{layout_type_str(t, t.device)}"')
        return proxy

    def _add_complex_input(self, name: str, t: torch.Tensor) -> Proxy:
        """A complex input is its view_as_real pair in the program (kiln._complex); kiln.jit
        passes the pair of the caller's tensor (kiln._jit._pairs)."""
        from ._complex import make_complex_proxy, pair_of_argument

        if t.requires_grad:
            raise UnsupportedError(f"kiln: input '{name}' is a complex tensor that requires grad; kiln does not differentiate complex tensors.")
        return make_complex_proxy(self, self.add_input(name, pair_of_argument(t, f"input '{name}'")))

    def add_implicit_inputs(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """The implicit inputs known before tracing (kiln._state reads them on every call)."""
        for name, t in named:
            if id(t) not in self.implicit_proxies:
                self.implicit_proxies[id(t)] = self.add_input(name, t)
            else:
                self.add_input(name, t)  # the same object in two places: an unused input

    def implicit_proxy(self, t: torch.Tensor, call: "Call | None") -> Proxy:
        """The proxy of a tensor the function reached without taking it as an argument (a
        parameter, a buffer, a global, a captured variable): an input of the program, read on
        every call, never a constant."""
        proxy = self.implicit_proxies.get(id(t))
        if proxy is not None:
            return proxy
        if self.implicit is None:
            raise _foreign_tensor(call) if call is not None else UnsupportedError(
                "kiln: the function returns a tensor that is not an argument and was not made "
                "from one (a global or captured tensor); kiln cannot return it."
            )
        name = self.implicit.resolve(t)
        proxy = self.add_input(name, t)
        self.implicit_proxies[id(t)] = proxy
        return proxy

    def fresh_name(self) -> str:
        while True:
            name = f"t{self.next_temp}"
            self.next_temp += 1
            if name not in self.used_names:
                self.used_names.add(name)
                return name

    def wrap(self, meta: torch.Tensor, device: torch.device) -> Proxy:
        """A new proxy for a meta result (a new tensor object, as eager makes one)."""
        proxy = meta.as_subclass(Proxy)
        proxy._kiln_device = device
        proxy._kiln_tracer = self
        proxy._kiln_name = self.fresh_name()
        return proxy

    def rename(self, proxy: Proxy) -> str:
        """An op wrote into `proxy` (in place or its metadata): its value gets a new name."""
        proxy._kiln_name = self.fresh_name()
        return proxy._kiln_name


# ---- the calls ---------------------------------------------------------------------------------


def _func_key(func: Callable) -> Any:
    # Property reads (x.shape, x.T) arrive as the `__get__` method-wrapper of a getset
    # descriptor, a new object each time: key them by the property's name instead.
    if type(func).__name__ == "method-wrapper" and getattr(func, "__name__", "") == "__get__":
        return ("property", func.__self__.__name__)
    return func


_NAMESPACES: list[tuple[str, Any]] = [
    ("torch", torch),
    ("torch.nn.functional", torch.nn.functional),
    ("torch.special", torch.special),
    ("torch.linalg", torch.linalg),
    ("torch.fft", torch.fft),
]


def func_name(func: Callable) -> str:
    """How the user would name the function: torch.cumsum, torch.Tensor.cumsum, torch.nn.functional.hardtanh."""
    key = _func_key(func)
    if isinstance(key, tuple):
        return f"torch.Tensor.{key[1]}"
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    if qual.startswith(("TensorBase.", "Tensor.")):
        return "torch.Tensor." + qual.split(".", 1)[1]
    name = getattr(func, "__name__", qual)
    for prefix, namespace in _NAMESPACES:
        if getattr(namespace, name, None) is func:
            return f"{prefix}.{name}"
    module = getattr(func, "__module__", None)
    return f"{module}.{qual}" if module else qual


class Call:
    """One intercepted torch call, handed to a lowering rule."""

    def __init__(self, tracer: Tracer, func: Callable, args: tuple, kwargs: dict, loc: SourceLocation | None):
        self.tracer = tracer
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.loc = loc

    @property
    def name(self) -> str:
        return func_name(self.func)

    def where(self) -> str:
        return self.loc.describe() if self.loc else "an unknown line"

    def unsupported(self, why: str) -> UnsupportedError:
        return UnsupportedError(f"kiln: {self.name} at {self.where()}: {why}", op=self.name, location=self.loc)

    def run_meta(self, func: Callable | None = None, args: Sequence | None = None, kwargs: dict | None = None) -> Any:
        """Runs a torch function on the meta tensors: the result's dtype, shape and strides as
        eager makes them, and eager's error (with the user's line added) where eager raises."""
        # Without autograd: the fast rules' results are fresh leaves while the meta kernels'
        # carry history, and an in-place op meeting both raised where eager does not. Eager's
        # error for an in-place op on a leaf input is the lowering's own (_check_write); for one
        # on a view of it, the differentiated program is refused and eager raises.
        with torch.no_grad():
            return self._run_meta(func, args, kwargs)

    def _run_meta(self, func: Callable | None, args: Sequence | None, kwargs: dict | None) -> Any:
        func = self.func if func is None else func
        args = self.args if args is None else args
        kwargs = self.kwargs if kwargs is None else kwargs
        fast_rule = _metadata.FAST_RULES.get(func)
        if fast_rule is not None:
            # The common ops' metadata without PyTorch's Python meta kernels (see _metadata).
            previous = _running_meta[0]
            _running_meta[0] = True  # Python meta kernels the rule runs ask proxies their device
            try:
                fast = fast_rule(func, args, kwargs, Proxy)
            finally:
                _running_meta[0] = previous
            if fast is not None:
                if _metadata.CHECK:
                    meta = self._run_meta_kernels(func, args, kwargs)
                    _metadata.check_against_meta(fast, meta, f"{self.name} at {self.where()}")
                return fast
        return self._run_meta_kernels(func, args, kwargs)

    def _run_meta_kernels(self, func: Callable, args: Sequence, kwargs: dict) -> Any:
        previous = _running_meta[0]
        _running_meta[0] = True
        try:
            return func(*args, **kwargs)
        except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as e:
            # Eager's own error type and message, so `except RuntimeError` in user code and
            # tests written against eager keep working.
            try:
                err = type(e)(f"{e}\n(kiln: raised by {self.name} at {self.where()} while tracing)")
            except Exception:
                raise e from None
            raise err from e
        finally:
            _running_meta[0] = previous

    def proxies(self) -> list[Proxy]:
        return [a for a in pytree.tree_leaves((self.args, self.kwargs)) if isinstance(a, Proxy)]

    def default_device(self) -> torch.device:
        ps = self.proxies()
        return ps[0]._kiln_device if ps else torch.device("cpu")

    def emit(
        self,
        op: str,
        args: Sequence = (),
        kwargs: dict | None = None,
        results: Any = None,
        device: torch.device | None = None,
    ) -> Any:
        """Records `ltorch.<op>(args, kwargs)` and returns its results as proxies.

        `results` are the meta tensors the op produced (one tensor, a tuple/list of them, or
        None for an op without outputs). A result that is already a proxy is an argument the op
        wrote into (in place or its metadata): it keeps its identity and gets a new name. Any
        other result becomes a new proxy on `device` (by default the first proxy argument's).
        """
        schema = OPS[op]
        bound = _bind(self, schema, list(args), dict(kwargs or {}))
        if schema.alias in ("kMutates0", "kMetadata0") and isinstance(bound[0], Proxy):
            from ._constants import note_written

            note_written(self.tracer, bound[0])  # (setitem_ has no result to rename)
        text = _call_text(self, schema, bound)
        device = device if device is not None else self.default_device()
        single = isinstance(results, torch.Tensor)
        outs = [results] if single else list(results) if results is not None else []
        proxies: list[Proxy] = []
        for r in outs:
            if not isinstance(r, torch.Tensor):
                raise AssertionError(f"kiln bug: {op} gave a non-tensor result {r!r}")
            dtype_name(r.dtype)  # an unsupported result dtype is reported here, at its op
            if isinstance(r, Proxy):
                # Only an op that writes into its argument may hand that argument back: a
                # functional op returning an input object is a no-op form the rule must catch
                # before emitting (renaming the input here would change what later reads mean).
                if schema.alias not in ("kMutates0", "kMetadata0"):
                    raise AssertionError(f"kiln bug: {op} at {self.where()} returned an existing tensor")
                self.tracer.rename(r)
                proxies.append(r)
            else:
                proxies.append(self.tracer.wrap(r, device))
        names = ", ".join(p._kiln_name for p in proxies)
        line = "  " + (names + " = " if proxies else "") + f"ltorch.{op}({text})"
        comment = ", ".join(f'{p._kiln_name}: "{p.kiln_type()}"' for p in proxies)
        if self.loc is not None:
            comment += ("  " if comment else "") + self.loc.short()
            if self.loc.text:
                comment += "  " + self.loc.text
        if comment:
            line += "  # " + comment
        self.tracer.lines.append(line)
        if single:
            return proxies[0]
        if results is None:
            return None
        return type(results)(proxies) if isinstance(results, (tuple, list)) else proxies


def _bind(call: Call, schema: OpSchema, args: list, kwargs: dict) -> list:
    """Matches arguments to the op's parameters as kiln's Builder::bind does. Torch names the
    first argument `input` where kiln says `self`; any other name kiln does not have is an
    argument form kiln does not support."""
    params = schema.params
    if "input" in kwargs and schema.param("input") is None and schema.param("self") is not None:
        kwargs["self"] = kwargs.pop("input")
    positional = [p for p in params if not p.keyword_only]
    if len(args) > len(positional):
        raise call.unsupported(f"kiln's {schema.name} takes at most {len(positional)} positional arguments, got {len(args)}.")
    bound: list[Any] = [_MISSING] * len(params)
    for i, a in enumerate(args):
        bound[i] = a
    for key, value in kwargs.items():
        p = schema.param(key)
        if p is None:
            raise call.unsupported(f"the argument {key}={value!r} is not supported by kiln's {schema.name}.")
        bound[params.index(p)] = value
    for i, p in enumerate(params):
        if bound[i] is _MISSING:
            if not p.has_default:
                raise AssertionError(f"kiln bug: {schema.name} is missing its argument {p.name}")
            bound[i] = p.default
        bound[i] = _normalize(call, schema, p, bound[i])
    return bound


_MISSING = object()


def _normalize(call: Call, schema: OpSchema, p, value: Any) -> Any:
    # kiln turns an int into a one-element list for `ints` parameters (conform in builder.cpp);
    # doing the same here keeps the text identical to what kiln prints.
    if p.kind == "ints" and value is not None:
        if isinstance(value, (tuple, list, torch.Size)):
            return [_as_int(v, f"an element of {p.name}") for v in value]
        return [_as_int(value, p.name)]
    if p.kind == "int|ints" and isinstance(value, (tuple, list, torch.Size)):
        return [_as_int(v, f"an element of {p.name}") for v in value]
    if p.kind == "Ts":
        return list(value)
    if p.kind == "device" and value is not None and not isinstance(value, str):
        return device_str(torch.device(value))
    return value


def _literal_str(value: Any) -> str | None:
    """None, a bool, an int, a float or a string as the trace writes it; None for anything else."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return float_str(value)
    if isinstance(value, str):
        return _string_constant(value)
    return None


def _constant_str(call: Call, value: Any) -> str:
    if isinstance(value, Proxy):
        _check_own(call, value)
        return value._kiln_name
    if isinstance(value, IndexKey):
        return value.text
    literal = _literal_str(value)
    if literal is not None:
        return literal
    if isinstance(value, torch.dtype):
        return _dtype_constant(value)
    if isinstance(value, torch.device):
        return _string_constant(device_str(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_constant_str(call, v) for v in value) + "]"
    if isinstance(value, torch.Tensor):
        raise _foreign_tensor(call)
    try:  # numpy scalars and other number-likes
        return str(operator.index(value))
    except TypeError:
        pass
    if isinstance(value, complex):
        raise call.unsupported("kiln has no complex numbers.")
    try:
        return float_str(float(value))
    except (TypeError, ValueError):
        raise call.unsupported(f"kiln cannot pass the argument {value!r} ({type(value).__name__}).") from None


def _call_text(call: Call, schema: OpSchema, bound: list) -> str:
    # As print_statement in src/kiln/ir/printer.cpp: positional parameters up to the last one
    # that differs from its default, keyword-only ones only when they differ from theirs.
    texts = [_constant_str(call, v) for v in bound]

    def is_default(i: int) -> bool:
        p = schema.params[i]
        return p.has_default and not isinstance(bound[i], Proxy) and texts[i] == _default_str(p.default)

    last = 0
    for i, p in enumerate(schema.params):
        if not p.keyword_only and not is_default(i):
            last = i + 1
    parts = []
    for i, p in enumerate(schema.params):
        if p.keyword_only:
            if not is_default(i):
                parts.append(f"{p.name}={texts[i]}")
        elif i < last:
            parts.append(texts[i])
    return ", ".join(parts)


def _default_str(value: Any) -> str:
    literal = _literal_str(value)
    if literal is not None:
        return literal
    if isinstance(value, list):
        return "[" + ", ".join(_default_str(v) for v in value) + "]"
    raise AssertionError(f"unexpected default {value!r}")


def _check_own(call: Call | None, proxy: Proxy) -> None:
    if call is not None and getattr(proxy, "_kiln_tracer", None) is not call.tracer:
        raise TraceError(
            f"kiln: {call.name} at {call.where()} uses a tensor from another trace (a proxy that "
            "escaped an earlier kiln trace); pass the tensor in as an argument instead.",
            location=call.loc,
        )


def _replace_tensors(value: Any, swap: Callable[[torch.Tensor], Proxy]) -> Any:
    """value with every tensor that is not a proxy replaced by swap(tensor), looking into
    lists, tuples and dicts (and nothing else, so torch.Size and named tuples stay as they are)."""
    if isinstance(value, Proxy):
        return value
    if isinstance(value, torch.Tensor):
        return swap(value)
    if type(value) in (list, tuple):
        return type(value)(_replace_tensors(v, swap) for v in value)
    if type(value) is dict:
        return {k: _replace_tensors(v, swap) for k, v in value.items()}
    return value


def _foreign_tensor(call: Call) -> UnsupportedError:
    return call.unsupported(
        "it uses a tensor that is not an argument of the traced function (a global, a captured "
        "variable or a module attribute). kiln traces only the function's tensor arguments and "
        "the tensors made from them; pass this tensor in as an argument."
    )


# ---- the mode ----------------------------------------------------------------------------------


class _TracingMode(TorchFunctionMode):
    def __init__(self, tracer: Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from . import _lowering  # the rules import this module

        kwargs = dict(kwargs or {})
        key = _func_key(func)
        if key in _lowering.PASSTHROUGH:
            # Questions about metadata (x.shape, x.dim(), len(x), x.is_contiguous()): the meta
            # tensor has eager's answer.
            return func(*args, **kwargs)
        loc = user_location()
        call = Call(self.tracer, func, tuple(args), kwargs, loc)
        if not torch.is_grad_enabled() and not _running_meta[0]:
            self.tracer.ran_without_grad = True
        if key in _lowering.NEEDS_VALUE:
            raise _value_error(call, _lowering.NEEDS_VALUE[key])
        leaves = pytree.tree_leaves((args, kwargs))
        foreign = False
        for leaf in leaves:
            if isinstance(leaf, Proxy):
                _check_own(call, leaf)
            elif isinstance(leaf, torch.Tensor):
                foreign = True
        if foreign:
            # Parameters, buffers, globals, captured tensors: implicit inputs of the program.
            swap = lambda t: self.tracer.implicit_proxy(t, call)  # noqa: E731
            args, kwargs = _replace_tensors(tuple(args), swap), _replace_tensors(kwargs, swap)
            call = Call(self.tracer, func, args, kwargs, loc)
            leaves = pytree.tree_leaves((args, kwargs))
        if "out" in kwargs and kwargs["out"] is None:
            del kwargs["out"]  # an explicit out=None is the plain call
        from . import _complex, _constants

        if _complex.wants_complex(key, leaves):
            if kwargs.get("out") is not None:
                raise call.unsupported("out= with complex tensors is not supported by kiln; use the op's result.")
            return _complex.lower(call, key)
        rule = _lowering.RULES.get(key)
        if kwargs.get("out") is not None and rule is not None:
            return self._with_out(call, rule, kwargs.pop("out"))
        if rule is None:
            if not any(isinstance(leaf, Proxy) for leaf in leaves):
                # A torch function on no tensors at all (torch.promote_types, ...): harmless
                # unless it makes a tensor, which would be a creation op kiln does not know.
                result = func(*args, **kwargs)
                if not any(isinstance(r, torch.Tensor) for r in pytree.tree_leaves(result)):
                    return result
            if self.tracer.register_eager is not None:
                from ._fallback import eager_fallback

                return eager_fallback(call)
            raise call.unsupported(
                "kiln has no lowering for this op yet; rewrite it with supported ops, call it "
                "outside the compiled function, or let kiln.jit run it eagerly (fallback=True, "
                "the default)."
            )
        result = rule(call)
        if key in _constants.PURE:
            _constants.note_call(self.tracer, func, call.args, call.kwargs, result)
        return result


    def _with_out(self, call: Call, rule, out: Any) -> Any:
        """`op(..., out=t)`: the op's result copied into t, which is returned (eager's out=
        for a result of t's dtype and shape; eager would resize or cast, kiln asks for the
        exact tensor instead)."""
        from . import _lowering

        if not isinstance(out, Proxy):
            raise call.unsupported("out= takes one tensor of the traced function here (a tuple of outputs is not supported).")
        if torch.is_grad_enabled() and any(isinstance(a, Proxy) and a.requires_grad for a in pytree.tree_leaves((call.args, call.kwargs))):
            # Eager's refusal, for arguments the trace knows require grad (its inputs).
            raise RuntimeError(
                f"{call.name}(): functions with out=... arguments don't support automatic differentiation, "
                f"but one of the arguments requires grad.\n(kiln: raised at {call.where()} while tracing)"
            )
        call.kwargs.pop("out", None)
        result = rule(call)
        if not isinstance(result, Proxy):
            raise call.unsupported("out= of an op with several results is not supported; use its return values.")
        if (result.dtype, result.shape) != (out.dtype, out.shape):
            raise call.unsupported(
                f"out= needs a tensor of the result's dtype and shape ({result.dtype}, {tuple(result.shape)}), "
                f"got ({out.dtype}, {tuple(out.shape)}); eager would cast or resize it, kiln does not."
            )
        copy = Call(self.tracer, torch.Tensor.copy_, (out, result), {}, call.loc)
        return _lowering.RULES[_func_key(torch.Tensor.copy_)](copy)


def _value_error(call: Call, what: str) -> TraceError:
    names = ", ".join(p._kiln_name for p in call.proxies()) or "a tensor"
    return TraceError(
        f"kiln: {call.where()} needs the value of {names} ({what}), which is unknown while "
        "tracing: kiln runs the function on placeholder tensors that have shapes and dtypes but "
        "no data, so Python control flow and conversions to Python numbers cannot depend on "
        "tensor contents. Compute with tensor ops instead (for example torch.where for a "
        "branch), or move this code outside the compiled function.",
        location=call.loc,
    )


# ---- inputs and the whole trace ----------------------------------------------------------------


_IDENT = re.compile(r"[^0-9A-Za-z_]")


def _leaf_name(param: str, path: tuple) -> str:
    parts = [param]
    for entry in path:
        key = getattr(entry, "idx", None)
        if key is None:
            key = getattr(entry, "key", None)
        if key is None:
            key = getattr(entry, "name", entry)
        parts.append(str(key))
    name = _IDENT.sub("_", "_".join(parts))
    return name if not name[0].isdigit() else "_" + name


def _make_inputs(tracer: Tracer, named: list[tuple[str, torch.Tensor]]) -> list[Proxy]:
    return [tracer.add_input(name, t) for name, t in named]


def trace_program(fn: Callable, *args: Any, **kwargs: Any) -> TracedProgram:
    """Traces `fn(*args, **kwargs)`; see `trace`."""
    return trace_call(fn, args, kwargs)


_ANY_ARGUMENTS = inspect.Signature(
    [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL), inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
)


def signature_of(fn: Callable) -> inspect.Signature:
    """fn's signature; `(*args, **kwargs)` for a builtin without one (kiln.jit(torch.relu)),
    which then binds whatever it is called with and raises eager's own error when traced."""
    try:
        return inspect.signature(fn)
    except (ValueError, TypeError):
        return _ANY_ARGUMENTS


def trace_call(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    register_eager: Callable[..., int] | None = None,
    implicit: "ImplicitInputs | None" = None,
    unique_outputs: bool = False,
) -> TracedProgram:
    """trace_program with kiln.jit's options: `register_eager` turns an op kiln has no lowering
    for into an eager_call of a function registered with it (kiln._fallback); `implicit` makes
    the tensors the function reaches without taking them as arguments inputs of the program
    (kiln._state), after the arguments' tensors, and adds the values of attributes the function
    rebinds to new tensors as outputs after the function's own."""
    bound = signature_of(fn).bind(*args, **kwargs)
    tracer = Tracer(register_eager, implicit)
    # Tensor leaves of every argument (tensors inside tuples, lists and dicts included) become
    # inputs named after their place: x, xs_0, d_w. Other leaves are constants of this trace.
    named: list[tuple[str, torch.Tensor]] = []
    specs = {}
    for param, value in bound.arguments.items():
        leaves_with_path, spec = pytree.tree_flatten_with_path(value)
        specs[param] = (spec, [leaf for _, leaf in leaves_with_path])
        for path, leaf in leaves_with_path:
            if isinstance(leaf, torch.Tensor):
                named.append((_leaf_name(param, path), leaf))
    # Two leaves can sanitize to one name (`a_0` and the first element of a list `a`).
    seen: set[str] = set()
    for k, (name, leaf) in enumerate(named):
        unique, n = name, 1
        while unique in seen:
            unique, n = f"{name}_{n}", n + 1
        seen.add(unique)
        named[k] = (unique, leaf)
    proxies = iter(_make_inputs(tracer, named))
    for param, (spec, leaves) in specs.items():
        leaves = [next(proxies) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        bound.arguments[param] = pytree.tree_unflatten(leaves, spec)

    if implicit is not None:
        tracer.add_implicit_inputs(implicit.known_inputs())
        implicit.begin_trace()
    start = time.perf_counter()
    try:
        with _TracingMode(tracer):
            result = fn(*bound.args, **bound.kwargs)
    finally:
        # Rebound attributes get their tensors back (the rebinding is replayed after each call).
        rebound = implicit.end_trace() if implicit is not None else []
    elapsed_ms = (time.perf_counter() - start) * 1000

    leaves, out_spec = pytree.tree_flatten(result)
    output_leaves: list[Any] = []
    is_tensor: list[bool] = []
    out_names: list[str] = []
    complex_outputs: set[str] = set()
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.is_complex():
            proxy = leaf if isinstance(leaf, Proxy) else tracer.implicit_proxy(leaf, None)
            if getattr(proxy, "_kiln_tracer", None) is not tracer:
                raise TraceError("kiln: the function returns a tensor from another trace.")
            name = proxy._kiln_pair._kiln_name
            complex_outputs.add(name)
            output_leaves.append(name)
            out_names.append(name)
            is_tensor.append(True)
        elif isinstance(leaf, Proxy):
            if getattr(leaf, "_kiln_tracer", None) is not tracer:
                raise TraceError("kiln: the function returns a tensor from another trace.")
            output_leaves.append(leaf._kiln_name)
            out_names.append(leaf._kiln_name)
            is_tensor.append(True)
        elif isinstance(leaf, torch.Tensor):
            proxy = tracer.implicit_proxy(leaf, None)  # a returned parameter is the caller's object
            output_leaves.append(proxy._kiln_name)
            out_names.append(proxy._kiln_name)
            is_tensor.append(True)
        else:
            output_leaves.append(leaf)
            is_tensor.append(False)

    rebound_names = []
    for value in rebound:
        if not isinstance(value, Proxy) or getattr(value, "_kiln_tracer", None) is not tracer:
            raise TraceError("kiln: the function binds an attribute to a tensor from another trace.")
        if value.is_complex():
            complex_outputs.add(value._kiln_pair._kiln_name)
            rebound_names.append(value._kiln_pair._kiln_name)
            continue
        rebound_names.append(value._kiln_name)
    # kiln.jit: one output per object (a tensor returned twice, or also bound to an attribute,
    # is one object in eager, and one result of the program). The trace alone lists every
    # returned leaf, as kiln-opt reports them.
    out_names = list(dict.fromkeys(out_names + rebound_names)) if unique_outputs else out_names + rebound_names

    text = [f"# Constructed by trace ({elapsed_ms:.2f} ms)", f"def computation({', '.join(tracer.input_names)}):"]
    text += tracer.input_lines
    text += tracer.lines
    outputs = ", ".join(out_names) + ("," if len(out_names) == 1 else "")
    text.append(f'  return {{"output": ({outputs})}}')
    return TracedProgram(
        text="\n".join(text) + "\n",
        input_names=list(tracer.input_names),
        output_leaves=output_leaves,
        output_spec=out_spec,
        output_is_tensor=is_tensor,
        fallback_ops=tracer.fallback_ops,
        ran_without_grad=tracer.ran_without_grad,
        output_names=out_names,
        rebound_names=rebound_names,
        complex_outputs=complex_outputs,
    )


def trace(fn: Callable, *args: Any, **kwargs: Any) -> str:
    """Runs `fn(*args, **kwargs)` on proxy tensors and returns the program as kiln trace text.

    Tensor arguments (also inside tuples, lists and dicts) become the trace's inputs, typed with
    their dtype, shape, strides and storage offset; other arguments are constants of the trace.
    Raises kiln.UnsupportedError for an op kiln does not know and kiln.TraceError where the
    function needs a tensor's value (e.g. `if x.sum() > 0:`).
    """
    return trace_program(fn, *args, **kwargs).text
