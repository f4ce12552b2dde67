"""ONNX export of the contractions (:mod:`opgraph.ops.contraction`): ``MatMul`` and ``Einsum``.

    >>> import opgraph
    >>> from opgraph.io.onnx import to_onnx
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2, 3)), name="x")
    >>> b.output(b.op("tensordot", x, x, axes=((0, 1), (0, 1))))
    >>> [n.op_type for n in to_onnx(b.freeze()).graph.node]
    ['Einsum']
"""

from __future__ import annotations

import numpy as np

from opgraph.io.onnx.export import EXPORT, Exporter
from opgraph.io.onnx.export.common import AttrMap, Names, Types, simple

EXPORT.rules_from({"matmul": "MatMul"}, simple)


@EXPORT.rule("einsum")
def _einsum(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Einsum", *ins, equation=attrs["subscripts"])]


@EXPORT.rule("outer")
def _outer(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    flat = [x if len(t.shape or ()) == 1 else ex.one("Reshape", x, ex.ints([-1])) for x, t in zip(ins, it, strict=True)]
    return [ex.one("Einsum", *flat, equation="i,j->ij")]


@EXPORT.rule("tensordot")
def _tensordot(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    ra, rb = len(it[0].shape or ()), len(it[1].shape or ())
    axes = attrs["axes"]
    if isinstance(axes, int):
        axes = (tuple(range(ra - axes, ra)), tuple(range(axes)))
    axes = tuple(tuple(int(a) for a in np.atleast_1d(side)) for side in axes)  # (1, 0) pairs axis 1 with axis 0
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    sa = [next(letters) for _ in range(ra)]
    sb = [next(letters) for _ in range(rb)]
    for i, j in zip(axes[0], axes[1], strict=True):
        sb[j % rb] = sa[i % ra]
    contracted = {sa[i % ra] for i in axes[0]}
    out = [c for c in sa if c not in contracted] + [c for c in sb if c not in contracted]
    return [ex.one("Einsum", *ins, equation=f"{''.join(sa)},{''.join(sb)}->{''.join(out)}")]
