"""Training-step benchmark, NumPy eager with a hand-written backward pass (the same MLP, data and SGD).

``python bench/training_numpy.py [--steps 30]`` prints one JSON object like training_opgraph.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_common import arguments, data, numpy_step, report


def main() -> None:
    args = arguments()
    p, x, y = data()

    call = numpy_step(p, x, y)
    report(call, args.warmup, args.steps)


if __name__ == "__main__":
    main()
