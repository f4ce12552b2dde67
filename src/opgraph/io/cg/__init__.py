"""The .cg binary format: Hespanha's four files (seed 000), as TensCalc writes them.

A graph is stored as four files next to each other: ``base.cg`` (functions),
``base.cgc`` (constants), ``base.cgio`` (set/get/copy gateways) and
``base.cgs`` (names). Each starts with ONE magic byte, 16, 32 or 64, giving
the width of every little-endian signed integer that follows. opgraph adds
``base.cgtag``, its own small companion (the save tag, see below), which
lets a reader in another process tell a set that a save is replacing from a
complete one; formats other than opgraph's ignore it.

    >>> import os, tempfile, numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (None, 3)), name="x")
    >>> y = b.op("sum", b.multiply(x, 2.0), axis=1, name="total")
    >>> b.output(y)
    >>> g = b.freeze()
    >>> base = os.path.join(tempfile.mkdtemp(), "model")
    >>> save_cg(g, base + ".cg")
    >>> sorted(os.listdir(os.path.dirname(base)))
    ['model.cg', 'model.cgc', 'model.cgio', 'model.cgs', 'model.cgtag']
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
entries and an update edge onto it (:func:`~opgraph.io.cg.encoding.scalar_copies`), and is written
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

**Save tags and concurrent readers.** A save writes the .cg, .cgio and .cgs
files first; its *save tag* is the first 16 bytes of the SHA-256 of their
three digests (each the first 16 bytes of the file's SHA-256;
:func:`~opgraph.io.cg.format.save_tag`), written into the metadata record's
JSON (key ``save``) and, with the four files' digests, into
``base.cgtag``. The files are renamed in the order ``.cgtag``, ``.cg``,
``.cgio``, ``.cgs``, ``.cgc``. :func:`load_cg` opens ``.cgc`` first, reads
``.cgtag`` before and after opening the four files, and accepts them when
``.cgtag`` did not change meanwhile and names the ``.cgc`` file's tag (no
file is hashed); otherwise it tries again (up to 9 reads over 1.3 s) and
at last lets the files' own digests decide, raising one
:class:`~opgraph.errors.FormatError` that the files come from different
saves (naming each file and its tag or digest) rather than ever returning a
mixed graph. Sets without a ``.cgtag`` (TensCalc's, older opgraph's) load
unchecked; a set in TensCalc's layout (no metadata record) is checked by
the digests of its four files. docs/cg-format.md says exactly what readers
and writers can rely on.

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

The package is split by job: :mod:`~opgraph.io.cg.format` (constants and
shared helpers), :mod:`~opgraph.io.cg.scan` (record boundaries, the files),
:mod:`~opgraph.io.cg.encoding` (attributes, types, constants, index bases,
scalarised copies), :mod:`~opgraph.io.cg.writer` and
:mod:`~opgraph.io.cg.reader`.
"""

from __future__ import annotations

# Today's names stay importable from opgraph.io.cg; those outside __all__ are re-exported by alias.
from opgraph.io.cg.format import (
    CONST_RECORD_BASE as CONST_RECORD_BASE,
)
from opgraph.io.cg.format import (
    F64_UNKNOWN as F64_UNKNOWN,
)
from opgraph.io.cg.format import (
    IO_COPY as IO_COPY,
)
from opgraph.io.cg.format import (
    IO_GET as IO_GET,
)
from opgraph.io.cg.format import (
    IO_SET as IO_SET,
)
from opgraph.io.cg.format import (
    MAGIC_DTYPES as MAGIC_DTYPES,
)
from opgraph.io.cg.format import (
    METADATA_RECORD,
    SUBGRAPH_RECORD,
    TC_DOUBLE_FULL,
    TC_DOUBLE_SPARSE,
    TC_INT64_TENSOR,
    TC_INT64_VECTOR,
    TC_STRING,
)
from opgraph.io.cg.format import (
    METADATA_VERSION as METADATA_VERSION,
)
from opgraph.io.cg.format import (
    SUBGRAPH_FORMAT as SUBGRAPH_FORMAT,
)
from opgraph.io.cg.format import (
    SUBGRAPH_VERSION as SUBGRAPH_VERSION,
)
from opgraph.io.cg.format import (
    SUFFIXES as SUFFIXES,
)
from opgraph.io.cg.format import (
    SYM_KIND as SYM_KIND,
)
from opgraph.io.cg.format import (
    SYM_TYPE as SYM_TYPE,
)
from opgraph.io.cg.format import (
    TC_FTENSOR2SCALARS as TC_FTENSOR2SCALARS,
)
from opgraph.io.cg.format import (
    TC_SCALARS2FTENSOR as TC_SCALARS2FTENSOR,
)
from opgraph.io.cg.reader import load_cg
from opgraph.io.cg.scan import scan_records, scan_records_reference
from opgraph.io.cg.writer import Gateway, gateways, save_cg

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
