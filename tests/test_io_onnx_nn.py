"""ONNX import of neural-network ops (pooling, convolution, resizing, recurrent layers, attention, losses),
checked against ONNX Runtime.

Each case is a one-node model; the ONNX backend suite covers the common cases, these cover the
attribute combinations it tests little or not at all.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402

from opgraph.io.onnx import OnnxImportError, backend, from_onnx  # noqa: E402

RNG = np.random.default_rng(11)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _model(op: str, inputs: dict[str, np.ndarray], outputs: list[str], opset: int,
           consts: dict[str, np.ndarray] | None = None, **attrs: Any) -> onnx.ModelProto:
    """A one-node model; inputs named with a leading underscore are omitted (empty name)."""
    consts = consts or {}
    names = [*inputs, *consts]
    node = helper.make_node(op, [n if not n.startswith("_") else "" for n in names], outputs, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items() if not n.startswith("_")],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=[onnx.numpy_helper.from_array(a, n) for n, a in consts.items() if not n.startswith("_")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _run(op: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None, opset: int = 21,
         consts: dict[str, np.ndarray] | None = None, rtol: float = 1e-5, atol: float = 1e-6,
         **attrs: Any) -> None:
    model = _model(op, inputs, outputs or ["y"], opset, consts, **attrs)
    feeds = {n: a for n, a in inputs.items() if not n.startswith("_")}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    got = backend.prepare(model).run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- pooling
@pytest.mark.parametrize(("shape", "kernel", "strides", "pads", "storage_order"), [
    ((2, 3, 7), [3], [2], [1, 1], 0),
    ((2, 3, 5, 6), [2, 3], [2, 1], [0, 1, 1, 0], 0),
    ((2, 3, 5, 6), [3, 2], [1, 2], [1, 0, 1, 1], 1),
    ((1, 2, 4, 5, 3), [2, 2, 2], [2, 2, 1], None, 0),
])
def test_max_pool_indices(shape: tuple[int, ...], kernel: list[int], strides: list[int], pads: list[int] | None,
                          storage_order: int) -> None:
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": strides, "storage_order": storage_order}
    if pads:
        attrs["pads"] = pads
    _run("MaxPool", {"x": _f32(*shape)}, ["y", "i"], **attrs)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_avg_pool_auto_pad(auto_pad: str) -> None:
    _run("AveragePool", {"x": _f32(1, 2, 7, 6)}, kernel_shape=[3, 2], strides=[2, 2], auto_pad=auto_pad)


def test_avg_pool_ceil_count_include_pad() -> None:
    _run("AveragePool", {"x": _f32(1, 2, 6, 7)}, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
         ceil_mode=1, count_include_pad=1)


def test_global_lp_pool() -> None:
    _run("GlobalLpPool", {"x": _f32(2, 3, 4, 5)}, p=3, rtol=1e-4)


def test_max_unpool_with_output_shape() -> None:
    # the indices address the unpooled (4, 4) planes; output_shape only appends zeros (ONNX's reference)
    x = _f32(1, 2, 2, 2)
    idx = np.array([[[[0, 3], [9, 14]], [[17, 22], [24, 31]]]], np.int64)
    model = _model("MaxUnpool", {"x": x, "i": idx}, ["y"], 11, {"s": np.array([1, 2, 5, 5], np.int64)},
                   kernel_shape=[2, 2], strides=[2, 2])
    # shape inference cannot see through the output_shape input; the checker wants a typed output
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (1, 2, 5, 5)))
    (y,) = backend.prepare(model).run({"x": x, "i": idx})
    want = np.zeros((1, 2, 4, 4), np.float32)
    want.reshape(-1)[idx.reshape(-1)] = x.reshape(-1)
    np.testing.assert_array_equal(y, np.pad(want, ((0, 0), (0, 0), (0, 1), (0, 1))))


def test_max_unpool_round_trip() -> None:
    x = _f32(1, 2, 4, 6)
    pool = _model("MaxPool", {"x": x}, ["y", "i"], 12, kernel_shape=[2, 2], strides=[2, 2])
    y, idx = backend.prepare(pool).run({"x": x})
    _run("MaxUnpool", {"p": y, "i": idx}, opset=11, kernel_shape=[2, 2], strides=[2, 2])


# ---------------------------------------------------------------- convolution
@pytest.mark.parametrize("attrs", [
    {"strides": [2, 3], "output_shape": [9, 10], "auto_pad": "SAME_LOWER"},
    {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 1]},
    {"strides": [1, 2], "dilations": [2, 1], "group": 2},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
])
def test_conv_transpose(attrs: dict[str, Any]) -> None:
    w = _f32(4, 3 if attrs.get("group", 1) == 1 else 2, 3, 3)
    _run("ConvTranspose", {"x": _f32(2, 4, 4, 5)}, consts={"w": w, "b": _f32(w.shape[1] * attrs.get("group", 1))},
         rtol=1e-4, atol=1e-5, **attrs)


def test_conv_same_lower() -> None:
    _run("Conv", {"x": _f32(1, 2, 7, 8)}, consts={"w": _f32(3, 2, 3, 2)}, auto_pad="SAME_LOWER", strides=[2, 3],
         rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- resizing
def _resize(x: np.ndarray, scales: np.ndarray | None = None, sizes: np.ndarray | None = None,
            rtol: float = 1e-5, **attrs: Any) -> None:
    consts = {"_roi": np.zeros(0, np.float32)}
    consts["scales" if scales is not None else "_scales"] = scales if scales is not None else np.zeros(0, np.float32)
    if sizes is not None:
        consts["sizes"] = sizes
    _run("Resize", {"x": x}, opset=19, consts=consts, rtol=rtol, atol=1e-5, **attrs)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias(mode: str) -> None:
    _resize(_f32(1, 2, 9, 10), scales=np.array([1, 1, 0.5, 0.75], np.float32), mode=mode, antialias=1, rtol=1e-4)


def test_resize_nearest_integer_input() -> None:
    x = RNG.integers(0, 255, (1, 1, 3, 4)).astype(np.uint8)
    _resize(x, sizes=np.array([1, 1, 7, 5], np.int64), mode="nearest", nearest_mode="round_prefer_ceil",
            coordinate_transformation_mode="asymmetric")


def test_resize_axes_keep_aspect_ratio() -> None:
    _resize(_f32(2, 3, 4, 6), sizes=np.array([7, 7], np.int64), axes=[3, 2], mode="linear",
            keep_aspect_ratio_policy="not_smaller")


def test_resize_cubic_exclude_outside_half_pixel_symmetric() -> None:
    _resize(_f32(1, 1, 5, 6), scales=np.array([1, 1, 1.7, 0.6], np.float32), mode="cubic", exclude_outside=1,
            coordinate_transformation_mode="half_pixel_symmetric", cubic_coeff_a=-0.5, rtol=1e-4)


def test_resize_opset10_nearest() -> None:
    _run("Resize", {"x": _f32(1, 1, 3, 4)}, opset=10, consts={"scales": np.array([1, 1, 2, 1.5], np.float32)})


def test_upsample_linear() -> None:
    _run("Upsample", {"x": _f32(1, 1, 3, 4)}, opset=9, consts={"scales": np.array([1, 1, 2, 2.5], np.float32)},
         mode="linear")


def test_grid_sample_bicubic_opset16() -> None:
    # (with padding_mode="border", ONNX Runtime's cubic differs from ONNX's reference, which opgraph follows)
    grid = RNG.uniform(-1.2, 1.2, (2, 3, 4, 2)).astype(np.float32)
    _run("GridSample", {"x": _f32(2, 3, 5, 6), "g": grid}, opset=16, mode="bicubic", padding_mode="reflection",
         rtol=1e-4, atol=1e-5)


def test_roi_align_max_sampling_ratio() -> None:
    rois = np.array([[0.5, 1.0, 6.0, 5.5], [2.0, 0.0, 4.0, 3.0]], np.float32)
    _run("RoiAlign", {"x": _f32(2, 3, 8, 8)}, opset=16,
         consts={"rois": rois, "b": np.array([1, 0], np.int64)}, output_height=2, output_width=3,
         sampling_ratio=2, mode="max", spatial_scale=0.9)


def test_non_max_suppression_center_point() -> None:
    boxes = np.array([[[0.5, 0.5, 1.0, 1.0], [0.6, 0.5, 1.0, 1.0], [3.0, 3.0, 1.0, 2.0], [0.5, 0.45, 1.1, 1.0]]],
                     np.float32)
    scores = np.array([[[0.9, 0.8, 0.7, 0.95], [0.1, 0.6, 0.4, 0.2]]], np.float32)
    _run("NonMaxSuppression", {}, ["y"], opset=11,
         consts={"boxes": boxes, "scores": scores, "m": np.array([2], np.int64), "iou": np.array([0.5], np.float32),
                 "st": np.array([0.15], np.float32)}, center_point_box=1)


def test_non_max_suppression_needs_known_boxes() -> None:
    model = _model("NonMaxSuppression", {"boxes": _f32(1, 3, 4), "scores": _f32(1, 1, 3)}, ["y"], 11)
    with pytest.raises(OnnxImportError, match="boxes"):
        from_onnx(model)


# ---------------------------------------------------------------- normalisation and activations
def test_lp_normalization_zero_rows() -> None:
    x = _f32(3, 4)
    x[1] = 0
    _run("LpNormalization", {"x": x}, axis=1, p=1)


def test_instance_norm_3d() -> None:
    _run("InstanceNormalization", {"x": _f32(2, 3, 4, 2, 3)}, consts={"s": _f32(3), "b": _f32(3)}, epsilon=1e-3,
         rtol=1e-4, atol=1e-5)


def test_batch_norm_training_mode() -> None:
    x, s, b, m, v = _f32(4, 3, 2, 2), _f32(3), _f32(3), _f32(3), np.abs(_f32(3))
    model = _model("BatchNormalization", {"x": x}, ["y", "rm", "rv"], 15, {"s": s, "b": b, "m": m, "v": v},
                   training_mode=1, momentum=0.8)
    y, rm, rv = backend.prepare(model).run({"x": x})
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    want = s[:, None, None] * (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) + b[:, None, None]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rm, m * 0.8 + mean * 0.2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, v * 0.8 + var * 0.2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("op", "attrs"), [("Gelu", {"approximate": "tanh"}), ("Mish", {}), ("HardSwish", {}),
                                           ("Celu", {"alpha": 0.7}), ("Shrink", {"lambd": 0.3, "bias": 0.2})])
def test_activation(op: str, attrs: dict[str, Any]) -> None:
    _run(op, {"x": _f32(3, 5)}, opset=20, rtol=1e-5, atol=1e-6, **attrs)


def test_prelu_per_channel_slope() -> None:
    # PyTorch exports a (C,) slope for (N, C, L) inputs: not NumPy-broadcastable, placed on the channel axis
    x, slope = _f32(2, 3, 4), _f32(3)
    model = _model("PRelu", {"x": x}, ["y"], 16, {"s": slope})
    (y,) = backend.prepare(model).run({"x": x})
    np.testing.assert_array_equal(y, np.where(x < 0, x * slope[:, None], x))


@pytest.mark.parametrize(("weights", "ignore_index", "reduction"), [
    (True, 1, "mean"), (False, -1, "mean"), (True, None, "sum"), (False, 2, "none")])
def test_softmax_cross_entropy(weights: bool, ignore_index: int | None, reduction: str) -> None:
    labels = np.array([[0, 1, 2], [2, -1, 1]], np.int64)
    inputs = {"x": _f32(2, 4, 3), "t": labels}
    consts = {"w": np.abs(_f32(4))} if weights else None
    attrs: dict[str, Any] = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    else:
        inputs["t"] = np.abs(labels)
    _run("SoftmaxCrossEntropyLoss", inputs, ["loss", "log_prob"], opset=13, consts=consts, rtol=1e-5, **attrs)


# ---------------------------------------------------------------- recurrent layers
def _rnn_inputs(kind: str, dirs: int, steps: int = 4, batch: int = 3, size: int = 2, hidden: int = 3,
                layout: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    x = _f32(batch, steps, size) if layout else _f32(steps, batch, size)
    consts = {"w": _f32(dirs, gates * hidden, size) * 0.5, "r": _f32(dirs, gates * hidden, hidden) * 0.5,
              "b": _f32(dirs, 2 * gates * hidden) * 0.5}
    return {"x": x}, consts


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_sequence_lens(kind: str, direction: str) -> None:
    dirs = 2 if direction == "bidirectional" else 1
    inputs, consts = _rnn_inputs(kind, dirs)
    consts["lens"] = np.array([4, 2, 3], np.int32)
    consts["h0"] = _f32(dirs, 3, 3)
    outputs = ["y", "yh"]
    if kind == "LSTM":
        consts["c0"] = _f32(dirs, 3, 3)
        consts["p"] = _f32(dirs, 9)
        outputs.append("yc")
    _run(kind, inputs, outputs, opset=14, consts=consts, rtol=1e-4, atol=1e-5, hidden_size=3, direction=direction)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_recurrent_clip_activations(kind: str) -> None:
    inputs, consts = _rnn_inputs(kind, 2)
    acts = {"RNN": ["LeakyRelu", "Affine"], "GRU": ["HardSigmoid", "Tanh", "Sigmoid", "Softsign"],
            "LSTM": ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Affine", "Elu"]}[kind]
    attrs: dict[str, Any] = {"activations": acts, "clip": 1.5, "direction": "bidirectional", "hidden_size": 3}
    alphas = {"RNN": [0.2, 0.5], "GRU": [0.3, 0.6], "LSTM": [0.3, 0.5, 0.9]}[kind]
    betas = {"RNN": [0.1], "GRU": [0.4], "LSTM": [0.4, 0.2]}[kind]
    attrs.update(activation_alpha=alphas, activation_beta=betas)
    if kind == "GRU":
        attrs["linear_before_reset"] = 1
    outputs = ["y", "yh", "yc"] if kind == "LSTM" else ["y", "yh"]
    _run(kind, inputs, outputs, opset=14, consts=consts, rtol=1e-4, atol=1e-5, **attrs)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_recurrent_batch_major_layout(kind: str) -> None:
    # ONNX Runtime has no layout=1: compare with its layout=0 result, transposed
    inputs, consts = _rnn_inputs(kind, 2)
    consts["_lens"] = np.zeros(0, np.int32)
    consts["h0"] = _f32(2, 3, 3)
    outputs = ["y", "yh", "yc"] if kind == "LSTM" else ["y", "yh"]
    model = _model(kind, inputs, outputs, 14, consts, hidden_size=3, direction="bidirectional")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    batch_major = dict(consts, h0=consts["h0"].transpose(1, 0, 2))
    x = inputs["x"].transpose(1, 0, 2)
    model = _model(kind, {"x": x}, outputs, 14, batch_major, hidden_size=3, direction="bidirectional", layout=1)
    got = backend.prepare(model).run({"x": x})
    np.testing.assert_allclose(got[0], want[0].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-6)
    for g, w in zip(got[1:], want[1:], strict=True):
        np.testing.assert_allclose(g, w.transpose(1, 0, 2), rtol=1e-5, atol=1e-6)


def test_lstm_input_forget() -> None:
    inputs, consts = _rnn_inputs("LSTM", 1)
    _run("LSTM", inputs, ["y", "yh", "yc"], opset=14, consts=consts, rtol=1e-4, atol=1e-5, hidden_size=3,
         input_forget=1)


# ---------------------------------------------------------------- attention
def test_attention_gqa_past_mask_softcap() -> None:
    # Attention-23 runs in ONNX Runtime 1.2x; compare against it with every optional input present
    q, k, v = _f32(2, 4, 3, 8), _f32(2, 2, 3, 8), _f32(2, 2, 3, 8)
    past_k, past_v = _f32(2, 2, 2, 8), _f32(2, 2, 2, 8)
    mask = RNG.random((3, 5)) > 0.3
    mask[:, 0] = True
    _run("Attention", {"q": q, "k": k, "v": v, "m": mask, "pk": past_k, "pv": past_v},
         ["y", "present_k", "present_v", "qk"], opset=23, rtol=1e-4, atol=1e-5, softcap=2.0, scale=0.3,
         qk_matmul_output_mode=1)


def test_attention_3d_causal_float_mask() -> None:
    q, k, v = _f32(2, 4, 12), _f32(2, 6, 4), _f32(2, 6, 6)
    _run("Attention", {"q": q, "k": k, "v": v, "m": _f32(4, 6)}, ["y"], opset=23, rtol=1e-4, atol=1e-5,
         is_causal=1, q_num_heads=3, kv_num_heads=1)
