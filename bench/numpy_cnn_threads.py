"""CNN inference at a given thread count, one implementation in this process; prints one JSON line.

    python bench/numpy_cnn_threads.py --impl opgraph-numpy|numpy|torch --threads N [--repeat 7] [--warmup 2]

The workload is bench/backends_workloads.py's ``cnn`` (64x3x32x32 float32, weights of ``cnn_data()``):
``opgraph-numpy`` is its ``opgraph_call("cnn", "opgraph-numpy")``, ``torch`` its ``torch_cnn`` (torch eager)
with ``torch.set_num_threads(N)`` (backends_workloads.py itself pins torch to 1 thread), ``numpy`` the NumPy
eager CNN of bench/numpy_cnn_eager.py. The caller sets the BLAS/OpenMP variables to N before starting this
process (BLAS reads them when it loads); this script checks they agree with ``--threads``. JSON: median and
min seconds of ``--repeat`` timed calls after ``--warmup``, and the output summed in float64 (``check``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
               "NUMBA_NUM_THREADS")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", required=True, choices=("opgraph-numpy", "numpy", "torch"))
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    if args.repeat < 5:
        ap.error("--repeat must be at least 5")
    wrong = {k: os.environ.get(k) for k in THREAD_VARS[:2] if os.environ.get(k) != str(args.threads)}
    if wrong:
        ap.error(f"set the thread variables to {args.threads} before starting this process (got {wrong})")
    from backends_workloads import cnn_data, opgraph_call, torch_cnn

    if args.impl == "torch":
        import torch

        torch.set_num_threads(args.threads)
        torch.set_num_interop_threads(1)
        call = torch_cnn(False)
    elif args.impl == "numpy":
        from numpy_cnn_eager import numpy_eager_cnn

        params, x = cnn_data()
        call = lambda: numpy_eager_cnn(params, x)  # noqa: E731
    else:
        call, _ = opgraph_call("cnn", "opgraph-numpy")
    out = call()
    for _ in range(args.warmup):
        call()
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t)
    print(json.dumps({"impl": args.impl, "threads": args.threads, "median": statistics.median(times),
                      "min": min(times), "check": float(np.sum(np.asarray(out, np.float64))),
                      "scale": float(np.sum(np.abs(np.asarray(out, np.float64))))}))


if __name__ == "__main__":
    main()
