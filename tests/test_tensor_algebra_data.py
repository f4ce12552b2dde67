"""Seed 004's OpGraph keeps its data through the core graph (issue 36): ``to_graph()`` makes the arrays constants,
``to_graph(data="inputs")`` inputs with their values alongside (a ``GraphAndWeights``), and ``from_graph`` gives
back an OpGraph holding the same data, so that either form converts to the other; every installed engine runs the
result, checked against ``np.einsum`` of the same arrays."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph
from opgraph import backends
from opgraph.core.graph import GraphAndWeights
from opgraph.frontend.tensor_algebra import Add, OpGraph, OpGraphError, Tensor, tensor_expr

T = tensor_expr
RNG = np.random.default_rng(36)


def _engines() -> list[str]:
    names = [n for n in ("numpy", "jax", "torch", "onnxruntime", "numba", "dask", "c") if n in backends.available()]
    if "c" in names and backends.get("c").unavailable_reason():  # the c engine needs a C compiler, no package
        names.remove("c")
    return names


ENGINES = _engines()


def test_the_issue_expression_runs_with_no_feeds() -> None:
    A, B = RNG.standard_normal((4, 5)), RNG.standard_normal((5, 6))
    g = (T(A)["i,k"] * T(B)["k,j"]).opgraph("j,i").to_graph()
    assert g.inputs.size == 0
    np.testing.assert_allclose(g.run({})[0], np.einsum("ik,kj->ji", A, B), rtol=1e-12)
    consts = [g.constant_of(o) for o in range(g.num_ops) if g.kind_of(o) == "const"]
    assert len(consts) == 2
    np.testing.assert_array_equal(consts[0], A)  # the data themselves, not placeholders of their type
    np.testing.assert_array_equal(consts[1], B)


def _case() -> tuple[OpGraph, dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """``(0.5 A B + C / x)`` to modes ``j,i``: two unnamed data tensors and a named one, a symbolic input ``x``
    (no data: it stays an input), and the number 0.5 the operation writes (a constant of the computation)."""
    A, B, C = RNG.standard_normal((4, 5)), RNG.standard_normal((5, 6)), RNG.standard_normal((4, 6))
    expr = 0.5 * (T(A)["i,k"] * T(B)["k,j"]) + T(C, name="C")["i,j"] / T(type=("float64", (4, 6)), name="x")["i,j"]
    x = RNG.uniform(1.0, 2.0, (4, 6))
    ref = (0.5 * np.einsum("ik,kj->ij", A, B) + C / x).T
    return expr.opgraph("j,i"), {"x": x}, A, B, ref


def _data(og: OpGraph) -> dict[str | None, np.ndarray]:
    return {n.name: n.value for n in og.nodes() if isinstance(n, Tensor) and isinstance(n.value, np.ndarray)
            and not n.constant}


@pytest.mark.parametrize("data", ["constants", "inputs"])
@pytest.mark.parametrize("engine", ENGINES)
def test_round_trip_with_data_on_every_engine(engine: str, data: str) -> None:
    og, feeds, A, B, ref = _case()
    out = og.to_graph(data=data)  # type: ignore[call-overload]
    if data == "inputs":
        assert isinstance(out, GraphAndWeights)
        graph, weights = out
        assert sorted(weights) == ["C", "t0", "t1"] and weights["t0"] is A and weights["t1"] is B
        assert sorted(graph.name_of(v) for v in graph.inputs.tolist()) == ["C", "t0", "t1", "x"]
    else:
        graph, weights = out, {}
        assert [graph.name_of(v) for v in graph.inputs.tolist()] == ["x"]  # only the tensor without data
    back = OpGraph.from_graph(out)
    held = _data(back)
    assert sorted(held, key=str) == ["C", "t0", "t1"]  # the data come back as data, the 0.5 as a constant
    np.testing.assert_array_equal(held["t0"], A)
    np.testing.assert_array_equal(held["t1"], B)
    if data == "inputs":
        assert held["t0"] is A  # the handle itself
    again = back.to_graph(data=data)  # type: ignore[call-overload]
    if data == "inputs":
        assert again.graph.equals(graph, check_names=True)
        assert again.weights.keys() == weights.keys()
        assert all(again.weights[k] is weights[k] for k in weights)
    else:
        assert again.equals(graph, check_names=True)
    # each form of the OpGraph that came back converts to the other form of the original
    other = "inputs" if data == "constants" else "constants"
    want, got = og.to_graph(data=other), back.to_graph(data=other)  # type: ignore[call-overload]
    assert (got.graph if other == "inputs" else got).equals(want.graph if other == "inputs" else want,
                                                            check_names=True)
    prog = opgraph.compile(graph, backend=engine)
    np.testing.assert_allclose(np.asarray(prog({**weights, **feeds})[0]), ref, rtol=1e-10, atol=1e-12)
    assert f"on {engine}" in prog.explain() and "einsum" in prog.explain()  # the engine ran the contraction


def test_data_as_inputs_take_other_values() -> None:
    og, feeds, A, B, _ = _case()
    graph, weights = og.to_graph(data="inputs")
    B2 = RNG.standard_normal(B.shape)
    got = graph.run({**weights, **feeds, "t1": B2})[0]
    np.testing.assert_allclose(got, (0.5 * A @ B2 + weights["C"] / feeds["x"]).T, rtol=1e-12)
    assert og.feeds().keys() == weights.keys()


def test_constant_tensors_stay_constants() -> None:
    g = OpGraph()
    a = g.add_node(Tensor(np.eye(2), name="A"))
    k = g.add_node(Tensor(np.full((2, 2), 3.0), constant=True))  # a number of the computation, not data
    s, c = g.add_node(Add()), g.add_node(Tensor())
    g.add_edge(a, s, "i,j")
    g.add_edge(k, s, "i,j")
    g.add_edge(s, c, "i,j")
    graph, weights = g.to_graph(data="inputs")
    assert list(weights) == ["A"] and [graph.name_of(v) for v in graph.inputs.tolist()] == ["A"]
    np.testing.assert_array_equal(graph.run(weights)[0], np.eye(2) + 3.0)
    back = OpGraph.from_graph(graph, weights)
    assert [n.constant for n in back.nodes() if isinstance(n, Tensor) and n.value is not None] == [False, True]
    assert back.to_graph().equals(g.to_graph(), check_names=True)


def test_a_declared_type_converts_the_data_as_a_feed_would() -> None:
    ints = np.arange(6).reshape(2, 3)
    og = (T(ints, type=("float64", (2, 3)), name="n")["i,j"] * 0.5).opgraph("j,i")
    want = ints.T.astype(np.float64) * 0.5
    got = og.to_graph().run({})[0]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, want)
    graph, weights = og.to_graph(data="inputs")
    np.testing.assert_array_equal(graph.run(weights)[0], want)
    bad = (T(np.full(3, 1e300), type=("float32", (3,)), name="big")["i"] * 1.0).opgraph("i")
    with pytest.raises(opgraph.errors.FeedError, match="%big expects f32"):
        bad.to_graph()


def test_errors_name_what_was_given() -> None:
    og, _, _, _, _ = _case()
    with pytest.raises(OpGraphError, match=r"data='weights'.*'constants'.*'inputs'"):
        og.to_graph(data="weights")  # type: ignore[call-overload]
    graph, weights = og.to_graph(data="inputs")
    with pytest.raises(OpGraphError, match=r"name no input of the graph: \['w'\]; its inputs are .*'t0'"):
        OpGraph.from_graph(graph, {"w": np.ones(2)})
    with pytest.raises(OpGraphError, match=r"weight 't0' is f64\[5,4\], input %t0 is f64\[4,5\]"):
        OpGraph.from_graph(graph, {**weights, "t0": np.ones((5, 4))})
    with pytest.raises(OpGraphError, match="not both"):
        OpGraph.from_graph(og.to_graph(data="inputs"), weights)


def test_an_update_of_data_needs_inputs() -> None:
    b = opgraph.GraphBuilder()
    s = b.input(("float64", (3,)), name="s")
    s1 = b.op("multiply", s, 0.5)
    b.update(s1, s)
    b.output(s1)
    g = b.freeze()
    og = OpGraph.from_graph(g, {"s": np.arange(3.0)})
    with pytest.raises(OpGraphError, match=r"tensor node 0 \(s\) holds data that an update edge writes"):
        og.to_graph()
    graph, weights = og.to_graph(data="inputs")
    assert graph.equals(g, check_names=True)
    np.testing.assert_array_equal(weights["s"], np.arange(3.0))
