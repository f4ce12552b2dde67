"""backend="dask" fed a dask array over a ``.npy`` file (issue 36) on a 2-worker ``distributed.LocalCluster`` whose
workers' memory limit is below the file's size: a dask array slicing the memmap is read per chunk from the file; the
memmap fed itself; ``da.from_array(np.load(path, mmap_mode="r"), chunks=...)``, what a Dask user writes first (a
copy in memory since dask 2024.12), and other memory maps opgraph cannot rebuild are refused in one line saying what
to feed. Results against NumPy on the same file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

da = pytest.importorskip("dask.array", reason="the dask engine is an optional extra; make test installs it")
distributed = pytest.importorskip("distributed", reason="the dask engine is an optional extra; make test installs it")

import opgraph  # noqa: E402
from opgraph.backends.dask import chunking as dask_chunking  # noqa: E402
from opgraph.errors import FeedError  # noqa: E402

COLS, HIDDEN = 256, 32
LIMIT = 160 << 20       # each worker's memory_limit
FILE = 192 << 20        # X's bytes: above a worker's limit
CHUNK_ROWS = 4096       # 4 MiB blocks of float32 rows


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """Two worker processes of one thread, each limited to 160 MiB: above a worker's own footprint (about 85 MiB
    with NumPy, dask and opgraph imported) plus a few 4 MiB blocks, below the 192 MiB file. A worker handed the
    whole file as one task passes its limit and is restarted by its nanny; after three such deaths the call
    fails with ``KilledWorker``, which is what the old code did here."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit=LIMIT,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """X: 192 MiB of float32 normal noise in a .npy file, written block by block (no copy of it stays here)."""
    path = tmp_path_factory.mktemp("dask_files") / "x.npy"
    rows = FILE // (COLS * 4)
    rng = np.random.default_rng(3)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, COLS)})
        for i in range(0, rows, 1 << 16):
            rng.standard_normal((min(1 << 16, rows - i), COLS), dtype=np.float32).tofile(f)
    return path


def graph() -> opgraph.Graph:
    """sum(tanh(x * a + b) @ w, axis=0): elementwise ops, a matmul and a reduction over x's rows."""
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (None, COLS)), name="x")
    a = b.input(("float32", (COLS,)), name="a")
    c = b.input(("float32", (COLS,)), name="b")
    w = b.input(("float32", (COLS, HIDDEN)), name="w")
    b.output(b.op("sum", b.op("matmul", b.op("tanh", b.op("add", b.op("multiply", x, a), c)), w), axis=0))
    return b.freeze()


def params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"a": rng.uniform(0.2, 0.8, COLS).astype(np.float32), "b": rng.uniform(0.05, 0.3, COLS).astype(np.float32),
            "w": (rng.uniform(0.0, 1.0, (COLS, HIDDEN)) / COLS).astype(np.float32)}


def numpy_reference(mm: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    """The same sum by NumPy, streaming the file in blocks, in float64."""
    out = np.zeros(HIDDEN)
    for i in range(0, mm.shape[0], 1 << 15):
        x = np.asarray(mm[i:i + (1 << 15)], dtype=np.float64)
        out += (np.tanh(x * p["a"] + p["b"]) @ p["w"].astype(np.float64)).sum(axis=0)
    return out


def largest_task(arr: Any) -> int:
    """Bytes of the largest pickled entry of a dask array's task graph: what one task ships to a worker."""
    return max(len(cloudpickle.dumps(v)) for v in dict(arr.__dask_graph__()).values())


def mapped_dask_array(mm: np.memmap, rows: int, name: str, inline: bool = False) -> Any:
    """A dask array whose tasks slice the memmap itself: what ``da.from_array(mm, chunks=(rows, ...))`` built
    before dask 2024.12 (it copies its source into memory since), and ``graph_from_arraylike`` builds now."""
    from dask.array.core import graph_from_arraylike, normalize_chunks

    chunks = normalize_chunks((rows, *mm.shape[1:]), mm.shape, dtype=mm.dtype)
    dsk = graph_from_arraylike(mm, chunks, mm.shape, name, inline_array=inline, dtype=mm.dtype)
    return da.Array(dsk, name, chunks, dtype=mm.dtype)


def test_memmap_backed_dask_array_on_workers_smaller_than_the_file(client: Any, npy: Path) -> None:
    """A dask array slicing a memmap of a file larger than each worker's memory limit is read chunk by chunk
    from the file: its graph ships a few KiB, not the file; equal to NumPy on the file, no worker restarted,
    every worker under its limit (the old code shipped all of X as one task and all the workers died:
    ``KilledWorker``). The memmap fed itself gives the same. ``da.from_array(np.load(path, mmap_mode="r"))``,
    which since dask 2024.12 holds a copy of the file in memory whose file is no longer known, is refused
    with one line saying to feed the memmap itself (the old code: ``KilledWorker``, after minutes).

    The file is 192 MiB, not the issue's 1 GiB: the limit only has to sit between a worker's own footprint
    and the file's size for a whole-file task to kill workers, and a smaller file keeps this test to seconds on
    two shared cores; the graph-size check says the same independently of the workers' memory."""
    mm = np.load(npy, mmap_mode="r")
    assert mm.nbytes == FILE > LIMIT
    p = params()
    want = numpy_reference(mm, p)
    feed = mapped_dask_array(mm, CHUNK_ROWS, "x-mapped")
    assert largest_task(feed) > FILE  # as given, one task holds the whole file
    lazy = opgraph.compile(graph(), backend="dask", client=client, result="dask")(x=feed, **p)[0]
    assert sum(len(cloudpickle.dumps(v)) for v in dict(lazy.__dask_graph__()).values()) < FILE // 100
    f = opgraph.compile(graph(), backend="dask", client=client, chunks={"x": (CHUNK_ROWS, COLS)})
    before = dict(client.run(os.getpid))
    np.testing.assert_allclose(f(x=feed, **p)[0], want, rtol=1e-4)
    # the memmap fed itself, in the blocks opgraph chooses: the budget leaves out the workers' own ~95 MiB
    fed = opgraph.compile(graph(), backend="dask", client=client)
    np.testing.assert_allclose(fed(x=mm, **p)[0], want, rtol=1e-4)
    assert dict(client.run(os.getpid)) == before, "a worker was restarted (memory)"
    for w, (peak, limit) in dask_chunking.worker_memory(client).items():
        assert 0 < peak < limit == LIMIT, f"worker {w} peaked at {peak >> 20} MiB, its limit {limit >> 20} MiB"
    with pytest.raises(FeedError) as err:
        f(x=da.from_array(mm, chunks=(CHUNK_ROWS, COLS)), **p)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("input %x: da.from_array copied this memmap into memory")
    assert "192 MiB" in msg and "feed the memmap itself (np.load(path, mmap_mode='r'))" in msg


def test_a_graph_holding_the_files_map_reads_each_chunk_from_the_file(tmp_path: Path) -> None:
    """On the local scheduler too, a dask array slicing a memmap, inlined in its tasks or not, is rebuilt to read
    per chunk from the file (its graph pickles to a few KiB, not the file's bytes) and gives NumPy's values."""
    xs = np.random.default_rng(0).standard_normal((4000, COLS)).astype(np.float32)
    np.save(tmp_path / "x.npy", xs)
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    p = params()
    want = (np.tanh(xs * p["a"] + p["b"]) @ p["w"]).sum(axis=0)
    f = opgraph.compile(graph(), backend="dask", result="dask")
    for inline in (False, True):
        feed = mapped_dask_array(mm, 1000, f"mm-{inline}", inline)
        assert largest_task(feed) > mm.nbytes  # the map pickles as all of its bytes
        lazy = f(x=feed, **p)[0]
        assert sum(len(cloudpickle.dumps(v)) for v in dict(lazy.__dask_graph__()).values()) < mm.nbytes // 50
        np.testing.assert_allclose(lazy.compute(), want, rtol=1e-4)


def test_a_memmap_inside_other_tasks_is_refused_on_a_cluster(client: Any, npy: Path) -> None:
    """A memory map opgraph cannot rebuild (here a ``map_blocks`` argument, which dask would pickle whole into
    every task) is refused on a cluster with one line naming the input, the file and what to feed instead; a
    from_array source of unknown backing (an object with a ``filename``) likewise. On the local threaded scheduler
    nothing is pickled, and the same feed runs."""
    mm = np.load(npy, mmap_mode="r")
    rows = 1000
    ones = da.ones((rows, COLS), chunks=(250, COLS), dtype=np.float32)
    feed = ones.map_blocks(lambda blk, m: blk * m[:1], mm, dtype=np.float32)
    p = params()
    with pytest.raises(FeedError) as err:
        opgraph.compile(graph(), backend="dask", client=client)(x=feed, **p)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("input %x: ") and str(npy) in msg
    assert f"feed the memmap itself (np.load({str(npy)!r}, mmap_mode='r'))" in msg and "pickle" in msg
    got = opgraph.compile(graph(), backend="dask")(x=feed, **p)[0]
    x = np.ones((rows, COLS), np.float32) * np.asarray(mm[:1])
    np.testing.assert_allclose(got, (np.tanh(x * p["a"] + p["b"]) @ p["w"]).sum(axis=0), rtol=1e-4)

    class Stored:
        """An array-like read from a file opgraph does not know how to read per chunk."""

        filename = str(npy)
        shape, dtype, ndim = (rows, COLS), np.dtype(np.float32), 2

        def __getitem__(self, index: Any) -> np.ndarray:
            return np.asarray(mm[:rows][index])

    with pytest.raises(FeedError, match=r"^input %x: .* holds a Stored of '.*x\.npy'.*unknown backing.*np\.load\("):
        opgraph.compile(graph(), backend="dask", client=client)(x=da.from_array(Stored(), chunks=(250, COLS)), **p)
