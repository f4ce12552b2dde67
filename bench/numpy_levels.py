"""One (workload, implementation) pair of the NumPy-engine optimiser benchmark in this process; prints one JSON line.

    python bench/numpy_levels.py --workload chain|cnn|mlp --impl IMPL [--repeat N] [--warmup N]

IMPL is ``level0`` .. ``level3`` (``opgraph.compile(optimize(graph, level=L))`` on the numpy backend),
``level3-fast`` (level 3 with ``fast_math=True``: fused float32 chains may run numba's compiled loop, a few ulp
from NumPy's results),
``numpy`` (NumPy eager: one expression per op, each result a fresh array) or ``numpy-inplace``
(hand-written NumPy writing every op into one preallocated buffer with ``out=``; the chain only). The
workloads are those of ``bench/backends_workloads.py``: ``chain`` (20 elementwise ops on 4M float32),
``cnn`` (inference of the small ResNet-style CNN) and ``mlp`` (one SGD training step of the 784-512-512-10
MLP). A pair that has no implementation (the NumPy CNN) prints ``{"skipped": reason}``.

The JSON line has ``median`` (seconds, median of ``--repeat`` >= 5 timed calls after ``--warmup``; one
BLAS/OpenMP thread), ``peak_bytes`` (tracemalloc's peak during one call, counted from before the callable
was built: what the variant holds (arena, constants, state) plus what a call allocates, its result
included; the input data and what a dry run imported or cached for good are not counted), ``result_bytes``
(the result's size), ``first_call`` (seconds of the very first call in the process: graph compilation, and
numba's for ``level3-fast``), ``rss_mb`` (the process's maximum RSS) and ``check`` (the result summed in float64, to
compare implementations). Run each variant in a fresh process: peak memory is per process.

    >>> main(["--workload", "chain", "--impl", "numpy-inplace", "--repeat", "5", "--warmup", "0", "--n", "1000"])
    ... # doctest: +ELLIPSIS
    {"workload": "chain", "impl": "numpy-inplace", "median": ...}
"""

from __future__ import annotations

import os

# One BLAS/OpenMP thread, set before NumPy is imported (the callers set them too).
os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import json
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import backends_workloads
from backends_workloads import CHAIN, CHAIN_UFUNCS, chain_graph, chain_input, cnn_graph, mlp_graph
from training_common import data, numpy_step

WORKLOADS = ("chain", "cnn", "mlp")
IMPLS = ("level0", "level1", "level2", "level3", "level3-fast", "numpy", "numpy-inplace")


def numpy_chain(x: np.ndarray, inplace: bool) -> Callable[[], Any]:
    """NumPy eager (a fresh array per op) or in place (every op into one buffer allocated per call)."""
    if not inplace:
        return backends_workloads.numpy_chain(x)
    steps = [(CHAIN_UFUNCS[kind], None if k is None else np.float32(k)) for kind, k in CHAIN]

    def in_place() -> np.ndarray:
        buf = np.empty_like(x)  # the result: a fresh array per call, like every other variant's
        h = x
        for f, k in steps:
            h = f(h, out=buf) if k is None else f(h, k, out=buf)
        return h

    return in_place


def opgraph_call(workload: str, level: int, x: np.ndarray, fast_math: bool = False) -> Callable[[], Any]:
    """The compiled optimised graph as a no-argument call (the MLP feeds its initial parameters first)."""
    import opgraph
    from opgraph.passes import optimize

    if workload == "mlp":
        graph, init, feeds = mlp_graph()
        first: dict[str, Any] = {**feeds, **init}
    elif workload == "cnn":
        graph, feeds = cnn_graph()
        first = feeds
    else:
        graph, feeds = chain_graph(x)
        first = feeds
    fn = opgraph.compile(optimize(graph, level=level, fast_math=fast_math), backend="numpy")
    state = {"first": True}

    def call() -> Any:
        if state["first"]:
            state["first"] = False
            return fn(dict(first))[0]
        return fn(dict(feeds))[0]

    return call


def build(workload: str, impl: str, x: np.ndarray) -> Callable[[], Any] | str:
    """The call to measure (``x``: the chain's input), or the reason there is none."""
    if impl.startswith("level"):
        return opgraph_call(workload, int(impl[len("level")]), x, fast_math=impl.endswith("-fast"))
    if workload == "chain":
        return numpy_chain(x, impl == "numpy-inplace")
    if workload == "mlp" and impl == "numpy":
        return numpy_step(*data())
    return f"no NumPy {'in-place ' if impl == 'numpy-inplace' else ''}implementation of the {workload} workload"


def main(argv: list[str] | None = None) -> None:
    """Measure one variant and print its JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True, choices=WORKLOADS)
    ap.add_argument("--impl", required=True, choices=IMPLS)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--n", type=int, default=len(chain_input()), help="chain length in elements (tests)")
    args = ap.parse_args(argv)
    if args.repeat < 5:
        ap.error("--repeat must be at least 5")
    head = {"workload": args.workload, "impl": args.impl}
    # the chain's input is made before tracing starts: it is not part of any variant's memory
    x = np.ascontiguousarray(chain_input()[:args.n])
    call = build(args.workload, args.impl, x)
    if isinstance(call, str):
        print(json.dumps({**head, "skipped": call}))
        return
    t0 = time.perf_counter()
    call()  # a dry run first: whatever it imports or caches for good is not the variant's memory
    first_call = time.perf_counter() - t0
    del call
    tracemalloc.start()
    call = build(args.workload, args.impl, x)
    assert not isinstance(call, str)
    first = call()  # compilation and first-call caches
    del first
    tracemalloc.reset_peak()
    out = call()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    result_bytes = int(np.asarray(out).nbytes)
    del out
    for _ in range(args.warmup):
        call()
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t)
        del out
    out = call()
    print(json.dumps({**head, "median": statistics.median(times), "min": min(times), "first_call": first_call,
                      "peak_bytes": peak, "result_bytes": result_bytes,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "check": float(np.sum(np.asarray(out, dtype=np.float64))), "repeat": args.repeat}))


if __name__ == "__main__":
    main()
