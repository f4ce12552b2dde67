"""Pipelines of passes run to a fixed point, and :func:`optimize`.

    >>> import opgraph
    >>> from opgraph.passes import optimize
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("int64", (4,)), name="x")
    >>> b.output(b.add(b.multiply(x, 0), b.negative(b.negative(x))))
    >>> r = optimize(b.freeze(), level=1, report="data")
    >>> r.counts
    {'multiply_zero': 1, 'negative_negative': 1, 'add_zero': 1}
    >>> (r.ops_before, r.ops_after)
    (5, 0)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from opgraph.core import progress
from opgraph.core.graph import Graph
from opgraph.core.registry import get_op, has_trait
from opgraph.core.types import TensorType
from opgraph.passes.base import PassResult, merge_counts, use_counts
from opgraph.passes.control import (
    BodyOptimizer,
    hoist_invariants,
    merge_sibling_scans,
    merge_subsumed,
)
from opgraph.passes.dce import cse, dce
from opgraph.passes.rewrite import FOLD_LIMIT, P, Rule, RuleSet, rewrite
from opgraph.passes.rules import FOLD_AFFINE, FUSE, FUSE_ELEMENTWISE, FUSE_UPDATES, LAYOUT, SIMPLIFY

PassFn = Callable[[Graph], PassResult]


@dataclass
class OptimizeReport:
    """What :func:`optimize` did: sizes before and after, rule counts, seconds per pass."""

    graph: Graph
    ops_before: int
    values_before: int
    ops_after: int
    values_after: int
    counts: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    iterations: int = 0

    def rows(self) -> list[tuple[str, str]]:
        """The report as (what, how many) rows.

        >>> OptimizeReport(None, 3, 4, 1, 2, {"fma": 1}).rows()[:3]  # doctest: +NORMALIZE_WHITESPACE
        [('ops', '3 -> 1'), ('values', '4 -> 2'), ('iterations', '0')]
        """
        out = [("ops", f"{self.ops_before} -> {self.ops_after}"),
               ("values", f"{self.values_before} -> {self.values_after}"),
               ("iterations", str(self.iterations))]
        out += [(f"rule {k}", str(v)) for k, v in sorted(self.counts.items())]
        out += [(f"seconds {k}", f"{v:.4f}") for k, v in self.seconds.items()]
        return out

    def __str__(self) -> str:
        width = max(len(a) for a, _ in self.rows())
        return "\n".join(f"{a:<{width}}  {b}" for a, b in self.rows())


@dataclass
class Pipeline:
    """Named passes run in order, repeatedly, until none changes the graph (at most ``max_iterations``)."""

    passes: Sequence[tuple[str, PassFn]]
    max_iterations: int = 8

    def run(self, graph: Graph) -> OptimizeReport:
        """Run to a fixed point; the report holds the final graph."""
        rep = OptimizeReport(graph, graph.num_ops, graph.num_values, 0, 0)
        g = graph
        for it in range(self.max_iterations):
            rep.iterations = it + 1
            changed = False
            for name, fn in self.passes:
                t0 = time.perf_counter()
                # one step that is not divided further: a task without a total (the bar shows it running)
                with progress.task(f"optimize: {name} (round {it + 1}, {g.num_ops:,} ops)"):
                    r = fn(g)
                rep.seconds[name] = rep.seconds.get(name, 0.0) + time.perf_counter() - t0
                if r.changed:
                    changed = True
                    merge_counts(rep.counts, r.counts)
                    g = r.graph
            if not changed:
                break
        rep.graph = g
        rep.ops_after, rep.values_after = g.num_ops, g.num_values
        return rep


LEVELS = {
    0: "nothing",
    1: "dce, cse, constant folding, algebraic simplification (exact rules; more with fast_math), all of it "
       "inside control-flow bodies too, and loop-invariant ops hoisted out of scan and while_loop bodies",
    2: "level 1, then constant per-channel scales and shifts folded into the conv or matmul before them, "
       "optimiser-update fusion, fma, transposes absorbed into matmul, einsum split along its path",
    3: "level 2, then chains of elementwise ops fused into one fused_elementwise kernel",
}


@dataclass(frozen=True)
class FusionCost:
    """When ``fuse_elementwise`` fuses a region of elementwise ops: the NumPy engine's cost model.

    A region is what the fusion rules would make one ``fused_elementwise`` op: an elementwise op
    with its single-use elementwise producers, transitively. The NumPy kernel of a fused op runs its
    steps block by block in cache (``opgraph.backends.numpy.fused.BLOCK_BYTES``); that pays only where the
    unfused ops would stream their arrays through memory several times: a result of at least
    ``min_bytes`` bytes and at least ``min_steps`` steps. For elements wider than ``narrow_itemsize``
    bytes only the memory-bound steps count (kinds without the ``compute_bound`` trait): float64 transcendental
    loops are slow enough that memory traffic does not matter. Unless ``broadcast``, every operand of
    the region has the result's shape or one element: an operand broadcast to the result (a bias
    of shape (1, C, 1, 1)) makes the blocks strided and the fused kernel no faster (measured 0.99-1.02x
    on a CNN's bias + residual + relu). Elsewhere each unfused op already
    runs in place on planned memory as fast, and the fused kernel's per-call and per-block work
    makes it slower (measured in docs/passes.md). ``None`` as the cost of :func:`optimize`
    fuses every region (for engines that compile fused ops themselves, and for tests).

    >>> FusionCost().pays(20, 0, 16 << 20, 4), FusionCost().pays(2, 2, 16 << 20, 4)
    (True, False)
    >>> FusionCost().pays(20, 0, 16 << 20, 8), FusionCost().pays(3, 3, 16 << 20, 8)
    (False, True)
    """

    min_steps: int = 3
    min_bytes: int = 4 << 20
    narrow_itemsize: int = 4
    broadcast: bool = False

    def pays(self, steps: int, memory_bound: int, nbytes: int, itemsize: int) -> bool:
        """True when a region of ``steps`` steps (``memory_bound`` of them not compute-bound) and a
        result of ``nbytes`` bytes, ``itemsize`` bytes an element, is worth fusing."""
        counted = steps if itemsize <= self.narrow_itemsize else memory_bound
        return counted >= self.min_steps and nbytes >= self.min_bytes


NUMPY_COST = FusionCost()
"""The cost model :func:`optimize` uses by default (the NumPy engine's)."""


def fusion_regions(graph: Graph, cost: FusionCost) -> np.ndarray:
    """Per op, True when it belongs to an elementwise region that ``cost`` says is worth fusing.

    Regions follow the edges the fusion rules inline: a value that is the only output of a fusable
    op (or of a ``fused_elementwise`` op), used once, by a fusable op. A region's steps are its ops
    (a ``fused_elementwise`` op counts its program's steps); its result is its last op's output.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> h = x = b.input(("float32", (1 << 21,)))
    >>> for _ in range(8):
    ...     h = b.op("sin", h)
    >>> c = b.op("cos", x)                      # used twice: a region of its own, one step
    >>> b.output(b.op("add", h, c), c)
    >>> fusion_regions(b.freeze(), FusionCost()).tolist()
    [True, True, True, True, True, True, True, True, False, True]
    """
    from opgraph.ops.fused import fusable

    no = graph.num_ops
    fused_id = get_op("fused_elementwise").id
    kinds = np.unique(graph.op_kind).tolist()
    ok_kind = {k for k in kinds if k == fused_id or fusable(get_op(k).name)}
    is_fus = np.isin(graph.op_kind, sorted(ok_kind))
    weight = is_fus.astype(np.int64)
    light = np.isin(graph.op_kind, sorted(k for k in ok_kind if "compute_bound" not in get_op(k).traits)) & is_fus
    light = light.astype(np.int64)
    for op in np.flatnonzero(graph.op_kind == fused_id).tolist():
        program = graph.attrs_of(op)["program"]
        weight[op] = len(program)
        light[op] = sum(not has_trait(step[0], "compute_bound") for step in program)
    # parent[p] = the op that inlines p's output (-1: p ends its region)
    parent = np.full(no, -1, dtype=np.int64)
    uses = use_counts(graph)
    n_out = np.diff(graph.out_ptr)
    cons = np.repeat(np.arange(no), np.diff(graph.in_ptr))
    v = graph.in_ids.astype(np.int64)
    prod = graph.value_producer[v].astype(np.int64)
    edge = (prod >= 0) & is_fus[cons] & (uses[v] == 1)
    edge[edge] &= is_fus[prod[edge]] & (n_out[prod[edge]] == 1) & (graph.value_index[v[edge]] == 0)
    parent[prod[edge]] = cons[edge]
    root = np.where(parent >= 0, parent, np.arange(no))
    while True:  # pointer jumping: O(n log depth), vectorised
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    steps = np.bincount(root, weights=weight, minlength=no).astype(np.int64)
    mem = np.bincount(root, weights=light, minlength=no).astype(np.int64)
    keep = np.zeros(no, dtype=bool)
    shape_of: dict[int, Any] = {}
    for r in np.flatnonzero((steps >= cost.min_steps) & is_fus & (parent < 0)).tolist():
        t = graph.type_of(int(graph.out_ids[graph.out_ptr[r]]))
        if isinstance(t, TensorType) and t.is_static and cost.pays(
                int(steps[r]), int(mem[r]), t.size * t.dtype.itemsize, t.dtype.itemsize):
            keep[r] = True
            shape_of[r] = t.shape
    if not cost.broadcast and keep.any():
        # operands of kept regions (inputs not inlined): the result's shape or one element, else not kept
        for s in np.flatnonzero(keep[root[cons]] & is_fus[cons] & ~edge).tolist():
            r = int(root[cons[s]])
            t = graph.type_of(int(v[s]))
            if not (isinstance(t, TensorType) and t.shape is not None and (t.shape == shape_of[r] or t.size == 1)):
                keep[r] = False
    return keep[root] & is_fus


def _where_also(rules: RuleSet, pred: Callable[[Any], bool]) -> RuleSet:
    out = RuleSet()
    for r in rules:
        w = r.where
        out.add(Rule(r.name, r.pattern, r.replace, r.exact, r.flag,
                     pred if w is None else (lambda m, w=w: w(m) and pred(m)), r.index))
    return out


def _approx(m: Any) -> int:
    return m.op("fused_elementwise", *m.root_ins, program=m.root_attrs["program"], approx=True)  # type: ignore[no-any-return]


APPROX = RuleSet().add(Rule(
    "fused_elementwise_approx", P("fused_elementwise", attrs=lambda a: not a["approx"]), _approx, flag="fast_math",
    exact="not exact: with approx the kernel may run a compiled float32 loop whose exp, log, sin, cos and tanh are "
          "within a few ulp of NumPy's (opgraph.backends.numpy.fused.APPROX_ULP); fast_math only"))
"""With ``fast_math``, every ``fused_elementwise`` op gets ``approx=True`` (see the op's doc)."""


def fuse_elementwise(graph: Graph, *, cost: FusionCost | None = NUMPY_COST, flags: Iterable[str] = ()) -> PassResult:
    """The ``fuse_elementwise`` pass: the ``FUSE_ELEMENTWISE`` rules, on the regions ``cost`` says pay.

    Regions are decided on the whole graph before any rule fires (:func:`fusion_regions`), so a
    region is fused entirely or not at all, and a graph the pass returns is a fixed point of it.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (1000,)))
    >>> b.output(b.op("exp", b.op("sin", x)))
    >>> g = b.freeze()
    >>> fuse_elementwise(g).graph is g, fuse_elementwise(g, cost=None).counts
    (True, {'fuse_elementwise.exp': 1})
    """
    flags = frozenset(flags)
    if cost is None:
        res = rewrite(graph, FUSE_ELEMENTWISE, flags=flags)
    else:
        allowed = fusion_regions(graph, cost)
        res = PassResult(graph, {}) if not allowed.any() else \
            rewrite(graph, _where_also(FUSE_ELEMENTWISE, lambda m: bool(allowed[m.e.root])), flags=flags)
    if "fast_math" not in flags:
        return res
    approx = rewrite(res.graph, APPROX, flags=flags)
    if not approx.changed:
        return res
    counts = dict(res.counts)
    merge_counts(counts, approx.counts)
    return PassResult(approx.graph, counts)


def pipeline_for(level: int, *, fast_math: bool = False, fold_limit: int = FOLD_LIMIT,
                 cost: FusionCost | None = NUMPY_COST) -> Pipeline:
    """The pipeline :func:`optimize` runs at ``level`` (``cost``: when to fuse elementwise regions).

    Every level from 1 starts with ``bodies``: the same pipeline run on each control-flow body
    (:class:`~opgraph.passes.control.BodyOptimizer`, each distinct body once), and ends with
    ``hoist`` (:func:`~opgraph.passes.control.hoist_invariants`).

    >>> [n for n, _ in pipeline_for(2).passes]
    ['bodies', 'dce', 'cse', 'simplify', 'fold_affine', 'fuse_updates', 'fuse', 'layout', 'merge_subsumed',
     'merge_scans', 'hoist']
    """
    flags = ("fast_math",) if fast_math else ()
    passes: list[tuple[str, PassFn]] = []
    if level >= 1:
        passes += [("dce", dce), ("cse", cse),
                   ("simplify", partial(rewrite, rules=SIMPLIFY, fold=True, fold_limit=fold_limit, flags=flags))]
    if level >= 2:
        passes += [("fold_affine", partial(rewrite, rules=FOLD_AFFINE, flags=flags)),
                   ("fuse_updates", partial(rewrite, rules=FUSE_UPDATES, flags=flags)),
                   ("fuse", partial(rewrite, rules=FUSE, flags=flags)),
                   ("layout", partial(rewrite, rules=LAYOUT, flags=flags))]
    if level >= 3:
        passes += [("fuse_elementwise", partial(fuse_elementwise, cost=cost, flags=flags))]
    pipe = Pipeline(passes)
    if level >= 1:
        # Bodies first (bottom-up: the run on a body optimises its own bodies first); hoisting last, on
        # simplified bodies. One BodyOptimizer per pipeline: each distinct body is optimised once.
        bodies = BodyOptimizer(lambda g: _as_result(pipe.run(g)))
        pipe.passes = [("bodies", bodies), *passes, ("merge_subsumed", merge_subsumed),
                       ("merge_scans", merge_sibling_scans), ("hoist", hoist_invariants)]
    return pipe


def _as_result(rep: OptimizeReport) -> PassResult:
    return PassResult(rep.graph, rep.counts)


def optimize(graph: Graph, level: int = 2, *, report: bool | str = False, fast_math: bool = False,
             fold_limit: int = FOLD_LIMIT, cost: FusionCost | None = NUMPY_COST) -> Any:
    """Optimise ``graph`` (never mutated) and return the new graph.

    ``level`` 0 to 3 (see ``LEVELS``). ``fast_math`` allows rules exact
    only outside IEEE special cases (x * 0 -> 0 for floats, log(exp(x)) -> x,
    ...). ``report=True`` prints ops and values before and after and how often
    each rule fired; ``report="data"`` returns the :class:`OptimizeReport`
    (its ``graph`` is the result) instead of the graph. ``cost`` (a :class:`FusionCost`) says which
    elementwise regions level 3 fuses; the default is the NumPy engine's, None fuses them all.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2, 3)), name="x")
    >>> b.output(b.permute_dims(b.permute_dims(x)))
    >>> optimize(b.freeze()).num_ops
    0
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {sorted(LEVELS)}, got {level!r}")
    rep = pipeline_for(level, fast_math=fast_math, fold_limit=fold_limit, cost=cost).run(graph)
    if report == "data":
        return rep
    if report:
        print_report(rep)
    return rep.graph


def print_report(rep: OptimizeReport) -> None:
    """Print a report as a table (rich when available)."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        print(rep)
        return
    table = Table(title="opgraph.optimize")
    table.add_column("what")
    table.add_column("count", justify="right")
    for a, b in rep.rows():
        table.add_row(a, b)
    Console().print(table)
