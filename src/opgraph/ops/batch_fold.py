"""Moving and folding ``vmap``'s batch axis, for the batching rules of the indexing, nn, linalg, signal and control
families.

A batching rule (:class:`opgraph.core.registry.OpDef`'s ``batch``) gets its batched inputs with the batch axis
first. Many ops already have a batch axis of their own (a convolution's N, a matrix function's leading dims);
their rules fold ``vmap``'s axis into it (:func:`fold`), run the op once, and split it out again
(:func:`unfold`). Rules that need every input batched broadcast the others (:func:`with_batch`).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2, 3, 4)), name="x")
    >>> folded = fold(b, x)
    >>> folded.type, unfold(b, folded, 2).type
    (f64[6,4], f64[2,3,4])
    >>> with_batch(b, b.input(("float64", (4,))), False, 5).type
    f64[5,4]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opgraph.core.types import TensorType
from opgraph.errors import OpTypeError


def static(t: TensorType, what: str = "batching") -> tuple[int, ...]:
    """The shape of ``t``, which must be fully known (:class:`OpTypeError` otherwise).

    >>> static(TensorType("float64", (2, 3)))
    (2, 3)
    """
    if t.shape is None or any(d is None for d in t.shape):
        raise OpTypeError(f"{what} needs a static shape, got {t}")
    return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]


def example_shape(x: Any, batched: bool) -> tuple[int, ...]:
    """The shape of one example of ``x`` (without the batch axis where ``batched``).

    >>> import opgraph
    >>> example_shape(opgraph.GraphBuilder().input(("float64", (5, 2))), True)
    (2,)
    """
    shape = static(x.type)
    return shape[1:] if batched else shape


def with_batch(b: Any, x: Any, batched: bool, size: int) -> Any:
    """``x`` with a leading batch axis of ``size``: itself when ``batched``, else broadcast along a new one."""
    if batched:
        return x
    shape = static(x.type)
    return b.op("broadcast_to", b.op("expand_dims", x, axis=0), shape=(size, *shape))


def fold(b: Any, x: Any) -> Any:
    """Merge the two leading axes of ``x`` into one (``(B, N, ...) -> (B * N, ...)``)."""
    shape = static(x.type)
    return b.op("reshape", x, shape=(shape[0] * shape[1], *shape[2:]))


def unfold(b: Any, y: Any, size: int) -> Any:
    """Split the leading axis of ``y`` into ``(size, rest)`` (undoes :func:`fold`)."""
    shape = static(y.type)
    return b.op("reshape", y, shape=(size, shape[0] // size, *shape[1:]))


def axis_in_batched(axis: int, rank: int) -> int:
    """Where axis ``axis`` of an unbatched value of rank ``rank`` is once a batch axis leads.

    >>> axis_in_batched(-1, 3), axis_in_batched(0, 3)
    (3, 1)
    """
    if not -rank <= axis < rank:
        raise OpTypeError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank + 1


def lead_to(b: Any, x: Any, position: int) -> Any:
    """Move the leading axis of ``x`` to ``position`` (the others keep their order)."""
    if position == 0:
        return x
    return b.op("moveaxis", x, source=(0,), destination=(position,))


def to_lead(b: Any, x: Any, position: int) -> Any:
    """Move axis ``position`` of ``x`` to the front (undoes :func:`lead_to`)."""
    if position == 0:
        return x
    return b.op("moveaxis", x, source=(position,), destination=(0,))


def all_batched(b: Any, inputs: Sequence[Any], batched: Sequence[bool], size: int) -> list[Any]:
    """Every input with a leading batch axis (:func:`with_batch` on each)."""
    return [with_batch(b, x, f, size) for x, f in zip(inputs, batched, strict=True)]
