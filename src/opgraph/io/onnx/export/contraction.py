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

from collections.abc import Callable

import numpy as np

from opgraph.io.onnx.export import EXPORT, Exporter
from opgraph.io.onnx.export.common import AttrMap, Names, Types, elem_type

_MATMUL = frozenset({"float16", "float32", "float64", "int32", "int64", "uint32", "uint64"})
"""The dtypes ONNX's MatMul takes (Einsum takes every numeric dtype, but no bool)."""


def _in_int64(ex: Exporter, ins: Names, it: Types, ot: Types, ok: frozenset[str] | None, build: Callable[[Names], str]
              ) -> str:
    """``build(ins)``, or where ONNX's operator does not take the dtype (not in ``ok``; None: bools only), the same
    computed in int64 and cast back: sums of products wrap as NumPy's do in the narrow type, and a bool result
    is True where the count of true products is nonzero."""
    dt = ot[0].dtype
    if (dt.name in ok) if ok is not None else dt != np.bool_:
        return build(ins)
    wide = [ex.one("Cast", x, to=elem_type(np.int64)) for x in ins]
    return ex.one("Cast", build(wide), to=elem_type(dt))


@EXPORT.rule("matmul")
def _matmul(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [_in_int64(ex, ins, it, ot, _MATMUL, lambda xs: ex.one("MatMul", *xs))]


@EXPORT.rule("einsum")
def _einsum(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [_in_int64(ex, ins, it, ot, None, lambda xs: ex.one("Einsum", *xs, equation=attrs["subscripts"]))]


@EXPORT.rule("outer")
def _outer(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    flat = [x if len(t.shape or ()) == 1 else ex.one("Reshape", x, ex.ints([-1])) for x, t in zip(ins, it, strict=True)]
    return [_in_int64(ex, flat, it, ot, None, lambda xs: ex.one("Einsum", *xs, equation="i,j->ij"))]


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
    equation = f"{''.join(sa)},{''.join(sb)}->{''.join(out)}"
    return [_in_int64(ex, ins, it, ot, None, lambda xs: ex.one("Einsum", *xs, equation=equation))]
