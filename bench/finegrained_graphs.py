"""Fine-grained workloads for bench/finegrained.py (issue 34): the same computation for opgraph and CasADi SX.

* :func:`random_dag`: a random scalar DAG as in issue 34's table, kept as arrays (:class:`Dag`): 64 float64 inputs
  (one input vector ``x`` of 64, read element by element), ``n`` ops of six kinds (add, subtract, multiply, sin,
  cos, multiply by a constant), one scalar output. Op ``i`` reads the previous value (op ``i - 1``'s result, or
  ``x[63]`` for op 0); the binary ops also read an earlier value chosen at random (seeded) among the values in
  [-1, 1] by construction (inputs, sin and cos results) made before the previous value, so values stay bounded
  (a run of binary ops adds at most 1 per op; runs are short) and CasADi's SX simplifications (``x - x`` is 0)
  never apply, which keeps both libraries' instruction counts equal. Everything is vectorised NumPy: 10^7 ops in
  about a second.
* :func:`dag_graph` makes the opgraph :class:`~opgraph.Graph` straight from those arrays (``Graph.from_arrays``),
  :func:`dag_casadi` the CasADi SX expression (one Python call per op), :func:`dag_traced` a Python function of
  ``x`` over ``opgraph.numpy`` (what ``opgraph.grad`` traces), :func:`dag_reference` the value in plain Python
  floats (``math``), an independent reference for both.
* :func:`rk4`: an unrolled RK4 integration of two coupled damped pendulums (4 states), written once over scalars
  with the library's ``sin`` passed in, so opgraph (lazy 0-d arrays) and CasADi (SX) run the same code.

>>> d = random_dag(1000, seed=0)
>>> g = dag_graph(d)
>>> x = dag_input(0)
>>> got = float(opgraph.compile(g)(x)[0])
>>> bool(abs(got - dag_reference(d, x)) <= 1e-12 * max(1.0, abs(got)))
True
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import opgraph

N_INPUTS = 64
ADD, SUB, MUL, SIN, COS, SCALE = range(6)
KIND_NAMES = ("add", "subtract", "multiply", "sin", "cos", "multiply")
CONSTANTS = np.array([0.5, -0.5, 0.75, -0.75, 0.9, -0.9, 0.3, -0.3])  # the scalings: |c| < 1 keeps values bounded
# Probabilities of add, subtract, multiply, sin, cos, scale: mixed, so the opcode stream is hard to predict.
MIX = np.array([0.2, 0.15, 0.2, 0.15, 0.15, 0.15])


@dataclass(frozen=True)
class Dag:
    """A random scalar DAG as arrays. Slots ``0..63`` are ``x[0..63]``, slot ``64 + i`` is op ``i``'s result.

    ``kind[i]`` is one of ADD, SUB, MUL, SIN, COS, SCALE; ``a[i]`` its first operand's slot (always the previous
    one); ``b[i]`` the second operand's slot (binary ops), the index into :data:`CONSTANTS` (SCALE), or -1.
    """

    kind: np.ndarray
    a: np.ndarray
    b: np.ndarray

    @property
    def n(self) -> int:
        """The number of compute ops."""
        return len(self.kind)


def random_dag(n: int, seed: int = 0) -> Dag:
    """The DAG of ``n`` ops described in the module doc (vectorised: O(n)).

    >>> d = random_dag(5, seed=1)
    >>> d.n, d.a.tolist()
    (5, [63, 64, 65, 66, 67])
    """
    rng = np.random.default_rng(seed)
    kind = rng.choice(len(MIX), size=n, p=MIX).astype(np.int8)
    slot = np.arange(N_INPUTS, N_INPUTS + n, dtype=np.int64)
    a = slot - 1
    # Bounded slots in order: the inputs, then the sin/cos results. For op i (slot s = 64 + i), the earlier operand
    # is drawn among bounded slots < s - 1 (strictly before the previous value): 63 inputs at least.
    bounded = np.concatenate([np.arange(N_INPUTS, dtype=np.int64), slot[(kind == SIN) | (kind == COS)]])
    count = np.searchsorted(bounded, a, side="left")  # bounded slots < s - 1
    pick = (rng.random(n) * count).astype(np.int64)
    b = bounded[np.minimum(pick, count - 1)]
    b[(kind == SIN) | (kind == COS)] = -1
    scale = kind == SCALE
    b[scale] = rng.integers(0, len(CONSTANTS), size=int(scale.sum()))
    return Dag(kind, a, b)


def dag_input(seed: int = 0) -> np.ndarray:
    """The benchmark's input vector: 64 values uniform in [-1, 1].

    >>> dag_input(0).shape
    (64,)
    """
    return np.random.default_rng(seed + 1000).uniform(-1.0, 1.0, N_INPUTS)


def dag_graph(d: Dag) -> opgraph.Graph:
    """The opgraph graph of ``d``, made with ``Graph.from_arrays`` (no per-op Python).

    Ops: one ``const`` per scaling constant, 64 ``getitem`` of ``x`` (``x[j]``), then ``d``'s ops in order; the
    output is the last op's result.

    >>> dag_graph(random_dag(100)).num_ops
    172
    """
    from opgraph import Graph, TensorType, get_op

    n, nc = d.n, len(CONSTANTS)
    first = 1 + nc  # value id of slot 0 (x[0]); value 0 is x, values 1..nc the constants
    kinds = np.array([get_op(k).id for k in KIND_NAMES], dtype=np.int32)
    op_kind = np.concatenate([np.full(nc, get_op("const").id, dtype=np.int32),
                              np.full(N_INPUTS, get_op("getitem").id, dtype=np.int32), kinds[d.kind]])
    # attrs: 0 = none, 1..nc = const index k, nc+1..nc+64 = getitem index j
    attrs: list[Any] = [(), *[(("index", k),) for k in range(nc)], *[(("index", (j,)),) for j in range(N_INPUTS)]]
    op_attr = np.concatenate([np.arange(1, nc + 1, dtype=np.int32), np.arange(nc + 1, nc + 1 + N_INPUTS,
                                                                               dtype=np.int32),
                              np.zeros(n, dtype=np.int32)])
    unary = (d.kind == SIN) | (d.kind == COS)
    arity = np.where(unary, 1, 2).astype(np.int64)
    in_ptr = np.zeros(nc + N_INPUTS + n + 1, dtype=np.int64)
    in_ptr[nc + 1:nc + 1 + N_INPUTS] = np.arange(1, N_INPUTS + 1)  # each getitem reads x
    in_ptr[nc + N_INPUTS + 1:] = N_INPUTS + np.cumsum(arity)
    second = np.where(d.kind == SCALE, 1 + d.b, d.b + first)  # a scaling reads its constant's value
    pairs = np.stack([d.a + first, second], axis=1)
    in_ids = np.concatenate([np.zeros(N_INPUTS, dtype=np.int64), pairs.reshape(-1)[np.repeat(~unary, 2)
                                                                                   | np.tile([True, False], n)]])
    total = nc + N_INPUTS + n
    types = [TensorType("float64", (N_INPUTS,)), TensorType("float64", ())]
    value_type = np.ones(total + 1, dtype=np.int32)
    value_type[0] = 0
    return Graph.from_arrays(
        op_kind=op_kind, op_attr=op_attr, attrs=attrs, constants=[np.array(c) for c in CONSTANTS],
        in_ptr=in_ptr, in_ids=in_ids.astype(np.int32), out_ptr=np.arange(total + 1, dtype=np.int64),
        out_ids=np.arange(1, total + 1, dtype=np.int32), value_type=value_type, types=types, inputs=[0],
        outputs=[total])


def dag_reference(d: Dag, x: np.ndarray) -> float:
    """The DAG's value at ``x`` in Python floats and ``math`` (independent of NumPy, opgraph and CasADi).

    >>> d = random_dag(3, seed=2); round(dag_reference(d, dag_input()), 12) == round(dag_reference(d, dag_input()), 12)
    True
    """
    v = [float(t) for t in x] + [0.0] * d.n
    for i, (k, a, b) in enumerate(zip(d.kind.tolist(), d.a.tolist(), d.b.tolist(), strict=True)):
        p = v[a]
        v[N_INPUTS + i] = (p + v[b] if k == ADD else p - v[b] if k == SUB else p * v[b] if k == MUL
                           else math.sin(p) if k == SIN else math.cos(p) if k == COS else p * CONSTANTS[b])
    return v[-1]


def _replay(d: Dag, elems: list[Any], sin: Callable[[Any], Any], cos: Callable[[Any], Any], consts: list[Any],
            binary: tuple[Callable[[Any, Any], Any], ...] = (operator.add, operator.sub, operator.mul)) -> Any:
    """``d``'s output from the input elements ``elems``, with the given library's functions, one call per op."""
    add, sub, mul = binary
    v = elems + [None] * d.n
    for i, (k, a, b) in enumerate(zip(d.kind.tolist(), d.a.tolist(), d.b.tolist(), strict=True)):
        p = v[a]
        v[N_INPUTS + i] = (add(p, v[b]) if k == ADD else sub(p, v[b]) if k == SUB else mul(p, v[b]) if k == MUL
                           else sin(p) if k == SIN else cos(p) if k == COS else mul(p, consts[b]))
    return v[-1]


def dag_casadi(d: Dag) -> tuple[Any, Any]:
    """``(x, y)``: CasADi's ``SX.sym("x", 64)`` and the DAG's output as an SX expression of it.

    >>> import casadi
    >>> x, y = dag_casadi(random_dag(10)); y.shape
    (1, 1)
    """
    import casadi

    x = casadi.SX.sym("x", N_INPUTS)
    elems = [x[j] for j in range(N_INPUTS)]
    return x, _replay(d, elems, casadi.sin, casadi.cos, [casadi.SX(float(c)) for c in CONSTANTS])


def dag_traced(d: Dag) -> Callable[[Any], Any]:
    """The DAG as a Python function of ``x`` over ``opgraph.numpy`` (for ``opgraph.grad`` / ``opgraph.jit``).

    >>> f = dag_traced(random_dag(50)); float(opgraph.jit(f)(dag_input())) == dag_reference(random_dag(50), dag_input())
    True
    """
    import opgraph.numpy as onp

    consts = [onp.asarray(np.float64(c)) for c in CONSTANTS]

    def f(x: Any) -> Any:
        return _replay(d, [x[j] for j in range(N_INPUTS)], onp.sin, onp.cos, consts)

    return f


# ----------------------------------------------------------------------------- RK4
RK4_H = 0.01
RK4_STATES = 4


def pendulums(s: tuple[Any, Any, Any, Any], sin: Callable[[Any], Any]) -> tuple[Any, Any, Any, Any]:
    """Two damped pendulums coupled by a spring: ``(th1, w1, th2, w2)'``."""
    th1, w1, th2, w2 = s
    g, k, c = 9.81, 0.6, 0.1
    spring = k * (th2 - th1)
    return (w1, -g * sin(th1) - c * w1 + spring, w2, -g * sin(th2) - c * w2 - spring)


def rk4(steps: int, sin: Callable[[Any], Any]) -> Callable[[Any], tuple[Any, Any, Any, Any]]:
    """``steps`` classic RK4 steps of :func:`pendulums` from state ``x`` (indexable by 0..3), the final state.

    >>> import math
    >>> s = rk4(100, math.sin)([0.3, 0.0, -0.2, 0.1]); len(s), abs(s[0]) < 1
    (4, True)
    """
    h = RK4_H

    def run(x: Any) -> tuple[Any, Any, Any, Any]:
        s = (x[0], x[1], x[2], x[3])
        for _ in range(steps):
            k1 = pendulums(s, sin)
            k2 = pendulums(tuple(si + (h / 2) * ki for si, ki in zip(s, k1, strict=True)), sin)  # type: ignore[arg-type]
            k3 = pendulums(tuple(si + (h / 2) * ki for si, ki in zip(s, k2, strict=True)), sin)  # type: ignore[arg-type]
            k4 = pendulums(tuple(si + h * ki for si, ki in zip(s, k3, strict=True)), sin)  # type: ignore[arg-type]
            s = tuple(si + (h / 6) * (a + 2 * b + 2 * c + d)  # type: ignore[assignment]
                      for si, a, b, c, d in zip(s, k1, k2, k3, k4, strict=True))
        return s

    return run


def rk4_input() -> np.ndarray:
    """The initial state of the RK4 benchmark.

    >>> rk4_input().tolist()
    [0.3, 0.0, -0.2, 0.1]
    """
    return np.array([0.3, 0.0, -0.2, 0.1])


def rk4_reference(steps: int, x: np.ndarray) -> np.ndarray:
    """The final state in Python floats (``math.sin``), the independent reference.

    >>> rk4_reference(10, rk4_input()).shape
    (4,)
    """
    return np.array(rk4(steps, math.sin)([float(t) for t in x]), dtype=np.float64)


def dag_grad_graph(d: Dag) -> opgraph.Graph:
    """The DAG op by op in a ``GraphBuilder``, then ``build_grad_ops``: a graph of ``x`` giving ``d y / d x``
    (the graph-level gradient; about 1-2 us per op to build, where tracing a Python function takes ~100).

    >>> g = dag_grad_graph(random_dag(20)); g.type_of(int(g.outputs[0])).shape
    (64,)
    """
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (N_INPUTS,)), name="x")
    op = b.op
    consts = [b.constant(np.array(c)) for c in CONSTANTS]
    elems = [op("getitem", x, index=(j,)) for j in range(N_INPUTS)]
    y = _replay(d, elems, lambda v: op("sin", v), lambda v: op("cos", v), consts,
                (lambda p, q: op("add", p, q), lambda p, q: op("subtract", p, q), lambda p, q: op("multiply", p, q)))
    b.output(b.build_grad_ops(y, [x])[0])
    return b.freeze()
