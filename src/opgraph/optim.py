"""Training: optimisers as pure functions (optax's API) and as graph ops, update edges, and a small step runner.

Each optimiser (:class:`SGD`, :class:`Momentum`, :class:`Adagrad`, :class:`Adam`) has optax's pure functions:
``state = opt.init(params)``, ``updates, state = opt.update(grads, state, params)`` and
:func:`apply_updates`, on pytrees of NumPy arrays (eager) or lazy arrays (traced into graph ops for any engine).
Its update formula is written once and also builds the ops of :func:`training_step`.

    >>> import numpy as np, opgraph
    >>> import opgraph.numpy as onp
    >>> from opgraph.optim import Adam, apply_updates
    >>> loss = lambda p, x: onp.sum((p["w"] - x) ** 2)
    >>> params, opt = {"w": np.zeros(2)}, Adam(lr=0.1)
    >>> state = opt.init(params)
    >>> for _ in range(3):
    ...     updates, state = opt.update(opgraph.grad(loss)(params, np.ones(2)), state, params)
    ...     params = apply_updates(params, updates)
    >>> params["w"].round(4), state.count
    (array([0.3, 0.3]), array(3, dtype=int32))

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
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from opgraph.autodiff import build_grad_ops
from opgraph.core.builder import GraphBuilder
from opgraph.core.feeds import value_id
from opgraph.core.graph import Graph, Value
from opgraph.errors import GraphError
from opgraph.frontend import lazy, pytree
from opgraph.frontend.lazy import LazyArray
from opgraph.frontend.trace import is_array

__all__ = ["SGD", "Adagrad", "Adam", "EmptyState", "Momentum", "Optimizer", "ScaleByAdamState", "ScaleByRssState",
           "StepRunner", "TraceState", "Trainer", "TrainingStep", "apply_updates", "training_step"]


# ---------------------------------------------------------------- optimiser state (optax's NamedTuples)
class EmptyState(NamedTuple):
    """The state of an optimiser that keeps none (:class:`SGD`), as optax's ``EmptyState``.

    >>> SGD(0.1).init({"w": np.zeros(2)})
    EmptyState()
    """


class TraceState(NamedTuple):
    """:class:`Momentum`'s state, as optax's ``TraceState``: ``trace``, the velocity, shaped like the parameters.

    >>> Momentum(0.1).init([np.ones(2)])
    TraceState(trace=[array([0., 0.])])
    """

    trace: Any


class ScaleByRssState(NamedTuple):
    """:class:`Adagrad`'s state, as optax's ``ScaleByRssState``: the running ``sum_of_squares`` of the gradients.

    >>> Adagrad(0.1).init(np.zeros(2, np.float32))
    ScaleByRssState(sum_of_squares=array([0.1, 0.1], dtype=float32))
    """

    sum_of_squares: Any


class ScaleByAdamState(NamedTuple):
    """:class:`Adam`'s state, as optax's ``ScaleByAdamState``: the step ``count`` (int32, a scalar), the moments
    ``mu`` and ``nu``, shaped like the parameters.

    >>> Adam().init({"w": np.zeros(2)}).count
    array(0, dtype=int32)
    """

    count: Any
    mu: Any
    nu: Any


_MAX_COUNT = int(np.iinfo(np.int32).max)


def _namespace(leaves: Sequence[Any]) -> Any:
    """Where the update formulas run for these leaves: lazy arrays (a trace, ``opgraph.grad`` results) in
    ``opgraph.numpy``, so the update becomes graph ops; arrays with their own namespace (jax) in it; else NumPy,
    eagerly (a hand-written loop pays no graph building per step)."""
    types = set(map(type, leaves))
    if types <= {np.ndarray}:  # the common eager case, checked once per type rather than per leaf
        return np
    xp: Any = np
    for t in types:
        if issubclass(t, LazyArray):  # opgraph.numpy, a sibling layer: reached through the array's hook
            return next(x for x in leaves if type(x) is t).__array_namespace__()
        if xp is np and not issubclass(t, (np.ndarray, np.generic)) and hasattr(t, "__array_namespace__"):
            xp = next(x for x in leaves if type(x) is t).__array_namespace__()
    return xp


_NODES = (list, tuple, dict, deque, type(None))


def _has_nodes(leaves: Sequence[Any]) -> bool:
    """Whether leaves found by ``flatten_up_to`` are containers (the tree is deeper than the structure)."""
    return any(issubclass(t, _NODES) for t in set(map(type, leaves)))


_RECENT: list[pytree.PyTreeSpec] = []  # structures flattened lately, most recent first


def _leaves_of(tree: Any) -> tuple[list[Any], pytree.PyTreeSpec]:
    """``pytree.flatten``, first trying the structures seen lately: checking a tree against a known structure
    (``flatten_up_to``) costs a twentieth of a full flatten, which a hand-written loop pays every step."""
    for spec in _RECENT:
        try:
            leaves = spec.flatten_up_to(tree)
        except (ValueError, TypeError):
            continue
        if not _has_nodes(leaves):
            return leaves, spec
    leaves, spec = pytree.flatten(tree)
    _RECENT.insert(0, spec)
    del _RECENT[8:]
    return leaves, spec


def _match(grads: Any, **trees: Any) -> tuple[list[Any], list[list[Any]], pytree.PyTreeSpec, Any]:
    """The gradients' leaves, each state tree's leaves in the same order, the structure and the namespace."""
    g_leaves, spec = _leaves_of(grads)
    out = []
    for name, tree in trees.items():
        leaves = _leaves_like(spec, tree)
        if leaves is None:
            raise GraphError(f"the gradients have the structure {spec} but the optimiser state's {name} has "
                             f"{pytree.flatten(tree)[1]}: update() takes gradients structured like the parameters "
                             "given to init()")
        out.append(leaves)
    return g_leaves, out, spec, _namespace(g_leaves + [x for leaves in out for x in leaves])


def _leaves_like(spec: pytree.PyTreeSpec, tree: Any) -> list[Any] | None:
    """``tree``'s leaves if it has the structure ``spec`` (leaf for leaf), else None."""
    try:
        leaves = spec.flatten_up_to(tree)
    except (ValueError, TypeError):
        return None
    return None if _has_nodes(leaves) else leaves


def _signed(xp: Any, lr: float) -> tuple[float, bool]:
    """The ``lr`` a pure update gives its formula, and whether it negates the step. Eager: ``-lr`` (no extra pass
    over memory). Traced (opgraph.numpy): ``lr``, then ``-step``, so that ``apply_updates``' ``p + -step``
    simplifies to the ``p - step`` the update-fusion rules match, as ``training_step``'s graphs are. Negating is
    exact: the same numbers either way."""
    traced = getattr(xp, "__name__", "") == "opgraph.numpy"
    return (lr if traced else -lr), traced


def _neg(x: Any, neg: bool) -> Any:
    return -x if neg else x


def _tree(spec: pytree.PyTreeSpec, leaves: list[Any], xp: Any) -> Any:
    # NumPy turns 0-d results into scalars (np.float32): give back arrays, as every other leaf
    return pytree.unflatten(spec, [np.asarray(x) for x in leaves] if xp is np else leaves)


def apply_updates(params: Any, updates: Any) -> Any:
    """``params + updates`` leaf by leaf, each result in its parameter's dtype (``optax.apply_updates``).

    ``None`` leaves stay ``None``; the trees must have the same structure.

    >>> import numpy as np
    >>> apply_updates({"w": np.ones(2, np.float32), "b": None}, {"w": np.array([0.5, -1.0]), "b": None})
    {'w': array([1.5, 0. ], dtype=float32), 'b': None}
    """
    p_leaves, spec = _leaves_of(params)
    u_leaves = _leaves_like(spec, updates)
    if u_leaves is None:
        raise GraphError(f"the parameters have the structure {spec} but the updates have "
                         f"{pytree.flatten(updates)[1]}")
    out = []
    for p, u in zip(p_leaves, u_leaves, strict=True):
        if type(p) is np.ndarray and type(u) is np.ndarray:  # the common eager case, kept cheap
            new = p + u
            if type(new) is not np.ndarray:  # 0-d operands give a NumPy scalar
                new = np.asarray(new)
            out.append(new if new.dtype == p.dtype else new.astype(p.dtype))
            continue
        dtype = p.dtype if hasattr(p, "dtype") else np.asarray(p).dtype
        new = p + u
        if not hasattr(new, "dtype") or isinstance(new, np.generic):
            new = np.asarray(new)
        out.append(new if new.dtype == dtype else new.astype(dtype))
    return pytree.unflatten(spec, out)


# ---------------------------------------------------------------- the update formulas (one place each)
# Each takes the namespace ``xp`` (NumPy, opgraph.numpy, or _Ops on a GraphBuilder), one parameter's gradient and
# state and the hyperparameters; it returns the step ``d`` with ``p_new = p - d`` for a positive ``lr`` and the new
# state. The pure ``update`` passes ``-lr``, so ``d`` is optax's update (``p_new = p + d``, exactly the same
# numbers: negating is exact); ``apply`` passes ``lr`` and builds ``p - d``. The operand order is the one the
# update-fusion rules (opgraph.passes.rules.FUSE_UPDATES) match; every order here rounds as optax's does except
# where said.
def _sgd_rule(xp: Any, g: Any, *, lr: float) -> Any:
    return g * lr


def _momentum_rule(xp: Any, g: Any, v: Any, *, lr: float, mu: float, nesterov: bool) -> tuple[Any, Any]:
    v_new = v * mu + g
    return ((g + v_new * mu) if nesterov else v_new) * lr, v_new


def _adagrad_rule(xp: Any, g: Any, acc: Any, *, lr: float, eps: float) -> tuple[Any, Any]:
    acc_new = acc + g * g
    # optax: g * rsqrt(acc' + eps) where acc' > 0, else 0. acc' = 0 means g = 0 (the accumulator starts at 0 or
    # more), so the step is 0 either way; the guard is only needed (and built) where eps <= 0, against 0 / 0.
    denom = acc_new + eps if eps > 0 else xp.where(acc_new > 0, acc_new + eps, 1.0)
    return g * lr / xp.sqrt(denom), acc_new


def _adam_rule(xp: Any, g: Any, m: Any, v: Any, t: Any, *, lr: float, b1: float, b2: float, eps: float,
               eps_root: float) -> tuple[Any, Any, Any]:
    """``t``: the step count after this step's increment, in the parameter's dtype."""
    m_new = m * b1 + g * (1.0 - b1)
    v_new = v * b2 + g * g * (1.0 - b2)
    # optax: -lr * (m^ / (sqrt(v^) + eps)); here (m^ * -lr) / (...): the same up to one rounding. One expression,
    # so that NumPy reuses its temporaries' memory (no name holds m^ * lr)
    return (m_new / (1.0 - b1 ** t) * lr
            / (xp.sqrt((v_new / (1.0 - b2 ** t) + eps_root) if eps_root else v_new / (1.0 - b2 ** t)) + eps),
            m_new, v_new)


class _Sym:
    """A value of a GraphBuilder with Python's operators, so the formulas above build ops (``apply``)."""

    __slots__ = ("b", "v")

    def __init__(self, b: GraphBuilder, v: Value) -> None:
        self.b, self.v = b, v

    def _rhs(self, x: Any) -> Any:
        return x.v if isinstance(x, _Sym) else x

    def _lhs(self, x: Any) -> Any:  # a number on the left: a constant of this value's dtype
        return x.v if isinstance(x, _Sym) else np.array(x, self.v.dtype)

    def _op(self, kind: str, a: Any, c: Any) -> _Sym:
        return _Sym(self.b, getattr(self.b, kind)(a, c))

    def __gt__(self, o: Any) -> _Sym:
        return self._op("greater", self.v, self._lhs(o))


def _binary(kind: str, reflected: bool) -> Callable[[_Sym, Any], _Sym]:
    """``_Sym``'s operator (its reflected form: the number on the left) as the builder's op ``kind``."""
    if reflected:
        return lambda self, o: self._op(kind, self._lhs(o), self.v)
    return lambda self, o: self._op(kind, self.v, self._rhs(o))


# attached after the class exists, as JAX attaches its array methods: one line per operator
for _name, _kind in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "divide"),
                     ("pow", "power")):
    setattr(_Sym, f"__{_name}__", _binary(_kind, reflected=False))
    setattr(_Sym, f"__r{_name}__", _binary(_kind, reflected=True))


class _Ops:
    """The namespace of the formulas on a GraphBuilder."""

    def __init__(self, b: GraphBuilder) -> None:
        self.b = b

    def __call__(self, v: Value) -> _Sym:
        return _Sym(self.b, v)

    def sqrt(self, x: _Sym) -> _Sym:
        return _Sym(self.b, self.b.sqrt(x.v))

    def where(self, c: _Sym, x: _Sym, y: float) -> _Sym:
        return _Sym(self.b, self.b.where(c.v, x.v, x._lhs(y)))


# ---------------------------------------------------------------- the optimisers
class Optimizer:
    """Base class. Pure functions with optax's semantics: ``state = opt.init(params)``, then per step
    ``updates, state = opt.update(grads, state)`` and ``params = apply_updates(params, updates)``; pytrees
    (dicts, lists, tuples, namedtuples, ``None`` leaves) of NumPy arrays (computed eagerly in NumPy) or lazy
    arrays (inside ``@opgraph.function`` or a trace: the update becomes graph ops for any engine).

    For :func:`training_step`: ``apply(b, param, grad, state_input)`` appends the same formulas' ops to a
    GraphBuilder. ``state_input(suffix, shared=False, init=0.0)`` declares a state input (starting at ``init``)
    and returns ``(value, set)``, where ``set(new)`` records its update edge; ``shared`` state (Adam's step
    count) is one scalar for all parameters.

    >>> import numpy as np
    >>> opt = SGD(0.5)
    >>> params = {"w": np.array([1.0, 2.0])}
    >>> state = opt.init(params)
    >>> updates, state = opt.update({"w": np.array([2.0, 2.0])}, state, params)
    >>> apply_updates(params, updates)
    {'w': array([0., 1.])}
    """

    def init(self, params: Any) -> Any:
        """The initial state for a pytree of parameters (zeros shaped like them, optax's defaults)."""
        raise NotImplementedError

    def update(self, grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        """``(updates, new_state)``: the updates to add to the parameters (``apply_updates``). ``params`` is
        accepted as optax does and not used by these optimisers."""
        raise NotImplementedError

    def apply(self, b: GraphBuilder, param: Value, grad: Value, state: Any) -> Value:
        """Return the new parameter value."""
        raise NotImplementedError


@dataclass
class SGD(Optimizer):
    """Plain gradient descent: ``p = p - lr * g`` (``optax.sgd(lr)``).

    >>> SGD(0.1)
    SGD(lr=0.1)
    >>> SGD(0.1).update([np.array([1.0, -2.0])], EmptyState())
    ([array([-0.1,  0.2])], EmptyState())
    """

    lr: float = 0.01

    def init(self, params: Any) -> EmptyState:
        return EmptyState()

    def update(self, grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        leaves, _, spec, xp = _match(grads)
        lr, neg = _signed(xp, self.lr)
        return _tree(spec, [_neg(_sgd_rule(xp, g, lr=lr), neg) for g in leaves], xp), EmptyState()

    def apply(self, b: GraphBuilder, param: Value, grad: Value, state: Any) -> Value:
        ops = _Ops(b)
        return b.subtract(param, _sgd_rule(ops, ops(grad), lr=self.lr).v)


@dataclass
class Momentum(Optimizer):
    """Heavy-ball momentum: ``v = mu * v + g; p = p - lr * v``; with ``nesterov``, ``p = p - lr * (g + mu * v)``
    (``optax.sgd(lr, momentum=mu, nesterov=...)``).

    >>> Momentum(0.1, 0.9).mu
    0.9
    >>> opt = Momentum(0.1, 0.5)
    >>> state = opt.init(np.zeros(2))
    >>> for _ in range(2):
    ...     updates, state = opt.update(np.ones(2), state)
    >>> updates, state.trace
    (array([-0.15, -0.15]), array([1.5, 1.5]))
    """

    lr: float = 0.01
    mu: float = 0.9
    nesterov: bool = False

    def init(self, params: Any) -> TraceState:
        leaves, spec = pytree.flatten(params)
        xp = _namespace(leaves)
        return TraceState(pytree.unflatten(spec, [xp.zeros_like(p) for p in leaves]))

    def update(self, grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        leaves, (trace,), spec, xp = _match(grads, trace=state.trace)
        lr, neg = _signed(xp, self.lr)
        out = [_momentum_rule(xp, g, v, lr=lr, mu=self.mu, nesterov=self.nesterov)
               for g, v in zip(leaves, trace, strict=True)]
        return _tree(spec, [_neg(d, neg) for d, _ in out], xp), TraceState(_tree(spec, [v for _, v in out], xp))

    def apply(self, b: GraphBuilder, param: Value, grad: Value, state: Any) -> Value:
        v, set_v = state("v")
        ops = _Ops(b)
        d, v_new = _momentum_rule(ops, ops(grad), ops(v), lr=self.lr, mu=self.mu, nesterov=self.nesterov)
        set_v(v_new.v)
        return b.subtract(param, d.v)


@dataclass
class Adagrad(Optimizer):
    """Adagrad as ``optax.adagrad``: ``acc = acc + g * g; p = p - lr * g / sqrt(acc + eps)``, the accumulator
    starting at ``initial_accumulator_value``.

    (Before issue 33 the ``training_step`` form was PyTorch's and ONNX's: ``acc`` from 0 and
    ``g / (sqrt(acc) + eps)`` with ``eps = 1e-10``; ONNX's Adagrad imports unchanged.)

    >>> Adagrad().eps
    1e-07
    >>> opt = Adagrad(0.1, initial_accumulator_value=0.0, eps=0.0)
    >>> updates, state = opt.update(np.array([3.0, 0.0]), opt.init(np.zeros(2)))
    >>> updates, state.sum_of_squares
    (array([-0.1,  0. ]), array([9., 0.]))
    """

    lr: float = 0.01
    initial_accumulator_value: float = 0.1
    eps: float = 1e-7

    def init(self, params: Any) -> ScaleByRssState:
        leaves, spec = pytree.flatten(params)
        xp = _namespace(leaves)
        return ScaleByRssState(pytree.unflatten(spec, [xp.full_like(p, self.initial_accumulator_value)
                                                       for p in leaves]))

    def update(self, grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        leaves, (acc,), spec, xp = _match(grads, sum_of_squares=state.sum_of_squares)
        lr, neg = _signed(xp, self.lr)
        out = [_adagrad_rule(xp, g, a, lr=lr, eps=self.eps) for g, a in zip(leaves, acc, strict=True)]
        return _tree(spec, [_neg(d, neg) for d, _ in out], xp), ScaleByRssState(_tree(spec, [a for _, a in out], xp))

    def apply(self, b: GraphBuilder, param: Value, grad: Value, state: Any) -> Value:
        acc, set_acc = state("acc", init=self.initial_accumulator_value)
        ops = _Ops(b)
        d, acc_new = _adagrad_rule(ops, ops(grad), ops(acc), lr=self.lr, eps=self.eps)
        set_acc(acc_new.v)
        return b.subtract(param, d.v)


@dataclass
class Adam(Optimizer):
    """Adam with bias correction (Kingma and Ba) as ``optax.adam``: with the step count ``t`` (incremented
    first, so 1 at the first step), ``m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g; m^ = m / (1 - b1^t);
    v^ = v / (1 - b2^t); p = p - lr m^ / (sqrt(v^ + eps_root) + eps)``.

    >>> Adam().beta2
    0.999
    >>> opt = Adam(lr=0.1)
    >>> updates, state = opt.update(np.array([2.0, -1.0]), opt.init(np.zeros(2)))
    >>> np.round(updates, 6), state.count
    (array([-0.1,  0.1]), array(1, dtype=int32))
    """

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    eps_root: float = 0.0

    def _rule(self, xp: Any, g: Any, m: Any, v: Any, t: Any, lr: float) -> tuple[Any, Any, Any]:
        return _adam_rule(xp, g, m, v, t, lr=lr, b1=self.beta1, b2=self.beta2, eps=self.eps,
                          eps_root=self.eps_root)

    def init(self, params: Any) -> ScaleByAdamState:
        leaves, spec = pytree.flatten(params)
        xp = _namespace(leaves)
        zeros = [xp.zeros_like(p) for p in leaves]
        return ScaleByAdamState(xp.zeros((), dtype=np.int32), pytree.unflatten(spec, zeros),
                                pytree.unflatten(spec, [xp.zeros_like(p) for p in leaves]))

    def update(self, grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        leaves, (mu, nu), spec, xp = _match(grads, mu=state.mu, nu=state.nu)
        count = state.count
        lr, neg = _signed(xp, self.lr)
        out = []
        ts: dict[Any, Any] = {}  # the count in each parameter dtype: no float64 reaches float32 parameters
        if xp is np:
            # eager: the count as a NumPy scalar of each parameter's dtype (cheaper than 0-d arrays), rounding the
            # bias corrections as the traced graph does
            n = min(int(count) + 1, _MAX_COUNT)
            count = np.asarray(n, np.int32)
            for g, m, v in zip(leaves, mu, nu, strict=True):
                dtype = g.dtype if type(g) is np.ndarray else np.result_type(g)
                t = ts.get(dtype)
                if t is None:
                    t = ts[dtype] = dtype.type(n)
                out.append(self._rule(xp, g, m, v, t, lr))
        else:
            count = xp.where(count < _MAX_COUNT, count + 1, _MAX_COUNT)  # optax.safe_increment: int32, saturating
            for g, m, v in zip(leaves, mu, nu, strict=True):
                t = ts.get(g.dtype)
                if t is None:
                    t = ts[g.dtype] = count.astype(g.dtype)
                out.append(self._rule(xp, g, m, v, t, lr))
        return (_tree(spec, [_neg(d, neg) for d, _, _ in out], xp),
                ScaleByAdamState(count, _tree(spec, [m for _, m, _ in out], xp),
                                 _tree(spec, [v for _, _, v in out], xp)))

    def apply(self, b: GraphBuilder, param: Value, grad: Value, state: Any) -> Value:
        # the graph's step count is a float scalar (of the first parameter's dtype): the fused Adam kernels
        # (adam_update_t) take it as it is
        t, set_t = state("t", shared=True)
        t_new = b.add(t, 1.0)
        set_t(t_new)
        m, set_m = state("m")
        v, set_v = state("v")
        ops = _Ops(b)
        d, m_new, v_new = self._rule(ops, ops(grad), ops(m), ops(v), ops(t_new), self.lr)
        set_m(m_new.v)
        set_v(v_new.v)
        return b.subtract(param, d.v)


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
                        init: float = 0.0, **kw: Any) -> tuple[Value, Any]:
            shared_ = shared_ or kw.get("shared", False)
            if shared_ and suffix in shared:
                return shared[suffix]
            full = f"{type(optimizer).__name__.lower()}.{suffix}" if shared_ else f"{_name}.{suffix}"
            t = b.type_of(_p.id) if not shared_ else type(b.type_of(_p.id))(b.type_of(_p.id).dtype, ())
            v = b.input(t, name=full)
            state[full] = np.full(t.shape, init, t.dtype)
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
