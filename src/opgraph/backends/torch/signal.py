"""The torch engine's rules for the FFTs (:mod:`opgraph.ops.signal`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from opgraph.backends.base import OpInfo
from opgraph.backends.torch import BACKEND
from opgraph.backends.torch.dtypes import Fn, td


def _fft_empty(fn: Fn, length: Callable[[int], int], axis: int, out: torch.dtype) -> Fn:
    """``fn``, except for an empty input (which MKL refuses): the transform of zeros (padded to n) is zeros."""

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.numel():
            return fn(x)
        ax = axis % x.ndim
        shape = (*x.shape[:ax], length(x.shape[ax]), *x.shape[ax + 1:])
        return torch.zeros(shape, dtype=out, device=x.device)

    return run


@BACKEND.rule("fft")
def _fft_rule(info: OpInfo) -> Fn:
    axis, n, norm = info.attrs["axis"], info.attrs["n"], info.attrs["norm"]
    fn = torch.fft.ifft if info.attrs.get("inverse") else torch.fft.fft
    return _fft_empty(lambda x: fn(x, n=n, dim=axis, norm=norm), lambda m: m if n is None else n, axis,
                      td(info.out_dtype))


@BACKEND.rule("rfft")
def _rfft_rule(info: OpInfo) -> Fn:
    axis, n, norm = info.attrs["axis"], info.attrs["n"], info.attrs["norm"]
    work = torch.float32 if info.out_dtype == np.complex64 else torch.float64
    return _fft_empty(lambda x: torch.fft.rfft(x.to(work), n=n, dim=axis, norm=norm),
                      lambda m: (m if n is None else n) // 2 + 1, axis, td(info.out_dtype))


@BACKEND.rule("irfft")
def _irfft_rule(info: OpInfo) -> Fn:
    axis, n, norm = info.attrs["axis"], info.attrs["n"], info.attrs["norm"]
    return _fft_empty(lambda x: torch.fft.irfft(x, n=n, dim=axis, norm=norm),
                      lambda m: 2 * (m - 1) if n is None else n, axis, td(info.out_dtype))
