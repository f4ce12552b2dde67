"""The .cg binary format: Hespanha's four files (seed 000), as TensCalc writes them.

A graph is stored as four files next to each other: ``base.cg`` (functions),
``base.cgc`` (constants), ``base.cgio`` (set/get/copy gateways) and
``base.cgs`` (names). Each starts with ONE magic byte, 16, 32 or 64, giving
the width of every little-endian signed integer that follows.

    >>> import os, tempfile, numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (None, 3)), name="x")
    >>> y = b.op("sum", b.multiply(x, 2.0), axis=1, name="total")
    >>> b.output(y)
    >>> g = b.freeze()
    >>> base = os.path.join(tempfile.mkdtemp(), "model")
    >>> save_cg(g, base + ".cg")
    >>> sorted(os.listdir(os.path.dirname(base)))
    ['model.cg', 'model.cgc', 'model.cgio', 'model.cgs']
    >>> h = load_cg(base)
    >>> h.equals(g, check_names=True)
    True
    >>> h.run({"x": np.ones((2, 3), np.float32)})
    [array([6., 6.], dtype=float32)]

**Record types.** ``.cg`` records carry op kind ids from the registry
(TensCalc's 10001-30002 keep their meaning; 0 is a constant function:
``[0, constant record, output variable]``). ``.cgio`` types are 1 set, 2 get,
3 copy; ``.cgs`` types 1 constant, 2 function, 3 variable, 4 io gateway.
``.cgc`` record types:

=========  ==============================================================
type       data
=========  ==============================================================
10001      TensCalc ``double_full_tensor``: int64 ndim, int64 sizes,
           float64 values in column-major order (read as float64)
20001      TensCalc ``int64l_full_vector``: int64 values (read as 1-D int64)
20002      TensCalc ``int64l_full_tensor``: int64 ndim, int64 sizes, int64
           values in column-major order
30001      TensCalc ``string``: raw characters (read as 1-D uint8)
101-114    opgraph constant of dtype code ``type - 100``
           (:data:`opgraph.core.dtypes.DTYPE_CODES`: 101 bool ... 112
           float64, 114 complex128): int64 ndim, int64 sizes, raw
           little-endian data in C order
9001       opgraph metadata (always the last record, never referenced by a
           type-0 function): int64 ``J``, ``J`` bytes of UTF-8 JSON, zero
           padding to a multiple of 8, then binary int arrays the JSON
           points at. The JSON holds the format version, counts, the index
           base of set/get gateways, the type table, the attribute table
           (exact: floats as IEEE bits, tuples as arrays), the arrays
           ``op_attr``, ``op_version``, ``value_type`` (``{"fill": v}`` or
           ``{"dtype", "offset", "count"}``), inputs that have no set
           gateway, names/descriptions that are explicitly empty, and
           ``op_names`` (id -> name of each user op kind used, ids 40000
           and up: loading names an unregistered one, and refuses a
           different op registered under that id).
9002       opgraph subgraph (a body of ``call``/``cond``/``while_loop``/
           ``scan``), each distinct body once, bodies of bodies included:
           int64 ``J``, ``J`` bytes of ASCII JSON (``format``
           ``"opgraph.cg.subgraph"``, ``version`` 1, the body's ``name``,
           ``files``: the four lengths), then the body's own four files.
           After the constants, before the metadata record, inner bodies
           first. Attributes (in the metadata of the graph or of a body)
           refer to a body as ``{"subgraph": r}``, ``r`` its record index
           in the top-level .cgc file. Graphs without bodies have none
           (their files are unchanged).
=========  ==============================================================

A record type the reader does not know (from a newer opgraph) is a
:class:`~opgraph.errors.FormatError` naming the type, record and byte offset.

TensCalc's ``10002`` (``double_sparse_tensor``) is not supported: loading a
file with one raises :class:`~opgraph.errors.FormatError`.

**Files without metadata** (TensCalc's): every variable is
``TensorType("float64", None)`` except outputs of type-0 functions, which get
the exact type of their constant; TensCalc kinds get ``{"nout": n}``, other
registered kinds their default attributes. Set gateways become
``graph.inputs`` (.cgio order), gets ``graph.outputs``, copies
``graph.updates``. A variable that no function produces and no gateway sets
(TensCalc's aliases) becomes an extra input after the set ones, in index
order, listed in ``file_meta["cg_unset_inputs"]`` so that saving writes no
set gateway for it. A copy whose destinations are the scalars that a
``ftensor2scalars`` makes from a set variable (``saveScalarized``'s copies)
sets that variable: it becomes a ``scalars2ftensor`` of the variable's
entries and an update edge onto it (:func:`_scalar_copies`), and is written
back as the original records (``file_meta["cg_scalar_copies"]``).

**1-based set/get indices.** TensCalc's ``saveScalarized`` writes set and get
variable indices 1-based (copies and .cg stay 0-based); ``saveVectorized``
and opgraph write 0-based. A file with a metadata record states its base.
Otherwise both readings are scored and the lower score wins, ties going to
0-based (the format's base): a reading is impossible when an index becomes
negative, a set variable is produced by a function or set twice, or an index
exceeds what the files can describe; else its score counts variables left
without producer and without set gateway, set/get variables no function
touches (and, for gets, not set either), and gets of a constant function's
output (TensCalc gets are ``scalars2ftensor`` outputs). The writer runs the
same rule on what it is about to write and adds the metadata record when the
rule would not find the intended base.

**file_meta** (written by :func:`load_cg`, honoured by :func:`save_cg` where
it still fits the graph): ``cg_index_bits`` (int, or a dict by suffix when
the files differ), ``cg_opgraph_metadata`` (whether the metadata record was
there), ``cg_io_base`` (0/1), ``cg_io_records`` (``(type, count)`` per .cgio
record, when not one record per variable), ``cg_unset_inputs``,
``cg_const_types`` (.cgc record type per constant, when not the default),
``cg_cgs_order`` (``(type, index)`` per .cgs record, when not sorted),
``cg_text_encoding`` (when the .cgs text is not UTF-8), ``cg_scalar_copies``
(copies into scalarised inputs, see above). Names are written as
UTF-8 and their lengths count bytes.

**Reading large files.** The .cg and .cgio integer streams are parsed with
NumPy (a memory map of the file after the magic byte), and the graph's id
arrays are filled from it a chunk at a time, so the reader needs little
beyond the graph it builds. Record boundaries are found by
:func:`scan_records`: a stream whose records all have one length is
confirmed by strided checks; otherwise the stream is cut into blocks, one
cursor per block starts at the block's first integer (possibly mid-record)
and all cursors advance together, one NumPy step per record. A cursor that
meets an invalid record, one longer than a block or one of no registered
kind (ids read as counts or kinds: it started mid-record) moves on by one
integer instead, so it soon falls in step with the true records. Then a
short Python pass walks the blocks in order from the true start, following
the true chain only until it lands on a position the block's cursor visited,
after which the cursor's positions are the true ones (up to a record the
cursor skipped: a bad one is an error, a valid one is stepped over). Files
under ~16k integers use a plain loop.

**Writing large graphs.** The .cg stream and the arrays of the metadata
record are made and written a chunk of ops at a time (no full-size copy, no
object per op), so a 10^8-op graph is saved in little more memory than the
graph itself.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, NoReturn

import numpy as np

from opgraph.core import progress
from opgraph.core.builder import exact_key
from opgraph.core.dtypes import CODE_DTYPES, DTYPE_CODES
from opgraph.core.graph import Graph, Symbols
from opgraph.core.registry import CONST, USER_IDS, Attrs, OpDef, all_ops, get_op, unknown_op_message
from opgraph.core.subgraph import Subgraph, subgraphs_of
from opgraph.core.types import TensorType, ValueType, VoidType
from opgraph.errors import FormatError, GraphError, OpTypeError, VerifyError
from opgraph.io._atomic import atomic_files

__all__ = [
    "METADATA_RECORD",
    "SUBGRAPH_RECORD",
    "TC_DOUBLE_FULL",
    "TC_DOUBLE_SPARSE",
    "TC_INT64_TENSOR",
    "TC_INT64_VECTOR",
    "TC_STRING",
    "Gateway",
    "gateways",
    "load_cg",
    "save_cg",
    "scan_records",
    "scan_records_reference",
]

SUFFIXES = (".cg", ".cgc", ".cgio", ".cgs")
MAGIC_DTYPES = {16: np.dtype("<i2"), 32: np.dtype("<i4"), 64: np.dtype("<i8")}

TC_DOUBLE_FULL = 10001
TC_DOUBLE_SPARSE = 10002
TC_INT64_VECTOR = 20001
TC_INT64_TENSOR = 20002
TC_STRING = 30001
CONST_RECORD_BASE = 100
"""opgraph constant records are ``100 + dtype code`` (101-114)."""
METADATA_RECORD = 9001
"""The .cgc record type of opgraph's metadata record."""
METADATA_VERSION = 1
SUBGRAPH_RECORD = 9002
"""The .cgc record type of a subgraph (a body of ``call``/``cond``/``while_loop``/``scan``), stored once."""
SUBGRAPH_FORMAT = "opgraph.cg.subgraph"
SUBGRAPH_VERSION = 1

IO_SET, IO_GET, IO_COPY = 1, 2, 3
TC_SCALARS2FTENSOR, TC_FTENSOR2SCALARS = 30001, 30002
"""TensCalc's function types that gather scalars into a tensor and split a tensor into scalars."""
SYM_KIND = {1: "constant", 2: "op", 3: "value", 4: "io"}
SYM_TYPE = {v: k for k, v in SYM_KIND.items()}
_SYM_FIELD = {1: "constants", 2: "ops", 3: "values", 4: "io"}

F64_UNKNOWN = TensorType("float64", None)
_SMALL_STREAM = 1 << 14
"""Streams shorter than this many integers are scanned with a plain loop."""
_MAX_INDEX = 2**31 - 1
_CHUNK = 1 << 16
"""Whole-file steps work on about this many integers at a time (bounded temporaries)."""


# ---------------------------------------------------------------- errors
class _Where:
    """Where the reader is (file, record, byte offset) for messages of unexpected errors."""

    def __init__(self) -> None:
        self.path = ""
        self.record: int | str = 0
        self.offset = 0

    def at(self, path: str, record: int | str = 0, offset: int = 0) -> None:
        self.path, self.record, self.offset = path, record, offset


def _fail(path: str, record: int | str, offset: int, message: str) -> NoReturn:
    raise FormatError(f"{path}: record {record} at byte offset {offset}: {message}")


class _ScanError(Exception):
    def __init__(self, record: int, pos: int, reason: str) -> None:
        super().__init__(reason)
        self.record, self.pos, self.reason = record, pos, reason


# ---------------------------------------------------------------- helpers
def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, e)`` for each pair (int64), vectorised."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(ends, dtype=np.int64) - starts
    keep = lengths > 0
    if not keep.all():
        starts, lengths = starts[keep], lengths[keep]
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    out = np.ones(total, dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    out[0] = starts[0]
    out[offsets[1:]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return np.cumsum(out, out=out)


def _op_chunks(n_ops: int, *ptrs: np.ndarray) -> Iterator[tuple[int, int]]:
    """Ranges ``[lo, hi)`` of ops with at most ``_CHUNK`` ops and ids per CSR pointer (one op at least)."""
    lo = 0
    while lo < n_ops:
        hi = min(n_ops, lo + _CHUNK)
        for ptr in ptrs:
            hi = min(hi, int(np.searchsorted(ptr, ptr[lo] + _CHUNK, side="right")) - 1)
        hi = max(hi, lo + 1)
        yield lo, hi
        lo = hi


def _max_count(ptr: np.ndarray) -> int:
    """Largest row length of a CSR pointer, a chunk at a time."""
    return max((int(np.diff(ptr[lo:lo + _CHUNK + 1]).max()) for lo in range(0, len(ptr) - 1, _CHUNK)), default=0)


def _all_counts(ptr: np.ndarray, k: int) -> bool:
    """Whether every row of a CSR pointer has length ``k``."""
    return all(bool(np.all(np.diff(ptr[lo:lo + _CHUNK + 1]) == k)) for lo in range(0, len(ptr) - 1, _CHUNK))


def _chunk_len(part: Any) -> int:
    if isinstance(part, tuple):
        return len(part[0]) * part[1].itemsize
    return len(part)


def _base_path(path: str | os.PathLike[str]) -> str:
    p = os.fspath(path)
    root, ext = os.path.splitext(p)
    return root if ext.lower() in SUFFIXES else p


def _int_range(bits: int) -> int:
    return 2 ** (bits - 1) - 1


# ============================================================== scanning
class _Layout:
    """How long a record starting at a position is, for one file kind.

    ``lengths(p)`` is vectorised (``(length, ok)`` arrays); ``step(p)`` is the
    scalar form returning ``(length, None)`` or ``(0, reason)``.
    """

    n: int

    def lengths(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def step(self, p: int) -> tuple[int, str | None]:
        raise NotImplementedError

    def uniform(self) -> np.ndarray | None:
        """Record starts if every record has the first record's length, else None."""
        return None

    def plausible(self, p: np.ndarray) -> np.ndarray | bool:
        """Which valid records a scanning cursor may follow (see :func:`scan_records`)."""
        return True


class _CgLayout(_Layout):
    """.cg: ``[type, nin, nout, ins..., outs...]`` or ``[0, constant, output]``."""

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.n = a, len(a)
        self._list: list[int] | None = a.tolist() if self.n < _SMALL_STREAM else None
        self._known: np.ndarray | None = None

    def plausible(self, p: np.ndarray) -> np.ndarray | bool:
        # Constant functions and registered kinds: ids read as a kind (a cursor that started
        # mid-record) are seldom one, so such a cursor soon falls in step.
        if self._known is None:
            ids = [d.id for d in all_ops()]
            self._known = np.zeros(max(ids, default=0) + 1, dtype=bool)
            self._known[ids] = True
            self._known[0] = True
        t = self.a[p]
        inside = (t >= 0) & (t < len(self._known))
        return inside & self._known[np.where(inside, t, 0)]

    def lengths(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a, n = self.a, self.n
        hi = n - 1
        t = a[p].astype(np.int64)
        nin = np.clip(a[np.minimum(p + 1, hi)], -1, n + 1).astype(np.int64)
        nout = np.clip(a[np.minimum(p + 2, hi)], -1, n + 1).astype(np.int64)
        const = t == 0
        length = np.where(const, 3, 3 + nin + nout)
        ok = (p + 3 <= n) & (t >= 0) & (const | ((nin >= 0) & (nout >= 0))) & (p + length <= n)
        return length, ok

    def _get(self, i: int) -> int:
        return self._list[i] if self._list is not None else int(self.a[i])

    def step(self, p: int) -> tuple[int, str | None]:
        n = self.n
        if p + 3 > n:
            return 0, f"function record header runs past the end of the file (truncated; {n - p} of 3 integers)"
        t = self._get(p)
        if t < 0:
            return 0, f"negative function type {t}"
        if t == 0:
            return 3, None
        nin, nout = self._get(p + 1), self._get(p + 2)
        if nin < 0 or nout < 0:
            return 0, f"negative input/output count ({nin}, {nout})"
        length = 3 + nin + nout
        if p + length > n:
            return 0, f"function record of {length} integers runs past the end of the file ({n - p} left; truncated?)"
        return length, None

    def uniform(self) -> np.ndarray | None:
        length = self.uniform_length()
        return None if length is None else np.arange(0, self.n, length, dtype=np.int64)

    def uniform_length(self) -> int | None:
        """The length of every record when all records have the first one's shape, else None."""
        a, n = self.a, self.n
        if n < 3 or int(a[0]) <= 0:
            return None
        length = 3 + int(a[1]) + int(a[2])
        if length <= 3 or n % length or int(a[1]) < 0 or int(a[2]) < 0:
            return None
        rows = a.reshape(-1, length)
        for lo in range(0, len(rows), _CHUNK):  # in chunks: the temporaries stay small
            blk = rows[lo:lo + _CHUNK]
            if not (np.all(blk[:, 1] == a[1]) and np.all(blk[:, 2] == a[2]) and np.all(blk[:, 0] > 0)):
                return None
        return length


class _CgioLayout(_Layout):
    """.cgio: ``[type, n, vars...]`` (n vars, or 2n for copies)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.n = a, len(a)
        self._list: list[int] | None = a.tolist() if self.n < _SMALL_STREAM else None

    def lengths(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a, n = self.a, self.n
        t = a[p].astype(np.int64)
        cnt = np.clip(a[np.minimum(p + 1, n - 1)], -1, n + 1).astype(np.int64)
        length = 2 + np.where(t == IO_COPY, 2 * cnt, cnt)
        ok = (p + 2 <= n) & (t >= 1) & (t <= 3) & (cnt >= 0) & (p + length <= n)
        return length, ok

    def _get(self, i: int) -> int:
        return self._list[i] if self._list is not None else int(self.a[i])

    def step(self, p: int) -> tuple[int, str | None]:
        n = self.n
        if p + 2 > n:
            return 0, "gateway header runs past the end of the file (truncated)"
        t, cnt = self._get(p), self._get(p + 1)
        if t not in (IO_SET, IO_GET, IO_COPY):
            return 0, f"unknown gateway type {t} (1 set, 2 get, 3 copy)"
        if cnt < 0:
            return 0, f"negative variable count {cnt}"
        length = 2 + (2 * cnt if t == IO_COPY else cnt)
        if p + length > n:
            return 0, f"gateway record of {length} integers runs past the end of the file ({n - p} left; truncated?)"
        return length, None


class _CgsLayout(_Layout):
    """.cgs over bytes: ``[type, index, name length, description length]`` then the chars."""

    def __init__(self, data: np.ndarray, itemsize: int, dtype: np.dtype) -> None:
        self.data, self.n, self.w = data, len(data), itemsize
        m = max(self.n - itemsize + 1, 0)
        # Integers at every byte offset (an overlapping strided view; no copy).
        self.ints = np.ndarray((m,), dtype=dtype, buffer=data, offset=0, strides=(1,)) if m else np.zeros(0, dtype)
        self._bytes = data.tobytes() if self.n < (1 << 20) else None
        self._fmt = {2: "<4h", 4: "<4i", 8: "<4q"}[itemsize]

    def lengths(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n, w, ints = self.n, self.w, self.ints
        if len(ints) == 0:
            return np.zeros(len(p), np.int64), np.zeros(len(p), bool)
        hi = len(ints) - 1
        t = ints[np.minimum(p, hi)].astype(np.int64)
        idx = ints[np.minimum(p + w, hi)].astype(np.int64)
        nl = np.clip(ints[np.minimum(p + 2 * w, hi)], -1, n + 1).astype(np.int64)
        dl = np.clip(ints[np.minimum(p + 3 * w, hi)], -1, n + 1).astype(np.int64)
        length = 4 * w + nl + dl
        ok = (p + 4 * w <= n) & (t >= 1) & (t <= 4) & (idx >= 0) & (nl >= 0) & (dl >= 0) & (p + length <= n)
        return length, ok

    def header(self, p: int) -> tuple[int, int, int, int]:
        buf = self._bytes if self._bytes is not None else self.data
        return struct.unpack_from(self._fmt, buf, p)  # type: ignore[return-value]

    def step(self, p: int) -> tuple[int, str | None]:
        n, w = self.n, self.w
        if p + 4 * w > n:
            return 0, "symbol header runs past the end of the file (truncated)"
        t, idx, nl, dl = self.header(p)
        if t not in SYM_KIND:
            return 0, f"unknown symbol type {t} (1 constant, 2 function, 3 variable, 4 io)"
        if idx < 0:
            return 0, f"negative index {idx}"
        if nl < 0 or dl < 0:
            return 0, f"negative text length ({nl}, {dl})"
        length = 4 * w + nl + dl
        if p + length > n:
            return 0, f"symbol record of {length} bytes runs past the end of the file ({n - p} left; truncated?)"
        return length, None


def scan_records_reference(layout: _Layout) -> np.ndarray:
    """Record starts by a plain loop over records (the reference for :func:`scan_records`)."""
    starts: list[int] = []
    pos, n = 0, layout.n
    while pos < n:
        length, reason = layout.step(pos)
        if reason is not None:
            raise _ScanError(len(starts), pos, reason)
        starts.append(pos)
        pos += length
    return np.asarray(starts, dtype=np.int64)


def scan_records(layout: _Layout, *, block: int | None = None, dtype: Any = np.int64) -> np.ndarray:
    """Record start positions of a stream (int64, or ``dtype``), found with NumPy (see the module doc).

    Raises ``_ScanError(record, position, reason)`` at the first bad record.
    ``block`` forces the block-cursor scan with that block size (for tests).

    >>> a = np.array([5, 1, 1, 0, 1, 0, 4, 2, 5, 0, 2, 3, 9, 7, 1, 1, 3, 10], dtype="<i4")
    >>> scan_records(_CgLayout(a), block=4).tolist()
    [0, 5, 8, 13]
    """
    n = layout.n
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if block is None:
        hit = layout.uniform()
        if hit is not None:
            return hit.astype(dtype, copy=False)
        if n < _SMALL_STREAM:
            return scan_records_reference(layout).astype(dtype, copy=False)
        block = int(min(max(2 * math.isqrt(n), 256), 1 << 16))
    nb = -(-n // block)
    bstart = np.arange(nb, dtype=np.int64) * block
    bend = np.minimum(bstart + block, n)
    visited = np.zeros(n, dtype=bool)
    cur = bstart.copy()
    exits = np.full(nb, -1, dtype=np.int64)
    longest = max(block, 256)
    bad_parts: list[np.ndarray] = []
    stepped_parts: list[np.ndarray] = []
    active = np.arange(nb, dtype=np.int64)
    # All cursors advance together, one record per NumPy step. A cursor that started mid-record
    # soon meets an invalid record, a "record" longer than ``longest`` (ids read as counts) or
    # one the layout finds implausible (an id read as a kind); it moves on by one integer
    # instead and so falls in step. A valid record it skips that way is stepped over by the
    # walk below.
    while len(active):
        p = cur[active]
        length, ok = layout.lengths(p)
        good = ok & (length <= longest) & layout.plausible(p)
        nxt = np.where(good, p + length, p + 1)
        if good.all():
            visited[p] = True
        else:
            visited[p[good]] = True
            if not ok.all():
                bad_parts.append(p[~ok])
            if (ok & ~good).any():
                stepped_parts.append(p[ok & ~good])
        done = nxt >= bend[active]
        if done.any():
            exits[active[done & good]] = nxt[done & good]
        keep = ~done
        active = active[keep]
        cur[active] = nxt[keep]
    bad_skips = np.sort(np.concatenate(bad_parts)) if bad_parts else np.zeros(0, np.int64)
    stepped_skips = np.sort(np.concatenate(stepped_parts)) if stepped_parts else np.zeros(0, np.int64)
    del bad_parts, stepped_parts

    def first_in(arr: np.ndarray, lo: int, hi: int) -> int:
        k = int(np.searchsorted(arr, lo))
        return int(arr[k]) if k < len(arr) and arr[k] < hi else hi

    # Walk the blocks in order along the true chain; it joins each block's cursor quickly. From
    # the join on the cursor is on the true chain, up to the first position it skipped there:
    # a bad record (an error) or a valid one it would not follow (stepped over here).
    extras: list[int] = []
    count = 0
    pos = 0
    bs_l, be_l, ex_l = bstart.tolist(), bend.tolist(), exits.tolist()
    for j in range(nb):
        bs, be = bs_l[j], be_l[j]
        dirty = bs  # cursor marks in [dirty, be) that are not (yet) known to be the true chain
        while pos < be:
            if not visited[pos]:
                length, reason = layout.step(pos)
                if reason is not None:
                    raise _ScanError(count, pos, reason)
                extras.append(pos)
                count += 1
                pos += length
                continue
            visited[dirty:pos] = False
            bad, stepped = first_in(bad_skips, pos, be), first_in(stepped_skips, pos, be)
            end = min(bad, stepped)
            if bad < stepped:
                _, reason = layout.step(bad)
                raise _ScanError(count + int(np.count_nonzero(visited[pos:bad])), bad, reason or "bad record")
            count += int(np.count_nonzero(visited[pos:end]))
            if end == be:
                pos, dirty = ex_l[j], be
                break
            visited[end:be] = False  # past the skipped record the cursor's marks are not the chain
            pos, dirty = end, be
        visited[dirty:be] = False
    if extras:
        visited[np.asarray(extras, dtype=np.int64)] = True
    out = np.empty(int(np.count_nonzero(visited)), dtype=dtype)
    at = 0
    for lo in range(0, n, _CHUNK):
        found = np.flatnonzero(visited[lo:lo + _CHUNK])
        found += lo
        out[at:at + len(found)] = found
        at += len(found)
    return out


# ============================================================== files
class _File:
    """One of the four files: magic, width and its bytes after the magic byte."""

    def __init__(self, path: str, suffix: str, use_mmap: bool, data: np.ndarray | None = None) -> None:
        # ``data``: the bytes of a file embedded in a subgraph record (``path`` then names where it is).
        self.path = path
        self.suffix = suffix
        size = os.path.getsize(path) if data is None else len(data)
        if size == 0:
            _fail(path, 0, 0, "empty file (no magic byte)")
        if data is not None:
            raw = data
        elif use_mmap and size > (1 << 16):
            # A plain-ndarray view of the map, so that arrays derived from it are plain arrays
            # (copies of an np.memmap stay np.memmap instances).
            raw = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
        else:
            with open(path, "rb") as f:
                raw = np.frombuffer(f.read(), dtype=np.uint8)
        magic = int(raw[0])
        if magic not in MAGIC_DTYPES:
            _fail(path, 0, 0, f"bad magic byte {magic} (expected 16, 32 or 64: the integer width in bits)")
        self.bits = magic
        self.dtype = MAGIC_DTYPES[magic]
        self.w = self.dtype.itemsize
        self.body = raw[1:]
        self.size = size

    def ints(self) -> np.ndarray:
        """The body as integers (whole integers only; a partial one is reported by the caller)."""
        k = len(self.body) // self.w
        if k == 0:
            return np.zeros(0, dtype=self.dtype)
        return self.body[: k * self.w].view(self.dtype)

    def byte_of(self, pos: int) -> int:
        """File offset of integer ``pos`` of the body."""
        return 1 + pos * self.w


def _scan_file(f: _File, layout: _Layout, dtype: Any = np.int64) -> np.ndarray:
    try:
        starts = scan_records(layout, dtype=dtype)
    except _ScanError as e:
        unit = 1 if isinstance(layout, _CgsLayout) else f.w
        _fail(f.path, e.record, 1 + e.pos * unit, e.reason)
    if not isinstance(layout, _CgsLayout):
        _check_whole(f, len(starts))
    return starts


def _check_whole(f: _File, n_records: int) -> None:
    """A file of integers must not end in part of one."""
    if len(f.body) % f.w:
        _fail(f.path, n_records, 1 + (len(f.body) // f.w) * f.w,
              f"{len(f.body) % f.w} trailing byte(s) after the last record (truncated integer)")


# ============================================================== attribute / type encoding
def _f8(v: float) -> str:
    return struct.pack(">d", v).hex()


def _enc_attr(v: Any, bodies: dict[Subgraph, int] | None = None) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return {"f8": _f8(float(v))}
    if isinstance(v, (complex, np.complexfloating)):
        c = complex(v)
        return {"c16": [_f8(c.real), _f8(c.imag)]}
    if isinstance(v, tuple):
        return [_enc_attr(x, bodies) for x in v]
    if isinstance(v, Subgraph) and bodies is not None and v in bodies:
        return {"subgraph": bodies[v]}
    raise GraphError(f"attribute value {v!r} ({type(v).__name__}) cannot be stored in a .cg file")


def _dec_f8(s: Any) -> float:
    if not isinstance(s, str) or len(s) != 16:
        raise ValueError(f"bad float bits {s!r}")
    return struct.unpack(">d", bytes.fromhex(s))[0]


def _dec_attr(x: Any, depth: int = 0, bodies: dict[int, Subgraph] | None = None) -> Any:
    if depth > 100:
        raise ValueError("attribute nesting too deep")
    if x is None or isinstance(x, (bool, str, int)):
        return x
    if isinstance(x, list):
        return tuple(_dec_attr(y, depth + 1, bodies) for y in x)
    if isinstance(x, dict) and len(x) == 1:
        ((tag, body),) = x.items()
        if tag == "f8":
            return _dec_f8(body)
        if tag == "subgraph":
            if type(body) is not int or bodies is None or body not in bodies:
                raise ValueError(f"{x!r} does not name a subgraph record (type {SUBGRAPH_RECORD}) of the .cgc "
                                 f"file before this one"[:300])
            return bodies[body]
        if tag == "c16" and isinstance(body, list) and len(body) == 2:
            return complex(_dec_f8(body[0]), _dec_f8(body[1]))
    raise ValueError(f"bad attribute value {x!r}"[:200])


def _enc_type(t: ValueType) -> Any:
    if isinstance(t, VoidType):
        return {"void": True}
    return {"dtype": t.dtype.name, "shape": None if t.shape is None else list(t.shape)}


def _dec_type(x: Any) -> ValueType:
    from opgraph.core.types import VOID

    if x == {"void": True}:
        return VOID
    if not isinstance(x, dict) or set(x) != {"dtype", "shape"} or not isinstance(x["dtype"], str):
        raise ValueError(f"bad type {x!r}"[:200])
    shape = x["shape"]
    if shape is not None and (not isinstance(shape, list) or len(shape) > 64
                              or not all(d is None or (type(d) is int and d >= 0) for d in shape)):
        raise ValueError(f"bad shape {shape!r}"[:200])
    return TensorType(x["dtype"], None if shape is None else tuple(shape))


# ============================================================== constants
def _const_record_default(c: np.ndarray, tenscalc: bool) -> int:
    if tenscalc:
        if c.dtype == np.float64:
            return TC_DOUBLE_FULL
        if c.dtype == np.int64:
            return TC_INT64_VECTOR if c.ndim == 1 else TC_INT64_TENSOR
        if c.dtype == np.uint8 and c.ndim == 1:
            return TC_STRING
    return CONST_RECORD_BASE + DTYPE_CODES[c.dtype.name]


def _const_record_fits(rtype: int, c: np.ndarray) -> bool:
    if rtype == TC_DOUBLE_FULL:
        return c.dtype == np.float64
    if rtype == TC_INT64_VECTOR:
        return c.dtype == np.int64 and c.ndim == 1
    if rtype == TC_INT64_TENSOR:
        return c.dtype == np.int64
    if rtype == TC_STRING:
        return c.dtype == np.uint8 and c.ndim == 1
    return rtype == CONST_RECORD_BASE + DTYPE_CODES.get(c.dtype.name, -1)


def _constant_length(rtype: int, c: np.ndarray) -> int:
    """``len(_encode_constant(rtype, c))`` without encoding it."""
    data = c.size * c.dtype.itemsize
    return data if rtype in (TC_INT64_VECTOR, TC_STRING) else 8 + 8 * c.ndim + data


def _encode_constant(rtype: int, c: np.ndarray) -> bytes:
    if rtype in (TC_INT64_VECTOR, TC_STRING):
        return np.ascontiguousarray(c, dtype=c.dtype.newbyteorder("<")).tobytes()
    head = np.array([c.ndim, *c.shape], dtype="<i8").tobytes()
    if rtype in (TC_DOUBLE_FULL, TC_INT64_TENSOR):
        return head + np.asarray(c, dtype=c.dtype.newbyteorder("<")).ravel(order="F").tobytes()
    return head + np.ascontiguousarray(c, dtype=c.dtype.newbyteorder("<")).tobytes()


def _decode_constant(rtype: int, data: np.ndarray, fail: Callable[[str], NoReturn]) -> np.ndarray:
    """Decode one .cgc constant record's data (a uint8 array); ``fail(msg)`` raises."""
    n = len(data)
    if rtype == TC_STRING:
        return np.array(data, dtype=np.uint8)
    if rtype == TC_INT64_VECTOR:
        if n % 8:
            fail(f"int64l_full_vector data of {n} bytes is not a whole number of int64 values")
        return data.view("<i8").astype(np.int64)
    if rtype in (TC_DOUBLE_FULL, TC_INT64_TENSOR):
        dtype, order = np.dtype("<f8" if rtype == TC_DOUBLE_FULL else "<i8"), "F"
    elif CONST_RECORD_BASE < rtype <= CONST_RECORD_BASE + max(CODE_DTYPES):
        dtype, order = CODE_DTYPES[rtype - CONST_RECORD_BASE].newbyteorder("<"), "C"
    elif rtype == TC_DOUBLE_SPARSE:
        fail("constant type 10002 (TensCalc double_sparse_tensor) is not supported")
    else:
        fail(f"unknown record type {rtype}: not a constant, subgraph ({SUBGRAPH_RECORD}) or metadata "
             f"({METADATA_RECORD}) record type this opgraph knows (written by a newer opgraph?)")
    if n < 8:
        fail(f"constant data of {n} bytes is shorter than its int64 ndim")
    ndim = int(data[:8].view("<i8")[0])
    if not 0 <= ndim <= 64:
        fail(f"constant has ndim {ndim} (0..64 allowed)")
    if n < 8 + 8 * ndim:
        fail(f"constant data of {n} bytes is shorter than its header (ndim {ndim})")
    sizes = [int(s) for s in data[8:8 + 8 * ndim].view("<i8")]
    if any(s < 0 for s in sizes):
        fail(f"constant has a negative size {sizes}")
    count = math.prod(sizes)
    if math.prod(s for s in sizes if s) * dtype.itemsize >= 2**62:
        fail(f"constant shape {tuple(sizes)} is too large for any array")
    body = n - 8 - 8 * ndim
    if count * dtype.itemsize != body:
        fail(f"constant of shape {tuple(sizes)} ({dtype.name}) needs {count * dtype.itemsize} data bytes, "
             f"the record has {body}")
    values = data[8 + 8 * ndim:].view(dtype)
    if dtype.kind == "b" and count and int(data[8 + 8 * ndim:].max()) > 1:
        fail("bool constant holds bytes other than 0 and 1")
    arr = values.reshape(sizes, order=order)
    return np.array(arr, dtype=dtype.newbyteorder("="), order="C", copy=True)


# ============================================================== io base detection
def _io_base_score(base: int, sets: np.ndarray, gets: np.ndarray, produced: np.ndarray,
                   const_out: np.ndarray, limit: int) -> int | None:
    """Score of reading set/get indices with ``base`` (None: impossible). See the module doc."""
    s = sets.astype(np.int64) - base
    g = gets.astype(np.int64) - base
    n_ref = len(produced)
    if (len(s) and int(s.min()) < 0) or (len(g) and int(g.min()) < 0):
        return None
    top = max(n_ref, int(s.max()) + 1 if len(s) else 0, int(g.max()) + 1 if len(g) else 0)
    if top > limit:
        return None
    if len(s):
        inside = s[s < n_ref]
        if produced[inside].any() or len(np.unique(s)) != len(s):
            return None
    setmask = np.zeros(top, dtype=bool)
    setmask[s] = True
    prod = np.zeros(top, dtype=bool)
    prod[:n_ref] = produced
    orphans = int(np.count_nonzero(~prod & ~setmask))
    outside = int(np.count_nonzero(s >= n_ref)) + int(np.count_nonzero((g >= n_ref) & ~setmask[g]))
    gi = g[g < n_ref]
    const_gets = int(np.count_nonzero(const_out[gi]))
    return orphans + outside + const_gets


def _detect_io_base(sets: np.ndarray, gets: np.ndarray, produced: np.ndarray, const_out: np.ndarray,
                    limit: int) -> int | None:
    s0 = _io_base_score(0, sets, gets, produced, const_out, limit)
    s1 = _io_base_score(1, sets, gets, produced, const_out, limit)
    if s0 is None and s1 is None:
        return None
    if s1 is None or (s0 is not None and s0 <= s1):
        return 0
    return 1


# ============================================================== saving
def save_cg(graph: Graph, path: str | os.PathLike[str], *, index_bits: int | None = None) -> None:
    """Write ``graph`` as the four files ``base.cg``, ``.cgc``, ``.cgio``, ``.cgs``, atomically.

    ``path`` is the base name or any of the four file names. ``index_bits``
    (16, 32 or 64) is the integer width; by default the width the graph was
    read with (``file_meta``), else 32, or 64 when something does not fit.
    A graph read from a TensCalc file set is written back byte for byte.

    >>> import os, tempfile, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> b.output(b.negative(b.input(("int8", (2,)), name="a")))
    >>> base = os.path.join(tempfile.mkdtemp(), "g")
    >>> save_cg(b.freeze(), base, index_bits=16)
    >>> open(base + ".cg", "rb").read(1)[0], load_cg(base).file_meta["cg_index_bits"]
    (16, 16)
    """
    if index_bits is not None and index_bits not in MAGIC_DTYPES:
        raise ValueError(f"index_bits must be 16, 32 or 64, not {index_bits!r}")
    view = _file_view(graph)  # a TensCalc file read with copies into scalars: its own records again
    contents = _Writer(view if view is not None else graph).contents(index_bits)
    base = _base_path(path)
    with atomic_files([base + s for s in SUFFIXES]) as files, \
            progress.task(f"saving {base}.cg (files)", total=len(SUFFIXES)) as tick:
        for f, chunks in zip(files, contents, strict=True):
            _write_file(f, chunks)
            tick.advance(1)


def _write_file(f: BinaryIO, chunks: Iterable[Any]) -> None:
    """Write one file's chunks (bytes or arrays) to an open temporary file."""
    for chunk in chunks:
        f.write(memoryview(chunk).cast("B") if isinstance(chunk, np.ndarray) else chunk)


@dataclass(frozen=True)
class Gateway:
    """One .cgio record: a named ``set``, ``get`` or ``copy`` of some values.

    ``values`` are the variables set or got (for a copy, the sources);
    ``destinations`` are a copy's destination inputs.
    """

    kind: str
    name: str | None
    values: tuple[int, ...]
    destinations: tuple[int, ...] = ()


def gateways(graph: Graph) -> list[Gateway]:
    """The graph's set/get/copy gateways grouped as its .cgio records are (TensCalc's named io functions).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", ()), name="x")
    >>> b.output(b.exp(x))
    >>> [(gw.kind, gw.values) for gw in gateways(b.freeze())]
    [('get', (1,)), ('set', (0,))]
    """
    writer = _Writer(graph)
    unset = writer._unset_inputs()
    sets = graph.inputs.tolist()[:len(graph.inputs) - len(unset)]
    layout = writer._io_layout(len(sets)) or (
        [(IO_GET, 1)] * len(graph.outputs) + [(IO_SET, 1)] * len(sets) + [(IO_COPY, 1)] * len(graph.updates))
    pending = {IO_SET: sets, IO_GET: graph.outputs.tolist(), IO_COPY: graph.updates.tolist()}
    out: list[Gateway] = []
    for k, (kind, count) in enumerate(layout):
        taken, pending[kind] = pending[kind][:count], pending[kind][count:]
        name = graph.symbols.io.get(k)
        if kind == IO_COPY:
            out.append(Gateway("copy", name, tuple(int(s) for s, _ in taken), tuple(int(d) for _, d in taken)))
        else:
            out.append(Gateway("set" if kind == IO_SET else "get", name, tuple(int(v) for v in taken)))
    return out


# ------------------------------------------------------- copies into scalarised inputs
class _CopyProblem(Exception):
    """A copy pair that is neither a copy into an input nor into the scalars of a set variable."""

    def __init__(self, pair: int, message: str) -> None:
        super().__init__(message)
        self.pair, self.message = pair, message


def _scalar_copies(view: Graph, counts: Sequence[int]) -> tuple[Graph, list[int]]:
    """``view`` (whose ``updates`` are a file's copy pairs) with its copies into scalars made update edges.

    TensCalc's ``saveScalarized`` writes a copy of a set variable as pairs
    (source scalar, destination scalar) whose destinations are the outputs of
    the ``ftensor2scalars`` that splits the variable (``counts``: pairs per
    copy record). For each copy record and each such variable this appends a
    ``scalars2ftensor`` of the variable's entries in column-major order (the
    copied sources at their positions, the variable's own scalars elsewhere),
    from a ``[1 .. n]`` subscripts constant (``1 x n``, shared by the copies of
    ``n`` scalars), and an update edge from it to the variable. The file does
    not store the variable's size, so the new value is a vector of its ``n``
    entries: the variable must be read only by ``ftensor2scalars`` (as
    saveScalarized writes it), which sees the same entries. Pairs into inputs
    stay update edges. Returns the graph (``file_meta`` and symbols of
    ``view``) and the number of update edges per copy record.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", None), name="x")
    >>> x0, x1 = b.op("ftensor2scalars", x, nout=2)
    >>> y = b.op("Sexp", x0)
    >>> b.output(y)
    >>> g = b.freeze()
    >>> h, rows = _scalar_copies(g.replace(updates=[[y.id, x0.id]]), [1])   # x(1) <- exp(x(1))
    >>> [h.kind_of(op) for op in range(h.num_ops)], h.updates.tolist(), rows
    (['ftensor2scalars', 'Sexp', 'const', 'scalars2ftensor'], [[5, 0]], [1])
    >>> ctx = opgraph.compile(h).context()
    >>> ctx.set("x", np.array([0.0, 2.0])); ctx.update()
    >>> ctx.get("x"), ctx.get(y.id)
    (array([1., 2.]), array(2.71828183))
    """
    pairs = view.updates.astype(np.int64)
    src, dst = pairs[:, 0], pairs[:, 1]
    n_vals, n_ops = view.num_values, view.num_ops
    rec = np.repeat(np.arange(len(counts)), np.asarray(counts, dtype=np.int64))
    is_input = np.zeros(n_vals, dtype=bool)
    is_input[view.inputs] = True
    scal = ~is_input[dst]
    rows_per_record = np.bincount(rec, minlength=len(counts)).tolist()
    if not scal.any():
        return view, rows_per_record
    idx = np.flatnonzero(scal)
    prod = view.value_producer[dst[idx]].astype(np.int64)
    ok = prod >= 0
    ok[ok] = view.op_kind[prod[ok]] == TC_FTENSOR2SCALARS
    n_in = np.diff(view.in_ptr)
    ok[ok] = n_in[prod[ok]] == 1
    ok[ok] = is_input[view.in_ids[view.in_ptr[prod[ok]]]]
    if not ok.all():
        k = int(idx[np.flatnonzero(~ok)[0]])
        raise _CopyProblem(k, f"copy destination {int(dst[k])} is not an input "
                              f"(it is produced by record {int(view.value_producer[dst[k]])})")
    # A scalar copied twice by one gateway has no single meaning.
    key = rec[idx] * n_vals + dst[idx]
    _, first = np.unique(key, return_index=True)
    if len(first) != len(idx):
        k = int(idx[np.setdiff1d(np.arange(len(idx)), first)[0]])
        raise _CopyProblem(k, f"copy destination {int(dst[k])} is copied twice by one copy gateway")
    # One group per (copy record, ftensor2scalars op), in order of first pair.
    gkey = rec[idx] * n_ops + prod
    _, gfirst, ginv = np.unique(gkey, return_index=True, return_inverse=True)
    order = np.argsort(gfirst, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    group = rank[ginv.reshape(-1)]
    types, attrs, constants = list(view.types), list(view.attrs), list(view.constants)

    def table_id(table: list[Any], entry: Any, key: Callable[[Any], Any]) -> int:
        want = key(entry)
        for i, t in enumerate(table):
            if key(t) == want:
                return i
        table.append(entry)
        return len(table) - 1

    f64 = table_id(types, F64_UNKNOWN, lambda t: t)
    nout1 = table_id(attrs, (("nout", 1),), exact_key)
    kinds: list[int] = []
    op_attr: list[int] = []
    ins: list[np.ndarray] = []
    vtypes: list[int] = []
    subs_value: dict[int, int] = {}
    group_value = np.empty(len(order), dtype=np.int64)
    group_dest = np.empty(len(order), dtype=np.int64)
    cptr, cops = view.consumers()
    by_group = np.argsort(group, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(order)))])
    for gi, first_pair in enumerate(gfirst[order].tolist()):
        op = int(prod[first_pair])
        var = int(view.in_ids[view.in_ptr[op]])
        readers = cops[cptr[var]:cptr[var + 1]]
        other = readers[view.op_kind[readers] != TC_FTENSOR2SCALARS]
        if len(other):  # its new value would need the size the file does not store
            k = int(idx[first_pair])
            raise _CopyProblem(k, f"copy destination {int(dst[k])} is a scalar of variable {var}, which record "
                                  f"{int(other[0])} reads as a tensor (only ftensor2scalars may read it)")
        outs = view.out_ids[view.out_ptr[op]:view.out_ptr[op + 1]].astype(np.int64)
        n = len(outs)
        members = by_group[bounds[gi]:bounds[gi + 1]]
        entries = outs.copy()
        entries[view.value_index[dst[idx[members]]]] = src[idx[members]]
        if n not in subs_value:
            c = np.arange(1, n + 1, dtype=np.int64).reshape(1, n)
            constants.append(c)
            kinds.append(CONST.id)
            op_attr.append(table_id(attrs, (("index", len(constants) - 1),), exact_key))
            ins.append(np.zeros(0, np.int64))
            vtypes.append(table_id(types, TensorType.of(c), lambda t: t))
            subs_value[n] = n_vals + len(vtypes) - 1
        kinds.append(TC_SCALARS2FTENSOR)
        op_attr.append(nout1)
        ins.append(np.concatenate([[subs_value[n]], entries]))
        vtypes.append(f64)
        group_value[gi] = n_vals + len(vtypes) - 1
        group_dest[gi] = var
    m = len(kinds)
    n_in_new = np.array([len(a) for a in ins], dtype=np.int64)
    emit = ~scal
    first_of_group = np.zeros(len(pairs), dtype=bool)
    first_of_group[idx[gfirst]] = True
    emit |= first_of_group
    rows = pairs.copy()
    rows[idx, 0] = group_value[group]
    rows[idx, 1] = group_dest[group]
    graph = Graph(
        op_kind=np.concatenate([view.op_kind, kinds]),
        op_attr=np.concatenate([view.op_attr, op_attr]),
        op_version=np.concatenate([view.op_version, np.zeros(m, np.int64)]),
        in_ptr=np.concatenate([view.in_ptr, view.in_ptr[-1] + np.cumsum(n_in_new)]),
        in_ids=np.concatenate([view.in_ids, *ins]),
        out_ptr=np.concatenate([view.out_ptr, view.out_ptr[-1] + np.arange(1, m + 1)]),
        out_ids=np.concatenate([view.out_ids, np.arange(n_vals, n_vals + m)]),
        value_type=np.concatenate([view.value_type, vtypes]),
        value_producer=np.concatenate([view.value_producer, np.arange(n_ops, n_ops + m)]),
        value_index=np.concatenate([view.value_index, np.zeros(m, np.int64)]),
        types=types, attrs=attrs, constants=constants,
        inputs=view.inputs, outputs=view.outputs, updates=rows[emit],
        symbols=view.symbols, file_meta=view.file_meta,
    )
    return graph, np.bincount(rec[emit], minlength=len(counts)).tolist()


def _file_view(graph: Graph) -> Graph | None:
    """The graph as its TensCalc file holds it, when it was read with copies into scalars and still fits them.

    That is the graph without the ops, values and constants the reader
    appended (:func:`_scalar_copies`) and with the file's copy pairs as
    ``updates`` (not a valid graph: only for writing); None when
    ``file_meta["cg_scalar_copies"]`` is absent or no longer describes the
    graph (then it is written as it is).
    """
    meta = graph.file_meta.get("cg_scalar_copies")
    if meta is None:
        return None
    try:
        n_ops, n_vals, n_consts, pairs, _rows = meta
        n_ops, n_vals, n_consts = int(n_ops), int(n_vals), int(n_consts)
        pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    except (TypeError, ValueError):
        return None
    if not (0 <= n_ops <= graph.num_ops and 0 <= n_vals <= graph.num_values
            and 0 <= n_consts <= len(graph.constants)) or (len(pairs) and (pairs.min() < 0 or pairs.max() >= n_vals)):
        return None
    sym = graph.symbols
    limits = {"values": n_vals, "ops": n_ops, "constants": n_consts}
    if any(k >= limits[f] for f in limits for k in getattr(sym, f)) or any(
            kind in ("value", "op", "constant") and idx >= limits[kind + "s"] for kind, idx in sym.descriptions):
        return None
    fm = {k: v for k, v in graph.file_meta.items() if k != "cg_scalar_copies"}
    view = Graph(
        op_kind=graph.op_kind[:n_ops], op_attr=graph.op_attr[:n_ops], op_version=graph.op_version[:n_ops],
        in_ptr=graph.in_ptr[:n_ops + 1], in_ids=graph.in_ids[:graph.in_ptr[n_ops]],
        out_ptr=graph.out_ptr[:n_ops + 1], out_ids=graph.out_ids[:graph.out_ptr[n_ops]],
        value_type=graph.value_type[:n_vals], value_producer=graph.value_producer[:n_vals],
        value_index=graph.value_index[:n_vals], types=graph.types, attrs=graph.attrs,
        constants=graph.constants[:n_consts], inputs=graph.inputs, outputs=graph.outputs, updates=pairs,
        symbols=sym, file_meta=fm,
    )
    try:
        writer = _Writer(view)  # its constant functions name only the file's constants
        unset = writer._unset_inputs()
        layout = writer._io_layout(len(view.inputs) - len(unset))
        counts = [c for t, c in layout if t == IO_COPY] if layout is not None else [1] * len(pairs)
        expected, _ = _scalar_copies(view, counts)
        if not (expected.equals(graph, check_names=True) and writer.plain()):
            return None
    except (GraphError, _CopyProblem, IndexError, ValueError):
        return None
    return view


class _Writer:
    def __init__(self, g: Graph, bodies: dict[Subgraph, int] | None = None) -> None:
        # bodies: .cgc record index of each subgraph of the top-level file, when g is one of them
        self.g = g
        self.meta = g.file_meta
        self.bodies = bodies
        self.embedded = bodies is not None
        n_ops, n_vals = g.num_ops, g.num_values
        if len(g.in_ptr) != n_ops + 1 or len(g.out_ptr) != n_ops + 1 or len(g.value_type) != n_vals:
            raise GraphError("graph arrays are inconsistent; verify() it first")
        # Per-op arrays only where they are needed: the files are written a chunk of ops at a
        # time (see _cg_stream), so that a 10^8-op graph is saved without full-size copies.
        self.is_const = g.op_kind == CONST.id
        self.const_ops = np.flatnonzero(self.is_const)
        # Constant index of each const op (from its attribute entry).
        self.const_idx = np.zeros(len(self.const_ops), dtype=np.int64)
        if len(self.const_ops):
            aids = np.unique(g.op_attr[self.const_ops])
            lut = np.full(len(g.attrs), -1, dtype=np.int64)
            for aid in aids.tolist():
                idx = dict(g.attrs[aid]).get("index", -1)
                if not (type(idx) is int and 0 <= idx < len(g.constants)):
                    raise GraphError(f"const op attribute {g.attrs[aid]!r} does not name a constant")
                lut[aid] = idx
            self.const_idx = lut[g.op_attr[self.const_ops]]
            c = self.const_ops
            bad = (g.in_ptr[c + 1] != g.in_ptr[c]) | (g.out_ptr[c + 1] - g.out_ptr[c] != 1)
            if bad.any():
                raise GraphError(f"const op {int(c[np.flatnonzero(bad)[0]])} must have no inputs and one output")

    # ---------------------------------------------------------- decisions
    def _meta_get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key, default)

    def _unset_inputs(self) -> list[int]:
        """Inputs that get no set gateway (honoured only as a tail of graph.inputs)."""
        unset = self._meta_get("cg_unset_inputs")
        if not unset:
            return []
        try:
            unset = [int(v) for v in unset]
        except (TypeError, ValueError):
            return []
        ins = self.g.inputs.tolist()
        if len(unset) <= len(ins) and ins[len(ins) - len(unset):] == unset:
            return unset
        return []

    def _plain_ok(self, set_vars: np.ndarray, gets: np.ndarray, base: int, unset: list[int],
                  sym_recs: list[tuple[int, int, str, str]]) -> bool:
        """True when the graph survives a write without the metadata record (see the module doc)."""
        g = self.g
        if self._meta_get("cg_opgraph_metadata", True) is not False:
            return False
        for k in np.unique(g.op_kind).tolist():
            if k == CONST.id:
                continue
            try:
                opdef = get_op(k)
            except KeyError:
                return False
            if opdef.family != "tenscalc":
                return False
        if np.any(g.op_version != 0):
            return False
        nc = ~self.is_const
        if nc.any():
            aids = g.op_attr[nc]
            nouts = np.diff(g.out_ptr)[nc]
            for aid in np.unique(aids).tolist():
                a = g.attrs[aid]
                if len(a) != 1 or a[0][0] != "nout" or type(a[0][1]) is not int:
                    return False
                if np.any(nouts[aids == aid] != a[0][1]):
                    return False
        # Types: constants' outputs exactly their constant's type, everything else f64[...].
        canon: dict[ValueType, int] = {}
        tid_canon = np.array([canon.setdefault(t, i) for i, t in enumerate(g.types)], dtype=np.int64)
        want = np.full(g.num_values, canon.get(F64_UNKNOWN, -1), dtype=np.int64)
        const_outs = g.out_ids[g.out_ptr[self.const_ops]]
        if len(self.const_ops):
            ctype = np.array([canon.get(TensorType.of(c), -2) for c in g.constants], dtype=np.int64)
            want[const_outs] = ctype[self.const_idx]
        have = tid_canon[g.value_type] if g.num_values else np.zeros(0, np.int64)
        if not np.array_equal(have, want):
            return False
        # Symbols: empty strings cannot be told apart from "no name" without metadata.
        sym = g.symbols
        for table in (sym.values, sym.ops, sym.constants, sym.io, sym.descriptions):
            if any(v == "" for v in table.values()):
                return False
        # The reader must find the same variables, unset inputs and index base.
        n_ref = 0
        for arr in (g.in_ids, g.out_ids, g.updates.reshape(-1)):
            if len(arr):
                n_ref = max(n_ref, int(arr.max()) + 1)
        n_ref = max([n_ref] + [idx + 1 for t, idx, _, _ in sym_recs if t == 3])
        produced = np.zeros(n_ref, dtype=bool)
        produced[g.out_ids] = True
        const_out = np.zeros(n_ref, dtype=bool)
        const_out[const_outs] = True
        if _detect_io_base(set_vars + base, gets + base, produced, const_out, _MAX_INDEX) != base:
            return False
        n_vals = max(n_ref, int(set_vars.max()) + 1 if len(set_vars) else 0,
                     int(gets.max()) + 1 if len(gets) else 0)
        if n_vals != g.num_values:
            return False
        is_set = np.zeros(n_vals, dtype=bool)
        is_set[set_vars] = True
        return bool(np.flatnonzero((g.value_producer < 0) & ~is_set).tolist() == unset)

    def _io_layout(self, n_sets: int) -> list[tuple[int, int]] | None:
        """.cgio records as (type, count), from file_meta when it fits, else None (one per variable)."""
        lay = self._meta_get("cg_io_records")
        if not lay:
            return None
        try:
            lay = [(int(t), int(c)) for t, c in lay]
        except (TypeError, ValueError):
            return None
        tot = {IO_SET: 0, IO_GET: 0, IO_COPY: 0}
        for t, c in lay:
            if t not in tot or c < 0:
                return None
            tot[t] += c
        g = self.g
        if (tot[IO_SET], tot[IO_GET]) != (n_sets, len(g.outputs)):
            return None
        if tot[IO_COPY] != len(g.updates):
            # Read with copies into scalars: a copy record of the file is that many update edges.
            scalar = self._meta_get("cg_scalar_copies")
            try:
                rows = [int(r) for r in scalar[4]] if scalar is not None else []
            except (TypeError, ValueError, IndexError):
                rows = []
            n_copy_records = sum(t == IO_COPY for t, _ in lay)
            if len(rows) != n_copy_records or sum(rows) != len(g.updates) or min(rows, default=0) < 0:
                return None
            it = iter(rows)
            lay = [(t, next(it) if t == IO_COPY else c) for t, c in lay]
        return lay

    # ---------------------------------------------------------- contents
    def _decide(self) -> tuple[Any, ...]:
        """What every file depends on: unset inputs, set and get variables, index base, .cgio layout,
        .cgs records and whether the metadata record is left out."""
        g = self.g
        unset = self._unset_inputs()
        set_vars = g.inputs[: len(g.inputs) - len(unset)].astype(np.int64)
        gets = g.outputs.astype(np.int64)
        base = self._meta_get("cg_io_base", 0)
        base = base if base in (0, 1) else 0
        layout = self._io_layout(len(set_vars))
        n_io = len(layout) if layout is not None else len(set_vars) + len(gets) + len(g.updates)
        sym_recs = self._symbol_records(n_io)
        plain = self._plain_ok(set_vars, gets, base, unset, sym_recs)
        return unset, set_vars, gets, base, layout, n_io, sym_recs, plain

    def plain(self) -> bool:
        """Whether the files are written without the metadata record (as TensCalc writes them)."""
        return bool(self._decide()[-1])

    def contents(self, index_bits: int | None) -> list[list[Any]]:
        g = self.g
        unset, set_vars, gets, base, layout, n_io, sym_recs, plain = self._decide()

        # .cgc records: (type, constant); each is encoded only when it is written.
        const_types = self._meta_get("cg_const_types")
        const_recs: list[tuple[int, np.ndarray]] = []
        for i, c in enumerate(g.constants):
            rtype = None
            if const_types is not None and len(const_types) == len(g.constants):
                t = const_types[i]
                if type(t) is int and _const_record_fits(t, c):
                    rtype = t
            if rtype is None:
                rtype = _const_record_default(c, plain)
            const_recs.append((rtype, c))
        body_recs: list[bytes] = []
        if not self.embedded:
            order = list(subgraphs_of(g, recursive=True))
            if order:  # each body once, after the constants (constant i stays record i)
                self.bodies = {body: len(g.constants) + k for k, body in enumerate(order)}
                body_recs = [_subgraph_record(body, self.bodies) for body in order]
        metadata = None if plain else self._metadata(base, unset, sym_recs)
        meta_len = sum(_chunk_len(x) for x in metadata) if metadata is not None else 0

        # Width: the largest integer any file holds.
        need = max(
            int(g.op_kind.max(initial=0)), _max_count(g.in_ptr), _max_count(g.out_ptr),
            g.num_values, len(g.constants), n_io, METADATA_RECORD, len(g.inputs) + len(g.outputs),
            2 * len(g.updates) + 2,
            max((_constant_length(t, c) for t, c in const_recs), default=0),
            meta_len,
            max((max(r[1], len(r[2]), len(r[3])) for r in sym_recs), default=0),
            *((SUBGRAPH_RECORD, max(len(r) for r in body_recs)) if body_recs else ()),
        )
        if index_bits is None:
            bits = self._meta_bits()
            if bits is None or need > _int_range(bits):
                bits = 32 if need <= _int_range(32) else 64
        else:
            bits = index_bits
            if need > _int_range(bits):
                raise ValueError(f"a {bits}-bit .cg file set cannot hold this graph: it needs integers up to "
                                 f"{need} (use index_bits=32 or 64)")
        dt = MAGIC_DTYPES[bits]
        magic = bytes([bits])

        cg = itertools.chain([magic], self._cg_stream(dt))
        cgc = itertools.chain([magic], self._cgc_stream(dt, const_recs, metadata, meta_len, body_recs))
        cgio = [magic, self._cgio_stream(dt, layout, set_vars + base, gets + base)]
        cgs = [magic]
        enc = self._encoding()
        for t, idx, name, desc in sym_recs:
            nb, db = name.encode(enc, "surrogatepass"), desc.encode(enc, "surrogatepass")
            cgs.append(np.array([t, idx, len(nb), len(db)], dtype=dt).tobytes())
            cgs.append(nb + db)
        return [cg, cgc, cgio, cgs]

    def _meta_bits(self) -> int | None:
        bits = self._meta_get("cg_index_bits")
        if isinstance(bits, dict):
            bits = bits.get("cg")
        return bits if type(bits) is int and bits in MAGIC_DTYPES else None

    def _encoding(self) -> str:
        enc = self._meta_get("cg_text_encoding", "utf-8")
        if enc != "latin-1":
            return "utf-8"
        sym = self.g.symbols
        texts = [*sym.values.values(), *sym.ops.values(), *sym.constants.values(), *sym.io.values(),
                 *sym.descriptions.values()]
        try:
            for s in texts:
                s.encode("latin-1")
        except UnicodeEncodeError:
            return "utf-8"
        return "latin-1"

    def _cg_stream(self, dt: np.dtype) -> Iterator[np.ndarray]:
        """The .cg integers, a chunk of ops at a time (no per-op Python objects, no full-size copy)."""
        g = self.g
        n_ops = g.num_ops
        if n_ops == 0:
            return
        k = int(g.in_ptr[1] - g.in_ptr[0])
        m = int(g.out_ptr[1] - g.out_ptr[0])
        if not len(self.const_ops) and _all_counts(g.in_ptr, k) and _all_counts(g.out_ptr, m):
            # Every record has the same shape: fill columns of a 2-D block.
            step = max(1, _CHUNK // (3 + k + m))
            for lo in range(0, n_ops, step):
                hi = min(n_ops, lo + step)
                rows = np.empty((hi - lo, 3 + k + m), dtype=dt)
                rows[:, 0] = g.op_kind[lo:hi]
                rows[:, 1] = k
                rows[:, 2] = m
                rows[:, 3:3 + k] = g.in_ids[lo * k:hi * k].reshape(hi - lo, k)
                rows[:, 3 + k:] = g.out_ids[lo * m:hi * m].reshape(hi - lo, m)
                yield rows.reshape(-1)
            return
        for lo, hi in _op_chunks(n_ops, g.in_ptr, g.out_ptr):
            n_in = np.diff(g.in_ptr[lo:hi + 1])
            n_out = np.diff(g.out_ptr[lo:hi + 1])
            is_const = self.is_const[lo:hi]
            # Constant functions are [0, constant, output].
            c0, c1 = np.searchsorted(self.const_ops, [lo, hi])
            cops = self.const_ops[c0:c1] - lo
            second, third = n_in.copy(), n_out.copy()
            second[cops] = self.const_idx[c0:c1]
            third[cops] = g.out_ids[g.out_ptr[lo + cops]]
            rec_len = np.where(is_const, 3, 3 + n_in + n_out)
            starts = np.zeros(hi - lo + 1, dtype=np.int64)
            np.cumsum(rec_len, out=starts[1:])
            s = starts[:-1]
            buf = np.empty(int(starts[-1]), dtype=dt)
            buf[s] = g.op_kind[lo:hi]
            buf[s + 1] = second
            buf[s + 2] = third
            buf[_ranges(s + 3, s + 3 + n_in)] = g.in_ids[g.in_ptr[lo]:g.in_ptr[hi]]
            o_start = s + 3 + n_in
            if not len(cops):
                buf[_ranges(o_start, o_start + n_out)] = g.out_ids[g.out_ptr[lo]:g.out_ptr[hi]]
            else:
                nc = ~is_const
                ptr = g.out_ptr[lo:hi + 1]
                buf[_ranges(o_start[nc], o_start[nc] + n_out[nc])] = g.out_ids[_ranges(ptr[:-1][nc], ptr[1:][nc])]
            yield buf

    def _cgc_stream(self, dt: np.dtype, const_recs: list[tuple[int, np.ndarray]], metadata: list[Any] | None,
                    meta_len: int, body_recs: Sequence[bytes] = ()) -> Iterator[Any]:
        """The .cgc records after the magic byte; each constant is encoded as it is written."""
        for rtype, c in const_recs:
            data = _encode_constant(rtype, c)
            yield np.array([rtype, len(data)], dtype=dt).tobytes()
            yield data
        for data in body_recs:
            yield np.array([SUBGRAPH_RECORD, len(data)], dtype=dt).tobytes()
            yield data
        if metadata is not None:
            yield np.array([METADATA_RECORD, meta_len], dtype=dt).tobytes()
            for part in metadata:
                if isinstance(part, tuple):  # (array, dtype): converted a chunk at a time
                    arr, to = part
                    for lo in range(0, len(arr), _CHUNK):
                        yield arr[lo:lo + _CHUNK].astype(to)
                else:
                    yield part

    def _cgio_stream(self, dt: np.dtype, layout: list[tuple[int, int]] | None,
                     sets: np.ndarray, gets: np.ndarray) -> np.ndarray:
        ups = self.g.updates.astype(np.int64)
        if layout is None:
            parts = []
            if len(gets):
                parts.append(np.stack([np.full(len(gets), IO_GET), np.ones(len(gets), np.int64), gets], 1).ravel())
            if len(sets):
                parts.append(np.stack([np.full(len(sets), IO_SET), np.ones(len(sets), np.int64), sets], 1).ravel())
            if len(ups):
                parts.append(np.concatenate([np.full((len(ups), 1), IO_COPY), np.ones((len(ups), 1), np.int64),
                                             ups], 1).ravel())
            return np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)
        out: list[int] = []
        pos = {IO_SET: 0, IO_GET: 0, IO_COPY: 0}
        for t, c in layout:
            out += [t, c]
            p = pos[t]
            if t == IO_SET:
                out += sets[p:p + c].tolist()
            elif t == IO_GET:
                out += gets[p:p + c].tolist()
            else:
                out += ups[p:p + c, 0].tolist() + ups[p:p + c, 1].tolist()
            pos[t] = p + c
        return np.array(out, dtype=dt)

    def _symbol_records(self, n_io: int) -> list[tuple[int, int, str, str]]:
        g = self.g
        sym = g.symbols
        limits = {1: len(g.constants), 2: g.num_ops, 3: g.num_values, 4: n_io}
        keys: set[tuple[int, int]] = set()
        for t, field in _SYM_FIELD.items():
            for k in getattr(sym, field):
                keys.add((t, int(k)))
        for kind, idx in sym.descriptions:
            if kind not in SYM_TYPE:
                raise GraphError(f"description key ({kind!r}, {idx}): kind must be one of {sorted(SYM_TYPE)}")
            keys.add((SYM_TYPE[kind], int(idx)))
        for t, idx in keys:
            if not 0 <= idx < limits[t]:
                raise GraphError(f"{SYM_KIND[t]} symbol index {idx} is out of range ({limits[t]} exist)")
        order = None
        meta_order = self._meta_get("cg_cgs_order")
        if meta_order:
            try:
                cand = [(int(t), int(i)) for t, i in meta_order]
            except (TypeError, ValueError):
                cand = None
            if cand is not None and keys <= set(cand) and all(
                    t in limits and 0 <= i < limits[t] for t, i in cand):
                order = cand
        if order is None:
            order = sorted(keys)
        recs = []
        for t, idx in order:
            name = getattr(sym, _SYM_FIELD[t]).get(idx, "")
            desc = sym.descriptions.get((SYM_KIND[t], idx), "")
            if not isinstance(name, str) or not isinstance(desc, str):
                raise GraphError(f"{SYM_KIND[t]} {idx}: names and descriptions must be strings")
            recs.append((t, idx, name, desc))
        return recs

    def _metadata(self, base: int, unset: list[int], sym_recs: list[tuple[int, int, str, str]]) -> list[Any]:
        g = self.g
        # The record: int64 J, J bytes of JSON, padding, then the arrays (as (array, dtype) parts,
        # converted a chunk at a time when written).
        arrays: dict[str, Any] = {}
        blobs: list[Any] = []
        offset = 0
        for name, arr in (("op_attr", g.op_attr), ("op_version", g.op_version), ("value_type", g.value_type)):
            if len(arr) == 0 or (arr.min() == arr.max()):
                arrays[name] = {"fill": int(arr[0]) if len(arr) else 0}
                continue
            lo, hi = int(arr.min()), int(arr.max())
            dt = next(d for d in ("<i1", "<i2", "<i4", "<i8")
                      if np.iinfo(d).min <= lo and hi <= np.iinfo(d).max)
            size = len(arr) * np.dtype(dt).itemsize
            arrays[name] = {"dtype": dt, "offset": offset, "count": len(arr)}
            pad = -size % 8
            blobs += [(arr, np.dtype(dt)), b"\0" * pad]
            offset += size + pad
        sym = g.symbols
        empty = []
        for t, idx, _, _ in sym_recs:
            n_set = getattr(sym, _SYM_FIELD[t]).get(idx) == ""
            d_set = sym.descriptions.get((SYM_KIND[t], idx)) == ""
            if n_set or d_set:
                empty.append([t, idx, n_set, d_set])
        header = {
            "format": "opgraph.cg",
            "version": METADATA_VERSION,
            "index_base": base,
            "num_ops": g.num_ops,
            "num_values": g.num_values,
            "num_constants": len(g.constants),
            "num_inputs": len(g.inputs),
            "num_outputs": len(g.outputs),
            "num_updates": len(g.updates),
            "types": [_enc_type(t) for t in g.types],
            "attrs": [[[k, _enc_attr(v, self.bodies)] for k, v in a] for a in g.attrs],
            "arrays": arrays,
            "unset_inputs": unset,
            "empty_symbols": empty,
        }
        # user kinds are stored by id; their names let a process that has not registered them say which op it lacks
        user = {str(k): get_op(k).name for k in np.unique(g.op_kind).tolist() if k >= USER_IDS}
        if user:
            header["op_names"] = user
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
        pad = -(8 + len(text)) % 8
        return [struct.pack("<q", len(text)) + text + b"\0" * pad, *blobs]


def _joined(chunks: Iterable[Any]) -> bytes:
    return b"".join(bytes(memoryview(c).cast("B")) if isinstance(c, np.ndarray) else bytes(c) for c in chunks)


def _subgraph_record(body: Subgraph, bodies: dict[Subgraph, int]) -> bytes:
    """The data of a subgraph record: int64 J, J bytes of ASCII JSON, then the body's four files."""
    files = [_joined(chunks) for chunks in _Writer(body.graph, bodies).contents(None)]
    header = {"format": SUBGRAPH_FORMAT, "version": SUBGRAPH_VERSION, "name": body.name,
              "files": [len(f) for f in files]}
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return struct.pack("<q", len(text)) + text + b"".join(files)


# ============================================================== loading
def load_cg(path: str | os.PathLike[str], *, mmap: bool = True) -> Graph:
    """Read a .cg file set (ours or TensCalc's) into a verified :class:`Graph`.

    ``path`` is the base name or any of the four file names. ``mmap`` maps
    large files instead of reading them. Never executes code; every length
    and index is checked before use. Any problem raises one
    :class:`~opgraph.errors.FormatError` naming the file, record and byte offset.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> for s in (".cg", ".cgc", ".cgio", ".cgs"):
    ...     _ = open(os.path.join(d, "bad" + s), "wb").write(bytes([33]))
    >>> load_cg(os.path.join(d, "bad"))
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: .../bad.cg: record 0 at byte offset 0: bad magic byte 33 (expected 16, ...)
    """
    base = _base_path(path)
    where = _Where()
    try:
        with progress.task(f"loading {base}.cg"):
            return _Reader(base, mmap, where).read()
    except FormatError:
        raise
    except (OSError, MemoryError):
        raise
    except Exception as exc:  # a check we missed: still one FormatError, with the place we were at
        err = FormatError(f"{where.path}: record {where.record} at byte offset {where.offset}: "
                          f"malformed ({type(exc).__name__}: {exc})")
        err.unexpected = True  # type: ignore[attr-defined]
        raise err from exc


class _Reader:
    def __init__(self, base: str, use_mmap: bool, where: _Where,
                 embedded: tuple[dict[str, np.ndarray], dict[int, Subgraph]] | None = None) -> None:
        # embedded: the four files of a subgraph record (by suffix) and the bodies before it
        self.base = base
        self.where = where
        self.embedded = embedded is not None
        self.bodies: dict[int, Subgraph] = dict(embedded[1]) if embedded is not None else {}
        self.files: dict[str, _File] = {}
        for s in SUFFIXES:
            where.at(base + s)
            self.files[s] = _File(base + s, s, use_mmap, None if embedded is None else embedded[0][s])
        self.cg, self.cgc, self.cgio, self.cgs = (self.files[s] for s in SUFFIXES)
        self.file_meta: dict[str, Any] = {}

    # ---------------------------------------------------------- .cg
    def _read_cg(self) -> None:
        # Ids go straight into int32 arrays (the Graph's own) a chunk at a time, so that the
        # temporaries stay small however large the file is; pointers are int64. Record starts
        # are kept only when records differ in length (int32 where they fit).
        f = self.cg
        self.where.at(f.path, 0, 1)
        a = f.ints()
        self.a = a
        layout = _CgLayout(a)
        self.rec_len = layout.uniform_length()
        if self.rec_len is None:
            starts = _scan_file(f, layout, np.int32 if len(a) <= _MAX_INDEX else np.int64)
            self.starts: np.ndarray | None = starts
            n_ops = len(starts)
        else:
            _check_whole(f, len(a) // self.rec_len)
            self.starts = None
            n_ops = len(a) // self.rec_len
        self.n_ops = n_ops
        if n_ops > _MAX_INDEX:
            _fail(f.path, _MAX_INDEX, f.byte_of(self._op_start(_MAX_INDEX)), "too many functions")
        self.bad_ids: dict[str, tuple[int, int]] = {}
        self.const_ops = np.zeros(0, np.int64)
        self.const_ref = np.zeros(0, np.int64)
        if self.rec_len is not None:
            k = int(a[1]) if n_ops else 0
            m = int(a[2]) if n_ops else 0
            rows = a.reshape(n_ops, self.rec_len)
            kind = np.ascontiguousarray(rows[:, 0])
            n_out = np.full(n_ops, m, dtype=np.int32)
            in_ptr = np.arange(0, k * n_ops + 1, max(k, 1), dtype=np.int64) if k else np.zeros(n_ops + 1, np.int64)
            out_ptr = np.arange(0, m * n_ops + 1, max(m, 1), dtype=np.int64) if m else np.zeros(n_ops + 1, np.int64)
            in_ids = np.empty(k * n_ops, dtype=np.int32)
            out_ids = np.empty(m * n_ops, dtype=np.int32)
            step = max(1, _CHUNK // self.rec_len)
            for lo in range(0, n_ops, step):
                blk = rows[lo:lo + step]
                self._store_ids(in_ids, lo * k, blk[:, 3:3 + k].reshape(-1), "input")
                self._store_ids(out_ids, lo * m, blk[:, 3 + k:].reshape(-1), "output")
        else:
            assert starts is not None
            kind = a[starts]
            n_in = a[1:][starts] if n_ops else np.zeros(0, a.dtype)
            n_out = a[2:][starts] if n_ops else np.zeros(0, a.dtype)
            is_const = kind == 0
            if is_const.any():
                self.const_ops = np.flatnonzero(is_const)
                self.const_ref = n_in[self.const_ops].astype(np.int64)
                n_in[self.const_ops] = 0
                n_out[self.const_ops] = 1
            del is_const
            in_ptr = np.zeros(n_ops + 1, dtype=np.int64)
            np.cumsum(n_in, dtype=np.int64, out=in_ptr[1:])
            out_ptr = np.zeros(n_ops + 1, dtype=np.int64)
            np.cumsum(n_out, dtype=np.int64, out=out_ptr[1:])
            del n_in
            in_ids = self._gather(in_ptr, lambda lo, hi: starts[lo:hi].astype(np.int64) + 3, "input")
            # A constant function's output is its third integer; any other's follows its inputs.
            out_ids = self._gather(out_ptr, lambda lo, hi: starts[lo:hi].astype(np.int64) + np.where(
                kind[lo:hi] == 0, 2, 3 + np.diff(in_ptr[lo:hi + 1])), "output")
        self.kind, self.n_out = kind, n_out
        self.in_ptr, self.out_ptr, self.in_ids, self.out_ids = in_ptr, out_ptr, in_ids, out_ids

    def _gather(self, ptr: np.ndarray, first: Callable[[int, int], np.ndarray], role: str) -> np.ndarray:
        """The ids of records ``lo..hi`` at ``a[first(lo, hi)[i] + j]``, ``j < ptr[i+1] - ptr[i]``, as int32.

        Works through the records in chunks of about ``_CHUNK`` ids.
        """
        n = len(ptr) - 1
        out = np.empty(int(ptr[-1]), dtype=np.int32)
        lo = 0
        while lo < n:
            hi = int(np.searchsorted(ptr, ptr[lo] + _CHUNK, side="right")) - 1
            hi = min(n, lo + _CHUNK, max(hi, lo + 1))
            s = first(lo, hi)
            self._store_ids(out, int(ptr[lo]), self.a[_ranges(s, s + np.diff(ptr[lo:hi + 1]))], role)
            lo = hi
        return out

    def _store_ids(self, out: np.ndarray, at: int, ids: np.ndarray, role: str) -> None:
        """Copy variable ids into ``out[at:]``, remembering the first one out of range (reported later)."""
        if len(ids) == 0:
            return
        if role not in self.bad_ids:
            bad = (ids < 0) | (ids >= self.limit)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                self.bad_ids[role] = (at + k, int(ids[k]))
        np.copyto(out[at:at + len(ids)], ids, casting="unsafe")

    def _op_start(self, op: int) -> int:
        """Integer position of record ``op`` in the .cg body."""
        if self.rec_len is not None:
            return op * self.rec_len
        if self.starts is None:  # released after building the graph: find the records again
            self.starts = _scan_file(self.cg, _CgLayout(self.a))
        return int(self.starts[op])

    def _cg_fail(self, op: int, message: str) -> NoReturn:
        _fail(self.cg.path, op, self.cg.byte_of(self._op_start(op)), message)

    # ---------------------------------------------------------- .cgc
    def _read_cgc(self) -> None:
        f = self.cgc
        body, w, dt = f.body, f.w, f.dtype
        n = len(body)
        pos = 0
        rec = 0
        self.constants: list[np.ndarray] = []
        self.const_types: list[int] = []
        self.metadata: tuple[int, int, np.ndarray] | None = None
        while pos < n:
            off = 1 + pos
            self.where.at(f.path, rec, off)
            if self.metadata is not None:
                _fail(f.path, rec, off, "a record follows the opgraph metadata record (it must be last)")
            if pos + 2 * w > n:
                _fail(f.path, rec, off, "constant header runs past the end of the file (truncated)")
            rtype, length = (int(x) for x in body[pos:pos + 2 * w].view(dt))
            if length < 0:
                _fail(f.path, rec, off, f"negative data length {length}")
            if length > n - pos - 2 * w:
                _fail(f.path, rec, off, f"data length {length} runs past the end of the file "
                                        f"({n - pos - 2 * w} bytes left; truncated?)")
            data = body[pos + 2 * w:pos + 2 * w + length]
            if rtype == METADATA_RECORD:
                self.metadata = (rec, off, data)
            elif rtype == SUBGRAPH_RECORD:
                if self.embedded:
                    _fail(f.path, rec, off, "a subgraph record inside a subgraph record (every body is stored "
                                            "once, in the top-level .cgc file)")
                self.bodies[rec] = self._read_subgraph(rec, off, off + 2 * w, data)
            else:
                if self.bodies and not self.embedded:
                    _fail(f.path, rec, off, f"constant record (type {rtype}) after a subgraph record (constants come "
                                            f"first: constant i is record i)")
                def fail(msg: str, rec: int = rec, off: int = off) -> NoReturn:
                    _fail(f.path, rec, off, msg)

                self.constants.append(_decode_constant(rtype, data, fail))
                self.const_types.append(rtype)
            pos += 2 * w + length
            rec += 1

    def _read_subgraph(self, rec: int, off: int, data_off: int, data: np.ndarray) -> Subgraph:
        """A subgraph record: int64 J, J bytes of JSON (format, version, name, file lengths), the four files."""
        path = self.cgc.path

        def fail(msg: str) -> NoReturn:
            _fail(path, rec, off, f"subgraph record: {msg}")

        n = len(data)
        if n < 8:
            fail(f"{n} bytes, shorter than its int64 header length")
        j = int(data[:8].view("<i8")[0])
        if not 0 <= j <= n - 8:
            fail(f"JSON length {j} does not fit the record ({n} bytes)")
        try:
            header = json.loads(data[8:8 + j].tobytes().decode("ascii"))
        except (ValueError, RecursionError) as exc:
            fail(f"bad JSON header ({exc})"[:300])
        if not isinstance(header, dict) or header.get("format") != SUBGRAPH_FORMAT:
            fail(f"not an opgraph subgraph header (format {SUBGRAPH_FORMAT!r})")
        if header.get("version") != SUBGRAPH_VERSION:
            fail(f"unsupported version {header.get('version')!r} (this reader knows {SUBGRAPH_VERSION}; "
                 f"written by a newer opgraph?)"[:300])
        name, sizes = header.get("name"), header.get("files")
        if not isinstance(name, str):
            fail("the name must be a string")
        if not (isinstance(sizes, list) and len(sizes) == 4 and all(type(x) is int and x >= 0 for x in sizes)):
            fail(f"'files' must be the four file lengths, got {sizes!r}"[:300])
        if 8 + j + sum(sizes) != n:
            fail(f"the files' lengths {sizes} and the header ({8 + j} bytes) do not add up to the record's {n} bytes")
        parts: dict[str, np.ndarray] = {}
        at = 8 + j
        label = f"{path}: record {rec} at byte offset {off}: subgraph {name[:100]!r}: embedded "
        for suffix, size in zip(SUFFIXES, sizes, strict=True):
            parts[suffix] = data[at:at + size]
            at += size
        body_offsets = ", ".join(f"{s} at byte offset {data_off + 8 + j + sum(sizes[:i])}"
                                 for i, s in enumerate(SUFFIXES))
        try:
            graph = _Reader(label, False, self.where, (parts, self.bodies)).read()
        except FormatError as exc:
            raise FormatError(f"{exc} (the embedded files start in {path}: {body_offsets})") from exc
        return Subgraph(graph, name=name)

    def _meta_fail(self, message: str) -> NoReturn:
        assert self.metadata is not None
        _fail(self.cgc.path, self.metadata[0], self.metadata[1], f"opgraph metadata: {message}")

    def _read_metadata(self) -> dict[str, Any] | None:
        if self.metadata is None:
            return None
        rec, off, data = self.metadata
        self.where.at(self.cgc.path, rec, off)
        if len(data) < 8:
            self._meta_fail("record shorter than its header")
        j = int(data[:8].view("<i8")[0])
        if not 0 <= j <= len(data) - 8:
            self._meta_fail(f"JSON length {j} does not fit the record ({len(data)} bytes)")
        try:
            header = json.loads(data[8:8 + j].tobytes().decode("ascii"))
        except (ValueError, RecursionError) as exc:
            self._meta_fail(f"bad JSON header ({exc})")
        if not isinstance(header, dict) or header.get("format") != "opgraph.cg":
            self._meta_fail("not an opgraph metadata header")
        if header.get("version") != METADATA_VERSION:
            self._meta_fail(f"unsupported version {header.get('version')!r} (this reader knows {METADATA_VERSION})")
        self.blob_start = 8 + j + (-(8 + j) % 8)
        return header

    def _meta_array(self, header: dict[str, Any], name: str, count: int, table: int | None) -> np.ndarray:
        spec = header.get("arrays", {}).get(name) if isinstance(header.get("arrays"), dict) else None
        if not isinstance(spec, dict):
            self._meta_fail(f"array {name} missing")
        if set(spec) == {"fill"}:
            v = spec["fill"]
            if type(v) is not int or not -(2**31) <= v < 2**31:
                self._meta_fail(f"array {name}: bad fill value {v!r}")
            out = np.full(count, v, dtype=np.int32)
        else:
            dt, o, c = spec.get("dtype"), spec.get("offset"), spec.get("count")
            if dt not in ("<i1", "<i2", "<i4", "<i8") or type(o) is not int or type(c) is not int:
                self._meta_fail(f"array {name}: bad description {spec!r}"[:300])
            if c != count:
                self._meta_fail(f"array {name} has {c} entries, the files have {count}")
            assert self.metadata is not None
            data = self.metadata[2]
            start = self.blob_start + o
            size = np.dtype(dt).itemsize * c
            if o < 0 or start + size > len(data):
                self._meta_fail(f"array {name} ({size} bytes at {o}) runs past the end of the record")
            vals = data[start:start + size].view(dt)
            if len(vals) and (int(vals.min()) < -(2**31) or int(vals.max()) >= 2**31):
                self._meta_fail(f"array {name} holds values outside int32")
            out = vals.astype(np.int32)
        if table is not None and len(out) and (int(out.min()) < 0 or int(out.max()) >= table):
            bad = int(np.flatnonzero((out < 0) | (out >= table))[0])
            self._meta_fail(f"{name}[{bad}] = {int(out[bad])} is not in its table ({table} entries)")
        return out

    # ---------------------------------------------------------- .cgio
    def _read_cgio(self) -> None:
        f = self.cgio
        self.where.at(f.path, 0, 1)
        a = f.ints()
        starts = _scan_file(f, _CgioLayout(a))
        self.io_starts = starts
        t = a[starts].astype(np.int64)
        cnt = a[starts + 1].astype(np.int64) if len(starts) else np.zeros(0, np.int64)
        self.io_type, self.io_count = t, cnt

        def take(kind: int) -> tuple[np.ndarray, np.ndarray]:
            sel = t == kind
            s = starts[sel] + 2
            ids = a[_ranges(s, s + cnt[sel])].astype(np.int64)
            rec = np.repeat(np.flatnonzero(sel), cnt[sel])
            return ids, rec

        self.sets, self.set_rec = take(IO_SET)
        self.gets, self.get_rec = take(IO_GET)
        sel = t == IO_COPY
        s = starts[sel] + 2
        c = cnt[sel]
        self.copy_src = a[_ranges(s, s + c)].astype(np.int64)
        self.copy_dst = a[_ranges(s + c, s + 2 * c)].astype(np.int64)
        self.copy_rec = np.repeat(np.flatnonzero(sel), c)

    def _io_fail(self, rec: int, message: str) -> NoReturn:
        _fail(self.cgio.path, rec, self.cgio.byte_of(int(self.io_starts[rec])), message)

    # ---------------------------------------------------------- .cgs
    def _read_cgs(self) -> None:
        f = self.cgs
        self.where.at(f.path, 0, 1)
        layout = _CgsLayout(f.body, f.w, f.dtype)
        starts = _scan_file(f, layout)
        w = f.w
        recs: list[tuple[int, int, int, int, int]] = []  # type, index, name start, name len, desc len
        for p in starts.tolist():
            t, idx, nl, dl = layout.header(p)
            recs.append((t, idx, p + 4 * w, nl, dl))
        self.sym_starts = starts
        self.sym_recs = recs
        raw = f.body.tobytes() if len(recs) else b""
        texts: list[tuple[bytes, bytes]] = [(raw[s:s + nl], raw[s + nl:s + nl + dl]) for _, _, s, nl, dl in recs]
        enc = "utf-8"
        try:
            for nm, ds in texts:
                nm.decode("utf-8", "surrogatepass")
                ds.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            enc = "latin-1"
        self.sym_text = [(nm.decode(enc, "surrogatepass" if enc == "utf-8" else "strict"),
                          ds.decode(enc, "surrogatepass" if enc == "utf-8" else "strict")) for nm, ds in texts]
        self.text_encoding = enc

    def _sym_fail(self, rec: int, message: str) -> NoReturn:
        _fail(self.cgs.path, rec, 1 + int(self.sym_starts[rec]), message)

    # ---------------------------------------------------------- all together
    def read(self) -> Graph:
        g = self._build()
        # Only the graph stays: what the reader kept for messages goes before verification
        # (record starts are found again if a problem needs one).
        self.n_out = self.in_ids = self.out_ids = None  # type: ignore[assignment]
        if self.rec_len is None:
            self.starts = None
        self._verify(g)
        return g

    def _build(self) -> Graph:
        # Limit on the number of variables: what the files can describe.
        self.limit = limit = min(len(self.cg.body) // self.cg.w + len(self.cgio.body) // self.cgio.w
                                 + len(self.cgs.body) + 1, _MAX_INDEX)
        self._read_cg()
        self._read_cgc()
        header = self._read_metadata()
        self._read_cgio()
        self._read_cgs()
        n_ops = self.n_ops
        nconst = len(self.constants)
        fm = self.file_meta
        bits = {s.lstrip("."): self.files[s].bits for s in SUFFIXES}
        fm["cg_index_bits"] = bits["cg"] if len(set(bits.values())) == 1 else bits
        fm["cg_opgraph_metadata"] = header is not None

        # Function types and constant references.
        kinds = np.unique(self.kind)
        opdefs: dict[int, OpDef] = {}
        saved = header.get("op_names") if header is not None else None
        saved = saved if isinstance(saved, dict) else {}
        for k in kinds.tolist():
            try:
                opdefs[k] = get_op(k) if k < 2**31 else None  # type: ignore[assignment]
            except KeyError:
                opdefs[k] = None  # type: ignore[assignment]
            name = saved.get(str(k))
            name = name if isinstance(name, str) else None
            if opdefs[k] is None:
                self._cg_fail(int(np.flatnonzero(self.kind == k)[0]),
                              unknown_op_message(k, saved_name=name and name[:200], called="function type"))
            if name is not None and opdefs[k].name != name:
                self._cg_fail(int(np.flatnonzero(self.kind == k)[0]),
                              f"function type {k} was op {name!r} when saved; this process registers "
                              f"{opdefs[k].name!r} under that id")
        self.kind = self.kind.astype(np.int32, copy=False)
        if len(self.const_ops):
            bad = (self.const_ref < 0) | (self.const_ref >= nconst)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                self._cg_fail(int(self.const_ops[k]), f"constant record {int(self.const_ref[k])} does not exist "
                                                      f"({self.cgc.path} has {nconst} constants)")

        # Metadata counts against the files.
        if header is not None:
            for key, have in (("num_ops", n_ops), ("num_constants", nconst)):
                if header.get(key) != have:
                    self._meta_fail(f"{key} is {header.get(key)!r}, the files hold {have}")
            nv = header.get("num_values")
            if type(nv) is not int or not 0 <= nv <= limit:
                self._meta_fail(f"num_values {nv!r} is not a count the files can describe (at most {limit})")
            base = header.get("index_base")
            if base not in (0, 1):
                self._meta_fail(f"index_base {base!r} (0 or 1)")

        # Variable indices of .cg in range.
        for ptr, role in ((self.in_ptr, "input"), (self.out_ptr, "output")):
            if role in self.bad_ids:  # found while the ids were read
                k, v = self.bad_ids[role]
                self._cg_fail(int(np.searchsorted(ptr, k, side="right") - 1), f"{role} variable {v} is out of range")
        for ids, recs, what in ((self.copy_src, self.copy_rec, "copy source"),
                                (self.copy_dst, self.copy_rec, "copy destination")):
            bad = (ids < 0) | (ids >= limit)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                self._io_fail(int(recs[k]), f"{what} variable {int(ids[k])} is out of range")
        n_ref = 0
        for arr in (self.in_ids, self.out_ids, self.copy_src, self.copy_dst):
            if len(arr):
                n_ref = max(n_ref, int(arr.max()) + 1)
        for i, (t, idx, _, _, _) in enumerate(self.sym_recs):
            if t == 3:
                if idx >= limit:
                    self._sym_fail(i, f"variable index {idx} is out of range")
                n_ref = max(n_ref, idx + 1)

        # Producers (each variable at most once).
        out_ids, n_out = self.out_ids, self.n_out
        single = n_ops > 0 and n_out.min() == 1 and n_out.max() == 1
        producer = np.full(n_ref, -1, dtype=np.int32)
        if len(out_ids):
            rows = np.arange(n_ops, dtype=np.int32) if single else np.repeat(np.arange(n_ops, dtype=np.int32), n_out)
            producer[out_ids] = rows
            clash = producer[out_ids] != rows
            if clash.any():
                k = int(np.flatnonzero(clash)[0])
                v, first, later = int(out_ids[k]), int(rows[k]), int(producer[out_ids[k]])
                self._cg_fail(max(first, later), f"variable {v} is produced twice "
                                                 f"(also by record {min(first, later)})")
            del rows, clash
        produced = producer >= 0
        const_out = np.zeros(n_ref, dtype=bool)
        if len(out_ids) and len(self.const_ops):
            const_out[out_ids[self.out_ptr[self.const_ops]]] = True

        # Index base of set/get gateways.
        if header is not None:
            base = header["index_base"]
        else:
            found = _detect_io_base(self.sets, self.gets, produced, const_out, limit)
            if found is None:
                self._explain_io(produced, limit)
            base = found
        fm["cg_io_base"] = base
        sets, gets = self.sets - base, self.gets - base
        for ids, recs, what in ((sets, self.set_rec, "set"), (gets, self.get_rec, "get")):
            bad = (ids < 0) | (ids >= limit)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                self._io_fail(int(recs[k]), f"{what} variable {int(ids[k]) + base} is out of range")
        n_vals = max(n_ref, int(sets.max()) + 1 if len(sets) else 0, int(gets.max()) + 1 if len(gets) else 0)
        if header is not None:
            if header["num_values"] < n_vals:
                self._meta_fail(f"num_values is {header['num_values']}, the files refer to variable {n_vals - 1}")
            n_vals = header["num_values"]
        value_producer = producer if n_vals == n_ref else \
            np.concatenate([producer, np.full(n_vals - n_ref, -1, dtype=np.int32)])
        del producer, produced
        if len(sets):
            hit = value_producer[sets] >= 0
            if hit.any():
                k = int(np.flatnonzero(hit)[0])
                self._io_fail(int(self.set_rec[k]), f"set variable {int(sets[k])} is produced by a function")
        value_index = np.zeros(n_vals, dtype=np.int32)
        if len(out_ids) and not single:
            value_index[out_ids] = np.arange(len(out_ids)) - np.repeat(self.out_ptr[:-1], n_out)

        # Inputs: set gateways, then variables nobody produces or sets.
        is_set = np.zeros(n_vals, dtype=bool)
        is_set[sets] = True
        if np.count_nonzero(is_set) != len(sets):
            _, first = np.unique(sets, return_index=True)
            k = int(np.setdiff1d(np.arange(len(sets)), first)[0])
            self._io_fail(int(self.set_rec[k]), f"variable {int(sets[k])} is set twice")
        if header is not None:
            unset = header.get("unset_inputs", [])
            if not isinstance(unset, list) or not all(type(v) is int and 0 <= v < n_vals for v in unset):
                self._meta_fail("bad unset_inputs")
            unset_arr = np.asarray(unset, dtype=np.int64)
            if len(unset_arr) and (is_set[unset_arr].any() or (value_producer[unset_arr] >= 0).any()
                                   or len(np.unique(unset_arr)) != len(unset_arr)):
                self._meta_fail("unset_inputs lists a variable that is set, produced or listed twice")
        else:
            unset_arr = np.flatnonzero((value_producer < 0) & ~is_set).astype(np.int64)
        inputs = np.concatenate([sets, unset_arr])
        is_input = is_set
        is_input[unset_arr] = True
        bad = ~is_input[self.copy_dst] if len(self.copy_dst) else np.zeros(0, bool)
        # TensCalc's saveScalarized copies into the scalars of set variables (their ftensor2scalars
        # outputs): such copies are checked and made update edges by _scalar_copies, at the end.
        scalar_copy = bad if header is None else np.zeros(len(bad), bool)
        if bad.any() and not scalar_copy.any():
            k = int(np.flatnonzero(bad)[0])
            self._io_fail(int(self.copy_rec[k]), f"copy destination {int(self.copy_dst[k])} is not an input "
                                                 f"(it is produced by record {int(value_producer[self.copy_dst[k]])})")
        if len(unset_arr):
            fm["cg_unset_inputs"] = tuple(unset_arr.tolist())
        if header is not None:
            for key, have in (("num_inputs", len(inputs)), ("num_outputs", len(gets)),
                              ("num_updates", len(self.copy_src))):
                if header.get(key) != have:
                    self._meta_fail(f"{key} is {header.get(key)!r}, the files hold {have}")

        # io layout
        n_io = len(self.io_starts)
        default_layout = (np.array_equal(self.io_count, np.ones(n_io))
                          and np.array_equal(self.io_type, np.concatenate(
                              [np.full(len(gets), IO_GET), np.full(len(sets), IO_SET),
                               np.full(len(self.copy_src), IO_COPY)])))
        if not default_layout:
            fm["cg_io_records"] = tuple(zip(self.io_type.tolist(), self.io_count.tolist(), strict=True))

        # Types, attributes, versions.
        if header is not None:
            types, attrs, op_attr, op_version, value_type = self._typed_from_metadata(header, n_ops, n_vals, opdefs)
        else:
            types, attrs, op_attr, op_version, value_type = self._typed_tenscalc(n_ops, n_vals, opdefs)

        # Constant record types (remembered when not the default for this kind of file).
        defaults = [_const_record_default(c, header is None) for c in self.constants]
        if defaults != self.const_types:
            fm["cg_const_types"] = tuple(self.const_types)

        if len(self.copy_src):
            canon: dict[ValueType, int] = {}
            tid = np.array([canon.setdefault(t, i) for i, t in enumerate(types)], dtype=np.int64)
            bad = (tid[value_type[self.copy_src]] != tid[value_type[self.copy_dst]]) & ~scalar_copy
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                src, dst = int(self.copy_src[k]), int(self.copy_dst[k])
                self._io_fail(int(self.copy_rec[k]), f"copy {src} -> {dst} changes type "
                                                     f"{types[value_type[src]]} -> {types[value_type[dst]]}")
        symbols = self._symbols(header, n_ops, n_vals, nconst, n_io)
        if self.text_encoding != "utf-8":
            fm["cg_text_encoding"] = self.text_encoding

        self.where.at(self.cg.path, 0, 1)
        pairs = np.stack([self.copy_src, self.copy_dst], axis=1) if len(self.copy_src) else np.zeros((0, 2), np.int64)
        if scalar_copy.any():
            # What the writer needs to write the file's own records again (see _file_view).
            fm["cg_scalar_copies"] = (n_ops, n_vals, nconst, tuple(map(tuple, pairs.tolist())), ())
        graph = Graph(
            op_kind=self.kind, op_attr=op_attr, op_version=op_version,
            in_ptr=self.in_ptr, in_ids=self.in_ids,
            out_ptr=self.out_ptr, out_ids=self.out_ids,
            value_type=value_type, value_producer=value_producer, value_index=value_index,
            types=types, attrs=attrs, constants=self.constants,
            inputs=inputs, outputs=gets, updates=pairs,
            symbols=symbols, file_meta=fm,
        )
        if scalar_copy.any():
            try:
                graph, rows = _scalar_copies(graph, self.io_count[self.io_type == IO_COPY].tolist())
            except _CopyProblem as exc:
                self._io_fail(int(self.copy_rec[exc.pair]), exc.message)
            fm["cg_scalar_copies"] = (*fm["cg_scalar_copies"][:4], tuple(rows))
            graph = graph.replace(file_meta=fm)
        return graph

    def _explain_io(self, produced: np.ndarray, limit: int) -> NoReturn:
        """Neither index base fits: report the first gateway that fails 0-based reading."""
        for ids, recs, what in ((self.sets, self.set_rec, "set"), (self.gets, self.get_rec, "get")):
            bad = (ids < 0) | (ids >= limit)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                self._io_fail(int(recs[k]), f"{what} variable {int(ids[k])} is out of range")
        s = self.sets
        inside = s < len(produced)
        hit = np.zeros(len(s), bool)
        hit[inside] = produced[s[inside]]
        if hit.any():
            k = int(np.flatnonzero(hit)[0])
            self._io_fail(int(self.set_rec[k]), f"set variable {int(s[k])} is produced by a function "
                                                f"(read 0-based or 1-based)")
        if len(s) == 0:
            _fail(self.cgio.path, 0, 1, "the set/get indices fit neither 0-based nor 1-based reading")
        _, first = np.unique(s, return_index=True)
        dup = np.setdiff1d(np.arange(len(s)), first)
        k = int(dup[0]) if len(dup) else 0
        self._io_fail(int(self.set_rec[k]), "a variable is set twice" if len(dup) else
                      "the set/get indices fit neither 0-based nor 1-based reading")

    def _typed_tenscalc(self, n_ops: int, n_vals: int, opdefs: dict[int, OpDef]) -> tuple[Any, ...]:
        types: list[ValueType] = [F64_UNKNOWN]
        type_ids: dict[ValueType, int] = {F64_UNKNOWN: 0}
        const_tid = np.array([type_ids.setdefault(TensorType.of(c), len(type_ids)) for c in self.constants],
                             dtype=np.int32)
        types = list(type_ids)
        value_type = np.zeros(n_vals, dtype=np.int32)
        attrs: list[Attrs] = [(("index", i),) for i in range(len(self.constants))]
        op_attr = np.zeros(n_ops, dtype=np.int32)
        op_version = np.zeros(n_ops, dtype=np.int32)
        if len(self.const_ops):
            cref = self.const_ref
            op_attr[self.const_ops] = cref
            value_type[self.out_ids[self.out_ptr[self.const_ops]]] = const_tid[cref]
        attr_ids: dict[Any, int] = {}
        tc = np.zeros(n_ops, dtype=bool)
        for k, opdef in opdefs.items():
            if k == CONST.id:
                continue
            sel = self.kind == k
            if opdef.family == "tenscalc":
                tc |= sel
                continue
            try:
                a = opdef.normalise_attrs({})
            except OpTypeError as exc:
                self._cg_fail(int(np.flatnonzero(sel)[0]), f"function type {k} ({opdef.name}) needs attributes, "
                                                          f"which only an opgraph metadata record can give: {exc}")
            aid = attr_ids.setdefault(exact_key(a), len(attrs))
            if aid == len(attrs):
                attrs.append(a)
            op_attr[sel] = aid
            for op in np.flatnonzero(sel).tolist():
                ins = self.in_ids[self.in_ptr[op]:self.in_ptr[op + 1]]
                in_types = tuple(types[t] for t in value_type[ins])
                try:
                    op_version[op] = opdef.version(in_types, dict(a))
                except Exception as exc:
                    self._cg_fail(op, f"{opdef.name} rejects its inputs {in_types}: {exc}")
        if tc.any():
            nouts = self.n_out[tc]
            uniq, inv = np.unique(nouts, return_inverse=True)
            ids = np.empty(len(uniq), dtype=np.int32)
            for i, m in enumerate(uniq.tolist()):
                ids[i] = len(attrs)
                attrs.append((("nout", m),))
            op_attr[tc] = ids[inv]
        return types, attrs, op_attr, op_version, value_type

    def _typed_from_metadata(self, header: dict[str, Any], n_ops: int, n_vals: int,
                             opdefs: dict[int, OpDef]) -> tuple[Any, ...]:
        self.where.at(self.cgc.path, self.metadata[0], self.metadata[1])  # type: ignore[index]
        raw_types, raw_attrs = header.get("types"), header.get("attrs")
        if not isinstance(raw_types, list) or not isinstance(raw_attrs, list):
            self._meta_fail("types and attrs must be lists")
        types: list[ValueType] = []
        for i, t in enumerate(raw_types):
            try:
                types.append(_dec_type(t))
            except (ValueError, OpTypeError, TypeError) as exc:
                self._meta_fail(f"type {i}: {exc}")
        attrs: list[Attrs] = []
        for i, a in enumerate(raw_attrs):
            try:
                if not isinstance(a, list):
                    raise ValueError("not a list of [name, value] pairs")
                pairs = []
                for pair in a:
                    if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                        raise ValueError(f"bad pair {pair!r}"[:200])
                    pairs.append((pair[0], _dec_attr(pair[1], bodies=self.bodies)))
                attrs.append(tuple(pairs))
            except (ValueError, RecursionError) as exc:
                self._meta_fail(f"attribute entry {i}: {exc}")
        op_attr = self._meta_array(header, "op_attr", n_ops, len(attrs))
        op_version = self._meta_array(header, "op_version", n_ops, None)
        value_type = self._meta_array(header, "value_type", n_vals, len(types))
        # Attributes must be what the kind's schema gives (const ops: exactly their .cg constant).
        if n_ops:
            width = len(attrs) + 1

            def keys(lo: int) -> np.ndarray:
                return self.kind[lo:lo + _CHUNK].astype(np.int64) * width + op_attr[lo:lo + _CHUNK]

            distinct: set[int] = set()
            for lo in range(0, n_ops, _CHUNK):  # in chunks: the temporaries stay small
                distinct.update(np.unique(keys(lo)).tolist())
            for kk in sorted(distinct):
                k, aid = divmod(kk, width)
                a = attrs[aid]
                if k == CONST.id:
                    continue
                try:
                    norm = opdefs[k].normalise_attrs(dict(a))
                    ok = exact_key(norm) == exact_key(a) and len(dict(a)) == len(a)
                except Exception as exc:  # normalisers are op code: any complaint means "not valid"
                    ok, why = False, f"{type(exc).__name__}: {exc}"
                else:
                    why = f"normalises to {norm!r}"[:200]
                if not ok:
                    op = next(lo + int(np.flatnonzero(keys(lo) == kk)[0])
                              for lo in range(0, n_ops, _CHUNK) if (keys(lo) == kk).any())
                    self._meta_fail(f"attributes {a!r} of record {op} ({opdefs[k].name}) are not valid: {why}"[:400])
            if len(self.const_ops):
                lut = np.full(len(attrs), -1, dtype=np.int64)
                for aid, a in enumerate(attrs):
                    # an index beyond int64 cannot name a constant: it stays -1 and is reported as a mismatch
                    if len(a) == 1 and a[0][0] == "index" and type(a[0][1]) is int and 0 <= a[0][1] < 2**63:
                        lut[aid] = a[0][1]
                bad = lut[op_attr[self.const_ops]] != self.const_ref
                if bad.any():
                    k = int(np.flatnonzero(bad)[0])
                    op = int(self.const_ops[k])
                    self._meta_fail(f"record {op} is a constant function of constant {int(self.const_ref[k])} "
                                    f"but its attribute says {attrs[int(op_attr[op])]!r}"[:300])
        return types, attrs, op_attr, op_version, value_type

    def _symbols(self, header: dict[str, Any] | None, n_ops: int, n_vals: int, nconst: int,
                 n_io: int) -> Symbols:
        limits = {1: nconst, 2: n_ops, 3: n_vals, 4: n_io}
        tables: dict[int, dict[int, str]] = {1: {}, 2: {}, 3: {}, 4: {}}
        descriptions: dict[tuple[str, int], str] = {}
        order: list[tuple[int, int]] = []
        for i, ((t, idx, _, _, _), (name, desc)) in enumerate(zip(self.sym_recs, self.sym_text, strict=True)):
            if idx >= limits[t]:
                self._sym_fail(i, f"{SYM_KIND[t]} index {idx} is out of range ({limits[t]} exist)")
            order.append((t, idx))
            if name:
                tables[t][idx] = name
            if desc:
                descriptions[(SYM_KIND[t], idx)] = desc
        if header is not None:
            empty = header.get("empty_symbols", [])
            if not isinstance(empty, list):
                self._meta_fail("bad empty_symbols")
            for e in empty:
                if not (isinstance(e, list) and len(e) == 4 and type(e[0]) is int and e[0] in limits
                        and type(e[1]) is int and 0 <= e[1] < limits[e[0]]
                        and isinstance(e[2], bool) and isinstance(e[3], bool)):
                    self._meta_fail(f"bad empty_symbols entry {e!r}"[:200])
                if e[2]:
                    tables[e[0]][e[1]] = ""
                if e[3]:
                    descriptions[(SYM_KIND[e[0]], e[1])] = ""
        if order != sorted(set(order)) or len(set(order)) != len(order):
            self.file_meta["cg_cgs_order"] = tuple(order)
        return Symbols(values=tables[3], ops=tables[2], constants=tables[1], descriptions=descriptions,
                       io=tables[4])

    def _verify(self, g: Graph) -> None:
        try:
            g.verify()
        except VerifyError as exc:
            problem = exc.problems[0]
            self._problem(problem, len(exc.problems))
        except Exception as exc:
            self._problem(f"{type(exc).__name__}: {exc}", 1)

    def _problem(self, problem: str, count: int) -> NoReturn:
        more = f" (and {count - 1} more problem(s))" if count > 1 else ""
        m = re.search(r"\bop (\d+)", problem)
        if m and int(m.group(1)) < self.n_ops:
            self._cg_fail(int(m.group(1)), f"{problem}{more}")
        if self.metadata is not None:
            self._meta_fail(f"{problem}{more}")
        _fail(self.cg.path, 0, 1, f"{problem}{more}")
