"""The three workloads of issue 37's benchmarks (bench/forward_batch.py), written once for NumPy-like namespaces.

Each function takes the array namespace (``opgraph.numpy``, ``jax.numpy`` or ``numpy``) and, for the loops, the
library's ``scan``, so that opgraph, JAX and the NumPy reference run the same arithmetic; CasADi's versions are
written on SX beside them. The references (:func:`nls_reference`, :func:`ode_reference`,
:func:`pergrad_reference`) do not use any library's differentiation.

* **hvp**: the chained Rosenbrock function as a nonlinear least-squares loss, ``loss(x) = 0.5 * sum(r(x)**2)``
  with ``r = [10 (x[1:] - x[:-1]**2), 1 - x[:-1]]`` (so ``loss = scipy.optimize.rosen / 2``), the classic test
  problem of Newton-CG, whose ``H v`` SciPy gives in closed form (``rosen_hess_prod``).
* **ode**: a fixed-step RK4 integration of the Lotka-Volterra equations ``u' = a u - b u w``,
  ``w' = -c w + D u w`` over ``steps`` steps of ``DT``; the outputs are the whole trajectory (``steps x 2``), the
  inputs the three parameters ``(a, b, c)``: a Jacobian with few inputs and many outputs.
* **pergrad**: a one-hidden-layer tanh MLP with a squared-error loss on one example, ``loss(params, x, y)``; its
  gradient with respect to ``params`` for each of a batch of examples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------- hvp: nonlinear least squares


def nls_loss(xp: Any) -> Callable[[Any], Any]:
    """``0.5 * sum(r(x)**2)`` for the chained Rosenbrock residuals ``r``, on namespace ``xp``."""

    def loss(x: Any) -> Any:
        head, tail = x[:-1], x[1:]
        r = xp.concatenate([10.0 * (tail - head * head), 1.0 - head])
        return 0.5 * xp.sum(r * r)

    return loss


def nls_casadi(n: int) -> Any:
    """CasADi ``Function`` ``(x, v) -> H v`` of :func:`nls_loss` on SX: ``jtimes`` of the ``gradient``."""
    import casadi

    x, v = casadi.SX.sym("x", n), casadi.SX.sym("v", n)
    head, tail = x[: n - 1], x[1:n]
    r = casadi.vertcat(10.0 * (tail - head * head), 1.0 - head)
    loss = 0.5 * casadi.dot(r, r)
    hv = casadi.jtimes(casadi.gradient(loss, x), x, v)
    return casadi.Function("hvp", [x, v], [hv])


def nls_inputs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The point ``x`` (around the minimum at ones) and the direction ``v``."""
    rng = np.random.default_rng(seed)
    return 1.0 + 0.5 * rng.standard_normal(n), rng.standard_normal(n)


def nls_reference(x: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(grad loss(x), H(x) v)`` from SciPy's closed forms for the Rosenbrock function (halved)."""
    from scipy.optimize import rosen_der, rosen_hess_prod

    return 0.5 * rosen_der(x), 0.5 * rosen_hess_prod(x, v)


# ----------------------------------------------------------------------------- ode: RK4 of Lotka-Volterra

DT = 0.1
D = 0.1  # the fourth Lotka-Volterra coefficient, fixed
U0, W0 = 10.0, 5.0
PARAMS = np.array([1.1, 0.4, 0.4])  # a, b, c


def _rk4_step(state: tuple[Any, Any], p: Any) -> tuple[Any, Any]:
    a, b, c = p[0], p[1], p[2]

    def rhs(u: Any, w: Any) -> tuple[Any, Any]:
        return a * u - b * u * w, D * u * w - c * w

    u, w = state
    k1 = rhs(u, w)
    k2 = rhs(u + 0.5 * DT * k1[0], w + 0.5 * DT * k1[1])
    k3 = rhs(u + 0.5 * DT * k2[0], w + 0.5 * DT * k2[1])
    k4 = rhs(u + DT * k3[0], w + DT * k3[1])
    return (u + DT / 6.0 * (k1[0] + 2.0 * k2[0] + 2.0 * k3[0] + k4[0]),
            w + DT / 6.0 * (k1[1] + 2.0 * k2[1] + 2.0 * k3[1] + k4[1]))


def ode_simulate(xp: Any, steps: int, scan: Callable[..., Any] | None = None) -> Callable[[Any], Any]:
    """``simulate(p) -> (steps, 2)`` trajectory of ``(u, w)`` after each step, on namespace ``xp``: one
    ``scan(f, init, None, length=steps)`` where ``scan`` is given (``opgraph.scan``, ``jax.lax.scan``), else
    unrolled into ``steps`` copies of the step."""

    def simulate(p: Any) -> Any:
        init = (p[0] * 0.0 + U0, p[0] * 0.0 + W0)  # arrays of p's kind and dtype, so the carry's type is fixed
        if scan is not None:
            def body(state: tuple[Any, Any], _: Any) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
                new = _rk4_step(state, p)
                return new, new

            _, (us, ws) = scan(body, init, None, length=steps)
            return xp.stack([us, ws], axis=1)
        state, out = init, []
        for _ in range(steps):
            state = _rk4_step(state, p)
            out += list(state)
        return xp.reshape(xp.stack(out), (steps, 2))

    return simulate


def ode_casadi(steps: int) -> Any:
    """CasADi ``Function`` ``p -> d trajectory / d p`` (``2 steps x 3``, rows in the trajectory's row-major order)
    of the unrolled RK4 on SX, by ``casadi.jacobian`` (which takes forward mode for 3 inputs)."""
    import casadi

    p = casadi.SX.sym("p", 3)
    state: tuple[Any, Any] = (casadi.SX(U0), casadi.SX(W0))
    out = []
    for _ in range(steps):
        state = _rk4_step(state, p)
        out += list(state)
    traj = casadi.vertcat(*out)
    return casadi.Function("trajectory_jacobian", [p], [casadi.jacobian(traj, p)])


def ode_reference(steps: int, p: np.ndarray = PARAMS, h: float = 1e-6) -> np.ndarray:
    """``d trajectory / d p`` (``steps x 2 x 3``) by central differences of the NumPy RK4."""
    sim = ode_simulate(np, steps)
    cols = [(sim(p + h * e) - sim(p - h * e)) / (2 * h) for e in np.eye(3)]
    return np.stack(cols, axis=-1)


# ----------------------------------------------------------------------------- pergrad: per-example gradients


def mlp_loss(xp: Any) -> Callable[[Any, Any, Any], Any]:
    """``loss(params, x, y)`` of one example: ``0.5 |tanh(x W1 + b1) W2 + b2 - y|^2``, params ``(W1, b1, W2, b2)``."""

    def loss(params: tuple[Any, Any, Any, Any], x: Any, y: Any) -> Any:
        w1, b1, w2, b2 = params
        d = xp.tanh(x @ w1 + b1) @ w2 + b2 - y
        return 0.5 * xp.sum(d * d)

    return loss


def mlp_inputs(batch: int, sizes: tuple[int, int, int], seed: int = 0) -> tuple[tuple[np.ndarray, ...],
                                                                                  np.ndarray, np.ndarray]:
    """``(params, xs, ys)``: Glorot-scaled parameters, a batch of inputs and of targets."""
    n_in, n_hidden, n_out = sizes
    rng = np.random.default_rng(seed)
    params = (rng.standard_normal((n_in, n_hidden)) / np.sqrt(n_in), 0.1 * rng.standard_normal(n_hidden),
              rng.standard_normal((n_hidden, n_out)) / np.sqrt(n_hidden), 0.1 * rng.standard_normal(n_out))
    return params, rng.standard_normal((batch, n_in)), rng.standard_normal((batch, n_out))


def pergrad_reference(params: tuple[np.ndarray, ...], xs: np.ndarray,
                      ys: np.ndarray) -> tuple[np.ndarray, ...]:
    """The per-example gradients (each with a leading batch axis), by the chain rule written out in NumPy."""
    w1, b1, w2, b2 = params
    h = np.tanh(xs @ w1 + b1)
    d = h @ w2 + b2 - ys
    dh = (d @ w2.T) * (1.0 - h * h)
    return np.einsum("bi,bj->bij", xs, dh), dh, np.einsum("bi,bj->bij", h, d), d
