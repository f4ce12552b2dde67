"""Atomic writes for the io layer: :func:`opgraph._atomic.atomic_files`, documented there.

The writer lives in :mod:`opgraph._atomic`, beside :mod:`opgraph.errors` and
below every layer, because :mod:`opgraph.viz` (a layer under ``io``) saves its
drawings through it too. This module keeps the name the io writers import.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with atomic_files([os.path.join(d, "a.bin")]) as (f,):
    ...     _ = f.write(b"hello")
    >>> open(os.path.join(d, "a.bin"), "rb").read(), os.listdir(d)
    (b'hello', ['a.bin'])
"""

from __future__ import annotations

from opgraph._atomic import atomic_files

__all__ = ["atomic_files"]
