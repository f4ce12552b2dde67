"""The dask backend: a graph as ``dask.array`` operations over chunks, on threads or a ``distributed`` cluster.

Each op kind has a rule, registered on :data:`BACKEND` in this package's module named after the op's family
(``reduction``, ``shape``, ...), making the ``dask.array`` call for one op from its static facts, so the graph
becomes the same chunked task graph a hand-written ``dask.array`` program would build:
elementwise ops map the op's own NumPy kernel over aligned blocks (NumPy's values, block by block),
reductions, matmul and contractions, reshapes, transposes, concatenation, slicing and indexing use
``dask.array``'s chunked algorithms. An op no rule chunks still runs, inside the task graph, as one task
on its whole inputs (:data:`WHOLE` says why for each such kind; :meth:`Program.explain
<opgraph.runtime.compiled.Program.explain>` lists them), so nothing goes back to the client.

Feeds may be NumPy arrays, ``.npy`` memmaps (read chunk by chunk from the file: a worker never maps the
whole file), zarr arrays (their own chunks) or ``dask.array`` arrays (taken as they are, but for a memmap in their
graph: read chunk by chunk from its file, or refused on a cluster where one task would ship it whole;
:func:`~opgraph.backends.dask.chunking.from_files`). Chunk sizes come from a memory budget per worker
(:func:`chunk_bytes`) unless ``chunks=`` or ``chunk_bytes=`` is given. Results come back as NumPy arrays,
computed in one pass (``result="numpy"``, the default), or as ``dask.array`` arrays, lazy (``result="dask"``) or
persisted (``result="persist"``). Update-edge state is persisted between calls, so the next call starts from it
without recomputing its history.

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

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np

from opgraph.backends.base import Backend, BackendError, Executable, OpInfo, straight_line
from opgraph.backends.dask.blocks import Rule, Whole, elementwise_rule, whole_block
from opgraph.backends.dask.chunking import (
    MemmapSource,
    adopt,
    choose_chunks,
    from_files,
    is_memmap_file,
    live_blocks,
    worker_budget,
)
from opgraph.backends.dask.chunking import chunk_bytes as budget_chunk_bytes  # compile_graph's chunk_bytes= shadows it
from opgraph.core.graph import Graph
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType, ValueType

WHOLE: dict[str, str] = {
    "slice": "its bounds are known only at run time",
    "slice_update": "its bounds are known only at run time",
    "det": "a batch of determinants has no chunked rule",
    "solve": "it needs both operands whole",
}
"""Op kind -> why it runs as one task on its whole inputs (kinds with a NumPy kernel and no chunked rule,
when not listed here, give a generic reason)."""


def chunked_rule(kind: str) -> Rule | None:
    """The rule factory chunking ``kind`` (its rule on :data:`BACKEND`, or the block map of an elementwise op);
    None for a kind that runs as one task on whole inputs.

    >>> chunked_rule("det") is None, chunked_rule("exp") is not None
    (True, True)
    """
    return BACKEND.rules.get(kind) or (elementwise_rule if get_op(kind).elementwise else None)


def plan(info: OpInfo) -> tuple[Callable[..., Any], str | None]:
    """The callable computing one op on dask arrays, and None when it is chunked, or why it runs as one task
    on its whole inputs (:func:`whole_block`).

    >>> from opgraph.core.types import TensorType as T
    >>> plan(OpInfo("sum", {"axis": 0}, (T("f8", (0, 3)),), (T("f8", (3,)),)))[1]
    'an input or result has no elements'
    """
    ts = (*info.in_types, *info.out_types)
    if any(0 in (getattr(t, "shape", None) or ()) for t in ts):
        return whole_block(info), "an input or result has no elements"
    factory = chunked_rule(info.kind)
    if factory is not None and not get_op(info.kind).elementwise and getattr(info.in_types[0], "shape", None) == ():
        return whole_block(info), "a 0-d input is one block already"
    if factory is None:
        return whole_block(info), WHOLE.get(info.kind, "no chunked rule for this kind")
    try:
        return factory(info), None
    except Whole as why:
        return whole_block(info), str(why)


# ---------------------------------------------------------------- compiling and running
def input_names(graph: Graph) -> list[str]:
    """The names ``chunks=`` keys refer to: each input's name, or its value id for an unnamed one.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); y = b.input(("f8", (2,)))
    >>> b.output(b.op("add", x, y)); input_names(b.freeze())
    ['x', '1']
    """
    return [graph.value_label(int(v)).lstrip("%") for v in graph.inputs.tolist()]


class DaskExecutable(Executable):
    """A graph as a function of dask arrays: a call wraps NumPy and memmap arguments into chunked arrays
    and returns the graph's outputs as lazy dask arrays (:meth:`DaskBackend.finish` computes them).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (6,)), name="x"); b.output(b.op("exp", x))
    >>> exe = DaskExecutable(b.freeze(), {"x": 2}, 1 << 20)
    >>> exe.as_dask(np.zeros(6), "x").chunks
    ((2, 2, 2),)
    """

    def __init__(self, graph: Graph, chunks: Any, limit: int, client: Any = None) -> None:
        self.graph = graph
        self.chunks = chunks
        self.limit = limit
        self.shipped = client is not None  # a distributed client pickles the task graph to its workers
        ins = graph.inputs.tolist()
        self.names = input_names(graph)
        self.dtypes = [getattr(graph.type_of(int(v)), "dtype", None) for v in ins]
        self.fn, consts, self.source = straight_line(graph, _rule_for, fix=_fix, name="dask_program")
        self.consts = [self.as_dask(c, None) for c in consts]

    def as_dask(self, a: Any, name: str | None, dtype: Any = None) -> da.Array:
        """An argument as a chunked dask array of ``dtype``: ``chunks`` (by input name for a dict), else
        blocks of at most ``limit`` bytes (:func:`choose_chunks`); a file memmap is read block by block from
        its file (:class:`MemmapSource`). A dask array keeps its chunks, a ``da.from_array`` of a file memmap
        in it rebuilt to read from the file, or refused on a cluster where it cannot be (:func:`from_files`)."""
        if isinstance(a, da.Array):
            arr = from_files(a, f"%{name}", self.limit if self.shipped else None)
        else:
            chunks = self.chunks.get(name, "budget") if isinstance(self.chunks, Mapping) else self.chunks
            shape = np.shape(a)
            src = MemmapSource.of(a) if is_memmap_file(a) else np.asarray(a)
            if chunks is None or (isinstance(chunks, str) and chunks == "budget"):
                chunks = choose_chunks(shape, src.dtype, self.limit)
            try:
                chunks = da.core.normalize_chunks(chunks, shape, dtype=src.dtype)
            except (ValueError, TypeError) as exc:
                raise BackendError(f"chunks={chunks!r} do not fit input {name} of shape {shape}: {exc}") from None
            if isinstance(src, MemmapSource):
                arr = da.from_array(src, chunks=chunks, lock=False, fancy=False)
            else:
                arr = da.from_array(src, chunks=chunks)
        return arr if dtype is None or arr.dtype == dtype else arr.astype(dtype)

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        xs = [self.as_dask(a, n, d) for a, n, d in zip(args, self.names, self.dtypes, strict=True)]
        return list(self.fn(self.consts, *xs))


def _rule_for(info: OpInfo) -> Callable[..., Any]:
    return plan(info)[0]


def _fix(x: Any, t: ValueType) -> Any:
    dt = getattr(t, "dtype", None)
    return x if dt is None or x.dtype == dt else x.astype(dt)


class DaskBackend(Backend):
    """``dask.array`` over chunks (see the module doc): every op with a NumPy kernel runs, chunked where a
    rule says how, else as one task on whole blocks (:meth:`caveat`)."""

    def kinds(self) -> frozenset[str]:
        from opgraph.backends.numpy import BACKEND as NUMPY

        return NUMPY.kinds()

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
        why = plan(info)[1]
        return None if why is None else f"runs as one task on whole inputs: {why}"

    def doc_cell(self, kind: str) -> str | None:
        """``chunked`` for a kind with a chunked rule, ``whole block`` for one run as one task on whole inputs.

        >>> BACKEND.doc_cell("matmul"), BACKEND.doc_cell("det")
        ('chunked', 'whole block')
        """
        from opgraph.backends.numpy import NumpyBackend

        if not NumpyBackend.has_kernel(kind):
            return None
        return "whole block" if chunked_rule(kind) is None else "chunked"

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
        if isinstance(chunks, Mapping):
            names = input_names(graph)
            unknown = sorted(set(map(str, chunks)) - set(names))
            if unknown:
                raise BackendError(f"chunks= names {', '.join(unknown)}, which this graph's dask part does not "
                                   f"take as inputs ({', '.join(names) or 'none'})")
        if chunk_bytes is None:
            nbytes, threads = worker_budget(client, num_workers)
            chunk_bytes = budget_chunk_bytes(nbytes, threads, live_blocks(graph))
        return DaskExecutable(graph, chunks, int(chunk_bytes), client)

    def finish(self, results: Sequence[Any], states: Sequence[Any], options: Mapping[str, Any],
               kind: str = "numpy", device: str | None = None) -> tuple[list[Any], list[Any]]:
        """Results computed in one pass with the state, as arrays of ``kind`` (or lazy/persisted dask arrays, by
        the compile option ``result=``), and the state persisted for the next call."""
        outs, kept = self._finish(results, states, options)
        if options.get("result", "numpy") == "numpy" and kind != "numpy":
            outs = [self.export(o, kind, device) for o in outs]
        return outs, kept

    def _finish(self, results: Sequence[Any], states: Sequence[Any], options: Mapping[str, Any]) -> tuple[
            list[Any], list[Any]]:
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

# The family modules register their rules on BACKEND as they are imported, so they come after it.
from opgraph.backends.dask import (  # noqa: E402,F401
    contraction,
    fused,
    indexing,
    linalg,
    nn,
    reduction,
    shape,
    signal,
)
