"""Indexing family (ids 1100-1199): gathers and scatters along axes, top-k, one-hot, triangles.

The ops follow NumPy where NumPy has them and ONNX's operator of the same
job otherwise (they back an ONNX importer): ``gather_elements``
(GatherElements, ``np.take_along_axis``), ``scatter_elements``
(ScatterElements), ``gather_nd`` (GatherND), ``scatter_nd`` (ScatterND),
``topk`` (TopK), ``one_hot`` (OneHot), ``trilu`` (Trilu, ``np.triu`` /
``np.tril``) and ``reverse_sequence`` (ReverseSequence). Indices may have any
integer dtype; negative ones count from the end of their axis, and indices
out of range are an error when the graph runs. Ids 1100-1199, stable:
append, never renumber.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2, 3)), name="x")
    >>> values, indices = b.op("topk", x, k=2)
    >>> values.type, indices.type
    (f64[2,2], i64[2,2])
    >>> picked = b.op("gather_elements", x, indices, axis=1)
    >>> b.run({x: np.array([[1.0, 3.0, 2.0], [5.0, 4.0, 5.0]])}, [values, indices, picked])
    [array([[3., 2.],
           [5., 5.]]), array([[1, 2],
           [0, 2]]), array([[3., 2.],
           [5., 5.]])]
    >>> u = b.constant(np.ones((2, 2)))
    >>> s = b.op("scatter_elements", x, indices, u, axis=1, reduction="add")
    >>> b.run({x: np.zeros((2, 3))}, [s])[0]
    array([[0., 1., 1.],
           [1., 0., 1.]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from opgraph.core.dtypes import dtype_code
from opgraph.core.registry import (
    Attr,
    OpDef,
    attr_bool,
    attr_int,
    attr_str,
    family_kinds,
    mark_traits,
    register_op,
    set_rules,
)
from opgraph.core.types import Shape, TensorType, ValueType
from opgraph.errors import OpTypeError
from opgraph.ops._common import normalize_axis, num_elements, tensor, version_of_first, write_out
from opgraph.ops.batch_helpers import all_batched, batch_axis, broadcast_batch, example_ndim, move_axis
from opgraph.ops.grad_helpers import is_float, mask, no_grad, static_shape, zeros_like
from opgraph.ops.jvp_helpers import linear

FAMILY = "indexing"

Dim = int | None

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")
_REDUCE_UFUNCS: dict[str, np.ufunc] = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


# ---------------------------------------------------------------- attributes
def attr_reduction(v: Any) -> str:
    """Normalise a scatter ``reduction``: one of ``none``, ``add``, ``mul``, ``max``, ``min``.

    >>> attr_reduction("add")
    'add'
    """
    s = attr_str(v)
    if s not in SCATTER_REDUCTIONS:
        raise OpTypeError(f"reduction must be one of {', '.join(SCATTER_REDUCTIONS)}; got {s!r}")
    return s


def _attr_nonneg(v: Any) -> int:
    n = attr_int(v)
    if n < 0:
        raise OpTypeError(f"must be >= 0, got {n}")
    return n


# ---------------------------------------------------------------- type-rule helpers
def _int_indices(t: TensorType, what: str = "indices") -> None:
    if t.dtype.kind not in "iu":
        raise OpTypeError(f"{what} must have an integer dtype, got {t.dtype}")


def _rank(t: TensorType) -> int | None:
    return None if t.shape is None else len(t.shape)


def _same_rank(what: str, *ts: tuple[str, TensorType]) -> int | None:
    """The common rank of several tensors (None if no rank is known); raises if known ranks differ."""
    known = [(n, len(t.shape)) for n, t in ts if t.shape is not None]
    if len({r for _, r in known}) > 1:
        shown = ", ".join(f"{n} has rank {r}" for n, r in known)
        raise OpTypeError(f"{what}: {shown}")
    return known[0][1] if known else None


def _merge(a: Dim, b: Dim, what: str) -> Dim:
    if a is not None and b is not None and a != b:
        raise OpTypeError(f"{what}: {a} != {b}")
    return a if a is not None else b


def _check_not_larger(idx: Shape, x: Shape, axis: int, what: str) -> None:
    """Indices may be smaller than x along the other axes (ONNX, torch.gather), never larger."""
    if idx is None or x is None:
        return
    for d, (i, n) in enumerate(zip(idx, x, strict=True)):
        if d != axis and i is not None and n is not None and i > n:
            raise OpTypeError(f"{what} has size {i} along axis {d}, larger than x's {n}")




# ---------------------------------------------------------------- kernel helpers
def _wrap(indices: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Indices into an axis of size ``n`` as non-negative intp; IndexError names the first bad one."""
    idx = np.asarray(indices)
    bad = (idx >= n) if idx.dtype.kind == "u" else ((idx < -n) | (idx >= n))
    if bad.any():
        raise IndexError(f"index {idx[bad].flat[0]} is out of bounds for axis {axis} with size {n}")
    idx = idx.astype(np.intp)  # after the range check, so large unsigned values cannot wrap around
    return np.where(idx < 0, idx + n, idx)


def _check_index_shape(idx: Sequence[int], x: Sequence[int], axis: int, what: str) -> None:
    if len(idx) != len(x):
        raise ValueError(f"{what} has rank {len(idx)}, x has rank {len(x)}")
    for d, (i, n) in enumerate(zip(idx, x, strict=True)):
        if d != axis and i > n:
            raise ValueError(f"{what} has size {i} along axis {d}, larger than x's {n}")


def _scatter_into(out: np.ndarray, key: tuple[np.ndarray, ...], updates: np.ndarray, reduction: str) -> None:
    """``out[key] (reduction)= updates``; the index arrays of ``key`` broadcast to updates' leading shape."""
    if updates.size == 0:
        return
    if reduction != "none":
        _REDUCE_UFUNCS[reduction].at(out, key, updates)
        return
    # NumPy does not promise which of several writes to one element wins; keep only the last
    # write of each element so "none" with duplicate indices is deterministic (last wins, as ONNX
    # Runtime and torch on CPU do).
    lead = np.broadcast_shapes(*(k.shape for k in key))
    flat = [np.broadcast_to(k, lead).ravel() for k in key]
    lin = np.ravel_multi_index(flat, out.shape[:len(key)])
    _, first_in_reversed = np.unique(lin[::-1], return_index=True)
    keep = lin.size - 1 - first_in_reversed
    upd = updates.reshape(-1, *updates.shape[len(lead):])
    out[tuple(f[keep] for f in flat)] = upd[keep]


def _start(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return np.array(x, copy=True)
    np.copyto(out, x, casting="unsafe")
    return out


def _register(name: str, id: int, infer: Any, kernel: Any, doc: str, *, arity: int,
              attrs: dict[str, Attr] | None = None, version: Any = None, grad: Any = None,
              inplace: tuple[int, ...] = ()) -> OpDef:
    kernel.__name__ = f"{name}_numpy"
    extra = {} if version is None else {"version": version}
    return register_op(OpDef(
        name=name, id=id, arity=arity, infer=infer, attrs=attrs or {}, kernel=kernel,
        family=FAMILY, doc=doc, grad=grad, inplace=inplace, **extra,
    ))


# ---------------------------------------------------------------- gradient rules
# rule(b, inputs, outputs, cotangents, attrs) -> cotangents of the inputs (see opgraph.ops.grad_helpers).
# Gathers send the cotangent back with an adding scatter (repeated indices accumulate); scatters
# gather it; integer inputs (indices, lengths) get none.
def _g_gather_elements(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x, idx = ins
    return [b.op("scatter_elements", zeros_like(b, x), idx, cots[0], axis=attrs["axis"], reduction="add"), None]


def _winners(b: Any, kind: str, gather: str, x: Any, idx: Any, u: Any, attrs: dict[str, Any]) -> Any:
    """Bool mask over ``u``: True where that update is the one kept by a ``none`` scatter (the last)."""
    ushape = static_shape(u.type, f"{kind} gradient")
    xshape = static_shape(x.type, f"{kind} gradient")
    ids = b.constant(np.arange(int(np.prod(ushape, dtype=np.int64)), dtype=np.int64).reshape(ushape))
    owner = b.op(kind, b.constant(np.full(xshape, -1, dtype=np.int64)), idx, ids, **attrs)
    gattrs = {"axis": attrs["axis"]} if "axis" in attrs else {}
    return b.op("equal", b.op(gather, owner, idx, **gattrs), ids)


def _scatter_grad(kind: str, gather: str) -> Any:
    def rule(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
        x, idx, u = ins
        g = cots[0]
        red = attrs["reduction"]
        gattrs = {"axis": attrs["axis"]} if "axis" in attrs else {}
        if red == "add":
            return [g, None, b.op(gather, g, idx, **gattrs)]
        if red != "none":
            raise NotImplementedError(f"{kind} gradient: reduction {red!r} is not supported (only 'none', 'add')")
        # Overwritten elements of x get no gradient; of duplicate updates only the kept (last) one does.
        gx = b.op(kind, g, idx, zeros_like(b, u), **attrs)
        gu = mask(b, _winners(b, kind, gather, x, idx, u, attrs), b.op(gather, g, idx, **gattrs))
        return [gx, None, gu]

    return rule


def _g_gather_nd(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    if attrs["batch_dims"]:
        raise NotImplementedError("gather_nd gradient: only batch_dims=0 is supported")
    x, idx = ins
    return [b.op("scatter_nd", zeros_like(b, x), idx, cots[0], reduction="add"), None]


def _g_selected(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # topk and sort: the values are x gathered at the indices (output 1) along axis
    g = cots[0]
    if g is None:
        return [None]
    return [b.op("scatter_elements", zeros_like(b, ins[0]), outs[1], g, axis=attrs["axis"], reduction="add")]


def _g_one_hot(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    idx, values = ins
    g = cots[0]
    if not is_float(values.type):
        return [None, None]
    on_mask = b.op("one_hot", idx, b.constant(np.array([0, 1], dtype=values.type.dtype)), **attrs)
    g_on = b.op("sum", b.op("multiply", g, on_mask))
    g_off = b.op("subtract", b.op("sum", g), g_on)
    return [None, b.op("stack", g_off, g_on)]


def _g_trilu(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return [b.op("trilu", cots[0], **attrs)]


def _g_reverse_sequence(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # Reversing the same prefixes again is the inverse permutation.
    return [b.op("reverse_sequence", cots[0], ins[1], **attrs), None]


# ---------------------------------------------------------------- gather_elements 1100
def _gather_elements_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x, idx = tensor(in_types[0], "x"), tensor(in_types[1], "indices")
    _int_indices(idx)
    r = _same_rank("indices must have x's rank", ("x", x), ("indices", idx))
    if r is None:
        return (x.with_shape(None),)
    if r == 0:
        raise OpTypeError("x must have rank >= 1")
    ax = normalize_axis(attrs["axis"], r)
    _check_not_larger(idx.shape, x.shape, ax, "indices")
    shape = idx.shape if idx.shape is not None else (None,) * r
    if x.shape is not None and x.shape[ax] == 0 and (num_elements(shape) or 0) > 0:
        raise OpTypeError(f"cannot gather from the empty axis {ax}")
    return (x.with_shape(shape),)


def _gather_elements_kernel(x: np.ndarray, indices: np.ndarray, out: Any = None, *, axis: int) -> np.ndarray:
    ax = axis % x.ndim
    _check_index_shape(indices.shape, x.shape, ax, "indices")
    idx = _wrap(indices, x.shape[ax], ax)
    # take_along_axis wants equal (broadcastable) shapes; ONNX lets indices be smaller off the axis.
    xs = x[tuple(slice(None) if d == ax else slice(0, n) for d, n in enumerate(idx.shape))]
    return write_out(np.take_along_axis(xs, idx, axis=ax), out)


_register("gather_elements", 1100, _gather_elements_infer, _gather_elements_kernel,
          "gather_elements(x, indices, axis=0): ONNX GatherElements / np.take_along_axis: "
          "out[i][j] = x[indices[i][j]][j] (axis=0); indices have x's rank, may be smaller off the axis, "
          "and the output has their shape and x's dtype",
          arity=2, version=version_of_first, grad=_g_gather_elements,
          attrs={"axis": Attr(attr_int, 0, doc="axis to gather along")})


# ---------------------------------------------------------------- scatter_elements 1101
def _updates_dtype(x: TensorType, u: TensorType) -> None:
    if u.dtype != x.dtype:
        raise OpTypeError(f"updates have dtype {u.dtype}, x has {x.dtype} (they must be equal)")


def _check_reduction(x: TensorType, reduction: str) -> None:
    if x.dtype.kind == "c" and reduction in ("max", "min"):
        # NumPy would order complex numbers lexicographically, which ONNX does not define
        raise OpTypeError(f"reduction {reduction!r} is not defined for complex values ({x.dtype})")


def _scatter_elements_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x, idx, u = tensor(in_types[0], "x"), tensor(in_types[1], "indices"), tensor(in_types[2], "updates")
    _int_indices(idx)
    _check_reduction(x, attrs["reduction"])
    _updates_dtype(x, u)
    r = _same_rank("x, indices and updates must have one rank", ("x", x), ("indices", idx), ("updates", u))
    if r is None:
        return (x,)
    if r == 0:
        raise OpTypeError("x must have rank >= 1")
    ax = normalize_axis(attrs["axis"], r)
    ishape = idx.shape if idx.shape is not None else u.shape
    if idx.shape is not None and u.shape is not None:
        ishape = tuple(_merge(a, c, f"indices and updates differ along axis {d}")
                       for d, (a, c) in enumerate(zip(idx.shape, u.shape, strict=True)))
    _check_not_larger(ishape, x.shape, ax, "indices")
    if x.shape is not None and x.shape[ax] == 0 and (num_elements(ishape) or 0) > 0:
        raise OpTypeError(f"cannot scatter into the empty axis {ax}")
    return (x,)


def _scatter_elements_kernel(x: np.ndarray, indices: np.ndarray, updates: np.ndarray, out: Any = None, *,
                             axis: int, reduction: str) -> np.ndarray:
    ax = axis % x.ndim
    if indices.shape != updates.shape:
        raise ValueError(f"indices have shape {indices.shape}, updates {updates.shape} (they must be equal)")
    _check_index_shape(indices.shape, x.shape, ax, "indices")
    idx = _wrap(indices, x.shape[ax], ax)
    key = list(np.indices(idx.shape, sparse=True))
    key[ax] = idx
    res = _start(x, out)
    _scatter_into(res, tuple(key), updates, reduction)
    return res


_register("scatter_elements", 1101, _scatter_elements_infer, _scatter_elements_kernel,
          "scatter_elements(x, indices, updates, axis=0, reduction='none'): ONNX ScatterElements: a copy of x "
          "with out[indices[i][j]][j] = updates[i][j] (axis=0), or combined with it by reduction "
          "add/mul/max/min; indices and updates have one shape and x's rank; with 'none' the last of "
          "duplicate indices wins",
          arity=3, version=version_of_first, grad=_scatter_grad("scatter_elements", "gather_elements"),
          inplace=(0,),
          attrs={"axis": Attr(attr_int, 0, doc="axis to scatter along"),
                 "reduction": Attr(attr_reduction, "none", doc="none, add, mul, max or min")})


# ---------------------------------------------------------------- gather_nd 1102
def _gather_nd_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x, idx = tensor(in_types[0], "x"), tensor(in_types[1], "indices")
    _int_indices(idx)
    bd: int = attrs["batch_dims"]
    r, q = _rank(x), _rank(idx)
    if r is not None and r < 1:
        raise OpTypeError("x must have rank >= 1")
    if q is not None and q < 1:
        raise OpTypeError("indices must have rank >= 1")
    if bd and ((r is not None and bd >= r) or (q is not None and bd >= q)):
        raise OpTypeError(f"batch_dims={bd} must be less than the ranks of x ({r}) and indices ({q})")
    if x.shape is not None and idx.shape is not None:
        for d in range(bd):
            _merge(x.shape[d], idx.shape[d], f"batch dim {d} of x and indices differ")
    m = None if idx.shape is None else idx.shape[-1]
    if m is not None and r is not None and m > r - bd:
        raise OpTypeError(f"indices.shape[-1]={m} is larger than x's rank {r} minus batch_dims {bd}")
    if idx.shape is None or m is None or x.shape is None:
        return (x.with_shape(None),)
    # Batch dims: whichever of x and indices knows the size.
    lead = tuple(_merge(idx.shape[d], x.shape[d], "") if d < bd else idx.shape[d] for d in range(q - 1))
    shape = lead + x.shape[bd + m:]
    if any(x.shape[bd + j] == 0 for j in range(m)) and (num_elements(idx.shape[:-1]) or 0) > 0:
        raise OpTypeError("cannot gather from an empty axis")
    return (x.with_shape(shape),)


def _gather_nd_kernel(x: np.ndarray, indices: np.ndarray, out: Any = None, *, batch_dims: int) -> np.ndarray:
    bd = batch_dims
    m = indices.shape[-1]
    if indices.shape[:bd] != x.shape[:bd]:
        raise ValueError(f"batch dims of indices {indices.shape[:bd]} and x {x.shape[:bd]} differ")
    if m > x.ndim - bd:
        raise ValueError(f"indices.shape[-1]={m} is larger than x's rank {x.ndim} minus batch_dims {bd}")
    nb = int(np.prod(x.shape[:bd], dtype=np.int64))
    n = int(np.prod(indices.shape[bd:-1], dtype=np.int64))
    xr = x.reshape(nb, *x.shape[bd:])
    ir = indices.reshape(nb, n, m)
    cols = [_wrap(ir[..., j], x.shape[bd + j], bd + j) for j in range(m)]
    rows = np.broadcast_to(np.arange(nb)[:, None], (nb, n))
    res = xr[(rows, *cols)]
    return write_out(res.reshape(indices.shape[:-1] + x.shape[bd + m:]), out)


_register("gather_nd", 1102, _gather_nd_infer, _gather_nd_kernel,
          "gather_nd(x, indices, batch_dims=0): ONNX GatherND: each row indices[..., :] (length m) picks "
          "x[batch..., i0, ..., i(m-1)]; output shape indices.shape[:-1] + x.shape[batch_dims + m:]",
          arity=2, version=version_of_first, grad=_g_gather_nd,
          attrs={"batch_dims": Attr(_attr_nonneg, 0, doc="number of leading batch dims shared by x and indices")})


# ---------------------------------------------------------------- scatter_nd 1103
def _scatter_nd_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x, idx, u = tensor(in_types[0], "x"), tensor(in_types[1], "indices"), tensor(in_types[2], "updates")
    _check_reduction(x, attrs["reduction"])
    _int_indices(idx)
    _updates_dtype(x, u)
    r, q = _rank(x), _rank(idx)
    if r is not None and r < 1:
        raise OpTypeError("x must have rank >= 1")
    if q is not None and q < 1:
        raise OpTypeError("indices must have rank >= 1")
    k = None if idx.shape is None else idx.shape[-1]
    if k is not None and r is not None and k > r:
        raise OpTypeError(f"indices.shape[-1]={k} is larger than x's rank {r}")
    if idx.shape is not None and k is not None and x.shape is not None:
        want = idx.shape[:-1] + x.shape[k:]
        if u.shape is not None:
            if len(u.shape) != len(want):
                raise OpTypeError(f"updates have rank {len(u.shape)}, expected {len(want)} "
                                  "(indices.shape[:-1] + x.shape[indices.shape[-1]:])")
            for d, (a, c) in enumerate(zip(u.shape, want, strict=True)):
                _merge(a, c, f"updates have the wrong size along axis {d}")
        if any(x.shape[j] == 0 for j in range(k)) and (num_elements(idx.shape[:-1]) or 0) > 0:
            raise OpTypeError("cannot scatter into an empty axis")
    return (x,)


def _scatter_nd_kernel(x: np.ndarray, indices: np.ndarray, updates: np.ndarray, out: Any = None, *,
                       reduction: str) -> np.ndarray:
    k = indices.shape[-1]
    if k > x.ndim:
        raise ValueError(f"indices.shape[-1]={k} is larger than x's rank {x.ndim}")
    want = indices.shape[:-1] + x.shape[k:]
    if updates.shape != want:
        raise ValueError(f"updates have shape {updates.shape}, expected {want}")
    key = tuple(_wrap(indices[..., j], x.shape[j], j) for j in range(k))
    res = _start(x, out)
    if k == 0:
        # Each update covers all of x: index a new leading axis of size 1 instead.
        _scatter_into(res[None], (np.zeros(indices.shape[:-1], dtype=np.intp),), updates, reduction)
    else:
        _scatter_into(res, key, updates, reduction)
    return res


_register("scatter_nd", 1103, _scatter_nd_infer, _scatter_nd_kernel,
          "scatter_nd(x, indices, updates, reduction='none'): ONNX ScatterND: a copy of x with the slice "
          "x[indices[..., :]] set to (or combined by add/mul/max/min with) updates, whose shape is "
          "indices.shape[:-1] + x.shape[indices.shape[-1]:]; with 'none' the last of duplicate indices wins",
          arity=3, version=version_of_first, grad=_scatter_grad("scatter_nd", "gather_nd"), inplace=(0,),
          attrs={"reduction": Attr(attr_reduction, "none", doc="none, add, mul, max or min")})


def _stable_order(x: np.ndarray, ax: int, *, descending: bool) -> np.ndarray:
    """int64 positions ordering ``x`` along ``ax``, equal values in index order (NaN largest), either direction."""
    if not descending:
        return np.argsort(x, axis=ax, kind="stable").astype(np.int64, copy=False)
    # a stable ascending sort of the reversed axis, read backwards: ties stay in index order
    flipped = np.argsort(np.flip(x, axis=ax), axis=ax, kind="stable")
    return ((x.shape[ax] - 1) - np.flip(flipped, axis=ax)).astype(np.int64, copy=False)


# ---------------------------------------------------------------- topk 1104
def _topk_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x = tensor(in_types[0], "x")
    if x.dtype.kind == "c":
        raise OpTypeError(f"complex values have no order, got {x.dtype}")
    k: int = attrs["k"]
    if x.shape is None:
        return (x.with_shape(None), TensorType("int64", None))
    if not x.shape:
        raise OpTypeError("x must have rank >= 1")
    ax = normalize_axis(attrs["axis"], len(x.shape))
    n = x.shape[ax]
    if n is not None and k > n:
        raise OpTypeError(f"k={k} is larger than axis {ax} (size {n})")
    shape = (*x.shape[:ax], k, *x.shape[ax + 1:])
    return (x.with_shape(shape), TensorType("int64", shape))


def _topk_kernel(x: np.ndarray, out: Any = None, *, k: int, axis: int, largest: bool,
                 sorted: bool) -> tuple[np.ndarray, np.ndarray]:
    ax = axis % x.ndim
    n = x.shape[ax]
    if k > n:
        raise ValueError(f"k={k} is larger than axis {ax} (size {n})")
    idx = np.take(_stable_order(x, ax, descending=largest), np.arange(k), axis=ax)
    vals = np.take_along_axis(x, idx, axis=ax)
    return write_out((vals, idx), out)


_register("topk", 1104, _topk_infer, _topk_kernel,
          "topk(x, k, axis=-1, largest=True, sorted=True) -> (values, int64 indices): ONNX TopK: the k largest "
          "(or smallest) entries along axis, in order, ties broken by the lower index; NaN counts as largest; "
          "sorted=False is accepted and gives the same (sorted) result",
          arity=1, grad=_g_selected,
          attrs={"k": Attr(_attr_nonneg, doc="how many entries to keep"),
                 "axis": Attr(attr_int, -1, doc="axis to select along"),
                 "largest": Attr(attr_bool, True, doc="True: the largest, False: the smallest"),
                 "sorted": Attr(attr_bool, True, doc="ONNX's flag; results are always sorted")})


# ---------------------------------------------------------------- one_hot 1105
def _one_hot_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    idx, values = tensor(in_types[0], "indices"), tensor(in_types[1], "values")
    _int_indices(idx)
    if values.shape is not None and (len(values.shape) != 1 or values.shape[0] not in (None, 2)):
        raise OpTypeError(f"values must be [off_value, on_value] of shape (2,), got shape {values.shape}")
    depth: int = attrs["depth"]
    if idx.shape is None:
        return (TensorType(values.dtype, None),)
    ax = normalize_axis(attrs["axis"], len(idx.shape) + 1)
    return (TensorType(values.dtype, (*idx.shape[:ax], depth, *idx.shape[ax:])),)


def _one_hot_version(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> int:
    return dtype_code(tensor(in_types[1]).dtype)


def _one_hot_kernel(indices: np.ndarray, values: np.ndarray, out: Any = None, *, depth: int,
                    axis: int) -> np.ndarray:
    if values.shape != (2,):
        raise ValueError(f"values must be [off_value, on_value] of shape (2,), got shape {values.shape}")
    ax = axis % (indices.ndim + 1)
    idx = np.asarray(indices)
    if idx.dtype.kind == "i":
        idx = idx.astype(np.int64)
        idx = np.where(idx < 0, idx + depth, idx)
    # Out-of-range indices match no position of the arange, so their rows stay all off.
    hot = np.expand_dims(idx, ax) == np.arange(depth).reshape((depth,) + (1,) * (idx.ndim - ax))
    res = out if out is not None else np.empty(hot.shape, dtype=values.dtype)
    np.copyto(res, values[0], casting="unsafe")
    np.copyto(res, values[1], casting="unsafe", where=hot)
    return res


_register("one_hot", 1105, _one_hot_infer, _one_hot_kernel,
          "one_hot(indices, values, depth, axis=-1): ONNX OneHot: values = [off, on] (the output's dtype); "
          "a new axis of size depth is on at each index; negative indices count from depth, indices "
          "outside [-depth, depth) give rows that are all off",
          arity=2, version=_one_hot_version, grad=_g_one_hot,
          attrs={"depth": Attr(_attr_nonneg, doc="size of the new axis"),
                 "axis": Attr(attr_int, -1, doc="position of the new axis in the output")})


# ---------------------------------------------------------------- trilu 1106
def _trilu_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x = tensor(in_types[0], "x")
    if x.shape is not None and len(x.shape) < 2:
        raise OpTypeError(f"x must have rank >= 2 (a matrix or a batch of them), got rank {len(x.shape)}")
    return (x,)


def _trilu_kernel(x: np.ndarray, out: Any = None, *, k: int, upper: bool) -> np.ndarray:
    if x.ndim < 2:
        raise ValueError(f"x must have rank >= 2, got rank {x.ndim}")
    return write_out(np.triu(x, k) if upper else np.tril(x, k), out)


_register("trilu", 1106, _trilu_infer, _trilu_kernel,
          "trilu(x, k=0, upper=True): ONNX Trilu: np.triu(x, k) (upper) or np.tril(x, k) on the last two "
          "dims; the other entries are zero",
          arity=1, grad=_g_trilu,
          attrs={"k": Attr(attr_int, 0, doc="diagonal offset: 0 main, > 0 above, < 0 below"),
                 "upper": Attr(attr_bool, True, doc="True keeps the upper triangle, False the lower")})


# ---------------------------------------------------------------- reverse_sequence 1107
def _reverse_sequence_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x, lengths = tensor(in_types[0], "x"), tensor(in_types[1], "lengths")
    _int_indices(lengths, "lengths")
    if lengths.shape is not None and len(lengths.shape) != 1:
        raise OpTypeError(f"lengths must have rank 1 (one length per batch entry), got rank {len(lengths.shape)}")
    if x.shape is None:
        return (x,)
    r = len(x.shape)
    if r < 2:
        raise OpTypeError(f"x must have rank >= 2 (a batch and a time axis), got rank {r}")
    ba, ta = normalize_axis(attrs["batch_axis"], r), normalize_axis(attrs["time_axis"], r)
    if ba == ta:
        raise OpTypeError(f"batch_axis and time_axis are the same axis ({ba})")
    if lengths.shape is not None:
        _merge(lengths.shape[0], x.shape[ba], "lengths must have one entry per batch entry")
    return (x,)


def _reverse_sequence_kernel(x: np.ndarray, lengths: np.ndarray, out: Any = None, *, batch_axis: int,
                             time_axis: int) -> np.ndarray:
    ba, ta = batch_axis % x.ndim, time_axis % x.ndim
    nb, nt = x.shape[ba], x.shape[ta]
    if lengths.shape != (nb,):
        raise ValueError(f"lengths have shape {lengths.shape}, expected ({nb},)")
    lens = lengths.astype(np.int64)
    if ((lens < 0) | (lens > nt)).any():
        raise ValueError(f"lengths must be in [0, {nt}] (the time axis' size), got {lengths.tolist()}")
    t = np.arange(nt)
    src = np.where(t < lens[:, None], lens[:, None] - 1 - t, t)
    xm = np.moveaxis(x, (ba, ta), (0, 1))
    res = out if out is not None else np.empty_like(x)
    np.moveaxis(res, (ba, ta), (0, 1))[...] = xm[np.arange(nb)[:, None], src]
    return res


_register("reverse_sequence", 1107, _reverse_sequence_infer, _reverse_sequence_kernel,
          "reverse_sequence(x, lengths, batch_axis=1, time_axis=0): ONNX ReverseSequence: for each batch "
          "entry i, reverse the first lengths[i] steps along time_axis and keep the rest",
          arity=2, version=version_of_first, grad=_g_reverse_sequence,
          attrs={"batch_axis": Attr(attr_int, 1, doc="axis of the batch (lengths has its size)"),
                 "time_axis": Attr(attr_int, 0, doc="axis of the sequence steps")})


# ---------------------------------------------------------------- sort 1108
def _sort_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x = tensor(in_types[0], "x")
    if x.dtype.kind == "c":
        raise OpTypeError(f"complex values have no order, got {x.dtype}")
    if x.shape is not None:
        if not x.shape:
            raise OpTypeError("x must have rank >= 1")
        normalize_axis(attrs["axis"], len(x.shape))
    return (x, TensorType("int64", x.shape))


def _sort_kernel(x: np.ndarray, out: Any = None, *, axis: int, descending: bool) -> tuple[np.ndarray, np.ndarray]:
    ax = axis % x.ndim
    order = _stable_order(x, ax, descending=descending)
    return write_out((np.take_along_axis(x, order, axis=ax), order), out)


_register("sort", 1108, _sort_infer, _sort_kernel,
          "sort(x, axis=-1, descending=False) -> (values, int64 indices): a stable sort along axis (equal values "
          "keep their order; NaN sorts as the largest: last ascending, first descending); indices are "
          "np.argsort's (x's positions of the sorted values), so take_along_axis(x, indices) == values",
          arity=1, grad=_g_selected,
          attrs={"axis": Attr(attr_int, -1, doc="axis to sort along"),
                 "descending": Attr(attr_bool, False, doc="largest first")})


# ---------------------------------------------------------------- unique 1109
def _unique_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x = tensor(in_types[0], "x")
    return (x.with_shape((None,)), TensorType("int64", (None,)), TensorType("int64", x.shape),
            TensorType("int64", (None,)))


def _unique_kernel(x: np.ndarray, out: Any = None, *, equal_nan: bool) -> tuple[np.ndarray, ...]:
    values, first, inverse, counts = np.unique(x.ravel(), return_index=True, return_inverse=True,
                                               return_counts=True, equal_nan=equal_nan)
    return write_out((values, first.astype(np.int64), inverse.reshape(x.shape).astype(np.int64),
                      counts.astype(np.int64)), out)


_register("unique", 1109, _unique_infer, _unique_kernel,
          "unique(x, equal_nan=False) -> (values, first_indices, inverse, counts): the distinct values of the "
          "flattened x in ascending order (each NaN is distinct, as the Array API says), the flat index of "
          "each one's first occurrence, for every element of x the index of its value (x's shape), and how "
          "often each occurs; the length of values is data-dependent (a dynamic dim); equal_nan=True makes "
          "NaNs one value (NumPy's np.unique default, PyTensor's Unique)",
          arity=1, grad=no_grad,
          attrs={"equal_nan": Attr(attr_bool, False, doc="all NaNs count as one value (False: each is distinct)")})


# ---------------------------------------------------------------- nonzero 1110
def _nonzero_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x = tensor(in_types[0], "x")
    if x.shape is not None and not x.shape:
        raise OpTypeError("nonzero of a 0-d array is not defined (index it with x[None] first)")
    return (TensorType("int64", (None if x.shape is None else len(x.shape), None)),)


def _nonzero_kernel(x: np.ndarray, out: Any = None) -> np.ndarray:
    if x.ndim == 0:
        raise ValueError("nonzero of a 0-d array is not defined")
    return write_out(np.stack(np.nonzero(x)).astype(np.int64, copy=False).reshape(x.ndim, -1), out)


_register("nonzero", 1110, _nonzero_infer, _nonzero_kernel,
          "nonzero(x) -> int64[rank, n]: the indices of x's non-zero (True) elements in row-major order, one row "
          "per axis (ONNX NonZero; np.nonzero stacked); n is data-dependent (a dynamic dim)",
          arity=1, grad=no_grad)


# ---------------------------------------------------------------- searchsorted 1111
def _searchsorted_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, v = tensor(in_types[0], "sorted"), tensor(in_types[1], "values")
    if a.shape is not None and len(a.shape) != 1:
        raise OpTypeError(f"sorted must be 1-D, got rank {len(a.shape)}")
    if a.dtype.kind == "c" or v.dtype.kind == "c":
        raise OpTypeError("complex values have no order")
    return (TensorType("int64", v.shape),)


def _searchsorted_kernel(a: np.ndarray, v: np.ndarray, out: Any = None, *, side: str) -> np.ndarray:
    return write_out(np.searchsorted(a, v, side=side).astype(np.int64, copy=False), out)


def _attr_side(v: Any) -> str:
    if v not in ("left", "right"):
        raise OpTypeError(f"side must be 'left' or 'right', got {v!r}")
    return str(v)


_register("searchsorted", 1111, _searchsorted_infer, _searchsorted_kernel,
          "searchsorted(sorted, values, side='left') -> int64 (values' shape): where each value would be inserted "
          "into the ascending 1-D sorted to keep it sorted (np.searchsorted): before equal entries ('left') or "
          "after them ('right')",
          arity=2, grad=no_grad, attrs={"side": Attr(_attr_side, "left", doc="'left' or 'right'")})


# ---------------------------------------------------------------- traits
mark_traits("linear_time", *family_kinds(FAMILY))


# ---------------------------------------------------------------- tangent rules
# The gathers, trilu, reverse_sequence and one_hot (in its values) are linear: the op on the tangent. sort and
# topk pass on the tangent at the indices they chose (one gather, where the transposed rule scatters and
# gathers back); a scatter that overwrites or adds is linear in x and the updates jointly.
def _jvp_selected(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    return [b.op("gather_elements", tans[0], outs[1], axis=attrs["axis"]), None]


def _jvp_scatter(kind: str) -> Any:
    joint = linear(kind, (0, 2))

    def rule(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
        if attrs["reduction"] not in ("none", "add"):
            raise NotImplementedError(f"{kind} tangent: reduction {attrs['reduction']!r} is not supported "
                                      "(only 'none', 'add')")
        return joint(b, ins, outs, tans, attrs)

    return rule


set_rules("jvp", {
    **{k: linear(k) for k in ("gather_elements", "gather_nd", "trilu", "reverse_sequence")},
    "one_hot": linear("one_hot", (1,)), "sort": _jvp_selected, "topk": _jvp_selected,
    "scatter_elements": _jvp_scatter("scatter_elements"), "scatter_nd": _jvp_scatter("scatter_nd"),
})


# ---------------------------------------------------------------- batching rules (vmap)
# Every input gets the batch axis (the unbatched ones broadcast) and the op's axes move past it; scatter_nd, which
# indexes x's leading axes, gets each example's batch index as the first column of its indices. unique and
# nonzero have no rule: their result's length depends on each example's values, so examples do not stack.
def _batch_on_axis(kind: str, ranked: int = 0) -> Any:
    """The rule of an op whose inputs all get the batch axis and whose ``axis`` attribute moves past it
    (input ``ranked`` gives the rank the axis counts in)."""
    def rule(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: dict[str, Any]) -> list[Any]:
        xs = all_batched(b, ins, batched, size)
        axis = batch_axis(attrs["axis"], example_ndim(ins[ranked], batched[ranked]))
        res = b.op(kind, *xs, **{**attrs, "axis": axis})
        return list(res) if isinstance(res, (tuple, list)) else [res]
    return rule


def _gather_nd_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int,
                     attrs: dict[str, Any]) -> list[Any]:
    x, idx = all_batched(b, ins, batched, size)
    return [b.op("gather_nd", x, idx, batch_dims=attrs["batch_dims"] + 1)]


def _scatter_nd_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int,
                      attrs: dict[str, Any]) -> list[Any]:
    x, idx, upd = all_batched(b, ins, batched, size)
    shape = static_shape(idx.type)
    # example e's rows index x[e, ...]: its number leads each row of indices
    rows = np.broadcast_to(np.arange(size, dtype=idx.type.dtype).reshape((size,) + (1,) * (len(shape) - 1)),
                           (*shape[:-1], 1))
    idx = b.op("concat", b.constant(np.ascontiguousarray(rows)), idx, axis=-1)
    return [b.op("scatter_nd", x, idx, upd, **attrs)]


def _trilu_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: dict[str, Any]) -> list[Any]:
    return [b.op("trilu", ins[0], **attrs)]  # it works on the last two axes whatever leads them


def _one_hot_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int,
                   attrs: dict[str, Any]) -> list[Any] | None:
    if batched[1]:
        return None  # each example's own (off, on) pair: the fallback
    axis = attrs["axis"]
    return [b.op("one_hot", ins[0], ins[1], depth=attrs["depth"], axis=axis + 1 if axis >= 0 else axis)]


def _reverse_sequence_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int,
                            attrs: dict[str, Any]) -> list[Any]:
    # vmap's axis folds into the op's batch axis: the lengths of example e's rows are lengths[e]
    x, lengths = all_batched(b, ins, batched, size)
    shape = static_shape(ins[0].type)[int(batched[0]):]
    at = attrs["batch_axis"] % len(shape)
    merged = list(shape)
    merged[at] *= size
    x = b.op("reshape", move_axis(b, x, 0, at), shape=tuple(merged))
    y = b.op("reverse_sequence", x, b.op("reshape", lengths, shape=(-1,)), **attrs)
    y = b.op("reshape", y, shape=(*shape[:at], size, *shape[at:]))
    return [move_axis(b, y, at, 0)]


def _searchsorted_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int,
                        attrs: dict[str, Any]) -> list[Any]:
    a, v = ins
    if not batched[0]:
        return [b.op("searchsorted", a, v, **attrs)]
    # each example has its own sorted row: count the entries that sort before each value (after equal ones
    # with side='right'), NaN sorting last as np.searchsorted has it
    v = v if batched[1] else broadcast_batch(b, v, size)
    vr = len(static_shape(v.type))
    row = b.op("reshape", a, shape=(size,) + (1,) * (vr - 1) + (static_shape(a.type)[1],))
    val = b.op("expand_dims", v, axis=-1)
    before = b.op("less" if attrs["side"] == "left" else "less_equal", row, val)
    if np.result_type(a.type.dtype, v.type.dtype).kind == "f":
        nan_v = b.op("isnan", val)
        if attrs["side"] == "left":
            nan_v = b.op("logical_and", nan_v, b.op("logical_not", b.op("isnan", row)))
        before = b.op("logical_or", before, nan_v)
    return [b.op("sum", b.op("cast", before, dtype="int64"), axis=-1)]


set_rules("batch", {
    "gather_elements": _batch_on_axis("gather_elements"),
    "scatter_elements": _batch_on_axis("scatter_elements"),
    "gather_nd": _gather_nd_batch,
    "scatter_nd": _scatter_nd_batch,
    "topk": _batch_on_axis("topk"),
    "sort": _batch_on_axis("sort"),
    "one_hot": _one_hot_batch,
    "trilu": _trilu_batch,
    "reverse_sequence": _reverse_sequence_batch,
    "searchsorted": _searchsorted_batch,
})
