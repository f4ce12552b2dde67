"""The ``fold_affine`` pass (level 2): a constant per-channel scale and shift after a conv, conv_transpose or matmul
with constant weights folds into the weights and one bias add.

Every case compares the optimised graph with the unoptimised one (NumPy engine), counts the ops left, and one case
compares with torch's conv + batch norm in eval mode; an ONNX Conv + BatchNormalization model is compared with
onnxruntime on the original model.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opgraph
import opgraph.nn as nn
import opgraph.numpy as onp
from opgraph.frontend.lazy import placeholder
from opgraph.passes import FOLD_AFFINE, optimize, rewrite

AFFINE = {"add", "subtract", "multiply", "divide", "fma"}


def kinds(g: opgraph.Graph) -> Counter[str]:
    return Counter(g.kind_of(i) for i in range(g.num_ops) if g.kind_of(i) != "const")


def check(g: opgraph.Graph, feeds: dict[str, np.ndarray], rtol: float = 1e-12) -> tuple[opgraph.Graph, Any]:
    """Optimise ``g`` at level 2; the result and the report, after comparing their outputs."""
    rep = optimize(g, report="data")
    want, got = g.run(feeds)[0], rep.graph.run(feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())
    return rep.graph, rep


def bn_stats(rng: np.random.Generator, c: int, shape: tuple[int, ...], dtype: Any) -> list[np.ndarray]:
    """mean, var, gamma, beta, shaped to broadcast per channel."""
    return [rng.standard_normal(c).reshape(shape).astype(dtype), (rng.random(c) + 0.5).reshape(shape).astype(dtype),
            rng.standard_normal(c).reshape(shape).astype(dtype), rng.standard_normal(c).reshape(shape).astype(dtype)]


def batch_norm(y: Any, mean: Any, var: Any, gamma: Any, beta: Any, eps: float = 1e-5) -> Any:
    """Batch norm in inference form, as a user writes it with opgraph.numpy."""
    return (y - mean) / onp.sqrt(var + np.asarray(eps, var.dtype)) * gamma + beta


def test_conv2d_batch_norm_against_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    stats = bn_stats(rng, 6, (1, 6, 1, 1), np.float32)
    x = placeholder((2, 3, 9, 9), np.float32, name="x")
    g = nn.relu(batch_norm(nn.conv2d(x, onp.asarray(w), padding=(1, 1), stride=(2, 2)), *stats)).graph
    xv = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    opt, rep = check(g, {"x": xv}, rtol=2e-6)
    assert kinds(opt) == Counter({"conv2d": 1, "add": 1, "relu": 1})
    assert set(rep.counts) >= {"fold_scale", "fold_shift"}

    conv = torch.nn.Conv2d(3, 6, 3, stride=2, padding=1, bias=False)
    bn = torch.nn.BatchNorm2d(6, eps=1e-5)
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(w))
        mean, var, gamma, beta = (torch.from_numpy(s.reshape(-1)) for s in stats)
        bn.running_mean.copy_(mean)
        bn.running_var.copy_(var)
        bn.weight.copy_(gamma)
        bn.bias.copy_(beta)
        ref = torch.relu(bn.eval()(conv(torch.from_numpy(xv)))).numpy()
    np.testing.assert_allclose(opt.run({"x": xv})[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stat_shape", [(1, 5, 1, 1), (5, 1, 1)])
def test_conv_bias_batch_norm(stat_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3, 4, 7, 6)), name="x")
    y = b.op("conv", x, b.constant(rng.standard_normal((5, 4, 3, 2))), stride=(1, 2), padding=((1, 1), (0, 1)))
    y = b.add(y, b.constant(rng.standard_normal(stat_shape)))          # the conv's own bias
    mean, var, gamma, beta = bn_stats(rng, 5, stat_shape, np.float64)
    # torch's and ONNX's association: gamma * ((y - mean) / sqrt(var + eps)) + beta
    y = b.add(b.multiply(b.constant(gamma), b.divide(b.subtract(y, b.constant(mean)),
                                                    b.sqrt(b.add(b.constant(var), 1e-5)))), b.constant(beta))
    b.output(y)
    opt, _ = check(b.freeze(), {"x": rng.standard_normal((3, 4, 7, 6))})
    assert kinds(opt) == Counter({"conv": 1, "add": 1})


@pytest.mark.parametrize("groups", [1, 2])
def test_conv_transpose_affine(groups: int) -> None:
    rng = np.random.default_rng(2)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 4, 5, 5)), name="x")
    w = b.constant(rng.standard_normal((4, 6 // groups, 3, 3)))    # (C, M // groups, kh, kw)
    y = b.op("conv_transpose", x, w, stride=(2, 2), padding=((1, 1), (1, 1)), output_padding=(1, 1), groups=groups)
    s = rng.standard_normal((6, 1, 1))
    y = b.add(b.multiply(y, b.constant(s)), b.constant(rng.standard_normal((1, 6, 1, 1))))
    b.output(y)
    opt, rep = check(b.freeze(), {"x": rng.standard_normal((2, 4, 5, 5))})
    assert kinds(opt) == Counter({"conv_transpose": 1, "add": 1})
    assert rep.counts.get("fold_scale") == 1 and "fma" not in rep.counts


def test_linear_affine() -> None:
    """x @ W + b, then a per-feature scale and shift (a batch norm over features), as fma too."""
    rng = np.random.default_rng(3)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3, 8)), name="x")
    y = b.add(b.matmul(x, b.constant(rng.standard_normal((8, 5)))), b.constant(rng.standard_normal(5)))
    y = b.op("fma", b.divide(b.subtract(y, b.constant(rng.standard_normal(5))), b.constant(rng.random(5) + 0.5)),
             b.constant(rng.standard_normal((1, 5))), b.constant(rng.standard_normal(5)))
    b.output(y)
    opt, rep = check(b.freeze(), {"x": rng.standard_normal((2, 3, 8))})
    assert kinds(opt) - Counter({"reshape": 2}) == Counter({"matmul": 1, "add": 1})  # layout: one 2-D GEMM
    assert set(rep.counts) >= {"fold_scale", "fold_shift", "fold_fma"}


def test_matmul_weights_on_the_left_and_transposed() -> None:
    rng = np.random.default_rng(4)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 6, 3)), name="x")
    w = b.constant(rng.standard_normal((4, 6)))
    y = b.multiply(b.matmul(w, x), b.constant(rng.standard_normal((4, 1))))       # rows of W @ x
    z = b.op("matmul_t", x, b.constant(rng.standard_normal((5, 3))), transpose_b=True)
    z = b.subtract(b.constant(rng.standard_normal(5)), z)                          # t - x @ V.T: weights negated
    b.output(b.add(b.sum(y), b.sum(z)))
    g = b.freeze()
    rep = optimize(g, report="data")
    feeds = {"x": rng.standard_normal((2, 6, 3))}
    np.testing.assert_allclose(rep.graph.run(feeds)[0], g.run(feeds)[0], rtol=1e-12)
    assert rep.counts.get("fold_scale") == 1 and rep.counts.get("fold_negate") == 1
    assert kinds(rep.graph)["multiply"] == 0 and kinds(rep.graph)["subtract"] == 0


def test_onnx_conv_batch_normalization_folds() -> None:
    """An ONNX Conv + BatchNormalization (imported as arithmetic) folds; compared with onnxruntime on the model."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from opgraph.io.onnx import from_onnx, to_onnx

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("w", rng.standard_normal((8, 3, 3, 3))), ("cb", rng.standard_normal(8)), ("gamma", rng.standard_normal(8)),
        ("beta", rng.standard_normal(8)), ("mean", rng.standard_normal(8)), ("var", rng.random(8) + 0.5)]]
    nodes = [helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["bn"], epsilon=1e-3),
             helper.make_node("Relu", ["bn"], ["y"])]
    graph = helper.make_graph(nodes, "cbr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    g = from_onnx(model)
    opt, _ = check(g, {"x": rng.standard_normal((2, 3, 6, 6)).astype(np.float32)}, rtol=2e-6)
    assert kinds(opt) == Counter({"conv": 1, "add": 1, "relu": 1})
    xv = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(opt.run({"x": xv})[0], sess.run(None, {"x": xv})[0], rtol=1e-5, atol=1e-5)
    assert [n.op_type for n in to_onnx(opt).graph.node] == ["Conv", "Add", "Relu"]
    assert onnx.checker.check_model(to_onnx(opt)) is None


# ---------------------------------------------------------------- where it must not fold
def _conv(b: opgraph.GraphBuilder, rng: np.random.Generator, dtype: str = "float64") -> Any:
    x = b.input((dtype, (1, 2, 5, 5)), name="x")
    return b.op("conv", x, b.constant(rng.standard_normal((3, 2, 3, 3)).astype(dtype)))


def _scale_input(b: opgraph.GraphBuilder, rng: np.random.Generator) -> Any:
    return b.multiply(_conv(b, rng), b.input(("float64", (1, 3, 1, 1)), name="s"))


def _scale_along_width(b: opgraph.GraphBuilder, rng: np.random.Generator) -> Any:
    return b.multiply(_conv(b, rng), b.constant(rng.standard_normal((1, 1, 1, 3))))


def _scale_along_batch(b: opgraph.GraphBuilder, rng: np.random.Generator) -> Any:
    x = b.input(("float64", (2, 2, 5, 5)), name="x")
    y = b.op("conv", x, b.constant(rng.standard_normal((3, 2, 3, 3))))
    return b.multiply(y, b.constant(rng.standard_normal((2, 3, 1, 1))))


def _second_user(b: opgraph.GraphBuilder, rng: np.random.Generator) -> Any:
    y = _conv(b, rng)
    return b.add(b.multiply(y, b.constant(rng.standard_normal((3, 1, 1)))), b.exp(y))


def _biased_second_user(b: opgraph.GraphBuilder, rng: np.random.Generator) -> Any:
    y = b.add(_conv(b, rng), b.constant(rng.standard_normal((3, 1, 1))))
    return b.add(b.multiply(y, b.constant(rng.standard_normal((3, 1, 1)))), b.exp(y))


def _divide_by_zero(b: opgraph.GraphBuilder, rng: np.random.Generator) -> Any:
    return b.divide(_conv(b, rng), b.constant(np.array([1.0, 0.0, 2.0]).reshape(3, 1, 1)))


def _weights_not_constant(b: opgraph.GraphBuilder, rng: np.random.Generator) -> Any:
    x = b.input(("float64", (1, 2, 5, 5)), name="x")
    w = b.input(("float64", (3, 2, 3, 3)), name="w")
    return b.multiply(b.op("conv", x, w), b.constant(rng.standard_normal((3, 1, 1))))


def _integer_matmul(b: opgraph.GraphBuilder, rng: np.random.Generator) -> Any:
    x = b.input(("int64", (2, 4)), name="x")
    return b.add(b.multiply(b.matmul(x, b.constant(rng.integers(-5, 5, (4, 3)))), b.constant(np.array([2, 3, 4]))),
                 b.constant(np.array([1, 1, 1])))


def _float32_conv_float64_scale(b: opgraph.GraphBuilder, rng: np.random.Generator) -> Any:
    return b.multiply(_conv(b, rng, "float32"), b.constant(rng.standard_normal((3, 1, 1))))


@pytest.mark.parametrize("build", [_scale_input, _scale_along_width, _scale_along_batch, _second_user,
                                   _biased_second_user, _divide_by_zero, _weights_not_constant,
                                   _integer_matmul, _float32_conv_float64_scale])
def test_does_not_fold(build: Any) -> None:
    rng = np.random.default_rng(6)
    b = opgraph.GraphBuilder()
    b.output(build(b, rng))
    g = b.freeze()
    assert rewrite(g, FOLD_AFFINE).counts == {}
    rep = optimize(g, report="data")
    assert not [k for k in rep.counts if k.startswith("fold_")]
    feeds = {str(g.name_of(int(v))): np.ones(g.type_of(int(v)).shape, g.type_of(int(v)).dtype) for v in g.inputs}
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(rep.graph.run(feeds)[0], g.run(feeds)[0], rtol=1e-12)


def test_scale_constant_along_other_axes_folds() -> None:
    """A scale of the output's full shape that varies only along the channels is per-channel."""
    rng = np.random.default_rng(7)
    b = opgraph.GraphBuilder()
    y = _conv(b, rng)
    s = np.broadcast_to(rng.standard_normal((1, 3, 1, 1)), (1, 3, 3, 3)).copy()
    b.output(b.multiply(y, b.constant(s)))
    opt, rep = check(b.freeze(), {"x": rng.standard_normal((1, 2, 5, 5))})
    assert rep.counts == {"fold_scale": 1} and kinds(opt) == Counter({"conv": 1})


def test_shared_weight_gets_its_own() -> None:
    """A weight two convs share (CSE merges equal weights): the folded conv gets its own, the other keeps it."""
    rng = np.random.default_rng(10)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (1, 2, 5, 5)), name="x")
    w = b.constant(rng.standard_normal((3, 2, 3, 3)))
    b.output(b.add(b.multiply(b.op("conv", x, w), b.constant(rng.standard_normal((3, 1, 1)))), b.op("conv", x, w,
                                                                                                  stride=(1, 1))))
    opt, rep = check(b.freeze(), {"x": rng.standard_normal((1, 2, 5, 5))})
    assert rep.counts == {"fold_scale": 1} and kinds(opt) == Counter({"conv": 2, "add": 1})


def test_fixed_point_and_input_untouched() -> None:
    rng = np.random.default_rng(8)
    b = opgraph.GraphBuilder()
    y = _conv(b, rng)
    b.output(b.subtract(b.multiply(y, b.constant(rng.standard_normal((3, 1, 1)))), 1.5))
    g = b.freeze()
    text = str(g)
    opt = optimize(g)
    assert str(g) == text
    assert optimize(opt) == opt
    assert rewrite(opt, FOLD_AFFINE).counts == {}


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 4), m_per_group=st.integers(1, 3), groups=st.integers(1, 2),
       k=st.integers(1, 3), size=st.integers(3, 6), stride=st.integers(1, 2), transpose=st.booleans(),
       seed=st.integers(0, 2**16))
def test_random_conv_shapes(n: int, c: int, m_per_group: int, groups: int, k: int, size: int, stride: int,
                            transpose: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cin, m = c * groups, m_per_group * groups
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (n, cin, size, size)), name="x")
    if transpose:
        y = b.op("conv_transpose", x, b.constant(rng.standard_normal((cin, m_per_group, k, k))),
                 stride=(stride, stride), groups=groups)
    else:
        y = b.op("conv", x, b.constant(rng.standard_normal((m, c, k, k))), stride=(stride, stride), groups=groups)
    b.output(batch_norm_builder(b, y, rng, m))
    opt, _ = check(b.freeze(), {"x": rng.standard_normal((n, cin, size, size))}, rtol=1e-11)
    assert sum(kinds(opt)[k] for k in AFFINE) == 1


def batch_norm_builder(b: opgraph.GraphBuilder, y: Any, rng: np.random.Generator, m: int) -> Any:
    mean, var, gamma, beta = bn_stats(rng, m, (1, m, 1, 1), np.float64)
    inv = b.sqrt(b.add(b.constant(var), 1e-5))
    return b.add(b.multiply(b.divide(b.subtract(y, b.constant(mean)), inv), b.constant(gamma)), b.constant(beta))


# numba, the fine-grained engine, runs a conv on NumPy anyway, after minutes of first compilation
@pytest.mark.parametrize("engine", [e for e in opgraph.backends.available() if e != "numba"])
def test_folded_graph_on_every_engine(engine: str) -> None:
    rng = np.random.default_rng(9)
    w = rng.standard_normal((4, 3, 3, 3))
    x = placeholder((2, 3, 6, 6), np.float64, name="x")
    g = nn.relu(batch_norm(nn.conv2d(x, onp.asarray(w)), *bn_stats(rng, 4, (4, 1, 1), np.float64))).graph
    opt = optimize(g)
    assert kinds(opt) == Counter({"conv2d": 1, "add": 1, "relu": 1})
    xv = rng.standard_normal((2, 3, 6, 6))
    got = opgraph.compile(opt, backend=engine)({"x": xv})[0]
    np.testing.assert_allclose(np.asarray(got), g.run({"x": xv})[0], rtol=1e-10, atol=1e-10)
