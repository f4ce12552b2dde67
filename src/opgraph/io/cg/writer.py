"""Writing a graph as a .cg file set (:func:`save_cg`), a chunk of ops at a time, and listing its gateways."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from opgraph.core import progress
from opgraph.core.atomic import atomic_files
from opgraph.core.graph import Graph, ranges
from opgraph.core.registry import CONST, USER_IDS, get_op
from opgraph.core.subgraph import Subgraph, subgraphs_of
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import GraphError
from opgraph.io.cg.encoding import (
    CopyProblem,
    const_record_default,
    const_record_fits,
    constant_length,
    detect_io_base,
    enc_attr,
    enc_type,
    encode_constant,
    scalar_copies,
)
from opgraph.io.cg.format import (
    CHUNK,
    COMMIT_ORDER,
    F64_UNKNOWN,
    IO_COPY,
    IO_GET,
    IO_SET,
    MAGIC_DTYPES,
    MAX_INDEX,
    METADATA_RECORD,
    METADATA_VERSION,
    SAVE_SUFFIX,
    SUBGRAPH_FORMAT,
    SUBGRAPH_RECORD,
    SUBGRAPH_VERSION,
    SUFFIXES,
    SYM_FIELD,
    SYM_KIND,
    SYM_TYPE,
    all_counts,
    base_path,
    chunk_len,
    int_range,
    max_count,
    op_chunks,
    save_file_text,
    save_tag,
)

_TAG_PLACEHOLDER = b'"save":"' + b"0" * 32 + b'"'


def save_cg(graph: Graph, path: str | os.PathLike[str], *, index_bits: int | None = None) -> None:
    """Write ``graph`` as the four files ``base.cg``, ``.cgc``, ``.cgio``, ``.cgs``, atomically.

    ``path`` is the base name or any of the four file names. ``index_bits``
    (16, 32 or 64) is the integer width; by default the width the graph was
    read with (``file_meta``), else 32, or 64 when something does not fit.
    A graph read from a TensCalc file set is written back byte for byte.

    >>> import os, tempfile, opgraph
    >>> from opgraph.io.cg import load_cg
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
    writer = _Writer(view if view is not None else graph)
    contents = dict(zip(SUFFIXES, writer.contents(index_bits), strict=True))
    base = base_path(path)
    # Renamed in COMMIT_ORDER (the companion first, the .cgc last), which is what lets a reader in another
    # process tell a set being replaced from a complete one (docs/cg-format.md, "Concurrent readers").
    with atomic_files([base + s for s in COMMIT_ORDER]) as files, \
            progress.task(f"saving {base}.cg (files)", total=len(COMMIT_ORDER)) as tick:
        out = dict(zip(COMMIT_ORDER, files, strict=True))
        digests: dict[str, str] = {}
        for s in (".cg", ".cgio", ".cgs"):
            digests[s] = _write_file(out[s], contents[s])
            tick.advance(1)
        writer.set_save_tag(save_tag(digests[".cg"], digests[".cgio"], digests[".cgs"]))
        digests[".cgc"] = _write_file(out[".cgc"], contents[".cgc"])
        out[SAVE_SUFFIX].write(save_file_text(digests))
        tick.advance(2)


def _write_file(f: BinaryIO, chunks: Iterable[Any]) -> str:
    """Write one file's chunks (bytes or arrays) to an open temporary file; returns the file's digest."""
    h = hashlib.sha256()  # the digest of format.digest, computed while the bytes go out
    for chunk in chunks:
        data = memoryview(chunk).cast("B") if isinstance(chunk, np.ndarray) else chunk
        h.update(data)
        f.write(data)
    return h.hexdigest()[:32]


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


def _file_view(graph: Graph) -> Graph | None:
    """The graph as its TensCalc file holds it, when it was read with copies into scalars and still fits them.

    That is the graph without the ops, values and constants the reader
    appended (:func:`scalar_copies`) and with the file's copy pairs as
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
        expected, _ = scalar_copies(view, counts)
        if not (expected.equals(graph, check_names=True) and writer.plain()):
            return None
    except (GraphError, CopyProblem, IndexError, ValueError):
        return None
    return view


class _Writer:
    def __init__(self, g: Graph, bodies: dict[Subgraph, int] | None = None) -> None:
        # bodies: .cgc record index of each subgraph of the top-level file, when g is one of them
        self.g = g
        self.meta = g.file_meta
        self.bodies = bodies
        self.embedded = bodies is not None
        self.metadata: list[Any] | None = None  # the metadata record's parts, once contents() made them
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
        if detect_io_base(set_vars + base, gets + base, produced, const_out, MAX_INDEX) != base:
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
                if type(t) is int and const_record_fits(t, c):
                    rtype = t
            if rtype is None:
                rtype = const_record_default(c, plain)
            const_recs.append((rtype, c))
        body_recs: list[bytes] = []
        if not self.embedded:
            order = list(subgraphs_of(g, recursive=True))
            if order:  # each body once, after the constants (constant i stays record i)
                self.bodies = {body: len(g.constants) + k for k, body in enumerate(order)}
                body_recs = [_subgraph_record(body, self.bodies) for body in order]
        metadata = self.metadata = None if plain else self._metadata(base, unset, sym_recs)
        meta_len = sum(chunk_len(x) for x in metadata) if metadata is not None else 0

        # Width: the largest integer any file holds.
        need = max(
            int(g.op_kind.max(initial=0)), max_count(g.in_ptr), max_count(g.out_ptr),
            g.num_values, len(g.constants), n_io, METADATA_RECORD, len(g.inputs) + len(g.outputs),
            2 * len(g.updates) + 2,
            max((constant_length(t, c) for t, c in const_recs), default=0),
            meta_len,
            max((max(r[1], len(r[2]), len(r[3])) for r in sym_recs), default=0),
            *((SUBGRAPH_RECORD, max(len(r) for r in body_recs)) if body_recs else ()),
        )
        if index_bits is None:
            bits = self._meta_bits()
            if bits is None or need > int_range(bits):
                bits = 32 if need <= int_range(32) else 64
        else:
            bits = index_bits
            if need > int_range(bits):
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

    def set_save_tag(self, tag: str) -> None:
        """Put the save tag into the metadata record (before the .cgc stream reaches it); no-op without one."""
        if self.metadata is not None:
            head = self.metadata[0]
            self.metadata[0] = head.replace(_TAG_PLACEHOLDER, b'"save":"' + tag.encode("ascii") + b'"', 1)
            assert len(self.metadata[0]) == len(head)

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
        if not len(self.const_ops) and all_counts(g.in_ptr, k) and all_counts(g.out_ptr, m):
            # Every record has the same shape: fill columns of a 2-D block.
            step = max(1, CHUNK // (3 + k + m))
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
        for lo, hi in op_chunks(n_ops, g.in_ptr, g.out_ptr):
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
            buf[ranges(s + 3, s + 3 + n_in)] = g.in_ids[g.in_ptr[lo]:g.in_ptr[hi]]
            o_start = s + 3 + n_in
            if not len(cops):
                buf[ranges(o_start, o_start + n_out)] = g.out_ids[g.out_ptr[lo]:g.out_ptr[hi]]
            else:
                nc = ~is_const
                ptr = g.out_ptr[lo:hi + 1]
                buf[ranges(o_start[nc], o_start[nc] + n_out[nc])] = g.out_ids[ranges(ptr[:-1][nc], ptr[1:][nc])]
            yield buf

    def _cgc_stream(self, dt: np.dtype, const_recs: list[tuple[int, np.ndarray]], metadata: list[Any] | None,
                    meta_len: int, body_recs: Sequence[bytes] = ()) -> Iterator[Any]:
        """The .cgc records after the magic byte; each constant is encoded as it is written."""
        for rtype, c in const_recs:
            data = encode_constant(rtype, c)
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
                    for lo in range(0, len(arr), CHUNK):
                        yield arr[lo:lo + CHUNK].astype(to)
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
        for t, field in SYM_FIELD.items():
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
            name = getattr(sym, SYM_FIELD[t]).get(idx, "")
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
            n_set = getattr(sym, SYM_FIELD[t]).get(idx) == ""
            d_set = sym.descriptions.get((SYM_KIND[t], idx)) == ""
            if n_set or d_set:
                empty.append([t, idx, n_set, d_set])
        header: dict[str, Any] = {
            "format": "opgraph.cg",
            "version": METADATA_VERSION,
        }
        if not self.embedded:  # filled in by set_save_tag once the other three files are written
            header["save"] = "0" * 32
        header |= {
            "index_base": base,
            "num_ops": g.num_ops,
            "num_values": g.num_values,
            "num_constants": len(g.constants),
            "num_inputs": len(g.inputs),
            "num_outputs": len(g.outputs),
            "num_updates": len(g.updates),
            "types": [enc_type(t) for t in g.types],
            "attrs": [[[k, enc_attr(v, self.bodies)] for k, v in a] for a in g.attrs],
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
