"""Record boundaries in the .cg, .cgio and .cgs streams (:func:`scan_records`, vectorised); one of the four files."""

from __future__ import annotations

import math
import mmap
import os
import struct
from typing import Any

import numpy as np

from opgraph.core.registry import all_ops
from opgraph.io.cg.format import CHUNK, IO_COPY, IO_GET, IO_SET, MAGIC_DTYPES, SMALL_STREAM, SYM_KIND, fail_at


class ScanError(Exception):
    def __init__(self, record: int, pos: int, reason: str) -> None:
        super().__init__(reason)
        self.record, self.pos, self.reason = record, pos, reason


# ============================================================== scanning
class Layout:
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

    def plausible_one(self, p: int) -> bool:
        """:meth:`plausible` of one position."""
        return True


class CgLayout(Layout):
    """.cg: ``[type, nin, nout, ins..., outs...]`` or ``[0, constant, output]``."""

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.n = a, len(a)
        self._list: list[int] | None = a.tolist() if self.n < SMALL_STREAM else None
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

    def plausible_one(self, p: int) -> bool:
        if self._known is None:
            self.plausible(np.zeros(1, np.int64))
        assert self._known is not None
        t = self._get(p)
        return 0 <= t < len(self._known) and bool(self._known[t])

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
        for lo in range(0, len(rows), CHUNK):  # in chunks: the temporaries stay small
            blk = rows[lo:lo + CHUNK]
            if not (np.all(blk[:, 1] == a[1]) and np.all(blk[:, 2] == a[2]) and np.all(blk[:, 0] > 0)):
                return None
        return length


class CgioLayout(Layout):
    """.cgio: ``[type, n, vars...]`` (n vars, or 2n for copies)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.n = a, len(a)
        self._list: list[int] | None = a.tolist() if self.n < SMALL_STREAM else None

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


class CgsLayout(Layout):
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


def scan_records_reference(layout: Layout) -> np.ndarray:
    """Record starts by a plain loop over records (the reference for :func:`scan_records`)."""
    starts: list[int] = []
    pos, n = 0, layout.n
    while pos < n:
        length, reason = layout.step(pos)
        if reason is not None:
            raise ScanError(len(starts), pos, reason)
        starts.append(pos)
        pos += length
    return np.asarray(starts, dtype=np.int64)


TAIL_CURSORS = 16
"""A block scan moves this many cursors or fewer one at a time (:func:`_scan_tail`)."""


def _scan_tail(layout: Layout, active: np.ndarray, cur: np.ndarray, bend: np.ndarray, longest: int,
               visited: np.ndarray, exits: np.ndarray, bad_parts: list[np.ndarray],
               stepped_parts: list[np.ndarray]) -> None:
    """The cursor steps of :func:`scan_records` for cursors ``active``, one position at a time."""
    bad: list[int] = []
    stepped: list[int] = []
    for c in active.tolist():
        pos, end = int(cur[c]), int(bend[c])
        while True:
            length, reason = layout.step(pos)
            ok = reason is None
            good = ok and length <= longest and layout.plausible_one(pos)
            if good:
                visited[pos] = True
            elif not ok:
                bad.append(pos)
            else:
                stepped.append(pos)
            nxt = pos + length if good else pos + 1
            if nxt >= end:
                if good:
                    exits[c] = nxt
                break
            pos = nxt
    if bad:
        bad_parts.append(np.asarray(bad, dtype=np.int64))
    if stepped:
        stepped_parts.append(np.asarray(stepped, dtype=np.int64))


def scan_records(layout: Layout, *, block: int | None = None, dtype: Any = np.int64) -> np.ndarray:
    """Record start positions of a stream (int64, or ``dtype``), found with NumPy (see the module doc).

    Raises ``ScanError(record, position, reason)`` at the first bad record.
    ``block`` forces the block-cursor scan with that block size (for tests).

    >>> a = np.array([5, 1, 1, 0, 1, 0, 4, 2, 5, 0, 2, 3, 9, 7, 1, 1, 3, 10], dtype="<i4")
    >>> scan_records(CgLayout(a), block=4).tolist()
    [0, 5, 8, 13]
    """
    n = layout.n
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if block is None:
        hit = layout.uniform()
        if hit is not None:
            return hit.astype(dtype, copy=False)
        if n < SMALL_STREAM:
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
        if len(active) <= TAIL_CURSORS:
            # The last few cursors (in long records, one integer a step) go on one at a time: a NumPy
            # step costs the same for 3 cursors as for 3000.
            _scan_tail(layout, active, cur, bend, longest, visited, exits, bad_parts, stepped_parts)
            break
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
                    raise ScanError(count, pos, reason)
                extras.append(pos)
                count += 1
                pos += length
                continue
            visited[dirty:pos] = False
            bad, stepped = first_in(bad_skips, pos, be), first_in(stepped_skips, pos, be)
            end = min(bad, stepped)
            if bad < stepped:
                _, reason = layout.step(bad)
                raise ScanError(count + int(np.count_nonzero(visited[pos:bad])), bad, reason or "bad record")
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
    for lo in range(0, n, CHUNK):
        found = np.flatnonzero(visited[lo:lo + CHUNK])
        found += lo
        out[at:at + len(found)] = found
        at += len(found)
    return out


# ============================================================== files
def file_bytes(path: str, use_mmap: bool) -> np.ndarray:
    """A file's bytes, memory-mapped when ``use_mmap`` and it is large (over 64 KiB)."""
    # One open file gives the size and the bytes: a save that renames a new file over this path
    # meanwhile cannot hand us the size of one file and the bytes of another.
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if use_mmap and size > (1 << 16):
            return np.frombuffer(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ), dtype=np.uint8)
        return np.frombuffer(f.read(), dtype=np.uint8)


class CgFile:
    """One of the four files: magic, width and its bytes after the magic byte."""

    def __init__(self, path: str, suffix: str, raw: np.ndarray) -> None:
        # ``raw``: the file's bytes (:func:`file_bytes`), or those of a file embedded in a subgraph record
        # (``path`` then names where it is).
        self.path = path
        self.suffix = suffix
        size = len(raw)
        if size == 0:
            fail_at(path, 0, 0, "empty file (no magic byte)")
        self.raw = raw
        magic = int(raw[0])
        if magic not in MAGIC_DTYPES:
            fail_at(path, 0, 0, f"bad magic byte {magic} (expected 16, 32 or 64: the integer width in bits)")
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


def scan_file(f: CgFile, layout: Layout, dtype: Any = np.int64) -> np.ndarray:
    try:
        starts = scan_records(layout, dtype=dtype)
    except ScanError as e:
        unit = 1 if isinstance(layout, CgsLayout) else f.w
        fail_at(f.path, e.record, 1 + e.pos * unit, e.reason)
    if not isinstance(layout, CgsLayout):
        check_whole(f, len(starts))
    return starts


def check_whole(f: CgFile, n_records: int) -> None:
    """A file of integers must not end in part of one."""
    if len(f.body) % f.w:
        fail_at(f.path, n_records, 1 + (len(f.body) // f.w) * f.w,
                f"{len(f.body) % f.w} trailing byte(s) after the last record (truncated integer)")
