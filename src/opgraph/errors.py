"""Exceptions raised by opgraph.

Every error opgraph raises on purpose derives from :class:`GraphError`, so a
caller can catch them all at once::

    >>> import opgraph
    >>> issubclass(opgraph.OpBuildError, opgraph.GraphError)
    True
"""

from __future__ import annotations


class GraphError(Exception):
    """Base class of every error opgraph raises on purpose."""


class OpTypeError(GraphError, TypeError):
    """A type rule rejected its inputs (raised by an op's ``infer``).

    Op authors raise this from type rules; the builder re-raises it as an
    :class:`OpBuildError` that names the op, its input types and the line of
    user code that built it.
    """


class OpBuildError(GraphError, TypeError, ValueError):
    """Building an op failed: wrong input types, shapes or attributes.

    The message names the op kind, the input types and, for lazy or traced
    code, the file and line of the user's call.
    """

    def __init__(self, message: str, *, op: str, location: str | None = None) -> None:
        super().__init__(message)
        self.op = op
        self.location = location


class VerifyError(GraphError):
    """``Graph.verify()`` found broken invariants; ``problems`` lists them all."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "\n  ".join(problems[:50])
        more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        super().__init__(f"graph is invalid ({len(problems)} problem(s)):\n  {shown}{more}")


class ExecutionError(GraphError, RuntimeError):
    """Running a graph failed: a missing feed, a feed of the wrong type, or a kernel error."""


class FormatError(GraphError, ValueError):
    """A graph file is malformed; the message names file, record and byte offset."""
