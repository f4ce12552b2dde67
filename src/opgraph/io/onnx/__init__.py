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
from typing import Any

from opgraph.core.graph import Graph
from opgraph.io.onnx._core import OnnxImportError
from opgraph.io.onnx._import import OnnxImport, Port, import_model, load_model
from opgraph.io.onnx.export import OnnxExportError, to_onnx


def from_onnx(model: Any, *, input_types: Mapping[str, Any] | None = None,
              input_shapes: Mapping[str, Any] | None = None,
              static_inputs: Mapping[str, Any] | None = None) -> Graph:
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
    """
    return import_model(model, input_types=input_types, input_shapes=input_shapes,
                        static_inputs=static_inputs).graph


__all__ = ["OnnxExportError", "OnnxImport", "OnnxImportError", "Port", "from_onnx", "import_model", "load_model",
           "to_onnx"]
