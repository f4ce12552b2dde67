"""The compiled depthwise convolution loop (``opgraph.backends.numpy.nn._depthwise_loop``, used by ``conv_nd``
when numba is loaded) against torch in float64: strides, symmetric and asymmetric padding, dilation, 3x3 and 5x5 (and
other) kernels, batch 1 and 2, float32 and float64, ``out=``, non-contiguous inputs; the loop against the
NumPy paths; numba disabled still correct; compiling a graph loads the loop, ``import opgraph`` does not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import opgraph
from opcheck import noncontiguous, torch_depthwise
from opgraph.backends.numpy import nn
from opgraph.backends.numpy.nn import conv_nd
from opgraph.core import accel

torch = pytest.importorskip("torch")
pytest.importorskip("numba")
F = torch.nn.functional



def tol(dtype: Any) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if np.dtype(dtype) == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


@pytest.fixture(autouse=True)
def _numba_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accel, "enabled", True)
    assert nn._depthwise_compiled(1 << 15, load=True) is not None


def case(shape: tuple[int, ...], k: tuple[int, int], dtype: Any, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape).astype(dtype), rng.standard_normal((shape[1], 1, *k)).astype(dtype))


GEOMETRIES = [  # (kernel, stride, padding, dilation)
    ((3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    ((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
    ((3, 3), (2, 2), ((0, 1), (0, 1)), (1, 1)),  # TensorFlow-style "same" for stride 2
    ((3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1)),  # no padding: the input read in place
    ((3, 3), (1, 2), ((2, 0), (1, 3)), (1, 1)),
    ((3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2)),
    ((3, 3), (2, 2), ((2, 1), (3, 2)), (2, 3)),
    ((5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),
    ((5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),
    ((5, 5), (2, 2), ((1, 2), (1, 2)), (1, 1)),
    ((5, 5), (3, 1), ((4, 0), (0, 4)), (1, 2)),
    ((7, 7), (1, 1), ((3, 3), (3, 3)), (1, 1)),  # other widths: one tap at a time
    ((1, 4), (2, 3), ((0, 0), (1, 2)), (1, 1)),
    ((3, 3), (1, 1), ((5, 5), (6, 7)), (1, 1)),  # padding wider than the kernel
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("geo", GEOMETRIES, ids=str)
def test_matches_torch_and_numpy_paths(geo: tuple, batch: int, dtype: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel, stride, padding, dilation = geo
    x, w = case((batch, 32 // batch, 41, 37), kernel, dtype)
    assert nn._depthwise_compiled(x.size) is not None
    got = conv_nd(x, w, stride=stride, padding=padding, dilation=dilation, groups=x.shape[1])
    want = torch_depthwise(x, w, stride, padding, dilation)
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, **tol(dtype))
    monkeypatch.setattr(accel, "enabled", False)
    numpy_path = conv_nd(x, w, stride=stride, padding=padding, dilation=dilation, groups=x.shape[1])
    np.testing.assert_allclose(got, numpy_path, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_out_and_noncontiguous_input(dtype: Any) -> None:
    x, w = case((2, 24, 36, 40), (3, 3), dtype, seed=1)
    geo = {"stride": (2, 2), "padding": ((1, 0), (0, 1)), "dilation": (1, 1), "groups": 24}
    want = torch_depthwise(x, w, geo["stride"], geo["padding"], geo["dilation"])
    out = np.full(want.shape, np.nan, dtype)
    assert conv_nd(noncontiguous(x), noncontiguous(w), out, **geo) is out
    np.testing.assert_allclose(out, want, **tol(dtype))
    strided_out = np.full((*want.shape[:-1], 2 * want.shape[-1]), np.nan, dtype)[..., ::2]
    assert conv_nd(x.transpose(0, 1, 3, 2).swapaxes(2, 3), w, strided_out, **geo) is strided_out
    np.testing.assert_allclose(strided_out, want, **tol(dtype))


def test_float16_computed_in_float32() -> None:
    x, w = case((1, 32, 40, 40), (3, 3), np.float16, seed=2)
    got = conv_nd(x, w, stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=32)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, torch_depthwise(x, w, (1, 1), ((1, 1), (1, 1)), (1, 1)), rtol=2e-2, atol=5e-2)


def test_numba_disabled_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accel, "enabled", False)
    assert nn._depthwise_compiled(1 << 20, load=True) is None
    for kernel in [(3, 3), (5, 5)]:
        x, w = case((1, 40, 30, 30), kernel, np.float64, seed=3)
        pad = ((kernel[0] // 2,) * 2,) * 2
        got = conv_nd(x, w, stride=(2, 2), padding=pad, dilation=(1, 1), groups=40)
        np.testing.assert_allclose(got, torch_depthwise(x, w, (2, 2), pad, (1, 1)), **tol(np.float64))


def test_small_inputs_keep_the_numpy_paths() -> None:
    x, w = case((1, 4, 8, 8), (3, 3), np.float32)
    assert nn._depthwise_compiled(x.size) is None
    got = conv_nd(x, w, stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=4)
    np.testing.assert_allclose(got, torch_depthwise(x, w, (1, 1), ((1, 1), (1, 1)), (1, 1)), **tol(np.float32))


@pytest.mark.parametrize("kind", ["conv2d", "conv"])
def test_compiled_graph_uses_the_loop(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling a graph with a large depthwise convolution (writing into a buffer the program owns, as inside a
    model) loads the loop (specialize); results match torch, also for the unbatched conv2d form."""
    monkeypatch.setattr(nn, "_depthwise_jit", None)
    x, w = case((1, 48, 28, 28), (3, 3), np.float32, seed=4)
    b = opgraph.GraphBuilder()
    xv, wv = b.input(("float32", x.shape), name="x"), b.input(("float32", w.shape), name="w")
    if kind == "conv2d":
        y = b.op("conv2d", xv, wv, stride=(2, 2), padding=(0, 1, 0, 1), groups=48)
    else:
        y = b.op("conv", xv, wv, stride=(2, 2), padding=((0, 1), (0, 1)), groups=48)
    b.output(b.op("relu", y))
    (got,) = opgraph.compile(b.freeze())(x=x, w=w)
    assert nn._depthwise_jit
    want = torch_depthwise(x, w, (2, 2), ((0, 1), (0, 1)), (1, 1))
    np.testing.assert_allclose(got, np.maximum(want, 0), **tol(np.float32))
    if kind == "conv2d":
        unbatched = nn._conv2d_kernel(x[0], w, stride=(2, 2), padding=(0, 1, 0, 1), dilation=(1, 1), groups=48)
        np.testing.assert_allclose(unbatched, want[0], **tol(np.float32))


@pytest.mark.parametrize("kind", ["conv2d", "conv"])
def test_specialize_loads_the_loop_for_large_depthwise_only(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from opgraph.core.types import TensorType

    specialize = opgraph.backends.numpy.BACKEND.kernel_for(kind, 1).specialize
    attrs = {"groups": 48}
    monkeypatch.setattr(nn, "_depthwise_jit", None)
    for x, w, groups in [((1, 48, 20, 20), (48, 1, 3, 3), 48),  # too small
                         ((1, 48, 56, 56), (96, 1, 3, 3), 48),  # channel multiplier 2
                         ((1, 48, 56, 56), (48, 48, 3, 3), 1)]:  # not grouped
        assert specialize([TensorType("f4", x), TensorType("f4", w)], [], {**attrs, "groups": groups}) is None
        assert nn._depthwise_jit is None
    assert specialize([TensorType("f8", (1, 48, 56, 56)), TensorType("f8", (48, 1, 5, 5))], [], attrs) is None
    assert nn._depthwise_jit


def test_import_does_not_load_numba() -> None:
    code = "import sys, opgraph\nprint('numba' in sys.modules)\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OPGRAPH_NUMBA": "1"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
