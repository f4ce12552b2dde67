"""Optional compiled kernels for the graph walks NumPy cannot vectorise.

Sorting a deep graph (a long chain, say) takes one step per op whatever the
algorithm; in Python each step costs about a microsecond, so a graph of
10^7 ops stored out of order would take tens of seconds. When numba is
installed, :func:`topo_kernel` compiles that walk (once; numba caches the
machine code on disk) and :meth:`Graph.topological_order
<opgraph.core.graph.Graph.topological_order>` uses it for large unordered
graphs. Without numba the NumPy walk in ``graph.py`` gives the *same* order,
only slower on deep graphs, so results never depend on what is installed.

numba is imported lazily, on the first large sort, because importing it
costs a few tenths of a second that small graphs should not pay.
``OPGRAPH_NUMBA=0`` in the environment, or setting :data:`enabled` to
False, turns the compiled path off (tests use that to check both paths).

    >>> from opgraph.core import accel
    >>> accel.MIN_OPS > 0 and isinstance(accel.enabled, bool)
    True
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

MIN_OPS = 300_000
"""Unordered graphs with at least this many ops load numba for their sort.

Below it, the NumPy walk costs less than importing numba and loading the
cached kernel (about half a second); once the kernel is loaded it is used
from :data:`LOADED_MIN_OPS` ops on.
"""
LOADED_MIN_OPS = 2_000
"""Size from which an already loaded kernel beats the NumPy walk."""

enabled: bool = os.environ.get("OPGRAPH_NUMBA", "1").strip().lower() not in ("0", "false", "no", "off")
"""False turns the compiled kernels off (the NumPy fallback runs instead)."""

_topo: Any = None  # None: not tried yet; False: numba missing or unusable; else the compiled kernel


def topo_kernel(n_ops: int) -> Callable[[Any, Any, int], tuple[Any, Any]] | None:
    """The compiled level sort for a graph of ``n_ops`` ops, or None to use NumPy.

    None when the kernel is disabled, numba is missing (or runs in its
    pure-Python ``NUMBA_DISABLE_JIT`` mode, which would be slower than the
    NumPy walk), or the graph is too small to be worth loading numba for.
    See :func:`_level_sort` for what the kernel computes.

    >>> topo_kernel(1) is None
    True
    """
    global _topo
    if not enabled:
        return None
    if _topo is None:
        if n_ops < MIN_OPS:
            return None
        _topo = _compile()
    if _topo is False or n_ops < LOADED_MIN_OPS:
        return None
    return _topo  # type: ignore[no-any-return]


def _compile() -> Any:
    try:
        import numba
    except Exception:  # missing, or broken against this NumPy: the NumPy path is always there
        return False
    if numba.config.DISABLE_JIT:
        return False
    # cache=True keeps the machine code beside this file (or in numba's per-user cache
    # when that is read-only), so later processes load it instead of compiling.
    return numba.njit(cache=True, nogil=True)(_level_sort)


def _level_sort(in_ptr: Any, pred: Any, arity: int) -> tuple[Any, Any]:  # pragma: no cover - compiled by numba
    """Ops sorted by (level, index); or, for a cyclic graph, ops on one cycle.

    ``pred[k]`` is the op producing input entry ``k`` (-1 for none). With
    ``arity >= 0``, op ``i``'s entries are ``pred[i*arity:(i+1)*arity]``
    (``in_ptr`` is not read); else they are ``pred[in_ptr[i]:in_ptr[i+1]]``.
    An op's level is the length of the longest path reaching it from an op
    without producers.

    Returns ``(order, cycle)``: for a DAG ``order`` lists every op, by level
    and then by index (exactly what the level-by-level NumPy walk in
    ``graph.py`` gives), and ``cycle`` is empty; otherwise ``order`` is empty
    and ``cycle`` lists ops on a cycle, each using an output of the next and
    the last using an output of the first.

    The levels come from an iterative depth-first search over producers: it
    reads only the inputs, where Kahn's algorithm would first build a
    consumers CSR. On a large graph each step is a cache miss, so the search
    reads each op's entries once: a stack frame keeps the op's position in
    its entries and the highest level among the producers seen so far, which
    becomes the op's level when the search leaves it. A counting sort by
    level (ops visited in index order) then gives the order.
    """
    n = len(pred) // arity if arity > 0 else len(in_ptr) - 1
    # level[op]: -1 not seen, -2 on the search stack, else the op's level.
    level = np.full(n, -1, np.int32)
    stack = np.empty(n, np.int32)  # frames: op, next entry, end of its entries, level so far
    cursor = np.empty(n, np.int64)
    end = np.empty(n, np.int64)
    best = np.empty(n, np.int32)
    top_level = 0
    for root in range(n):
        if level[root] != -1:
            continue
        top = 0
        stack[0] = root
        if arity >= 0:
            cursor[0] = np.int64(root) * arity
            end[0] = cursor[0] + arity
        else:
            cursor[0] = in_ptr[root]
            end[0] = in_ptr[root + 1]
        best[0] = 0
        level[root] = -2
        while top >= 0:
            k = cursor[top]
            e = end[top]
            b = best[top]
            descended = False
            while k < e:
                p = pred[k]
                k += 1
                if p < 0:
                    continue
                state = level[p]
                if state == -1:  # not seen: descend into p, come back to entry k
                    cursor[top] = k
                    best[top] = b
                    top += 1
                    stack[top] = p
                    if arity >= 0:
                        cursor[top] = np.int64(p) * arity
                        end[top] = cursor[top] + arity
                    else:
                        cursor[top] = in_ptr[p]
                        end[top] = in_ptr[p + 1]
                    best[top] = 0
                    level[p] = -2
                    descended = True
                    break
                if state == -2:  # p is on the stack: stack[i:top+1] with stack[i] == p is a cycle
                    i = top
                    while stack[i] != p:
                        i -= 1
                    return np.empty(0, np.int32), stack[i:top + 1].copy()
                if state >= b:
                    b = state + 1
            if not descended:  # every producer done: the op's level is known
                level[stack[top]] = b
                if b > top_level:
                    top_level = b
                top -= 1
                if top >= 0 and b >= best[top]:
                    best[top] = b + 1
    start = np.zeros(top_level + 2, np.int64)
    for op in range(n):
        start[level[op] + 1] += 1
    for d in range(top_level + 1):
        start[d + 1] += start[d]
    order = np.empty(n, np.int32)
    for op in range(n):
        d = level[op]
        order[start[d]] = op
        start[d] += 1
    return order, np.empty(0, np.int32)
