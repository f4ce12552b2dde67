"""Run one benchmark model one way (NumPy eager or the compiled graph) in this process; print JSON.

    python bench/memory_run.py --model resnet --mode graph --repeat 10

Peak resident memory is measured by the OS: ``ru_maxrss`` after the peak is
reset (``/proc/self/clear_refs``, Linux) once the model and its inputs exist,
so it covers the evaluations only; ``rss_base_mb`` is the resident size at
that point and ``peak_mb`` the absolute peak. Where the reset is not
available, the peak since start is reported and ``peak_reset`` is false.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def maxrss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1e6 if sys.platform == "darwin" else r * 1024 / 1e6


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=("eager", "graph"), required=True)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()
    import numpy as np  # noqa: F401
    from memory_models import build

    from opgraph.runtime.compiled import compile

    gc.collect()
    import_rss = rss_mb()
    out: dict = {"model": args.model, "mode": args.mode, "import_rss_mb": import_rss}
    t0 = time.perf_counter()
    graph, feeds, eager = build(args.model, args.scale)
    t_model = time.perf_counter() - t0
    if args.mode == "eager":
        del graph
        fn = eager
    else:
        del eager
        t0 = time.perf_counter()
        f = compile(graph)
        out["build_s"] = t_model + (time.perf_counter() - t0)
        out["compile_s"] = time.perf_counter() - t0
        out["stats"] = f.plan.stats()

        def fn(feeds: dict) -> list:
            return f(feeds)
    if args.model.endswith("_train"):  # the first step takes the initial parameters, later ones the state
        fn(feeds)
        feeds = {k: feeds[k] for k in ("x", "y")}
    gc.collect()
    base = rss_mb()
    out["peak_reset"] = reset_peak()
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        res = fn(feeds)
        times.append(time.perf_counter() - t0)
        del res
    out["eval_s"] = sum(times) / len(times)
    out["eval_min_s"] = min(times)
    out["rss_base_mb"] = base
    out["peak_mb"] = maxrss_mb()
    out["eval_extra_mb"] = out["peak_mb"] - base
    print(json.dumps(out))


if __name__ == "__main__":
    main()
