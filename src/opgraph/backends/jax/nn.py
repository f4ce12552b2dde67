"""The jax engine's rules for neural-network ops.

    >>> from opgraph.backends.jax import BACKEND
    >>> BACKEND.supports("conv"), BACKEND.supports("relu")
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from opgraph.backends.base import OpInfo
from opgraph.backends.jax import BACKEND
from opgraph.backends.jax.dtypes import promoting

# relu is an elementwise map like those of elementwise.py, so it promotes as they do; a NaN stays NaN as in NumPy
BACKEND.rules_from({
    "relu": lambda x: jnp.where(x > 0, x, jnp.where(jnp.isnan(x), x, jnp.zeros((), x.dtype)))
    if jnp.issubdtype(x.dtype, jnp.floating) else jnp.maximum(x, jnp.zeros((), x.dtype)),
}, promoting)


@BACKEND.rule("softmax", "log_softmax")
def _softmax(info: OpInfo) -> Callable[..., Any]:
    fn = jax.nn.softmax if info.kind == "softmax" else jax.nn.log_softmax
    axis = info.attrs["axis"]
    return lambda x: fn(x, axis=axis)


@BACKEND.rule("conv2d")
def _conv2d(info: OpInfo) -> Callable[..., Any]:
    from opgraph.ops.nn import pad4

    a = info.attrs
    t, bo, le, ri = pad4(a["padding"])
    pads = [(t, bo), (le, ri)]
    dt = info.out_dtype

    def conv(x: Any, w: Any) -> Any:
        batched = x.ndim == 4  # a (C, H, W) input is one sample
        y = lax.conv_general_dilated((x if batched else x[None]).astype(dt), w.astype(dt), tuple(a["stride"]),
                                     pads, rhs_dilation=tuple(a["dilation"]), feature_group_count=a["groups"],
                                     precision=lax.Precision.HIGHEST)
        return y if batched else y[0]
    return conv


@BACKEND.rule("max_pool2d", "avg_pool2d")
def _pool2d(info: OpInfo) -> Callable[..., Any]:
    from opgraph.ops.nn import pad4

    a = info.attrs
    k = tuple(a["kernel_size"])
    s = tuple(a["stride"] if a["stride"] is not None else k)
    t, bo, le, ri = pad4(a["padding"])
    lead = len(info.in_types[0].shape) - 2  # type: ignore[union-attr,arg-type]
    pads = ((0, 0),) * lead + ((t, bo), (le, ri))
    win, strides = (1,) * lead + k, (1,) * lead + s
    if info.kind == "max_pool2d":
        return lambda x: lax.reduce_window(x, -jnp.inf, lax.max, win, strides, pads)
    count_pad = a["count_include_pad"]

    def avg(x: Any) -> Any:
        total = lax.reduce_window(x, jnp.zeros((), x.dtype), lax.add, win, strides, pads)
        if count_pad:
            return total / np.prod(k)
        ones = jnp.ones((1,) * lead + x.shape[-2:], x.dtype)
        n = lax.reduce_window(ones, jnp.zeros((), x.dtype), lax.add, win, strides, pads)
        return total / n
    return avg


def _spatial(info: OpInfo, nsp: int) -> tuple[tuple[int, ...], list[tuple[int, int]], tuple[int, ...]]:
    a = info.attrs
    stride = tuple(a["stride"]) if a.get("stride") is not None else (1,) * nsp
    pads = [tuple(p) for p in a["padding"]] if a.get("padding") is not None else [(0, 0)] * nsp
    dil = tuple(a["dilation"]) if a.get("dilation") is not None else (1,) * nsp
    return stride, pads, dil  # type: ignore[return-value]


@BACKEND.rule("conv")
def _conv(info: OpInfo) -> Callable[..., Any]:
    nsp = len(info.in_types[0].shape) - 2  # type: ignore[union-attr,arg-type]
    stride, pads, dil = _spatial(info, nsp)
    groups, dt = info.attrs["groups"], info.out_dtype
    return lambda x, w: lax.conv_general_dilated(x.astype(dt), w.astype(dt), stride, pads, rhs_dilation=dil,
                                                 feature_group_count=groups, precision=lax.Precision.HIGHEST)


@BACKEND.rule("max_pool", "avg_pool")
def _pool(info: OpInfo) -> Callable[..., Any]:
    nsp = len(info.in_types[0].shape) - 2  # type: ignore[union-attr,arg-type]
    stride, pads, dil = _spatial(info, nsp)
    k = tuple(info.attrs["kernel_size"])
    win, strides, wdil = (1, 1, *k), (1, 1, *stride), (1, 1, *dil)
    full = [(0, 0), (0, 0), *pads]
    if info.kind == "max_pool":
        return lambda x: lax.reduce_window(x, -jnp.inf, lax.max, win, strides, full, window_dilation=wdil)
    count_pad = info.attrs["count_include_pad"]

    def avg(x: Any) -> Any:
        zero = jnp.zeros((), x.dtype)
        total = lax.reduce_window(x, zero, lax.add, win, strides, full, window_dilation=wdil)
        if count_pad:  # without ceil_mode every window lies inside the padded input: all its cells count
            return total / np.prod(k)
        ones = jnp.ones((1, 1, *x.shape[2:]), x.dtype)
        return total / lax.reduce_window(ones, zero, lax.add, win, strides, full, window_dilation=wdil)
    return avg


@BACKEND.limit("max_pool", "avg_pool")
def _pool_limit(info: OpInfo) -> str | None:
    if info.attrs.get("ceil_mode"):
        return "jax's rule has no ceil_mode (its partial last windows)"
    return _float_input(info)
@BACKEND.limit("max_pool2d", "avg_pool2d")
def _float_input(info: OpInfo) -> str | None:
    return None if info.in_dtypes and info.in_dtypes[0].kind == "f" else "jax's rule here is for floats"
