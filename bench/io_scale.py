""".cg I/O benchmark: save_cg and load_cg a chain of N binary elementwise ops.

Run one size per process: ``python bench/io_scale.py --n 1000000``. The graph
is built directly as NumPy arrays (the Python builder would dominate at
10^7). The parent process builds and saves; loading runs in a fresh child
process, so each peak RSS belongs to one step. Prints one JSON object:
median seconds over ``--repeat`` runs, MB/s, bytes per function on disk and
peak RSS (``resource.getrusage``) of each step.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

SUFFIXES = (".cg", ".cgc", ".cgio", ".cgs")


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    """Current resident set size in MB (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def chain_graph(n: int):  # -> opgraph.Graph
    """A chain ``v = v (*|+) w`` of ``n`` ops on f32[8], built from NumPy arrays in one go."""
    from opgraph.core.graph import Graph
    from opgraph.core.registry import get_op
    from opgraph.core.types import TensorType

    add, mul = get_op("add").id, get_op("multiply").id
    kind = np.where(np.arange(n) % 2 == 1, add, mul).astype(np.int32)
    in_ids = np.empty(2 * n, dtype=np.int32)
    in_ids[0::2] = np.arange(1, n + 1)  # value 0 is x, 1 is w, op i writes value i + 2
    in_ids[0] = 0
    in_ids[1::2] = 1
    producer = np.empty(n + 2, dtype=np.int32)
    producer[:2] = -1
    producer[2:] = np.arange(n)
    return Graph(op_kind=kind, op_attr=np.zeros(n, np.int32), op_version=np.full(n, 11, np.int32),
                 in_ptr=np.arange(0, 2 * n + 1, 2, dtype=np.int64), in_ids=in_ids,
                 out_ptr=np.arange(n + 1, dtype=np.int64), out_ids=np.arange(2, n + 2, dtype=np.int32),
                 value_type=np.zeros(n + 2, np.int32), value_producer=producer,
                 value_index=np.zeros(n + 2, np.int32), types=[TensorType("float32", (8,))], attrs=[()],
                 constants=[], inputs=[0, 1], outputs=[n + 1])


def file_bytes(base: str) -> int:
    return sum(os.path.getsize(base + s) for s in SUFFIXES)


def load_only(base: str, repeat: int) -> dict[str, float]:
    """Child process: load ``repeat`` times; time the verification share once."""
    from opgraph.io.cg import load_cg

    times = []
    g = None
    for _ in range(repeat):
        g = None
        gc.collect()
        t0 = time.perf_counter()
        g = load_cg(base)
        times.append(time.perf_counter() - t0)
    assert g is not None
    g._cache.clear()
    t0 = time.perf_counter()
    g.verify()
    verify = time.perf_counter() - t0
    return {"load": statistics.median(times), "verify": verify, "load_peak_rss_mb": peak_rss_mb(),
            "ops": g.num_ops}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bits", type=int, default=None, choices=[16, 32, 64])
    ap.add_argument("--load-only", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load_only:
        print(json.dumps(load_only(args.load_only, args.repeat)))
        return

    from opgraph.io.cg import save_cg

    t0 = time.perf_counter()
    g = chain_graph(args.n)
    build = time.perf_counter() - t0
    rss_graph = current_rss_mb()
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "chain")
        times = []
        for _ in range(args.repeat):
            gc.collect()
            t0 = time.perf_counter()
            save_cg(g, base, index_bits=args.bits)
            times.append(time.perf_counter() - t0)
        save_peak = peak_rss_mb()
        size = file_bytes(base)
        del g
        gc.collect()
        proc = subprocess.run([sys.executable, __file__, "--load-only", base, "--repeat", str(args.repeat)],
                              capture_output=True, text=True, check=True)
        loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    if loaded["ops"] != args.n:
        raise SystemExit(f"loaded {loaded['ops']} ops, saved {args.n}")
    save = statistics.median(times)
    mb = size / 2**20
    print(json.dumps({
        "n": args.n, "build": build, "save": save, "load": loaded["load"], "verify": loaded["verify"],
        "file_mb": mb, "save_mb_s": mb / save, "load_mb_s": mb / loaded["load"],
        "bytes_per_function": size / args.n, "graph_rss_mb": rss_graph, "save_peak_rss_mb": save_peak,
        "load_peak_rss_mb": loaded["load_peak_rss_mb"],
    }))


if __name__ == "__main__":
    main()
