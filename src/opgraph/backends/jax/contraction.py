"""The jax engine's rules for contractions.

    >>> from opgraph.backends.jax import BACKEND
    >>> BACKEND.supports("matmul"), BACKEND.supports("einsum")
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jax import lax

from opgraph.backends.base import OpInfo
from opgraph.backends.jax import BACKEND
from opgraph.backends.jax.dtypes import promoting

BACKEND.rules_from({"matmul": jnp.matmul, "outer": jnp.outer}, promoting)


@BACKEND.rule("einsum")
def _einsum(info: OpInfo) -> Callable[..., Any]:
    subs, dt = info.attrs["subscripts"], info.out_dtype
    return lambda *xs: jnp.einsum(subs, *(x.astype(dt) for x in xs), precision=lax.Precision.HIGHEST)


@BACKEND.rule("tensordot")
def _tensordot(info: OpInfo) -> Callable[..., Any]:
    axes, dt = info.attrs["axes"], info.out_dtype
    return lambda a, b: jnp.tensordot(a.astype(dt), b.astype(dt), axes=axes)


@BACKEND.rule("vecdot")
def _vecdot(info: OpInfo) -> Callable[..., Any]:
    axis, dt = info.attrs["axis"], info.out_dtype
    return lambda a, b: jnp.sum(jnp.conj(a.astype(dt)) * b.astype(dt), axis=axis)
