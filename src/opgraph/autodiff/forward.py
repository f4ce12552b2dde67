"""Forward-mode differentiation: the sweep that pushes tangents through each op's tangent rule.

The sweep walks the same *records* as the reverse sweep
(:mod:`opgraph.autodiff.reverse`), forwards in topological order, so one
implementation serves builder values and lazy arrays. An op kind's tangent
rule is its ``jvp`` (``fn(b, inputs, outputs, tangents, attrs) -> tangent per
output``, a tangent None where it is zero). A kind with a gradient rule and no
tangent rule gets its tangents by transposing the gradient rule, as JAX's
``ad.py`` relates the two: the rule maps an output cotangent ``u`` to input
cotangents ``J_i^T u``, linearly in ``u``, so the reverse sweep of that map,
seeded with the input tangents ``t_i``, gives ``sum_i J_i t_i``. So every kind
that can be differentiated in reverse can be differentiated forwards, and one
rule is written once.

    >>> import numpy as np, opgraph
    >>> from opgraph.autodiff.forward import build_jvp_ops
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> y = b.multiply(b.sin(x), x)
    >>> (ty,) = build_jvp_ops(b, [y], [x], [b.constant(np.ones(3))])
    >>> b.run({x: np.array([0.0, 1.0, 2.0])}, [ty])[0]  # d/dx x sin x = sin x + x cos x
    array([0.        , 1.38177329, 0.07700375])
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from opgraph.autodiff.reverse import NoGradientError, Record, sweep
from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Value
from opgraph.core.registry import CONST, get_op
from opgraph.errors import GraphError
from opgraph.ops.grad_helpers import is_float, zeros_like

__all__ = ["LAZY", "Level", "NoTangentError", "build_jvp_ops", "builder_level", "lazy_jvp", "tangent_sweep",
           "transposed_grad"]


class NoTangentError(GraphError):
    """Tangents were asked through an op kind with neither a tangent rule nor a gradient rule."""


class _Recording:
    """An emitter that passes ops on to ``b`` and keeps a record of each (the ops a gradient rule emits)."""

    def __init__(self, b: Any, record_of: Callable[[Any], Record | None], key: Callable[[Any], Hashable]) -> None:
        self.b = b
        self.record_of = record_of
        self.key = key
        self.records: list[Record] = []
        self._seen: set[Hashable] = set()

    def op(self, kind: Any, *inputs: Any, **attrs: Any) -> Any:
        out = self.b.op(kind, *inputs, **attrs)
        first = out[0] if isinstance(out, tuple) else out
        if isinstance(out, tuple) and not out:
            return out
        k = self.key(first)
        if k not in self._seen:  # hash-consing may hand back an op already recorded: count it once
            self._seen.add(k)
            rec = self.record_of(first)
            if rec is not None:
                self.records.append(rec)
        return out

    def constant(self, value: Any) -> Any:
        return self.b.constant(value)


def _fit(b: Any, t: Any, like: Any) -> Any:
    """Tangent ``t`` in ``like``'s type (a rule may leave a broadcast or a dtype change to the driver)."""
    if t.type == like.type:
        return t
    if t.type.dtype != like.type.dtype:
        t = b.op("cast", t, dtype=like.type.dtype)
    shape = like.type.shape
    if t.type.shape != shape and shape is not None and all(d is not None for d in shape):
        t = b.op("broadcast_to", t, shape=shape)
    return t


class Level:
    """How the sweeps see one kind of handle (builder values or lazy arrays).

    ``key(v)``: a hashable identity; ``record_of(v)``: the :class:`Record` of
    the op that made ``v`` (None for an input or a constant);
    ``stand_in(v)``: a fresh value of ``v``'s type that stands for a cotangent
    while a gradient rule runs; ``reads(values, stand_ins)``: whether any of
    ``values`` was computed from the stand-ins.
    """

    def __init__(self, key: Callable[[Any], Hashable], record_of: Callable[[Any], Record | None],
                 stand_in: Callable[[Any], Any], reads: Callable[[Sequence[Any], Sequence[Any]], bool]) -> None:
        self.key, self.record_of, self.stand_in, self.reads = key, record_of, stand_in, reads


def transposed_grad(b: Any, rec: Record, tangents: Sequence[Any], level: Level) -> list[Any]:
    """Output tangents of ``rec`` from its gradient rule, transposed (see the module doc).

    The stand-in cotangents the rule runs on are not read by what is kept
    (the rule is linear in them, so its transpose does not read them); a rule
    that is not is an error that names the op.
    """
    key, record_of, stand_in = level.key, level.record_of, level.stand_in
    rule = rec.opdef.grad
    if rule is None:
        raise NoTangentError(
            f"op {rec.opdef.name!r}{rec.label} has neither a tangent rule nor a gradient rule; cannot "
            "differentiate through it (add a jvp= or grad= rule to its OpDef, or stop the gradient before it)")
    rb = _Recording(b, record_of, key)
    us: list[Any] = []
    taken: set[Hashable] = set()
    for o in rec.outputs:
        u = stand_in(o) if is_float(o.type) else None
        # hash-consing hands outputs of one type the same stand-in; each output needs its own
        while u is not None and key(u) in taken:
            u = b.op("positive", u)
        if u is not None:
            taken.add(key(u))
        us.append(u)
    if getattr(rule, "takes_needed", False):
        needed = tuple(t is not None for t in tangents)
        cots = rule(rb, tuple(rec.inputs), tuple(rec.outputs), tuple(us), rec.attrs, needed=needed)
    else:
        cots = rule(rb, tuple(rec.inputs), tuple(rec.outputs), tuple(us), rec.attrs)
    seeds = []
    for x, c, t in zip(rec.inputs, cots, tangents, strict=True):
        if c is None or t is None:
            continue
        # the cotangent of x as the reverse sweep would take it (fitted to x's type), recorded with the rest
        (c,) = sweep_fitted(rb, c, x)
        seeds.append((c, t))
    wrt = [u for u in us if u is not None]
    try:
        outs = sweep(b, rb.records, key, seeds, wrt) if seeds else [None] * len(wrt)
    except NoGradientError as exc:  # an op the gradient rule emits: say which kind's tangent needed it
        raise NoTangentError(f"op {rec.opdef.name!r}{rec.label} has no tangent rule, and its gradient rule cannot "
                             f"be transposed: {exc}") from None
    if level.reads([o for o in outs if o is not None], wrt):
        raise NoTangentError(
            f"op {rec.opdef.name!r}{rec.label} has no tangent rule, and its gradient rule cannot be transposed "
            "(it is not linear in the cotangent); add a jvp= rule to its OpDef")
    it = iter(outs)
    return [next(it) if u is not None else None for u in us]


def sweep_fitted(b: Any, c: Any, x: Any) -> tuple[Any]:
    """Cotangent ``c`` fitted to input ``x``'s type, as :func:`~opgraph.autodiff.reverse.sweep` fits it."""
    from opgraph.ops.grad_helpers import unbroadcast

    if c.type == x.type:
        return (c,)
    cs, vs = c.type.shape, x.type.shape
    if cs is not None and vs is not None and (
            len(cs) > len(vs) or any(d == 1 and e != 1 for d, e in zip(vs, cs, strict=False))):
        c = unbroadcast(b, c, x.type)
    return (_fit(b, c, x),)


def tangent_sweep(b: Any, records: Sequence[Record], tangents: dict[Hashable, Any], level: Level
                  ) -> dict[Hashable, Any]:
    """Push ``tangents`` (key -> tangent value) forwards through ``records``; returns the extended map.

    Only ops reading a value with a tangent are visited; an op whose tangents
    are all zero gives none.
    """
    key = level.key
    tans = dict(tangents)
    for rec in records:
        ins = [tans.get(key(v)) if is_float(v.type) else None for v in rec.inputs]
        if all(t is None for t in ins):
            continue
        if not any(is_float(o.type) for o in rec.outputs):
            continue
        rule = rec.opdef.jvp
        if rule is not None:
            outs = rule(b, tuple(rec.inputs), tuple(rec.outputs), tuple(ins), rec.attrs)
        else:
            outs = transposed_grad(b, rec, ins, level)
        if len(outs) != len(rec.outputs):
            raise GraphError(f"tangent rule of {rec.opdef.name!r} returned {len(outs)} tangents "
                             f"for {len(rec.outputs)} outputs")
        for o, t in zip(rec.outputs, outs, strict=True):
            if t is not None and is_float(o.type):
                tans[key(o)] = _fit(b, t, o)
    return tans


# ---------------------------------------------------------------- the builder level
def _builder_record(b: GraphBuilder, v: Value) -> Record | None:
    op = b.producer_of(v.id)
    if op is None or op.kind == CONST.name:
        return None
    o = op.id
    return Record(get_op(b.kind_of(o)), b.attrs_of(o), [Value(b, i) for i in b.op_inputs(o)],
                  [Value(b, i) for i in b.op_outputs(o)], f" (op {o})")


def builder_level(b: GraphBuilder) -> Level:
    """The :class:`Level` of builder ``b``'s values."""

    def stand_in(out: Value) -> Value:
        # an op of out's type that nothing else reads; what the transposed rule keeps never reads it
        return b.op("positive", zeros_like(b, out))

    def reads(values: Sequence[Value], stand_ins: Sequence[Value]) -> bool:
        targets = {u.id for u in stand_ins}
        first = min((b.producer_of(u.id).id for u in stand_ins), default=0)  # type: ignore[union-attr]
        stack, seen = [v.id for v in values], set()
        while stack:
            v = stack.pop()
            if v in targets:
                return True
            op = b.producer_of(v)
            if op is None or op.id < first or op.id in seen:  # built before the stand-ins: cannot read them
                continue
            seen.add(op.id)
            stack.extend(b.op_inputs(op.id))
        return False

    return Level(lambda v: v.id, lambda v: _builder_record(b, v), stand_in, reads)


def build_jvp_ops(b: GraphBuilder, outputs: Sequence[Value], wrt: Sequence[Value],
                  tangents: Sequence[Value | Any]) -> list[Value]:
    """Append ops computing the Jacobian-vector product of ``outputs`` along ``tangents`` of ``wrt`` to ``b``.

    Returns one tangent per output (zeros where no tangent reaches it).
    Tangents may be builder values or arrays (made constants).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2,)), name="x")
    >>> (t,) = build_jvp_ops(b, [b.exp(x)], [x], [np.array([1.0, 2.0])])
    >>> b.run({x: np.zeros(2)}, [t])[0]
    array([1., 2.])
    """
    from opgraph.autodiff.reverse import _builder_records

    if len(tangents) != len(wrt):
        raise GraphError(f"{len(wrt)} value(s) but {len(tangents)} tangent(s)")
    seeds: dict[Hashable, Any] = {}
    for w, t in zip(wrt, tangents, strict=True):
        if not isinstance(w, Value) or w.owner is not b:
            raise GraphError("wrt must be values of this builder")
        if not is_float(w.type):
            raise GraphError(f"cannot differentiate with respect to {w.type} (only floating values have tangents)")
        if t is None:
            continue
        t = t if isinstance(t, Value) else b.constant(np.asarray(t, dtype=w.type.dtype))
        t = _fit(b, t, w)
        seeds[w.id] = b.op("add", seeds[w.id], t) if w.id in seeds else t
    records = _builder_records(b, b.num_ops)
    tans = tangent_sweep(b, records, seeds, builder_level(b))
    return [tans[o.id] if o.id in tans else zeros_like(b, o) for o in outputs]


# ---------------------------------------------------------------- the lazy-array level
def _lazy_key(v: Any) -> Hashable:
    return (id(v._node), v._index)


def _lazy_record(v: Any) -> Record | None:
    from opgraph.frontend.lazy import LazyArray

    node = v._node
    if node.opdef is None:
        return None
    return Record(node.opdef, dict(node.attrs), list(node.inputs), [LazyArray(node, i) for i in range(len(node.types))])


def _lazy_stand_in(out: Any) -> Any:
    from opgraph.frontend.lazy import placeholder

    return placeholder(out.type.shape, out.type.dtype)


def _lazy_reads(values: Sequence[Any], stand_ins: Sequence[Any]) -> bool:
    targets = {id(u._node) for u in stand_ins}
    first = min(u._node.seq for u in stand_ins)
    stack, seen = [v._node for v in values], set()
    while stack:
        node = stack.pop()
        if id(node) in targets:
            return True
        if node.seq < first or id(node) in seen:  # recorded before the stand-ins: cannot read them
            continue
        seen.add(id(node))
        stack.extend(a._node for a in node.inputs)
    return False


LAZY = Level(_lazy_key, _lazy_record, _lazy_stand_in, _lazy_reads)
"""The :class:`Level` of lazy arrays."""


def lazy_jvp(outputs: Sequence[Any], wrt: Sequence[Any], tangents: Sequence[Any]) -> list[Any]:
    """Jacobian-vector product of lazy ``outputs`` along ``tangents`` of lazy ``wrt``: one lazy tangent per output.

    >>> import numpy as np, opgraph.numpy as onp
    >>> x = onp.asarray(np.array([1.0, 2.0]))
    >>> (t,) = lazy_jvp([x * x], [x], [onp.asarray(np.array([1.0, 10.0]))])
    >>> t.eval()
    array([ 2., 40.])
    """
    from opgraph.autodiff import _lazy_records, _LazyEmitter
    from opgraph.frontend.lazy import as_lazy

    b = _LazyEmitter()
    outputs = [as_lazy(o) for o in outputs]
    seeds: dict[Hashable, Any] = {}
    for w, t in zip(wrt, tangents, strict=True):
        if not is_float(w.type):
            raise GraphError(f"cannot differentiate with respect to {w.type} (only floating values have tangents)")
        if t is None:
            continue
        t = _fit(b, as_lazy(t), w)
        k = _lazy_key(w)
        seeds[k] = b.op("add", seeds[k], t) if k in seeds else t
    tans = tangent_sweep(b, _lazy_records(outputs), seeds, LAZY)
    return [tans[_lazy_key(o)] if _lazy_key(o) in tans else zeros_like(b, o) for o in outputs]

