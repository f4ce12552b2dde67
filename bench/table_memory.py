"""Memory planner and compiled runtime against NumPy eager code (Owl's Figure 7), one process per model and mode.

``python bench/run.py memory`` prints two tables: time and peak resident
memory with and without the graph, and the planner statistics (Owl's
Algorithm 1 against ours against the lower bound).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

MODELS = [("mlp", "MLP fwd b128"), ("mlp_train", "MLP train step b128"), ("resnet", "ResNet b32"),
          ("inception", "Inception b32"), ("chain", "chain 20x4M")]


def _mb(n: float) -> str:
    return f"{n / 2**20:.2f}"


def table(console: Console, run: Callable[..., dict[str, Any] | None]) -> None:
    repeat = os.environ.get("OPGRAPH_BENCH_MEMORY_REPEAT", "20")
    results = {}
    for name, _label in MODELS:
        results[name] = (run("memory_run.py", "--model", name, "--mode", "eager", "--repeat", repeat),
                         run("memory_run.py", "--model", name, "--mode", "graph", "--repeat", repeat))
    t = Table(title=f"memory: NumPy eager vs the compiled graph (Owl's Figure 7; mean of {repeat} evaluations, "
                    "1 thread, each model and mode in its own process)")
    for col in ("model", "time w/o graph s", "build s", "evaluate s", "eval speed-up",
                "peak RSS w/o graph MB", "peak RSS w/ graph MB", "eval extra w/o MB", "eval extra w/ MB"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for name, label in MODELS:
        eager, graph = results[name]
        if eager is None or graph is None:
            t.add_row(label, *["failed"] + ["-"] * 7)
            continue
        t.add_row(label, f"{eager['eval_s']:.4f}", f"{graph['build_s']:.4f}", f"{graph['eval_s']:.4f}",
                  f"{eager['eval_s'] / graph['eval_s']:.2f}x",
                  f"{eager['peak_mb']:.1f}", f"{graph['peak_mb']:.1f}",
                  f"{eager['eval_extra_mb']:.1f}", f"{graph['eval_extra_mb']:.1f}")
    console.print(t)
    console.print("build = building the graph + planning + compiling (allocating the arena). Peak RSS is the OS's "
                  "ru_maxrss with the peak reset (/proc/self/clear_refs) once the model and inputs exist; "
                  "'eval extra' is that peak minus the resident size at the reset. Eager code calls the same "
                  "conv2d/avg_pool2d kernels the graph runs.")
    p = Table(title="memory planner: Owl's Algorithm 1 vs ours vs the lower bound (same graph and schedule), MiB")
    for col in ("model", "ops", "no reuse", "Owl (blocks)", "ours", "lower bound", "ours / bound",
                "Owl / bound", "in place", "schedule / packing"):
        p.add_column(col, justify="left" if col in ("model", "schedule / packing") else "right")
    for name, label in MODELS:
        graph = results[name][1]
        if graph is None:
            continue
        s = graph["stats"]
        bound = max(s["lower_bound_bytes"], 1)
        p.add_row(label, str(s["ops"]), _mb(s["no_reuse_bytes"]), f"{_mb(s['owl_bytes'])} ({s['owl_blocks']})",
                  _mb(s["planned_bytes"]), _mb(s["lower_bound_bytes"]), f"{s['planned_bytes'] / bound:.3f}",
                  f"{s['owl_bytes'] / bound:.3f}", str(s["inplace"]), f"{s['schedule']} / {s['packing']}")
    console.print(p)
    console.print(" ".join([
        "MLP: 784-512-512-10 forward pass, batch 128.",
        "MLP train step: one SGD step (softmax cross-entropy, gradients by opgraph.autodiff, parameters carried",
        "by update edges; eager: hand-written backprop updating the parameters in place).",
        "ResNet: conv3x3 stem + 4 bottleneck residual blocks (1x1-3x3-1x1, 64 channels, batch-norm",
        "x*scale+shift, relu), 32x32x3, batch 32.",
        "Inception: two blocks of four parallel branches (1x1; 1x1-3x3; 1x1-3x3-3x3; avg-pool-1x1) + concat,",
        "32x32x32, batch 32. chain: 20 unary elementwise ops on 4M float32.",
        "Owl's Algorithm 1 and ours run on the same schedule; ours also tries Owl's blocks laid end to end,",
        "so it is never larger.",
    ]))
