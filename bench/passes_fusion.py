"""Elementwise-fusion measurement: how should the NumPy backend run a fused chain of elementwise ops?

The chain (7 ops, float64): ``y = (1 - tanh(x * w + b) ** 2) * g + 0.5 * x``.

* ``unfused``: one NumPy call per op, each allocating its result (what the executor does today);
* ``scratch``: the same NumPy calls writing into one scratch buffer with ``out=`` (pure NumPy fused kernel);
* ``numexpr``: one ``numexpr.evaluate`` of the whole expression (blocked, no full-size temporaries), 1 thread;
* ``numba``: a ``@vectorize`` kernel, where Numba is installed;
* ``graph_unfused`` / ``graph_fused``: the chain as an opgraph graph run by the executor, before and after
  ``optimize(level=3)`` (which makes it one ``fused_elementwise`` op).

``python bench/passes_fusion.py`` prints one JSON object: microseconds per evaluation for each size.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SIZES = (1_000, 100_000, 1_000_000)


def unfused(x: np.ndarray, w: np.ndarray, b: np.ndarray, g: np.ndarray) -> np.ndarray:
    t = np.multiply(x, w)
    t = np.add(t, b)
    t = np.tanh(t)
    t = np.square(t)
    t = np.subtract(1.0, t)
    t = np.multiply(t, g)
    return np.add(t, np.multiply(0.5, x))


def scratch(x: np.ndarray, w: np.ndarray, b: np.ndarray, g: np.ndarray) -> np.ndarray:
    out = np.multiply(x, w)
    np.add(out, b, out=out)
    np.tanh(out, out=out)
    np.square(out, out=out)
    np.subtract(1.0, out, out=out)
    np.multiply(out, g, out=out)
    tmp = np.multiply(0.5, x)
    return np.add(out, tmp, out=out)


def _graphs(n: int) -> tuple[Any, Any]:
    """The chain as an opgraph graph, and the same graph after ``optimize(level=3)`` (one fused_elementwise op)."""
    import opgraph
    from opgraph.passes import optimize

    bld = opgraph.GraphBuilder()
    x, w, b, g = (bld.input(("float64", (n,))) for _ in range(4))
    t = bld.tanh(bld.add(bld.multiply(x, w), b))
    bld.output(bld.add(bld.multiply(bld.subtract(1.0, bld.square(t)), g), bld.multiply(0.5, x)))
    plain = bld.freeze()
    return plain, optimize(plain, level=3)


def best(fn: Callable[[], Any], budget: float = 0.3) -> float:
    fn()
    times = []
    t_end = time.perf_counter() + budget
    while time.perf_counter() < t_end or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e6


def main() -> None:
    os.environ.setdefault("NUMEXPR_NUM_THREADS", "1")
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"sizes": list(SIZES)}
    try:
        import numexpr

        numexpr.set_num_threads(1)
    except ImportError:
        numexpr = None
    try:
        import numba

        @numba.vectorize(["float64(float64, float64, float64, float64)"])
        def nb(x: float, w: float, b: float, g: float) -> float:  # pragma: no cover - needs numba
            t = np.tanh(x * w + b)
            return (1.0 - t * t) * g + 0.5 * x
    except ImportError:
        nb = None
    for n in SIZES:
        x, w, b, g = (rng.standard_normal(n) for _ in range(4))
        ref = unfused(x, w, b, g)
        assert np.array_equal(scratch(x, w, b, g), ref)
        row = {"unfused": best(lambda: unfused(x, w, b, g)), "scratch": best(lambda: scratch(x, w, b, g))}
        if numexpr is not None:
            expr = "(1 - tanh(x * w + b) ** 2) * g + 0.5 * x"
            assert np.allclose(numexpr.evaluate(expr, local_dict=dict(x=x, w=w, b=b, g=g)), ref, rtol=1e-12)
            row["numexpr"] = best(lambda: numexpr.evaluate(expr, local_dict=dict(x=x, w=w, b=b, g=g)))
        if nb is not None:
            row["numba"] = best(lambda: nb(x, w, b, g))
        plain, fused = _graphs(n)
        feeds = {int(v): a for v, a in zip(plain.inputs, (x, w, b, g), strict=True)}
        ffeeds = {int(v): a for v, a in zip(fused.inputs, (x, w, b, g), strict=True)}
        assert np.array_equal(plain.run(feeds)[0], fused.run(ffeeds)[0])
        row["graph_unfused"] = best(lambda: plain.run(feeds))
        row["graph_fused"] = best(lambda: fused.run(ffeeds))
        out[str(n)] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
