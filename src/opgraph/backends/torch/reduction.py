"""The torch engine's rules for the reductions (:mod:`opgraph.ops.reduction`), with NumPy's accumulator
dtypes, complex (lexicographic) max/min/argmax and float16 running totals rounded as NumPy rounds them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from opgraph.backends.base import OpInfo
from opgraph.backends.torch import BACKEND
from opgraph.backends.torch.dtypes import U64, WIDE, Fn, by_keys, calc_dtype, cast_to, dtype_kind, td, work_dtype
from opgraph.core.types import TensorType


def reduced_dims(axis: Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """The dims an ``axis`` attribute names on a tensor of ``ndim`` dims (None: all), negatives counted from the end.

    >>> reduced_dims(None, 2), reduced_dims((-1,), 3)
    ((0, 1), (2,))
    """
    return tuple(range(ndim)) if axis is None else tuple(a % ndim for a in axis)


@BACKEND.rule("sum", "prod", "max", "min", "mean", "any", "all", "logsumexp")
def _reduction_rule(info: OpInfo) -> Fn:
    kind = info.kind
    axis, keep = info.attrs["axis"], info.attrs["keepdims"]
    src, out = np.dtype(info.in_dtypes[0]), info.out_dtype
    if src == U64 and kind in ("max", "min"):
        return by_keys(_reduction_rule, info, True)
    if (src in WIDE or out in WIDE) and kind in ("sum", "prod", "max", "min"):
        # computed in int64: by value (uint16, uint32), or modulo 2**64 for sums and products
        inner = _reduction_rule(OpInfo(kind, info.attrs, (TensorType(np.int64, None),),
                                     (TensorType(calc_dtype(out), None),)))
        return lambda x: inner(x.to(torch.int64))
    to_out = cast_to(out)
    t_out = td(out)
    if axis is not None and len(axis) == 0:  # no axis reduced: NumPy's identity (with the result dtype)
        if kind in ("any", "all"):
            return lambda x: x != 0
        if kind == "logsumexp":
            work = td(work_dtype(out))
            return lambda x: _lse(x.to(work), (), keep).to(t_out)
        if out.kind == "c" and kind in ("prod", "mean"):
            # NumPy multiplies by 1 (prod) or divides by the count 1 (mean): complex infinities become NaN.
            one = torch.ones((), dtype=t_out)
            return (lambda x: x.to(t_out) * one) if kind == "prod" else (lambda x: x.to(t_out) / one)
        return lambda x: x.clone() if x.dtype == t_out else x.to(t_out)
    if kind == "sum":
        work = td(work_dtype(out))
        if src == np.float16:
            return lambda x: torch.sum(x.to(work), reduced_dims(axis, x.ndim), keepdim=keep).to(t_out)
        return lambda x: torch.sum(x, reduced_dims(axis, x.ndim), keepdim=keep, dtype=t_out)
    if kind == "prod":
        def prod(x: torch.Tensor) -> torch.Tensor:
            if axis is None and not keep:
                return torch.prod(x, dtype=t_out)
            for d in sorted(reduced_dims(axis, x.ndim), reverse=True):
                x = torch.prod(x, d, keepdim=keep, dtype=t_out)
            return to_out(x)

        return prod
    if kind in ("max", "min") and src.kind == "c":
        def lex(x: torch.Tensor) -> torch.Tensor:
            dims = reduced_dims(axis, x.ndim)
            flat, idx = _lex_arg(x, dims, kind == "max")
            res = torch.gather(flat, -1, idx.unsqueeze(-1)).squeeze(-1)
            return res.reshape([1 if d in dims else n for d, n in enumerate(x.shape)]) if keep else res

        return lex
    if kind in ("max", "min"):
        fn = torch.amax if kind == "max" else torch.amin
        return lambda x: fn(x, reduced_dims(axis, x.ndim), keepdim=keep) if x.ndim else x.clone()
    if kind == "mean":
        work = td(work_dtype(out))
        return lambda x: torch.mean(x.to(work), reduced_dims(axis, x.ndim), keepdim=keep).to(t_out)
    if kind in ("any", "all"):
        fn = torch.any if kind == "any" else torch.all

        def anyall(x: torch.Tensor) -> torch.Tensor:
            if x.dtype != torch.bool:
                x = x != 0
            return fn(x, reduced_dims(axis, x.ndim), keepdim=keep) if x.ndim else x.clone()

        return anyall
    if kind == "logsumexp":
        work = td(work_dtype(out))
        return lambda x: _lse(x.to(work), reduced_dims(axis, x.ndim), keep).to(t_out)
    raise KeyError(kind)


def _lse(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    """scipy.special.logsumexp: shift by the (finite) maximum real part, over ``dims`` (all when empty)."""
    real = x.real if x.is_complex() else x
    if not dims:  # nothing reduced (torch would read an empty dim tuple as every dim)
        shift = torch.where(torch.isfinite(real), real, torch.zeros_like(real))
        return torch.log(torch.exp(x - shift)) + shift
    if real.numel() == 0:
        shift = torch.zeros_like(torch.sum(real, dims, keepdim=True))
    else:
        shift = torch.amax(real, dims, keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    total = torch.sum(torch.exp(x - shift), dims, keepdim=keep)
    if not keep:
        shift = shift.reshape(total.shape)
    return torch.log(total) + shift


@BACKEND.rule("var", "std")
def _moment_rule(info: OpInfo) -> Fn:
    axis, keep, corr = info.attrs["axis"], info.attrs["keepdims"], float(info.attrs["correction"])
    out = info.out_dtype
    src = np.dtype(info.in_dtypes[0])
    work = td(src if src.kind == "c" else work_dtype(out))  # complex keeps its precision; the result is real
    t_out = td(out)
    sqrt = info.kind == "std"

    def moment(x: torch.Tensor) -> torch.Tensor:
        x = x.to(work)
        dims = reduced_dims(axis, x.ndim)
        n = 1
        for d in dims:
            n *= x.shape[d]
        # NumPy: sum(|x - mean|^2) / (n - ddof), with mean taken over the same axes.
        mean = torch.mean(x, dims, keepdim=True) if dims else x
        dev = x - mean
        sq = (dev.real * dev.real + dev.imag * dev.imag) if dev.is_complex() else dev * dev
        total = torch.sum(sq, dims, keepdim=keep) if dims else sq
        res = total / max(n - corr, 0.0)  # NumPy clamps the divisor at 0 (giving inf or NaN)
        return (torch.sqrt(res) if sqrt else res).to(t_out)

    return moment


def _lex_arg(x: torch.Tensor, dims: tuple[int, ...], largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Complex ``x`` with ``dims`` moved last and flattened, and the index along that last axis of NumPy's
    lexicographic argmax (argmin): the first NaN (in either part), else the first largest (smallest) value."""
    kept = [d for d in range(x.ndim) if d not in dims]
    k = 1
    for d in dims:
        k *= x.shape[d]
    flat = x.permute(*kept, *dims).reshape(*(x.shape[d] for d in kept), k)
    re, im = flat.real, flat.imag
    nan = torch.isnan(re) | torch.isnan(im)
    ext = torch.amax if largest else torch.amin
    far = torch.full_like(re, -float("inf") if largest else float("inf"))
    best_re = ext(torch.where(nan, far, re), -1, keepdim=True)
    cand = (re == best_re) & ~nan
    best_im = ext(torch.where(cand, im, far), -1, keepdim=True)
    first = torch.argmax((cand & (im == best_im)).to(torch.uint8), -1)
    first_nan = torch.argmax(nan.to(torch.uint8), -1)
    return flat, torch.where(nan.any(-1), first_nan, first)


@BACKEND.rule("argmax", "argmin")
def _arg_rule(info: OpInfo) -> Fn:
    axis, keep = info.attrs["axis"], info.attrs["keepdims"]
    fn = torch.argmax if info.kind == "argmax" else torch.argmin
    is_bool = dtype_kind(info.in_dtypes[0]) == "b"
    if np.dtype(info.in_dtypes[0]) == U64:
        return by_keys(_arg_rule, info, False)
    if np.dtype(info.in_dtypes[0]) in WIDE:
        inner = _arg_rule(OpInfo(info.kind, info.attrs, (TensorType(np.int64, None),), info.out_types))
        return lambda x: inner(x.to(torch.int64))
    if dtype_kind(info.in_dtypes[0]) == "c":
        largest = info.kind == "argmax"

        def lex_arg(x: torch.Tensor) -> torch.Tensor:
            if axis is None:
                idx = _lex_arg(x.reshape(-1), (0,), largest)[1]
                return idx.reshape((1,) * x.ndim) if keep else idx
            ax = axis % max(x.ndim, 1)
            idx = _lex_arg(x, (ax,) if x.ndim else (), largest)[1]
            return idx.unsqueeze(ax) if keep and x.ndim else idx

        return lex_arg

    def arg(x: torch.Tensor) -> torch.Tensor:
        if is_bool:
            x = x.to(torch.uint8)
        if axis is None:
            r = fn(x.reshape(-1))
            return r.reshape((1,) * x.ndim) if keep else r
        return fn(x, axis % max(x.ndim, 1), keepdim=keep) if x.ndim else fn(x.reshape(-1)).reshape(())

    return arg


@BACKEND.rule("cumsum", "cumprod")
def _cum_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    t_out = td(calc_dtype(info.out_dtype))
    wide = np.dtype(info.in_dtypes[0]) in WIDE
    fn = torch.cumsum if info.kind == "cumsum" else torch.cumprod
    half = np.dtype(info.in_dtypes[0]) == np.float16

    def cum(x: torch.Tensor) -> torch.Tensor:
        if wide:
            x = x.to(torch.int64)
        if axis is None:
            x, d = x.reshape(-1), 0
        else:
            d = axis % max(x.ndim, 1)
        if half:
            # NumPy rounds the running total to float16 at every step: do the same, one step at a time.
            parts = list(torch.unbind(x, d))
            acc: list[torch.Tensor] = []
            for p in parts:
                acc.append(p if not acc else (acc[-1] + p if info.kind == "cumsum" else acc[-1] * p))
            return torch.stack(acc, d) if acc else x.clone()
        return fn(x, d, dtype=t_out)

    return cum
