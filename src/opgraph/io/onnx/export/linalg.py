"""ONNX export of linear algebra (:mod:`opgraph.ops.linalg`): ONNX has ``Det``; most other kinds are refused
(:func:`~opgraph.io.onnx.export.export_op` says why).

    >>> import opgraph
    >>> from opgraph.io.onnx import to_onnx
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (3, 3)), name="x")
    >>> b.output(b.op("det", x))
    >>> [n.op_type for n in to_onnx(b.freeze()).graph.node]
    ['Det']
"""

from __future__ import annotations

from opgraph.io.onnx.export import EXPORT, Exporter
from opgraph.io.onnx.export.common import AttrMap, Names, Types


@EXPORT.rule("det")
def _det(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Det", ins[0])]
