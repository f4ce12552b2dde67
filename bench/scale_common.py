"""Shared by the scale benchmarks (graph_scale.py, passes_scale.py): timing and the command line."""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``fn()`` takes (after a garbage collection) and its result."""
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(benches: dict[str, Callable[[int], dict[str, Any]]]) -> None:
    """``--lib NAME --n N --repeat R``: run ``benches[NAME](N)`` R times, print the medians as one JSON line."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", choices=sorted(benches), default="opgraph")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    runs = []
    for _ in range(args.repeat):
        gc.collect()
        runs.append(benches[args.lib](args.n))
    keys = runs[0].keys()
    print(json.dumps({"lib": args.lib, "n": args.n, **{k: statistics.median(r[k] for r in runs) for k in keys}}))
