"""The rest of the Array API 2025.12 namespace over lazy arrays: sorting, sets, searching, utilities,
``__array_namespace_info__``, DLPack and the ``fft`` extension.

:mod:`opgraph.numpy` exports these beside :mod:`opgraph.frontend.api`.
Data-dependent results (``unique_*``, ``nonzero``) have dynamic dims: their
``shape`` says ``None`` inside a traced function and the real size when
the array can be computed.

    >>> import opgraph.numpy as onp
    >>> x = onp.asarray([3, 1, 3, 2])
    >>> onp.sort(x).eval()
    array([1, 2, 3, 3])
    >>> onp.unique_counts(x).counts.eval()
    array([1, 1, 2])
    >>> onp.searchsorted(onp.asarray([1, 2, 3]), onp.asarray([2, 5])).eval()
    array([1, 3])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from opgraph.core import types as core_types
from opgraph.errors import OpTypeError
from opgraph.frontend import api
from opgraph.frontend.indexing import nonzero_rows
from opgraph.frontend.lazy import LazyArray, apply, as_lazy, constant

__all__ = [
    "UniqueAllResult", "UniqueCountsResult", "UniqueInverseResult", "__array_namespace_info__", "argsort",
    "broadcast_shapes", "count_nonzero", "diff", "fft", "from_dlpack", "isin", "meshgrid", "nonzero", "searchsorted",
    "sort", "take_along_axis", "unique_all", "unique_counts", "unique_inverse", "unique_values",
]

_DEFAULT_INT = np.dtype(np.int64)


# ---------------------------------------------------------------- sorting
def _sort_along(x: Any, axis: int, descending: bool) -> tuple[LazyArray, LazyArray]:
    x = as_lazy(x)
    if x.ndim == 0:
        raise IndexError("sort of a 0-d array: there is no axis to sort along")
    return apply("sort", x, axis=axis, descending=descending)


def sort(x: Any, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> LazyArray:
    """Sorted copy along ``axis`` (always stable; NaN sorts last, first when ``descending``).

    >>> import opgraph.numpy as onp
    >>> sort(onp.asarray([2.0, onp.nan, 1.0]), descending=True).eval()
    array([nan,  2.,  1.])
    """
    return _sort_along(x, axis, descending)[0]


def argsort(x: Any, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> LazyArray:
    """Indices that sort ``x`` along ``axis`` (stable: equal values keep their order, in both directions).

    >>> import opgraph.numpy as onp
    >>> argsort(onp.asarray([2, 1, 2]), descending=True).eval()
    array([0, 2, 1])
    """
    return _sort_along(x, axis, descending)[1]


# ---------------------------------------------------------------- sets
class UniqueAllResult(NamedTuple):
    """Distinct values, first indices, inverse indices (``x``'s shape) and counts."""

    values: LazyArray
    indices: LazyArray
    inverse_indices: LazyArray
    counts: LazyArray


class UniqueCountsResult(NamedTuple):
    """Distinct values and their counts."""

    values: LazyArray
    counts: LazyArray


class UniqueInverseResult(NamedTuple):
    """Distinct values and, for each element of ``x``, the index of its value."""

    values: LazyArray
    inverse_indices: LazyArray


def unique_all(x: Any, /) -> UniqueAllResult:
    """Distinct values (ascending; each NaN distinct) with first indices, inverse indices and counts.

    >>> import opgraph.numpy as onp
    >>> unique_all(onp.asarray([2, 1, 2])).indices.eval()
    array([1, 0])
    """
    return UniqueAllResult(*apply("unique", x))


def unique_counts(x: Any, /) -> UniqueCountsResult:
    """Distinct values and how often each occurs.

    >>> import opgraph.numpy as onp
    >>> unique_counts(onp.asarray([2, 1, 2])).counts.eval()
    array([1, 2])
    """
    values, _, _, counts = apply("unique", x)
    return UniqueCountsResult(values, counts)


def unique_inverse(x: Any, /) -> UniqueInverseResult:
    """Distinct values and the index of each element's value (``values[inverse] == x``).

    >>> import opgraph.numpy as onp
    >>> unique_inverse(onp.asarray([[2, 1], [1, 1]])).inverse_indices.eval()
    array([[1, 0],
           [0, 0]])
    """
    values, _, inverse, _ = apply("unique", x)
    return UniqueInverseResult(values, inverse)


def unique_values(x: Any, /) -> LazyArray:
    """Distinct values, ascending (a dynamic dim).

    >>> import opgraph.numpy as onp
    >>> unique_values(onp.asarray([3, 1, 3])).eval()
    array([1, 3])
    """
    return apply("unique", x)[0]


def isin(x1: Any, x2: Any, /, *, invert: bool = False) -> LazyArray:
    """For each element of ``x1``, whether it equals some element of ``x2`` (NaN equals nothing).

    Recorded as a sort of ``x2``, a ``searchsorted`` and a comparison: O((n + m) log m), not an n-by-m table.

    >>> import opgraph.numpy as onp
    >>> isin(onp.asarray([1, 2, 3]), onp.asarray([3, 1])).eval()
    array([ True, False,  True])
    """
    a, b = as_lazy(x1, [x2]), as_lazy(x2, [x1])
    if b.size == 0 or a.size == 0:
        return api.full(a.shape, bool(invert), dtype=np.bool_)
    common = np.result_type(a.dtype, b.dtype)
    a, b = api.astype(a, common, copy=False), api.astype(b, common, copy=False)
    table = sort(api.reshape(b, (-1,)))
    pos = apply("searchsorted", table, a)
    last = b.size - 1 if b.size is not None else apply("subtract", apply("shape", table)[0], 1)
    found = apply("equal", apply("take", table, api.minimum(pos, last), axis=0), a)
    return apply("logical_not", found) if invert else found


# ---------------------------------------------------------------- searching
def nonzero(x: Any, /) -> tuple[LazyArray, ...]:
    """Indices of the non-zero elements, one int64 array per axis (row-major order; a dynamic dim).

    >>> import opgraph.numpy as onp
    >>> [i.eval() for i in nonzero(onp.asarray([[0, 1], [2, 0]]))]
    [array([0, 1]), array([1, 0])]
    """
    x = as_lazy(x)
    if x.ndim == 0:
        raise ValueError("nonzero of a 0-d array is not defined")
    return nonzero_rows(x)


def count_nonzero(x: Any, /, *, axis: Any = None, keepdims: bool = False) -> LazyArray:
    """How many elements are non-zero, over ``axis`` (the default integer dtype).

    >>> import opgraph.numpy as onp
    >>> count_nonzero(onp.asarray([[0, 1], [2, 3]]), axis=1).eval()
    array([1, 2])
    """
    nz = apply("not_equal", x, 0)
    return apply("sum", api.astype(nz, _DEFAULT_INT), axis=axis, keepdims=keepdims)


def searchsorted(x1: Any, x2: Any, /, *, side: str = "left", sorter: Any = None) -> LazyArray:
    """Insertion points of ``x2`` into the ascending 1-D ``x1`` (``sorter`` sorts ``x1`` first), int64.

    >>> import opgraph.numpy as onp
    >>> searchsorted(onp.asarray([1, 3, 3]), onp.asarray([3]), side="right").eval()
    array([3])
    """
    a = as_lazy(x1)
    if a.ndim != 1:
        raise ValueError(f"searchsorted needs a 1-D sorted array, got {a.ndim}-D")
    if sorter is not None:
        a = apply("take", a, sorter, axis=0)
    v = as_lazy(x2, [a])
    common = np.result_type(a.dtype, v.dtype)
    return apply("searchsorted", api.astype(a, common, copy=False), api.astype(v, common, copy=False), side=side)


# ---------------------------------------------------------------- utilities and manipulation
def diff(x: Any, /, *, axis: int = -1, n: int = 1, prepend: Any = None, append: Any = None) -> LazyArray:
    """The ``n``-th forward difference along ``axis``, after joining ``prepend`` and ``append``.

    >>> import opgraph.numpy as onp
    >>> diff(onp.asarray([1, 4, 9, 16]), n=2).eval()
    array([2, 2])
    """
    x = as_lazy(x)
    if x.ndim == 0:
        raise ValueError("diff needs an array of at least one dimension")
    if n < 0:
        raise ValueError(f"order must be non-negative, got n={n}")
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = api.concat([as_lazy(p, [x]) for p in parts], axis=axis)
    ax = axis % x.ndim
    for _ in range(n):
        head = (slice(None),) * ax
        after = x[(*head, slice(1, None))]
        before = x[(*head, slice(None, -1))]
        x = apply("not_equal", after, before) if x.dtype == np.bool_ else apply("subtract", after, before)
    return x


def meshgrid(*arrays: Any, indexing: str = "xy") -> tuple[LazyArray, ...]:
    """Coordinate grids from 1-D arrays (``indexing`` 'xy': Cartesian, 'ij': matrix).

    >>> import opgraph.numpy as onp
    >>> [g.shape for g in meshgrid(onp.arange(3), onp.arange(2))]
    [(2, 3), (2, 3)]
    """
    if indexing not in ("xy", "ij"):
        raise ValueError(f"indexing must be 'xy' or 'ij', got {indexing!r}")
    xs = [as_lazy(a) for a in arrays]
    if any(a.ndim != 1 for a in xs):
        raise ValueError("meshgrid takes 1-D arrays")
    if len({a.dtype for a in xs}) > 1:
        raise ValueError("meshgrid's arrays must have the same dtype")
    sizes = [a.shape[0] for a in xs]
    if indexing == "xy" and len(xs) > 1:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    grids = []
    for i, a in enumerate(xs):
        pos = (1 if i == 0 else 0 if i == 1 else i) if indexing == "xy" and len(xs) > 1 else i
        shape = [1] * len(xs)
        shape[pos] = a.shape[0]
        grids.append(api.broadcast_to(api.reshape(a, tuple(shape)), tuple(sizes)))
    return tuple(grids)


def broadcast_shapes(*shapes: tuple[int | None, ...]) -> tuple[int | None, ...]:
    """The shape that ``shapes`` broadcast to (``None`` dims allowed), or ``ValueError``.

    >>> broadcast_shapes((2, 1), (3,))
    (2, 3)
    """
    try:
        out = core_types.broadcast_shapes(*(tuple(s) for s in shapes))
    except OpTypeError as exc:
        raise ValueError(str(exc)) from None
    return () if out is None else out


def take_along_axis(x: Any, indices: Any, /, *, axis: int = -1) -> LazyArray:
    """Values of ``x`` at ``indices`` along ``axis``; the other axes broadcast (``np.take_along_axis``).

    >>> import opgraph.numpy as onp
    >>> x = onp.asarray([[10, 30, 20]])
    >>> take_along_axis(x, argsort(x)).eval()
    array([[10, 20, 30]])
    """
    x, idx = as_lazy(x), as_lazy(indices)
    if x.ndim != idx.ndim:
        raise ValueError(f"x and indices must have the same rank, got {x.ndim} and {idx.ndim}")
    ax = axis % x.ndim
    xs, ids = list(x.shape), list(idx.shape)
    xs[ax] = ids[ax] = 1
    shape = broadcast_shapes(tuple(xs), tuple(ids))
    if tuple(xs) != shape:
        x = api.broadcast_to(x, tuple(x.shape[ax] if i == ax else d for i, d in enumerate(shape)))
    if tuple(ids) != shape:
        idx = api.broadcast_to(idx, tuple(idx.shape[ax] if i == ax else d for i, d in enumerate(shape)))
    return apply("gather_elements", x, idx, axis=ax)


# ---------------------------------------------------------------- DLPack
def from_dlpack(x: Any, /, *, device: Any = None, copy: bool | None = None) -> LazyArray:
    """A lazy constant from any DLPack producer (NumPy, PyTorch, JAX...), via ``np.from_dlpack``.

    >>> import numpy as np
    >>> from_dlpack(np.arange(3)).eval()
    array([0, 1, 2])
    """
    if isinstance(x, LazyArray):
        return x
    if device not in (None, "cpu"):
        raise ValueError(f"unsupported device {device!r}: opgraph's lazy arrays live on the CPU")
    return constant(np.from_dlpack(x, copy=copy))


# ---------------------------------------------------------------- inspection
class _Info:
    """What ``__array_namespace_info__()`` returns: the namespace's devices, dtypes and capabilities."""

    def capabilities(self) -> dict[str, Any]:
        """Boolean-mask indexing and data-dependent shapes are supported (dynamic dims); at most 64 dimensions,
        NumPy's limit, which its kernels (the reference engine) share."""
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self) -> str:
        """The only device, ``"cpu"``."""
        return "cpu"

    def devices(self) -> tuple[str, ...]:
        """``("cpu",)``: lazy arrays are evaluated by the engine the graph runs on, from the CPU."""
        return ("cpu",)

    def default_dtypes(self, *, device: Any = None) -> dict[str, np.dtype]:
        """float64, complex128, int64 and int64 for indices, as NumPy."""
        _check_device(device)
        return {"real floating": np.dtype(np.float64), "complex floating": np.dtype(np.complex128),
                "integral": _DEFAULT_INT, "indexing": _DEFAULT_INT}

    def dtypes(self, *, device: Any = None, kind: Any = None) -> dict[str, np.dtype]:
        """The supported dtypes by name, of one kind (or several) when ``kind`` is given."""
        _check_device(device)
        names = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
                 "float64", "complex64", "complex128"]
        out = {n: np.dtype(n) for n in names}
        if kind is None:
            return out
        return {n: d for n, d in out.items() if np.isdtype(d, kind)}


def _check_device(device: Any) -> None:
    if device not in (None, "cpu"):
        raise ValueError(f"unsupported device {device!r}")


def __array_namespace_info__() -> _Info:
    """The Array API inspection object.

    >>> __array_namespace_info__().capabilities()["data-dependent shapes"]
    True
    """
    return _Info()


# ---------------------------------------------------------------- fft extension
_NORMS = ("backward", "ortho", "forward")
_SWAP_NORM = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


def _norm(norm: str) -> str:
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
    return norm


def _complex(x: Any) -> LazyArray:
    x = as_lazy(x)
    if x.dtype.kind == "c":
        return x
    return api.astype(x, np.complex64 if x.dtype == np.float32 else np.complex128)


def _real(x: Any) -> LazyArray:
    x = as_lazy(x)
    if x.dtype.kind == "f":
        return x
    return api.astype(x, np.float64)


def _axes_and_sizes(x: LazyArray, s: Sequence[int] | None, axes: Sequence[int] | None) -> list[tuple[int, Any]]:
    if axes is None:
        axes = list(range(x.ndim)) if s is None else list(range(x.ndim - len(s), x.ndim))
    if s is not None and len(s) != len(axes):
        raise ValueError(f"s and axes have different lengths: {len(s)} and {len(axes)}")
    sizes = [None] * len(axes) if s is None else [None if n == -1 else n for n in s]
    return list(zip(axes, sizes, strict=True))


def _fft_axes(x: LazyArray, plan: list[tuple[int, Any]], norm: str, *, inverse: bool) -> LazyArray:
    """One complex ``fft`` op per (axis, length) of ``plan``."""
    for ax, size in plan:
        x = apply("fft", x, n=size, axis=ax, norm=_norm(norm), inverse=inverse)
    return x


class _FFT:
    """``opgraph.numpy.fft``: the Array API fft extension, recorded as opgraph's ``fft``/``rfft``/``irfft`` ops.

    >>> import opgraph.numpy as onp
    >>> onp.fft.fft(onp.asarray([1.0, 0.0, 0.0, 0.0])).eval()
    array([1.+0.j, 1.+0.j, 1.+0.j, 1.+0.j])
    """

    @staticmethod
    def fft(x: Any, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> LazyArray:
        """One-dimensional discrete Fourier transform."""
        return apply("fft", _complex(x), n=n, axis=axis, norm=_norm(norm), inverse=False)

    @staticmethod
    def ifft(x: Any, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> LazyArray:
        """One-dimensional inverse discrete Fourier transform."""
        return apply("fft", _complex(x), n=n, axis=axis, norm=_norm(norm), inverse=True)

    @staticmethod
    def fftn(x: Any, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
             norm: str = "backward") -> LazyArray:
        """n-dimensional discrete Fourier transform (one ``fft`` per axis)."""
        return _fft_axes(_complex(x), _axes_and_sizes(as_lazy(x), s, axes), norm, inverse=False)

    @staticmethod
    def ifftn(x: Any, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
              norm: str = "backward") -> LazyArray:
        """n-dimensional inverse discrete Fourier transform."""
        return _fft_axes(_complex(x), _axes_and_sizes(as_lazy(x), s, axes), norm, inverse=True)

    @staticmethod
    def rfft(x: Any, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> LazyArray:
        """Fourier transform of a real signal (the non-negative frequencies)."""
        return apply("rfft", _real(x), n=n, axis=axis, norm=_norm(norm))

    @staticmethod
    def irfft(x: Any, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> LazyArray:
        """Inverse of :meth:`rfft`: a real signal of length ``n`` (default ``2 * (m - 1)``)."""
        return apply("irfft", _complex(x), n=n, axis=axis, norm=_norm(norm))

    @staticmethod
    def rfftn(x: Any, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
              norm: str = "backward") -> LazyArray:
        """n-dimensional Fourier transform of a real signal: ``rfft`` on the last axis, ``fft`` on the others."""
        plan = _axes_and_sizes(as_lazy(x), s, axes)
        last_ax, last_n = plan[-1]
        return _fft_axes(apply("rfft", _real(x), n=last_n, axis=last_ax, norm=_norm(norm)), plan[:-1], norm,
                         inverse=False)

    @staticmethod
    def irfftn(x: Any, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
               norm: str = "backward") -> LazyArray:
        """Inverse of :meth:`rfftn`: ``ifft`` on all but the last axis, then ``irfft``."""
        plan = _axes_and_sizes(as_lazy(x), s, axes)
        last_ax, last_n = plan[-1]
        return apply("irfft", _fft_axes(_complex(x), plan[:-1], norm, inverse=True), n=last_n, axis=last_ax,
                     norm=_norm(norm))

    @staticmethod
    def hfft(x: Any, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> LazyArray:
        """Fourier transform of a Hermitian-symmetric signal given by its first half (real output)."""
        return apply("irfft", apply("conj", _complex(x)), n=n, axis=axis, norm=_SWAP_NORM[_norm(norm)])

    @staticmethod
    def ihfft(x: Any, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> LazyArray:
        """Inverse of :meth:`hfft`: the first half of the Hermitian spectrum of a real signal."""
        return apply("conj", apply("rfft", _real(x), n=n, axis=axis, norm=_SWAP_NORM[_norm(norm)]))

    @staticmethod
    def fftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, device: Any = None) -> LazyArray:
        """Sample frequencies of an ``n``-point transform (a constant)."""
        _check_device(device)
        return constant(np.fft.fftfreq(n, d).astype(dtype or np.float64))

    @staticmethod
    def rfftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, device: Any = None) -> LazyArray:
        """Non-negative sample frequencies of an ``n``-point real transform (a constant)."""
        _check_device(device)
        return constant(np.fft.rfftfreq(n, d).astype(dtype or np.float64))

    @staticmethod
    def fftshift(x: Any, /, *, axes: Any = None) -> LazyArray:
        """Move the zero frequency to the middle (a ``roll`` by half of each axis)."""
        return _shift(x, axes, forward=True)

    @staticmethod
    def ifftshift(x: Any, /, *, axes: Any = None) -> LazyArray:
        """Inverse of :meth:`fftshift`."""
        return _shift(x, axes, forward=False)


def _shift(x: Any, axes: Any, forward: bool) -> LazyArray:
    x = as_lazy(x)
    if axes is None:
        axes = tuple(range(x.ndim))
    elif isinstance(axes, int | np.integer):
        axes = (int(axes),)
    axes = tuple(axes)
    if not axes:
        return x
    shifts = tuple((x.shape[a] // 2) if forward else -(x.shape[a] // 2) for a in axes)
    return apply("roll", x, shift=shifts, axis=axes)


fft = _FFT()
