"""Training-step benchmark, NumPy eager with a hand-written backward pass (the same MLP, data and SGD).

``python bench/training_numpy.py [--steps 30]`` prints one JSON object like training_opgraph.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_common import LR, arguments, data, report


def main() -> None:
    args = arguments()
    p, x, y = data()

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

    report(call, args.warmup, args.steps)


if __name__ == "__main__":
    main()
