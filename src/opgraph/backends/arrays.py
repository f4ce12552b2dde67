"""The array types opgraph takes in and gives back: NumPy, jax and torch arrays, described without copying.

:func:`describe` reads an array's kind (``"numpy"``, ``"jax"``, ``"torch"``), dtype (as a NumPy dtype), shape and
device without converting it, so a trace cache key or a feed check costs no copy and no device-to-host transfer.
An engine's module is never imported here: a jax or torch array can only exist once its library is loaded.
:func:`to_numpy` and :func:`convert` move an array between kinds through the engine that owns the target kind
(:meth:`Backend.as_own <opgraph.backends.base.Backend.as_own>`: DLPack between torch and jax, zero-copy NumPy
views of CPU tensors), and :func:`check_feed` refuses what opgraph cannot take as a feed.

    >>> import numpy as np
    >>> describe(np.zeros((2, 3), np.float32))
    ArrayInfo(kind='numpy', dtype=dtype('float32'), shape=(2, 3), device='cpu')
    >>> describe(3.0) is None
    True
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ArrayInfo", "check_feed", "convert", "copy", "describe", "kind_of", "to_numpy"]


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


def keyer(tp: type) -> Callable[[Any], tuple[np.dtype, tuple[int, ...]]] | None:
    """For arrays of type ``tp`` (NumPy, jax, torch), a function giving ``(dtype, shape)`` with the dtype as NumPy
    names it: the cheapest description, for cache keys read at every call (``opgraph.jit``); None for other types.

    >>> import numpy as np
    >>> keyer(np.ndarray)(np.zeros((2, 1), np.int8)), keyer(float)
    ((dtype('int8'), (2, 1)), None)
    """
    if tp is np.ndarray:
        return lambda a: (a.dtype, a.shape)
    root = tp.__module__.partition(".")[0]
    if root == "torch" and "torch" in sys.modules and issubclass(tp, sys.modules["torch"].Tensor):
        from opgraph.backends.torch.dtypes import TORCH_TO_NP

        return lambda a: (TORCH_TO_NP[a.dtype], tuple(a.shape))
    if root in ("jax", "jaxlib") and "jax" in sys.modules and issubclass(tp, sys.modules["jax"].Array):
        return lambda a: (np.dtype(a.dtype), a.shape)
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


def check_feed(x: Any, label: str) -> None:
    """Refuse a feed opgraph cannot take as it is: a torch tensor that requires grad (opgraph does not propagate
    torch's autograd, and reading its values would silently drop the graph), as one FeedError naming the input.

    >>> import numpy as np
    >>> check_feed(np.zeros(2), "%x") is None
    True
    """
    if getattr(x, "requires_grad", False) and kind_of(x) == "torch":
        from opgraph.errors import FeedError

        raise FeedError(f"input {label} is a torch tensor with requires_grad=True: opgraph does not propagate "
                        f"torch autograd; pass x.detach() (and use opgraph.grad for gradients)")


def to_numpy(x: Any) -> Any:
    """``x`` as a NumPy array if it is a jax or torch array (a view where the memory is on the CPU; a copy from
    a GPU); anything else is returned as it is.

    >>> import numpy as np
    >>> a = np.ones(2); to_numpy(a) is a, to_numpy(2.0)
    (True, 2.0)
    """
    kind = kind_of(x)
    if kind is None or kind == "numpy":
        return x
    from opgraph import backends

    return backends.get(kind).to_numpy(x)


def convert(x: Any, kind: str, device: str | None = None) -> Any:
    """``x`` (a NumPy, jax or torch array) as an array of ``kind`` on ``device`` (None: the CPU, or where ``x``
    is when it is of that kind already), without a copy where the engines allow it (DLPack, NumPy views).

    >>> import numpy as np
    >>> a = np.arange(3.0)
    >>> convert(a, "numpy") is a
    True
    """
    if kind == "numpy":
        return to_numpy(x)
    from opgraph import backends

    return backends.get(kind).as_own(x, device)


def copy(x: Any) -> Any:
    """A copy of ``x`` that shares no memory with it, in its own kind (jax arrays are immutable: as they are).

    >>> import numpy as np
    >>> a = np.ones(2); b = copy(a); b is not a and not np.shares_memory(a, b)
    True
    """
    kind = kind_of(x)
    if kind == "torch":
        return x.clone()
    if kind == "jax":
        return x
    return np.array(x, copy=True)


def owns_numpy(a: Any, dt: np.dtype, shape: tuple[int, ...]) -> bool:
    """True when ``a`` is a NumPy array of dtype ``dt`` and shape ``shape``: the check of
    :meth:`~opgraph.backends.base.Backend.owns` for engines that take NumPy arrays as they are (numba), which a
    program's direct call inlines.

    >>> owns_numpy(np.zeros(2), np.dtype("float64"), (2,)), owns_numpy([0.0, 0.0], np.dtype("float64"), (2,))
    (True, False)
    """
    return type(a) is np.ndarray and a.dtype == dt and a.shape == shape
