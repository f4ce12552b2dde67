"""An ONNX backend on opgraph: ``prepare(model).run(inputs)`` (the ``onnx.backend.base`` protocol).

``prepare`` reads the model; ``run`` imports it for the types of the inputs
it is given (opgraph graphs have static shapes), caches the graph per input
signature, and runs it with opgraph's executor. Inputs whose values the graph
needs while it is built (a shape passed as an input) are folded in, and the
cache is keyed by their values too.

    >>> import numpy as np
    >>> from onnx import helper, TensorProto
    >>> from opgraph.io.onnx import backend
    >>> node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    >>> graph = helper.make_graph([node], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3)),
    ...      helper.make_tensor_value_info("shape", TensorProto.INT64, (2,))],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, (3, 2))])
    >>> rep = backend.prepare(helper.make_model(graph))
    >>> rep.run([np.arange(6, dtype=np.float32).reshape(2, 3), np.array([3, 2])])[0].shape
    (3, 2)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from opgraph.io.onnx._import import OnnxImport, import_model, load_model


def _signature(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(_signature(v) for v in value))
    arr = np.asarray(value)
    return (arr.dtype.str, arr.shape)


class OpgraphRep(BackendRep):
    """A prepared model: imports and caches one opgraph graph per input signature."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in inits]
        self._cache: dict[Any, list[tuple[dict[str, Any], OnnxImport]]] = {}

    def _feeds(self, inputs: Any) -> dict[str, Any]:
        if isinstance(inputs, Mapping):
            return dict(inputs)
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if len(inputs) > len(self.input_names):
            raise ValueError(f"the model takes {len(self.input_names)} input(s), got {len(inputs)}")
        return dict(zip(self.input_names, inputs, strict=False))

    def imported(self, feeds: Mapping[str, Any]) -> OnnxImport:
        """The opgraph import of the model for these inputs (cached)."""
        key = tuple((n, _signature(feeds.get(n))) for n in self.input_names)
        for specialised, imp in self._cache.get(key, []):
            if all(_equal(feeds[n], v) for n, v in specialised.items()):
                return imp
        imp = import_model(self.model, static_inputs=feeds)
        self._cache.setdefault(key, []).append(({n: feeds[n] for n in imp.specialised}, imp))
        return imp

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run the model on ``inputs`` (a list in graph-input order, or a dict by name)."""
        feeds = self._feeds(inputs)
        imp = self.imported(feeds)
        graph_feeds: dict[str, Any] = {}
        for port in imp.inputs:
            value = feeds.get(port.name)
            if port.kind == "tensor" or (port.kind == "optional" and len(port.names) == 1
                                         and not isinstance(value, (list, tuple))):
                for n in port.names:
                    graph_feeds[n] = value
            else:
                for n, v in zip(port.names, value or (), strict=True):
                    graph_feeds[n] = v
        inputs = set(_input_names(imp))
        results = dict(zip(_output_names(imp), imp.graph.run({n: v for n, v in graph_feeds.items() if n in inputs}),
                           strict=True))
        outs: list[Any] = []
        for port in imp.outputs:
            if port.kind == "tensor":
                outs.append(results[port.names[0]])
            elif port.kind in ("sequence", "optional-sequence"):
                outs.append([results[n] for n in port.names])
            else:
                outs.append(results[port.names[0]] if port.names else None)
        return tuple(outs)


def _input_names(imp: OnnxImport) -> list[str]:
    g = imp.graph
    return [g.name_of(int(v)) for v in g.inputs]


def _output_names(imp: OnnxImport) -> list[str]:
    g = imp.graph
    return [g.name_of(int(v)) for v in g.outputs]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(_equal(x, y) for x, y in zip(a, b, strict=True)))
    if a is None or b is None:
        return a is b
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


class OpgraphBackend(Backend):
    """The ONNX backend protocol on opgraph (CPU only)."""

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> OpgraphRep:
        """Read (and check) a model; imports happen on the first ``run`` for each input signature."""
        proto = load_model(model)
        super().prepare(proto, device, **kwargs)
        return OpgraphRep(proto)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        """``prepare(model).run(inputs)``."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[Any] | None = None, **kwargs: Any) -> tuple[Any, ...]:
        """Run one node on arrays (wrapped in a one-node model)."""
        arrays = [np.asarray(x) for x in inputs]
        ins = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for n, a in zip(node.input, arrays, strict=False)]
        outs = [onnx.helper.make_empty_tensor_value_info(n) for n in node.output]
        model = onnx.helper.make_model(onnx.helper.make_graph([node], "node", ins, outs))
        return cls.run_model(model, arrays, device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Only the CPU."""
        return device.upper() == "CPU"


prepare = OpgraphBackend.prepare
run_model = OpgraphBackend.run_model
run_node = OpgraphBackend.run_node
supports_device = OpgraphBackend.supports_device
