"""The .cg file set's constants (suffixes, magic bytes, record and gateway types) and shared helpers.

The helpers are what every part of the codec uses: where a problem is, chunked walks over CSR pointers,
base names.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from opgraph.core.types import TensorType
from opgraph.errors import FormatError

SUFFIXES = (".cg", ".cgc", ".cgio", ".cgs")
SAVE_SUFFIX = ".cgtag"
"""opgraph's companion of a .cg file set: the save tag and the four files' digests (:func:`read_save_text`)."""
SAVE_FORMAT = "opgraph.cg.save"
SAVE_VERSION = 1
COMMIT_ORDER = (SAVE_SUFFIX, ".cg", ".cgio", ".cgs", ".cgc")
"""The order in which a save renames its files into place: the companion first, the .cgc (holding the tag) last."""
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
SYM_FIELD = {1: "constants", 2: "ops", 3: "values", 4: "io"}

F64_UNKNOWN = TensorType("float64", None)
SMALL_STREAM = 1 << 14
"""Streams shorter than this many integers are scanned with a plain loop."""
MAX_INDEX = 2**31 - 1
CHUNK = 1 << 16
"""Whole-file steps work on about this many integers at a time (bounded temporaries)."""


# ---------------------------------------------------------------- errors
class Where:
    """Where the reader is (file, record, byte offset) for messages of unexpected errors."""

    def __init__(self) -> None:
        self.path = ""
        self.record: int | str = 0
        self.offset = 0

    def at(self, path: str, record: int | str = 0, offset: int = 0) -> None:
        self.path, self.record, self.offset = path, record, offset


def fail_at(path: str, record: int | str, offset: int, message: str) -> NoReturn:
    """Raise the reader's :class:`~opgraph.errors.FormatError`, naming file, record and byte offset.

    >>> fail_at("m.cg", 3, 25, "bad record")
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: m.cg: record 3 at byte offset 25: bad record
    """
    raise FormatError(f"{path}: record {record} at byte offset {offset}: {message}")


# ---------------------------------------------------------------- helpers
def op_chunks(n_ops: int, *ptrs: np.ndarray) -> Iterator[tuple[int, int]]:
    """Ranges ``[lo, hi)`` of ops with at most ``CHUNK`` ops and ids per CSR pointer (one op at least)."""
    lo = 0
    while lo < n_ops:
        hi = min(n_ops, lo + CHUNK)
        for ptr in ptrs:
            hi = min(hi, int(np.searchsorted(ptr, ptr[lo] + CHUNK, side="right")) - 1)
        hi = max(hi, lo + 1)
        yield lo, hi
        lo = hi


def max_count(ptr: np.ndarray) -> int:
    """Largest row length of a CSR pointer, a chunk at a time."""
    return max((int(np.diff(ptr[lo:lo + CHUNK + 1]).max()) for lo in range(0, len(ptr) - 1, CHUNK)), default=0)


def all_counts(ptr: np.ndarray, k: int) -> bool:
    """Whether every row of a CSR pointer has length ``k``."""
    return all(bool(np.all(np.diff(ptr[lo:lo + CHUNK + 1]) == k)) for lo in range(0, len(ptr) - 1, CHUNK))


def chunk_len(part: Any) -> int:
    if isinstance(part, tuple):
        return len(part[0]) * part[1].itemsize
    return len(part)


def base_path(path: str | os.PathLike[str]) -> str:
    """The base name of a .cg file set: ``path`` without one of the four suffixes.

    >>> base_path("runs/model.cgio"), base_path("runs/model"), base_path("runs/v1.2")
    ('runs/model', 'runs/model', 'runs/v1.2')
    """
    p = os.fspath(path)
    root, ext = os.path.splitext(p)
    return root if ext.lower() in SUFFIXES else p


def int_range(bits: int) -> int:
    """The largest signed integer of ``bits`` bits (the files' index width).

    >>> int_range(16), int_range(32)
    (32767, 2147483647)
    """
    return 2 ** (bits - 1) - 1


# ---------------------------------------------------------------- save tags
def digest(data: bytes | memoryview | np.ndarray) -> str:
    """A file's digest: the first 16 bytes of its SHA-256, as 32 hex digits (what the companion lists).

    SHA-256 because CPUs hash it fastest (SHA extensions); 128 bits tell saves apart.

    >>> digest(b"")
    'e3b0c44298fc1c149afbf4c8996fb924'
    """
    return hashlib.sha256(memoryview(data).cast("B") if isinstance(data, np.ndarray) else data).hexdigest()[:32]


def save_tag(cg: str, cgio: str, cgs: str) -> str:
    """The save tag of a set: the digest of the .cg, .cgio and .cgs digests (16 bytes each, in that order).

    It is written into the .cgc file (its metadata record) and into the companion file, so a loader can tell,
    without reading the other files again, whether they belong with that .cgc file.

    >>> import hashlib
    >>> parts = b"".join(hashlib.sha256(x).digest()[:16] for x in (b"a", b"b", b"c"))
    >>> save_tag(digest(b"a"), digest(b"b"), digest(b"c")) == hashlib.sha256(parts).hexdigest()[:32]
    True
    """
    return digest(bytes.fromhex(cg) + bytes.fromhex(cgio) + bytes.fromhex(cgs))


def is_tag(value: object) -> bool:
    """Whether ``value`` is a save tag or digest: 32 lowercase hex digits.

    >>> is_tag("0" * 32), is_tag("0" * 31), is_tag(None)
    (True, False, False)
    """
    return isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)


def save_file_text(files: dict[str, str]) -> bytes:
    """The companion file's bytes for the four digests (keys the suffixes): one line of ASCII JSON.

    >>> d = {s: digest(s.encode()) for s in SUFFIXES}
    >>> read_save_text(save_file_text(d), "m.cgtag").files == d
    True
    """
    doc = {"format": SAVE_FORMAT, "version": SAVE_VERSION,
           "save": save_tag(files[".cg"], files[".cgio"], files[".cgs"]),
           "files": {s.lstrip("."): files[s] for s in SUFFIXES}}
    return json.dumps(doc, separators=(",", ":")).encode("ascii") + b"\n"


@dataclass(frozen=True)
class SaveFile:
    """What a companion file says: the save's tag and the digest of each of the four files (by suffix)."""

    tag: str
    files: dict[str, str]


def read_save_text(text: bytes, path: str) -> SaveFile:
    """Parse a companion file; anything else is a :class:`~opgraph.errors.FormatError` naming ``path``.

    >>> read_save_text(b"{}", "m.cgtag")
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: m.cgtag: record 0 at byte offset 0: not an opgraph save tag file ...
    """
    try:
        doc = json.loads(text[:4096].decode("ascii")) if len(text) <= 4096 else None
    except (ValueError, RecursionError):
        doc = None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not (isinstance(doc, dict) and doc.get("format") == SAVE_FORMAT and doc.get("version") == SAVE_VERSION
            and is_tag(doc.get("save")) and isinstance(files, dict)
            and all(is_tag(files.get(s.lstrip("."))) for s in SUFFIXES)):
        fail_at(path, 0, 0, f"not an opgraph save tag file (format {SAVE_FORMAT!r}, version {SAVE_VERSION}, "
                            f"with the save tag and the digests of the four files); delete it if opgraph did not "
                            f"write it")
    got = {s: files[s.lstrip(".")] for s in SUFFIXES}
    tag = doc["save"]
    if tag != save_tag(got[".cg"], got[".cgio"], got[".cgs"]):
        fail_at(path, 0, 0, f"save tag {tag} is not the tag of the digests the file lists")
    return SaveFile(tag, got)
