"""Tests of the control-flow op family (ids 1300-1399): call, cond, while_loop, scan.

Each op runs as a one-op graph (``opcheck.check_op``, so tests/backend_suite.py re-runs every case on
jax, torch and onnxruntime) against a plain Python loop over NumPy computing the same thing. Bodies
are built with the explicit builder here; the front ends (opgraph.scan, ...) are tested in
tests/test_control_frontend.py, gradients in tests/test_control_autodiff.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import opgraph
from opcheck import check_op, out_type, rand
from opgraph.core.registry import get_op
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType
from opgraph.errors import OpBuildError

IDS = {"call": 1300, "cond": 1301, "while_loop": 1302, "scan": 1303}
RNG = np.random.default_rng(1300)
F8 = "float64"


def body(fn: Callable[..., Any], *types: Any, name: str = "") -> Subgraph:
    """A body from ``fn(b, *params)`` returning its results (a Value or a tuple of them)."""
    b = opgraph.GraphBuilder()
    params = [b.input(t, name=f"p{i}") for i, t in enumerate(types)]
    res = fn(b, *params)
    b.output(*(res if isinstance(res, tuple) else (res,)))
    return Subgraph(b.freeze(), name=name or fn.__name__)


def test_ids_and_family() -> None:
    for name, id_ in IDS.items():
        op = get_op(name)
        assert (op.id, op.family, get_op(id_).name) == (id_, "control", name)
        assert op.doc and op.kernel is not None
    assert {o.name for o in opgraph.all_ops() if o.family == "control"} == set(IDS)


# ---------------------------------------------------------------- call
def test_call() -> None:
    x, y = rand(RNG, (3, 4)), rand(RNG, (4,))
    f = body(lambda b, x, y: (b.tanh(b.add(x, y)), b.sum(x)), (F8, (3, 4)), (F8, (4,)), name="f")
    check_op("call", [x, y], lambda x, y: (np.tanh(x + y), np.sum(x)), body=f)


def test_call_body_is_stored_once() -> None:
    f = body(lambda b, x: b.multiply(x, 2.0), (F8, (3,)), name="double")
    b = opgraph.GraphBuilder()
    v = b.input((F8, (3,)), name="x")
    for _ in range(10):
        v = b.op("call", v, body=f)
    b.output(v)
    g = b.freeze()
    assert g.num_ops == 10 and len(g.attrs) == 1 and g.subgraphs == (f,)
    x = rand(RNG, (3,))
    np.testing.assert_allclose(g.run({"x": x})[0], x * 2.0**10)


# ---------------------------------------------------------------- cond
@pytest.mark.parametrize("pred", [True, False])
def test_cond(pred: bool) -> None:
    x, y = rand(RNG, (2, 3)), rand(RNG, (3,))
    then = body(lambda b, x, y: b.add(x, y), (F8, (2, 3)), (F8, (3,)), name="plus")
    other = body(lambda b, x, y: b.multiply(x, y), (F8, (2, 3)), (F8, (3,)), name="times")
    check_op("cond", [np.array(pred), x, y], lambda p, x, y: x + y if p else x * y,
             then_body=then, else_body=other)


def test_cond_numeric_predicate_and_merged_shapes() -> None:
    # A nonzero number is true; branches whose shapes differ give a result with an unknown dim.
    then = body(lambda b, x: b.getitem(x, index=(slice(0, 2),)), (F8, (4,)), name="head")
    other = body(lambda b, x: b.getitem(x, index=(slice(1, 4),)), (F8, (4,)), name="tail")
    assert out_type("cond", ("int64", (1,)), (F8, (4,)), then_body=then, else_body=other) == TensorType(F8, (None,))
    x = rand(RNG, (4,))
    for p, want in ((np.array([3]), x[:2]), (np.array([0]), x[1:])):
        b = opgraph.GraphBuilder()
        pv, xv = b.input(("int64", (1,)), name="p"), b.input((F8, (4,)), name="x")
        b.output(b.op("cond", pv, xv, then_body=then, else_body=other))
        np.testing.assert_array_equal(b.freeze().run({"p": p, "x": x})[0], want)


# ---------------------------------------------------------------- while_loop
def _halve_until_below() -> tuple[Subgraph, Subgraph]:
    # while sum(x) > limit: x = x / 2; n = n + 1   (consts: limit)
    test = body(lambda b, lim, x, n: b.greater(b.sum(x), lim), (F8, ()), (F8, (3,)), ("int64", ()), name="big")
    step = body(lambda b, lim, x, n: (b.divide(x, 2.0), b.add(n, 1)), (F8, ()), (F8, (3,)), ("int64", ()),
                name="halve")
    return test, step


def _halve_reference(lim: np.ndarray, x: np.ndarray, n: np.ndarray, max_trip: int | None = None) -> Any:
    trips = 0
    while (max_trip is None or trips < max_trip) and x.sum() > lim:
        x, n = x / 2.0, n + 1
        trips += 1
    return x, n


@pytest.mark.parametrize("limit", [100.0, 1.0, 1e-3])
def test_while_loop_data_dependent_trips(limit: float) -> None:
    test, step = _halve_until_below()
    x = np.abs(rand(RNG, (3,))) + 1.0
    got = check_op("while_loop", [np.array(limit), x, np.array(0)], _halve_reference, cond_body=test, body=step,
                   num_consts=1)
    assert int(got[1]) == int(np.ceil(np.log2(max(x.sum() / limit, 1.0))))


@pytest.mark.parametrize("max_trip", [0, 2, 50])
def test_while_loop_max_trip(max_trip: int) -> None:
    test, step = _halve_until_below()
    x = np.full(3, 10.0)
    check_op("while_loop", [np.array(1e-3), x, np.array(0)],
             lambda lim, x, n: _halve_reference(lim, x, n, max_trip), cond_body=test, body=step, num_consts=1,
             max_trip=max_trip)


def test_while_loop_stacks_ys() -> None:
    # Collatz: the trajectory of n is a stacked result whose length is the trip count.
    test = body(lambda b, n: b.greater(n, 1), ("int64", ()), name="not_one")

    def collatz(b: Any, n: Any) -> Any:
        odd = b.equal(b.remainder(n, 2), 1)
        nxt = b.where(odd, b.add(b.multiply(n, 3), 1), b.floor_divide(n, 2))
        return nxt, n

    step = body(collatz, ("int64", ()))

    def reference(n: np.ndarray) -> Any:
        path = []
        while n > 1:
            path.append(n)
            n = 3 * n + 1 if n % 2 else n // 2
        return n, np.array(path, dtype=np.int64)

    assert out_type("while_loop", ("int64", ()), cond_body=test, body=step)[1] == TensorType("int64", (None,))
    for start in (1, 6, 27):
        got = check_op("while_loop", [np.array(start)], reference, cond_body=test, body=step)
        assert got[1].shape == (len(reference(np.array(start))[1]),)


# ---------------------------------------------------------------- scan
def _rnn_cell() -> Subgraph:
    def cell(b: Any, w: Any, h: Any, x: Any) -> Any:
        h2 = b.tanh(b.add(b.matmul(h, w), x))
        return h2, b.sum(h2, axis=1)

    return body(cell, (F8, (4, 4)), (F8, (2, 4)), (F8, (2, 4)), name="cell")


def _rnn_reference(w: np.ndarray, h: np.ndarray, xs: np.ndarray, reverse: bool = False) -> Any:
    ys = np.empty(xs.shape[:2])
    for i in (reversed(range(len(xs))) if reverse else range(len(xs))):
        h = np.tanh(h @ w + xs[i])
        ys[i] = h.sum(axis=1)
    return h, ys


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_rnn(reverse: bool) -> None:
    w, h, xs = rand(RNG, (4, 4)), rand(RNG, (2, 4)), rand(RNG, (7, 2, 4))
    check_op("scan", [w, h, xs], lambda w, h, xs: _rnn_reference(w, h, xs, reverse), body=_rnn_cell(),
             num_consts=1, num_carry=1, reverse=reverse)


def test_scan_several_carries_and_xs() -> None:
    # Fibonacci-like pair carry, two sequences in, two stacked results out.
    def step(b: Any, a: Any, c: Any, x: Any, y: Any) -> Any:
        return c, b.add(b.add(a, c), b.multiply(x, y)), b.add(a, x), b.multiply(c, y)

    f = body(step, (F8, (3,)), (F8, (3,)), (F8, (3,)), (F8, (3,)))
    a, c, xs, ys = rand(RNG, (3,)), rand(RNG, (3,)), rand(RNG, (5, 3)), rand(RNG, (5, 3))

    def reference(a: np.ndarray, c: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> Any:
        s, t = [], []
        for x, y in zip(xs, ys, strict=True):
            s.append(a + x)
            t.append(c * y)
            a, c = c, a + c + x * y
        return a, c, np.array(s), np.array(t)

    check_op("scan", [a, c, xs, ys], reference, body=f, num_carry=2)


def test_scan_length_without_xs_and_empty() -> None:
    f = body(lambda b, c: (b.multiply(c, 1.5), b.sum(c)), (F8, (2,)), name="grow")
    c = rand(RNG, (2,))
    for n in (4, 0):
        def reference(c: np.ndarray, n: int = n) -> Any:
            ys = []
            for _ in range(n):
                ys.append(c.sum())
                c = c * 1.5
            return c, np.array(ys, dtype=np.float64).reshape(n)

        got = check_op("scan", [c], reference, body=f, num_carry=1, length=n)
        assert not np.shares_memory(got[0], c)


def test_scan_of_scalars_slices_are_arrays() -> None:
    # Scanning a 1-d sequence gives the body 0-d arrays (a running product and its prefix values).
    f = body(lambda b, c, x: (b.multiply(c, x), c), (F8, ()), (F8, ()), name="prod")
    xs = rand(RNG, (6,))
    check_op("scan", [np.array(1.0), xs], lambda c, xs: (np.prod(xs), np.concatenate([[1.0], np.cumprod(xs)[:-1]])),
             body=f, num_carry=1, rtol=1e-12)


def test_nested_scan() -> None:
    inner = body(lambda b, c, x: (b.add(c, x), b.multiply(c, x)), (F8, ()), (F8, ()), name="inner")

    def outer_step(b: Any, c: Any, row: Any) -> Any:
        s, prods = b.op("scan", c, row, body=inner, num_carry=1)
        return s, prods

    outer = body(outer_step, (F8, ()), (F8, (3,)), name="outer")
    xs = rand(RNG, (4, 3))

    def reference(c: np.ndarray, xs: np.ndarray) -> Any:
        out = np.empty_like(xs)
        for i, row in enumerate(xs):
            for j, x in enumerate(row):
                out[i, j] = c * x
                c = c + x
        return c, out

    got = check_op("scan", [np.array(0.5), xs], reference, body=outer, num_carry=1, rtol=1e-12)
    assert got[1].shape == (4, 3)


# ---------------------------------------------------------------- build errors
def test_type_errors_name_the_body_and_position() -> None:
    cell = _rnn_cell()
    with pytest.raises(OpBuildError, match=r"scan body 'cell' parameter 2 \(x\[0\]\) is f64\[2,4\] but scan passes "
                                           r"f32\[2,4\] \(at .*opcheck.py:\d+\)"):
        out_type("scan", (F8, (4, 4)), (F8, (2, 4)), ("float32", (7, 2, 4)), body=cell, num_consts=1, num_carry=1)
    bad = body(lambda b, h, x: (b.sum(h), h), (F8, (2, 4)), (F8, (2, 4)), name="bad_step")
    with pytest.raises(OpBuildError, match=r"scan body 'bad_step' returns f64\[\] at position 0 \(carry\[0\]\) "
                                           r"where scan needs f64\[2,4\]"):
        out_type("scan", (F8, (2, 4)), (F8, (5, 2, 4)), body=bad, num_carry=1)
    with pytest.raises(OpBuildError, match=r"the xs have different leading lengths \[3, 5\]"):
        two = body(lambda b, x, y: b.add(x, y), (F8, ()), (F8, ()))
        out_type("scan", (F8, (3,)), (F8, (5,)), body=two)
    with pytest.raises(OpBuildError, match="scan without xs needs length="):
        out_type("scan", (F8, ()), body=body(lambda b, c: c, (F8, ())), num_carry=1)
    then = body(lambda b, x: x, (F8, (2,)), name="same")
    other = body(lambda b, x: b.cast(x, dtype="float32"), (F8, (2,)), name="narrow")
    with pytest.raises(OpBuildError, match=r"result 0 is f64\[2\] in then body 'same' and f32\[2\] in else body "
                                           r"'narrow'"):
        out_type("cond", ("bool", ()), (F8, (2,)), then_body=then, else_body=other)
    with pytest.raises(OpBuildError, match=r"the predicate must be a one-element tensor, got bool\[3\]"):
        out_type("cond", ("bool", (3,)), (F8, (2,)), then_body=then, else_body=then)
    test, step = _halve_until_below()
    with pytest.raises(OpBuildError, match=r"cond body 'big' takes 3 parameter\(s\) but while_loop passes 2 "
                                           r"\(carry\[0\], carry\[1\]\)"):
        out_type("while_loop", (F8, (3,)), ("int64", ()), cond_body=test, body=step)
    with pytest.raises(OpBuildError, match=r"cond body 'halve' must return one one-element tensor"):
        out_type("while_loop", (F8, ()), (F8, (3,)), ("int64", ()), cond_body=step, body=step, num_consts=1)
    with pytest.raises(OpBuildError, match=r"called body 'cell' takes 3 parameter\(s\) but call passes 1"):
        out_type("call", (F8, (4, 4)), body=cell)


def test_dynamic_dims_match_any_size() -> None:
    f = body(lambda b, x: b.sum(x, axis=0), (F8, (None, 3)), name="colsum")
    assert out_type("call", (F8, (5, 3)), body=f) == TensorType(F8, (3,))
    x = rand(RNG, (5, 3))
    check_op("call", [x], lambda x: x.sum(axis=0), body=f, rtol=1e-12)


def test_zero_trips_keep_the_rank_of_ys_with_unknown_dims() -> None:
    # A y of unknown length: with no trip at all the stacked result still has the declared rank.
    test = body(lambda b, n, x: b.greater(n, 0), ("int64", ()), (F8, (None,)), name="more")
    step = body(lambda b, n, x: (b.subtract(n, 1), x, b.multiply(x, 2.0)), ("int64", ()), (F8, (None,)),
                name="double")
    x = rand(RNG, (3,))
    for n in (0, 2):
        b = opgraph.GraphBuilder()
        nv, xv = b.input(("int64", ()), name="n"), b.input((F8, (None,)), name="x")
        outs = b.op("while_loop", nv, xv, cond_body=test, body=step)
        b.output(*outs)
        got = b.freeze().run({"n": np.array(n), "x": x})
        want = np.array([x * 2.0] * n).reshape(n, -1 if n else 0)
        assert got[2].shape == want.shape and np.array_equal(got[2], want)
