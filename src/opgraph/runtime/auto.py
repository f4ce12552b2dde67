"""``backend="auto"``: time the installed backends on the graph and keep the fastest.

Each installed backend compiles the graph (partitioned where it lacks ops)
and runs once to warm up (JIT compilation happens there). Then each is
timed in a block of consecutive calls, its steady state (at least
``repeats`` calls, more while its share of the budget lasts), in two passes
over the candidates so that a change of load on a shared machine falls on
all of them. The smallest median wins; the report gives every candidate's
median.
Backends that fail to compile or run are left out, with the reason in the
report. Without example inputs the choice is made on the first call's feeds.

An engine whose results differ from NumPy's on an op of the graph (its declared
:attr:`~opgraph.backends.base.Backend.numerics`: jax on CPU flushes subnormals
to zero) is left out, with the reason in the report, so ``auto`` never switches
a graph silently to an engine that changes its results; ``allow_numerics``
names the differences to accept (``("ftz",)``, or True for all). A graph
without such ops costs nothing more.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (4,)), name="x")
    >>> b.output(b.op("exp", x))
    >>> choice = choose(b.freeze(), {"x": np.zeros(4)}, candidates=("numpy",))
    >>> choice.backend, choice.compiled({"x": np.zeros(4)})[0]
    ('numpy', array([1., 1., 1., 1.]))
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph import backends
from opgraph.core.feeds import resolve_feeds, value_id
from opgraph.core.graph import Graph


@dataclass
class Choice:
    """What ``auto`` chose: the backend, its compiled graph, the median seconds per call of each candidate
    (``None`` where it failed), why each failure happened, and each candidate's fastest call."""

    backend: str
    compiled: Any
    timings: dict[str, float | None] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    fastest: dict[str, float] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)
    """Engines not timed because their results differ from NumPy's on this graph, and how."""

    def report(self) -> str:
        """One line: the choice and every candidate's median time (or why it failed or was left out)."""
        parts = []
        for name, t in sorted(self.timings.items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0)):
            parts.append(f"{name} {t * 1e3:.3f} ms" if t is not None else f"{name} failed ({self.failures[name]})")
        parts += [f"{name} left out ({why})" for name, why in self.excluded.items()]
        return f"auto chose {self.backend}: " + ", ".join(parts)


NOT_TIMED = frozenset({"dask"})
"""Installed backends ``auto`` does not time unless named in ``candidates``."""


def _numpy_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options the NumPy candidate takes: only compile()'s own keywords (backend options are not its)."""
    return {k: options[k] for k in ("memory_limit",) if k in options}


def numerics_exclusions(graph: Graph, names: Sequence[str], device: str | None = None,
                        allow_numerics: Sequence[str] | bool = ()) -> dict[str, str]:
    """Engine -> why ``auto`` leaves it out: its declared differences from NumPy that concern an op of ``graph``
    (on ``device``) and are not in ``allow_numerics`` (True: allow all).

    >>> import opgraph
    >>> from opgraph.backends.base import Backend, NumericsDifference, near_subnormal
    >>> ftz = NumericsDifference("ftz", "subnormal operands", "read as zero", near_subnormal)
    >>> _ = backends.register(Backend("doc_ftz", rules={"log": np.log}, numerics=(ftz,)))
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (4,)), name="x"); b.output(b.op("log", x))
    >>> print(numerics_exclusions(b.freeze(), ["numpy", "doc_ftz"])["doc_ftz"])
    1 op(s) (log) would change: ftz (cpu): subnormal operands: read as zero; allow_numerics=('ftz',) times it
    >>> numerics_exclusions(b.freeze(), ["numpy", "doc_ftz"], allow_numerics=("ftz",))
    {}
    >>> backends.unregister("doc_ftz")
    """
    if allow_numerics is True:
        return {}
    allowed = set() if allow_numerics is False else set(allow_numerics)
    out: dict[str, str] = {}
    for name in names:
        if name == "numpy":
            continue
        try:
            be = backends.get(name)
        except Exception:  # not installed: compiling it below reports that
            continue
        if not be.numerics:
            continue
        dev = device if device is not None else be.devices[0]
        found = {tag: ops for tag, ops in be.differs_from_numpy(graph, dev).items() if tag not in allowed}
        if found:
            notes = {d.tag: d for d in be.numerics}
            ops = sorted({op for o in found.values() for op in o})
            kinds = sorted({graph.kind_of(op) for op in ops})
            out[name] = (f"{len(ops)} op(s) ({', '.join(kinds[:6])}{', ...' if len(kinds) > 6 else ''}) would change: "
                         + "; ".join(notes[t].note() for t in found)
                         + f"; allow_numerics={tuple(found)!r} times it")
    return out


def choose(graph: Graph, feeds: Mapping[Any, Any], *, budget: float = 20.0, repeats: int = 5,
           candidates: Sequence[str] | None = None, device: str | None = None,
           allow_numerics: Sequence[str] | bool = (), **options: Any) -> Choice:
    """Compile ``graph`` on every installed backend (or ``candidates``), time each on ``feeds``, keep the fastest;
    engines whose results differ from NumPy's on this graph are left out unless ``allow_numerics`` allows it."""
    from opgraph.runtime.compiled import compile as compile_on

    # dask is for data larger than one machine's memory: timing it on small example feeds says nothing about
    # that, so "auto" picks among the in-memory engines unless dask is named as a candidate
    names = list(candidates or [n for n in backends.available() if n not in NOT_TIMED])
    excluded = numerics_exclusions(graph, names, device, allow_numerics)
    names = [n for n in names if n not in excluded]
    failures: dict[str, str] = {}
    compiled: dict[str, Any] = {}

    def failed(name: str, exc: Exception) -> None:
        failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        compiled.pop(name, None)

    for name in names:  # compile and warm up (JIT compilation happens in the first call)
        try:
            c = compile_on(graph, backend=name, device=device if name != "numpy" else None,
                           **(options if name != "numpy" else _numpy_options(options)))
            c(dict(feeds))
            compiled[name] = c
        except Exception as exc:  # a backend that cannot run this graph is left out, with the reason
            failed(name, exc)
    # Each candidate is timed in a block of consecutive calls (its steady state: calls of other engines in
    # between slow every engine down through the caches and the allocator), in two passes over the candidates
    # so that a change of load on a shared machine falls on all of them; the first call of a block re-warms.
    # After the warm-up call the update destinations hold state on each engine: timed calls feed the rest
    # only, as steady-state calls do (feeding the state every call would time its transfer, not the engine).
    dests = {int(d) for d in graph.updates[:, 1].tolist()}
    steady = {k: v for k, v in feeds.items() if value_id(graph, k) not in dests}
    times: dict[str, list[float]] = {n: [] for n in compiled}
    block = budget / (2 * max(1, len(compiled)))
    for _pass in range(2):
        for name in list(compiled):
            t_block = time.perf_counter()
            try:
                compiled[name](dict(steady))
                done = 0
                while done < repeats or (done < 8 * repeats and time.perf_counter() - t_block < block / 2):
                    t0 = time.perf_counter()
                    compiled[name](dict(steady))
                    times[name].append(time.perf_counter() - t0)
                    done += 1
            except Exception as exc:
                failed(name, exc)
    if not compiled:
        from opgraph.backends.base import BackendError

        raise BackendError("auto: no backend could run the graph (or was allowed to): " + "; ".join(
            f"{k}: {v}" for k, v in {**failures, **excluded}.items()))
    timings: dict[str, float | None] = {n: float(np.median(times[n])) if n in compiled else None for n in names}
    for c in compiled.values():
        c.reset_state()  # the timing calls must not leave update-edge state behind
    chosen = min(compiled, key=lambda n: timings[n])  # type: ignore[arg-type,return-value]
    return Choice(chosen, compiled[chosen], timings, failures, {n: min(times[n]) for n in compiled}, excluded)


class AutoCompiled:
    """A graph whose backend is chosen by timing on its first call's feeds (``backend="auto"`` without examples).

    ``choice`` is None until the first call; after it, calls go to the chosen backend.
    """

    def __init__(self, graph: Graph, *, budget: float = 20.0, device: str | None = None, **options: Any) -> None:
        self.graph = graph
        self.budget = budget
        self.device = device
        self.options = options
        self.choice: Choice | None = None
        self._lock = threading.Lock()

    def __call__(self, feeds: Mapping[Any, Any] | None = None, **named: Any) -> list[np.ndarray]:
        """Run; the first call decides the backend (its result comes from the chosen one)."""
        with self._lock:
            if self.choice is None:
                self.choice = choose(self.graph, resolve_feeds(self.graph, feeds, named), budget=self.budget,
                                     device=self.device, **self.options)
        return self.choice.compiled(feeds, **named)  # type: ignore[no-any-return]  # it applies the feeds rule

    run = __call__

    def __getattr__(self, name: str) -> Any:
        # state(), context(), plan, ... are the chosen backend's (after the first call)
        choice = self.__dict__.get("choice")
        if choice is None:
            raise AttributeError(f"{name!r}: the backend is chosen on the first call (backend='auto')")
        return getattr(choice.compiled, name)

    def explain(self) -> str:
        """The choice and the timings (after the first call), then the chosen backend's own explanation."""
        if self.choice is None:
            return "auto: the backend is chosen on the first call"
        inner = self.choice.compiled.explain() if hasattr(self.choice.compiled, "explain") else ""
        return self.choice.report() + ("\n" + inner if inner else "")
