"""Memory planning: schedules, Owl's Algorithm 1, our packing, the lower bound, the `plan` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opgraph
from opgraph.memory import check_plan, dfs_schedule, greedy_schedule, plan_memory
from opgraph.memory.plan import DYNAMIC, EXTERNAL, PLANNED

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from memory_models import MODELS, build


def _valid_order(g: opgraph.Graph, order: np.ndarray) -> bool:
    pos = {int(op): i for i, op in enumerate(order)}
    for op in order.tolist():
        for v in g.op_inputs(op).tolist():
            p = int(g.value_producer[v])
            if p >= 0 and (p not in pos or pos[p] >= pos[op]):
                return False
    return True


def diamond() -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (100,)), name="x")
    a = b.op("exp", x)
    c = b.op("sin", x)
    d = b.op("matmul", b.op("reshape", a, shape=(10, 10)), b.op("reshape", c, shape=(10, 10)))
    b.output(b.op("tanh", d))
    return b.freeze()


def test_schedules_are_topological_and_cover_needed_ops() -> None:
    g = diamond()
    for order in (dfs_schedule(g), greedy_schedule(g)):
        assert _valid_order(g, order)
        assert sorted(order.tolist()) == np.flatnonzero(g.needed_ops(g.outputs)).tolist()


def test_dfs_is_post_order_from_outputs() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)))
    left = b.op("exp", x)
    right = b.op("sin", x)
    b.output(b.op("add", right, left))
    g = b.freeze()
    # the first operand's subgraph comes first: sin (op 1) before exp (op 0)
    assert dfs_schedule(g).tolist() == [1, 0, 2]


def test_unneeded_ops_are_not_scheduled() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)))
    b.op("exp", x)  # dead
    b.output(b.op("sin", x))
    assert dfs_schedule(b.freeze()).tolist() == [1]


def test_chain_is_planned_in_place_in_one_buffer() -> None:
    g, _feeds, _ = build("chain", scale=1 / 1024)
    p = plan_memory(g)
    s = p.stats()
    assert s["inplace"] == 19
    assert s["planned_bytes"] == s["lower_bound_bytes"] == s["owl_bytes"]
    assert s["arena_bytes"] == 0 and s["output_bytes"] == s["planned_bytes"]  # everything in the output buffer
    check_plan(p)


def test_storage_kinds() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (None, 3)), name="x")
    y = b.op("exp", x)  # dynamic: allocated at run time
    z = b.op("sum", y, axis=0)  # static f32[3]
    w = b.op("multiply", z, 2.0)
    b.output(w)
    g = b.freeze()
    p = plan_memory(g)
    assert p.kind[x.id] == EXTERNAL and p.kind[y.id] == DYNAMIC
    assert p.kind[z.id] == PLANNED and p.kind[w.id] == PLANNED
    const = int(g.op_inputs(g.value_producer[w.id])[1])
    assert p.kind[const] == EXTERNAL
    assert const not in p.placement and y.id not in p.placement


def test_inplace_needs_same_type_and_last_use() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (4, 1)), name="x")
    a = b.op("exp", x)
    c = b.op("add", a, b.constant(np.ones((1, 5))))  # broadcasts: (4,5) cannot reuse (4,1)
    d = b.op("sin", c)
    e = b.op("cos", c)  # c used twice: sin cannot overwrite it
    b.output(b.op("add", d, e))
    g = b.freeze()
    pairs = {(v, w) for _op, v, w in plan_memory(g).inplace}
    assert (a.id, c.id) not in pairs
    assert (c.id, d.id) not in pairs
    check_plan(plan_memory(g))


def test_outputs_and_update_sources_are_never_reused() -> None:
    b = opgraph.GraphBuilder()
    p = b.input(("float64", (8,)), name="p")
    g1 = b.op("exp", p)
    new = b.op("subtract", p, b.op("multiply", g1, 0.1))
    out = b.op("sum", b.op("square", new))
    b.output(g1, out)
    b.update(new, p)
    g = b.freeze()
    plan = plan_memory(g)
    srcs = {v for _op, v, _w in plan.inplace}
    assert g1.id not in srcs and new.id not in srcs
    n = len(plan.schedule)
    assert plan.end[g1.id] == n and plan.end[new.id] == n
    check_plan(plan)


def test_where_is_not_planned_in_place_on_x() -> None:
    b = opgraph.GraphBuilder()
    c = b.input(("bool", (4,)), name="c")
    x = b.op("exp", b.input(("float64", (4,)), name="x"))
    y = b.op("sin", b.input(("float64", (4,)), name="y"))
    b.output(b.op("where", c, x, y))
    plan = plan_memory(b.freeze())
    assert all(v != x.id for _op, v, _w in plan.inplace)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_benchmark_models_within_ten_percent_of_bound_and_not_above_owl(name: str) -> None:
    g, _feeds, _ = build(name, scale=0.25)
    plan = plan_memory(g)
    s = plan.stats()
    assert s["lower_bound_bytes"] <= s["planned_bytes"] <= 1.10 * s["lower_bound_bytes"]
    assert s["planned_bytes"] <= s["owl_bytes"]
    assert s["planned_bytes"] < s["no_reuse_bytes"]
    check_plan(plan)


def test_full_size_models_meet_the_targets() -> None:
    for name in sorted(MODELS):
        g, _feeds, _ = build(name)
        s = plan_memory(g).stats()
        assert s["planned_bytes"] <= min(s["owl_bytes"], 1.10 * s["lower_bound_bytes"]), (name, s)


def test_owl_baseline_reuses_blocks_best_fit() -> None:
    # two big values die, then a small one: best fit takes the smaller free block
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (64,)), name="x")
    big = b.op("reshape", b.op("outer", x, x), shape=(64 * 64,))
    small_src = b.op("sum", b.op("reshape", big, shape=(64, 64)), axis=0)
    b.output(b.op("exp", small_src))
    plan = plan_memory(b.freeze(), schedule="dfs")
    assert plan.owl.total <= sum(plan.owl.block_sizes)
    assert len(plan.owl.block_sizes) <= 3
    assert plan.total_bytes <= plan.owl.total


def random_graph(seed: int, n_ops: int) -> tuple[opgraph.Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    b = opgraph.GraphBuilder(hash_cons=False)
    shapes = [(4, 6), (6, 4), (4, 4), (24,)]
    vals = []
    feeds = {}
    for i in range(3):
        shp = shapes[int(rng.integers(0, 4))]
        vals.append(b.input(("float64", shp), name=f"in{i}"))
        feeds[f"in{i}"] = rng.standard_normal(shp)
    unary = ["exp", "sin", "tanh", "negative", "relu", "square", "softmax"]
    for _ in range(n_ops):
        k = int(rng.integers(0, 10))
        a = vals[int(rng.integers(0, len(vals)))]
        if k < 5:
            name = unary[int(rng.integers(0, len(unary)))]
            v = b.op(name, a) if name != "exp" else b.op("tanh", b.op("exp", a))
        elif k < 7:
            same = [v for v in vals if v.type == a.type]
            v = b.op(["add", "multiply", "subtract"][k - 5], a, same[int(rng.integers(0, len(same)))])
        elif k == 7 and len(a.shape) == 2:
            v = b.op("matmul", a, b.op("permute_dims", a, axes=(1, 0)))
        elif k == 8:
            v = b.op("reshape", a, shape=(-1,))
            target = [(4, 6), (6, 4), (24,)][int(rng.integers(0, 3))]
            v = b.op("reshape", v, shape=target) if v.shape == (24,) else v
        else:
            v = b.op("concat", b.op("reshape", a, shape=(-1,)), b.op("reshape", a, shape=(-1,)), axis=0)
        vals.append(v)
    outs = [vals[-1]] + [vals[int(i)] for i in rng.integers(3, len(vals), 2)]
    b.output(*dict.fromkeys(outs))
    return b.freeze(), feeds


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 30))
def test_random_graphs_plans_are_valid_and_not_above_owl(seed: int, n_ops: int) -> None:
    g, _ = random_graph(seed, n_ops)
    for sched in ("dfs", "greedy", "best"):
        plan = plan_memory(g, schedule=sched)
        check_plan(plan)
        s = plan.stats()
        assert s["lower_bound_bytes"] <= s["planned_bytes"] <= s["owl_bytes"]


def test_greedy_schedule_can_beat_dfs() -> None:
    # x feeds a long branch that ends small and a short branch that keeps a big value alive:
    # DFS runs the first operand (big) first; greedy runs the op that frees most first.
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (256,)), name="x")
    big = b.op("outer", x, x)  # 512 KiB, alive until the end
    small = b.op("sum", big, axis=0)
    branch = b.op("exp", x)
    for _ in range(4):
        branch = b.op("sum", b.op("outer", branch, branch), axis=1)
    b.output(b.op("add", b.op("multiply", b.op("sum", big, axis=1), small), branch))
    g = b.freeze()
    dfs = plan_memory(g, schedule="dfs").total_bytes
    greedy = plan_memory(g, schedule="greedy").total_bytes
    best = plan_memory(g)
    assert best.total_bytes == min(dfs, greedy)


def test_plan_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from opgraph.cli import plan_cmd
    from opgraph.io.jsonfmt import save_json

    g, _feeds, _ = build("mlp", scale=0.1)
    path = tmp_path / "mlp.json"
    save_json(g, str(path))
    parser = argparse.ArgumentParser()
    common = argparse.ArgumentParser(add_help=False)
    sub = parser.add_subparsers()
    plan_cmd.add_parser(sub, common)
    args = parser.parse_args(["plan", str(path), "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["planned_bytes"] <= out["owl_bytes"]
    args = parser.parse_args(["plan", str(path)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "lower bound" in text and "Owl" in text


def test_views_alias_their_input_which_lives_as_long_as_they_do() -> None:
    from opgraph.memory.plan import ALIAS
    from opgraph.runtime.compiled import compile

    b = opgraph.GraphBuilder()
    x = b.input(("float64", (4, 4)), name="x")
    a = b.op("exp", x)
    v = b.op("permute_dims", a, axes=(1, 0))  # a view of a
    w = b.op("negative", a)  # a's last direct use: must not overwrite a, v still reads it
    out = b.op("add", w, v)
    b.output(out, b.op("reshape", out, shape=(16,)))
    g = b.freeze()
    plan = plan_memory(g)
    assert plan.kind[v.id] == ALIAS and plan.extra["alias_root"][v.id] == a.id
    assert (a.id, w.id) not in {(s, d) for _op, s, d in plan.inplace}
    assert plan.end[a.id] >= plan.start[out.id]
    check_plan(plan)
    data = np.arange(16.0).reshape(4, 4) / 10
    f = compile(g)
    for got, want in zip(f(x=data), g.run({"x": data}), strict=True):
        np.testing.assert_allclose(got, want)
    assert plan_memory(g, aliases=False).kind[v.id] == PLANNED
