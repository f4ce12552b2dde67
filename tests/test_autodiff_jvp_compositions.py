"""Forward mode on random compositions of ops (Hypothesis) against JAX.

A small program generator: a pool of values starts with two inputs; each step applies an elementwise op,
a reduction, a matmul, a reshape or transpose, or an index to values of the pool and adds the result. The
same program runs on opgraph.numpy and on jax.numpy: ``opgraph.jvp`` must match ``jax.jvp`` (and central
differences), and ``opgraph.hvp`` of a scalar loss of the program must match the formed Hessian
(``jax.hessian``) applied to the tangents.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opgraph
import opgraph.numpy as onp

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)  # compare in float64
jnp = pytest.importorskip("jax.numpy")

Shape = tuple[int, ...]
Step = tuple[str, tuple[int, ...], Any]

UNARY = ("sin", "tanh", "square", "exp", "log1p_sq", "neg")
BINARY = ("add", "subtract", "multiply")


def _unary(ns: Any, name: str, a: Any) -> Any:
    if name == "log1p_sq":  # a smooth op of a positive argument
        return ns.log1p(a * a)
    if name == "neg":
        return -a
    return getattr(ns, name)(a)


def _broadcast(s: Shape, t: Shape) -> Shape | None:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(s, t))
    except ValueError:
        return None


@st.composite
def programs(draw: Callable[..., Any]) -> tuple[list[Step], list[Shape]]:
    """A list of steps (op, operand positions in the pool, parameter) and the shape of each pool value."""
    shapes: list[Shape] = [(3, 4), (3, 4)]
    steps: list[Step] = []
    for _ in range(draw(st.integers(1, 6))):
        k = draw(st.integers(0, len(shapes) - 1))
        s = shapes[k]
        kind = draw(st.sampled_from(("unary", "binary", "reduce", "matmul", "shape", "index")))
        if kind == "unary":
            step, out = (draw(st.sampled_from(UNARY)), (k,), None), s
        elif kind == "binary":
            fits = [j for j, t in enumerate(shapes) if _broadcast(s, t) is not None]
            j = draw(st.sampled_from(fits))
            out = _broadcast(s, shapes[j])  # type: ignore[assignment]
            step = (draw(st.sampled_from(BINARY)), (k, j), None)
        elif kind == "reduce":
            axis = draw(st.sampled_from([None, *range(len(s))])) if s else None
            keep = draw(st.booleans())
            op = draw(st.sampled_from(("sum", "mean", "max")))
            if axis is None:
                out = (1,) * len(s) if keep else ()
            else:
                out = tuple(1 if i == axis else d for i, d in enumerate(s)) if keep else s[:axis] + s[axis + 1:]
            step = (op, (k,), (axis, keep))
        elif kind == "matmul" and len(s) == 2:
            fits = [j for j, t in enumerate(shapes) if len(t) == 2 and t[1] == s[1]]  # a @ b.T
            j = draw(st.sampled_from(fits))
            step, out = ("matmul_t", (k, j), None), (s[0], shapes[j][0])
        elif kind == "shape" and len(s) == 2:
            if draw(st.booleans()):
                step, out = ("transpose", (k,), None), (s[1], s[0])
            else:
                step, out = ("flatten", (k,), None), (s[0] * s[1],)
        elif kind == "index" and s and s[0] > 1:
            step, out = ("index", (k,), None), ((s[0] + 1) // 2, *s[1:])  # a[::-2]
        else:
            step, out = ("sin", (k,), None), s
        steps.append(step)
        shapes.append(out)
    return steps, shapes


def run(ns: Any, steps: list[Step], x: Any, y: Any) -> Any:
    pool = [x, y]
    for op, args, par in steps:
        a = [pool[i] for i in args]
        if op in UNARY:
            r = _unary(ns, op, a[0])
        elif op in BINARY:
            r = getattr(ns, op)(a[0], a[1])
        elif op in ("sum", "mean", "max"):
            r = getattr(ns, op)(a[0], axis=par[0], keepdims=par[1])
        elif op == "matmul_t":
            r = ns.matmul(a[0], a[1].T)
        elif op == "transpose":
            r = a[0].T
        elif op == "flatten":
            r = ns.reshape(a[0], (-1,))
        else:
            r = a[0][::-2]
        pool.append(r)
    return pool[-1]


def _settings(n: int) -> Any:
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings(25)
@given(prog=programs(), seed=st.integers(0, 2**16))
def test_jvp_of_compositions_matches_jax(prog: tuple[list[Step], list[Shape]], seed: int) -> None:
    steps, _ = prog
    rng = np.random.default_rng(seed)
    x, y, tx, ty = (rng.standard_normal((3, 4)) for _ in range(4))
    out, tan = opgraph.jvp(lambda a, b: run(onp, steps, a, b), (x, y), (tx, ty))
    jout, jtan = jax.jvp(lambda a, b: run(jnp, steps, a, b), (x, y), (tx, ty))
    np.testing.assert_allclose(np.asarray(out), np.asarray(jout), rtol=1e-10, atol=1e-12, err_msg=str(steps))
    np.testing.assert_allclose(np.asarray(tan), np.asarray(jtan), rtol=1e-9, atol=1e-10, err_msg=str(steps))
    eps = 1e-6
    fd = (run(np, steps, x + eps * tx, y + eps * ty) - run(np, steps, x - eps * tx, y - eps * ty)) / (2 * eps)
    np.testing.assert_allclose(np.asarray(tan), fd, rtol=1e-4, atol=1e-5, err_msg=str(steps))


@_settings(10)  # jax.hessian traces every new program op by op: the slow half of this file
@given(prog=programs(), seed=st.integers(0, 2**16))
def test_hvp_of_compositions_matches_formed_hessian(prog: tuple[list[Step], list[Shape]], seed: int) -> None:
    steps, _ = prog
    rng = np.random.default_rng(seed)
    x, y, tx, ty = (rng.standard_normal((3, 4)) for _ in range(4))

    def loss(ns: Any) -> Callable[..., Any]:
        return lambda a, b: ns.sum(ns.sin(run(ns, steps, a, b)))

    (gx, gy), (hx, hy) = opgraph.hvp(loss(onp), (x, y), (tx, ty))
    hess = jax.hessian(loss(jnp), argnums=(0, 1))(x, y)
    jg = jax.grad(loss(jnp), argnums=(0, 1))(x, y)
    tans = (tx, ty)
    for i, (g, hv) in enumerate(((gx, hx), (gy, hy))):
        ref = sum(np.tensordot(np.asarray(hess[i][j]), tans[j], axes=2) for j in range(2))
        np.testing.assert_allclose(np.asarray(g), np.asarray(jg[i]), rtol=1e-10, atol=1e-12, err_msg=str(steps))
        np.testing.assert_allclose(np.asarray(hv), ref, rtol=1e-8, atol=1e-10, err_msg=str(steps))
