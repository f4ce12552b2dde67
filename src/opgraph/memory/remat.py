"""Rematerialisation under a byte budget: recompute some values instead of keeping them.

:func:`rematerialize` rewrites a graph so that chosen values are kept only
until their first consumer; later consumers use a recomputed copy (its
producer cloned, recursively through other chosen values, as far as the
nearest kept value: Chen et al. 2016's checkpointed segments). Values are
chosen greedily: among the values used more than once, those holding the
most bytes for the longest first (bytes x lifetime in steps); a choice is kept only when the replanned
graph is smaller. It stops when the plan fits the budget, nothing helps, or
after ``max_trials`` replans.

    >>> import numpy as np, opgraph
    >>> from opgraph.memory.remat import rematerialize
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (1024,)), name="x")
    >>> hs = [x]
    >>> for _ in range(8):
    ...     hs.append(b.op("tanh", hs[-1]))
    >>> g = hs[-1]
    >>> for h in reversed(hs[1:-1]):          # a backward-like pass uses every h in reverse
    ...     g = b.op("multiply", g, h)
    >>> b.output(g)
    >>> r = rematerialize(b.freeze(), budget=5 * 8192)
    >>> r.fits, r.plan.total_bytes <= 5 * 8192 < r.original_bytes, r.extra_kernels > 0
    (True, True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Graph, Value
from opgraph.core.registry import CONST
from opgraph.memory.plan import PLANNED, MemoryPlan, plan_memory


@dataclass
class RematResult:
    """The rewritten graph, its plan, what was recomputed and what it costs."""

    graph: Graph
    plan: MemoryPlan
    budget: int
    original_bytes: int
    recomputed: list[int] = field(default_factory=list)
    """Value ids (in the original graph) kept only until their first use."""
    extra_kernels: int = 0
    """Kernel calls added per evaluation."""
    extra_bytes_computed: int = 0
    """Bytes of output the added kernels write per evaluation (a proxy for the extra compute)."""

    @property
    def fits(self) -> bool:
        """True when the plan is within the budget."""
        return self.plan.total_bytes <= self.budget


def rewrite(graph: Graph, chosen: set[int]) -> tuple[Graph, int, int]:
    """Copy ``graph``, making consumers after the first one of each chosen value use a recomputed clone.

    Returns the new graph, the number of cloned ops and the bytes they write.
    Value ids of inputs keep their order; outputs and update edges map to the copies.
    """
    b = GraphBuilder(hash_cons=False)
    new: dict[int, Value] = {}
    clone: dict[int, Value] = {}
    stats = [0, 0]
    for v in graph.inputs.tolist():
        new[v] = b.input(graph.type_of(v), name=graph.name_of(v))
    used_once: set[int] = set()

    def recompute(v: int) -> Value:
        hit = clone.get(v)
        if hit is None:
            op = int(graph.value_producer[v])
            args = [recompute(u) if u in chosen else new[u] for u in graph.op_inputs(op).tolist()]
            outs = b.op(int(graph.op_kind[op]), *args, **graph.attrs_of(op))
            outs = outs if isinstance(outs, tuple) else (outs,)
            hit = clone[v] = outs[int(graph.value_index[v])]
            stats[0] += 1
            stats[1] += int(sum(o.type.nbytes or 0 for o in outs))  # type: ignore[union-attr]
        return hit

    for op in graph.topological_order().tolist():
        if int(graph.op_kind[op]) == CONST.id:
            v = int(graph.op_outputs(op)[0])
            new[v] = b.constant(graph.constant_of(op))
            continue
        ins = graph.op_inputs(op).tolist()
        args = [recompute(u) if u in chosen and u in used_once else new[u] for u in ins]
        for u in ins:
            if u in chosen:
                used_once.add(u)
        outs = b.op(int(graph.op_kind[op]), *args, **graph.attrs_of(op))
        outs = outs if isinstance(outs, tuple) else (outs,)
        for v, o in zip(graph.op_outputs(op).tolist(), outs, strict=True):
            new[v] = o
    b.output(*(new[v] for v in graph.outputs.tolist()))
    for src, dst in graph.updates.tolist():
        b.update(new[src], new[dst])
    return b.freeze(), stats[0], stats[1]


def rematerialize(graph: Graph, budget: int, *, max_trials: int = 200) -> RematResult:
    """Choose values to recompute so the memory plan fits ``budget`` bytes (see the module doc).

    The outputs are the same values computed the same way, so results do not change.
    Two strategies run and the better result is returned (fits the budget,
    then fewer extra kernels, then fewer bytes): the greedy above, and Chen et
    al.'s segments: the candidates in schedule order, every k-th kept as a
    checkpoint and the others recomputed, for each k.
    """
    plan = plan_memory(graph)
    result = RematResult(graph, plan, budget, plan.total_bytes)
    chosen: set[int] = set()
    ptr, _cons = graph.consumers()
    trials = 0
    base = plan_memory(graph)  # lifetimes in the original graph rank the candidates
    cands = [v for v in base.placement
             if base.kind[v] == PLANNED and v not in base.targets and ptr[v + 1] - ptr[v] >= 2]
    cands.sort(key=lambda v: (-(base.nbytes[v] or 0) * (base.end[v] - base.start[v]), v))
    while result.plan.total_bytes > budget and trials < max_trials:
        improved = False
        for v in cands:
            if v in chosen:
                continue
            trials += 1
            g2, n_extra, b_extra = rewrite(graph, chosen | {v})
            p2 = plan_memory(g2)
            if p2.total_bytes < result.plan.total_bytes:
                chosen.add(v)
                result = RematResult(g2, p2, budget, result.original_bytes, sorted(chosen), n_extra, b_extra)
                improved = True
                break
            if trials >= max_trials:
                break
        if not improved:
            break
    by_start = sorted(cands, key=lambda v: (base.start[v], v))
    best = result
    for k in range(2, len(by_start) + 1):
        if trials >= 2 * max_trials:
            break
        trials += 1
        pick = {v for i, v in enumerate(by_start) if i % k != k - 1}
        g2, n_extra, b_extra = rewrite(graph, pick)
        p2 = plan_memory(g2)
        cand = RematResult(g2, p2, budget, result.original_bytes, sorted(pick), n_extra, b_extra)
        if _key(cand) < _key(best):
            best = cand
    return best


def _key(r: RematResult) -> tuple[bool, int, int]:
    if r.fits:
        return (False, r.extra_kernels, r.plan.total_bytes)
    return (True, r.plan.total_bytes, r.extra_kernels)
