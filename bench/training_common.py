"""Shared by the training_* benchmark scripts: the model sizes, data, arguments and the timing loop."""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SIZES, BATCH, LR = (784, 512, 512, 10), 128, 0.01


def data(seed: int = 0) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """float32 He-initialised weights, random inputs and one-hot labels."""
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in itertools.pairwise(SIZES):
        params.append((rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32))
        params.append(np.zeros(n_out, np.float32))
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = np.eye(SIZES[-1], dtype=np.float32)[rng.integers(0, SIZES[-1], BATCH)]
    return params, x, y


def arguments(parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """Parse ``--steps`` and ``--warmup`` (plus whatever ``parser`` already has)."""
    ap = parser or argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    return ap.parse_args()


def report(call: Callable[[], float], warmup: int, steps: int, **extra: Any) -> None:
    """Time ``call`` (one training step returning the loss) and print the JSON line bench/run.py reads."""
    for _ in range(warmup):
        call()
    times = []
    last = float("nan")
    for _ in range(steps):
        t0 = time.perf_counter()
        last = call()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step": statistics.median(times),
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "loss": last, **extra}))
