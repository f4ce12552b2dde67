"""backend="dask" on a real ``distributed.LocalCluster`` of worker processes: results against NumPy, a worker
killed with SIGKILL mid-run, an input several times larger than each worker's memory limit, feeds (memmap,
zarr, dask arrays), lazy and persisted results, update-edge state kept on the workers, and explain()."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

da = pytest.importorskip("dask.array", reason="the dask engine is an optional extra; make test installs it")
distributed = pytest.importorskip("distributed", reason="the dask engine is an optional extra; make test installs it")

import opgraph  # noqa: E402
from opgraph.backends.base import BackendError  # noqa: E402
from opgraph.backends.dask import chunking as dask_chunking  # noqa: E402

WORKER_LIMIT = 512 << 20


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """Two worker processes of one thread each, each limited to 512 MiB (spilling and pausing as configured
    by distributed; a worker past its limit is restarted by its nanny, which the tests would see)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit=WORKER_LIMIT,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        yield c


def workers(client: Any) -> dict[str, int]:
    """Worker address -> process id."""
    return dict(client.run(os.getpid))


def mlp_graph(rows: int | None, cols: int, hidden: int, dtype: str = "float64") -> opgraph.Graph:
    """sum(tanh(x * a + b) @ w1 ... @ w2, axis=0): elementwise ops, matmuls and a reduction over x's rows."""
    b = opgraph.GraphBuilder()
    x = b.input((dtype, (rows, cols)), name="x")
    a = b.input((dtype, (cols,)), name="a")
    w1 = b.input((dtype, (cols, hidden)), name="w1")
    w2 = b.input((dtype, (hidden, 8)), name="w2")
    h = b.op("tanh", b.op("add", b.op("multiply", x, a), 0.25))
    h = b.op("tanh", b.op("matmul", h, w1))
    b.output(b.op("sum", b.op("matmul", h, w2), axis=0))
    return b.freeze()


def mlp_numpy(x: np.ndarray, a: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    return (np.tanh(np.tanh(x * a + 0.25) @ w1) @ w2).sum(axis=0)


def params(cols: int, hidden: int, dtype: str = "float64") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"a": rng.uniform(0.5, 1.0, cols).astype(dtype), "w1": (rng.standard_normal((cols, hidden)) /
            np.sqrt(cols)).astype(dtype), "w2": rng.uniform(0, 1, (hidden, 8)).astype(dtype)}


def save_npy(path: Path, rows: int, cols: int, dtype: str, block_rows: int = 1 << 16) -> np.ndarray:
    """A .npy file of normal noise written block by block through a file (a writable memmap would leave this
    process's memory high); returned as a read-only memmap."""
    rng = np.random.default_rng(3)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                 "shape": (rows, cols)})
        for i in range(0, rows, block_rows):
            rng.standard_normal((min(block_rows, rows - i), cols), dtype=np.dtype(dtype).type).tofile(f)
    return np.load(path, mmap_mode="r")


# ---------------------------------------------------------------- results on the cluster
def test_cluster_matches_numpy(client: Any) -> None:
    """Every family the backend chunks, on two worker processes, against the NumPy engine."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((600, 12))
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (600, 12)), name="x")
    idx = b.input(("int64", (5,)), name="idx")
    y = b.op("exp", b.op("multiply", x, 0.1))
    t = b.op("permute_dims", b.op("reshape", y, shape=(300, 2, 12)), axes=(1, 0, 2))
    c = b.op("concat", b.op("getitem", t, index=(0, slice(10, 200, 3))), b.op("take", y, idx, axis=0), axis=0)
    s = b.op("softmax", c, axis=-1)
    gram = b.op("matmul", b.op("permute_dims", x), x)
    b.output(b.op("sum", s, axis=0), b.op("cumsum", b.op("mean", y, axis=1), axis=0), gram, b.op("det", gram))
    g = b.freeze()
    feeds = {"x": xs, "idx": np.array([0, 599, -1, 7, 300])}
    f = opgraph.compile(g, backend="dask", client=client, chunks={"x": (100, 6)})
    got = f(**feeds)
    want = g.run(feeds, backend="numpy")
    for a, w in zip(got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-10, atol=1e-10)
    text = f.explain()
    assert "op " in text and "(det) on dask runs as one task on whole inputs" in text
    assert "(softmax) on dask" not in text and "(take) on dask" not in text  # chunked: nothing to say


def test_memmap_zarr_and_dask_feeds_on_cluster(client: Any, tmp_path: Path) -> None:
    zarr = pytest.importorskip("zarr")
    cols, hidden = 16, 8
    mm = save_npy(tmp_path / "x.npy", 4000, cols, "float64")
    p = params(cols, hidden)
    want = mlp_numpy(np.asarray(mm), **p)
    z = zarr.open_array(str(tmp_path / "x.zarr"), mode="w", shape=mm.shape, chunks=(1000, cols), dtype="float64")
    z[:] = mm
    f = opgraph.compile(mlp_graph(None, cols, hidden), backend="dask", client=client, chunk_bytes=64 << 10)
    every_other = mlp_numpy(np.asarray(mm[::2]), **p)  # a strided view of the memmap, read from the file too
    for feed, ref in ((mm, want), (mm[::2], every_other), (z, want),
                      (da.from_array(np.asarray(mm), chunks=(700, cols)), want)):
        np.testing.assert_allclose(f(x=feed, **p)[0], ref, rtol=1e-12)


def test_lazy_and_persisted_results(client: Any) -> None:
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((1000, 4))
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (1000, 4)), name="x")
    b.output(b.op("tanh", x), b.op("sum", b.op("square", x)))
    g = b.freeze()
    lazy = opgraph.compile(g, backend="dask", client=client, chunks=(250, 4), result="dask")(x=xs)
    assert all(isinstance(r, da.Array) for r in lazy) and lazy[0].numblocks == (4, 1)
    by_name = opgraph.compile(g, backend="dask", client=client, chunks={"x": (100, 2)}, result="dask")(x=xs)
    assert by_name[0].numblocks == (10, 2)
    np.testing.assert_allclose(lazy[0].compute(), np.tanh(xs))
    kept = opgraph.compile(g, backend="dask", client=client, chunks=(250, 4), result="persist")(x=xs)
    distributed.wait(kept)
    held = client.who_has(kept[0])  # persisted: every block is held in a worker's memory
    assert held and all(where for where in held.values())
    np.testing.assert_allclose(kept[1].compute(), np.square(xs).sum())


def test_update_edges_keep_state_on_workers(client: Any) -> None:
    """A training-style accumulator: three calls on the cluster against the same loop in NumPy."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (400, 3)), name="x")
    acc = b.input(("float64", (400, 3)), name="acc")
    new = b.op("add", b.op("multiply", acc, 0.5), b.op("sin", x))
    b.update(new, acc)
    b.output(b.op("sum", new, axis=0))
    step = opgraph.compile(b.freeze(), backend="dask", client=client, chunks=(100, 3))
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((400, 3)) for _ in range(3)]
    state = np.ones((400, 3))
    for i, xi in enumerate(xs):
        state = 0.5 * state + np.sin(xi)
        got = step(x=xi, **({"acc": np.ones((400, 3))} if i == 0 else {}))[0]
        np.testing.assert_allclose(got, state.sum(axis=0), rtol=1e-12)
    held = step._state  # the state between calls: persisted dask arrays, not NumPy copies on the client
    assert all(where == "dask" and isinstance(arr, da.Array) for where, arr in held.values())
    np.testing.assert_allclose(step.state("acc"), state, rtol=1e-12)


# ---------------------------------------------------------------- failures
def test_worker_killed_mid_run(client: Any, tmp_path: Path) -> None:
    """SIGKILL one worker while a run is in progress: the nanny restarts it, the scheduler recomputes what
    was lost, and the result is bit for bit the undisturbed one; the call returns (with a time limit)."""
    cols, hidden = 256, 256
    mm = save_npy(tmp_path / "x.npy", 96 * 1024, cols, "float64")  # 192 MiB in 96 blocks of 1024 rows
    p = params(cols, hidden)
    g = mlp_graph(None, cols, hidden)
    f = opgraph.compile(g, backend="dask", client=client, chunks={"x": (1024, cols)})
    reference = f(x=mm, **p)[0]  # undisturbed, on the same workers (the same BLAS, the same sums)
    np.testing.assert_allclose(reference, mlp_numpy(np.asarray(mm), **p), rtol=1e-10)
    before = workers(client)
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        def run() -> np.ndarray:
            started.set()
            return f(x=mm, **p)[0]
        fut = pool.submit(run)
        started.wait()
        victim = None
        deadline = time.monotonic() + 60
        while victim is None and time.monotonic() < deadline and not fut.done():
            busy = [w for w, keys in client.processing().items() if keys]
            done = client.run_on_scheduler(lambda dask_scheduler: sum(
                1 for ts in dask_scheduler.tasks.values() if ts.state == "memory"))
            if busy and done >= 4:  # some blocks finished (and held on workers), more running
                victim = busy[0]
            else:
                time.sleep(0.02)
        assert victim is not None and not fut.done(), "the run ended before a worker could be killed"
        os.kill(before[victim], signal.SIGKILL)
        got = fut.result(timeout=300)
    np.testing.assert_array_equal(got, reference)
    client.wait_for_workers(2, timeout=60)
    after = workers(client)
    assert victim not in after or after[victim] != before[victim]  # the killed worker was replaced


# ---------------------------------------------------------------- out of core
def test_input_larger_than_worker_memory(client: Any, tmp_path: Path) -> None:
    """A 2 GiB float32 memmap, four times each worker's 512 MiB limit: chunks come from the workers' memory
    budget, every worker stays under its limit, and no worker is restarted."""
    cols, hidden = 256, 32
    rows = (2 << 30) // (cols * 4)
    mm = save_npy(tmp_path / "big.npy", rows, cols, "float32", block_rows=1 << 17)
    assert mm.nbytes >= 4 * WORKER_LIMIT
    p = params(cols, hidden, "float32")
    f = opgraph.compile(mlp_graph(None, cols, hidden, "float32"), backend="dask", client=client)
    client.restart()  # fresh workers: their peak memory below is this run's
    first = workers(client)
    got = f(x=mm, **p)[0]
    want = np.zeros(8)
    for i in range(0, rows, 1 << 17):  # the reference streams the file in blocks too
        want += mlp_numpy(np.asarray(mm[i:i + (1 << 17)], dtype=np.float64), **{k: v.astype(np.float64)
                                                                                  for k, v in p.items()})
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert workers(client) == first, "a worker was restarted (memory)"
    memory = dask_chunking.worker_memory(client)
    assert len(memory) == 2
    for w, (peak, limit) in memory.items():
        assert 0 < peak < limit == WORKER_LIMIT, f"worker {w} peaked at {peak >> 20} MiB, its limit {limit >> 20} MiB"
    budget, threads = dask_chunking.worker_budget(client)
    rss = [w["metrics"]["memory"] for w in client.scheduler_info()["workers"].values()]
    assert WORKER_LIMIT // 4 <= budget < WORKER_LIMIT and threads == 1  # the workers' own memory is not free
    assert abs(budget - (WORKER_LIMIT - max(rss))) < 64 << 20, (budget >> 20, [r >> 20 for r in rss])


def test_chunks_naming_no_input_is_an_error() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (10,)), name="x")
    b.output(b.op("exp", x))
    with pytest.raises(BackendError, match=r"chunks= names xx, .*inputs \(x\)"):
        opgraph.compile(b.freeze(), backend="dask", chunks={"xx": 5})(x=np.zeros(10))


def test_explain_says_which_ops_run_whole_and_why() -> None:
    """Chunked ops go unmentioned; a kind without a rule and an instance a rule declines are named with the
    reason; both still compute NumPy's values."""
    rng = np.random.default_rng(4)
    xs, idx = rng.standard_normal((40, 6)), np.array([[0, 5], [39, 2]])
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (40, 6)), name="x")
    i = b.input(("int64", (2, 2)), name="i")
    gram = b.op("matmul", b.op("permute_dims", x), x)
    b.output(b.op("slogdet", gram)[1], b.op("take", x, i, axis=0), b.op("softmax", x, axis=0))
    g = b.freeze()
    f = opgraph.compile(g, backend="dask", chunks={"x": (10, 3)})
    lines = f.explain().splitlines()
    whole = {line.split("(")[1].split(")")[0]: line for line in lines if "runs as one task" in line}
    assert set(whole) == {"slogdet", "take"}
    assert whole["slogdet"].endswith("no chunked rule for this kind")
    assert whole["take"].endswith("dask takes with 1-D indices only")
    for got, want in zip(f(x=xs, i=idx), g.run({"x": xs, "i": idx}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_scan_runs_on_a_worker(client: Any) -> None:
    """A control-flow op ships its body to a worker process (one whole-block task) and runs it there."""
    import opgraph.numpy as onp

    xs = onp.placeholder((50, 4), "float64", name="xs")

    def step(h: Any, x: Any) -> tuple[Any, Any]:
        h2 = onp.tanh(h * 0.5 + x)
        return h2, h2.sum()
    carry, ys = opgraph.scan(step, onp.zeros((4,), dtype="float64"), xs)
    g = onp.to_graph([carry, ys], inputs=[xs])
    data = np.random.default_rng(5).standard_normal((50, 4))
    f = opgraph.compile(g, backend="dask", client=client)
    assert "(scan) on dask runs as one task on whole inputs" in f.explain()
    for got, want in zip(f(xs=data), g.run({"xs": data}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
