"""``make bench`` table (issue 35): a ResNet-style CNN with batch norm, opgraph's ONNX export (after
``optimize(level=2)``, where ``fold_affine`` folds each batch norm into its conv) against torch's export of the same
network, both run by onnxruntime with 1 thread. bench/cnn_batchnorm.py does the work (each model in its own
process, interleaved blocks of calls); this prints its table.

    python bench/run.py cnn_batchnorm
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

HERE = Path(__file__).resolve().parent


def table(console: Console, run: Callable[..., Any] | None = None) -> None:
    """Run bench/cnn_batchnorm.py at its default size (10 interleaved blocks per library) and print its table."""
    proc = subprocess.run([sys.executable, str(HERE / "cnn_batchnorm.py"), "--blocks", "10"], capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        console.print(f"cnn_batchnorm failed: {proc.stderr.strip().splitlines()[-1:]}")
        return
    console.print(proc.stdout.rstrip())
