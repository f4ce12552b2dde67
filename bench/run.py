"""``make bench``: run every benchmark, each library in its own process, and print the tables.

Thread counts for BLAS/OpenMP are set to 1 for every process (the Makefile
exports them; this script sets them again for the children).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")}


def run(script: str, *args: str) -> dict | None:
    env = {**os.environ, **THREADS}
    proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        Console(stderr=True).print(f"[red]{script} {' '.join(args)} failed:[/red]\n{proc.stderr[-2000:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def have(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def graph_scale(console: Console) -> None:
    n = int(os.environ.get("OPGRAPH_BENCH_N", "1000000"))
    og = run("graph_scale.py", "--lib", "opgraph", "--n", str(n))
    fx = run("graph_scale.py", "--lib", "torchfx", "--n", str(n // 10), "--repeat", "1") if have("torch") else None
    table = Table(title=f"graph scale: a chain of {n:,} elementwise ops (medians of 3 runs, 1 thread)")
    table.add_column("step")
    table.add_column("opgraph s", justify="right")
    table.add_column("opgraph ops/s", justify="right")
    table.add_column(f"torch.fx ops/s ({n // 10:,} ops)" if fx else "torch.fx", justify="right")
    table.add_column("opgraph / torch.fx", justify="right")
    if og is None:
        return
    for step, fx_step in (("build", "build"), ("freeze", None), ("verify", "verify"), ("toposort", None),
                          ("toposort_unordered", None)):
        rate = og["n"] / og[step]
        fx_rate = fx["n"] / fx[fx_step] if fx and fx_step else None
        table.add_row(step, f"{og[step]:.3f}", f"{rate:,.0f}", f"{fx_rate:,.0f}" if fx_rate else "-",
                      f"{rate / fx_rate:.1f}x" if fx_rate else "-")
    table.add_row("bytes per op", f"{og['bytes_per_op']:.1f}", "", f"{fx['bytes_per_op']:.0f}" if fx else "-",
                  f"{fx['bytes_per_op'] / og['bytes_per_op']:.0f}x smaller" if fx else "-")
    console.print(table)
    console.print("verify for torch.fx is Graph.lint(); torch.fx has no separate freeze or sort step "
                  "(its node list is kept in order).")


def io_scale(console: Console) -> None:
    sizes = [10**5, 10**6, 10**7]
    rows = [(n, run("io_scale.py", "--n", str(n), "--repeat", "3" if n < 10**7 else "1")) for n in sizes]
    table = Table(title=".cg files: save_cg / load_cg of a chain of N binary elementwise ops "
                        "(medians, 1 thread; each N in its own process)")
    for col in ("N", "file MB", "bytes/function", "save s", "save MB/s", "load s", "of which verify s",
                "load MB/s", "save peak RSS MB", "load peak RSS MB"):
        table.add_column(col, justify="right")
    for n, r in rows:
        if r is None:
            table.add_row(f"{n:,}", *["failed"] + ["-"] * 9)
            continue
        table.add_row(f"{n:,}", f"{r['file_mb']:.1f}", f"{r['bytes_per_function']:.1f}", f"{r['save']:.3f}",
                      f"{r['save_mb_s']:.0f}", f"{r['load']:.3f}", f"{r['verify']:.3f}", f"{r['load_mb_s']:.0f}",
                      f"{r['save_peak_rss_mb']:.0f}", f"{r['load_peak_rss_mb']:.0f}")
    console.print(table)
    console.print("load includes Graph.verify() (every loaded graph is verified); save's peak RSS includes "
                  "building the graph, load runs in a fresh process.")


def main() -> None:
    console = Console(width=140)
    console.print(f"python {sys.version.split()[0]}, threads: " + ", ".join(f"{k}=1" for k in THREADS))
    only = sys.argv[1:]  # e.g. `python bench/run.py io_scale`
    tables = {"graph_scale": graph_scale, "io_scale": io_scale}
    # More benchmarks live in bench/table_<name>.py, each with `table(console, run)`.
    for path in sorted(HERE.glob("table_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        tables[path.stem[len("table_"):]] = lambda c, m=module: m.table(c, run)
    for name, fn in tables.items():
        if not only or name in only:
            fn(console)


if __name__ == "__main__":
    main()
