"""``make bench`` tables for opgraph's NumPy engine (issue 14): dispatch overhead, optimise levels, CNN inference at
1 and 2 threads, real architectures via ONNX, single kernels and the import cost; each table is also written as
markdown to bench/results/numpy_engine.md.

Every measurement runs in its own process (bench/numpy_dispatch.py, numpy_levels.py, numpy_cnn_threads.py,
backends_models.py, numpy_kernels.py, import_cost.py) with the BLAS/OpenMP thread variables set explicitly
(1 everywhere except the 2-thread CNN rows) and torch pinned to the same count. A missing peer leaves its
column empty with a note; a failing script prints its error and the table goes on.

Environment knobs (for development; ``make bench`` uses the defaults):
``OPGRAPH_BENCH_NE_ONLY`` (comma-separated sections: dispatch, levels, cnn, models, kernels, import),
``OPGRAPH_BENCH_NE_MODELS`` (comma-separated model names), ``OPGRAPH_BENCH_NE_REPEAT`` (timed calls or rounds per
process, default 7, at least 5), ``OPGRAPH_BENCH_NE_PROCS`` (fresh processes per CNN row, default 5).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "numpy_engine.md"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
               "NUMBA_NUM_THREADS")
SECTIONS = ("dispatch", "levels", "cnn", "models", "kernels", "import")
MODELS = ("mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "resnet18", "convnext_t", "vit_b16",
          "swin_t", "bert", "gpt2")
MODEL_LABELS = {"mobilenet_v3_small": "MobileNetV3-Small", "mobilenet_v3_large": "MobileNetV3-Large",
                "efficientnet_b0": "EfficientNet-B0", "resnet18": "ResNet-18", "convnext_t": "ConvNeXt-T",
                "vit_b16": "ViT-B/16", "swin_t": "Swin-T", "bert": "BERT (4x256)", "gpt2": "GPT-2 (4x256)",
                "encoder": "encoder (4x256)"}
TIME_NOISE = 1.05  # a level counts as "no slower than level 0" within 5% (the machine is shared)

Run = Callable[..., Any]


def _repeat() -> int:
    return max(5, int(os.environ.get("OPGRAPH_BENCH_NE_REPEAT", "7")))


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _ms(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}" if x < 100 else f"{x:,.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "NO")


class Report:
    """Prints rich tables and collects the same tables as markdown."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.md: list[str] = []

    def table(self, title: str, columns: Sequence[str], rows: list[list[str]], notes: Sequence[str] = ()) -> None:
        t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
        for i, col in enumerate(columns):
            t.add_column(col, justify="left" if i == 0 else "right")
        for row in rows:
            t.add_row(*row)
        self.console.print(t)
        for note in notes:
            self.console.print(f"  {note}", style="dim", markup=False, highlight=False)
        def cell(text: str) -> str:  # a "|" inside a cell would end it
            return text.replace("\n", " ").replace("|", "\\|")

        flat = [cell(c) for c in columns]
        self.md += [f"### {title}", "", "| " + " | ".join(flat) + " |",
                    "|" + "|".join(":---" if i == 0 else "---:" for i in range(len(flat))) + "|"]
        self.md += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
        self.md += [""] + [f"- {n}" for n in notes] + [""]

    def note(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)
        self.md += [text, ""]

    def write(self, header: str) -> None:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text("\n".join([f"## NumPy engine ({time.strftime('%Y-%m-%d %H:%M')})", "", header, "",
                                      "Command: `python bench/run.py numpy_engine`", "", *self.md]))


def run_threads(script: str, threads: int, *args: str) -> dict | None:
    """Like bench/run.py's ``run`` but with every BLAS/OpenMP variable set to ``threads``."""
    env = {**os.environ, **{k: str(threads) for k in THREAD_VARS}}
    proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        Console(stderr=True).print(f"[red]{script} {' '.join(args)} failed:[/red]\n{proc.stderr[-2000:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ 1. dispatch
def dispatch(rep: Report, run: Run) -> None:
    rounds = str(_repeat())
    rows = []
    results = {case: run("numpy_dispatch.py", "--case", case, "--rounds", rounds) for case in ("demo", "tiny")}
    labels = {"demo": "demo training step (MLP 64-128-10, batch 32, float64, momentum)",
              "tiny": "tiny MLP step (16-16-16-4, batch 4, float32, SGD)"}
    goals = {"demo": 1.0, "tiny": 1.1}
    for case, r in results.items():
        if r is None:
            rows.append([labels[case], "failed", "-", "-", f"<= {goals[case]:.1f}x", "-"])
            continue
        rows.append([labels[case], _ms(r["opgraph_ms"], 3), _ms(r["numpy_ms"], 3), _ratio(r["opgraph_ms"],
                     r["numpy_ms"]), f"<= {goals[case]:.1f}x", _met(r["opgraph_ms"] / r["numpy_ms"] <= goals[case])])
    for case, r in results.items():
        if r is None:
            continue
        executed = f", {r['kernels_executed']} run by the engine" if r.get("kernels_executed") is not None else ""
        rows.append([f"per-kernel overhead, {case} ({r['kernels']} kernels{executed})", _ms(r["opgraph_ms"], 3),
                     _ms(r["bare_ms"], 3), f"{r['overhead_us']:.2f} µs/kernel", "<= 0.2 µs/kernel",
                     _met(r["overhead_us"] <= 0.2)])
    rep.table("1. Dispatch overhead: opgraph.compile(optimize(step graph)) on numpy vs hand-written NumPy "
              "(ms per step)",
              ["case", "opgraph\nms", "NumPy\nms", "ratio", "goal", "met"], rows,
              ["demo: examples/demo.py's build_step through opgraph.compile(opgraph.optimize(step.graph)) (level 2, as "
               "the demo's compiled runner and opgraph.optim's runners do); NumPy: the body of its "
               "train_numpy loop. tiny: opgraph.optim.training_step (GraphBuilder, SGD) vs bench/training_common.py's "
               "numpy_step. Both in one process, interleaved: median of "
               f"{rounds} rounds, each ~30 ms of back-to-back steps (parameters updated every step).",
               "per-kernel overhead: (compiled step - sum of the graph's kernels called bare) / kernels. 'NumPy ms' is "
               "that sum: each non-constant op's registered numpy kernel timed alone (timeit) on the same inputs, "
               "into a preallocated out= buffer where the kernel takes one. Below 0: the engine's step is faster "
               "than its graph's kernels called one by one (fewer kernels run, or faster paths than the registered "
               "ones)."])


# ------------------------------------------------------------------------------------------------ 2. levels
LEVEL_IMPLS = ("level0", "level1", "level2", "level3", "numpy", "numpy-inplace")


def levels(rep: Report, run: Run) -> None:
    if not (HERE / "numpy_levels.py").exists():
        rep.note("2. Optimise levels: bench/numpy_levels.py is missing; table skipped.")
        return
    repeat = str(_repeat())
    rows, missing = [], []
    for wl in ("chain", "cnn", "mlp"):
        impls = (*LEVEL_IMPLS[:4], "level3-fast", *LEVEL_IMPLS[4:]) if wl == "chain" else LEVEL_IMPLS
        got = {impl: run("numpy_levels.py", "--workload", wl, "--impl", impl, "--repeat", repeat) for impl in impls}
        base, eager = got.get("level0"), got.get("numpy")
        base = base if base and "median" in base else None
        eager = eager if eager and "median" in eager else None
        for impl, r in got.items():
            if r is None:
                rows.append([wl, impl, "failed", *["-"] * 7])
                continue
            if "median" not in r:
                missing.append(f"{wl} {impl}: {r.get('skipped', 'no result')}")
                continue
            t, peak = r["median"] * 1e3, r["peak_bytes"] / 2**20
            tb = base["median"] * 1e3 if base else None
            pb = base["peak_bytes"] / 2**20 if base else None
            te = eager["median"] * 1e3 if eager else None
            pe = eager["peak_bytes"] / 2**20 if eager else None
            goal, ok, met = "-", None, "-"
            if impl.startswith("level") and impl != "level0" and tb and pb is not None:
                goal, ok = "<= level 0", t <= tb * TIME_NOISE and peak <= pb
                if not ok and t <= tb * TIME_NOISE and peak <= pb * 1.01:  # say how close a near miss is
                    met = f"NO (peak +{(peak - pb) * 1024:.0f} KiB)"
            if wl == "chain" and impl in ("level3", "level3-fast") and te and pe:
                goal = "<= level 0; <= 0.5x / 0.4x NumPy"
                ok = bool(ok) and t <= 0.5 * te and peak <= 0.4 * pe
                met = "-"
            met = _met(ok) if met == "-" else met
            ref = base or eager
            diff = (abs(r["check"] - ref["check"]) / max(abs(ref["check"]), 1e-30)) if ref else None
            rows.append([wl, impl, _ms(t), f"{peak:,.2f}", _ratio(t, tb), _ratio(peak, pb) if pb else "-",
                         _ratio(t, te), _ratio(peak, pe) if pe else "-", goal, met,
                         f"{diff:.0e}" if diff is not None else "-"])
    notes = ["bench/numpy_levels.py, each variant in its own process, 1 thread: time is the median of "
             f"{repeat} calls; peak is tracemalloc's peak over building the callable plus one call (input excluded). "
             "levelN: opgraph.compile(opgraph.optimize(graph, level=N)) on numpy; level3-fast: the same with "
             "fast_math=True (the fused float32 chain as one numba loop, within 3-5 ulp of NumPy per op; its "
             "first call includes numba's compile); numpy: NumPy eager; "
             "numpy-inplace: hand-written NumPy with out= into one buffer.",
             f"goal: every level <= level 0 in time (within {TIME_NOISE - 1:.0%} noise) and peak; chain level 3 "
             "<= 0.5x NumPy eager's time and <= 0.4x its peak. rel diff: the result's sum vs level 0's."]
    if missing:
        notes.append("not measured: " + "; ".join(missing))
    rep.table("2. Optimise levels on the numpy engine (chain / cnn / mlp workloads of bench/backends_workloads.py)",
              ["workload", "variant", "ms", "peak\nMiB", "time /\nlevel 0", "peak /\nlevel 0", "time /\nNumPy",
               "peak /\nNumPy", "goal", "met", "rel diff"], rows, notes)


# ------------------------------------------------------------------------------------------------ 3. CNN threads
def cnn_threads(rep: Report, run: Run) -> None:
    procs = max(5, int(os.environ.get("OPGRAPH_BENCH_NE_PROCS", "5")))
    repeat = str(_repeat())
    impls = ["opgraph-numpy", "numpy", "torch"]
    notes = []
    if not (HERE / "numpy_cnn_eager.py").exists():
        impls.remove("numpy")
        notes.append("bench/numpy_cnn_eager.py is missing: no NumPy eager column.")
    if not _have("torch"):
        impls.remove("torch")
        notes.append("torch is not installed: no torch eager column.")
    rows = []
    for threads in (1, 2):
        per: dict[str, list[float]] = {i: [] for i in impls}
        checks: dict[str, float] = {}
        failed: set[str] = set()
        for _ in range(procs):  # the implementations take turns so a busy spell hits all of them
            for impl in impls:
                if impl in failed:
                    continue
                r = run_threads("numpy_cnn_threads.py", threads, "--impl", impl, "--threads", str(threads),
                                "--repeat", repeat)
                if r is None:
                    failed.add(impl)
                    continue
                per[impl].append(r["median"] * 1e3)
                checks[impl] = r["check"]
        med = {i: statistics.median(v) for i, v in per.items() if v}
        for impl in impls:
            v = per[impl]
            if not v:
                rows.append([str(threads), impl, "failed", *["-"] * 8])
                continue
            ratio_np = _ratio(med[impl], med.get("numpy"))
            ok = med[impl] <= 0.4 * med["numpy"] if impl == "opgraph-numpy" and "numpy" in med else None
            diff = abs(checks[impl] - checks["opgraph-numpy"]) if "opgraph-numpy" in checks else None
            rows.append([str(threads), impl, str(len(v)), _ms(min(v)), _ms(med[impl]), _ms(max(v)), ratio_np,
                         _ratio(med[impl], med.get("torch")), "<= 0.4x NumPy" if impl == "opgraph-numpy" else "",
                         _met(ok), f"{diff:.1e}" if diff is not None else "-"])
    notes = [f"bench/numpy_cnn_threads.py: {procs} fresh processes per implementation and thread count (taking "
             f"turns); each process reports the median of {repeat} calls; min/median/max are across processes. "
             "Threads: OMP/OPENBLAS/MKL/NUMEXPR/NUMBA_NUM_THREADS = N, torch.set_num_threads(N).",
             "Workload: bench/backends_workloads.py's cnn (64x3x32x32 float32, conv 3->32, residual block of two 3x3 "
             "convs, max pool, mean, linear): opgraph-numpy = its opgraph_call('cnn', 'opgraph-numpy'), torch = its "
             "torch_cnn (eager), numpy = bench/numpy_cnn_eager.py on the same cnn_data() weights.",
             f"The machine has {os.cpu_count()} cores: when other work shares them, 2-thread rows oversubscribe and "
             "spread widely (compare min with median).", *notes]
    rep.table("3. CNN inference at 1 and 2 threads (ms per batch of 64)",
              ["threads", "implementation", "procs", "min\nms", "median\nms", "max\nms", "/ NumPy\neager",
               "/ torch\neager", "goal", "met", "|sum diff|\nvs opgraph"], rows, notes)


# ------------------------------------------------------------------------------------------------ 4. models
def models(rep: Report, run: Run) -> None:
    if not _have("torch") or not _have("onnx"):
        rep.note("4. Real architectures: torch and onnx are needed to export the models; table skipped.")
        return
    chosen = os.environ.get("OPGRAPH_BENCH_NE_MODELS")
    names = [m for m in (chosen.split(",") if chosen else MODELS) if m]
    if not _have("transformers"):
        names = [m for m in names if m in ("mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
                                           "resnet18", "encoder")]
        rep.note("transformers is not installed: ViT, ConvNeXt, Swin, BERT and GPT-2 are left out.")
    have_ort = _have("onnxruntime")
    repeat = str(_repeat())
    passes = max(1, int(os.environ.get("OPGRAPH_BENCH_NE_PASSES", "3")))
    rows, notes = [], []
    for name in names:
        label = MODEL_LABELS.get(name, name)
        ex = run("backends_models.py", "--model", name, "--lib", "export", "--repeat", repeat)
        if ex is None:
            rows.append([label, "export failed", *["-"] * 9])
            continue
        libs = {"torch": ["--lib", "torch"], "ort": ["--lib", "onnxruntime"], "og": ["--lib", "opgraph-numpy"],
                "o2": ["--lib", "opgraph-numpy", "--level", "2"]}
        if not have_ort:
            del libs["ort"]
        times: dict[str, list[float]] = {k: [] for k in libs}
        last: dict[str, dict] = {}
        for i in range(passes):  # the four processes take turns, so a busy spell on the machine hits all of them
            for key, extra in libs.items():
                if i > 0 and key not in last:  # failed in the first pass: not retried
                    continue
                r = run("backends_models.py", "--model", name, *extra, "--repeat", repeat)
                if r is not None:
                    times[key].append(r["run"] * 1e3)
                    last[key] = r
        med = {k: statistics.median(v) for k, v in times.items() if v}
        ort, og, o2 = last.get("ort"), last.get("og"), last.get("o2")
        torch_ms = med.get("torch", ex["torch"] * 1e3)
        t0, t2 = med.get("og"), med.get("o2")
        best = min((t for t in (t0, t2) if t is not None), default=None)
        scale = (og or o2 or ort or {}).get("ref_scale")
        rows.append([label, f"{ex['params_m']:.1f}", _ms(torch_ms, 1),
                     _ms(med["ort"], 1) if ort else ("-" if not have_ort else "failed"),
                     _ms(t0, 1) if og else "failed", _ratio(t0, torch_ms), _ms(t2, 1) if o2 else "failed",
                     _ratio(t2, torch_ms), f"{og['max_error']:.1e}" if og else "-",
                     f"{scale:.1e}" if scale is not None else "-", _met(best <= torch_ms if best else None)])
        if og and o2:
            notes.append(f"{label}: {og['ops']} ops imported, {o2.get('ops_optimized', '?')} after level 2 "
                         f"(optimize {o2.get('optimize', 0):.1f} s); import {og['import']:.1f} s, compile "
                         f"{og['compile']:.2f} s; max |err| at level 2 {o2['max_error']:.1e}")
    base = ["bench/backends_models.py: torch eager (the model rebuilt with seed 0), ONNX Runtime (InferenceSession, "
            "1 intra/inter thread) and opgraph (opgraph.io.onnx.from_onnx + opgraph.compile(backend='numpy'), "
            "optionally after opgraph.optimize(level=2)) each in its own process on the same ONNX file "
            "(torch.onnx.export, dynamo=False, opset 18); batch 1, 1 thread. Each process times "
            f"{repeat} calls after a warm-up and reports their median; the four processes (torch, ORT, numpy, "
            f"numpy level 2) take turns {passes} time(s) and the table shows the median over those processes.",
            "MobileNetV3 and EfficientNet-B0: torchvision's architectures in bench/cnn_archs.py (batch-norm statistics "
            "calibrated on random images); ViT-B/16, ConvNeXt-T, Swin-T: transformers' default configs; BERT and "
            "GPT-2: 4 layers, hidden 256, sequence 128 (bench/backends_models.py). Random weights. |out| max: largest "
            "|output| of torch (the error's scale). goal: the numpy engine (better of the two columns) <= torch eager."]
    rep.table("4. Real architectures via ONNX: numpy engine vs PyTorch eager vs ONNX Runtime (ms, batch 1, 1 thread)",
              ["model", "params\nM", "torch\neager", "ORT", "opgraph\nnumpy", "numpy /\ntorch", "numpy\nlevel 2",
               "level 2 /\ntorch", "max |err|\nvs torch", "|out|\nmax", "goal\nmet"], rows, base + notes)


# ------------------------------------------------------------------------------------------------ 5. kernels
def kernels(rep: Report, run: Run) -> None:
    r = run("numpy_kernels.py", "--rounds", str(_repeat()))
    if r is None:
        rep.note("5. Fast kernels: bench/numpy_kernels.py failed (see above).")
        return
    rows = []
    for kind in ("erf", "sigmoid"):
        d = r[kind]
        og, kern, tt = d["opgraph"]["ms"], d["kernel"]["ms"], d.get("torch", {}).get("ms")
        rows.append([f"{kind}, one-op graph", _ms(og, 3), f"torch.{kind}", _ms(tt, 3), _ratio(og, tt), "<= 2x",
                     _met(og <= 2 * tt if tt else None), f"{d['opgraph']['max_err']:.0e}"])
        rows.append([f"{kind}, registered kernel bare", _ms(kern, 3), f"torch.{kind}", _ms(tt, 3), _ratio(kern, tt),
                     "", "", f"{d['kernel']['max_err']:.0e}"])
    p = r["power"]
    rows.append(["power(x, 3.0) level 2", _ms(p["level2"]["ms"], 3), "level 0", _ms(p["level0"]["ms"], 3),
                 _ratio(p["level2"]["ms"], p["level0"]["ms"]), "<= 1x", _met(p["level2"]["ms"] <= p["level0"]["ms"]),
                 f"{p['level2']['max_err']:.0e}"])
    rows.append(["power(x, 3.0) level 0", _ms(p["level0"]["ms"], 3), "NumPy x ** 3.0", _ms(p["numpy"]["ms"], 3),
                 _ratio(p["level0"]["ms"], p["numpy"]["ms"]), "", "", f"{p['level0']['max_err']:.0e}"])
    m = r["matmul"]
    rows.append(["(197,2,768) @ (768,2304) graph", _ms(m["opgraph"]["ms"], 3), "NumPy 2-D GEMM reshaped",
                 _ms(m["numpy"]["ms"], 3), _ratio(m["opgraph"]["ms"], m["numpy"]["ms"]), "", "",
                 f"{m['opgraph']['max_err']:.0e}"])
    notes = ["bench/numpy_kernels.py, one process, 1 thread, float32 (2,197,3072) input unless stated: contenders "
             f"interleaved over {_repeat()} rounds of ~20 ms each, median ms per call. one-op graph: "
             "opgraph.compile(backend='numpy') of a graph with that op; "
             "bare: opgraph.backends.numpy.BACKEND.kernel_for(kind, v)(x); "
             "torch: torch.erf / torch.sigmoid on torch.from_numpy(x). max err: vs the reference column."]
    if "torch" not in r:
        notes.append("torch is not installed: no torch column.")
    rep.table("5. Single kernels (ms per call)", ["kernel", "opgraph\nms", "reference", "reference\nms", "ratio",
                                                  "goal", "met", "max err"], rows, notes)


# ------------------------------------------------------------------------------------------------ 6. import
def import_cost(rep: Report, run: Run) -> None:
    if not (HERE / "import_cost.py").exists():
        rep.note("6. Import cost: bench/import_cost.py is missing; table skipped.")
        return
    r = run("import_cost.py", "--repeat", str(_repeat()))
    if r is None:
        rep.note("6. Import cost: bench/import_cost.py failed (see above).")
        return
    dt, dm = r["opgraph_ms"] - r["numpy_ms"], r["opgraph_rss_mb"] - r["numpy_rss_mb"]
    rows = [["time ms", f"{r['numpy_ms']:.1f}", f"{r['opgraph_ms']:.1f}", f"{dt:+.1f}", "<= 40 ms", _met(dt <= 40)],
            ["peak RSS MB", f"{r['numpy_rss_mb']:.1f}", f"{r['opgraph_rss_mb']:.1f}", f"{dm:+.1f}", "<= 4 MB",
             _met(dm <= 4)]]
    rep.table("6. Import cost: import opgraph vs import numpy (fresh interpreters)",
              ["", "import numpy", "import opgraph", "opgraph over numpy", "goal", "met"], rows,
              [f"bench/import_cost.py: median of {_repeat()} fresh interpreters each, interleaved, bytecode cached; "
               "opgraph's figures include NumPy (it imports it)."])


def table(console: Console, run: Run) -> None:
    """Run the numpy-engine benchmarks and print their tables (also written to bench/results/numpy_engine.md)."""
    import numpy as np

    os.environ["NUMBA_NUM_THREADS"] = "1"  # run() sets the BLAS/OpenMP variables; numba's pool is sized here
    only = [s for s in os.environ.get("OPGRAPH_BENCH_NE_ONLY", "").split(",") if s] or list(SECTIONS)
    header = (f"python {platform.python_version()}, numpy {np.__version__}; {os.cpu_count()} cores; BLAS/OpenMP/numba "
              "threads 1 (2 in the 2-thread CNN rows), torch.set_num_threads to match; " + time.strftime("%Y-%m-%d"))
    console.rule("[bold]NumPy engine (issue 14)")
    console.print(header, markup=False, highlight=False)
    rep = Report(console)
    funcs = {"dispatch": dispatch, "levels": levels, "cnn": cnn_threads, "models": models, "kernels": kernels,
             "import": import_cost}
    for name in SECTIONS:
        if name not in only:
            continue
        try:
            funcs[name](rep, run)
        except Exception:  # one broken section must not hide the others
            rep.note(f"{name}: the table failed:\n{traceback.format_exc(limit=3)}")
        rep.write(header)  # after every section, so an interrupted run keeps what it measured
    console.print(f"written: {RESULTS}")
