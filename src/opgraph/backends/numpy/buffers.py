"""The arena's memory: byte buffers aligned for SIMD loads and typed views of them."""

from __future__ import annotations

import numpy as np

from opgraph.memory.plan import ALIGN


def aligned_empty(nbytes: int) -> np.ndarray:
    """A ``uint8`` array of ``nbytes`` whose data starts at a multiple of 64 bytes.

    >>> a = aligned_empty(100)
    >>> a.nbytes, a.ctypes.data % 64
    (100, 0)
    """
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes]


def typed_view(buf: np.ndarray, offset: int, nbytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The value at ``offset`` of ``buf`` (``nbytes`` long) as an array of ``dtype`` and ``shape``, sharing its memory.

    >>> typed_view(aligned_empty(64), 8, 16, np.dtype("float64"), (2,)).shape
    (2,)
    """
    return buf[offset:offset + nbytes].view(dtype).reshape(shape)
