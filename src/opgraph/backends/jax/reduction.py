"""The jax engine's rules for reductions and scans.

    >>> from opgraph.backends.jax import BACKEND
    >>> BACKEND.supports("sum"), BACKEND.supports("cumsum")
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np

from opgraph.backends.base import OpInfo
from opgraph.backends.jax import BACKEND
from opgraph.backends.jax.dtypes import Rule, axes, real_input


def _reduce(fn: Callable[..., Any], with_dtype: bool) -> Rule:
    def factory(info: OpInfo) -> Callable[..., Any]:
        ax, kd, dt = axes(info), info.attrs.get("keepdims", False), info.out_dtype
        if with_dtype:
            return lambda x: fn(x, axis=ax, keepdims=kd, dtype=dt)
        if dt.kind in "fc" and info.in_dtypes[0].kind in "biu":  # logsumexp of integers: in NumPy's float
            return lambda x: fn(x.astype(dt), axis=ax, keepdims=kd)
        return lambda x: fn(x, axis=ax, keepdims=kd)
    return factory


BACKEND.rules_from({"sum": (jnp.sum, True), "prod": (jnp.prod, True), "max": (jnp.max, False),
                    "min": (jnp.min, False), "mean": (jnp.mean, True), "any": (jnp.any, False),
                    "all": (jnp.all, False), "logsumexp": (jsp.logsumexp, False)}, lambda e: _reduce(*e))


@BACKEND.rule("var", "std")
def _var(info: OpInfo) -> Callable[..., Any]:
    fn = jnp.var if info.kind == "var" else jnp.std
    ax, kd, ddof = axes(info), info.attrs["keepdims"], info.attrs["correction"]
    work = info.out_dtype if info.in_dtypes[0].kind in "biu" else info.in_dtypes[0]
    return lambda x: fn(x.astype(work), axis=ax, keepdims=kd, ddof=ddof)


@BACKEND.rule("argmax", "argmin")
def _argmax(info: OpInfo) -> Callable[..., Any]:
    fn = jnp.argmax if info.kind == "argmax" else jnp.argmin
    ax, kd = axes(info), info.attrs["keepdims"]
    if ax is None:
        if kd:
            rank = len(info.in_types[0].shape)  # type: ignore[union-attr,arg-type]
            return lambda x: fn(x.reshape(-1)).astype(np.int64).reshape((1,) * rank)
        return lambda x: fn(x.reshape(-1)).astype(np.int64)
    (a,) = ax
    return lambda x: fn(x, axis=a, keepdims=kd).astype(np.int64)


@BACKEND.rule("cumsum", "cumprod")
def _cum(info: OpInfo) -> Callable[..., Any]:
    fn = jnp.cumsum if info.kind == "cumsum" else jnp.cumprod
    ax, dt = axes(info), info.out_dtype
    if ax is None:
        return lambda x: fn(x.reshape(-1), dtype=dt)
    (a,) = ax
    return lambda x: fn(x, axis=a, dtype=dt)


BACKEND.limit("argmax", "argmin", "max", "min")(real_input)
