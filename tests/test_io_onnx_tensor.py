"""ONNX import of indexing, layout, quantization and reduction ops, checked against ONNX Runtime.

Each case is a one-node model; the ONNX backend suite covers the common cases, these cover the
attribute combinations it tests little or not at all.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from opgraph.io.onnx import OnnxImportError, backend, from_onnx  # noqa: E402

RNG = np.random.default_rng(7)


def _model(op: str, inputs: dict[str, np.ndarray], outputs: list[str], opset: int = 21,
           consts: dict[str, np.ndarray] | None = None, **attrs: Any) -> onnx.ModelProto:
    consts = consts or {}
    names = [*inputs, *consts]
    node = helper.make_node(op, [n if not n.startswith("_") else "" for n in names], outputs, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=[onnx.numpy_helper.from_array(a, n) for n, a in consts.items()],
    )
    return _finish(graph, opset)


def _finish(graph: onnx.GraphProto, opset: int = 21) -> onnx.ModelProto:
    # the backend checks the model, which needs typed outputs: let ONNX infer them
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _check(model: onnx.ModelProto, inputs: dict[str, np.ndarray], *, exact: bool = True) -> None:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, inputs)
    got = backend.prepare(model).run(inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape
        if exact:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _run(op: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None, opset: int = 21,
         consts: dict[str, np.ndarray] | None = None, exact: bool = True, **attrs: Any) -> None:
    _check(_model(op, inputs, outputs or ["y"], opset, consts, **attrs), inputs, exact=exact)


def test_gather_nd_batch_dims() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    idx = np.array([[[1], [2]], [[0], [-1]]], dtype=np.int64)
    _run("GatherND", {"x": x, "i": idx}, batch_dims=1)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_negative_axis(reduction: str) -> None:
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    idx = np.array([[0, 3], [-1, 1], [2, 2]], dtype=np.int64)
    u = RNG.standard_normal((3, 2)).astype(np.float32)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    _run("ScatterElements", {"x": x, "i": idx, "u": u}, axis=-1, exact=False, **attrs)


@pytest.mark.parametrize(("largest", "axis"), [(0, 1), (1, 0)])
def test_topk(largest: int, axis: int) -> None:
    x = np.array([[3, 1, 3, 2], [0, 5, 5, 1], [2, 2, 2, 2]], dtype=np.int32)
    _run("TopK", {"x": x}, ["v", "i"], consts={"k": np.array([2], np.int64)}, largest=largest, axis=axis)


def test_one_hot_float_indices_and_axis() -> None:
    idx = np.array([[1.0, -2.0], [0.0, 9.0]], dtype=np.float32)
    _run("OneHot", {"i": idx}, consts={"d": np.array(4.0, np.float32), "v": np.array([2, 5], np.float32)}, axis=1)


@pytest.mark.parametrize("opset", [11, 13])
def test_hardmax_opsets(opset: int) -> None:
    x = np.array([[[1, 3, 3], [2, 0, 1]], [[4, 4, 0], [0, 1, 9]]], dtype=np.float32)
    _run("Hardmax", {"x": x}, opset=opset, axis=1)


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_int32(exclusive: int, reverse: int) -> None:
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)
    _run("CumSum", {"x": x}, consts={"a": np.array(1, np.int64)}, exclusive=exclusive, reverse=reverse)
    model = _model("CumProd", {"x": x}, ["y"], 26, {"a": np.array(-1, np.int64)}, exclusive=exclusive,
                   reverse=reverse)
    got = backend.prepare(model).run({"x": x})[0]
    ref = np.flip(x, 1) if reverse else x
    ref = np.cumprod(np.pad(ref, ((0, 0), (1, 0)), constant_values=1)[:, :-1] if exclusive else ref, axis=1)
    np.testing.assert_array_equal(got, np.flip(ref, 1) if reverse else ref)
    assert got.dtype == np.int32


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(mode: str) -> None:
    x = np.arange(2 * 8 * 2 * 3, dtype=np.float32).reshape(2, 8, 2, 3)
    _run("DepthToSpace", {"x": x}, blocksize=2, mode=mode)
    y = np.arange(2 * 2 * 4 * 6, dtype=np.float32).reshape(2, 2, 4, 6)
    _run("SpaceToDepth", {"x": y}, blocksize=2)


def test_reverse_sequence_batch_first() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    _run("ReverseSequence", {"x": x}, consts={"l": np.array([1, 4, 2], np.int64)}, batch_axis=0, time_axis=1)


def test_compress_nonzero_unique_known_and_at_run_time() -> None:
    x = np.array([[1, 0, 2], [0, 3, 1]], dtype=np.float32)
    _run("Compress", {"x": x}, consts={"c": np.array([0, 1, 1], bool)}, axis=1)
    _run("Compress", {"x": x}, consts={"c": np.array([1, 0, 1, 1], bool)})
    # the values decide the output shape: known (an initializer) they fold; fed at run time, they become the
    # nonzero / unique ops (a dynamic dim), except Unique along an axis or unsorted, which the backend specialises
    _run("NonZero", {"x": x})
    _run("Compress", {"x": x, "c": np.array([1, 0, 1], bool)}, axis=1)
    u = np.array([[2, 1], [0, 1], [2, 1]], dtype=np.int64)
    _run("Unique", {"x": u}, ["y", "i", "inv", "c"], sorted=0, axis=0)
    _run("Unique", {"x": u}, ["y", "i", "inv", "c"], sorted=0)
    _run("Unique", {"x": u}, ["y", "i", "inv", "c"])


def test_nonzero_compress_unique_of_computed_values_have_dynamic_dims() -> None:
    # one graph for any input size: compared with ONNX Runtime at two batch sizes
    f, b = TensorProto.FLOAT, TensorProto.BOOL
    nodes = [helper.make_node("Greater", ["x", "z"], ["m"]), helper.make_node("NonZero", ["m"], ["nz"]),
             helper.make_node("Compress", ["x", "c"], ["cx"], axis=0),
             helper.make_node("Unique", ["x"], ["u", "ui", "uinv", "uc"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", f, [None, 3]), helper.make_tensor_value_info("c", b, [None])],
        [helper.make_empty_tensor_value_info(o) for o in ("nz", "cx", "u", "ui", "uinv", "uc")],
        initializer=[helper.make_tensor("z", f, [], [0.0])])
    model = _finish(graph, 13)
    g = from_onnx(model)
    assert g.value("nz").type.shape == (2, None) and g.value("cx").type.shape == (None, 3)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (2, 5):
        feeds = {"x": np.round(RNG.standard_normal((n, 3))).astype(np.float32), "c": RNG.random(n) > 0.5}
        for got, want in zip(g.run(feeds), sess.run(None, feeds), strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_col2im_3d_with_pads_strides_dilations() -> None:
    x = RNG.standard_normal((1, 2 * 2 * 2 * 2, 2 * 2 * 2)).astype(np.float32)
    # image 5x5x6, block 2x2x2, pads 1 each side in the first axis, stride 2 and dilation 2 in others
    model = _model("Col2Im", {"x": x}, ["y"], 18,
                   {"s": np.array([5, 5, 6], np.int64), "b": np.array([2, 2, 2], np.int64)},
                   pads=[1, 0, 0, 1, 0, 0], strides=[4, 2, 2], dilations=[1, 2, 2])
    got = backend.prepare(model).run({"x": x})[0]
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_dequantize_per_axis(dtype: Any) -> None:
    x = (RNG.standard_normal((2, 3, 4)) * 300).astype(np.float32)
    x[0, 0, :2] = [0.5, 2.5]  # ties round to even
    scale = np.array([0.5, 2.0, 1.5], np.float32)
    zp = np.array([1, 0, 7], dtype)
    _run("QuantizeLinear", {"x": x}, consts={"s": scale, "z": zp}, axis=1)
    q = (np.arange(24) % 120).astype(dtype).reshape(2, 3, 4)
    _run("DequantizeLinear", {"q": q}, consts={"s": scale, "z": zp}, axis=-2)


def test_quantize_blocked() -> None:
    x = (RNG.standard_normal((3, 5)) * 100).astype(np.float32)
    scale = np.array([[1.0, 2.0], [0.5, 4.0], [3.0, 1.0]], np.float32)
    zp = np.array([[0, 3], [-2, 1], [5, 5]], np.int8)
    _run("QuantizeLinear", {"x": x}, consts={"s": scale, "z": zp}, axis=1, block_size=3)
    _run("DequantizeLinear", {"q": np.arange(15, dtype=np.int8).reshape(3, 5)}, consts={"s": scale, "z": zp},
         axis=1, block_size=3)


def test_matmul_integer_zero_points() -> None:
    a = RNG.integers(0, 255, (2, 3, 4)).astype(np.uint8)
    _run("MatMulInteger", {"a": a, "b": a[0].T.copy()}, consts={"za": np.array(7, np.uint8),
                                                              "zb": np.array(200, np.uint8)})
    # ONNX also allows a zero point per row of a and per column of b; ONNX Runtime does not (and its
    # uint8 x int8 kernel saturates intermediate sums), so check these against NumPy
    b = RNG.integers(-128, 127, (4, 2)).astype(np.int8)
    za, zb = np.array([1, 2, 3], np.uint8), np.array([4, -4], np.int8)
    model = _model("MatMulInteger", {"a": a, "b": b}, ["y"], consts={"za": za, "zb": zb})
    got = backend.prepare(model).run({"a": a, "b": b})[0]
    want = (a.astype(np.int32) - za[:, None]) @ (b.astype(np.int32) - zb)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_conv_integer_and_qlinear_conv_per_channel() -> None:
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(-20, 20, (3, 2, 3, 3)).astype(np.int8)
    _run("ConvInteger", {"x": x, "w": w}, consts={"zx": np.array(3, np.uint8)}, pads=[1, 1, 1, 1])
    consts = {"xs": np.array(0.05, np.float32), "xz": np.array(10, np.uint8), "w_": w,
              "ws": np.array([0.1, 0.02, 0.05], np.float32), "wz": np.zeros(3, np.int8),
              "ys": np.array(0.3, np.float32), "yz": np.array(120, np.uint8),
              "b": np.array([100, -50, 0], np.int32)}
    inputs = {"x": x}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w_", "ws", "wz", "ys", "yz", "b"], ["y"],
                            strides=[2, 2], pads=[0, 1, 1, 0])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
                              [helper.make_empty_tensor_value_info("y")],
                              initializer=[onnx.numpy_helper.from_array(a, n) for n, a in consts.items()])
    _check(_finish(graph), inputs)


def test_qlinear_matmul_per_row_and_column_scales() -> None:
    a = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    b = RNG.integers(0, 255, (4, 2)).astype(np.uint8)
    consts = {"as": np.array([0.01, 0.02, 0.03], np.float32), "az": np.array([1, 2, 3], np.uint8),
              "b_": b, "bs": np.array([0.05, 0.1], np.float32), "bz": np.array([128, 120], np.uint8),
              "ys": np.array(0.2, np.float32), "yz": np.array(100, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b_", "bs", "bz", "ys", "yz"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape)],
                              [helper.make_empty_tensor_value_info("y")],
                              initializer=[onnx.numpy_helper.from_array(v, n) for n, v in consts.items()])
    model = _finish(graph)
    got = backend.prepare(model).run({"a": a})[0]
    c = (a.astype(np.int32) - consts["az"][:, None]) @ (b.astype(np.int32) - consts["bz"])
    want = np.clip(np.rint(c * (consts["as"][:, None] * consts["bs"] / consts["ys"])) + 100, 0, 255)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, want.astype(np.uint8))


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ReduceLogSumExp"])
def test_reduce_over_an_empty_axis(op: str) -> None:
    x = np.zeros((2, 0, 3), np.float32)
    _run(op, {"x": x}, opset=18, consts={"a": np.array([1], np.int64)}, keepdims=0)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceMax"])
def test_reduce_keeps_small_int_dtypes(op: str) -> None:
    x = np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    _run(op, {"x": x}, opset=13 if op == "ReduceSum" else 11, axes=None if op == "ReduceSum" else [1],
         **({"consts": {"a": np.array([1], np.int64)}} if op == "ReduceSum" else {}))


@pytest.mark.parametrize(("op", "attrs", "inits"), [
    ("ReduceSum", {}, {"ax": np.array([3])}),
    ("ReduceSum", {}, {"ax": np.array([1, -1])}),
    ("Transpose", {"perm": [3, 0]}, {}),
    ("Softmax", {"axis": 5}, {}),
    ("Unsqueeze", {}, {"ax": np.array([0, 0])}),
])
def test_bad_axes_are_errors_naming_the_node(op: str, attrs: dict[str, Any], inits: dict[str, np.ndarray]) -> None:
    # an axis outside the rank (or repeated) must not wrap around silently
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node(op, ["x", *inits], ["y"], **attrs)
    consts = [onnx.numpy_helper.from_array(v.astype(np.int64), k) for k, v in inits.items()]
    graph = helper.make_graph([node], "g", [x], [y], initializer=consts)
    with pytest.raises(OnnxImportError, match=rf"{op} node 'y': (axis -?\d+ is out of range|repeated axis)"):
        from_onnx(_finish(graph, 18))
