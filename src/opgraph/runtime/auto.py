"""``backend="auto"``: time the installed backends on the graph and keep the fastest.

Each installed backend compiles the graph (partitioned where it lacks ops),
runs once to warm up (JIT compilation happens there), then is timed for at
least ``repeats`` calls and, within its share of the time budget, up to four
times as many. The fastest call decides (on a shared, noisy machine the
minimum is the steadiest estimate of what the engine can do); the report
gives each candidate's median.
Backends that fail to compile or run are left out, with the reason in the
report. Without example inputs the choice is made on the first call's feeds.

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
from opgraph.core.graph import Graph


@dataclass
class Choice:
    """What ``auto`` chose: the backend, its compiled graph, the median seconds per call of each candidate
    (``None`` where it failed) and why each failure happened. The choice is the candidate with the fastest call."""

    backend: str
    compiled: Any
    timings: dict[str, float | None] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    fastest: dict[str, float] = field(default_factory=dict)

    def report(self) -> str:
        """One line: the choice and every candidate's median time (or why it was left out)."""
        parts = []
        for name, t in sorted(self.timings.items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0)):
            parts.append(f"{name} {t * 1e3:.3f} ms" if t is not None else f"{name} failed ({self.failures[name]})")
        return f"auto chose {self.backend}: " + ", ".join(parts)


def choose(graph: Graph, feeds: Mapping[Any, Any], *, budget: float = 20.0, repeats: int = 5,
           candidates: Sequence[str] | None = None, device: str | None = None, **options: Any) -> Choice:
    """Compile ``graph`` on every installed backend (or ``candidates``), time each on ``feeds``, keep the fastest."""
    from opgraph.runtime.compiled import compile as compile_on

    names = list(candidates or backends.available())
    share = budget / max(1, len(names))
    timings: dict[str, float | None] = {}
    failures: dict[str, str] = {}
    compiled: dict[str, Any] = {}
    best: dict[str, float] = {}
    for name in names:
        start = time.perf_counter()
        try:
            c = compile_on(graph, backend=name, device=device if name != "numpy" else None,
                           **(options if name != "numpy" else {}))
            c(dict(feeds))
            times: list[float] = []
            while len(times) < repeats or (len(times) < 4 * repeats and time.perf_counter() - start < share / 2):
                t0 = time.perf_counter()
                c(dict(feeds))
                times.append(time.perf_counter() - t0)
        except Exception as exc:  # a backend that cannot run this graph is left out, with the reason
            timings[name] = None
            failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        timings[name] = float(np.median(times))
        best[name] = min(times)
        c.reset_state()  # the timing calls must not leave update-edge state behind
        compiled[name] = c
    if not compiled:
        from opgraph.backends.base import BackendError

        raise BackendError("auto: no backend could run the graph: " + "; ".join(f"{k}: {v}" for k, v in
                                                                              failures.items()))
    fastest = min(compiled, key=lambda n: best[n])
    return Choice(fastest, compiled[fastest], timings, failures, best)


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
        all_feeds = {**(feeds or {}), **named}
        with self._lock:
            if self.choice is None:
                self.choice = choose(self.graph, all_feeds, budget=self.budget, device=self.device, **self.options)
        return self.choice.compiled(all_feeds)  # type: ignore[no-any-return]

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
