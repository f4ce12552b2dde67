"""Dask interop: export and run on Dask (threaded, distributed), import, and Dask's get conformance mixin."""

from __future__ import annotations

import functools
import operator

import dask.threaded
import numpy as np
import pytest
from dask.utils import apply
from dask.utils_test import GetFunctionTestMixin, add, dec, inc
from hypothesis import HealthCheck, given, settings

from opgraph import GraphBuilder
from opgraph.core.graph import Graph
from opgraph.errors import GraphError
from opgraph.io import dask as odask
from opgraph.io.dask import Kernel, from_dask, get, to_dask
from test_io_dag import graphs


def _graph() -> Graph:
    b = GraphBuilder()
    x = b.input(("float64", (2, 4)), name="x")
    w = b.input(("float64", (2, 4)), name="w")
    lo, hi = b.op("split", x, sections=2, axis=1)
    s = b.op("sum", b.op("multiply", b.op("tanh", w), 2.0), axis=1, keepdims=True, name="s")
    b.output(b.op("add", lo, hi), b.op("maximum", s, b.op("exp", lo)))
    return b.freeze()


FEEDS = {"x": np.arange(8.0).reshape(2, 4) / 8, "w": np.linspace(-1, 1, 8).reshape(2, 4)}


def test_export_runs_on_threaded_scheduler():
    g = _graph()
    form = to_dask(g, FEEDS)
    assert isinstance(form.dsk["s"][0], Kernel)
    assert any(isinstance(k, tuple) for k in form.dsk)  # the split op, keyed by its outputs
    for a, c in zip(dask.threaded.get(form.dsk, form.keys), g.run(FEEDS), strict=True):
        np.testing.assert_allclose(a, c)


def test_export_round_trips():
    g = _graph()
    form = to_dask(g, FEEDS)
    back = from_dask(form.dsk, form.keys, inputs=form.inputs)
    assert back == g
    assert back.symbols.values == g.symbols.values


def test_export_runs_on_distributed():
    distributed = pytest.importorskip("distributed")
    g = _graph()
    form = to_dask(g, FEEDS)
    # processes=False: scheduler and worker live in this process and talk over inproc:// (no sockets).
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        results = client.get(form.dsk, form.keys)
    for a, c in zip(results, g.run(FEEDS), strict=True):
        np.testing.assert_allclose(a, c)


def test_import_numpy_and_operator_tasks():
    dsk = {"a": np.arange(6.0).reshape(2, 3), "b": (np.exp, "a"), "c": (operator.mul, "b", 2.0),
           "d": (functools.partial(np.sum, axis=1), "c"), "e": (apply, np.max, ["c"], {"axis": 0, "keepdims": True}),
           "f": (np.add, (np.negative, "a"), "a")}
    g = from_dask(dsk, ["d", "e", "f"], inputs=["a"])
    assert [op.kind for op in g.ops()] == ["exp", "const", "multiply", "sum", "max", "negative", "add"]
    d, e, f = g.run({"a": dsk["a"]})
    np.testing.assert_allclose(d, np.sum(np.exp(dsk["a"]) * 2, axis=1))
    np.testing.assert_allclose(e, np.max(np.exp(dsk["a"]) * 2, axis=0, keepdims=True))
    np.testing.assert_array_equal(f, np.zeros((2, 3)))


def test_unknown_callable_is_a_clear_error():
    with pytest.raises(GraphError, match="does not know the function inc"):
        from_dask({"a": 1, "b": (inc, "a")}, "b")
    with pytest.raises(GraphError, match="cannot import str"):
        from_dask({"a": "text", "b": (np.exp, "a")}, "b")
    with pytest.raises(KeyError):
        from_dask({"a": 1}, "nope")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_through_dask(g: Graph):
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal((4, 6)) for name in to_dask(g).inputs}
    form = to_dask(g, feeds)
    assert from_dask(form.dsk, form.keys, inputs=form.inputs) == g
    ids = {name: int(v) for name, v in zip(form.inputs, g.inputs.tolist(), strict=True)}
    want = g.run({ids[k]: v for k, v in feeds.items()})
    for a, c in zip(dask.threaded.get(form.dsk, form.keys), want, strict=True):
        np.testing.assert_allclose(a, c)


# ---------------------------------------------------------------- Dask's conformance mixin
def _sum(b: GraphBuilder, xs: object) -> object:
    """Python's sum: over a list of values, or over axis 0 of one tensor."""
    if isinstance(xs, list):
        return functools.reduce(b.add, xs) if xs else b.constant(0)
    return b.sum(xs, axis=0)


MIXIN_FUNCTIONS = {inc: lambda b, x: b.add(x, 1), dec: lambda b, x: b.subtract(x, 1), add: "add", sum: _sum}

class TestGetFunction(GetFunctionTestMixin):
    # Every one of Dask's conformance tests runs as is; inc/dec/add/sum become opgraph ops through the mapping.
    get = staticmethod(functools.partial(get, functions=MIXIN_FUNCTIONS))


def test_mixin_runs_all_eleven_tests():
    names = [n for n in dir(GetFunctionTestMixin) if n.startswith("test_")]
    assert len(names) == 11 and not [n for n in names if n in vars(TestGetFunction)]


def test_unknown_callables_are_called_only_when_asked():
    # the mixin's unhashable-values case: a lambda on a set literal is called in Python, its result a constant
    f = lambda x, y: x + len(y)  # noqa: E731
    dsk = {"x": 1, "y": (f, "x", {1})}
    assert get(dsk, "y") == 2
    with pytest.raises(GraphError, match="cannot import set"):
        get(dsk, "y", call_unknown=False)
    # mapped functions still become opgraph ops, and a Python call sees their computed values
    seen = []
    dsk = {"a": np.arange(3.0), "b": (inc, "a"), "c": (lambda v: seen.append(v) or v.sum(), "b")}
    assert get(dsk, "c", functions=MIXIN_FUNCTIONS) == 6.0
    np.testing.assert_array_equal(seen[0], [1.0, 2.0, 3.0])


def test_module_exports():
    assert set(odask.__all__) >= {"to_dask", "from_dask", "get", "Kernel"}
