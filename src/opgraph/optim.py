"""Training: optimisers as ordinary graph ops, update edges, and a small step runner.

:func:`training_step` takes a builder holding a loss, the parameter inputs and
an optimiser; it appends the gradient ops (:mod:`opgraph.autodiff`), the
optimiser's update ops (plain elementwise ops in the textbook forms, so the
optimiser passes can fuse them) and one *update edge* per parameter and
optimiser state (after a call, the new value becomes the input's value for
the next call). The result is one training-step graph.

:class:`StepRunner` runs such a graph with the reference executor and carries
the update-edge values from call to call (a stand-in for the compiled runtime,
which applies update edges natively; ``StepRunner(step, backend="numpy")``
runs the step on the compiled runtime instead).

The same :func:`training_step` takes a model written with lazy arrays
(:mod:`opgraph.numpy`): a lazy scalar ``loss`` and the lazy parameters it was
built from, or (JAX style) a loss function ``loss_fn(params, *data)`` with a
pytree (dicts, lists, tuples) of initial parameter values, which gives a
:class:`Trainer`: ``trainer(*data)`` runs one compiled step and returns the
loss, ``trainer.params`` are the current parameters.

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

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph.autodiff import build_grad_ops
from opgraph.core.builder import GraphBuilder
from opgraph.core.feeds import value_id
from opgraph.core.graph import Graph, Value
from opgraph.errors import GraphError
from opgraph.frontend import lazy, pytree
from opgraph.frontend.lazy import LazyArray
from opgraph.frontend.trace import is_array

__all__ = ["SGD", "Adagrad", "Adam", "Momentum", "Optimizer", "StepRunner", "Trainer", "TrainingStep",
           "training_step"]


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
    * ``feeds``: names of the other inputs (data), fed at every call;
    * ``initial``: starting values of parameters that came with one (lazy
      constants made parameters); :class:`StepRunner` uses them by default.
    """

    graph: Graph
    params: list[str]
    state: dict[str, np.ndarray] = field(default_factory=dict)
    feeds: list[str] = field(default_factory=list)
    initial: dict[str, np.ndarray] = field(default_factory=dict)


def _name(b: GraphBuilder, v: Value, i: int) -> str:
    name = b.name_of(v.id)
    if name is None:
        name = f"param{i}"
        b.name(v, name)
    return name


def training_step(model: GraphBuilder | LazyArray | Callable[..., Any], *args: Any, outputs: Sequence[Any] = (),
                  backend: str = "numpy") -> Any:
    """A training step: gradients, optimiser updates and update edges, for each way of writing a model.

    * ``training_step(b, loss, params, optimizer)``: ``b`` a
      :class:`GraphBuilder`, ``loss`` a scalar value of it, ``params`` inputs
      of ``b`` (named ``param<i>`` if unnamed). Appends the ops to ``b`` and
      returns the frozen :class:`TrainingStep`.
    * ``training_step(loss, params, optimizer)``: ``loss`` a scalar lazy
      array (:mod:`opgraph.numpy`), ``params`` the lazy arrays it was built
      from that are trained, as a list or a ``{name: array}`` dict. A
      parameter is a placeholder (``onp.placeholder``, fed its initial value
      by the runner) or a constant (``onp.asarray(w0)``: ``w0`` is its initial
      value). Other placeholders are the data inputs, fed at every call.
      Returns a :class:`TrainingStep`.
    * ``training_step(loss_fn, params, optimizer, *example_args)``:
      ``loss_fn(params, *args)`` returns a scalar; ``params`` is a pytree
      (dicts, lists, tuples) of initial parameter values; ``example_args``
      give the data's shapes and dtypes. ``loss_fn`` may be wrapped by
      ``@opgraph.function`` or ``opgraph.value_and_grad`` (of its first
      argument). Returns a :class:`Trainer` that runs the step on the
      compiled runtime (``backend``) and keeps the parameters as update-edge
      state between calls.

    The step graph's outputs are the loss then ``outputs``.

    >>> import numpy as np, opgraph.numpy as onp
    >>> x = onp.placeholder((3,), name="x")
    >>> w = onp.asarray(np.zeros(3))                  # a parameter, starting at zero
    >>> step = training_step(onp.sum((w - x) ** 2), {"w": w}, SGD(0.25))
    >>> run = StepRunner(step)
    >>> for _ in range(2):
    ...     _ = run({"x": np.array([1.0, 2.0, 4.0])})
    >>> run.value("w")
    array([0.75, 1.5 , 3.  ])
    >>> def loss_fn(p, x):
    ...     return onp.sum((p["w"] - x) ** 2)
    >>> trainer = training_step(loss_fn, {"w": np.zeros(3)}, SGD(0.25), np.ones(3))
    >>> [float(trainer(np.array([1.0, 2.0, 4.0]))) for _ in range(2)]
    [21.0, 5.25]
    >>> trainer.params["w"]
    array([0.75, 1.5 , 3.  ])
    """
    if isinstance(model, GraphBuilder):
        if args and isinstance(args[0], LazyArray):  # a lazy model built into this builder
            return _lazy_step(*args, outputs=outputs, builder=model)
        return _builder_step(model, *args, outputs=outputs)
    if isinstance(model, LazyArray):
        return _lazy_step(model, *args, outputs=outputs)
    if callable(model):
        if outputs:
            raise TypeError("training_step(loss_fn, ...): outputs= is for the builder and lazy-array forms")
        return Trainer(model, *args, backend=backend)
    raise TypeError(f"training_step() of {type(model).__name__}: expected a GraphBuilder, a lazy loss or a loss "
                    "function")


def _builder_step(b: GraphBuilder, loss: Value, params: Sequence[Value], optimizer: Optimizer,
                  *, outputs: Sequence[Value] = ()) -> TrainingStep:
    """Append gradients, optimiser updates and update edges for ``params`` to ``b``; freeze the step graph."""
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"the optimizer must be an opgraph.optim.Optimizer (SGD(0.1), Adam(), ...), "
                        f"not {type(optimizer).__name__}")
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


# ---------------------------------------------------------------- lazy arrays
def _lazy_params(params: Any) -> list[tuple[str, LazyArray]]:
    if isinstance(params, Mapping):
        named = [(str(k), p) for k, p in params.items()]
    elif isinstance(params, LazyArray):
        named = [(params._node.name or "param0", params)]
    elif isinstance(params, (list, tuple)):
        named = [(p._node.name if isinstance(p, LazyArray) and p._node.name else f"param{i}", p)
                 for i, p in enumerate(params)]
    else:
        raise TypeError(f"params must be a list or a {{name: array}} dict of lazy arrays, not {type(params).__name__}")
    seen: dict[str, int] = {}
    for name, p in named:
        if not isinstance(p, LazyArray):
            raise GraphError(f"parameter {name!r} is a {type(p).__name__}, not a lazy array (make it with "
                             "opgraph.numpy.placeholder or opgraph.numpy.asarray)")
        if p._node.opdef is not None:
            raise GraphError(f"parameter {name!r} is computed by a {p._node.opdef.name} op; a parameter must be a "
                             "placeholder or a constant (opgraph.numpy.asarray(initial_value))")
        if name in seen:
            raise GraphError(f"two parameters are named {name!r}")
        if id(p._node) in seen.values():
            other = next(n for n, i in seen.items() if i == id(p._node))
            raise GraphError(f"parameters {other!r} and {name!r} are the same array")
        seen[name] = id(p._node)
        t = p.type
        if t.shape is None or any(d is None for d in t.shape):
            raise GraphError(f"parameter {name!r} has type {t}: parameters need a known shape")
        if t.dtype.kind not in "fc":
            raise GraphError(f"parameter {name!r} has type {t}: only floating parameters can be trained")
    return named


def _check_loss(loss: Any, what: str) -> LazyArray:
    if not isinstance(loss, LazyArray):
        raise GraphError(f"{what} is a {type(loss).__name__}, not a lazy array computed from the parameters")
    if loss.type.shape != ():
        raise GraphError(f"{what} must be a scalar, but it is {loss.type} (reduce it, e.g. with onp.mean)")
    if loss.dtype.kind != "f":
        raise GraphError(f"{what} must be a real floating scalar, but it is {loss.type}")
    return loss


def _lazy_step(loss: Any, params: Any, optimizer: Optimizer, *, outputs: Sequence[Any] = (),
               builder: GraphBuilder | None = None) -> TrainingStep:
    """The lazy-array form of :func:`training_step`."""
    loss = _check_loss(loss, "the loss")
    named = _lazy_params(params)
    nodes = lazy.collect_nodes([loss._node], stop_at_values=False)
    used = {id(n) for n in nodes}
    for name, p in named:
        if id(p._node) not in used:
            raise GraphError(f"the loss does not depend on parameter {name!r}: its gradient is zero, so training "
                             "would never change it (drop it from params)")
    names = {name for name, _ in named}
    pids = {id(p._node) for _, p in named}
    for n in lazy.collect_nodes([lazy.as_lazy(o)._node for o in outputs], stop_at_values=False) + nodes:
        if n.is_input and id(n) not in pids and n.name in names:
            raise GraphError(f"a data placeholder is named {n.name!r} like a parameter; rename one of them")
    b = GraphBuilder() if builder is None else builder
    inputs = [b.input(p.type, name=name) for name, p in named]
    loss_v, *out_vs = lazy.append_to(b, [loss, *outputs], bound=[(p, v) for (_, p), v in zip(named, inputs,
                                                                                          strict=True)])
    step = _builder_step(b, loss_v, inputs, optimizer, outputs=out_vs)
    step.initial = {name: p._node.const for name, p in named if p._node.const is not None}
    return step


# ---------------------------------------------------------------- pytrees of parameters and data
# Trees flatten with opgraph.frontend.pytree (optree, as JAX): dicts in sorted key order, None an empty subtree.
# A leaf is named by its path joined with "/", under ``root``; with no root, a top-level sequence's leaves are
# ``<default><i>`` ("param0/1") and a mapping's or namedtuple's are its keys ("w", "layers/0").
_LEAF_SPEC = pytree.flatten(0)[1]


def _flatten(tree: Any, root: str, default: str) -> tuple[list[tuple[str, Any]], pytree.PyTreeSpec]:
    leaves, spec = pytree.flatten(tree)
    keyed = isinstance(tree, Mapping) or hasattr(tree, "_fields") or not isinstance(tree, (list, tuple))
    names = []
    for path in pytree.paths(tree):
        parts = [str(k) for k in path]
        if not root and parts and not keyed:
            parts[0] = f"{default}{parts[0]}"
        names.append("/".join([root, *parts]) if root else ("/".join(parts) or default))
    return list(zip(names, leaves, strict=True)), spec




def _is_param(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic, LazyArray, bool, int, float, complex)) or hasattr(x, "__array__")


def _as_array(x: Any) -> np.ndarray:
    return x.eval() if isinstance(x, LazyArray) else np.asarray(x)


# ---------------------------------------------------------------- running steps
class StepRunner:
    """Runs a step graph, carrying the update-edge values (parameters, optimiser state) from call to call.

    ``initial`` gives the parameters' (and optionally the state's) starting
    values by name; optimiser state defaults to the step's zeros and
    parameters to the step's ``initial``. Each call feeds the data inputs,
    runs the outputs and the update sources, and keeps the sources' results
    as the destinations' values for the next call.

    With ``backend=None`` (default) a call runs the reference executor;
    with ``backend="numpy"`` (or another engine name) the step is compiled
    once with :func:`opgraph.compile` and the program applies the update
    edges itself, keeping the state in its own buffers between calls.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> w = b.input(("float64", ()), name="w")
    >>> step = training_step(b, b.square(w), [w], SGD(0.25))
    >>> run = StepRunner(step, {"w": 1.0}, backend="numpy")
    >>> _ = run({}); _ = run({})
    >>> float(run.value("w"))
    0.25
    """

    def __init__(self, step: TrainingStep | Graph, initial: Mapping[str, Any] | None = None, *,
                 backend: str | None = None) -> None:
        self.graph = step.graph if isinstance(step, TrainingStep) else step
        g = self.graph
        self.compiled: Any = None
        """The compiled program (``backend`` given), else None."""
        self._values: dict[int, np.ndarray] = {}
        # With a compiled program, inputs given here that are not update destinations are fed at every call;
        # the carried values live in the program between calls.
        self._fixed: dict[int, np.ndarray] = {}
        self._updates = [(int(s), int(d)) for s, d in g.updates]
        self._dests = {d for _, d in self._updates}
        defaults = {**step.state, **step.initial} if isinstance(step, TrainingStep) else {}
        for name, arr in {**defaults, **(initial or {})}.items():
            self.set(name, arr)
        missing = [g.value_label(d) for _, d in self._updates if d not in self._values]
        if missing:
            raise GraphError(f"no initial value for update destination(s) {', '.join(missing)}")
        self._targets = [int(v) for v in g.outputs] + [s for s, _ in self._updates]
        self._ids: dict[int, int] = {}  # input ids of the step graph -> of the compiled (optimised) graph
        if backend is not None:
            from opgraph.passes.pipeline import optimize
            from opgraph.runtime.compiled import compile

            # A step runs many times: optimise it once (fused updates, in place; never slower on numpy).
            program = optimize(g, level=2)
            self._ids = dict(zip(g.inputs.tolist(), program.inputs.tolist(), strict=True))
            self.compiled = compile(program, backend)
            self._fixed = {v: a for v, a in self._values.items() if v not in self._dests}
            self._values = {v: a for v, a in self._values.items() if v in self._dests}

    def __call__(self, feeds: Mapping[Any, Any]) -> list[np.ndarray]:
        """Run one step; return the graph's outputs."""
        if self.compiled is not None:
            ids, g = self._ids, self.graph
            given = {k if isinstance(k, str) else value_id(g, k): a for k, a in feeds.items()}
            results = self.compiled({ids.get(k, k) if isinstance(k, int) else k: a  # type: ignore[call-overload]
                                     for k, a in {**self._fixed, **self._values, **given}.items()})
            self._values = {}  # the program holds the carried values now
            return results
        from opgraph.runtime.executor import execute

        results = execute(self.graph, {**self._values, **feeds}, self._targets)
        n = len(self.graph.outputs)
        for (_, dst), r in zip(self._updates, results[n:], strict=True):
            self._values[dst] = r
        return results[:n]

    def value(self, name: str) -> np.ndarray:
        """Current value of a parameter or state input."""
        return self._get(self.graph.find_value(name))

    def _get(self, v: int) -> np.ndarray:
        if v in self._values or self.compiled is None:
            return self._values[v]
        return self._fixed[v] if v in self._fixed else self.compiled.state(self._ids[v])

    def set(self, name: str, value: Any) -> None:
        """Give a parameter or state input a new value (used from the next call on).

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); w = b.input(("float64", (2,)), name="w")
        >>> run = StepRunner(training_step(b, b.sum(b.square(w)), [w], SGD()), {"w": [1.0, 2.0]})
        >>> run.set("w", [3.0, 4.0]); run.value("w")
        array([3., 4.])
        """
        g = self.graph
        v = g.find_value(name)
        t = g.type_of(v)
        arr = np.array(value, dtype=t.dtype)
        if t.shape is not None and (arr.ndim != len(t.shape) or
                                    any(d is not None and d != n for d, n in zip(t.shape, arr.shape, strict=True))):
            raise GraphError(f"{name!r} has type {t}; the value given has shape {arr.shape}")
        if self.compiled is not None and v not in self._dests:
            self._fixed[v] = arr
        else:
            self._values[v] = arr

    @property
    def values(self) -> dict[str, np.ndarray]:
        """Current values of every carried input, by name (or ``%id``)."""
        keys = list(self._values) if self.compiled is None else [*self._fixed, *sorted(self._dests)]
        return {self.graph.value_label(v).lstrip("%"): self._get(v) for v in keys}


def _loss_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    # @opgraph.function and value_and_grad/grad wrap the loss function: train the function they wrap.
    from opgraph.autodiff import GradFunction
    from opgraph.frontend.trace import TracedFunction

    while isinstance(fn, TracedFunction):
        fn = fn.fn
    if isinstance(fn, GradFunction):
        if fn.has_aux or type(fn) is not GradFunction:
            raise GraphError(f"training_step needs a loss function returning a scalar; this is a "
                             f"{'has_aux ' if fn.has_aux else ''}{fn.label} function")
        if fn.argnums != 0:
            raise GraphError(f"training_step differentiates loss_fn for its first argument (the parameters); this "
                             f"gradient function is for argnums={fn.argnums}")
        fn = fn.fn
        while isinstance(fn, TracedFunction):
            fn = fn.fn
        if isinstance(fn, GradFunction):
            raise GraphError("training_step needs a loss function; this is the gradient of a gradient function")
    return fn


@dataclass
class _Trace:
    step: TrainingStep
    runner: StepRunner
    feeds: list[tuple[str, int]]  # data input name, position among the flat array arguments


class Trainer:
    """A compiled training step for a loss function of a parameter pytree; made by :func:`training_step`.

    ``trainer(*args)`` runs one step on data ``args`` and returns the loss
    (the value before the update); ``trainer.params`` are the current
    parameters, in the structure given (dicts, lists, tuples of arrays);
    assigning it sets new values. The step is traced once per signature of
    the data (dtypes, shapes and any static arguments), like
    ``@opgraph.function``; the parameters and the optimiser state move with
    it, as update-edge state of the compiled program.

    >>> import numpy as np, opgraph.numpy as onp
    >>> def loss_fn(p, x, y):
    ...     return onp.mean((x @ p["w"] + p["b"] - y) ** 2)
    >>> x, y = np.array([[1.0], [2.0]]), np.array([3.0, 5.0])
    >>> trainer = training_step(loss_fn, {"w": np.zeros(1), "b": np.zeros(())}, Momentum(0.1, 0.5), x, y)
    >>> losses = [float(trainer(x, y)) for _ in range(200)]
    >>> np.round(trainer.params["w"], 6), np.round(trainer.params["b"], 6)
    (array([2.]), np.float64(1.0))
    >>> sorted(trainer.state)
    ['b.v', 'w.v']
    """

    def __init__(self, loss_fn: Callable[..., Any], params: Any, optimizer: Optimizer, *example_args: Any,
                 backend: str = "numpy") -> None:
        self.loss_fn = _loss_function(loss_fn)
        self.optimizer = optimizer
        self.backend = backend
        self.signature = inspect.signature(self.loss_fn)
        leaves, self._treedef = _flatten(params, "", "param")
        self._names = [name for name, _ in leaves]
        self._types: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        carried: dict[str, np.ndarray] = {}
        for name, leaf in leaves:
            if not _is_param(leaf):
                raise GraphError(f"parameter {name!r} is a {type(leaf).__name__}, not an array (static settings "
                                 "belong in the loss function's closure or its other arguments)")
            arr = np.array(_as_array(leaf))
            if arr.dtype.kind not in "fc":
                raise GraphError(f"parameter {name!r} has dtype {arr.dtype}: only floating parameters can be "
                                 "trained")
            self._types[name] = (arr.dtype, arr.shape)
            carried[name] = arr
        self._carried: dict[str, np.ndarray] | None = carried  # held here until a step program holds them
        self._traces: dict[Any, _Trace] = {}
        self._active: _Trace | None = None
        self._activate(example_args)

    # ------------------------------------------------------------ tracing
    def _bind(self, args: tuple[Any, ...]) -> tuple[Any, list[tuple[str, np.ndarray]], list[Any]]:
        if all(type(a) is np.ndarray for a in args):  # the common call, kept cheap: it is paid at every step
            key = tuple((_LEAF_SPEC, (("array", a.dtype.str, a.shape),)) for a in args)
            if key in self._traces:
                return key, [("", a) for a in args], list(args)
        try:
            self.signature.bind(None, *args)
        except TypeError as exc:
            raise TypeError(f"{getattr(self.loss_fn, '__name__', 'loss_fn')}(params, *args) cannot take "
                            f"{len(args)} data argument(s): {exc}") from None
        names = self._arg_names(len(args))
        key: list[Any] = []
        arrays: list[tuple[str, np.ndarray]] = []
        for i, arg in enumerate(args):
            leaves, treedef = _flatten(arg, names[i], names[i])
            sig = []
            for path, leaf in leaves:
                if is_array(leaf):
                    arr = _as_array(leaf)
                    sig.append(("array", arr.dtype.str, arr.shape))
                    arrays.append((path, arr))
                else:
                    try:
                        hash(leaf)
                    except TypeError:
                        raise TypeError(f"argument {path!r} of {getattr(self.loss_fn, '__name__', 'loss_fn')} is a "
                                        f"{type(leaf).__name__}: neither an array nor hashable (static arguments "
                                        "must be hashable)") from None
                    sig.append(("static", type(leaf).__name__, leaf))
            key.append((treedef, tuple(sig)))
        return tuple(key), arrays, list(args)

    def _arg_names(self, n: int) -> list[str]:
        # data inputs are named after loss_fn's parameters (x, y, ...): they show in the step graph and its files
        names: list[str] = []
        for p in list(self.signature.parameters.values())[1:]:
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                names.append(p.name)
            elif p.kind == p.VAR_POSITIONAL:
                names += [f"{p.name}{j}" for j in range(max(0, n - len(names)))]
        return (names + [f"arg{i}" for i in range(len(names), n)])[:n]

    def _trace(self, args: list[Any]) -> tuple[TrainingStep, list[str]]:
        holders = [lazy.placeholder(self._types[n][1], self._types[n][0], name=n) for n in self._names]
        data_names: list[str] = []
        lazy_args = []
        for arg, name in zip(args, self._arg_names(len(args)), strict=True):
            leaves, treedef = _flatten(arg, name, name)
            subst = []
            for path, leaf in leaves:
                if is_array(leaf):
                    arr = _as_array(leaf)
                    label = path if path not in self._types else f"arg.{path}"
                    data_names.append(label)
                    subst.append(lazy.placeholder(arr.shape, arr.dtype, name=label))
                else:
                    subst.append(leaf)
            lazy_args.append(pytree.unflatten(treedef, subst))
        with lazy.tracing():
            loss = self.loss_fn(pytree.unflatten(self._treedef, holders), *lazy_args)
        fname = getattr(self.loss_fn, "__name__", "loss_fn")
        _check_loss(loss, f"the value {fname} returns")
        return _lazy_step(loss, dict(zip(self._names, holders, strict=True)), self.optimizer), data_names

    def _activate(self, args: tuple[Any, ...]) -> tuple[_Trace, list[tuple[str, np.ndarray]]]:
        key, arrays, arglist = self._bind(args)
        tr = self._traces.get(key)
        if tr is None:
            step, data_names = self._trace(arglist)
            runner = StepRunner(step, {n: np.zeros(self._types[n][1], self._types[n][0]) for n in self._names},
                                backend=self.backend)
            tr = self._traces[key] = _Trace(step, runner, [(n, i) for i, n in enumerate(data_names)])
        if tr is not self._active:
            carried = self._carried if self._active is None else self._active.runner.values
            assert carried is not None
            for name, arr in carried.items():
                tr.runner.set(name, arr)
            self._active, self._carried = tr, None
        return tr, arrays

    # ------------------------------------------------------------ use
    def __call__(self, *args: Any) -> np.ndarray:
        """Run one training step on data ``args``; return the loss (before this step's update)."""
        tr, arrays = self._activate(args)
        (loss, *_) = tr.runner({name: arrays[i][1] for name, i in tr.feeds})
        return loss

    @property
    def params(self) -> Any:
        """The current parameters, as copies, in the structure they were given."""
        run = self._runner
        return pytree.unflatten(self._treedef, [np.array(run.value(n), copy=True) for n in self._names])

    @params.setter
    def params(self, new: Any) -> None:
        leaves, _ = _flatten(new, "", "param")
        got = [name for name, _ in leaves]
        if got != self._names:
            missing = [n for n in self._names if n not in got]
            extra = [n for n in got if n not in self._names]
            raise GraphError("the new parameters do not have the structure of the trained ones"
                             + (f": missing {', '.join(map(repr, missing))}" if missing else "")
                             + (f": unexpected {', '.join(map(repr, extra))}" if extra else ""))
        values = {}
        for name, leaf in leaves:
            arr = np.asarray(_as_array(leaf))
            if arr.shape != self._types[name][1]:
                raise GraphError(f"parameter {name!r} has shape {self._types[name][1]}; the new value has "
                                 f"shape {arr.shape}")
            values[name] = arr
        for name, arr in values.items():
            self._runner.set(name, arr)

    @property
    def state(self) -> dict[str, np.ndarray]:
        """The optimiser state (moments, step count), by name."""
        return {k: v for k, v in self._runner.values.items() if k not in self._types}

    @property
    def step(self) -> TrainingStep:
        """The training step of the data signature used last."""
        return self._active_trace.step

    @property
    def graph(self) -> Graph:
        """The step graph of the data signature used last (outputs: the loss; update edges: parameters, state)."""
        return self.step.graph

    @property
    def runner(self) -> StepRunner:
        """The runner of the data signature used last; ``runner.compiled`` is the compiled program."""
        return self._runner

    @property
    def _active_trace(self) -> _Trace:
        assert self._active is not None
        return self._active

    @property
    def _runner(self) -> StepRunner:
        return self._active_trace.runner

    @property
    def cache_size(self) -> int:
        """How many data signatures have been traced."""
        return len(self._traces)

    def __repr__(self) -> str:
        return (f"<Trainer {getattr(self.loss_fn, '__name__', 'loss_fn')}: {len(self._names)} parameter(s), "
                f"{self.optimizer}, {self.cache_size} trace(s)>")
