"""``make bench`` tables (issue 33): ``opgraph.jit`` against its peers, each library and case in its own process.

``python bench/run.py jit`` prints three tables and writes them to bench/results/jit.md:

1. **MLP training step** (bench/jit_mlp.py): value_and_grad + Adam (``init/update/apply_updates``) inside
   ``opgraph.jit(step, backend=...)`` against the same step under ``jax.jit`` with Adam by hand (jax engine) and
   by hand in NumPy (numpy engine), 784-512-512-10 batch 128 and 64-128-10 batch 32. Each process compares its
   first three losses with those of ``jax.value_and_grad`` + ``optax.adam`` (rtol 1e-4) before it times
   anything, and times nothing where they differ. Each figure is the median over ``OPGRAPH_BENCH_JIT_ROUNDS`` (5)
   processes, run interleaved so that a busy moment on the machine hits every library alike; each process
   reports the median of its steps after warm-up.
2. **Fine-grained gradient** (bench/jit_finegrained.py): ``opgraph.jit(opgraph.grad(f))`` on numpy against the
   un-jitted ``opgraph.grad(f)`` and CasADi (SX, ``Function`` of ``gradient``) for ``f`` of ~2*10^3 and ~2*10^4
   scalar ops (``OPGRAPH_BENCH_JIT_FG_N``, default ``250,2500`` scalars), each checked against finite
   differences before timing; ``OPGRAPH_BENCH_JIT_FG_ROUNDS`` (1) processes per case.
3. **Compile time per engine**: the first call of ``opgraph.jit`` per engine for those graphs (numpy, jax and
   torch), next to the peers' first calls. A process whose first call would take longer than
   ``OPGRAPH_BENCH_JIT_COMPILE_LIMIT`` (60 s) is stopped (after that limit plus 30 s for start-up and checks)
   and the cell says so; at the larger fine-grained size an engine whose first call at the smaller size,
   scaled by the sizes' ratio, exceeds the limit is not run.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from tables import emit

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "jit.md"
RTOL = 1e-4  # bench/jit_mlp.py's, on the first three losses
GOALS = {"jax": 1.05, "numpy": 1.10}
SIZES = {"big": "784-512-512-10 b128", "small": "64-128-10 b32"}
STEPS = {"big": 30, "small": 200}  # steps timed per process (the small step takes ~0.3 ms)
PEER_LIMIT = 600.0  # seconds for a process that is not opgraph.jit (the un-jitted grad at 2*10^4 ops takes ~1 min)
THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")}

Result = dict[str, Any] | None


def run_limited(script: str, args: list[str], limit: float) -> dict[str, Any]:
    """Run ``bench/<script>`` like bench/run.py's ``run``, stopped after ``limit`` seconds; an ``error`` entry
    says why there is no result."""
    env = {**os.environ, **THREADS}
    try:
        proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True, env=env,
                              timeout=limit)
    except subprocess.TimeoutExpired:
        return {"error": f"skipped (> {limit:.0f} s)"}
    lines = proc.stdout.strip().splitlines()
    if lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    Console(stderr=True).print(f"[red]{script} {' '.join(args)} failed:[/red]\n{proc.stderr[-2000:]}")
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"failed: {tail[:120]}"}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.3g}"


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e6:,.3g}"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _get(r: Result, key: str) -> float | None:
    return None if r is None or "error" in r else r.get(key)


_WHY: list[str] = []  # long reasons for empty cells, printed under the table that shows them (see _emit)


def _cell(r: Result, key: str, fmt: Callable[[float | None], str]) -> str:
    if r is not None and "error" in r:
        why = r["error"]
        if len(why) <= 30:
            return why
        if why not in _WHY:
            _WHY.append(why)
        return f"n/a ({_WHY.index(why) + 1})"
    return fmt(_get(r, key))


def _merge(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from a case's processes: the median of each timing; the first error wins."""
    for r in rounds:
        if "error" in r:
            return r
    out = dict(rounds[0])
    for key in ("first_s", "step_s", "call_s"):
        if key in out:
            out[key] = statistics.median(r[key] for r in rounds)
            out[key + "_spread"] = (min(r[key] for r in rounds), max(r[key] for r in rounds))
    out["processes"] = len(rounds)
    return out


def _emit(console: Console, md: list[str], title: str, columns: list[str], rows: list[list[str]],
          notes: list[str]) -> None:
    notes = notes + [f"n/a ({i + 1}): {why}" for i, why in enumerate(_WHY)]
    _WHY.clear()
    emit(console, md, title, columns, rows, notes)


# ----------------------------------------------------------------------------- 1. MLP training step
MLP_CASES = (("opgraph", "jax"), ("jax", "jax"), ("opgraph", "numpy"), ("numpy", "numpy"), ("opgraph", "torch"))


def _reference(size: str) -> str | dict[str, Any]:
    """optax's first three losses (``--expect`` for every case), or the failed result."""
    ref = run_limited("jit_mlp.py", ["--lib", "optax", "--backend", "jax", "--size", size, "--check", "3"],
                      PEER_LIMIT)
    return ref if "error" in ref else ",".join(repr(v) for v in ref["losses"])


def _loss_diff(rounds: list[dict[str, Any]]) -> float | None:
    diffs = [r["loss_diff"] for r in rounds if "loss_diff" in r]
    return max(diffs) if diffs else None


def mlp(console: Console, md: list[str], limit: float) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    """Table 1; returns the merged results (table 3 shows their first calls)."""
    n_rounds = int(os.environ.get("OPGRAPH_BENCH_JIT_ROUNDS", "5"))
    progress = Console(stderr=True)
    merged: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    rows = []
    for size in SIZES:
        progress.print(f"[dim]jit: MLP {SIZES[size]}: optax's loss trajectory ...[/dim]")
        ref = _reference(size)
        rounds: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in MLP_CASES}
        steps = os.environ.get("OPGRAPH_BENCH_JIT_STEPS", str(STEPS[size]))
        for k in range(n_rounds):
            progress.print(f"[dim]jit: MLP {SIZES[size]}: round {k + 1}/{n_rounds} ...[/dim]")
            for (lib, backend), done in rounds.items():
                if isinstance(ref, dict):
                    done.append({"error": f"optax reference: {ref['error']}"})
                    continue
                if (done and "error" in done[0]) or (backend == "torch" and k):  # torch: table 3 only
                    continue
                done.append(run_limited("jit_mlp.py", ["--lib", lib, "--backend", backend, "--size", size,
                                                       "--steps", steps, "--expect", ref],
                                        limit if lib == "opgraph" else PEER_LIMIT))
        merged[size] = {c: _merge(rs) for c, rs in rounds.items()}
        for backend, peer in (("jax", "jax.jit + Adam by hand"), ("numpy", "NumPy by hand")):
            og, pr = merged[size]["opgraph", backend], merged[size][backend, backend]
            diffs = " / ".join("-" if (d := _loss_diff(rounds[lib, backend])) is None else f"{d:.1e}"
                               for lib in ("opgraph", backend))
            rows.append([SIZES[size], backend, peer, _cell(og, "step_s", _ms), _cell(pr, "step_s", _ms),
                         _ratio(_get(og, "step_s"), _get(pr, "step_s")), f"<= {GOALS[backend]:.2f}x",
                         _cell(og, "first_s", _s), _cell(pr, "first_s", _s), diffs])
    title = (f"MLP training step (value_and_grad + Adam; b: batch), float32, relu, softmax cross-entropy: "
             f"median ms per step, median of {n_rounds} processes, 1 thread")
    notes = [
        "opgraph: opgraph.jit(step, backend=engine, donate_argnums=(0, 1)) where step = opgraph.value_and_grad(loss) "
        "+ opgraph.optim.Adam(lr=1e-3).update + opgraph.optim.apply_updates, params and optimiser state as pytrees "
        "in and out (jax engine: jax arrays in; each step's results are fed to the next step as they come out). "
        "Peers: jax.jit(step, donate_argnums=(0, 1)) with jax.value_and_grad and Adam by hand in jax.numpy (optax's "
        "formulas); NumPy: forward, backward and Adam by hand, updating in place.",
        f"ms/step: median of {STEPS['big']} (big) / {STEPS['small']} (small) synchronised steps after the 3 "
        "checked and 5 warm-up steps in each process, then the median over the processes. first call s: the first "
        "call of the step (tracing, optimising, compiling and one step; NumPy: one step), after a step of a 3-4-2 "
        "MLP in the same process (loading modules and starting the engine are not counted).",
        "loss diff: max relative difference of the first three losses (from the same initial parameters) from "
        f"jax.value_and_grad + optax.adam's, over the processes (opgraph / peer); each process checks them before "
        f"it times anything and times nothing where they differ by more than {RTOL:g}.",
        "Threads: OMP/OPENBLAS/MKL/NUMEXPR 1, XLA --xla_cpu_multi_thread_eigen=false "
        "intra_op_parallelism_threads=1, torch.set_num_threads(1).",
    ]
    _emit(console, md, title, ["MLP", "engine", "peer", "opgraph ms", "peer ms", "opgraph / peer", "goal",
                               "opgraph first call s", "peer first call s", "loss diff"], rows, notes)
    return merged


# ----------------------------------------------------------------------------- 2. fine-grained gradient
FG_CASES = (("jit", "numpy"), ("grad", "numpy"), ("casadi", "numpy"), ("jit", "jax"), ("jit", "torch"))


def _too_slow(merged: dict[int, dict[tuple[str, str], dict[str, Any]]], backend: str, n: int,
              compile_limit: float) -> str | None:
    """Why jit on ``backend`` is not run at ``n``: its first call at a smaller size, scaled by the size (at least
    linear: tracing, optimising and compiling each visit every op), would exceed ``compile_limit``; or it failed
    or was stopped there."""
    done = [(m, by["jit", backend]) for m, by in merged.items() if m < n]
    if not done:
        return None
    m, r = max(done, key=lambda t: t[0])
    if "error" in r:
        return f"skipped (n = {m:,}: {r['error'][:40]})"
    guess = r["first_s"] * n / m
    return f"skipped (~{guess:.0f} s > {compile_limit:.0f} s)" if guess > compile_limit else None


def finegrained(console: Console, md: list[str], limit: float) -> dict[int, dict[tuple[str, str], dict[str, Any]]]:
    """Table 2; returns the merged results (table 3 shows their first calls)."""
    compile_limit = limit - 30.0
    sizes = sorted(int(float(s)) for s in os.environ.get("OPGRAPH_BENCH_JIT_FG_N", "250,2500").split(",") if s)
    n_rounds = int(os.environ.get("OPGRAPH_BENCH_JIT_FG_ROUNDS", "1"))
    progress = Console(stderr=True)
    merged: dict[int, dict[tuple[str, str], dict[str, Any]]] = {}
    rows = []
    for n in sizes:
        rounds: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in FG_CASES}
        for k in range(n_rounds):
            for lib, backend in FG_CASES:
                if lib == "jit" and (why := _too_slow(merged, backend, n, compile_limit)):
                    rounds[lib, backend].append({"error": why})
                    continue
                progress.print(f"[dim]jit: fine-grained n={n:,}: {lib} {backend} ({k + 1}/{n_rounds}) ...[/dim]")
                rounds[lib, backend].append(run_limited(
                    "jit_finegrained.py", ["--lib", lib, "--backend", backend, "--n", str(n)],
                    limit if lib == "jit" else PEER_LIMIT))
        by = merged[n] = {c: _merge(rs) for c, rs in rounds.items()}
        jit, grad, cas = by["jit", "numpy"], by["grad", "numpy"], by["casadi", "numpy"]
        ops = (f"{grad['forward_ops']:,} / {grad['grad_ops']:,}" if "forward_ops" in grad else "-")
        rows.append([f"{n:,}", ops, _cell(jit, "call_s", _us), _cell(grad, "call_s", _us),
                     _ratio(_get(grad, "call_s"), _get(jit, "call_s")), _cell(cas, "call_s", _us),
                     _ratio(_get(jit, "call_s"), _get(cas, "call_s")), _cell(by["jit", "jax"], "call_s", _us),
                     _cell(by["jit", "torch"], "call_s", _us)])
    title = ("Fine-grained gradient: f(x) = sum sin(x[i]) x[i+1] + x[i]^2 / (1 + x[i+2]^2) from 0-d ops, float64: "
             f"µs per call, {n_rounds} process(es) per case, 1 thread")
    notes = [
        "jit: opgraph.jit(opgraph.grad(f), backend=engine) (numpy: NumPy array in; jax: a jax array; torch: a "
        "torch tensor). grad: the un-jitted opgraph.grad(f) (traced once, interpreted at every call). CasADi: the "
        "same expression on casadi.SX.sym('x', n), casadi.Function('g', [x], [casadi.gradient(f, x)]) called "
        "with a NumPy array.",
        "Each gradient is checked against central finite differences (step 1e-5) before it is timed. µs per "
        "call: median of 7 samples (5 where the calls take seconds), each a loop of calls lasting ~20 ms. ops: "
        "the forward graph's and the gradient graph's op counts (opgraph.function(f).graph(x), "
        "opgraph.grad(f).graph(x)).",
        "grad / jit: how many times faster jit makes the gradient; jit / CasADi: above 1 means CasADi is faster.",
    ]
    _emit(console, md, title, ["n scalars", "ops fwd / grad", "jit numpy µs", "grad (un-jitted) µs", "grad / jit",
                               "CasADi µs", "jit / CasADi", "jit jax µs", "jit torch µs"], rows, notes)
    return merged


# ----------------------------------------------------------------------------- 3. compile time per engine
def compile_times(console: Console, md: list[str], mlp_r: dict[str, dict[tuple[str, str], dict[str, Any]]],
                  fg_r: dict[int, dict[tuple[str, str], dict[str, Any]]], limit: float) -> None:
    rows = []
    for size, by in mlp_r.items():
        rows.append([f"MLP step {SIZES[size]}", *(_cell(by["opgraph", e], "first_s", _s) for e in
                                                   ("numpy", "jax", "torch")),
                     "jax.jit: " + _cell(by["jax", "jax"], "first_s", _s)])
    for n, by in fg_r.items():
        rows.append([f"grad of f, n = {n:,}", *(_cell(by["jit", e], "first_s", _s) for e in ("numpy", "jax", "torch")),
                     "CasADi: " + _cell(by["casadi", "numpy"], "first_s", _s)
                     + "; un-jitted grad: " + _cell(by["grad", "numpy"], "first_s", _s)])
    notes = [
        "First call of opgraph.jit per engine, in seconds: tracing, optimising, planning, compiling and one call "
        "(median over the processes of tables 1 and 2). Peers: jax.jit's first call (trace, lower, XLA compile, "
        "one step); CasADi: building the SX expression, gradient and Function plus one call; the un-jitted "
        "opgraph.grad's first call (trace and one interpreted call).",
        "Each process first runs the same path on a tiny case (a 3-4-2 MLP; f of 5 scalars), so loading modules "
        "and starting an engine are not counted here (they are in the JSON lines' cold_s).",
        f"An opgraph.jit process still running after {limit:.0f} s (start-up, the first call and the checks) is "
        "stopped: 'skipped (> N s)' cells. At the larger n, an engine whose first call at the smaller n, scaled "
        f"by the ratio of the sizes, predicts more than {limit - 30:.0f} s is not run: 'skipped (~N s > "
        f"{limit - 30:.0f} s)' cells.",
        "The torch engine's MLP step runs in one process only (no torch peer in table 1).",
    ]
    _emit(console, md, "Compile time per engine: first call in s (1 thread)",
          ["graph", "numpy", "jax", "torch", "peers"], rows, notes)


def table(console: Console, run: Callable[..., Result]) -> None:  # run_limited, not run: it needs a limit
    """Run bench/jit_mlp.py and bench/jit_finegrained.py per case; print the tables, write bench/results/jit.md."""
    limit = float(os.environ.get("OPGRAPH_BENCH_JIT_COMPILE_LIMIT", "60")) + 30.0
    header = f"python {sys.version.split()[0]}, " + ", ".join(
        f"{name} {_version(name)}" for name in ("opgraph", "numpy", "jax", "jaxlib", "torch", "optax", "casadi"))
    header += f"; {os.cpu_count()} cores; BLAS/OpenMP/XLA/torch threads 1"
    console.print(header)
    md = [f"## opgraph.jit against its peers ({time.strftime('%Y-%m-%d %H:%M')})", "",
          f"Command: `python bench/run.py jit`; {header}", ""]
    mlp_r = mlp(console, md, limit)
    fg_r = finegrained(console, md, limit)
    compile_times(console, md, mlp_r, fg_r, limit)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text("\n".join(md))
    console.print(f"written: {RESULTS}")
