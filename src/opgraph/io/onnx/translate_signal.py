"""ONNX -> opgraph translators: BitCast, and the signal ops DFT, STFT and MelWeightMatrix.

ONNX has no complex tensors: a complex signal is a float tensor with a trailing
dimension of 2 (real, imaginary), a real one may carry a trailing dimension
of 1. The translators turn such a tensor into an opgraph complex tensor
(complex64 for float16/float32, complex128 for float64), transform it with the
``fft``/``rfft``/``irfft`` ops of :mod:`opgraph.ops.signal`, and lay the result
out again as ONNX expects, in the input's float dtype. Lengths, steps and axes
must be known while importing; the backend specialises the graph on them when
they are graph inputs.

    >>> import numpy as np
    >>> from onnx import helper, TensorProto
    >>> from opgraph.io.onnx import from_onnx
    >>> node = helper.make_node("DFT", ["x"], ["y"], axis=1, onesided=1)
    >>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 1))],
    ...                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 3, 2))])
    >>> g = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    >>> g.run({"x": np.array([1, 2, 3, 4], dtype=np.float32).reshape(1, 4, 1)})[0][0]
    array([[10.,  0.],
           [-2.,  2.],
           [-2.,  0.]], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from opgraph.io.onnx._core import Node, np_dtype, translates


# ---------------------------------------------------------------- BitCast
@translates("BitCast")
def _bitcast(node: Node, x: Any) -> Any:
    # ONNX reads the bytes as little endian, NumPy in native order: the same on every platform opgraph runs on.
    return node.op("bitcast", x, dtype=np_dtype(node.attr("to"), node.label).name)


# ---------------------------------------------------------------- complex layout
def _complex_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.complex128) if dtype == np.float64 else np.dtype(np.complex64)


def _check_layout(node: Node, shape: tuple[int, ...], what: str = "input") -> None:
    if len(shape) < 2 or shape[-1] not in (1, 2):
        raise node.error(f"{what} must end in a dimension of 1 (real) or 2 (complex: real, imaginary), "
                         f"got shape {shape}")


def _real_part(node: Node, x: Any) -> Any:
    """The real signal of an ONNX tensor ``[..., 1]`` (or the real parts of ``[..., 2]``)."""
    return node.op("getitem", x, index=(Ellipsis, 0))


def _as_complex(node: Node, x: Any) -> Any:
    """An ONNX signal ``[..., 1]`` or ``[..., 2]`` as an opgraph complex tensor ``[...]``."""
    cdt = _complex_dtype(node.dtype(x))
    re = node.cast(_real_part(node, x), cdt)
    if node.shape(x)[-1] == 1:
        return re
    im = node.cast(node.op("getitem", x, index=(Ellipsis, 1)), cdt)
    # re + 1j * im: exact for finite values (an infinite imaginary part makes the real part NaN, but a
    # transform of a signal holding infinities is NaN there anyway).
    return node.op("add", re, node.op("multiply", im, node.const(np.array(1j, dtype=cdt))))


def _interleave(node: Node, y: Any, dtype: np.dtype) -> Any:
    """A complex tensor ``[...]`` as ONNX's ``[..., 2]`` of ``dtype``."""
    parts = node.op("stack", node.op("real", y), node.op("imag", y), axis=-1)
    return node.cast(parts, dtype)


def _onesided(node: Node, y: Any, axis: int, n: int) -> Any:
    """The first ``n // 2 + 1`` bins along ``axis`` (the non-redundant half of a real signal's spectrum)."""
    return node.op("getitem", y, index=(slice(None),) * axis + (slice(0, n // 2 + 1),))


def _static_int(node: Node, index: int, what: str, low: int = 1) -> int:
    value = np.asarray(node.static(index, what))
    if value.size != 1 or value.dtype.kind not in "iu":
        raise node.error(f"{what} must be an integer scalar, got {value!r}")
    n = int(value.reshape(-1)[0])
    if n < low:
        raise node.error(f"{what} must be >= {low}, got {n}")
    return n


# ---------------------------------------------------------------- DFT
def _dft_axis(node: Node, rank: int) -> int:
    # Opset 20 moved the axis from an attribute (default 1) to an input (default -2); read what the node has.
    if node.has_input(2):
        axis = int(np.asarray(node.static(2, "axis")).reshape(-1)[0])
    elif "axis" in node.attrs:
        axis = int(node.attr("axis"))
    else:
        axis = -2 if node.opset >= 20 else 1
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise node.error(f"axis {axis} is out of range for rank {rank} (the last dimension holds the complex parts)")
    return axis % rank


@translates("DFT")
def _dft(node: Node, x: Any, dft_length: Any = None, axis: Any = None) -> Any:
    shape = node.shape(x)
    _check_layout(node, shape)
    ax = _dft_axis(node, len(shape))
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    n = _static_int(node, 1, "dft_length") if node.has_input(1) else None
    dtype = node.dtype(x)
    if onesided and inverse:
        y = node.op("irfft", _as_complex(node, x), axis=ax, n=n)
        return node.cast(node.op("expand_dims", y, axis=len(shape) - 1), dtype)
    if onesided and shape[-1] == 1:
        return _interleave(node, node.op("rfft", _real_part(node, x), axis=ax, n=n), dtype)
    y = node.op("fft", _as_complex(node, x), axis=ax, n=n, inverse=inverse)
    if onesided:
        # ONNX's reference takes the first half of a complex input's full transform (ONNX Runtime refuses it).
        y = _onesided(node, y, ax, shape[ax] if n is None else n)
    return _interleave(node, y, dtype)


# ---------------------------------------------------------------- STFT
@translates("STFT")
def _stft(node: Node, signal: Any, frame_step: Any, window: Any = None, frame_length: Any = None) -> Any:
    shape = node.shape(signal)
    if len(shape) == 2:  # [batch, length]: a real signal without the trailing 1 (ONNX Runtime takes it too)
        signal = node.op("expand_dims", signal, axis=2)
        shape = (*shape, 1)
    if len(shape) != 3:
        raise node.error(f"signal must have shape [batch, length, 1 or 2], got {shape}")
    _check_layout(node, shape, "signal")
    length = shape[1]
    step = _static_int(node, 1, "frame_step")
    if node.has_input(3):
        frame = _static_int(node, 3, "frame_length")
    elif window is not None:
        frame = node.shape(window)[0]
    else:
        frame = length
    if window is not None and node.shape(window) != (frame,):
        raise node.error(f"window must have shape ({frame},) (the frame length), got {node.shape(window)}")
    if not 1 <= frame <= length:
        raise node.error(f"frame_length {frame} must be in [1, {length}] (the signal's length)")
    frames = (length - frame) // step + 1
    dtype = node.dtype(signal)
    real = shape[-1] == 1
    x = _real_part(node, signal) if real else _as_complex(node, signal)
    # One take gathers every frame: index [f, j] reads sample f * step + j, giving [batch, frames, frame].
    starts = np.arange(frames, dtype=np.int64)[:, None] * step + np.arange(frame, dtype=np.int64)
    x = node.op("take", x, node.const(starts), axis=1)
    if window is not None:
        x = node.op("multiply", x, node.cast(window, node.dtype(x)))
    onesided = bool(node.attr("onesided", 1))
    if real and onesided:
        y = node.op("rfft", x, axis=2)
    else:
        y = node.op("fft", node.cast(x, _complex_dtype(dtype)), axis=2)
        if onesided:  # a complex signal: keep the first half as ONNX Runtime does
            y = _onesided(node, y, 2, frame)
    return _interleave(node, y, dtype)


# ---------------------------------------------------------------- MelWeightMatrix
def mel_weight_matrix(num_mel_bins: Any, dft_length: Any, sample_rate: Any, lower_edge_hertz: Any,
                      upper_edge_hertz: Any) -> np.ndarray:
    """ONNX MelWeightMatrix: ``[dft_length // 2 + 1, num_mel_bins]`` triangular filters, in float64.

    The arithmetic follows ONNX's reference implementation step by step, in the arguments' own dtypes
    (pass NumPy scalars), so the bin edges, which are rounded down, come out identical.

    >>> import numpy as np
    >>> w = mel_weight_matrix(np.int32(8), np.int32(16), np.int32(8192), np.float32(0), np.float32(4096))
    >>> w.shape, w.sum(axis=0)
    ((9, 8), array([2., 2., 1., 1., 1., 1., 0., 0.]))
    """
    bins = dft_length // 2 + 1
    edges = np.arange(0, num_mel_bins + 2)
    low_mel = 2595 * np.log1p(lower_edge_hertz / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper_edge_hertz / 700) / np.log(10)
    mel_step = (high_mel - low_mel) / edges.shape[0]
    hertz = 700 * np.expm1((edges * mel_step + low_mel) / 2595 * np.log(10))
    edges = (((dft_length + 1) * hertz) // sample_rate).astype(int)
    # Filter i rises from edges[i] to its peak at edges[i + 1] and falls to just before edges[i + 2].
    if edges.min() < 0 or edges[1:-1].max() >= bins or edges[-1] > bins:
        raise ValueError(f"the filters' edges (DFT bins {edges.min()}..{edges.max()}) fall outside the {bins} "
                         "one-sided bins: the edge frequencies must lie in [0, sample_rate / 2]")
    out = np.zeros((int(bins), int(num_mel_bins)))
    for i in range(int(num_mel_bins)):
        left, center, right = (int(e) for e in edges[i:i + 3])
        if center == left:
            out[center, i] = 1
        else:
            out[left:center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    return out


@translates("MelWeightMatrix")
def _mel_weight_matrix(node: Node, *inputs: Any) -> Any:
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    # The arguments as NumPy scalars of their ONNX dtypes: the reference's rounding depends on them.
    args = [np.asarray(node.static(i, name)).reshape(-1)[0] for i, name in enumerate(names)]
    if int(args[0]) < 1 or int(args[1]) < 1 or int(args[2]) < 1:
        raise node.error(f"num_mel_bins, dft_length and sample_rate must be >= 1, got {[int(a) for a in args[:3]]}")
    dtype = np_dtype(node.attr("output_datatype", onnx.TensorProto.FLOAT), node.label)
    try:
        weights = mel_weight_matrix(*args)
    except ValueError as exc:
        raise node.error(str(exc)) from None
    return node.const(weights.astype(dtype))
