"""Dispatch overhead of opgraph's numpy engine on small training steps; prints one JSON line.

    python bench/numpy_dispatch.py --case demo|tiny [--rounds 7] [--target-ms 30]

* ``demo``: examples/demo.py's training step (MLP 64-128-10 on scikit-learn's digits, batch 32, float64,
  momentum SGD), built by its ``build_step`` and run through ``opgraph.compile(step.graph)``, against the
  hand-written NumPy step of its ``train_numpy`` (its ``numpy_step``).
* ``tiny``: a 16-16-16-4 MLP training step, batch 4, float32, ``opgraph.optim.training_step`` with SGD,
  against bench/training_common.py's hand-written NumPy step.

Besides the two steps, every kernel of the step graph is timed bare: the op's registered numpy kernel
(``opgraph.backends.numpy.BACKEND.kernel_for(kind, version)``) on the same input arrays, writing into a preallocated
``out=`` buffer where the kernel takes one, each timed alone with :mod:`timeit`. The per-kernel overhead is
(compiled step - sum of the bare kernels) / number of kernels (the graph's non-constant ops).

opgraph, NumPy and the bare kernels are timed in the same process, interleaved: each of ``--rounds`` rounds
times each of them over enough calls to take about ``--target-ms``; the JSON has the median of the rounds
(milliseconds per step) and their spread.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
TINY_SIZES, TINY_BATCH = (16, 16, 16, 4), 4


def load_demo() -> Any:
    """examples/demo.py as a module (it is not a package)."""
    spec = importlib.util.spec_from_file_location("opgraph_demo", HERE.parent / "examples" / "demo.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def demo_case() -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray], Callable[[], Any]]:
    """(step graph, first feeds, later feeds, hand-written NumPy step) for the demo's training step."""
    from sklearn.datasets import load_digits

    demo = load_demo()
    digits = load_digits()
    xs, ys = digits.data / 16.0, digits.target
    idx = np.random.default_rng(1000).permutation(len(xs))[:demo.BATCH]
    x, y = xs[idx], np.eye(demo.CLASSES)[ys[idx]]
    params = demo.init_params(xs.shape[1])
    step = demo.build_step(xs.shape[1])
    first = {**step.state, **params, "x": x, "y": y}
    p = {k: v.copy() for k, v in params.items()}
    vel = {k: np.zeros_like(v) for k, v in p.items()}

    numpy_step = functools.partial(demo.numpy_step, p, vel, x, y)  # the demo's hand-written step, one call
    return step.graph, first, {"x": x, "y": y}, numpy_step


def tiny_case() -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray], Callable[[], Any]]:
    """(step graph, first feeds, later feeds, hand-written NumPy step) for the 16-16-16-4 MLP, batch 4, SGD."""
    from training_common import data, numpy_step, opgraph_step

    params, x, y = data(0, TINY_SIZES, TINY_BATCH)
    step, named = opgraph_step(params, x, y)
    first = {**step.state, **named, "x": x, "y": y}
    return step.graph, first, {"x": x, "y": y}, numpy_step([a.copy() for a in params], x, y)


def bare_kernels(graph: Any, feeds: dict[str, np.ndarray]) -> list[timeit.Timer]:
    """One timer per non-constant op of ``graph``: its numpy kernel on that op's input arrays (computed once,
    in topological order, from ``feeds``), into an ``out=`` buffer when the kernel takes one."""
    from opgraph.backends.numpy import BACKEND
    from opgraph.core.registry import CONST

    vals: dict[int, Any] = {graph.find_value(k): np.asarray(v) for k, v in feeds.items()}
    timers = []
    for op in graph.topological_order().tolist():
        outs = graph.op_outputs(op).tolist()
        if graph.op_kind[op] == CONST.id:
            vals[outs[0]] = graph.constant_of(op)
            continue
        kernel = BACKEND.kernel_for(graph.kind_of(op), int(graph.op_version[op]))
        args = tuple(vals[i] for i in graph.op_inputs(op).tolist())
        attrs = graph.attrs_of(op)
        r = kernel(*args, **attrs)
        rs = (r,) if len(outs) == 1 else tuple(r)
        for v, a in zip(outs, rs, strict=True):
            vals[v] = a
        env: dict[str, Any] = {"k": kernel, "a": args, "kw": attrs}
        stmt = "k(*a, **kw)"
        fresh = len(outs) == 1 and isinstance(r, np.ndarray) and r.ndim > 0 and r.base is None and not any(
            isinstance(a, np.ndarray) and np.shares_memory(a, r) for a in args)
        if fresh:
            env["o"] = np.empty_like(r)
            try:
                kernel(*args, out=env["o"], **attrs)
                stmt = "k(*a, out=o, **kw)"
            except TypeError:  # this kernel allocates its result
                pass
        timers.append(timeit.Timer(stmt, globals=env))
    return timers


def per_call(fn: Callable[[], Any], n: int) -> float:
    """Mean seconds of ``n`` back-to-back calls."""
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, choices=("demo", "tiny"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--target-ms", type=float, default=30.0)
    ap.add_argument("--level", type=int, default=2,
                    help="optimize(level=) before compiling, as the demo's runner and opgraph.optim's do (default 2)")
    args = ap.parse_args()
    if args.rounds < 5:
        ap.error("--rounds must be at least 5")
    import opgraph

    graph, first, later, numpy_step = demo_case() if args.case == "demo" else tiny_case()
    if args.level:
        graph = opgraph.optimize(graph, level=args.level)
    fn = opgraph.compile(graph, backend="numpy")
    fn(dict(first))
    calls_before = getattr(fn, "kernel_calls", None)
    step = lambda: fn(later)  # noqa: E731
    step()
    executed = fn.kernel_calls - calls_before if calls_before is not None else None
    timers = bare_kernels(graph, first)
    for f in (step, numpy_step, step, numpy_step):  # warm-up
        per_call(f, 20)
    n = max(20, int(args.target_ms / 1e3 / max(per_call(step, 20), 1e-7)))
    og, ref, bare = [], [], []
    for _ in range(args.rounds):
        og.append(per_call(step, n))
        ref.append(per_call(numpy_step, n))
        bare.append(sum(t.timeit(n) / n for t in timers))
    med = {k: statistics.median(v) for k, v in (("opgraph", og), ("numpy", ref), ("bare", bare))}
    print(json.dumps({
        "case": args.case, "level": args.level, "opgraph_ms": med["opgraph"] * 1e3, "numpy_ms": med["numpy"] * 1e3,
        "bare_ms": med["bare"] * 1e3, "kernels": len(timers), "kernels_executed": executed,
        "overhead_us": (med["opgraph"] - med["bare"]) / len(timers) * 1e6,
        "ratio": med["opgraph"] / med["numpy"], "calls_per_round": n, "rounds": args.rounds,
        "spread": {k: [min(v) * 1e3, max(v) * 1e3] for k, v in (("opgraph", og), ("numpy", ref), ("bare", bare))},
        "numpy_version": np.__version__, "opgraph_version": opgraph.__version__}))


if __name__ == "__main__":
    main()
