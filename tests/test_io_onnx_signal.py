"""ONNX import of BitCast, DFT, STFT and MelWeightMatrix, checked against ONNX Runtime (or, where ONNX
Runtime has no kernel or departs from ONNX's reference implementation, against that reference and NumPy).

Each case is a one-node model; the ONNX backend suite covers one or two cases per op, these cover the
attribute and input combinations around them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from opgraph.io.onnx import OnnxImportError, backend, from_onnx  # noqa: E402
from opgraph.io.onnx.translate_signal import mel_weight_matrix  # noqa: E402

RNG = np.random.default_rng(17)


def _model(op: str, inputs: dict[str, np.ndarray], opset: int, consts: dict[str, np.ndarray] | None = None,
           **attrs: Any) -> onnx.ModelProto:
    """A one-node model with output "y"; names with a leading underscore are omitted inputs (empty name)."""
    consts = consts or {}
    names = [*inputs, *consts]
    node = helper.make_node(op, [n if not n.startswith("_") else "" for n in names], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items() if not n.startswith("_")],
        [helper.make_empty_tensor_value_info("y")],
        initializer=[onnx.numpy_helper.from_array(np.asarray(a), n) for n, a in consts.items()
                     if not n.startswith("_")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    # The backend's checker wants the output's type and shape: ONNX's shape inference, or where it cannot
    # tell (a length fed as an input, a case it rejects), those of the reference's result for these inputs.
    model = onnx.shape_inference.infer_shapes(model)
    out = model.graph.output[0].type
    if not (out.HasField("tensor_type") and out.tensor_type.HasField("shape")):
        feeds = {n: a for n, a in inputs.items() if not n.startswith("_")}
        try:
            with np.errstate(all="ignore"):
                (ref,) = ReferenceEvaluator(model).run(None, feeds)
        except Exception:  # an invalid model, made to test import errors (from_onnx does not check it)
            return model
        model.graph.output[0].CopyFrom(helper.make_tensor_value_info(
            "y", helper.np_dtype_to_tensor_dtype(np.asarray(ref).dtype), np.shape(ref)))
    return model


def _opgraph(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    (got,) = backend.prepare(model).run({n: a for n, a in feeds.items() if not n.startswith("_")})
    return np.asarray(got)


def _compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def _vs_ort(op: str, inputs: dict[str, np.ndarray], opset: int = 20, consts: dict[str, np.ndarray] | None = None,
            rtol: float = 1e-4, atol: float = 1e-4, **attrs: Any) -> np.ndarray:
    model = _model(op, inputs, opset, consts, **attrs)
    feeds = {n: a for n, a in inputs.items() if not n.startswith("_")}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, feeds)
    got = _opgraph(model, feeds)
    _compare(got, want, rtol, atol)
    return got


def _vs_reference(op: str, inputs: dict[str, np.ndarray], opset: int = 20,
                  consts: dict[str, np.ndarray] | None = None, rtol: float = 1e-4, atol: float = 1e-4,
                  **attrs: Any) -> np.ndarray:
    model = _model(op, inputs, opset, consts, **attrs)
    feeds = {n: a for n, a in inputs.items() if not n.startswith("_")}
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    got = _opgraph(model, feeds)
    _compare(got, np.asarray(want), rtol, atol)
    return got


def _signal(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def _i64(v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def _to_complex(y: np.ndarray) -> np.ndarray:
    return y[..., 0] + 1j * y[..., 1]


# ---------------------------------------------------------------- BitCast
@pytest.mark.parametrize(("src", "dst"), [("float32", "int32"), ("int32", "float32"), ("float64", "uint64"),
                                          ("int8", "uint8"), ("uint16", "int16"), ("float16", "int16"),
                                          ("int16", "float16"), ("uint32", "float32")])
@pytest.mark.parametrize("shape", [(), (4,), (2, 3)])
def test_bitcast(src: str, dst: str, shape: tuple[int, ...]) -> None:
    x = np.asarray(RNG.standard_normal(shape) * 50).astype(src)
    _vs_ort("BitCast", {"x": x}, opset=26, to=helper.np_dtype_to_tensor_dtype(np.dtype(dst)))


@pytest.mark.parametrize(("x", "dst"), [(np.array([True, False, True]), "uint8"),
                                        (np.array([[False], [True]]), "int8"),
                                        (np.array([0, 1, 7, 128], dtype=np.uint8), "bool")])
def test_bitcast_bool(x: np.ndarray, dst: str) -> None:
    # ONNX Runtime has no BitCast kernel for bool: compare with ONNX's reference (bytes read as bool: nonzero).
    got = _vs_reference("BitCast", {"x": x}, opset=26, to=helper.np_dtype_to_tensor_dtype(np.dtype(dst)))
    if dst == "bool":
        np.testing.assert_array_equal(got, x != 0)


def test_bitcast_of_other_size_is_an_import_error() -> None:
    model = _model("BitCast", {"x": np.zeros(2, np.float32)}, 26, to=onnx.TensorProto.DOUBLE)
    with pytest.raises(OnnxImportError, match="item sizes differ"):
        from_onnx(model)


# ---------------------------------------------------------------- DFT
DFT_CASES: list[tuple[tuple[int, ...], dict[str, Any], int | None]] = [
    ((2, 8, 1), {}, None),
    ((2, 8, 2), {}, None),
    ((2, 8, 2), {"inverse": 1}, None),
    ((2, 8, 1), {"inverse": 1}, None),
    ((3, 5, 4, 2), {}, None),
    ((2, 8, 1), {}, 12),
    ((2, 8, 2), {}, 5),
    ((2, 8, 2), {"inverse": 1}, 11),
    ((2, 9, 1), {"onesided": 1}, None),
    ((2, 8, 1), {"onesided": 1}, 5),
    ((2, 8, 1), {"onesided": 1}, 13),
    ((2, 5, 2), {"onesided": 1, "inverse": 1}, None),
    ((2, 6, 2), {"onesided": 1, "inverse": 1}, 10),
    ((2, 6, 2), {"onesided": 1, "inverse": 1}, 11),
]


def _dft_check(shape: tuple[int, ...], attrs: dict[str, Any], n: int | None, axis: int) -> Any:
    """ONNX Runtime, except for an irfft whose length does not fit the bins (see the test below)."""
    bins = shape[axis]
    if attrs.get("onesided") and attrs.get("inverse") and n is not None and n // 2 + 1 != bins:
        return _vs_reference
    return _vs_ort


@pytest.mark.parametrize(("shape", "attrs", "n"), DFT_CASES)
@pytest.mark.parametrize("axis", [1, -2])
def test_dft_opset20(shape: tuple[int, ...], attrs: dict[str, Any], n: int | None, axis: int) -> None:
    x = _signal(*shape)
    consts = {"n": _i64(n) if n is not None else None, "axis": _i64(axis)}
    consts = {k if v is not None else "_" + k: v if v is not None else np.zeros(0) for k, v in consts.items()}
    _dft_check(shape, attrs, n, axis)("DFT", {"x": x}, 20, consts, **attrs)


@pytest.mark.parametrize(("shape", "attrs", "n"), DFT_CASES)
def test_dft_opset17_axis_attribute(shape: tuple[int, ...], attrs: dict[str, Any], n: int | None) -> None:
    x = _signal(*shape)
    consts = {"n": _i64(n)} if n is not None else {}
    for axis in (len(shape) - 2, 0):
        _dft_check(shape, attrs, n, axis)("DFT", {"x": x}, 17, consts, axis=axis, **attrs)


def test_dft_default_axes() -> None:
    x = _signal(3, 4, 2)
    z = _to_complex(x)
    # Opset 17's axis attribute defaults to 1, opset 20's axis input to -2 (here the same axis, 1).
    np.testing.assert_allclose(_to_complex(_opgraph(_model("DFT", {"x": x}, 17), {"x": x})), np.fft.fft(z, axis=1),
                               rtol=1e-4, atol=1e-4)
    x4 = _signal(3, 4, 5, 2)
    got = _to_complex(_opgraph(_model("DFT", {"x": x4}, 20), {"x": x4}))
    np.testing.assert_allclose(got, np.fft.fft(_to_complex(x4), axis=2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("attrs", [{}, {"inverse": 1}, {"onesided": 1}, {"onesided": 1, "inverse": 1}])
def test_dft_other_float_dtypes(dtype: Any, attrs: dict[str, Any]) -> None:
    last = 2 if attrs.get("inverse") else 1
    x = _signal(2, 6, last, dtype=dtype)
    tol = 1e-6 if dtype == np.float64 else 1e-2  # ONNX Runtime's double DFT is good to about 3e-8
    _vs_ort("DFT", {"x": x}, 17, axis=1, rtol=tol, atol=tol * 10, **attrs)


def test_dft_onesided_of_a_complex_input_follows_the_reference() -> None:
    # ONNX Runtime refuses it; ONNX's reference keeps the first half of the full transform.
    x = _signal(2, 7, 2)
    got = _vs_reference("DFT", {"x": x}, 17, axis=1, onesided=1)
    assert got.shape == (2, 4, 2)


@pytest.mark.parametrize("n", [4, 7, 9, 12])
def test_dft_irfft_with_a_length_follows_numpy(n: int) -> None:
    # ONNX's reference is np.fft.irfft(x, n) (the spectrum cut or zero-padded to n // 2 + 1 bins);
    # ONNX Runtime's results differ when n is not 2 * (bins - 1), so compare with NumPy and the reference.
    x = _signal(3, 6, 2)
    got = _vs_reference("DFT", {"x": x}, 17, {"n": _i64(n)}, axis=1, onesided=1, inverse=1)
    np.testing.assert_allclose(got[..., 0], np.fft.irfft(_to_complex(x), n, axis=1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("shape", "opset", "attrs", "consts", "match"), [
    ((2, 8, 3), 17, {}, {}, "must end in a dimension of 1"),
    ((8,), 17, {}, {}, "must end in a dimension of 1"),
    ((2, 8, 2), 17, {"axis": 2}, {}, "axis 2 is out of range"),
    ((2, 8, 2), 20, {}, {"_n": np.zeros(0), "axis": _i64(-1)}, "axis -1 is out of range"),
    ((2, 8, 2), 17, {"axis": 1}, {"n": _i64(0)}, "dft_length must be >= 1"),
    ((2, 8, 2), 17, {"axis": 1}, {"n": np.array(2.0, np.float32)}, "must be an integer scalar"),
])
def test_dft_import_errors(shape: tuple[int, ...], opset: int, attrs: dict[str, Any], consts: dict[str, np.ndarray],
                           match: str) -> None:
    with pytest.raises(OnnxImportError, match=match):
        from_onnx(_model("DFT", {"x": _signal(*shape)}, opset, consts, **attrs))


def test_dft_length_as_a_graph_input_is_specialised() -> None:
    x = _signal(2, 8, 1)
    model = _model("DFT", {"x": x, "n": _i64(6)}, 17, axis=1)
    rep = backend.prepare(model)
    for n in (6, 10):
        (got,) = rep.run({"x": x, "n": _i64(n)})
        np.testing.assert_allclose(_to_complex(got), np.fft.fft(x[..., 0], n, axis=1), rtol=1e-4, atol=1e-4)
    with pytest.raises(OnnxImportError, match="must be known when the graph is built"):
        from_onnx(model)


# ---------------------------------------------------------------- STFT
def _window(n: int, dtype: Any = np.float32) -> np.ndarray:
    return np.hanning(n).astype(dtype)


@pytest.mark.parametrize(("length", "step", "frame", "window", "onesided"), [
    (64, 8, 16, True, 1), (64, 8, 16, False, 1), (64, 5, 16, True, 0), (50, 7, 12, False, 0),
    (33, 4, 9, True, 1), (20, 3, 20, False, 1), (20, 30, 5, True, 1),
])
@pytest.mark.parametrize("complex_signal", [False, True])
def test_stft(length: int, step: int, frame: int, window: bool, onesided: int, complex_signal: bool) -> None:
    sig = _signal(2, length, 2 if complex_signal else 1)
    consts: dict[str, np.ndarray] = {"step": _i64(step)}
    consts["w" if window else "_w"] = _window(frame) if window else np.zeros(0)
    consts["fl"] = _i64(frame)
    got = _vs_ort("STFT", {"s": sig}, 17, consts, onesided=onesided)
    bins = frame // 2 + 1 if onesided else frame
    assert got.shape == (2, (length - frame) // step + 1, bins, 2)


def test_stft_frame_length_from_the_window_or_the_signal() -> None:
    sig = _signal(1, 40, 1)
    _vs_ort("STFT", {"s": sig}, 17, {"step": _i64(6), "w": _window(10)})
    # Neither a window nor a frame length: one frame of the whole signal (ONNX Runtime fails on this).
    got = _vs_reference("STFT", {"s": sig}, 17, {"step": _i64(6)})
    np.testing.assert_allclose(_to_complex(got)[0, 0], np.fft.rfft(sig[0, :, 0]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_stft_other_float_dtypes(dtype: Any) -> None:
    sig = _signal(2, 30, 1, dtype=dtype)
    tol = 1e-6 if dtype == np.float64 else 2e-2
    _vs_ort("STFT", {"s": sig}, 17, {"step": _i64(4), "w": _window(8, dtype)}, rtol=tol, atol=tol * 10)


def test_stft_of_a_rank_2_signal() -> None:
    # [batch, length] without the trailing 1: ONNX Runtime takes it as a real signal, so does opgraph.
    _vs_ort("STFT", {"s": _signal(3, 24)}, 17, {"step": _i64(4), "w": _window(8)})


@pytest.mark.parametrize(("shape", "consts", "match"), [
    ((1, 16, 1), {"step": _i64(0)}, "frame_step must be >= 1"),
    ((1, 16, 1), {"step": _i64(2), "w": _window(8), "fl": _i64(6)}, r"window must have shape \(6,\)"),
    ((1, 16, 1), {"step": _i64(2), "_w": np.zeros(0), "fl": _i64(20)}, r"frame_length 20 must be in \[1, 16\]"),
    ((1, 16, 3), {"step": _i64(2)}, "must end in a dimension of 1"),
    ((16,), {"step": _i64(2)}, "signal must have shape"),
])
def test_stft_import_errors(shape: tuple[int, ...], consts: dict[str, np.ndarray], match: str) -> None:
    with pytest.raises(OnnxImportError, match=match):
        from_onnx(_model("STFT", {"s": _signal(*shape)}, 17, consts))


# ---------------------------------------------------------------- MelWeightMatrix
MEL_CASES = [
    (8, 16, 8192, 0.0, 4096.0),
    (10, 64, 16000, 100.0, 7000.0),
    (40, 512, 16000, 20.0, 8000.0),
    (5, 33, 22050, 300.0, 3000.0),
    (3, 8, 100, 0.0, 50.0),
]


@pytest.mark.parametrize("args", MEL_CASES)
@pytest.mark.parametrize(("int_dtype", "float_dtype"), [(np.int32, np.float32), (np.int64, np.float64)])
def test_mel_weight_matrix(args: tuple[Any, ...], int_dtype: Any, float_dtype: Any) -> None:
    names = ["bins", "dft", "rate", "lo", "hi"]
    consts = {n: np.array(a, dtype=int_dtype if i < 3 else float_dtype) for i, (n, a) in enumerate(zip(names, args,
                                                                                                       strict=True))}
    # Exactly ONNX's reference; ONNX Runtime has a kernel for float32 edge frequencies only.
    got = _vs_reference("MelWeightMatrix", {}, 17, consts, rtol=0, atol=0)
    if float_dtype == np.float32:
        _vs_ort("MelWeightMatrix", {}, 17, consts, rtol=1e-6, atol=1e-6)
    assert got.shape == (args[1] // 2 + 1, args[0]) and got.max() == 1.0


@pytest.mark.parametrize("out", [onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT32])
def test_mel_weight_matrix_output_datatype(out: int) -> None:
    consts = {"bins": np.int32(6), "dft": np.int32(32), "rate": np.int32(8000), "lo": np.float32(0),
              "hi": np.float32(4000)}
    _vs_reference("MelWeightMatrix", {}, 17, consts, rtol=0, atol=0, output_datatype=out)


def test_mel_weight_matrix_inputs_may_be_graph_inputs() -> None:
    # The backend folds them in (the matrix's shape depends on their values).
    feeds = {"bins": np.array(8, np.int32), "dft": np.array(16, np.int32), "rate": np.array(8192, np.int32),
             "lo": np.array(0, np.float32), "hi": np.array(4096, np.float32)}
    got = _opgraph(_model("MelWeightMatrix", feeds, 17), feeds)
    np.testing.assert_array_equal(got, mel_weight_matrix(*(a[()] for a in feeds.values())).astype(np.float32))


@pytest.mark.parametrize(("args", "match"), [
    ((8, 16, 8192, 0.0, 9000.0), "fall outside the 9 one-sided bins"),
    ((0, 16, 8192, 0.0, 4096.0), "must be >= 1"),
])
def test_mel_weight_matrix_errors(args: tuple[Any, ...], match: str) -> None:
    consts = {n: np.array(a, dtype=np.int32 if i < 3 else np.float32)
              for i, (n, a) in enumerate(zip(["bins", "dft", "rate", "lo", "hi"], args, strict=True))}
    with pytest.raises(OnnxImportError, match=match):
        from_onnx(_model("MelWeightMatrix", {}, 17, consts))
