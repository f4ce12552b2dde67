"""Shared by the training_* benchmark scripts: the model sizes, data, arguments and the timing loop."""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SIZES, BATCH, LR = (784, 512, 512, 10), 128, 0.01


def data(seed: int = 0, sizes: tuple[int, ...] = SIZES,
         batch: int = BATCH) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """float32 He-initialised weights, random inputs and one-hot labels (the MLP of ``sizes``)."""
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in itertools.pairwise(sizes):
        params.append((rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32))
        params.append(np.zeros(n_out, np.float32))
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = np.eye(sizes[-1], dtype=np.float32)[rng.integers(0, sizes[-1], batch)]
    return params, x, y


def arguments(parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """Parse ``--steps`` and ``--warmup`` (plus whatever ``parser`` already has)."""
    ap = parser or argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    return ap.parse_args()


def report(call: Callable[[], float], warmup: int, steps: int, **extra: Any) -> None:
    """Time ``call`` (one training step returning the loss) and print the JSON line bench/run.py reads."""
    for _ in range(warmup):
        call()
    times = []
    last = float("nan")
    for _ in range(steps):
        t0 = time.perf_counter()
        last = call()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step": statistics.median(times),
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "loss": last, **extra}))


def numpy_step(p: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> Callable[[], float]:
    """The hand-written NumPy training step (forward, backward, SGD on ``p`` in place); returns the loss."""

    def call() -> float:
        acts, pres = [x], []
        h = x
        n_layers = len(p) // 2
        for i in range(n_layers):
            z = h @ p[2 * i] + p[2 * i + 1]
            pres.append(z)
            h = np.maximum(z, 0) if i < n_layers - 1 else z
            acts.append(h)
        z = h - h.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        loss = -float(np.mean(np.sum(y * logp, axis=1)))
        d = (np.exp(logp) - y) / len(x)
        for i in reversed(range(n_layers)):
            if i < n_layers - 1:
                d = d * (pres[i] > 0)
            gw, gb = acts[i].T @ d, d.sum(axis=0)
            if i:
                d = d @ p[2 * i].T
            p[2 * i] -= LR * gw
            p[2 * i + 1] -= LR * gb
        return loss

    return call


def opgraph_step(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[Any, dict[str, np.ndarray]]:
    """The opgraph training step (``opgraph.optim.training_step`` with SGD); returns it and the named params."""
    import opgraph
    from opgraph.optim import SGD, training_step

    b = opgraph.GraphBuilder()
    xv = b.input(("float32", x.shape), name="x")
    yv = b.input(("float32", y.shape), name="y")
    n_layers = len(params) // 2  # (weight, bias) per layer, as numpy_step takes them
    names = [f"{k}{i}" for i in range(n_layers) for k in ("w", "b")]
    ps = [b.input(("float32", p.shape), name=n) for n, p in zip(names, params, strict=True)]
    h = xv
    for i in range(n_layers):
        h = b.add(b.matmul(h, ps[2 * i]), ps[2 * i + 1])
        if i < n_layers - 1:
            h = b.relu(h)
    loss = b.negative(b.mean(b.sum(b.multiply(yv, b.log_softmax(h, axis=-1)), axis=1)))
    return training_step(b, loss, ps, SGD(lr=LR)), dict(zip(names, params, strict=True))
