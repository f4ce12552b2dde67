"""Training-step benchmark, PyTorch eager (1 thread): the same MLP, data and SGD.

``python bench/training_torch.py [--steps 30]`` prints one JSON object like training_opgraph.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_common import LR, arguments, data, report


def main() -> None:
    args = arguments()
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

    report(call, args.warmup, args.steps)


if __name__ == "__main__":
    main()
