"""Building blocks for gradient rules (used by the op families in ``opgraph.ops``).

They live in ``ops``, next to the rules that use them, because ops sit below autodiff in the
layers (DESIGN.md); :mod:`opgraph.autodiff.helpers` re-exports them under their older name.

A gradient rule is a function::

    rule(b, inputs, outputs, cotangents, attrs) -> sequence of (cotangent or None), one per input

* ``b`` is an *emitter*: anything with ``b.op(kind, *values, **attrs)`` and
  ``b.constant(array)`` -- a :class:`~opgraph.GraphBuilder`, or the lazy-array
  emitter of :mod:`opgraph.autodiff`. Rules build ordinary ops, so gradients
  are graphs that can be optimised, saved and differentiated again.
* ``inputs`` / ``outputs``: the op's input and output values (anything with
  ``.type``: builder Values or lazy arrays).
* ``cotangents``: one per output, ``None`` where no cotangent flows (unused
  outputs, integer or boolean outputs).
* ``attrs``: the op's normalised attributes as a dict.

Return ``None`` for inputs that get no gradient; the driver drops gradients
for integer and boolean inputs anyway and sums over broadcast axes with
:func:`unbroadcast` where the rule asks for it.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> g = b.input(("float64", (2, 3)))
    >>> unbroadcast(b, g, opgraph.TensorType("float64", (3,))).type
    f64[3]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from opgraph.core.types import TensorType


def is_float(t: Any) -> bool:
    """True for real or complex floating tensor types (the ones that carry gradients).

    >>> is_float(TensorType("float32", (2,))), is_float(TensorType("int64", ()))
    (True, False)
    """
    return isinstance(t, TensorType) and t.dtype.kind in "fc"


def static_shape(t: TensorType, what: str = "gradient") -> tuple[int, ...]:
    """The shape of ``t``, which must be fully known.

    >>> static_shape(TensorType("float64", (2, 3)))
    (2, 3)
    """
    if t.shape is None or any(d is None for d in t.shape):
        raise NotImplementedError(f"the {what} needs a static shape, got {t}")
    return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]


def rank(t: TensorType) -> int:
    """Rank of ``t`` (which must be known)."""
    if t.shape is None:
        raise NotImplementedError(f"gradients need known ranks, got {t}")
    return len(t.shape)


def scalar(b: Any, value: float, like: Any) -> Any:
    """A 0-d constant of ``like``'s dtype.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> scalar(b, 2.0, b.input(("float32", (3,)))).type
    f32[]
    """
    return b.constant(np.array(value, dtype=like.type.dtype))


def zeros_like(b: Any, x: Any) -> Any:
    """Zeros of ``x``'s type (a broadcast 0-d constant when the shape is static).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> zeros_like(b, b.input(("float64", (2, 2)))).type
    f64[2,2]
    """
    t = x.type
    z = scalar(b, 0.0, x)
    shape = t.shape
    if shape is not None and all(d is not None for d in shape):
        return b.op("broadcast_to", z, shape=shape) if shape else z
    return b.op("multiply", x, z)


def broadcast_like(b: Any, g: Any, x: Any) -> Any:
    """Broadcast ``g`` to ``x``'s shape (static: ``broadcast_to``; else by adding zeros)."""
    if g.type.shape == x.type.shape:
        return g
    shape = x.type.shape
    if shape is not None and all(d is not None for d in shape):
        return b.op("broadcast_to", g, shape=shape)
    return b.op("add", g, zeros_like(b, x))


def unbroadcast(b: Any, g: Any, t: TensorType) -> Any:
    """Sum ``g`` over the axes along which a value of type ``t`` was broadcast, and cast to ``t.dtype``."""
    gshape = g.type.shape
    shape = t.shape
    if gshape is None or shape is None:
        raise NotImplementedError(f"gradients need known ranks, got {g.type} for {t}")
    lead = len(gshape) - len(shape)
    if lead > 0:
        g = b.op("sum", g, axis=tuple(range(lead)))
    axes = tuple(i for i, (d, e) in enumerate(zip(shape, g.type.shape, strict=True)) if d == 1 and e != 1)
    if axes:
        g = b.op("sum", g, axis=axes, keepdims=True)
    if g.type.dtype != t.dtype:
        g = b.op("cast", g, dtype=t.dtype)
    return g


def expand_reduced(b: Any, g: Any, x_type: TensorType, axes: Sequence[int] | None, keepdims: bool) -> Any:
    """Give a reduction's cotangent back the reduced axes as size-1 dims (ready to broadcast)."""
    r = rank(x_type)
    ax = tuple(range(r)) if axes is None else tuple(sorted(a % r for a in axes))
    if keepdims or not ax:
        return g
    return b.op("expand_dims", g, axis=ax)


def reduced_count(x_type: TensorType, axes: Sequence[int] | None) -> int:
    """How many elements a reduction over ``axes`` combines.

    >>> reduced_count(TensorType("float64", (2, 3, 4)), (0, 2))
    8
    """
    shape = static_shape(x_type, "mean/var gradient")
    ax = range(len(shape)) if axes is None else axes
    return int(np.prod([shape[a] for a in ax], dtype=np.int64))


def swap_last(b: Any, x: Any) -> Any:
    """Transpose the last two axes."""
    r = rank(x.type)
    axes = (*range(r - 2), r - 1, r - 2)
    return b.op("permute_dims", x, axes=axes)


def mask(b: Any, cond: Any, g: Any) -> Any:
    """``g`` where ``cond``, else 0, as ``g * cond``.

    A multiply by the cast mask is one fast pass, where NumPy's masked copies
    (``where``) are several times slower; the one difference is that a non-finite
    ``g`` where ``cond`` is false gives NaN rather than 0.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> g = b.input(("float32", (3,)), name="g")
    >>> m = mask(b, b.constant(np.array([True, False, True])), g)
    >>> b.run({g: np.ones(3, np.float32)}, [m])[0]
    array([1., 0., 1.], dtype=float32)
    """
    return b.op("multiply", g, b.op("cast", cond, dtype=g.type.dtype))


def no_grad(b: Any, inputs: Sequence[Any], outputs: Sequence[Any], cots: Sequence[Any],
            attrs: dict[str, Any]) -> list[Any]:
    """The rule of ops with zero gradient (comparisons, logic, rounding, integer ops): no cotangents.

    >>> no_grad(None, [1, 2], [3], [None], {})
    [None, None]
    """
    return [None] * len(inputs)


def eye(b: Any, n: int, like: Any) -> Any:
    """An ``n x n`` identity constant of ``like``'s dtype."""
    return b.constant(np.eye(n, dtype=like.type.dtype))


def dilate(b: Any, g: Any, axis: int, step: int) -> Any:
    """Insert ``step - 1`` zeros between the elements of ``g`` along ``axis`` (static shapes).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> g = b.input(("float64", (3,)), name="g")
    >>> b.run({g: np.array([1.0, 2.0, 3.0])}, [dilate(b, g, 0, 2)])[0]
    array([1., 0., 2., 0., 3.])
    """
    n = static_shape(g.type)[axis]
    if step == 1 or n <= 1:
        return g
    r = len(static_shape(g.type))
    g = b.op("expand_dims", g, axis=axis + 1)
    pw = [(0, 0)] * (r + 1)
    pw[axis + 1] = (0, step - 1)
    g = b.op("pad", g, pad_width=tuple(pw))
    shape = list(static_shape(g.type))
    shape[axis:axis + 2] = [shape[axis] * step]
    g = b.op("reshape", g, shape=tuple(shape))
    key: list[Any] = [slice(None)] * r
    key[axis] = slice(0, (n - 1) * step + 1)
    return b.op("getitem", g, index=tuple(key))
