"""ONNX -> opgraph translators: control flow (If, Loop, Scan), sequences, optionals, Dropout.

Control flow becomes opgraph's control-flow ops (:mod:`opgraph.ops.control`),
not unrolled: each ONNX subgraph attribute is translated, by the same
importer, into a body (:class:`~opgraph.core.subgraph.Subgraph`), and every
value of the enclosing graph that a body uses (ONNX bodies see the outer
scope) becomes an explicit operand and body parameter; known values of up to
:data:`COPY_LIMIT` bytes are copied into the body as constants instead, so
shape computations there still fold.

* ``If`` -> ``cond(cond, *captures, then_body, else_body)``. A condition
  known while importing (a constant) picks its branch, which is inlined: that
  is constant folding, as for any op whose deciding inputs are known. When
  the branches' results differ in shape, and the condition is derived from
  inputs given in ``static_inputs``, the import is specialised on it the same
  way (the cond's results would have unknown dims otherwise).
* ``Loop(M, cond, v...)`` -> ``scan`` with ``length=M`` when ``M`` is known
  and the loop has no condition (or one that stays constant true): a for
  loop, which autodiff can differentiate; otherwise -> ``while_loop``
  carrying ``(iteration, cond, v...)`` whose cond body tests
  ``cond and iteration < M`` (a known ``M`` is its ``max_trip``); both stack
  the scan outputs (a while_loop's along a leading axis of run-time length).
  Trip counts and conditions may be graph inputs or computed in the body.
* ``Scan`` (opset 9+) -> ``scan``, with ``moveaxis`` for non-zero scan axes
  and ``flip`` for the directions that differ from the scan's own; Scan-8
  (a leading batch axis) -> a ``scan`` over the batch whose body is the
  ``scan`` over time.

Resolved while importing instead (unrolled, or inlined with ``where``), as
before: control flow that carries or returns ONNX sequences or optionals
(they are Python lists here, not tensors), and bodies that need a value
while they are built that only the run knows (a shape argument computed from
the iteration number; a ``Slice`` whose bounds come from it is the run-time
``slice`` op instead, so ONNX's test_loop11 is one ``while_loop``). That
needs the trip count and conditions known while importing (``static_inputs``).

ONNX sequences are Python lists of values
(:class:`~opgraph.io.onnx._core.Seq`) and optionals are
:class:`~opgraph.io.onnx._core.Opt`, so every sequence op is resolved while
importing; only the tensors inside them reach the graph.

    >>> import numpy as np
    >>> from onnx import TensorProto, helper
    >>> from opgraph.io.onnx import backend, from_onnx
    >>> body = helper.make_graph(
    ...     [helper.make_node("Identity", ["c_in"], ["c_out"]),
    ...      helper.make_node("Add", ["s_in", "x"], ["s_out"])], "body",
    ...     [helper.make_tensor_value_info("i", TensorProto.INT64, []),
    ...      helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
    ...      helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2])],
    ...     [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
    ...      helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2])])
    >>> loop = helper.make_node("Loop", ["n", "", "s0"], ["s"], body=body)
    >>> graph = helper.make_graph([loop], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
    ...      helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2]),
    ...      helper.make_tensor_value_info("n", TensorProto.INT64, [])],
    ...     [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2])])
    >>> g = from_onnx(helper.make_model(graph))
    >>> [op.kind for op in g.ops() if op.kind != "const"]
    ['while_loop']
    >>> feeds = {"x": np.array([1, 2], np.float32), "s0": np.zeros(2, np.float32)}
    >>> g.run({**feeds, "n": np.int64(3)})[0], g.run({**feeds, "n": np.int64(5)})[0]
    (array([3., 6.], dtype=float32), array([ 5., 10.], dtype=float32))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Value
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType
from opgraph.errors import GraphError
from opgraph.io.onnx._core import (
    Importer,
    Node,
    OnnxImportError,
    Opt,
    Scope,
    Seq,
    np_dtype,
    tensor_to_array,
    translates,
)

#: A Loop resolved while importing (see the module doc) with no trip count stops when its condition turns false;
#: past this many iterations it is an error (an unrolled loop that long would be a graph nobody wants).
MAX_UNROLL = 100_000

#: Known values of the enclosing graph up to this many bytes are copied into a body as constants (its shape
#: computations fold on them); larger ones (weights) are passed in as operands, stored once.
COPY_LIMIT = 4096


# ---------------------------------------------------------------- helpers
def _scope(node: Node) -> Scope:
    """The scope the node's subgraphs see (its own scope; the model's for nodes built by hand)."""
    return node.scope if node.scope is not None else node.imp.scope


def _must_know(node: Node, v: Any, what: str, why: str) -> np.ndarray:
    """The value of ``v`` while importing; an error naming ``what`` and ``why`` when it is not known.

    A value computed from graph inputs given in ``static_inputs`` raises
    ``NeedStatic`` instead, so the import restarts with them as constants.
    """
    if v is None:
        raise node.error(f"{what} is missing")
    arr = node.imp.static_value(v) if isinstance(v, Value) else None
    if arr is None:
        raise node.error(f"{what} must be known when the graph is built ({why}); make it an initializer "
                         "or a Constant, or pass the graph inputs it depends on in static_inputs=")
    return np.asarray(arr)


def _scalar(arr: np.ndarray, node: Node, what: str) -> Any:
    if arr.size != 1:
        raise node.error(f"{what} must have one element, it has shape {arr.shape}")
    return arr.reshape(-1)[0].item()


def _seq(node: Node, v: Any, what: str = "input 0") -> Seq:
    if not isinstance(v, Seq):
        raise node.error(f"{what} must be a sequence, it is {_describe(v)}")
    return v


def _describe(v: Any) -> str:
    if isinstance(v, Seq):
        return f"a sequence of {len(v.items)}"
    if isinstance(v, Opt):
        return "an empty optional" if v.value is None else f"an optional of {_describe(v.value)}"
    if isinstance(v, Value):
        return f"a tensor {v.type}"
    return repr(v)


def _position(node: Node, index: int, n: int, default: int | None, *, inserting: bool = False) -> int:
    """A sequence position input resolved against a sequence of length ``n`` (ONNX's range check)."""
    v = node.inputs[index] if index < len(node.inputs) else None
    if v is None:
        if default is None:
            raise node.error("the position input is missing")
        pos = default
    else:
        pos = int(_scalar(_must_know(node, v, "the position", "sequences are lists resolved while importing"),
                          node, "the position"))
    hi = n if inserting else n - 1
    if not -n <= pos <= hi:
        raise node.error(f"position {pos} is out of range for a sequence of length {n}")
    return pos + n if pos < 0 else pos


def _elem_dtype(items: Sequence[Any], fallback: np.dtype | None) -> np.dtype | None:
    for x in items:
        if isinstance(x, Value):
            return x.type.dtype  # type: ignore[union-attr]
    return fallback


def _declared_array(g: onnx.GraphProto, index: int, what: str) -> tuple[np.dtype, tuple[int, ...]] | None:
    """The dtype and static shape a subgraph declares for output ``index`` (None if not fully static)."""
    t = g.output[index].type
    if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    dims = t.tensor_type.shape.dim
    if any(not d.HasField("dim_value") for d in dims):
        return None
    return np_dtype(t.tensor_type.elem_type, what), tuple(int(d.dim_value) for d in dims)


def _stack(node: Node, items: list[Any], axis: int, g: onnx.GraphProto, out_index: int, what: str) -> Any:
    """Per-iteration values stacked along a new ``axis`` (a Loop's or Scan's scan output)."""
    if not items:
        # no iteration ran: the element type can only come from the body's declaration
        decl = _declared_array(g, out_index, what)
        if decl is None:
            raise node.error(f"{what}: no iteration ran and the body does not declare a static shape for it, "
                             "so its shape is unknown")
        dt, shape = decl
        shape = list(shape)
        shape.insert(axis % (len(shape) + 1), 0)
        return node.const(np.zeros(tuple(shape), dt))
    for x in items:
        if not isinstance(x, Value):
            raise node.error(f"{what} must be a tensor in each iteration, it is {_describe(x)}")
    shapes = {node.shape(x) for x in items}
    if len(shapes) != 1:
        raise node.error(f"{what} changes shape between iterations ({sorted(shapes)}); it cannot be stacked")
    return node.op("stack", *items, axis=axis % (node.rank(items[0]) + 1))


# ---------------------------------------------------------------- bodies
class _Resolve(Exception):
    """Internal: this control flow cannot be an opgraph op; resolve it while importing (the reason is the text)."""


class _BodyScope(Scope):
    """The names a body sees: its own, then the enclosing scope's, each made a value of the body on first use.

    A value of the enclosing graph becomes a body parameter (a capture: the
    op passes the value in) or, when it is known and small, a constant of the
    body. Sequences and optionals are adopted element by element.
    """

    def __init__(self, imp: Importer, outer: Scope) -> None:
        super().__init__({}, None)
        self.imp = imp
        self.outer = outer
        #: the enclosing graph's values passed in, and the body parameters standing for them, in order
        self.captures: list[Value] = []
        self.params: list[Value] = []
        self._adopted: dict[int, Any] = {}

    def lookup(self, name: str) -> Any:
        if name in self.names:
            return self.names[name]
        mine = self.adopt(self.outer.lookup(name), name)
        self.names[name] = mine
        return mine

    def adopt(self, v: Any, name: str | None = None) -> Any:
        """The body's value for a value (tensor, sequence, optional) of the enclosing graph."""
        if isinstance(v, Seq):
            return Seq([self.adopt(x) for x in v.items], v.elem_dtype)
        if isinstance(v, Opt):
            return Opt(None if v.value is None else self.adopt(v.value), v.elem_type)
        if not isinstance(v, Value):
            return v
        got = self._adopted.get(v.id)
        if got is not None:
            return got
        arr = self.imp.parent.known_value(v) if self.imp.parent is not None else None
        mine = self.imp.const(arr) if arr is not None and arr.nbytes <= COPY_LIMIT else self.param_for(v, name)
        self._adopted[v.id] = mine
        return mine

    def param_for(self, v: Value, name: str | None = None) -> Value:
        """The body parameter standing for ``v`` (made, unused so far, when the body has none)."""
        for outer, p in zip(self.captures, self.params, strict=True):
            if outer.id == v.id:
                return p
        p = self.imp.b.input(v.type)
        if name:
            try:
                self.imp.b.name(p, name)
            except GraphError:  # the body's own parameter has this name
                pass
        self.imp.captured[p.id] = v
        self.captures.append(v)
        self.params.append(p)
        self._adopted[v.id] = p
        return p


@dataclass
class _Body:
    """An ONNX subgraph translated into a body builder (not frozen yet)."""

    imp: Importer
    scope: _BodyScope
    #: the body's values for the ONNX subgraph's inputs, in order (parameters, or constants where bound to one)
    formals: list[Value]
    #: the body's values for the subgraph's outputs
    outs: list[Any]
    name: str

    def tensors(self, what: str) -> list[Value]:
        for i, v in enumerate(self.outs):
            if not isinstance(v, Value):
                raise _Resolve(f"{what} output {i} is {_describe(v)}, not a tensor")
        return self.outs

    def freeze(self, params: Sequence[Value], outs: Sequence[Value], name: str | None = None) -> Subgraph:
        """The body as a Subgraph taking ``params`` (every parameter of the builder, in the op's order)."""
        from opgraph.passes import dce

        b = self.imp.b
        for v in outs:
            b.output(v)
        g = b.freeze()
        order = [p.id for p in params]
        if sorted(order) != sorted(g.inputs.tolist()):  # cannot happen unless a caller forgets a parameter
            raise OnnxImportError(f"body {self.name!r}: parameters {order} do not match {g.inputs.tolist()}")
        g = g.replace(inputs=np.asarray(order, dtype=g.inputs.dtype))
        return Subgraph(dce(g).graph, name=name or self.name)


def _translate_body(node: Node, attr: str, formals: Sequence[Any]) -> _Body:
    """Translate the graph attribute ``attr`` into a new body builder.

    ``formals`` gives each of the subgraph's inputs: a type (it becomes a
    parameter) or an array (a constant of the body).
    """
    g: onnx.GraphProto = node.attr(attr)
    if len(g.input) != len(formals):
        raise node.error(f"its {attr} takes {len(g.input)} inputs, {node.op_type} passes {len(formals)}")
    sub = node.imp.child()
    scope = _BodyScope(sub, _scope(node))
    sub.scope = scope
    values = []
    for vi, f in zip(g.input, formals, strict=True):
        if isinstance(f, np.ndarray):
            v = sub.const(f)
        else:
            v = sub.b.input(f)
            try:
                sub.b.name(v, vi.name)
            except GraphError:
                pass
        scope.names[vi.name] = v
        values.append(v)
    for init in g.initializer:
        scope.names[init.name] = sub.const(tensor_to_array(init, f"initializer {init.name!r}"))
    sub.translate_nodes(g.node, scope, node.opsets)
    try:
        outs = [scope.lookup(o.name) for o in g.output]
    except KeyError as exc:
        raise node.error(f"{attr} {g.name!r}: output {exc.args[0]!r} is never computed") from None
    return _Body(sub, scope, values, outs, g.name or attr)


def _results(r: Any) -> list[Any]:
    return list(r) if isinstance(r, (tuple, list)) else [r]


def _flag(imp: Importer, v: Value) -> Value:
    """A one-element condition as a bool scalar."""
    if v.type.dtype != np.bool_:  # type: ignore[union-attr]
        v = imp.op("cast", v, dtype="bool")
    if v.type.shape != ():  # type: ignore[union-attr]
        v = imp.op("reshape", v, shape=())
    return v


def _is_true(imp: Importer, v: Value) -> bool:
    arr = imp.known_value(v)
    return arr is not None and arr.size == 1 and bool(arr.reshape(-1)[0])


def _fallback(node: Node, what: str, first: Exception, resolve: Any) -> Any:
    """Resolve control flow while importing (``resolve()``) after it could not be an op (``first`` says why)."""
    try:
        return resolve()
    except OnnxImportError as exc:
        raise OnnxImportError(f"{exc} (it is resolved while importing because it cannot be a {what} op: {first})") \
            from exc


# ---------------------------------------------------------------- If
class _Unmergeable(Exception):
    """Internal: the branches of an If with an unknown condition cannot be joined with ``where``."""


@translates("If")
def _if(node: Node, cond: Any) -> Any:
    known = node.known(cond)
    if known is not None:  # constant folding: the branch the condition picks
        return _branch(node, known)
    try:
        return _if_as_cond(node, cond)
    except (_Resolve, OnnxImportError) as exc:
        return _fallback(node, "cond", exc, lambda: _if_resolved(node, cond))


def _branch(node: Node, cond: np.ndarray) -> list[Any]:
    taken = "then_branch" if bool(_scalar(np.asarray(cond), node, "the condition")) else "else_branch"
    return node.subgraph(taken, [], _scope(node))


def _if_as_cond(node: Node, cond: Value) -> list[Any]:
    then = _translate_body(node, "then_branch", [])
    other = _translate_body(node, "else_branch", [])
    t_outs, e_outs = then.tensors("then_branch"), other.tensors("else_branch")
    if len(t_outs) != len(e_outs):
        raise _Resolve(f"the branches produce {len(t_outs)} and {len(e_outs)} outputs")
    static = True
    for i, (a, b) in enumerate(zip(t_outs, e_outs, strict=True)):
        ta, tb = a.type, b.type
        if ta.dtype != tb.dtype or len(ta.shape) != len(tb.shape):  # type: ignore[union-attr,arg-type]
            raise _Resolve(f"output {i} is {ta} in one branch and {tb} in the other")
        static = static and ta == tb
    if not static:
        arr = node.imp.static_value(cond)  # from static inputs: specialise (NeedStatic) rather than lose shapes
        if arr is not None:
            return _branch(node, arr)
    operands = list(then.scope.captures)
    seen = {v.id for v in operands}
    operands += [v for v in other.scope.captures if v.id not in seen]
    bodies = [br.freeze([br.scope.param_for(v) for v in operands], br.outs, name)
              for br, name in ((then, then.name), (other, other.name))]
    return _results(node.op("cond", cond, *operands, then_body=bodies[0], else_body=bodies[1]))


def _if_resolved(node: Node, cond: Any) -> Any:
    """Both branches inlined and joined with ``where`` (or the taken one, when the condition is static)."""
    scope = _scope(node)
    try:
        then = node.subgraph("then_branch", [], scope)
        other = node.subgraph("else_branch", [], scope)
        if len(then) != len(other):
            raise _Unmergeable(f"the branches produce {len(then)} and {len(other)} outputs")
        c = node.op("reshape", cond, shape=()) if node.shape(cond) != () else cond
        return [_select(node, c, a, b, f"output {i}") for i, (a, b) in enumerate(zip(then, other, strict=True))]
    except (_Unmergeable, OnnxImportError) as exc:
        # both branches cannot become one graph: the condition itself must be known (from static inputs)
        arr = node.imp.static_value(cond)
        if arr is None:
            raise node.error(f"the condition is not known when the graph is built and the branches cannot be "
                             f"joined with where ({exc}); pass the inputs the condition depends on in "
                             "static_inputs=") from None
        return _branch(node, arr)


def _select(node: Node, cond: Value, a: Any, b: Any, what: str) -> Any:
    """``a`` where ``cond`` else ``b``, for tensors, sequences and optionals of matching structure."""
    if a is b or (isinstance(a, Value) and isinstance(b, Value) and a.id == b.id):
        return a
    if isinstance(a, Value) and isinstance(b, Value):
        if node.dtype(a) != node.dtype(b) or node.shape(a) != node.shape(b):
            raise _Unmergeable(f"{what} is {a.type} in one branch and {b.type} in the other")
        return node.op("where", cond, a, b)
    if isinstance(a, Seq) and isinstance(b, Seq):
        if len(a.items) != len(b.items):
            raise _Unmergeable(f"{what} is a sequence of {len(a.items)} in one branch and of {len(b.items)} "
                               "in the other")
        items = [_select(node, cond, x, y, f"{what}[{i}]") for i, (x, y) in enumerate(zip(a.items, b.items,
                                                                                         strict=True))]
        return Seq(items, a.elem_dtype or b.elem_dtype)
    if isinstance(a, Opt) and isinstance(b, Opt):
        if a.value is None and b.value is None:
            return a
        if a.value is None or b.value is None:
            raise _Unmergeable(f"{what} is an empty optional in one branch only")
        return Opt(_select(node, cond, a.value, b.value, what), a.elem_type or b.elem_type)
    raise _Unmergeable(f"{what} is {_describe(a)} in one branch and {_describe(b)} in the other")




# ---------------------------------------------------------------- Loop
_I64 = TensorType(np.int64, ())
_BOOL = TensorType(np.bool_, ())


@translates("Loop")
def _loop(node: Node, trip: Any = None, cond: Any = None, *initial: Any) -> Any:
    body: onnx.GraphProto = node.attr("body")
    n_carried = len(initial)
    if len(body.output) < 1 + n_carried or len(body.input) != 2 + n_carried:
        raise node.error(f"the body has {len(body.input)} inputs and {len(body.output)} outputs; with {n_carried} "
                         f"loop-carried values it needs {2 + n_carried} inputs and at least {1 + n_carried} outputs")
    if trip is None and cond is None:
        raise node.error("has neither a trip count nor a condition: it never stops")
    try:
        return _loop_as_op(node, trip, cond, list(initial))
    except (_Resolve, OnnxImportError) as exc:
        return _fallback(node, "while_loop or scan", exc, lambda: _loop_resolved(node, trip, cond, *initial))


def _loop_as_op(node: Node, trip: Any, cond: Any, initial: list[Any]) -> list[Any]:
    for i, v in enumerate(initial):
        if not isinstance(v, Value):
            raise _Resolve(f"loop-carried value {i} is {_describe(v)}, not a tensor")
    n = len(initial)
    m_known = None if trip is None else node.known(trip)
    trips = None if m_known is None else max(int(_scalar(m_known, node, "the trip count M")), 0)
    body: onnx.GraphProto = node.attr("body")
    counted = body.input[0].name in _names_used(body)  # does the body read the iteration number?
    formals: list[Any] = [_I64 if counted else np.asarray(0, np.int64),
                          np.asarray(True) if cond is None else _BOOL, *(v.type for v in initial)]
    bd = _translate_body(node, "body", formals)
    outs = bd.tensors("the body's")
    imp = bd.imp
    carried_in, carried_out, scans = bd.formals[2:], outs[1:1 + n], outs[1 + n:]
    init: list[Any] = []
    params: list[Value] = []
    step: list[Value] = []
    going = None if cond is None else _flag(imp, outs[0])
    if cond is not None:
        init.append(_flag(node.imp, cond))
        params.append(bd.formals[1])
        step.append(going)
    for_loop = trips is not None and (cond is None or (_is_true(node.imp, init[0]) and _is_true(imp, going)))
    # the iteration number is carried when the body reads it or the cond body compares it with a run-time M
    counter = counted or (not for_loop and trip is not None and trips is None)
    if counter:
        it = bd.formals[0] if counted else imp.b.input(_I64)
        init.insert(0, node.const(np.int64(0)))
        params.insert(0, it)
        step.insert(0, imp.op("add", it, imp.const(np.int64(1))))
    captures = list(bd.scope.captures)
    if for_loop:  # a scan of known length: differentiable, and its results have static shapes
        sub = bd.freeze([*bd.scope.params, *params, *carried_in], [*step, *carried_out, *scans])
        res = _results(node.op("scan", *captures, *init, *initial, body=sub, num_consts=len(captures),
                               num_carry=len(init) + n, length=trips))
        return res[len(init):]
    # a while loop over (iteration, cond, values): the cond body tests cond and iteration < M
    consts, lead = captures, list(bd.scope.params)
    if trip is not None and trips is None:
        lead.append(imp.b.input(_I64))
        consts = [*captures, _trip_scalar(node, trip)]
    sub = bd.freeze([*lead, *params, *carried_in], [*step, *carried_out, *scans])
    test = _loop_test([v.type for v in consts], [v.type for v in (*init, *initial)], counter=counter,
                      has_m=trip is not None and trips is None,
                      has_cond=cond is not None, name=bd.name)
    res = _results(node.op("while_loop", *consts, *init, *initial, cond_body=test, body=sub,
                           num_consts=len(consts), max_trip=trips))
    return res[len(init):]


def _names_used(g: onnx.GraphProto) -> set[str]:
    """The value names the nodes of ``g`` and of its subgraphs read, and its outputs."""
    used = {o.name for o in g.output}
    for node in g.node:
        used.update(node.input)
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                        list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                used |= _names_used(sub)
    return used


def _trip_scalar(node: Node, trip: Value) -> Value:
    """The trip count M as an int64 scalar."""
    if node.dtype(trip) != np.int64:
        trip = node.op("cast", trip, dtype="int64")
    return node.op("reshape", trip, shape=()) if node.shape(trip) != () else trip


def _loop_test(const_types: list[Any], carry_types: list[Any], *, counter: bool, has_m: bool, has_cond: bool,
               name: str) -> Subgraph:
    """The cond body of a Loop's while_loop: ``cond and iteration < M`` (the parts the Loop has).

    Its carry starts with the iteration number (if ``counter``), then the condition (if ``has_cond``).
    """
    b = GraphBuilder()
    consts = [b.input(t) for t in const_types]
    carry = [b.input(t) for t in carry_types]
    tests = []
    if has_m:
        tests.append(b.op("less", carry[0], consts[-1]))
    if has_cond:
        tests.append(carry[1 if counter else 0])
    b.output(tests[0] if len(tests) == 1 else b.op("logical_and", *tests))
    return Subgraph(b.freeze(), name=f"{name}.cond")


def _loop_resolved(node: Node, trip: Any, cond: Any, *initial: Any) -> Any:
    """The Loop unrolled while importing (its trip count and conditions must be known then)."""
    body: onnx.GraphProto = node.attr("body")
    scope = _scope(node)
    n_carried = len(initial)
    why = "a Loop that cannot be an op is unrolled"
    max_trip = None if trip is None else int(_scalar(_must_know(node, trip, "the trip count M", why), node, "M"))
    going = True if cond is None else bool(_scalar(_must_know(node, cond, "the initial condition", why), node,
                                                   "the condition"))
    iter_dtype = np.dtype(np.int64)
    state = list(initial)
    scans: list[list[Any]] = [[] for _ in range(len(body.output) - 1 - n_carried)]
    i = 0
    while going and (max_trip is None or i < max_trip):
        if i >= MAX_UNROLL:
            raise node.error(f"runs more than {MAX_UNROLL} iterations, too many to unroll")
        outs = node.subgraph("body", [node.const(np.asarray(i, iter_dtype)), node.const(np.asarray(going)),
                                      *state], scope)
        if cond is not None:
            # without a condition input ONNX ignores the body's condition (a plain for loop)
            going = bool(_scalar(_must_know(node, outs[0], f"the condition computed by iteration {i}", why),
                                 node, "the condition"))
        state = list(outs[1:1 + n_carried])
        for k, v in enumerate(outs[1 + n_carried:]):
            scans[k].append(v)
        i += 1
    stacked = [_stack(node, items, 0, body, 1 + n_carried + k, f"scan output {k}") for k, items in enumerate(scans)]
    return [*state, *stacked]


# ---------------------------------------------------------------- Scan
@translates("Scan")
def _scan(node: Node, *inputs: Any) -> Any:
    try:
        if node.opset < 9:
            return _scan8_as_op(node, inputs[0] if inputs else None, list(inputs[1:]))
        return _scan_as_op(node, list(inputs))
    except (_Resolve, OnnxImportError) as exc:
        if node.opset < 9:
            return _fallback(node, "scan", exc, lambda: _scan8(node, inputs[0] if inputs else None, list(inputs[1:])))
        return _fallback(node, "scan", exc, lambda: _scan_unbatched(node, list(inputs)))


def _scan_layout(node: Node, inputs: list[Any]) -> tuple[int, list[int], list[int], list[int], list[int], int]:
    """``(n_states, in_axes, in_dirs, out_axes, out_dirs, steps)`` of a Scan (opset 9+), checked."""
    body: onnx.GraphProto = node.attr("body")
    m = int(node.attr("num_scan_inputs"))
    n = len(inputs) - m
    if n < 0:
        raise node.error(f"has {len(inputs)} inputs, fewer than num_scan_inputs={m}")
    k = len(body.output) - n
    xs = inputs[n:]
    in_axes = list(node.attr("scan_input_axes", (0,) * m))
    in_dirs = list(node.attr("scan_input_directions", (0,) * m))
    out_axes = list(node.attr("scan_output_axes", (0,) * k))
    out_dirs = list(node.attr("scan_output_directions", (0,) * k))
    if len(in_axes) != m or len(in_dirs) != m or len(out_axes) != k or len(out_dirs) != k:
        raise node.error("scan_input_axes/directions need one entry per scan input and "
                         "scan_output_axes/directions one per scan output")
    lengths = set()
    for j, x in enumerate(xs):
        r = node.rank(x)
        if not -r <= in_axes[j] < r:
            raise node.error(f"scan_input_axes[{j}]={in_axes[j]} is out of range for rank {r}")
        in_axes[j] %= r
        lengths.add(node.shape(x)[in_axes[j]])
    if len(lengths) > 1:
        raise node.error(f"the scan inputs have different sequence lengths {sorted(lengths)}")
    return n, in_axes, in_dirs, out_axes, out_dirs, lengths.pop() if lengths else 0


def _scan_as_op(node: Node, inputs: list[Any]) -> list[Any]:
    n, in_axes, in_dirs, out_axes, out_dirs, steps = _scan_layout(node, inputs)
    states, xs = inputs[:n], inputs[n:]
    for i, v in enumerate(inputs):
        if not isinstance(v, Value):
            raise _Resolve(f"input {i} is {_describe(v)}, not a tensor")
    if not xs:
        raise node.error("has no scan inputs (num_scan_inputs=0): its sequence length is unknown")
    slices = [TensorType(x.type.dtype, tuple(d for a, d in enumerate(node.shape(x)) if a != ax))
              for x, ax in zip(xs, in_axes, strict=True)]
    bd = _translate_body(node, "body", [*(s.type for s in states), *slices])
    outs = bd.tensors("the body's")
    if len(outs) != len(out_axes) + n:
        raise node.error(f"the body returns {len(outs)} values, fewer than its {n} states")
    reverse = all(d == 1 for d in in_dirs)
    xs = [_flip(node, node.op("moveaxis", x, source=ax, destination=0) if ax else x, d != reverse)
          for x, ax, d in zip(xs, in_axes, in_dirs, strict=True)]
    sub = bd.freeze([*bd.scope.params, *bd.formals], outs)
    captures = bd.scope.captures
    res = _results(node.op("scan", *captures, *states, *xs, body=sub, num_consts=len(captures), num_carry=n,
                           length=steps, reverse=reverse))
    results = res[:n]
    for j, (y, ax, d) in enumerate(zip(res[n:], out_axes, out_dirs, strict=True)):
        r = node.rank(y)
        if not -r <= ax < r:
            raise node.error(f"scan_output_axes[{j}]={ax} is out of range for rank {r}")
        y = _flip(node, y, d != reverse)
        results.append(node.op("moveaxis", y, source=0, destination=ax % r) if ax % r else y)
    return results


def _flip(node: Node, x: Value, flip: bool) -> Value:
    return node.op("flip", x, axis=(0,)) if flip else x


def _scan8_as_op(node: Node, seq_lens: Any, inputs: list[Any]) -> list[Any]:
    # Scan-8 has a leading batch axis on every input and output: a scan over the batch whose body scans over time
    m = int(node.attr("num_scan_inputs"))
    n = len(inputs) - m
    states, xs = inputs[:n], inputs[n:]
    for i, v in enumerate(inputs):
        if not isinstance(v, Value):
            raise _Resolve(f"input {i} is {_describe(v)}, not a tensor")
    dirs = list(node.attr("directions", (0,) * m))
    if not xs or len(dirs) != m:
        raise node.error("has no scan inputs" if not xs else "directions needs one entry per scan input")
    batch, steps = node.shape(xs[0])[:2]
    if any(node.shape(x)[:2] != (batch, steps) for x in xs) or any(node.shape(s)[:1] != (batch,) for s in states):
        raise node.error("the inputs must share their batch size, and the scan inputs their sequence length")
    if seq_lens is not None:
        lens = _must_know(node, seq_lens, "sequence_lens", "opgraph's scans have one length")
        if np.any(lens.reshape(-1) != steps):
            raise node.error(f"sequence_lens {lens.tolist()} differ from the sequence length {steps}; opgraph "
                             "supports only full-length sequences")
    per = [TensorType(v.type.dtype, node.shape(v)[1:]) for v in states]
    slices = [TensorType(x.type.dtype, node.shape(x)[2:]) for x in xs]
    bd = _translate_body(node, "body", [*per, *slices])
    outs = bd.tensors("the body's")
    inner = bd.freeze([*bd.scope.params, *bd.formals], outs)
    captures = bd.scope.captures
    reverse = all(d == 1 for d in dirs)
    ob = GraphBuilder()
    cp = [ob.input(c.type) for c in captures]
    sp = [ob.input(t) for t in per]
    xp = [ob.input(TensorType(x.type.dtype, node.shape(x)[1:])) for x in xs]
    xp = [ob.op("flip", x, axis=(0,)) if d != reverse else x for x, d in zip(xp, dirs, strict=True)]
    res = _results(ob.op("scan", *cp, *sp, *xp, body=inner, num_consts=len(cp), num_carry=n, length=steps,
                         reverse=reverse))
    ob.output(*res[:n], *(ob.op("flip", y, axis=(0,)) if reverse else y for y in res[n:]))
    outer = Subgraph(ob.freeze(), name=f"{bd.name}.batch")
    return _results(node.op("scan", *captures, *states, *xs, body=outer, num_consts=len(captures), num_carry=0,
                            length=batch))


# scans resolved while importing (bodies that cannot be ops; see the module doc)
def _scan_unbatched(node: Node, inputs: list[Any]) -> list[Any]:
    n, in_axes, in_dirs, out_axes, out_dirs, steps = _scan_layout(node, inputs)
    return _unroll_scan(node, node.attr("body"), inputs[:n], inputs[n:], steps, in_axes, in_dirs, out_axes, out_dirs)


def _unroll_scan(node: Node, body: onnx.GraphProto, states: list[Any], xs: list[Any], steps: int,
                 in_axes: list[int], in_dirs: list[int], out_axes: list[int], out_dirs: list[int]) -> list[Any]:
    scope = _scope(node)
    n = len(states)
    scans: list[list[Any]] = [[] for _ in out_axes]
    for t in range(steps):
        elems = []
        for x, axis, d in zip(xs, in_axes, in_dirs, strict=True):
            at = steps - 1 - t if d else t
            elems.append(node.op("getitem", x, index=(slice(None),) * axis + (at,)))
        outs = node.subgraph("body", [*states, *elems], scope)
        states = list(outs[:n])
        for j, v in enumerate(outs[n:]):
            scans[j].append(v)
    results = list(states)
    for j, items in enumerate(scans):
        if out_dirs[j]:
            items = items[::-1]  # a reverse scan output puts the first iteration's value last
        rank = node.rank(items[0]) + 1 if items else None
        axis = out_axes[j]
        if rank is not None and not -rank <= axis < rank:
            raise node.error(f"scan_output_axes[{j}]={axis} is out of range for rank {rank}")
        results.append(_stack(node, items, axis, body, n + j, f"scan output {j}"))
    return results


def _scan8(node: Node, seq_lens: Any, inputs: list[Any]) -> list[Any]:
    # Scan-8 has a leading batch axis on every input and output: unroll each batch entry separately.
    body: onnx.GraphProto = node.attr("body")
    m = int(node.attr("num_scan_inputs"))
    n = len(inputs) - m
    k = len(body.output) - n
    states, xs = inputs[:n], inputs[n:]
    dirs = list(node.attr("directions", (0,) * m))
    if not xs:
        raise node.error("has no scan inputs")
    batch, steps = node.shape(xs[0])[:2]
    if any(node.shape(x)[:2] != (batch, steps) for x in xs):
        raise node.error("the scan inputs must share their batch and sequence sizes")
    if seq_lens is not None:
        lens = _must_know(node, seq_lens, "sequence_lens", "opgraph unrolls Scan")
        if np.any(lens.reshape(-1) != steps):
            raise node.error(f"sequence_lens {lens.tolist()} differ from the sequence length {steps}; opgraph "
                             "supports only full-length sequences")
    per_batch = []
    for b in range(batch):
        st = [node.op("getitem", s, index=(b,)) for s in states]
        sx = [node.op("getitem", x, index=(b,)) for x in xs]
        per_batch.append(_unroll_scan(node, body, st, sx, steps, [0] * m, dirs, [0] * k, [0] * k))
    return [node.op("stack", *(r[j] for r in per_batch), axis=0) for j in range(n + k)]


# ---------------------------------------------------------------- sequences
@translates("SequenceConstruct")
def _sequence_construct(node: Node, *xs: Any) -> Any:
    dts = {node.dtype(x) for x in xs}
    if len(dts) > 1:
        raise node.error(f"the tensors of a sequence must share one element type, got {sorted(map(str, dts))}")
    return Seq(list(xs), dts.pop() if dts else None)


@translates("SequenceEmpty")
def _sequence_empty(node: Node) -> Any:
    return Seq([], np_dtype(node.attr("dtype", onnx.TensorProto.FLOAT), node.label))


@translates("SequenceInsert")
def _sequence_insert(node: Node, seq: Any, x: Any, position: Any = None) -> Any:
    s = _seq(node, seq)
    if s.elem_dtype is not None and node.dtype(x) != s.elem_dtype:
        raise node.error(f"cannot insert a {node.dtype(x)} tensor into a sequence of {s.elem_dtype} tensors")
    items = list(s.items)
    items.insert(_position(node, 2, len(items), len(items), inserting=True), x)
    return Seq(items, s.elem_dtype or node.dtype(x))


@translates("SequenceErase")
def _sequence_erase(node: Node, seq: Any, position: Any = None) -> Any:
    s = _seq(node, seq)
    if not s.items:
        raise node.error("cannot erase from an empty sequence")
    items = list(s.items)
    del items[_position(node, 1, len(items), -1)]
    return Seq(items, s.elem_dtype)


@translates("SequenceAt")
def _sequence_at(node: Node, seq: Any, position: Any) -> Any:
    s = _seq(node, seq)
    return s.items[_position(node, 1, len(s.items), None)]


@translates("SequenceLength")
def _sequence_length(node: Node, seq: Any) -> Any:
    return node.const(np.int64(len(_seq(node, seq).items)))


@translates("ConcatFromSequence")
def _concat_from_sequence(node: Node, seq: Any) -> Any:
    s = _seq(node, seq)
    if not s.items:
        raise node.error("cannot concatenate an empty sequence (its result's shape is unknown)")
    new_axis = bool(node.attr("new_axis", 0))
    axis = int(node.attr("axis"))
    axis = node.axis(axis, node.rank(s.items[0]) + (1 if new_axis else 0))
    if new_axis:
        return node.op("stack", *s.items, axis=axis)
    return s.items[0] if len(s.items) == 1 else node.op("concat", *s.items, axis=axis)


@translates("SplitToSequence")
def _split_to_sequence(node: Node, x: Any, split: Any = None) -> Any:
    r = node.rank(x)
    axis = node.axis(int(node.attr("axis", 0)), r)
    dim = node.shape(x, (axis,), "the sequence has one part per slice of the split axis")[axis]
    if split is None:
        sizes = [1] * dim
    else:
        arr = _must_know(node, split, "split", "opgraph graphs have static shapes")
        if arr.ndim == 0:
            chunk = int(arr)
            if chunk <= 0:
                raise node.error(f"split must be positive, got {chunk}")
            sizes = [min(chunk, dim - i) for i in range(0, dim, chunk)]
        else:
            sizes = [int(s) for s in arr.reshape(-1)]
            if sum(sizes) != dim or any(s < 0 for s in sizes):
                raise node.error(f"split {sizes} does not add up to the axis' size {dim}")
    parts, start = [], 0
    for size in sizes:
        index = (slice(None),) * axis + (slice(start, start + size),)
        parts.append(node.op("getitem", x, index=index))
        start += size
    if split is None and not node.attr("keepdims", 1):
        parts = [node.op("squeeze", p, axis=(axis,)) for p in parts]
    return Seq(parts, node.dtype(x))


@translates("SequenceMap")
def _sequence_map(node: Node, seq: Any, *extra: Any) -> Any:
    body: onnx.GraphProto = node.attr("body")
    scope = _scope(node)
    s = _seq(node, seq)
    n = len(s.items)
    for j, a in enumerate(extra):
        if isinstance(a, Seq) and len(a.items) != n:
            raise node.error(f"input {j + 1} is a sequence of {len(a.items)}, input 0 one of {n}")
    outs: list[list[Any]] = [[] for _ in body.output]
    for i in range(n):
        args = [s.items[i], *(a.items[i] if isinstance(a, Seq) else a for a in extra)]
        for j, v in enumerate(node.subgraph("body", args, scope)):
            outs[j].append(v)
    result = []
    for j, items in enumerate(outs):
        t = body.output[j].type
        declared = (np_dtype(t.tensor_type.elem_type, node.label)
                    if t.WhichOneof("value") == "tensor_type" and t.tensor_type.elem_type else None)
        result.append(Seq(items, _elem_dtype(items, declared)))
    return result


# ---------------------------------------------------------------- optionals
@translates("Optional")
def _optional(node: Node, x: Any = None) -> Any:
    return Opt(x, node.attr("type", None))


@translates("OptionalHasElement")
def _optional_has_element(node: Node, x: Any = None) -> Any:
    present = x is not None and not (isinstance(x, Opt) and x.value is None)
    return node.const(np.asarray(present))


@translates("OptionalGetElement")
def _optional_get_element(node: Node, x: Any) -> Any:
    if isinstance(x, Opt):
        if x.value is None:
            raise node.error("the optional is empty")
        return x.value
    return x  # a plain tensor or sequence is its own element (opset 18)


# ---------------------------------------------------------------- Dropout
@translates("Dropout")
def _dropout(node: Node, x: Any, ratio: Any = None, training_mode: Any = None) -> Any:
    if node.opset >= 12:
        training = training_mode is not None and bool(_scalar(
            _must_know(node, training_mode, "training_mode", "training-mode Dropout is random"), node, "training_mode"))
        if training and ratio is not None:
            p = float(_scalar(_must_know(node, ratio, "ratio", "training-mode Dropout with ratio > 0 is random"),
                              node, "ratio"))
        else:
            p = 0.5
    elif node.opset >= 7:
        training, p = False, float(node.attr("ratio", 0.5))  # Dropout 7-11 is always inference
    else:
        training, p = not node.attr("is_test", 0), float(node.attr("ratio", 0.5))
    if training and p != 0.0:
        raise node.error(f"runs in training mode with ratio {p}: its result is random, which opgraph does not "
                         "import; use the model in inference mode (training_mode false)")
    # the mask is bool from opset 10, the input's type before
    mask_dtype = np.dtype(bool) if node.opset >= 10 else node.dtype(x)
    if len(node.proto.output) < 2 or not node.proto.output[1]:
        return x, None
    if None not in node.dims(x):
        return x, node.op("broadcast_to", node.const(np.ones((), mask_dtype)), shape=node.shape(x))
    nan = node.op("isnan", x)  # all true, of x's run-time shape (a dynamic batch)
    return x, node.cast(node.op("logical_or", nan, node.op("logical_not", nan)), mask_dtype)
