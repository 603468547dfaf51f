"""Multi-tensor groups against eager PyTorch: an optimizer written as a loop over its parameters
is one fusion region per parameter, which kiln runs as one multi-tensor kernel a call
(passes/group_multi_tensor.h, codegen/schedule_multi_tensor.cpp). Values and every side effect
must be eager's; steps that may not run at once (the same parameter twice, parameters that share
memory, a parameter that is not dense) run one by one and still match eager.
"""

from __future__ import annotations

import pytest
import torch

import kiln
from against_eager import check_against_eager

pytestmark = pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built (cmake -DKILN_BUILD_PYTHON=ON)")

# Sizes from one element to past the CPU's parallel threshold, 1-D and 2-D, odd and even; the
# last makes the CPU run the group as one kernel (codegen::kCpuMultiTensorElements).
SHAPES = [(1,), (3,), (7, 5), (64,), (257,), (33, 65), (4099,), (70001,), (1 << 20,)]


def _device():
    return torch.empty(0).device


def _randn(shape, dtype, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=gen, device="cpu").to(dtype=dtype, device=_device())


def sgd_momentum(params, grads, bufs):
    for p, g, buf in zip(params, grads, bufs):
        buf.mul_(0.9).add_(g)
        p.add_(buf, alpha=-0.01)


def _sgd_args(dtype, shapes=SHAPES):
    def make():
        return [[_randn(s, dtype, 3 * i + k) for i, s in enumerate(shapes)] for k in range(3)]

    return make


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_sgd_over_parameters_of_every_size_is_one_kernel(dtype):
    jitted = check_against_eager(sgd_momentum, _sgd_args(dtype))
    stats = kiln.last_stats(jitted)
    assert stats["fusion_regions"] == len(SHAPES)
    assert stats["multi_tensor_steps"] == len(SHAPES)
    assert stats["kernels"] <= 2  # CUDA launches at most members_per_launch members
    assert stats["writebacks_in_kernel"] == 2 * len(SHAPES)
    # A second call with the same tensors' sizes runs the same kernel again.
    check_against_eager(sgd_momentum, _sgd_args(dtype), jitted=jitted)
    assert kiln.last_stats(jitted)["multi_tensor_steps"] == len(SHAPES)


def adam_step(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps):
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        p.addcdiv_(m, v.sqrt().add_(eps), value=-lr)


def test_adam_with_number_arguments_matches_eager():
    def make():
        four = [[_randn(s, torch.float32, 10 * i + k) for i, s in enumerate(SHAPES)] for k in range(4)]
        four[3] = [v.abs() for v in four[3]]
        return [*four, 1e-3, 0.9, 0.999, 1e-8]

    jitted = check_against_eager(adam_step, make)
    stats = kiln.last_stats(jitted)
    assert stats["multi_tensor_steps"] == len(SHAPES)
    # Another learning rate: the numbers are arguments of the kernel, or the program is keyed
    # on them; either way eager's values.
    def make_other():
        args = make()
        args[4] = 3e-4
        return args

    check_against_eager(adam_step, make_other, jitted=jitted)


def test_the_same_parameter_twice_runs_in_order():
    # Two regions writing one tensor: not independent, never run at once.
    def make():
        p = _randn((6,), torch.float32, 1)
        q = _randn((9,), torch.float32, 2)
        g = [_randn((6,), torch.float32, 3), _randn((9,), torch.float32, 4), _randn((6,), torch.float32, 5)]
        b = [_randn((6,), torch.float32, 6), _randn((9,), torch.float32, 7), _randn((6,), torch.float32, 8)]
        return [[p, q, p], g, b]

    jitted = check_against_eager(sgd_momentum, make)
    assert kiln.last_stats(jitted)["multi_tensor_steps"] < 3


def test_parameters_that_share_memory_match_eager():
    # Two views of one storage are one alias group: each write reaches the other's memory.
    def make():
        flat = _randn((30,), torch.float32, 1)
        params = [flat[:10], flat[10:30].view(4, 5)]
        grads = [_randn((10,), torch.float32, 2), _randn((4, 5), torch.float32, 3)]
        bufs = [_randn((10,), torch.float32, 4), _randn((4, 5), torch.float32, 5)]
        return [params, grads, bufs]

    check_against_eager(sgd_momentum, make)


def test_a_parameter_that_is_not_dense_runs_step_by_step():
    # Every tensor of a multi-tensor kernel is dense; a strided parameter sends the group's steps
    # to their own kernels, with eager's values all the same.
    def make():
        params = [_randn((8, 6), torch.float32, 1)[:, ::2], _randn((5,), torch.float32, 2)]
        grads = [_randn((8, 3), torch.float32, 3), _randn((5,), torch.float32, 4)]
        bufs = [_randn((8, 3), torch.float32, 5), _randn((5,), torch.float32, 6)]
        return [params, grads, bufs]

    jitted = check_against_eager(sgd_momentum, make)
    stats = kiln.last_stats(jitted)
    assert stats["multi_tensor_steps"] == 0
    # Each parameter's step is a kernel of its own; CUDA runs one launch more (3, on the H100 on
    # 2026-12-05: the strided parameter's writeback copy).
    assert stats["interpreted_steps"] == 0 and stats["eager_steps"] == 0
    assert stats["kernels"] == (3 if torch.empty(0).device.type == "cuda" else 2)


def test_outputs_of_grouped_steps_are_returned_as_eager_returns_them():
    # Results a caller sees (fresh tensors, and an input returned after its in-place update).
    def fn(xs, ys):
        outs = []
        for x, y in zip(xs, ys):
            x.mul_(2)
            outs.append(x * y + 1)
        return outs, xs[0]

    def make():
        shapes = [*SHAPES[:5], SHAPES[-1]]
        return [[_randn(s, torch.float32, i) for i, s in enumerate(shapes)],
                [_randn(s, torch.float32, 20 + i) for i, s in enumerate(shapes)]]

    jitted = check_against_eager(fn, make)
    assert kiln.last_stats(jitted)["multi_tensor_steps"] == 6


def test_a_small_group_on_the_cpu_runs_step_by_step():
    # Below kCpuMultiTensorElements in all, each step's own kernel is as fast: the CPU keeps them.
    small = SHAPES[:-2]
    jitted = check_against_eager(sgd_momentum, _sgd_args(torch.float32, small))
    stats = kiln.last_stats(jitted)
    if _device().type == "cpu":
        assert (stats["multi_tensor_steps"], stats["kernels"]) == (0, len(small))
    else:
        assert (stats["multi_tensor_steps"], stats["kernels"]) == (len(small), 1)


def _random_update(rng):
    """One of a few per-parameter updates an optimizer or a user loop writes (in place, with or
    without a result per parameter)."""
    kind = rng.choice(["momentum", "adam", "scale_shift", "returned", "counted"])
    a, b = rng.choice([0.5, 0.9, -1.25]), rng.choice([0.1, 2.0, -0.01])

    def fn(xs, ys, zs, counts):
        outs = []
        for x, y, z, c in zip(xs, ys, zs, counts):
            if kind == "counted":  # a 0-d count per parameter, as AdamW's step (a 0-d result)
                c.add_(1)
                x.sub_(y * (abs(a) ** c) * b)
                z.mul_(c)
            elif kind == "momentum":
                z.mul_(a).add_(y)
                x.add_(z, alpha=b)
            elif kind == "adam":
                # (a denominator kept away from 0: near it, rounding differences of one ulp in z
                # between any two correct implementations become large ones in x)
                z.mul_(abs(a)).addcmul_(y, y, value=0.5)
                x.addcdiv_(y, z.abs().sqrt().add_(0.5), value=b)
            elif kind == "scale_shift":
                x.mul_(a).add_(y * b)
            else:
                x.add_(y, alpha=a)
                outs.append(x * z + b)
        return outs

    return kind, fn


@pytest.mark.parametrize("seed", range(int(__import__("os").environ.get("KILN_MULTI_TENSOR_PROGRAMS", "40"))))
def test_random_parameter_loops_match_eager(seed):
    # Random loops over parameters of random sizes, dtypes and layouts, some sharing memory (views
    # of one storage, the same tensor twice, a strided view): whatever kiln groups, eager's values
    # and side effects.
    import random

    rng = random.Random(seed)
    kind, fn = _random_update(rng)
    count = rng.randint(2, 7)
    # (float32 and float64: eager's own CPU 16-bit add with an alpha rounds its vector body and its
    # scalar tail differently, which a cancellation turns into a large relative difference.)
    dtype = rng.choice([torch.float32, torch.float32, torch.float64])
    # (0-d parameters too: a step of 0-d tensors alone)
    shapes = [tuple(rng.randint(1, 12) for _ in range(rng.choice([0, 1, 1, 2, 2, 3]))) for _ in range(count)]
    if rng.random() < 0.4:  # enough elements in all for the CPU's group kernel
        shapes[rng.randrange(count)] = (rng.randint(66000, 70000),)
    sharing = rng.choice(["none", "none", "views of one storage", "same tensor twice", "strided"])
    shared_state = kind != "returned" and rng.random() < 0.3  # one state tensor for two parameters
    shared_count = rng.random() < 0.3  # one count for two parameters: their steps are in order
    if sharing == "same tensor twice" and count >= 3:
        shapes[2] = shapes[0]
    if sharing == "strided" and not shapes[0]:
        shapes[0] = (5,)

    def make():
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def randn(shape):
            return torch.randn(shape, generator=gen, device="cpu").to(dtype=dtype, device=_device())

        xs = [randn(s) for s in shapes]
        if sharing == "views of one storage":
            sizes = [int(torch.Size(s).numel()) for s in shapes]
            flat = randn((sum(sizes),))
            starts = [sum(sizes[:i]) for i in range(count)]
            xs = [flat[st:st + n].view(s) for st, n, s in zip(starts, sizes, shapes)]
        elif sharing == "same tensor twice" and count >= 3:
            xs[2] = xs[0]
        elif sharing == "strided":
            s = shapes[0]
            xs[0] = randn((*s[:-1], 2 * s[-1]))[..., ::2]
        ys = [randn(s) for s in shapes]
        zs = [randn(s).abs() if kind == "adam" else randn(s) for s in shapes]
        if shared_state and shapes[-1] == shapes[0]:
            zs[-1] = zs[0]
        counts = [torch.tensor(float(rng_counts), dtype=dtype, device=_device()) for rng_counts in range(count)]
        if shared_count:
            counts[1] = counts[0]
        return [xs, ys, zs, counts]

    check_against_eager(fn, make)


# ---- foreach ops: each the per-tensor op it applies, so a foreach optimizer fuses too ----------


def sgd_foreach(params, grads, bufs):
    torch._foreach_mul_(bufs, 0.9)
    torch._foreach_add_(bufs, grads)
    torch._foreach_add_(params, bufs, alpha=-0.01)


def adamw_foreach(params, grads, exp_avgs, exp_avg_sqs):
    lr, wd, beta1, beta2, eps = 1e-3, 1e-2, 0.9, 0.999, 1e-8
    torch._foreach_mul_(params, 1 - lr * wd)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denom, [-lr] * len(params))


@pytest.mark.parametrize("fn", [sgd_foreach, adamw_foreach], ids=["sgd", "adamw"])
def test_a_foreach_optimizer_step_is_one_kernel(fn):
    def make():
        tensors = [[_randn(s, torch.float32, 10 * i + k) for i, s in enumerate(SHAPES)] for k in range(4)]
        tensors[3] = [v.abs() for v in tensors[3]]
        return tensors[: 3 if fn is sgd_foreach else 4]

    jitted = check_against_eager(fn, make)
    stats = kiln.last_stats(jitted)
    assert (stats["eager_steps"], stats["multi_tensor_steps"], stats["kernels"]) == (0, len(SHAPES), 1)


def test_foreach_results_and_arguments_as_eager():
    # In-place forms return their list, the others tuples of new tensors; per-tensor numbers, one
    # tensor for all.
    def fn(xs, ys, s):
        same = torch._foreach_mul_(xs, [0.5, 2.0, -1.0])
        torch._foreach_add_(xs, s)
        powers = torch._foreach_pow(ys, 2.0)
        mixed = torch._foreach_maximum(xs, ys)
        torch._foreach_zero_(ys)
        torch._foreach_copy_(ys, powers)
        return same is xs, powers, mixed, torch._foreach_neg(xs)

    def make():
        return [[_randn((4,), torch.float32, 1), _randn((2, 3), torch.float32, 2), _randn((5,), torch.float32, 3)],
                [_randn((4,), torch.float32, 4), _randn((2, 3), torch.float32, 5), _randn((5,), torch.float32, 6)],
                _randn((), torch.float32, 7)]

    jitted = check_against_eager(fn, make)
    assert kiln.last_stats(jitted)["eager_steps"] == 0


def test_foreach_lists_of_different_lengths_raise_like_eager():
    xs = [_randn((2,), torch.float32, 1), _randn((3,), torch.float32, 2)]
    with pytest.raises(RuntimeError, match="Tensor lists must have the same number of tensors, got 2 and 1"):
        torch._foreach_add_(xs, xs[:1])
    with pytest.raises(RuntimeError, match="Tensor lists must have the same number of tensors, got 2 and 1"):
        kiln.jit(lambda a, b: torch._foreach_add_(a, b))(xs, xs[:1])


def test_a_foreach_op_without_a_per_tensor_form_runs_eagerly():
    def fn(xs):
        torch._foreach_mul_(xs, 2.0)
        return torch._foreach_norm(xs)

    jitted = check_against_eager(fn, lambda: [[_randn((4,), torch.float32, 1), _randn((3, 3), torch.float32, 2)]])
    assert kiln.last_stats(jitted)["eager_steps"] >= 1


def test_steps_that_read_0d_tensors_are_one_kernel():
    # Each parameter's update reads 0-d tensors at every element: its own step size, and one
    # scale all share. The group forms; every element reads the member's own values.
    def fn(params, grads, step_sizes, scale):
        for p, g, s in zip(params, grads, step_sizes):
            p.sub_(g * s * scale)

    def make():
        return [[_randn(s, torch.float32, i) for i, s in enumerate(SHAPES)],
                [_randn(s, torch.float32, 20 + i) for i, s in enumerate(SHAPES)],
                [_randn((), torch.float32, 40 + i) for i in range(len(SHAPES))],
                _randn((), torch.float32, 60)]

    jitted = check_against_eager(fn, make)
    stats = kiln.last_stats(jitted)
    assert (stats["multi_tensor_steps"], stats["kernels"]) == (len(SHAPES), 1)


def test_steps_with_0d_results_are_one_kernel():
    # AdamW's step count: each parameter's step adds one to its own 0-d count and reads the new
    # count at every element. The count is a 0-d result of the member's step, stored once (and
    # copied into its memory after the kernel: other elements read that memory meanwhile).
    def fn(params, grads, steps):
        for p, g, step in zip(params, grads, steps):
            step.add_(1)
            p.sub_(g * (0.9 ** step))

    def make():
        return [[_randn(s, torch.float32, i) for i, s in enumerate(SHAPES)],
                [_randn(s, torch.float32, 20 + i) for i, s in enumerate(SHAPES)],
                [torch.tensor(float(i), device=_device()) for i in range(len(SHAPES))]]

    jitted = check_against_eager(fn, make)
    stats = kiln.last_stats(jitted)
    assert (stats["multi_tensor_steps"], stats["kernels"]) == (len(SHAPES), 1)


def test_0d_results_copied_after_the_kernel_land_in_their_own_elements():
    # Each count is read at every element of its parameter's step, so its new value is copied
    # after the kernel (on CUDA the copies of a run of single elements are one launch). Counts of
    # two dtypes, several of them elements of one tensor (next to each other in memory), one
    # count shared by two parameters: each element gets its own step's value, no other.
    def fn(params, grads, counts):
        for p, g, c in zip(params, grads, counts):
            c.add_(1)
            p.sub_(g * (0.5 ** c))

    def make():
        doubles = torch.arange(4, dtype=torch.float64, device=_device())
        floats = torch.arange(3, dtype=torch.float32, device=_device()) + 10
        shared = torch.tensor(2.0, device=_device())
        counts = [doubles[0], floats[1], doubles[1], floats[0], shared, doubles[3], shared]
        shapes = [SHAPES[k % len(SHAPES)] for k in (8, 2, 7, 4, 6, 3, 1)]
        return [[_randn(s, torch.float32, i) for i, s in enumerate(shapes)],
                [_randn(s, torch.float32, 20 + i) for i, s in enumerate(shapes)],
                counts]

    check_against_eager(fn, make)


def test_steps_of_0d_tensors_alone_store_their_results():
    # Every tensor 0-d (foreach step counts): a member is one element, its results stored by it.
    # Each parameter's three ops are one region, so nine steps (CUDA groups them into one kernel;
    # the CPU, below its parallel threshold, runs them step by step). A group of them once stored
    # nothing: its 1-D nest had no element of a 0-d result's shape.)
    def fn(steps, scales):
        torch._foreach_add_(steps, 1)
        torch._foreach_mul_(scales, steps)
        return [s * 2 for s in steps]

    def make():
        return [[torch.tensor(float(i), device=_device()) for i in range(9)],
                [torch.tensor(0.5 + i, device=_device()) for i in range(9)]]

    jitted = check_against_eager(fn, make)
    stats = kiln.last_stats(jitted)
    if _device().type == "cuda":
        assert (stats["multi_tensor_steps"], stats["kernels"]) == (9, 1)


# ---- torch.optim through torch.compile(backend=kiln) ----------------------------------------------


def test_pow_with_a_number_base_is_eagers_rpow():
    # torch.pow(number, tensor) (AdamW's bias corrections: torch._foreach_pow(beta1, steps)) in
    # the exponent's dtype, float and integer exponents, as eager.
    def fn(x, n):
        return torch.pow(0.9, x), torch.pow(2, n), torch.pow(1.5, n)

    def make():
        return [torch.tensor([0.0, 1.0, 2.5, -3.0, float("nan"), 40.0], device=_device()),
                torch.tensor([0, 1, 5, 12], device=_device())]

    jitted = check_against_eager(fn, make)
    assert kiln.last_stats(jitted)["eager_steps"] == 0


def test_torch_optim_adamw_step_through_the_backend_matches_eager():
    # The optimizer's own foreach step compiled by kiln (Dynamo's graph of AdamW.step): the same
    # parameters and state as eager's after every step, and every write stored by a kernel but
    # the 0-d step counts'.
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(_device())
    reference = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, foreach=True)
    compiled_step = torch.compile(opt.step, backend=kiln.backend)
    x = torch.randn(5, 16, device=_device())
    kiln.clear_backend_graphs()
    for _ in range(4):
        for m, o, step in ((model, opt, compiled_step), (reference, ref_opt, ref_opt.step)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
        # the same gradients for both: the compared quantity is the step alone
        for p, q in zip(model.parameters(), reference.parameters()):
            p.grad.copy_(q.grad)
        compiled_step()
        ref_opt.step()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
            for key in ("exp_avg", "exp_avg_sq", "step"):
                torch.testing.assert_close(opt.state[p][key], ref_opt.state[q][key], rtol=1e-5, atol=1e-7)
        for p, q in zip(model.parameters(), reference.parameters()):
            p.data.copy_(q.data)  # the next step starts from eager's parameters
    graphs = kiln.backend_graphs()
    assert graphs, "the step ran eagerly"
    stats = kiln.last_stats(graphs[-1])
    assert stats["eager_steps"] == 0
    assert stats["writebacks_in_kernel"] == 3 * len(list(model.parameters()))
