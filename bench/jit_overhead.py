"""Per-call overhead of ``opgraph.jit`` over calling its compiled program directly; prints one JSON line.

    python bench/jit_overhead.py [--backend numpy] [--rounds 15] [--target-ms 30]

Two tiny graphs, where the engine's own work is a few microseconds and what is left is the dispatch:

* ``array``: ``jit(lambda x: x * 2.0 + 1.0)`` on one float64 array of 4 (the call's key without binding);
* ``pytree``: ``jit(lambda p, x, lr: {"w": p["w"] - lr * x, "b": p["b"]})`` on a dict of two arrays, an array
  and a Python float (flattening, each leaf's dtype and shape, the weak scalar, the result's dict).

Each is timed as ``jit(...)(args)`` and as the program ``jit.lower(args)`` called with the same arrays keyed by
input id (what jit feeds it), interleaved: each of ``--rounds`` rounds times both over enough calls to take
about ``--target-ms``; the JSON gives the medians (microseconds per call) and the overhead (their difference).
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np

import opgraph


def _per_call(fn: Callable[[], Any], target_ms: float) -> float:
    # with the garbage collector on, as in a user's loop (timeit turns it off by default)
    n = max(1, int(target_ms / 1e3 / max(timeit.timeit(fn, "gc.enable()", number=20) / 20, 1e-9)))
    return timeit.timeit(fn, "gc.enable()", number=n) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--target-ms", type=float, default=30.0)
    a = ap.parse_args()
    x = np.ones(4)
    p = {"w": np.ones(4), "b": np.ones(4)}
    cases: dict[str, tuple[Any, tuple[Any, ...]]] = {
        "array": (opgraph.jit(lambda x: x * 2.0 + 1.0, backend=a.backend), (x,)),
        "pytree": (opgraph.jit(lambda p, x, lr: {"w": p["w"] - lr * x, "b": p["b"]}, backend=a.backend),
                   (p, x, 0.1)),
    }
    out: dict[str, Any] = {"backend": a.backend, "rounds": a.rounds}
    for name, (f, args) in cases.items():
        f(*args)
        prog = f.lower(*args)
        leaves = [x] if name == "array" else [p["b"], p["w"], x, 0.1]  # the graph's inputs, in order
        feeds = dict(zip(prog.graph.inputs.tolist(), leaves, strict=True))

        def direct(prog: Any = prog, feeds: dict[int, Any] = feeds) -> Any:
            return prog(dict(feeds))

        def jitted(f: Any = f, args: tuple[Any, ...] = args) -> Any:
            return f(*args)

        t_prog, t_jit = [], []
        for _ in range(a.rounds):
            t_prog.append(_per_call(direct, a.target_ms))
            t_jit.append(_per_call(jitted, a.target_ms))
        mp, mj = statistics.median(t_prog), statistics.median(t_jit)
        out[name] = {"program_us": round(mp, 2), "jit_us": round(mj, 2), "overhead_us": round(mj - mp, 2),
                     "cache_size": f.cache_size}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
