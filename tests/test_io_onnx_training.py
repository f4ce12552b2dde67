"""ONNX import of the training domain (Gradient, Adagrad, Adam, Momentum), TensorScatter and ai.onnx.ml ops.

The references are NumPy: finite differences for ``Gradient``, the pseudo code
of the ONNX operator docs for the optimisers and TensorScatter, and the ONNX
reference's definitions for the ml ops. The backend suite covers one case of
each; these cover the attribute combinations and errors it does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import helper  # noqa: E402

from opgraph.io.onnx import OnnxImportError, from_onnx  # noqa: E402

TRAINING = "ai.onnx.preview.training"
ML = "ai.onnx.ml"
RNG = np.random.default_rng(11)


def _vi(name: str, a: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)


def _graph_model(nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], outputs: list[str],
                 inits: dict[str, np.ndarray] | None = None, opset: int = 24) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [_vi(n, a) for n, a in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=[onnx.numpy_helper.from_array(a, n) for n, a in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(TRAINING, 1),
                                                   helper.make_opsetid(ML, 1)])


def _run(nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], outputs: list[str],
         inits: dict[str, np.ndarray] | None = None, opset: int = 24) -> list[np.ndarray]:
    g = from_onnx(_graph_model(nodes, inputs, outputs, inits, opset))
    return [np.asarray(r) for r in g.run(inputs)]


# ---------------------------------------------------------------- Gradient
def _finite_difference(f: Callable[[dict[str, np.ndarray]], float], at: dict[str, np.ndarray],
                       name: str, h: float = 1e-6) -> np.ndarray:
    x = at[name]
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = dict(at), dict(at)
        up[name], down[name] = x.copy(), x.copy()
        up[name][i] += h
        down[name][i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    return grad


# y = sum(tanh(a @ w) * b) + sum(exp(a) * a)
_FORWARD = [
    helper.make_node("MatMul", ["a", "w"], ["aw"]),
    helper.make_node("Tanh", ["aw"], ["t"]),
    helper.make_node("Mul", ["t", "b"], ["tb"]),
    helper.make_node("ReduceSum", ["tb"], ["s1"], keepdims=0),
    helper.make_node("Exp", ["a"], ["ea"]),
    helper.make_node("Mul", ["ea", "a"], ["eaa"]),
    helper.make_node("ReduceSum", ["eaa"], ["s2"], keepdims=0),
    helper.make_node("Add", ["s1", "s2"], ["y"]),
]


def _forward(v: dict[str, np.ndarray]) -> float:
    return float(np.sum(np.tanh(v["a"] @ v["w"]) * v["b"]) + np.sum(np.exp(v["a"]) * v["a"]))


def _gradient_inputs() -> dict[str, np.ndarray]:
    return {"a": RNG.standard_normal((2, 3)), "w": RNG.standard_normal((3, 4)), "b": RNG.standard_normal(4)}


def test_gradient_matches_finite_differences() -> None:
    inputs = _gradient_inputs()
    grad = helper.make_node("Gradient", ["a", "w", "b"], ["dy_da", "dy_dw"], domain=TRAINING,
                            xs=["a", "w"], zs=["b"], y="y")
    y, da, dw = _run([*_FORWARD, grad], inputs, ["y", "dy_da", "dy_dw"])
    np.testing.assert_allclose(y, _forward(inputs))
    np.testing.assert_allclose(da, _finite_difference(_forward, inputs, "a"), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dw, _finite_difference(_forward, inputs, "w"), rtol=1e-6, atol=1e-8)


def test_gradient_at_other_inputs_recomputes_y() -> None:
    # the Gradient node's inputs give the point of differentiation, which need not be the named xs
    inputs = {**_gradient_inputs(), "a1": RNG.standard_normal((2, 3))}
    grad = helper.make_node("Gradient", ["a1", "w", "b"], ["dy_da"], domain=TRAINING, xs=["a", "w"], zs=["b"],
                            y="y")
    y, da = _run([*_FORWARD, grad], inputs, ["y", "dy_da"])
    np.testing.assert_allclose(y, _forward(inputs))
    at = {**inputs, "a": inputs["a1"]}
    np.testing.assert_allclose(da, _finite_difference(_forward, at, "a"), rtol=1e-6, atol=1e-8)


def test_gradient_at_a_constant_point() -> None:
    # a constant point is rebuilt without folding, so the gradient still has ops to follow
    inputs = _gradient_inputs()
    a0 = RNG.standard_normal((2, 3))
    grad = helper.make_node("Gradient", ["a0", "w", "b"], ["dy_da"], domain=TRAINING, xs=["a", "w"], zs=["b"],
                            y="y")
    (da,) = _run([*_FORWARD, grad], inputs, ["dy_da"], inits={"a0": a0})
    np.testing.assert_allclose(da, _finite_difference(_forward, {**inputs, "a": a0}, "a"), rtol=1e-6, atol=1e-8)


def test_gradient_of_gradient() -> None:
    # y = x^3: dy/dx = 3 x^2, d2y/dx2 = 6 x
    x = RNG.standard_normal(())
    nodes = [helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Mul", ["x2", "x"], ["y"]),
             helper.make_node("Gradient", ["x"], ["dy"], domain=TRAINING, xs=["x"], y="y"),
             helper.make_node("Gradient", ["x"], ["d2y"], domain=TRAINING, xs=["x"], y="dy")]
    dy, d2y = _run(nodes, {"x": np.asarray(x)}, ["dy", "d2y"])
    np.testing.assert_allclose(dy, 3 * x * x)
    np.testing.assert_allclose(d2y, 6 * x)


def test_gradient_of_non_scalar_is_gradient_of_sum() -> None:
    x = RNG.standard_normal((3,)).astype(np.float32)
    nodes = [helper.make_node("Sin", ["x"], ["y"]),
             helper.make_node("Gradient", ["x"], ["dy"], domain=TRAINING, xs=["x"], y="y")]
    (dy,) = _run(nodes, {"x": x}, ["dy"])
    assert dy.dtype == np.float32
    np.testing.assert_allclose(dy, np.cos(x), rtol=1e-6)


def test_gradient_of_constant_is_an_error() -> None:
    nodes = [helper.make_node("Mul", ["c", "x"], ["y"]),
             helper.make_node("Gradient", ["c"], ["dy"], domain=TRAINING, xs=["c"], y="y")]
    with pytest.raises(OnnxImportError, match="constant while importing"):
        _run(nodes, {"x": np.float32(2.0)}, ["dy"], inits={"c": np.float32(3.0)})


def test_gradient_of_unknown_name_is_an_error() -> None:
    nodes = [helper.make_node("Sin", ["x"], ["y"]),
             helper.make_node("Gradient", ["x"], ["dy"], domain=TRAINING, xs=["x"], y="nope")]
    with pytest.raises(OnnxImportError, match="'nope'"):
        _run(nodes, {"x": np.float32(2.0)}, ["dy"])


# ---------------------------------------------------------------- optimisers, from the ONNX docs' pseudo code
def _adagrad(r: Any, t: Any, x: np.ndarray, g: np.ndarray, h: np.ndarray, norm_coefficient: float,
             epsilon: float, decay_factor: float) -> tuple[np.ndarray, ...]:
    r_ = r / (1 + t * decay_factor)
    g_reg = norm_coefficient * x + g
    h_new = h + g_reg * g_reg
    x_new = x - r_ * g_reg / (np.sqrt(h_new) + epsilon)
    return x_new, h_new


def _adam(r: Any, t: Any, x: np.ndarray, g: np.ndarray, v: np.ndarray, h: np.ndarray, norm_coefficient: float,
          norm_coefficient_post: float, alpha: float, beta: float, epsilon: float) -> tuple[np.ndarray, ...]:
    g_reg = norm_coefficient * x + g
    v_new = alpha * v + (1 - alpha) * g_reg
    h_new = beta * h + (1 - beta) * g_reg * g_reg
    h_sqrt = np.sqrt(h_new) + epsilon
    r_adj = r * np.sqrt(1 - beta ** t) / (1 - alpha ** t) if t > 0 else r
    x_new = x - r_adj * v_new / h_sqrt
    return (1 - norm_coefficient_post) * x_new, v_new, h_new


def _momentum(r: Any, t: Any, x: np.ndarray, g: np.ndarray, v: np.ndarray, norm_coefficient: float,
              alpha: float, beta: float, mode: str) -> tuple[np.ndarray, ...]:
    g_reg = norm_coefficient * x + g
    beta_adj = beta if t > 0 else 1
    v_new = alpha * v + beta_adj * g_reg
    x_new = x - r * (v_new if mode == "standard" else g_reg + alpha * v_new)
    return x_new, v_new


def _optimiser_case(op: str, per_tensor: int, shapes: list[tuple[int, ...]], dtype: Any, t: int,
                    reference: Callable[..., tuple[np.ndarray, ...]], **attrs: Any) -> None:
    n = len(shapes)
    r, t_ = np.asarray(0.05, dtype=np.float32), np.asarray(t, dtype=np.int64)
    tensors = [[RNG.standard_normal(s).astype(dtype) for s in shapes] for _ in range(per_tensor)]
    # accumulated squared gradients are non-negative
    if op in ("Adagrad", "Adam"):
        tensors[-1] = [np.abs(a) for a in tensors[-1]]
    kinds = "XGVH"[:per_tensor] if op != "Adagrad" else "XGH"
    names = [f"{k}{i}" for k in kinds for i in range(n)]
    inputs = {"R": r, "T": t_, **{nm: a for nm, a in zip(names, [a for kind in tensors for a in kind], strict=True)}}
    outputs = [f"{k}{i}_new" for k in kinds[:1] + kinds[2:] for i in range(n)]
    node = helper.make_node(op, list(inputs), outputs, domain=TRAINING, **attrs)
    got = _run([node], inputs, outputs)
    # ONNX stores float attributes as float32: the reference gets the values the importer sees
    seen = {k: float(np.float32(v)) if isinstance(v, float) else v for k, v in attrs.items()}
    want_per_tensor = [reference(r.astype(np.float64), t, *[kind[i].astype(np.float64) for kind in tensors], **seen)
                       for i in range(n)]
    want = [w[k] for k in range(per_tensor - 1) for w in want_per_tensor]
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
    for gv, wv, x in zip(got, want, [a for kind in tensors[:1] + tensors[2:] for a in kind], strict=True):
        assert gv.dtype == x.dtype and gv.shape == x.shape
        np.testing.assert_allclose(gv, wv, rtol=tol, atol=tol)


@pytest.mark.parametrize("t", [0, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adagrad(t: int, dtype: Any) -> None:
    _optimiser_case("Adagrad", 3, [(3,), (2, 2)], dtype, t, _adagrad, norm_coefficient=0.01, epsilon=1e-5,
                    decay_factor=0.1)


@pytest.mark.parametrize("t", [0, 1, 4])
@pytest.mark.parametrize("post", [0.0, 0.05])
def test_adam(t: int, post: float) -> None:
    _optimiser_case("Adam", 4, [(4,), (2, 3)], np.float64, t, _adam, norm_coefficient=0.01,
                    norm_coefficient_post=post, alpha=0.9, beta=0.99, epsilon=1e-6)


def test_adam_defaults() -> None:
    _optimiser_case("Adam", 4, [(5,)], np.float32, 2, lambda *a: _adam(*a, 0.0, 0.0, 0.9, 0.999, 1e-6))


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 2])
def test_momentum(mode: str, t: int) -> None:
    _optimiser_case("Momentum", 3, [(3,), (2, 2), ()], np.float64, t, _momentum, norm_coefficient=0.02,
                    alpha=0.9, beta=0.5, mode=mode)


def test_momentum_bad_mode_is_an_error() -> None:
    inputs = {"R": np.float32(0.1), "T": np.int64(0), "X": np.ones(2, np.float32), "G": np.ones(2, np.float32),
              "V": np.ones(2, np.float32)}
    node = helper.make_node("Momentum", list(inputs), ["X_new", "V_new"], domain=TRAINING, alpha=0.9, beta=1.0,
                            norm_coefficient=0.0, mode="heavy")
    with pytest.raises(OnnxImportError, match="mode"):
        _run([node], inputs, ["X_new", "V_new"])


def test_optimiser_input_count_is_checked() -> None:
    inputs = {"R": np.float32(0.1), "T": np.int64(0), "X": np.ones(2, np.float32), "G": np.ones(2, np.float32)}
    node = helper.make_node("Adagrad", list(inputs), ["X_new"], domain=TRAINING)
    with pytest.raises(OnnxImportError, match="per optimised tensor"):
        _run([node], inputs, ["X_new"])


# ---------------------------------------------------------------- TensorScatter
def _tensor_scatter(cache: np.ndarray, update: np.ndarray, write_indices: np.ndarray | None, mode: str,
                    axis: int) -> np.ndarray:
    axis %= cache.ndim
    if write_indices is None:
        write_indices = np.zeros(cache.shape[0], dtype=np.int64)
    out = cache.copy()
    for prefix in np.ndindex(cache.shape[:axis]):
        for s in range(update.shape[axis]):
            pos = write_indices[prefix[0]] + s
            if mode == "circular":
                pos %= cache.shape[axis]
            out[(*prefix, pos)] = update[(*prefix, s)]
    return out


@pytest.mark.parametrize(("shape", "axis", "seq"), [((2, 3, 6, 4), -2, 2), ((2, 3, 6, 4), 1, 2),
                                                    ((3, 5), -1, 3), ((2, 4, 5), 2, 1), ((2, 5, 3), 1, 5)])
@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("with_indices", [True, False])
def test_tensor_scatter(shape: tuple[int, ...], axis: int, seq: int, mode: str, with_indices: bool) -> None:
    ax = axis % len(shape)
    cache = RNG.standard_normal(shape).astype(np.float32)
    update = RNG.standard_normal((*shape[:ax], seq, *shape[ax + 1:])).astype(np.float32)
    high = shape[ax] if mode == "circular" else shape[ax] - seq + 1
    idx = RNG.integers(0, high, size=shape[0]).astype(np.int64)
    inputs = {"cache": cache, "update": update, **({"idx": idx} if with_indices else {})}
    node = helper.make_node("TensorScatter", list(inputs), ["out"], mode=mode, axis=axis)
    (got,) = _run([node], inputs, ["out"])
    np.testing.assert_array_equal(got, _tensor_scatter(cache, update, idx if with_indices else None, mode, axis))


def test_tensor_scatter_linear_overflow_is_an_error() -> None:
    cache, update = np.zeros((2, 4, 3), np.float32), np.ones((2, 2, 3), np.float32)
    node = helper.make_node("TensorScatter", ["cache", "update", "idx"], ["out"], axis=1)
    with pytest.raises(OnnxImportError, match="run past"):
        _run([node], {"cache": cache, "update": update}, ["out"], inits={"idx": np.array([0, 3], np.int64)})


def test_tensor_scatter_shape_mismatch_is_an_error() -> None:
    cache, update = np.zeros((2, 4, 3), np.float32), np.ones((2, 2, 2), np.float32)
    node = helper.make_node("TensorScatter", ["cache", "update"], ["out"], axis=1)
    with pytest.raises(OnnxImportError, match="does not fit"):
        _run([node], {"cache": cache, "update": update}, ["out"])


# ---------------------------------------------------------------- ai.onnx.ml
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("threshold", [0.0, -1.5, 1.5, 2.0])
def test_binarizer(dtype: Any, threshold: float) -> None:
    x = (RNG.standard_normal((3, 4)) * 3).astype(dtype)
    node = helper.make_node("Binarizer", ["X"], ["Y"], threshold=threshold, domain=ML)
    (got,) = _run([node], {"X": x}, ["Y"])
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, (x > np.float32(threshold)).astype(dtype))


@pytest.mark.parametrize(("shape", "indices"), [((3, 4), [0, 1]), ((5,), [4, 0, 0]), ((2, 3, 4), [[3, -1]]),
                                                ((2, 6), [[1, 2], [3, 4]]), ((3, 4), [2])])
def test_array_feature_extractor(shape: tuple[int, ...], indices: list[Any]) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    idx = np.asarray(indices, dtype=np.int64)
    node = helper.make_node("ArrayFeatureExtractor", ["X", "I"], ["Z"], domain=ML)
    (got,) = _run([node], {"X": x, "I": idx}, ["Z"])
    # ONNX's reference: the flattened indices select along the last axis; a vector gives one row
    want = x[..., idx.reshape(-1)]
    want = want.reshape((1, -1) if x.ndim == 1 else (*x.shape[:-1], idx.size))
    np.testing.assert_array_equal(got, want)


def test_array_feature_extractor_known_index_out_of_range() -> None:
    node = helper.make_node("ArrayFeatureExtractor", ["X", "I"], ["Z"], domain=ML)
    with pytest.raises(OnnxImportError, match="out of range"):
        _run([node], {"X": np.zeros((2, 3), np.float32)}, ["Z"], inits={"I": np.array([3], np.int64)})
