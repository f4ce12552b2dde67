"""Reverse-mode automatic differentiation that builds gradients as ordinary graph ops.

Three levels, one engine (:mod:`opgraph.autodiff.reverse`):

* builder values: :func:`build_grad_ops` / :func:`build_vjp_ops` append the
  gradient ops to a :class:`~opgraph.GraphBuilder`;
* lazy arrays: ``grad(loss, wrt)`` returns lazy gradient arrays;
* functions (JAX style): ``grad(f)``, ``value_and_grad(f)`` return functions
  that are traced into graphs once per signature; ``vjp(f, *primals)``.

Gradient graphs are graphs like any other, so they can be differentiated
again (``grad(grad(f))``), optimised, planned and saved.

    >>> import numpy as np
    >>> import opgraph.numpy as onp
    >>> from opgraph.autodiff import grad, value_and_grad
    >>> f = lambda x: onp.sum(onp.sin(x) * x)
    >>> grad(f)(np.array([0.0, 1.0]))
    array([0.        , 1.38177329])
    >>> v, g = value_and_grad(f)(np.array([0.0, 1.0]))
    >>> round(float(v), 6)
    0.841471
    >>> float(grad(grad(lambda x: x ** 3))(np.array(2.0)))
    12.0
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from opgraph.autodiff.reverse import NoGradientError, Record, build_grad_ops, build_vjp_ops, sweep
from opgraph.core.graph import Value

__all__ = ["GradFunction", "NoGradientError", "build_grad_ops", "build_vjp_ops", "grad", "lazy_vjp",
           "value_and_grad", "vjp"]


class _LazyEmitter:
    """Emits gradient ops as lazy arrays (the lazy-array counterpart of a GraphBuilder)."""

    @staticmethod
    def op(kind: Any, *inputs: Any, **attrs: Any) -> Any:
        from opgraph.frontend.lazy import apply

        return apply(kind, *inputs, **attrs)

    @staticmethod
    def constant(value: Any) -> Any:
        from opgraph.frontend.lazy import constant

        return constant(np.asarray(value))


def _lazy_records(outputs: Sequence[Any]) -> list[Record]:
    from opgraph.frontend.lazy import LazyArray, _collect

    nodes = _collect([o._node for o in outputs], stop_at_values=False)
    return [Record(n.opdef, dict(n.attrs), list(n.inputs), [LazyArray(n, i) for i in range(len(n.types))])
            for n in nodes if n.opdef is not None]


def lazy_vjp(outputs: Sequence[Any], wrt: Sequence[Any], cotangents: Sequence[Any] | None = None) -> list[Any]:
    """Vector-Jacobian product of lazy ``outputs`` for lazy ``wrt``: lazy gradient arrays.

    >>> import numpy as np, opgraph.numpy as onp
    >>> x = onp.asarray(np.array([1.0, 2.0]))
    >>> (g,) = lazy_vjp([x * x], [x], [onp.asarray(np.array([1.0, 10.0]))])
    >>> g.eval()
    array([ 2., 40.])
    """
    from opgraph.autodiff.reverse import _seeds
    from opgraph.errors import GraphError
    from opgraph.frontend.lazy import as_lazy
    from opgraph.ops.grad_helpers import is_float, zeros_like

    b = _LazyEmitter()
    outputs = [as_lazy(o) for o in outputs]
    for w in wrt:
        if not is_float(w.type):
            raise GraphError(f"cannot differentiate with respect to {w.type} (only floating values have gradients)")
    cts = None if cotangents is None else [None if c is None else as_lazy(c) for c in cotangents]
    seeds = _seeds(b, outputs, cts)
    grads = sweep(b, _lazy_records(outputs), lambda v: (id(v._node), v._index), seeds, list(wrt))
    return [g if g is not None else zeros_like(b, w) for g, w in zip(grads, wrt, strict=True)]


def _is_lazy(x: Any) -> bool:
    from opgraph.frontend.lazy import LazyArray

    return isinstance(x, LazyArray)


class GradFunction:
    """A function computing gradients (made by :func:`grad` / :func:`value_and_grad` of a function).

    Called with NumPy arrays it runs a graph traced once per signature; called
    with lazy arrays (e.g. inside another traced function or another ``grad``)
    it records the gradient ops lazily, which is how higher derivatives work.
    ``.graph(*args)`` is the traced gradient graph.
    """

    def __init__(self, fn: Callable[..., Any], argnums: int | Sequence[int], with_value: bool) -> None:
        from opgraph.frontend.trace import TracedFunction

        functools.update_wrapper(self, fn, updated=())  # not __dict__: fn may be a GradFunction itself
        self.fn = fn
        self.argnums = argnums
        self.with_value = with_value
        self._traced = TracedFunction(self._lazy)
        self._traced.signature = inspect.signature(fn)  # traced by fn's parameters

    def _lazy(self, *args: Any, **kwargs: Any) -> Any:
        from opgraph.frontend.lazy import as_lazy

        nums = (self.argnums,) if isinstance(self.argnums, int) else tuple(self.argnums)
        args = list(args)
        for i in nums:
            args[i] = as_lazy(args[i])
        out = self.fn(*args, **kwargs)
        grads = lazy_vjp([out], [args[i] for i in nums])
        return (out, *grads) if self.with_value else tuple(grads)  # flat, for tracing

    def _shape(self, flat: Sequence[Any]) -> Any:
        flat = list(flat)
        value = flat.pop(0) if self.with_value else None
        g = flat[0] if isinstance(self.argnums, int) else tuple(flat)
        return (value, g) if self.with_value else g

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(_is_lazy(a) for a in args) or any(_is_lazy(a) for a in kwargs.values()):
            return self._shape(self._lazy(*args, **kwargs))
        return self._shape(self._traced(*args, **kwargs))

    def graph(self, *args: Any, **kwargs: Any) -> Any:
        """The traced graph computing the gradient for these arguments."""
        return self._traced.graph(*args, **kwargs)


def grad(fun_or_loss: Any, wrt: Any = None, *, argnums: int | Sequence[int] = 0) -> Any:
    """Gradients, at the level of what is given.

    * ``grad(f, argnums=0)``: a function computing the gradient of scalar
      ``f`` for its argument(s) ``argnums`` (JAX style, traced once per signature);
    * ``grad(loss, wrt)`` with builder Values: appends the gradient ops to the
      builder and returns gradient Values (like :func:`build_grad_ops`);
    * ``grad(loss, wrt)`` with lazy arrays: lazy gradient arrays.

    ``wrt`` is one value (one gradient is returned) or a sequence (a list).

    >>> import numpy as np, opgraph, opgraph.numpy as onp
    >>> x = onp.asarray(np.array([1.0, 2.0]))
    >>> grad(onp.sum(x ** 2), x).eval()
    array([2., 4.])
    >>> grad(lambda a, b: onp.sum(a * b), argnums=(0, 1))(np.ones(2), np.arange(2.0))
    (array([0., 1.]), array([1., 1.]))
    """
    if isinstance(fun_or_loss, Value):
        if wrt is None:
            raise TypeError("grad(loss, wrt): wrt is required for builder values")
        return build_grad_ops(fun_or_loss.owner, fun_or_loss, wrt)
    if _is_lazy(fun_or_loss):
        if wrt is None:
            raise TypeError("grad(loss, wrt): wrt is required for lazy arrays")
        single = _is_lazy(wrt)
        grads = lazy_vjp([fun_or_loss], [wrt] if single else list(wrt))
        return grads[0] if single else grads
    if callable(fun_or_loss):
        if wrt is not None:
            raise TypeError("grad(f) of a function takes argnums=, not wrt")
        return GradFunction(fun_or_loss, argnums, with_value=False)
    raise TypeError(f"grad() of {type(fun_or_loss).__name__}: expected a function, a builder Value or a lazy array")


def value_and_grad(fun: Callable[..., Any], *, argnums: int | Sequence[int] = 0) -> GradFunction:
    """Like ``grad(f)``, but the function returns ``(f(*args), gradient)``.

    >>> import numpy as np, opgraph.numpy as onp
    >>> value_and_grad(lambda x: onp.sum(x * x))(np.array([3.0]))
    (array(9.), array([6.]))
    """
    return GradFunction(fun, argnums, with_value=True)


def vjp(fun_or_outputs: Any, *args: Any, **kwargs: Any) -> Any:
    """Vector-Jacobian products.

    * ``vjp(f, *primals)`` (JAX style): returns ``(f(*primals), vjp_fn)`` where
      ``vjp_fn(cotangent)`` returns the tuple of cotangents of the primals;
    * ``vjp(outputs, wrt, cotangents)`` with builder Values or lazy arrays:
      appends/records the product and returns one cotangent per ``wrt``.

    >>> import numpy as np, opgraph.numpy as onp
    >>> y, f_vjp = vjp(lambda x: onp.exp(x), np.zeros(2))
    >>> f_vjp(np.array([1.0, 3.0]))
    (array([1., 3.]),)
    """
    if isinstance(fun_or_outputs, (Value, list, tuple)) or _is_lazy(fun_or_outputs):
        outputs = [fun_or_outputs] if not isinstance(fun_or_outputs, (list, tuple)) else list(fun_or_outputs)
        wrt, cts = args[0], (args[1] if len(args) > 1 else kwargs.get("cotangents"))
        wrt = list(wrt) if isinstance(wrt, (list, tuple)) else [wrt]
        if cts is not None and not isinstance(cts, (list, tuple)):
            cts = [cts]
        if isinstance(outputs[0], Value):
            return build_vjp_ops(outputs[0].owner, outputs, wrt, cts)
        return lazy_vjp(outputs, wrt, cts)
    fun = fun_or_outputs
    primals = [np.asarray(p) for p in args]
    from opgraph.frontend.trace import TracedFunction

    n = len(primals)

    def pullback(*xs: Any) -> Any:
        from opgraph.frontend.lazy import as_lazy

        ps = [as_lazy(x) for x in xs[:n]]
        return tuple(lazy_vjp([fun(*ps)], ps, [xs[n]]))

    # TracedFunction binds by signature: give pullback n + 1 positional parameters.
    params = [inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(n + 1)]
    pullback.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    traced = TracedFunction(pullback)
    out = TracedFunction(fun)(*primals)

    def vjp_fn(cotangent: Any) -> tuple[Any, ...]:
        return traced(*primals, np.asarray(cotangent))

    return out, vjp_fn
