"""The array types opgraph takes in and gives back: NumPy, jax and torch arrays, described without copying.

:func:`describe` reads an array's kind (``"numpy"``, ``"jax"``, ``"torch"``), dtype (as a NumPy dtype), shape and
device without converting it, so a trace cache key or a feed check costs no copy and no device-to-host transfer.
An engine's module is never imported here: a jax or torch array can only exist once its library is loaded.

    >>> import numpy as np
    >>> describe(np.zeros((2, 3), np.float32))
    ArrayInfo(kind='numpy', dtype=dtype('float32'), shape=(2, 3), device='cpu')
    >>> describe(3.0) is None
    True
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ArrayInfo", "describe", "kind_of"]


@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """What an array is, read without copying it: its kind (the backend whose array type it is, or
    ``"numpy"``), its dtype as NumPy names it, its shape and its device (``"cpu"``, ``"cuda:0"``)."""

    kind: str
    dtype: np.dtype
    shape: tuple[int, ...]
    device: str


def kind_of(x: Any) -> str | None:
    """The array kind of ``x`` (``"numpy"``, ``"jax"``, ``"torch"``), or None where it is none of them.

    >>> import numpy as np
    >>> kind_of(np.ones(2)), kind_of([1.0])
    ('numpy', None)
    """
    if isinstance(x, np.ndarray):
        return "numpy"
    root = type(x).__module__.partition(".")[0]
    if root == "torch" and "torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor):
        return "torch"
    if root in ("jax", "jaxlib") and "jax" in sys.modules and isinstance(x, sys.modules["jax"].Array):
        return "jax"
    return None


def describe(x: Any) -> ArrayInfo | None:
    """Kind, dtype, shape and device of an array, or None for anything else (Python scalars, lists, lazy arrays).

    >>> import numpy as np
    >>> describe(np.arange(3)).shape
    (3,)
    """
    kind = kind_of(x)
    if kind == "numpy":
        return ArrayInfo("numpy", x.dtype, x.shape, "cpu")
    if kind == "torch":
        from opgraph.backends.torch.dtypes import TORCH_TO_NP

        return ArrayInfo("torch", TORCH_TO_NP[x.dtype], tuple(x.shape), str(x.device))
    if kind == "jax":
        dev = next(iter(x.devices()))
        where = "cpu" if dev.platform == "cpu" else f"cuda:{dev.id}"
        return ArrayInfo("jax", np.dtype(x.dtype), tuple(x.shape), where)
    return None
