"""The compiled runtime: equal to the plain executor, one arena, update edges, incremental evaluation, threads."""

from __future__ import annotations

import sys
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opgraph
from opgraph.errors import ExecutionError
from opgraph.runtime.compiled import compile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_models import MODELS, build

from test_memory import random_graph


def assert_close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_match_executor_and_eager(name: str) -> None:
    g, feeds, eager = build(name, scale=0.1)
    f = compile(g)
    want = g.run(feeds)
    assert_close(f(feeds), want)
    assert_close(f(feeds), want)  # second call on the same arena
    for a, b in zip(eager(feeds), want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 25))
def test_random_graphs_match_executor(seed: int, n_ops: int) -> None:
    g, feeds = random_graph(seed, n_ops)
    f = compile(g)
    want = g.run(feeds)
    assert_close(f(feeds), want)
    assert_close(f(feeds), want)
    for sched in ("dfs", "greedy"):
        assert_close(compile(g, schedule=sched)(feeds), want)


def test_arena_is_allocated_once_and_outputs_do_not_alias_it() -> None:
    g, feeds, _ = build("resnet", scale=0.1)
    f = compile(g)
    arena = f.arena
    ptr = arena.ctypes.data
    first = f(feeds)[0]
    keep = first.copy()
    second = f(feeds)[0]
    assert f.arena is arena and f.arena.ctypes.data == ptr
    for out in (first, second):
        assert not np.shares_memory(out, arena)
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, keep)  # the second call did not overwrite the first result


def test_no_per_step_allocation() -> None:
    # a 20-op chain: one call allocates only its output buffer (the chain runs in place inside it)
    g, feeds, _ = build("chain", scale=1 / 16)
    f = compile(g)
    f(feeds)
    nbytes = feeds["x"].nbytes
    tracemalloc.start()
    try:
        f(feeds)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.2 * nbytes + 64 * 1024
    assert all(step[5] == 1 for step in f.program)  # every kernel writes into a planned buffer


def test_views_dynamic_shapes_and_multi_output_ops() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (4, 6)), name="x")
    d = b.input(("float64", (None, 6)), name="d")
    r = b.op("reshape", b.op("exp", x), shape=(6, 4))
    t = b.op("permute_dims", r, axes=(1, 0))
    s1, s2 = b.op("split", b.op("sin", t), sections=2, axis=1)
    dyn = b.op("reshape", b.op("exp", d), shape=(-1,))  # dynamic: allocated at run time, a view made a copy
    tail = b.op("sum", b.op("tanh", dyn))
    b.output(b.op("add", s1, s2), tail, b.op("getitem", t, index=(slice(None), 0)))
    g = b.freeze()
    f = compile(g)
    rng = np.random.default_rng(1)
    for rows in (2, 5):
        feeds = {"x": rng.standard_normal((4, 6)), "d": rng.standard_normal((rows, 6))}
        assert_close(f(feeds), g.run(feeds))


def test_outputs_that_are_inputs_or_constants_are_copies() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    c = b.constant(np.arange(3.0))
    b.output(x, c, b.op("add", x, c))
    f = compile(b.freeze())
    data = np.ones(3)
    out = f(x=data)
    assert not np.shares_memory(out[0], data)
    out[1][0] = 42.0  # writable copy; the graph's constant is unchanged
    np.testing.assert_array_equal(f(x=data)[1], np.arange(3.0))


def test_missing_feed_and_bad_feed() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    b.output(b.op("exp", x))
    f = compile(b.freeze())
    with pytest.raises(ExecutionError, match="missing feed"):
        f()
    with pytest.raises(ExecutionError, match="expects"):
        f(x=np.ones(4))


def test_threads_share_one_compiled_graph_safely() -> None:
    g, feeds, _ = build("mlp", scale=0.1)
    f = compile(g)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(feeds["x"].shape).astype(np.float32) for _ in range(8)]
    want = [g.run({"x": x})[0] for x in inputs]
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(20):
                got[i] = f(x=inputs[i])[0]
                np.testing.assert_allclose(got[i], want[i], rtol=1e-5, atol=1e-6)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# ----------------------------------------------------------------------------- update edges
def training_step(n: int = 16, d: int = 8, k: int = 4, lr: float = 0.01) -> tuple[opgraph.Graph, dict[str, np.ndarray]]:
    """Linear least squares: loss = sum((x @ p - y)^2), p_new = p - lr * 2 x^T (x @ p - y)."""
    b = opgraph.GraphBuilder()
    p = b.input(("float64", (d, k)), name="p")
    x = b.input(("float64", (n, d)), name="x")
    y = b.input(("float64", (n, k)), name="y")
    r = b.op("subtract", b.op("matmul", x, p), y)
    loss = b.op("sum", b.op("square", r))
    grad = b.op("multiply", b.op("matmul", b.op("permute_dims", x, axes=(1, 0)), r), 2.0)
    p_new = b.op("subtract", p, b.op("multiply", grad, lr))
    b.output(loss)
    b.update(p_new, p)
    rng = np.random.default_rng(0)
    feeds = {"p": rng.standard_normal((d, k)), "x": rng.standard_normal((n, d)), "y": rng.standard_normal((n, k))}
    return b.freeze(), feeds


def test_training_step_compiled_once_called_many_times() -> None:
    g, feeds = training_step()
    f = compile(g)
    p_src, _p_dst = (int(v) for v in g.updates[0])
    # by hand with the plain executor
    p = feeds["p"]
    want_losses = []
    for _ in range(10):
        loss, p = g.run({**feeds, "p": p}, [g.outputs[0], p_src])
        want_losses.append(float(loss))
    got_losses = [float(f(feeds)[0])]
    before = f.kernel_calls
    for _ in range(9):
        got_losses.append(float(f(x=feeds["x"], y=feeds["y"])[0]))  # p comes from the update edge
    assert f.kernel_calls - before == 9 * len(f.program)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-10)
    np.testing.assert_allclose(f.state("p"), p, rtol=1e-10)
    assert got_losses[-1] < got_losses[0]


def test_update_edges_swap_buffers_without_copy() -> None:
    g, feeds = training_step()
    f = compile(g)
    src = int(g.updates[0, 0])
    assert f.plan.bins[f.plan.placement[src][0]].kind == "state"
    f(feeds)
    bufs = f._state_bufs[f.plan.placement[src][0]]
    held = f._state[int(g.updates[0, 1])]
    assert np.shares_memory(held, bufs[0]) or np.shares_memory(held, bufs[1])
    f(x=feeds["x"], y=feeds["y"])
    held2 = f._state[int(g.updates[0, 1])]
    assert not np.shares_memory(held, held2)  # the other buffer of the pair
    f(x=feeds["x"], y=feeds["y"])
    assert np.shares_memory(f._state[int(g.updates[0, 1])], held)  # and back


def test_two_state_variables_and_one_source_for_two_destinations() -> None:
    b = opgraph.GraphBuilder()
    s = b.input(("float64", (3,)), name="s")
    t = b.input(("float64", (3,)), name="t")
    u = b.input(("float64", (3,)), name="u")
    s_new = b.op("add", s, t)
    t_new = b.op("multiply", t, 2.0)
    b.output(b.op("sum", s_new))
    b.update(s_new, s)
    b.update(t_new, t)
    b.update(t_new, u)  # the same source twice: the second destination gets a copy
    f = compile(b.freeze())
    s0, t0 = np.ones(3), np.arange(3.0)
    f(s=s0, t=t0, u=np.zeros(3))
    for src, dst in ((s_new, s), (t_new, t)):
        bufs = f._state_bufs[f.plan.placement[src.id][0]]
        assert any(np.shares_memory(f._state[dst.id], x) for x in bufs)  # swapped, not copied
    assert not np.shares_memory(f._state[u.id], f._state[t.id])
    want_s, want_t = s0 + t0, t0 * 2
    for _ in range(3):
        got = f()[0]
        assert got == pytest.approx((want_s + want_t).sum())
        want_s, want_t = want_s + want_t, want_t * 2
    np.testing.assert_allclose(f.state("u"), want_t)
    np.testing.assert_allclose(f.state("t"), want_t)


def test_update_needs_initial_state_and_feed_overrides_it() -> None:
    b = opgraph.GraphBuilder()
    s = b.input(("float64", (2,)), name="s")
    b.output(s)
    b.update(b.op("add", s, 1.0), s)
    f = compile(b.freeze())
    with pytest.raises(ExecutionError, match="missing feed"):
        f()
    assert f(s=np.zeros(2))[0].tolist() == [0.0, 0.0]
    assert f()[0].tolist() == [1.0, 1.0]
    assert f(s=np.full(2, 10.0))[0].tolist() == [10.0, 10.0]
    assert f()[0].tolist() == [11.0, 11.0]


# ----------------------------------------------------------------------------- incremental evaluation
def two_branches() -> tuple[opgraph.Graph, dict[str, int]]:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (5,)), name="x")
    y = b.input(("float64", (5,)), name="y")
    ex = b.op("exp", x)
    ax = b.op("sum", b.op("tanh", ex))  # x branch: exp, tanh, sum
    ay = b.op("sum", b.op("sin", y))  # y branch: sin, sum
    out = b.op("add", ax, ay)
    b.output(out, ex, ax, ay)  # outputs are never overwritten, so nothing here shares bytes
    g = b.freeze()
    return g, {"out": out.id, "ax": ax.id, "ay": ay.id, "ex": ex.id}


def test_incremental_recomputes_only_descendants() -> None:
    g, ids = two_branches()
    ctx = compile(g).context()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(5), rng.standard_normal(5)
    ctx.set("x", x)
    ctx.set("y", y)
    np.testing.assert_allclose(ctx.get(ids["out"]), g.run({"x": x, "y": y})[0])
    assert ctx.kernel_calls == 6  # exp, tanh, sum, sin, sum, add
    ctx.get(ids["out"])
    assert ctx.kernel_calls == 6  # computed before: free
    y2 = rng.standard_normal(5)
    ctx.set("y", y2)
    np.testing.assert_allclose(ctx.get(ids["out"]), g.run({"x": x, "y": y2})[0])
    assert ctx.kernel_calls == 9  # sin, sum, add
    np.testing.assert_allclose(ctx.get(ids["ex"]), np.exp(x))
    assert ctx.kernel_calls == 9  # ex is an output: never overwritten, still valid
    x2 = rng.standard_normal(5)
    ctx.set("x", x2)
    np.testing.assert_allclose(ctx.get(ids["ay"]), np.sin(y2).sum())
    assert ctx.kernel_calls == 9  # ay does not depend on x
    np.testing.assert_allclose(ctx.get(ids["out"]), g.run({"x": x2, "y": y2})[0])
    assert ctx.kernel_calls == 13  # exp, tanh, sum, add


def test_incremental_values_sharing_a_block_invalidate_each_other() -> None:
    # a chain planned in place: every value shares one buffer, so asking for an early
    # value after the end was computed must recompute it (and the end afterwards)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (4,)), name="x")
    v1 = b.op("exp", x)
    v2 = b.op("sin", v1)
    v3 = b.op("tanh", v2)
    b.output(v3)
    f = compile(b.freeze())
    assert len(f.plan.inplace) == 2
    ctx = f.context()
    data = np.linspace(-1, 1, 4)
    ctx.set("x", data)
    np.testing.assert_allclose(ctx.get(v3), np.tanh(np.sin(np.exp(data))))
    assert ctx.kernel_calls == 3
    np.testing.assert_allclose(ctx.get(v1), np.exp(data))  # overwritten by v2, v3: recomputed
    assert ctx.kernel_calls == 4
    np.testing.assert_allclose(ctx.get(v3), np.tanh(np.sin(np.exp(data))))  # v1 overwrote v3: sin, tanh
    assert ctx.kernel_calls == 6


def test_incremental_update_edges() -> None:
    g, feeds = training_step()
    ctx = compile(g).context()
    for k, v in feeds.items():
        ctx.set(k, v)
    p = feeds["p"]
    for _ in range(3):
        loss, p_want = g.run({**feeds, "p": p}, [g.outputs[0], g.updates[0, 0]])
        np.testing.assert_allclose(ctx.get(g.outputs[0]), loss)
        ctx.update()
        p = p_want
        np.testing.assert_allclose(ctx.get("p"), p)
    calls = ctx.kernel_calls
    ctx.get(g.outputs[0])
    ctx.set("y", feeds["y"] * 2)  # y feeds r, loss, grad, p_new but not x^T
    ctx.get(g.outputs[0])
    assert ctx.kernel_calls - calls < len(compile(g).program)


def test_incremental_errors() -> None:
    g, ids = two_branches()
    ctx = compile(g).context()
    with pytest.raises(ExecutionError, match="not set"):
        ctx.get(ids["out"])
    with pytest.raises(ExecutionError, match="cannot be set"):
        ctx.set(ids["ex"], np.zeros(5))
