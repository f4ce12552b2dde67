"""Building blocks for tangent (forward-mode) rules, used by the op families' ``set_rules("jvp", ...)`` tables.

A tangent rule is ``rule(b, inputs, outputs, tangents, attrs) -> tangent per output`` (None where it is
zero), written with ``b.op`` as gradient rules are (:mod:`opgraph.ops.grad_helpers`), so it runs on a
GraphBuilder and on lazy arrays alike. A kind without one gets its tangents by transposing its gradient rule
(:mod:`opgraph.autodiff.forward`); a direct rule is written where that transpose cannot be formed or costs
many more ops than the derivative itself (a linear op's tangent is the op on the tangents).

    >>> import numpy as np, opgraph
    >>> from opgraph.autodiff.forward import build_jvp_ops
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2, 3)), name="x")
    >>> (t,) = build_jvp_ops(b, [b.permute_dims(x)], [x], [np.arange(6.0).reshape(2, 3)])
    >>> b.run({x: np.zeros((2, 3))}, [t])[0]  # permute_dims is linear: its tangent is the op on the tangent
    array([[0., 3.],
           [1., 4.],
           [2., 5.]])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from opgraph.ops.grad_helpers import zeros_like

__all__ = ["JvpRule", "add_all", "linear", "multilinear", "outputs_of"]

JvpRule = Callable[..., list[Any]]


def outputs_of(out: Any) -> list[Any]:
    """An op's result as a list (one output or a tuple of them)."""
    return list(out) if isinstance(out, tuple) else [out]


def add_all(b: Any, terms: Sequence[Any]) -> Any:
    """The sum of ``terms``, skipping None (None when all are).

    >>> add_all(None, [None, 3])
    3
    """
    out = None
    for t in terms:
        if t is not None:
            out = t if out is None else b.op("add", out, t)
    return out


def linear(kind: str, positions: Sequence[int] | None = (0,), **fixed: Any) -> JvpRule:
    """The tangent rule of op ``kind``, linear in its inputs at ``positions`` (None: all) jointly.

    The rule runs the op on the tangents there (zeros for an input without one) and on the inputs
    themselves elsewhere (indices, shapes); ``fixed`` overrides attributes (``constant_value=0.0``
    for pad: padding with a constant is affine, its tangent pads with zeros).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> rule = linear("take", (0,))
    >>> (t,) = rule(b, (x, b.constant(np.array([2, 0]))), (), (b.constant(np.array([1.0, 2.0, 3.0])), None), {})
    >>> b.run({x: np.zeros(3)}, [t])[0]
    array([3., 1.])
    """

    def rule(b: Any, ins: Sequence[Any], outs: Sequence[Any], tans: Sequence[Any], attrs: dict[str, Any]
             ) -> list[Any]:
        pos = range(len(ins)) if positions is None else positions
        if all(tans[p] is None for p in pos):
            return [None] * len(outs)
        args = list(ins)
        for p in pos:
            args[p] = tans[p] if tans[p] is not None else zeros_like(b, ins[p])
        return outputs_of(b.op(kind, *args, **{**attrs, **fixed}))

    rule.__name__ = f"jvp_{kind}"
    return rule


def multilinear(kind: str, positions: Sequence[int] | None = None) -> JvpRule:
    """The tangent rule of op ``kind``, linear in each input at ``positions`` (None: all) separately.

    Product rule: the sum over those inputs with a tangent of the op with that one input replaced by its
    tangent (matmul: ``dA @ B + A @ dB``).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x, y = b.input(("float64", (2,)), name="x"), b.input(("float64", (2,)), name="y")
    >>> (t,) = multilinear("multiply")(b, (x, y), (), (b.constant(np.ones(2)), b.constant(np.ones(2))), {})
    >>> b.run({x: np.array([1.0, 2.0]), y: np.array([3.0, 4.0])}, [t])[0]
    array([4., 6.])
    """

    def rule(b: Any, ins: Sequence[Any], outs: Sequence[Any], tans: Sequence[Any], attrs: dict[str, Any]
             ) -> list[Any]:
        pos = range(len(ins)) if positions is None else positions
        terms = []
        for p in pos:
            if tans[p] is not None:
                args = list(ins)
                args[p] = tans[p]
                terms.append(b.op(kind, *args, **attrs))
        return [add_all(b, terms)]

    rule.__name__ = f"jvp_{kind}"
    return rule
