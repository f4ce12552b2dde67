"""``x[key]`` and ``x[key] = value`` on lazy arrays: basic, integer-array and boolean-mask indexing.

Basic keys (ints, slices, ``None``, ``...``) become one ``getitem`` op.
Integer arrays follow NumPy's advanced indexing: the index arrays (and the
ints beside them) broadcast together; their dims replace the indexed axes
in place when those are adjacent, else they come first. It is recorded as
a ``getitem`` of the other axes, a transpose and one ``gather_nd``. A
boolean mask stands for the integer arrays of its ``nonzero`` positions, so
its result has a data-dependent (dynamic) dim.

Assignment is a functional update recorded in the graph (a ``scatter_nd``
or a ``where``): ``x[key] = v`` makes ``x`` name the updated array; other
arrays computed from the old ``x`` (a slice taken earlier included) keep
their values, as in JAX, which the Array API allows.

    >>> import opgraph.numpy as onp
    >>> x = onp.arange(12).reshape(3, 4)
    >>> x[onp.asarray([0, 2]), onp.asarray([1, 3])].eval()
    array([ 1, 11])
    >>> x[x > 8].eval()
    array([ 9, 10, 11])
    >>> x[:, 0] = -1
    >>> x.eval()
    array([[-1,  1,  2,  3],
           [-1,  5,  6,  7],
           [-1,  9, 10, 11]])
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import numpy as np

from opgraph.frontend.lazy import LazyArray, apply, as_lazy, constant

_ARRAY_TYPES = (LazyArray, np.ndarray, list)


class _Entry(NamedTuple):
    """One key entry after ellipsis and mask expansion: it stands for exactly one axis of ``x`` viewed with
    the key's new axes inserted (``newaxis`` entries make that axis, the others consume one of ``x``)."""

    kind: str  # "int", "slice", "newaxis", "array"
    value: Any  # int, slice, None, or an integer LazyArray
    new_axis: bool = False  # an "array" entry indexing an axis a 0-d mask inserted


def _is_array(e: Any) -> bool:
    return isinstance(e, _ARRAY_TYPES) or (isinstance(e, np.generic) and e.dtype == np.bool_)


def _as_index_array(e: Any) -> LazyArray:
    a = as_lazy(np.asarray(e) if isinstance(e, (list, np.generic)) else e)
    if a.dtype.kind not in "biu":
        raise IndexError(f"arrays used as indices must be of integer or boolean type, not {a.dtype}")
    return a


def _int_bound(v: Any) -> int | None:
    # 0-d integer arrays are valid slice bounds (the Array API's __index__); evaluating a constant is cheap
    return None if v is None else operator.index(v)


def _normal_key(key: Any) -> tuple[Any, ...]:
    if isinstance(key, tuple):
        return key
    return (key,)


def _concrete_int(a: LazyArray) -> int | None:
    """The value of a 0-d integer array that is already known (a constant), else None."""
    if a.ndim == 0 and a.dtype.kind in "iu" and a._node.value is not None:
        return int(a._value("index"))
    return None


def _expand(x: LazyArray, key: tuple[Any, ...]) -> tuple[list[_Entry], bool]:
    """Key entries, one per axis of ``x`` with new axes, and whether any is an array (advanced indexing)."""
    rank = x.ndim
    raw: list[Any] = []
    for e in key:
        if _is_array(e) and not isinstance(e, LazyArray | np.ndarray | np.generic):
            e = np.asarray(e)
        if _is_array(e) and np.ndim(e) == 0 and np.dtype(e.dtype).kind in "iu":
            known = int(e) if not isinstance(e, LazyArray) else _concrete_int(e)
            if known is not None:  # a known 0-d integer array indexes like an int
                e = known
        if isinstance(e, bool | np.bool_):
            e = np.asarray(e)
        raw.append(e)
    consumed = 0
    for e in raw:
        if e is None or e is Ellipsis:
            continue
        consumed += np.ndim(e) if _is_array(e) and np.dtype(e.dtype) == np.bool_ else 1
    if sum(e is Ellipsis for e in raw) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > rank:
        raise IndexError(f"too many indices for array: array is {rank}-dimensional, but {consumed} were indexed")
    entries: list[_Entry] = []
    axis = 0
    advanced = False
    for e in raw:
        if e is Ellipsis:
            n = rank - consumed
            entries += [_Entry("slice", slice(None))] * n
            axis += n
        elif e is None:
            entries.append(_Entry("newaxis", None))
        elif isinstance(e, slice):
            entries.append(_Entry("slice", slice(_int_bound(e.start), _int_bound(e.stop), _int_bound(e.step))))
            axis += 1
        elif _is_array(e):
            arr = _as_index_array(e)
            advanced = True
            if arr.dtype == np.bool_:
                entries += _mask_entries(x, arr, axis)
                axis += arr.ndim
            else:
                entries.append(_Entry("array", arr))
                axis += 1
        else:
            entries.append(_Entry("int", operator.index(e)))
            axis += 1
    if not any(e is Ellipsis for e in raw):
        entries += [_Entry("slice", slice(None))] * (rank - consumed)
    return entries, advanced


def _mask_entries(x: LazyArray, mask: LazyArray, axis: int) -> list[_Entry]:
    """A boolean mask over axes ``axis``.. of ``x`` as the integer arrays of its True positions."""
    if mask.ndim == 0:  # NumPy: a new axis of length 1 (True) or 0 (False)
        rows = apply("nonzero", apply("reshape", mask, shape=(1,)))
        return [_Entry("array", apply("reshape", rows, shape=(-1,)), new_axis=True)]
    for i, d in enumerate(mask.shape):
        size = x.shape[axis + i]
        if d is not None and size is not None and d != size and d != 0:
            raise IndexError(f"boolean index did not match indexed array along axis {axis + i}; size of axis is "
                             f"{size} but size of corresponding boolean axis is {d}")
    return [_Entry("array", row) for row in nonzero_rows(mask)]


def nonzero_rows(x: LazyArray) -> tuple[LazyArray, ...]:
    """The int64 indices of ``x``'s non-zero elements, one 1-D array per axis (a dynamic dim): NumPy's nonzero.

    >>> import opgraph.numpy as onp
    >>> [r.eval() for r in nonzero_rows(onp.asarray([[0, 1], [2, 0]]))]
    [array([0, 1]), array([1, 0])]
    """
    rows = apply("nonzero", x)
    return tuple(apply("getitem", rows, index=(i,)) for i in range(x.ndim))


def _broadcast_together(arrays: list[LazyArray]) -> list[LazyArray]:
    """Arrays broadcast against each other; adding zeros keeps dynamic dims (broadcast_to needs static ones)."""
    if all(a.type.shape == arrays[0].type.shape for a in arrays):
        return arrays
    zero: LazyArray | None = None
    for a in arrays:
        z = apply("multiply", a, 0)
        zero = z if zero is None else apply("add", zero, z)
    return [apply("add", a, zero) for a in arrays]


def getitem(x: Any, key: Any) -> LazyArray:
    """``x[key]`` with NumPy's (and the Array API's) rules; see the module doc.

    >>> import opgraph.numpy as onp
    >>> onp.arange(6).reshape(2, 3)[..., onp.asarray([2, 0])].eval()
    array([[2, 0],
           [5, 3]])
    """
    from opgraph.ops.shape import normalize_index

    x = as_lazy(x)
    key = _normal_key(key)
    if not any(_is_array(e) or isinstance(e, bool | np.bool_) for e in key):
        basic = tuple(slice(_int_bound(e.start), _int_bound(e.stop), _int_bound(e.step)) if isinstance(e, slice)
                      else e for e in key)
        try:
            index = normalize_index(basic, x.type.rank)
        except Exception as exc:
            raise IndexError(str(exc)) from None
        return apply("getitem", x, index=index)
    entries, advanced = _expand(x, key)
    if not advanced:
        return apply("getitem", x, index=tuple(_basic(e) for e in entries))
    return _advanced_getitem(x, entries)


def _basic(e: _Entry) -> Any:
    if e.kind == "newaxis":
        return None
    return e.value


def _check_bounds(x_shape: tuple[int | None, ...], entries: list[_Entry]) -> None:
    axis = 0
    for e in entries:
        if e.kind == "int":
            d = x_shape[axis]
            if d is not None and not -d <= e.value < d:
                raise IndexError(f"index {e.value} is out of bounds for axis {axis} with size {d}")
        if e.kind != "newaxis" and not e.new_axis:
            axis += 1


def _positions(entries: list[_Entry]) -> tuple[list[int], list[int], LazyArray]:
    """The indexed entries, the other ones, and gather_nd's / scatter_nd's positions: the index arrays (ints
    as 0-d index arrays, as NumPy has them) broadcast together and stacked on a last axis."""
    picked = [i for i, e in enumerate(entries) if e.kind in ("int", "array")]
    rest = [i for i in range(len(entries)) if i not in picked]
    idx = [apply("cast", e.value if e.kind == "array" else constant(np.int64(e.value)), dtype=np.int64)
           for e in (entries[i] for i in picked)]
    return picked, rest, apply("stack", *_broadcast_together(idx), axis=-1)


def _in_place_at(picked: list[int]) -> int:
    """Where NumPy puts the index dims: at the first indexed axis when the indexed axes are adjacent, else first
    (0 either way when they already lead)."""
    return picked[0] if picked == list(range(picked[0], picked[0] + len(picked))) else 0


def _to_front(x: LazyArray, picked: list[int], rest: list[int]) -> LazyArray:
    order = (*picked, *rest)
    return x if order == tuple(range(len(order))) else apply("permute_dims", x, axes=order)


def _advanced_getitem(x: LazyArray, entries: list[_Entry]) -> LazyArray:
    _check_bounds(x.shape, entries)
    # 1. slices and new axes as one basic getitem; the indexed axes are kept whole (a 0-d mask's axis is new)
    view_key = tuple(None if e.kind == "newaxis" or e.new_axis else
                     slice(None) if e.kind in ("int", "array") else e.value for e in entries)
    view = apply("getitem", x, index=view_key)
    # 2. the indexed axes first, gathered by the broadcast index arrays
    picked, rest, positions = _positions(entries)
    out = apply("gather_nd", _to_front(view, picked, rest), positions)
    # 3. adjacent indexed axes: their broadcast dims go where the first one was
    nb, at = positions.ndim - 1, _in_place_at(picked)
    if at:
        out = apply("permute_dims", out, axes=(*range(nb, nb + at), *range(nb), *range(nb + at, out.ndim)))
    return out


def setitem(x: LazyArray, key: Any, value: Any) -> LazyArray:
    """The array ``x`` with ``x[key]`` replaced by ``value`` (cast to ``x``'s dtype), recorded as graph ops.

    ``LazyArray.__setitem__`` calls this and makes the array name the result.

    >>> import opgraph.numpy as onp
    >>> setitem(onp.zeros(4), slice(1, 3), 5.0).eval()
    array([0., 5., 5., 0.])
    """
    value = as_lazy(value, [x])
    if value.dtype != x.dtype:
        value = apply("cast", value, dtype=x.dtype)
    key = _normal_key(key)
    mask = _single_mask(x, key)
    if mask is not None:
        return _mask_update(x, mask, value)
    if x.type.is_static and all(e._node.value is not None for e in key if isinstance(e, LazyArray)):
        return _concrete_update(x, key, value)
    return _array_update(x, key, value)


def _single_mask(x: LazyArray, key: tuple[Any, ...]) -> LazyArray | None:
    if len(key) != 1 or not _is_array(key[0]):
        return None
    m = _as_index_array(key[0])
    return m if m.dtype == np.bool_ and m.ndim > 0 else None


def _mask_update(x: LazyArray, mask: LazyArray, value: LazyArray) -> LazyArray:
    if mask.ndim > x.ndim or any(d is not None and s is not None and d != s
                                 for d, s in zip(mask.shape, x.shape, strict=False)):
        raise IndexError(f"boolean index of shape {mask.shape} does not match the array's shape {x.shape}")
    if value.ndim == 0 or (value.ndim <= x.ndim - mask.ndim):  # one value for every selected position
        m = apply("reshape", mask, shape=(*mask.shape, *(1,) * (x.ndim - mask.ndim))) if x.ndim > mask.ndim \
            else mask
        return apply("where", m, value, x)
    positions = apply("permute_dims", apply("nonzero", mask), axes=(1, 0))
    return apply("scatter_nd", x, positions, value)


def _concrete_update(x: LazyArray, key: tuple[Any, ...], value: LazyArray) -> LazyArray:
    """Keys whose entries are all known: NumPy indexes an array of flat positions, so its rules hold exactly."""
    if not x.type.is_static:
        raise IndexError(f"x[key] = value needs a static shape for this key; this array is {x.type}")
    np_key = tuple(np.asarray(e._value("index")) if isinstance(e, LazyArray) else e for e in key)
    np_key = tuple(slice(_int_bound(e.start), _int_bound(e.stop), _int_bound(e.step)) if isinstance(e, slice)
                   else e for e in np_key)
    flat_positions = np.arange(x.size, dtype=np.int64).reshape(x.shape)[np_key if len(np_key) != 1 else np_key[0]]
    flat_positions = np.asarray(flat_positions)
    try:
        value = apply("broadcast_to", value, shape=flat_positions.shape)
    except Exception as exc:
        raise ValueError(f"could not broadcast the value of shape {value.shape} to the indexing result's shape "
                         f"{flat_positions.shape}") from exc
    flat = apply("reshape", x, shape=(-1,))
    updated = apply("scatter_nd", flat, constant(flat_positions.reshape(-1, 1)),
                    apply("reshape", value, shape=(-1,)))
    return apply("reshape", updated, shape=x.shape)


def _array_update(x: LazyArray, key: tuple[Any, ...], value: LazyArray) -> LazyArray:
    """Keys with computed integer arrays: the indexed axes must be ints or arrays, the others whole slices."""
    entries, _ = _expand(x, key)
    if any(e.kind == "newaxis" or e.new_axis or (e.kind == "slice" and e.value != slice(None)) for e in entries):
        raise IndexError("x[key] = value with computed index arrays takes ints, index arrays and whole slices (:) "
                         "only; index with a constant key or use onp.where")
    _check_bounds(x.shape, entries)
    picked, rest, positions = _positions(entries)
    target = _advanced_getitem(x, entries)  # NumPy's x[key]: the shape value must broadcast to, in the user's order
    if value.type.shape != target.type.shape:
        # a static shape needs no run of the gather (its ops stay out of the graph); dynamic dims add its zeros
        value = (apply("broadcast_to", value, shape=target.shape) if target.type.is_static
                 else apply("add", value, apply("multiply", target, 0)))
    nb, at = positions.ndim - 1, _in_place_at(picked)
    if at:  # undo getitem's move of the index dims
        value = apply("permute_dims", value, axes=(*range(at, at + nb), *range(at), *range(at + nb, value.ndim)))
    moved = _to_front(x, picked, rest)
    updated = apply("scatter_nd", moved, positions, value)
    if moved is x:
        return updated
    return apply("permute_dims", updated, axes=tuple(int(i) for i in np.argsort((*picked, *rest))))
