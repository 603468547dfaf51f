"""kiln's op table as the Python front end sees it: each op's name and signature.

This mirrors the rows of src/kiln/ir/ops.def (tests/python/test_ops_table.py checks that they
agree). The tracer needs the signatures to write a call the way kiln's printer does: positional
arguments up to the last one that differs from its default, keyword-only arguments only when
they differ from theirs. Writing the canonical form means `kiln-opt file.trace` prints back
exactly the text the tracer wrote, which the tests use as a round-trip check.

Once the C++ extension exists it can export this table and this file can go.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    kind: str  # T TS S int ints int|ints bool dtype str device index Ts
    optional: bool  # `?`: None is allowed
    keyword_only: bool
    has_default: bool
    default: Any = None  # the default as kiln writes it (a Python value; lists stay lists)


@dataclasses.dataclass(frozen=True)
class OpSchema:
    name: str
    kind: str  # unary binary ternary creation reduction view scatter mutation join opaque composite
    params: tuple[Param, ...]
    outputs: int  # -1: as many as the op makes (split, chunk, unbind)
    alias: str  # kNone kViewOf0 kMaybeViewOf0 kMutates0 kMetadata0

    def param(self, name: str) -> Param | None:
        for p in self.params:
            if p.name == name:
                return p
        return None


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    kind: str
    signature: str
    inplace: bool  # elementwise ops only: the table also has `<name>_`
    outputs: int = 1
    alias: str = "kNone"


# The rows of ops.def, in its order.
ROWS: tuple[Row, ...] = (
    # elementwise unary
    Row("abs", "unary", "self:T", True),
    Row("neg", "unary", "self:T", True),
    Row("exp", "unary", "self:T", True),
    Row("exp2", "unary", "self:T", True),
    Row("expm1", "unary", "self:T", True),
    Row("log", "unary", "self:T", True),
    Row("log1p", "unary", "self:T", True),
    Row("log2", "unary", "self:T", True),
    Row("sqrt", "unary", "self:T", True),
    Row("rsqrt", "unary", "self:T", True),
    Row("sin", "unary", "self:T", True),
    Row("cos", "unary", "self:T", True),
    Row("tan", "unary", "self:T", True),
    Row("tanh", "unary", "self:T", True),
    Row("asin", "unary", "self:T", True),
    Row("acos", "unary", "self:T", True),
    Row("atan", "unary", "self:T", True),
    Row("sinh", "unary", "self:T", True),
    Row("cosh", "unary", "self:T", True),
    Row("sigmoid", "unary", "self:T", True),
    Row("relu", "unary", "self:T", True),
    Row("gelu", "unary", "self:T", True),
    Row("silu", "unary", "self:T", True),
    Row("erf", "unary", "self:T", True),
    Row("reciprocal", "unary", "self:T", True),
    Row("floor", "unary", "self:T", True),
    Row("ceil", "unary", "self:T", True),
    Row("round", "unary", "self:T", True),
    Row("trunc", "unary", "self:T", True),
    Row("sign", "unary", "self:T", True),
    Row("square", "unary", "self:T", True),
    Row("logical_not", "unary", "self:T", True),
    Row("bitwise_not", "unary", "self:T", True),
    Row("isnan", "unary", "self:T", False),
    # elementwise binary
    Row("add", "binary", "self:T, other:TS, *, alpha:S=1", True),
    Row("sub", "binary", "self:T, other:TS, *, alpha:S=1", True),
    Row("mul", "binary", "self:T, other:TS", True),
    Row("div", "binary", "self:T, other:TS, *, rounding_mode:str?=None", True),
    Row("pow", "binary", "self:T, exponent:TS", True),
    Row("remainder", "binary", "self:T, other:TS", True),
    Row("fmod", "binary", "self:T, other:TS", True),
    Row("maximum", "binary", "self:T, other:T", True),
    Row("minimum", "binary", "self:T, other:T", True),
    Row("atan2", "binary", "self:T, other:T", True),
    Row("eq", "binary", "self:T, other:TS", True),
    Row("ne", "binary", "self:T, other:TS", True),
    Row("lt", "binary", "self:T, other:TS", True),
    Row("le", "binary", "self:T, other:TS", True),
    Row("gt", "binary", "self:T, other:TS", True),
    Row("ge", "binary", "self:T, other:TS", True),
    Row("logical_and", "binary", "self:T, other:T", True),
    Row("logical_or", "binary", "self:T, other:T", True),
    Row("logical_xor", "binary", "self:T, other:T", True),
    Row("bitwise_and", "binary", "self:T, other:TS", True),
    Row("bitwise_or", "binary", "self:T, other:TS", True),
    Row("copy", "binary", "self:T, src:T", False),
    Row("bitwise_xor", "binary", "self:T, other:TS", True),
    # elementwise ternary and casts
    Row("where", "ternary", "condition:T, self:TS, other:TS", False),
    Row("clamp", "ternary", "self:T, min:TS?=None, max:TS?=None", True),
    Row("lerp", "ternary", "self:T, end:T, weight:TS", True),
    Row("addcmul", "ternary", "self:T, tensor1:T, tensor2:T, *, value:S=1", True),
    Row("addcdiv", "ternary", "self:T, tensor1:T, tensor2:T, *, value:S=1", True),
    Row("to", "unary", "self:T", False),
    # creation
    Row("full", "creation", 'size:ints, fill_value:S, *, dtype:dtype?=None, device:device="cpu"', False),
    Row("zeros", "creation", 'size:ints, *, dtype:dtype?=None, device:device="cpu"', False),
    Row("ones", "creation", 'size:ints, *, dtype:dtype?=None, device:device="cpu"', False),
    Row("full_like", "creation", "self:T, fill_value:S, *, dtype:dtype?=None", False),
    Row("zeros_like", "creation", "self:T, *, dtype:dtype?=None", False),
    Row("ones_like", "creation", "self:T, *, dtype:dtype?=None", False),
    Row("empty_like", "creation", "self:T, *, dtype:dtype?=None", False),
    Row("arange", "creation", 'start:S, end:S, step:S=1, *, dtype:dtype?=None, device:device="cpu"', False),
    Row("fill", "creation", "self:T, value:TS", False),
    # reductions
    Row("sum", "reduction", "self:T, dim:ints?=None, keepdim:bool=False, *, dtype:dtype?=None", False),
    Row("prod", "reduction", "self:T, dim:int?=None, keepdim:bool=False, *, dtype:dtype?=None", False),
    Row("mean", "reduction", "self:T, dim:ints?=None, keepdim:bool=False, *, dtype:dtype?=None", False),
    Row("amax", "reduction", "self:T, dim:ints=[], keepdim:bool=False", False),
    Row("amin", "reduction", "self:T, dim:ints=[], keepdim:bool=False", False),
    Row("var", "reduction", "self:T, dim:ints?=None, *, correction:S=1, keepdim:bool=False", False),
    Row("std", "reduction", "self:T, dim:ints?=None, *, correction:S=1, keepdim:bool=False", False),
    Row("argmax", "reduction", "self:T, dim:int?=None, keepdim:bool=False", False),
    Row("argmin", "reduction", "self:T, dim:int?=None, keepdim:bool=False", False),
    # views
    Row("view", "view", "self:T, size:ints", False, 1, "kViewOf0"),
    Row("reshape", "view", "self:T, shape:ints", False, 1, "kMaybeViewOf0"),
    Row("permute", "view", "self:T, dims:ints", False, 1, "kViewOf0"),
    Row("transpose", "view", "self:T, dim0:int, dim1:int", False, 1, "kViewOf0"),
    Row("t", "view", "self:T", False, 1, "kViewOf0"),
    Row("expand", "view", "self:T, size:ints", False, 1, "kViewOf0"),
    Row("unsqueeze", "view", "self:T, dim:int", False, 1, "kViewOf0"),
    Row("squeeze", "view", "self:T, dim:ints?=None", False, 1, "kViewOf0"),
    Row("flatten", "view", "self:T, start_dim:int=0, end_dim:int=-1", False, 1, "kMaybeViewOf0"),
    Row("unflatten", "view", "self:T, dim:int, sizes:ints", False, 1, "kViewOf0"),
    Row("slice", "view", "self:T, dim:int=0, start:int?=None, end:int?=None, step:int=1", False, 1, "kViewOf0"),
    Row("narrow", "view", "self:T, dim:int, start:int, length:int", False, 1, "kViewOf0"),
    Row("select", "view", "self:T, dim:int, index:int", False, 1, "kViewOf0"),
    Row("getitem", "view", "self:T, index:index", False, 1, "kViewOf0"),
    Row("diagonal", "view", "self:T, offset:int=0, dim1:int=0, dim2:int=1", False, 1, "kViewOf0"),
    Row("as_strided", "view", "self:T, size:ints, stride:ints, storage_offset:int?=None", False, 1, "kViewOf0"),
    Row("split", "view", "self:T, split_size:int|ints, dim:int=0", False, -1, "kViewOf0"),
    Row("chunk", "view", "self:T, chunks:int, dim:int=0", False, -1, "kViewOf0"),
    Row("unbind", "view", "self:T, dim:int=0", False, -1, "kViewOf0"),
    Row("detach", "view", "self:T", False, 1, "kViewOf0"),
    Row("alias", "view", "self:T", False, 1, "kViewOf0"),
    Row("view_dtype", "view", "self:T, dtype:dtype", False, 1, "kViewOf0"),
    # the inverse scatters of the views
    Row("slice_scatter", "scatter", "self:T, src:T, dim:int=0, start:int?=None, end:int?=None, step:int=1", False),
    Row("select_scatter", "scatter", "self:T, src:T, dim:int, index:int", False),
    Row("diagonal_scatter", "scatter", "self:T, src:T, offset:int=0, dim1:int=0, dim2:int=1", False),
    Row("as_strided_scatter", "scatter", "self:T, src:T, size:ints, stride:ints, storage_offset:int?=None", False),
    # bit reinterpretation (view_dtype's functional form)
    Row("bitcast", "opaque", "self:T, dtype:dtype", False),
    # index reads and writes
    Row("wrap_index", "index", "index:T, size:int", False),
    Row("index_select", "index", "self:T, dim:int, index:T", False),
    Row("gather", "index", "self:T, dim:int, index:T", False),
    Row("index_copy", "index", "self:T, dim:int, index:T, source:T", False),
    Row("index_add", "index", "self:T, dim:int, index:T, source:T, *, alpha:S=1", False),
    Row("scatter", "index", "self:T, dim:int, index:T, src:T, *, reduce:str?=None, include_self:bool=True", False),
    # mutation (the in-place elementwise forms come from the rows above)
    Row("fill_", "mutation", "self:T, value:TS", False, 1, "kMutates0"),
    Row("zero_", "mutation", "self:T", False, 1, "kMutates0"),
    Row("copy_", "mutation", "self:T, src:T", False, 1, "kMutates0"),
    Row("setitem_", "mutation", "self:T, index:index, value:TS", False, 0, "kMutates0"),
    Row("t_", "mutation", "self:T", False, 1, "kMetadata0"),
    Row("transpose_", "mutation", "self:T, dim0:int, dim1:int", False, 1, "kMetadata0"),
    Row("unsqueeze_", "mutation", "self:T, dim:int", False, 1, "kMetadata0"),
    Row("squeeze_", "mutation", "self:T, dim:ints?=None", False, 1, "kMetadata0"),
    Row("as_strided_", "mutation", "self:T, size:ints, stride:ints, storage_offset:int?=None", False, 1, "kMetadata0"),
    # joins and opaque ops
    Row("cat", "join", "tensors:Ts, dim:int=0", False),
    Row("stack", "join", "tensors:Ts, dim:int=0", False),
    Row("matmul", "opaque", "self:T, other:T", False),
    Row("bmm", "opaque", "self:T, mat2:T", False),
    Row("linear", "opaque", "input:T, weight:T, bias:T?=None", False),
    Row("eager_call", "opaque", 'fn:int, inputs:Ts, results:str, *, vjp:int=-1, vjp_results:str="", vjp_outputs:ints=[], input_layouts:str=""', False, -1),
    # decompositions
    Row("softmax", "composite", "self:T, dim:int, dtype:dtype?=None", False),
    Row("log_softmax", "composite", "self:T, dim:int, dtype:dtype?=None", False),
    Row("layer_norm", "composite", "input:T, normalized_shape:ints, weight:T?=None, bias:T?=None, eps:S=1e-05", False),
    Row("rms_norm", "composite", "input:T, normalized_shape:ints, weight:T?=None, eps:S?=None", False),
)


def _parse_default(text: str) -> Any:
    # The few literal forms ops.def uses (as parse_default in src/kiln/ir/op.cpp).
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    if text.startswith('"'):
        return text[1:-1]
    if text.startswith("["):
        body = text[1:-1].strip()
        return [int(x) for x in body.split(",")] if body else []
    if re.search(r"[.e]", text):
        return float(text)
    return int(text)


def parse_signature(sig: str) -> tuple[Param, ...]:
    """"self:T, other:TS, *, alpha:S=1" -> params (as parse_signature in op.cpp)."""
    params = []
    keyword_only = False
    # Split at top-level ", " (a default may be a list with commas inside).
    items, depth, start = [], 0, 0
    for i, ch in enumerate(sig):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(sig[start:i].strip())
            start = i + 1
    if sig.strip():
        items.append(sig[start:].strip())
    for item in items:
        if item == "*":
            keyword_only = True
            continue
        name, rest = item.split(":", 1)
        kind, eq, default = rest.partition("=")
        optional = kind.endswith("?")
        kind = kind.rstrip("?")
        params.append(
            Param(name, kind, optional, keyword_only, bool(eq), _parse_default(default) if eq else None)
        )
    return tuple(params)


def _build() -> dict[str, OpSchema]:
    table: dict[str, OpSchema] = {}
    for row in ROWS:
        params = parse_signature(row.signature)
        elementwise = row.kind in ("unary", "binary", "ternary")
        if row.name == "to":
            # The cast's target dtype is added by the registry (op.cpp), not written in ops.def.
            params = params + (Param("dtype", "dtype", False, False, False),)
        if row.name == "gelu":
            params = params + (Param("approximate", "str", False, True, True, "none"),)
        alias = row.alias
        if row.name == "to":
            alias = "kMaybeViewOf0"  # `to` returns its input itself when the dtype does not change
        table[row.name] = OpSchema(row.name, row.kind, params, row.outputs, alias)
        if elementwise and row.inplace:
            table[row.name + "_"] = OpSchema(row.name + "_", "mutation", params, 1, "kMutates0")
    return table


OPS: dict[str, OpSchema] = _build()
