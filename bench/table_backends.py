"""``make bench`` table: opgraph's backends vs the same work run directly on each engine.

Rows are workloads (bench/backends_workloads.py): an MLP training step, a ResNet-style CNN's
inference and a 20-op elementwise chain. Columns are opgraph compiled on every backend
(``opgraph.compile(graph, backend=...)``, and ``"auto"`` with the backend it picked), then the
peers run directly: NumPy eager, ``jax.jit``, torch eager, ``torch.compile`` and an ONNX Runtime
session of the same graph exported by ``opgraph.io.onnx.to_onnx``. Every (workload, implementation)
pair runs in its own process (``run`` from bench/run.py) with one thread for BLAS, OpenMP, XLA,
torch and ONNX Runtime; cells are median ms per call after warm-up (the dim second line is the
process's peak RSS). The last column is the fastest opgraph column over the fastest peer: below 1x
opgraph is faster. A cell's result is checked against opgraph's numpy backend; "!" marks a mismatch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

# (workload, label, timed calls, warm-up calls)
WORKLOADS = (
    ("mlp", "MLP train step", 30, 3),
    ("cnn", "ResNet-style CNN", 10, 2),
    ("chain", "20-op chain", 10, 2),
)
# (implementation, column header, short name for the ratio and auto's choice)
OPGRAPH = (("opgraph-numpy", "numpy", "numpy"), ("opgraph-jax", "jax", "jax"), ("opgraph-torch", "torch", "torch"),
           ("opgraph-torch-compile", "torch\ncompile", "torch.c"),
           ("opgraph-onnxruntime", "ORT", "ORT"), ("opgraph-auto", "auto\n(picked)", "auto"))
PEERS = (("numpy", "NumPy\neager", "NumPy"), ("jax", "JAX\njit", "JAX"), ("torch", "torch\neager", "torch"),
         ("torch-compile", "torch.\ncompile", "torch.c"), ("onnxruntime", "ORT", "ORT"))
SHORT = {"onnxruntime": "ORT"}
# Pairs with no peer implementation: ONNX Runtime cannot carry update edges (opgraph's onnxruntime backend
# keeps the state itself, so that column runs), and the CNN's NumPy column is opgraph's numpy backend.
NOT_APPLICABLE = {("mlp", "onnxruntime"), ("cnn", "numpy")}
REFERENCE = "opgraph-numpy"


def agrees(r: dict[str, Any], ref: dict[str, Any] | None) -> bool:
    """Same result as the reference (float32 sums: relative tolerance on the sum of magnitudes)."""
    if ref is None:
        return True
    return all(abs(r[k] - ref[k]) <= 1e-3 * max(1.0, r["scale"], ref["scale"]) for k in ("check", "last"))


def table(console: Console, run: Callable[..., Any]) -> None:
    """Run bench/backends_workloads.py for every workload and implementation and print the comparison."""
    t = Table(title="opgraph backends vs the engines run directly: ms per call, median after warm-up "
                    "(dim: peak RSS MiB); 1 thread, float32, one process per cell; ORT = onnxruntime, "
                    "opgraph torch compile = backend=\"torch\", compile=True",
              box=box.SIMPLE_HEAD, collapse_padding=True)
    t.add_column("workload", justify="left", no_wrap=True)
    for _, header, _ in OPGRAPH:
        t.add_column(f"[bold]opgraph[/bold]\n{header}", justify="right")
    for _, header, _ in PEERS:
        t.add_column(f"peer\n{header}", justify="right")
    t.add_column("best og /\nbest peer", justify="right")
    notes: list[str] = []
    for workload, label, repeat, warmup in WORKLOADS:
        results: dict[str, dict[str, Any] | None] = {}
        for impl, _, _ in (*OPGRAPH, *PEERS):
            if (workload, impl) in NOT_APPLICABLE:
                continue
            results[impl] = run("backends_workloads.py", "--workload", workload, "--impl", impl,
                                "--repeat", str(repeat), "--warmup", str(warmup))
        ref = results.get(REFERENCE)

        def cell(impl: str, results: dict[str, dict[str, Any] | None] = results,
                 ref: dict[str, Any] | None = ref) -> str:
            if impl not in results:
                return "N/A"
            r = results[impl]
            if r is None:
                return "failed"
            text = f"{r['median'] * 1e3:.2f}" + ("" if agrees(r, ref) else " !")
            if "choice" in r:
                text += f"\n{SHORT.get(r['choice'], r['choice'])}"
            return text + f"\n[dim]{r['rss_mb']:.0f}[/dim]"

        def fastest(impls: tuple[tuple[str, str, str], ...],
                    results: dict[str, dict[str, Any] | None] = results) -> tuple[str, float] | None:
            done = [(short, r["median"]) for impl, _, short in impls if (r := results.get(impl)) is not None]
            return min(done, key=lambda x: x[1]) if done else None

        best, peer = fastest(OPGRAPH), fastest(PEERS)
        ratio = f"{best[1] / peer[1]:.2f}x\n{best[0]} /\n{peer[0]}" if best and peer else "-"
        t.add_row(label, *[cell(impl) for impl, _, _ in (*OPGRAPH, *PEERS)], ratio, end_section=True)
        auto = results.get("opgraph-auto")
        if auto is not None:
            parts = [f"{k} {v * 1e3:.2f}" if v is not None else f"{k} failed ({auto['failures'].get(k, '')[:60]})"
                     for k, v in auto["timings"].items()]
            notes.append(f"{workload}: auto chose {auto['choice']} from " + ", ".join(parts) + " ms")
        wrong = [impl for impl, r in results.items() if r is not None and not agrees(r, ref)]
        if wrong:
            notes.append(f"{workload}: result differs from opgraph numpy's: {', '.join(wrong)}")
    console.print(t)
    console.print("Workloads: MLP 784-512-512-10 training step, batch 128, SGD; ResNet-style CNN inference "
                  "(conv 3->32, a residual block of two 3x3 convs 32->32, max pool 2, global mean, linear 10) "
                  "on 64x3x32x32; "
                  "20 elementwise ops (sin, tanh, exp, log, cos, abs, scalar add/multiply) on 4M float32.")
    console.print("MLP: opgraph runs the training_step graph (update edges carry the parameters); the peers run "
                  "a hand-written step (NumPy backward, jax.jit of value_and_grad + SGD, torch autograd + SGD; "
                  "torch.compile compiles the loss and the update). Times include the conversions from and to "
                  "NumPy.")
    for note in notes:
        console.print(note)
