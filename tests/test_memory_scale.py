"""The planner at scale: O(n log n) packing and Owl's pool, same plans as the quadratic reference, linear growth."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

import opgraph
from opgraph.memory import check_plan, plan_memory
from opgraph.memory.plan import Bin, PlacementMap, Triples, ValueMap, _pack


def _reference_schedule_pack(groups: list[tuple[int, int, int, int]], n_bins: int,
                             bin_sizes: list[int]) -> tuple[int, list[tuple[int, int]]]:
    """The quadratic definition: in (start, -size) order, best-fitting gap among the groups alive at the same time."""
    placed: list[list[tuple[int, int, int, int]]] = [[] for _ in range(n_bins)]
    where: list[tuple[int, int]] = [(0, 0)] * len(groups)
    arena = 0
    for i, (s, e, size, b) in enumerate(groups):
        if b >= 0:
            placed[b].append((s, e, 0, size))
            where[i] = (b, 0)
    order = sorted((i for i, g in enumerate(groups) if g[3] < 0), key=lambda i: (groups[i][0], -groups[i][2]))
    for i in order:
        s, e, size, _b = groups[i]
        best: tuple[float, int, int] | None = None
        for b in [*range(1, n_bins), 0]:
            if b == 0 and best is not None:
                break
            cap = bin_sizes[b] if b else None
            if cap is not None and cap < size:
                continue
            busy = sorted((o, o + z) for ps, pe, o, z in placed[b] if not (pe < s or e < ps))
            cur = 0
            for o, oe in busy:
                if o - cur >= size and (best is None or o - cur < best[0]):
                    best = (o - cur, b, cur)
                cur = max(cur, oe)
            if cap is None and (best is None):
                best = (float("inf"), 0, cur)
            elif cap is not None and cap - cur >= size and (best is None or cap - cur < best[0]):
                best = (cap - cur, b, cur)
        assert best is not None
        _, b, off = best
        if b == 0:
            arena = max(arena, off + size)
        placed[b].append((s, e, off, size))
        where[i] = (b, off)
    return arena, where


@pytest.mark.parametrize("seed", range(40))
def test_schedule_packing_equals_the_quadratic_reference(seed: int) -> None:
    rng = random.Random(seed)
    steps = rng.randint(5, 60)
    groups = []
    for _ in range(rng.randint(1, 120)):
        s = rng.randint(0, steps)
        groups.append([s, rng.randint(s, steps), 64 * rng.randint(1, 8), -1])
    bin_sizes = [0]
    for i in rng.sample(range(len(groups)), min(len(groups), rng.randint(0, 4))):
        groups[i][1], groups[i][3] = steps, len(bin_sizes)
        bin_sizes.append(groups[i][2])
    ref_arena, ref_where = _reference_schedule_pack([tuple(g) for g in groups], len(bin_sizes), bin_sizes)
    bins = [Bin("arena", 0)] + [Bin("output", z) for z in bin_sizes[1:]]
    wb, wo = _pack(*(list(c) for c in zip(*groups, strict=True)), bins, "schedule")
    assert bins[0].size == ref_arena
    assert list(zip(wb, wo, strict=True)) == ref_where


def grad_chain(steps: int, width: int = 16) -> opgraph.Graph:
    """The gradient of y <- sin(y) * x repeated ``steps`` times: every activation lives until the backward pass."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (width,)), name="x")
    y = x
    for _ in range(steps):
        y = b.multiply(b.sin(y), x)
    loss = b.sum(y)
    (gx,) = b.build_grad_ops(loss, [x])
    b.output(loss, gx)
    return b.freeze()


def test_gradient_graph_beyond_the_size_limit_is_planned_validly_and_runs() -> None:
    g = grad_chain(3000)  # > SIZE_ORDER_LIMIT groups: the schedule-order packer
    plan = plan_memory(g)
    assert plan.extra["groups"] > 5000 and plan.packing.startswith(("schedule", "owl"))
    check_plan(plan)
    assert plan.total_bytes <= plan.owl.total
    x = np.linspace(-1, 1, 16)
    loss, gx = opgraph.compile(g)(x=x)
    # independent reference: the chain and its derivative by forward-mode recurrence in NumPy
    y, dy = x.copy(), np.ones_like(x)
    for _ in range(3000):
        y, dy = np.sin(y) * x, np.cos(y) * dy * x + np.sin(y)
    np.testing.assert_allclose(loss, y.sum(), rtol=1e-10)
    np.testing.assert_allclose(gx, dy, rtol=1e-8, atol=1e-12)


def _compile_cpu_seconds(g: opgraph.Graph) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        opgraph.compile(g)
        best = min(best, time.process_time() - t)
    return best


def test_compile_time_of_gradient_graphs_grows_linearly() -> None:
    # Was quadratic (each block's best gap re-sorted every overlapping block): 3.6x per doubling.
    small, large = grad_chain(3000), grad_chain(6000)  # both past SIZE_ORDER_LIMIT groups
    assert large.num_ops > 1.9 * small.num_ops
    _compile_cpu_seconds(small)  # warm caches (kernels, op registry)
    ratio = _compile_cpu_seconds(large) / _compile_cpu_seconds(small)
    assert ratio < 2.5, f"compile time grew {ratio:.2f}x for 2x the ops"


def test_array_backed_maps_behave_like_dicts() -> None:
    m = ValueMap(np.array([-1, 3, -1, 0]))
    assert m == {1: 3, 3: 0} and len(m) == 2 and list(m) == [1, 3]
    assert 0 not in m and 3 in m and -1 not in m and 99 not in m
    with pytest.raises(KeyError):
        m[0]
    with pytest.raises(KeyError):
        m[-1]
    p = PlacementMap(np.array([0, -1, 2]), np.array([64, 0, 0]))
    assert dict(p) == {0: (0, 64), 2: (2, 0)} and p.get(1) is None
    t = Triples(np.array([[1, 2, 3], [4, 5, 6]]))
    assert list(t) == [(1, 2, 3), (4, 5, 6)] and t[1] == (4, 5, 6) and t[:1] == [(1, 2, 3)]
    assert t == [(1, 2, 3), (4, 5, 6)]


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_gap_search_equals_the_list_search(seed: int) -> None:
    from opgraph.memory.plan import _best_gap, _Placed

    rng = random.Random(seed)
    placed = _Placed()
    for _ in range(rng.randint(60, 200)):
        s = rng.randint(0, 50)
        placed.add(s, rng.randint(s, 50), 64 * rng.randint(0, 40), 64 * rng.randint(1, 6))
    assert placed.n > 0  # the NumPy path
    for _ in range(50):
        s = rng.randint(0, 50)
        e, size, cap = rng.randint(s, 50), 64 * rng.randint(1, 6), rng.choice([None, 64 * rng.randint(1, 60)])
        for first in (False, True):
            assert placed.best_gap(s, e, size, cap, first) == _best_gap(placed.items, s, e, size, cap, first)
