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

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph.core.graph import Graph
from opgraph.core.registry import CONST, get_op
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
of another value (outputs of :data:`~opgraph.ops.shape.VIEW_OPS`: their storage is their root's)."""


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
    block_of: dict[int, int]
    inplace: int

    @property
    def total(self) -> int:
        """Sum of the block sizes."""
        return int(sum(self.block_sizes))


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
    start: dict[int, int]
    end: dict[int, int]
    inplace: list[tuple[int, int, int]]
    """(op, input value, output value): the output reuses the input's storage."""
    bins: list[Bin]
    placement: dict[int, tuple[int, int]]
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

    def stats(self) -> dict[str, Any]:
        """Planner statistics: our plan, Owl's Algorithm 1 on the same schedule, the lower bound.

        ``planned_bytes`` is the arena plus the output and state buffers;
        ``no_reuse_bytes`` the sum of every planned value's (aligned) size;
        ``lower_bound_bytes`` the largest total of live bytes at any step.
        """
        planned = [v for v, k in enumerate(self.kind) if k == PLANNED]
        return {
            "schedule": self.schedule_name,
            "packing": self.packing,
            "ops": len(self.schedule),
            "planned_values": len(planned),
            "dynamic_values": int(sum(1 for k in self.kind if k == DYNAMIC)),
            "arena_bytes": self.arena_bytes,
            "output_bytes": int(sum(b.size for b in self.bins if b.kind == "output")),
            "state_bytes": int(sum(b.size for b in self.bins if b.kind == "state")),
            "planned_bytes": self.total_bytes,
            "no_reuse_bytes": int(sum(align(self.nbytes[v] or 0) for v in planned)),
            "lower_bound_bytes": self.lower_bound,
            "owl_bytes": self.owl.total,
            "owl_blocks": len(self.owl.block_sizes),
            "inplace": len(self.inplace),
            "groups": int(self.extra.get("groups", 0)),
            "bins": len(self.bins),
        }


# ----------------------------------------------------------------------------- analysis
def _analyse(graph: Graph, schedule: np.ndarray, targets: list[int], aliases: bool = True) -> tuple[
        list[int], list[int | None], dict[int, int], dict[int, int], list[tuple[int, int, int]], set[int],
        dict[int, int]]:
    from opgraph.ops.shape import VIEW_OPS

    nbytes = value_nbytes(graph)
    n = len(schedule)
    kind = [EXTERNAL] * graph.num_values
    in_ptr, in_ids = graph.in_ptr.tolist(), graph.in_ids.tolist()
    out_ptr, out_ids = graph.out_ptr.tolist(), graph.out_ids.tolist()
    kinds = graph.op_kind.tolist()
    view_ids = {get_op(name).id for name in VIEW_OPS} if aliases else set()
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    root: dict[int, int] = {}  # alias value -> the value whose storage it views
    last: dict[int, int] = {}  # last use of every value (aliases included)
    for s, op in enumerate(schedule.tolist()):
        ins = in_ids[in_ptr[op]:in_ptr[op + 1]]
        for v in ins:
            last[v] = s
        if kinds[op] == CONST.id:
            continue
        for v in out_ids[out_ptr[op]:out_ptr[op + 1]]:
            last[v] = s
            if kinds[op] in view_ids and ins:
                kind[v] = ALIAS
                root[v] = root.get(ins[0], ins[0])
            elif nbytes[v] is None:
                kind[v] = DYNAMIC
            else:
                kind[v] = PLANNED
                start[v] = s
    for v in start:
        end[v] = last[v]
    pinned: set[int] = set()
    for v in targets:
        r = root.get(v, v)
        if kind[r] == PLANNED:
            pinned.add(r)
    for v in pinned:
        end[v] = n
    for y, r in root.items():  # a root lives as long as its views
        if kind[r] == PLANNED:
            end[r] = max(end[r], last[y])
    inplace: list[tuple[int, int, int]] = []
    types = graph.value_type.tolist()
    for s, op in enumerate(schedule.tolist()):
        if kinds[op] == CONST.id:
            continue
        opdef = get_op(kinds[op])
        if not opdef.inplace:
            continue
        ins = in_ids[in_ptr[op]:in_ptr[op + 1]]
        taken: set[int] = set()
        for w in out_ids[out_ptr[op]:out_ptr[op + 1]]:
            if kind[w] != PLANNED:
                continue
            for pos in opdef.inplace:
                if pos >= len(ins) or (opdef.name, pos) in UNSAFE_INPLACE:
                    continue
                v = ins[pos]
                if (kind[v] != PLANNED or v in pinned or v in taken or end[v] != s or types[v] != types[w]
                        or any(u == v and p not in opdef.inplace for p, u in enumerate(ins))
                        or any(root.get(u) == v for u in ins)):  # a view of v is read by the same op
                    continue
                taken.add(v)
                inplace.append((op, v, w))
                break
    return kind, nbytes, start, end, inplace, pinned, root


def owl_plan(graph: Graph, schedule: np.ndarray, kind: list[int], nbytes: list[int | None],
             inplace: list[tuple[int, int, int]], pinned: set[int], root: dict[int, int] | None = None) -> OwlPlan:
    """Owl's Algorithm 1 (MXNet-style block reuse) in bytes, on a given schedule.

    One departure from the pseudo-code, for correctness: the blocks of the
    inputs an op is the last user of go back to the pool *after* its outputs
    got blocks, unless the op reuses them in place (Owl's pseudo-code frees
    first, which lets e.g. a matmul overwrite its own input).
    """
    in_ptr, in_ids = graph.in_ptr.tolist(), graph.in_ids.tolist()
    out_ptr, out_ids = graph.out_ptr.tolist(), graph.out_ids.tolist()
    sched = schedule.tolist()
    refs: dict[int, int] = {}
    for op in sched:
        for v in in_ids[in_ptr[op]:in_ptr[op + 1]]:
            v = root.get(v, v)
            if kind[v] == PLANNED:
                refs[v] = refs.get(v, 0) + 1
    via = {w: v for _op, v, w in inplace}
    sizes: list[int] = []
    free: list[int] = []  # block ids in the pool
    block_of: dict[int, int] = {}

    def find_best(s: int) -> int:
        fitting = [b for b in free if sizes[b] >= s]
        if fitting:
            b = min(fitting, key=lambda b: (sizes[b], b))
        elif free:
            b = max(free, key=lambda b: (sizes[b], -b))
            sizes[b] = s
        else:
            sizes.append(s)
            return len(sizes) - 1
        free.remove(b)
        return b

    def release(v: int) -> None:
        if v not in pinned and v in block_of:
            free.append(block_of[v])

    for op in sched:
        outs = [w for w in out_ids[out_ptr[op]:out_ptr[op + 1]] if kind[w] == PLANNED]
        for w in outs:
            v = via.get(w)
            block_of[w] = block_of[v] if v is not None else find_best(align(nbytes[w] or 0))
        moved = {via[w] for w in outs if w in via}
        for v in in_ids[in_ptr[op]:in_ptr[op + 1]]:
            v = root.get(v, v)
            if kind[v] == PLANNED:
                refs[v] -= 1
                if refs[v] == 0 and v not in moved:
                    release(v)
        for w in outs:
            if refs.get(w, 0) == 0:
                release(w)  # produced but never used (and not pinned)
    return OwlPlan(sizes, block_of, len(inplace))


# ----------------------------------------------------------------------------- packing
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


def _pack(groups: list[dict[str, Any]], bins: list[Bin], mode: str) -> dict[int, tuple[int, int]]:
    """Place every group in a bin at an aligned offset; returns group index -> (bin, offset).

    ``mode``: ``size`` (largest first, best-fitting gap), ``size-first`` (largest first,
    lowest gap) or ``schedule`` (in order of first use, best-fitting gap; linear time).
    """
    placed: list[list[tuple[int, int, int, int]]] = [[] for _ in bins]
    where: dict[int, tuple[int, int]] = {}
    by_size = mode != "schedule"
    order = sorted(range(len(groups)), key=lambda i: (groups[i]["bin"] < 0, -groups[i]["size"], groups[i]["start"])
                   if by_size else (groups[i]["bin"] < 0, groups[i]["start"], -groups[i]["size"]))
    fixed = [b for b in range(1, len(bins))]
    for i in order:
        g = groups[i]
        s, e, size = g["start"], g["end"], g["size"]
        if g["bin"] >= 0:
            b, off = g["bin"], 0
        else:
            if not by_size:  # schedule order: groups that ended before s never conflict again
                for lst in placed:
                    lst[:] = [p for p in lst if p[1] >= s]
            choice: tuple[float, int, int] | None = None
            for b in fixed:
                if bins[b].size >= size:
                    got = _best_gap(placed[b], s, e, size, bins[b].size, mode == "size-first")
                    if got is not None and (choice is None or got[0] < choice[0]):
                        choice = (got[0], b, got[1])
            if choice is None:
                got = _best_gap(placed[0], s, e, size, None, mode == "size-first")
                assert got is not None
                choice = (got[0], 0, got[1])
            _, b, off = choice
            if b == 0:
                bins[0].size = max(bins[0].size, off + size)
        placed[b].append((s, e, off, size))
        where[i] = (b, off)
    return where


def _groups(kind: list[int], nbytes: list[int | None], start: dict[int, int], end: dict[int, int],
            inplace: list[tuple[int, int, int]]) -> tuple[list[list[int]], dict[int, int]]:
    group_of: dict[int, int] = {}
    members: list[list[int]] = []
    via = {w: v for _op, v, w in inplace}
    for v in sorted(start, key=lambda v: (start[v], v)):
        src = via.get(v)
        if src is not None:
            gi = group_of[src]
            members[gi].append(v)
        else:
            gi = len(members)
            members.append([v])
        group_of[v] = gi
    return members, group_of


def plan_memory(graph: Graph, targets: Iterable[int] | None = None, *,
                schedule: str | np.ndarray = "best", aliases: bool = True) -> MemoryPlan:
    """Plan the memory of the ops ``targets`` need (default: outputs and update sources).

    ``schedule`` is ``"dfs"``, ``"greedy"``, ``"best"`` (plan both, keep the
    smaller) or an explicit array of op ids in a valid order. With ``aliases``
    the outputs of view ops (reshape, permute_dims, ...) are views of their
    input, which then lives as long as its views; without, they are copies
    planned like any value.
    """
    targets = default_targets(graph) if targets is None else [int(t) for t in targets]
    if isinstance(schedule, str):
        names = {"dfs": ["dfs"], "greedy": ["greedy"], "best": ["dfs", "greedy"]}[schedule]
        candidates = []
        for name in names:
            sched = dfs_schedule(graph, targets) if name == "dfs" else greedy_schedule(graph, targets)
            if any(np.array_equal(sched, c[1]) for c in candidates):
                continue
            candidates.append((name, sched))
    else:
        candidates = [("given", np.asarray(schedule, dtype=np.int32))]
    best: MemoryPlan | None = None
    for name, sched in candidates:
        p = _plan_on(graph, sched, name, targets, aliases)
        if best is None or (p.total_bytes, p.owl.total) < (best.total_bytes, best.owl.total):
            best = p
    assert best is not None
    return best


def _plan_on(graph: Graph, schedule: np.ndarray, name: str, targets: list[int], aliases: bool) -> MemoryPlan:
    kind, nbytes, start, end, inplace, pinned, root = _analyse(graph, schedule, targets, aliases)
    owl = owl_plan(graph, schedule, kind, nbytes, inplace, pinned, root)
    members, group_of = _groups(kind, nbytes, start, end, inplace)
    outputs = [int(v) for v in graph.outputs.tolist()]
    update_src = [int(v) for v in graph.updates[:, 0].tolist()]
    groups = []
    for mem in members:
        groups.append({"start": start[mem[0]], "end": max(end[v] for v in mem), "tail": mem[-1],
                       "size": max(align(nbytes[v] or 0) for v in mem)})
    # lower bound: the largest total of live group bytes at any step
    n = len(schedule)
    diff = np.zeros(n + 2, dtype=np.int64)
    for g in groups:
        diff[g["start"]] += g["size"]
        diff[g["end"] + 1] -= g["size"]
    lower = int(np.cumsum(diff).max(initial=0))
    results = []
    # Layouts: outputs (and update sources) in their own buffers, or only update sources, or all in the arena.
    for layout, owners in (("own-outputs", outputs + update_src), ("arena-outputs", update_src)):
        bins = [Bin("arena", 0)]
        bin_of_owner: dict[int, int] = {}
        for v in owners:
            if kind[v] == PLANNED and v not in bin_of_owner:
                bin_of_owner[v] = len(bins)
                bins.append(Bin("output" if v in outputs and layout == "own-outputs" else "state",
                                align(nbytes[v] or 0), v))
        for g in groups:
            g["bin"] = bin_of_owner.get(g["tail"], -1)
        modes = ["size", "size-first", "schedule"] if len(groups) <= SIZE_ORDER_LIMIT else ["schedule"]
        for mode in modes:
            trial = [Bin(b.kind, b.size, b.owner) for b in bins]
            where = _pack(groups, trial, mode)
            results.append((sum(b.size for b in trial), len(results), f"{mode}/{layout}", trial, where))
    # Owl's blocks laid end to end in the arena (update sources keep their state buffers): a valid placement
    state_bins = [Bin(b.kind, b.size, b.owner) for b in bins if b.kind == "state"]
    state_of = {b.owner: i + 1 for i, b in enumerate(state_bins)}
    used = sorted({owl.block_of[m[0]] for m in members if m[-1] not in state_of})
    offsets: dict[int, int] = {}
    total = 0
    for blk in used:
        offsets[blk] = total
        total += owl.block_sizes[blk]
    where = {i: ((state_of[m[-1]], 0) if m[-1] in state_of else (0, offsets[owl.block_of[m[0]]]))
             for i, m in enumerate(members)}
    owl_bins = [Bin("arena", total), *state_bins]
    results.append((sum(b.size for b in owl_bins), len(results), "owl-blocks/arena-outputs", owl_bins, where))
    _, _, packing, bins, where = min(results, key=lambda r: (r[0], r[1]))
    placement = {v: where[group_of[v]] for v in start}
    return MemoryPlan(graph=graph, schedule=schedule, schedule_name=name, targets=targets, kind=kind,
                      nbytes=nbytes, start=start, end=end, inplace=inplace, bins=bins, placement=placement,
                      owl=owl, lower_bound=lower, packing=packing,
                      extra={"groups": len(groups), "group_of": group_of, "members": members, "alias_root": root,
                             "candidates": {r[2]: r[0] for r in results}})


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
