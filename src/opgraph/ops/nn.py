"""Neural-network ops: relu, softmax, log_softmax, conv2d, max_pool2d, avg_pool2d, and the N-d ONNX-style
conv, conv_transpose, max_pool, max_pool_argmax, avg_pool, lp_pool, lrn, resize and grid_sample.

Layouts follow PyTorch: images are ``(N, C, H, W)`` (or unbatched
``(C, H, W)``), convolution weights ``(O, C // groups, kH, kW)``; output
sizes, padding and ``count_include_pad`` mean what they mean in
``torch.nn.functional``. Kernels are vectorised NumPy: conv2d and conv share
one reference kernel (:func:`conv_nd`, a sum over sliding windows; the NumPy
engine runs its own im2col kernel, :mod:`opgraph.backends.numpy.nn`); pooling
combines the kH*kW strided taps of the padded input.
Ids 800-899.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (None, 3, 32, 32)), name="x")
    >>> w = b.input(("float32", (8, 3, 3, 3)), name="w")
    >>> y = b.op("conv2d", x, w, stride=2, padding=1)
    >>> y.type
    f32[?,8,16,16]
    >>> b.op("max_pool2d", b.op("relu", y), kernel_size=2).type
    f32[?,8,8,8]
    >>> s = b.input(("float64", (2, 4)), name="s")
    >>> b.run({s: np.log([[1., 1., 2., 4.], [1., 3., 2., 2.]])}, [b.op("softmax", s)])[0]
    array([[0.125, 0.125, 0.25 , 0.5  ],
           [0.125, 0.375, 0.25 , 0.25 ]])

The N-d ops (ids 806-814) follow ONNX instead, for an ONNX importer: inputs are
``(N, C, *spatial)`` with 1 to 3 spatial axes, every per-axis attribute has one
entry per spatial axis, ``padding`` is one ``(begin, end)`` pair per spatial axis
(ONNX's ``pads`` regrouped), and an omitted stride or dilation is 1 (also for the
pools, as in ONNX):

    >>> v = b.input(("float64", (1, 1, 5)), name="v")
    >>> feed = {v: np.array([[[1., 5., 2., 4., 3.]]])}
    >>> b.run(feed, [b.op("max_pool", v, kernel_size=(2,), stride=(2,), padding=((0, 0),), ceil_mode=True)])[0]
    array([[[5., 4., 3.]]])
    >>> b.run(feed, [b.op("max_pool_argmax", v, kernel_size=(3,), padding=((1, 1),))])[0]
    array([[[1, 1, 1, 3, 3]]])
    >>> b.run(feed, [b.op("avg_pool", v, kernel_size=(2,), stride=(2,), padding=((1, 0),))])[0]
    array([[[1. , 3.5, 3.5]]])
    >>> b.run(feed, [b.op("conv", v, b.constant(np.array([[[1., -1.]]])), dilation=(2,))])[0]
    array([[[-1.,  1., -1.]]])
    >>> b.run(feed, [b.op("conv_transpose", v, b.constant(np.array([[[1., 1.]]])), stride=(2,))])[0]
    array([[[1., 1., 5., 5., 2., 2., 4., 4., 3., 3.]]])
    >>> r = b.op("resize", v, sizes=(1, 1, 3), mode="linear", coordinate_transformation_mode="align_corners")
    >>> b.run(feed, [r])[0]
    array([[[1., 2., 3.]]])
    >>> b.op("lrn", x, size=3).type, b.op("lp_pool", x, p=2.0, kernel_size=(2, 2), stride=(2, 2)).type
    (f32[?,3,32,32], f32[?,3,16,16])
    >>> grid = b.constant(np.array([[[-1.0], [0.0], [0.25]]]))  # (N, out, 1): normalised positions along v
    >>> b.run(feed, [b.op("grid_sample", v, grid, align_corners=True)])[0]
    array([[[1., 2., 3.]]])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from opgraph.core.registry import (
    Attr,
    Emit,
    OpDef,
    attr_bool,
    attr_float,
    attr_int,
    attr_ints,
    attr_str,
    mark_traits,
    optional,
    register_op,
    set_rules,
)
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import OpTypeError
from opgraph.ops._common import const_like, normalize_axis, tensor, version_of_first, write_out
from opgraph.ops.batch_helpers import all_batched, batch_axis, broadcast_batch, example_ndim
from opgraph.ops.grad_helpers import dilate, mask, no_grad, scalar, static_shape
from opgraph.ops.jvp_helpers import linear, multilinear

FAMILY = "nn"

Pair = tuple[int, int]
Padding = tuple[int, int] | tuple[int, int, int, int]


# ---------------------------------------------------------------- attributes
def _pair(v: Any, what: str, minimum: int) -> Pair:
    vals = attr_ints(v)
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2:
        raise OpTypeError(f"expected an int or a pair of ints for {what}, got {v!r}")
    if any(x < minimum for x in vals):
        raise OpTypeError(f"{what} must be >= {minimum}, got {v!r}")
    return (vals[0], vals[1])


def attr_pair(v: Any) -> Pair:
    """Normalise a positive ``(h, w)`` attribute (stride, dilation, kernel size); an int means both.

    >>> attr_pair(2), attr_pair([1, 3])
    ((2, 2), (1, 3))
    """
    return _pair(v, "a size, stride or dilation", 1)


def attr_padding(v: Any) -> Padding:
    """Normalise padding: an int, ``(pad_h, pad_w)`` or ``(top, bottom, left, right)``.

    Symmetric padding is stored as a pair, so equal paddings have one spelling.

    >>> attr_padding(1), attr_padding((1, 2)), attr_padding((1, 1, 2, 2)), attr_padding((0, 1, 0, 0))
    ((1, 1), (1, 2), (1, 2), (0, 1, 0, 0))
    """
    vals = attr_ints(v)
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) not in (2, 4):
        raise OpTypeError(f"padding must be an int, (pad_h, pad_w) or (top, bottom, left, right), got {v!r}")
    if any(x < 0 for x in vals):
        raise OpTypeError(f"padding must be >= 0, got {v!r}")
    if len(vals) == 4 and vals[0] == vals[1] and vals[2] == vals[3]:
        vals = (vals[0], vals[2])
    return vals  # type: ignore[return-value]


def _attr_groups(v: Any) -> int:
    groups = attr_int(v)
    if groups < 1:
        raise OpTypeError(f"groups must be >= 1, got {v!r}")
    return groups


def pad4(padding: Padding) -> tuple[int, int, int, int]:
    """Padding as ``(top, bottom, left, right)``.

    >>> pad4((1, 2)), pad4((0, 1, 2, 3))
    ((1, 1, 2, 2), (0, 1, 2, 3))
    """
    if len(padding) == 2:
        return (padding[0], padding[0], padding[1], padding[1])
    return tuple(padding)  # type: ignore[return-value]


def conv_output_size(size: int | None, kernel: int | None, stride: int = 1, pad_lo: int = 0, pad_hi: int = 0,
                     dilation: int = 1) -> int | None:
    """Output length of a convolution or pooling along one axis (PyTorch's formula), None if unknown.

    Raises :class:`~opgraph.errors.OpTypeError` when the (dilated) kernel is
    larger than the padded input.

    >>> conv_output_size(32, 3, stride=2, pad_lo=1, pad_hi=1)
    16
    >>> conv_output_size(None, 3) is None
    True
    """
    if size is None or kernel is None:
        return None
    span = dilation * (kernel - 1) + 1
    padded = size + pad_lo + pad_hi
    if padded < span:
        raise OpTypeError(f"kernel size {kernel} (dilated: {span}) is larger than the padded input size {padded}")
    return (padded - span) // stride + 1


# ---------------------------------------------------------------- helpers
def _float_dtype(t: TensorType, what: str = "input") -> np.dtype:
    if t.dtype.kind != "f":
        raise OpTypeError(f"{what} must have a floating dtype, got {t.dtype}")
    return t.dtype


def _work_dtype(dt: np.dtype) -> np.dtype:
    # float16 is computed in float32 (as PyTorch does on CPU) and rounded once at the end.
    return np.dtype(np.float32) if dt == np.float16 else dt


def _pad_hw(x: np.ndarray, pads: tuple[int, int, int, int], fill: Any) -> np.ndarray:
    top, bottom, left, right = pads
    if not any(pads):
        return x
    width = [(0, 0)] * (x.ndim - 2) + [(top, bottom), (left, right)]
    return np.pad(x, width, mode="constant", constant_values=fill)


def _spatial(x: TensorType, what: str = "input") -> tuple[int | None, ...] | None:
    """The shape of an image input, checked to be (N, C, H, W) or (C, H, W)."""
    if x.shape is None:
        return None
    if len(x.shape) not in (3, 4):
        raise OpTypeError(f"{what} must be (N, C, H, W) or (C, H, W), got rank {len(x.shape)}")
    return x.shape


# ---------------------------------------------------------------- relu
def _relu_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    (t,) = (tensor(x) for x in in_types)
    if t.dtype.kind not in "iuf":
        raise OpTypeError(f"relu needs an integer or floating dtype, got {t.dtype}")
    return (t,)


def _relu_kernel(x: np.ndarray, out: Any = None) -> np.ndarray:
    return np.maximum(x, 0, out=out)


# ---------------------------------------------------------------- gradient rules
# rule(b, inputs, outputs, cotangents, attrs) -> cotangents of the inputs (see opgraph.ops.grad_helpers).
# relu'(0) = 0 (JAX, PyTorch); max_pool2d splits the gradient evenly between tied maxima of a window.
def _relu_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    return [mask(b, b.op("greater", x, scalar(b, 0.0, x)), cots[0])]


def _softmax_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    y, g = outs[0], cots[0]
    gy = b.op("multiply", g, y)
    return [b.op("subtract", gy, b.op("multiply", y, b.op("sum", gy, axis=attrs["axis"], keepdims=True)))]


def _log_softmax_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    y, g = outs[0], cots[0]
    return [b.op("subtract", g, b.op("multiply", b.op("exp", y), b.op("sum", g, axis=attrs["axis"], keepdims=True)))]


def _conv_input_grad(b: Any, g: Any, w: Any, x_shape: tuple[int, ...], stride: Pair, padding: Padding,
                     dilation: Pair, groups: int) -> Any:
    """Cotangent of conv2d's x (N, C, H, W): a stride-1 convolution of the dilated cotangent with the
    flipped, transposed kernel, then the padding cropped off."""
    o, cg, kh, kw = static_shape(w.type)
    top, bottom, left, right = pad4(padding)
    hp, wp = x_shape[2] + top + bottom, x_shape[3] + left + right
    gd = dilate(b, dilate(b, g, 2, stride[0]), 3, stride[1])
    ph, pw_ = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
    gh, gw = static_shape(gd.type)[2:]
    extra_h, extra_w = hp - (gh + ph), wp - (gw + pw_)
    wt = b.op("reshape", w, shape=(groups, o // groups, cg, kh, kw))
    wt = b.op("permute_dims", wt, axes=(0, 2, 1, 3, 4))
    wt = b.op("flip", b.op("reshape", wt, shape=(groups * cg, o // groups, kh, kw)), axis=(2, 3))
    gxp = b.op("conv2d", gd, wt, padding=(ph, ph + extra_h, pw_, pw_ + extra_w), dilation=dilation, groups=groups)
    if top or bottom or left or right:
        gxp = b.op("getitem", gxp, index=(slice(None), slice(None), slice(top, top + x_shape[2]),
                                          slice(left, left + x_shape[3])))
    return gxp


def _batched(b: Any, x: Any) -> Any:
    return b.op("expand_dims", x, axis=0) if len(static_shape(x.type)) == 3 else x


def _conv2d_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x, w = ins
    unbatched = len(static_shape(x.type)) == 3
    xb, g = _batched(b, x), _batched(b, cots[0])
    x_shape = static_shape(xb.type)
    n = x_shape[0]
    o, cg, kh, kw = static_shape(w.type)
    groups, stride, dilation = attrs["groups"], attrs["stride"], attrs["dilation"]
    gx = _conv_input_grad(b, g, w, x_shape, stride, attrs["padding"], dilation, groups)
    if unbatched:
        gx = b.op("squeeze", gx, axis=0)
    # Weight cotangent: correlate the padded x with the cotangent, with batch and channels swapped.
    top, bottom, left, right = pad4(attrs["padding"])
    xp = b.op("pad", xb, pad_width=((0, 0), (0, 0), (top, bottom), (left, right))) if top or bottom or left \
        or right else xb
    hp, wp = static_shape(xp.type)[2:]
    ho, wo = static_shape(g.type)[2:]
    xt = b.op("reshape", b.op("permute_dims", b.op("reshape", xp, shape=(n, groups, cg, hp, wp)), axes=(2, 1, 0, 3, 4)),
              shape=(cg, groups * n, hp, wp))
    gt = b.op("reshape", b.op("permute_dims", b.op("reshape", g, shape=(n, groups, o // groups, ho, wo)),
                              axes=(1, 2, 0, 3, 4)), shape=(o, n, ho, wo))
    gw = b.op("conv2d", xt, gt, stride=dilation, dilation=stride, groups=groups)
    gw = b.op("getitem", gw, index=(slice(None), slice(None), slice(0, kh), slice(0, kw)))
    gw = b.op("permute_dims", gw, axes=(1, 0, 2, 3))
    if gw.type.dtype != w.type.dtype:
        gw = b.op("cast", gw, dtype=w.type.dtype)
    return [gx, gw]


def _avg_pool2d_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # Average pooling is a depthwise convolution with a constant kernel: reuse conv2d's input rule.
    x = ins[0]
    xb, g = _batched(b, x), _batched(b, cots[0])
    shape = static_shape(xb.type)
    kernel, stride, pads = _pool_params(attrs)
    kh, kw = kernel
    if not attrs["count_include_pad"]:
        ones = np.ones((1, 1, *shape[2:]))
        full = _avg_pool2d_kernel(ones, kernel_size=kernel, stride=stride, padding=attrs["padding"],
                                  count_include_pad=True)
        part = _avg_pool2d_kernel(ones, kernel_size=kernel, stride=stride, padding=attrs["padding"],
                                  count_include_pad=False)
        g = b.op("multiply", g, b.constant((part / full)[0, 0].astype(g.type.dtype)))
    n, c = shape[:2]
    g1 = b.op("reshape", g, shape=(n * c, 1, *static_shape(g.type)[2:]))
    w = b.constant(np.full((1, 1, kh, kw), 1.0 / (kh * kw), dtype=g.type.dtype))
    gx = _conv_input_grad(b, g1, w, (n * c, 1, *shape[2:]), stride, pads, (1, 1), 1)
    gx = b.op("reshape", gx, shape=static_shape(x.type))
    return [gx]


def _max_pool2d_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # For each kernel offset: the window elements equal to the window max get g / (number of ties),
    # scattered back to their positions (dilate by the stride, pad by the offset), then summed.
    x = ins[0]
    xb, y, g = _batched(b, x), _batched(b, outs[0]), _batched(b, cots[0])
    shape = static_shape(xb.type)
    (kh, kw), (sh, sw), (top, bottom, left, right) = _pool_params(attrs)
    xp = b.op("pad", xb, pad_width=((0, 0), (0, 0), (top, bottom), (left, right)), constant_value=-np.inf) \
        if top or bottom or left or right else xb
    hp, wp = static_shape(xp.type)[2:]
    ho, wo = static_shape(y.type)[2:]
    hits = {}
    for i in range(kh):
        for j in range(kw):
            win = b.op("getitem", xp, index=(slice(None), slice(None), slice(i, i + sh * (ho - 1) + 1, sh),
                                              slice(j, j + sw * (wo - 1) + 1, sw)))
            hits[i, j] = b.op("cast", b.op("equal", win, y), dtype=g.type.dtype)
    count = None
    for h in hits.values():
        count = h if count is None else b.op("add", count, h)
    share = b.op("divide", g, count)
    total = None
    for (i, j), h in hits.items():
        part = dilate(b, dilate(b, b.op("multiply", h, share), 2, sh), 3, sw)
        ph, pw_ = static_shape(part.type)[2:]
        part = b.op("pad", part, pad_width=((0, 0), (0, 0), (i, hp - i - ph), (j, wp - j - pw_)))
        total = part if total is None else b.op("add", total, part)
    if top or bottom or left or right:
        total = b.op("getitem", total, index=(slice(None), slice(None), slice(top, top + shape[2]),
                                              slice(left, left + shape[3])))
    if len(static_shape(x.type)) == 3:
        total = b.op("squeeze", total, axis=0)
    return [total]


register_op(OpDef(
    name="relu", id=800, arity=1, infer=_relu_infer, kernel=_relu_kernel,
    elementwise=True, inplace=(0,), family=FAMILY, grad=_relu_grad,
    doc="relu(x): max(x, 0), same dtype (NaN stays NaN)",
))


# ---------------------------------------------------------------- softmax
def _softmax_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    (t,) = (tensor(x) for x in in_types)
    _float_dtype(t)
    if t.shape is not None:
        normalize_axis(attrs["axis"], len(t.shape))
    return (t,)


def shifted_by_max(x: np.ndarray, axis: int, out: np.ndarray | None) -> np.ndarray:
    """``x - max(x, axis)`` (a non-finite max is replaced by 0, as SciPy does), in the work dtype (float16 is
    computed in float32), into ``out`` when it has that dtype.

    >>> shifted_by_max(np.array([[1.0, 3.0], [-np.inf, -np.inf]]), 1, None).tolist()
    [[-2.0, 0.0], [-inf, -inf]]
    """
    work = _work_dtype(x.dtype)
    m = np.maximum.reduce(x, axis=axis, keepdims=True, initial=-np.inf).astype(work, copy=False)
    if m.size and not (np.isfinite(np.maximum.reduce(m, axis=None)) and np.isfinite(np.minimum.reduce(m, axis=None))):
        m[~np.isfinite(m)] = 0  # rows of infinities or NaN: two reductions check every row at once
    if out is not None and out.dtype == work:
        return np.subtract(x, m, out=out)
    return np.subtract(x, m, dtype=work)


def _finish(result: np.ndarray, dtype: np.dtype, out: Any) -> np.ndarray:
    """Return a result computed in the work dtype as ``dtype``, in ``out`` when given."""
    if out is None:
        return result.astype(dtype, copy=False)
    return result if result is out else write_out(result, out)


def _softmax_kernel(x: np.ndarray, out: Any = None, *, axis: int) -> np.ndarray:
    e = shifted_by_max(x, axis, out)
    np.exp(e, out=e)
    total = np.add.reduce(e, axis=axis, keepdims=True)
    # One reciprocal per row and a multiply: a divide per element costs a pass 1.3x slower (at most one
    # more rounding).
    e *= np.reciprocal(total, out=total)
    return _finish(e, x.dtype, out)


def _log_softmax_kernel(x: np.ndarray, out: Any = None, *, axis: int) -> np.ndarray:
    s = shifted_by_max(x, axis, out)
    if s.size:
        total = np.add.reduce(np.exp(s), axis=axis, keepdims=True)
        s -= np.log(total, out=total)
    return _finish(s, x.dtype, out)


_AXIS = {"axis": Attr(attr_int, -1, doc="the axis normalised over")}
register_op(OpDef(
    name="softmax", id=801, arity=1, infer=_softmax_infer, attrs=_AXIS,
    kernel=_softmax_kernel, inplace=(0,), family=FAMILY, grad=_softmax_grad,
    doc="softmax(x, axis=-1): exp(x) / sum(exp(x)) along axis, stabilised by subtracting the max; float only",
))
register_op(OpDef(
    name="log_softmax", id=802, arity=1, infer=_softmax_infer, attrs=_AXIS,
    kernel=_log_softmax_kernel, inplace=(0,), family=FAMILY, grad=_log_softmax_grad,
    doc="log_softmax(x, axis=-1): x - logsumexp(x) along axis, stabilised by subtracting the max; float only",
))


# ---------------------------------------------------------------- the convolution kernel (conv2d and conv)
# The reference kernel: every output as a sum over a sliding window of the padded input (plain NumPy, an
# einsum per call). The NumPy engine runs its own im2col kernel (opgraph.backends.numpy.nn).
def conv_nd(x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None, *, stride: tuple[int, ...],
            padding: PadPairs, dilation: tuple[int, ...], groups: int = 1) -> np.ndarray:
    """N-d cross-correlation of ``x`` (N, C, *spatial) with ``w`` (M, C // groups, *kernel), as in PyTorch.

    ``padding`` is one ``(begin, end)`` pair of zeros per spatial axis. The
    result has dtype ``np.result_type(x, w)`` (float16 is computed in
    float32); it is written into ``out`` when given.

    >>> x = np.arange(8.0).reshape(1, 2, 4)
    >>> conv_nd(x, np.ones((1, 2, 2)), stride=(1,), padding=((1, 0),), dilation=(1,))
    array([[[ 4., 10., 14., 18.]]])
    """
    dtype = np.result_type(x.dtype, w.dtype)
    work = _work_dtype(dtype)
    nsp = x.ndim - 2
    x = np.pad(x.astype(work, copy=False), ((0, 0), (0, 0), *padding))
    w = w.astype(work, copy=False)
    n, _c, *sizes = x.shape
    m, cg, *kernel = w.shape
    spans = [d * (k - 1) + 1 for d, k in zip(dilation, kernel, strict=True)]
    outs = [max(0, (size - span) // st + 1) for size, span, st in zip(sizes, spans, stride, strict=True)]
    res = np.zeros((n, groups, m // groups, *outs), work)
    if res.size and all(size >= span for size, span in zip(sizes, spans, strict=True)):
        win = sliding_window_view(x, spans, axis=tuple(range(2, 2 + nsp)))
        win = win[(slice(None), slice(None), *(slice(None, None, st) for st in stride),
                   *(slice(None, None, d) for d in dilation))]
        win = win.reshape(n, groups, cg, *outs, *kernel)
        sp, ks = "opqr"[:nsp], "uvwx"[:nsp]
        res = np.einsum(f"ngc{sp}{ks},gmc{ks}->ngm{sp}", win, w.reshape(groups, m // groups, cg, *kernel))
    res = res.reshape(n, m, *outs)
    if out is not None:
        return write_out(res, out)  # type: ignore[no-any-return]
    return res.astype(dtype, copy=False)


# ---------------------------------------------------------------- conv2d
def _conv2d_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x, w = tensor(in_types[0], "x"), tensor(in_types[1], "w")
    dtype = np.result_type(_float_dtype(x, "x"), _float_dtype(w, "w"))
    groups = attrs["groups"]
    xs = _spatial(x, "x")
    if w.shape is not None and len(w.shape) != 4:
        raise OpTypeError(f"w must be (O, C // groups, kH, kW), got rank {len(w.shape)}")
    o, cg, kh, kw = w.shape if w.shape is not None else (None,) * 4
    if kh == 0 or kw == 0:
        raise OpTypeError(f"kernel size must be >= 1, got w shape {w.shape}")
    if o is not None and o % groups:
        raise OpTypeError(f"out channels {o} are not divisible by groups={groups}")
    if xs is None:
        return (TensorType(dtype, None),)
    c = xs[-3]
    if c is not None:
        if c % groups:
            raise OpTypeError(f"in channels {c} are not divisible by groups={groups}")
        if cg is not None and cg * groups != c:
            raise OpTypeError(f"w expects {cg * groups} input channels ({cg} per group x {groups} groups), "
                              f"x has {c}")
    top, bottom, left, right = pad4(attrs["padding"])
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    ho = conv_output_size(xs[-2], kh, sh, top, bottom, dh)
    wo = conv_output_size(xs[-1], kw, sw, left, right, dw)
    return (TensorType(dtype, (*xs[:-3], o, ho, wo)),)


def _conv2d_kernel(x: np.ndarray, w: np.ndarray, out: Any = None, *, stride: Pair, padding: Padding,
                   dilation: Pair, groups: int) -> np.ndarray:
    top, bottom, left, right = pad4(padding)
    if x.ndim == 3:  # unbatched (C, H, W)
        res = conv_nd(x[None], w, None if out is None else out[None], stride=stride,
                      padding=((top, bottom), (left, right)), dilation=dilation, groups=groups)
        return out if out is not None else res[0]
    return conv_nd(x, w, out, stride=stride, padding=((top, bottom), (left, right)), dilation=dilation,
                   groups=groups)


register_op(OpDef(
    name="conv2d", id=803, arity=2, infer=_conv2d_infer,
    attrs={
        "stride": Attr(attr_pair, (1, 1), doc="(stride_h, stride_w); an int means both"),
        "padding": Attr(attr_padding, (0, 0), doc="zero padding: (pad_h, pad_w) or (top, bottom, left, right)"),
        "dilation": Attr(attr_pair, (1, 1), doc="(dilation_h, dilation_w)"),
        "groups": Attr(_attr_groups, 1,
                       doc="channel groups: C and O are split into this many independent convolutions"),
    },
    kernel=_conv2d_kernel, family=FAMILY, grad=_conv2d_grad,
    doc="conv2d(x, w): 2-D cross-correlation of x (N, C, H, W) with w (O, C // groups, kH, kW) as in PyTorch; "
        "float only, result dtype np.result_type(x, w)",
))


# ---------------------------------------------------------------- pooling
def _pool_params(attrs: dict[str, Any]) -> tuple[Pair, Pair, tuple[int, int, int, int]]:
    kernel = attrs["kernel_size"]
    stride = attrs["stride"] if attrs["stride"] is not None else kernel
    pads = pad4(attrs["padding"])
    return kernel, stride, pads


def _pool_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any], kinds: str) -> tuple[TensorType, ...]:
    (x,) = (tensor(t) for t in in_types)
    if x.dtype.kind not in kinds:
        allowed = "an integer or floating" if "i" in kinds else "a floating"
        raise OpTypeError(f"input must have {allowed} dtype, got {x.dtype}")
    (kh, kw), (sh, sw), (top, bottom, left, right) = _pool_params(attrs)
    if 2 * max(top, bottom) > kh or 2 * max(left, right) > kw:
        raise OpTypeError(f"padding {attrs['padding']} must be at most half the kernel size {(kh, kw)}")
    xs = _spatial(x)
    if xs is None:
        return (x,)
    ho = conv_output_size(xs[-2], kh, sh, top, bottom)
    wo = conv_output_size(xs[-1], kw, sw, left, right)
    return (TensorType(x.dtype, (*xs[:-2], ho, wo)),)


def _pool(x: np.ndarray, out: Any, kernel: Pair, stride: Pair | None, padding: Padding, fill: Any,
          combine: np.ufunc, work: np.dtype) -> np.ndarray:
    """Combine the kH*kW strided taps of the padded input with ``combine`` into a ``work``-dtype array.

    The loop runs over the kernel's taps only; each step is one vectorised
    ufunc call over every batch element, channel and output position.
    """
    kh, kw = kernel
    sh, sw = stride if stride is not None else kernel
    xp = _pad_hw(x, pad4(padding), fill)
    ho, wo = (xp.shape[-2] - kh) // sh + 1, (xp.shape[-1] - kw) // sw + 1
    if ho < 1 or wo < 1:
        raise ValueError(f"kernel size {kernel} is larger than the padded input {xp.shape[-2:]}")

    def tap(i: int, j: int) -> np.ndarray:
        return xp[..., i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]

    acc = out if out is not None and out.dtype == work else np.empty((*xp.shape[:-2], ho, wo), work)
    np.copyto(acc, tap(0, 0))
    for i in range(kh):
        for j in range(kw):
            if i or j:
                combine(acc, tap(i, j), out=acc)
    return acc


def _max_pool2d_kernel(x: np.ndarray, out: Any = None, *, kernel_size: Pair, stride: Pair | None,
                       padding: Padding) -> np.ndarray:
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    # np.maximum propagates NaN, like np.max and PyTorch.
    return _pool(x, out, kernel_size, stride, padding, fill, np.maximum, x.dtype)


def _valid_counts(size: int, kernel: int, stride: int, lo: int, n_out: int) -> np.ndarray:
    """How many input (not padding) elements each window along one axis covers."""
    start = np.arange(n_out) * stride - lo
    return np.clip(start + kernel, 0, size) - np.clip(start, 0, size)


def _avg_pool2d_kernel(x: np.ndarray, out: Any = None, *, kernel_size: Pair, stride: Pair | None,
                       padding: Padding, count_include_pad: bool) -> np.ndarray:
    pads = pad4(padding)
    total = _pool(x, out, kernel_size, stride, padding, 0, np.add, _work_dtype(x.dtype))
    if count_include_pad or not any(pads):
        total /= kernel_size[0] * kernel_size[1]
    else:
        sh, sw = stride if stride is not None else kernel_size
        ho, wo = total.shape[-2:]
        rows = _valid_counts(x.shape[-2], kernel_size[0], sh, pads[0], ho)
        cols = _valid_counts(x.shape[-1], kernel_size[1], sw, pads[2], wo)
        total /= np.multiply.outer(rows, cols).astype(total.dtype)
    return _finish(total, x.dtype, out)


_POOL_ATTRS = {
    "kernel_size": Attr(attr_pair, doc="(kH, kW); an int means both"),
    "stride": Attr(optional(attr_pair), None, doc="(stride_h, stride_w); None means kernel_size"),
    "padding": Attr(attr_padding, (0, 0), doc="(pad_h, pad_w) or (top, bottom, left, right), each <= kernel/2"),
}


def _max_pool2d_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    return _pool_infer(in_types, attrs, "iuf")


def _avg_pool2d_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    return _pool_infer(in_types, attrs, "f")


register_op(OpDef(
    name="max_pool2d", id=804, arity=1, infer=_max_pool2d_infer,
    attrs=_POOL_ATTRS, kernel=_max_pool2d_kernel, family=FAMILY, grad=_max_pool2d_grad,
    doc="max_pool2d(x, kernel_size, stride=kernel_size, padding=0): max over windows of the last two axes "
        "(padding never wins), as PyTorch's max_pool2d",
))
register_op(OpDef(
    name="avg_pool2d", id=805, arity=1, infer=_avg_pool2d_infer,
    attrs={**_POOL_ATTRS, "count_include_pad": Attr(attr_bool, True, doc="divide by kH*kW even at the borders")},
    grad=_avg_pool2d_grad,
    kernel=_avg_pool2d_kernel, family=FAMILY,
    doc="avg_pool2d(x, kernel_size, stride=kernel_size, padding=0, count_include_pad=True): mean over windows "
        "of the last two axes with zero padding, as PyTorch's avg_pool2d; float only",
))


# ================================================================ N-d ops (ONNX semantics), ids 806-
# conv, conv_transpose, max_pool, max_pool_argmax, avg_pool, lp_pool, lrn, resize take inputs
# (N, C, *spatial) with 1-3 spatial axes. Per-axis attributes have one entry per spatial axis; a
# ``None`` stride/dilation means 1 on every axis and a ``None`` padding means no padding. Padding
# is one (begin, end) pair per spatial axis, ONNX's pads (b1, b2, ..., e1, e2, ...) regrouped.
PadPairs = tuple[tuple[int, int], ...]


def attr_spatial(v: Any) -> tuple[int, ...]:
    """Normalise a per-spatial-axis tuple of positive ints (kernel size, stride, dilation).

    >>> attr_spatial([3, 3]), attr_spatial(2)
    ((3, 3), (2,))
    """
    vals = attr_ints(v)
    if not 1 <= len(vals) <= 3:
        raise OpTypeError(f"expected one entry per spatial axis (1 to 3), got {v!r}")
    if any(x < 1 for x in vals):
        raise OpTypeError(f"entries must be >= 1, got {v!r}")
    return vals


def attr_pad_pairs(v: Any) -> PadPairs:
    """Normalise padding: one ``(begin, end)`` pair of non-negative ints per spatial axis.

    >>> attr_pad_pairs([(0, 1), [2, 2]])
    ((0, 1), (2, 2))
    """
    try:
        pairs = tuple(attr_ints(p) for p in v)
    except TypeError:
        pairs = ()
    if not 1 <= len(pairs) <= 3 or any(len(p) != 2 for p in pairs):
        raise OpTypeError(f"padding must be one (begin, end) pair per spatial axis, got {v!r}")
    if any(x < 0 for p in pairs for x in p):
        raise OpTypeError(f"padding must be >= 0, got {v!r}")
    return tuple((p[0], p[1]) for p in pairs)


def _attr_output_padding(v: Any) -> tuple[int, ...]:
    vals = attr_ints(v)
    if any(x < 0 for x in vals):
        raise OpTypeError(f"output_padding must be >= 0, got {v!r}")
    return vals


class Geometry:
    """The per-axis stride, padding and dilation of an op with ``nsp`` spatial axes, defaults filled.

    >>> g = Geometry({"stride": (2, 1)}, 2)
    >>> g.stride, g.pads, g.spans((3, 3))
    ((2, 1), ((0, 0), (0, 0)), (3, 3))
    """

    def __init__(self, attrs: dict[str, Any], nsp: int) -> None:
        def per_axis(name: str, default: Any) -> tuple[Any, ...]:
            val = attrs.get(name)
            if val is None:
                return (default,) * nsp
            if len(val) != nsp:
                raise OpTypeError(f"{name} has {len(val)} entries for {nsp} spatial axes: {val!r}")
            return tuple(val)

        self.nsp = nsp
        self.stride: tuple[int, ...] = per_axis("stride", 1)
        self.pads: PadPairs = per_axis("padding", (0, 0))
        self.dilation: tuple[int, ...] = per_axis("dilation", 1)
        self.output_padding: tuple[int, ...] = per_axis("output_padding", 0)
        self.kernel: tuple[int, ...] | None = per_axis("kernel_size", 1) if "kernel_size" in attrs else None

    def pad_width(self, lead: int = 2) -> tuple[tuple[int, int], ...]:
        return ((0, 0),) * lead + self.pads

    def spans(self, kernel: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(d * (k - 1) + 1 for d, k in zip(self.dilation, kernel, strict=True))


def pool_output_size(size: int | None, kernel: int, stride: int = 1, pad_lo: int = 0, pad_hi: int = 0,
                     dilation: int = 1, ceil_mode: bool = False) -> int | None:
    """Output length of a pooling window along one axis, None if unknown.

    With ``ceil_mode`` the division rounds up, but a last window that would
    start inside the end padding (or beyond) is dropped, as in PyTorch and
    ONNX. Raises :class:`~opgraph.errors.OpTypeError` when the dilated
    kernel is larger than the padded input.

    >>> pool_output_size(5, 2, 2), pool_output_size(5, 2, 2, ceil_mode=True)
    (2, 3)
    >>> pool_output_size(5, 2, 2, pad_lo=1, pad_hi=1, ceil_mode=True)  # a 4th window would start in the padding
    3
    """
    if size is None:
        return None
    span = dilation * (kernel - 1) + 1
    padded = size + pad_lo + pad_hi
    if padded < span:
        raise OpTypeError(f"kernel size {kernel} (dilated: {span}) is larger than the padded input size {padded}")
    if not ceil_mode:
        return (padded - span) // stride + 1
    n = -(-(padded - span) // stride) + 1
    if (n - 1) * stride >= size + pad_lo:
        n -= 1
    return n


def _nd_input(x: TensorType, nsp: int | None, what: str = "x") -> tuple[int | None, ...] | None:
    """The shape of an (N, C, *spatial) input with ``nsp`` (or 1-3 when None) spatial axes."""
    if x.shape is None:
        return None
    if nsp is None:
        if not 3 <= len(x.shape) <= 5:
            raise OpTypeError(f"{what} must be (N, C, *spatial) with 1 to 3 spatial axes, got rank {len(x.shape)}")
    elif len(x.shape) != nsp + 2:
        raise OpTypeError(f"{what} must be (N, C, *spatial) with {nsp} spatial axes, got rank {len(x.shape)}")
    return x.shape


def _fill_value(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


# ---------------------------------------------------------------- conv, conv_transpose
def _conv_common_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any],
                       transpose: bool) -> tuple[np.dtype, Geometry | None, Any, Any]:
    x, w = tensor(in_types[0], "x"), tensor(in_types[1], "w")
    dtype = np.result_type(_float_dtype(x, "x"), _float_dtype(w, "w"))
    nsp = None if w.shape is None else len(w.shape) - 2
    if w.shape is not None and not 1 <= len(w.shape) - 2 <= 3:
        layout = "(C, M // groups, *kernel)" if transpose else "(M, C // groups, *kernel)"
        raise OpTypeError(f"w must be {layout} with 1 to 3 spatial axes, got rank {len(w.shape)}")
    xs = _nd_input(x, nsp)
    if nsp is None and xs is not None:
        nsp = len(xs) - 2
    geo = None if nsp is None else Geometry(attrs, nsp)
    if w.shape is not None and any(k == 0 for k in w.shape[2:]):
        raise OpTypeError(f"kernel size must be >= 1, got w shape {w.shape}")
    return dtype, geo, xs, w.shape


def _conv_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    dtype, geo, xs, ws = _conv_common_infer(in_types, attrs, transpose=False)
    groups = attrs["groups"]
    if geo is None:
        return (TensorType(dtype, None),)
    m, cg, *kernel = ws if ws is not None else (None,) * (geo.nsp + 2)
    if m is not None and m % groups:
        raise OpTypeError(f"out channels {m} are not divisible by groups={groups}")
    if xs is None:
        return (TensorType(dtype, (None, m, *(None,) * geo.nsp)),)
    c = xs[1]
    if c is not None:
        if c % groups:
            raise OpTypeError(f"in channels {c} are not divisible by groups={groups}")
        if cg is not None and cg * groups != c:
            raise OpTypeError(f"w expects {cg * groups} input channels ({cg} per group x {groups} groups), "
                              f"x has {c}")
    sizes = tuple(None if k is None else conv_output_size(n, k, s, pb, pe, d) for n, k, s, (pb, pe), d
                  in zip(xs[2:], kernel, geo.stride, geo.pads, geo.dilation, strict=True))
    return (TensorType(dtype, (xs[0], m, *sizes)),)


def _conv_kernel(x: np.ndarray, w: np.ndarray, out: Any = None, *, stride: tuple[int, ...] | None,
                 padding: PadPairs | None, dilation: tuple[int, ...] | None, groups: int) -> np.ndarray:
    geo = Geometry({"stride": stride, "padding": padding, "dilation": dilation}, x.ndim - 2)
    return conv_nd(x, w, out, stride=geo.stride, padding=geo.pads, dilation=geo.dilation, groups=groups)


def _conv_transpose_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    dtype, geo, xs, ws = _conv_common_infer(in_types, attrs, transpose=True)
    groups = attrs["groups"]
    if geo is None:
        return (TensorType(dtype, None),)
    c, mg, *kernel = ws if ws is not None else (None,) * (geo.nsp + 2)
    m = None if mg is None else mg * groups
    if c is not None and c % groups:
        raise OpTypeError(f"w's in channels {c} are not divisible by groups={groups}")
    if xs is None:
        return (TensorType(dtype, (None, m, *(None,) * geo.nsp)),)
    if xs[1] is not None and c is not None and xs[1] != c:
        raise OpTypeError(f"w expects {c} input channels, x has {xs[1]}")
    sizes = []
    for n, k, s, (pb, pe), d, op in zip(xs[2:], kernel, geo.stride, geo.pads, geo.dilation, geo.output_padding,
                                        strict=True):
        if n is None or k is None:
            sizes.append(None)
            continue
        size = (n - 1) * s - pb - pe + d * (k - 1) + op + 1
        if size < 1:
            raise OpTypeError(f"output size {size} along a spatial axis is < 1 (input {n}, kernel {k}, stride {s}, "
                              f"padding {(pb, pe)}, dilation {d}, output_padding {op})")
        sizes.append(size)
    return (TensorType(dtype, (xs[0], m, *sizes)),)


def _conv_transpose_kernel(x: np.ndarray, w: np.ndarray, out: Any = None, *, stride: tuple[int, ...] | None,
                           padding: PadPairs | None, output_padding: tuple[int, ...] | None,
                           dilation: tuple[int, ...] | None, groups: int) -> np.ndarray:
    dtype = np.result_type(x.dtype, w.dtype)
    work = _work_dtype(dtype)
    geo = Geometry({"stride": stride, "padding": padding, "dilation": dilation,
                     "output_padding": output_padding}, x.ndim - 2)
    n, c, *ins = x.shape
    _, mg, *kernel = w.shape
    cg = c // groups
    npix, ntaps = int(np.prod(ins)), int(np.prod(kernel))
    # Every (input pixel, kernel tap) product at once: (G, N, P, M/G * K), one matmul per group ...
    xg = x.astype(work, copy=False).reshape(n, groups, cg, npix).transpose(1, 0, 3, 2)
    prod = np.matmul(xg, w.astype(work, copy=False).reshape(groups, 1, cg, mg * ntaps))
    # ... rearranged to (K, N, G, M/G, *in), then scattered tap by tap onto the strided output grid.
    prod = prod.reshape(groups, n, npix, mg, ntaps).transpose(4, 1, 0, 3, 2).reshape(ntaps, n, groups, mg, *ins)
    full = [(i - 1) * s + d * (k - 1) + 1 + op for i, s, d, k, op
            in zip(ins, geo.stride, geo.dilation, kernel, geo.output_padding, strict=True)]
    buf = np.zeros((n, groups, mg, *full), work)
    for t, tap in enumerate(np.ndindex(*kernel)):
        dst = tuple(slice(k * d, k * d + s * (i - 1) + 1, s) for k, d, s, i in zip(tap, geo.dilation, geo.stride, ins,
                                                                                  strict=True))
        buf[(slice(None), slice(None), slice(None), *dst)] += prod[t]
    crop = tuple(slice(pb, f - pe) for (pb, pe), f in zip(geo.pads, full, strict=True))
    res = buf.reshape(n, groups * mg, *full)[(slice(None), slice(None), *crop)]
    if out is not None:
        return write_out(res, out)
    return np.ascontiguousarray(res).astype(dtype, copy=False)


def _crop_to(b: Any, v: Any, shape: tuple[int, ...]) -> Any:
    """``v[..., :shape]`` along the spatial axes, skipped when nothing is cut."""
    vs = static_shape(v.type)
    if vs[2:] == shape[2:]:
        return v
    return b.op("getitem", v, index=(slice(None), slice(None), *(slice(0, s) for s in shape[2:])))


def _conv_weight_grad(b: Any, xp: Any, g: Any, kernel: tuple[int, ...], stride: tuple[int, ...],
                      dilation: tuple[int, ...], groups: int) -> Any:
    """Cotangent of a conv weight (M, C // groups, *kernel) given the padded input ``xp`` (N, C, ...) and
    the output cotangent ``g`` (N, M, ...): a convolution with batch and channels swapped, in which the
    roles of stride and dilation swap too."""
    n, c, *sp = static_shape(xp.type)
    m, *outs = static_shape(g.type)[1:]
    cg, mg, nsp = c // groups, m // groups, len(kernel)
    rest = tuple(range(3, 3 + nsp))
    xt = b.op("reshape", b.op("permute_dims", b.op("reshape", xp, shape=(n, groups, cg, *sp)), axes=(2, 1, 0, *rest)),
              shape=(cg, groups * n, *sp))
    gt = b.op("reshape", b.op("permute_dims", b.op("reshape", g, shape=(n, groups, mg, *outs)), axes=(1, 2, 0, *rest)),
              shape=(m, n, *outs))
    gw = b.op("conv", xt, gt, stride=dilation, dilation=stride, groups=groups)
    gw = _crop_to(b, gw, (cg, m, *kernel))
    return b.op("permute_dims", gw, axes=(1, 0, *range(2, 2 + nsp)))


def _cast_like(b: Any, v: Any, like: Any) -> Any:
    return v if v.type.dtype == like.type.dtype else b.op("cast", v, dtype=like.type.dtype)


def _conv_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x, w = ins
    g = cots[0]
    xs, ys = static_shape(x.type), static_shape(g.type)
    kernel = static_shape(w.type)[2:]
    geo = Geometry(attrs, len(kernel))
    groups = attrs["groups"]
    # x: conv_transpose is conv's adjoint; output_padding restores the rows the strided windows skipped.
    extra = tuple(n + pb + pe - ((o - 1) * s + span) for n, o, s, (pb, pe), span
                  in zip(xs[2:], ys[2:], geo.stride, geo.pads, geo.spans(kernel), strict=True))
    gx = b.op("conv_transpose", g, w, stride=geo.stride, padding=geo.pads, output_padding=extra,
              dilation=geo.dilation, groups=groups)
    xp = b.op("pad", x, pad_width=geo.pad_width()) if any(p for pr in geo.pads for p in pr) else x
    gw = _conv_weight_grad(b, xp, g, kernel, geo.stride, geo.dilation, groups)
    return [_cast_like(b, gx, x), _cast_like(b, gw, w)]


def _conv_transpose_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x, w = ins
    g = cots[0]
    xs = static_shape(x.type)
    kernel = static_shape(w.type)[2:]
    geo = Geometry(attrs, len(kernel))
    groups = attrs["groups"]
    gx = _crop_to(b, b.op("conv", g, w, stride=geo.stride, padding=geo.pads, dilation=geo.dilation, groups=groups),
                  xs)
    # w: the same weight rule as conv's, with the padded output cotangent in the role of conv's input and x
    # in the role of its output cotangent.
    ends = tuple((pb, max(0, pe - op)) for (pb, pe), op in zip(geo.pads, geo.output_padding, strict=True))
    gp = b.op("pad", g, pad_width=((0, 0), (0, 0), *ends)) if any(p for pr in ends for p in pr) else g
    gw = _conv_weight_grad(b, gp, x, kernel, geo.stride, geo.dilation, groups)
    return [_cast_like(b, gx, x), _cast_like(b, gw, w)]


_CONV_ATTRS = {
    "stride": Attr(optional(attr_spatial), None, doc="one stride per spatial axis; None: all 1"),
    "padding": Attr(optional(attr_pad_pairs), None, doc="zero padding, one (begin, end) pair per spatial axis"),
    "dilation": Attr(optional(attr_spatial), None, doc="one dilation per spatial axis; None: all 1"),
    "groups": Attr(_attr_groups, 1, doc="channel groups: C and M are split into this many independent convolutions"),
}
register_op(OpDef(
    name="conv", id=806, arity=2, infer=_conv_infer, attrs=_CONV_ATTRS,
    kernel=_conv_kernel, family=FAMILY, grad=_conv_grad,
    doc="conv(x, w, stride, padding, dilation, groups): N-d cross-correlation (ONNX Conv) of x (N, C, *spatial) "
        "with w (M, C // groups, *kernel), 1-3 spatial axes; float only, result dtype np.result_type(x, w)",
))
register_op(OpDef(
    name="conv_transpose", id=807, arity=2, infer=_conv_transpose_infer,
    attrs={**_CONV_ATTRS, "output_padding": Attr(optional(_attr_output_padding), None,
                                                 doc="zeros added at the end of each spatial axis; None: all 0")},
    kernel=_conv_transpose_kernel, family=FAMILY, grad=_conv_transpose_grad,
    doc="conv_transpose(x, w, stride, padding, output_padding, dilation, groups): ONNX ConvTranspose with explicit "
        "pads; x (N, C, *in), w (C, M // groups, *kernel), output size (in - 1) * stride - pad_begin - pad_end + "
        "dilation * (kernel - 1) + output_padding + 1; float only",
))


# ---------------------------------------------------------------- max_pool, max_pool_argmax, avg_pool, lp_pool
class PoolPlan:
    """Where the windows of an N-d pooling op fall: output sizes, padding (extended at the end for
    ceil_mode's partial last windows) and, per kernel tap, the strided slice of the padded input.

    >>> plan = PoolPlan((5,), {"kernel_size": (2,), "stride": (2,), "ceil_mode": True})
    >>> plan.outs, plan.pad_width
    ((3,), ((0, 0), (0, 0), (0, 1)))
    """

    def __init__(self, sizes: tuple[int, ...], attrs: dict[str, Any]) -> None:
        kernel: tuple[int, ...] = attrs["kernel_size"]
        self.geo = geo = Geometry(attrs, len(kernel))
        self.kernel = kernel
        self.sizes = sizes
        self.spans = geo.spans(kernel)
        self.outs = tuple(int(pool_output_size(n, k, s, pb, pe, d, attrs["ceil_mode"]))  # type: ignore[arg-type]
                          for n, k, s, (pb, pe), d in zip(sizes, kernel, geo.stride, geo.pads, geo.dilation,
                                                          strict=True))
        # Padding after the input so that every window lies inside the padded array.
        self.ends = tuple(max(pe, (o - 1) * s + span - n - pb) for n, o, s, span, (pb, pe)
                          in zip(sizes, self.outs, geo.stride, self.spans, geo.pads, strict=True))
        self.pad_width = ((0, 0), (0, 0), *((pb, e) for (pb, _), e in zip(geo.pads, self.ends, strict=True)))
        self.taps = list(np.ndindex(*kernel))

    def tap_index(self, tap: tuple[int, ...]) -> tuple[slice, ...]:
        return (slice(None), slice(None), *(slice(t * d, t * d + s * (o - 1) + 1, s) for t, d, s, o
                                           in zip(tap, self.geo.dilation, self.geo.stride, self.outs, strict=True)))

    def positions(self, tap: tuple[int, ...]) -> list[np.ndarray]:
        """Per axis: the unpadded input coordinate the tap reads at each output position."""
        return [np.arange(o) * s - pb + t * d for t, d, s, o, (pb, _) in
                zip(tap, self.geo.dilation, self.geo.stride, self.outs, self.geo.pads, strict=True)]

    def counts(self, include_pad: bool) -> np.ndarray:
        """How many taps of each window fall in the input (or, with ``include_pad``, in the padded input
        without ceil_mode's extension), as an array of the output's spatial shape."""
        total = np.ones((), np.int64)
        for axis, (n, k, d, s, o, (pb, pe)) in enumerate(zip(self.sizes, self.kernel, self.geo.dilation,
                                                             self.geo.stride, self.outs, self.geo.pads,
                                                             strict=True)):
            pos = (np.arange(o) * s - pb)[:, None] + np.arange(k)[None, :] * d
            lo, hi = (-pb, n + pe) if include_pad else (0, n)
            cnt = ((pos >= lo) & (pos < hi)).sum(axis=1)
            total = np.multiply.outer(total, cnt) if axis else cnt
        return total

    def padded(self, x: np.ndarray, fill: Any) -> np.ndarray:
        if not any(p for pr in self.pad_width for p in pr):
            return x
        return np.pad(x, self.pad_width, constant_values=fill)


def _pool_nd_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any], kinds: str,
                   out_dtype: Any = None) -> tuple[TensorType, ...]:
    (x,) = (tensor(t) for t in in_types)
    if x.dtype.kind not in kinds:
        allowed = "an integer or floating" if "i" in kinds else "a floating"
        raise OpTypeError(f"input must have {allowed} dtype, got {x.dtype}")
    kernel = attrs["kernel_size"]
    geo = Geometry(attrs, len(kernel))
    for (pb, pe), span in zip(geo.pads, geo.spans(kernel), strict=True):
        if pb >= span or pe >= span:
            raise OpTypeError(f"padding {geo.pads} must be smaller than the (dilated) kernel {kernel}")
    dtype = x.dtype if out_dtype is None else np.dtype(out_dtype)
    xs = _nd_input(x, len(kernel))
    if xs is None:
        return (TensorType(dtype, None),)
    sizes = tuple(pool_output_size(n, k, s, pb, pe, d, attrs["ceil_mode"]) for n, k, s, (pb, pe), d
                  in zip(xs[2:], kernel, geo.stride, geo.pads, geo.dilation, strict=True))
    return (TensorType(dtype, (*xs[:2], *sizes)),)


def _max_pool_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    return _pool_nd_infer(in_types, attrs, "iuf")


def _max_pool_argmax_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    return _pool_nd_infer(in_types, attrs, "iuf", np.int64)


def _float_pool_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    return _pool_nd_infer(in_types, attrs, "f")


def _tap_sum(xp: np.ndarray, plan: PoolPlan, out: np.ndarray, combine: np.ufunc) -> np.ndarray:
    """Combine the kernel's strided taps of the padded input into ``out``: one ufunc call per tap."""
    np.copyto(out, xp[plan.tap_index(plan.taps[0])], casting="unsafe")
    for tap in plan.taps[1:]:
        combine(out, xp[plan.tap_index(tap)], out=out)
    return out


def _pool_buffer(x: np.ndarray, plan: PoolPlan, out: Any, dtype: np.dtype) -> np.ndarray:
    if out is not None and out.dtype == dtype:
        return out
    return np.empty((*x.shape[:2], *plan.outs), dtype)


def _max_pool_kernel(x: np.ndarray, out: Any = None, **attrs: Any) -> np.ndarray:
    plan = PoolPlan(x.shape[2:], attrs)
    # Padding holds the dtype's lowest value, so it wins only in windows without any input cell; np.maximum
    # propagates NaN, as PyTorch and ONNX Runtime do.
    acc = _tap_sum(plan.padded(x, _fill_value(x.dtype)), plan, _pool_buffer(x, plan, out, x.dtype), np.maximum)
    return acc if out is None or acc is out else write_out(acc, out)


def _max_pool_argmax_kernel(x: np.ndarray, out: Any = None, **attrs: Any) -> np.ndarray:
    plan = PoolPlan(x.shape[2:], attrs)
    xp = plan.padded(x, _fill_value(x.dtype))
    plane = np.array(x.shape[2:], np.int64)
    flat_strides = [int(np.prod(plane[a + 1:])) for a in range(len(plane))]
    best = np.empty((*x.shape[:2], *plan.outs), x.dtype)
    index = out if out is not None and out.dtype == np.int64 else np.empty(best.shape, np.int64)
    found = np.zeros(plan.outs, bool)
    for i, tap in enumerate(plan.taps):
        pos = plan.positions(tap)
        grids = np.ix_(*pos)
        valid = np.ones(plan.outs, bool)
        flat = np.zeros(plan.outs, np.int64)
        for a, g in enumerate(grids):
            valid = valid & (g >= 0) & (g < x.shape[2 + a])
            flat = flat + g * flat_strides[a]
        v = xp[plan.tap_index(tap)]
        if i == 0:
            np.copyto(best, v)
            np.copyto(index, flat)
            found = valid
            continue
        # A tap takes over when it is an input cell and the best so far is padding, smaller, or (for the
        # first NaN of the window) not NaN; equal values keep the earlier tap.
        better = (v > best) | ~found
        if x.dtype.kind == "f":
            better |= np.isnan(v) & ~np.isnan(best)
        better &= valid
        np.copyto(best, v, where=better)
        np.copyto(index, flat, where=better)
        found = found | valid
    return index if out is None or index is out else write_out(index, out)


def _avg_pool_kernel(x: np.ndarray, out: Any = None, *, count_include_pad: bool, **attrs: Any) -> np.ndarray:
    plan = PoolPlan(x.shape[2:], attrs)
    work = _work_dtype(x.dtype)
    total = _tap_sum(plan.padded(x, 0), plan, _pool_buffer(x, plan, out, work), np.add)
    total /= np.maximum(plan.counts(count_include_pad), 1).astype(work)
    return _finish(total, x.dtype, out)


def _lp_pool_kernel(x: np.ndarray, out: Any = None, *, p: float, **attrs: Any) -> np.ndarray:
    plan = PoolPlan(x.shape[2:], attrs)
    work = _work_dtype(x.dtype)
    powered = np.abs(x).astype(work, copy=False)
    powered = powered * powered if p == 2 else np.power(powered, p)
    total = _tap_sum(plan.padded(powered, 0), plan, _pool_buffer(x, plan, out, work), np.add)
    if p == 2:
        np.sqrt(total, out=total)
    else:
        np.power(total, 1.0 / p, out=total)
    return _finish(total, x.dtype, out)


def _scatter_windows(b: Any, parts: Any, kernel_w: np.ndarray, plan: PoolPlan) -> Any:
    """Add window values ``parts`` (N*C, T, *out) back onto the input grid (N*C, 1, *in) with
    conv_transpose and the (T, 1, *kernel) weights ``kernel_w`` (which say which tap each part is)."""
    pads, extra = [], []
    for n, o, s, span, (pb, _) in zip(plan.sizes, plan.outs, plan.geo.stride, plan.spans, plan.geo.pads,
                                      strict=True):
        end = (o - 1) * s + span - pb - n  # cells past the input (end padding and ceil_mode's extension)
        pads.append((pb, max(end, 0)))
        extra.append(max(-end, 0))  # input cells no window reached
    w = b.constant(kernel_w.astype(parts.type.dtype))
    return b.op("conv_transpose", parts, w, stride=plan.geo.stride, padding=tuple(pads), output_padding=tuple(extra),
                dilation=plan.geo.dilation)


def _avg_pool_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x, g = ins[0], cots[0]
    xs = static_shape(x.type)
    plan = PoolPlan(xs[2:], attrs)
    n, c = xs[:2]
    counts = np.maximum(plan.counts(attrs["count_include_pad"]), 1)
    g = b.op("multiply", g, b.constant((1.0 / counts).astype(g.type.dtype)))
    g = b.op("reshape", g, shape=(n * c, 1, *plan.outs))
    gx = _scatter_windows(b, g, np.ones((1, 1, *plan.kernel)), plan)
    return [b.op("reshape", gx, shape=xs)]


def _max_pool_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # Each window's cotangent is split evenly between the window's cells equal to its max (as max_pool2d
    # does); padding cells hold -inf and so never share unless the max itself is -inf.
    x, y, g = ins[0], outs[0], cots[0]
    xs = static_shape(x.type)
    plan = PoolPlan(xs[2:], attrs)
    n, c = xs[:2]
    xp = b.op("pad", x, pad_width=plan.pad_width, constant_value=-np.inf) \
        if any(p for pr in plan.pad_width for p in pr) else x
    wins = b.op("stack", *(b.op("getitem", xp, index=plan.tap_index(t)) for t in plan.taps), axis=2)
    hits = b.op("cast", b.op("equal", wins, b.op("expand_dims", y, axis=2)), dtype=g.type.dtype)
    share = b.op("divide", g, b.op("sum", hits, axis=2))
    parts = b.op("multiply", hits, b.op("expand_dims", share, axis=2))
    parts = b.op("reshape", parts, shape=(n * c, len(plan.taps), *plan.outs))
    onehot = np.eye(len(plan.taps)).reshape(len(plan.taps), 1, *plan.kernel)
    gx = _scatter_windows(b, parts, onehot, plan)
    return [b.op("reshape", gx, shape=xs)]


def _lp_pool_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # d y_w / d x_i = sign(x_i) |x_i|^(p-1) y_w^(1-p) for every window w holding x_i: scatter g * y^(1-p)
    # back over the windows (as avg_pool's rule does), then scale by the local factor.
    x, y, g = ins[0], outs[0], cots[0]
    xs = static_shape(x.type)
    plan = PoolPlan(xs[2:], attrs)
    n, c = xs[:2]
    p = attrs["p"]
    h = b.op("multiply", g, b.op("power", y, scalar(b, 1.0 - p, y))) if p != 1 else g
    h = b.op("reshape", h, shape=(n * c, 1, *plan.outs))
    spread = b.op("reshape", _scatter_windows(b, h, np.ones((1, 1, *plan.kernel)), plan), shape=xs)
    if p == 2:
        local = x
    elif p == 1:
        local = b.op("sign", x)
    else:
        local = b.op("multiply", b.op("sign", x), b.op("power", b.op("abs", x), scalar(b, p - 1.0, x)))
    return [b.op("multiply", local, spread)]


_POOL_ND_ATTRS = {
    "kernel_size": Attr(attr_spatial, doc="window size, one per spatial axis"),
    "stride": Attr(optional(attr_spatial), None, doc="one stride per spatial axis; None: all 1 (as ONNX)"),
    "padding": Attr(optional(attr_pad_pairs), None,
                    doc="(begin, end) pair per spatial axis, each smaller than the dilated kernel; None: none"),
    "dilation": Attr(optional(attr_spatial), None, doc="one dilation per spatial axis; None: all 1"),
    "ceil_mode": Attr(attr_bool, False, doc="round the output size up; windows starting in the end padding are "
                                            "dropped"),
}
register_op(OpDef(
    name="max_pool", id=808, arity=1, infer=_max_pool_infer, attrs=_POOL_ND_ATTRS,
    kernel=_max_pool_kernel, family=FAMILY, grad=_max_pool_grad,
    doc="max_pool(x, kernel_size, stride, padding, dilation, ceil_mode=False): ONNX MaxPool over the 1-3 spatial "
        "axes of x (N, C, *spatial); padding never wins; integer or float dtypes",
))
register_op(OpDef(
    name="max_pool_argmax", id=809, arity=1, infer=_max_pool_argmax_infer, attrs=_POOL_ND_ATTRS,
    kernel=_max_pool_argmax_kernel, family=FAMILY, grad=no_grad,
    doc="max_pool_argmax(x, ...): int64 positions of max_pool's maxima, flattened (C order) within each (n, c) "
        "plane of the unpadded input (PyTorch's return_indices); ties and NaNs take the first in window order",
))
register_op(OpDef(
    name="avg_pool", id=810, arity=1, infer=_float_pool_infer,
    attrs={**_POOL_ND_ATTRS, "count_include_pad": Attr(attr_bool, False, doc="divide by the taps in the padded "
                                                                             "input rather than in the input")},
    kernel=_avg_pool_kernel, family=FAMILY, grad=_avg_pool_grad,
    doc="avg_pool(x, kernel_size, stride, padding, dilation, ceil_mode=False, count_include_pad=False): ONNX "
        "AveragePool; the divisor counts the window's input cells (with count_include_pad, also its padding cells, "
        "but never ceil_mode's extension, as PyTorch); float only",
))
register_op(OpDef(
    name="lp_pool", id=811, arity=1, infer=_float_pool_infer,
    attrs={"p": Attr(attr_float, 2.0, doc="the norm's exponent"), **_POOL_ND_ATTRS},
    kernel=_lp_pool_kernel, family=FAMILY, grad=_lp_pool_grad,
    doc="lp_pool(x, p=2.0, kernel_size, stride, padding, dilation, ceil_mode=False): ONNX LpPool, "
        "(sum |x|^p)^(1/p) over each window, zero padding; float only",
))


# ---------------------------------------------------------------- lrn
def _lrn_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    (x,) = (tensor(t) for t in in_types)
    _float_dtype(x)
    if x.shape is not None and len(x.shape) < 2:
        raise OpTypeError(f"x must be (N, C, ...), got rank {len(x.shape)}")
    if attrs["size"] < 1:
        raise OpTypeError(f"size must be >= 1, got {attrs['size']}")
    return (x,)


def _lrn_kernel(x: np.ndarray, out: Any = None, *, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    work = _work_dtype(x.dtype)
    xw = x.astype(work, copy=False)
    # ONNX's window for channel c is [c - floor((size-1)/2), c + ceil((size-1)/2)] (PyTorch's differs for even size).
    before, after = (size - 1) // 2, size // 2
    sq = np.pad(xw * xw, ((0, 0), (before, after)) + ((0, 0),) * (x.ndim - 2))
    sums = sliding_window_view(sq, size, axis=1).sum(axis=-1)
    res = xw / np.power(bias + (alpha / size) * sums, beta)
    return _finish(res, x.dtype, out)


def _channel_window_sum(b: Any, v: Any, before: int, after: int) -> Any:
    """``sum(v[:, c - before : c + after + 1])`` for every channel c (zeros outside), as a 1-D convolution
    with a ones kernel along the channel axis."""
    shape = static_shape(v.type)
    rank = len(shape)
    size = before + after + 1
    order = (0, *range(2, rank), 1)
    moved = b.op("permute_dims", v, axes=order)
    flat = b.op("reshape", moved, shape=(-1, 1, shape[1]))
    ones = b.constant(np.ones((1, 1, size), v.type.dtype))
    summed = b.op("conv", flat, ones, padding=((before, after),))
    back = b.op("reshape", summed, shape=static_shape(moved.type))
    return b.op("permute_dims", back, axes=tuple(int(i) for i in np.argsort(order)))


def _lrn_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # y = x * d^-beta with d = bias + alpha / size * S(x^2), S the channel window sum; S's adjoint is the
    # window sum with the window mirrored (before and after swapped).
    x, g = ins[0], cots[0]
    size, alpha, beta = attrs["size"], attrs["alpha"], attrs["beta"]
    before, after = (size - 1) // 2, size // 2
    sums = _channel_window_sum(b, b.op("multiply", x, x), before, after)
    d = b.op("add", scalar(b, attrs["bias"], x), b.op("multiply", scalar(b, alpha / size, x), sums))
    d_beta = b.op("power", d, scalar(b, -beta, x))
    h = b.op("divide", b.op("multiply", b.op("multiply", g, x), d_beta), d)
    back = _channel_window_sum(b, h, after, before)
    coef = b.op("multiply", x, scalar(b, -2.0 * beta * alpha / size, x))
    return [b.op("add", b.op("multiply", g, d_beta), b.op("multiply", coef, back))]


register_op(OpDef(
    name="lrn", id=812, arity=1, infer=_lrn_infer,
    attrs={"size": Attr(attr_int, doc="number of channels summed over"),
           "alpha": Attr(attr_float, 1e-4), "beta": Attr(attr_float, 0.75), "bias": Attr(attr_float, 1.0)},
    kernel=_lrn_kernel, family=FAMILY, grad=_lrn_grad,
    doc="lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0): ONNX LRN across channels (axis 1): x / (bias + alpha / size "
        "* sum of x^2 over channels [c - floor((size-1)/2), c + ceil((size-1)/2)])^beta; float only",
))


# ---------------------------------------------------------------- resize
RESIZE_MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _choice(options: tuple[str, ...]) -> Any:
    def normalise(v: Any) -> str:
        s = attr_str(v)
        if s not in options:
            raise OpTypeError(f"expected one of {', '.join(options)}; got {v!r}")
        return s

    return normalise


def _attr_floats(v: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in np.atleast_1d(np.asarray(v, dtype=np.float64)))


def _resize_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    (x,) = (tensor(t) for t in in_types)
    kinds = "iuf" if attrs["mode"] == "nearest" else "f"
    if x.dtype.kind not in kinds:
        allowed = "an integer or floating dtype (mode 'nearest')" if "i" in kinds else \
            f"a floating dtype (mode {attrs['mode']!r})"
        raise OpTypeError(f"input must have {allowed}, got {x.dtype}")
    sizes, scales, roi = attrs["sizes"], attrs["scales"], attrs["roi"]
    if any(s < 0 for s in sizes):
        raise OpTypeError(f"sizes must be >= 0, got {sizes}")
    if scales is not None and (len(scales) != len(sizes) or any(not s > 0 for s in scales)):
        raise OpTypeError(f"scales must be one positive factor per axis ({len(sizes)}), got {scales}")
    if roi is not None and len(roi) != 2 * len(sizes):
        raise OpTypeError(f"roi must be (starts..., ends...) with {2 * len(sizes)} entries, got {roi}")
    if x.shape is not None:
        if len(x.shape) != len(sizes):
            raise OpTypeError(f"sizes {sizes} has {len(sizes)} entries for an input of rank {len(x.shape)}")
        for d, s in zip(x.shape, sizes, strict=True):
            if d == 0 and s:
                raise OpTypeError(f"can't resize an empty axis to size {s}")
    return (TensorType(x.dtype, sizes),)


def resize_coordinates(n_in: int, n_out: int, scale: float, mode: str, roi: tuple[float, float]) -> np.ndarray:
    """ONNX Resize's coordinate transform: the input coordinate of every output index along one axis.

    As ONNX's reference, the "resized length" in the formulas is ``scale * n_in`` (``n_out`` unless the model
    gave scales).

    >>> resize_coordinates(2, 4, 2.0, "half_pixel", (0.0, 1.0))
    array([-0.25,  0.25,  0.75,  1.25])
    """
    y = np.arange(n_out, dtype=np.float64)
    length = scale * n_in
    if mode == "align_corners":
        return np.zeros(n_out) if length == 1 else y * (n_in - 1) / (length - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if length == 1:
            return np.full(n_out, (end - start) * (n_in - 1) / 2 + start * (n_in - 1))
        return y * (end - start) * (n_in - 1) / (length - 1) + start * (n_in - 1)
    if mode == "pytorch_half_pixel":
        # The spec's 0 for a length-1 output (ONNX's Python reference uses -0.5, which differs only for cubic).
        return np.zeros(n_out) if length == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / length)
        return offset + (y + 0.5) / scale - 0.5
    return (y + 0.5) / scale - 0.5


def resize_taps(xo: np.ndarray, n_in: int, attrs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    """Source indices (n_out, taps), clamped into the input (ONNX pads with edge values), and their weights
    (None for nearest).

    >>> idx, w = resize_taps(np.array([0.25]), 2, {"mode": "linear", "exclude_outside": False})
    >>> idx.tolist(), w.tolist()
    ([[0, 1]], [[0.75, 0.25]])
    """
    base = np.floor(xo)
    ratio = xo - base
    base = base.astype(np.int64)
    mode = attrs["mode"]
    if mode == "nearest":
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": np.zeros(len(xo), bool),
              "ceil": ratio > 0}[attrs["nearest_mode"]]
        return np.clip(base + up, 0, n_in - 1)[:, None], None
    r = ratio[:, None]
    if mode == "linear":
        idx = base[:, None] + np.arange(2)
        weights = np.concatenate([1 - r, r], axis=1)
    else:
        a = attrs["cubic_coeff_a"]
        idx = base[:, None] + np.arange(-1, 3)
        # Keys' cubic convolution kernel at distances 1 + r, r, 1 - r, 2 - r.
        d = np.concatenate([1 + r, r, 1 - r, 2 - r], axis=1)
        near = ((a + 2) * d - (a + 3)) * d * d + 1
        far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        weights = np.where(d <= 1, near, far)
    if attrs["exclude_outside"]:
        weights = np.where((idx < 0) | (idx >= n_in), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, n_in - 1), weights


def _resize_kernel(x: np.ndarray, out: Any = None, **attrs: Any) -> np.ndarray:
    sizes, scales, roi = attrs["sizes"], attrs["scales"], attrs["roi"]
    ctm = attrs["coordinate_transformation_mode"]
    rank = x.ndim
    work = x.dtype if attrs["mode"] == "nearest" else _work_dtype(x.dtype)
    res = x.astype(work, copy=False)
    outside = np.zeros((1,) * rank, bool)
    for axis, (n_in, n_out) in enumerate(zip(x.shape, sizes, strict=True)):
        scale = scales[axis] if scales is not None else (n_out / n_in if n_in else 1.0)
        box = (roi[axis], roi[axis + rank]) if roi is not None else (0.0, 1.0)
        identity = n_out == n_in and np.isclose(scale, 1.0, rtol=1e-9, atol=0) and \
            (ctm != "tf_crop_and_resize" or box == (0.0, 1.0))
        if identity or n_out == 0:
            # n_out == 0: an empty axis, nothing to interpolate.
            res = res if identity else np.take(res, np.zeros(0, np.intp), axis=axis)
            continue
        xo = resize_coordinates(n_in, n_out, scale, ctm, box)
        if ctm == "tf_crop_and_resize":
            shape = [1] * rank
            shape[axis] = n_out
            outside = outside | ((xo < 0) | (xo > n_in - 1)).reshape(shape)
        idx, weights = resize_taps(xo, n_in, attrs)
        if weights is None:
            res = np.take(res, idx[:, 0], axis=axis)
            continue
        shape = [1] * rank
        shape[axis] = n_out
        acc = None
        for t in range(idx.shape[1]):
            term = np.take(res, idx[:, t], axis=axis) * weights[:, t].astype(work).reshape(shape)
            acc = term if acc is None else np.add(acc, term, out=acc)
        res = acc
    if outside.any():
        res = np.where(outside, np.asarray(attrs["extrapolation_value"]).astype(work), res)
    if out is not None:
        return write_out(res, out)
    return np.ascontiguousarray(res).astype(x.dtype, copy=False)


register_op(OpDef(
    name="resize", id=813, arity=1, infer=_resize_infer,
    attrs={
        "sizes": Attr(attr_ints, doc="the full output shape, one size per axis"),
        "mode": Attr(_choice(RESIZE_MODES), "nearest", doc="one of " + ", ".join(RESIZE_MODES)),
        "coordinate_transformation_mode": Attr(_choice(COORDINATE_MODES), "half_pixel",
                                               doc="one of " + ", ".join(COORDINATE_MODES)),
        "nearest_mode": Attr(_choice(NEAREST_MODES), "round_prefer_floor", doc="one of " + ", ".join(NEAREST_MODES)),
        "cubic_coeff_a": Attr(attr_float, -0.75, doc="the cubic kernel's a"),
        "exclude_outside": Attr(attr_bool, False, doc="give taps outside the input weight 0 and renormalise"),
        "extrapolation_value": Attr(attr_float, 0.0, doc="tf_crop_and_resize's value outside the input"),
        "scales": Attr(optional(_attr_floats), None,
                       doc="per-axis scale factors used by the coordinate transform instead of sizes / input size"),
        "roi": Attr(optional(_attr_floats), None, doc="(starts..., ends...) normalised box for tf_crop_and_resize"),
    },
    kernel=_resize_kernel, family=FAMILY,
    doc="resize(x, sizes, mode='nearest', coordinate_transformation_mode='half_pixel', ...): ONNX Resize (opset 19, "
        "no antialias) to the output shape sizes, separable per axis; float dtypes, or any integer for 'nearest'",
))


# ---------------------------------------------------------------- grid_sample
GRID_MODES = ("linear", "nearest", "cubic")
GRID_PADDING_MODES = ("zeros", "border", "reflection")


def _grid_sample_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x, grid = tensor(in_types[0], "x"), tensor(in_types[1], "grid")
    _float_dtype(x, "x")
    _float_dtype(grid, "grid")
    if grid.shape is not None and not 1 <= len(grid.shape) - 2 <= 3:
        # checked before x's rank, which is judged against the grid's
        raise OpTypeError(f"grid must be (N, *out_spatial, k) with 1 to 3 spatial axes, got rank {len(grid.shape)}")
    xs = _nd_input(x, None if grid.shape is None else len(grid.shape) - 2)
    if grid.shape is None:
        return (TensorType(x.dtype, None if xs is None else (xs[0], xs[1], *(None,) * (len(xs) - 2))),)
    nsp = len(grid.shape) - 2
    if grid.shape[-1] is not None and grid.shape[-1] != nsp:
        raise OpTypeError(f"grid's last axis must hold {nsp} coordinates (one per spatial axis), got {grid.shape[-1]}")
    n = grid.shape[0]
    if xs is not None:
        if n is not None and xs[0] is not None and n != xs[0]:
            raise OpTypeError(f"x has batch {xs[0]} but grid has batch {n}")
        n = xs[0] if xs[0] is not None else n
    c = None if xs is None else xs[1]
    return (TensorType(x.dtype, (n, c, *grid.shape[1:-1])),)


def _reflect(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Fold coordinates outside [lo, hi] back in by reflecting at the borders, as ONNX GridSample does."""
    span = hi - lo
    if span <= 0:
        return np.full_like(v, lo)
    below, above = v < lo, v > hi
    dist = np.where(below, lo - v, v - hi)
    flips = np.trunc(dist / span)
    rest = dist - flips * span
    even = flips % 2 == 0
    folded = np.where(below == even, lo + rest, hi - rest)
    return np.where(below | above, folded, v)


def grid_sample_taps(mode: str, t: Any) -> tuple[list[int], list[Any]]:
    """GridSample's taps along one axis: offsets from ``floor(pos)`` and their weights (``t = pos - floor(pos)``).

    Pure arithmetic on ``t``, so it serves NumPy arrays and other engines' tensors alike (the torch backend
    uses it). Cubic is Keys' kernel with a = -0.75, as ONNX's GridSample.

    >>> grid_sample_taps("linear", np.array(0.25))
    ([0, 1], [np.float64(0.75), array(0.25)])
    """
    if mode == "nearest":
        return [0], [None]
    if mode == "linear":
        return [0, 1], [1 - t, t]
    a = -0.75
    d = [1 + t, t, 1 - t, 2 - t]
    near = [((a + 2) * v - (a + 3)) * v * v + 1 for v in d[1:3]]
    far = [((a * v - 5 * a) * v + 8 * a) * v - 4 * a for v in (d[0], d[3])]
    return [-1, 0, 1, 2], [far[0], near[0], near[1], far[1]]


def _grid_sample_kernel(x: np.ndarray, grid: np.ndarray, out: Any = None, *, mode: str, padding_mode: str,
                        align_corners: bool) -> np.ndarray:
    work = np.result_type(_work_dtype(x.dtype), _work_dtype(grid.dtype))
    nsp = x.ndim - 2
    n = x.shape[0]
    xw = x.astype(work, copy=False)
    # Per spatial axis: the taps (index arrays shaped (N, *out)), their weights, and whether they hit the input.
    axes_taps: list[list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]] = []
    for axis in range(nsp):
        size = x.shape[2 + axis]
        coord = grid[..., nsp - 1 - axis].astype(np.float64)  # the grid lists (x, y, z): the last axis first
        pos = (coord + 1) / 2 * (size - 1) if align_corners else ((coord + 1) * size - 1) / 2
        lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        if mode == "nearest":
            pos = np.rint(pos)  # half to even, as PyTorch
        # ONNX moves an out-of-bounds sampling point (for every mode) before interpolating, then resolves
        # each tap that still falls outside on its own.
        if padding_mode == "border":
            pos = np.where((pos < lo) | (pos > hi), np.clip(pos, 0, size - 1), pos)
        elif padding_mode == "reflection":
            pos = _reflect(pos, lo, hi)
        base = np.floor(pos)
        t = pos - base
        offsets, weights = grid_sample_taps(mode, t)
        taps = []
        for off, wgt in zip(offsets, weights, strict=True):
            idx = base + off
            valid = None
            if padding_mode == "zeros":
                valid = (idx >= 0) & (idx < size)
            elif padding_mode == "reflection":
                idx = np.trunc(_reflect(idx, lo, hi))
            idx = np.clip(idx, 0, size - 1).astype(np.intp)
            taps.append((idx, wgt, valid))
        axes_taps.append(taps)
    batch = np.arange(n).reshape((n,) + (1,) * (grid.ndim - 2))
    acc = np.zeros((*grid.shape[:-1], x.shape[1]), work)
    for combo in np.ndindex(*(len(t) for t in axes_taps)):
        weight: Any = 1.0
        for axis, k in enumerate(combo):
            _, wgt, valid = axes_taps[axis][k]
            if wgt is not None:
                weight = weight * wgt
            if valid is not None:
                weight = weight * valid
        index = (batch, slice(None), *(axes_taps[axis][k][0] for axis, k in enumerate(combo)))
        # Advanced indices around the channel slice put the (N, *out) axes first: (N, *out, C).
        acc += xw[index] * np.asarray(weight, work)[..., None]
    res = np.moveaxis(acc, -1, 1)
    if out is not None:
        return write_out(res, out)
    return np.ascontiguousarray(res).astype(x.dtype, copy=False)


register_op(OpDef(
    name="grid_sample", id=814, arity=2, infer=_grid_sample_infer,
    attrs={"mode": Attr(_choice(GRID_MODES), "linear", doc="one of " + ", ".join(GRID_MODES)),
           "padding_mode": Attr(_choice(GRID_PADDING_MODES), "zeros", doc="one of " + ", ".join(GRID_PADDING_MODES)),
           "align_corners": Attr(attr_bool, False, doc="-1 and 1 are the centres (not the outer edges) of the corner "
                                                       "pixels")},
    kernel=_grid_sample_kernel, family=FAMILY, version=version_of_first,
    doc="grid_sample(x, grid, mode='linear', padding_mode='zeros', align_corners=False): ONNX GridSample (opset 20); "
        "x (N, C, *in), grid (N, *out, k) of normalised (x, y[, z]) in [-1, 1], k = number of spatial axes (1-3); "
        "result (N, C, *out) in x's dtype; float only",
))


# ---------------------------------------------------------------- layer_norm
def _layer_norm_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    if not 1 <= len(in_types) <= 3:
        raise OpTypeError(f"layer_norm takes x and optionally scale and bias, got {len(in_types)} inputs")
    x, *rest = (tensor(t) for t in in_types)
    _float_dtype(x)
    if x.shape is not None:
        if len(x.shape) == 0:
            raise OpTypeError("layer_norm needs an input of rank 1 or more")
        normalize_axis(attrs["axis"], len(x.shape))
    for what, t in zip(("scale", "bias"), rest, strict=False):
        if t.dtype != x.dtype:
            raise OpTypeError(f"layer_norm's {what} must have x's dtype {x.dtype}, got {t.dtype}")
        if x.shape is not None and t.shape is not None and None not in x.shape and None not in t.shape:
            try:
                ok = np.broadcast_shapes(x.shape, t.shape) == tuple(x.shape)  # type: ignore[arg-type]
            except ValueError:
                ok = False
            if not ok:
                raise OpTypeError(f"layer_norm's {what} of shape {t.shape} does not broadcast to x's {x.shape}")
    return (x,)


def layer_norm(x: np.ndarray, scale: np.ndarray | None = None, bias: np.ndarray | None = None,
               out: np.ndarray | None = None, *, axis: int = -1, epsilon: float = 1e-5) -> np.ndarray:
    """ONNX LayerNormalization: normalise over axes ``axis`` .. last, then ``* scale + bias``.

    mean = mean(x), var = mean((x - mean)^2), y = (x - mean) / sqrt(var + epsilon) (two passes over each row,
    as ONNX's function body and torch's layer_norm); float16 computes in float32 (ONNX's default stash_type).
    The reference kernel; the NumPy engine runs one compiled loop per row (:mod:`opgraph.backends.numpy.nn`).

    >>> import numpy as np
    >>> layer_norm(np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 6.0]]), np.array([1.0, 2.0, 1.0]), epsilon=0.0)
    array([[-1.22474487,  0.        ,  1.22474487],
           [-0.70710678, -1.41421356,  1.41421356]])
    """
    x = np.asarray(x)
    ax = normalize_axis(axis, x.ndim)
    work = _work_dtype(x.dtype)
    axes = tuple(range(ax, x.ndim))
    xw = x.astype(work, copy=False)
    d = xw - xw.mean(axis=axes, keepdims=True)
    y = d / np.sqrt(np.mean(d * d, axis=axes, keepdims=True) + work.type(epsilon))
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return _finish(np.asarray(y, dtype=work), x.dtype, out)


def _layer_norm_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # xhat = (x - mean) * rstd; dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat)), gy = g * scale
    from opgraph.ops.grad_helpers import unbroadcast

    x, *rest = ins
    (g,) = cots
    axes = tuple(range(normalize_axis(attrs["axis"], len(static_shape(x.type))), len(x.type.shape)))

    def mean(v: Any) -> Any:
        return b.op("mean", v, axis=axes, keepdims=True)

    d = b.op("subtract", x, mean(x))
    var = mean(b.op("square", d))
    rstd = b.op("reciprocal", b.op("sqrt", b.op("add", var, scalar(b, attrs["epsilon"], var))))
    xhat = b.op("multiply", d, rstd)
    gy = b.op("multiply", g, rest[0]) if rest else g
    inner = b.op("subtract", b.op("subtract", gy, mean(gy)), b.op("multiply", xhat, mean(b.op("multiply", gy, xhat))))
    grads = [b.op("multiply", rstd, inner)]
    if rest:
        grads.append(unbroadcast(b, b.op("multiply", g, xhat), rest[0].type))
    if len(rest) > 1:
        grads.append(unbroadcast(b, g, rest[1].type))
    return grads


def _layer_norm_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    x, *rest = ins
    t = e.type_of(x)
    if not isinstance(t, TensorType) or t.rank is None:
        return None
    axes = tuple(range(attrs["axis"] % t.rank, t.rank))
    xw = e.op("cast", x, dtype="float32") if t.dtype == np.float16 else x  # the kernel's float32 for float16
    mean = e.op("mean", xw, axis=axes, keepdims=True)
    d = e.op("subtract", xw, mean)
    var = e.op("mean", e.op("square", d), axis=axes, keepdims=True)
    eps = const_like(e, attrs["epsilon"], var)
    y = e.op("divide", d, e.op("sqrt", e.op("add", var, eps)))
    if xw is not x:
        y = e.op("cast", y, dtype=t.dtype)
    if rest:
        y = e.op("multiply", y, rest[0])
    if len(rest) > 1:
        y = e.op("add", y, rest[1])
    return y


register_op(OpDef(
    name="layer_norm", id=815, arity=None, min_inputs=1, infer=_layer_norm_infer,
    attrs={"axis": Attr(attr_int, -1, doc="the first normalised axis: axes axis .. last are normalised"),
           "epsilon": Attr(attr_float, 1e-5, doc="added to the variance")},
    kernel=layer_norm, inplace=(0,), family=FAMILY, grad=_layer_norm_grad, decompose=_layer_norm_parts,
    doc="layer_norm(x, [scale, [bias]], axis=-1, epsilon=1e-5): ONNX LayerNormalization (mean and variance over "
        "axes axis .. last, (x - mean) / sqrt(var + epsilon) * scale + bias); float only, scale and bias in x's "
        "dtype broadcasting to x; one compiled loop per row with numba, else NumPy passes (row sums by BLAS)",
))


# ---------------------------------------------------------------- traits (see OpDef)
mark_traits("promotes", "conv", "conv2d", "conv_transpose", "log_softmax", "relu", "softmax")


# ---------------------------------------------------------------- tangent rules
# Written where the transposed gradient rule costs many more ops than the derivative: the convolutions are
# bilinear (two convolutions, where the transposed input gradient dilates, pads, flips and crops), a max pool
# passes on the tangent at each window's maximum (its argmax, where the transposed rule compares every
# kernel tap and scatters back), the average pools are linear.
def _take_at_argmax(b: Any, t: Any, idx: Any, out_shape: tuple[int, ...]) -> Any:
    """``t`` (N, C, *spatial) at the flat positions ``idx`` (N, C, *out) within each (n, c) plane."""
    n, c = static_shape(t.type)[:2]
    flat_t = b.op("reshape", t, shape=(n, c, -1))
    flat_i = b.op("reshape", idx, shape=(n, c, -1))
    return b.op("reshape", b.op("gather_elements", flat_t, flat_i, axis=2), shape=out_shape)


def _jvp_max_pool(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    if tans[0] is None:
        return [None]
    idx = b.op("max_pool_argmax", ins[0], **attrs)
    return [_take_at_argmax(b, tans[0], idx, static_shape(outs[0].type))]


def _jvp_max_pool2d(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    if tans[0] is None:
        return [None]
    (kh, kw), (sh, sw), (top, bottom, left, right) = _pool_params(attrs)
    idx = b.op("max_pool_argmax", _batched(b, ins[0]), kernel_size=(kh, kw), stride=(sh, sw),
               padding=((top, bottom), (left, right)))
    return [_take_at_argmax(b, _batched(b, tans[0]), idx, static_shape(outs[0].type))]


def _jvp_relu(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    return [mask(b, b.op("greater", x, scalar(b, 0.0, x)), tans[0])]


def _jvp_softmax(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    # dy = y * (t - sum(y * t))
    y, t = outs[0], tans[0]
    dot = b.op("sum", b.op("multiply", y, t), axis=attrs["axis"], keepdims=True)
    return [b.op("multiply", y, b.op("subtract", t, dot))]


def _jvp_log_softmax(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    # dy = t - sum(softmax * t), softmax = exp(y)
    y, t = outs[0], tans[0]
    return [b.op("subtract", t, b.op("sum", b.op("multiply", b.op("exp", y), t), axis=attrs["axis"], keepdims=True))]


def _jvp_layer_norm(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    # xhat = (x - mean) * rstd: dxhat = rstd * (dc - xhat * mean(xhat * dc)), dc = dx - mean(dx);
    # y = xhat * scale + bias: dy = dxhat * scale + xhat * dscale + dbias
    from opgraph.ops.jvp_helpers import add_all

    x, *rest = ins
    tx, *trest = tans
    axes = tuple(range(normalize_axis(attrs["axis"], len(static_shape(x.type))), len(x.type.shape)))

    def mean(v: Any) -> Any:
        return b.op("mean", v, axis=axes, keepdims=True)

    d = b.op("subtract", x, mean(x))
    rstd = b.op("reciprocal", b.op("sqrt", b.op("add", mean(b.op("square", d)), scalar(b, attrs["epsilon"], x))))
    xhat = b.op("multiply", d, rstd)
    terms = []
    if tx is not None:
        dc = b.op("subtract", tx, mean(tx))
        dxhat = b.op("multiply", rstd, b.op("subtract", dc, b.op("multiply", xhat, mean(b.op("multiply", xhat, dc)))))
        terms.append(b.op("multiply", dxhat, rest[0]) if rest else dxhat)
    if rest and trest[0] is not None:
        terms.append(b.op("multiply", xhat, trest[0]))
    if len(rest) > 1 and trest[1] is not None:
        terms.append(trest[1])
    return [add_all(b, terms)]


set_rules("jvp", {
    **{k: multilinear(k) for k in ("conv2d", "conv", "conv_transpose")},
    **{k: linear(k) for k in ("avg_pool2d", "avg_pool")},
    "max_pool2d": _jvp_max_pool2d, "max_pool": _jvp_max_pool, "relu": _jvp_relu, "softmax": _jvp_softmax,
    "log_softmax": _jvp_log_softmax, "layer_norm": _jvp_layer_norm,
})


# ---------------------------------------------------------------- batching rules (vmap)
# vmap's axis folds into the op's own batch axis N (convolutions, pools, lrn, grid_sample); a batched kernel w
# folds into the channels instead, as a grouped convolution with one group of channels per example (JAX's rule).
def _fold(b: Any, x: Any) -> Any:
    """``(B, N, ...) -> (B * N, ...)``."""
    shape = static_shape(x.type)
    return b.op("reshape", x, shape=(shape[0] * shape[1], *shape[2:]))


def _unfold(b: Any, y: Any, size: int) -> Any:
    """``(B * N, ...) -> (B, N, ...)``."""
    shape = static_shape(y.type)
    return b.op("reshape", y, shape=(size, shape[0] // size, *shape[1:]))


def _unary_batch(kind: str) -> Any:
    def rule(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: dict[str, Any]) -> list[Any]:
        return [b.op(kind, ins[0], **attrs)]
    return rule


def _axis_batch(kind: str) -> Any:
    def rule(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: dict[str, Any]) -> list[Any]:
        (x,) = ins
        return [b.op(kind, x, **{**attrs, "axis": batch_axis(attrs["axis"], example_ndim(x, True))})]
    return rule


def _folded_batch(kind: str) -> Any:
    """The rule of an op on (N, ...) inputs, every input folded into N."""
    def rule(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: dict[str, Any]) -> list[Any]:
        xs = [_fold(b, x) for x in all_batched(b, ins, batched, size)]
        res = b.op(kind, *xs, **attrs)
        return [_unfold(b, r, size) for r in (res if isinstance(res, (tuple, list)) else [res])]
    return rule


def _conv_batch(kind: str) -> Any:
    def rule(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: dict[str, Any]) -> list[Any]:
        x, w = ins
        if not batched[1]:
            return [_unfold(b, b.op(kind, _fold(b, x), w, **attrs), size)]
        x = x if batched[0] else broadcast_batch(b, x, size)
        xs, ws = static_shape(x.type), static_shape(w.type)
        # x (B, N, C, ...) -> (N, B * C, ...); w (B, O, C/g, ...) -> (B * O, C/g, ...) [conv_transpose: (B, C,
        # M/g, ...) -> (B * C, M/g, ...)]; groups B * g: group (e, j) sees example e's channels and kernels only
        x = b.op("reshape", b.op("moveaxis", x, source=(0,), destination=(1,)), shape=(xs[1], size * xs[2], *xs[3:]))
        w = b.op("reshape", w, shape=(size * ws[1], *ws[2:]))
        y = b.op(kind, x, w, **{**attrs, "groups": size * attrs["groups"]})
        ys = static_shape(y.type)
        y = b.op("reshape", y, shape=(ys[0], size, ys[1] // size, *ys[2:]))
        return [b.op("moveaxis", y, source=(1,), destination=(0,))]
    return rule


def _resize_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int,
                  attrs: dict[str, Any]) -> list[Any]:
    # the batch axis keeps its size and scale 1 (the identity, which the kernel and ONNX leave alone)
    scales, roi = attrs["scales"], attrs["roi"]
    if roi is not None:
        half = len(roi) // 2
        roi = (0.0, *roi[:half], 1.0, *roi[half:])
    return [b.op("resize", ins[0], **{**attrs, "sizes": (size, *attrs["sizes"]),
                                      "scales": None if scales is None else (1.0, *scales), "roi": roi})]


def _layer_norm_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int,
                      attrs: dict[str, Any]) -> list[Any]:
    x = ins[0] if batched[0] else broadcast_batch(b, ins[0], size)
    rank = example_ndim(ins[0], batched[0])
    axis = batch_axis(attrs["axis"], rank)
    if not any(batched[1:]):
        return [b.op("layer_norm", x, *ins[1:], axis=axis, epsilon=attrs["epsilon"])]
    # an example's own scale or bias: normalise, then scale and shift with their batch axis lined up with x's
    y = b.op("layer_norm", x, axis=axis, epsilon=attrs["epsilon"])
    for kind, p, f in zip(("multiply", "add"), ins[1:], batched[1:], strict=False):
        if f:
            extra = rank - example_ndim(p, True)
            if extra:
                p = b.op("expand_dims", p, axis=tuple(range(1, 1 + extra)))
        y = b.op(kind, y, p)
    return [y]


set_rules("batch", {
    "relu": _unary_batch("relu"),
    "softmax": _axis_batch("softmax"),
    "log_softmax": _axis_batch("log_softmax"),
    "conv2d": _conv_batch("conv2d"),
    "conv": _conv_batch("conv"),
    "conv_transpose": _conv_batch("conv_transpose"),
    **{k: _folded_batch(k) for k in ("max_pool2d", "avg_pool2d", "max_pool", "max_pool_argmax", "avg_pool",
                                     "lp_pool", "lrn", "grid_sample")},
    "resize": _resize_batch,
    "layer_norm": _layer_norm_batch,
})
