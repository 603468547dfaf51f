"""The torch.nn.functional rules: softmax, the norms (layer, RMS, batch), the classification
losses (cross_entropy, nll_loss) and dropout. Each is
one kiln op or a composition of kiln's elementwise ops, written as eager computes it (see
_lowering.py for what a rule is); what has no exact form (batch_norm in training mode) is an
eager step (_fallback.py).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from ._lowering import _bind, _cast, _register, _same_object, _emit_clone, _torch_fns, _via
from ._tracer import Call, Proxy


def _softmax(op: str) -> Callable[[Call], Any]:
    def rule(call: Call) -> Any:
        args = _bind(call, lambda input, dim=None, _stacklevel=3, dtype=None: None)
        if args["dim"] is None:
            raise call.unsupported(f"{op} without dim (the deprecated implicit dim) is not supported by kiln; pass dim.")
        result = call.run_meta()
        return call.emit(op, [args["input"], args["dim"], args["dtype"]], {}, result)

    return rule


_register(_softmax("softmax"), *_torch_fns("softmax"), F.softmax)
_register(_softmax("log_softmax"), *_torch_fns("log_softmax"), F.log_softmax)


def _layer_norm(call: Call) -> Any:
    args = _bind(call, lambda input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True: None)
    result = call.run_meta()
    return call.emit(
        "layer_norm", [args["input"], list(args["normalized_shape"]), args["weight"], args["bias"], args["eps"]], {}, result
    )


def _rms_norm(call: Call) -> Any:
    args = _bind(call, lambda input, normalized_shape, weight=None, eps=None: None)
    result = call.run_meta()
    return call.emit("rms_norm", [args["input"], list(args["normalized_shape"]), args["weight"], args["eps"]], {}, result)


def _batch_norm(call: Call) -> Any:
    """Eval-mode batch_norm is elementwise, as eager's CPU kernel computes it: alpha = weight /
    sqrt(running_var + eps), beta = bias - running_mean * alpha, y = x * alpha + beta, in float32
    for half and bfloat16 inputs (eager's opmath). It fuses with what is around it (a ReLU, a
    residual add). Training mode writes the running statistics: an eager step (kiln._fallback)."""
    args = _bind(call, lambda input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5, cudnn_enabled=True: None)
    x, mean, var, w, b = (args[k] for k in ("input", "running_mean", "running_var", "weight", "bias"))
    tensors = [t for t in (x, mean, var, w, b) if t is not None]
    if args["training"] or not all(isinstance(t, Proxy) for t in tensors) or mean is None or var is None or x.dim() < 2:
        from ._fallback import eager_fallback

        return eager_fallback(call)
    result = call.run_meta()  # eager's checks (the statistics' length is the channel count)
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    shape = (1, x.shape[1], *([1] * (x.dim() - 2)))

    def channel(t: Proxy) -> Proxy:
        return _via(call, torch.Tensor.view, _cast(call, t, compute), shape)

    alpha = _via(call, torch.rsqrt, _via(call, torch.add, channel(var), args["eps"]))
    if w is not None:
        alpha = _via(call, torch.mul, alpha, channel(w))
    beta = _via(call, torch.neg, _via(call, torch.mul, channel(mean), alpha))
    if b is not None:
        beta = _via(call, torch.add, beta, channel(b))
    y = _via(call, torch.add, _via(call, torch.mul, _cast(call, x, compute), alpha), beta)
    return _cast(call, y, result.dtype)


def _class_losses(call: Call, *, log_probs: bool) -> Any:
    """cross_entropy and nll_loss with class-index targets, as eager's nll_loss computes them:
    loss_n = -w[t_n] * logp[n, t_n], 0 where t_n is ignore_index; summed, or divided by the
    sum of w[t_n] over the targets not ignored (NaN when all are). The log-probabilities are
    read by a gather at the target, masked to 0 where ignored: the gather's index check (in the
    region before, fuse.h) raises IndexError for any other target outside [0, C), as eager
    does, and the log-softmax, the gather and the masking fuse into one row kernel (GPT-2's
    loss over 50257 classes was an eager step whose gradient ran its forward again). The
    arithmetic is in float32 for half and bfloat16 inputs (eager's accumulate type), rounded
    once to the input's dtype. Label smoothing adds eager's smoothing term, -sum_c w_c logp_c / C
    per target. Probability targets, other target dtypes and the legacy size_average/reduce
    arguments run as an eager step."""
    from ._fallback import eager_fallback

    if log_probs:
        args = _bind(call, lambda input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean", label_smoothing=0.0: None)
    else:
        args = _bind(call, lambda input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean": None)
        args["label_smoothing"] = 0.0
    x, target, weight = args["input"], args["target"], args["weight"]
    result = call.run_meta()  # eager's checks (shapes, a weight of C elements, the reduction)
    if (
        not isinstance(x, Proxy)
        or not isinstance(target, Proxy)
        or target.dtype != torch.int64
        or not x.dtype.is_floating_point
        or (weight is not None and not isinstance(weight, Proxy))
        or args["size_average"] is not None
        or args["reduce"] is not None
        or args["reduction"] not in ("none", "mean", "sum")
        or x.dim() == 0
    ):
        return eager_fallback(call)
    class_dim = 1 if x.dim() >= 2 else 0
    n_classes = x.shape[class_dim]
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    logp = _via(call, torch.log_softmax, x, class_dim) if log_probs else x
    logp = _cast(call, logp, compute)
    kept = _via(call, torch.ne, target, args["ignore_index"])
    safe = _via(call, torch.where, kept, target, 0)
    picked = _via(call, torch.squeeze, _via(call, torch.gather, logp, class_dim, _via(call, torch.unsqueeze, safe, class_dim)), class_dim)
    # Masked with where, not multiplied by 0: an ignored target's stand-in class may be -inf.
    if weight is None:
        per_target = _cast(call, kept, compute)
        loss = _via(call, torch.where, kept, _via(call, torch.neg, picked), 0.0)
    else:
        w = _cast(call, weight, compute)
        w_target = _via(call, torch.reshape, _via(call, torch.index_select, w, 0, _via(call, torch.flatten, safe)), tuple(safe.shape))
        per_target = _via(call, torch.where, kept, w_target, 0.0)
        loss = _via(call, torch.where, kept, _via(call, torch.neg, _via(call, torch.mul, picked, w_target)), 0.0)
    reduction, smoothing = args["reduction"], float(args["label_smoothing"])
    if reduction == "sum":
        loss = _via(call, torch.sum, loss)
    elif reduction == "mean":
        total = _via(call, torch.sum, per_target)
        loss = _via(call, torch.div, _via(call, torch.sum, loss), total)
    if smoothing > 0:
        weighted = logp if weight is None else _via(call, torch.mul, logp, _via(call, torch.reshape, w, (n_classes,) + (1,) * (x.dim() - 1 - class_dim)))
        smooth = _via(call, torch.where, kept, _via(call, torch.neg, _via(call, torch.sum, weighted, class_dim)), 0.0)
        if reduction == "sum":
            smooth = _via(call, torch.sum, smooth)
        elif reduction == "mean":
            smooth = _via(call, torch.div, _via(call, torch.sum, smooth), total)
        loss = _via(call, torch.add, _via(call, torch.mul, loss, 1 - smoothing), _via(call, torch.mul, smooth, smoothing / n_classes))
    return _cast(call, loss, result.dtype)


_register(lambda call: _class_losses(call, log_probs=True), F.cross_entropy)
_register(lambda call: _class_losses(call, log_probs=False), F.nll_loss)
_register(_batch_norm, F.batch_norm)
_register(_layer_norm, F.layer_norm, torch.layer_norm)
_register(_rms_norm, getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None))


def _dropout_eval(call: Call) -> Any:
    # F.dropout(x, training=False) is the identity in eager (it returns x itself); training
    # dropout is random and not supported.
    args = _bind(call, lambda input, p=0.5, training=True, inplace=False: None)
    if args["training"] and args["p"] != 0:
        raise call.unsupported("dropout in training mode (random numbers) is not supported by kiln.")
    result = call.run_meta()
    if _same_object(call, result):
        return result
    return _emit_clone(call, args["input"])


_register(_dropout_eval, F.dropout)


def _attention(call: Call) -> Any:
    """scaled_dot_product_attention runs as an eager step (PyTorch picks its kernel by device and
    layout). A mask known while tracing to mask nothing (kiln._constants: all true, or all zero)
    is dropped, as if the caller had passed none: the same result, and on CUDA it keeps flash
    attention, which a boolean mask rules out."""
    from ._constants import no_mask
    from ._fallback import eager_fallback

    args = _bind(call, lambda query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False: None)
    mask = args["attn_mask"]
    if mask is not None and no_mask(mask):
        kwargs = {k: v for k, v in args.items() if k not in ("query", "key", "value", "attn_mask")}
        unmasked = Call(call.tracer, call.func, (args["query"], args["key"], args["value"]), kwargs, call.loc)
        with_mask, without = call.run_meta(), unmasked.run_meta()
        if tuple(with_mask.shape) == tuple(without.shape) and with_mask.dtype == without.dtype:
            call = unmasked
    return eager_fallback(call, what="scaled_dot_product_attention")


_register(_attention, F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)


def _multi_head_attention(call: Call) -> Any:
    """F.multi_head_attention_forward, which nn.MultiheadAttention calls when it does not take
    its fast path; under tracing it never takes it (its check sees the tracing mode as a torch
    function on its arguments). Where the module's own conditions for the fast path hold as far
    as this call shows them (self-attention through one in-projection with a bias, eval, an even
    number of heads, no masks, no gradient wanted), the eager step is that
    fast path, torch._native_multi_head_attention, on the batch-first view of the query: eager's
    kernel for a batch-first module (about half the slow path's time for a ViT on the CPU). The
    slow path otherwise, as one eager step. (With a mask the module's condition depends on the mask
    it was given, a boolean one or a float one, which reaches this call canonicalized to float:
    kiln takes the slow path, whose result is laid out otherwise than the fast path's.)"""
    from ._fallback import eager_fallback

    a = _bind(
        call,
        lambda query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v,
        add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=True, key_padding_mask=None,
        need_weights=True, attn_mask=None, use_separate_proj_weight=False, q_proj_weight=None, k_proj_weight=None,
        v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True, is_causal=False: None,
    )
    q, w, b = a["query"], a["in_proj_weight"], a["in_proj_bias"]
    tensors = [t for t in (q, w, b, a["out_proj_weight"], a["out_proj_bias"]) if isinstance(t, torch.Tensor)]
    fast = (
        isinstance(q, Proxy) and q is a["key"] is a["value"] and q.dim() == 3
        # (a batch-first module's transposed input: a contiguous sequence-first query is a
        # module with batch_first=False, whose eager call takes the slow path)
        and q.transpose(0, 1).is_contiguous()
        and isinstance(w, Proxy) and isinstance(b, Proxy) and q.dtype == w.dtype == b.dtype
        and not a["training"] and a["num_heads"] % 2 == 0 and not a["use_separate_proj_weight"]
        and a["bias_k"] is None and a["bias_v"] is None and not a["add_zero_attn"]
        and a["key_padding_mask"] is None and a["attn_mask"] is None
        and a["static_k"] is None and a["static_v"] is None and not a["is_causal"]
        and torch.backends.mha.get_fastpath_enabled() and not torch.is_autocast_enabled()
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        # A torch function mode under kiln's (torch.set_default_device's, say) makes the module's
        # has_torch_function check fail in eager too: it takes the slow path there.
        and not torch.overrides._get_current_function_mode_stack()
    )
    if call.tracer.register_eager is None:
        raise call.unsupported("multi_head_attention_forward runs as an eager step, which only kiln.jit can run (kiln.trace alone cannot).")
    if not fast:
        return eager_fallback(call)
    call.run_meta()  # eager's checks of the slow path's arguments
    batch_first = _via(call, torch.Tensor.transpose, q, 0, 1)
    # One query for query, key and value: on CUDA the native op takes its fused path (projection,
    # SDPA, projection) only when they are the same tensor object, and an eager step's arguments
    # are separate objects.
    native = Call(
        call.tracer,
        _native_attention if a["need_weights"] else _native_attention_output,
        (batch_first, a["embed_dim_to_check"], a["num_heads"], w, b, a["out_proj_weight"], a["out_proj_bias"], a["need_weights"], a["average_attn_weights"]),
        {},
        call.loc,
    )
    if not a["need_weights"]:
        return _via(call, torch.Tensor.transpose, eager_fallback(native), 0, 1), None
    out, weights = eager_fallback(native)
    return _via(call, torch.Tensor.transpose, out, 0, 1), weights


def _native_attention(x: torch.Tensor, embed_dim: int, heads: int, *weights_and_flags: Any) -> tuple[torch.Tensor, torch.Tensor]:
    w, b, out_w, out_b, need_weights, average = weights_and_flags
    return torch._native_multi_head_attention(x, x, x, embed_dim, heads, w, b, out_w, out_b, None, need_weights, average, None)


def _native_attention_output(*args: Any) -> torch.Tensor:
    # Without weights its second result is a tensor on meta tensors and undefined on a device.
    return _native_attention(*args)[0]


_native_attention.__qualname__ = _native_attention_output.__qualname__ = "torch._native_multi_head_attention"
_register(_multi_head_attention, F.multi_head_attention_forward)


# ---- convolutions and pooling ------------------------------------------------------------------

_CHANNELS_LAST_CONVOLUTIONS = os.environ.get("KILN_CHANNELS_LAST_CONVOLUTIONS") != "0"


def channels_last_convolution(x: Proxy, w: Proxy | None) -> bool:
    """Whether kiln hands a convolution (w its weight) or a pooling (w None) of a row-major (NCHW)
    input that input channels-last. cuDNN computes 16-bit 2-d convolutions on Hopper in NHWC and
    transposes NCHW activations in and out of each (2.2 of ResNet-50's 10.8 ms at batch 128 on an
    H100, bench/NOTES.md), and PyTorch's CUDA pooling has NHWC kernels: kiln lays the activations
    between such steps out channels-last instead (place_layouts.h), with a copy only where one
    comes from the caller. Tests replace this to check the mechanism on the CPU;
    KILN_CHANNELS_LAST_CONVOLUTIONS=0 turns it off (for side-by-side comparisons)."""
    return (
        _CHANNELS_LAST_CONVOLUTIONS
        and x.device.type == "cuda" and x.dtype in (torch.float16, torch.bfloat16) and x.dim() == 4 and x.is_contiguous()
        and (w is None or (w.dim() == 4 and w.is_contiguous()))
    )


def _channels_last_input(call: Call) -> Any:
    """A 2-d convolution or pooling runs as an eager step (PyTorch picks its kernel). Where
    channels_last_convolution says so, on its input made channels-last: the copy is in the trace,
    so the region that computes the input stores it channels-last (a copy only where none does),
    and each result is made row-major again for what reads it, as eager's is (that copy fuses into
    the readers: they read the channels-last result through its strides)."""
    from ._fallback import eager_fallback

    args, kwargs = list(call.args), dict(call.kwargs)
    x = args[0] if args else kwargs.get("input")
    w = (args[1] if len(args) > 1 else kwargs.get("weight")) if call.func is F.conv2d else None
    if not isinstance(x, Proxy) or (call.func is F.conv2d and not isinstance(w, Proxy)) or not channels_last_convolution(x, w):
        return eager_fallback(call)
    eager = call.run_meta()  # eager's checks, and its results' layouts
    x_last = _cast(call, x, None, memory_format=torch.channels_last)
    if args:
        args[0] = x_last
    else:
        kwargs["input"] = x_last
    made = eager_fallback(Call(call.tracer, call.func, tuple(args), kwargs, call.loc))
    flat, spec = pytree.tree_flatten(made)
    want = pytree.tree_leaves(eager)
    flat = [
        _emit_clone(call, y, torch.contiguous_format) if isinstance(y, Proxy) and y.stride() != e.stride() else y
        for y, e in zip(flat, want)
    ]
    return pytree.tree_unflatten(flat, spec)


_register(_channels_last_input, F.conv2d, F.avg_pool2d, F.adaptive_avg_pool2d)


_FUSED_MAX_POOLS = os.environ.get("KILN_FUSED_MAX_POOLS") != "0"
# The most elements a window may have (one maximum each): ResNet's 3 x 3 is what was measured
# (bench/NOTES.md, session 35); a larger window's many loads per output are not.
_MAX_POOL_WINDOW = 9


def max_pool_as_maximum(x: Proxy, window: int) -> bool:
    """Whether kiln computes a 2-d max pool itself, as the maximum of the window's strided views
    of its input (_max_pool2d), instead of as an eager step. On CUDA: the pool then fuses with
    what computes its input (a ResNet stem's batch norm and ReLU: eager's NHWC max pool alone took
    0.43 ms at batch 128 on an H100, 4.6x Triton's fused kernel), and its result is stored as its
    reader wants it (place_layouts); windows of at most _MAX_POOL_WINDOW elements (one maximum
    each). The CPU's pool kernels stay. Tests replace this to check the mechanism on the CPU;
    KILN_FUSED_MAX_POOLS=0 turns it off."""
    return _FUSED_MAX_POOLS and x.device.type == "cuda" and window <= _MAX_POOL_WINDOW


def _gradient_may_flow(call: Call) -> bool:
    """Whether kiln may differentiate through this call: grad mode is on and an input of the
    trace so far requires grad. (A proxy computed inside the trace does not say whether it
    requires grad; an input traced later cannot reach this call's arguments.)"""
    return torch.is_grad_enabled() and any(t.requires_grad for t in call.tracer.input_tensors)


def _max_pool2d(call: Call) -> Any:
    """F.max_pool2d without indices, where max_pool_as_maximum says so: the input padded with
    -inf (kiln's constant pad, a slice_scatter that fuses with the producer), and the maximum,
    in the window's order, of its views at each window offset, strided by the pool's stride:
        out[..., i, j] = max over (a, b) of padded[..., i * sh + a * dh, j * sw + b * dw]
    eager's output size (ceil_mode included: a last window that starts in the input or its
    left padding) comes from its meta run, and the right padding reaches that window's end.
    NaN propagates, as in eager's pool. Not where a gradient flows (a maximum's gradient shares a
    tie between its operands, the pool's goes to the window's first maximum), for indices, or
    for other than floating 3-d or 4-d inputs: there an eager step (with a channels-last input
    where channels_last_convolution says so)."""
    args = _bind(call, lambda input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False: None)
    x = args["input"]

    def pair(v: Any) -> tuple[int, int]:
        v = [v] if isinstance(v, int) else list(v)
        return (int(v[0]), int(v[-1])) if len(v) in (1, 2) else (-1, -1)

    (kh, kw), (ph, pw), (dh, dw) = pair(args["kernel_size"]), pair(args["padding"]), pair(args["dilation"])
    (sh, sw) = pair(args["stride"]) if args["stride"] not in (None, []) else (kh, kw)
    if (
        args["return_indices"] or not isinstance(x, Proxy) or not x.dtype.is_floating_point or x.dim() not in (3, 4)
        or _gradient_may_flow(call) or min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0
        or not max_pool_as_maximum(x, kh * kw)
    ):
        return _channels_last_input(call)
    eager = call.run_meta()  # eager's checks and output size
    if eager.numel() == 0 or not eager.is_contiguous():
        return _channels_last_input(call)
    oh, ow = eager.shape[-2], eager.shape[-1]
    h, w = x.shape[-2], x.shape[-1]
    right_h = max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - h - ph)
    right_w = max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - w - pw)
    padded = _via(call, F.pad, x, [pw, right_w, ph, right_h], "constant", float("-inf")) if ph or pw or right_h or right_w else x
    lead = (slice(None),) * (x.dim() - 2)
    out = None
    for a in range(kh):
        for b in range(kw):
            key = lead + (slice(a * dh, a * dh + (oh - 1) * sh + 1, sh), slice(b * dw, b * dw + (ow - 1) * sw + 1, sw))
            view = _via(call, torch.Tensor.__getitem__, padded, key)
            out = view if out is None else _via(call, torch.maximum, out, view)
    # (A window of one element: the pool is a strided copy, never a view of its input.)
    return _emit_clone(call, out, torch.contiguous_format) if kh * kw == 1 else out


_register(_max_pool2d, F.max_pool2d)
