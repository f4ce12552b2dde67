"""The NumPy engine's kernels of fused ops: ``matmul_t`` on 2-D operands as one direct BLAS call.

    >>> a = np.arange(4.0).reshape(2, 2)
    >>> BACKEND.kernel_for("matmul_t", 12)(a, a, transpose_a=True, transpose_b=False)
    array([[ 4.,  6.],
           [ 6., 10.]])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.backends.numpy import BACKEND


@BACKEND.rule("matmul_t")
def _matmul_t_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, *,
                     transpose_a: bool, transpose_b: bool) -> np.ndarray:
    # the op's reference computation; a compiled program on 2-D operands calls what specialize gives instead
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return np.asarray(np.matmul(a, b, out=out))


def _matmul_ta(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.matmul(a.T, b, out)  # type: ignore[no-any-return]


def _matmul_tb(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.matmul(a, b.T, out)  # type: ignore[no-any-return]


def _matmul_tab(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.matmul(a.T, b.T, out)  # type: ignore[no-any-return]


def _matmul_t_specialize(in_types: Sequence[Any], out_types: Sequence[Any],
                         attrs: Mapping[str, Any]) -> tuple[Callable[..., Any], tuple[()], tuple[()]] | None:
    """For 2-D operands (where ``.T`` swaps the last two axes): one small function per transpose pattern.

    >>> from opgraph.core.types import TensorType
    >>> t = TensorType("f8", (2, 2))
    >>> _matmul_t_specialize([t, t], [t], {"transpose_a": True, "transpose_b": False})[0].__name__
    '_matmul_ta'
    """
    if any(t.shape is None or len(t.shape) != 2 for t in in_types):
        return None
    fn = {(False, False): np.matmul, (True, False): _matmul_ta, (False, True): _matmul_tb,
          (True, True): _matmul_tab}[bool(attrs["transpose_a"]), bool(attrs["transpose_b"])]
    return fn, (), ()


_matmul_t_kernel.specialize = _matmul_t_specialize  # type: ignore[attr-defined]
