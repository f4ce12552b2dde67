"""The NumPy engine's convolution kernel (``opgraph.backends.numpy.nn.conv_nd``, behind both ``conv2d`` and ``conv``).

Every case is compared with ``torch.nn.functional.conv{1,2,3}d`` computed in
float64 (asymmetric padding through ``F.pad``): groups 1, 2, depthwise and
depthwise with multiplier 2, 1x1 kernels, strides, dilations, batch 1 and
more, float32 and float64, ``out=`` given, non-contiguous inputs; and the two
op kinds give identical results through a compiled graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opgraph
from opcheck import noncontiguous
from opgraph.backends.numpy import BACKEND as NUMPY
from opgraph.backends.numpy.nn import conv_nd

torch = pytest.importorskip("torch")
F = torch.nn.functional


def torch_conv(x: np.ndarray, w: np.ndarray, stride: tuple[int, ...], padding: tuple[tuple[int, int], ...],
               dilation: tuple[int, ...], groups: int) -> np.ndarray:
    """The reference: torch's convolution in float64 after explicit zero padding."""
    xt = torch.from_numpy(np.asarray(x, np.float64))
    flat = [p for pair in reversed(padding) for p in pair]  # F.pad takes the last axis first
    xt = F.pad(xt, flat)
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(stride)]
    return fn(xt, torch.from_numpy(np.asarray(w, np.float64)), stride=stride, dilation=dilation,
              groups=groups).numpy()


def tol(dtype: Any) -> dict[str, float]:
    return {"rtol": 2e-4, "atol": 2e-4} if np.dtype(dtype) == np.float32 else {"rtol": 1e-10, "atol": 1e-10}


GROUPINGS = ("dense", "groups2", "depthwise", "depthwise_x2")


def channels(grouping: str, c: int, m: int) -> tuple[int, int, int]:
    """(input channels, output channels, groups) for a grouping kind."""
    if grouping == "dense":
        return c, m, 1
    if grouping == "groups2":
        return 2 * c, 2 * m, 2
    if grouping == "depthwise":
        return c, c, c
    return c, 2 * c, c


@st.composite
def conv_cases(draw: Any, nsp: int) -> dict[str, Any]:
    grouping = draw(st.sampled_from(GROUPINGS))
    c, m, groups = channels(grouping, draw(st.integers(1, 4)), draw(st.integers(1, 5)))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(nsp))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nsp))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nsp))
    padding = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(nsp))
    sizes = []
    for k, d, (pb, pe) in zip(kernel, dilation, padding, strict=True):
        span = d * (k - 1) + 1
        sizes.append(draw(st.integers(max(1, span - pb - pe), span + (6 if nsp < 3 else 3))))
    return {"n": draw(st.integers(1, 3)), "c": c, "m": m, "groups": groups, "kernel": kernel, "stride": stride,
            "dilation": dilation, "padding": padding, "sizes": tuple(sizes),
            "dtype": draw(st.sampled_from([np.float32, np.float64])), "with_out": draw(st.booleans()),
            "strided_x": draw(st.booleans()), "seed": draw(st.integers(0, 2**31))}


def check_case(case: dict[str, Any]) -> None:
    rng = np.random.default_rng(case["seed"])
    dt = case["dtype"]
    x = rng.standard_normal((case["n"], case["c"], *case["sizes"])).astype(dt)
    w = rng.standard_normal((case["m"], case["c"] // case["groups"], *case["kernel"])).astype(dt)
    if case["strided_x"]:
        x = noncontiguous(x)
        assert x.size <= 1 or not x.flags.c_contiguous
    geo = {k: case[k] for k in ("stride", "padding", "dilation", "groups")}
    want = torch_conv(x, w, **geo)
    out = np.full(want.shape, np.nan, dt) if case["with_out"] else None
    got = conv_nd(x, w, out, **geo)
    if out is not None:
        assert got is out
    assert got.dtype == dt and got.shape == want.shape
    np.testing.assert_allclose(got, want, **tol(dt))
    # The conv op kind (ONNX Conv) runs the same kernel.
    conv = NUMPY.kernel_for("conv", 1)
    np.testing.assert_array_equal(conv(x, w, **geo), got)


@settings(max_examples=150, deadline=None)
@given(conv_cases(2))
def test_conv2d_matches_torch(case: dict[str, Any]) -> None:
    check_case(case)


@settings(max_examples=60, deadline=None)
@given(conv_cases(1))
def test_conv1d_matches_torch(case: dict[str, Any]) -> None:
    check_case(case)


@settings(max_examples=40, deadline=None)
@given(conv_cases(3))
def test_conv3d_matches_torch(case: dict[str, Any]) -> None:
    check_case(case)


# Shapes of the paths the kernel distinguishes, at realistic sizes: 1x1 (a plain GEMM), stride-2 3x3,
# depthwise 3x3 / 5x5 (multiply-adds, several channel blocks), grouped, and a batch bigger than one
# im2col chunk.
SHAPES = [
    ((2, 96, 14, 14), (24, 96, 1, 1), (1, 1), ((0, 0), (0, 0)), 1),
    ((1, 32, 28, 28), (64, 32, 1, 1), (2, 2), ((0, 0), (0, 0)), 1),
    ((2, 16, 33, 31), (32, 16, 3, 3), (2, 2), ((1, 1), (1, 1)), 1),
    ((1, 96, 56, 56), (96, 1, 3, 3), (1, 1), ((1, 1), (1, 1)), 96),
    ((2, 40, 28, 28), (40, 1, 5, 5), (2, 2), ((2, 2), (2, 2)), 40),
    ((1, 24, 20, 20), (48, 1, 3, 3), (1, 1), ((0, 1), (1, 0)), 24),
    ((2, 32, 16, 16), (64, 4, 3, 3), (1, 1), ((1, 1), (1, 1)), 8),
    ((40, 3, 32, 32), (32, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), 1),
    ((1, 8, 1, 1), (8, 8, 3, 3), (1, 1), ((1, 1), (1, 1)), 1),
]


@pytest.mark.parametrize("xs, ws, stride, padding, groups", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_paths_match_torch(xs: tuple[int, ...], ws: tuple[int, ...], stride: tuple[int, int],
                           padding: tuple[tuple[int, int], ...], groups: int, dtype: Any) -> None:
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    geo = {"stride": stride, "padding": padding, "dilation": (1, 1), "groups": groups}
    want = torch_conv(x, w, **geo)
    np.testing.assert_allclose(conv_nd(x, w, **geo), want, **tol(dtype))
    out = np.empty(want.shape, dtype)
    assert conv_nd(x, w, out, **geo) is out
    np.testing.assert_allclose(out, want, **tol(dtype))


def test_float16_and_out_of_another_dtype() -> None:
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 4, 9, 9)), rng.standard_normal((6, 2, 3, 3))
    geo = {"stride": (1, 2), "padding": ((1, 0), (2, 1)), "dilation": (2, 1), "groups": 2}
    want = torch_conv(x, w, **geo)
    got16 = conv_nd(x.astype(np.float16), w.astype(np.float16), **geo)
    assert got16.dtype == np.float16
    np.testing.assert_allclose(got16, want, rtol=2e-2, atol=5e-2)
    out = np.empty(want.shape, np.float32)  # a float64 result cast into a float32 buffer
    assert conv_nd(x, w, out, **geo) is out
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("groups", [1, 2, 8])
def test_conv2d_and_conv_ops_agree(groups: int) -> None:
    """conv2d (PyTorch-style attributes, also unbatched) and conv (ONNX-style) give identical results."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 8, 12, 10)).astype(np.float32)
    w = rng.standard_normal((16, 8 // groups, 3, 2)).astype(np.float32)
    b = opgraph.GraphBuilder()
    xv, wv = b.input(("float32", x.shape), name="x"), b.input(("float32", w.shape), name="w")
    b.output(b.op("conv2d", xv, wv, stride=(2, 1), padding=(1, 2, 0, 1), dilation=(1, 2), groups=groups))
    b.output(b.op("conv", xv, wv, stride=(2, 1), padding=((1, 2), (0, 1)), dilation=(1, 2), groups=groups))
    a, c = opgraph.compile(b.freeze())(x=x, w=w)
    np.testing.assert_array_equal(a, c)
    np.testing.assert_allclose(a, torch_conv(x, w, (2, 1), ((1, 2), (0, 1)), (1, 2), groups), rtol=1e-4, atol=1e-4)
    k2d = NUMPY.kernel_for("conv2d", 1)
    unbatched = k2d(x[1], w, stride=(2, 1), padding=(1, 2, 0, 1), dilation=(1, 2), groups=groups)
    np.testing.assert_array_equal(unbatched, a[1])


@pytest.mark.parametrize("budget, min_columns", [(1, 1), (3000, 1), (1 << 14, 64)])
@pytest.mark.parametrize("xs, ws, stride, padding, groups", [
    *SHAPES,
    ((2, 8, 19, 17), (6, 4, 3, 3), (2, 1), ((2, 0), (1, 1)), 2),
    ((1, 4, 9, 7, 6), (4, 4, 2, 3, 2), (1, 2, 1), ((1, 0), (0, 1), (1, 1)), 1),
    ((2, 3, 15), (6, 1, 4), (3,), ((2, 1),), 3),
])
def test_chunking_does_not_change_results(monkeypatch: pytest.MonkeyPatch, budget: int, min_columns: int,
                                          xs: tuple[int, ...], ws: tuple[int, ...], stride: tuple[int, ...],
                                          padding: tuple[tuple[int, int], ...], groups: int) -> None:
    """Small column budgets force the other chunkings: one sample, blocks of groups, bands of rows."""
    from opgraph.backends.numpy import nn

    monkeypatch.setattr(nn, "_COLS_BYTES", budget)
    monkeypatch.setattr(nn, "_MIN_GEMM_COLUMNS", min_columns)
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    geo = {"stride": stride, "padding": padding, "dilation": (1,) * len(stride), "groups": groups}
    np.testing.assert_allclose(conv_nd(x, w, **geo), torch_conv(x, w, **geo), **tol(np.float64))


@pytest.mark.parametrize("budget", [1 << 12, 1 << 16, 1 << 22])
@pytest.mark.parametrize("xs, ws, stride, padding", [
    ((5, 3, 12, 12), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1))),
    ((3, 4, 11, 9), (6, 4, 2, 3), (2, 1), ((0, 2), (1, 0))),
    ((4, 2, 10), (3, 2, 3), (2,), ((1, 1),)),
])
def test_threaded_blas_layout(monkeypatch: pytest.MonkeyPatch, budget: int, xs: tuple[int, ...],
                              ws: tuple[int, ...], stride: tuple[int, ...],
                              padding: tuple[tuple[int, int], ...]) -> None:
    """With a threaded BLAS, dense convolutions put several samples in one product; same results."""
    from opgraph.backends.numpy import nn

    monkeypatch.setattr(nn, "_blas_threads", lambda: 2)
    monkeypatch.setattr(nn, "_WIDE_COLS_BYTES", budget)
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    geo = {"stride": stride, "padding": padding, "dilation": (1,) * len(stride), "groups": 1}
    out = np.empty((xs[0], ws[0], *conv_nd(x[:1], w, **geo).shape[2:]))
    assert conv_nd(noncontiguous(x), w, out, **geo) is out
    np.testing.assert_allclose(out, torch_conv(x, w, **geo), **tol(np.float64))
