"""Reading a .cg file set into a verified graph (:func:`load_cg`): every length and index is checked before use."""

from __future__ import annotations

import json
import os
import re
import struct
import time
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from opgraph.core import progress
from opgraph.core.builder import exact_key
from opgraph.core.graph import Graph, Symbols, ranges
from opgraph.core.registry import CONST, Attrs, OpDef, get_op, unknown_op_message
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import FormatError, OpTypeError, VerifyError
from opgraph.io.cg.encoding import (
    CopyProblem,
    const_record_default_of,
    dec_attr,
    dec_type,
    decode_constant,
    decode_constants,
    detect_io_base,
    scalar_copies,
)
from opgraph.io.cg.format import (
    CHUNK,
    F64_UNKNOWN,
    IO_COPY,
    IO_GET,
    IO_SET,
    MAX_INDEX,
    METADATA_RECORD,
    METADATA_VERSION,
    SAVE_SUFFIX,
    SUBGRAPH_FORMAT,
    SUBGRAPH_RECORD,
    SUBGRAPH_VERSION,
    SUFFIXES,
    SYM_KIND,
    SaveFile,
    Where,
    base_path,
    digest,
    fail_at,
    is_tag,
    read_save_text,
    save_tag,
)
from opgraph.io.cg.scan import CgFile, CgioLayout, CgLayout, CgsLayout, check_whole, file_bytes, scan_file

RETRY_DELAYS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)
"""Seconds slept before each new try when a load meets a set whose files come from different saves."""


# ============================================================== loading
def load_cg(path: str | os.PathLike[str], *, mmap: bool = True) -> Graph:
    """Read a .cg file set (ours or TensCalc's) into a verified :class:`Graph`.

    ``path`` is the base name or any of the four file names. ``mmap`` maps
    large files instead of reading them. Never executes code; every length
    and index is checked before use. Any problem raises one
    :class:`~opgraph.errors.FormatError` naming the file, record and byte offset.

    The graph is always one save's: a set that another process is saving
    over meanwhile is read again (up to 9 times over 1.3 s), and files that
    stay from different saves (their save tags disagree) raise one
    :class:`~opgraph.errors.FormatError` naming each file and its tag
    (docs/cg-format.md, "Concurrent readers and the save tag").

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> for s in (".cg", ".cgc", ".cgio", ".cgs"):
    ...     _ = open(os.path.join(d, "bad" + s), "wb").write(bytes([33]))
    >>> load_cg(os.path.join(d, "bad"))
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: .../bad.cg: record 0 at byte offset 0: bad magic byte 33 (expected 16, ...)
    """
    base = base_path(path)
    where = Where()
    try:
        with progress.task(f"loading {base}.cg"):
            for attempt in range(len(RETRY_DELAYS) + 1):
                check = _SaveCheck(base, last=attempt == len(RETRY_DELAYS))
                reader = _Reader(base, mmap, where)
                check.opened()
                try:
                    return reader.read(check)
                except _Retry:
                    del reader  # its files are unmapped before the next try
                    time.sleep(RETRY_DELAYS[attempt])
            raise AssertionError("unreachable: the last try raises or returns")
    except FormatError:
        raise
    except (OSError, MemoryError):
        raise
    except Exception as exc:  # a check we missed: still one FormatError, with the place we were at
        err = FormatError(f"{where.path}: record {where.record} at byte offset {where.offset}: "
                          f"malformed ({type(exc).__name__}: {exc})")
        err.unexpected = True  # type: ignore[attr-defined]
        raise err from exc


class _Retry(Exception):
    """The files looked like a set in the middle of being replaced: :func:`load_cg` tries again."""


def _companion(base: str) -> tuple[tuple[int, ...], bytes] | None:
    """The companion file's identity (inode, size, times) and bytes, or None when there is none."""
    try:
        with open(base + SAVE_SUFFIX, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read(4097)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), data


class _SaveCheck:
    """Whether the four files a reader opened belong to one save (docs/cg-format.md, "Concurrent readers").

    The companion is looked at before the files are opened and after (``opened``). A save renames the
    companion first and the .cgc file last, and the .cgc file is opened first; so when the companion did
    not change in between (no save started) and its tag is the one in the .cgc file, the other files were
    renamed in before the .cgc file was opened and not replaced since: they are that save's. Otherwise
    the try is repeated; on the last one the files' bytes decide (their digests against the tags).
    """

    def __init__(self, base: str, last: bool) -> None:
        self.base, self.last = base, last
        self.before = _companion(base)
        self.after: tuple[tuple[int, ...], bytes] | None = None
        self.digests: dict[str, str] | None = None

    def opened(self) -> None:
        self.after = _companion(self.base)

    def __call__(self, reader: _Reader, tag: str | None) -> None:
        before, after = self.before, self.after
        if before is None and after is None:
            return  # a set without a companion (written by TensCalc or an older opgraph): nothing to check
        comp = read_save_text(after[1], self.base + SAVE_SUFFIX) if after is not None else None
        if before == after and comp is not None and self._consistent(reader, tag, comp):
            return
        if not self.last:
            raise _Retry
        # The last try, and the companion changed meanwhile or disagrees: the files' own bytes decide.
        if tag is not None:
            d = self._digests(reader)
            if save_tag(d[".cg"], d[".cgio"], d[".cgs"]) == tag:
                return  # the .cgc file's own save: a stale or changing companion does not matter
        elif comp is not None and self._matches(reader, comp) == dict.fromkeys(SUFFIXES, True):
            return
        self._fail(reader, tag, comp, before == after)

    def _consistent(self, reader: _Reader, tag: str | None, comp: SaveFile) -> bool:
        """Whether the files are the companion's save (the companion did not change while they were opened)."""
        if tag is not None:
            return tag == comp.tag
        # No tag in the .cgc file (TensCalc's layout, or another writer's file): the digests decide.
        match = self._matches(reader, comp)
        if all(match.values()) or not any(match.values()):
            return True  # the companion's save, or four files none of which is from it
        # The .cgc file is the save's, and it was renamed in last: a file that differs was changed after the
        # save (the reader then reports what is wrong with it). Only once a save in progress had time to end.
        return self.last and match[".cgc"]

    def _digests(self, reader: _Reader) -> dict[str, str]:
        if self.digests is None:
            self.digests = {s: digest(reader.files[s].raw) for s in SUFFIXES}
        return self.digests

    def _matches(self, reader: _Reader, comp: SaveFile) -> dict[str, bool]:
        d = self._digests(reader)
        return {s: d[s] == comp.files[s] for s in SUFFIXES}

    def _fail(self, reader: _Reader, tag: str | None, comp: SaveFile | None, stable: bool) -> NoReturn:
        base, cgc = self.base, reader.cgc
        rec, off = (reader.metadata[0], reader.metadata[1]) if reader.metadata is not None else (0, 0)
        parts = [f"{cgc.path} has save tag {tag}" if tag is not None else
                 f"{cgc.path} has no save tag (written without one)"]
        if comp is not None:
            parts.append(f"{base}{SAVE_SUFFIX} names save {comp.tag}")
            for s in (".cg", ".cgio", ".cgs") if tag is not None else SUFFIXES:
                d = self._digests(reader)[s]
                parts.append(f"{base}{s} (digest {d}) {'is' if d == comp.files[s] else 'is not'} that save's")
        why = "" if stable else f", and {base}{SAVE_SUFFIX} was replaced while they were opened (a save is running)"
        fail_at(cgc.path, rec, off,
                f"the files of {base} come from different saves{why}: {'; '.join(parts)} "
                f"(read {len(RETRY_DELAYS) + 1} times over {sum(RETRY_DELAYS):.2f} s; a save killed while it "
                f"renamed its files leaves .old and .tmp files next to them to recover from, see "
                f"docs/cg-format.md; if another program wrote these files, delete {base}{SAVE_SUFFIX})")


class _Reader:
    def __init__(self, base: str, use_mmap: bool, where: Where,
                 embedded: tuple[dict[str, np.ndarray], dict[int, Subgraph]] | None = None) -> None:
        # embedded: the four files of a subgraph record (by suffix) and the bodies before it
        self.base = base
        self.where = where
        self.embedded = embedded is not None
        self.bodies: dict[int, Subgraph] = dict(embedded[1]) if embedded is not None else {}
        raw: dict[str, np.ndarray] = {}
        if embedded is not None:
            raw = embedded[0]
        else:
            # The .cgc file is opened first: a save renames it last (COMMIT_ORDER), see _SaveCheck.
            for s in (".cgc", ".cg", ".cgio", ".cgs"):
                where.at(base + s)
                raw[s] = file_bytes(base + s, use_mmap)
        self.files: dict[str, CgFile] = {}
        for s in SUFFIXES:
            where.at(base + s)
            self.files[s] = CgFile(base + s, s, raw[s])
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
        layout = CgLayout(a)
        self.rec_len = layout.uniform_length()
        if self.rec_len is None:
            starts = scan_file(f, layout, np.int32 if len(a) <= MAX_INDEX else np.int64)
            self.starts: np.ndarray | None = starts
            n_ops = len(starts)
        else:
            check_whole(f, len(a) // self.rec_len)
            self.starts = None
            n_ops = len(a) // self.rec_len
        self.n_ops = n_ops
        if n_ops > MAX_INDEX:
            fail_at(f.path, MAX_INDEX, f.byte_of(self._op_start(MAX_INDEX)), "too many functions")
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
            step = max(1, CHUNK // self.rec_len)
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

        Works through the records in chunks of about ``CHUNK`` ids.
        """
        n = len(ptr) - 1
        out = np.empty(int(ptr[-1]), dtype=np.int32)
        lo = 0
        while lo < n:
            hi = int(np.searchsorted(ptr, ptr[lo] + CHUNK, side="right")) - 1
            hi = min(n, lo + CHUNK, max(hi, lo + 1))
            s = first(lo, hi)
            self._store_ids(out, int(ptr[lo]), self.a[ranges(s, s + np.diff(ptr[lo:hi + 1]))], role)
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
            self.starts = scan_file(self.cg, CgLayout(self.a))
        return int(self.starts[op])

    def _cg_fail(self, op: int, message: str) -> NoReturn:
        fail_at(self.cg.path, op, self.cg.byte_of(self._op_start(op)), message)

    # ---------------------------------------------------------- .cgc
    def _read_cgc(self) -> None:
        # Record boundaries with one pass over the headers, then the constants of each record type and
        # shape decoded together (decode_constants). Anything unusual (a bad header, a bad constant, a
        # record out of place) is read again record by record (_read_cgc_records), which names the
        # first problem exactly as it always has.
        f = self.cgc
        w = f.w
        self.constants: list[np.ndarray] = []
        self.const_types: list[int] = []
        self.const_form: np.ndarray | None = None
        self.const_forms: list[tuple[np.dtype, tuple[int, ...]]] = []
        self.metadata: tuple[int, int, np.ndarray] | None = None
        self.where.at(f.path, 0, 1)
        heads = self._cgc_headers()
        if heads is None:
            return self._read_cgc_records()
        starts, rtype, length = heads
        is_meta, is_sub = rtype == METADATA_RECORD, rtype == SUBGRAPH_RECORD
        is_const = ~(is_meta | is_sub)
        if is_meta[:-1].any():
            return self._read_cgc_records()
        if is_sub.any() and (self.embedded or is_const[int(np.flatnonzero(is_sub)[0]):].any()):
            return self._read_cgc_records()
        try:
            bulk = decode_constants(f.body, starts[is_const] + 2 * w, rtype[is_const], length[is_const])
        except (ValueError, IndexError, TypeError, OverflowError):  # a check the bulk path missed
            bulk = None
        if bulk is None:
            return self._read_cgc_records()
        self.constants, self.const_form, self.const_forms = bulk.arrays, bulk.form, bulk.forms
        self.const_types = rtype[is_const].tolist()
        for rec in np.flatnonzero(is_sub).tolist():
            off = 1 + int(starts[rec])
            self.where.at(f.path, rec, off)
            data = f.body[off - 1 + 2 * w:off - 1 + 2 * w + int(length[rec])]
            self.bodies[rec] = self._read_subgraph(rec, off, off + 2 * w, data)
        if is_meta.any():
            rec = len(starts) - 1
            off = 1 + int(starts[rec])
            self.metadata = (rec, off, f.body[off - 1 + 2 * w:off - 1 + 2 * w + int(length[rec])])

    def _cgc_headers(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Start (in the body), type and data length of each .cgc record; None when a header is bad."""
        f = self.cgc
        body, w = f.body, f.w
        n = len(body)
        unpack = struct.Struct({2: "<hh", 4: "<ii", 8: "<qq"}[w]).unpack_from
        buf = body.tobytes() if n < (1 << 24) else body  # bytes are faster to unpack from
        starts: list[int] = []
        types: list[int] = []
        lengths: list[int] = []
        pos = 0
        # A record's start depends on every length before it: one pass over the headers.
        while pos < n:
            if pos + 2 * w > n:
                return None
            rtype, length = unpack(buf, pos)
            if length < 0 or length > n - pos - 2 * w:
                return None
            starts.append(pos)
            types.append(rtype)
            lengths.append(length)
            pos += 2 * w + length
        return (np.array(starts, dtype=np.int64), np.array(types, dtype=np.int64),
                np.array(lengths, dtype=np.int64))

    def _read_cgc_records(self) -> None:
        """The .cgc file record by record (the reference for :meth:`_read_cgc`, and its messages)."""
        f = self.cgc
        body, w, dt = f.body, f.w, f.dtype
        n = len(body)
        pos = 0
        rec = 0
        self.constants, self.const_types, self.const_form, self.const_forms = [], [], None, []
        self.metadata = None
        while pos < n:
            off = 1 + pos
            self.where.at(f.path, rec, off)
            if self.metadata is not None:
                fail_at(f.path, rec, off, "a record follows the opgraph metadata record (it must be last)")
            if pos + 2 * w > n:
                fail_at(f.path, rec, off, "constant header runs past the end of the file (truncated)")
            rtype, length = (int(x) for x in body[pos:pos + 2 * w].view(dt))
            if length < 0:
                fail_at(f.path, rec, off, f"negative data length {length}")
            if length > n - pos - 2 * w:
                fail_at(f.path, rec, off, f"data length {length} runs past the end of the file "
                                          f"({n - pos - 2 * w} bytes left; truncated?)")
            data = body[pos + 2 * w:pos + 2 * w + length]
            if rtype == METADATA_RECORD:
                self.metadata = (rec, off, data)
            elif rtype == SUBGRAPH_RECORD:
                if self.embedded:
                    fail_at(f.path, rec, off, "a subgraph record inside a subgraph record (every body is stored "
                                              "once, in the top-level .cgc file)")
                self.bodies[rec] = self._read_subgraph(rec, off, off + 2 * w, data)
            else:
                if self.bodies and not self.embedded:
                    fail_at(f.path, rec, off, f"constant record (type {rtype}) after a subgraph record (constants come "
                                              f"first: constant i is record i)")
                def fail(msg: str, rec: int = rec, off: int = off) -> NoReturn:
                    fail_at(f.path, rec, off, msg)

                self.constants.append(decode_constant(rtype, data, fail))
                self.const_types.append(rtype)
            pos += 2 * w + length
            rec += 1

    def _read_subgraph(self, rec: int, off: int, data_off: int, data: np.ndarray) -> Subgraph:
        """A subgraph record: int64 J, J bytes of JSON (format, version, name, file lengths), the four files."""
        path = self.cgc.path

        def fail(msg: str) -> NoReturn:
            fail_at(path, rec, off, f"subgraph record: {msg}")

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
        fail_at(self.cgc.path, self.metadata[0], self.metadata[1], f"opgraph metadata: {message}")

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
        if "save" in header and not is_tag(header["save"]):
            self._meta_fail(f"save tag {header['save']!r} is not 32 hex digits"[:200])
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
        starts = scan_file(f, CgioLayout(a))
        self.io_starts = starts
        t = a[starts].astype(np.int64)
        cnt = a[starts + 1].astype(np.int64) if len(starts) else np.zeros(0, np.int64)
        self.io_type, self.io_count = t, cnt

        def take(kind: int) -> tuple[np.ndarray, np.ndarray]:
            sel = t == kind
            s = starts[sel] + 2
            ids = a[ranges(s, s + cnt[sel])].astype(np.int64)
            rec = np.repeat(np.flatnonzero(sel), cnt[sel])
            return ids, rec

        self.sets, self.set_rec = take(IO_SET)
        self.gets, self.get_rec = take(IO_GET)
        sel = t == IO_COPY
        s = starts[sel] + 2
        c = cnt[sel]
        self.copy_src = a[ranges(s, s + c)].astype(np.int64)
        self.copy_dst = a[ranges(s + c, s + 2 * c)].astype(np.int64)
        self.copy_rec = np.repeat(np.flatnonzero(sel), c)

    def _io_fail(self, rec: int, message: str) -> NoReturn:
        fail_at(self.cgio.path, rec, self.cgio.byte_of(int(self.io_starts[rec])), message)

    # ---------------------------------------------------------- .cgs
    def _read_cgs(self) -> None:
        # Headers as arrays; the texts are cut from one decoded string when they are ASCII or the
        # file is Latin-1 (one character per byte), else decoded one by one.
        f = self.cgs
        self.where.at(f.path, 0, 1)
        layout = CgsLayout(f.body, f.w, f.dtype)
        starts = scan_file(f, layout)
        w = f.w
        ints = layout.ints
        self.sym_starts = starts
        self.sym_t = ints[starts].astype(np.int64) if len(starts) else np.zeros(0, np.int64)
        self.sym_idx = ints[starts + w].astype(np.int64) if len(starts) else np.zeros(0, np.int64)
        nl = ints[starts + 2 * w].astype(np.int64) if len(starts) else np.zeros(0, np.int64)
        dl = ints[starts + 3 * w].astype(np.int64) if len(starts) else np.zeros(0, np.int64)
        name_at = starts.astype(np.int64) + 4 * w
        self.sym_name = (name_at, name_at + nl)
        self.sym_desc = (name_at + nl, name_at + nl + dl)
        enc = "utf-8"
        ascii_text = True
        if len(starts):
            high = np.flatnonzero(f.body >= 0x80)
            if len(high):  # a byte >= 0x80 in a text (not in a header) means the text is not ASCII
                rec = np.searchsorted(starts, high, side="right") - 1
                ascii_text = not (high >= name_at[rec]).any()
        self.sym_whole: str | None = None
        self.sym_parts: list[str] | None = None
        if ascii_text or not len(starts):
            self.sym_whole = f.body.tobytes().decode("latin-1") if len(starts) else ""
        else:
            raw = f.body.tobytes()
            bounds = np.stack([name_at, name_at + nl, name_at + nl + dl], axis=1).tolist()
            texts = [raw[a:b] for a, b, _ in bounds] + [raw[b:c] for _, b, c in bounds]
            try:
                for t in texts:
                    t.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                enc = "latin-1"
            if enc == "latin-1":
                self.sym_whole = raw.decode("latin-1")
            else:
                self.sym_parts = [t.decode("utf-8", "surrogatepass") for t in texts]
        self.text_encoding = enc

    def _sym_texts(self, which: str, recs: np.ndarray) -> list[str]:
        """The names (``which="name"``) or descriptions of symbol records ``recs``."""
        if self.sym_parts is not None:
            shift = 0 if which == "name" else len(self.sym_t)
            return [self.sym_parts[shift + r] for r in recs.tolist()]
        lo, hi = self.sym_name if which == "name" else self.sym_desc
        whole = self.sym_whole
        assert whole is not None
        return [whole[a:b] for a, b in zip(lo[recs].tolist(), hi[recs].tolist(), strict=True)]

    def _sym_fail(self, rec: int, message: str) -> NoReturn:
        fail_at(self.cgs.path, rec, 1 + int(self.sym_starts[rec]), message)

    # ---------------------------------------------------------- all together
    def read(self, check: Callable[[_Reader, str | None], None] | None = None) -> Graph:
        """The graph; ``check(self, save tag of the .cgc file or None)`` runs once the .cgc file is read."""
        self.check = check
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
                                 + len(self.cgs.body) + 1, MAX_INDEX)
        self._read_cg()
        self._read_cgc()
        header = self._read_metadata()
        if self.check is not None:  # before anything compares the files with each other
            self.check(self, header.get("save") if header is not None else None)
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
        # opgraph's writer lists every op of your own a file uses (op_names, written whenever there is one) since
        # before save tags and subgraph records: such a file that does not list an id does not use it.
        recorded: list[int] | None = None
        if header is not None and ("op_names" in header or "save" in header or self.embedded):
            recorded = [int(k) for k in saved if isinstance(k, str) and k.isascii() and k.isdigit()]
        for k in kinds.tolist():
            try:
                opdefs[k] = get_op(k) if k < 2**31 else None  # type: ignore[assignment]
            except KeyError:
                opdefs[k] = None  # type: ignore[assignment]
            name = saved.get(str(k))
            name = name if isinstance(name, str) else None
            if opdefs[k] is None:
                self._cg_fail(int(np.flatnonzero(self.kind == k)[0]),
                              unknown_op_message(k, saved_name=name and name[:200], called="function type",
                                                 recorded=recorded))
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
        sym_vals = np.flatnonzero(self.sym_t == 3)
        if len(sym_vals):
            idx = self.sym_idx[sym_vals]
            bad = idx >= limit
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                self._sym_fail(int(sym_vals[k]), f"variable index {int(idx[k])} is out of range")
            n_ref = max(n_ref, int(idx.max()) + 1)

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
            found = detect_io_base(self.sets, self.gets, produced, const_out, limit)
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
        # outputs): such copies are checked and made update edges by scalar_copies, at the end.
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
        form, forms = self._constant_forms()
        form_default = np.array([const_record_default_of(dt, len(shape), header is None) for dt, shape in forms],
                                dtype=np.int64)
        if len(form) and not np.array_equal(form_default[form], self.const_types):
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
                graph, rows = scalar_copies(graph, self.io_count[self.io_type == IO_COPY].tolist())
            except CopyProblem as exc:
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
            fail_at(self.cgio.path, 0, 1, "the set/get indices fit neither 0-based nor 1-based reading")
        _, first = np.unique(s, return_index=True)
        dup = np.setdiff1d(np.arange(len(s)), first)
        k = int(dup[0]) if len(dup) else 0
        self._io_fail(int(self.set_rec[k]), "a variable is set twice" if len(dup) else
                      "the set/get indices fit neither 0-based nor 1-based reading")

    def _constant_forms(self) -> tuple[np.ndarray, list[tuple[np.dtype, tuple[int, ...]]]]:
        """Per constant, its index in the distinct (dtype, shape) pairs (in order of first use), and those."""
        if self.const_form is None:  # decoded record by record
            ids: dict[tuple[str, tuple[int, ...]], int] = {}
            self.const_form = np.array([ids.setdefault((c.dtype.str, c.shape), len(ids)) for c in self.constants],
                                       dtype=np.int64)
            firsts = {k: i for i, k in reversed(list(enumerate(self.const_form.tolist())))}
            self.const_forms = [(self.constants[firsts[k]].dtype, self.constants[firsts[k]].shape)
                                for k in range(len(ids))]
        return self.const_form, self.const_forms

    def _typed_tenscalc(self, n_ops: int, n_vals: int, opdefs: dict[int, OpDef]) -> tuple[Any, ...]:
        types: list[ValueType] = [F64_UNKNOWN]
        type_ids: dict[ValueType, int] = {F64_UNKNOWN: 0}
        # Types interned per distinct (dtype, shape) of the constants, not per constant.
        form, forms = self._constant_forms()
        form_tid = np.array([type_ids.setdefault(TensorType(dt, shape), len(type_ids)) for dt, shape in forms],
                            dtype=np.int32)
        const_tid = form_tid[form] if len(form) else np.zeros(0, np.int32)
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
                types.append(dec_type(t))
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
                    pairs.append((pair[0], dec_attr(pair[1], bodies=self.bodies)))
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
                return self.kind[lo:lo + CHUNK].astype(np.int64) * width + op_attr[lo:lo + CHUNK]

            distinct: set[int] = set()
            for lo in range(0, n_ops, CHUNK):  # in chunks: the temporaries stay small
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
                              for lo in range(0, n_ops, CHUNK) if (keys(lo) == kk).any())
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
        t_arr, idx_arr = self.sym_t, self.sym_idx
        lim = np.array([0, nconst, n_ops, n_vals, n_io], dtype=np.int64)[t_arr]
        bad = idx_arr >= lim
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            t, idx = int(t_arr[i]), int(idx_arr[i])
            self._sym_fail(i, f"{SYM_KIND[t]} index {idx} is out of range ({limits[t]} exist)")
        # Later records win, as they always have: dict() keeps the last value of a repeated key.
        tables: dict[int, dict[int, str]] = {}
        has_name = self.sym_name[1] > self.sym_name[0]
        for t in (1, 2, 3, 4):
            recs = np.flatnonzero(has_name & (t_arr == t))
            tables[t] = dict(zip(idx_arr[recs].tolist(), self._sym_texts("name", recs), strict=True))
        recs = np.flatnonzero(self.sym_desc[1] > self.sym_desc[0])
        kind_names = [SYM_KIND.get(t, "") for t in range(5)]
        descriptions: dict[tuple[str, int], str] = dict(zip(
            zip([kind_names[t] for t in t_arr[recs].tolist()], idx_arr[recs].tolist(), strict=True),
            self._sym_texts("desc", recs), strict=True))
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
        # Records not in strictly increasing (type, index) order: remembered, to be written again so.
        dt, di = np.diff(t_arr), np.diff(idx_arr)
        if not ((dt > 0) | ((dt == 0) & (di > 0))).all():
            self.file_meta["cg_cgs_order"] = tuple(zip(t_arr.tolist(), idx_arr.tolist(), strict=True))
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
        fail_at(self.cg.path, 0, 1, f"{problem}{more}")
