"""The torch engine's one-kernel rules (gelu, silu, hard_sigmoid, hard_swish, layer_norm, softmax, the pools
through torch.nn.functional) at the edges the op suite's random cases do not reach, against NumPy/SciPy; and
its generated program, which releases each intermediate after its last use."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.special

import opgraph
from opgraph.core.types import TensorType

torch = pytest.importorskip("torch", reason="the torch engine is an optional extra; make test installs it")

from opgraph import backends  # noqa: E402

TOL = {"float16": (2e-3, 2e-3), "float32": (2e-5, 2e-6), "float64": (1e-9, 1e-11)}


def run_torch(kind: str, *arrays: np.ndarray, **attrs: Any) -> np.ndarray:
    """``kind`` on ``arrays`` by the torch engine alone (the op must be claimed: no lowering, no fallback)."""
    b = opgraph.GraphBuilder()
    ins = [b.input(TensorType.of(a)) for a in arrays]
    b.output(b.op(kind, *ins, **attrs))
    tb = backends.get("torch")
    exe = tb.compile_graph(b.freeze())
    (out,) = exe([tb.from_numpy(a) for a in arrays])
    return tb.to_numpy(out)


def close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    rtol, atol = TOL[want.dtype.name]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


# ---------------------------------------------------------------- activations
EDGES = [-np.inf, -30.0, -8.0, -3.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 3.0, 8.0, 30.0, np.inf, np.nan]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_activations_at_the_edges(dtype: str) -> None:
    x = np.array(EDGES, dtype)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        tanh_gelu = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
        refs = {
            ("gelu", "none"): np.where(np.isneginf(x64), 0.0, x64 * scipy.special.ndtr(x64)),
            ("gelu", "tanh"): np.where(np.isneginf(x64), 0.0, tanh_gelu),
            ("silu", None): x64 * scipy.special.expit(x64),
            ("hard_swish", None): x64 * np.clip(x64 + 3, 0, 6) / 6,
        }
    # torch's x * Phi(x) and x * sigmoid(x) give nan at -inf (-inf * 0), as the NumPy kernels' formulas do
    for (kind, approx), want in refs.items():
        attrs = {"approximate": approx} if approx else {}
        got = run_torch(kind, x, **attrs)
        with np.errstate(invalid="ignore", over="ignore"):
            ours = np.asarray(opgraph.compile(_one(kind, x, **attrs), backend="numpy")(x)[0])
        finite = np.isfinite(x64)
        close(got[finite], want[finite].astype(dtype))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ours), err_msg=f"{kind} {approx}: NaNs")
        np.testing.assert_array_equal(got[~finite & ~np.isnan(ours)], ours[~finite & ~np.isnan(ours)])


@pytest.mark.parametrize("alpha, beta", [(0.2, 0.5), (1 / 6, 0.5), (-0.3, 0.1)])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_hard_sigmoid(alpha: float, beta: float, dtype: str) -> None:
    x = np.array([-np.inf, -4.0, -1.0, 0.0, 1.0, 4.0, np.inf, np.nan], dtype)
    want = np.clip(x.astype(np.float64) * alpha + beta, 0, 1).astype(dtype)
    close(run_torch("hard_sigmoid", x, alpha=alpha, beta=beta), want)


def _one(kind: str, *arrays: np.ndarray, **attrs: Any) -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    ins = [b.input(TensorType.of(a)) for a in arrays]
    b.output(b.op(kind, *ins, **attrs))
    return b.freeze()


# ---------------------------------------------------------------- layer_norm
def layer_norm_ref(x: np.ndarray, scale: Any, bias: Any, axis: int, eps: float) -> np.ndarray:
    axes = tuple(range(axis % x.ndim, x.ndim))
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(axis=axes, keepdims=True)
    y = d / np.sqrt((d * d).mean(axis=axes, keepdims=True) + eps)
    if scale is not None:
        y = y * scale.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)
    return y.astype(x.dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("xs, axis, ss, bs", [
    ((2, 3, 4), -1, (4,), (4,)),  # torch's weight and bias
    ((2, 3, 4), 1, (1, 3, 4), (3, 4)),  # leading 1s: still the normalised shape
    ((2, 3, 4), 1, (3, 1), (1, 4)),  # broadcasting within the normalised axes: applied after
    ((2, 3, 4), -1, (2, 1, 4), None),  # a scale varying over a leading axis, no bias
    ((5, 6), 0, None, (6,)),  # a bias alone
])
def test_layer_norm_scale_and_bias_shapes(dtype: str, xs: tuple[int, ...], axis: int, ss: Any, bs: Any) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(xs) * 3 + 1).astype(dtype)
    scale = None if ss is None else rng.standard_normal(ss).astype(dtype)
    bias = None if bs is None else rng.standard_normal(bs).astype(dtype)
    args = [x] if scale is None and bias is None else [x, scale if scale is not None else np.ones(1, dtype)]
    if bias is not None:
        args.append(bias)
    want = layer_norm_ref(x, args[1] if len(args) > 1 else None, bias, axis, 1e-5)
    close(run_torch("layer_norm", *args, axis=axis, epsilon=1e-5), want)


def test_layer_norm_constant_rows() -> None:
    x = np.array([[2.0, 2.0, 2.0], [1.0, 2.0, np.inf]], np.float32)
    got = run_torch("layer_norm", x, axis=-1, epsilon=0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = layer_norm_ref(x, None, None, -1, 0.0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))  # 0 / 0 and inf - inf: NaN in both


# ---------------------------------------------------------------- softmax, log_softmax
def softmax_ref(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    """The op's definition: shift by the max where it is finite (by 0 elsewhere), then normalise."""
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        s = x - np.where(np.isfinite(m), m, 0)
        e = np.exp(s)
        total = np.sum(e, axis=axis, keepdims=True)
        return s - np.log(total) if log else e / total


@pytest.mark.parametrize("log", [False, True])
def test_softmax_rows_with_infinities_and_nan(log: bool) -> None:
    x = np.array([[1.0, 2.0, 3.0, 4.0],
                  [np.inf, 1.0, -np.inf, 2.0],  # max +inf: torch's kernel gives NaNs, the op does not
                  [-np.inf, -np.inf, -np.inf, -np.inf],
                  [np.inf, np.inf, 0.0, 1.0],
                  [np.nan, 1.0, 2.0, 3.0],
                  [-np.inf, 0.0, 1.0, -np.inf]], np.float32)
    kind = "log_softmax" if log else "softmax"
    for axis in (-1, 0):
        got = run_torch(kind, x, axis=axis)
        want = softmax_ref(x, axis, log)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7, equal_nan=True)


def test_softmax_float16_large_logits() -> None:
    x = np.array([[60000.0, 59990.0, -60000.0], [0.0, 1.0, 2.0]], np.float16)
    got = run_torch("softmax", x, axis=-1)
    want = softmax_ref(x.astype(np.float32), -1, False).astype(np.float16)
    close(got, want)


# ---------------------------------------------------------------- pools
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_max_pool_nan_infinities_and_padding(dtype: str) -> None:
    x = np.full((1, 1, 4, 4), -np.inf, dtype)
    x[0, 0, 1, 1] = np.nan
    x[0, 0, 3, 3] = 5.0
    attrs = {"kernel_size": (3, 3), "stride": (2, 2), "padding": ((1, 1), (1, 1))}
    got = run_torch("max_pool", x, **attrs)
    # windows rows/cols {-1..1} and {1..3}: the NaN at (1, 1) is in all four; padding never wins
    np.testing.assert_array_equal(got, np.full((1, 1, 2, 2), np.nan, dtype))
    x[0, 0, 1, 1] = -np.inf
    got = run_torch("max_pool", x, **attrs)
    np.testing.assert_array_equal(got, np.array([[[[-np.inf, -np.inf], [-np.inf, 5.0]]]], dtype))


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool_float16_ceil_and_padding(ceil_mode: bool, count_include_pad: bool) -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, (2, 3, 7, 6)).astype(np.float16)
    attrs = {"kernel_size": (3, 2), "stride": (2, 2), "padding": ((1, 1), (1, 1)), "ceil_mode": ceil_mode,
             "count_include_pad": count_include_pad}
    got = run_torch("avg_pool", x, **attrs)
    want = np.asarray(opgraph.compile(_one("avg_pool", x, **attrs), backend="numpy")(x)[0])
    close(got, want)


# ---------------------------------------------------------------- the generated program
def test_program_releases_intermediates_and_keeps_what_is_read_later() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (4, 6)), name="x")
    e = b.op("exp", x)
    first, _second = b.op("split", e, sections=2, axis=1)  # two results: one read three times, one never
    s = b.op("sin", first)
    t = b.op("multiply", s, first)
    u = b.op("add", b.op("tanh", t), first)
    b.output(u, s, x)
    g = b.freeze()
    f = opgraph.compile(g, backend="torch")
    xv = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    ev = np.exp(xv)
    fv = ev[:, :3]
    sv = np.sin(fv)
    want = [np.tanh(sv * fv) + fv, sv, xv]
    got = f(x=xv)
    for gv, wv in zip(got, want, strict=True):
        close(np.asarray(gv), wv)
    source = backends.get("torch").compile_graph(g).source
    assert "del " in source
    assert source.rstrip().splitlines()[-1].startswith("    return (")


def test_pad_of_nothing() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for pw in (((0, 0), (0, 0)), ((0, 0),), ((1, 0), (0, 2))):
        np.testing.assert_array_equal(run_torch("pad", x, pad_width=pw, constant_value=-1.0),
                                      np.pad(x, pw, constant_values=-1.0))
