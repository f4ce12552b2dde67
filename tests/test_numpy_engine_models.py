"""NumPy engine kernels tuned on real architectures, and small ONNX-exported blocks of those architectures.

* The banded path of ``conv_nd`` for depthwise 2-d convolutions with kernels 5 and 7 wide (ConvNeXt,
  EfficientNet) against torch's convolution in float64: strides, dilations, asymmetric padding, ragged
  tiles, several channel chunks, batch > 1, float32 / float64, ``out=`` given, and the old path.
* softmax's row sums by a product with ones against SciPy's softmax (float64), incl. rows with -inf,
  other axes, rows too long for the fast path, ``out=`` given.
* mean over a last axis by a product with ones against ``np.mean`` in float64.
* A transformer encoder block and a MobileNetV3 / EfficientNet-style block exported by
  ``torch.onnx.export``, imported with ``from_onnx`` and compiled at levels 0 and 2, against torch.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

import opgraph
import opgraph.backends.numpy.nn as nn_ops
import opgraph.backends.numpy.reduction as red_ops
from opcheck import torch_depthwise
from opgraph.backends.numpy.nn import conv_nd

torch = pytest.importorskip("torch")
F = torch.nn.functional



DW_CASES = [  # (x shape, kernel, stride, padding, dilation)
    ((1, 8, 56, 56), (7, 7), (1, 1), ((3, 3), (3, 3)), (1, 1)),  # ConvNeXt: tiles of 14
    ((1, 16, 7, 7), (7, 7), (1, 1), ((3, 3), (3, 3)), (1, 1)),  # one tile as wide as the output
    ((2, 5, 20, 23), (5, 5), (2, 2), ((2, 1), (1, 2)), (1, 1)),  # EfficientNet's stride 2, asymmetric padding
    ((1, 6, 19, 37), (5, 7), (1, 2), ((0, 3), (3, 0)), (2, 1)),  # ragged last tile, dilation, rectangular
    ((1, 3, 12, 40), (3, 5), (1, 1), ((1, 1), (2, 2)), (1, 3)),  # a 3-tall kernel, 5 wide, dilated
    ((3, 4, 9, 9), (5, 5), (1, 1), ((0, 0), (0, 0)), (1, 1)),  # no padding, batch 3
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", DW_CASES)
def test_depthwise_banded_matches_torch(case: Any, dtype: Any) -> None:
    xs, kernel, stride, padding, dilation = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((xs[1], 1, *kernel)).astype(dtype)
    want = torch_depthwise(x, w, stride, padding, dilation)
    got = conv_nd(x, w, stride=stride, padding=padding, dilation=dilation, groups=xs[1])
    assert got.dtype == dtype and got.shape == want.shape
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    out = np.full(want.shape, np.nan, dtype)  # out= given: written in place
    assert conv_nd(x, w, out, stride=stride, padding=padding, dilation=dilation, groups=xs[1]) is out
    np.testing.assert_array_equal(out, got)
    out64 = np.empty(want.shape, np.float64)  # an out of another dtype: a cast copy
    conv_nd(x, w, out64, stride=stride, padding=padding, dilation=dilation, groups=xs[1])
    np.testing.assert_array_equal(out64, got.astype(np.float64))


def test_depthwise_banded_chunks_and_views(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several channel chunks (a tiny column budget) and a non-contiguous input give the same result; and
    the banded path agrees with the old im2col path within float32 rounding."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 10, 30, 60), dtype=np.float32)[:, :, :, ::2]
    w = rng.standard_normal((10, 1, 7, 7), dtype=np.float32)
    kw: dict[str, Any] = {"stride": (1, 1), "padding": ((3, 3), (3, 3)), "dilation": (1, 1), "groups": 10}
    want = torch_depthwise(x, w, **{k: v for k, v in kw.items() if k != "groups"})
    whole = conv_nd(x, w, **kw)
    monkeypatch.setattr(nn_ops, "_COLS_BYTES", 4096)
    chunked = conv_nd(x, w, **kw)
    np.testing.assert_array_equal(chunked, whole)
    np.testing.assert_allclose(whole, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    monkeypatch.setattr(nn_ops, "_BANDED_MIN_WIDTH", 10**9)
    old = conv_nd(x, w, **kw)
    np.testing.assert_allclose(whole, old, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_depthwise_float16_and_empty() -> None:
    x = np.random.default_rng(2).standard_normal((1, 4, 9, 9)).astype(np.float16)
    w = np.random.default_rng(3).standard_normal((4, 1, 5, 5)).astype(np.float16)
    got = conv_nd(x, w, stride=(1, 1), padding=((2, 2), (2, 2)), dilation=(1, 1), groups=4)
    want = torch_depthwise(x, w, (1, 1), ((2, 2), (2, 2)), (1, 1))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    empty = conv_nd(np.zeros((0, 4, 9, 9), np.float32), w.astype(np.float32), stride=(1, 1),
                    padding=((2, 2), (2, 2)), dilation=(1, 1), groups=4)
    assert empty.shape == (0, 4, 9, 9)


# ---------------------------------------------------------------- softmax and mean
def scipy_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    special = pytest.importorskip("scipy.special")
    return special.softmax(np.asarray(x, np.float64), axis=axis)  # type: ignore[no-any-return]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axis", [((2, 3, 49, 49), 3), ((4, 197), -1), ((5, 7, 3), 1), ((2, 5000), 1),
                                        ((3, 1), 1), ((0, 4), 1)])
def test_softmax_matches_scipy(shape: tuple[int, ...], axis: int, dtype: Any) -> None:
    kernel = nn_ops.softmax
    x = (np.random.default_rng(4).standard_normal(shape) * 4).astype(dtype)
    if x.size:
        x.reshape(-1)[::7] = -np.inf  # masked attention positions
    want = scipy_softmax(x, axis)
    got = kernel(x, axis=axis)
    assert got.dtype == dtype
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(got, want, rtol=tol * 4, atol=tol)
    out = np.empty(shape, dtype)
    assert kernel(x, out, axis=axis) is out
    np.testing.assert_array_equal(out, got)
    inplace = x.copy()  # the engine runs softmax in place
    kernel(inplace, inplace, axis=axis)
    np.testing.assert_array_equal(inplace, got)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axis,keepdims", [((3136, 96), (1,), True), ((1, 197, 768), (2,), True),
                                                 ((4, 6, 5), (-1,), False), ((6, 2000), (1,), True),
                                                 ((6, 5), (0,), True), ((2, 3, 4), (1, 2), False),
                                                 ((1, 40, 14, 14), (2, 3), True), ((1, 8, 40, 40), (3, 2), True),
                                                 ((2, 3, 4), (0, 2), True)])
def test_mean_matches_numpy(shape: tuple[int, ...], axis: tuple[int, ...], keepdims: bool, dtype: Any) -> None:
    kernel = red_ops.mean
    x = np.random.default_rng(5).standard_normal(shape).astype(dtype) + 3
    want = np.mean(x.astype(np.float64), axis=axis, keepdims=keepdims)
    out = np.empty(want.shape, dtype)
    assert kernel(x, out, axis=axis, keepdims=keepdims) is out
    tol = 2e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(out, want, rtol=tol)
    np.testing.assert_allclose(kernel(x, axis=axis, keepdims=keepdims), want, rtol=tol)
    strided = np.repeat(x, 2, axis=-1)[..., ::2]  # non-contiguous: NumPy's reduction
    np.testing.assert_allclose(kernel(strided, np.empty(want.shape, dtype), axis=axis, keepdims=keepdims), want,
                               rtol=tol)


def test_row_product_falls_back() -> None:
    x = np.arange(12.0).reshape(3, 4)
    out = np.empty((3, 1))
    assert not red_ops.rows_by_product(x, (0,), np.empty((1, 4)))
    assert not red_ops.rows_by_product(x.astype(np.int64), (1,), out)
    assert red_ops.rows_by_product(x, (-1,), out)
    np.testing.assert_array_equal(out.ravel(), x.sum(axis=1))
    assert not red_ops.rows_by_product(x.reshape(3, 2, 2), (0, 2), out)
    assert not red_ops.rows_by_product(np.zeros((2, 40, 40)), (1, 2), np.empty(2))  # rows over the bound


# ---------------------------------------------------------------- exported blocks through the engine
def exported(model: Any, x: Any) -> Any:
    onnx = pytest.importorskip("onnx")
    from opgraph.io.onnx import from_onnx

    f = io.BytesIO()
    with torch.inference_mode():
        torch.onnx.export(model, (x,), f, dynamo=False, opset_version=18, input_names=["x"], output_names=["y"])
    return from_onnx(onnx.load_from_string(f.getvalue()))


def run_levels(model: Any, x: Any, rtol: float, atol: float) -> None:
    graph = exported(model, x)
    with torch.inference_mode():
        want = model(x).numpy()
    for level in (0, 2):
        g = graph if level == 0 else opgraph.optimize(graph, level=level)
        fn = opgraph.compile(g, backend="numpy")
        for _ in range(2):  # a second call reuses the planned buffers
            (got,) = fn({"x": x.numpy()})
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


class EncoderBlock(torch.nn.Module):  # type: ignore[misc]
    """ViT / BERT style, written out (torch's fused encoder layer does not export): layer norm, attention
    with a (B, H, T, D) @ (B, H, D, T) product and a softmax over rows of T, a GELU MLP, residuals."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        nn = torch.nn
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: Any) -> Any:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class InvertedResidual(torch.nn.Module):  # type: ignore[misc]
    """MobileNetV3 / EfficientNet style: 1x1 expand, 5x5 and 7x7 depthwise, squeeze-excitation, hardswish and
    SiLU, 1x1 project, residual; and a ConvNeXt-style 7x7 depthwise followed by a channels-last layer norm."""

    def __init__(self, c: int = 16, e: int = 48) -> None:
        super().__init__()
        nn = torch.nn
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.Hardswish())
        self.dw5 = nn.Sequential(nn.Conv2d(e, e, 5, 1, 2, groups=e, bias=False), nn.BatchNorm2d(e), nn.SiLU())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(e, 8, 1), nn.ReLU(), nn.Conv2d(8, e, 1),
                                nn.Hardsigmoid())
        self.project = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))
        self.dw7 = nn.Conv2d(c, c, 7, 2, 3, groups=c)
        self.norm = nn.LayerNorm(c)

    def forward(self, x: Any) -> Any:
        h = self.dw5(self.expand(x))
        h = self.project(h * self.se(h)) + x
        return self.norm(self.dw7(h).permute(0, 2, 3, 1))


def test_encoder_block_from_onnx() -> None:
    torch.manual_seed(0)
    model = EncoderBlock().eval()
    run_levels(model, torch.randn(2, 50, 64), rtol=1e-4, atol=1e-5)


def test_inverted_residual_block_from_onnx() -> None:
    torch.manual_seed(0)
    model = InvertedResidual().eval()
    with torch.no_grad():  # BatchNorm statistics away from the identity
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    run_levels(model, torch.randn(1, 16, 28, 28), rtol=1e-4, atol=1e-5)
