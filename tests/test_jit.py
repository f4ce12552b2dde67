"""opgraph.jit: one signature, one trace and one compile, on every installed engine, against NumPy and jax.

References: NumPy for values computed from the same data, and ``jax.jit(jax.value_and_grad(f))`` (float64) for
gradients, each written independently of opgraph.
"""

from __future__ import annotations

import collections
import importlib.util

import numpy as np
import pytest

import opgraph
import opgraph.numpy as onp
from opgraph.backends.arrays import describe
from opgraph.errors import FeedError, GraphError

ENGINES = [pytest.param(n, marks=pytest.mark.skipif(importlib.util.find_spec(n) is None, reason=f"{n} not installed"))
           for n in ("numpy", "jax", "torch", "onnxruntime", "dask")]
each_engine = pytest.mark.parametrize("backend", ENGINES)

Point = collections.namedtuple("Point", "x y")


@pytest.fixture(scope="module")
def jnp():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return jax.numpy


def _mlp_loss(p, x, y, xp=onp):
    h = xp.tanh(x @ p["w1"] + p["b1"])
    return xp.mean((h @ p["w2"] - y) ** 2)


def _params(rng):
    return {"w1": rng.normal(size=(4, 6)), "b1": rng.normal(size=6), "w2": rng.normal(size=(6, 2))}


# ---------------------------------------------------------------- pytrees in and out, on every engine
@each_engine
def test_pytrees_of_each_kind_in_and_out(backend, rng):
    def fun(d, t, lst, pt, nothing, nested):
        assert nothing is None
        return {"sum": d["a"] + t[0] * lst[1], "pt": Point(pt.x * 2.0, onp.exp(pt.y)),
                "list": [nested["k"][0][1] - 1.0, "tag"], "none": None, "tuple": (t[1],)}

    f = opgraph.jit(fun, backend=backend)
    a, b, c, d, e, g = (rng.normal(size=3) for _ in range(6))
    args = ({"a": a}, (b, c), [d, e], Point(g, a), None, {"k": [(b, c)]})
    out = f(*args)
    assert set(out) == {"sum", "pt", "list", "none", "tuple"}
    np.testing.assert_allclose(out["sum"], a + b * e)
    assert type(out["pt"]) is Point
    np.testing.assert_allclose(out["pt"].x, g * 2.0)
    np.testing.assert_allclose(out["pt"].y, np.exp(a))
    assert isinstance(out["list"], list) and out["list"][1] == "tag"
    np.testing.assert_allclose(out["list"][0], c - 1.0)
    assert out["none"] is None
    assert isinstance(out["tuple"], tuple)
    np.testing.assert_allclose(out["tuple"][0], c)
    assert f.cache_size == 1
    f(*args)
    assert f.cache_size == 1


@each_engine
def test_value_and_grad_matches_jax(backend, rng, jnp):
    import jax

    p, x, y = _params(rng), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    f = opgraph.jit(opgraph.value_and_grad(_mlp_loss), backend=backend)
    ref = jax.jit(jax.value_and_grad(lambda p, x, y: _mlp_loss(p, x, y, jnp)))
    (v, g), (rv, rg) = f(p, x, y), ref(p, x, y)
    np.testing.assert_allclose(v, rv, rtol=1e-12)
    assert set(g) == set(rg)
    for k in g:
        np.testing.assert_allclose(g[k], np.asarray(rg[k]), rtol=1e-10, atol=1e-12)
    p2 = {k: w + 0.5 for k, w in p.items()}  # same signature: no new trace, new values
    v2, _ = f(p2, x, y)
    np.testing.assert_allclose(v2, ref(p2, x, y)[0], rtol=1e-12)
    assert f.cache_size == 1


@each_engine
def test_keyword_arguments_and_defaults(backend, rng):
    f = opgraph.jit(lambda x, scale=2.0, *, shift: x * scale + shift, backend=backend)
    x, s = rng.normal(size=3), rng.normal(size=3)
    np.testing.assert_allclose(f(x, shift=s), x * 2.0 + s)
    np.testing.assert_allclose(f(x, 3.0, shift=s), x * 3.0 + s)
    np.testing.assert_allclose(f(shift=s, x=x, scale=4.0), x * 4.0 + s)
    # defaults are Python's, never traced (as in JAX); a scale given is a weak scalar: fed, not traced
    assert f.cache_size == 2


# ---------------------------------------------------------------- signatures: static args, shapes, scalars
@each_engine
def test_static_argnums_retrace_on_new_values_only(backend, rng):
    traces = []

    def fun(x, mode, n):
        traces.append((mode, n))
        return x * n if mode == "mul" else x + n

    f = opgraph.jit(fun, backend=backend, static_argnums=(1,), static_argnames="n")
    x = rng.normal(size=4)
    np.testing.assert_allclose(f(x, "mul", n=3), x * 3)
    np.testing.assert_allclose(f(x, "mul", n=3), x * 3)
    assert f.cache_size == 1 and len(traces) == 1
    np.testing.assert_allclose(f(x, "add", n=3), x + 3)
    np.testing.assert_allclose(f(x, "mul", n=5), x * 5)
    assert f.cache_size == 3 and len(traces) == 3
    np.testing.assert_allclose(f(x, "add", n=3), x + 3)
    assert f.cache_size == 3 and len(traces) == 3


@each_engine
def test_a_new_shape_or_dtype_is_one_more_entry(backend, rng):
    f = opgraph.jit(lambda xs: onp.sum(onp.stack(xs) ** 2), backend=backend)
    xs = [rng.normal(size=3) for _ in range(2)]
    np.testing.assert_allclose(f(xs), np.sum(np.stack(xs) ** 2))
    xs3 = [*xs, rng.normal(size=3)]  # one more entry in the list: a new structure
    np.testing.assert_allclose(f(xs3), np.sum(np.stack(xs3) ** 2))
    assert f.cache_size == 2
    xs5 = [rng.normal(size=5) for _ in range(2)]  # a new shape
    np.testing.assert_allclose(f(xs5), np.sum(np.stack(xs5) ** 2))
    assert f.cache_size == 3
    f([x.astype(np.float32) for x in xs])  # a new dtype
    assert f.cache_size == 4
    f(xs)
    assert f.cache_size == 4


@each_engine
def test_python_scalars_are_weakly_typed_and_fed(backend, rng, jnp):
    import jax

    f = opgraph.jit(lambda x, lr, k: x * lr + k, backend=backend)
    x = rng.normal(size=3).astype(np.float32)
    for lr, k in ((0.5, 2), (0.25, 3), (1e-3, -1)):
        got = f(x, lr, k)
        ref = jax.jit(lambda x, lr, k: x * lr + k)(x, lr, k)
        assert got.dtype == np.float32 == ref.dtype  # the scalars take the array's dtype, as in JAX
        np.testing.assert_allclose(got, np.asarray(ref), rtol=1e-6)
    assert f.cache_size == 1  # new values, no new trace
    g = opgraph.jit(lambda lr, n: lr * n, backend=backend)
    assert g(0.5, 3) == 1.5 and g(0.5, 3).dtype == np.float64  # only weak operands: float64 (x64)
    assert g(True, 2) == 2
    h = opgraph.jit(lambda a, k: a + k, backend=backend)
    assert h(np.ones(2, np.int8), 3).dtype == np.int8 == jax.jit(lambda a, k: a + k)(np.ones(2, np.int8), 3).dtype
    np.testing.assert_allclose(f(x, np.float32(0.5), 1), x * np.float32(0.5) + 1)
    assert f.cache_size == 2  # a NumPy scalar is a (strongly typed) 0-d array, as in JAX


# ---------------------------------------------------------------- donation
def test_donation_on_jax_hands_the_buffers_to_xla(rng):
    jax = pytest.importorskip("jax")

    f = opgraph.jit(lambda state, g: {"w": state["w"] - 0.1 * g, "n": state["n"] + 1.0}, backend="jax",
                    donate_argnums=0)
    state, g = {"w": rng.normal(size=8), "n": np.zeros(())}, rng.normal(size=8)
    out = f(state, g)
    np.testing.assert_allclose(out["w"], state["w"] - 0.1 * g)
    assert float(out["n"]) == 1.0
    text = f.explain(state, g)
    assert "donated: state.n, state.w (buffers handed to the engine for reuse)" in text
    # the caller's jax arrays reach XLA as they are: the donated ones are deleted after the call, as jax.jit with
    # donate_argnums does; the undonated one is kept
    jstate, jg = {k: jax.numpy.asarray(v) for k, v in state.items()}, jax.numpy.asarray(g)
    out = f(jstate, jg)
    assert isinstance(out["w"], jax.Array)  # jax arrays in, jax arrays out
    np.testing.assert_allclose(np.asarray(out["w"]), state["w"] - 0.1 * g)
    assert (jstate["w"].is_deleted(), jstate["n"].is_deleted(), jg.is_deleted()) == (True, True, False)


def test_donation_on_numpy_writes_results_over_the_donated_arrays(rng):
    from opgraph.optim import Adam, apply_updates

    opt = Adam(lr=0.01)

    def step(params, state, g):
        updates, state = opt.update(g, state, params)
        return apply_updates(params, updates), state

    donating = opgraph.jit(step, donate_argnums=(0, 1))
    plain = opgraph.jit(step)
    params = {"w": rng.normal(size=(4, 3)), "b": rng.normal(size=3)}
    grads = {"w": rng.normal(size=(4, 3)), "b": rng.normal(size=3)}
    want_p, want_s = plain(params, opt.init(params), grads)
    p, s = {k: v.copy() for k, v in params.items()}, opt.init(params)
    given = [p["w"], s.mu["w"], s.nu["w"]]
    got_p, got_s = donating(p, s, grads)
    for k in params:  # the same numbers as without donation (the reference: the same step, fresh buffers)
        np.testing.assert_array_equal(got_p[k], want_p[k])
        np.testing.assert_array_equal(got_s.mu[k], want_s.mu[k])
        np.testing.assert_array_equal(got_s.nu[k], want_s.nu[k])
    # the donated moments' arrays now hold the new moments (no new buffers); p' takes the gradient's buffer
    # in the memory plan, so the parameter's array is not reused
    assert got_s.mu["w"] is given[1] and got_s.nu["w"] is given[2]
    assert "results written over" in donating.explain(params, opt.init(params), grads)
    # arrays that cannot be donated safely get fresh buffers: the same array twice, or a view of another one
    shared = np.zeros((4, 3))
    state = opt.init(params)._replace(mu={"w": shared, "b": np.zeros(3)}, nu={"w": shared, "b": np.zeros(3)})
    _, out_s = donating(params, state, grads)
    assert out_s.mu["w"] is not shared and out_s.nu["w"] is not shared
    np.testing.assert_array_equal(out_s.mu["w"], want_s.mu["w"])
    np.testing.assert_array_equal(shared, np.zeros((4, 3)))
    base = np.zeros((2, 4, 3))
    state = opt.init(params)._replace(mu={"w": base[0], "b": np.zeros(3)})
    _, out_s = donating(params, state, grads)
    assert not np.shares_memory(out_s.mu["w"], base)
    np.testing.assert_array_equal(base, 0.0)


@pytest.mark.parametrize("backend", [p for p in ENGINES if p.values[0] not in ("jax", "numpy")])
def test_donation_elsewhere_is_accepted_and_reuses_nothing(backend, rng):
    f = opgraph.jit(lambda w, g: w - 0.1 * g, backend=backend, donate_argnums=(0,))
    w, g = rng.normal(size=5), rng.normal(size=5)
    keep = w.copy()
    np.testing.assert_allclose(f(w, g), keep - 0.1 * g)
    np.testing.assert_array_equal(w, keep)  # the caller's array is untouched
    assert f"donated: w (accepted; the {backend} engine reuses no input buffer)" in f.explain(w, g)


# ---------------------------------------------------------------- composition
@each_engine
def test_jacobian_hessian_grad_match_jax(backend, rng, jnp):
    import jax

    def fun(v, xp=onp):
        return xp.sum(xp.sin(v) * v[::-1]) + xp.prod(v[:2])

    v = rng.normal(size=4)
    np.testing.assert_allclose(opgraph.jit(opgraph.grad(fun), backend=backend)(v),
                               jax.jit(jax.grad(lambda v: fun(v, jnp)))(v), rtol=1e-12)
    np.testing.assert_allclose(opgraph.jit(opgraph.hessian(fun), backend=backend)(v),
                               jax.jit(jax.hessian(lambda v: fun(v, jnp)))(v), rtol=1e-10, atol=1e-12)
    jac = opgraph.jit(opgraph.jacobian(lambda v: onp.tanh(v) * v[0]), backend=backend)
    np.testing.assert_allclose(jac(v), jax.jacobian(lambda v: jnp.tanh(v) * v[0])(v), rtol=1e-12)


@each_engine
def test_control_flow_inside(backend, rng):
    def fun(x, n):
        y = opgraph.cond(onp.sum(x) > 0, lambda a: a * 2.0, lambda a: -a, x)
        z = opgraph.fori_loop(0, 3, lambda i, c: c + i, y)
        total, ys = opgraph.scan(lambda c, r: (c + r, c * r), onp.zeros(3), onp.stack([x, y]))
        w = opgraph.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1.0, c[1] * 1.5), (0.0, z))
        return z, total, ys, w[1]

    def ref(x, n):
        y = x * 2.0 if x.sum() > 0 else -x
        z = y + 0.0 + 1.0 + 2.0
        c, ys = np.zeros(3), []
        for r in (x, y):
            ys.append(c * r)
            c = c + r
        w, k = z, 0.0
        while k < n:
            k, w = k + 1.0, w * 1.5
        return z, c, np.stack(ys), w

    f = opgraph.jit(fun, backend=backend)
    for x, n in ((rng.normal(size=3) + 1.0, 3.0), (-np.abs(rng.normal(size=3)), 1.0)):
        for got, want in zip(f(x, n), ref(x, n), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12)
    assert f.cache_size == 1


def test_jit_inside_jit_inlines_and_grad_of_jit(rng, jnp):
    import jax

    inner = opgraph.jit(lambda x: onp.tanh(x) * 3.0)
    outer = opgraph.jit(lambda x, y: onp.sum(inner(x) * y), backend="jax")
    x, y = rng.normal(size=4), rng.normal(size=4)
    np.testing.assert_allclose(outer(x, y), np.sum(np.tanh(x) * 3.0 * y), rtol=1e-12)
    assert inner.cache_size == 0  # called with traced values: inlined, nothing compiled for it
    kinds = {outer.graph(x, y).kind_of(op) for op in range(outer.graph(x, y).num_ops)}
    assert "tanh" in kinds and "call" not in kinds
    g = opgraph.jit(opgraph.grad(outer), backend="numpy")
    np.testing.assert_allclose(g(x, y), jax.grad(lambda x, y: jnp.sum(jnp.tanh(x) * 3.0 * y))(x, y), rtol=1e-12)
    np.testing.assert_allclose(opgraph.grad(outer)(x, y), g(x, y), rtol=1e-12)  # grad of a jitted function


# ---------------------------------------------------------------- array types
@pytest.mark.parametrize("kind", ["jax", "torch"])
@each_engine
def test_jax_and_torch_array_leaves(backend, kind, rng):
    pytest.importorskip(kind)
    if kind == "jax":
        import jax.numpy as jnp

        conv = jnp.asarray
    else:
        import torch

        conv = torch.from_numpy
    a, b = rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)
    f = opgraph.jit(lambda p: {"y": p["a"] @ p["b"] + 1.0}, backend=backend)
    got = f({"a": conv(a), "b": conv(b)})
    np.testing.assert_allclose(np.asarray(got["y"]), a @ b + 1.0, rtol=1e-6)
    assert describe(got["y"]).kind == kind  # results in the callers' array kind, whatever engine ran them
    assert describe(got["y"]).dtype == np.float32
    assert isinstance(f({"a": a, "b": b})["y"], np.ndarray)  # NumPy in, NumPy out
    assert isinstance(f({"a": conv(a), "b": b})["y"], np.ndarray)  # mixed kinds: NumPy
    f({"a": conv(a), "b": conv(b)})
    assert f.cache_size == 1  # dtype and shape read without copying, not the kind: one signature for all calls


# ---------------------------------------------------------------- wrong calls: one opgraph error each
@pytest.mark.parametrize("call, words", [
    (lambda f: f(np.ones(2)), "missing a required argument: 'q'"),
    (lambda f: f(np.ones(2), np.ones(2), np.ones(2)), "too many positional arguments"),
    (lambda f: f(np.ones(2), {"w": np.ones(2), "name": "layer"}), "argument q['name'] of fun is a str"),
    (lambda f: f(np.ones(2), {"w": object()}), "argument q['w'] of fun is a object"),
])
def test_each_wrong_call_is_one_error(call, words):
    def fun(p, q):
        return p

    with pytest.raises(FeedError) as err:
        call(opgraph.jit(fun))
    assert isinstance(err.value, TypeError) and words in str(err.value)


@pytest.mark.parametrize("options, words", [
    ({"static_argnums": 5}, "static_argnums 5 is out of range"),
    ({"static_argnames": "nope"}, "static_argnames ['nope'] name no parameter of fun"),
    ({"donate_argnums": "p"}, "donate_argnums must be ints"),
    ({"optimize": 7}, "optimize must be one of [0, 1, 2, 3], got 7"),
    ({"static_argnums": 0, "donate_argnums": 0}, "argument(s) ['p'] are both static and donated"),
])
def test_each_wrong_option_is_one_error(options, words):
    def fun(p, q):
        return p

    with pytest.raises(GraphError, match=None) as err:
        opgraph.jit(fun, **options)
    assert words in str(err.value)


def test_unhashable_static_value_names_the_argument():
    f = opgraph.jit(lambda x, shape: onp.reshape(x, shape), static_argnums=1)
    np.testing.assert_array_equal(f(np.arange(4.0), (2, 2)), np.arange(4.0).reshape(2, 2))
    with pytest.raises(FeedError, match=r"static argument shape of <lambda> is a list, which is not hashable"):
        f(np.arange(4.0), [2, 2])


# ---------------------------------------------------------------- inspection
def test_graph_lower_explain_and_repr(rng):
    f = opgraph.jit(lambda x, w: onp.transpose(onp.transpose(x)) @ w, backend="numpy")
    x, w = rng.normal(size=(2, 3)), rng.normal(size=(3, 1))
    g = f.graph(x, w)
    assert [g.name_of(v) for v in g.inputs] == ["x", "w"]
    assert {g.kind_of(op) for op in range(g.num_ops)} == {"permute_dims", "matmul"}  # before optimisation
    assert f.cache_size == 0  # graph() traces, it does not compile
    prog = f.lower(x, w)
    assert f.cache_size == 1 and prog.compile_seconds > 0
    np.testing.assert_allclose(prog({int(g.inputs[0]): x, int(g.inputs[1]): w})[0], x @ w)
    text = f.explain(x, w)
    lines = text.splitlines()
    assert lines[0] == "jit(<lambda>) on numpy: x: float64[2, 3], w: float64[3, 1]"
    assert "optimize level 2" in lines[1] and "(1 ops)" in lines[1]  # the transposes cancelled
    assert prog.explain() in text
    assert 0 < f.compile_seconds(x, w) < 60
    assert f.compile_seconds(x, w) == pytest.approx(sum(f.compile_times["x: float64[2, 3], w: float64[3, 1]"].values()))
    assert repr(f) == "<opgraph.jit <lambda> on numpy: 1 signature(s) compiled>"


def test_a_later_call_of_arrays_and_numbers_only_flattens_and_looks_up(rng, monkeypatch):
    f = opgraph.jit(lambda p, x, lr: {"w": p["w"] - lr * x, "n": p["n"] + 1})
    p, x = {"w": rng.normal(size=3), "n": np.zeros((), np.int64)}, rng.normal(size=3)
    f(p, x, 0.5)
    monkeypatch.setattr(f._tracer, "bind", None)  # not bound again: the signature key is read from the leaves
    out = f(p, x, 0.25)
    np.testing.assert_allclose(out["w"], p["w"] - 0.25 * x)
    assert out["n"] == 1 and f.cache_size == 1


def test_optimize_level_zero_compiles_the_traced_graph(rng):
    f = opgraph.jit(lambda x: onp.transpose(onp.transpose(x)) * 1.0, optimize=0)
    x = rng.normal(size=(2, 3))
    np.testing.assert_allclose(f(x), x)
    assert f.lower(x).graph.num_ops == f.graph(x).num_ops


def test_a_jitted_method_takes_its_instance_as_a_static_argument(rng):
    class Model:
        def __init__(self, scale):
            self.scale = scale

        def __hash__(self):
            return hash(self.scale)

        def __eq__(self, other):
            return isinstance(other, Model) and other.scale == self.scale

        @opgraph.jit(static_argnums=0)
        def apply(self, x):
            return x * self.scale

    x = rng.normal(size=3)
    np.testing.assert_allclose(Model(2.0).apply(x), x * 2.0)
    np.testing.assert_allclose(Model(3.0).apply(x), x * 3.0)
    assert Model.apply.cache_size == 2


def test_auto_backend(rng):
    f = opgraph.jit(lambda x: onp.exp(x) + 1.0, backend="auto")
    x = rng.normal(size=8)
    np.testing.assert_allclose(f(x), np.exp(x) + 1.0)
    assert type(f.lower(x)).__name__ == "AutoCompiled"


def test_function_keeps_its_behaviour(rng):
    """@opgraph.function still treats Python numbers as static (a new value traces again), unlike jit."""
    f = opgraph.function(lambda x, k: x * k)
    x = rng.normal(size=2)
    np.testing.assert_allclose(f(x, 2.0), x * 2.0)
    np.testing.assert_allclose(f(x, 3.0), x * 3.0)
    assert f.cache_size == 2
