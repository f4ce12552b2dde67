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

import itertools
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
from opgraph.memory.limit import physical_memory

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
    >>> k = BlockKernel(get_op("exp").kernel_for(0), {}, ("float32",), "exp")
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
    from opgraph.backends.numpy import BACKEND as NUMPY

    fn = NUMPY.kernel_for(info.kind, info.version)
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
# A rule factory may decline an instance it cannot chunk by raising Whole(reason): the op then runs as one
# task on its whole inputs and explain() gives the reason.
class Whole(Exception):
    """Raised by a rule factory for an op instance it does not chunk (the reason is the message)."""


def _static(t: ValueType) -> tuple[int, ...]:
    shape = getattr(t, "shape", None)
    if shape is None or any(d is None for d in shape):
        raise Whole("its shape is only known at run time")
    return tuple(int(d) for d in shape)


def _elementwise(info: OpInfo) -> Callable[..., Any]:
    kernel = block_kernel(info)
    dtype = info.out_dtype

    def run(*xs: Any) -> Any:
        return da.core.elemwise(kernel, *xs, dtype=dtype)
    return run


def _axes(attrs: Mapping[str, Any]) -> Any:
    axis = attrs.get("axis")
    return tuple(axis) if isinstance(axis, (list, tuple)) else axis


@rule("sum", "prod", "max", "min", "mean", "any", "all", "var", "std")
def _reduction(info: OpInfo) -> Callable[..., Any]:
    fn = getattr(da, info.kind)
    kw: dict[str, Any] = {"axis": _axes(info.attrs), "keepdims": bool(info.attrs.get("keepdims", False))}
    if info.kind in ("sum", "prod", "mean") or (info.kind in ("var", "std") and info.in_dtypes[0].kind != "c"):
        kw["dtype"] = info.out_dtype
    if info.kind in ("var", "std"):
        kw["ddof"] = info.attrs.get("correction", 0.0)
    dt = info.out_dtype
    return lambda x: fn(x, **kw).astype(dt)


@rule("argmax", "argmin")
def _arg_reduction(info: OpInfo) -> Callable[..., Any]:
    fn, axis, keep = getattr(da, info.kind), info.attrs.get("axis"), bool(info.attrs.get("keepdims", False))
    if axis is None and keep:
        raise Whole("dask's argmax/argmin keep no dims without an axis")
    return lambda x: fn(x, axis=axis, keepdims=keep).astype(np.int64)


@rule("cumsum", "cumprod")
def _scan(info: OpInfo) -> Callable[..., Any]:
    fn, axis, dt = getattr(da, info.kind), info.attrs.get("axis"), info.out_dtype
    return lambda x: fn(x.ravel() if axis is None else x, axis=0 if axis is None else axis, dtype=dt)


@rule("logsumexp")
def _logsumexp(info: OpInfo) -> Callable[..., Any]:
    if info.in_dtypes[0].kind == "c":
        raise Whole("complex logsumexp has no chunked rule")
    axis, keep, dt = _axes(info.attrs), bool(info.attrs.get("keepdims", False)), info.out_dtype

    def run(x: Any) -> Any:  # scipy's formulation: the max of each slice taken out, then added back
        x = x.astype(dt)
        m = da.max(x, axis=axis, keepdims=True)
        m = da.where(da.isfinite(m), m, 0)
        out = da.log(da.sum(da.exp(x - m), axis=axis, keepdims=True)) + m
        return (out if keep else da.squeeze(out, axis=axis)).astype(dt)
    return run


def _acc(dt: np.dtype) -> Any:
    """The dtype partial products over chunks are summed in: float16 ones in float32, as NumPy's kernels
    accumulate them (dask sums the partials of a chunked contraction axis in their own dtype)."""
    return np.float32 if dt == np.float16 else dt


@rule("matmul")
def _matmul(info: OpInfo) -> Callable[..., Any]:
    dt = info.out_dtype
    acc = _acc(dt)
    return lambda a, b: da.matmul(a.astype(acc), b.astype(acc)).astype(dt)


@rule("matmul_t")
def _matmul_t(info: OpInfo) -> Callable[..., Any]:
    ta, tb, dt = bool(info.attrs["transpose_a"]), bool(info.attrs["transpose_b"]), info.out_dtype
    acc = _acc(dt)

    def run(a: Any, b: Any) -> Any:
        a, b = a.astype(acc), b.astype(acc)
        return da.matmul(da.swapaxes(a, -1, -2) if ta else a, da.swapaxes(b, -1, -2) if tb else b).astype(dt)
    return run


@rule("einsum")
def _einsum(info: OpInfo) -> Callable[..., Any]:
    subscripts, dt = str(info.attrs["subscripts"]), info.out_dtype
    acc = _acc(dt)
    return lambda *xs: da.einsum(subscripts, *[x.astype(acc) for x in xs]).astype(dt)


@rule("tensordot")
def _tensordot(info: OpInfo) -> Callable[..., Any]:
    axes, dt = info.attrs["axes"], info.out_dtype
    acc = _acc(dt)
    return lambda a, b: da.tensordot(a.astype(acc), b.astype(acc), axes=axes).astype(dt)


@rule("vecdot")
def _vecdot(info: OpInfo) -> Callable[..., Any]:
    axis, dt = int(info.attrs["axis"]), info.out_dtype
    return lambda a, b: da.sum(da.conj(a) * b, axis=axis, dtype=dt).astype(dt)


@rule("outer")
def _outer(info: OpInfo) -> Callable[..., Any]:
    dt = info.out_dtype
    return lambda a, b: da.outer(a, b).astype(dt)


@rule("reshape")
def _reshape(info: OpInfo) -> Callable[..., Any]:
    shape = _static(info.out_types[0])

    def run(x: Any) -> Any:
        # dask reshapes blocks of whole trailing rows; where the blocks do not line up, fewer and larger ones
        x = x.rechunk({a: -1 for a in range(1, x.ndim)})
        try:
            return da.reshape(x, shape, merge_chunks=True)
        except NotImplementedError:
            return da.reshape(x.rechunk(-1), shape)
    return run


@rule("permute_dims")
def _permute(info: OpInfo) -> Callable[..., Any]:
    axes = info.attrs.get("axes")
    return lambda x: da.transpose(x, axes)


@rule("moveaxis")
def _moveaxis(info: OpInfo) -> Callable[..., Any]:
    src, dst = info.attrs["source"], info.attrs["destination"]
    return lambda x: da.moveaxis(x, src, dst)


@rule("broadcast_to")
def _broadcast_to(info: OpInfo) -> Callable[..., Any]:
    shape = _static(info.out_types[0])
    return lambda x: da.broadcast_to(x, shape)


@rule("expand_dims")
def _expand_dims(info: OpInfo) -> Callable[..., Any]:
    axis = _axes(info.attrs)
    return lambda x: da.expand_dims(x, axis)


@rule("squeeze")
def _squeeze(info: OpInfo) -> Callable[..., Any]:
    axis = _axes(info.attrs)
    return lambda x: da.squeeze(x, axis)


@rule("concat")
def _concat(info: OpInfo) -> Callable[..., Any]:
    axis, dt = info.attrs.get("axis", 0), info.out_dtype
    if axis is None:
        return lambda *xs: da.concatenate([x.ravel().astype(dt) for x in xs], axis=0)
    return lambda *xs: da.concatenate([x.astype(dt) for x in xs], axis=int(axis))


@rule("stack")
def _stack(info: OpInfo) -> Callable[..., Any]:
    axis, dt = int(info.attrs["axis"]), info.out_dtype
    return lambda *xs: da.stack([x.astype(dt) for x in xs], axis=axis)


@rule("split")
def _split(info: OpInfo) -> Callable[..., Any]:
    shape = _static(info.in_types[0])
    axis = int(info.attrs["axis"]) % len(shape)
    sections, n = info.attrs["sections"], shape[axis]
    points = [n * i // sections for i in range(sections + 1)] if isinstance(sections, int) else [0, *sections, n]
    lead = (slice(None),) * axis
    if len(points) == 2:
        return lambda x: x
    return lambda x: tuple(x[(*lead, slice(a, b))] for a, b in itertools.pairwise(points))


@rule("getitem")
def _getitem(info: OpInfo) -> Callable[..., Any]:
    from opgraph.ops.shape import python_key

    key = python_key(info.attrs["index"], array_result=False)
    return lambda x: x[key]


@rule("take")
def _take(info: OpInfo) -> Callable[..., Any]:
    axis = info.attrs.get("axis")
    if len(_static(info.in_types[1])) != 1:
        raise Whole("dask takes with 1-D indices only")
    return lambda x, i: da.take(x.ravel() if axis is None else x, i, axis=0 if axis is None else axis)


@rule("flip")
def _flip(info: OpInfo) -> Callable[..., Any]:
    axis = _axes(info.attrs)
    return lambda x: da.flip(x, axis)


@rule("roll")
def _roll(info: OpInfo) -> Callable[..., Any]:
    shift, axis = info.attrs["shift"], _axes(info.attrs)
    if axis is None:
        if not isinstance(shift, (int, np.integer)):
            raise Whole("dask rolls by one shift without an axis")
        return lambda x: da.roll(x, int(shift), None)
    # as NumPy: shifts and axes broadcast against each other, shifts along the same axis add up
    total: dict[int, int] = {}
    for sh, ax in zip(*np.broadcast_arrays(np.atleast_1d(shift), np.atleast_1d(axis)), strict=True):
        total[int(ax)] = total.get(int(ax), 0) + int(sh)
    shifts, axes = tuple(total.values()), tuple(total)
    return lambda x: da.roll(x, shifts, axes)


@rule("tile")
def _tile(info: OpInfo) -> Callable[..., Any]:
    reps = tuple(info.attrs["reps"])
    return lambda x: da.tile(x, reps)


@rule("repeat")
def _repeat(info: OpInfo) -> Callable[..., Any]:
    repeats, axis = info.attrs["repeats"], info.attrs.get("axis")
    if not isinstance(repeats, int):
        raise Whole("dask repeats every element the same number of times")
    return lambda x: da.repeat(x.ravel() if axis is None else x, repeats, axis=0 if axis is None else axis)


@rule("copy")
def _copy(info: OpInfo) -> Callable[..., Any]:
    return lambda x: x  # dask arrays are never written in place


@rule("pad")
def _pad(info: OpInfo) -> Callable[..., Any]:
    shape, mode, dt = _static(info.in_types[0]), info.attrs["mode"], info.out_dtype
    pw = tuple(map(tuple, np.broadcast_to(np.asarray(info.attrs["pad_width"], dtype=np.int64), (len(shape), 2))))
    if mode in ("reflect", "symmetric", "wrap") and any(max(p) >= n for p, n in zip(pw, shape, strict=True)):
        raise Whole(f"dask pads in {mode} mode only by less than the axis's length")
    if mode == "constant":
        cv = np.asarray(info.attrs["constant_value"]).astype(dt)
        return lambda x: da.pad(x, pw, mode="constant", constant_values=cv)
    return lambda x: da.pad(x, pw, mode=mode)


def local_rule(axes_of: Callable[[OpInfo, int], Sequence[int]]) -> Rule:
    """A rule for an op computed independently along some axes of its first input (a softmax row, an image of
    a batch): those axes are joined into one chunk, the first input stays chunked along the others, and the
    op's NumPy kernel runs on each block (the other inputs, weights and the like, whole beside it).

    >>> import numpy as np
    >>> from opgraph.core.types import TensorType as T
    >>> t = T("f8", (4, 3))
    >>> fn = local_rule(lambda info, rank: [rank - 1])(OpInfo("softmax", {"axis": -1}, (t,), (t,)))
    >>> x = np.arange(12.0).reshape(4, 3)
    >>> y = fn(da.from_array(x, chunks=(2, 1)))
    >>> y.chunks, bool(np.allclose(y.compute().sum(axis=1), 1))
    (((2, 2), (3,)), True)
    """
    def factory(info: OpInfo) -> Callable[..., Any]:
        if len(info.out_types) != 1:
            raise Whole("an op with several results has no chunked rule")
        shape, out = _static(info.in_types[0]), _static(info.out_types[0])
        local = sorted({a % len(shape) for a in axes_of(info, len(shape))}) if shape else []
        if len(out) != len(shape) or any(out[a] != shape[a] for a in range(len(shape)) if a not in local):
            raise Whole("its result is not shaped like its input outside the axes it works along")
        kernel, dt = block_kernel(info), info.out_dtype
        ind = "".join(chr(ord("a") + i) for i in range(len(shape)))

        def run(x: Any, *rest: Any) -> Any:
            args: list[Any] = [x.rechunk({a: -1 for a in local}), ind]
            k = len(shape)
            for y in rest:  # whole, under indices of their own: blockwise concatenates their blocks
                args += [y.rechunk(-1), "".join(chr(ord("a") + i) for i in range(k, k + y.ndim))]
                k += y.ndim
            return da.blockwise(kernel, ind, *args, concatenate=True, dtype=dt,
                                adjust_chunks={ind[a]: out[a] for a in local}, meta=np.empty((0,) * len(out), dt))
        return run
    return factory


def _along_axis(info: OpInfo, rank: int) -> list[int]:
    return [int(info.attrs.get("axis", -1))]


def _from_axis(info: OpInfo, rank: int) -> list[int]:
    return list(range(int(info.attrs.get("axis", -1)) % rank, rank))


def _all_but_batch(info: OpInfo, rank: int) -> list[int]:
    return list(range(1, rank))


def _last_two(info: OpInfo, rank: int) -> list[int]:
    return [rank - 2, rank - 1]


for _kinds, _axes_of in ((("softmax", "log_softmax", "fft", "rfft", "irfft"), _along_axis),
                         (("layer_norm",), _from_axis),
                         (("conv2d", "conv", "conv_transpose", "max_pool2d", "avg_pool2d", "max_pool", "avg_pool",
                           "lp_pool", "lrn"), _all_but_batch),
                         (("trilu", "inv", "cholesky", "pinv"), _last_two)):
    rule(*_kinds)(local_rule(_axes_of))


WHOLE.update({
    "slice": "its bounds are known only at run time",
    "slice_update": "its bounds are known only at run time",
    "det": "a batch of determinants has no chunked rule",
    "solve": "it needs both operands whole",
})


def chunked_rule(kind: str) -> Rule | None:
    """The rule factory chunking ``kind`` (its entry in :data:`RULES`, or the block map of an elementwise op);
    None for a kind that runs as one task on whole inputs.

    >>> chunked_rule("det") is None, chunked_rule("exp") is not None
    (True, True)
    """
    return RULES.get(kind) or (_elementwise if get_op(kind).elementwise else None)


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


# ---------------------------------------------------------------- feeds and chunks
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


_budget_chunk_bytes = chunk_bytes  # compile_graph's chunk_bytes= option shadows the name


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

    def __init__(self, graph: Graph, chunks: Any, limit: int) -> None:
        self.graph = graph
        self.chunks = chunks
        self.limit = limit
        ins = graph.inputs.tolist()
        self.names = input_names(graph)
        self.dtypes = [getattr(graph.type_of(int(v)), "dtype", None) for v in ins]
        self.fn, consts, self.source = straight_line(graph, _rule_for, fix=_fix, name="dask_program")
        self.consts = [self.as_dask(c, None) for c in consts]

    def as_dask(self, a: Any, name: str | None, dtype: Any = None) -> da.Array:
        """An argument as a chunked dask array of ``dtype`` (dask arrays as they are): ``chunks`` (by input
        name for a dict), else blocks of at most ``limit`` bytes (:func:`choose_chunks`); a file memmap is
        read block by block from its file (:class:`MemmapSource`)."""
        if isinstance(a, da.Array):
            arr = a
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
            chunk_bytes = _budget_chunk_bytes(nbytes, threads, live_blocks(graph))
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
