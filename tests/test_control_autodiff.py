"""Reverse-mode gradients through call / cond / scan / while_loop (ops/control.py rules, autodiff/control.py).

Every gradient is checked against central finite differences in float64 and,
where jax is installed, against ``jax.grad`` of the ``jax.lax`` equivalent.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.autodiff import NoGradientError
from opgraph.core.subgraph import Subgraph

try:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
except ImportError:  # pragma: no cover - jax is an optional extra
    jax = None

needs_jax = pytest.mark.skipif(jax is None, reason="jax is not installed (the finite-difference checks still run)")

F8 = "float64"


def make_body(fn: Callable[..., Sequence[Any]], types: Sequence[Any], name: str = "body") -> Subgraph:
    """A Subgraph whose parameters have ``types`` and whose results are ``fn(builder, *params)``."""
    sb = opgraph.GraphBuilder()
    params = [sb.input(t, name=f"p{i}") for i, t in enumerate(types)]
    sb.output(*fn(sb, *params))
    return Subgraph(sb.freeze(), name=name)


class Loss:
    """A scalar loss graph over float64 inputs, with its gradient ops from ``build_grad_ops``."""

    def __init__(self, shapes: Sequence[tuple[int, ...]], build: Callable[..., Any]) -> None:
        b = opgraph.GraphBuilder()
        self.xs = [b.input((F8, s), name=f"a{i}") for i, s in enumerate(shapes)]
        self.loss = build(b, *self.xs)
        self.grads = b.build_grad_ops(self.loss, self.xs)
        self.b = b

    def value(self, *args: np.ndarray) -> float:
        return float(self.b.run(dict(zip(self.xs, args, strict=True)), [self.loss])[0])

    def grad(self, *args: np.ndarray) -> list[np.ndarray]:
        return self.b.run(dict(zip(self.xs, args, strict=True)), self.grads)


def fd_grad(f: Callable[..., float], args: Sequence[np.ndarray], eps: float = 1e-6) -> list[np.ndarray]:
    """Central finite differences of scalar ``f`` for each argument."""
    out = []
    for k, a in enumerate(args):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            plus = [np.array(x, dtype=np.float64) for x in args]
            minus = [np.array(x, dtype=np.float64) for x in args]
            plus[k][idx] += eps
            minus[k][idx] -= eps
            g[idx] = (f(*plus) - f(*minus)) / (2 * eps)
        out.append(g)
    return out


def check(loss: Loss, args: Sequence[np.ndarray], jax_fn: Callable[..., Any] | None = None,
          tol: float = 1e-6) -> list[np.ndarray]:
    got = loss.grad(*args)
    for g, n in zip(got, fd_grad(loss.value, args), strict=True):
        np.testing.assert_allclose(g, n, rtol=tol, atol=tol)
    if jax_fn is not None and jax is not None:
        jv = float(jax_fn(*args))
        assert loss.value(*args) == pytest.approx(jv, rel=1e-12, abs=1e-12)
        jg = jax.grad(jax_fn, argnums=tuple(range(len(args))))(*args)
        for g, j in zip(got, jg, strict=True):
            np.testing.assert_allclose(g, np.asarray(j), rtol=1e-10, atol=1e-12)
    return got


rng = np.random.default_rng(1234)


# ---------------------------------------------------------------- call
def test_call_gradient() -> None:
    body = make_body(lambda b, x, y: [b.multiply(b.sin(x), y), b.multiply(x, x)], [(F8, (3,))] * 2, "f")

    def build(b: Any, x: Any, y: Any, w: Any) -> Any:
        r0, r1 = b.op("call", x, y, body=body)
        return b.add(b.sum(r0), b.sum(b.multiply(r1, w)))

    def jf(x: Any, y: Any, w: Any) -> Any:
        return jnp.sum(jnp.sin(x) * y) + jnp.sum(x * x * w)

    check(Loss([(3,)] * 3, build), [rng.normal(size=3) for _ in range(3)], jf)


def test_call_with_unused_result_and_integer_argument() -> None:
    body = make_body(lambda b, x, n: [b.multiply(x, b.cast(n, dtype=F8)), b.exp(x), n],
                     [(F8, (2,)), ("int64", ())], "g")

    def build(b: Any, x: Any) -> Any:
        r0, _, _ = b.op("call", x, b.constant(np.array(3)), body=body)
        return b.sum(b.sin(r0))

    check(Loss([(2,)], build), [rng.normal(size=2)], lambda x: jnp.sum(jnp.sin(x * 3.0)))


# ---------------------------------------------------------------- cond
@pytest.mark.parametrize("taken", [True, False])
def test_cond_gradient_both_branches(taken: bool) -> None:
    then_b = make_body(lambda b, x, y: [b.multiply(b.sin(x), y), b.sum(x)], [(F8, (3,))] * 2, "then")
    else_b = make_body(lambda b, x, y: [b.multiply(b.multiply(x, y), y), b.sum(b.exp(y))], [(F8, (3,))] * 2, "else")

    def build(b: Any, x: Any, y: Any) -> Any:
        pred = b.constant(np.array(taken))
        r0, r1 = b.op("cond", pred, x, y, then_body=then_b, else_body=else_b)
        return b.add(b.sum(b.tanh(r0)), b.multiply(r1, r1))

    def jf(x: Any, y: Any) -> Any:
        r0, r1 = jax.lax.cond(taken, lambda x, y: (jnp.sin(x) * y, jnp.sum(x)),
                              lambda x, y: (x * y * y, jnp.sum(jnp.exp(y))), x, y)
        return jnp.sum(jnp.tanh(r0)) + r1 * r1

    check(Loss([(3,), (3,)], build), [rng.normal(size=3), rng.normal(size=3)], jf)


def test_cond_predicate_from_data() -> None:
    then_b = make_body(lambda b, x: [b.multiply(x, x)], [(F8, (2,))], "sq")
    else_b = make_body(lambda b, x: [b.negative(x)], [(F8, (2,))], "neg")

    def build(b: Any, x: Any) -> Any:
        (r,) = (b.op("cond", b.greater(b.sum(x), 0.0), x, then_body=then_b, else_body=else_b),)
        return b.sum(b.multiply(r, b.constant(np.array([1.0, 2.0]))))

    loss = Loss([(2,)], build)
    for x in (np.array([1.0, 0.5]), np.array([-1.0, 0.5])):
        check(loss, [x], lambda x: jnp.sum(jax.lax.cond(jnp.sum(x) > 0, lambda x: x * x, lambda x: -x, x)
                                           * jnp.array([1.0, 2.0])))


# ---------------------------------------------------------------- scan
H, X1 = 3, 2


def _rnn_like_body() -> Subgraph:
    """consts (W, v), carries (h, s), xs (x1, x2) -> carries (h', s'), ys (y1, y2)."""

    def fn(b: Any, w: Any, v: Any, h: Any, s: Any, x1: Any, x2: Any) -> list[Any]:
        h2 = b.tanh(b.add(b.matmul(w, h), b.multiply(b.sum(x1), v)))
        s2 = b.add(s, b.multiply(b.sum(b.multiply(h2, h2)), x2))
        y1 = b.multiply(h2, x2)
        y2 = b.multiply(b.sum(h), b.sum(b.multiply(v, b.sum(x1))))
        return [h2, s2, y1, y2]

    return make_body(fn, [(F8, (H, H)), (F8, (H,)), (F8, (H,)), (F8, ()), (F8, (X1,)), (F8, ())], "cell")


def _jax_cell(w: Any, v: Any, h: Any, s: Any, x1: Any, x2: Any) -> tuple[Any, Any, Any, Any]:
    h2 = jnp.tanh(w @ h + jnp.sum(x1) * v)
    s2 = s + jnp.sum(h2 * h2) * x2
    return h2, s2, h2 * x2, jnp.sum(h) * jnp.sum(v * jnp.sum(x1))


N = 6
SCAN_SHAPES = [(H, H), (H,), (H,), (), (N, X1), (N,)]


def _scan_args() -> list[np.ndarray]:
    return [np.asarray(rng.normal(size=s) * (0.6 if i == 0 else 1.0)) for i, s in enumerate(SCAN_SHAPES)]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("which", ["both", "ys", "carry"])
def test_scan_gradient(reverse: bool, which: str) -> None:
    body = _rnn_like_body()

    def build(b: Any, w: Any, v: Any, h0: Any, s0: Any, x1: Any, x2: Any) -> Any:
        h, s, y1, y2 = b.op("scan", w, v, h0, s0, x1, x2, body=body, num_consts=2, num_carry=2, reverse=reverse)
        ys = b.add(b.sum(b.sin(y1)), b.sum(b.multiply(y2, y2)))
        carry = b.add(b.sum(b.multiply(h, h)), b.multiply(s, 0.5))
        return {"both": lambda: b.add(ys, carry), "ys": lambda: ys, "carry": lambda: carry}[which]()

    def jf(w: Any, v: Any, h0: Any, s0: Any, x1: Any, x2: Any) -> Any:
        def f(c: Any, x: Any) -> Any:
            h2, s2, y1, y2 = _jax_cell(w, v, c[0], c[1], x[0], x[1])
            return (h2, s2), (y1, y2)

        (h, s), (y1, y2) = jax.lax.scan(f, (h0, s0), (x1, x2), reverse=reverse)
        ys = jnp.sum(jnp.sin(y1)) + jnp.sum(y2 * y2)
        carry = jnp.sum(h * h) + s * 0.5
        return {"both": ys + carry, "ys": ys, "carry": carry}[which]

    check(Loss(SCAN_SHAPES, build), _scan_args(), jf)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("n", [5, 1, 0])
def test_scan_whose_ys_are_its_carry(reverse: bool, n: int) -> None:
    """The body returns its carry as a y too (``h, h``): the rule reads the carries off the ys."""

    def fn(b: Any, w: Any, h: Any, x: Any) -> list[Any]:
        h2 = b.tanh(b.add(b.matmul(w, h), x))
        return [h2, h2]

    body = make_body(fn, [(F8, (3, 3)), (F8, (3,)), (F8, (3,))], "rnn")

    def build(b: Any, w: Any, h0: Any, xs: Any) -> Any:
        h, hs = b.op("scan", w, h0, xs, body=body, num_consts=1, num_carry=1, reverse=reverse)
        return b.add(b.sum(b.multiply(h, h)), b.sum(b.sin(hs)))

    def jf(w: Any, h0: Any, xs: Any) -> Any:
        def f(h: Any, x: Any) -> Any:
            h2 = jnp.tanh(w @ h + x)
            return h2, h2

        h, hs = jax.lax.scan(f, h0, xs, reverse=reverse)
        return jnp.sum(h * h) + jnp.sum(jnp.sin(hs))

    loss = Loss([(3, 3), (3,), (n, 3)], build)
    assert loss.b.freeze().dump().count("= scan(") == 2  # the forward scan and the reverse one, no extra scan
    check(loss, [rng.normal(size=(3, 3)) * 0.5, rng.normal(size=3), rng.normal(size=(n, 3))], jf)


def test_scan_without_xs_and_with_length() -> None:
    body = make_body(lambda b, a, c: [b.add(b.multiply(b.sin(c), a), 0.1), b.multiply(c, c)],
                     [(F8, (2,)), (F8, (2,))], "osc")

    def build(b: Any, a: Any, c0: Any) -> Any:
        c, ys = b.op("scan", a, c0, body=body, num_consts=1, num_carry=1, length=7)
        return b.add(b.sum(c), b.sum(b.sqrt(b.add(ys, 1.0))))

    def jf(a: Any, c0: Any) -> Any:
        c, ys = jax.lax.scan(lambda c, _: (jnp.sin(c) * a + 0.1, c * c), c0, None, length=7)
        return jnp.sum(c) + jnp.sum(jnp.sqrt(ys + 1.0))

    check(Loss([(2,), (2,)], build), [rng.normal(size=2), rng.normal(size=2)], jf)


def test_scan_integer_carry_and_zero_length() -> None:
    body = make_body(lambda b, k, c, x: [b.add(k, b.constant(np.array(1))), b.multiply(c, b.cos(x)),
                                         b.multiply(b.cast(k, dtype=F8), x)],
                     [("int64", ()), (F8, (2,)), (F8, (2,))], "count")

    def build(b: Any, c0: Any, xs: Any) -> Any:
        _, c, ys = b.op("scan", b.constant(np.array(0)), c0, xs, body=body, num_carry=2)
        return b.add(b.sum(c), b.sum(ys))

    def jf(c0: Any, xs: Any) -> Any:
        def f(carry: Any, x: Any) -> Any:
            k, c = carry
            return (k + 1, c * jnp.cos(x)), k * x

        (_, c), ys = jax.lax.scan(f, (0, c0), xs)
        return jnp.sum(c) + jnp.sum(ys)

    check(Loss([(2,), (5, 2)], build), [rng.normal(size=2), rng.normal(size=(5, 2))], jf)
    loss0 = Loss([(2,), (0, 2)], build)
    g = loss0.grad(np.array([1.0, 2.0]), np.zeros((0, 2)))
    np.testing.assert_array_equal(g[0], np.ones(2))
    assert g[1].shape == (0, 2)


def test_nested_scan() -> None:
    inner = make_body(lambda b, a, c, x: [b.add(b.multiply(c, a), b.sin(x)), b.multiply(c, x)],
                      [(F8, ()), (F8, ()), (F8, ())], "inner")

    def outer_fn(b: Any, a: Any, c: Any, row: Any) -> list[Any]:
        c2, ys = b.op("scan", a, c, row, body=inner, num_consts=1, num_carry=1)
        return [b.tanh(c2), b.sum(ys)]

    outer = make_body(outer_fn, [(F8, ()), (F8, ()), (F8, (4,))], "outer")

    def build(b: Any, a: Any, c0: Any, xs: Any) -> Any:
        c, ys = b.op("scan", a, c0, xs, body=outer, num_consts=1, num_carry=1)
        return b.add(b.multiply(c, c), b.sum(b.multiply(ys, ys)))

    def jf(a: Any, c0: Any, xs: Any) -> Any:
        def inner_f(c: Any, x: Any) -> Any:
            return c * a + jnp.sin(x), c * x

        def outer_f(c: Any, row: Any) -> Any:
            c2, ys = jax.lax.scan(inner_f, c, row)
            return jnp.tanh(c2), jnp.sum(ys)

        c, ys = jax.lax.scan(outer_f, c0, xs)
        return c * c + jnp.sum(ys * ys)

    check(Loss([(), (), (3, 4)], build), [np.array(0.7), np.array(0.3), rng.normal(size=(3, 4))], jf)


def test_second_order_through_scan() -> None:
    body = make_body(lambda b, w, c, x: [b.tanh(b.add(b.multiply(w, c), x)), b.multiply(c, c)],
                     [(F8, (2,)), (F8, (2,)), (F8, (2,))], "cell")
    b = opgraph.GraphBuilder()
    w, c0, xs = b.input((F8, (2,)), name="w"), b.input((F8, (2,)), name="c0"), b.input((F8, (5, 2)), name="xs")
    c, ys = b.op("scan", w, c0, xs, body=body, num_consts=1, num_carry=1)
    loss = b.add(b.sum(b.multiply(c, c)), b.sum(ys))
    (gw,) = b.build_grad_ops(loss, [w])
    # a scalar function of the gradient, differentiated again
    loss2 = b.sum(b.multiply(gw, b.constant(np.array([1.0, -2.0]))))
    (ggw,) = b.build_grad_ops(loss2, [w])
    W, C0, XS = rng.normal(size=2), rng.normal(size=2), rng.normal(size=(5, 2))

    def first(w_: np.ndarray) -> np.ndarray:
        return b.run({w: w_, c0: C0, xs: XS}, [gw])[0]

    got = b.run({w: W, c0: C0, xs: XS}, [ggw])[0]
    num = fd_grad(lambda w_: float(first(w_) @ np.array([1.0, -2.0])), [W])[0]
    np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-6)
    if jax is not None:
        def jf(w_: Any) -> Any:
            c, ys = jax.lax.scan(lambda c, x: (jnp.tanh(w_ * c + x), c * c), C0, XS)
            return jnp.sum(c * c) + jnp.sum(ys)

        jg = jax.grad(lambda w_: jnp.sum(jax.grad(jf)(w_) * jnp.array([1.0, -2.0])))(W)
        np.testing.assert_allclose(got, np.asarray(jg), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- while_loop
def _while_bodies() -> tuple[Subgraph, Subgraph]:
    """consts (a, limit:int), carry (x, k:int): while k < limit: x = sin(x) * a + x / 2; ys: x * x."""
    cond = make_body(lambda b, a, lim, x, k: [b.less(k, lim)], [(F8, (2,)), ("int64", ()), (F8, (2,)), ("int64", ())],
                     "test")
    step = make_body(lambda b, a, lim, x, k: [b.add(b.multiply(b.sin(x), a), b.multiply(x, 0.5)),
                                              b.add(k, b.constant(np.array(1))), b.multiply(x, x)],
                     [(F8, (2,)), ("int64", ()), (F8, (2,)), ("int64", ())], "step")
    return cond, step


@pytest.mark.parametrize("limit,max_trip", [(3, 6), (6, 6), (8, 6)])
@pytest.mark.parametrize("use_ys", [False, True])
def test_while_loop_with_max_trip(limit: int, max_trip: int, use_ys: bool) -> None:
    cond, step = _while_bodies()

    def build(b: Any, a: Any, x0: Any) -> Any:
        x, _, ys = b.op("while_loop", a, b.constant(np.array(limit)), x0, b.constant(np.array(0)),
                        cond_body=cond, body=step, num_consts=2, max_trip=max_trip)
        loss = b.sum(b.multiply(x, x))
        if use_ys:
            loss = b.add(loss, b.sum(b.sin(ys)))
        return loss

    trips = min(limit, max_trip)

    def jf(a: Any, x0: Any) -> Any:
        x, ys = jax.lax.scan(lambda x, _: (jnp.sin(x) * a + x * 0.5, x * x), x0, None, length=trips)
        return jnp.sum(x * x) + (jnp.sum(jnp.sin(ys)) if use_ys else 0.0)

    loss = Loss([(2,), (2,)], build)
    args = [rng.normal(size=2), rng.normal(size=2)]
    check(loss, args, jf)


def test_while_loop_without_max_trip_has_no_gradient() -> None:
    cond, step = _while_bodies()
    b = opgraph.GraphBuilder()
    a, x0 = b.input((F8, (2,)), name="a"), b.input((F8, (2,)), name="x0")
    x, _, _ = b.op("while_loop", a, b.constant(np.array(3)), x0, b.constant(np.array(0)), cond_body=cond,
                   body=step, num_consts=2)
    with pytest.raises(NoGradientError, match="max_trip"):
        b.build_grad_ops(b.sum(x), [a])


# ---------------------------------------------------------------- lazy arrays / opgraph.grad
def test_grad_function_through_lazy_scan() -> None:
    import opgraph.numpy as onp
    from opgraph.frontend.lazy import apply

    body = make_body(lambda b, w, c, x: [b.tanh(b.add(b.multiply(w, c), x)), b.multiply(c, x)],
                     [(F8, (2,)), (F8, (2,)), (F8, (2,))], "cell")

    def f(w: Any, c0: Any, xs: Any) -> Any:
        c, ys = apply("scan", w, c0, xs, body=body, num_consts=1, num_carry=1)
        return onp.sum(c * c) + onp.sum(ys)

    args = [rng.normal(size=2), rng.normal(size=2), rng.normal(size=(4, 2))]
    got = opgraph.grad(f, argnums=(0, 1, 2))(*args)

    def value(*a: np.ndarray) -> float:
        return float(opgraph.function(f)(*a))

    for g, n in zip(got, fd_grad(value, args), strict=True):
        np.testing.assert_allclose(g, n, rtol=1e-6, atol=1e-6)
    # lazy gradients of lazy arrays (opgraph.grad(loss, wrt))
    w = onp.asarray(args[0])
    (gw,) = opgraph.grad(f(w, onp.asarray(args[1]), onp.asarray(args[2])), [w])
    np.testing.assert_allclose(gw.eval(), got[0], rtol=1e-12)


# ---------------------------------------------------------------- an RNN trained with scan
def test_rnn_trained_with_scan_matches_unrolled() -> None:
    hid, inp, steps = 8, 3, 20
    cell = make_body(lambda b, wh, wx, bias, h, x: [b.tanh(b.add(b.add(b.matmul(wh, h), b.matmul(wx, x)), bias))],
                     [(F8, (hid, hid)), (F8, (hid, inp)), (F8, (hid,)), (F8, (hid,)), (F8, (inp,))], "rnn_cell")
    shapes = [(hid, hid), (hid, inp), (hid,), (hid,)]

    def readout(b: Any, h: Any, wo: Any, target: Any) -> Any:
        d = b.subtract(b.sum(b.multiply(wo, h)), target)
        return b.multiply(d, d)

    def build(unrolled: bool) -> Callable[[list[np.ndarray]], tuple[float, list[np.ndarray]]]:
        b = opgraph.GraphBuilder()
        params = [b.input((F8, s), name=f"p{i}") for i, s in enumerate(shapes)]
        xs = b.input((F8, (steps, inp)), name="xs")
        target = b.input((F8, ()), name="target")
        h0 = b.constant(np.zeros(hid))
        wh, wx, bias, wo = params
        if unrolled:
            h = h0
            for t in range(steps):
                h = b.tanh(b.add(b.add(b.matmul(wh, h), b.matmul(wx, b.op("getitem", xs, index=(t,)))), bias))
        else:
            h = b.op("scan", wh, wx, bias, h0, xs, body=cell, num_consts=3, num_carry=1)
        loss = readout(b, h, wo, target)
        b.output(loss, *b.build_grad_ops(loss, params))
        g = b.freeze()

        def run(p: list[np.ndarray]) -> tuple[float, list[np.ndarray]]:
            out = g.run({"p0": p[0], "p1": p[1], "p2": p[2], "p3": p[3], "xs": XS, "target": T})
            return float(out[0]), out[1:]

        return run

    r = np.random.default_rng(7)
    P = [r.normal(size=s) * 0.4 for s in shapes]
    XS, T = r.normal(size=(steps, inp)), np.array(0.8)
    scanned, unrolled = build(False), build(True)
    losses = []
    for _ in range(50):
        ls, gs = scanned(P)
        lu, gu = unrolled(P)
        assert ls == pytest.approx(lu, rel=1e-12)
        for a, c in zip(gs, gu, strict=True):
            np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-10)
        losses.append(ls)
        P = [p - 0.1 * g for p, g in zip(P, gs, strict=True)]
    assert losses[-1] < 0.1 * losses[0]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(losses[:6]))


# ---------------------------------------------------------------- through the front ends (opgraph.scan, ...)
def _fd_check(f: Callable[..., Any], args: list[np.ndarray], jf: Callable[..., Any] | None) -> None:
    n = len(args)
    got = opgraph.grad(f, argnums=tuple(range(n)))(*args)
    value = opgraph.function(f)
    for g, num in zip(got, fd_grad(lambda *a: float(value(*a)), args), strict=True):
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-6)
    if jax is not None and jf is not None:
        for g, j in zip(got, jax.grad(jf, argnums=tuple(range(n)))(*args), strict=True):
            np.testing.assert_allclose(g, np.asarray(j), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_frontend_scan_with_pytrees(reverse: bool) -> None:
    import opgraph.numpy as onp

    def f(w: Any, h0: Any, xs: Any) -> Any:
        def step(c: Any, x: Any) -> Any:
            h = onp.tanh(w @ c["h"] + x["a"] * x["b"])
            return {"h": h, "s": c["s"] + onp.sum(h)}, (h * h, onp.sum(h * x["a"]))

        c, (y1, y2) = opgraph.scan(step, {"h": h0, "s": onp.asarray(0.0)}, {"a": xs, "b": onp.sin(xs)},
                                   reverse=reverse)
        return onp.sum(c["h"]) + c["s"] + onp.sum(y1) + onp.sum(y2 * y2)

    def jf(w: Any, h0: Any, xs: Any) -> Any:
        def step(c: Any, x: Any) -> Any:
            h = jnp.tanh(w @ c["h"] + x["a"] * x["b"])
            return {"h": h, "s": c["s"] + jnp.sum(h)}, (h * h, jnp.sum(h * x["a"]))

        c, (y1, y2) = jax.lax.scan(step, {"h": h0, "s": jnp.asarray(0.0)}, {"a": xs, "b": jnp.sin(xs)},
                                   reverse=reverse)
        return jnp.sum(c["h"]) + c["s"] + jnp.sum(y1) + jnp.sum(y2 * y2)

    _fd_check(f, [rng.normal(size=(3, 3)) * 0.5, rng.normal(size=3), rng.normal(size=(6, 3))], jf)


def test_frontend_cond_fori_and_call() -> None:
    import opgraph.numpy as onp

    def f(a: Any, x0: Any) -> Any:
        x = opgraph.fori_loop(0, 4, lambda i, x: onp.sin(x) * a + x * 0.5, x0)
        y = opgraph.cond(onp.sum(x) > 0, lambda x: x * x, lambda x: onp.exp(x) * a, x)
        return onp.sum(opgraph.call(lambda u, v: u * v + onp.cos(u), y, a))

    def jf(a: Any, x0: Any) -> Any:
        x = jax.lax.fori_loop(0, 4, lambda i, x: jnp.sin(x) * a + x * 0.5, x0)
        y = jax.lax.cond(jnp.sum(x) > 0, lambda x: x * x, lambda x: jnp.exp(x) * a, x)
        return jnp.sum(y * a + jnp.cos(y))

    for x0 in (np.array([1.0, 2.0]), np.array([-3.0, -2.0])):
        _fd_check(f, [np.array([0.3, 0.4]), x0], jf)


def test_frontend_while_loop_with_data_dependent_trips() -> None:
    """Newton's iteration for sqrt(a): the trip count depends on a; d sqrt(a)/da = 1 / (2 sqrt(a))."""
    import opgraph.numpy as onp

    def f(a: Any) -> Any:
        def body(s: Any) -> Any:
            x = 0.5 * (s["x"] + a / s["x"])
            return {"x": x, "err": onp.abs(x * x - a)}

        out = opgraph.while_loop(lambda s: s["err"] > 1e-13, body, {"x": a, "err": onp.asarray(1.0)}, max_trip=50)
        return out["x"]

    for a in (2.0, 9.0, 1e4):
        g = opgraph.grad(f)(np.array(a))
        np.testing.assert_allclose(float(g), 0.5 / np.sqrt(a), rtol=1e-9)
    with pytest.raises(NoGradientError, match="max_trip"):
        opgraph.grad(lambda a: opgraph.while_loop(lambda x: x < 10.0, lambda x: x * 2.0, a))(np.array(1.0))


def test_frontend_explicit_builder() -> None:
    b = opgraph.GraphBuilder()
    w, xs = b.input((F8, (2,)), name="w"), b.input((F8, (5, 2)), name="xs")
    def step(c: Any, x: Any) -> Any:
        sb = c.owner  # the body's builder
        return sb.tanh(sb.add(sb.multiply(w, c), x)), c

    c, ys = opgraph.scan(step, b.constant(np.zeros(2)), xs)
    loss = b.add(b.sum(c), b.sum(b.multiply(ys, ys)))
    gw, gx = b.build_grad_ops(loss, [w, xs])
    W, XS = rng.normal(size=2), rng.normal(size=(5, 2))

    def value(w_: np.ndarray, x_: np.ndarray) -> float:
        return float(b.run({w: w_, xs: x_}, [loss])[0])

    got = b.run({w: W, xs: XS}, [gw, gx])
    for g, n in zip(got, fd_grad(value, [W, XS]), strict=True):
        np.testing.assert_allclose(g, n, rtol=1e-6, atol=1e-6)


def test_frontend_second_order_through_scan() -> None:
    import opgraph.numpy as onp

    c0, xs = np.array([0.1, 0.2]), rng.normal(size=(5, 2))

    def f(w: Any) -> Any:
        c, ys = opgraph.scan(lambda c, x: (onp.tanh(w * c + x), c * c), onp.asarray(c0), onp.asarray(xs))
        return onp.sum(c * c) + onp.sum(ys)

    W = np.array([0.5, -0.7])
    hess = opgraph.hessian(f)(W)
    grad_f = opgraph.grad(f)
    num = np.stack([fd_grad(lambda w, k=k: float(grad_f(w)[k]), [W])[0] for k in range(2)])
    np.testing.assert_allclose(hess, num, rtol=1e-6, atol=1e-6)
    if jax is not None:
        def jf(w: Any) -> Any:
            c, ys = jax.lax.scan(lambda c, x: (jnp.tanh(w * c + x), c * c), c0, xs)
            return jnp.sum(c * c) + jnp.sum(ys)

        np.testing.assert_allclose(hess, np.asarray(jax.hessian(jf)(W)), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- what the reverse pass computes
def _rnn_step_graph(wrt: str) -> tuple[opgraph.Graph, opgraph.Graph]:
    """A scan RNN's loss and its gradient for ``wrt`` ("w" or "all"), and the same loss unrolled."""
    hid, inp, steps = 5, 3, 6
    cell = make_body(lambda b, w, u, h, x: [b.tanh(b.add(b.matmul(h, w), b.matmul(x, u)))],
                     [(F8, (hid, hid)), (F8, (inp, hid)), (F8, (2, hid)), (F8, (2, inp))], "cell")
    graphs = []
    for unrolled in (False, True):
        b = opgraph.GraphBuilder()
        w, u = b.input((F8, (hid, hid)), name="w"), b.input((F8, (inp, hid)), name="u")
        h0, xs = b.input((F8, (2, hid)), name="h0"), b.input((F8, (steps, 2, inp)), name="xs")
        if unrolled:
            h = h0
            for t in range(steps):
                h = b.tanh(b.add(b.matmul(h, w), b.matmul(b.op("getitem", xs, index=(t,)), u)))
        else:
            h = b.op("scan", w, u, h0, xs, body=cell, num_consts=2, num_carry=1)
        loss = b.sum(b.multiply(h, h))
        wrt_values = [w] if wrt == "w" else [w, u, h0, xs]
        b.output(loss, *b.build_grad_ops(loss, wrt_values))
        graphs.append(b.freeze())
    return graphs[0], graphs[1]


def _reverse_step(g: opgraph.Graph) -> Subgraph:
    (step,) = [s for s in g.subgraphs if s.name.startswith("reverse(")]
    return step


@pytest.mark.parametrize("wrt", ["w", "all"])
def test_reverse_pass_reads_forward_results_and_skips_unasked_cotangents(wrt: str) -> None:
    g, unrolled = _rnn_step_graph(wrt)
    r = np.random.default_rng(3)
    feeds = {"w": r.normal(size=(5, 5)) * 0.5, "u": r.normal(size=(3, 5)), "h0": r.normal(size=(2, 5)),
             "xs": r.normal(size=(6, 2, 3))}
    for a, c in zip(g.run(feeds), unrolled.run(feeds), strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-11, atol=1e-12)
    step = _reverse_step(g).graph
    kinds = [step.kind_of(op) for op in range(step.num_ops)]
    # tanh's gradient reads the step's result, handed in from the forward pass: nothing is recomputed
    assert "tanh" not in kinds
    # d/dw: one matmul per step (the carry's cotangent; w's own is summed by one matmul after the loop); with
    # u and xs asked for too, the xs' cotangent and u's (a (3,2)@(2,5) product, smaller than its factors) join it
    assert kinds.count("matmul") == (1 if wrt == "w" else 3)
    if wrt == "w":
        # w's cotangent sum_t h_t^T d_t: the step returns d_t only; h_t^T is read off the stacked carries by
        # the one matmul after the loop (no per-step transpose stacked)
        assert len(step.outputs) == 2
