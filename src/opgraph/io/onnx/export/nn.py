"""ONNX export of the neural-network ops (:mod:`opgraph.ops.nn`): convolutions, pools, softmax, normalisations.

    >>> import opgraph
    >>> from opgraph.io.onnx import to_onnx
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2, 3)), name="x")
    >>> b.output(b.op("softmax", b.op("relu", x), axis=-1))
    >>> [n.op_type for n in to_onnx(b.freeze()).graph.node]
    ['Relu', 'Softmax']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from opgraph.core.types import TensorType
from opgraph.io.onnx.export import EXPORT, Exporter, OnnxExportError
from opgraph.io.onnx.export.common import AttrMap, Names, Types, elem_type, nan_wins


@EXPORT.rule("relu")
def _relu(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    if it[0].dtype.kind in "ub":  # Relu takes no unsigned ints: they are their own relu
        return [ex.one("Identity", ins[0])]
    return [ex.one("Relu", ins[0])]


#: the float dtype that holds every value of an integer dtype MaxPool does not take (int8 and uint8 it does)
_POOL_AS = {"int16": np.float32, "uint16": np.float32, "int32": np.float64, "uint32": np.float64}


@EXPORT.rule("softmax", "log_softmax")
def _softmax(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    op_type = "Softmax" if ex.current_kind == "softmax" else "LogSoftmax"
    return [ex.one(op_type, ins[0], axis=int(attrs.get("axis", -1)))]


def _spatial(attrs: dict[str, Any], it: list[TensorType], w_shape: tuple[int, ...] | None = None) -> dict[str, Any]:
    """ONNX kernel/stride/dilation/pads attributes from opgraph's N-d conv and pool attributes."""
    n = len(it[0].shape or ()) - 2
    kernel = attrs.get("kernel_size") or (w_shape[2:] if w_shape else None)
    stride = attrs.get("stride") or (1,) * n  # the N-d ops' None stride is 1, as in ONNX
    padding = attrs.get("padding") or ((0, 0),) * n
    out = {"strides": list(stride), "pads": [p[0] for p in padding] + [p[1] for p in padding]}
    if kernel is not None and "kernel_size" in attrs:
        out["kernel_shape"] = list(kernel)
    if attrs.get("dilation") is not None:
        out["dilations"] = list(attrs["dilation"])
    return out


@EXPORT.rule("conv", "conv_transpose")
def _conv(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    extra = _spatial(attrs, it)
    if attrs.get("output_padding") is not None:
        extra["output_padding"] = list(attrs["output_padding"])
    op_type = "Conv" if ex.current_kind == "conv" else "ConvTranspose"
    return [ex.one(op_type, *ins, group=int(attrs.get("groups", 1)), **extra)]


@EXPORT.rule("conv2d")
def _conv2d(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    from opgraph.ops.nn import pad4

    top, bottom, left, right = pad4(attrs["padding"])
    return [ex.one("Conv", *ins, strides=list(attrs["stride"]), dilations=list(attrs["dilation"]),
                   pads=[top, left, bottom, right], group=int(attrs["groups"]))]


def _max_pool(ex: Exporter, x: str, t: TensorType, **attrs: Any) -> str:
    """MaxPool propagating NaN (see _nan_wins), the NaN-aware fix-up only when ``x`` holds a NaN.

    The plain MaxPool stays outside an ``If`` on one whole-tensor NaN test, so that ONNX Runtime keeps it in
    its blocked layout; the NaN-aware form pools the mask a second time. Measured on ResNet-18 in ONNX
    Runtime (1 thread): the fix-up in every call cost about 10% of the forward pass, this form about 5%.
    With ``to_onnx(..., nan_semantics="onnx")`` it is the plain MaxPool.
    """
    if t.dtype.name in _POOL_AS:  # exact: the float type holds every value
        y = ex.one("MaxPool", ex.one("Cast", x, to=elem_type(_POOL_AS[t.dtype.name])), **attrs)
        return ex.one("Cast", y, to=elem_type(t.dtype))
    if t.dtype.kind in "iu" and t.dtype.itemsize == 8:
        raise OnnxExportError(f"ONNX's MaxPool does not take {t.dtype}, and no float type holds all its values")
    if t.dtype.kind != "f" or ex.nan_semantics == "onnx":
        return ex.one("MaxPool", x, **attrs)
    if attrs.get("ceil_mode"):  # ONNX Runtime's shape inference of a ceil_mode MaxPool inside If disagrees with its
        # kernel (it preallocates the wrong output shape), so ceil_mode keeps the single NaN-aware form
        return nan_wins(ex, x, t, ex.one("MaxPool", x, **attrs), lambda m: ex.one("MaxPool", m, **attrs))
    y = ex.one("MaxPool", x, **attrs)  # outside the If, where ONNX Runtime can keep it in its blocked layout
    any_nan = ex.one("ReduceMax", ex.one("Cast", ex.one("IsNaN", x), to=TensorProto.INT32), keepdims=0)
    cond = ex.one("Greater", any_nan, ex.const(np.int32(0)))

    def branch(build: Callable[[], str], name: str) -> onnx.GraphProto:
        outer, ex.nodes = ex.nodes, []
        try:
            out = build()
            nodes = ex.nodes
        finally:
            ex.nodes = outer
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, elem_type(t.dtype), None)])

    exact = branch(lambda: nan_wins(ex, x, t, y, lambda m: ex.one("MaxPool", m, **attrs)), ex.fresh("nan_pool"))
    plain = branch(lambda: ex.one("Identity", y), ex.fresh("pool"))
    return ex.one("If", cond, then_branch=exact, else_branch=plain)


@EXPORT.rule("max_pool2d", "avg_pool2d")
def _pool2d(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    from opgraph.ops.nn import pad4

    top, bottom, left, right = pad4(attrs["padding"])
    kernel = list(attrs["kernel_size"])
    is_max = ex.current_kind == "max_pool2d"
    spatial = {"kernel_shape": kernel, "strides": list(attrs["stride"] or kernel), "pads": [top, left, bottom, right]}
    x, t = ins[0], it[0]
    unbatched = len(t.shape or ()) == 3  # (C, H, W): ONNX's pools want (N, C, H, W)
    if unbatched:
        x, t = ex.one("Unsqueeze", x, ex.ints([0])), TensorType(t.dtype, (1, *(t.shape or ())))
    if is_max:
        y = _max_pool(ex, x, t, **spatial)
    else:
        y = ex.one("AveragePool", x, count_include_pad=int(attrs["count_include_pad"]), **spatial)
    return [ex.one("Squeeze", y, ex.ints([0])) if unbatched else y]


@EXPORT.rule("max_pool", "avg_pool", "lp_pool")
def _pool(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    kind = ex.current_kind
    extra = _spatial(attrs, it)
    extra["ceil_mode"] = int(attrs.get("ceil_mode", False))
    if kind == "avg_pool":
        extra["count_include_pad"] = int(attrs.get("count_include_pad", False))
    if kind == "lp_pool":
        if float(attrs["p"]) != int(attrs["p"]):
            raise OnnxExportError(f"ONNX LpPool takes an integer p, not {attrs['p']}")
        extra["p"] = int(attrs["p"])
    if kind == "max_pool":
        return [_max_pool(ex, ins[0], it[0], **extra)]
    op_type = {"avg_pool": "AveragePool", "lp_pool": "LpPool"}[kind]
    return [ex.one(op_type, ins[0], **extra)]


@EXPORT.rule("lrn")
def _lrn(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("LRN", ins[0], size=int(attrs["size"]), alpha=float(attrs["alpha"]), beta=float(attrs["beta"]),
                   bias=float(attrs["bias"]))]


@EXPORT.rule("layer_norm")
def _layer_norm(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    x = it[0]
    if x.shape is None or any(d is None for d in x.shape):
        raise OnnxExportError(f"layer_norm needs a static input shape to export, got {x}")
    axis = int(attrs["axis"]) % len(x.shape)
    norm_shape = tuple(int(d) for d in x.shape[axis:])
    # LayerNormalization needs a scale; a bias given without one is not expressible, nor is either one that
    # varies along a leading axis: those are multiplied and added after the node
    scale = ins[1] if len(ins) > 1 and _trailing(it[1], axis, len(x.shape)) else None
    bias = ins[2] if len(ins) > 2 and scale is not None and _trailing(it[2], axis, len(x.shape)) else None
    node_ins = [ins[0], scale if scale is not None else ex.const(np.ones(norm_shape, x.dtype))]
    if bias is not None:
        node_ins.append(bias)
    y = ex.one("LayerNormalization", *node_ins, axis=axis, epsilon=float(attrs["epsilon"]))
    if len(ins) > 1 and scale is None:
        y = ex.one("Mul", y, ins[1])
    if len(ins) > 2 and bias is None:
        y = ex.one("Add", y, ins[2])
    return [y]


def _trailing(t: TensorType, axis: int, rank: int) -> bool:
    """True when a scale or bias of type ``t`` varies only along the normalised axes ``axis`` .. ``rank - 1``."""
    shape = t.shape or ()
    return all(d == 1 for d in shape[:max(len(shape) - (rank - axis), 0)])
