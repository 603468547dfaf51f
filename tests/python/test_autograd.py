"""kiln's autograd (kiln._autograd, src/kiln/passes/differentiate.cpp) against eager PyTorch:
gradients of a random weighting of every output with respect to every input that requires grad,
`.grad` accumulation, in-place ops on views of intermediates, the refusals (which run eagerly and
say why), retain_graph and its errors (training a model: test_autograd_training.py).

A program kiln differentiates runs as one autograd node (`CompiledFunctionBackward`); one it
refuses runs eagerly, so its gradients are eager's by construction: the tests that matter check
that the node is kiln's.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

import kiln
from gradient_check import check_gradients, is_kiln_node, leaves, tensors_of

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


# ---- elementwise ------------------------------------------------------------------------------

UNARY = {
    "abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1,
    "sin": torch.sin, "cos": torch.cos, "tan": lambda x: torch.tan(x * 0.5), "tanh": torch.tanh,
    "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "erf": torch.erf,
    "square": torch.square, "floor": torch.floor, "round": torch.round, "sign": torch.sign,
    "log": lambda x: torch.log(x.abs() + 0.5), "log1p": lambda x: torch.log1p(x.abs()),
    "log2": lambda x: torch.log2(x.abs() + 0.5), "sqrt": lambda x: torch.sqrt(x.abs() + 0.1),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1), "reciprocal": lambda x: torch.reciprocal(x.abs() + 0.5),
    "asin": lambda x: torch.asin(x * 0.4), "acos": lambda x: torch.acos(x * 0.4),
    "float_to_half_and_back": lambda x: x.half().float() * 2,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
    op = UNARY[name]
    check_gradients(lambda x: op(x) * 3, leaves((4, 5)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["tanh", "sigmoid", "gelu", "gelu_tanh", "silu"])
def test_a_half_gradient_rounds_once_where_eagers_backward_kernel_does(name, dtype):
    # Eager's tanh_backward, sigmoid_backward, gelu_backward and silu_backward compute in float
    # and round once: kiln's gradient is theirs to within one unit in the last place (with each
    # op of the formula rounded, half the elements differed, silu's bfloat16 ones by up to 0.03).
    op = UNARY[name]
    x = (torch.linspace(-6, 6, 2048) + 0.01).to(dtype)
    g = torch.linspace(-3, 2, 2048).to(dtype).flip(0)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    op(a).backward(g)
    kiln.jit(lambda t: op(t) * 1)(b).backward(g)
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(b.grad.float(), a.grad.float(), rtol=ulp, atol=1e-5)


BINARY = {
    "add": lambda a, b: a + b, "add_alpha": lambda a, b: torch.add(a, b, alpha=-2.5), "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b, "div": lambda a, b: a / (b.abs() + 0.5), "pow": lambda a, b: (a.abs() + 0.5) ** b,
    "pow_scalar": lambda a, b: a**3 + b**2, "maximum": torch.maximum, "minimum": torch.minimum,
    "atan2": torch.atan2, "fmod": lambda a, b: torch.fmod(a, b.abs() + 0.5),
    "remainder": lambda a, b: torch.remainder(a, b.abs() + 0.5), "div_floor": lambda a, b: torch.div(a, b.abs() + 0.5, rounding_mode="floor") + a,
    "where": lambda a, b: torch.where(a > b, a * 2, b), "clamp": lambda a, b: a.clamp(-0.5, 0.7) + b,
    "clamp_tensor": lambda a, b: torch.clamp(a, min=b), "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5), "addcdiv": lambda a, b: torch.addcdiv(a, a, b.abs() + 1, value=2),
    "mixed_dtype": lambda a, b: a.double() * b,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_with_broadcasting(name):
    op = BINARY[name]
    check_gradients(lambda a, b: op(a, b), leaves((3, 4), (4,)))


def test_tie_in_maximum_splits_the_gradient_as_eager():
    check_gradients(lambda a, b: torch.maximum(a, b), lambda: [torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)])


def test_an_input_that_does_not_require_grad_gets_none_and_a_constant_result_none():
    def make():
        return [torch.randn(3, requires_grad=True, generator=torch.Generator(device=torch.empty(0).device).manual_seed(0)), torch.ones(3)]

    check_gradients(lambda x, y: (x * y, y * 2, (x > 0)), make)


def test_unused_input_gets_no_gradient():
    check_gradients(lambda x, y: x.exp(), leaves((3,), (3,)))


# ---- reductions, views, joins, index ops --------------------------------------------------------

STRUCTURAL = {
    "sum": (lambda x: x.sum(), [(3, 4)]),
    "sum_dims_keepdim": (lambda x: x.sum((0, 2), keepdim=True), [(2, 3, 4)]),
    "mean": (lambda x: x.mean(-1), [(3, 4)]),
    "amax": (lambda x: x.amax(1), [(3, 4)]),
    "amin_ties": (lambda x: x.round().amin(), [(3, 4)]),
    "max_dim_values": (lambda x: x.max(dim=1).values, [(3, 4)]),
    "var": (lambda x: x.var(1), [(3, 4)]),
    "std_unbiased0": (lambda x: x.std(0, correction=0), [(3, 4)]),
    "softmax": (lambda x: x.softmax(-1), [(3, 5)]),
    "log_softmax": (lambda x: F.log_softmax(x, dim=0), [(3, 5)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (5,), w, b), [(3, 5), (5,), (5,)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (5,), w, eps=1e-6), [(3, 5), (5,)]),
    "permute_reshape": (lambda x: x.permute(2, 0, 1).reshape(4, 6) * 2, [(2, 3, 4)]),
    "transpose_t": (lambda x: x.transpose(0, 1).t() + x, [(3, 4)]),
    "expand": (lambda x: x.expand(3, 4, 5) * 1.5, [(4, 1)]),
    "slice_select": (lambda x: x[1:, ::2] * x[0, 1], [(3, 5)]),
    "narrow_diagonal": (lambda x: x.narrow(1, -3, 2) * x.diagonal(1).sum(), [(4, 4)]),
    "squeeze_unsqueeze_flatten": (lambda x: x.unsqueeze(1).squeeze(0).flatten() * 3, [(1, 3, 2)]),
    "split_chunk_unbind": (lambda x: (x.split([1, 3], 1)[1] * 2, x.chunk(2, 0)[0] + 1, x.unbind(0)[2].exp()), [(4, 4)]),
    "constant_pad_and_crop": (lambda x: (F.pad(x, (1, -2, 2, 0), value=0.5) * 2, F.pad(x.exp(), (-1, 1))), [(3, 5)]),
    "cat_stack": (lambda a, b: (torch.cat([a, b * 2], 0), torch.stack([a, b], 1)), [(2, 3), (2, 3)]),
    "matmul_2d": (lambda a, b: a @ b, [(3, 4), (4, 5)]),
    "matmul_batched_by_matrix": (lambda a, b: a @ b, [(2, 3, 4), (4, 5)]),
    "matmul_broadcast_batches": (lambda a, b: a @ b, [(2, 1, 3, 4), (3, 4, 2)]),
    "matmul_vectors": (lambda a, b, c: (a @ b, b @ c, a @ c.t()), [(4,), (4, 3), (3, 4)]),
    "bmm": (lambda a, b: torch.bmm(a, b), [(2, 3, 4), (2, 4, 5)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [(2, 3, 4), (5, 4), (5,)]),
    "linear_vector_input": (lambda x, w: F.linear(x, w), [(4,), (5, 4)]),
}


@pytest.mark.parametrize("name", sorted(STRUCTURAL))
def test_structural(name):
    fn, shapes = STRUCTURAL[name]
    check_gradients(fn, leaves(*shapes), rtol=1e-4, atol=1e-5)


def _index_args(*float_shapes):
    def make():
        floats = leaves(*float_shapes)()
        return floats + [torch.tensor([2, 0, 2], device=floats[0].device)]

    return make


def test_index_select_and_embedding():
    check_gradients(lambda x, i: (x.index_select(0, i) * 2, F.embedding(i, x)), _index_args((4, 3)))


def test_an_embeddings_gradient_needs_no_index_check_its_forward_made():
    # 40 positions: the gradient's index_add runs as PyTorch's op (a kernel scans at most 16 per
    # element). Its index, the saved token ids, is an input of the backward program that the
    # forward checked against the same 50 rows (the forward raises on an id out of range before
    # it returns): the backward declares it in range and reads nothing back to the host (on
    # CUDA a synchronization). The positions arange is computed again in the backward (not
    # saved), known in range.
    def f(w, t):
        pos = torch.arange(t.shape[1], device=t.device)
        return (F.embedding(t, w) + F.embedding(pos, w)).square().sum(-1)

    def make():
        return [leaves((50, 8))()[0], (torch.arange(40) * 7 % 50).reshape(2, 20).to(torch.get_default_device())]

    jitted = check_gradients(f, make)
    stats = kiln.last_stats(jitted)
    assert stats["index_checks_first"] + stats["index_checks_at_steps"] == 1
    backward = stats["backward"]
    assert backward["torch_steps"] == 1
    assert backward["index_checks_first"] == 0 and backward["index_checks_at_steps"] == 0


def test_a_losss_masked_labels_are_saved_checked_not_computed_again():
    # The loss's index is where(labels != -100, labels, 0), which the forward checks: the
    # backward reads it saved, declared in range, instead of masking the saved labels again
    # and checking them (on CUDA a synchronization at the start of every backward).
    def f(logits, labels):
        return F.cross_entropy(logits, labels)

    def make():
        return [leaves((6, 5))()[0], torch.tensor([3, -100, 0, 4, -100, 1], device=torch.empty(0).device)]

    jitted = check_gradients(f, make)
    backward = kiln.last_stats(jitted)["backward"]
    assert backward["index_checks_first"] == 0 and backward["index_checks_at_steps"] == 0


def test_token_ids_changed_in_place_after_the_forward_fail_the_backward_as_in_eager():
    # The backward's unchecked index rests on the saved ids being the ones the forward checked:
    # PyTorch's saved-tensor version check raises when they were written in between, before
    # the backward program runs (kiln saves them with save_for_backward).
    w = torch.randn(50, 8, requires_grad=True)
    ids = torch.arange(20).reshape(2, 10) * 2
    loss = kiln.jit(lambda w, t: F.embedding(t, w).square().sum())(w, ids)
    ids.add_(1000)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    assert w.grad is None


def test_gather():
    def f(x, i):
        return x.gather(0, i.view(3, 1).expand(3, 2)) * 2

    check_gradients(f, _index_args((4, 2)))


def test_index_copy_add_and_scatter():
    def make():
        x, src = leaves((4, 3), (3, 3))()
        return [x, src, torch.tensor([1, 0, 3], device=x.device)]

    check_gradients(lambda x, src, i: (x.index_copy(0, i, src), x.index_add(0, i, src, alpha=0.5)), make)
    check_gradients(lambda x, src, i: x.scatter(0, i.view(3, 1).expand(3, 3), src) * 1, make)
    check_gradients(lambda x, src, i: x.scatter_add(0, i.view(3, 1).expand(3, 3), src), make)


def test_masked_fill_and_index_put():
    def f(x, v, i):
        y = x.masked_fill(x > 0.5, -1.0)
        z = x.clone()
        z[i] = v
        return y * 2, z

    def make():
        x, v = leaves((4, 3), (3,))()
        return [x, v, torch.tensor([0, 2], device=x.device)]

    check_gradients(f, make)


# ---- in-place ops ---------------------------------------------------------------------------------


def test_in_place_on_a_view_of_an_intermediate():
    # Research case H1: Thunder gets this gradient wrong.
    def f(x):
        y = x * 2
        y[:, 0].mul_(3)
        return y.sum()

    check_gradients(f, leaves((3, 4)))


def test_in_place_chains_on_intermediates():
    def f(x, w):
        y = x.clone()
        y.mul_(2)
        y[1:].add_(w)
        y.neg_()
        t = y.t()
        t[0].sub_(1)
        return y * 1, t.exp()

    check_gradients(f, leaves((3, 4), (4,)))


@pytest.mark.xfail(strict=True, reason="kiln does not yet replay eager's saved-tensor version check: it differentiates the program as written")
def test_in_place_on_an_output_whose_op_needs_its_input():
    def f(x):
        y = x.exp()
        z = y * x
        y.add_(1)  # exp's backward needs y's value before this write
        return z, y

    check_gradients(f, leaves((5,)))


def test_out_argument():
    def f(x, y):
        buf = torch.empty_like(x)
        torch.mul(x, y, out=buf)
        return buf.sin()

    # Eager refuses out= when an argument requires grad; so does kiln, through eager.
    check_gradients(f, leaves((3,), (3,), requires_grad=False), differentiated=False)
    with pytest.raises(RuntimeError, match="out=... arguments don't support automatic differentiation"):
        kiln.jit(f)(*leaves((3,), (3,))())


# ---- what kiln refuses runs eagerly, and says why --------------------------------------------------


def _refused(fn, make_args):
    with pytest.warns(UserWarning, match="runs .* eagerly"):
        check_gradients(fn, make_args, differentiated=False)


def test_no_grad_inside_the_function_runs_eagerly():
    def f(x):
        with torch.no_grad():
            s = x.sum()
        return x * s

    _refused(f, leaves((3,)))


def test_a_write_into_an_argument_that_requires_grad_runs_eagerly():
    def f(x, buf):
        buf.copy_(x * 2)  # eager puts buf into the graph
        return buf.sum()

    def make():
        return [torch.ones(3, requires_grad=True), torch.zeros(3)]

    _refused(f, make)


def test_a_result_that_is_a_view_of_an_argument_runs_eagerly():
    _refused(lambda x: (x[1:], x * 2), leaves((3,)))


def test_a_random_eager_step_runs_eagerly():
    # Its gradient would need the same draws again. Probabilities of 1 so that both calls draw
    # the same values.
    def f(x):
        return x * torch.bernoulli(x * 0 + 1)

    _refused(f, leaves((4,)))


# ---- eager steps: PyTorch's own gradient, as a step of the backward ---------------------------------


def test_an_eager_step_is_differentiated_by_pytorch():
    check_gradients(lambda x, w: torch.cumsum(x * w, 0).sin() + torch.cumprod(w, 0), leaves((4, 3), (3,)))


def test_conv_and_batch_norm_in_training_mode():
    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))

    model, reference = make_model(), make_model()
    jitted = kiln.jit(model)
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator(device=torch.empty(0).device).manual_seed(3), device=torch.empty(0).device)
    out, ref_out = jitted(x), reference(x)
    assert is_kiln_node(out)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
    out.square().mean().backward()
    ref_out.square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    for (name, b), c in zip(model.named_buffers(), reference.buffers()):
        torch.testing.assert_close(b, c, msg=lambda m: f"buffer {name}: {m}")


def test_a_non_contiguous_argument_and_one_passed_twice():
    # Each is a view of a synthetic base (alias_pattern.h): its gradient is the base's, viewed.
    def make():
        x, w = leaves((4, 3), (3, 3))()
        return [x, w]

    check_gradients(lambda x, w: (x.t() * 2, w @ w), make)
    f = kiln.jit(lambda a, b, c: a * b + c)
    x, y = leaves((3, 4), (4, 3))()
    out = f(x, x, y.t())
    assert is_kiln_node(out)
    out.sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
    torch.testing.assert_close(y.grad, torch.ones(4, 3))


def test_arguments_sharing_memory_run_eagerly():
    # Two different views of one leaf's storage would merge their gradients in one base.
    def make():
        b = torch.arange(8.0).requires_grad_()
        return [b[:4], b[2:6]]

    _refused(lambda x, y: x * y, make)


def test_results_that_are_the_callers_tensors_keep_their_identity():
    # They need no gradient (one that would is refused), so they pass around kiln's node: the
    # caller's own object, and a view of the caller's memory, as in eager.
    f = kiln.jit(lambda x, y: (x * 2, y, y.add_(1), y[1:]))
    x, y = torch.ones(3, requires_grad=True), torch.zeros(3)
    a, b, c, d = f(x, y)
    assert is_kiln_node(a) and b is y and c is y
    assert d.untyped_storage().data_ptr() == y.untyped_storage().data_ptr() and d.storage_offset() == 1
    a.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    torch.testing.assert_close(y, torch.ones(3))


def test_a_gradient_that_views_a_product_is_a_view_step():
    # w's gradient is the transpose of the product x^T g: a step that only views that product's
    # result, made without a kernel or a PyTorch op, with eager's values.
    jitted = check_gradients(lambda x, w: (x @ w.t()).tanh().sum(), leaves((8, 64), (32, 64)), rtol=1e-4, atol=1e-5)
    backward = kiln.last_stats(jitted)["backward"]
    assert backward["view_steps"] >= 1 and backward["interpreted_steps"] == 0, backward


def test_detach_inside_the_function():
    check_gradients(lambda x: x * x.detach(), leaves((3,)))


# ---- PyTorch's engine around the node ---------------------------------------------------------------


def test_second_backward_without_retain_graph_raises_as_eager():
    f = kiln.jit(lambda x: (x.exp() * 2).sum())
    x = torch.ones(3, requires_grad=True)
    y = f(x)
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_higher_order_gradients_raise_unsupported():
    f = kiln.jit(lambda x: (x.exp() * 2).sum())
    x = torch.ones(3, requires_grad=True)
    (g,) = torch.autograd.grad(f(x), [x], create_graph=False)
    torch.testing.assert_close(g, 2 * x.detach().exp())
    with pytest.raises(kiln.UnsupportedError, match="higher-order"):
        torch.autograd.grad(f(x), [x], create_graph=True)


def test_modifying_a_saved_input_after_the_call_raises_as_eager():
    f = kiln.jit(lambda x, w: (x * w).sum())
    w = torch.ones(3, requires_grad=True)
    x = torch.ones(3)
    y = f(x, w)
    x.add_(1)  # mul's backward needs x as it was
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_a_kiln_write_bumps_the_version_eager_checks():
    write = kiln.jit(lambda x: x.mul_(2))
    f = kiln.jit(lambda x, w: (x * w).sum())
    w = torch.ones(3, requires_grad=True)
    x = torch.ones(3)
    y = f(x, w)
    write(x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_no_grad_calls_keep_running_the_plain_program():
    f = kiln.jit(lambda x: x * 2)
    x = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        y = f(x)
    assert not y.requires_grad
    z = f(x)
    assert z.requires_grad and is_kiln_node(z)


def test_the_gradient_program_is_cached_per_key():
    f = kiln.jit(lambda x: (x.sin() * 2).sum())
    for _ in range(3):
        x = torch.randn(4, requires_grad=True)
        f(x).backward()
        torch.testing.assert_close(x.grad, 2 * x.detach().cos())
    assert f._grad_cache.misses == 1


# ---- the CASES.md programs ---------------------------------------------------------------------------


def _case_ids():
    from test_cases import CASE_IDS

    return CASE_IDS


def _cases():
    from test_cases import CASES

    return CASES


@pytest.mark.parametrize("case", _cases(), ids=_case_ids())
def test_case_gradients(case):
    """Every CASES.md program with its float tensors made from leaves that require grad (each
    argument `leaf * 1`, so that in-place ops on it are legal in eager, as on any intermediate):
    outputs and gradients against eager's. A program eager cannot differentiate (its backward
    raises for an overwritten saved value) is skipped, as kiln does not yet replay that check."""
    template = case.make_args()
    flat, spec = pytree.tree_flatten(template)
    floating = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.dtype.is_floating_point]
    if not floating:
        pytest.skip("no float tensor arguments")

    def g(*leaves_):
        args = list(flat)
        for i, leaf in zip(floating, leaves_):
            args[i] = leaf * 1
        return case.fn(*pytree.tree_unflatten(args, spec))

    def make():
        return [flat[i].detach().clone().requires_grad_() for i in floating]

    try:
        probe = make()
        tensors = [t for t in tensors_of(g(*probe)) if t.requires_grad]
        if tensors:
            torch.autograd.grad(sum(t.sum() for t in tensors), probe, allow_unused=True)
    except RuntimeError as e:
        if "modified by an inplace operation" in str(e):
            pytest.skip("eager's backward refuses this program")
        raise
    check_gradients(g, make, differentiated=None, rtol=1e-4, atol=1e-5)


# ---- random programs ------------------------------------------------------------------------------


def test_random_programs_gradients(monkeypatch):
    """The random programs of test_random_programs.py (in-place ops on views of intermediates,
    aliased intermediates, setitem, eager steps) as functions of leaves that require grad:
    outputs and the gradients of a random weighting of them against eager's. A program whose
    eager backward raises (an in-place op overwrote a value its backward needs) is left out, as
    kiln does not yet replay that check; most programs must be kiln's own nodes, not refusals.
    KILN_GRADIENT_PROGRAMS of them (default 1000). On the CPU the reference interpreter runs
    their steps (compiling two thousand programs' kernels would take CI a quarter of an hour;
    test_jit.py's random programs check the kernels, and KILN_GRADIENT_KERNELS=1 compiles
    these too); on CUDA the kernels run."""
    import os

    from test_random_programs import _compile, gradient_program

    if torch.empty(0).device.type == "cpu" and os.environ.get("KILN_GRADIENT_KERNELS") != "1":
        monkeypatch.setenv("KILN_CPU_KERNELS", "0")

    count = int(os.environ.get("KILN_GRADIENT_PROGRAMS", "1000"))
    start = int(os.environ.get("KILN_RANDOM_SEED_START", "0"))
    failures, differentiated, compared = [], 0, 0
    for seed in range(start, start + count):
        source, make_leaves = gradient_program(seed)
        fn = _compile(source, seed, "g")
        leaves_, eager_leaves = make_leaves(), make_leaves()
        want = fn(*eager_leaves)
        want_t = [w for w in tensors_of(want) if w.requires_grad]
        gen = torch.Generator().manual_seed(seed)
        weights = [torch.randn(w.shape, generator=gen, device="cpu").to(w.device) for w in want_t]
        try:
            eager_grads = torch.autograd.grad(sum((w * k).sum() for w, k in zip(want_t, weights)), eager_leaves, allow_unused=True) if want_t else None
        except RuntimeError as e:
            if "modified by an inplace operation" not in str(e):
                raise
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = kiln.jit(fn)(*leaves_)
            differentiated += is_kiln_node(got) or not want_t
            got_t = [g for g in tensors_of(got) if g.requires_grad]
            assert len(got_t) == len(want_t), "outputs that require grad"
            for i, (g, w) in enumerate(zip(got_t, want_t)):
                torch.testing.assert_close(g, w, msg=lambda m: f"output {i}: {m}")
            if want_t:
                grads = torch.autograd.grad(sum((g * k).sum() for g, k in zip(got_t, weights)), leaves_, allow_unused=True)
                for i, (g, w) in enumerate(zip(grads, eager_grads)):
                    assert (g is None) == (w is None), f"gradient of leaf {i}: {g} vs {w}"
                    if w is not None:
                        torch.testing.assert_close(g, w, msg=lambda m: f"gradient of leaf {i}: {m}")
            compared += 1
        except Exception as e:  # noqa: BLE001 (a crash or an error is a failure too)
            first = (str(e).splitlines() or [""])[0]
            failures.append(f"--- seed {seed}:\n{source}{type(e).__name__}: {first}")
    assert not failures, f"{len(failures)} of {count} programs differ from eager:\n" + "\n".join(failures[:5])
    assert compared >= count // 2, f"only {compared} of {count} programs compared"
    assert differentiated >= 0.8 * compared, f"kiln differentiated {differentiated} of {compared} programs itself"
