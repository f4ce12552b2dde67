"""``make bench`` table (issue 32): rule-pass cost per op on a deep graph, so a rule that scans per candidate shows.

``python bench/run.py rules`` runs bench/rules_scale.py (``optimize(level=2)`` of a sin/multiply chain with its
gradient) at 10^4 and 10^5 ops, ``OPGRAPH_BENCH_RULES_REPEAT`` (5) times each, every run in its own process with one
BLAS/OpenMP thread, and prints the median seconds and microseconds per op; a rule pass that stays linear keeps
the time per op flat. The 10^6-op row takes about 80 s a run here (70 s of it building the graph with the
builder and ``opgraph.grad``), so it runs only with ``OPGRAPH_BENCH_RULES_FULL=1``.
``OPGRAPH_BENCH_RULES_BASELINE=<path to another checkout's src>`` adds that tree's medians, run alternately with
this one (e.g. ``git worktree add /tmp/old b265d70``, then ``OPGRAPH_BENCH_RULES_BASELINE=/tmp/old/src``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")}


def _run_with(src: str, ops: int) -> dict[str, Any] | None:
    """bench/rules_scale.py with ``src`` first on the path (another checkout), in its own process."""
    env = {**os.environ, **THREADS, "PYTHONPATH": src}
    proc = subprocess.run([sys.executable, str(HERE / "rules_scale.py"), "--ops", str(ops)], capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _median(rs: list[dict[str, Any] | None], key: str) -> float | None:
    got = [r[key] for r in rs if r is not None]
    return statistics.median(got) if got and len(got) == len(rs) else None


def table(console: Console, run: Callable[..., dict[str, Any] | None]) -> None:
    """Run bench/rules_scale.py per size and print the table."""
    repeat = int(os.environ.get("OPGRAPH_BENCH_RULES_REPEAT", "5"))
    sizes = [10_000, 100_000] + ([1_000_000] if os.environ.get("OPGRAPH_BENCH_RULES_FULL") == "1" else [])
    base = os.environ.get("OPGRAPH_BENCH_RULES_BASELINE")
    t = Table(title=f"optimize(level=2) of a sin/multiply chain with its gradient (medians of {repeat} runs, "
                    "each in its own process, 1 thread)")
    cols = ["ops", "ops after", "seconds", "µs / op", "µs / op vs 10^4"]
    if base:
        cols += ["baseline seconds", "baseline µs / op", "this / baseline"]
    for c in cols:
        t.add_column(c, justify="right")
    first = None
    for n in sizes:
        mine: list[dict[str, Any] | None] = []
        theirs: list[dict[str, Any] | None] = []
        for _ in range(repeat):  # alternately, so a busy moment on the machine hits both alike
            mine.append(run("rules_scale.py", "--ops", str(n)))
            if base:
                theirs.append(_run_with(base, n))
        s = _median(mine, "optimize")
        if s is None:
            t.add_row(f"{n:,}", "-", "failed", "-", "-", *(["-"] * 3 if base else []))
            continue
        ops = next(r for r in mine if r)["ops"]
        per = s / ops * 1e6
        first = first or per
        row = [f"{ops:,}", f"{next(r for r in mine if r)['ops_after']:,}", f"{s:.3f}", f"{per:.2f}",
               f"{per / first:.2f}x"]
        if base:
            b = _median(theirs, "optimize")
            row += ["-", "-", "-"] if b is None else [f"{b:.3f}", f"{b / ops * 1e6:.2f}", f"{s / b:.2f}x"]
        t.add_row(*row)
    console.print(t)
    if os.environ.get("OPGRAPH_BENCH_RULES_FULL") != "1":
        console.print("10^6 ops: set OPGRAPH_BENCH_RULES_FULL=1 (about 80 s a run, mostly building the graph).")
