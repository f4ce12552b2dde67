"""The NumPy engine's fast kernels and the rewrites the profiles asked for (issue 14).

* float32 ``erf``, ``sigmoid`` and ``gelu`` kernels against float64 references (SciPy), in ulp, on dense
  sweeps with the tails, special values, ``out=`` (aliasing the input, non-contiguous), both the NumPy and
  the numba path;
* the N-D @ 2-D matmul kernel against ``np.matmul``;
* the rules ``power_*``, ``matmul_nd_2d`` and ``gelu`` as before/expected graphs (the op kinds after the
  rule) plus numeric agreement with the unrewritten graph, the gelu patterns of ONNX import and of
  ``torch.onnx.export``, gelu's gradient against finite differences, and the backends running a graph with
  a ``gelu`` op (lowered where they lack it).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import scipy.special as sp

import opgraph
from opgraph.backends.numpy import elementwise as E
from opgraph.backends.numpy.jit import NUMBA_MIN
from opgraph.core.graph import Graph
from opgraph.ops.contraction import _matmul_kernel
from opgraph.passes import optimize
from opgraph.passes.lower import lower

F32 = np.float32


def ulp_error(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y - ref| in units of the float32 spacing at ref (ref in float64)."""
    y64 = y.astype(np.float64)
    ulp = np.spacing(np.abs(ref).astype(F32)).astype(np.float64)
    return np.abs(y64 - ref) / ulp


def sweep() -> np.ndarray:
    """A dense float32 sweep: [-12, 12] every ~6e-6, the tails out to +-110, tiny magnitudes down to 1e-38."""
    return np.concatenate([
        np.linspace(-12, 12, 4_000_001), np.linspace(-110, 110, 200_001),
        np.geomspace(1e-38, 1, 100_000), -np.geomspace(1e-38, 1, 100_000),
    ]).astype(F32)



# ---------------------------------------------------------------- erf, sigmoid, gelu kernels
def test_erf_float32_within_4_ulp(path: str) -> None:
    x = sweep()
    assert x.size >= NUMBA_MIN
    err = ulp_error(E.erf(x), sp.erf(x.astype(np.float64)))
    assert err.max() <= 4.0, (err.max(), x[err.argmax()])


def test_sigmoid_float32_within_4_ulp(path: str) -> None:
    x = sweep()
    err = ulp_error(E.sigmoid(x), sp.expit(x.astype(np.float64)))
    assert err.max() <= 4.0, (err.max(), x[err.argmax()])
    # the slow-path blocks (inputs above 88, where exp(x) overflows) are in the sweep: check them on their own
    big = np.linspace(80, 110, 50_001).astype(F32)
    assert ulp_error(E.sigmoid(big), sp.expit(big.astype(np.float64))).max() <= 4.0


def test_gelu_float32_error_as_documented(path: str) -> None:
    x = sweep()
    xd = x.astype(np.float64)
    y = E.gelu(x).astype(np.float64)
    ref = xd * sp.ndtr(xd)
    m = x >= -1
    assert ulp_error(y[m], ref[m]).max() <= 5.0
    # below -1, as in the erf formula torch and ONNX use, 1 + erf cancels: an absolute bound relative to |x|
    assert (np.abs(y - ref)[~m] / np.abs(xd[~m])).max() <= 1e-7
    # the tanh form is torch's formula, evaluated in float32
    yt = E.gelu(x, approximate="tanh").astype(np.float64)
    reft = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3)))
    assert ulp_error(yt[m], reft[m]).max() <= 5.0
    assert (np.abs(yt - reft)[~m] / np.abs(xd[~m])).max() <= 1e-7


def test_gelu_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(100_000).astype(F32) * 3
    for approx in ("none", "tanh"):
        want = torch.nn.functional.gelu(torch.from_numpy(x), approximate=approx).numpy()
        # both cancel in 1 + erf (or 1 + tanh) for negative x: an error bound relative to |x| there
        err = np.abs(E.gelu(x, approximate=approx).astype(np.float64) - want)
        assert np.all(err <= 2e-6 * np.abs(want) + 5e-7 * np.abs(x)), approx


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38], F32)


@pytest.mark.parametrize("fn, ref", [
    (E.erf, lambda x: sp.erf(x.astype(np.float64))),
    (E.sigmoid, lambda x: sp.expit(x.astype(np.float64))),
    (E.gelu, lambda x: x * sp.ndtr(x.astype(np.float64))),  # gelu(-inf) is nan, as in torch's formula
])
def test_special_values(fn: Callable[..., np.ndarray], ref: Callable[[np.ndarray], np.ndarray], path: str) -> None:
    for n in (SPECIALS.size, NUMBA_MIN + 3):  # small arrays (NumPy passes) and large ones (numba, if on)
        x = np.resize(SPECIALS, n)
        with np.errstate(invalid="ignore"):
            want = ref(x).astype(F32)
        got = fn(x)
        assert got.dtype == F32
        np.testing.assert_array_equal(got, want)  # nan where nan; +-inf, +-1, 0 exactly
        num = ~np.isnan(want)  # a nan's sign is unspecified
        assert np.array_equal(np.signbit(got[num]), np.signbit(want[num]))  # -0.0 stays -0.0


@pytest.mark.parametrize("fn", [E.erf, E.sigmoid, E.gelu])
def test_out_aliasing_and_layouts(fn: Callable[..., np.ndarray], path: str) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 70_001)) * 4).astype(F32)  # several blocks, a ragged last one
    want = fn(x.copy())
    buf = x.copy()
    assert fn(buf, out=buf) is buf  # in place: each block is read before it is written
    np.testing.assert_array_equal(buf, want)
    out = np.empty((70_001, 3), F32).T  # a non-contiguous out
    assert fn(x, out=out) is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(fn(x.T), want.T)  # non-contiguous input
    np.testing.assert_array_equal(fn(x[:, ::2]), want[:, ::2])
    assert fn(np.float32(0.5) * np.ones((), F32)).shape == ()
    assert fn(np.empty((0, 3), F32)).shape == (0, 3)


def test_float64_and_other_dtypes_keep_scipy() -> None:
    x = np.random.default_rng(2).standard_normal(1000) * 5
    np.testing.assert_array_equal(E.erf(x), sp.erf(x))
    np.testing.assert_array_equal(E.sigmoid(x), sp.expit(x))
    np.testing.assert_array_equal(E.gelu(x), x * sp.ndtr(x))
    z = x + 1j * x[::-1]
    np.testing.assert_array_equal(E.erf(z), sp.erf(z))
    h = x.astype(np.float16)
    assert E.gelu(h).dtype == np.float16
    np.testing.assert_allclose(E.gelu(h), h * sp.ndtr(h.astype(np.float64)), rtol=2e-3, atol=1e-4)


def test_ops_use_the_fast_kernels_and_keep_their_types() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (1000,)), name="x")
    ys = [b.op("erf", x), b.op("sigmoid", x), b.op("gelu", x), b.op("gelu", x, approximate="tanh")]
    assert all(y.type == x.type for y in ys)
    a = np.linspace(-6, 6, 1000).astype(F32)
    got = b.run({x: a}, ys)
    for g, fn in zip(got, [E.erf, E.sigmoid, E.gelu, lambda v: E.gelu(v, approximate="tanh")], strict=True):
        np.testing.assert_array_equal(g, fn(a))
    with pytest.raises(opgraph.errors.OpBuildError, match="floating"):
        b.op("gelu", b.input(("int32", (3,))))
    with pytest.raises(Exception, match="approximate"):
        b.op("gelu", x, approximate="fast")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_gradient_finite_differences(approximate: str) -> None:
    from opgraph.autodiff import build_grad_ops

    rng = np.random.default_rng(3)
    a = rng.standard_normal(40) * 3
    w = rng.standard_normal(40)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (40,)), name="x")
    loss = b.sum(b.multiply(b.op("gelu", x, approximate=approximate), b.constant(w)))
    (g,) = b.run({x: a}, [build_grad_ops(b, loss, x)])
    eps = 1e-6
    fd = np.array([(float(b.run({x: a + eps * e}, [loss])[0]) - float(b.run({x: a - eps * e}, [loss])[0])) / (2 * eps)
                   for e in np.eye(40)])
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------- matmul kernel
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_matmul_kernel_nd_by_2d(dtype: str) -> None:
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((5, 3, 7)) * 4).astype(dtype)
    w = (rng.standard_normal((7, 6)) * 4).astype(dtype)
    want = np.matmul(a, w)
    tol: dict[str, Any] = {"rtol": 1e-5 if dtype == "float32" else 1e-12}
    np.testing.assert_allclose(_matmul_kernel(a, w), want, **tol)
    out = np.empty((5, 3, 6), dtype)
    assert _matmul_kernel(a, w, out=out) is out
    np.testing.assert_allclose(out, want, **tol)
    out_t = np.empty((6, 3, 5), dtype).T  # non-contiguous out: computed then copied
    assert _matmul_kernel(a, w, out=out_t) is out_t
    np.testing.assert_allclose(out_t, want, **tol)
    at = np.ascontiguousarray(a.transpose(1, 0, 2)).transpose(1, 0, 2)  # non-contiguous a: NumPy's own path
    np.testing.assert_allclose(_matmul_kernel(at, w), want, **tol)
    assert _matmul_kernel(np.zeros((0, 3, 7), dtype), w).shape == (0, 3, 6)
    with pytest.raises(ValueError):
        _matmul_kernel(a, w[:5])


# ---------------------------------------------------------------- rules: before / expected
def kinds(g: Graph) -> list[str]:
    """The op kinds of a graph in order, constants left out."""
    return [k for k in (g.kind_of(i) for i in range(g.num_ops)) if k != "const"]


def agree(g: Graph, h: Graph, feeds: list[np.ndarray], **tol: Any) -> None:
    with np.errstate(all="ignore"):
        a = g.run({int(v): x for v, x in zip(g.inputs, feeds, strict=True)})
        b = h.run({int(v): x for v, x in zip(h.inputs, feeds, strict=True)})
    for u, v in zip(a, b, strict=True):
        assert u.dtype == v.dtype and u.shape == v.shape
        if tol:
            np.testing.assert_allclose(u, v, **tol)
        else:
            np.testing.assert_array_equal(u, v)


def power_graph(dtype: str, c: float) -> Graph:
    b = opgraph.GraphBuilder()
    x = b.input((dtype, (4, 5)), name="x")
    b.output(b.power(x, b.constant(np.asarray(c, dtype))))
    return b.freeze()


POWER_CASES = [  # exponent, rule, op kinds after, bitwise equal to np.power
    (2.0, "power_square", ["square"], True),
    (-1.0, "power_reciprocal", ["reciprocal"], True),
    (0.0, "power_zero", [], True),
    (3.0, "power_small_int", ["square", "multiply"], False),
    (4.0, "power_small_int", ["square", "square"], False),
    (-2.0, "power_small_int", ["square", "reciprocal"], False),
    (-3.0, "power_small_int", ["square", "multiply", "reciprocal"], False),
    (-4.0, "power_small_int", ["square", "square", "reciprocal"], False),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("c, rule, after, bitwise", POWER_CASES)
def test_power_small_int(dtype: str, c: float, rule: str, after: list[str], bitwise: bool) -> None:
    g = power_graph(dtype, c)
    rep = optimize(g, report="data")
    assert rep.counts.get(rule) == 1, rep.counts
    assert kinds(rep.graph) == after
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 5)) * 3).astype(dtype)
    x[0, :5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    if bitwise:
        agree(g, rep.graph, [x])  # nan, inf and signed zeros included
    else:
        # normal values: within 2 roundings of pow's (2 ulp); special values: the same results
        agree(g, rep.graph, [np.where(np.isfinite(x) & (x != 0), x, 1.5).astype(dtype)], rtol=3 * np.finfo(dtype).eps)
        with np.errstate(all="ignore"):
            want = np.power(x[0], np.asarray(c, dtype))
        got = rep.graph.run({int(rep.graph.inputs[0]): x})[0][0]
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want))


def test_power_rules_on_integers_and_limits() -> None:
    g = power_graph("int64", 3)
    rep = optimize(g, report="data")
    assert kinds(rep.graph) == ["square", "multiply"]
    x = np.arange(-10, 10).reshape(4, 5)
    agree(g, rep.graph, [x])  # exact, overflow wrapping included
    agree(g, rep.graph, [x * 10**6])
    for dtype, c in (("int64", -1), ("int64", -2), ("float64", 5.0), ("float64", 2.5), ("float64", 0.5)):
        g = power_graph(dtype, c)
        assert optimize(g) == g, (dtype, c)  # no negative integer powers; |c| <= 4; 0.5 needs fast_math
    g = power_graph("float64", 0.5)
    rep = optimize(g, report="data", fast_math=True)
    assert rep.counts.get("power_half") == 1 and kinds(rep.graph) == ["sqrt"]
    agree(g, rep.graph, [np.abs(np.random.default_rng(6).standard_normal((4, 5)))])


def test_power_three_is_fast_and_close_on_the_gpt2_array() -> None:
    x = np.random.default_rng(7).standard_normal((2, 97, 300)).astype(F32) * 3
    with np.errstate(all="ignore"):
        err = ulp_error(x * x * x, np.power(x.astype(np.float64), 3))
    assert err.max() <= 2.0


def matmul_graph(sa: tuple[int, ...], sb: tuple[int, ...], dtype: str = "float32") -> Graph:
    b = opgraph.GraphBuilder()
    a, w = b.input((dtype, sa), name="a"), b.input((dtype, sb), name="w")
    b.output(b.op("matmul", a, w))
    return b.freeze()


def test_matmul_nd_2d_rule() -> None:
    g = matmul_graph((5, 2, 4, 8), (8, 3))
    rep = optimize(g, report="data")
    assert rep.counts == {"matmul_nd_2d": 1}
    assert kinds(rep.graph) == ["reshape", "matmul", "reshape"]
    shapes = [rep.graph.type_of(int(v)).shape for v in rep.graph.outputs]
    assert shapes == [(5, 2, 4, 3)]
    rng = np.random.default_rng(8)
    agree(g, rep.graph, [rng.standard_normal((5, 2, 4, 8)).astype(F32), rng.standard_normal((8, 3)).astype(F32)],
          rtol=1e-5, atol=1e-6)
    gi = matmul_graph((3, 2, 4), (4, 5), "int64")
    agree(gi, optimize(gi), [rng.integers(-9, 9, (3, 2, 4)), rng.integers(-9, 9, (4, 5))])
    for sa, sb in (((4, 8), (8, 3)), ((2, 4, 8), (2, 8, 3)), ((4, 8), (2, 8, 3)), ((2, 4, 8), (8,))):
        g = matmul_graph(sa, sb)
        assert optimize(g) == g, (sa, sb)


# ---------------------------------------------------------------- rules: gelu patterns
def _h(b: opgraph.GraphBuilder) -> Any:
    """A gelu input computed by ops of its own (a linear layer), as in a model."""
    x = b.input(("float32", (4, 8)), name="x")
    w = b.input(("float32", (8, 8)), name="w")
    return b.add(b.op("matmul", x, w), x)


def _c(b: opgraph.GraphBuilder, v: float) -> Any:
    return b.constant(np.asarray(v, F32))


GELU_PATTERNS: dict[str, tuple[Callable[[opgraph.GraphBuilder, Any], Any], str]] = {
    # opgraph.io.onnx's translation of ONNX's Gelu node
    "onnx_gelu": (lambda b, h: b.multiply(b.multiply(_c(b, 0.5), h), b.add(_c(b, 1), b.op(
        "erf", b.multiply(h, _c(b, 1 / np.sqrt(2)))))), "none"),
    # torch.onnx.export of nn.GELU(): Div, Erf, Add, Mul, Mul
    "torch_export": (lambda b, h: b.multiply(b.multiply(h, b.add(b.op("erf", b.divide(h, _c(b, np.sqrt(2)))),
                                                                  _c(b, 1))), _c(b, 0.5)), "none"),
    # HuggingFace's gelu: x * 0.5 * (1.0 + erf(x / sqrt(2.0)))
    "hf": (lambda b, h: b.multiply(b.multiply(h, _c(b, 0.5)), b.add(_c(b, 1), b.op(
        "erf", b.divide(h, _c(b, np.sqrt(2)))))), "none"),
    # GPT-2's gelu: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3))))
    "gpt2": (lambda b, h: b.multiply(b.multiply(_c(b, 0.5), h), b.add(_c(b, 1), b.tanh(b.multiply(
        _c(b, np.sqrt(2 / np.pi)), b.add(h, b.multiply(_c(b, 0.044715), b.power(h, _c(b, 3)))))))), "tanh"),
    # opgraph.io.onnx's translation of Gelu(approximate="tanh")
    "onnx_gelu_tanh": (lambda b, h: b.multiply(b.multiply(_c(b, 0.5), h), b.add(_c(b, 1), b.tanh(b.multiply(
        _c(b, np.sqrt(2 / np.pi)), b.multiply(h, b.add(_c(b, 1), b.multiply(_c(b, 0.044715),
                                                                            b.multiply(h, h)))))))), "tanh"),
}


def gelu_graph(pattern: Callable[[opgraph.GraphBuilder, Any], Any]) -> Graph:
    b = opgraph.GraphBuilder()
    b.output(pattern(b, _h(b)))
    return b.freeze()


def gelu_feeds() -> list[np.ndarray]:
    rng = np.random.default_rng(9)
    return [rng.standard_normal((4, 8)).astype(F32), rng.standard_normal((8, 8)).astype(F32) / 2]


@pytest.mark.parametrize("name", list(GELU_PATTERNS))
def test_gelu_rule_before_expected(name: str) -> None:
    pattern, approx = GELU_PATTERNS[name]
    g = gelu_graph(pattern)
    rep = optimize(g, report="data")
    assert rep.counts.get("gelu") == 1, rep.counts
    assert kinds(rep.graph) == ["matmul", "add", "gelu"]
    (gop,) = [i for i in range(rep.graph.num_ops) if rep.graph.kind_of(i) == "gelu"]
    assert rep.graph.attrs_of(gop)["approximate"] == approx
    agree(g, rep.graph, gelu_feeds(), rtol=1e-5, atol=1e-6)


def test_gelu_rule_declines_lookalikes() -> None:
    near_misses = [
        # 0.7 is not 1/sqrt(2)
        lambda b, h: b.multiply(b.multiply(_c(b, 0.5), h), b.add(_c(b, 1), b.op("erf", b.multiply(h, _c(b, 0.7))))),
        # 0.25 x (1 + erf(...)) is not gelu
        lambda b, h: b.multiply(b.multiply(_c(b, 0.25), h), b.add(_c(b, 1), b.op(
            "erf", b.multiply(h, _c(b, 1 / np.sqrt(2)))))),
        # erf of another value
        lambda b, h: b.multiply(b.multiply(_c(b, 0.5), h), b.add(_c(b, 1), b.op(
            "erf", b.multiply(b.input(("float32", (4, 8))), _c(b, 1 / np.sqrt(2)))))),
    ]
    for pattern in near_misses:
        rep = optimize(gelu_graph(pattern), report="data")
        assert "gelu" not in rep.counts


def test_gelu_rule_needs_single_use_intermediates() -> None:
    b = opgraph.GraphBuilder()
    h = _h(b)
    e = b.op("erf", b.multiply(h, _c(b, 1 / np.sqrt(2))))
    b.output(b.multiply(b.multiply(_c(b, 0.5), h), b.add(_c(b, 1), e)), e)  # erf is also an output
    assert "gelu" not in optimize(b.freeze(), report="data").counts


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_from_onnx_gelu_node(approximate: str) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from opgraph.io.onnx import from_onnx

    node = helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])]), opset_imports=[helper.make_opsetid("", 20)])
    onnx.checker.check_model(model)
    g = from_onnx(model)
    rep = optimize(g, report="data")
    assert kinds(rep.graph) == ["gelu"]
    x = np.linspace(-4, 4, 15).astype(F32).reshape(3, 5)
    agree(g, rep.graph, [x], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_from_torch_onnx_export(approximate: str) -> None:
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    from opgraph.io.onnx import from_onnx

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 16)

        def forward(self, x: Any) -> Any:
            return torch.nn.functional.gelu(self.fc(x), approximate=approximate)

    torch.manual_seed(0)
    model = Mlp().eval()
    f = io.BytesIO()
    x = torch.randn(4, 8)
    torch.onnx.export(model, (x,), f, dynamo=False, opset_version=17)
    g = from_onnx(onnx.load_from_string(f.getvalue()))
    rep = optimize(g, report="data")
    assert rep.counts.get("gelu") == 1 and "gelu" in kinds(rep.graph), rep.counts
    assert not {"erf", "tanh"} & set(kinds(rep.graph))
    want = model(x).detach().numpy()
    (got,) = rep.graph.run({int(rep.graph.inputs[0]): x.numpy()})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- lowering and backends
def gelu_op_graph(approximate: str, dtype: str = "float32") -> Graph:
    b = opgraph.GraphBuilder()
    x = b.input((dtype, (6, 7)), name="x")
    b.output(b.op("gelu", b.multiply(x, x), approximate=approximate), b.op("erf", x), b.op("sigmoid", x))
    return b.freeze()


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_lowering_gelu(approximate: str, dtype: str) -> None:
    g = gelu_op_graph(approximate, dtype)
    low = lower(g, lambda op: op.kind != "gelu")
    assert low.counts == {"lower.gelu": 1}
    assert "gelu" not in kinds(low.graph)
    x = np.linspace(-3, 3, 42).reshape(6, 7).astype(dtype)
    tol = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-14}[dtype]
    agree(g, low.graph, [x], rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_backends_run_gelu(backend: str, approximate: str) -> None:
    if backend != "numpy":
        pytest.importorskip(backend)
    g = gelu_op_graph(approximate)
    x = np.linspace(-4, 4, 42).reshape(6, 7).astype(F32)
    want = g.run({int(g.inputs[0]): x})
    got = opgraph.compile(g, backend=backend)(x=x)
    for u, v in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(u), v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(), (1,), (5,)])
def test_fma_into_the_buffer_of_its_addend(shape: tuple[int, ...]) -> None:
    """fma(a, b, c) where c dies at the fma: the arena may give the result c's buffer (in place, position 2);
    the product must not overwrite c before it is added. A 0-d c (a summed gradient, as in a training step of a
    scalar parameter) once lost its value there."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, *shape)), name="x")
    v = b.input(("float64", shape), name="v")
    c = b.op("sum", x, axis=0)  # computed here, dies at the fma
    b.output(b.op("fma", v, 0.5, c))
    g = b.freeze()
    rng = np.random.default_rng(3)
    xa, va = rng.standard_normal((2, *shape)), rng.standard_normal(shape)
    want = va * 0.5 + xa.sum(axis=0)
    np.testing.assert_allclose(opgraph.compile(g)(x=xa, v=va)[0], want, rtol=1e-15)
    np.testing.assert_allclose(g.run(x=xa, v=va)[0], want, rtol=1e-15)
