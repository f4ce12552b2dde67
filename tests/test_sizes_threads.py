"""Issue 15 (items 9 and 10): sizes beyond int64 are refused when types are built, compile refuses a memory plan
over the memory limit, and one GraphBuilder shared by threads builds a valid graph."""

from __future__ import annotations

import inspect
import math
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.core.types import TensorType
from opgraph.errors import GraphError, MemoryLimitError, OpBuildError, OpTypeError
from opgraph.memory import plan_memory, resolve_memory_limit
from opgraph.memory.limit import ENV_VAR, physical_memory
from opgraph.runtime.compiled import Program

INT64_MAX = int(np.iinfo(np.int64).max)


def _line_after() -> int:
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno + 1


# ----------------------------------------------------------------------------- sizes in types
@pytest.mark.parametrize("dtype", ["int8", "float32", "float64", "complex128"])
@pytest.mark.parametrize("shape", [(2**63,), (2**62, 2), (2**31, 2**31, 2), (0, 2**64), (None, 2**40, 2**40),
                                   (3, 2**61), (2**62,), (2**60 - 1,), (2**63 - 1,), (0, 2**63 - 1), (None, 2**62)])
def test_type_sizes_against_int64(dtype: str, shape: tuple[int | None, ...]) -> None:
    known = [d for d in shape if d is not None]
    itemsize = np.dtype(dtype).itemsize
    # The reference: Python's unbounded ints.
    fits = all(d <= INT64_MAX for d in known) and math.prod(known) * itemsize <= INT64_MAX
    if fits:
        t = TensorType(dtype, shape)
        if None not in shape:
            assert t.size == math.prod(shape) and t.nbytes == math.prod(shape) * itemsize
    else:
        with pytest.raises(OpTypeError, match=r"shape \[.*more than 2\*\*63-1") as info:
            TensorType(dtype, shape)
        assert str(shape[-1]) in str(info.value)  # the message shows the shape


def test_type_size_matches_numpy_for_real_arrays() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        a = np.zeros(tuple(int(d) for d in rng.integers(0, 5, size=rng.integers(0, 4))), dtype=np.float32)
        t = TensorType.of(a)
        assert (t.size, t.nbytes) == (a.size, a.nbytes)


def test_builder_input_too_large_names_op_and_line() -> None:
    b = opgraph.GraphBuilder()
    line = _line_after()
    with pytest.raises(OpBuildError) as info:
        b.input(("float64", (2**63,)))
    err = info.value
    assert err.op == "input" and err.location == f"{__file__}:{line + 1}"
    assert "[9223372036854775808]" in str(err) and isinstance(err, GraphError)
    with pytest.raises(OpBuildError, match="bytes, more than"):
        b.input("float64", (2**61,))
    assert b.num_values == 0  # nothing half-added
    assert b.input("int8", (2**63 - 1,)).type.nbytes == 2**63 - 1


def test_op_output_too_large_is_a_build_error_naming_the_op() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2**31,)))
    with pytest.raises(OpBuildError, match=r"broadcast_to\(f64\[2147483648\]\): shape .* elements, more than") as i:
        b.op("broadcast_to", x, shape=(2**40, 2**40, 2**31))
    assert i.value.location is not None and i.value.location.startswith(__file__)


@pytest.mark.parametrize("target", [(2**62, 3), (2**40, 2**40), (2**32, 2**32, 2**32), (2**62, 3, -1), (-1, 2**62, 3)])
def test_reshape_error_prints_true_sizes(target: tuple[int, ...]) -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2**31,)))
    with pytest.raises(OpBuildError) as info:
        b.op("reshape", x, shape=target)
    msg = str(info.value)
    assert "size -" not in msg
    if -1 not in target:
        assert f"(size {math.prod(target)})" in msg  # the Python-int size, not an int64 that wrapped


def test_reshape_still_matches_numpy() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (4, 6)), name="x")
    targets = [(24,), (2, -1), (-1, 3, 2), (6, 4)]
    ys = [b.op("reshape", x, shape=t) for t in targets]
    a = np.arange(24.0).reshape(4, 6)
    for y, t, got in zip(ys, targets, b.run({x: a}, ys), strict=True):
        assert y.type.shape == a.reshape(t).shape
        np.testing.assert_array_equal(got, a.reshape(t))
    with pytest.raises(OpBuildError, match=r"\(size 25\)"):
        b.op("reshape", x, shape=(5, 5))


# ----------------------------------------------------------------------------- memory limit
def _wide_graph(sizes: list[int]) -> tuple[opgraph.Graph, Any]:
    """One input; per size a value of that many float64 elements, all alive until a final sum (no reuse)."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", ()), name="x")
    parts = []
    for i, n in enumerate(sizes):
        y = b.op("broadcast_to", b.op("multiply", x, float(i + 1)), shape=(n,))
        parts.append(b.op("sum", b.op("exp", y, name=f"big{i}")))
    total = parts[0]
    for p in parts[1:]:
        total = b.op("add", total, p)
    b.output(total)
    return b.freeze(), x


def test_compile_refuses_plan_over_limit_and_names_largest_buffers() -> None:
    sizes = [1000, 7000, 3000, 5000, 2000, 6000, 4000]
    g, _ = _wide_graph(sizes)
    plan = plan_memory(g)
    total = plan.total_bytes
    with pytest.raises(MemoryLimitError) as info:
        opgraph.compile(g, memory_limit=total - 1)
    err = info.value
    assert isinstance(err, GraphError) and isinstance(err, MemoryError)
    assert (err.planned, err.limit) == (total, total - 1)
    msg = str(err)
    assert f"needs {total} bytes" in msg and f"limit of {total - 1} bytes" in msg
    listed = [line for line in msg.splitlines() if line.startswith("  ")]
    assert len(listed) == 5
    # the five largest exp outputs, largest first: op index, kind, name and bytes from the graph
    want = sorted(range(len(sizes)), key=lambda i: -sizes[i])[:5]
    names = {name: op for op, name in g.symbols.ops.items()}
    for line, i in zip(listed, want, strict=True):
        op = names[f"big{i}"]
        assert line.startswith(f"  {sizes[i] * 8} bytes") and f"op {op} (exp)" in line and f"'big{i}'" in line


def test_compile_within_limit_or_disabled_runs() -> None:
    g, _ = _wide_graph([100, 300])
    want = np.exp(np.full(100, 0.5)).sum() + np.exp(np.full(300, 1.0)).sum()
    total = plan_memory(g).total_bytes
    for limit in (total, None, 0, "1G"):
        f = opgraph.compile(g, memory_limit=limit)
        np.testing.assert_allclose(f(x=np.float64(0.5))[0], want)


def test_memory_limit_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    g, _ = _wide_graph([100, 300])
    monkeypatch.setenv(ENV_VAR, "1K")
    with pytest.raises(MemoryLimitError, match=r"limit of 1024 bytes .*OPGRAPH_MEMORY_LIMIT"):
        opgraph.compile(g)
    opgraph.compile(g, memory_limit=None)  # the keyword wins
    monkeypatch.setenv(ENV_VAR, "none")
    assert resolve_memory_limit() is None
    opgraph.compile(g)
    monkeypatch.setenv(ENV_VAR, "lots")
    with pytest.raises(ValueError, match="memory limit"):
        opgraph.compile(g)


def test_default_limit_is_physical_ram(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv(ENV_VAR, raising=False)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert physical_memory() == ram == resolve_memory_limit("auto")
    # 2**47 float64 = 1 PiB: far beyond any machine's RAM; refused before anything is allocated
    g, _ = _wide_graph([2**47])
    with pytest.raises(MemoryLimitError, match="physical RAM") as info:
        opgraph.compile(g)
    assert info.value.limit == ram and info.value.planned >= 2**50


def test_memory_limit_on_partitioned_program_numpy_regions() -> None:
    g, _ = _wide_graph([1000, 2000])
    with pytest.raises(MemoryLimitError):
        Program(g, "numpy", memory_limit=1000)
    f = Program(g, "numpy", memory_limit=None)
    want = np.exp(np.full(1000, 2.0)).sum() + np.exp(np.full(2000, 4.0)).sum()
    np.testing.assert_allclose(f({"x": np.float64(2.0)})[0], want)


@pytest.mark.parametrize("bad", [-1, True, [1]])
def test_memory_limit_rejects_bad_values(bad: Any) -> None:
    g, _ = _wide_graph([10])
    with pytest.raises((TypeError, ValueError)):
        opgraph.compile(g, memory_limit=bad)


# ----------------------------------------------------------------------------- one builder, many threads
@pytest.fixture
def fast_switches() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # provoke thread switches inside the builder's critical sections
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _chain(b: opgraph.GraphBuilder, x: Any, k: int, steps: int) -> Any:
    """Ops through every path of the builder: fast unary/binary, numbers (constants), attributes, names."""
    y = x
    for s in range(steps):
        r = s % 5
        if r == 0:
            y = b.tanh(y)
        elif r == 1:
            y = b.add(y, x)
        elif r == 2:
            y = b.multiply(y, 0.5 + k)  # a constant (hash-consed per value)
        elif r == 3:
            y = b.op("reshape", b.op("reshape", y, shape=(2, 3)), shape=(6,))
        else:
            y = b.op("sin", y, name=f"t{k}s{s}")
    return y


def _np_chain(x: np.ndarray, k: int, steps: int) -> np.ndarray:
    y = x
    for s in range(steps):
        r = s % 5
        y = (np.tanh(y) if r == 0 else y + x if r == 1 else y * (0.5 + k) if r == 2
             else y.reshape(2, 3).reshape(6) if r == 3 else np.sin(y))
    return y


def _run_threads(n: int, target: Callable[[int], None]) -> None:
    start = threading.Barrier(n)
    errors: list[BaseException] = []

    def body(k: int) -> None:
        try:
            start.wait()
            target(k)
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("hash_cons", [True, False])
def test_threads_share_one_builder(fast_switches: None, hash_cons: bool) -> None:
    n_threads, steps = 4, 120
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal(6) for _ in range(n_threads)]
    # The op count of the same chains built one after another, in one thread.
    ref = opgraph.GraphBuilder(hash_cons=hash_cons)
    for k in range(n_threads):
        half = _chain(ref, ref.input(("float64", (6,)), name=f"x{k}"), k, steps // 2)
        ref.output(_chain(ref, half, k + 100, steps - steps // 2))
    for _ in range(15):
        b = opgraph.GraphBuilder(hash_cons=hash_cons)
        outs: dict[int, Any] = {}
        frozen: list[opgraph.Graph] = []

        def work(k: int, b: opgraph.GraphBuilder = b, outs: dict[int, Any] = outs,
                 frozen: list[opgraph.Graph] = frozen) -> None:
            x = b.input(("float64", (6,)), name=f"x{k}")
            outs[k] = _chain(b, x, k, steps // 2)
            frozen.append(b.freeze())  # freezing while the others build
            outs[k] = _chain(b, outs[k], k + 100, steps - steps // 2)

        _run_threads(n_threads, work)
        b.output(*[outs[k] for k in range(n_threads)])
        g = b.freeze()
        g.verify()
        for f in frozen:
            f.verify()
        assert (g.num_ops, g.num_values, len(g.constants)) == (
            ref.num_ops, ref.num_values, len(ref.freeze().constants))
        got = b.run({f"x{k}": feeds[k] for k in range(n_threads)})
        for k in range(n_threads):
            want = _np_chain(_np_chain(feeds[k], k, steps // 2), k + 100, steps - steps // 2)
            np.testing.assert_allclose(got[k], want, rtol=1e-12)


def test_threads_hash_cons_identical_ops_once(fast_switches: None) -> None:
    """All threads build the same ops on one shared input: hash-consing must keep exactly one copy of each."""
    steps = 150
    for _ in range(15):
        b = opgraph.GraphBuilder()
        x = b.input(("float64", (6,)), name="x")
        results: dict[int, int] = {}

        def work(k: int, b: opgraph.GraphBuilder = b, x: Any = x, results: dict[int, int] = results) -> None:
            results[k] = _chain(b, x, 0, steps).id

        _run_threads(4, work)
        assert len(set(results.values())) == 1
        ref = opgraph.GraphBuilder()
        ref_out = _chain(ref, ref.input(("float64", (6,)), name="x"), 0, steps)
        g = b.freeze()
        g.verify()
        assert (g.num_ops, g.num_values) == (ref.num_ops, ref.num_values)
        a = np.linspace(-1, 1, 6)
        np.testing.assert_allclose(b.run({"x": a}, [results[0]])[0], _np_chain(a, 0, steps), rtol=1e-12)
        np.testing.assert_allclose(ref.run({"x": a}, [ref_out])[0], _np_chain(a, 0, steps), rtol=1e-12)


def test_builder_error_in_one_thread_leaves_it_usable(fast_switches: None) -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (6,)), name="x")

    def work(k: int) -> None:
        for _ in range(50):
            with pytest.raises(OpBuildError):
                b.op("reshape", x, shape=(4, 4))  # a failing type rule must give the lock back
            b.exp(b.add(x, float(k)))

    _run_threads(4, work)
    g = b.freeze()
    g.verify()
    assert g.num_ops == 4 * 3  # per thread: a constant, add and exp (the rest hash-consed)
