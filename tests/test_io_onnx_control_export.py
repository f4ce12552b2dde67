"""ONNX control flow without unrolling: ONNX's own node tests, nested bodies, and export of cond/while_loop/scan.

Import: ``If``/``Loop``/``Scan`` models become one ``cond``/``while_loop``/``scan`` op whose graph does not grow
with the trip count, and run like onnxruntime (or ONNX's reference outputs). Export: opgraph graphs built with
``GraphBuilder`` + ``Subgraph`` run in onnxruntime like a plain Python loop over NumPy, and import back with
their control-flow ops.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

import opgraph  # noqa: E402
from opgraph.core.subgraph import Subgraph, subgraphs_of  # noqa: E402
from opgraph.io.onnx import backend, from_onnx, to_onnx  # noqa: E402

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
CONTROL = ("cond", "while_loop", "scan")


def _vi(name: str, elem: int, shape: Any) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any] = ()) -> Any:
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits)),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def _ort(model: Any, feeds: dict[str, Any]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {k: np.asarray(v) for k, v in feeds.items()})


def _control_kinds(g: Any) -> list[str]:
    return [op.kind for op in g.ops() if op.kind in CONTROL]


def _close(got: list[Any], want: list[Any], rtol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for a, w in zip(got, want, strict=True):
        a, w = np.asarray(a), np.asarray(w)
        assert a.shape == w.shape and a.dtype == w.dtype, (a.shape, a.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(a, w, rtol=rtol, atol=1e-6)


# ---------------------------------------------------------------- ONNX's node tests
@pytest.fixture(scope="module")
def node_tests() -> dict[str, Any]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the suite's generators overflow casts on purpose
        return {t.name: t for t in load_model_tests(kind="node")}


@pytest.mark.parametrize("name,kind", [
    ("test_if", "cond"), ("test_scan_sum", "scan"), ("test_scan9_sum", "scan"), ("test_scan9_multi_state", "scan"),
    ("test_scan9_scalar", "scan"), ("test_range_float_type_positive_delta_expanded", "while_loop"),
    ("test_range_int32_type_negative_delta_expanded", "while_loop"),
    ("test_range_float16_type_positive_delta_expanded", "while_loop")])
def test_onnx_node_tests_import_as_control_ops(node_tests: dict[str, Any], name: str, kind: str) -> None:
    case = node_tests[name]
    inputs, outputs = case.data_sets[0]
    rep = backend.prepare(case.model)
    imp = rep.imported(rep._feeds(inputs))  # what the backend suite runs: not specialised on the inputs
    assert _control_kinds(imp.graph) == [kind] and not imp.specialised
    got = rep.run(inputs)
    for a, w in zip(got, outputs, strict=True):
        np.testing.assert_allclose(a, w, rtol=case.rtol, atol=case.atol)


def test_onnx_range_expanded_has_a_run_time_trip_count(node_tests: dict[str, Any]) -> None:
    # Range's function body is a Loop whose trip count is computed from the inputs: one graph for every range
    model = node_tests["test_range_float_type_positive_delta_expanded"].model
    g = from_onnx(model)
    assert _control_kinds(g) == ["while_loop"]
    n_ops = g.num_ops
    for start, limit, delta in ((1.0, 5.0, 2.0), (0.0, 10.0, 0.5), (3.0, 1.0, 1.0)):
        feeds = {"start": np.float32(start), "limit": np.float32(limit), "delta": np.float32(delta)}
        (got,) = g.run(feeds)
        np.testing.assert_allclose(got, np.arange(start, limit, delta, dtype=np.float32))
    assert g.num_ops == n_ops


def test_onnx_loop11_with_a_slice_at_the_iteration_number_is_one_while_loop(node_tests: dict[str, Any]) -> None:
    # Its body slices x[i:i+1] at the iteration number i: the run-time slice op, so the Loop is one while_loop
    # (trip count and condition are graph inputs), not unrolled, and the graph is as large for any trip count
    case = node_tests["test_loop11"]
    inputs, outputs = case.data_sets[0]
    rep = backend.prepare(case.model)
    imp = rep.imported(rep._feeds(inputs))
    assert _control_kinds(imp.graph) == ["while_loop"] and not imp.specialised
    (body,) = [s for s in subgraphs_of(imp.graph, recursive=True) if "slice" in {op.kind for op in s.graph.ops()}]
    assert "getitem" not in {op.kind for op in body.graph.ops()}
    _close(list(rep.run(inputs)), list(outputs))
    g = from_onnx(case.model)
    n_ops = g.num_ops
    x = np.array([1, 2, 3, 4, 5], np.float32)  # the body's constant
    for m in (1, 3, 5):  # (the model declares 5 rows; past 5 the slice would be empty)
        feeds = {"trip_count": np.asarray(m, np.int64), "cond": np.asarray(True), "y": np.float32([-2])}
        got = g.run(feeds)
        _close(got, _ort(case.model, feeds))
        np.testing.assert_allclose(got[1].reshape(-1), -2 + np.cumsum(x[:m]))
    assert g.num_ops == n_ops


# ---------------------------------------------------------------- ONNX-side: nested bodies, trip count growth
def _loop_model(gather: bool = True) -> Any:
    # s += x[i] * k for i < m (m a graph input): Gather at the iteration number has a static shape
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Gather", ["x", "i"], ["xi"], axis=0),
         helper.make_node("Mul", ["xi", "k"], ["xk"]),
         helper.make_node("Add", ["s_in", "xk"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y"])], "body",
        [_vi("i", I64, []), _vi("c_in", B, []), _vi("s_in", F, [3])],
        [_vi("c_out", B, []), _vi("s_out", F, [3]), _vi("y", F, [3])])
    return helper.make_node("Loop", ["m", "", "s0"], ["s", "ys"], body=body)


def test_loop_in_an_if_branch_reads_outer_values_with_a_run_time_trip_count() -> None:
    then = helper.make_graph([_loop_model()], "then", [], [_vi("s", F, [3]), _vi("ys", F, [None, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["s0"], ["s"]),
                               helper.make_node("Unsqueeze", ["s0", "zero"], ["ys"])], "else", [],
                              [_vi("s", F, [3]), _vi("ys", F, [None, 3])])
    model = _model([helper.make_node("If", ["c"], ["out", "outs"], then_branch=then, else_branch=other)],
                   [_vi("c", B, []), _vi("m", I64, []), _vi("x", F, [6, 3]), _vi("k", F, [3]), _vi("s0", F, [3])],
                   [_vi("out", F, [3]), _vi("outs", F, [None, 3])],
                   [onnx.numpy_helper.from_array(np.array([0], np.int64), "zero")])
    g = from_onnx(model)
    assert _control_kinds(g) == ["cond"]
    assert [op.kind for s in subgraphs_of(g, recursive=True) for op in s.graph.ops() if op.kind in CONTROL] == \
        ["while_loop"]
    rng = np.random.default_rng(1)
    base = {"x": rng.standard_normal((6, 3)).astype(np.float32), "k": np.float32([1, 2, 3]),
            "s0": rng.standard_normal(3).astype(np.float32)}
    for c, m in ((True, 2), (True, 6), (False, 4), (True, 0)):
        feeds = {**base, "c": np.asarray(c), "m": np.asarray(m, np.int64)}
        _close(g.run(feeds), _ort(model, feeds))


@pytest.mark.parametrize("m", [2, 5, 40])
def test_imported_loop_does_not_grow_with_the_trip_count(m: int) -> None:
    model = _model([_loop_model()], [_vi("x", F, [40, 3]), _vi("k", F, [3]), _vi("s0", F, [3])],
                   [_vi("s", F, [3]), _vi("ys", F, [m, 3])], [onnx.numpy_helper.from_array(np.int64(m), "m")])
    g = from_onnx(model)
    assert _control_kinds(g) == ["scan"]  # a known trip count and no condition: a for loop
    assert g.num_ops == from_onnx(_model([_loop_model()], [_vi("x", F, [40, 3]), _vi("k", F, [3]), _vi("s0", F, [3])],
                                         [_vi("s", F, [3]), _vi("ys", F, [1, 3])],
                                         [onnx.numpy_helper.from_array(np.int64(1), "m")])).num_ops
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((40, 3)).astype(np.float32), "k": np.float32([1, -1, 2]),
             "s0": np.zeros(3, np.float32)}
    got = g.run(feeds)
    _close(got, _ort(model, feeds))
    np.testing.assert_allclose(got[1], np.cumsum(feeds["x"][:m] * feeds["k"], axis=0), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- export: opgraph graph -> ONNX -> onnxruntime
def _body(fn: Callable[..., Any], *types: Any, name: str = "f") -> Subgraph:
    sb = opgraph.GraphBuilder()
    params = [sb.input(t, name=f"p{i}") for i, t in enumerate(types)]
    outs = fn(sb, *params)
    sb.output(*(outs if isinstance(outs, tuple) else (outs,)))
    return Subgraph(sb.freeze(), name=name)


F2, F32, INT = ("float32", (2,)), ("float32", ()), ("int64", ())


def _round_trip(g: Any, feeds: dict[str, Any], want: list[Any], kinds: list[str]) -> Any:
    """g.run, to_onnx + onnxruntime and to_onnx + from_onnx + run all equal ``want``; the import keeps ``kinds``."""
    _close(g.run(feeds), want)
    model = to_onnx(g)
    onnx.checker.check_model(model, full_check=True)
    _close(_ort(model, feeds), want)
    back = from_onnx(model)
    assert _control_kinds(back) == kinds
    _close(back.run(feeds), want)
    return model


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_exports_as_scan(reverse: bool) -> None:
    step = _body(lambda b, k, c, x: (b.add(b.multiply(c, k), x), b.sum(c)), F2, F2, F2)
    b = opgraph.GraphBuilder()
    k, c0, xs = b.input(F2, name="k"), b.input(F2, name="c0"), b.input(("float32", (5, 2)), name="xs")
    c, ys = b.op("scan", k, c0, xs, body=step, num_consts=1, num_carry=1, reverse=reverse)
    b.output(b.name(c, "c"), b.name(ys, "ys"))
    rng = np.random.default_rng(0)
    feeds = {"k": np.float32([0.5, 2]), "c0": np.ones(2, np.float32),
             "xs": rng.standard_normal((5, 2)).astype(np.float32)}
    carry, out = feeds["c0"].copy(), np.zeros(5, np.float32)  # the plain Python loop
    for i in (range(4, -1, -1) if reverse else range(5)):
        out[i] = carry.sum()
        carry = carry * feeds["k"] + feeds["xs"][i]
    model = _round_trip(b.freeze(), feeds, [carry, out], ["scan"])
    assert [n.op_type for n in model.graph.node] == ["Scan"]


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_without_xs_exports_as_a_loop(reverse: bool) -> None:
    step = _body(lambda b, c: (b.multiply(c, 2.0), b.sum(c)), F2)
    b = opgraph.GraphBuilder()
    c0 = b.input(F2, name="c0")
    c, ys = b.op("scan", c0, body=step, num_carry=1, length=4, reverse=reverse)
    b.output(b.name(c, "c"), b.name(ys, "ys"))
    c0v = np.float32([1, 3])
    sums = np.array([c0v.sum() * 2 ** i for i in range(4)], np.float32)
    _round_trip(b.freeze(), {"c0": c0v}, [c0v * 16, sums[::-1] if reverse else sums], ["scan"])


def _newton_sqrt(max_trip: int | None) -> Any:
    # Newton's iteration for sqrt(a) while |x^2 - a| > tol: a data-dependent trip count
    test = _body(lambda b, a, tol, i, x: b.greater(b.abs(b.subtract(b.multiply(x, x), a)), tol), F32, F32, INT, F32)
    step = _body(lambda b, a, tol, i, x: (b.add(i, b.constant(np.int64(1))),
                                          b.multiply(b.add(x, b.divide(a, x)), 0.5), x), F32, F32, INT, F32)
    b = opgraph.GraphBuilder()
    a, tol, x0 = b.input(F32, name="a"), b.input(F32, name="tol"), b.input(F32, name="x0")
    n, x, xs = b.op("while_loop", a, tol, b.constant(np.int64(0)), x0, cond_body=test, body=step, num_consts=2,
                    max_trip=max_trip)
    b.output(b.name(n, "n"), b.name(x, "x"), b.name(xs, "xs"))
    return b.freeze()


@pytest.mark.parametrize("max_trip", [None, 3])
def test_while_loop_exports_as_a_loop(max_trip: int | None) -> None:
    g = _newton_sqrt(max_trip)
    for a in (2.0, 1e4, 1.0):
        feeds = {"a": np.float32(a), "tol": np.float32(1e-4), "x0": np.float32(1)}
        x, history, n = np.float32(1), [], 0  # the plain Python loop
        while abs(x * x - np.float32(a)) > np.float32(1e-4) and (max_trip is None or n < max_trip):
            history.append(x)
            x, n = np.float32((x + np.float32(a) / x) * np.float32(0.5)), n + 1
        model = _round_trip(g, feeds, [np.int64(n), x, np.array(history, np.float32).reshape(-1)], ["while_loop"])
    loop = [n for n in model.graph.node if n.op_type == "Loop"]
    assert len(loop) == 1 and (loop[0].input[0] == "") == (max_trip is None)


def test_cond_exports_as_if_with_operands_as_outer_references_and_a_nested_loop() -> None:
    g_loop = _newton_sqrt(None)
    inner = Subgraph(g_loop, name="newton")
    # then: sqrt of x by the Newton loop (a call of the whole loop graph, inlined on export); else: -x
    then = _body(lambda b, a, tol: tuple(b.op("call", a, tol, b.constant(np.float32(1)), body=inner)[1:2]), F32, F32)
    other = _body(lambda b, a, tol: b.negative(a), F32, F32)
    b = opgraph.GraphBuilder()
    p, a, tol = b.input(("bool", ()), name="p"), b.input(F32, name="a"), b.input(F32, name="tol")
    b.output(b.name(b.op("cond", p, a, tol, then_body=then, else_body=other), "y"))
    g = b.freeze()
    for pv, av in ((True, 9.0), (False, 9.0), (True, 2.0)):
        feeds = {"p": np.asarray(pv), "a": np.float32(av), "tol": np.float32(1e-5)}
        want = np.float32(np.sqrt(av)) if pv else np.float32(-av)
        got = g.run(feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5)
        model = _round_trip(g, feeds, [got], ["cond"])
    (if_node,) = model.graph.node
    then_graph = next(a.g for a in if_node.attribute if a.name == "then_branch")
    assert not then_graph.input and "Loop" in [n.op_type for n in then_graph.node]
    assert {"a", "tol"} <= {i for n in then_graph.node for i in n.input}  # the operands, by their outer names


def test_exported_loop_does_not_grow_with_the_trip_count() -> None:
    def model(n: int) -> Any:
        step = _body(lambda b, c, x: (b.add(c, x), b.multiply(c, x)), F2, F2)
        b = opgraph.GraphBuilder()
        c0, xs = b.input(F2, name="c0"), b.input(("float32", (n, 2)), name="xs")
        c, ys = b.op("scan", c0, xs, body=step, num_carry=1)
        b.output(b.name(c, "c"), b.name(ys, "ys"))
        return to_onnx(b.freeze())

    def nodes(g: Any) -> int:
        return sum(1 + sum(nodes(a.g) for a in n.attribute if a.type == onnx.AttributeProto.GRAPH) for n in g.node)

    small, large = model(3), model(300)
    assert nodes(small.graph) == nodes(large.graph) == 3  # Scan, and its body's Add and Mul
    assert len(large.SerializeToString()) - len(small.SerializeToString()) <= 4  # the dim 300 takes two bytes
    back_small, back_large = from_onnx(small), from_onnx(large)
    assert _control_kinds(back_small) == _control_kinds(back_large) == ["scan"]
    assert back_small.num_ops == back_large.num_ops


def test_a_value_read_by_a_body_and_returned_keeps_its_name_for_the_body() -> None:
    # exp(x) is both a graph output and an outer-scope reference of the Scan body: renaming it to the output's
    # name (the exporter drops Identity nodes that only name outputs) must not strand the body's reference
    body = _body(lambda b, k, c: b.multiply(c, k), F2, F2)
    b = opgraph.GraphBuilder()
    x = b.input(F2, name="x")
    e = b.exp(x)
    c = b.op("scan", e, x, body=body, num_consts=1, num_carry=1, length=3)
    b.output(b.name(e, "e"), b.name(c, "c"))
    xv = np.float32([1, 2])
    _round_trip(b.freeze(), {"x": xv}, [np.exp(xv), xv * np.exp(xv) ** 3], ["scan"])


def test_if_in_a_loop_body_reads_the_iteration_number_and_outer_values() -> None:
    # s += x * i on odd iterations, s -= k on even ones; M is a graph input
    then = helper.make_graph([helper.make_node("Cast", ["i"], ["fi"], to=F),
                              helper.make_node("Mul", ["x", "fi"], ["d"]),
                              helper.make_node("Add", ["s_in", "d"], ["t"])], "then", [], [_vi("t", F, [3])])
    other = helper.make_graph([helper.make_node("Sub", ["s_in", "k"], ["e"])], "else", [], [_vi("e", F, [3])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Mod", ["i", "two"], ["r"]),
         helper.make_node("Cast", ["r"], ["odd"], to=B),
         helper.make_node("If", ["odd"], ["s_out"], then_branch=then, else_branch=other)], "body",
        [_vi("i", I64, []), _vi("c_in", B, []), _vi("s_in", F, [3])], [_vi("c_out", B, []), _vi("s_out", F, [3])])
    model = _model([helper.make_node("Loop", ["m", "", "s0"], ["s"], body=body)],
                   [_vi("m", I64, []), _vi("x", F, [3]), _vi("k", F, [3]), _vi("s0", F, [3])], [_vi("s", F, [3])],
                   [onnx.numpy_helper.from_array(np.int64(2), "two")])
    g = from_onnx(model)
    assert _control_kinds(g) == ["while_loop"]
    assert [op.kind for s in subgraphs_of(g, recursive=True) for op in s.graph.ops() if op.kind in CONTROL] == \
        ["cond"]
    x, k, s0 = np.float32([1, 2, 3]), np.float32([0.5, 0.5, 1]), np.zeros(3, np.float32)
    for m in (0, 1, 5, 8):
        s = s0.copy()  # the plain Python loop
        for i in range(m):
            s = s + x * i if i % 2 else s - k
        feeds = {"m": np.asarray(m, np.int64), "x": x, "k": k, "s0": s0}
        _close(g.run(feeds), [s])
        _close(_ort(model, feeds), [s])
