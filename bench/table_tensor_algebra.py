"""``make bench`` table (issue 20): opgraph's tensor-algebra front end vs np.einsum, opt_einsum and torch.einsum.

``python bench/run.py tensor_algebra`` runs bench/tensor_contract.py once per case and library, each in its own
process (one thread: bench/run.py sets the BLAS/OpenMP variables to 1, torch is pinned with
``torch.set_num_threads(1)``), prints one table per case with the goal's verdict and writes them to
bench/results/tensor_algebra.md. ``OPGRAPH_BENCH_TA_REPEAT`` (7) timed calls per process, after one warm-up
call; ``OPGRAPH_BENCH_TA_ROUNDS`` (1) processes per library and case, run in rounds over the libraries (so a busy
moment on a shared machine falls on all of them) and merged: a median is over all their calls;
``OPGRAPH_BENCH_TA_CASES`` (``cc,cc_perm,chain``) the cases.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from run import emit_table  # bench/run.py, which loads this module (its folder is on sys.path)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "tensor_algebra.md"
NOISE = 1.05  # opgraph (auto) at most this times the fastest peer's median counts as "equal within noise"
PEERS = ("numpy", "opt_einsum", "torch")
OPGRAPH = ("opgraph-auto", "opgraph-numpy", "opgraph-torch")
LABELS = {"numpy": "np.einsum(optimize=True)", "opt_einsum": "opt_einsum.contract", "torch": "torch.einsum",
          "opgraph-auto": "opgraph, backend auto", "opgraph-numpy": "opgraph, backend numpy",
          "opgraph-torch": "opgraph, backend torch"}
CASES = {"cc": "coupled-cluster ladder term: T2(a,b,i,j) V(c,d,a,b) -> R(c,d,i,j), o = 20, v = 80",
         "cc_perm": "ladder term, permuted result: T2(a,b,i,j) V(c,d,a,b) -> R(i,j,c,d), o = 20, v = 80",
         "chain": "matrix chain A(1000x100) B(100x1000) C(1000x100) D(100x1000) -> R(i,m)"}
COLUMNS = ["library", "median ms", "min ms", "vs fastest peer", "max rel err", "build + compile ms, first / again",
           "backend"]


def _has_tensor_expr() -> tuple[bool, str]:
    """Whether ``opgraph.tensor_expr`` exists (checked in a fresh process, as the benchmark runs); why not."""
    code = "import opgraph; opgraph.tensor_expr"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    return proc.returncode == 0, lines[-1] if lines else ""


def _merge(rs: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One result from a library's processes: all their timed calls, the largest error, every backend auto chose;
    the build times are the first process's. A failed process (None) makes the whole None."""
    if not rs or any(r is None for r in rs):
        return None
    out = dict(rs[0])  # type: ignore[arg-type]
    out["times_ms"] = [t for r in rs for t in r["times_ms"]]  # type: ignore[index]
    out["median_ms"] = statistics.median(out["times_ms"])
    out["min_ms"] = min(out["times_ms"])
    errs = [r.get("max_rel_err") for r in rs]  # type: ignore[union-attr]
    out["max_rel_err"] = None if any(e is None for e in errs) else max(errs)  # type: ignore[type-var]
    out["backends"] = list(dict.fromkeys(str(r.get("backend", "-")) for r in rs))  # type: ignore[union-attr]
    return out


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def table(console: Console, run: Callable[..., dict[str, Any] | None]) -> None:
    """Run every case on every library, print the tables with the goal's verdict, write the markdown."""
    repeat = os.environ.get("OPGRAPH_BENCH_TA_REPEAT", "7")
    rounds = int(os.environ.get("OPGRAPH_BENCH_TA_ROUNDS", "1"))
    cases = [c for c in os.environ.get("OPGRAPH_BENCH_TA_CASES", ",".join(CASES)).replace(" ", "").split(",") if c]
    have_torch = importlib.util.find_spec("torch") is not None
    have_og, why_not = _has_tensor_expr()
    libs = [lib for lib in (*PEERS, *OPGRAPH) if have_torch or "torch" not in lib]
    if not have_og:
        libs = [lib for lib in libs if not lib.startswith("opgraph")]
    progress = Console(stderr=True)
    skipped = []
    if not have_torch:
        skipped.append("torch is not importable: torch.einsum and opgraph's torch backend not run")
    if not have_og:
        skipped.append(f"opgraph.tensor_expr is missing ({why_not}): the opgraph rows were not run and the goal "
                       "cannot be judged")

    results: dict[str, dict[str, dict[str, Any] | None]] = {}
    for case in cases:
        raw: dict[str, list[dict[str, Any] | None]] = {lib: [] for lib in libs}
        for k in range(rounds):
            for lib in libs:
                progress.print(f"[dim]tensor_algebra: {case} {lib}"
                               + (f" (round {k + 1} of {rounds})" if rounds > 1 else "") + " ...[/dim]")
                raw[lib].append(run("tensor_contract.py", "--lib", lib, "--case", case, "--repeat", repeat))
        results[case] = {lib: _merge(rs) for lib, rs in raw.items()}

    every = [r for by in results.values() for r in by.values() if r]
    vers: dict[str, str] = {}
    for r in every:
        vers.update(r.get("versions", {}))
    torch_threads = sorted({r["torch_threads"] for r in every if "torch_threads" in r})
    command = " ".join([*(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("OPGRAPH_BENCH_TA")),
                        "python bench/run.py tensor_algebra"])
    runs = f"median of {repeat} timed calls after 1 warm-up call" + (
        f", x {rounds} processes run in rounds over the libraries" if rounds > 1 else "")
    header = (f"{time.strftime('%Y-%m-%d %H:%M')}; `{command}`; "
              + ", ".join(f"{k} {v}" for k, v in vers.items())
              + f"; {os.cpu_count()} cores; BLAS/OpenMP threads 1 (set by bench/run.py), torch.set_num_threads(1)"
              + (f" (measured {', '.join(map(str, torch_threads))})" if torch_threads else "")
              + "; XLA_FLAGS single-threaded for jax (a candidate of auto), onnxruntime OMP_NUM_THREADS=1"
              + f"; float64; {runs}; each library and case in its own process")
    console.print(header, markup=False, highlight=False)
    md = ["## Tensor algebra front end (issue 20)", "", header, ""]
    verdicts = []
    for case in cases:
        by = results[case]
        peers = {lib: r for lib, r in by.items() if lib in PEERS and r and r.get("median_ms") is not None}
        best_lib = min(peers, key=lambda k: peers[k]["median_ms"]) if peers else None
        best = peers[best_lib]["median_ms"] if best_lib else None
        rows, notes = [], []
        subscripts = next((r["subscripts"] for r in by.values() if r), "?")
        for lib in libs:
            r = by.get(lib)
            if r is None:
                rows.append([LABELS[lib], "failed (stderr above)"] + ["-"] * (len(COLUMNS) - 2))
                continue
            err = r.get("max_rel_err")
            og = lib.startswith("opgraph")
            rows.append([LABELS[lib], _ms(r["median_ms"]), _ms(r["min_ms"]),
                         f"{r['median_ms'] / best:.2f}x" if best else "-",
                         f"{err:.1e}" if err is not None else f"WRONG: {r.get('error', '?')}",
                         (_ms(r.get("build_ms")) + (f" / {_ms(r['build_warm_ms'])}" if "build_warm_ms" in r else ""))
                         if og else "-",
                         ", ".join(r["backends"]) if og else "-"])
            if lib == "opgraph-auto" and r.get("auto_timings_ms"):
                timed = ", ".join(f"{k} {v:.3g} ms" if v is not None else f"{k} failed"
                                  for k, v in sorted(r["auto_timings_ms"].items(),
                                                     key=lambda kv: (kv[1] is None, kv[1] or 0.0)))
                notes.append(f"auto's own timings (median per call while choosing): {timed}.")
            if og and r.get("graph_ops"):
                parts = r.get("build_parts_ms", {})
                notes.append(f"{LABELS[lib]}: graph ops {', '.join(r['graph_ops'])}; build + compile = "
                             + ", ".join(f"{k} {v:.3g}" for k, v in parts.items())
                             + " ms" + (", again " + ", ".join(f"{k} {v:.3g}" for k, v in
                                                              r["build_warm_parts_ms"].items()) + " ms"
                                        if "build_warm_parts_ms" in r else "")
                             + f"; og.feeds() {r.get('feeds_ms', 0):.3g} ms (inside every timed call).")
        og = by.get("opgraph-auto")
        if og and best and og.get("max_rel_err") is not None:
            ratio = og["median_ms"] / best
            met = ratio <= NOISE
            how = "faster" if ratio < 1 else "equal within noise" if met else "slower"
            verdict = (f"Goal (issue 20), {case}: opgraph (auto) no slower than the fastest of np.einsum(optimize="
                       f"True), opt_einsum.contract and torch.einsum (a ratio <= {NOISE} counts as equal within "
                       f"noise). {'MET' if met else 'NOT MET'}: {ratio:.2f}x the fastest peer "
                       f"({LABELS[best_lib]}, {_ms(best)} ms) - {how}; auto chose {', '.join(og['backends'])}.")
        elif og and og.get("max_rel_err") is None:
            verdict = f"Goal (issue 20), {case}: NOT MET: opgraph (auto) gave a wrong result ({og.get('error')})."
        else:
            verdict = (f"Goal (issue 20), {case}: cannot be judged: "
                       + ("opgraph (auto) was not run or failed." if best else "no peer ran."))
        verdicts.append(f"{case} " + ("MET" if "MET:" in verdict and "NOT MET" not in verdict
                                      else "NOT MET" if "NOT MET" in verdict else "not judged"))
        notes = [
            f"einsum {subscripts!r}. vs fastest peer: median / the smallest median of the three peers "
            f"({LABELS[best_lib] if best_lib else '-'}). max rel err: max |out - ref| / max |ref| against "
            "np.einsum(optimize=True) computed once in the same process.",
            "opgraph: the expression in index notation (opgraph.tensor_expr), .opgraph(result labels), "
            ".to_graph(data='inputs') and opgraph.compile(graph, backend), one measurement each: first = the first "
            "build in the process "
            "(it includes opgraph's imports on first use" + (", compiled from source: PYTHONDONTWRITEBYTECODE is set"
                                                             if os.environ.get("PYTHONDONTWRITEBYTECODE") else "")
            + "), again = a second build (not for auto, whose cost is timing the installed backends on og.feeds()); "
            "the timed call is prog(og.feeds()). opt_einsum finds its path inside every call; torch.einsum orders "
            "its contractions with opt_einsum when installed.",
            f"Threads: 1 everywhere (BLAS/OpenMP = 1, set by bench/run.py; torch.set_num_threads(1); XLA and "
            f"onnxruntime single-threaded). Runs: {runs}, per library.",
            *notes, *skipped, verdict]
        title = f"{CASES.get(case, case)} (float64; median of {int(repeat) * rounds} calls, 1 thread)"
        md.append(emit_table(console, title, COLUMNS, rows, notes))
    summary = (f"Goal (issue 20), opgraph (auto) no slower than the fastest peer (ratio <= {NOISE}): "
               + "; ".join(verdicts) + ".")
    console.print(summary, markup=False, highlight=False)
    md.append(summary + "\n")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text("\n".join(md))
    console.print(f"written: {RESULTS}")
