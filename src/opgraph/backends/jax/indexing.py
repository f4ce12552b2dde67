"""The jax engine's rules for indexing ops (sorting, triangles, one-hot).

    >>> from opgraph.backends.jax import BACKEND
    >>> BACKEND.supports("sort"), BACKEND.supports("one_hot")
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from opgraph.backends.base import OpInfo
from opgraph.backends.jax import BACKEND


@BACKEND.rule("sort")
def _sort(info: OpInfo) -> Callable[..., Any]:
    axis, descending = info.attrs["axis"], bool(info.attrs["descending"])

    def sort(x: Any) -> tuple[Any, Any]:
        # jnp.argsort is stable in both directions and sorts NaN last (first descending): the NumPy kernel's order
        idx = jnp.argsort(x, axis=axis, stable=True, descending=descending).astype(jnp.int64)
        return jnp.take_along_axis(x, idx, axis=axis), idx

    return sort


@BACKEND.rule("searchsorted")
def _searchsorted(info: OpInfo) -> Callable[..., Any]:
    side = info.attrs["side"]
    return lambda table, values: jnp.searchsorted(table, values, side=side).astype(jnp.int64)


@BACKEND.rule("trilu")
def _trilu(info: OpInfo) -> Callable[..., Any]:
    k, upper = info.attrs["k"], info.attrs["upper"]
    return (lambda x: jnp.triu(x, k)) if upper else (lambda x: jnp.tril(x, k))


@BACKEND.rule("one_hot")
def _one_hot(info: OpInfo) -> Callable[..., Any]:
    depth, axis = info.attrs["depth"], info.attrs["axis"]
    rank = len(info.out_shape)  # type: ignore[arg-type]
    ax = axis % rank
    dt = info.out_dtype

    def one_hot(i: Any, values: Any) -> Any:
        i = jnp.where(i < 0, i + depth, i)
        hot = jnp.expand_dims(i, ax) == jnp.arange(depth).reshape((depth,) + (1,) * (rank - 1 - ax))
        return jnp.where(hot, values[1].astype(dt), values[0].astype(dt))
    return one_hot
