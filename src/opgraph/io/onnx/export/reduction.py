"""ONNX export of the reductions (:mod:`opgraph.ops.reduction`): ONNX's ``Reduce*`` nodes, made to propagate NaN
and to treat bools as NumPy does.

    >>> import opgraph
    >>> from opgraph.io.onnx import to_onnx
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("int64", (2, 3)), name="x")
    >>> b.output(b.sum(x, axis=1))
    >>> [n.op_type for n in to_onnx(b.freeze()).graph.node]
    ['ReduceSum']
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto

from opgraph.io.onnx.export import EXPORT, Exporter
from opgraph.io.onnx.export.common import AttrMap, Names, Rule, Types, flat_axis, nan_wins, scalar


def _axes(attrs: dict[str, Any], rank: int) -> list[int]:
    axis = attrs.get("axis")
    return list(range(rank)) if axis is None else [int(a) % max(rank, 1) for a in axis]


def _reduce(op_type: str) -> Rule:
    def rule(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
        axes = _axes(attrs, len(it[0].shape or ()))
        keep = int(attrs.get("keepdims", False))
        x = ins[0]
        if not axes:
            return [ex.one("Identity", x)]
        if op_type in ("ReduceMax", "ReduceMin") and it[0].dtype == np.bool_:
            y = ex.one(op_type, ex.one("Cast", x, to=TensorProto.INT32), ex.ints(axes), keepdims=keep)
            if op_type == "ReduceMax":  # over no elements ReduceMax gives INT32_MIN: "> 0" keeps any() False
                return [ex.one("Greater", y, ex.const(np.int32(0)))]
            return [ex.one("Cast", y, to=TensorProto.BOOL)]
        rank = len(it[0].shape or ())
        if (op_type == "ReduceMean" and rank >= 3 and axes == list(range(2, rank)) and it[0].dtype == np.float32
                and it[0].dtype == ot[0].dtype and ot[0].is_static):
            # the mean over every spatial axis of (N, C, ...) is GlobalAveragePool, which ONNX Runtime keeps in
            # its blocked layout between convolutions (a ReduceMean there costs two layout reorders)
            y = ex.one("GlobalAveragePool", x)
            return [y if keep else ex.one("Reshape", y, ex.ints(ot[0].shape), allowzero=1)]
        y = ex.one(op_type, x, ex.ints(axes), keepdims=keep)
        if op_type in ("ReduceMax", "ReduceMin"):
            y = nan_wins(ex, x, it[0], y, lambda m: ex.one("ReduceMax", m, ex.ints(axes), keepdims=keep))
        return [y]
    return rule


EXPORT.rules_from({"sum": "ReduceSum", "prod": "ReduceProd", "max": "ReduceMax", "min": "ReduceMin",
                   "mean": "ReduceMean", "any": "ReduceMax", "all": "ReduceMin", "logsumexp": "ReduceLogSumExp"},
                  _reduce)


@EXPORT.rule("var", "std")
def _var(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    shape = it[0].shape or ()
    axes = _axes(attrs, len(shape))
    n = int(np.prod([shape[a] for a in axes])) if axes else 1
    noop = None if axes else 1  # axis=(): no axes reduced (ONNX's empty axes would reduce them all)
    mean = ex.one("ReduceMean", ins[0], ex.ints(axes), keepdims=1, noop_with_empty_axes=noop)
    dev = ex.one("Sub", ins[0], mean)
    ss = ex.one("ReduceSum", ex.one("Mul", dev, dev), ex.ints(axes), keepdims=int(attrs.get("keepdims", False)),
                noop_with_empty_axes=noop)
    var = ex.one("Div", ss, scalar(ex, max(n - float(attrs.get("correction", 0.0)), 0.0), ot[0]))
    return [ex.one("Sqrt", var) if ex.current_kind == "std" else var]


@EXPORT.rule("argmax", "argmin")
def _argmax(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    op_type = "ArgMax" if ex.current_kind == "argmax" else "ArgMin"
    keep = int(attrs.get("keepdims", False))
    x, axis = flat_axis(ex, ins[0], attrs.get("axis"))
    flat = attrs.get("axis") is None
    k = 0 if flat else keep
    if it[0].dtype == np.bool_:  # ArgMax and ArgMin take no bools; False < True as 0 < 1
        x = ex.one("Cast", x, to=TensorProto.UINT8)
    y = ex.one(op_type, x, axis=axis, keepdims=k)
    if it[0].dtype.kind == "f" and ex.nan_semantics == "numpy":
        # opgraph's (NumPy's) argmax and argmin find the first NaN; ONNX Runtime's skip NaN
        nan = ex.one("Cast", ex.one("IsNaN", x), to=TensorProto.INT32)
        saw_nan = ex.one("Greater", ex.one("ReduceMax", nan, ex.ints([axis]), keepdims=k), ex.const(np.int32(0)))
        y = ex.one("Where", saw_nan, ex.one("ArgMax", nan, axis=axis, keepdims=k), y)
    return [ex.one("Reshape", y, ex.ints([1] * len(it[0].shape or ()))) if flat and keep else y]


@EXPORT.rule("cumsum")
def _cumsum(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    x, axis = flat_axis(ex, ins[0], attrs.get("axis"))
    return [ex.one("CumSum", x, ex.const(np.int64(axis)))]
