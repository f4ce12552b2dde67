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

import opgraph
from opgraph import GraphBuilder
from opgraph.core.graph import Graph
from opgraph.errors import ExecutionError, GraphError
from opgraph.io import pytensor as opt
from opgraph.io.pytensor import TO_PYTENSOR, from_pytensor, to_pytensor
from opgraph.passes.dce import dce
from opgraph.passes.pipeline import optimize
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
    # static shapes (see test_logistic_regression_with_unknown_batch for run-time ones)
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
    m = pt.matrix("m")
    with pytest.raises(GraphError, match=r"Unique.*along an axis"):
        from_pytensor(FunctionGraph([m], [pt.unique(m, axis=0)]))
    with pytest.raises(GraphError, match=r"AdvancedIncSubtensor.*partial slices"):
        from_pytensor(FunctionGraph([m], [pt.inc_subtensor(m[1:, pt.as_tensor([0, 1])], 1.0)]))


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


# ---------------------------------------------------------------- unknown dims (issue 19)
FAST_RUN_PY = pytensor.compile.mode.Mode(linker="py", optimizer="fast_run")  # PyTensor's rewrites, no compiler


def _agree(inputs: list[Any], outputs: list[Any], feeds: list[list[np.ndarray]], *, rtol: float = 1e-10,
           round_trip: bool = True) -> list[Graph]:
    """The raw FunctionGraph and the compiled one (after fast_run's rewrites) convert and compute what
    PyTensor computes on every feed list (several shapes: the dims stay dynamic), and so does PyTensor on
    to_pytensor's FunctionGraph of each conversion."""
    f = pytensor.function(inputs, outputs, mode=FAST_RUN_PY, on_unused_input="ignore")
    graphs = [from_pytensor(FunctionGraph(inputs, outputs, clone=True)), from_pytensor(f.maker.fgraph)]
    backs = [to_pytensor(g) for g in graphs] if round_trip else []
    fbacks = [pytensor.function(b.inputs, b.outputs, mode=MODE, on_unused_input="ignore") for b in backs]
    for args in feeds:
        want = [np.asarray(w) for w in f(*args)]
        for g in graphs:
            got = g.run(dict(zip(g.inputs.tolist(), args, strict=True)))
            for a, w in zip(got, want, strict=True):
                assert a.shape == w.shape and a.dtype == w.dtype, (a.shape, w.shape, a.dtype, w.dtype)
                np.testing.assert_allclose(a, w, rtol=rtol, atol=rtol)
        for fb in fbacks:
            for a, w in zip(fb(*args), want, strict=True):
                np.testing.assert_allclose(a, w, rtol=rtol, atol=rtol)
    return graphs


@pytest.mark.parametrize("x_shape", [(None, None), (None, 4)])
@pytest.mark.parametrize("out", ["softmax", "log_softmax"])
def test_mlp_nll_with_unknown_batch(out: str, x_shape: tuple[int | None, ...]):
    x, y = pt.matrix("x", shape=x_shape), pt.ivector("y")
    w1, b1, w2, b2 = pt.matrix("W1"), pt.vector("b1"), pt.matrix("W2"), pt.vector("b2")
    params = [w1, b1, w2, b2]
    h = pt.tanh(x @ w1 + b1)
    logits = h @ w2 + b2
    logp = pt.log(pt.special.softmax(logits, axis=-1)) if out == "softmax" else pt.special.log_softmax(logits, axis=-1)
    nll = -pt.mean(logp[pt.arange(y.shape[0]), y])
    grads = pytensor.grad(nll, params)
    outs = [nll, *[p - 0.1 * g for p, g in zip(params, grads, strict=True)]]
    rng = np.random.default_rng(19)
    ps = [rng.standard_normal((4, 5)), rng.standard_normal(5), rng.standard_normal((5, 3)), rng.standard_normal(3)]
    feeds = [[rng.standard_normal((n, 4)), rng.integers(0, 3, n).astype(np.int32), *ps] for n in (7, 2)]
    raw, compiled = _agree([x, y, *params], outs, feeds)
    # opgraph's own optimiser and compiled runtime (memory plan included) keep the dims dynamic too
    f = pytensor.function([x, y, *params], outs, mode=FAST_RUN_PY)
    for g in (raw, compiled):
        prog = opgraph.compile(optimize(g, level=3))
        for args in feeds:
            for a, w in zip(prog.run(dict(zip(g.inputs.tolist(), args, strict=True))), f(*args), strict=True):
                np.testing.assert_allclose(a, w, rtol=1e-10, atol=1e-10)
    assert raw.type_of(int(raw.inputs[0])).shape == x_shape
    kinds = {op.kind for op in compiled.ops()}
    assert {"shape", "arange", "gather_nd", "scatter_nd", "assert_all"} <= kinds, kinds
    # the compiled graph's Assert (b2 must match W2's columns) still checks
    with pytest.raises(ExecutionError, match="broadcast"):
        compiled.run(dict(zip(compiled.inputs.tolist(), [*feeds[0][:5], np.zeros(4)], strict=True)))


def test_logistic_regression_with_unknown_batch():
    x, y = pt.matrix("x"), pt.vector("y")
    w, c = pt.vector("w"), pt.scalar("c")
    p = pt.sigmoid(pt.dot(x, w) + c)
    loss = -pt.mean(y * pt.log(p) + (1 - y) * pt.log1p(-p)) + 0.01 * pt.sum(w ** 2)
    gw, gc = pytensor.grad(loss, [w, c])
    rng = np.random.default_rng(3)
    wv, cv = rng.standard_normal(3), np.array(0.3)
    feeds = [[rng.standard_normal((n, 3)), (rng.random(n) > 0.5).astype(float), wv, cv] for n in (5, 11)]
    _agree([x, y, w, c], [loss, w - 0.5 * gw, c - 0.5 * gc], feeds)


def test_softmax_regression_with_integer_labels():
    x, y, w, b = pt.matrix("x"), pt.lvector("y"), pt.matrix("w"), pt.vector("b")
    p = pt.special.softmax(x @ w + b, axis=1)
    nll = -pt.mean(pt.log(p)[pt.arange(x.shape[0]), y])
    gw, gb = pytensor.grad(nll, [w, b])
    pred = pt.argmax(p, axis=1)
    rng = np.random.default_rng(4)
    wv, bv = rng.standard_normal((3, 4)), rng.standard_normal(4)
    feeds = [[rng.standard_normal((n, 3)), rng.integers(0, 4, n), wv, bv] for n in (6, 1)]
    _agree([x, y, w, b], [nll, w - 0.1 * gw, b - 0.1 * gb, pred, pt.mean(pt.neq(pred, y))], feeds)


def _ind(*vals: Any) -> Any:
    return pt.as_tensor(np.array(vals, dtype=np.int64))


# (name, build(m, t3, i, j, n) -> output): m (r, c) and t3 (r, r, c) of unknown dims, i and j int vectors of
# length r indexing rows and columns, n an int scalar (c - 1)
INDEXING: list[tuple[str, Any]] = [
    ("rows_and_labels", lambda m, t, i, j, n: m[pt.arange(m.shape[0]), j]),
    ("adjacent_inner", lambda m, t, i, j, n: t[:, i, j]),
    ("not_adjacent", lambda m, t, i, j, n: t[i, :, j]),
    ("broadcast_arrays", lambda m, t, i, j, n: m[i[:, None], j[None, :]]),
    ("scalar_and_array", lambda m, t, i, j, n: t[1, :, j]),
    ("slice_then_arrays", lambda m, t, i, j, n: t[1:, i, j]),
    ("slice_then_one_array", lambda m, t, i, j, n: m[::-1, j]),
    ("negative_constants", lambda m, t, i, j, n: m[_ind(-1, 0, -2), _ind(0, -1, 1)]),
    ("one_array", lambda m, t, i, j, n: m[i]),
    ("set_pairs", lambda m, t, i, j, n: pt.set_subtensor(m[i, j], 7.0)),
    ("inc_pairs_repeated", lambda m, t, i, j, n: pt.inc_subtensor(m[_ind(0, 1, 0, 0), _ind(1, 1, 1, -1)], m[0, 0])),
    ("inc_rows", lambda m, t, i, j, n: pt.inc_subtensor(m[i], m[0])),
    ("advanced_inc1", lambda m, t, i, j, n: pt.subtensor.advanced_inc_subtensor1(m, m[i] * 2, i)),
    ("set_adjacent_inner", lambda m, t, i, j, n: pt.set_subtensor(t[:, i, j], t[:, 0, 0][:, None])),
    ("inc_not_adjacent", lambda m, t, i, j, n: pt.inc_subtensor(t[i, :, j], 1.5)),
    ("set_basic", lambda m, t, i, j, n: pt.set_subtensor(m[1:, -1], 3.0)),
    ("inc_basic_step", lambda m, t, i, j, n: pt.inc_subtensor(m[::-2, 0], m[::-2, 1])),
    ("inc_run_time_int", lambda m, t, i, j, n: pt.inc_subtensor(m[n - 1], m[0])),
    ("set_run_time_last", lambda m, t, i, j, n: pt.set_subtensor(t[-1, n - 2:], 0.5)),
    ("set_all", lambda m, t, i, j, n: pt.set_subtensor(m[:], m[0])),
    ("run_time_bounds", lambda m, t, i, j, n: t[:n, n - 1, ::-1]),
    ("run_time_reshape", lambda m, t, i, j, n: t.reshape((t.shape[0], -1)).sum(axis=1) + m.reshape((-1,))[-1]),
    ("zeros_like_run_time", lambda m, t, i, j, n: pt.zeros((m.shape[0], n)) + pt.ones_like(m)[:, 0][:, None]),
    ("mean_and_shape", lambda m, t, i, j, n: pt.mean(t, axis=(0, 2)) * pt.cast(m.shape[1], "float64")),
    # boolean masks: the result's length depends on the values (a dynamic dim through opgraph's nonzero)
    ("mask", lambda m, t, i, j, n: m[m > 0]),
    ("mask_inner_axis", lambda m, t, i, j, n: t[:, m[:, 0] > 0]),
    ("set_mask", lambda m, t, i, j, n: pt.set_subtensor(m[m > 0.5], 0.0)),
    ("inc_mask_rows", lambda m, t, i, j, n: pt.inc_subtensor(t[m[:, 0] > 0], 1.0)),
]


@pytest.mark.parametrize(("name", "build"), INDEXING, ids=[n for n, _ in INDEXING])
def test_indexing_with_unknown_dims(name: str, build: Any):
    m, t = pt.matrix("m"), pt.tensor3("t")
    i, j, n = pt.lvector("i"), pt.ivector("j"), pt.lscalar("n")
    out = build(m, t, i, j, n)
    rng = np.random.default_rng(len(name))
    feeds = []
    for r, c in ((3, 4), (5, 3)):
        iv = rng.integers(-r, r, r)
        jv = rng.integers(-c, c, r).astype(np.int32)
        feeds.append([rng.standard_normal((r, c)), rng.standard_normal((r, r, c)), iv, jv, np.int64(c - 1)])
    _agree([m, t, i, j, n], [out], feeds)


def test_alloc_empty_and_arange():
    from pytensor.tensor.basic import AllocEmpty

    x = pt.matrix("x")
    n = pt.lscalar("n")
    e = AllocEmpty("float32")(x.shape[0], n)  # unspecified content: only its type and shape are compared
    r = pt.arange(n, x.shape[0] * 3, 2, dtype="int32")
    g = from_pytensor(FunctionGraph([x, n], [e, r, pt.arange(0.5, pt.cast(n, "float64"), 0.25)]))
    f = pytensor.function([x, n], [e, r, pt.arange(0.5, pt.cast(n, "float64"), 0.25)], mode=MODE)
    for rows, k in ((2, 3), (4, 5)):
        got = g.run({"x": np.zeros((rows, 2)), "n": np.int64(k)})
        want = f(np.zeros((rows, 2)), k)
        assert got[0].shape == want[0].shape and got[0].dtype == want[0].dtype
        for a, w in zip(got[1:], want[1:], strict=True):
            assert a.dtype == w.dtype
            np.testing.assert_array_equal(a, w)


def test_assert_keeps_its_check():
    from pytensor.raise_op import Assert

    x = pt.vector("x")
    y = Assert("x needs more than two elements")(x, pt.gt(x.shape[0], 2)) * 2.0
    g = from_pytensor(FunctionGraph([x], [y]))
    assert "assert_all" in [op.kind for op in g.ops()]
    np.testing.assert_allclose(g.run({"x": np.arange(4.0)})[0], np.arange(4.0) * 2)
    with pytest.raises(ExecutionError, match="x needs more than two elements"):
        g.run({"x": np.arange(2.0)})
    back = to_pytensor(g)
    f = pytensor.function(back.inputs, back.outputs, mode=MODE)
    np.testing.assert_allclose(f(np.arange(4.0))[0], np.arange(4.0) * 2)
    with pytest.raises(AssertionError, match="x needs more than two elements"):
        f(np.arange(2.0))


def test_run_time_shape_kinds_round_trip():
    b = GraphBuilder()
    x = b.input(("float64", (None, 3)), name="x")
    k = b.input(("int64", ()), name="k")
    s = b.op("shape", x)
    rows = b.op("arange", b.constant(np.int64(0)), b.op("getitem", s, index=(0,)), b.constant(np.int64(1)))
    picked = b.op("gather_nd", x, b.op("stack", rows, b.op("remainder", rows, b.constant(np.int64(3))), axis=-1))
    column = b.op("alloc", b.op("expand_dims", picked, axis=-1), s)
    filled = b.op("scatter_nd", x, b.op("expand_dims", rows, axis=-1), column, reduction="add")
    flat = b.op("reshape_to", filled, b.op("reshape", b.op("multiply", b.op("getitem", s, index=(0,)),
                                                           b.constant(np.int64(3))), shape=(1,)))
    part = b.op("slice", flat, b.op("reshape", k, shape=(1,)), b.constant(np.array([-1])))
    upd = b.op("slice_update", x, b.constant(np.float64(9.0)), b.constant(np.array([1, 0])),
               b.op("stack", k, k), b.constant(np.array([1, 2])))
    checked = b.op("assert_all", upd, b.op("greater", k, b.constant(np.int64(0))), message="k > 0")
    b.output(s, rows, picked, filled, flat, part, checked)
    g = b.freeze()
    fg = to_pytensor(g)
    f = pytensor.function(fg.inputs, fg.outputs, mode=MODE)
    back = from_pytensor(fg)
    for n in (2, 5):
        feeds = {"x": RNG.standard_normal((n, 3)), "k": np.int64(n - 1 or 1)}
        want = g.run(feeds)
        for got in (f(*feeds.values()), back.run(feeds)):
            for a, w in zip(got, want, strict=True):
                np.testing.assert_allclose(a, w, rtol=1e-12)


def test_sorting_searching_and_sets_both_ways():
    x, m = pt.vector("x"), pt.matrix("m")
    outs = [pt.sort(m, axis=0), pt.argsort(x, kind="stable"), pt.sort(m, axis=None),
            pt.searchsorted(pt.sort(x), m, side="right"),
            *pt.unique(m, return_index=True, return_inverse=True, return_counts=True), *pt.nonzero(m > 0)]
    rng = np.random.default_rng(4)
    feeds = []
    for r in (3, 6):  # two sizes: the unique and nonzero lengths differ from run to run
        mv = np.round(rng.standard_normal((r, 4)), 1)  # repeated values: ties and counts > 1
        mv[0, 0] = mv[1, 1] = np.nan  # PyTensor's Unique merges NaNs (equal_nan=True), and so does the import
        feeds.append([rng.permutation(5).astype(np.float64), mv])
    _agree([x, m], outs, feeds)


def test_sort_nonzero_unique_searchsorted_export():
    b = GraphBuilder()
    x = b.input(("float64", (None, 4)), name="x")
    t = b.input(("float64", (5,)), name="t")
    outs = [*b.op("sort", x, axis=0, descending=True), *b.op("sort", x, axis=-1),
            b.op("searchsorted", b.op("sort", t)[0], x, side="right"),
            b.op("nonzero", b.op("greater", x, b.constant(0.0))), *b.op("unique", x, equal_nan=True)]
    b.output(*outs)
    g = b.freeze()
    fg = to_pytensor(g)
    rng = np.random.default_rng(5)
    for r in (3, 6):
        feeds = dict(zip(g.inputs.tolist(), [np.round(rng.standard_normal((r, 4)), 1), rng.standard_normal(5)],
                         strict=True))
        for got, want in zip(_pt_run(fg, feeds, g), g.run(feeds), strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(got, want)
    b2 = GraphBuilder()
    y = b2.input(("float64", (4,)), name="y")
    b2.output(b2.op("unique", y)[0])
    with pytest.raises(GraphError, match="equal_nan=False"):
        to_pytensor(b2.freeze())
