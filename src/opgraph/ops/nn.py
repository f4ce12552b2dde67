"""Neural-network ops: relu, softmax, log_softmax, conv2d, max_pool2d, avg_pool2d.

Layouts follow PyTorch: images are ``(N, C, H, W)`` (or unbatched
``(C, H, W)``), convolution weights ``(O, C // groups, kH, kW)``; output
sizes, padding and ``count_include_pad`` mean what they mean in
``torch.nn.functional``. Kernels are vectorised NumPy: windows come from
``sliding_window_view`` and a convolution is one matrix product per group
(im2col); pooling combines the kH*kW strided taps of the padded input.
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
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from opgraph.autodiff.helpers import dilate, mask, scalar, static_shape
from opgraph.core.registry import Attr, OpDef, attr_bool, attr_int, attr_ints, optional, register_op
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import OpTypeError
from opgraph.ops._common import normalize_axis, tensor, write_out

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
# rule(b, inputs, outputs, cotangents, attrs) -> cotangents of the inputs (see opgraph.autodiff.helpers).
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
    name="relu", id=800, arity=1, infer=_relu_infer, kernels={"numpy": _relu_kernel},
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


def _shifted(x: np.ndarray, axis: int, out: np.ndarray | None) -> np.ndarray:
    """``x - max(x, axis)`` (a non-finite max is replaced by 0, as SciPy does), in the work dtype."""
    work = _work_dtype(x.dtype)
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf).astype(work, copy=False)
    m[~np.isfinite(m)] = 0
    if out is not None and out.dtype == work:
        return np.subtract(x, m, out=out)
    return np.subtract(x, m, dtype=work)


def _finish(result: np.ndarray, dtype: np.dtype, out: Any) -> np.ndarray:
    """Return a result computed in the work dtype as ``dtype``, in ``out`` when given."""
    if out is None:
        return result.astype(dtype, copy=False)
    return result if result is out else write_out(result, out)


def _softmax_kernel(x: np.ndarray, out: Any = None, *, axis: int) -> np.ndarray:
    e = _shifted(x, axis, out)
    np.exp(e, out=e)
    e /= np.sum(e, axis=axis, keepdims=True)
    return _finish(e, x.dtype, out)


def _log_softmax_kernel(x: np.ndarray, out: Any = None, *, axis: int) -> np.ndarray:
    s = _shifted(x, axis, out)
    if s.size:
        s -= np.log(np.sum(np.exp(s), axis=axis, keepdims=True))
    return _finish(s, x.dtype, out)


_AXIS = {"axis": Attr(attr_int, -1, doc="the axis normalised over")}
register_op(OpDef(
    name="softmax", id=801, arity=1, infer=_softmax_infer, attrs=_AXIS,
    kernels={"numpy": _softmax_kernel}, inplace=(0,), family=FAMILY, grad=_softmax_grad,
    doc="softmax(x, axis=-1): exp(x) / sum(exp(x)) along axis, stabilised by subtracting the max; float only",
))
register_op(OpDef(
    name="log_softmax", id=802, arity=1, infer=_softmax_infer, attrs=_AXIS,
    kernels={"numpy": _log_softmax_kernel}, inplace=(0,), family=FAMILY, grad=_log_softmax_grad,
    doc="log_softmax(x, axis=-1): x - logsumexp(x) along axis, stabilised by subtracting the max; float only",
))


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
    dtype = np.result_type(x.dtype, w.dtype)
    work = _work_dtype(dtype)
    unbatched = x.ndim == 3
    xb = x[None] if unbatched else x
    xp = _pad_hw(xb.astype(work, copy=False), pad4(padding), 0)
    n = xp.shape[0]
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    span = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    # (N, C, Ho, Wo, kH, kW) view of every (dilated, strided) window.
    win = sliding_window_view(xp, span, axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    ho, wo = win.shape[2:4]
    og, k = o // groups, cg * kh * kw
    # im2col: (G, Cg*kH*kW, N*Ho*Wo) columns, then one matrix product per group with the
    # (G, O/G, Cg*kH*kW) weights; the (G, O/G, N, Ho, Wo) product is permuted to (N, O, Ho, Wo).
    cols = win.reshape(n, groups, cg, ho, wo, kh, kw).transpose(1, 2, 5, 6, 0, 3, 4).reshape(groups, k, n * ho * wo)
    prod = np.matmul(w.astype(work, copy=False).reshape(groups, og, k), cols)
    res = prod.reshape(o, n, ho, wo).transpose(1, 0, 2, 3)
    if unbatched:
        res = res[0]
    if out is not None:
        return write_out(res, out)
    return np.ascontiguousarray(res).astype(dtype, copy=False)


register_op(OpDef(
    name="conv2d", id=803, arity=2, infer=_conv2d_infer,
    attrs={
        "stride": Attr(attr_pair, (1, 1), doc="(stride_h, stride_w); an int means both"),
        "padding": Attr(attr_padding, (0, 0), doc="zero padding: (pad_h, pad_w) or (top, bottom, left, right)"),
        "dilation": Attr(attr_pair, (1, 1), doc="(dilation_h, dilation_w)"),
        "groups": Attr(_attr_groups, 1,
                       doc="channel groups: C and O are split into this many independent convolutions"),
    },
    kernels={"numpy": _conv2d_kernel}, family=FAMILY, grad=_conv2d_grad,
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
    attrs=_POOL_ATTRS, kernels={"numpy": _max_pool2d_kernel}, family=FAMILY, grad=_max_pool2d_grad,
    doc="max_pool2d(x, kernel_size, stride=kernel_size, padding=0): max over windows of the last two axes "
        "(padding never wins), as PyTorch's max_pool2d",
))
register_op(OpDef(
    name="avg_pool2d", id=805, arity=1, infer=_avg_pool2d_infer,
    attrs={**_POOL_ATTRS, "count_include_pad": Attr(attr_bool, True, doc="divide by kH*kW even at the borders")},
    grad=_avg_pool2d_grad,
    kernels={"numpy": _avg_pool2d_kernel}, family=FAMILY,
    doc="avg_pool2d(x, kernel_size, stride=kernel_size, padding=0, count_include_pad=True): mean over windows "
        "of the last two axes with zero padding, as PyTorch's avg_pool2d; float only",
))
