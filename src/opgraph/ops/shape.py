"""Shape ops: reshape, transpose, broadcast, join, split, index, pad and friends.

Every op keeps its input's dtype (``concat`` and ``stack`` promote their
inputs with ``np.result_type``, as NumPy does) and computes the result
shape exactly as NumPy, with ``None`` for dims (or ranks) that cannot be
known before run time. ``bitcast`` is the exception that changes the dtype:
it reads the same bytes as another dtype of the same item size. Ids 700-799,
stable: append, never renumber.

Kernels of view-like ops (see :data:`VIEW_OPS`) may return a view of their
first input when no ``out`` buffer is given; with ``out`` they copy into it.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (None, 6)), name="x")
    >>> y = b.op("reshape", x, shape=(-1, 2, 3))
    >>> z = b.op("getitem", y, index=(slice(None), 0, slice(None, None, -1)))
    >>> y.type, z.type
    (f32[?,2,3], f32[?,3])
    >>> b.run({x: np.arange(6, dtype=np.float32).reshape(1, 6)}, [z])[0]
    array([[2., 1., 0.]], dtype=float32)
    >>> bits = b.op("bitcast", z, dtype="uint32")
    >>> bits.type, b.run({x: np.arange(6, dtype=np.float32).reshape(1, 6)}, [bits])[0]
    (u32[?,3], array([[1073741824, 1065353216,          0]], dtype=uint32))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from opgraph.core.registry import (
    Attr,
    OpDef,
    attr_any,
    attr_axes,
    attr_dtype,
    attr_float,
    attr_int,
    attr_ints,
    attr_str,
    family_kinds,
    mark_traits,
    optional,
    register_op,
    set_rules,
)
from opgraph.core.types import TensorType, ValueType, normalize_axes, shape_str
from opgraph.errors import OpTypeError
from opgraph.ops import batch_helpers as bh
from opgraph.ops._common import (
    normalize_axis,
    num_elements,
    tensor,
    version_of_first,
    with_out,
    write_out,
)
from opgraph.ops.grad_helpers import dilate, no_grad, rank, static_shape, unbroadcast, zeros_like
from opgraph.ops.jvp_helpers import add_all, linear

FAMILY = "shape"

Dim = int | None
IndexEntry = int | tuple[Any, ...]
"""One entry of a normalised index: an int, ``("slice", start, stop, step)``,
``("newaxis",)`` or ``("ellipsis",)``."""

# ---------------------------------------------------------------- helpers
def _one(in_types: tuple[ValueType, ...]) -> TensorType:
    (t,) = in_types
    return tensor(t)


def _mul(d: Dim, k: int) -> Dim:
    """``d * k`` where ``d`` may be unknown (still 0 when ``k`` is 0)."""
    if k == 0:
        return 0
    return None if d is None else d * k


def _merge_dims(dims: Sequence[Dim], what: str) -> Dim:
    """The common value of dims that must be equal (None when all unknown)."""
    known = {d for d in dims if d is not None}
    if len(known) > 1:
        raise OpTypeError(f"{what} differ: {', '.join('?' if d is None else str(d) for d in dims)}")
    return known.pop() if known else None


def _register(name: str, id: int, infer: Any, kernel: Any, doc: str, *, arity: int | None = 1,
              min_inputs: int = 0, attrs: dict[str, Attr] | None = None, version: Any = None) -> OpDef:
    kernel.__name__ = f"{name}_numpy"
    extra = {} if version is None else {"version": version}
    return register_op(OpDef(
        name=name, id=id, arity=arity, min_inputs=min_inputs, infer=infer, attrs=attrs or {},
        kernel=kernel, family=FAMILY, doc=doc, grad=_SHAPE_GRADS.get(name), **extra,
    ))


# ---------------------------------------------------------------- gradient rules
# rule(b, inputs, outputs, cotangents, attrs) -> cotangents of the inputs (see opgraph.ops.grad_helpers).
# Gradients of ops that move elements move the cotangent back; static shapes are needed where the
# cotangent has to be padded or reshaped to the input's shape.
def _g_reshape(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    shape = ins[0].type.shape
    if shape is None or sum(d is None for d in shape) > 1:
        static_shape(ins[0].type)
    return [b.op("reshape", cots[0], shape=tuple(-1 if d is None else d for d in shape))]


def _g_permute(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    r = rank(ins[0].type)
    axes = attrs["axes"] if attrs["axes"] is not None else tuple(range(r - 1, -1, -1))
    return [b.op("permute_dims", cots[0], axes=tuple(int(i) for i in np.argsort([a % r for a in axes])))]


def _g_broadcast_to(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return [unbroadcast(b, cots[0], ins[0].type)]


def _g_expand_dims(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return [b.op("squeeze", cots[0], axis=attrs["axis"])]


def _g_squeeze(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return _g_reshape(b, ins, outs, cots, attrs)


def _g_concat(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    g, axis = cots[0], attrs["axis"]
    if axis is None:
        sizes = [int(np.prod(static_shape(x.type))) for x in ins]
    else:
        sizes = [static_shape(x.type)[axis] for x in ins]
    if len(ins) == 1:
        parts: Any = (g,)
    else:
        parts = b.op("split", g, sections=tuple(int(i) for i in np.cumsum(sizes)[:-1]),
                     axis=0 if axis is None else axis)
    return [b.op("reshape", p, shape=x.type.shape) if axis is None else p for p, x in zip(parts, ins, strict=True)]


def _g_stack(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    g, axis = cots[0], attrs["axis"]
    parts = (g,) if len(ins) == 1 else b.op("split", g, sections=len(ins), axis=axis)
    return [b.op("squeeze", p, axis=axis) for p in parts]


def _g_split(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    parts = [c if c is not None else zeros_like(b, o) for c, o in zip(cots, outs, strict=True)]
    return [b.op("concat", *parts, axis=attrs["axis"])]


def _scatter_slice(b: Any, g: Any, axis: int, d: int, start: int, length: int, step: int) -> Any:
    """Place ``g`` (``length`` along ``axis``) at ``start, start + step, ...`` of an axis of size ``d``.

    The other positions are zeros."""
    if step < 0:
        g = b.op("flip", g, axis=axis)
        start, step = start + (length - 1) * step, -step
    if step > 1 and length > 1:
        g = dilate(b, g, axis, step)
    pw = [(0, 0)] * rank(g.type)
    pw[axis] = (start, d - start - ((length - 1) * step + 1))
    return b.op("pad", g, pad_width=tuple(pw)) if any(pw[axis]) else g


def _g_getitem(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x, g = ins[0], cots[0]
    shape = static_shape(x.type, "getitem gradient")
    r = len(shape)
    index = normalize_index(attrs["index"], r)
    used = sum(1 for e in index if isinstance(e, int) or e[0] == "slice")
    full = ("slice", None, None, None)
    if ("ellipsis",) in index:
        i = index.index(("ellipsis",))
        index = index[:i] + (full,) * (r - used) + index[i + 1:]
    else:
        index = index + (full,) * (r - used)
    newaxes = tuple(k for k, e in enumerate(e for e in index if not isinstance(e, int)) if e == ("newaxis",))
    if newaxes:
        g = b.op("squeeze", g, axis=newaxes)
    entries = [e for e in index if e != ("newaxis",)]
    ints = tuple(k for k, e in enumerate(entries) if isinstance(e, int))
    if ints:
        g = b.op("expand_dims", g, axis=ints)
    if 0 in static_shape(g.type):
        return [zeros_like(b, x)]
    for axis, (e, d) in enumerate(zip(entries, shape, strict=True)):
        if isinstance(e, int):
            g = _scatter_slice(b, g, axis, d, e % d, 1, 1)
        else:
            start, stop, step = slice(e[1], e[2], e[3]).indices(d)
            length = len(range(start, stop, step))
            if (start, length, step) != (0, d, 1):
                g = _scatter_slice(b, g, axis, d, start, length, step)
    return [g]


def _g_take(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # One-hot matrix of the indices, contracted with the cotangent (repeated indices accumulate).
    x, idx = ins
    g, axis = cots[0], attrs["axis"]
    shape = static_shape(x.type, "take gradient")
    n = int(np.prod(shape)) if axis is None else shape[axis]
    ax = 0 if axis is None else axis % len(shape)
    k = rank(idx.type)
    wrapped = b.op("remainder", idx, b.constant(np.array(n, dtype=idx.type.dtype)))
    onehot = b.op("cast", b.op("equal", b.op("expand_dims", wrapped, axis=-1),
                               b.constant(np.arange(n, dtype=idx.type.dtype))), dtype=x.type.dtype)
    r = b.op("tensordot", g, onehot, axes=(tuple(range(ax, ax + k)), tuple(range(k))))
    if axis is None:
        return [b.op("reshape", r, shape=shape), None]
    return [b.op("moveaxis", r, source=-1, destination=ax), None]


def _g_pad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    if attrs["mode"] != "constant":
        raise NotImplementedError(f"pad gradient: only mode='constant' is supported, not {attrs['mode']!r}")
    shape = static_shape(ins[0].type, "pad gradient")
    pw = attrs["pad_width"]
    pairs = pw * len(shape) if len(pw) == 1 else pw
    return [b.op("getitem", cots[0], index=tuple(slice(lo, lo + d) for (lo, _), d in zip(pairs, shape, strict=True)))]


def _g_flip(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return [b.op("flip", cots[0], axis=attrs["axis"])]


def _g_roll(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return [b.op("roll", cots[0], shift=tuple(-s for s in attrs["shift"]), axis=attrs["axis"])]


def _g_tile(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    shape = static_shape(ins[0].type, "tile gradient")
    reps = tuple(attrs["reps"])
    R = max(len(shape), len(reps))
    s = (1,) * (R - len(shape)) + shape
    reps = (1,) * (R - len(reps)) + reps
    inter = tuple(v for pair in zip(reps, s, strict=True) for v in pair)
    g = b.op("reshape", cots[0], shape=inter)
    g = b.op("sum", g, axis=tuple(range(0, 2 * R, 2)))
    return [b.op("reshape", g, shape=shape)]


def _g_repeat(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    shape = static_shape(ins[0].type, "repeat gradient")
    rep, axis = attrs["repeats"], attrs["axis"]
    if axis is None:
        g = b.op("reshape", cots[0], shape=(int(np.prod(shape)), rep))
        return [b.op("reshape", b.op("sum", g, axis=1), shape=shape)]
    ax = axis % len(shape)
    split = (*shape[:ax], shape[ax], rep, *shape[ax + 1:])
    return [b.op("sum", b.op("reshape", cots[0], shape=split), axis=ax + 1)]


def _g_moveaxis(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return [b.op("moveaxis", cots[0], source=attrs["destination"], destination=attrs["source"])]


def _g_copy(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return [cots[0]]


_SHAPE_GRADS: dict[str, Any] = {
    "reshape": _g_reshape, "permute_dims": _g_permute, "broadcast_to": _g_broadcast_to,
    "expand_dims": _g_expand_dims, "squeeze": _g_squeeze, "concat": _g_concat, "stack": _g_stack,
    "split": _g_split, "getitem": _g_getitem, "take": _g_take, "pad": _g_pad, "flip": _g_flip, "roll": _g_roll,
    "tile": _g_tile, "repeat": _g_repeat, "moveaxis": _g_moveaxis, "copy": _g_copy,
}


# ---------------------------------------------------------------- reshape 700
def _reshape_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    target: tuple[int, ...] = attrs["shape"]
    if sum(d == -1 for d in target) > 1:
        raise OpTypeError(f"can only specify one unknown dimension (-1) in shape {target}")
    if any(d < -1 for d in target):
        raise OpTypeError(f"invalid dimension in target shape {target}")
    # Sizes are Python ints: NumPy's int64 product wraps around (a huge target printed a negative size).
    size = num_elements(t.shape)
    if -1 in target:
        rest = math.prod([d for d in target if d != -1])
        if rest == 0:
            raise OpTypeError(f"cannot infer the -1 in shape {target}: the other dims have size 0")
        if size is None:
            return (t.with_shape(tuple(None if d == -1 else d for d in target)),)
        if size % rest:
            raise OpTypeError(f"cannot reshape {shape_str(t.shape)} (size {size}) into shape {target}")
        return (t.with_shape(tuple(size // rest if d == -1 else d for d in target)),)
    want = math.prod(target)
    if size is not None and size != want:
        raise OpTypeError(f"cannot reshape {shape_str(t.shape)} (size {size}) into shape {target} (size {want})")
    if size is None and t.shape is not None:
        known = math.prod([d for d in t.shape if d is not None])
        if want % known:
            raise OpTypeError(f"cannot reshape {shape_str(t.shape)} (size a multiple of {known}) "
                              f"into shape {target} (size {want})")
    return (t.with_shape(target),)


_register("reshape", 700, _reshape_infer,
          with_out(lambda x, *, shape: np.reshape(x, shape)),
          "reshape(x, shape): NumPy's reshape; one -1 entry is inferred",
          attrs={"shape": Attr(attr_ints, doc="target shape; one entry may be -1")})


# ---------------------------------------------------------------- permute_dims 701
def _permute_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    axes: tuple[int, ...] | None = attrs["axes"]
    if t.shape is None:
        return (t.with_shape(None if axes is None else (None,) * len(axes)),)
    rank = len(t.shape)
    if axes is None:
        return (t.with_shape(t.shape[::-1]),)
    if len(axes) != rank:
        raise OpTypeError(f"axes {axes} do not match rank {rank}")
    norm = [normalize_axis(a, rank) for a in axes]
    if len(set(norm)) != rank:
        raise OpTypeError(f"axes {axes} are not a permutation of the {rank} axes (repeated axis)")
    return (t.with_shape(tuple(t.shape[a] for a in norm)),)


_register("permute_dims", 701, _permute_infer,
          with_out(lambda x, *, axes: np.transpose(x, axes)),
          "permute_dims(x, axes=None): NumPy's transpose; None reverses the axes",
          attrs={"axes": Attr(optional(attr_ints), None, doc="permutation of the axes; None reverses")})


# ---------------------------------------------------------------- broadcast_to 702
def _broadcast_to_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    target: tuple[int, ...] = attrs["shape"]
    if any(d < 0 for d in target):
        raise OpTypeError(f"all elements of the target shape {target} must be non-negative")
    if t.shape is not None:
        if len(t.shape) > len(target):
            raise OpTypeError(f"cannot broadcast {shape_str(t.shape)} to a shape of lower rank {target}")
        for d, w in zip(t.shape[::-1], target[::-1], strict=False):
            if d is not None and d != 1 and d != w:
                raise OpTypeError(f"cannot broadcast {shape_str(t.shape)} to shape {target}")
    return (t.with_shape(target),)


_register("broadcast_to", 702, _broadcast_to_infer,
          with_out(lambda x, *, shape: np.broadcast_to(x, shape)),
          "broadcast_to(x, shape): NumPy's broadcast_to (a read-only view)",
          attrs={"shape": Attr(attr_ints, doc="target shape")})


# ---------------------------------------------------------------- expand_dims 703
def _expand_dims_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    if t.shape is None:
        return (t,)
    axis: tuple[int, ...] = attrs["axis"]
    out_rank = len(t.shape) + len(axis)
    new = set(normalize_axes(axis, out_rank))
    dims = iter(t.shape)
    return (t.with_shape(tuple(1 if i in new else next(dims) for i in range(out_rank))),)


_register("expand_dims", 703, _expand_dims_infer,
          with_out(lambda x, *, axis: np.expand_dims(x, axis)),
          "expand_dims(x, axis): NumPy's expand_dims; axis positions refer to the result",
          attrs={"axis": Attr(attr_ints, doc="positions of the new size-1 axes in the result")})


# ---------------------------------------------------------------- squeeze 704
def _squeeze_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    axis: tuple[int, ...] | None = attrs["axis"]
    if t.shape is None:
        return (t,)
    if axis is None:
        if any(d is None for d in t.shape):
            return (t.with_shape(None),)  # which axes go depends on the unknown dims
        return (t.with_shape(tuple(d for d in t.shape if d != 1)),)
    axes = normalize_axes(axis, len(t.shape))
    for a in axes:
        if t.shape[a] not in (1, None):
            raise OpTypeError(f"cannot squeeze axis {a} of size {t.shape[a]} (only size-1 axes)")
    return (t.with_shape(tuple(d for i, d in enumerate(t.shape) if i not in axes)),)


_register("squeeze", 704, _squeeze_infer,
          with_out(lambda x, *, axis: np.squeeze(x, axis=axis)),
          "squeeze(x, axis=None): NumPy's squeeze; None removes every size-1 axis",
          attrs={"axis": Attr(attr_axes, None, doc="size-1 axes to remove; None: all of them")})


# ---------------------------------------------------------------- concat 705
def _concat_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    ts = [tensor(t, f"input {i}") for i, t in enumerate(in_types)]
    dtype = np.result_type(*(t.dtype for t in ts))
    axis: int | None = attrs["axis"]
    if axis is None:
        sizes = [num_elements(t.shape) for t in ts]
        return (TensorType(dtype, (None if None in sizes else sum(sizes),)),)  # type: ignore[arg-type]
    known = [t.shape for t in ts if t.shape is not None]
    if not known:
        return (TensorType(dtype, None),)
    ranks = {len(s) for s in known}
    if len(ranks) > 1:
        raise OpTypeError(f"all inputs must have the same rank, got shapes {', '.join(map(shape_str, known))}")
    rank = ranks.pop()
    if rank == 0:
        raise OpTypeError("zero-dimensional arrays cannot be concatenated (use axis=None or stack)")
    ax = normalize_axis(axis, rank)
    out: list[Dim] = []
    for k in range(rank):
        if k == ax:
            dims = [None if t.shape is None else t.shape[k] for t in ts]
            out.append(None if None in dims else sum(dims))  # type: ignore[arg-type]
        else:
            out.append(_merge_dims([s[k] for s in known], f"input sizes along axis {k} (concatenating on {ax})"))
    return (TensorType(dtype, tuple(out)),)


def _concat_kernel(*xs: np.ndarray, out: Any = None, axis: int | None) -> np.ndarray:
    return np.concatenate(xs, axis=axis, out=out)


_register("concat", 705, _concat_infer, _concat_kernel,
          "concat(*xs, axis=0): NumPy's concatenate; axis=None flattens the inputs first",
          arity=None, min_inputs=1,
          attrs={"axis": Attr(optional(attr_int), 0, doc="axis to join along; None: flatten all")})


# ---------------------------------------------------------------- stack 706
def _stack_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    ts = [tensor(t, f"input {i}") for i, t in enumerate(in_types)]
    dtype = np.result_type(*(t.dtype for t in ts))
    known = [t.shape for t in ts if t.shape is not None]
    if not known:
        return (TensorType(dtype, None),)
    if len({len(s) for s in known}) > 1:
        raise OpTypeError(f"all inputs must have the same shape, got {', '.join(map(shape_str, known))}")
    rank = len(known[0])
    dims = [_merge_dims([s[k] for s in known], f"input sizes along axis {k}") for k in range(rank)]
    ax = normalize_axis(attrs["axis"], rank + 1)
    dims.insert(ax, len(ts))
    return (TensorType(dtype, tuple(dims)),)


def _stack_kernel(*xs: np.ndarray, out: Any = None, axis: int) -> np.ndarray:
    return np.stack(xs, axis=axis, out=out)


_register("stack", 706, _stack_infer, _stack_kernel,
          "stack(*xs, axis=0): NumPy's stack; joins equal-shaped inputs along a new axis",
          arity=None, min_inputs=1, attrs={"axis": Attr(attr_int, 0, doc="position of the new axis in the result")})


# ---------------------------------------------------------------- split 707
def _attr_sections(v: Any) -> int | tuple[int, ...]:
    """An int N (N equal parts) or split indices (a tuple of ints)."""
    if isinstance(v, (bool, np.bool_)):
        raise OpTypeError(f"sections must be an int or a sequence of ints, got {v!r}")
    if isinstance(v, (int, np.integer)):
        return int(v)
    v = attr_any(v)
    if not isinstance(v, tuple):
        raise OpTypeError(f"sections must be an int or a sequence of ints, got {v!r}")
    return tuple(attr_int(i) for i in v)


def _slice_len(start: int | None, stop: int | None, step: int | None, n: Dim) -> Dim:
    """Length of ``range(n)[start:stop:step]``; for unknown ``n`` only when provably 0."""
    step = 1 if step is None else step
    if n is not None:
        return len(range(*slice(start, stop, step).indices(n)))
    if step > 0 and start is None:
        start = 0
    if start is not None and stop is not None and (start < 0) == (stop < 0):
        # Clipping to [0, n] is monotone, so an empty range stays empty for every n.
        if (step > 0 and stop <= start) or (step < 0 and stop >= start):
            return 0
    return None


def _split_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    sections: int | tuple[int, ...] = attrs["sections"]
    if isinstance(sections, int) and sections <= 0:
        raise OpTypeError(f"the number of sections must be larger than 0, got {sections}")
    n_out = sections if isinstance(sections, int) else len(sections) + 1
    if t.shape is None:
        return (t,) * n_out
    ax = normalize_axis(attrs["axis"], len(t.shape))
    d = t.shape[ax]
    if isinstance(sections, int):
        if d is not None and d % sections:
            raise OpTypeError(f"array split does not result in an equal division: axis {ax} of size {d} "
                              f"into {sections} sections")
        pieces: list[Dim] = [None if d is None else d // sections] * sections
    else:
        bounds: list[int | None] = [0, *sections, None]
        pieces = [_slice_len(bounds[i], bounds[i + 1], 1, d) for i in range(n_out)]
    return tuple(t.with_shape((*t.shape[:ax], p, *t.shape[ax + 1:])) for p in pieces)


def _split_kernel(x: np.ndarray, out: Any = None, *, sections: int | tuple[int, ...], axis: int) -> Any:
    parts = np.split(x, sections if isinstance(sections, int) else list(sections), axis=axis)
    if len(parts) == 1 and not isinstance(out, tuple):
        return write_out(parts[0], out)  # one output: a single array, not a tuple
    return write_out(tuple(parts), out)


_register("split", 707, _split_infer, _split_kernel,
          "split(x, sections, axis=0): NumPy's split; an int N gives N equal parts, "
          "a tuple gives the split indices (len + 1 outputs)",
          attrs={"sections": Attr(_attr_sections, doc="N equal parts, or a tuple of split indices"),
                 "axis": Attr(attr_int, 0, doc="axis to split")})


# ---------------------------------------------------------------- getitem 708
_ADVANCED = "only basic indexing (ints, slices, None, Ellipsis) is supported; use take for integer arrays"


def _index_int(v: Any, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise OpTypeError(f"{what} must be an int or None, got {v!r}")
    return int(v)


def _index_entry(e: Any) -> IndexEntry:
    if isinstance(e, (bool, np.bool_)):
        raise OpTypeError(f"boolean index {e!r} is not supported: {_ADVANCED}")
    if isinstance(e, (int, np.integer)):
        return int(e)
    if e is None:
        return ("newaxis",)
    if e is Ellipsis:
        return ("ellipsis",)
    if isinstance(e, slice):
        e = ("slice", e.start, e.stop, e.step)
    if isinstance(e, tuple) and e and isinstance(e[0], str):  # already normalised
        if e[0] == "slice" and len(e) == 4:
            step = _index_int(e[3], "slice step")
            if step == 0:
                raise OpTypeError("slice step cannot be zero")
            return ("slice", _index_int(e[1], "slice start"), _index_int(e[2], "slice stop"), step)
        if e in (("newaxis",), ("ellipsis",)):
            return e
        raise OpTypeError(f"malformed index entry {e!r}")
    raise OpTypeError(f"unsupported index {e!r}: {_ADVANCED}")


def normalize_index(key: Any, rank: int | None = None) -> tuple[IndexEntry, ...]:
    """Turn a basic-indexing key into the normalised tuple the ``getitem`` op stores.

    ``key`` is what goes between the brackets of ``x[key]``: an int, a slice,
    ``None``, ``Ellipsis`` or a tuple of them. Each entry becomes an int,
    ``("slice", start, stop, step)`` (each an int or None), ``("newaxis",)``
    or ``("ellipsis",)``. Already normalised entries are kept, so the function
    is idempotent. With ``rank`` known, too many indices are an error.
    Array, list and boolean keys (advanced indexing) raise ``OpTypeError``.

    >>> normalize_index((0, slice(None, None, -1), None, Ellipsis))
    (0, ('slice', None, None, -1), ('newaxis',), ('ellipsis',))
    >>> normalize_index(normalize_index(slice(1, 3))) == normalize_index(slice(1, 3))
    True
    >>> normalize_index((0, 0, 0), rank=2)
    Traceback (most recent call last):
    ...
    opgraph.errors.OpTypeError: too many indices: the array is 2-dimensional, but 3 were indexed
    >>> normalize_index([0, 1])
    Traceback (most recent call last):
    ...
    opgraph.errors.OpTypeError: unsupported index [0, 1]: only basic indexing ...
    """
    if isinstance(key, tuple) and not (key and isinstance(key[0], str)):
        entries = tuple(_index_entry(e) for e in key)
    else:
        entries = (_index_entry(key),)
    if entries.count(("ellipsis",)) > 1:
        raise OpTypeError("an index can only have a single ellipsis ('...')")
    used = sum(1 for e in entries if isinstance(e, int) or e[0] == "slice")
    if rank is not None and used > rank:
        raise OpTypeError(f"too many indices: the array is {rank}-dimensional, but {used} were indexed")
    return entries


def _getitem_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    if t.shape is None:
        return (t,)
    rank = len(t.shape)
    index = normalize_index(attrs["index"], rank)
    used = sum(1 for e in index if isinstance(e, int) or e[0] == "slice")
    full = ("slice", None, None, None)
    if ("ellipsis",) in index:
        i = index.index(("ellipsis",))
        index = index[:i] + (full,) * (rank - used) + index[i + 1:]
    else:
        index = index + (full,) * (rank - used)
    out: list[Dim] = []
    axis = 0
    for e in index:
        if e == ("newaxis",):
            out.append(1)
            continue
        d = t.shape[axis]
        if isinstance(e, int):
            if d is not None and not -d <= e < d:
                raise OpTypeError(f"index {e} is out of bounds for axis {axis} with size {d}")
        else:
            out.append(_slice_len(e[1], e[2], e[3], d))
        axis += 1
    return (t.with_shape(tuple(out)),)


def python_key(index: tuple[IndexEntry, ...], *, array_result: bool = True) -> tuple[Any, ...]:
    """A normalised ``getitem`` index as the key to put between Python's brackets.

    With ``array_result`` a trailing ``...`` makes all-int keys give a 0-d
    NumPy array rather than a scalar (other array libraries do not need it).

    >>> python_key(normalize_index((0, slice(1, None))))
    (0, slice(1, None, None), Ellipsis)
    >>> python_key(normalize_index(0), array_result=False)
    (0,)
    """
    key: list[Any] = []
    for e in index:
        if isinstance(e, int):
            key.append(e)
        elif e[0] == "slice":
            key.append(slice(e[1], e[2], e[3]))
        else:
            key.append(None if e[0] == "newaxis" else Ellipsis)
    if array_result and Ellipsis not in key:
        key.append(Ellipsis)
    return tuple(key)


def _getitem_kernel(x: np.ndarray, out: Any = None, *, index: tuple[IndexEntry, ...]) -> np.ndarray:
    return write_out(x[python_key(index)], out)


_register("getitem", 708, _getitem_infer, _getitem_kernel,
          "getitem(x, index): NumPy's basic indexing x[key]; index is normalize_index(key)",
          attrs={"index": Attr(normalize_index, doc="normalised index tuple (see normalize_index)")})


# ---------------------------------------------------------------- take 709
def _take_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x, idx = tensor(in_types[0], "x"), tensor(in_types[1], "indices")
    if idx.dtype.kind not in "iu":
        raise OpTypeError(f"indices must have an integer dtype, got {idx.dtype}")
    axis: int | None = attrs["axis"]
    if axis is None:
        extent = num_elements(x.shape)
        shape = idx.shape
    else:
        if x.shape is None:
            return (x.with_shape(None),)
        xs = x.shape or (1,)  # like NumPy, a 0-d x is taken from as a 1-d one
        ax = normalize_axis(axis, len(xs))
        extent = xs[ax]
        shape = None if idx.shape is None else (*xs[:ax], *idx.shape, *xs[ax + 1:])
    if extent == 0 and (num_elements(shape) or 0) > 0:
        raise OpTypeError("cannot do a non-empty take from an empty axis")
    return (x.with_shape(shape),)


def _take_kernel(x: np.ndarray, indices: np.ndarray, out: Any = None, *, axis: int | None) -> np.ndarray:
    return np.take(x, indices, axis=axis, out=out)


_register("take", 709, _take_infer, _take_kernel,
          "take(x, indices, axis=None): NumPy's take (negative indices count from the end); "
          "axis=None takes from the flattened x",
          arity=2, version=version_of_first,
          attrs={"axis": Attr(optional(attr_int), None, doc="axis to take along; None: the flattened x")})


# ---------------------------------------------------------------- pad 710
PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def _attr_pad_width(v: Any) -> tuple[tuple[int, int], ...]:
    """NumPy's pad_width forms -> a tuple of (before, after) pairs: one per axis, or one for all."""
    arr = np.asarray(attr_any(v))
    if arr.size == 0 or arr.dtype.kind not in "iu":
        raise OpTypeError(f"pad_width must be non-negative ints: N, (before, after) or one pair per axis, got {v!r}")
    if (arr < 0).any():
        raise OpTypeError(f"pad_width must be non-negative, got {v!r}")
    if arr.ndim == 0 or arr.shape in ((1,), (2,)):
        arr = np.broadcast_to(arr, (1, 2))
    elif arr.ndim == 2 and arr.shape[1] in (1, 2):
        arr = np.broadcast_to(arr, (arr.shape[0], 2))
    else:
        raise OpTypeError(f"pad_width {v!r} is not N, (before, after) or one (before, after) pair per axis")
    return tuple((int(b), int(a)) for b, a in arr)


def _attr_pad_mode(v: Any) -> str:
    mode = attr_str(v)
    if mode not in PAD_MODES:
        raise OpTypeError(f"unsupported pad mode {mode!r}; supported: {', '.join(PAD_MODES)}")
    return mode


def _pad_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    pw: tuple[tuple[int, int], ...] = attrs["pad_width"]
    mode: str = attrs["mode"]
    if t.shape is None:
        return (t if len(pw) == 1 else t.with_shape((None,) * len(pw)),)
    rank = len(t.shape)
    if len(pw) not in (1, rank):
        raise OpTypeError(f"pad_width has {len(pw)} (before, after) pairs for an input of rank {rank}")
    pairs = pw * rank if len(pw) == 1 else pw
    for i, (d, (b, a)) in enumerate(zip(t.shape, pairs, strict=True)):
        if d == 0 and (b or a) and mode != "constant":
            raise OpTypeError(f"can't extend empty axis {i} using mode {mode!r} (only 'constant')")
    return (t.with_shape(tuple(None if d is None else d + b + a for d, (b, a) in zip(t.shape, pairs, strict=True))),)


def _pad_kernel(x: np.ndarray, out: Any = None, *, pad_width: tuple[tuple[int, int], ...], mode: str,
                constant_value: float) -> np.ndarray:
    if len(pad_width) == 1 and x.ndim > 1:  # one pair for every axis
        pad_width = pad_width * x.ndim
    shape = tuple(d + a + b for d, (a, b) in zip(x.shape, pad_width, strict=False))
    if mode != "constant" or len(pad_width) != x.ndim or (
            out is not None and (out.shape != shape or out.dtype != x.dtype)):
        kw = {"constant_values": constant_value} if mode == "constant" else {}
        return write_out(np.pad(x, pad_width, mode=mode, **kw), out)  # type: ignore[call-overload]
    # np.pad's general machinery costs more than the copy (a slice's gradient pads with zeros): fill the
    # borders, then copy x in, once, into out when given
    res = np.empty(shape, x.dtype) if out is None else out
    for axis, (a, b) in enumerate(pad_width):
        lead = (slice(None),) * axis
        if a:
            res[(*lead, slice(0, a))] = constant_value
        if b:
            res[(*lead, slice(shape[axis] - b, None))] = constant_value
    res[tuple(slice(a, a + d) for d, (a, _) in zip(x.shape, pad_width, strict=True))] = x
    return res


_register("pad", 710, _pad_infer, _pad_kernel,
          "pad(x, pad_width, mode='constant', constant_value=0.0): NumPy's pad with modes "
          + ", ".join(PAD_MODES),
          attrs={"pad_width": Attr(_attr_pad_width, doc="(before, after) pairs: one per axis, or one for all"),
                 "mode": Attr(_attr_pad_mode, "constant", doc="one of " + ", ".join(PAD_MODES)),
                 "constant_value": Attr(attr_float, 0.0, doc="fill value for mode='constant'")})


# ---------------------------------------------------------------- flip 711
def _flip_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    if t.shape is not None and attrs["axis"] is not None:
        normalize_axes(attrs["axis"], len(t.shape))
    return (t,)


_register("flip", 711, _flip_infer,
          with_out(lambda x, *, axis: np.flip(x, axis)),
          "flip(x, axis=None): NumPy's flip; None reverses every axis",
          attrs={"axis": Attr(attr_axes, None, doc="axes to reverse; None: all")})


# ---------------------------------------------------------------- roll 712
def _roll_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    shift: tuple[int, ...] = attrs["shift"]
    axis: tuple[int, ...] | None = attrs["axis"]
    if not shift:
        raise OpTypeError("shift must have at least one entry")
    if axis is not None:
        if not axis:
            raise OpTypeError("axis must have at least one entry (or be None)")
        if len(shift) != len(axis) and 1 not in (len(shift), len(axis)):
            raise OpTypeError(f"shift {shift} and axis {axis} must have the same length (or one of them length 1)")
        if t.shape is not None:
            for a in axis:  # repeated axes are allowed: their shifts add up
                normalize_axis(a, len(t.shape))
    return (t,)


def _roll_kernel(x: np.ndarray, out: Any = None, *, shift: tuple[int, ...],
                 axis: tuple[int, ...] | None) -> np.ndarray:
    return write_out(np.roll(x, shift[0] if len(shift) == 1 else shift, axis=axis), out)


_register("roll", 712, _roll_infer, _roll_kernel,
          "roll(x, shift, axis=None): NumPy's roll; None rolls the flattened x",
          attrs={"shift": Attr(attr_ints, doc="shift(s), broadcast against axis"),
                 "axis": Attr(attr_axes, None, doc="axes to roll; None: the flattened array")})


# ---------------------------------------------------------------- tile 713
def _tile_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    reps: tuple[int, ...] = attrs["reps"]
    if any(r < 0 for r in reps):
        raise OpTypeError(f"reps must be non-negative, got {reps}")
    if t.shape is None:
        return (t,)
    n = max(len(reps), len(t.shape))
    reps = (1,) * (n - len(reps)) + reps
    shape = (1,) * (n - len(t.shape)) + t.shape
    return (t.with_shape(tuple(_mul(d, r) for d, r in zip(shape, reps, strict=True))),)


_register("tile", 713, _tile_infer,
          with_out(lambda x, *, reps: np.tile(x, reps)),
          "tile(x, reps): NumPy's tile",
          attrs={"reps": Attr(attr_ints, doc="repetitions per axis (aligned to the last axes)")})


# ---------------------------------------------------------------- repeat 714
def _repeat_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    repeats: int = attrs["repeats"]
    axis: int | None = attrs["axis"]
    if repeats < 0:
        raise OpTypeError(f"repeats must be non-negative, got {repeats}")
    if axis is None:
        return (t.with_shape((_mul(num_elements(t.shape), repeats),)),)
    if t.shape is None:
        return (t,)
    shape = t.shape or (1,)  # like NumPy, a 0-d input repeats as a 1-d one
    ax = normalize_axis(axis, len(shape))
    return (t.with_shape((*shape[:ax], _mul(shape[ax], repeats), *shape[ax + 1:])),)


_register("repeat", 714, _repeat_infer,
          with_out(lambda x, *, repeats, axis: np.repeat(x, repeats, axis=axis)),
          "repeat(x, repeats, axis=None): NumPy's repeat; None repeats the flattened x",
          attrs={"repeats": Attr(attr_int, doc="repetitions of each element"),
                 "axis": Attr(optional(attr_int), None, doc="axis to repeat along; None: the flattened x")})


# ---------------------------------------------------------------- moveaxis 715
def _moveaxis_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    source: tuple[int, ...] = attrs["source"]
    destination: tuple[int, ...] = attrs["destination"]
    if len(source) != len(destination):
        raise OpTypeError(f"source {source} and destination {destination} must have the same number of elements")
    if t.shape is None:
        return (t,)
    rank = len(t.shape)
    src = [normalize_axis(a, rank) for a in source]
    dst = [normalize_axis(a, rank) for a in destination]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise OpTypeError(f"repeated axis in source {source} or destination {destination}")
    order = [a for a in range(rank) if a not in src]
    for d, s in sorted(zip(dst, src, strict=True)):
        order.insert(d, s)
    return (t.with_shape(tuple(t.shape[a] for a in order)),)


_register("moveaxis", 715, _moveaxis_infer,
          with_out(lambda x, *, source, destination: np.moveaxis(x, source, destination)),
          "moveaxis(x, source, destination): NumPy's moveaxis",
          attrs={"source": Attr(attr_ints, doc="axes to move"),
                 "destination": Attr(attr_ints, doc="their positions in the result")})


# ---------------------------------------------------------------- copy 716
def _copy_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    return (_one(in_types),)


def _copy_kernel(x: np.ndarray, out: Any = None) -> np.ndarray:
    if out is None:
        return np.array(x, copy=True, order="C")
    np.copyto(out, x)
    return out


_register("copy", 716, _copy_infer, _copy_kernel,
          "copy(x): the identity, as a fresh C-contiguous array that shares no memory with x")


# ---------------------------------------------------------------- bitcast 717
def _bitcast_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    dt = np.dtype(attrs["dtype"])
    if dt.itemsize != t.dtype.itemsize:
        raise OpTypeError(f"cannot reinterpret {t.dtype} ({t.dtype.itemsize} bytes) as {dt} ({dt.itemsize} "
                          "bytes): the item sizes differ")
    return (TensorType(dt, t.shape),)


def _bitcast_kernel(x: np.ndarray, out: Any = None, *, dtype: str) -> np.ndarray:
    if np.dtype(dtype) == np.bool_ and x.dtype != np.bool_:
        # A byte other than 0 or 1 viewed as bool is no valid NumPy bool (== True and sums disagree with
        # printing): any set bit reads as True.
        return np.not_equal(x.view(np.uint8), 0, out=out)
    # A copy, not a view: bitcast is not one of VIEW_OPS, so its result must own its memory.
    return write_out(x.view(dtype), out) if out is not None else np.array(x.view(dtype), copy=True)


_register("bitcast", 717, _bitcast_infer, _bitcast_kernel,
          "bitcast(x, dtype): the same bytes read as another dtype of the same item size (ndarray.view, "
          "native byte order); bytes read as bool are True when nonzero",
          attrs={"dtype": Attr(attr_dtype, doc="dtype to reinterpret the bytes as (same item size as x's)")})


# ---------------------------------------------------------------- slice 718, slice_update 719
# Bounds known only at run time: starts, ends and steps are 1-D integer inputs, one entry per sliced axis.
def _attr_slice_axes(v: Any) -> tuple[int, ...] | None:
    """None (the leading axes, one per entry of ``starts``) or the sliced axes in the order of the bounds."""
    return None if v is None else attr_ints(v)


def _int_vector_len(t: ValueType, what: str, entry: str = "sliced axis") -> int | None:
    """The length of a 1-D integer input with one ``entry`` per element: bounds, a shape (None when unknown)."""
    b = tensor(t, what)
    if b.dtype.kind not in "iu":
        raise OpTypeError(f"{what} must have an integer dtype, got {b.dtype}")
    if b.shape is None:
        return None
    if len(b.shape) != 1:
        raise OpTypeError(f"{what} must be 1-D (one entry per {entry}), got shape {shape_str(b.shape)}")
    return b.shape[0]


def _sliced_axes(x: TensorType, bounds: Sequence[ValueType], axes: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The (non-negative) axes of ``x`` the bounds slice; None when that is unknown before run time."""
    names = ("starts", "ends", "steps")
    lens = {n for n in (_int_vector_len(t, names[i]) for i, t in enumerate(bounds)) if n is not None}
    if len(lens) > 1:
        raise OpTypeError(f"starts, ends and steps have different lengths {sorted(lens)}")
    k = lens.pop() if lens else None
    if axes is not None and k is not None and len(axes) != k:
        raise OpTypeError(f"axes {axes} name {len(axes)} axes but the bounds have {k} entries")
    if x.shape is None:
        return None
    r = len(x.shape)
    if axes is None:
        if k is not None and k > r:
            raise OpTypeError(f"{k} bounds for an input of rank {r}")
        return None if k is None else tuple(range(k))
    norm = tuple(normalize_axis(a, r) for a in axes)
    if len(set(norm)) != len(norm):
        raise OpTypeError(f"repeated axis in axes {axes}")
    return norm


def _slice_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    if len(in_types) not in (3, 4):
        raise OpTypeError(f"takes x, starts, ends and optionally steps, got {len(in_types)} inputs")
    x = tensor(in_types[0], "x")
    axes = _sliced_axes(x, in_types[1:], attrs["axes"])
    if x.shape is None:
        return (x,)
    # the length of a sliced axis depends on the run-time bounds: only an empty axis stays known
    return (x.with_shape(tuple(d if (axes is not None and i not in axes) or d == 0 else None
                               for i, d in enumerate(x.shape))),)


def slice_key(ndim: int, starts: Any, ends: Any, steps: Any = None,
              axes: Sequence[int] | None = None) -> tuple[slice, ...]:
    """The Python key ``x[key]`` of a run-time slice: ``slice(s, e, st)`` on each sliced axis, ``:`` elsewhere.

    The bounds are any integers (1-D arrays or sequences); out-of-range ones clamp as in Python. A step of 0,
    bounds of different lengths or more bounds than axes raise ``ValueError``.

    >>> slice_key(3, [1, -1], [9, -4], [1, -2], axes=(2, 0))
    (slice(-1, -4, -2), slice(None, None, None), slice(1, 9, 1))
    """
    st = [int(v) for v in np.asarray(starts).reshape(-1)]
    en = [int(v) for v in np.asarray(ends).reshape(-1)]
    sp = [1] * len(st) if steps is None else [int(v) for v in np.asarray(steps).reshape(-1)]
    if not len(st) == len(en) == len(sp):
        raise ValueError(f"starts, ends and steps have different lengths ({len(st)}, {len(en)}, {len(sp)})")
    ax = list(range(len(st))) if axes is None else [a % ndim if -ndim <= a < ndim else ndim for a in axes]
    if len(ax) != len(st) or any(a >= ndim for a in ax):
        raise ValueError(f"{len(st)} bounds do not fit the axes {tuple(ax) if axes is not None else ''} of an "
                         f"array of rank {ndim}")
    if 0 in sp:
        raise ValueError(f"slice step cannot be zero (steps {sp})")
    key = [slice(None)] * ndim
    for a, s, e, p in zip(ax, st, en, sp, strict=True):
        key[a] = slice(s, e, p)
    return tuple(key)


def _slice_kernel(x: np.ndarray, starts: np.ndarray, ends: np.ndarray, steps: np.ndarray | None = None,
                  out: Any = None, *, axes: tuple[int, ...] | None) -> np.ndarray:
    # A copy, not a view: slice is not one of VIEW_OPS (the compiled runtime keeps the views of view ops made
    # once, which holds only while a view depends on its input's buffer alone, not on other inputs' values).
    part = x[slice_key(x.ndim, starts, ends, steps, axes)]
    return write_out(part, out) if out is not None else np.array(part, copy=True)


def _slice_update_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    if len(in_types) not in (4, 5):
        raise OpTypeError(f"takes x, update, starts, ends and optionally steps, got {len(in_types)} inputs")
    x, u = tensor(in_types[0], "x"), tensor(in_types[1], "update")
    if u.dtype != x.dtype:
        raise OpTypeError(f"update is {u.dtype} but x is {x.dtype} (cast it first)")
    axes = _sliced_axes(x, in_types[2:], attrs["axes"])
    if x.shape is not None and u.shape is not None:
        if len(u.shape) > len(x.shape):
            raise OpTypeError(f"update of shape {shape_str(u.shape)} has more axes than x {shape_str(x.shape)}")
        lead = len(x.shape) - len(u.shape)
        for i, e in enumerate(u.shape):
            a, d = lead + i, x.shape[lead + i]
            if axes is not None and a not in axes and e not in (None, 1) and d is not None and e != d:
                raise OpTypeError(f"update of shape {shape_str(u.shape)} does not broadcast to the slice of "
                                  f"{shape_str(x.shape)}: axis {a} is not sliced and has size {d}")
    return (x,)


def _slice_update_kernel(x: np.ndarray, update: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                         steps: np.ndarray | None = None, out: Any = None, *,
                         axes: tuple[int, ...] | None) -> np.ndarray:
    key = slice_key(x.ndim, starts, ends, steps, axes)
    if out is None:
        out = np.array(x, copy=True)
    else:
        np.copyto(out, x)
    out[key] = update
    return out


def _g_slice(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # the cotangent goes back where the slice came from, zeros elsewhere
    gx = b.op("slice_update", zeros_like(b, ins[0]), cots[0], *ins[1:], axes=attrs["axes"])
    return [gx, *[None] * (len(ins) - 1)]


def _g_slice_update(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    _, u, *bounds = ins
    g = cots[0]
    zero = b.constant(np.zeros((), dtype=g.type.dtype))
    gx = b.op("slice_update", g, zero, *bounds, axes=attrs["axes"])  # the overwritten elements do not reach y
    gu = unbroadcast(b, b.op("slice", g, *bounds, axes=attrs["axes"]), u.type)
    return [gx, gu, *[None] * len(bounds)]


_SHAPE_GRADS.update({"slice": _g_slice, "slice_update": _g_slice_update})

_SLICE_AXES_DOC = "the sliced axes, in the order of the bounds; None: the leading axes, one per bound"
_register("slice", 718, _slice_infer, _slice_kernel,
          "slice(x, starts, ends, steps=None, axes=None): x[s:e:st] on each sliced axis with the bounds given "
          "at run time as 1-D integer tensors (Python's clamping and negative indices; a step of 0 is an error); "
          "the sliced axes' sizes are unknown until then",
          arity=None, min_inputs=3, version=version_of_first,
          attrs={"axes": Attr(_attr_slice_axes, None, doc=_SLICE_AXES_DOC)})
_register("slice_update", 719, _slice_update_infer, _slice_update_kernel,
          "slice_update(x, update, starts, ends, steps=None, axes=None): a copy of x with "
          "x[slices] = update (update broadcast to the slice, x's dtype), the slices as in slice",
          arity=None, min_inputs=4, version=version_of_first,
          attrs={"axes": Attr(_attr_slice_axes, None, doc=_SLICE_AXES_DOC)})


# ---------------------------------------------------------------- run-time shapes: 720-724
# Shapes known only at run time (PyTensor's Shape, ARange, Alloc, Reshape and Assert nodes of graphs with
# unknown batch sizes): the shape is a 1-D integer input, so the dims it sets are None in the result's type
# except where the other inputs' static types decide them.
def _shape_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    t = _one(in_types)
    return (TensorType("int64", (None if t.shape is None else len(t.shape),)),)


def _shape_kernel(x: np.ndarray, out: Any = None) -> np.ndarray:
    return write_out(np.array(np.shape(x), dtype=np.int64), out)


def _scalar_input(t: ValueType, what: str) -> TensorType:
    s = tensor(t, what)
    if s.dtype.kind not in "iuf":
        raise OpTypeError(f"{what} must be a real number, got {s.dtype}")
    if s.shape is not None and len(s.shape) != 0:
        raise OpTypeError(f"{what} must be 0-d, got shape {shape_str(s.shape)}")
    return s


def _arange_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    if len(in_types) != 3:
        raise OpTypeError(f"takes start, stop and step, got {len(in_types)} inputs")
    ts = [_scalar_input(t, w) for t, w in zip(in_types, ("start", "stop", "step"), strict=True)]
    dtype = np.dtype(attrs["dtype"]) if attrs["dtype"] is not None else np.result_type(*(t.dtype for t in ts))
    if dtype.kind not in "iuf":
        raise OpTypeError(f"arange gives real numbers, not {dtype}")
    return (TensorType(dtype, (None,)),)


def _arange_kernel(start: np.ndarray, stop: np.ndarray, step: np.ndarray, out: Any = None, *,
                   dtype: str | None) -> np.ndarray:
    if step == 0:
        raise ValueError("arange step cannot be zero")
    dt = dtype if dtype is not None else np.result_type(start, stop, step)
    return write_out(np.arange(start[()], stop[()], step[()], dtype=dt), out)


def _alloc_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x = tensor(in_types[0], "x")
    k = _int_vector_len(in_types[1], "shape", "dim")
    if k is None:
        return (x.with_shape(None),)
    if x.shape is not None and len(x.shape) > k:
        raise OpTypeError(f"cannot broadcast {shape_str(x.shape)} to a shape of lower rank {k}")
    dims: list[Dim] = [None] * k
    if x.shape is not None:  # a known dim other than 1 is what the target must have there
        for i, d in enumerate(x.shape):
            if d is not None and d != 1:
                dims[k - len(x.shape) + i] = d
    return (x.with_shape(tuple(dims)),)


def _alloc_kernel(x: np.ndarray, shape: np.ndarray, out: Any = None) -> np.ndarray:
    target = tuple(int(d) for d in np.asarray(shape).reshape(-1))
    if out is None:
        out = np.empty(target, dtype=x.dtype)
    out[...] = np.broadcast_to(x, target)
    return out


def _reshape_to_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x = tensor(in_types[0], "x")
    k = _int_vector_len(in_types[1], "shape", "dim")
    if k is None:
        return (x.with_shape(None),)
    if k == 1:  # one dim holds every element
        return (x.with_shape((num_elements(x.shape),)),)
    if k == 0 and num_elements(x.shape) not in (None, 1):
        raise OpTypeError(f"cannot reshape {shape_str(x.shape)} into shape ()")
    return (x.with_shape((None,) * k),)


def _reshape_to_kernel(x: np.ndarray, shape: np.ndarray, out: Any = None) -> np.ndarray:
    return write_out(np.reshape(x, tuple(int(d) for d in np.asarray(shape).reshape(-1))), out)


def _assert_all_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    for i, t in enumerate(in_types[1:]):
        tensor(t, f"condition {i}")
    return (tensor(in_types[0], "x"),)


def _assert_all_kernel(x: np.ndarray, *conds: np.ndarray, out: Any = None, message: str) -> np.ndarray:
    from opgraph.errors import ExecutionError

    for c in conds:
        if not np.all(c):
            raise ExecutionError(message or "assertion failed")
    # a copy, not x itself: the compiled runtime keeps a view op's result made once, so a view would skip
    # the check on later runs
    return write_out(x, out) if out is not None else np.array(x, copy=True)


def _g_arange(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # out[i] = start + i * step: d/dstart = 1, d/dstep = i; the length moves in jumps with stop (zero a.e.)
    g = cots[0]
    start, _, step = ins
    if g.type.dtype.kind != "f":
        return [None, None, None]
    n = b.op("getitem", b.op("shape", g), index=(0,))
    i = b.op("arange", b.constant(np.int64(0)), n, b.constant(np.int64(1)), dtype=g.type.dtype)

    def back(s: Any, v: Any) -> Any:
        if v.type.dtype.kind != "f":
            return None
        return s if s.type.dtype == v.type.dtype else b.op("cast", s, dtype=v.type.dtype)

    return [back(b.op("sum", g), start), None, back(b.op("sum", b.op("multiply", g, i)), step)]


def _g_alloc(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    if x.type.shape is None or None in x.type.shape:  # which axes were broadcast is only known at run time
        static_shape(x.type, "alloc gradient")
    return [unbroadcast(b, cots[0], x.type), None]


def _g_reshape_to(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return [b.op("reshape_to", cots[0], b.op("shape", ins[0])), None]


def _g_assert_all(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return [cots[0], *[None] * (len(ins) - 1)]


_SHAPE_GRADS.update({"shape": no_grad, "arange": _g_arange, "alloc": _g_alloc, "reshape_to": _g_reshape_to,
                     "assert_all": _g_assert_all})

_register("shape", 720, _shape_infer, _shape_kernel,
          "shape(x): x's run-time shape as a 1-D int64 tensor (NumPy's np.shape), one entry per dim")
_register("arange", 721, _arange_infer, _arange_kernel,
          "arange(start, stop, step, dtype=None): NumPy's arange with the bounds given at run time as 0-d "
          "tensors (a step of 0 is an error); dtype None is the inputs' promoted dtype; the length is unknown "
          "until run time",
          arity=3, attrs={"dtype": Attr(optional(attr_dtype), None, doc="result dtype; None: the inputs' one")})
_register("alloc", 722, _alloc_infer, _alloc_kernel,
          "alloc(x, shape): a fresh array of the run-time shape `shape` (a 1-D integer tensor) filled with x "
          "broadcast to it, as NumPy's broadcast_to(x, shape) copied (PyTensor's Alloc)",
          arity=2, version=version_of_first)
_register("reshape_to", 723, _reshape_to_infer, _reshape_to_kernel,
          "reshape_to(x, shape): NumPy's reshape to the run-time shape `shape` (a 1-D integer tensor; one "
          "entry may be -1)",
          arity=2, version=version_of_first)
_register("assert_all", 724, _assert_all_infer, _assert_all_kernel,
          "assert_all(x, *conds, message=''): a copy of x, after checking that every element of every "
          "condition is true; raises ExecutionError(message) otherwise (PyTensor's Assert / CheckAndRaise)",
          arity=None, min_inputs=1, version=version_of_first,
          attrs={"message": Attr(attr_str, "", doc="the error message when a condition is false")})


# ---------------------------------------------------------------- traits
VIEW_OPS: frozenset[str] = mark_traits(
    "view", "reshape", "permute_dims", "broadcast_to", "expand_dims", "squeeze", "split", "getitem", "flip",
    "moveaxis")
"""Ops whose NumPy kernel may return a view of (aliasing) its first input when called without ``out``
(``split`` returns views for every output)."""


mark_traits("linear_time", *family_kinds(FAMILY))
mark_traits("promotes", "concat", "copy", "stack")


# ---------------------------------------------------------------- tangent rules
# Every op here is linear in its floating inputs (indices, shapes and bounds are fixed), so its tangent is the
# op on the tangents: one op, where transposing the gradient rule costs several and, for the ops whose
# gradient reads a run-time shape (reshape_to, alloc, slice_update), cannot be formed.
def _jvp_arange(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    # out[i] = start + i * step (the length moves in jumps with stop: zero a.e.)
    out = outs[0]
    if out.type.dtype.kind != "f":
        return [None]
    n = b.op("getitem", b.op("shape", out), index=(0,))
    i = b.op("arange", b.constant(np.int64(0)), n, b.constant(np.int64(1)), dtype=out.type.dtype)
    t_start, _, t_step = tans
    return [add_all(b, [t_start, None if t_step is None else b.op("multiply", i, t_step)])]


set_rules("jvp", {
    **{k: linear(k) for k in ("reshape", "permute_dims", "broadcast_to", "expand_dims", "squeeze", "split",
                              "getitem", "take", "flip", "roll", "tile", "repeat", "moveaxis", "slice",
                              "alloc", "reshape_to")},
    "concat": linear("concat", None), "stack": linear("stack", None), "slice_update": linear("slice_update", (0, 1)),
    "pad": linear("pad", constant_value=0.0), "arange": _jvp_arange,
    # a copy's tangent (and a checked x's) is the tangent itself: no second copy, no second check
    **{k: lambda b, ins, outs, tans, attrs: [tans[0]] for k in ("copy", "assert_all")},
})


# ---------------------------------------------------------------- batching rules (vmap)
# Each rule gets the batched inputs with the batch axis in front and returns outputs with it in front: the
# per-example axes an attribute names move by one (opgraph.ops.batch_helpers).
def _b_x(ins: Sequence[Any]) -> tuple[Any, int]:
    return ins[0], bh.ndim(ins[0]) - 1


def _b_reshape(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    return [b.op("reshape", ins[0], shape=bh.batched_shape(size, attrs["shape"]))]


def _b_permute(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    x, r = _b_x(ins)
    axes = tuple(reversed(range(r))) if attrs["axes"] is None else tuple(int(a) % max(r, 1) for a in attrs["axes"])
    return [b.op("permute_dims", x, axes=(0, *(a + 1 for a in axes)))]


def _b_broadcast_to(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    shape = attrs["shape"]
    return [b.op("broadcast_to", bh.lift_rank(b, ins[0], len(shape)), shape=bh.batched_shape(size, shape))]


def _b_expand_dims(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    x, r = _b_x(ins)
    out_rank = r + len(attrs["axis"])
    return [b.op("expand_dims", x, axis=bh.batch_axes(attrs["axis"], out_rank))]


def _b_squeeze(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any] | None:
    x, r = _b_x(ins)
    if attrs["axis"] is None:
        shape = x.type.shape[1:]
        if any(d is None for d in shape):
            return None  # which axes are 1 is known per example only
        axes = tuple(i + 1 for i, d in enumerate(shape) if d == 1)
    else:
        axes = bh.batch_axes(attrs["axis"], r)
    return [b.op("squeeze", x, axis=axes) if axes else x]


def _b_concat(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    xs = bh.all_batched(b, ins, batched, size)
    if attrs["axis"] is None:  # every example flattened, then joined
        return [b.op("concat", *(b.op("reshape", x, shape=(int(size), -1)) for x in xs), axis=1)]
    return [b.op("concat", *xs, axis=bh.batch_axis(attrs["axis"], bh.ndim(xs[0]) - 1))]


def _b_stack(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    xs = bh.all_batched(b, ins, batched, size)
    return [b.op("stack", *xs, axis=bh.batch_axis(attrs["axis"], bh.ndim(xs[0])))]


def _b_split(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    x, r = _b_x(ins)
    res = b.op("split", x, sections=attrs["sections"], axis=bh.batch_axis(attrs["axis"], r))
    return list(res) if isinstance(res, tuple) else [res]


def _b_getitem(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    # a full slice in front keeps the batch axis; the user's entries (ellipsis included) then index each example
    return [b.op("getitem", ins[0], index=(("slice", None, None, None), *attrs["index"]))]


def _b_take(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any] | None:
    if batched[1]:
        if batched[0]:
            return None  # per-example indices into per-example arrays: the per-example fallback
        x, idx = ins  # one shared x: the batch axis of the indices comes out where the taken axis was
        if attrs["axis"] is None:
            return [b.op("take", x, idx, axis=None)]
        axis = normalize_axis(attrs["axis"], max(bh.ndim(x), 1))
        return [bh.move_axis(b, b.op("take", x, idx, axis=axis), axis, 0)]
    x, r = _b_x(ins)
    if attrs["axis"] is None or r == 0:
        return [b.op("take", b.op("reshape", x, shape=(int(size), -1)), ins[1], axis=1)]
    return [b.op("take", x, ins[1], axis=bh.batch_axis(attrs["axis"], r))]


def _b_pad(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    x, r = _b_x(ins)
    pw = tuple(attrs["pad_width"])
    if len(pw) == 1:
        pw = pw * r
    return [b.op("pad", x, pad_width=((0, 0), *pw), mode=attrs["mode"], constant_value=attrs["constant_value"])]


def _b_flip(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    x, r = _b_x(ins)
    return [b.op("flip", x, axis=bh.batch_axes(attrs["axis"], r))]


def _b_roll(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    x, r = _b_x(ins)
    if attrs["axis"] is None:  # rolls the flattened example
        flat = b.op("roll", b.op("reshape", x, shape=(int(size), -1)), shift=attrs["shift"], axis=(1,))
        return [b.op("reshape", flat, shape=bh.batched_shape(size, static_shape(x.type, "roll")[1:]))]
    return [b.op("roll", x, shift=attrs["shift"], axis=bh.batch_axes(attrs["axis"], r))]


def _b_tile(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    x, r = _b_x(ins)
    reps = tuple(attrs["reps"])
    k = max(r, len(reps))
    return [b.op("tile", bh.lift_rank(b, x, k), reps=(1,) * (k + 1 - len(reps)) + reps)]


def _b_repeat(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    x, r = _b_x(ins)
    if attrs["axis"] is None:
        return [b.op("repeat", b.op("reshape", x, shape=(int(size), -1)), repeats=attrs["repeats"], axis=1)]
    return [b.op("repeat", x, repeats=attrs["repeats"], axis=bh.batch_axis(attrs["axis"], r))]


def _b_moveaxis(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    x, r = _b_x(ins)
    return [b.op("moveaxis", x, source=bh.batch_axes(attrs["source"], r),
                 destination=bh.batch_axes(attrs["destination"], r))]


def _b_same(kind: str) -> Any:
    def rule(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
        return [b.op(kind, ins[0], **attrs)]

    return rule


def _b_slice_axes(attrs: dict[str, Any], starts: Any, r: int) -> tuple[int, ...] | None:
    """A slice's axes under vmap (None: the starts' count is not known, the fallback slices each example)."""
    if attrs["axes"] is not None:
        return bh.batch_axes(attrs["axes"], r)
    k = _int_vector_len(starts.type, "starts")
    return None if k is None else tuple(range(1, k + 1))


def _b_slice(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any] | None:
    if any(batched[1:]):
        return None  # per-example bounds give examples of different shapes
    x, r = _b_x(ins)
    axes = _b_slice_axes(attrs, ins[1], r)
    return None if axes is None else [b.op("slice", x, *ins[1:], axes=axes)]


def _b_slice_update(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any] | None:
    if any(batched[2:]):
        return None  # per-example bounds: the fallback updates each example
    r = bh.ndim(ins[0]) - (1 if batched[0] else 0)
    x = ins[0] if batched[0] else bh.broadcast_batch(b, ins[0], size)
    u = bh.lift_rank(b, ins[1], r) if batched[1] else ins[1]
    axes = _b_slice_axes(attrs, ins[2], r)
    return None if axes is None else [b.op("slice_update", x, u, *ins[2:], axes=axes)]


def _b_shape(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    per_example = b.op("getitem", b.op("shape", ins[0]), index=(("slice", 1, None, None),))
    return [bh.broadcast_batch(b, per_example, size)]


def _with_batch_dim(b: Any, shape: Any, size: int) -> Any:
    """A run-time shape vector with the batch size in front."""
    lead = b.constant(np.array([size], dtype=shape.type.dtype))
    return b.op("concat", lead, shape, axis=0)


def _b_alloc(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any] | None:
    if batched[1]:
        return None  # per-example shapes
    k = _int_vector_len(ins[1].type, "shape", "dim")
    if k is None:
        return None
    return [b.op("alloc", bh.lift_rank(b, ins[0], k), _with_batch_dim(b, ins[1], size))]


def _b_reshape_to(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any] | None:
    if batched[1]:
        return None  # per-example shapes
    return [b.op("reshape_to", ins[0], _with_batch_dim(b, ins[1], size))]


def _b_assert_all(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    # a condition holds for every example when it holds for the whole batch of them
    x = ins[0] if batched[0] else bh.broadcast_batch(b, ins[0], size)
    return [b.op("assert_all", x, *ins[1:], **attrs)]


BATCH_FALLBACK: dict[str, str] = {
    "arange": "per-example bounds give examples of different lengths: the per-example fallback (which needs "
              "equal lengths) or arange outside vmap",
}
"""Shape kinds that run once per example under ``vmap`` (the engine's fallback), and why."""

set_rules("batch", {
    "reshape": _b_reshape, "permute_dims": _b_permute, "broadcast_to": _b_broadcast_to,
    "expand_dims": _b_expand_dims, "squeeze": _b_squeeze, "concat": _b_concat, "stack": _b_stack, "split": _b_split,
    "getitem": _b_getitem, "take": _b_take, "pad": _b_pad, "flip": _b_flip, "roll": _b_roll, "tile": _b_tile,
    "repeat": _b_repeat, "moveaxis": _b_moveaxis, "copy": _b_same("copy"), "bitcast": _b_same("bitcast"),
    "slice": _b_slice, "slice_update": _b_slice_update, "shape": _b_shape, "alloc": _b_alloc,
    "reshape_to": _b_reshape_to, "assert_all": _b_assert_all,
})
