"""Tests of the nn ops: relu, softmax, log_softmax, conv2d, max_pool2d, avg_pool2d.

conv2d and the pools are checked against references written here (a direct
loop over output positions), and against PyTorch when it is installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

from opcheck import check_op, out_type, rand, run_op
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType
from opgraph.errors import OpBuildError


def tol(dtype: Any) -> dict[str, float]:
    dt = np.dtype(dtype)
    if dt == np.float16:
        return {"rtol": 1e-2, "atol": 2e-2}
    if dt == np.float32:
        return {"rtol": 1e-4, "atol": 1e-4}
    return {"rtol": 1e-10, "atol": 1e-10}


# ---------------------------------------------------------------- references
def pads4(padding: Any) -> tuple[int, int, int, int]:
    p = (padding, padding) if isinstance(padding, int) else tuple(padding)
    return (p[0], p[0], p[1], p[1]) if len(p) == 2 else p  # type: ignore[return-value]


def conv2d_ref(x: np.ndarray, w: np.ndarray, stride: Any = (1, 1), padding: Any = (0, 0),
               dilation: Any = (1, 1), groups: int = 1) -> np.ndarray:
    """Direct convolution: a loop over output positions, computed in float64."""
    dtype = np.result_type(x, w)
    unbatched = x.ndim == 3
    x = x[None] if unbatched else x
    top, bottom, left, right = pads4(padding)
    (sh, sw), (dh, dw) = stride, dilation
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + top + bottom, wd + left + right))
    xp[:, :, top:top + h, left:left + wd] = x
    ho = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    res = np.zeros((n, o, ho, wo))
    for i in range(ho):
        for j in range(wo):
            patch = xp[:, :, i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
            for g in range(groups):
                res[:, g * og:(g + 1) * og, i, j] = np.einsum(
                    "nckl,ockl->no", patch[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og].astype(np.float64))
    return (res[0] if unbatched else res).astype(dtype)


def pool_ref(x: np.ndarray, kernel_size: Any, stride: Any = None, padding: Any = (0, 0), *, mode: str,
             count_include_pad: bool = True) -> np.ndarray:
    """Direct max / average pooling over the last two axes: a loop over output positions."""
    kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
    sh, sw = (kh, kw) if stride is None else (stride, stride) if isinstance(stride, int) else stride
    top, bottom, left, right = pads4(padding)
    h, wd = x.shape[-2:]
    shape = (*x.shape[:-2], h + top + bottom, wd + left + right)
    if mode == "max":
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        xp = np.full(shape, fill, dtype=x.dtype)
    else:
        xp = np.zeros(shape)
    xp[..., top:top + h, left:left + wd] = x
    inside = np.zeros(shape[-2:])
    inside[top:top + h, left:left + wd] = 1
    ho, wo = (shape[-2] - kh) // sh + 1, (shape[-1] - kw) // sw + 1
    res = np.zeros((*x.shape[:-2], ho, wo), dtype=xp.dtype)
    for i in range(ho):
        for j in range(wo):
            window = xp[..., i * sh:i * sh + kh, j * sw:j * sw + kw]
            if mode == "max":
                res[..., i, j] = window.max(axis=(-2, -1))
            else:
                count = kh * kw if count_include_pad else inside[i * sh:i * sh + kh, j * sw:j * sw + kw].sum()
                res[..., i, j] = window.sum(axis=(-2, -1)) / count
    return res.astype(x.dtype)


# ---------------------------------------------------------------- relu
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int64", "uint8"])
def test_relu(rng: np.random.Generator, dtype: str) -> None:
    x = rand(rng, (3, 5), dtype)
    check_op("relu", [x], lambda x: np.maximum(x, np.zeros((), x.dtype)))
    assert get_op("relu").elementwise


def test_relu_nan_and_signed_zero() -> None:
    x = np.array([np.nan, -np.inf, -1.0, -0.0, 0.0, 2.5, np.inf])
    (got,) = run_op("relu", x)
    np.testing.assert_array_equal(got, [np.nan, 0, 0, 0, 0, 2.5, np.inf])


@pytest.mark.parametrize("dtype", ["bool", "complex128"])
def test_relu_rejects(dtype: str) -> None:
    with pytest.raises(OpBuildError, match="relu needs an integer or floating dtype"):
        out_type("relu", TensorType(dtype, (3,)))


# ---------------------------------------------------------------- softmax, log_softmax
@pytest.mark.parametrize("kind, ref", [("softmax", scipy.special.softmax),
                                       ("log_softmax", scipy.special.log_softmax)])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape, axis", [((7,), -1), ((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1), ((0, 4), -1),
                                         ((2, 3, 4), -3)])
def test_softmax(rng: np.random.Generator, kind: str, ref: Any, dtype: str, shape: tuple[int, ...],
                 axis: int) -> None:
    x = rand(rng, shape, dtype, -20, 20)
    check_op(kind, [x], lambda x: ref(x, axis=axis), axis=axis, **tol(dtype))


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_is_stable(kind: str) -> None:
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -np.inf, -999.0], [0.0, 0.0, 0.0]], np.float32)
    ref = scipy.special.softmax if kind == "softmax" else scipy.special.log_softmax
    (got,) = run_op(kind, x)
    assert np.isfinite(got[got != -np.inf]).all()
    np.testing.assert_allclose(got, ref(x, axis=-1), rtol=1e-6)
    if kind == "softmax":
        np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_empty_axis(kind: str) -> None:
    x = np.zeros((3, 0), np.float64)
    check_op(kind, [x], lambda x: x.copy(), axis=1)


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_types(kind: str) -> None:
    assert out_type(kind, TensorType("float32", (None, 10))) == TensorType("float32", (None, 10))
    assert out_type(kind, TensorType("float64", None), axis=5) == TensorType("float64", None)
    for dtype in ("int32", "bool", "complex128"):
        with pytest.raises(OpBuildError, match="floating dtype"):
            out_type(kind, TensorType(dtype, (3,)))
    with pytest.raises(OpBuildError, match="axis 2 is out of bounds for rank 2"):
        out_type(kind, TensorType("float32", (3, 4)), axis=2)
    with pytest.raises(OpBuildError, match="out of bounds for rank 0"):
        out_type(kind, TensorType("float32", ()))


# ---------------------------------------------------------------- conv2d
CONV_CASES = [
    # x shape, w shape, attrs
    ((2, 3, 7, 6), (4, 3, 3, 3), {}),
    ((2, 3, 7, 6), (4, 3, 3, 3), {"stride": 2}),
    ((2, 3, 7, 6), (4, 3, 3, 2), {"stride": (2, 1), "padding": (1, 2)}),
    ((1, 2, 6, 6), (3, 2, 2, 3), {"padding": (0, 2, 1, 0)}),
    ((2, 3, 9, 8), (2, 3, 3, 2), {"dilation": (2, 3), "padding": 1}),
    ((2, 4, 6, 5), (6, 2, 3, 3), {"groups": 2, "padding": 1}),
    ((2, 4, 6, 5), (8, 1, 3, 3), {"groups": 4, "stride": 2, "padding": (1, 1)}),  # depthwise, multiplier 2
    ((3, 4, 6, 6), (4, 1, 2, 2), {"groups": 4, "dilation": 2}),  # depthwise
    ((0, 3, 5, 5), (4, 3, 3, 3), {"padding": 1}),  # empty batch
    ((3, 5, 5), (4, 3, 3, 3), {"stride": 2}),  # unbatched (C, H, W)
    ((2, 3, 4, 4), (5, 3, 1, 1), {}),  # 1x1
    ((1, 2, 3, 3), (2, 2, 3, 3), {}),  # kernel covers the input
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("xs, ws, attrs", CONV_CASES)
def test_conv2d(rng: np.random.Generator, dtype: str, xs: tuple[int, ...], ws: tuple[int, ...],
                attrs: dict[str, Any]) -> None:
    if "groups" not in attrs and xs[-3] != ws[1]:
        xs = (*xs[:-3], ws[1], *xs[-2:])
    x, w = rand(rng, xs, dtype), rand(rng, ws, dtype)
    ref_attrs = {k: (v, v) if isinstance(v, int) and k != "groups" else v for k, v in attrs.items()}
    check_op("conv2d", [x, w], lambda x, w: conv2d_ref(x, w, **ref_attrs), **tol(dtype), **attrs)


def test_conv2d_dtypes(rng: np.random.Generator) -> None:
    x, w = rand(rng, (2, 3, 5, 5), np.float32), rand(rng, (4, 3, 3, 3), np.float64)
    check_op("conv2d", [x, w], conv2d_ref, **tol("float64"))
    x16, w16 = rand(rng, (2, 3, 5, 5), np.float16, -1, 1), rand(rng, (4, 3, 3, 3), np.float16, -1, 1)
    check_op("conv2d", [x16, w16], lambda x, w: conv2d_ref(x, w, padding=(1, 1)), **tol("float16"), padding=1)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_conv2d_random(data: st.DataObject) -> None:
    draw = data.draw
    groups = draw(st.integers(1, 3))
    cg, og = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = tuple(draw(st.lists(st.integers(0, 2), min_size=4, max_size=4)))
    h = dilation[0] * (kh - 1) + 1 + draw(st.integers(0, 4)) - padding[0] - padding[1]
    wd = dilation[1] * (kw - 1) + 1 + draw(st.integers(0, 4)) - padding[2] - padding[3]
    n = draw(st.integers(0, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((n, cg * groups, max(h, 1), max(wd, 1)))
    w = rng.standard_normal((og * groups, cg, kh, kw))
    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    if h < 1 or wd < 1:  # the padded input may still fit the kernel
        try:
            ref = conv2d_ref(x, w, **attrs)
        except ValueError:
            return
        if ref.shape[-1] < 1 or ref.shape[-2] < 1:
            return
    check_op("conv2d", [x, w], lambda x, w: conv2d_ref(x, w, **attrs), rtol=1e-10, atol=1e-10, **attrs)


def test_conv2d_types() -> None:
    f32 = "float32"
    assert out_type("conv2d", TensorType(f32, (None, 3, 32, 32)), TensorType(f32, (8, 3, 3, 3)),
                    stride=2, padding=1) == TensorType(f32, (None, 8, 16, 16))
    assert out_type("conv2d", TensorType(f32, (4, None, None, 20)), TensorType(f32, (8, 1, 5, 5)),
                    groups=2, dilation=2) == TensorType(f32, (4, 8, None, 12))
    assert out_type("conv2d", TensorType(f32, (4, 3, 9, 9)), TensorType(f32, None)) == \
        TensorType(f32, (4, None, None, None))
    assert out_type("conv2d", TensorType(f32, None), TensorType(f32, (8, 3, 3, 3))) == TensorType(f32, None)
    assert out_type("conv2d", TensorType(f32, (3, 9, 9)), TensorType("float64", (2, 3, 3, 3))) == \
        TensorType("float64", (2, 7, 7))
    # Equal attributes have one normalised spelling.
    attrs = get_op("conv2d").normalise_attrs({"stride": 2, "padding": (1, 1, 0, 0)})
    assert dict(attrs) == {"stride": (2, 2), "padding": (1, 0), "dilation": (1, 1), "groups": 1}


@pytest.mark.parametrize("xs, ws, attrs, match", [
    ((2, 3, 8, 8), (4, 2, 3, 3), {}, "w expects 2 input channels"),
    ((2, 4, 8, 8), (4, 1, 3, 3), {"groups": 2}, "w expects 2 input channels"),
    ((2, 3, 8, 8), (4, 1, 3, 3), {"groups": 2}, "in channels 3 are not divisible by groups=2"),
    ((2, 4, 8, 8), (3, 2, 3, 3), {"groups": 2}, "out channels 3 are not divisible"),
    ((3, 8), (4, 3, 3, 3), {}, r"x must be \(N, C, H, W\) or \(C, H, W\), got rank 2"),
    ((3, 8, 8), (4, 3, 3), {}, "w must be"),
    ((2, 3, 4, 4), (4, 3, 5, 3), {}, "kernel size 5 .* larger than the padded input size 4"),
    ((2, 3, 4, 4), (4, 3, 3, 3), {"dilation": 2}, r"dilated: 5\) is larger"),
    ((2, 3, 4, 4), (4, 3, 0, 3), {}, "kernel size must be >= 1"),
    ((2, 3, 8, 8), (4, 3, 3, 3), {"stride": 0}, "stride=0: .*must be >= 1"),
    ((2, 3, 8, 8), (4, 3, 3, 3), {"padding": (1, 2, 3)}, "padding must be an int"),
    ((2, 3, 8, 8), (4, 3, 3, 3), {"padding": -1}, "padding must be >= 0"),
    ((2, 3, 8, 8), (4, 3, 3, 3), {"groups": 0}, "groups must be >= 1"),
    ((2, 3, 8, 8), (4, 3, 3, 3), {"stride": (1, 2, 3)}, "pair of ints"),
])
def test_conv2d_errors(xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpBuildError, match=match):
        out_type("conv2d", TensorType("float32", xs), TensorType("float32", ws), **attrs)


def test_conv2d_rejects_integers() -> None:
    with pytest.raises(OpBuildError, match="x must have a floating dtype, got int32"):
        out_type("conv2d", TensorType("int32", (1, 1, 3, 3)), TensorType("float32", (1, 1, 3, 3)))
    with pytest.raises(OpBuildError, match="w must have a floating dtype"):
        out_type("conv2d", TensorType("float32", (1, 1, 3, 3)), TensorType("complex64", (1, 1, 3, 3)))


# ---------------------------------------------------------------- pooling
POOL_CASES = [
    # x shape, attrs
    ((2, 3, 6, 6), {"kernel_size": 2}),
    ((2, 3, 7, 5), {"kernel_size": (3, 2), "stride": 1}),
    ((2, 3, 7, 8), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((1, 2, 9, 7), {"kernel_size": (4, 3), "stride": (2, 3), "padding": (2, 1)}),
    ((1, 2, 6, 7), {"kernel_size": 3, "stride": 2, "padding": (0, 1, 1, 0)}),
    ((0, 3, 6, 6), {"kernel_size": 3, "padding": 1}),  # empty batch
    ((3, 5, 5), {"kernel_size": 2, "stride": 1}),  # unbatched (C, H, W)
    ((2, 1, 3, 3), {"kernel_size": 3}),
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
@pytest.mark.parametrize("xs, attrs", POOL_CASES)
def test_max_pool2d(rng: np.random.Generator, dtype: str, xs: tuple[int, ...], attrs: dict[str, Any]) -> None:
    x = rand(rng, xs, dtype, -100, 100)
    check_op("max_pool2d", [x], lambda x: pool_ref(x, **attrs, mode="max"), **attrs)


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("xs, attrs", POOL_CASES)
def test_avg_pool2d(rng: np.random.Generator, dtype: str, xs: tuple[int, ...], attrs: dict[str, Any],
                    count_include_pad: bool) -> None:
    x = rand(rng, xs, dtype)
    check_op("avg_pool2d", [x], lambda x: pool_ref(x, **attrs, mode="avg", count_include_pad=count_include_pad),
             count_include_pad=count_include_pad, **tol(dtype), **attrs)


def test_max_pool2d_nan() -> None:
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    x[0, 0, 0, 1] = np.nan
    (got,) = run_op("max_pool2d", x, kernel_size=2)
    np.testing.assert_array_equal(got, [[[[np.nan, 7.0], [13.0, 15.0]]]])


def test_pool_types() -> None:
    f32 = "float32"
    assert out_type("max_pool2d", TensorType(f32, (None, 8, 32, None)), kernel_size=2) == \
        TensorType(f32, (None, 8, 16, None))
    assert out_type("avg_pool2d", TensorType(f32, (8, 32, 31)), kernel_size=3, stride=2, padding=1) == \
        TensorType(f32, (8, 16, 16))
    assert out_type("max_pool2d", TensorType("int8", None), kernel_size=3) == TensorType("int8", None)
    attrs = dict(get_op("avg_pool2d").normalise_attrs({"kernel_size": 3}))
    assert attrs == {"kernel_size": (3, 3), "stride": None, "padding": (0, 0), "count_include_pad": True}


@pytest.mark.parametrize("kind, xt, attrs, match", [
    ("avg_pool2d", TensorType("int32", (1, 1, 4, 4)), {"kernel_size": 2}, "floating dtype, got int32"),
    ("max_pool2d", TensorType("bool", (1, 1, 4, 4)), {"kernel_size": 2}, "integer or floating dtype, got bool"),
    ("max_pool2d", TensorType("float32", (1, 1, 4, 4)), {"kernel_size": 2, "padding": 2}, "at most half"),
    ("avg_pool2d", TensorType("float32", (1, 1, 4, 4)), {"kernel_size": 5}, "larger than the padded input"),
    ("max_pool2d", TensorType("float32", (4, 4)), {"kernel_size": 2}, "got rank 2"),
    ("max_pool2d", TensorType("float32", (1, 1, 4, 4)), {}, "missing required attribute 'kernel_size'"),
    ("avg_pool2d", TensorType("float32", (1, 1, 4, 4)), {"kernel_size": 2, "stride": 0}, "must be >= 1"),
])
def test_pool_errors(kind: str, xt: TensorType, attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpBuildError, match=match):
        out_type(kind, xt, **attrs)


# ---------------------------------------------------------------- against PyTorch (skipped without torch)
@pytest.mark.parametrize("xs, ws, attrs", CONV_CASES)
def test_conv2d_matches_torch(rng: np.random.Generator, xs: tuple[int, ...], ws: tuple[int, ...],
                              attrs: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    if "groups" not in attrs and xs[-3] != ws[1]:
        xs = (*xs[:-3], ws[1], *xs[-2:])
    x, w = rand(rng, xs, np.float32), rand(rng, ws, np.float32)
    targs = {k: v for k, v in attrs.items() if k != "padding"}
    padding = pads4(attrs.get("padding", 0))
    # torch pads symmetrically only; asymmetric padding is done with F.pad (left, right, top, bottom).
    tx = F.pad(torch.from_numpy(x), (padding[2], padding[3], padding[0], padding[1]))
    want = F.conv2d(tx, torch.from_numpy(w), **targs).numpy()
    check_op("conv2d", [x, w], lambda x, w: want, rtol=1e-4, atol=1e-4, **attrs)


@pytest.mark.parametrize("xs, attrs", [case for case in POOL_CASES if np.ndim(case[1].get("padding", 0)) == 0
                                       or len(case[1]["padding"]) == 2])
def test_pools_match_torch(rng: np.random.Generator, xs: tuple[int, ...], attrs: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    x = rand(rng, xs, np.float64)
    tx = torch.from_numpy(x)
    targs = {"kernel_size": attrs["kernel_size"], "stride": attrs.get("stride"), "padding": attrs.get("padding", 0)}
    check_op("max_pool2d", [x], lambda x: F.max_pool2d(tx, **targs).numpy(), **attrs)
    for cip in (True, False):
        want = F.avg_pool2d(tx, **targs, count_include_pad=cip).numpy()
        check_op("avg_pool2d", [x], lambda x, want=want: want, count_include_pad=cip, **attrs)


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_matches_torch(rng: np.random.Generator, kind: str) -> None:
    torch = pytest.importorskip("torch")

    x = rand(rng, (3, 4, 5), np.float32, -30, 30)
    fn = getattr(torch, kind)
    for axis in (0, 1, -1):
        check_op(kind, [x], lambda x, axis=axis: fn(torch.from_numpy(x), dim=axis).numpy(), rtol=1e-5, atol=1e-6,
                 axis=axis)


# ================================================================ N-d ops: "conv", "conv_transpose", "max_pool",
# "max_pool_argmax", "avg_pool", "lp_pool", "lrn", "resize"
def conv_nd_ref(x: np.ndarray, w: np.ndarray, stride: Any = None, padding: Any = None, dilation: Any = None,
                groups: int = 1) -> np.ndarray:
    """Direct N-d convolution: a loop over output positions, in float64."""
    dtype = np.result_type(x, w)
    nsp = x.ndim - 2
    stride, dilation = stride or (1,) * nsp, dilation or (1,) * nsp
    padding = padding or ((0, 0),) * nsp
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), *padding))
    m, cg, *k = w.shape
    mg = m // groups
    outs = [(n - d * (kk - 1) - 1) // s + 1 for n, kk, s, d in zip(xp.shape[2:], k, stride, dilation, strict=True)]
    res = np.zeros((x.shape[0], m, *outs))
    for pos in np.ndindex(*outs):
        idx = tuple(slice(p * s, p * s + d * (kk - 1) + 1, d)
                    for p, s, d, kk in zip(pos, stride, dilation, k, strict=True))
        patch = xp[(slice(None), slice(None), *idx)]
        for g in range(groups):
            res[(slice(None), slice(g * mg, (g + 1) * mg), *pos)] = np.tensordot(
                patch[:, g * cg:(g + 1) * cg], w[g * mg:(g + 1) * mg].astype(np.float64),
                axes=(list(range(1, nsp + 2)), list(range(1, nsp + 2))))
    return res.astype(dtype)


def conv_transpose_nd_ref(x: np.ndarray, w: np.ndarray, stride: Any = None, padding: Any = None,
                          output_padding: Any = None, dilation: Any = None, groups: int = 1) -> np.ndarray:
    """Direct transposed convolution: every input pixel scatters its kernel-weighted copy, in float64."""
    dtype = np.result_type(x, w)
    nsp = x.ndim - 2
    stride, dilation = stride or (1,) * nsp, dilation or (1,) * nsp
    padding, output_padding = padding or ((0, 0),) * nsp, output_padding or (0,) * nsp
    n, c, *ins = x.shape
    _, mg, *k = w.shape
    cg = c // groups
    full = [(i - 1) * s + d * (kk - 1) + 1 + op
            for i, s, d, kk, op in zip(ins, stride, dilation, k, output_padding, strict=True)]
    res = np.zeros((n, mg * groups, *full))
    for pos in np.ndindex(*ins):
        for tap in np.ndindex(*k):
            dst = tuple(p * s + t * d for p, s, t, d in zip(pos, stride, tap, dilation, strict=True))
            for g in range(groups):
                xv = x[(slice(None), slice(g * cg, (g + 1) * cg), *pos)].astype(np.float64)  # (N, Cg)
                wv = w[(slice(g * cg, (g + 1) * cg), slice(None), *tap)].astype(np.float64)  # (Cg, Mg)
                res[(slice(None), slice(g * mg, (g + 1) * mg), *dst)] += xv @ wv
    crop = tuple(slice(pb, f - pe) for (pb, pe), f in zip(padding, full, strict=True))
    return res[(slice(None), slice(None), *crop)].astype(dtype)


def pool_nd_ref(x: np.ndarray, kernel_size: Any, stride: Any = None, padding: Any = None, dilation: Any = None,
                ceil_mode: bool = False, *, mode: str, count_include_pad: bool = False, p: float = 2.0) -> np.ndarray:
    """Direct N-d pooling (max, argmax, avg, lp): a loop over output positions and window cells."""
    nsp = len(kernel_size)
    stride, dilation = stride or (1,) * nsp, dilation or (1,) * nsp
    padding = padding or ((0, 0),) * nsp
    sizes = x.shape[2:]
    outs = []
    for n, k, s, (pb, pe), d in zip(sizes, kernel_size, stride, padding, dilation, strict=True):
        span, padded = d * (k - 1) + 1, n + pb + pe
        o = (padded - span + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (o - 1) * s >= n + pb:
            o -= 1
        outs.append(o)
    dtype = np.int64 if mode == "argmax" else x.dtype
    res = np.zeros((*x.shape[:2], *outs), dtype)
    for pos in np.ndindex(*outs):
        cells, in_pad = [], 0
        for tap in np.ndindex(*kernel_size):
            coord = [o * s - pb + t * d
                     for o, s, (pb, _), t, d in zip(pos, stride, padding, tap, dilation, strict=True)]
            if all(0 <= c < n for c, n in zip(coord, sizes, strict=True)):
                cells.append(coord)
            elif all(-pb <= c < n + pe for c, n, (pb, pe) in zip(coord, sizes, padding, strict=True)):
                in_pad += 1
        vals = np.stack([x[(slice(None), slice(None), *c)] for c in cells], axis=-1)
        out = (slice(None), slice(None), *pos)
        if mode == "max":
            res[out] = vals.max(axis=-1)
        elif mode == "argmax":
            flat = np.array([np.ravel_multi_index(c, sizes) for c in cells])
            res[out] = flat[np.argmax(vals, axis=-1)]
        elif mode == "avg":
            res[out] = vals.sum(axis=-1) / (len(cells) + (in_pad if count_include_pad else 0))
        else:
            res[out] = (np.abs(vals) ** p).sum(axis=-1) ** (1 / p)
    return res


def torch_pads(padding: Any) -> list[int]:
    """Per-axis (begin, end) pairs as F.pad's flat list (last axis first)."""
    return [q for pair in reversed(padding) for q in pair]


def fd_grad_check(kind: str, shapes: list[tuple[int, ...]], rng: np.random.Generator, **attrs: Any) -> None:
    """The op's gradient rule against central finite differences of sum(op(...) * random weights)."""
    import opgraph
    from opgraph.autodiff import build_grad_ops

    b = opgraph.GraphBuilder()
    arrays = [rng.standard_normal(s) for s in shapes]
    ins = [b.input(("float64", a.shape)) for a in arrays]
    y = b.op(kind, *ins, **attrs)
    loss = b.sum(b.multiply(y, b.constant(rng.standard_normal(y.type.shape))))
    grads = b.run(dict(zip(ins, arrays, strict=True)), build_grad_ops(b, loss, ins))
    graph = b.freeze()
    eps = 1e-6
    for k, (v, a) in enumerate(zip(ins, arrays, strict=True)):
        fd = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            for sgn in (1, -1):
                a2 = a.copy()
                a2[i] += sgn * eps
                feeds = {u.id: (a2 if u is v else arr) for u, arr in zip(ins, arrays, strict=True)}
                fd[i] += sgn * float(graph.run(feeds, [loss.id])[0]) / (2 * eps)
        assert grads[k].shape == a.shape
        np.testing.assert_allclose(grads[k], fd, rtol=1e-5, atol=1e-6, err_msg=f"{kind} {attrs} input {k}")


# ---------------------------------------------------------------- conv
CONV_ND_CASES = [
    # x shape, w shape, attrs
    ((2, 3, 9), (4, 3, 3), {}),
    ((2, 4, 9), (6, 2, 2), {"stride": (2,), "padding": ((2, 1),), "dilation": (3,), "groups": 2}),
    ((2, 3, 7, 6), (4, 3, 3, 2), {"stride": (2, 1), "padding": ((1, 2), (0, 1))}),
    ((1, 4, 6, 7), (8, 1, 3, 3), {"groups": 4, "dilation": (2, 1), "padding": ((2, 2), (1, 1))}),  # depthwise
    ((2, 2, 5, 4, 6), (3, 2, 2, 3, 2), {"stride": (1, 2, 2), "padding": ((0, 1), (1, 1), (2, 0))}),
    ((1, 4, 4, 5, 4), (4, 2, 2, 2, 2), {"groups": 2, "dilation": (1, 2, 2)}),
    ((0, 3, 5, 5), (2, 3, 3, 3), {}),  # empty batch
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("xs, ws, attrs", CONV_ND_CASES)
def test_conv(rng: np.random.Generator, dtype: str, xs: tuple[int, ...], ws: tuple[int, ...],
              attrs: dict[str, Any]) -> None:
    x, w = rand(rng, xs, dtype), rand(rng, ws, dtype)
    check_op("conv", [x, w], lambda x, w: conv_nd_ref(x, w, **attrs), **tol(dtype), **attrs)


def test_conv_mixed_and_half_dtypes(rng: np.random.Generator) -> None:
    x, w = rand(rng, (2, 3, 6), np.float32), rand(rng, (2, 3, 2), np.float64)
    check_op("conv", [x, w], conv_nd_ref, **tol("float64"))
    x16, w16 = rand(rng, (1, 2, 5, 5), np.float16, -1, 1), rand(rng, (3, 2, 3, 3), np.float16, -1, 1)
    check_op("conv", [x16, w16], lambda x, w: conv_nd_ref(x, w, padding=((1, 1), (1, 1))), **tol("float16"),
             padding=((1, 1), (1, 1)))


def test_conv_agrees_with_conv2d(rng: np.random.Generator) -> None:
    x, w = rand(rng, (2, 4, 7, 6), np.float64), rand(rng, (6, 2, 3, 2), np.float64)
    (want,) = run_op("conv2d", x, w, stride=(2, 1), padding=(1, 2, 0, 1), dilation=(1, 2), groups=2)
    check_op("conv", [x, w], lambda x, w: want, stride=(2, 1), padding=((1, 2), (0, 1)), dilation=(1, 2), groups=2,
             **tol("float64"))


@pytest.mark.parametrize("xs, ws, attrs", CONV_ND_CASES)
def test_conv_matches_torch(rng: np.random.Generator, xs: tuple[int, ...], ws: tuple[int, ...],
                            attrs: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    x, w = rand(rng, xs, np.float32), rand(rng, ws, np.float32)
    nsp = len(xs) - 2
    fn = [F.conv1d, F.conv2d, F.conv3d][nsp - 1]
    tx = F.pad(torch.from_numpy(x), torch_pads(attrs.get("padding", ((0, 0),) * nsp)))
    want = fn(tx, torch.from_numpy(w), stride=attrs.get("stride", 1), dilation=attrs.get("dilation", 1),
              groups=attrs.get("groups", 1)).numpy()
    check_op("conv", [x, w], lambda x, w: want, rtol=1e-4, atol=1e-4, **attrs)


@pytest.mark.parametrize("xs, ws, attrs", [
    ((2, 2, 5), (3, 2, 2), {"stride": (2,), "padding": ((1, 0),)}),
    ((1, 4, 5, 6), (4, 2, 2, 3), {"stride": (2, 1), "padding": ((1, 2), (0, 1)), "dilation": (1, 2), "groups": 2}),
    ((1, 2, 4, 3, 4), (2, 1, 2, 2, 2), {"stride": (1, 2, 2), "padding": ((0, 1), (1, 0), (1, 1)), "groups": 2}),
])
def test_conv_grad(rng: np.random.Generator, xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any]) -> None:
    fd_grad_check("conv", [xs, ws], rng, **attrs)


# ---------------------------------------------------------------- conv_transpose
CONV_T_CASES = [
    # x shape, w shape (C, M // groups, *kernel), attrs
    ((2, 3, 5), (3, 2, 3), {}),
    ((2, 4, 5), (4, 3, 3), {"stride": (2,), "padding": ((1, 2),), "output_padding": (1,), "groups": 2}),
    ((1, 2, 4, 3), (2, 3, 3, 2), {"stride": (3, 2), "padding": ((1, 1), (0, 1)), "dilation": (2, 1),
                                  "output_padding": (2, 1)}),
    ((2, 4, 3, 4), (4, 1, 2, 2), {"stride": (2, 2), "groups": 4}),
    ((1, 2, 3, 2, 3), (2, 2, 2, 3, 2), {"stride": (2, 1, 2), "padding": ((0, 1), (1, 1), (1, 0)),
                                        "output_padding": (1, 0, 0)}),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("xs, ws, attrs", CONV_T_CASES)
def test_conv_transpose(rng: np.random.Generator, dtype: str, xs: tuple[int, ...], ws: tuple[int, ...],
                        attrs: dict[str, Any]) -> None:
    x, w = rand(rng, xs, dtype), rand(rng, ws, dtype)
    check_op("conv_transpose", [x, w], lambda x, w: conv_transpose_nd_ref(x, w, **attrs), **tol(dtype), **attrs)


@pytest.mark.parametrize("xs, ws, attrs", CONV_T_CASES)
def test_conv_transpose_matches_torch(rng: np.random.Generator, xs: tuple[int, ...], ws: tuple[int, ...],
                                      attrs: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    x, w = rand(rng, xs, np.float32), rand(rng, ws, np.float32)
    nsp = len(xs) - 2
    fn = [F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d][nsp - 1]
    # torch pads symmetrically only: run unpadded (output_padding included) and crop (begin, end) here.
    full = fn(torch.from_numpy(x), torch.from_numpy(w), stride=attrs.get("stride", 1),
              output_padding=attrs.get("output_padding", 0), dilation=attrs.get("dilation", 1),
              groups=attrs.get("groups", 1)).numpy()
    pads = attrs.get("padding", ((0, 0),) * nsp)
    crop = (slice(pb, n - pe) for (pb, pe), n in zip(pads, full.shape[2:], strict=True))
    want = full[(slice(None), slice(None), *crop)]
    check_op("conv_transpose", [x, w], lambda x, w: want, rtol=1e-4, atol=1e-4, **attrs)


def test_conv_transpose_matches_onnx_reference(rng: np.random.Generator) -> None:
    pytest.importorskip("onnx")
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    # (The reference has no groups.)
    x, w = rand(rng, (1, 4, 3, 4), np.float64), rand(rng, (4, 2, 3, 2), np.float64)
    node = helper.make_node("ConvTranspose", ["X", "W"], ["Y"], strides=(2, 3), pads=(1, 0, 2, 1),
                            output_padding=(1, 2), dilations=(1, 2))
    want = ReferenceEvaluator(node).run(None, {"X": x, "W": w})[0]
    check_op("conv_transpose", [x, w], lambda x, w: want, stride=(2, 3), padding=((1, 2), (0, 1)),
             output_padding=(1, 2), dilation=(1, 2), **tol("float64"))


@pytest.mark.parametrize("xs, ws, attrs", [
    ((2, 2, 4), (2, 3, 3), {"stride": (2,), "padding": ((1, 0),), "output_padding": (1,)}),
    ((1, 4, 3, 3), (4, 1, 2, 3), {"stride": (2, 3), "padding": ((1, 2), (0, 1)), "dilation": (2, 1), "groups": 2,
                                  "output_padding": (1, 2)}),
    ((1, 2, 2, 3, 2), (2, 2, 2, 1, 2), {"stride": (1, 2, 2), "padding": ((0, 1), (0, 0), (1, 1))}),
])
def test_conv_transpose_grad(rng: np.random.Generator, xs: tuple[int, ...], ws: tuple[int, ...],
                             attrs: dict[str, Any]) -> None:
    fd_grad_check("conv_transpose", [xs, ws], rng, **attrs)


def test_conv_types() -> None:
    f32 = "float32"
    assert out_type("conv", TensorType(f32, (None, 3, 16)), TensorType(f32, (8, 3, 3)), stride=(2,),
                    padding=((1, 1),)) == TensorType(f32, (None, 8, 8))
    assert out_type("conv", TensorType(f32, None), TensorType(f32, (8, 3, 3, 3))) == \
        TensorType(f32, (None, 8, None, None))
    assert out_type("conv_transpose", TensorType(f32, (1, 4, 5, 5)), TensorType(f32, (4, 3, 3, 3)), groups=2,
                    stride=(2, 2), padding=((1, 1), (0, 2)), output_padding=(1, 0)) == TensorType(f32, (1, 6, 10, 9))


@pytest.mark.parametrize("kind, xt, wt, attrs, match", [
    ("conv", TensorType("float32", (1, 3, 5, 5)), TensorType("float32", (4, 3, 3)), {}, "1 spatial axes, got rank 4"),
    ("conv", TensorType("float32", (1, 3, 5, 5)), TensorType("float32", (4, 2, 3, 3)), {}, "x has 3"),
    ("conv", TensorType("float32", (1, 4, 5)), TensorType("float32", (3, 2, 3)), {"groups": 2}, "not divisible"),
    ("conv", TensorType("float32", (1, 3, 5)), TensorType("float32", (4, 3, 7)), {}, "larger than the padded"),
    ("conv", TensorType("float32", (1, 3, 5)), TensorType("float32", (4, 3, 3)), {"stride": (1, 1)}, "2 entries"),
    ("conv", TensorType("int32", (1, 3, 5)), TensorType("float32", (4, 3, 3)), {}, "floating dtype"),
    ("conv", TensorType("float32", (1, 3, 5)), TensorType("float32", (4, 3, 3)), {"padding": (1, 1)},
     "one \\(begin, end\\) pair"),
    ("conv", TensorType("float32", (1, 3, 2, 2, 2, 2)), TensorType("float32", (4, 3, 1, 1, 1, 1)), {}, "1 to 3"),
    ("conv_transpose", TensorType("float32", (1, 3, 5)), TensorType("float32", (4, 2, 3)), {}, "x has 3"),
    ("conv_transpose", TensorType("float32", (1, 2, 1)), TensorType("float32", (2, 2, 1)),
     {"padding": ((1, 0),)}, "output size 0"),
])
def test_conv_errors(kind: str, xt: TensorType, wt: TensorType, attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpBuildError, match=match):
        out_type(kind, xt, wt, **attrs)


# ---------------------------------------------------------------- max_pool, max_pool_argmax, avg_pool, lp_pool
POOL_ND_CASES = [
    # x shape, attrs
    ((2, 3, 9), {"kernel_size": (3,), "stride": (2,)}),
    ((2, 3, 8), {"kernel_size": (3,), "stride": (2,), "padding": ((1, 0),), "ceil_mode": True}),
    ((1, 2, 10), {"kernel_size": (2,), "stride": (3,), "dilation": (3,), "padding": ((2, 3),), "ceil_mode": True}),
    ((2, 3, 7, 6), {"kernel_size": (3, 2), "stride": (2, 2), "padding": ((1, 1), (0, 1))}),
    ((2, 2, 7, 7), {"kernel_size": (3, 3), "stride": (2, 2), "padding": ((1, 1), (1, 1)), "ceil_mode": True}),
    ((1, 2, 6, 7), {"kernel_size": (2, 3), "stride": (2, 3), "dilation": (2, 1), "ceil_mode": True}),
    ((1, 3, 6, 5), {"kernel_size": (2, 2), "padding": ((0, 1), (1, 0))}),  # stride 1 (ONNX default)
    ((1, 2, 5, 6, 4), {"kernel_size": (2, 3, 2), "stride": (2, 2, 1), "padding": ((1, 0), (1, 1), (0, 1))}),
    ((1, 2, 5, 5, 6), {"kernel_size": (2, 2, 3), "stride": (2, 2, 2), "dilation": (1, 2, 1), "ceil_mode": True}),
]


@pytest.mark.parametrize("xs, attrs", POOL_ND_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint8"])
def test_max_pool(rng: np.random.Generator, xs: tuple[int, ...], attrs: dict[str, Any], dtype: str) -> None:
    x = rand(rng, xs, dtype, -100, 100)
    check_op("max_pool", [x], lambda x: pool_nd_ref(x, mode="max", **attrs), **attrs)
    check_op("max_pool_argmax", [x], lambda x: pool_nd_ref(x, mode="argmax", **attrs), **attrs)


def test_max_pool_ties_nan_and_padding() -> None:
    x = np.array([[[-5.0, -5.0, 1.0, 1.0, np.nan, 2.0, np.nan]]])
    attrs = {"kernel_size": (2,), "stride": (2,), "padding": ((1, 0),), "ceil_mode": True}
    (got,) = run_op("max_pool", x, **attrs)
    np.testing.assert_array_equal(got, [[[-5.0, 1.0, np.nan, np.nan]]])
    (idx,) = run_op("max_pool_argmax", x, **attrs)
    np.testing.assert_array_equal(idx, [[[0, 2, 4, 6]]])  # ties take the first cell; NaN wins
    # Integer padding holds the dtype's minimum, which must not win the argmax over an equal input cell.
    xi = np.array([[[-128, 3]]], np.int8)
    (idx,) = run_op("max_pool_argmax", xi, kernel_size=(2,), padding=((1, 0),))
    np.testing.assert_array_equal(idx, [[[0, 1]]])


@pytest.mark.parametrize("xs, attrs", POOL_ND_CASES)
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool(rng: np.random.Generator, xs: tuple[int, ...], attrs: dict[str, Any],
                  count_include_pad: bool) -> None:
    x = rand(rng, xs, np.float64)
    check_op("avg_pool", [x], lambda x: pool_nd_ref(x, mode="avg", count_include_pad=count_include_pad, **attrs),
             count_include_pad=count_include_pad, **tol("float64"), **attrs)
    x16 = rand(rng, xs, np.float16)
    check_op("avg_pool", [x16], lambda x: pool_nd_ref(x.astype(np.float64), mode="avg",
                                                        count_include_pad=count_include_pad, **attrs).astype(x.dtype),
             count_include_pad=count_include_pad, **tol("float16"), **attrs)


@pytest.mark.parametrize("xs, attrs", POOL_ND_CASES)
@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
def test_lp_pool(rng: np.random.Generator, xs: tuple[int, ...], attrs: dict[str, Any], p: float) -> None:
    x = rand(rng, xs, np.float64)
    check_op("lp_pool", [x], lambda x: pool_nd_ref(x, mode="lp", p=p, **attrs), p=p, **tol("float64"), **attrs)
    x32 = rand(rng, xs, np.float32)
    check_op("lp_pool", [x32], lambda x: pool_nd_ref(x, mode="lp", p=p, **attrs), p=p, **tol("float32"), **attrs)


def _torch_pool_args(attrs: dict[str, Any], nsp: int) -> dict[str, Any]:
    return {"kernel_size": attrs["kernel_size"], "stride": attrs.get("stride", (1,) * nsp),
            "padding": tuple(pb for pb, _ in attrs.get("padding", ((0, 0),) * nsp)),
            "ceil_mode": attrs.get("ceil_mode", False)}


def _torch_can_pad(attrs: dict[str, Any]) -> bool:
    # torch pools pad symmetrically, by at most half the kernel.
    kernel = attrs["kernel_size"]
    pads = attrs.get("padding", ((0, 0),) * len(kernel))
    return all(pb == pe and 2 * pb <= k for (pb, pe), k in zip(pads, kernel, strict=True))


@pytest.mark.parametrize("xs, attrs", [c for c in POOL_ND_CASES if _torch_can_pad(c[1])])
def test_pools_nd_match_torch(rng: np.random.Generator, xs: tuple[int, ...], attrs: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    nsp = len(xs) - 2
    x = rand(rng, xs, np.float64)
    tx = torch.from_numpy(x)
    targs = _torch_pool_args(attrs, nsp)
    maxpool = [F.max_pool1d, F.max_pool2d, F.max_pool3d][nsp - 1]
    values, indices = maxpool(tx, **targs, dilation=attrs.get("dilation", 1), return_indices=True)
    check_op("max_pool", [x], lambda x: values.numpy(), **attrs)
    check_op("max_pool_argmax", [x], lambda x: indices.numpy(), **attrs)
    if "dilation" in attrs:
        return  # torch's avg_pool and lp_pool have no dilation
    avgpool = [F.avg_pool1d, F.avg_pool2d, F.avg_pool3d][nsp - 1]
    for cip in (False, True):
        want = avgpool(tx, **targs, count_include_pad=cip).numpy()
        check_op("avg_pool", [x], lambda x, want=want: want, count_include_pad=cip, **tol("float64"), **attrs)
    if nsp < 3 and "padding" not in attrs:
        lppool = [F.lp_pool1d, F.lp_pool2d][nsp - 1]
        ks = attrs["kernel_size"][0] if nsp == 1 else attrs["kernel_size"]
        st = targs["stride"][0] if nsp == 1 else targs["stride"]
        # torch raises x to the p-th power without abs: compare on non-negative inputs.
        xa = np.abs(x)
        want = lppool(torch.from_numpy(xa), 3.0, ks, st, ceil_mode=targs["ceil_mode"]).numpy()
        check_op("lp_pool", [xa], lambda x: want, p=3.0, **tol("float64"), **attrs)


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_pools_nd_match_onnx_reference(rng: np.random.Generator, ceil_mode: bool) -> None:
    pytest.importorskip("onnx")
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    x = rand(rng, (2, 3, 7, 6), np.float64)
    attrs = {"kernel_size": (3, 2), "stride": (2, 2), "padding": ((1, 0), (0, 1)), "dilation": (2, 1),
             "ceil_mode": ceil_mode}
    onnx_attrs = {"kernel_shape": (3, 2), "strides": (2, 2), "pads": (1, 0, 0, 1), "dilations": (2, 1),
                  "ceil_mode": int(ceil_mode)}
    cases = [("MaxPool", "max_pool", {}, {}),
             ("AveragePool", "avg_pool", {"count_include_pad": 0}, {"count_include_pad": False}),
             ("AveragePool", "avg_pool", {"count_include_pad": 1}, {"count_include_pad": True})]
    if not ceil_mode:  # ONNX's reference LpPool approximates ceil_mode's partial windows by scaling an average
        cases.append(("LpPool", "lp_pool", {"p": 3}, {"p": 3.0}))
    for onnx_op, kind, extra, ours in cases:
        node = helper.make_node(onnx_op, ["X"], ["Y"], **onnx_attrs, **extra)
        want = ReferenceEvaluator(node).run(None, {"X": x})[0]
        check_op(kind, [x], lambda x, want=want: want, **tol("float64"), **attrs, **ours)


@pytest.mark.parametrize("kind, xs, attrs", [
    ("max_pool", (2, 2, 7), {"kernel_size": (3,), "stride": (2,), "padding": ((1, 0),), "ceil_mode": True}),
    ("max_pool", (1, 2, 5, 6), {"kernel_size": (2, 3), "stride": (2, 1), "padding": ((1, 0), (1, 2)),
                                "dilation": (2, 1)}),
    ("max_pool", (1, 1, 4, 3, 5), {"kernel_size": (2, 2, 3), "stride": (2, 1, 2),
                                   "padding": ((1, 1), (0, 1), (1, 0)), "ceil_mode": True}),
    ("avg_pool", (2, 2, 7), {"kernel_size": (3,), "stride": (2,), "padding": ((1, 0),), "ceil_mode": True}),
    ("avg_pool", (1, 2, 5, 6), {"kernel_size": (2, 3), "stride": (2, 2), "padding": ((1, 0), (1, 2)),
                                "count_include_pad": True, "ceil_mode": True}),
    ("avg_pool", (1, 2, 7, 6), {"kernel_size": (3, 3), "stride": (3, 3), "dilation": (2, 1)}),  # uncovered cells
    ("avg_pool", (1, 1, 4, 3, 5), {"kernel_size": (2, 2, 3), "stride": (2, 1, 2), "padding": ((1, 1), (0, 1), (1, 0)),
                                   "ceil_mode": True}),
])
def test_pool_nd_grad(rng: np.random.Generator, kind: str, xs: tuple[int, ...], attrs: dict[str, Any]) -> None:
    fd_grad_check(kind, [xs], rng, **attrs)


def test_pool_nd_types() -> None:
    t = TensorType("float32", (None, 3, 7, 8))
    assert out_type("max_pool", t, kernel_size=(3, 3), stride=(2, 2), padding=((1, 1), (0, 0))) == \
        TensorType("float32", (None, 3, 4, 3))
    assert out_type("max_pool", t, kernel_size=(3, 3), stride=(2, 2), ceil_mode=True) == \
        TensorType("float32", (None, 3, 3, 4))
    assert out_type("max_pool_argmax", TensorType("uint8", (1, 1, 4)), kernel_size=(2,)) == \
        TensorType("int64", (1, 1, 3))
    assert out_type("avg_pool", TensorType("float64", None), kernel_size=(2,)) == TensorType("float64", None)


@pytest.mark.parametrize("kind, xt, attrs, match", [
    ("max_pool", TensorType("float32", (1, 1, 4, 4)), {"kernel_size": (2,)}, "1 spatial axes, got rank 4"),
    ("max_pool", TensorType("float32", (1, 1, 4)), {"kernel_size": (5,)}, "larger than the padded input"),
    ("max_pool", TensorType("float32", (1, 1, 4)), {"kernel_size": (2,), "padding": ((2, 0),)}, "smaller than"),
    ("max_pool", TensorType("bool", (1, 1, 4)), {"kernel_size": (2,)}, "integer or floating dtype"),
    ("avg_pool", TensorType("int32", (1, 1, 4)), {"kernel_size": (2,)}, "floating dtype"),
    ("lp_pool", TensorType("float32", (1, 1, 4, 4)), {"kernel_size": (2, 2), "stride": (1,)}, "1 entries"),
    ("max_pool_argmax", TensorType("float32", (1, 1, 4)), {"kernel_size": (0,)}, "must be >= 1"),
    ("avg_pool", TensorType("float32", (1, 1, 4)), {}, "missing required attribute 'kernel_size'"),
])
def test_pool_nd_errors(kind: str, xt: TensorType, attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpBuildError, match=match):
        out_type(kind, xt, **attrs)


# ---------------------------------------------------------------- lrn
def lrn_ref(x: np.ndarray, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> np.ndarray:
    sq = np.zeros_like(x)
    c = x.shape[1]
    for i in range(c):
        lo, hi = max(0, i - (size - 1) // 2), min(c, i + int(np.ceil((size - 1) / 2)) + 1)
        sq[:, i] = (x[:, lo:hi] ** 2).sum(axis=1)
    return x / (bias + alpha / size * sq) ** beta


@pytest.mark.parametrize("xs", [(2, 5), (2, 6, 4), (1, 7, 3, 4), (2, 3, 2, 2, 3)])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 9])
def test_lrn(rng: np.random.Generator, xs: tuple[int, ...], size: int) -> None:
    x = rand(rng, xs, np.float64)
    attrs = {"size": size, "alpha": 0.3, "beta": 0.6, "bias": 1.5}
    check_op("lrn", [x], lambda x: lrn_ref(x, **attrs), **tol("float64"), **attrs)
    x32 = rand(rng, xs, np.float32)
    check_op("lrn", [x32], lambda x: lrn_ref(x, size), **tol("float32"), size=size)


def test_lrn_matches_torch_and_onnx(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    x = rand(rng, (2, 7, 4, 3), np.float64)
    for size in (1, 3, 5):  # torch centres even windows differently from ONNX
        want = F.local_response_norm(torch.from_numpy(x), size, alpha=0.25, beta=0.75, k=2.0).numpy()
        check_op("lrn", [x], lambda x, want=want: want, size=size, alpha=0.25, beta=0.75, bias=2.0, **tol("float64"))
    pytest.importorskip("onnx")
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    # ONNX's reference loops over range(N) for the channels: give it N == C.
    x = rand(rng, (5, 5, 3, 2), np.float64)
    for size in (2, 4, 5):
        node = helper.make_node("LRN", ["X"], ["Y"], size=size, alpha=0.25, beta=0.75, bias=2.0)
        want = ReferenceEvaluator(node).run(None, {"X": x})[0]
        # The reference computes alpha / size in float32.
        check_op("lrn", [x], lambda x, want=want: want, size=size, alpha=0.25, beta=0.75, bias=2.0, rtol=1e-7)


def test_lrn_errors() -> None:
    with pytest.raises(OpBuildError, match="rank 1"):
        out_type("lrn", TensorType("float32", (4,)), size=3)
    with pytest.raises(OpBuildError, match="size must be >= 1"):
        out_type("lrn", TensorType("float32", (1, 4, 2)), size=0)
    with pytest.raises(OpBuildError, match="floating dtype"):
        out_type("lrn", TensorType("int8", (1, 4, 2)), size=3)


# ---------------------------------------------------------------- resize
def onnx_resize(x: np.ndarray, sizes: Any = None, scales: Any = None, roi: Any = None, **attrs: Any) -> np.ndarray:
    """ONNX's Python reference Resize (opset 19) on x, given sizes or scales."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = ["X", "roi" if roi is not None else "", "scales" if scales is not None else "",
             "sizes" if scales is None else ""]
    while not names[-1]:
        names.pop()
    feeds: dict[str, np.ndarray] = {"X": x}
    if roi is not None:
        feeds["roi"] = np.array(roi, np.float32)
    if scales is not None:
        feeds["scales"] = np.array(scales, np.float32)
    else:
        feeds["sizes"] = np.array(sizes, np.int64)
    node = helper.make_node("Resize", names, ["Y"], **attrs)
    return ReferenceEvaluator(node).run(None, feeds)[0]


def f32_tuple(v: Any) -> Any:
    """The float32 rounding ONNX gives roi and scales (they are float32 tensors in a model)."""
    return None if v is None else tuple(float(np.float32(a)) for a in v)


def onnx_resize_tol(mode: str) -> dict[str, float]:
    # The reference computes cubic weights in float32 (cubic_coeff_a is a float32 attribute).
    return {"rtol": 1e-5, "atol": 1e-5} if mode == "cubic" else tol("float64")


RESIZE_ROI = (0.0, 0.0, 0.2, -0.1, 1.0, 1.0, 0.85, 1.25)  # no source coordinate is a rounding tie


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("ctm", ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                 "asymmetric", "tf_crop_and_resize"])
@pytest.mark.parametrize("sizes", [(1, 2, 8, 9), (1, 2, 3, 2), (1, 2, 1, 9), (2, 2, 5, 4)])
def test_resize_matches_onnx_reference(rng: np.random.Generator, mode: str, ctm: str, sizes: tuple[int, ...]) -> None:
    pytest.importorskip("onnx")
    x = rand(rng, (1, 2, 5, 4), np.float32)
    roi = RESIZE_ROI if ctm == "tf_crop_and_resize" else None
    extras: list[dict[str, Any]] = [{}]
    if mode == "nearest":
        extras += [{"nearest_mode": m} for m in ("round_prefer_ceil", "floor", "ceil")]
    else:
        extras += [{"exclude_outside": 1}]
    if mode == "cubic":
        extras += [{"cubic_coeff_a": -0.5}]
    for extra in extras:
        if mode == "cubic" and ctm == "pytorch_half_pixel" and 1 in sizes[2:]:
            continue  # the spec's x_original = 0 for a length-1 output; ONNX's reference uses -0.5
        onnx_attrs = {"mode": mode, "coordinate_transformation_mode": ctm, "extrapolation_value": 0.5, **extra}
        want = onnx_resize(x, sizes=sizes, roi=roi, **onnx_attrs)
        ours = {**onnx_attrs, **({"exclude_outside": True} if "exclude_outside" in extra else {})}
        check_op("resize", [x], lambda x, want=want: want, sizes=sizes, roi=f32_tuple(roi), rtol=1e-5, atol=1e-5,
                 **ours)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("ctm", ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                 "asymmetric"])
@pytest.mark.parametrize("scales", [(1.0, 1.0, 2.5, 0.6), (1.0, 1.0, 1.7, 3.0), (1.0, 1.0, 0.5, 1.0)])
def test_resize_with_scales_matches_onnx_reference(rng: np.random.Generator, mode: str, ctm: str,
                                                   scales: tuple[float, ...]) -> None:
    pytest.importorskip("onnx")
    x = rand(rng, (1, 2, 4, 5), np.float64)
    sizes = tuple(int(np.float32(s) * n) for s, n in zip(scales, x.shape, strict=True))
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    want = onnx_resize(x, scales=scales, **attrs)
    check_op("resize", [x], lambda x: want, sizes=sizes, scales=f32_tuple(scales), **onnx_resize_tol(mode), **attrs)


@pytest.mark.parametrize("shape, sizes", [((2, 3, 7), (2, 3, 12)), ((1, 2, 3, 4, 5), (1, 2, 5, 3, 8)),
                                          ((2, 3), (4, 2))])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_ranks_match_onnx_reference(rng: np.random.Generator, shape: tuple[int, ...], sizes: tuple[int, ...],
                                           mode: str) -> None:
    pytest.importorskip("onnx")
    x = rand(rng, shape, np.float64)
    want = onnx_resize(x, sizes=sizes, mode=mode)
    check_op("resize", [x], lambda x: want, sizes=sizes, mode=mode, **onnx_resize_tol(mode))


TORCH_RESIZE = [
    # torch mode, torch align_corners, our attrs
    ("nearest", None, {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    ("nearest-exact", None, {"mode": "nearest", "nearest_mode": "round_prefer_ceil"}),
    ("linear", False, {"mode": "linear"}),
    ("linear", True, {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
    ("cubic", False, {"mode": "cubic"}),
    ("cubic", True, {"mode": "cubic", "coordinate_transformation_mode": "align_corners"}),
]


@pytest.mark.parametrize("tmode, align, attrs", TORCH_RESIZE)
@pytest.mark.parametrize("shape, out", [((2, 3, 7), (12,)), ((2, 3, 7), (3,)), ((1, 2, 5, 6), (9, 4)),
                                        ((1, 2, 4, 6), (8, 12)), ((1, 2, 3, 4, 5), (5, 3, 8))])
def test_resize_matches_torch(rng: np.random.Generator, tmode: str, align: bool | None, attrs: dict[str, Any],
                              shape: tuple[int, ...], out: tuple[int, ...]) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    nsp = len(shape) - 2
    if tmode in ("linear", "cubic"):
        if tmode == "cubic" and nsp != 2:
            return  # torch has bicubic for 2-D images only
        tmode = {1: "linear", 2: "bilinear" if tmode == "linear" else "bicubic", 3: "trilinear"}[nsp]
    x = rand(rng, shape, np.float64)
    want = F.interpolate(torch.from_numpy(x), size=out, mode=tmode, align_corners=align).numpy()
    check_op("resize", [x], lambda x: want, sizes=(*shape[:2], *out), **tol("float64"), **attrs)


def test_resize_scale_factor_matches_torch(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    x = rand(rng, (1, 2, 5, 6), np.float64)
    # The model's scales, not out / in, drive the coordinate transform (torch: recompute_scale_factor=False).
    for tmode, attrs in (("bilinear", {"mode": "linear"}), ("bicubic", {"mode": "cubic"}),
                         ("nearest", {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"})):
        want = F.interpolate(torch.from_numpy(x), scale_factor=(1.7, 0.7), mode=tmode,
                             recompute_scale_factor=False).numpy()
        check_op("resize", [x], lambda x, want=want: want, sizes=want.shape, scales=(1.0, 1.0, 1.7, 0.7),
                 **tol("float64"), **attrs)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int64", "float16"])
def test_resize_nearest_keeps_dtype(rng: np.random.Generator, dtype: str) -> None:
    x = rand(rng, (1, 3, 4, 5), dtype, -100, 100)
    rows, cols = np.array([0, 0, 1, 2, 2, 3]), np.array([0, 1, 2, 3, 4])  # half_pixel, round_prefer_floor
    check_op("resize", [x], lambda x: x[:, :, rows][:, :, :, cols], sizes=(1, 3, 6, 5))


def test_resize_tf_crop_and_resize_extrapolates() -> None:
    x = np.arange(16, dtype=np.float64).reshape(1, 1, 4, 4)
    roi = (0.0, 0.0, -0.5, 0.25, 1.0, 1.0, 0.5, 0.75)
    (got,) = run_op("resize", x, sizes=(1, 1, 3, 3), mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
                    roi=roi, extrapolation_value=-1.0)
    # rows sample y = -1.5, 0, 1.5 (the first outside); columns x = 0.75, 1.5, 2.25.
    np.testing.assert_allclose(got[0, 0], [[-1.0, -1.0, -1.0], [0.75, 1.5, 2.25], [6.75, 7.5, 8.25]])


def test_resize_identity_and_empty(rng: np.random.Generator) -> None:
    x = rand(rng, (2, 3, 4), np.float32)
    check_op("resize", [x], lambda x: x.copy(), sizes=(2, 3, 4), mode="cubic")
    check_op("resize", [x], lambda x: np.zeros((2, 0, 4), x.dtype), sizes=(2, 0, 4), mode="linear")


@pytest.mark.parametrize("xt, attrs, match", [
    (TensorType("float32", (1, 2, 4)), {"sizes": (1, 2, 4, 4)}, "4 entries for an input of rank 3"),
    (TensorType("uint8", (1, 2, 4)), {"sizes": (1, 2, 8), "mode": "linear"}, "floating dtype \\(mode 'linear'\\)"),
    (TensorType("bool", (1, 2, 4)), {"sizes": (1, 2, 8)}, "integer or floating"),
    (TensorType("float32", (1, 2, 4)), {"sizes": (1, 2, 8), "mode": "bilinear"}, "one of nearest, linear, cubic"),
    (TensorType("float32", (1, 2, 4)), {"sizes": (1, 2, 8), "nearest_mode": "round"}, "round_prefer_floor"),
    (TensorType("float32", (1, 2, 4)), {"sizes": (1, 2, 8), "scales": (1.0, 2.0)}, "one positive factor per axis"),
    (TensorType("float32", (1, 2, 4)), {"sizes": (1, 2, 8), "roi": (0.0, 1.0)}, "6 entries"),
    (TensorType("float32", (1, 0, 4)), {"sizes": (1, 2, 8)}, "empty axis"),
    (TensorType("float32", (1, 2, 4)), {"sizes": (1, -2, 8)}, "sizes must be >= 0"),
])
def test_resize_errors(xt: TensorType, attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpBuildError, match=match):
        out_type("resize", xt, **attrs)


# ---------------------------------------------------------------- grid_sample
GRID_CASES = [((2, 3, 5, 4), (2, 4, 3, 2)), ((1, 2, 4, 3, 5), (1, 3, 2, 2, 3))]


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("xs, gs", GRID_CASES)
def test_grid_sample_matches_torch(rng: np.random.Generator, mode: str, padding_mode: str, align_corners: bool,
                                   xs: tuple[int, ...], gs: tuple[int, ...]) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    if mode == "cubic" and (len(xs) == 5 or padding_mode == "border"):
        return  # torch: bicubic is 2-D only; with border padding ONNX clamps the point first (see the onnx test)
    x, grid = rand(rng, xs, np.float64), rand(rng, gs, np.float64, -1.6, 1.6)
    tmode = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}[mode]
    want = F.grid_sample(torch.from_numpy(x), torch.from_numpy(grid), mode=tmode, padding_mode=padding_mode,
                         align_corners=align_corners).numpy()
    check_op("grid_sample", [x, grid], lambda x, g: want, mode=mode, padding_mode=padding_mode,
             align_corners=align_corners, **tol("float64"))


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("xs, gs", [*GRID_CASES, ((2, 2, 6), (2, 5, 1))])
def test_grid_sample_matches_onnx_reference(rng: np.random.Generator, mode: str, padding_mode: str,
                                            xs: tuple[int, ...], gs: tuple[int, ...]) -> None:
    pytest.importorskip("onnx")
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    x, grid = rand(rng, xs, np.float32), rand(rng, gs, np.float32, -1.6, 1.6)
    for align_corners in (False, True):
        node = helper.make_node("GridSample", ["X", "G"], ["Y"], mode=mode, padding_mode=padding_mode,
                                align_corners=int(align_corners))
        want = ReferenceEvaluator(node).run(None, {"X": x, "G": grid})[0]
        check_op("grid_sample", [x, grid], lambda x, g, want=want: want, mode=mode, padding_mode=padding_mode,
                 align_corners=align_corners, rtol=1e-4, atol=1e-4)


def test_grid_sample_corners_and_dtypes() -> None:
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    grid = np.array([[[[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0], [1.0, -1.0]]]])  # (x, y) pairs
    (got,) = run_op("grid_sample", x, grid, align_corners=True)
    assert got.dtype == np.float32 and got.shape == (1, 1, 1, 4)
    np.testing.assert_allclose(got[0, 0, 0], [0.0, 5.0, 2.5, 2.0])
    (got,) = run_op("grid_sample", x, grid)  # corners are pixel edges: half of each corner pixel is zero padding
    np.testing.assert_allclose(got[0, 0, 0], [0.0, 1.25, 2.5, 0.5])


@pytest.mark.parametrize("xt, gt, attrs, match", [
    (TensorType("float32", (1, 2, 4, 4)), TensorType("float32", (1, 3, 3, 3)), {}, "hold 2 coordinates"),
    (TensorType("float32", (1, 2, 4, 4)), TensorType("float32", (1, 3, 2)), {}, "1 spatial axes, got rank 4"),
    (TensorType("float32", (2, 2, 4, 4)), TensorType("float32", (3, 3, 3, 2)), {}, "batch 2 but grid has batch 3"),
    (TensorType("int32", (1, 2, 4, 4)), TensorType("float32", (1, 3, 3, 2)), {}, "floating dtype"),
    (TensorType("float32", (1, 2, 4, 4)), TensorType("float32", (1, 3, 3, 2)), {"mode": "bilinear"}, "one of"),
    (TensorType("float32", (1, 2, 4, 4)), TensorType("float32", (1, 3, 3, 2)), {"padding_mode": "edge"}, "one of"),
])
def test_grid_sample_errors(xt: TensorType, gt: TensorType, attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpBuildError, match=match):
        out_type("grid_sample", xt, gt, **attrs)


def test_grid_sample_types() -> None:
    assert out_type("grid_sample", TensorType("float16", (None, 3, 8, 8)), TensorType("float32", (2, 5, 6, 2))) == \
        TensorType("float16", (2, 3, 5, 6))
    assert out_type("grid_sample", TensorType("float32", None), TensorType("float32", (2, 5, 6, 4, 3))) == \
        TensorType("float32", (2, None, 5, 6, 4))


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
def test_lp_pool_grad(rng: np.random.Generator, p: float) -> None:
    fd_grad_check("lp_pool", [(1, 2, 5, 6)], rng, p=p, kernel_size=(2, 3), stride=(2, 2), padding=((1, 0), (1, 2)),
                  ceil_mode=True)
    fd_grad_check("lp_pool", [(2, 2, 7)], rng, p=p, kernel_size=(3,), stride=(2,), dilation=(2,))


@pytest.mark.parametrize("xs", [(2, 4), (2, 5, 3), (1, 4, 2, 2, 2)])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_lrn_grad(rng: np.random.Generator, xs: tuple[int, ...], size: int) -> None:
    fd_grad_check("lrn", [xs], rng, size=size, alpha=0.3, beta=0.7, bias=1.5)


# ---------------------------------------------------------------- "layer_norm" (more in test_numpy_engine_fused_ops.py)
def layer_norm_ref(x: np.ndarray, scale: Any = None, bias: Any = None, axis: int = -1,
                   epsilon: float = 1e-5) -> np.ndarray:
    axes = tuple(range(axis % x.ndim, x.ndim))
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(axis=axes, keepdims=True)
    y = d / np.sqrt((d * d).mean(axis=axes, keepdims=True) + epsilon)
    return (y * (1 if scale is None else scale) + (0 if bias is None else bias)).astype(x.dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("xs", "axis"), [((3, 8), -1), ((2, 3, 4), 1), ((5,), 0), ((0, 4), -1)])
def test_layer_norm(rng: np.random.Generator, dtype: str, xs: tuple[int, ...], axis: int) -> None:
    x = rand(rng, xs, dtype)
    norm = xs[axis % len(xs):]
    s, b = rand(rng, norm, dtype), rand(rng, norm, dtype)
    check_op("layer_norm", [x], lambda x: layer_norm_ref(x, axis=axis), **tol(dtype), axis=axis)
    check_op("layer_norm", [x, s, b], lambda x, s, b: layer_norm_ref(x, s, b, axis, 1e-3), **tol(dtype), axis=axis,
             epsilon=1e-3)
