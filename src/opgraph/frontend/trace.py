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
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from opgraph.core.graph import Graph
from opgraph.frontend import lazy
from opgraph.frontend.lazy import LazyArray, placeholder, to_graph


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, LazyArray)) or (hasattr(x, "__array__") and not isinstance(x, np.generic))


@dataclass(frozen=True)
class _Traced:
    graph: Graph
    structure: Any  # "single", ("tuple", n), ("list", n) or ("dict", keys)


class TracedFunction:
    """A function traced into graphs; see the module doc. Made by :func:`function`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.signature = inspect.signature(fn)
        self._cache: dict[Any, _Traced] = {}
        functools.update_wrapper(self, fn)

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[tuple[str, np.ndarray]],
                                                                             inspect.BoundArguments]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key: list[Any] = []
        arrays: list[tuple[str, np.ndarray]] = []
        for name, value in bound.arguments.items():
            if _is_array(value):
                arr = value.eval() if isinstance(value, LazyArray) else np.asarray(value)
                key.append((name, "array", arr.dtype.str, arr.shape))
                arrays.append((name, arr))
            else:
                try:
                    hash(value)
                except TypeError:
                    raise TypeError(f"argument {name!r} of {self.fn.__name__} is neither an array nor hashable "
                                    f"(static arguments must be hashable)") from None
                key.append((name, "static", type(value).__name__, value))
        return tuple(key), arrays, bound

    def _trace(self, key: Any, arrays: list[tuple[str, np.ndarray]], bound: inspect.BoundArguments) -> _Traced:
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        holders = {name: placeholder(arr.shape, arr.dtype, name=name) for name, arr in arrays}
        call_args = dict(bound.arguments)
        call_args.update(holders)
        lazy._TRACING += 1
        try:
            bound2 = self.signature.bind_partial()
            bound2.arguments.update(call_args)
            result = self.fn(*bound2.args, **bound2.kwargs)
        finally:
            lazy._TRACING -= 1
        if isinstance(result, dict):
            structure: Any = ("dict", tuple(result))
            outs = list(result.values())
        elif isinstance(result, (tuple, list)):
            structure = (type(result).__name__, len(result))
            outs = list(result)
        else:
            structure = "single"
            outs = [result]
        graph = to_graph(outs, inputs=[holders[name] for name, _ in arrays])
        traced = self._cache[key] = _Traced(graph, structure)
        return traced

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key, arrays, bound = self._bind(args, kwargs)
        traced = self._trace(key, arrays, bound)
        g = traced.graph
        feeds = {int(v): arr for v, (_, arr) in zip(g.inputs, arrays, strict=True)}
        results = g.run(feeds, list(g.outputs))  # through core's hook: the runtime is a layer above frontend
        kind = traced.structure
        if kind == "single":
            return results[0]
        if kind[0] == "dict":
            return dict(zip(kind[1], results, strict=True))
        return tuple(results) if kind[0] == "tuple" else list(results)

    def graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The graph traced for these arguments (traced now if needed)."""
        key, arrays, bound = self._bind(args, kwargs)
        return self._trace(key, arrays, bound).graph

    @property
    def cache_size(self) -> int:
        """How many signatures have been traced."""
        return len(self._cache)

    def __repr__(self) -> str:
        return f"<opgraph.function {self.fn.__name__}: {self.cache_size} trace(s)>"


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
