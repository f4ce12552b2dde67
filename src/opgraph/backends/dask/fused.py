"""The dask engine's rules for fused ops.

    >>> from opgraph.backends.dask import BACKEND
    >>> "matmul_t" in BACKEND.rules
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask.array as da

from opgraph.backends.base import OpInfo
from opgraph.backends.dask import BACKEND
from opgraph.backends.dask.blocks import acc_dtype


@BACKEND.rule("matmul_t")
def _matmul_t(info: OpInfo) -> Callable[..., Any]:
    ta, tb, dt = bool(info.attrs["transpose_a"]), bool(info.attrs["transpose_b"]), info.out_dtype
    acc = acc_dtype(dt)

    def run(a: Any, b: Any) -> Any:
        a, b = a.astype(acc), b.astype(acc)
        return da.matmul(da.swapaxes(a, -1, -2) if ta else a, da.swapaxes(b, -1, -2) if tb else b).astype(dt)
    return run
