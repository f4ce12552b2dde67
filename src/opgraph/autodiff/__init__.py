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

from opgraph.autodiff.batching import VmapFunction, batch_sweep, vmap
from opgraph.autodiff.forward import NoTangentError, build_jvp_ops, lazy_jvp
from opgraph.autodiff.reverse import NoGradientError, Record, build_grad_ops, build_vjp_ops, sweep
from opgraph.core.graph import Value

__all__ = ["GradFunction", "HessianFunction", "JacfwdFunction", "JacobianFunction", "NoGradientError",
           "NoTangentError", "VmapFunction", "batch_sweep", "build_grad_ops", "build_jvp_ops", "build_vjp_ops",
           "grad", "hessian", "hvp", "jacfwd", "jacobian", "jacrev", "jvp", "lazy_jvp", "lazy_vjp", "linearize",
           "value_and_grad", "vjp", "vmap"]


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
    from opgraph.frontend.lazy import LazyArray, collect_nodes

    nodes = collect_nodes([o._node for o in outputs], stop_at_values=False)
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


def _any_lazy(tree: Any) -> bool:
    from opgraph.frontend import pytree

    return any(_is_lazy(leaf) for leaf in pytree.flatten(tree)[0])


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _describe(x: Any) -> str:
    if _is_lazy(x) or isinstance(x, np.ndarray):
        return f"an array of shape {tuple(x.shape)}"
    if isinstance(x, (tuple, list, dict)):
        return f"a {type(x).__name__} of {len(x)} item{'s' if len(x) != 1 else ''}"
    return f"a {type(x).__name__}"


def _argnums_tuple(argnums: Any, what: str) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) and not isinstance(argnums, bool) else argnums
    if (not isinstance(nums, (tuple, list)) or not nums
            or not all(isinstance(a, int) and not isinstance(a, bool) for a in nums)):
        raise TypeError(f"{what}: argnums must be an int or a non-empty tuple of ints, not {argnums!r}")
    return tuple(nums)


def _positional(fn: Any) -> tuple[list[str], str | None]:
    """Names of ``fn``'s positional parameters, and of its ``*args`` (if any)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature (some builtins): nothing to check in advance
        return [], "args"
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    star = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), None)
    return names, star


def _check_argnums(what: str, fname: str, argnums: Any, nums: Sequence[int], n: int, verb: str) -> None:
    for a in nums:
        if not -n <= a < n:
            raise TypeError(f"{what}: argnums={argnums!r} but {fname} {verb} {n} positional "
                            f"argument{'s' if n != 1 else ''}")


class GradFunction:
    """A function computing gradients (made by :func:`grad` / :func:`value_and_grad` of a function).

    Called with NumPy arrays (or pytrees of them) it runs a graph traced once
    per signature; called with lazy arrays (e.g. inside another traced
    function or another ``grad``) it records the gradient ops lazily, which is
    how higher derivatives work. ``.graph(*args)`` is the traced gradient
    graph (one input per array leaf of the arguments, flat outputs).

    >>> import numpy as np, opgraph.numpy as onp
    >>> g = GradFunction(lambda p: onp.sum(p["w"] ** 2), 0, with_value=False)
    >>> g({"w": np.array([1.0, 2.0])})
    {'w': array([2., 4.])}
    """

    label = "grad"
    forward = False  # forward mode inside: traced graphs get one_loop

    def __init__(self, fn: Callable[..., Any], argnums: int | Sequence[int], with_value: bool, *,
                 has_aux: bool = False, label: str | None = None) -> None:
        from opgraph.frontend.trace import TracedFunction

        functools.update_wrapper(self, fn, updated=())  # not __dict__: fn may be a GradFunction itself
        self.fn = fn
        self.argnums = argnums
        self.with_value = with_value
        self.has_aux = has_aux
        if label is not None:
            self.label = label
        self.fname = _name(fn)
        self._what = f"{self.label}({self.fname})"
        self._nums = _argnums_tuple(argnums, self._what)
        self._params, star = _positional(fn)
        self._star = star or "args"
        if star is None:  # a fixed number of positional parameters: a bad argnums is an error now, not at the call
            _check_argnums(self._what, self.fname, argnums, self._nums, len(self._params), "takes")
        self._traced = TracedFunction(self._lazy, name=self.fname, finish=one_loop if self.forward else None)
        self._traced.signature = inspect.signature(fn)  # traced by fn's parameters

    def _arg_name(self, i: int) -> str:
        return self._params[i] if i < len(self._params) else f"{self._star}[{i - len(self._params)}]"

    def _inputs(self, args: list[Any]) -> tuple[list[int], list[tuple[Any, int]], list[Any]]:
        """Make the differentiated arguments' leaves lazy (in place); return their positions, specs and leaves."""
        from opgraph.frontend import pytree
        from opgraph.frontend.lazy import as_lazy
        from opgraph.ops.grad_helpers import is_float

        _check_argnums(self._what, self.fname, self.argnums, self._nums, len(args), "was called with")
        nums = [a % len(args) for a in self._nums]
        specs: list[tuple[Any, int]] = []
        wrt: list[Any] = []
        for i in nums:
            leaves, spec = pytree.flatten(args[i])
            lazies = []
            for leaf, path in zip(leaves, pytree.keystrs(self._arg_name(i), args[i]), strict=True):
                x = as_lazy(leaf)
                if not is_float(x.type):
                    raise TypeError(f"{self._what}: argument {path} has dtype {x.dtype}, but only floating inputs "
                                    f"can be differentiated (make it a float array, or leave it out of argnums)")
                lazies.append(x)
            args[i] = pytree.unflatten(spec, lazies)
            specs.append((spec, len(lazies)))
            wrt += lazies
        return nums, specs, wrt

    def _structure(self, specs: list[tuple[Any, int]], flat: Sequence[Any]) -> Any:
        """Gradients in the structure of the arguments: one tree, or a tuple of them for a tuple argnums."""
        from opgraph.frontend import pytree

        trees, k = [], 0
        for spec, n in specs:
            trees.append(pytree.unflatten(spec, flat[k:k + n]))
            k += n
        return trees[0] if isinstance(self.argnums, int) else tuple(trees)

    def _split(self, result: Any) -> tuple[Any, Any]:
        if not self.has_aux:
            return result, None
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError(f"{self._what} with has_aux=True: {self.fname} must return a pair (output, aux), but "
                            f"it returned {_describe(result)}")
        return result[0], result[1]

    def _scalar(self, out: Any) -> Any:
        from opgraph.frontend.lazy import as_lazy

        if isinstance(out, (tuple, list, dict)):
            raise TypeError(f"{self._what}: {self.fname} returned {_describe(out)}, but grad needs a scalar output; "
                            "if the other items are auxiliary outputs, pass has_aux=True and return (output, aux)")
        if not (_is_lazy(out) or isinstance(out, (np.ndarray, np.generic, float, int))):
            raise TypeError(f"{self._what}: {self.fname} returned {_describe(out)}, not an array")
        out = as_lazy(out)
        if out.type.shape != ():
            raise TypeError(f"{self._what}: {self.fname} must return a scalar, but it returned an array of shape "
                            f"{out.type.shape} ({out.type}); grad is defined for scalar-output functions "
                            "(use jacobian or vjp for the others)")
        if out.dtype.kind != "f":
            raise TypeError(f"{self._what}: {self.fname} returned {out.type}; grad needs a real floating scalar")
        return out

    def _lazy(self, *args: Any, **kwargs: Any) -> Any:
        arglist = list(args)
        _, specs, wrt = self._inputs(arglist)
        out, aux = self._split(self.fn(*arglist, **kwargs))
        out = self._scalar(out)
        g = self._structure(specs, lazy_vjp([out], wrt))
        if self.with_value:
            return ((out, aux) if self.has_aux else out), g
        return (g, aux) if self.has_aux else g

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _any_lazy((args, kwargs)):
            try:
                bound = self._traced.signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{self.fname}(): {exc}") from None
            bound.apply_defaults()
            return self._lazy(*bound.args, **bound.kwargs)
        return self._traced(*args, **kwargs)

    def graph(self, *args: Any, **kwargs: Any) -> Any:
        """The traced graph computing the gradient for these arguments."""
        return self._traced.graph(*args, **kwargs)


class JacobianFunction(GradFunction):
    """The Jacobian of a function, in reverse mode (made by :func:`jacobian` and :func:`hessian`).

    One vector-Jacobian product per element of the output; the result for an
    output leaf ``o`` and an input leaf ``x`` has shape ``o.shape + x.shape``.

    >>> import numpy as np
    >>> JacobianFunction(lambda x: x * x, 0, with_value=False)(np.array([1.0, 2.0]))
    array([[2., 0.],
           [0., 4.]])
    """

    label = "jacobian"

    def _lazy(self, *args: Any, **kwargs: Any) -> Any:
        from opgraph.frontend import api, pytree
        from opgraph.frontend.lazy import as_lazy, constant

        arglist = list(args)
        _, specs, wrt = self._inputs(arglist)
        out, aux = self._split(self.fn(*arglist, **kwargs))
        if isinstance(out, (np.ndarray, np.generic, float, int)):
            out = as_lazy(out)
        leaves, spec = pytree.flatten(out)
        jacs = []
        for leaf, path in zip(leaves, pytree.keystrs("output", out), strict=True):
            o = as_lazy(leaf) if isinstance(leaf, (np.ndarray, np.generic, float, int)) else leaf
            if not _is_lazy(o):
                raise TypeError(f"{self._what}: {self.fname} returned {_describe(leaf)} as {path}, not an array")
            if o.dtype.kind not in "fc":
                raise TypeError(f"{self._what}: {self.fname} returned {o.type} as {path}; the Jacobian needs a "
                                "floating output")
            shape = o.type.shape
            if shape is None or any(d is None for d in shape):
                raise TypeError(f"{self._what}: {self.fname} returned {o.type} as {path}; the Jacobian needs a "
                                "static output shape")
            m = int(np.prod(shape, dtype=np.int64))
            if m == 0:
                flat = [api.zeros(shape + w.shape, dtype=w.dtype) for w in wrt]
            else:
                # One reverse sweep per output element (the rows of the Jacobian), as jax.jacrev does under vmap.
                eye = np.eye(m, dtype=o.dtype)
                rows = [lazy_vjp([o], wrt, [constant(eye[k].reshape(shape))]) for k in range(m)]
                flat = [api.reshape(r[0] if m == 1 else api.stack(list(r)), shape + w.shape)
                        for r, w in zip(zip(*rows, strict=True), wrt, strict=True)]
            jacs.append(self._structure(specs, flat))
        jac = pytree.unflatten(spec, jacs)
        return (jac, aux) if self.has_aux else jac


def grad(fun_or_loss: Any, wrt: Any = None, *, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Any:
    """Gradients, at the level of what is given.

    * ``grad(f, argnums=0, has_aux=False)``: a function computing the gradient
      of scalar ``f`` for its argument(s) ``argnums`` (JAX semantics, traced
      once per signature). Arguments may be pytrees (dicts, tuples, lists,
      namedtuples); the gradient of one has the same structure. With a tuple
      ``argnums`` the result is a tuple of gradients; with ``has_aux=True``,
      ``f`` returns ``(output, aux)`` and the function returns ``(gradient, aux)``;
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
    >>> grad(lambda p: onp.sum(p["w"] * p["b"]))({"w": np.ones(2), "b": np.full(2, 3.0)})
    {'w': array([3., 3.]), 'b': array([1., 1.])}
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
        return GradFunction(fun_or_loss, argnums, with_value=False, has_aux=has_aux)
    raise TypeError(f"grad() of {type(fun_or_loss).__name__}: expected a function, a builder Value or a lazy array")


def value_and_grad(fun: Callable[..., Any], *, argnums: int | Sequence[int] = 0,
                   has_aux: bool = False) -> GradFunction:
    """Like ``grad(f)``, but the function returns ``(f(*args), gradient)``.

    With ``has_aux=True``, ``f`` returns ``(output, aux)`` and the function
    returns ``((output, aux), gradient)``, as in JAX.

    >>> import numpy as np, opgraph.numpy as onp
    >>> value_and_grad(lambda x: onp.sum(x * x))(np.array([3.0]))
    (array(9.), array([6.]))
    >>> (v, aux), g = value_and_grad(lambda x: (onp.sum(x * x), {"x2": x * x}), has_aux=True)(np.array([3.0]))
    >>> float(v), aux, g
    (9.0, {'x2': array([9.])}, array([6.]))
    """
    return GradFunction(fun, argnums, with_value=True, has_aux=has_aux, label="value_and_grad")


def jacobian(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, *, has_aux: bool = False) -> GradFunction:
    """The Jacobian of ``fun`` for its argument(s) ``argnums``, in reverse mode (``jax.jacrev``).

    For an output ``o`` and an input ``x`` the Jacobian has shape
    ``o.shape + x.shape``; pytrees of outputs and inputs give a tree (the
    output's structure) of trees (the input's), a tuple of them for a tuple
    ``argnums``. It takes one reverse sweep per output element, so it suits
    outputs of modest size. ``has_aux=True``: ``fun`` returns
    ``(output, aux)`` and the Jacobian function returns ``(jacobian, aux)``.

    >>> import numpy as np, opgraph.numpy as onp
    >>> jacobian(lambda x: onp.sin(x) * 2.0)(np.array([0.0, np.pi]))
    array([[ 2.,  0.],
           [ 0., -2.]])
    """
    return JacobianFunction(fun, argnums, with_value=False, has_aux=has_aux)


class HessianFunction(GradFunction):
    """The Hessian of a scalar function: the Jacobian of its gradient, forwards or in reverse (see :func:`hessian`).

    >>> import numpy as np, opgraph.numpy as onp
    >>> HessianFunction(lambda x: onp.sum(x ** 3), 0, with_value=False, mode="fwd")(np.array([1.0, 2.0]))
    array([[ 6.,  0.],
           [ 0., 12.]])
    """

    label = "hessian"
    forward = True

    def __init__(self, fn: Callable[..., Any], argnums: int | Sequence[int], with_value: bool, *,
                 has_aux: bool = False, mode: str = "auto") -> None:
        if mode not in ("auto", "fwd", "rev"):
            raise ValueError(f"hessian: mode must be 'auto', 'fwd' or 'rev', not {mode!r}")
        super().__init__(fn, argnums, with_value, has_aux=has_aux)
        self.mode = mode
        inner = GradFunction(fn, argnums, with_value=False, has_aux=has_aux, label="hessian")
        self._fwd = JacfwdFunction(inner, argnums, with_value=False, has_aux=has_aux, label="hessian")
        self._rev = JacobianFunction(inner, argnums, with_value=False, has_aux=has_aux, label="hessian")

    def _lazy(self, *args: Any, **kwargs: Any) -> Any:
        if self.mode == "rev":
            return self._rev._lazy(*args, **kwargs)
        if self.mode == "fwd":
            return self._fwd._lazy(*args, **kwargs)
        try:
            return self._fwd._lazy(*args, **kwargs)
        except NoTangentError:  # an op on the gradient's path cannot be differentiated forwards
            return self._rev._lazy(*args, **kwargs)


def hessian(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, *, has_aux: bool = False,
            mode: str = "auto") -> GradFunction:
    """The Hessian of scalar ``fun`` for ``argnums`` (``jax.hessian``'s structure and method).

    For an input ``x`` the result has shape ``x.shape + x.shape``. It is the
    Jacobian of the gradient, taken forward-over-reverse (``mode="fwd"``, one
    forward sweep over the gradient graph per input element, as
    ``jax.hessian``) or reverse-over-reverse (``mode="rev"``, one reverse sweep
    per element). A forward sweep adds about one op per op it crosses and
    keeps nothing for later, a reverse sweep two or more and keeps the
    intermediates it reads, so ``"auto"`` takes forward-over-reverse, and
    reverse-over-reverse only where an op on the way has no tangent rule.

    >>> import numpy as np, opgraph.numpy as onp
    >>> hessian(lambda x: onp.sum(x ** 3))(np.array([1.0, 2.0]))
    array([[ 6.,  0.],
           [ 0., 12.]])
    """
    return HessianFunction(fun, argnums, with_value=False, has_aux=has_aux, mode=mode)


def vjp(fun_or_outputs: Any, *args: Any, has_aux: bool = False, **kwargs: Any) -> Any:
    """Vector-Jacobian products.

    * ``vjp(f, *primals, has_aux=False)`` (JAX style): returns
      ``(f(*primals), vjp_fn)`` where ``vjp_fn(cotangent)`` returns the tuple
      of cotangents of the primals. Primals, outputs and cotangents may be
      pytrees: a cotangent has its output's structure, and the result its
      primal's. With ``has_aux=True``, ``f`` returns ``(output, aux)`` and
      ``vjp`` returns ``(output, vjp_fn, aux)``;
    * ``vjp(outputs, wrt, cotangents)`` with builder Values or lazy arrays:
      appends/records the product and returns one cotangent per ``wrt``.

    >>> import numpy as np, opgraph.numpy as onp
    >>> y, f_vjp = vjp(lambda x: onp.exp(x), np.zeros(2))
    >>> f_vjp(np.array([1.0, 3.0]))
    (array([1., 3.]),)
    >>> y, f_vjp = vjp(lambda p: {"s": p[0] * p[1]}, (np.array(2.0), np.array(5.0)))
    >>> f_vjp({"s": np.array(1.0)})
    ((array(5.), array(2.)),)
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
    if kwargs:
        raise TypeError(f"vjp(f, *primals): unexpected keyword argument(s) {', '.join(kwargs)}")
    return _function_vjp(fun_or_outputs, args, has_aux)


def _function_vjp(fun: Callable[..., Any], primals: tuple[Any, ...], has_aux: bool) -> Any:
    from opgraph.frontend import pytree
    from opgraph.frontend.trace import TracedFunction

    fname = _name(fun)
    if not primals:
        raise TypeError(f"vjp({fname}): no primals given")
    names, star = _positional(fun)
    if star is None and len(primals) > len(names):
        raise TypeError(f"vjp({fname}): {len(primals)} primals given, but {fname} takes {len(names)} positional "
                        f"argument{'s' if len(names) != 1 else ''}")
    # differentiates every primal; its checks and messages are grad's
    splitter = GradFunction(fun, tuple(range(len(primals))), with_value=False, has_aux=has_aux, label="vjp")
    out = TracedFunction(fun, name=fname)(*primals)
    out, aux = splitter._split(out)

    def pullback(primals: tuple[Any, ...], cotangent: Any) -> tuple[Any, ...]:
        from opgraph.frontend.lazy import as_lazy

        args = list(primals)
        _, specs, wrt = splitter._inputs(args)
        result, _ = splitter._split(fun(*args))
        outs, spec = pytree.flatten(result)
        cts, ct_spec = pytree.flatten(cotangent)
        if ct_spec != spec:
            raise TypeError(f"vjp({fname}): the cotangent has structure {ct_spec}, but {fname} returns {spec}")
        outs = [as_lazy(o) for o in outs]
        for o, c, path in zip(outs, cts, pytree.keystrs("cotangent", cotangent), strict=True):
            if tuple(np.shape(c) if not _is_lazy(c) else c.shape) != o.type.shape:
                raise ValueError(f"vjp({fname}): {path} has shape {tuple(np.shape(c))}, but the output it "
                                 f"stands for has shape {o.type.shape}")
        flat = lazy_vjp(outs, wrt, [as_lazy(c) for c in cts])
        trees, k = [], 0
        for s, n in specs:
            trees.append(pytree.unflatten(s, flat[k:k + n]))
            k += n
        return tuple(trees)

    traced = TracedFunction(pullback, name=f"vjp({fname})")

    def vjp_fn(cotangent: Any) -> tuple[Any, ...]:
        return traced(primals, cotangent)

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


# ---------------------------------------------------------------- forward mode (JAX style)
def one_loop(graph: Any) -> Any:
    """``graph`` with each control op read off the op carrying its tangents (forward mode traces both: the
    primal loop, then the loop carrying values and tangents), so a loop runs once also without ``jit``."""
    from opgraph.passes.control import merge_subsumed

    return merge_subsumed(graph).graph


def _check_pair(what: str, primals: Any, tangents: Any) -> None:
    """JAX's checks of jvp's arguments: tuples or lists of one length, each tangent shaped as its primal."""
    from opgraph.frontend import pytree

    for arg, label in ((primals, "primals"), (tangents, "tangents")):
        if not isinstance(arg, (tuple, list)):
            raise TypeError(f"{what}: {label} must be a tuple or list of arguments, not {type(arg).__name__} (write "
                            f"({label[:-1]},) for one argument)")
    if len(primals) != len(tangents):
        raise TypeError(f"{what}: {len(primals)} primal(s) but {len(tangents)} tangent(s)")
    for i, (p, t) in enumerate(zip(primals, tangents, strict=True)):
        pl, ps = pytree.flatten(p)
        tl, ts = pytree.flatten(t)
        if ps != ts:
            raise TypeError(f"{what}: tangent {i} has structure {ts}, but its primal has {ps}")
        for a, c, path in zip(pl, tl, pytree.keystrs(f"primals[{i}]", p), strict=True):
            if c is None:
                continue
            sa, sc = tuple(np.shape(a)), tuple(np.shape(c))
            if sa != sc:
                raise ValueError(f"{what}: the tangent of {path} has shape {sc}, but the primal has shape {sa}")


def _lazy_jvp(fun: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any], has_aux: bool,
              what: str) -> Any:
    """``jvp`` on lazy arrays: the tangent ops are recorded on the primal's graph."""
    from opgraph.autodiff.forward import lazy_jvp as tangent_ops
    from opgraph.frontend import pytree
    from opgraph.frontend.lazy import apply, as_lazy
    from opgraph.ops.grad_helpers import is_float

    args, wrt, tans = [], [], []
    for p, t in zip(primals, tangents, strict=True):
        pl, spec = pytree.flatten(p)
        tl = pytree.flatten(t)[0]
        lazies = [as_lazy(leaf) for leaf in pl]
        for k, (x, c) in enumerate(zip(lazies, tl, strict=True)):
            if c is not None and is_float(x.type):
                if x._node.const is not None:
                    # a constant with a tangent (linearize's primals) enters through an op: a control-flow body
                    # copies a small outer constant into itself (frontend.control.SMALL_CONST), which would cut
                    # the tangent's path
                    x = lazies[k] = apply("positive", x)
                wrt.append(x)
                tans.append(as_lazy(c) if _is_lazy(c) else as_lazy(np.asarray(c, dtype=x.dtype)))
        args.append(pytree.unflatten(spec, lazies))
    result = fun(*args)
    if has_aux:
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError(f"{what} with has_aux=True: {_name(fun)} must return a pair (output, aux), but it "
                            f"returned {_describe(result)}")
        result, aux = result
    leaves, spec = pytree.flatten(result)
    outs = [as_lazy(o) for o in leaves]
    touts = tangent_ops(outs, wrt, tans)
    out = (pytree.unflatten(spec, outs), pytree.unflatten(spec, touts))
    return (*out, aux) if has_aux else out


def jvp(fun: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any], *,
        has_aux: bool = False) -> Any:
    """Jacobian-vector product (forward mode): ``(fun(*primals), J(primals) @ tangents)``, as ``jax.jvp``.

    ``primals`` and ``tangents`` are tuples (or lists) of arguments of one
    structure; each may be a pytree. The tangent comes out in the output's
    structure. It costs about one more evaluation of ``fun``, whatever the
    number of outputs. With ``has_aux=True``, ``fun`` returns ``(output,
    aux)`` and ``jvp`` returns ``(output, tangent, aux)``. Called with lazy
    arrays (inside ``opgraph.jit``, ``grad``, ``vmap``) it records the
    tangent ops on their graph.

    >>> import numpy as np, opgraph.numpy as onp
    >>> y, t = jvp(lambda x: onp.sin(x) * x, (np.array([0.0, 1.0]),), (np.array([1.0, 1.0]),))
    >>> t
    array([0.        , 1.38177329])
    >>> jvp(lambda p: p["a"] * p["b"], ({"a": np.array(2.0), "b": np.array(3.0)},),
    ...     ({"a": np.array(1.0), "b": np.array(0.0)},))[1]
    array(3.)
    """
    from opgraph.frontend.trace import TracedFunction

    what = f"jvp({_name(fun)})"
    _check_pair(what, primals, tangents)
    if _any_lazy((primals, tangents)):
        return _lazy_jvp(fun, primals, tangents, has_aux, what)
    traced = TracedFunction(lambda p, t: _lazy_jvp(fun, p, t, has_aux, what), name=what, finish=one_loop)
    return traced(tuple(primals), tuple(tangents))


def linearize(fun: Callable[..., Any], *primals: Any, has_aux: bool = False) -> Any:
    """``(fun(*primals), f_jvp)`` where ``f_jvp(*tangents)`` is the Jacobian-vector product at ``primals``.

    As ``jax.linearize``: ``f_jvp`` is the linear map alone, traced once with
    the primals as constants, so what depends only on them is folded when its
    graph is optimised. With ``has_aux=True`` it returns ``(output, f_jvp, aux)``.

    >>> import numpy as np, opgraph.numpy as onp
    >>> y, f_jvp = linearize(lambda x: onp.exp(x), np.array([0.0, 1.0]))
    >>> f_jvp(np.array([1.0, 2.0]))
    array([1.        , 5.43656366])
    """
    from opgraph.frontend.lazy import constant
    from opgraph.frontend.trace import TracedFunction

    fname = _name(fun)
    what = f"linearize({fname})"
    if not primals:
        raise TypeError(f"{what}: no primals given")
    out = TracedFunction(fun, name=fname)(*primals)
    aux = None
    if has_aux:
        out, aux = GradFunction(fun, 0, with_value=False, has_aux=True, label="linearize")._split(out)

    def tangent_of(*tangents: Any) -> Any:
        from opgraph.frontend import pytree

        _check_pair(what, primals, tangents)
        fixed = [pytree.unflatten(s, [constant(np.asarray(leaf)) for leaf in ls])
                 for ls, s in (pytree.flatten(p) for p in primals)]
        return _lazy_jvp(fun, fixed, tangents, has_aux, what)[1]

    f_jvp = TracedFunction(tangent_of, name=f"linearize({fname}).jvp", finish=one_loop)
    return (out, f_jvp, aux) if has_aux else (out, f_jvp)


def _basis_tangents(outs: Sequence[Any], wrt: Sequence[Any], bases: Sequence[Any]) -> list[Any]:
    """The tangents of ``outs`` along each row of ``bases`` (one basis per ``wrt`` leaf, rows first), stacked:
    one batched forward sweep (vmap of the jvp)."""
    from opgraph.autodiff.batching import vmap
    from opgraph.autodiff.forward import lazy_jvp as tangent_ops

    return list(vmap(lambda *ts: tuple(tangent_ops(outs, wrt, list(ts))))(*bases))


class JacfwdFunction(GradFunction):
    """The Jacobian of a function in forward mode (made by :func:`jacfwd` and :func:`hessian`).

    The Jacobian-vector product along every unit vector of the differentiated
    inputs, batched into one sweep (``vmap`` of ``jvp``, as ``jax.jacfwd``); the
    result for an output leaf ``o`` and an input leaf ``x`` has shape
    ``o.shape + x.shape`` (as :class:`JacobianFunction`).

    >>> import numpy as np
    >>> JacfwdFunction(lambda x: x * x, 0, with_value=False)(np.array([1.0, 2.0]))
    array([[2., 0.],
           [0., 4.]])
    """

    label = "jacfwd"
    forward = True

    def _lazy(self, *args: Any, **kwargs: Any) -> Any:
        from opgraph.frontend import api, pytree
        from opgraph.frontend.lazy import as_lazy, constant

        arglist = list(args)
        _, specs, wrt = self._inputs(arglist)
        out, aux = self._split(self.fn(*arglist, **kwargs))
        leaves, spec = pytree.flatten(out)
        outs = []
        for leaf, path in zip(leaves, pytree.keystrs("output", out), strict=True):
            o = as_lazy(leaf)
            if o.dtype.kind not in "fc":
                raise TypeError(f"{self._what}: {self.fname} returned {o.type} as {path}; the Jacobian needs a "
                                "floating output")
            outs.append(o)
        for w in wrt:
            if w.type.shape is None or any(d is None for d in w.type.shape):
                raise TypeError(f"{self._what}: an input of type {w.type}; the Jacobian needs static input shapes")
        sizes = [int(np.prod(w.type.shape, dtype=np.int64)) for w in wrt]
        total = sum(sizes)
        if total == 0:
            per_input = [[api.zeros(o.type.shape + w.type.shape, dtype=o.dtype) for o in outs] for w in wrt]
        else:
            # As jax.jacfwd: the jvp vmapped over the standard basis of all differentiated inputs at once, so the
            # tangents of every direction share one sweep (and a loop carries them all, once).
            bases, start = [], 0
            for w, n in zip(wrt, sizes, strict=True):
                eye = np.zeros((total, n), dtype=w.dtype)
                eye[start:start + n] = np.eye(n, dtype=w.dtype)
                bases.append(constant(eye.reshape((total, *w.type.shape))))
                start += n
            columns = _basis_tangents(outs, wrt, bases)  # per output: (total,) + o.shape
            per_input, start = [], 0
            for w, n in zip(wrt, sizes, strict=True):
                blocks = []
                for o, col in zip(outs, columns, strict=True):
                    part = col if n == total else col[start:start + n]
                    moved = api.moveaxis(part, 0, -1) if o.type.shape else part  # o.shape + (n,)
                    blocks.append(api.reshape(moved, o.type.shape + w.type.shape))
                per_input.append(blocks)
                start += n
        jacs = [self._structure(specs, [per_input[i][j] for i in range(len(wrt))]) for j in range(len(outs))]
        jac = pytree.unflatten(spec, jacs)
        return (jac, aux) if self.has_aux else jac


def jacfwd(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, *, has_aux: bool = False) -> GradFunction:
    """The Jacobian of ``fun`` for its argument(s) ``argnums`` in forward mode (``jax.jacfwd``).

    One forward sweep carrying a tangent per input element (batched by
    ``vmap``), so it suits few inputs and many outputs (sensitivities of a
    simulation to a few parameters); :func:`jacrev` suits the opposite. Shapes and pytrees as :func:`jacobian`.

    >>> import numpy as np, opgraph.numpy as onp
    >>> jacfwd(lambda p: onp.stack([p[0] * p[1], onp.sin(p[0]), p[1] ** 2]))(np.array([0.0, 2.0]))
    array([[2., 0.],
           [1., 0.],
           [0., 4.]])
    """
    return JacfwdFunction(fun, argnums, with_value=False, has_aux=has_aux)


jacrev = jacobian
"""``jax.jacrev``'s name for :func:`jacobian` (reverse mode: one sweep per output element)."""


def hvp(fun: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any]) -> Any:
    """Hessian-vector product of scalar ``fun`` by forward-over-reverse: ``(grad fun(*primals), H @ tangents)``.

    The Hessian is never formed: the result costs a small multiple of one
    gradient, which Newton-CG and trust-region methods need. With one primal
    both results are in its structure; with several, tuples of them.

    >>> import numpy as np, opgraph.numpy as onp
    >>> g, hv = hvp(lambda x: onp.sum(x ** 3), (np.array([1.0, 2.0]),), (np.array([1.0, 0.0]),))
    >>> g, hv
    (array([ 3., 12.]), array([6., 0.]))
    """
    _check_pair(f"hvp({_name(fun)})", primals, tangents)
    argnums = 0 if len(primals) == 1 else tuple(range(len(primals)))
    g = GradFunction(fun, argnums, with_value=False, label="hvp")
    return jvp(g, primals, tangents)
