"""Training-step benchmark, opgraph: the MLP 784-512-512-10 step graph (autodiff + SGD + update edges).

``python bench/training_opgraph.py [--runtime executor|compiled] [--steps 30]`` prints one JSON
object: median seconds per step after warm-up, peak RSS (MiB), the final loss and the graph size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_common import LR, SIZES, arguments, data, report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", default="executor", choices=("executor", "compiled"))
    args = arguments(ap)
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

    report(call, args.warmup, args.steps, ops=step.graph.num_ops)


if __name__ == "__main__":
    main()
