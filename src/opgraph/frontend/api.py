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
finfo, iinfo, result_type, can_cast = np.finfo, np.iinfo, np.result_type, np.can_cast


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
        return obj if dtype is None or np.dtype(dtype) == obj.dtype else obj.astype(dtype)
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
    return constant(np.arange(start, stop, step, dtype=dtype) if stop is not None else np.arange(start, dtype=dtype))


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
def sum(x: Any, /, *, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> LazyArray:
    """Sum over ``axis`` (all axes by default).

    >>> sum(asarray([[1, 2], [3, 4]]), axis=0).eval()
    array([4, 6])
    """
    x = as_lazy(x)
    if dtype is not None:
        x = x.astype(dtype)
    return apply("sum", x, axis=axis, keepdims=keepdims)


def prod(x: Any, /, *, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> LazyArray:
    """Product over ``axis``.

    >>> prod(asarray([2, 3])).eval()
    array(6)
    """
    x = as_lazy(x)
    if dtype is not None:
        x = x.astype(dtype)
    return apply("prod", x, axis=axis, keepdims=keepdims)


def _reduction(kind: str) -> Any:
    def fn(x: Any, /, *, axis: Any = None, keepdims: bool = False) -> LazyArray:
        return apply(kind, x, axis=axis, keepdims=keepdims)

    fn.__name__ = fn.__qualname__ = kind
    fn.__doc__ = f"Lazy ``{kind}`` over ``axis`` (all axes by default), NumPy semantics."
    return fn


max = _reduction("max")
min = _reduction("min")
mean = _reduction("mean")
any = _reduction("any")
all = _reduction("all")
logsumexp = _reduction("logsumexp")
amax, amin = max, min


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


def cumulative_sum(x: Any, /, *, axis: int | None = None, dtype: Any = None,
                   include_initial: bool = False) -> LazyArray:
    """Cumulative sum along ``axis``.

    >>> cumulative_sum(asarray([1, 2, 3])).eval()
    array([1, 3, 6])
    """
    x = as_lazy(x)
    if dtype is not None:
        x = x.astype(dtype)
    if axis is None and x.ndim > 1:
        raise ValueError("cumulative_sum needs an axis for arrays of more than one dimension")
    out = apply("cumsum", x, axis=0 if axis is None else axis)
    if include_initial:
        ax = 0 if axis is None else axis
        shape = list(out.shape)
        shape[ax] = 1
        out = concat([zeros(tuple(shape), dtype=out.dtype), out], axis=ax)
    return out


def cumsum(x: Any, /, axis: int | None = None) -> LazyArray:
    """NumPy's cumsum (flattened when ``axis`` is None).

    >>> cumsum(asarray([[1, 2], [3, 4]])).eval()
    array([ 1,  3,  6, 10])
    """
    return apply("cumsum", x, axis=axis)


def cumprod(x: Any, /, axis: int | None = None) -> LazyArray:
    """NumPy's cumprod.

    >>> cumprod(asarray([1, 2, 3])).eval()
    array([1, 2, 6])
    """
    return apply("cumprod", x, axis=axis)


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


def matrix_transpose(x: Any, /) -> LazyArray:
    """Swap the last two axes.

    >>> matrix_transpose(ones((2, 3, 4))).shape
    (2, 4, 3)
    """
    x = as_lazy(x)
    if x.ndim < 2:
        raise ValueError("matrix_transpose needs at least 2 dimensions")
    axes = (*range(x.ndim - 2), x.ndim - 1, x.ndim - 2)
    return apply("permute_dims", x, axes=axes)


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


def broadcast_arrays(*arrays: Any) -> list[LazyArray]:
    """Broadcast arrays against each other.

    >>> [a.shape for a in broadcast_arrays(ones((2, 1)), ones((3,)))]
    [(2, 3), (2, 3)]
    """
    from opgraph.core.types import broadcast_shapes

    lazies = [as_lazy(a) for a in arrays]
    shape = broadcast_shapes(*(a.shape for a in lazies))
    return [a if a.shape == shape else broadcast_to(a, shape) for a in lazies]


def expand_dims(x: Any, /, axis: Any = 0) -> LazyArray:
    """Insert size-1 axes.

    >>> expand_dims(ones((2,)), axis=0).shape
    (1, 2)
    """
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


def repeat(x: Any, repeats: int, /, *, axis: int | None = None) -> LazyArray:
    """Repeat each element.

    >>> repeat(asarray([1, 2]), 2).eval()
    array([1, 1, 2, 2])
    """
    return apply("repeat", x, repeats=repeats, axis=axis)


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
    """``x[key]``: basic indexing becomes a getitem op, one integer array a take.

    >>> getitem(arange(10), slice(None, None, -3)).eval()
    array([9, 6, 3, 0])
    """
    from opgraph.ops.shape import normalize_index

    x = as_lazy(x)
    if isinstance(key, (LazyArray, np.ndarray, list)):
        idx = as_lazy(np.asarray(key) if isinstance(key, list) else key)
        if idx.dtype == np.bool_:
            raise TypeError("boolean mask indexing has a data-dependent shape; use where() instead")
        return take(x, idx, axis=0)
    rank = x.type.rank
    return apply("getitem", x, index=normalize_index(key, rank))


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


class SlogdetResult(NamedTuple):
    """Sign and log of the absolute value of a determinant."""

    sign: LazyArray
    logabsdet: LazyArray


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
    def pinv(x: Any, /) -> LazyArray:
        """Pseudo-inverse."""
        return apply("pinv", x)

    matmul = staticmethod(matmul)
    tensordot = staticmethod(tensordot)
    vecdot = staticmethod(vecdot)
    outer = staticmethod(outer)
    matrix_transpose = staticmethod(matrix_transpose)


linalg = _Linalg()

__all__ += [n for n in list(globals()) if not n.startswith("_") and n not in __all__
            and n not in ("annotations", "Any", "NamedTuple", "Sequence", "np", "all_ops", "apply", "as_lazy",
                          "constant")]
