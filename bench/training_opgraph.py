"""Training-step benchmark, opgraph: the MLP 784-512-512-10 step graph (autodiff + SGD + update edges).

``python bench/training_opgraph.py [--runtime executor|compiled] [--steps 30]`` prints one JSON
object: median seconds per step after warm-up, peak RSS (MiB), the final loss and the graph size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_common import arguments, data, opgraph_step, report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", default="executor", choices=("executor", "compiled"))
    args = arguments(ap)
    from opgraph.optim import StepRunner

    params, x, y = data()
    step, init = opgraph_step(params, x, y)
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
