"""The jax engine's rules for shape ops (reshapes, joins, slices, padding).

    >>> from opgraph.backends.jax import BACKEND
    >>> BACKEND.supports("reshape"), BACKEND.supports("pad")
    (True, True)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from opgraph.backends.base import OpInfo
from opgraph.backends.jax import BACKEND
from opgraph.backends.jax.dtypes import axes


@BACKEND.rule("reshape")
def _reshape(info: OpInfo) -> Callable[..., Any]:
    shape = tuple(info.attrs["shape"])
    return lambda x: jnp.reshape(x, shape)


@BACKEND.rule("permute_dims")
def _permute(info: OpInfo) -> Callable[..., Any]:
    axes = info.attrs["axes"]
    return lambda x: jnp.transpose(x, axes)


@BACKEND.rule("broadcast_to")
def _broadcast_to(info: OpInfo) -> Callable[..., Any]:
    shape = tuple(info.attrs["shape"])
    return lambda x: jnp.broadcast_to(x, shape)


@BACKEND.rule("expand_dims")
def _expand_dims(info: OpInfo) -> Callable[..., Any]:
    axis = tuple(info.attrs["axis"])
    return lambda x: jnp.expand_dims(x, axis)


@BACKEND.rule("squeeze")
def _squeeze(info: OpInfo) -> Callable[..., Any]:
    axis = axes(info)
    return lambda x: jnp.squeeze(x, axis)


@BACKEND.rule("concat")
def _concat(info: OpInfo) -> Callable[..., Any]:
    axis, dt = info.attrs["axis"], info.out_dtype
    if axis is None:
        return lambda *xs: jnp.concatenate([x.reshape(-1).astype(dt) for x in xs])
    return lambda *xs: jnp.concatenate([x.astype(dt) for x in xs], axis=axis)


@BACKEND.rule("stack")
def _stack(info: OpInfo) -> Callable[..., Any]:
    axis, dt = info.attrs["axis"], info.out_dtype
    return lambda *xs: jnp.stack([x.astype(dt) for x in xs], axis=axis)


@BACKEND.rule("split")
def _split(info: OpInfo) -> Callable[..., Any]:
    sections, axis = info.attrs["sections"], info.attrs["axis"]
    if isinstance(sections, int):
        return lambda x: tuple(jnp.split(x, sections, axis=axis))

    def split(x: Any) -> tuple[Any, ...]:  # as np.split: pieces x[a:b] between the points, Python slice rules
        ax = axis % x.ndim
        points = [0, *sections, x.shape[ax]]
        lead = (slice(None),) * ax
        return tuple(x[(*lead, slice(a, b))] for a, b in itertools.pairwise(points))
    return split


@BACKEND.rule("getitem")
def _getitem(info: OpInfo) -> Callable[..., Any]:
    from opgraph.ops.shape import python_key

    key = python_key(info.attrs["index"], array_result=False)
    return lambda x: x[key]


@BACKEND.rule("take")
def _take(info: OpInfo) -> Callable[..., Any]:
    axis = info.attrs["axis"]
    return lambda x, i: jnp.take(x, i, axis=axis, mode="wrap")


@BACKEND.limit("take")
def _take_limit(info: OpInfo) -> str | None:
    shape, axis = info.in_types[0].shape, info.attrs["axis"]  # type: ignore[union-attr]
    if shape == ():
        return "jax takes from arrays of rank >= 1"
    if shape is None or any(d is None for d in shape) or (0 in shape if axis is None else shape[axis] == 0):
        return "jax cannot take from an empty (or unknown-length) axis"
    return None


@BACKEND.rule("slice")
def _slice(info: OpInfo) -> Callable[..., Any]:
    # claimed only with a static result (see _slice_limit): then every sliced axis is empty, and so is x
    return lambda x, *bounds: x


@BACKEND.rule("slice_update")
def _slice_update(info: OpInfo) -> Callable[..., Any]:
    """x with x[slices] = update for bounds traced at run time, as a mask over x's static shape (a step of 0,
    an error in NumPy, cannot raise inside jit: it updates nothing)."""
    axes = info.attrs["axes"]

    def positions(n: int, s: Any, e: Any, st: Any) -> tuple[Any, Any]:
        """Which of an axis's n positions Python's x[s:e:st] keeps, and where each sits in the slice (traced
        bounds: the mask form of slice.indices)."""
        # bounds past either end act like -n-1 or n (this also keeps INT64_MAX + n from wrapping around)
        s, e = (jnp.clip(v.astype(jnp.int64), -n - 1, n) for v in (s, e))
        s, e = (jnp.where(v < 0, v + n, v) for v in (s, e))
        up = st > 0
        s = jnp.where(up, jnp.clip(s, 0, n), jnp.where(s < 0, -1, jnp.minimum(s, n - 1)))
        e = jnp.where(up, jnp.clip(e, 0, n), jnp.where(e < 0, -1, jnp.minimum(e, n - 1)))
        pos = jnp.arange(n)
        off = pos - s
        inside = jnp.where(up, (pos >= s) & (pos < e), (pos <= s) & (pos > e)) & (off % st == 0)
        return inside, jnp.where(inside, off // st, 0)

    def slice_update(x: Any, update: Any, starts: Any, ends: Any, steps: Any = None) -> Any:
        k = starts.shape[0]
        sliced = tuple(range(k)) if axes is None else tuple(a % x.ndim for a in axes)
        steps = jnp.ones(k, jnp.int64) if steps is None else steps.astype(jnp.int64)
        if update.size == 0:  # it broadcasts to the slice, so the slice is empty too
            return x
        u = update.reshape((1,) * (x.ndim - update.ndim) + update.shape)
        mask = jnp.ones(x.shape, bool)
        index = []
        for d, n in enumerate(x.shape):
            if d in sliced:
                j = sliced.index(d)
                inside, at = positions(n, starts[j], ends[j], steps[j])
            else:
                inside, at = jnp.ones(n, bool), jnp.arange(n)
            shape = [-1 if i == d else 1 for i in range(x.ndim)]
            mask = mask & inside.reshape(shape)
            index.append((jnp.zeros_like(at) if u.shape[d] == 1 else jnp.minimum(at, u.shape[d] - 1)).reshape(shape))
        return jnp.where(mask, u[tuple(index)] if x.ndim else u, x)

    return slice_update


@BACKEND.limit("slice", "slice_update")
def _slice_limit(info: OpInfo) -> str | None:
    out = info.out_types[0].shape  # type: ignore[union-attr]
    if info.kind == "slice" and (out is None or None in out):
        return "slice's result size depends on its run-time bounds; jax.jit needs static shapes"
    bounds = info.in_types[2]
    if bounds.shape is None or bounds.shape[0] is None:  # type: ignore[union-attr]
        return "jax needs the number of slice bounds"
    return None


@BACKEND.rule("flip")
def _flip(info: OpInfo) -> Callable[..., Any]:
    axis = axes(info)
    return lambda x: jnp.flip(x, axis)


@BACKEND.rule("roll")
def _roll(info: OpInfo) -> Callable[..., Any]:
    shift, axis = info.attrs["shift"], info.attrs["axis"]
    return lambda x: jnp.roll(x, shift, axis)


@BACKEND.rule("tile")
def _tile(info: OpInfo) -> Callable[..., Any]:
    reps = tuple(info.attrs["reps"])
    return lambda x: jnp.tile(x, reps)


@BACKEND.rule("repeat")
def _repeat(info: OpInfo) -> Callable[..., Any]:
    repeats, axis = info.attrs["repeats"], info.attrs["axis"]
    n = info.out_shape[axis if axis is not None else 0] if info.out_shape is not None else None
    return lambda x: jnp.repeat(x, np.asarray(repeats), axis=axis, total_repeat_length=n)


@BACKEND.rule("moveaxis")
def _moveaxis(info: OpInfo) -> Callable[..., Any]:
    src, dst = info.attrs["source"], info.attrs["destination"]
    return lambda x: jnp.moveaxis(x, src, dst)


@BACKEND.rule("copy")
def _copy(info: OpInfo) -> Callable[..., Any]:
    return lambda x: x


@BACKEND.rule("pad")
def _pad(info: OpInfo) -> Callable[..., Any]:
    pw, mode, cv = info.attrs["pad_width"], info.attrs["mode"], info.attrs["constant_value"]
    if mode == "constant":
        return lambda x: jnp.pad(x, pw, mode="constant", constant_values=jnp.asarray(cv).astype(x.dtype))
    return lambda x: jnp.pad(x, pw, mode=mode)
