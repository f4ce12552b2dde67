"""opgraph Graph -> ONNX model (see :func:`to_onnx`).

Each opgraph op becomes one or a few ONNX nodes of the default domain
(opset 18): its export rule (:data:`RULES`), or else its decomposition into
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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from opgraph.core.graph import Graph
from opgraph.core.registry import CONST, get_op, resolve
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType
from opgraph.errors import GraphError

OPSET = 18

Names = list[str]
AttrMap = dict[str, Any]
Types = list[TensorType]
Rule = Callable[["Exporter", Names, AttrMap, Types, Types], Names]
#: opgraph kind -> export rule (ins, attrs, in_types, out_types) -> output names.
RULES: dict[str, Rule] = {}
#: The rules of the ops with subgraph bodies (call, cond, while_loop, scan), kept apart from :data:`RULES`
#: because they are tested with bodies (tests/test_io_onnx_control_export.py), not by the one-op cases.
BODY_RULES: dict[str, Rule] = {}


class OnnxExportError(GraphError):
    """A graph cannot be written as ONNX: the message names the op."""


def _elem(dtype: Any) -> int:
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


class Exporter:
    """Accumulates ONNX nodes and initializers for one graph."""

    def __init__(self, graph: Graph, parent: Exporter | None = None) -> None:
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counter = 0
        #: the opgraph kind being exported (rules shared by several kinds look at it)
        self.current_kind = ""
        self._consts: dict[tuple[Any, ...], str] = {}
        #: the exporter of the enclosing graph, for a control-flow body: names are unique across the model (ONNX
        #: subgraphs may not reuse an outer name) and constants are the model's initializers, which bodies see
        self.parent = parent

    def fresh(self, hint: str = "t") -> str:
        """A new tensor name (unique in the whole model, bodies included)."""
        if self.parent is not None:
            return self.parent.fresh(hint)
        self._counter += 1
        return f"_{hint}{self._counter}"

    def node(self, op_type: str, inputs: list[str], n_out: int = 1, outputs: list[str] | None = None,
             **attrs: Any) -> list[str]:
        """Append a node; return its output names."""
        outs = outputs or [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **{k: v for k, v in attrs.items() if v is not None}))
        return outs

    def one(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        """Append a one-output node; return its output name."""
        return self.node(op_type, list(inputs), **attrs)[0]

    def const(self, value: Any, dtype: Any = None) -> str:
        """An initializer holding ``value`` (shared between equal constants)."""
        if self.parent is not None:
            return self.parent.const(value, dtype)
        arr = np.array(value, dtype=dtype, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        name = self._consts.get(key)
        if name is None:
            name = self._consts[key] = self.fresh("c")
            self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def ints(self, values: Any) -> str:
        """An int64 1-D initializer (axes, shapes, pads)."""
        return self.const(np.asarray(list(values), dtype=np.int64).reshape(-1))

    def emit_graph(self, graph: Graph, names: dict[int, str]) -> None:
        """Export every op of ``graph`` (``names`` holds its inputs' ONNX names and receives every value's).

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("float32", (2,)), name="x"); b.output(b.exp(x))
        >>> g = b.freeze(); ex = Exporter(g); names = {0: "x"}
        >>> ex.emit_graph(g, names); [n.op_type for n in ex.nodes], names[int(g.outputs[0])]
        (['Exp'], '_exp1')
        """
        for op in graph.topological_order().tolist():
            kind = graph.kind_of(op)
            outs = graph.op_outputs(op).tolist()
            if graph.op_kind[op] == CONST.id:
                names[outs[0]] = self.const(graph.constant_of(op))
                continue
            ins = graph.op_inputs(op).tolist()
            out_types = [graph.type_of(v) for v in outs]
            try:
                produced = export_op(self, kind, [names[v] for v in ins], [graph.type_of(v) for v in ins],
                                     graph.attrs_of(op), out_types)
            except _NoTranslation as exc:
                raise OnnxExportError(f"op {op} ({kind}) has no ONNX translation: {exc}") from None
            except OnnxExportError as exc:
                raise OnnxExportError(f"op {op} ({kind}): {exc}") from None
            for v, n in zip(outs, produced, strict=True):
                names[v] = n

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


def _value_info(name: str, t: Any) -> onnx.ValueInfoProto:
    """A tensor's ONNX type (unknown dims left unnamed: a body's shapes may change between trips)."""
    if not isinstance(t, TensorType):
        raise OnnxExportError(f"{name}: {t} is not a tensor")
    return helper.make_tensor_value_info(name, _elem(t.dtype), None if t.shape is None else list(t.shape))


def exports(*kinds: str, table: dict[str, Rule] | None = None) -> Callable[[Rule], Rule]:
    """Register an export rule for opgraph op kinds (in :data:`RULES`, or ``table``)."""
    def register(fn: Rule) -> Rule:
        for k in kinds:
            (RULES if table is None else table)[k] = fn
        return fn
    return register


def _simple(op_type: str, **fixed: Any) -> Rule:
    def rule(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
        return [ex.one(op_type, *ins, **fixed)]
    return rule


for _kind, _op in {
    "negative": "Neg", "abs": "Abs", "sign": "Sign", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
    "reciprocal": "Reciprocal", "sin": "Sin", "cos": "Cos", "tan": "Tan", "asin": "Asin", "acos": "Acos",
    "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "tanh": "Tanh", "asinh": "Asinh", "acosh": "Acosh",
    "atanh": "Atanh", "floor": "Floor", "ceil": "Ceil", "round": "Round", "sigmoid": "Sigmoid", "erf": "Erf",
    "isnan": "IsNaN", "isinf": "IsInf", "logical_not": "Not", "bitwise_invert": "BitwiseNot", "positive": "Identity",
    "copy": "Identity", "relu": "Relu",
    "add": "Add", "subtract": "Sub", "multiply": "Mul", "power": "Pow", "maximum": "Max", "minimum": "Min",
    "equal": "Equal", "less": "Less", "less_equal": "LessOrEqual", "greater": "Greater",
    "greater_equal": "GreaterOrEqual", "logical_and": "And", "logical_or": "Or", "logical_xor": "Xor",
    "bitwise_and": "BitwiseAnd", "bitwise_or": "BitwiseOr", "bitwise_xor": "BitwiseXor", "where": "Where",
    "matmul": "MatMul",
}.items():
    RULES[_kind] = _simple(_op)


@exports("floor", "ceil", "round")
def _rounding(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    op_type = {"floor": "Floor", "ceil": "Ceil", "round": "Round"}[ex.current_kind]
    # integers and bools are already whole (ONNX's rounding ops take floats only)
    return [ex.one(op_type if it[0].dtype.kind == "f" else "Identity", ins[0])]


def _scalar(ex: Exporter, value: float, t: TensorType) -> str:
    return ex.const(np.asarray(value, dtype=t.dtype))


@exports("square")
def _square(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Mul", ins[0], ins[0])]


@exports("expm1")
def _expm1(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Sub", ex.one("Exp", ins[0]), _scalar(ex, 1, ot[0]))]


@exports("log1p")
def _log1p(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Log", ex.one("Add", ins[0], _scalar(ex, 1, ot[0])))]


@exports("log2", "log10")
def _log_base(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    base = 2.0 if ex.current_kind == "log2" else 10.0
    return [ex.one("Div", ex.one("Log", ins[0]), _scalar(ex, math.log(base), ot[0]))]


@exports("exp2")
def _exp2(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Pow", _scalar(ex, 2, ot[0]), ins[0])]


@exports("erfc")
def _erfc(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Sub", _scalar(ex, 1, ot[0]), ex.one("Erf", ins[0]))]


@exports("trunc")
def _trunc(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    if it[0].dtype.kind != "f":
        return [ex.one("Identity", ins[0])]
    return [ex.one("Mul", ex.one("Sign", ins[0]), ex.one("Floor", ex.one("Abs", ins[0])))]


@exports("isfinite")
def _isfinite(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Not", ex.one("Or", ex.one("IsNaN", ins[0]), ex.one("IsInf", ins[0])))]


@exports("not_equal")
def _not_equal(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Not", ex.one("Equal", *ins))]


@exports("divide")
def _divide(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    a, b = (ex.one("Cast", x, to=_elem(ot[0].dtype)) if t.dtype != ot[0].dtype else x
            for x, t in zip(ins, it, strict=True))
    return [ex.one("Div", a, b)]


@exports("floor_divide", "remainder")
def _floor_divide(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    a, b = ins
    kind = ex.current_kind
    if ot[0].dtype.kind in "iu":
        if kind == "remainder":
            return [ex.one("Mod", a, b, fmod=0)]
        # floor division = (a - mod(a, b)) / b, exact in integers
        return [ex.one("Div", ex.one("Sub", a, ex.one("Mod", a, b, fmod=0)), b)]
    q = ex.one("Floor", ex.one("Div", a, b))
    return [q] if kind == "floor_divide" else [ex.one("Sub", a, ex.one("Mul", q, b))]


@exports("hypot")
def _hypot(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    a, b = ins
    return [ex.one("Sqrt", ex.one("Add", ex.one("Mul", a, a), ex.one("Mul", b, b)))]


@exports("logaddexp")
def _logaddexp(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    a, b = ins
    hi = ex.one("Max", a, b)
    gap = ex.one("Neg", ex.one("Abs", ex.one("Sub", a, b)))
    return [ex.one("Add", hi, ex.one("Log", ex.one("Add", _scalar(ex, 1, ot[0]), ex.one("Exp", gap))))]


@exports("cast")
def _cast(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Cast", ins[0], to=_elem(ot[0].dtype))]


@exports("clip")
def _clip(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    x = ins[0]
    # Clip wants bounds of the input's type and scalar; Max/Min broadcast like NumPy's clip
    x = ex.one("Max", x, ins[1]) if len(ins) > 1 else x
    return [ex.one("Min", x, ins[2]) if len(ins) > 2 else x]


# ---------------------------------------------------------------- reductions
def _axes(attrs: dict[str, Any], rank: int) -> list[int]:
    axis = attrs.get("axis")
    return list(range(rank)) if axis is None else [int(a) % max(rank, 1) for a in axis]


def _flat_axis(ex: Exporter, x: str, axis: Any) -> tuple[str, int]:
    """``(x, axis)``, with ``x`` flattened and axis 0 when ``axis`` is None (NumPy's "over all elements")."""
    if axis is None:
        return ex.one("Reshape", x, ex.ints([-1])), 0
    return x, int(np.atleast_1d(axis)[0])


def _nan_wins(ex: Exporter, x: str, t: TensorType, y: str, reduce: Callable[[str], str]) -> str:
    """``y``, a max or min of ``x``, made NaN wherever ``reduce`` (the same reduction) sees a NaN of ``x``.

    opgraph's max and min reductions and max pools propagate NaN (as NumPy's do); ONNX Runtime's skip it.
    """
    if t.dtype.kind != "f":
        return y
    saw_nan = reduce(ex.one("Cast", ex.one("IsNaN", x), to=_elem(t.dtype)))
    return ex.one("Where", ex.one("Greater", saw_nan, _scalar(ex, 0, t)), _scalar(ex, np.nan, t), y)


def _reduce(op_type: str) -> Rule:
    def rule(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
        axes = _axes(attrs, len(it[0].shape or ()))
        keep = int(attrs.get("keepdims", False))
        x = ins[0]
        if not axes:
            return [ex.one("Identity", x)]
        if op_type in ("ReduceMax", "ReduceMin") and it[0].dtype == np.bool_:
            y = ex.one(op_type, ex.one("Cast", x, to=TensorProto.INT32), ex.ints(axes), keepdims=keep)
            if op_type == "ReduceMax":  # over no elements ReduceMax gives INT32_MIN: "> 0" keeps any() False
                return [ex.one("Greater", y, ex.const(np.int32(0)))]
            return [ex.one("Cast", y, to=TensorProto.BOOL)]
        rank = len(it[0].shape or ())
        if (op_type == "ReduceMean" and rank >= 3 and axes == list(range(2, rank)) and it[0].dtype == np.float32
                and it[0].dtype == ot[0].dtype and ot[0].is_static):
            # the mean over every spatial axis of (N, C, ...) is GlobalAveragePool, which ONNX Runtime keeps in
            # its blocked layout between convolutions (a ReduceMean there costs two layout reorders)
            y = ex.one("GlobalAveragePool", x)
            return [y if keep else ex.one("Reshape", y, ex.ints(ot[0].shape), allowzero=1)]
        y = ex.one(op_type, x, ex.ints(axes), keepdims=keep)
        if op_type in ("ReduceMax", "ReduceMin"):
            y = _nan_wins(ex, x, it[0], y, lambda m: ex.one("ReduceMax", m, ex.ints(axes), keepdims=keep))
        return [y]
    return rule


RULES.update({"sum": _reduce("ReduceSum"), "prod": _reduce("ReduceProd"), "max": _reduce("ReduceMax"),
              "min": _reduce("ReduceMin"), "mean": _reduce("ReduceMean"), "any": _reduce("ReduceMax"),
              "all": _reduce("ReduceMin"), "logsumexp": _reduce("ReduceLogSumExp")})


@exports("var", "std")
def _var(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    shape = it[0].shape or ()
    axes = _axes(attrs, len(shape))
    n = int(np.prod([shape[a] for a in axes])) if axes else 1
    noop = None if axes else 1  # axis=(): no axes reduced (ONNX's empty axes would reduce them all)
    mean = ex.one("ReduceMean", ins[0], ex.ints(axes), keepdims=1, noop_with_empty_axes=noop)
    dev = ex.one("Sub", ins[0], mean)
    ss = ex.one("ReduceSum", ex.one("Mul", dev, dev), ex.ints(axes), keepdims=int(attrs.get("keepdims", False)),
                noop_with_empty_axes=noop)
    var = ex.one("Div", ss, _scalar(ex, max(n - float(attrs.get("correction", 0.0)), 0.0), ot[0]))
    return [ex.one("Sqrt", var) if ex.current_kind == "std" else var]


@exports("argmax", "argmin")
def _argmax(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    op_type = "ArgMax" if ex.current_kind == "argmax" else "ArgMin"
    keep = int(attrs.get("keepdims", False))
    x, axis = _flat_axis(ex, ins[0], attrs.get("axis"))
    flat = attrs.get("axis") is None
    k = 0 if flat else keep
    y = ex.one(op_type, x, axis=axis, keepdims=k)
    if it[0].dtype.kind == "f":  # opgraph's (NumPy's) argmax and argmin find the first NaN; ONNX Runtime's skip NaN
        nan = ex.one("Cast", ex.one("IsNaN", x), to=TensorProto.INT32)
        saw_nan = ex.one("Greater", ex.one("ReduceMax", nan, ex.ints([axis]), keepdims=k), ex.const(np.int32(0)))
        y = ex.one("Where", saw_nan, ex.one("ArgMax", nan, axis=axis, keepdims=k), y)
    return [ex.one("Reshape", y, ex.ints([1] * len(it[0].shape or ()))) if flat and keep else y]


@exports("cumsum")
def _cumsum(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    x, axis = _flat_axis(ex, ins[0], attrs.get("axis"))
    return [ex.one("CumSum", x, ex.const(np.int64(axis)))]


# ---------------------------------------------------------------- contractions and layout
@exports("einsum")
def _einsum(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Einsum", *ins, equation=attrs["subscripts"])]


@exports("outer")
def _outer(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    flat = [x if len(t.shape or ()) == 1 else ex.one("Reshape", x, ex.ints([-1])) for x, t in zip(ins, it, strict=True)]
    return [ex.one("Einsum", *flat, equation="i,j->ij")]


@exports("tensordot")
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


@exports("reshape", "expand_dims", "squeeze")
def _reshape(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Reshape", ins[0], ex.ints(ot[0].shape), allowzero=1)]


@exports("permute_dims")
def _transpose(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    r = len(it[0].shape or ())
    axes = attrs.get("axes")
    if r == 0:
        return [ex.one("Identity", ins[0])]
    return [ex.one("Transpose", ins[0], perm=list(range(r))[::-1] if axes is None else [int(a) % r for a in axes])]


@exports("moveaxis")
def _moveaxis(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    r = len(it[0].shape or ())
    src = [int(a) % r for a in np.atleast_1d(attrs["source"])]
    dst = [int(a) % r for a in np.atleast_1d(attrs["destination"])]
    # NumPy's own construction of the permutation
    perm = [n for n in range(r) if n not in src]
    for d, s in sorted(zip(dst, src, strict=True)):
        perm.insert(d, s)
    return [ex.one("Transpose", ins[0], perm=perm)]


@exports("broadcast_to")
def _broadcast_to(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Expand", ins[0], ex.ints(ot[0].shape))]


@exports("concat")
def _concat(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    flat = [_flat_axis(ex, x, attrs.get("axis")) for x in ins]
    return [ex.one("Concat", *(x for x, _ in flat), axis=flat[0][1])]


@exports("stack")
def _stack(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    axis = int(attrs.get("axis", 0)) % len(ot[0].shape or (0,))
    return [ex.one("Concat", *[ex.one("Unsqueeze", x, ex.ints([axis])) for x in ins], axis=axis)]


@exports("split")
def _split(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    axis = int(attrs.get("axis", 0)) % len(it[0].shape or (0,))
    sizes = [t.shape[axis] for t in ot]
    return ex.node("Split", [ins[0], ex.ints(sizes)], n_out=len(ot), axis=axis)


@exports("getitem")
def _getitem(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    from opgraph.ops.shape import normalize_index

    shape = it[0].shape or ()
    index = normalize_index(attrs["index"], len(shape))
    # expand the ellipsis so each entry lines up with an input axis
    if ("ellipsis",) in index:
        k = index.index(("ellipsis",))
        used = sum(1 for e in index if isinstance(e, int) or e[0] == "slice")
        index = index[:k] + (("slice", None, None, None),) * (len(shape) - used) + index[k + 1:]
    starts, ends, axes, steps, drop = [], [], [], [], []
    axis = 0
    for e in index:
        if isinstance(e, int):
            n = shape[axis]
            i = e % n
            starts.append(i), ends.append(i + 1), axes.append(axis), steps.append(1)
            drop.append(axis)
            axis += 1
        elif e[0] == "slice":
            s, t, step = slice(e[1], e[2], e[3]).indices(shape[axis])
            if (s, t, step) != (0, shape[axis], 1):
                # a negative step's end -1 means "past the front", which ONNX spells as a huge negative
                starts.append(s), ends.append(t if t >= 0 else -(2 ** 62)), axes.append(axis), steps.append(step)
            axis += 1
    x = ins[0]
    if axes:
        x = ex.one("Slice", x, ex.ints(starts), ex.ints(ends), ex.ints(axes), ex.ints(steps))
    return [ex.one("Reshape", x, ex.ints(ot[0].shape), allowzero=1)]


def _run_time_bounds(ex: Exporter, x: str, ins: Names, it: Types, axes: Any) -> tuple[str, str, str, str | None]:
    """``slice``'s bounds as ONNX Slice's ``(starts, ends, axes, steps)`` (int64; axes "" when they are the leading
    ones). ONNX clamps a negative step's start below ``-n`` to the first element where Python's slice is empty:
    such ends become 2**62, which makes ONNX's slice empty too (not INT64_MAX: onnxruntime reads that as "to the
    front" for a negative step)."""
    starts, ends = (_index(ex, n, t, ("int64",)) for n, t in zip(ins[:2], it[:2], strict=True))
    steps = _index(ex, ins[2], it[2], ("int64",)) if len(ins) > 2 else None
    ax = "" if axes is None else ex.ints(axes)
    if steps is not None:
        shape = ex.one("Shape", x)
        n = ex.one("Gather", shape, ax) if axes is not None else ex.one("Slice", shape, ex.ints([0]),
                                                                            ex.one("Shape", starts))
        early = ex.one("And", ex.one("Less", starts, ex.one("Neg", n)), ex.one("Less", steps, ex.ints([0])))
        ends = ex.one("Where", early, ex.ints([2 ** 62]), ends)
    return starts, ends, ax, steps


@exports("slice")
def _slice(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    starts, ends, ax, steps = _run_time_bounds(ex, ins[0], ins[1:], it[1:], attrs.get("axes"))
    return [ex.one("Slice", ins[0], starts, ends, *([ax, steps] if steps is not None else [ax] if ax else []))]


@exports("slice_update")
def _slice_update(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    # A mask over x's own shape (static shapes stay static, so the model imports back): per sliced axis, which
    # positions Python's x[s:e:st] keeps and where each sits in the slice, then Where(mask, update gathered there, x)
    x, update = ins[0], ins[1]
    xs, us = it[0].shape, it[1].shape
    if xs is None or us is None or None in us:
        raise OnnxExportError("slice_update needs the rank of x and the shape of update")
    r = len(xs)
    k = it[2].shape[0] if it[2].shape is not None and len(it[2].shape) == 1 else None
    axes = attrs.get("axes")
    if axes is None:
        if k is None:
            raise OnnxExportError("slice_update needs the number of bounds (or axes) to be known")
        axes = tuple(range(k))
    axes = tuple(int(a) % r for a in axes)
    if 0 in us:  # it broadcasts to the slice, so the slice is empty
        return [ex.one("Identity", x)]
    bounds = [_index(ex, n, t, ("int64",)) for n, t in zip(ins[2:], it[2:], strict=True)]
    u = ex.one("Reshape", update, ex.ints([1] * (r - len(us)) + list(us))) if len(us) < r else update
    u_shape = (1,) * (r - len(us)) + tuple(us)
    shape = ex.one("Shape", x) if None in xs else None
    i64 = np.int64
    mask = None
    for j, d in enumerate(axes):
        if xs[d] is not None:
            n, pos = ex.const(i64(xs[d])), ex.const(np.arange(xs[d], dtype=i64))
        else:
            n = ex.one("Gather", shape, ex.const(i64(d)))
            pos = ex.one("Range", ex.const(i64(0)), n, ex.const(i64(1)))
        s, e = (ex.one("Slice", b, ex.ints([j]), ex.ints([j + 1])) for b in bounds[:2])
        st = ex.one("Slice", bounds[2], ex.ints([j]), ex.ints([j + 1])) if len(bounds) > 2 else ex.ints([1])
        up = ex.one("Greater", st, ex.ints([0]))
        zero, minus1 = ex.ints([0]), ex.ints([-1])
        last = ex.one("Sub", n, ex.const(i64(1)))
        ends = []
        for v in (s, e):  # slice.indices: past either end acts like -n-1 or n; then ONNX-free Python clamping
            v = ex.one("Min", ex.one("Max", v, ex.one("Sub", ex.one("Neg", n), ex.const(i64(1)))), n)
            v = ex.one("Where", ex.one("Less", v, zero), ex.one("Add", v, n), v)
            v_up = ex.one("Min", ex.one("Max", v, zero), n)
            v_dn = ex.one("Where", ex.one("Less", v, zero), minus1, ex.one("Min", v, last))
            ends.append(ex.one("Where", up, v_up, v_dn))
        s, e = ends
        off = ex.one("Sub", pos, s)
        within = ex.one("Or", ex.one("And", up, ex.one("And", ex.one("GreaterOrEqual", pos, s),
                                                         ex.one("Less", pos, e))),
                        ex.one("And", ex.one("Not", up), ex.one("And", ex.one("LessOrEqual", pos, s),
                                                                ex.one("Greater", pos, e))))
        inside = ex.one("And", within, ex.one("Equal", ex.one("Mod", off, st), zero))
        if u_shape[d] != 1:
            at = ex.one("Min", ex.one("Where", inside, ex.one("Div", off, st), zero), ex.ints([u_shape[d] - 1]))
            u = ex.one("Gather", u, at, axis=d)
        inside = ex.one("Reshape", inside, ex.ints([-1 if i == d else 1 for i in range(r)]))
        mask = inside if mask is None else ex.one("And", mask, inside)
    if mask is None:  # no sliced axis: the whole of x
        return [ex.one("Expand", u, shape if shape is not None else ex.ints(xs))]
    # onnxruntime's Where has no bool, 16-bit or uint64 kernels: select among exact casts (uint64 as its bits)
    via = _WHERE_VIA.get(it[0].dtype.name)
    if via is None:
        return [ex.one("Where", mask, u, x)]
    picked = ex.one("Where", mask, ex.one("Cast", u, to=_elem(via)), ex.one("Cast", x, to=_elem(via)))
    return [ex.one("Cast", picked, to=_elem(it[0].dtype))]


_WHERE_VIA = {"bool": "uint8", "int16": "int32", "uint16": "int32", "uint64": "int64"}


@exports("take")
def _take(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    x, axis = _flat_axis(ex, ins[0], attrs.get("axis"))
    return [ex.one("Gather", x, _index(ex, ins[1], it[1]), axis=axis)]


def _index(ex: Exporter, x: str, t: TensorType, ok: tuple[str, ...] = ("int32", "int64")) -> str:
    """Index tensor ``x`` cast to int64 unless its dtype is one ONNX takes (``ok``)."""
    return x if t.dtype.name in ok else ex.one("Cast", x, to=TensorProto.INT64)


@exports("flip")
def _flip(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    r = len(it[0].shape or ())
    axes = list(range(r)) if attrs.get("axis") is None else [int(a) % r for a in attrs["axis"]]
    n = len(axes)
    if not n:
        return [ex.one("Identity", ins[0])]
    return [ex.one("Slice", ins[0], ex.ints([-1] * n), ex.ints([-(2 ** 62)] * n), ex.ints(axes), ex.ints([-1] * n))]


@exports("tile")
def _tile(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    reps = list(attrs["reps"])
    r = len(it[0].shape or ())
    x = ins[0]
    if len(reps) > r:
        x = ex.one("Reshape", x, ex.ints([1] * (len(reps) - r) + list(it[0].shape or ())))
    reps = [1] * (max(r, len(reps)) - len(reps)) + reps
    return [ex.one("Tile", x, ex.ints(reps))]


@exports("pad")
def _pad(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    mode = attrs.get("mode", "constant")
    if mode == "symmetric":
        raise OnnxExportError("pad mode 'symmetric' has no ONNX equivalent")
    r = len(it[0].shape or ())
    width = np.broadcast_to(np.asarray(attrs["pad_width"], dtype=np.int64).reshape(-1, 2), (r, 2))
    pads = list(width[:, 0]) + list(width[:, 1])
    extra = [_scalar(ex, attrs.get("constant_value", 0.0), it[0])] if mode == "constant" else []
    return [ex.one("Pad", ins[0], ex.ints(pads), *extra, mode=mode)]


@exports("softmax", "log_softmax")
def _softmax(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    op_type = "Softmax" if ex.current_kind == "softmax" else "LogSoftmax"
    return [ex.one(op_type, ins[0], axis=int(attrs.get("axis", -1)))]


@exports("fma")
def _fma(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Add", ex.one("Mul", ins[0], ins[1]), ins[2])]


@exports("det")
def _det(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Det", ins[0])]


# ---------------------------------------------------------------- nn and indexing
def _spatial(attrs: dict[str, Any], it: list[TensorType], w_shape: tuple[int, ...] | None = None) -> dict[str, Any]:
    """ONNX kernel/stride/dilation/pads attributes from opgraph's N-d conv and pool attributes."""
    n = len(it[0].shape or ()) - 2
    kernel = attrs.get("kernel_size") or (w_shape[2:] if w_shape else None)
    stride = attrs.get("stride") or (1,) * n  # the N-d ops' None stride is 1, as in ONNX
    padding = attrs.get("padding") or ((0, 0),) * n
    out = {"strides": list(stride), "pads": [p[0] for p in padding] + [p[1] for p in padding]}
    if kernel is not None and "kernel_size" in attrs:
        out["kernel_shape"] = list(kernel)
    if attrs.get("dilation") is not None:
        out["dilations"] = list(attrs["dilation"])
    return out


@exports("conv", "conv_transpose")
def _conv(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    extra = _spatial(attrs, it)
    if attrs.get("output_padding") is not None:
        extra["output_padding"] = list(attrs["output_padding"])
    op_type = "Conv" if ex.current_kind == "conv" else "ConvTranspose"
    return [ex.one(op_type, *ins, group=int(attrs.get("groups", 1)), **extra)]


@exports("conv2d")
def _conv2d(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    from opgraph.ops.nn import pad4

    top, bottom, left, right = pad4(attrs["padding"])
    return [ex.one("Conv", *ins, strides=list(attrs["stride"]), dilations=list(attrs["dilation"]),
                   pads=[top, left, bottom, right], group=int(attrs["groups"]))]


def _max_pool(ex: Exporter, x: str, t: TensorType, **attrs: Any) -> str:
    """MaxPool propagating NaN (see _nan_wins), the NaN-aware fix-up only when ``x`` holds a NaN.

    The plain MaxPool stays outside an ``If`` on one whole-tensor NaN test, so that ONNX Runtime keeps it in
    its blocked layout; the NaN-aware form pools the mask a second time. Measured on ResNet-18 in ONNX
    Runtime (1 thread): the fix-up in every call cost about 10% of the forward pass, this form about 5%.
    """
    if t.dtype.kind != "f":
        return ex.one("MaxPool", x, **attrs)
    if attrs.get("ceil_mode"):  # ONNX Runtime's shape inference of a ceil_mode MaxPool inside If disagrees with its
        # kernel (it preallocates the wrong output shape), so ceil_mode keeps the single NaN-aware form
        return _nan_wins(ex, x, t, ex.one("MaxPool", x, **attrs), lambda m: ex.one("MaxPool", m, **attrs))
    y = ex.one("MaxPool", x, **attrs)  # outside the If, where ONNX Runtime can keep it in its blocked layout
    any_nan = ex.one("ReduceMax", ex.one("Cast", ex.one("IsNaN", x), to=TensorProto.INT32), keepdims=0)
    cond = ex.one("Greater", any_nan, ex.const(np.int32(0)))

    def branch(build: Callable[[], str], name: str) -> onnx.GraphProto:
        outer, ex.nodes = ex.nodes, []
        try:
            out = build()
            nodes = ex.nodes
        finally:
            ex.nodes = outer
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, _elem(t.dtype), None)])

    exact = branch(lambda: _nan_wins(ex, x, t, y, lambda m: ex.one("MaxPool", m, **attrs)), ex.fresh("nan_pool"))
    plain = branch(lambda: ex.one("Identity", y), ex.fresh("pool"))
    return ex.one("If", cond, then_branch=exact, else_branch=plain)


@exports("max_pool2d", "avg_pool2d")
def _pool2d(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    from opgraph.ops.nn import pad4

    top, bottom, left, right = pad4(attrs["padding"])
    kernel = list(attrs["kernel_size"])
    is_max = ex.current_kind == "max_pool2d"
    spatial = {"kernel_shape": kernel, "strides": list(attrs["stride"] or kernel), "pads": [top, left, bottom, right]}
    if is_max:
        return [_max_pool(ex, ins[0], it[0], **spatial)]
    return [ex.one("AveragePool", ins[0], count_include_pad=int(attrs["count_include_pad"]), **spatial)]


@exports("max_pool", "avg_pool", "lp_pool")
def _pool(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    kind = ex.current_kind
    extra = _spatial(attrs, it)
    extra["ceil_mode"] = int(attrs.get("ceil_mode", False))
    if kind == "avg_pool":
        extra["count_include_pad"] = int(attrs.get("count_include_pad", False))
    if kind == "lp_pool":
        if float(attrs["p"]) != int(attrs["p"]):
            raise OnnxExportError(f"ONNX LpPool takes an integer p, not {attrs['p']}")
        extra["p"] = int(attrs["p"])
    if kind == "max_pool":
        return [_max_pool(ex, ins[0], it[0], **extra)]
    op_type = {"avg_pool": "AveragePool", "lp_pool": "LpPool"}[kind]
    return [ex.one(op_type, ins[0], **extra)]


@exports("lrn")
def _lrn(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("LRN", ins[0], size=int(attrs["size"]), alpha=float(attrs["alpha"]), beta=float(attrs["beta"]),
                   bias=float(attrs["bias"]))]


@exports("fmod")
def _fmod(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Mod", *ins, fmod=1)]


@exports("gather_elements", "scatter_elements")
def _elements(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    ins = [ins[0], _index(ex, ins[1], it[1]), *ins[2:]]
    if ex.current_kind == "gather_elements":
        return [ex.one("GatherElements", *ins, axis=int(attrs["axis"]))]
    return [ex.one("ScatterElements", *ins, axis=int(attrs["axis"]), reduction=attrs["reduction"])]


@exports("gather_nd", "scatter_nd")
def _nd(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    idx = ex.one("Cast", ins[1], to=TensorProto.INT64) if it[1].dtype != np.int64 else ins[1]
    if ex.current_kind == "gather_nd":
        return [ex.one("GatherND", ins[0], idx, batch_dims=int(attrs["batch_dims"]))]
    return [ex.one("ScatterND", ins[0], idx, ins[2], reduction=attrs["reduction"])]


@exports("topk")
def _topk(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return ex.node("TopK", [ins[0], ex.ints([attrs["k"]])], n_out=2, axis=int(attrs["axis"]),
                   largest=int(attrs["largest"]), sorted=1)


@exports("trilu")
def _trilu(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Trilu", ins[0], ex.const(np.int64(attrs["k"])), upper=int(attrs["upper"]))]


@exports("one_hot")
def _one_hot(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    idx = _index(ex, ins[0], it[0], ("int64",))
    return [ex.one("OneHot", idx, ex.const(np.int64(attrs["depth"])), ins[1], axis=int(attrs["axis"]))]


#: kinds whose every input is computed in the result's dtype: NumPy promotes mixed operands (int8 + float32,
#: int32 inputs of exp), while an ONNX op takes one type, so mixed inputs are cast first
PROMOTE_TO_RESULT = frozenset({
    "negative", "abs", "sign", "exp", "log", "sqrt", "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "floor", "ceil", "round", "trunc", "sigmoid", "erf", "erfc",
    "bitwise_invert", "positive", "copy", "relu", "square", "expm1", "log1p", "log2", "log10", "exp2",
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "floor_divide", "remainder", "fmod",
    "hypot", "logaddexp", "bitwise_and", "bitwise_or", "bitwise_xor", "clip", "fma",
    "sum", "prod", "mean", "logsumexp", "var", "std", "cumsum", "softmax", "log_softmax",
    "matmul", "einsum", "outer", "tensordot", "concat", "stack", "conv", "conv2d", "conv_transpose", "det",
})
#: kinds computing on truth values (NumPy's logical ops and any/all take any dtype: nonzero is true)
TRUTH_VALUED = frozenset({"logical_and", "logical_or", "logical_xor", "logical_not", "any", "all"})
#: comparisons: operands compared in their common dtype
COMPARISONS = frozenset({"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"})


def _operands(ex: Exporter, kind: str, ins: Names, it: Types, ot: Types) -> tuple[Names, Types]:
    """The inputs of an op cast to the dtype(s) its ONNX nodes compute in (see PROMOTE_TO_RESULT)."""
    if kind in TRUTH_VALUED:
        want = [np.dtype(np.bool_)] * len(it)
    elif kind in COMPARISONS:
        want = [np.result_type(*(t.dtype for t in it))] * len(it)
    elif kind == "where":
        want = [np.dtype(np.bool_), ot[0].dtype, ot[0].dtype]
    elif kind in PROMOTE_TO_RESULT and ot[0].dtype != np.bool_:
        want = [ot[0].dtype] * len(it)
    else:
        return ins, it
    names, types = [], []
    for x, t, w in zip(ins, it, want, strict=True):
        if t.dtype != w:
            x, t = ex.one("Cast", x, to=_elem(w)), TensorType(w, t.shape)
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
    return _decomposed(ex, kind, ins, in_types, attrs)


def _decomposed(ex: Exporter, kind: str, ins: Names, in_types: Types, attrs: AttrMap) -> Names:
    """ONNX nodes for op ``kind`` written as its decomposition (an export rule may defer to it for some dtypes)."""
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


def to_onnx(graph: Graph, *, name: str = "opgraph", opset: int = OPSET, updates: str = "refuse") -> onnx.ModelProto:
    """Write ``graph`` as an ONNX model (see the module doc).

    Inputs and outputs keep their names (unnamed ones become ``input_<id>`` /
    ``output_<i>``); shapes with unknown dimensions are written as symbolic.
    ONNX models have no state: a graph with update edges is refused, unless
    ``updates="outputs"``, which writes each update's new value as one more
    output, named after the input it updates (``w.next`` for input ``w``),
    after the graph's outputs: one call of the model is one step, and the
    caller feeds those values back.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> w = b.input(("float32", (2,)), name="w")
    >>> b.update(b.multiply(w, 0.5), w)
    >>> [o.name for o in to_onnx(b.freeze(), updates="outputs").graph.output]
    ['w.next']
    """
    if updates not in ("refuse", "outputs"):
        raise ValueError(f"updates must be 'refuse' or 'outputs', got {updates!r}")
    if len(graph.updates) and updates == "refuse":
        raise OnnxExportError("the graph has update edges (state); ONNX models have none (updates='outputs' writes "
                              "each new state value as an extra output instead: 'opgraph convert --onnx-updates "
                              "outputs' on the command line)")
    ex = Exporter(graph)
    names: dict[int, str] = {}
    used: set[str] = set()

    def unique(base: str) -> str:
        n, k = base, 1
        while n in used:
            k += 1
            n = f"{base}_{k}"
        used.add(n)
        return n

    def value_info(v: int, n: str) -> onnx.ValueInfoProto:
        t = graph.type_of(v)
        if not isinstance(t, TensorType):
            raise OnnxExportError(f"value {graph.value_label(v)} is not a tensor")
        shape = None if t.shape is None else [d if d is not None else f"d{v}_{i}" for i, d in enumerate(t.shape)]
        return helper.make_tensor_value_info(n, _elem(t.dtype), shape)

    inputs = []
    for v in graph.inputs.tolist():
        names[v] = unique(graph.name_of(v) or f"input_{v}")
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
    model.ir_version = min(model.ir_version, 10)
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


@exports("silu")
def _silu(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Mul", ins[0], ex.one("Sigmoid", ins[0]))]


@exports("hard_sigmoid")
def _hard_sigmoid(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    if it[0].dtype == np.float64:  # the node's alpha and beta are float32 attributes: float64 keeps its constants
        return _decomposed(ex, "hard_sigmoid", ins, it, attrs)
    return [ex.one("HardSigmoid", ins[0], alpha=float(attrs["alpha"]), beta=float(attrs["beta"]))]


@exports("hard_swish")
def _hard_swish(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    if it[0].dtype == np.float64:  # ONNX Runtime's HardSwish multiplies by 1/6 in float32 (measured: 5e-9 off)
        return _decomposed(ex, "hard_swish", ins, it, attrs)
    return [ex.one("HardSwish", ins[0])]


@exports("layer_norm")
def _layer_norm(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    x = it[0]
    if x.shape is None or any(d is None for d in x.shape):
        raise OnnxExportError(f"layer_norm needs a static input shape to export, got {x}")
    axis = int(attrs["axis"]) % len(x.shape)
    norm_shape = tuple(int(d) for d in x.shape[axis:])
    # LayerNormalization needs a scale; a bias given without one is not expressible, nor is either one that
    # varies along a leading axis: those are multiplied and added after the node
    scale = ins[1] if len(ins) > 1 and _trailing(it[1], axis, len(x.shape)) else None
    bias = ins[2] if len(ins) > 2 and scale is not None and _trailing(it[2], axis, len(x.shape)) else None
    node_ins = [ins[0], scale if scale is not None else ex.const(np.ones(norm_shape, x.dtype))]
    if bias is not None:
        node_ins.append(bias)
    y = ex.one("LayerNormalization", *node_ins, axis=axis, epsilon=float(attrs["epsilon"]))
    if len(ins) > 1 and scale is None:
        y = ex.one("Mul", y, ins[1])
    if len(ins) > 2 and bias is None:
        y = ex.one("Add", y, ins[2])
    return [y]


def _trailing(t: TensorType, axis: int, rank: int) -> bool:
    """True when a scale or bias of type ``t`` varies only along the normalised axes ``axis`` .. ``rank - 1``."""
    shape = t.shape or ()
    return all(d == 1 for d in shape[:max(len(shape) - (rank - axis), 0)])


# ---------------------------------------------------------------- control flow
_BOOL = TensorType(np.bool_, ())
_I64 = TensorType(np.int64, ())


def _pred(ex: Exporter, name: str, t: TensorType) -> str:
    """A one-element predicate (nonzero is true) as the bool scalar ONNX's If and Loop take."""
    if t.dtype != np.bool_:
        name = ex.one("Cast", name, to=TensorProto.BOOL)
    return name if t.shape == () else ex.one("Reshape", name, ex.ints([]))


@exports("call", table=BODY_RULES)
def _call(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return ex.inline(attrs["body"], ins)  # the body's nodes in place (ONNX functions take no outer tensors)


@exports("cond", table=BODY_RULES)
def _cond(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    # ONNX branches take no inputs: the operands are outer-scope names inside them
    branches = {key: ex.body(attrs[f"{which}_body"], list(ins[1:]), ex.fresh(which))
                for key, which in (("then_branch", "then"), ("else_branch", "else"))}
    return ex.node("If", [_pred(ex, ins[0], it[0])], n_out=len(ot), **branches)


@exports("while_loop", table=BODY_RULES)
def _while_loop(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    nc = int(attrs["num_consts"])
    consts, init = list(ins[:nc]), list(ins[nc:])
    test: Subgraph = attrs["cond_body"]
    pred_type = cast(TensorType, test.out_types[0])

    def going(sub: Exporter, formals: Names, results: Names) -> list[tuple[str, TensorType]]:
        # ONNX's Loop tests the condition the body returns: the cond body on the new carry
        return [(_pred(sub, sub.inline(test, [*consts, *results[:len(init)]])[0], pred_type), _BOOL)]

    body = ex.body(attrs["body"], [*consts, *[None] * len(init)], ex.fresh("loop"), lead=[_I64, _BOOL], head=going)
    first = _pred(ex, ex.inline(test, list(ins))[0], pred_type)
    trips = "" if attrs["max_trip"] is None else ex.const(np.int64(attrs["max_trip"]))
    return ex.node("Loop", [trips, first, *init], n_out=len(ot), body=body)


@exports("scan", table=BODY_RULES)
def _scan(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    nc, ncarry = int(attrs["num_consts"]), int(attrs["num_carry"])
    consts, carry, xs = list(ins[:nc]), list(ins[nc:nc + ncarry]), list(ins[nc + ncarry:])
    body: Subgraph = attrs["body"]
    ny = body.num_outputs - ncarry
    reverse = bool(attrs["reverse"])
    args: list[str | None] = [*consts, *[None] * (ncarry + len(xs))]
    if xs:  # ONNX's Scan: a reverse scan reads its inputs and writes its outputs from the end
        g = ex.body(body, args, ex.fresh("scan"))
        dirs = {"scan_input_directions": [1] * len(xs), "scan_output_directions": [1] * ny} if reverse else {}
        return ex.node("Scan", [*carry, *xs], n_out=len(ot), body=g, num_scan_inputs=len(xs), **dirs)
    # no xs (ONNX's Scan needs one to know its length): a Loop of `length` trips, its scan outputs flipped if reverse
    g = ex.body(body, args, ex.fresh("scan"), lead=[_I64, _BOOL],
                head=lambda sub, formals, results: [(formals[1], _BOOL)])
    outs = ex.node("Loop", [ex.const(np.int64(attrs["length"])), "", *carry], n_out=len(ot), body=g)
    if reverse:
        outs[ncarry:] = [ex.one("Slice", y, ex.ints([-1]), ex.ints([np.iinfo(np.int64).min]), ex.ints([0]),
                                ex.ints([-1])) for y in outs[ncarry:]]
    return outs
