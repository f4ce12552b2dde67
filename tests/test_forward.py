"""Forward mode as JAX users write it: jvp, linearize, jacfwd, jacrev, hvp and hessian's choice.

Every derivative is checked against JAX (float64) and against central finite differences; the structures of
the results against JAX's. The derivative graphs run on every engine and survive a save and load.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import opgraph
import opgraph.numpy as onp
from opgraph.autodiff import NoTangentError, build_jvp_ops, build_vjp_ops
from opgraph.frontend import pytree
from opgraph.frontend.lazy import apply

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
jax.config.update("jax_enable_x64", True)

RNG = np.random.default_rng(37)
A = RNG.standard_normal((5, 3))
X = RNG.standard_normal(3)
V = RNG.standard_normal(3)


def model(xp: ModuleType) -> Callable[[Any], Any]:
    """A function of a 3-vector written once for opgraph.numpy and jax.numpy: matmul, tanh, reductions,
    slicing, a broadcast and a max."""

    def f(x: Any) -> Any:
        h = xp.tanh(A @ x)
        return xp.sum(h ** 2) + xp.max(x) * xp.mean(xp.exp(x[1:]).reshape(2, 1) * x[:2])

    return f


def vector_model(xp: ModuleType) -> Callable[[Any], Any]:
    def f(x: Any) -> Any:
        return xp.concatenate([xp.sin(A @ x) * x[0], xp.cumsum(x ** 2)])

    return f


@functools.cache
def jax_hessian() -> np.ndarray:
    return np.asarray(jax.jit(jax.hessian(model(jnp)))(X))


def central(f: Callable[[np.ndarray], Any], x: np.ndarray, v: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return (np.asarray(f(x + eps * v)) - np.asarray(f(x - eps * v))) / (2 * eps)


def test_jvp_against_jax_and_finite_differences() -> None:
    y, t = opgraph.jvp(model(onp), (X,), (V,))
    jy, jt = jax.jvp(model(jnp), (X,), (V,))
    np.testing.assert_allclose(y, jy, rtol=1e-12)
    np.testing.assert_allclose(t, jt, rtol=1e-12)
    np.testing.assert_allclose(t, central(model(np), X, V), rtol=1e-6)


def test_jvp_transpose_identity_with_vjp() -> None:
    # <J v, w> = <v, J^T w> for the vector model, J v by forward mode and J^T w by reverse mode
    w = RNG.standard_normal(8)
    _, jv = opgraph.jvp(vector_model(onp), (X,), (V,))
    _, pullback = opgraph.vjp(vector_model(onp), X)
    (jtw,) = pullback(w)
    np.testing.assert_allclose(np.dot(jv, w), np.dot(V, jtw), rtol=1e-12)


def test_jvp_pytrees_and_has_aux_like_jax() -> None:
    def f(xp: ModuleType) -> Callable[..., Any]:
        def g(p: Any, s: Any) -> Any:
            out = {"y": xp.sin(p["a"]) * p["b"][0], "z": (p["b"][1] * s, s)}
            return out, {"norm": xp.sum(p["a"] ** 2)}

        return g

    primals = ({"a": X, "b": [np.array(2.0), np.array([1.0, 3.0])]}, np.array(0.5))
    tangents = ({"a": V, "b": [np.array(1.0), np.array([0.5, -1.0])]}, np.array(2.0))
    out, tan, aux = opgraph.jvp(f(onp), primals, tangents, has_aux=True)
    jout, jtan, jaux = jax.jvp(f(jnp), primals, tangents, has_aux=True)
    assert pytree.flatten(out)[1] == pytree.flatten(jout)[1] or sorted(out) == sorted(jout)
    for a, b in zip(pytree.flatten((out, tan, aux))[0], pytree.flatten((jout, jtan, jaux))[0], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_jvp_argument_errors() -> None:
    f = model(onp)
    with pytest.raises(TypeError, match="tuple or list"):
        opgraph.jvp(f, X, V)
    with pytest.raises(TypeError, match=r"1 primal.*2 tangent"):
        opgraph.jvp(f, (X,), (V, V))
    with pytest.raises(ValueError, match=r"shape \(2,\).*shape \(3,\)"):
        opgraph.jvp(f, (X,), (V[:2],))
    with pytest.raises(TypeError, match="structure"):
        opgraph.jvp(lambda p: p["a"], ({"a": X},), ([V],))


def test_linearize_matches_jvp_and_folds_the_primal() -> None:
    y, f_jvp = opgraph.linearize(model(onp), X)
    np.testing.assert_allclose(y, model(np)(X), rtol=1e-12)
    for v in (V, RNG.standard_normal(3)):
        np.testing.assert_allclose(f_jvp(v), jax.jvp(model(jnp), (X,), (v,))[1], rtol=1e-12)
    # the primals are constants of the linear map's graph: its only input is the tangent
    assert len(f_jvp.graph(V).inputs) == 1


def test_jacfwd_jacrev_against_jax() -> None:
    jf = opgraph.jacfwd(vector_model(onp))(X)
    np.testing.assert_allclose(jf, jax.jit(jax.jacfwd(vector_model(jnp)))(X), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(opgraph.jacrev(vector_model(onp))(X), jf, rtol=1e-12, atol=1e-14)
    assert opgraph.jacrev is opgraph.jacobian

    def g(xp: ModuleType) -> Callable[..., Any]:
        return lambda p, s: {"u": p["w"] @ p["w"].T * s, "v": xp.sum(p["w"], axis=0)}

    p = {"w": RNG.standard_normal((2, 3))}
    got = opgraph.jacfwd(g(onp), argnums=(0, 1))(p, np.array(1.5))
    want = jax.jacfwd(g(jnp), argnums=(0, 1))(p, np.array(1.5))
    gl, _ = pytree.flatten(got)
    wl, _ = pytree.flatten(want)
    for a, b in zip(gl, wl, strict=True):
        assert np.shape(a) == np.shape(b)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_hvp_against_the_formed_hessian() -> None:
    g, hv = opgraph.hvp(model(onp), (X,), (V,))
    np.testing.assert_allclose(g, jax.grad(model(jnp))(X), rtol=1e-12)
    np.testing.assert_allclose(hv, jax_hessian() @ V, rtol=1e-10)

    def two(a: Any, b: Any) -> Any:
        return onp.sum(onp.sin(a) * b ** 2)

    a, b = RNG.standard_normal(2), RNG.standard_normal(2)
    ta, tb = RNG.standard_normal(2), RNG.standard_normal(2)
    (ga, gb), (ha, hb) = opgraph.hvp(two, (a, b), (ta, tb))
    np.testing.assert_allclose(np.concatenate([ga, gb]), [np.cos(a[0]) * b[0] ** 2, np.cos(a[1]) * b[1] ** 2,
                                                          2 * np.sin(a[0]) * b[0], 2 * np.sin(a[1]) * b[1]])
    H = jax.jit(jax.hessian(lambda z: jnp.sum(jnp.sin(z[:2]) * z[2:] ** 2)))(np.concatenate([a, b]))
    hz = H @ np.concatenate([ta, tb])
    np.testing.assert_allclose(np.concatenate([ha, hb]), hz, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("mode", ["auto", "fwd", "rev"])
def test_hessian_modes_agree_with_jax(mode: str) -> None:
    h = opgraph.hessian(model(onp), mode=mode)(X)
    np.testing.assert_allclose(h, jax_hessian(), rtol=1e-10, atol=1e-13)


def test_hessian_chooses_forward_over_reverse() -> None:
    # forward-over-reverse builds fewer ops than reverse-over-reverse for the same Hessian
    fwd = opgraph.hessian(model(onp), mode="fwd").graph(X)
    rev = opgraph.hessian(model(onp), mode="rev").graph(X)
    auto = opgraph.hessian(model(onp)).graph(X)
    assert auto.num_ops == fwd.num_ops < rev.num_ops
    with pytest.raises(ValueError, match="mode must be"):
        opgraph.hessian(model(onp), mode="forward")


@pytest.mark.parametrize("backend", ["numpy", "jax", "torch", "onnxruntime", "dask", "numba", "c"])
def test_jit_of_hvp_and_jacfwd_on_every_engine(backend: str) -> None:
    hvp = opgraph.jit(lambda x, v: opgraph.hvp(model(onp), (x,), (v,))[1], backend=backend)
    np.testing.assert_allclose(np.asarray(hvp(X, V)), jax_hessian() @ V, rtol=1e-10, atol=1e-13)
    jac = opgraph.jit(opgraph.jacfwd(vector_model(onp)), backend=backend)
    np.testing.assert_allclose(np.asarray(jac(X)), jax.jit(jax.jacfwd(vector_model(jnp)))(X), rtol=1e-10, atol=1e-13)


def test_jvp_graph_saves_and_runs(tmp_path: Path) -> None:
    g = opgraph.function(lambda x, v: opgraph.jvp(model(onp), (x,), (v,))[1]).graph(X, V)
    for ext in ("cg", "json"):
        path = tmp_path / f"jvp.{ext}"
        opgraph.save(g, path)
        (t,) = opgraph.compile(opgraph.load(path))(X, V)
        np.testing.assert_allclose(t, jax.jvp(model(jnp), (X,), (V,))[1], rtol=1e-12)


def test_reverse_over_forward_and_forward_over_forward() -> None:
    # grad of a directional derivative: d/dx <grad f(x), v> = H v
    dd = opgraph.grad(lambda x: opgraph.jvp(model(onp), (x,), (V,))[1])(X)
    np.testing.assert_allclose(dd, jax_hessian() @ V, rtol=1e-10)
    # second directional derivative v^T H v by jvp of jvp
    second = opgraph.jvp(lambda x: opgraph.jvp(model(onp), (x,), (V,))[1], (X,), (V,))[1]
    np.testing.assert_allclose(second, V @ jax_hessian() @ V, rtol=1e-10)


def test_builder_level_jvp_matches_vjp_transpose() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    v = b.input(("float64", (3,)), name="v")
    w = b.input(("float64", (5,)), name="w")
    y = b.tanh(b.matmul(b.constant(A), b.multiply(x, x)))
    (jv,) = build_jvp_ops(b, [y], [x], [v])
    (jtw,) = build_vjp_ops(b, [y], [x], [w])
    wv = RNG.standard_normal(5)
    got_jv, got_jtw = b.run({x: X, v: V, w: wv}, [jv, jtw])
    assert np.dot(got_jv, wv) == pytest.approx(np.dot(V, got_jtw), rel=1e-12)
    np.testing.assert_allclose(got_jv, central(lambda z: np.tanh(A @ (z * z)), X, V), rtol=1e-6)


def test_no_tangent_names_the_op() -> None:
    from opgraph.core.registry import OpDef, register_op

    register_op(OpDef(name="test_fwd_opaque", id=50371, arity=1, infer=lambda ts, a: ts,
                      kernel=lambda x, out=None: np.negative(x, out=out), family="user"))
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2,)), name="x")
    y = b.op("test_fwd_opaque", x)
    with pytest.raises(NoTangentError, match="test_fwd_opaque"):
        build_jvp_ops(b, [y], [x], [np.ones(2)])


def test_hessian_auto_falls_back_to_reverse_where_forward_cannot_go() -> None:
    from opgraph.core.registry import OpDef, register_op

    # a user's op whose gradient rule is right (2 g written as 2 |g| sign g) but not linear in g as written, so
    # its tangent cannot come from transposing it: forward-over-reverse fails, reverse-over-reverse works
    def grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: Any) -> list[Any]:
        g = cots[0]
        return [b.op("multiply", b.op("multiply", b.op("abs", g), b.op("sign", g)), b.constant(np.array(2.0)))]

    register_op(OpDef(name="test_fwd_double", id=50372, arity=1, infer=lambda ts, a: ts, grad=grad,
                      kernel=lambda x, out=None: np.multiply(x, 2.0, out=out), family="user"))

    def f(x: Any) -> Any:
        return onp.sum(apply("test_fwd_double", x) ** 2)

    x = np.array([0.5, -1.5, 2.0])
    np.testing.assert_allclose(opgraph.hessian(f)(x), 8.0 * np.eye(3))
    np.testing.assert_allclose(opgraph.hessian(f, mode="rev")(x), 8.0 * np.eye(3))
    with pytest.raises(NoTangentError, match="test_fwd_double"):
        opgraph.hessian(f, mode="fwd")(x)


def test_a_gradient_rule_through_an_op_without_one_names_both() -> None:
    from opgraph.core.registry import OpDef, register_op

    register_op(OpDef(name="test_fwd_inner", id=50373, arity=1, infer=lambda ts, a: ts,
                      kernel=lambda x, out=None: np.negative(x, out=out), family="user"))
    register_op(OpDef(name="test_fwd_outer", id=50374, arity=1, infer=lambda ts, a: ts,
                      grad=lambda b, ins, outs, cots, attrs: [b.op("test_fwd_inner", cots[0])],
                      kernel=lambda x, out=None: np.negative(x, out=out), family="user"))
    with pytest.raises(NoTangentError, match=r"test_fwd_outer.*test_fwd_inner"):
        opgraph.jvp(lambda x: apply("test_fwd_outer", x), (np.ones(2),), (np.ones(2),))
