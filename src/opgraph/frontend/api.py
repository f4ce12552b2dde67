"""The NumPy / Array API namespace over lazy arrays (exported as ``opgraph.numpy``).

Names and signatures follow the Python Array API standard, with NumPy's
common aliases (``concatenate``, ``transpose``, ``arcsin``, ``power``...).

    >>> import numpy as np
    >>> import opgraph.numpy as onp
    >>> x = onp.arange(6.0).reshape(2, 3)
    >>> onp.concat([x, x], axis=0).shape
    (4, 3)
    >>> onp.where(x > 2, x, 0.0).eval()
    array([[0., 0., 0.],
           [3., 4., 5.]])
"""

from __future__ import annotations

import builtins as _builtins
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from opgraph import ops as _ops  # noqa: F401  (registers the built-in ops, which this module wraps at import)
from opgraph.core.registry import all_ops
from opgraph.frontend.lazy import LazyArray, apply, as_lazy, constant, placeholder

__all__: list[str] = ["LazyArray", "asarray", "placeholder"]

# ---------------------------------------------------------------- dtypes
bool = np.bool_
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
float16, float32, float64 = np.float16, np.float32, np.float64
complex64, complex128 = np.complex64, np.complex128
e, pi, inf, nan = np.e, np.pi, np.inf, np.nan
newaxis = None
iinfo, result_type, can_cast = np.iinfo, np.result_type, np.can_cast


class FinfoResult(NamedTuple):
    """Machine limits of a floating dtype, as Python floats (the Array API's ``finfo`` object)."""

    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: np.dtype


def finfo(type: Any, /) -> FinfoResult:
    """Machine limits of a real or complex floating dtype (or of an array's dtype), as Python floats.

    >>> finfo(float32).eps == 2.0 ** -23
    True
    """
    info = np.finfo(type.dtype if isinstance(type, LazyArray) else type)
    return FinfoResult(int(info.bits), float(info.eps), float(info.max), float(info.min),
                       float(info.smallest_normal), np.dtype(info.dtype))


def isdtype(dtype: Any, kind: Any) -> Any:
    """Array API ``isdtype`` (NumPy's).

    >>> isdtype(np.dtype("float32"), "real floating")
    True
    """
    return np.isdtype(dtype, kind)


# ---------------------------------------------------------------- creation
def asarray(obj: Any, /, *, dtype: Any = None, device: Any = None, copy: Any = None) -> LazyArray:
    """A lazy array from a NumPy array, nested lists, a scalar or a lazy array.

    >>> asarray([1, 2, 3]).dtype
    dtype('int64')
    """
    if isinstance(obj, LazyArray):
        if dtype is not None and np.dtype(dtype) != obj.dtype:
            return obj.astype(dtype)
        # copy=True: a new array object, so that x[key] = v on it (a functional update) leaves obj alone
        return LazyArray(obj._node, obj._index) if copy else obj
    if copy is False and not isinstance(obj, np.ndarray):
        raise ValueError("asarray(copy=False): a lazy array cannot share memory with a Python object")
    if hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray | np.generic):
        obj = np.from_dlpack(obj)
    return constant(np.asarray(obj, dtype=dtype))


array = asarray


def zeros(shape: Any, *, dtype: Any = None, device: Any = None) -> LazyArray:
    """Zeros of a shape (float64 by default).

    >>> zeros((2,)).eval()
    array([0., 0.])
    """
    return constant(np.zeros(shape, dtype=dtype or np.float64))


def ones(shape: Any, *, dtype: Any = None, device: Any = None) -> LazyArray:
    """Ones of a shape.

    >>> ones(2, dtype="int8").eval()
    array([1, 1], dtype=int8)
    """
    return constant(np.ones(shape, dtype=dtype or np.float64))


def empty(shape: Any, *, dtype: Any = None, device: Any = None) -> LazyArray:
    """An array of a shape (filled with zeros: lazy graphs have no uninitialised memory).

    >>> empty((1,)).shape
    (1,)
    """
    return zeros(shape, dtype=dtype)


def full(shape: Any, fill_value: Any, *, dtype: Any = None, device: Any = None) -> LazyArray:
    """An array filled with one value.

    >>> full((2,), 7).eval()
    array([7, 7])
    """
    return constant(np.full(shape, fill_value, dtype=dtype))


def _like(x: Any, fill: Any, dtype: Any) -> LazyArray:
    x = as_lazy(x)
    if x.type.shape is None or None in x.shape:
        raise ValueError(f"*_like needs a known shape; this array is {x.type}")
    return constant(np.full(x.shape, fill, dtype=dtype or x.dtype))


def zeros_like(x: Any, /, *, dtype: Any = None, device: Any = None) -> LazyArray:
    """Zeros with the shape and dtype of ``x``.

    >>> zeros_like(asarray([1.5, 2.5])).eval()
    array([0., 0.])
    """
    return _like(x, 0, dtype)


def ones_like(x: Any, /, *, dtype: Any = None, device: Any = None) -> LazyArray:
    """Ones with the shape and dtype of ``x``.

    >>> ones_like(asarray([1, 2])).eval()
    array([1, 1])
    """
    return _like(x, 1, dtype)


def empty_like(x: Any, /, *, dtype: Any = None, device: Any = None) -> LazyArray:
    """Like :func:`zeros_like`."""
    return _like(x, 0, dtype)


def full_like(x: Any, /, fill_value: Any, *, dtype: Any = None, device: Any = None) -> LazyArray:
    """``fill_value`` with the shape and dtype of ``x``.

    >>> full_like(asarray([1.0, 2.0]), 3).eval()
    array([3., 3.])
    """
    return _like(x, fill_value, dtype)


def arange(start: Any, /, stop: Any = None, step: Any = 1, *, dtype: Any = None, device: Any = None) -> LazyArray:
    """NumPy's arange as a constant.

    >>> arange(3).eval()
    array([0, 1, 2])
    """
    if stop is None:  # arange(stop) and arange(stop, step=s) count from 0
        start, stop = 0, start
    return constant(np.arange(start, stop, step, dtype=dtype))


def linspace(start: Any, stop: Any, /, num: int, *, dtype: Any = None, device: Any = None,
             endpoint: bool = True) -> LazyArray:
    """NumPy's linspace as a constant.

    >>> linspace(0, 1, 3).eval()
    array([0. , 0.5, 1. ])
    """
    return constant(np.linspace(start, stop, num, dtype=dtype, endpoint=endpoint))


def eye(n_rows: int, n_cols: int | None = None, /, *, k: int = 0, dtype: Any = None,
        device: Any = None) -> LazyArray:
    """Identity-like matrix as a constant.

    >>> eye(2).eval()
    array([[1., 0.],
           [0., 1.]])
    """
    return constant(np.eye(n_rows, n_cols, k=k, dtype=dtype or np.float64))


def tril(x: Any, /, *, k: int = 0) -> LazyArray:
    """Lower triangle (multiplies by a constant mask).

    >>> tril(ones((2, 2))).eval()
    array([[1., 0.],
           [1., 1.]])
    """
    x = as_lazy(x)
    mask = np.tril(np.ones(x.shape[-2:], dtype=np.bool_), k)
    return where(mask, x, zeros((), dtype=x.dtype))


def triu(x: Any, /, *, k: int = 0) -> LazyArray:
    """Upper triangle.

    >>> triu(ones((2, 2))).eval()
    array([[1., 1.],
           [0., 1.]])
    """
    x = as_lazy(x)
    mask = np.triu(np.ones(x.shape[-2:], dtype=np.bool_), k)
    return where(mask, x, zeros((), dtype=x.dtype))


# ---------------------------------------------------------------- elementwise
def _make_elementwise(kind: str, nin: int, doc: str) -> Any:
    if nin == 1:
        def fn1(x: Any, /) -> LazyArray:
            return apply(kind, x)

        fn = fn1
    else:
        def fn2(x1: Any, x2: Any, /) -> LazyArray:
            return apply(kind, x1, x2)

        fn = fn2
    fn.__name__ = fn.__qualname__ = kind
    fn.__doc__ = f"Lazy ``{kind}``: {doc}. See :mod:`opgraph.ops.elementwise`."
    return fn


for _d in all_ops():
    if _d.family == "elementwise" and _d.elementwise and _d.arity in (1, 2) and not _d.attrs:
        globals()[_d.name] = _make_elementwise(_d.name, _d.arity, _d.doc)
        __all__.append(_d.name)

_ALIASES = {
    "absolute": "abs", "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arctan2": "atan2",
    "arcsinh": "asinh", "arccosh": "acosh", "arctanh": "atanh", "pow": "power", "true_divide": "divide",
    "mod": "remainder", "conjugate": "conj", "invert": "bitwise_invert", "left_shift": "bitwise_left_shift",
    "right_shift": "bitwise_right_shift", "rint": "round",
}
for _alias, _target in _ALIASES.items():
    globals()[_alias] = globals()[_target]
    __all__.append(_alias)


def where(condition: Any, x1: Any, x2: Any, /) -> LazyArray:
    """``x1`` where ``condition`` else ``x2``.

    >>> where(asarray([True, False]), 1.0, 2.0).eval()
    array([1., 2.])
    """
    return apply("where", condition, x1, x2)


def clip(x: Any, /, min: Any = None, max: Any = None) -> LazyArray:
    """Clip to ``[min, max]`` (None means unbounded).

    >>> clip(asarray([-2.0, 0.5, 3.0]), 0.0, 1.0).eval()
    array([0. , 0.5, 1. ])
    """
    x = as_lazy(x)
    if min is None and max is None:
        return x
    if min is None:
        return apply("minimum", x, max)
    if max is None:
        return apply("maximum", x, min)
    return apply("clip", x, min, max)


def astype(x: Any, dtype: Any, /, *, copy: bool = True, device: Any = None) -> LazyArray:
    """Cast to ``dtype``.

    >>> astype(asarray([1.7]), "int32").eval()
    array([1], dtype=int32)
    """
    return as_lazy(x).astype(dtype, copy=copy)


# ---------------------------------------------------------------- reductions
def _in_dtype(x: Any, dtype: Any) -> LazyArray:
    """``x`` as a lazy array cast to ``dtype`` when one is given (NumPy's ``dtype=``: computed in that type)."""
    x = as_lazy(x)
    return x if dtype is None else x.astype(dtype)


def _reduce_in(dtype: Any, kind: str, x: Any, axis: Any, keepdims: bool) -> LazyArray:
    """Reduction ``kind`` computed in ``dtype`` when given, and returned in it (NumPy's sum of int8 is int64
    unless ``dtype=`` says otherwise)."""
    return _result_in(dtype, apply(kind, _in_dtype(x, dtype), axis=axis, keepdims=keepdims))


def _result_in(dtype: Any, out: LazyArray) -> LazyArray:
    return out if dtype is None or out.dtype == np.dtype(dtype) else out.astype(dtype)


def sum(x: Any, /, *, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> LazyArray:
    """Sum over ``axis`` (all axes by default).

    >>> sum(asarray([[1, 2], [3, 4]]), axis=0).eval()
    array([4, 6])
    """
    return _reduce_in(dtype, "sum", x, axis, keepdims)


def prod(x: Any, /, *, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> LazyArray:
    """Product over ``axis``.

    >>> prod(asarray([2, 3])).eval()
    array(6)
    """
    return _reduce_in(dtype, "prod", x, axis, keepdims)


def _reduction(kind: str) -> Any:
    def fn(x: Any, /, *, axis: Any = None, keepdims: bool = False) -> LazyArray:
        return apply(kind, x, axis=axis, keepdims=keepdims)

    fn.__name__ = fn.__qualname__ = kind
    fn.__doc__ = f"Lazy ``{kind}`` over ``axis`` (all axes by default), NumPy semantics."
    return fn


max = _reduction("max")
min = _reduction("min")
any = _reduction("any")
all = _reduction("all")
logsumexp = _reduction("logsumexp")
amax, amin = max, min


def mean(x: Any, /, *, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> LazyArray:
    """Mean over ``axis`` (all axes by default), computed in ``dtype`` when given (NumPy's ``dtype=``).

    >>> mean(asarray([1, 2])).eval()
    array(1.5)
    """
    return _reduce_in(dtype, "mean", x, axis, keepdims)


def var(x: Any, /, *, axis: Any = None, correction: float = 0.0, keepdims: bool = False) -> LazyArray:
    """Variance with ``correction`` (NumPy's ddof).

    >>> var(asarray([1.0, 3.0])).eval()
    array(1.)
    """
    return apply("var", x, axis=axis, correction=correction, keepdims=keepdims)


def std(x: Any, /, *, axis: Any = None, correction: float = 0.0, keepdims: bool = False) -> LazyArray:
    """Standard deviation with ``correction``.

    >>> std(asarray([1.0, 3.0])).eval()
    array(1.)
    """
    return apply("std", x, axis=axis, correction=correction, keepdims=keepdims)


def argmax(x: Any, /, *, axis: int | None = None, keepdims: bool = False) -> LazyArray:
    """Index of the maximum (over the flattened array when ``axis`` is None).

    >>> argmax(asarray([1, 5, 2])).eval()
    array(1)
    """
    return apply("argmax", x, axis=axis, keepdims=keepdims)


def argmin(x: Any, /, *, axis: int | None = None, keepdims: bool = False) -> LazyArray:
    """Index of the minimum.

    >>> argmin(asarray([1, 5, 0])).eval()
    array(2)
    """
    return apply("argmin", x, axis=axis, keepdims=keepdims)


def _cumulative(kind: str, x: Any, axis: int | None, dtype: Any, include_initial: bool) -> LazyArray:
    x = _in_dtype(x, dtype)
    if axis is None and x.ndim > 1:
        raise ValueError(f"cumulative_{kind[3:]} needs an axis for arrays of more than one dimension")
    if x.ndim == 0:
        raise ValueError(f"cumulative_{kind[3:]} needs an array of at least one dimension")
    out = _result_in(dtype, apply(kind, x, axis=0 if axis is None else axis))
    if include_initial:
        ax = 0 if axis is None else axis
        shape = list(out.shape)
        shape[ax] = 1
        out = concat([full(tuple(shape), 0 if kind == "cumsum" else 1, dtype=out.dtype), out], axis=ax)
    return out


def cumulative_sum(x: Any, /, *, axis: int | None = None, dtype: Any = None,
                   include_initial: bool = False) -> LazyArray:
    """Cumulative sum along ``axis``.

    >>> cumulative_sum(asarray([1, 2, 3])).eval()
    array([1, 3, 6])
    """
    return _cumulative("cumsum", x, axis, dtype, include_initial)


def cumulative_prod(x: Any, /, *, axis: int | None = None, dtype: Any = None,
                    include_initial: bool = False) -> LazyArray:
    """Cumulative product along ``axis``.

    >>> cumulative_prod(asarray([1, 2, 3]), include_initial=True).eval()
    array([1, 1, 2, 6])
    """
    return _cumulative("cumprod", x, axis, dtype, include_initial)


def cumsum(x: Any, /, axis: int | None = None, dtype: Any = None) -> LazyArray:
    """NumPy's cumsum (flattened when ``axis`` is None), computed in ``dtype`` when given.

    >>> cumsum(asarray([[1, 2], [3, 4]])).eval()
    array([ 1,  3,  6, 10])
    """
    return apply("cumsum", _in_dtype(x, dtype), axis=axis)


def cumprod(x: Any, /, axis: int | None = None, dtype: Any = None) -> LazyArray:
    """NumPy's cumprod, computed in ``dtype`` when given.

    >>> cumprod(asarray([1, 2, 3])).eval()
    array([1, 2, 6])
    """
    return apply("cumprod", _in_dtype(x, dtype), axis=axis)


# ---------------------------------------------------------------- products
def matmul(x1: Any, x2: Any, /) -> LazyArray:
    """Matrix product (NumPy's matmul).

    >>> matmul(asarray([[1, 2]]), asarray([[3], [4]])).eval()
    array([[11]])
    """
    return apply("matmul", x1, x2)


def einsum(subscripts: str, /, *operands: Any, optimize: Any = "auto") -> LazyArray:
    """Einstein summation; the contraction order is chosen by opt_einsum.

    >>> einsum("ij,j->i", asarray([[1.0, 2.0]]), asarray([3.0, 4.0])).eval()
    array([11.])
    """
    return apply("einsum", *operands, subscripts=subscripts,
                 optimize=optimize if isinstance(optimize, str) else ("auto" if optimize else "none"))


def tensordot(x1: Any, x2: Any, /, *, axes: Any = 2) -> LazyArray:
    """Tensor dot product (NumPy's tensordot).

    >>> tensordot(ones((2, 3)), ones((3, 4)), axes=1).shape
    (2, 4)
    """
    return apply("tensordot", x1, x2, axes=axes)


def vecdot(x1: Any, x2: Any, /, *, axis: int = -1) -> LazyArray:
    """Vector dot product over ``axis`` (conjugating ``x1``).

    >>> vecdot(asarray([1.0, 2.0]), asarray([3.0, 4.0])).eval()
    array(11.)
    """
    return apply("vecdot", x1, x2, axis=axis)


def outer(x1: Any, x2: Any, /) -> LazyArray:
    """Outer product of two vectors.

    >>> outer(asarray([1, 2]), asarray([3, 4])).eval()
    array([[3, 4],
           [6, 8]])
    """
    return apply("outer", x1, x2)


def dot(a: Any, b: Any) -> LazyArray:
    """NumPy's dot for 1-D and 2-D operands (matmul), scalars (multiply).

    >>> dot(asarray([1, 2]), asarray([3, 4])).eval()
    array(11)
    """
    a, b = as_lazy(a), as_lazy(b)
    if a.ndim == 0 or b.ndim == 0:
        return multiply(a, b)  # type: ignore[name-defined]  # noqa: F821
    if b.ndim <= 2:
        return matmul(a, b)
    return tensordot(a, b, axes=((a.ndim - 1,), (b.ndim - 2,)))


def vdot(a: Any, b: Any, /) -> LazyArray:
    """NumPy's vdot: the dot product of the flattened arrays, conjugating ``a``.

    >>> vdot(asarray([1 + 2j, 3j]), asarray([1.0, 1.0])).eval()
    array(1.-5.j)
    """
    return apply("vecdot", ravel(a), ravel(b), axis=-1)


def inner(a: Any, b: Any, /) -> LazyArray:
    """NumPy's inner: a sum over the last axes of ``a`` and ``b`` (no conjugation; scalars multiply).

    >>> inner(asarray([[1, 2], [3, 4]]), asarray([1, 1])).eval()
    array([3, 7])
    """
    a, b = as_lazy(a), as_lazy(b)
    if a.ndim == 0 or b.ndim == 0:
        return multiply(a, b)  # type: ignore[name-defined]  # noqa: F821
    return tensordot(a, b, axes=((a.ndim - 1,), (b.ndim - 1,)))


def matrix_transpose(x: Any, /) -> LazyArray:
    """Swap the last two axes.

    >>> matrix_transpose(ones((2, 3, 4))).shape
    (2, 4, 3)
    """
    return as_lazy(x).mT


# ---------------------------------------------------------------- shapes
def reshape(x: Any, /, shape: Any, *, copy: bool | None = None) -> LazyArray:
    """Reshape (one dimension may be -1).

    >>> reshape(arange(6), (2, -1)).shape
    (2, 3)
    """
    return apply("reshape", x, shape=shape)


def permute_dims(x: Any, /, axes: Any) -> LazyArray:
    """Permute the axes.

    >>> permute_dims(ones((2, 3)), (1, 0)).shape
    (3, 2)
    """
    return apply("permute_dims", x, axes=axes)


def transpose(x: Any, /, axes: Any = None) -> LazyArray:
    """NumPy's transpose (reverse the axes by default).

    >>> transpose(ones((2, 3))).shape
    (3, 2)
    """
    return apply("permute_dims", x, axes=axes)


def broadcast_to(x: Any, /, shape: Any) -> LazyArray:
    """Broadcast to a shape.

    >>> broadcast_to(asarray([1, 2]), (3, 2)).shape
    (3, 2)
    """
    return apply("broadcast_to", x, shape=shape)


def broadcast_arrays(*arrays: Any) -> tuple[LazyArray, ...]:
    """Broadcast arrays against each other (a tuple, as Array API 2025.12 says).

    >>> [a.shape for a in broadcast_arrays(ones((2, 1)), ones((3,)))]
    [(2, 3), (2, 3)]
    """
    from opgraph.core.types import broadcast_shapes

    lazies = [as_lazy(a) for a in arrays]
    shape = broadcast_shapes(*(a.shape for a in lazies))
    return tuple(a if a.shape == shape else broadcast_to(a, shape) for a in lazies)


def expand_dims(x: Any, /, axis: Any = 0) -> LazyArray:
    """Insert size-1 axes.

    >>> expand_dims(ones((2,)), axis=0).shape
    (1, 2)
    """
    x = as_lazy(x)
    n = x.ndim + (len(axis) if isinstance(axis, tuple | list) else 1)
    for a in axis if isinstance(axis, tuple | list) else (axis,):
        if not -n <= a < n:
            raise IndexError(f"axis {a} is out of bounds for an array of dimension {n}")
    return apply("expand_dims", x, axis=axis)


def squeeze(x: Any, /, axis: Any = None) -> LazyArray:
    """Remove size-1 axes.

    >>> squeeze(ones((1, 2, 1))).shape
    (2,)
    """
    return apply("squeeze", x, axis=axis)


def concat(arrays: Sequence[Any], /, *, axis: int | None = 0) -> LazyArray:
    """Join arrays along an existing axis (flattening all when ``axis`` is None).

    >>> concat([ones(2), zeros(1)]).eval()
    array([1., 1., 0.])
    """
    return apply("concat", *arrays, axis=axis)


def concatenate(arrays: Sequence[Any], axis: int | None = 0) -> LazyArray:
    """NumPy's name for :func:`concat`."""
    return concat(arrays, axis=axis)


def stack(arrays: Sequence[Any], /, *, axis: int = 0) -> LazyArray:
    """Join arrays along a new axis.

    >>> stack([ones(2), zeros(2)]).shape
    (2, 2)
    """
    return apply("stack", *arrays, axis=axis)


def split(x: Any, indices_or_sections: Any, axis: int = 0) -> tuple[LazyArray, ...]:
    """NumPy's split: N equal parts, or at the given indices.

    >>> [p.shape for p in split(ones(6), 3)]
    [(2,), (2,), (2,)]
    """
    out = apply("split", x, sections=indices_or_sections, axis=axis)
    return out if isinstance(out, tuple) else (out,)


def unstack(x: Any, /, *, axis: int = 0) -> tuple[LazyArray, ...]:
    """Split along ``axis`` into arrays with that axis removed.

    >>> [p.shape for p in unstack(ones((2, 3)))]
    [(3,), (3,)]
    """
    x = as_lazy(x)
    if not -x.ndim <= axis < x.ndim:
        raise IndexError(f"axis {axis} is out of bounds for an array of dimension {x.ndim}")
    if x.shape[axis] == 0:
        return ()
    return tuple(squeeze(p, axis=axis) for p in split(x, x.shape[axis], axis=axis))


def take(x: Any, indices: Any, /, *, axis: int | None = None) -> LazyArray:
    """Gather along ``axis`` (flattened when None).

    >>> take(asarray([10, 20, 30]), asarray([2, 0])).eval()
    array([30, 10])
    """
    return apply("take", x, indices, axis=axis)


def pad(x: Any, pad_width: Any, mode: str = "constant", *, constant_values: float = 0.0) -> LazyArray:
    """NumPy's pad (modes constant, edge, reflect, symmetric, wrap).

    >>> pad(asarray([1.0]), 1).eval()
    array([0., 1., 0.])
    """
    return apply("pad", x, pad_width=pad_width, mode=mode, constant_value=constant_values)


def flip(x: Any, /, *, axis: Any = None) -> LazyArray:
    """Reverse along ``axis``.

    >>> flip(asarray([1, 2, 3])).eval()
    array([3, 2, 1])
    """
    return apply("flip", x, axis=axis)


def roll(x: Any, /, shift: Any, *, axis: Any = None) -> LazyArray:
    """Roll elements along ``axis``.

    >>> roll(asarray([1, 2, 3]), 1).eval()
    array([3, 1, 2])
    """
    return apply("roll", x, shift=shift, axis=axis)


def tile(x: Any, repetitions: Any, /) -> LazyArray:
    """Repeat the whole array.

    >>> tile(asarray([1, 2]), (2,)).eval()
    array([1, 2, 1, 2])
    """
    return apply("tile", x, reps=repetitions)


def repeat(x: Any, repeats: Any, /, *, axis: int | None = None) -> LazyArray:
    """Repeat each element: ``repeats`` times, or ``repeats[i]`` times for element ``i`` (an array of counts).

    Counts given as an array must be known (a constant): the result's length depends on them.

    >>> repeat(asarray([1, 2]), 2).eval()
    array([1, 1, 2, 2])
    >>> repeat(asarray([1, 2]), asarray([1, 3])).eval()
    array([1, 2, 2, 2])
    """
    if isinstance(repeats, int | np.integer):
        return apply("repeat", x, repeats=int(repeats), axis=axis)
    x = as_lazy(x)
    counts = np.asarray(repeats._value("repeat counts") if isinstance(repeats, LazyArray) else repeats)
    if counts.ndim == 0 or counts.shape == (1,):
        return apply("repeat", x, repeats=int(counts.reshape(())), axis=axis)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    positions = np.repeat(np.arange(x.shape[axis]), counts)
    return take(x, constant(positions.astype(np.int64)), axis=axis)


def moveaxis(x: Any, source: Any, destination: Any, /) -> LazyArray:
    """Move axes to new positions.

    >>> moveaxis(ones((2, 3, 4)), 0, -1).shape
    (3, 4, 2)
    """
    return apply("moveaxis", x, source=source, destination=destination)


def ravel(x: Any, /) -> LazyArray:
    """Flatten to 1-D.

    >>> ravel(ones((2, 3))).shape
    (6,)
    """
    return reshape(x, (-1,))


def getitem(x: Any, key: Any) -> LazyArray:
    """``x[key]``: basic indexing, integer arrays and boolean masks (see :mod:`opgraph.frontend.indexing`).

    >>> getitem(arange(10), slice(None, None, -3)).eval()
    array([9, 6, 3, 0])
    """
    from opgraph.frontend import indexing

    return indexing.getitem(x, key)


# ---------------------------------------------------------------- linalg
class EighResult(NamedTuple):
    """Eigenvalues (ascending) and eigenvectors (columns)."""

    eigenvalues: LazyArray
    eigenvectors: LazyArray


class QRResult(NamedTuple):
    """Q and R of a QR decomposition."""

    Q: LazyArray
    R: LazyArray


class SVDResult(NamedTuple):
    """U, S (descending) and Vh of an SVD."""

    U: LazyArray
    S: LazyArray
    Vh: LazyArray


class EigResult(NamedTuple):
    """Eigenvalues and eigenvectors (columns) of a general matrix, complex."""

    eigenvalues: LazyArray
    eigenvectors: LazyArray


class SlogdetResult(NamedTuple):
    """Sign and log of the absolute value of a determinant."""

    sign: LazyArray
    logabsdet: LazyArray


def _inexact(x: Any) -> LazyArray:
    x = as_lazy(x)
    return x.astype(np.float64) if x.dtype.kind in "biu" else x


def _abs_squared(x: LazyArray) -> LazyArray:
    # |x|^2 without abs(): abs has a kink at 0, so square(x) keeps gradients smooth there
    if x.dtype.kind == "c":
        return apply("add", apply("square", apply("real", x)), apply("square", apply("imag", x)))
    return apply("square", x)


def _vector_norm(x: LazyArray, axis: Any, keepdims: bool, ord: Any) -> LazyArray:
    if isinstance(ord, str):
        raise ValueError(f"Invalid norm order {ord!r} for vectors")
    ax = apply("abs", x)
    if ord in (np.inf, -np.inf):
        return (max if ord > 0 else min)(ax, axis=axis, keepdims=keepdims)
    if ord == 0:
        return sum(apply("not_equal", x, 0).astype(ax.dtype), axis=axis, keepdims=keepdims)
    if ord == 1:
        return sum(ax, axis=axis, keepdims=keepdims)
    if ord == 2:
        return apply("sqrt", sum(_abs_squared(x), axis=axis, keepdims=keepdims))
    p = float(ord)
    return apply("power", sum(apply("power", ax, p), axis=axis, keepdims=keepdims), 1.0 / p)


def _matrix_norm(x: LazyArray, axis: tuple[int, int], keepdims: bool, ord: Any) -> LazyArray:
    nd = x.ndim
    if not _builtins.all(-nd <= a < nd for a in axis):
        raise ValueError(f"axis {axis} is out of bounds for an array of dimension {nd}")
    r, c = (a % nd for a in axis)
    if r == c:
        raise ValueError("Duplicate axes given.")
    if ord in (2, -2, "nuc"):
        s = linalg.svdvals(moveaxis(x, (r, c), (-2, -1)))
        out = sum(s, axis=-1) if ord == "nuc" else (max if ord == 2 else min)(s, axis=-1)
    elif ord is None or ord in ("fro", "f"):
        out = apply("sqrt", sum(_abs_squared(x), axis=(r, c)))
    elif ord in (1, -1):  # the largest (smallest) column sum: sum over rows, then reduce over columns
        out = (max if ord == 1 else min)(sum(apply("abs", x), axis=r), axis=c - 1 if c > r else c)
    elif ord in (np.inf, -np.inf):  # the largest (smallest) row sum
        out = (max if ord > 0 else min)(sum(apply("abs", x), axis=c), axis=r - 1 if r > c else r)
    else:
        raise ValueError(f"Invalid norm order {ord!r} for matrices")
    if keepdims:
        shape = list(x.shape)
        shape[r] = shape[c] = 1
        out = reshape(out, tuple(shape))
    return out


class _Linalg:
    """``opgraph.numpy.linalg``: the Array API linalg extension on lazy arrays.

    >>> import opgraph.numpy as onp
    >>> w, v = onp.linalg.eigh(onp.asarray([[2.0, 0.0], [0.0, 1.0]]))
    >>> w.eval()
    array([1., 2.])
    """

    @staticmethod
    def eigh(x: Any, /) -> EighResult:
        """Eigen-decomposition of a symmetric (Hermitian) matrix."""
        return EighResult(*apply("eigh", x))

    @staticmethod
    def eigvalsh(x: Any, /) -> LazyArray:
        """Eigenvalues of a symmetric (Hermitian) matrix."""
        return apply("eigvalsh", x)

    @staticmethod
    def qr(x: Any, /, *, mode: str = "reduced") -> QRResult:
        """QR decomposition."""
        return QRResult(*apply("qr", x, mode=mode))

    @staticmethod
    def svd(x: Any, /, *, full_matrices: bool = True) -> SVDResult:
        """Singular value decomposition."""
        return SVDResult(*apply("svd", x, full_matrices=full_matrices))

    @staticmethod
    def svdvals(x: Any, /) -> LazyArray:
        """Singular values."""
        return apply("svdvals", x)

    @staticmethod
    def cholesky(x: Any, /, *, upper: bool = False) -> LazyArray:
        """Cholesky factor."""
        return apply("cholesky", x, upper=upper)

    @staticmethod
    def solve(x1: Any, x2: Any, /) -> LazyArray:
        """Solve ``x1 @ out = x2``."""
        return apply("solve", x1, x2)

    @staticmethod
    def inv(x: Any, /) -> LazyArray:
        """Matrix inverse."""
        return apply("inv", x)

    @staticmethod
    def det(x: Any, /) -> LazyArray:
        """Determinant."""
        return apply("det", x)

    @staticmethod
    def slogdet(x: Any, /) -> SlogdetResult:
        """Sign and log-determinant."""
        return SlogdetResult(*apply("slogdet", x))

    @staticmethod
    def pinv(x: Any, /, *, rtol: Any = None) -> LazyArray:
        """Pseudo-inverse; singular values at most ``rtol`` times the largest count as zero (default
        ``max(M, N) * eps``).

        >>> import opgraph.numpy as onp
        >>> onp.linalg.pinv(onp.asarray([[2.0, 0.0], [0.0, 1e-20]]), rtol=1e-10).eval()
        array([[0.5, 0. ],
               [0. , 0. ]])
        """
        if rtol is None or isinstance(rtol, float | int | np.floating | np.integer):
            return apply("pinv", x, rtol=None if rtol is None else float(rtol))
        # one rtol per matrix: cut the SVD's singular values by hand
        x = _inexact(x)
        u, s, vh = apply("svd", x, full_matrices=False)
        cutoff = apply("multiply", max(s, axis=-1, keepdims=True), expand_dims(astype(as_lazy(rtol), s.dtype), axis=-1))
        keep = apply("greater", s, cutoff)
        s_inv = where(keep, apply("divide", 1, where(keep, s, ones((), dtype=s.dtype))), zeros((), dtype=s.dtype))
        vh_h = apply("conj", matrix_transpose(vh)) if vh.dtype.kind == "c" else matrix_transpose(vh)
        u_h = apply("conj", matrix_transpose(u)) if u.dtype.kind == "c" else matrix_transpose(u)
        return matmul(apply("multiply", vh_h, expand_dims(s_inv, axis=-2)), u_h)

    @staticmethod
    def eig(x: Any, /) -> EigResult:
        """Eigenvalues and eigenvectors (columns) of general square matrices, always complex.

        >>> import opgraph.numpy as onp
        >>> onp.linalg.eig(onp.asarray([[2.0, 0.0], [0.0, 3.0]])).eigenvalues.eval()
        array([2.+0.j, 3.+0.j])
        """
        return EigResult(*apply("eig", x))

    @staticmethod
    def eigvals(x: Any, /) -> LazyArray:
        """Eigenvalues of general square matrices (complex).

        >>> import opgraph.numpy as onp
        >>> onp.linalg.eigvals(onp.asarray([[0.0, 1.0], [-1.0, 0.0]])).eval()
        array([0.+1.j, 0.-1.j])
        """
        return apply("eig", x)[0]

    @staticmethod
    def cross(x1: Any, x2: Any, /, *, axis: int = -1) -> LazyArray:
        """Cross product of 3-vectors along ``axis`` (the other axes broadcast).

        >>> import opgraph.numpy as onp
        >>> onp.linalg.cross(onp.asarray([1, 0, 0]), onp.asarray([0, 1, 0])).eval()
        array([0, 0, 1])
        """
        a, b = as_lazy(x1, [x2]), as_lazy(x2, [x1])
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError("cross needs arrays of at least one dimension")
        if not (-a.ndim <= axis < a.ndim and -b.ndim <= axis < b.ndim):
            raise IndexError(f"axis {axis} is out of bounds")
        if a.shape[axis] != 3 or b.shape[axis] != 3:
            raise ValueError(f"cross needs vectors of size 3 along axis {axis}, got {a.shape[axis]} and "
                             f"{b.shape[axis]}")
        a, b = moveaxis(a, axis, -1), moveaxis(b, axis, -1)
        c = [apply("subtract", apply("multiply", a[..., i], b[..., j]), apply("multiply", a[..., j], b[..., i]))
             for i, j in ((1, 2), (2, 0), (0, 1))]
        out = stack(c, axis=-1)
        return moveaxis(out, -1, axis) if axis not in (-1, out.ndim - 1) else out

    @staticmethod
    def diagonal(x: Any, /, *, offset: int = 0) -> LazyArray:
        """The ``offset`` diagonal of the last two axes (above the main one when ``offset > 0``).

        >>> import opgraph.numpy as onp
        >>> onp.linalg.diagonal(onp.arange(9).reshape(3, 3), offset=1).eval()
        array([1, 5])
        """
        x = as_lazy(x)
        if x.ndim < 2:
            raise ValueError("diagonal needs a matrix or a stack of matrices")
        m, n = x.shape[-2], x.shape[-1]
        rows = np.arange(_builtins.max(0, -offset), m)
        cols = rows + offset
        keep = (cols >= 0) & (cols < n)
        rows, cols = rows[keep], cols[keep]
        return getitem(x, (..., constant(rows.astype(np.int64)), constant(cols.astype(np.int64))))

    @staticmethod
    def matrix_power(x: Any, n: int, /) -> LazyArray:
        """``x`` multiplied by itself ``n`` times (by squaring); ``n < 0`` powers the inverse, ``n = 0`` is I.

        >>> import opgraph.numpy as onp
        >>> onp.linalg.matrix_power(onp.asarray([[1, 1], [0, 1]]), 3).eval()
        array([[1, 3],
               [0, 1]])
        """
        x = as_lazy(x)
        n = int(n)
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise ValueError(f"matrix_power needs square matrices, got shape {x.shape}")
        if n == 0:
            eye_ = constant(np.eye(x.shape[-1], dtype=x.dtype))
            return broadcast_to(eye_, x.shape) if x.ndim > 2 else eye_
        if n < 0:
            x, n = linalg.inv(x), -n
        result = None
        power = x
        while n:
            if n & 1:
                result = power if result is None else matmul(result, power)
            n >>= 1
            if n:
                power = matmul(power, power)
        assert result is not None
        return result

    @staticmethod
    def matrix_rank(x: Any, /, *, rtol: Any = None) -> LazyArray:
        """Number of singular values above ``rtol`` times the largest (default ``max(M, N) * eps``).

        >>> import opgraph.numpy as onp
        >>> onp.linalg.matrix_rank(onp.asarray([[1.0, 2.0], [2.0, 4.0]])).eval()
        array(1)
        """
        x = _inexact(x)
        if x.ndim < 2:
            raise ValueError("matrix_rank needs a matrix or a stack of matrices")
        s = linalg.svdvals(x)
        if rtol is None:
            rtol = _builtins.max(x.shape[-2], x.shape[-1]) * np.finfo(s.dtype).eps
        rtol = as_lazy(rtol, [s])
        if rtol.ndim:
            rtol = expand_dims(rtol, axis=-1)
        tol = apply("multiply", max(s, axis=-1, keepdims=True), rtol)
        return sum(apply("greater", s, tol).astype(np.int64), axis=-1)

    @staticmethod
    def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> LazyArray:
        """NumPy's ``linalg.norm``: vector norms over one axis, matrix norms over two, built from differentiable ops.

        ``ord`` for vectors: None/2, 1, inf, -inf, 0 or any p; for matrices:
        None/'fro', 'nuc', 1, -1, 2, -2 (via singular values), inf, -inf.
        Integers are computed in float64, as NumPy does.

        >>> import opgraph.numpy as onp
        >>> onp.linalg.norm(onp.asarray([3.0, 4.0])).eval()
        array(5.)
        >>> onp.linalg.norm(onp.asarray([[1.0, -2.0], [3.0, 4.0]]), ord=1).eval()
        array(6.)
        """
        x = _inexact(x)
        if axis is None:
            if ord is None:  # the 2-norm of the flattened array, whatever its rank
                return _vector_norm(x, None, keepdims, 2)
            if x.ndim not in (1, 2):
                raise ValueError("Improper number of dimensions to norm.")
            axis = tuple(range(x.ndim))
        axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
        if len(axes) == 1:
            return _vector_norm(x, axes[0], keepdims, 2 if ord is None else ord)
        if len(axes) == 2:
            return _matrix_norm(x, (int(axes[0]), int(axes[1])), keepdims, ord)
        raise ValueError("Improper number of dimensions to norm.")

    @staticmethod
    def vector_norm(x: Any, /, *, axis: Any = None, keepdims: bool = False, ord: Any = 2) -> LazyArray:
        """Array API ``vector_norm``: a vector norm over ``axis`` (an int, a tuple, or None for all axes).

        >>> import opgraph.numpy as onp
        >>> onp.linalg.vector_norm(onp.ones((2, 2)), ord=1).eval()
        array(4.)
        """
        return _vector_norm(_inexact(x), axis, keepdims, ord)

    @staticmethod
    def matrix_norm(x: Any, /, *, keepdims: bool = False, ord: Any = "fro") -> LazyArray:
        """Array API ``matrix_norm``: a matrix norm over the last two axes.

        >>> import opgraph.numpy as onp
        >>> onp.linalg.matrix_norm(2 * onp.eye(3), ord=2).eval()
        array(2.)
        """
        return _matrix_norm(_inexact(x), (-2, -1), keepdims, ord)

    @staticmethod
    def trace(x: Any, /, *, offset: int = 0, dtype: Any = None) -> LazyArray:
        """Array API ``trace``: sums of the ``offset`` diagonal of the last two axes.

        >>> import opgraph.numpy as onp
        >>> onp.linalg.trace(onp.asarray([[1, 2], [3, 4]])).eval()
        array(5)
        """
        x = _in_dtype(x, dtype)
        mask = np.eye(x.shape[-2], x.shape[-1], k=offset, dtype=np.bool_)
        return sum(where(mask, x, zeros((), dtype=x.dtype)), axis=(-2, -1))

    matmul = staticmethod(matmul)
    tensordot = staticmethod(tensordot)
    vecdot = staticmethod(vecdot)
    outer = staticmethod(outer)
    matrix_transpose = staticmethod(matrix_transpose)


linalg = _Linalg()


__all__ += [n for n in list(globals()) if not n.startswith("_") and n not in __all__
            and n not in ("annotations", "Any", "NamedTuple", "Sequence", "np", "all_ops", "apply", "as_lazy",
                          "constant")]
