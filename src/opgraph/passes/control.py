"""Passes over control flow: optimising bodies, hoisting loop-invariant ops, bounding what folding runs.

* :class:`BodyOptimizer` (the ``bodies`` step of :func:`opgraph.optimize`)
  runs the same pipeline on every body (:class:`~opgraph.core.subgraph.Subgraph`)
  of a graph, each distinct body once (memoised by its content key, so a body
  used by ten ops is optimised once and stays shared), nested bodies first
  (the pipeline run on a body has its own ``bodies`` step), and rebuilds the
  attribute table with the new bodies (their names kept). A body's inputs
  and outputs are its signature: DCE keeps every input (even unused ones),
  the rules keep every output's type, so the ops using a body stay valid.
* :func:`hoist_invariants` (the ``hoist`` step) moves the ops of a ``scan``
  or ``while_loop`` body that depend only on the loop's consts (its first
  ``num_consts`` parameters) and on constants out of the loop: they run once
  in the enclosing graph and their results enter the body as new consts.
  Like XLA's loop-invariant code motion, a hoisted op also runs when the loop
  makes zero trips.
* Constant folding of control ops is bounded by their ``fold_guard``
  (:func:`opgraph.ops.control.fold_work`, data on the ops): folding runs the
  op at build time, so a loop folds only when its work (trips times body
  ops, nested loops multiplied in) is known and at most
  :data:`opgraph.ops.control.FOLD_WORK`; a ``while_loop`` without
  ``max_trip`` never folds (it may not stop).

    >>> import numpy as np, opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> sb = opgraph.GraphBuilder()
    >>> w, c, x = (sb.input(("float64", (3,)), name=n) for n in "wcx")
    >>> sb.output(sb.add(c, sb.multiply(sb.exp(w), x)))      # exp(w) is the same on every trip
    >>> b = opgraph.GraphBuilder()
    >>> w, c0, xs = b.input(("float64", (3,)), name="w"), b.input(("float64", (3,)), name="c0"), \\
    ...     b.input(("float64", (5, 3)), name="xs")
    >>> b.output(b.op("scan", w, c0, xs, body=Subgraph(sb.freeze(), name="step"), num_consts=1, num_carry=1))
    >>> g = b.freeze()
    >>> r = hoist_invariants(g)
    >>> r.counts
    {'hoist.scan': 1}
    >>> print(r.graph)
    graph(%w: f64[3], %c0: f64[3], %xs: f64[5,3]) {
      %3: f64[3] = exp(%w)
      %4: f64[3] = scan(%w, %3, %c0, %xs) {body=@step, num_consts=2, num_carry=1, length=None, reverse=False}
      return %4
    }
    @step = graph(%w: f64[3], %hoisted0: f64[3], %c: f64[3], %x: f64[3]) {
      %4: f64[3] = multiply(%hoisted0, %x)
      %5: f64[3] = add(%c, %4)
      return %5
    }
    >>> feeds = {"w": np.ones(3), "c0": np.zeros(3), "xs": np.ones((5, 3))}
    >>> np.allclose(r.graph.run(feeds)[0], g.run(feeds)[0])
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST, Attrs, exact_key, get_op
from opgraph.core.subgraph import Subgraph, bodies_in, subgraphs_of
from opgraph.ops.control import inline_body
from opgraph.passes.base import PassResult, compact
from opgraph.passes.dce import cse, dce
from opgraph.passes.rewrite import Match, P, Rule, RuleSet, rewrite

LOOPS = ("scan", "while_loop")
"""The op kinds whose bodies :func:`hoist_invariants` hoists from (the bodies run once per trip)."""


# ---------------------------------------------------------------- bodies
def replace_bodies(graph: Graph, new_of: dict[Subgraph, Subgraph]) -> Graph:
    """``graph`` with each body ``s`` in its attributes replaced by ``new_of[s]`` (same signature).

    Only the attribute table changes (and ``op_attr``, where two attribute sets become equal), so
    this costs O(number of distinct attribute sets), whatever the graph's size.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); b.output(b.exp(x))
    >>> replace_bodies(b.freeze(), {}).num_ops
    1
    """
    if not new_of:
        return graph

    def swap(value: Any) -> Any:
        if isinstance(value, Subgraph):
            return new_of.get(value, value)
        if isinstance(value, tuple) and any(True for _ in bodies_in(value)):
            return tuple(swap(v) for v in value)
        return value

    attrs: list[Attrs] = []
    remap = np.arange(len(graph.attrs), dtype=np.int64)
    first: dict[Any, int] = {}
    changed = False
    for i, a in enumerate(graph.attrs):
        na = tuple((k, swap(v)) for k, v in a)
        changed |= any(x is not y for (_, x), (_, y) in zip(a, na, strict=True))
        key = exact_key(na)
        j = first.get(key)
        if j is None:
            first[key] = j = len(attrs)
            attrs.append(na)
        remap[i] = j
    if not changed:
        return graph
    return graph.replace(attrs=attrs, op_attr=remap[graph.op_attr])


class BodyOptimizer:
    """The ``bodies`` pass: run ``run`` (a pipeline, ``Graph -> PassResult``) on every body of a graph.

    Each distinct body is optimised once for the life of this object (memoised by content key,
    which also marks an optimised body as done), so repeated pipeline rounds and bodies shared by
    several ops (or by several enclosing bodies) cost one optimisation each. The counts of a body's
    passes are reported once, prefixed with ``body.``.

    >>> import opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> from opgraph.passes.dce import cse
    >>> sb = opgraph.GraphBuilder(hash_cons=False); x = sb.input(("f8", (2,)), name="x")
    >>> sb.output(sb.add(sb.exp(x), sb.exp(x)))
    >>> body = Subgraph(sb.freeze(), name="f")
    >>> b = opgraph.GraphBuilder(); y = b.input(("f8", (2,)), name="y")
    >>> b.output(b.op("call", b.op("call", y, body=body), body=body))
    >>> r = BodyOptimizer(cse)(b.freeze())
    >>> r.counts, [s.graph.num_ops for s in r.graph.subgraphs]
    ({'body.cse.ops': 1, 'bodies': 1}, [2])
    """

    def __init__(self, run: Callable[[Graph], PassResult]) -> None:
        self.run = run
        self.memo: dict[bytes, Subgraph] = {}

    def __call__(self, graph: Graph) -> PassResult:
        """Optimise the bodies of ``graph`` (not ``graph`` itself)."""
        counts: dict[str, int] = {}
        new_of: dict[Subgraph, Subgraph] = {}
        for s in subgraphs_of(graph):
            done = self.memo.get(s.key)
            if done is None:
                r = self.run(s.graph)
                done = Subgraph(r.graph, name=s.name) if r.graph is not s.graph else s
                self.memo[s.key] = done
                self.memo.setdefault(done.key, done)
                for k, n in r.counts.items():
                    if n:
                        counts[f"body.{k}"] = counts.get(f"body.{k}", 0) + n
            if done is not s and done.key != s.key:
                new_of[s] = done
        if not new_of:
            return PassResult(graph, {})
        counts["bodies"] = len(new_of)
        return PassResult(replace_bodies(graph, new_of), counts)


# ---------------------------------------------------------------- hoisting
def invariant_ops(body: Graph, num_consts: int) -> np.ndarray:
    """Per op of ``body``: True when it depends only on the first ``num_consts`` inputs and constants.

    Const ops themselves are not marked (they are free where they are), nor ops of a kind constant
    folding must not evaluate (the ``nondeterministic`` trait).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> c, x = b.input(("f8", (2,)), name="c"), b.input(("f8", (2,)), name="x")
    >>> b.output(b.add(b.exp(b.multiply(c, 2.0)), x))
    >>> invariant_ops(b.freeze(), 1).tolist()
    [False, True, True, False]
    """
    inv = np.zeros(body.num_values, dtype=bool)
    inv[body.inputs[:num_consts]] = True
    marked = np.zeros(body.num_ops, dtype=bool)
    banned = {k for k in np.unique(body.op_kind).tolist() if "nondeterministic" in get_op(k).traits}
    in_ptr, in_ids = body.in_ptr, body.in_ids
    out_ptr, out_ids = body.out_ptr, body.out_ids
    for op in body.topological_order().tolist():
        outs = out_ids[out_ptr[op]:out_ptr[op + 1]]
        kind = int(body.op_kind[op])
        if kind == CONST.id:
            inv[outs] = True
            continue
        if kind in banned or not len(outs):
            continue
        if inv[in_ids[in_ptr[op]:in_ptr[op + 1]]].all():
            inv[outs] = True
            marked[op] = True
    return marked


def _bodies_of(kind: str, attrs: dict[str, Any]) -> list[str]:
    return ["body"] if kind == "scan" else ["cond_body", "body"]


def _hoist(m: Match) -> Any:
    kind = get_op(m.root_kind).name
    attrs = m.root_attrs
    nc: int = attrs["num_consts"]
    roles = _bodies_of(kind, attrs)
    bodies: list[Subgraph] = [attrs[r] for r in roles]
    marks = [invariant_ops(s.graph, nc) for s in bodies]
    if not any(mk.any() for mk in marks):
        return None
    e = m.e
    ins = m.root_ins
    new_consts: list[int] = []        # enclosing values passed as new consts
    slot: dict[int, int] = {}         # enclosing value -> its position among new_consts
    frontiers: list[dict[int, int]] = []   # per body: body value -> enclosing value
    for s, mk in zip(bodies, marks, strict=True):
        bg = s.graph
        env: dict[int, int] = {int(v): ins[i] for i, v in enumerate(bg.inputs[:nc].tolist())}
        const_of: dict[int, int] = {}
        hoisted = np.flatnonzero(mk)
        order = bg.topological_order()
        pos = np.empty(bg.num_ops, dtype=np.int64)
        pos[order] = np.arange(bg.num_ops)
        for op in hoisted[np.argsort(pos[hoisted])].tolist():
            args = []
            for v in bg.op_inputs(op).tolist():
                if v not in env:  # a const op of the body
                    p = int(bg.value_producer[v])
                    if p not in const_of:
                        const_of[p] = e.constant(bg.constant_of(p))
                    env[v] = const_of[p]
                args.append(env[v])
            res = e.op(get_op(int(bg.op_kind[op])).name, *args, **bg.attrs_of(op))
            outs = bg.op_outputs(op).tolist()
            for v, nv in zip(outs, res if isinstance(res, tuple) else (res,), strict=True):
                env[v] = nv
        # Hoisted values the rest of the body (or its results) still reads become consts.
        needed: dict[int, int] = {}
        hoisted_vals = {v for o in hoisted.tolist() for v in bg.op_outputs(o).tolist()}
        rest = np.flatnonzero(~mk & (bg.op_kind != CONST.id))
        reads = {v for o in rest.tolist() for v in bg.op_inputs(o).tolist()}
        for v in [*sorted(reads), *bg.outputs.tolist()]:
            if v in hoisted_vals and v not in needed:
                ev = e.find(env[v])
                needed[v] = ev
                if ev not in slot:
                    slot[ev] = len(new_consts)
                    new_consts.append(ev)
        frontiers.append(needed)
    new_bodies = {}
    for role, s, fr in zip(roles, bodies, frontiers, strict=True):
        # A new parameter has the body's own type for the value (an enclosing type may be more precise
        # and would change the body's result types); one only the other body reads, the enclosing type.
        types = [e.type_of(v) for v in new_consts]
        for bv, ev in fr.items():
            types[slot[ev]] = s.graph.type_of(bv)
        new_bodies[role] = _rebuild(s, nc, types, {bv: slot[ev] for bv, ev in fr.items()})
    new_attrs = dict(attrs, num_consts=nc + len(new_consts), **new_bodies)
    return m.e.op(kind, *ins[:nc], *new_consts, *ins[nc:], **new_attrs)


def _rebuild(s: Subgraph, nc: int, new_types: list[Any], param_of: dict[int, int]) -> Subgraph:
    """``s`` reading the hoisted values it needs (``param_of``: its value -> new const position) as parameters
    (*consts, *new consts, *rest): the ops only they needed are gone."""

    bg = s.graph
    b = GraphBuilder(hash_cons=False)
    names = bg.symbols.values
    ins = [b.input(bg.type_of(v), name=names.get(v)) for v in bg.inputs.tolist()]
    params = [b.input(t, name=f"hoisted{i}") for i, t in enumerate(new_types)]
    # the new parameters were made after all of the body's: put them after its consts
    b.output(*inline_body(b, s, ins, bound={v: params[i] for v, i in param_of.items()}))
    g = b.freeze()
    order = np.concatenate([g.inputs[:nc], g.inputs[len(ins):], g.inputs[nc:len(ins)]])
    return Subgraph(dce(g.replace(inputs=order)).graph, name=s.name)


HOIST = RuleSet().add(*(Rule(f"hoist.{k}", P(k), _hoist, exact="always: the same ops on the same values, run once")
                        for k in LOOPS))
"""The hoisting rules, one per loop kind (see :func:`hoist_invariants`)."""


def hoist_invariants(graph: Graph) -> PassResult:
    """Move the loop-invariant ops of every ``scan`` and ``while_loop`` body out of the loop (see the module doc).

    Only the loops of ``graph`` itself are rewritten; :func:`opgraph.optimize` reaches loops inside
    bodies through its ``bodies`` step. ``counts['hoist.scan']`` (``'hoist.while_loop'``) is the
    number of loops rewritten.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); b.output(b.exp(x))
    >>> g = b.freeze()
    >>> hoist_invariants(g).graph is g
    True
    """
    if not graph.subgraphs:
        return PassResult(graph, {})
    return rewrite(graph, HOIST)


# ---------------------------------------------------------------- merging sibling scans
def merge_sibling_scans(graph: Graph) -> PassResult:
    """Run scans over the same inputs (same consts, carry, xs, length and direction) as one scan.

    Two such scans whose bodies compute the same new carry (a forward pass and
    the carry-stacking scan a gradient adds, say) become one scan whose body
    is both bodies on shared parameters, hash-consed so the common ops run
    once per trip; each old scan's results are read off it. Scans whose
    carries differ are left alone. ``counts['merge.scan']`` is the number of
    scans replaced.

    >>> import numpy as np, opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> def body(extra):
    ...     sb = opgraph.GraphBuilder()
    ...     c, x = sb.input(("float64", (2,)), name="c"), sb.input(("float64", (2,)), name="x")
    ...     c2 = sb.tanh(sb.add(c, x))
    ...     sb.output(c2, sb.sum(c2) if extra else c)
    ...     return Subgraph(sb.freeze(), name="sum" if extra else "stack")
    >>> b = opgraph.GraphBuilder()
    >>> c0, xs = b.input(("float64", (2,)), name="c0"), b.input(("float64", (5, 2)), name="xs")
    >>> h, total = b.op("scan", c0, xs, body=body(True), num_carry=1)
    >>> _, carries = b.op("scan", c0, xs, body=body(False), num_carry=1)
    >>> b.output(total, carries); g = b.freeze()
    >>> r = merge_sibling_scans(g)
    >>> r.counts, int((r.graph.op_kind == g.op_kind[0]).sum())
    ({'merge.scan': 2}, 1)
    >>> r.graph.subgraphs[0].graph.num_ops    # add and tanh once, sum
    3
    >>> feeds = {"c0": np.zeros(2), "xs": np.ones((5, 2))}
    >>> all(np.array_equal(p, q) for p, q in zip(r.graph.run(feeds), g.run(feeds)))
    True
    """
    if not graph.subgraphs:
        return PassResult(graph, {})
    scan_id = get_op("scan").id
    scans = np.flatnonzero(graph.op_kind == scan_id).tolist()
    if len(scans) < 2:
        return PassResult(graph, {})
    groups: dict[Any, list[int]] = {}
    for op in scans:
        a = graph.attrs_of(op)
        key = (tuple(graph.op_inputs(op).tolist()), a["num_consts"], a["num_carry"], a["length"], a["reverse"])
        groups.setdefault(key, []).append(op)
    plan: dict[int, tuple[Subgraph, list[int]]] = {}
    for (_ins, _nc, ncarry, _n, _r), ops in groups.items():
        if len(ops) > 1:
            plan.update(_merged_scans(graph, ops, ncarry))
    if not plan:
        return PassResult(graph, {})

    def merge(m: Match) -> Any:
        found = plan.get(m.root_op)
        if found is None:
            return None
        body, picks = found
        res = m.e.op("scan", *m.root_ins, **dict(m.root_attrs, body=body))
        res = res if isinstance(res, tuple) else (res,)
        chosen = tuple(res[p] for p in picks)
        return chosen if len(chosen) > 1 else chosen[0]

    merged = rewrite(graph, RuleSet().add(Rule("merge.scan", P("scan"), merge,
                                                exact="always: the same steps on the same values")))

    # Every member emitted the same merged scan: CSE keeps one.
    return PassResult(cse(merged.graph).graph, merged.counts)


def _merged_scans(graph: Graph, ops: list[int], ncarry: int) -> dict[int, tuple[Subgraph, list[int]]]:
    """For scans ``ops`` (same inputs): op -> (merged body, positions of its results in the merged results)."""

    bodies: list[Subgraph] = [graph.attrs_of(o)["body"] for o in ops]
    first = bodies[0]
    sb = GraphBuilder()
    params = [sb.input(t, name=first.graph.name_of(int(v))) for t, v in zip(first.in_types, first.graph.inputs,
                                                                             strict=True)]
    members, results = [], []
    for o, body in zip(ops, bodies, strict=True):
        if body.in_types != first.in_types:
            continue
        res = inline_body(sb, body, params)
        if results and [r.id for r in res[:ncarry]] != [r.id for r in results[0][:ncarry]]:
            continue  # a different carry: not the same loop
        members.append(o)
        results.append(res)
    if len(members) < 2:
        return {}
    outs = list(results[0][:ncarry])
    picks: list[list[int]] = []
    for res in results:
        picks.append([*range(ncarry), *range(len(outs), len(outs) + len(res) - ncarry)])
        outs.extend(res[ncarry:])
    sb.output(*outs)

    names = dict.fromkeys(graph.attrs_of(o)["body"].name for o in members)
    # DCE drops the ops of a body that did not join (its carry differs); it keeps every parameter
    body = Subgraph(dce(sb.freeze()).graph, name="+".join(n for n in names if n))
    return {o: (body, p) for o, p in zip(members, picks, strict=True)}


# ---------------------------------------------------------------- merging an op into one that extends it
def _layout(graph: Graph, op: int) -> tuple[Any, list[list[int]], list[str]] | None:
    """How a control op's inputs are laid out: (what must be equal, the groups of body parameters, the bodies)."""
    kind, ins, a = graph.kind_of(op), graph.op_inputs(op).tolist(), graph.attrs_of(op)
    if kind == "call":
        return (), [ins], ["body"]
    if kind == "cond":
        return (ins[0],), [ins[1:]], ["then_body", "else_body"]
    if kind == "scan":
        nc, ncarry = a["num_consts"], a["num_carry"]
        return (a["length"], a["reverse"]), [ins[:nc], ins[nc:nc + ncarry], ins[nc + ncarry:]], ["body"]
    if kind == "while_loop":
        nc = a["num_consts"]
        return (a["max_trip"],), [ins[:nc], ins[nc:]], ["cond_body", "body"]
    return None


def _param_map(small: list[list[int]], big: list[list[int]], carry_group: int | None) -> list[int] | None:
    """Where each parameter of the smaller op is among the bigger op's (same group, same value); None if one is not.

    Carries must map to distinct carries (two carries from one init may evolve differently; the bodies decide).
    """
    mapping, offset = [], 0
    for g, (s, bg) in enumerate(zip(small, big, strict=True)):
        used: set[int] = set()
        for v in s:
            pos = [i for i, w in enumerate(bg) if w == v and (g != carry_group or i not in used)]
            if not pos:
                return None
            used.add(pos[0])
            mapping.append(offset + pos[0])
        offset += len(bg)
    return mapping


def _same_results(small: Subgraph, big: Subgraph, mapping: list[int]) -> list[int] | None:
    """For each result of ``small``, a result of ``big`` that is the same value when ``small``'s parameters are
    ``big``'s at ``mapping`` (None if one is not found). Control ops inside are merged first (nested loops)."""
    if any(small.in_types[i] != big.in_types[m] for i, m in enumerate(mapping)):
        return None
    sb = GraphBuilder()
    params = [sb.input(t) for t in big.in_types]
    rb = inline_body(sb, big, params)
    rs = inline_body(sb, small, [params[m] for m in mapping])
    sb.output(*rb, *rs)
    g = cse(merge_subsumed(sb.freeze()).graph).graph
    outs = g.outputs.tolist()
    first: dict[int, int] = {}
    for j, v in enumerate(outs[:len(rb)]):
        first.setdefault(v, j)
    found = [first.get(v) for v in outs[len(rb):]]
    return None if any(j is None for j in found) else found  # type: ignore[return-value]


def _subsumed_outputs(graph: Graph, small: int, big: int) -> list[int] | None:
    """The outputs of op ``big`` that are op ``small``'s outputs, in order (None when ``big`` does not compute
    them all)."""
    kind = graph.kind_of(small)
    ls, lb = _layout(graph, small), _layout(graph, big)
    if ls is None or lb is None or ls[0] != lb[0]:
        return None
    loop = kind in LOOPS
    mapping = _param_map(ls[1], lb[1], 1 if loop else None)
    if mapping is None:
        return None
    sa, ba = graph.attrs_of(small), graph.attrs_of(big)
    picks: list[int] | None = None
    for name in ls[2]:
        found = _same_results(sa[name], ba[name], mapping)
        if found is None:
            return None
        if name == "cond_body":
            if found != [0]:
                return None
            continue
        if loop:
            # the carries: the small op's carry k must be the big op's carry it was mapped to, each trip
            nc_s, nc_b = len(ls[1][0]), len(lb[1][0])
            carries = [m - nc_b for m in mapping[nc_s:nc_s + len(ls[1][1])]]
            if found[:len(carries)] != carries:
                return None
            if any(j < len(lb[1][1]) for j in found[len(carries):]):
                return None  # a y that is a carry of the big loop is not stacked by it
        if picks is not None and found != picks:
            return None  # the branches of a cond must agree on where each result is
        picks = found
    return picks


def merge_subsumed(graph: Graph) -> PassResult:
    """Read a control op's results off another op of its kind that computes them too, and drop it.

    Op ``B`` subsumes op ``A`` (both ``call``, ``cond``, ``scan`` or
    ``while_loop``) when its inputs include ``A``'s in the same roles (each
    const among its consts, each carry among its carries, each x among its
    xs, the same predicate, trip count and direction) and its bodies,
    given those parameters, compute ``A``'s results (carry for carry; for a
    ``while_loop`` the same predicate). Forward mode makes such pairs: the
    tangent op of a loop carries the primal values beside their tangents
    (:mod:`opgraph.ops.control`, "tangent rules"), so after merging the loop
    runs once. Nested control ops are compared after merging theirs.
    ``counts['merge.subsumed']`` is the number of ops dropped.

    >>> import numpy as np, opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> def body(with_sum):
    ...     sb = opgraph.GraphBuilder()
    ...     c = sb.input(("float64", (2,)), name="c")
    ...     s = sb.input(("float64", ()), name="s") if with_sum else None   # one more carry
    ...     x = sb.input(("float64", (2,)), name="x")
    ...     c2 = sb.tanh(sb.add(c, x))
    ...     sb.output(*((c2, sb.add(s, sb.sum(c2))) if with_sum else (c2,)))
    ...     return Subgraph(sb.freeze())
    >>> b = opgraph.GraphBuilder()
    >>> c0, xs, s0 = b.input(("float64", (2,)), name="c0"), b.input(("float64", (5, 2)), name="xs"), \\
    ...     b.input(("float64", ()), name="s0")
    >>> h = b.op("scan", c0, xs, body=body(False), num_carry=1)
    >>> h2, total = b.op("scan", c0, s0, xs, body=body(True), num_carry=2)
    >>> b.output(h, total); g = b.freeze()
    >>> r = merge_subsumed(g)
    >>> r.counts, int((r.graph.op_kind == g.op_kind[0]).sum())
    ({'merge.subsumed': 1}, 1)
    >>> feeds = {"c0": np.zeros(2), "xs": np.ones((5, 2)), "s0": np.zeros(())}
    >>> all(np.array_equal(p, q) for p, q in zip(r.graph.run(feeds), g.run(feeds)))
    True
    """
    total = 0
    while True:
        graph, dropped = _merge_subsumed_once(graph)
        if not dropped:
            return PassResult(graph, {"merge.subsumed": total} if total else {})
        total += dropped
        # ops reading the merged results become equal (a cond's predicate, say): CSE them, then look again
        graph = cse(graph).graph


def _merge_subsumed_once(graph: Graph) -> tuple[Graph, int]:
    if not graph.subgraphs:
        return graph, 0
    kinds = {get_op(k).id for k in ("call", "cond", "scan", "while_loop")}
    ops = [int(o) for o in np.flatnonzero(np.isin(graph.op_kind, list(kinds)))]
    if len(ops) < 2:
        return graph, 0
    vmap = np.arange(graph.num_values, dtype=np.int64)
    keep = np.ones(graph.num_ops, dtype=bool)
    for a in ops:
        ins_a = set(graph.op_inputs(a).tolist())
        for b in ops:
            if b == a or not keep[b] or graph.op_kind[a] != graph.op_kind[b]:
                continue
            ins_b = graph.op_inputs(b)
            if len(ins_b) <= graph.op_inputs(a).size or not ins_a <= set(ins_b.tolist()):
                continue
            picks = _subsumed_outputs(graph, a, b)
            if picks is None:
                continue
            outs_a, outs_b = graph.op_outputs(a), graph.op_outputs(b)
            if any(graph.type_of(int(outs_a[i])) != graph.type_of(int(outs_b[j])) for i, j in enumerate(picks)):
                continue
            if graph.needed_ops(ins_b)[a]:
                continue  # b reads what a computes: a cannot read b's results
            vmap[outs_a] = vmap[outs_b[picks]]
            keep[a] = False
            break
    dropped = int((~keep).sum())
    if not dropped:
        return graph, 0
    # a dropped op's results may stand for another dropped op's (chains): follow them to the end
    for _ in range(dropped):
        vmap = vmap[vmap]
    return compact(graph, keep, vmap), dropped


# ---------------------------------------------------------------- merging scans that share inputs
def _trips(graph: Graph, op: int) -> int | None:
    a = graph.attrs_of(op)
    if a["length"] is not None:
        return int(a["length"])
    xs = graph.op_inputs(op)[a["num_consts"] + a["num_carry"]:]
    if not len(xs):
        return None
    shape = getattr(graph.type_of(int(xs[0])), "shape", None)
    return None if not shape or shape[0] is None else int(shape[0])


def _clusters(graph: Graph, scans: list[int]) -> list[list[int]]:
    """Groups of scans of one static trip count and direction, each sharing an input with another of its group,
    none reading what another computes."""
    groups: dict[Any, list[int]] = {}
    for op in scans:
        n = _trips(graph, op)
        if n is not None:
            groups.setdefault((n, graph.attrs_of(op)["reverse"]), []).append(op)
    out = []
    for ops in groups.values():
        pending = list(ops)
        while len(pending) > 1:
            first, rest = pending[0], pending[1:]
            cluster, seen = [first], set(graph.op_inputs(first).tolist())
            for op in rest:
                ins = graph.op_inputs(op)
                if seen.isdisjoint(ins.tolist()):
                    continue
                if any(graph.needed_ops(ins)[o] or graph.needed_ops(graph.op_inputs(o))[op] for o in cluster):
                    continue
                cluster.append(op)
                seen.update(ins.tolist())
            pending = [op for op in rest if op not in cluster]
            if len(cluster) > 1:
                out.append(cluster)
    return out


def _overlap_plan(graph: Graph, ops: list[int]) -> tuple[Subgraph, list[int], int, int, list[list[int]]] | None:
    """One scan for scans ``ops``: (body, inputs, num_consts, num_carry, per op the positions of its results),
    or None when the merged body would share nothing.

    Consts and xs that are the same value become one parameter. Carries with the same initial value are
    assumed to be one carry, and the assumption is checked: a group whose members' new carries are not one
    value (hash-consed) on the shared parameters is split, and the bodies are inlined again, until every
    group holds."""
    lay = []
    for op in ops:
        a, ins = graph.attrs_of(op), graph.op_inputs(op).tolist()
        nc, ncarry = a["num_consts"], a["num_carry"]
        lay.append((a["body"], ins[:nc], ins[nc:nc + ncarry], ins[nc + ncarry:]))
    consts = list(dict.fromkeys(v for _, c, _, _ in lay for v in c))
    xs = list(dict.fromkeys(v for _, _, _, x in lay for v in x))
    # carry groups: (member, carry index) -> group; split until each group's new carry is one value
    group: dict[tuple[int, int], int] = {}
    inits: list[int] = []
    for m, (_, _, k, _) in enumerate(lay):
        for i, v in enumerate(k):
            if v not in inits:
                inits.append(v)
            group[(m, i)] = inits.index(v)
    while True:
        ctype: dict[int, Any] = {}
        for (m, i), gid in group.items():
            ctype.setdefault(gid, lay[m][0].in_types[len(lay[m][1]) + i])
        sb = GraphBuilder()
        pc = {v: sb.input(graph.type_of(v)) for v in consts}
        pk = [sb.input(ctype[gid]) for gid in range(len(inits))]
        px = {}
        for body, c, k, x in lay:
            for j, v in enumerate(x):
                if v not in px:
                    px[v] = sb.input(body.in_types[len(c) + len(k) + j])
        results = []
        for m, (body, c, k, x) in enumerate(lay):
            args = [pc[v] for v in c] + [pk[group[(m, i)]] for i in range(len(k))] + [px[v] for v in x]
            if any(a.type != t for a, t in zip(args, body.in_types, strict=True)):
                return None
            results.append(inline_body(sb, body, args))
        new_of: dict[int, list[tuple[tuple[int, int], int]]] = {}
        for (m, i), gid in group.items():
            new_of.setdefault(gid, []).append(((m, i), results[m][i].id))
        split = False
        for gid, members in new_of.items():
            ids = [v for _, v in members]
            if len(set(ids)) > 1:
                split = True
                for key, v in members:
                    if v != ids[0]:  # a new group per differing new carry (same initial value)
                        group[key] = len(inits) + sorted(set(ids) - {ids[0]}).index(v)
                inits.extend(inits[gid] for _ in range(len(set(ids)) - 1))
        if not split:
            break
    carries = [next(results[m][i] for (m, i), g2 in group.items() if g2 == gid) for gid in range(len(inits))]
    ys: list[Any] = []
    picks = []
    for m, (_, _, k, _) in enumerate(lay):
        pos = [group[(m, i)] for i in range(len(k))]
        for y in results[m][len(k):]:
            ids = [v.id for v in ys]
            if y.id not in ids:
                ys.append(y)
                ids.append(y.id)
            pos.append(len(inits) + ids.index(y.id))
        picks.append(pos)
    sb.output(*carries, *ys)
    merged = dce(sb.freeze()).graph
    if merged.num_ops >= sum(body.graph.num_ops for body, _, _, _ in lay):
        return None  # nothing in common: separate loops are as good
    names = dict.fromkeys(body.name for body, _, _, _ in lay if body.name)
    return Subgraph(merged, name="+".join(names)), [*consts, *inits, *xs], len(consts), len(inits), picks


def merge_overlapping_scans(graph: Graph) -> PassResult:
    """Run scans of one trip count and direction that share inputs as one scan, computing what they share once.

    Consts and xs that are the same value are passed once; carries with the
    same initial value whose bodies compute the same new carry are one carry;
    the other carries and the ys are each scan's own. Scans merge only when
    some op of their bodies is shared (and neither reads the other's
    results). ``jacfwd`` makes such scans: one tangent scan per input element,
    each carrying the primal values; merged, the primal step runs once per
    trip for all of them. ``counts['merge.overlap']`` is the number of scans
    replaced. Not in :func:`opgraph.optimize`'s pipeline: the NumPy engine
    runs the merged loop faster, XLA the separate ones (docs/passes.md).

    >>> import numpy as np, opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> def body(k):
    ...     sb = opgraph.GraphBuilder()
    ...     c, t, x = (sb.input(("float64", (2,)), name=n) for n in "ctx")
    ...     c2 = sb.tanh(sb.add(c, x))
    ...     sb.output(c2, sb.add(sb.multiply(t, c2), sb.constant(np.full(2, float(k)))))
    ...     return Subgraph(sb.freeze(), name=f"tangent{k}")
    >>> b = opgraph.GraphBuilder()
    >>> c0, xs = b.input(("float64", (2,)), name="c0"), b.input(("float64", (5, 2)), name="xs")
    >>> t1, t2 = b.input(("float64", (2,)), name="t1"), b.input(("float64", (2,)), name="t2")
    >>> _, u1 = b.op("scan", c0, t1, xs, body=body(1), num_carry=2)
    >>> _, u2 = b.op("scan", c0, t2, xs, body=body(2), num_carry=2)
    >>> b.output(u1, u2); g = b.freeze()
    >>> r = merge_overlapping_scans(g)
    >>> r.counts, int((r.graph.op_kind == g.op_kind[0]).sum())
    ({'merge.overlap': 2}, 1)
    >>> r.graph.subgraphs[0].graph.num_ops    # add and tanh once; per tangent multiply, const, add
    8
    >>> feeds = {"c0": np.zeros(2), "xs": np.ones((5, 2)), "t1": np.ones(2), "t2": np.full(2, 2.0)}
    >>> all(np.allclose(p, q) for p, q in zip(r.graph.run(feeds), g.run(feeds)))
    True
    """
    if not graph.subgraphs:
        return PassResult(graph, {})
    scans = [int(o) for o in np.flatnonzero(graph.op_kind == get_op("scan").id)]
    if len(scans) < 2:
        return PassResult(graph, {})
    from opgraph.passes.base import Emitter

    e = Emitter(graph)
    order = graph.topological_order()
    pos = np.empty(graph.num_ops, dtype=np.int64)
    pos[order] = np.arange(graph.num_ops)
    merged = 0
    for ops in _clusters(graph, scans):
        plan = _overlap_plan(graph, ops)
        if plan is None:
            continue
        body, ins, nc, ncarry, picks = plan
        last = max(ops, key=lambda o: pos[o])
        a = graph.attrs_of(last)
        mark = e.checkpoint()
        e.root = last  # the merged scan is placed where the last of them was
        res = e.op("scan", *ins, body=body, num_consts=nc, num_carry=ncarry, length=_trips(graph, last),
                   reverse=a["reverse"])
        res = res if isinstance(res, tuple) else (res,)
        pairs = [(int(o), res[p]) for op, ps in zip(ops, picks, strict=True)
                 for o, p in zip(graph.op_outputs(op), ps, strict=True)]
        if any(graph.type_of(o) != e.type_of(n) for o, n in pairs):
            e.rollback(mark)
            continue
        for o, n in pairs:
            e.replace(o, n)
        merged += len(ops)
    if not merged:
        return PassResult(graph, {})
    return PassResult(e.finish(), {"merge.overlap": merged})
