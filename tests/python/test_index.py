"""Index reads and writes through kiln.jit against eager PyTorch: values, every input and the
storage behind it afterwards, aliasing of outputs, errors. CASES.md X1-X5, every op of the
index family with duplicate indices, bool and integer index tensors, non-contiguous, expanded
and aliased arguments (an index tensor that is a view of another argument included).
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from test_cases import ar
from against_eager import check_against_eager

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")


def _idx(*values):
    return torch.tensor(values, dtype=torch.int64)


# ---- CASES.md X1-X5 ------------------------------------------------------------------------------


def x1(buf, pos, k):
    buf.index_copy_(1, pos, k)
    return buf.mean(1)


def x2(x, i, v):
    x.index_put_((i,), v, accumulate=True)
    return x


def x3(s, pad):
    s.masked_fill_(pad[:, None, :], float("-inf"))
    return s.softmax(-1)


def x4(x):
    x[x.abs() > 1] = 0
    return x


def x5(x, i):
    x[i] += 1
    return x


def _pad():
    return torch.tensor([[True, False, False, True], [False, False, True, False]])


CASES = {
    "X1": (x1, lambda: [ar(2, 16, 8), _idx(3), -ar(2, 1, 8)]),
    "X2": (x2, lambda: [ar(4, 3), _idx(0, 2, 0), ar(3, 3) + 1]),
    "X3": (x3, lambda: [ar(2, 4, 4), _pad()]),
    "X4": (x4, lambda: [ar(3, 8) - 1]),
}


@pytest.mark.parametrize("name", CASES)
def test_index_cases(name):
    fn, make_args = CASES[name]
    check_against_eager(fn, make_args)


def test_x2_duplicates_sum():
    x = torch.zeros(4, 3)
    kiln.jit(x2)(x, _idx(0, 2, 0), torch.ones(3, 3))
    assert x[0].tolist() == [2.0, 2.0, 2.0]


def test_x3_and_x4_fuse_the_mask_into_one_kernel():
    for fn, make_args in (CASES["X3"], CASES["X4"]):
        jitted = check_against_eager(fn, make_args)
        stats = kiln.last_stats(jitted)
        assert stats["fallback_ops"] == 0 and stats["fusion_regions"] == 1, fn.__name__


def test_x5_an_index_out_of_range_raises_and_leaves_the_input_untouched():
    x = ar(6)
    with pytest.raises(IndexError, match=r"(?s)(test_index\.py:\d+.*out of bounds|out of bounds.*test_index\.py:\d+)"):
        kiln.jit(x5)(x, _idx(4, 9))
    torch.testing.assert_close(x, ar(6))
    with pytest.raises(IndexError):  # eager on the CPU (on CUDA its kernel would device-assert)
        x5(ar(6).cpu(), _idx(4, 9).cpu())


# ---- the index family ------------------------------------------------------------------------------

OPS = {
    "index_select": (lambda x, i: torch.index_select(x, 1, i) * 2, lambda: [ar(3, 5), _idx(4, 0, 4)]),
    "gather": (lambda x, i: x.gather(1, i) + 1, lambda: [ar(3, 4), _idx(0, 3, 3, 1, 2, 0).view(3, 2)]),
    "take_along_dim": (lambda x, i: torch.take_along_dim(x, i, dim=0), lambda: [ar(3, 4), _idx(2, 0, 1, 1).view(1, 4)]),
    "take_along_dim_broadcast": (lambda x, i: x.take_along_dim(i, 1) * 2, lambda: [ar(3, 4, 1), _idx(2, 0, 3, 1, 1, 0, 3, 3, 2, 1).view(1, 2, 5)]),
    "take_along_dim_flat": (lambda x, i: torch.take_along_dim(x, i), lambda: [ar(3, 4), _idx(11, 0, 5, 5).view(2, 2)]),
    "embedding": (lambda w, i: F.embedding(i, w).sum(-1), lambda: [ar(10, 4), _idx(1, 9, 1, 0).view(2, 2)]),
    "scatter_src": (lambda x, i, s: x.scatter(0, i, s), lambda: [ar(3, 4), _idx(2, 0, 1, 1).view(1, 4), -ar(2, 4)]),
    "scatter_value": (lambda x, i: x.scatter_(1, i, 7.0), lambda: [ar(3, 4), _idx(1, 2, 0).view(3, 1)]),
    "scatter_reduce_arg": (lambda x, i, s: x.scatter_(0, i, s, reduce="multiply"), lambda: [ar(3, 4) + 1, _idx(2, 2, 0, 1).view(1, 4), ar(1, 4) + 2]),
    "scatter_add_": (lambda x, i, s: x.scatter_add_(0, i, s), lambda: [ar(3, 4), _idx(0, 0, 2, 0, 1, 1, 0, 0).view(2, 4), ar(2, 4)]),
    "scatter_add": (lambda x, i, s: torch.scatter_add(x, 0, i, s) * x, lambda: [ar(3, 4), _idx(0, 0, 2, 0).view(1, 4), ar(1, 4)]),
    "scatter_reduce_amax": (lambda x, i, s: x.scatter_reduce_(0, i, s, "amax", include_self=False), lambda: [ar(3, 2), _idx(0, 0, 2, 0).view(2, 2), -ar(2, 2)]),
    "scatter_reduce_mean": (lambda x, i, s: x.scatter_reduce(0, i, s, "mean"), lambda: [ar(3, 2), _idx(0, 0, 2, 0).view(2, 2), ar(2, 2)]),
    "index_copy": (lambda x, i, s: x.index_copy(0, i, s), lambda: [ar(4, 3), _idx(3, 1), -ar(2, 3)]),
    "index_add_": (lambda x, i, s: x.index_add_(1, i, s, alpha=2), lambda: [ar(2, 4), _idx(0, 0, 3), ar(2, 3)]),
    "index_fill_": (lambda x, i: x.index_fill_(1, i, -1.0), lambda: [ar(2, 4), _idx(3, 1)]),
    "index_put": (lambda x, i, j, v: x.index_put((i, j), v), lambda: [ar(3, 4), _idx(0, 2), _idx(3, 3), -ar(2)]),
    "index_put_one_tensor": (lambda x, i, v: x.index_put_((i,), v, accumulate=True) * 2, lambda: [ar(4, 3), _idx(0, -1, 0), -ar(3)]),
    "getitem_negative": (lambda x, i: x[:, i] + 1, lambda: [ar(3, 4), _idx(-1, 0, -4, 2).view(2, 2)]),
    "setitem_slice_then_tensor": (lambda x, i, v: x.__setitem__((slice(None), i), v) or x.sum(0), lambda: [ar(3, 4), _idx(-1, 1), ar(3, 1)]),
    "masked_fill": (lambda x, m: x.masked_fill(m, 2.5) + x, lambda: [ar(2, 4), _pad()]),
    "masked_fill_int": (lambda x, m: x.masked_fill_(m, 2.7), lambda: [torch.arange(8).view(2, 4), _pad()]),
    "masked_fill_tensor": (lambda x, m, v: x.masked_fill_(m, v), lambda: [ar(2, 4), _pad(), torch.tensor(-3.0, dtype=torch.float64)]),
    "masked_scatter_": (lambda x, m, s: x.masked_scatter_(m, s), lambda: [ar(2, 4), _pad(), -ar(8)]),
    "where": (lambda c, x, y: torch.where(c, x, y) * 2, lambda: [_pad(), ar(2, 4), ar(4)]),
    "getitem_tensor": (lambda x, i: x[i] * 2, lambda: [ar(4, 3), _idx(3, 0, 3)]),
    "getitem_list": (lambda x: x[:, [0, 2]] + x[[1, 1]].sum(0)[:2], lambda: [ar(3, 3)]),
    "getitem_two_tensors_and_a_slice": (lambda x, i, j: x[i, 1:, j], lambda: [ar(3, 4, 5), _idx(0, 2), _idx(4, 1)]),
    "setitem_tensor": (lambda x, i, v: x.__setitem__(i, v) or x, lambda: [ar(4, 3), _idx(2, 0), -ar(2, 3)]),
    "setitem_tensor_duplicates": (lambda x, i: x.__setitem__((i, slice(None)), 5.0) or x, lambda: [ar(4, 3), _idx(1, 1, 3)]),
    "setitem_add": (lambda x, i: x.__setitem__(i, x[i] + 1) or x, lambda: [ar(5), _idx(4, 1)]),
    "setitem_mask_rows": (lambda x, m: x.__setitem__(m, 0.5) or x, lambda: [ar(4, 3), torch.tensor([True, False, True, False])]),
    "setitem_mask_tensor_value": (lambda x: x.__setitem__(x > 0.5, torch.tensor(9.0)) or x, lambda: [ar(2, 4)]),
    "setitem_mask_many_values": (lambda x, v: x.__setitem__(x > 0.5, v) or x, lambda: [ar(2, 4), -ar(2)]),
    "setitem_list": (lambda x: x.__setitem__([0, 2], 1.0) or x * 2, lambda: [ar(3, 2)]),
    # several index tensors at adjacent dims: one flat position into the merged dims
    "getitem_two_tensors": (lambda x, i, j: x[i, j] + 1, lambda: [ar(3, 4, 5), _idx(0, 2, -1), _idx(3, -4, 1)]),
    "getitem_two_tensors_broadcast": (lambda x, i, j: x[:, i[:, None], j] * 2, lambda: [ar(2, 3, 4), _idx(0, 2), _idx(3, 1, 0)]),
    "getitem_three_tensors": (lambda x, i, j, k: x[i, j, k], lambda: [ar(2, 3, 4), _idx(1, 0), _idx(2, -1), _idx(0, 3)]),
    "pick_by_label": (lambda logits, y: -logits.log_softmax(-1)[torch.arange(logits.shape[0], device=logits.device), y].mean(), lambda: [ar(4, 6).sin(), _idx(5, 0, 2, -1)]),
    "setitem_two_tensors": (lambda x, i, j, v: x.__setitem__((i, j), v) or x, lambda: [ar(3, 4), _idx(0, 2, 1), _idx(1, -1, 1), -ar(3)]),
    "setitem_two_tensors_duplicates": (lambda x, i, j: x.__setitem__((i, j), 5.0) or x.sum(), lambda: [ar(3, 4), _idx(0, 2, 0), _idx(1, 3, 1)]),
    "index_put_two_tensors_accumulate": (lambda x, i, j, v: x.index_put_((i, j), v, accumulate=True), lambda: [ar(3, 4, 2), _idx(0, 2, 0), _idx(1, 3, 1), ar(3, 2) + 1]),
}


@pytest.mark.parametrize("name", OPS)
def test_index_op(name):
    fn, make_args = OPS[name]
    check_against_eager(fn, make_args)


# The same programs on arguments laid out otherwise: a strided view, an offset, expanded indices.
def _strided(make_args):
    def make():
        return [a.repeat_interleave(2, dim=-1)[..., ::2] if a.is_floating_point() and a.dim() > 0 else a for a in make_args()]

    return make


@pytest.mark.parametrize("name", ["index_select", "scatter_add_", "index_add_", "index_fill_", "masked_fill", "setitem_tensor", "getitem_tensor", "X1", "X3"])
def test_index_op_on_strided_arguments(name):
    fn, make_args = OPS[name] if name in OPS else CASES[name]
    check_against_eager(fn, _strided(make_args))


def test_an_index_tensor_that_is_a_view_of_another_argument():
    # i is a view of the int64 buffer that the program also writes into.
    def f(buf, i):
        buf.index_fill_(0, i, 0)
        return buf

    def make():
        buf = torch.arange(6)
        return [buf, buf[4:]]  # indices 4, 5: written by index_fill_ itself

    # Eager's error (the index shares memory with the written tensor), raised while tracing.
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        f(*make())
    args = make()
    with pytest.raises(RuntimeError, match=r"(?s)refer to a single memory location.*test_index\.py:\d+"):
        kiln.jit(f)(*args)
    assert args[0].tolist() == list(range(6))

    def g(x, buf):
        x.index_add_(0, buf[1:3], torch.ones(2))
        buf.add_(1)
        return x

    check_against_eager(g, lambda: [ar(4), torch.tensor([9, 0, 3, 7])])


def test_expanded_and_aliased_arguments():
    def f(x, i, v):
        x.index_add_(0, i, v)
        return x

    check_against_eager(f, lambda: [ar(4, 3), _idx(1, 1), ar(3).expand(2, 3)])
    check_against_eager(f, lambda: (lambda b: [b[:4], _idx(0, 3), b[4:]])(ar(6, 3)))


def test_a_boolean_mask_read_says_why_it_cannot_be_traced():
    with pytest.raises(kiln.UnsupportedError, match="size depends on the mask"):
        kiln.jit(lambda x: x[x > 0])(ar(4))


def test_a_value_dependent_read_continues_through_the_backend(fresh_dynamo):
    """Through torch.compile(backend="kiln") Dynamo breaks the graph at the read: the read runs
    eagerly and the program goes on in kiln's graphs on both sides."""

    def f(x, y):
        a = (x * 2).relu()
        b = a[a > 0.5]
        return b.sum() + y.exp().sum(), b * 3

    compiled = torch.compile(f, backend=kiln.backend)
    x, y = ar(10) - 0.3, ar(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no graph runs eagerly
        got = compiled(x, y)
    want = f(x, y)
    torch.testing.assert_close(got, want)
    graphs = kiln.backend_graphs()
    assert len(graphs) == 2 and all(g.eager_reason is None for g in graphs)


@pytest.mark.parametrize("op", [torch.nonzero, torch.masked_select, torch.unique], ids=["nonzero", "masked_select", "unique"])
def test_a_read_of_value_dependent_size_says_why_it_cannot_be_traced(op):
    args = (lambda x: (x, x > 0)) if op is torch.masked_select else (lambda x: (x,))
    with pytest.raises(kiln.UnsupportedError, match=r"size depends on values.*\n?.*|depends on values") as info:
        kiln.jit(lambda x: op(*args(x)) * 2)(ar(4) - 2)
    assert re.search(r"test_index\.py:\d+", str(info.value))


@pytest.mark.parametrize("name", ["index_select", "gather", "index_copy", "scatter_add_", "getitem_tensor", "setitem_tensor", "index_fill_"])
def test_an_index_out_of_range_raises_with_the_op(name):
    fn, make_args = OPS[name]
    args = make_args()
    args = [torch.full_like(a, 99) if a.dtype == torch.int64 else a for a in args]
    before = [a.clone() for a in args]
    with pytest.raises((IndexError, RuntimeError)) as info:
        kiln.jit(fn)(*args)
    # The op and the user's line, whether the op ran as a kernel (checked by the executor) or
    # as an eager step.
    assert re.search(r"test_index\.py:\d+", str(info.value)), str(info.value)
    # (x[i] and x[i] = v lower to index_select and index_copy: the message names those, and the
    # user's line with its text.)
    assert {"getitem_tensor": "index_select", "setitem_tensor": "index_copy"}.get(name, name.rstrip("_").split("_")[0]) in str(info.value)
    for a, b in zip(args, before):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("bad", [99, -99, -1], ids=["high", "low", "negative"])
# (Not the ops without index tensors.)
@pytest.mark.parametrize("name", [n for n in OPS if n not in ("where", "masked_fill", "masked_fill_int", "masked_fill_tensor", "masked_scatter_", "getitem_list", "setitem_list")])
def test_the_cuda_index_check_raises_where_the_cpu_kernel_does(name, bad):
    # On CUDA an eager index step checks its indices itself (PyTorch's CUDA kernels would
    # device-assert); the check must raise exactly where the CPU kernel raises. (The CPU kernels'
    # own error types vary with the case: index_select raises IndexError for -1 and RuntimeError
    # for 99; the check raises one type per op.)
    from kiln._lowering_index import INDEX_CHECKS

    fn, make_args = OPS[name]
    # On the CPU whatever the test device: eager's CUDA kernels would device-assert.
    args = [torch.full_like(a, bad).cpu() if a.dtype == torch.int64 else a.cpu() for a in make_args()]
    calls = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, a=(), kw=None):
            if func in INDEX_CHECKS:
                calls.append((func, a, dict(kw or {})))
            return func(*a, **(kw or {}))

    try:
        with Spy():
            fn(*[a.clone() for a in args])
        eager_error = None
    except (IndexError, RuntimeError) as e:
        eager_error = type(e)
    assert calls, "no index op seen"
    check_error = None
    for func, a, kw in calls:
        try:
            INDEX_CHECKS[func](a, kw)
        except (IndexError, RuntimeError) as e:
            check_error = type(e)
            break
    assert (check_error is None) == (eager_error is None), (check_error, eager_error)


@pytest.mark.parametrize(
    "name",
    ["index_select", "index_copy", "index_add_", "embedding", "gather", "take_along_dim_flat"]
    + ["scatter_src", "scatter_value", "scatter_reduce_arg", "scatter_add_", "scatter_add", "scatter_reduce_amax", "scatter_reduce_mean"]
    + ["index_fill_", "getitem_tensor", "setitem_tensor", "setitem_tensor_duplicates", "setitem_add", "index_put_one_tensor", "getitem_negative", "setitem_slice_then_tensor"]
    + ["getitem_two_tensors", "setitem_two_tensors", "setitem_two_tensors_duplicates", "index_put_two_tensors_accumulate"],
)
def test_index_ops_with_a_one_dim_index_run_as_kernels(name):
    fn, make_args = OPS[name]
    jitted = check_against_eager(fn, make_args)
    stats = kiln.last_stats(jitted)
    assert (stats["fallback_ops"], stats["torch_steps"], stats["interpreted_steps"]) == (0, 0, 0)


@pytest.mark.parametrize("name", ["getitem_two_tensors_broadcast", "getitem_three_tensors", "pick_by_label"])
def test_several_index_tensors_run_without_eager_steps(name):
    # (A position computed in the region that reads through it, from an expanded index or a
    # torch.arange made in the program, is not lowered into that kernel yet: PyTorch runs those
    # regions op by op on the device, torch_steps.)
    fn, make_args = OPS[name]
    jitted = check_against_eager(fn, make_args)
    assert kiln.last_stats(jitted)["fallback_ops"] == 0


@pytest.mark.parametrize("name", ["getitem_two_tensors", "setitem_two_tensors", "index_put_two_tensors_accumulate"])
@pytest.mark.parametrize("bad", [4, -5])
def test_several_index_tensors_out_of_range_raise_eagers_error_naming_the_dim(name, bad):
    # The second index overruns dim 1 (size 4) while the flat position into the merged dims
    # (i * 4 + j) would still be in range: each index is checked against its own dim.
    fn, make_args = OPS[name]
    args = make_args()
    args[2] = torch.full_like(args[2], bad)
    args[1] = torch.zeros_like(args[1])
    before = [a.clone() for a in args]
    with pytest.raises(IndexError, match=rf"index {bad} is out of bounds for dimension 1 with size 4") as info:
        kiln.jit(fn)(*args)
    assert re.search(r"test_index\.py:\d+", str(info.value)), str(info.value)
    with pytest.raises(IndexError, match=rf"index {bad} is out of bounds for dimension 1 with size 4"):
        fn(*[a.clone().cpu() for a in before])  # eager's own (on the CPU: CUDA would device-assert)
    for a, b in zip(args, before):
        torch.testing.assert_close(a, b)


def test_x1_fuses_the_row_write_and_the_mean():
    jitted = check_against_eager(*CASES["X1"])
    stats = kiln.last_stats(jitted)
    assert (stats["fallback_ops"], stats["fusion_regions"], stats["kernels"]) == (0, 1, 1)


def test_an_index_out_of_range_in_a_kernel_leaves_the_tensor_untouched():
    def f(x, i, s):
        x.mul_(2)
        x.index_copy_(0, i, s)
        return x

    x = ar(4, 3)
    with pytest.raises(kiln.IndexOutOfRangeError, match=r"index_copy at .*test_index\.py:\d+ \(`x\.index_copy_\(0, i, s\)`\): index 7 is out of bounds") as info:
        kiln.jit(f)(x, _idx(1, 7), ar(2, 3))
    assert isinstance(info.value, IndexError) and isinstance(info.value, RuntimeError)  # as eager's, by op
    torch.testing.assert_close(x, ar(4, 3))


# scatter_reduce's reductions with duplicate indices, include_self both ways, NaN (amax and amin
# propagate it), integers (mean floors), a value src, a smaller index than self and src.
_SCATTER_REDUCTIONS = ["sum", "prod", "mean", "amax", "amin"]


@pytest.mark.parametrize("include_self", [True, False], ids=["with_self", "without_self"])
@pytest.mark.parametrize("reduce", _SCATTER_REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=["f32", "i64"])
def test_scatter_reduce_runs_as_a_kernel(reduce, include_self, dtype):
    def f(x, i, j, s):
        y = x.scatter_reduce(1, i, s, reduce, include_self=include_self)
        x.scatter_reduce_(0, j[:, :2], s, reduce, include_self=include_self)
        return y + 1

    def make():
        x = (ar(3, 5) * 3 - 20).to(dtype)
        s = (-ar(3, 4) * 5 + 7).to(dtype)
        if dtype.is_floating_point:
            s[1, 2] = float("nan")
        i = _idx(4, 4, 0, 1, 2, 2, 2, 0, 0, 1, 1, 1).view(3, 4)
        return [x, i, i % 3, s]

    jitted = check_against_eager(f, make)
    stats = kiln.last_stats(jitted)
    assert (stats["fallback_ops"], stats["torch_steps"], stats["interpreted_steps"]) == (0, 0, 0)


def test_scatter_forms_fuse_with_their_neighbours():
    def f(x, labels, v):
        one_hot = torch.zeros_like(x).scatter_(1, labels.unsqueeze(1), 1.0)
        x.scatter_(1, labels[:, None], v, reduce="add")
        return (one_hot * x).sum(-1), torch.scatter(x, 0, labels[None, 1:3], -1.5)

    jitted = check_against_eager(f, lambda: [ar(4, 6), _idx(5, 0, 2, 2), ar(4, 1) + 0.5])
    stats = kiln.last_stats(jitted)
    assert (stats["fallback_ops"], stats["torch_steps"]) == (0, 0)


def test_an_index_viewed_through_slices_and_expands_is_checked_where_it_is_read():
    # The kernel reads only i[:, 1:3]; the -7 and 99 outside it are never an index.
    def f(x, i):
        return torch.gather(x, 1, i[:, 1:3].expand(3, 2)) * 2, x.scatter(1, i[:, 1:3], 1.0)

    i = torch.tensor([[-7, 1, 3, 99]])
    jitted = check_against_eager(f, lambda: [ar(3, 4), i.clone()])
    assert kiln.last_stats(jitted)["torch_steps"] == 0
    x = ar(3, 4)
    with pytest.raises((IndexError, RuntimeError), match=r"gather at .*test_index\.py:\d+ .*: index 4 is out of bounds"):
        jitted(x, torch.tensor([[-7, 1, 4, 99]]))
    torch.testing.assert_close(x, ar(3, 4))


def test_an_index_expanded_and_flattened_is_checked_whole_in_its_kernel():
    # expand then reshape has no geometry over the index; every element of it is read, so the
    # whole index is checked, and the region is a kernel (BERT's token type embedding).
    def f(table, kinds):
        return F.embedding(kinds.expand(5, -1).reshape(-1), table) * 2

    jitted = check_against_eager(f, lambda: [ar(3, 4), torch.tensor([[0, 2, 1, 2]])])
    assert kiln.last_stats(jitted)["torch_steps"] == 0
    table = ar(3, 4)
    with pytest.raises((IndexError, RuntimeError), match=r"index_select at .*test_index\.py:\d+ .*: index 3 is out of bounds"):
        jitted(table, torch.tensor([[0, 3, 1, 2]]))


def _labels_loss(logits, table, tokens):
    # An embedding of the tokens, and a language model's loss over labels padded with -100,
    # shifted and masked where ignored: both indices are drawn from the tokens.
    labels = F.pad(tokens, (0, 1), value=-100)[..., 1:]
    h = logits + F.embedding(tokens, table)
    return F.cross_entropy(h.flatten(0, 1), labels.flatten())


def test_indices_drawn_from_the_inputs_are_checked_before_the_first_step():
    tokens = torch.tensor([[1, 6, 2, 0, 3], [5, 5, 4, 1, 2]])
    jitted = check_against_eager(_labels_loss, lambda: [ar(2, 5, 7) / 20, ar(7, 7) / 50, tokens.clone()])
    stats = kiln.last_stats(jitted)
    assert stats["index_checks_first"] == 2 and stats["index_checks_at_steps"] == 0
    # A token the loss ignores (-100) is out of range of the embedding: its check raises at its
    # kernel, as eager's embedding does, and the loss's exact check would pass.
    with pytest.raises((IndexError, RuntimeError), match=r"index_select at .*test_index\.py:\d+ .*: index -100 is out of bounds"):
        jitted(ar(2, 5, 7), ar(7, 7), torch.tensor([[1, 6, 2, -100, 3], [5, 5, 4, 1, 2]]))
    # A label out of range raises at the loss's gather, after the embedding's exact check.
    with pytest.raises((IndexError, RuntimeError), match=r"gather at .*test_index\.py:\d+ .*: index 9 is out of bounds"):
        jitted(ar(2, 5, 7), ar(10, 7), torch.tensor([[1, 6, 2, 9, 3], [5, 5, 4, 1, 2]]))


def test_labels_ignored_by_the_loss_are_checked_before_the_first_step():
    # A data collator pads labels with -100; where(ne(t, -100), t, 0) never selects them, so
    # the read of the labels before the first step lets them pass. Another value out of range
    # (-7 is not ignored) leaves the check at the kernel, which raises as eager does.
    def loss(logits, labels):
        return F.cross_entropy(logits, labels)

    jitted = check_against_eager(loss, lambda: [ar(4, 7) / 10, torch.tensor([3, -100, 0, 6])])
    stats = kiln.last_stats(jitted)
    assert stats["index_checks_first"] == 1 and stats["index_checks_at_steps"] == 0
    with pytest.raises((IndexError, RuntimeError), match=r"gather at .*test_index\.py:\d+ .*: index -7 is out of bounds"):
        jitted(ar(4, 7), torch.tensor([3, -100, -7, 6]))


def test_an_index_write_with_many_positions_runs_as_an_eager_step():
    # A pull kernel loops over the positions for every element: past a few, eager's scatter is faster.
    from kiln._lowering_index import MAX_KERNEL_INDEX_POSITIONS

    n = MAX_KERNEL_INDEX_POSITIONS + 1

    def f(x, i, s):
        x.index_add_(0, i, s)
        return x.scatter_add(0, i[:, None].expand(n, 3), s) * 2

    jitted = check_against_eager(f, lambda: [ar(4, 3), torch.arange(n) % 4, ar(n, 3)])
    assert kiln.last_stats(jitted)["fallback_ops"] == 2


_FRESH_INDEX_WRITES = """def computation(i, s, j):
  # i: "cpu i64[40] strides=(1,) offset=0"
  # s: "cpu f32[40, 8] strides=(8, 1) offset=0"
  # j: "cpu i64[40, 8] strides=(8, 1) offset=0"
  t0 = ltorch.zeros([64, 8], dtype=torch.float32, device="cpu")  # t0: "cpu f32[64, 8]"
  t1 = ltorch.index_add(t0, 0, i, s)  # t1: "cpu f32[64, 8]"
  t2 = ltorch.index_add(t1, 0, i, s, alpha=2)  # t2: "cpu f32[64, 8]"
  t3 = ltorch.scatter(t2, 0, j, s, reduce="sum")  # t3: "cpu f32[64, 8]"
  return {"output": (RESULTS,)}
"""


@pytest.mark.parametrize("results", ["t3", "t3, t0", "t3, t1", "t3, t2"])
def test_index_writes_pytorch_runs_write_into_a_fresh_self_nothing_else_reads(results, monkeypatch):
    # A backward's embedding gradient is index_add(zeros(...), ...) with more positions than a
    # kernel scans: PyTorch runs it, in place into the zeros when nothing else reads them
    # (torch_steps.cpp's writes_in_place), never into a tensor the step still returns.
    from kiln import _C, _torch_steps

    written = []
    for op, fn in list(_torch_steps.IN_PLACE.items()):
        monkeypatch.setitem(_torch_steps.IN_PLACE, op, lambda *a, _fn=fn, _op=op, **k: written.append(_op) or _fn(*a, **k))
    # The trace's tensors are on the CPU (whatever device the suite runs on).
    i = torch.tensor([(7 * k) % 64 for k in range(40)], device="cpu")
    s = ar(40, 8).cpu()
    j = i[:, None].expand(40, 8).contiguous()
    cache = _C.JitCache()
    got = cache.insert_and_run(3, [i, s, j], _FRESH_INDEX_WRITES.replace("RESULTS", results), 0.0, 1, None, 0)
    assert cache.last_run_stats["torch_steps"] >= 1
    z = torch.zeros(64, 8, device="cpu")
    t1 = z.index_add(0, i, s)
    t2 = t1.index_add(0, i, s, alpha=2)
    t3 = t2.scatter_add(0, j, s)
    want = {"t0": z, "t1": t1, "t2": t2, "t3": t3}
    for name, g in zip(results.split(", "), got):
        torch.testing.assert_close(g, want[name], msg=lambda m: f"{name}: {m}")
    # Each write whose self is returned too writes into a copy.
    returned = set(results.split(", "))
    assert written == [op for op, self in [("index_add", "t0"), ("index_add", "t1"), ("scatter", "t2")] if self not in returned]


def test_a_scatter_whose_base_is_loaded_in_a_cpu_flat_loop():
    # Found by a fresh random-program seed (898184958380144445): the scatter's accumulator started
    # from its base's value at the index's loop level, while the CPU flat loop loaded the base at
    # its position `l`, one level deeper: `acc = v8` came before v8 was loaded and the kernel did
    # not compile. The accumulator now starts at the deeper of the two levels.
    def fn(a):
        t0 = torch.fmod(a, -3)
        idx = torch.arange(1, 2)
        t3 = -t0.index_select(0, idx)
        return t0.scatter(0, idx.view(1, 1, 1).expand(1, 4, 1), t3)

    def make():
        values = [0, 3, -2, -1, 5, 5, -1, 5, -4, 0, -2, -5, 3, -3, -3, -1]
        return [torch.tensor(values, dtype=torch.int64, device="cpu").view(4, 4, 1).to(torch.empty(0).device)]

    check_against_eager(fn, make)
