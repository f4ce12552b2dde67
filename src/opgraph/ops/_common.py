"""Shared helpers for op families: type-rule pieces and kernel adapters.

    >>> from opgraph.ops._common import normalize_axis
    >>> normalize_axis(-1, 3)
    2
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from opgraph.core.dtypes import dtype_code
from opgraph.core.registry import Emit
from opgraph.core.types import Shape, TensorType, ValueType
from opgraph.errors import OpTypeError


def tensor(t: ValueType, what: str = "input") -> TensorType:
    """Check that a type is a tensor type (not void) and return it."""
    if not isinstance(t, TensorType):
        raise OpTypeError(f"{what} must be a tensor, got {t}")
    return t


def normalize_axis(axis: int, rank: int) -> int:
    """One possibly negative axis to a non-negative one.

    >>> normalize_axis(-1, 3)
    2
    """
    if not -rank <= axis < rank:
        raise OpTypeError(f"axis {axis} is out of bounds for rank {rank}")
    return axis % rank


def write_out(result: Any, out: Any) -> Any:
    """Copy a computed result into a preallocated ``out`` (array or tuple), if given.

    Kernels whose NumPy function has no ``out=`` use this so every kernel
    honours the same contract.

    >>> buf = np.empty(2)
    >>> write_out(np.array([1.0, 2.0]), buf) is buf
    True
    """
    if out is None:
        return result
    if isinstance(out, tuple):
        for o, r in zip(out, result, strict=True):
            np.copyto(o, r, casting="unsafe")
        return out
    np.copyto(out, result, casting="unsafe")
    return out


def with_out(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fn(*arrays, **attrs)`` into a kernel that accepts ``out=``.

    >>> k = with_out(lambda x: x[::-1])
    >>> buf = np.empty(3)
    >>> k(np.arange(3.0), out=buf) is buf
    True
    """

    def kernel(*args: Any, out: Any = None, **attrs: Any) -> Any:
        return write_out(fn(*args, **attrs), out)

    kernel.__name__ = getattr(fn, "__name__", "kernel")
    kernel.__doc__ = fn.__doc__
    return kernel


def ufunc_dtypes(ufunc: np.ufunc, dtypes: Sequence[np.dtype]) -> tuple[np.dtype, ...]:
    """The output dtypes NumPy's ``ufunc`` gives for inputs of ``dtypes``.

    >>> ufunc_dtypes(np.add, [np.dtype("int8"), np.dtype("float16")])
    (dtype('float16'),)
    >>> ufunc_dtypes(np.absolute, [np.dtype("complex64")])
    (dtype('float32'),)
    """
    try:
        resolved = ufunc.resolve_dtypes(tuple(dtypes) + (None,) * ufunc.nout)
    except TypeError as exc:  # NumPy raises a TypeError subclass when no loop exists
        names = ", ".join(str(d) for d in dtypes)
        raise OpTypeError(f"not defined for dtype(s) {names}") from exc
    return tuple(resolved[ufunc.nin:])


def same_shape(t: TensorType) -> Shape:
    """Shape of an elementwise unary result (the input's)."""
    return t.shape


def num_elements(shape: Shape) -> int | None:
    """Number of elements: 0 if a known dim is 0 (whatever the others), None if unknown.

    >>> num_elements((2, 3)), num_elements((None, 0)), num_elements((None, 2))
    (6, 0, None)
    """
    if shape is None:
        return None
    if any(d == 0 for d in shape):
        return 0
    if any(d is None for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64))


def version_of_first(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> int:
    """Version: the code of the first input's dtype, for ops whose output has that dtype whatever the others'
    (indices, grids) are.

    >>> version_of_first((TensorType("float32", (2,)), TensorType("int64", (1,))), {})
    11
    """
    return dtype_code(tensor(in_types[0]).dtype)


def const_like(e: Emit, x: float, like: Any) -> Any:
    """The scalar ``x`` as a constant of a decomposition, in the dtype of value ``like``.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); v = b.input(("float32", (2,)))
    >>> b.type_of(const_like(b, 0.5, v)).dtype
    dtype('float32')
    """
    return e.constant(np.asarray(x, dtype=tensor(e.type_of(like)).dtype))
