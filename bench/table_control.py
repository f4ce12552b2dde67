"""``make bench`` table (issue 17): an Elman RNN over 1,000 steps as one ``scan`` op vs unrolled vs ``jax.lax.scan``.

``python bench/run.py control`` runs bench/control_rnn.py for each variant and
mode (forward; forward + d loss / d W with the loss on h_T, then with a loss
at every step, whose cotangents do not decay to subnormals), each run in its own process with one
BLAS/OpenMP/XLA thread, prints one table per mode with ratios to the scan
variant and writes them to bench/results/control_rnn.md.
``OPGRAPH_BENCH_CONTROL_STEPS`` (1000) and ``OPGRAPH_BENCH_CONTROL_REPEAT``
(20 steady calls per process) and ``OPGRAPH_BENCH_CONTROL_ROUNDS`` (3
processes per variant, interleaved; each figure is the median over them)
change the run.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REF = "NumPy loop"  # the floor, and the reference the other results are compared with
RESULTS = Path(__file__).resolve().parent / "results" / "control_rnn.md"
COLUMNS = ("variant", "ops (+ body)", ".json KB", ".cg KB", "build ms", "compile ms", "run ms", "peak RSS MiB",
           "run peak MiB", "vs NumPy")


def _have_frontend_scan() -> bool:
    """Whether ``opgraph.scan`` exists (the front end of issue 17), asked in a child like bench/run.py's ``have``."""
    import subprocess

    code = "import opgraph, sys; sys.exit(0 if hasattr(opgraph, 'scan') else 1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def _cell(value: float | None, base: float | None, fmt: str = "{:.3g}") -> str:
    """``value`` and its ratio to ``base`` ("12.3 (2.1x)"), ``-`` where unknown."""
    if value is None:
        return "-"
    text = fmt.format(value)
    if base and base > 0:
        text += f" ({value / base:.2f}x)"
    return text


def _size(r: dict[str, Any], ext: str) -> str:
    v = (r.get("files") or {}).get(ext)
    if v is None:
        return "-"
    return f"{v / 1024:,.1f}" if isinstance(v, int) else "no"


def _merge(rounds: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One result from a variant's rounds: the median of each timing and memory figure; a failure wins."""
    for r in rounds:
        if r is None or "error" in r:
            return r
    out = dict(rounds[0])  # type: ignore[arg-type]
    for key in ("build_s", "compile_s", "run_s", "total_peak_mb", "run_peak_mb"):
        out[key] = statistics.median(r[key] for r in rounds)  # type: ignore[index]
    return out


def _rows(results: list[tuple[str, dict[str, Any] | None]], grad: bool) -> tuple[list[list[str]], str]:
    by = dict(results)
    base_name = next((n for n, r in results if r and "error" not in r and n.startswith("opgraph scan")), None)
    if base_name is None:  # no scan result (e.g. no gradient rule for scan yet): compare with the unrolled graph
        base_name = next((n for n, r in results if r and "error" not in r and n.startswith("opgraph unrolled")), None)
    base = by.get(base_name) if base_name else None
    ref = by.get(REF)
    rows = []
    for name, r in results:
        if r is None:
            rows.append([name, "failed (stderr above)"] + ["-"] * (len(COLUMNS) - 2))
            continue
        if "error" in r:
            rows.append([name, r["error"]] + ["-"] * (len(COLUMNS) - 2))
            continue
        b = base or {}
        ops = "-" if "ops" not in r else f"{r['ops']:,}" + (f" + {r['body_ops']}" if r.get("body_ops") else "")
        diff = "-"
        if ref and "error" not in ref and r is not ref:
            keys = ("loss", "grad_checksum") if grad else ("loss",)
            diff = f"{max(abs(r[k] - ref[k]) / max(abs(ref[k]), 1e-30) for k in keys):.1e}"
        rows.append([name, ops, _size(r, ".json"), _size(r, ".cg"),
                     _cell(r["build_s"] * 1e3, b.get("build_s", 0) * 1e3 if r is not base else None),
                     _cell(r["compile_s"] * 1e3, b.get("compile_s", 0) * 1e3 if r is not base else None),
                     _cell(r["run_s"] * 1e3, b.get("run_s", 0) * 1e3 if r is not base else None),
                     _cell(r["total_peak_mb"], b.get("total_peak_mb") if r is not base else None, "{:.1f}"),
                     f"{r['run_peak_mb']:.1f}", diff])
    return rows, base_name or "-"


def _markdown(title: str, rows: list[list[str]]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join(":---" if i == 0 else "---:" for i in range(len(COLUMNS))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def table(console: Console, run: Callable[..., dict[str, Any] | None]) -> None:
    """Run bench/control_rnn.py per variant and mode; print the tables and write bench/results/control_rnn.md."""
    steps = os.environ.get("OPGRAPH_BENCH_CONTROL_STEPS", "1000")
    repeat = os.environ.get("OPGRAPH_BENCH_CONTROL_REPEAT", "20")
    n_rounds = int(os.environ.get("OPGRAPH_BENCH_CONTROL_ROUNDS", "3"))
    common = ("--steps", steps, "--repeat", repeat)
    variants: list[tuple[str, tuple[str, ...]]] = [("opgraph scan (builder)", ("--variant", "scan"))]
    if _have_frontend_scan():
        variants.append(("opgraph scan (opgraph.scan)", ("--variant", "scan", "--frontend")))
    variants.append(("opgraph scan, optimize", ("--variant", "scan", "--optimize")))
    variants.append(("opgraph unrolled", ("--variant", "unrolled")))
    variants.append(("opgraph unrolled, optimize", ("--variant", "unrolled", "--optimize")))
    if importlib.util.find_spec("jax") is not None:
        variants.append(("JAX lax.scan, jit", ("--variant", "jax")))
    else:
        console.print("JAX is not installed: no JAX row (pip install -e '.[bench]').")
    variants.append((REF, ("--variant", "numpy")))
    md = [f"## Control flow: RNN scan vs unrolled vs JAX ({time.strftime('%Y-%m-%d %H:%M')})", "",
          "Command: `python bench/run.py control`", ""]
    jax_version = None
    unsaved: dict[str, str] = {}  # why opgraph.save failed -> the first variant it failed for
    # The gradient twice: with the loss on h_T alone the cotangents decay through float32 subnormals (see the
    # notes), with a loss at every step they stay normal numbers.
    for grad, loss in ((False, "last"), (True, "last"), (True, "all")):
        rounds: dict[str, list[dict[str, Any] | None]] = {name: [] for name, _ in variants}
        mode = (*(("--grad",) if grad else ()), "--loss", loss)
        for _ in range(n_rounds):  # the variants interleaved, so a busy moment on the machine hits them alike
            for name, args in variants:
                rounds[name].append(run("control_rnn.py", *args, *common, *mode))
        results = [(name, _merge(rounds[name])) for name, _ in variants]
        jax_version = jax_version or next((r.get("version") for _, r in results if r and r.get("version")), None)
        rows, base_name = _rows(results, grad)
        loss_text = "loss = sum(h_T)" if loss == "last" else "loss = sum of every h_t"
        what = f"forward + backward ({loss_text}, and d loss / d W)" if grad else f"forward ({loss_text})"
        title = (f"RNN h_t = tanh(h W + x_t U + b), T = {int(steps):,}, hidden 64, input 32, batch 16, float32: "
                 f"{what}; median of {repeat} steady calls, median of {n_rounds} processes, 1 thread; "
                 f"ratios vs {base_name}")
        t = Table(title=title)
        for col in COLUMNS:
            t.add_column(col, justify="left" if col == "variant" else "right")
        for row in rows:
            t.add_row(*row)
        console.print(t)
        md.append(_markdown(title, rows))
        for name, r in results:
            for ext, v in ((r or {}).get("files") or {}).items():
                if isinstance(v, str):
                    unsaved.setdefault(f"{ext}: {v}", name)
    notes = [
        "Each variant and mode runs in its own process (bench/control_rnn.py) with OMP/OPENBLAS/MKL threads 1 "
        "and XLA's CPU client on one thread; opgraph graphs run through opgraph.compile (numpy backend); "
        "the ', optimize' rows run opgraph.optimize (its default level) first, counted in compile. Every call "
        "starts from NumPy arrays and ends in NumPy arrays.",
        "ops: the graph's ops + its bodies' ops (scan: 2 + the 5-op cell; unrolled: 6 per step, a getitem for "
        "x_t included). JAX: jaxpr equations, the scan body's included. .json / .cg: the size of opgraph.save; "
        "'no' where that format cannot store the graph yet (subgraph attributes).",
        "build: constructing the graph (JAX: tracing and lowering, jax.jit(f).lower). compile: opgraph.compile "
        "(JAX: lowered.compile()) plus the first call minus the steady call (a scan body is compiled on its "
        "first call). run: median steady call.",
        "peak RSS: the resident high-water mark over build, compile and every call minus the resident size "
        "after the imports; run peak: the same over the steady calls only (the mark is reset through "
        "/proc/self/clear_refs, as bench/memory_run.py does). RSS moves in pages and lags by ~0.25 MiB: "
        "values below that are noise. JAX's numbers include XLA's compiler and buffers.",
        "vs NumPy: |value - NumPy's| / |NumPy's| for the loss (and the sum of |d loss / d W|), all float32.",
        "The backward pass's cotangents decay through float32 subnormals over the 1,000 steps: OpenBLAS's sgemm "
        "on a (16, 64) operand of subnormals takes ~157 us against ~2.2 us on normal numbers, in every NumPy-based "
        "row alike, while XLA flushes subnormals to zero; part of JAX's lead in the gradient table is this.",
    ]
    notes += [f"'no' for {name}: {why}" for why, name in unsaved.items()]
    header = f"python {sys.version.split()[0]}" + (f", jax {jax_version}" if jax_version else "")
    for note in notes:
        console.print(f"  {note}", style="dim", markup=False, highlight=False)
    md += [header, ""] + [f"- {n}" for n in notes] + [""]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text("\n".join(md))
    console.print(f"written: {RESULTS}")
