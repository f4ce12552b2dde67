"""ONNX -> opgraph translators: the ``ai.onnx.ml`` domain (traditional machine learning).

Only the numeric ops that map onto opgraph ops are translated: ``Binarizer``
and ``ArrayFeatureExtractor``. Ops over strings (``LabelEncoder`` with string
keys) need a dtype opgraph does not have.

    >>> import numpy as np, onnx
    >>> from onnx import TensorProto, helper
    >>> from opgraph.io.onnx import from_onnx
    >>> node = helper.make_node("Binarizer", ["X"], ["Y"], threshold=0.5, domain="ai.onnx.ml")
    >>> vi = helper.make_tensor_value_info
    >>> graph = helper.make_graph([node], "g", [vi("X", TensorProto.FLOAT, [3])], [vi("Y", TensorProto.FLOAT, [3])])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
    ...                                                 helper.make_opsetid("ai.onnx.ml", 1)])
    >>> from_onnx(model).run({"X": np.float32([0.2, 0.5, 0.9])})[0].tolist()
    [0.0, 0.0, 1.0]
"""

from __future__ import annotations

import math
from typing import Any

from opgraph.io.onnx._core import Node, translates

ML = "ai.onnx.ml"


@translates("Binarizer", domain=ML)
def _binarizer(node: Node, x: Any) -> Any:
    threshold = float(node.attr("threshold", 0.0))
    dt = node.dtype(x)
    if dt.kind in "iu":
        # an integer is above a fractional threshold exactly when it is above its floor, so the
        # comparison stays in x's dtype
        threshold = math.floor(threshold)
    elif dt.kind != "f":
        raise node.error(f"input has dtype {dt}; Binarizer takes float, double, int32 or int64 tensors")
    return node.cast(node.op("greater", x, node.const(threshold, dt)), dt)


@translates("ArrayFeatureExtractor", domain=ML)
def _array_feature_extractor(node: Node, x: Any, indices: Any) -> Any:
    shape = node.shape(x)
    if not shape:
        raise node.error("input X is a scalar; it needs at least one axis to select from")
    if node.dtype(indices).kind not in "iu":
        raise node.error(f"indices have dtype {node.dtype(indices)}, not an integer type")
    # The indices select along the last axis whatever their shape (ONNX's reference and onnxruntime
    # flatten them); a 1-D input gives a [1, k] matrix, as onnxruntime does.
    flat = node.op("reshape", indices, shape=(-1,))
    count = math.prod(node.shape(indices))
    known = node.known(indices)
    if known is not None and ((known < -shape[-1]) | (known >= shape[-1])).any():
        raise node.error(f"indices {known.reshape(-1).tolist()} are out of range for the last axis of size "
                         f"{shape[-1]}")
    out = node.op("take", x, flat, axis=len(shape) - 1)
    return node.op("reshape", out, shape=(1, count) if len(shape) == 1 else (*shape[:-1], count))
