"""Pytrees, has_aux, argnums, jacobian and hessian in grad / value_and_grad / vjp / @opgraph.function.

Every derivative is checked against JAX (float64) and against central finite differences; the structure of each
result (dicts, tuples, lists, namedtuples, None) is checked against JAX's.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import optree
import pytest

import opgraph
import opgraph.numpy as onp
from opgraph.frontend import pytree

Layer = collections.namedtuple("Layer", "w b")
RNG = np.random.default_rng(1234)
X = RNG.standard_normal((6, 3))
Y = RNG.standard_normal((6, 2))
W1, B1, W2, B2 = (RNG.standard_normal(s) for s in [(3, 4), (4,), (4, 2), (2,)])

# The same parameters in each structure, with how to get (w1, b1, w2, b2) back out of it.
STRUCTURES: dict[str, tuple[Any, Callable[[Any], tuple[Any, ...]]]] = {
    "dict": ({"w1": W1, "b1": B1, "w2": W2, "b2": B2}, lambda p: (p["w1"], p["b1"], p["w2"], p["b2"])),
    "tuple": (((W1, B1), (W2, B2)), lambda p: (*p[0], *p[1])),
    "list": ([W1, B1, W2, B2], lambda p: tuple(p)),
    "namedtuple": ([Layer(W1, B1), Layer(W2, B2)], lambda p: (p[0].w, p[0].b, p[1].w, p[1].b)),
    "nested": ({"layers": [Layer(W1, B1), {"w": W2, "b": B2}], "frozen": None},
               lambda p: (p["layers"][0].w, p["layers"][0].b, p["layers"][1]["w"], p["layers"][1]["b"])),
}


def mlp(xp: ModuleType, get: Callable[[Any], tuple[Any, ...]]) -> Callable[..., Any]:
    """The loss of a small MLP over a parameter pytree, written once for opgraph.numpy and jax.numpy."""

    def loss(params: Any, x: Any, y: Any) -> Any:
        w1, b1, w2, b2 = get(params)
        return xp.mean((xp.tanh(x @ w1 + b1) @ w2 + b2 - y) ** 2)

    return loss


@pytest.fixture(scope="module")
def jax() -> ModuleType:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)  # as opgraph's JAX backend does: compare in float64
    return jax


def as_numpy(tree: Any) -> Any:
    return optree.tree_map(np.asarray, tree, none_is_leaf=False)


def assert_tree_close(got: Any, want: Any, rtol: float = 1e-9, atol: float = 1e-12) -> None:
    """Same structure (container types, keys, fields) and close leaves of the same shapes."""
    want = as_numpy(want)
    assert optree.tree_structure(got) == optree.tree_structure(want), (got, want)
    for g, w in zip(optree.tree_leaves(got), optree.tree_leaves(want), strict=True):
        assert isinstance(g, np.ndarray) and g.shape == w.shape, (g, w)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def fd_grad(f: Callable[[Any], float], tree: Any, eps: float = 1e-6) -> Any:
    """Central finite differences of scalar ``f`` for every element of every leaf of ``tree``."""
    leaves, spec = optree.tree_flatten(tree)
    grads = []
    for k, leaf in enumerate(leaves):
        g = np.zeros(np.shape(leaf))
        for i in np.ndindex(g.shape):
            shifted = []
            for sign in (1, -1):
                moved = [np.array(x, dtype=float, copy=True) for x in leaves]
                moved[k][i] += sign * eps
                shifted.append(float(f(optree.tree_unflatten(spec, moved))))
            g[i] = (shifted[0] - shifted[1]) / (2 * eps)
        grads.append(g)
    return optree.tree_unflatten(spec, grads)


def np_mlp(get: Callable[[Any], tuple[Any, ...]]) -> Callable[..., float]:
    return mlp(np, get)  # NumPy is the plain reference for values


# ------------------------------------------------------------------ grad / value_and_grad of pytrees
@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_grad_of_pytree_parameters_matches_jax_and_finite_differences(structure: str, jax: ModuleType) -> None:
    params, get = STRUCTURES[structure]
    g = opgraph.grad(mlp(onp, get))(params, X, Y)
    assert_tree_close(g, jax.grad(mlp(jax.numpy, get))(params, X, Y))
    assert_tree_close(g, fd_grad(lambda p: np_mlp(get)(p, X, Y), params), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("structure", ["dict", "namedtuple", "nested"])
def test_value_and_grad_with_tuple_argnums_over_pytrees(structure: str, jax: ModuleType) -> None:
    params, get = STRUCTURES[structure]
    data = {"x": X, "y": Y}

    def make(xp: ModuleType) -> Callable[..., Any]:
        return lambda p, d: mlp(xp, get)(p, d["x"], d["y"])

    value, (gp, gd) = opgraph.value_and_grad(make(onp), argnums=(0, 1))(params, data)
    want_value, want_grads = jax.value_and_grad(make(jax.numpy), argnums=(0, 1))(params, data)
    np.testing.assert_allclose(value, np_mlp(get)(params, X, Y), rtol=1e-12)
    np.testing.assert_allclose(value, want_value, rtol=1e-12)
    assert isinstance(want_grads, tuple)
    assert_tree_close((gp, gd), want_grads)
    assert_tree_close(gd, fd_grad(lambda d: np_mlp(get)(params, d["x"], d["y"]), data), rtol=1e-5, atol=1e-8)


def test_python_float_leaves_are_differentiated(jax: ModuleType) -> None:
    def f(xp: ModuleType) -> Callable[..., Any]:
        return lambda p: xp.sum(xp.sin(p["x"]) * p["scale"]) + p["scale"] ** 2

    p = {"x": np.array([0.3, -1.2]), "scale": 1.5}
    got = opgraph.grad(f(onp))(p)
    assert_tree_close(got, jax.grad(f(jax.numpy))(p))
    np.testing.assert_allclose(got["scale"], fd_grad(lambda q: f(np)(q), p)["scale"], rtol=1e-6)


def test_negative_argnums_count_from_the_end(jax: ModuleType) -> None:
    f = mlp(onp, STRUCTURES["dict"][1])
    params = STRUCTURES["dict"][0]
    got = opgraph.grad(f, argnums=-2)(params, X, Y)
    assert_tree_close(got, jax.grad(mlp(jax.numpy, STRUCTURES["dict"][1]), argnums=1)(params, X, Y))


# ------------------------------------------------------------------ has_aux
def aux_loss(xp: ModuleType) -> Callable[..., Any]:
    get = STRUCTURES["nested"][1]

    def loss(params: Any, x: Any, y: Any) -> Any:
        w1, b1, w2, b2 = get(params)
        h = xp.tanh(x @ w1 + b1)
        err = h @ w2 + b2 - y
        return xp.mean(err ** 2), {"hidden": h, "stats": (xp.max(err), [xp.min(err)])}

    return loss


def test_has_aux_in_grad_value_and_grad_and_jacobian(jax: ModuleType) -> None:
    params = STRUCTURES["nested"][0]
    g, aux = opgraph.grad(aux_loss(onp), has_aux=True)(params, X, Y)
    want_g, want_aux = jax.grad(aux_loss(jax.numpy), has_aux=True)(params, X, Y)
    assert_tree_close(g, want_g)
    assert_tree_close(aux, want_aux)
    h = np.tanh(X @ W1 + B1)
    np.testing.assert_allclose(aux["hidden"], h, rtol=1e-12)  # the aux values are the forward values

    (value, aux2), g2 = opgraph.value_and_grad(aux_loss(onp), has_aux=True)(params, X, Y)
    (want_value, _), _ = jax.value_and_grad(aux_loss(jax.numpy), has_aux=True)(params, X, Y)
    np.testing.assert_allclose(value, want_value, rtol=1e-12)
    assert_tree_close(g2, want_g)
    assert_tree_close(aux2, want_aux)

    def vec(xp: ModuleType) -> Callable[..., Any]:
        return lambda w, x: (xp.tanh(x @ w), {"norm": xp.sum(w * w)})

    jac, aux3 = opgraph.jacobian(vec(onp), has_aux=True)(W1, X[:2])
    want_jac, want_aux3 = jax.jacrev(vec(jax.numpy), has_aux=True)(W1, X[:2])
    assert jac.shape == (2, 4, 3, 4)
    assert_tree_close(jac, want_jac)
    assert_tree_close(aux3, want_aux3)


def test_has_aux_in_vjp_with_pytrees(jax: ModuleType) -> None:
    def f(xp: ModuleType) -> Callable[..., Any]:
        return lambda p, x: ({"y": xp.tanh(x @ p["w"]), "s": xp.sum(p["b"] ** 3)}, x * 2)

    p = {"w": W1, "b": B1}
    out, f_vjp, aux = opgraph.vjp(f(onp), p, X, has_aux=True)
    want_out, want_vjp, want_aux = jax.vjp(f(jax.numpy), p, X, has_aux=True)
    assert_tree_close(out, want_out)
    assert_tree_close(aux, want_aux)
    ct = {"y": RNG.standard_normal((6, 4)), "s": np.array(0.7)}
    assert_tree_close(f_vjp(ct), want_vjp(ct))
    # the same cotangent by finite differences of <ct, f(p)>
    inner = fd_grad(lambda q: sum(float(np.sum(c * o)) for c, o in zip(
        optree.tree_leaves(ct), optree.tree_leaves(f(np)(q, X)[0]), strict=True)), p)
    assert_tree_close(f_vjp(ct)[0], inner, rtol=1e-5, atol=1e-8)


# ------------------------------------------------------------------ jacobian and hessian
def test_jacobian_of_pytree_inputs_and_outputs(jax: ModuleType) -> None:
    def f(xp: ModuleType) -> Callable[..., Any]:
        return lambda p, s: {"y": xp.sin(p["w"] @ p["v"]) * s, "n": [xp.sum(p["v"] ** 2)]}

    p = {"w": RNG.standard_normal((2, 3)), "v": RNG.standard_normal(3)}
    jac = opgraph.jacobian(f(onp))(p, 1.5)
    want = jax.jacrev(f(jax.numpy))(p, 1.5)
    assert_tree_close(jac, want)
    assert jac["y"]["w"].shape == (2, 2, 3) and jac["n"][0]["v"].shape == (3,)
    for k in range(2):  # each row of d y / d p by finite differences
        fd = fd_grad(lambda q, k=k: f(np)(q, 1.5)["y"][k], p)
        np.testing.assert_allclose(jac["y"]["w"][k], fd["w"], rtol=1e-5, atol=1e-8)
        np.testing.assert_allclose(jac["y"]["v"][k], fd["v"], rtol=1e-5, atol=1e-8)

    both = opgraph.jacobian(lambda a, b: a * b, argnums=(0, 1))(np.arange(1.0, 3.0), np.full(2, 3.0))
    assert_tree_close(both, jax.jacrev(lambda a, b: a * b, argnums=(0, 1))(np.arange(1.0, 3.0), np.full(2, 3.0)))


@pytest.mark.parametrize("structure", ["dict", "namedtuple"])
def test_hessian_of_pytree_parameters(structure: str, jax: ModuleType) -> None:
    params, get = STRUCTURES[structure]
    x, y = X[:3], Y[:3]
    hess = opgraph.hessian(mlp(onp, get))(params, x, y)
    assert_tree_close(hess, jax.jit(jax.hessian(mlp(jax.numpy, get)))(params, x, y), rtol=1e-8, atol=1e-10)
    # one block by finite differences of the (JAX-checked) gradient
    grad_fn = opgraph.grad(mlp(onp, get))
    b2 = get(hess)[3]  # rows of the b2 part of the gradient: per input leaf, shape b2.shape + leaf.shape
    for k in range(2):
        fd = fd_grad(lambda p, k=k: get(grad_fn(p, x, y))[3][k], params)
        for block, want in zip(get(b2), get(fd), strict=True):
            assert block.shape == (2, *want.shape)
            np.testing.assert_allclose(block[k], want, rtol=1e-5, atol=1e-7)


def test_grad_of_grad_and_of_traced_functions_stay_lazy_inside(jax: ModuleType) -> None:
    def f(xp: ModuleType) -> Callable[..., Any]:
        return lambda p: xp.sum(xp.sin(p[0]) * p[1] ** 2)

    p = (np.array([0.3, 1.1]), np.array([2.0, -0.5]))
    inner = opgraph.grad(f(onp))
    second = opgraph.grad(lambda q: onp.sum(inner(q)[0] * inner(q)[1]))(p)
    want = jax.grad(lambda q: jax.numpy.sum(jax.grad(f(jax.numpy))(q)[0] * jax.grad(f(jax.numpy))(q)[1]))(p)
    assert_tree_close(second, want)
    traced = opgraph.function(f(onp))  # grad of a traced function inlines the function's ops
    assert_tree_close(opgraph.grad(traced)(p), jax.grad(f(jax.numpy))(p))


# ------------------------------------------------------------------ @opgraph.function with pytrees
def test_traced_function_takes_and_returns_pytrees() -> None:
    traces = []

    @opgraph.function
    def forward(params: Any, batch: Any, scale: float = 2.0) -> Any:
        traces.append(1)
        layer, extra = params
        y = batch["x"] @ layer.w + layer.b
        return {"y": y * scale, "parts": (onp.sum(y), [extra, "tag"]), "none": None}

    params = (Layer(W1, B1), None)
    out = forward(params, {"x": X})
    want_y = X @ W1 + B1
    np.testing.assert_allclose(out["y"], 2.0 * want_y, rtol=1e-12)
    np.testing.assert_allclose(out["parts"][0], np.sum(want_y), rtol=1e-12)
    assert out["parts"][1] == [None, "tag"] and out["none"] is None
    assert isinstance(out["parts"], tuple) and isinstance(out["y"], np.ndarray)

    g = forward.graph(params, {"x": X})
    assert [g.name_of(v) for v in g.inputs] == ["params.0.w", "params.0.b", "batch.x"]
    assert len(g.outputs) == 2  # flat: the array leaves of the result
    forward(params, {"x": X + 1.0})
    assert len(traces) == 1  # same structure, dtypes and shapes
    forward([Layer(W1, B1), None], {"x": X})  # a list, not a tuple: another structure
    forward(params, {"x": X}, 3.0)  # a static leaf changed
    assert forward.cache_size == 3 and len(traces) == 3


def test_traced_function_keeps_colliding_paths_apart() -> None:
    f = opgraph.function(lambda d: d["a.b"] * 2 + d["a"]["b"])
    arg = {"a.b": np.ones(2), "a": {"b": np.full(2, 5.0)}}
    np.testing.assert_allclose(f(arg), np.full(2, 7.0))
    g = f.graph(arg)
    names = [g.name_of(v) for v in g.inputs]
    assert len(set(names)) == 2 and all(n.startswith("d.a.b") for n in names)


# ------------------------------------------------------------------ errors name the user's function and argument
def loss(params: Any, x: Any, y: Any) -> Any:
    return onp.mean((x @ params["w"] + params["b"] - y) ** 2)


PARAMS = {"w": np.ones((3, 2)), "b": np.zeros(2)}


def check_message(exc: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(exc.value)
    assert "_lazy" not in msg and "pullback" not in msg
    return msg


def test_argnums_out_of_range_is_a_type_error_naming_the_function() -> None:
    with pytest.raises(TypeError, match=r"grad\(f\): argnums=2 but f takes 1 positional argument$") as info:
        def f(x: Any) -> Any:
            return onp.sum(x)
        opgraph.grad(f, argnums=2)
    check_message(info)
    with pytest.raises(TypeError, match=r"value_and_grad\(loss\): argnums=\(0, 3\) but loss takes 3"):
        opgraph.value_and_grad(loss, argnums=(0, 3))
    # *args: known only at the call
    g = opgraph.grad(lambda *xs: onp.sum(xs[0]), argnums=1)
    with pytest.raises(TypeError, match=r"argnums=1 but <lambda> was called with 1 positional argument"):
        g(np.ones(2))
    with pytest.raises(TypeError, match=r"argnums must be an int or a non-empty tuple of ints, not 'w'"):
        opgraph.grad(loss, argnums="w")  # type: ignore[arg-type]


def test_non_scalar_output_names_the_function_and_shape() -> None:
    with pytest.raises(TypeError, match=r"grad\(predict\): predict must return a scalar, but it returned an array "
                                        r"of shape \(4, 2\)") as info:
        def predict(params: Any, x: Any) -> Any:
            return x @ params["w"] + params["b"]
        opgraph.grad(predict)(PARAMS, np.ones((4, 3)))
    check_message(info)


def test_non_float_leaves_are_named_by_path() -> None:
    with pytest.raises(TypeError, match=r"grad\(loss\): argument params\['b'\] has dtype int64") as info:
        opgraph.grad(loss)({"w": np.ones((3, 2)), "b": np.zeros(2, dtype=np.int64)}, np.ones((4, 3)), np.ones((4, 2)))
    check_message(info)
    with pytest.raises(TypeError, match=r"argument layers\[0\]\.b has dtype int64"):
        opgraph.grad(lambda layers: onp.sum(layers[0].w))([Layer(np.ones(2), 3)])


def test_tuple_output_without_has_aux_says_to_use_has_aux() -> None:
    def two(params: Any, x: Any, y: Any) -> Any:
        return loss(params, x, y), x

    with pytest.raises(TypeError, match=r"grad\(two\): two returned a tuple of 2 items, .*has_aux=True") as info:
        opgraph.grad(two)(PARAMS, np.ones((4, 3)), np.ones((4, 2)))
    check_message(info)
    with pytest.raises(TypeError, match=r"grad\(loss\) with has_aux=True: loss must return a pair \(output, aux\), "
                                        r"but it returned an array of shape \(\)"):
        opgraph.grad(loss, has_aux=True)(PARAMS, np.ones((4, 3)), np.ones((4, 2)))
    def three(p: Any) -> Any:
        return onp.sum(p), p, p

    with pytest.raises(TypeError, match=r"value_and_grad\(three\) with has_aux=True: three must return a pair "
                                        r"\(output, aux\), but it returned a tuple of 3 items"):
        opgraph.value_and_grad(three, has_aux=True)(np.ones(2))
    with pytest.raises(TypeError, match=r"jacobian\(three\) with has_aux=True: three must return a pair"):
        opgraph.jacobian(three, has_aux=True)(np.ones(2))


def test_unhashable_static_leaves_name_the_path_and_function() -> None:
    @opgraph.function
    def step(params: Any, opts: Any) -> Any:
        return params["w"] * 2

    with pytest.raises(TypeError, match=r"argument opts\['mode'\] of step is a set: neither an array nor hashable"):
        step({"w": np.ones(2)}, {"mode": {1, 2}})
    with pytest.raises(TypeError, match=r"argument opts\['mode'\] of loss2 is a set"):
        def loss2(params: Any, opts: Any) -> Any:
            return onp.sum(params["w"])
        opgraph.grad(loss2)({"w": np.ones(2)}, {"mode": {1, 2}})


def test_vjp_cotangent_structure_and_shape_are_checked() -> None:
    _, f_vjp = opgraph.vjp(lambda p: {"y": p["w"] * 2}, {"w": np.ones(3)})
    with pytest.raises(TypeError, match=r"vjp\(<lambda>\): the cotangent has structure"):
        f_vjp(np.ones(3))
    with pytest.raises(ValueError, match=r"cotangent\['y'\] has shape \(2,\), but the output it stands for has "
                                         r"shape \(3,\)"):
        f_vjp({"y": np.ones(2)})
    np.testing.assert_allclose(f_vjp({"y": np.arange(3.0)})[0]["w"], 2 * np.arange(3.0))
    with pytest.raises(TypeError, match=r"vjp\(<lambda>\): 2 primals given, but <lambda> takes 1 positional argument$"):
        opgraph.vjp(lambda p: p, np.ones(2), np.ones(2))
    with pytest.raises(TypeError, match=r"vjp\(<lambda>\): argument p\[1\] has dtype int64"):
        opgraph.vjp(lambda p: p[0] * 2.0, (np.ones(2), np.arange(2)))[1](np.ones(2))


def test_pytree_helpers() -> None:
    tree = {"b": [np.ones(2), None, Layer(1.0, "s")], "a": np.zeros(())}
    leaves, spec = pytree.flatten(tree)
    assert pytree.keystrs("t", tree) == ["t['a']", "t['b'][0]", "t['b'][2].w", "t['b'][2].b"]
    assert [pytree.input_name("t", p) for p in pytree.paths(tree)] == ["t.a", "t.b.0", "t.b.2.w", "t.b.2.b"]
    back = pytree.unflatten(spec, leaves)
    assert list(back) == ["b", "a"] and back["b"][1] is None and back["b"][2] == Layer(1.0, "s")
