"""Complex tensors, traced as pairs of reals.

kiln's IR has no complex dtype. A complex tensor of a traced program is held as its
`torch.view_as_real` form: a real tensor with one more dim of size 2 (real part, imaginary part)
over the same memory, its *pair*. The complex proxy keeps eager's metadata (a complex meta
tensor, which user code asks for shapes and dtypes) and names its pair (`_kiln_pair`), which is
what the program computes with:

    z = torch.view_as_complex(x.reshape(4, 8, 2))     # z: complex64[4, 8], pair p: f32[4, 8, 2]
    w = z * freqs                                       # pair: where(lane == 0, pr*fr - pi*fi,
                                                        #                    pr*fi + pi*fr)
    torch.view_as_real(w).flatten(1)                    # a view of w's pair

So complex arithmetic is real elementwise arithmetic, and it fuses with the real ops around it
(a rotary embedding is one kernel). Views of a complex tensor are the same views of its pair with
the last dim kept, so a write through a view of a complex tensor, through `z.real`, or through
`view_as_real(z)` is a write into the pair's storage, which functionalization tracks like any
other. A program input that is complex is passed to the program as `view_as_real` of the caller's
tensor (kiln.jit converts its arguments and results: _jit.py), so writes land in the caller's
memory and returned views are views of it.

Requires: the tracing mode routes every call with a complex proxy among its arguments, and the
calls that make complex tensors from real ones (view_as_complex, polar, complex, a cast to a
complex dtype), to `lower` (the mode's own dispatch, _tracer.py).
Ensures: a rule's results are complex proxies whose pair has the layout eager gives the complex
result (a real layout compatible with view_as_complex), or real proxies. An op on complex
tensors without a rule here runs as an eager step (kiln._fallback) on complex views of the pairs;
one that writes its arguments or returns a view of them raises UnsupportedError.
Tests: tests/python/test_complex.py.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from ._errors import UnsupportedError
from ._tracer import Call, Proxy, _func_key, _TracingMode

REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def is_complex_proxy(x: Any) -> bool:
    return isinstance(x, Proxy) and x.dtype.is_complex


def pair_of(z: Proxy) -> Proxy:
    return z._kiln_pair


def wants_complex(key: Any, leaves: list) -> bool:
    """Whether the tracing mode hands this call to `lower`."""
    if any(is_complex_proxy(leaf) or isinstance(leaf, complex) for leaf in leaves):
        return True
    if key in _MAKERS:
        return True
    return key in _CASTS and any(isinstance(leaf, torch.dtype) and leaf.is_complex for leaf in leaves)


def lower(call: Call, key: Any) -> Any:
    """The complex call as real ops on pairs (or an eager step on complex views of them)."""
    rule = _RULES.get(key)
    if rule is None:
        if call.tracer.register_eager is None:
            raise call.unsupported("kiln has no lowering for this op on complex tensors; let kiln.jit run it eagerly (fallback=True).")
        return eager_step(call, call.run_meta())
    call.meta_result = call.run_meta()  # before the mode: PyTorch's meta kernels are not traced
    with _TracingMode(call.tracer):  # the real ops a rule calls are traced as the user's own
        return rule(call)


# ---- proxies and pairs ---------------------------------------------------------------------------


def pair_of_argument(t: torch.Tensor, name: str) -> torch.Tensor:
    """The view_as_real pair of a complex argument (the caller's memory), for the tracer's input
    and kiln.jit's every call."""
    if t.dtype not in REAL_OF:
        raise UnsupportedError(f"kiln: {name} is {t.dtype}; kiln supports complex64 and complex128.")
    if t.is_conj() or t.is_neg():
        raise UnsupportedError(
            f"kiln: {name} is a lazily conjugated or negated view (conj()); pass t.resolve_conj() "
            "or t.conj_physical() instead."
        )
    return torch.view_as_real(t)


def make_complex_proxy(tracer: Any, pair: Proxy) -> Proxy:
    """The complex proxy of a pair whose layout view_as_complex accepts."""
    with torch._C.DisableTorchFunction():  # a metadata computation, not an op of the program
        meta = torch.view_as_complex(pair.as_subclass(torch.Tensor))
    proxy = torch.Tensor._make_subclass(Proxy, meta, False)
    proxy._kiln_device = pair._kiln_device
    proxy._kiln_tracer = tracer
    proxy._kiln_pair = pair
    proxy._kiln_name = pair._kiln_name
    return proxy


def _complex_result(call: Call, pair: Proxy, like: torch.Tensor) -> Proxy:
    """A complex proxy for a new tensor eager makes as `like` (its meta tensor), from its pair."""
    return make_complex_proxy(call.tracer, _with_layout(pair, like))


def _complex_view(call: Call, pair: Proxy, like: torch.Tensor) -> Proxy:
    """A complex proxy for a view eager makes as `like`: the same view of the pair, which
    must address the same memory (a copy would lose the writes made through it)."""
    if not _pair_strides_match(pair, like):
        raise AssertionError(f"kiln bug: {call.name} at {call.where()}: the view of the pair is not the complex view")
    return make_complex_proxy(call.tracer, pair)


def _pair_strides_match(pair: torch.Tensor, like: torch.Tensor) -> bool:
    if tuple(pair.shape) != tuple(like.shape) + (2,) or pair.stride()[-1] != 1:
        return False
    return all(size <= 1 or ps == 2 * s for size, ps, s in zip(like.shape, pair.stride(), like.stride()))


def _with_layout(pair: Proxy, like: torch.Tensor) -> Proxy:
    """pair laid out as eager lays out the complex result `like` (so that reshapes view or copy
    as eager's do), by a copy where kiln's real ops chose another layout."""
    if _pair_strides_match(pair, like):
        return pair
    if like.is_contiguous():
        return pair.contiguous()
    # A dense permuted layout (the only kind TensorIterator makes): permute to its order, copy
    # contiguously, permute back.
    n = like.dim()
    order = sorted(range(n), key=lambda d: -like.stride()[d])
    inverse = [order.index(d) for d in range(n)]
    laid = pair.permute(*order, n).contiguous().permute(*inverse, n)
    return laid if _pair_strides_match(laid, like) else pair.contiguous()


def _lane(like: Proxy) -> Proxy:
    return torch.arange(2, device=like._kiln_device) == 0


def _join(re: Any, im: Any, like: Proxy) -> Proxy:
    """The pair [..., 2] of real parts `re` and imaginary parts `im` (broadcast together)."""
    re = re.unsqueeze(-1) if isinstance(re, torch.Tensor) else re
    im = im.unsqueeze(-1) if isinstance(im, torch.Tensor) else im
    return torch.where(_lane(like), re, im)


def _parts(x: Any, real_dtype: torch.dtype) -> tuple[Any, Any]:
    """(real part, imaginary part) of an operand at real_dtype; the imaginary part of a real
    operand is None (zero)."""
    if is_complex_proxy(x):
        p = pair_of(x)
        if p.dtype != real_dtype:
            p = p.to(real_dtype)
        return p[..., 0], p[..., 1]
    if isinstance(x, Proxy):
        return (x if x.dtype == real_dtype else x.to(real_dtype)), None
    if isinstance(x, complex):
        return x.real, x.imag
    return x, None


def _zeros(like: Any) -> Any:
    return torch.zeros_like(like) if isinstance(like, torch.Tensor) else 0.0


def _result(call: Call) -> Any:
    """Eager's result of the call, on the meta tensors (its dtype, shape and strides, and
    eager's error where eager raises), computed by `lower`."""
    return call.meta_result


def _first_proxy(call: Call) -> Proxy:
    return next(p for p in call.proxies())


# ---- the rules -----------------------------------------------------------------------------------

_RULES: dict[Any, Callable[[Call], Any]] = {}
_MAKERS: set[Any] = set()  # functions that make complex tensors from real ones
_CASTS: set[Any] = set()  # casts, complex when given a complex dtype


def _register(rule: Callable[[Call], Any], *funcs: Any, maker: bool = False, cast: bool = False) -> None:
    for f in funcs:
        if f is None:
            continue
        key = _func_key(f)
        _RULES[key] = rule
        if maker:
            _MAKERS.add(key)
        if cast:
            _CASTS.add(key)


def _fns(*names: str) -> list[Any]:
    out = []
    for name in names:
        for owner in (torch, torch.Tensor):
            f = getattr(owner, name, None)
            if f is not None:
                out.append(f)
    return out


def _arg(call: Call, i: int, name: str, default: Any = None) -> Any:
    if i < len(call.args):
        return call.args[i]
    return call.kwargs.get(name, default)


# ---- making complex tensors ----


def _view_as_complex(call: Call) -> Any:
    result = _result(call)
    x = _arg(call, 0, "input")
    return _complex_view(call, x.view(tuple(x.shape)), result)


def _view_as_real(call: Call) -> Any:
    _result(call)
    p = pair_of(_arg(call, 0, "input"))
    return p.view(tuple(p.shape))


def _polar(call: Call) -> Any:
    like = _result(call)
    magnitude, angle = _arg(call, 0, "abs"), _arg(call, 1, "angle")
    return _complex_result(call, _join(magnitude * torch.cos(angle), magnitude * torch.sin(angle), magnitude), like)


def _complex(call: Call) -> Any:
    like = _result(call)
    re, im = _arg(call, 0, "real"), _arg(call, 1, "imag")
    return _complex_result(call, _join(re, im, re), like)


_register(_view_as_complex, torch.view_as_complex, maker=True)
_register(_view_as_real, torch.view_as_real)
_register(_polar, torch.polar, maker=True)
_register(_complex, torch.complex, maker=True)


def _part(index: int) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        _result(call)
        return pair_of(_arg(call, 0, "input")).select(-1, index)

    return rule


_register(_part(0), torch.real)
_RULES[("property", "real")] = _part(0)
_register(_part(1), torch.imag)
_RULES[("property", "imag")] = _part(1)


def _to(call: Call) -> Any:
    """A cast: complex to complex (the pair cast), real to complex (a zero imaginary part),
    complex to real (the real part, with eager's warning)."""
    result = _result(call)
    if not isinstance(result, torch.Tensor):
        raise call.unsupported("this form of a cast of a complex tensor is not supported by kiln.")
    if any(result is a for a in call.args):
        return result  # eager's no-op cast returns the tensor itself
    x = call.args[0]
    for a in list(call.args[1:]) + list(call.kwargs.values()):
        if isinstance(a, (str, torch.device)) and torch.device(a).type != x._kiln_device.type:
            raise call.unsupported("a complex tensor moved to another device inside the function is not supported by kiln.")
    if result.dtype.is_complex:
        real_dtype = REAL_OF.get(result.dtype)
        if real_dtype is None:
            raise call.unsupported(f"kiln supports complex64 and complex128, not {result.dtype}.")
        re, im = _parts(x, real_dtype)
        if im is None:
            return _complex_result(call, _join(re, _zeros(re), re), result)
        return _complex_result(call, pair_of(x).to(real_dtype), result)
    re, _ = _parts(x, REAL_OF[x.dtype])
    return re.to(result.dtype) if re.dtype != result.dtype else re.clone()  # a new tensor, as eager's


_register(_to, torch.Tensor.to, torch.Tensor.type, torch.Tensor.type_as, cast=True)


# ---- views ----


def _dim(d: int, n: int) -> int:
    return d + n if d < 0 else d


def _view(op: Callable[[Proxy, torch.Tensor, Call], Any]) -> Callable[[Call], Any]:
    """A view (or a reshape that may copy): `op(pair, result, call)` makes the pair's view from
    eager's complex result(s)."""

    def rule(call: Call) -> Any:
        result = _result(call)
        if isinstance(result, Proxy) and any(result is a for a in call.args):
            return result  # the tensor itself (x.contiguous() of a contiguous x)
        z = call.args[0]
        for r in pytree.tree_leaves(result):
            if isinstance(r, torch.Tensor) and not r.dtype.is_complex:
                raise call.unsupported("a complex tensor viewed as a real dtype is not supported by kiln; use torch.view_as_real.")
        made = op(pair_of(z), result, call)

        def complex_of(pair: Proxy, like: torch.Tensor) -> Proxy:
            with torch._C.DisableTorchFunction():  # metadata, not an op of the program
                is_view = like.untyped_storage()._cdata == z.untyped_storage()._cdata
            return (_complex_view if is_view else _complex_result)(call, pair, like)

        if isinstance(result, torch.Tensor):
            return complex_of(made, result)
        return type(result)(complex_of(m, r) for m, r in zip(made, result))

    return rule


def _reshaped(p: Proxy, r: torch.Tensor, call: Call) -> Proxy:
    return p.reshape(*r.shape, 2)


def _viewed(p: Proxy, r: torch.Tensor, call: Call) -> Proxy:
    return p.view(*r.shape, 2)


def _expanded(p: Proxy, r: torch.Tensor, call: Call) -> Proxy:
    return p.expand(*r.shape, 2)


def _permuted(p: Proxy, r: torch.Tensor, call: Call) -> Proxy:
    n = call.args[0].dim()
    rest = call.args[1:]
    dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest or call.kwargs["dims"]
    return p.permute(*[_dim(d, n) for d in dims], n)


def _transposed(p: Proxy, r: torch.Tensor, call: Call) -> Proxy:
    n = call.args[0].dim()
    a, b = _arg(call, 1, "dim0"), _arg(call, 2, "dim1")
    return p.transpose(_dim(a, n), _dim(b, n))


def _t(p: Proxy, r: torch.Tensor, call: Call) -> Proxy:
    return p.transpose(0, 1) if call.args[0].dim() == 2 else p.view(tuple(p.shape))


def _unsqueezed(p: Proxy, r: torch.Tensor, call: Call) -> Proxy:
    return p.unsqueeze(_dim(_arg(call, 1, "dim"), call.args[0].dim() + 1))


def _squeezed(p: Proxy, r: torch.Tensor, call: Call) -> Proxy:
    shape = call.args[0].shape
    n = len(shape)
    given = _arg(call, 1, "dim")
    given = range(n) if given is None else [given] if isinstance(given, int) else given
    dims = [d for d in (_dim(g, n) for g in given) if shape[d] == 1]
    return p.squeeze(tuple(dims)) if dims else p.view(tuple(p.shape))


def _selected(p: Proxy, r: torch.Tensor, call: Call) -> Proxy:
    return p.select(_dim(_arg(call, 1, "dim"), call.args[0].dim()), _arg(call, 2, "index"))


def _narrowed(p: Proxy, r: torch.Tensor, call: Call) -> Proxy:
    n = call.args[0].dim()
    return p.narrow(_dim(_arg(call, 1, "dim"), n), _arg(call, 2, "start"), _arg(call, 3, "length"))


def _pieces(p: Proxy, results: Any, call: Call) -> list:
    """split/chunk: the same pieces of the pair along the same dim."""
    dim = _dim(_arg(call, 2, "dim", 0), call.args[0].dim())
    return list(p.split([r.shape[dim] for r in results], dim))


def _unbound(p: Proxy, results: Any, call: Call) -> list:
    return list(p.unbind(_dim(_arg(call, 1, "dim", 0), call.args[0].dim())))


def _indexed(p: Proxy, r: torch.Tensor, call: Call) -> Proxy:
    return p[_pair_key(call.args[0], call.args[1])]


def _pair_key(z: torch.Tensor, key: Any) -> Any:
    """The index of the pair that selects what `key` selects of z: every dim of z indexed as
    the key says (an Ellipsis spelled out), then the pair's last dim whole."""
    key = key if isinstance(key, tuple) else (key,)
    consumed = 0
    for k in key:
        if k is None or k is Ellipsis or isinstance(k, bool):
            continue
        if isinstance(k, torch.Tensor) and k.dtype == torch.bool:
            consumed += k.dim()
        else:
            consumed += 1
    if any(k is Ellipsis for k in key):
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (z.dim() - consumed) + key[at + 1 :]
    else:
        key = key + (slice(None),) * (z.dim() - consumed)
    return key + (slice(None),)


_register(_view(_reshaped), *_fns("reshape", "flatten", "unflatten", "reshape_as", "ravel"))
_register(_view(_viewed), torch.Tensor.view, torch.Tensor.view_as)
_register(_view(_expanded), torch.Tensor.expand, torch.Tensor.expand_as, torch.broadcast_to)
_register(_view(_permuted), *_fns("permute"))
_register(_view(_transposed), *_fns("transpose", "swapaxes", "swapdims"))
_register(_view(_t), *_fns("t"))
_register(_view(_unsqueezed), *_fns("unsqueeze"))
_register(_view(_squeezed), *_fns("squeeze"))
_register(_view(_selected), *_fns("select"))
_register(_view(_narrowed), *_fns("narrow"))
_register(_view(_pieces), *_fns("split", "chunk"))
_register(_view(_unbound), *_fns("unbind"))
_register(_view(_indexed), torch.Tensor.__getitem__)
_register(_view(lambda p, r, call: p.view(tuple(p.shape))), *_fns("detach", "alias"))
_register(_view(lambda p, r, call: p.contiguous()), torch.Tensor.contiguous)
_register(_view(lambda p, r, call: p.clone()), *_fns("clone"))


# ---- arithmetic ----


def _binary(compute: Callable[[Any, Any, Any, Any, dict], tuple[Any, Any]]) -> Callable[[Call], Any]:
    """An elementwise op of two operands: compute(ar, ai, br, bi, kwargs) -> (re, im), each
    part None where it is zero."""

    def rule(call: Call) -> Any:
        result = _result(call)
        a, b = _arg(call, 0, "input"), _arg(call, 1, "other")
        real_dtype = REAL_OF.get(result.dtype)
        if real_dtype is None:
            raise call.unsupported(f"kiln supports complex64 and complex128 results, not {result.dtype}.")
        ar, ai = _parts(a, real_dtype)
        br, bi = _parts(b, real_dtype)
        kwargs = {k: v for k, v in call.kwargs.items() if k not in ("input", "other")}
        re, im = compute(ar, ai, br, bi, kwargs)
        like = _first_proxy(call)
        pair = _join(re, im if im is not None else _zeros(re), like)
        return _write_or_make(call, pair, result)

    return rule


def _write_or_make(call: Call, pair: Proxy, result: torch.Tensor) -> Proxy:
    """An in-place op's new value written into its first argument (which it returns), or a new
    complex tensor."""
    target = call.args[0]
    if isinstance(result, Proxy) and result is target:
        pair_of(target).copy_(pair)
        return target
    return _complex_result(call, pair, result)


def _scaled(x: Any, alpha: Any) -> Any:
    return x if alpha is None or alpha == 1 or x is None else x * alpha


def _add_sub(sign: int) -> Callable[..., tuple[Any, Any]]:
    def compute(ar: Any, ai: Any, br: Any, bi: Any, kwargs: dict) -> tuple[Any, Any]:
        alpha = kwargs.get("alpha")
        if isinstance(alpha, complex):
            raise TypeError("kiln: a complex alpha is not supported; multiply the operand instead.")
        br, bi = _scaled(br, alpha), _scaled(bi, alpha)
        re = ar + br if sign > 0 else ar - br
        if bi is None:
            return re, ai
        if ai is None:
            return re, bi if sign > 0 else -bi
        return re, ai + bi if sign > 0 else ai - bi

    return compute


def _mul(ar: Any, ai: Any, br: Any, bi: Any, kwargs: dict) -> tuple[Any, Any]:
    if ai is None and bi is None:
        return ar * br, None
    if bi is None:
        return ar * br, ai * br
    if ai is None:
        return ar * br, ar * bi
    return ar * br - ai * bi, ar * bi + ai * br


def _div(ar: Any, ai: Any, br: Any, bi: Any, kwargs: dict) -> tuple[Any, Any]:
    """c10::complex's division (Smith's algorithm, scaled by the larger part of the divisor, so
    that it neither overflows nor underflows where eager does not)."""
    if kwargs.get("rounding_mode") is not None:
        raise TypeError("kiln: div with a rounding_mode is not defined for complex tensors.")
    if ai is None:
        ai = torch.zeros_like(ar) if isinstance(ar, torch.Tensor) else 0.0
    if bi is None:
        return ar / br, ai / br
    if not isinstance(br, torch.Tensor) and not isinstance(bi, torch.Tensor):
        return _div_by_number(ar, ai, complex(br, bi))
    c_larger = br.abs() >= bi.abs()
    rat_c = bi / br  # |c| >= |d|
    scl_c = 1.0 / (br + bi * rat_c)
    rat_d = br / bi
    scl_d = 1.0 / (bi + br * rat_d)
    both_zero = (br == 0) & (bi == 0)
    re = torch.where(c_larger, (ar + ai * rat_c) * scl_c, (ar * rat_d + ai) * scl_d)
    im = torch.where(c_larger, (ai - ar * rat_c) * scl_c, (ai * rat_d - ar) * scl_d)
    re = torch.where(both_zero, ar / br.abs(), re)
    im = torch.where(both_zero, ai / bi.abs(), im)
    return re, im


def _div_by_number(ar: Any, ai: Any, divisor: complex) -> tuple[Any, Any]:
    c, d = divisor.real, divisor.imag
    if c == 0 and d == 0:
        return ar / abs(c), ai / abs(d)
    if abs(c) >= abs(d):
        rat = d / c
        scl = 1.0 / (c + d * rat)
        return (ar + ai * rat) * scl, (ai - ar * rat) * scl
    rat = c / d
    scl = 1.0 / (d + c * rat)
    return (ar * rat + ai) * scl, (ai * rat - ar) * scl


def _swap_operands(compute: Callable[..., tuple[Any, Any]]) -> Callable[..., tuple[Any, Any]]:
    return lambda ar, ai, br, bi, kwargs: compute(br, bi, ar, ai, kwargs)


_register(_binary(_add_sub(+1)), *_fns("add", "add_", "__add__", "__iadd__", "__radd__"))
_register(_binary(_add_sub(-1)), *_fns("sub", "sub_", "subtract", "__sub__", "__isub__"))
_register(_binary(_swap_operands(_add_sub(-1))), *_fns("__rsub__", "rsub"))
_register(_binary(_mul), *_fns("mul", "mul_", "multiply", "__mul__", "__imul__", "__rmul__"))
_register(_binary(_div), *_fns("div", "div_", "divide", "true_divide", "__truediv__", "__itruediv__"))
_register(_binary(_swap_operands(_div)), *_fns("__rtruediv__", "__rdiv__"))


def _unary(compute: Callable[[Any, Any], tuple[Any, Any]], real_result: bool = False) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        result = _result(call)
        z = _arg(call, 0, "input")
        ar, ai = _parts(z, REAL_OF[z.dtype])
        re, im = compute(ar, ai)
        if real_result:
            return re.to(result.dtype) if re.dtype != result.dtype else re
        pair = _join(re, im if im is not None else _zeros(re), z)
        return _write_or_make(call, pair, result)

    return rule


def _abs(ar: Any, ai: Any) -> tuple[Any, Any]:
    """hypot(re, im), scaled by the larger part so that it does not overflow where eager's does
    not; infinite where either part is (even with the other NaN), as std::abs."""
    big = torch.maximum(ar.abs(), ai.abs())
    small = torch.minimum(ar.abs(), ai.abs())
    ratio = torch.where(big == 0, 0.0, small / big)
    value = big * torch.sqrt(1.0 + ratio * ratio)
    infinite = (ar.abs() == math.inf) | (ai.abs() == math.inf)
    return torch.where(infinite, math.inf, value), None


def _exp(ar: Any, ai: Any) -> tuple[Any, Any]:
    e = torch.exp(ar)
    return e * torch.cos(ai), e * torch.sin(ai)


_register(_unary(lambda ar, ai: (-ar, -ai)), *_fns("neg", "neg_", "negative", "__neg__"))
_register(_unary(lambda ar, ai: (ar, -ai)), *_fns("conj_physical", "conj_physical_"))
_register(_unary(_exp), *_fns("exp", "exp_"))
_register(_unary(_abs, real_result=True), *_fns("abs", "absolute", "__abs__"))
_register(_unary(lambda ar, ai: (torch.atan2(ai, ar), None), real_result=True), *_fns("angle"))


def _reduction(op: str) -> Callable[[Call], Any]:
    """sum/mean over dims of z: over the same dims of its pair."""

    def rule(call: Call) -> Any:
        result = _result(call)
        z = call.args[0]
        n = z.dim()
        dim = _arg(call, 1, "dim")
        keepdim = _arg(call, 2, "keepdim", False)
        if call.kwargs.get("dtype") is not None:
            raise call.unsupported(f"{op}(dtype=...) of a complex tensor is not supported by kiln.")
        dims = list(range(n)) if dim is None or dim == [] or dim == () else [dim] if isinstance(dim, int) else list(dim)
        pair = getattr(pair_of(z), op)([_dim(d, n) for d in dims], keepdim=keepdim)
        return _complex_result(call, pair, result)

    return rule


_register(_reduction("sum"), *_fns("sum"))
_register(_reduction("mean"), *_fns("mean"))


# ---- writes ----


def _as_pair(value: Any, like: Proxy, real_dtype: torch.dtype) -> Any:
    """A value written into a complex tensor, as a pair (a number pair for a number)."""
    re, im = _parts(value, real_dtype)
    if isinstance(re, torch.Tensor) or isinstance(im, torch.Tensor):
        return _join(re, im if im is not None else _zeros(re), like)
    return _join(torch.tensor(float(re), dtype=real_dtype, device=like._kiln_device), float(im or 0.0), like)


def _copy_(call: Call) -> Any:
    _result(call)
    z, src = call.args[0], _arg(call, 1, "src")
    if not is_complex_proxy(z):
        # A complex source into a real tensor: eager keeps the real part (and warns).
        return z.copy_(_parts(src, REAL_OF[src.dtype])[0])
    pair_of(z).copy_(_as_pair(src, z, pair_of(z).dtype))
    return z


def _fill_(call: Call) -> Any:
    _result(call)
    z = call.args[0]
    pair_of(z).copy_(_as_pair(_arg(call, 1, "value"), z, pair_of(z).dtype))
    return z


def _zero_(call: Call) -> Any:
    _result(call)
    pair_of(call.args[0]).zero_()
    return call.args[0]


def _setitem(call: Call) -> Any:
    z, key, value = call.args
    _result(call)
    if not is_complex_proxy(z):  # a complex value into a real tensor: its real part, as eager
        z[key] = _parts(value, REAL_OF[value.dtype])[0] if is_complex_proxy(value) else value.real
        return None
    target = pair_of(z)[_pair_key(z, key)]
    target.copy_(_as_pair(value, z, target.dtype))
    return None


def _cat(stack: bool) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        result = _result(call)
        tensors = _arg(call, 0, "tensors")
        dim = _arg(call, 1, "dim", 0)
        real_dtype = REAL_OF[result.dtype]
        like = next(t for t in tensors if isinstance(t, Proxy))
        pairs = [_as_pair(t, like, real_dtype) for t in tensors]
        n = result.dim()
        pair = torch.stack(pairs, _dim(dim, n)) if stack else torch.cat(pairs, _dim(dim, n))
        return _complex_result(call, pair, result)

    return rule


def _lazy_conjugate(call: Call) -> Any:
    raise call.unsupported(
        "conj() returns a lazily conjugated view, which kiln does not model (a later write into "
        "the tensor would have to show through it); use conj_physical(), which makes a new tensor."
    )


def _itself(call: Call) -> Any:
    return call.args[0]  # kiln's complex tensors are never lazily conjugated or negated


_register(_lazy_conjugate, *_fns("conj", "adjoint"))
_RULES[("property", "H")] = _RULES[("property", "mH")] = _lazy_conjugate
_RULES[("property", "mT")] = _view(lambda p, r, call: p.transpose(p.dim() - 3, p.dim() - 2))
_RULES[("property", "T")] = _view(lambda p, r, call: p.permute(*reversed(range(p.dim() - 1)), p.dim() - 1))
_register(_itself, *_fns("resolve_conj", "resolve_neg"))
_register(_copy_, torch.Tensor.copy_)
_register(_fill_, *_fns("fill_"))
_register(_zero_, *_fns("zero_"))
_register(_setitem, torch.Tensor.__setitem__)
_register(_cat(False), torch.cat, torch.concat, torch.concatenate)
_register(_cat(True), torch.stack)


# ---- everything else: an eager step on complex views of the pairs --------------------------------


def eager_step(call: Call, result: Any) -> Any:
    """PyTorch runs the op on complex tensors (view_as_complex of the pairs kiln holds) and
    hands back view_as_real of its complex results, which become complex proxies again.
    `result`: the op's result on the meta tensors. kiln._fallback sends here an op on real
    tensors that makes complex ones (torch.fft.fft of a real signal)."""
    from ._fallback import eager_fallback

    leaves, spec = pytree.tree_flatten((call.args, call.kwargs))
    is_complex = [is_complex_proxy(leaf) for leaf in leaves]
    real_leaves = [pair_of(leaf) if c else leaf for leaf, c in zip(leaves, is_complex)]
    func = call.func

    def on_complex_views(*args: Any, **kwargs: Any) -> Any:
        flat, flat_spec = pytree.tree_flatten((args, kwargs))
        flat = [torch.view_as_complex(x) if c else x for x, c in zip(flat, is_complex)]
        a, k = pytree.tree_unflatten(flat, flat_spec)
        out = func(*a, **k)
        return pytree.tree_map(
            lambda r: torch.view_as_real(r.resolve_conj()) if isinstance(r, torch.Tensor) and r.is_complex() else r, out
        )

    on_complex_views.__qualname__ = on_complex_views.__name__ = f"{call.name} (on complex tensors)"
    on_complex_views.__module__ = None
    args, kwargs = pytree.tree_unflatten(real_leaves, spec)
    step = Call(call.tracer, on_complex_views, args, kwargs, call.loc)
    real_out = eager_fallback(step)
    flat_out, out_spec = pytree.tree_flatten(real_out)
    flat_like = pytree.tree_leaves(result)
    made = [
        _complex_result(call, r, like) if isinstance(like, torch.Tensor) and like.dtype.is_complex else r
        for r, like in zip(flat_out, flat_like)
    ]
    return pytree.tree_unflatten(made, out_spec)
