"""Single kernels of opgraph's numpy engine next to their peers, in one process, one thread; one JSON line.

    python bench/numpy_kernels.py [--rounds 7]

* ``erf`` and ``sigmoid`` on a (2, 197, 3072) float32 array (a ViT-B MLP activation): a one-op graph
  compiled with ``opgraph.compile(backend="numpy")``, the op's registered numpy kernel called bare, and
  ``torch.erf`` / ``torch.sigmoid`` on the same array (``torch.from_numpy``, result to NumPy);
* ``power(x, 3.0)`` on the same array: the one-op graph compiled as built (level 0) and after
  ``opgraph.optimize(graph, level=2)``, with ``x ** 3.0`` in NumPy for scale;
* ``(197, 2, 768) @ (768, 2304)`` float32 (ViT-B's QKV projection): the one-op matmul graph against NumPy's
  2-D GEMM on the input reshaped to (394, 768).

Each comparison is timed interleaved: ``--rounds`` rounds, each timing every contender over enough calls
to take ~20 ms; the JSON has the median per-call milliseconds of the rounds and the largest difference
between each contender's result and the peer's. One thread: bench/run.py sets the BLAS/OpenMP variables to 1
(set them yourself when running this script alone); torch is pinned with ``torch.set_num_threads(1)``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SHAPE = (2, 197, 3072)
TARGET_S = 0.02


def one_op(kind: str, x: np.ndarray, *operands: Any, level: int = 0, **attrs: Any) -> Callable[[], Any]:
    """``kind(x, *operands)`` as a graph compiled on the numpy backend (after ``optimize`` above level 0)."""
    import opgraph

    b = opgraph.GraphBuilder()
    xv = b.input((x.dtype, x.shape), name="x")
    ins = [b.constant(o) if isinstance(o, np.ndarray) else o for o in operands]
    b.output(b.op(kind, xv, *ins, **attrs))
    g = b.freeze()
    if level:
        g = opgraph.optimize(g, level=level)
    fn = opgraph.compile(g, backend="numpy")
    feeds = {"x": x}
    return lambda: fn(feeds)[0]


def bare(kind: str, x: np.ndarray) -> Callable[[], Any]:
    """The NumPy engine's kernel for the op (latest version) called directly."""
    from opgraph.backends.numpy import BACKEND
    from opgraph.core.registry import get_op

    d = get_op(kind)
    kernel = BACKEND.kernel_for(d, getattr(d, "version", 1))
    return lambda: kernel(x)


def compare(contenders: dict[str, Callable[[], Any]], rounds: int) -> dict[str, Any]:
    """Interleaved median per-call ms of each contender, and each result's max |difference| from the last."""
    outs = {k: np.asarray(f(), np.float64) for k, f in contenders.items()}
    ref = list(outs.values())[-1]
    counts = {}
    for k, f in contenders.items():
        t = time.perf_counter()
        f()
        counts[k] = max(3, int(TARGET_S / max(time.perf_counter() - t, 1e-6)))
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(rounds):
        for k, f in contenders.items():
            t = time.perf_counter()
            for _ in range(counts[k]):
                f()
            times[k].append((time.perf_counter() - t) / counts[k])
    return {k: {"ms": statistics.median(v) * 1e3, "min_ms": min(v) * 1e3, "max_ms": max(v) * 1e3,
                "max_err": float(np.max(np.abs(outs[k] - ref)))} for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    if args.rounds < 5:
        ap.error("--rounds must be at least 5")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    result: dict[str, Any] = {}
    try:
        import torch

        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        xt = torch.from_numpy(x)
        peers: dict[str, Callable[[], Any]] = {"erf": lambda: torch.erf(xt).numpy(),
                                               "sigmoid": lambda: torch.sigmoid(xt).numpy()}
        result["torch"] = torch.__version__
    except ImportError:
        peers = {}
    for kind in ("erf", "sigmoid"):
        contenders = {"opgraph": one_op(kind, x), "kernel": bare(kind, x)}
        if kind in peers:
            contenders["torch"] = peers[kind]
        result[kind] = compare(contenders, args.rounds)
    result["power"] = compare({"level0": one_op("power", x, np.float32(3.0)),
                               "level2": one_op("power", x, np.float32(3.0), level=2),
                               "numpy": lambda: x ** np.float32(3.0)}, args.rounds)
    a = rng.standard_normal((197, 2, 768)).astype(np.float32)
    w = (rng.standard_normal((768, 2304)) / np.sqrt(768)).astype(np.float32)
    result["matmul"] = compare({"opgraph": one_op("matmul", a, w),
                                "numpy": lambda: (a.reshape(-1, 768) @ w).reshape(197, 2, 2304)}, args.rounds)
    result["numpy_version"] = np.__version__
    print(json.dumps(result))


if __name__ == "__main__":
    main()
