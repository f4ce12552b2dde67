"""The ONNX importer's machinery: translator table, node view, constant folding, inlining.

Translators live in the ``translate_*`` modules beside this one, one function
per ONNX op (or op family), registered with :func:`translates`. A translator
receives a :class:`Node` and the node's inputs (opgraph ``Value`` handles,
``None`` for omitted optional inputs, :class:`Seq` for sequences) and returns
the node's outputs. It builds opgraph ops with ``node.op(kind, ...)``, which
folds the op into a constant when every input is known: ONNX graphs compute
shapes at run time (``Shape`` -> ``Gather`` -> ``Reshape``), while opgraph's
shape ops take their target shapes as attributes, so those computations are
finished while importing. A dim only the run knows (a dynamic batch) stays
``?`` in the types; the shape arithmetic on it is followed symbolically
(:mod:`opgraph.io.onnx._symbolic`), so a ``Reshape`` to ``[N, -1]`` still
becomes a static ``reshape`` with one ``-1``.

    >>> from opgraph.io.onnx._core import TRANSLATORS
    >>> ("", "Add") in TRANSLATORS
    True
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Value
from opgraph.core.registry import resolve
from opgraph.core.types import TensorType
from opgraph.errors import GraphError
from opgraph.io.onnx._symbolic import Symbols
from opgraph.ops.fold import fold

Translator = Callable[..., Any]

#: (domain, op_type) -> translator. Filled by the ``translate_*`` modules.
TRANSLATORS: dict[tuple[str, str], Translator] = {}

#: ONNX element types opgraph has no dtype for, by name (for error messages).
_UNSUPPORTED_ELEM = {
    onnx.TensorProto.STRING: "string", onnx.TensorProto.BFLOAT16: "bfloat16",
}


class OnnxImportError(GraphError):
    """An ONNX model cannot be imported: the message names the node, its op type and the reason."""


class OnnxArgumentError(OnnxImportError, ValueError):
    """An argument of the import (``input_shapes=``, ``input_types=``) does not fit the model: the caller's
    mistake, so ``opgraph.load`` keeps it a ``ValueError`` instead of calling the file bad."""


class NeedStatic(Exception):
    """Internal: a translator needs the value of graph inputs that were given as static values."""

    def __init__(self, names: set[str]) -> None:
        super().__init__(sorted(names))
        self.names = names


@dataclass
class Seq:
    """An ONNX sequence: a Python list of values (its length is known while importing)."""

    items: list[Any]
    elem_dtype: np.dtype | None = None


@dataclass
class Opt:
    """An ONNX optional: a value (tensor or :class:`Seq`) or ``None`` for an empty optional."""

    value: Any
    elem_type: onnx.TypeProto | None = None


def translates(*op_types: str, domain: str = "") -> Callable[[Translator], Translator]:
    """Register a translator for ONNX op types (see the module doc).

    >>> @translates("MyRelu", domain="example.com")
    ... def _my_relu(node, x):
    ...     return node.op("relu", x)
    >>> TRANSLATORS[("example.com", "MyRelu")] is _my_relu
    True
    >>> del TRANSLATORS[("example.com", "MyRelu")]
    """
    def register(fn: Translator) -> Translator:
        for t in op_types:
            TRANSLATORS[(domain, t)] = fn
        return fn
    return register


def np_dtype(elem_type: int, what: str = "") -> np.dtype:
    """The NumPy dtype of an ONNX element type; unsupported ones raise :class:`OnnxImportError`.

    >>> np_dtype(onnx.TensorProto.FLOAT)
    dtype('float32')
    """
    if elem_type in _UNSUPPORTED_ELEM:
        raise OnnxImportError(f"{what}: opgraph has no {_UNSUPPORTED_ELEM[elem_type]} dtype")
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        raise OnnxImportError(f"{what}: unknown ONNX element type {elem_type}") from None
    if dt.kind not in "biufc" or dt.itemsize > 16 or dt.name not in _SUPPORTED:
        name = onnx.TensorProto.DataType.Name(elem_type)
        raise OnnxImportError(f"{what}: opgraph has no {name.lower()} dtype")
    return dt


_SUPPORTED = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64", "complex64", "complex128"}


def onnx_elem_type(dtype: Any) -> int:
    """The ONNX element type of a NumPy dtype.

    >>> onnx_elem_type("float64") == onnx.TensorProto.DOUBLE
    True
    """
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


#: Constants the translators compute while importing (ConstantOfShape, ...) larger than this many bytes are left
#: to run time as ops (folded ops: FOLD_ELEMENTS); it also bounds a sparse initializer's dense form.
FOLD_LIMIT = 2**27

#: An op on known values folds while importing when each of its inputs and outputs has at most this many
#: elements (FOLD_LIMIT bytes of float64; the size policy of :func:`opgraph.ops.fold.fits`).
FOLD_ELEMENTS = FOLD_LIMIT // 8


def tensor_to_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """A TensorProto's data as an array of a dtype opgraph supports.

    Its dims are checked against the data it holds before anything is
    allocated, and data kept in an external file must have been loaded
    (``onnx.load`` of the model's path does that, within the model's
    directory): a tensor that still refers to a file is an error.

    >>> t = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    >>> t.dims[:] = [2, 2**40]
    >>> tensor_to_array(t, "initializer 'w'")
    Traceback (most recent call last):
      ...
    opgraph.io.onnx._core.OnnxImportError: initializer 'w': dims [2, 1099511627776] (2199023255552 elements) do ...
    """
    dt = np_dtype(t.data_type, what)
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"{what}: negative dimension in dims {dims}")
    # NumPy cannot make even an empty array whose nonzero dims multiply past int64, nor one of rank > 64
    if len(dims) > 64 or math.prod(d for d in dims if d) >= 2**62:
        raise OnnxImportError(f"{what}: dims {dims[:8]}{'...' if len(dims) > 8 else ''} (rank {len(dims)}) are "
                              "too large for an array")
    count = math.prod(dims)
    if t.data_location == onnx.TensorProto.EXTERNAL or t.external_data:
        where = {e.key: e.value for e in t.external_data}.get("location", "?")
        raise OnnxImportError(f"{what}: its data is in the external file {where!r}, which is not loaded; import the "
                              "model from its path (the file must be in the model's directory), or onnx.load it "
                              "with its external data first")
    if t.HasField("raw_data"):
        have, unit = len(t.raw_data) // dt.itemsize, f"{len(t.raw_data)} bytes of raw_data"
        ok = len(t.raw_data) == count * dt.itemsize
    else:
        field = helper.tensor_dtype_to_field(t.data_type)
        per = 2 if dt.kind == "c" else 1
        n = len(getattr(t, field))
        have, unit = n // per, f"{n} values in {field}"
        ok = n == count * per
    if not ok:
        raise OnnxImportError(f"{what}: dims {dims} ({count} elements) do not match its data ({unit}, {have} "
                              "elements)")
    try:
        return np.asarray(numpy_helper.to_array(t))
    except Exception as exc:  # protobuf failures, segments
        raise OnnxImportError(f"{what}: cannot read tensor data: {exc}") from exc


def attribute_value(a: onnx.AttributeProto, what: str) -> Any:
    """A node attribute as a Python value: numbers, strings, tuples, arrays, graphs."""
    if a.type == onnx.AttributeProto.TENSOR:
        return tensor_to_array(a.t, f"{what} attribute {a.name!r}")
    if a.type == onnx.AttributeProto.SPARSE_TENSOR:
        return sparse_to_array(a.sparse_tensor, f"{what} attribute {a.name!r}")
    if a.type == onnx.AttributeProto.UNDEFINED:  # get_attribute_value would make it None
        raise OnnxImportError(f"{what}: attribute {a.name!r} has no type (AttributeProto.type is UNDEFINED)")
    try:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, list):
            if a.type == onnx.AttributeProto.TENSORS:
                return tuple(tensor_to_array(t, f"{what} attribute {a.name!r}") for t in v)
            return tuple(x.decode() if isinstance(x, bytes) else x for x in v)
    except UnicodeDecodeError:
        raise OnnxImportError(f"{what}: attribute {a.name!r} is text that is not valid UTF-8") from None
    except ValueError as exc:  # an attribute without a type
        raise OnnxImportError(f"{what}: attribute {a.name!r}: {exc}") from exc
    return v


def sparse_to_array(s: onnx.SparseTensorProto, what: str) -> np.ndarray:
    """A SparseTensorProto as a dense array."""
    values = tensor_to_array(s.values, f"{what} values")
    idx = tensor_to_array(s.indices, f"{what} indices").astype(np.int64)
    dims = tuple(int(d) for d in s.dims)
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"{what}: negative dimension in dims {list(dims)}")
    size = math.prod(dims)
    if size * values.dtype.itemsize > FOLD_LIMIT:
        raise OnnxImportError(f"{what}: its dense form {list(dims)} would take {size * values.dtype.itemsize} bytes, "
                              f"more than opgraph makes while importing ({FOLD_LIMIT})")
    nnz = values.shape[0] if values.ndim == 1 else -1
    if nnz < 0 or idx.shape not in ((nnz,), (nnz, len(dims))):
        raise OnnxImportError(f"{what}: indices of shape {idx.shape} do not fit {nnz} values of a {list(dims)} tensor")
    bound = size if idx.ndim == 1 else np.array(dims, dtype=np.int64)
    if idx.size and ((idx < 0).any() or (idx >= bound).any()):
        raise OnnxImportError(f"{what}: an index is out of range for dims {list(dims)}")
    dense = np.zeros(dims, dtype=values.dtype)
    if idx.ndim == 1:
        dense.reshape(-1)[idx] = values
    else:
        dense[tuple(idx.T)] = values
    return dense


#: Op kinds that lay values out anew without computing new ones (a constant folded through one keeps its origin's
#: name, see :meth:`Importer._derive`).
_RELAYOUT = frozenset({"reshape", "permute_dims", "cast", "squeeze", "expand_dims", "copy", "flip"})


@dataclass
class Scope:
    """Names visible while translating one graph or function body (outer scopes chained)."""

    names: dict[str, Any] = field(default_factory=dict)
    parent: Scope | None = None

    def lookup(self, name: str) -> Any:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            if scope is not self and type(scope).lookup is not Scope.lookup:
                return scope.lookup(name)  # a body's scope makes outer values its own (translate_control)
            scope = scope.parent
        raise KeyError(name)


class Node:
    """What a translator sees of one ONNX node: attributes, opset, and op building with folding."""

    def __init__(self, imp: Importer, proto: onnx.NodeProto, opsets: Mapping[str, int],
                 attrs: dict[str, Any], inputs: list[Any], scope: Scope | None = None,
                 label: str | None = None) -> None:
        self.imp = imp
        self._label = label
        self.proto = proto
        self.opsets = opsets
        self.attrs = attrs
        self.inputs = inputs
        #: the names visible where the node stands (subgraphs inlined by If/Loop/Scan see them)
        self.scope = scope

    @property
    def op_type(self) -> str:
        """The ONNX op type."""
        return self.proto.op_type

    @property
    def opset(self) -> int:
        """The opset version of the node's domain."""
        return self.opsets.get(self.proto.domain or "", self.opsets.get("ai.onnx", 1))

    @property
    def label(self) -> str:
        """``#index OpType node 'name'`` for error messages (a node in a subgraph after its parent's, ``>``)."""
        return self._label if self._label is not None else node_label(self.proto)

    def error(self, reason: str) -> OnnxImportError:
        """An import error naming this node."""
        return OnnxImportError(f"{self.label}: {reason}")

    def attr(self, name: str, default: Any = ...) -> Any:
        """An attribute's value, ``default`` when absent (absent without default is an error)."""
        if name in self.attrs:
            return self.attrs[name]
        if default is ...:
            raise self.error(f"missing required attribute {name!r}")
        return default

    # ---------------------------------------------------------------- values
    def known(self, v: Any) -> np.ndarray | None:
        """The value of ``v`` if it is known while importing, else None."""
        return self.imp.known_value(v)

    def static(self, index_or_value: Any, what: str | None = None) -> np.ndarray:
        """The known value of an input (by position) or a value; an error naming the node if unknown."""
        v = self.inputs[index_or_value] if isinstance(index_or_value, int) else index_or_value
        if v is None:
            raise self.error(f"{what or 'input'} is missing")
        arr = self.imp.static_value(v)
        if arr is None:
            label = what or (f"input {index_or_value} ({self.proto.input[index_or_value]!r})"
                             if isinstance(index_or_value, int) else "an input")
            symbolic = self.imp.sym.values.get(v.id) if isinstance(v, Value) else None
            if symbolic is not None:
                dims = [d for d in symbolic.reshape(-1) if not isinstance(d, (int, np.integer))]
                raise self.error(f"{label} is {self.imp.sym.describe(list(symbolic.reshape(-1)))}, computed from "
                                 f"symbolic dims ({self.imp.sym.where(dims[0])}), and opgraph needs its value when "
                                 "the graph is built; fix those dims with input_shapes=")
            raise self.error(f"{label} must be known when the graph is built (its value sets a shape or an "
                             "attribute); make it an initializer or a Constant, or pass it in static_inputs=")
        return arr

    def has_input(self, index: int) -> bool:
        """Whether optional input ``index`` is given.

        Ops that moved an attribute to an input are read by what the node has
        rather than by its opset: some of ONNX's own function bodies import no
        default-domain opset.
        """
        return index < len(self.inputs) and self.inputs[index] is not None

    def axis(self, axis: int, rank: int) -> int:
        """``axis`` as a non-negative axis of a rank-``rank`` value; out of range is an error naming the node."""
        if not -rank <= axis < max(rank, 1):
            raise self.error(f"axis {axis} is out of range for rank {rank}")
        return axis % max(rank, 1)

    def axes(self, axes: Iterable[int], rank: int) -> tuple[int, ...]:
        """Several axes, each as :meth:`axis`, in the given order; a repeated axis is an error."""
        axes = tuple(int(a) for a in axes)
        out = tuple(self.axis(a, rank) for a in axes)
        if len(set(out)) != len(out):
            raise self.error(f"repeated axis in {axes}")
        return out

    def static_ints(self, index: int, what: str | None = None) -> tuple[int, ...]:
        """A known integer input as a tuple of ints (omitted input: empty tuple)."""
        if not self.has_input(index):
            return ()
        arr = np.asarray(self.static(index, what)).reshape(-1)
        if arr.dtype.kind not in "biu" and not (arr.dtype.kind == "f" and np.isfinite(arr).all()
                                                 and (arr == np.round(arr)).all()):
            label = what or f"input {index}"
            raise self.error(f"{label} must be integers, it is {arr.dtype} {arr[:8].tolist()}")
        return tuple(int(i) for i in arr)

    def shape(self, v: Value, axes: Iterable[int] | None = None, why: str = "") -> tuple[int, ...]:
        """The static shape of a value; with ``axes``, only those dims must be static (the others may be None).

        A dim that is still symbolic is an error naming it, the graph input it comes from and ``why`` the
        translation needs its size.
        """
        dims = self.dims(v)
        need = range(len(dims)) if axes is None else [a % max(len(dims), 1) for a in axes]
        missing = [a for a in need if dims[a] is None]
        if missing:
            sym = self.imp.sym.shape_of(v) or (None,) * len(dims)
            which = ", ".join(f"dim {a} ({sym[a]})" for a in missing)
            origin = "; ".join(dict.fromkeys(self.imp.sym.where(sym[a]) for a in missing if sym[a] is not None))
            raise self.error(f"needs the static size of {which} of its input, which is {v.type}"
                             f"{f' ({why})' if why else ''}; fix {origin or 'those dims'} with input_shapes= "
                             "(None keeps a dim symbolic; opgraph convert --input-shape NAME=D1,D2,...)")
        return tuple(dims)  # type: ignore[return-value]

    def dims(self, v: Value) -> tuple[int | None, ...]:
        """The shape of a value with None for dims known only at run time; its rank must be known."""
        if v is None:  # an optional input left out (an empty name) where the translation needs one
            raise self.error("an input it needs is left out (its name is empty)")
        if not isinstance(v, Value):
            raise self.error(f"needs a tensor input, got {type(v).__name__.lower()}")
        t = v.type
        if not isinstance(t, TensorType) or t.shape is None:
            raise self.error(f"needs an input of known rank, its input is {t}")
        if None in t.shape:  # a size the type lost (after a run-time reshape) that the symbols still know
            sym = self.imp.sym.shape_of(v) or t.shape
            return tuple(d if isinstance(d, int) else None for d in sym)
        return tuple(int(d) for d in t.shape)

    def rank(self, v: Value) -> int:
        """The rank of a value (its dims may be symbolic)."""
        return len(self.dims(v))

    def dtype(self, v: Value) -> np.dtype:
        """The dtype of a value."""
        if v is None:
            raise self.error("an input it needs is left out (its name is empty)")
        if not isinstance(v, Value) or not isinstance(v.type, TensorType):
            raise self.error(f"needs a tensor input, got {type(v).__name__.lower()}")
        return v.type.dtype

    def const(self, value: Any, dtype: Any = None) -> Value:
        """A constant value."""
        return self.imp.const(np.asarray(value, dtype=dtype))

    def op(self, kind: str, *inputs: Any, **attrs: Any) -> Any:
        """Build an opgraph op (folded into constants when every input is known)."""
        try:
            return self.imp.op(kind, *inputs, **attrs)
        except OnnxImportError:
            raise
        except GraphError as exc:
            raise self.error(_message(exc)) from exc

    def cast(self, v: Value, dtype: Any) -> Value:
        """``v`` as ``dtype`` (no op when it already is)."""
        dt = np.dtype(dtype)
        return v if self.dtype(v) == dt else self.op("cast", v, dtype=dt.name)

    def subgraph(self, name: str, inputs: Sequence[Any], outer: Scope) -> list[Any]:
        """Inline the graph attribute ``name`` with its formal inputs bound to ``inputs``."""
        g = self.attr(name)
        return self.imp.inline_graph(g, inputs, outer, self.opsets)


class Importer:
    """Translates one ONNX model (or graph) into a GraphBuilder; see :func:`opgraph.io.onnx.from_onnx`."""

    def __init__(self, opsets: Mapping[str, int], functions: Mapping[tuple[str, str], onnx.FunctionProto],
                 static_inputs: Mapping[str, np.ndarray], constant_inputs: Iterable[str]) -> None:
        self.b = GraphBuilder()
        self.opsets = dict(opsets)
        self.functions = dict(functions)
        self.static_inputs = dict(static_inputs)
        self.constant_inputs = set(constant_inputs)
        self.known: dict[int, np.ndarray] = {}
        #: constants folded from one named constant, laid out anew: value id -> name (see :meth:`_derive`)
        self.derived: dict[int, str] = {}
        self.input_names: dict[int, str] = {}
        self.scope: Scope = Scope()
        #: labels of the nodes being translated, outermost first (a subgraph's nodes are inside its parent's)
        self.context: list[str] = []
        #: for the importer of a control-flow body (:meth:`child`): the enclosing graph's importer, and the body
        #: parameters standing for values of the enclosing graph (parameter id -> the enclosing graph's value)
        self.parent: Importer | None = None
        self.captured: dict[int, Value] = {}
        #: the symbolic shapes and shape values of what this builder holds (a dynamic batch: _symbolic)
        self.sym = Symbols(self.b)

    def child(self) -> Importer:
        """An importer for a control-flow body: its own builder, the same model, opsets and static inputs.

        >>> imp = Importer({"": 18}, {}, {}, ())
        >>> imp.child().parent is imp
        True
        """
        sub = Importer(self.opsets, self.functions, self.static_inputs, self.constant_inputs)
        sub.parent = self
        sub.context = self.context  # error labels name the nodes the body is in
        return sub

    # ---------------------------------------------------------------- values and folding
    def const(self, arr: np.ndarray, name: str | None = None) -> Value:
        """A constant whose value is known to the importer (``name``: an initializer's, kept on the constant)."""
        try:
            v = self.b.constant(arr, name=name)
        except GraphError:  # the name is taken (a malformed model repeats it): the constant goes unnamed
            if name is None:
                raise
            v = self.b.constant(arr)
        self.known[v.id] = self.b._constants[self.b._const_ops_index(v.id)]
        return v

    def known_value(self, v: Any) -> np.ndarray | None:
        """The value of ``v`` if known while importing."""
        return self.known.get(v.id) if isinstance(v, Value) else None

    def static_value(self, v: Any) -> np.ndarray | None:
        """The known value, or raise :class:`NeedStatic` when it depends on inputs given as static."""
        arr = self.known_value(v)
        if arr is not None or not isinstance(v, Value):
            return arr
        if v.id in self.captured:  # a body parameter standing for a value of the enclosing graph
            return self.parent.static_value(self.captured[v.id])  # type: ignore[union-attr]
        wanted = self._graph_inputs_below(v.id)
        if wanted and wanted <= set(self.static_inputs):
            raise NeedStatic(wanted)
        return None

    def _graph_inputs_below(self, vid: int) -> set[str] | None:
        """The names of the model's inputs ``vid`` is computed from; None when a body parameter that only the run
        knows (an iteration number, a loop-carried value) is among them."""
        names: set[str] = set()
        for i in self._inputs_below(vid):
            if i in self.input_names:
                names.add(self.input_names[i])
            elif i in self.captured and self.parent is not None:
                sub = self.parent._graph_inputs_below(self.captured[i].id)
                if sub is None:
                    return None
                names |= sub
            elif self.parent is not None:
                return None
        return names

    def _inputs_below(self, vid: int) -> set[int]:
        b = self.b
        seen: set[int] = set()
        found: set[int] = set()
        stack = [vid]
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            prod = b._value_producer[v]
            if prod == -1:
                found.add(v)
                continue
            stack.extend(b.op_inputs(prod))
        return found

    def op(self, kind: str, *inputs: Any, **attrs: Any) -> Any:
        """Build ``kind`` on ``inputs``; fold it into constants when all inputs are known."""
        vals = [x if isinstance(x, Value) else self.const(np.asarray(x)) for x in inputs]
        arrays = [self.known.get(v.id) for v in vals]
        if vals and all(a is not None for a in arrays):
            r = resolve(kind, [v.type for v in vals], attrs)
            # A larger result is computed at run time. A kernel's error and NumPy's warnings reach the importer,
            # which reports them naming the node; a result of another dtype than ONNX's is cast to it.
            outs = fold(r.opdef, dict(r.attrs), r.version, arrays, r.out_types, limit=FOLD_ELEMENTS,
                        in_types=[v.type for v in vals], errstate=None, catch=False, cast=True)
            if outs is not None:
                fresh = self.b.num_values
                consts = [self.const(a) for a in outs]
                if len(consts) == 1 and consts[0].id >= fresh:
                    self._derive(kind, vals, consts[0])
                return consts[0] if len(consts) == 1 else tuple(consts)
        elif vals and self.sym.values and any(v.id in self.sym.values for v in vals):
            # shape arithmetic on a symbolic dim (Shape(x)[0] * 4): the op stays, its value is tracked
            symbolic = self.sym.fold(kind, vals, attrs, self.known)
            if symbolic is not None and all(a.dtype != object for a in symbolic):
                consts = [self.const(a) for a in symbolic]
                return consts[0] if len(consts) == 1 else tuple(consts)
            res = self.b.op(kind, *vals, **attrs)
            for v, a in zip(res if isinstance(res, tuple) else (res,), symbolic or (), strict=False):
                if a.dtype == object:
                    self.sym.values[v.id] = a
                else:
                    self.known.setdefault(v.id, a)
            return res
        return self.b.op(kind, *vals, **attrs)

    def _derive(self, kind: str, inputs: Sequence[Value], out: Value) -> None:
        """Name a new constant folded from one named constant of as many elements (a Gemm's transposed weight, a
        Conv's reshaped bias) ``<name>/<op kind>``, in :attr:`derived`: it is that parameter, laid out anew."""
        if kind not in _RELAYOUT:
            return
        size = out.type.size  # type: ignore[union-attr]
        origins = [self.derived.get(v.id) or self.b.name_of(v.id) for v in inputs
                   if v.id in self.known and self.known[v.id].size == size and size > 1]
        named = [o for o in origins if o is not None]
        if len(named) == 1 and len(origins) == 1:
            self.derived[out.id] = f"{named[0]}/{kind}"

    # ---------------------------------------------------------------- graphs
    def add_input(self, name: str, t: TensorType) -> Value:
        """Declare a graph input (or a constant when it is specialised)."""
        if name in self.constant_inputs:
            arr = np.asarray(self.static_inputs[name], dtype=t.dtype)
            return self.const(arr, name)
        v = self.b.input(t, name=name)
        self.input_names[v.id] = name
        return v

    def translate_nodes(self, nodes: Sequence[onnx.NodeProto], scope: Scope, opsets: Mapping[str, int]) -> None:
        """Translate nodes in order, binding their outputs in ``scope``."""
        for index, proto in enumerate(nodes):
            self.translate_node(proto, scope, opsets, index=index)

    def translate_node(self, proto: onnx.NodeProto, scope: Scope, opsets: Mapping[str, int],
                       attr_env: Mapping[str, onnx.AttributeProto] | None = None, index: int | None = None) -> None:
        """Translate one node (a model node or one inside an inlined function body).

        Whatever goes wrong is one :class:`OnnxImportError` naming the node
        (its index, op type and name, after those of the nodes whose
        subgraph or function body it is in), with the cause chained.
        """
        self.context.append(node_label(proto, index))
        label = " > ".join(self.context)
        try:
            self._translate_node(proto, scope, opsets, attr_env, label)
        except (OnnxImportError, NeedStatic):
            raise
        except GraphError as exc:
            raise OnnxImportError(f"{label}: {_message(exc)}") from exc
        except Exception as exc:  # a translator's own failure on a model it did not expect
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise OnnxImportError(f"{label}: {type(exc).__name__}{': ' + text if text else ''}") from exc
        finally:
            self.context.pop()

    def _translate_node(self, proto: onnx.NodeProto, scope: Scope, opsets: Mapping[str, int],
                        attr_env: Mapping[str, onnx.AttributeProto] | None, label: str) -> None:
        in_names, out_names = tuple(proto.input), tuple(proto.output)
        texts = (proto.op_type, proto.domain, proto.name, *in_names, *out_names)
        if not all(type(text) is str for text in texts):  # protobuf hands back bytes that are not UTF-8
            for what, text in (("op_type", proto.op_type), ("domain", proto.domain), ("name", proto.name),
                               *((f"input {i}", x) for i, x in enumerate(proto.input)),
                               *((f"output {i}", x) for i, x in enumerate(proto.output))):
                if not isinstance(text, str):
                    raise OnnxImportError(f"{label}: {what} {text!r} is not valid UTF-8 text")
        attrs: dict[str, Any] = {}
        attr_protos: dict[str, onnx.AttributeProto] = {}
        for a in proto.attribute:
            if not isinstance(a.name, str) or not isinstance(a.ref_attr_name, str):
                raise OnnxImportError(f"{label}: attribute name {a.name!r} is not valid UTF-8 text")
            if a.ref_attr_name:
                if attr_env is None or a.ref_attr_name not in attr_env:
                    continue
                ref = onnx.AttributeProto()
                ref.CopyFrom(attr_env[a.ref_attr_name])
                ref.name = a.name
                a = ref
            attr_protos[a.name] = a
        inputs = []
        for name in in_names:
            if not name:
                inputs.append(None)
                continue
            try:
                inputs.append(scope.lookup(name))
            except KeyError:
                raise OnnxImportError(f"{label}: input {name!r} is not defined before it is used") from None
        domain = proto.domain if proto.domain != "ai.onnx" else ""
        node = Node(self, proto, opsets, attrs, inputs, scope, label)
        local = (domain, proto.op_type) in self.functions
        if not local:  # a model's own function may reuse an op's name with other inputs
            check_schema(proto, node.opset, attr_protos, label, (in_names, out_names))
        for name, a in attr_protos.items():
            attrs[name] = attribute_value(a, label)
        fn = TRANSLATORS.get((domain, proto.op_type))
        if local:
            outs = self.inline_function(self.functions[(domain, proto.op_type)], node, attr_protos, scope)
        elif fn is not None:
            lo, hi = _arity(fn)  # a node ONNX's schema did not check (none known at this opset) may not fit
            if not lo <= len(inputs) <= hi:
                raise node.error(f"has {len(inputs)} inputs, which opgraph's translation of {proto.op_type} does not "
                                 "take")
            outs = fn(node, *inputs)
        else:
            body = schema_function(proto, opsets, inputs)
            if body is None:
                raise node.error(f"opgraph has no translation for ONNX op {domain or 'ai.onnx'}.{proto.op_type} "
                                 f"(opset {node.opset})")
            outs = self.inline_function(body, node, {**schema_defaults(proto, opsets), **attr_protos}, scope)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        for i, name in enumerate(out_names):
            if name:
                if i >= len(outs) or outs[i] is None:
                    raise node.error(f"output {i} ({name!r}) is not produced by opgraph's translation")
                scope.names[name] = outs[i]

    def inline_function(self, fn: onnx.FunctionProto, node: Node, attr_protos: Mapping[str, onnx.AttributeProto],
                        outer: Scope) -> list[Any]:
        """Translate a function body in place of ``node`` (model-local or an ONNX schema's function)."""
        env = dict(attr_protos)
        for a in fn.attribute_proto:
            if a.name not in env:
                env[a.name] = a
        scope = Scope({}, None)
        for formal, actual in zip(fn.input, node.inputs, strict=False):
            if formal and actual is not None:
                scope.names[formal] = actual
        # a body may import fewer domains than its caller (some schema bodies import none): inherit the rest
        opsets = {**node.opsets, **{o.domain if o.domain != "ai.onnx" else "": o.version for o in fn.opset_import}}
        for index, proto in enumerate(fn.node):
            self.translate_node(proto, scope, opsets, env, index)
        return [scope.names.get(o) for o in fn.output]

    def inline_graph(self, g: onnx.GraphProto, inputs: Sequence[Any], outer: Scope,
                     opsets: Mapping[str, int]) -> list[Any]:
        """Translate a subgraph (If/Loop/Scan body) with its formal inputs bound to ``inputs``."""
        scope = Scope({}, outer)
        for init in g.initializer:
            scope.names[init.name] = self.const(tensor_to_array(init, f"initializer {init.name!r}"))
        for formal, actual in zip(g.input, inputs, strict=False):
            scope.names[formal.name] = actual
        self.translate_nodes(g.node, scope, opsets)
        try:
            return [scope.lookup(o.name) for o in g.output]
        except KeyError as exc:
            raise OnnxImportError(f"subgraph {g.name!r}: output {exc.args[0]!r} is never computed") from None


@functools.cache
def _arity(fn: Translator) -> tuple[int, float]:
    """How many inputs a translator ``fn(node, *inputs)`` takes: (at least, at most).

    >>> _arity(lambda node, x, y=None: x)
    (1, 2)
    """
    lo, hi, variadic = 0, 0, False
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        if p.kind == p.VAR_POSITIONAL:
            variadic = True
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            hi += 1
            lo += p.default is p.empty
    return lo, math.inf if variadic else hi


def _message(exc: GraphError) -> str:
    """An opgraph error's message without the builder's "(at file:line)", a line of the importer."""
    text = str(exc)
    location = getattr(exc, "location", None)
    return text.replace(f" (at {location})", "") if location else text


def node_label(proto: onnx.NodeProto, index: int | None = None) -> str:
    """``#index OpType node 'name'`` (the name is the first output's when the node has none).

    >>> node_label(helper.make_node("Expand", ["x", "s"], ["y"]), 12)
    "#12 Expand node 'y'"
    """
    name = proto.name or (proto.output[0] if proto.output else "")
    op_type = proto.op_type if isinstance(proto.op_type, str) else repr(proto.op_type)
    return f"{'' if index is None else f'#{index} '}{op_type} node {name!r}"


@functools.lru_cache(maxsize=4096)
def _schema_facts(op_type: str, version: int, domain: str) -> tuple[Any, ...] | None:
    """What :func:`check_schema` needs of an op's schema, looked up once per (op, opset, domain)."""
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except (onnx.defs.SchemaError, TypeError):  # an unknown domain, not yet defined at this opset, a huge version
        return None
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    sides = tuple((kind, tuple(p.option == single for p in params), lo, hi)
                  for kind, params, lo, hi in (("input", schema.inputs, schema.min_input, schema.max_input),
                                               ("output", schema.outputs, schema.min_output, schema.max_output)))
    names = (tuple(p.name for p in schema.inputs), tuple(p.name for p in schema.outputs))
    return sides, names, {name: int(a.type) for name, a in schema.attributes.items()}


def check_schema(proto: onnx.NodeProto, version: int, attrs: Mapping[str, onnx.AttributeProto], label: str,
                 io_names: tuple[Sequence[str], Sequence[str]] | None = None) -> None:
    """Check a node's inputs, outputs and attribute types against its ONNX schema (none known: no check).

    Omitted optional inputs and outputs (empty names) count as absent; a
    variadic one takes any number from its minimum. ``io_names``: the node's
    input and output names when the caller has them already (reading a
    protobuf field is slow).

    >>> check_schema(helper.make_node("Expand", ["x"], ["y"]), 17, {}, "#0 Expand node 'y'")
    Traceback (most recent call last):
      ...
    opgraph.io.onnx._core.OnnxImportError: #0 Expand node 'y': has 1 input, Expand (opset 17) takes at least 2
    """
    op_type, domain = proto.op_type, proto.domain
    facts = _schema_facts(op_type, version, domain if domain != "ai.onnx" else "")
    if facts is None:
        return
    sides, param_names, attr_types = facts
    for (kind, required, lo, hi), names, formal in zip(sides, io_names or (proto.input, proto.output), param_names,
                                                       strict=True):
        given = len(names)
        if lo <= given <= hi and (given == 0 or names[given - 1]) and all(names[:len(required)]):
            continue  # the usual case: every name present, a count the schema takes
        where = f"{op_type} (opset {version})"
        while given and not names[given - 1]:
            given -= 1
        if given < lo:
            raise OnnxImportError(f"{label}: has {given} {kind}{'s' * (given != 1)}, {where} takes at least {lo}")
        if len(names) > hi:  # empty names count here: the translator would get a None for each
            raise OnnxImportError(f"{label}: has {len(names)} {kind}{'s' * (len(names) != 1)}, {where} takes at "
                                  f"most {hi}")
        for i in range(min(given, len(required))):
            if not names[i] and required[i]:
                raise OnnxImportError(f"{label}: {kind} {i} ({formal[i]}) of {where} is required but its name "
                                      "is empty")
    for name, a in attrs.items():
        want_type = attr_types.get(name)
        if want_type is not None and a.type != want_type:
            want = onnx.AttributeProto.AttributeType.Name(want_type)
            got = onnx.AttributeProto.AttributeType.Name(a.type) if a.type in \
                onnx.AttributeProto.AttributeType.values() else str(a.type)
            raise OnnxImportError(f"{label}: attribute {name!r} of {proto.op_type} (opset {version}) must be "
                                  f"{want}, got {got}")


def schema_function(proto: onnx.NodeProto, opsets: Mapping[str, int],
                    inputs: Sequence[Any]) -> onnx.FunctionProto | None:
    """The function body ONNX's schema defines for an op (plain or context-dependent), if any."""
    domain = proto.domain if proto.domain != "ai.onnx" else ""
    version = opsets.get(domain, opsets.get("ai.onnx", 1) if domain == "" else 1)
    try:
        schema = onnx.defs.get_schema(proto.op_type, version, domain)
    except (onnx.defs.SchemaError, TypeError):  # TypeError: a version beyond a C int
        return None
    try:
        if schema.has_function:
            body = schema.get_function_with_opset_version(version) if version in schema.function_opset_versions \
                else schema.function_body
            return body if isinstance(body, onnx.FunctionProto) else _parse_function(body)
        if schema.has_context_dependent_function:
            present = list(inputs)
            while present and present[-1] is None:
                present.pop()
            types = []
            for v in present:
                # ONNX's C++ builders crash on input types they do not expect: give them tensors only
                if not (isinstance(v, Value) and isinstance(v.type, TensorType) and v.type.shape is not None):
                    return None
                types.append(helper.make_tensor_type_proto(onnx_elem_type(v.type.dtype), v.type.shape))
            versions = schema.context_dependent_function_opset_versions
            usable = [x for x in versions if x <= version]
            raw = (schema.get_context_dependent_function_with_opset_version(
                max(usable), proto.SerializeToString(), [t.SerializeToString() for t in types])
                if usable else schema.get_context_dependent_function(
                    proto.SerializeToString(), [t.SerializeToString() for t in types]))
            return _parse_function(raw)
    except Exception:  # a body ONNX cannot build for these inputs is "no translation"
        return None
    return None


def schema_defaults(proto: onnx.NodeProto, opsets: Mapping[str, int]) -> dict[str, onnx.AttributeProto]:
    """The default values the ONNX schema gives the attributes of ``proto``'s op (for its function body)."""
    domain = proto.domain if proto.domain != "ai.onnx" else ""
    try:
        schema = onnx.defs.get_schema(proto.op_type, opsets.get(domain, 1), domain)
    except (onnx.defs.SchemaError, TypeError):  # TypeError: a version beyond a C int
        return {}
    out = {}
    for name, spec in schema.attributes.items():
        default = spec.default_value
        if default is not None and default.type != onnx.AttributeProto.UNDEFINED:
            a = onnx.AttributeProto()
            a.CopyFrom(default)
            a.name = name
            out[name] = a
    return out


def _parse_function(raw: Any) -> onnx.FunctionProto:
    if isinstance(raw, onnx.FunctionProto):
        return raw
    fp = onnx.FunctionProto()
    fp.ParseFromString(raw)
    return fp
