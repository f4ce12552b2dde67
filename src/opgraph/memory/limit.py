"""The memory limit compile checks plans against, so a huge plan fails with a clear error before allocating.

The limit is, in order: the ``memory_limit=`` keyword of
:func:`opgraph.compile` (bytes; ``None`` or ``0`` turn the check off), else
the ``OPGRAPH_MEMORY_LIMIT`` environment variable (bytes, with an optional
``K``/``M``/``G``/``T`` suffix in powers of 1024; ``0`` or ``none`` turn it
off), else the machine's total physical RAM: ``os.sysconf('SC_PAGE_SIZE') *
os.sysconf('SC_PHYS_PAGES')`` where the OS has it (Linux, macOS), else
``psutil.virtual_memory().total`` if psutil is installed, else no limit.

    >>> import opgraph
    >>> from opgraph.memory import check_memory_limit, plan_memory
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (1000,)), name="x")
    >>> b.output(b.op("exp", x))
    >>> plan = plan_memory(b.freeze())
    >>> check_memory_limit(plan, 1 << 20)   # 8000 bytes fit in 1 MiB
    >>> check_memory_limit(plan, 4096)
    Traceback (most recent call last):
    ...
    opgraph.errors.MemoryLimitError: the memory plan needs 8000 bytes (7.8 KiB), more than the memory limit of ...
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from opgraph.errors import MemoryLimitError, OutOfMemoryError
from opgraph.memory.plan import PLANNED, MemoryPlan

ENV_VAR = "OPGRAPH_MEMORY_LIMIT"
"""Environment variable giving the default memory limit (see the module doc)."""

_SUFFIX = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def physical_memory() -> int | None:
    """Total physical RAM in bytes, or None when it cannot be found (see the module doc).

    >>> m = physical_memory()
    >>> m is None or m > 0
    True
    """
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if total > 0:
            return int(total)
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        pass
    try:
        import psutil  # optional; only where sysconf lacks the answer
    except ImportError:
        return None
    return int(psutil.virtual_memory().total)


def parse_bytes(text: str) -> int | None:
    """Bytes from ``"123"``, ``"512M"``, ``"8GiB"`` or ``"1.5T"`` (powers of 1024); None for ``"0"`` or ``"none"``.

    >>> parse_bytes("8G"), parse_bytes("512 MiB"), parse_bytes("none")
    (8589934592, 536870912, None)
    """
    s = text.strip().upper().replace(" ", "")
    if s in ("", "NONE", "OFF", "0"):
        return None
    if s.endswith("IB"):
        s = s[:-2]
    unit = s[-1] if s and s[-1] in _SUFFIX else ""
    number = s[:len(s) - len(unit)]
    try:
        value = float(number) if "." in number or "E" in number else int(number)
    except ValueError:
        raise ValueError(f"cannot read a memory limit from {text!r}: give bytes, e.g. 8000000000 or 8G") from None
    if value < 0:
        raise ValueError(f"a memory limit cannot be negative: {text!r}")
    return int(value * _SUFFIX[unit]) or None


def resolve_memory_limit(limit: Any = "auto") -> int | None:
    """The limit in bytes for ``limit`` (as :func:`opgraph.compile`'s ``memory_limit``), None for no limit.

    ``"auto"``: the environment variable, else physical RAM; ``None``/``0``:
    no limit; an int: bytes; a string: as :func:`parse_bytes`.

    >>> resolve_memory_limit(1 << 30), resolve_memory_limit(None), resolve_memory_limit("2K")
    (1073741824, None, 2048)
    """
    if limit is None:
        return None
    if isinstance(limit, str):
        if limit == "auto":
            env = os.environ.get(ENV_VAR)
            return physical_memory() if env is None else parse_bytes(env)
        return parse_bytes(limit)
    if isinstance(limit, bool) or not isinstance(limit, (int, float, np.integer, np.floating)):
        raise TypeError(f"memory_limit must be bytes (an int), a string like '8G', 'auto' or None, not {limit!r}")
    if limit < 0:
        raise ValueError(f"memory_limit cannot be negative: {limit!r}")
    return int(limit) or None


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{n} bytes" if unit == "B" else f"{n} bytes ({size:.1f} {unit})"
        size /= 1024
    return f"{n} bytes"  # pragma: no cover


def largest_buffers(plan: MemoryPlan, top: int = 5) -> list[tuple[int, int, int]]:
    """``(bytes, value, producer op)`` of the ``top`` largest planned values, one per shared storage group.

    >>> import opgraph
    >>> from opgraph.memory import plan_memory
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (10,)))
    >>> b.output(b.op("concat", x, b.op("exp", x), axis=0))
    >>> largest_buffers(plan_memory(b.freeze()))
    [(80, 2, 1), (40, 1, 0)]
    """
    graph = plan.graph
    kinds = np.asarray(plan.kind, dtype=np.int64)
    cand = np.flatnonzero(kinds == PLANNED)
    if not len(cand):
        return []
    sizes = np.array([plan.nbytes[v] or 0 for v in cand.tolist()], dtype=np.int64)
    order = cand[np.argsort(-sizes, kind="stable")]
    group_of = plan.extra.get("group_of")
    seen: set[int] = set()
    out: list[tuple[int, int, int]] = []
    for v in order.tolist():
        g = int(group_of[v]) if group_of is not None and v in group_of else -1 - v
        if g in seen:
            continue
        seen.add(g)
        out.append((int(plan.nbytes[v] or 0), v, int(graph.value_producer[v])))
        if len(out) == top:
            break
    return out


def check_memory_limit(plan: MemoryPlan, limit: Any = "auto") -> None:
    """Raise :class:`~opgraph.errors.MemoryLimitError` when ``plan`` needs more bytes than ``limit``.

    ``limit`` is read by :func:`resolve_memory_limit`. The plan's total is
    its arena plus its output and state buffers (``plan.total_bytes``); the
    message lists the ops (index, kind, name or description when the graph
    has one) making the five largest buffers. Every compile path that plans
    memory calls this once, right after the plan is made or given.
    """
    total = int(plan.total_bytes)
    if total == 0:
        return
    cap = resolve_memory_limit(limit)
    if cap is None or total <= cap:
        return
    raise MemoryLimitError(
        f"the memory plan needs {_human(total)}, more than the memory limit of {_human(cap)} "
        f"(from {_limit_source(limit)}); largest buffers:\n" + _buffer_lines(plan) +
        f"\nReduce the sizes, rematerialise (opgraph.memory.rematerialize), or raise the limit with "
        f"compile(..., memory_limit=bytes or None) or ${ENV_VAR}.",
        planned=total, limit=cap)


def _limit_source(limit: Any) -> str:
    if isinstance(limit, str) and limit == "auto":
        return f"${ENV_VAR}" if os.environ.get(ENV_VAR) is not None else "physical RAM"
    return f"memory_limit={limit!r}"


def _op_words(graph: Any, op: int, v: int | None = None) -> str:
    """``op 3 (exp), named 'y', <description>``: an op as the user can find it in their graph."""
    where = f"op {op} ({graph.kind_of(op)})" if op >= 0 else "an input"
    label = graph.symbols.ops.get(op) or (graph.name_of(v) if v is not None else None)
    desc = graph.symbols.descriptions.get(("op", op)) or (
        graph.symbols.descriptions.get(("value", v)) if v is not None else None)
    return where + "".join(f", {s}" for s in (f"named {label!r}" if label else "", desc or "") if s)


def _buffer_lines(plan: MemoryPlan) -> str:
    graph = plan.graph
    return "\n".join(f"  {_human(nbytes)}: value %{v} {graph.type_of(v)} made by {_op_words(graph, op, v)}"
                     for nbytes, v, op in largest_buffers(plan))


def out_of_memory(graph: Any, op: int | None, exc: MemoryError, limit: Any, *,
                  plan: MemoryPlan | None = None, setting: str | None = None) -> OutOfMemoryError:
    """The :class:`~opgraph.errors.OutOfMemoryError` for NumPy's ``exc``, raised while op ``op`` ran.

    ``op`` None: a buffer that is not one op's (``plan``'s arena; the message then lists the largest buffers).
    ``limit`` is the ``memory_limit`` setting compile was given (``"auto"``, bytes, a string, None); the
    bytes requested are NumPy's (the shape and dtype it reports), else the op's declared results.
    ``setting`` replaces the words about the limit (``Graph.run`` checks none).
    Built only once the error has happened: nothing runs per op or per call.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (10**6, 1)), name="x")
    >>> y = b.input(("float64", (1, 10**6)), name="y")
    >>> b.output(b.op("multiply", x, y, name="outer"))
    >>> g = b.freeze()
    >>> try:
    ...     np.empty((10**6, 10**6))  # 8 TB: NumPy refuses at once
    ... except MemoryError as exc:
    ...     err = out_of_memory(g, 0, exc, None)
    >>> print(str(err).split(" with ")[0])
    op 0 (multiply), named 'outer': out of memory allocating 8000000000000 bytes (7.3 TiB) for f64[1000000,1000000]
    >>> err.requested, err.limit, err.op
    (8000000000000, None, 0)
    """
    shape, dtype = getattr(exc, "shape", None), getattr(exc, "dtype", None)
    requested: int | None = None
    what = ""
    if shape is not None and dtype is not None:  # NumPy's error carries what it could not allocate
        try:
            dt = np.dtype(dtype)
            requested = int(np.prod(tuple(shape), dtype=object)) * dt.itemsize
        except (TypeError, ValueError):
            requested = None
    if op is not None and op >= 0:
        outs = [int(v) for v in graph.op_outputs(op).tolist()]
        types = [graph.type_of(v) for v in outs]
        if requested is None:
            sizes = [getattr(t, "nbytes", None) for t in types]
            requested = sum(sizes) if sizes and all(isinstance(n, int) for n in sizes) else None
        what = " for " + ", ".join(str(t) for t in types) if types else ""
        head = f"{_op_words(graph, op, outs[0] if len(outs) == 1 else None)}: out of memory"
    else:
        head = "allocating the compiled graph's arena and state buffers: out of memory"
        biggest = largest_buffers(plan, 1) if plan is not None else []
        op = biggest[0][2] if biggest else None  # the op making the largest buffer, for err.op
    amount = f" allocating {_human(requested)}" if requested is not None else ""
    cap = resolve_memory_limit(limit) if limit is not None else None
    if setting is None and cap is None:
        setting = (f"with {_limit_source(limit)}, so compile checked no limit" if limit is None or
                   not (isinstance(limit, str) and limit == "auto") else "with no memory limit found")
    elif setting is None:
        setting = f"with a memory limit of {_human(cap)} (from {_limit_source(limit)})"
    plan_part = "" if plan is None else (
        f"; the plan needs {_human(int(plan.total_bytes))}, largest buffers:\n{_buffer_lines(plan)}\n")
    message = (f"{head}{amount}{what} {setting}; NumPy: {exc}{plan_part}"
               f"{'' if plan_part else '. '}Reduce the sizes, rematerialise (opgraph.memory.rematerialize), "
               f"or set compile(..., memory_limit=bytes) so that compile refuses a plan that does not fit.")
    return OutOfMemoryError(message, op=op, requested=requested, limit=cap)
