"""ONNX model -> opgraph Graph (see :func:`opgraph.io.onnx.from_onnx`)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx

from opgraph.core.graph import Graph, Value
from opgraph.core.types import TensorType
from opgraph.errors import GraphError
from opgraph.io.onnx import (  # noqa: F401  (registers the translators)
    translate_control,
    translate_math,
    translate_ml,
    translate_nn,
    translate_signal,
    translate_tensor,
    translate_training,
)
from opgraph.io.onnx._core import (
    Importer,
    NeedStatic,
    OnnxArgumentError,
    OnnxImportError,
    Opt,
    Scope,
    Seq,
    np_dtype,
    tensor_to_array,
)


@dataclass(frozen=True)
class Port:
    """How one ONNX graph input or output maps onto opgraph values.

    ``kind`` is ``"tensor"``, ``"sequence"`` or ``"optional"``; ``names`` are
    the opgraph value names carrying it (one for a tensor, one per element of
    a sequence, none for an empty optional or a constant input).
    """

    name: str
    kind: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class OnnxImport:
    """The result of :func:`import_model`: the graph and how ONNX's inputs and outputs map onto it."""

    graph: Graph
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    specialised: frozenset[str]
    #: with ``weights_as_inputs``: the initializers that became graph inputs, name -> value, in input order
    weights: Mapping[str, np.ndarray] = field(default_factory=dict)


def load_model(model: Any) -> onnx.ModelProto:
    """A ModelProto from a ModelProto, a path or serialized bytes."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            return onnx.load_from_string(bytes(model))
        except Exception as exc:  # protobuf's DecodeError
            raise OnnxImportError(f"not a readable ONNX model: {_first_line(exc)}") from exc
    if isinstance(model, (str, os.PathLike)):
        try:  # onnx.load reads external data too, refusing files outside the model's directory
            return onnx.load(os.fspath(model))
        except Exception as exc:
            raise OnnxImportError(f"{os.fspath(model)}: not a readable ONNX model: {_first_line(exc)}") from exc
    raise TypeError(f"expected an onnx.ModelProto, a path or bytes, got {type(model).__name__}")


def import_model(model: Any, *, input_types: Mapping[str, Any] | None = None,
                 input_shapes: Mapping[str, Any] | None = None,
                 static_inputs: Mapping[str, Any] | None = None, weights_as_inputs: bool = False) -> OnnxImport:
    """Import an ONNX model; see :func:`opgraph.io.onnx.from_onnx` (this also returns the port mapping).

    Inputs named in ``static_inputs`` become constants only where the graph
    needs their values while building (a ``Reshape``'s shape, a ``Slice``'s
    starts); the rest stay inputs. ``specialised`` names those that became
    constants. With ``weights_as_inputs``, floating-point initializers are
    such inputs too, and ``weights`` holds the values of those that stayed
    inputs.
    """
    proto = load_model(model)
    for arg, given in (("input_shapes", input_shapes), ("input_types", input_types)):
        _check_input_names(proto, arg, given)
    try:
        return _import_model(proto, input_types, input_shapes, static_inputs, weights_as_inputs)
    except OnnxImportError:
        raise
    except GraphError as exc:
        raise OnnxImportError(str(exc)) from exc
    except Exception as exc:  # a check the importer misses must still be one error (nodes name themselves)
        raise OnnxImportError(f"cannot import the model: {type(exc).__name__}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _dims_text(vi: Any) -> str:
    """An input's declared type as dumps write it (``float32[N,3]``; ``?`` for an unknown dim)."""
    tt = vi.type.tensor_type
    try:
        dtype = np_dtype(tt.elem_type, "").name if vi.type.HasField("tensor_type") else "?"
    except OnnxImportError:
        dtype = "?"
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return f"{dtype}[...]"
    dims = [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?") for d in tt.shape.dim]
    return f"{dtype}[{','.join(dims)}]"


def _check_input_names(proto: Any, arg: str, given: Mapping[str, Any] | None) -> None:
    """Refuse names in ``input_shapes=``/``input_types=`` that name no input, listing the model's inputs."""
    if not given:
        return
    if not isinstance(given, Mapping):
        raise OnnxArgumentError(f"{arg} must map input names to {arg[6:-1]}s, not {type(given).__name__}")
    inputs = list(proto.graph.input)
    names = {vi.name for vi in inputs}
    unknown = [k for k in given if k not in names]
    if not unknown:
        return
    weights = {t.name for t in proto.graph.initializer}
    real = [vi for vi in inputs if vi.name not in weights] or inputs  # an old model lists its weights as inputs
    shown = ", ".join(f"{vi.name}: {_dims_text(vi)}" for vi in real[:20])
    if len(real) > 20:
        shown += f" and {len(real) - 20} more"
    word = unknown[0]
    candidates = [vi.name for vi in real]
    close = difflib.get_close_matches(str(word), candidates, n=1, cutoff=0.5) if isinstance(word, str) else []
    if not close and len(candidates) == 1:
        close = candidates
    hint = f"; did you mean {close[0]!r}?" if close else ""
    what = ", ".join(repr(k) for k in unknown)
    raise OnnxArgumentError(f"{arg} names no graph input: {what}; the model's inputs are {shown or 'none'}{hint}")


def _check_rank(vi: Any, given: tuple[Any, ...]) -> None:
    """Refuse a given input shape whose rank differs from the model's declared one, before importing: else the
    first node that notices names its own axis, far from the cause."""
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return
    dims = [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?") for d in tt.shape.dim]
    if len(given) != len(dims):
        raise OnnxArgumentError(f"input {vi.name} has rank {len(dims)} in the graph (dims {', '.join(dims) or '()'}) "
                                f"and the given shape {given} has rank {len(given)}; give {len(dims)} sizes")


def _import_model(proto: onnx.ModelProto, input_types: Mapping[str, Any] | None,
                  input_shapes: Mapping[str, Any] | None, static_inputs: Mapping[str, Any] | None,
                  weights_as_inputs: bool = False) -> OnnxImport:
    statics = dict(static_inputs or {})
    weights: dict[str, np.ndarray] = {}
    if weights_as_inputs:
        # Floating-point initializers are the trainable ones; an integer one is a shape, an axis or an index the
        # import needs as a constant. A float one the import needs (a Resize's scales) is specialised back into a
        # constant by the static-input machinery below.
        for t in proto.graph.initializer:
            if t.name in statics or not isinstance(t.name, str):
                continue
            arr = tensor_to_array(t, f"initializer {t.name!r}")
            if arr.dtype.kind in "fc":
                weights[t.name] = arr
        statics.update(weights)
    types = dict(input_types or {})
    for vi in proto.graph.input:  # a shape alone keeps the model's element type
        if vi.name not in (input_shapes or {}):
            continue
        try:
            shape = tuple(input_shapes[vi.name])  # type: ignore[index]
        except TypeError:
            raise OnnxArgumentError(f"input_shapes[{vi.name!r}] must be a sequence of sizes (None for a dim to "
                                    f"keep symbolic), not {input_shapes[vi.name]!r}"[:300]) from None  # type: ignore[index]
        _check_rank(vi, shape)
        if vi.name not in types:
            types[vi.name] = (np_dtype(vi.type.tensor_type.elem_type, f"graph input {vi.name!r}"), shape)
    constant: set[str] = set()
    while True:
        try:
            result = _import(proto, types, statics, constant, weights)
            if weights:
                kept = {result.graph.name_of(int(v)) for v in result.graph.inputs}
                result = replace(result, weights={n: a for n, a in weights.items() if n in kept})
            return result
        except NeedStatic as need:
            if need.names <= constant:  # cannot happen unless a translator misbehaves
                raise OnnxImportError(f"inputs {sorted(need.names)} are needed as constants but are already") from None
            constant |= need.names


def _value_type(vi: onnx.ValueInfoProto, given: Any, static: Any) -> TensorType:
    tt = vi.type.tensor_type
    dt = np_dtype(tt.elem_type, f"graph input {vi.name!r}")
    try:
        if given is not None:
            from opgraph.core.types import as_type

            return as_type(given)
        if static is not None:
            return TensorType(dt, np.shape(static))
        if not tt.HasField("shape"):
            raise OnnxImportError(f"graph input {vi.name!r} has no shape; give it in input_types=")
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        return TensorType(dt, dims)
    except (GraphError, TypeError, ValueError) as exc:  # a negative dim, or more elements than an int64 counts
        if isinstance(exc, OnnxImportError):
            raise
        if given is not None:  # input_types= or input_shapes= gave it: the caller's mistake
            raise OnnxArgumentError(f"graph input {vi.name!r}: the given type {given!r} is not a type: "
                                    f"{_first_line(exc)}"[:300]) from exc
        raise OnnxImportError(f"graph input {vi.name!r}: {exc}") from exc


def _import(model: onnx.ModelProto, input_types: dict[str, Any], statics: dict[str, Any],
            constant: set[str], weights: Mapping[str, np.ndarray]) -> OnnxImport:
    opsets = {o.domain if o.domain != "ai.onnx" else "": o.version for o in model.opset_import}
    for domain, version in opsets.items():
        if not isinstance(domain, str) or not 0 <= version < 2**31:  # ONNX's schema lookups take a C int
            raise OnnxImportError(f"opset_import: version {version} of domain {domain or 'ai.onnx'!r} is not a valid "
                                  "opset version")
    opsets.setdefault("", 1)
    functions = {(f.domain, f.name): f for f in model.functions}
    imp = Importer(opsets, functions, statics, constant)
    g = model.graph
    for what, items in (("graph input", g.input), ("graph output", g.output), ("initializer", g.initializer)):
        for x in items:
            if not isinstance(x.name, str):  # protobuf hands back bytes that are not UTF-8
                raise OnnxImportError(f"{what} name {x.name!r} is not valid UTF-8 text")
    scope = Scope()
    inits = {t.name for t in g.initializer}
    in_ports = []
    for vi in g.input:
        if vi.name in inits:
            continue
        which = vi.type.WhichOneof("value")
        if which == "tensor_type":
            v = imp.add_input(vi.name, _value_type(vi, input_types.get(vi.name), statics.get(vi.name)))
            if isinstance(v, Value) and vi.name not in constant:  # a dim the model names N is one symbol N
                imp.sym.declare_input(v, [d.dim_param for d in vi.type.tensor_type.shape.dim])
            scope.names[vi.name] = v
            in_ports.append(Port(vi.name, "tensor", () if vi.name in constant else (vi.name,)))
        elif which == "sequence_type":
            items = statics.get(vi.name)
            if items is None:
                raise OnnxImportError(f"graph input {vi.name!r} is a sequence; its length must be known: "
                                      "pass its value in static_inputs=")
            elem = vi.type.sequence_type.elem_type.tensor_type.elem_type
            vals = [imp.add_input(f"{vi.name}[{i}]", TensorType(np_dtype(elem, vi.name), np.shape(a)))
                    for i, a in enumerate(items)]
            scope.names[vi.name] = Seq(vals, np_dtype(elem, vi.name))
            in_ports.append(Port(vi.name, "sequence", tuple(f"{vi.name}[{i}]" for i in range(len(items)))))
        elif which == "optional_type":
            if vi.name not in statics:
                raise OnnxImportError(f"graph input {vi.name!r} is optional; pass its value (or None) in "
                                      "static_inputs= so the graph knows whether it is present")
            value = statics[vi.name]
            inner = vi.type.optional_type.elem_type
            if value is None:
                scope.names[vi.name] = Opt(None, inner)
                in_ports.append(Port(vi.name, "optional", ()))
            elif inner.WhichOneof("value") == "sequence_type":
                elem = inner.sequence_type.elem_type.tensor_type.elem_type
                vals = [imp.add_input(f"{vi.name}[{i}]", TensorType(np_dtype(elem, vi.name), np.shape(a)))
                        for i, a in enumerate(value)]
                scope.names[vi.name] = Opt(Seq(vals, np_dtype(elem, vi.name)), inner)
                in_ports.append(Port(vi.name, "optional", tuple(f"{vi.name}[{i}]" for i in range(len(value)))))
            else:
                dt = np_dtype(inner.tensor_type.elem_type, vi.name)
                v = imp.add_input(vi.name, TensorType(dt, np.shape(value)))
                scope.names[vi.name] = Opt(v, inner)
                in_ports.append(Port(vi.name, "optional", (vi.name,)))
        else:
            raise OnnxImportError(f"graph input {vi.name!r}: opgraph cannot take {which} inputs")
    b = imp.b
    for t in g.initializer:
        if t.name in weights:
            scope.names[t.name] = imp.add_input(t.name, TensorType.of(weights[t.name]))
        else:
            scope.names[t.name] = imp.const(tensor_to_array(t, f"initializer {t.name!r}"), t.name)
    for s in g.sparse_initializer:
        from opgraph.io.onnx._core import sparse_to_array

        name = s.values.name
        scope.names[name] = imp.const(sparse_to_array(s, f"sparse initializer {name!r}"),
                                      name if isinstance(name, str) else None)
    imp.scope = scope
    value_names: list[tuple[int, str]] = []
    for index, proto in enumerate(g.node):
        first_value, first_op = b.num_values, b.num_ops
        imp.translate_node(proto, scope, opsets, index=index)
        _name_node(imp, proto, scope, first_value, first_op, value_names)

    out_ports = []
    used: set[int] = set()

    def emit(v: Any, name: str) -> str:
        if not isinstance(v, Value):
            raise OnnxImportError(f"graph output {name!r} is not a tensor")
        # a loop: hash-consing hands back the same copy for the same value, which may be named already
        while v.id in used or b.name_of(v.id) is not None or v.id in imp.input_names:
            v = b.op("copy", v)
        used.add(v.id)
        b.output(v)
        b.name(v, name)
        return name

    for vo in g.output:
        try:
            v = scope.lookup(vo.name)
        except KeyError:
            raise OnnxImportError(f"graph output {vo.name!r} is never computed") from None
        if isinstance(v, Seq):
            names = tuple(emit(x, f"{vo.name}[{i}]") for i, x in enumerate(v.items))
            out_ports.append(Port(vo.name, "sequence", names))
        elif isinstance(v, Opt):
            if v.value is None:
                out_ports.append(Port(vo.name, "optional", ()))
            elif isinstance(v.value, Seq):
                names = tuple(emit(x, f"{vo.name}[{i}]") for i, x in enumerate(v.value.items))
                out_ports.append(Port(vo.name, "optional-sequence", names))
            else:
                out_ports.append(Port(vo.name, "optional", (emit(v.value, vo.name),)))
        else:
            _check_declared(vo, v)
            out_ports.append(Port(vo.name, "tensor", (emit(v, vo.name),)))
    for vid, name in [*value_names, *imp.derived.items()]:  # after the outputs, which take their ports' names first
        if b.name_of(vid) is None:
            try:
                b.name(Value(b, vid), name)
            except GraphError:  # an output's or an input's name already (a port of a sequence: "s[0]")
                pass
    from opgraph.passes import dce

    graph = dce(b.freeze()).graph
    return OnnxImport(graph, tuple(in_ports), tuple(out_ports), frozenset(constant))


def _name_node(imp: Importer, proto: onnx.NodeProto, scope: Scope, first_value: int, first_op: int,
               value_names: list[tuple[int, str]]) -> None:
    """Names for what one top-level node made (values from ``first_value`` on, ops from ``first_op`` on).

    An output the translation made (not a value it handed through, nor an
    earlier one hash-consing found) is to be named after the ONNX tensor
    (queued in ``value_names``: outputs are named first); the op computing
    it takes the node's name, and the node's other new ops (a Gemm's
    ``matmul`` before its bias ``add``) ``<node name>/<op kind>``. Names inside
    function bodies and control-flow subgraphs are not kept: one ONNX name
    there stands for a value per call or per trip.
    """
    b = imp.b
    producers: set[int] = set()
    for out in proto.output:
        v = scope.names.get(out) if out else None
        if isinstance(v, Value) and v.id >= first_value:
            value_names.append((v.id, out))
            producer = b.producer_of(v.id)
            if producer is not None:
                producers.add(producer.id)
    if not proto.name:
        return
    for op in range(first_op, b.num_ops):
        if op in producers:
            b.name_op(op, proto.name)
        elif b.kind_of(op) != "const":
            b.name_op(op, f"{proto.name}/{b.kind_of(op)}")


def _check_declared(vo: onnx.ValueInfoProto, v: Value) -> None:
    tt = vo.type.tensor_type
    if vo.type.WhichOneof("value") != "tensor_type" or not tt.elem_type:
        return
    try:
        want = np_dtype(tt.elem_type, f"graph output {vo.name!r}")
    except OnnxImportError:
        return
    got = v.type.dtype  # type: ignore[union-attr]
    if got != want:
        raise OnnxImportError(f"graph output {vo.name!r}: the model declares {want}, opgraph computes {got}")
