"""The numba engine (register machine) end to end: random scalar graphs against NumPy, gradients against finite
differences, TensCalc's own files against TensCalc's values, a 10^6-op graph, and the Program surface (targets,
update edges, auto). The op suite (tests/test_backend_ops_numba.py) checks every claimed op kind."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opgraph
import opgraph.io
import opgraph.io.cg
import opgraph.numpy as onp
from opgraph import backends
from opgraph.backends.base import BackendError, OpInfo
from opgraph.core.registry import CONST, get_op
from opgraph.core.types import TensorType

pytest.importorskip("numba", reason="the numba engine is an optional extra (fast); make test installs it")

from opgraph.backends.numba import BACKEND
from opgraph.backends.numba.assemble import assemble
from opgraph.backends.numba.machine import ARITY, OP, Instructions, execute

DATA = os.environ.get("OPGRAPH_TENSCALC_DATA", "/work/shared/tenscalc")
CASES = sorted(d for d in os.listdir(DATA) if os.path.isfile(os.path.join(DATA, d, "reference.json"))) \
    if os.path.isdir(DATA) else []
SCALAR = ("add", "subtract", "multiply", "divide", "sin", "cos", "exp", "tanh", "maximum", "negative", "sqrt",
          "where", "less")


def scalar_graph(kinds: list[int], picks: list[tuple[int, int, int]], n_inputs: int) -> opgraph.Graph:
    """A random scalar DAG: op i applies SCALAR[kinds[i]] to earlier values chosen by picks[i]."""
    b = opgraph.GraphBuilder()
    vals = [b.input(("float64", ()), name=f"x{i}") for i in range(n_inputs)]
    for k, (i, j, m) in zip(kinds, picks, strict=True):
        kind = SCALAR[k % len(SCALAR)]
        a, c, d = vals[i % len(vals)], vals[j % len(vals)], vals[m % len(vals)]
        if kind == "where":
            v = b.op("where", b.op("less", a, c), c, d)
        elif kind == "less":
            v = b.op("cast", b.op("less", a, c), dtype="float64")
        elif kind == "sqrt":
            v = b.op("sqrt", b.op("abs", a))
        elif kind in ("sin", "cos", "exp", "tanh", "negative"):
            v = b.op(kind, b.op("multiply", a, 0.5) if kind == "exp" else a)
        else:
            v = b.op(kind, a, c)
        vals.append(v)
    b.output(vals[-1], vals[len(vals) // 2])
    return b.freeze()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4).flatmap(lambda n_in: st.tuples(
    st.just(n_in),
    st.lists(st.tuples(st.integers(0, 100), st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)),
             min_size=1, max_size=40),
    st.lists(st.floats(-3, 3), min_size=n_in, max_size=n_in))))
def test_random_scalar_graphs_match_numpy(case: tuple[int, list[tuple[int, int, int, int]], list[float]]) -> None:
    n_in, rows, xs = case
    # each op reads earlier values only: picks are taken modulo the values made so far
    g = scalar_graph([r[0] for r in rows], [(r[1], r[2], r[3]) for r in rows], n_in)
    feeds = [np.array(x) for x in xs]
    with np.errstate(all="ignore"):
        want = g.run(dict(zip([f"x{i}" for i in range(n_in)], feeds, strict=True)))
        got = opgraph.compile(g, backend="numba")(*feeds)
    for w, o in zip(want, got, strict=True):
        assert o.dtype == w.dtype and o.shape == w.shape
        np.testing.assert_allclose(o, w, rtol=1e-12, atol=1e-300, equal_nan=True)


def test_every_elementwise_opcode_agrees_with_numpy() -> None:
    # the interpreter itself, opcode by opcode, on values that reach the edges (zeros, signs, NaN, inf)
    from opgraph.backends.numba.elementwise import KINDS

    xs = np.array([-2.5, -1.0, -0.0, 0.0, 0.3, 1.0, 2.5, np.inf, -np.inf, np.nan, 1e-310, 7.0])
    ys = np.array([1.5, -1.0, 2.0, -0.0, 0.7, 0.0, -3.0, 2.0, np.inf, 1.0, 3.0, -7.0])
    zs = np.linspace(-1, 1, len(xs))
    for kind, name in KINDS.items():
        code = OP[name]
        arity = ARITY[code]
        k = len(xs)
        r = np.concatenate([xs, ys, zs, np.zeros(k)])
        prog = Instructions.of([(code + 256, 3 * k, 0, k, 2 * k, k, 7)])
        execute(prog, r)
        args = [(xs != 0) if (kind == "where" and i == 0) else a for i, a in enumerate((xs, ys, zs)[:arity])]
        if kind in ("logical_and", "logical_or", "logical_xor", "logical_not"):
            args = [a != 0 for a in args]
        with np.errstate(all="ignore"):
            want = get_op(kind).kernel_for(0)(*args)
        np.testing.assert_allclose(r[3 * k:], np.asarray(want, dtype=np.float64), rtol=1e-13, atol=0,
                                   equal_nan=True, err_msg=kind)


def test_gradient_matches_finite_differences_and_numpy() -> None:
    rng = np.random.default_rng(3)
    kinds = rng.integers(0, 5, 300)
    other = [int(rng.integers(0, i + 8)) for i in range(300)]

    def f(x: Any) -> Any:
        vals = [x[i] for i in range(8)]
        for i, k in enumerate(kinds.tolist()):
            a, b = vals[-1], vals[other[i]]
            vals.append((a + b, a * b, a - b, onp.sin(a), a * 0.5)[k])
        return onp.tanh(vals[-1])

    x = rng.random(8)
    got = opgraph.jit(opgraph.grad(f), backend="numba")(x)
    want = opgraph.jit(opgraph.grad(f), backend="numpy")(x)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    fx = opgraph.jit(f, backend="numba")
    h = 1e-6
    fd = np.array([(float(fx(x + h * e)) - float(fx(x - h * e))) / (2 * h) for e in np.eye(8)])
    np.testing.assert_allclose(got, fd, rtol=1e-5, atol=1e-8)
    assert opgraph.jit(opgraph.grad(f), backend="numba").explain(x).count("region") >= 1


@pytest.mark.parametrize("case", CASES)
def test_tenscalc_scalarized_files_reproduce_tenscalc(case: str) -> None:
    graph = opgraph.io.load(os.path.join(DATA, case, "scalarized"))
    gws = {gw.name: gw for gw in opgraph.io.cg.gateways(graph)}
    with open(os.path.join(DATA, case, "reference.json")) as fh:
        steps = json.load(fh)["steps"]
    p = opgraph.compile(graph, backend="numba")
    assert not p.explain().count("on numpy"), p.explain()
    state: dict[int, np.ndarray] = {}
    checked = 0
    for step in steps:
        gw = gws[step["gateway"]]
        if step["op"] == "set":
            state[gw.values[0]] = np.array(step["value"], dtype=np.float64)
        elif step["op"] == "get":
            got = p(state, list(gw.values))
            for g, want in zip(got, step["outputs"], strict=True):
                w = np.array(want["value"], dtype=np.float64)
                assert g.shape == w.shape
                np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)
                checked += 1
    assert checked


def test_million_op_graph_compiles_and_runs_in_little_memory() -> None:
    # a chain of 10^6 scalar ops built from arrays (opgraph.Graph.from_arrays), checked against a Python loop
    n = 10**6
    rng = np.random.default_rng(0)
    sin, add, mul = (get_op(k).id for k in ("sin", "add", "multiply"))
    pick = rng.integers(0, 3, n)
    kind = np.array([sin, add, mul])[pick]
    first = 2  # value 0: the input, value 1: the constant 0.5
    res = first + np.arange(n)
    earlier = (rng.random(n) * res).astype(np.int64)
    arity = np.where(pick == 0, 1, 2)
    in_ptr = np.zeros(n + 2, dtype=np.int64)
    in_ptr[2:] = np.cumsum(arity)
    in_ids = np.empty(in_ptr[-1], dtype=np.int64)
    starts = in_ptr[1:-1]
    in_ids[starts] = res - 1
    in_ids[starts[arity == 2] + 1] = np.where(pick == 2, 1, earlier)[arity == 2]
    g = opgraph.Graph.from_arrays(
        op_kind=np.concatenate([[CONST.id], kind]), in_ptr=in_ptr, in_ids=in_ids, out_ptr=np.arange(n + 2),
        out_ids=np.concatenate([[1], res]), value_type=np.zeros(first + n, np.int32),
        types=[TensorType("float64", ())], op_attr=np.r_[1, np.zeros(n, np.int32)], attrs=[(), (("index", 0),)],
        constants=[np.array(0.5)], inputs=[0], outputs=[first + n - 1])
    m = assemble(g)
    assert len(m.program) == n
    assert m.nbytes / n <= 64, f"{m.nbytes / n:.1f} bytes per op"
    got = float(opgraph.compile(g, backend="numba")(np.array(0.3))[0])
    vals = np.empty(first + n)
    vals[0], vals[1] = 0.3, 0.5
    ids, ptr, ks = in_ids.tolist(), in_ptr.tolist(), pick.tolist()
    for i in range(n):
        a = vals[ids[ptr[i + 1]]]
        vals[first + i] = math.sin(a) if ks[i] == 0 else a + vals[ids[ptr[i + 1] + 1]] if ks[i] == 1 else a * 0.5
    assert got == vals[-1]


def test_targets_and_update_edges() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    s = b.input(("float64", (3,)), name="s")
    s2 = b.op("add", s, b.op("sin", x))
    y = b.op("sum", b.op("multiply", s2, s2))
    b.output(y, s2)
    b.update(s2, s)
    g = b.freeze()
    p = opgraph.compile(g, backend="numba")
    ref = opgraph.compile(g, backend="numpy")
    xs, s0 = np.array([0.1, 0.2, 0.3]), np.zeros(3)
    for step in range(3):
        feeds = {"x": xs, "s": s0} if step == 0 else {"x": xs}  # then the state carries s
        for o, w in zip(p(**feeds), ref(**feeds), strict=True):
            np.testing.assert_allclose(o, w, rtol=1e-14)
    np.testing.assert_allclose(p.state("s"), 3 * np.sin(xs))
    plain = opgraph.compile(g.replace(updates=np.zeros((0, 2), np.int64)), backend="numba")
    np.testing.assert_allclose(plain({"x": xs, "s": s0}, [int(s2.id)])[0], np.sin(xs))  # one target


def test_whole_graph_claim_agrees_with_op_by_op() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)), name="x")
    y = b.op("exp", b.op("permute_dims", x, axes=(1, 0)))
    b.output(b.op("sum", y, axis=(0,)))
    g = b.freeze()
    assert BACKEND.claims(g)
    assert all(BACKEND.why_not(OpInfo.of(g, op)) is None for op in range(g.num_ops) if g.op_kind[op] != CONST.id)
    # an op it lacks (int64 values): not claimed whole; the program partitions it onto numpy
    b = opgraph.GraphBuilder()
    i = b.input(("int64", (3,)), name="i")
    b.output(b.op("exp", b.op("cast", b.op("add", i, i), dtype="float64")))
    g2 = b.freeze()
    assert not BACKEND.claims(g2)
    p = opgraph.compile(g2, backend="numba")
    assert "runs on numpy" in p.explain() or "on numpy" in p.explain()
    np.testing.assert_allclose(p(np.arange(3))[0], np.exp(2.0 * np.arange(3)))
    with pytest.raises(BackendError, match="cannot run on numba"):
        opgraph.compile(g2, backend="numba", partition=False)


def test_views_emit_no_instructions() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)), name="x")
    r = b.op("reshape", x, shape=(3, 2))
    row = b.op("getitem", r, index=(1,))
    b.output(b.op("sin", row))
    m = assemble(b.freeze())
    assert len(m.program) == 1  # the sin alone: reshape and a contiguous row are views of x's slots
    np.testing.assert_allclose(BACKEND.compile_graph(b.freeze())([np.arange(6.0).reshape(2, 3)])[0],
                               np.sin(np.arange(6.0).reshape(3, 2)[1]))


def test_auto_picks_numba_for_fine_grained_graphs() -> None:
    from opgraph.runtime.auto import choose

    b = opgraph.GraphBuilder()
    x = b.input(("float64", ()), name="x")
    y = x
    for i in range(1500):
        y = b.op(("sin", "tanh")[i % 2], b.op("multiply", y, 0.9))
    b.output(y)
    choice = choose(b.freeze(), {"x": np.array(0.3)}, budget=1.0, allow_numerics=True)
    assert choice.backend == "numba", choice.decision()
    assert "jax" not in choice.compile_seconds  # XLA is not asked to compile 3000 scalar ops


def test_missing_numba_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numba" else real(name, *a))
    backends.unregister("numba")  # forget the loaded engine: the next get() looks for numba again
    try:
        assert "numba" not in backends.available()
        with pytest.raises(backends.BackendNotInstalledError) as err:
            backends.get("numba")
        assert "numba" in str(err.value) and len(str(err.value).splitlines()) == 1
        from opgraph.runtime.auto import choose

        b = opgraph.GraphBuilder()
        x = b.input(("float64", ()), name="x")
        b.output(b.op("sin", x))
        assert "numba" not in choose(b.freeze(), {"x": np.array(0.3)}, budget=0.2).timings
    finally:
        monkeypatch.undo()
        backends.unregister("numba")
    assert backends.get("numba") is BACKEND


def test_a_rule_writing_outside_the_register_file_is_refused() -> None:
    # the interpreter does not check bounds: the assembler does, once, before anything runs
    b = opgraph.GraphBuilder()
    x = b.input(("float64", ()), name="x")
    b.output(b.op("sin", x))

    def bad_sin(asm: Any, ops: np.ndarray) -> None:
        asm.emit(ops, OP["SIN"], asm.n_slots + 5, asm.slot[asm.inputs_of(ops, 0)])

    with pytest.raises(BackendError, match="outside the register file"):
        assemble(b.freeze(), rules={**BACKEND.rules, "sin": bad_sin})
