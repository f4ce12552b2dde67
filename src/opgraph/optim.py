"""Training: optimisers as ordinary graph ops, update edges, and a small step runner.

:func:`training_step` takes a builder holding a loss, the parameter inputs and
an optimiser; it appends the gradient ops (:mod:`opgraph.autodiff`), the
optimiser's update ops (plain elementwise ops in the textbook forms, so the
optimiser passes can fuse them) and one *update edge* per parameter and
optimiser state (after a call, the new value becomes the input's value for
the next call). The result is one training-step graph.

:class:`StepRunner` runs such a graph with the reference executor and carries
the update-edge values from call to call (a stand-in for the compiled runtime,
which applies update edges natively).

    >>> import numpy as np, opgraph
    >>> from opgraph.optim import SGD, StepRunner, training_step
    >>> b = opgraph.GraphBuilder()
    >>> w = b.input(("float64", (2,)), name="w")
    >>> x = b.input(("float64", (2,)), name="x")
    >>> loss = b.sum(b.square(b.subtract(w, x)))
    >>> step = training_step(b, loss, [w], SGD(lr=0.25))
    >>> run = StepRunner(step, {"w": np.zeros(2)})
    >>> for _ in range(3):
    ...     _ = run({"x": np.array([1.0, 2.0])})
    >>> run.value("w")
    array([0.875, 1.75 ])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph.autodiff import build_grad_ops
from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Graph, Value
from opgraph.errors import GraphError

__all__ = ["SGD", "Adagrad", "Adam", "Momentum", "Optimizer", "StepRunner", "TrainingStep", "training_step"]


class Optimizer:
    """Base class: ``apply(b, param, grad, state_input)`` appends the update ops.

    ``state_input(suffix, shape)`` declares a state input (zeros initially) and
    returns ``(value, set)``, where ``set(new)`` records its update edge.
    ``global_state`` optimisers (Adam's step count) use ``state_input`` with
    a scalar shape.
    """

    def apply(self, b: GraphBuilder, param: Value, grad: Value, state: Any) -> Value:
        """Return the new parameter value."""
        raise NotImplementedError


@dataclass
class SGD(Optimizer):
    """Plain gradient descent: ``p = p - lr * g``.

    >>> SGD(0.1)
    SGD(lr=0.1)
    """

    lr: float = 0.01

    def apply(self, b: GraphBuilder, param: Value, grad: Value, state: Any) -> Value:
        return b.subtract(param, b.multiply(grad, self.lr))


@dataclass
class Momentum(Optimizer):
    """Heavy-ball momentum: ``v = mu * v + g; p = p - lr * v``.

    >>> Momentum(0.1, 0.9).mu
    0.9
    """

    lr: float = 0.01
    mu: float = 0.9

    def apply(self, b: GraphBuilder, param: Value, grad: Value, state: Any) -> Value:
        v, set_v = state("v")
        v_new = b.add(b.multiply(v, self.mu), grad)
        set_v(v_new)
        return b.subtract(param, b.multiply(v_new, self.lr))


@dataclass
class Adagrad(Optimizer):
    """Adagrad: ``acc = acc + g * g; p = p - lr * g / (sqrt(acc) + eps)``.

    >>> Adagrad().eps
    1e-10
    """

    lr: float = 0.01
    eps: float = 1e-10

    def apply(self, b: GraphBuilder, param: Value, grad: Value, state: Any) -> Value:
        acc, set_acc = state("acc")
        acc_new = b.add(acc, b.multiply(grad, grad))
        set_acc(acc_new)
        return b.subtract(param, b.divide(b.multiply(grad, self.lr), b.add(b.sqrt(acc_new), self.eps)))


@dataclass
class Adam(Optimizer):
    """Adam with bias correction (Kingma and Ba): with step count ``t`` (starting at 1),
    ``m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g; m^ = m / (1 - b1^t); v^ = v / (1 - b2^t);
    p = p - lr m^ / (sqrt(v^) + eps)``.

    >>> Adam().beta2
    0.999
    """

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def apply(self, b: GraphBuilder, param: Value, grad: Value, state: Any) -> Value:
        t, set_t = state("t", shared=True)
        t_new = b.add(t, 1.0)
        set_t(t_new)
        m, set_m = state("m")
        v, set_v = state("v")
        m_new = b.add(b.multiply(m, self.beta1), b.multiply(grad, 1.0 - self.beta1))
        v_new = b.add(b.multiply(v, self.beta2), b.multiply(b.multiply(grad, grad), 1.0 - self.beta2))
        set_m(m_new)
        set_v(v_new)
        dt = param.dtype
        m_hat = b.divide(m_new, b.subtract(np.array(1.0, dt), b.power(np.array(self.beta1, dt), t_new)))
        v_hat = b.divide(v_new, b.subtract(np.array(1.0, dt), b.power(np.array(self.beta2, dt), t_new)))
        return b.subtract(param, b.divide(b.multiply(m_hat, self.lr), b.add(b.sqrt(v_hat), self.eps)))


@dataclass
class TrainingStep:
    """A training-step graph and what is needed to run it.

    * ``graph``: outputs are the loss then any extra outputs; update edges
      carry the parameters and optimiser state;
    * ``params``: names of the parameter inputs; ``state``: names and initial
      values (zeros) of the optimiser-state inputs;
    * ``feeds``: names of the other inputs (data), fed at every call.
    """

    graph: Graph
    params: list[str]
    state: dict[str, np.ndarray] = field(default_factory=dict)
    feeds: list[str] = field(default_factory=list)


def _name(b: GraphBuilder, v: Value, i: int) -> str:
    name = b.name_of(v.id)
    if name is None:
        name = f"param{i}"
        b.name(v, name)
    return name


def training_step(b: GraphBuilder, loss: Value, params: Sequence[Value], optimizer: Optimizer,
                  *, outputs: Sequence[Value] = ()) -> TrainingStep:
    """Append gradients, optimiser updates and update edges for ``params`` to ``b``; freeze the step graph.

    ``params`` must be inputs of ``b`` (they are given names ``param<i>`` if
    unnamed). The graph's outputs are ``loss`` then ``outputs``.
    """
    for p in params:
        if b.producer_of(p.id) is not None:
            raise GraphError(f"parameter {p} is not an input of the builder")
    names = [_name(b, p, i) for i, p in enumerate(params)]
    grads = build_grad_ops(b, loss, list(params))
    state: dict[str, np.ndarray] = {}
    shared: dict[str, tuple[Value, Any]] = {}
    pending: list[tuple[Value, Value]] = []
    for p, g, name in zip(params, grads, names, strict=True):

        def state_input(suffix: str, shared_: bool = False, *, _p: Value = p, _name: str = name,
                        **kw: Any) -> tuple[Value, Any]:
            shared_ = shared_ or kw.get("shared", False)
            if shared_ and suffix in shared:
                return shared[suffix]
            full = f"{type(optimizer).__name__.lower()}.{suffix}" if shared_ else f"{_name}.{suffix}"
            t = b.type_of(_p.id) if not shared_ else type(b.type_of(_p.id))(b.type_of(_p.id).dtype, ())
            v = b.input(t, name=full)
            state[full] = np.zeros(t.shape, t.dtype)
            done: list[bool] = []

            def set_(new: Value) -> None:
                if not done:
                    pending.append((new, v))
                    done.append(True)

            if shared_:
                shared[suffix] = (v, set_)
            return v, set_

        new_p = optimizer.apply(b, p, g, state_input)
        pending.append((new_p, p))
    for src, dst in pending:
        b.update(src, dst)
    b.output(loss, *outputs)
    graph = b.freeze()
    special = set(names) | set(state)
    feeds = [graph.symbols.values.get(int(v)) or f"%{int(v)}" for v in graph.inputs
             if graph.symbols.values.get(int(v)) not in special]
    return TrainingStep(graph, names, state, feeds)


class StepRunner:
    """Runs a step graph with :func:`opgraph.runtime.executor.execute`, carrying update edges.

    ``initial`` gives the parameters' (and optionally the state's) starting
    values by name; optimiser state defaults to the step's zeros. Each call
    feeds the data inputs, runs the outputs and the update sources, and keeps
    the sources' results as the destinations' values for the next call.
    """

    def __init__(self, step: TrainingStep | Graph, initial: Mapping[str, Any]) -> None:
        self.graph = step.graph if isinstance(step, TrainingStep) else step
        g = self.graph
        self._values: dict[int, np.ndarray] = {}
        defaults = step.state if isinstance(step, TrainingStep) else {}
        for name, arr in {**defaults, **initial}.items():
            self._values[g.find_value(name)] = np.array(arr, dtype=g.type_of(g.find_value(name)).dtype)
        self._updates = [(int(s), int(d)) for s, d in g.updates]
        missing = [g.value_label(d) for _, d in self._updates if d not in self._values]
        if missing:
            raise GraphError(f"no initial value for update destination(s) {', '.join(missing)}")
        self._targets = [int(v) for v in g.outputs] + [s for s, _ in self._updates]

    def __call__(self, feeds: Mapping[Any, Any]) -> list[np.ndarray]:
        """Run one step; return the graph's outputs."""
        from opgraph.runtime.executor import execute

        results = execute(self.graph, {**self._values, **feeds}, self._targets)
        n = len(self.graph.outputs)
        for (_, dst), r in zip(self._updates, results[n:], strict=True):
            self._values[dst] = r
        return results[:n]

    def value(self, name: str) -> np.ndarray:
        """Current value of a parameter or state input."""
        return self._values[self.graph.find_value(name)]

    @property
    def values(self) -> dict[str, np.ndarray]:
        """Current values of every carried input, by name (or ``%id``)."""
        return {self.graph.value_label(v).lstrip("%"): a for v, a in self._values.items()}
