"""Training-step benchmark, opgraph: the MLP 784-512-512-10 step graph (autodiff + SGD + update edges).

``python bench/training_opgraph.py [--runtime executor|compiled] [--steps 30]`` prints one JSON
object: median seconds per step after warm-up, peak RSS (MiB), the final loss and the graph size.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import time

import numpy as np

SIZES, BATCH, LR = (784, 512, 512, 10), 128, 0.01


def data(seed: int = 0) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Shared by the three training_* scripts: float32 He-initialised weights, random inputs and labels."""
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in itertools.pairwise(SIZES):
        params.append((rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32))
        params.append(np.zeros(n_out, np.float32))
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = np.eye(SIZES[-1], dtype=np.float32)[rng.integers(0, SIZES[-1], BATCH)]
    return params, x, y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", default="executor", choices=("executor", "compiled"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    import opgraph
    from opgraph.optim import SGD, StepRunner, training_step

    params, x, y = data()
    b = opgraph.GraphBuilder()
    xv = b.input(("float32", x.shape), name="x")
    yv = b.input(("float32", y.shape), name="y")
    names = [f"{k}{i}" for i in range(len(SIZES) - 1) for k in ("w", "b")]
    ps = [b.input(("float32", p.shape), name=n) for n, p in zip(names, params, strict=True)]
    h = xv
    for i in range(len(SIZES) - 1):
        h = b.add(b.matmul(h, ps[2 * i]), ps[2 * i + 1])
        if i < len(SIZES) - 2:
            h = b.relu(h)
    loss = b.negative(b.mean(b.sum(b.multiply(yv, b.log_softmax(h, axis=-1)), axis=1)))
    step = training_step(b, loss, ps, SGD(lr=LR))
    init = dict(zip(names, params, strict=True))
    if args.runtime == "compiled":
        from opgraph.runtime.compiled import compile

        run = compile(step.graph)
        run({"x": x, "y": y, **init})  # the first call feeds the update destinations (one warm-up step)
        args.warmup -= 1

        def call() -> float:
            return float(run({"x": x, "y": y})[0])
    else:
        runner = StepRunner(step, init)

        def call() -> float:
            return float(runner({"x": x, "y": y})[0])

    for _ in range(args.warmup):
        call()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        last = call()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step": statistics.median(times), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                      / 1024, "loss": last, "ops": step.graph.num_ops}))


if __name__ == "__main__":
    main()
