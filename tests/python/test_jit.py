"""kiln.jit against eager PyTorch on the CPU: the CASES.md programs (through kiln._C, the C++
extension), comparing outputs, every input and every storage behind an input afterwards, the
identity of outputs (the caller's own object, a view of the caller's tensor, or fresh), and the
cache's hits and misses. Skipped when the extension is not built (see conftest.py).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import kiln
from against_eager import check_against_eager, same_storage, tensors, whole_storage
from test_cases import CASE_IDS, CASES, ar, s1, s2

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_case_against_eager(case):
    jitted = check_against_eager(case.fn, case.make_args)
    stats = kiln.last_stats(jitted)
    if case.one_region:
        assert stats["fusion_regions"] == 1
    assert stats["cache_misses"] == 1 and stats["cache_hits"] == 0
    assert stats["compile_seconds"] > 0 and stats["first_run_seconds"] > 0


def _scaled(args, factor: float):
    """args with every floating storage scaled by factor (each storage once: two arguments may
    be views of one)."""
    seen = set()
    for t in tensors(args):
        storage = whole_storage(t)
        if t.is_floating_point() and storage.numel() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            storage.mul_(factor)
    return args


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_case_called_again_with_other_tensors(case):
    """Calls that hit the cache run on their own tensors: kiln keeps a program's arguments from
    one call to the next (module.cpp's ArgumentPool) and points them at the new call's memory.
    Each call's arguments hold other values, and the earlier calls' tensors, kept alive, must not
    change."""
    jitted = kiln.jit(case.fn)
    earlier = []
    for call in range(3):
        made = []

        def make(call=call, made=made):
            args = _scaled(case.make_args(), 0.75**call)
            made.append(args)
            return args

        check_against_eager(case.fn, make, jitted=jitted)
        for k, (args, storages) in enumerate(earlier):
            for t, before in zip(tensors(args), storages):
                torch.testing.assert_close(whole_storage(t), before, equal_nan=True, msg=lambda m: f"call {k}'s tensors: {m}")
        earlier.append((made[0], [whole_storage(t).clone() for t in tensors(made[0])]))
    stats = kiln.last_stats(jitted)
    assert (stats["cache_misses"], stats["cache_hits"]) == (1, 2)


def test_seeds_by_hand():
    """S1 and S2 spelled out: the values eager gives, the mutated input, one region, traces."""
    a = ar(5, 5)
    a0 = a.clone()
    f = kiln.jit(s1)
    out = f(a)
    torch.testing.assert_close(a, torch.tanh(a0))
    torch.testing.assert_close(out, torch.tanh(a0) ** 4)
    assert out is not a and not same_storage(out, a)
    assert kiln.last_stats(f)["fusion_regions"] == 1
    traces = kiln.last_traces(f)
    assert traces[0].startswith("# Constructed by trace") and len(traces) > 2
    assert all(t.startswith("# Constructed by ") for t in traces)

    x = ar(5, 5)
    x0 = x.clone()
    g = kiln.jit(s2)
    out = g(x)
    torch.testing.assert_close(x, torch.sin(torch.exp(x0)))
    torch.testing.assert_close(out, torch.cos(torch.sin(torch.exp(x0))))
    assert kiln.last_stats(g)["fusion_regions"] == 1


def test_returned_input_is_the_callers_object():
    def f(x):
        x.add_(1).sin_().mul_(5)
        return x

    x = ar(3)
    assert kiln.jit(f)(x) is x


def test_view_output_is_a_view_of_the_callers_tensor():
    def f(x):
        y = x.view(8)
        x.add_(1)
        return y

    x = ar(4, 2)
    y = kiln.jit(f)(x)
    assert y._base is x or y._base is x._base or same_storage(y, x)
    x.add_(1)  # a later write through x is seen through y
    torch.testing.assert_close(y, x.view(8))


def test_a_view_of_an_arguments_old_contents_survives_its_writeback():
    # t is a's old contents (functionalized to a itself) and the results view it, while a is
    # written: they keep the old contents, as eager's do. (Through the Python front end the
    # results are views in the program's interface; the executor's steps that only view such a
    # tensor are checked by Differential.ProgramsFreshSeedsFound.)
    def f(a):
        t = torch.empty_like(a)
        t.copy_(a)
        a.fill_(a.amin())
        return t[0, 1:, :1], t[1].t()

    for dtype in (torch.bool, torch.float32):
        x = torch.tensor([[[0, 1, 0], [1, 1, 0]], [[1, 0, 0], [1, 1, 1]]]).to(dtype)
        y = x.clone()
        jitted = kiln.jit(f)
        got, want = jitted(x), f(y)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        torch.testing.assert_close(x, y)


def test_metadata_mutation_reaches_the_caller():
    def f(x):
        x.transpose_(1, 0)
        x[0].add_(1)
        return x

    x = ar(4, 2)
    x0 = x.clone()
    assert kiln.jit(f)(x) is x
    assert x.shape == (2, 4) and x.stride() == (1, 2)
    torch.testing.assert_close(x[0], x0[:, 0] + 1)


def test_same_tensor_twice_and_two_distinct_use_different_programs():
    def f(a, b):
        return a.exp_() + b.tanh_(), a

    jitted = kiln.jit(f)
    x = ar(4, 4)
    x0 = x.clone()
    out, same = jitted(x, x)
    assert same is x
    torch.testing.assert_close(x, torch.tanh(torch.exp(x0)))
    torch.testing.assert_close(out, 2 * torch.tanh(torch.exp(x0)))
    a, b = ar(4, 4), ar(4, 4)
    out, same = jitted(a, b)
    assert same is a
    torch.testing.assert_close(a, torch.exp(x0))
    torch.testing.assert_close(b, torch.tanh(x0))
    torch.testing.assert_close(out, torch.exp(x0) + torch.tanh(x0))
    stats = kiln.last_stats(jitted)
    assert (stats["cache_hits"], stats["cache_misses"]) == (0, 2)


def test_two_slices_of_one_buffer():
    def f(a, b):
        a.mul_(3)
        b.mul_(2)
        return a + b

    buf = ar(4, 4)
    buf0 = buf.clone()
    out = kiln.jit(f)(buf[0:2], buf[2:4])
    torch.testing.assert_close(buf[0:2], buf0[0:2] * 3)
    torch.testing.assert_close(buf[2:4], buf0[2:4] * 2)
    torch.testing.assert_close(out, buf0[0:2] * 3 + buf0[2:4] * 2)


def test_cache_hits_and_misses():
    def f(a, b):
        a.add_(b)
        return a * 2

    jitted = kiln.jit(f)

    def calls():
        s = kiln.last_stats(jitted)
        return s["cache_hits"], s["cache_misses"]

    for _ in range(3):
        a, b = ar(3, 4), ar(3, 4)
        torch.testing.assert_close(jitted(a, b), (ar(3, 4) * 2) * 2)
    assert calls() == (2, 1)
    jitted(ar(4, 3), ar(4, 3))  # new shape
    assert calls() == (2, 2)
    jitted(ar(4, 3).t(), ar(3, 4))  # new strides
    assert calls() == (2, 3)
    x = ar(3, 4)
    jitted(x, x)  # new alias pattern: the same tensor twice
    assert calls() == (2, 4)
    jitted(ar(3, 4).double(), ar(3, 4).double())  # new dtype
    assert calls() == (2, 5)
    big = ar(6, 4)
    jitted(big[:3], big[3:])  # two views of one storage
    assert calls() == (2, 6)
    a, b = ar(3, 4), ar(3, 4)
    out = jitted(a, b)
    assert calls() == (3, 6)
    torch.testing.assert_close(out, (ar(3, 4) * 2) * 2)


def test_python_scalar_arguments_are_part_of_the_key():
    def f(x, k):
        return x * k

    jitted = kiln.jit(f)
    torch.testing.assert_close(jitted(ar(3), 2.0), ar(3) * 2.0)
    torch.testing.assert_close(jitted(ar(3), 3.0), ar(3) * 3.0)
    assert kiln.last_stats(jitted)["cache_misses"] == 2


def test_internal_overlap_write_raises_like_eager():
    def f(x):
        x.expand(2, 4).add_(1)

    with pytest.raises(RuntimeError):
        f(torch.zeros(4))
    x = torch.zeros(4)
    with pytest.raises(RuntimeError, match="more than one element"):
        kiln.jit(f)(x)
    assert torch.equal(x, torch.zeros(4))


SETITEM_FROM_ITSELF = {
    # eager's copy_to: a 0-dim value on the CPU fills (no overlap check); a broadcast value is
    # copied expanded (its checks do not decide for a stride-0 source); one of the view's own
    # shape is copied as it is (the check raises). (Random program seed 50033.)
    "zero_dim_element": lambda y: y.__setitem__((None, slice(1, None)), y[-1]),
    "zero_dim_element_plain_key": lambda y: y.__setitem__(slice(1, None), y[-1]),
    "broadcast_leading_ones": lambda y: y.__setitem__((None, slice(1, None)), y[None, 3:]),
    "same_shape_overlapping": lambda y: y.__setitem__(slice(1, None), y[:3]),
    "copy_of_an_element": lambda y: y[1:].copy_(y[-1]),
    "disjoint_computed": lambda y: y.__setitem__(slice(1, 3), y[2:4] * 1),
}


@pytest.mark.parametrize("name", sorted(SETITEM_FROM_ITSELF))
def test_setitem_from_its_own_memory_raises_where_eager_does(name):
    fn = SETITEM_FROM_ITSELF[name]

    def f(y):
        fn(y)
        return y

    try:
        f(ar(4))
    except RuntimeError as e:
        y = ar(4)
        with pytest.raises(RuntimeError, match=re.escape(str(e).split(".")[0])):
            kiln.jit(f)(y)
        assert torch.equal(y, ar(4))
        return
    check_against_eager(f, lambda: [ar(4)])


def _mul_add(a, b):
    a.mul_(2)
    return a + b, b.sum()


@pytest.mark.parametrize(
    "make_args",
    [
        pytest.param(lambda: [ar(3, 4).half(), ar(3, 4).half()], id="f16"),
        pytest.param(lambda: [ar(3, 4).bfloat16(), ar(3, 4).bfloat16()], id="bf16"),
        pytest.param(lambda: [ar(4, 6)[:, ::2], ar(4, 3)], id="non-contiguous"),
        pytest.param(lambda: [ar(3, 4).t(), ar(4, 3)], id="transposed"),
        pytest.param(lambda: [ar(4, 3), ar(3).expand(4, 3)], id="expanded"),
        pytest.param(lambda: [ar(0, 3), ar(0, 3)], id="zero-size"),
        pytest.param(lambda: [torch.tensor(1.5), torch.tensor(2.0)], id="0-d"),
        pytest.param(lambda: [ar(6)[1:5], ar(4)], id="offset"),
    ],
)
def test_layouts_and_dtypes(make_args):
    check_against_eager(_mul_add, make_args)


@pytest.mark.parametrize(
    "fn, shapes",
    [
        pytest.param(lambda x, y: x.add_(y.t()), [(70, 70), (70, 70)], id="square, partial tiles"),
        pytest.param(lambda x, y: x.mul_(y.permute(0, 2, 1)).add_(1), [(3, 50, 40), (3, 40, 50)], id="batched"),
        pytest.param(lambda x, y: (x + y.t()).exp(), [(33, 96), (96, 33)], id="new tensor"),
        pytest.param(lambda x, y: x.t().add_(y), [(48, 64), (64, 48)], id="written transposed"),
        pytest.param(lambda x, y: x.add_(y.t().double()), [(40, 36), (36, 40)], id="float64 operand"),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_an_operand_read_transposed(fn, shapes, dtype):
    # The nest runs its last two dims in tiles (codegen/schedule_cpu_tiles.cpp; on CUDA through
    # shared memory, schedule_cuda_tiles.cpp), the last tile of a dim partial where the dim is not
    # a multiple of the tile.
    check_against_eager(fn, lambda: [ar(*s).to(dtype) for s in shapes])


def test_in_place_on_a_leaf_that_requires_grad_raises_like_eager():
    def f(x):
        x.add_(1)
        return x

    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        f(torch.ones(3, requires_grad=True))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        kiln.jit(f)(torch.ones(3, requires_grad=True))


def test_grad_mode_with_an_argument_that_requires_grad_is_differentiated():
    def f(x):
        return x * 2

    jitted = kiln.jit(f)
    x = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        torch.testing.assert_close(jitted(x), torch.full((3,), 2.0))
    y = jitted(x)  # grad on: a different key, and a differentiated program (test_autograd.py)
    assert type(y.grad_fn).__name__ == "CompiledFunctionBackward"
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_structured_arguments_and_results():
    def f(xs, d, k):
        xs[0].add_(d["w"])
        return {"sum": xs[0] + xs[1] * k, "first": xs[0], "k": k, "none": None}

    check_against_eager(f, lambda: [[ar(2, 3), ar(2, 3) + 1], {"w": ar(3)}, 2.5])
    jitted = kiln.jit(f)
    jitted([ar(2, 3), ar(2, 3)], {"w": ar(3)}, 2.5)
    jitted((ar(2, 3), ar(2, 3)), {"w": ar(3)}, 2.5)  # a tuple, not a list: another structure
    assert kiln.last_stats(jitted)["cache_misses"] == 2


def test_random_programs_through_jit():
    """The random programs of test_random_programs.py (in-place ops, views, setitem, aliased and
    strided inputs, and now and then an op kiln runs eagerly) through kiln.jit against eager;
    KILN_RANDOM_PROGRAMS of them (default 100)."""
    from test_random_programs import COUNT, SEEDS, _compile, random_program

    failures = []
    for seed in SEEDS:
        source, make_args = random_program(seed, fallback_ops=True)
        fn = _compile(source, seed)
        try:
            check_against_eager(fn, make_args)
        except Exception as e:  # noqa: BLE001 (a crash or an error is a failure too)
            args = ", ".join(f"{tuple(t.shape)} strides={t.stride()} offset={t.storage_offset()}" for t in make_args())
            first = (str(e).splitlines() or [""])[0]
            failures.append(f"--- seed {seed} (inputs {args}):\n{source}{type(e).__name__}: {first}")
    assert not failures, f"{len(failures)} of {COUNT} programs differ from eager:\n" + "\n".join(failures[:5])


def _op_programs():
    from test_ops import PROGRAMS

    return PROGRAMS


@pytest.mark.parametrize("name, fn, make_args", _op_programs(), ids=[p[0] for p in _op_programs()])
def test_op_through_jit(name, fn, make_args):
    """Every torch form of test_ops.py through kiln.jit (compiled kernels, cuBLAS on CUDA)."""
    check_against_eager(fn, make_args)


def test_out_arguments():
    def f(x, y, z):
        torch.add(x, y, out=z)
        torch.sin(x, out=x)
        return torch.mul(z, 2, out=torch.empty_like(z)), z

    check_against_eager(f, lambda: [ar(2, 3), ar(2, 3) + 1, torch.zeros(2, 3)])
    out = torch.zeros(2, 3)
    ret = kiln.jit(lambda x, o: torch.exp(x, out=o))(ar(2, 3), out)
    assert ret is out
    torch.testing.assert_close(out, torch.exp(ar(2, 3)))


def test_out_argument_of_another_shape_is_refused():
    def f(x, o):
        torch.exp(x, out=o)

    with pytest.raises(kiln.UnsupportedError, match="out= needs a tensor of the result's dtype and shape"):
        kiln.jit(f)(ar(2, 3), torch.zeros(6))


def _with_unknown_ops(x, y):
    a = x.exp_()
    b = torch.cumsum(a, 0)  # kiln has no lowering for cumsum, sort or flip: PyTorch runs them
    s, i = torch.sort(b * 2, dim=1)
    return s + 1, i, y.mul_(2) + torch.flip(b, [0])


def test_unknown_ops_run_eagerly_between_fused_regions():
    jitted = check_against_eager(_with_unknown_ops, lambda: [ar(4, 5) - 1, ar(4, 5)])
    stats = kiln.last_stats(jitted)
    assert stats["fallback_ops"] == 3 and stats["interpreted_steps"] == 0
    # exp_ (with its write into x), b * 2, s + 1, and y.mul_(2) + flip(b): four fused regions.
    assert stats["fusion_regions"] == 4
    x, y = ar(4, 5) - 1, ar(4, 5)
    x0, y0 = x.clone(), y.clone()
    out = jitted(x, y)  # a cache hit runs the same eager ops on the new tensors
    want = _with_unknown_ops(x0, y0)
    for g, w in zip(out, want):
        torch.testing.assert_close(g, w)
    assert kiln.last_stats(jitted)["cache_hits"] == 1


def test_unknown_op_with_fallback_off_names_the_op_and_line():
    with pytest.raises(kiln.UnsupportedError, match=r"torch\.cumsum at .*test_jit\.py:\d+") as info:
        kiln.jit(_with_unknown_ops, fallback=False)(ar(4, 5), ar(4, 5))
    assert "b = torch.cumsum(a, 0)" in str(info.value)


def test_a_constant_pad_is_kilns_and_other_modes_run_eagerly():
    # A language model's labels: padded with ignore_index, shifted, masked in the loss.
    def labels_loss(logits, tokens):
        labels = F.pad(tokens, (0, 1), value=-100)[..., 1:]
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    logits = torch.linspace(-2, 2, 2 * 5 * 7).reshape(2, 5, 7)
    jitted = check_against_eager(labels_loss, lambda: [logits.clone(), torch.arange(10).reshape(2, 5) % 7])
    assert kiln.last_stats(jitted)["fallback_ops"] == 0
    reflect = check_against_eager(lambda x: F.pad(x * 2, (1, 2), mode="reflect") + 1, lambda: [ar(2, 4)])
    assert kiln.last_stats(reflect)["fallback_ops"] == 1
    with pytest.raises(kiln.UnsupportedError, match="pad with mode='reflect' runs as an eager step"):
        kiln.trace(lambda x: F.pad(x, (1, 1), mode="reflect"), ar(2, 4))


def test_unknown_ops_that_write_run_on_clones_and_those_that_alias_are_refused():
    def writes(x):
        x.cumsum_(0)
        return x

    def views(x):
        return x.unfold(0, 2, 1) * 2

    check_against_eager(writes, lambda: [ar(4)])  # more in test_fallback.py
    with pytest.raises(kiln.UnsupportedError, match="returns a view of an argument"):
        kiln.jit(views)(ar(4))


def test_an_eager_op_whose_meta_layout_differs_in_a_size_one_dim():
    # Sorting a [4, 1] column: PyTorch's meta kernel says strides (1, 1), its CPU kernel gives
    # (1, 4). kiln lays the result out as tracing saw it; values and addressing agree.
    def f(y):
        y.fill_(1.5)
        return torch.sort(y.unsqueeze(0).transpose(0, -1), -1)[0]

    check_against_eager(f, lambda: [ar(4)])


def _storage_groups(outputs) -> list[tuple]:
    """Which outputs share a storage and which are one object, as index lists (for comparing
    kiln's outputs with eager's)."""
    results = [o for o in outputs if isinstance(o, torch.Tensor)]
    sharing = [tuple(j for j, b in enumerate(results) if same_storage(a, b)) for a in results]
    same_object = [tuple(j for j, b in enumerate(results) if a is b) for a in results]
    offsets = [t.storage_offset() for t in results]
    return [tuple(sharing), tuple(same_object), tuple(offsets)]


OUTPUT_ALIASING = {
    "a view of a fresh tensor": (lambda a: (lambda b: (b, b.view(-1)))(a * 2), lambda: [ar(2, 3)]),
    "rows of a fresh tensor": (lambda a: (lambda b: (b[1], b, b[0, 1:]))(a.exp()), lambda: [ar(3, 4)]),
    "one tensor twice": (lambda a: (lambda b: (b, b, a))(a + 1), lambda: [ar(4)]),
    "a mutated view and its base": (lambda a: (lambda b: (b.t().mul_(2), b))(a + 1), lambda: [ar(2, 3)]),
    "two views, not the base": (lambda a: (lambda b: (b[0], b[1:]))(a.sin()), lambda: [ar(3, 2)]),
}


@pytest.mark.parametrize("name", OUTPUT_ALIASING)
def test_outputs_that_alias_each_other_as_in_eager(name):
    fn, make_args = OUTPUT_ALIASING[name]
    jitted = check_against_eager(fn, make_args)
    got, want = jitted(*make_args()), fn(*make_args())
    assert _storage_groups(got) == _storage_groups(want)
    # A write through one output is seen through the others.
    got[0].add_(100)
    want[0].add_(100)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


# Elementwise ops feeding a reduction, with a broadcast operand loaded once outside the reduction
# loop and lanes of the vectorized path: on the H200 a float32 where whose condition was a
# comparison against such an operand lost elements (kernels now hold where's condition as an
# integer). Shapes with and without a vector tail, both reduction directions.
_REDUCED_ELEMENTWISE = {
    "where_lt": lambda g, a, b: torch.where(b < a, g, 0.0),
    "where_ge_tensor_other": lambda g, a, b: torch.where(a >= b, g, a),
    "where_of_and": lambda g, a, b: torch.where((b < a) & (g > 0), g, b),
    "mul_mask": lambda g, a, b: g * (b < a),
    "clamp_min": lambda g, a, b: torch.clamp(g, min=b),
    "maximum": lambda g, a, b: torch.maximum(g, b),
}


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("shape", [(8, 5), (64, 33), (3, 4)], ids=str)
@pytest.mark.parametrize("name", sorted(_REDUCED_ELEMENTWISE))
def test_elementwise_inside_a_reduction_with_a_broadcast_operand(name, shape, dim):
    op = _REDUCED_ELEMENTWISE[name]

    def make():
        gen = torch.Generator(device="cpu").manual_seed(7)
        g, a = (torch.randn(shape, generator=gen, device="cpu") for _ in range(2))
        b = torch.randn(shape[1:], generator=gen, device="cpu")
        device = torch.empty(0).device
        return [g.to(device), a.to(device), b.to(device)]

    check_against_eager(lambda g, a, b: op(g, a, b).sum(dim), make)


def test_a_builtin_without_a_python_signature_is_jitted():
    # torch.relu and torch.add have no inspect.signature: they bind any arguments, as eager does.
    def randn(*shape, seed=0):
        return torch.randn(*shape, generator=torch.Generator(device="cpu").manual_seed(seed), device="cpu").to(torch.get_default_device())

    check_against_eager(torch.relu, lambda: [randn(4, 5)])
    check_against_eager(torch.add, lambda: [randn(3), randn(3, seed=1)])
    jitted = kiln.jit(torch.add)
    x, y = randn(3), randn(3, seed=1)
    torch.testing.assert_close(jitted(x, y, alpha=2), torch.add(x, y, alpha=2))


def test_step_times_are_recorded_only_when_asked():
    # kiln._C.set_step_times(True): last_run_stats["step_times"] holds (step, how, seconds, ops)
    # for each step of the run, for bench/train.py --steps; off by default, nothing is recorded.
    from kiln import _C

    def f(x, w):
        y = torch.tanh(x) @ w
        return torch.cumsum(y, 0).relu()

    jitted = kiln.jit(f)
    x, w = ar(4, 3), ar(3, 5)
    jitted(x, w)
    cache = kiln._jit._last_cache(jitted)
    assert cache.last_run_stats["step_times"] == []
    _C.set_step_times(True)
    try:
        jitted(x, w)
    finally:
        _C.set_step_times(False)
    times = cache.last_run_stats["step_times"]
    stats = kiln.last_stats(jitted)
    assert len(times) == stats["kernels"] + stats["torch_steps"] + stats["eager_steps"] + stats["view_steps"] + stats["interpreted_steps"]
    assert [s for s, *_ in times] == sorted(s for s, *_ in times)
    assert {how for _, how, _, _ in times} <= {"kernel", "multi-tensor", "library", "eager", "view", "torch", "interpreted", "copy"}
    assert all(seconds >= 0 for _, _, seconds, _ in times)
    assert any("eager_call" in ops for *_, ops in times) and any("tanh" in ops for *_, ops in times)
    jitted(x, w)
    assert cache.last_run_stats["step_times"] == []
