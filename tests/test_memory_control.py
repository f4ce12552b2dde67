"""Memory plans of graphs with control flow, and running them: compiled engine, runtime, incremental evaluation.

References: byte counts worked out from the types by hand, plain Python loops over NumPy for values,
tracemalloc for the engine's real peak, counted body calls (hooks.BODY wrapped) for incremental evaluation.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.core.graph import Graph
from opgraph.core.subgraph import Subgraph
from opgraph.memory import plan_memory
from opgraph.memory.plan import ALIGN, check_plan
from opgraph.runtime.compiled import Program

N = 1000
V = ("float64", (N,))
S = ("float64", ())


def nbytes(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def body(fn: Any, *types: Any, names: str = "abcdefgh", name: str = "f") -> Subgraph:
    b = opgraph.GraphBuilder()
    ins = [b.input(t, name=names[i]) for i, t in enumerate(types)]
    outs = fn(b, *ins)
    b.output(*(outs if isinstance(outs, tuple) else (outs,)))
    return Subgraph(b.freeze(), name=name)


def while_graph(trips: int | None) -> Graph:
    """x -> while i < n: i += 1; x = sin(x) * 0.5 + x; then exp. ``n`` a constant, or the input ``n``."""
    cond = body(lambda b, n, i, x: b.less(i, n), S, S, V, names="nix", name="test")
    step = body(lambda b, n, i, x: (b.add(i, 1.0), b.add(b.multiply(b.sin(x), 0.5), x)), S, S, V,
                names="nix", name="step")
    b = opgraph.GraphBuilder()
    n = b.input(S, name="n") if trips is None else b.constant(float(trips))
    x = b.input(V, name="x")
    _, xo = b.op("while_loop", n, b.constant(0.0), x, cond_body=cond, body=step, num_consts=1)
    b.output(b.exp(xo))
    return b.freeze()


def reference_while(x: np.ndarray, trips: int) -> np.ndarray:
    for _ in range(trips):
        x = np.sin(x) * 0.5 + x
    return np.exp(x)


# ---------------------------------------------------------------- plans
def test_plan_peak_counts_a_call_body_as_workspace() -> None:
    # body: t = exp(x) (arena), out = t * t (the body's own output buffer): 2 * 8000 bytes
    f = body(lambda b, x: b.multiply(b.exp(x), b.sin(x)), V, names="x")
    bp = plan_memory(f.graph)
    check_plan(bp)
    assert bp.peak == bp.total_bytes and bp.workspace_bytes == 0
    assert bp.total_bytes >= 2 * nbytes(8 * N)          # exp(x) and sin(x) are alive together, plus the output
    b = opgraph.GraphBuilder()
    x = b.input(V, name="x")
    b.output(b.op("call", x, body=f))
    p = plan_memory(b.freeze())
    assert p.total_bytes == nbytes(8 * N)                 # the call's output buffer
    assert p.workspace_bytes == bp.peak
    assert p.peak == p.total_bytes + bp.peak
    assert p.stats()["peak_bytes"] == p.peak


def test_nested_bodies_add_up() -> None:
    inner = body(lambda b, x: b.exp(x), V, names="x", name="inner")
    outer = body(lambda b, x: b.sin(b.op("call", x, body=inner)), V, names="x", name="outer")
    b = opgraph.GraphBuilder()
    x = b.input(V, name="x")
    b.output(b.op("call", x, body=outer))
    p = plan_memory(b.freeze())
    inner_peak = plan_memory(inner.graph).total_bytes
    outer_plan = plan_memory(outer.graph)
    assert outer_plan.workspace_bytes == inner_peak
    assert p.workspace_bytes == outer_plan.total_bytes + inner_peak


def test_while_loop_plan_does_not_depend_on_the_trip_count() -> None:
    peaks = {t: plan_memory(while_graph(t)).peak for t in (10, 10_000)}
    assert peaks[10] == peaks[10_000]
    p = plan_memory(while_graph(10))
    step_peak = plan_memory(p.graph.subgraphs[1].graph).peak
    test_peak = plan_memory(p.graph.subgraphs[0].graph).peak
    carry = 8 + 8 * N
    assert p.workspace_bytes == step_peak + test_peak + carry


def test_scan_stacked_results_scale_with_length_and_carry_does_not() -> None:
    step = body(lambda b, c, x: (b.add(c, x), b.multiply(c, x)), V, V, names="cx", name="step")

    def plan(n: int) -> Any:
        b = opgraph.GraphBuilder()
        c0, xs = b.input(V, name="c0"), b.input(("float64", (n, N)), name="xs")
        b.output(*b.op("scan", c0, xs, body=step, num_carry=1))
        return plan_memory(b.freeze())

    p10, p100 = plan(10), plan(100)
    assert p10.workspace_bytes == p100.workspace_bytes == plan_memory(step.graph).peak + 8 * N
    assert p100.total_bytes - p10.total_bytes == nbytes(8 * N * 100) - nbytes(8 * N * 10)


def _engine_peak(run: Any) -> int:
    run()  # compile the bodies, warm caches
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_numpy_engine_peak_of_a_while_loop_does_not_grow_with_trips() -> None:
    g = while_graph(None)
    c = opgraph.compile(g)
    x = np.random.default_rng(0).standard_normal(N)
    peaks = {t: _engine_peak(lambda t=t: c({"n": np.array(float(t)), "x": x})) for t in (10, 10_000)}
    # one carry is 8 kB: a trip-count-proportional leak would be 80 MB at 10,000 trips
    assert peaks[10_000] <= peaks[10] + 8 * N, peaks
    np.testing.assert_allclose(c({"n": np.array(10.0), "x": x})[0], reference_while(x, 10), rtol=1e-12)


# ---------------------------------------------------------------- running
def nested_dynamic_graph() -> Graph:
    """scan over rows of xs (rows of unknown length); each step calls a cond whose branches run a scan."""
    D = ("float64", (None,))
    inner = body(lambda b, c, x: (b.add(c, b.multiply(x, x)),), S, S, names="cx", name="sumsq")

    def pos(b: Any, row: Any) -> Any:
        return b.op("scan", b.constant(0.0), row, body=inner, num_carry=1)

    then_b = body(pos, D, names="r", name="then")
    else_b = body(lambda b, row: b.negative(b.sum(row)), D, names="r", name="else")

    def step(b: Any, c: Any, row: Any) -> Any:
        v = b.op("cond", b.greater(b.sum(row), 0.0), row, then_body=then_b, else_body=else_b)
        return b.add(c, v), v

    stepb = body(step, S, D, names="cr", name="step")
    b = opgraph.GraphBuilder()
    xs = b.input(("float64", (None, None)), name="xs")
    b.output(*b.op("scan", b.constant(0.0), xs, body=stepb, num_carry=1))
    return b.freeze()


def reference_nested(xs: np.ndarray) -> tuple[float, np.ndarray]:
    c, ys = 0.0, []
    for row in xs:
        v = float(sum(x * x for x in row)) if row.sum() > 0 else -float(row.sum())
        c += v
        ys.append(v)
    return c, np.array(ys)


@pytest.mark.parametrize("shape", [(5, 3), (2, 7), (0, 4)])
def test_nested_bodies_with_dynamic_dims_run_everywhere(shape: tuple[int, int]) -> None:
    g = nested_dynamic_graph()
    xs = np.random.default_rng(sum(shape)).standard_normal(shape)
    c_ref, ys_ref = reference_nested(xs)
    runs = {
        "Graph.run": g.run({"xs": xs}),
        "compile": opgraph.compile(g)({"xs": xs}),
        "Program": Program(g, "numpy")({"xs": xs}),
        "optimized": opgraph.compile(opgraph.optimize(g, level=3))({"xs": xs}),
    }
    for where, (c, ys) in runs.items():
        np.testing.assert_allclose(c, c_ref, rtol=1e-12, err_msg=where)
        np.testing.assert_allclose(ys, ys_ref, rtol=1e-12, err_msg=where)
    cg = opgraph.compile(g)
    assert cg({"xs": xs})[0] is not cg({"xs": xs})[0]      # fresh results every call


def test_generated_code_calls_the_loop_kernel() -> None:
    g = while_graph(None)
    c = opgraph.compile(g)
    x = np.linspace(-1, 1, N)
    assert "cond_body=" in c.code                       # the loop is one kernel call in the generated program
    for t in (0, 1, 7):
        np.testing.assert_allclose(c({"n": np.array(float(t)), "x": x})[0], reference_while(x, t), rtol=1e-12)


# ---------------------------------------------------------------- incremental evaluation
def incremental_graph() -> Graph:
    """out0 = while_loop(n, x) ; out1 = sin(y) + sum(out0): y does not reach the loop.

    The loop's result is an output, so it has its own buffer: a consumer computing in place over it
    would make the context see it overwritten and run the loop again (the EvalContext's rule for
    values that share bytes)."""
    cond = body(lambda b, n, i, x: b.less(i, n), S, S, V, names="nix", name="test")
    step = body(lambda b, n, i, x: (b.add(i, 1.0), b.add(b.multiply(b.sin(x), 0.5), x)), S, S, V,
                names="nix", name="step")
    b = opgraph.GraphBuilder()
    n, x, y = b.input(S, name="n"), b.input(V, name="x"), b.input(V, name="y")
    _, xo = b.op("while_loop", n, b.constant(0.0), x, cond_body=cond, body=step, num_consts=1)
    b.output(xo, b.add(b.sin(y), b.sum(xo)))
    return b.freeze()


def reference_loop(x: np.ndarray, trips: int) -> np.ndarray:
    return np.log(reference_while(x, trips))


@pytest.mark.parametrize("engine", ["EvalContext", "ProgramContext"])
def test_incremental_evaluation_treats_a_loop_as_one_unit(engine: str, body_calls: dict[str, int]) -> None:
    g = incremental_graph()
    ctx: Any = opgraph.compile(g).context() if engine == "EvalContext" else Program(g, "numpy").context()
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(N), rng.standard_normal(N)
    for k, v in (("n", np.array(4.0)), ("x", x), ("y", y)):
        ctx.set(k, v)
    out0 = g.outputs[0]
    np.testing.assert_allclose(ctx.get(out0), reference_loop(x, 4), rtol=1e-12)
    assert body_calls == {"test": 5, "step": 4}
    # nothing changed, or only an input the loop does not read: the loop does not run again
    ctx.get(out0)
    ctx.set("y", rng.standard_normal(N))
    ctx.get(out0)
    assert body_calls == {"test": 5, "step": 4}
    # an input only the loop reads: the loop runs once more, as one unit
    x2 = rng.standard_normal(N)
    ctx.set("x", x2)
    np.testing.assert_allclose(ctx.get(out0), reference_loop(x2, 4), rtol=1e-12)
    assert body_calls == {"test": 10, "step": 8}
    ctx.set("n", np.array(2.0))
    np.testing.assert_allclose(ctx.get(out0), reference_loop(x2, 2), rtol=1e-12)
    assert body_calls == {"test": 13, "step": 10}
    if engine == "EvalContext":
        before = ctx.kernel_calls
        ctx.set("y", y)
        got = ctx.get(g.outputs[1])                  # sin, sum, add: the loop's result is still valid
        assert ctx.kernel_calls - before == 3 and body_calls == {"test": 13, "step": 10}
        np.testing.assert_allclose(got, np.sin(y) + reference_loop(x2, 2).sum(), rtol=1e-12)
