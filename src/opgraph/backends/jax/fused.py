"""The jax engine's rules for fused ops.

    >>> from opgraph.backends.jax import BACKEND
    >>> BACKEND.supports("fma"), BACKEND.supports("matmul_t")
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from opgraph.backends.base import OpInfo
from opgraph.backends.jax import BACKEND
from opgraph.backends.jax.dtypes import common_dtype


@BACKEND.rule("fma")
def _fma(info: OpInfo) -> Callable[..., Any]:
    dt = common_dtype(info)
    return lambda a, b, c: a.astype(dt) * b.astype(dt) + c.astype(dt)


@BACKEND.rule("matmul_t")
def _matmul_t(info: OpInfo) -> Callable[..., Any]:
    ta, tb, dt = info.attrs["transpose_a"], info.attrs["transpose_b"], info.out_dtype

    def mm(a: Any, b: Any) -> Any:
        a, b = a.astype(dt), b.astype(dt)
        return jnp.matmul(jnp.swapaxes(a, -1, -2) if ta else a, jnp.swapaxes(b, -1, -2) if tb else b)
    return mm
