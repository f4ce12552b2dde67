"""Helpers the jax engine's family modules share: NumPy's promotion (where JAX's differs, rules compute in
NumPy's dtype), the limit of ops that order values, an op's axes.

    >>> import numpy as np
    >>> from opgraph.core.types import TensorType as T
    >>> work_dtype(OpInfo("exp", {}, (T("int32", (2,)),), (T("float64", (2,)),)))
    dtype('float64')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opgraph.backends.base import OpInfo

Rule = Callable[[OpInfo], Callable[..., Any]]


def common_dtype(info: OpInfo) -> np.dtype:
    """The inputs' common dtype by NumPy's promotion (the result's for an op without inputs).

    >>> from opgraph.core.types import TensorType as T
    >>> common_dtype(OpInfo("add", {}, (T("int8", ()), T("float32", ())), (T("float32", ()),)))
    dtype('float32')
    """
    return np.result_type(*info.in_dtypes) if info.in_dtypes else info.out_dtype


def work_dtype(info: OpInfo) -> np.dtype:
    """The dtype NumPy computes an op in: the inputs' common dtype, or the float result's for integer inputs
    (NumPy's exp of int32 is float64; JAX's would be float32).

    >>> from opgraph.core.types import TensorType as T
    >>> work_dtype(OpInfo("add", {}, (T("int8", ()), T("int16", ())), (T("int16", ()),)))
    dtype('int16')
    """
    common = common_dtype(info)
    out = info.out_dtype
    return out if out.kind in "fc" and common.kind in "biu" else common


def promoting(fn: Callable[..., Any]) -> Rule:
    """A rule calling ``fn`` with every input cast to the dtype NumPy computes in first (JAX's promotion differs).

    >>> import jax.numpy as jnp
    >>> from opgraph.core.types import TensorType as T
    >>> f = promoting(jnp.exp)(OpInfo("exp", {}, (T("int32", (1,)),), (T("float64", (1,)),)))
    >>> f(jnp.zeros(1, "int32")).dtype
    dtype('float64')
    """
    def factory(info: OpInfo) -> Callable[..., Any]:
        dt = work_dtype(info)
        if all(d == dt for d in info.in_dtypes):
            return fn
        return lambda *xs: fn(*(x.astype(dt) for x in xs))
    return factory


def real_input(info: OpInfo) -> str | None:
    """The limit of an op that orders its input's values: JAX orders complex numbers differently from NumPy.

    >>> from opgraph.core.types import TensorType as T
    >>> real_input(OpInfo("max", {}, (T("complex64", (2,)),), (T("complex64", ()),)))
    'jax orders complex numbers differently from NumPy'
    """
    return "jax orders complex numbers differently from NumPy" if info.in_dtypes[0].kind == "c" else None


def axes(info: OpInfo) -> Any:
    """The op's ``axis`` attribute as a tuple of axes (None: all of them).

    >>> axes(OpInfo("sum", {"axis": 1}, (), ())), axes(OpInfo("sum", {}, (), ()))
    ((1,), None)
    """
    ax = info.attrs.get("axis")
    return None if ax is None else (ax,) if isinstance(ax, int) else tuple(ax)
