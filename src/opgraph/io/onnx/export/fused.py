"""ONNX export of the fused ops (:mod:`opgraph.ops.fused`) that have a direct translation; the others are written
as their decomposition (:func:`opgraph.io.onnx.export.export_op`).

    >>> import opgraph
    >>> from opgraph.io.onnx import to_onnx
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2,)), name="x")
    >>> b.output(b.op("fma", x, x, x))
    >>> [n.op_type for n in to_onnx(b.freeze()).graph.node]
    ['Mul', 'Add']
"""

from __future__ import annotations

from opgraph.io.onnx.export import EXPORT, Exporter
from opgraph.io.onnx.export.common import AttrMap, Names, Types


@EXPORT.rule("fma")
def _fma(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Add", ex.one("Mul", ins[0], ins[1]), ins[2])]
