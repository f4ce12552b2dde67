"""ONNX -> opgraph translators: activations, softmax, convolution, pooling, normalisation, resizing,
attention and recurrent layers.

Recurrent layers (RNN, GRU, LSTM) are unrolled over their static sequence length. Ops whose
inputs must be known while importing (NonMaxSuppression, RoiAlign's boxes) say so in their errors.

    >>> from opgraph.io.onnx._core import TRANSLATORS
    >>> ("", "Conv") in TRANSLATORS and ("", "Softmax") in TRANSLATORS
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from opgraph.io.onnx._core import Node, OnnxImportError, np_dtype, translates


# ================================================================ activations
def _softmax(kind: str) -> Any:
    def translate(node: Node, x: Any) -> Any:
        r = node.rank(x)
        if node.opset >= 13:
            return node.op(kind, x, axis=node.axis(node.attr("axis", -1), r))
        # before opset 13 the input is flattened to 2-D at ``axis``
        axis = node.axis(node.attr("axis", 1), r)
        dims = node.dims(x)
        if None in dims[axis:] or sum(d is None for d in dims) > 1:
            dims = node.shape(x, why=f"Softmax before opset 13 flattens its input to 2-D at axis {axis}")
        outer = -1 if None in dims[:axis] else int(np.prod(dims[:axis]))
        flat = node.op("reshape", x, shape=(outer, int(np.prod(dims[axis:]))))
        return node.op("reshape", node.op(kind, flat, axis=1), shape=tuple(-1 if d is None else d for d in dims))
    return translate


translates("Softmax")(_softmax("softmax"))
translates("LogSoftmax")(_softmax("log_softmax"))


def _scalar(node: Node, value: float, like: Any) -> Any:
    """A scalar constant in ``like``'s dtype (ONNX attributes are float32; the math follows the input)."""
    return node.const(value, node.dtype(like))


def _sigmoid(node: Node, x: Any) -> Any:
    """sigmoid in x's dtype (opgraph's sigmoid op promotes float16, as SciPy's expit has no float16 loop)."""
    return node.cast(node.op("sigmoid", x), node.dtype(x))


@translates("LeakyRelu")
def _leaky_relu(node: Node, x: Any) -> Any:
    alpha = _scalar(node, node.attr("alpha", 0.01), x)
    return node.op("where", node.op("less", x, _scalar(node, 0, x)), node.op("multiply", x, alpha), x)


@translates("PRelu")
def _prelu(node: Node, x: Any, slope: Any) -> Any:
    xs, ss = node.dims(x), node.shape(slope)
    try:  # a run-time dim (a batch) broadcasts as the slope's 1 would
        np.broadcast_shapes(tuple(1 if d is None else d for d in xs), ss)
    except ValueError:
        # Models converted from PyTorch give one slope per channel as a 1-D tensor; like ONNX's reference,
        # put it on the only axis of that length.
        hits = [i for i, d in enumerate(xs) if len(ss) == 1 and d == ss[0]]
        if len(hits) != 1:
            raise node.error(f"slope of shape {ss} does not broadcast to the input's {xs}") from None
        slope = node.op("reshape", slope, shape=tuple(ss[0] if i == hits[0] else 1 for i in range(len(xs))))
    return node.op("where", node.op("less", x, _scalar(node, 0, x)), node.op("multiply", x, slope), x)


@translates("Elu")
def _elu(node: Node, x: Any) -> Any:
    neg = node.op("multiply", _scalar(node, node.attr("alpha", 1.0), x), node.op("expm1", x))
    return node.op("where", node.op("less", x, _scalar(node, 0, x)), neg, x)


@translates("Celu")
def _celu(node: Node, x: Any) -> Any:
    alpha = _scalar(node, node.attr("alpha", 1.0), x)
    neg = node.op("multiply", alpha, node.op("expm1", node.op("divide", x, alpha)))
    return node.op("where", node.op("less", x, _scalar(node, 0, x)), neg, x)


@translates("Selu")
def _selu(node: Node, x: Any) -> Any:
    alpha = node.attr("alpha", 1.67326319217681884765625)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    neg = node.op("multiply", _scalar(node, alpha, x), node.op("expm1", x))
    y = node.op("where", node.op("greater", x, _scalar(node, 0, x)), x, neg)
    return node.op("multiply", _scalar(node, gamma, x), y)


@translates("Softplus")
def _softplus(node: Node, x: Any) -> Any:
    return node.op("logaddexp", x, _scalar(node, 0, x))


@translates("Softsign")
def _softsign(node: Node, x: Any) -> Any:
    return node.op("divide", x, node.op("add", _scalar(node, 1, x), node.op("abs", x)))


@translates("HardSigmoid")
def _hard_sigmoid(node: Node, x: Any) -> Any:
    return node.op("hard_sigmoid", x, alpha=node.attr("alpha", 0.2), beta=node.attr("beta", 0.5))


@translates("HardSwish")
def _hard_swish(node: Node, x: Any) -> Any:
    return node.op("hard_swish", x)


@translates("ThresholdedRelu")
def _thresholded_relu(node: Node, x: Any) -> Any:
    return node.op("where", node.op("greater", x, _scalar(node, node.attr("alpha", 1.0), x)), x, _scalar(node, 0, x))


@translates("Mish")
def _mish(node: Node, x: Any) -> Any:
    return node.op("multiply", x, node.op("tanh", node.op("logaddexp", x, _scalar(node, 0, x))))


@translates("Swish")
def _swish(node: Node, x: Any) -> Any:
    alpha = node.attr("alpha", 1.0)
    if alpha == 1.0:
        return node.op("silu", x)
    return node.op("multiply", x, _sigmoid(node, node.op("multiply", x, _scalar(node, alpha, x))))


@translates("SwiGLU")
def _swiglu(node: Node, a: Any, b: Any) -> Any:
    alpha = node.attr("alpha", 1.0)
    z = a if alpha == 1.0 else node.op("multiply", a, _scalar(node, alpha, a))
    return node.op("multiply", node.op("multiply", a, _sigmoid(node, z)), b)


@translates("Shrink")
def _shrink(node: Node, x: Any) -> Any:
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    below = node.op("add", x, _scalar(node, bias, x))
    above = node.op("subtract", x, _scalar(node, bias, x))
    zero = _scalar(node, 0, x)
    y = node.op("where", node.op("less", x, _scalar(node, -lambd, x)), below, zero)
    return node.op("where", node.op("greater", x, _scalar(node, lambd, x)), above, y)


@translates("Gelu")
def _gelu(node: Node, x: Any) -> Any:
    half = _scalar(node, 0.5, x)
    if node.attr("approximate", "none") == "tanh":
        inner = node.op("multiply", x, node.op("add", _scalar(node, 1, x), node.op(
            "multiply", _scalar(node, 0.044715, x), node.op("multiply", x, x))))
        t = node.op("tanh", node.op("multiply", _scalar(node, math.sqrt(2 / math.pi), x), inner))
    else:
        t = node.op("erf", node.op("multiply", x, _scalar(node, 1 / math.sqrt(2), x)))
    return node.op("multiply", node.op("multiply", half, x), node.op("add", _scalar(node, 1, x), t))


# ================================================================ convolution and pooling
def _spatial_dims(node: Node, x: Any) -> tuple[Any, ...]:
    """A conv or pool input's shape: its batch and channel dims may be symbolic; its spatial dims too, except
    where ``auto_pad`` SAME derives the padding from them."""
    if node.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        return node.shape(x, range(2, node.rank(x)), "auto_pad SAME pads by the input's spatial size")
    return node.dims(x)


def _spatial_attrs(node: Node, xs: tuple[Any, ...], kernel: tuple[int, ...]
                   ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, int], ...]]:
    """(strides, dilations, per-axis (begin, end) pads) of a conv or pool node over input shape ``xs``."""
    n = len(xs) - 2
    if len(kernel) != n:
        raise node.error(f"kernel_shape {kernel} has {len(kernel)} entries for {n} spatial axes")
    strides = tuple(int(s) for s in node.attr("strides", ()) or (1,) * n)
    dilations = tuple(int(d) for d in node.attr("dilations", ()) or (1,) * n)
    return strides, dilations, conv_pads(node, xs[2:], kernel, strides, dilations)


def conv_pads(node: Node, spatial: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
          dilations: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Per-axis (begin, end) padding from ``pads`` or ``auto_pad``."""
    n = len(spatial)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return tuple(out)
    if auto == "VALID":
        return ((0, 0),) * n
    if auto not in ("NOTSET", ""):
        raise node.error(f"unknown auto_pad {auto!r}")
    p = tuple(int(v) for v in node.attr("pads", ()) or (0,) * (2 * n))
    if len(p) != 2 * n:
        raise node.error(f"pads {p} must have 2 entries per spatial axis ({n})")
    return tuple((p[i], p[i + n]) for i in range(n))


def _bias_nd(node: Node, y: Any, bias: Any) -> Any:
    """``y`` (N, M, *spatial) plus a per-channel bias (M,)."""
    n = node.rank(y) - 2
    return node.op("add", y, node.op("reshape", bias, shape=(1, -1) + (1,) * n))


@translates("Conv")
def _conv(node: Node, x: Any, w: Any, bias: Any = None) -> Any:
    xs, ws = _spatial_dims(node, x), node.shape(w, why="its kernel sizes are the weights' shape")
    kernel = tuple(node.attr("kernel_shape", ()) or ws[2:])
    strides, dilations, pads = _spatial_attrs(node, xs, kernel)
    y = node.op("conv", x, w, stride=strides, padding=pads, dilation=dilations, groups=node.attr("group", 1))
    return y if bias is None else _bias_nd(node, y, bias)


@translates("ConvTranspose")
def _conv_transpose(node: Node, x: Any, w: Any, bias: Any = None) -> Any:
    xs, ws = node.dims(x), node.shape(w, why="its kernel sizes are the weights' shape")
    n = len(xs) - 2
    kernel = tuple(node.attr("kernel_shape", ()) or ws[2:])
    strides = tuple(int(s) for s in node.attr("strides", ()) or (1,) * n)
    dilations = tuple(int(d) for d in node.attr("dilations", ()) or (1,) * n)
    out_pad = list(int(p) for p in node.attr("output_padding", ()) or (0,) * n)
    auto = node.attr("auto_pad", "NOTSET")
    target = tuple(int(s) for s in node.attr("output_shape", ()))
    if len(target) == n + 2:
        target = target[2:]
    extra = [0] * n
    if target or auto in ("SAME_UPPER", "SAME_LOWER"):
        xs = node.shape(x, range(2, len(xs)), "an output_shape or auto_pad SAME derives the pads from it")
        # The output size is given (or SAME: input * stride); ONNX derives the pads from it. A negative total
        # means the output is longer than the full transposed convolution: the extra cells get no
        # contribution, so they are zeros appended at the end.
        target = target or tuple(s * st for s, st in zip(xs[2:], strides, strict=True))
        pads = []
        for i in range(n):
            full = strides[i] * (xs[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
            total = full - target[i]
            if total < 0:
                extra[i], total = -total, 0
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
    else:
        pads = list(conv_pads(node, xs[2:], kernel, strides, dilations))
    y = node.op("conv_transpose", x, w, stride=strides, padding=tuple(pads), output_padding=tuple(out_pad),
                dilation=dilations, groups=node.attr("group", 1))
    if any(extra):
        y = node.op("pad", y, pad_width=((0, 0), (0, 0), *((0, e) for e in extra)))
    return y if bias is None else _bias_nd(node, y, bias)


def _pool_geometry(node: Node, x: Any) -> dict[str, Any]:
    xs = _spatial_dims(node, x)
    kernel = tuple(int(k) for k in node.attr("kernel_shape"))
    strides, dilations, pads = _spatial_attrs(node, xs, kernel)
    # auto_pad SAME fixes the output size at ceil(in / stride); ceil_mode does not apply then.
    ceil = bool(node.attr("ceil_mode", 0)) and node.attr("auto_pad", "NOTSET") in ("NOTSET", "", "VALID")
    return {"kernel_size": kernel, "stride": strides, "padding": pads, "dilation": dilations, "ceil_mode": ceil}


@translates("MaxPool")
def _max_pool(node: Node, x: Any) -> Any:
    geo = _pool_geometry(node, x)
    y = node.op("max_pool", x, **geo)
    if len(node.proto.output) < 2 or not node.proto.output[1]:
        return y
    # ONNX's Indices count over the whole (N, C, *spatial) tensor; opgraph's within each (n, c) plane.
    xs = node.shape(x, why="MaxPool's Indices output counts over the whole tensor")
    plane = int(np.prod(xs[2:]))
    idx = node.op("max_pool_argmax", x, **geo)
    if node.attr("storage_order", 0) and len(xs) == 4:
        # column-major within the plane: h + w * H
        h_, w_ = node.const(xs[2], np.int64), node.const(xs[3], np.int64)
        idx = node.op("add", node.op("floor_divide", idx, w_), node.op("multiply", node.op("remainder", idx, w_), h_))
    offsets = np.arange(xs[0] * xs[1], dtype=np.int64).reshape(xs[0], xs[1], *(1,) * (len(xs) - 2)) * plane
    return y, node.op("add", idx, node.const(offsets))


@translates("AveragePool")
def _avg_pool(node: Node, x: Any) -> Any:
    return node.op("avg_pool", x, count_include_pad=bool(node.attr("count_include_pad", 0)),
                   **_pool_geometry(node, x))


@translates("LpPool")
def _lp_pool(node: Node, x: Any) -> Any:
    return node.op("lp_pool", x, p=float(node.attr("p", 2)), **_pool_geometry(node, x))


def _spatial_axes(node: Node, x: Any) -> tuple[int, ...]:
    return tuple(range(2, node.rank(x)))


@translates("GlobalAveragePool")
def _global_avg_pool(node: Node, x: Any) -> Any:
    return node.op("mean", x, axis=_spatial_axes(node, x), keepdims=True)


@translates("GlobalMaxPool")
def _global_max_pool(node: Node, x: Any) -> Any:
    return node.op("max", x, axis=_spatial_axes(node, x), keepdims=True)


@translates("GlobalLpPool")
def _global_lp_pool(node: Node, x: Any) -> Any:
    p = float(node.attr("p", 2))
    pw = node.op("power", node.op("abs", x), _scalar(node, p, x))
    s = node.op("sum", pw, axis=_spatial_axes(node, x), keepdims=True)
    return node.op("power", s, _scalar(node, 1 / p, x))


@translates("MaxUnpool")
def _max_unpool(node: Node, x: Any, indices: Any, output_shape: Any = None) -> Any:
    xs = node.shape(x)
    n = len(xs) - 2
    kernel = tuple(int(k) for k in node.attr("kernel_shape"))
    strides = tuple(int(s) for s in node.attr("strides", ()) or (1,) * n)
    p = tuple(int(v) for v in node.attr("pads", ()) or (0,) * (2 * n))
    inferred = (*xs[:2], *((xs[2 + i] - 1) * strides[i] - p[i] - p[i + n] + kernel[i] for i in range(n)))
    # As ONNX's reference: the indices address the inferred (unpadded) output; an output_shape only adds
    # zeros at the end of each axis.
    total = int(np.prod(inferred))
    flat = node.op("scatter_elements", node.const(np.zeros(total, node.dtype(x))),
                   node.op("reshape", node.cast(indices, np.int64), shape=(-1,)),
                   node.op("reshape", x, shape=(-1,)), axis=0)
    y = node.op("reshape", flat, shape=inferred)
    if output_shape is not None:
        target = node.static_ints(2, "output_shape")
        if len(target) != len(inferred) or any(t < s for t, s in zip(target, inferred, strict=True)):
            raise node.error(f"output_shape {target} is smaller than the unpooled shape {inferred}")
        y = node.op("pad", y, pad_width=tuple((0, t - s) for t, s in zip(target, inferred, strict=True)))
    return y


# ================================================================ normalisation
def _per_channel(node: Node, v: Any, rank: int) -> Any:
    """A (C,) vector shaped (1, C, 1, ...) to broadcast against an (N, C, ...) tensor of ``rank``."""
    return node.op("reshape", v, shape=(1, -1) + (1,) * (rank - 2))


def _normalize(node: Node, x: Any, mean: Any, var: Any, scale: Any, bias: Any, eps: float) -> Any:
    """scale * (x - mean) / sqrt(var + eps) + bias, all broadcast."""
    inv = node.op("sqrt", node.op("add", var, _scalar(node, eps, var)))
    return node.op("add", node.op("multiply", scale, node.op("divide", node.op("subtract", x, mean), inv)), bias)


@translates("BatchNormalization")
def _batch_norm(node: Node, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
    r = node.rank(x)
    eps = node.attr("epsilon", 1e-5)
    dt = node.dtype(x)
    chan = [node.cast(_per_channel(node, v, r), dt) if r > 2 else node.cast(v, dt) for v in (scale, bias)]
    # Before opset 14 the extra (training) outputs were optional outputs of the same op; opgraph imports
    # inference only there.
    training = node.opset >= 14 and node.attr("training_mode", 0)
    if not training:
        stats = [node.cast(_per_channel(node, v, r) if r > 2 else v, dt) for v in (mean, var)]
        return _normalize(node, x, stats[0], stats[1], chan[0], chan[1], eps)
    axes = tuple(i for i in range(r) if i != 1)
    cur_mean = node.op("mean", x, axis=axes, keepdims=True)
    cur_var = node.op("var", x, axis=axes, keepdims=True)
    y = _normalize(node, x, cur_mean, cur_var, chan[0], chan[1], eps)
    momentum = node.attr("momentum", 0.9)
    mean_flat = node.op("reshape", cur_mean, shape=(-1,))
    var_flat = node.op("reshape", cur_var, shape=(-1,))

    def running(old: Any, cur: Any) -> Any:
        return node.op("add", node.op("multiply", old, _scalar(node, momentum, old)),
                       node.op("multiply", node.cast(cur, node.dtype(old)), _scalar(node, 1 - momentum, old)))

    return y, running(mean, mean_flat), running(var, var_flat)


@translates("InstanceNormalization")
def _instance_norm(node: Node, x: Any, scale: Any, bias: Any) -> Any:
    r = node.rank(x)
    axes = tuple(range(2, r))
    mean = node.op("mean", x, axis=axes, keepdims=True)
    var = node.op("var", x, axis=axes, keepdims=True)
    return _normalize(node, x, mean, var, _per_channel(node, scale, r), _per_channel(node, bias, r),
                      node.attr("epsilon", 1e-5))


@translates("LayerNormalization")
def _layer_norm(node: Node, x: Any, scale: Any, bias: Any = None) -> Any:
    """One ``layer_norm`` op (ONNX's function body would import as ten elementwise ops and reductions); the
    optional Mean and InvStdDev outputs, when the model uses them, are computed beside it."""
    r = node.rank(x)
    axis = node.axis(node.attr("axis", -1), r)
    eps = float(node.attr("epsilon", 1e-5))
    dt = node.dtype(x)
    ins = [x, node.cast(scale, dt)] + ([] if bias is None else [node.cast(bias, dt)])
    y = node.op("layer_norm", *ins, axis=axis, epsilon=eps)
    if not any(node.proto.output[1:]):
        return y
    stash = np_dtype(node.attr("stash_type", 1), "LayerNormalization stash_type")
    xs = node.cast(x, stash)
    axes = tuple(range(axis, r))
    mean = node.op("mean", xs, axis=axes, keepdims=True)
    var = node.op("mean", node.op("square", node.op("subtract", xs, mean)), axis=axes, keepdims=True)
    inv = node.op("reciprocal", node.op("sqrt", node.op("add", var, _scalar(node, eps, var))))
    return y, mean, inv


@translates("LRN")
def _lrn(node: Node, x: Any) -> Any:
    return node.op("lrn", x, size=int(node.attr("size")), alpha=node.attr("alpha", 1e-4),
                   beta=node.attr("beta", 0.75), bias=node.attr("bias", 1.0))


@translates("LpNormalization")
def _lp_normalization(node: Node, x: Any) -> Any:
    r = node.rank(x)
    axis = node.axis(node.attr("axis", -1), r)
    p = node.attr("p", 2)
    if p == 1:
        norm = node.op("sum", node.op("abs", x), axis=axis, keepdims=True)
    elif p == 2:
        norm = node.op("sqrt", node.op("sum", node.op("multiply", x, x), axis=axis, keepdims=True))
    else:
        raise node.error(f"p must be 1 or 2, got {p}")
    zero = node.op("equal", norm, _scalar(node, 0, x))
    # a zero norm gives 0 rather than 0 / 0
    safe = node.op("where", zero, _scalar(node, 1, x), norm)
    return node.op("where", zero, _scalar(node, 0, x), node.op("divide", x, safe))


@translates("MeanVarianceNormalization")
def _mvn(node: Node, x: Any) -> Any:
    r = node.rank(x)
    axes = node.axes(node.attr("axes", (0, 2, 3)), r)
    mean = node.op("mean", x, axis=axes, keepdims=True)
    # E[x^2] - E[x]^2, as ONNX's function body, so results match it to the last bit where it matters
    var = node.op("subtract", node.op("mean", node.op("multiply", x, x), axis=axes, keepdims=True),
                  node.op("multiply", mean, mean))
    std = node.op("sqrt", var)
    return node.op("divide", node.op("subtract", x, mean), node.op("add", std, _scalar(node, 1e-9, x)))


# ================================================================ resizing and sampling
def _optional_static(node: Node, v: Any, what: str) -> np.ndarray | None:
    """The known value of an optional input; None when omitted or empty (ONNX's "not given")."""
    if v is None:
        return None
    arr = np.asarray(node.static(v, what))
    return None if arr.size == 0 else arr


def _resize_plan(node: Node, xs: tuple[int, ...], scales: np.ndarray | None, sizes: np.ndarray | None,
                 axes: Sequence[int]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Full-rank output sizes and per-axis scales from Resize's scales or sizes (on ``axes``)."""
    r = len(xs)
    out = list(xs)
    full = [1.0] * r
    if scales is not None:
        if len(scales) != len(axes):
            raise node.error(f"scales has {len(scales)} entries for {len(axes)} axes")
        for a, s in zip(axes, scales, strict=True):
            if not s > 0:
                raise node.error(f"scales must be positive, got {scales.tolist()}")
            full[a] = float(s)
            out[a] = int(xs[a] * float(s))
        return tuple(out), tuple(full)
    if sizes is None:
        raise node.error("needs scales or sizes")
    if len(sizes) != len(axes):
        raise node.error(f"sizes has {len(sizes)} entries for {len(axes)} axes")
    for a, s in zip(axes, sizes, strict=True):
        out[a] = int(s)
        full[a] = int(s) / xs[a] if xs[a] else 1.0
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        chosen = [full[a] for a in axes]
        if policy == "not_larger":
            scale = min(chosen)
        elif policy == "not_smaller":
            scale = max(chosen)
        else:
            raise node.error(f"unknown keep_aspect_ratio_policy {policy!r}")
        for a in axes:
            full[a] = scale
            out[a] = int(scale * xs[a] + 0.5)
    return tuple(out), tuple(full)


def _antialias_matrix(n_in: int, n_out: int, scale: float, attrs: dict[str, Any]) -> np.ndarray:
    """The (n_out, n_in) interpolation matrix of antialiased linear/cubic Resize along one axis.

    The filter is stretched by 1 / scale when downsampling, so its width depends on the scale; it follows
    ONNX's reference (tap choice, edge clamping, exclude_outside).
    """
    length = scale * n_in
    y = np.arange(n_out, dtype=np.float64)
    ctm = attrs["coordinate_transformation_mode"]
    if ctm == "align_corners":
        xo = np.zeros(n_out) if length == 1 else y * (n_in - 1) / (length - 1)
    elif ctm == "asymmetric":
        xo = y / scale
    elif ctm == "pytorch_half_pixel":
        xo = np.full(n_out, -0.5) if length == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        xo = n_in / 2 * (1 - n_out / length) + (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        xo = (y + 0.5) / scale - 0.5
    else:
        raise OnnxImportError(f"Resize: antialiasing does not support coordinate_transformation_mode {ctm!r}")
    s = min(scale, 1.0)
    a = attrs["cubic_coeff_a"]
    w = np.zeros((n_out, n_in))
    for i, x in enumerate(xo):
        base = math.floor(x)
        ratio = 1.0 if x == base else x - base
        if attrs["mode"] == "linear":
            start = int(np.floor(-1 / s) + 1)
            args = (np.arange(start, 2 - start) - ratio) * s
            coeffs = np.clip(1 - np.abs(args), 0, 1)
        else:
            start = int(np.floor(-2 / s) + 1)
            d = np.abs(s * (np.arange(start, 2 - start) - ratio))
            coeffs = np.where(d <= 1, (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1,
                              np.where(d < 2, a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a, 0.0))
        coeffs = coeffs / coeffs.sum()
        n = len(coeffs)
        # the n taps nearest to x, ties to the smaller index (ONNX's reference)
        pad = math.ceil(n / 2)
        xp = x + pad
        p = math.floor(xp)
        frac = xp - p
        if n % 2 == 0:
            first = p + (-(n // 2) if frac == 0 else -(n // 2) + 1)
        else:
            first = p + (-((n - 1) // 2) if frac <= 0.5 else -((n - 1) // 2) + 1)
        idx = first + np.arange(n) - pad
        if attrs["exclude_outside"]:
            coeffs = np.where((idx < 0) | (idx >= n_in), 0.0, coeffs)
            coeffs = coeffs / (coeffs.sum() or 1.0)
        np.add.at(w[i], np.clip(idx, 0, n_in - 1), coeffs)
    return w


def _apply_along(node: Node, x: Any, axis: int, matrix: np.ndarray) -> Any:
    """Contract axis ``axis`` of ``x`` with ``matrix`` (n_out, n_in)."""
    r = node.rank(x)
    moved = node.op("moveaxis", x, source=axis, destination=r - 1) if axis != r - 1 else x
    y = node.op("matmul", moved, node.const(matrix.T.astype(node.dtype(x))))
    return node.op("moveaxis", y, source=r - 1, destination=axis) if axis != r - 1 else y


def _resize_to(node: Node, x: Any, out: tuple[int, ...], scales: tuple[float, ...], attrs: dict[str, Any],
               roi: tuple[float, ...] | None, antialias: bool) -> Any:
    xs = node.shape(x)
    if antialias and attrs["mode"] != "nearest" and any(s < 1 for s in scales):
        if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
            raise node.error("antialias with tf_crop_and_resize is not supported")
        if node.dtype(x).kind != "f":
            raise node.error(f"antialiased {attrs['mode']} resize needs a float input, got {node.dtype(x)}")
        for axis, (n_in, n_out, s) in enumerate(zip(xs, out, scales, strict=True)):
            if n_in != n_out or s != 1.0:
                x = _apply_along(node, x, axis, _antialias_matrix(n_in, n_out, s, attrs))
        return x
    return node.op("resize", x, sizes=out, scales=scales, roi=roi, **attrs)


@translates("Resize")
def _resize(node: Node, x: Any, roi: Any = None, scales: Any = None, sizes: Any = None) -> Any:
    xs = node.shape(x)
    r = len(xs)
    if node.opset < 11:
        # Resize-10 takes (X, scales) and always maps coordinates asymmetrically.
        return _upsample_like(node, x, _optional_static(node, roi, "scales"))
    scale_arr = _optional_static(node, scales, "scales")
    size_arr = _optional_static(node, sizes, "sizes")
    axes = node.axes(node.attr("axes", ()) or range(r), r)
    if len(set(axes)) != len(axes):
        raise node.error(f"axes {axes} repeat an axis")
    # scales win when both are given (ONNX allows only one; some exporters leave an empty one)
    out, full = _resize_plan(node, xs, scale_arr, None if scale_arr is not None else size_arr, axes)
    ctm = node.attr("coordinate_transformation_mode", "half_pixel")
    roi_full = None
    if ctm == "tf_crop_and_resize":
        roi_arr = _optional_static(node, roi, "roi")
        if roi_arr is None:
            raise node.error("tf_crop_and_resize needs roi")
        starts, ends = [0.0] * r, [1.0] * r
        k = len(axes)
        if len(roi_arr) != 2 * k:
            raise node.error(f"roi has {len(roi_arr)} entries; expected 2 per resized axis ({2 * k})")
        for i, a in enumerate(axes):
            starts[a], ends[a] = float(roi_arr[i]), float(roi_arr[k + i])
        roi_full = (*starts, *ends)
    attrs = {"mode": node.attr("mode", "nearest"), "coordinate_transformation_mode": ctm,
             "nearest_mode": node.attr("nearest_mode", "round_prefer_floor"),
             "cubic_coeff_a": node.attr("cubic_coeff_a", -0.75),
             "exclude_outside": bool(node.attr("exclude_outside", 0)),
             "extrapolation_value": node.attr("extrapolation_value", 0.0)}
    return _resize_to(node, x, out, full, attrs, roi_full, bool(node.attr("antialias", 0)))


def _upsample_like(node: Node, x: Any, scales: np.ndarray | None) -> Any:
    """Upsample and Resize-10: floor(in * scale) outputs, asymmetric coordinates, nearest rounds down
    (up when shrinking), as ONNX Runtime."""
    xs = node.shape(x)
    if scales is None:
        raise node.error("needs scales")
    out, full = _resize_plan(node, xs, np.asarray(scales, np.float64).reshape(-1), None, tuple(range(len(xs))))
    mode = node.attr("mode", "nearest")
    if mode in ("bilinear", "trilinear"):
        mode = "linear"
    attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric",
             "nearest_mode": "ceil" if any(s < 1 for s in full) else "floor"}
    return node.op("resize", x, sizes=out, scales=full, **attrs)


@translates("Upsample")
def _upsample(node: Node, x: Any, scales: Any = None) -> Any:
    arr = np.asarray(node.attr("scales"), np.float64) if node.opset < 9 else _optional_static(node, scales, "scales")
    return _upsample_like(node, x, arr)


@translates("GridSample")
def _grid_sample(node: Node, x: Any, grid: Any) -> Any:
    # GridSample-16 named the modes bilinear and bicubic; opset 20 renamed them and added N-d.
    mode = node.attr("mode", "bilinear" if node.opset < 20 else "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    return node.op("grid_sample", x, node.cast(grid, node.dtype(x)), mode=mode,
                   padding_mode=node.attr("padding_mode", "zeros"),
                   align_corners=bool(node.attr("align_corners", 0)))


@translates("AffineGrid")
def _affine_grid(node: Node, theta: Any, size: Any) -> Any:
    dims = node.static_ints(1, "size")
    spatial = dims[2:]
    n = len(spatial)
    if n not in (2, 3) or node.shape(theta)[1:] != (n, n + 1):
        raise node.error(f"theta of shape {node.shape(theta)} does not match size {dims}")
    align = bool(node.attr("align_corners", 0))

    def coords(k: int) -> np.ndarray:
        if align:
            return np.linspace(-1.0, 1.0, k) if k > 1 else np.zeros(1)
        return (np.arange(k) * 2.0 + 1.0) / k - 1.0

    # homogeneous (x, y[, z], 1) per output position, x varying fastest
    mesh = np.meshgrid(*(coords(k) for k in spatial), indexing="ij")
    base = np.stack([*(m.reshape(-1) for m in reversed(mesh)), np.ones(int(np.prod(spatial)))], axis=0)
    g = node.op("matmul", theta, node.const(base.astype(node.dtype(theta))))
    g = node.op("permute_dims", g, axes=(0, 2, 1))
    return node.op("reshape", g, shape=(dims[0], *spatial, n))


@translates("RoiAlign")
def _roi_align(node: Node, x: Any, rois: Any, batch_indices: Any) -> Any:
    xs = node.shape(x)
    if len(xs) != 4:
        raise node.error(f"x must be (N, C, H, W), got shape {xs}")
    boxes = np.asarray(node.static(1, "rois"), np.float64)
    which = np.asarray(node.static(2, "batch_indices")).astype(np.int64).reshape(-1)
    _, c, h, w = xs
    ph, pw = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    ratio = int(node.attr("sampling_ratio", 0))
    spatial_scale = float(node.attr("spatial_scale", 1.0))
    # RoiAlign-10 had no such attribute and behaved as output_half_pixel; opset 16 made half_pixel the default
    default_mode = "half_pixel" if node.opset >= 16 else "output_half_pixel"
    half = node.attr("coordinate_transformation_mode", default_mode) == "half_pixel"
    mode = node.attr("mode", "avg")
    dt = node.dtype(x)
    outs = []
    for box, b in zip(boxes, which, strict=True):
        # Sample points and bilinear taps follow ONNX's reference (and ONNX Runtime) exactly.
        off = 0.5 if half else 0.0
        x0, y0, x1, y1 = (v * spatial_scale - off for v in box[:4])
        rw, rh = x1 - x0, y1 - y0
        if not half:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / ph, rw / pw
        gh = ratio if ratio > 0 else int(np.ceil(rh / ph))
        gw = ratio if ratio > 0 else int(np.ceil(rw / pw))
        count = max(gh * gw, 1)
        idx = np.zeros((ph, pw, max(gh, 1) * max(gw, 1), 4), np.int64)
        wts = np.zeros(idx.shape)
        for i in range(ph):
            for j in range(pw):
                k = 0
                for iy in range(gh):
                    for ix in range(gw):
                        yy = y0 + i * bh + (iy + 0.5) * bh / gh
                        xx = x0 + j * bw + (ix + 0.5) * bw / gw
                        if yy < -1.0 or yy > h or xx < -1.0 or xx > w:
                            k += 1
                            continue
                        yy, xx = max(yy, 0.0), max(xx, 0.0)
                        yl, xl = int(yy), int(xx)
                        if yl >= h - 1:
                            yl = yhi = h - 1
                            yy = yl
                        else:
                            yhi = yl + 1
                        if xl >= w - 1:
                            xl = xhi = w - 1
                            xx = xl
                        else:
                            xhi = xl + 1
                        ly, lx = yy - yl, xx - xl
                        idx[i, j, k] = (yl * w + xl, yl * w + xhi, yhi * w + xl, yhi * w + xhi)
                        wts[i, j, k] = ((1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx)
                        k += 1
        plane = node.op("reshape", node.op("getitem", x, index=(int(b),)), shape=(c, h * w))
        taps = node.op("take", plane, node.const(idx.reshape(-1)), axis=1)
        taps = node.op("multiply", taps, node.const(wts.reshape(-1).astype(dt)))
        taps = node.op("reshape", taps, shape=(c, *idx.shape))
        if mode == "avg":
            y = node.op("divide", node.op("sum", taps, axis=(3, 4)), node.const(count, dt))
        elif mode == "max":
            y = node.op("max", taps, axis=(3, 4))
        else:
            raise node.error(f"unknown mode {mode!r}")
        outs.append(y)
    if not outs:
        return node.const(np.zeros((0, c, ph, pw), dt))
    return node.op("stack", *outs, axis=0)


@translates("NonMaxSuppression")
def _non_max_suppression(node: Node, boxes: Any, scores: Any, max_out: Any = None, iou: Any = None,
                         score_threshold: Any = None) -> Any:
    # The output's length depends on the values, so they must be known (opgraph shapes are static).
    bx = np.asarray(node.static(0, "boxes"), np.float64)
    sc = np.asarray(node.static(1, "scores"), np.float64)
    limit = _optional_static(node, max_out, "max_output_boxes_per_class")
    limit_n = max(int(limit.reshape(-1)[0]), 0) if limit is not None else 0
    iou_arr = _optional_static(node, iou, "iou_threshold")
    iou_t = float(iou_arr.reshape(-1)[0]) if iou_arr is not None else 0.0
    st = _optional_static(node, score_threshold, "score_threshold")
    center = node.attr("center_point_box", 0)
    if center:
        half = bx[..., 2:4] / 2
        lo, hi = bx[..., 0:2] - half, bx[..., 0:2] + half  # (x, y)
    else:
        lo = np.minimum(bx[..., [1, 0]], bx[..., [3, 2]])
        hi = np.maximum(bx[..., [1, 0]], bx[..., [3, 2]])
    selected = []
    for b in range(sc.shape[0]):
        area = np.prod(hi[b] - lo[b], axis=-1)
        for c in range(sc.shape[1]):
            s = sc[b, c]
            cand = [i for i in range(len(s)) if st is None or s[i] > float(st.reshape(-1)[0])]
            cand.sort(key=lambda i: (-s[i], i))
            keep: list[int] = []
            for i in cand:
                if len(keep) >= limit_n:
                    break
                ok = True
                for j in keep:
                    inter = np.prod(np.clip(np.minimum(hi[b, i], hi[b, j]) - np.maximum(lo[b, i], lo[b, j]), 0, None))
                    union = area[i] + area[j] - inter
                    if inter > 0 and area[i] > 0 and area[j] > 0 and union > 0 and inter / union > iou_t:
                        ok = False
                        break
                if ok:
                    keep.append(i)
                    selected.append((b, c, i))
    return node.const(np.asarray(selected, np.int64).reshape(-1, 3))


# ================================================================ attention
def _heads(node: Node, v: Any, heads: int, what: str = "input") -> Any:
    """(B, S, heads * d) -> (B, heads, S, d)."""
    shape = node.shape(v)
    if len(shape) != 3:
        raise node.error(f"{what} must be 3-D (batch, sequence, heads * head_size), it has shape {shape}")
    b, s, hidden = shape
    if hidden % heads:
        raise node.error(f"hidden size {hidden} is not divisible by {heads} heads")
    return node.op("permute_dims", node.op("reshape", v, shape=(b, s, heads, hidden // heads)), axes=(0, 2, 1, 3))


def _fp16_softmax(node: Node, x: Any) -> Any:
    """Softmax by elementary ops in x's own dtype. opgraph's softmax op computes float16 in float32; ONNX's
    reference (and so the backend tests' expected outputs) stays in float16, which differs past the tests'
    tolerance."""
    m = node.op("max", x, axis=-1, keepdims=True)
    e = node.op("exp", node.op("subtract", x, node.op("where", node.op("isinf", m), _scalar(node, 0, x), m)))
    s = node.op("sum", e, axis=-1, keepdims=True)
    return node.op("divide", e, node.op("where", node.op("equal", s, _scalar(node, 0, x)), _scalar(node, 1, x), s))


@translates("Attention")
def _attention(node: Node, q: Any, k: Any, v: Any, attn_mask: Any = None, past_key: Any = None,
               past_value: Any = None, nonpad_kv_seqlen: Any = None) -> Any:
    # Follows ONNX's reference step by step (scales, cast points, mask algebra), so results match its rounding.
    rank = node.rank(q)
    dt = node.dtype(q)
    if rank == 3:
        qh, kvh = node.attr("q_num_heads", None), node.attr("kv_num_heads", None)
        if qh is None or kvh is None:
            raise node.error("3-D inputs need the q_num_heads and kv_num_heads attributes")
        if qh <= 0 or kvh <= 0:
            raise node.error(f"attributes q_num_heads ({qh}) and kv_num_heads ({kvh}) must be positive")
        q, k, v = (_heads(node, t, h, f"input {i} ({name})")
                   for i, (t, h, name) in enumerate(((q, qh, "Q"), (k, kvh, "K"), (v, kvh, "V"))))
    elif rank != 4:
        raise node.error(f"Q must be 3-D or 4-D, got rank {rank}")
    for i, name, t in ((1, "K", k), (2, "V", v), (4, "past_key", past_key), (5, "past_value", past_value)):
        if t is not None and len(node.shape(t)) != 4:
            raise node.error(f"input {i} ({name}) must be 4-D (batch, heads, sequence, head_size) like Q, "
                             f"it has shape {node.shape(t)}")
    if attn_mask is not None and not node.shape(attn_mask):
        raise node.error("input 3 (attn_mask) must have at least 1 axis, it is a scalar")
    if node.shape(k)[1] == 0:
        raise node.error(f"input 1 (K) has 0 heads (shape {node.shape(k)})")
    batch, n_q_heads, q_len, head = node.shape(q)
    scale = node.attr("scale", None)
    if scale is None and head == 0:
        raise node.error("input 0 (Q) has head size 0, so the default scale 1 / sqrt(head_size) is undefined")
    scale = 1 / math.sqrt(head) if scale is None else scale
    root = _scalar(node, math.sqrt(scale), q)
    if past_key is not None:
        k = node.op("concat", past_key, k, axis=2)
    if past_value is not None:
        v = node.op("concat", past_value, v, axis=2)
    present_k, present_v = k, v
    kv_len = node.shape(k)[2]
    neg_inf, zero = _scalar(node, -np.inf, q), _scalar(node, 0, q)

    mask = attn_mask
    if mask is not None:
        short = kv_len - node.shape(mask)[-1]
        if short > 0:
            # a mask shorter than the keys leaves the extra keys masked out
            fill = False if node.dtype(mask) == np.bool_ else -np.inf
            pads = ((0, 0),) * (node.rank(mask) - 1) + ((0, short),)
            mask = node.op("pad", mask, pad_width=pads, constant_value=fill)
        mask = node.op("where", mask, zero, neg_inf) if node.dtype(mask) == np.bool_ else node.cast(mask, dt)
    # offset of the queries' block within the keys: scalar (past cache or none) or per batch (external cache)
    ext = nonpad_kv_seqlen is not None and past_key is None
    offset = node.shape(past_key)[2] if past_key is not None else 0
    i_idx = np.arange(q_len).reshape(q_len, 1)
    j_idx = np.arange(kv_len).reshape(1, kv_len)
    batch_off = None
    if ext:
        batch_off = node.op("reshape", node.op("subtract", node.cast(nonpad_kv_seqlen, np.int64),
                                               node.const(q_len, np.int64)), shape=(-1, 1, 1, 1))

    def frontier(allowed_const: Callable[[np.ndarray], np.ndarray], allowed_op: Callable[[Any], Any]) -> Any:
        """A 0 / -inf bias from ``allowed(diff)`` with diff = i + offset - j."""
        if batch_off is None:
            return node.const(np.where(allowed_const(i_idx + offset - j_idx), 0, -np.inf).astype(dt))
        diff = node.op("subtract", batch_off, node.const((j_idx - i_idx).astype(np.int64)))
        return node.op("where", allowed_op(diff), zero, neg_inf)

    bias = mask
    if node.attr("is_causal", 0):
        causal = frontier(lambda d: d >= 0, lambda d: node.op("greater_equal", d, node.const(0, np.int64)))
        bias = causal if bias is None else node.op("add", bias, causal)
    left, right = node.attr("left_window_size", -1), node.attr("right_window_size", -1)
    if left >= 0 or right >= 0:
        def ok_const(d: np.ndarray) -> np.ndarray:
            return ((d <= left) if left >= 0 else True) & ((-d <= right) if right >= 0 else True)

        def ok_op(d: Any) -> Any:
            parts = []
            if left >= 0:
                parts.append(node.op("less_equal", d, node.const(left, np.int64)))
            if right >= 0:
                parts.append(node.op("greater_equal", d, node.const(-right, np.int64)))
            return parts[0] if len(parts) == 1 else node.op("logical_and", *parts)

        window = frontier(ok_const, ok_op)
        bias = window if bias is None else node.op("add", bias, window)
    if nonpad_kv_seqlen is not None:
        valid = node.op("less", node.const(np.arange(kv_len, dtype=np.int64)),
                        node.op("reshape", node.cast(nonpad_kv_seqlen, np.int64), shape=(-1, 1)))
        pad_bias = node.op("reshape", node.op("where", valid, zero, neg_inf), shape=(-1, 1, 1, kv_len))
        bias = pad_bias if bias is None else node.op("add", bias, pad_bias)

    n_kv_heads = node.shape(k)[1]
    if n_q_heads != n_kv_heads:
        if n_q_heads % n_kv_heads:
            raise node.error(f"{n_q_heads} query heads are not a multiple of {n_kv_heads} key/value heads")
        k = node.op("repeat", k, repeats=n_q_heads // n_kv_heads, axis=1)
        v = node.op("repeat", v, repeats=n_q_heads // n_kv_heads, axis=1)
    qk = node.op("matmul", node.op("multiply", q, root),
                 node.op("permute_dims", node.op("multiply", k, root), axes=(0, 1, 3, 2)))
    softcap = node.attr("softcap", 0.0)
    if softcap > 0:
        cap = _scalar(node, softcap, qk)
        qk = node.op("multiply", node.op("tanh", node.op("divide", qk, cap)), cap)
    scores = qk if bias is None else node.op("add", qk, bias)
    mode = node.attr("qk_matmul_output_mode", 0)
    qk_out = scores if mode == 2 else qk
    precision = node.attr("softmax_precision", None)
    if precision is not None:
        scores = node.cast(scores, np_dtype(precision, node.label))
    probs = _fp16_softmax(node, scores) if node.dtype(scores) == np.float16 else node.op("softmax", scores, axis=-1)
    if bias is not None:
        # a query row with every key masked out attends to nothing: zeros, not NaN
        top = node.op("max", bias, axis=-1, keepdims=True)
        probs = node.op("where", node.op("equal", top, _scalar(node, -np.inf, top)), _scalar(node, 0, probs), probs)
    if mode == 3:
        qk_out = probs
    probs = node.cast(probs, dt)
    y = node.op("matmul", probs, v)
    if rank == 3:
        y = node.op("reshape", node.op("permute_dims", y, axes=(0, 2, 1, 3)), shape=(batch, q_len, -1))
    return y, present_k, present_v, node.cast(qk_out, dt)


# ================================================================ recurrent layers (unrolled)
_ALPHA = {"affine": 1.0, "leakyrelu": 0.01, "thresholdedrelu": 1.0, "scaledtanh": 1.0, "hardsigmoid": 0.2,
          "elu": 1.0}
_BETA = {"affine": 0.0, "scaledtanh": 1.0, "hardsigmoid": 0.5}


def _activation(node: Node, name: str, alpha: float | None, beta: float | None) -> Callable[[Any], Any]:
    key = name.lower()
    a = _ALPHA.get(key, 0.0) if alpha is None else alpha
    b = _BETA.get(key, 0.0) if beta is None else beta

    def f(x: Any) -> Any:
        if key == "sigmoid":
            return _sigmoid(node, x)
        if key == "tanh":
            return node.op("tanh", x)
        if key == "relu":
            return node.op("relu", x)
        if key == "affine":
            return node.op("add", node.op("multiply", x, _scalar(node, a, x)), _scalar(node, b, x))
        if key == "leakyrelu":
            neg = node.op("multiply", x, _scalar(node, a, x))
            return node.op("where", node.op("less", x, _scalar(node, 0, x)), neg, x)
        if key == "thresholdedrelu":
            return node.op("where", node.op("greater", x, _scalar(node, a, x)), x, _scalar(node, 0, x))
        if key == "scaledtanh":
            inner = node.op("tanh", node.op("multiply", x, _scalar(node, b, x)))
            return node.op("multiply", _scalar(node, a, x), inner)
        if key == "hardsigmoid":
            y = node.op("add", node.op("multiply", x, _scalar(node, a, x)), _scalar(node, b, x))
            return node.op("clip", y, _scalar(node, 0, x), _scalar(node, 1, x))
        if key == "elu":
            neg = node.op("multiply", _scalar(node, a, x), node.op("expm1", x))
            return node.op("where", node.op("less", x, _scalar(node, 0, x)), neg, x)
        if key == "softsign":
            return node.op("divide", x, node.op("add", _scalar(node, 1, x), node.op("abs", x)))
        if key == "softplus":
            return node.op("logaddexp", x, _scalar(node, 0, x))
        raise node.error(f"unknown activation {name!r}")
    return f


def _cols(node: Node, v: Any, start: int, stop: int) -> Any:
    return node.op("getitem", v, index=(Ellipsis, slice(start, stop)))


def _recurrent(node: Node, kind: str, x: Any, w: Any, r: Any, b: Any, seq_lens: Any, init_h: Any,
               init_c: Any = None, peep: Any = None) -> Any:
    """Unroll an ONNX RNN / GRU / LSTM over its static sequence length (see the ONNX operator docs)."""
    gates, defaults = {"RNN": (1, ["Tanh"]), "GRU": (3, ["Sigmoid", "Tanh"]),
                       "LSTM": (4, ["Sigmoid", "Tanh", "Tanh"])}[kind]
    direction = node.attr("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    if direction not in ("forward", "reverse", "bidirectional"):
        raise node.error(f"unknown direction {direction!r}")
    for i, (what, v) in enumerate((("X", x), ("W", w), ("R", r))):
        if len(node.shape(v)) != 3:
            raise node.error(f"input {i} ({what}) must be 3-D, it has shape {node.shape(v)}")
    layout = node.attr("layout", 0)
    if layout:
        x = node.op("permute_dims", x, axes=(1, 0, 2))
        init_h = None if init_h is None else node.op("permute_dims", init_h, axes=(1, 0, 2))
        init_c = None if init_c is None else node.op("permute_dims", init_c, axes=(1, 0, 2))
    steps, batch, _ = node.shape(x)
    hidden = node.shape(r)[-1]
    if node.shape(w)[0] != dirs:
        raise node.error(f"W has {node.shape(w)[0]} directions, direction {direction!r} needs {dirs}")
    if node.shape(r) != (dirs, gates * hidden, hidden):
        raise node.error(f"input 2 (R) has shape {node.shape(r)}, not (num_directions, {gates} * hidden_size, "
                         f"hidden_size) = {(dirs, gates * hidden, hidden)} (hidden_size {hidden} from its last axis)")
    dt = node.dtype(x)
    names = list(node.attr("activations", ()) or defaults * dirs)
    alphas = list(node.attr("activation_alpha", ()))
    betas = list(node.attr("activation_beta", ()))
    acts = []
    for name in names:
        key = name.lower()
        a = alphas.pop(0) if key in _ALPHA and alphas else None
        bb = betas.pop(0) if key in _BETA and betas else None
        acts.append(_activation(node, name, a, bb))
    per_dir = len(defaults)
    if len(acts) != per_dir * dirs:
        raise node.error(f"needs {per_dir * dirs} activations, got {len(acts)}")
    clip = node.attr("clip", None)

    def clipped(v: Any) -> Any:
        return v if clip is None else node.op("clip", v, _scalar(node, -clip, v), _scalar(node, clip, v))

    lens = None if seq_lens is None else node.cast(seq_lens, np.int64)
    lens_col = None if lens is None else node.op("reshape", lens, shape=(batch, 1))
    zeros = node.const(np.zeros((batch, hidden), dt))
    ys, hs, cs = [], [], []
    for d in range(dirs):
        f, g, h_act = [*acts[d * per_dir:(d + 1) * per_dir], None, None][:3]
        wd = node.op("getitem", w, index=(d,))
        rd = node.op("getitem", r, index=(d,))
        reverse = direction == "reverse" or d == 1
        xd = x
        if reverse:
            xd = node.op("flip", x, axis=0) if lens is None else node.op("reverse_sequence", x, lens,
                                                                        batch_axis=1, time_axis=0)
        # the input projection of every step at once: (T, B, gates * hidden)
        xw = node.op("matmul", xd, node.op("permute_dims", wd, axes=(1, 0)))
        if b is not None:
            bd = node.op("getitem", b, index=(d,))
            wb, rb = _cols(node, bd, 0, gates * hidden), _cols(node, bd, gates * hidden, 2 * gates * hidden)
            xw = node.op("add", xw, wb)
        else:
            rb = None
        rt = node.op("permute_dims", rd, axes=(1, 0))
        h = zeros if init_h is None else node.op("getitem", init_h, index=(d,))
        c = zeros if init_c is None else node.op("getitem", init_c, index=(d,))
        pd = None if peep is None else node.op("getitem", peep, index=(d,))
        outs = []
        for t in range(steps):
            xt = node.op("getitem", xw, index=(t,))
            if kind == "RNN":
                z = node.op("add", xt, node.op("matmul", h, rt))
                if rb is not None:
                    z = node.op("add", z, rb)
                h_new, c_new = f(clipped(z)), None
            elif kind == "GRU":
                rz = _cols(node, rt, 0, 2 * hidden)
                zr = node.op("add", _cols(node, xt, 0, 2 * hidden), node.op("matmul", h, rz))
                if rb is not None:
                    zr = node.op("add", zr, _cols(node, rb, 0, 2 * hidden))
                zr = f(clipped(zr))
                zg, rg = _cols(node, zr, 0, hidden), _cols(node, zr, hidden, 2 * hidden)
                rh = _cols(node, rt, 2 * hidden, 3 * hidden)
                rbh = None if rb is None else _cols(node, rb, 2 * hidden, 3 * hidden)
                if node.attr("linear_before_reset", 0):
                    hr = node.op("matmul", h, rh)
                    if rbh is not None:
                        hr = node.op("add", hr, rbh)
                    pre = node.op("multiply", rg, hr)
                else:
                    pre = node.op("matmul", node.op("multiply", rg, h), rh)
                    if rbh is not None:
                        pre = node.op("add", pre, rbh)
                cand = g(clipped(node.op("add", _cols(node, xt, 2 * hidden, 3 * hidden), pre)))
                one_minus = node.op("subtract", _scalar(node, 1, zg), zg)
                h_new, c_new = node.op("add", node.op("multiply", one_minus, cand), node.op("multiply", zg, h)), None
            else:
                z = node.op("add", xt, node.op("matmul", h, rt))
                if rb is not None:
                    z = node.op("add", z, rb)
                zi, zo, zf, zc = (_cols(node, z, k * hidden, (k + 1) * hidden) for k in range(4))
                if pd is not None:
                    zi = node.op("add", zi, node.op("multiply", _cols(node, pd, 0, hidden), c))
                    zf = node.op("add", zf, node.op("multiply", _cols(node, pd, 2 * hidden, 3 * hidden), c))
                ig = f(clipped(zi))
                if node.attr("input_forget", 0):
                    fg = node.op("subtract", _scalar(node, 1, ig), ig)
                else:
                    fg = f(clipped(zf))
                c_new = node.op("add", node.op("multiply", fg, c), node.op("multiply", ig, g(clipped(zc))))
                if pd is not None:
                    zo = node.op("add", zo, node.op("multiply", _cols(node, pd, hidden, 2 * hidden), c_new))
                h_new = node.op("multiply", f(clipped(zo)), h_act(c_new))  # type: ignore[misc]
            if lens_col is not None:
                # steps past a sequence's length keep its state and output zeros
                live = node.op("less", node.const(t, np.int64), lens_col)
                h_new = node.op("where", live, h_new, h)
                outs.append(node.op("where", live, h_new, zeros))
                if c_new is not None:
                    c_new = node.op("where", live, c_new, c)
            else:
                outs.append(h_new)
            h = h_new
            c = c_new if c_new is not None else c
        yd = node.op("stack", *outs, axis=0)
        if reverse:
            yd = node.op("flip", yd, axis=0) if lens is None else node.op("reverse_sequence", yd, lens,
                                                                          batch_axis=1, time_axis=0)
        ys.append(yd)
        hs.append(h)
        cs.append(c)
    y = node.op("stack", *ys, axis=1)  # (T, D, B, H)
    yh = node.op("stack", *hs, axis=0)  # (D, B, H)
    yc = node.op("stack", *cs, axis=0)
    if layout:
        y = node.op("permute_dims", y, axes=(2, 0, 1, 3))
        yh = node.op("permute_dims", yh, axes=(1, 0, 2))
        yc = node.op("permute_dims", yc, axes=(1, 0, 2))
    return (y, yh, yc) if kind == "LSTM" else (y, yh)


@translates("RNN")
def _rnn(node: Node, x: Any, w: Any, r: Any, b: Any = None, seq_lens: Any = None, init_h: Any = None) -> Any:
    return _recurrent(node, "RNN", x, w, r, b, seq_lens, init_h)


@translates("GRU")
def _gru(node: Node, x: Any, w: Any, r: Any, b: Any = None, seq_lens: Any = None, init_h: Any = None) -> Any:
    return _recurrent(node, "GRU", x, w, r, b, seq_lens, init_h)


@translates("LSTM")
def _lstm(node: Node, x: Any, w: Any, r: Any, b: Any = None, seq_lens: Any = None, init_h: Any = None,
          init_c: Any = None, peep: Any = None) -> Any:
    return _recurrent(node, "LSTM", x, w, r, b, seq_lens, init_h, init_c, peep)


# ================================================================ losses
@translates("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(node: Node, scores: Any, labels: Any, weights: Any = None) -> Any:
    if node.rank(scores) < 2:
        raise node.error(f"scores must be (N, C, ...), got shape {node.shape(scores)}")
    log_prob = node.op("log_softmax", scores, axis=1)
    labels = node.cast(labels, np.int64)
    ignore = node.attr("ignore_index", None)
    valid = None
    if ignore is not None:
        valid = node.op("not_equal", labels, node.const(ignore, np.int64))
        # ignored entries may hold any value (even out of range): point them at class 0, then zero them
        labels = node.op("where", valid, labels, node.const(0, np.int64))
    known, classes = node.known(labels), node.shape(scores)[1]
    if known is not None and ((known < -classes) | (known >= classes)).any():
        bad = known[(known < -classes) | (known >= classes)].reshape(-1)[0]
        raise node.error(f"labels (input 1) hold {int(bad)}, out of range for the {classes} classes of scores "
                         f"(axis 1 of input 0)")
    picked = node.op("gather_elements", log_prob, node.op("expand_dims", labels, axis=1), axis=1)
    loss = node.op("negative", node.op("squeeze", picked, axis=1))
    zero = _scalar(node, 0, loss)
    gathered = None
    if weights is not None:
        gathered = node.op("take", node.cast(weights, node.dtype(loss)), labels, axis=0)
        if valid is not None:
            gathered = node.op("where", valid, gathered, zero)
    elif valid is not None:
        gathered = node.cast(valid, node.dtype(loss))
    if gathered is not None:
        loss = node.op("multiply", gathered, loss)
    reduction = node.attr("reduction", "mean")
    if reduction == "mean":
        if gathered is not None:
            loss = node.op("divide", node.op("sum", loss), node.op("sum", gathered))
        else:
            loss = node.op("mean", loss)
    elif reduction == "sum":
        loss = node.op("sum", loss)
    elif reduction != "none":
        raise node.error(f"unknown reduction {reduction!r}")
    return loss, log_prob


@translates("LinearAttention")
def _linear_attention(node: Node, q: Any, k: Any, v: Any, past_state: Any = None, decay: Any = None,
                      beta: Any = None) -> Any:
    # The recurrence unrolled over the static sequence length, in float32 as ONNX's reference.
    rule = node.attr("update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise node.error(f"unknown update_rule {rule!r}")
    qh, kvh = node.attr("q_num_heads", 0), node.attr("kv_num_heads", 0)
    if qh <= 0 or kvh <= 0 or qh % kvh:
        raise node.error(f"q_num_heads ({qh}) must be a positive multiple of kv_num_heads ({kvh})")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise node.error(f"update_rule {rule!r} {'needs' if gating else 'forbids'} decay and "
                         f"{'needs' if delta else 'forbids'} beta")
    out_dt = node.dtype(q)
    f32 = np.float32
    q4, k4, v4 = (node.cast(_heads(node, t, h, f"input {i} ({name})"), f32)
                  for i, (t, h, name) in enumerate(((q, qh, "query"), (k, kvh, "key"), (v, kvh, "value"))))
    batch, steps, _ = node.shape(q)
    d_k, d_v = node.shape(q4)[-1], node.shape(v4)[-1]
    for i, name, t in ((4, "decay", decay), (5, "beta", beta)):
        if t is not None and len(node.shape(t)) != 3:
            raise node.error(f"input {i} ({name}) must be 3-D (batch, sequence, ...), it has shape {node.shape(t)}")
    if decay is not None:
        last = node.shape(decay)[-1]
        if last == kvh:
            decay = node.op("permute_dims", node.op("reshape", decay, shape=(batch, steps, kvh, 1)), axes=(0, 2, 1, 3))
        elif last == kvh * d_k:
            decay = _heads(node, decay, kvh)
        else:
            raise node.error(f"decay's last axis ({last}) must be kv_num_heads or kv_num_heads * d_k")
        decay = node.op("exp", node.cast(decay, f32))
    if beta is not None:
        last = node.shape(beta)[-1]
        beta = node.cast(node.op("permute_dims", node.op("reshape", beta, shape=(batch, steps, last, 1)),
                                 axes=(0, 2, 1, 3)), f32)
    state_dt = out_dt if past_state is None else node.dtype(past_state)
    state = node.const(np.zeros((batch, kvh, d_k, d_v), f32)) if past_state is None else node.cast(past_state, f32)
    scale = node.attr("scale", 0.0) or 1 / math.sqrt(d_k)
    outs = []
    for t in range(steps):
        at = (slice(None), slice(None), t)
        q_t, k_t, v_t = (node.op("getitem", a, index=at) for a in (q4, k4, v4))
        if decay is not None:
            state = node.op("multiply", state, node.op("expand_dims", node.op("getitem", decay, index=at), axis=-1))
        if beta is not None:
            retrieved = node.op("einsum", state, k_t, subscripts="bhdm,bhd->bhm")
            v_t = node.op("multiply", node.op("getitem", beta, index=at), node.op("subtract", v_t, retrieved))
        state = node.op("add", state, node.op("multiply", node.op("expand_dims", k_t, axis=-1),
                                              node.op("expand_dims", v_t, axis=-2)))
        read = state if qh == kvh else node.op("repeat", state, repeats=qh // kvh, axis=1)
        outs.append(node.op("multiply", node.op("einsum", q_t, read, subscripts="bhd,bhdm->bhm"),
                            node.const(scale, f32)))
    y = node.op("permute_dims", node.op("stack", *outs, axis=2), axes=(0, 2, 1, 3))
    return node.cast(node.op("reshape", y, shape=(batch, steps, qh * d_v)), out_dt), node.cast(state, state_dt)


@translates("CausalConvWithState")
def _causal_conv_with_state(node: Node, x: Any, w: Any, bias: Any = None, past_state: Any = None) -> Any:
    # A depthwise 1-D conv over [past_state, x]; the new state is the last k - 1 positions.
    for i, (what, v) in enumerate((("input", x), ("weight", w))):
        if len(node.shape(v)) != 3:
            raise node.error(f"input {i} ({what}) must be 3-D, it has shape {node.shape(v)}")
    batch, channels, _ = node.shape(x)
    k = node.shape(w)[-1]
    if k < 1:
        raise node.error(f"input 1 (weight) has kernel size 0 (shape {node.shape(w)})")
    pad = node.const(np.zeros((batch, channels, k - 1), node.dtype(x))) if past_state is None else past_state
    padded = node.op("concat", pad, x, axis=2) if k > 1 else x
    y = node.op("conv", padded, w, stride=(1,), padding=((0, 0),), dilation=(1,), groups=channels)
    if bias is not None:
        y = _bias_nd(node, y, bias)
    activation = node.attr("activation", "none")
    if activation in ("silu", "swish"):
        y32 = node.cast(y, np.float32)
        y = node.cast(node.op("multiply", y32, node.op("sigmoid", y32)), node.dtype(x))
    elif activation != "none":
        raise node.error(f"unknown activation {activation!r}")
    length = node.shape(padded)[2]
    state = node.op("getitem", padded, index=(slice(None), slice(None), slice(length - (k - 1), length)))
    return y, state


@translates("DeformConv")
def _deform_conv(node: Node, x: Any, w: Any, offset: Any, bias: Any = None, mask: Any = None) -> Any:
    # Each kernel tap reads x bilinearly (zero outside) at its offset position: grid_sample with
    # align_corners gathers the taps, then the weights contract them as an im2col convolution.
    xs, ws = node.shape(x), node.shape(w)
    if len(xs) != 4:
        raise node.error(f"only 2-D deformable convolution is supported, got input shape {xs}")
    n, c, ih, iw = xs
    oc, icg, kh, kw = ws
    kernel = tuple(node.attr("kernel_shape", ()) or (kh, kw))
    strides, dilations, pads = _spatial_attrs(node, xs, kernel)
    group, og = node.attr("group", 1), node.attr("offset_group", 1)
    oh, ow = node.shape(offset)[2:]
    taps = kh * kw
    dt = node.dtype(x)
    ti, tj = np.meshgrid(np.arange(kh) * dilations[0], np.arange(kw) * dilations[1], indexing="ij")
    base_y = (ti[:, :, None, None] + (np.arange(oh) * strides[0] - pads[0][0])[:, None]).astype(dt)
    base_x = (tj[:, :, None, None] + (np.arange(ow) * strides[1] - pads[1][0])[None, :]).astype(dt)
    off = node.op("reshape", node.cast(offset, dt), shape=(n, og, kh, kw, 2, oh, ow))
    if mask is not None:
        mask = node.op("reshape", node.cast(mask, dt), shape=(n, og, taps, oh, ow))
    cols = []
    per_og = c // og
    for g in range(og):
        gy = node.op("add", node.const(base_y), node.op("getitem", off, index=(slice(None), g, Ellipsis, 0,
                                                                               slice(None), slice(None))))
        gx = node.op("add", node.const(base_x), node.op("getitem", off, index=(slice(None), g, Ellipsis, 1,
                                                                               slice(None), slice(None))))
        # normalised (x, y) with align_corners: -1 and 1 are the centres of the first and last pixels
        gx = node.op("subtract", node.op("multiply", gx, node.const(2 / (iw - 1) if iw > 1 else 0.0, dt)),
                     node.const(1, dt))
        gy = node.op("subtract", node.op("multiply", gy, node.const(2 / (ih - 1) if ih > 1 else 0.0, dt)),
                     node.const(1, dt))
        grid = node.op("reshape", node.op("stack", gx, gy, axis=-1), shape=(n, taps * oh, ow, 2))
        xg = node.op("getitem", x, index=(slice(None), slice(g * per_og, (g + 1) * per_og)))
        sampled = node.op("grid_sample", xg, grid, mode="linear", padding_mode="zeros", align_corners=True)
        sampled = node.op("reshape", sampled, shape=(n, per_og, taps, oh, ow))
        if mask is not None:
            sampled = node.op("multiply", sampled, node.op("expand_dims", node.op("getitem", mask, index=(
                slice(None), g)), axis=1))
        cols.append(sampled)
    col = cols[0] if og == 1 else node.op("concat", *cols, axis=1)  # (N, C, K, oh, ow)
    col = node.op("reshape", col, shape=(n, group, icg, taps, oh, ow))
    wg = node.op("reshape", w, shape=(group, oc // group, icg, taps))
    y = node.op("reshape", node.op("einsum", col, wg, subscripts="ngckhw,gock->ngohw"), shape=(n, oc, oh, ow))
    return y if bias is None else _bias_nd(node, y, bias)


@translates("FlexAttention", domain="ai.onnx.preview")
def _flex_attention(node: Node, q: Any, k: Any, v: Any) -> Any:
    # As ONNX's reference: scores in float32 for float16 inputs (or softmax_precision), then the optional
    # score_mod and prob_mod subgraphs, inlined on the scores and probabilities.
    if node.rank(q) != 4 or node.rank(k) != 4 or node.rank(v) != 4:
        raise node.error("Q, K and V must be 4-D (batch, heads, sequence, head size)")
    head = node.shape(q)[-1]
    n_q, n_kv = node.shape(q)[1], node.shape(k)[1]
    if n_q != n_kv:
        if n_q % n_kv:
            raise node.error(f"{n_q} query heads are not a multiple of {n_kv} key/value heads")
        k = node.op("repeat", k, repeats=n_q // n_kv, axis=1)
        v = node.op("repeat", v, repeats=n_q // n_kv, axis=1)
    scale = node.attr("scale", None)
    root = node.const(np.sqrt(np.float32(1 / math.sqrt(head) if scale is None else scale)), node.dtype(q))
    scores = node.op("matmul", node.op("multiply", q, root),
                     node.op("permute_dims", node.op("multiply", k, root), axes=(0, 1, 3, 2)))
    precision = node.attr("softmax_precision", None)
    dt = node.dtype(q)
    work = np_dtype(precision, node.label) if precision is not None else (
        np.dtype(np.float32) if dt.itemsize < 4 else dt)
    scores = node.cast(scores, work)
    scope = getattr(node, "scope", None) or node.imp.scope
    if "score_mod" in node.attrs:
        scores = node.cast(node.subgraph("score_mod", [scores], scope)[0], work)
    probs = node.op("softmax", scores, axis=-1)
    if "prob_mod" in node.attrs:
        probs = node.cast(node.subgraph("prob_mod", [probs], scope)[0], work)
    return node.cast(node.op("matmul", probs, node.cast(v, work)), node.dtype(v))
