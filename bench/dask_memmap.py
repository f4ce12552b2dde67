"""One variant of the dask benchmark (issue 18) in this process; prints one JSON line.

    python bench/dask_memmap.py --variant VARIANT [--gib 8] [--repeat 5]

    (VARIANT: make, opgraph, opgraph_mapped, opgraph_from_array, dask_blocks, dask_mmap, numpy or overhead)

The workload is ``y = sum(tanh(X * a + b) @ W, axis=0)`` over ``X``, a float32 ``.npy`` memmap of shape
``(N, 256)`` (``N = gib * 2**30 / 1 KiB``; ``a``, ``b`` of shape (256,), ``W`` (256, 32)). The file is made
once by ``--variant make`` in ``OPGRAPH_BENCH_DASK_DIR`` (default ``/tmp/opgraph-bench-dask``) and reused.
Each variant starts its own ``LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
memory_limit=--limit-mib)`` (not timed) and times ``--repeat`` runs after an untimed one, each building its
graph and computing ``y`` on the cluster:

* ``opgraph``: ``opgraph.compile(g, backend="dask", client=client)`` called on the memmap (chunks from the
  workers' memory budget; ``--chunk-rows`` overrides them by passing ``chunks=``).
* ``opgraph_mapped``: the same program fed a dask array whose tasks slice the memmap itself (what
  ``da.from_array(memmap)`` built before dask 2024.12; ``dask.array.core.graph_from_arraylike``), ``--chunk-rows``
  rows a block (0: dask's auto): opgraph rebuilds it to read each block from the file (issue 36).
* ``opgraph_from_array``: the same program fed ``da.from_array(np.load(path, mmap_mode="r"), chunks=...)``, which
  since dask 2024.12 copies all of X into this process's memory: opgraph refuses it on a cluster where one task
  would ship more than a block (its JSON has ``error``, ``feed_s``, the seconds ``from_array`` took, and
  ``refused_s``, the seconds from the call to the refusal); not run
  where X is more than half the memory available.
* ``dask_blocks``: the same expression written in ``dask.array`` over blocks a task reads itself
  (``da.map_blocks`` of a function doing ``np.load(path, mmap_mode="r")[rows].copy()``), ``--chunk-rows`` rows a
  block, or dask's ``"auto"`` chunks with ``--chunk-rows 0``.
* ``dask_mmap``: ``da.from_array(np.load(path, mmap_mode="r"), chunks=...)``, the first thing a user tries. It
  pickles all of X into the graph as one task: not run (its JSON has ``error``) where X is larger than a worker's
  limit or than 1/8 of the available memory; a failed run (KilledWorker) is reported the same way.
* ``numpy``: NumPy streaming blocks of ``--chunk-rows`` rows in this process, one thread (the reference value).
* ``overhead``: seconds per task of a tiny elementwise op + sum over many 8-element chunks, on the
  threaded scheduler and on the 2-worker cluster; and opgraph's cost per op of building the dask graph for a chain
  of K elementwise ops, next to the same chain written in ``dask.array``.

Every worker's peak RSS is read at the end by ``opgraph.backends.dask.chunking.worker_memory`` (its VmHWM),
against its ``memory_limit``.
"""

from __future__ import annotations

import os

# One BLAS/OpenMP thread, set before NumPy loads BLAS; LocalCluster's worker processes inherit the environment.
os.environ.update(dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"),
                                "1"))

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from scale_common import peak_rss_bytes  # bench/: this script's folder is on sys.path

COLS, K_OUT, DTYPE = 256, 32, "float32"
DIR = Path(os.environ.get("OPGRAPH_BENCH_DASK_DIR", "/tmp/opgraph-bench-dask"))
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE")


def rows_for(gib: float) -> int:
    """Rows of X for ``gib`` GiB (1 KiB a row)."""
    return int(gib * 2**30) // (COLS * 4)


def data_path(gib: float) -> Path:
    return DIR / f"X_{gib:g}GiB_{COLS}.npy"


def params() -> dict[str, np.ndarray]:
    """a, b and W: small, fixed; W positive so every entry of y is a large sum (a fair relative tolerance)."""
    rng = np.random.default_rng(1)
    return {"a": rng.uniform(0.2, 0.8, COLS).astype(DTYPE), "b": rng.uniform(0.05, 0.3, COLS).astype(DTYPE),
            "W": (rng.uniform(0.0, 1.0, (COLS, K_OUT)) / COLS).astype(DTYPE)}


def make(gib: float) -> dict[str, Any]:
    """Write X once (blocks of 64 MiB of normal noise); reuse it when it is already complete."""
    path, n = data_path(gib), rows_for(gib)
    if path.exists():
        mm = np.load(path, mmap_mode="r")
        if mm.shape == (n, COLS) and mm.dtype == DTYPE and path.with_suffix(".done").exists():
            return {"variant": "make", "path": str(path), "made": False, "bytes": path.stat().st_size}
    DIR.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    out = np.lib.format.open_memmap(path, mode="w+", dtype=DTYPE, shape=(n, COLS))
    rng = np.random.default_rng(0)
    step = (64 << 20) // (COLS * 4)
    for i in range(0, n, step):
        j = min(i + step, n)
        out[i:j] = rng.standard_normal((j - i, COLS), dtype=np.float32)
    out.flush()
    del out
    path.with_suffix(".done").touch()
    return {"variant": "make", "path": str(path), "made": True, "bytes": path.stat().st_size,
            "s": time.perf_counter() - t0}


# ---------------------------------------------------------------- the computations
def opgraph_graph() -> Any:
    import opgraph

    b = opgraph.GraphBuilder()
    x = b.input((DTYPE, (None, COLS)), name="X")
    a = b.input((DTYPE, (COLS,)), name="a")
    c = b.input((DTYPE, (COLS,)), name="b")
    w = b.input((DTYPE, (COLS, K_OUT)), name="W")
    b.output(b.op("sum", b.op("matmul", b.op("tanh", b.op("add", b.op("multiply", x, a), c)), w), axis=0))
    return b.freeze()


def _read_block(path: str, chunk_rows: int, block_id: tuple[int, ...] = (0, 0)) -> np.ndarray:
    """One block of X: map the file, copy the rows out, unmap (what a user writes for a per-task read)."""
    mm = np.load(path, mmap_mode="r")
    i = block_id[0] * chunk_rows
    return np.array(mm[i:i + chunk_rows])


def dask_expr(x: Any, p: dict[str, np.ndarray]) -> Any:
    import dask.array as da

    return (da.tanh(x * p["a"] + p["b"]) @ p["W"]).sum(axis=0)


def mapped_x(path: str, chunk_rows: int) -> Any:
    """X as a dask array whose tasks slice the memmap itself (dask's from_array graph, without its copy)."""
    import dask.array as da
    from dask.array.core import graph_from_arraylike, normalize_chunks

    mm = np.load(path, mmap_mode="r")
    chunks = normalize_chunks((chunk_rows or "auto", COLS), mm.shape, dtype=mm.dtype)
    name = f"X-mapped-{chunks[0][0]}"
    return da.Array(graph_from_arraylike(mm, chunks, mm.shape, name, dtype=mm.dtype), name, chunks, dtype=mm.dtype)


def dask_x(variant: str, path: str, chunk_rows: int) -> Any:
    """X as a dask array the way a user would write it: blocks read by their task, or from_array on a memmap."""
    import dask.array as da
    from dask.array.core import normalize_chunks

    n = rows_for_path(path)
    chunks = (chunk_rows or "auto", COLS)
    if variant == "dask_mmap":
        return da.from_array(np.load(path, mmap_mode="r"), chunks=chunks)
    chunks = normalize_chunks(chunks, (n, COLS), dtype=DTYPE)
    rows = chunks[0][0]
    if len(chunks[1]) != 1:  # "auto" split the columns too: read those blocks from_array's way instead
        return da.from_array(np.load(path, mmap_mode="r"), chunks=chunks)
    return da.map_blocks(_read_block, path, rows, chunks=chunks, dtype=DTYPE, meta=np.empty((0, 0), DTYPE))


def rows_for_path(path: str) -> int:
    return int(np.load(path, mmap_mode="r").shape[0])


def graph_facts(y: Any, n: int) -> dict[str, Any]:
    """Tasks and layers before and after dask's optimisation (blockwise fusion), and the rows of X's blocks as
    the graph has them (the chunks of its layers of X's shape: X and the elementwise ops on it)."""
    import dask

    hlg = y.__dask_graph__()
    (yo,) = dask.optimize(y)
    chunks = [a["chunks"] for a in (layer.collection_annotations or {} for layer in hlg.layers.values())
              if tuple(a.get("shape", ())) == (n, COLS)]
    return {"tasks": len(hlg), "layers": len(hlg.layers), "tasks_optimized": len(yo.__dask_graph__()),
            "chunk_rows": int(max(chunks[0][0])) if chunks else None,
            "col_chunks": len(chunks[0][1]) if chunks else None}


# ---------------------------------------------------------------- cluster
def start_cluster(limit_mib: int) -> tuple[Any, Any]:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit=f"{limit_mib}MiB",
                           dashboard_address=":0", local_directory=tempfile.mkdtemp(prefix="opgraph-dask-"))
    return cluster, Client(cluster)


def _worker_facts() -> dict[str, Any]:
    from threadpoolctl import threadpool_info

    return {"env": {k: os.environ.get(k) for k in THREAD_VARS},
            "blas_threads": sorted({i.get("num_threads") for i in threadpool_info()})}


def worker_report(client: Any, first_workers: set[str]) -> dict[str, Any]:
    """Each worker's peak RSS and limit, and how many workers the nanny started in place of others (from the
    scheduler's add-worker events: a worker killed for its memory is replaced by a new one)."""
    try:  # after a failure the replacements may still be starting
        client.wait_for_workers(len(first_workers), timeout=60)
    except TimeoutError:
        pass
    info = client.scheduler_info()["workers"]
    from opgraph.backends.dask.chunking import worker_memory

    facts = client.run(_worker_facts, on_error="ignore")
    added = {e.get("worker") for _, e in client.get_events("all") if e.get("action") == "add-worker"}
    return {"workers": [{"peak_mib": peak / 2**20, "limit_mib": limit / 2**20}
                        for peak, limit in worker_memory(client).values()],
            "worker_env": next(iter(facts.values()), {}).get("env"),
            "worker_blas_threads": sorted({t for f in facts.values() for t in f["blas_threads"]}),
            "workers_replaced": len((added | set(info)) - first_workers)}


def timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    """``repeat`` timed calls after an untimed one (a process's first call pays for the workers' imports and
    fills the page cache), and the last value."""
    fn()
    times, value = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return times, value


def run_variant(args: argparse.Namespace) -> dict[str, Any]:
    path = str(data_path(args.gib))
    p = params()
    out: dict[str, Any] = {"variant": args.variant, "gib": args.gib, "path": path, "rows": rows_for_path(path),
                           "limit_mib": args.limit_mib}
    if args.variant == "numpy":
        mm = np.load(path, mmap_mode="r")
        step = args.chunk_rows or 262144

        def numpy_run() -> np.ndarray:
            acc = np.zeros(K_OUT, np.float64)
            for i in range(0, mm.shape[0], step):
                acc += (np.tanh(mm[i:i + step] * p["a"] + p["b"]) @ p["W"]).sum(axis=0)
            return acc.astype(DTYPE)
        times, y = timed(numpy_run, args.repeat)
        out.update(times=times, median_s=statistics.median(times), y=y.tolist(), chunk_rows=step,
                   peak_mib=peak_rss_bytes() / 2**20)
        return out
    size, free = Path(path).stat().st_size, psutil.virtual_memory().available
    if args.variant == "dask_mmap" and (size > args.limit_mib * 2**20 or 8 * size > free):
        # from_array on a memmap pickles all of X into the graph as one task: a worker must hold all of it and
        # the client holds several copies (6.4x X at 0.25 GiB). Where that cannot work, say so instead.
        return {**out, "skipped": True, "error": f"not run: da.from_array of a memmap ships all of X "
                f"({size / 2**30:.3g} GiB) through the graph as one task, more than a worker's limit "
                f"({args.limit_mib} MiB) or 1/8 of the memory available ({free / 2**30:.3g} GiB)"}
    if args.variant == "opgraph_from_array" and 2 * size > free:
        return {**out, "skipped": True, "error": f"not run: da.from_array copies all of X ({size / 2**30:.3g} GiB) "
                f"into this process's memory, more than half of the memory available ({free / 2**30:.3g} GiB)"}
    import dask

    cluster, client = start_cluster(args.limit_mib)
    try:
        first = set(client.scheduler_info()["workers"])
        if args.variant.startswith("opgraph"):
            import opgraph

            g = opgraph_graph()
            opts: dict[str, Any] = {"client": client}
            if args.chunk_rows and args.variant == "opgraph":
                opts["chunks"] = {"X": (args.chunk_rows, COLS)}
            t0 = time.perf_counter()
            f = opgraph.compile(g, backend="dask", **opts)
            out["compile_s"] = time.perf_counter() - t0

            def x_feed() -> Any:
                if args.variant == "opgraph_mapped":
                    return mapped_x(path, args.chunk_rows)
                if args.variant == "opgraph_from_array":
                    return dask_x("dask_mmap", path, args.chunk_rows)
                return np.load(path, mmap_mode="r")

            t0 = time.perf_counter()
            x = x_feed()
            out["feed_s"] = time.perf_counter() - t0  # from_array's copy of X happens here
            t0 = time.perf_counter()
            try:
                lazy = opgraph.compile(g, backend="dask", result="dask", **opts)(X=x, **p)[0]
            except Exception as exc:  # opgraph's refusal: one line, before anything is sent to the cluster
                return {**out, "error": f"{type(exc).__name__}: {exc}", "refused_s": time.perf_counter() - t0,
                        **worker_report(client, first)}
            del x
            out.update(graph_facts(lazy, out["rows"]))

            def once() -> Any:
                return f(X=x_feed(), **p)[0]
        else:
            out.update(graph_facts(dask_expr(dask_x(args.variant, path, args.chunk_rows), p), out["rows"]))

            def once() -> Any:
                return dask.compute(dask_expr(dask_x(args.variant, path, args.chunk_rows), p), scheduler=client)[0]
        try:
            times, y = timed(once, args.repeat)
            out.update(times=times, median_s=statistics.median(times), y=np.asarray(y).tolist())
        except Exception as exc:  # e.g. KilledWorker: reported in the JSON with the workers' state
            out["error"] = f"{type(exc).__name__}: {exc}"[:400]
        out.update(worker_report(client, first),
                   client_peak_mib=peak_rss_bytes() / 2**20)
    finally:
        client.close()
        cluster.close()
    return out


# ---------------------------------------------------------------- per-task overhead
def overhead(args: argparse.Namespace) -> dict[str, Any]:
    """Seconds per task (threaded scheduler, 2-worker cluster) and opgraph's dask-graph construction per op."""
    import dask
    import dask.array as da

    import opgraph

    def tiny(t: int) -> Any:
        return (da.ones(t * 8, chunks=8, dtype="float64") + 1).sum()

    out: dict[str, Any] = {"variant": "overhead", "per_task": []}
    cluster, client = start_cluster(args.limit_mib)
    try:
        for t in (1000, 10000):
            y = tiny(t)
            (yo,) = dask.optimize(y)
            ntasks = len(yo.__dask_graph__())
            for name, sched in (("threads", "threads"), ("LocalCluster 2x1", client)):
                times, v = timed(lambda s=sched, n=t: tiny(n).compute(scheduler=s), args.repeat)
                assert v == 2 * 8 * t
                out["per_task"].append({"scheduler": name, "chunks": t, "tasks": ntasks,
                                        "median_s": statistics.median(times),
                                        "us_per_task": statistics.median(times) / ntasks * 1e6})
    finally:
        client.close()
        cluster.close()
    # the dask graph opgraph builds per call for a chain of K elementwise ops, and the same chain by hand
    out["construct"] = []
    xs = np.linspace(-1, 1, 4000 * COLS, dtype=DTYPE).reshape(4000, COLS)
    for k in (100, 1000):
        b = opgraph.GraphBuilder()
        v = x = b.input((DTYPE, (4000, COLS)), name="x")
        for i in range(k):
            v = b.op(("multiply", "add", "tanh")[i % 3], *((v, 0.5) if i % 3 < 2 else (v,)))
        b.output(v)
        g = b.freeze()
        t0 = time.perf_counter()
        f = opgraph.compile(g, backend="dask", chunks=(400, COLS), result="dask")
        compile_s = time.perf_counter() - t0
        times, lazy = timed(lambda f=f: f(x=xs)[0], args.repeat)

        def by_hand(k: int = k) -> Any:
            h = da.from_array(xs, chunks=(400, COLS))
            for i in range(k):
                h = h * np.float32(0.5) if i % 3 == 0 else h + np.float32(0.5) if i % 3 == 1 else da.tanh(h)
            return h
        hand_times, hand = timed(by_hand, args.repeat)
        assert np.allclose(lazy.compute(scheduler="threads"), hand.compute(scheduler="threads"), rtol=1e-5)
        out["construct"].append({"ops": k, "compile_s": compile_s, "call_s": statistics.median(times),
                                 "hand_s": statistics.median(hand_times), "chunks": 10,
                                 "tasks": len(lazy.__dask_graph__()), "hand_tasks": len(hand.__dask_graph__())})
    del x
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=("make", "opgraph", "opgraph_mapped", "opgraph_from_array", "dask_blocks",
                                          "dask_mmap", "numpy", "overhead"), required=True)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chunk-rows", type=int, default=0, help="0: opgraph's budget / dask's 'auto'")
    ap.add_argument("--limit-mib", type=int, default=2048, help="memory_limit of each worker")
    args = ap.parse_args()
    if args.variant == "make":
        out = make(args.gib)
    elif args.variant == "overhead":
        out = overhead(args)
    else:
        out = run_variant(args)
    out.update(python=sys.version.split()[0], numpy=np.__version__,
               threads={k: os.environ.get(k) for k in THREAD_VARS})
    if args.variant not in ("make", "numpy"):
        import dask
        import distributed

        out.update(dask=dask.__version__, distributed=distributed.__version__)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
