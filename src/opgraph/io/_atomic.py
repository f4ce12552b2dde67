"""Atomic writes of one file or a set of files.

Every file is written under a temporary name in its own directory, flushed
and fsynced; only when all of them are complete are they renamed over their
final names. An exception (or a full disk) before that point removes the
temporary files and leaves any earlier files untouched. The renames of a
set are separate system calls, so a crash *during* them can leave a mixed
set; each single file is always either old or new, never partial.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with atomic_files([os.path.join(d, "a.bin")]) as (f,):
    ...     _ = f.write(b"hello")
    >>> open(os.path.join(d, "a.bin"), "rb").read()
    b'hello'
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import BinaryIO


@contextlib.contextmanager
def atomic_files(paths: Sequence[str | os.PathLike[str]]) -> Iterator[list[BinaryIO]]:
    """Open temporary files for ``paths``; rename them into place if the block succeeds."""
    temps: list[tuple[BinaryIO, str, str]] = []
    try:
        for path in paths:
            final = os.fspath(path)
            fd, tmp = tempfile.mkstemp(prefix=os.path.basename(final) + ".", suffix=".tmp",
                                       dir=os.path.dirname(os.path.abspath(final)))
            temps.append((os.fdopen(fd, "wb"), tmp, final))
        yield [f for f, _, _ in temps]
        for f, _, _ in temps:
            f.flush()
            os.fsync(f.fileno())
            f.close()
    except BaseException:
        for f, tmp, _ in temps:
            f.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    for _, tmp, final in temps:
        os.replace(tmp, final)
