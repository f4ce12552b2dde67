"""Optimisers as graph ops, update edges and the step runner."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph
from opgraph.optim import SGD, Adagrad, Adam, Momentum, StepRunner, training_step


def _quadratic(opt: object) -> tuple[StepRunner, np.ndarray]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 3))
    b = opgraph.GraphBuilder()
    w = b.input(("float64", (3,)), name="w")
    t = b.input(("float64", (5,)), name="t")
    loss = b.mean(b.square(b.subtract(b.matmul(b.const(a), w), t)))
    step = training_step(b, loss, [w], opt)  # type: ignore[arg-type]
    return StepRunner(step, {"w": np.zeros(3)}), a


def _reference(opt: object, a: np.ndarray, target: np.ndarray, n: int) -> np.ndarray:
    w = np.zeros(3)
    s1, s2 = np.zeros(3), np.zeros(3)
    if isinstance(opt, Adagrad):
        s1 = np.full(3, opt.initial_accumulator_value)
    for k in range(1, n + 1):
        g = 2 * a.T @ (a @ w - target) / len(target)
        if isinstance(opt, SGD):
            w = w - opt.lr * g
        elif isinstance(opt, Momentum):
            s1 = opt.mu * s1 + g
            w = w - opt.lr * s1
        elif isinstance(opt, Adagrad):
            s1 = s1 + g * g  # optax.adagrad: eps inside the root
            w = w - opt.lr * g / np.sqrt(s1 + opt.eps)
        elif isinstance(opt, Adam):
            s1 = opt.beta1 * s1 + (1 - opt.beta1) * g
            s2 = opt.beta2 * s2 + (1 - opt.beta2) * g * g
            mh, vh = s1 / (1 - opt.beta1 ** k), s2 / (1 - opt.beta2 ** k)
            w = w - opt.lr * mh / (np.sqrt(vh) + opt.eps)
    return w


@pytest.mark.parametrize("opt", [SGD(0.1), Momentum(0.05, 0.9), Adagrad(0.3), Adam(0.05)])
def test_optimisers_match_textbook_formulas(opt: object) -> None:
    run, a = _quadratic(opt)
    target = np.arange(5.0)
    losses = [float(run({"t": target})[0]) for _ in range(25)]
    np.testing.assert_allclose(run.value("w"), _reference(opt, a, target, 25), rtol=1e-12, atol=1e-14)
    assert losses[-1] < losses[0]


def test_step_graph_has_update_edges_and_saves(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from opgraph.io import load, save

    b = opgraph.GraphBuilder()
    w = b.input(("float32", (2, 2)), name="w")
    x = b.input(("float32", (4, 2)), name="x")
    loss = b.sum(b.square(b.matmul(x, w)))
    step = training_step(b, loss, [w], Adam())
    g = step.graph
    names = {g.value_label(int(d)).lstrip("%") for _, d in g.updates}
    assert names == {"w", "w.m", "w.v", "adam.t"}
    assert step.params == ["w"] and step.feeds == ["x"]
    assert set(step.state) == {"w.m", "w.v", "adam.t"}
    g.verify()
    save(g, tmp_path / "step.cg")
    assert load(tmp_path / "step") == g
    run = StepRunner(load(tmp_path / "step"), {"w": np.eye(2), **step.state})
    run({"x": np.ones((4, 2), np.float32)})
    assert run.value("adam.t") == 1.0
    assert run.value("w").dtype == np.float32


def test_runner_needs_initial_values_and_params_must_be_inputs() -> None:
    b = opgraph.GraphBuilder()
    w = b.input(("float64", ()), name="w")
    loss = b.square(w)
    with pytest.raises(opgraph.GraphError, match="not an input"):
        training_step(b, loss, [loss], SGD())
    step = training_step(b, loss, [w], Momentum())
    with pytest.raises(opgraph.GraphError, match="no initial value"):
        StepRunner(step.graph, {"w": 1.0})
    run = StepRunner(step, {"w": 1.0})
    run({})
    assert float(run.value("w")) == pytest.approx(1.0 - 0.01 * 2.0)
    assert set(run.values) == {"w", "w.v"}


@pytest.mark.parametrize("opt", [SGD(0.1), Momentum(0.05, 0.9), Adagrad(0.3), Adam(0.05)])
def test_step_graph_optimised_and_compiled_matches_runner(opt: object) -> None:
    # Gradient and update ops are ordinary ops: the optimiser and the compiled runtime take them as they are.
    from opgraph.passes import optimize
    from opgraph.runtime.compiled import compile

    run, _ = _quadratic(opt)
    graph = run.graph
    fast = compile(optimize(graph))
    target = np.arange(5.0)
    first = {"t": target, "w": np.zeros(3), **{k: v for k, v in run.values.items() if k != "w"}}
    for i in range(5):
        (want,) = run({"t": target})
        (got,) = fast(first if i == 0 else {"t": target})
        np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(fast.state("w"), run.value("w"), rtol=1e-12)
