"""Tensor types: a dtype plus a static, partly dynamic, or unknown-rank shape.

    >>> from opgraph.core.types import TensorType
    >>> t = TensorType("float32", (2, None))
    >>> t
    f32[2,?]
    >>> t.is_static, t.rank
    (False, 2)
    >>> TensorType("int64", None)
    i64[...]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opgraph.core.dtypes import as_dtype
from opgraph.errors import OpTypeError

Shape = tuple[int | None, ...] | None

INT64_MAX = 2**63 - 1
"""The largest dim, element count or byte size a type may have: sizes are int64 in NumPy, files and plans."""

_SHORT = {
    "bool": "bool",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
    "complex64": "c64",
    "complex128": "c128",
}


def _norm_shape(shape: Any) -> Shape:
    if shape is None:
        return None
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    out: list[int | None] = []
    for d in shape:
        if d is None or (isinstance(d, (int, np.integer)) and int(d) == -1):
            out.append(None)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:
            out.append(int(d))
        else:
            raise OpTypeError(f"invalid dimension {d!r} in shape {shape!r}")
    return tuple(out)


def _check_size(shape: tuple[int | None, ...], itemsize: int, dtype: np.dtype) -> None:
    """Reject shapes whose dims, element count or bytes do not fit in int64 (Python ints: no wrap-around).

    With unknown dims the known ones are checked: an array of that shape could only exist with a 0 dim.
    """
    known = [d for d in shape if d is not None]
    count = math.prod(known)
    if count * max(itemsize, 1) <= INT64_MAX and all(d <= INT64_MAX for d in known):
        return
    shown = shape_str(shape)
    big = max(known)
    if big > INT64_MAX:
        raise OpTypeError(f"shape {shown} has a dimension of {big}, more than 2**63-1")
    if count > INT64_MAX:
        raise OpTypeError(f"shape {shown} has {count} elements, more than 2**63-1")
    raise OpTypeError(f"shape {shown} of {dtype.name} takes {count * itemsize} bytes, more than 2**63-1")


@dataclass(frozen=True, slots=True)
class TensorType:
    """The type of a tensor value: dtype and shape.

    ``shape`` is a tuple whose entries are ints (known dims) or ``None``
    (unknown dims; ``-1`` is read as ``None``), or ``None`` for a tensor of
    unknown rank. Dims, the element count (product of the known dims) and
    the byte size must fit in int64 (at most ``2**63-1``), else
    :class:`~opgraph.errors.OpTypeError` names the shape (the builder
    re-raises it as an ``OpBuildError`` naming the op and the user's line).

    >>> TensorType(float, (3,)).dtype
    dtype('float64')
    >>> TensorType("float64", (2**62,))
    Traceback (most recent call last):
    ...
    opgraph.errors.OpTypeError: shape [4611686018427387904] of float64 takes 36893488147419103232 bytes, more ...
    """

    dtype: np.dtype
    shape: Shape

    def __init__(self, dtype: Any, shape: Any = ()) -> None:
        dt = as_dtype(dtype)
        shp = _norm_shape(shape)
        if shp is not None:
            _check_size(shp, dt.itemsize, dt)
        object.__setattr__(self, "dtype", dt)
        object.__setattr__(self, "shape", shp)

    @property
    def rank(self) -> int | None:
        """Number of dimensions, or None when unknown."""
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when every dimension is known."""
        return self.shape is not None and all(d is not None for d in self.shape)

    @property
    def size(self) -> int | None:
        """Number of elements, or None when some dimension is unknown."""
        if not self.is_static:
            return None
        return math.prod(self.shape)  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int | None:
        """Bytes of a C-contiguous array of this type, or None when not static."""
        size = self.size
        return None if size is None else size * self.dtype.itemsize

    def with_shape(self, shape: Any) -> TensorType:
        """Same dtype, another shape.

        >>> TensorType("f4", (2,)).with_shape((3, 4))
        f32[3,4]
        """
        return TensorType(self.dtype, shape)

    def with_dtype(self, dtype: Any) -> TensorType:
        """Same shape, another dtype.

        >>> TensorType("f4", (2,)).with_dtype("int8")
        i8[2]
        """
        return TensorType(dtype, self.shape)

    def accepts(self, array: np.ndarray) -> bool:
        """True when a concrete array has this dtype and a shape this type allows.

        >>> TensorType("f8", (None, 3)).accepts(np.zeros((5, 3)))
        True
        """
        if np.dtype(array.dtype) != self.dtype:
            return False
        if self.shape is None:
            return True
        if array.ndim != len(self.shape):
            return False
        return all(d is None or d == s for d, s in zip(self.shape, array.shape, strict=True))

    @staticmethod
    def of(array: Any) -> TensorType:
        """The static type of a concrete array.

        >>> TensorType.of(np.zeros((2, 3), np.int32))
        i32[2,3]
        """
        a = np.asarray(array)
        return TensorType(a.dtype, a.shape)

    def __repr__(self) -> str:
        name = _SHORT[self.dtype.name]
        if self.shape is None:
            return f"{name}[...]"
        return name + "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict; inverse of :meth:`from_json`.

        >>> TensorType.from_json(TensorType("f4", (2, None)).to_json())
        f32[2,?]
        """
        return {"dtype": self.dtype.name, "shape": None if self.shape is None else list(self.shape)}

    @staticmethod
    def from_json(obj: dict[str, Any]) -> TensorType:
        """Rebuild a type written by :meth:`to_json`."""
        return TensorType(obj["dtype"], obj["shape"])


@dataclass(frozen=True, slots=True)
class VoidType:
    """The type of a value that carries no data (an ordering token).

    >>> VOID
    void
    """

    def __repr__(self) -> str:
        return "void"

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {"void": True}


VOID = VoidType()
ValueType = TensorType | VoidType


def broadcast_shapes(*shapes: Shape) -> Shape:
    """Broadcast shapes by NumPy's rules, allowing unknown dims and ranks.

    >>> broadcast_shapes((2, 1), (3,))
    (2, 3)
    >>> broadcast_shapes((None, 1), (4,))
    (None, 4)
    >>> broadcast_shapes((2,), (3,))
    Traceback (most recent call last):
    ...
    opgraph.errors.OpTypeError: shapes (2,) and (3,) do not broadcast
    """
    if any(s is None for s in shapes):
        return None
    ndim = max((len(s) for s in shapes), default=0)  # type: ignore[arg-type]
    result: list[int | None] = []
    for axis in range(ndim):
        dims = [s[len(s) - ndim + axis] for s in shapes if len(s) - ndim + axis >= 0]  # type: ignore[arg-type]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            shown = " and ".join(str(tuple(s)) for s in shapes)  # type: ignore[arg-type]
            raise OpTypeError(f"shapes {shown} do not broadcast")
        if known:
            result.append(known.pop())
        elif any(d is None for d in dims):
            result.append(None)
        else:
            result.append(1)
    return tuple(result)


def normalize_axes(axes: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """Turn possibly negative axes into sorted non-negative ones; None means all.

    >>> normalize_axes(None, 2), normalize_axes((-1, 0), 3)
    ((0, 1), (0, 2))
    """
    if axes is None:
        return tuple(range(rank))
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise OpTypeError(f"axis {a} is out of bounds for rank {rank}")
        out.append(a % rank if rank else a)
    if len(set(out)) != len(out):
        raise OpTypeError(f"repeated axis in {tuple(axes)}")
    return tuple(sorted(out))


def as_type(value: Any) -> ValueType:
    """Coerce ``TensorType``, ``VOID``, ``(dtype, shape)`` pairs or arrays to a type.

    >>> as_type(("int32", (3,)))
    i32[3]
    """
    if isinstance(value, (TensorType, VoidType)):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return TensorType(value[0], value[1])
    if isinstance(value, np.ndarray):
        return TensorType.of(value)
    raise OpTypeError(f"cannot make a type from {value!r}")


def is_shape(x: Any) -> bool:
    """An int, or a tuple or list of ints and None: what no dtype is."""
    if isinstance(x, (tuple, list)):
        return all(d is None or (isinstance(d, (int, np.integer)) and not isinstance(d, bool)) for d in x)
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def is_dtype(x: Any) -> bool:
    """Something NumPy takes as a dtype (a name, ``np.dtype``, a type) and no shape; None is neither here
    (NumPy reads it as float64, opgraph as "no shape given")."""
    if x is None or is_shape(x):
        return False
    try:
        np.dtype(x)
    except (TypeError, ValueError):
        return False
    return True


def dtype_and_shape(dtype: Any, shape: Any) -> tuple[Any, Any]:
    """``(dtype, shape)`` from two arguments given in either order.

    A shape (an int, or a tuple or list of ints and None) and a dtype (a name, ``np.dtype`` or type) are never
    taken for each other, so ``GraphBuilder.input`` (dtype first) and ``opgraph.numpy.placeholder`` (shape first)
    put a swapped pair right; anything else is returned as given, for the type's own checks to name.

    >>> dtype_and_shape((2, 3), "float64"), dtype_and_shape("float32", (None, 3))
    (('float64', (2, 3)), ('float32', (None, 3)))
    >>> dtype_and_shape(3, np.dtype("int8")), dtype_and_shape((2, 3), None)
    ((dtype('int8'), 3), ((2, 3), None))
    """
    if is_shape(dtype) and is_dtype(shape):
        return shape, dtype
    return dtype, shape


def shape_str(shape: Sequence[int | None] | None) -> str:
    """Render a shape the way types print it.

    >>> shape_str((2, None))
    '[2,?]'
    """
    if shape is None:
        return "[...]"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"
