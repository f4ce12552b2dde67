"""ONNX -> opgraph translators: the ``ai.onnx.preview.training`` domain (Gradient and the optimisers).

``Gradient`` is built with opgraph's own reverse mode
(:meth:`~opgraph.core.builder.GraphBuilder.build_grad_ops`): the gradient ops
are appended to the graph being imported, so they are optimised and run like
any other op. ``Adagrad``, ``Adam`` and ``Momentum`` are composed from
elementwise ops following the pseudo code of the ONNX operator docs; each node
may update several tensors at once (inputs ``R, T, X1..Xn, G1..Gn, ...``).

    >>> import numpy as np, onnx
    >>> from onnx import TensorProto, helper
    >>> from opgraph.io.onnx import from_onnx
    >>> node = helper.make_node("Momentum", ["R", "T", "X", "G", "V"], ["X_new", "V_new"], alpha=0.9, beta=1.0,
    ...                         mode="standard", norm_coefficient=0.0, domain="ai.onnx.preview.training")
    >>> vi = helper.make_tensor_value_info
    >>> graph = helper.make_graph([node], "g", [vi("R", TensorProto.FLOAT, []), vi("T", TensorProto.INT64, []),
    ...     vi("X", TensorProto.FLOAT, [2]), vi("G", TensorProto.FLOAT, [2]), vi("V", TensorProto.FLOAT, [2])],
    ...     [vi("X_new", TensorProto.FLOAT, [2]), vi("V_new", TensorProto.FLOAT, [2])])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
    ...                                                 helper.make_opsetid("ai.onnx.preview.training", 1)])
    >>> g = from_onnx(model)
    >>> x_new, v_new = g.run({"R": np.float32(0.5), "T": np.int64(0), "X": np.float32([1, 2]),
    ...                       "G": np.float32([2, 2]), "V": np.float32([0, 1])})
    >>> np.round(x_new, 4).tolist(), np.round(v_new, 4).tolist()
    ([0.0, 0.55], [2.0, 2.9])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opgraph.autodiff import build_vjp_ops
from opgraph.core.graph import Value
from opgraph.core.types import TensorType
from opgraph.io.onnx._core import Node, translates

TRAINING = "ai.onnx.preview.training"


# ---------------------------------------------------------------- Gradient
@translates("Gradient", domain=TRAINING)
def _gradient(node: Node, *inputs: Any) -> Any:
    xs = tuple(node.attr("xs"))
    zs = tuple(node.attr("zs", ()))
    y_name = node.attr("y")
    if len(inputs) != len(xs) + len(zs):
        raise node.error(f"has {len(inputs)} inputs but names {len(xs)} xs and {len(zs)} zs")
    named = [_lookup(node, n) for n in (*xs, *zs)]
    y = _lookup(node, y_name)
    for name, v in zip(xs, named, strict=False):
        if node.known(v) is not None:
            # the importer folded everything computed from a constant, so no op path leads from it to y
            raise node.error(f"x {name!r} is a constant while importing, so opgraph folded the computation "
                             f"of {y_name!r} from it and cannot differentiate it: make it a graph input")
        t = v.type
        if not (isinstance(t, TensorType) and t.dtype.kind in "fc"):
            raise node.error(f"cannot differentiate with respect to {name!r} of type {t} "
                             "(only floating tensors have gradients)")
    if not (isinstance(y.type, TensorType) and y.type.dtype.kind == "f"):
        raise node.error(f"y {y_name!r} must be a floating tensor, not {y.type}")
    # The node's inputs give the point at which to differentiate; when they are not the named
    # values themselves, the computation of y is rebuilt on them.
    at = list(inputs)
    for i, a in enumerate(at):
        if not isinstance(a, Value):
            raise node.error(f"input {i} must be a tensor")
    if any(a.id != v.id for a, v in zip(at, named, strict=True)):
        y = _replay(node, y, {v.id: a for v, a in zip(named, at, strict=True)})
    wrt = at[:len(xs)]
    b = node.imp.b
    if y.type.shape == ():
        return tuple(b.build_grad_ops(y, wrt))
    # ONNX does not define the gradient of a non-scalar y: seeding every element with 1 gives the
    # gradient of the sum of y's elements, which is the scalar case when y has one element
    ones = node.const(np.ones(y.type.shape, dtype=y.type.dtype))
    return tuple(build_vjp_ops(b, [y], wrt, [ones]))


def _lookup(node: Node, name: str) -> Value:
    try:
        v = node.scope.lookup(name) if node.scope is not None else None
    except KeyError:
        v = None
    if not isinstance(v, Value):
        raise node.error(f"names {name!r}, which is not a tensor computed before this node")
    return v


def _replay(node: Node, y: Value, subst: dict[int, Value]) -> Value:
    """``y`` recomputed with the values in ``subst`` (by id) replaced, reusing what does not depend on them."""
    b = node.imp.b
    memo: dict[int, Value] = dict(subst)
    stack = [y.id]
    while stack:  # depth first without recursion: imported graphs can be deep chains
        vid = stack[-1]
        if vid in memo:
            stack.pop()
            continue
        op = b.producer_of(vid)
        if op is None:
            memo[vid] = Value(b, vid)
            stack.pop()
            continue
        old = [v.id for v in op.inputs]
        pending = [i for i in old if i not in memo]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        ins = [memo[i] for i in old]
        if all(n.id == i for n, i in zip(ins, old, strict=True)):
            outs = op.outputs
        else:
            # b.op, not node.op: folding would cut the path the gradient has to follow
            new = b.op(op.kind, *ins, **op.attrs)
            outs = list(new) if isinstance(new, tuple) else [new]
        for o, n in zip(op.outputs, outs, strict=True):
            memo[o.id] = n
    return memo[y.id]


# ---------------------------------------------------------------- optimisers
def _groups(node: Node, inputs: tuple[Any, ...], per_tensor: int) -> tuple[Any, Any, list[list[Any]]]:
    """``R``, ``T`` and, per optimised tensor, its ``per_tensor`` inputs (X, G, then the state tensors)."""
    if len(inputs) < 2 + per_tensor or (len(inputs) - 2) % per_tensor:
        raise node.error(f"expects R, T and {per_tensor} inputs per optimised tensor, got {len(inputs)} inputs")
    r, t, rest = inputs[0], inputs[1], inputs[2:]
    if any(v is None for v in inputs):
        raise node.error("has an omitted input; every input is required")
    n = len(rest) // per_tensor
    groups = [[rest[k * n + i] for k in range(per_tensor)] for i in range(n)]
    for g in groups:
        if node.dtype(g[0]).kind != "f":
            raise node.error(f"optimises a tensor of dtype {node.dtype(g[0])}; only floating tensors can be")
    if node.shape(r) not in ((), (1,)) or node.shape(t) not in ((), (1,)):
        raise node.error(f"R and T must be scalars, got shapes {node.shape(r)} and {node.shape(t)}")
    return node.op("reshape", r, shape=()), node.op("reshape", t, shape=()), groups


def _regularized(node: Node, x: Any, g: Any) -> Any:
    # G_regularized = norm_coefficient * X + G (the gradient of 0.5 * norm_coefficient * ||X||^2 added)
    c = float(node.attr("norm_coefficient", 0.0))
    g = node.cast(g, node.dtype(x))
    if c == 0.0:
        return g
    return node.op("add", node.op("multiply", node.const(c, node.dtype(x)), x), g)


def _outputs(per_group: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    # ONNX orders the outputs by kind first: X1_new..Xn_new, then V1_new..Vn_new, ...
    return tuple(out[k] for k in range(len(per_group[0])) for out in per_group)


@translates("Adagrad", domain=TRAINING)
def _adagrad(node: Node, *inputs: Any) -> Any:
    r, t, groups = _groups(node, inputs, 3)
    decay, eps = float(node.attr("decay_factor", 0.0)), float(node.attr("epsilon", 1e-6))
    # r = R / (1 + T * decay_factor), a scalar: computed in float64 like ONNX's reference
    rate = node.op("divide", node.cast(r, np.float64),
                   node.op("add", node.const(1.0),
                           node.op("multiply", node.cast(t, np.float64), node.const(decay))))
    out = []
    for x, g, h in groups:
        dt = node.dtype(x)
        g_reg = _regularized(node, x, g)
        h_new = node.op("add", node.cast(h, dt), node.op("multiply", g_reg, g_reg))
        h_adaptive = node.op("add", node.op("sqrt", h_new), node.const(eps, dt))
        step = node.op("divide", node.op("multiply", node.cast(rate, dt), g_reg), h_adaptive)
        out.append((node.op("subtract", x, step), node.cast(h_new, node.dtype(h))))
    return _outputs(out)


@translates("Adam", domain=TRAINING)
def _adam(node: Node, *inputs: Any) -> Any:
    r, t, groups = _groups(node, inputs, 4)
    alpha, beta = float(node.attr("alpha", 0.9)), float(node.attr("beta", 0.999))
    eps = float(node.attr("epsilon", 1e-6))
    post = float(node.attr("norm_coefficient_post", 0.0))
    # R_adjusted = T > 0 ? R * sqrt(1 - beta**T) / (1 - alpha**T) : R. T is clamped to 1 inside the
    # unselected branch so that T = 0 does not divide by zero there.
    r64 = node.cast(r, np.float64)
    t64 = node.cast(node.op("maximum", t, node.const(1, node.dtype(t))), np.float64)
    one = node.const(1.0)
    corrected = node.op("divide",
                        node.op("multiply", r64,
                                node.op("sqrt", node.op("subtract", one, node.op("power", node.const(beta), t64)))),
                        node.op("subtract", one, node.op("power", node.const(alpha), t64)))
    rate = node.op("where", node.op("greater", t, node.const(0, node.dtype(t))), corrected, r64)
    out = []
    for x, g, v, h in groups:
        dt = node.dtype(x)
        g_reg = _regularized(node, x, g)
        v_new = node.op("add", node.op("multiply", node.const(alpha, dt), node.cast(v, dt)),
                        node.op("multiply", node.const(1.0 - alpha, dt), g_reg))
        h_new = node.op("add", node.op("multiply", node.const(beta, dt), node.cast(h, dt)),
                        node.op("multiply", node.const(1.0 - beta, dt), node.op("multiply", g_reg, g_reg)))
        h_sqrt = node.op("add", node.op("sqrt", h_new), node.const(eps, dt))
        x_new = node.op("subtract", x, node.op("multiply", node.cast(rate, dt), node.op("divide", v_new, h_sqrt)))
        if post != 0.0:
            x_new = node.op("multiply", node.const(1.0 - post, dt), x_new)
        out.append((x_new, node.cast(v_new, node.dtype(v)), node.cast(h_new, node.dtype(h))))
    return _outputs(out)


@translates("Momentum", domain=TRAINING)
def _momentum(node: Node, *inputs: Any) -> Any:
    r, t, groups = _groups(node, inputs, 3)
    alpha, beta = float(node.attr("alpha")), float(node.attr("beta"))
    mode = node.attr("mode")
    if mode not in ("standard", "nesterov"):
        raise node.error(f"mode must be 'standard' or 'nesterov', not {mode!r}")
    out = []
    for x, g, v in groups:
        dt = node.dtype(x)
        g_reg = _regularized(node, x, g)
        # beta_adjusted = T > 0 ? beta : 1 (the first step takes the whole gradient)
        beta_adj = node.op("where", node.op("greater", t, node.const(0, node.dtype(t))),
                           node.const(beta, dt), node.const(1.0, dt))
        v_new = node.op("add", node.op("multiply", node.const(alpha, dt), node.cast(v, dt)),
                        node.op("multiply", beta_adj, g_reg))
        direction = v_new if mode == "standard" else \
            node.op("add", g_reg, node.op("multiply", node.const(alpha, dt), v_new))
        x_new = node.op("subtract", x, node.op("multiply", node.cast(r, dt), direction))
        out.append((x_new, node.cast(v_new, node.dtype(v))))
    return _outputs(out)
