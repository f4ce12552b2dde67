"""The torch engine's rules and limits for the fused ops (:mod:`opgraph.ops.fused`): a fused elementwise
program runs step by step on the elementwise rules; optimiser updates round their scalars as NumPy's.
"""

from __future__ import annotations

import numpy as np
import torch

from opgraph.backends.base import OpInfo
from opgraph.backends.torch import BACKEND
from opgraph.backends.torch.contraction import int_exact, matmul_fn
from opgraph.backends.torch.dtypes import Fn, calc_dtype, cast_to, loop_dtypes, td, with_casts
from opgraph.backends.torch.elementwise import c_add


@BACKEND.rule("fma")
def _fma_rule(info: OpInfo) -> Fn:
    a, b, c = info.in_dtypes
    mloop = loop_dtypes(np.multiply, (a, b))
    (m,) = np.multiply.resolve_dtypes((*mloop, None))[2:]
    aloop = tuple(calc_dtype(d) for d in loop_dtypes(np.add, (m, c)))
    mloop = tuple(calc_dtype(d) for d in mloop)
    mul = with_casts(torch.mul, (a, b), mloop)
    add = with_casts(c_add if aloop[0].kind == "c" else torch.add, (m, c), aloop)
    return lambda x, y, z: add(mul(x, y), z)


@BACKEND.rule("matmul_t")
def _matmul_t_rule(info: OpInfo) -> Fn:
    loop = loop_dtypes(np.matmul, info.in_dtypes)
    comp, finish = int_exact(np.dtype(loop[0]))
    return matmul_fn(comp, finish, bool(info.attrs["transpose_a"]), bool(info.attrs["transpose_b"]))


@BACKEND.rule("fused_elementwise")
def _fused_rule(info: OpInfo) -> Fn:
    from opgraph.ops.fused import step_types

    program = info.attrs["program"]
    types = step_types(program, tuple(info.in_types))
    steps: list[tuple[Fn, tuple[int, ...]]] = []
    for i, (kind, *refs) in enumerate(program):
        args = tuple(info.in_types[-r - 1] if r < 0 else types[r] for r in refs)
        fn = BACKEND.rules[kind](OpInfo(kind, {}, args, (types[i],)))
        cast = cast_to(types[i].dtype)
        steps.append((lambda *xs, _f=fn, _c=cast: _c(_f(*xs)), tuple(refs)))

    def fused(*xs: torch.Tensor) -> torch.Tensor:
        vals: list[torch.Tensor] = []
        for fn, refs in steps:
            vals.append(fn(*(xs[-r - 1] if r < 0 else vals[r] for r in refs)))
        return vals[-1]

    return fused


def _scalar(v: float, dt: np.dtype) -> torch.Tensor:
    """A 0-d CPU tensor of ``v`` in ``dt`` (NumPy's kernels round their scalar attributes to the dtype first);
    CPU scalars combine with tensors on any device."""
    return torch.tensor(np.asarray(v, dtype=dt).item(), dtype=td(dt))


@BACKEND.rule("sgd_momentum_update")
def _momentum_rule(info: OpInfo) -> Fn:
    dt = np.dtype(info.in_dtypes[0])
    lr, mu = _scalar(info.attrs["lr"], dt), _scalar(info.attrs["mu"], dt)

    def momentum(p: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v2 = mu * v + g
        return p - lr * v2, v2

    return momentum


@BACKEND.rule("adagrad_update")
def _adagrad_rule(info: OpInfo) -> Fn:
    dt = np.dtype(info.in_dtypes[0])
    lr, eps = _scalar(info.attrs["lr"], dt), _scalar(info.attrs["eps"], dt)

    def adagrad(p: torch.Tensor, acc: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        acc2 = acc + g * g
        return p - (lr * g) / (torch.sqrt(acc2) + eps), acc2

    return adagrad


@BACKEND.rule("adam_update", "adam_update_t")
def _adam_rule(info: OpInfo) -> Fn:
    dt = np.dtype(info.in_dtypes[0])
    s = {k: _scalar(info.attrs[k], dt) for k in ("lr", "b1", "c1", "b2", "c2", "eps")}
    square_first = bool(info.attrs["square_first"])
    fixed = info.kind == "adam_update"
    bcs = (_scalar(info.attrs["bc1"], dt), _scalar(info.attrs["bc2"], dt)) if fixed else None

    def core(p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, g: torch.Tensor, bc1: torch.Tensor,
             bc2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m2 = s["b1"] * m + s["c1"] * g
        tmp = (g * g) * s["c2"] if square_first else (s["c2"] * g) * g
        v2 = s["b2"] * v + tmp
        den = torch.sqrt(v2 / bc2) + s["eps"]
        return p - (s["lr"] * (m2 / bc1)) / den, m2, v2

    if bcs is not None:
        return lambda p, m, v, g: core(p, m, v, g, *bcs)
    return core


@BACKEND.limit("fused_elementwise")
def _fused_limit(info: OpInfo) -> str | None:
    from opgraph.ops.fused import step_types

    program = info.attrs["program"]
    types = step_types(program, tuple(info.in_types))
    for i, (kind, *refs) in enumerate(program):
        args = tuple(info.in_types[-r - 1] if r < 0 else types[r] for r in refs)
        why = BACKEND.why_not(OpInfo(kind, {}, args, (types[i],)))
        if why is not None:
            return f"step {i}: {why}"
    return None
