"""The numpy engine's generated straight-line program: the same results as the loop over the program,
views of fixed buffers computed once, feeds checked once per signature, errors naming the op."""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opgraph
from opgraph.backends.numpy import CompiledGraph
from opgraph.backends.numpy import arena as numpy_backend
from opgraph.errors import ExecutionError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_models import MODELS, build

from test_memory import random_graph


def looped(graph: opgraph.Graph) -> _Looped:
    """The same graph run by the loop over the program (the path of programs longer than CODEGEN_LIMIT)."""
    return _Looped(CompiledGraph(graph))


class _Looped:
    """A CompiledGraph called through its loop (its generated functions are never built)."""

    def __init__(self, f: CompiledGraph) -> None:
        self.f = f

    def __call__(self, feeds: dict | None = None, **named: object) -> list[np.ndarray]:
        with self.f._lock:
            return self.f._run({**(feeds or {}), **named})

    def state(self, key: object) -> np.ndarray:
        return self.f.state(key)


def assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_generated_equals_loop(name: str) -> None:
    g, feeds, _ = build(name, scale=0.1)
    gen, loop = CompiledGraph(g), looped(g)
    for _ in range(2):
        assert_same(gen(feeds), loop(feeds))
    assert "def _program(" in gen.code


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 30))
def test_random_graphs_generated_equals_loop_and_executor(seed: int, n_ops: int) -> None:
    g, feeds = random_graph(seed, n_ops)
    gen = CompiledGraph(g)
    loop = looped(g)
    want = g.run(feeds)
    for _ in range(2):
        got = gen(feeds)
        assert_same(got, loop(feeds))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def state_graph() -> opgraph.Graph:
    """Two state variables; views (reshape, transpose) of the state and of arena values; an output that is
    a view of the state."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3, 4)), name="x")
    s = b.input(("float64", (3, 4)), name="s")
    t = b.input(("float64", (4,)), name="t")
    y = b.op("exp", b.op("multiply", x, 0.5))
    s2 = b.op("add", s, y)
    t2 = b.op("add", t, b.op("sum", b.op("permute_dims", s2, axes=(1, 0)), axis=(1,)))
    b.update(s2, s)
    b.update(t2, t)
    b.output(b.op("reshape", s2, shape=(12,)), b.op("permute_dims", y, axes=(1, 0)), t2)
    return b.freeze()


def test_update_edges_over_many_calls_match_loop_and_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    g = state_graph()
    gen, loop = CompiledGraph(g), looped(g)
    rng = np.random.default_rng(0)
    s, t = np.zeros((3, 4)), np.zeros(4)
    first = {"s": s, "t": t}
    for call in range(5):
        x = rng.standard_normal((3, 4))
        a = gen({"x": x, **first}) if call == 0 else gen(x=x)
        b = loop({"x": x, **first}) if call == 0 else loop(x=x)
        assert_same(a, b)
        y = np.exp(0.5 * x)
        s = s + y
        t = t + s.sum(axis=0)
        np.testing.assert_allclose(a[0], s.ravel())
        np.testing.assert_allclose(a[1], y.T)
        np.testing.assert_allclose(a[2], t)
        np.testing.assert_allclose(gen.state("s"), s)
    # results are the caller's: never a view of the arena or of the state buffers
    out = gen(x=np.ones((3, 4)))
    for arr in out:
        assert not np.shares_memory(arr, gen.arena)
        for bufs in gen._state_bufs.values():
            assert not any(np.shares_memory(arr, buf) for buf in bufs)


def test_views_of_fixed_buffers_are_computed_once_and_follow_the_data() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)), name="x")
    e = b.op("exp", x)
    t = b.op("permute_dims", e, axes=(1, 0))
    flat_t = b.op("reshape", t, shape=(6,))  # a copy (t is transposed): never computed ahead
    b.output(b.op("sum", b.op("reshape", e, shape=(6,)), axis=(0,)), b.op("multiply", t, 2.0), flat_t)
    f = CompiledGraph(b.freeze())
    body = f.code.splitlines()[1:-1]  # between the def and the return
    # exp, sum, multiply and the copying reshape; the transpose and the other reshape are bound once
    assert len([line for line in body if "_empty" not in line]) == 4
    for k in range(3):
        x0 = np.arange(6.0).reshape(2, 3) * k
        total, twice, flat = f(x=x0)
        np.testing.assert_allclose(total, np.exp(x0).sum())
        np.testing.assert_allclose(twice, 2 * np.exp(x0).T)
        np.testing.assert_allclose(flat, np.exp(x0).T.reshape(6))


def test_feeds_checked_once_per_signature_but_every_call() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (3,)), name="x")
    y = b.input(("float32", (3,)), name="y")
    b.output(b.op("add", x, y))
    g = b.freeze()
    f = CompiledGraph(g)
    one = np.ones(3, np.float32)
    np.testing.assert_array_equal(f(x=one, y=one)[0], 2 * one)
    np.testing.assert_array_equal(f(y=one, x=2 * one)[0], 3 * one)  # another key order: another signature
    np.testing.assert_array_equal(f({0: one, g.inputs[1]: one})[0], 2 * one)  # ids as keys
    np.testing.assert_array_equal(f(x=[1, 2, 3], y=one)[0], np.array([2, 3, 4], np.float32))  # a list: coerced
    with pytest.raises(ExecutionError, match="expects"):
        f(x=np.ones(4, np.float32), y=one)  # same signature as before, wrong shape: still refused
    with pytest.raises(ExecutionError, match="expects"):
        f(x=np.ones(3, np.complex64), y=one)
    with pytest.raises(ExecutionError, match="missing feed for input"):
        f(x=one)
    with pytest.raises(KeyError):
        f(z=one)


def test_a_failing_kernel_is_named_in_the_error() -> None:
    b = opgraph.GraphBuilder()
    a = b.input(("float64", (2, 2)), name="a")
    b.output(b.op("exp", b.op("cholesky", b.op("negative", a))))
    f = CompiledGraph(b.freeze())
    np.testing.assert_allclose(f(a=-np.eye(2))[0], np.exp(np.eye(2)))
    with pytest.raises(ExecutionError, match=r"op \d+ \(cholesky\) failed: LinAlgError"):
        f(a=np.eye(2))


def test_a_call_allocates_only_its_outputs() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (256, 256)), name="x")
    h = x
    for _ in range(6):
        h = b.op("tanh", b.op("add", b.op("matmul", h, x), 1.0))
    b.output(b.op("sum", h, axis=(0,)))
    f = CompiledGraph(b.freeze())
    data = np.random.default_rng(0).standard_normal((256, 256)) / 256
    f(x=data)
    tracemalloc.start()
    f(x=data)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 16 * 1024  # the (256,) output and bookkeeping; no (256, 256) temporary


def test_dynamic_shapes_multi_output_and_batch_sliced_ops_match_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    b = opgraph.GraphBuilder()
    d = b.input(("float64", (None, 6)), name="d")
    x = b.input(("float32", (32, 16, 48, 48)), name="x")
    w = b.constant(np.random.default_rng(2).standard_normal((16, 16, 3, 3)).astype(np.float32))
    conv = b.op("conv2d", x, w, stride=(1, 1), padding=(1, 1))
    s1, s2 = b.op("split", b.op("sin", b.op("reshape", b.op("exp", d), shape=(-1, 2))), sections=2, axis=1)
    b.output(b.op("add", s1, s2), b.op("max_pool2d", b.op("relu", conv), kernel_size=2))
    g = b.freeze()
    gen, loop = CompiledGraph(g), looped(g)
    assert gen._chunks, "the pooling runs on slices of the batch"
    rng = np.random.default_rng(3)
    for rows in (2, 5):
        feeds = {"d": rng.standard_normal((rows, 6)), "x": rng.standard_normal((32, 16, 48, 48)).astype(np.float32)}
        assert_same(gen(feeds), loop(feeds))


def test_programs_longer_than_the_limit_run_in_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    g = state_graph()
    monkeypatch.setattr(numpy_backend, "CODEGEN_LIMIT", 2)
    f, ref = CompiledGraph(g), looped(g)
    assert "loop over the program" in f.code
    feeds = {"x": np.ones((3, 4)), "s": np.zeros((3, 4)), "t": np.zeros(4)}
    assert_same(f(feeds), ref(feeds))
    assert_same(f(x=np.ones((3, 4))), ref(x=np.ones((3, 4))))
