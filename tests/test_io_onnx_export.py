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
    ("slice", (F, ("int64", (2,)), ("int64", (2,)), ("int64", (2,))), {}),
    ("slice", (F, ("int32", (1,)), ("int32", (1,))), {"axes": (-1,)}),
    ("slice_update", (F, ("float32", ()), ("int64", (2,)), ("int64", (2,)), ("int64", (2,))), {"axes": (1, 0)}),
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


# ---------------------------------------------------------------- fused ops and optimised graphs (issue 16)
def _rules_emit() -> set[str]:
    """Every op kind the optimiser's rules name as one they make (``op("kind", ...)`` in their source)."""
    import inspect
    import re

    import opgraph.passes.pipeline as pipeline
    import opgraph.passes.rules as rules

    src = inspect.getsource(rules) + inspect.getsource(pipeline)
    return set(re.findall(r'\bop\(\s*"(\w+)"', src))


def _fused_family() -> list[str]:
    from opgraph.core.registry import all_ops

    return sorted(d.name for d in all_ops() if d.family == "fused")


F64 = ("float64", (3, 4))
S32, S64 = ("float32", ()), ("float64", ())
_UPDATE = {"lr": 0.1, "mu": 0.9}
_ADAM = {"lr": 0.01, "b1": 0.9, "c1": 0.1, "b2": 0.999, "c2": 0.001, "eps": 1e-7}
#: (kind, input types, attributes): every fused op, and the other kinds the optimiser makes, in each form
FUSED_CASES: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("fma", (F, ("float32", (4,)), ("float32", (3, 1))), {}),
    ("fma", (F64, F64, S64), {}),
    *(("matmul_t", (ta, tb), {"transpose_a": a, "transpose_b": t})
      for a, t, ta, tb in [(False, True, F, ("float32", (5, 4))), (True, False, F, ("float32", (3, 5))),
                           (True, True, F64, ("float64", (5, 3))), (False, False, F, ("float32", (4, 2))),
                           (True, True, ("float32", (2, 4, 3)), ("float32", (2, 5, 4)))]),
    ("fused_elementwise", (F, F, S32), {"program": (("multiply", -1, -2), ("sin", 0), ("add", 1, -3),
                                                    ("tanh", 2), ("divide", 3, -2))}),
    ("fused_elementwise", (F64, ("float64", (4,))), {"program": (("subtract", -1, -2), ("exp", 0), ("sqrt", 1))}),
    ("fused_elementwise", (F,), {"program": (("square", -1), ("relu", 0)), "approx": True}),
    *(("sgd_momentum_update", (t, t, t), _UPDATE) for t in (F, F64)),
    *(("adagrad_update", (t, t, t), {"lr": 0.1, "eps": 1e-6}) for t in (F, F64)),
    *(("adam_update", (t, t, t, t), {**_ADAM, "bc1": 0.19, "bc2": 0.002, "square_first": sq})
      for t in (F, F64) for sq in (False, True)),
    *(("adam_update_t", (t, t, t, t, s, s), {**_ADAM, "square_first": sq})
      for t, s in ((F, S32), (F64, S64)) for sq in (False, True)),
    ("gelu", (F,), {"approximate": "none"}),
    ("gelu", (F,), {"approximate": "tanh"}),
    ("gelu", (F64,), {"approximate": "tanh"}),
    ("silu", (F64,), {}),
    ("hard_sigmoid", (F64,), {"alpha": 0.2, "beta": 0.5}),
    ("hard_swish", (F64,), {}),
    ("layer_norm", (F,), {"epsilon": 1e-5}),
]


#: the ONNX operators fused ops may be written with (all in the default domain, opset 18)
_ONNX_OPS = {"Add", "Sub", "Mul", "Div", "MatMul", "Transpose", "Sin", "Tanh", "Exp", "Sqrt", "Relu", "Erf", "Cast",
             "Sigmoid", "HardSigmoid", "HardSwish", "LayerNormalization", "Identity", "Max", "Min"}


def test_every_fused_and_optimiser_made_kind_has_a_case() -> None:
    covered = {c[0] for c in FUSED_CASES} | {c[0] for c in CASES}
    assert set(_fused_family()) | _rules_emit() <= covered, sorted(set(_fused_family()) | _rules_emit() - covered)


@pytest.mark.parametrize(("kind", "types", "attrs"), FUSED_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(FUSED_CASES)])
def test_fused_ops_export_and_run_in_onnxruntime(kind: str, types: tuple[Any, ...], attrs: dict[str, Any]) -> None:
    """A fused op is written as ONNX (a translation or its parts), and onnxruntime gives opgraph's NumPy result."""
    g, feeds = _graph(kind, *types, **attrs)
    single = np.dtype(types[0][0]) == np.float32
    model = check_export(g, feeds, rtol=2e-5 if single else 1e-12, atol=1e-6 if single else 1e-12)
    assert {n.op_type for n in model.graph.node} <= _ONNX_OPS


def test_export_prefers_a_translation_and_writes_no_ops_twice() -> None:
    """fma has a translation (Mul + Add); matmul_t is its parts, a Transpose into MatMul (ONNX Runtime fuses the
    pair: Gemm with transB was no faster, 0.99-1.07x); an update writes each of its textbook ops once."""
    g, _ = _graph("fma", F, F, F)
    assert [n.op_type for n in to_onnx(g).graph.node] == ["Mul", "Add"]
    g, _ = _graph("matmul_t", F, ("float32", (5, 4)), transpose_a=False, transpose_b=True)
    assert [n.op_type for n in to_onnx(g).graph.node] == ["Transpose", "MatMul"]
    g, _ = _graph("sgd_momentum_update", F, F, F, **_UPDATE)
    assert sorted(n.op_type for n in to_onnx(g).graph.node if n.op_type != "Identity") == ["Add", "Mul", "Mul", "Sub"]


def test_an_op_without_a_translation_or_decomposition_is_named_with_the_reason() -> None:
    b = opgraph.GraphBuilder()
    b.output(b.op("inv", b.input(("float64", (2, 2)), name="x")))
    with pytest.raises(OnnxExportError, match=r"op \d+ \(inv\) has no ONNX translation: ONNX has no operator for "
                                              r"inv and opgraph knows no decomposition"):
        to_onnx(b.freeze())
    # a fused program whose step has no ONNX form names that step's kind
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="z")  # (complex operands are refused before: no ONNX operator takes them)
    b.output(b.op("fused_elementwise", x, program=(("conj", -1), ("negative", 0))))
    with pytest.raises(OnnxExportError, match=r"\(fused_elementwise\) has no ONNX translation: it is written as its "
                                              r"decomposition, which uses an op that has none: .*conj"):
        to_onnx(b.freeze())


def _run_both(g: Graph, model: Any, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    targets = [*g.outputs.tolist(), *g.updates[:, 0].tolist()]
    return _ort_run(model, feeds), g.run(feeds, targets)


def _demo_step() -> Graph:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import demo

    return demo.build_step(64).graph  # the graph examples/demo.py saves as out/mlp_step.cg


def _conv_model() -> tuple[Graph, dict[str, np.ndarray]]:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from memory_models import build

    g, feeds, _ = build("resnet", scale=0.05)  # conv + batch-norm (x * s + t: fma at level 2) + residual relu
    return g, feeds


@pytest.mark.parametrize("level", [1, 2, 3])
def test_optimised_demo_mlp_step_exports_and_matches(level: int) -> None:
    """Issue 16: ``to_onnx(optimize(g, level=2))`` of the demo's training step failed on matmul_t. Its update
    edges become extra outputs (``updates="outputs"``); ONNX Runtime's step equals the unoptimised graph's."""
    g = _demo_step()
    o = opgraph.optimize(g, level=level, cost=None)  # cost=None: level 3 fuses every elementwise chain too
    made = {o.kind_of(op) for op in range(o.num_ops)}
    if level >= 2:
        assert {"matmul_t", "sgd_momentum_update"} <= made
    if level == 3:
        assert "fused_elementwise" in made
    with pytest.raises(OnnxExportError, match="update edges"):
        to_onnx(o)
    model = to_onnx(o, updates="outputs")
    onnx.checker.check_model(model, full_check=True)
    assert [x.name for x in model.graph.output][1:] == [f"{g.name_of(d)}.next" for d in g.updates[:, 1].tolist()]
    rng = np.random.default_rng(3)
    feeds = {g.name_of(v): rng.standard_normal(g.type_of(v).shape) for v in g.inputs.tolist()}
    got, want = _run_both(g, model, feeds)
    assert len(got) == len(want) == 1 + len(g.updates)
    for a, w in zip(got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("level", [2, 3])
def test_optimised_conv_model_exports_and_matches(level: int) -> None:
    g, feeds = _conv_model()
    rep = opgraph.optimize(g, level=level, cost=None, report="data")  # level 3: elementwise chains fused too
    o = rep.graph
    assert rep.counts.get("fold_scale")  # the batch norms' x * s + t folded into the convs
    assert level == 2 or "fused_elementwise" in {o.kind_of(op) for op in range(o.num_ops)}
    model = to_onnx(o)
    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_allclose(_ort_run(model, feeds)[0], g.run(feeds)[0], rtol=1e-4, atol=1e-5)


def test_optimised_transformer_block_exports_and_matches() -> None:
    """gelu, layer_norm, silu and matmul_t made by the optimiser from their formulas, exported and run."""
    rng = np.random.default_rng(4)
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (6, 8)), name="x")
    w1 = b.input(("float32", (16, 8)), name="w1")  # an input: a transposed constant would be folded
    w2 = b.constant(rng.standard_normal((16, 8)).astype(np.float32) / 4)
    mean = b.mean(x, axis=-1, keepdims=True)
    d = b.subtract(x, mean)
    ln = b.divide(d, b.sqrt(b.add(b.mean(b.square(d), axis=-1, keepdims=True), np.float32(1e-5))))
    h = b.matmul(ln, b.permute_dims(w1))                                  # matmul_t
    erf = b.erf(b.multiply(h, np.float32(1 / np.sqrt(2))))
    h = b.multiply(b.multiply(np.float32(0.5), h), b.add(np.float32(1.0), erf))   # gelu
    h = b.multiply(h, b.sigmoid(h))                                        # silu
    b.output(b.name(b.add(x, b.matmul(h, w2)), "y"))
    g = b.freeze()
    o = opgraph.optimize(g, level=2)
    made = {o.kind_of(op) for op in range(o.num_ops)}
    assert {"matmul_t", "gelu", "silu", "layer_norm"} <= made, made
    model = to_onnx(o)
    onnx.checker.check_model(model, full_check=True)
    feeds = {"x": rng.standard_normal((6, 8)).astype(np.float32),
             "w1": rng.standard_normal((16, 8)).astype(np.float32) / 3}
    np.testing.assert_allclose(_ort_run(model, feeds)[0], g.run(feeds)[0], rtol=1e-4, atol=1e-5)


def test_hard_swish_keeps_numpy_overflow_unless_onnx_semantics_are_asked() -> None:
    """NumPy's x * (x + 3) / 6 overflows to inf at 3.4e38 where ONNX's HardSwish stays finite: by default the
    export is the arithmetic form, bit for bit opgraph's result; nan_semantics="onnx" writes HardSwish."""
    import onnxruntime

    b = opgraph.GraphBuilder()
    b.output(b.op("hard_swish", b.input(("float32", (64,)), name="x")))
    g = b.freeze()
    xv = np.concatenate([np.array([3.4e38, -3.4e38, np.inf, -np.inf, np.nan, 3, -3, 0, -0.0], np.float32),
                         np.random.default_rng(0).standard_normal(55).astype(np.float32) * 5])
    model = to_onnx(g)
    assert "HardSwish" not in {n.op_type for n in model.graph.node}
    got = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": xv})[0]
    ref = g.run({"x": xv})[0]
    assert np.isinf(ref[0]) and np.array_equal(got.view(np.int32), ref.view(np.int32))
    assert [n.op_type for n in to_onnx(g, nan_semantics="onnx").graph.node] == ["HardSwish"]
    # so the onnxruntime engine declares no difference from NumPy for it, and auto may pick it
    from opgraph.runtime.auto import numerics_exclusions

    assert "onnxruntime" not in numerics_exclusions(g, ["numpy", "onnxruntime"])
