"""The dask engine's feeds and chunks: file memmaps read block by block (:class:`MemmapSource`), zarr and dask
feeds taken as they are (:func:`adopt`), and chunk sizes from each worker's memory budget (:func:`chunk_bytes`,
:func:`choose_chunks`).

    >>> chunk_bytes(4 << 30, 4) >> 20
    128
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np

from opgraph.core.graph import Graph
from opgraph.core.types import TensorType
from opgraph.errors import FeedError
from opgraph.memory.limit import physical_memory

MIB = 1 << 20
MIN_CHUNK_BYTES = 1 * MIB
MAX_CHUNK_BYTES = 256 * MIB


class MemmapSource:
    """A file-backed array (a ``.npy`` memmap, or any view of one) as a chunk source: each read maps the
    bytes the array spans, copies the block out and unmaps them, so a worker's memory holds its blocks and
    never the pages of the whole file; pickles as the file name and layout (a worker opens the file itself).

    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(path, np.arange(6.0).reshape(3, 2))
    >>> src = MemmapSource.of(np.load(path, mmap_mode="r"))
    >>> src[1:, :1], src.shape, src.dtype
    (array([[2.],
           [4.]]), (3, 2), dtype('float64'))
    >>> MemmapSource.of(np.load(path, mmap_mode="r")[::-1, 1:].T)[:, :2]   # a view: its own offset and strides
    array([[5., 3.]])
    """

    __slots__ = ("dtype", "filename", "ndim", "offset", "shape", "stamp", "strides")

    def __init__(self, filename: str, dtype: Any, shape: tuple[int, ...], offset: int,
                 strides: tuple[int, ...] | None = None) -> None:
        self.filename = filename
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        self.ndim = len(self.shape)
        self.offset = int(offset)  # file position of element [0, ..., 0]
        if strides is None:  # C order
            strides = tuple(int(np.prod(self.shape[i + 1:], dtype=np.int64)) * self.dtype.itemsize
                            for i in range(self.ndim))
        self.strides = tuple(int(s) for s in strides)
        st = os.stat(filename)
        self.stamp = (st.st_size, st.st_mtime_ns)

    @staticmethod
    def of(a: np.ndarray) -> MemmapSource:
        """The source reading the file region behind ``a``, a memmap or a view of one (see :func:`file_root`)."""
        root = file_root(a)
        if root is None:
            raise ValueError("not a view of a file memmap")
        pos = int(root.offset) + _address(a) - _address(root)
        return MemmapSource(str(root.filename), a.dtype, a.shape, pos, a.strides)

    def __getitem__(self, index: Any) -> np.ndarray:
        if 0 in self.shape:
            return np.empty(self.shape, self.dtype)[index]
        lo = self.offset + sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides, strict=True))
        hi = self.offset + sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides, strict=True))
        mm = np.memmap(self.filename, dtype=np.uint8, mode="r", offset=lo, shape=(hi + self.dtype.itemsize - lo,))
        # the copy holds no reference to the map, so it is unmapped as this returns
        return np.array(np.ndarray(self.shape, self.dtype, buffer=mm, offset=self.offset - lo,
                                   strides=self.strides)[index])

    def __reduce__(self) -> tuple[Any, ...]:
        return (MemmapSource, (self.filename, self.dtype.str, self.shape, self.offset, self.strides))

    def __dask_tokenize__(self) -> Any:
        return ("opgraph.MemmapSource", self.filename, self.dtype.str, self.shape, self.offset, self.strides,
                self.stamp)


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def file_root(a: Any) -> np.memmap | None:
    """The memmap mapping a file region (``np.load(path, mmap_mode="r")``) that ``a``'s memory lies in: ``a``
    itself, or the memmap it is a view of (a slice, a transpose, ``np.asarray`` of it); None for anything else.

    Copy-on-write maps (``mmap_mode="c"``) are not file-backed: their changes are not in the file.

    >>> file_root(np.zeros(2)) is None
    True
    """
    # a view's base chain ends at the memmap created on the mmap object (a view of a memmap is a memmap
    # too, with its parent's filename and offset, so only that root's offset describes its own data)
    seen = a
    while isinstance(seen, np.ndarray):
        if isinstance(seen, np.memmap) and isinstance(seen.base, mmap.mmap):
            ok = getattr(seen, "filename", None) is not None and getattr(seen, "mode", "c") in ("r", "r+", "w+")
            return seen if ok else None
        seen = seen.base
    return None


def is_memmap_file(a: Any) -> bool:
    """True for an array whose memory is a file region mapped by a memmap (``np.load(path, mmap_mode="r")``
    or a view of one): the dask backend reads it from the file, block by block (:class:`MemmapSource`).

    >>> is_memmap_file(np.zeros(2))
    False
    """
    return isinstance(a, np.ndarray) and a.dtype.kind not in "OV" and file_root(a) is not None


def is_zarr(a: Any) -> bool:
    """True for a zarr array (duck-typed on its module, so zarr is not imported here).

    >>> is_zarr(np.zeros(2))
    False
    """
    return type(a).__module__.split(".")[0] == "zarr" and hasattr(a, "chunks") and hasattr(a, "shape")


def machine_memory() -> int:
    # memory.limit's reading (sysconf, else psutil); with neither, assume 4 GiB rather than no bound at all
    return physical_memory() or 4 << 30


def worker_budget(client: Any = None, num_workers: int | None = None) -> tuple[int, int]:
    """``(bytes, threads)`` of the smallest worker: a client's workers' ``memory_limit`` and ``nthreads``,
    or, on the local threaded scheduler, this machine's memory shared by its threads.

    >>> nbytes, threads = worker_budget(num_workers=2)
    >>> threads, nbytes == machine_memory()
    (2, True)
    """
    if client is not None:
        workers = client.scheduler_info().get("workers", {}).values()
        limits = [int(w.get("memory_limit") or 0) for w in workers]
        threads = [int(w.get("nthreads") or 1) for w in workers]
        limit = min((m for m in limits if m > 0), default=machine_memory())
        return limit, max(threads, default=1)
    return machine_memory(), int(num_workers or os.cpu_count() or 1)


def peak_rss() -> int:
    """This process's peak resident bytes: Linux's VmHWM, which starts afresh at exec (``ru_maxrss`` does not:
    a worker a nanny spawns would report the nanny's process's peak), else ``ru_maxrss``.

    >>> peak_rss() > 0
    True
    """
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10


def worker_memory(client: Any) -> dict[str, tuple[int, int]]:
    """Each worker's peak resident bytes so far (:func:`peak_rss`, run on the worker) and its ``memory_limit``
    (0: none), by worker address: how close a run came to the limits the default chunks are sized for.

    >>> worker_memory  # doctest: +ELLIPSIS
    <function worker_memory at ...>
    """
    peaks = client.run(peak_rss, on_error="ignore")
    limits = {a: int(w.get("memory_limit") or 0) for a, w in client.scheduler_info()["workers"].items()}
    return {a: (int(peaks[a]), limits.get(a, 0)) for a in sorted(peaks)}


LIVE_DEFAULT = 4.0
"""Blocks a task holds at once when the graph cannot tell (:func:`live_blocks` of a dynamic-shape graph)."""


def live_blocks(graph: Graph) -> float:
    """How many blocks the size of the largest input's block one chunk of the graph holds at once: the
    most bytes live at any step of a depth-first schedule (inputs, temporaries, results; nothing computed
    in place, as block kernels are not) over the largest input's bytes, at least 2 (a block and its
    result); :data:`LIVE_DEFAULT` where shapes are dynamic.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (100, 8)), name="x")
    >>> b.output(b.op("add", b.op("exp", x), b.op("sin", x)))
    >>> live_blocks(b.freeze())   # x, exp(x), sin(x)
    3.0
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (100, 8)), name="x")
    >>> b.output(b.op("multiply", b.op("reshape", x, shape=(100, 8, 1)), b.op("reshape", x, shape=(100, 1, 8))))
    >>> live_blocks(b.freeze())   # the outer product is 8 blocks
    10.0
    """
    from opgraph.memory.schedule import default_targets, dfs_schedule, value_nbytes

    nbytes = value_nbytes(graph)
    ins = [int(v) for v in graph.inputs.tolist()]
    if any(nbytes[v] is None for v in ins):
        return LIVE_DEFAULT
    largest = max((nbytes[v] or 0 for v in ins), default=0)
    if largest == 0:
        return LIVE_DEFAULT
    targets = default_targets(graph)
    order = dfs_schedule(graph, targets).tolist()
    last: dict[int, int] = {}
    for step, op in enumerate(order):
        for v in graph.op_inputs(op).tolist():
            last[v] = step
    for v in targets:
        last[v] = len(order)  # results stay until they are gathered
    live = sum(nbytes[v] or 0 for v in set(ins))
    peak = live
    for step, op in enumerate(order):
        outs = graph.op_outputs(op).tolist()
        if any(nbytes[v] is None for v in outs):
            return LIVE_DEFAULT
        live += sum(nbytes[v] or 0 for v in outs)
        peak = max(peak, live)
        for v in set(graph.op_inputs(op).tolist()) | set(outs):
            if last.get(v, -1) <= step:
                live -= nbytes[v] or 0
    return max(peak / largest, 2.0)


def chunk_bytes(budget: int, threads: int, live: float = 4.0) -> int:
    """The largest chunk for a worker of ``budget`` bytes running ``threads`` tasks at once, each holding
    about ``live`` chunk-sized blocks (inputs, temporaries, its result) and as many waiting in memory;
    clipped to [1 MiB, 256 MiB].

    >>> chunk_bytes(4 << 30, 2) // (1 << 20)
    256
    >>> chunk_bytes(200 << 20, 2) // (1 << 20)
    12
    """
    per = budget / (max(threads, 1) * 2 * max(live, 1.0))
    return int(min(max(per, MIN_CHUNK_BYTES), MAX_CHUNK_BYTES))



def choose_chunks(shape: Sequence[int], dtype: Any, limit: int) -> tuple[tuple[int, ...], ...]:
    """Chunks of at most ``limit`` bytes, splitting the leading axis only where a row fits (blocks of whole
    rows read contiguously from a C-ordered file, as few as fit and of equal size, so no block is a sliver),
    else as dask's ``"auto"`` does.

    >>> choose_chunks((1000, 256), "float32", 256 * 4 * 100)
    ((100, 100, 100, 100, 100, 100, 100, 100, 100, 100), (256,))
    >>> choose_chunks((1001, 256), "float32", 256 * 4 * 500)   # not 500 + 500 + 1
    ((334, 334, 333), (256,))
    """
    from dask.array.core import normalize_chunks

    shape = tuple(int(s) for s in shape)
    if not shape:
        return ()
    row = np.dtype(dtype).itemsize * math.prod(shape[1:])
    if row <= limit:
        n = shape[0]
        blocks = max(1, -(-n * row // limit)) if n else 1
        rows = tuple(n // blocks + (i < n % blocks) for i in range(blocks))
        return (rows, *((d,) for d in shape[1:]))
    return normalize_chunks("auto", shape, limit=limit, dtype=dtype)


def adopt(data: Any, t: TensorType, label: str) -> Any | None:
    """A feed the backend takes as it is (a dask array, a zarr array, a file memmap), checked against the
    input's type without reading it; None for anything else (converted by the usual feed rule).

    A feed of another dtype is cast lazily (block by block) where NumPy casts it safely; a lossy cast is an
    error, as its values cannot be checked without computing them. A memmap is returned as it is and read
    from its file by :meth:`DaskExecutable.as_dask`.

    >>> from opgraph.core.types import TensorType as T
    >>> adopt(da.zeros(3, dtype="int8"), T("int16", (3,)), "%x").dtype
    dtype('int16')
    >>> adopt(np.zeros(3), T("float64", (3,)), "%x") is None
    True
    """
    if isinstance(data, da.Array):
        arr, what = data, "dask array"
    elif is_zarr(data):
        arr, what = da.from_zarr(data), "zarr array"
    elif is_memmap_file(data):
        arr, what = data, "file memmap"
    else:
        return None
    if not t.accepts(_Probe(arr.shape, t.dtype)):
        raise FeedError(f"input {label} expects {t}, got a {what} of shape {tuple(arr.shape)}")
    if arr.dtype != t.dtype:
        if not np.can_cast(arr.dtype, t.dtype, "safe"):
            raise FeedError(f"input {label} expects {t}, got a {what} of {arr.dtype}: cast it first (its "
                            f"values cannot be checked for the lossy cast without computing them)")
        if isinstance(arr, da.Array):
            arr = arr.astype(t.dtype)
    return arr


class _Probe:
    """Shape and dtype alone, for :meth:`TensorType.accepts`."""

    def __init__(self, shape: tuple[Any, ...], dtype: Any) -> None:
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)
