"""Control-flow front ends (opgraph.cond / while_loop / scan / fori_loop / call): against plain Python loops over
NumPy and against jax.lax, on lazy arrays, under @opgraph.function, with pytrees and with the explicit builder."""

from __future__ import annotations

import collections
import re
from typing import Any

import numpy as np
import pytest

import opgraph
import opgraph.numpy as onp
from opgraph.errors import OpBuildError
from opgraph.frontend.control import current_builder
from opgraph.frontend.lazy import TracingError

Point = collections.namedtuple("Point", "x v")
HERE = __file__


def _jax() -> Any:
    jax = pytest.importorskip("jax", reason="jax is an optional extra; make test installs it")
    jax.config.update("jax_enable_x64", True)
    return jax


def _kinds(g: opgraph.Graph) -> list[str]:
    return [op.kind for op in g.ops()]


def _crun(g: opgraph.Graph, *args: object) -> list[np.ndarray]:
    """Run ``g`` on the compiled NumPy engine (opgraph.compile), its inputs fed in order."""
    return list(opgraph.compile(g)({g.name_of(int(v)): a for v, a in zip(g.inputs, args, strict=True)}))


def _line_of(text: str) -> int:
    """The line of this file holding ``text`` (to check that an error names the user's line)."""
    with open(HERE) as f:
        for i, line in enumerate(f, 1):
            if text in line:
                return i
    raise AssertionError(text)


@pytest.fixture
def data(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"W": rng.normal(size=(4, 4)) * 0.4, "U": rng.normal(size=(3, 4)) * 0.4, "xs": rng.normal(size=(7, 3)),
            "h0": rng.normal(size=4)}


# ---------------------------------------------------------------- scan
def rnn_step_np(W: np.ndarray, U: np.ndarray) -> Any:
    def step(h: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = np.tanh(h @ W + x @ U)
        return h, h.sum()
    return step


def test_scan_lazy_matches_python_loop_and_jax(data: dict[str, np.ndarray]) -> None:
    W, U = onp.asarray(data["W"]), onp.asarray(data["U"])

    def step(h, x):
        h = onp.tanh(h @ W + x @ U)
        return h, h.sum()

    h, ys = opgraph.scan(step, onp.asarray(data["h0"]), onp.asarray(data["xs"]))
    ref_step = rnn_step_np(data["W"], data["U"])
    rh, rys = data["h0"], []
    for x in data["xs"]:
        rh, y = ref_step(rh, x)
        rys.append(y)
    np.testing.assert_allclose(h.eval(), rh, rtol=1e-12)
    np.testing.assert_allclose(ys.eval(), np.array(rys), rtol=1e-12)
    jax = _jax()
    jW, jU = jax.numpy.asarray(data["W"]), jax.numpy.asarray(data["U"])
    jh, jys = jax.lax.scan(lambda h, x: (jax.numpy.tanh(h @ jW + x @ jU),) * 2, data["h0"], data["xs"])
    np.testing.assert_allclose(h.eval(), np.asarray(jh), rtol=1e-12)
    np.testing.assert_allclose(ys.eval(), np.asarray(jys).sum(axis=1), rtol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_pytrees_reverse_vs_jax(reverse: bool, rng: np.random.Generator) -> None:
    xs = {"a": rng.normal(size=(5, 2)), "b": (rng.normal(size=5), rng.normal(size=(5, 3)))}
    init = Point(x=np.zeros(2), v=0.0)

    def step(c, x):
        nx = c.x * 0.9 + x["a"] * x["b"][0]
        nv = c.v + x["b"][1].sum()
        return Point(nx, nv), {"s": nx.sum() + nv, "p": (nx * 2, nv)}

    carry, ys = opgraph.scan(step, Point(onp.asarray(init.x), init.v), {
        "a": onp.asarray(xs["a"]), "b": (onp.asarray(xs["b"][0]), onp.asarray(xs["b"][1]))}, reverse=reverse)
    assert isinstance(carry, Point) and set(ys) == {"s", "p"}
    # a plain Python loop over NumPy
    c = init
    out: list[dict] = [None] * 5  # type: ignore[list-item]
    for i in (range(4, -1, -1) if reverse else range(5)):
        nx = c.x * 0.9 + xs["a"][i] * xs["b"][0][i]
        nv = c.v + xs["b"][1][i].sum()
        c = Point(nx, nv)
        out[i] = {"s": nx.sum() + nv, "p": (nx * 2, nv)}
    np.testing.assert_allclose(carry.x.eval(), c.x, rtol=1e-12)
    np.testing.assert_allclose(carry.v.eval(), c.v, rtol=1e-12)
    np.testing.assert_allclose(ys["s"].eval(), [o["s"] for o in out], rtol=1e-12)
    np.testing.assert_allclose(ys["p"][0].eval(), [o["p"][0] for o in out], rtol=1e-12)
    np.testing.assert_allclose(ys["p"][1].eval(), [o["p"][1] for o in out], rtol=1e-12)
    jax = _jax()
    jc, jys = jax.lax.scan(step, Point(init.x, np.float64(0.0)), xs, reverse=reverse)
    np.testing.assert_allclose(carry.x.eval(), np.asarray(jc.x), rtol=1e-12)
    np.testing.assert_allclose(ys["s"].eval(), np.asarray(jys["s"]), rtol=1e-12)
    np.testing.assert_allclose(ys["p"][0].eval(), np.asarray(jys["p"][0]), rtol=1e-12)


def test_scan_without_xs_and_none_ys() -> None:
    c, ys = opgraph.scan(lambda c, _: (c * 2.0, None), onp.asarray(1.5), length=6)
    assert ys is None and float(c) == 1.5 * 2 ** 6
    (a, b), ys = opgraph.scan(lambda c, _: ((c[1], c[0] + c[1]), c[0]), (0, 1), None, length=10)
    fib = [0, 1]
    for _ in range(10):
        fib.append(fib[-1] + fib[-2])
    assert int(a) == fib[10] and int(b) == fib[11]
    np.testing.assert_array_equal(ys.eval(), fib[:10])


def test_scan_under_function_one_op_body_once(data: dict[str, np.ndarray]) -> None:
    calls = []

    @opgraph.function
    def run(h0, xs, W, U):
        def step(h, x):
            calls.append(1)
            h = onp.tanh(h @ W + x @ U)  # W, U: traced inputs used by the body -> const operands
            return h, h.sum()
        a = opgraph.scan(step, h0, xs)
        b = opgraph.scan(step, a[0], xs)  # a second scan of the same step: the body is stored once
        return a[1] + b[1]

    args = (data["h0"], data["xs"], data["W"], data["U"])
    got = run(*args)
    g = run.graph(*args)
    g.verify()
    scans = [op for op in g.ops() if op.kind == "scan"]
    assert len(scans) == 2 and len(g.subgraphs) == 1 and len(calls) == 2
    assert scans[0].attrs["body"] is scans[1].attrs["body"]
    assert scans[0].attrs["num_consts"] == 2 and scans[0].attrs["num_carry"] == 1
    body = g.subgraphs[0].graph
    assert _kinds(body).count("matmul") == 2 and "const" not in _kinds(body)  # W, U came in as parameters
    step = rnn_step_np(data["W"], data["U"])
    h, ys = data["h0"], []
    for _ in range(2):
        for x in data["xs"]:
            h, y = step(h, x)
            ys.append(y)
    np.testing.assert_allclose(got, np.array(ys[:7]) + np.array(ys[7:]), rtol=1e-12)
    np.testing.assert_allclose(_crun(g, *args)[0], got, rtol=1e-12)


def test_closures_become_consts_small_literals_stay_inside(rng: np.random.Generator) -> None:
    big = onp.asarray(rng.normal(size=(10, 10)))
    x = onp.placeholder((10,), name="x")
    c, _ = opgraph.scan(lambda c, _: (c @ big + 1.0 + onp.asarray([2.0]), None), x, length=3)
    g = onp.to_graph([c], inputs=[x])
    (scan_op,) = [op for op in g.ops() if op.kind == "scan"]
    assert scan_op.attrs["num_consts"] == 1  # big; the literals 1.0 and [2.0] are constants of the body
    body = scan_op.attrs["body"].graph
    assert sorted(body.constants[i].size for i in range(len(body.constants))) == [1, 1]
    ref = rng.normal(size=10)
    r = ref
    for _ in range(3):
        r = r @ np.asarray(big) + 3.0
    np.testing.assert_allclose(g.run({"x": ref})[0], r, rtol=1e-12)


# ---------------------------------------------------------------- cond
def test_cond_vs_python_and_jax(rng: np.random.Generator) -> None:
    jax = _jax()
    x = onp.placeholder((3,), name="x")
    t = onp.placeholder((), name="t")

    def yes(v, s, np_=onp):
        return {"a": v * s, "b": (np_.sum(v), 1.0)}

    def no(v, s, np_=onp):
        return {"a": v - s, "b": (np_.max(v), s)}

    out = opgraph.cond(onp.sum(x) > t, yes, no, x, t)
    g = onp.to_graph([out["a"], *out["b"]], inputs=[x, t])
    g.verify()
    assert _kinds(g).count("cond") == 1 and len(g.subgraphs) == 2
    for _ in range(6):
        xv, tv = rng.normal(size=3), rng.normal()
        ref = yes(xv, tv, np) if xv.sum() > tv else no(xv, tv, np)
        jref = jax.lax.cond(xv.sum() > tv, lambda v, s: yes(v, s, jax.numpy), lambda v, s: no(v, s, jax.numpy), xv, tv)
        for got in (g.run({"x": xv, "t": np.float64(tv)}), _crun(g, xv, np.float64(tv))):
            np.testing.assert_allclose(got[0], ref["a"], rtol=1e-12)
            np.testing.assert_allclose(got[1:], ref["b"], rtol=1e-12)
            np.testing.assert_allclose(got[0], np.asarray(jref["a"]), rtol=1e-12)
            np.testing.assert_allclose(got[2], np.asarray(jref["b"][1]), rtol=1e-12)


def test_cond_concrete_and_python_pred() -> None:
    a = onp.asarray([1.0, 2.0])
    assert opgraph.cond(True, lambda v: v + 1, lambda v: v - 1, a).eval().tolist() == [2.0, 3.0]
    assert opgraph.cond(onp.asarray(0), lambda v: v + 1, lambda v: v - 1, a).eval().tolist() == [0.0, 1.0]
    # no operands: the branches close over what they use
    assert float(opgraph.cond(a[0] > 0, lambda: a.sum(), lambda: a.prod())) == 3.0


# ---------------------------------------------------------------- while_loop
def test_while_loop_vs_python_and_jax() -> None:
    jax = _jax()

    def body(s, np_=onp):
        return {"k": s["k"] + 1, "v": s["v"] * 1.5 + np_.ones(2)}

    def test(s):
        return s["v"].sum() < 100.0

    out = opgraph.while_loop(test, body, {"k": 0, "v": onp.asarray([0.5, 1.0])})
    s = {"k": 0, "v": np.array([0.5, 1.0])}
    while s["v"].sum() < 100.0:
        s = body(s, np)
    assert int(out["k"]) == s["k"] > 3
    np.testing.assert_allclose(out["v"].eval(), s["v"], rtol=1e-12)
    js = jax.lax.while_loop(test, lambda s: body(s, jax.numpy), {"k": 0, "v": np.array([0.5, 1.0])})
    assert int(js["k"]) == int(out["k"])
    np.testing.assert_allclose(out["v"].eval(), np.asarray(js["v"]), rtol=1e-12)


def test_while_loop_max_trip() -> None:
    out = opgraph.while_loop(lambda c: c < 1000, lambda c: c + 1, onp.asarray(0), max_trip=7)
    assert int(out) == 7


def newton_sqrt(a: Any) -> Any:
    """sqrt(a) by Newton's iteration until the step is tiny; returns (root, trips)."""
    def go(s):
        return onp.abs(s[0] * s[0] - a) > 1e-12 * a

    def step(s):
        x, n = s
        return 0.5 * (x + a / x), n + 1

    return opgraph.while_loop(go, step, (a, 0))


def test_newton_while_loop_data_dependent_trips() -> None:
    @opgraph.function
    def root(a):
        return newton_sqrt(a)

    trips = {}
    for a in (2.0, 1e6, 1e-4, 12345.678):
        x, n = root(np.asarray(a))
        np.testing.assert_allclose(x, np.sqrt(a), rtol=1e-12)
        # the same iteration in plain Python
        rx, rn = a, 0
        while abs(rx * rx - a) > 1e-12 * a:
            rx, rn = 0.5 * (rx + a / rx), rn + 1
        assert int(n) == rn
        trips[a] = int(n)
    assert len(set(trips.values())) > 1  # the trip count depends on the data
    assert root.cache_size == 1  # one graph for every input
    g = root.graph(np.asarray(2.0))
    g.verify()
    assert _kinds(g).count("while_loop") == 1
    x, n = _crun(g, np.asarray(1e6))
    assert float(x) == pytest.approx(1000.0, rel=1e-12) and int(n) == trips[1e6]


# ---------------------------------------------------------------- fori_loop
def test_fori_loop_static_is_scan_dynamic_is_while_vs_jax() -> None:
    jax = _jax()

    def body(i, acc, np_=onp):
        return {"s": acc["s"] + i * acc["v"], "v": acc["v"] * 0.5}

    init = {"s": np.zeros(2), "v": np.array([1.0, 3.0])}
    x = onp.placeholder((2,), name="x")
    out = opgraph.fori_loop(2, 9, body, {"s": onp.zeros(2), "v": x})
    g = onp.to_graph([out["s"], out["v"]], inputs=[x])
    assert "scan" in _kinds(g) and "while_loop" not in _kinds(g)
    n = onp.placeholder((), "int64", name="n")
    out_d = opgraph.fori_loop(2, n, body, {"s": onp.zeros(2), "v": x})
    gd = onp.to_graph([out_d["s"], out_d["v"]], inputs=[x, n])
    assert "while_loop" in _kinds(gd) and "scan" not in _kinds(gd)
    g.verify()
    gd.verify()
    acc = dict(init)
    for i in range(2, 9):
        acc = body(i, acc, np)
    jref = jax.lax.fori_loop(2, 9, lambda i, a: body(i, a, jax.numpy), init)
    got = g.run({"x": init["v"]})
    got_d = gd.run({"x": init["v"], "n": np.int64(9)})
    for res in (got, got_d):
        np.testing.assert_allclose(res[0], acc["s"], rtol=1e-12)
        np.testing.assert_allclose(res[1], acc["v"], rtol=1e-12)
        np.testing.assert_allclose(res[0], np.asarray(jref["s"]), rtol=1e-12)
    np.testing.assert_allclose(gd.run({"x": init["v"], "n": np.int64(1)})[0], 0.0)  # no trip
    assert float(opgraph.fori_loop(5, 2, lambda i, c: c + 1.0, 0.0)) == 0.0


def test_fori_loop_int32_bounds_take_the_array_dtype() -> None:
    n = onp.asarray(np.int32(4))
    out = opgraph.fori_loop(0, n, lambda i, c: c + i, onp.asarray(np.int32(0)))
    assert out.dtype == np.int32 and int(out) == 6
    xs = np.arange(10.0) ** 2
    lx = onp.asarray(xs)
    # the index reads an array (a gather with a traced index); mixed int32/int64 bounds meet at int64
    assert float(opgraph.fori_loop(0, 4, lambda i, c: c + lx[i], 0.0)) == xs[:4].sum()
    assert float(opgraph.fori_loop(onp.asarray(np.int32(2)), onp.asarray(7), lambda i, c: c + lx[i], 0.0)) == \
        xs[2:7].sum()
    b = opgraph.GraphBuilder()
    lo, hi = b.input(("int32", ()), name="lo"), b.input(("int64", ()), name="hi")
    r = opgraph.fori_loop(lo, hi, lambda i, c: c.owner.add(c, c.owner.cast(i, dtype="float64")), 0.0)
    b.output(r)
    g = b.freeze().verify()
    assert "while_loop" in _kinds(g)
    assert float(g.run({"lo": np.int32(2), "hi": np.int64(6)})[0]) == 2 + 3 + 4 + 5


# ---------------------------------------------------------------- call / subroutine
def test_call_and_subroutine_store_body_once(rng: np.random.Generator) -> None:
    @opgraph.subroutine
    def block(h, p):
        return {"h": onp.tanh(h @ p["w"] + p["b"]), "n": onp.sum(h * h)}

    @opgraph.function
    def net(x, p):
        total = 0.0
        for _ in range(4):
            r = block(x, p)
            x, total = r["h"], total + r["n"]
        return x, total

    p = {"w": rng.normal(size=(3, 3)), "b": rng.normal(size=3)}
    x0 = rng.normal(size=(2, 3))
    got = net(x0, p)
    g = net.graph(x0, p)
    g.verify()
    assert _kinds(g).count("call") == 4 and len(g.subgraphs) == 1
    x, total = x0, 0.0
    for _ in range(4):
        total += np.sum(x * x)
        x = np.tanh(x @ p["w"] + p["b"])
    np.testing.assert_allclose(got[0], x, rtol=1e-12)
    np.testing.assert_allclose(got[1], total, rtol=1e-12)
    np.testing.assert_allclose(opgraph.compile(g)({"x": x0, "p.b": p["b"], "p.w": p["w"]})[0], x, rtol=1e-12)
    assert float(opgraph.call(lambda a, b: a * b, onp.asarray(3.0), 2.0)) == 6.0


# ---------------------------------------------------------------- nested
def test_nested_scan_in_scan_and_cond_in_while(rng: np.random.Generator) -> None:
    xs = rng.normal(size=(4, 3, 2))
    scale = onp.asarray(rng.normal(size=(2, 2)))
    X = onp.placeholder(xs.shape, name="X")

    def outer(c, row):
        def inner(d, x):
            d = onp.tanh(d @ scale + x * c.sum())  # c: the outer body's parameter; scale: from outside both
            return d, d[0]
        d, firsts = opgraph.scan(inner, c, row)
        return d, firsts.sum()

    c, ys = opgraph.scan(outer, onp.ones(2), X)
    g = onp.to_graph([c, ys], inputs=[X])
    g.verify()
    assert len(g.subgraphs) == 1 and len(opgraph.core.subgraph.subgraphs_of(g, recursive=True)) == 2
    S = np.asarray(scale)
    rc, rys = np.ones(2), []
    for row in xs:
        d, firsts = rc, []
        for x in row:
            d = np.tanh(d @ S + x * rc.sum())
            firsts.append(d[0])
        rc = d
        rys.append(sum(firsts))
    got = g.run({"X": xs})
    np.testing.assert_allclose(got[0], rc, rtol=1e-12)
    np.testing.assert_allclose(got[1], rys, rtol=1e-12)
    np.testing.assert_allclose(_crun(g, xs)[1], rys, rtol=1e-12)

    # cond inside while: the Collatz sequence
    def step(s):
        n, k = s
        return opgraph.cond(n % 2 == 0, lambda m: m // 2, lambda m: 3 * m + 1, n), k + 1

    n0 = onp.placeholder((), "int64", name="n0")
    n, k = opgraph.while_loop(lambda s: s[0] != 1, step, (n0, 0))
    gw = onp.to_graph([n, k], inputs=[n0])
    gw.verify()
    for start in (1, 6, 27, 97):
        m, steps = start, 0
        while m != 1:
            m, steps = (m // 2 if m % 2 == 0 else 3 * m + 1), steps + 1
        assert [int(v) for v in gw.run({"n0": np.int64(start)})] == [1, steps]


# ---------------------------------------------------------------- explicit builder
def test_builder_scan_while_cond_fori_call(data: dict[str, np.ndarray]) -> None:
    b = opgraph.GraphBuilder()
    h0 = b.input(("float64", (4,)), name="h0")
    xs = b.input(("float64", (7, 3)), name="xs")
    W = b.input(("float64", (4, 4)), name="W")
    U = b.input(("float64", (3, 4)), name="U")

    def step(h, x):
        sb = h.owner  # the body's builder; W and U (outer Values) are captured as consts
        h = sb.tanh(sb.add(sb.matmul(h, W), sb.matmul(x, U)))
        return h, sb.sum(h)

    h, ys = opgraph.scan(step, h0, xs)
    (scan_op,) = [op for op in b.freeze().ops() if op.kind == "scan"]
    assert scan_op.attrs["num_consts"] == 2
    big = opgraph.cond(b.greater(b.sum(h), 0.0), lambda v: v, lambda v: v.owner.negative(v), h)
    n = b.input(("int64", ()), name="n")
    halved = opgraph.while_loop(lambda s: s[1].owner.less(s[1], n), lambda s: (
        current_builder().multiply(s[0], 0.5), current_builder().add(s[1], 1)), (big, 0))
    acc = opgraph.fori_loop(0, 3, lambda i, c: current_builder().add(c, current_builder().cast(i, dtype="float64")),
                            halved[0])
    out = opgraph.call(lambda a, y: {"a": a.owner.multiply(a, 2.0), "y": y}, acc, ys)
    b.output(out["a"], out["y"])
    g = b.freeze()
    g.verify()
    step_np = rnn_step_np(data["W"], data["U"])
    rh, rys = data["h0"], []
    for x in data["xs"]:
        rh, y = step_np(rh, x)
        rys.append(y)
    rbig = rh if rh.sum() > 0 else -rh
    ref = (rbig * 0.5 ** 3 + 3.0) * 2.0
    feeds = {"h0": data["h0"], "xs": data["xs"], "W": data["W"], "U": data["U"], "n": np.int64(3)}
    got = g.run(feeds)
    np.testing.assert_allclose(got[0], ref, rtol=1e-12)
    np.testing.assert_allclose(got[1], rys, rtol=1e-12)
    np.testing.assert_allclose(opgraph.compile(g)(feeds)[0], ref, rtol=1e-12)


def test_builder_nested_capture_from_grandparent() -> None:
    b = opgraph.GraphBuilder()
    w = b.input(("float64", ()), name="w")
    xs = b.input(("float64", (3, 2)), name="xs")

    def outer(c, row):
        def inner(d, x):
            sb = d.owner
            return sb.add(d, sb.multiply(x, w)), None  # w belongs to the outermost builder
        d, _ = opgraph.scan(inner, c, row)
        return d, d

    c, ys = opgraph.scan(outer, 0.0, xs)
    b.output(c, ys)
    g = b.freeze()
    g.verify()
    xv = np.arange(6.0).reshape(3, 2)
    got = g.run({"w": np.float64(2.0), "xs": xv})
    np.testing.assert_allclose(got[1], np.cumsum(xv.sum(axis=1) * 2.0))


# ---------------------------------------------------------------- errors
def test_error_carry_type_names_function_position_and_line() -> None:
    def my_step(c, x):
        return {"h": c["h"], "n": c["n"].astype("float32")}, None

    with pytest.raises(OpBuildError) as e:
        opgraph.scan(my_step, {"h": onp.zeros(2), "n": onp.zeros(3)}, onp.ones((4, 1)))  # SCAN-CALL
    msg = str(e.value)
    assert "body 'my_step'" in msg
    assert "carry['n']" in msg and "f32[3]" in msg and "f64[3]" in msg
    assert f"{HERE}:{_line_of('def my_step(c, x)')}" in msg  # where the body is defined
    assert f"{HERE}:{_line_of('# SCAN-CALL')}" in msg  # the user's call
    assert e.value.location == f"{HERE}:{_line_of('# SCAN-CALL')}"


def test_error_carry_shape_in_tuple_and_fori() -> None:
    with pytest.raises(OpBuildError, match=r"while_loop: body_fn 'grow' .* returns f64\[4\] for carry\[1\] where "
                                           r"init_val is f64\[2\]"):
        def grow(c):
            return c[0] + 1, onp.concat([c[1], c[1]])
        opgraph.while_loop(lambda c: c[0] < 3, grow, (0, onp.zeros(2)))
    with pytest.raises(OpBuildError, match=r"fori_loop: body 'bad' .* returns i64\[\] for init_val\['x'\] where "
                                           r"init_val is f64\[\]"):
        def bad(i, c):
            return {"x": i}
        opgraph.fori_loop(0, 3, bad, {"x": 0.0})
    for upper in (3, onp.asarray(3)):  # the scan and the while_loop forms
        want = r"fori_loop: the result of body 'flat' .* has structure PyTreeSpec\(\*\) but init_val has structure "
        with pytest.raises(OpBuildError, match=want + r"PyTreeSpec\(\{'x': \*\}\)"):
            def flat(i, c):
                return c["x"]
            opgraph.fori_loop(0, upper, flat, {"x": 0.0})


def test_error_tree_structure_mismatch() -> None:
    with pytest.raises(OpBuildError, match=r"the carry of body 'f' .* has structure PyTreeSpec\(\(\*, \*\)\) but "
                                           r"init has structure PyTreeSpec\(\{'a': \*, 'b': \*\}\)"):
        def f(c, x):
            return (c["a"], c["b"]), None
        opgraph.scan(f, {"a": 0.0, "b": 1.0}, onp.ones(3))


def test_error_pred_not_scalar_and_branch_mismatch() -> None:
    x = onp.ones(3)
    with pytest.raises(OpBuildError, match=r"cond: pred must be a scalar \(one element\), got bool\[3\]"):
        opgraph.cond(x > 0, lambda v: v, lambda v: v, x)
    with pytest.raises(OpBuildError, match=r"true_fn 'up' .* returns f64\[3\] for result\[1\] but false_fn "
                                           r"'down' .* returns f64\[2\]"):
        def up(v):
            return v, v
        def down(v):
            return v, v[:2]
        opgraph.cond(x.sum() > 0, up, down, x)
    with pytest.raises(OpBuildError, match=r"true_fn 'up' .* returns structure .* but false_fn 'one' .*"):
        def one(v):
            return v
        opgraph.cond(x.sum() > 0, up, one, x)
    with pytest.raises(OpBuildError, match=r"cond_fn 'lambda' .* must return a scalar, got f64\[3\]".replace(
            "'lambda'", "'<lambda>'")):
        opgraph.while_loop(lambda c: c, lambda c: c, x)


def test_error_xs_lengths() -> None:
    with pytest.raises(OpBuildError, match=r"scan: xs\['b'\] has leading length 4 but xs\['a'\] has 3"):
        opgraph.scan(lambda c, x: (c, None), 0.0, {"a": onp.ones(3), "b": onp.ones((4, 2))})
    with pytest.raises(OpBuildError, match=r"xs\[0\] has leading length 3 but length=5"):
        opgraph.scan(lambda c, x: (c, None), 0.0, (onp.ones(3),), length=5)
    with pytest.raises(OpBuildError, match=r"xs is f64\[\]: it needs a leading axis"):
        opgraph.scan(lambda c, x: (c, None), 0.0, onp.asarray(1.0))
    with pytest.raises(OpBuildError, match=r"body 'f' .* must return a pair \(carry, y\), got a LazyArray"):
        def f(c, x):
            return c
        opgraph.scan(f, 0.0, onp.ones(3))


def test_error_python_control_flow_in_body() -> None:
    def step(c, x):
        if c > 0:  # Python control flow on a traced value: the line the error names
            return c - x, None
        return c + x, None

    with pytest.raises(TracingError) as e:
        opgraph.scan(step, onp.asarray(1.0), onp.ones(3))
    msg = str(e.value)
    assert re.search(r"in body '.*step' of opgraph.scan", msg)
    assert "bool() of a traced value (it depends on input carry)" in msg and "opgraph.cond" in msg
    assert f"{HERE}:{_line_of('if c > 0:')}" in msg


def test_mixing_settings_is_refused() -> None:
    b = opgraph.GraphBuilder()
    v = b.input(("float64", ()), name="v")
    with pytest.raises(TypeError, match="mix lazy arrays and builder Values"):
        opgraph.scan(lambda c, x: (c, None), v, onp.ones(3))
    with pytest.raises(TypeError, match=r"carry\['a'\] is a str"):
        opgraph.while_loop(lambda c: True, lambda c: c, {"a": "text"})
    with pytest.raises(RuntimeError, match="only defined while a body is traced"):
        current_builder()


# ---------------------------------------------------------------- gradients (when the autodiff rules exist)
def test_grad_through_scan_and_fori_if_rules_exist(data: dict[str, np.ndarray]) -> None:
    W = data["W"]

    def loss(h0, w):
        def step(h, x):
            h = onp.tanh(h @ w + x @ onp.asarray(data["U"]))
            return h, onp.sum(h * h)
        h, ys = opgraph.scan(step, h0, onp.asarray(data["xs"]))
        return onp.sum(ys) + opgraph.fori_loop(0, 3, lambda i, c: c * 0.5 + onp.sum(h), 0.0)

    g = opgraph.grad(loss, argnums=(0, 1))(data["h0"], W)

    def ref(h0, w):
        h, tot = h0, 0.0
        for x in data["xs"]:
            h = np.tanh(h @ w + x @ data["U"])
            tot += np.sum(h * h)
        c = 0.0
        for _ in range(3):
            c = c * 0.5 + h.sum()
        return tot + c

    eps = 1e-6
    num = np.zeros_like(W)
    for idx in np.ndindex(W.shape):
        d = np.zeros_like(W)
        d[idx] = eps
        num[idx] = (ref(data["h0"], W + d) - ref(data["h0"], W - d)) / (2 * eps)
    np.testing.assert_allclose(g[1], num, rtol=1e-5, atol=1e-7)
