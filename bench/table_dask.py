"""``make bench`` table (issue 18): opgraph's dask backend on an out-of-core ``.npy`` memmap vs ``dask.array``.

``python bench/run.py dask`` makes X once (bench/dask_memmap.py ``--variant make``; ``OPGRAPH_BENCH_DASK_GIB``
GiB, default 8, in ``OPGRAPH_BENCH_DASK_DIR``), then runs each variant of ``y = sum(tanh(X * a + b) @ W, axis=0)``
in its own process on its own 2-worker LocalCluster: NumPy (the reference value), opgraph, hand-written
``dask.array`` with the chunk rows opgraph chose, and ``da.from_array`` of the memmap with dask's auto chunks;
opgraph fed a dask array slicing the memmap (rebuilt to read from the file) and fed ``da.from_array`` of the memmap
(refused on the cluster, issue 36) with opgraph's chunk rows; opgraph and the hand-written variant alternate for
``OPGRAPH_BENCH_DASK_ROUNDS`` (1) rounds and each median is over all their runs. ``OPGRAPH_BENCH_DASK_REPEAT`` (5)
runs a process, ``OPGRAPH_BENCH_DASK_LIMIT_MIB`` (2048) each worker's memory_limit. Prints the tables and writes
them to bench/results/dask.md.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from run import emit_table  # bench/run.py, which loads this module (its folder is on sys.path)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "dask.md"
GOAL = 1.1  # opgraph's median at most this times the hand-written dask.array's
VARIANTS = {"numpy": "NumPy, 1 process (reference)", "opgraph": "opgraph, dask backend",
            "dask_blocks": "dask.array, hand-written", "dask_mmap": "dask from_array(memmap)",
            "opgraph_mapped": "opgraph fed a dask array slicing the memmap",
            "opgraph_from_array": "opgraph fed dask from_array(memmap)"}
COLUMNS = ["variant", "chunk rows", "tasks (optimized)", "median s", "vs hand-written", "GiB/s",
           "peak RSS / limit MiB, per worker", "workers replaced", "matches NumPy"]


def _bench_module() -> Any:
    """bench/dask_memmap.py as a module, for its data path (``OPGRAPH_BENCH_DASK_DIR``) and sizes."""
    spec = importlib.util.spec_from_file_location("dask_memmap", HERE / "dask_memmap.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _merge(results: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One result from a variant's processes: all their timed runs, each worker's highest peak, every worker
    replaced, every ``y``; a failure (None: the process failed, or its ``error``) wins."""
    for r in results:
        if r is None or "error" in r:
            return r
    out = dict(results[0])  # type: ignore[arg-type]
    out["times"] = [t for r in results for t in r["times"]]  # type: ignore[index]
    out["median_s"] = statistics.median(out["times"])
    out["workers"] = [max(ws, key=lambda w: w["peak_mib"])
                      for ws in zip(*(r.get("workers", []) for r in results), strict=False)]
    if "workers_replaced" in out:
        out["workers_replaced"] = sum(r["workers_replaced"] for r in results)  # type: ignore[index]
    out["ys"] = [r["y"] for r in results]  # type: ignore[index]
    return out


def table(console: Console, run: Callable[..., dict[str, Any] | None]) -> None:
    """Make X, run bench/dask_memmap.py per variant (and its per-task overhead), print the tables with the
    goal's verdict and write them to bench/results/dask.md."""
    gib = float(os.environ.get("OPGRAPH_BENCH_DASK_GIB", "8"))
    repeat = os.environ.get("OPGRAPH_BENCH_DASK_REPEAT", "5")
    limit = int(os.environ.get("OPGRAPH_BENCH_DASK_LIMIT_MIB", "2048"))
    n_rounds = int(os.environ.get("OPGRAPH_BENCH_DASK_ROUNDS", "1"))
    dm = _bench_module()
    path = dm.data_path(gib)
    if not path.with_suffix(".done").exists():  # a complete X from an earlier run is reused
        probe = next(p for p in (path.parent, *path.parent.parents) if p.exists())
        free = shutil.disk_usage(probe).free
        if free < (gib + 1) * 2**30:
            console.print(f"dask table skipped: X needs {gib:g} GiB + 1 GiB margin on {probe}'s filesystem, "
                          f"{free / 2**30:.1f} GiB free (set OPGRAPH_BENCH_DASK_DIR or OPGRAPH_BENCH_DASK_GIB)")
            return
    progress = Console(stderr=True)
    progress.print(f"[dim]dask: making X ({gib:g} GiB) in {path.parent} ...[/dim]")
    made = run("dask_memmap.py", "--variant", "make", "--gib", f"{gib:g}")
    if made is None:
        console.print("dask table skipped: making X failed (stderr above)")
        return
    common = ("--gib", f"{gib:g}", "--repeat", repeat, "--limit-mib", str(limit))

    def variant(name: str, *args: str) -> dict[str, Any] | None:
        progress.print(f"[dim]dask: {name} {' '.join(args)} ...[/dim]")
        return run("dask_memmap.py", "--variant", name, *common, *args)

    runs: dict[str, list[dict[str, Any] | None]] = {"numpy": [variant("numpy")], "opgraph": [], "dask_blocks": []}
    rows_opgraph = "0"  # until opgraph says which chunk rows it chose (0: dask's auto)
    for _ in range(n_rounds):  # alternated, so a busy moment on the machine hits both alike
        runs["opgraph"].append(og := variant("opgraph"))
        rows_opgraph = str((og or {}).get("chunk_rows") or rows_opgraph)
        runs["dask_blocks"].append(variant("dask_blocks", "--chunk-rows", rows_opgraph))
    runs["dask_mmap"] = [variant("dask_mmap")]
    runs["opgraph_mapped"] = [variant("opgraph_mapped", "--chunk-rows", rows_opgraph)]  # rebuilt (issue 36)
    runs["opgraph_from_array"] = [variant("opgraph_from_array", "--chunk-rows", rows_opgraph)]  # refused
    over = variant("overhead")
    res = {name: _merge(runs[name]) for name in VARIANTS}
    ref, og, hand = res["numpy"], res["opgraph"], res["dask_blocks"]
    ok = {name: r for name, r in res.items() if r and "error" not in r}
    ref_y = np.asarray(ref["y"]) if "numpy" in ok else None

    def matches(r: dict[str, Any]) -> bool | None:
        return None if ref_y is None else all(np.allclose(y, ref_y, rtol=1e-4) for y in r["ys"])

    rows, notes = [], []
    for name, label in VARIANTS.items():
        r = res[name]
        if r is None:
            rows.append([label, "failed (stderr above)"] + ["-"] * (len(COLUMNS) - 2))
            continue
        tasks = f"{r['tasks']:,} ({r['tasks_optimized']:,})" if "tasks" in r else "-"
        workers = ", ".join(f"{w['peak_mib']:.0f} / {w['limit_mib']:.0f}" for w in r.get("workers", []))
        if name == "numpy":
            workers = f"{r['peak_mib']:.0f} (no limit)" if name in ok else "-"
        replaced = str(r["workers_replaced"]) if "workers_replaced" in r else "-"
        chunk_rows = f"{r['chunk_rows']:,}" if r.get("chunk_rows") else "-"
        if "error" in r:
            notes.append(f"{label}: {r['error'].split('. ')[0]}.")
            status = "not run" if r.get("skipped") else "refused" if "refused_s" in r else "failed"
            rows.append([label, chunk_rows, tasks, status, "-", "-",
                         workers or "-", replaced, "-"])
            continue
        m = matches(r)
        rows.append([label, chunk_rows, tasks, f"{r['median_s']:.3g}",
                     f"{r['median_s'] / hand['median_s']:.2f}x" if "dask_blocks" in ok else "-",  # type: ignore[index]
                     f"{made['bytes'] / 2**30 / r['median_s']:.2f}", workers, replaced,
                     "reference" if name == "numpy" else "-" if m is None else "yes" if m else "NO"])
    first = next((r for r in ok.values() if "dask" in r), {})
    title = (f"y = sum(tanh(X * a + b) @ W, axis=0), X a {gib:g} GiB float32 .npy memmap ({dm.rows_for(gib):,} "
             f"rows x 256); LocalCluster 2 workers x 1 thread, memory_limit {limit} MiB; median of {repeat} runs "
             f"x {n_rounds} process(es) for opgraph and the hand-written variant, {repeat} runs for the others")
    notes = [
        "chunk rows: rows of X a block holds (1 KiB a row): opgraph's from the workers' memory budget; the "
        "hand-written variant (da.map_blocks of a function reading its rows from the file) is given the same; "
        "from_array(np.load(path, mmap_mode='r')) uses dask's 'auto'. tasks: in the dask graph before "
        "(after) dask.optimize. vs hand-written: median / the hand-written variant's median. GiB/s: X's size / "
        "median. Every timed run builds its graph and computes y on the cluster, after one "
        "untimed run per process (the workers' imports, the page cache).",
        "peak RSS: each worker's VmHWM at the end of its process (the highest over the rounds) / its memory_limit; "
        "workers replaced: workers the nanny started in place of killed ones (0 expected). matches NumPy: "
        "np.allclose(y, NumPy's y, rtol=1e-4) for every round.", *notes]
    if og and "error" not in og and hand and "error" not in hand:
        ratio = og["median_s"] / hand["median_s"]
        under = all(w["peak_mib"] < w["limit_mib"] for w in og["workers"]) and og["workers_replaced"] == 0
        met = ratio <= GOAL and under and matches(og) is not False
        notes.append(f"Goal (issue 18): opgraph within {GOAL}x of hand-written dask.array, every worker under its "
                     f"limit, y matching NumPy. {'MET' if met else 'NOT MET'}: {ratio:.2f}x; workers "
                     f"{'under' if under else 'NOT under'} their limit "
                     f"(highest peak {max(w['peak_mib'] for w in og['workers']):.0f} of {limit} MiB, "
                     f"{og['workers_replaced']} replaced); y {'matches' if matches(og) else 'does NOT match'} NumPy.")
    else:
        notes.append("Goal (issue 18): cannot be judged: opgraph or the hand-written variant failed.")
    threads = (f"BLAS/OpenMP threads 1 in every process (workers measured: "
               f"{first.get('worker_blas_threads', '?')}), workers 2 x 1 thread, OPENBLAS_CORETYPE="
               f"{os.environ.get('OPENBLAS_CORETYPE', 'unset')}")
    versions = (f"python {sys.version.split()[0]}, numpy {first.get('numpy', '?')}, dask {first.get('dask', '?')}, "
                f"distributed {first.get('distributed', '?')}; {os.cpu_count()} cores")
    command = " ".join([*(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("OPGRAPH_BENCH_DASK")),
                        "python bench/run.py dask"])
    header = f"{time.strftime('%Y-%m-%d %H:%M')}; `{command}`; X {gib:g} GiB, limit {limit} MiB; {threads}; {versions}"
    console.print(header, markup=False, highlight=False)
    md = ["## dask backend: out-of-core memmap (issue 18)", "", header, ""]
    md.append(emit_table(console, title, COLUMNS, rows, notes))

    rows, notes = [], []
    if over is None:
        rows.append(["failed (stderr above)", "-", "-", "-", "-", "-"])
    else:
        for p in over["per_task"]:
            rows.append([f"per task, {p['scheduler']} scheduler", f"{p['chunks']:,} chunks", f"{p['tasks']:,}",
                         f"{p['median_s']:.3g}", f"{p['us_per_task']:.0f}", "-"])
        for c in over["construct"]:
            per_op, hand_op = c["call_s"] / c["ops"] * 1e6, c["hand_s"] / c["ops"] * 1e6
            rows.append(["opgraph: dask graph built per call", f"{c['ops']:,} ops", f"{c['tasks']:,}",
                         f"{c['call_s']:.3g}", f"{per_op:.0f}", f"{per_op / hand_op:.2f}x"])
            rows.append(["hand-written dask.array chain", f"{c['ops']:,} ops", f"{c['hand_tasks']:,}",
                         f"{c['hand_s']:.3g}", f"{hand_op:.0f}", "1.00x"])
        notes = ["per task: (ones(8 N, chunks=8) + 1).sum(), graph built and computed, median s / its tasks after "
                 "dask.optimize; threads = dask's threaded scheduler, LocalCluster 2 x 1 as above.",
                 "graph built per call: a compiled chain of K multiply/add/tanh ops on a (4000, 256) array in 10 "
                 "chunks, called with result='dask' (nothing computed), vs the same chain in dask.array; µs per op."]
    md.append(emit_table(console, f"Overhead: per task and per op (median of {repeat})",
                         ["measure", "size", "tasks", "median s", "µs per task or op", "vs hand-written"], rows, notes))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text("\n".join(md))
    console.print(f"written: {RESULTS}")
