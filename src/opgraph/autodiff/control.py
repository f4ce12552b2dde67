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

import numpy as np

from opgraph.core import hooks
from opgraph.core.builder import GraphBuilder
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType
from opgraph.errors import GraphError
from opgraph.ops.control import inline_body, pruned_body, tangent_names
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


def jvp_body(body: Subgraph, wrt: Sequence[int] | None = None) -> Subgraph:
    """The Jacobian-vector body of ``body``: ``(*params, *tangents of params wrt) -> (*results, *tangents)``.

    From a body ``(p_1..p_n) -> (r_1..r_m)``, a body that also takes a
    tangent for each parameter in ``wrt`` (default: every floating one), in
    order, and returns the results followed by the tangent of each floating
    result (zeros where no tangent reaches it). The body's ops are copied
    once and the tangent sweep appends to them, so the tangents read the
    primal values the body computes anyway (nothing runs twice; a control op
    inside runs once, carrying its tangents: see
    :func:`opgraph.passes.control.merge_subsumed`). Built once per
    (body, wrt) and kept on the body; the tangent rules of ``call``,
    ``cond``, ``scan`` and ``while_loop`` reach it through
    :data:`opgraph.core.hooks.BODY_JVP`.

    >>> import numpy as np, opgraph
    >>> sb = opgraph.GraphBuilder()
    >>> x, y = sb.input(("float64", (2,)), name="x"), sb.input(("float64", (2,)), name="y")
    >>> sb.output(sb.multiply(sb.sin(x), y))
    >>> j = jvp_body(Subgraph(sb.freeze(), name="f"), (0,))
    >>> j
    Subgraph('jvp(f)': (f64[2], f64[2], f64[2]) -> (f64[2], f64[2]), 5 ops)
    >>> r, t = opgraph.ops.control.body_fn(j)([np.zeros(2), np.full(2, 3.0), np.ones(2)])
    >>> r, t    # sin(0) * 3 and cos(0) * 3
    (array([0., 0.]), array([3., 3.]))
    """
    ins = body.in_types
    w = tuple(i for i, t in enumerate(ins) if is_float(t)) if wrt is None else tuple(int(i) for i in wrt)
    for i in w:
        if not 0 <= i < len(ins) or not is_float(ins[i]):
            raise GraphError(f"body {body.label}: parameter {i} is not a floating parameter (it has no tangent)")

    def make() -> Subgraph:
        from opgraph.autodiff.forward import build_jvp_ops
        from opgraph.passes.control import merge_subsumed

        b = GraphBuilder()
        names = [body.graph.name_of(int(v)) for v in body.graph.inputs]
        params = [b.input(t, name=n) for t, n in zip(ins, names, strict=True)]
        results = inline_body(b, body, params)
        tans_in = [b.input(ins[i], name=n) for i, n in zip(w, tangent_names(names, w), strict=True)]
        floats = [r for r in results if is_float(r.type)]
        tans = build_jvp_ops(b, floats, [params[i] for i in w], tans_in)
        b.output(*results, *tans)
        # the primal control ops inside are read off their tangent ops (one loop each), then pruned
        full = merge_subsumed(b.freeze()).graph
        return pruned_body(full, f"jvp({body.name})" if body.name else "jvp")

    return body.cache(("jvp-body", w), make)  # type: ignore[no-any-return]


hooks.BODY_JVP.set(jvp_body)


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
        from opgraph.autodiff.batching import batch_sweep, builder_records
        from opgraph.ops.batch_helpers import broadcast_batch

        g = body.graph
        b = GraphBuilder()
        # the body copied on one example's parameters, then the engine's sweep batches what depends on the batched
        # ones (fed by parameters with the batch axis); the copies nothing reads any more are pruned below
        example = [b.input(t, name=None if f else g.name_of(int(v)))
                   for t, v, f in zip(body.in_types, g.inputs, flags, strict=True)]
        whole = [b.input(TensorType(t.dtype, (size, *t.shape)), name=g.name_of(int(v))) if f else None
                 for t, v, f in zip(body.in_types, g.inputs, flags, strict=True)]
        results = inline_body(b, body, example)
        done = batch_sweep(b, builder_records(b, b.num_ops), lambda v: v.id,
                           {e.id: w for e, w in zip(example, whole, strict=True) if w is not None}, size)
        outs = []
        for j, r in enumerate(results):
            got = done.get(r.id)
            if j in keep and got is not None:
                raise GraphError(f"body {body.label}: result {j} depends on a batched parameter; it cannot stay "
                                 "unbatched")
            outs.append(got if got is not None else r if j in keep else broadcast_batch(b, r, size))
        b.output(*outs)
        full = b.freeze()
        params = np.array([(w if w is not None else e).id for e, w in zip(example, whole, strict=True)],
                          dtype=full.inputs.dtype)
        return pruned_body(full.replace(inputs=params), f"vmap({body.name})" if body.name else "vmap")

    return body.cache(("batch-body", flags, int(size), keep), make)  # type: ignore[no-any-return]


hooks.BODY_BATCH.set(batch_body)
