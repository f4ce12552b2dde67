"""The torch engine's rules for the contractions (:mod:`opgraph.ops.contraction`): integer and bool
products computed in int64 (:func:`int_exact`).
"""

from __future__ import annotations

import numpy as np
import torch

from opgraph.backends.base import OpInfo
from opgraph.backends.torch import BACKEND
from opgraph.backends.torch.dtypes import Fn, calc_dtype, loop_dtypes, td, with_casts


def int_exact(out: np.dtype) -> tuple[torch.dtype, Fn]:
    """Integer and bool products are computed in int64 (exact modulo 2**64, so narrowing wraps as NumPy's
    narrow arithmetic does); bools are then 'any nonzero'. Returns (compute dtype, finish).

    >>> comp, finish = int_exact(np.dtype("int8"))
    >>> comp, finish(torch.tensor([300])).tolist()
    (torch.int64, [44])
    """
    if out.kind == "b":
        return torch.int64, lambda r: r != 0
    if out.kind in "iu":
        t = td(out)
        return torch.int64, lambda r: r.to(t)
    t = td(out)
    return t, lambda r: r


@BACKEND.rule("matmul")
def _matmul_rule(info: OpInfo) -> Fn:
    loop = loop_dtypes(np.matmul, info.in_dtypes)
    comp, finish = int_exact(np.dtype(loop[0]))
    return matmul_fn(comp, finish, False, False)


def matmul_fn(comp: torch.dtype, finish: Fn, ta: bool, tb: bool) -> Fn:
    """``a @ b`` (each transposed first where ``ta``/``tb``) computed in ``comp``, then passed through ``finish``
    (:func:`int_exact`'s pair).

    >>> matmul_fn(torch.float64, lambda r: r, False, True)(torch.ones(2, 3), torch.ones(4, 3)).shape
    torch.Size([2, 4])
    """

    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if ta:
            a = a.transpose(-1, -2)
        if tb:
            b = b.transpose(-1, -2)
        return finish(torch.matmul(a.to(comp), b.to(comp)))

    return matmul


@BACKEND.rule("einsum")
def _einsum_rule(info: OpInfo) -> Fn:
    from opgraph.ops.contraction import einsum_signature

    shapes = [t.shape for t in info.in_types]  # type: ignore[union-attr]
    explicit, _ = einsum_signature(info.attrs["subscripts"], shapes)
    comp, finish = int_exact(info.out_dtype)

    def einsum(*xs: torch.Tensor) -> torch.Tensor:
        return finish(torch.einsum(explicit, *(x.to(comp) for x in xs)))

    return einsum


@BACKEND.rule("tensordot")
def _tensordot_rule(info: OpInfo) -> Fn:
    from opgraph.ops.contraction import tensordot_axes

    axes = info.attrs["axes"]
    comp, finish = int_exact(info.out_dtype)

    def tensordot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ax_a, ax_b = tensordot_axes(axes, a.ndim, b.ndim)
        return finish(torch.tensordot(a.to(comp), b.to(comp), dims=(list(ax_a), list(ax_b))))

    return tensordot


@BACKEND.rule("vecdot")
def _vecdot_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    loop = calc_dtype(loop_dtypes(np.vecdot, info.in_dtypes)[0])
    t = td(loop)
    is_bool = loop.kind == "b"

    def vecdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a = torch.movedim(a.to(t), axis % a.ndim, -1)
        b = torch.movedim(b.to(t), axis % b.ndim, -1)
        if is_bool:
            return torch.any(a & b, -1)
        return torch.sum(torch.conj_physical(a) * b, -1, dtype=t)

    return vecdot


@BACKEND.rule("outer")
def _outer_rule(info: OpInfo) -> Fn:
    loop = tuple(calc_dtype(d) for d in loop_dtypes(np.multiply, info.in_dtypes))
    return with_casts(lambda a, b: torch.outer(a.reshape(-1), b.reshape(-1)), info.in_dtypes, loop)
