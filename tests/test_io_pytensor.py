"""PyTensor interop (seed 001's Theano FunctionGraph): to_pytensor, from_pytensor, round trips and errors."""

from __future__ import annotations

import os

# Python-only thunks: no C compiler runs, so compiling a function costs milliseconds, not seconds.
os.environ.setdefault("PYTENSOR_FLAGS", "cxx=")

from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import HealthCheck, given, settings
from pytensor.graph.fg import FunctionGraph

from opgraph import GraphBuilder
from opgraph.core.graph import Graph
from opgraph.errors import GraphError
from opgraph.io import pytensor as opt
from opgraph.io.pytensor import TO_PYTENSOR, from_pytensor, to_pytensor
from opgraph.passes.dce import dce
from test_io_dag import graphs

MODE = "FAST_COMPILE"
RNG = np.random.default_rng(0)


def _feeds(g: Graph) -> dict[int, np.ndarray]:
    feeds = {}
    for v in g.inputs.tolist():
        t = g.type_of(v)
        shape = tuple(3 if d is None else d for d in t.shape)
        if t.dtype.kind == "f":
            feeds[v] = RNG.standard_normal(shape).astype(t.dtype)
        elif t.dtype.kind == "b":
            feeds[v] = RNG.random(shape) > 0.5
        else:
            feeds[v] = RNG.choice([-3, -2, -1, 1, 2], shape).astype(t.dtype)  # no zero divisors
    return feeds


def _pt_run(fg: Any, feeds: dict[int, np.ndarray], g: Graph) -> list[np.ndarray]:
    f = pytensor.function(fg.inputs, fg.outputs, mode=MODE, on_unused_input="ignore")
    return [np.asarray(r) for r in f(*[feeds[v] for v in g.inputs.tolist()])]


def _check(g: Graph, rtol: float = 1e-7, atol: float = 1e-9) -> Graph:
    """pytensor.function(to_pytensor(g)) and from_pytensor(to_pytensor(g)) both compute what g computes."""
    feeds = _feeds(g)
    want = g.run(feeds)
    fg = to_pytensor(g)
    got = _pt_run(fg, feeds, g)
    back = from_pytensor(fg)
    again = back.run({i: feeds[v] for i, v in zip(back.inputs.tolist(), g.inputs.tolist(), strict=True)})
    for w, a, b in zip(want, got, again, strict=True):
        assert a.dtype == w.dtype and b.dtype == w.dtype
        np.testing.assert_allclose(a, w, rtol=rtol, atol=atol)
        np.testing.assert_allclose(b, w, rtol=rtol, atol=atol)
    return back


# ---------------------------------------------------------------- random graphs
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_round_trip(g: Graph):
    back = from_pytensor(to_pytensor(g))
    # PyTensor's FunctionGraph holds what the outputs need: compare with g minus its dead ops
    live = dce(g).graph
    assert back == live
    assert back.symbols.values == live.symbols.values


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_match_pytensor_function(g: Graph):
    _check(g)


# ---------------------------------------------------------------- op kinds one by one
def _one(kind: str, types: list[tuple[str, tuple[int | None, ...]]], **attrs: Any) -> Graph:
    b = GraphBuilder()
    ins = [b.input(t, name=f"a{i}") for i, t in enumerate(types)]
    out = b.op(kind, *ins, **attrs)
    b.output(*(out if isinstance(out, tuple) else (out,)))
    return b.freeze()


F = ("float64", (3, 4))
SQ = ("float64", (3, 3))
ONE_TO_ONE = [
    ("exp", [F], {}), ("negative", [F], {}), ("sigmoid", [F], {}), ("round", [F], {}), ("abs", [F], {}),
    ("add", [F, F], {}), ("divide", [F, F], {}), ("maximum", [F, F], {}), ("less", [F, F], {}),
    ("power", [("float64", (3, 4)), ("float64", (4,))], {}),
    ("where", [("bool", (3, 4)), F, F], {}), ("cast", [F], {"dtype": "int32"}),
    ("sum", [F], {"axis": 1, "keepdims": True}), ("max", [F], {"axis": None}), ("prod", [F], {"axis": (0, 1)}),
    ("mean", [F], {"axis": 0, "keepdims": True}), ("mean", [F], {}), ("argmax", [F], {"axis": 1}),
    ("argmin", [F], {"axis": 0, "keepdims": True}), ("argmax", [F], {}), ("any", [("bool", (3, 4))], {"axis": 1}),
    ("cumsum", [F], {"axis": 1}), ("cumprod", [F], {"axis": 0}),
    ("matmul", [F, ("float64", (4, 2))], {}), ("matmul", [("float64", (2, 3, 4)), ("float64", (2, 4, 5))], {}),
    ("einsum", [F, F], {"subscripts": "ij,ij->i"}), ("reshape", [F], {"shape": (2, -1)}),
    ("permute_dims", [F], {"axes": (1, 0)}), ("expand_dims", [F], {"axis": 1}),
    ("squeeze", [("float64", (3, 1, 4))], {"axis": 1}),
    ("broadcast_to", [("float64", (4,))], {"shape": (2, 3, 4)}), ("concat", [F, F], {"axis": 1}),
    ("stack", [F, F], {"axis": 1}), ("split", [F], {"sections": 2, "axis": 1}),
    ("split", [("float64", (6,))], {"sections": (1, 4)}), ("getitem", [F], {"index": (slice(1, None), 2)}),
    ("getitem", [F], {"index": (slice(None, None, -1),)}), ("take", [F, ("int64", (2,))], {"axis": 1}),
    ("softmax", [F], {"axis": 1}), ("log_softmax", [F], {"axis": 0}),
    ("inv", [SQ], {}), ("det", [SQ], {}),
]
NUMERIC = [
    ("logical_and", [("bool", (3, 4)), ("int64", (3, 4))], {}), ("logical_not", [F], {}),
    ("floor_divide", [("int64", (3, 4)), ("int64", (4,))], {}), ("remainder", [F, F], {}),
    ("var", [F], {"axis": 1, "correction": 1.0}), ("std", [F], {"keepdims": True}),
    ("logsumexp", [F], {"axis": 1}), ("cumsum", [F], {}), ("tensordot", [F, ("float64", (4, 3))], {"axes": 1}),
    ("outer", [("float64", (3,)), ("float64", (4,))], {}), ("vecdot", [F, F], {}),
    ("flip", [F], {"axis": 1}), ("tile", [F], {"reps": (2, 1)}), ("repeat", [F], {"repeats": 2, "axis": 0}),
    ("roll", [F], {"shift": 1, "axis": 1}), ("moveaxis", [("float64", (2, 3, 4))], {"source": 0, "destination": 2}),
    ("pad", [F], {"pad_width": ((1, 0), (0, 2))}), ("relu", [F], {}), ("fmax", [F, F], {}), ("hypot", [F, F], {}),
    ("take", [F, ("int64", (2,))], {}), ("concat", [F, ("float64", (2, 2))], {"axis": None}),
    ("mean", [("int32", (3, 4))], {"axis": 1}), ("sum", [("int8", (3, 4))], {}), ("divide", [("int64", (3,))] * 2, {}),
    ("fma", [F, F, F], {}), ("clip", [F, F, F], {}), ("permute_dims", [F], {}),
    ("squeeze", [("float64", (3, 1, 4))], {}),
    ("softmax", [F], {}), ("matmul_t", [F, F], {"transpose_b": True}), ("solve", [SQ, ("float64", (3,))], {}),
    ("eigvalsh", [SQ], {}), ("svdvals", [F], {}), ("slogdet", [SQ], {}), ("pinv", [F], {}),
]


def _spd(g: Graph) -> dict[int, np.ndarray]:
    feeds = _feeds(g)
    for v, a in feeds.items():
        if a.ndim == 2 and a.shape[0] == a.shape[1] and a.dtype.kind == "f":
            feeds[v] = a @ a.T + 3 * np.eye(a.shape[0])
    return feeds


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # power of negative bases: NaN
@pytest.mark.parametrize(("kind", "types", "attrs"), ONE_TO_ONE, ids=[f"{k}-{i}" for i, (k, *_) in
                                                                       enumerate(ONE_TO_ONE)])
def test_one_to_one_kinds(kind: str, types: Any, attrs: Any):
    g = _one(kind, types, **attrs)
    back = _check(g)
    assert back == g, (str(g), str(back))


@pytest.mark.parametrize(("kind", "types", "attrs"), NUMERIC, ids=[f"{k}-{i}" for i, (k, *_) in enumerate(NUMERIC)])
def test_kinds_compute_the_same(kind: str, types: Any, attrs: Any):
    g = _one(kind, types, **attrs)
    if kind in ("where",) or any(t[1] == (3, 3) for t in types):
        feeds = _spd(g)
        fg = to_pytensor(g)
        for w, a in zip(g.run(feeds), _pt_run(fg, feeds, g), strict=True):
            np.testing.assert_allclose(a, w, rtol=1e-7, atol=1e-9)
        back = from_pytensor(fg)
        for w, a in zip(g.run(feeds), back.run(feeds), strict=True):
            np.testing.assert_allclose(a, w, rtol=1e-7, atol=1e-9)
    else:
        _check(g)


def test_linalg_decompositions():
    b = GraphBuilder()
    a = b.input(SQ, name="a")
    m = b.input(("float64", (4, 3)), name="m")
    w, v = b.op("eigh", a)
    q, r = b.op("qr", m)
    u, s, vh = b.op("svd", m)
    b.output(b.op("cholesky", a), w, b.op("matmul", q, r), b.op("matmul", b.op("multiply", u, s), vh),
             b.op("abs", v))
    g = b.freeze()
    feeds = _spd(g)
    fg = to_pytensor(g)
    back = from_pytensor(fg)
    for w_, a_, c_ in zip(g.run(feeds), _pt_run(fg, feeds, g), back.run(feeds), strict=True):
        np.testing.assert_allclose(a_, w_, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(c_, w_, rtol=1e-7, atol=1e-9)


def test_table_lists_every_kind():
    assert set(TO_PYTENSOR) == set(opt._emitters())


def test_names_static_shapes_and_unknown_dims():
    b = GraphBuilder()
    x = b.input(("float32", (None, 3)), name="x")
    b.output(b.op("sum", b.op("multiply", x, 2.0), axis=0, name="total"))
    g = b.freeze()
    fg = to_pytensor(g)
    assert fg.inputs[0].name == "x" and fg.inputs[0].type.shape == (None, 3)
    assert fg.inputs[0].type.dtype == "float32" and fg.outputs[0].name == "total"
    back = from_pytensor(fg)
    assert back == g and back.value("total").type == g.value("total").type
    assert back.type_of(int(back.inputs[0])).shape == (None, 3)


# ---------------------------------------------------------------- hand-written PyTensor graphs
def test_logistic_regression_and_its_gradient():
    # static shapes: opgraph has no shape op, so the element count of pt.mean must be known statically
    x = pt.matrix("x", shape=(5, 3))
    y = pt.vector("y", shape=(5,))
    w = pt.vector("w", shape=(3,))
    c = pt.scalar("c")
    p = pt.sigmoid(pt.dot(x, w) + c)
    loss = -pt.mean(y * pt.log(p) + (1 - y) * pt.log1p(-p)) + 0.01 * pt.sum(w ** 2)
    gw, gc = pytensor.grad(loss, [w, c])
    outs = [loss, gw, gc]
    g = from_pytensor(FunctionGraph([x, y, w, c], outs, clone=True))
    assert [g.name_of(int(v)) for v in g.inputs] == ["x", "y", "w", "c"]
    xv, yv = RNG.standard_normal((5, 3)), (RNG.random(5) > 0.5).astype(float)
    wv, cv = RNG.standard_normal(3), np.array(0.3)
    want = pytensor.function([x, y, w, c], outs, mode=MODE)(xv, yv, wv, cv)
    got = g.run({"x": xv, "y": yv, "w": wv, "c": cv})
    for a, e in zip(got, want, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-10)


@pytest.mark.parametrize("mode", ["FAST_COMPILE", "FAST_RUN"])
def test_compiled_graph_after_rewrites(mode: str):
    x = pt.matrix("x", shape=(4, 3))
    w = pt.matrix("w", shape=(3, 2))
    z = pt.matrix("z", shape=(4, 2))
    out = pt.tanh(pt.dot(x, w) * 2.0 + z).sum(axis=1) + pt.exp(z).max()
    f = pytensor.function([x, w, z], out, mode=mode)
    g = from_pytensor(f.maker.fgraph)
    xv, wv, zv = RNG.standard_normal((4, 3)), RNG.standard_normal((3, 2)), RNG.standard_normal((4, 2))
    np.testing.assert_allclose(g.run({"x": xv, "w": wv, "z": zv})[0], f(xv, wv, zv), rtol=1e-10)


def test_user_written_shape_ops():
    x = pt.tensor("x", shape=(2, 6))
    parts = pt.split(x, [2, 4], n_splits=2, axis=1)
    y = pt.concatenate([parts[1], pt.zeros((2, 2))], axis=1).reshape((4, 3))[::2, 1:] + pt.stack([x[0, :2]] * 2)
    g = from_pytensor(FunctionGraph([x], [y, pt.argmin(x, axis=1), pt.var(x, axis=0)]))
    xv = RNG.standard_normal((2, 6))
    want = pytensor.function([x], [y, pt.argmin(x, axis=1), pt.var(x, axis=0)], mode=MODE)(xv)
    for a, e in zip(g.run({"x": xv}), want, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-12)


# ---------------------------------------------------------------- errors
def test_unsupported_kind_is_named():
    g = _one("copysign", [F, F])
    with pytest.raises(GraphError, match=r"op 0 \(copysign\) has no PyTensor counterpart"):
        to_pytensor(g)
    b = GraphBuilder()
    x = b.input(("float64", (1, 1, 4, 4)), name="x")
    b.output(b.op("max_pool2d", x, kernel_size=(2, 2), name="pool"))
    with pytest.raises(GraphError, match=r"op 0 \(max_pool2d 'pool'\)"):
        to_pytensor(b.freeze())


def test_update_edges_are_refused():
    b = GraphBuilder()
    s = b.input(("float64", ()), name="s")
    b.update(b.add(s, 1.0), s)
    with pytest.raises(GraphError, match="update edges"):
        to_pytensor(b.freeze())


def test_unknown_rank_input_is_refused():
    b = GraphBuilder()
    x = b.input(("float64", None), name="x")
    b.output(b.exp(x))
    with pytest.raises(GraphError, match="known rank"):
        to_pytensor(b.freeze())


def test_unknown_pytensor_op_is_named():
    x = pt.vector("x", shape=(3,))
    with pytest.raises(GraphError, match="Gamma"):
        from_pytensor(FunctionGraph([x], [pt.gamma(x)]))
    with pytest.raises(GraphError, match="Sort"):
        from_pytensor(FunctionGraph([x], [pt.sort(x)]))
    m = pt.matrix("m")
    with pytest.raises(GraphError, match="Shape"):
        from_pytensor(FunctionGraph([m], [pt.mean(m)]))  # the element count is only known at run time


def test_dead_untranslatable_nodes_do_not_matter():
    # the Shape nodes of pt.mean are folded into one mean op when the dims are static
    x = pt.matrix("x", shape=(2, 5))
    g = from_pytensor(FunctionGraph([x], [pt.mean(x, axis=1)]))
    assert [op.kind for op in g.ops()] == ["mean"]


def test_op_from_graph_is_inlined():
    from pytensor.compile.builders import OpFromGraph

    a, b = pt.vector("a"), pt.vector("b")
    axpy = OpFromGraph([a, b], [2.0 * a + pt.exp(b)])
    x = pt.vector("x", shape=(4,))
    g = from_pytensor(FunctionGraph([x], [axpy(x, x[::-1])]))
    assert "exp" in [op.kind for op in g.ops()]
    xv = RNG.standard_normal(4)
    np.testing.assert_allclose(g.run({"x": xv})[0], 2 * xv + np.exp(xv[::-1]))


def test_blas_nodes():
    from pytensor.tensor.blas import gemm_no_inplace, gemv_no_inplace, ger

    x, w = pt.matrix("x", shape=(4, 3)), pt.matrix("w", shape=(3, 2))
    z, v, u = pt.matrix("z", shape=(4, 2)), pt.vector("v", shape=(3,)), pt.vector("u", shape=(4,))
    a, c = pt.constant(np.float64(0.5)), pt.constant(np.float64(2.0))
    outs = [gemm_no_inplace(z, a, x, w, c), gemv_no_inplace(u, a, x, v, c), ger(x, a, u, v)]
    g = from_pytensor(FunctionGraph([x, w, z, v, u], outs))
    feeds = {"x": RNG.standard_normal((4, 3)), "w": RNG.standard_normal((3, 2)), "z": RNG.standard_normal((4, 2)),
             "v": RNG.standard_normal(3), "u": RNG.standard_normal(4)}
    want = pytensor.function([x, w, z, v, u], outs, mode=MODE)(*feeds.values())
    for got, exp in zip(g.run(feeds), want, strict=True):
        np.testing.assert_allclose(got, exp, rtol=1e-12)
