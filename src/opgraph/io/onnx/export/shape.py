"""ONNX export of the shape and layout ops (:mod:`opgraph.ops.shape`): reshapes, transposes, slices, joins, pads.

    >>> import opgraph
    >>> from opgraph.io.onnx import to_onnx
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2, 3)), name="x")
    >>> b.output(b.op("flip", x, axis=(1,)))
    >>> [n.op_type for n in to_onnx(b.freeze()).graph.node]
    ['Slice']
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opgraph.io.onnx.export import EXPORT, Exporter, OnnxExportError
from opgraph.io.onnx.export.common import AttrMap, Names, Types, elem_type, flat_axis, index_operand, scalar, simple

EXPORT.rules_from({"copy": "Identity"}, simple)


@EXPORT.rule("reshape", "expand_dims", "squeeze")
def _reshape(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Reshape", ins[0], ex.ints(ot[0].shape), allowzero=1)]


@EXPORT.rule("permute_dims")
def _transpose(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    r = len(it[0].shape or ())
    axes = attrs.get("axes")
    if r == 0:
        return [ex.one("Identity", ins[0])]
    return [ex.one("Transpose", ins[0], perm=list(range(r))[::-1] if axes is None else [int(a) % r for a in axes])]


@EXPORT.rule("moveaxis")
def _moveaxis(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    r = len(it[0].shape or ())
    src = [int(a) % r for a in np.atleast_1d(attrs["source"])]
    dst = [int(a) % r for a in np.atleast_1d(attrs["destination"])]
    # NumPy's own construction of the permutation
    perm = [n for n in range(r) if n not in src]
    for d, s in sorted(zip(dst, src, strict=True)):
        perm.insert(d, s)
    return [ex.one("Transpose", ins[0], perm=perm)]


@EXPORT.rule("broadcast_to")
def _broadcast_to(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Expand", ins[0], ex.ints(ot[0].shape))]


@EXPORT.rule("concat")
def _concat(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    flat = [flat_axis(ex, x, attrs.get("axis")) for x in ins]
    return [ex.one("Concat", *(x for x, _ in flat), axis=flat[0][1])]


@EXPORT.rule("stack")
def _stack(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    axis = int(attrs.get("axis", 0)) % len(ot[0].shape or (0,))
    return [ex.one("Concat", *[ex.one("Unsqueeze", x, ex.ints([axis])) for x in ins], axis=axis)]


@EXPORT.rule("split")
def _split(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    axis = int(attrs.get("axis", 0)) % len(it[0].shape or (0,))
    sizes = [t.shape[axis] for t in ot]
    return ex.node("Split", [ins[0], ex.ints(sizes)], n_out=len(ot), axis=axis)


@EXPORT.rule("getitem")
def _getitem(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    from opgraph.ops.shape import normalize_index

    shape = it[0].shape or ()
    index = normalize_index(attrs["index"], len(shape))
    # expand the ellipsis so each entry lines up with an input axis
    if ("ellipsis",) in index:
        k = index.index(("ellipsis",))
        used = sum(1 for e in index if isinstance(e, int) or e[0] == "slice")
        index = index[:k] + (("slice", None, None, None),) * (len(shape) - used) + index[k + 1:]
    starts, ends, axes, steps, drop = [], [], [], [], []
    axis = 0
    for e in index:
        if isinstance(e, int):
            n = shape[axis]
            i = e % n
            starts.append(i), ends.append(i + 1), axes.append(axis), steps.append(1)
            drop.append(axis)
            axis += 1
        elif e[0] == "slice":
            s, t, step = slice(e[1], e[2], e[3]).indices(shape[axis])
            if (s, t, step) != (0, shape[axis], 1):
                # a negative step's end -1 means "past the front", which ONNX spells as a huge negative
                starts.append(s), ends.append(t if t >= 0 else -(2 ** 62)), axes.append(axis), steps.append(step)
            axis += 1
    x = ins[0]
    if axes:
        x = ex.one("Slice", x, ex.ints(starts), ex.ints(ends), ex.ints(axes), ex.ints(steps))
    return [ex.one("Reshape", x, ex.ints(ot[0].shape), allowzero=1)]


def _run_time_bounds(ex: Exporter, x: str, ins: Names, it: Types, axes: Any) -> tuple[str, str, str, str | None]:
    """``slice``'s bounds as ONNX Slice's ``(starts, ends, axes, steps)`` (int64; axes "" when they are the leading
    ones). ONNX clamps a negative step's start below ``-n`` to the first element where Python's slice is empty:
    such ends become 2**62, which makes ONNX's slice empty too (not INT64_MAX: onnxruntime reads that as "to the
    front" for a negative step)."""
    starts, ends = (index_operand(ex, n, t, ("int64",)) for n, t in zip(ins[:2], it[:2], strict=True))
    steps = index_operand(ex, ins[2], it[2], ("int64",)) if len(ins) > 2 else None
    ax = "" if axes is None else ex.ints(axes)
    if steps is not None:
        shape = ex.one("Shape", x)
        n = ex.one("Gather", shape, ax) if axes is not None else ex.one("Slice", shape, ex.ints([0]),
                                                                            ex.one("Shape", starts))
        early = ex.one("And", ex.one("Less", starts, ex.one("Neg", n)), ex.one("Less", steps, ex.ints([0])))
        ends = ex.one("Where", early, ex.ints([2 ** 62]), ends)
    return starts, ends, ax, steps


@EXPORT.rule("slice")
def _slice(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    starts, ends, ax, steps = _run_time_bounds(ex, ins[0], ins[1:], it[1:], attrs.get("axes"))
    return [ex.one("Slice", ins[0], starts, ends, *([ax, steps] if steps is not None else [ax] if ax else []))]


@EXPORT.rule("slice_update")
def _slice_update(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    # A mask over x's own shape (static shapes stay static, so the model imports back): per sliced axis, which
    # positions Python's x[s:e:st] keeps and where each sits in the slice, then Where(mask, update gathered there, x)
    x, update = ins[0], ins[1]
    xs, us = it[0].shape, it[1].shape
    if xs is None or us is None or None in us:
        raise OnnxExportError("slice_update needs the rank of x and the shape of update")
    r = len(xs)
    k = it[2].shape[0] if it[2].shape is not None and len(it[2].shape) == 1 else None
    axes = attrs.get("axes")
    if axes is None:
        if k is None:
            raise OnnxExportError("slice_update needs the number of bounds (or axes) to be known")
        axes = tuple(range(k))
    axes = tuple(int(a) % r for a in axes)
    if 0 in us:  # it broadcasts to the slice, so the slice is empty
        return [ex.one("Identity", x)]
    bounds = [index_operand(ex, n, t, ("int64",)) for n, t in zip(ins[2:], it[2:], strict=True)]
    u = ex.one("Reshape", update, ex.ints([1] * (r - len(us)) + list(us))) if len(us) < r else update
    u_shape = (1,) * (r - len(us)) + tuple(us)
    shape = ex.one("Shape", x) if None in xs else None
    i64 = np.int64
    mask = None
    for j, d in enumerate(axes):
        if xs[d] is not None:
            n, pos = ex.const(i64(xs[d])), ex.const(np.arange(xs[d], dtype=i64))
        else:
            n = ex.one("Gather", shape, ex.const(i64(d)))
            pos = ex.one("Range", ex.const(i64(0)), n, ex.const(i64(1)))
        s, e = (ex.one("Slice", b, ex.ints([j]), ex.ints([j + 1])) for b in bounds[:2])
        st = ex.one("Slice", bounds[2], ex.ints([j]), ex.ints([j + 1])) if len(bounds) > 2 else ex.ints([1])
        up = ex.one("Greater", st, ex.ints([0]))
        zero, minus1 = ex.ints([0]), ex.ints([-1])
        last = ex.one("Sub", n, ex.const(i64(1)))
        ends = []
        for v in (s, e):  # slice.indices: past either end acts like -n-1 or n; then ONNX-free Python clamping
            v = ex.one("Min", ex.one("Max", v, ex.one("Sub", ex.one("Neg", n), ex.const(i64(1)))), n)
            v = ex.one("Where", ex.one("Less", v, zero), ex.one("Add", v, n), v)
            v_up = ex.one("Min", ex.one("Max", v, zero), n)
            v_dn = ex.one("Where", ex.one("Less", v, zero), minus1, ex.one("Min", v, last))
            ends.append(ex.one("Where", up, v_up, v_dn))
        s, e = ends
        off = ex.one("Sub", pos, s)
        within = ex.one("Or", ex.one("And", up, ex.one("And", ex.one("GreaterOrEqual", pos, s),
                                                         ex.one("Less", pos, e))),
                        ex.one("And", ex.one("Not", up), ex.one("And", ex.one("LessOrEqual", pos, s),
                                                                ex.one("Greater", pos, e))))
        inside = ex.one("And", within, ex.one("Equal", ex.one("Mod", off, st), zero))
        if u_shape[d] != 1:
            at = ex.one("Min", ex.one("Where", inside, ex.one("Div", off, st), zero), ex.ints([u_shape[d] - 1]))
            u = ex.one("Gather", u, at, axis=d)
        inside = ex.one("Reshape", inside, ex.ints([-1 if i == d else 1 for i in range(r)]))
        mask = inside if mask is None else ex.one("And", mask, inside)
    if mask is None:  # no sliced axis: the whole of x
        return [ex.one("Expand", u, shape if shape is not None else ex.ints(xs))]
    # onnxruntime's Where has no bool, 16-bit or uint64 kernels: select among exact casts (uint64 as its bits)
    via = _WHERE_VIA.get(it[0].dtype.name)
    if via is None:
        return [ex.one("Where", mask, u, x)]
    picked = ex.one("Where", mask, ex.one("Cast", u, to=elem_type(via)), ex.one("Cast", x, to=elem_type(via)))
    return [ex.one("Cast", picked, to=elem_type(it[0].dtype))]


_WHERE_VIA = {"bool": "uint8", "int16": "int32", "uint16": "int32", "uint64": "int64"}


@EXPORT.rule("take")
def _take(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    x, axis = flat_axis(ex, ins[0], attrs.get("axis"))
    return [ex.one("Gather", x, index_operand(ex, ins[1], it[1]), axis=axis)]


@EXPORT.rule("flip")
def _flip(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    r = len(it[0].shape or ())
    axes = list(range(r)) if attrs.get("axis") is None else [int(a) % r for a in attrs["axis"]]
    n = len(axes)
    if not n:
        return [ex.one("Identity", ins[0])]
    return [ex.one("Slice", ins[0], ex.ints([-1] * n), ex.ints([-(2 ** 62)] * n), ex.ints(axes), ex.ints([-1] * n))]


@EXPORT.rule("tile")
def _tile(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    reps = list(attrs["reps"])
    r = len(it[0].shape or ())
    x = ins[0]
    if len(reps) > r:
        x = ex.one("Reshape", x, ex.ints([1] * (len(reps) - r) + list(it[0].shape or ())))
    reps = [1] * (max(r, len(reps)) - len(reps)) + reps
    return [ex.one("Tile", x, ex.ints(reps))]


@EXPORT.rule("pad")
def _pad(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    mode = attrs.get("mode", "constant")
    if mode == "symmetric":
        raise OnnxExportError("pad mode 'symmetric' has no ONNX equivalent")
    r = len(it[0].shape or ())
    width = np.broadcast_to(np.asarray(attrs["pad_width"], dtype=np.int64).reshape(-1, 2), (r, 2))
    pads = list(width[:, 0]) + list(width[:, 1])
    extra = [scalar(ex, attrs.get("constant_value", 0.0), it[0])] if mode == "constant" else []
    return [ex.one("Pad", ins[0], ex.ints(pads), *extra, mode=mode)]
