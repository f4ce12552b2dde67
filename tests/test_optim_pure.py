"""Optimisers as pure functions (issue 33): ``init`` / ``update`` / ``apply_updates`` with optax's semantics.

References: optax itself (installed, run on jax with float64 on, as opgraph's jax engine has it) and optax's
formulas written out here in NumPy. The same update traced with ``opgraph.function`` and compiled for every
installed engine gives the eager NumPy results; the graph-building ``apply`` (``training_step``) gives the
pure functions' numbers.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import jax
import numpy as np
import optax
import pytest

import opgraph
from opgraph.backends import available
from opgraph.errors import GraphError
from opgraph.frontend import pytree
from opgraph.optim import (
    SGD,
    Adagrad,
    Adam,
    EmptyState,
    Momentum,
    ScaleByAdamState,
    ScaleByRssState,
    StepRunner,
    TraceState,
    apply_updates,
    training_step,
)

jax.config.update("jax_enable_x64", True)  # as opgraph's jax engine does on import

Pair = namedtuple("Pair", "a b")

OPTIMISERS = {
    "sgd": (SGD(0.1), optax.sgd(0.1)),
    "momentum": (Momentum(0.05, 0.9), optax.sgd(0.05, momentum=0.9)),
    "nesterov": (Momentum(0.05, 0.8, nesterov=True), optax.sgd(0.05, momentum=0.8, nesterov=True)),
    "adagrad": (Adagrad(0.3), optax.adagrad(0.3)),
    "adagrad_eps0": (Adagrad(0.3, initial_accumulator_value=0.0, eps=0.0),
                     optax.adagrad(0.3, initial_accumulator_value=0.0, eps=0.0)),
    "adam": (Adam(0.05), optax.adam(0.05)),
    "adam_eps_root": (Adam(0.05, beta1=0.8, beta2=0.99, eps=1e-6, eps_root=1e-4),
                      optax.adam(0.05, b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-4)),
}


def _tree(kind: str, dtype: Any, rng: np.random.Generator) -> Any:
    def a(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    return {
        "dict": {"w": a(3, 2), "b": a(2)},
        "tuple": (a(4), a()),
        "list": [a(2, 2), a(3)],
        "namedtuple": Pair(a(3), a(1, 2)),
        "nested": {"layers": [Pair(a(2, 3), a(3)), (a(2),)], "none": None, "scale": a()},
    }[kind]


def _grads(params: Any, rng: np.random.Generator, step: int) -> Any:
    leaves, spec = pytree.flatten(params)
    # a zero entry at the first step exercises Adagrad's zero accumulator (eps = 0) and Adam's zero moments
    out = [(rng.standard_normal(p.shape) * (1.0 + step)).astype(p.dtype) for p in leaves]
    if out and out[0].size:
        out[0].reshape(-1)[0] = 0.0
    return pytree.unflatten(spec, out)


def _close(got: Any, want: Any, dtype: Any) -> None:
    g_leaves, g_spec = pytree.flatten(got)
    w_leaves, w_spec = pytree.flatten(want)
    assert g_spec == w_spec
    rtol, atol = (2e-5, 1e-6) if np.dtype(dtype) == np.float32 else (1e-12, 1e-14)
    for g, w in zip(g_leaves, w_leaves, strict=True):
        assert isinstance(g, np.ndarray) and g.dtype == np.asarray(w).dtype, (type(g), g.dtype, np.asarray(w).dtype)
        np.testing.assert_allclose(g, np.asarray(w), rtol=rtol, atol=atol)


# ---------------------------------------------------------------- against optax itself
# every kind of tree in float64; float32 in the nested tree (dicts, lists, tuples, namedtuples and None in one)
@pytest.mark.parametrize("kind,dtype", [(k, np.float64) for k in ("dict", "tuple", "list", "namedtuple", "nested")]
                         + [("nested", np.float32)])
@pytest.mark.parametrize("name", list(OPTIMISERS))
def test_matches_optax(name: str, kind: str, dtype: Any) -> None:
    ours, theirs = OPTIMISERS[name]
    rng = np.random.default_rng(hash((name, kind)) % 2**32)
    params = _tree(kind, dtype, rng)
    p_jax = jax.tree.map(jax.numpy.asarray, params)
    state, s_jax = ours.init(params), theirs.init(p_jax)
    for step in range(4):
        grads = _grads(params, rng, step)
        updates, state = ours.update(grads, state, params)
        u_jax, s_jax = theirs.update(jax.tree.map(jax.numpy.asarray, grads), s_jax, p_jax)
        _close(updates, u_jax, dtype)
        params, p_jax = apply_updates(params, updates), optax.apply_updates(p_jax, u_jax)
        _close(params, p_jax, dtype)
    # the state: optax's fields, values and dtypes (optax's is a chain: (transform state, EmptyState()))
    inner = s_jax[0] if isinstance(s_jax, tuple) and not hasattr(s_jax, "_fields") else s_jax
    if isinstance(ours, SGD):
        assert state == EmptyState()
        return
    assert type(state).__name__ == type(inner).__name__ and state._fields == inner._fields
    for f in state._fields:
        if f == "count":
            assert state.count.dtype == np.int32 and state.count.shape == () and int(state.count) == int(inner.count)
        else:
            _close(getattr(state, f), getattr(inner, f), dtype)


# ---------------------------------------------------------------- against optax's formulas written out in NumPy
def _reference(opt: Any, params: dict[str, np.ndarray], grads_seq: list[dict[str, np.ndarray]]) -> list[Any]:
    """optax's update rules (transform.py / alias.py) in NumPy, float64, one dict of arrays per step."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    s1 = {k: np.full_like(v, getattr(opt, "initial_accumulator_value", 0.0)) for k, v in p.items()}
    s2 = {k: np.zeros_like(v) for k, v in p.items()}
    out = []
    for count, grads in enumerate(grads_seq, start=1):
        for k, g in grads.items():
            g = g.astype(np.float64)
            if isinstance(opt, SGD):
                u = -opt.lr * g
            elif isinstance(opt, Momentum):
                s1[k] = g + opt.mu * s1[k]
                u = -opt.lr * ((g + opt.mu * s1[k]) if opt.nesterov else s1[k])
            elif isinstance(opt, Adagrad):
                s1[k] = g ** 2 + s1[k]
                safe = np.where(s1[k] > 0, s1[k] + opt.eps, 1.0)
                u = -opt.lr * np.where(s1[k] > 0, 1.0 / np.sqrt(safe), 0.0) * g
            else:
                s1[k] = (1 - opt.beta1) * g + opt.beta1 * s1[k]
                s2[k] = (1 - opt.beta2) * g ** 2 + opt.beta2 * s2[k]
                mu_hat = s1[k] / (1 - opt.beta1 ** count)  # bias correction: count incremented first
                nu_hat = s2[k] / (1 - opt.beta2 ** count)
                u = -opt.lr * (mu_hat / (np.sqrt(nu_hat + opt.eps_root) + opt.eps))
            p[k] = p[k] + u
        out.append({k: v.copy() for k, v in p.items()})
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(OPTIMISERS))
def test_matches_optax_formulas_in_numpy(name: str, dtype: Any) -> None:
    opt = OPTIMISERS[name][0]
    rng = np.random.default_rng(7)
    params = {"w": rng.standard_normal((4, 3)).astype(dtype), "b": rng.standard_normal(3).astype(dtype)}
    grads_seq = [_grads(params, rng, k) for k in range(5)]
    state, p = opt.init(params), params
    for grads, want in zip(grads_seq, _reference(opt, params, grads_seq), strict=True):
        updates, state = opt.update(grads, state)
        p = apply_updates(p, updates)
        for k in p:
            assert p[k].dtype == dtype and updates[k].dtype == dtype  # no float64 from the scalars or the count
            np.testing.assert_allclose(p[k], want[k], rtol=1e-5 if dtype == np.float32 else 1e-13,
                                       atol=2e-6 if dtype == np.float32 else 1e-15)


def test_state_types_and_init_values() -> None:
    params = {"w": np.ones((2, 2), np.float32), "skip": None}
    s = Adam().init(params)
    assert isinstance(s, ScaleByAdamState) and s.count.dtype == np.int32 and s.mu["skip"] is None
    assert s.mu["w"].dtype == np.float32 and not s.mu["w"].any() and s.mu["w"] is not s.nu["w"]
    acc = Adagrad(initial_accumulator_value=0.25).init(params)
    assert isinstance(acc, ScaleByRssState) and acc.sum_of_squares["skip"] is None
    np.testing.assert_array_equal(acc.sum_of_squares["w"], np.full((2, 2), 0.25, np.float32))
    assert isinstance(Momentum().init(params), TraceState)
    # the state is a pytree: it flattens to arrays only (jit inputs and outputs)
    leaves, _ = pytree.flatten(s)
    assert [type(x) for x in leaves] == [np.ndarray] * 3


def test_adam_count_saturates_like_optax() -> None:
    opt = Adam(0.1)
    s = opt.init(np.zeros(2))._replace(count=np.array(np.iinfo(np.int32).max, np.int32))
    _, s2 = opt.update(np.ones(2), s)
    assert s2.count.dtype == np.int32 and int(s2.count) == np.iinfo(np.int32).max


def test_apply_updates_keeps_param_dtype_and_none() -> None:
    params = (np.ones(3, np.float32), None, [np.zeros((), np.float64)])
    out = apply_updates(params, (np.full(3, 0.5), None, [np.array(2.0, np.float32)]))
    assert out[1] is None and out[0].dtype == np.float32 and out[2][0].dtype == np.float64
    np.testing.assert_array_equal(out[0], optax.apply_updates(params[0], np.full(3, 0.5)))


def test_structure_mismatch_is_one_graph_error() -> None:
    opt = Adam()
    state = opt.init({"w": np.zeros(2)})
    with pytest.raises(GraphError, match="structure"):
        opt.update({"w": np.zeros(2), "b": np.zeros(1)}, state)
    with pytest.raises(GraphError, match="structure"):
        apply_updates({"w": np.zeros(2)}, [np.zeros(2)])


# ---------------------------------------------------------------- traced and compiled on every engine
def _mixed_params(rng: np.random.Generator) -> Any:
    return {"dense": Pair(rng.standard_normal((3, 2)), rng.standard_normal(2).astype(np.float32)),
            "extra": [rng.standard_normal(4).astype(np.float32)], "off": None}


ENGINES = [b for b in ("numpy", "jax", "torch", "onnxruntime", "dask") if b in available()]


@pytest.mark.parametrize("name", ["sgd", "momentum", "adagrad", "adam"])
def test_traced_update_compiles_on_every_engine(name: str) -> None:
    opt = OPTIMISERS[name][0]
    rng = np.random.default_rng(3)
    params = _mixed_params(rng)
    state = opt.init(params)

    def step(params: Any, state: Any, grads: Any) -> Any:
        updates, state = opt.update(grads, state, params)
        return apply_updates(params, updates), state

    traced = opgraph.function(step)
    grads_seq = [_grads(params, rng, k) for k in range(3)]
    g = traced.graph(params, state, grads_seq[0])
    assert g.num_ops > 0
    programs = {b: opgraph.compile(g, backend=b) for b in ENGINES}
    names = [g.name_of(int(v)) for v in g.inputs]
    p_eager, s_eager = params, state
    carried = {b: (params, state) for b in ENGINES}
    for grads in grads_seq:
        p_eager, s_eager = step(p_eager, s_eager, grads)
        want, spec = pytree.flatten((p_eager, s_eager))
        traced_out, traced_spec = pytree.flatten(traced(*carried["numpy"], grads))
        assert traced_spec == spec
        for b, f in programs.items():
            leaves = pytree.flatten((*carried[b], grads))[0]
            got = [np.asarray(r) for r in f(dict(zip(names, leaves, strict=True)))]
            assert len(got) == len(want)
            for x, w in zip(got, want, strict=True):
                assert x.dtype == w.dtype, (b, x.dtype, w.dtype)
                np.testing.assert_allclose(x, w, rtol=2e-6 if w.dtype == np.float32 else 1e-12, atol=1e-7,
                                           err_msg=b)
            carried[b] = pytree.unflatten(spec, got)
        for x, w in zip(traced_out, want, strict=True):
            np.testing.assert_allclose(x, w, rtol=1e-6, atol=1e-7)
    if isinstance(s_eager, ScaleByAdamState):
        assert int(s_eager.count) == len(grads_seq)


def test_update_of_lazy_arrays_builds_graph_ops() -> None:
    import opgraph.numpy as onp
    from opgraph.frontend.lazy import LazyArray

    w = onp.placeholder((3,), "float32", name="w")
    state = Adam(0.1).init(w)
    assert isinstance(state.count, LazyArray) and state.count.dtype == np.int32
    updates, new = Adam(0.1).update(w * 2.0, state)
    assert isinstance(updates, LazyArray) and updates.dtype == np.float32
    assert new.count.dtype == np.int32 and new.mu.dtype == np.float32 and new.nu.dtype == np.float32
    f = opgraph.function(lambda w: Adam(0.1).update(w * 2.0, Adam(0.1).init(w))[0])
    x = np.ones(3, np.float32)
    g = f.graph(x)
    assert "sqrt" in {g.kind_of(op) for op in range(g.num_ops)}
    eager, _ = Adam(0.1).update(x * 2.0, Adam(0.1).init(x))
    got = f(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, eager, rtol=1e-6)


# ---------------------------------------------------------------- the builder path shares the formulas
@pytest.mark.parametrize("name", list(OPTIMISERS))
def test_training_step_equals_pure_functions(name: str) -> None:
    opt = OPTIMISERS[name][0]
    rng = np.random.default_rng(11)
    a, target = rng.standard_normal((5, 3)), rng.standard_normal(5)
    b = opgraph.GraphBuilder()
    w = b.input(("float64", (3,)), name="w")
    loss = b.mean(b.square(b.subtract(b.matmul(b.const(a), w), b.const(target))))
    run = StepRunner(training_step(b, loss, [w], opt), {"w": np.zeros(3)})
    p, state = {"w": np.zeros(3)}, opt.init({"w": np.zeros(3)})
    for _ in range(6):
        grads = {"w": 2 * a.T @ (a @ p["w"] - target) / len(target)}
        updates, state = opt.update(grads, state)
        p = apply_updates(p, updates)
        run({})
        np.testing.assert_allclose(run.value("w"), p["w"], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name,fused_kind", [("momentum", "sgd_momentum_update"), ("adam", "adam_update_t")])
def test_traced_step_is_fused_like_training_step(monkeypatch: pytest.MonkeyPatch, name: str, fused_kind: str) -> None:
    """A traced ``update`` + ``apply_updates`` optimises into the same fused update op as ``training_step``'s
    graph (``p + -step`` simplifies to ``p - step``), and still computes the eager results."""
    import opgraph.ops.fused as fused
    from opgraph.passes import optimize

    monkeypatch.setattr(fused, "UPDATE_MIN", {k: (0, 0) for k in fused.UPDATE_MIN})  # fused with or without numba
    opt = OPTIMISERS[name][0]

    def step(params: Any, state: Any, grads: Any) -> Any:
        updates, state = opt.update(grads, state, params)
        return apply_updates(params, updates), state

    rng = np.random.default_rng(5)
    params = {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3)}
    state, grads = opt.init(params), _grads(params, rng, 0)
    g = opgraph.function(step).graph(params, state, grads)
    o = optimize(g, level=2)
    assert sum(o.kind_of(op) == fused_kind for op in range(o.num_ops)) == 2
    want = pytree.flatten(step(params, state, grads))[0]
    got = opgraph.compile(o, backend="numpy")(dict(zip([o.name_of(int(v)) for v in o.inputs],
                                                       pytree.flatten((params, state, grads))[0], strict=True)))
    for x, w in zip(got, want, strict=True):
        assert np.asarray(x).dtype == w.dtype
        np.testing.assert_allclose(x, w, rtol=1e-6, atol=1e-7)


def test_jax_arrays_are_updated_in_jax_numpy() -> None:
    opt = Adam(0.1)
    params = {"w": np.arange(3.0, dtype=np.float32), "b": np.ones((), np.float32)}
    grads = {"w": np.array([0.5, -1.0, 2.0], np.float32), "b": np.array(3.0, np.float32)}
    p_np, s_np = params, opt.init(params)
    p_jx = jax.tree.map(jax.numpy.asarray, params)
    s_jx = opt.init(p_jx)
    for _ in range(3):
        u, s_np = opt.update(grads, s_np)
        p_np = apply_updates(p_np, u)
        u, s_jx = opt.update(jax.tree.map(jax.numpy.asarray, grads), s_jx)
        p_jx = apply_updates(p_jx, u)
    for k in params:
        assert isinstance(p_jx[k], jax.Array) and p_jx[k].dtype == np.float32
        np.testing.assert_allclose(np.asarray(p_jx[k]), p_np[k], rtol=1e-6)
    assert isinstance(s_jx.count, jax.Array) and s_jx.count.dtype == np.int32 and int(s_jx.count) == 3
