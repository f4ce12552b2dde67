"""Training-step benchmark, PyTorch eager (1 thread): the same MLP, data and SGD.

``python bench/training_torch.py [--steps 30]`` prints one JSON object like training_opgraph.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_opgraph import LR, data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    params, x, y = data()
    p = [torch.tensor(a, requires_grad=True) for a in params]
    tx, ty = torch.tensor(x), torch.tensor(y).argmax(dim=1)
    opt = torch.optim.SGD(p, lr=LR)

    def call() -> float:
        h = tx
        for i in range(len(p) // 2):
            h = h @ p[2 * i] + p[2 * i + 1]
            if i < len(p) // 2 - 1:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, ty)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        call()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        last = call()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step": statistics.median(times),
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "loss": last}))


if __name__ == "__main__":
    main()
