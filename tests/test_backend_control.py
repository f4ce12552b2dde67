"""Control flow (call, cond, while_loop, scan) lowered to the jax and torch backends.

Every graph is compared with the NumPy backend (``opgraph.compile(g, backend="numpy")``, whose kernels run
the bodies op by op); on jax the same computation is also written directly with ``jax.lax`` and compared.
Each test checks the control ops really ran on the engine (``Program.placement``), or, where the engine
cannot run a body, that the op fell back to numpy and ``explain()`` says why.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.core.registry import OpDef, register_op
from opgraph.core.subgraph import Subgraph

ENGINES = [pytest.param(n, marks=pytest.mark.skipif(importlib.util.find_spec(n) is None,
                                                     reason=f"the {n} engine is an optional extra"))
           for n in ("jax", "torch")]
needs_engine = pytest.mark.parametrize("name", ENGINES)
needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="the jax engine is an optional extra")
F8 = "float64"
RTOL, ATOL = 1e-12, 1e-13


def body(in_types: list[Any], fn: Callable[..., Any], name: str) -> Subgraph:
    """A body whose parameters have ``in_types`` and whose results are ``fn(builder, *params)``."""
    sb = opgraph.GraphBuilder()
    params = [sb.input(t, name=f"p{i}") for i, t in enumerate(in_types)]
    outs = fn(sb, *params)
    sb.output(*(outs if isinstance(outs, tuple) else (outs,)))
    return Subgraph(sb.freeze(), name=name)


def run_both(g: opgraph.Graph, name: str, feeds: dict[str, Any], *, on_engine: bool = True,
             **options: Any) -> tuple[list[np.ndarray], Any]:
    """Results on engine ``name`` (checked equal to the NumPy backend's) and the compiled program."""
    want = opgraph.compile(g, backend="numpy")(feeds)
    p = opgraph.compile(g, backend=name, **options)
    got = p(feeds)
    assert len(got) == len(want)
    for i, (a, w) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == w.dtype and a.shape == w.shape, f"output {i}: {a.dtype}{a.shape} vs {w.dtype}{w.shape}"
        np.testing.assert_allclose(a, w, rtol=RTOL, atol=ATOL, err_msg=f"output {i} on {name}")
    if on_engine:
        places = {(kind, where) for _op, kind, where, _why in p.placement()}
        assert all(where == name for _kind, where in places), p.explain()
    return got, p


# ---------------------------------------------------------------- the graphs
def call_graph() -> opgraph.Graph:
    f = body([(F8, (3,)), (F8, (3,))], lambda sb, x, y: (sb.add(sb.multiply(x, y), sb.sin(x)), sb.sum(sb.square(y))),
             "f")
    b = opgraph.GraphBuilder()
    x, y = b.input((F8, (3,)), name="x"), b.input((F8, (3,)), name="y")
    u, s = b.op("call", x, y, body=f)
    v, t = b.op("call", u, y, body=f)  # one body, two calls
    b.output(v, b.add(s, t))
    return b.freeze()


def cond_graph() -> opgraph.Graph:
    ops = [(F8, (3,)), (F8, (3,))]
    then_b = body(ops, lambda sb, x, y: (sb.add(sb.multiply(x, 2.0), y), sb.sum(x)), "then")
    else_b = body(ops, lambda sb, x, y: (sb.subtract(x, y), sb.prod(y)), "else")
    b = opgraph.GraphBuilder()
    pred = b.input(("bool", (1,)), name="pred")
    x, y = b.input((F8, (3,)), name="x"), b.input((F8, (3,)), name="y")
    r, s = b.op("cond", pred, x, y, then_body=then_b, else_body=else_b)
    b.output(r, s)
    return b.freeze()


def newton_graph(max_trip: int | None = None, ys: bool = False) -> opgraph.Graph:
    """sqrt(a) by Newton's method from x = a: the trip count depends on a (and on max_trip)."""
    types = [(F8, (3,)), (F8, (3,)), ("int64", ())]
    test = body(types, lambda sb, a, x, k: sb.op("any", sb.greater(sb.abs(sb.subtract(sb.multiply(x, x), a)),
                                                                   sb.multiply(a, 1e-12))), "unconverged")

    def step(sb: Any, a: Any, x: Any, k: Any) -> tuple[Any, ...]:
        x2 = sb.multiply(sb.add(x, sb.divide(a, x)), 0.5)
        return (x2, sb.add(k, 1)) + ((sb.subtract(x, x2),) if ys else ())

    b = opgraph.GraphBuilder()
    a = b.input((F8, (3,)), name="a")
    k0 = b.input(("int64", ()), name="k0")
    outs = b.op("while_loop", a, a, k0, cond_body=test, body=body(types, step, "newton"), num_consts=1,
                max_trip=max_trip)
    b.output(*outs)
    return b.freeze()


def rnn_graph(reverse: bool = False, steps: int = 6) -> opgraph.Graph:
    """consts w; carries h and a running sum; xs; ys h' and sum(h')."""
    def step(sb: Any, w: Any, h: Any, s: Any, x: Any) -> tuple[Any, ...]:
        h2 = sb.tanh(sb.add(sb.op("matmul", w, h), x))
        s2 = sb.add(s, sb.sum(h2))
        return h2, s2, h2, sb.sum(h2)

    cell = body([(F8, (2, 2)), (F8, (2,)), (F8, ()), (F8, (2,))], step, "cell")
    b = opgraph.GraphBuilder()
    w, h0 = b.input((F8, (2, 2)), name="w"), b.input((F8, (2,)), name="h0")
    s0, xs = b.input((F8, ()), name="s0"), b.input((F8, (steps, 2)), name="xs")
    b.output(*b.op("scan", w, h0, s0, xs, body=cell, num_consts=1, num_carry=2, reverse=reverse))
    return b.freeze()


def length_graph(n: int = 5) -> opgraph.Graph:
    grow = body([(F8, (2,))], lambda sb, c: (sb.add(sb.multiply(c, 1.5), 1.0), sb.sum(c)), "grow")
    b = opgraph.GraphBuilder()
    c0 = b.input((F8, (2,)), name="c0")
    b.output(*b.op("scan", c0, body=grow, num_carry=1, length=n))
    return b.freeze()


def nested_graph() -> opgraph.Graph:
    """An outer scan over (T, K, 2) whose body scans each (K, 2) slice."""
    inner = body([(F8, (2,)), (F8, (2,))], lambda sb, acc, x: (sb.add(sb.multiply(acc, 0.9), x), sb.sum(acc)),
                 "inner")

    def outer_step(sb: Any, acc: Any, xk: Any) -> tuple[Any, ...]:
        acc2, ys = sb.op("scan", acc, xk, body=inner, num_carry=1)
        return acc2, sb.sum(ys)

    outer = body([(F8, (2,)), (F8, (4, 2))], outer_step, "outer")
    b = opgraph.GraphBuilder()
    a0, xs = b.input((F8, (2,)), name="a0"), b.input((F8, (3, 4, 2)), name="xs")
    b.output(*b.op("scan", a0, xs, body=outer, num_carry=1))
    return b.freeze()


RNG = np.random.default_rng(7)
X3, Y3 = RNG.standard_normal(3), RNG.standard_normal(3)
A3 = np.array([2.0, 9.0, 1e6])
W = RNG.standard_normal((2, 2)) * 0.7
H0, XS = RNG.standard_normal(2), RNG.standard_normal((6, 2))
XS3 = RNG.standard_normal((3, 4, 2))


# ---------------------------------------------------------------- against the NumPy backend
@needs_engine
def test_call(name: str) -> None:
    run_both(call_graph(), name, {"x": X3, "y": Y3})


@needs_engine
@pytest.mark.parametrize("pred", [True, False])
def test_cond_both_branches(name: str, pred: bool) -> None:
    got, _ = run_both(cond_graph(), name, {"pred": np.array([pred]), "x": X3, "y": Y3})
    np.testing.assert_allclose(got[0], X3 * 2 + Y3 if pred else X3 - Y3, rtol=RTOL)


@needs_engine
@pytest.mark.parametrize("max_trip", [None, 3, 100])
def test_while_loop_data_dependent_trips(name: str, max_trip: int | None) -> None:
    got, _ = run_both(newton_graph(max_trip), name, {"a": A3, "k0": np.array(0)})
    trips = int(got[1])
    if max_trip == 3:
        assert trips == 3
    else:  # converged: how many trips it took depends on a (1e6 needs many more than 2)
        assert 5 < trips < 40
        np.testing.assert_allclose(got[0], np.sqrt(A3), rtol=1e-12)
    # a different a, a different trip count, the same compiled program
    few, _ = run_both(newton_graph(max_trip), name, {"a": np.array([1.0, 1.0, 1.0]), "k0": np.array(0)})
    assert int(few[1]) == 0


@needs_engine
@pytest.mark.parametrize("max_trip", [None, 4])
def test_while_loop_with_ys(name: str, max_trip: int | None) -> None:
    g = newton_graph(max_trip, ys=True)
    got, p = run_both(g, name, {"a": A3, "k0": np.array(0)}, on_engine=name == "torch")
    assert got[2].shape == (int(got[1]), 3)
    if name == "jax":  # the stacked ys have a run-time length: jax.jit cannot return them
        where = {kind: (w, why) for _op, kind, w, why in p.placement()}
        assert where["while_loop"][0] == "numpy"
        assert "cannot stack per-trip results" in p.explain()
    zero, _ = run_both(g, name, {"a": np.ones(3), "k0": np.array(0)}, on_engine=name == "torch")
    assert zero[2].shape == (0, 3) and zero[2].dtype == np.float64


@needs_engine
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_consts_carries_reverse(name: str, reverse: bool) -> None:
    got, _ = run_both(rnn_graph(reverse), name, {"w": W, "h0": H0, "s0": np.array(0.5), "xs": XS})
    assert got[2].shape == (6, 2) and got[3].shape == (6,)


@needs_engine
@pytest.mark.parametrize("n", [5, 0])
def test_scan_length_without_xs(name: str, n: int) -> None:
    got, _ = run_both(length_graph(n), name, {"c0": np.array([1.0, -2.0])})
    assert got[1].shape == (n,)


@needs_engine
def test_nested_scan(name: str) -> None:
    run_both(nested_graph(), name, {"a0": H0, "xs": XS3})


@needs_engine
def test_lowered_op_in_body_runs_on_engine(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An op the engine has no rule for (silu, taken out of torch's rules for the test) in a body: the body is
    lowered (as the top-level graph is) and still runs there."""
    be = opgraph.backends.get(name)
    if "silu" in be.rules:
        monkeypatch.delitem(be.rules, "silu")
    act = body([(F8, (3,)), (F8, (3,))], lambda sb, c, x: (sb.op("silu", sb.add(c, x)), sb.sum(c)), "act")
    b = opgraph.GraphBuilder()
    c0, xs = b.input((F8, (3,)), name="c0"), b.input((F8, (4, 3)), name="xs")
    b.output(*b.op("scan", c0, xs, body=act, num_carry=1))
    assert "silu" not in be.kinds()
    run_both(b.freeze(), name, {"c0": X3, "xs": RNG.standard_normal((4, 3))})


def _numpy_only_kind() -> str:
    name = "test_control_numpy_only_softsign"
    try:
        opgraph.get_op(name)
    except KeyError:
        register_op(OpDef(name=name, id=49601, arity=1, infer=lambda ts, a: (ts[0],),
                          kernel=lambda x, out=None: np.divide(x, 1 + np.abs(x), out=out),
                          doc="x / (1 + |x|), numpy only (a test op)"))
    return name


@needs_engine
def test_body_op_the_engine_lacks_falls_back_to_numpy(name: str) -> None:
    kind = _numpy_only_kind()
    bad = body([(F8, (3,)), (F8, (3,))], lambda sb, c, x: (sb.op(kind, sb.add(c, x)), sb.sum(c)), "soft")
    b = opgraph.GraphBuilder()
    c0, xs = b.input((F8, (3,)), name="c0"), b.input((F8, (4, 3)), name="xs")
    carry, ys = b.op("scan", c0, xs, body=bad, num_carry=1)
    b.output(b.exp(carry), ys)
    g = b.freeze()
    be = opgraph.backends.get(name)
    scan_op = next(op for op in range(g.num_ops) if g.kind_of(op) == "scan")
    why = be.why_not(opgraph.backends.OpInfo.of(g, scan_op))
    assert why is not None and "body 'soft'" in why and kind in why
    with pytest.raises(opgraph.backends.BackendError, match="body 'soft'"):
        opgraph.compile(g, backend=name, partition=False)
    _, p = run_both(g, name, {"c0": X3, "xs": RNG.standard_normal((4, 3))}, on_engine=False)
    where = {kind: w for _op, kind, w, _why in p.placement()}
    assert where == {"scan": "numpy", "exp": name}
    assert f"({kind})" in p.explain() and "scan) runs on numpy" in p.explain()


@needs_engine
def test_results_do_not_alias_feeds_or_constants(name: str) -> None:
    """A body returning its parameter (or a loop that never changes its carry) still gives a fresh array."""
    ident = body([(F8, (3,))], lambda sb, x: x, "identity")
    keep = body([(F8, (3,)), (F8, (3,))], lambda sb, c, x: (c, sb.sum(x)), "keep")
    b = opgraph.GraphBuilder()
    x, xs = b.input((F8, (3,)), name="x"), b.input((F8, (2, 3)), name="xs")
    carry, _ = b.op("scan", x, xs, body=keep, num_carry=1)
    b.output(b.op("call", x, body=ident), carry)
    feed = np.arange(3.0)
    got, _ = run_both(b.freeze(), name, {"x": feed, "xs": np.ones((2, 3))})
    for r in got:
        r[:] = -1.0
    np.testing.assert_array_equal(feed, np.arange(3.0))


def test_torch_compile_runs_control_ops_eagerly_between_compiled_pieces() -> None:
    pytest.importorskip("torch", reason="the torch engine is an optional extra")
    run_both(cond_graph(), "torch", {"pred": np.array([False]), "x": X3, "y": Y3}, compile=True)
    run_both(rnn_graph(), "torch", {"w": W, "h0": H0, "s0": np.array(0.5), "xs": XS}, compile=True)


# ---------------------------------------------------------------- against jax.lax written directly
@needs_jax
def test_jax_matches_lax_written_directly() -> None:
    import jax.numpy as jnp
    from jax import lax

    def check(g: opgraph.Graph, feeds: dict[str, Any], want: Any) -> None:
        got = opgraph.compile(g, backend="jax")(feeds)
        for a, w in zip(got, want, strict=True):
            np.testing.assert_allclose(a, np.asarray(w), rtol=RTOL, atol=ATOL)

    for pred in (True, False):
        check(cond_graph(), {"pred": np.array([pred]), "x": X3, "y": Y3},
              lax.cond(pred, lambda x, y: (x * 2 + y, jnp.sum(x)), lambda x, y: (x - y, jnp.prod(y)), X3, Y3))

    def newton(s: tuple[Any, Any]) -> tuple[Any, Any]:
        x, k = s
        return (x + A3 / x) * 0.5, k + 1
    check(newton_graph(), {"a": A3, "k0": np.array(0)},
          lax.while_loop(lambda s: jnp.any(jnp.abs(s[0] * s[0] - A3) > A3 * 1e-12), newton, (A3, 0)))

    for reverse in (False, True):
        def cell(c: tuple[Any, Any], x: Any) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
            h2 = jnp.tanh(W @ c[0] + x)
            return (h2, c[1] + jnp.sum(h2)), (h2, jnp.sum(h2))
        (h, s), (hs, ss) = lax.scan(cell, (H0, 0.5), XS, reverse=reverse)
        check(rnn_graph(reverse), {"w": W, "h0": H0, "s0": np.array(0.5), "xs": XS}, (h, s, hs, ss))

    c, ys = lax.scan(lambda c, _: (c * 1.5 + 1.0, jnp.sum(c)), jnp.array([1.0, -2.0]), None, length=5)
    check(length_graph(5), {"c0": np.array([1.0, -2.0])}, (c, ys))

    def outer(acc: Any, xk: Any) -> tuple[Any, Any]:
        acc2, ys = lax.scan(lambda a, x: (a * 0.9 + x, jnp.sum(a)), acc, xk)
        return acc2, jnp.sum(ys)
    check(nested_graph(), {"a0": H0, "xs": XS3}, lax.scan(outer, H0, XS3))
