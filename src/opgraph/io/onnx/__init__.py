"""ONNX import and export.

``from_onnx(model)`` turns an ONNX model (a ``ModelProto``, a path or bytes)
into an opgraph :class:`~opgraph.core.graph.Graph`; ``to_onnx(graph)`` writes
one. ``opgraph.io.onnx.backend`` is an ONNX backend (``prepare(model).run(inputs)``)
built on the importer; it runs ONNX's own backend test suite in the tests.

    >>> import numpy as np, onnx
    >>> from onnx import helper, TensorProto
    >>> from opgraph.io.onnx import from_onnx
    >>> node = helper.make_node("Add", ["x", "y"], ["z"])
    >>> graph = helper.make_graph([node], "g",
    ...     [helper.make_tensor_value_info(n, TensorProto.FLOAT, (2,)) for n in "xy"],
    ...     [helper.make_tensor_value_info("z", TensorProto.FLOAT, (2,))])
    >>> g = from_onnx(helper.make_model(graph))
    >>> g.run({"x": np.ones(2, np.float32), "y": np.arange(2, dtype=np.float32)})
    [array([1., 2.], dtype=float32)]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, overload

from opgraph.core.graph import Graph, GraphAndWeights
from opgraph.io.onnx._core import OnnxArgumentError, OnnxImportError
from opgraph.io.onnx._import import OnnxImport, Port, import_model, load_model
from opgraph.io.onnx.export import OnnxExportError, to_onnx


@overload
def from_onnx(model: Any, *, input_types: Mapping[str, Any] | None = ..., input_shapes: Mapping[str, Any] | None = ...,
              static_inputs: Mapping[str, Any] | None = ..., weights_as_inputs: Literal[False] = ...) -> Graph: ...
@overload
def from_onnx(model: Any, *, input_types: Mapping[str, Any] | None = ..., input_shapes: Mapping[str, Any] | None = ...,
              static_inputs: Mapping[str, Any] | None = ..., weights_as_inputs: Literal[True]) -> GraphAndWeights: ...
def from_onnx(model: Any, *, input_types: Mapping[str, Any] | None = None,
              input_shapes: Mapping[str, Any] | None = None,
              static_inputs: Mapping[str, Any] | None = None,
              weights_as_inputs: bool = False) -> Graph | GraphAndWeights:
    """Import an ONNX model as an opgraph Graph.

    Symbolic dimensions (a dynamic batch) stay symbolic, ``None`` in the
    types, wherever the op's type rule allows. ``input_types`` overrides the
    types of graph inputs (``{"x": ("float32", (8, 3))}``); ``input_shapes``
    (``{"x": (8, 3)}``, ``None`` for a dim to keep symbolic) fixes only the
    shapes, needed only where a translation needs a size (the error names the
    dim). ``static_inputs`` gives
    values for inputs the graph needs while it is built (a shape fed as an
    input, say): those inputs become constants; the others stay inputs.
    Initializers become constants. Unsupported ops or dtypes raise
    :class:`OnnxImportError` naming the node.

    Names are kept: an initializer's constant is named after it, a value
    after the ONNX tensor a top-level node computes, the op computing a
    node's output after the node (the node's other ops ``<node>/<op kind>``),
    and a constant the import re-lays out from one initializer (a Gemm's
    transposed weight) ``<initializer>/<op kind>``.

    ``weights_as_inputs=True`` makes the floating-point initializers graph
    inputs (after the model's own), named after them, and returns a
    :class:`GraphAndWeights` ``(graph, weights)``: ``weights`` maps each
    such input's name to its value. Integer initializers (shapes, axes) and
    any the import needs as a value (a Resize's scales) stay named constants.

    >>> import numpy as np, onnx
    >>> from onnx import helper, numpy_helper, TensorProto
    >>> w = numpy_helper.from_array(np.full((3, 2), 0.5, np.float32), "fc.weight")
    >>> node = helper.make_node("MatMul", ["x", "fc.weight"], ["y"], name="/fc/MatMul")
    >>> model = helper.make_model(helper.make_graph([node], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3))],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 2))], [w]))
    >>> print(from_onnx(model))
    graph(%x: f32[1,3]) {
      %fc.weight: f32[3,2] = const [[0.5, 0.5],  [0.5, 0.5],  [0.5, 0.5]]
      %y: f32[1,2] = matmul(%x, %fc.weight)  # /fc/MatMul
      return %y
    }
    >>> graph, weights = from_onnx(model, weights_as_inputs=True)
    >>> [graph.name_of(v) for v in graph.inputs], weights["fc.weight"].shape
    (['x', 'fc.weight'], (3, 2))
    >>> graph.run({**weights, "x": np.ones((1, 3), np.float32)})
    [array([[1.5, 1.5]], dtype=float32)]
    """
    result = import_model(model, input_types=input_types, input_shapes=input_shapes, static_inputs=static_inputs,
                          weights_as_inputs=weights_as_inputs)
    if weights_as_inputs:
        return GraphAndWeights(result.graph, dict(result.weights))
    return result.graph


__all__ = ["GraphAndWeights", "OnnxArgumentError", "OnnxExportError", "OnnxImport", "OnnxImportError", "Port",
           "from_onnx", "import_model", "load_model", "to_onnx"]
