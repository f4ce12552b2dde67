"""The jax engine's rules for signal ops (FFTs).

    >>> from opgraph.backends.jax import BACKEND
    >>> BACKEND.supports("rfft")
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from opgraph.backends.base import OpInfo
from opgraph.backends.jax import BACKEND


@BACKEND.rule("fft")
def _fft(info: OpInfo) -> Callable[..., Any]:
    a = info.attrs
    fn = jnp.fft.ifft if a["inverse"] else jnp.fft.fft
    return lambda x: fn(x, n=a["n"], axis=a["axis"], norm=a["norm"])


@BACKEND.rule("rfft", "irfft")
def _rfft(info: OpInfo) -> Callable[..., Any]:
    a = info.attrs
    fn = jnp.fft.rfft if info.kind == "rfft" else jnp.fft.irfft
    # compute in the declared result's precision (float16 and float32 inputs give complex64 as in NumPy)
    wide = info.out_dtype in (np.complex128, np.float64)
    work = (np.complex128 if wide else np.complex64) if info.kind == "irfft" else (np.float64 if wide else np.float32)
    return lambda x: fn(x.astype(work), n=a["n"], axis=a["axis"], norm=a["norm"])
