"""Evaluation orders: Owl's post-order DFS from the outputs, and a memory-aware greedy.

Both return the ops needed for ``targets`` (default: the graph's outputs and
the sources of its update edges) as an int array, producers before consumers.

    >>> import opgraph
    >>> from opgraph.memory.schedule import dfs_schedule, greedy_schedule
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (4,)), name="x")
    >>> b.output(b.op("exp", b.op("negative", x)))
    >>> g = b.freeze()
    >>> dfs_schedule(g).tolist(), greedy_schedule(g).tolist()
    ([0, 1], [0, 1])
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import numpy as np

from opgraph.core.graph import Graph
from opgraph.core.types import TensorType

GREEDY_LIMIT = 20000
"""Graphs with more needed ops than this get the DFS order from :func:`greedy_schedule`."""


def default_targets(graph: Graph) -> list[int]:
    """The graph's outputs followed by the sources of its update edges (without repeats).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> s = b.input(("float64", ()), name="s")
    >>> b.update(b.add(s, 1.0), s)
    >>> default_targets(b.freeze())
    [2]
    """
    seen: dict[int, None] = {}
    for v in list(graph.outputs.tolist()) + list(graph.updates[:, 0].tolist()):
        seen.setdefault(int(v), None)
    return list(seen)


def value_nbytes(graph: Graph) -> list[int | None]:
    """Bytes of each value (None for values of dynamic shape or void type).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2, 3)))
    >>> value_nbytes(b.freeze())
    [24]
    """
    per_type = [t.nbytes if isinstance(t, TensorType) else None for t in graph.types]
    return [per_type[t] for t in graph.value_type.tolist()]


def dfs_schedule(graph: Graph, targets: Iterable[int] | None = None) -> np.ndarray:
    """Post-order depth-first search from the targets (Owl's order), iterative.

    Inputs of an op are visited in order, so the first operand's subgraph
    comes first.
    """
    targets = default_targets(graph) if targets is None else [int(t) for t in targets]
    in_ptr, in_ids = graph.in_ptr.tolist(), graph.in_ids.tolist()
    prod = graph.value_producer.tolist()
    done = [False] * graph.num_ops
    order: list[int] = []
    for t in targets:
        root = prod[t]
        if root < 0 or done[root]:
            continue
        stack = [(root, in_ptr[root])]
        done[root] = True  # "entered"; cycles cannot occur in a verified graph
        while stack:
            op, k = stack[-1]
            end = in_ptr[op + 1]
            while k < end:
                p = prod[in_ids[k]]
                k += 1
                if p >= 0 and not done[p]:
                    stack[-1] = (op, k)
                    done[p] = True
                    stack.append((p, in_ptr[p]))
                    break
            else:
                stack.pop()
                order.append(op)
    return np.asarray(order, dtype=np.int32)


def greedy_schedule(graph: Graph, targets: Iterable[int] | None = None, *,
                    base: np.ndarray | None = None) -> np.ndarray:
    """A memory-aware list schedule: among the ready ops, run the one that frees the most bytes.

    The score of a ready op is the bytes of the inputs it is the last user
    of, minus the bytes of its outputs; ties go to the op earlier in the DFS
    order. Scores are recomputed lazily (a popped op whose score changed is
    pushed back), so this costs O(n log n) plus the re-pushes. ``base`` is
    :func:`dfs_schedule`'s order for the same targets, if already computed.
    """
    if base is None:
        base = dfs_schedule(graph, targets)
    n_ops = len(base)
    if n_ops > GREEDY_LIMIT or n_ops == 0:
        return base
    in_ptr, in_ids = graph.in_ptr.tolist(), graph.in_ids.tolist()
    out_ptr, out_ids = graph.out_ptr.tolist(), graph.out_ids.tolist()
    prod = graph.value_producer.tolist()
    size = [s or 0 for s in value_nbytes(graph)]
    rank = {int(op): i for i, op in enumerate(base.tolist())}
    pinned = set(default_targets(graph) if targets is None else (int(t) for t in targets))
    uses: dict[int, int] = {}
    waiting: dict[int, int] = {}
    cons: dict[int, list[int]] = {}
    for op in rank:
        ins = in_ids[in_ptr[op]:in_ptr[op + 1]]
        preds = {prod[v] for v in ins if prod[v] >= 0}
        waiting[op] = len(preds)
        for v in set(ins):
            uses[v] = uses.get(v, 0) + 1
        for p in preds:
            cons.setdefault(p, []).append(op)

    def score(op: int) -> int:
        freed = sum(size[v] for v in set(in_ids[in_ptr[op]:in_ptr[op + 1]])
                    if uses[v] == 1 and prod[v] >= 0 and v not in pinned)
        return freed - sum(size[v] for v in out_ids[out_ptr[op]:out_ptr[op + 1]])

    heap = [(-score(op), rank[op], op) for op, w in waiting.items() if w == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        neg, r, op = heapq.heappop(heap)
        s = score(op)
        if -s != neg and heap and (-s, r) > heap[0][:2]:
            heapq.heappush(heap, (-s, r, op))
            continue
        order.append(op)
        for v in set(in_ids[in_ptr[op]:in_ptr[op + 1]]):
            uses[v] -= 1
        for c in cons.get(op, ()):
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(heap, (-score(c), rank[c], c))
    return np.asarray(order, dtype=np.int32)
