"""The dask engine's rules for contractions (partial products summed in
:func:`~opgraph.backends.dask.blocks.acc_dtype`).

    >>> from opgraph.backends.dask import BACKEND
    >>> sorted(k for k in BACKEND.rules if k in ("matmul", "einsum"))
    ['einsum', 'matmul']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask.array as da

from opgraph.backends.base import OpInfo
from opgraph.backends.dask import BACKEND
from opgraph.backends.dask.blocks import acc_dtype


@BACKEND.rule("matmul")
def _matmul(info: OpInfo) -> Callable[..., Any]:
    dt = info.out_dtype
    acc = acc_dtype(dt)
    return lambda a, b: da.matmul(a.astype(acc), b.astype(acc)).astype(dt)



@BACKEND.rule("einsum")
def _einsum(info: OpInfo) -> Callable[..., Any]:
    subscripts, dt = str(info.attrs["subscripts"]), info.out_dtype
    acc = acc_dtype(dt)
    return lambda *xs: da.einsum(subscripts, *[x.astype(acc) for x in xs]).astype(dt)


@BACKEND.rule("tensordot")
def _tensordot(info: OpInfo) -> Callable[..., Any]:
    axes, dt = info.attrs["axes"], info.out_dtype
    acc = acc_dtype(dt)
    return lambda a, b: da.tensordot(a.astype(acc), b.astype(acc), axes=axes).astype(dt)


@BACKEND.rule("vecdot")
def _vecdot(info: OpInfo) -> Callable[..., Any]:
    axis, dt = int(info.attrs["axis"]), info.out_dtype
    return lambda a, b: da.sum(da.conj(a) * b, axis=axis, dtype=dt).astype(dt)


@BACKEND.rule("outer")
def _outer(info: OpInfo) -> Callable[..., Any]:
    dt = info.out_dtype
    return lambda a, b: da.outer(a, b).astype(dt)
