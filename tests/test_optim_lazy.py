"""Training models written with lazy arrays (opgraph.numpy): the lazy-loss and loss-function forms of
training_step, against hand-written NumPy gradients and optimisers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import opgraph
import opgraph.numpy as onp
from opgraph.backends.numpy import CompiledGraph
from opgraph.optim import SGD, Adagrad, Adam, Momentum, Optimizer, StepRunner, Trainer, TrainingStep, training_step
from opgraph.runtime.compiled import Program

RTOL, ATOL = 1e-10, 1e-12
OPTIMISERS = [SGD(0.1), Momentum(0.05, 0.9), Adagrad(0.3), Adam(0.05)]
IDS = ["sgd", "momentum", "adagrad", "adam"]
N, D, H = 16, 4, 6


# ---------------------------------------------------------------- independent references
class RefOptimiser:
    """The textbook update rules, in NumPy, over dicts of arrays."""

    def __init__(self, opt: Optimizer) -> None:
        self.opt, self.t, self.s1, self.s2 = opt, 0, {}, {}

    def update(self, p: dict[str, np.ndarray], g: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        o, self.t = self.opt, self.t + 1
        out = {}
        for k in p:
            s1 = self.s1.get(k, np.full_like(p[k], o.initial_accumulator_value) if isinstance(o, Adagrad)
                             else np.zeros_like(p[k]))
            s2 = self.s2.get(k, np.zeros_like(p[k]))
            if isinstance(o, SGD):
                out[k] = p[k] - o.lr * g[k]
            elif isinstance(o, Momentum):
                s1 = o.mu * s1 + g[k]
                out[k] = p[k] - o.lr * s1
            elif isinstance(o, Adagrad):
                s1 = s1 + g[k] * g[k]
                out[k] = p[k] - o.lr * g[k] / np.sqrt(s1 + o.eps)  # optax.adagrad: eps inside the root
            elif isinstance(o, Adam):
                s1 = o.beta1 * s1 + (1 - o.beta1) * g[k]
                s2 = o.beta2 * s2 + (1 - o.beta2) * g[k] * g[k]
                mh, vh = s1 / (1 - o.beta1 ** self.t), s2 / (1 - o.beta2 ** self.t)
                out[k] = p[k] - o.lr * mh / (np.sqrt(vh) + o.eps)
            self.s1[k], self.s2[k] = s1, s2
        return out


def linear_ref(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    r = x @ p["w"] + p["b"] - y
    dr = 2 * r / len(y)
    return float(np.mean(r * r)), {"w": x.T @ dr, "b": np.sum(dr)}


def logistic_ref(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    z = x @ p["w"] + p["b"]
    dz = (1 / (1 + np.exp(-z)) - y) / len(y)
    return float(np.mean(np.log1p(np.exp(z)) - y * z)), {"w": x.T @ dz, "b": np.sum(dz)}


def mlp_ref(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    h = np.tanh(x @ p["w1"] + p["b1"])
    r = h @ p["w2"] + p["b2"] - y
    dr = 2 * r / r.size
    dpre = (dr @ p["w2"].T) * (1 - h * h)
    return float(np.mean(r * r)), {"w1": x.T @ dpre, "b1": dpre.sum(0), "w2": h.T @ dr, "b2": dr.sum(0)}


# ---------------------------------------------------------------- the same models with opgraph.numpy
def linear(p: dict[str, Any], x: Any, y: Any) -> Any:
    return onp.mean(onp.square(x @ p["w"] + p["b"] - y))


def logistic(p: dict[str, Any], x: Any, y: Any) -> Any:
    z = x @ p["w"] + p["b"]
    return onp.mean(onp.log1p(onp.exp(z)) - y * z)


def mlp(p: dict[str, Any], x: Any, y: Any) -> Any:
    h = onp.tanh(x @ p["w1"] + p["b1"])
    return onp.mean(onp.square(h @ p["w2"] + p["b2"] - y))


def problem(name: str, seed: int = 0) -> tuple[Callable[..., Any], Callable[..., Any], dict[str, np.ndarray],
                                               list[tuple[np.ndarray, np.ndarray]]]:
    """Model, reference, initial parameters and a few mini-batches."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((N, D)) for _ in range(6)]
    if name == "mlp":
        p0 = {"w1": rng.standard_normal((D, H)) * 0.5, "b1": rng.standard_normal(H) * 0.1,
              "w2": rng.standard_normal((H, 2)) * 0.5, "b2": np.zeros(2)}
        return mlp, mlp_ref, p0, [(x, np.stack([np.sin(x[:, 0]), x[:, 1] * x[:, 2]], 1)) for x in xs]
    p0 = {"w": rng.standard_normal(D) * 0.3, "b": np.array(0.1)}
    if name == "logistic":
        return logistic, logistic_ref, p0, [(x, (x @ np.arange(D) > 0).astype(float)) for x in xs]
    return linear, linear_ref, p0, [(x, x @ np.arange(D) + 1.0) for x in xs]


def reference_run(ref: Callable[..., Any], opt: Optimizer, p0: dict[str, np.ndarray],
                  batches: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[float, dict[str, np.ndarray]]]:
    """(loss before the step, parameters after it) for each step."""
    ro, p, out = RefOptimiser(opt), dict(p0), []
    for x, y in batches:
        loss, g = ref(p, x, y)
        p = ro.update(p, g)
        out.append((loss, p))
    return out


def close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL, err_msg=k)


MODELS = ["linear", "logistic", "mlp"]


# ---------------------------------------------------------------- the lazy-loss form
def lazy_loss(model: Callable[..., Any], p0: dict[str, np.ndarray]) -> tuple[Any, dict[str, Any]]:
    params = {k: onp.placeholder(v.shape, v.dtype, name=k) for k, v in p0.items()}
    x = onp.placeholder((N, D), name="x")
    y = onp.placeholder((N,) if model is not mlp else (N, 2), name="y")
    return model(params, x, y), params


@pytest.mark.parametrize("opt", OPTIMISERS, ids=IDS)
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("backend", [None, "numpy"], ids=["executor", "compiled"])
def test_lazy_loss_form_matches_reference(name: str, opt: Optimizer, backend: str | None) -> None:
    model, ref, p0, batches = problem(name)
    loss, params = lazy_loss(model, p0)
    step = training_step(loss, params, opt)
    assert isinstance(step, TrainingStep)
    assert step.params == list(p0) and step.feeds == ["x", "y"]
    run = StepRunner(step, p0, backend=backend)
    for (x, y), (want_loss, want) in zip(batches, reference_run(ref, opt, p0, batches), strict=True):
        (got_loss,) = run({"x": x, "y": y})
        assert float(got_loss) == pytest.approx(want_loss, rel=RTOL)
        close({k: run.value(k) for k in p0}, want)


def test_lazy_parameters_given_as_constants_carry_their_initial_value() -> None:
    _, ref, p0, batches = problem("linear")
    w, b = onp.asarray(p0["w"]), onp.asarray(p0["b"])
    x, y = onp.placeholder((N, D), name="x"), onp.placeholder((N,), name="y")
    step = training_step(onp.mean(onp.square(x @ w + b - y)), {"w": w, "b": b}, Momentum(0.05, 0.9))
    assert set(step.initial) == {"w", "b"}
    run = StepRunner(step, backend="numpy")  # no initial values needed
    for (xb, yb), (_, want) in zip(batches, reference_run(ref, Momentum(0.05, 0.9), p0, batches), strict=True):
        run({"x": xb, "y": yb})
        close({k: run.value(k) for k in p0}, want)


def test_builder_with_a_lazy_loss() -> None:
    # The call that used to fail with AttributeError: 'LazyArray' object has no attribute 'id'.
    _, ref, p0, batches = problem("linear")
    loss, params = lazy_loss(linear, p0)
    step = training_step(opgraph.GraphBuilder(), loss, [params["w"], params["b"]], SGD(0.1))
    run = StepRunner(step, p0)
    for (xb, yb), (_, want) in zip(batches, reference_run(ref, SGD(0.1), p0, batches), strict=True):
        run({"x": xb, "y": yb})
        close({k: run.value(k) for k in p0}, want)


def test_lazy_step_graph_has_update_edges_and_extra_outputs() -> None:
    _, _, p0, batches = problem("mlp")
    loss, params = lazy_loss(mlp, p0)
    norm = onp.sum(onp.square(params["w1"]))
    step = training_step(loss, params, Adam(0.01), outputs=[norm])
    g = step.graph
    g.verify()
    dests = {g.value_label(int(d)).lstrip("%") for _, d in g.updates}
    assert dests == set(p0) | {f"{k}.{s}" for k in p0 for s in "mv"} | {"adam.t"}
    run = StepRunner(step, p0, backend="numpy")
    loss_v, norm_v = run({"x": batches[0][0], "y": batches[0][1]})
    np.testing.assert_allclose(norm_v, np.sum(p0["w1"] ** 2), rtol=1e-12)
    np.testing.assert_allclose(loss_v, mlp_ref(p0, *batches[0])[0], rtol=1e-12)


# ---------------------------------------------------------------- the loss-function form
def train(trainer: Trainer, batches: list[tuple[np.ndarray, np.ndarray]], ref_steps: list[Any]) -> None:
    for (x, y), (want_loss, want) in zip(batches, ref_steps, strict=True):
        got_loss = trainer(x, y)
        assert float(got_loss) == pytest.approx(want_loss, rel=RTOL)
        close(trainer.params, want)


@pytest.mark.parametrize("opt", OPTIMISERS, ids=IDS)
@pytest.mark.parametrize("name", MODELS)
def test_function_form_matches_reference(name: str, opt: Optimizer) -> None:
    model, ref, p0, batches = problem(name)
    trainer = training_step(model, p0, opt, *batches[0])
    assert isinstance(trainer, Trainer)
    train(trainer, batches, reference_run(ref, opt, p0, batches))
    assert trainer.cache_size == 1


@pytest.mark.parametrize("wrap", ["function", "value_and_grad", "grad_of_function"])
def test_function_form_accepts_traced_and_gradient_functions(wrap: str) -> None:
    _, ref, p0, batches = problem("mlp")
    fn: Any = {"function": opgraph.function(mlp), "value_and_grad": opgraph.value_and_grad(mlp),
               "grad_of_function": opgraph.grad(opgraph.function(mlp))}[wrap]
    trainer = training_step(fn, p0, Adam(0.02), *batches[0])
    train(trainer, batches, reference_run(ref, Adam(0.02), p0, batches))


def test_nested_pytree_parameters_keep_their_structure() -> None:
    _, ref, p0, batches = problem("mlp")

    def layered(p: list[tuple[Any, Any]], x: Any, y: Any) -> Any:
        (w1, b1), (w2, b2) = p
        return mlp({"w1": w1, "b1": b1, "w2": w2, "b2": b2}, x, y)

    params = [(p0["w1"], p0["b1"]), (p0["w2"], p0["b2"])]
    trainer = training_step(layered, params, Momentum(0.05, 0.9), *batches[0])
    assert set(trainer.step.params) == {"param0/0", "param0/1", "param1/0", "param1/1"}
    ref_steps = reference_run(ref, Momentum(0.05, 0.9), p0, batches)
    for (x, y), (_, want) in zip(batches, ref_steps, strict=True):
        trainer(x, y)
        got = trainer.params
        assert isinstance(got, list) and all(isinstance(t, tuple) for t in got)
        close({"w1": got[0][0], "b1": got[0][1], "w2": got[1][0], "b2": got[1][1]}, want)


def test_state_is_carried_by_update_edges_of_the_compiled_program(monkeypatch: pytest.MonkeyPatch) -> None:
    import opgraph.runtime.executor as executor

    _, ref, p0, batches = problem("logistic")
    trainer = training_step(logistic, p0, Adam(0.05), *batches[0])
    g = trainer.graph
    dests = {g.value_label(int(d)).lstrip("%") for _, d in g.updates}
    assert dests == {"w", "b", "w.m", "w.v", "b.m", "b.v", "adam.t"}
    assert {g.value_label(int(v)).lstrip("%") for v in g.inputs} == dests | {"x", "y"}
    compiled = trainer.runner.compiled
    assert isinstance(compiled, Program) and isinstance(compiled.arena_runtime, CompiledGraph)

    def no_executor(*a: Any, **k: Any) -> Any:
        raise AssertionError("the reference executor ran a training step")

    monkeypatch.setattr(executor, "execute", no_executor)
    calls = compiled.kernel_calls
    train(trainer, batches, reference_run(ref, Adam(0.05), p0, batches))
    assert compiled.kernel_calls == calls + len(batches) * len(compiled.program)
    # the program holds the state: what it will read next is what trainer.params reports
    np.testing.assert_array_equal(compiled.state("w"), trainer.params["w"])
    assert float(compiled.state("adam.t")) == len(batches) == float(trainer.state["adam.t"])


def test_new_batch_shape_traces_again_and_keeps_training() -> None:
    _, ref, p0, batches = problem("mlp")
    batches = batches[:3] + [(x[:5], y[:5]) for x, y in batches[3:]]  # smaller last batches
    trainer = training_step(mlp, p0, Adam(0.02), *batches[0])
    train(trainer, batches, reference_run(ref, Adam(0.02), p0, batches))
    assert trainer.cache_size == 2
    assert trainer.graph.type_of(trainer.graph.find_value("x")).shape == (5, D)


def test_setting_parameters_restarts_from_them() -> None:
    _, ref, p0, batches = problem("linear")
    trainer = training_step(linear, p0, SGD(0.1), *batches[0])
    trainer(*batches[0])
    p1 = {"w": np.ones(D), "b": np.array(-1.0)}
    trainer.params = p1
    close(trainer.params, p1)
    train(trainer, batches[1:], reference_run(ref, SGD(0.1), p1, batches[1:]))


def test_static_arguments_are_baked_in() -> None:
    _, _, p0, batches = problem("linear")

    def ridge(p: dict[str, Any], x: Any, y: Any, lam: float) -> Any:
        return linear(p, x, y) + lam * onp.sum(onp.square(p["w"]))

    trainer = training_step(ridge, p0, SGD(0.1), *batches[0], 0.5)
    p = dict(p0)
    for x, y in batches:
        trainer(x, y, 0.5)
        _, g = linear_ref(p, x, y)
        p = {"w": p["w"] - 0.1 * (g["w"] + 2 * 0.5 * p["w"]), "b": p["b"] - 0.1 * g["b"]}
        close(trainer.params, p)


# ---------------------------------------------------------------- errors
def test_a_parameter_the_loss_does_not_use_is_named() -> None:
    _, _, p0, batches = problem("linear")
    with pytest.raises(opgraph.GraphError, match="does not depend on parameter 'unused'"):
        training_step(linear, {**p0, "unused": np.zeros(3)}, SGD(), *batches[0])
    loss, params = lazy_loss(linear, p0)
    with pytest.raises(opgraph.GraphError, match="does not depend on parameter 'extra'"):
        training_step(loss, {**params, "extra": onp.placeholder((2,))}, SGD())


def test_a_non_scalar_loss_is_an_error() -> None:
    _, _, p0, batches = problem("linear")
    with pytest.raises(opgraph.GraphError, match=r"must be a scalar, but it is f64\[16\]"):
        training_step(lambda p, x, y: onp.square(x @ p["w"] + p["b"] - y), p0, SGD(), *batches[0])
    w = onp.placeholder((3,), name="w")
    with pytest.raises(opgraph.GraphError, match="must be a scalar"):
        training_step(w * 2.0, [w], SGD())


def test_bad_parameters_are_named() -> None:
    _, _, p0, batches = problem("linear")
    with pytest.raises(opgraph.GraphError, match="parameter 'n' has dtype int64"):
        training_step(lambda p, x, y: linear(p, x, y) * p["n"], {**p0, "n": np.array(2)}, SGD(), *batches[0])
    with pytest.raises(opgraph.GraphError, match="parameter 'cfg' is a str"):
        training_step(linear, {**p0, "cfg": "relu"}, SGD(), *batches[0])
    w = onp.placeholder((3,), name="w")
    with pytest.raises(opgraph.GraphError, match="parameter 'v' is computed by a multiply op"):
        training_step(onp.sum(w * 2.0), {"v": w * 2.0}, SGD())
    with pytest.raises(opgraph.GraphError, match="parameter 'w' is a ndarray, not a lazy array"):
        training_step(onp.sum(w * 2.0), {"w": np.ones(3)}, SGD())
    with pytest.raises(opgraph.GraphError, match="data placeholder is named 'w'"):
        training_step(onp.sum(w * onp.placeholder((3,), name="w")), {"w": w}, SGD())


def test_mismatched_parameter_trees_are_named() -> None:
    _, _, p0, batches = problem("linear")
    trainer = training_step(linear, p0, SGD(), *batches[0])
    with pytest.raises(opgraph.GraphError, match="missing 'b'"):
        trainer.params = {"w": p0["w"]}
    with pytest.raises(opgraph.GraphError, match="unexpected 'c'"):
        trainer.params = {**p0, "c": np.zeros(1)}
    with pytest.raises(opgraph.GraphError, match=r"parameter 'w' has shape \(4,\); the new value has shape \(5,\)"):
        trainer.params = {"w": np.zeros(5), "b": p0["b"]}
    close(trainer.params, p0)  # nothing changed
    step = training_step(*lazy_loss(linear, p0), SGD())
    with pytest.raises(opgraph.GraphError, match=r"'w' has type f64\[4\]; the value given has shape \(3,\)"):
        StepRunner(step, {**p0, "w": np.zeros(3)})
    with pytest.raises(opgraph.GraphError, match="no initial value for update destination"):
        StepRunner(step, {"w": p0["w"]})


def test_wrong_arguments_and_wrappers_are_errors() -> None:
    _, _, p0, batches = problem("linear")
    with pytest.raises(TypeError, match="cannot take 1 data argument"):
        training_step(linear, p0, SGD(), batches[0][0])
    with pytest.raises(opgraph.GraphError, match="argnums=1"):
        training_step(opgraph.value_and_grad(linear, argnums=1), p0, SGD(), *batches[0])
    with pytest.raises(TypeError, match=r"must be an opgraph\.optim\.Optimizer"):
        training_step(linear, p0, 0.1, *batches[0])
