"""Progress reports from long-running library steps (optimising, planning, compiling, loading, saving).

The library announces its steps; an application decides whether and how to
show them. A step is a task::

    with progress.task("optimize: cse", total=n) as t:
        ...
        t.advance(k)

Nothing is installed by default: :func:`task` then returns one shared no-op
object, so a report costs one function call and one global lookup. Steps
report per pass, per stage or per chunk of a loop that already exists, never
per op, so even an installed sink costs little. The ``opgraph`` command
installs a sink drawing rich progress bars (:func:`install`); tests install
one that records the events.

    >>> events = []
    >>> class Sink:
    ...     def start(self, name, total): events.append(("start", name, total)); return name
    ...     def advance(self, handle, k): events.append(("advance", handle, k))
    ...     def finish(self, handle): events.append(("finish", handle))
    >>> with installed(Sink()):
    ...     with task("demo", total=3) as t:
    ...         t.advance(2); t.advance()
    >>> events
    [('start', 'demo', 3), ('advance', 'demo', 2), ('advance', 'demo', 1), ('finish', 'demo')]
    >>> with task("nobody listens", total=10) as t:  # no sink: a no-op
    ...     t.advance(10)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Sink(Protocol):
    """Receives the events of tasks: what an application implements to show progress."""

    def start(self, name: str, total: float | None) -> Any:
        """A task begins; ``total`` is its amount of work (None: unknown). Returns a handle for the others."""

    def advance(self, handle: Any, amount: float) -> None:
        """``amount`` more of the task's work is done."""

    def finish(self, handle: Any) -> None:
        """The task ended (normally or by an exception)."""


class _NoTask:
    """The task when no sink is installed: every method does nothing."""

    __slots__ = ()

    def advance(self, amount: float = 1) -> None:
        """Do nothing."""

    def __enter__(self) -> _NoTask:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class Task:
    """A running task reporting to a sink; use it as a context manager (``with task(...) as t``)."""

    __slots__ = ("_done", "_handle", "_sink", "name", "total")

    def __init__(self, sink: Sink, name: str, total: float | None) -> None:
        self._sink = sink
        self.name = name
        self.total = total
        self._handle: Any = None
        self._done = False

    def advance(self, amount: float = 1) -> None:
        """Report ``amount`` more work done.

        >>> with installed(RecordingSink()) as sink, task("t", total=2) as t:
        ...     t.advance(2)
        >>> sink.done["t"]
        2
        """
        self._sink.advance(self._handle, amount)

    def __enter__(self) -> Task:
        self._handle = self._sink.start(self.name, self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done:
            self._done = True
            self._sink.finish(self._handle)


NO_TASK = _NoTask()
"""The task :func:`task` returns when no sink listens (a placeholder for a task not started yet)."""
_sink: Sink | None = None


def task(name: str, total: float | None = None) -> Task | _NoTask:
    """A task named ``name`` (what is being done, e.g. ``"optimize: cse"``) of ``total`` units of work.

    >>> with task("load g.json", total=100) as t:
    ...     t.advance(100)
    """
    sink = _sink
    if sink is None:
        return NO_TASK
    return Task(sink, name, total)


def iterate(items: Sequence[T], name: str, chunk: int = 4096) -> Iterable[T]:
    """``items`` themselves when no sink listens; else a generator reporting every ``chunk`` items as one task.

    For loops that already run in Python op by op (the reference executor): the report costs one call per chunk.

    >>> with installed(RecordingSink()) as s:
    ...     n = sum(1 for _ in iterate(range(10000), "count", chunk=4096))
    >>> n, s.totals["count"], s.done["count"], s.finished
    (10000, 10000, 10000, ['count'])
    >>> iterate([1, 2], "no sink: the list itself")
    [1, 2]
    """
    if _sink is None:
        return items
    return _chunked(items, name, chunk)


def _chunked(items: Sequence[T], name: str, chunk: int) -> Iterator[T]:
    with task(name, total=len(items)) as t:
        for start in range(0, len(items), chunk):
            part = items[start:start + chunk]
            yield from part
            t.advance(len(part))


def byte_size(source: Any) -> int | None:
    """The size in bytes of what a reader is about to read (bytes, text or an open file), None if unknown.

    >>> byte_size(b"abc"), byte_size(object())
    (3, None)
    """
    if isinstance(source, (bytes, bytearray, str)):
        return len(source)
    try:
        return int(os.fstat(source.fileno()).st_size)
    except Exception:
        return None


def active() -> bool:
    """True when a sink listens (lets a step skip work done only to report, such as counting).

    >>> active()
    False
    """
    return _sink is not None


def install(sink: Sink | None) -> Sink | None:
    """Install ``sink`` (None removes it); returns the sink it replaces.

    >>> install(None) is None
    True
    """
    global _sink
    previous, _sink = _sink, sink
    return previous


@contextlib.contextmanager
def installed(sink: Sink) -> Iterator[Any]:
    """Install ``sink`` for the block, then put back the previous one.

    >>> with installed(RecordingSink()) as s:
    ...     active()
    True
    """
    previous = install(sink)
    try:
        yield sink
    finally:
        install(previous)


class RecordingSink:
    """A sink that records tasks: ``names`` in start order, their ``totals``, work ``done`` and ``finished``.

    A name started more than once (a pass run in two rounds) has the sum of its totals and of its work.

    >>> s = RecordingSink()
    >>> with installed(s), task("a", total=4) as t:
    ...     t.advance(4)
    >>> s.names, s.totals, s.done, s.finished
    (['a'], {'a': 4}, {'a': 4}, ['a'])
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        self.totals: dict[str, float | None] = {}
        self.done: dict[str, float] = {}
        self.finished: list[str] = []

    def start(self, name: str, total: float | None) -> str:
        """Record a start."""
        self.names.append(name)
        known = self.totals.get(name, 0)
        self.totals[name] = None if total is None or known is None else known + total
        self.done.setdefault(name, 0)
        return name

    def advance(self, handle: str, amount: float) -> None:
        """Record work done."""
        self.done[handle] = self.done.get(handle, 0) + amount

    def finish(self, handle: str) -> None:
        """Record an end."""
        self.finished.append(handle)


__all__ = ["NO_TASK", "RecordingSink", "Sink", "Task", "active", "byte_size", "install", "installed", "iterate",
           "task"]
