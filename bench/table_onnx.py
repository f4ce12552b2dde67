"""``make bench`` table: ONNX models (the backend suite's real architectures) on opgraph vs onnxruntime.

Each (library, model) pair runs in its own process with one thread for BLAS, OpenMP and
onnxruntime's own pools (``run`` from bench/run.py; bench/onnx_models.py sets ORT's intra/inter-op
threads to 1). Times are medians of 7 runs after a warm-up; "prepare" is opgraph's import (with
constant folding) or onnxruntime's session creation. The last column is the largest difference
from the output the suite ships for each model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

MODELS = ("light_squeezenet", "light_resnet50", "light_inception_v1", "light_bvlc_alexnet")
LIBS = (("opgraph executor", "opgraph"), ("opgraph compiled", "opgraph-compiled"), ("onnxruntime", "onnxruntime"))


def table(console: Console, run: Callable[..., Any]) -> None:
    """Run bench/onnx_models.py for every model and library and print the comparison."""
    t = Table(title="ONNX inference: the backend suite's light real models, batch 1, float32 (median of 7, 1 thread)")
    for col in ("model", "library", "prepare s", "run ms", "vs onnxruntime", "peak RSS MiB", "max |error|"):
        t.add_column(col, justify="left" if col in ("model", "library") else "right")
    for model in MODELS:
        results = {label: run("onnx_models.py", "--lib", lib, "--model", model) for label, lib in LIBS}
        base = results["onnxruntime"]
        for label, r in results.items():
            if r is None:
                t.add_row(model, label, "failed", "-", "-", "-", "-")
                continue
            ratio = f"{r['run'] / base['run']:.2f}x" if base else "-"
            t.add_row(model, label, f"{r['prepare']:.2f}", f"{r['run'] * 1e3:.1f}", ratio, f"{r['rss_mb']:.0f}",
                      f"{r['max_error']:.1e}")
    console.print(t)
    console.print("The light SqueezeNet is ill-conditioned: its 1000 float32 logits are ~9.5e9 and equal in exact "
                  "arithmetic, so one-ulp differences in the last GEMM (single-threaded BLAS) change its Softmax.")
