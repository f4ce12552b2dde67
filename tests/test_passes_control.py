"""Passes inside control-flow bodies: CSE, DCE, folding and rules in bodies, loop-invariant hoisting, body sharing.

Each rewrite is a before/expected pair (the expected graph built by hand) plus numeric equality of the
optimised and the unoptimised graph on random inputs (the unoptimised graph run by plain Python loops
over NumPy as the reference where the loop matters).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.core.graph import Graph
from opgraph.core.subgraph import Subgraph
from opgraph.ops.control import FOLD_WORK
from opgraph.passes import optimize
from opgraph.passes.control import BodyOptimizer, hoist_invariants, invariant_ops
from opgraph.passes.dce import cse, dce

V = ("float64", (3,))
S = ("float64", ())


def body(fn: Callable[..., Any], *types: Any, names: str = "abcdefgh", name: str = "f",
         hash_cons: bool = False) -> Subgraph:
    b = opgraph.GraphBuilder(hash_cons=hash_cons)
    ins = [b.input(t, name=names[i]) for i, t in enumerate(types)]
    outs = fn(b, *ins)
    b.output(*(outs if isinstance(outs, tuple) else (outs,)))
    return Subgraph(b.freeze(), name=name)


def same(a: Graph, b: Graph) -> None:
    """Structural equality shown as text (bodies included), so a failure shows both graphs."""
    assert str(a) == str(b)


def check_numeric(g: Graph, h: Graph, feeds: dict[str, np.ndarray]) -> None:
    for x, y in zip(g.run(feeds), h.run(feeds), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


def call_graph(f: Subgraph, n: int = 1) -> Graph:
    b = opgraph.GraphBuilder()
    x = b.input(V, name="x")
    for _ in range(n):
        x = b.op("call", x, body=f)
    b.output(x)
    return b.freeze()


# ---------------------------------------------------------------- rewrites inside bodies
def test_cse_inside_a_body() -> None:
    before = body(lambda b, x: b.add(b.exp(x), b.exp(x)), V, names="x")
    expected = body(lambda b, x: (lambda e: b.add(e, e))(b.exp(x)), V, names="x")
    g = call_graph(before)
    r = optimize(g, level=1, report="data")
    same(r.graph, call_graph(expected))
    assert r.counts["body.cse.ops"] == 1
    rng = np.random.default_rng(0)
    check_numeric(g, r.graph, {"x": rng.standard_normal(3)})


def test_dce_inside_a_body_keeps_its_signature() -> None:
    def before_fn(b: Any, x: Any, unused: Any) -> Any:
        b.log(unused)                      # dead
        b.sin(x)                           # dead
        return b.exp(x)

    before = body(before_fn, V, V, names="xu")
    expected = body(lambda b, x, u: b.exp(x), V, V, names="xu")
    assert before.graph.num_ops == 3

    def outer(f: Subgraph) -> Graph:
        b = opgraph.GraphBuilder()
        x, y = b.input(V, name="x"), b.input(V, name="y")
        b.output(b.op("call", x, y, body=f))
        return b.freeze()

    g = outer(before)
    r = dce(before.graph)
    assert r.graph.num_ops == 1 and len(r.graph.inputs) == 2      # the unused parameter stays
    out = optimize(g, level=1)
    same(out, outer(expected))
    rng = np.random.default_rng(1)
    check_numeric(g, out, {"x": rng.standard_normal(3), "y": rng.random(3) + 0.5})


def test_folding_and_rules_inside_a_body() -> None:
    # (x * 1) * (2 + 3) - 0  ->  x * 5
    before = body(lambda b, x: b.subtract(b.multiply(b.multiply(x, 1.0), b.add(b.constant(2.0), b.constant(3.0))),
                                          0.0), V, names="x")
    expected = body(lambda b, x: b.multiply(x, b.constant(5.0)), V, names="x")
    g = call_graph(before)
    r = optimize(g, level=1, report="data")
    same(r.graph, call_graph(expected))
    assert r.counts["body.fold"] == 1 and r.counts["body.multiply_one"] == 1
    check_numeric(g, r.graph, {"x": np.random.default_rng(2).standard_normal(3)})


def test_nested_bodies_are_optimised_bottom_up() -> None:
    inner = body(lambda b, x: b.add(b.exp(x), b.exp(x)), V, names="x", name="inner")
    outer = body(lambda b, x: b.op("call", b.negative(b.negative(x)), body=inner), V, names="x", name="outer")
    g = call_graph(outer)
    got = optimize(g, level=1)
    inner_e = body(lambda b, x: (lambda e: b.add(e, e))(b.exp(x)), V, names="x", name="inner")
    outer_e = body(lambda b, x: b.op("call", x, body=inner_e), V, names="x", name="outer")
    same(got, call_graph(outer_e))
    assert [s.name for s in got.subgraphs] == ["outer"]
    check_numeric(g, got, {"x": np.random.default_rng(3).standard_normal(3)})


def test_a_shared_body_is_transformed_once_and_stays_shared() -> None:
    f = body(lambda b, x: b.add(b.exp(x), b.exp(x)), V, names="x")
    # used by three calls at the top and twice more inside another body
    wrapper = body(lambda b, x: b.op("call", b.op("call", x, body=f), body=f), V, names="x", name="wrap")
    bld = opgraph.GraphBuilder()
    x = bld.input(V, name="x")
    y = bld.op("call", bld.op("call", bld.op("call", x, body=f), body=f), body=f)
    bld.output(bld.op("call", y, body=wrapper))
    g = bld.freeze()
    runs: list[int] = []

    def counting_cse(h: Graph) -> Any:
        runs.append(h.num_ops)
        return cse(h)

    r = BodyOptimizer(counting_cse)(g)
    # f is optimised once even though the wrapper's run meets it again; the wrapper once
    assert len(runs) == 2
    new_f = r.graph.subgraphs[0]
    assert new_f.graph.num_ops == 2 and new_f.name == "f"
    call_attr = {int(a) for a in r.graph.op_attr[r.graph.op_kind == opgraph.core.registry.get_op("call").id]}
    assert len(call_attr) == 2                     # the three calls of f still share one attribute set
    full = optimize(g, level=2)
    assert len(full.subgraphs) == 2 and len(full.attrs) == 2
    check_numeric(g, full, {"x": np.random.default_rng(4).standard_normal(3) * 0.1})


def test_passes_never_mutate_the_input_and_reach_a_fixed_point() -> None:
    f = body(lambda b, c, x: b.add(b.exp(b.multiply(c, 2.0)), b.add(b.exp(x), b.exp(x))), V, V, names="cx")
    b = opgraph.GraphBuilder()
    c, xs = b.input(V, name="c"), b.input(("float64", (4, 3)), name="xs")
    b.output(b.op("scan", c, xs, body=f, num_consts=1))
    g = b.freeze()
    text, key = str(g), f.key
    once = optimize(g, level=3)
    assert str(g) == text and f.key == key and f.graph.num_ops == 7
    assert optimize(once, level=3, report="data").counts == {}


# ---------------------------------------------------------------- hoisting
def scan_graph(f: Subgraph) -> Graph:
    b = opgraph.GraphBuilder()
    w, c0, xs = b.input(V, name="w"), b.input(V, name="c0"), b.input(("float64", (5, 3)), name="xs")
    outs = b.op("scan", w, c0, xs, body=f, num_consts=1, num_carry=1)
    b.output(*(outs if isinstance(outs, tuple) else (outs,)))
    return b.freeze()


def test_hoisting_out_of_a_scan_body() -> None:
    # carry' = carry + tanh(w * 2) * x ; y = carry' + sum(tanh(w * 2))
    def step(b: Any, w: Any, c: Any, x: Any) -> Any:
        t = b.tanh(b.multiply(w, 2.0))
        c2 = b.add(c, b.multiply(t, x))
        return c2, b.add(c2, b.sum(t))

    f = body(step, V, V, V, names="wcx", name="step")
    g = scan_graph(f)
    r = hoist_invariants(g)
    assert r.counts == {"hoist.scan": 1}

    def step_e(b: Any, w: Any, t: Any, st: Any, c: Any, x: Any) -> Any:
        c2 = b.add(c, b.multiply(t, x))
        return c2, b.add(c2, st)

    fe = Subgraph(_built(step_e, [("w", V), ("hoisted0", V), ("hoisted1", S), ("c", V), ("x", V)]), name="step")
    b = opgraph.GraphBuilder(hash_cons=False)
    w, c0, xs = b.input(V, name="w"), b.input(V, name="c0"), b.input(("float64", (5, 3)), name="xs")
    t = b.tanh(b.multiply(w, 2.0))
    b.output(*b.op("scan", w, t, b.sum(t), c0, xs, body=fe, num_consts=3, num_carry=1))
    same(r.graph, b.freeze())
    # the same through optimize, and numbers against a Python loop
    opt = optimize(g, level=1)
    assert invariant_ops(opt.subgraphs[0].graph, 3).sum() == 0
    rng = np.random.default_rng(5)
    feeds = {"w": rng.standard_normal(3), "c0": rng.standard_normal(3), "xs": rng.standard_normal((5, 3))}
    carry, ys = feeds["c0"], []
    for x in feeds["xs"]:
        tt = np.tanh(feeds["w"] * 2.0)
        carry = carry + tt * x
        ys.append(carry + tt.sum())
    for got in (g.run(feeds), r.graph.run(feeds), opt.run(feeds)):
        np.testing.assert_allclose(got[0], carry, rtol=1e-12)
        np.testing.assert_allclose(got[1], np.stack(ys), rtol=1e-12)


def _built(fn: Callable[..., Any], inputs: list[tuple[str, Any]]) -> Graph:
    b = opgraph.GraphBuilder(hash_cons=False)
    ins = [b.input(t, name=n) for n, t in inputs]
    outs = fn(b, *ins)
    b.output(*(outs if isinstance(outs, tuple) else (outs,)))
    return b.freeze()


def test_hoisting_out_of_a_while_loop_and_its_cond(body_calls: dict[str, int]) -> None:
    # while i < n * 2: i += 1; x = x * exp(-a)      (n * 2 and exp(-a) are invariant)
    cond = body(lambda b, n, a, i, x: b.less(i, b.multiply(n, 2.0)), S, S, S, V, names="naix", name="test")
    step = body(lambda b, n, a, i, x: (b.add(i, 1.0), b.multiply(x, b.exp(b.negative(a)))), S, S, S, V,
                names="naix", name="step")
    b = opgraph.GraphBuilder()
    n, a, x = b.input(S, name="n"), b.input(S, name="a"), b.input(V, name="x")
    b.output(*b.op("while_loop", n, a, b.constant(0.0), x, cond_body=cond, body=step, num_consts=2))
    g = b.freeze()
    r = hoist_invariants(g)
    assert r.counts == {"hoist.while_loop": 1}
    cond_e = Subgraph(_built(lambda b, n, a, h0, h1, i, x: b.less(i, h0),
                             [("n", S), ("a", S), ("hoisted0", S), ("hoisted1", S), ("i", S), ("x", V)]), name="test")
    step_e = Subgraph(_built(lambda b, n, a, h0, h1, i, x: (b.add(i, 1.0), b.multiply(x, h1)),
                             [("n", S), ("a", S), ("hoisted0", S), ("hoisted1", S), ("i", S), ("x", V)]), name="step")
    e = opgraph.GraphBuilder(hash_cons=False)
    n, a, x = e.input(S, name="n"), e.input(S, name="a"), e.input(V, name="x")
    zero = e.constant(0.0)
    h0 = e.multiply(n, 2.0)
    h1 = e.exp(e.negative(a))
    e.output(*e.op("while_loop", n, a, h0, h1, zero, x, cond_body=cond_e, body=step_e, num_consts=4))
    same(r.graph, e.freeze())
    rng = np.random.default_rng(6)
    feeds = {"n": np.array(3.0), "a": np.array(0.3), "x": rng.standard_normal(3)}
    ref = feeds["x"] * np.exp(-0.3) ** 6
    for h in (g, r.graph, optimize(g)):
        i_out, x_out = h.run(feeds)
        assert i_out == 6.0
        np.testing.assert_allclose(x_out, ref, rtol=1e-12)
    assert body_calls["step"] == 18 and body_calls["test"] == 21


def test_hoisting_leaves_variant_ops_and_cond_alone() -> None:
    f = body(lambda b, w, c, x: (b.add(c, x), b.multiply(c, w)), V, V, V, names="wcx")
    assert not hoist_invariants(scan_graph(f)).changed
    br = body(lambda b, w: b.exp(b.multiply(w, 2.0)), V, names="w")
    b = opgraph.GraphBuilder()
    p, w = b.input(("bool", ()), name="p"), b.input(V, name="w")
    b.output(b.op("cond", p, w, then_body=br, else_body=br))
    assert not hoist_invariants(b.freeze()).changed


def test_hoisting_inside_a_nested_loop_reaches_the_outer_graph() -> None:
    # an inner scan inside an outer scan's body: exp(w) is invariant in both, so it ends at the top
    inner = body(lambda b, w, c, x: b.add(c, b.multiply(b.exp(w), x)), V, V, V, names="wcx", name="inner")

    def outer_fn(b: Any, w: Any, c: Any, xs: Any) -> Any:
        return b.op("scan", w, c, xs, body=inner, num_consts=1, num_carry=1)

    outer = body(outer_fn, V, V, ("float64", (4, 3)), names="wcx", name="outer")
    b = opgraph.GraphBuilder()
    w, c0, xss = b.input(V, name="w"), b.input(V, name="c0"), b.input(("float64", (2, 4, 3)), name="xss")
    b.output(b.op("scan", w, c0, xss, body=outer, num_consts=1, num_carry=1))
    g = b.freeze()
    opt = optimize(g)
    top_kinds = [opgraph.core.registry.get_op(int(k)).name for k in opt.op_kind]
    assert top_kinds == ["exp", "scan"]
    for s in opt.subgraphs[0].graph.subgraphs + opt.subgraphs:
        assert not any(opgraph.core.registry.get_op(int(k)).name == "exp" for k in s.graph.op_kind)
    rng = np.random.default_rng(7)
    feeds = {"w": rng.standard_normal(3), "c0": rng.standard_normal(3), "xss": rng.standard_normal((2, 4, 3))}
    c = feeds["c0"]
    for xs in feeds["xss"]:
        for x in xs:
            c = c + np.exp(feeds["w"]) * x
    np.testing.assert_allclose(opt.run(feeds)[0], c, rtol=1e-12)
    np.testing.assert_allclose(g.run(feeds)[0], c, rtol=1e-12)


# ---------------------------------------------------------------- folding control ops
def test_a_constant_scan_folds_when_small(body_calls: dict[str, int]) -> None:
    f = body(lambda b, c, x: (b.add(c, x), b.multiply(c, x)), S, S, names="cx", name="acc")
    b = opgraph.GraphBuilder()
    xs = np.arange(1.0, 6.0)
    b.output(*b.op("scan", b.constant(0.0), b.constant(xs), body=f, num_carry=1))
    g = b.freeze()
    out = optimize(g, level=1)
    assert out.num_ops == 2 and set(opgraph.core.registry.get_op(int(k)).name for k in out.op_kind) == {"const"}
    carry, ys = 0.0, []
    for x in xs:
        ys.append(carry * x)
        carry += x
    got = out.run()
    assert got[0] == carry
    np.testing.assert_array_equal(got[1], ys)


def test_folding_never_runs_unbounded_or_huge_loops(body_calls: dict[str, int]) -> None:
    forever = body(lambda b, i: b.greater_equal(i, 0.0), S, names="i", name="forever")
    inc = body(lambda b, i: b.add(i, 1.0), S, names="i", name="inc")
    b = opgraph.GraphBuilder()
    b.output(b.op("while_loop", b.constant(0.0), cond_body=forever, body=inc))
    g = b.freeze()
    assert optimize(g).num_ops == 2               # not folded: it would never stop
    # bounded by max_trip and small: folds; bounded but too much work: does not
    for trips, folds in ((10, True), (FOLD_WORK + 1, False)):
        b = opgraph.GraphBuilder()
        b.output(b.op("while_loop", b.constant(0.0), cond_body=forever, body=inc, max_trip=trips))
        out = optimize(b.freeze())
        assert (out.num_ops == 1) == folds
        if folds:
            assert out.run()[0] == trips
    b = opgraph.GraphBuilder()
    step = body(lambda b, c: (b.add(c, 1.0),), S, names="c", name="count")
    b.output(b.op("scan", b.constant(0.0), body=step, num_carry=1, length=FOLD_WORK + 1))
    assert optimize(b.freeze()).num_ops == 2
    assert body_calls.get("forever", 0) == 10 and body_calls.get("inc", 0) == 10 and "count" not in body_calls


# ---------------------------------------------------------------- random graphs
UNARY = ["exp", "sin", "tanh", "negative", "abs"]
BINARY = ["add", "multiply", "subtract", "maximum"]


def random_body(rng: np.random.Generator, n_params: int, n_out: int, n_ops: int) -> Callable[..., Any]:
    """A random elementwise body with duplicated ops, dead ops, constants and invariant parts."""
    plan = [(rng.choice(UNARY + BINARY), rng.integers(0, 1 << 30, 2)) for _ in range(n_ops)]

    def fn(b: Any, *params: Any) -> Any:
        vals = [*params, b.constant(0.5)]
        for kind, (i, j) in plan:
            a, c = vals[i % len(vals)], vals[j % len(vals)]
            v = b.op(kind, a) if kind in UNARY else b.op(kind, a, c)
            vals.append(v)
            if i % 5 == 0:                    # a duplicate of the same op
                vals.append(b.op(kind, a) if kind in UNARY else b.op(kind, a, c))
        vals = [b.tanh(v) for v in vals[-n_out:]]  # bounded, so long scans stay finite
        return tuple(vals)
    return fn


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("level", [1, 2, 3])
def test_optimised_equals_unoptimised_on_random_graphs_with_bodies(seed: int, level: int) -> None:
    rng = np.random.default_rng(seed)
    nc, ncarry = int(rng.integers(0, 3)), int(rng.integers(1, 3))
    f = body(random_body(rng, nc + ncarry + 1, ncarry + 1, 12), *([V] * (nc + ncarry + 1)), name="step")
    g2 = body(random_body(rng, 1, 1, 6), V, name="g")
    b = opgraph.GraphBuilder()
    consts = [b.input(V, name=f"k{i}") for i in range(nc)]
    init = [b.input(V, name=f"c{i}") for i in range(ncarry)]
    xs = b.input(("float64", (7, 3)), name="xs")
    outs = b.op("scan", *consts, *init, xs, body=f, num_consts=nc, num_carry=ncarry)
    outs = outs if isinstance(outs, tuple) else (outs,)
    b.output(*[b.op("call", o, body=g2) if o.type.shape == (3,) else o for o in outs])
    g = b.freeze()
    feeds = {f"k{i}": rng.standard_normal(3) for i in range(nc)}
    feeds.update({f"c{i}": rng.standard_normal(3) for i in range(ncarry)})
    feeds["xs"] = rng.standard_normal((7, 3))
    opt = optimize(g, level=level)
    opt.verify()
    check_numeric(g, opt, feeds)
    assert optimize(opt, level=level, report="data").counts == {}


def test_hoisting_from_a_body_with_dynamic_dims_keeps_its_types() -> None:
    d = ("float64", (None,))
    f = body(lambda b, w, c, x: b.add(c, b.multiply(b.exp(w), x)), d, d, d, names="wcx", name="step")
    g = scan_graph(f)
    r = hoist_invariants(g)
    assert r.counts == {"hoist.scan": 1}
    new = r.graph.subgraphs[0]
    assert [str(t) for t in new.in_types] == ["f64[?]"] * 4 and new.out_types == f.out_types
    assert r.graph.type_of(r.graph.outputs[0]) == g.type_of(g.outputs[0])
    rng = np.random.default_rng(8)
    feeds = {"w": rng.standard_normal(3), "c0": rng.standard_normal(3), "xs": rng.standard_normal((5, 3))}
    expected = feeds["c0"] + np.exp(feeds["w"]) * feeds["xs"].sum(axis=0)
    for h in (g, r.graph):
        np.testing.assert_allclose(h.run(feeds)[0], expected, rtol=1e-12)


def test_sibling_scans_with_the_same_carry_merge() -> None:
    from opgraph.passes.control import merge_sibling_scans

    def step(with_sum: bool) -> Subgraph:
        def fn(b: Any, c: Any, x: Any) -> Any:
            c2 = b.tanh(b.add(c, x))
            return (c2, b.sum(c2)) if with_sum else (c2, c)

        return body(fn, ("float64", (2,)), ("float64", (2,)), names="cx", name="sum" if with_sum else "stack",
                    hash_cons=True)

    other = body(lambda b, c, x: (b.multiply(c, x), c), ("float64", (2,)), ("float64", (2,)), names="cx",
                 name="other")
    b = opgraph.GraphBuilder()
    c0, xs = b.input(("float64", (2,)), name="c0"), b.input(("float64", (5, 2)), name="xs")
    _, totals = b.op("scan", c0, xs, body=step(True), num_carry=1)
    _, carries = b.op("scan", c0, xs, body=step(False), num_carry=1)
    _, kept = b.op("scan", c0, xs, body=other, num_carry=1)          # another carry: not merged
    _, rev = b.op("scan", c0, xs, body=step(False), num_carry=1, reverse=True)  # other direction: not merged
    b.output(totals, carries, kept, rev)
    g = b.freeze()
    r = merge_sibling_scans(g)
    assert r.counts == {"merge.scan": 2}

    e = opgraph.GraphBuilder()
    c0, xs = e.input(("float64", (2,)), name="c0"), e.input(("float64", (5, 2)), name="xs")
    sb = opgraph.GraphBuilder()
    c, x = sb.input(("float64", (2,)), name="c"), sb.input(("float64", (2,)), name="x")
    c2 = sb.tanh(sb.add(c, x))
    sb.output(c2, sb.sum(c2), c)
    merged = Subgraph(sb.freeze(), name="sum+stack")
    _, totals, carries = e.op("scan", c0, xs, body=merged, num_carry=1)
    _, kept = e.op("scan", c0, xs, body=other, num_carry=1)
    _, rev = e.op("scan", c0, xs, body=step(False), num_carry=1, reverse=True)
    e.output(totals, carries, kept, rev)
    same(r.graph, e.freeze())
    rng = np.random.default_rng(0)
    check_numeric(g, r.graph, {"c0": rng.normal(size=2), "xs": rng.normal(size=(5, 2))})
    assert merge_sibling_scans(r.graph).counts == {}
