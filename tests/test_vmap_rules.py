"""Batching rules of the indexing, nn, linalg, signal and control families against a loop over examples.

Each rule runs on the cases of ``test_autodiff_rules.CASES`` with its float inputs batched (all of them, and each
alone with the others shared), and the batched result must be the op run on each example with NumPy. Control
flow is checked against a loop and against ``jax.vmap`` of the same ``jax.lax`` program.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.core.registry import family_kinds, get_op
from test_autodiff_rules import CASES

B = 3
FAMILIES = ("indexing", "nn", "linalg", "signal")

# kinds left to vmap's fallback (a loop over the examples), and why
NO_BATCH_RULE = {
    "unique": "the result's length depends on each example's values: examples do not stack",
    "nonzero": "the result's length depends on each example's values: examples do not stack",
}
# kinds whose rule leaves some cases to the fallback, and which
PARTIAL = {"one_hot": "a batched (off, on) pair of values"}

EXTRA: dict[str, list[dict[str, Any]]] = {
    "gather_elements": [{"args": ((3, 4), ("int", (3, 2), 4)), "attrs": {"axis": 1}, "pre": None}],
    "gather_nd": [{"args": ((3, 4), ("int", (2, 2), 3)), "attrs": {}, "pre": None}],
    "scatter_nd": [{"args": ((3, 4), ("int", (2, 1), 3), (2, 4)), "attrs": {"reduction": "add"}, "pre": None}],
    "scatter_elements": [{"args": ((2, 3), ("int", (2, 4), 3), (2, 4)), "attrs": {"axis": 1, "reduction": "add"},
                          "pre": None}],
    "one_hot": [{"args": (("int", (2, 3), 3), ("const", np.array([0.0, 1.0]))), "attrs": {"depth": 3},
                 "pre": None}],
    "reverse_sequence": [{"args": ((4, 3, 2), ("int", (3,), 5)), "attrs": {}, "pre": None}],
    "searchsorted": [{"args": (("sorted", (5,)), (2, 3)), "attrs": {}, "pre": None},
                     {"args": (("sorted", (5,)), (4,)), "attrs": {"side": "right"}, "pre": None}],
    "unique": [], "nonzero": [],
    "max_pool_argmax": [{"args": ((1, 2, 5, 5),), "attrs": {"kernel_size": (2, 2), "stride": (2, 2)}, "pre": None}],
    "resize": [{"args": ((1, 2, 3, 4),), "attrs": {"sizes": (1, 2, 5, 3), "mode": "linear"}, "pre": None},
               {"args": ((1, 2, 3, 4),), "attrs": {"sizes": (1, 2, 6, 2), "mode": "cubic",
                                                   "coordinate_transformation_mode": "align_corners"}, "pre": None}],
    "grid_sample": [{"args": ((1, 2, 4, 5), ("unit", (1, 3, 2, 2))), "attrs": {}, "pre": None}],
    "conv2d": [{"args": ((1, 4, 5, 5), (4, 2, 3, 3)), "attrs": {"groups": 2}, "pre": None}],
    "conv_transpose": [{"args": ((2, 4, 3, 3), (4, 1, 2, 2)), "attrs": {"stride": (2, 2), "groups": 2},
                        "pre": None}],
    "eig": [{"args": ((3, 3),), "attrs": {}, "pre": None}],
    "solve": [{"args": ((2, 3, 3), (3, 2)), "attrs": {}, "pre": None},
              {"args": ((3, 3), (2, 3, 1)), "attrs": {}, "pre": None}],
}


def _kinds() -> list[str]:
    return [k for f in FAMILIES for k in family_kinds(f)]


def _cases(kind: str) -> list[dict[str, Any]]:
    return list(CASES.get(kind, [])) + EXTRA.get(kind, [])


def test_every_kind_has_a_rule_or_a_reason() -> None:
    for kind in _kinds():
        op = get_op(kind)
        assert (op.batch is not None) != (kind in NO_BATCH_RULE), kind
        assert kind in NO_BATCH_RULE or _cases(kind), f"{kind} has a batching rule but no case"
    assert all(get_op(k).batch is not None for k in family_kinds("control"))  # each tested below


def _example(spec: Any, rng: np.random.Generator, pre: Any) -> tuple[np.ndarray, bool]:
    """One example's array for ``spec``, and whether the test may batch it (inputs, not constants)."""
    if isinstance(spec, tuple) and spec and isinstance(spec[0], str):
        kind, arg = spec[0], spec[1]
        if kind == "const":
            return np.asarray(arg), False
        if kind == "int":
            return rng.integers(0, spec[2], arg), True
        if kind == "sorted":
            return np.sort(rng.standard_normal(arg)), True
        lo, hi = {"pos": (0.5, 2.0), "unit": (-0.8, 0.8), "gt1": (1.5, 3.0)}[kind]
        a = rng.uniform(lo, hi, arg)
    else:
        a = rng.standard_normal(spec)
    if pre is not None:
        b = opgraph.GraphBuilder()
        x = b.input(("float64", a.shape))
        a = b.run({x: a}, [pre(b, x)])[0]
    return a, True


def _run_op(kind: str, args: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    b = opgraph.GraphBuilder()
    ins = [b.input((a.dtype, a.shape)) for a in args]
    res = b.op(kind, *ins, **attrs)
    res = list(res) if isinstance(res, tuple) else [res]
    return b.run(dict(zip(ins, args, strict=True)), res)


def _check_rule(kind: str, case: dict[str, Any], flags: tuple[bool, ...], rng: np.random.Generator) -> None:
    per = [[_example(s, rng, case["pre"]) for s in case["args"]] for _ in range(B)]
    floats = [f for _, f in per[0]]
    batched = tuple(f and flag for f, flag in zip(floats, flags, strict=True))
    if not any(batched):
        return  # vmap runs an op on unbatched inputs as it is
    # an unbatched input is example 0's for every example
    examples = [[per[e][i][0] if batched[i] else per[0][i][0] for i in range(len(floats))] for e in range(B)]
    b = opgraph.GraphBuilder()
    ins, feeds = [], {}
    for i, f in enumerate(batched):
        arr = np.stack([ex[i] for ex in examples]) if f else examples[0][i]
        v = b.constant(arr) if not floats[i] and not f else b.input((arr.dtype, arr.shape))
        if floats[i] or f:
            feeds[v] = arr
        ins.append(v)
    op = get_op(kind)
    attrs = dict(op.normalise_attrs(case["attrs"]))
    outs = op.batch(b, ins, batched, B, attrs)
    if outs is None:
        assert kind in PARTIAL, f"{kind}'s rule declined {case} with batched={batched}"
        return
    got = b.run(feeds, list(outs))
    want = [_run_op(kind, ex, case["attrs"]) for ex in examples]
    assert len(got) == len(want[0])
    for j, g in enumerate(got):
        expect = np.stack([w[j] for w in want])
        assert g.shape == expect.shape, (kind, j, g.shape, expect.shape)
        assert g.dtype == expect.dtype, (kind, j, g.dtype, expect.dtype)
        np.testing.assert_allclose(g, expect, rtol=1e-9, atol=1e-9, err_msg=f"{kind} {case['attrs']} {batched}")


def _patterns(n_float: int) -> list[tuple[bool, ...]]:
    pats = [(True,) * n_float]
    if n_float > 1:
        pats += [tuple(i == k for i in range(n_float)) for k in range(n_float)]
    return pats


@pytest.mark.parametrize("kind", sorted(k for k in _kinds() if k not in NO_BATCH_RULE))
def test_rule_matches_a_loop(kind: str) -> None:
    rng = np.random.default_rng(sum(map(ord, kind)))
    for case in _cases(kind):
        n = len(case["args"])
        for flags in _patterns(n):
            _check_rule(kind, case, flags, rng)


# ---------------------------------------------------------------- control flow
try:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
except ImportError:  # pragma: no cover - jax is an optional extra
    jax = None

needs_jax = pytest.mark.skipif(jax is None, reason="jax is not installed (the loop checks still run)")


def _traced(fn: Any, specs: list[tuple[tuple[int, ...], str]]) -> Any:
    """``fn`` traced on placeholders of ``specs`` (shape, dtype) into a body."""
    import opgraph.numpy as onp
    from opgraph.core.subgraph import Subgraph

    ins = [onp.placeholder(shape, dtype, name=f"a{i}") for i, (shape, dtype) in enumerate(specs)]
    outs = fn(*ins)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    return Subgraph(onp.to_graph(outs, inputs=ins), name=getattr(fn, "__name__", "f"))


def _vmapped(fn: Any, args: list[np.ndarray], batched: tuple[bool, ...]) -> tuple[list[np.ndarray], Any]:
    """``fn`` batched by the rules (through the body batcher) on ``args`` and the loop over examples."""
    from opgraph.autodiff.control import batch_body
    from opgraph.ops.control import body_fn

    specs = [((a.shape[1:] if f else a.shape), a.dtype.name) for a, f in zip(args, batched, strict=True)]
    body = _traced(fn, specs)
    vb = batch_body(body, batched, B)
    got = body_fn(vb)(args)
    one = body_fn(body)
    per = [one([a[e] if f else a for a, f in zip(args, batched, strict=True)]) for e in range(B)]
    want = [np.stack([p[j] for p in per]) for j in range(len(per[0]))]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    return got, vb


def _against_jax(got: list[np.ndarray], jfn: Any, args: list[np.ndarray], batched: tuple[bool, ...]) -> None:
    if jax is None:
        return
    res = jax.vmap(jfn, in_axes=tuple(0 if f else None for f in batched))(*args)
    res = list(res) if isinstance(res, (tuple, list)) else [res]
    for g, r in zip(got, res, strict=True):
        np.testing.assert_allclose(g, np.asarray(r), rtol=1e-12, atol=1e-12)


def _kinds_in(vb: Any) -> set[str]:
    return {op.kind for op in vb.graph.ops()}


RNG = np.random.default_rng(37)


def test_call_batched_and_shared_arguments() -> None:
    def f(x, y):
        return opgraph.call(lambda u, v: (opgraph.numpy.sin(u) * v + 1.0, v * 2.0), x, y)

    args = [RNG.standard_normal((B, 2)), RNG.standard_normal(2)]
    got, vb = _vmapped(f, args, (True, False))
    assert "call" in _kinds_in(vb)
    _against_jax(got, lambda x, y: (jnp.sin(x) * y + 1.0, y * 2.0), args, (True, False))


@pytest.mark.parametrize("pred_batched", [False, True])
def test_cond(pred_batched: bool) -> None:
    def f(p, x, c):
        return opgraph.cond(p > 0, lambda u, v: (u * v, opgraph.numpy.sum(u)),
                            lambda u, v: (opgraph.numpy.sin(u) + v, opgraph.numpy.max(u)), x, c)

    p = np.array([1.0, -1.0, 2.0]) if pred_batched else np.array(-0.5)
    args = [p, RNG.standard_normal((B, 3)), RNG.standard_normal(3)]
    flags = (pred_batched, True, False)
    got, vb = _vmapped(f, args, flags)
    assert ("where" in _kinds_in(vb)) == pred_batched and ("cond" in _kinds_in(vb)) != pred_batched

    def jf(p, x, c):
        return jax.lax.cond(p > 0, lambda u, v: (u * v, jnp.sum(u)), lambda u, v: (jnp.sin(u) + v, jnp.max(u)), x, c)
    _against_jax(got, jf, args, flags)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("w_batched", [False, True])
def test_scan_consts_carries_xs(reverse: bool, w_batched: bool) -> None:
    onp = opgraph.numpy

    def f(w, h0, xs):
        def step(carry, x):
            h, n = carry
            h2 = onp.tanh(w * h + x)
            return (h2, n + 1.0), (h2 * 2.0, n * 3.0)
        (h, n), (ys, ns) = opgraph.scan(step, (h0, onp.asarray(0.0)), xs, reverse=reverse)
        return h, n, ys, ns

    w = RNG.standard_normal((B, 2)) if w_batched else RNG.standard_normal(2)
    args = [w, RNG.standard_normal(2), RNG.standard_normal((B, 4, 2))]
    flags = (w_batched, False, True)  # h0 is shared: the body makes its carry batched (fixed point)
    got, vb = _vmapped(f, args, flags)
    (scan,) = [op for op in vb.graph.ops() if op.kind == "scan"]
    # the counter stays one carry for the batch, broadcast only after the loop
    assert [t.shape for t in scan.attrs["body"].in_types[1:3]] == [(B, 2), ()]

    def jf(w, h0, xs):
        def step(carry, x):
            h, n = carry
            h2 = jnp.tanh(w * h + x)
            return (h2, n + 1.0), (h2 * 2.0, n * 3.0)
        (h, n), (ys, ns) = jax.lax.scan(step, (h0, 0.0), xs, reverse=reverse)
        return h, n, ys, ns
    _against_jax(got, jf, args, flags)


def test_while_loop_shared_predicate() -> None:
    onp = opgraph.numpy

    def f(bound, x, acc0):
        i, acc = opgraph.while_loop(lambda c: c[0] < bound, lambda c: (c[0] + 1, c[1] * 0.5 + x),
                                    (onp.asarray(0), acc0))
        return i, acc

    args = [np.array(4), RNG.standard_normal((B, 3)), RNG.standard_normal(3)]
    flags = (False, True, False)
    got, vb = _vmapped(f, args, flags)
    (loop,) = [op for op in vb.graph.ops() if op.kind == "while_loop"]
    assert loop.attrs["cond_body"].in_types[-2:] == (opgraph.TensorType("int64", ()), opgraph.TensorType(
        "float64", (B, 3)))

    def jf(bound, x, acc0):
        return jax.lax.while_loop(lambda c: c[0] < bound, lambda c: (c[0] + 1, c[1] * 0.5 + x), (0, acc0))
    _against_jax(got, jf, args, flags)


def test_while_loop_batched_predicate() -> None:
    onp = opgraph.numpy

    def f(limit, x):
        return opgraph.while_loop(lambda c: c[1] < limit, lambda c: (c[0] + 1.0, c[1] * 2.0 + 1.0),
                                  (onp.asarray(0.0), x))

    args = [np.array(20.0), np.array([0.5, 3.0, 30.0])]  # 4, 3 and 0 trips
    flags = (False, True)
    got, _ = _vmapped(f, args, flags)
    np.testing.assert_array_equal(got[0], [4.0, 3.0, 0.0])

    def jf(limit, x):
        return jax.lax.while_loop(lambda c: c[1] < limit, lambda c: (c[0] + 1.0, c[1] * 2.0 + 1.0), (0.0, x))
    _against_jax(got, jf, args, flags)
    # a batched limit too (a const of the loop)
    args = [np.array([5.0, 100.0, 1.0]), np.array([0.5, 3.0, 30.0])]
    got, _ = _vmapped(f, args, (True, True))
    _against_jax(got, jf, args, (True, True))


@pytest.mark.parametrize("dynamic", [False, True])
def test_fori_loop(dynamic: bool) -> None:
    def f(n, x):
        return opgraph.fori_loop(0, n if dynamic else 3, lambda i, v: v * 0.5 + i, x)

    args = [np.array([1, 3, 5]) if dynamic else np.array(3), RNG.standard_normal((B, 2))]
    flags = (dynamic, True)
    got, vb = _vmapped(f, args, flags)
    assert ("while_loop" if dynamic else "scan") in _kinds_in(vb)
    _against_jax(got, lambda n, x: jax.lax.fori_loop(0, n if dynamic else 3, lambda i, v: v * 0.5 + i, x),
                 args, flags)


# ---------------------------------------------------------------- per-example gradients, jit
def _fallbacks(graph: Any) -> set[str]:
    """The kinds a batched graph runs once per example (the engine's fallback: a scan over the batch whose body is
    the op alone, named after it), looked for in bodies too."""
    found: set[str] = set()
    for op in graph.ops():
        for body in (v for v in op.attrs.values() if isinstance(v, opgraph.core.subgraph.Subgraph)):
            kinds = [o.kind for o in body.graph.ops() if o.kind != "const"]
            if op.kind == "scan" and len(kinds) == 1 and body.name == f"vmap({kinds[0]})":
                found.add(kinds[0])
            found |= _fallbacks(body.graph)
    return found


def _mlp_loss(onp: Any, params: dict[str, Any], x: Any, y: Any) -> Any:
    h = onp.tanh(onp.matmul(x, params["w1"]) + params["b1"])
    logits = onp.matmul(h, params["w2"])
    return -onp.sum(y * opgraph.nn.log_softmax(logits))


def _rnn_loss(onp: Any, scan: Any, params: dict[str, Any], xs: Any, y: Any) -> Any:
    def step(h, x):
        h2 = onp.tanh(onp.matmul(h, params["w"]) + x * params["u"])
        return h2, onp.sum(h2)
    h, ys = scan(step, onp.zeros(3), xs)
    return onp.sum((h - y) ** 2) + 0.1 * onp.sum(ys)


def _per_example(loss: Any, params: dict[str, np.ndarray], xs: np.ndarray, ys: np.ndarray) -> dict[str, np.ndarray]:
    got = opgraph.vmap(opgraph.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    loop = [opgraph.grad(loss)(params, x, y) for x, y in zip(xs, ys, strict=True)]
    for k, p in params.items():
        assert got[k].shape == (len(xs), *p.shape)
        np.testing.assert_allclose(got[k], np.stack([g[k] for g in loop]), rtol=1e-10, atol=1e-12, err_msg=k)
    return got


def _against_jax_grads(got: dict[str, np.ndarray], jloss: Any, params: dict[str, np.ndarray], xs: np.ndarray,
                       ys: np.ndarray) -> None:
    if jax is None:
        return
    want = jax.vmap(jax.grad(jloss), in_axes=(None, 0, 0))(params, xs, ys)
    for k in params:
        np.testing.assert_allclose(got[k], np.asarray(want[k]), rtol=1e-10, atol=1e-12, err_msg=k)


def test_per_example_gradients_of_an_mlp() -> None:
    onp = opgraph.numpy
    rng = np.random.default_rng(1)
    params = {"w1": rng.standard_normal((4, 5)), "b1": rng.standard_normal(5), "w2": rng.standard_normal((5, 3))}
    xs, ys = rng.standard_normal((6, 4)), np.eye(3)[rng.integers(0, 3, 6)]
    got = _per_example(lambda p, x, y: _mlp_loss(onp, p, x, y), params, xs, ys)

    def jloss(p, x, y):
        return -jnp.sum(y * jax.nn.log_softmax(jnp.matmul(jnp.tanh(jnp.matmul(x, p["w1"]) + p["b1"]), p["w2"])))
    _against_jax_grads(got, jloss, params, xs, ys)
    assert _fallbacks(opgraph.vmap(opgraph.grad(lambda p, x, y: _mlp_loss(onp, p, x, y)), in_axes=(None, 0, 0))
                          .graph(params, xs, ys)) == set()  # every op batched by a rule


def test_per_example_gradients_through_a_scan() -> None:
    onp = opgraph.numpy
    rng = np.random.default_rng(2)
    params = {"w": rng.standard_normal((3, 3)) * 0.5, "u": rng.standard_normal(3)}
    xs, ys = rng.standard_normal((4, 5, 1)), rng.standard_normal((4, 3))
    loss = lambda p, x, y: _rnn_loss(onp, opgraph.scan, p, x, y)  # noqa: E731
    got = _per_example(loss, params, xs, ys)
    _against_jax_grads(got, lambda p, x, y: _rnn_loss(jnp, jax.lax.scan, p, x, y), params, xs, ys)
    graph = opgraph.vmap(opgraph.grad(loss), in_axes=(None, 0, 0)).graph(params, xs, ys)
    assert "scan" in {op.kind for op in graph.ops()} and _fallbacks(graph) == set()


@needs_jax
def test_jit_of_vmap_on_the_jax_engine() -> None:
    onp = opgraph.numpy

    def f(limit, x):
        return opgraph.while_loop(lambda c: c[1] < limit, lambda c: (c[0] + 1.0, onp.sin(c[1]) + c[1] * 2.0),
                                  (onp.asarray(0.0), x))

    args = (np.array([5.0, 100.0, 1.0]), np.array([0.5, 3.0, 30.0]))
    got = opgraph.jit(opgraph.vmap(f), backend="jax")(*args)

    def jf(limit, x):
        return jax.lax.while_loop(lambda c: c[1] < limit, lambda c: (c[0] + 1.0, jnp.sin(c[1]) + c[1] * 2.0),
                                  (0.0, x))
    want = jax.jit(jax.vmap(jf))(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-12)


def test_per_example_gradients_through_a_while_loop() -> None:
    # each example stops after its own number of trips: the reverse pass batches a cond with a batched predicate
    onp = opgraph.numpy

    def loss(p, x, y):
        _, h = opgraph.while_loop(lambda c: c[0] < y, lambda c: (c[0] + 1.0, onp.sin(c[1] * p) + x),
                                  (onp.asarray(0.0), x), max_trip=8)
        return onp.sum(h * h)

    params = np.array([0.7, -1.1])
    xs, ys = np.random.default_rng(3).standard_normal((4, 2)), np.array([0.0, 2.0, 5.0, 3.0])
    got = opgraph.vmap(opgraph.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    want = np.stack([opgraph.grad(loss)(params, x, y) for x, y in zip(xs, ys, strict=True)])
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    if jax is not None:
        def jloss(p, x, y):
            def step(c, _):
                go = c[0] < y
                return (jnp.where(go, c[0] + 1.0, c[0]), jnp.where(go, jnp.sin(c[1] * p) + x, c[1])), None
            (_, h), _ = jax.lax.scan(step, (0.0, x), None, length=8)
            return jnp.sum(h * h)
        np.testing.assert_allclose(got, jax.vmap(jax.grad(jloss), in_axes=(None, 0, 0))(params, xs, ys),
                                   rtol=1e-10, atol=1e-12)


def _while_with_ys() -> tuple[Any, Any]:
    """A while_loop op's bodies with a stacked y: (limit, x, i) -> i < limit; (limit, x, i) -> (x * 2, i + 1, x)."""
    from opgraph.core.subgraph import Subgraph

    cb = opgraph.GraphBuilder()
    lim, _, i = cb.input(("float64", ())), cb.input(("float64", (2,))), cb.input(("float64", ()))
    cb.output(cb.less(i, lim))
    sb = opgraph.GraphBuilder()
    lim2, x2, i2 = sb.input(("float64", ())), sb.input(("float64", (2,))), sb.input(("float64", ()))
    sb.output(sb.multiply(x2, 2.0), sb.add(i2, 1.0), sb.add(x2, lim2))
    return Subgraph(cb.freeze(), name="test"), Subgraph(sb.freeze(), name="step")


@pytest.mark.parametrize("limit_batched", [False, True])
def test_while_loop_stacked_ys(limit_batched: bool) -> None:
    test, step = _while_with_ys()
    limits = np.array([2.0, 3.0, 1.0]) if limit_batched else np.array(3.0)
    xs = RNG.standard_normal((B, 2))
    b = opgraph.GraphBuilder()
    lim = b.input(("float64", limits.shape))
    x = b.input(("float64", (B, 2)))
    i0 = b.constant(np.array(0.0))
    attrs = {"cond_body": test, "body": step, "num_consts": 1, "max_trip": None}
    if limit_batched:  # each example would stack its own number of trips
        with pytest.raises(opgraph.errors.OpTypeError, match="stacked ys"):
            get_op("while_loop").batch(b, [lim, x, i0], (True, True, False), B, attrs)
        return
    outs = get_op("while_loop").batch(b, [lim, x, i0], (False, True, False), B, attrs)
    got = b.run({lim: limits, x: xs}, outs)
    for e in range(B):
        g = opgraph.GraphBuilder()
        le, xe = g.input(("float64", ())), g.input(("float64", (2,)))
        want = g.run({le: limits, xe: xs[e]}, list(g.op("while_loop", le, xe, g.constant(np.array(0.0)), **attrs)))
        for k in range(3):
            np.testing.assert_array_equal(got[k][e], want[k])


def test_nested_vmap_of_a_scan() -> None:
    onp = opgraph.numpy

    def f(w, xs):
        return opgraph.scan(lambda h, x: (onp.tanh(h * w + x), h), onp.zeros(2), xs)

    w, xs = RNG.standard_normal((3, 2)), RNG.standard_normal((4, 3, 5, 2))  # xs: 4 x 3 examples
    got = opgraph.vmap(opgraph.vmap(f, in_axes=(0, 0)), in_axes=(None, 0))(w, xs)
    for i in range(4):
        for j in range(3):
            h, hs = f(w[j], xs[i, j])
            np.testing.assert_allclose(got[0][i, j], h.eval(), rtol=1e-12)
            np.testing.assert_allclose(got[1][i, j], hs.eval(), rtol=1e-12)
    if jax is not None:
        def jf(w, xs):
            return jax.lax.scan(lambda h, x: (jnp.tanh(h * w + x), h), jnp.zeros(2), xs)
        want = jax.vmap(jax.vmap(jf, in_axes=(0, 0)), in_axes=(None, 0))(w, xs)
        for g, r in zip(got, want, strict=True):
            np.testing.assert_allclose(g, np.asarray(r), rtol=1e-12)
