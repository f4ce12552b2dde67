"""``@opgraph.function``: trace a Python function into a graph, once per signature.

The function is called once with placeholder lazy arrays standing for its
array arguments; the ops it records become a :class:`Graph`, which later
calls with the same dtypes and shapes run directly.

    >>> import numpy as np, opgraph
    >>> import opgraph.numpy as onp
    >>> @opgraph.function
    ... def affine(x, w, b):
    ...     return onp.maximum(x @ w + b, 0.0)
    >>> affine(np.ones((2, 3)), np.ones((3, 4)), -np.ones(4))
    array([[2., 2., 2., 2.],
           [2., 2., 2., 2.]])
    >>> print(affine.graph(np.ones((2, 3)), np.ones((3, 4)), -np.ones(4)))
    graph(%x: f64[2,3], %w: f64[3,4], %b: f64[4]) {
      %3: f64[2,4] = matmul(%x, %w)
      %4: f64[2,4] = add(%3, %b)
      %5: f64[] = const 0.0
      %6: f64[2,4] = maximum(%4, %5)
      return %6
    }

Arrays (NumPy arrays, lazy arrays, anything with ``__array__``) are traced
by dtype and shape; Python numbers and other hashable arguments are
*static*: they are baked into the graph, and each new value traces again.

Arguments and results may be pytrees (:mod:`opgraph.frontend.pytree`):
dicts, tuples, lists, namedtuples and ``None``, nested. Each array leaf is a
graph input named after its path (``params.w``, ``xs.0``); the tree structure
is part of the signature; the result comes back in the structure the function
returned, with NumPy arrays for its array leaves.

    >>> @opgraph.function
    ... def predict(params, x):
    ...     return {"y": x @ params["w"] + params["b"]}
    >>> predict({"w": np.ones((3, 2)), "b": np.zeros(2)}, np.ones((1, 3)))
    {'y': array([[3., 3.]])}
    >>> g = predict.graph({"w": np.ones((3, 2)), "b": np.zeros(2)}, np.ones((1, 3)))
    >>> [g.name_of(v) for v in g.inputs]
    ['params.b', 'params.w', 'x']

Called with lazy arrays that depend on placeholders (inside another traced
function, or under ``opgraph.grad``), the function is inlined into the
caller's trace.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from opgraph.core.graph import Graph
from opgraph.frontend import lazy, pytree
from opgraph.frontend.lazy import LazyArray, placeholder, to_graph


def is_array(x: Any) -> bool:
    """Whether a pytree leaf is an array argument (traced as a placeholder) rather than a static value.

    >>> import numpy as np
    >>> is_array(np.ones(2)), is_array(np.float64(1.0)), is_array(3)
    (True, False, False)
    """
    return isinstance(x, (np.ndarray, LazyArray)) or (hasattr(x, "__array__") and not isinstance(x, np.generic))


def _symbolic(x: LazyArray) -> bool:
    """Whether lazy ``x`` depends on a placeholder that has no value (so it cannot be evaluated)."""
    return any(n.is_input and n.value is None for n in lazy.collect_nodes([x._node], stop_at_values=True))


def _is_output(x: Any) -> bool:
    return isinstance(x, (LazyArray, np.ndarray, np.generic, bool, int, float, complex))


@dataclass(frozen=True)
class _Traced:
    graph: Graph
    spec: pytree.PyTreeSpec  # the structure of the result
    static: tuple[tuple[int, Any], ...]  # result leaves that are not arrays: (leaf index, value)

    @functools.cached_property
    def leaf(self) -> bool:
        """The result is one array (the common case, returned without unflattening)."""
        return self.spec.is_leaf() and not self.static


@dataclass(slots=True)
class _Call:
    """One call's arguments, flattened: the cache key and the array leaves (by position among all leaves)."""

    key: Any
    bound: inspect.BoundArguments
    leaves: list[Any]
    spec: pytree.PyTreeSpec
    arrays: list[tuple[int, Any]]  # NumPy arrays, or lazy arrays that cannot be evaluated yet

    @property
    def symbolic(self) -> bool:
        return any(isinstance(a, LazyArray) for _, a in self.arrays)


class TracedFunction:
    """A function traced into graphs; see the module doc. Made by :func:`function`.

    ``name`` is the name errors give the function (``fn.__name__`` by default).
    """

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None) -> None:
        self.fn = fn
        self.signature = inspect.signature(fn)
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self._cache: dict[Any, _Traced] = {}
        self._flat_specs: dict[int, pytree.PyTreeSpec] = {}  # tuple of n leaves, by n
        functools.update_wrapper(self, fn, updated=())

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}(): {exc}") from None
        bound.apply_defaults()
        values = tuple(bound.arguments.values())
        if all(type(v) is np.ndarray for v in values):  # the common call, kept cheap: it is paid at every call
            spec = self._flat_specs.get(len(values))
            if spec is None:
                spec = self._flat_specs[len(values)] = pytree.flatten(values)[1]
            return _Call((spec, *[(v.dtype.str, v.shape) for v in values]), bound, list(values), spec,
                         list(enumerate(values)))
        leaves, spec = pytree.flatten(values)
        key: list[Any] = [spec]
        arrays: list[tuple[int, Any]] = []
        for i, leaf in enumerate(leaves):
            if is_array(leaf):
                arr = leaf if isinstance(leaf, LazyArray) and _symbolic(leaf) else (
                    leaf.eval() if isinstance(leaf, LazyArray) else np.asarray(leaf))
                key.append((arr.dtype.str, arr.shape))
                arrays.append((i, arr))
            else:
                try:
                    hash(leaf)
                except TypeError:
                    path = self._paths(bound)[i]
                    raise TypeError(f"argument {path} of {self.name} is a {type(leaf).__name__}: neither an array "
                                    "nor hashable (static arguments must be hashable)") from None
                key.append((type(leaf), leaf))
        return _Call(tuple(key), bound, leaves, spec, arrays)  # the same key as the common call's for ndarrays

    @staticmethod
    def _paths(bound: inspect.BoundArguments) -> list[str]:
        return [p for name, value in bound.arguments.items() for p in pytree.keystrs(name, value)]

    def _trace(self, call: _Call) -> _Traced:
        hit = self._cache.get(call.key)
        if hit is not None:
            return hit
        roots = list(call.bound.arguments)
        paths = pytree.paths(tuple(call.bound.arguments.values()))
        leaves = list(call.leaves)
        holders = []
        taken: set[str] = set()
        for i, arr in call.arrays:
            name = base = pytree.input_name(roots[paths[i][0]], paths[i][1:])
            k = 1
            while name in taken:  # e.g. keys "a.b" and ("a", "b"): still distinct inputs
                name, k = f"{base}_{k}", k + 1
            taken.add(name)
            holders.append(placeholder(arr.shape, arr.dtype, name=name))
            leaves[i] = holders[-1]
        bound = self.signature.bind_partial()
        bound.arguments.update(zip(roots, pytree.unflatten(call.spec, leaves), strict=True))
        with lazy.tracing():
            result = self.fn(*bound.args, **bound.kwargs)
        outs, spec = pytree.flatten(result)
        static = tuple((i, o) for i, o in enumerate(outs) if not _is_output(o))
        graph = to_graph([o for o in outs if _is_output(o)], inputs=holders)
        traced = self._cache[call.key] = _Traced(graph, spec, static)
        return traced

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self._bind(args, kwargs)
        if call.symbolic:  # called inside another trace: record the function's ops there
            return self.fn(*call.bound.args, **call.bound.kwargs)
        traced = self._trace(call)
        g = traced.graph
        feeds = {int(v): arr for v, (_, arr) in zip(g.inputs, call.arrays, strict=True)}
        # through core's hook: the runtime is a layer above frontend
        results = list(g.run(feeds, list(g.outputs))) if len(g.outputs) else []
        if traced.leaf:
            return results[0]
        for i, value in traced.static:
            results.insert(i, value)
        return pytree.unflatten(traced.spec, results)

    def graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The graph traced for these arguments (traced now if needed): one input per array leaf."""
        return self._trace(self._bind(args, kwargs)).graph

    @property
    def cache_size(self) -> int:
        """How many signatures have been traced."""
        return len(self._cache)

    def __repr__(self) -> str:
        return f"<opgraph.function {self.name}: {self.cache_size} trace(s)>"


def function(fn: Callable[..., Any]) -> TracedFunction:
    """Decorator: trace ``fn`` into a graph per input signature (dtypes and shapes).

    >>> import numpy as np, opgraph
    >>> import opgraph.numpy as onp
    >>> @opgraph.function
    ... def norm(v):
    ...     return onp.sqrt(onp.sum(v * v))
    >>> float(norm(np.array([3.0, 4.0])))
    5.0
    """
    return TracedFunction(fn)


def trace(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Graph:
    """Trace ``fn`` on example arguments and return the graph.

    >>> import numpy as np, opgraph
    >>> g = opgraph.trace(lambda x: x * 2, np.ones(3))
    >>> g.num_ops
    2
    """
    return TracedFunction(fn).graph(*args, **kwargs)
