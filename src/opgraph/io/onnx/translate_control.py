"""ONNX -> opgraph translators: control flow (If, Loop, Scan), sequences, optionals, Dropout.

opgraph graphs have static shapes and no control flow, so control flow is
resolved while importing: an ``If`` whose condition is known is inlined (an
unknown condition inlines both branches and selects with ``where`` when they
produce tensors of the same type), a ``Loop`` whose trip count and
per-iteration condition are known is unrolled, a ``Scan`` is unrolled over its
(static) sequence length. ONNX sequences are Python lists of values
(:class:`~opgraph.io.onnx._core.Seq`) and optionals are
:class:`~opgraph.io.onnx._core.Opt`, so every sequence op is resolved while
importing; only the tensors inside them reach the graph.

    >>> import numpy as np
    >>> from onnx import TensorProto, helper
    >>> from opgraph.io.onnx import backend
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
    ...      helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2])],
    ...     [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2])],
    ...     initializer=[helper.make_tensor("n", TensorProto.INT64, [], [3])])
    >>> rep = backend.prepare(helper.make_model(graph))
    >>> rep.run([np.array([1, 2], np.float32), np.zeros(2, np.float32)])[0]
    array([3., 6.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from opgraph.core.graph import Value
from opgraph.io.onnx._core import Node, OnnxImportError, Opt, Scope, Seq, np_dtype, translates

#: A Loop with no trip count stops when its condition turns false; past this many iterations it is an error
#: (an unrolled loop that long would be a graph nobody wants, and it may never stop).
MAX_UNROLL = 100_000


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


# ---------------------------------------------------------------- If
class _Unmergeable(Exception):
    """Internal: the branches of an If with an unknown condition cannot be joined with ``where``."""


@translates("If")
def _if(node: Node, cond: Any) -> Any:
    scope = _scope(node)
    known = node.known(cond)
    if known is not None:
        return node.subgraph("then_branch" if bool(_scalar(known, node, "the condition")) else "else_branch",
                             [], scope)
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
                             f"joined with where ({exc}); opgraph graphs have no control flow, so pass the "
                             "inputs the condition depends on in static_inputs=") from None
        return node.subgraph("then_branch" if bool(_scalar(np.asarray(arr), node, "the condition")) else "else_branch",
                             [], scope)


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
@translates("Loop")
def _loop(node: Node, trip: Any = None, cond: Any = None, *initial: Any) -> Any:
    body: onnx.GraphProto = node.attr("body")
    scope = _scope(node)
    n_carried = len(initial)
    n_scan = len(body.output) - 1 - n_carried
    if n_scan < 0 or len(body.input) != 2 + n_carried:
        raise node.error(f"the body has {len(body.input)} inputs and {len(body.output)} outputs; with {n_carried} "
                         f"loop-carried values it needs {2 + n_carried} inputs and at least {1 + n_carried} outputs")
    why = "opgraph unrolls loops"
    max_trip = None if trip is None else int(_scalar(_must_know(node, trip, "the trip count M", why), node, "M"))
    going = True if cond is None else bool(_scalar(_must_know(node, cond, "the initial condition", why), node,
                                                   "the condition"))
    if max_trip is None and cond is None:
        raise node.error("has neither a trip count nor a condition: it never stops")
    iter_dtype = node.dtype(trip) if trip is not None else np.dtype(np.int64)
    state = list(initial)
    scans: list[list[Any]] = [[] for _ in range(n_scan)]
    i = 0
    while going and (max_trip is None or i < max_trip):
        if i >= MAX_UNROLL:
            raise node.error(f"runs more than {MAX_UNROLL} iterations; opgraph unrolls loops, so that many is "
                             "not supported")
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
    if node.opset < 9:
        return _scan8(node, inputs[0] if inputs else None, list(inputs[1:]))
    return _scan_unbatched(node, list(inputs))


def _scan_unbatched(node: Node, inputs: list[Any]) -> list[Any]:
    body: onnx.GraphProto = node.attr("body")
    m = int(node.attr("num_scan_inputs"))
    n = len(inputs) - m
    if n < 0:
        raise node.error(f"has {len(inputs)} inputs, fewer than num_scan_inputs={m}")
    k = len(body.output) - n
    states, xs = list(inputs[:n]), list(inputs[n:])
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
    steps = lengths.pop() if lengths else 0
    return _unroll_scan(node, body, states, xs, steps, in_axes, in_dirs, out_axes, out_dirs)


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
    shape = node.shape(x)
    r = len(shape)
    axis = node.axis(int(node.attr("axis", 0)), r)
    dim = shape[axis]
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
        parts = [node.op("reshape", p, shape=shape[:axis] + shape[axis + 1:]) for p in parts]
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
    mask = (node.op("broadcast_to", node.const(np.ones((), mask_dtype)), shape=node.shape(x))
            if len(node.proto.output) > 1 else None)
    return x, mask
