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
