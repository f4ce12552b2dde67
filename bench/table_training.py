"""``make bench`` table: one MLP training step (784-512-512-10, batch 128, SGD), opgraph vs NumPy vs PyTorch.

Each library runs in its own process with one BLAS thread (``run`` from bench/run.py); the table
shows the median time per step over 30 steps after 5 warm-up steps and the peak RSS, with ratios
to NumPy eager (hand-written backward pass).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table


def table(console: Console, run: Callable[..., Any]) -> None:
    """Run the training_* scripts and print the comparison."""
    rows = [
        ("opgraph (executor + update-edge runner)", run("training_opgraph.py", "--runtime", "executor")),
        ("opgraph (compiled runtime)", run("training_opgraph.py", "--runtime", "compiled")),
        ("NumPy eager, hand-written backward", run("training_numpy.py")),
        ("PyTorch eager (1 thread)", run("training_torch.py")),
    ]
    base = rows[2][1]
    t = Table(title="training step: MLP 784-512-512-10, batch 128, SGD, float32 (median of 30 steps, 1 thread)")
    for col in ("implementation", "ms / step", "vs NumPy", "peak RSS MiB", "vs NumPy", "loss after 35 steps"):
        t.add_column(col, justify="left" if col == "implementation" else "right")
    for name, r in rows:
        if r is None:
            t.add_row(name, "failed", "-", "-", "-", "-")
            continue
        ratio_t = f"{r['step'] / base['step']:.2f}x" if base else "-"
        ratio_m = f"{r['rss_mb'] / base['rss_mb']:.2f}x" if base else "-"
        t.add_row(name, f"{r['step'] * 1e3:.2f}", ratio_t, f"{r['rss_mb']:.0f}", ratio_m, f"{r['loss']:.4f}")
    console.print(t)
