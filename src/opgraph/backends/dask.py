"""The dask backend: a graph as ``dask.array`` operations over chunks, on threads or a ``distributed`` cluster.

Each op kind has a rule (``RULES``) making the ``dask.array`` call for one op from its static facts, so
the graph becomes the same chunked task graph a hand-written ``dask.array`` program would build:
elementwise ops map the op's own NumPy kernel over aligned blocks (NumPy's values, block by block),
reductions, matmul and contractions, reshapes, transposes, concatenation, slicing and indexing use
``dask.array``'s chunked algorithms. An op no rule chunks still runs, inside the task graph, as one task
on its whole inputs (:data:`WHOLE` says why for each such kind; :meth:`Program.explain
<opgraph.runtime.compiled.Program.explain>` lists them), so nothing goes back to the client.

Feeds may be NumPy arrays, ``.npy`` memmaps (read chunk by chunk from the file: a worker never maps the
whole file), zarr arrays (their own chunks) or ``dask.array`` arrays (taken as they are). Chunk sizes
come from a memory budget per worker (:func:`chunk_bytes`) unless ``chunks=`` or ``chunk_bytes=`` is
given. Results come back as NumPy arrays, computed in one pass (``result="numpy"``, the default), or as
``dask.array`` arrays, lazy (``result="dask"``) or persisted (``result="persist"``). Update-edge state is
persisted between calls, so the next call starts from it without recomputing its history.

It runs on dask's local threaded scheduler by default, or on a ``distributed.Client`` given as
``client=``:

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (1000, 4)), name="x")
    >>> b.output(b.op("sum", b.op("tanh", b.op("multiply", x, 2.0)), axis=0))
    >>> f = opgraph.compile(b.freeze(), backend="dask", chunks=(250, 4))
    >>> xs = np.linspace(-1, 1, 4000).reshape(1000, 4)
    >>> np.allclose(f(x=xs)[0], np.tanh(2 * xs).sum(axis=0))
    True
    >>> lazy = opgraph.compile(b.freeze(), backend="dask", chunks=(250, 4), result="dask")(x=xs)[0]
    >>> type(lazy).__name__, lazy.numblocks
    ('Array', (1,))
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np

from opgraph.backends.base import Backend, BackendError, Executable, OpInfo, straight_line
from opgraph.core.graph import Graph
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import FeedError

Rule = Callable[[OpInfo], Callable[..., Any]]
RULES: dict[str, Rule] = {}
"""Op kind -> rule factory building the op from ``dask.array`` calls over chunks."""
WHOLE: dict[str, str] = {}
"""Op kind -> why it runs as one task on its whole inputs (kinds with a NumPy kernel and no chunked rule,
when not listed here, give a generic reason)."""

MIB = 1 << 20
MIN_CHUNK_BYTES = 1 * MIB
MAX_CHUNK_BYTES = 256 * MIB


def rule(*kinds: str) -> Callable[[Rule], Rule]:
    """Register a rule factory for op kinds (``RULES[kind] = factory``)."""
    def register(fn: Rule) -> Rule:
        for k in kinds:
            RULES[k] = fn
        return fn
    return register


# ---------------------------------------------------------------- block kernels
class BlockKernel:
    """A picklable task function: an op's NumPy kernel with its attributes, its result cast to the
    declared dtype(s) (NumPy's own promotion can differ from the graph's declared type for a block).

    >>> import numpy as np
    >>> k = BlockKernel(get_op("exp").kernel_for("numpy", 0), {}, ("float32",), "exp")
    >>> k(np.zeros(2, dtype=np.float32))
    array([1., 1.], dtype=float32)
    """

    __slots__ = ("attrs", "dtypes", "fn", "kind")

    def __init__(self, fn: Callable[..., Any], attrs: Mapping[str, Any], dtypes: Sequence[str], kind: str) -> None:
        self.fn = fn
        self.attrs = dict(attrs)
        self.dtypes = tuple(dtypes)
        self.kind = kind

    def __call__(self, *blocks: Any) -> Any:
        got = self.fn(*[np.asarray(b) for b in blocks], **self.attrs)
        if len(self.dtypes) == 1:
            return _as_dtype(got, self.dtypes[0])
        return tuple(_as_dtype(g, d) for g, d in zip(got, self.dtypes, strict=True))

    def __dask_tokenize__(self) -> Any:
        return ("opgraph.BlockKernel", self.kind, repr(sorted(self.attrs.items())), self.dtypes,
                getattr(self.fn, "__qualname__", repr(self.fn)))

    def __repr__(self) -> str:
        return f"BlockKernel({self.kind!r})"


def _as_dtype(a: Any, dtype: str) -> np.ndarray:
    a = np.asarray(a)
    return a if a.dtype == dtype else a.astype(dtype)


def block_kernel(info: OpInfo) -> BlockKernel:
    """The op's NumPy kernel as a :class:`BlockKernel` (attributes bound, results in the declared dtypes).

    >>> from opgraph.core.types import TensorType as T
    >>> block_kernel(OpInfo("exp", {}, (T("f8", (2,)),), (T("f8", (2,)),)))
    BlockKernel('exp')
    """
    fn = get_op(info.kind).kernel_for("numpy", info.version)
    return BlockKernel(fn, info.attrs, [t.dtype.name for t in info.out_types], info.kind)  # type: ignore[union-attr]


def _shape_of(t: ValueType) -> tuple[float, ...]:
    shape = t.shape  # type: ignore[union-attr]
    return tuple(math.nan if d is None else d for d in shape)


def whole_block(info: OpInfo) -> Callable[..., Any]:
    """The fallback rule: the op runs as one task on its whole inputs (each input's chunks concatenated).

    >>> import numpy as np
    >>> from opgraph.core.types import TensorType as T
    >>> fn = whole_block(OpInfo("cumsum", {"axis": 0}, (T("f8", (4,)),), (T("f8", (4,)),)))
    >>> fn(da.from_array(np.array([3.0, 1, 2, 0]), chunks=2)).compute()
    array([3., 4., 6., 6.])
    """
    kernel = block_kernel(info)
    outs = info.out_types
    nout = len(outs)

    def run(*xs: Any) -> Any:
        task = dask.delayed(kernel, pure=True, nout=nout if nout > 1 else None)(*xs)
        if nout == 1:
            return da.from_delayed(task, _shape_of(outs[0]), dtype=outs[0].dtype)  # type: ignore[union-attr]
        return tuple(da.from_delayed(t, _shape_of(o), dtype=o.dtype)  # type: ignore[union-attr]
                     for t, o in zip(task, outs, strict=True))
    return run


# ---------------------------------------------------------------- rules
def _elementwise(info: OpInfo) -> Callable[..., Any]:
    kernel = block_kernel(info)
    dtype = info.out_dtype

    def run(*xs: Any) -> Any:
        return da.core.elemwise(kernel, *xs, dtype=dtype)
    return run


def _axes(attrs: Mapping[str, Any]) -> Any:
    axis = attrs.get("axis")
    return tuple(axis) if isinstance(axis, (list, tuple)) else axis


@rule("sum", "prod", "max", "min", "mean", "any", "all")
def _reduction(info: OpInfo) -> Callable[..., Any]:
    fn = getattr(da, info.kind)
    axis, keepdims = _axes(info.attrs), bool(info.attrs.get("keepdims", False))
    if info.kind in ("sum", "prod", "mean"):
        return lambda x: fn(x, axis=axis, keepdims=keepdims, dtype=info.out_dtype)
    return lambda x: fn(x, axis=axis, keepdims=keepdims)


@rule("matmul")
def _matmul(info: OpInfo) -> Callable[..., Any]:
    return da.matmul


@rule("einsum")
def _einsum(info: OpInfo) -> Callable[..., Any]:
    subscripts = str(info.attrs["subscripts"])
    return lambda *xs: da.einsum(subscripts, *xs)


@rule("reshape")
def _reshape(info: OpInfo) -> Callable[..., Any]:
    shape = tuple(info.out_types[0].shape)  # type: ignore[union-attr]
    return lambda x: da.reshape(x, shape)


@rule("permute_dims")
def _permute(info: OpInfo) -> Callable[..., Any]:
    axes = info.attrs.get("axes")
    return lambda x: da.transpose(x, axes)


@rule("concat")
def _concat(info: OpInfo) -> Callable[..., Any]:
    axis = int(info.attrs.get("axis", 0))
    return lambda *xs: da.concatenate(xs, axis=axis)


# ---------------------------------------------------------------- feeds and chunks
class MemmapSource:
    """A ``.npy`` memmap as a chunk source: each read maps the file, copies the block out and unmaps it,
    so a worker's memory holds its blocks and never the pages of the whole file; pickles as the file name
    and layout (a worker opens the file itself).

    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(path, np.arange(6.0).reshape(3, 2))
    >>> src = MemmapSource.of(np.load(path, mmap_mode="r"))
    >>> src[1:, :1], src.shape, src.dtype
    (array([[2.],
           [4.]]), (3, 2), dtype('float64'))
    """

    __slots__ = ("dtype", "filename", "fortran", "ndim", "offset", "shape", "stamp")

    def __init__(self, filename: str, dtype: Any, shape: tuple[int, ...], offset: int, fortran: bool) -> None:
        self.filename = filename
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.ndim = len(self.shape)
        self.offset = offset
        self.fortran = fortran
        st = os.stat(filename)
        self.stamp = (st.st_size, st.st_mtime_ns)

    @staticmethod
    def of(mm: np.memmap) -> MemmapSource:
        """The source reading the file behind ``mm`` (which must map a whole file region, not a view)."""
        return MemmapSource(str(mm.filename), mm.dtype, mm.shape, int(mm.offset),
                            bool(mm.flags.f_contiguous and not mm.flags.c_contiguous))

    def __getitem__(self, index: Any) -> np.ndarray:
        mm = np.memmap(self.filename, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape,
                       order="F" if self.fortran else "C")
        try:
            return np.array(mm[index])
        finally:
            del mm

    def __reduce__(self) -> tuple[Any, ...]:
        return (MemmapSource, (self.filename, self.dtype.str, self.shape, self.offset, self.fortran))

    def __dask_tokenize__(self) -> Any:
        return ("opgraph.MemmapSource", self.filename, self.dtype.str, self.shape, self.offset, self.stamp)


def is_memmap_file(a: Any) -> bool:
    """True for a memmap that maps a file region as a whole (``np.load(path, mmap_mode="r")``), not a view of one.

    >>> is_memmap_file(np.zeros(2))
    False
    """
    # a view of a memmap is a memmap too, with its parent's filename and offset: only the original maps
    # exactly the region those describe (its base is the mmap object itself)
    return isinstance(a, np.memmap) and getattr(a, "filename", None) is not None and isinstance(a.base, mmap.mmap)


def is_zarr(a: Any) -> bool:
    """True for a zarr array (duck-typed on its module, so zarr is not imported here).

    >>> is_zarr(np.zeros(2))
    False
    """
    return type(a).__module__.split(".")[0] == "zarr" and hasattr(a, "chunks") and hasattr(a, "shape")


def machine_memory() -> int:
    """This machine's physical memory in bytes.

    >>> machine_memory() > 0
    True
    """
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


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
    rows read contiguously from a C-ordered file), else as dask's ``"auto"`` does.

    >>> choose_chunks((1000, 256), "float32", 256 * 4 * 100)
    ((100, 100, 100, 100, 100, 100, 100, 100, 100, 100), (256,))
    """
    from dask.array.core import normalize_chunks

    shape = tuple(int(s) for s in shape)
    if not shape:
        return ()
    row = np.dtype(dtype).itemsize * math.prod(shape[1:])
    if row <= limit:
        return normalize_chunks(("auto",) + (-1,) * (len(shape) - 1), shape, limit=limit, dtype=dtype)
    return normalize_chunks("auto", shape, limit=limit, dtype=dtype)


def adopt(data: Any, t: TensorType, label: str) -> Any | None:
    """A feed the backend takes as it is (a dask array, a zarr array, a file memmap), checked against the
    input's type without reading it; None for anything else (converted by the usual feed rule).

    A dask or zarr array of another dtype is cast lazily where NumPy casts it safely; a lossy cast is an
    error, as its values cannot be checked without computing them.

    >>> from opgraph.core.types import TensorType as T
    >>> adopt(da.zeros(3, dtype="int8"), T("int16", (3,)), "%x").dtype
    dtype('int16')
    >>> adopt(np.zeros(3), T("float64", (3,)), "%x") is None
    True
    """
    if isinstance(data, da.Array):
        arr = data
    elif is_zarr(data):
        arr = da.from_zarr(data)
    elif is_memmap_file(data):
        arr = data
    else:
        return None
    if not t.accepts(_Probe(arr.shape, t.dtype)):
        raise FeedError(f"input {label} expects {t}, got shape {tuple(arr.shape)}")
    if arr.dtype != t.dtype:
        if not np.can_cast(arr.dtype, t.dtype, "safe"):
            raise FeedError(f"input {label} expects {t}, got a {type(data).__name__} of {arr.dtype}: cast it "
                            f"first (its values cannot be checked for the lossy cast without computing them)")
        if not isinstance(arr, da.Array):  # a memmap: read in blocks by the executable, cast there
            return None
        arr = arr.astype(t.dtype)
    return arr


class _Probe:
    """Shape and dtype alone, for :meth:`TensorType.accepts`."""

    def __init__(self, shape: tuple[Any, ...], dtype: Any) -> None:
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)


# ---------------------------------------------------------------- compiling and running
class DaskExecutable(Executable):
    """A graph as a function of dask arrays: a call wraps NumPy and memmap arguments into chunked arrays
    and returns the graph's outputs as lazy dask arrays (:meth:`DaskBackend.finish` computes them)."""

    def __init__(self, graph: Graph, chunks: Any, limit: int) -> None:
        self.graph = graph
        self.chunks = chunks
        self.limit = limit
        self.names = [graph.value_label(int(v)).lstrip("%") for v in graph.inputs.tolist()]
        self.fn, consts, self.source = straight_line(graph, _rule_for, fix=_fix, name="dask_program")
        self.consts = [self.as_dask(c, None) for c in consts]

    def as_dask(self, a: Any, name: str | None) -> da.Array:
        """An argument as a chunked dask array (dask arrays as they are)."""
        if isinstance(a, da.Array):
            return a
        chunks = self.chunks.get(name, "budget") if isinstance(self.chunks, Mapping) else self.chunks
        shape = np.shape(a)
        dtype = a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype
        if chunks in (None, "budget"):
            chunks = choose_chunks(shape, dtype, self.limit)
        if is_memmap_file(a):
            return da.from_array(MemmapSource.of(a), chunks=chunks, lock=False, fancy=False)
        return da.from_array(np.asarray(a), chunks=chunks)

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        xs = [self.as_dask(a, n) for a, n in zip(args, self.names, strict=True)]
        return list(self.fn(self.consts, *xs))


def _rule_for(info: OpInfo) -> Callable[..., Any]:
    factory = RULES.get(info.kind)
    if factory is not None:
        return factory(info)
    if get_op(info.kind).elementwise:
        return _elementwise(info)
    return whole_block(info)


def _fix(x: Any, t: ValueType) -> Any:
    dt = getattr(t, "dtype", None)
    return x if dt is None or x.dtype == dt else x.astype(dt)


class DaskBackend(Backend):
    """``dask.array`` over chunks (see the module doc): every op with a NumPy kernel runs, chunked where a
    rule says how, else as one task on whole blocks (:meth:`caveat`)."""

    def kinds(self) -> frozenset[str]:
        from opgraph.backends.numpy import NumpyBackend

        return frozenset(k for k in NumpyBackend().kinds())

    def why_not(self, info: OpInfo) -> str | None:
        from opgraph.backends.numpy import NumpyBackend

        if not NumpyBackend.has_kernel(info.kind):
            return f"op {info.kind!r} has no numpy kernel (the dask backend maps NumPy kernels over blocks)"
        for t in (*info.in_types, *info.out_types):
            if not isinstance(t, TensorType):
                return f"dask runs tensors only, not {t}"
        return None

    def supports(self, kind: str, in_types: Sequence[Any] | None = None, out_types: Sequence[Any] | None = None,
                 attrs: Mapping[str, Any] | None = None) -> bool:
        if in_types is None:
            from opgraph.backends.numpy import NumpyBackend

            return NumpyBackend.has_kernel(kind)
        return super().supports(kind, in_types, out_types, attrs)

    def caveat(self, info: OpInfo) -> str | None:
        """How the op runs when that is worth saying: None for a chunked rule, else why it is one whole task.

        >>> from opgraph.core.types import TensorType as T
        >>> BACKEND.caveat(OpInfo("exp", {}, (T("f8", (2,)),), (T("f8", (2,)),))) is None
        True
        """
        if info.kind in RULES or get_op(info.kind).elementwise:
            return None
        why = WHOLE.get(info.kind, "no chunked rule for this kind")
        return f"runs as one task on whole inputs: {why}"

    def adopt_feed(self, data: Any, t: ValueType, label: str) -> Any | None:
        if not isinstance(t, TensorType):
            return None
        return adopt(data, t, label)

    def compile_graph(self, graph: Graph, *, device: str | None = None, donate: Sequence[int] = (),
                      chunks: Any = None, chunk_bytes: int | None = None, client: Any = None,
                      num_workers: int | None = None, result: str = "numpy", **options: Any) -> Executable:
        """The graph as a :class:`DaskExecutable`.

        ``chunks``: for every NumPy/memmap input (a dict: by input name), as dask's ``from_array`` takes
        them; otherwise blocks of at most ``chunk_bytes`` (default: :func:`chunk_bytes` of the smallest
        worker's memory). ``client``, ``num_workers`` and ``result`` are read by :meth:`finish`.
        """
        self.check_device(device)
        if options:
            raise TypeError(f"the dask backend takes no option(s) {sorted(options)}")
        if result not in ("numpy", "dask", "persist"):
            raise BackendError(f"result={result!r}: choose 'numpy' (computed), 'dask' (lazy) or 'persist'")
        if chunk_bytes is None:
            nbytes, threads = worker_budget(client, num_workers)
            chunk_bytes = globals()["chunk_bytes"](nbytes, threads)
        return DaskExecutable(graph, chunks, int(chunk_bytes))

    def finish(self, results: Sequence[Any], states: Sequence[Any], options: Mapping[str, Any]) -> tuple[
            list[Any], list[Any]]:
        """Results as NumPy arrays computed in one pass with the state (or lazy/persisted dask arrays, by
        ``result=``), and the state persisted for the next call."""
        client = options.get("client")
        mode = options.get("result", "numpy")
        kw = _scheduler(client, options.get("num_workers"))
        lazy = [r for r in results if isinstance(r, da.Array)]
        if mode == "dask" and not states:
            return list(results), []
        if mode == "numpy" and not states:
            done = iter(dask.compute(*lazy, **kw))
            return [next(done) if isinstance(r, da.Array) else r for r in results], []
        kept = _persist([*lazy, *states], client, kw)
        it = iter(kept[:len(lazy)])
        outs = [next(it) if isinstance(r, da.Array) else r for r in results]
        if mode == "numpy":
            done = iter(dask.compute(*[o for o in outs if isinstance(o, da.Array)], **kw))
            outs = [next(done) if isinstance(o, da.Array) else o for o in outs]
        elif mode == "dask":
            outs = list(results)
        return outs, list(kept[len(lazy):])

    def to_numpy(self, array: Any) -> np.ndarray:
        return np.asarray(array.compute() if isinstance(array, da.Array) else array)


def _scheduler(client: Any, num_workers: int | None) -> dict[str, Any]:
    if client is not None:
        return {"scheduler": client}
    return {"scheduler": "threads", **({"num_workers": num_workers} if num_workers else {})}


def _persist(arrays: Sequence[Any], client: Any, kw: Mapping[str, Any]) -> list[Any]:
    if not arrays:
        return []
    if client is not None:
        return list(client.persist(list(arrays)))
    return list(dask.persist(*arrays, **kw))


BACKEND = DaskBackend(
    "dask", module="dask", extra="dask",
    doc="dask.array over chunks: out of core and on distributed clusters (elementwise, reductions, matmul, "
        "contractions and shape ops chunked; other ops as one task on whole blocks)")
