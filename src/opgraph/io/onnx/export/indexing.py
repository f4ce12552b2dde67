"""ONNX export of the indexing ops (:mod:`opgraph.ops.indexing`): gathers, scatters, top-k, ``Trilu``, ``OneHot``.

    >>> import opgraph
    >>> from opgraph.io.onnx import to_onnx
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (3, 3)), name="x")
    >>> b.output(b.op("trilu", x, k=0, upper=True))
    >>> [n.op_type for n in to_onnx(b.freeze()).graph.node]
    ['Trilu']
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from opgraph.io.onnx.export import EXPORT, Exporter
from opgraph.io.onnx.export.common import AttrMap, Names, Types, elem_type, index_operand


@EXPORT.rule("gather_elements", "scatter_elements")
def _elements(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    ins = [ins[0], index_operand(ex, ins[1], it[1]), *ins[2:]]
    if ex.current_kind == "gather_elements":
        return [ex.one("GatherElements", *ins, axis=int(attrs["axis"]))]
    return [ex.one("ScatterElements", *ins, axis=int(attrs["axis"]), reduction=attrs["reduction"])]


@EXPORT.rule("gather_nd", "scatter_nd")
def _nd(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    idx = ex.one("Cast", ins[1], to=TensorProto.INT64) if it[1].dtype != np.int64 else ins[1]
    if ex.current_kind == "gather_nd":
        return [ex.one("GatherND", ins[0], idx, batch_dims=int(attrs["batch_dims"]))]
    return [ex.one("ScatterND", ins[0], idx, ins[2], reduction=attrs["reduction"])]


@EXPORT.rule("topk")
def _topk(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    x = ins[0]
    if it[0].dtype == np.bool_:  # TopK takes no bools; False < True as 0 < 1
        x = ex.one("Cast", x, to=elem_type(np.uint8))
    vals, idx = ex.node("TopK", [x, ex.ints([attrs["k"]])], n_out=2, axis=int(attrs["axis"]),
                        largest=int(attrs["largest"]), sorted=1)
    return [ex.one("Cast", vals, to=elem_type(np.bool_)) if it[0].dtype == np.bool_ else vals, idx]


@EXPORT.rule("trilu")
def _trilu(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Trilu", ins[0], ex.const(np.int64(attrs["k"])), upper=int(attrs["upper"]))]


@EXPORT.rule("one_hot")
def _one_hot(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    idx = index_operand(ex, ins[0], it[0], ("int64",))
    return [ex.one("OneHot", idx, ex.const(np.int64(attrs["depth"])), ins[1], axis=int(attrs["axis"]))]


#: kinds whose every input is computed in the result's dtype: NumPy promotes mixed operands (int8 + float32,
