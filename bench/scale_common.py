"""Shared by the scale benchmarks (graph_scale.py, passes_scale.py): timing, memory and the command line.

Memory is measured as resident set size (RSS), which sees every allocator
(Python objects, NumPy buffers, Rust and C++ heaps alike): ``rss_bytes()``
is the current RSS (``/proc/self/statm``); ``reset_peak()`` resets the
kernel's high-water mark (writing ``5`` to ``/proc/self/clear_refs``, Linux
4.0+) so that ``peak_rss_bytes()`` afterwards is the peak of one step, not
of the whole process. Where the reset is not possible the peak is the
process's (``exact`` is False in :class:`Measured`). Before each step
:func:`release_memory` returns freed heap memory to the OS. RSS moves in
pages and its counters lag by up to ~256 KB, so below ~10^5 ops the RSS
figures per op are noise; tracemalloc (Python and NumPy allocations only)
is exact there.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_KB = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is in bytes on macOS, KB on Linux


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``fn()`` takes (after a garbage collection) and its result."""
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def per_call(call: Callable[[], Any], repeat: int, sample_s: float = 0.02) -> float:
    """Median seconds per call over ``repeat`` samples, each a loop of calls taking about ``sample_s``."""
    t0 = time.perf_counter()
    call()
    once = time.perf_counter() - t0
    loops = max(1, int(sample_s / max(once, 1e-9)))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(loops):
            call()
        samples.append((time.perf_counter() - t0) / loops)
    return statistics.median(samples)


def rss_bytes() -> int:
    """Current resident set size of this process in bytes (the peak where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """Highest resident set size since the process started or since the last :func:`reset_peak`."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _KB


def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()


def release_memory() -> None:
    """Collect garbage and hand freed heap memory back to the OS (glibc ``malloc_trim``), so that the RSS
    counts live memory and a step cannot hide its peak in memory an earlier step freed."""
    gc.collect()
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


def reset_peak() -> bool:
    """Reset the peak RSS to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


PEAK_METHOD = ("RSS high-water mark per step (ru_maxrss after a reset through /proc/self/clear_refs) "
               "minus the RSS before the step")


@dataclass
class Measured:
    """Medians over the runs of one step; peak and retained bytes are RSS deltas from before each run."""

    seconds: float
    runs: int
    peak: int
    retained: int
    exact: bool
    times: list[float] = field(default_factory=list)
    peaks: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"s": self.seconds, "runs": self.runs, "peak": self.peak, "retained": self.retained,
                "exact_peak": self.exact, "times": self.times, "peaks": self.peaks}


def measure(fn: Callable[[], Any], repeat: int, budget: float = float("inf")) -> tuple[Measured, Any]:
    """Run ``fn()`` up to ``repeat`` times, fewer once the runs so far took ``budget`` seconds (at least one).

    Before each run: the previous result is dropped, freed memory is
    released (:func:`release_memory`), the RSS is read and its peak reset. Returns the medians and the
    last run's result.
    """
    times: list[float] = []
    peaks: list[int] = []
    kept: list[int] = []
    exact = True
    result: Any = None
    for _ in range(max(1, repeat)):
        result = None
        release_memory()
        base = rss_bytes()
        exact = reset_peak() and exact
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        peaks.append(max(0, peak_rss_bytes() - base))
        kept.append(rss_bytes() - base)
        if sum(times) >= budget:
            break
    return Measured(statistics.median(times), len(times), int(statistics.median(peaks)),
                    int(statistics.median(kept)), exact, times, peaks), result


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
