"""``make bench`` tables (issue 37): forward mode and batching against JAX and CasADi, each in its own process.

``python bench/run.py forward`` runs bench/forward_batch.py for every library and engine of three workloads
(bench/forward_workloads.py) and prints one table per workload, written to bench/results/forward.md:

1. **hvp** of the 10^4-parameter chained-Rosenbrock least-squares loss: ``opgraph.jit`` of ``opgraph.hvp`` on
   each engine, ``jax.jit`` of ``jax.jvp(jax.grad(loss))`` and CasADi's ``jtimes`` of the SX gradient.
2. **jacfwd** of a 100-step RK4 Lotka-Volterra trajectory (200 outputs) with respect to its 3 parameters: the loop
   as one ``scan`` (``opgraph.scan``, ``jax.lax.scan``) on each array engine, and unrolled on the numpy, numba and
   c engines (the scalar engines of bench/finegrained.py); CasADi's
   ``jacobian`` of the unrolled SX trajectory (forward mode).
3. **per-example gradients**: ``vmap(grad(loss), in_axes=(None, 0, 0))`` of a 64-128-10 tanh MLP over 256
   examples, opgraph on each engine against JAX.

Every process checks its result against the workload's reference before timing. Each figure is the median over
``OPGRAPH_BENCH_FWD_ROUNDS`` (3) processes run interleaved (so that a busy moment on the machine hits every
library alike), each the median of 7 samples of ~20 ms of calls. "vs peer" is the run time over the faster
peer's (JAX or CasADi): the issue's goal is <= 1.1 for the best engine. ``OPGRAPH_BENCH_FWD_CASES`` (all)
picks workloads: ``hvp,ode,pergrad``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from table_jit import _version, run_limited
from tables import emit

RESULTS = Path(__file__).resolve().parent / "results" / "forward.md"
GOAL = 1.1
LIMIT = 300.0  # seconds per process; the unrolled RK4's first call on the numpy engine takes ~20 s
ENGINES = ("numpy", "jax", "torch")  # the array engines
# the scalar engines for the unrolled loop (on a scan they run the body step by step through the numpy engine)
UNROLLED = ("numpy", "numba", "c")
PEERS = ("jax", "casadi")

Result = dict[str, Any]

# (row label, arguments) per workload; the first rounds-many runs of each are interleaved
CASES: dict[str, list[tuple[str, list[str]]]] = {
    "hvp": [*((f"opgraph jit, {e}", ["--lib", "opgraph", "--backend", e]) for e in ENGINES),
            ("jax.jit", ["--lib", "jax"]), ("CasADi SX", ["--lib", "casadi"])],
    "ode": [*((f"opgraph jit, {e}, scan", ["--lib", "opgraph", "--backend", e]) for e in ENGINES),
            *((f"opgraph jit, {e}, unrolled", ["--lib", "opgraph", "--backend", e, "--variant", "unrolled"])
              for e in UNROLLED),
            ("jax.jit, lax.scan", ["--lib", "jax"]), ("CasADi SX, unrolled", ["--lib", "casadi"])],
    "pergrad": [*((f"opgraph jit, {e}", ["--lib", "opgraph", "--backend", e]) for e in ENGINES),
                ("jax.jit", ["--lib", "jax"])],
}
ONCE = {f"opgraph jit, {e}, unrolled" for e in UNROLLED}  # ~20 s to trace and build: one process, not rounds
TITLES = {
    "hvp": "hvp of a 10^4-parameter least-squares loss (chained Rosenbrock), H v by forward over reverse",
    "ode": "jacfwd of a 100-step RK4 Lotka-Volterra trajectory (200 outputs) w.r.t. 3 parameters",
    "pergrad": "vmap(grad) of a 64-128-10 tanh MLP's squared error: per-example gradients of 256 examples",
}
COLUMNS = ["library", "first call s", "trace / optimize / compile s", "run µs", "vs peer", "ops", "rel. error"]


def merge(rounds: list[Result]) -> Result:
    """One row from a case's processes: the median of each timing; the first error wins."""
    for r in rounds:
        if "error" in r:
            return r
    out = dict(rounds[0])
    for key in ("first_s", "call_s", "trace_s", "optimize_s", "compile_s", "lower_s", "xla_compile_s"):
        if key in out:
            out[key] = statistics.median(r[key] for r in rounds)
    out["spread"] = (min(r["call_s"] for r in rounds), max(r["call_s"] for r in rounds))
    return out


def _phases(r: Result) -> str:
    if "trace_s" in r:
        return f"{r['trace_s']:.3g} / {r['optimize_s']:.3g} / {r['compile_s']:.3g}"
    if "lower_s" in r:
        return f"{r['lower_s']:.3g} (trace+lower) / - / {r['xla_compile_s']:.3g}"
    return "-"


def _ops(r: Result) -> str:
    if "optimized_ops" in r:
        return f"{r['ops']:,} -> {r['optimized_ops']:,}"
    return f"{r['ops']:,}" if "ops" in r else "-"


def rows_of(results: dict[str, Result]) -> tuple[list[list[str]], list[str]]:
    """The table's rows and the lines saying how the best opgraph engine compares with the faster peer."""
    ok = {name: r for name, r in results.items() if "error" not in r}
    peers = {n: r["call_s"] for n, r in ok.items() if r["lib"] in PEERS}
    peer = min(peers.values()) if peers else None
    rows = []
    for name, r in results.items():
        if "error" in r:
            rows.append([name, r["error"]] + ["-"] * (len(COLUMNS) - 2))
            continue
        lo, hi = r["spread"]
        rows.append([name, f"{r['first_s']:.3g}", _phases(r),
                     f"{r['call_s'] * 1e6:,.4g} ({lo * 1e6:,.3g}-{hi * 1e6:,.3g})",
                     f"{r['call_s'] / peer:.2f}x" if peer else "-", _ops(r), f"{r['error_rel']:.0e}"])
    ours = {n: r["call_s"] for n, r in ok.items() if r["lib"] == "opgraph"}
    summary = []
    if ours and peer:
        best = min(ours, key=ours.__getitem__)
        fastest = min(peers, key=peers.__getitem__)
        ratio = ours[best] / peer
        summary.append(f"best opgraph engine: {best}, {ratio:.2f}x {fastest} (goal <= {GOAL}x: "
                       f"{'met' if ratio <= GOAL else 'not met'})")
    return rows, summary


def table(console: Console, run: Callable[..., Result | None]) -> None:  # run_limited, not run: it needs a limit
    """Run bench/forward_batch.py for each workload and library; print the tables, write bench/results/forward.md."""
    n_rounds = int(os.environ.get("OPGRAPH_BENCH_FWD_ROUNDS", "3"))
    which = os.environ.get("OPGRAPH_BENCH_FWD_CASES", ",".join(CASES)).split(",")
    header = f"python {sys.version.split()[0]}, " + ", ".join(
        f"{name} {_version(name)}" for name in ("opgraph", "numpy", "jax", "jaxlib", "torch", "casadi"))
    header += f"; {os.cpu_count()} cores; BLAS/OpenMP/XLA/torch threads 1; float64"
    console.print(header)
    md = [f"## Forward mode and batching against JAX and CasADi ({time.strftime('%Y-%m-%d %H:%M')})", "",
          f"Command: `python bench/run.py forward`; {header}", ""]
    progress = Console(stderr=True)
    for case in which:
        rounds: dict[str, list[Result]] = {name: [] for name, _ in CASES[case]}
        for k in range(n_rounds):
            for name, args in CASES[case]:
                if k and (name in ONCE or "error" in rounds[name][0]):
                    continue
                progress.print(f"[dim]forward: {case} {name} (round {k + 1}) ...[/dim]")
                rounds[name].append(run_limited("forward_batch.py", ["--case", case, *args], LIMIT))
        results = {name: merge(rs) for name, rs in rounds.items()}
        rows, summary = rows_of(results)
        once = [name for name, _ in CASES[case] if name in ONCE]
        once = f" (one for {', '.join(once)})" if once and n_rounds > 1 else ""
        notes = [
            *summary,
            f"medians of {n_rounds} processes{once}, each the median of 7 samples "
            "of ~20 ms of calls; run µs gives the processes' spread in brackets. first call: building the "
            "function and its first call at this size, after the same path at a tiny size (imports and engine "
            "start-up not counted). trace / optimize / compile: opgraph.jit's phases (compile_times); JAX: "
            "jit(f).lower() and .compile() of a second jax.jit. ops: the traced -> optimised graph (JAX: jaxpr "
            "equations; CasADi: the Function's instructions).",
        ]
        if case == "hvp":
            notes.append("CasADi: SX (MX takes 12 ms per call here: its slices of a 10^4 vector are gathers).")
        if case == "ode":
            notes.append("jax.jit(jax.jacfwd(...)) of the unrolled loop is not run: XLA's compile took 21 s at 10 "
                         "steps, and over 5 min and 7.7 GB at 100 steps.")
        emit(console, md, TITLES[case], COLUMNS, rows, notes)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text("\n".join(md))
    console.print(f"written: {RESULTS}")
