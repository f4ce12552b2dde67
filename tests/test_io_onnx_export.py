"""opgraph -> ONNX export: the checker accepts the model, onnxruntime runs it and matches opgraph,
and importing it back computes the same."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import opgraph  # noqa: E402
from opgraph.core.graph import Graph  # noqa: E402
from opgraph.io.onnx import OnnxExportError, from_onnx, to_onnx  # noqa: E402
from opgraph.io.onnx.export import RULES  # noqa: E402
from test_io_dag import graphs  # noqa: E402

# Some unary cases see inputs outside their domain (asin of 1.2): NumPy and onnxruntime both give NaN, NumPy warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _ort_run(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check_export(g: Graph, feeds: dict[str, np.ndarray], rtol: float = 1e-6, atol: float = 1e-6) -> Any:
    """Export, check, run in onnxruntime and through the importer; compare each with opgraph's run."""
    model = to_onnx(g)
    onnx.checker.check_model(model, full_check=True)
    want = g.run(feeds)
    got = _ort_run(model, feeds)
    assert len(got) == len(want)
    for a, w in zip(got, want, strict=True):
        assert a.dtype == w.dtype and a.shape == w.shape
        np.testing.assert_allclose(a, w, rtol=rtol, atol=atol)
    back = from_onnx(model)
    for a, w in zip(back.run(feeds), want, strict=True):
        assert a.dtype == w.dtype
        np.testing.assert_allclose(a, w, rtol=rtol, atol=atol)
    return model


def _graph(kind: str, *types: Any, **attrs: Any) -> tuple[Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    b = opgraph.GraphBuilder()
    feeds = {}
    ins = []
    for i, (dt, shape) in enumerate(types):
        name = f"x{i}"
        ins.append(b.input((dt, shape), name=name))
        if np.dtype(dt) == np.bool_:
            feeds[name] = rng.random(shape) < 0.5
        elif np.dtype(dt).kind in "iu":
            feeds[name] = rng.integers(1, 7, size=shape).astype(dt)
        else:
            feeds[name] = np.asarray(rng.random(shape) + 0.25).astype(dt)
    outs = b.op(kind, *ins, **attrs)
    b.output(*(outs if isinstance(outs, tuple) else (outs,)))
    return b.freeze(), feeds


F = ("float32", (3, 4))
INT = ("int32", (3, 4))
B = ("bool", (3, 4))
UNARY_F = ["negative", "abs", "sign", "exp", "log", "sqrt", "reciprocal", "sin", "cos", "tan", "asin", "acos",
           "atan", "sinh", "cosh", "tanh", "asinh", "atanh", "floor", "ceil", "round", "sigmoid", "erf",
           "isnan", "isinf", "positive", "copy", "relu", "square", "expm1", "log1p", "log2", "log10", "exp2",
           "erfc", "trunc", "isfinite"]
BINARY_F = ["add", "subtract", "multiply", "power", "maximum", "minimum", "equal", "less", "less_equal", "greater",
            "greater_equal", "not_equal", "divide", "floor_divide", "remainder", "hypot", "logaddexp"]

CASES: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    *((k, (F,), {}) for k in UNARY_F),
    ("acosh", (("float32", (3, 4)),), {}),  # inputs >= 1 below
    *((k, (F, F), {}) for k in BINARY_F),
    *((k, (INT, INT), {}) for k in ["floor_divide", "remainder", "bitwise_and", "bitwise_or", "bitwise_xor", "add"]),
    ("bitwise_invert", (INT,), {}),
    *((k, (B, B), {}) for k in ["logical_and", "logical_or", "logical_xor"]),
    ("logical_not", (B,), {}),
    ("where", (B, F, F), {}),
    ("cast", (F,), {"dtype": "int64"}),
    ("clip", (F, ("float32", ()), ("float32", ())), {}),
    ("matmul", (F, ("float32", (4, 2))), {}),
    ("einsum", (F, ("float32", (4, 2))), {"subscripts": "ij,jk->ik"}),
    ("outer", (("float32", (3,)), ("float32", (4,))), {}),
    ("tensordot", (("float32", (3, 4, 5)), ("float32", (5, 4, 2))), {"axes": ((1, 2), (1, 0))}),
    *((k, (F,), {"axis": ax, "keepdims": kd}) for k in ["sum", "prod", "max", "min", "mean", "logsumexp"]
      for ax, kd in [(None, False), (1, True), (0, False)]),
    *((k, (B,), {"axis": 1}) for k in ["any", "all"]),
    ("var", (F,), {"axis": 1, "correction": 1}),
    ("std", (F,), {"axis": None}),
    *((k, (F,), {"axis": ax, "keepdims": kd}) for k in ["argmax", "argmin"] for ax, kd in [(1, False), (None, True)]),
    ("cumsum", (F,), {"axis": 1}),
    ("reshape", (F,), {"shape": (2, 6)}),
    ("expand_dims", (F,), {"axis": 1}),
    ("squeeze", (("float32", (3, 1, 4)),), {"axis": 1}),
    ("permute_dims", (F,), {"axes": (1, 0)}),
    ("moveaxis", (("float32", (2, 3, 4)),), {"source": 0, "destination": 2}),
    ("broadcast_to", (("float32", (1, 4)),), {"shape": (3, 4)}),
    ("concat", (F, F), {"axis": 0}),
    ("stack", (F, F), {"axis": 1}),
    ("split", (F,), {"sections": 2, "axis": 1}),
    ("getitem", (("float32", (5, 6)),), {"index": (slice(1, None, 2), 3)}),
    ("getitem", (("float32", (5, 6)),), {"index": (None, Ellipsis, slice(None, None, -1))}),
    ("take", (F, ("int64", (2,))), {"axis": 1}),
    ("flip", (F,), {"axis": 0}),
    ("tile", (F,), {"reps": (2, 1, 2)}),
    ("pad", (F,), {"pad_width": ((1, 0), (2, 1)), "mode": "constant", "constant_value": 1.5}),
    ("pad", (F,), {"pad_width": ((1, 1), (2, 2)), "mode": "reflect"}),
    ("pad", (F,), {"pad_width": ((1, 1), (0, 2)), "mode": "edge"}),
    ("softmax", (F,), {"axis": 1}),
    ("log_softmax", (F,), {"axis": 0}),
    ("fma", (F, F, F), {}),
    ("det", (("float32", (2, 3, 3)),), {}),
    ("fmod", (INT, INT), {}),
    ("conv2d", (("float32", (1, 2, 6, 6)), ("float32", (4, 2, 3, 3))), {"padding": (1, 0, 2, 1), "stride": 2}),
    ("max_pool2d", (("float32", (1, 2, 6, 6)),), {"kernel_size": 2}),
    ("avg_pool2d", (("float32", (1, 2, 6, 6)),), {"kernel_size": 3, "padding": 1, "stride": 1}),
    ("conv", (("float32", (1, 2, 7)), ("float32", (4, 1, 3))),
     {"padding": ((1, 2),), "stride": (2,), "dilation": (2,), "groups": 2}),
    ("conv_transpose", (("float32", (1, 2, 4, 4)), ("float32", (2, 3, 3, 3))),
     {"padding": ((1, 0), (0, 1)), "stride": (2, 2), "output_padding": (1, 0)}),
    ("max_pool", (("float32", (1, 2, 7, 7)),), {"kernel_size": (3, 3), "stride": (2, 2), "ceil_mode": True}),
    ("avg_pool", (("float32", (1, 2, 5, 5, 5)),), {"kernel_size": (2, 2, 2), "padding": ((1, 0),) * 3}),
    ("lp_pool", (("float32", (1, 2, 6)),), {"p": 2.0, "kernel_size": (2,)}),
    ("lrn", (("float32", (1, 5, 3, 3)),), {"size": 3}),
    ("gather_elements", (F, ("int64", (3, 2))), {"axis": 1}),
    ("scatter_elements", (F, ("int64", (3, 2)), ("float32", (3, 2))), {"axis": 1, "reduction": "add"}),
    ("gather_nd", (F, ("int64", (2, 2))), {}),
    ("scatter_nd", (F, ("int64", (2, 2)), ("float32", (2,))), {}),
    ("topk", (F,), {"k": 2, "axis": 1}),
    ("trilu", (F,), {"k": 1, "upper": False}),
    ("one_hot", (("int64", (3,)), ("float32", (2,))), {"depth": 5}),
    ("silu", (F,), {}), ("hard_swish", (F,), {}), ("hard_sigmoid", (F,), {"alpha": 0.3, "beta": 0.4}),
    ("layer_norm", (F, ("float32", (4,)), ("float32", (4,))), {"epsilon": 1e-3}),
]


@pytest.mark.parametrize(("kind", "types", "attrs"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_export_matches_onnxruntime(kind: str, types: tuple[Any, ...], attrs: dict[str, Any]) -> None:
    g, feeds = _graph(kind, *types, **attrs)
    if kind == "acosh":
        feeds = {k: v + 1 for k, v in feeds.items()}
    if kind == "take":
        feeds["x1"] = np.array([3, -1], dtype=np.int64)
    if kind in ("gather_elements", "scatter_elements"):
        feeds["x1"] = np.array([[0, 3], [1, 1], [2, 0]], dtype=np.int64)
    if kind in ("gather_nd", "scatter_nd"):
        feeds["x1"] = np.array([[0, 3], [2, 1]], dtype=np.int64)
    check_export(g, feeds, rtol=1e-5, atol=1e-6)


def test_every_rule_is_exercised() -> None:
    covered = {c[0] for c in CASES}
    assert set(RULES) <= covered, sorted(set(RULES) - covered)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_through_onnx(g: Graph) -> None:
    rng = np.random.default_rng(1)
    model = to_onnx(g)
    names = [i.name for i in model.graph.input]
    feeds = {n: rng.standard_normal((4, 6)) for n in names}
    ids = dict(zip(names, g.inputs.tolist(), strict=True))
    want = g.run({ids[n]: a for n, a in feeds.items()})
    onnx.checker.check_model(model, full_check=True)
    for a, w in zip(_ort_run(model, feeds), want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-12)
    back = from_onnx(model)
    for a, w in zip(back.run(feeds), want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-12)


def test_names_kept_and_model_round_trips_through_bytes() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (None, 3)), name="batch")
    w = b.constant(np.arange(6.0).reshape(3, 2))
    b.output(b.name(b.relu(b.matmul(x, w)), "scores"))
    model = to_onnx(b.freeze())
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["batch"]
    assert [o.name for o in model.graph.output] == ["scores"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # the unknown batch size stays symbolic
    feeds = {"batch": np.linspace(-1, 1, 15).reshape(5, 3)}
    (got,) = _ort_run(model, feeds)
    np.testing.assert_allclose(got, np.maximum(feeds["batch"] @ np.arange(6.0).reshape(3, 2), 0))
    back = from_onnx(model.SerializeToString(), input_types={"batch": ("float64", (5, 3))})
    np.testing.assert_allclose(back.run(feeds)[0], got)


def test_state_and_unknown_ops_are_refused() -> None:
    b = opgraph.GraphBuilder()
    p = b.input(("float64", (2,)), name="p")
    b.update(b.multiply(p, 0.5), p)
    with pytest.raises(OnnxExportError, match="update edges"):
        to_onnx(b.freeze())
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 2)), name="x")
    b.output(b.op("inv", x))
    with pytest.raises(OnnxExportError, match=r"op \d+ \(inv\) has no ONNX translation"):
        to_onnx(b.freeze())
