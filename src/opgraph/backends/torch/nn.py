"""The torch engine's rules for the neural-network ops (:mod:`opgraph.ops.nn`): convolutions and pools
through ``torch.nn.functional`` where its padding matches, else the NumPy kernel's windows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from opgraph.backends.base import OpInfo
from opgraph.backends.torch import BACKEND
from opgraph.backends.torch.dtypes import SIGNED_BITS, U64, WIDE, Fn, by_keys, dtype_kind, fill_min, td, work_dtype


@BACKEND.rule("relu")
def _relu_rule(info: OpInfo) -> Fn:
    if dtype_kind(info.in_dtypes[0]) == "u":
        return lambda x: x.clone()
    return torch.relu


@BACKEND.rule("softmax", "log_softmax")
def _softmax_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    out = info.out_dtype
    work, t_out = td(work_dtype(out)), td(out)
    log = info.kind == "log_softmax"

    def exact(x: torch.Tensor) -> torch.Tensor:
        # The NumPy kernel's arithmetic: shift by the max (0 where it is not finite), then normalise.
        m = torch.amax(x, axis, keepdim=True)
        s = x - torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        if log:
            return s - torch.log(torch.sum(torch.exp(s), axis, keepdim=True))
        e = torch.exp(s)
        return e / torch.sum(e, axis, keepdim=True)

    fast = torch.log_softmax if log else torch.softmax

    def softmax(x: torch.Tensor) -> torch.Tensor:
        # torch's one-kernel (log_)softmax shifts by the row's max too, so it agrees with the NumPy kernel
        # wherever that max is finite; a row whose max is +-inf or NaN comes out all NaN from torch (inf - inf),
        # and only then is the kernel's arithmetic run (the test is one pass that reads the result once).
        # torch.compile traces the kernel's arithmetic instead, which it fuses, without a data-dependent branch.
        x = x.to(work)
        if x.numel() == 0:
            return x.to(t_out)
        if torch.compiler.is_compiling():
            return exact(x).to(t_out)
        r = fast(x, axis)
        if bool(torch.isnan(r).any()):
            r = exact(x)
        return r.to(t_out)

    return softmax


@BACKEND.rule("layer_norm")
def _layer_norm_rule(info: OpInfo) -> Fn:
    """torch's layer_norm over axes ``axis`` .. last, the scale and bias applied by it where they have exactly
    the normalised shape (after leading 1s), else multiplied and added after; float16 computes in float32.

    >>> from opgraph.core.types import TensorType
    >>> t, s = TensorType("float32", (2, 3)), TensorType("float32", (3,))
    >>> ln = BACKEND.rules["layer_norm"](OpInfo("layer_norm", {"axis": -1, "epsilon": 0.0}, (t, s), (t,)))
    >>> ln(torch.tensor([[1.0, 2.0, 3.0], [2.0, 2.0, 6.0]]), torch.tensor([1.0, 2.0, 1.0]))
    tensor([[-1.2247,  0.0000,  1.2247],
            [-0.7071, -1.4142,  1.4142]])
    """
    axis, eps = int(info.attrs["axis"]), float(info.attrs["epsilon"])
    out = info.out_dtype
    work, t_out = td(work_dtype(out)), td(out)

    def affine(p: torch.Tensor | None, dims: torch.Size) -> tuple[torch.Tensor | None, bool]:
        """(p as layer_norm's weight or bias, True) when it has the normalised shape, else (p, False)."""
        if p is None:
            return None, True
        lead = p.ndim - len(dims)
        if lead >= 0 and p.shape[lead:] == dims and all(n == 1 for n in p.shape[:lead]):
            return p.reshape(dims).to(work), True
        return p.to(work), False

    def layer_norm(x: torch.Tensor, scale: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
        dims = x.shape[axis % x.ndim:]
        w, w_in = affine(scale, dims)
        b, b_in = affine(bias, dims)
        if w_in and b_in:
            return F.layer_norm(x.to(work), dims, w, b, eps).to(t_out)
        y = F.layer_norm(x.to(work), dims, w if w_in else None, None, eps)
        if not w_in:
            y = y * w
        if b is not None:
            y = y + b
        return y.to(t_out)

    return layer_norm


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _torch_pads(pairs: Sequence[tuple[int, int]]) -> list[int]:
    """(begin, end) pairs of the trailing axes, first to last, as F.pad's flat list (last axis first)."""
    flat: list[int] = []
    for b, e in reversed(pairs):
        flat += [b, e]
    return flat


@BACKEND.rule("conv2d")
def _conv2d_rule(info: OpInfo) -> Fn:
    from opgraph.ops.nn import pad4

    out = info.out_dtype
    work, t_out = td(work_dtype(out)), td(out)
    top, bottom, left, right = pad4(info.attrs["padding"])
    stride, dilation, groups = tuple(info.attrs["stride"]), tuple(info.attrs["dilation"]), info.attrs["groups"]
    symmetric = top == bottom and left == right

    def conv2d(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x, w = x.to(work), w.to(work)
        if symmetric:
            return F.conv2d(x, w, None, stride, (top, left), dilation, groups).to(t_out)
        x = F.pad(x, [left, right, top, bottom])
        return F.conv2d(x, w, None, stride, 0, dilation, groups).to(t_out)

    return conv2d


def _windows(xp: torch.Tensor, spans: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
             outs: Sequence[int]) -> torch.Tensor:
    """(N, C, *outs, K): the (dilated, strided) windows of the trailing spatial axes of a padded input, the
    K = prod(kernel) taps of each in C order (as ``np.ndindex(*kernel)``)."""
    nsp = len(spans)
    lead = xp.ndim - nsp
    for i, (span, s) in enumerate(zip(spans, strides, strict=True)):
        xp = xp.unfold(lead + i, span, s)
    key = (*(slice(None),) * lead, *(slice(0, o) for o in outs), *(slice(None, None, d) for d in dilations))
    w = xp[key]
    taps = 1
    for k in w.shape[lead + nsp:]:
        taps *= k
    return w.reshape(*w.shape[:lead + nsp], taps)


@BACKEND.rule("max_pool2d")
def _max_pool2d_rule(info: OpInfo) -> Fn:
    if np.dtype(info.in_dtypes[0]) == U64:
        return by_keys(_max_pool2d_rule, info, True)
    from opgraph.ops.nn import pad4

    kernel = tuple(info.attrs["kernel_size"])
    stride = tuple(info.attrs["stride"]) if info.attrs["stride"] is not None else kernel
    top, bottom, left, right = pad4(info.attrs["padding"])
    dt = np.dtype(info.in_dtypes[0])
    fill = fill_min(dt)
    wide = dt in WIDE
    if dt.kind == "f" and top == bottom and left == right:
        return lambda x: F.max_pool2d(x, kernel, stride, (top, left))

    def max_pool2d(x: torch.Tensor) -> torch.Tensor:
        if wide:
            x = x.to(torch.int64)
        xp = F.pad(x, [left, right, top, bottom], value=fill) if top or bottom or left or right else x
        ho, wo = (xp.shape[-2] - kernel[0]) // stride[0] + 1, (xp.shape[-1] - kernel[1]) // stride[1] + 1
        return torch.amax(_windows(xp, kernel, stride, (1, 1), (ho, wo)), -1)

    return max_pool2d


@BACKEND.rule("avg_pool2d")
def _avg_pool2d_rule(info: OpInfo) -> Fn:
    from opgraph.ops.nn import pad4

    kernel = tuple(info.attrs["kernel_size"])
    stride = tuple(info.attrs["stride"]) if info.attrs["stride"] is not None else kernel
    top, bottom, left, right = pad4(info.attrs["padding"])
    include = bool(info.attrs["count_include_pad"])
    out = info.out_dtype
    work, t_out = td(work_dtype(out)), td(out)
    if top == bottom and left == right:
        return lambda x: F.avg_pool2d(x.to(work), kernel, stride, (top, left), False, include).to(t_out)

    def avg_pool2d(x: torch.Tensor) -> torch.Tensor:
        x = x.to(work)
        pads = [left, right, top, bottom]
        total = F.avg_pool2d(F.pad(x, pads), kernel, stride, 0, False, True)
        if include:
            return total.to(t_out)
        ones = torch.ones((1, *x.shape[-2:]), dtype=work, device=x.device)
        share = F.avg_pool2d(F.pad(ones, pads), kernel, stride, 0, False, True)
        return (total / share).to(t_out)

    return avg_pool2d


def _geometry(info: OpInfo, nsp: int) -> Any:
    from opgraph.ops.nn import Geometry

    return Geometry(dict(info.attrs), nsp)


@BACKEND.rule("conv")
def _conv_rule(info: OpInfo) -> Fn:
    out = info.out_dtype
    work, t_out = td(work_dtype(out)), td(out)
    nsp = len(info.in_types[1].shape) - 2  # type: ignore[union-attr, arg-type]
    geo = _geometry(info, nsp)
    groups = info.attrs["groups"]
    conv = _CONV[nsp]
    symmetric = all(b == e for b, e in geo.pads)
    stride, dilation = tuple(geo.stride), tuple(geo.dilation)
    pads = _torch_pads(geo.pads)

    def conv_nd(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x, w = x.to(work), w.to(work)
        if symmetric:
            return conv(x, w, None, stride, tuple(b for b, _ in geo.pads), dilation, groups).to(t_out)
        return conv(F.pad(x, pads), w, None, stride, 0, dilation, groups).to(t_out)

    return conv_nd


@BACKEND.rule("conv_transpose")
def _conv_transpose_rule(info: OpInfo) -> Fn:
    out = info.out_dtype
    work, t_out = td(work_dtype(out)), td(out)
    nsp = len(info.in_types[1].shape) - 2  # type: ignore[union-attr, arg-type]
    geo = _geometry(info, nsp)
    groups = info.attrs["groups"]
    conv_t = _CONV_T[nsp]
    stride, dilation = tuple(geo.stride), tuple(geo.dilation)
    # The full (unpadded) result, extended by output_padding at the end, then cut by the (begin, end) pads:
    # F.pad with negative amounts crops.
    crop = _torch_pads([(-b, op - e) for (b, e), op in zip(geo.pads, geo.output_padding, strict=True)])
    needs_crop = any(crop)

    def conv_transpose(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = conv_t(x.to(work), w.to(work), None, stride, 0, 0, groups, dilation)
        return (F.pad(y, crop) if needs_crop else y).to(t_out)

    return conv_transpose


def _pool_plan(info: OpInfo) -> Callable[[tuple[int, ...]], Any]:
    from opgraph.ops.nn import PoolPlan

    attrs = dict(info.attrs)
    plans: dict[tuple[int, ...], Any] = {}

    def plan(sizes: tuple[int, ...]) -> Any:
        p = plans.get(sizes)
        if p is None:
            p = plans[sizes] = PoolPlan(sizes, attrs)
        return p

    return plan


def _pool_windows(x: torch.Tensor, p: Any, fill: Any) -> torch.Tensor:
    pads = _torch_pads(p.pad_width[2:])
    xp = F.pad(x, pads, value=fill) if any(pads) else x
    return _windows(xp, p.spans, p.geo.stride, p.geo.dilation, p.outs)


_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _torch_pool(info: OpInfo, avg: bool) -> Fn | None:
    """``torch.nn.functional``'s max or avg pool for the op, where its geometry is one torch takes: symmetric
    padding of at most half the (dilated) window, and no dilation for avg; else None.

    torch's ceil_mode drops a last window that starts in the end padding, as opgraph's does, and its
    count_include_pad never counts ceil_mode's extension, as opgraph's; the output size is checked against the
    op's all the same, and a disagreement runs the windows (:func:`_windows`). Max pooling propagates NaN as
    NumPy's max does and never picks its padding.
    """
    kernel = tuple(info.attrs["kernel_size"])
    geo = _geometry(info, len(kernel))
    table = _AVG_POOL if avg else _MAX_POOL
    if len(kernel) not in table or any(b != e for b, e in geo.pads) or any(
            b > span // 2 for (b, _), span in zip(geo.pads, geo.spans(kernel), strict=True)):
        return None
    if avg and any(d != 1 for d in geo.dilation):
        return None
    pool, stride, pads = table[len(kernel)], tuple(geo.stride), tuple(b for b, _ in geo.pads)
    ceil = bool(info.attrs["ceil_mode"])
    if avg:
        include = bool(info.attrs["count_include_pad"])
        return lambda x: pool(x, kernel, stride, pads, ceil, include)
    dilation = tuple(geo.dilation)
    return lambda x: pool(x, kernel, stride, pads, dilation, ceil)


def _with_torch_pool(info: OpInfo, plan: Callable[[tuple[int, ...]], Any], avg: bool, windows: Fn) -> Fn:
    """:func:`_torch_pool` where it applies and gives the op's output size, else ``windows``."""
    fast = _torch_pool(info, avg)
    if fast is None:
        return windows

    def pool(x: torch.Tensor) -> torch.Tensor:
        y = fast(x)
        return y if tuple(y.shape[2:]) == plan(tuple(x.shape[2:])).outs else windows(x)

    return pool


@BACKEND.rule("max_pool")
def _max_pool_rule(info: OpInfo) -> Fn:
    if np.dtype(info.in_dtypes[0]) == U64:
        return by_keys(_max_pool_rule, info, True)
    plan = _pool_plan(info)
    fill = fill_min(info.in_dtypes[0])
    if np.dtype(info.in_dtypes[0]) in WIDE:
        return lambda x: torch.amax(_pool_windows(x.to(torch.int64), plan(tuple(x.shape[2:])), fill), -1)

    def windows(x: torch.Tensor) -> torch.Tensor:
        return torch.amax(_pool_windows(x, plan(tuple(x.shape[2:])), fill), -1)

    if dtype_kind(info.in_dtypes[0]) != "f":
        return windows
    return _with_torch_pool(info, plan, False, windows)


@BACKEND.rule("max_pool_argmax")
def _max_pool_argmax_rule(info: OpInfo) -> Fn:
    if np.dtype(info.in_dtypes[0]) == U64:
        return by_keys(_max_pool_argmax_rule, info, False)
    plan = _pool_plan(info)
    dt = np.dtype(info.in_dtypes[0])
    fill = fill_min(dt)
    is_float = dt.kind == "f"

    def max_pool_argmax(x: torch.Tensor) -> torch.Tensor:
        if x.dtype in SIGNED_BITS:
            x = x.to(torch.int64)
        sizes = tuple(x.shape[2:])
        p = plan(sizes)
        v = _pool_windows(x, p, fill)
        n = 1
        for s in sizes:
            n *= s
        pos = torch.arange(n, device=x.device).reshape(1, 1, *sizes)
        pw = _pool_windows(pos, p, -1)
        valid = pw >= 0
        m = torch.amax(torch.where(valid, v, torch.full_like(v, fill)), -1, keepdim=True)
        hit = valid & (v == m)
        if is_float:
            hit = hit | (valid & torch.isnan(v) & torch.isnan(m))
        first = torch.argmax(hit.to(torch.uint8), -1, keepdim=True)  # the first in window order
        return torch.gather(pw.expand(*v.shape), -1, first).squeeze(-1)

    return max_pool_argmax


@BACKEND.rule("avg_pool")
def _avg_pool_rule(info: OpInfo) -> Fn:
    plan = _pool_plan(info)
    out = info.out_dtype
    work, t_out = td(work_dtype(out)), td(out)
    include = bool(info.attrs["count_include_pad"])
    divisors: dict[tuple[Any, ...], torch.Tensor] = {}

    def avg_pool(x: torch.Tensor) -> torch.Tensor:
        sizes = tuple(x.shape[2:])
        p = plan(sizes)
        total = torch.sum(_pool_windows(x.to(work), p, 0), -1)
        d = divisors.get((sizes, x.device))
        if d is None:
            d = divisors[(sizes, x.device)] = torch.from_numpy(np.maximum(p.counts(include), 1)).to(x.device, work)
        return (total / d).to(t_out)

    fast = _with_torch_pool(info, plan, True, avg_pool)
    if fast is avg_pool:
        return avg_pool
    return lambda x: fast(x.to(work)).to(t_out)


@BACKEND.rule("lp_pool")
def _lp_pool_rule(info: OpInfo) -> Fn:
    plan = _pool_plan(info)
    out = info.out_dtype
    work, t_out = td(work_dtype(out)), td(out)
    p_norm = float(info.attrs["p"])

    def lp_pool(x: torch.Tensor) -> torch.Tensor:
        p = plan(tuple(x.shape[2:]))
        a = torch.abs(x).to(work)
        powered = a * a if p_norm == 2 else torch.pow(a, p_norm)
        total = torch.sum(_pool_windows(powered, p, 0), -1)
        return (torch.sqrt(total) if p_norm == 2 else torch.pow(total, 1.0 / p_norm)).to(t_out)

    return lp_pool


@BACKEND.rule("lrn")
def _lrn_rule(info: OpInfo) -> Fn:
    size, alpha, beta, bias = (info.attrs[k] for k in ("size", "alpha", "beta", "bias"))
    out = info.out_dtype
    work, t_out = td(work_dtype(out)), td(out)
    before, after = (size - 1) // 2, size // 2

    def lrn(x: torch.Tensor) -> torch.Tensor:
        xw = x.to(work)
        sq = torch.movedim(xw * xw, 1, -1)
        sums = torch.sum(F.pad(sq, [before, after]).unfold(-1, size, 1), -1)
        return (xw / torch.pow(bias + (alpha / size) * torch.movedim(sums, -1, 1), beta)).to(t_out)

    return lrn


@BACKEND.rule("resize")
def _resize_rule(info: OpInfo) -> Fn:
    from opgraph.ops.nn import resize_coordinates, resize_taps

    attrs = dict(info.attrs)
    sizes, scales, roi = attrs["sizes"], attrs["scales"], attrs["roi"]
    ctm = attrs["coordinate_transformation_mode"]
    dt = np.dtype(info.in_dtypes[0])
    work = dt if attrs["mode"] == "nearest" else work_dtype(dt)
    t_work, t_out = td(work), td(dt)
    fill = np.asarray(attrs["extrapolation_value"]).astype(work).item()
    plans: dict[tuple[int, ...], Any] = {}

    def plan(shape: tuple[int, ...]) -> Any:
        """Per axis: None (unchanged), an empty take, or (indices (n_out, taps), weights or None); the mask of
        outputs outside the input (tf_crop_and_resize), or None. Computed with the NumPy kernel's helpers."""
        rank = len(shape)
        steps: list[Any] = []
        outside = np.zeros((1,) * rank, bool)
        for axis, (n_in, n_out) in enumerate(zip(shape, sizes, strict=True)):
            scale = scales[axis] if scales is not None else (n_out / n_in if n_in else 1.0)
            box = (roi[axis], roi[axis + rank]) if roi is not None else (0.0, 1.0)
            identity = n_out == n_in and np.isclose(scale, 1.0, rtol=1e-9, atol=0) and \
                (ctm != "tf_crop_and_resize" or box == (0.0, 1.0))
            if identity or n_out == 0:
                steps.append(None if identity else (torch.zeros(0, dtype=torch.int64), None))
                continue
            xo = resize_coordinates(n_in, n_out, scale, ctm, box)
            if ctm == "tf_crop_and_resize":
                mshape = [1] * rank
                mshape[axis] = n_out
                outside = outside | ((xo < 0) | (xo > n_in - 1)).reshape(mshape)
            idx, weights = resize_taps(xo, n_in, attrs)
            wshape = [1] * rank
            wshape[axis] = n_out
            steps.append((torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64)),
                          None if weights is None else [torch.from_numpy(np.ascontiguousarray(
                              weights[:, t].astype(work).reshape(wshape))) for t in range(idx.shape[1])]))
        mask = torch.from_numpy(outside) if outside.any() else None
        return steps, mask

    def resize(x: torch.Tensor) -> torch.Tensor:
        key = tuple(x.shape)
        p = plans.get(key)
        if p is None:
            p = plans[key] = plan(key)
        steps, mask = p
        res = x.to(t_work)
        for axis, step in enumerate(steps):
            if step is None:
                continue
            idx, weights = step
            idx = idx.to(x.device)
            if weights is None:
                res = torch.index_select(res, axis, idx.reshape(-1)) if idx.ndim == 1 else \
                    torch.index_select(res, axis, idx[:, 0])
                continue
            acc = None
            for t, w in enumerate(weights):
                term = torch.index_select(res, axis, idx[:, t]) * w.to(x.device)
                acc = term if acc is None else acc + term
            res = acc
        if mask is not None:
            res = torch.where(mask.to(x.device), torch.full((), fill, dtype=t_work, device=x.device), res)
        return res.to(t_out)

    return resize


def _reflect_t(v: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """The NumPy kernel's ``_reflect``: fold coordinates outside [lo, hi] back in."""
    span = hi - lo
    if span <= 0:
        return torch.full_like(v, lo)
    below, above = v < lo, v > hi
    dist = torch.where(below, lo - v, v - hi)
    flips = torch.trunc(dist / span)
    rest = dist - flips * span
    even = torch.remainder(flips, 2) == 0
    folded = torch.where(below == even, lo + rest, hi - rest)
    return torch.where(below | above, folded, v)


@BACKEND.rule("grid_sample")
def _grid_sample_rule(info: OpInfo) -> Fn:
    from opgraph.ops.nn import grid_sample_taps

    mode, padding_mode, align = info.attrs["mode"], info.attrs["padding_mode"], bool(info.attrs["align_corners"])
    work = np.result_type(work_dtype(info.in_dtypes[0]), work_dtype(info.in_dtypes[1]))
    t_work, t_out = td(work), td(info.in_dtypes[0])

    def grid_sample(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        nsp = x.ndim - 2
        n = x.shape[0]
        xw = torch.movedim(x.to(t_work), 1, -1)  # (N, *in, C): the gathered (N, *out) axes come first
        axes_taps: list[list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]] = []
        for axis in range(nsp):
            size = x.shape[2 + axis]
            coord = grid[..., nsp - 1 - axis].to(torch.float64)  # the grid lists (x, y, z): the last axis first
            pos = (coord + 1) / 2 * (size - 1) if align else ((coord + 1) * size - 1) / 2
            lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
            if mode == "nearest":
                pos = torch.round(pos)  # half to even
            if padding_mode == "border":
                pos = torch.where((pos < lo) | (pos > hi), pos.clamp(0, size - 1), pos)
            elif padding_mode == "reflection":
                pos = _reflect_t(pos, lo, hi)
            base = torch.floor(pos)
            t = pos - base
            offsets, weights = grid_sample_taps(mode, t)
            taps = []
            for off, wgt in zip(offsets, weights, strict=True):
                idx = base + off
                valid = None
                if padding_mode == "zeros":
                    valid = (idx >= 0) & (idx < size)
                elif padding_mode == "reflection":
                    idx = torch.trunc(_reflect_t(idx, lo, hi))
                taps.append((idx.clamp(0, size - 1).to(torch.int64), wgt, valid))
            axes_taps.append(taps)
        batch = torch.arange(n, device=x.device).reshape(n, *(1,) * (grid.ndim - 2))
        acc = torch.zeros((*grid.shape[:-1], x.shape[1]), dtype=t_work, device=x.device)
        for combo in np.ndindex(*(len(t) for t in axes_taps)):
            weight: Any = 1.0
            for axis, k in enumerate(combo):
                _, wgt, valid = axes_taps[axis][k]
                if wgt is not None:
                    weight = weight * wgt
                if valid is not None:
                    weight = weight * valid
            index = (batch, *(axes_taps[axis][k][0] for axis, k in enumerate(combo)))
            wt = torch.as_tensor(weight, dtype=torch.float64, device=x.device).to(t_work)
            acc = acc + xw[index] * wt[..., None]
        return torch.movedim(acc, -1, 1).to(t_out)

    return grid_sample
