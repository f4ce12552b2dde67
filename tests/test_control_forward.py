"""Forward mode through call / cond / scan / while_loop / fori_loop (tangent rules in ops/control.py,
``jvp_body`` in autodiff/control.py, ``merge_subsumed`` and ``merge_overlapping_scans`` in passes/control.py).

Each tangent is checked against ``jax.jvp`` of the same ``jax.lax`` program (x64) and against central finite
differences; the jvp graphs also run on the jax and torch engines and after a save/load round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import opgraph
import opgraph.numpy as onp
from opgraph.autodiff.control import jvp_body
from opgraph.core.subgraph import Subgraph
from opgraph.passes.control import merge_overlapping_scans, merge_subsumed

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy
lax = jax.lax

RNG = np.random.default_rng(37)
TOL = dict(rtol=1e-10, atol=1e-12)


def fd_jvp(f: Callable[..., Any], primals: tuple[np.ndarray, ...], tangents: tuple[np.ndarray, ...],
           eps: float = 1e-6) -> np.ndarray:
    """Central finite difference of ``f`` along ``tangents``."""
    plus = [p + eps * t for p, t in zip(primals, tangents, strict=True)]
    minus = [p - eps * t for p, t in zip(primals, tangents, strict=True)]
    return (np.asarray(f(*plus)) - np.asarray(f(*minus))) / (2 * eps)


def check_jvp(f: Callable[..., Any], fj: Callable[..., Any], primals: tuple[np.ndarray, ...],
              tangents: tuple[np.ndarray, ...] | None = None) -> tuple[Any, Any]:
    """opgraph.jvp of ``f`` against jax.jvp of ``fj`` (the same program in jax.lax) and finite differences."""
    if tangents is None:
        tangents = tuple(RNG.normal(size=np.shape(p)) for p in primals)
    out, tan = opgraph.jvp(f, primals, tangents)
    jout, jtan = jax.jvp(fj, primals, tangents)
    np.testing.assert_allclose(out, np.asarray(jout), **TOL)
    np.testing.assert_allclose(tan, np.asarray(jtan), **TOL)
    np.testing.assert_allclose(tan, fd_jvp(lambda *a: np.asarray(fj(*a)), primals, tangents), rtol=1e-6,
                               atol=1e-7)
    return out, tan


def kinds(g: opgraph.Graph) -> list[str]:
    return [g.kind_of(o) for o in range(g.num_ops)]


# ---------------------------------------------------------------- the programs (opgraph and jax.lax)
def rnn(w: Any, h0: Any, xs: Any) -> Any:
    def step(h: Any, x: Any) -> Any:
        h2 = onp.tanh(w @ h + x)
        return h2, onp.sum(h2 * h2)
    h, ys = opgraph.scan(step, h0, xs)
    return onp.sum(h) + onp.sum(onp.sin(ys))


def rnn_jax(w: Any, h0: Any, xs: Any) -> Any:
    def step(h: Any, x: Any) -> Any:
        h2 = jnp.tanh(w @ h + x)
        return h2, jnp.sum(h2 * h2)
    h, ys = lax.scan(step, h0, xs)
    return jnp.sum(h) + jnp.sum(jnp.sin(ys))


def newton_sqrt(a: Any, x0: Any) -> Any:
    """x <- (x + a/x)/2 while |x^2 - a| > 1e-3: a run-time trip count (the tangent follows the same trips)."""
    def body(c: Any) -> Any:
        x, k = c
        return (0.5 * (x + a / x), k + 1)
    x, _ = opgraph.while_loop(lambda c: onp.abs(c[0] * c[0] - a)[0] > 1e-3, body, (x0, onp.asarray(0)))
    return x * x * a


def newton_sqrt_jax(a: Any, x0: Any) -> Any:
    def body(c: Any) -> Any:
        x, k = c
        return (0.5 * (x + a / x), k + 1)
    x, _ = lax.while_loop(lambda c: jnp.abs(c[0] * c[0] - a)[0] > 1e-3, body, (x0, 0))
    return x * x * a


# ---------------------------------------------------------------- each op against jax.jvp
def test_jvp_through_call() -> None:
    def f(x: Any, y: Any) -> Any:
        return opgraph.call(lambda u, v: (onp.sin(u) * v, onp.exp(v)), x, y)
    def fj(x: Any, y: Any) -> Any:
        return jnp.sin(x) * y, jnp.exp(y)
    primals = (RNG.normal(size=3), RNG.normal(size=3))
    tangents = (RNG.normal(size=3), RNG.normal(size=3))
    (o1, o2), (t1, t2) = opgraph.jvp(f, primals, tangents)
    (j1, j2), (u1, u2) = jax.jvp(fj, primals, tangents)
    for a, b in ((o1, j1), (o2, j2), (t1, u1), (t2, u2)):
        np.testing.assert_allclose(a, np.asarray(b), **TOL)
    g = opgraph.trace(lambda p, t: opgraph.jvp(f, p, t), primals, tangents)
    assert kinds(opgraph.optimize(g)).count("call") == 1  # the primal call is read off the tangent call


@pytest.mark.parametrize("x0", [0.7, -0.4])
def test_jvp_through_cond(x0: float) -> None:
    def f(x: Any, y: Any) -> Any:
        return opgraph.cond(onp.sum(x) > 0, lambda u, v: onp.sin(u) * v, lambda u, v: u * u + 0 * v, x, y)
    def fj(x: Any, y: Any) -> Any:
        return lax.cond(jnp.sum(x) > 0, lambda u, v: jnp.sin(u) * v, lambda u, v: u * u + 0 * v, x, y)
    check_jvp(f, fj, (np.full(3, x0) + RNG.normal(size=3) * 0.1, RNG.normal(size=3)))


def test_jvp_through_scan_matches_jax_and_runs_one_loop() -> None:
    w, h0, xs = RNG.normal(size=(4, 4)) * 0.5, RNG.normal(size=4), RNG.normal(size=(6, 4))
    check_jvp(rnn, rnn_jax, (w, h0, xs))
    # a tangent only for the xs: the carry still gets one (the body gives it one), zeros to start with
    check_jvp(lambda xs: rnn(w, h0, xs), lambda xs: rnn_jax(w, h0, xs), (xs,))
    g = opgraph.optimize(opgraph.trace(lambda p, t: opgraph.jvp(rnn, p, t), (w, h0, xs), (w, h0, xs)))
    assert kinds(g).count("scan") == 1  # primal and tangents in one loop


def test_jvp_through_reverse_scan_with_int_carry() -> None:
    def f(c: Any, xs: Any) -> Any:
        def step(carry: Any, x: Any) -> Any:
            v, k = carry
            return (v * onp.cos(x) + c, k + 1), v * x
        (v, _), ys = opgraph.scan(step, (c, onp.asarray(0)), xs, reverse=True)
        return v + onp.sum(ys, axis=0)
    def fj(c: Any, xs: Any) -> Any:
        def step(carry: Any, x: Any) -> Any:
            v, k = carry
            return (v * jnp.cos(x) + c, k + 1), v * x
        (v, _), ys = lax.scan(step, (c, 0), xs, reverse=True)
        return v + jnp.sum(ys, axis=0)
    check_jvp(f, fj, (RNG.normal(size=2), RNG.normal(size=(5, 2))))


def test_jvp_through_while_loop() -> None:
    a, x0 = np.array([2.0 + RNG.random()]), np.array([1.0])
    check_jvp(newton_sqrt, newton_sqrt_jax, (a, x0))


def test_jvp_through_fori_loop_static_and_dynamic_bounds() -> None:
    def f(x: Any, n: Any) -> Any:
        return opgraph.fori_loop(0, n, lambda i, v: onp.sin(v) * x + i, x)
    def fj(x: Any, n: Any) -> Any:
        return lax.fori_loop(0, n, lambda i, v: jnp.sin(v) * x + i, x)
    x = RNG.normal(size=3)
    check_jvp(lambda x: f(x, 4), lambda x: fj(x, 4), (x,))  # a scan
    n = np.asarray(4)
    _, tan = opgraph.jvp(lambda x: f(x, onp.asarray(n)), (x,), (np.ones(3),))  # a while_loop
    np.testing.assert_allclose(tan, np.asarray(jax.jvp(lambda x: fj(x, 4), (x,), (np.ones(3),))[1]), **TOL)


# ---------------------------------------------------------------- compositions
def rk4(p: Any, y0: Any, steps: int = 20, dt: float = 0.05, np_: Any = onp, fori: Any = opgraph.fori_loop) -> Any:
    """Lotka-Volterra with parameters p = (a, b, c), integrated by RK4 in a fori_loop."""
    def rhs(y: Any) -> Any:
        return np_.stack([p[0] * y[0] - p[1] * y[0] * y[1], p[1] * y[0] * y[1] - p[2] * y[1]])
    def step(i: Any, y: Any) -> Any:
        k1 = rhs(y)
        k2 = rhs(y + 0.5 * dt * k1)
        k3 = rhs(y + 0.5 * dt * k2)
        k4 = rhs(y + dt * k3)
        return y + dt / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
    return fori(0, steps, step, y0)


def test_jacfwd_of_rk4_ode_matches_jax() -> None:
    p, y0 = np.array([1.1, 0.4, 0.9]), np.array([1.0, 0.5])
    got = opgraph.jacfwd(lambda p: rk4(p, y0))(p)
    want = jax.jacfwd(lambda p: rk4(p, y0, np_=jnp, fori=lax.fori_loop))(p)
    assert got.shape == (2, 3)
    np.testing.assert_allclose(got, np.asarray(want), **TOL)
    np.testing.assert_allclose(got, opgraph.jacrev(lambda p: rk4(p, y0))(p), **TOL)
    # jacfwd batches the three tangents (vmap of jvp): one loop carries the counter, the state and its tangents
    g = opgraph.trace(opgraph.jacfwd(lambda p: rk4(p, y0)), p)
    (op,) = [o for o in range(g.num_ops) if g.kind_of(o) == "scan"]
    assert g.attrs_of(op)["num_carry"] == 3 and g.type_of(g.op_outputs(op)[2]).shape == (3, 2)
    # three jvps, one tangent scan each carrying the primal state: merged, one loop steps them all
    eye = np.eye(3)
    g = opgraph.trace(lambda p: onp.stack([opgraph.jvp(lambda q: rk4(q, y0), (p,), (e,))[1] for e in eye], axis=1), p)
    g = merge_subsumed(g).graph  # the primal scan is read off the tangent scans
    r = merge_overlapping_scans(g)
    assert kinds(g).count("scan") == 3 and kinds(r.graph).count("scan") == 1 and r.counts == {"merge.overlap": 3}
    (op,) = [o for o in range(r.graph.num_ops) if r.graph.kind_of(o) == "scan"]
    assert r.graph.attrs_of(op)["num_carry"] == 1 + 1 + 3  # the counter, the state, three tangents of it
    np.testing.assert_allclose(r.graph.run({int(r.graph.inputs[0]): p})[0], np.asarray(want), **TOL)


def test_hvp_through_scan_matches_jax() -> None:
    w, h0, xs = RNG.normal(size=(3, 3)) * 0.5, RNG.normal(size=3), RNG.normal(size=(5, 3))
    v = RNG.normal(size=(3, 3))
    g, hv = opgraph.hvp(lambda w: rnn(w, h0, xs), (w,), (v,))
    jg, jhv = jax.jvp(jax.grad(lambda w: rnn_jax(w, h0, xs)), (w,), (v,))
    np.testing.assert_allclose(g, np.asarray(jg), **TOL)
    np.testing.assert_allclose(hv, np.asarray(jhv), **TOL)


def test_linearize_and_forward_hessian_through_scan() -> None:
    w, h0, xs = RNG.normal(size=(2, 2)) * 0.5, RNG.normal(size=2), RNG.normal(size=(4, 2))
    v = RNG.normal(size=(2, 2))
    _, f_jvp = opgraph.linearize(lambda w: rnn(w, h0, xs), w)
    np.testing.assert_allclose(f_jvp(v), np.asarray(jax.jvp(lambda w: rnn_jax(w, h0, xs), (w,), (v,))[1]), **TOL)
    h = opgraph.hessian(lambda w: rnn(w, h0, xs), mode="fwd")(w)
    np.testing.assert_allclose(h, np.asarray(jax.hessian(lambda w: rnn_jax(w, h0, xs))(w)), **TOL)


def test_hvp_through_while_loop_with_max_trip() -> None:
    def f(x: Any) -> Any:
        def body(c: Any) -> Any:
            v, k = c
            return onp.sin(v) * x + v, k + 1
        v, _ = opgraph.while_loop(lambda c: c[1] < 4, body, (x, onp.asarray(0)), max_trip=6)
        return onp.sum(v * v)
    def fj(x: Any) -> Any:
        v, _ = lax.fori_loop(0, 4, lambda i, c: (jnp.sin(c[0]) * x + c[0], c[1] + 1), (x, 0))
        return jnp.sum(v * v)
    x, t = RNG.normal(size=3), RNG.normal(size=3)
    _, hv = opgraph.hvp(f, (x,), (t,))
    np.testing.assert_allclose(hv, np.asarray(jax.jvp(jax.grad(fj), (x,), (t,))[1]), **TOL)
    # reverse over forward: the tangent while_loop keeps max_trip
    got = opgraph.grad(lambda x: opgraph.jvp(f, (x,), (t,))[1])(x)
    np.testing.assert_allclose(got, np.asarray(jax.grad(lambda x: jax.jvp(fj, (x,), (t,))[1])(x)), **TOL)


def test_grad_of_jvp_through_scan() -> None:
    """Reverse over forward: the gradient of a directional derivative."""
    w, h0, xs = RNG.normal(size=(3, 3)) * 0.5, RNG.normal(size=3), RNG.normal(size=(4, 3))
    v = RNG.normal(size=(3, 3))
    got = opgraph.grad(lambda w: opgraph.jvp(lambda w: rnn(w, h0, xs), (w,), (v,))[1])(w)
    want = jax.grad(lambda w: jax.jvp(lambda w: rnn_jax(w, h0, xs), (w,), (v,))[1])(w)
    np.testing.assert_allclose(got, np.asarray(want), **TOL)


def nested(w: Any, xs: Any) -> Any:
    """A scan whose body holds a scan (over the columns) and a cond."""
    def outer(c: Any, row: Any) -> Any:
        def inner(a: Any, x: Any) -> Any:
            return onp.sin(a * w[0] + x), a * x
        a, ys = opgraph.scan(inner, c, row)
        a = opgraph.cond(a > 0, lambda u: u * w[1], lambda u: onp.exp(u), a)
        return a, onp.sum(ys)
    c, ys = opgraph.scan(outer, w[2], xs)
    return c + onp.sum(ys * ys)


def nested_jax(w: Any, xs: Any) -> Any:
    def outer(c: Any, row: Any) -> Any:
        def inner(a: Any, x: Any) -> Any:
            return jnp.sin(a * w[0] + x), a * x
        a, ys = lax.scan(inner, c, row)
        a = lax.cond(a > 0, lambda u: u * w[1], lambda u: jnp.exp(u), a)
        return a, jnp.sum(ys)
    c, ys = lax.scan(outer, w[2], xs)
    return c + jnp.sum(ys * ys)


def test_nested_control_flow_jvp_and_op_counts() -> None:
    w, xs = np.array([0.8, 1.3, 0.2]), RNG.normal(size=(4, 5))
    check_jvp(nested, nested_jax, (w, xs))
    g = opgraph.trace(lambda p, t: opgraph.jvp(nested, p, t), (w, xs), (w, xs))
    opt = opgraph.optimize(g)
    assert kinds(opt).count("scan") == 1
    (body,) = [opt.attrs_of(o)["body"] for o in range(opt.num_ops) if opt.kind_of(o) == "scan"]
    inner = kinds(body.graph)
    assert inner.count("scan") == 1 and inner.count("cond") == 1  # the inner loop and branch run once too


def test_nested_hvp() -> None:
    w, xs, v = np.array([0.8, 1.3, 0.2]), RNG.normal(size=(3, 4)), RNG.normal(size=3)
    _, hv = opgraph.hvp(lambda w: nested(w, xs), (w,), (v,))
    np.testing.assert_allclose(hv, np.asarray(jax.jvp(jax.grad(lambda w: nested_jax(w, xs)), (w,), (v,))[1]),
                               **TOL)


def test_jvp_of_jvp_and_while_inside_scan() -> None:
    """Forward over forward, through a scan whose body holds a while_loop."""
    def f(a: Any, xs: Any) -> Any:
        def step(c: Any, x: Any) -> Any:
            return newton_sqrt(a + x * x, c), c
        c, ys = opgraph.scan(step, onp.ones(1), xs)
        return c + onp.sum(ys)
    def fj(a: Any, xs: Any) -> Any:
        def step(c: Any, x: Any) -> Any:
            return newton_sqrt_jax(a + x * x, c), c
        c, ys = lax.scan(step, jnp.ones(1), xs)
        return c + jnp.sum(ys)
    a, xs, u, v = np.array([2.0]), RNG.normal(size=(3, 1)), np.array([1.0]), np.array([0.5])
    check_jvp(f, fj, (a, xs))
    got = opgraph.jvp(lambda a: opgraph.jvp(lambda a: f(a, xs), (a,), (u,))[1], (a,), (v,))[1]
    want = jax.jvp(lambda a: jax.jvp(lambda a: fj(a, xs), (a,), (u,))[1], (a,), (v,))[1]
    np.testing.assert_allclose(got, np.asarray(want), **TOL)


# ---------------------------------------------------------------- the jvp'd body
def test_jvp_body_recomputes_no_primal_op() -> None:
    sb = opgraph.GraphBuilder()
    h, x, w = (sb.input(("float64", s), name=n) for n, s in (("h", (3,)), ("x", (3,)), ("w", (3, 3))))
    h2 = sb.tanh(sb.add(sb.matmul(w, h), x))
    sb.output(h2, sb.sum(sb.multiply(h2, h2)))
    body = Subgraph(sb.freeze(), name="cell")
    j = jvp_body(body, (0, 2))
    assert j is jvp_body(body, (0, 2))  # cached on the body
    assert j.in_types == (*body.in_types, body.in_types[0], body.in_types[2])
    assert j.out_types == (*body.out_types, *body.out_types)
    k = kinds(j.graph)
    for kind in ("tanh", "sum", "add"):
        assert k.count(kind) >= kinds(body.graph).count(kind)
    assert k.count("tanh") == 1  # the tangent reads the primal tanh, not a second one
    feeds = [RNG.normal(size=t.shape) for t in j.in_types]
    r = opgraph.ops.control.body_fn(j)(feeds)
    def fj(h: Any, w: Any) -> Any:
        h2 = jnp.tanh(w @ h + feeds[1])
        return h2, jnp.sum(h2 * h2)
    (p1, p2), (t1, t2) = jax.jvp(fj, (feeds[0], feeds[2]), (feeds[3], feeds[4]))
    for a, b in zip(r, (p1, p2, t1, t2), strict=True):
        np.testing.assert_allclose(a, np.asarray(b), **TOL)


def test_merge_subsumed_leaves_different_loops_alone() -> None:
    """A loop whose carry evolves differently is not read off another (the bodies are compared)."""
    def f(x: Any, xs: Any) -> Any:
        a, _ = opgraph.scan(lambda c, v: (c + v, c), x, xs)
        b, _ = opgraph.scan(lambda c, v: (c * v, c), x, xs)
        return a, b
    x, xs = RNG.normal(size=2), RNG.normal(size=(3, 2))
    g = opgraph.trace(f, x, xs)
    assert merge_subsumed(g).counts == {}
    assert merge_overlapping_scans(g).counts == {}  # they share inputs, but no op of their bodies


# ---------------------------------------------------------------- engines, files
@pytest.mark.parametrize("backend", ["numpy", "jax", "torch"])
def test_jvp_graph_on_engines(backend: str) -> None:
    if backend != "numpy":
        pytest.importorskip(backend)
    w, h0, xs = RNG.normal(size=(3, 3)) * 0.5, RNG.normal(size=3), RNG.normal(size=(5, 3))
    tw = RNG.normal(size=(3, 3))
    a = np.array([2.5]), np.array([1.0])

    def both(w: Any, tw: Any, a: Any, x0: Any) -> Any:
        _, t1 = opgraph.jvp(lambda w: rnn(w, h0, xs), (w,), (tw,))
        _, t2 = opgraph.jvp(newton_sqrt, (a, x0), (np.ones(1), np.zeros(1)))
        return t1, t2
    got = opgraph.jit(both, backend=backend)(w, tw, *a)
    want1 = jax.jvp(lambda w: rnn_jax(w, h0, xs), (w,), (tw,))[1]
    want2 = jax.jvp(newton_sqrt_jax, a, (np.ones(1), np.zeros(1)))[1]
    np.testing.assert_allclose(got[0], np.asarray(want1), **TOL)
    np.testing.assert_allclose(got[1], np.asarray(want2), **TOL)


@pytest.mark.parametrize("suffix", [".cg", ".json"])
def test_jvp_graph_saved_and_loaded(tmp_path: Any, suffix: str) -> None:
    w, xs = np.array([0.8, 1.3, 0.2]), RNG.normal(size=(3, 4))
    tw, txs = RNG.normal(size=3), RNG.normal(size=(3, 4))
    g = opgraph.trace(lambda p, t: opgraph.jvp(nested, p, t), (w, xs), (tw, txs))
    path = tmp_path / f"jvp{suffix}"
    opgraph.save(g, path)
    loaded = opgraph.load(path)
    got = loaded.run(dict(zip([loaded.name_of(int(v)) for v in loaded.inputs], (w, xs, tw, txs), strict=True)))
    out, tan = jax.jvp(nested_jax, (w, xs), (tw, txs))
    np.testing.assert_allclose(got[0], np.asarray(out), **TOL)
    np.testing.assert_allclose(got[1], np.asarray(tan), **TOL)
