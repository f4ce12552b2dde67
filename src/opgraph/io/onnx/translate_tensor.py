"""ONNX -> opgraph translators: shapes, layout, slicing, gathering and scattering, constants.

Shape arguments (``Reshape``'s shape, ``Expand``'s shape) must be known
while importing; they usually are, since ``Shape`` of a value with a static
shape folds to a constant. Of a value with a symbolic dim (a dynamic batch
``N``), ``Shape`` is the ``shape`` op, and the arithmetic on it is followed
symbolically: a ``Reshape`` to ``[N, 8, 4]`` of an ``f32[?,32]`` becomes
``reshape(shape=(-1, 8, 4))``. A target with two sizes only the run knows
(``[N, T, 4, 8]``) becomes the ``reshape_to`` op (run on NumPy), an ``Expand``
along a symbolic size ``alloc``, a ``Range`` to one ``arange``. A ``Slice`` whose starts, ends or steps only the
run knows (a loop's iteration number) becomes the ``slice`` op, whose sliced
dims are unknown until then. Ops whose output shape depends on
their values (``NonZero``, ``Unique``, ``Compress``'s condition) fold to
constants when those values are known, and otherwise become the ``nonzero``
and ``unique`` ops, whose results have a dynamic dim (``Unique`` along an
axis, or in first-occurrence order, still needs its input known).

    >>> from opgraph.io.onnx._core import TRANSLATORS
    >>> ("", "Reshape") in TRANSLATORS and ("", "Slice") in TRANSLATORS
    True
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opgraph.core.graph import Value
from opgraph.core.types import TensorType
from opgraph.io.onnx._core import Node, translates


@translates("Constant")
def _constant(node: Node) -> Any:
    for key, dtype in (("value", None), ("sparse_value", None), ("value_float", np.float32),
                       ("value_floats", np.float32), ("value_int", np.int64), ("value_ints", np.int64)):
        if key in node.attrs:
            return node.const(np.asarray(node.attrs[key], dtype=dtype))
    if {"value_string", "value_strings"} & set(node.attrs):
        raise node.error("is a string constant (opgraph has no string dtype)")
    # an attribute reference (inside a function body) that the calling node does not set
    raise node.error("has no value attribute")


def _symbolic_shape(node: Node, x: Any) -> tuple[Any, ...]:
    """``x``'s shape, its run-time dims as symbols (:mod:`opgraph.io.onnx._symbolic`)."""
    node.rank(x)
    return node.imp.sym.shape_of(x)  # type: ignore[return-value]


@translates("Shape")
def _shape(node: Node, x: Any) -> Any:
    dims = node.dims(x)
    r = len(dims)
    start, end = node.attr("start", 0), node.attr("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    if None not in dims[start:end]:
        return node.const(np.asarray(dims[start:end], dtype=np.int64))
    # a run-time dim: the shape op, whose value is followed symbolically ([N, 1, 28, 28])
    full = node.op("shape", x)
    node.imp.sym.set_value(full, _symbolic_shape(node, x), (r,))
    return full if (start, end) == (0, r) else node.op("getitem", full, index=(slice(start, end),))


def _shape_value(node: Node, x: Any) -> Any:
    """``x``'s shape as a value: a constant when static, else the ``shape`` op with its symbolic value."""
    if None not in node.dims(x):
        return node.const(np.asarray(node.dims(x), dtype=np.int64))
    full = node.op("shape", x)
    node.imp.sym.set_value(full, _symbolic_shape(node, x), (node.rank(x),))
    return full


@translates("Size")
def _size(node: Node, x: Any) -> Any:
    if None not in node.dims(x):
        return node.const(np.int64(np.prod(node.dims(x), dtype=np.int64)))
    full = node.op("shape", x)
    node.imp.sym.set_value(full, _symbolic_shape(node, x), (node.rank(x),))
    return node.op("prod", full)


def _target(node: Node, index: int, what: str) -> list[Any]:
    """A shape input's entries: ints, and symbolic dims where its value is computed from run-time dims."""
    v = node.inputs[index]
    sym = node.imp.sym.values.get(v.id) if isinstance(v, Value) and node.known(v) is None else None
    if sym is not None:
        return [d if not isinstance(d, (int, np.integer)) else int(d) for d in sym.reshape(-1)]
    return list(node.static_ints(index, what))


def _resolve_target(node: Node, x: Any, target: list[Any], allowzero: bool) -> list[Any]:
    """ONNX's Reshape target made explicit: 0 copied from ``x`` (unless ``allowzero``), the -1 worked out when
    the other sizes determine it, symbols where only the run knows a size."""
    from opgraph.io.onnx._symbolic import SymDim, product, quotient

    src = _symbolic_shape(node, x)
    names = tuple(node.imp.sym.names)
    if not allowzero:
        if any(isinstance(d, int) and d == 0 for d in target[len(src):]):
            shown = "(" + ", ".join(str(d) for d in target) + ("," if len(target) == 1 else "") + ")"
            raise node.error(f"shape {shown}: a 0 (copy the input's dimension) past the "
                             f"input's rank {len(src)}")
        target = [src[i] if isinstance(d, int) and d == 0 else d for i, d in enumerate(target)]
    if -1 in target and any(isinstance(d, SymDim) for d in target):
        rest = product([d for d in target if not (isinstance(d, int) and d == -1)], names)
        size = quotient(product(list(src), names), rest, names)
        if size is not None and (isinstance(size, SymDim) or size >= 0):
            target = [size if isinstance(d, int) and d == -1 else d for d in target]
    return target


def _static_or_minus_one(target: list[Any]) -> tuple[int, ...] | None:
    """The target as opgraph's static ``reshape`` shape (one symbolic size or -1 becomes the -1), or None when two
    sizes are known only at run time."""
    from opgraph.io.onnx._symbolic import SymDim

    open_ = [i for i, d in enumerate(target) if isinstance(d, SymDim) or d == -1]
    if len(open_) > 1:
        return None
    return tuple(-1 if i in open_ else int(d) for i, d in enumerate(target))


def _run_time_reshape(node: Node, x: Any, shape: Any, target: list[Any], allowzero: bool) -> Any:
    """``reshape_to`` with the target computed at run time (ONNX's 0 entries copied from ``x``'s shape)."""
    r = node.rank(x)
    k = len(target)
    if not allowzero and k <= r and node.known(shape) is None:
        shape = node.cast(shape, np.int64)
        dims = node.op("getitem", node.op("shape", x), index=(slice(0, k),))
        shape = node.op("where", node.op("equal", shape, node.const(np.int64(0))), dims, shape)
    y = node.op("reshape_to", x, node.cast(shape, np.int64))
    node.imp.sym.shapes[y.id] = tuple(node.imp.sym.symbol(None) if isinstance(d, int) and d == -1 else d
                                      for d in target)
    return y


@translates("Reshape")
def _reshape(node: Node, x: Any, shape: Any = None) -> Any:
    allowzero = bool(node.attr("allowzero", 0))
    raw = _target(node, 1, "shape") if node.has_input(1) else list(node.attr("shape"))
    target = _resolve_target(node, x, raw, allowzero)
    static = _static_or_minus_one(target)
    if static is not None:
        return node.op("reshape", x, shape=static)
    if not node.has_input(1):
        raise node.error(f"shape {raw} has two sizes only the run knows")
    return _run_time_reshape(node, x, shape, target, allowzero)


@translates("Flatten")
def _flatten(node: Node, x: Any) -> Any:
    from opgraph.io.onnx._symbolic import product

    shape = _symbolic_shape(node, x)
    axis = node.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    target = [product(list(shape[:axis])), product(list(shape[axis:]))]
    static = _static_or_minus_one(target)
    if static is None:
        raise node.error(f"flattens {node.imp.sym.describe(shape)} at axis {axis}: both sides have sizes only the "
                         "run knows; fix them with input_shapes=")
    return node.op("reshape", x, shape=static)


@translates("Transpose")
def _transpose(node: Node, x: Any) -> Any:
    r = node.rank(x)
    perm = node.attr("perm", tuple(range(r))[::-1])
    return node.op("permute_dims", x, axes=node.axes(perm, r))


def _axes_arg(node: Node, index: int) -> tuple[int, ...]:
    return node.static_ints(index, "axes") if node.has_input(index) else tuple(node.attr("axes", ()))


@translates("Squeeze")
def _squeeze(node: Node, x: Any, axes: Any = None) -> Any:
    ax = _axes_arg(node, 1)
    if ax:
        shape = node.dims(x)
        ax = node.axes(ax, len(shape))
        for a in ax:
            if shape[a] not in (1, None):
                raise node.error(f"cannot squeeze axis {a} of size {shape[a]} (shape {x.type})")
        return node.op("squeeze", x, axis=ax) if ax else x
    shape = node.shape(x, why="Squeeze without axes removes the dims of size 1")
    ax = tuple(i for i, d in enumerate(shape) if d == 1)
    return node.op("reshape", x, shape=tuple(d for i, d in enumerate(shape) if i not in ax))


@translates("Unsqueeze")
def _unsqueeze(node: Node, x: Any, axes: Any = None) -> Any:
    shape: list[int | None] = list(node.dims(x))
    ax = _axes_arg(node, 1)
    out_rank = len(shape) + len(ax)
    for a in sorted(node.axes(ax, out_rank)):
        shape.insert(a, 1)
    if sum(d is None for d in shape) > 1:
        return node.op("expand_dims", x, axis=tuple(sorted(node.axes(ax, out_rank))))
    return node.op("reshape", x, shape=tuple(-1 if d is None else d for d in shape))


@translates("Concat")
def _concat(node: Node, *xs: Any) -> Any:
    xs = tuple(x for x in xs if x is not None)
    if not xs:
        raise node.error("has no inputs to concatenate")
    axis = node.axis(node.attr("axis"), node.rank(xs[0]))
    if len({node.rank(x) for x in xs}) > 1 or node.rank(xs[0]) == 0:
        raise node.error(f"inputs must have one rank of at least 1, they have shapes {[node.dims(x) for x in xs]}")
    xs = tuple(x for x in xs if node.dims(x)[axis] != 0) or xs[:1]
    return xs[0] if len(xs) == 1 else node.op("concat", *xs, axis=axis)


@translates("Split")
def _split(node: Node, x: Any, split: Any = None) -> Any:
    shape = node.dims(x)
    axis = node.axis(node.attr("axis", 0), len(shape))
    sizes = node.static_ints(1, "split") if node.has_input(1) else tuple(node.attr("split", ()))
    n_out = len(node.proto.output)
    if not sizes:
        parts = node.attr("num_outputs", n_out)
        shape = node.shape(x, (axis,), "the split axis is cut into equal parts")
        chunk = -(-shape[axis] // parts)
        sizes = tuple(min(chunk, shape[axis] - i * chunk) for i in range(parts))
    return _split_sizes(node, x, axis, sizes)


def _split_sizes(node: Node, x: Any, axis: int, sizes: tuple[int, ...]) -> tuple[Any, ...]:
    r = node.rank(x)
    outs, start = [], 0
    for s in sizes:
        index = tuple(slice(start, start + s) if i == axis else slice(None) for i in range(r))
        outs.append(node.op("getitem", x, index=index))
        start += s
    return tuple(outs)


@translates("Slice")
def _slice(node: Node, x: Any, starts: Any = None, ends: Any = None, axes: Any = None, steps: Any = None) -> Any:
    if node.has_input(1) and any(node.imp.static_value(v) is None for v in (starts, ends, steps) if v is not None):
        return _run_time_slice(node, x, starts, ends, steps)
    shape = node.dims(x)
    r = len(shape)
    if node.has_input(1):
        st, en = node.static_ints(1, "starts"), node.static_ints(2, "ends")
        ax, sp = node.static_ints(3, "axes"), node.static_ints(4, "steps")
    else:
        st, en, ax, sp = node.attr("starts"), node.attr("ends"), node.attr("axes", ()), ()
    ax = ax or tuple(range(len(st)))
    sp = sp or (1,) * len(st)
    if not len(st) == len(en) == len(ax) == len(sp):
        raise node.error(f"starts, ends, axes and steps have different lengths ({len(st)}, {len(en)}, {len(ax)}, "
                         f"{len(sp)})")
    if 0 in sp:
        raise node.error(f"a step is 0 (steps {sp})")
    index: list[Any] = [slice(None)] * r
    for s, e, a, step in zip(st, en, ax, sp, strict=True):
        a = node.axis(a, r)
        n = shape[a]
        if n is None:  # a run-time size: the bounds ONNX clamps are clamped by Python's slicing alike
            if step > 0 or (s < 0 and e < 0):
                index[a] = slice(_python_bound(s), _python_bound(e), step)
                continue
            n = node.shape(x, (a,), "a negative step's bounds are clamped to the axis size")[a]
        # clamp the way ONNX does (it clamps before NumPy would, so huge sentinels work)
        s = s + n if s < 0 else s
        e = e + n if e < 0 else e
        if step > 0:
            s, e = min(max(s, 0), n), min(max(e, 0), n)
        else:
            s, e = min(max(s, 0), n - 1), min(max(e, -1), n - 1)
        index[a] = slice(s, None if e < 0 else e, step)
    return node.op("getitem", x, index=tuple(index))


def _python_bound(b: int) -> int | None:
    """An ONNX slice bound as a Python one on an axis of unknown size (INT64_MAX-style sentinels: to the end)."""
    return None if b >= 2**62 else max(b, -(2**62))


def _run_time_slice(node: Node, x: Any, starts: Any, ends: Any, steps: Any) -> Any:
    """A Slice whose bounds only the run knows (an iteration number, a computed size): the ``slice`` op.

    ``slice`` clamps as Python does, which is ONNX's clamping except for one case: with a negative step a start
    below ``-n`` is the first element in ONNX but an empty slice in Python; clamping it to ``-n`` first (a no-op
    for positive steps, where both take 0) makes the two agree.
    """
    xt = x.type if isinstance(x, Value) else None
    if not isinstance(xt, TensorType) or xt.shape is None:
        raise node.error("needs a tensor input of known rank")
    r = len(xt.shape)
    k = starts.type.shape[0] if starts.type.shape and len(starts.type.shape) == 1 else None
    ax: tuple[int, ...] | None = None
    if node.has_input(3):
        ax = node.axes(node.static_ints(3, "axes"), r)
    elif k is not None:
        ax = tuple(range(k))
    args = [starts, ends] + ([steps] if steps is not None else [])
    known_steps = None if steps is None else node.imp.static_value(steps)
    if steps is not None and (known_steps is None or (np.asarray(known_steps) < 0).any()):
        dims = None if ax is None else [xt.shape[a] for a in ax]
        if dims is None or None in dims:
            raise node.error("has negative (or run-time) steps on axes of unknown size: ONNX's clamping of the "
                             "starts cannot be expressed without their sizes")
        low = node.const(np.asarray([-d for d in dims], dtype=node.dtype(starts)))
        args[0] = node.op("maximum", starts, low)
    return node.op("slice", x, *args, axes=ax)


@translates("Gather")
def _gather(node: Node, x: Any, idx: Any) -> Any:
    # take counts negative indices from the end, as ONNX does
    shape = node.dims(x)
    axis = node.axis(node.attr("axis", 0), len(shape))
    if shape[axis] is not None:
        _check_indices(node, node.known(idx), shape, axis)  # type: ignore[arg-type]
    return node.op("take", x, idx, axis=axis)


@translates("Expand")
def _expand(node: Node, x: Any, shape: Any) -> Any:
    if None in node.dims(x) or node.imp.static_value(shape) is None:
        return _symbolic_expand(node, x, shape)
    target = node.static_ints(1, "shape")
    if any(d < 0 for d in target):
        raise node.error(f"shape {target} has a negative dimension")
    try:
        out = tuple(np.broadcast_shapes(node.shape(x), target))
    except ValueError:
        raise node.error(f"cannot expand a value of shape {node.shape(x)} to shape {target}: they do not "
                         "broadcast") from None
    return node.op("broadcast_to", x, shape=out)


def _symbolic_expand(node: Node, x: Any, shape: Any) -> Any:
    """Expand where a size is symbolic: broadcasting against a constant of the static sizes when ``x`` already
    has every symbolic size of the result, else ``alloc`` to the run-time shape."""
    from opgraph.io.onnx._symbolic import SymDim

    src = _symbolic_shape(node, x)
    known = node.imp.static_value(shape) is not None or node.imp.sym.values.get(shape.id) is not None
    if not known:  # a shape no symbol describes (a Where on the batch size): broadcast at run time
        n = node.dims(shape)
        if len(n) != 1 or n[0] is None:
            raise node.error(f"shape (input 1) must be a vector of known length, it is {shape.type}")
        target: list[Any] = [node.imp.sym.symbol(None) for _ in range(n[0])]
    else:
        target = _target(node, 1, "shape")
    k = max(len(src), len(target))
    a = [1] * (k - len(src)) + list(src)
    t = [1] * (k - len(target)) + list(target)
    out, grow = [], False
    for d, w in zip(a, t, strict=True):
        if isinstance(w, int) and w == 1:
            out.append(d)
        elif d == w or (isinstance(d, int) and d != 1 and isinstance(w, SymDim)):
            out.append(d)
        elif isinstance(d, SymDim) and isinstance(w, SymDim):  # the larger of the two, which only the run knows
            out.append(node.imp.sym.symbol(None))
            grow = True
        elif isinstance(d, int) and d == 1:
            out.append(w)
            grow = grow or isinstance(w, SymDim)
        elif isinstance(d, SymDim) and isinstance(w, int):
            out.append(w)  # x's run-time size must be 1 there
            grow = True
        else:
            raise node.error(f"cannot expand {node.imp.sym.describe(src)} to {node.imp.sym.describe(target)}")
    if grow:  # ONNX's Expand broadcasts the two shapes: the larger of each pair (1 or equal) is the result's
        ones = node.const(np.ones(k - len(target), np.int64))
        want = node.op("concat", ones, node.cast(shape, np.int64), axis=0) if k > len(target) else \
            node.cast(shape, np.int64)
        have = node.op("concat", node.const(np.ones(k - len(src), np.int64)), _shape_value(node, x), axis=0) \
            if k > len(src) else _shape_value(node, x)
        y = node.op("alloc", x, node.op("maximum", want, have))
        node.imp.sym.shapes[y.id] = tuple(out)
        return y
    ones = tuple(1 if isinstance(d, SymDim) else int(d) for d in out)
    if len(a) != len(src):
        x = node.op("expand_dims", x, axis=tuple(range(k - len(src))))
    if all(o == 1 or o == d for o, d in zip(ones, a, strict=True)):
        return x
    return node.op("where", node.const(np.ones(ones, dtype=bool)), x, x)


@translates("Tile")
def _tile(node: Node, x: Any, repeats: Any) -> Any:
    return node.op("tile", x, reps=node.static_ints(1, "repeats"))


@translates("ConstantOfShape")
def _constant_of_shape(node: Node, shape: Any) -> Any:
    if node.known(shape) is None and node.imp.sym.values.get(getattr(shape, "id", -1)) is not None:
        value = np.asarray(node.attr("value", np.zeros(1, np.float32)))
        if value.size != 1:
            raise node.error(f"attribute 'value' must have one element, it has shape {value.shape}")
        y = node.op("alloc", node.const(value.reshape(())), node.cast(shape, np.int64))
        node.imp.sym.shapes[y.id] = tuple(_target(node, 0, "shape"))
        return y
    dims = node.static_ints(0, "shape")
    if any(d < 0 for d in dims):
        raise node.error(f"shape {dims} has a negative dimension")
    value = np.asarray(node.attr("value", np.zeros(1, np.float32)))
    if value.size != 1:
        raise node.error(f"attribute 'value' must have one element, it has shape {value.shape}")
    # through an op: a result too large to fold is left to run time instead of being allocated here
    return node.op("broadcast_to", node.const(value.reshape(())), shape=dims)


@translates("Range")
def _range(node: Node, start: Any, limit: Any, delta: Any) -> Any:
    # the bounds are scalars, but tolerate one-element vectors
    from opgraph.io.onnx._core import FOLD_LIMIT

    if any(node.imp.static_value(v) is None for v in (start, limit, delta)):
        return _run_time_range(node, start, limit, delta)
    bounds = [np.asarray(node.static(i)).reshape(-1) for i in range(3)]
    if any(b.size != 1 for b in bounds):
        raise node.error(f"start, limit and delta must be scalars, they have {[b.size for b in bounds]} elements")
    s, lim, d = (b[0] for b in bounds)
    dt = bounds[0].dtype
    if d == 0 or not np.isfinite(d) or not np.isfinite(s) or not np.isfinite(lim):
        raise node.error(f"start {s}, limit {lim} and delta {d} do not make a finite range")
    n = max(int(np.ceil((lim - s) / d)), 0)
    if n * dt.itemsize > FOLD_LIMIT:
        raise node.error(f"a range of {n} elements is more than opgraph computes while importing")
    return node.const((s + np.arange(n) * d).astype(dt))


def _run_time_range(node: Node, start: Any, limit: Any, delta: Any) -> Any:
    """A Range whose bounds only the run knows (``range(N)`` over a dynamic batch): the ``arange`` op, of the
    inputs' dtype; from 0 by 1 to a symbolic N its length is N."""
    from opgraph.io.onnx._symbolic import SymDim

    scalars = []
    for v in (start, limit, delta):
        if node.dims(v) not in ((), (1,)):
            raise node.error(f"start, limit and delta must be scalars, they have shapes "
                             f"{[node.dims(u) for u in (start, limit, delta)]}")
        scalars.append(node.op("reshape", v, shape=()) if node.dims(v) else v)
    y = node.op("arange", *scalars, dtype=node.dtype(start).name)
    first, step = node.known(start), node.known(delta)
    top = node.imp.sym.values.get(limit.id)
    if first is not None and step is not None and top is not None and int(np.asarray(first).reshape(-1)[0]) == 0 \
            and int(np.asarray(step).reshape(-1)[0]) == 1 and isinstance(top.reshape(-1)[0], SymDim):
        node.imp.sym.shapes[y.id] = (top.reshape(-1)[0],)
    return y


@translates("EyeLike")
def _eye_like(node: Node, x: Any) -> Any:
    from opgraph.io.onnx._core import FOLD_LIMIT, np_dtype

    shape = node.shape(x)
    if len(shape) != 2:
        raise node.error(f"input 0 must be 2-D, it has shape {shape}")
    dt = np_dtype(node.attr("dtype"), node.label) if "dtype" in node.attrs else node.dtype(x)
    if shape[0] * shape[1] * dt.itemsize > FOLD_LIMIT:
        raise node.error(f"an identity matrix of shape {shape} is more than opgraph computes while importing")
    return node.const(np.eye(shape[0], shape[1], k=node.attr("k", 0), dtype=dt))


@translates("Pad")
def _pad(node: Node, x: Any, pads: Any = None, value: Any = None, axes: Any = None) -> Any:
    r = node.rank(x)
    if node.has_input(1):
        p = node.static_ints(1, "pads")
        fill = float(np.asarray(node.static(2, "constant_value")).reshape(-1)[0]) if value is not None else 0.0
        ax = node.axes(node.static_ints(3, "axes"), r) or tuple(range(r))
    else:
        p, fill, ax = tuple(node.attr("pads")), float(node.attr("value", 0.0)), tuple(range(r))
    k = len(ax)
    if len(p) != 2 * k:
        raise node.error(f"pads {p} must have 2 entries per padded axis ({k} axes)")
    width = [(0, 0)] * r
    for i, a in enumerate(ax):
        width[a] = (p[i], p[i + k])
    mode = node.attr("mode", "constant")
    if any(lo < 0 or hi < 0 for lo, hi in width):
        # negative pads crop
        index = tuple(slice(-lo if lo < 0 else None, hi if hi < 0 else None) for lo, hi in width)
        x = node.op("getitem", x, index=index)
        width = [(max(lo, 0), max(hi, 0)) for lo, hi in width]
    return node.op("pad", x, pad_width=tuple(width), mode=mode, constant_value=fill)


# ---------------------------------------------------------------- gathering and scattering
def _check_indices(node: Node, known: np.ndarray | None, shape: tuple[int, ...], axis: int) -> None:
    """Known integer indices (input 1) into ``axis`` of the data (input 0) must be in ONNX's [-n, n - 1].

    ONNX makes an index out of range an error; a constant one is caught here, at import, rather than
    by a kernel when folding or at run time.
    """
    if known is None or known.dtype.kind not in "iu" or not known.size:
        return
    n = shape[axis] if shape else 1  # a scalar is taken from as a 1-element vector
    bad = known[(known < -n) | (known >= n)]
    if bad.size:
        allowed = f"out of range [{-n}, {n - 1}] for" if n else "but there is nothing to take from"
        raise node.error(f"indices (input 1) hold {int(bad.reshape(-1)[0])}, {allowed} axis {axis} of the "
                         f"data (input 0, shape {shape})")


def _check_nd_indices(node: Node, known: np.ndarray | None, shape: tuple[int, ...], batch_dims: int) -> None:
    """GatherND / ScatterND: column j of known indices (input 1) indexes axis batch_dims + j of the data."""
    if known is None or known.ndim == 0 or known.dtype.kind not in "iu":
        return  # the op's own type rule reports a malformed index tensor
    for j in range(known.shape[-1]):
        if batch_dims + j < len(shape):
            _check_indices(node, known[..., j], shape, batch_dims + j)


@translates("GatherElements")
def _gather_elements(node: Node, x: Any, idx: Any) -> Any:
    shape = node.shape(x)
    axis = node.axis(node.attr("axis", 0), len(shape))
    _check_indices(node, node.known(idx), shape, axis)
    return node.op("gather_elements", x, idx, axis=axis)


@translates("ScatterElements", "Scatter")
def _scatter_elements(node: Node, x: Any, idx: Any, updates: Any) -> Any:
    # Scatter is ScatterElements' deprecated name (opset 9-10); reduction came in opset 16
    shape = node.shape(x)
    axis = node.axis(node.attr("axis", 0), len(shape))
    _check_indices(node, node.known(idx), shape, axis)
    return node.op("scatter_elements", x, idx, updates, axis=axis, reduction=node.attr("reduction", "none"))


@translates("ScatterND")
def _scatter_nd(node: Node, x: Any, idx: Any, updates: Any) -> Any:
    _check_nd_indices(node, node.known(idx), node.shape(x), 0)
    return node.op("scatter_nd", x, idx, updates, reduction=node.attr("reduction", "none"))


@translates("GatherND")
def _gather_nd(node: Node, x: Any, idx: Any) -> Any:
    batch_dims = node.attr("batch_dims", 0)
    _check_nd_indices(node, node.known(idx), node.shape(x), batch_dims)
    return node.op("gather_nd", x, idx, batch_dims=batch_dims)


@translates("TopK")
def _topk(node: Node, x: Any, k: Any = None) -> Any:
    kk = node.static_ints(1, "k")[0] if node.has_input(1) else int(node.attr("k"))
    return node.op("topk", x, k=kk, axis=node.axis(node.attr("axis", -1), node.rank(x)),
                   largest=bool(node.attr("largest", 1)), sorted=bool(node.attr("sorted", 1)))


@translates("Trilu")
def _trilu(node: Node, x: Any, k: Any = None) -> Any:
    kk = node.static_ints(1, "k")
    return node.op("trilu", x, k=kk[0] if kk else 0, upper=bool(node.attr("upper", 1)))


@translates("OneHot")
def _one_hot(node: Node, indices: Any, depth: Any, values: Any) -> Any:
    depth_values = np.asarray(node.static(1, "depth (input 1)")).reshape(-1)
    if depth_values.size != 1:
        raise node.error(f"depth (input 1) must hold one value, it has {depth_values.size}")
    if depth_values.dtype.kind not in "biuf" or not np.isfinite(depth_values).all():
        raise node.error(f"depth (input 1) must be a finite number, it is {depth_values.dtype} "
                         f"{depth_values.tolist()}")
    d = int(depth_values[0])  # ONNX casts a non-integer depth to int64
    if d < 1:
        raise node.error(f"depth (input 1) is {d}, it must be at least 1")
    if math.prod(node.shape(values)) != 2:
        raise node.error(f"values (input 2) must hold 2 values [off, on], it has shape {node.shape(values)}")
    if node.dtype(indices).kind not in "iu":
        # ONNX allows float indices and truncates them toward zero
        indices = node.cast(indices, np.int64)
    return node.op("one_hot", indices, node.op("reshape", values, shape=(2,)), depth=int(d),
                   axis=node.attr("axis", -1))


@translates("ReverseSequence")
def _reverse_sequence(node: Node, x: Any, lengths: Any) -> Any:
    return node.op("reverse_sequence", x, lengths, batch_axis=node.attr("batch_axis", 1),
                   time_axis=node.attr("time_axis", 0))


def _nchw(node: Node, x: Any) -> tuple[int, int, int, int]:
    shape = node.shape(x)
    if len(shape) != 4:
        raise node.error(f"input 0 must be 4-D (N, C, H, W), it has shape {shape}")
    n, c, h, w = shape
    return n, c, h, w


def _blocksize(node: Node) -> int:
    b = node.attr("blocksize")
    if not isinstance(b, int) or b < 1:
        raise node.error(f"attribute blocksize must be a positive integer, got {b!r}")
    return b


@translates("DepthToSpace")
def _depth_to_space(node: Node, x: Any) -> Any:
    n, c, h, w = _nchw(node, x)
    b = _blocksize(node)
    if c % (b * b):
        raise node.error(f"input 0 has {c} channels, not a multiple of blocksize * blocksize ({b * b})")
    if node.attr("mode", "DCR") == "DCR":
        y = node.op("reshape", x, shape=(n, b, b, c // (b * b), h, w))
        y = node.op("permute_dims", y, axes=(0, 3, 4, 1, 5, 2))
    else:
        y = node.op("reshape", x, shape=(n, c // (b * b), b, b, h, w))
        y = node.op("permute_dims", y, axes=(0, 1, 4, 2, 5, 3))
    return node.op("reshape", y, shape=(n, c // (b * b), h * b, w * b))


@translates("SpaceToDepth")
def _space_to_depth(node: Node, x: Any) -> Any:
    n, c, h, w = _nchw(node, x)
    b = _blocksize(node)
    if h % b or w % b:
        raise node.error(f"input 0's height and width ({h}, {w}) must be multiples of blocksize ({b})")
    y = node.op("reshape", x, shape=(n, c, h // b, b, w // b, b))
    crd = node.attr("mode", "DCR") == "CRD"
    y = node.op("permute_dims", y, axes=(0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4))
    return node.op("reshape", y, shape=(n, c * b * b, h // b, w // b))


# ---------------------------------------------------------------- data-dependent shapes
# Known values fold to constants; values only the run knows become the nonzero / unique ops, whose result has a
# dynamic dim (Unique along an axis, or in first-occurrence order, still needs its input known).
@translates("Compress")
def _compress(node: Node, x: Any, condition: Any) -> Any:
    axis = node.attr("axis", None)
    if axis is None:
        x = node.op("reshape", x, shape=(-1,))
        axis = 0
    axis = node.axis(axis, x.type.rank)
    known = node.known(condition)
    if known is None:
        rows = node.op("nonzero", node.op("reshape", condition, shape=(-1,)))
        return node.op("take", x, node.op("getitem", rows, index=(0,)), axis=axis)
    cond = np.asarray(known).reshape(-1).astype(bool)
    if cond.size > node.shape(x)[axis]:
        raise node.error(f"condition has {cond.size} entries, axis {axis} only {node.shape(x)[axis]}")
    return node.op("take", x, node.const(np.flatnonzero(cond).astype(np.int64)), axis=axis)


@translates("NonZero")
def _nonzero(node: Node, x: Any) -> Any:
    known = node.known(x)
    if known is None:
        return node.op("nonzero", node.op("reshape", x, shape=(1,)) if x.type.rank == 0 else x)
    arr = np.asarray(known)
    return node.const(np.array(np.nonzero(arr if arr.ndim else arr.reshape(1)), dtype=np.int64).reshape(
        max(arr.ndim, 1), -1))


@translates("Unique")
def _unique(node: Node, x: Any) -> Any:
    axis = node.attr("axis", None)
    sorted_ = node.attr("sorted", 1)
    if node.known(x) is None and axis is None and sorted_:
        # ONNX's inverse indexes the flattened input; NaNs are one value, as np.unique (ONNX's reference) has them
        values, first, inverse, counts = node.op("unique", x, equal_nan=True)
        return values, first, node.op("reshape", inverse, shape=(-1,)), counts
    arr = np.asarray(node.static(0, "X"))
    if axis is not None:
        axis = node.axis(axis, arr.ndim)
    values, first, inverse, counts = np.unique(arr, return_index=True, return_inverse=True,
                                               return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not sorted_:
        # ONNX's unsorted order is the order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        values = np.take(values, order, axis=axis if axis is not None else 0)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return (node.const(values), node.const(first.astype(np.int64)), node.const(inverse.astype(np.int64)),
            node.const(counts.astype(np.int64)))


# ---------------------------------------------------------------- Col2Im
@translates("Col2Im")
def _col2im(node: Node, x: Any, image_shape: Any, block_shape: Any) -> Any:
    image = node.static_ints(1, "image_shape")
    block = node.static_ints(2, "block_shape")
    k = len(image)
    dil = tuple(node.attr("dilations", (1,) * k))
    strides = tuple(node.attr("strides", (1,) * k))
    pads = tuple(node.attr("pads", (0,) * (2 * k)))
    padded = tuple(image[i] + pads[i] + pads[i + k] for i in range(k))
    counts = tuple((padded[i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(k))
    n, ckb, length = node.shape(x)
    kb = int(np.prod(block, dtype=np.int64))
    if ckb % kb or length != int(np.prod(counts, dtype=np.int64)):
        raise node.error(f"input of shape {(n, ckb, length)} does not fit block {block} and image {image}")
    c = ckb // kb
    # Each (block offset, block position) pair adds into one pixel of the padded image: the targets
    # are known while importing, so the op is an adding scatter with constant indices.
    offs = np.stack(np.meshgrid(*[np.arange(b) for b in block], indexing="ij"), -1).reshape(kb, 1, k)
    locs = np.stack(np.meshgrid(*[np.arange(m) for m in counts], indexing="ij"), -1).reshape(1, length, k)
    pix = locs * np.asarray(strides) + offs * np.asarray(dil)
    flat = np.ravel_multi_index(tuple(pix.reshape(-1, k).T), padded).astype(np.int64).reshape(-1, 1)
    cols = node.op("permute_dims", node.op("reshape", x, shape=(n, c, kb * length)), axes=(2, 0, 1))
    size = int(np.prod(padded, dtype=np.int64))
    out = node.op("scatter_nd", node.const(np.zeros((size, n, c), dtype=node.dtype(x))), node.const(flat), cols,
                  reduction="add")
    out = node.op("reshape", node.op("permute_dims", out, axes=(1, 2, 0)), shape=(n, c, *padded))
    index = (slice(None), slice(None), *(slice(pads[i], pads[i] + image[i]) for i in range(k)))
    return node.op("getitem", out, index=index)


# ---------------------------------------------------------------- TensorScatter (KV-cache update)
@translates("TensorScatter")
def _tensor_scatter(node: Node, cache: Any, update: Any, write_indices: Any = None) -> Any:
    shape, ushape = node.shape(cache), node.shape(update)
    rank = len(shape)
    axis = node.axis(node.attr("axis", -2), rank)
    mode = node.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise node.error(f"mode must be 'linear' or 'circular', not {mode!r}")
    if axis == 0:
        raise node.error("axis 0 is the batch axis; the sequence axis must come after it")
    if len(ushape) != rank or any(u != c for i, (u, c) in enumerate(zip(ushape, shape, strict=True)) if i != axis) \
            or ushape[axis] > shape[axis]:
        raise node.error(f"update of shape {ushape} does not fit cache of shape {shape} along axis {axis}")
    if node.dtype(update) != node.dtype(cache):
        raise node.error(f"update has dtype {node.dtype(update)}, the cache {node.dtype(cache)}")
    # Element (b, ..., s, ...) of update goes to position write_indices[b] + s of the sequence axis:
    # the target index of every element, broadcast to update's shape, drives one scatter_elements.
    seq = np.arange(ushape[axis], dtype=np.int64).reshape((ushape[axis],) + (1,) * (rank - axis - 1))
    index = node.const(seq)
    if write_indices is not None:
        if node.shape(write_indices) != (shape[0],):
            raise node.error(f"write_indices has shape {node.shape(write_indices)}, expected ({shape[0]},)")
        known = node.known(write_indices)
        if known is not None and mode == "linear" and (
                (known < 0) | (known + ushape[axis] > shape[axis])).any():
            raise node.error(f"write_indices {known.tolist()} plus {ushape[axis]} updates run past the "
                             f"{shape[axis]} cache positions (mode 'linear')")
        start = node.op("reshape", node.cast(write_indices, np.int64), shape=(shape[0],) + (1,) * (rank - 1))
        index = node.op("add", start, index)
    if mode == "circular":
        index = node.op("remainder", index, node.const(shape[axis], np.int64))
    index = node.op("broadcast_to", index, shape=ushape)
    return node.op("scatter_elements", cache, index, update, axis=axis)
