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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from opgraph.core.graph import Graph
from opgraph.passes.base import PassResult, merge_counts
from opgraph.passes.dce import cse, dce
from opgraph.passes.rewrite import FOLD_LIMIT, rewrite
from opgraph.passes.rules import FUSE, FUSE_ELEMENTWISE, FUSE_UPDATES, LAYOUT, SIMPLIFY

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
    1: "dce, cse, constant folding, algebraic simplification (exact rules; more with fast_math)",
    2: "level 1, then optimiser-update fusion, fma, transposes absorbed into matmul, einsum split along its path",
    3: "level 2, then chains of elementwise ops fused into one fused_elementwise kernel",
}


def pipeline_for(level: int, *, fast_math: bool = False, fold_limit: int = FOLD_LIMIT) -> Pipeline:
    """The pipeline :func:`optimize` runs at ``level``.

    >>> [n for n, _ in pipeline_for(2).passes]
    ['dce', 'cse', 'simplify', 'fuse_updates', 'fuse', 'layout']
    """
    flags = ("fast_math",) if fast_math else ()
    passes: list[tuple[str, PassFn]] = []
    if level >= 1:
        passes += [("dce", dce), ("cse", cse),
                   ("simplify", partial(rewrite, rules=SIMPLIFY, fold=True, fold_limit=fold_limit, flags=flags))]
    if level >= 2:
        passes += [("fuse_updates", partial(rewrite, rules=FUSE_UPDATES, flags=flags)),
                   ("fuse", partial(rewrite, rules=FUSE, flags=flags)),
                   ("layout", partial(rewrite, rules=LAYOUT, flags=flags))]
    if level >= 3:
        passes += [("fuse_elementwise", partial(rewrite, rules=FUSE_ELEMENTWISE, flags=flags))]
    return Pipeline(passes)


def optimize(graph: Graph, level: int = 2, *, report: bool | str = False, fast_math: bool = False,
             fold_limit: int = FOLD_LIMIT) -> Any:
    """Optimise ``graph`` (never mutated) and return the new graph.

    ``level`` 0 to 3 (see ``LEVELS``). ``fast_math`` allows rules exact
    only outside IEEE special cases (x * 0 -> 0 for floats, log(exp(x)) -> x,
    ...). ``report=True`` prints ops and values before and after and how often
    each rule fired; ``report="data"`` returns the :class:`OptimizeReport`
    (its ``graph`` is the result) instead of the graph.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2, 3)), name="x")
    >>> b.output(b.permute_dims(b.permute_dims(x)))
    >>> optimize(b.freeze()).num_ops
    0
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {sorted(LEVELS)}, got {level!r}")
    rep = pipeline_for(level, fast_math=fast_math, fold_limit=fold_limit).run(graph)
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
