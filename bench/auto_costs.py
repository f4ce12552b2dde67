"""The measurements behind ``backend="auto"``'s cost model (``opgraph.runtime.auto.COSTS``).

    python bench/auto_costs.py                          # every installed engine, each case in its own process
    python bench/auto_costs.py --case scalar --ops 1000 --engine jax   # one case: prints one JSON line

* ``scalar``: a chain of ``--ops`` scalar float64 ops (``sin``, ``multiply``, ``add``, ``tanh`` in turn), the
  fine-grained case: per-op overhead and compile time per op.
* ``matmul``: two ``--size`` x ``--size`` float32 ``matmul`` + ``relu`` layers, the dense case: the work rate.

Each case runs in a fresh process; the engine is imported and a 2-op graph compiled and run first, so its import
is not counted. "compile" is ``opgraph.compile(graph, backend=...)`` plus the first call (where jax compiles),
"call" the median of the following calls (at least 3, up to 20 or 2 s). Threads: 1 (the caller sets the BLAS
variables; ``make bench`` does).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

import opgraph
from opgraph import backends


def scalar_graph(n: int) -> tuple[opgraph.Graph, dict[str, np.ndarray]]:
    """``n`` scalar ops in a chain."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", ()), name="x")
    w = b.input(("float64", ()), name="w")
    y = x
    for i in range(n):
        kind = ("sin", "multiply", "add", "tanh")[i % 4]
        y = b.op(kind, y) if kind in ("sin", "tanh") else b.op(kind, y, w)
    b.output(y)
    return b.freeze(), {"x": np.array(0.3), "w": np.array(0.9)}


def matmul_graph(m: int) -> tuple[opgraph.Graph, dict[str, np.ndarray]]:
    """Two ``m`` x ``m`` float32 matmul + relu layers."""
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (m, m)), name="x")
    w = b.input(("float32", (m, m)), name="w")
    y = x
    for _ in range(2):
        y = b.op("relu", b.op("matmul", y, w))
    b.output(y)
    rng = np.random.default_rng(0)
    return b.freeze(), {"x": rng.standard_normal((m, m)).astype("float32"),
                        "w": (rng.standard_normal((m, m)) / m).astype("float32")}


def measure(case: str, size: int, engine: str) -> dict[str, float | int | str]:
    """One case on one engine: compile seconds (compile + first call) and the median call in seconds."""
    warm, warm_feeds = scalar_graph(2)
    opgraph.compile(warm, backend=engine)(warm_feeds)
    g, feeds = scalar_graph(size) if case == "scalar" else matmul_graph(size)
    t0 = time.perf_counter()
    f = opgraph.compile(g, backend=engine)
    f(dict(feeds))
    compile_s = time.perf_counter() - t0
    times: list[float] = []
    deadline = time.perf_counter() + 2.0
    while len(times) < 20 and (len(times) < 3 or time.perf_counter() < deadline):
        t = time.perf_counter()
        f(dict(feeds))
        times.append(time.perf_counter() - t)
    return {"case": case, "size": size, "ops": g.num_ops, "engine": engine, "compile_s": compile_s,
            "call_s": float(np.median(times))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=("scalar", "matmul"))
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--engine", default="numpy")
    args = p.parse_args()
    if args.case is not None:
        print(json.dumps(measure(args.case, args.ops if args.case == "scalar" else args.size, args.engine)))
        return
    engines = [n for n in ("numpy", "torch", "onnxruntime", "jax") if n in backends.available()]
    runs = [("scalar", n, e) for e in engines for n in ((100, 300, 1000, 3000) if e == "jax"
                                                         else (100, 1000, 4000, 10000))]
    runs += [("matmul", m, e) for e in engines for m in (256, 1024)]
    print(f"{'case':8} {'size':>6} {'engine':12} {'compile s':>10} {'call ms':>10}")
    for case, size, engine in runs:
        flag = "--ops" if case == "scalar" else "--size"
        out = subprocess.run([sys.executable, __file__, "--case", case, flag, str(size), "--engine", engine],
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        print(f"{case:8} {size:>6} {engine:12} {r['compile_s']:>10.3f} {r['call_s'] * 1e3:>10.3f}")


if __name__ == "__main__":
    main()
