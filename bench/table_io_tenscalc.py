"""`make bench` table: loading TensCalc's file sets (bench/io_tenscalc.py), microseconds per function."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def table(console: Console, run: Callable[..., dict[str, Any] | None]) -> None:
    """Print the table: each set loaded in fresh processes, medians of 5."""
    r = run("io_tenscalc.py", "--tile", "4")
    t = Table(title="Loading TensCalc's .cg file sets (opgraph.io.load, verified; fresh process each, "
                    "medians of 5, 1 thread)")
    for col in ("file set", "functions", "load s", "us / function"):
        t.add_column(col, justify="right")
    for row in (r or {}).get("sets", []):
        t.add_row(Path(row["set"]).parent.name + "/" + Path(row["set"]).name, f"{row['functions']:,}",
                  f"{row['median_s']:.3f}", f"{row['us_per_function']:.2f}")
    if r is None:
        t.add_row("failed", "-", "-", "-")
    console.print(t)
