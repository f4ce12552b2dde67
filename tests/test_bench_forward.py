"""The workloads of issue 37's benchmarks (bench/forward_workloads.py), once each at a tiny size, untimed.

``python bench/run.py forward`` times them; this checks that what it times computes the right thing: opgraph's
``jit`` of ``hvp``, of ``jacfwd`` (the loop as a ``scan`` and unrolled) and of ``vmap(grad)`` on the numpy engine
against JAX's same transforms, and the CasADi functions and the references the benchmark checks with against
JAX too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import opgraph
import opgraph.numpy as onp

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)  # as opgraph's JAX backend does: compare in float64
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import forward_workloads as wl  # noqa: E402


def test_hvp_of_least_squares_loss_matches_jax_and_scipy() -> None:
    x, v = wl.nls_inputs(40, seed=1)
    got = opgraph.jit(lambda x, v: opgraph.hvp(wl.nls_loss(onp), (x,), (v,)))(x, v)
    loss = wl.nls_loss(jnp)
    want = jax.jvp(jax.grad(loss), (x,), (v,))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    ref_grad, ref_hv = wl.nls_reference(x, v)  # SciPy's closed forms: the benchmark's check
    np.testing.assert_allclose(want[0], ref_grad, rtol=1e-12)
    np.testing.assert_allclose(want[1], ref_hv, rtol=1e-12)


@pytest.mark.parametrize("looped", [True, False], ids=["scan", "unrolled"])
def test_jacfwd_of_rk4_trajectory_matches_jax(looped: bool) -> None:
    steps = 4
    sim = wl.ode_simulate(onp, steps, opgraph.scan if looped else None)
    got = opgraph.jit(opgraph.jacfwd(sim))(wl.PARAMS)
    want = jax.jacfwd(wl.ode_simulate(jnp, steps, jax.lax.scan if looped else None))(wl.PARAMS)
    assert got.shape == (steps, 2, 3)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(want, wl.ode_reference(steps), rtol=1e-6)  # the benchmark's central differences


def test_casadi_functions_match_jax() -> None:
    casadi = pytest.importorskip("casadi")
    assert casadi.Function  # the bench extra's peer
    x, v = wl.nls_inputs(12, seed=2)
    hv = np.asarray(wl.nls_casadi(12)(x, v)).ravel()
    np.testing.assert_allclose(hv, jax.jvp(jax.grad(wl.nls_loss(jnp)), (x,), (v,))[1], rtol=1e-12)
    jac = np.asarray(wl.ode_casadi(3)(wl.PARAMS))
    want = jax.jacfwd(wl.ode_simulate(jnp, 3))(wl.PARAMS)
    np.testing.assert_allclose(jac, np.asarray(want).reshape(6, 3), rtol=1e-12, atol=1e-12)


def test_per_example_gradients_match_jax_vmap() -> None:
    params, xs, ys = wl.mlp_inputs(5, (3, 4, 2), seed=3)
    got = opgraph.jit(opgraph.vmap(opgraph.grad(wl.mlp_loss(onp)), in_axes=(None, 0, 0)))(params, xs, ys)
    want = jax.vmap(jax.grad(wl.mlp_loss(jnp)), in_axes=(None, 0, 0))(params, xs, ys)
    assert len(got) == 4
    for g, w, r in zip(got, want, wl.pergrad_reference(params, xs, ys), strict=True):
        assert g.shape == (5, *np.shape(r)[1:])
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(w, r, rtol=1e-12, atol=1e-12)
