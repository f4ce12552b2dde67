"""opgraph.passes: every rule as a before/expected pair of graphs, DCE, CSE, folding, the pipeline, report, CLI."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.core.graph import Graph
from opgraph.passes import (
    FUSE,
    FUSE_UPDATES,
    LAYOUT,
    SIMPLIFY,
    P,
    Rule,
    RuleSet,
    cse,
    dce,
    fold_constants,
    optimize,
    rewrite,
    rule_table,
)
from opgraph.passes.rules import _BINARY_BROADCASTING

F = ("float64", (2, 3))
INT = ("int64", (2, 3))
Builder = Callable[[opgraph.GraphBuilder], Any]


def graph(fn: Builder, hash_cons: bool = True) -> Graph:
    b = opgraph.GraphBuilder(hash_cons=hash_cons)
    outs = fn(b)
    outs = outs if isinstance(outs, tuple) else (outs,)
    b.output(*outs)
    return b.freeze()


# (rule expected to fire, before, expected, optimize kwargs)
CASES: list[tuple[str, Builder, Builder, dict[str, Any]]] = [
    ("add_zero", lambda b: b.add(b.input(INT), 0), lambda b: b.input(INT), {}),
    ("add_zero", lambda b: b.add(b.input(F), -0.0), lambda b: b.input(F), {}),
    ("add_zero", lambda b: b.add(b.input(F), 0.0), lambda b: b.input(F), {"fast_math": True}),
    ("add_neg", lambda b: b.add(b.input(F), b.negative(b.input(F))),
     lambda b: b.subtract(b.input(F), b.input(F)), {}),
    ("subtract_zero", lambda b: b.subtract(b.input(F), 0.0), lambda b: b.input(F), {}),
    ("subtract_neg", lambda b: b.subtract(b.input(F), b.negative(b.input(F))),
     lambda b: b.add(b.input(F), b.input(F)), {}),
    ("subtract_self", lambda b: (lambda x: b.subtract(x, x))(b.input(INT)),
     lambda b: (b.input(INT), b.constant(np.zeros((2, 3), np.int64)))[1], {}),
    ("multiply_one", lambda b: b.multiply(b.input(F), 1.0), lambda b: b.input(F), {}),
    ("multiply_zero", lambda b: b.multiply(b.input(INT), 0),
     lambda b: (b.input(INT), b.constant(np.zeros((2, 3), np.int64)))[1], {}),
    ("multiply_zero", lambda b: b.multiply(b.input(F), 0.0),
     lambda b: (b.input(F), b.constant(np.zeros((2, 3))))[1], {"fast_math": True}),
    ("zero_divide", lambda b: b.divide(0.0, b.input(F)),
     lambda b: (b.input(F), b.constant(np.zeros((2, 3))))[1], {"fast_math": True}),
    ("zero_floor_divide", lambda b: b.floor_divide(0, b.input(INT)),
     lambda b: (b.input(INT), b.constant(np.zeros((2, 3), np.int64)))[1], {}),
    ("divide_one", lambda b: b.divide(b.input(F), 1.0), lambda b: b.input(F), {}),
    ("power_one", lambda b: b.power(b.input(F), 1.0), lambda b: b.input(F), {}),
    ("negative_negative", lambda b: b.negative(b.negative(b.input(F))), lambda b: b.input(F), {}),
    ("positive", lambda b: b.positive(b.input(F)), lambda b: b.input(F), {}),
    ("copy", lambda b: b.copy(b.input(F)), lambda b: b.input(F), {}),
    ("abs_abs", lambda b: b.abs(b.abs(b.input(F))), lambda b: b.abs(b.input(F)), {}),
    ("logical_not_not", lambda b: b.logical_not(b.logical_not(b.input(("bool", (3,))))),
     lambda b: b.input(("bool", (3,))), {}),
    ("cast_same", lambda b: b.cast(b.input(F), dtype="float64"), lambda b: b.input(F), {}),
    ("log_exp", lambda b: b.log(b.exp(b.input(F))), lambda b: b.input(F), {"fast_math": True}),
    ("exp_log", lambda b: b.exp(b.log(b.input(F))), lambda b: b.input(F), {"fast_math": True}),
    ("transpose_transpose", lambda b: b.permute_dims(b.permute_dims(b.input(F))), lambda b: b.input(F), {}),
    ("transpose_transpose",
     lambda b: b.permute_dims(b.permute_dims(b.input(("float32", (2, 3, 4))), axes=(1, 0, 2)), axes=(0, 2, 1)),
     lambda b: b.permute_dims(b.input(("float32", (2, 3, 4))), axes=(1, 2, 0)), {}),
    ("transpose_identity", lambda b: b.permute_dims(b.input(F), axes=(0, 1)), lambda b: b.input(F), {}),
    ("reshape_same", lambda b: b.reshape(b.input(F), shape=(2, 3)), lambda b: b.input(F), {}),
    ("reshape_reshape", lambda b: b.reshape(b.reshape(b.input(F), shape=(6,)), shape=(3, 2)),
     lambda b: b.reshape(b.input(F), shape=(3, 2)), {}),
    ("broadcast_same", lambda b: b.broadcast_to(b.input(F), shape=(2, 3)), lambda b: b.input(F), {}),
    ("sum_size_one", lambda b: b.sum(b.input(("int32", (2, 1))), axis=1),
     lambda b: b.cast(b.reshape(b.input(("int32", (2, 1))), shape=(2,)), dtype="int64"), {}),
    ("prod_size_one", lambda b: b.prod(b.input(("float64", (1, 3))), axis=0, keepdims=True),
     lambda b: b.input(("float64", (1, 3))), {}),
    ("max_size_one", lambda b: b.max(b.input(("float64", (3, 1))), axis=1, keepdims=True),
     lambda b: b.input(("float64", (3, 1))), {}),
    ("min_size_one", lambda b: b.min(b.input(("float64", (1, 1)))),
     lambda b: b.reshape(b.input(("float64", (1, 1))), shape=()), {}),
    ("fma", lambda b: b.add(b.multiply(b.input(F), b.input(F)), b.input(F)),
     lambda b: b.fma(b.input(F), b.input(F), b.input(F)), {}),
    ("matmul_transpose_a",
     lambda b: b.matmul(b.permute_dims(b.input(("float64", (3, 2)))), b.input(("float64", (3, 4)))),
     lambda b: b.matmul_t(b.input(("float64", (3, 2))), b.input(("float64", (3, 4))), transpose_a=True), {}),
    ("matmul_transpose_b",
     lambda b: b.matmul(b.input(("float64", (2, 3))), b.permute_dims(b.input(("float64", (4, 3))))),
     lambda b: b.matmul_t(b.input(("float64", (2, 3))), b.input(("float64", (4, 3))), transpose_b=True), {}),
    ("matmul_transpose_ab",
     lambda b: b.matmul(b.permute_dims(b.input(("float64", (5, 3, 2))), axes=(0, 2, 1)),
                        b.permute_dims(b.input(("float64", (4, 3))))),
     lambda b: b.matmul_t(b.input(("float64", (5, 3, 2))), b.input(("float64", (4, 3))), transpose_a=True,
                          transpose_b=True), {}),
]
for _k in _BINARY_BROADCASTING:
    CASES.append((f"{_k}_drop_broadcast",
                  lambda b, k=_k: b.op(k, b.broadcast_to(b.input(("float64", (1, 3))), shape=(2, 3)), b.input(F)),
                  lambda b, k=_k: b.op(k, b.input(("float64", (1, 3))), b.input(F)), {}))
    CASES.append((f"{_k}_drop_repeat",
                  lambda b, k=_k: b.op(k, b.input(F), b.repeat(b.input(("float64", (2, 1))), repeats=3, axis=1)),
                  lambda b, k=_k: b.op(k, b.input(F), b.input(("float64", (2, 1)))), {}))


def _adagrad(b: opgraph.GraphBuilder, fused: bool) -> None:
    p, acc, g = (b.input(("float32", (3,)), name=n) for n in ("p", "acc", "g"))
    if fused:
        p2, acc2 = b.adagrad_update(p, acc, g, lr=float(np.float32(0.5)), eps=float(np.float32(1e-6)))
    else:
        acc2 = b.add(acc, b.multiply(g, g))
        p2 = b.subtract(p, b.divide(b.multiply(0.5, g), b.add(b.sqrt(acc2), 1e-6)))
    b.update(p2, p)
    b.update(acc2, acc)


def _momentum(b: opgraph.GraphBuilder, fused: bool) -> None:
    p, v, g = (b.input(("float64", (2, 2)), name=n) for n in ("p", "v", "g"))
    if fused:
        p2, v2 = b.sgd_momentum_update(p, v, g, lr=0.05, mu=0.9)
    else:
        v2 = b.add(b.multiply(0.9, v), g)
        p2 = b.subtract(p, b.multiply(0.05, v2))
    b.update(p2, p)
    b.update(v2, v)
    b.output(p2)


def _adam(b: opgraph.GraphBuilder, fused: bool) -> None:
    p, m, v, g = (b.input(("float64", (3,)), name=n) for n in "pmvg")
    b1, b2, lr, eps, t = 0.8, 0.99, 0.01, 1e-7, 4
    if fused:
        p2, m2, v2 = b.adam_update(p, m, v, g, lr=lr, b1=b1, c1=1 - b1, b2=b2, c2=1 - b2, bc1=1 - b1 ** t,
                                   bc2=1 - b2 ** t, eps=eps)
    else:
        m2 = b.add(b.multiply(b1, m), b.multiply(1 - b1, g))
        v2 = b.add(b.multiply(b2, v), b.multiply(b.multiply(1 - b2, g), g))
        p2 = b.subtract(p, b.divide(b.multiply(lr, b.divide(m2, 1 - b1 ** t)),
                                    b.add(b.sqrt(b.divide(v2, 1 - b2 ** t)), eps)))
    b.update(p2, p)
    b.update(m2, m)
    b.update(v2, v)


UPDATE_CASES = [("adagrad", _adagrad), ("sgd_momentum", _momentum), ("adam", _adam)]


def _build(fn: Callable[[opgraph.GraphBuilder], None]) -> Graph:
    b = opgraph.GraphBuilder()
    fn(b)
    return b.freeze()


@pytest.mark.parametrize("rule,before,expected,kw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_before_expected(rule: str, before: Builder, expected: Builder, kw: dict[str, Any]) -> None:
    g = graph(before)
    rep = optimize(g, report="data", **kw)
    assert rep.counts.get(rule, 0) >= 1, rep.counts
    want = graph(expected)
    assert rep.graph == want, f"got\n{rep.graph}\nwant\n{want}"
    rep.graph.verify()
    # and the results agree with the unoptimised graph
    rng = np.random.default_rng(0)
    arrays = [_random(rng, g.type_of(int(v))) for v in g.inputs]
    if kw.get("fast_math"):
        arrays = [np.abs(a) + 1 if a.dtype.kind == "f" else a for a in arrays]
    with np.errstate(all="ignore"):
        res = list(zip(g.run(feeds_for(g, arrays)), rep.graph.run(feeds_for(rep.graph, arrays)), strict=True))
    for a, b in res:
        np.testing.assert_allclose(a, b, rtol=1e-12)
        assert a.dtype == b.dtype and a.shape == b.shape


def feeds_for(g: Graph, arrays: list[np.ndarray]) -> dict[int, np.ndarray]:
    return {int(v): a for v, a in zip(g.inputs, arrays, strict=True)}


def _random(rng: np.random.Generator, t: Any) -> np.ndarray:
    if t.dtype.kind == "b":
        return rng.random(t.shape) < 0.5
    if t.dtype.kind in "iu":
        return rng.integers(-5, 5, t.shape).astype(t.dtype)
    return rng.standard_normal(t.shape).astype(t.dtype)


@pytest.fixture
def updates_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Update rules fire at every size, numba or not: these tests check the patterns, not the NumPy engine's
    cost gate (opgraph.ops.fused.UPDATE_MIN; test_update_fusion_only_where_it_pays checks that)."""
    import opgraph.ops.fused as fused

    monkeypatch.setattr(fused, "UPDATE_MIN", {k: (0, 0) for k in fused.UPDATE_MIN})


@pytest.mark.usefixtures("updates_any_size")
@pytest.mark.parametrize("rule,fn", UPDATE_CASES)
def test_update_fusion_before_expected(rule: str, fn: Any) -> None:
    g = _build(lambda b: fn(b, False))
    rep = optimize(g, report="data")
    assert rep.counts == {rule: 1}
    want = _build(lambda b: fn(b, True))
    assert rep.graph == want, f"got\n{rep.graph}\nwant\n{want}"
    rng = np.random.default_rng(1)
    arrays = [np.abs(_random(rng, g.type_of(int(v)))) for v in g.inputs]
    o = rep.graph
    for a, b in zip(g.run(feeds_for(g, arrays), list(g.updates[:, 0])),
                    o.run(feeds_for(o, arrays), list(o.updates[:, 0])), strict=True):
        np.testing.assert_array_equal(a, b)  # the fused kernels repeat the same operations: bit-identical


def test_every_rule_has_a_case() -> None:
    covered = {c[0] for c in CASES} | {c[0] for c in UPDATE_CASES} | {"einsum_pairwise"} | {
        "adam_t_sq", "adam_t", "adam_sq"} | {  # test_training_steps_from_opgraph_optim, test_adam_variants
        "power_square", "power_reciprocal", "power_zero", "power_half", "power_small_int", "matmul_nd_2d",
        "gelu"} | {  # tests/test_numpy_engine_kernels.py; below, tests/test_numpy_engine_fused_ops.py
        "silu", "hard_sigmoid", "hard_swish", "hard_swish_relu6", "hard_swish_relu6_mul", "layer_norm",
        "layer_norm_rsqrt", "layer_norm_scale", "layer_norm_bias", "layer_norm_bias_only"} | {
        "fold_scale", "fold_shift", "fold_fma", "fold_negate"}  # tests/test_passes_fold_affine.py
    names = {r[1] for r in rule_table() if not r[1].startswith("fuse_elementwise.")}
    assert names - covered == set()  # the fuse_elementwise.* family is one rule: test_fuse_elementwise_chain


@pytest.mark.parametrize("before", [
    lambda b: b.add(b.input(F), 0.0),            # -0.0 + 0.0 is +0.0
    lambda b: b.subtract(b.input(F), -0.0),      # same
    lambda b: b.multiply(b.input(F), 0.0),       # inf * 0 is nan
    lambda b: b.divide(0.0, b.input(F)),         # 0 / 0 is nan
    lambda b: (lambda x: b.subtract(x, x))(b.input(F)),
    lambda b: b.log(b.exp(b.input(F))),
    lambda b: b.add(b.broadcast_to(b.input(("float64", (1, 3))), shape=(2, 3)), b.input(("float64", (3,)))),
    lambda b: b.add(b.multiply(b.input(F), b.input(F)), b.input(("float64", (3, 2, 3)))),  # fine: types checked
])
def test_inexact_rules_do_not_fire(before: Builder) -> None:
    g = graph(before)
    rep = optimize(g, level=1, report="data")
    assert rep.counts == {}
    assert rep.graph is g


def test_fma_needs_single_use() -> None:
    def before(b: opgraph.GraphBuilder) -> Any:
        x, y, z = b.input(F), b.input(F), b.input(F)
        m = b.multiply(x, y)
        return b.add(m, z), m
    g = graph(before)
    assert optimize(g) == g


def test_type_check_rejects_bad_replacement() -> None:
    rules = RuleSet().add(Rule("bad", P("exp", P.var("x")), lambda m: m.op("sum", "x"), exact="wrong on purpose"))
    g = graph(lambda b: b.exp(b.input(F)))
    assert rewrite(g, rules).counts == {}
    with pytest.raises(AssertionError, match="bad"):
        rewrite(g, rules, strict=True)


def test_rules_are_data() -> None:
    assert len(SIMPLIFY) > 20 and len(FUSE) == 16 and len(FUSE_UPDATES) == 6 and len(LAYOUT) == 2
    for set_name, name, pattern, exact in rule_table():
        assert exact, f"{set_name}.{name} documents no exactness condition"
        assert "(" in pattern


# ---------------------------------------------------------------- DCE, CSE, folding
def test_dce_keeps_updates_and_inputs() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(F, name="x")
    s = b.input(F, name="s")
    unused_in = b.input(F, name="unused")
    b.log(x)                                     # dead
    b.update(b.exp(s), s)
    b.output(b.negative(x))
    b.constant(np.arange(5.0))                   # dead constant
    g = b.freeze()
    r = dce(g)
    assert r.counts == {"dce.ops": 2}
    want = opgraph.GraphBuilder()
    x2, s2, _u = want.input(F, name="x"), want.input(F, name="s"), want.input(F, name="unused")
    e = want.exp(s2)
    n = want.negative(x2)
    want.update(e, s2)
    want.output(n)
    assert r.graph.equals(want.freeze(), check_names=True)
    assert len(r.graph.constants) == 0 and unused_in.id in g.inputs
    assert dce(r.graph).graph is r.graph


def test_cse_commutative_and_constants() -> None:
    b = opgraph.GraphBuilder(hash_cons=False)
    x, y = b.input(F, name="x"), b.input(F, name="y")
    a1, a2 = b.add(x, y), b.add(y, x)
    c1, c2 = b.constant(2.0), b.constant(2.0)
    s = b.input(F, name="s")
    out = b.subtract(b.multiply(a1, c1), b.multiply(a2, c2))
    b.update(b.exp(b.multiply(a2, c2)), s)
    b.output(out)
    r = cse(b.freeze())
    assert r.counts == {"cse.ops": 4}
    w = opgraph.GraphBuilder()
    x, y = w.input(F, name="x"), w.input(F, name="y")
    a, two = w.add(x, y), w.constant(2.0)
    s = w.input(F, name="s")
    m = w.multiply(a, two)
    out = w.subtract(m, m)
    w.update(w.exp(m), s)
    w.output(out)
    assert r.graph == w.freeze()


def test_cse_deep_duplicate_chains_fall_back_to_walk() -> None:
    b = opgraph.GraphBuilder(hash_cons=False)
    x = b.input(F)
    u = v = x
    for _ in range(100):
        u, v = b.exp(u), b.exp(v)
    b.output(u, v)
    r = cse(b.freeze(), max_rounds=8)
    assert r.counts == {"cse.ops": 100} and r.graph.num_ops == 100
    r2 = cse(b.freeze())
    assert r2.graph == r.graph


def test_cse_does_not_merge_different_attrs_or_constants() -> None:
    def before(b: opgraph.GraphBuilder) -> Any:
        x = b.input(F)
        return b.sum(x, axis=0), b.sum(x, axis=1), b.constant(0.0), b.constant(-0.0), b.constant(np.float32(0))
    g = graph(before, hash_cons=False)
    assert cse(g).counts == {}


def test_fold_constants_and_cap() -> None:
    g = graph(lambda b: b.add(b.exp(b.constant(np.zeros(3))), b.input(("float64", (3,)))))
    r = fold_constants(g)
    assert r.counts == {"fold": 1}
    w = graph(lambda b: (lambda c: b.add(c, b.input(("float64", (3,)))))(b.constant(np.ones(3))))
    assert r.graph == w
    big = graph(lambda b: b.exp(b.constant(np.zeros(100))))
    assert fold_constants(big, limit=10).counts == {}
    assert fold_constants(big, limit=100).counts == {"fold": 1}


def test_fold_keeps_a_failing_op() -> None:
    g = graph(lambda b: b.floor_divide(b.constant(np.array([1, 2])), b.constant(np.array([0, 1]))))
    # integer division by zero gives 0 with a warning in NumPy; folding runs quietly and agrees
    with np.errstate(all="ignore"):
        assert np.array_equal(optimize(g).run()[0], g.run()[0])


def test_names_survive() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(F, name="x")
    y = b.add(b.multiply(x, 1.0), 2.0, name="y")
    b.output(y)
    g = optimize(b.freeze(), level=1)
    assert g.find_value("y") == g.outputs[0] and g.find_value("x") == g.inputs[0]


def test_optimize_levels_and_report(capsys: pytest.CaptureFixture[str]) -> None:
    g = graph(lambda b: b.add(b.multiply(b.input(F), b.input(F)), b.negative(b.negative(b.input(F)))))
    assert optimize(g, level=0) is g
    assert optimize(g, level=1).kind_of(0) == "multiply"
    out = optimize(g, report=True)
    text = capsys.readouterr().out
    assert "negative_negative" in text and "fma" in text and "4 -> 1" in text
    assert out.num_ops == 1
    with pytest.raises(ValueError):
        optimize(g, level=7)


def test_optimize_never_mutates() -> None:
    g = graph(lambda b: b.add(b.input(INT), 0))
    before = (g.op_kind.copy(), g.in_ids.copy(), g.num_values)
    optimize(g)
    assert np.array_equal(g.op_kind, before[0]) and np.array_equal(g.in_ids, before[1]) and g.num_values == before[2]


def test_unordered_input_declarations() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(F)
    y = b.exp(x)
    z = b.input(F)
    b.output(b.add(b.multiply(y, z), 0.0))
    g = b.freeze()
    o = optimize(g, fast_math=True)
    o.verify()
    arrays = [np.ones((2, 3)), np.full((2, 3), 2.0)]
    np.testing.assert_array_equal(o.run(feeds_for(o, arrays))[0], g.run(feeds_for(g, arrays))[0])


# ---------------------------------------------------------------- command line
def test_cli_optimize(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from opgraph.cli import main as cli_main
    from opgraph.cli import optimize_cmd
    from opgraph.io import save

    g = graph(lambda b: b.add(b.multiply(b.input(F, name="a"), b.input(F, name="b")), b.input(F, name="c")))
    src, dst = tmp_path / "g.json", tmp_path / "o.json"
    save(g, str(src))
    parser = argparse.ArgumentParser()
    common = argparse.ArgumentParser(add_help=False)
    sub = parser.add_subparsers(dest="command")
    optimize_cmd.add_parser(sub, common)
    args = parser.parse_args(["optimize", str(src), "-o", str(dst), "--report"])
    args.debug = False
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "fma" in text
    assert cli_main.load_graph(str(dst)) == optimize(g)


def test_einsum_split_along_opt_einsum_path() -> None:
    import opt_einsum

    shapes = [(2, 30), (30, 40), (40, 5)]

    def before(b: opgraph.GraphBuilder) -> Any:
        xs = [b.input(("float64", s)) for s in shapes]
        return b.einsum(*xs, subscripts="ij,jk,kl->il")

    g = graph(before)
    rep = optimize(g, report="data")
    assert rep.counts == {"einsum_pairwise": 1}
    _, info = opt_einsum.contract_path("ij,jk,kl->il", *shapes, shapes=True)
    w = opgraph.GraphBuilder()
    ops = [w.input(("float64", s)) for s in shapes]
    for step in info.contraction_list:
        tmp = [ops.pop(i) for i in step[0]]
        ops.append(w.einsum(*tmp, subscripts=step[2]))
    w.output(ops[0])
    assert rep.graph == w.freeze()
    arrays = [np.random.default_rng(3).random(s) for s in shapes]
    np.testing.assert_array_equal(g.run(feeds_for(g, arrays))[0], rep.graph.run(feeds_for(rep.graph, arrays))[0])
    # two operands, ellipses and unknown shapes stay as they are
    for subs, shp in (("ij,jk->ik", [(2, 3), (3, 4)]), ("...ij,jk,kl->...il", [(2, 3), (3, 4), (4, 5)])):
        g2 = graph(lambda b, subs=subs, shp=shp: b.einsum(*[b.input(("float64", s)) for s in shp], subscripts=subs))
        assert optimize(g2) is g2


def test_fuse_elementwise_chain() -> None:
    def before(b: opgraph.GraphBuilder) -> Any:
        x, w, c = b.input(F), b.input(F), b.input(("float64", (3,)))
        t = b.exp(b.negative(b.multiply(x, w)))
        return b.subtract(b.add(t, c), b.abs(x)), b.sqrt(w)

    def expected(b: opgraph.GraphBuilder) -> Any:
        x, w, c = b.input(F), b.input(F), b.input(("float64", (3,)))
        prog = (("multiply", -1, -2), ("negative", 0), ("exp", 1), ("add", 2, -3), ("abs", -1), ("subtract", 3, 4))
        return b.fused_elementwise(x, w, c, program=prog), b.sqrt(w)

    g = graph(before)
    rep = optimize(g, level=3, report="data", cost=None)  # the default cost model keeps tiny chains unfused
    assert rep.graph == graph(expected), rep.graph
    assert sum(v for k, v in rep.counts.items() if k.startswith("fuse_elementwise.")) == 4
    arrays = [np.random.default_rng(5).standard_normal(t.shape) for t in (g.type_of(int(v)) for v in g.inputs)]
    for a, b in zip(g.run(feeds_for(g, arrays)), rep.graph.run(feeds_for(rep.graph, arrays)), strict=True):
        np.testing.assert_array_equal(a, b)
    # a value used twice is not inlined (it would be computed twice)
    g2 = graph(lambda b: (lambda t: (b.negative(t), b.abs(t)))(b.exp(b.input(F))))
    assert optimize(g2, level=3) == g2


@pytest.mark.usefixtures("updates_any_size")
@pytest.mark.parametrize("square_first", [False, True])
@pytest.mark.parametrize("dynamic", [False, True])
def test_adam_variants(dynamic: bool, square_first: bool) -> None:
    b1, b2, lr, eps = 0.8, 0.99, 0.01, 1e-7

    def build(b: opgraph.GraphBuilder, fused: bool) -> None:
        p, m, v, g = (b.input(("float64", (3,)), name=n) for n in "pmvg")
        t = b.input(("float64", ()), name="t")
        if dynamic:
            bc1, bc2 = b.subtract(1.0, b.power(b1, t)), b.subtract(1.0, b.power(b2, t))
        kw = dict(lr=lr, b1=b1, c1=1 - b1, b2=b2, c2=1 - b2, eps=eps, square_first=square_first)
        if fused:
            if dynamic:
                p2, m2, v2 = b.adam_update_t(p, m, v, g, bc1, bc2, **kw)
            else:
                p2, m2, v2 = b.adam_update(p, m, v, g, bc1=1 - b1 ** 3, bc2=1 - b2 ** 3, **kw)
        else:
            c1 = bc1 if dynamic else 1 - b1 ** 3
            c2 = bc2 if dynamic else 1 - b2 ** 3
            m2 = b.add(b.multiply(m, b1), b.multiply(g, 1 - b1))
            gg = b.multiply(b.multiply(g, g), 1 - b2) if square_first else b.multiply(b.multiply(1 - b2, g), g)
            v2 = b.add(b.multiply(v, b2), gg)
            p2 = b.subtract(p, b.divide(b.multiply(b.divide(m2, c1), lr), b.add(b.sqrt(b.divide(v2, c2)), eps)))
        b.update(p2, p)
        b.update(m2, m)
        b.update(v2, v)

    g = _build(lambda b: build(b, False))
    rep = optimize(g, report="data")
    assert rep.counts == {"adam" + ("_t" if dynamic else "") + ("_sq" if square_first else ""): 1}
    assert rep.graph == _build(lambda b: build(b, True))
    arrays = [np.abs(np.random.default_rng(2).standard_normal(3)) for _ in range(4)] + [np.array(3.0)]
    o = rep.graph
    for a, b in zip(g.run(feeds_for(g, arrays), list(g.updates[:, 0])),
                    o.run(feeds_for(o, arrays), list(o.updates[:, 0])), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.usefixtures("updates_any_size")
@pytest.mark.parametrize("opt,rule", [("SGD", "matmul_transpose_a"), ("Momentum", "sgd_momentum"),
                                      ("Adagrad", "matmul_transpose_a"), ("Adam", "adam_t_sq")])
def test_training_steps_from_opgraph_optim(opt: str, rule: str) -> None:
    import opgraph.optim as optim
    b = opgraph.GraphBuilder()
    w = b.input(("float64", (3, 2)), name="w")
    x = b.input(("float64", (4, 3)), name="x")
    y = b.input(("float64", (4, 2)), name="y")
    loss = b.sum(b.square(b.subtract(b.matmul(x, w), y)))
    step = optim.training_step(b, loss, [w], getattr(optim, opt)(lr=0.01))
    rep = optimize(step.graph, report="data")
    assert rep.counts.get(rule, 0) >= 1, rep.counts
    rng = np.random.default_rng(0)
    init = {"w": rng.standard_normal((3, 2))}
    feeds = {"x": rng.standard_normal((4, 3)), "y": rng.standard_normal((4, 2))}
    plain, fast = optim.StepRunner(step, init), optim.StepRunner(rep.graph, {**step.state, **init})
    for _ in range(3):
        for a, c in zip(plain(feeds), fast(feeds), strict=True):
            np.testing.assert_allclose(a, c, rtol=1e-12)
    np.testing.assert_allclose(plain.value("w"), fast.value("w"), rtol=1e-12)


def test_cli_optimize_through_main(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from opgraph.cli import main as cli_main
    from opgraph.io import save

    monkeypatch.setattr(cli_main, "COMMAND_MODULES", ("opgraph.cli.optimize_cmd",))
    g = graph(lambda b: b.negative(b.negative(b.input(F, name="x"))))
    src = tmp_path / "g.json"
    save(g, str(src))
    assert cli_main.main(["optimize", str(src), "--level", "1"]) == 0
    assert "ops" in capsys.readouterr().out
    assert cli_main.main(["optimize", str(src), "-o", str(tmp_path / "o.json"), "--fast-math", "--report"]) == 0
    assert "negative_negative" in capsys.readouterr().out
    assert cli_main.main(["optimize", str(tmp_path / "missing.json")]) == 1


@pytest.mark.parametrize("numba_on", [True, False])
def test_update_fusion_only_where_it_pays(monkeypatch: pytest.MonkeyPatch, numba_on: bool) -> None:
    """With numba an update is fused at any size; without it only from UPDATE_MIN's second size on (the NumPy
    path makes more calls than the unfused ops, so it pays only where its blocks save memory traffic)."""
    from opgraph.core import accel
    from opgraph.ops.fused import UPDATE_MIN

    if numba_on:
        pytest.importorskip("numba")  # the optional ``fast`` extra
    monkeypatch.setattr(accel, "enabled", numba_on)
    for n, fuses in ((8, numba_on), (UPDATE_MIN["adagrad_update"][1], True)):
        def build(b: opgraph.GraphBuilder, n: int = n) -> None:
            p, acc, g = (b.input(("float64", (n,)), name=k) for k in ("p", "acc", "g"))
            acc2 = b.add(acc, b.multiply(g, g))
            b.update(b.subtract(p, b.divide(b.multiply(0.5, g), b.add(b.sqrt(acc2), 1e-6))), p)
            b.update(acc2, acc)

        rep = optimize(_build(build), report="data")
        assert ("adagrad" in rep.counts) == fuses, (n, rep.counts)


def test_a_long_single_use_chain_optimises_without_deep_recursion() -> None:
    # Every multiply of a multiply chain is a candidate root of the gelu rule, whose scan reads the expression
    # below it: it must stop after a formula's size, not walk (recursively) down the whole chain.
    import sys

    n = 3 * sys.getrecursionlimit()
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (4,)), name="x")
    v = x
    for i in range(n):
        v = b.op("multiply", v, b.constant(np.float64(1.0 + (i % 5) * 1e-4)))
    b.output(v)
    g = b.freeze()
    out = opgraph.optimize(g, level=3)
    xs = np.array([-1.0, 0.0, 0.5, 2.0])
    want = xs.copy()
    for i in range(n):
        want = want * (1.0 + (i % 5) * 1e-4)
    np.testing.assert_allclose(out.run({"x": xs})[0], want, rtol=1e-12)


@pytest.mark.usefixtures("updates_any_size")
def test_update_fusion_never_closes_a_cycle() -> None:
    # p - lr * (mu * v + g) where p itself is computed from v2 = mu * v + g (a scalar graph, as a gradient's):
    # the fused op would read p and give v2, so it must not fire; before the fix optimize() made a cycle
    b = opgraph.GraphBuilder()
    v = b.input(("float64", ()), name="v")
    g = b.input(("float64", ()), name="g")
    v2 = b.op("add", b.op("multiply", 0.9, v), g)
    p = b.op("sin", v2)
    out = b.op("subtract", p, b.op("multiply", 0.1, v2))
    b.output(out)
    graph = b.freeze()
    got = fold_constants(graph).graph
    r = rewrite(got, FUSE_UPDATES)
    assert r.counts.get("sgd_momentum", 0) == 0
    r.graph.topological_order()  # no cycle
    opt = optimize(graph, level=2)
    feeds = {"v": np.array(0.3), "g": np.array(-0.7)}
    want = np.sin(0.9 * 0.3 - 0.7) - 0.1 * (0.9 * 0.3 - 0.7)
    np.testing.assert_allclose(opt.run(feeds)[0], want, rtol=1e-15)
    # the same pattern with an independent p still fuses
    b = opgraph.GraphBuilder()
    p_in, v, g = (b.input(("float64", ()), name=n) for n in ("p", "v", "g"))
    b.output(b.op("subtract", p_in, b.op("multiply", 0.1, b.op("add", b.op("multiply", 0.9, v), g))))
    assert rewrite(fold_constants(b.freeze()).graph, FUSE_UPDATES).counts.get("sgd_momentum") == 1
