"""The torch engine's rules for the shape ops (:mod:`opgraph.ops.shape`): views where NumPy gives them,
wide unsigned elements moved as their bits.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from opgraph.backends.base import OpInfo
from opgraph.backends.torch import BACKEND
from opgraph.backends.torch.dtypes import Fn, bits, cast_to, td, unbits
from opgraph.backends.torch.reduction import reduced_dims


@BACKEND.rule("reshape")
def _reshape_rule(info: OpInfo) -> Fn:
    shape = tuple(info.attrs["shape"])
    return lambda x: torch.reshape(x, shape)


@BACKEND.rule("permute_dims")
def _permute_rule(info: OpInfo) -> Fn:
    axes = info.attrs["axes"]
    if axes is None:
        return lambda x: x.permute(tuple(range(x.ndim - 1, -1, -1)))
    axes = tuple(axes)
    return lambda x: x.permute(axes)


@BACKEND.rule("broadcast_to")
def _broadcast_to_rule(info: OpInfo) -> Fn:
    shape = tuple(info.attrs["shape"])
    return lambda x: torch.broadcast_to(x, shape)


@BACKEND.rule("expand_dims")
def _expand_dims_rule(info: OpInfo) -> Fn:
    axis = tuple(info.attrs["axis"])

    def expand_dims(x: torch.Tensor) -> torch.Tensor:
        rank = x.ndim + len(axis)
        for a in sorted(a % rank for a in axis):
            x = x.unsqueeze(a)
        return x

    return expand_dims


@BACKEND.rule("squeeze")
def _squeeze_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    if axis is None:
        return lambda x: x.squeeze()
    if not axis:
        return lambda x: x
    return lambda x: x.squeeze(tuple(a % x.ndim for a in axis))


@BACKEND.rule("concat")
def _concat_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    casts = [cast_to(info.out_dtype)] * len(info.in_types)
    if axis is None:
        return lambda *xs: torch.cat([c(x).reshape(-1) for c, x in zip(casts, xs, strict=True)], 0)
    return lambda *xs: torch.cat([c(x) for c, x in zip(casts, xs, strict=True)], axis)


@BACKEND.rule("stack")
def _stack_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    cast = cast_to(info.out_dtype)
    return lambda *xs: torch.stack([cast(x) for x in xs], axis)


@BACKEND.rule("split")
def _split_rule(info: OpInfo) -> Fn:
    sections, axis = info.attrs["sections"], info.attrs["axis"]
    n_out = len(info.out_types)

    def split(x: torch.Tensor) -> Any:
        ax = axis % x.ndim
        if isinstance(sections, int):
            size = x.shape[ax] // sections
            bounds: list[int | None] = [i * size for i in range(sections)] + [None]
        else:
            bounds = [0, *sections, None]
        lead = (slice(None),) * ax
        parts = tuple(x[(*lead, slice(bounds[i], bounds[i + 1]))] for i in range(n_out))
        return parts[0] if n_out == 1 else parts

    return split


@BACKEND.rule("getitem")
def _getitem_rule(info: OpInfo) -> Fn:
    index = tuple(info.attrs["index"])

    def plan(ndim: int) -> tuple[tuple[Any, ...], list[tuple[int, int | None, int | None, int]]]:
        used = sum(1 for e in index if isinstance(e, int) or e[0] == "slice")
        full = ("slice", None, None, None)
        entries = list(index)
        if ("ellipsis",) in entries:
            i = entries.index(("ellipsis",))
            entries[i:i + 1] = [full] * (ndim - used)
        else:
            entries += [full] * (ndim - used)
        key: list[Any] = []
        flips: list[tuple[int, int | None, int | None, int]] = []
        dim = 0
        for e in entries:
            if isinstance(e, int):
                key.append(e)
            elif e[0] == "newaxis":
                key.append(None)
                dim += 1
            else:
                _, start, stop, step = e
                if step is not None and step < 0:  # torch slices forward only: flip afterwards
                    key.append(slice(None))
                    flips.append((dim, start, stop, step))
                else:
                    key.append(slice(start, stop, step))
                dim += 1
        return tuple(key), flips

    plans: dict[int, Any] = {}

    def getitem(x: torch.Tensor) -> torch.Tensor:
        p = plans.get(x.ndim)
        if p is None:
            p = plans[x.ndim] = plan(x.ndim)
        key, flips = p
        y = x[key]
        for d, start, stop, step in flips:
            n = y.shape[d]
            r = range(*slice(start, stop, step).indices(n))
            lead = (slice(None),) * d
            if len(r) == 0:
                y = y[(*lead, slice(0, 0))]
            else:
                first = n - 1 - r.start
                y = unbits(bits(y).flip(d), y.dtype)[(*lead, slice(first, first + (len(r) - 1) * -step + 1, -step))]
        return y

    return getitem


def _slice_ranges(x: torch.Tensor, bounds: Sequence[torch.Tensor | None], axes: Any) -> list[range | None]:
    """The positions each axis of ``x`` keeps under ``slice``'s run-time bounds (None: the whole axis)."""
    from opgraph.ops.shape import slice_key

    starts, ends, steps = (None if b is None else bits(b).tolist() for b in bounds)
    key = slice_key(x.ndim, starts, ends, steps, axes)
    return [None if k == slice(None) else range(*k.indices(n)) for k, n in zip(key, x.shape, strict=True)]


@BACKEND.rule("slice")
def _slice_rule(info: OpInfo) -> Fn:
    axes = info.attrs["axes"]

    def slice_(x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
               steps: torch.Tensor | None = None) -> torch.Tensor:
        y = x
        for d, r in enumerate(_slice_ranges(x, (starts, ends, steps), axes)):
            if r is None:
                continue
            lead = (slice(None),) * d
            if len(r) == 0:
                y = y[(*lead, slice(0, 0))]
            elif r.step > 0:
                y = y[(*lead, slice(r.start, r.stop, r.step))]
            else:  # torch slices forward only: the flipped axis, sliced forward
                first = y.shape[d] - 1 - r.start
                y = unbits(bits(y).flip(d), y.dtype)[(*lead, slice(first, first + (len(r) - 1) * -r.step + 1,
                                                                       -r.step))]
        return y

    return slice_


@BACKEND.rule("slice_update")
def _slice_update_rule(info: OpInfo) -> Fn:
    axes = info.attrs["axes"]

    def slice_update(x: torch.Tensor, update: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                     steps: torch.Tensor | None = None) -> torch.Tensor:
        ranges = _slice_ranges(x, (starts, ends, steps), axes)
        y = bits(x).clone()
        if x.ndim == 0:
            y[...] = bits(update)
            return unbits(y, x.dtype)
        idx = []
        for d, r in enumerate(ranges):  # one index vector per axis, broadcast against each other
            r = range(x.shape[d]) if r is None else r
            pos = torch.arange(len(r), device=x.device) * r.step + r.start
            idx.append(pos.reshape([-1 if i == d else 1 for i in range(x.ndim)]))
        lens = [int(i.numel()) for i in idx]
        y[tuple(idx)] = bits(update).expand(lens)
        return unbits(y, x.dtype)

    return slice_update


@BACKEND.rule("take")
def _take_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]

    def take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        idx = idx.to(torch.int64)
        if axis is None or x.ndim == 0:
            x, ax = x.reshape(-1), 0
        else:
            ax = axis % x.ndim
        n = x.shape[ax]
        shape = (*x.shape[:ax], *idx.shape, *x.shape[ax + 1:])
        if x.numel() == 0:  # an empty result (NumPy checks no index then)
            return x.new_empty(shape)
        idx = torch.where(idx < 0, idx + n, idx)
        return x[(slice(None),) * ax + (idx.reshape(-1),)].reshape(shape)

    return take


def _pad_index(n: int, before: int, after: int, mode: str, device: torch.device) -> torch.Tensor:
    """Source positions of every padded position along one axis (NumPy's pad modes, large pads included)."""
    i = torch.arange(-before, n + after, device=device)
    if mode == "edge":
        return i.clamp(0, n - 1)
    if mode == "wrap":
        return torch.remainder(i, n)
    if mode == "reflect":
        if n == 1:
            return torch.zeros_like(i)
        p = 2 * (n - 1)
        j = torch.remainder(i, p)
        return torch.where(j >= n, p - j, j)
    p = 2 * n  # symmetric
    j = torch.remainder(i, p)
    return torch.where(j >= n, p - 1 - j, j)


@BACKEND.rule("pad")
def _pad_rule(info: OpInfo) -> Fn:
    pw, mode = tuple(info.attrs["pad_width"]), info.attrs["mode"]
    dt = info.out_dtype
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        fill = np.array(info.attrs["constant_value"]).astype(dt).item()

    if not any(b or a for b, a in pw):
        # nothing added (models pad to a multiple that the input already is): the input itself, as reshape's
        # views are (no rule writes into a tensor it is given)
        return lambda x: x

    def pad(x: torch.Tensor) -> torch.Tensor:
        pairs = pw * x.ndim if len(pw) == 1 else pw
        if mode == "constant":
            shape = tuple(d + b + a for d, (b, a) in zip(x.shape, pairs, strict=True))
            out = torch.full(shape, fill, dtype=x.dtype, device=x.device)
            out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, pairs, strict=True))] = x
            return out
        for ax, (b, a) in enumerate(pairs):
            if b or a:
                x = x[(slice(None),) * ax + (_pad_index(x.shape[ax], b, a, mode, x.device),)]
        return x

    return pad


@BACKEND.rule("flip")
def _flip_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    return lambda x: unbits(torch.flip(bits(x), reduced_dims(axis, x.ndim)), x.dtype) if x.ndim else x.clone()


@BACKEND.rule("roll")
def _roll_rule(info: OpInfo) -> Fn:
    shift, axis = tuple(info.attrs["shift"]), info.attrs["axis"]

    def roll(x: torch.Tensor) -> torch.Tensor:
        if x.numel() == 0:
            return x.clone()
        if axis is None:
            return torch.roll(x.reshape(-1), sum(shift)).reshape(x.shape)
        shifts, dims = shift, tuple(axis)
        if len(shifts) == 1:
            shifts = shifts * len(dims)
        if len(dims) == 1:
            dims = dims * len(shifts)
        return torch.roll(x, shifts, dims)

    return roll


@BACKEND.rule("tile")
def _tile_rule(info: OpInfo) -> Fn:
    reps = tuple(info.attrs["reps"])
    return (lambda x: torch.tile(x, reps)) if reps else (lambda x: x.clone())


@BACKEND.rule("repeat")
def _repeat_rule(info: OpInfo) -> Fn:
    repeats, axis = info.attrs["repeats"], info.attrs["axis"]

    def repeat(x: torch.Tensor) -> torch.Tensor:
        if axis is None or x.ndim == 0:
            return torch.repeat_interleave(x.reshape(-1), repeats, 0)
        return torch.repeat_interleave(x, repeats, axis % x.ndim)

    return repeat


@BACKEND.rule("moveaxis")
def _moveaxis_rule(info: OpInfo) -> Fn:
    src, dst = tuple(info.attrs["source"]), tuple(info.attrs["destination"])
    return lambda x: torch.movedim(x, src, dst)


@BACKEND.rule("copy")
def _copy_rule(info: OpInfo) -> Fn:
    return lambda x: x.clone(memory_format=torch.contiguous_format)


@BACKEND.rule("bitcast")
def _bitcast_rule(info: OpInfo) -> Fn:
    t = td(info.out_dtype)
    if info.out_dtype == np.bool_ and np.dtype(info.in_dtypes[0]) != np.bool_:
        return lambda x: x.view(torch.uint8) != 0  # any set bit reads as True, as the NumPy kernel
    return lambda x: x.view(t).clone()
