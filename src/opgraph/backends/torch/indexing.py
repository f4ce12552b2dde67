"""The torch engine's rules and limits for the indexing ops (:mod:`opgraph.ops.indexing`): gathers and
scatters with NumPy's index checks, stable sorts.
"""

from __future__ import annotations

import numpy as np
import torch

from opgraph.backends.base import OpInfo
from opgraph.backends.torch import BACKEND
from opgraph.backends.torch.dtypes import SIGNED_BITS, Fn, bits, dtype_kind, key, unbits, unkey


def _wrap(idx: torch.Tensor, n: int) -> torch.Tensor:
    """Indices into an axis of size ``n`` as int64, negatives counted from the end; out of range raises."""
    idx = idx.to(torch.int64)
    if idx.numel() and bool(((idx < -n) | (idx >= n)).any()):
        bad = idx[(idx < -n) | (idx >= n)][0].item()
        raise IndexError(f"index {bad} is out of bounds for an axis of size {n}")
    return torch.where(idx < 0, idx + n, idx)


@BACKEND.rule("gather_elements")
def _gather_elements_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]

    def gather_elements(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        ax = axis % x.ndim
        return unbits(torch.gather(bits(x), ax, _wrap(idx, x.shape[ax])), x.dtype)

    return gather_elements


_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _last_wins(n: int, lin: torch.Tensor) -> torch.Tensor:
    """For each of ``n`` targets, the position in ``lin`` (target per update) of its last update, or -1."""
    owner = torch.full((n,), -1, dtype=torch.int64, device=lin.device)
    ids = torch.arange(lin.numel(), device=lin.device)
    return owner.scatter_reduce(0, lin, ids, "amax", include_self=True)


def _scatter_rows(xf: torch.Tensor, lin: torch.Tensor, upd: torch.Tensor, reduction: str) -> torch.Tensor:
    """A copy of ``xf`` (P, *rest) with rows ``lin`` (L,) combined with ``upd`` (L, *rest)."""
    if lin.numel() == 0:
        return xf.clone()
    if xf.dtype == torch.uint64 and reduction in ("max", "min"):  # ordered on int64 keys
        return unkey(_scatter_rows(key(xf), lin, key(upd), reduction))
    if xf.dtype in SIGNED_BITS:  # in int64: by value (uint16, uint32) or modulo 2**64 (uint64)
        return _scatter_rows(xf.to(torch.int64), lin, upd.to(torch.int64), reduction).to(xf.dtype)
    if reduction == "none":
        owner = _last_wins(xf.shape[0], lin)
        hit = owner >= 0
        res = xf.clone()
        res[hit] = upd[owner[hit]]
        return res
    is_bool = xf.dtype == torch.bool
    work = xf.to(torch.int64) if is_bool else xf
    u = upd.to(torch.int64) if is_bool else upd
    index = lin.reshape(-1, *(1,) * (u.ndim - 1)).expand(u.shape)
    res = work.scatter_reduce(0, index, u, _SCATTER_REDUCE[reduction], include_self=True)
    return res != 0 if is_bool else res


@BACKEND.rule("scatter_elements")
def _scatter_elements_rule(info: OpInfo) -> Fn:
    axis, reduction = info.attrs["axis"], info.attrs["reduction"]

    def scatter_elements(x: torch.Tensor, idx: torch.Tensor, upd: torch.Tensor) -> torch.Tensor:
        ax = axis % x.ndim
        i = _wrap(idx, x.shape[ax])
        # Every update's flat target position in x: its own coordinates with the axis one replaced.
        grids = torch.meshgrid(*(torch.arange(s, device=x.device) for s in i.shape), indexing="ij")
        coords = [i if d == ax else g for d, g in enumerate(grids)]
        lin = torch.zeros_like(i)
        for d, c in enumerate(coords):
            lin = lin * x.shape[d] + c
        res = _scatter_rows(x.reshape(-1), lin.reshape(-1), upd.reshape(-1), reduction)
        return res.reshape(x.shape)

    return scatter_elements


@BACKEND.rule("gather_nd")
def _gather_nd_rule(info: OpInfo) -> Fn:
    bd = info.attrs["batch_dims"]

    def gather_nd(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        m = idx.shape[-1]
        nb = 1
        for s in x.shape[:bd]:
            nb *= s
        n = 1
        for s in idx.shape[bd:-1]:
            n *= s
        xr = x.reshape(nb, *x.shape[bd:])
        ir = idx.reshape(nb, n, m)
        cols = [_wrap(ir[..., j], x.shape[bd + j]) for j in range(m)]
        rows = torch.arange(nb, device=x.device)[:, None].expand(nb, n)
        res = xr[(rows, *cols)]
        return res.reshape(*idx.shape[:-1], *x.shape[bd + m:])

    return gather_nd


@BACKEND.rule("scatter_nd")
def _scatter_nd_rule(info: OpInfo) -> Fn:
    reduction = info.attrs["reduction"]

    def scatter_nd(x: torch.Tensor, idx: torch.Tensor, upd: torch.Tensor) -> torch.Tensor:
        k = idx.shape[-1]
        lead = idx.shape[:-1]
        n_rows = 1
        for s in x.shape[:k]:
            n_rows *= s
        lin = torch.zeros(lead, dtype=torch.int64, device=x.device)
        for j in range(k):
            lin = lin * x.shape[j] + _wrap(idx[..., j], x.shape[j])
        rest = x.shape[k:]
        res = _scatter_rows(x.reshape(n_rows, *rest), lin.reshape(-1), upd.reshape(-1, *rest), reduction)
        return res.reshape(x.shape)

    return scatter_nd


@BACKEND.rule("topk")
def _topk_rule(info: OpInfo) -> Fn:
    k, axis, largest = info.attrs["k"], info.attrs["axis"], bool(info.attrs["largest"])

    def topk(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ax = axis % x.ndim
        # A stable sort keeps ties in index order; torch sorts NaN as the largest, as the NumPy kernel does.
        vals, idx = torch.sort(x, dim=ax, descending=largest, stable=True)
        return vals.narrow(ax, 0, k), idx.narrow(ax, 0, k)

    return topk


@BACKEND.rule("sort")
def _sort_rule(info: OpInfo) -> Fn:
    axis, descending = info.attrs["axis"], bool(info.attrs["descending"])

    def sort(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # stable in both directions, NaN largest: the NumPy kernel's order
        return torch.sort(x, dim=axis % x.ndim, descending=descending, stable=True)

    return sort


@BACKEND.rule("searchsorted")
def _searchsorted_rule(info: OpInfo) -> Fn:
    right = info.attrs["side"] == "right"

    def searchsorted(table: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(table, values.contiguous(), right=right)

    return searchsorted


@BACKEND.rule("one_hot")
def _one_hot_rule(info: OpInfo) -> Fn:
    depth, axis = info.attrs["depth"], info.attrs["axis"]
    signed = dtype_kind(info.in_dtypes[0]) == "i"

    def one_hot(idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        ax = axis % (idx.ndim + 1)
        i = idx.to(torch.int64)
        if signed:
            i = torch.where(i < 0, i + depth, i)
        pos = torch.arange(depth, device=idx.device).reshape(depth, *(1,) * (idx.ndim - ax))
        hot = i.unsqueeze(ax) == pos
        return torch.where(hot, values[1], values[0])

    return one_hot


@BACKEND.rule("trilu")
def _trilu_rule(info: OpInfo) -> Fn:
    k, upper = info.attrs["k"], bool(info.attrs["upper"])
    fn = torch.triu if upper else torch.tril
    return lambda x: unbits(fn(bits(x), k), x.dtype)


@BACKEND.rule("reverse_sequence")
def _reverse_sequence_rule(info: OpInfo) -> Fn:
    batch_axis, time_axis = info.attrs["batch_axis"], info.attrs["time_axis"]

    def reverse_sequence(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        ba, ta = batch_axis % x.ndim, time_axis % x.ndim
        nt = x.shape[ta]
        lens = lengths.to(torch.int64)
        if lens.numel() and bool(((lens < 0) | (lens > nt)).any()):
            raise ValueError(f"lengths must be in [0, {nt}] (the time axis' size), got {lens.tolist()}")
        t = torch.arange(nt, device=x.device)
        src = torch.where(t < lens[:, None], lens[:, None] - 1 - t, t)  # (batch, time)
        xm = torch.movedim(x, (ba, ta), (0, 1))
        index = src.reshape(*src.shape, *(1,) * (xm.ndim - 2)).expand(xm.shape)
        return unbits(torch.movedim(torch.gather(bits(xm), 1, index), (0, 1), (ba, ta)), x.dtype)

    return reverse_sequence


@BACKEND.limit("searchsorted")
def _searchsorted_limit(info: OpInfo) -> str | None:
    return ("torch's searchsorted has no unsigned kernels (uint16/32/64)"
            if any(np.dtype(d).kind == "u" and np.dtype(d).itemsize > 1 for d in info.in_dtypes) else None)
