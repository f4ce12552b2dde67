"""opgraph Graph -> ONNX model (see :func:`to_onnx`).

Each opgraph op becomes one or a few ONNX nodes of the default domain
(opset 18, or any of :data:`OPSETS`: the model passes ONNX's full check at
the opset written): its export rule (:data:`RULES`), or else its decomposition into
more basic ops (:func:`export_op`), which is how the optimiser's fused ops
(``matmul_t``, ``fused_elementwise``, the optimiser updates, ``gelu``) are
written; constants become initializers. Op kinds ONNX cannot express
(complex numbers, most of linalg) are refused with an error naming the op and
saying why, and so are graphs with update edges (state), unless their new
values are asked for as extra outputs (``updates="outputs"``).

    >>> import numpy as np, onnx, opgraph
    >>> from opgraph.io.onnx import to_onnx
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2, 3)), name="x")
    >>> b.output(b.name(b.sum(b.exp(x), axis=1), "y"))
    >>> model = to_onnx(b.freeze())
    >>> onnx.checker.check_model(model, full_check=True)
    >>> [n.op_type for n in model.graph.node]
    ['Exp', 'ReduceSum']

The rules live in the modules of this package named after the op families of
:mod:`opgraph.ops` (``export/elementwise.py`` writes ``logaddexp``), each
registered in :data:`EXPORT` with ``@EXPORT.rule("logaddexp")`` as an engine
registers its rules (:mod:`opgraph.core.ruletable`); the ops with subgraph
bodies are registered in :data:`BODY_EXPORT` (``export/control.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
import onnx
from onnx import helper, numpy_helper

from opgraph.core.graph import Graph
from opgraph.core.registry import CONST, get_op, has_trait, resolve
from opgraph.core.ruletable import RuleTable
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType
from opgraph.errors import GraphError
from opgraph.io.onnx.export.common import AttrMap, Names, Rule, Types, elem_type

OPSET = 18
"""The opset :func:`to_onnx` writes by default."""
OPSETS = range(OPSET, onnx.defs.onnx_opset_version() + 1)
"""The opsets :func:`to_onnx` can write: from 18 (the forms the rules write: ``Reduce*`` axes as an input,
``Split``'s ``num_outputs``) to the newest the installed onnx package knows."""
NAN_SEMANTICS = ("numpy", "onnx")
"""The values of :func:`to_onnx`'s ``nan_semantics``."""

EXPORT = RuleTable.empty()
"""The one-op translations, registered by the family modules with ``@EXPORT.rule(kind)``: opgraph kind -> export
rule (ins, attrs, in_types, out_types) -> output names. It is the onnxruntime backend's rule table too."""
BODY_EXPORT = RuleTable.empty()
"""The rules of the ops with subgraph bodies (call, cond, while_loop, scan), kept apart from :data:`EXPORT`
because they are tested with bodies (tests/test_io_onnx_control_export.py), not by the one-op cases."""
RULES: dict[str, Rule] = EXPORT.rules
"""opgraph kind -> export rule (the rules of :data:`EXPORT`)."""
BODY_RULES: dict[str, Rule] = BODY_EXPORT.rules
"""The rules of :data:`BODY_EXPORT`."""


class OnnxExportError(GraphError):
    """A graph cannot be written as ONNX: the message names the op."""


class Exporter:
    """Accumulates ONNX nodes and initializers for one graph."""

    def __init__(self, graph: Graph, parent: Exporter | None = None, *, opset: int = OPSET,
                 nan_semantics: str = "numpy") -> None:
        self.graph = graph
        #: the opset written (a body's is its parent's): no node gets an attribute this opset does not know
        self.opset = parent.opset if parent is not None else opset
        #: "numpy": max and min reductions, argmax, argmin and max pools propagate NaN as NumPy's do (guards
        #: around ONNX's ops); "onnx": ONNX's ops alone (a body's is its parent's)
        self.nan_semantics = parent.nan_semantics if parent is not None else nan_semantics
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counter = 0
        #: the opgraph kind being exported (rules shared by several kinds look at it)
        self.current_kind = ""
        self._consts: dict[tuple[Any, ...], str] = {}
        #: the exporter of the enclosing graph, for a control-flow body: names are unique across the model (ONNX
        #: subgraphs may not reuse an outer name) and constants are the model's initializers, which bodies see
        self.parent = parent
        #: tensor and node names given out so far (the model's root exporter keeps them; bodies ask it)
        self.taken: set[str] = set()
        self.node_names: set[str] = set()
        #: values whose ONNX name is not theirs to take in :meth:`emit_graph` (graph outputs, named by to_onnx)
        self.unnamed: set[int] = set()

    def fresh(self, hint: str = "t") -> str:
        """A new tensor name (unique in the whole model, bodies included).

        >>> import opgraph
        >>> ex = Exporter(opgraph.GraphBuilder().freeze())
        >>> ex.fresh("x"), ex.fresh()
        ('_x1', '_t2')
        """
        if self.parent is not None:
            return self.parent.fresh(hint)
        while True:  # a user's name may look like one of these
            self._counter += 1
            name = f"_{hint}{self._counter}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def claim(self, name: str) -> str:
        """``name`` as a tensor name of the model, made unique (``name_2``, ...) if it is taken already.

        >>> import opgraph
        >>> ex = Exporter(opgraph.GraphBuilder().freeze())
        >>> ex.claim("fc.weight"), ex.claim("fc.weight"), ex.claim("")
        ('fc.weight', 'fc.weight_2', 'unnamed')
        """
        if self.parent is not None:
            return self.parent.claim(name)
        return _unique(name or "unnamed", self.taken)

    def name_nodes(self, start: int, name: str, main: str | None) -> None:
        """Name the nodes appended since ``self.nodes[start]`` for an op called ``name``: the node making tensor
        ``main`` (else the last) takes ``name``, the others ``name/OpType``, each unique among the model's nodes.

        >>> import opgraph
        >>> ex = Exporter(opgraph.GraphBuilder().freeze())
        >>> y = ex.one("Add", ex.one("MatMul", "x", "w"), "b")
        >>> ex.name_nodes(0, "/fc/Gemm", y); [n.name for n in ex.nodes]
        ['/fc/Gemm/MatMul', '/fc/Gemm']
        """
        root = self
        while root.parent is not None:  # one namespace for the model's nodes, bodies' included
            root = root.parent
        nodes = self.nodes[start:]
        head = next((n for n in reversed(nodes) if main in n.output), nodes[-1] if nodes else None)
        if head is not None:
            head.name = _unique(name, root.node_names)
        for n in nodes:
            if n is not head:
                n.name = _unique(f"{name}/{n.op_type}", root.node_names)

    def rename_output(self, start: int, old: str, new: str) -> str:
        """Rename tensor ``old``, made by a node appended since ``self.nodes[start]``, to ``new`` (made unique);
        the new name, or ``old`` when no such node makes it (an input handed through, an initializer)."""
        nodes = self.nodes[start:]
        if not any(old in n.output for n in nodes):
            return old
        new = self.claim(new)
        for n in nodes:
            for field in (n.input, n.output):
                for i, x in enumerate(field):
                    if x == old:
                        field[i] = new
        return new

    def node(self, op_type: str, inputs: list[str], n_out: int = 1, outputs: list[str] | None = None,
             **attrs: Any) -> list[str]:
        """Append a node; return its output names.

        >>> import opgraph
        >>> ex = Exporter(opgraph.GraphBuilder().freeze())
        >>> ex.node("TopK", ["x", "k"], n_out=2, axis=0), ex.node("Relu", ["x"], outputs=["y"])
        (['_topk1', '_topk2'], ['y'])
        """
        outs = outputs or [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **_known_attrs(op_type, self.opset, attrs)))
        return outs

    def one(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        """Append a one-output node; return its output name.

        >>> import opgraph
        >>> ex = Exporter(opgraph.GraphBuilder().freeze())
        >>> ex.one("Add", "a", "b"), ex.nodes[0].input
        ('_add1', ['a', 'b'])
        """
        return self.node(op_type, list(inputs), **attrs)[0]

    def const(self, value: Any, dtype: Any = None) -> str:
        """An initializer holding ``value`` (shared between equal constants).

        >>> import opgraph
        >>> ex = Exporter(opgraph.GraphBuilder().freeze())
        >>> ex.const(1.5), ex.const(1.5), ex.const(1.5, "float32"), len(ex.initializers)
        ('_c1', '_c1', '_c2', 2)
        """
        if self.parent is not None:
            return self.parent.const(value, dtype)
        arr = np.array(value, dtype=dtype, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        name = self._consts.get(key)
        if name is None:
            name = self._consts[key] = self.fresh("c")
            self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def named_const(self, value: Any, name: str) -> str:
        """An initializer of its own for a named constant (a weight keeps its name), the name made unique.

        >>> import opgraph
        >>> ex = Exporter(opgraph.GraphBuilder().freeze())
        >>> ex.named_const(np.zeros(2), "b"), ex.named_const(np.zeros(2), "b"), ex.const(np.zeros(2))
        ('b', 'b_2', '_c1')
        """
        if self.parent is not None:
            return self.parent.named_const(value, name)
        name = self.claim(name)
        self.initializers.append(numpy_helper.from_array(np.array(value, order="C"), name))
        return name

    def ints(self, values: Any) -> str:
        """An int64 1-D initializer (axes, shapes, pads).

        >>> import opgraph
        >>> from onnx import numpy_helper
        >>> ex = Exporter(opgraph.GraphBuilder().freeze())
        >>> name = ex.ints((2, 3)); numpy_helper.to_array(ex.initializers[0])
        array([2, 3])
        """
        return self.const(np.asarray(list(values), dtype=np.int64).reshape(-1))

    def emit_graph(self, graph: Graph, names: dict[int, str]) -> None:
        """Export every op of ``graph`` (``names`` holds its inputs' ONNX names and receives every value's).

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("float32", (2,)), name="x"); b.output(b.exp(x))
        >>> g = b.freeze(); ex = Exporter(g); names = {0: "x"}
        >>> ex.emit_graph(g, names); [n.op_type for n in ex.nodes], names[int(g.outputs[0])]
        (['Exp'], '_exp1')
        """
        sym = graph.symbols
        for op in graph.topological_order().tolist():
            kind = graph.kind_of(op)
            outs = graph.op_outputs(op).tolist()
            if graph.op_kind[op] == CONST.id:
                label = sym.values.get(outs[0]) or sym.constants.get(graph.attrs_of(op)["index"])
                names[outs[0]] = (self.named_const(graph.constant_of(op), label) if label and outs[0] not in
                                  self.unnamed else self.const(graph.constant_of(op)))
                continue
            ins = graph.op_inputs(op).tolist()
            in_types = [graph.type_of(v) for v in ins]
            out_types = [graph.type_of(v) for v in outs]
            cplx = [t.dtype for t in [*in_types, *out_types] if isinstance(t, TensorType) and t.dtype.kind == "c"]
            if cplx:  # ONNX types complex tensors but hardly any operator takes them (none of those written here)
                raise OnnxExportError(f"op {op} ({kind}) computes on complex numbers ({cplx[0]}), which ONNX's "
                                      "operators do not take")
            start = len(self.nodes)
            try:
                produced = export_op(self, kind, [names[v] for v in ins], in_types, graph.attrs_of(op), out_types)
            except _NoTranslation as exc:
                raise OnnxExportError(f"op {op} ({kind}) has no ONNX translation: {exc}") from None
            except OnnxExportError as exc:
                raise OnnxExportError(f"op {op} ({kind}): {exc}") from None
            produced = list(produced)
            renamed: dict[str, str] = {}
            for i, (v, n) in enumerate(zip(outs, produced, strict=True)):
                label = sym.values.get(v)
                if n in renamed:
                    n = renamed[n]
                elif label and v not in self.unnamed:  # the value's name on the tensor its nodes make
                    n = renamed[n] = self.rename_output(start, n, label)
                produced[i] = names[v] = n
            if sym.ops.get(op):
                self.name_nodes(start, sym.ops[op], produced[0] if produced else None)

    def inline(self, body: Subgraph, args: Names) -> Names:
        """Export ``body`` in place, its parameters bound to the tensors ``args``; the names of its results.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("float32", (2,)), name="x"); b.output(b.negative(x))
        >>> ex = Exporter(b.freeze())
        >>> ex.inline(Subgraph(b.freeze()), ["a"]), ex.nodes[0].input
        (['_neg1'], ['a'])
        """
        g = body.graph
        names = dict(zip(g.inputs.tolist(), args, strict=True))
        self.emit_graph(g, names)
        return [names[v] for v in g.outputs.tolist()]

    def body(self, body: Subgraph, args: list[str | None], name: str, *, lead: Types = (),
             head: Callable[[Exporter, Names, Names], list[tuple[str, TensorType]]] | None = None) -> onnx.GraphProto:
        """``body`` as an ONNX subgraph (the attribute of a Loop, If or Scan).

        ``args[i]`` is the outer name parameter ``i`` stands for (ONNX bodies
        see the enclosing scope), or None for a formal input of the subgraph
        (in order, after ``lead``: formal inputs the body does not use, such as
        a Loop's iteration number). ``head(exporter, formal_names, results)``
        computes outputs that come before the body's results (a Loop body's
        condition).

        >>> import opgraph
        >>> sb = opgraph.GraphBuilder(); a = sb.input(("float32", (2,)), name="a"); sb.output(sb.negative(a))
        >>> ex = Exporter(opgraph.GraphBuilder().freeze())
        >>> g = ex.body(Subgraph(sb.freeze()), [None], "branch")
        >>> [i.name for i in g.input], [n.op_type for n in g.node], [o.name for o in g.output]
        (['_in1'], ['Neg'], ['_neg2'])
        """
        sub = Exporter(body.graph, parent=self)
        g = body.graph
        formals = [self.fresh("in") for _ in lead]
        infos = [_value_info(n, t) for n, t in zip(formals, lead, strict=True)]
        names: dict[int, str] = {}
        for v, a in zip(g.inputs.tolist(), args, strict=True):
            if a is None:
                a = self.fresh("in")
                formals.append(a)
                infos.append(_value_info(a, g.type_of(v)))
            names[v] = a
        sub.emit_graph(g, names)
        results = [names[v] for v in g.outputs.tolist()]
        pairs = [*(head(sub, formals, results) if head is not None else []),
                 *zip(results, (g.type_of(v) for v in g.outputs.tolist()), strict=True)]
        local = {o for n in sub.nodes for o in n.output}
        outs: list[onnx.ValueInfoProto] = []
        for n, t in pairs:
            if n not in local or any(o.name == n for o in outs):  # each output is made in the body, once
                n = sub.one("Identity", n)
            outs.append(_value_info(n, t))
        return helper.make_graph(sub.nodes, name, infos, outs)


@functools.cache
def _schema(op_type: str, opset: int) -> onnx.defs.OpSchema:
    try:
        return onnx.defs.get_schema(op_type, opset)
    except onnx.defs.SchemaError:
        raise OnnxExportError(f"ONNX has no operator {op_type} at opset {opset}") from None


#: attributes whose default has no single value in the schema (one per spatial axis): their neutral value
_NEUTRAL: dict[str, Callable[[Any], bool]] = {"dilations": lambda v: all(int(d) == 1 for d in v)}


def _is_default(op_type: str, name: str, value: Any) -> bool:
    """True when ``value`` is what ONNX assumes for attribute ``name`` of ``op_type`` where it is absent."""
    if name in _NEUTRAL:
        return _NEUTRAL[name](value)
    attr = _schema(op_type, onnx.defs.onnx_opset_version()).attributes.get(name)
    if attr is None or attr.default_value.type == onnx.AttributeProto.UNDEFINED:
        return False
    default = helper.get_attribute_value(attr.default_value)
    return bool(default == value or (isinstance(default, bytes) and default.decode() == value))


def _known_attrs(op_type: str, opset: int, attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` (None values left out) as opset ``opset`` knows them: an attribute that ``op_type`` gained in
    a later opset is dropped where it has its default value, and refused otherwise.

    >>> _known_attrs("AveragePool", 18, {"kernel_shape": [2], "dilations": [1]})
    {'kernel_shape': [2]}
    >>> _known_attrs("AveragePool", 19, {"kernel_shape": [2], "dilations": [1]})
    {'kernel_shape': [2], 'dilations': [1]}
    >>> _known_attrs("AveragePool", 18, {"kernel_shape": [2], "dilations": [2]})
    Traceback (most recent call last):
      ...
    opgraph.io.onnx.export.OnnxExportError: ONNX's AveragePool has no attribute 'dilations' at opset 18 (it has \
since opset 19: to_onnx(..., opset=19) writes it)
    """
    known = _schema(op_type, opset).attributes
    out = {}
    for k, v in attrs.items():
        if v is None or (k not in known and _is_default(op_type, k, v)):
            continue
        if k not in known:
            since = next((o for o in OPSETS if o > opset and k in _schema(op_type, o).attributes), None)
            hint = f" (it has since opset {since}: to_onnx(..., opset={since}) writes it)" if since else ""
            raise OnnxExportError(f"ONNX's {op_type} has no attribute {k!r} at opset {opset}{hint}")
        out[k] = v
    return out


def _unique(base: str, used: set[str]) -> str:
    """``base``, or ``base_2``, ``base_3``, ... the first not in ``used``; added to ``used``.

    >>> used = {"w"}; _unique("w", used), _unique("w", used), _unique("v", used)
    ('w_2', 'w_3', 'v')
    """
    n, k = base, 1
    while n in used:
        k += 1
        n = f"{base}_{k}"
    used.add(n)
    return n


def _value_info(name: str, t: Any) -> onnx.ValueInfoProto:
    """A tensor's ONNX type (unknown dims left unnamed: a body's shapes may change between trips)."""
    if not isinstance(t, TensorType):
        raise OnnxExportError(f"{name}: {t} is not a tensor")
    return helper.make_tensor_value_info(name, elem_type(t.dtype), None if t.shape is None else list(t.shape))




def _operands(ex: Exporter, kind: str, ins: Names, it: Types, ot: Types) -> tuple[Names, Types]:
    """The inputs of an op cast to the dtype(s) its ONNX nodes compute in (ONNX promotes nothing implicitly:
    the op's traits say what NumPy does, see :class:`~opgraph.core.registry.OpDef`)."""
    if has_trait(kind, "truth_valued"):
        want = [np.dtype(np.bool_)] * len(it)
    elif has_trait(kind, "comparison"):
        want = [np.result_type(*(t.dtype for t in it))] * len(it)
    elif kind == "where":
        want = [np.dtype(np.bool_), ot[0].dtype, ot[0].dtype]
    elif has_trait(kind, "promotes") and ot[0].dtype != np.bool_:
        want = [ot[0].dtype] * len(it)
    else:
        return ins, it
    names, types = [], []
    for x, t, w in zip(ins, it, want, strict=True):
        if t.dtype != w:
            x, t = ex.one("Cast", x, to=elem_type(w)), TensorType(w, t.shape)
        names.append(x)
        types.append(t)
    return names, types


class _NoTranslation(Exception):
    """An op kind (maybe one a decomposition uses) that has neither an export rule nor a decomposition."""


def export_op(ex: Exporter, kind: str, ins: Names, in_types: Types, attrs: AttrMap, out_types: Types) -> Names:
    """ONNX nodes for one opgraph op on tensors ``ins``; the names of its outputs.

    An op with an export rule (:data:`RULES`: a direct translation) gets it; any other op is written as its
    decomposition into more basic ops (its ``OpDef.decompose``, the parts lowering gives a backend without the
    op: a fused op's), each exported the same way. An op with neither is refused, saying why.

    >>> import opgraph
    >>> from opgraph.core.types import TensorType
    >>> ex = Exporter(opgraph.GraphBuilder().freeze())
    >>> t = TensorType("float32", (2, 2))
    >>> export_op(ex, "matmul_t", ["a", "b"], [t, t], {"transpose_a": False, "transpose_b": True}, [t])
    ['_matmul2']
    >>> [n.op_type for n in ex.nodes]
    ['Transpose', 'MatMul']
    """
    rule = RULES.get(kind) or BODY_RULES.get(kind)
    if rule is not None:
        ex.current_kind = kind
        names, types = _operands(ex, kind, ins, in_types, out_types)
        return rule(ex, names, attrs, types, out_types)
    return decomposed(ex, kind, ins, in_types, attrs)


def decomposed(ex: Exporter, kind: str, ins: Names, in_types: Types, attrs: AttrMap) -> Names:
    """ONNX nodes for op ``kind`` written as its decomposition (an export rule may defer to it for some dtypes).

    >>> import opgraph
    >>> from opgraph.core.types import TensorType
    >>> ex = Exporter(opgraph.GraphBuilder().freeze())
    >>> out = decomposed(ex, "silu", ["x"], [TensorType("float64", (3,))], {})
    >>> [n.op_type for n in ex.nodes]
    ['Sigmoid', 'Mul']
    """
    fn = get_op(kind).decompose  # the op's parts live with the op, in its family module
    if fn is None:
        raise _NoTranslation(f"ONNX has no operator for {kind} and opgraph knows no decomposition of it into ops "
                             "that have one")
    emit = _Emit(ex, dict(zip(ins, in_types, strict=True)))
    try:
        res = fn(emit, ins, attrs)
    except _NoTranslation as exc:
        raise _NoTranslation(f"it is written as its decomposition, which uses an op that has none: {exc}") from None
    if res is None:
        raise _NoTranslation(f"its decomposition does not apply to operands {', '.join(map(repr, in_types))}")
    return list(res) if isinstance(res, tuple) else [res]


class _Emit:
    """The emitter a decomposition writes with (:class:`opgraph.core.registry.Emit`): values are ONNX tensor names,
    each op is typed by the registry and exported by :func:`export_op`."""

    def __init__(self, ex: Exporter, types: dict[str, TensorType]) -> None:
        self.ex = ex
        self.types = types

    def type_of(self, v: str) -> TensorType:
        return self.types[v]

    def constant(self, value: Any, dtype: Any = None) -> str:
        arr = np.array(value, dtype=dtype)
        name = self.ex.const(arr)
        self.types[name] = TensorType.of(arr)
        return name

    def op(self, kind: str, *ins: str, **attrs: Any) -> Any:
        in_types = [self.types[v] for v in ins]
        r = resolve(kind, in_types, attrs)
        if not all(isinstance(t, TensorType) for t in r.out_types):
            raise _NoTranslation(f"{r.opdef.name} gives values that are not tensors")
        out_types = cast("list[TensorType]", list(r.out_types))
        outs = export_op(self.ex, r.opdef.name, list(ins), in_types, dict(r.attrs), out_types)
        self.types.update(zip(outs, out_types, strict=True))
        return outs[0] if len(outs) == 1 else tuple(outs)


def to_onnx(graph: Graph, *, name: str = "opgraph", opset: int = OPSET, updates: str = "refuse",
            nan_semantics: str = "numpy", weights: Mapping[str, Any] | None = None) -> onnx.ModelProto:
    """Write ``graph`` as an ONNX model (see the module doc).

    Inputs and outputs keep their names (unnamed ones become ``input_<id>`` /
    ``output_<i>``); shapes with unknown dimensions are written as symbolic.
    Other names are kept too, made unique where two collide: a named
    constant is an initializer of that name, a named value the tensor of
    that name, a named op's node that name (its other nodes, when it takes
    several, ``<name>/<OpType>``). ``weights`` (input name -> array, as
    ``from_onnx(..., weights_as_inputs=True)`` returns) writes those inputs
    as initializers holding the arrays instead, so a model fine-tuned in
    opgraph goes back to ONNX as it came.
    ONNX models have no state: a graph with update edges is refused, unless
    ``updates="outputs"``, which writes each update's new value as one more
    output, named after the input it updates (``w.next`` for input ``w``),
    after the graph's outputs: one call of the model is one step, and the
    caller feeds those values back.

    The model passes ``onnx.checker.check_model(model, full_check=True)`` at
    ``opset`` (any of :data:`OPSETS`): an attribute an operator gained in a
    later opset is left out where it has its default value, and an op that
    needs it otherwise is refused, naming the opset that has it.

    ``nan_semantics="numpy"`` (the default) keeps opgraph's (NumPy's) NaN
    propagation where ONNX Runtime's operators skip NaN: max and min
    reductions, argmax and argmin (the first NaN wins) and max pools get
    guards (``IsNaN``, ``Where``, and an ``If`` around a max pool's NaN-aware
    form), and ``hard_swish`` is written as ``x * min(max(x + 3, 0), 6) / 6``
    (which overflows at huge ``x`` as NumPy's does; ``HardSwish`` does not).
    ``nan_semantics="onnx"`` writes ONNX's operators alone, with no
    guards and no control flow: the same values wherever the input holds no
    NaN, and what the original model computes when ``graph`` was imported
    from ONNX (``opgraph convert --onnx-nan-semantics onnx`` on the command
    line).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> w = b.input(("float32", (2,)), name="w")
    >>> b.update(b.multiply(w, 0.5), w)
    >>> [o.name for o in to_onnx(b.freeze(), updates="outputs").graph.output]
    ['w.next']
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2, 3)), name="x")
    >>> b.output(b.max(x, axis=1))
    >>> [n.op_type for n in to_onnx(b.freeze(), nan_semantics="onnx").graph.node]
    ['ReduceMax']
    >>> [n.op_type for n in to_onnx(b.freeze()).graph.node]
    ['ReduceMax', 'IsNaN', 'Cast', 'ReduceMax', 'Greater', 'Where']
    >>> b = opgraph.GraphBuilder(); x = b.input(("float32", (2,)), name="x"); w = b.input(("float32", (2,)), name="w")
    >>> b.output(b.name(b.multiply(x, w), "y"))
    >>> model = to_onnx(b.freeze(), weights={"w": np.ones(2, np.float32)})
    >>> [i.name for i in model.graph.input], [t.name for t in model.graph.initializer]
    (['x'], ['w'])
    """
    if updates not in ("refuse", "outputs"):
        raise ValueError(f"updates must be 'refuse' or 'outputs', got {updates!r}")
    if nan_semantics not in NAN_SEMANTICS:
        raise ValueError(f"nan_semantics must be 'numpy' or 'onnx', got {nan_semantics!r}")
    if isinstance(opset, bool) or not isinstance(opset, int | np.integer) or int(opset) not in OPSETS:
        raise OnnxExportError(f"opgraph writes ONNX opsets {OPSETS.start} to {OPSETS.stop - 1}, not {opset!r}")
    opset = int(opset)
    if len(graph.updates) and updates == "refuse":
        raise OnnxExportError("the graph has update edges (state); ONNX models have none (updates='outputs' writes "
                              "each new state value as an extra output instead: 'opgraph convert --onnx-updates "
                              "outputs' on the command line)")
    ex = Exporter(graph, opset=opset, nan_semantics=nan_semantics)
    names: dict[int, str] = {}
    ex.unnamed.update(graph.outputs.tolist())  # named by their Identity below, which _drop_identities folds away
    unique = ex.claim

    def value_info(v: int, n: str) -> onnx.ValueInfoProto:
        t = graph.type_of(v)
        if not isinstance(t, TensorType):
            raise OnnxExportError(f"value {graph.value_label(v)} is not a tensor")
        dims = None if t.shape is None else [d if d is not None else f"d{v}_{i}" for i, d in enumerate(t.shape)]
        return helper.make_tensor_value_info(n, elem_type(t.dtype), dims)

    weights = dict(weights or {})
    unknown = set(weights) - {graph.name_of(v) for v in graph.inputs.tolist()}
    if unknown:
        raise OnnxExportError(f"weights= names no input of the graph: {sorted(unknown)[:5]}")
    inputs = []
    for v in graph.inputs.tolist():
        label = graph.name_of(v)
        if label in weights:  # an initializer instead of an input
            arr, t = np.asarray(weights[label]), graph.type_of(v)
            if not isinstance(t, TensorType) or not t.accepts(arr):
                raise OnnxExportError(f"weights[{label!r}] is {arr.dtype}{list(arr.shape)}, but input {label!r} of "
                                      f"the graph is {t}")
            names[v] = ex.named_const(arr, label)
            continue
        names[v] = unique(label or f"input_{v}")
        inputs.append(value_info(v, names[v]))
    out_ids = graph.outputs.tolist()
    ex.emit_graph(graph, names)
    outputs = []
    for i, v in enumerate(out_ids):
        n = unique(graph.name_of(v) or f"output_{i}")
        ex.node("Identity", [names[v]], outputs=[n])
        outputs.append(value_info(v, n))
    for src, dst in graph.updates.tolist():  # updates == "outputs": each next state value, after the outputs
        n = unique(f"{names[dst]}.next")
        ex.node("Identity", [names[src]], outputs=[n])
        outputs.append(value_info(src, n))
    g = helper.make_graph(ex.nodes, name, inputs, outputs, initializer=ex.initializers)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="opgraph")
    # the oldest IR version that has this opset (at least 10, which readers of opset 18 expect): newer readers
    # take older IR versions, not the reverse
    model.ir_version = max(helper.find_min_ir_version_for(list(model.opset_import)), min(model.ir_version, 10))
    return _drop_identities(model)


def _names_read(g: onnx.GraphProto) -> list[str]:
    """The names the nodes of ``g`` read, once per use, bodies' outer-scope references included."""
    out: list[str] = []
    for node in g.node:
        out.extend(node.input)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out.extend(_names_read(a.g))
    return out


def _drop_identities(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rename away the Identity nodes that only give an output its name (when nothing else uses the source)."""
    g = model.graph
    graph_outputs = {o.name for o in g.output}
    inits = {t.name for t in g.initializer}
    inputs = {i.name for i in g.input}
    uses: dict[str, int] = {}
    for n in _names_read(g):
        uses[n] = uses.get(n, 0) + 1
    rename: dict[str, str] = {}
    keep = []
    for node in g.node:
        if (node.op_type == "Identity" and node.output[0] in graph_outputs and uses.get(node.input[0]) == 1
                and node.input[0] not in inits and node.input[0] not in inputs
                and node.input[0] not in graph_outputs and node.input[0] not in rename):
            rename[node.input[0]] = node.output[0]
            continue
        keep.append(node)
    for node in keep:
        for i, n in enumerate(node.output):
            if n in rename:
                node.output[i] = rename[n]
    del g.node[:]
    g.node.extend(keep)
    return model


# The family modules register their rules in EXPORT and BODY_EXPORT on import; they use this module's names.
from opgraph.io.onnx.export import (  # noqa: E402,F401
    contraction,
    control,
    elementwise,
    fused,
    indexing,
    linalg,
    nn,
    reduction,
    shape,
)
