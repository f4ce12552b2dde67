"""numba for the NumPy engine's compiled loops, loaded only for arrays large enough to repay its import.

Importing numba costs about 0.4 s, which only arrays of millions of elements
or many calls repay; a compiled program loads it when it is built (a kernel's
``specialize`` hook passes ``load=True``). ``OPGRAPH_NUMBA=0`` (or
``opgraph.core.accel.enabled = False``) keeps the NumPy paths.

    >>> numba_for(10) is None   # too small to use the compiled loops
    True
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

NUMBA_MIN = 1 << 15
"""Arrays of at least this many elements use the compiled loops once numba is loaded."""
NUMBA_LOAD_MIN = 1 << 21
"""Arrays of at least this many elements load numba (when it is installed and enabled)."""

_missing = False  # numba failed to import once: not tried again


def numba_for(n: int, *, load: bool = False) -> Any:
    """The numba module when the compiled loops should run on an array of ``n`` elements, else None.

    None for small arrays, with numba missing, disabled (``OPGRAPH_NUMBA=0``, ``NUMBA_DISABLE_JIT``) or not
    loaded yet for an array below :data:`NUMBA_LOAD_MIN` (``load``: load it for any array that would use
    the loops, as a compiled program does once, when it is built).

    >>> numba_for(NUMBA_MIN - 1, load=True) is None
    True
    """
    global _missing
    from opgraph.core import accel

    if not accel.enabled or n < NUMBA_MIN or _missing:
        return None
    if n < NUMBA_LOAD_MIN and not load and "numba" not in sys.modules:
        return None
    try:
        import numba
    except Exception:  # missing, or broken against this NumPy
        _missing = True
        return None
    return None if numba.config.DISABLE_JIT else numba


def prepare_loops(in_types: Sequence[Any], out_types: Sequence[Any], attrs: Mapping[str, Any]) -> None:
    """A kernel's ``specialize`` hook: at compile time, load numba for a float32 input of a static shape large
    enough to use the compiled loops, so a compiled program pays the import once, when it is built; the
    kernel stays (None).

    >>> from opgraph.core.types import TensorType
    >>> prepare_loops([TensorType("f4", (4,))], [], {}) is None
    True
    """
    t = in_types[0]
    if t.dtype == np.float32 and t.shape is not None and None not in t.shape:
        numba_for(int(np.prod(t.shape)), load=True)
