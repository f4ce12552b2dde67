"""Differentiating bodies: the vector-Jacobian body of a subgraph, for the control-flow ops' gradient rules.

The rules of ``call``, ``cond``, ``scan`` and ``while_loop`` (in
:mod:`opgraph.ops.control`) differentiate through an op by running the
*vjp body* of its subgraph: from a body ``(p_1..p_n) -> (r_1..r_m)``,
:func:`vjp_body` builds ``(p_1..p_n, ct_r_j for j in cts) -> (ct_p_i for i in wrt)``
by copying the body's ops into a new builder and running the ordinary
reverse sweep on them (so bodies holding control flow differentiate
recursively, and a vjp body can be differentiated again). A parameter no
cotangent reaches gets zeros. It is built once per (body, wrt, cts) and kept
on the body. The rules reach it through :data:`opgraph.core.hooks.BODY_VJP`
because ops sit below autodiff in the layers.

    >>> import numpy as np, opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> sb = opgraph.GraphBuilder()
    >>> x, y = sb.input(("float64", (2,)), name="x"), sb.input(("float64", (2,)), name="y")
    >>> sb.output(sb.multiply(sb.sin(x), y))
    >>> body = Subgraph(sb.freeze(), name="f")
    >>> v = vjp_body(body, (0, 1), (0,))
    >>> v
    Subgraph('vjp(f)': (f64[2], f64[2], f64[2]) -> (f64[2], f64[2]), 5 ops)
    >>> gx, gy = opgraph.ops.control.body_fn(v)([np.zeros(2), np.full(2, 3.0), np.ones(2)])
    >>> gx, gy
    (array([3., 3.]), array([0., 0.]))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opgraph.core import hooks
from opgraph.core.builder import GraphBuilder
from opgraph.core.registry import CONST, get_op
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType
from opgraph.errors import GraphError
from opgraph.ops.control import inline_body, pruned_body
from opgraph.ops.grad_helpers import is_float


def vjp_body(body: Subgraph, wrt: Sequence[int] | None = None, cts: Sequence[int] | None = None,
             given: Sequence[int] = ()) -> Subgraph:
    """The vector-Jacobian body of ``body`` (see the module doc).

    ``wrt``: the parameters whose cotangents it returns, in order (default:
    every floating parameter); ``cts``: the results that receive a cotangent,
    which become its extra parameters in order (default: every floating
    result); ``given``: results whose values the caller has (a scan's reverse
    pass has every step's new carry), which become further parameters after
    the cotangents: the gradient reads them instead of computing them again,
    so forward ops needed only for them are not copied (``tanh``'s gradient
    reads its result: an RNN step's reverse pass recomputes nothing).

    >>> import opgraph
    >>> sb = opgraph.GraphBuilder(); p = sb.input(("float64", ()), name="p"); sb.output(sb.exp(p), sb.sin(p))
    >>> vjp_body(Subgraph(sb.freeze(), name="g")).in_types
    (f64[], f64[], f64[])
    """
    ins, outs = body.in_types, body.out_types
    w = tuple(i for i, t in enumerate(ins) if is_float(t)) if wrt is None else tuple(int(i) for i in wrt)
    c = tuple(j for j, t in enumerate(outs) if is_float(t)) if cts is None else tuple(int(j) for j in cts)
    for i in w:
        if not 0 <= i < len(ins) or not is_float(ins[i]):
            raise GraphError(f"body {body.label}: parameter {i} is not a floating parameter (it has no cotangent)")
    for j in c:
        if not 0 <= j < len(outs) or not is_float(outs[j]):
            raise GraphError(f"body {body.label}: result {j} is not a floating result (it takes no cotangent)")
    known = tuple(int(j) for j in given)
    for j in known:
        if not 0 <= j < len(outs):
            raise GraphError(f"body {body.label} has no result {j}")

    def make() -> Subgraph:
        from opgraph.autodiff.reverse import build_vjp_ops

        b = GraphBuilder()
        params = [b.input(t, name=body.graph.name_of(int(v))) for t, v in zip(ins, body.graph.inputs, strict=True)]
        results = inline_body(b, body, params)
        ct_in = [b.input(outs[j], name=f"ct{j}") for j in c]
        given_in = [b.input(outs[j]) for j in known]  # unnamed: the body's own names may be anything
        grads = build_vjp_ops(b, [results[j] for j in c], [params[i] for i in w], ct_in)
        b.output(*grads)
        full = b.freeze()
        if known:
            # Every use of a given result reads the parameter instead; the copy below then drops the forward
            # ops nothing else needs.
            swap = {r.id: p.id for r, p in zip((results[j] for j in known), given_in, strict=True)
                    if r.id not in {q.id for q in params}}
            if swap:
                in_ids, out = full.in_ids.copy(), full.outputs.copy()
                for r, p in swap.items():
                    in_ids[full.in_ids == r] = p
                    out[full.outputs == r] = p
                full = full.replace(in_ids=in_ids, outputs=out)
        # without the forward ops no gradient needs (the body's unused results)
        return pruned_body(full, f"vjp({body.name})" if body.name else "vjp")

    return body.cache(("vjp-body", w, c, known), make)  # type: ignore[no-any-return]


hooks.BODY_VJP.set(vjp_body)


def batch_op(b: Any, opdef: Any, ins: Sequence[Any], batched: Sequence[bool], size: int,
             attrs: dict[str, Any]) -> list[Any]:
    """TEMPORARY until the vmap engine lands: the op's rule, else the op per example, stacked."""
    if opdef.batch is not None:
        res = opdef.batch(b, list(ins), tuple(batched), size, attrs)
        if res is not None:
            return list(res)
    per = []
    for e in range(size):
        r = b.op(opdef.name, *[b.op("getitem", v, index=(e,)) if f else v for v, f in zip(ins, batched, strict=True)],
                 **attrs)
        per.append(list(r) if isinstance(r, (tuple, list)) else [r])
    return [b.op("stack", *col, axis=0) for col in zip(*per, strict=True)]


def _batch_ops(b: GraphBuilder, g: Any, params: Sequence[Any], flags: Sequence[bool],
               size: int) -> tuple[list[Any], list[bool]]:
    """Copy the ops of graph ``g`` that its outputs need onto ``b`` on ``params``, batching each op with a batched
    input; return the outputs and which of them are batched."""
    env: dict[int, tuple[Any, bool]] = {int(v): (p, f) for v, p, f in zip(g.inputs, params, flags, strict=True)}
    needed = g.needed_ops(g.outputs)
    for op in g.topological_order():
        op = int(op)
        if not needed[op]:
            continue
        outs = g.op_outputs(op)
        kind = int(g.op_kind[op])
        if kind == CONST.id:
            env[int(outs[0])] = (b.constant(g.constant_of(op)), False)
            continue
        ins = [env[int(v)] for v in g.op_inputs(op)]
        vals, on = [v for v, _ in ins], tuple(f for _, f in ins)
        if not any(on):
            res = b.op(kind, *vals, **g.attrs_of(op))
            res = list(res) if isinstance(res, (tuple, list)) else [res]
            for v, r in zip(outs, res, strict=True):
                env[int(v)] = (r, False)
            continue
        res = batch_op(b, get_op(kind), vals, on, size, g.attrs_of(op))
        for v, r in zip(outs, res, strict=True):
            env[int(v)] = (r, True)
    got = [env[int(v)] for v in g.outputs]
    return [r for r, _ in got], [f for _, f in got]


def batch_body(body: Subgraph, batched: Sequence[bool], size: int, unbatched: Sequence[int] = ()) -> Subgraph:
    """``body`` run on a batch: the parameters flagged in ``batched`` and its results carry a leading batch axis.

    The body's ops are copied into a new builder, each op with a batched input through its batching rule (so
    bodies holding control flow batch recursively); a result that depends on no batched parameter is broadcast
    along the batch axis, except those listed in ``unbatched`` (a loop's carry that stays shared), which keep
    their type. Built once per (body, batched, size, unbatched) and kept on the body.

    >>> import numpy as np, opgraph
    >>> sb = opgraph.GraphBuilder()
    >>> x, y = sb.input(("float64", (2,)), name="x"), sb.input(("float64", (2,)), name="y")
    >>> sb.output(sb.multiply(sb.sin(x), y), sb.exp(y))
    >>> v = batch_body(Subgraph(sb.freeze(), name="f"), (True, False), 3)
    >>> v.in_types, v.out_types
    ((f64[3,2], f64[2]), (f64[3,2], f64[3,2]))
    >>> v = batch_body(Subgraph(sb.freeze(), name="f"), (True, False), 3, unbatched=(1,))
    >>> v.out_types
    (f64[3,2], f64[2])
    """
    flags = tuple(bool(f) for f in batched)
    keep = tuple(sorted(int(j) for j in unbatched))
    if len(flags) != body.num_inputs:
        raise GraphError(f"body {body.label} takes {body.num_inputs} parameter(s), got {len(flags)} batch flags")

    def make() -> Subgraph:
        from opgraph.ops.batch_fold import with_batch

        g = body.graph
        b = GraphBuilder()
        params = []
        for t, v, f in zip(body.in_types, g.inputs, flags, strict=True):
            params.append(b.input(TensorType(t.dtype, (size, *t.shape)) if f else t, name=g.name_of(int(v))))
        results, on = _batch_ops(b, g, params, flags, size)
        outs = []
        for j, (r, f) in enumerate(zip(results, on, strict=True)):
            if j in keep and f:
                raise GraphError(f"body {body.label}: result {j} depends on a batched parameter; it cannot stay "
                                 "unbatched")
            outs.append(r if f or j in keep else with_batch(b, r, False, size))
        b.output(*outs)
        return pruned_body(b.freeze(), f"vmap({body.name})" if body.name else "vmap")

    return body.cache(("batch-body", flags, int(size), keep), make)  # type: ignore[no-any-return]


hooks.BODY_BATCH.set(batch_body)
