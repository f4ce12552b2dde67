"""What the ONNX exporter's family modules share: the rule signature, ONNX element types, scalars, axes, indices.

An export rule takes the :class:`~opgraph.io.onnx.export.Exporter`, the ONNX
names of the op's inputs, its attributes and its input and output types, and
returns the names of its outputs (:data:`Rule`).

    >>> import opgraph
    >>> from opgraph.io.onnx.export import Exporter
    >>> ex = Exporter(opgraph.GraphBuilder().freeze())
    >>> simple("Neg")(ex, ["x"], {}, [], []), ex.nodes[0].op_type
    (['_neg1'], 'Neg')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto, helper

from opgraph.core.types import TensorType

if TYPE_CHECKING:
    from opgraph.io.onnx.export import Exporter

Names = list[str]
AttrMap = dict[str, Any]
Types = list[TensorType]
Rule = Callable[["Exporter", Names, AttrMap, Types, Types], Names]
"""An export rule: ``(exporter, ins, attrs, in_types, out_types) -> output names``."""


def simple(op_type: str, **fixed: Any) -> Rule:
    """The rule writing an op as one ONNX node of ``op_type`` on the same inputs (``fixed``: its attributes).

    >>> import opgraph
    >>> from opgraph.io.onnx.export import Exporter
    >>> ex = Exporter(opgraph.GraphBuilder().freeze())
    >>> simple("Add")(ex, ["a", "b"], {}, [], [])
    ['_add1']
    """
    def rule(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
        return [ex.one(op_type, *ins, **fixed)]
    return rule


def elem_type(dtype: Any) -> int:
    """The ONNX element type (``TensorProto.FLOAT``, ...) of a NumPy dtype.

    >>> elem_type("float32") == TensorProto.FLOAT
    True
    """
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def scalar(ex: Exporter, value: float, t: TensorType) -> str:
    """An initializer holding ``value`` as a 0-d tensor of ``t``'s dtype.

    >>> import opgraph
    >>> from opgraph.io.onnx.export import Exporter
    >>> ex = Exporter(opgraph.GraphBuilder().freeze())
    >>> scalar(ex, 1, TensorType("float32", (3,))), ex.initializers[0].data_type == TensorProto.FLOAT
    ('_c1', True)
    """
    return ex.const(np.asarray(value, dtype=t.dtype))


def flat_axis(ex: Exporter, x: str, axis: Any) -> tuple[str, int]:
    """``(x, axis)``, with ``x`` flattened and axis 0 when ``axis`` is None (NumPy's "over all elements").

    >>> import opgraph
    >>> from opgraph.io.onnx.export import Exporter
    >>> ex = Exporter(opgraph.GraphBuilder().freeze())
    >>> flat_axis(ex, "x", (1,)), flat_axis(ex, "x", None)
    (('x', 1), ('_reshape2', 0))
    """
    if axis is None:
        return ex.one("Reshape", x, ex.ints([-1])), 0
    return x, int(np.atleast_1d(axis)[0])


def nan_wins(ex: Exporter, x: str, t: TensorType, y: str, reduce: Callable[[str], str]) -> str:
    """``y``, a max or min of ``x``, made NaN wherever ``reduce`` (the same reduction) sees a NaN of ``x``.

    opgraph's max and min reductions and max pools propagate NaN (as NumPy's do); ONNX Runtime's skip it. With
    ``to_onnx(..., nan_semantics="onnx")`` (``ex.nan_semantics``) ``y`` is left as it is.

    >>> import opgraph
    >>> from opgraph.io.onnx.export import Exporter
    >>> ex = Exporter(opgraph.GraphBuilder().freeze())
    >>> y = nan_wins(ex, "x", TensorType("float32", (3,)), "m", lambda v: ex.one("ReduceMax", v))
    >>> [n.op_type for n in ex.nodes]
    ['IsNaN', 'Cast', 'ReduceMax', 'Greater', 'Where']
    """
    if t.dtype.kind != "f" or ex.nan_semantics == "onnx":
        return y
    saw_nan = reduce(ex.one("Cast", ex.one("IsNaN", x), to=elem_type(t.dtype)))
    return ex.one("Where", ex.one("Greater", saw_nan, scalar(ex, 0, t)), scalar(ex, np.nan, t), y)


def index_operand(ex: Exporter, x: str, t: TensorType, ok: tuple[str, ...] = ("int32", "int64")) -> str:
    """Index tensor ``x`` cast to int64 unless its dtype is one ONNX takes (``ok``).

    >>> import opgraph
    >>> from opgraph.io.onnx.export import Exporter
    >>> ex = Exporter(opgraph.GraphBuilder().freeze())
    >>> index_operand(ex, "i", TensorType("int32", (2,))), index_operand(ex, "j", TensorType("uint8", (2,)))
    ('i', '_cast1')
    """
    return x if t.dtype.name in ok else ex.one("Cast", x, to=TensorProto.INT64)
