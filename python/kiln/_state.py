"""Implicit inputs: the tensors a traced function reaches without taking them as arguments.

A module's parameters and buffers, a global, a captured variable, a tensor attribute: each is an
input of the program like an argument (DESIGN.md section 7). It lives in a *slot* (a key of a
module's `_parameters`, `_buffers` or `__dict__`, of a function's globals, or a closure cell),
and every call reads the slot again, so the program never holds a value of its own:

    w = torch.randn(8)
    f = kiln.jit(lambda x: x * w)
    f(x); w.mul_(2); f(x)      # the second call reads the new w (CASES.md M2)

The values read are leaves of the call after the arguments, so they are part of the
specialization key by dtype, layout and device and by which of them are one object, as an
argument is. A slot rebound to another tensor of the same kind (a replaced parameter,
`load_state_dict` with assign=True) runs the same program on it: the program is a function of the
slot's contents, not of one tensor object. Besides the tensors, the key holds *guards*: every
module's training flag and its plain Python attributes (ints, floats, bools, strings: what a
forward's control flow reads), so a changed module compiles again instead of running a stale
program. A change of a module's structure (a parameter, buffer or child added or removed)
re-reads the slots.

Between calls that change nothing, none of this is walked again: a kiln._C.DictWatch over every
module's __dict__, _parameters, _buffers and _modules says whether any of them changed since the
last walk (in C, without a Python loop over a model's hundreds of modules), and if none did the
call reuses the slot values and the guards' key it found then, re-reading only the slots outside
those dicts (globals, closure cells). A ResNet-50's walk took about 1 ms a call.

Writes: an in-place op on an implicit input is a write into a program input, put back by a
writeback (BatchNorm's running statistics, a KV cache). An attribute the function *rebinds*
(`self.count = self.count + 1`) is restored after tracing, its new value becomes an extra
output of the program, and every call stores that output into the slot, as eager's assignment
would.

Requires: the tracer (kiln._tracer) calls known_inputs/begin_trace before running the function,
resolve for a tensor it has no input for, end_trace after. Tests: tests/python/test_state.py.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Iterable

import torch

from ._errors import UnsupportedError
from ._tracer import Proxy

try:
    from ._C import DictWatch
except ImportError:  # the extension is not built: every call walks the modules
    DictWatch = None

_ABSENT = object()
_PLAIN = (bool, int, float, str, type(None))


class Slot:
    """Where an implicit input lives."""

    __slots__ = ("holder", "key", "name")

    def __init__(self, holder: Any, key: Any, name: str) -> None:
        self.holder = holder  # a dict, a closure cell (key None), or the tensor itself (key _ABSENT)
        self.key = key
        self.name = name

    def read(self) -> Any:
        if isinstance(self.holder, dict):
            return self.holder.get(self.key, _ABSENT)
        if isinstance(self.holder, types.CellType):
            try:
                return self.holder.cell_contents
            except ValueError:  # an empty cell
                return _ABSENT
        return self.holder

    def write(self, value: Any) -> None:
        if isinstance(self.holder, dict):
            self.holder[self.key] = value
        elif isinstance(self.holder, types.CellType):
            self.holder.cell_contents = value
        else:
            raise AssertionError("kiln bug: a fixed tensor cannot be rebound")

    def same_place(self, other: "Slot") -> bool:
        return self.holder is other.holder and self.key == other.key


def _identifier(text: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in text).strip("_") or "state"
    return out if not out[0].isdigit() else "_" + out


def _plain(value: Any) -> bool:
    if type(value) in _PLAIN:
        return True
    return type(value) is tuple and all(type(v) in _PLAIN for v in value)


def _module_in(slot: Slot) -> torch.nn.Module | None:
    value = slot.read()
    return value if isinstance(value, torch.nn.Module) else None


def _code_names(code: types.CodeType) -> list[str]:
    """The global names a function's code (and the code of functions nested in it) reads."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _code_names(const)
    return names


class ImplicitInputs:
    """The implicit inputs of one kiln.jit function: the slots found so far (in the order the
    program's inputs take them), the modules whose flags guard the programs, and what the last
    trace rebound."""

    def __init__(self, fn: Callable, root: torch.nn.Module | None = None) -> None:
        self.fn = fn
        self.root = root
        self.slots: list[Slot] = []
        self.modules: list[tuple[str, torch.nn.Module]] = []
        self.rebinds: list[Slot] = []  # of the trace being made (end_trace)
        self._structure: tuple = ()
        self._snapshots: list[tuple[dict, dict]] = []
        # The last walk (read): its slot values, the slots outside the modules' dicts (read on
        # every call), its guards' key, and the watch over the dicts it read.
        self._watch: Any = None
        self._values: list[Any] = []
        self._unwatched: list[tuple[int, Slot]] = []
        self._guards_key = 0
        self._guard_keys: dict[tuple, int] = {}
        self._places: list[tuple[Slot, torch.nn.Module | None]] = []
        self._rebuild()

    # ---- the slots and guards of a call ----------------------------------------------------

    def _rebuild(self) -> None:
        """Finds the modules the function can reach (the root, modules among its globals and
        captured variables, and their children) and their parameters and buffers."""
        self.modules = []
        seen: set[int] = set()
        for prefix, m in self._reachable_modules():
            for name, sub in m.named_modules(prefix=prefix, remove_duplicate=False):
                if id(sub) not in seen:
                    seen.add(id(sub))
                    self.modules.append((name, sub))
        self.slots = []
        for name, m in self.modules:
            for kind in ("_parameters", "_buffers"):
                for key in getattr(m, kind):
                    self.slots.append(Slot(getattr(m, kind), key, _identifier(f"{name}_{key}" if name else key)))
        self._structure = self._module_structure()
        self._watch = None

    def _reachable_modules(self) -> Iterable[tuple[str, torch.nn.Module]]:
        if self.root is not None:
            yield "self", self.root
        fn = self.fn
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.nn.Module) and owner is not self.root:
            yield "self", owner
        self._places = self._module_places()
        for slot, module in self._places:
            if module is not None:
                yield slot.name, module

    def _module_places(self) -> list[tuple[Slot, torch.nn.Module | None]]:
        """Each global the function names and each variable it captures, with the module it
        holds (None: no module). A call whose places hold other modules than these (a global
        rebound to another nn.Module) finds its modules again."""
        func = getattr(self.fn, "__func__", self.fn)
        globals_ = getattr(func, "__globals__", {})
        code = getattr(func, "__code__", None)
        if code is None:
            return []
        places = [Slot(globals_, name, name) for name in dict.fromkeys(_code_names(code))]
        places += [Slot(cell, None, name) for name, cell in zip(code.co_freevars, getattr(func, "__closure__", None) or ())]
        return [(slot, _module_in(slot)) for slot in places]

    def _places_moved(self) -> bool:
        return any(_module_in(slot) is not module for slot, module in self._places)

    def _module_structure(self) -> tuple:
        return tuple(
            (id(m), tuple(m._parameters), tuple(m._buffers), tuple(id(c) for c in m._modules.values()))
            for _, m in self.modules
        )

    def empty(self) -> bool:
        return not self.slots and not self.modules

    def read(self) -> tuple[list[Any], int]:
        """The slots' current values (leaves of the call after the arguments) and a key that is
        equal for two calls exactly when their guards are (the modules' flags and plain
        attributes)."""
        if self._places_moved():
            self._rebuild()  # a global or captured variable now holds another module
        watch = self._watch
        if watch is not None and watch.unchanged():
            values = list(self._values)
            for i, slot in self._unwatched:
                value = slot.read()
                values[i] = None if value is _ABSENT else value
            return values, self._guards_key
        return self._walk()

    def _walk(self) -> tuple[list[Any], int]:
        structure = self._module_structure()
        if structure != self._structure:
            self._rebuild()
        dicts = [d for _, m in self.modules for d in (m.__dict__, m._parameters, m._buffers, m._modules)]
        watch = DictWatch(dicts) if DictWatch is not None else None  # before the reads it vouches for
        values = []
        for slot in self.slots:
            value = slot.read()
            values.append(None if value is _ABSENT else value)
        guards = tuple(
            (m.training, tuple((k, v) for k, v in m.__dict__.items() if _plain(v) and k != "training"))
            for _, m in self.modules
        )
        key = self._guard_keys.setdefault(guards, len(self._guard_keys))
        watched = {id(d) for d in dicts}
        self._values, self._guards_key, self._watch = values, key, watch
        self._unwatched = [(i, s) for i, s in enumerate(self.slots) if not (isinstance(s.holder, dict) and id(s.holder) in watched)]
        return list(values), key

    # ---- tracing ----------------------------------------------------------------------------

    def known_inputs(self) -> list[tuple[str, torch.Tensor]]:
        out = []
        for slot in self.slots:
            value = slot.read()
            if isinstance(value, torch.Tensor):
                out.append((slot.name, value))
        return out

    def resolve(self, t: torch.Tensor) -> str:
        """A new slot for a tensor the function reached that no slot holds yet: a plain tensor
        attribute of a module, a global, a captured variable, or (found nowhere) the tensor
        itself, read as it is on every call."""
        slot = self._find(t) or Slot(t, _ABSENT, "captured")
        self.slots.append(slot)
        self._watch = None  # the next read walks the new slot list
        return slot.name

    def _find(self, t: torch.Tensor) -> Slot | None:
        for name, m in self.modules:
            for key, value in m.__dict__.items():
                if value is t:
                    return Slot(m.__dict__, key, _identifier(f"{name}_{key}"))
        func = getattr(self.fn, "__func__", self.fn)
        code = getattr(func, "__code__", None)
        if code is not None:
            for name, cell in zip(code.co_freevars, getattr(func, "__closure__", None) or ()):
                try:
                    if cell.cell_contents is t:
                        return Slot(cell, None, _identifier(name))
                except ValueError:
                    continue
        globals_ = getattr(func, "__globals__", None)
        if globals_ is not None:
            names = list(dict.fromkeys(_code_names(code))) if code is not None else []
            # A global the function names first, then any other of its module (a helper's).
            for name in names + list(globals_):
                if globals_.get(name) is t:
                    return Slot(globals_, name, _identifier(name))
        return None

    def begin_trace(self) -> None:
        """Remembers every module's tensors and attributes, and the globals the function names,
        to see afterwards what the trace rebound."""
        self.rebinds = []
        self._snapshots = []
        for _, m in self.modules:
            for d in (m._buffers, m.__dict__):
                self._snapshots.append((d, dict(d)))
        func = getattr(self.fn, "__func__", self.fn)
        globals_ = getattr(func, "__globals__", None)
        code = getattr(func, "__code__", None)
        if globals_ is not None and code is not None:
            names = set(_code_names(code))
            self._snapshots.append((globals_, {k: v for k, v in globals_.items() if k in names}))

    def end_trace(self) -> list[Proxy]:
        """Puts back what the trace rebound to proxies and returns the proxies, in the order of
        self.rebinds (the slots each call stores the program's extra outputs into)."""
        values: list[Proxy] = []
        for d, before in self._snapshots:
            for key in list(d):
                value = d[key]
                if not isinstance(value, Proxy):
                    _check_no_hidden_proxy(key, value)
                    continue
                if before.get(key, _ABSENT) is value:
                    continue
                self.rebinds.append(Slot(d, key, _identifier(str(key))))
                values.append(value)
                if key in before:
                    d[key] = before[key]
                else:
                    del d[key]
        self._snapshots = []
        return values

    def replay(self, values: list[Any]) -> None:
        """Stores a call's rebound values into their slots, as eager's assignments did."""
        for slot, value in zip(self.rebinds, values):
            slot.write(value)


def _check_no_hidden_proxy(key: Any, value: Any) -> None:
    """A traced tensor kept inside a list or dict attribute would outlive the trace as a
    placeholder without data; kiln refuses that instead of leaving it there."""
    if type(value) in (list, tuple):
        items: Iterable = value
    elif type(value) is dict:
        items = value.values()
    else:
        return
    if any(isinstance(v, Proxy) for v in items):
        raise UnsupportedError(
            f"kiln: the function stores a tensor it computes inside the attribute or global "
            f"'{key}' (a list, tuple or dict); kiln can replay only an attribute bound to a tensor "
            "itself. Return the tensor instead, or bind it to an attribute of its own."
        )
