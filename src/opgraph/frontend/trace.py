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
from typing import Any, NamedTuple

import numpy as np

from opgraph.core.graph import Graph
from opgraph.errors import ArgumentError
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


class Leaf(NamedTuple):  # a tuple: made at every call for each leaf, so it must be cheap
    """How a traced argument leaf is fed: a placeholder of ``dtype`` and ``shape`` (``weak``: a Python scalar's
    weakly typed 0-d placeholder, see :func:`~opgraph.frontend.lazy.placeholder`), fed ``value``."""

    dtype: np.dtype
    shape: tuple[int, ...]
    value: Any
    weak: bool = False


def describe_leaf(x: Any) -> Leaf | None:
    """``@opgraph.function``'s rule: arrays (anything with ``__array__`` but NumPy scalars) are traced, fed as
    NumPy arrays; anything else is static (None).

    >>> import numpy as np
    >>> describe_leaf(np.ones(2, np.float32)).shape, describe_leaf(2.0)
    ((2,), None)
    """
    if not is_array(x):
        return None
    arr = np.asarray(x)
    return Leaf(arr.dtype, arr.shape, arr)


@dataclass(frozen=True)
class Traced:
    """One signature's trace: the graph (one input per array leaf, one output per array result leaf) and how to
    put its results back in the structure the function returned."""

    graph: Graph
    spec: pytree.PyTreeSpec  # the structure of the result
    static: tuple[tuple[int, Any], ...]  # result leaves that are not arrays: (leaf index, value)

    @functools.cached_property
    def leaf(self) -> bool:
        """The result is one array (the common case, returned without unflattening)."""
        return self.spec.is_leaf() and not self.static

    def rebuild(self, results: list[Any]) -> Any:
        """The result in the structure the function returned, from the graph's results."""
        if self.leaf:
            return results[0]
        for i, value in self.static:
            results.insert(i, value)
        return pytree.unflatten(self.spec, results)


@dataclass(slots=True)
class BoundCall:
    """One call's arguments, flattened: the cache key and the array leaves (by position among all leaves)."""

    key: Any
    bound: inspect.BoundArguments
    leaves: list[Any]
    spec: pytree.PyTreeSpec
    arrays: list[tuple[int, Any]]  # (leaf position, value to feed): arrays, or lazy arrays not evaluable yet
    infos: list[Leaf | None] | None = None  # each traced leaf's placeholder (None: a NumPy array's own)
    roots: tuple[str, ...] | None = None  # the traced parameters (None: all of them)

    @property
    def symbolic(self) -> bool:
        return any(isinstance(a, LazyArray) for _, a in self.arrays)


class TracedFunction:
    """A function traced into graphs; see the module doc. Made by :func:`function`.

    ``name`` is the name errors give the function (``fn.__name__`` by default). ``describe`` says how an argument
    leaf is traced (:func:`describe_leaf` by default; None: it is static, or with ``strict`` an error); the
    parameters named in ``static`` are static whole (hashed into the cache key, never flattened). ``finish``, if
    given, rewrites each traced graph before it is kept (a transform's clean-up, such as forward mode reading a
    loop's results off the loop that carries its tangents).
    """

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None,
                 describe: Callable[[Any], Leaf | None] = describe_leaf, static: frozenset[str] = frozenset(),
                 strict: bool = False, finish: Callable[[Graph], Graph] | None = None) -> None:
        self.fn = fn
        self.finish = finish
        self.signature = inspect.signature(fn)
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.describe = describe
        self.static = static
        self.strict = strict  # a leaf that is not an array, outside the static parameters, is an error
        self._cache: dict[Any, Traced] = {}
        self.flat_specs: dict[int, pytree.PyTreeSpec] = {}  # tuple of n leaves, by n
        params = list(self.signature.parameters.values())
        # a call that passes every parameter positionally binds without inspect's (slow) Signature.bind
        self.positional_names = tuple(p.name for p in params) if all(
            p.kind is p.POSITIONAL_OR_KEYWORD for p in params) else None
        functools.update_wrapper(self, fn, updated=())

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BoundCall:
        """One call's arguments bound to the parameters and flattened, with their cache key."""
        if not kwargs and self.positional_names is not None and len(args) == len(self.positional_names):
            bound = inspect.BoundArguments(self.signature, dict(zip(self.positional_names, args, strict=True)))  # type: ignore[arg-type]
        else:
            try:
                bound = self.signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise ArgumentError(f"{self.name}(): {exc}") from None
            if not self.strict:  # strict (jit) leaves defaults to Python, as JAX does: they are never traced
                bound.apply_defaults()
        if self.static:
            return self._bind_static(bound)
        values = tuple(bound.arguments.values())
        if all(type(v) is np.ndarray for v in values):  # the common call, kept cheap: it is paid at every call
            spec = self.flat_specs.get(len(values))
            if spec is None:
                spec = self.flat_specs[len(values)] = pytree.flatten(values)[1]
            return BoundCall((spec, *[(v.dtype, v.shape) for v in values]), bound, list(values), spec,
                         list(enumerate(values)))
        return self._bind_leaves(bound, values, [], None)

    def _bind_static(self, bound: inspect.BoundArguments) -> BoundCall:
        key: list[Any] = []
        roots = []
        for name, value in bound.arguments.items():
            if name not in self.static:
                roots.append(name)
                continue
            try:
                hash(value)
            except TypeError:
                raise ArgumentError(f"static argument {name} of {self.name} is a {type(value).__name__}, which is "
                                    "not hashable (static values are part of the cache key: pass a tuple for a "
                                    "list, or make it a traced argument)") from None
            key.append((name, type(value), value))
        return self._bind_leaves(bound, tuple(bound.arguments[n] for n in roots), key, tuple(roots))

    def _bind_leaves(self, bound: inspect.BoundArguments, values: tuple[Any, ...], key: list[Any],
                     roots: tuple[str, ...] | None) -> BoundCall:
        leaves, spec = pytree.flatten(values)
        key = [spec, *key]
        arrays: list[tuple[int, Any]] = []
        infos: list[Leaf | None] = []
        for i, leaf in enumerate(leaves):
            if type(leaf) is np.ndarray:  # the common leaf, kept cheap
                key.append((leaf.dtype, leaf.shape))
                arrays.append((i, leaf))
                infos.append(None)
                continue
            if isinstance(leaf, LazyArray):
                if _symbolic(leaf):
                    info = Leaf(leaf.dtype, leaf.shape, leaf)  # type: ignore[arg-type]
                else:
                    arr = leaf.eval()
                    info = Leaf(arr.dtype, arr.shape, arr)
            else:
                info = self.describe(leaf)
            if info is not None:
                key.append((info.dtype, info.shape, "weak") if info.weak else
                           (info.dtype, info.shape, "lazy") if isinstance(info.value, LazyArray) else
                           (info.dtype, info.shape))
                arrays.append((i, info.value))
                infos.append(info)
                continue
            if self.strict:
                path = self.leaf_paths(bound, roots)[i]
                raise ArgumentError(f"argument {path} of {self.name} is a {type(leaf).__name__}, not an array or a "
                                    "number: pass it as a static argument (static_argnums or static_argnames), or "
                                    "pass an array") from None
            try:
                hash(leaf)
            except TypeError:
                path = self.leaf_paths(bound, roots)[i]
                raise ArgumentError(f"argument {path} of {self.name} is a {type(leaf).__name__}: neither an array "
                                    "nor hashable (static arguments must be hashable)") from None
            key.append((type(leaf), leaf))
        return BoundCall(tuple(key), bound, leaves, spec, arrays, infos, roots)  # the same key as the common call's

    @staticmethod
    def leaf_paths(bound: inspect.BoundArguments, roots: tuple[str, ...] | None = None) -> list[str]:
        return [p for name, value in bound.arguments.items() if roots is None or name in roots
                for p in pytree.keystrs(name, value)]

    def trace(self, call: BoundCall) -> Traced:
        """The traced graph for ``call``'s signature (traced now unless cached)."""
        hit = self._cache.get(call.key)
        if hit is not None:
            return hit
        roots = list(call.bound.arguments) if call.roots is None else list(call.roots)
        paths = pytree.paths(tuple(call.bound.arguments[r] for r in roots))
        leaves = list(call.leaves)
        holders = []
        taken: set[str] = set()
        for k, (i, arr) in enumerate(call.arrays):
            info = call.infos[k] if call.infos and call.infos[k] is not None else Leaf(arr.dtype, arr.shape, arr)
            name = base = pytree.input_name(roots[paths[i][0]], paths[i][1:])
            n = 1
            while name in taken:  # e.g. keys "a.b" and ("a", "b"): still distinct inputs
                name, n = f"{base}_{n}", n + 1
            taken.add(name)
            holders.append(placeholder(info.shape, info.dtype, name=name, weak=info.weak))
            leaves[i] = holders[-1]
        bound = self.signature.bind_partial()
        bound.arguments.update(call.bound.arguments)
        bound.arguments.update(zip(roots, pytree.unflatten(call.spec, leaves), strict=True))
        with lazy.tracing():
            result = self.fn(*bound.args, **bound.kwargs)
        outs, spec = pytree.flatten(result)
        static = tuple((i, o) for i, o in enumerate(outs) if not _is_output(o))
        graph = to_graph([o for o in outs if _is_output(o)], inputs=holders)
        if self.finish is not None:
            graph = self.finish(graph)
        traced = self._cache[call.key] = Traced(graph, spec, static)
        return traced

    _trace = trace

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self.bind(args, kwargs)
        if call.symbolic:  # called inside another trace: record the function's ops there
            return self.fn(*call.bound.args, **call.bound.kwargs)
        traced = self.trace(call)
        g = traced.graph
        feeds = {int(v): arr for v, (_, arr) in zip(g.inputs, call.arrays, strict=True)}
        # through core's hook: the runtime is a layer above frontend
        return traced.rebuild(list(g.run(feeds, list(g.outputs))) if len(g.outputs) else [])

    def graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The graph traced for these arguments (traced now if needed): one input per array leaf."""
        return self.trace(self.bind(args, kwargs)).graph

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
