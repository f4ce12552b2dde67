"""Reverse-mode differentiation: the sweep that calls each op's gradient rule.

The sweep works on *records* (op definition, attributes, input and output
handles) in topological order, so one implementation serves the explicit
builder (handles are :class:`~opgraph.Value`) and lazy arrays (handles are
:class:`~opgraph.frontend.lazy.LazyArray`). Gradient ops are appended through
an emitter (``op``/``constant``), i.e. they are ordinary ops of the same graph.

    >>> import numpy as np, opgraph
    >>> from opgraph.autodiff import build_grad_ops
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> loss = b.sum(b.multiply(x, x))
    >>> (gx,) = build_grad_ops(b, loss, [x])
    >>> b.run({x: np.array([1.0, 2.0, 3.0])}, [gx])[0]
    array([2., 4., 6.])
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opgraph.core import hooks
from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Value
from opgraph.core.registry import CONST, OpDef, get_op
from opgraph.errors import GraphError
from opgraph.ops.grad_helpers import is_float, unbroadcast


class NoGradientError(GraphError):
    """A gradient was asked through an op kind that has no gradient rule."""


@dataclass
class Record:
    """One op as the sweep sees it."""

    opdef: OpDef
    attrs: dict[str, Any]
    inputs: list[Any]
    outputs: list[Any]
    label: str = ""


def _add(b: Any, terms: list[Any]) -> Any:
    acc = terms[0]
    for t in terms[1:]:
        acc = b.op("add", acc, t)
    return acc


def _element_read(rec: Record) -> int | None:
    """The flat (C-order) position a ``getitem`` reads when it reads one element of a float array of static
    shape with an integer per axis (None for every other op)."""
    if rec.opdef.name != "getitem" or len(rec.inputs) != 1:
        return None
    t = rec.inputs[0].type
    shape = getattr(t, "shape", None)
    if shape is None or None in shape or not shape or not is_float(t):
        return None
    from opgraph.ops.shape import normalize_index

    index = normalize_index(rec.attrs["index"], len(shape))
    if len(index) != len(shape) or not all(isinstance(e, (int, np.integer)) for e in index):
        return None
    return int(np.ravel_multi_index(tuple(int(e) % d for e, d in zip(index, shape, strict=True)), shape))


def _stacked(b: Any, x: Any, picked: dict[int, list[Any]]) -> Any:
    """x's cotangent from its elements' (one stack of x's size, zeros where no element was read)."""
    from opgraph.ops.grad_helpers import scalar

    shape = tuple(x.type.shape)
    size = int(np.prod(shape))
    zero = scalar(b, 0.0, x) if len(picked) < size else None
    elems = [_add(b, picked[i]) if i in picked else zero for i in range(size)]
    vec = b.op("stack", *elems, axis=0)
    return vec if len(shape) == 1 else b.op("reshape", vec, shape=shape)


def sweep(b: Any, records: Sequence[Record], key: Callable[[Any], Hashable],
          seeds: Sequence[tuple[Any, Any]], wrt: Sequence[Any]) -> list[Any | None]:
    """Propagate cotangents ``seeds`` ((value, cotangent) pairs) back to ``wrt``.

    Returns one cotangent per ``wrt`` entry, or None when no gradient reaches it.
    Only ops on a path from ``wrt`` to a seeded value are visited.
    """
    wrt_keys = {key(w) for w in wrt}
    depends = set(wrt_keys)
    active: list[Record] = []
    for rec in records:
        if any(key(v) in depends for v in rec.inputs):
            active.append(rec)
            depends.update(key(v) for v in rec.outputs)
    cots: dict[Hashable, list[Any]] = {}
    for v, c in seeds:
        if key(v) in depends:
            cots.setdefault(key(v), []).append(c)

    # cotangents of single elements read by getitem (x[i], x[i, j]: a scalar model's reads of its input), kept per
    # element and put into one vector by one stack when x's cotangent is taken: each read's own rule would pad
    # its scalar to x's size, and adding those costs reads x size (quadratic for a model that reads every x[i])
    elements: dict[Hashable, dict[int, list[Any]]] = {}

    def take(v: Any) -> Any | None:
        terms = cots.pop(key(v), None) or []
        picked = elements.pop(key(v), None)
        if picked:
            terms.append(_stacked(b, v, picked))
        if not terms:
            return None
        summed = _add(b, terms)
        cots[key(v)] = [summed]
        return summed

    for rec in reversed(active):
        outs = [take(v) if is_float(v.type) else None for v in rec.outputs]
        if all(c is None for c in outs):
            continue
        at = _element_read(rec)
        if at is not None and key(rec.inputs[0]) in depends and outs[0].type == rec.outputs[0].type:
            elements.setdefault(key(rec.inputs[0]), {}).setdefault(at, []).append(outs[0])
            continue
        if not any(is_float(v.type) and key(v) in depends for v in rec.inputs):
            continue
        rule = rec.opdef.grad
        if rule is None:
            raise NoGradientError(
                f"op {rec.opdef.name!r}{rec.label} has no gradient rule; cannot differentiate through it "
                "(add a grad= rule to its OpDef, or stop the gradient before it)")
        if getattr(rule, "takes_needed", False):
            # Rules that can skip work (a loop's reverse pass) are told which inputs need a cotangent.
            needed = tuple(is_float(v.type) and key(v) in depends for v in rec.inputs)
            in_cots = rule(b, tuple(rec.inputs), tuple(rec.outputs), tuple(outs), rec.attrs, needed=needed)
        else:
            in_cots = rule(b, tuple(rec.inputs), tuple(rec.outputs), tuple(outs), rec.attrs)
        if len(in_cots) != len(rec.inputs):
            raise GraphError(f"gradient rule of {rec.opdef.name!r} returned {len(in_cots)} cotangents "
                             f"for {len(rec.inputs)} inputs")
        for v, c in zip(rec.inputs, in_cots, strict=True):
            if c is None or not is_float(v.type) or key(v) not in depends:
                continue
            if c.type != v.type:  # a rule may leave broadcasting or a dtype change to the driver
                cs, vs = c.type.shape, v.type.shape
                if cs is not None and vs is not None and (
                        len(cs) > len(vs) or any(d == 1 and e != 1 for d, e in zip(vs, cs, strict=False))):
                    c = unbroadcast(b, c, v.type)
                if c.type.dtype != v.type.dtype:
                    c = b.op("cast", c, dtype=v.type.dtype)
                if c.type.shape != v.type.shape and v.type.shape is not None \
                        and all(d is not None for d in v.type.shape):
                    c = b.op("broadcast_to", c, shape=v.type.shape)
            cots.setdefault(key(v), []).append(c)
    return [take(w) for w in wrt]


# ---------------------------------------------------------------- the builder level
def _builder_records(b: GraphBuilder, stop: int) -> list[Record]:
    recs = []
    for op in range(stop):
        kind = b._op_kind[op]
        if kind == CONST.id:
            continue
        recs.append(Record(get_op(kind), b.attrs_of(op), [Value(b, v) for v in b.op_inputs(op)],
                           [Value(b, v) for v in b.op_outputs(op)], f" (op {op})"))
    return recs


def _ones_like(b: Any, v: Any) -> Any:
    t = v.type
    shape = t.shape
    one = b.constant(np.array(1, dtype=t.dtype))
    if shape:
        if any(d is None for d in shape):
            return b.op("add", b.op("multiply", v, b.constant(np.array(0, dtype=t.dtype))), one)
        return b.op("broadcast_to", one, shape=shape)
    return one


def _seeds(b: Any, outputs: Sequence[Any], cotangents: Sequence[Any] | None) -> list[tuple[Any, Any]]:
    if cotangents is None:
        for o in outputs:
            if o.type.shape != ():
                raise GraphError(f"gradient of a non-scalar value ({o.type}): pass cotangents for a "
                                 "vector-Jacobian product (vjp)")
            if not is_float(o.type):
                raise GraphError(f"gradient of a non-floating value ({o.type})")
        return [(o, _ones_like(b, o)) for o in outputs]
    if len(cotangents) != len(outputs):
        raise GraphError(f"{len(outputs)} output(s) but {len(cotangents)} cotangent(s)")
    return [(o, c) for o, c in zip(outputs, cotangents, strict=True) if c is not None]


def _zeros_for(b: Any, w: Any) -> Any:
    from opgraph.ops.grad_helpers import zeros_like

    return zeros_like(b, w)


def build_vjp_ops(b: GraphBuilder, outputs: Sequence[Value], wrt: Sequence[Value],
                  cotangents: Sequence[Value | None] | None = None) -> list[Value]:
    """Append ops computing the vector-Jacobian product of ``outputs`` for ``wrt`` to builder ``b``.

    ``cotangents`` (values of the outputs' types, or None for outputs that do
    not contribute) default to 1 for scalar outputs. Inputs the outputs do not
    depend on get zeros; integer and boolean ``wrt`` are an error.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2,)), name="x")
    >>> ct = b.input(("float64", (2,)), name="ct")
    >>> (g,) = build_vjp_ops(b, [b.exp(x)], [x], [ct])
    >>> b.run({x: np.zeros(2), ct: np.array([1.0, 2.0])}, [g])[0]
    array([1., 2.])
    """
    cts = None if cotangents is None else [
        None if c is None else (c if isinstance(c, Value) else b.constant(np.asarray(c, dtype=o.type.dtype)))
        for o, c in zip(outputs, cotangents, strict=True)]
    for w in wrt:
        if not isinstance(w, Value) or w.owner is not b:
            raise GraphError("wrt must be values of this builder")
        if not is_float(w.type):
            raise GraphError(f"cannot differentiate with respect to {w.type} (only floating values have gradients)")
    seeds = _seeds(b, list(outputs), cts)
    records = _builder_records(b, b.num_ops)
    grads = sweep(b, records, lambda v: v.id, seeds, list(wrt))
    return [g if g is not None else _zeros_for(b, w) for g, w in zip(grads, wrt, strict=True)]


def build_grad_ops(b: GraphBuilder, loss: Value, wrt: Sequence[Value] | Value) -> Any:
    """Seed 003's ``build_grad_ops``: append the gradient of scalar ``loss`` for ``wrt`` to ``b``.

    Returns a list of gradient values (a single value when ``wrt`` is one value).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", ()), name="x")
    >>> g = build_grad_ops(b, b.sin(x), x)
    >>> float(b.run({x: 0.0}, [g])[0])
    1.0
    """
    single = isinstance(wrt, Value)
    grads = build_vjp_ops(b, [loss], [wrt] if single else list(wrt))  # type: ignore[list-item]
    return grads[0] if single else grads


# GraphBuilder.build_grad_ops lives in core, which may not import this layer; it reaches this function
# through the hook instead.
hooks.GRAD.set(build_grad_ops)
