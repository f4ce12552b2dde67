"""The torch engine's rules and limits for the linear-algebra ops (:mod:`opgraph.ops.linalg`)."""

from __future__ import annotations

import torch

from opgraph.backends.base import OpInfo
from opgraph.backends.torch import BACKEND
from opgraph.backends.torch.dtypes import Fn, td


def _linalg_work(info: OpInfo) -> torch.dtype:
    from opgraph.ops.linalg import linalg_dtypes

    return td(linalg_dtypes(*info.in_dtypes)[0])


@BACKEND.rule("eigh", "eigvalsh", "qr", "svd", "svdvals", "cholesky", "inv", "det", "slogdet", "pinv")
def _linalg_rule(info: OpInfo) -> Fn:
    kind = info.kind
    work = _linalg_work(info)
    a = info.attrs
    fns: dict[str, Fn] = {
        "eigh": lambda x: tuple(torch.linalg.eigh(x, UPLO=a.get("UPLO", "L"))),
        "eigvalsh": lambda x: torch.linalg.eigvalsh(x, UPLO=a.get("UPLO", "L")),
        "qr": lambda x: tuple(torch.linalg.qr(x, mode=a.get("mode", "reduced"))),
        "svd": lambda x: tuple(torch.linalg.svd(x, full_matrices=bool(a.get("full_matrices", False)))),
        "svdvals": torch.linalg.svdvals,
        "cholesky": lambda x: torch.linalg.cholesky(x, upper=bool(a.get("upper", False))),
        "inv": torch.linalg.inv,
        "det": torch.linalg.det,
        "slogdet": lambda x: tuple(torch.linalg.slogdet(x)),
        "pinv": lambda x: torch.linalg.pinv(x, rtol=a.get("rtol"), hermitian=bool(a.get("hermitian", False))),
    }
    fn = fns[kind]
    return lambda x: fn(x.to(work))


@BACKEND.rule("solve")
def _solve_rule(info: OpInfo) -> Fn:
    work = _linalg_work(info)

    def solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.to(work), b.to(work)
        if b.ndim == 1:
            return torch.linalg.solve(a, b)
        # NumPy 2: a b of rank >= 2 is a stack of matrices; broadcast the batch dims so torch cannot read it
        # as a batch of vectors.
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        return torch.linalg.solve(a.expand(*batch, *a.shape[-2:]), b.expand(*batch, *b.shape[-2:]))

    return solve


@BACKEND.limit("eigh", "svd")
def _lapack_vectors(info: OpInfo) -> str | None:
    return ("eigenvector and singular-vector signs (phases) depend on the LAPACK build: torch's differ from "
            "NumPy's")
