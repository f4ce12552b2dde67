"""``make bench`` table for the optimiser: pass throughput at 10^6 ops, and the elementwise-fusion measurement.

``table(console, run)`` is called by bench/run.py; ``run(script, *args)`` runs a
bench script in its own process and returns the JSON of its last line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table


def table(console: Console, run: Callable[..., Any]) -> None:
    n = int(os.environ.get("OPGRAPH_BENCH_N", "1000000"))
    og = run("passes_scale.py", "--lib", "opgraph", "--n", str(n))
    fx = None
    try:
        import importlib.util

        if importlib.util.find_spec("torch") is not None:
            fx = run("passes_scale.py", "--lib", "torchfx", "--n", str(n // 10), "--repeat", "1")
    except (ImportError, ValueError):
        fx = None
    if og is not None:
        t = Table(title=f"optimiser passes on a {og['ops']:,}-op graph (medians of 3 runs, 1 thread)")
        for col in ("pass", "seconds", "ops/s", "target ops/s", "rewrites", "peer"):
            t.add_column(col, justify="left" if col == "pass" else "right")
        peer = f"torch.fx DCE {fx['ops'] / fx['dce']:,.0f} ops/s ({fx['ops']:,} ops)" if fx else "-"
        rows = [("dce (vectorised)", "dce", 1e6, og["dce_changed"], peer),
                ("cse (vectorised)", "cse", 1e6, og["cse_changed"], "none in torch.fx core"),
                ("rules + folding (one walk)", "rules", 2e5, og["rules_changed"], "none in torch.fx core"),
                ("optimize(level=2), to a fixed point", "optimize", None, og["ops"] - og["ops_after"], "-")]
        for label, key, target, changed, p in rows:
            rate = og["ops"] / og[key]
            t.add_row(label, f"{og[key]:.3f}", f"{rate:,.0f}", f"{target:,.0f}" if target else "-", f"{changed:,}", p)
        console.print(t)
    fu = run("passes_fusion.py")
    if fu is not None:
        t = Table(title="fusing a 7-op elementwise chain (float64, 1 thread): microseconds per evaluation")
        t.add_column("elements", justify="right")
        kinds = [k for k in ("unfused", "scratch", "numexpr", "numba", "graph_unfused", "graph_fused")
                 if k in fu[str(fu["sizes"][0])]]
        for k in kinds:
            t.add_column(k, justify="right")
        for size in fu["sizes"]:
            row = fu[str(size)]
            t.add_row(f"{size:,}", *(f"{row[k]:,.1f}" for k in kinds))
        console.print(t)
        console.print("scratch: the NumPy fused kernel (same ufuncs, one buffer reused with out=) - bit-identical "
                      "to unfused; numexpr is not guaranteed to be (its own tanh) and is slower single-threaded here. "
                      "graph_*: the same chain run by the executor before and after optimize(level=3).")
