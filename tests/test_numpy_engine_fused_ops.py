"""The fused activation and normalisation ops of the NumPy engine: ``silu``, ``hard_sigmoid``, ``hard_swish``,
``layer_norm``.

* kernels against independent references (torch.nn.functional in float64; float32 in ulp or relative error
  as the docs state), with ``out=`` given and in place, on the NumPy passes and on the numba loops;
* the rules as before/expected graphs (the op kinds after ``optimize``) plus numeric agreement with the
  unrewritten graph, and lookalikes the rules must leave alone;
* ONNX import of small torch modules (nn.SiLU, nn.Hardswish, nn.Hardsigmoid, nn.LayerNorm) producing the ops
  and matching torch; ONNX export of the ops;
* gradients against finite differences; lowering, and the backends running the ops (lowered where they lack
  them).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.backends.numpy import elementwise as E
from opgraph.core.graph import Graph
from opgraph.ops import nn as NN
from opgraph.passes import optimize
from opgraph.passes.lower import lower

torch = pytest.importorskip("torch")
F = torch.nn.functional
F32 = np.float32


def kinds(g: Graph) -> list[str]:
    """The op kinds of a graph in order, constants left out."""
    return [k for k in (g.kind_of(i) for i in range(g.num_ops)) if k != "const"]


def agree(g: Graph, h: Graph, feeds: list[np.ndarray], **tol: Any) -> None:
    a = g.run({int(v): x for v, x in zip(g.inputs, feeds, strict=True)})
    b = h.run({int(v): x for v, x in zip(h.inputs, feeds, strict=True)})
    for u, v in zip(a, b, strict=True):
        assert u.dtype == v.dtype and u.shape == v.shape
        np.testing.assert_allclose(u, v, **tol)


def ulp_error(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y - ref| in units of the float32 spacing at ref (ref in float64)."""
    return np.abs(y.astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(F32)).astype(np.float64)


def t64(fn: Callable[..., Any], x: np.ndarray, *args: Any, **kw: Any) -> np.ndarray:
    """A torch function evaluated in float64 (the reference)."""
    return fn(torch.from_numpy(np.asarray(x, np.float64)), *args, **kw).numpy()  # type: ignore[no-any-return]



def sweep() -> np.ndarray:
    """float32 inputs: a dense [-12, 12], the tails to +-110 (sigmoid's exp overflows past 88), tiny magnitudes,
    and a fine grid around hard_swish's kinks at -3 and 3."""
    return np.concatenate([
        np.linspace(-12, 12, 400_001), np.linspace(-110, 110, 20_001),
        np.geomspace(1e-30, 1, 10_000), -np.geomspace(1e-30, 1, 10_000),
        np.linspace(-3.01, -2.99, 10_001), np.linspace(2.99, 3.01, 10_001),
    ]).astype(F32)


# ---------------------------------------------------------------- kernels
def test_silu_float32_within_5_ulp(path: str) -> None:
    x = sweep()
    y, ref = E.silu(x), t64(F.silu, x)
    normal = x >= -87
    assert ulp_error(y[normal], ref[normal]).max() <= 5
    # below x = -87 sigmoid(x) is subnormal: an absolute bound (torch's float32 x / (1 + exp(-x)) gives -0.0
    # below -88.7)
    assert np.abs(y[~normal] - ref[~normal]).max() <= 3e-43


def test_hard_swish_float32_within_3_ulp(path: str) -> None:
    x = sweep()
    y = E.hard_swish(x)
    ref = t64(F.hardswish, x)
    nz = ref != 0
    assert ulp_error(y[nz], ref[nz]).max() <= 3
    assert np.all(y[~nz] == 0)
    # torch's own float32 kernel computes the same formula: at most one ulp apart
    assert ulp_error(y[nz], F.hardswish(torch.from_numpy(x)).numpy()[nz].astype(np.float64)).max() <= 1


@pytest.mark.parametrize(("alpha", "beta"), [(0.2, 0.5), (1 / 6, 0.5), (-0.5, 0.25)])
def test_hard_sigmoid_matches_formula(alpha: float, beta: float) -> None:
    x = sweep()
    want = np.clip(x.astype(np.float64) * alpha + beta, 0, 1)
    np.testing.assert_allclose(E.hard_sigmoid(x, alpha=alpha, beta=beta), want, rtol=2e-7, atol=1e-7)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(E.hard_sigmoid(x64, alpha=alpha, beta=beta), want, rtol=1e-15, atol=1e-16)
    if alpha == 1 / 6:
        np.testing.assert_allclose(E.hard_sigmoid(x64, alpha=alpha, beta=beta), t64(F.hardsigmoid, x64),
                                   rtol=1e-15, atol=1e-16)


@pytest.mark.parametrize(("fn", "ref"), [(E.silu, F.silu), (E.hard_swish, F.hardswish)])
def test_float64_and_float16(fn: Callable[..., Any], ref: Callable[..., Any]) -> None:
    x = np.concatenate([np.linspace(-50, 50, 10_001), [-800.0, 800.0, 0.0, -0.0]])
    np.testing.assert_allclose(fn(x), t64(ref, x), rtol=1e-15, atol=1e-300)
    h = np.linspace(-8, 8, 2001).astype(np.float16)
    y = fn(h)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y, t64(ref, h).astype(np.float16), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("fn", [E.silu, E.hard_swish, lambda x, out=None: E.hard_sigmoid(x, out)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_out_and_in_place(fn: Callable[..., Any], dtype: str, path: str) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(100_003) * 6).astype(dtype)  # several blocks and a partial one
    want = fn(x.copy())
    out = np.empty_like(x)
    assert fn(x, out=out) is out
    np.testing.assert_array_equal(out, want)
    y = x.copy()
    assert fn(y, out=y) is y
    np.testing.assert_array_equal(y, want)
    strided = np.empty((2, x.size), dtype)[0]  # a non-contiguous out (a row of a 2-D array is contiguous)
    col = np.empty((x.size, 2), dtype)[:, 0]
    for o in (strided, col):
        assert fn(x, out=o) is o
        np.testing.assert_array_equal(o, want)


def test_special_values() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 100.0, -100.0], F32)
    ref = np.array([np.nan, np.inf, np.nan, 0.0, -0.0, 100.0, -100.0 / (1 + np.exp(100.0))])
    np.testing.assert_allclose(E.silu(x), ref.astype(F32), rtol=1e-6, atol=1e-43)
    np.testing.assert_array_equal(E.hard_swish(x), F.hardswish(torch.from_numpy(x)).numpy())
    assert np.isnan(E.hard_sigmoid(x)[0])


def ln_ref(x: np.ndarray, shape: tuple[int, ...], w: Any = None, b: Any = None, eps: float = 1e-5) -> np.ndarray:
    t = lambda v: None if v is None else torch.from_numpy(np.asarray(v, np.float64))  # noqa: E731
    return F.layer_norm(t(x), shape, t(w), t(b), eps).numpy()  # type: ignore[no-any-return]


LN_CASES = [((3136, 96), 1), ((197, 768), 1), ((2, 5, 7, 16), 2), ((4, 3, 8), 3), ((6, 5000), 1), ((1, 9), 1)]


@pytest.mark.parametrize(("shape", "k"), LN_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_norm_matches_torch(shape: tuple[int, ...], k: int, dtype: str, path: str) -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 3 + 5).astype(dtype)
    norm = shape[-k:]
    w, b = rng.standard_normal(norm).astype(dtype), rng.standard_normal(norm).astype(dtype)
    tol = {"rtol": 2e-5, "atol": 2e-5} if dtype == "float32" else {"rtol": 1e-12, "atol": 1e-12}
    axis = len(shape) - k
    np.testing.assert_allclose(NN.layer_norm(x, w, b, axis=axis), ln_ref(x, norm, w, b), **tol)
    np.testing.assert_allclose(NN.layer_norm(x, axis=axis, epsilon=1e-3), ln_ref(x, norm, eps=1e-3), **tol)
    np.testing.assert_allclose(NN.layer_norm(x, w, axis=axis), ln_ref(x, norm, w), **tol)
    out = np.empty_like(x)
    assert NN.layer_norm(x, w, b, out=out, axis=axis) is out
    np.testing.assert_allclose(out, ln_ref(x, norm, w, b), **tol)
    y = x.copy()
    assert NN.layer_norm(y, w, b, out=y, axis=axis) is y
    np.testing.assert_array_equal(y, out)


def test_layer_norm_general_paths() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6, 5))
    xt = np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)  # non-contiguous input
    w, b = rng.standard_normal(5), rng.standard_normal(5)
    want = ln_ref(x, (5,), w, b)
    np.testing.assert_allclose(NN.layer_norm(xt, w, b), want, rtol=1e-12, atol=1e-12)
    out = np.empty((5, 6, 4)).transpose(2, 1, 0)  # non-contiguous out
    assert NN.layer_norm(x, w, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    # a scale varying along a leading axis: not one row for every row, so the general path
    w2 = rng.standard_normal((4, 1, 5))
    np.testing.assert_allclose(NN.layer_norm(x, w2, b), ln_ref(x, (5,)) * w2 + b, rtol=1e-12, atol=1e-12)
    h = x.astype(np.float16)
    got = NN.layer_norm(h, w.astype(np.float16), b.astype(np.float16))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, ln_ref(h, (5,), w.astype(np.float16), b.astype(np.float16)), rtol=3e-3, atol=3e-3)
    assert NN.layer_norm(np.zeros((0, 5), F32)).shape == (0, 5)


def test_layer_norm_types() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (2, 3, 4)))
    assert b.op("layer_norm", x, b.input(("float32", (3, 4))), axis=1).type == x.type
    with pytest.raises(opgraph.GraphError, match="dtype"):
        b.op("layer_norm", x, b.input(("float64", (4,))))
    with pytest.raises(opgraph.GraphError, match="broadcast"):
        b.op("layer_norm", x, b.input(("float32", (3,))))
    with pytest.raises(opgraph.GraphError, match="floating"):
        b.op("layer_norm", b.input(("int32", (2, 3))))
    with pytest.raises(opgraph.GraphError, match="out of bounds"):
        b.op("layer_norm", x, axis=3)
    with pytest.raises(opgraph.GraphError, match="floating"):
        b.op("silu", b.input(("int64", (3,))))


@pytest.mark.parametrize("shape", [(1, 16, 64, 64), (1, 40, 14, 14), (1, 96, 1, 1), (64, 768)])
def test_compiled_program_paths(shape: tuple[int, ...], path: str) -> None:
    """The compiled program calls each op's specialised form (whole-array passes, or the compiled loops, in
    place or not): the same results as the kernels."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(shape) * 4).astype(F32)
    w, c = (rng.standard_normal(shape[-1:]).astype(F32) for _ in range(2))
    builds = {
        "silu": (lambda b, v: b.op("silu", v), lambda a: E.silu(a)),
        "hard_swish": (lambda b, v: b.op("hard_swish", v), lambda a: E.hard_swish(a)),
        "hard_sigmoid": (lambda b, v: b.op("hard_sigmoid", v, alpha=0.25, beta=0.4),
                         lambda a: E.hard_sigmoid(a, alpha=0.25, beta=0.4)),
        "layer_norm": (lambda b, v: b.op("layer_norm", v, b.constant(w), b.constant(c)),
                       lambda a: ln_ref(a, shape[-1:], w, c).astype(F32)),
    }
    for name, (build, ref) in builds.items():
        b = opgraph.GraphBuilder()
        v = b.input(("float32", shape), name="x")
        h = b.negative(v)
        y = build(b, h)  # in place on h's buffer
        b.output(b.negative(y), b.add(build(b, v), v))  # not in place: x is still needed
        fn = opgraph.compile(b.freeze(), backend="numpy")
        got1, got2 = fn(x=x)
        tol = {"rtol": 2e-5, "atol": 2e-5} if name == "layer_norm" else {"rtol": 1e-6, "atol": 1e-30}
        np.testing.assert_allclose(-got1, ref(-x), **tol, err_msg=name)
        np.testing.assert_allclose(got2 - x, ref(x), **{**tol, "atol": 1e-5}, err_msg=name)


# ---------------------------------------------------------------- rules
def _h(b: opgraph.GraphBuilder, shape: tuple[int, ...] = (4, 8)) -> Any:
    """An activation input computed by ops of its own (a linear layer), as in a model."""
    x = b.input(("float32", shape), name="x")
    w = b.input(("float32", (shape[-1], shape[-1])), name="w")
    return b.add(b.op("matmul", x, w), x)


def _c(b: opgraph.GraphBuilder, v: Any) -> Any:
    return b.constant(np.asarray(v, F32))


def _feeds(shape: tuple[int, ...] = (4, 8)) -> list[np.ndarray]:
    rng = np.random.default_rng(9)
    return [(rng.standard_normal(shape) * 3).astype(F32), rng.standard_normal((shape[-1], shape[-1])).astype(F32)]


def _clip(b: opgraph.GraphBuilder, v: Any, lo: float, hi: float) -> Any:
    return b.op("clip", v, _c(b, lo), _c(b, hi))


PATTERNS: dict[str, tuple[Callable[[opgraph.GraphBuilder, Any], Any], list[str]]] = {
    "silu": (lambda b, h: b.multiply(h, b.op("sigmoid", h)), ["silu"]),
    "silu_swapped": (lambda b, h: b.multiply(b.op("sigmoid", h), h), ["silu"]),
    # the pre-op importer's HardSwish: x * clip(x * (1/6) + 0.5, 0, 1) (the fma rule sees the line first)
    "hard_swish_line": (lambda b, h: b.multiply(h, _clip(b, b.add(b.multiply(h, _c(b, 1 / 6)), _c(b, 0.5)), 0, 1)),
                        ["hard_swish"]),
    "hard_swish_div": (lambda b, h: b.multiply(_clip(b, b.add(b.divide(h, _c(b, 6)), _c(b, 0.5)), 0, 1), h),
                       ["hard_swish"]),
    # torch's formula written out: x * relu6(x + 3) / 6 and * (1/6)
    "hard_swish_relu6": (lambda b, h: b.divide(b.multiply(h, _clip(b, b.add(h, _c(b, 3)), 0, 6)), _c(b, 6)),
                         ["hard_swish"]),
    "hard_swish_relu6_mul": (lambda b, h: b.multiply(_c(b, 1 / 6), b.multiply(_clip(b, b.add(_c(b, 3), h), 0, 6), h)),
                             ["hard_swish"]),
    "hard_sigmoid": (lambda b, h: _clip(b, b.add(b.multiply(_c(b, 0.2), h), _c(b, 0.5)), 0, 1), ["hard_sigmoid"]),
}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_activation_rules_before_expected(name: str) -> None:
    pattern, after = PATTERNS[name]
    b = opgraph.GraphBuilder()
    b.output(pattern(b, _h(b)))
    g = b.freeze()
    rep = optimize(g, report="data")
    assert kinds(rep.graph) == ["matmul", "add", *after], rep.counts
    agree(g, rep.graph, _feeds(), rtol=1e-6, atol=1e-6)


LOOKALIKES: list[Callable[[opgraph.GraphBuilder, Any], Any]] = [
    lambda b, h: b.multiply(h, b.op("sigmoid", b.negative(h))),  # sigmoid of another value
    lambda b, h: b.multiply(h, _clip(b, b.add(b.multiply(h, _c(b, 0.2)), _c(b, 0.5)), 0, 1)),  # slope 0.2: not 1/6
    lambda b, h: b.divide(b.multiply(h, _clip(b, b.add(h, _c(b, 3)), 0, 6)), _c(b, 5)),  # / 5
    lambda b, h: b.divide(b.multiply(h, _clip(b, b.add(h, _c(b, 2)), 0, 6)), _c(b, 6)),  # x + 2
    lambda b, h: _clip(b, b.add(b.multiply(_c(b, 0.2), h), _c(b, 0.5)), 0, 2),  # clip to [0, 2]
]


@pytest.mark.parametrize("i", range(len(LOOKALIKES)))
def test_activation_rules_decline_lookalikes(i: int) -> None:
    b = opgraph.GraphBuilder()
    b.output(LOOKALIKES[i](b, _h(b)))
    g = optimize(b.freeze())
    assert not {"silu", "hard_swish"} & set(kinds(g))
    assert "hard_sigmoid" not in kinds(g) or i == 1  # i == 1: clip(0.2 x + 0.5) is a hard sigmoid, not a swish


def test_silu_rule_needs_single_use_sigmoid() -> None:
    b = opgraph.GraphBuilder()
    h = _h(b)
    s = b.op("sigmoid", h)
    b.output(b.multiply(h, s), s)
    assert "silu" not in kinds(optimize(b.freeze()))


def _ln_decomposed(b: opgraph.GraphBuilder, h: Any, axes: tuple[int, ...], *, rsqrt: bool = False,
                   pow2: bool = True, affine: bool = True) -> Any:
    """torch.onnx.export's LayerNorm before opset 17 (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul,
    Add), or ONNX's function body with Reciprocal and Mul."""
    d = b.subtract(h, b.mean(h, axis=axes, keepdims=True))
    sq = b.power(d, _c(b, 2)) if pow2 else b.multiply(d, d)
    den = b.sqrt(b.add(b.mean(sq, axis=axes, keepdims=True), _c(b, 1e-5)))
    y = b.multiply(d, b.op("reciprocal", den)) if rsqrt else b.divide(d, den)
    if affine:
        n = h.type.shape[-1]
        y = b.add(b.multiply(y, _c(b, np.linspace(0.5, 1.5, n))), _c(b, np.linspace(-1, 1, n)))
    return y


@pytest.mark.parametrize("variant", [{}, {"rsqrt": True}, {"pow2": False}, {"affine": False}])
def test_layer_norm_rule_before_expected(variant: dict[str, bool]) -> None:
    b = opgraph.GraphBuilder()
    b.output(_ln_decomposed(b, _h(b, (2, 6, 8)), (2,), **variant))
    g = b.freeze()
    rep = optimize(g, report="data")
    assert kinds(rep.graph)[-1] == "layer_norm", rep.counts
    assert not {"mean", "subtract", "square", "sqrt", "divide"} & set(kinds(rep.graph))
    (op,) = [i for i in range(rep.graph.num_ops) if rep.graph.kind_of(i) == "layer_norm"]
    assert rep.graph.attrs_of(op)["axis"] == 2 and rep.graph.attrs_of(op)["epsilon"] == pytest.approx(1e-5)
    agree(g, rep.graph, _feeds((2, 6, 8)), rtol=2e-5, atol=2e-5)


def test_layer_norm_rule_declines_lookalikes() -> None:
    for build in (
        lambda b, h: _ln_decomposed(b, h, (1,)),  # a middle axis: not trailing
        lambda b, h: b.divide(b.subtract(h, b.mean(h, axis=(2,), keepdims=True)),  # variance of another value
                              b.sqrt(b.add(b.mean(b.square(h), axis=(2,), keepdims=True), _c(b, 1e-5)))),
    ):
        b = opgraph.GraphBuilder()
        b.output(build(b, _h(b, (2, 6, 8))))
        assert "layer_norm" not in kinds(optimize(b.freeze()))
    b = opgraph.GraphBuilder()  # the centred value also an output: the rule would have to keep it
    h = _h(b, (2, 6, 8))
    d = b.subtract(h, b.mean(h, axis=(2,), keepdims=True))
    b.output(b.divide(d, b.sqrt(b.add(b.mean(b.square(d), axis=(2,), keepdims=True), _c(b, 1e-5)))), d)
    assert "layer_norm" not in kinds(optimize(b.freeze()))


# ---------------------------------------------------------------- ONNX import and export
def _export(module: Any, x: Any, opset: int) -> Graph:
    from opgraph.io.onnx import from_onnx

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), f, opset_version=opset, dynamo=False)
    return from_onnx(f.getvalue())


MODULES = [
    (lambda: torch.nn.SiLU(), (2, 8, 5, 5), "silu"),
    (lambda: torch.nn.Hardswish(), (2, 8, 5, 5), "hard_swish"),
    (lambda: torch.nn.Hardsigmoid(), (2, 8), "hard_sigmoid"),
    (lambda: torch.nn.LayerNorm(16), (2, 7, 16), "layer_norm"),
    (lambda: torch.nn.LayerNorm((7, 16)), (2, 7, 16), "layer_norm"),
]


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("i", range(len(MODULES)))
def test_onnx_import_of_torch_modules(i: int, opset: int) -> None:
    pytest.importorskip("onnx")
    make, shape, op = MODULES[i]
    torch.manual_seed(0)
    module = make().eval()
    if isinstance(module, torch.nn.LayerNorm):
        with torch.no_grad():  # not the identity affine of a fresh module
            module.weight.copy_(torch.randn(module.weight.shape))
            module.bias.copy_(torch.randn(module.bias.shape))
    x = torch.randn(*shape) * 4
    g = optimize(_export(module, x, opset))
    assert kinds(g) == [op]
    (got,) = opgraph.compile(g, backend="numpy")({int(g.inputs[0]): x.numpy()})
    np.testing.assert_allclose(got, module(x).detach().numpy(), rtol=1e-5, atol=2e-6)


def test_onnx_layer_normalization_extra_outputs() -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from opgraph.io.onnx import from_onnx

    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "m", "r"], axis=1, epsilon=1e-3)
    vi = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(
        [node], "g", [vi("x", TensorProto.FLOAT, [3, 4, 5]), vi("s", TensorProto.FLOAT, [4, 5]),
                      vi("b", TensorProto.FLOAT, [4, 5])],
        [vi("y", TensorProto.FLOAT, [3, 4, 5]), vi("m", TensorProto.FLOAT, [3, 1, 1]),
         vi("r", TensorProto.FLOAT, [3, 1, 1])]), opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    g = from_onnx(model)
    assert "layer_norm" in kinds(g)
    rng = np.random.default_rng(5)
    x, s, b = (rng.standard_normal(sh).astype(F32) for sh in ((3, 4, 5), (4, 5), (4, 5)))
    y, m, r = g.run({int(v): a for v, a in zip(g.inputs, (x, s, b), strict=True)})
    np.testing.assert_allclose(y, ln_ref(x, (4, 5), s, b, 1e-3), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m, x.mean(axis=(1, 2), keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r, 1 / np.sqrt(x.var(axis=(1, 2), keepdims=True) + 1e-3), rtol=1e-5)


def fused_ops_graph(dtype: str = "float32") -> Graph:
    b = opgraph.GraphBuilder()
    x = b.input((dtype, (6, 7)), name="x")
    s = b.input((dtype, (7,)), name="s")
    bias = b.input((dtype, (7,)), name="b")
    b.output(b.op("silu", x), b.op("hard_swish", x), b.op("hard_sigmoid", x, alpha=0.25, beta=0.4),
             b.op("layer_norm", x, s, bias, epsilon=1e-4), b.op("layer_norm", x))
    return b.freeze()


def _fused_feeds(dtype: str = "float32") -> list[np.ndarray]:
    rng = np.random.default_rng(6)
    return [(rng.standard_normal(sh) * 4).astype(dtype) for sh in ((6, 7), (7,), (7,))]


def test_onnx_export_round_trip() -> None:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from opgraph.io.onnx import from_onnx, to_onnx

    g = fused_ops_graph()
    model = to_onnx(g)
    onnx.checker.check_model(model, full_check=True)
    ops = {n.op_type for n in model.graph.node}
    # hard_swish: NumPy's x * (x + 3) / 6 by default (it overflows where ONNX's HardSwish does not)
    assert {"HardSigmoid", "LayerNormalization", "Sigmoid"} <= ops and "HardSwish" not in ops
    assert "HardSwish" in {n.op_type for n in to_onnx(g, nan_semantics="onnx").graph.node}
    feeds = _fused_feeds()
    want = g.run({int(v): a for v, a in zip(g.inputs, feeds, strict=True)})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, dict(zip(["x", "s", "b"], feeds, strict=True)))
    for u, v in zip(got, want, strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5)
    assert {"silu", "hard_sigmoid", "layer_norm"} <= set(kinds(optimize(from_onnx(model))))
    back = from_onnx(to_onnx(g, nan_semantics="onnx"))  # ONNX's own operators come back as the fused kinds
    assert {"silu", "hard_swish", "hard_sigmoid", "layer_norm"} <= set(kinds(optimize(back)))


# ---------------------------------------------------------------- gradients, lowering, backends
GRAD_CASES: list[tuple[str, Callable[[opgraph.GraphBuilder, Any, Any], Any], tuple[int, ...]]] = [
    ("silu", lambda b, x, p: b.op("silu", x), (40,)),
    ("hard_swish", lambda b, x, p: b.op("hard_swish", x), (40,)),
    ("hard_sigmoid", lambda b, x, p: b.op("hard_sigmoid", x, alpha=0.3, beta=0.4), (40,)),
    ("layer_norm", lambda b, x, p: b.op("layer_norm", x, p[0], p[1], axis=1, epsilon=1e-3), (4, 3, 5)),
    ("layer_norm_plain", lambda b, x, p: b.op("layer_norm", x), (4, 6)),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradient_finite_differences(case: Any) -> None:
    from opgraph.autodiff import build_grad_ops

    _, build, shape = case
    rng = np.random.default_rng(3)
    a = rng.standard_normal(shape) * 4
    a[np.abs(np.abs(a) - 3) < 1e-3] += 0.01  # away from hard_swish's kinks
    w = rng.standard_normal(shape)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", shape), name="x")
    params = [b.input(("float64", shape[1:]), name=n) for n in ("s", "c")]
    pv = [rng.standard_normal(shape[1:]) for _ in params]
    y = build(b, x, params)
    loss = b.sum(b.multiply(y, b.constant(w)))
    wrt = [x, *params] if case[0] == "layer_norm" else [x]
    grads = b.run({x: a, params[0]: pv[0], params[1]: pv[1]}, [build_grad_ops(b, loss, v) for v in wrt])
    vals = [a, *pv]
    eps = 1e-6
    for k, g in enumerate(grads):
        fd = np.zeros(vals[k].size)
        for j in range(vals[k].size):
            for sgn in (1, -1):
                vs = [v.copy() for v in vals]
                vs[k].reshape(-1)[j] += sgn * eps
                (lv,) = b.run({x: vs[0], params[0]: vs[1], params[1]: vs[2]}, [loss])
                fd[j] += sgn * float(lv) / (2 * eps)
        np.testing.assert_allclose(np.asarray(g).reshape(-1), fd, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_lowering(dtype: str) -> None:
    g = fused_ops_graph(dtype)
    fused = {"silu", "hard_swish", "hard_sigmoid", "layer_norm"}
    low = lower(g, lambda op: op.kind not in fused)
    assert not fused & set(kinds(low.graph))
    assert low.counts == {"lower.silu": 1, "lower.hard_swish": 1, "lower.hard_sigmoid": 1, "lower.layer_norm": 2}
    tol = {"float16": 4e-3, "float32": 3e-6, "float64": 1e-13}[dtype]
    agree(g, low.graph, _fused_feeds(dtype), rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_backends_run_the_ops(backend: str) -> None:
    if backend != "numpy":
        pytest.importorskip(backend)
    g = fused_ops_graph()
    feeds = _fused_feeds()
    want = g.run({int(v): a for v, a in zip(g.inputs, feeds, strict=True)})
    got = opgraph.compile(g, backend=backend)(x=feeds[0], s=feeds[1], b=feeds[2])
    for u, v in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(u), v, rtol=1e-5, atol=1e-5)
