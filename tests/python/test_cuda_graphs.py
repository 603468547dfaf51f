# CUDA graph replay (src/kiln/runtime/cuda/graph_replay.h): from its third call a program whose
# steps all run on the device is one CUDA graph. Each test checks the calls against eager's
# results and side effects, and that the graph was captured and replayed (or refused, and why).
# They need a GPU; on the CPU they skip (the CI machine has none; scripts/gpu_check.sh runs them).
import functools

import pytest
import torch
import torch.nn.functional as F

import kiln

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device"),
    pytest.mark.skipif(not kiln.HAVE_EXTENSION, reason="kiln._C is not built"),
]
DEVICE = "cuda"
# Matrix products: kiln's cuBLAS calls and PyTorch's may sum in different orders.
close = functools.partial(torch.testing.assert_close, rtol=1e-4, atol=1e-4)


def _expected_graph(call: int) -> str:
    return "" if call < 2 else "captured" if call == 2 else "replayed"


def test_a_program_replays_as_one_graph_with_moving_inputs_and_a_buffer_written_in_place():
    def step(x, w, buf):
        buf.mul_(0.5).add_(F.linear(x, w).relu())
        return (buf * x).sum(-1), buf.cos()

    f = kiln.jit(step)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    w = torch.randn(128, 128, device=DEVICE, generator=gen)
    buf, want_buf = torch.zeros(64, 128, device=DEVICE), torch.zeros(64, 128, device=DEVICE)
    held = []
    for call in range(8):
        x = torch.randn(64, 128, device=DEVICE, generator=gen)  # a new tensor each call
        got, want = f(x, w, buf), step(x, w, want_buf)
        for g, e in zip(got, want):
            close(g, e)
        close(buf, want_buf)
        stats = kiln.last_stats(f)
        assert stats["cuda_graph"] == _expected_graph(call), stats["cuda_graph_refused"]
        held.append((got, [t.clone() for t in want]))
    # A replay writes the graph's own memory; what earlier calls returned is the caller's.
    for got, want in held:
        for g, e in zip(got, want):
            close(g, e)


def test_a_kv_cache_written_at_a_moving_position_and_an_index_out_of_range_raises_untouched():
    def write(cache, pos, v, w):
        cache.index_copy_(0, pos, F.linear(v, w))
        return (v @ cache.t()).softmax(-1) @ cache

    f = kiln.jit(write)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    w = torch.randn(32, 32, device=DEVICE, generator=gen)
    cache, want_cache = torch.zeros(16, 32, device=DEVICE), torch.zeros(16, 32, device=DEVICE)
    for p in range(12):
        pos = torch.tensor([p], device=DEVICE)
        v = torch.randn(1, 32, device=DEVICE, generator=gen)
        close(f(cache, pos, v, w), write(want_cache, pos, v, w))
        close(cache, want_cache)
        assert kiln.last_stats(f)["cuda_graph"] == _expected_graph(p), kiln.last_stats(f)["cuda_graph_refused"]
    before = cache.clone()
    with pytest.raises(IndexError, match="out of bounds"):
        f(cache, torch.tensor([16], device=DEVICE), torch.ones(1, 32, device=DEVICE), w)
    assert torch.equal(cache, before)
    # The graph still replays after the error.
    pos, v = torch.tensor([12], device=DEVICE), torch.randn(1, 32, device=DEVICE, generator=gen)
    close(f(cache, pos, v, w), write(want_cache, pos, v, w))
    close(cache, want_cache)
    assert kiln.last_stats(f)["cuda_graph"] == "replayed"


def test_a_stable_argument_at_another_address_runs_without_the_graph_then_is_learnt_again():
    def step(x, w):
        return F.linear(x, w).tanh() * 2

    f = kiln.jit(step)
    x = torch.randn(8, 64, device=DEVICE)
    w = torch.randn(64, 64, device=DEVICE)
    for call in range(4):
        close(f(x, w), step(x, w))
        assert kiln.last_stats(f)["cuda_graph"] == _expected_graph(call)
    # Both arguments at new addresses: neither is where the graph reads it.
    x2, w2 = x.clone() + 1, w.clone() - 1
    modes = []
    for call in range(4):
        close(f(x2, w2), step(x2, w2))
        modes.append(kiln.last_stats(f)["cuda_graph"])
    assert modes == ["", "", "captured", "replayed"]


def test_results_that_view_a_moving_argument_or_each_other_alias_as_in_eager():
    def fn(x, w):
        z = F.linear(x, w).relu()
        return x[1:], z, z.view(-1), (z + 1).t()

    f = kiln.jit(fn)
    w = torch.randn(16, 16, device=DEVICE)
    for call in range(5):
        x = torch.randn(4, 16, device=DEVICE)
        got, want = f(x, w), fn(x, w)
        for g, e in zip(got, want):
            close(g, e)
            assert g.stride() == e.stride()
        assert got[0].data_ptr() == x[1:].data_ptr()  # a view of the caller's tensor
        assert got[2].data_ptr() == got[1].data_ptr()  # one storage, as in eager
        got[1].zero_()
        assert not got[2].any()
        assert kiln.last_stats(f)["cuda_graph"] == _expected_graph(call), kiln.last_stats(f)["cuda_graph_refused"]


def test_steps_pytorch_runs_are_captured_with_kiln_s_and_their_results_outlive_later_replays(monkeypatch):
    # cumsum and attention: eager steps, whose kernels and memory (PyTorch's) join the graph.
    # (conftest's check of eager steps' writes compares on the host, which no graph can do: off,
    # as for users.)
    import kiln._fallback as fallback

    monkeypatch.setattr(fallback, "CHECK_WRITES", False)
    def fn(x, w, q, k, v):
        h = F.linear(x, w).cumsum(-1) * 2
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return h, a.sigmoid(), a

    f = kiln.jit(fn)
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    w = torch.randn(32, 32, device=DEVICE, generator=gen)
    q, k, v = (torch.randn(2, 4, 16, 8, device=DEVICE, generator=gen) for _ in range(3))
    held = []
    for call in range(6):
        x = torch.randn(8, 32, device=DEVICE, generator=gen)
        q.copy_(torch.randn(q.shape, device=DEVICE, generator=gen))  # new contents, one address
        got, want = f(x, w, q, k, v), fn(x, w, q, k, v)
        for g, e in zip(got, want):
            close(g, e)
        stats = kiln.last_stats(f)
        assert stats["eager_steps"] == 2
        assert stats["cuda_graph"] == _expected_graph(call), stats["cuda_graph_refused"]
        held.append((got, [t.clone() for t in want]))
    for got, want in held:  # an eager step's result is copied out of the graph's memory too
        for g, e in zip(got, want):
            close(g, e)


def test_a_step_pytorch_runs_that_checks_indices_on_the_host_is_not_captured_and_still_raises():
    def fn(x, index, source):
        # More positions than kiln's index kernels take: an eager step that checks the range.
        return x.index_add(0, index, source) * 2

    f = kiln.jit(fn)
    x, source = torch.randn(8, 4, device=DEVICE), torch.randn(32, 4, device=DEVICE)
    index = torch.arange(32, device=DEVICE) % 8
    for _ in range(4):
        close(f(x, index, source), fn(x, index, source))
    stats = kiln.last_stats(f)
    assert stats["eager_steps"] == 1
    assert stats["cuda_graph"] == "" and "host" in stats["cuda_graph_refused"], stats
    index[5] = 8
    with pytest.raises(RuntimeError, match="out of"):
        f(x, index, source)


def test_a_step_pytorch_runs_that_draws_random_numbers_is_not_captured():
    def fn(x):
        return torch.poisson(x.abs() * 3), x.exp()

    f = kiln.jit(fn)
    x = torch.rand(64, 64, device=DEVICE) + 1
    draws = []
    for _ in range(4):
        out, e = f(x)
        close(e, x.exp())
        assert torch.equal(out, out.round())  # whole counts, as poisson's
        draws.append(out)
    stats = kiln.last_stats(f)
    assert stats["cuda_graph"] == "" and "random" in stats["cuda_graph_refused"], stats
    assert not torch.equal(draws[-1], draws[-2])  # a new draw each call (4096 draws alike: ~0)


def test_an_argument_written_in_place_at_a_new_address_each_call_is_not_captured():
    def fn(x, w):
        x.add_(F.linear(x, w))
        return x.sum()

    f = kiln.jit(fn)
    w = torch.randn(16, 16, device=DEVICE) * 0.1
    for _ in range(4):
        x = torch.randn(4, 16, device=DEVICE)
        want_x = x.clone()
        close(f(x, w), fn(want_x, w))
        close(x, want_x)
    stats = kiln.last_stats(f)
    assert stats["cuda_graph"] == "" and "moves" in stats["cuda_graph_refused"]


def test_calls_on_another_stream_wait_for_the_last_replay():
    def step(x, w):
        return F.linear(F.linear(x, w).relu(), w).sum(0)

    f = kiln.jit(step)
    w = torch.randn(256, 256, device=DEVICE)
    side = torch.cuda.Stream()
    results = []
    for call in range(6):
        x = torch.randn(512, 256, device=DEVICE)
        stream = side if call % 2 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            got = f(x, w)
            want = step(x, w)
        results.append((got, want))
    torch.cuda.synchronize()
    for got, want in results:
        close(got, want)


def test_a_replay_that_would_copy_far_more_than_its_launches_cost_is_not_captured():
    def fn(x, w):
        return F.linear(x, w).relu().sum(-1)

    f = kiln.jit(fn)
    w = torch.randn(256, 1024, device=DEVICE)
    for _ in range(4):
        x = torch.randn(4096, 1024, device=DEVICE)  # 16 MiB moving, for a few launches
        close(f(x, w), fn(x, w))
    stats = kiln.last_stats(f)
    assert stats["cuda_graph"] == "" and "would copy" in stats["cuda_graph_refused"]


def test_large_results_of_kiln_s_kernels_are_written_into_new_memory_each_replay_not_copied():
    # 16 MiB of results for 2 launches: copied out of the graph's memory, a replay would cost more
    # than it saves; the launches that write them are pointed at new memory instead. The product
    # returned as it is (cuBLAS writes it) is copied. Every earlier result keeps its values.
    def step(x, w, v):
        h = F.linear(x, w)
        return (h.relu() * 2).exp(), h.sum(-1), F.linear(x[:64], v)

    f = kiln.jit(step)
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    x = torch.randn(8192, 256, device=DEVICE, generator=gen)
    w = torch.randn(512, 256, device=DEVICE, generator=gen) / 16
    v = torch.randn(32, 256, device=DEVICE, generator=gen)
    held = []
    for call in range(6):
        x.copy_(torch.randn(x.shape, device=DEVICE, generator=gen))  # new contents, one address
        got, want = f(x, w, v), step(x, w, v)
        for g, e in zip(got, want):
            close(g, e)
        stats = kiln.last_stats(f)
        assert stats["cuda_graph"] == _expected_graph(call), stats["cuda_graph_refused"]
        if call > 2:
            assert stats["cuda_graph_results"] == (2, 1), stats
        held.append((got, [t.clone() for t in want]))
    pointers = {t.data_ptr() for got, _ in held for t in got}
    assert len(pointers) == 3 * len(held)  # no two calls' results share memory
    for got, want in held:
        for g, e in zip(got, want):
            close(g, e)


def test_a_result_a_cublas_product_reads_is_copied_out_of_the_graph_not_rebound():
    # cuBLAS's kernels hold y's address where kiln cannot point them elsewhere, so y stays in the
    # graph's memory and is copied out, as is the product's result.
    def step(x, s, w):
        y = (x * s).sin()
        return y, y @ w

    f = kiln.jit(step)
    gen = torch.Generator(device=DEVICE).manual_seed(8)
    x = torch.randn(256, 256, device=DEVICE, generator=gen)
    w = torch.randn(256, 64, device=DEVICE, generator=gen)
    held = []
    for call in range(6):
        s = torch.tensor(1.0 + call / 7, device=DEVICE)
        got, want = f(x, s, w), step(x, s, w)
        for g, e in zip(got, want):
            close(g, e)
        stats = kiln.last_stats(f)
        assert stats["cuda_graph"] == _expected_graph(call), stats["cuda_graph_refused"]
        if call > 2:
            assert stats["cuda_graph_results"] == (0, 2), stats
        held.append((got, [t.clone() for t in want]))
    for got, want in held:
        for g, e in zip(got, want):
            close(g, e)


def test_an_index_gathered_from_a_buffer_is_checked_on_the_buffer_before_each_replay():
    # BERT's token type ids: an index the program computes by selecting a buffer's values. The
    # replay checks all of the buffer's values before it runs; where some it does not select
    # are out of range, the call runs without the graph and the exact check decides.
    def embed(table, kinds, picks, x):
        ids = kinds.expand(2, -1).gather(1, picks)
        return F.embedding(ids, table) * x

    f = kiln.jit(embed)
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    table = torch.randn(6, 16, device=DEVICE, generator=gen)
    kinds = torch.randint(0, 6, (1, 10), device=DEVICE, generator=gen)
    picks = torch.tensor([[0, 3, 5], [9, 1, 1]], device=DEVICE)
    x = torch.randn(2, 3, 16, device=DEVICE, generator=gen)
    for call in range(4):
        close(f(table, kinds, picks, x), embed(table, kinds, picks, x))
        stats = kiln.last_stats(f)
        assert stats["cuda_graph"] == _expected_graph(call), stats["cuda_graph_refused"]
    # A value the gather never selects goes out of range: eager does not raise, nor does kiln.
    kinds[0, 2] = 6
    close(f(table, kinds, picks, x), embed(table, kinds, picks, x))
    stats = kiln.last_stats(f)
    assert stats["cuda_graph"] == "" and "holds values out of range" in stats["cuda_graph_refused"]
    # One it selects: the exact check raises, as eager does.
    with pytest.raises(IndexError, match="out of bounds"):
        f(table, kinds, torch.tensor([[2, 2, 2], [0, 0, 0]], device=DEVICE), x)


def test_a_reduction_split_across_blocks_replays_in_a_graph():
    # A full reduction of 2^19 elements is one row split across blocks that meet at a grid
    # barrier (a cooperative launch, a workspace zeroed before it): captured and replayed, with
    # the tensor written in place by the reduction's pass (new contents each call, at one
    # address) and a moving input.
    def step(x, y, w):
        x.abs_()
        m = x.amax()
        return F.linear(y, w) / m, torch.softmax(y * m, -1)

    f = kiln.jit(step)
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    w = torch.randn(64, 64, device=DEVICE, generator=gen)
    x = torch.empty(512, 1024, device=DEVICE)
    for call in range(6):
        x.copy_(torch.randn(512, 1024, device=DEVICE, generator=gen))
        want_x = x.clone()
        y = torch.randn(4, 64, device=DEVICE, generator=gen)
        got, want = f(x, y, w), step(want_x, y, w)
        for g, e in zip(got, want):
            close(g, e)
        assert torch.equal(x, want_x)
        stats = kiln.last_stats(f)
        assert stats["cuda_graph"] == _expected_graph(call), stats["cuda_graph_refused"]
        assert stats["torch_steps"] == 0, stats


def test_steps_that_only_view_a_product_replay_in_the_graph_and_their_results_outlive_replays():
    # (x @ w).t() and the chunks of a second product are steps of their own that only view: they
    # run no kernel and no PyTorch op, so the program is still one graph.
    def step(x, w, v):
        y = x @ w
        a, b = (y.tanh() @ v).chunk(2, -1)
        return y.t(), a.t(), b

    f = kiln.jit(step)
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    w = torch.randn(64, 64, device=DEVICE, generator=gen)
    v = torch.randn(64, 32, device=DEVICE, generator=gen)
    held = []
    for call in range(5):
        x = torch.randn(16, 64, device=DEVICE, generator=gen)
        got, want = f(x, w, v), step(x, w, v)
        for g, e in zip(got, want):
            close(g, e)
            assert g.stride() == e.stride()
        stats = kiln.last_stats(f)
        assert stats["torch_steps"] == 0 and stats["view_steps"] >= 1, stats
        assert stats["cuda_graph"] == _expected_graph(call), stats["cuda_graph_refused"]
        held.append((got, [t.clone() for t in want]))
    for got, want in held:
        for g, e in zip(got, want):
            close(g, e)


def test_a_multi_tensor_optimizer_step_replays_as_a_graph():
    # One launch of a multi-tensor kernel over every parameter (a 0-d step count each among its
    # results): the graph saves the host's work per member. Parameters, state and counts stay at
    # their addresses and are written in place each call, as eager's loop writes them.
    def step(params, grads, bufs, counts):
        for p, g, b, c in zip(params, grads, bufs, counts):
            c.add_(1)
            b.mul_(0.9).add_(g)
            p.sub_(b * (0.5 ** c))

    f = kiln.jit(step)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    shapes = [(3,), (64, 64), (4099,), (1,), (256, 3)]
    tensors = [[torch.randn(s, device=DEVICE, generator=gen) for s in shapes] for _ in range(3)]
    counts = [torch.zeros((), device=DEVICE) for _ in shapes]
    want = [[t.clone() for t in ts] for ts in tensors]
    want_counts = [c.clone() for c in counts]
    for call in range(6):
        f(*tensors, counts)
        step(*want, want_counts)
        for ts, ws in zip(tensors, want):
            for t, w in zip(ts, ws):
                close(t, w)
        for c, w in zip(counts, want_counts):
            assert c.item() == w.item()
        stats = kiln.last_stats(f)
        assert (stats["kernels"], stats["multi_tensor_steps"]) == (1, len(shapes))
        assert stats["cuda_graph"] == _expected_graph(call), stats["cuda_graph_refused"]


def test_a_backward_replays_as_a_graph_and_reports_its_results():
    # The backward program of a differentiated call replays as a graph too; last_stats reports
    # its results' (rebound, copied) as it does the forward's. Each call's gradients are checked
    # against eager's, and the gradients earlier calls returned keep their values.
    def step(x, w):
        return (F.linear(x, w).tanh() * x[:, :64]).square().sum()

    f = kiln.jit(step)
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    w = (torch.randn(64, 128, device=DEVICE, generator=gen) / 8).requires_grad_()
    w_eager = w.detach().clone().requires_grad_()
    held = []
    for call in range(6):
        x = torch.randn(512, 128, device=DEVICE, generator=gen).requires_grad_()
        x_eager = x.detach().clone().requires_grad_()
        gx, gw = torch.autograd.grad(f(x, w), (x, w))
        ex, ew = torch.autograd.grad(step(x_eager, w_eager), (x_eager, w_eager))
        close(gx, ex)
        close(gw, ew)
        backward = kiln.last_stats(f)["backward"]
        assert backward["cuda_graph"] == _expected_graph(call), backward["cuda_graph_refused"]
        rebound, copied = backward["cuda_graph_results"]
        if call > 2:
            assert rebound + copied >= 2, backward  # the two gradients, at least
        elif call < 2:
            assert (rebound, copied) == (0, 0), backward  # no graph yet
        held.append(((gx, gw), (ex.clone(), ew.clone())))
    for got, want in held:
        for g, e in zip(got, want):
            close(g, e)
