"""The jax engine's rules for linear algebra.

    >>> from opgraph.backends.jax import BACKEND
    >>> BACKEND.supports("solve"), BACKEND.supports("qr")
    (True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from opgraph.backends.base import OpInfo
from opgraph.backends.jax import BACKEND


@BACKEND.rule("inv")
def _inv(info: OpInfo) -> Callable[..., Any]:
    return jnp.linalg.inv


@BACKEND.rule("det")
def _det(info: OpInfo) -> Callable[..., Any]:
    return jnp.linalg.det


@BACKEND.rule("solve")
def _solve(info: OpInfo) -> Callable[..., Any]:
    vector = len(info.in_types[1].shape) == 1  # type: ignore[union-attr,arg-type]
    dt = info.out_dtype
    if vector:
        return lambda a, b: jnp.linalg.solve(a.astype(dt), b.astype(dt)[..., None])[..., 0]
    return lambda a, b: jnp.linalg.solve(a.astype(dt), b.astype(dt))


@BACKEND.rule("cholesky")
def _cholesky(info: OpInfo) -> Callable[..., Any]:
    upper = info.attrs["upper"]
    return lambda a: jnp.linalg.cholesky(a, upper=upper)


@BACKEND.rule("eigvalsh")
def _eigvalsh(info: OpInfo) -> Callable[..., Any]:
    uplo, dt = info.attrs["UPLO"], info.out_dtype
    real = np.result_type(dt, np.float32)
    work = np.promote_types(info.in_dtypes[0], real) if info.in_dtypes[0].kind in "fc" else real
    # only the UPLO triangle is read, as NumPy does (JAX symmetrises by default)
    return lambda a: jnp.linalg.eigh(a.astype(work), UPLO=uplo, symmetrize_input=False).eigenvalues


@BACKEND.rule("pinv")
def _pinv(info: OpInfo) -> Callable[..., Any]:
    rtol, herm = info.attrs["rtol"], info.attrs["hermitian"]
    return lambda a: jnp.linalg.pinv(a, rtol=rtol, hermitian=herm)


@BACKEND.rule("svdvals")
def _svdvals(info: OpInfo) -> Callable[..., Any]:
    return lambda a: jnp.linalg.svd(a, compute_uv=False)


@BACKEND.rule("slogdet")
def _slogdet(info: OpInfo) -> Callable[..., Any]:
    return lambda a: tuple(jnp.linalg.slogdet(a))
