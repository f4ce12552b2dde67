"""The fine-grained benchmark's workloads (bench/finegrained_graphs.py) compute what they claim.

The timings are in ``python bench/run.py finegrained`` (its quick mode takes over a minute, so it is not run here);
this checks the generators the tables rest on: the opgraph graph built from arrays, the CasADi SX expression and the
traced function all give the plain-Python reference's value, the graph-level gradient agrees with central
differences and with CasADi's, values stay bounded, and the RK4 workload agrees across the libraries.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

import opgraph

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import finegrained_graphs as fg

N = 2000


def all_values(d: fg.Dag, x: np.ndarray) -> np.ndarray:
    """Every slot's value, by a loop over the ops in plain Python floats (independent of the generator's replay)."""
    v = [float(t) for t in x]
    for k, a, b in zip(d.kind.tolist(), d.a.tolist(), d.b.tolist(), strict=True):
        p = v[a]
        v.append({fg.ADD: lambda: p + v[b], fg.SUB: lambda: p - v[b], fg.MUL: lambda: p * v[b],
                  fg.SIN: lambda: math.sin(p), fg.COS: lambda: math.cos(p),
                  fg.SCALE: lambda: p * float(fg.CONSTANTS[b])}[k]())
    return np.array(v)


def test_dag_structure_is_as_documented() -> None:
    d = fg.random_dag(N, seed=3)
    slots = np.arange(fg.N_INPUTS, fg.N_INPUTS + N)
    assert (d.a == slots - 1).all()  # every op reads the previous value
    binary = np.isin(d.kind, [fg.ADD, fg.SUB, fg.MUL])
    earlier = d.b[binary]
    assert (earlier < slots[binary] - 1).all() and (earlier >= 0).all()
    # the earlier operand is an input or a sin/cos result
    from_op = earlier[earlier >= fg.N_INPUTS] - fg.N_INPUTS
    assert np.isin(d.kind[from_op], [fg.SIN, fg.COS]).all()
    assert set(np.unique(d.kind).tolist()) == set(range(6))
    np.testing.assert_array_equal(fg.random_dag(N, seed=3).b, d.b)  # seeded


def test_dag_values_stay_bounded_and_graph_matches_reference() -> None:
    d = fg.random_dag(N, seed=1)
    x = fg.dag_input(1)
    values = all_values(d, x)
    assert np.isfinite(values).all() and np.max(np.abs(values)) < 100
    g = fg.dag_graph(d)
    assert g.num_ops == N + fg.N_INPUTS + len(fg.CONSTANTS)
    got = opgraph.compile(g)(x)[0]
    assert got.shape == () and float(got) == pytest.approx(values[-1], rel=1e-12, abs=1e-300)
    assert fg.dag_reference(d, x) == values[-1]


def test_traced_function_is_the_same_dag() -> None:
    d = fg.random_dag(300, seed=2)
    x = fg.dag_input(2)
    assert float(opgraph.jit(fg.dag_traced(d))(x)) == pytest.approx(all_values(d, x)[-1], rel=1e-12)


def test_graph_gradient_matches_central_differences() -> None:
    d = fg.random_dag(500, seed=4)
    x = fg.dag_input(4)
    g = fg.dag_grad_graph(d)
    grad = opgraph.compile(g)(x)[0]
    assert grad.shape == (fg.N_INPUTS,)
    h = 1e-6
    for j in (0, 9, 63):
        e = np.zeros(fg.N_INPUTS)
        e[j] = h
        fd = (all_values(d, x + e)[-1] - all_values(d, x - e)[-1]) / (2 * h)
        assert grad[j] == pytest.approx(fd, abs=1e-6 * max(1.0, abs(fd)))


def test_casadi_builds_the_same_dag_and_gradient() -> None:
    casadi = pytest.importorskip("casadi")
    d = fg.random_dag(N, seed=5)
    x = fg.dag_input(5)
    xs, y = fg.dag_casadi(d)
    value = float(casadi.Function("f", [xs], [y])(x))
    assert value == pytest.approx(all_values(d, x)[-1], rel=1e-12)
    g_casadi = np.ravel(np.array(casadi.Function("g", [xs], [casadi.gradient(y, xs)])(x)))
    g_opgraph = opgraph.compile(fg.dag_grad_graph(d))(x)[0]
    np.testing.assert_allclose(g_opgraph, g_casadi, rtol=1e-10, atol=1e-12 * np.max(np.abs(g_casadi)))


def test_rk4_agrees_across_libraries() -> None:
    import opgraph.numpy as onp

    steps, x0 = 20, fg.rk4_input()
    want = fg.rk4_reference(steps, x0)
    # an independent integration: the same RK4 written on vectors
    def field(s: np.ndarray) -> np.ndarray:
        spring = 0.6 * (s[2] - s[0])
        return np.array([s[1], -9.81 * np.sin(s[0]) - 0.1 * s[1] + spring,
                         s[3], -9.81 * np.sin(s[2]) - 0.1 * s[3] - spring])
    s, h = x0.copy(), fg.RK4_H
    for _ in range(steps):
        k1 = field(s)
        k2 = field(s + h / 2 * k1)
        k3 = field(s + h / 2 * k2)
        k4 = field(s + h * k3)
        s = s + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    np.testing.assert_allclose(want, s, rtol=1e-12)
    got = opgraph.jit(lambda x: onp.stack(list(fg.rk4(steps, onp.sin)(x))))(x0)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    casadi = pytest.importorskip("casadi")
    xs = casadi.SX.sym("x", 4)
    f = casadi.Function("f", [xs], [casadi.vertcat(*fg.rk4(steps, casadi.sin)(xs))])
    np.testing.assert_allclose(np.ravel(np.array(f(x0))), want, rtol=1e-12)
