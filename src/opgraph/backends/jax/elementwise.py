"""The jax engine's rules for elementwise ops.

    >>> from opgraph.backends.jax import BACKEND
    >>> BACKEND.supports("add"), BACKEND.supports("where")
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np

from opgraph.backends.base import OpInfo
from opgraph.backends.jax import BACKEND
from opgraph.backends.jax.dtypes import common_dtype, promoting, real_input

_UNARY = {
    "negative": jnp.negative, "positive": jnp.positive, "abs": jnp.abs, "sign": jnp.sign, "exp": jnp.exp,
    "expm1": jnp.expm1, "log": jnp.log, "log1p": jnp.log1p, "log2": jnp.log2, "log10": jnp.log10,
    "sqrt": jnp.sqrt, "square": jnp.square, "reciprocal": jnp.reciprocal, "sin": jnp.sin, "cos": jnp.cos,
    "tan": jnp.tan, "asin": jnp.arcsin, "acos": jnp.arccos, "atan": jnp.arctan, "sinh": jnp.sinh,
    "cosh": jnp.cosh, "tanh": jnp.tanh, "asinh": jnp.arcsinh, "acosh": jnp.arccosh, "atanh": jnp.arctanh,
    "floor": jnp.floor, "ceil": jnp.ceil, "trunc": jnp.trunc, "round": jnp.round, "sigmoid": jax.nn.sigmoid,
    "erf": jsp.erf, "isnan": jnp.isnan, "isinf": jnp.isinf, "isfinite": jnp.isfinite,
    "logical_not": jnp.logical_not, "bitwise_invert": jnp.invert, "conj": jnp.conj, "signbit": jnp.signbit,
    "exp2": jnp.exp2, "cbrt": jnp.cbrt, "erfc": jsp.erfc, "real": jnp.real, "imag": jnp.imag,
}
_BINARY = {
    "add": jnp.add, "subtract": jnp.subtract, "multiply": jnp.multiply, "divide": jnp.true_divide,
    "floor_divide": jnp.floor_divide, "remainder": jnp.remainder, "power": jnp.power, "maximum": jnp.maximum,
    "minimum": jnp.minimum, "atan2": jnp.arctan2, "hypot": jnp.hypot, "logaddexp": jnp.logaddexp,
    "copysign": jnp.copysign, "nextafter": jnp.nextafter, "equal": jnp.equal, "not_equal": jnp.not_equal,
    "less": jnp.less, "less_equal": jnp.less_equal, "greater": jnp.greater, "greater_equal": jnp.greater_equal,
    "logical_and": jnp.logical_and, "logical_or": jnp.logical_or, "logical_xor": jnp.logical_xor,
    "bitwise_and": jnp.bitwise_and, "bitwise_or": jnp.bitwise_or, "bitwise_xor": jnp.bitwise_xor,
    "bitwise_left_shift": jnp.left_shift, "bitwise_right_shift": jnp.right_shift, "fmax": jnp.fmax,
    "fmin": jnp.fmin, "fmod": jnp.fmod,
}
BACKEND.rules_from(_UNARY, promoting)
BACKEND.rules_from(_BINARY, promoting)


@BACKEND.rule("where")
def _where(info: OpInfo) -> Callable[..., Any]:
    dt = np.result_type(*info.in_dtypes[1:])
    return lambda c, x, y: jnp.where(c.astype(bool), x.astype(dt), y.astype(dt))


@BACKEND.rule("cast")
def _cast(info: OpInfo) -> Callable[..., Any]:
    dt = np.dtype(info.attrs["dtype"])
    return lambda x: x.astype(dt)


@BACKEND.rule("clip")
def _clip(info: OpInfo) -> Callable[..., Any]:
    dt = common_dtype(info)
    return lambda x, lo, hi: jnp.minimum(jnp.maximum(x.astype(dt), lo.astype(dt)), hi.astype(dt))


BACKEND.limit("maximum", "minimum", "fmax", "fmin", "clip", "sign")(real_input)


@BACKEND.limit("reciprocal")
def _reciprocal_limit(info: OpInfo) -> str | None:
    if info.in_dtypes[0].kind in "biu":
        return "NumPy's integer reciprocal (1 // x, platform-defined at 0) is not JAX's"
    return None
