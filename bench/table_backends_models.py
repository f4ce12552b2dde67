"""``make bench`` table: real architectures built in PyTorch, exported to ONNX, run by opgraph's ``backend="auto"``
and by ONNX Runtime directly on the same ONNX file.

bench/backends_models.py builds each model with random weights (ResNet-18 written out in plain torch; a small
BERT and GPT-2 from ``transformers`` configs when that package is installed, else a hand-written transformer
encoder), exports it with ``torch.onnx.export`` and times PyTorch eager on the same inputs; then opgraph
(``from_onnx`` + ``compile(backend="auto")``) and an ONNX Runtime session each run the file in their own
process. Batch 1, one thread everywhere, medians of 10 calls after a warm-up.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

REPEAT = 10
SHORT = {"onnxruntime": "ORT"}


def models() -> tuple[str, ...]:
    """ResNet-18, and BERT and GPT-2 with transformers (else the hand-written encoder)."""
    if importlib.util.find_spec("transformers") is not None:
        return ("resnet18", "bert", "gpt2")
    return ("resnet18", "encoder")


def table(console: Console, run: Callable[..., Any]) -> None:
    """Export every model, run it on opgraph (auto) and ONNX Runtime, and print the comparison."""
    t = Table(title="real architectures from PyTorch via ONNX: opgraph backend=\"auto\" vs ONNX Runtime on the same "
                    "file (batch 1, 1 thread, ms: median of 10; ORT = onnxruntime)", box=box.SIMPLE_HEAD)
    for col in ("model", "params\nM", "torch\neager ms", "ORT\nms", "opgraph\nauto ms", "auto\npicked",
                "opgraph\n/ ORT", "auto\nprepare s", "max |err|\nopgraph", "max |err|\nORT", "peak RSS\nMiB opgraph",
                "peak RSS\nMiB ORT"):
        t.add_column(col, justify="left" if col in ("model", "auto\npicked") else "right")
    notes = []
    for model in models():
        exported = run("backends_models.py", "--model", model, "--lib", "export", "--repeat", str(REPEAT))
        if exported is None:
            t.add_row(model, "export failed", *["-"] * 10)
            continue
        ort = run("backends_models.py", "--model", model, "--lib", "onnxruntime", "--repeat", str(REPEAT))
        og = run("backends_models.py", "--model", model, "--lib", "opgraph-auto", "--repeat", str(REPEAT))
        ratio = f"{og['run'] / ort['run']:.2f}x" if og and ort else "-"
        t.add_row(model, f"{exported['params_m']:.1f}", f"{exported['torch'] * 1e3:.1f}",
                  f"{ort['run'] * 1e3:.1f}" if ort else "failed", f"{og['run'] * 1e3:.1f}" if og else "failed",
                  SHORT.get(og["choice"], og["choice"]) if og else "-", ratio,
                  f"{og['prepare']:.1f}" if og else "-", f"{og['max_error']:.1e}" if og else "-",
                  f"{ort['max_error']:.1e}" if ort else "-", f"{og['rss_mb']:.0f}" if og else "-",
                  f"{ort['rss_mb']:.0f}" if ort else "-")
        if og:
            parts = [f"{k} {v * 1e3:.1f}" if v is not None else f"{k} failed ({og['failures'].get(k, '')[:60]})"
                     for k, v in og["timings"].items()]
            notes.append(f"{model}: auto chose {og['choice']} from " + ", ".join(parts) + " ms")
    console.print(t)
    console.print("max |err|: the largest difference from PyTorch's output. \"auto prepare\" is "
                  "from_onnx plus auto's timing of every candidate backend (budget 30 s).")
    if "bert" not in models():
        console.print("transformers is not installed: a hand-written 4-layer transformer encoder (hidden 256, "
                      "4 heads, sequence 128) stands in for BERT and GPT-2.")
    for note in notes:
        console.print(note)
