"""The dask engine's rules for shape ops (reshapes, joins, slices, padding).

    >>> from opgraph.backends.dask import BACKEND
    >>> "reshape" in BACKEND.rules, "slice" in BACKEND.rules
    (True, False)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np

from opgraph.backends.base import OpInfo
from opgraph.backends.dask import BACKEND
from opgraph.backends.dask.blocks import Whole, axis_attr, static


@BACKEND.rule("reshape")
def _reshape(info: OpInfo) -> Callable[..., Any]:
    shape = static(info.out_types[0])

    def run(x: Any) -> Any:
        # dask reshapes blocks of whole trailing rows; where the blocks do not line up, fewer and larger ones
        x = x.rechunk({a: -1 for a in range(1, x.ndim)})
        try:
            return da.reshape(x, shape, merge_chunks=True)
        except NotImplementedError:
            return da.reshape(x.rechunk(-1), shape)
    return run


@BACKEND.rule("permute_dims")
def _permute(info: OpInfo) -> Callable[..., Any]:
    axes = info.attrs.get("axes")
    return lambda x: da.transpose(x, axes)


@BACKEND.rule("moveaxis")
def _moveaxis(info: OpInfo) -> Callable[..., Any]:
    src, dst = info.attrs["source"], info.attrs["destination"]
    return lambda x: da.moveaxis(x, src, dst)


@BACKEND.rule("broadcast_to")
def _broadcast_to(info: OpInfo) -> Callable[..., Any]:
    shape = static(info.out_types[0])
    return lambda x: da.broadcast_to(x, shape)


@BACKEND.rule("expand_dims")
def _expand_dims(info: OpInfo) -> Callable[..., Any]:
    axis = axis_attr(info.attrs)
    return lambda x: da.expand_dims(x, axis)


@BACKEND.rule("squeeze")
def _squeeze(info: OpInfo) -> Callable[..., Any]:
    axis = axis_attr(info.attrs)
    return lambda x: da.squeeze(x, axis)


@BACKEND.rule("concat")
def _concat(info: OpInfo) -> Callable[..., Any]:
    axis, dt = info.attrs.get("axis", 0), info.out_dtype
    if axis is None:
        return lambda *xs: da.concatenate([x.ravel().astype(dt) for x in xs], axis=0)
    return lambda *xs: da.concatenate([x.astype(dt) for x in xs], axis=int(axis))


@BACKEND.rule("stack")
def _stack(info: OpInfo) -> Callable[..., Any]:
    axis, dt = int(info.attrs["axis"]), info.out_dtype
    return lambda *xs: da.stack([x.astype(dt) for x in xs], axis=axis)


@BACKEND.rule("split")
def _split(info: OpInfo) -> Callable[..., Any]:
    shape = static(info.in_types[0])
    axis = int(info.attrs["axis"]) % len(shape)
    sections, n = info.attrs["sections"], shape[axis]
    points = [n * i // sections for i in range(sections + 1)] if isinstance(sections, int) else [0, *sections, n]
    lead = (slice(None),) * axis
    if len(points) == 2:
        return lambda x: x
    return lambda x: tuple(x[(*lead, slice(a, b))] for a, b in itertools.pairwise(points))


@BACKEND.rule("getitem")
def _getitem(info: OpInfo) -> Callable[..., Any]:
    from opgraph.ops.shape import python_key

    key = python_key(info.attrs["index"], array_result=False)
    return lambda x: x[key]


@BACKEND.rule("take")
def _take(info: OpInfo) -> Callable[..., Any]:
    axis = info.attrs.get("axis")
    if len(static(info.in_types[1])) != 1:
        raise Whole("dask takes with 1-D indices only")
    return lambda x, i: da.take(x.ravel() if axis is None else x, i, axis=0 if axis is None else axis)


@BACKEND.rule("flip")
def _flip(info: OpInfo) -> Callable[..., Any]:
    axis = axis_attr(info.attrs)
    return lambda x: da.flip(x, axis)


@BACKEND.rule("roll")
def _roll(info: OpInfo) -> Callable[..., Any]:
    shift, axis = info.attrs["shift"], axis_attr(info.attrs)
    if axis is None:
        if not isinstance(shift, (int, np.integer)):
            raise Whole("dask rolls by one shift without an axis")
        return lambda x: da.roll(x, int(shift), None)
    # as NumPy: shifts and axes broadcast against each other, shifts along the same axis add up
    total: dict[int, int] = {}
    for sh, ax in zip(*np.broadcast_arrays(np.atleast_1d(shift), np.atleast_1d(axis)), strict=True):
        total[int(ax)] = total.get(int(ax), 0) + int(sh)
    shifts, axes = tuple(total.values()), tuple(total)
    return lambda x: da.roll(x, shifts, axes)


@BACKEND.rule("tile")
def _tile(info: OpInfo) -> Callable[..., Any]:
    reps = tuple(info.attrs["reps"])
    return lambda x: da.tile(x, reps)


@BACKEND.rule("repeat")
def _repeat(info: OpInfo) -> Callable[..., Any]:
    repeats, axis = info.attrs["repeats"], info.attrs.get("axis")
    if not isinstance(repeats, int):
        raise Whole("dask repeats every element the same number of times")
    return lambda x: da.repeat(x.ravel() if axis is None else x, repeats, axis=0 if axis is None else axis)


@BACKEND.rule("copy")
def _copy(info: OpInfo) -> Callable[..., Any]:
    return lambda x: x  # dask arrays are never written in place


@BACKEND.rule("pad")
def _pad(info: OpInfo) -> Callable[..., Any]:
    shape, mode, dt = static(info.in_types[0]), info.attrs["mode"], info.out_dtype
    pw = tuple(map(tuple, np.broadcast_to(np.asarray(info.attrs["pad_width"], dtype=np.int64), (len(shape), 2))))
    if mode in ("reflect", "symmetric", "wrap") and any(max(p) >= n for p, n in zip(pw, shape, strict=True)):
        raise Whole(f"dask pads in {mode} mode only by less than the axis's length")
    if mode == "constant":
        cv = np.asarray(info.attrs["constant_value"]).astype(dt)
        return lambda x: da.pad(x, pw, mode="constant", constant_values=cv)
    return lambda x: da.pad(x, pw, mode=mode)
