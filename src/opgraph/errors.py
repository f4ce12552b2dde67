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


class FeedError(ExecutionError, ValueError, TypeError):
    """A feed cannot be used: its values do not fit the input's dtype, or its shape is wrong, or a compiled
    program was called in a form it does not take (two positional arrays for one input, ...).

    Also a ``ValueError``, as NumPy raises for values it cannot convert, and a ``TypeError``, as Python raises
    for a call with the wrong arguments.

    >>> issubclass(FeedError, ExecutionError) and issubclass(FeedError, ValueError)
    True
    >>> issubclass(FeedError, TypeError)
    True
    """


class ArgumentError(FeedError):
    """A call does not fit the function: arguments that do not bind to its parameters, or a leaf that is neither
    an array nor hashable (a static value) (``opgraph.jit``, ``@opgraph.function``). A ``TypeError`` too (as every
    ``FeedError`` is), as Python and JAX raise for such calls.

    >>> import opgraph
    >>> issubclass(ArgumentError, TypeError) and issubclass(ArgumentError, opgraph.FeedError)
    True
    """


class UnknownKeyError(ExecutionError, KeyError):
    """A feed or target key names no value of the graph (also a ``KeyError``, as a dict lookup raises).

    >>> str(UnknownKeyError("no value named 'q'"))
    "no value named 'q'"
    """

    def __str__(self) -> str:
        # KeyError's own str() is the repr of its argument (quoted); a message reads better plain
        return str(self.args[0]) if self.args else ""


class FormatError(GraphError, ValueError):
    """A graph file is malformed; the message names file, record and byte offset."""


class MemoryLimitError(ExecutionError, MemoryError):
    """Compiling refused a memory plan larger than the memory limit.

    The message names the plan's total, the limit and the ops making the
    largest buffers; ``planned`` and ``limit`` are in bytes. It is also a
    ``MemoryError``, which is what allocating the plan would have raised.
    """

    def __init__(self, message: str, *, planned: int, limit: int) -> None:
        super().__init__(message)
        self.planned = planned
        self.limit = limit


class OutOfMemoryError(ExecutionError, MemoryError):
    """Running a compiled graph (or allocating its buffers) ran out of memory.

    The message names the op whose buffer could not be allocated (index,
    kind, name or description when the graph has one), the bytes requested
    and the ``memory_limit`` setting. ``op`` is that op (None when the
    buffer is not one op's, e.g. the arena of a whole plan), ``requested``
    the bytes (None when unknown) and ``limit`` the limit in bytes that
    compile checked (None: no limit). It is also a ``MemoryError``, as
    NumPy's own error was.

    >>> issubclass(OutOfMemoryError, ExecutionError) and issubclass(OutOfMemoryError, MemoryError)
    True
    """

    def __init__(self, message: str, *, op: int | None, requested: int | None, limit: int | None) -> None:
        super().__init__(message)
        self.op = op
        self.requested = requested
        self.limit = limit


OPTIONAL_PACKAGES: dict[str, str] = {
    # import name -> the extra of pyproject.toml that installs it (tests/test_cli_usability.py checks them)
    "networkx": "interop", "dask": "interop", "distributed": "interop", "pytensor": "interop", "onnx": "interop",
    "onnxruntime": "onnxruntime", "jax": "jax", "torch": "torch", "scipy": "scipy", "graphviz": "viz",
    "numba": "fast", "sklearn": "demo",
}
"""The optional packages opgraph uses and the extra (``pip install 'opgraph[EXTRA]'``) that brings each one."""


def install_hint(package: str) -> str:
    """How to install optional ``package``: the extra that brings it, and in a source checkout the command there.

    >>> install_hint("networkx").startswith("pip install 'opgraph[interop]'")
    True
    """
    import os
    import sys

    extra = OPTIONAL_PACKAGES.get(package)
    how = f"pip install 'opgraph[{extra}]'" if extra else f"pip install {package}"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if extra and os.path.exists(os.path.join(root, "pyproject.toml")):  # running from a source checkout
        # the command as typed in the checkout's root; elsewhere with absolute paths, so it works from anywhere
        pip = os.path.join(sys.prefix, "bin", "pip")
        if os.path.abspath(os.getcwd()) == root:
            rel = os.path.relpath(pip, root)
            how += f" (in this checkout: {rel if not rel.startswith('..') else pip} install -e '.[{extra}]')"
        else:
            how += f" (in this checkout: {pip} install -e '{root}[{extra}]')"
    return how


class MissingDependencyError(GraphError, ImportError):
    """A feature needs an optional package that is not installed; the message says what to install.

    Also an ``ImportError`` (``name`` is the missing package), so code catching that keeps working.

    >>> str(MissingDependencyError("networkx", "the graphml format")).split(":")[0]
    'the graphml format needs the optional package networkx'
    """

    def __init__(self, package: str, feature: str) -> None:
        super().__init__(f"{feature} needs the optional package {package}: {install_hint(package)}", name=package)
        self.package = package
        self.feature = feature
        self.extra = OPTIONAL_PACKAGES.get(package)
