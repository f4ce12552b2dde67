"""The dask engine's rules for reductions and scans.

    >>> from opgraph.backends.dask import BACKEND
    >>> BACKEND.rules["sum"].__name__
    '_reduction'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np

from opgraph.backends.base import OpInfo
from opgraph.backends.dask import BACKEND
from opgraph.backends.dask.blocks import Whole, axis_attr


@BACKEND.rule("sum", "prod", "max", "min", "mean", "any", "all", "var", "std")
def _reduction(info: OpInfo) -> Callable[..., Any]:
    fn = getattr(da, info.kind)
    kw: dict[str, Any] = {"axis": axis_attr(info.attrs), "keepdims": bool(info.attrs.get("keepdims", False))}
    if info.kind in ("sum", "prod", "mean") or (info.kind in ("var", "std") and info.in_dtypes[0].kind != "c"):
        kw["dtype"] = info.out_dtype
    if info.kind in ("var", "std"):
        kw["ddof"] = info.attrs.get("correction", 0.0)
    dt = info.out_dtype
    return lambda x: fn(x, **kw).astype(dt)


@BACKEND.rule("argmax", "argmin")
def _arg_reduction(info: OpInfo) -> Callable[..., Any]:
    fn, axis, keep = getattr(da, info.kind), info.attrs.get("axis"), bool(info.attrs.get("keepdims", False))
    if axis is None and keep:
        raise Whole("dask's argmax/argmin keep no dims without an axis")
    return lambda x: fn(x, axis=axis, keepdims=keep).astype(np.int64)


@BACKEND.rule("cumsum", "cumprod")
def _scan(info: OpInfo) -> Callable[..., Any]:
    fn, axis, dt = getattr(da, info.kind), info.attrs.get("axis"), info.out_dtype
    return lambda x: fn(x.ravel() if axis is None else x, axis=0 if axis is None else axis, dtype=dt)


@BACKEND.rule("logsumexp")
def _logsumexp(info: OpInfo) -> Callable[..., Any]:
    if info.in_dtypes[0].kind == "c":
        raise Whole("complex logsumexp has no chunked rule")
    axis, keep, dt = axis_attr(info.attrs), bool(info.attrs.get("keepdims", False)), info.out_dtype

    def run(x: Any) -> Any:  # scipy's formulation: the max of each slice taken out, then added back
        x = x.astype(dt)
        m = da.max(x, axis=axis, keepdims=True)
        m = da.where(da.isfinite(m), m, 0)
        out = da.log(da.sum(da.exp(x - m), axis=axis, keepdims=True)) + m
        return (out if keep else da.squeeze(out, axis=axis)).astype(dt)
    return run
