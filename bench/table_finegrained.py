"""``python bench/run.py finegrained`` (issue 34): fine-grained graphs on opgraph's engines against CasADi.

Each library, workload and size runs in its own process (bench/finegrained.py, 1 thread); the tables are printed
and written to bench/results/finegrained.md, the raw JSON lines (one per process, appended as they come) to
bench/results/finegrained.json.

1. **Evaluation**: median time per call of opgraph (``numba``, ``c``, ``numpy`` engines) and CasADi (SX
   ``Function``, its virtual machine; and its ``CodeGenerator`` + ``cc -O1``), ratios opgraph / CasADi VM, ns per
   op, and the largest relative difference between opgraph's and CasADi's results (each process has also checked
   its own result against an independent reference before timing). Workloads: the random scalar DAG
   (bench/finegrained_graphs.py) and its gradient (built at graph level, and through
   ``opgraph.jit(opgraph.grad(f))``), RK4 of two coupled pendulums and its gradient, TensCalc's MPC graph.
2. **Build, compile and memory** for the same runs.
3. **Compile-time curve**: the DAG's build + compile on the numba engine (and numpy) from 10^3 to 10^7 ops.

Environment: ``OPGRAPH_BENCH_FG_QUICK=1`` (or ``--quick`` when run directly): sizes 10^3 and 10^4, 3 runs, no 10^7,
short limits. ``OPGRAPH_BENCH_FG_SIZES`` (``1e3,1e4,1e5,1e6``), ``OPGRAPH_BENCH_FG_RK4`` (steps, ``10,100,1000``),
``OPGRAPH_BENCH_FG_JIT_MAX`` (largest DAG for the traced gradient, ``1e5``), ``OPGRAPH_BENCH_FG_CURVE``
(``1e3,1e4,1e5,1e6,1e7``), ``OPGRAPH_BENCH_FG_REPEAT`` (5), ``OPGRAPH_BENCH_FG_CC_LIMIT`` (gcc seconds, 60),
``OPGRAPH_BENCH_FG_LIMIT`` (seconds per process, 900), ``OPGRAPH_BENCH_FG_ENGINES`` (``numba,c,numpy``),
``OPGRAPH_BENCH_FG_OUT`` (the results' file name, ``finegrained``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from tables import emit

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                            "NUMBA_NUM_THREADS")}
AGREE_RTOL = 1e-9
Result = dict[str, Any]


def _sizes(name: str, default: str) -> list[int]:
    return [int(float(s)) for s in os.environ.get(name, default).replace(" ", "").split(",") if s]


def config(quick: bool) -> dict[str, Any]:
    """Sizes, repeats and limits from the environment (module doc)."""
    return {
        "quick": quick,
        "sizes": _sizes("OPGRAPH_BENCH_FG_SIZES", "1e3,1e4" if quick else "1e3,1e4,1e5,1e6"),
        "rk4": _sizes("OPGRAPH_BENCH_FG_RK4", "10" if quick else "10,100,1000"),
        "jit_max": int(float(os.environ.get("OPGRAPH_BENCH_FG_JIT_MAX", "1e3" if quick else "1e5"))),
        "curve": _sizes("OPGRAPH_BENCH_FG_CURVE", "" if quick else "1e3,1e4,1e5,1e6,1e7"),
        "repeat": int(os.environ.get("OPGRAPH_BENCH_FG_REPEAT", "3" if quick else "5")),
        "cc_limit": float(os.environ.get("OPGRAPH_BENCH_FG_CC_LIMIT", "20" if quick else "60")),
        "limit": float(os.environ.get("OPGRAPH_BENCH_FG_LIMIT", "120" if quick else "900")),
        "engines": [e for e in os.environ.get("OPGRAPH_BENCH_FG_ENGINES", "numba,c,numpy").split(",") if e],
        "out": os.environ.get("OPGRAPH_BENCH_FG_OUT") or ("finegrained_quick" if quick else "finegrained"),
    }


def _keep(cfg: dict[str, Any], r: Result) -> Result:
    """Append ``r`` to the raw results as it comes (a long run stopped halfway keeps what it measured)."""
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / f"{cfg['out']}.json", "a") as f:
        f.write(json.dumps(r) + "\n")
    return r


def run_case(args: list[str], limit: float) -> Result:
    """One bench/finegrained.py process, stopped after ``limit`` seconds; ``error`` says why there is no result."""
    env = {**os.environ, **THREADS}
    Console(stderr=True).print(f"[dim]finegrained: {' '.join(args)} ...[/dim]")
    try:
        proc = subprocess.run([sys.executable, str(HERE / "finegrained.py"), *args], capture_output=True,
                              text=True, env=env, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"error": f"> {limit:.0f} s (process stopped)"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])  # type: ignore[no-any-return]
        except json.JSONDecodeError:
            pass
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    Console(stderr=True).print(f"[red]finegrained.py {' '.join(args)} failed:[/red]\n{proc.stderr[-2000:]}")
    return {"error": f"failed: {tail[:150]}"}


# ----------------------------------------------------------------------------- formatting
def _pow(n: int) -> str:
    k = len(str(n)) - 1
    return f"10^{k}" if n == 10**k else f"{n:,}"


def _time(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def _ok(r: Result | None) -> bool:
    return r is not None and "error" not in r


def _get(r: Result | None, key: str) -> float | None:
    return r.get(key) if _ok(r) else None  # type: ignore[union-attr]


class Cells:
    """Table cells, with long reasons (n/a ...) moved to numbered notes."""

    def __init__(self) -> None:
        self.why: list[str] = []

    def cell(self, r: Result | None, fmt: Callable[[Result], str]) -> str:
        if r is None:
            return "-"
        if "error" in r:
            why = r["error"]
            if len(why) <= 18:
                return why
            if why not in self.why:
                self.why.append(why)
            return f"({self.why.index(why) + 1})"
        return fmt(r)

    def notes(self) -> list[str]:
        return [f"({i + 1}) {why}" for i, why in enumerate(self.why)]


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _per_op(r: Result | None, key: str, scale: float, unit: str = "") -> str:
    v = _get(r, key)
    ops = _get(r, "ops")
    return "-" if v is None or not ops else f"{_num(v / ops * scale)}{unit}"


def _num(x: float) -> str:
    """Three significant digits, thousands separated (no exponents)."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _agree(og: list[Result | None], peer: Result | None) -> str:
    """The largest relative difference between opgraph's results and CasADi's (flagged above AGREE_RTOL)."""
    want = peer.get("value") if _ok(peer) else None  # type: ignore[union-attr]
    diffs = []
    for r in og:
        got = r.get("value") if _ok(r) else None  # type: ignore[union-attr]
        if got is None or want is None or len(got) != len(want):
            continue
        scale = max(max(abs(w) for w in want), 1e-300)
        diffs.append(max(abs(a - b) for a, b in zip(got, want, strict=True)) / scale)
    if not diffs:
        return "-"
    d = max(diffs)
    return f"{d:.1e}" + ("" if d <= AGREE_RTOL else " DIFFER")


# ----------------------------------------------------------------------------- the runs
def cases(cfg: dict[str, Any]) -> list[tuple[str, int, list[str]]]:
    """(row label, size, finegrained.py arguments common to the row's libraries)."""
    out = []
    for n in cfg["sizes"]:
        out.append(("DAG", n, ["--workload", "dag", "--n", str(n)]))
    for n in cfg["sizes"]:
        out.append(("DAG grad", n, ["--workload", "dag", "--n", str(n), "--grad"]))
    for n in cfg["sizes"]:
        if n <= cfg["jit_max"]:
            out.append(("DAG grad jit", n, ["--workload", "dag", "--n", str(n), "--grad", "--path", "jit"]))
    for steps in cfg["rk4"]:
        out.append(("RK4 steps", steps, ["--workload", "rk4", "--n", str(steps)]))
    for steps in cfg["rk4"]:
        out.append(("RK4 grad, steps", steps, ["--workload", "rk4", "--n", str(steps), "--grad"]))
    out.append(("TensCalc MPC", 0, ["--workload", "mpc"]))
    return out


def run_all(cfg: dict[str, Any]) -> list[tuple[str, int, dict[str, Result | None]]]:
    """Every case on every library; CasADi only once per (workload, gradient) for the two gradient paths, and
    its codegen skipped at larger sizes once gcc ran out of time at a smaller one."""
    rep, lim = ["--repeat", str(cfg["repeat"])], cfg["limit"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{cfg['out']}.json").write_text("")
    results: list[tuple[str, int, dict[str, Result | None]]] = []
    peers: dict[tuple[str, ...], Result] = {}
    cc_out: dict[str, Result] = {}
    for label, n, args in cases(cfg):
        row: dict[str, Result | None] = {}
        for engine in cfg["engines"]:
            row[engine] = _keep(cfg, run_case([*args, "--lib", "opgraph", "--backend", engine, *rep], lim))
        key = tuple(a for a in args if a not in ("--path", "jit"))
        for lib in ("casadi", "casadi_cc"):
            family = label.removesuffix(" jit") + lib
            if (*key, lib) in peers:
                row[lib] = peers[(*key, lib)]
            elif lib == "casadi_cc" and family in cc_out:
                row[lib] = {**cc_out[family], "skipped": True}
            else:
                extra = ["--cc-limit", str(cfg["cc_limit"])] if lib == "casadi_cc" else []
                row[lib] = peers[(*key, lib)] = _keep(cfg, run_case([*args, "--lib", lib, *rep, *extra], lim))
                err = row[lib].get("error", "")  # type: ignore[union-attr]
                if lib == "casadi_cc" and (err.startswith("gcc >") or err.startswith(">")):
                    cc_out[family] = row[lib]  # type: ignore[assignment]
        results.append((label, n, row))
    return results


def curve(cfg: dict[str, Any], done: list[tuple[str, int, dict[str, Result | None]]]
          ) -> dict[int, dict[str, Result | None]]:
    """Build + compile of the DAG per size on numba (and numpy up to 10^6): the evaluation runs are reused, larger
    sizes run once (one call timed)."""
    have = {n: row for label, n, row in done if label == "DAG"}
    out: dict[int, dict[str, Result | None]] = {}
    for n in cfg["curve"]:
        out[n] = {}
        for engine in ("numba", "numpy"):
            if engine not in cfg["engines"]:
                continue
            if n in have and engine in have[n]:
                out[n][engine] = have[n][engine]
            elif engine == "numba" or n <= 10**6:
                out[n][engine] = _keep(cfg, run_case(["--workload", "dag", "--n", str(n), "--lib", "opgraph",
                                                      "--backend", engine, "--repeat", "1"], cfg["limit"]))
    return out


# ----------------------------------------------------------------------------- the tables
def _label(label: str, n: int) -> tuple[str]:
    return (f"{label} {_pow(n)}" if n else label,)


def eval_table(console: Console, md: list[str], cfg: dict[str, Any],
               results: list[tuple[str, int, dict[str, Result | None]]]) -> None:
    c = Cells()
    eng = cfg["engines"]
    rows = []
    for label, n, row in results:
        ops = next((r["ops"] for r in row.values() if _ok(r) and r.get("ops")), None)
        sx = _get(row.get("casadi"), "call_s")
        rows.append([*_label(label, n), "-" if ops is None else f"{ops:,}",
                     *[c.cell(row[e], lambda r: _time(r["call_s"])) for e in eng],
                     c.cell(row["casadi"], lambda r: _time(r["call_s"])),
                     c.cell(row["casadi_cc"], lambda r: _time(r["call_s"])),
                     *[_ratio(_get(row[e], "call_s"), sx) for e in eng],
                     *[_per_op(row[e], "call_s", 1e9) for e in eng[:2]],
                     _per_op(row["casadi"], "call_s", 1e9),
                     _agree([row[e] for e in eng], row["casadi"])])
    cols = ["workload", "ops", *eng, "SX", "SX cc", *[f"{e}/SX" for e in eng],
            *[f"ns/op {e}" for e in eng[:2]], "ns/op SX", "vs SX"]
    notes = [
        f"Time per call: the median over {cfg['repeat']} samples (each a loop of calls of ~20 ms, after a warm-up "
        "call); each library, workload and size in its own process, 1 thread (OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS=1). "
        "x/SX: opgraph's time / CasADi SX Function's (its virtual machine); below 1 opgraph is faster.",
        "ops: operations in the graph the engine runs (opgraph; constants left out for the MPC graph), else CasADi's "
        "n_instructions (which counts its input/output instructions). ns/op: time per call / ops.",
        "DAG: 64 float64 inputs (one vector, 64 getitem ops in opgraph), n ops of add/subtract/multiply/sin/cos/"
        "constant scaling, each reading the previous value and a random earlier bounded one; one output. "
        "Gradient (graph): the same ops in a GraphBuilder + build_grad_ops, then opgraph.compile; gradient (jit): "
        "opgraph.jit(opgraph.grad(f), backend=engine) of f traced over opgraph.numpy. CasADi: "
        "Function('g', [x], [gradient(y, x)]).",
        "RK4: steps of classic RK4 (h = 0.01) of two coupled damped pendulums (4 states, output the final state), "
        "written once over scalars (opgraph traces it over opgraph.numpy, CasADi runs it on SX); gradient: of the "
        "final state's sum of squares.",
        "TensCalc MPC: /work/shared/tenscalc/mpc_medium scalarized (a unicycle MPC written by TensCalc), outputs of "
        "the get_JgH gateway (J, g, H), inputs of reference.json; checked against TensCalc's values (1e-12). "
        "CasADi cannot read TensCalc .cg files.",
        "CasADi cc: CodeGenerator C, cc -O1 -shared, casadi.external; gcc stopped after "
        f"{cfg['cc_limit']:.0f} s, and not tried at larger sizes of the same workload after that.",
        "vs CasADi: largest |opgraph - CasADi| / max |CasADi| over the opgraph engines (results agree to "
        f"{AGREE_RTOL:g} unless marked DIFFER); every process also checked its own result against a plain-Python "
        "reference (values 1e-9 relative; gradients: central differences on 4 coordinates, 1e-5).",
        "Goals (issue 34): numba <= 1.0x CasADi SX from 10^4 ops up; TensCalc graphs <= 20 ns/op; gradient "
        "<= 1.0x CasADi's gradient Function.",
    ]
    emit(console, md, "Fine-grained evaluation: time per call", cols, rows, notes + c.notes())


def compile_table(console: Console, md: list[str], cfg: dict[str, Any],
                  results: list[tuple[str, int, dict[str, Result | None]]]) -> None:
    c = Cells()
    eng = cfg["engines"]
    rows = []
    for label, n, row in results:
        first = next((r for r in (row[e] for e in eng) if _ok(r)), None)
        rows.append([*_label(label, n), "-" if first is None else f"{first['build_s']:.3g}",
                     *[c.cell(row[e], lambda r: f"{r['compile_s']:.3g}") for e in eng],
                     *[c.cell(row[e], lambda r: _num((r['build_s'] + r['compile_s']) / r['ops'] * 1e6))
                       for e in eng],
                     *[c.cell(row[e], lambda r: _num(max(0, r['mem_kept']) / r['ops'])) for e in eng],
                     c.cell(row["casadi"], lambda r: f"{r['build_s']:.3g}"),
                     c.cell(row["casadi_cc"], lambda r: f"{r['codegen_s']:.3g} + {r['cc_s']:.3g}")])
    cols = ["workload", "build s", *[f"{e} compile s" for e in eng],
            *[f"{e} us/op" for e in eng], *[f"{e} B/op" for e in eng], "SX build s", "SX codegen+cc s"]
    notes = [
        "us/op: (build + compile) / ops. B/op: kept (below) / ops. build: making the graph (from arrays; "
        "GraphBuilder for the graph-level gradient; loading the .cg files; "
        "tracing the Python function for RK4), from the first opgraph engine's process. compile: "
        "opgraph.compile(graph, backend) and its first call (jit gradient: opgraph.jit(opgraph.grad(f)) and its "
        "first call, tracing included; build then 0).",
        "kept: RSS held after compiling and the timed calls minus the RSS before compiling (graph already built), "
        "per op: what the compiled program keeps while it runs. RSS below ~10^5 ops is page noise.",
        "CasADi SX build: the SX expression and Function from Python (one call per op); codegen + cc: "
        "CodeGenerator and cc -O1 -shared seconds.",
        "Goal (issue 34): build + compile <= 2 us/op, linear from 10^3 to 10^7; <= 64 B/op while running.",
    ]
    emit(console, md, "Fine-grained build, compile and memory", cols, rows, notes + c.notes())


def curve_table(console: Console, md: list[str], data: dict[int, dict[str, Result | None]]) -> None:
    if not data:
        return
    c = Cells()
    engines = [e for e in ("numba", "numpy") if any(e in d for d in data.values())]
    rows = []
    for n, by in data.items():
        row = [_pow(n)]
        first = next((r for r in by.values() if _ok(r)), None)
        row.append("-" if first is None else f"{first['build_s']:.3g}")
        for e in engines:
            r = by.get(e)
            row += [c.cell(r, lambda r: f"{r['compile_s']:.3g}"),
                    c.cell(r, lambda r: _num((r['build_s'] + r['compile_s']) / r['ops'] * 1e6)),
                    c.cell(r, lambda r: _num(r['mem_compile_peak'] / r['ops'])),
                    c.cell(r, lambda r: _num(max(0, r['mem_kept']) / r['ops'])),
                    c.cell(r, lambda r: _num(r['call_s'] / r['ops'] * 1e9))]
        rows.append(row)
    cols = ["ops", "build s"]
    for e in engines:
        cols += [f"{e} compile s", f"{e} us/op", f"{e} peak B/op", f"{e} kept B/op", f"{e} ns/op"]
    notes = ["us/op: (build + compile) / ops. The random DAG: build = generating the arrays + Graph.from_arrays "
             "(checked); compile = "
             "opgraph.compile + first call; peak: RSS high-water mark during compile and first call minus the RSS "
             "before (graph built); kept: as in the table above. Sizes beyond the evaluation table run once "
             "(one timed call); numpy only up to 10^6."]
    emit(console, md, "Compile-time curve (random DAG)", cols, rows, notes + c.notes())


def table(console: Console, run: Any = None, quick: bool | None = None) -> None:
    """Run every case (bench/finegrained.py per library, workload and size), print the tables, save the results.

    ``run`` (bench/run.py's runner) is not used: these processes need a time limit.
    """
    if quick is None:
        quick = os.environ.get("OPGRAPH_BENCH_FG_QUICK", "") not in ("", "0")
    cfg = config(quick)
    import casadi
    import numba
    import numpy

    header = (f"python {sys.version.split()[0]}, numpy {numpy.__version__}, numba {numba.__version__}, casadi "
              f"{casadi.__version__}; {os.cpu_count()} cores, 1 thread per process"
              + ("; QUICK mode" if quick else ""))
    console.print(header)
    results = run_all(cfg)
    crv = curve(cfg, results)
    md = [f"## Fine-grained graphs against CasADi ({time.strftime('%Y-%m-%d %H:%M')})", "",
          f"Command: `{'OPGRAPH_BENCH_FG_QUICK=1 ' if quick else ''}python bench/run.py finegrained`; {header}", ""]
    eval_table(console, md, cfg, results)
    compile_table(console, md, cfg, results)
    curve_table(console, md, crv)
    RESULTS.mkdir(exist_ok=True)
    name = cfg["out"]
    (RESULTS / f"{name}.md").write_text("\n".join(md))
    console.print(f"written: {RESULTS / (name + '.md')}, {RESULTS / (name + '.json')}")


if __name__ == "__main__":
    table(Console(width=160), quick=True if "--quick" in sys.argv[1:] else None)
