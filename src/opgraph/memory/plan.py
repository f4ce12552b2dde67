"""Memory plans: where every static-shaped intermediate value lives.

:func:`plan_memory` picks a schedule (Owl's post-order DFS or the greedy
memory-aware order, whichever plans smaller), decides in-place reuse, and
packs values into byte ranges:

* **Owl's Algorithm 1** (the baseline, :func:`owl_plan`): reference counts in
  schedule order, a freed block back to a pool, best fit (the smallest free
  block large enough), else grow the largest free block, else a new block;
  a consumer takes over its input's block in place where the op allows it.
* **ours**: values joined by in-place reuse form one *storage group*; groups
  are packed at 64-byte aligned offsets by greedy-by-size interval packing
  (largest first, best-fitting gap among the groups alive at the same time).
  Groups ending in a graph output are packed into that output's own buffer
  (a fresh array per call, which is what the caller gets back), groups ending
  in an update source into that source's state buffer, the rest into one
  shared arena. Values of other sizes and dtypes share the same bytes.

Graph inputs and constants are never planned (the caller and the graph own
them), and neither are values whose shape is not static: the runtime
allocates those when it runs (the kernel is called without ``out=``).
Outputs of view ops are aliases of their input, which then lives as long as
its views.

A control-flow op (``call``, ``cond``, ``while_loop``, ``scan``) runs its
bodies on their own plans (each compiled body owns its arena): the op's
*workspace* (its ``OpDef.workspace``, in :mod:`opgraph.ops.control`) is
its bodies' peaks (both of a ``while_loop``, the larger branch of a
``cond``) plus, for a loop, one carry. It does not depend on the trip
count; a ``scan``'s stacked results and a ``while_loop``'s are outputs like
any other. ``plan.peak`` is the planned bytes plus the largest workspace.

    >>> import opgraph
    >>> from opgraph.memory import plan_memory
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (1000,)), name="x")
    >>> y = x
    >>> for _ in range(5):
    ...     y = b.op("exp", b.op("sin", y))
    >>> b.output(y)
    >>> p = plan_memory(b.freeze())
    >>> s = p.stats()
    >>> s["planned_bytes"], s["no_reuse_bytes"], s["lower_bound_bytes"], s["inplace"]
    (8000, 80000, 8000, 9)
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph.core import progress
from opgraph.core.gcpause import paused_gc
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST, get_op
from opgraph.core.types import TensorType
from opgraph.memory.schedule import default_targets, dfs_schedule, greedy_schedule, value_nbytes

ALIGN = 64
"""Every planned value starts at a multiple of this many bytes."""
SIZE_ORDER_LIMIT = 5000
"""Above this many storage groups, pack in schedule order (linear) instead of by size (quadratic)."""

UNSAFE_INPLACE: frozenset[tuple[str, int]] = frozenset({("where", 1)})
"""(op, input position) pairs flagged in-place whose NumPy kernel is wrong when ``out`` is that input:
``where``'s kernel copies ``y`` into ``out`` before reading ``x``."""

EXTERNAL, DYNAMIC, PLANNED, ALIAS = 0, 1, 2, 3
"""Storage kinds of a value: owned by the caller or the graph, allocated at run time, planned, or a view
of another value (outputs of ops with the ``view`` trait: their storage is their root's)."""


def align(n: int) -> int:
    """Round up to :data:`ALIGN`.

    >>> align(1), align(64), align(65)
    (64, 64, 128)
    """
    return -(-n // ALIGN) * ALIGN


@dataclass
class Bin:
    """A buffer values are packed into: the shared ``arena``, an ``output`` or a ``state`` buffer."""

    kind: str
    size: int
    owner: int = -1
    """The output or update-source value the buffer is for (-1 for the arena)."""


@dataclass
class OwlPlan:
    """The result of Owl's Algorithm 1: blocks and which block each planned value uses."""

    block_sizes: list[int]
    block_of: Mapping[int, int]
    inplace: int

    @property
    def total(self) -> int:
        """Sum of the block sizes."""
        return int(sum(self.block_sizes))


class ValueMap(Mapping[int, int]):
    """A read-only ``value id -> int`` mapping kept as one array over all values (-1: no entry).

    A plan of 10^7 values keeps 8 bytes per value here instead of a dict entry and two int objects.

    >>> m = ValueMap(np.array([-1, 5, 7]))
    >>> dict(m), 1 in m, m.get(0)
    ({1: 5, 2: 7}, True, None)
    """

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __getitem__(self, v: int) -> int:
        if 0 <= v < len(self.array):
            x = int(self.array[v])
            if x >= 0:
                return x
        raise KeyError(v)

    def __contains__(self, v: object) -> bool:
        return isinstance(v, int | np.integer) and 0 <= v < len(self.array) and bool(self.array[v] >= 0)

    def __iter__(self) -> Iterator[int]:
        return iter(np.flatnonzero(self.array >= 0).tolist())

    def __len__(self) -> int:
        return int(np.count_nonzero(self.array >= 0))


class PlacementMap(ValueMap):
    """A read-only ``value id -> (bin, offset)`` mapping kept as two arrays over all values (bin -1: none).

    >>> m = PlacementMap(np.array([-1, 0]), np.array([0, 128]))
    >>> dict(m)
    {1: (0, 128)}
    """

    __slots__ = ("offsets",)

    def __init__(self, bins: np.ndarray, offsets: np.ndarray) -> None:
        super().__init__(bins)
        self.offsets = offsets

    @property
    def bins(self) -> np.ndarray:
        """The bin of every value (-1 where it has none)."""
        return self.array

    def __getitem__(self, v: int) -> tuple[int, int]:  # type: ignore[override]
        return super().__getitem__(v), int(self.offsets[v])

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, bins, offsets) of every entry, as arrays: for callers that go over all of them."""
        vs = np.flatnonzero(self.array >= 0)
        return vs, self.array[vs], self.offsets[vs]


class Triples(Sequence[tuple[int, int, int]]):
    """A read-only sequence of ``(op, input, output)`` int triples kept as an ``(n, 3)`` array.

    >>> t = Triples(np.array([[4, 1, 2]]))
    >>> list(t), len(t), t[0]
    ([(4, 1, 2)], 1, (4, 1, 2))
    """

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array.reshape(-1, 3)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [tuple(r) for r in self.array[i].tolist()]
        return tuple(self.array[i].tolist())

    def __len__(self) -> int:
        return len(self.array)

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        for start in range(0, len(self.array), 65536):
            yield from (tuple(r) for r in self.array[start:start + 65536].tolist())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


@dataclass
class MemoryPlan:
    """Schedule, storage kinds, in-place pairs and byte placements of a graph's values.

    ``placement[v] = (bin, offset)`` for planned values; ``bins[0]`` is the arena.
    """

    graph: Graph
    schedule: np.ndarray
    schedule_name: str
    targets: list[int]
    kind: list[int]
    nbytes: list[int | None]
    start: Mapping[int, int]
    end: Mapping[int, int]
    inplace: Sequence[tuple[int, int, int]]
    """(op, input value, output value): the output reuses the input's storage."""
    bins: list[Bin]
    placement: Mapping[int, tuple[int, int]]
    owl: OwlPlan
    lower_bound: int
    packing: str = "size"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def arena_bytes(self) -> int:
        """Size of the shared arena."""
        return self.bins[0].size

    @property
    def total_bytes(self) -> int:
        """Arena plus output and state buffers: all planned bytes."""
        return int(sum(b.size for b in self.bins))

    @property
    def workspace(self) -> dict[int, int]:
        """Per control-flow op among the scheduled ops: bytes its bodies need while it runs (module doc)."""
        return self.extra.get("workspace", {})  # type: ignore[no-any-return]

    @property
    def workspace_bytes(self) -> int:
        """The largest :attr:`workspace` of an op (0 without control flow)."""
        return max(self.workspace.values(), default=0)

    @property
    def peak(self) -> int:
        """Planned bytes plus the largest body workspace: the most this plan holds at once.

        >>> import opgraph
        >>> from opgraph.core.subgraph import Subgraph
        >>> sb = opgraph.GraphBuilder(); x = sb.input(("float64", (100,)), name="x")
        >>> sb.output(sb.sin(sb.exp(x)))
        >>> b = opgraph.GraphBuilder(); y = b.input(("float64", (100,)), name="y")
        >>> b.output(b.op("call", y, body=Subgraph(sb.freeze())))
        >>> p = plan_memory(b.freeze())
        >>> p.total_bytes, p.workspace_bytes, p.peak
        (832, 832, 1664)
        """
        return self.total_bytes + self.workspace_bytes

    def stats(self) -> dict[str, Any]:
        """Planner statistics: our plan, Owl's Algorithm 1 on the same schedule, the lower bound.

        ``planned_bytes`` is the arena plus the output and state buffers;
        ``no_reuse_bytes`` the sum of every planned value's (aligned) size;
        ``lower_bound_bytes`` the largest total of live bytes at any step.
        """
        kinds = np.asarray(self.kind, dtype=np.int64)
        planned = np.flatnonzero(kinds == PLANNED)
        sizes = np.array([-(-(b or 0) // ALIGN) * ALIGN for b in self.nbytes], dtype=np.int64)
        return {
            "schedule": self.schedule_name,
            "packing": self.packing,
            "ops": len(self.schedule),
            "planned_values": len(planned),
            "dynamic_values": int(np.count_nonzero(kinds == DYNAMIC)),
            "arena_bytes": self.arena_bytes,
            "output_bytes": int(sum(b.size for b in self.bins if b.kind == "output")),
            "state_bytes": int(sum(b.size for b in self.bins if b.kind == "state")),
            "planned_bytes": self.total_bytes,
            "no_reuse_bytes": int(sizes[planned].sum()),
            "lower_bound_bytes": self.lower_bound,
            "owl_bytes": self.owl.total,
            "owl_blocks": len(self.owl.block_sizes),
            "inplace": len(self.inplace),
            "groups": int(self.extra.get("groups", 0)),
            "bins": len(self.bins),
            "workspace_bytes": self.workspace_bytes,
            "peak_bytes": self.peak,
        }


# ----------------------------------------------------------------------------- analysis
@dataclass
class _Lifetimes:
    """What the packers need, as arrays over all values (see :func:`_lifetimes`)."""

    kind: np.ndarray
    size: np.ndarray
    """Aligned bytes of planned values (0 for the others)."""
    start: np.ndarray
    end: np.ndarray
    """First and last step of planned values (-1 for the others); pinned values end at ``len(schedule)``."""
    inplace: np.ndarray
    """(op, input, output) rows in schedule order."""
    pinned: np.ndarray
    parent: np.ndarray
    """The value whose storage each value uses (itself unless it is a view)."""
    alias: np.ndarray
    """The alias values (outputs of view ops), in order of their producers' outputs."""


def _lifetimes(graph: Graph, schedule: np.ndarray, targets: list[int], aliases: bool) -> _Lifetimes:
    """Storage kind, first and last step, alias root and in-place pairs of every value, on ``schedule``.

    Vectorised over values and edges; only the in-place decision of ops with
    many inputs or several outputs loops.
    """
    n = len(schedule)
    nv = graph.num_values
    sched = np.asarray(schedule, dtype=np.int64)
    pos = np.full(graph.num_ops, -1, dtype=np.int64)
    pos[sched] = np.arange(n)
    op_kind = graph.op_kind
    in_rows = np.repeat(np.arange(graph.num_ops), np.diff(graph.in_ptr))
    out_rows = np.repeat(np.arange(graph.num_ops), np.diff(graph.out_ptr))
    # last use of every value (aliases included): its last scheduled consumer, or its producer
    last = np.full(nv, -1, dtype=np.int64)
    used_at = pos[in_rows]
    m = used_at >= 0
    np.maximum.at(last, graph.in_ids[m], used_at[m])
    made_at = pos[out_rows]
    m = (made_at >= 0) & (op_kind[out_rows] != CONST.id)
    made, made_at, made_by = graph.out_ids[m].astype(np.int64), made_at[m], out_rows[m]
    np.maximum.at(last, made, made_at)
    n_in = np.diff(graph.in_ptr)
    view_ids = [k for k in np.unique(op_kind).tolist() if "view" in get_op(k).traits] if aliases else []
    is_view = np.isin(op_kind, view_ids) & (n_in > 0)
    type_bytes = np.array([t.nbytes if isinstance(t, TensorType) and t.nbytes is not None else -1
                           for t in graph.types] or [0], dtype=np.int64)
    vbytes = type_bytes[graph.value_type] if nv else np.zeros(0, np.int64)
    kind = np.full(nv, EXTERNAL, dtype=np.int64)
    kind[made] = np.where(is_view[made_by], ALIAS, np.where(vbytes[made] >= 0, PLANNED, DYNAMIC))
    # alias roots: follow first inputs through chains of views (pointer jumping)
    viewed = is_view[made_by]
    alias = made[viewed]
    parent = np.arange(nv, dtype=np.int64)
    parent[alias] = graph.in_ids[graph.in_ptr[made_by[viewed]]]
    while True:
        step = parent[parent]
        if np.array_equal(step, parent):
            break
        parent = step
    planned = made[kind[made] == PLANNED]
    start = np.full(nv, -1, dtype=np.int64)
    start[planned] = made_at[kind[made] == PLANNED]
    end = np.full(nv, -1, dtype=np.int64)
    end[planned] = last[planned]
    target_roots = parent[np.asarray(targets, dtype=np.int64)] if targets else np.zeros(0, np.int64)
    pinned = np.unique(target_roots[kind[target_roots] == PLANNED])
    end[pinned] = n
    roots = parent[alias]
    m = kind[roots] == PLANNED  # a root lives as long as its views
    np.maximum.at(end, roots[m], last[alias[m]])
    size = np.zeros(nv, dtype=np.int64)
    size[planned] = -(-vbytes[planned] // ALIGN) * ALIGN
    inplace = _inplace_pairs(graph, sched, kind, end, pinned, parent, alias)
    return _Lifetimes(kind, size, start, end, inplace, pinned, parent, alias)


def _analyse(graph: Graph, schedule: np.ndarray, targets: list[int], aliases: bool = True) -> tuple[
        list[int], list[int | None], ValueMap, ValueMap, Triples, set[int], dict[int, int]]:
    """:func:`_lifetimes` as (kind, nbytes, start, end, inplace, pinned, alias root) mappings and lists."""
    lt = _lifetimes(graph, schedule, targets, aliases)
    return (lt.kind.tolist(), value_nbytes(graph), ValueMap(lt.start), ValueMap(lt.end), Triples(lt.inplace),
            set(lt.pinned.tolist()), dict(zip(lt.alias.tolist(), lt.parent[lt.alias].tolist(), strict=True)))


SIMPLE_ARITY = 4
"""Ops with one output and at most this many inputs get their in-place decision vectorised."""


def _inplace_pairs(graph: Graph, sched: np.ndarray, kind_arr: np.ndarray, end_arr: np.ndarray,
                   pinned_arr: np.ndarray, parent: np.ndarray, alias: np.ndarray) -> np.ndarray:
    """(op, input, output) rows where the output may take over the input's storage, in schedule order.

    For each output, the first declared in-place input position (in order) whose value is planned, not
    pinned, of the same type and last used by this op, is not also read at a position that is not in-place
    and has no view read by the same op. Ops with one output and few inputs (nearly all) are decided
    with NumPy, position by position; the others one by one.
    """
    op_kind = graph.op_kind
    none = np.zeros((0, 3), dtype=np.int64)
    kinds_inplace = sorted(k for k in np.unique(op_kind[sched]).tolist() if k != CONST.id and get_op(k).inplace)
    if not kinds_inplace:
        return none
    steps = np.flatnonzero(np.isin(op_kind[sched], kinds_inplace))
    ops = sched[steps]
    positions = [[p for p in get_op(k).inplace if (get_op(k).name, p) not in UNSAFE_INPLACE] for k in kinds_inplace]
    declared = [get_op(k).inplace for k in kinds_inplace]
    n_in = (graph.in_ptr[ops + 1] - graph.in_ptr[ops]).astype(np.int64)
    n_out = graph.out_ptr[ops + 1] - graph.out_ptr[ops]
    simple = (n_out == 1) & (n_in <= SIMPLE_ARITY)
    vtype = graph.value_type
    pinned_mask = np.zeros(len(kind_arr), dtype=bool)
    pinned_mask[pinned_arr] = True
    found_steps: list[np.ndarray] = []
    found: list[np.ndarray] = []
    # vectorised: one pass per position rank
    s_ops, s_steps, s_in = ops[simple], steps[simple], n_in[simple]
    kidx = np.searchsorted(kinds_inplace, op_kind[s_ops])
    w = graph.out_ids[graph.out_ptr[s_ops]].astype(np.int64)
    width = max(len(p) for p in positions)
    pos_tab = np.full((len(kinds_inplace), width), -1, dtype=np.int64)
    decl_tab = np.zeros((len(kinds_inplace), SIMPLE_ARITY), dtype=bool)
    for i, (ps, ds) in enumerate(zip(positions, declared, strict=True)):
        pos_tab[i, :len(ps)] = ps
        decl_tab[i, [d for d in ds if d < SIMPLE_ARITY]] = True
    has = np.arange(SIMPLE_ARITY)[None, :] < s_in[:, None]
    ins = np.where(has, graph.in_ids[np.minimum(graph.in_ptr[s_ops][:, None] + np.arange(SIMPLE_ARITY),
                                                 max(len(graph.in_ids) - 1, 0))], 0).astype(np.int64)
    chosen = np.full(len(s_ops), -1, dtype=np.int64)
    live = kind_arr[w] == PLANNED
    rows = np.arange(len(s_ops))
    for j in range(width):
        p = pos_tab[kidx, j]
        ok = live & (chosen < 0) & (p >= 0) & (p < s_in)
        v = ins[rows, np.clip(p, 0, SIMPLE_ARITY - 1)]
        ok &= (kind_arr[v] == PLANNED) & (end_arr[v] == s_steps) & ~pinned_mask[v] & (vtype[v] == vtype[w])
        bad = np.zeros(len(s_ops), dtype=bool)
        for k in range(SIMPLE_ARITY):
            u = ins[:, k]
            bad |= has[:, k] & (((u == v) & ~decl_tab[kidx, k]) | ((parent[u] == v) & (u != v)))
        ok &= ~bad
        chosen[ok] = v[ok]
    hit = chosen >= 0
    found_steps.append(s_steps[hit])
    found.append(np.stack([s_ops[hit], chosen[hit], w[hit]], axis=1))
    # the rest, one op at a time
    rest = np.flatnonzero(~simple)
    if len(rest):
        in_ptr, in_ids = graph.in_ptr.tolist(), graph.in_ids.tolist()
        out_ptr, out_ids = graph.out_ptr.tolist(), graph.out_ids.tolist()
        root = dict(zip(alias.tolist(), parent[alias].tolist(), strict=True))
        kidx_rest = np.searchsorted(kinds_inplace, op_kind[ops[rest]]).tolist()
        more: list[tuple[int, int, int]] = []
        more_steps: list[int] = []
        for s, op, ki in zip(steps[rest].tolist(), ops[rest].tolist(), kidx_rest, strict=True):
            ins_l = in_ids[in_ptr[op]:in_ptr[op + 1]]
            taken: list[int] = []
            for wv in out_ids[out_ptr[op]:out_ptr[op + 1]]:
                if kind_arr[wv] != PLANNED:
                    continue
                for p in positions[ki]:
                    if p >= len(ins_l):
                        continue
                    v = ins_l[p]
                    if (kind_arr[v] != PLANNED or end_arr[v] != s or pinned_mask[v] or v in taken
                            or vtype[v] != vtype[wv]
                            or any(u == v and q not in declared[ki] for q, u in enumerate(ins_l))
                            or any(root.get(u) == v for u in ins_l)):  # a view of v is read by the same op
                        continue
                    taken.append(v)
                    more.append((op, v, wv))
                    more_steps.append(s)
                    break
        if more:
            found_steps.append(np.asarray(more_steps, dtype=np.int64))
            found.append(np.asarray(more, dtype=np.int64))
    all_steps = np.concatenate(found_steps)
    return np.concatenate(found)[np.argsort(all_steps, kind="stable")].astype(np.int64)


def owl_plan(graph: Graph, schedule: np.ndarray, kind: Sequence[int], nbytes: Sequence[int | None],
             inplace: Sequence[tuple[int, int, int]], pinned: Iterable[int],
             root: Mapping[int, int] | None = None) -> OwlPlan:
    """Owl's Algorithm 1 (MXNet-style block reuse) in bytes, on a given schedule.

    One departure from the pseudo-code, for correctness: the blocks of the
    inputs an op is the last user of go back to the pool *after* its outputs
    got blocks, unless the op reuses them in place (Owl's pseudo-code frees
    first, which lets e.g. a matmul overwrite its own input).
    """
    nv = graph.num_values
    kind_arr = np.asarray(kind, dtype=np.int64)
    size = np.array([-(-(b or 0) // ALIGN) * ALIGN for b in nbytes], dtype=np.int64)
    parent = np.arange(nv, dtype=np.int64)
    if root:
        parent[np.fromiter(root.keys(), np.int64, len(root))] = np.fromiter(root.values(), np.int64, len(root))
    rows = inplace.array if isinstance(inplace, Triples) else np.asarray(list(inplace), dtype=np.int64).reshape(-1, 3)
    pinned_arr = np.fromiter(pinned, np.int64)
    sizes, block = _owl_blocks(graph, np.asarray(schedule, dtype=np.int64), kind_arr, size, rows, pinned_arr, parent)
    return OwlPlan(sizes, ValueMap(block), len(rows))


def _owl_blocks(graph: Graph, schedule: np.ndarray, kind: np.ndarray, size: np.ndarray, inplace: np.ndarray,
                pinned: np.ndarray, parent: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Owl's Algorithm 1: block sizes, and the block of every planned value (-1 for the others)."""
    nv = graph.num_values
    # inputs as the values whose storage they use, -1 where that storage is not planned
    rooted = parent[graph.in_ids]
    rooted[kind[rooted] != PLANNED] = -1
    scheduled = np.zeros(graph.num_ops, dtype=bool)
    scheduled[schedule] = True
    reads = rooted[scheduled[np.repeat(np.arange(graph.num_ops), np.diff(graph.in_ptr))] & (rooted >= 0)]
    refs = np.bincount(reads, minlength=nv).tolist()
    via_arr = np.full(nv, -1, dtype=np.int64)
    via_arr[inplace[:, 2]] = inplace[:, 1]
    via = via_arr.tolist()
    in_ptr, in_ids = graph.in_ptr.tolist(), rooted.tolist()
    out_ptr = graph.out_ptr.tolist()
    out_planned = np.where(kind[graph.out_ids] == PLANNED, graph.out_ids, -1).tolist()
    size_l = size.tolist()
    keep = np.zeros(nv, dtype=bool)
    keep[pinned] = True
    pinned_l = keep.tolist()
    sizes: list[int] = []
    # The pool: block ids by size (a heap each, lowest id first) and the sorted distinct sizes,
    # so best fit is a bisection however many blocks are free.
    free: dict[int, list[int]] = {}
    free_sizes: list[int] = []
    block = [-1] * nv

    def find_best(s: int) -> int:
        i = bisect_left(free_sizes, s)
        if i == len(free_sizes):
            if not free_sizes:
                sizes.append(s)
                return len(sizes) - 1
            i -= 1  # nothing fits: grow the largest free block
        bucket = free[free_sizes[i]]
        b = heapq.heappop(bucket)
        if not bucket:
            del free[free_sizes[i]]
            del free_sizes[i]
        if sizes[b] < s:
            sizes[b] = s
        return b

    def release(v: int) -> None:
        if not pinned_l[v] and block[v] >= 0:
            b = block[v]
            bucket = free.get(sizes[b])
            if bucket is None:
                bucket = free[sizes[b]] = []
                insort(free_sizes, sizes[b])
            heapq.heappush(bucket, b)

    for op in schedule.tolist():
        outs = [w for w in out_planned[out_ptr[op]:out_ptr[op + 1]] if w >= 0]
        moved = []
        for w in outs:
            v = via[w]
            if v < 0:
                block[w] = find_best(size_l[w])
            else:
                block[w] = block[v]
                moved.append(v)
        for v in in_ids[in_ptr[op]:in_ptr[op + 1]]:
            if v >= 0:
                refs[v] -= 1
                if refs[v] == 0 and v not in moved:
                    release(v)
        for w in outs:
            if refs[w] == 0:
                release(w)  # produced but never used (and not pinned)
    return sizes, np.asarray(block, dtype=np.int64)


# ----------------------------------------------------------------------------- packing
class _FreeRanges:
    """The free byte ranges of one bin while packing in schedule order (an online best-fit allocator).

    Freed ranges merge with their free neighbours. A bin of fixed ``cap`` keeps
    its free range at the top as an ordinary gap; the arena (``cap=None``) has
    an unbounded free tail from ``tail`` up, used only when no gap fits (so the
    arena grows only when it must). Subclasses index the gaps for best fit
    (:meth:`_index`, :meth:`_unindex`).
    """

    __slots__ = ("by_end", "by_start", "cap", "tail")

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        self.by_start: dict[int, int] = {}  # gap offset -> size
        self.by_end: dict[int, int] = {}  # gap end -> offset
        self.tail = 0

    def _index(self, off: int, size: int) -> None:
        raise NotImplementedError

    def _unindex(self, off: int, size: int) -> None:
        raise NotImplementedError

    def _add(self, off: int, size: int) -> None:
        self.by_start[off] = size
        self.by_end[off + size] = off
        self._index(off, size)

    def _remove(self, off: int) -> int:
        size = self.by_start.pop(off)
        del self.by_end[off + size]
        self._unindex(off, size)
        return size

    def take(self, off: int, size: int) -> None:
        """Occupy ``size`` bytes at the start of the gap at ``off`` (or of the arena's tail)."""
        if self.cap is None and off == self.tail:
            self.tail = off + size
            return
        gap = self._remove(off)
        if gap > size:
            self._add(off + size, gap - size)

    def free(self, off: int, size: int) -> None:
        """Give ``size`` bytes at ``off`` back, merged with the free ranges next to them."""
        end = off + size
        if end in self.by_start:
            end += self._remove(end)
        before = self.by_end.get(off)
        if before is not None:
            self._remove(before)
            off = before
        if self.cap is None and end == self.tail:
            self.tail = off
        else:
            self._add(off, end - off)


class _BufferGaps(_FreeRanges):
    """The gaps of an output or state buffer, indexed in a sorted ``(size, bin, offset)`` list shared by
    all such buffers, so the best fit over all of them is one bisection."""

    __slots__ = ("bin", "sorted")

    def __init__(self, cap: int, bin: int, shared: list[tuple[int, int, int]]) -> None:
        super().__init__(cap)
        self.bin = bin
        self.sorted = shared
        if cap:
            self._add(0, cap)

    def _index(self, off: int, size: int) -> None:
        insort(self.sorted, (size, self.bin, off))

    def _unindex(self, off: int, size: int) -> None:
        del self.sorted[bisect_left(self.sorted, (size, self.bin, off))]

    def retire(self) -> None:
        """Drop every gap of this bin from the shared list (its owner holds the whole bin from now on)."""
        for off in list(self.by_start):
            self._remove(off)


class _ArenaGaps(_FreeRanges):
    """The arena's gaps, in one heap of offsets per gap size.

    Entries of gaps since taken or merged are dropped when they come up, so a
    fragmented arena of millions of gaps costs O(log n) per operation, not a
    list insertion.
    """

    __slots__ = ("buckets", "sizes")

    def __init__(self) -> None:
        super().__init__(None)
        self.buckets: dict[int, list[int]] = {}  # gap size -> heap of offsets (some stale)
        self.sizes: list[int] = []  # sorted sizes with a bucket

    def _index(self, off: int, size: int) -> None:
        bucket = self.buckets.get(size)
        if bucket is None:
            bucket = self.buckets[size] = []
            insort(self.sizes, size)
        heapq.heappush(bucket, off)

    def _unindex(self, off: int, size: int) -> None:
        pass  # stale heap entries are skipped by best()

    def best(self, size: int) -> int | None:
        """Offset of the smallest gap that holds ``size`` bytes (the lowest offset among equals), or None."""
        sizes, by_start = self.sizes, self.by_start
        i = bisect_left(sizes, size)
        while i < len(sizes):
            z = sizes[i]
            bucket = self.buckets[z]
            while bucket and by_start.get(bucket[0]) != z:
                heapq.heappop(bucket)
            if bucket:
                return bucket[0]
            del self.buckets[z]
            del sizes[i]
        return None


FIXED_BIN_PROBES = 32
"""Packing in schedule order, how many fitting gaps of output/state buffers are tried (smallest first)
before the arena: a buffer's gap is usable only by values that die before the buffer's owner is born."""


def _pack_in_schedule_order(gs: list[int], ge: list[int], gz: list[int], gbin: list[int],
                            bins: list[Bin]) -> tuple[list[int], list[int]]:
    """``_pack``'s ``schedule`` mode in O(n log n): an online best-fit allocator per bin.

    Groups are placed in order of first use; a group whose last use is past
    is freed (a heap by end step) before the next is placed, so the free
    ranges are exactly the complement of the groups alive at that step, as
    the quadratic search over all placed groups found them.
    """
    n = len(gs)
    where_bin, where_off = [0] * n, [0] * n
    shared: list[tuple[int, int, int]] = []
    arena = _ArenaGaps()
    gaps: list[Any] = [arena] + [_BufferGaps(b.size, i, shared) for i, b in enumerate(bins) if i > 0]
    inf = float("inf")
    owner_start = [inf] * len(bins)
    for i in range(n):
        b = gbin[i]
        if b >= 0:
            where_bin[i] = b
            owner_start[b] = min(owner_start[b], gs[i])
    births = sorted((s, b) for b, s in enumerate(owner_start) if b > 0 and s != inf)
    next_birth = 0
    retired = [False] * len(bins)
    live: list[tuple[int, int, int, int]] = []  # (end, bin, offset, size)
    order = sorted((i for i in range(n) if gbin[i] < 0), key=lambda i: (gs[i], -gz[i]))
    for i in order:
        s, e, size = gs[i], ge[i], gz[i]
        while live and live[0][0] < s:
            _end, b, off, z = heapq.heappop(live)
            if not retired[b]:
                gaps[b].free(off, z)
        while next_birth < len(births) and births[next_birth][0] <= s:
            b = births[next_birth][1]
            retired[b] = True
            gaps[b].retire()
            next_birth += 1
        b, off = 0, -1
        if shared:
            k = bisect_left(shared, (size, -1, -1))
            for _gz, gb, go in shared[k:k + FIXED_BIN_PROBES]:
                if owner_start[gb] > e:
                    b, off = gb, go
                    break
        if off < 0:
            best = arena.best(size)
            off = arena.tail if best is None else best
            if off + size > bins[0].size:
                bins[0].size = off + size
        gaps[b].take(off, size)
        heapq.heappush(live, (e, b, off, size))
        where_bin[i], where_off[i] = b, off
    return where_bin, where_off


def _best_gap(placed: list[tuple[int, int, int, int]], s: int, e: int, size: int,
              cap: int | None, first: bool = False) -> tuple[float, int] | None:
    """(gap size, offset) of the best-fitting (or lowest, with ``first``) free range for an item alive over [s, e]."""
    busy = sorted((o, o + z) for (ps, pe, o, z) in placed if not (pe < s or e < ps))
    best: tuple[float, int] | None = None
    cur = 0
    for o, oe in busy:
        if o - cur >= size and (best is None or o - cur < best[0]):
            best = (o - cur, cur)
            if first:
                return best
        cur = max(cur, oe)
    if cap is None:
        if best is None:
            best = (float("inf"), cur)
    elif cap - cur >= size and (best is None or cap - cur < best[0]):
        best = (cap - cur, cur)
    return best


class _Placed:
    """The groups placed in one bin so far, for the size-ordered packers: a list while short, arrays after.

    :meth:`best_gap` gives what :func:`_best_gap` gives; past :data:`_PLACED_LIST_LIMIT` groups it is
    computed with NumPy (the overlap filter, the sort by offset and the running end), which keeps the
    quadratic size modes fast enough for :data:`SIZE_ORDER_LIMIT` groups.
    """

    __slots__ = ("cols", "items", "n")

    def __init__(self) -> None:
        self.items: list[tuple[int, int, int, int]] = []
        self.cols = np.zeros((4, 0), dtype=np.int64)
        self.n = 0

    def add(self, s: int, e: int, off: int, size: int) -> None:
        self.items.append((s, e, off, size))
        if len(self.items) > _PLACED_LIST_LIMIT:
            if self.n == self.cols.shape[1]:
                grown = np.zeros((4, max(2 * self.n, 1024)), dtype=np.int64)
                grown[:, :self.n] = self.cols[:, :self.n]
                self.cols = grown
            if self.n == 0:
                self.cols[:, :len(self.items)] = np.array(self.items, dtype=np.int64).T
                self.n = len(self.items)
            else:
                self.cols[:, self.n] = (s, e, off, size)
                self.n += 1

    def best_gap(self, s: int, e: int, size: int, cap: int | None, first: bool) -> tuple[float, int] | None:
        if self.n == 0:
            return _best_gap(self.items, s, e, size, cap, first)
        ps, pe, po, pz = self.cols[:, :self.n]
        hit = ~((pe < s) | (e < ps))
        o, oe = po[hit], po[hit] + pz[hit]
        order = np.lexsort((oe, o))
        o, oe = o[order], oe[order]
        cur_before = np.empty_like(o)
        if len(o):
            cur_before[0] = 0
            np.maximum.accumulate(oe[:-1], out=cur_before[1:])
            np.maximum(cur_before, 0, out=cur_before)
        gaps = o - cur_before
        fits = np.flatnonzero(gaps >= size)
        best: tuple[float, int] | None = None
        if len(fits):
            k = int(fits[0]) if first else int(fits[np.argmin(gaps[fits])])
            best = (int(gaps[k]), int(cur_before[k]))
            if first:
                return best
        cur = int(max(oe.max(initial=0), 0))
        if cap is None:
            if best is None:
                best = (float("inf"), cur)
        elif cap - cur >= size and (best is None or cap - cur < best[0]):
            best = (cap - cur, cur)
        return best


_PLACED_LIST_LIMIT = 48
"""Up to this many placed groups, a bin's best gap is searched in plain Python (cheaper than NumPy calls)."""


def _pack(gs: list[int], ge: list[int], gz: list[int], gbin: list[int], bins: list[Bin],
          mode: str) -> tuple[list[int], list[int]]:
    """Place every group (first step, last step, size, own bin or -1) in a bin at an aligned offset.

    Returns the bin and offset of each group. ``mode``: ``size`` (largest first, best-fitting gap),
    ``size-first`` (largest first, lowest gap) or ``schedule`` (in order of first use, best-fitting gap;
    O(n log n)). The size modes compare each group with every group placed before it (quadratic):
    they run for at most :data:`SIZE_ORDER_LIMIT` groups.
    """
    if mode == "schedule":
        return _pack_in_schedule_order(gs, ge, gz, gbin, bins)
    n = len(gs)
    placed = [_Placed() for _ in bins]
    where_bin, where_off = [0] * n, [0] * n
    order = sorted(range(n), key=lambda i: (gbin[i] < 0, -gz[i], gs[i]))
    fixed = list(range(1, len(bins)))
    for i in order:
        s, e, size = gs[i], ge[i], gz[i]
        if gbin[i] >= 0:
            b, off = gbin[i], 0
        else:
            choice: tuple[float, int, int] | None = None
            for b in fixed:
                if bins[b].size >= size:
                    got = placed[b].best_gap(s, e, size, bins[b].size, mode == "size-first")
                    if got is not None and (choice is None or got[0] < choice[0]):
                        choice = (got[0], b, got[1])
            if choice is None:
                got = placed[0].best_gap(s, e, size, None, mode == "size-first")
                assert got is not None
                choice = (got[0], 0, got[1])
            _, b, off = choice
            if b == 0:
                bins[0].size = max(bins[0].size, off + size)
        placed[b].add(s, e, off, size)
        where_bin[i], where_off[i] = b, off
    return where_bin, where_off


@dataclass
class _Groups:
    """Storage groups (values joined by in-place reuse), numbered in order of first use."""

    of: np.ndarray
    """Group of every value (-1 for values not planned)."""
    head: np.ndarray
    tail: np.ndarray
    """First and last member of each group, in (first step, value id) order."""
    start: np.ndarray
    end: np.ndarray
    size: np.ndarray


def _groups(lt: _Lifetimes) -> _Groups:
    nv = len(lt.kind)
    planned = np.flatnonzero(lt.kind == PLANNED)
    head = np.arange(nv, dtype=np.int64)
    head[lt.inplace[:, 2]] = lt.inplace[:, 1]
    while True:  # follow in-place chains to their first value (pointer jumping)
        step = head[head]
        if np.array_equal(step, head):
            break
        head = step
    order = planned[np.lexsort((planned, lt.start[planned]))]
    heads = order[head[order] == order]
    n_groups = len(heads)
    gid = np.full(nv, -1, dtype=np.int64)
    gid[heads] = np.arange(n_groups)
    of = np.full(nv, -1, dtype=np.int64)
    of[planned] = gid[head[planned]]
    end = np.full(n_groups, -1, dtype=np.int64)
    np.maximum.at(end, of[planned], lt.end[planned])
    size = np.zeros(n_groups, dtype=np.int64)
    np.maximum.at(size, of[planned], lt.size[planned])
    rank = np.empty(nv, dtype=np.int64)
    rank[order] = np.arange(len(order))
    last = np.full(n_groups, -1, dtype=np.int64)
    np.maximum.at(last, of[order], rank[order])
    return _Groups(of, heads, order[last], lt.start[heads], end, size)


def plan_memory(graph: Graph, targets: Iterable[int] | None = None, *,
                schedule: str | np.ndarray = "best", aliases: bool = True) -> MemoryPlan:
    """Plan the memory of the ops ``targets`` need (default: outputs and update sources).

    ``schedule`` is ``"dfs"``, ``"greedy"``, ``"best"`` (plan both, keep the
    smaller) or an explicit array of op ids in a valid order. With ``aliases``
    the outputs of view ops (reshape, permute_dims, ...) are views of their
    input, which then lives as long as its views; without, they are copies
    planned like any value.
    """
    with paused_gc():
        return _plan_memory(graph, targets, schedule, aliases)


def _plan_memory(graph: Graph, targets: Iterable[int] | None, schedule: str | np.ndarray,
                 aliases: bool) -> MemoryPlan:
    targets = default_targets(graph) if targets is None else [int(t) for t in targets]
    if isinstance(schedule, str):
        names = {"dfs": ["dfs"], "greedy": ["greedy"], "best": ["dfs", "greedy"]}[schedule]
        candidates = []
        with progress.task(f"plan: dfs schedule of {graph.num_ops:,} ops"):
            dfs = dfs_schedule(graph, targets)
        for name in names:
            if name == "dfs":
                sched = dfs
            else:
                with progress.task(f"plan: {name} schedule of {graph.num_ops:,} ops"):
                    sched = greedy_schedule(graph, targets, base=dfs)
            if any(np.array_equal(sched, c[1]) for c in candidates):
                continue
            candidates.append((name, sched))
    else:
        candidates = [("given", np.asarray(schedule, dtype=np.int32))]
    best: MemoryPlan | None = None
    for name, sched in candidates:
        with progress.task(f"plan: memory on the {name} schedule ({len(sched):,} ops)"):
            p = _plan_on(graph, sched, name, targets, aliases)
        if best is None or (p.total_bytes, p.owl.total) < (best.total_bytes, best.owl.total):
            best = p
    assert best is not None
    return best


def _plan_on(graph: Graph, schedule: np.ndarray, name: str, targets: list[int], aliases: bool) -> MemoryPlan:
    lt = _lifetimes(graph, schedule, targets, aliases)
    owl_sizes, owl_block = _owl_blocks(graph, np.asarray(schedule, dtype=np.int64), lt.kind, lt.size, lt.inplace,
                                       lt.pinned, lt.parent)
    owl = OwlPlan(owl_sizes, ValueMap(owl_block), len(lt.inplace))
    grp = _groups(lt)
    n_groups = len(grp.head)
    outputs = [int(v) for v in graph.outputs.tolist()]
    update_src = [int(v) for v in graph.updates[:, 0].tolist()]
    # lower bound: the largest total of live group bytes at any step
    n = len(schedule)
    diff = np.zeros(n + 2, dtype=np.int64)
    np.add.at(diff, grp.start, grp.size)
    np.add.at(diff, grp.end + 1, -grp.size)
    lower = int(np.cumsum(diff).max(initial=0))
    gs, ge, gz = grp.start.tolist(), grp.end.tolist(), grp.size.tolist()
    results = []
    # Layouts: outputs (and update sources) in their own buffers, or only update sources, or all in the arena.
    output_set = set(outputs)
    for layout, owners in (("own-outputs", outputs + update_src), ("arena-outputs", update_src)):
        bins = [Bin("arena", 0)]
        bin_of = np.full(len(lt.kind), -1, dtype=np.int64)
        for v in owners:
            if lt.kind[v] == PLANNED and bin_of[v] < 0:
                bin_of[v] = len(bins)
                bins.append(Bin("output" if v in output_set and layout == "own-outputs" else "state",
                                int(lt.size[v]), v))
        gbin = bin_of[grp.tail].tolist()
        modes = ["size", "size-first", "schedule"] if n_groups <= SIZE_ORDER_LIMIT else ["schedule"]
        for mode in modes:
            trial = [Bin(b.kind, b.size, b.owner) for b in bins]
            where = _pack(gs, ge, gz, gbin, trial, mode)
            results.append((sum(b.size for b in trial), len(results), f"{mode}/{layout}", trial, where))
    # Owl's blocks laid end to end in the arena (update sources keep their state buffers): a valid placement
    state_bins = [Bin(b.kind, b.size, b.owner) for b in bins if b.kind == "state"]
    state_of = np.zeros(len(lt.kind), dtype=np.int64)
    for i, sb in enumerate(state_bins):
        state_of[sb.owner] = i + 1
    in_state = state_of[grp.tail]
    blk = owl_block[grp.head]
    used = np.unique(blk[in_state == 0])
    block_sizes = np.asarray(owl_sizes, dtype=np.int64)
    offsets = np.zeros(len(owl_sizes), dtype=np.int64)
    offsets[used] = np.cumsum(block_sizes[used]) - block_sizes[used]
    total = int(block_sizes[used].sum())
    where = (np.where(in_state > 0, in_state, 0).tolist(),
             np.where(in_state > 0, 0, offsets[blk] if len(blk) else 0).tolist())
    owl_bins = [Bin("arena", total), *state_bins]
    results.append((sum(b.size for b in owl_bins), len(results), "owl-blocks/arena-outputs", owl_bins, where))
    _, _, packing, bins, (wbin, woff) = min(results, key=lambda r: (r[0], r[1]))
    planned = np.flatnonzero(grp.of >= 0)
    place_bin = np.full(len(lt.kind), -1, dtype=np.int64)
    place_off = np.zeros(len(lt.kind), dtype=np.int64)
    if n_groups:
        place_bin[planned] = np.asarray(wbin, dtype=np.int64)[grp.of[planned]]
        place_off[planned] = np.asarray(woff, dtype=np.int64)[grp.of[planned]]
    alias_root = dict(zip(lt.alias.tolist(), lt.parent[lt.alias].tolist(), strict=True))
    workspace = _workspaces(graph, schedule)
    return MemoryPlan(graph=graph, schedule=schedule, schedule_name=name, targets=targets, kind=lt.kind.tolist(),
                      nbytes=value_nbytes(graph), start=ValueMap(lt.start), end=ValueMap(lt.end),
                      inplace=Triples(lt.inplace), bins=bins, placement=PlacementMap(place_bin, place_off),
                      owl=owl, lower_bound=lower, packing=packing,
                      extra={"groups": n_groups, "group_of": ValueMap(grp.of), "alias_root": alias_root,
                             "candidates": {r[2]: r[0] for r in results}, "workspace": workspace})


# ----------------------------------------------------------------------------- control flow
def body_peak(body: Any) -> int:
    """The peak bytes of one run of a body (a :class:`~opgraph.core.subgraph.Subgraph`): its plan's peak.

    Planned once per body (kept on it), nested bodies included.

    >>> import opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float32", (16,)), name="x"); b.output(b.exp(x))
    >>> body_peak(Subgraph(b.freeze()))
    64
    """
    return body.cache(("plan-peak",), lambda: plan_memory(body.graph).peak)  # type: ignore[no-any-return]


def op_workspace(kind: str, attrs: Mapping[str, Any]) -> int:
    """Bytes an op of ``kind`` needs for its bodies while it runs (its ``OpDef.workspace``; 0 for most ops).

    >>> op_workspace("add", {})
    0
    """
    rule = get_op(kind).workspace
    return 0 if rule is None else int(rule(attrs, body_peak))


def _workspaces(graph: Graph, schedule: np.ndarray) -> dict[int, int]:
    from opgraph.core.subgraph import bodies_in

    with_body = [aid for aid, a in enumerate(graph.attrs) if any(True for _, v in a for _ in bodies_in(v))]
    if not with_body:
        return {}
    ops = np.asarray(schedule, dtype=np.int64)
    ops = ops[np.isin(graph.op_attr[ops], with_body)]
    return {int(op): op_workspace(get_op(int(graph.op_kind[op])).name, graph.attrs_of(int(op)))
            for op in ops.tolist()}


def check_plan(plan: MemoryPlan) -> None:
    """Raise AssertionError if two values alive at the same step share bytes (in-place pairs excepted).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (8,)))
    >>> b.output(b.op("add", b.op("exp", x), b.op("sin", x)))
    >>> check_plan(plan_memory(b.freeze()))
    """
    group_of = plan.extra["group_of"]
    items = []
    for v, (b, off) in plan.placement.items():
        size = align(plan.nbytes[v] or 0)
        assert off % ALIGN == 0 and off + size <= plan.bins[b].size, f"value {v} out of its bin"
        items.append((b, off, off + size, plan.start[v], plan.end[v], v))
    items.sort()
    for i, (b, _o, oe, s, e, v) in enumerate(items):
        for b2, o2, _oe2, s2, e2, v2 in items[i + 1:]:
            if b2 != b or o2 >= oe:
                break
            if not (e < s2 or e2 < s) and group_of[v] != group_of[v2]:
                raise AssertionError(f"values {v} and {v2} overlap in bin {b} while both alive")
