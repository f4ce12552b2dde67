"""opgraph.vmap and the batching rules: against a Python loop over examples (NumPy) and against jax.vmap.

Every batching rule of the elementwise, reduction, shape and contraction families runs on the op cases of
tests/test_autodiff_rules.py, each float input batched along a random axis (or not batched: None).
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opgraph
import opgraph.numpy as onp
from opgraph.autodiff.batching import BatchingError, batch_sweep, builder_records
from opgraph.core.registry import get_op
from opgraph.frontend.lazy import apply
from opgraph.ops.shape import BATCH_FALLBACK
from test_autodiff_rules import CASES

FAMILIES = ("elementwise", "reduction", "shape", "contraction")
N = 3  # batch size


def _kinds(family: str) -> list[str]:
    return [o.name for o in opgraph.all_ops() if o.family == family]


def test_every_kind_of_the_four_families_has_a_rule_or_a_reason() -> None:
    for family in FAMILIES:
        for name in _kinds(family):
            op = get_op(name)
            assert (op.batch is not None) != (name in BATCH_FALLBACK), (
                f"{name!r}: a batching rule, or a reason in BATCH_FALLBACK, not both")


def _example(spec: Any, rng: np.random.Generator) -> np.ndarray | None:
    if isinstance(spec, tuple) and spec and isinstance(spec[0], str):
        kind, arg = spec
        if kind == "const":
            return None
        lo, hi = {"pos": (0.5, 2.0), "unit": (-0.8, 0.8), "gt1": (1.5, 3.0)}[kind]
        return rng.uniform(lo, hi, (N, *arg))
    return rng.standard_normal((N, *spec))


def _run_case(name: str, case: dict[str, Any], rng: np.random.Generator) -> None:
    specs = case["args"]
    stacks = [_example(s, rng) for s in specs]  # (N, *shape) per batched-able input, None for constants
    floats = [i for i, s in enumerate(stacks) if s is not None]
    axes: list[int | None] = []
    for i in floats:
        r = stacks[i].ndim
        axes.append(None if rng.random() < 0.3 else int(rng.integers(-r, r)))
    if all(a is None for a in axes):
        axes[0] = 0
    consts = {i: s[1] for i, s in enumerate(specs) if stacks[i] is None}
    args = []
    for i, a in zip(floats, axes, strict=True):
        args.append(stacks[i][0] if a is None else np.moveaxis(stacks[i], 0, a))

    def f(*xs: Any) -> Any:
        full = list(consts.get(i) for i in range(len(specs)))
        for i, x in zip(floats, xs, strict=True):
            full[i] = x
        return apply(name, *full, **case["attrs"])

    got = opgraph.vmap(f, in_axes=tuple(axes))(*args)
    got = got if isinstance(got, tuple) else (got,)
    per = []
    for k in range(N):
        ex = [stacks[i][0] if a is None else stacks[i][k] for i, a in zip(floats, axes, strict=True)]
        res = f(*(onp.asarray(e) for e in ex))
        per.append([r.eval() for r in (res if isinstance(res, tuple) else (res,))])
    for j, g in enumerate(got):
        want = np.stack([p[j] for p in per])
        assert g.dtype == want.dtype, (name, case["attrs"], g.dtype, want.dtype)
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{name} {case['attrs']} in_axes={axes}")
    # a kind with a rule is batched by it, not by the per-example loop
    graph = opgraph.vmap(f, in_axes=tuple(axes)).graph(*args)
    assert f"@vmap({name})" not in str(graph), f"{name}: the fallback ran although the kind has a rule"


RULE_CASES = sorted(n for n in CASES if get_op(n).family in FAMILIES and n not in BATCH_FALLBACK)


@pytest.mark.parametrize("name", RULE_CASES)
def test_rule_matches_a_loop(name: str) -> None:
    rng = np.random.default_rng(sum(map(ord, name)) + 37)
    for case in CASES[name]:
        assert case["pre"] is None
        for _ in range(3):  # three draws of in_axes
            _run_case(name, case, rng)


def _elementwise_inputs(op: opgraph.OpDef, rng: np.random.Generator) -> list[np.ndarray] | None:
    n = op.arity or 2
    for make in (lambda s: rng.uniform(0.2, 0.9, s), lambda s: rng.integers(1, 5, s), lambda s: rng.random(s) < .5):
        shapes = [(N, 2, 3)] + [(3,)] * (n - 1)
        arrays = [make(s) for s in shapes]
        try:
            apply(op.name, *(a[0] for a in arrays))
        except opgraph.GraphError:
            continue
        return arrays
    return None


@pytest.mark.parametrize("name", sorted(n for n in _kinds("elementwise") if n not in CASES))
def test_elementwise_rule_without_a_case(name: str) -> None:
    op = get_op(name)
    rng = np.random.default_rng(sum(map(ord, name)))
    arrays = _elementwise_inputs(op, rng)
    assert arrays is not None, f"no dtype fits {name}"
    in_axes = (0,) + (None,) * (len(arrays) - 1)
    got = opgraph.vmap(lambda *xs: apply(name, *xs), in_axes=in_axes)(*arrays)
    want = np.stack([apply(name, arrays[0][k], *arrays[1:]).eval() for k in range(N)])
    np.testing.assert_array_equal(got, want)
    # every operand batched, each along its own axis
    arrays2 = [arrays[0]] + [np.moveaxis(np.stack([a] * N), 0, -1) for a in arrays[1:]]
    got = opgraph.vmap(lambda *xs: apply(name, *xs), in_axes=(0,) + (-1,) * (len(arrays) - 1))(*arrays2)
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- the fallback
def test_fallback_on_a_kind_without_a_rule_matches_a_loop() -> None:
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((4, 3, 3))
    a = xs @ np.swapaxes(xs, -1, -2) + 3 * np.eye(3)  # spd examples
    rhs = rng.standard_normal((3, 2))
    op = get_op("solve")
    assert op.family == "linalg"
    keep, op.batch = op.batch, None  # whatever the linalg helper gives it: the fallback here
    try:
        f = opgraph.vmap(lambda m, r: onp.linalg.solve(m, r) * 2.0, in_axes=(0, None))
        got = f(a, rhs)
        g = f.graph(a, rhs)
    finally:
        op.batch = keep
    want = np.stack([np.linalg.solve(m, rhs) * 2.0 for m in a])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert "scan(" in str(g) and "@vmap(solve)" in str(g)


def test_fallback_when_a_rule_declines() -> None:
    # take with per-example indices: the shape family's rule leaves it to the per-example scan
    x = np.arange(12.0).reshape(3, 4)
    idx = np.array([[0, 3], [1, 1], [2, 0]])
    got = opgraph.vmap(lambda v, i: onp.take(v, i))(x, idx)
    np.testing.assert_array_equal(got, np.stack([np.take(x[k], idx[k]) for k in range(3)]))
    assert "@vmap(take)" in str(opgraph.vmap(lambda v, i: onp.take(v, i)).graph(x, idx))
    # shared x, per-example indices: the rule (no loop)
    idx = np.array([[0, 2], [1, 1], [2, -1]])
    for axis in (None, 0, 1, -1):
        f = opgraph.vmap(lambda v, i, axis=axis: onp.take(v, i, axis=axis), in_axes=(None, 0))
        got = f(x, idx)
        np.testing.assert_array_equal(got, np.stack([np.take(x, idx[k], axis=axis) for k in range(3)]))
        assert "scan" not in str(f.graph(x, idx))


def test_rule_that_returns_a_wrong_shape_is_named() -> None:
    op = get_op("exp")
    keep = op.batch
    op.batch = lambda b, ins, batched, size, attrs: [b.op("sum", ins[0], axis=0)]
    try:
        with pytest.raises(BatchingError, match="batching rule of 'exp'"):
            opgraph.vmap(onp.exp)(np.ones((3, 2)))
    finally:
        op.batch = keep


def test_builder_level_sweep() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    w = b.input(("float64", (3, 2)), name="w")
    y = b.tanh(b.matmul(x, w))
    recs = builder_records(b, b.num_ops)
    xs = b.input(("float64", (5, 3)), name="xs")
    ys = batch_sweep(b, recs, lambda v: v.id, {x.id: xs}, 5)[y.id]
    rng = np.random.default_rng(1)
    data, wv = rng.standard_normal((5, 3)), rng.standard_normal((3, 2))
    (got,) = b.run({xs: data, w: wv, x: data[0]}, [ys])
    np.testing.assert_allclose(got, np.tanh(data @ wv), rtol=1e-13)


# ---------------------------------------------------------------- vmap's API
def test_pytrees_of_axes_none_and_negative_axes() -> None:
    rng = np.random.default_rng(2)
    params = {"w": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)}
    xs = rng.standard_normal((2, 4, 5))  # batch along the last axis

    def f(p: dict[str, Any], x: Any) -> Any:
        h = onp.tanh(x @ p["w"] + p["b"])
        return {"h": h, "s": onp.sum(h), "b": p["b"]}

    out = opgraph.vmap(f, in_axes=({"w": None, "b": None}, -1), out_axes={"h": 1, "s": 0, "b": None})(params, xs)
    for k in range(5):
        ref = f({kk: onp.asarray(v) for kk, v in params.items()}, onp.asarray(xs[..., k]))
        np.testing.assert_allclose(out["h"][:, k], ref["h"].eval(), rtol=1e-13)
        np.testing.assert_allclose(out["s"][k], ref["s"].eval(), rtol=1e-13)
    np.testing.assert_array_equal(out["b"], params["b"])
    # a prefix: one entry for the whole dict, a negative out_axes
    out2 = opgraph.vmap(lambda p, x: p["w"] * x, in_axes=({"w": 1}, None), out_axes=-1)(
        {"w": rng.standard_normal((2, 6))}, 3.0)
    assert out2.shape == (2, 6)


def test_keyword_arguments_are_mapped_and_defaults_stay() -> None:
    def f(x: Any, scale: float = 2.0, *, shift: Any) -> Any:
        return x * scale + shift

    xs, sh = np.arange(6.0).reshape(3, 2), np.array([10.0, 20.0, 30.0])
    got = opgraph.vmap(f, in_axes=(0,))(xs, shift=sh)
    np.testing.assert_array_equal(got, xs * 2.0 + sh[:, None])


def test_shared_work_is_done_once_and_dtypes_stay() -> None:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    xs = rng.standard_normal((5, 4)).astype(np.float32)
    f = opgraph.vmap(lambda x, w: onp.exp(x @ (w @ w.T)) * 0.5, in_axes=(0, None))
    got = f(xs, w)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.exp(xs @ (w @ w.T)) * 0.5, rtol=1e-5)
    text = str(f.graph(xs, w))
    assert "f32[4,4] = matmul" in text and "f32[5,4,4]" not in text  # w @ w.T once, not per example


def test_traced_once_per_signature_and_lists_of_axes() -> None:
    f = opgraph.vmap(lambda x: [x, x * 2], out_axes=[0, 1])
    a, b2 = f(np.ones((3, 2)))
    f(np.zeros((3, 2)))
    assert f._traced.cache_size == 1
    assert a.shape == (3, 2) and b2.shape == (2, 3)
    f(np.zeros((4, 2)))
    assert f._traced.cache_size == 2
    with pytest.raises(ValueError, match="out_axes specification must be a tree prefix"):
        opgraph.vmap(lambda x: [x, x * 2], out_axes=(0, 1))(np.ones((3, 2)))


def test_unbatched_output_is_broadcast_and_axis_size() -> None:
    out = opgraph.vmap(lambda x, c: (x * 2, c + 1), in_axes=(0, None))(np.arange(3.0), np.ones(2))
    np.testing.assert_array_equal(out[1], np.full((3, 2), 2.0))
    out = opgraph.vmap(lambda c: c * 2, in_axes=None, axis_size=4, out_axes=1)(np.ones(2))
    np.testing.assert_array_equal(out, np.full((2, 4), 2.0))


def test_nested_vmap_is_an_outer_product() -> None:
    x, y = np.arange(3.0), np.arange(4.0) + 1
    f = opgraph.vmap(opgraph.vmap(lambda a, b: a * b + onp.sin(a), in_axes=(None, 0)), in_axes=(0, None))
    np.testing.assert_allclose(f(x, y), x[:, None] * y[None, :] + np.sin(x)[:, None], rtol=1e-14)


def test_per_example_gradients_match_a_loop_of_grads() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 2))
    xs, ys = rng.standard_normal((6, 4)), rng.standard_normal((6, 2))

    def loss(w: Any, x: Any, y: Any) -> Any:
        return onp.sum((onp.tanh(x @ w) - y) ** 2)

    per = opgraph.vmap(opgraph.grad(loss), in_axes=(None, 0, 0))(w, xs, ys)
    g = opgraph.grad(loss)
    want = np.stack([g(w, xs[k], ys[k]) for k in range(6)])
    np.testing.assert_allclose(per, want, rtol=1e-12)
    # and the other way round: the gradient of a batched function
    total = opgraph.grad(lambda w: onp.sum(opgraph.vmap(loss, in_axes=(None, 0, 0))(w, xs, ys)))(w)
    np.testing.assert_allclose(total, want.sum(0), rtol=1e-12)


def test_composes_with_jacobian_and_hessian() -> None:
    rng = np.random.default_rng(6)
    xs = rng.standard_normal((4, 3))

    def f(x: Any) -> Any:
        return onp.sin(x) * onp.sum(x ** 2)

    jac = opgraph.vmap(opgraph.jacobian(f))(xs)
    np.testing.assert_allclose(jac, np.stack([opgraph.jacobian(f)(x) for x in xs]), rtol=1e-12)
    hes = opgraph.vmap(opgraph.hessian(lambda x: onp.sum(f(x))))(xs)
    np.testing.assert_allclose(hes, np.stack([opgraph.hessian(lambda x: onp.sum(f(x)))(x) for x in xs]),
                               rtol=1e-12)
    # the Jacobian of a batched function is block diagonal over the examples
    jb = opgraph.jacobian(opgraph.vmap(f))(xs)
    for k in range(4):
        np.testing.assert_allclose(jb[k, :, k, :], jac[k], rtol=1e-12)
        np.testing.assert_array_equal(jb[k, :, (k + 1) % 4, :], 0.0)


def test_composes_with_forward_mode() -> None:
    rng = np.random.default_rng(8)
    xs, vs = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))

    def f(x: Any) -> Any:
        return onp.sin(x) * onp.sum(x ** 2)

    y, t = opgraph.vmap(lambda x, v: opgraph.jvp(f, (x,), (v,)))(xs, vs)
    loop = [opgraph.jvp(f, (x,), (v,)) for x, v in zip(xs, vs, strict=True)]
    np.testing.assert_allclose(y, np.stack([p[0] for p in loop]), rtol=1e-13)
    np.testing.assert_allclose(t, np.stack([p[1] for p in loop]), rtol=1e-13)
    _, t2 = opgraph.jvp(opgraph.vmap(f), (xs,), (vs,))
    np.testing.assert_allclose(t2, t, rtol=1e-13)
    np.testing.assert_allclose(opgraph.vmap(opgraph.jacfwd(f))(xs), np.stack([opgraph.jacfwd(f)(x) for x in xs]),
                               rtol=1e-13)

    def loss(w: Any) -> Any:
        return onp.sum(onp.exp(-w) * w)

    _, hv = opgraph.vmap(lambda w, v: opgraph.hvp(loss, (w,), (v,)))(xs, vs)
    np.testing.assert_allclose(hv, np.stack([opgraph.hvp(loss, (x,), (v,))[1] for x, v in zip(xs, vs, strict=True)]),
                               rtol=1e-13)


def test_control_flow_batches_through_the_fallback() -> None:
    # scan has no rule in this branch's families: its op runs once per example, the result is still right
    def f(x: Any) -> Any:
        c, ys = opgraph.scan(lambda c, x: (c + x, c * x), onp.zeros(()), x)
        return c, ys

    xs = np.arange(12.0).reshape(3, 4)
    c, ys = opgraph.vmap(f)(xs)
    for k in range(3):
        want = np.cumsum(np.concatenate([[0.0], xs[k]]))
        np.testing.assert_allclose(c[k], want[-1])
        np.testing.assert_allclose(ys[k], want[:-1] * xs[k])


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_jit_of_vmap(backend: str) -> None:
    rng = np.random.default_rng(4)
    w, xs = rng.standard_normal((3, 2)), rng.standard_normal((5, 3))
    f = opgraph.jit(opgraph.vmap(lambda w, x: onp.sum(onp.exp(x @ w)), in_axes=(None, 0)), backend=backend)
    np.testing.assert_allclose(np.asarray(f(w, xs)), np.exp(xs @ w).sum(1), rtol=1e-12)


def test_batched_graph_saves_and_runs(tmp_path: Any) -> None:
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((4, 3))
    f = opgraph.vmap(lambda x: onp.cumsum(onp.flip(x)) @ onp.ones((3, 2)))
    g = f.graph(xs)
    path = os.fspath(tmp_path / "batched.cg")
    opgraph.save(g, path)
    back = opgraph.load(path)
    (got,) = back.run({back.inputs[0]: xs})
    np.testing.assert_allclose(got, np.cumsum(xs[:, ::-1], axis=1) @ np.ones((3, 2)), rtol=1e-13)


def test_errors() -> None:
    with pytest.raises(ValueError, match=r"(?s)inconsistent sizes.*size 3: axis 0 of argument a.*size 4: axis 0 of "
                                         r"argument b"):
        opgraph.vmap(lambda a, b: a + b)(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="at least one non-None value in in_axes or axis_size must be specified"):
        opgraph.vmap(lambda a: a, in_axes=None)(np.ones(3))
    with pytest.raises(ValueError, match="rank should be at least 2, but is only 1"):
        opgraph.vmap(lambda a: a, in_axes=1)(np.ones(3))
    with pytest.raises(ValueError, match=re.escape("got len(in_axes)=2, len(args)=1")):
        opgraph.vmap(lambda a: a, in_axes=(0, 0))(np.ones(3))
    with pytest.raises(ValueError, match="tree prefix"):
        opgraph.vmap(lambda p: p["w"], in_axes=({"v": 0},))({"w": np.ones(3)})
    with pytest.raises(ValueError, match=r"got axis spec None but output was batched on axis 0 \(output\)"):
        opgraph.vmap(lambda a: a, out_axes=None)(np.ones(3))
    with pytest.raises(TypeError, match="in_axes must be an int, None"):
        opgraph.vmap(lambda a: a, in_axes="0")
    with pytest.raises(ValueError, match=r"(?s)the `axis_size` argument was 5;.*one axis had size 3: axis 0 of "
                                         r"argument a"):
        opgraph.vmap(lambda a: a, axis_size=5)(np.ones(3))
    with pytest.raises(ValueError, match=r"(?s)most axes \(2 of them\) had size 4, e.g. axis 0 of argument b of "
                                         r"type float64\[4\];\n  \* one axis had size 3: axis 0 of argument a"):
        opgraph.vmap(lambda a, b, c: a + b + c)(np.ones(3), np.ones(4), np.ones(4))


# ---------------------------------------------------------------- random compositions, against a loop and jax.vmap
jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

# (name, function of (np-like namespace, x of shape (3, 4), w of shape (4, 4))) -> shape (3, 4)
STEPS = [
    ("sin", lambda m, x, w: m.sin(x)),
    ("tanh*2", lambda m, x, w: m.tanh(x) * 2.0),
    ("matmul", lambda m, x, w: x @ w),
    ("rmatmul", lambda m, x, w: m.matmul(x[0], w) + x),
    ("sum", lambda m, x, w: x + m.sum(x, axis=1, keepdims=True)),
    ("max", lambda m, x, w: x - m.max(x, axis=0)),
    ("mean_all", lambda m, x, w: x * m.mean(x)),
    ("transpose", lambda m, x, w: m.reshape(m.transpose(x), (3, 4))),
    ("flip", lambda m, x, w: m.flip(x, axis=1)),
    ("where", lambda m, x, w: m.where(x > 0, x, w[:3] * 0.5)),
    ("concat", lambda m, x, w: m.concatenate([x[:, :2], x[:, 2:] * 3.0], axis=1)),
    ("stack", lambda m, x, w: m.sum(m.stack([x, w[1:]], axis=-1), axis=-1)),
    ("einsum", lambda m, x, w: m.einsum("ij,jk->ik", x, w)),
    ("tensordot", lambda m, x, w: m.tensordot(x, w, axes=1)),
    ("cumsum", lambda m, x, w: m.cumsum(x, axis=1) * 0.1),
    ("getitem", lambda m, x, w: x[::-1, :] + x[1:2, :]),
    ("clip", lambda m, x, w: m.clip(x, -0.5, 0.5)),
    ("logsumexp", lambda m, x, w: x - m.expand_dims(m.log(m.sum(m.exp(x), axis=1)), 1)),
    ("pad", lambda m, x, w: m.pad(x, ((0, 0), (1, 0)))[:, :4]),
    ("roll", lambda m, x, w: m.roll(x, 1, axis=1)),
    ("outer", lambda m, x, w: m.reshape(m.outer(x[0], x[1, :3]), (3, 4))),
    ("var", lambda m, x, w: x * m.var(x, axis=0) + m.std(x)),
    ("moveaxis", lambda m, x, w: m.reshape(m.moveaxis(m.reshape(x, (3, 2, 2)), 0, -1), (3, 4))),
    ("tile", lambda m, x, w: m.tile(x[:, :2], (1, 2))),
    ("repeat", lambda m, x, w: m.repeat(x[:, ::2], 2, axis=1)),
    ("squeeze", lambda m, x, w: m.squeeze(m.expand_dims(x, 1), axis=1) * 0.5),
    ("vecdot", lambda m, x, w: x * m.expand_dims(m.vecdot(x, w[:3]), -1) * 0.1),
    ("prod", lambda m, x, w: x * m.prod(m.tanh(x), axis=1, keepdims=True)),
]


def _compose(m: Any, names: list[int]) -> Any:
    def f(x: Any, w: Any) -> Any:
        for k in names:
            x = STEPS[k][1](m, x, w)
        return x

    return f


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, len(STEPS) - 1), min_size=1, max_size=4), st.sampled_from([0, 1, -1, None]),
       st.sampled_from([0, 1, -1, None]), st.integers(0, 2 ** 31 - 1))
def test_random_compositions(steps: list[int], ax: int | None, aw: int | None, seed: int) -> None:
    if ax is None and aw is None:
        ax = 0
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 4))
    w = rng.standard_normal((4, 4)) * 0.5
    xs = x if ax is None else np.moveaxis(np.stack([x * (1 + 0.1 * k) for k in range(N)]), 0, ax)
    ws = w if aw is None else np.moveaxis(np.stack([w - 0.05 * k for k in range(N)]), 0, aw)
    got = opgraph.vmap(_compose(onp, steps), in_axes=(ax, aw), out_axes=-1)(xs, ws)
    want_jax = np.asarray(jax.vmap(_compose(jnp, steps), in_axes=(ax, aw), out_axes=-1)(xs, ws))
    loop = np.stack([
        _compose(np, steps)(x if ax is None else np.take(xs, k, axis=ax),
                            w if aw is None else np.take(ws, k, axis=aw)) for k in range(N)], axis=-1)
    np.testing.assert_allclose(got, loop, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got, want_jax, rtol=1e-10, atol=1e-12)
