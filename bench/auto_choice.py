"""``backend="auto"``'s first call and choice against the steady-state fastest engine, on one ONNX model.

    python bench/auto_choice.py MODEL.onnx [ENGINES] [--first-only]

Imports the model (``opgraph.optimize(level=2)``), feeds it ``MODEL.npz``'s arrays where that file exists
(bench/backends_models.py's exports) or seeded random ones, times ``opgraph.compile(g, backend="auto")``'s first
call (imports of the engines included: a fresh process), then each engine of ``ENGINES`` (comma-separated;
default numpy, torch, onnxruntime, jax, numba) and the auto program in 5 interleaved rounds of 5 calls (the median
of the rounds' medians). One JSON line. With ``--first-only`` it stops after the first call (run it twice with
the cache on to time a second process: the choice is then read from ``$OPGRAPH_CACHE_DIR/auto``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

import opgraph
from opgraph.io.onnx import from_onnx


def main() -> None:
    path = sys.argv[1]
    rest = [a for a in sys.argv[2:] if a != "--first-only"]
    engines = rest[0].split(",") if rest else ["numpy", "torch", "onnxruntime", "jax", "numba"]
    g = opgraph.optimize(from_onnx(path), level=2)
    if os.path.exists(path[:-5] + ".npz"):
        saved = np.load(path[:-5] + ".npz")
        feeds = {k: saved[k] for k in saved.files if k != "__ref__"}
    else:
        rng = np.random.default_rng(0)
        feeds = {g.value_label(v).lstrip("%"): rng.standard_normal(g.type_of(v).shape).astype(g.type_of(v).dtype)
                 for v in g.inputs.tolist()}
    t0 = time.perf_counter()
    f = opgraph.compile(g, backend="auto")
    f(feeds)
    res: dict = {"model": os.path.basename(path), "ops": int(g.num_ops),
                 "first_call_s": round(time.perf_counter() - t0, 2), "chose": f.choice.backend,
                 "auto_timings_ms": {k: None if v is None else round(v * 1e3, 2) for k, v in f.choice.timings.items()},
                 "status": f.choice.status(), "cached": f.choice.cached}
    if "--first-only" not in sys.argv:
        progs = {"auto": f}
        for e in engines:
            try:
                p = opgraph.compile(g, backend=e)
                p(feeds)
                p(feeds)
                progs[e] = p
            except Exception as exc:
                res.setdefault("failed", {})[e] = str(exc).splitlines()[0][:120]
        meds: dict[str, list[float]] = {k: [] for k in progs}
        for _round in range(5):
            for k, p in progs.items():
                ts = []
                for _ in range(5):
                    t = time.perf_counter()
                    p(feeds)
                    ts.append(time.perf_counter() - t)
                meds[k].append(statistics.median(ts))
        steady = {k: round(statistics.median(v) * 1e3, 2) for k, v in meds.items()}
        best = min((k for k in steady if k != "auto"), key=steady.__getitem__)
        res.update(steady_ms=steady, steady_fastest=best, auto_over_fastest=round(steady["auto"] / steady[best], 2))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
