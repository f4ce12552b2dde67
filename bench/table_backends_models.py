"""``make bench`` table (issue 35): twelve real architectures from torchvision and transformers, exported with
``torch.onnx.export(dynamo=True)``, loaded with ``opgraph.load``, ``opgraph.optimize(level=2)`` and
``opgraph.compile(backend="auto")``, next to ONNX Runtime on the same file and PyTorch eager on the same model.

    python bench/run.py backends_models                                   # make bench's way (1 thread)
    python bench/table_backends_models.py --threads 2 --models tv_resnet18,bert

Per model (bench/backends_models.py, each library in a process of its own, every BLAS/OpenMP variable, torch's
thread count and ONNX Runtime's intra/inter-op threads set to ``--threads``; ``OPGRAPH_BENCH_ARCH_THREADS`` under
bench/run.py, default 1 as for every other table): one process builds the model (random weights, seed 0, no
downloads) and exports it; then torch eager, ONNX Runtime and opgraph each time the model in blocks of
consecutive calls (about 0.2 s of calls per block, at least one call; 7 blocks) and report every block's
median. Models whose fastest library runs under ``SMALL_MS`` get ``SMALL_PASSES`` passes over the three
processes (in a rotating order, so a busy spell on the shared machine falls on all of them); a column's time is
the median of all its block medians. opgraph's first call (``opgraph.load`` + ``optimize`` + ``compile`` + the
first call, without the package's own import) is the first pass's: a later process may find a cached choice.

Environment knobs: ``OPGRAPH_BENCH_ARCH_MODELS`` (comma-separated names from :data:`ARCHS`),
``OPGRAPH_BENCH_ARCH_THREADS``, ``OPGRAPH_BENCH_ARCH_PASSES`` (passes for the small models, default 3),
``OPGRAPH_BENCH_ARCH_REUSE=1`` (keep the exports in the cache, ``$OPGRAPH_BENCH_CACHE``, from an earlier run; the
script's ``--reuse`` and ``--export-only`` do the same from the command line). The table
is also written to bench/results/backends_models.md and the raw JSON lines to backends_models.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from tables import emit  # noqa: E402 -- bench/ is not a package: its directory goes on the path first

RESULTS = HERE / "results"
ARCHS = (("tv_resnet18", "ResNet-18"), ("tv_shufflenet_v2_x1_0", "ShuffleNetV2 (x1.0)"),
         ("tv_regnet_y_400mf", "RegNetY-400MF"), ("tv_efficientnet_b0", "EfficientNet-B0"), ("tv_swin_t", "Swin-T"),
         ("tv_squeezenet1_1", "SqueezeNet 1.1"), ("bert", "BERT (4x256)"), ("tv_convnext_tiny", "ConvNeXt-T"),
         ("tv_mobilenet_v3_small", "MobileNetV3-S"), ("tv_vit_b_16", "ViT-B/16"), ("gpt2", "GPT-2 (4x256)"),
         ("tv_densenet121", "DenseNet-121"))
"""(bench/backends_models.py name, label) in the issue's order."""
COST_ORDER = ("tv_squeezenet1_1", "tv_mobilenet_v3_small", "tv_shufflenet_v2_x1_0", "bert", "gpt2",
              "tv_regnet_y_400mf", "tv_efficientnet_b0", "tv_resnet18", "tv_densenet121", "tv_convnext_tiny",
              "tv_swin_t", "tv_vit_b_16")
"""The order the models are measured in: cheapest first."""
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
               "NUMBA_NUM_THREADS")
LIBS = ("torch", "onnxruntime", "opgraph-auto")
BLOCKS = 7
SMALL_MS = 10.0
"""Models whose fastest library runs under this many ms get more passes (their times move most with load)."""
SMALL_PASSES = 3
TIMEOUT_S = 1800
SHORT = {"onnxruntime": "ORT"}


def run_lib(threads: int, *args: str) -> tuple[dict[str, Any] | None, str]:
    """bench/backends_models.py ``args`` in a fresh process with ``threads`` everywhere: its JSON line, or None and
    the last line of its error."""
    env = {**os.environ, **{k: str(threads) for k in THREAD_VARS}}
    cmd = [sys.executable, str(HERE / "backends_models.py"), *args, "--dynamo", "--threads", str(threads)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {TIMEOUT_S} s"
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        Console(stderr=True).print(f"[red]backends_models.py {' '.join(args)} failed:[/red]\n{proc.stderr[-2000:]}",
                                   markup=True, highlight=False)
        return None, lines[-1][:200] if lines else f"exit status {proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), ""


def missing(name: str) -> str | None:
    """Why model ``name`` cannot be built here (a package not installed), or None."""
    package = "torchvision" if name.startswith("tv_") else "transformers" if name in ("bert", "gpt2") else None
    for pkg in ("torch", package):
        if pkg and importlib.util.find_spec(pkg) is None:
            return f"{pkg} not installed"
    return None


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _auto_summary(og: dict[str, Any]) -> str:
    """auto's choice and each engine's median (or why it was not timed, cut short) in one line."""
    timed = sorted((t, n) for n, t in og["timings"].items() if t is not None)
    parts = [f"{n} {_ms(t)}" for t, n in timed]
    for n, st in og.get("status", {}).items():
        if st != "timed":
            parts.append(f"{n} {st[:90]}{'...' if len(st) > 90 else ''}")
    return f"auto chose {og['choice']} (ms: " + "; ".join(parts) + ")"


def measure(name: str, threads: int, passes: int, progress: Console, reuse: bool = False) -> dict[str, Any]:
    """Export ``name`` and time it on every library: the export's JSON, each library's JSON lines and errors."""
    progress.print(f"[dim]backends_models: {name} export ...[/dim]")
    exported, err = run_lib(threads, "--model", name, "--lib", "export", *(["--reuse"] if reuse else []))
    record: dict[str, Any] = {"model": name, "threads": threads, "export": exported, "export_error": err,
                              "runs": {lib: [] for lib in LIBS}, "errors": {}}
    if exported is None:
        return record
    order = list(LIBS)
    for i in range(passes):
        for lib in order:
            if i > 0 and not record["runs"][lib]:  # failed in the first pass: not retried
                continue
            progress.print(f"[dim]backends_models: {name} {lib} (pass {i + 1}) ...[/dim]")
            r, err = run_lib(threads, "--model", name, "--lib", lib, "--blocks", str(BLOCKS))
            if r is None:
                record["errors"][lib] = err
            else:
                record["runs"][lib].append(r)
        fastest = min((r["run"] for runs in record["runs"].values() for r in runs), default=None)
        if i == 0 and (fastest is None or fastest * 1e3 >= SMALL_MS):
            break  # large models: one pass (their calls take long enough to average the noise)
        order = order[1:] + order[:1]
    if record["runs"]["opgraph-auto"]:  # a second process finds auto's choice in the on-disk cache
        progress.print(f"[dim]backends_models: {name} opgraph-auto (cached choice) ...[/dim]")
        r, err = run_lib(threads, "--model", name, "--lib", "opgraph-auto", "--blocks", "5")
        record["cached"] = r
        if r is None:
            record["errors"]["opgraph-auto (cached)"] = err
    return record


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """Per library: the median of all its block medians (seconds); opgraph's choice, first call and check."""
    out: dict[str, Any] = {}
    for lib, runs in record["runs"].items():
        blocks = [b for r in runs for b in r.get("blocks", [r["run"]])]
        out[lib] = statistics.median(blocks) if blocks else None
        out[f"{lib}_processes"] = len(runs)
    og = record["runs"]["opgraph-auto"]
    out["og"] = og[0] if og else None
    return out


def table(console: Console, run: Callable[..., Any] | None = None, *, threads: int | None = None,
          models: list[str] | None = None, passes: int | None = None, reuse: bool | None = None) -> None:
    """Measure every architecture and print the table (bench/run.py's ``run`` is not used: the thread count is
    this table's own)."""
    threads = threads or int(os.environ.get("OPGRAPH_BENCH_ARCH_THREADS", "1"))
    passes = passes or int(os.environ.get("OPGRAPH_BENCH_ARCH_PASSES", str(SMALL_PASSES)))
    if reuse is None:
        reuse = os.environ.get("OPGRAPH_BENCH_ARCH_REUSE", "") not in ("", "0")
    chosen = models or [m for m in os.environ.get("OPGRAPH_BENCH_ARCH_MODELS", "").split(",") if m]
    labels = dict(ARCHS)
    unknown = [m for m in chosen if m not in labels]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {[m for m, _ in ARCHS]}")
    names = chosen or [m for m, _ in ARCHS]
    # auto's on-disk choice cache starts empty, so the first process of each model measures a real first choice
    # and the cached run after its passes a second process's start (OPGRAPH_CACHE_DIR set by the caller is kept)
    os.environ.setdefault("OPGRAPH_CACHE_DIR", tempfile.mkdtemp(prefix="opgraph-bench-auto-"))
    progress = Console(stderr=True)
    RESULTS.mkdir(exist_ok=True)
    raw = RESULTS / "backends_models.json"
    raw.write_text("")
    records = []
    for name in sorted(names, key=COST_ORDER.index):  # the cheap ones first: an interrupted run has the most rows
        why = missing(name)
        record = {"model": name, "threads": threads, "missing": why} if why else measure(
            name, threads, passes, progress, reuse)
        records.append(record)
        with raw.open("a") as f:  # line by line: an interrupted run keeps what it measured (see --from-json)
            f.write(json.dumps(record) + "\n")
    render(console, records, threads, passes)


def render(console: Console, records: list[dict[str, Any]], threads: int, passes: int,
           expected: list[str] | None = None) -> None:
    """Print the table of ``records`` (:func:`measure`'s) in the issue's order and write it to
    bench/results/backends_models.md; a model of ``expected`` without a record is "not measured"."""
    labels = dict(ARCHS)
    order = [m for m, _ in ARCHS]
    by_name = {r["model"]: r for r in records}
    for name in expected or []:
        by_name.setdefault(name, {"model": name, "missing": "not measured (run cut short)"})
    rows, notes = [], []
    ratios, ratios_ort, firsts, cached = [], [], [], []
    for record in sorted(by_name.values(), key=lambda r: order.index(r["model"])):
        name = record["model"]
        label = labels[name]
        if record.get("missing"):
            rows.append([label, record["missing"], *["-"] * 10])
            continue
        ex = record["export"]
        if ex is None:
            rows.append([label, f"export failed: {record['export_error'][:60]}", *["-"] * 10])
            continue
        s = summarize(record)
        og, ort, eager = s["og"], s["onnxruntime"], s["torch"]
        auto = s["opgraph-auto"]
        fastest = min((t for t in (ort, eager) if t is not None), default=None)
        ratio = auto / fastest if auto and fastest else None
        ratio_ort = auto / ort if auto and ort else None
        if ratio is not None:
            ratios.append(ratio)
        if ratio_ort is not None:
            ratios_ort.append(ratio_ort)
        if og:
            firsts.append(og["first_call"])
        warm = (record.get("cached") or {}).get("first_call")
        if warm is not None:
            cached.append(warm)
        exporter = "dynamo" if ex["exporter"] == "dynamo" else "TorchScript"
        source = "torchvision" if name.startswith("tv_") else "transformers"
        check = "-"
        if og:
            check = "yes" if og["export_check"] == "ok" else "NO"
        rows.append([label, f"{source}, {exporter}",
                     SHORT.get(og["choice"], og["choice"]) if og else "failed",
                     f"{og['first_call']:.1f}" if og else "-", f"{warm:.1f}" if warm is not None else "-",
                     _ms(auto) if og else "failed",
                     _ms(ort) if ort is not None else "failed", _ms(eager) if eager is not None else "failed",
                     f"{ratio:.2f}" if ratio else "-", f"{ratio_ort:.2f}" if ratio_ort else "-", check,
                     f"{og['max_error'] / og['ref_scale']:.0e}" if og and og["ref_scale"] else "-"])
        if ex["exporter"] != "dynamo":
            notes.append(f"{label}: exported with dynamo=False: {ex['exporter']}")
        for lib, err in record["errors"].items():
            notes.append(f"{label}: {lib} failed: {err}")
        if og:
            n = s["opgraph-auto_processes"]
            line = (f"{label}: {_auto_summary(og)}; first call {og['first_call']:.1f} s = load {og['import']:.1f} + "
                    f"optimize {og['optimize']:.1f} + compile and choose {og['choose']:.1f}")
            if n > 1:
                line += " (first pass; later passes " + ", ".join(
                    f"{r['first_call']:.1f}" for r in record["runs"]["opgraph-auto"][1:]) + " s)"
            if og["export_check"] != "ok":
                line += f"; opgraph's export: {og['export_check'][:160]}"
            notes.append(line)
    gm, gm_ort, gm_first, gm_cached = _geomean(ratios), _geomean(ratios_ort), _geomean(firsts), _geomean(cached)
    rows.append(["geometric mean", "", "", f"{gm_first:.1f}" if gm_first else "-",
                 f"{gm_cached:.1f}" if gm_cached else "-", "", "", "",
                 f"{gm:.2f}" if gm else "-", f"{gm_ort:.2f}" if gm_ort else "-", "", ""])
    met_speed = sum(r <= 1.05 for r in ratios)
    met_first = sum(f <= 5.0 for f in firsts)
    met_cached = sum(f <= 5.0 for f in cached)
    header = (f"{os.cpu_count()} cores; {threads} thread(s) for every library (BLAS/OpenMP variables, "
              f"torch.set_num_threads, ONNX Runtime intra/inter-op); batch 1")
    title = (f"Real architectures via torch.onnx.export(dynamo=True): opgraph auto vs ONNX Runtime vs torch eager "
             f"(ms, {threads} thread(s))")
    base = [header,
            "Each library in its own process; each process times 7 blocks of consecutive calls (about 0.2 s of calls "
            f"per block, at least 1) after two warm-up calls; models under {SMALL_MS:g} ms get {passes} passes over "
            "the three processes in a rotating order; a time is the median of all the blocks' medians.",
            "auto: opgraph.load + opgraph.optimize(level=2) + opgraph.compile(backend=\"auto\") (its default budget), "
            "then steady-state calls of the same compiled function. first call s: load + optimize + compile + the "
            "first call (auto's choice), the first process's (goal <= 5 s), with auto's on-disk choice cache empty; "
            "cached s: the same in one more process after the timed ones, which finds the choice in that cache. "
            "auto / fastest: auto over the faster of "
            "ORT and torch eager (goal <= 1.05).",
            "Models: torchvision's constructors (weights=None, seed 0, batch norms calibrated on random images; "
            "ViT-B/16, ConvNeXt-T and Swin-T too) and transformers' BertModel / GPT2Model (4 layers, hidden 256, "
            "4 heads, sequence 128, eager attention); 224x224 images. No downloads.",
            "export ok: opgraph's own ONNX export (opgraph.io.onnx.to_onnx) of the optimised graph passes "
            "onnx.checker.check_model(full_check=True). rel err: auto's largest difference from torch's output "
            "over torch's largest |output|.",
            f"goals met: auto <= 1.05x fastest on {met_speed} of {len(ratios)}; first call <= 5 s on {met_first} "
            f"of {len(firsts)} (cached: {met_cached} of {len(cached)})."]
    md = [f"## Real architectures ({time.strftime('%Y-%m-%d %H:%M')})", "",
          f"Command: `OPGRAPH_BENCH_ARCH_THREADS={threads} python bench/run.py backends_models`", ""]
    emit(console, md, title,
         ["model", "built, exported", "auto chose", "first call s", "cached s", "auto ms", "ORT ms", "eager ms",
          "auto / fastest", "auto / ORT", "export ok", "rel err"], rows, base + notes)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "backends_models.md").write_text("\n".join(md))
    console.print(f"written: {RESULTS / 'backends_models.md'} (raw: {RESULTS / 'backends_models.json'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="threads for every library (default 1)")
    ap.add_argument("--models", default="", help="comma-separated: " + ",".join(m for m, _ in ARCHS))
    ap.add_argument("--passes", type=int, default=None, help=f"passes for the small models (default {SMALL_PASSES})")
    ap.add_argument("--reuse", action="store_true", help="keep the exports an earlier run left in the cache")
    ap.add_argument("--export-only", action="store_true", help="only export the models (to the cache)")
    ap.add_argument("--from-json", type=Path, default=None,
                    help="print the table of a backends_models.json written by an earlier (perhaps interrupted) run")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m] or None
    if args.from_json:
        records = [json.loads(line) for line in args.from_json.read_text().splitlines() if line.strip()]
        render(Console(width=160), records, records[0]["threads"] if records else 1, args.passes or SMALL_PASSES,
               expected=models or [m for m, _ in ARCHS])
        return
    if args.export_only:
        for name in models or [m for m, _ in ARCHS]:
            threads = args.threads or 1
            r, err = run_lib(threads, "--model", name, "--lib", "export", *(["--reuse"] if args.reuse else []))
            print(name, json.dumps(r) if r else f"failed: {err}", flush=True)
        return
    table(Console(width=160), threads=args.threads, models=models, passes=args.passes, reuse=args.reuse)


if __name__ == "__main__":
    main()
