"""``opgraph.jit``: trace, optimise and compile a Python function for an engine, once per input signature.

The first call with a new signature (the pytree structure of the arguments, each array leaf's dtype and shape,
the static values) traces ``fun`` into a graph (as :func:`opgraph.function` does), optimises it
(:func:`opgraph.optimize` at level ``optimize``) and compiles it for ``backend``
(:func:`opgraph.compile`); the executable is cached. Later calls with that signature only flatten the arguments,
look the signature up and run the executable.

    >>> import numpy as np, opgraph
    >>> import opgraph.numpy as onp
    >>> @opgraph.jit
    ... def step(params, x, lr):
    ...     loss = onp.sum((x @ params["w"]) ** 2)
    ...     return {"w": params["w"] - lr * 2.0 * x.T @ (x @ params["w"])}, loss
    >>> new, loss = step({"w": np.ones((2, 1))}, np.ones((1, 2)), 0.1)
    >>> new["w"].ravel(), float(loss)
    (array([0.6, 0.6]), 4.0)
    >>> _ = step({"w": np.ones((2, 1))}, np.ones((1, 2)), 0.05)   # a new scalar: no new trace
    >>> step.cache_size
    1

Arguments are taken as JAX takes them:

* array leaves (NumPy, jax and torch arrays, NumPy scalars) are traced by dtype and shape, read without a copy
  (:func:`opgraph.backends.arrays.describe`);
* Python scalars (``bool``, ``int``, ``float``, ``complex``) are traced as *weakly typed* 0-d inputs: a new value
  does not trace again, and next to arrays they take the arrays' dtype (``x_f32 * lr`` stays float32);
* anything else (strings, objects) must be static: name it in ``static_argnums`` / ``static_argnames`` (its
  value, which must be hashable, is part of the signature: a new value traces again), else the call is an
  :class:`~opgraph.errors.ArgumentError` (a ``FeedError`` and a ``TypeError``) naming the argument path.

Results come back in the structure ``fun`` returned, array leaves in the callers' array kind and device where
every array argument has the same kind (NumPy otherwise; see :func:`opgraph.compile`'s ``result=``), other leaves
(strings, ``None``) as they were. Called with lazy arrays that depend on placeholders (inside another trace: a jitted
function called in a jitted function, or under :func:`opgraph.grad`), ``fun`` is inlined into the caller's trace.

``donate_argnums``: the buffers of those arguments' leaves may be reused for the results. The jax engine
passes them to ``jax.jit(donate_argnums=...)``; the numpy engine writes results over them where an in-place op
is their last reader (:meth:`~opgraph.backends.numpy.CompiledGraph.donors`); the other engines accept the option
and reuse nothing (``explain()`` says which).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph.backends.arrays import describe as describe_array
from opgraph.backends.arrays import keyer as array_keyer
from opgraph.core.graph import Graph
from opgraph.errors import ArgumentError
from opgraph.frontend import pytree
from opgraph.frontend.trace import BoundCall, Leaf, Traced, TracedFunction
from opgraph.passes import LEVELS
from opgraph.passes import optimize as optimize_graph
from opgraph.runtime.compiled import compile as compile_graph

__all__ = ["DEFAULT_LEVEL", "Jitted", "jit"]

DEFAULT_LEVEL = 2
"""The optimisation level ``jit`` uses unless told: exact rewrites (level 1) plus fusions every engine runs as
fast or faster (level 2); level 3's elementwise fusion is tuned for the numpy engine's cost model."""

_DONATING = frozenset({"jax"})  # engines whose executables take donated buffers (numpy's arena says which it takes)


_WEAK = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64),
         complex: np.dtype(np.complex128)}

# each leaf type's part of the signature key, without describing the leaf (as TracedFunction keys it)
_KEY: dict[type, Callable[[Any], Any]] = {
    np.ndarray: lambda a: (a.dtype, a.shape),
    **{t: (lambda k: lambda _: k)((dt, (), "weak")) for t, dt in _WEAK.items()},
}


def _learn_keys(leaves: Sequence[Any]) -> bool:
    """Learn how to key the array types among ``leaves`` (jax and torch arrays: by NumPy dtype and shape, so they
    share their NumPy twins' signatures); False if a leaf is of a type that keys no other way (a static value)."""
    for a in leaves:
        if type(a) not in _KEY:
            how = array_keyer(type(a))
            if how is None:
                return False
            _KEY[type(a)] = how
    return True


def describe_leaf(x: Any) -> Leaf | None:
    """How ``jit`` traces an argument leaf: arrays by dtype and shape (fed as they are, no copy), Python scalars as
    weakly typed 0-d inputs, anything else not at all (None: it must be static).

    >>> import numpy as np
    >>> describe_leaf(np.ones((2, 3), np.float32)).shape, describe_leaf(0.5).weak, describe_leaf("a")
    ((2, 3), True, None)
    """
    weak = _WEAK.get(type(x))
    if weak is not None:
        return Leaf(weak, (), x, True)
    info = describe_array(x)
    if info is not None:
        return Leaf(info.dtype, info.shape, x)
    if isinstance(x, np.generic):  # strongly typed, as in JAX
        return Leaf(x.dtype, (), np.asarray(x))
    if isinstance(x, (bool, int, float, complex)):  # subclasses (IntEnum, ...)
        return Leaf(_WEAK[next(t for t in (bool, int, float, complex) if isinstance(x, t))], (), x, weak=True)
    if hasattr(x, "__array__"):
        arr = np.asarray(x)
        return Leaf(arr.dtype, arr.shape, arr)
    return None


@dataclass
class _Entry:
    """One signature's executable and how it was made."""

    traced: Traced
    graph: Graph  # optimised
    program: Any
    signature: str
    donated: list[str]
    seconds: dict[str, float] = field(default_factory=dict)

    def run(self, arrays: Sequence[Any]) -> Any:
        """Run on the call's array leaves (in leaf order); the result in the function's structure."""
        results = self.program(*arrays)  # the leaves are the program graph's inputs, in order
        return self.traced.rebuild(results if type(results) is list else list(results))


def _argnums(value: int | Sequence[int], what: str, fname: str) -> tuple[int, ...]:
    nums = (value,) if isinstance(value, int) else tuple(value)
    if not all(isinstance(n, int) for n in nums):
        raise ArgumentError(f"jit({fname}): {what} must be ints, got {value!r}")
    return nums


class Jitted:
    """A function compiled per input signature; see the module doc. Made by :func:`jit`.

    >>> import numpy as np, opgraph
    >>> f = opgraph.jit(lambda x: x * 2.0)
    >>> f(np.ones(2)), f.cache_size
    (array([2., 2.]), 1)
    """

    def __init__(self, fun: Callable[..., Any], *, backend: str = "numpy", device: str | None = None,
                 static_argnums: int | Sequence[int] = (), static_argnames: str | Sequence[str] = (),
                 donate_argnums: int | Sequence[int] = (), optimize: int = DEFAULT_LEVEL) -> None:
        self.fun = fun
        self.name = getattr(fun, "__name__", type(fun).__name__)
        if optimize not in LEVELS:
            raise ArgumentError(f"jit({self.name}): optimize must be one of {sorted(LEVELS)}, got {optimize!r}")
        self.backend = backend
        self.device = device
        self.optimize = optimize
        sig = inspect.signature(fun)
        params = list(sig.parameters.values())
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        static = set((static_argnames,) if isinstance(static_argnames, str) else static_argnames)
        unknown = sorted(static - set(sig.parameters))
        if unknown:
            raise ArgumentError(f"jit({self.name}): static_argnames {unknown} name no parameter of {self.name}"
                                f"{sig}")
        self._donate: set[str] = set()
        for what, nums, into in (("static_argnums", static_argnums, static), ("donate_argnums", donate_argnums,
                                                                             self._donate)):
            for n in _argnums(nums, what, self.name):
                if not -len(positional) <= n < len(positional):
                    raise ArgumentError(f"jit({self.name}): {what} {n} is out of range: {self.name}{sig} has "
                                        f"{len(positional)} positional parameter(s)")
                into.add(positional[n])
        both = sorted(static & self._donate)
        if both:
            raise ArgumentError(f"jit({self.name}): argument(s) {both} are both static and donated")
        self.static_argnames = frozenset(static)
        self._tracer = TracedFunction(fun, name=self.name, describe=describe_leaf, static=self.static_argnames,
                                      strict=True)
        self._cache: dict[Any, _Entry] = {}
        # a call passing NumPy arrays positionally to every parameter skips binding (the key is the tracer's)
        names = self._tracer.positional_names
        self._arity = len(names) if names is not None and not static else -1
        self._last: tuple[Any, _Entry, Callable[[Sequence[Any]], list[Any] | None]] | None = None
        functools.update_wrapper(self, fun, updated=())

    # ---------------------------------------------------------------- calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == self._arity and not kwargs:  # the common calls: only flattening, the lookup and the run
            if all(type(a) is np.ndarray for a in args):
                spec = self._tracer.flat_specs.get(len(args))
                entry = self._cache.get((spec, *[(a.dtype, a.shape) for a in args])) if spec is not None else None
                if entry is not None:
                    return entry.run(args)
            else:
                leaves, spec = pytree.flatten(args)
                last = self._last
                if last is not None and last[0] == spec:
                    # the structure of the last call: its program's direct call checks each leaf's type, dtype and
                    # shape (the signature) as it feeds it, so no key is built (None: another signature)
                    got = last[2](leaves)
                    if got is not None:
                        return last[1].traced.rebuild(got)
                try:
                    key = (spec, *[_KEY[type(a)](a) for a in leaves])
                except KeyError:  # a leaf type not seen yet (a jax or torch array) or a static value: bind it
                    key = _learn_keys(leaves) and (spec, *[_KEY[type(a)](a) for a in leaves])
                entry = self._cache.get(key) if key is not None else None
                if entry is not None:
                    direct = getattr(entry.program, "direct", None)
                    call = direct() if direct is not None and len(entry.graph.inputs) == len(leaves) else None
                    self._last = (spec, entry, call) if call is not None else None
                    return entry.run(leaves)
        call = self._tracer.bind(args, kwargs)
        entry = self._cache.get(call.key)  # a key with traced (lazy) leaves is never cached
        if entry is None:
            if call.symbolic:  # called inside another trace: record fun's ops there
                return self.fun(*call.bound.args, **call.bound.kwargs)
            entry = self._compile(call)
        return entry.run([a for _, a in call.arrays])

    def _compile(self, call: BoundCall) -> _Entry:
        t0 = time.perf_counter()
        traced = self._tracer.trace(call)
        t1 = time.perf_counter()
        graph = optimize_graph(traced.graph, self.optimize)
        t2 = time.perf_counter()
        donate = self._donated_inputs(call, graph)
        options: dict[str, Any] = {"donate": [pos for pos, _ in donate]} if donate and self.backend != "auto" else {}
        program = compile_graph(graph, self.backend, device=self.device, **options)
        t3 = time.perf_counter()
        entry = _Entry(traced, graph, program, self._signature(call),
                       [name for _, name in donate],
                       {"trace": t1 - t0, "optimize": t2 - t1, "compile": t3 - t2})
        self._cache[call.key] = entry
        return entry

    def _donated_inputs(self, call: BoundCall, graph: Graph) -> list[tuple[int, str]]:
        """(input position, name) of the graph inputs that come from donated arguments."""
        if not self._donate:
            return []
        roots = call.roots if call.roots is not None else tuple(call.bound.arguments)
        owner = [r for r in roots for _ in pytree.flatten(call.bound.arguments[r])[0]]
        return [(k, graph.name_of(int(graph.inputs[k])) or f"input {k}")
                for k, (i, _) in enumerate(call.arrays) if owner[i] in self._donate]

    def _signature(self, call: BoundCall) -> str:
        paths = TracedFunction.leaf_paths(call.bound, call.roots)
        parts = []
        for k, (i, _) in enumerate(call.arrays):
            info = call.infos[k] if call.infos else None
            dtype, shape = (info.dtype, info.shape) if info else (call.arrays[k][1].dtype, call.arrays[k][1].shape)
            weak = " (weak)" if info is not None and info.weak else ""
            parts.append(f"{paths[i]}: {np.dtype(dtype).name}{list(shape)}{weak}")
        for name in sorted(self.static_argnames & set(call.bound.arguments)):
            parts.append(f"{name}={call.bound.arguments[name]!r} (static)")
        return ", ".join(parts)

    def _entry(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Entry:
        call = self._tracer.bind(args, kwargs)
        if call.symbolic:
            raise ArgumentError(f"jit({self.name}): lower/explain need concrete arguments (arrays or shapes), "
                                "not values traced inside another function")
        return self._cache.get(call.key) or self._compile(call)

    # ---------------------------------------------------------------- inspection
    def graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The graph traced for these arguments, before optimisation (traced now if needed, not compiled).

        >>> import numpy as np, opgraph
        >>> opgraph.jit(lambda x: x + 1.0).graph(np.ones(2)).num_ops
        2
        """
        return self._tracer.trace(self._tracer.bind(args, kwargs)).graph

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """The compiled program for these arguments' signature (compiled now if needed): a
        :class:`~opgraph.runtime.compiled.Program` (an ``AutoCompiled`` for ``backend="auto"``).

        >>> import numpy as np, opgraph
        >>> type(opgraph.jit(lambda x: x + 1.0).lower(np.ones(2))).__name__
        'Program'
        """
        return self._entry(args, kwargs).program

    def explain(self, *args: Any, **kwargs: Any) -> str:
        """The signature, the seconds spent tracing, optimising and compiling it, the donated inputs, and the
        compiled program's own ``explain()``.

        >>> import numpy as np, opgraph
        >>> print(opgraph.jit(lambda x: x + 1.0, backend="numpy").explain(np.ones(2)).splitlines()[0])
        jit(<lambda>) on numpy: x: float64[2]
        """
        e = self._entry(args, kwargs)
        s = e.seconds
        lines = [f"jit({self.name}) on {self.backend}: {e.signature}",
                 f"trace {s['trace']:.4f} s ({e.traced.graph.num_ops} ops), optimize level {self.optimize} "
                 f"{s['optimize']:.4f} s ({e.graph.num_ops} ops), compile {s['compile']:.4f} s"]
        if e.donated:
            arena = getattr(e.program, "arena_runtime", None)
            if arena is not None:  # the numpy arena says which results take which donated arrays
                taken = sorted(e.graph.name_of(v) or f"%{v}" for v in arena.donors().values())
                how = (f"results written over {', '.join(taken)}" if taken else
                       "no op of this program can write its result over them")
            elif self.backend in _DONATING:
                how = "buffers handed to the engine for reuse"
            else:
                how = f"accepted; the {self.backend} engine reuses no input buffer"
            lines.append(f"donated: {', '.join(e.donated)} ({how})")
        explain = getattr(e.program, "explain", None)
        if explain is not None:
            lines.append(explain())
        return "\n".join(lines)

    def compile_seconds(self, *args: Any, **kwargs: Any) -> float:
        """Seconds the first call with this signature spent tracing, optimising and compiling.

        >>> import numpy as np, opgraph
        >>> opgraph.jit(lambda x: x + 1.0).compile_seconds(np.ones(2)) > 0
        True
        """
        return sum(self._entry(args, kwargs).seconds.values())

    @property
    def cache_size(self) -> int:
        """How many signatures have been compiled."""
        return len(self._cache)

    @property
    def compile_times(self) -> dict[str, dict[str, float]]:
        """Seconds spent on each signature compiled so far, by phase (``trace``, ``optimize``, ``compile``).

        >>> import numpy as np, opgraph
        >>> f = opgraph.jit(lambda x: x + 1.0)
        >>> _ = f(np.ones(2)); list(f.compile_times), sorted(f.compile_times["x: float64[2]"])
        (['x: float64[2]'], ['compile', 'optimize', 'trace'])
        """
        return {e.signature: dict(e.seconds) for e in self._cache.values()}

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        # a jitted method: bound to its instance, which is then its first argument (static, or an error, as in JAX)
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self) -> str:
        return f"<opgraph.jit {self.name} on {self.backend}: {self.cache_size} signature(s) compiled>"


def jit(fun: Callable[..., Any] | None = None, *, backend: str = "numpy", device: str | None = None,
        static_argnums: int | Sequence[int] = (), static_argnames: str | Sequence[str] = (),
        donate_argnums: int | Sequence[int] = (), optimize: int = DEFAULT_LEVEL) -> Any:
    """Compile ``fun`` for ``backend`` once per input signature (see the module doc); a decorator with or
    without options.

    * ``backend``: ``"numpy"`` (default), ``"jax"``, ``"torch"``, ``"onnxruntime"``, ``"dask"`` or ``"auto"``
      (:func:`opgraph.compile`'s choice); ``device``: ``"cpu"`` or ``"cuda"`` where the engine has it.
    * ``static_argnums`` / ``static_argnames``: arguments whose (hashable) values are part of the signature.
    * ``donate_argnums``: arguments whose buffers the engine may reuse (jax, numpy); others accept and ignore it.
    * ``optimize``: the :func:`opgraph.optimize` level (0 to 3; default :data:`DEFAULT_LEVEL`).

    >>> import numpy as np, opgraph
    >>> import opgraph.numpy as onp
    >>> @opgraph.jit(static_argnames="axis")
    ... def norm(x, axis):
    ...     return onp.sqrt(onp.sum(x * x, axis=axis))
    >>> norm(np.array([[3.0, 4.0]]), axis=1)
    array([5.])
    """
    options = {"backend": backend, "device": device, "static_argnums": static_argnums,
               "static_argnames": static_argnames, "donate_argnums": donate_argnums, "optimize": optimize}
    if fun is None:
        return lambda f: Jitted(f, **options)
    return Jitted(fun, **options)
