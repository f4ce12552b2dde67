"""The NumPy engine's neural-network kernels: convolution (``conv2d``, ``conv``) by im2col and one matmul, and
``layer_norm`` as one compiled loop per row.

The ops' reference kernel (:func:`opgraph.ops.nn.conv_nd`) sums over sliding
windows; the engine's :func:`conv_nd` copies each tap's strided window into
im2col columns in the layout the matrix product wants, a chunk at a time (no
transpose-copy), and runs depthwise convolutions as one compiled loop when
numba is loaded.

    >>> x = np.arange(8.0).reshape(1, 2, 4)
    >>> BACKEND.kernel_for("conv", 1)(x, np.ones((1, 2, 2)), stride=(1,), padding=((1, 0),), dilation=(1,),
    ...                               groups=1)
    array([[[ 4., 10., 14., 18.]]])
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import Any

import numpy as np

from opgraph.backends.numpy import BACKEND
from opgraph.backends.numpy.jit import NUMBA_MIN, numba_for, prepare_loops
from opgraph.backends.numpy.reduction import sum_rows
from opgraph.core.types import TensorType
from opgraph.ops.nn import Padding, PadPairs, Pair, conv_output_size, normalize_axis, pad4, shifted_by_max


def _work_dtype(dt: np.dtype) -> np.dtype:
    # float16 is computed in float32 (as PyTorch does on CPU, and the op's reference kernel) and rounded once.
    return np.dtype(np.float32) if dt == np.float16 else dt


# ---------------------------------------------------------------- the convolution kernel (conv2d and conv)
# One N-d kernel serves conv2d and conv (and so ONNX Conv). Nothing is transposed: each kernel tap's
# strided input window is copied straight into im2col columns laid out as the matrix product wants them,
# (samples, G, Cg * taps, P), a chunk of about a MiB at a time (a few samples, a block of groups of one
# sample, or a band of output rows), and one stacked matmul writes (samples, G, M/G, P) into the output.
# A depthwise convolution (Cg == 1) is thus, per channel, a (1, taps) x (taps, P) product: measured
# faster than kh*kw multiply-adds of shifted views. A 1x1 stride-1 convolution is the matmul on the
# input itself. With a threaded BLAS, groups == 1 takes several samples per product (fewer threaded
# calls). Padding is never materialised: a tap copies the part of its window inside the input, and its
# other columns stay zero; except for grouped stride-1 convolutions (depthwise ones above all), where a
# block of channels is padded into flat rows so every tap's columns are one long contiguous copy
# (short image rows made the per-row copies the cost: 1.2-1.6x faster measured).
_COLS_BYTES = 1 << 20
"""im2col columns per chunk: samples are grouped until their columns reach this many bytes."""
_WIDE_COLS_BYTES = 1 << 22
"""im2col columns per chunk with a threaded BLAS (groups == 1): one product for several samples, so
a convolution makes a few threaded BLAS calls (each a rendezvous of the BLAS threads, slow on a busy
machine) rather than one per sample."""
_MIN_GEMM_COLUMNS = 384
"""A band of output rows has at least this many positions (narrower GEMMs run well below peak)."""

_AxisTap = tuple[int, int, slice]  # (first output index, end output index, input slice) of one tap on one axis


def _axis_taps(size: int, out: int, kernel: int, stride: int, pad_lo: int, dilation: int) -> list[_AxisTap]:
    """Per kernel offset along one axis: the output range whose inputs lie inside the unpadded input."""
    taps = []
    for t in range(kernel):
        shift = t * dilation - pad_lo  # output o reads input o * stride + shift
        lo = min(out, max(0, -(shift // stride)))
        hi = max(lo, min(out, -(-(size - shift) // stride)))
        start = lo * stride + shift
        taps.append((lo, hi, slice(start, start + (hi - lo - 1) * stride + 1 if hi > lo else start, stride)))
    return taps


def conv_nd(x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None, *, stride: tuple[int, ...],
            padding: PadPairs, dilation: tuple[int, ...], groups: int = 1) -> np.ndarray:
    """N-d cross-correlation of ``x`` (N, C, *spatial) with ``w`` (M, C // groups, *kernel), as in PyTorch.

    ``padding`` is one ``(begin, end)`` pair of zeros per spatial axis. The
    result has dtype ``np.result_type(x, w)`` (float16 is computed in
    float32); it is written into ``out`` when given.

    >>> x = np.arange(8.0).reshape(1, 2, 4)
    >>> conv_nd(x, np.ones((1, 2, 2)), stride=(1,), padding=((1, 0),), dilation=(1,))
    array([[[ 4., 10., 14., 18.]]])
    """
    dtype = np.result_type(x.dtype, w.dtype)
    work = _work_dtype(dtype)
    x, w = x.astype(work, copy=False), w.astype(work, copy=False)
    n, c, *sizes = x.shape
    m, cg, *kernel = w.shape
    outs = tuple(conv_output_size(s, k, st, pb, pe, d)
                 for s, k, st, (pb, pe), d in zip(sizes, kernel, stride, padding, dilation, strict=True))
    direct = (out is not None and out.dtype == work and out.shape == (n, m, *outs)
              and out.flags.c_contiguous)
    res = out if direct else np.empty((n, m, *outs), work)
    axes = [_axis_taps(s, o, k, st, pb, d)
            for s, o, k, st, (pb, _pe), d in zip(sizes, outs, kernel, stride, padding, dilation, strict=True)]
    taps = list(itertools.product(*axes))
    per_sample = max(1, c * len(taps) * int(np.prod(outs)) * x.itemsize)  # one sample's im2col columns
    if n == 0 or 0 in outs:
        pass
    elif all(k == 1 for k in kernel) and not any(p for pair in padding for p in pair) and all(s == 1 for s in stride):
        # 1x1: the input already is the column matrix.
        np.matmul(w.reshape(groups, m // groups, cg), x.reshape(n, groups, cg, -1),
                  out=res.reshape(n, groups, m // groups, -1))
    elif groups == 1 and n > 1 and _blas_threads() > 1 and 2 * per_sample <= _WIDE_COLS_BYTES:
        _conv_im2col_wide(x, w, res, taps, min(n, _WIDE_COLS_BYTES // per_sample))
    elif (len(kernel) == 2 and groups == c == m and work.kind == "f" and work.itemsize >= 4
          and (loop := _depthwise_compiled(x.size)) is not None):
        _conv_depthwise_compiled(loop, x, w, res, stride, padding, dilation)
    elif len(kernel) == 2 and groups == c == m and kernel[1] >= _BANDED_MIN_WIDTH:
        _conv_depthwise_banded(x, w, res, stride, padding, dilation)
    elif groups > 1 and all(st == 1 for st in stride):
        _conv_flat_shift(x, w, res, padding, dilation, groups)
    else:
        _conv_im2col(x, w, res, taps, groups)
    if direct:
        return res
    if out is not None:
        np.copyto(out, res, casting="unsafe")
        return out
    return res.astype(dtype, copy=False)


_BANDED_MIN_WIDTH = 5
"""Depthwise 2-d kernels at least this wide take the banded-matrix path (3 wide: the flat-shift im2col
stays faster, measured)."""


def _conv_depthwise_banded(x: np.ndarray, w: np.ndarray, res: np.ndarray, stride: tuple[int, ...],
                           padding: PadPairs, dilation: tuple[int, ...]) -> None:
    """Depthwise 2-d convolutions with wide kernels (ConvNeXt's and EfficientNet's 7x7 and 5x5): per channel,
    the output rows cut into tiles of ``bw`` columns, each tile one row of a product (rows, kh * L) x
    (kh * L, bw), where the left rows are the tile's L = sw * (bw - 1) + dw * (kw - 1) + 1 input columns of
    its kh input rows (one strided copy of the padded input) and the right matrix holds the kernel on
    shifted diagonals (the same for every tile). The product does L / kw times the useful multiply-adds
    but runs in BLAS, and the copy is kh, not kh * kw, times the input: 1.6-2.4x faster than the tap-by-tap
    im2col for ConvNeXt's 7x7 and 1.05-1.4x for EfficientNet's 5x5 (float32, one thread, measured)."""
    n, c, height, width = x.shape
    kh, kw = w.shape[2:]
    ho, wo = res.shape[2:]
    (sh, sw), (dh, dw) = stride, dilation
    (pt, _pb), (pl, pr) = padding
    # Tiles of 10-16 columns ran fastest (narrower ones waste more of the product on the kernel's margins);
    # a width dividing the output's leaves no ragged last tile.
    bw = wo if wo <= 16 else next((b for b in range(16, 9, -1) if wo % b == 0), 16)
    nt = -(-wo // bw)
    span = sw * (bw - 1) + dw * (kw - 1) + 1  # L: input columns one tile reads
    hp = max(height + pt + padding[0][1], (ho - 1) * sh + dh * (kh - 1) + 1)
    wp = max(width + pl + pr, sw * (nt * bw - 1) + dw * (kw - 1) + 1)
    per_channel = ho * nt * kh * span * x.itemsize
    cb = max(1, min(c, _COLS_BYTES // max(per_channel, 1)))
    padded = np.zeros((cb, hp, wp), x.dtype)  # borders stay zero: only the inside is ever written
    inside = padded[:, pt:pt + height, pl:pl + width]
    cols = np.empty((cb, ho, nt, kh, span), x.dtype)
    band = np.zeros((cb, kh, span, bw), x.dtype)
    tmp = None if nt * bw == wo else np.empty((cb, ho, nt * bw), x.dtype)
    s0, s1, s2 = padded.strides
    windows = np.lib.stride_tricks.as_strided(padded, (cb, ho, nt, kh, span), (s0, s1 * sh, s2 * sw * bw, s1 * dh, s2),
                                              writeable=False)
    taps = w.reshape(c, kh, kw)
    for c0 in range(0, c, cb):
        c1 = min(c, c0 + cb)
        k = c1 - c0
        for o in range(bw):  # the kernel row i on the diagonal of band[:, i]: band[., i, sw*o + dw*j, o] = w[., i, j]
            band[:k, :, sw * o:sw * o + dw * (kw - 1) + 1:dw, o] = taps[c0:c1]
        for s in range(n):
            inside[:k] = x[s, c0:c1]
            cols[:k] = windows[:k]
            target = res[s, c0:c1].reshape(k, ho * nt, bw) if tmp is None else tmp[:k].reshape(k, ho * nt, bw)
            np.matmul(cols[:k].reshape(k, ho * nt, kh * span), band[:k].reshape(k, kh * span, bw), out=target)
            if tmp is not None:
                res[s, c0:c1] = tmp[:k, :, :wo]


# With numba loaded (the ``fast`` extra; see opgraph.backends.numpy.jit), a depthwise 2-d
# convolution (groups == C == M) is one compiled loop: per channel, per kernel row, the kw taps summed over a
# flat run of output positions. No im2col columns and no product: 1.4-2.0x faster than the NumPy paths for
# MobileNetV3's and EfficientNet's 3x3 and 5x5 (float32, one thread, measured; those models 1.2x faster).
# Summation order: per output, the kernel rows in turn, each row's taps summed left to right first (not
# BLAS's order): in float64, within 3.2e-16 of torch relative to the largest output. fastmath stays off.
_depthwise_jit: Any = None  # None: not tried; False: unavailable; else the compiled loop


def _depthwise_loop(x: Any, w: Any, out: Any, sh: int, sw: int, dh: int, dw: int, pt: int, pl: int) -> None:
    """out (N * C, Ho, Wo) = x (N * C, H, W) convolved per channel with w (C, kh, kw): strides sh, sw, dilations
    dh, dw, zero padding pt rows above and pl columns left (the bottom and right padding follow from out)."""
    nc, height, width = x.shape
    c, kh, kw = w.shape
    ho = out.shape[1]
    wo = out.shape[2]
    # rows: per kernel row a, only the output rows ilo..ihi reading inside the input (no padded rows); the input
    # rows in sh phases (rows r with r % sh == p, one after another), so a tap's rows are one flat run
    hq = (height + sh - 1) // sh
    rph = np.empty(kh, np.intp)
    roff = np.empty(kh, np.intp)
    ilo = np.empty(kh, np.intp)
    ihi = np.empty(kh, np.intp)
    for a in range(kh):
        shift = a * dh - pt
        rph[a] = shift % sh
        roff[a] = (shift - rph[a]) // sh
        cnt = (height - rph[a] + sh - 1) // sh
        ilo[a] = min(ho, max(0, -roff[a]))
        ihi[a] = max(ilo[a], min(ho, cnt - roff[a]))
    # columns: zero-padded and in sw phases (each image row copied once into a row of wb columns per phase), so
    # output column j of tap b reads phase (b * dw) % sw at column j + (b * dw) // sw: every tap is one contiguous
    # run over all its rows at once, long enough to vectorise (row by row, 28 columns left it scalar)
    span = max(width + pl, (wo - 1) * sw + dw * (kw - 1) + 1)
    wb = (span + sw - 1) // sw
    copy = sh > 1 or sw > 1 or wb != width
    buf = np.zeros((sh * sw, hq * wb if copy else 1), x.dtype)
    direct = wb == wo
    scratch = np.empty(1 if direct else ho * wb, out.dtype)
    for sc in range(nc):
        ch = sc % c
        if copy:
            src = buf
            xc = x[sc]
            for r in range(height):
                xr = xc[r]
                rr = (r // sh) * wb
                if sw == 1:
                    row = buf[r % sh, rr + pl:rr + pl + width]
                    for k in range(width):
                        row[k] = xr[k]
                    continue
                for u in range(sw):  # padded column q + pl lands in phase (q + pl) % sw
                    q0 = (u - pl) % sw
                    row = buf[(r % sh) * sw + u, rr + (q0 + pl) // sw:rr + wb]
                    part = xr[q0:]
                    if sw == 2:  # a constant stride: vectorised (1.1-1.2x faster stride-2 convolutions)
                        for k in range((width - q0 + 1) // 2):
                            row[k] = part[2 * k]
                    else:
                        for k in range((width - q0 + sw - 1) // sw):
                            row[k] = part[k * sw]
        else:
            src = x[sc].reshape((1, height * width))
        acc = out[sc].reshape(ho * wo) if direct else scratch
        acc[:] = 0
        for a in range(kh):
            lo_ = ilo[a]
            hi_ = ihi[a]
            if hi_ <= lo_:
                continue
            f0 = lo_ * wb
            n = (hi_ - 1) * wb + wo - f0
            dst = acc[f0:f0 + n]
            g = f0 + roff[a] * wb
            pa = rph[a] * sw
            if kw == 3:
                w0 = w[ch, a, 0]
                w1 = w[ch, a, 1]
                w2 = w[ch, a, 2]
                s0 = src[pa + (0 * dw) % sw, g + (0 * dw) // sw:]
                s1 = src[pa + (1 * dw) % sw, g + (1 * dw) // sw:]
                s2 = src[pa + (2 * dw) % sw, g + (2 * dw) // sw:]
                for f in range(n):
                    dst[f] += w0 * s0[f] + w1 * s1[f] + w2 * s2[f]
            elif kw == 5:
                w0 = w[ch, a, 0]
                w1 = w[ch, a, 1]
                w2 = w[ch, a, 2]
                w3 = w[ch, a, 3]
                w4 = w[ch, a, 4]
                s0 = src[pa + (0 * dw) % sw, g + (0 * dw) // sw:]
                s1 = src[pa + (1 * dw) % sw, g + (1 * dw) // sw:]
                s2 = src[pa + (2 * dw) % sw, g + (2 * dw) // sw:]
                s3 = src[pa + (3 * dw) % sw, g + (3 * dw) // sw:]
                s4 = src[pa + (4 * dw) % sw, g + (4 * dw) // sw:]
                for f in range(n):
                    dst[f] += w0 * s0[f] + w1 * s1[f] + w2 * s2[f] + w3 * s3[f] + w4 * s4[f]
            else:
                for b in range(kw):
                    wt = w[ch, a, b]
                    s = src[pa + (b * dw) % sw, g + (b * dw) // sw:]
                    for f in range(n):
                        dst[f] += wt * s[f]
        if not direct:
            o = out[sc]
            for i in range(ho):
                orow = o[i]
                srow = scratch[i * wb:i * wb + wo]
                for j in range(wo):
                    orow[j] = srow[j]


def _depthwise_compiled(size: int, *, load: bool = False) -> Any:
    """The compiled depthwise loop for an input of ``size`` elements when numba is (or, with ``load``, can be)
    loaded, else None (small inputs, numba missing or disabled: the NumPy paths run)."""
    global _depthwise_jit
    if numba_for(size, load=load) is None:
        return None
    if _depthwise_jit is None:
        _depthwise_jit = False
        import numba

        _depthwise_jit = numba.njit(cache=True, nogil=True, error_model="numpy")(_depthwise_loop)
    return _depthwise_jit or None


def _conv_depthwise_compiled(loop: Any, x: np.ndarray, w: np.ndarray, res: np.ndarray, stride: tuple[int, ...],
                             padding: PadPairs, dilation: tuple[int, ...]) -> None:
    """A depthwise 2-d convolution by the compiled ``loop`` (see :func:`_depthwise_loop`)."""
    n, c, height, width = x.shape
    kh, kw = w.shape[2:]
    ho, wo = res.shape[2:]
    loop(np.ascontiguousarray(x).reshape(n * c, height, width), np.ascontiguousarray(w).reshape(c, kh, kw),
         res.reshape(n * c, ho, wo), *stride, *dilation, padding[0][0], padding[1][0])


def _conv_specialize(in_types: Any, out_types: Any, attrs: Any) -> None:
    """At compile time: for a float32/float64 depthwise 2-d convolution with an input large enough, load numba
    and the compiled depthwise loop (compiled or read from numba's cache now, not on the first run); the
    kernel stays.

    >>> _conv_specialize([TensorType("f4", (1, 4, 8, 8)), TensorType("f4", (4, 1, 3, 3))], [], {"groups": 4})
    """
    x, w = in_types[0], in_types[1]
    if not (isinstance(x, TensorType) and isinstance(w, TensorType) and x.shape is not None
            and w.shape is not None and len(w.shape) == 4 and len(x.shape) in (3, 4) and None not in x.shape):
        return
    dtype = np.result_type(x.dtype, w.dtype)
    c = x.shape[-3]
    if dtype not in (np.float32, np.float64) or not attrs.get("groups", 1) == c == w.shape[0]:
        return
    loop = _depthwise_compiled(int(np.prod(x.shape)), load=True)
    if loop is not None:  # compiles for this dtype (or loads the cached machine code) now
        one = np.zeros((1, 1, 1), dtype)
        loop(one, one, one, 1, 1, 1, 1, 0, 0)


def _conv_flat_shift(x: np.ndarray, w: np.ndarray, res: np.ndarray, padding: PadPairs, dilation: tuple[int, ...],
                     groups: int) -> None:
    """Grouped stride-1 convolutions (depthwise ones above all): a block of groups of one sample is padded
    into a flat scratch row per channel, where every tap's window is one contiguous run of it (the
    positions from the first output row to the last, whole padded rows), so each column copy is a
    long contiguous one; the product covers the padded rows' extra columns, which are dropped after."""
    n, _c, *sizes = x.shape
    m, cg, *kernel = w.shape
    og, outs = m // groups, res.shape[2:]
    padded = tuple(s + pb + pe for s, (pb, pe) in zip(sizes, padding, strict=True))
    steps = [int(np.prod(padded[a + 1:])) for a in range(len(padded))]  # flat stride of each padded axis
    length = outs[0] * steps[0]  # flat positions from the first output row through the last
    offsets = [sum(t * d * st for t, d, st in zip(tap, dilation, steps, strict=True))
               for tap in itertools.product(*(range(k) for k in kernel))]
    ntaps = len(offsets)
    gb = max(1, min(groups, _COLS_BYTES // max(cg * ntaps * length * x.itemsize, 1)))
    # One row per channel, long enough for the last tap's run (it overruns the padded image by less than
    # one padded row).
    flat = np.zeros((gb * cg, max(offsets) + length), x.dtype)
    image = flat[:, :int(np.prod(padded))].reshape(gb * cg, *padded)
    inside = (slice(None), *(slice(pb, pb + s) for s, (pb, _pe) in zip(sizes, padding, strict=True)))
    cols = np.empty((gb * cg, ntaps, length), x.dtype)
    prod = np.empty((gb, og, length), x.dtype)
    wg = w.reshape(groups, og, cg * ntaps)
    valid = (slice(None), slice(None), *(slice(0, o) for o in outs))
    for s in range(n):
        for g0 in range(0, groups, gb):
            g1 = min(groups, g0 + gb)
            k = (g1 - g0) * cg
            image[:k][inside] = x[s, g0 * cg:g1 * cg]
            for t, off in enumerate(offsets):
                cols[:k, t] = flat[:k, off:off + length]
            part = prod[:g1 - g0]
            np.matmul(wg[g0:g1], cols[:k].reshape(g1 - g0, cg * ntaps, length), out=part)
            res[s, g0 * og:g1 * og].reshape(g1 - g0, og, *outs)[...] = part.reshape(
                g1 - g0, og, outs[0], *padded[1:])[valid]


def _conv_im2col_wide(x: np.ndarray, w: np.ndarray, res: np.ndarray, taps: list[tuple[_AxisTap, ...]],
                      nb: int) -> None:
    """groups == 1 with a threaded BLAS: columns (C, taps, nb, *outs) for ``nb`` samples at once and one
    (M, C * taps) x (C * taps, nb * P) product per chunk, whose (M, nb, P) result is copied into res."""
    n, c = x.shape[:2]
    m = w.shape[0]
    outs = res.shape[2:]
    npos, ntaps = int(np.prod(outs)), len(taps)
    clipped = any(hi - lo != o for tap in taps for (lo, hi, _), o in zip(tap, outs, strict=True))
    cols = (np.zeros if clipped else np.empty)((c, ntaps, nb, *outs), x.dtype)
    tmp = np.empty((m, nb, npos), res.dtype)
    wm = w.reshape(m, c * ntaps)
    places = [((slice(None), t, slice(None), *(slice(lo, hi) for lo, hi, _ in tap)),
               (slice(None), slice(None), *(src for _, _, src in tap))) for t, tap in enumerate(taps)]
    for s in range(0, n, nb):
        e = min(n, s + nb)
        xs, chunk, part = x[s:e].swapaxes(0, 1), cols[:, :, :e - s], tmp[:, :e - s]
        for dst, src in places:
            chunk[dst] = xs[src]
        np.matmul(wm, chunk.reshape(c * ntaps, (e - s) * npos), out=part.reshape(m, (e - s) * npos))
        res[s:e].reshape(e - s, m, npos)[...] = part.swapaxes(0, 1)


@functools.cache
def _blas_threads() -> int:
    """Threads NumPy's BLAS runs a product on, by OpenBLAS's rule (read once)."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        val = os.environ.get(var, "").split(",")[0].strip()
        if val.isdigit() and int(val) > 0:
            return int(val)
    return os.cpu_count() or 1


def _conv_im2col(x: np.ndarray, w: np.ndarray, res: np.ndarray, taps: list[tuple[_AxisTap, ...]],
                 groups: int) -> None:
    """res (N, M, *outs) = w (M, Cg, *kernel) applied to x (N, C, *spatial) through im2col columns, a
    chunk at a time: several samples when one sample's columns are small, else a block of groups of
    one sample (depthwise convolutions: a block of channels, each a (1, taps) x (taps, P) product), else
    a band of output rows of one sample (large images)."""
    n = x.shape[0]
    m, cg = w.shape[:2]
    og, outs = m // groups, res.shape[2:]
    ho, rest, ntaps = outs[0], int(np.prod(outs[1:])), len(taps)
    per_group = cg * ntaps * ho * rest * x.itemsize
    nb = max(1, min(n, _COLS_BYTES // max(groups * per_group, 1)))
    gb = groups if nb > 1 else max(1, min(groups, _COLS_BYTES // max(per_group, 1)))
    rb = ho
    if gb == 1 and per_group > _COLS_BYTES:
        # Bands keep the columns in cache, as long as the GEMM stays wide enough to run at full speed.
        rb = min(ho, max(_COLS_BYTES // (cg * ntaps * rest * x.itemsize), -(-_MIN_GEMM_COLUMNS // rest)))
    # (samples, channels, taps, rows, *outs[1:]): a tap's columns outside its window are zeroed once here
    # and never written (along the banded axis, where the window moves from band to band, per band).
    clipped = any(hi - lo != o for tap in taps for (lo, hi, _), o in zip(tap, outs, strict=True))
    cols = (np.zeros if clipped else np.empty)((nb, gb * cg, ntaps, rb, *outs[1:]), x.dtype)
    wg = w.reshape(groups, og, cg * ntaps)
    rg = res.reshape(n, groups, og, ho, rest)
    every = (slice(None), slice(None))
    bands = []
    for r0 in range(0, ho, rb):
        r1 = min(ho, r0 + rb)
        copies, zeros = [], []
        for t, ((lo, hi, src), *others) in enumerate(taps):
            a, b = max(lo, r0), min(hi, r1)
            if rb < ho:
                zeros += [(*every, t, slice(0, max(a, r0) - r0)), (*every, t, slice(max(a, b) - r0, r1 - r0))]
            if b > a:
                rows = slice(src.start + (a - lo) * src.step, src.start + (b - lo - 1) * src.step + 1, src.step)
                copies.append(((*every, t, slice(a - r0, b - r0), *(slice(lo_, hi_) for lo_, hi_, _ in others)),
                               (*every, rows, *(sl for _, _, sl in others))))
        bands.append((r0, r1, copies, [z for z in zeros if z[-1].stop > z[-1].start]))
    for s in range(0, n, nb):
        e = min(n, s + nb)
        for g0 in range(0, groups, gb):
            g1 = min(groups, g0 + gb)
            xs = x[s:e, g0 * cg:g1 * cg]
            for r0, r1, copies, zeros in bands:
                chunk = cols[:e - s, :(g1 - g0) * cg, :, :r1 - r0]
                for z in zeros:
                    chunk[z] = 0
                for dst, src in copies:
                    chunk[dst] = xs[src]
                np.matmul(wg[g0:g1], chunk.reshape(e - s, g1 - g0, cg * ntaps, (r1 - r0) * rest),
                          out=rg[s:e, g0:g1, :, r0:r1].reshape(e - s, g1 - g0, og, (r1 - r0) * rest))


@BACKEND.rule("conv2d")
def _conv2d_kernel(x: np.ndarray, w: np.ndarray, out: Any = None, *, stride: Pair, padding: Padding,
                   dilation: Pair, groups: int) -> np.ndarray:
    top, bottom, left, right = pad4(padding)
    if x.ndim == 3:  # unbatched (C, H, W)
        res = conv_nd(x[None], w, None if out is None else out[None], stride=stride,
                      padding=((top, bottom), (left, right)), dilation=dilation, groups=groups)
        return out if out is not None else res[0]
    return conv_nd(x, w, out, stride=stride, padding=((top, bottom), (left, right)), dilation=dilation,
                   groups=groups)


@BACKEND.rule("conv")
def _conv_kernel(x: np.ndarray, w: np.ndarray, out: Any = None, *, stride: tuple[int, ...] | None,
                 padding: PadPairs | None, dilation: tuple[int, ...] | None, groups: int) -> np.ndarray:
    nsp = x.ndim - 2  # omitted per-axis attributes as the op's type rule reads them
    return conv_nd(x, w, out, stride=stride or (1,) * nsp, padding=padding or ((0, 0),) * nsp,
                   dilation=dilation or (1,) * nsp, groups=groups)


_conv2d_kernel.specialize = _conv_specialize  # type: ignore[attr-defined]
_conv_kernel.specialize = _conv_specialize  # type: ignore[attr-defined]


# ---------------------------------------------------------------- layer_norm
def _finish(result: np.ndarray, dtype: np.dtype, out: Any) -> np.ndarray:
    """Return a result computed in the work dtype as ``dtype``, in ``out`` when given."""
    if out is None:
        return result.astype(dtype, copy=False)
    if result is not out:
        np.copyto(out, result, casting="unsafe")
    return out  # type: ignore[no-any-return]


def _row_vector(v: np.ndarray | None, shape: tuple[int, ...], axis: int) -> np.ndarray | bool | None:
    """``v`` (scale or bias) as one contiguous row over the normalised axes, None when absent, False when it
    varies along a leading axis (then the general path runs)."""
    if v is None:
        return None
    v = np.asarray(v)
    lead = v.shape[:max(v.ndim - (len(shape) - axis), 0)]
    if any(d != 1 for d in lead):
        return False
    return np.ascontiguousarray(np.broadcast_to(v.reshape(v.shape[len(lead):]), shape[axis:])).reshape(-1)


# With numba loaded (the ``fast`` extra; see opgraph.backends.numpy.jit), one compiled loop per row: the
# sum, the centred sum of squares (accumulated in float64) and the scaled output, the row in the L1 cache, in
# place of the eight NumPy passes. A second form writes in place (x is the output): two arguments that are the
# same array make LLVM's vectoriser fall back to its scalar loop.
def _ln_stats(x: Any, i: int, n: int, eps: float) -> tuple[float, float]:
    s = 0.0
    for j in range(n):
        s += x[i, j]
    mu = s / n
    v = 0.0
    for j in range(n):
        d = x[i, j] - mu
        v += d * d
    return mu, 1.0 / np.sqrt(v / n + eps)


def _ln_loop(x: Any, o: Any, w: Any, b: Any, eps: float) -> None:
    rows, n = x.shape
    for i in range(rows):
        mu64, r64 = _ln_stats_jit(x, i, n, eps)
        mu, r = x.dtype.type(mu64), x.dtype.type(r64)
        for j in range(n):
            o[i, j] = (x[i, j] - mu) * r * w[j] + b[j]


def _ln_loop_inplace(x: Any, w: Any, b: Any, eps: float) -> None:
    rows, n = x.shape
    for i in range(rows):
        mu64, r64 = _ln_stats_jit(x, i, n, eps)
        mu, r = x.dtype.type(mu64), x.dtype.type(r64)
        for j in range(n):
            x[i, j] = (x[i, j] - mu) * r * w[j] + b[j]


_ln_jit: Any = None  # None: not tried; False: unavailable; else (loop, in-place loop)
_ln_stats_jit: Any = None


def _ln_loops(n: int) -> Any:
    """The compiled layer-norm loops when numba is loaded for an array of ``n`` elements, else None."""
    global _ln_jit, _ln_stats_jit
    # one call replaces about ten NumPy calls: worth it from small arrays on, once numba is loaded
    if n < 1024 or numba_for(max(n, NUMBA_MIN)) is None:
        return None
    if _ln_jit is None:
        _ln_jit = False
        import numba

        opts = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"}, error_model="numpy")
        _ln_stats_jit = numba.njit(**opts)(_ln_stats)
        _ln_jit = (numba.njit(**opts)(_ln_loop), numba.njit(**opts)(_ln_loop_inplace))
    return _ln_jit or None


def _layer_norm_rows(x2: np.ndarray, o2: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None,
                     eps: float) -> None:
    """Normalise each row of the C-contiguous 2-D ``x2`` into ``o2`` (which may be ``x2``): the compiled loop
    when numba is loaded, else whole-array NumPy passes (row sums as ``x @ ones``, sums of squares by einsum;
    blocks of rows in cache measured no faster: a transformer's activations fit the L2 cache whole)."""
    n = x2.shape[1]
    loops = _ln_loops(x2.size)
    if loops is not None:
        w = np.ones(n, x2.dtype) if scale is None else scale.astype(x2.dtype, copy=False)
        b = np.zeros(n, x2.dtype) if bias is None else bias.astype(x2.dtype, copy=False)
        if np.may_share_memory(x2, o2):
            loops[1](o2, w, b, float(eps))
        else:
            loops[0](x2, o2, w, b, float(eps))
        return
    dt = x2.dtype
    mu = np.matmul(x2, np.ones(n, dt))
    mu /= dt.type(n)
    np.subtract(x2, mu[:, None], out=o2)
    # sum of squares per row in one pass without a temporary (1.7x faster than squaring, then x @ ones)
    r = np.einsum("ij,ij->i", o2, o2)
    r /= dt.type(n)
    r += dt.type(eps)
    np.sqrt(r, out=r)
    np.reciprocal(r, out=r)
    np.multiply(o2, r[:, None], out=o2)
    if scale is not None:
        np.multiply(o2, scale, out=o2)
    if bias is not None:
        np.add(o2, bias, out=o2)


def _layer_norm_kernel(x: np.ndarray, scale: np.ndarray | None = None, bias: np.ndarray | None = None,
               out: np.ndarray | None = None, *, axis: int = -1, epsilon: float = 1e-5) -> np.ndarray:
    """ONNX LayerNormalization: normalise over axes ``axis`` .. last, then ``* scale + bias``.

    mean = mean(x), var = mean((x - mean)^2), y = (x - mean) / sqrt(var + epsilon) (two passes over each row,
    as ONNX's function body and torch's layer_norm); float16 computes in float32 (ONNX's default stash_type).
    Contiguous input: one compiled loop per row with numba (the ``fast`` extra), else NumPy passes with
    the row sums by a product with ones.

    >>> _layer_norm_kernel(np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 6.0]]), np.array([1.0, 2.0, 1.0]), epsilon=0.0)
    array([[-1.22474487,  0.        ,  1.22474487],
           [-0.70710678, -1.41421356,  1.41421356]])
    """
    x = np.asarray(x)
    ax = normalize_axis(axis, x.ndim)
    work = _work_dtype(x.dtype)
    srow, brow = _row_vector(scale, x.shape, ax), _row_vector(bias, x.shape, ax)
    n = int(np.prod(x.shape[ax:], dtype=np.int64))
    if x.size and srow is not False and brow is not False and work in (np.float32, np.float64):
        xw = np.ascontiguousarray(x, dtype=work)
        direct = (out is not None and out.dtype == work and out.flags.c_contiguous and out.shape == x.shape)
        res = out if direct else (xw if xw is not x else np.empty(x.shape, work))
        _layer_norm_rows(xw.reshape(-1, n), res.reshape(-1, n), srow, brow, epsilon)  # type: ignore[arg-type, union-attr]
        if direct:
            return res  # type: ignore[return-value]
        return _finish(res, x.dtype, out)  # type: ignore[arg-type]
    axes = tuple(range(ax, x.ndim))
    xw = x.astype(work, copy=False)
    d = xw - xw.mean(axis=axes, keepdims=True)
    y = d / np.sqrt(np.mean(d * d, axis=axes, keepdims=True) + work.type(epsilon))
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return _finish(np.asarray(y, dtype=work), x.dtype, out)


_layer_norm_kernel.specialize = prepare_loops  # type: ignore[attr-defined]
BACKEND.rule("layer_norm")(_layer_norm_kernel)


# ---------------------------------------------------------------- softmax
ROW_SUM_MAX = 4096
"""Rows up to this long are summed by a product with a vector of ones (see :func:`row_sums`)."""


def row_sums(e: np.ndarray, axis: int) -> np.ndarray:
    """``e.sum(axis, keepdims=True)``; along a contiguous last axis up to :data:`ROW_SUM_MAX` long (attention
    rows of 49-512) by :func:`~opgraph.backends.numpy.reduction.sum_rows`, 3x faster than NumPy's reduction there.

    >>> row_sums(np.arange(6.0).reshape(2, 3), -1).tolist()
    [[3.0], [12.0]]
    """
    if e.ndim and axis % e.ndim == e.ndim - 1:
        total = sum_rows(e, e.shape[-1], ROW_SUM_MAX)
        if total is not None:
            return total.reshape(*e.shape[:-1], 1)
    return np.add.reduce(e, axis=axis, keepdims=True)  # type: ignore[no-any-return]


@BACKEND.rule("softmax")
def softmax(x: np.ndarray, out: Any = None, *, axis: int) -> np.ndarray:
    """exp(x) / sum(exp(x)) along ``axis``, stabilised by subtracting the max; rows summed by :func:`row_sums`.

    >>> softmax(np.log(np.array([[1.0, 3.0]])), axis=-1)
    array([[0.25, 0.75]])
    """
    e = shifted_by_max(x, axis, out)
    np.exp(e, out=e)
    total = row_sums(e, axis)
    # One reciprocal per row and a multiply: a divide per element costs a pass 1.3x slower (at most one
    # more rounding).
    e *= np.reciprocal(total, out=total)
    return _finish(e, x.dtype, out)
