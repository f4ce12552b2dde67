"""ONNX import of control flow, sequences, optionals and Dropout, checked against onnxruntime.

If, Loop and Scan import as opgraph's cond, while_loop and scan ops (not unrolled); the tests check the kinds
of ops the import makes and that the graph is as large for any trip count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from opgraph.io.onnx import OnnxImportError, backend, from_onnx, import_model  # noqa: E402

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name: str, elem: int, shape: Any) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


def _seq_vi(name: str, elem: int, shape: Any) -> Any:
    return helper.make_tensor_sequence_value_info(name, elem, shape)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], *, inits: Sequence[Any] = (),
           opset: int = 18, functions: Sequence[Any] = ()) -> Any:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], functions=list(functions))
    model.ir_version = 8  # what the installed onnxruntime reads
    return model


def _ort(model: Any, feeds: dict[str, Any]) -> list[Any]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _same(got: Any, want: Any) -> None:
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def check(model: Any, feeds: dict[str, Any]) -> list[Any]:
    """Run through opgraph's backend and onnxruntime; the results must agree. Returns opgraph's."""
    got = list(backend.prepare(model).run(feeds))
    want = _ort(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    return got


def _kinds(g: Any) -> list[str]:
    return [op.kind for op in g.ops() if op.kind != "const"]


def _control(g: Any) -> Any:
    (op,) = [op for op in g.ops() if op.kind in ("cond", "while_loop", "scan")]
    return op


def _const(name: str, value: Any) -> Any:
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value), name))


# ---------------------------------------------------------------- If
def _branch(name: str, value: Any, out: str) -> Any:
    return helper.make_graph([helper.make_node("Mul", ["x", value], [out])], name, [], [_vi(out, F, [3])])


def _if_model(cond_init: Any = None, else_shape: tuple[int, ...] = (3,)) -> Any:
    then = _branch("then", "two", "t")
    if else_shape == (3,):
        other = _branch("else", "three", "e")
    else:
        other = helper.make_graph([_const("e", np.zeros(else_shape, np.float32))], "else", [],
                                  [_vi("e", F, list(else_shape))])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    inits = [onnx.numpy_helper.from_array(np.float32(2), "two"), onnx.numpy_helper.from_array(np.float32(3), "three")]
    inputs = [_vi("x", F, [3])]
    if cond_init is None:
        inputs.append(_vi("c", B, []))
    else:
        inits.append(onnx.numpy_helper.from_array(np.asarray(cond_init), "c"))
    return _model([node], inputs, [_vi("y", F, ["n"])], inits=inits)


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_known_condition_inlines_one_branch(cond: bool) -> None:
    model = _if_model(cond_init=cond)
    x = np.arange(3, dtype=np.float32)
    check(model, {"x": x})
    g = from_onnx(model)
    assert "where" not in {op.kind for op in g.ops()}


def test_if_with_unknown_condition_is_a_cond_op_with_its_captures() -> None:
    model = _if_model()
    x = np.arange(3, dtype=np.float32)
    g = import_model(model).graph
    assert _kinds(g) == ["cond"]
    # the branches read x and the initializers two and three of the outer scope: x becomes an explicit operand
    # (the small known constants are copied into the bodies)
    assert [v.name for v in _control(g).inputs] == ["c", "x"]
    for c in (True, False):
        want = _ort(model, {"x": x, "c": np.asarray(c)})[0]
        np.testing.assert_array_equal(g.run({"x": x, "c": np.asarray(c)})[0], want)
        check(model, {"x": x, "c": np.asarray(c)})


def test_if_with_branches_of_different_shapes_has_a_dynamic_result() -> None:
    model = _if_model(else_shape=(2,))
    g = from_onnx(model)
    assert _kinds(g) == ["cond"] and g.type_of(int(g.outputs[0])).shape == (None,)
    x = np.arange(3, dtype=np.float32)
    for c in (True, False):
        got = g.run({"x": x, "c": np.asarray(c)})[0]
        _same(got, _ort(model, {"x": x, "c": np.asarray(c)})[0])
        # the backend, which knows the condition's value, specialises the graph on it (static shapes)
        check(model, {"x": x, "c": np.asarray(c)})


def test_if_returning_sequences_is_resolved_with_where() -> None:
    # sequences are not tensors: an If returning one is resolved while importing, both branches joined with where
    then = helper.make_graph([helper.make_node("SequenceConstruct", ["x", "x"], ["t"])], "then", [],
                             [_seq_vi("t", F, [3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["nx"]),
                               helper.make_node("SequenceConstruct", ["x", "nx"], ["e"])], "else", [],
                              [_seq_vi("e", F, [3])])
    model = _model([helper.make_node("If", ["c"], ["s"], then_branch=then, else_branch=other),
                    helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, new_axis=1)],
                   [_vi("x", F, [3]), _vi("c", B, [])], [_vi("y", F, [2, 3])])
    assert "where" in _kinds(from_onnx(model))
    for c in (True, False):
        check(model, {"x": np.arange(3, dtype=np.float32), "c": np.asarray(c)})


# ---------------------------------------------------------------- Loop
def _loop_body(cond_nodes: list[Any]) -> Any:
    # state s += x * i; scan output: s; the condition is computed by cond_nodes from i
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F),
             helper.make_node("Mul", ["x", "fi"], ["xi"]),
             helper.make_node("Add", ["s_in", "xi"], ["s_out"]),
             helper.make_node("Identity", ["s_out"], ["scan"]), *cond_nodes]
    return helper.make_graph(nodes, "body", [_vi("i", I64, []), _vi("c_in", B, []), _vi("s_in", F, [2])],
                             [_vi("c_out", B, []), _vi("s_out", F, [2]), _vi("scan", F, [2])])


def test_loop_with_a_run_time_trip_count_is_one_while_loop() -> None:
    body = _loop_body([helper.make_node("Identity", ["c_in"], ["c_out"])])
    node = helper.make_node("Loop", ["m", "", "s0"], ["s", "scans"], body=body)
    model = _model([node], [_vi("x", F, [2]), _vi("s0", F, [2]), _vi("m", I64, [])],
                   [_vi("s", F, [2]), _vi("scans", F, ["n", 2])])
    g = from_onnx(model)
    assert _kinds(g) == ["while_loop"]
    x, s0 = np.array([1, -2], np.float32), np.array([0.5, 0.25], np.float32)
    for m in (4, 1, 7):  # one graph, any trip count
        feeds = {"x": x, "s0": s0, "m": np.asarray(m, np.int64)}
        got = g.run(feeds)
        for a, w in zip(got, _ort(model, feeds), strict=True):
            _same(a, w)
        assert got[1].shape == (m, 2)
        check(model, feeds)


@pytest.mark.parametrize("m", [0, 3, 50])
def test_loop_with_a_known_trip_count_is_a_scan_of_that_length(m: int) -> None:
    body = _loop_body([helper.make_node("Identity", ["c_in"], ["c_out"])])
    node = helper.make_node("Loop", ["m", "", "s0"], ["s", "scans"], body=body)
    model = _model([node], [_vi("x", F, [2]), _vi("s0", F, [2])], [_vi("s", F, [2]), _vi("scans", F, [m, 2])],
                   inits=[onnx.numpy_helper.from_array(np.int64(m), "m")])
    g = from_onnx(model)
    assert _kinds(g) == ["scan"] and g.type_of(int(g.outputs[1])).shape == (m, 2)
    op = _control(g)
    assert op.attrs["length"] == m and g.num_ops <= 4  # the body is stored once, whatever the trip count
    check(model, {"x": np.array([1, -2], np.float32), "s0": np.array([0.5, 0.25], np.float32)})


def test_loop_with_zero_iterations_takes_scan_shapes_from_the_body() -> None:
    body = _loop_body([helper.make_node("Identity", ["c_in"], ["c_out"])])
    node = helper.make_node("Loop", ["m", "", "s0"], ["s", "scans"], body=body)
    model = _model([node], [_vi("x", F, [2]), _vi("s0", F, [2]), _vi("m", I64, [])],
                   [_vi("s", F, [2]), _vi("scans", F, ["n", 2])])
    _, scans = check(model, {"x": np.ones(2, np.float32), "s0": np.zeros(2, np.float32), "m": np.asarray(0, np.int64)})
    assert scans.shape == (0, 2)


def test_nested_loops_see_the_outer_body() -> None:
    # the inner body reads the outer body's iteration number i and the model's x
    inner = helper.make_graph(
        [helper.make_node("Identity", ["ci"], ["co"]), helper.make_node("Cast", ["j"], ["fj"], to=F),
         helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Mul", ["fi", "fj"], ["ij"]),
         helper.make_node("Mul", ["x", "ij"], ["xij"]), helper.make_node("Add", ["a_in", "xij"], ["a_out"])], "inner",
        [_vi("j", I64, []), _vi("ci", B, []), _vi("a_in", F, [2])], [_vi("co", B, []), _vi("a_out", F, [2])])
    outer = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), _const("three", np.int64(3)),
         helper.make_node("Loop", ["three", "", "s_in"], ["s_out"], body=inner),
         helper.make_node("Identity", ["s_out"], ["scan"])], "outer",
        [_vi("i", I64, []), _vi("c_in", B, []), _vi("s_in", F, [2])],
        [_vi("c_out", B, []), _vi("s_out", F, [2]), _vi("scan", F, [2])])
    node = helper.make_node("Loop", ["m", "", "s0"], ["s", "scans"], body=outer)
    model = _model([node], [_vi("x", F, [2]), _vi("s0", F, [2])], [_vi("s", F, [2]), _vi("scans", F, [4, 2])],
                   inits=[onnx.numpy_helper.from_array(np.int64(4), "m")])
    check(model, {"x": np.array([1, 2], np.float32), "s0": np.zeros(2, np.float32)})


def test_loop_while_stops_when_the_body_condition_folds_to_false() -> None:
    # keep going while i + 1 < 3, with a huge trip count
    cond = [_const("three", np.int64(3)), _const("one", np.int64(1)),
            helper.make_node("Add", ["i", "one"], ["i1"]), helper.make_node("Less", ["i1", "three"], ["c_out"])]
    node = helper.make_node("Loop", ["m", "c", "s0"], ["s", "scans"], body=_loop_body(cond))
    model = _model([node], [_vi("x", F, [2]), _vi("s0", F, [2])], [_vi("s", F, [2]), _vi("scans", F, ["n", 2])],
                   inits=[onnx.numpy_helper.from_array(np.int64(1_000_000), "m"),
                          onnx.numpy_helper.from_array(np.asarray(True), "c")])
    _, scans = check(model, {"x": np.ones(2, np.float32), "s0": np.zeros(2, np.float32)})
    assert scans.shape == (3, 2)


@pytest.mark.parametrize("trip", [None, 4])
def test_loop_with_a_data_dependent_condition_is_a_while_loop(trip: int | None) -> None:
    # keep going while sum(s) < 10: the trip count depends on x and s0 (and is capped by M when given)
    cond = [helper.make_node("ReduceSum", ["s_out"], ["tot"], keepdims=0),
            _const("lim", np.float32(10)), helper.make_node("Less", ["tot", "lim"], ["c_out"])]
    node = helper.make_node("Loop", ["" if trip is None else "m", "c", "s0"], ["s", "scans"],
                            body=_loop_body(cond))
    inits = [onnx.numpy_helper.from_array(np.asarray(True), "c")]
    if trip is not None:
        inits.append(onnx.numpy_helper.from_array(np.int64(trip), "m"))
    model = _model([node], [_vi("x", F, [2]), _vi("s0", F, [2])], [_vi("s", F, [2]), _vi("scans", F, ["n", 2])],
                   inits=inits)
    g = from_onnx(model)
    assert _kinds(g) == ["while_loop"]
    assert _control(g).attrs["max_trip"] == trip
    lengths = set()
    for x in ([1, 1], [0.5, 0.25], [3, 4], [10, 10]):
        feeds = {"x": np.array(x, np.float32), "s0": np.zeros(2, np.float32)}
        got = g.run(feeds)
        for a, w in zip(got, _ort(model, feeds), strict=True):
            _same(a, w)
        lengths.add(got[1].shape[0])
    assert len(lengths) == 4 if trip is None else lengths == {2, 3, 4}  # trip counts from the data, one graph


def test_loop_body_with_if_sees_the_body_scope_and_sequences_carry() -> None:
    # the If inside the body reads the body's own values (not only the model's)
    then = helper.make_graph([helper.make_node("Neg", ["xi"], ["t"])], "then", [], [_vi("t", F, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["xi"], ["e"])], "else", [], [_vi("e", F, [2])])
    nodes = [helper.make_node("Identity", ["c_in"], ["c_out"]),
             helper.make_node("Cast", ["i"], ["fi"], to=F),
             helper.make_node("Mul", ["x", "fi"], ["xi"]),
             _const("two", np.int64(2)), helper.make_node("Mod", ["i", "two"], ["odd_i"]),
             helper.make_node("Cast", ["odd_i"], ["odd"], to=B),
             helper.make_node("If", ["odd"], ["v"], then_branch=then, else_branch=other),
             helper.make_node("SequenceInsert", ["seq_in", "v"], ["seq_out"])]
    body = helper.make_graph(nodes, "body", [_vi("i", I64, []), _vi("c_in", B, []), _seq_vi("seq_in", F, [2])],
                             [_vi("c_out", B, []), _seq_vi("seq_out", F, [2])])
    model = _model([helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
                    helper.make_node("Loop", ["m", "", "empty"], ["seq"], body=body),
                    helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0, new_axis=1)],
                   [_vi("x", F, [2])], [_vi("y", F, [5, 2])],
                   inits=[onnx.numpy_helper.from_array(np.int64(5), "m")])
    (y,) = check(model, {"x": np.array([1, 2], np.float32)})
    assert y.shape == (5, 2)


def test_loop_inside_a_model_function_sees_the_function_scope() -> None:
    body = helper.make_graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                              helper.make_node("Mul", ["a_in", "k"], ["a_out"])], "body",
                             [_vi("i", I64, []), _vi("c_in", B, []), _vi("a_in", F, [2])],
                             [_vi("c_out", B, []), _vi("a_out", F, [2])])
    fn = helper.make_function("local", "Power3", ["x", "k"], ["y"],
                              [_const("n", np.int64(3)), helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
                              [helper.make_opsetid("", 18)])
    node = helper.make_node("Power3", ["x", "k"], ["y"], domain="local")
    model = _model([node], [_vi("x", F, [2]), _vi("k", F, [2])], [_vi("y", F, [2])], functions=[fn])
    model.opset_import.append(helper.make_opsetid("local", 1))
    check(model, {"x": np.array([1, 2], np.float32), "k": np.array([2, 3], np.float32)})


# ---------------------------------------------------------------- Scan
@pytest.mark.parametrize("in_dir,out_dir,out_axis", [(0, 0, 0), (1, 0, 1), (0, 1, -1), (1, 1, 0)])
def test_scan_axes_and_directions(in_dir: int, out_dir: int, out_axis: int) -> None:
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                              helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])], "body",
                             [_vi("s_in", F, [3]), _vi("x_t", F, [3])], [_vi("s_out", F, [3]), _vi("y_t", F, [3])])
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[in_dir],
                            scan_output_axes=[out_axis], scan_output_directions=[out_dir])
    model = _model([node], [_vi("s0", F, [3]), _vi("xs", F, [3, 4])], [_vi("s", F, [3]), _vi("ys", F, ["a", "b"])])
    rng = np.random.default_rng(0)
    check(model, {"s0": rng.standard_normal(3).astype(np.float32),
                  "xs": rng.standard_normal((3, 4)).astype(np.float32)})
    assert "scan" in _kinds(from_onnx(model))


def test_scan8_is_a_scan_over_the_batch_of_scans_over_time() -> None:
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["y_t"])], "body",
                             [_vi("s_in", F, [2]), _vi("x_t", F, [2])], [_vi("s_out", F, [2]), _vi("y_t", F, [2])])
    node = helper.make_node("Scan", ["", "s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1, directions=[1])
    model = _model([node], [_vi("s0", F, [2, 2]), _vi("xs", F, [2, 3, 2])], [_vi("s", F, [2, 2]),
                                                                             _vi("ys", F, [2, 3, 2])], opset=8)
    s0 = np.array([[0, 0], [10, 10]], np.float32)
    xs = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    s, ys = backend.prepare(model).run({"s0": s0, "xs": xs})
    want_ys = np.stack([s0[b] + np.cumsum(xs[b, ::-1], axis=0) for b in range(2)])
    np.testing.assert_array_equal(ys, want_ys)
    np.testing.assert_array_equal(s, want_ys[:, -1])
    g = from_onnx(model)
    assert _kinds(g) == ["scan"] and "scan" in [op.kind for op in _control(g).attrs["body"].graph.ops()]


# ---------------------------------------------------------------- sequences
def test_sequence_ops_match_onnxruntime() -> None:
    nodes = [helper.make_node("SplitToSequence", ["x"], ["parts"], axis=1),  # 4 parts of [3, 1]
             helper.make_node("SequenceErase", ["parts", "one"], ["erased"]),
             helper.make_node("SequenceInsert", ["erased", "y", "zero"], ["inserted"]),
             helper.make_node("SequenceAt", ["inserted", "minus_one"], ["last"]),
             helper.make_node("SequenceLength", ["inserted"], ["n"]),
             helper.make_node("ConcatFromSequence", ["inserted"], ["cat"], axis=-1),
             helper.make_node("SequenceConstruct", ["x", "x"], ["pair"]),
             helper.make_node("ConcatFromSequence", ["pair"], ["stacked"], axis=-1, new_axis=1),
             helper.make_node("SplitToSequence", ["x", "two"], ["chunks"], axis=1)]
    inits = [onnx.numpy_helper.from_array(np.asarray(v, np.int64), n)
             for n, v in (("one", 1), ("zero", 0), ("minus_one", -1), ("two", 2))]
    model = _model(nodes, [_vi("x", F, [3, 4]), _vi("y", F, [3, 1])],
                   [_vi("last", F, [3, 1]), _vi("n", I64, []), _vi("cat", F, [3, 4]), _vi("stacked", F, [3, 4, 2]),
                    _seq_vi("chunks", F, [3, 2]), _seq_vi("inserted", F, [3, 1])], inits=inits)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = check(model, {"x": x, "y": -np.ones((3, 1), np.float32)})
    assert [c.shape for c in out[4]] == [(3, 2), (3, 2)]


def test_sequence_input_and_split_without_keepdims() -> None:
    nodes = [helper.make_node("SplitToSequence", ["x"], ["rows"], axis=0, keepdims=0),
             helper.make_node("SequenceAt", ["s", "pos"], ["picked"]),
             helper.make_node("SequenceAt", ["rows", "pos"], ["row"])]
    model = _model(nodes, [_vi("x", F, [3, 2]), _seq_vi("s", F, [2]), _vi("pos", I64, [])],
                   [_vi("picked", F, [2]), _vi("row", F, [2])])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    check(model, {"x": x, "s": [x[0], x[1], x[2]], "pos": np.asarray(-2, np.int64)})


def test_sequence_map_with_an_outer_scope_value() -> None:
    # the body multiplies each element by the model's initializer k and adds the extra tensor input
    body = helper.make_graph([helper.make_node("Mul", ["e", "k"], ["ek"]), helper.make_node("Add", ["ek", "b"], ["o"]),
                              helper.make_node("Shape", ["e"], ["shape"])], "body",
                             [_vi("e", F, ["n"]), _vi("b", F, [1])], [_vi("o", F, ["n"]), _vi("shape", I64, [1])])
    node = helper.make_node("SequenceMap", ["s", "b"], ["outs", "shapes"], body=body)
    model = _model([node], [_seq_vi("s", F, ["n"]), _vi("b", F, [1])],
                   [_seq_vi("outs", F, ["n"]), _seq_vi("shapes", I64, [1])],
                   inits=[onnx.numpy_helper.from_array(np.float32(2), "k")])
    s = [np.arange(n, dtype=np.float32) for n in (1, 3, 2)]
    check(model, {"s": s, "b": np.ones(1, np.float32)})


def test_sequence_output_holding_one_tensor_twice() -> None:
    nodes = [helper.make_node("SequenceConstruct", ["x", "x", "x"], ["s"])]
    model = _model(nodes, [_vi("x", F, [2])], [_seq_vi("s", F, [2])])
    check(model, {"x": np.array([1, 2], np.float32)})


def test_sequence_position_out_of_range_is_an_error() -> None:
    nodes = [helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
             helper.make_node("SequenceAt", ["s", "pos"], ["y"])]
    model = _model(nodes, [_vi("x", F, [2])], [_vi("y", F, [2])],
                   inits=[onnx.numpy_helper.from_array(np.int64(2), "pos")])
    with pytest.raises(OnnxImportError, match=r"SequenceAt node.*position 2 is out of range.*length 2"):
        from_onnx(model)


# ---------------------------------------------------------------- optionals
def test_optional_ops() -> None:
    tensor_type = helper.make_tensor_type_proto(F, [2])
    nodes = [helper.make_node("Optional", ["x"], ["full"]),
             helper.make_node("Optional", [], ["empty"], type=tensor_type),
             helper.make_node("OptionalHasElement", ["full"], ["has_full"]),
             helper.make_node("OptionalHasElement", ["empty"], ["has_empty"]),
             helper.make_node("OptionalGetElement", ["full"], ["got"])]
    model = _model(nodes, [_vi("x", F, [2])], [_vi("has_full", B, []), _vi("has_empty", B, []), _vi("got", F, [2])])
    has_full, has_empty, _ = check(model, {"x": np.array([1, 2], np.float32)})
    assert has_full and not has_empty


def test_optional_get_element_of_an_empty_optional_is_an_error() -> None:
    nodes = [helper.make_node("Optional", [], ["empty"], type=helper.make_tensor_type_proto(F, [2])),
             helper.make_node("OptionalGetElement", ["empty"], ["y"])]
    with pytest.raises(OnnxImportError, match=r"OptionalGetElement node.*empty"):
        from_onnx(_model(nodes, [], [_vi("y", F, [2])]))


# ---------------------------------------------------------------- Dropout
@pytest.mark.parametrize("opset", [9, 12, 18])
def test_dropout_in_inference_mode_is_identity_with_a_full_mask(opset: int) -> None:
    ins = ["x"] if opset < 12 else ["x", "r", "t"]
    node = helper.make_node("Dropout", ins, ["y", "mask"], **({"ratio": 0.3} if opset < 12 else {}))
    inits = [] if opset < 12 else [onnx.numpy_helper.from_array(np.float32(0.3), "r"),
                                   onnx.numpy_helper.from_array(np.asarray(False), "t")]
    mask_type = F if opset < 10 else B
    model = _model([node], [_vi("x", F, [2, 3])], [_vi("y", F, [2, 3]), _vi("mask", mask_type, [2, 3])],
                   inits=inits, opset=opset)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    if opset >= 10:
        check(model, {"x": x})
    # Dropout 7-9's mask has the input's type; onnxruntime fills it with zeros, ONNX's reference with ones
    # (every element kept), which is what opgraph does for every opset
    y, mask = backend.prepare(model).run({"x": x})
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == (np.float32 if opset < 10 else np.bool_) and np.all(mask == 1)


def test_dropout_training_with_zero_ratio_is_identity() -> None:
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"])
    inits = [onnx.numpy_helper.from_array(np.float32(0), "r"), onnx.numpy_helper.from_array(np.asarray(True), "t")]
    model = _model([node], [_vi("x", F, [4])], [_vi("y", F, [4]), _vi("mask", B, [4])], inits=inits)
    check(model, {"x": np.arange(4, dtype=np.float32)})


def test_dropout_training_with_a_ratio_is_an_error() -> None:
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y"])
    inits = [onnx.numpy_helper.from_array(np.float32(0.5), "r"), onnx.numpy_helper.from_array(np.asarray(True), "t")]
    model = _model([node], [_vi("x", F, [4])], [_vi("y", F, [4])], inits=inits)
    with pytest.raises(OnnxImportError, match=r"Dropout node.*training mode with ratio 0.5.*random"):
        from_onnx(model)
