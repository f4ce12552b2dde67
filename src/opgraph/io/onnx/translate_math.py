"""ONNX -> opgraph translators: elementwise math, comparisons, reductions, matrix products, casts, quantization.

ONNX broadcasting is NumPy's, so binary ops map one to one. Where NumPy would
widen a result (sums and products of small integers), the result is cast back
to the type ONNX keeps. Integer ops (``MatMulInteger``, ``ConvInteger``,
``QLinear*``) compute in int32 or, for convolutions, in float64, which is exact
for 8-bit operands.

    >>> from opgraph.io.onnx._core import TRANSLATORS
    >>> ("", "Relu") in TRANSLATORS and ("", "ReduceSum") in TRANSLATORS
    True
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from opgraph.io.onnx._core import FOLD_LIMIT, Node, translates
from opgraph.io.onnx.translate_nn import conv_pads

_UNARY = {
    "Abs": "abs", "Neg": "negative", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
    "Sinh": "sinh", "Cosh": "cosh", "Tanh": "tanh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sign": "sign", "Erf": "erf", "Not": "logical_not",
    "Sigmoid": "sigmoid", "Relu": "relu", "IsNaN": "isnan", "BitwiseNot": "bitwise_invert",
}

_BINARY = {
    "Add": "add", "Sub": "subtract", "Mul": "multiply", "And": "logical_and", "Or": "logical_or",
    "Xor": "logical_xor", "Equal": "equal", "Greater": "greater", "Less": "less",
    "GreaterOrEqual": "greater_equal", "LessOrEqual": "less_equal",
    "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor",
}


def _unary(kind: str) -> Any:
    def translate(node: Node, x: Any) -> Any:
        y = node.op(kind, x)
        # SciPy's sigmoid and erf have no float16 loop, so NumPy's rules widen; ONNX keeps the input's type
        if node.dtype(x).kind == "f" and node.dtype(y).kind == "f" and node.dtype(y) != node.dtype(x):
            y = node.cast(y, node.dtype(x))
        return y
    return translate


def _binary(kind: str) -> Any:
    def translate(node: Node, a: Any, b: Any) -> Any:
        return node.op(kind, a, b)
    return translate


for _onnx, _kind in _UNARY.items():
    translates(_onnx)(_unary(_kind))
for _onnx, _kind in _BINARY.items():
    translates(_onnx)(_binary(_kind))


@translates("Div")
def _div(node: Node, a: Any, b: Any) -> Any:
    # ONNX integer division truncates toward zero (C semantics), NumPy's floor_divide floors.
    if node.dtype(a).kind in "iu":
        q = node.op("floor_divide", a, b)
        if node.dtype(a).kind == "u":
            return q
        r = node.op("fmod", a, b)
        fix = node.op("logical_and", node.op("not_equal", r, node.const(0, node.dtype(a))),
                      node.op("less", node.op("multiply", node.op("sign", a), node.op("sign", b)),
                              node.const(0, node.dtype(a))))
        return node.op("add", q, node.op("cast", fix, dtype=node.dtype(a).name))
    return node.op("divide", a, b)


@translates("Mod")
def _mod(node: Node, a: Any, b: Any) -> Any:
    return node.op("fmod" if node.attr("fmod", 0) else "remainder", a, b)


@translates("Pow")
def _pow(node: Node, a: Any, b: Any) -> Any:
    # ONNX Pow's result has the base's type; NumPy would promote.
    dt = node.dtype(a)
    if node.dtype(b) != dt:
        if dt.kind in "iu" and node.dtype(b).kind == "f":
            return node.cast(node.op("power", node.cast(a, node.dtype(b)), b), dt)
        b = node.cast(b, dt)
    return node.op("power", a, b)


@translates("BitShift")
def _bitshift(node: Node, a: Any, b: Any) -> Any:
    left = node.attr("direction") == "LEFT"
    return node.op("bitwise_left_shift" if left else "bitwise_right_shift", a, b)


@translates("IsInf")
def _isinf(node: Node, x: Any) -> Any:
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    inf = node.op("isinf", x)
    if pos and neg:
        return inf
    if not pos and not neg:
        return node.op("logical_and", inf, node.const(False))
    side = node.op("greater" if pos else "less", x, node.const(0, node.dtype(x)))
    return node.op("logical_and", inf, side)


def _variadic(kind: str) -> Any:
    def translate(node: Node, *xs: Any) -> Any:
        return functools.reduce(lambda a, b: node.op(kind, a, b), xs)
    return translate


translates("Sum")(_variadic("add"))
translates("Max")(_variadic("maximum"))
translates("Min")(_variadic("minimum"))


@translates("Mean")
def _mean(node: Node, *xs: Any) -> Any:
    total = functools.reduce(lambda a, b: node.op("add", a, b), xs)
    return node.op("divide", total, node.const(len(xs), node.dtype(total)))


@translates("Where")
def _where(node: Node, c: Any, a: Any, b: Any) -> Any:
    return node.op("where", c, a, b)


@translates("Clip")
def _clip(node: Node, x: Any, lo: Any = None, hi: Any = None) -> Any:
    dt = node.dtype(x)
    if node.opset < 11 and lo is None and hi is None:
        lo = node.const(node.attr("min", -np.inf), dt) if "min" in node.attrs else None
        hi = node.const(node.attr("max", np.inf), dt) if "max" in node.attrs else None
    if lo is not None:
        x = node.op("maximum", x, lo)
    if hi is not None:
        x = node.op("minimum", x, hi)
    return x


@translates("Identity")
def _identity(node: Node, x: Any) -> Any:
    return x


@translates("Cast")
def _cast(node: Node, x: Any) -> Any:
    from opgraph.io.onnx._core import np_dtype

    dt = np_dtype(node.attr("to"), node.label)
    return node.cast(x, dt)


@translates("CastLike")
def _cast_like(node: Node, x: Any, like: Any) -> Any:
    return node.cast(x, node.dtype(like))


# ---------------------------------------------------------------- reductions
def _axes(node: Node, axes_input: Any, rank: int) -> tuple[int, ...] | None:
    """The reduced axes (attribute before the op's opset moved them to an input); None = all."""
    if axes_input is not None:
        axes = node.static_ints(1, "axes (input 1)")
    else:
        axes = tuple(node.attr("axes", ()))
    if not axes:
        return None if not node.attr("noop_with_empty_axes", 0) else ()
    if rank == 0:
        # ONNX's axes range [-r, r - 1] is empty for a scalar
        raise node.error(f"axes {list(axes)} are out of range for input 0, a scalar (rank 0)")
    return node.axes(axes, rank)


def _reduce(kind: str, pre: str | None = None, post: str | None = None) -> Any:
    def translate(node: Node, x: Any, axes_input: Any = None) -> Any:
        dt = node.dtype(x)
        shape = node.dims(x)
        axes = _axes(node, axes_input, len(shape))
        keep = bool(node.attr("keepdims", 1))
        if pre == "abs":
            x = node.op("abs", x)
        elif pre == "square":
            x = node.op("multiply", x, x)
        elif pre == "exp":
            x = node.op("exp", x)
        if axes == ():
            y = x
        elif kind in ("max", "min", "logsumexp") and 0 in [shape[a] for a in (axes or range(len(shape)))]:
            # NumPy refuses these over nothing; ONNX gives the identity of the reduction
            shape = node.shape(x, why="a reduction over an empty axis is a constant of the result's shape")
            out_shape = _reduced_shape(shape, axes, keep)
            if math.prod(out_shape) * np.dtype(dt).itemsize > FOLD_LIMIT:
                raise node.error(f"its result {list(out_shape)}, a reduction over nothing, would take "
                                 f"{math.prod(out_shape) * np.dtype(dt).itemsize} bytes, more than opgraph makes "
                                 f"while importing ({FOLD_LIMIT})")
            y = node.const(np.full(out_shape, _empty_identity(kind, dt), dtype=dt))
        else:
            y = node.op(kind, x, axis=axes, keepdims=keep)
        if post == "sqrt":
            y = node.op("sqrt", y)
        elif post == "log":
            y = node.op("log", y)
        # NumPy widens small integer sums and products; ONNX keeps the input's type
        return node.cast(y, dt)
    return translate


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...] | None, keep: bool) -> tuple[int, ...]:
    red = set(range(len(shape))) if axes is None else set(axes)
    return tuple(1 if i in red else d for i, d in enumerate(shape) if keep or i not in red)


def _empty_identity(kind: str, dt: np.dtype) -> Any:
    if dt.kind == "b":
        return kind == "min"
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return info.min if kind == "max" else info.max
    return np.inf if kind == "min" else -np.inf


translates("ReduceSum")(_reduce("sum"))
translates("ReduceMean")(_reduce("mean"))
translates("ReduceProd")(_reduce("prod"))
translates("ReduceMax")(_reduce("max"))
translates("ReduceMin")(_reduce("min"))
translates("ReduceL1")(_reduce("sum", pre="abs"))
translates("ReduceL2")(_reduce("sum", pre="square", post="sqrt"))
translates("ReduceSumSquare")(_reduce("sum", pre="square"))
translates("ReduceLogSum")(_reduce("sum", post="log"))
translates("ReduceLogSumExp")(_reduce("logsumexp"))


def _arg(kind: str) -> Any:
    def translate(node: Node, x: Any) -> Any:
        shape = node.dims(x)
        axis = node.axis(node.attr("axis", 0), len(shape))
        if shape and shape[axis] == 0:
            # opgraph's argmax, like NumPy's, would fail only when run; ONNX has no index to give either
            raise node.error(f"axis {axis} of input 0 (shape {shape}) is empty: there is no index to return")
        keep = bool(node.attr("keepdims", 1))
        if node.attr("select_last_index", 0):
            x = node.op("flip", x, axis=axis)
            n = node.shape(x, (axis,), "select_last_index counts from the end of the axis")[axis]
            idx = node.op(kind, x, axis=axis, keepdims=keep)
            return node.op("subtract", node.const(n - 1, np.int64), idx)
        return node.op(kind, x, axis=axis, keepdims=keep)
    return translate


translates("ArgMax")(_arg("argmax"))
translates("ArgMin")(_arg("argmin"))


# ---------------------------------------------------------------- products
@translates("MatMul")
def _matmul(node: Node, a: Any, b: Any) -> Any:
    return node.op("matmul", a, b)


@translates("Gemm")
def _gemm(node: Node, a: Any, b: Any, c: Any = None) -> Any:
    if node.attr("transA", 0):
        a = node.op("permute_dims", a, axes=(1, 0))
    if node.attr("transB", 0):
        b = node.op("permute_dims", b, axes=(1, 0))
    y = node.op("matmul", a, b)
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    if alpha != 1.0:
        y = node.op("multiply", y, node.const(alpha, node.dtype(y)))
    if c is not None:
        if beta != 1.0:
            c = node.op("multiply", c, node.const(beta, node.dtype(c)))
        y = node.op("add", y, c)
    return y


@translates("Einsum")
def _einsum(node: Node, *xs: Any) -> Any:
    return node.op("einsum", *xs, subscripts=node.attr("equation").replace(" ", ""))


@translates("Det")
def _det(node: Node, x: Any) -> Any:
    return node.op("det", x)


def _cumulative(kind: str, identity: float) -> Any:
    def translate(node: Node, x: Any, axis: Any) -> Any:
        r = node.rank(x)
        dt = node.dtype(x)
        ax = node.axis(int(np.asarray(node.static(axis, "axis")).reshape(-1)[0]), r)
        reverse, exclusive = node.attr("reverse", 0), node.attr("exclusive", 0)
        if reverse:
            x = node.op("flip", x, axis=ax)
        y = node.op(kind, x, axis=ax)
        if exclusive:
            # shift by one along the axis (subtracting or dividing by x would lose precision)
            pads = tuple((1, 0) if i == ax else (0, 0) for i in range(r))
            index = tuple(slice(None, -1) if i == ax else slice(None) for i in range(r))
            y = node.op("getitem", node.op("pad", y, pad_width=pads, constant_value=identity), index=index)
        if reverse:
            y = node.op("flip", y, axis=ax)
        # NumPy accumulates small integers in int64; ONNX keeps the input's type
        return node.cast(y, dt)
    return translate


translates("CumSum")(_cumulative("cumsum", 0.0))
translates("CumProd")(_cumulative("cumprod", 1.0))


@translates("Hardmax")
def _hardmax(node: Node, x: Any) -> Any:
    shape = node.shape(x)
    r = len(shape)
    dt = node.dtype(x)
    on_off = node.const(np.array([0, 1], dtype=dt))
    if node.opset >= 13:
        ax = node.axis(node.attr("axis", -1), r)
        idx = node.op("argmax", x, axis=ax, keepdims=False)
        return node.op("one_hot", idx, on_off, depth=shape[ax], axis=ax)
    # before opset 13 the input is flattened to 2-D at ``axis``
    ax = node.axis(node.attr("axis", 1), r)
    rows, cols = int(np.prod(shape[:ax], dtype=np.int64)), int(np.prod(shape[ax:], dtype=np.int64))
    idx = node.op("argmax", node.op("reshape", x, shape=(rows, cols)), axis=1, keepdims=False)
    return node.op("reshape", node.op("one_hot", idx, on_off, depth=cols, axis=1), shape=shape)


# ---------------------------------------------------------------- quantization
# ONNX quantizes as saturate(round_half_even(x / scale) + zero_point); scales and zero points are
# scalars, per-axis vectors or (opset 21) blocks along ``axis``.
_QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
           "int32": (-2**31, 2**31 - 1)}


def _qparam(node: Node, v: Any, shape: tuple[int, ...], axis: int, block: int) -> Any:
    """A scale or zero point reshaped (or repeated, for blocks) to broadcast against ``shape``."""
    vs = node.shape(v)
    if int(np.prod(vs, dtype=np.int64)) == 1:
        return node.op("reshape", v, shape=())
    axis = node.axis(axis, len(shape))
    if not block:
        if len(vs) != 1 or vs[0] != shape[axis]:
            raise node.error(f"a per-axis scale or zero point must have shape ({shape[axis]},), got {vs}")
        return node.op("reshape", v, shape=tuple(vs[0] if i == axis else 1 for i in range(len(shape))))
    if len(vs) != len(shape):
        raise node.error(f"a blocked scale or zero point must have x's rank {len(shape)}, got shape {vs}")
    rep = node.op("repeat", v, repeats=block, axis=axis)
    return node.op("getitem", rep, index=tuple(slice(0, shape[axis]) if i == axis else slice(None)
                                              for i in range(len(shape))))


def _quant_dtype(node: Node, zp: Any) -> np.dtype:
    from opgraph.io.onnx._core import np_dtype

    if zp is not None:
        dt = node.dtype(zp)
    elif "output_dtype" in node.attrs and node.attr("output_dtype"):
        dt = np_dtype(node.attr("output_dtype"), node.label)
    else:
        dt = np.dtype(np.uint8)
    if dt.name not in _QRANGE or dt.name == "int32":
        raise node.error(f"opgraph cannot quantize to {dt}")
    return dt


def _saturate(node: Node, q: Any, zp: Any, dt: np.dtype) -> Any:
    """round(q) + zp, clipped to ``dt``'s range, as ``dt``; q is a float tensor."""
    lo, hi = _QRANGE[dt.name]
    # clip before the cast so infinities and huge values saturate instead of wrapping
    q = node.op("clip", node.op("round", q), node.const(-2.0**24, node.dtype(q)), node.const(2.0**24, node.dtype(q)))
    qi = node.cast(q, np.int32)
    if zp is not None:
        qi = node.op("add", qi, node.cast(zp, np.int32))
    qi = node.op("clip", qi, node.const(lo, np.int32), node.const(hi, np.int32))
    return node.cast(qi, dt)


@translates("QuantizeLinear")
def _quantize_linear(node: Node, x: Any, scale: Any, zp: Any = None) -> Any:
    from opgraph.io.onnx._core import np_dtype

    shape = node.shape(x)
    axis = node.attr("axis", 1)  # checked only where a per-axis scale uses it
    block = int(node.attr("block_size", 0))
    dt = _quant_dtype(node, zp)
    s = _qparam(node, scale, shape, axis, block)
    z = _qparam(node, zp, shape, axis, block) if zp is not None else None
    if node.attr("precision", 0):
        prec = np_dtype(node.attr("precision"), node.label)
        x, s = node.cast(x, prec), node.cast(s, prec)
    return _saturate(node, node.op("divide", x, s), z, dt)


@translates("DequantizeLinear")
def _dequantize_linear(node: Node, x: Any, scale: Any, zp: Any = None) -> Any:
    from opgraph.io.onnx._core import np_dtype

    shape = node.shape(x)
    axis = node.attr("axis", 1)  # checked only where a per-axis scale uses it
    block = int(node.attr("block_size", 0))
    out = np_dtype(node.attr("output_dtype"), node.label) if node.attr("output_dtype", 0) else node.dtype(scale)
    dx = node.cast(x, np.float32)
    if zp is not None:
        dx = node.op("subtract", dx, node.cast(_qparam(node, zp, shape, axis, block), np.float32))
    y = node.op("multiply", dx, node.cast(_qparam(node, scale, shape, axis, block), np.float32))
    return node.cast(y, out)


def _minus_zero_point(node: Node, x: Any, zp: Any, dtype: Any, row_axis: int | None = None) -> Any:
    """``x - zp`` in ``dtype``; a vector ``zp`` runs along ``row_axis`` of x (default: the last axis)."""
    x = node.cast(x, dtype)
    if zp is None:
        return x
    zs = node.shape(zp)
    z = node.cast(zp, dtype)
    if int(np.prod(zs, dtype=np.int64)) == 1:
        z = node.op("reshape", z, shape=())
    elif row_axis is not None:
        r = node.rank(x)
        z = node.op("reshape", z, shape=tuple(-1 if i == row_axis % r else 1 for i in range(r)))
    return node.op("subtract", x, z)


@translates("MatMulInteger")
def _matmul_integer(node: Node, a: Any, b: Any, a_zp: Any = None, b_zp: Any = None) -> Any:
    # a's zero point may be per row of a, b's per column of b
    a = _minus_zero_point(node, a, a_zp, np.int32, row_axis=-2 if node.rank(a) >= 2 else None)
    b = _minus_zero_point(node, b, b_zp, np.int32)
    return node.op("matmul", a, b)


@translates("QLinearMatMul")
def _qlinear_matmul(node: Node, a: Any, a_scale: Any, a_zp: Any, b: Any, b_scale: Any, b_zp: Any,
                    y_scale: Any, y_zp: Any) -> Any:
    a = _minus_zero_point(node, a, a_zp, np.int32, row_axis=-2 if node.rank(a) >= 2 else None)
    b = _minus_zero_point(node, b, b_zp, np.int32)
    c = node.cast(node.op("matmul", a, b), np.float64)
    if node.rank(a) >= 2 and int(np.prod(node.shape(a_scale), dtype=np.int64)) > 1:
        a_scale = node.op("reshape", a_scale, shape=(-1, 1))
    # the combined scale is computed in the scales' own type, as ONNX does
    factor = node.op("divide", node.op("multiply", a_scale, b_scale), y_scale)
    y = node.op("multiply", c, node.cast(factor, np.float64))
    return _saturate(node, y, y_zp, node.dtype(y_zp))


def _int_conv(node: Node, x: Any, x_zp: Any, w: Any, w_zp: Any) -> Any:
    """The convolution of ``x - x_zp`` with ``w - w_zp`` in float64 (exact for 8-bit operands)."""
    xs, ws = node.shape(x), node.shape(w)
    n = len(xs) - 2
    kernel = tuple(node.attr("kernel_shape", ws[2:]))
    strides = tuple(node.attr("strides", (1,) * n))
    dilations = tuple(node.attr("dilations", (1,) * n))
    xf = _minus_zero_point(node, x, x_zp, np.float64)
    wf = _minus_zero_point(node, w, w_zp, np.float64, row_axis=0)  # per output channel
    return node.op("conv", xf, wf, stride=strides, padding=conv_pads(node, xs[2:], kernel, strides, dilations),
                   dilation=dilations, groups=node.attr("group", 1))


@translates("ConvInteger")
def _conv_integer(node: Node, x: Any, w: Any, x_zp: Any = None, w_zp: Any = None) -> Any:
    return node.cast(_int_conv(node, x, x_zp, w, w_zp), np.int32)


@translates("QLinearConv")
def _qlinear_conv(node: Node, x: Any, x_scale: Any, x_zp: Any, w: Any, w_scale: Any, w_zp: Any,
                  y_scale: Any, y_zp: Any, bias: Any = None) -> Any:
    y = _int_conv(node, x, x_zp, w, w_zp)
    n = node.rank(x) - 2
    if bias is not None:
        y = node.op("add", y, node.op("reshape", node.cast(bias, np.float64), shape=(1, -1) + (1,) * n))
    if int(np.prod(node.shape(w_scale), dtype=np.int64)) > 1:
        w_scale = node.op("reshape", w_scale, shape=(1, -1) + (1,) * n)
    factor = node.op("divide", node.op("multiply", x_scale, w_scale), y_scale)
    # ONNX Runtime requantises in the scales' type: the accumulator (exact there below 2**24) times the combined
    # scale, rounded in float32; a float64 product rounds differently near .5
    return _saturate(node, node.op("multiply", node.cast(y, node.dtype(factor)), factor), y_zp, node.dtype(y_zp))
