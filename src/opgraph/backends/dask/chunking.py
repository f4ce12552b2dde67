"""The dask engine's feeds and chunks: file memmaps read block by block (:class:`MemmapSource`), zarr and dask
feeds taken as they are (:func:`adopt`), a dask feed slicing a file memmap rebuilt to read its chunks from the
file, or refused on a cluster where one task would ship a whole file (:func:`from_files`), and chunk sizes from
each worker's memory budget (:func:`chunk_bytes`, :func:`choose_chunks`).

    >>> chunk_bytes(4 << 30, 4) >> 20
    128
"""

from __future__ import annotations

import functools
import math
import mmap
import os
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
from dask.array.core import getter, getter_inline, getter_nofancy
from dask.blockwise import Blockwise
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.layers import ArraySliceDep

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
    root = mapped_root(a)
    if isinstance(root, np.memmap) and getattr(root, "filename", None) is not None and \
            getattr(root, "mode", "c") in ("r", "r+", "w+"):
        return root
    return None


def mapped_root(a: Any) -> np.ndarray | None:
    """The array made on a memory map (its ``base`` is the ``mmap``) that ``a``'s memory lies in: ``a`` or an
    array ``a`` is a view of; None when ``a``'s memory is no memory map.

    A view's base chain ends there; a view of a memmap is a memmap too, with its parent's filename and offset,
    so only that root's offset describes its own data.

    >>> mapped_root(np.zeros(2)) is None
    True
    """
    seen = a
    while isinstance(seen, np.ndarray):
        if isinstance(seen.base, mmap.mmap):
            return seen
        seen = seen.base
    return None


def is_memmap_file(a: Any) -> bool:
    """True for an array whose memory is a file region mapped by a memmap (``np.load(path, mmap_mode="r")``
    or a view of one): the dask backend reads it from the file, block by block (:class:`MemmapSource`).

    >>> is_memmap_file(np.zeros(2))
    False
    """
    return isinstance(a, np.ndarray) and a.dtype.kind not in "OV" and file_root(a) is not None


def on_mmap(a: Any) -> bool:
    """True for an array whose memory is a memory map of any kind (a file memmap, a copy-on-write one, an
    anonymous ``mmap``): pickling it copies all the bytes it spans into the pickle.

    >>> on_mmap(np.zeros(2))
    False
    """
    return mapped_root(a) is not None


GETTERS = (getter, getter_nofancy, getter_inline)
"""The functions ``da.from_array``'s tasks call to cut a chunk out of its source (``source[slices]``)."""


def from_files(arr: da.Array, label: str, task_bytes: int | None = None) -> da.Array:
    """``arr`` with each ``da.from_array`` in its graph whose source is a file memmap rebuilt to read each chunk in
    its task from the file (:class:`MemmapSource`: the file's name and layout travel in the graph, not its
    bytes); ``arr`` itself when there is none. Its chunks, keys and values stay the same.

    ``da.from_array`` keeps its source whole, as the data of one key every chunk's task slices, so on a
    ``distributed`` cluster dask pickles all of it into the task graph as one task that a worker must hold
    (``KilledWorker`` for a file larger than a worker's memory). A source still mapped from its file (dask before
    2024.12, or a graph built with ``dask.array.core.graph_from_arraylike``) is rebuilt. Since dask 2024.12
    ``from_array`` copies its source into memory first, so ``da.from_array(np.load(path, mmap_mode="r"))`` holds
    a copy whose file is no longer known, and nothing can read it back per chunk.

    ``task_bytes`` is given on a cluster (the graph is pickled): the most bytes one task may ship there (the
    block size chosen for its workers). A feed that would ship more in one task, or a memory map that cannot be
    rebuilt, is refused with one line saying what to feed instead (``label`` names the input): such a copy of a
    memmap or NumPy array held whole, a map not read back from its file (copy-on-write, anonymous), one inside
    other tasks than from_array's (a ``map_blocks`` argument, a delayed value), a from_array source with a
    ``filename`` that is not a NumPy array (unknown backing).

    >>> import tempfile, os, pickle
    >>> from dask.array.core import graph_from_arraylike
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.arange(1e6).reshape(1000, 1000))       # 8 MB
    >>> mm = np.load(path, mmap_mode="r")
    >>> x = da.Array(graph_from_arraylike(mm, ((250,) * 4, (1000,)), mm.shape, "x"), "x", ((250,) * 4, (1000,)),
    ...              dtype=mm.dtype)
    >>> len(pickle.dumps(dict(x.dask))) > 8e6                   # the map pickles as all of its bytes
    True
    >>> y = from_files(x, "%x")
    >>> len(pickle.dumps(dict(y.dask))) < 5000, bool((y.compute() == mm).all())
    (True, True)
    >>> from_files(da.from_array(mm, chunks=250), "%x", task_bytes=1 << 20)
    Traceback (most recent call last):
    ...
    opgraph.errors.FeedError: input %x: da.from_array ... one task would ship all 7.629 MiB of it ...
    """
    hlg = arr.__dask_graph__()
    if not isinstance(hlg, HighLevelGraph):
        return arr
    layers = dict(hlg.layers)
    deps = {k: set(v) for k, v in hlg.dependencies.items()}
    dependents = hlg.dependents
    changed = False
    for name, layer in hlg.layers.items():
        found = _from_array_source(hlg, layer)
        if found is None:
            continue
        src, held, chunks = found
        if not isinstance(src, np.ndarray):
            if task_bytes is not None and not isinstance(src, MemmapSource) and \
                    getattr(src, "filename", None) is not None:
                nbytes = getattr(src, "nbytes", None)
                if not isinstance(nbytes, int) or nbytes > task_bytes:
                    raise FeedError(_refusal(label, src, f"from_array layer {name!r}", "an unknown backing",
                                             task_bytes))
            continue  # a zarr array, an h5py dataset...: read by its own getitem
        if not on_mmap(src):
            if task_bytes is not None and src.nbytes > task_bytes:
                raise FeedError(_whole(label, src, task_bytes))
            continue
        if held is not None and dependents.get(held, set()) - {name}:
            continue  # other tasks read the map too (refused below)
        if not is_memmap_file(src) or (f"original-{name}" in layers and f"original-{name}" != held):
            continue  # a map not read back from its file (refused below), or no room for the source's key
        fresh = da.from_array(MemmapSource.of(src), chunks=chunks, name=name, lock=False,
                              fancy=layer.task.func is not getter_nofancy).__dask_graph__()
        if held is not None:
            del layers[held], deps[held]
        layers.update(fresh.layers)
        deps.update({k: set(v) for k, v in fresh.dependencies.items()})
        changed = True
    if task_bytes is not None:
        for name, layer in layers.items():
            hit = _mapped_in(layer, task_bytes)
            if hit is not None:
                raise FeedError(_refusal(label, hit, f"layer {name!r}", "a task that is not from_array's reads it",
                                         task_bytes))
    if not changed:
        return arr
    return da.Array(HighLevelGraph(layers, deps), arr.name, arr.chunks, meta=arr._meta)


def _whole(label: str, src: np.ndarray, task_bytes: int) -> str:
    """One line: a from_array source held whole in memory, larger than a task may ship, and what to feed."""
    size = f"{src.nbytes / 2**20:.4g} MiB"
    if isinstance(src, np.memmap):  # dask >= 2024.12 copied the memmap: the file is not known any more
        what = ("da.from_array copied this memmap into memory (dask 2024.12 and later copy their source; the "
                "file's name is lost)")
        fix = ("the memmap itself (np.load(path, mmap_mode='r')), which opgraph reads chunk by chunk from its "
               "file")
    else:
        what = "da.from_array holds this NumPy array whole in one key"
        fix = "the NumPy array itself, which opgraph cuts into chunks"
    return (f"input {label}: {what}, and one task would ship all {size} of it to a worker, more than the "
            f"{task_bytes / 2**20:.4g} MiB a task gets on these workers; feed {fix}")


def _from_array_source(hlg: HighLevelGraph, layer: Any) -> tuple[Any, str | None, Any] | None:
    """``(source, name of the layer holding it or None where inlined, chunks)`` of a ``da.from_array`` layer (a
    blockwise getter over slices of its source); None for any other layer."""
    task = getattr(layer, "task", None)
    if not isinstance(layer, Blockwise) or getattr(task, "func", None) not in GETTERS or len(layer.indices) != 2:
        return None
    (src, index), (dep, _) = layer.indices
    slices = (layer.io_deps or {}).get(dep)
    if index is not None or not isinstance(slices, ArraySliceDep):
        return None
    key = getattr(src, "key", None)  # a reference to the key holding the source, or the source inlined
    if key is None:
        return _data(src), None, slices.chunks
    held = hlg.layers.get(key)
    if not isinstance(held, MaterializedLayer) or key not in held:
        return None
    return _data(held[key]), key, slices.chunks


def _data(x: Any) -> Any:
    # a literal in a dask task spec (DataNode) holds its value as .value
    return x.value if type(x).__name__ == "DataNode" and hasattr(x, "value") else x


_SCALARS = (str, bytes, int, float, complex, bool, type(None), slice, type(Ellipsis), np.generic, np.dtype)


def _mapped_in(x: Any, above: int, depth: int = 0) -> np.ndarray | None:
    """The first memory-mapped array of more than ``above`` bytes in a layer's data and tasks (a materialized
    layer's values, a blockwise layer's literal arguments and its task's), looking into containers and dask's task
    nodes only."""
    if isinstance(x, np.ndarray):
        return x if x.nbytes > above and on_mmap(x) else None
    if depth > 20 or isinstance(x, _SCALARS):
        return None
    if isinstance(x, MaterializedLayer):
        items: Any = x.mapping.values()
    elif isinstance(x, Blockwise):
        items = [*(v for v, _ in x.indices), x.task]
    elif isinstance(x, (tuple, list, set, frozenset)):
        items = x
    elif isinstance(x, dict):
        items = x.values()
    elif isinstance(x, functools.partial):
        items = [x.args, x.keywords]
    elif type(x).__module__.startswith("dask."):  # task nodes: Task (func, args, kwargs), DataNode (value)
        items = [getattr(x, a) for a in ("value", "func", "args", "kwargs") if hasattr(x, a)]
    else:
        return None
    for item in items:
        hit = _mapped_in(item, above, depth + 1)
        if hit is not None:
            return hit
    return None


def _refusal(label: str, what: Any, where: str, why: str, task_bytes: int) -> str:
    """One line: the memory map or file-backed source a dask feed holds, why opgraph cannot read it chunk by chunk,
    and what to feed instead."""
    root = mapped_root(what)
    root = root if isinstance(root, np.memmap) else None
    filename = getattr(root if root is not None else what, "filename", None)
    nbytes = getattr(what, "nbytes", None)
    size = f" of {nbytes / 2**20:.4g} MiB" if isinstance(nbytes, int) else ""
    if root is not None and getattr(root, "mode", None) == "c":
        kind, why = f"a copy-on-write memmap{size} of {str(filename)!r}", "its changes are not in the file"
    elif isinstance(what, np.ndarray):
        kind = f"a memmap{size} of {str(filename)!r}" if filename else f"a memory-mapped array{size}"
    else:
        kind = f"a {type(what).__name__}{size} of {str(filename)!r}"
    path = repr(str(filename)) if filename and root is not None else "path"
    return (f"input {label}: the dask array's {where} holds {kind}, which opgraph cannot read chunk by chunk "
            f"({why}); dask would pickle all of it into one task for the cluster, more than the "
            f"{task_bytes / 2**20:.4g} MiB a task gets on these workers; feed the memmap itself "
            f"(np.load({path}, mmap_mode='r')), which opgraph reads chunk by chunk from its file")


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
    """``(bytes, threads)`` of the smallest worker: what a client's workers have free under their
    ``memory_limit`` (the limit less the worker process's own resident memory, at least a quarter of the limit)
    and their ``nthreads``, or, on the local threaded scheduler, this machine's memory shared by its threads.

    A worker's own memory counts because the nanny kills it on its whole resident size: a budget of the bare
    limit let chunks sized for 160 MiB workers kill workers that already held ~95 MiB of their own.

    >>> nbytes, threads = worker_budget(num_workers=2)
    >>> threads, nbytes == machine_memory()
    (2, True)
    """
    if client is not None:
        workers = client.scheduler_info().get("workers", {}).values()
        free = [_free(int(w.get("memory_limit") or 0), int((w.get("metrics") or {}).get("memory") or 0))
                for w in workers]
        threads = [int(w.get("nthreads") or 1) for w in workers]
        return min((m for m in free if m > 0), default=machine_memory()), max(threads, default=1)
    return machine_memory(), int(num_workers or os.cpu_count() or 1)


def _free(limit: int, resident: int) -> int:
    """A worker's budget: its limit less what it holds already, kept to at least a quarter of the limit."""
    return max(limit - resident, limit // 4) if limit > 0 else 0


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
