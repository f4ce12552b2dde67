"""Building blocks for batching rules (``vmap``), used by the op families in ``opgraph.ops``.

A batching rule is a function::

    rule(b, inputs, batched, size, attrs) -> list of outputs (or None: run the op once per example)

* ``b`` is an *emitter* (``b.op(kind, *values, **attrs)``, ``b.constant(array)``): a
  :class:`~opgraph.GraphBuilder`, or the lazy-array emitter of :mod:`opgraph.autodiff`;
* ``inputs``: the op's inputs; those flagged in ``batched`` carry a leading batch axis of
  ``size`` (the others are the op's per-example inputs, shared by every example);
* every output the rule returns carries a leading batch axis of ``size``.

The batch axis is always axis 0 inside the engine (:mod:`opgraph.autodiff.batching`), so a rule
only shifts the op's per-example axes by one and lines up operands of different ranks.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (5, 3)))      # 5 examples of shape (3,)
    >>> y = b.input(("float64", (2, 3)))      # shared, shape (2, 3)
    >>> bx, by = same_rank(b, [x, y], (True, False))
    >>> bx.type, by.type
    (f64[5,1,3], f64[2,3])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opgraph.ops.grad_helpers import static_shape


def ndim(x: Any) -> int:
    """The rank of value ``x`` (which must be known).

    >>> import opgraph
    >>> ndim(opgraph.GraphBuilder().input(("float64", (4, 2))))
    2
    """
    shape = x.type.shape
    if shape is None:
        raise NotImplementedError(f"batching needs known ranks, got {x.type}")
    return len(shape)


def example_ndim(x: Any, is_batched: bool) -> int:
    """The rank of one example of ``x`` (its rank less the batch axis when batched).

    >>> import opgraph
    >>> example_ndim(opgraph.GraphBuilder().input(("float64", (4, 2))), True)
    1
    """
    return ndim(x) - (1 if is_batched else 0)


def batch_axis(axis: int, rank: int) -> int:
    """Per-example ``axis`` (may be negative) of a value of per-example rank ``rank``, in the batched value.

    >>> batch_axis(0, 2), batch_axis(-1, 2)
    (1, 2)
    """
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % max(rank, 1) + 1


def batch_axes(axes: Sequence[int] | int | None, rank: int) -> tuple[int, ...]:
    """Per-example ``axes`` (None: all of them) shifted past the batch axis.

    >>> batch_axes(None, 3), batch_axes((0, -1), 3), batch_axes(1, 3)
    ((1, 2, 3), (1, 3), (2,))
    """
    if axes is None:
        return tuple(range(1, rank + 1))
    if isinstance(axes, int):
        axes = (axes,)
    return tuple(batch_axis(int(a), rank) for a in axes)


def move_axis(b: Any, x: Any, source: int, destination: int) -> Any:
    """``x`` with axis ``source`` moved to ``destination`` (a ``permute_dims``; ``x`` itself when in place).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> move_axis(b, b.input(("float64", (4, 2, 3))), 2, 0).type
    f64[3,4,2]
    """
    r = ndim(x)
    src, dst = source % r, destination % r
    if src == dst:
        return x
    perm = [i for i in range(r) if i != src]
    perm.insert(dst, src)
    return b.op("permute_dims", x, axes=tuple(perm))


def to_front(b: Any, x: Any, axis: int) -> Any:
    """``x`` with its ``axis`` moved to the front (where the engine keeps the batch axis).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> to_front(b, b.input(("float64", (2, 7))), -1).type
    f64[7,2]
    """
    return move_axis(b, x, axis, 0)


def broadcast_batch(b: Any, x: Any, size: int) -> Any:
    """An unbatched value as a batched one: ``size`` copies of ``x`` along a new leading axis.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> broadcast_batch(b, b.input(("float64", (3,))), 4).type
    f64[4,3]
    """
    shape = static_shape(x.type, "batched value")
    return b.op("broadcast_to", b.op("expand_dims", x, axis=0), shape=(int(size), *shape))


def lift_rank(b: Any, x: Any, rank: int) -> Any:
    """Batched ``x`` with size-1 axes inserted after the batch axis up to per-example rank ``rank``, so that it
    broadcasts against other per-example values of rank ``rank`` as its examples would (NumPy's rule
    right-aligns shapes, which would line the batch axis up with an example axis).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> lift_rank(b, b.input(("float64", (4, 3))), 3).type
    f64[4,1,1,3]
    """
    missing = rank - (ndim(x) - 1)
    if missing <= 0:
        return x
    return b.op("expand_dims", x, axis=tuple(range(1, missing + 1)))


def same_rank(b: Any, inputs: Sequence[Any], batched: Sequence[bool]) -> list[Any]:
    """Operands of an n-ary broadcasting op, lined up: batched ones lifted to the largest per-example rank
    (:func:`lift_rank`); unbatched ones as they are (they right-align with the examples' axes).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> [v.type for v in same_rank(b, [b.input(("float64", (4,))), b.input(("float64", (2,)))], [True, False])]
    [f64[4,1], f64[2]]
    """
    r = max(example_ndim(x, f) for x, f in zip(inputs, batched, strict=True))
    return [lift_rank(b, x, r) if f else x for x, f in zip(inputs, batched, strict=True)]


def all_batched(b: Any, inputs: Sequence[Any], batched: Sequence[bool], size: int) -> list[Any]:
    """Every input batched: the unbatched ones broadcast along a new leading axis (for ops such as ``concat``
    whose inputs must all have the batch axis).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> [v.type for v in all_batched(b, [b.input(("f8", (4, 2))), b.input(("f8", (3,)))], [True, False], 4)]
    [f64[4,2], f64[4,3]]
    """
    return [x if f else broadcast_batch(b, x, size) for x, f in zip(inputs, batched, strict=True)]


def batched_shape(size: int, shape: Sequence[int]) -> tuple[int, ...]:
    """A per-example shape attribute with the batch axis in front.

    >>> batched_shape(4, (2, 3))
    (4, 2, 3)
    """
    return (int(size), *(int(d) for d in shape))
