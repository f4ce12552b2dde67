"""Control-flow family (ids 1300-1399): function calls, conditionals and loops over subgraph bodies.

Each op holds its bodies as attributes (:class:`~opgraph.core.subgraph.Subgraph`:
an ordinary graph whose inputs are the body's parameters and whose outputs
its results). Values of the enclosing graph a body needs are passed to it
explicitly, as its first ``num_consts`` parameters (the op's first inputs),
so a body never refers to anything outside itself. The layouts follow
``jax.lax``'s primitives:

* ``call(*args, body)``: ``body(*args)``.
* ``cond(pred, *operands, then_body, else_body)``: ``then_body(*operands)``
  if ``pred`` (a one-element tensor, nonzero is true) else ``else_body(*operands)``.
* ``while_loop(*consts, *init, cond_body, body, num_consts, max_trip)``:
  ``carry = init; while cond_body(*consts, *carry): carry, ys_i = body(*consts, *carry)``;
  the results are the final carry, then each extra body result stacked
  along a new leading axis (its length is the trip count, known at run
  time). ``max_trip`` (optional) bounds the trip count; reverse-mode
  differentiation needs it.
* ``scan(*consts, *init, *xs, body, num_consts, num_carry, length, reverse)``:
  ``for i in range(length): carry, ys[i] = body(*consts, *carry, *(x[i] for x in xs))``
  (``i`` runs backwards with ``reverse``); the results are the final carry,
  then the stacked ``ys``.

The type rules check the bodies against the operands (count, dtype, shape;
a dynamic dim matches any size) and name the body, the position and the
user's line on a mismatch. The NumPy kernels run each body through its
compiled form (:data:`opgraph.core.hooks.BODY`, filled by the runtime), built
once per body.

    >>> import numpy as np, opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> sb = opgraph.GraphBuilder()
    >>> c, x = sb.input(("float64", (2,)), name="c"), sb.input(("float64", (2,)), name="x")
    >>> c2 = sb.add(sb.multiply(c, 0.5), x)
    >>> sb.output(c2, sb.sum(c2))
    >>> step = Subgraph(sb.freeze(), name="step")
    >>> b = opgraph.GraphBuilder()
    >>> init, xs = b.input(("float64", (2,)), name="init"), b.input(("float64", (4, 2)), name="xs")
    >>> carry, ys = b.op("scan", init, xs, body=step, num_carry=1)
    >>> ys.type
    f64[4]
    >>> b.output(carry, ys); g = b.freeze()
    >>> out = g.run({"init": np.zeros(2), "xs": np.ones((4, 2))})
    >>> out[0], out[1]
    (array([1.875, 1.875]), array([2.  , 3.  , 3.5 , 3.75]))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.core import hooks
from opgraph.core.registry import CONST, Attr, OpDef, attr_bool, attr_int, get_op, optional, register_op, set_rules
from opgraph.core.subgraph import Subgraph, attr_subgraph
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import OpTypeError
from opgraph.ops._common import write_out
from opgraph.ops.batch_helpers import broadcast_batch
from opgraph.ops.grad_helpers import is_float, zeros_like

FAMILY = "control"

BodyFn = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


# ---------------------------------------------------------------- type-rule pieces
def dims_match(a: int | None, b: int | None) -> bool:
    """Whether two dims can be the same size (an unknown dim matches any).

    >>> dims_match(3, None), dims_match(3, 4)
    (True, False)
    """
    return a is None or b is None or a == b


def types_match(actual: ValueType, expected: ValueType) -> bool:
    """Whether a value of type ``actual`` may be passed where ``expected`` is declared.

    >>> types_match(TensorType("f8", (3,)), TensorType("f8", (None,))), types_match(
    ...     TensorType("f8", (3,)), TensorType("f4", (3,)))
    (True, False)
    """
    if not isinstance(actual, TensorType) or not isinstance(expected, TensorType):
        return actual == expected
    if actual.dtype != expected.dtype:
        return False
    if actual.shape is None or expected.shape is None:
        return True
    return len(actual.shape) == len(expected.shape) and all(
        dims_match(a, e) for a, e in zip(actual.shape, expected.shape, strict=True))


def merge_types(a: ValueType, b: ValueType) -> ValueType:
    """The most precise type both ``a`` and ``b`` are instances of (dims that differ become unknown).

    >>> merge_types(TensorType("f8", (3, 2)), TensorType("f8", (4, 2)))
    f64[?,2]
    """
    if not isinstance(a, TensorType) or not isinstance(b, TensorType) or a.dtype != b.dtype:
        return a
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorType(a.dtype, None)
    return TensorType(a.dtype, tuple(x if x == y else None for x, y in zip(a.shape, b.shape, strict=True)))


def check_params(op: str, role: str, body: Subgraph, given: Sequence[ValueType], what: Sequence[str]) -> None:
    """Raise :class:`OpTypeError` unless ``body`` takes parameters of the ``given`` types.

    ``what[i]`` names parameter ``i`` for the message (``"carry[0]"``, ``"x[1]"``).
    """
    if body.num_inputs != len(given):
        raise OpTypeError(f"{role} body {body.label} takes {body.num_inputs} parameter(s) but {op} passes "
                          f"{len(given)} ({', '.join(what) or 'none'})")
    for i, (t, want) in enumerate(zip(given, body.in_types, strict=True)):
        if not types_match(t, want):
            raise OpTypeError(f"{role} body {body.label} parameter {i} ({what[i]}) is {want} but {op} passes {t}")


def check_results(op: str, role: str, body: Subgraph, expected: Sequence[ValueType], what: Sequence[str],
                  *, at_least: bool = False) -> None:
    """Raise :class:`OpTypeError` unless ``body``'s first results have the ``expected`` types."""
    n = body.num_outputs
    if n < len(expected) or (n != len(expected) and not at_least):
        need = f"at least {len(expected)}" if at_least else str(len(expected))
        raise OpTypeError(f"{role} body {body.label} returns {n} result(s) but {op} needs {need} "
                          f"({', '.join(what) or 'none'})")
    for i, (want, got) in enumerate(zip(expected, body.out_types, strict=False)):
        if not types_match(got, want):
            raise OpTypeError(f"{role} body {body.label} returns {got} at position {i} ({what[i]}) "
                              f"where {op} needs {want}")


def is_predicate(t: ValueType) -> bool:
    """Whether a value of type ``t`` can be a predicate: a tensor of one element (or of unknown size).

    >>> is_predicate(TensorType("bool", (1, 1))), is_predicate(TensorType("f8", (2,)))
    (True, False)
    """
    return isinstance(t, TensorType) and (t.shape is None or all(d in (1, None) for d in t.shape))


def _stacked(t: ValueType, n: int | None) -> TensorType:
    if not isinstance(t, TensorType):
        raise OpTypeError(f"a stacked result must be a tensor, got {t}")
    return TensorType(t.dtype, None if t.shape is None else (n, *t.shape))


def _version(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> int:
    return 0


def _counts(attrs: dict[str, Any], n_in: int) -> tuple[int, int]:
    nc = attrs["num_consts"]
    if not 0 <= nc <= n_in:
        raise OpTypeError(f"num_consts={nc} but the op has {n_in} input(s)")
    return nc, n_in - nc


# ---------------------------------------------------------------- running bodies
def body_fn(body: Subgraph) -> BodyFn:
    """The body as a function of a list of arrays returning a list of fresh arrays (compiled once)."""
    return hooks.BODY.get()(body)  # type: ignore[no-any-return]


def _results(res: Sequence[np.ndarray], out: Any) -> Any:
    return write_out(res[0] if len(res) == 1 else tuple(res), out)


def _truth(pred: np.ndarray) -> bool:
    p = np.asarray(pred)
    if p.size != 1:
        raise ValueError(f"the predicate must have one element, got shape {p.shape}")
    return bool(p.reshape(-1)[0])


def _no_rows(t: ValueType) -> np.ndarray:
    """The stacked result of zero trips for a y of type ``t``: no rows, the y's rank (unknown dims as 0).

    >>> _no_rows(TensorType("f4", (None, 3))).shape
    (0, 0, 3)
    """
    shape = () if not isinstance(t, TensorType) or t.shape is None else tuple(d or 0 for d in t.shape)
    return np.empty((0, *shape), dtype=t.dtype)  # type: ignore[union-attr]


def _fresh(a: np.ndarray) -> np.ndarray:
    return np.array(a, copy=True)


# ---------------------------------------------------------------- gradient rules
# The rules build their bodies with a GraphBuilder (core); the one step that needs the autodiff layer, a body's
# vector-Jacobian body, is reached through hooks.BODY_VJP (ops may not import autodiff). The scheme, its
# memory cost and the while_loop restriction are in docs/control-flow.md ("Gradients").
def inline_body(b: Any, body: Subgraph, args: Sequence[Any], bound: dict[int, Any] | None = None) -> list[Any]:
    """Append the ops of ``body`` to emitter ``b`` on ``args`` (one per parameter); return its results.

    Only the ops the results need are copied, so unused results cost nothing.
    ``bound`` maps values of the body to emitter values that stand for them:
    an op whose outputs are all bound is not copied (what only it needed may
    still be; a DCE removes that).

    >>> import numpy as np, opgraph
    >>> sb = opgraph.GraphBuilder(); p = sb.input(("float64", (2,)), name="p"); sb.output(sb.exp(p))
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,)), name="x")
    >>> (y,) = inline_body(b, Subgraph(sb.freeze()), [x])
    >>> b.run({x: np.zeros(2)}, [y])[0]
    array([1., 1.])
    """
    g = body.graph
    if len(args) != body.num_inputs:
        raise ValueError(f"body {body.label} takes {body.num_inputs} parameter(s), got {len(args)}")
    env: dict[int, Any] = {int(v): a for v, a in zip(g.inputs, args, strict=True)}
    if bound:
        env.update(bound)
    needed = g.needed_ops(g.outputs)
    for op in g.topological_order():
        op = int(op)
        if not needed[op]:
            continue
        outs = g.op_outputs(op)
        if bound and all(int(v) in env for v in outs):
            continue
        kind = int(g.op_kind[op])
        if kind == CONST.id:
            env[int(outs[0])] = b.constant(g.constant_of(op))
            continue
        res = b.op(kind, *[env[int(v)] for v in g.op_inputs(op)], **g.attrs_of(op))
        res = list(res) if isinstance(res, (tuple, list)) else [res]
        for v, r in zip(outs, res, strict=True):
            env[int(v)] = r
    return [env[int(v)] for v in g.outputs]


def _as_list(res: Any) -> list[Any]:
    return list(res) if isinstance(res, (tuple, list)) else [res]


def _vjp(body: Subgraph, wrt: Sequence[int], cts: Sequence[int], given: Sequence[int] = ()) -> Subgraph:
    """``(*params, *ct of results cts, *results given) -> ct of params wrt`` (built and cached by the autodiff
    layer; see :func:`opgraph.autodiff.control.vjp_body`)."""
    return hooks.BODY_VJP.get()(body, tuple(wrt), tuple(cts), tuple(given))  # type: ignore[no-any-return]


def _no_gradient(message: str) -> Exception:
    import sys

    # A rule only runs under the autodiff sweep, so its module (and error class) is loaded; looked up, not
    # imported, to keep ops below autodiff.
    reverse = sys.modules.get("opgraph.autodiff.reverse")
    return reverse.NoGradientError(message) if reverse is not None else OpTypeError(message)


def _scatter(n: int, where: Sequence[int], values: Sequence[Any]) -> list[Any]:
    res: list[Any] = [None] * n
    for i, v in zip(where, values, strict=True):
        res[i] = v
    return res


def _wanted(inputs: Sequence[Any], needed: Sequence[bool] | None) -> list[int]:
    """The float inputs a cotangent is asked for (all of them when the sweep does not say)."""
    return [i for i, v in enumerate(inputs) if is_float(v.type) and (needed is None or needed[i])]


def _call_grad(b: Any, inputs: Sequence[Any], outputs: Sequence[Any], cots: Sequence[Any],
               attrs: dict[str, Any], needed: Sequence[bool] | None = None) -> list[Any]:
    wrt = _wanted(inputs, needed)
    cts = [j for j, c in enumerate(cots) if c is not None]
    if not wrt or not cts:
        return [None] * len(inputs)
    g = b.op("call", *inputs, *[cots[j] for j in cts], body=_vjp(attrs["body"], wrt, cts))
    return _scatter(len(inputs), wrt, _as_list(g))


def _cond_grad(b: Any, inputs: Sequence[Any], outputs: Sequence[Any], cots: Sequence[Any],
               attrs: dict[str, Any], needed: Sequence[bool] | None = None) -> list[Any]:
    operands = inputs[1:]
    wrt = _wanted(operands, None if needed is None else needed[1:])
    cts = [j for j, c in enumerate(cots) if c is not None]
    if not wrt or not cts:
        return [None] * len(inputs)
    g = b.op("cond", inputs[0], *operands, *[cots[j] for j in cts],
             then_body=_vjp(attrs["then_body"], wrt, cts), else_body=_vjp(attrs["else_body"], wrt, cts))
    return [None, *_scatter(len(operands), wrt, _as_list(g))]


def _carry_stacker(body: Subgraph, nc: int, ncarry: int) -> Subgraph:
    """The scan step that returns its new carry and, as its y, the carry it was given (its ys are not computed)."""
    from opgraph.core.builder import GraphBuilder

    def make() -> Subgraph:
        sb = GraphBuilder()
        params = [sb.input(t) for t in body.in_types]
        res = inline_body(sb, Subgraph(_keep_outputs(body.graph, range(ncarry))), params)
        sb.output(*res, *params[nc:nc + ncarry])
        return Subgraph(sb.freeze(), name=f"stack_carry({body.name})")

    return body.cache(("grad-carry-stacker", nc, ncarry), make)  # type: ignore[no-any-return]


def pruned_body(g: Any, name: str = "") -> Subgraph:
    """``g`` as a body named ``name`` without the ops none of its results needs (its parameters all kept).

    >>> import opgraph
    >>> sb = opgraph.GraphBuilder(); x = sb.input(("float64", ()), name="x")
    >>> unused = sb.exp(x); sb.output(sb.sin(x))
    >>> pruned_body(sb.freeze(), "f")
    Subgraph('f': (f64[]) -> (f64[]), 1 op)
    """
    from opgraph.core.builder import GraphBuilder

    sb = GraphBuilder()
    params = [sb.input(g.type_of(int(v)), name=g.name_of(int(v))) for v in g.inputs]
    sb.output(*inline_body(sb, Subgraph(g), params))
    return Subgraph(sb.freeze(), name=name)


def _keep_outputs(g: Any, keep: Any) -> Any:
    return g.replace(outputs=np.asarray(g.outputs)[list(keep)])


def _factored(vjp: Subgraph, n_const_grads: int, const_types: Sequence[Any]) -> dict[int, Any]:
    """Const cotangents of a vjp body that are one 2-D ``matmul(u, v)`` worth stacking (see :func:`scan_vjp`).

    Maps the result position to the matmul's op id. Kept only where the two
    factors are no larger than the product (an outer product ``(m,1)@(1,k)``
    is the common case: a weight matrix's gradient in an RNN step).
    """
    g = vjp.graph
    found: dict[int, Any] = {}
    for o in range(n_const_grads):
        op = int(g.value_producer[g.outputs[o]])
        if op < 0 or g.kind_of(op) != "matmul":
            continue
        u, v = (g.type_of(int(x)) for x in g.op_inputs(op))
        out = g.type_of(int(g.outputs[o]))
        shapes = [getattr(t, "shape", None) for t in (u, v, out)]
        if any(sh is None or len(sh) != 2 or None in sh for sh in shapes) or out != const_types[o]:
            continue
        (m, r), (_, k) = shapes[0], shapes[1]  # type: ignore[misc]
        if m * r + r * k <= m * k:
            found[o] = op
    return found


def _given_results(body: Subgraph, wrt: Sequence[int], cts: Sequence[int],
                   candidates: Sequence[int]) -> tuple[int, ...]:
    """Which of the ``candidates`` results the vector-Jacobian body reads when they are given (the rest it does not
    need, or computes anyway), so a scan's reverse pass is handed only those."""
    if not candidates:
        return ()
    g = _vjp(body, wrt, cts, candidates).graph
    first = body.num_inputs + len(cts)
    read = set(g.in_ids.tolist()) | set(g.outputs.tolist())
    return tuple(j for n, j in enumerate(candidates) if int(g.inputs[first + n]) in read)


def _reverse_body(body: Subgraph, nc: int, ncarry: int, fc: Sequence[int], fcar: Sequence[int],
                  fx: Sequence[int], cy: Sequence[int], given: Sequence[int] = ()) -> tuple[Subgraph, tuple[int, ...],
                                                                                      tuple[Any, ...]]:
    """The step of the reverse scan, the positions in ``fc`` of the stacked-factor const cotangents, and
    for each of those where its left factor comes from (see :func:`_scanned_source`).

    Its parameters: consts, carry cotangents, const-cotangent sums, the step's carry, its xs, its ys'
    cotangents, then the step's results listed in ``given`` (read instead of recomputed). Its results:
    the carries' cotangents, the const-cotangent sums, the xs' cotangents, then per stacked-factor
    cotangent its left factor (unless it is a scanned parameter transposed) and its right factor."""
    from opgraph.core.builder import GraphBuilder

    def make() -> tuple[Subgraph, tuple[int, ...], tuple[Any, ...]]:
        nx = body.num_inputs - nc - ncarry
        ins, outs = body.in_types, body.out_types
        wrt = [*fc, *(nc + k for k in fcar), *(nc + ncarry + k for k in fx)]
        vjp = _vjp(body, wrt, [*fcar, *(ncarry + j for j in cy)], given)
        fact = _factored(vjp, len(fc), [ins[i] for i in fc])
        sources: list[Any] = []
        if fact:
            # the vjp body returning the two factors of those cotangents instead of their product; a left
            # factor that is a scanned parameter transposed (x^T in x^T @ delta) is not stacked again: the
            # scan's input already holds it
            g = vjp.graph
            extra = []
            for o in sorted(fact):
                u, v = (int(x) for x in g.op_inputs(fact[o]))
                src = _scanned_source(g, u, nc, ncarry, nx, body.num_inputs + len(fcar) + len(cy))
                sources.append(src)
                extra += [v] if src is not None else [u, v]
            outs_ = np.concatenate([np.asarray(g.outputs), np.asarray(extra, dtype=g.outputs.dtype)])
            vjp = Subgraph(g.replace(outputs=outs_))
        sb = GraphBuilder()
        consts = [sb.input(ins[i], name=f"const{i}") for i in range(nc)]
        ct_carry = [sb.input(ins[nc + k], name=f"ct_carry{k}") for k in fcar]
        acc = [sb.input(ins[fc[o]], name=f"ct_const{fc[o]}") for o in range(len(fc)) if o not in fact]
        carry = [sb.input(ins[nc + k], name=f"carry{k}") for k in range(ncarry)]
        xs = [sb.input(ins[nc + ncarry + k], name=f"x{k}") for k in range(nx)]
        ct_ys = [sb.input(outs[ncarry + j], name=f"ct_y{j}") for j in cy]
        known = [sb.input(outs[j], name=f"result{j}") for j in given]
        g = inline_body(sb, vjp, [*consts, *carry, *xs, *ct_carry, *ct_ys, *known])
        nfc = len(fc)
        g_const, g_carry, g_x = g[:nfc], g[nfc:nfc + len(fcar)], g[nfc + len(fcar):nfc + len(fcar) + len(fx)]
        factors = g[nfc + len(fcar) + len(fx):]
        summed = [sb.add(a, d) for a, d in zip(acc, [g_const[o] for o in range(nfc) if o not in fact], strict=True)]
        sb.output(*g_carry, *summed, *g_x, *factors)
        return pruned_body(sb.freeze(), f"reverse({body.name})"), tuple(sorted(fact)), tuple(sources)

    key = ("grad-reverse-step", nc, ncarry, tuple(fc), tuple(fcar), tuple(fx), tuple(cy), tuple(given))
    return body.cache(key, make)  # type: ignore[no-any-return]


def _scanned_source(g: Any, u: int, nc: int, ncarry: int, nx: int, first_given: int) -> tuple[str, int] | None:
    """Where value ``u`` of vjp body ``g`` is a per-step parameter transposed (``permute_dims(p, (1, 0))``):
    ``("carry", k)``, ``("x", k)`` or ``("given", k)``; None otherwise."""
    op = int(g.value_producer[u])
    if op < 0 or g.kind_of(op) != "permute_dims" or tuple(g.attrs_of(op)["axes"]) != (1, 0):
        return None
    p = int(g.op_inputs(op)[0])
    where = np.flatnonzero(g.inputs == p)
    if not len(where):
        return None
    q = int(where[0])
    if nc <= q < nc + ncarry:
        return ("carry", q - nc)
    if nc + ncarry <= q < nc + ncarry + nx:
        return ("x", q - nc - ncarry)
    if q >= first_given:
        return ("given", q - first_given)
    return None


def _carries_from_ys(b: Any, body: Subgraph, init: Sequence[Any], ys: Sequence[Any], ncarry: int,
                     reverse: bool) -> list[Any] | None:
    """The carry each step received, from the scan's own ys when the body returns every carry as a y too.

    (An RNN step commonly returns ``h, h``.) Step ``i`` got ``init`` first,
    then the previous step's ``y``: ``concat(init[None], ys)[:-1]``, or
    ``concat(ys, init[None])[1:]`` for a reverse scan. None when a carry is
    not among the ys.
    """
    outs = [int(v) for v in body.graph.outputs]
    stacked = []
    for k in range(ncarry):
        try:
            j = outs.index(outs[k], ncarry) - ncarry
        except ValueError:
            return None
        first = b.op("expand_dims", init[k], axis=0)
        parts = (ys[j], first) if reverse else (first, ys[j])
        stacked.append(b.op("getitem", b.op("concat", *parts, axis=0),
                            index=(slice(1, None) if reverse else slice(0, -1),)))
    return stacked


def scan_vjp(b: Any, inputs: Sequence[Any], cots: Sequence[Any], body: Subgraph, num_consts: int,
             num_carry: int, length: int | None, reverse: bool, outputs: Sequence[Any] | None = None,
             needed: Sequence[bool] | None = None) -> list[Any]:
    """Cotangents of a scan's inputs given its outputs' cotangents (None: none), emitted on ``b``.

    A forward scan stacks the carry each step receives (its ys are not
    computed); a scan in the opposite direction then runs the body's
    vector-Jacobian body on (stacked carry, xs, ys cotangents), carrying the
    carry's cotangent and the sum of the consts' cotangents; the xs'
    cotangents are its stacked results. The body's forward ops run again in
    the reverse step (nothing but the carries is stored); when the body
    returns each carry as a y too (``outputs``, the scan's results, given),
    the carries are read off the ys and the extra forward scan is skipped. A const cotangent
    that is one 2-D ``matmul(u, v)`` per step (a weight's outer product) is
    not summed in the loop: the reverse scan stacks ``u`` and ``v`` and one
    matmul after it sums the products (what a hand-written BPTT does: one
    GEMM instead of a rank-1 update and a copy of the sum per step).
    The reverse step is handed the results of each forward step that its
    gradient reads (each step's new carry, and the ys when ``outputs`` are
    given) rather than computing them again: for an RNN cell nothing of the
    forward step runs twice. Only the inputs ``needed`` (default: every float
    input) get cotangents; the carries' cotangents always flow, since they
    chain the steps.
    """
    nc, ncarry = num_consts, num_carry
    consts, init, xs = inputs[:nc], inputs[nc:nc + ncarry], inputs[nc + ncarry:]
    def wanted(i: int, v: Any) -> bool:
        return is_float(v.type) and (needed is None or needed[i])

    fc = [i for i in range(nc) if wanted(i, consts[i])]
    fcar = [k for k in range(ncarry) if is_float(init[k].type)]
    fx = [k for k in range(len(xs)) if wanted(nc + ncarry + k, xs[k])]
    cy = [j for j, c in enumerate(cots[ncarry:]) if c is not None]
    if not (fc or fcar or fx) or not (cy or any(cots[k] is not None for k in fcar)):
        return [None] * len(inputs)
    stacked: list[Any] | None = []
    final: list[Any] = list(outputs[:ncarry]) if outputs is not None else []
    if ncarry and outputs is not None:
        stacked = _carries_from_ys(b, body, init, outputs[ncarry:], ncarry, reverse)
    if ncarry and not stacked:
        fwd = _as_list(b.op("scan", *inputs, body=_carry_stacker(body, nc, ncarry), num_consts=nc,
                            num_carry=ncarry, length=length, reverse=reverse))
        stacked, final = fwd[ncarry:], fwd[:ncarry]
    wrt = [*fc, *(nc + k for k in fcar), *(nc + ncarry + k for k in fx)]
    ny = body.num_outputs - ncarry
    given = _given_results(body, wrt, [*fcar, *(ncarry + j for j in cy)],
                           [*range(ncarry), *(range(ncarry, ncarry + ny) if outputs is not None else ())])
    step, fact, sources = _reverse_body(body, nc, ncarry, fc, fcar, fx, cy, given)
    per_step = []
    for j in given:
        if j >= ncarry:
            per_step.append(outputs[j])  # type: ignore[index]
            continue
        # step i's new carry is step i+1's carry (the last step's is the final carry)
        last = b.op("expand_dims", final[j], axis=0)
        parts = (last, stacked[j]) if reverse else (stacked[j], last)  # type: ignore[index]
        per_step.append(b.op("getitem", b.op("concat", *parts, axis=0),
                             index=(slice(0, -1) if reverse else slice(1, None),)))
    summed = [o for o in range(len(fc)) if o not in fact]
    ct0 = [cots[k] if cots[k] is not None else zeros_like(b, init[k]) for k in fcar]
    acc0 = [zeros_like(b, consts[fc[o]]) for o in summed]
    res = _as_list(b.op("scan", *consts, *ct0, *acc0, *(stacked or ()), *xs, *[cots[ncarry + j] for j in cy],
                        *per_step, body=step, num_consts=nc, num_carry=len(fcar) + len(summed), length=length,
                        reverse=not reverse))
    k0, k1, k2 = len(fcar), len(fcar) + len(summed), len(fcar) + len(summed) + len(fx)
    g_init, g_x = res[:k0], res[k1:k2]
    g_const: list[Any] = [None] * len(fc)
    for o, a in zip(summed, res[k0:k1], strict=True):
        g_const[o] = a
    pos = k2
    for o, src in zip(fact, sources, strict=True):
        if src is None:
            u, v = res[pos], res[pos + 1]  # (n, m, r) and (n, r, k)
            pos += 2
            uu = b.op("reshape", b.op("permute_dims", u, axes=(1, 0, 2)), shape=(u.type.shape[1], -1))
        else:  # u_i = p_i^T for a scanned p of (n, r, m): sum_i u_i v_i = P^T V with P, V flattened to rows
            v = res[pos]
            pos += 1
            kind, k = src
            p = stacked[k] if kind == "carry" else xs[k] if kind == "x" else per_step[k]  # type: ignore[index]
            uu = b.op("permute_dims", b.op("reshape", p, shape=(-1, p.type.shape[-1])), axes=(1, 0))
        g_const[o] = b.op("matmul", uu, b.op("reshape", v, shape=(-1, v.type.shape[-1])))
    return [*_scatter(nc, fc, g_const), *_scatter(ncarry, fcar, g_init), *_scatter(len(xs), fx, g_x)]


def _scan_grad(b: Any, inputs: Sequence[Any], outputs: Sequence[Any], cots: Sequence[Any],
               attrs: dict[str, Any], needed: Sequence[bool] | None = None) -> list[Any]:
    return scan_vjp(b, inputs, cots, attrs["body"], attrs["num_consts"], attrs["num_carry"], attrs["length"],
                    attrs["reverse"], outputs, needed)


def while_as_scan_body(cond_body: Subgraph, body: Subgraph, nc: int) -> Subgraph:
    """A while_loop's step as a scan step: ``(*consts, *carry, active) -> (*carry', active', *ys')``.

    ``active' = active and cond_body(*consts, *carry)``; the carry steps (and
    the ys are computed) only while active; otherwise the carry passes through
    and the ys are zeros. A scan of ``max_trip`` such steps from
    ``active=True`` ends with the while_loop's carry.
    """
    from opgraph.core.builder import GraphBuilder

    def make() -> Subgraph:
        ncarry = body.num_inputs - nc
        sb = GraphBuilder()
        params = [sb.input(t) for t in body.in_types]
        active = sb.input(("bool", ()), name="active")
        (pred,) = inline_body(sb, cond_body, params)
        if pred.type.dtype != np.dtype(bool):
            pred = sb.op("not_equal", pred, sb.constant(np.zeros((), dtype=pred.type.dtype)))
        if pred.type.shape != ():
            pred = sb.op("reshape", pred, shape=())
        go = sb.op("logical_and", active, pred)
        # the "skip" branch: carry unchanged, zeros for the ys (shaped like the step's ys)
        kb = GraphBuilder()
        kp = [kb.input(t) for t in body.in_types]
        y_types = body.out_types[ncarry:]
        if all(isinstance(t, TensorType) and t.shape is not None and None not in t.shape for t in y_types):
            zeros = [kb.op("broadcast_to", kb.constant(np.zeros((), dtype=t.dtype)), shape=t.shape)  # type: ignore[union-attr]
                     for t in y_types]
        else:  # a y of run-time shape: zeros shaped like the step's y (computed for its shape)
            ys = inline_body(kb, Subgraph(_keep_outputs(body.graph, range(ncarry, body.num_outputs))), kp)
            zeros = [zeros_like(kb, y) for y in ys]
        kb.output(*kp[nc:], *zeros)
        skip = Subgraph(kb.freeze(), name=f"skip({body.name})")
        res = _as_list(sb.op("cond", go, *params, then_body=body, else_body=skip))
        sb.output(*res[:ncarry], go, *res[ncarry:])
        return Subgraph(sb.freeze(), name=f"while_step({body.name})")

    return body.cache(("grad-while-step", cond_body, nc), make)  # type: ignore[no-any-return]


def _while_grad(b: Any, inputs: Sequence[Any], outputs: Sequence[Any], cots: Sequence[Any],
                attrs: dict[str, Any], needed: Sequence[bool] | None = None) -> list[Any]:
    max_trip, nc, body = attrs["max_trip"], attrs["num_consts"], attrs["body"]
    if max_trip is None:
        raise _no_gradient(
            f"while_loop with body {body.label} has no max_trip: reverse-mode differentiation needs a bound on the "
            "trip count (the reverse pass stores one carry per trip); pass max_trip=N (opgraph.while_loop(..., "
            "max_trip=N)), or use scan / fori_loop with static bounds")
    ncarry = len(inputs) - nc
    ny = body.num_outputs - ncarry
    cts = list(cots[:ncarry])
    for j in range(ny):
        c = cots[ncarry + j]
        if c is not None:
            # ys of the while_loop have the run-time trip count; the scan's have max_trip (zeros after the end)
            shape = c.type.shape
            if shape is None or any(d is None for d in shape[1:]):
                raise _no_gradient(f"the gradient of a while_loop's stacked y needs static y shapes, got {c.type}")
            pad = b.constant(np.zeros((max_trip, *shape[1:]), dtype=c.type.dtype))
            c = b.op("getitem", b.op("concat", c, pad, axis=0), index=(slice(0, max_trip),))
        cts.append(c)
    step = while_as_scan_body(attrs["cond_body"], body, nc)
    active = b.constant(np.ones((), dtype=bool))
    g = scan_vjp(b, [*inputs, active], [*cts[:ncarry], None, *cts[ncarry:]], step, nc, ncarry + 1, max_trip,
                 False, needed=None if needed is None else [*needed, False])
    return g[:len(inputs)]


# ---------------------------------------------------------------- tangent rules
# Each rule emits one op of its own kind on the jvp bodies (hooks.BODY_JVP, built by the autodiff layer): the
# primal results come out of the same op as the tangents (a loop runs once, carrying both, as JAX's jvp of
# scan does). The sweep keeps the primal op too; passes.control.merge_subsumed reads its results off the new op.
def _jvp_body(body: Subgraph, wrt: Sequence[int]) -> Subgraph:
    """``(*params, *tangents of params wrt) -> (*results, *tangents of the floating results)`` (built and cached
    by the autodiff layer; see :func:`opgraph.autodiff.control.jvp_body`)."""
    return hooks.BODY_JVP.get()(body, tuple(wrt))  # type: ignore[no-any-return]


def tangent_names(names: Sequence[str | None], wrt: Sequence[int]) -> list[str | None]:
    """Names for the tangents of parameters ``wrt``: ``t_<name>``, or none where that name is taken already
    (a tangent body's own ``t_x``, say, when it is differentiated again).

    >>> tangent_names(["x", "t_x", None], [0, 1, 2])
    [None, 't_t_x', None]
    """
    taken = {n for n in names if n}
    out: list[str | None] = []
    for i in wrt:
        n = f"t_{names[i]}" if names[i] else None
        if n in taken:
            n = None
        if n:
            taken.add(n)
        out.append(n)
    return out


def _floats(types: Sequence[ValueType]) -> list[int]:
    return [j for j, t in enumerate(types) if is_float(t)]


def _with_tangents(res: Sequence[Any], float_results: Sequence[int], tans: Sequence[Any]) -> list[Any]:
    """The tangent of each of ``res`` (None for a non-floating one) from the tangents of the floating ones."""
    return _scatter(len(res), float_results, tans)


def _call_jvp(b: Any, inputs: Sequence[Any], outputs: Sequence[Any], tangents: Sequence[Any],
              attrs: dict[str, Any]) -> list[Any]:
    wrt = [i for i, t in enumerate(tangents) if t is not None]
    body = attrs["body"]
    res = _as_list(b.op("call", *inputs, *[tangents[i] for i in wrt], body=_jvp_body(body, wrt)))
    m = body.num_outputs
    return _with_tangents(outputs, _floats(body.out_types), res[m:])


def _cond_jvp(b: Any, inputs: Sequence[Any], outputs: Sequence[Any], tangents: Sequence[Any],
              attrs: dict[str, Any]) -> list[Any]:
    operands, tans = inputs[1:], tangents[1:]
    wrt = [i for i, t in enumerate(tans) if t is not None]
    then_body, else_body = attrs["then_body"], attrs["else_body"]
    res = _as_list(b.op("cond", inputs[0], *operands, *[tans[i] for i in wrt],
                        then_body=_jvp_body(then_body, wrt), else_body=_jvp_body(else_body, wrt)))
    m = len(outputs)
    return _with_tangents(outputs, _floats([o.type for o in outputs]), res[m:])


def _loop_step(body: Subgraph, nc: int, ncarry: int, tc: Sequence[int], fcar: Sequence[int],
               tx: Sequence[int]) -> Subgraph:
    """A loop body with tangents in a loop's layout: ``(*consts, *t_consts[tc], *carry, *t_carry[fcar], *xs,
    *t_xs[tx]) -> (*carry', *t_carry'[fcar], *ys, *t_ys of the floating ys)``.

    It is the body's jvp body with its parameters and results reordered, so
    the primal step and its tangents are one body and run in one loop.
    """
    from opgraph.core.builder import GraphBuilder

    def make() -> Subgraph:
        ins = body.in_types
        nx = body.num_inputs - nc - ncarry
        wrt = [*tc, *(nc + k for k in fcar), *(nc + ncarry + k for k in tx)]
        jb = _jvp_body(body, wrt)
        sb = GraphBuilder()
        names = [body.graph.name_of(int(v)) for v in body.graph.inputs]
        tname = dict(zip(wrt, tangent_names(names, wrt), strict=True))
        consts = [sb.input(ins[i], name=names[i]) for i in range(nc)]
        t_consts = [sb.input(ins[i], name=tname[i]) for i in tc]
        carry = [sb.input(ins[nc + k], name=names[nc + k]) for k in range(ncarry)]
        t_carry = [sb.input(ins[nc + k], name=tname[nc + k]) for k in fcar]
        xs = [sb.input(ins[i], name=names[i]) for i in range(nc + ncarry, nc + ncarry + nx)]
        t_xs = [sb.input(ins[nc + ncarry + k], name=tname[nc + ncarry + k]) for k in tx]
        res = inline_body(sb, jb, [*consts, *carry, *xs, *t_consts, *t_carry, *t_xs])
        m = body.num_outputs
        prim, tans = res[:m], res[m:]
        fout = _floats(body.out_types)
        tan_of = dict(zip(fout, tans, strict=True))
        sb.output(*prim[:ncarry], *(tan_of[k] for k in fcar), *prim[ncarry:],
                  *(tan_of[j] for j in fout if j >= ncarry))
        return Subgraph(sb.freeze(), name=f"jvp({body.name})" if body.name else "jvp")

    key = ("jvp-loop-step", nc, ncarry, tuple(tc), tuple(fcar), tuple(tx))
    return body.cache(key, make)  # type: ignore[no-any-return]


def _loop_tangents(b: Any, res: Sequence[Any], body: Subgraph, ncarry: int, fcar: Sequence[int]) -> list[Any]:
    """The tangent of each result of a loop from the results of its tangent loop (see :func:`_loop_step`)."""
    ny = body.num_outputs - ncarry
    nf = len(fcar)
    carry_t = _scatter(ncarry, fcar, res[ncarry:ncarry + nf])
    fy = [j for j in range(ny) if is_float(body.out_types[ncarry + j])]
    ys_t = _scatter(ny, fy, res[ncarry + nf + ny:])
    return [*carry_t, *ys_t]


def _carry_tangents(b: Any, init: Sequence[Any], tangents: Sequence[Any]) -> tuple[list[int], list[Any]]:
    """Every floating carry gets a tangent (the body may give one to a carry whose init has none): zeros there."""
    fcar = [k for k, v in enumerate(init) if is_float(v.type)]
    return fcar, [tangents[k] if tangents[k] is not None else zeros_like(b, init[k]) for k in fcar]


def _scan_jvp(b: Any, inputs: Sequence[Any], outputs: Sequence[Any], tangents: Sequence[Any],
              attrs: dict[str, Any]) -> list[Any]:
    body, nc, ncarry = attrs["body"], attrs["num_consts"], attrs["num_carry"]
    consts, init, xs = inputs[:nc], inputs[nc:nc + ncarry], inputs[nc + ncarry:]
    t_c, t_init, t_x = tangents[:nc], tangents[nc:nc + ncarry], tangents[nc + ncarry:]
    tc = [i for i, t in enumerate(t_c) if t is not None]
    tx = [k for k, t in enumerate(t_x) if t is not None]
    fcar, t_carry = _carry_tangents(b, init, t_init)
    step = _loop_step(body, nc, ncarry, tc, fcar, tx)
    res = _as_list(b.op("scan", *consts, *(t_c[i] for i in tc), *init, *t_carry, *xs, *(t_x[k] for k in tx),
                        body=step, num_consts=nc + len(tc), num_carry=ncarry + len(fcar), length=attrs["length"],
                        reverse=attrs["reverse"]))
    return _loop_tangents(b, res, body, ncarry, fcar)


def _while_cond_step(cond_body: Subgraph, nc: int, tc: Sequence[int], fcar: Sequence[int]) -> Subgraph:
    """The predicate body of a tangent while_loop: ``cond_body`` on the primal parameters (tangents unread)."""
    from opgraph.core.builder import GraphBuilder

    def make() -> Subgraph:
        ins = cond_body.in_types
        sb = GraphBuilder()
        consts = [sb.input(ins[i]) for i in range(nc)]
        for i in tc:
            sb.input(ins[i])
        carry = [sb.input(t) for t in ins[nc:]]
        for k in fcar:
            sb.input(ins[nc + k])
        sb.output(*inline_body(sb, cond_body, [*consts, *carry]))
        return Subgraph(sb.freeze(), name=cond_body.name)

    return cond_body.cache(("jvp-cond-step", nc, tuple(tc), tuple(fcar)), make)  # type: ignore[no-any-return]


def _while_jvp(b: Any, inputs: Sequence[Any], outputs: Sequence[Any], tangents: Sequence[Any],
               attrs: dict[str, Any]) -> list[Any]:
    body, nc = attrs["body"], attrs["num_consts"]
    ncarry = len(inputs) - nc
    consts, init = inputs[:nc], inputs[nc:]
    t_c = tangents[:nc]
    tc = [i for i, t in enumerate(t_c) if t is not None]
    fcar, t_carry = _carry_tangents(b, init, tangents[nc:])
    step = _loop_step(body, nc, ncarry, tc, fcar, ())
    test = _while_cond_step(attrs["cond_body"], nc, tc, fcar)
    res = _as_list(b.op("while_loop", *consts, *(t_c[i] for i in tc), *init, *t_carry, cond_body=test, body=step,
                        num_consts=nc + len(tc), max_trip=attrs["max_trip"]))
    return _loop_tangents(b, res, body, ncarry, fcar)


# ---------------------------------------------------------------- batching rules (vmap)
# As JAX batches its control primitives: a body runs batched (hooks.BODY_BATCH, filled by the autodiff layer);
# a loop's carry is batched when its init is or when the body makes it so (a fixed point over the carries, the
# inits of the batched ones broadcast); a batched predicate runs both branches of a cond and selects, and runs a
# while_loop while any example goes on, each example's carry frozen once its own predicate is false.
def batched_results(body: Subgraph, batched: Sequence[bool]) -> tuple[bool, ...]:
    """Which results of ``body`` depend on its parameters flagged in ``batched`` (and so carry a batch axis when
    the body runs batched: every op with a batched input gives batched outputs).

    >>> import opgraph
    >>> sb = opgraph.GraphBuilder(); x, y = sb.input(("f8", ()), name="x"), sb.input(("f8", ()), name="y")
    >>> sb.output(sb.sin(x), sb.cos(y), x)
    >>> batched_results(Subgraph(sb.freeze()), (False, True))
    (False, True, False)
    """
    flags = tuple(bool(f) for f in batched)
    if len(flags) != body.num_inputs:
        raise OpTypeError(f"body {body.label} takes {body.num_inputs} parameter(s), got {len(flags)} batch flags")

    def make() -> tuple[bool, ...]:
        g = body.graph
        on = np.zeros(g.num_values, dtype=bool)
        on[np.asarray(g.inputs, dtype=np.int64)[list(flags)] if any(flags) else []] = True
        for op in g.topological_order():
            ins = g.op_inputs(int(op))
            if len(ins) and on[ins].any():
                on[g.op_outputs(int(op))] = True
        return tuple(bool(on[int(v)]) for v in g.outputs)

    return body.cache(("batched-results", flags), make)  # type: ignore[no-any-return]


def _batched_body(body: Subgraph, batched: Sequence[bool], size: int, unbatched: Sequence[int] = ()) -> Subgraph:
    """``body`` with a leading batch axis of ``size`` on the parameters flagged in ``batched`` and on its results
    (but those in ``unbatched``), built once per body by the autodiff layer (:data:`hooks.BODY_BATCH`)."""
    return hooks.BODY_BATCH.get()(body, tuple(bool(f) for f in batched), size,  # type: ignore[no-any-return]
                                  unbatched=tuple(unbatched))


def _as_flag(b: Any, pred: Any, size: int) -> Any:
    """A batched predicate ``(size, 1, ...)`` as ``(size,)`` booleans (nonzero is true)."""
    p = b.op("reshape", pred, shape=(size,))
    if p.type.dtype != np.dtype(bool):
        p = b.op("not_equal", p, b.constant(np.zeros((), dtype=p.type.dtype)))
    return p


def _select(b: Any, flag: Any, yes: Any, no: Any) -> Any:
    """``yes`` for the examples whose ``flag`` is true, else ``no`` (both batched)."""
    rank = len(yes.type.shape)
    f = flag if rank == 1 else b.op("reshape", flag, shape=(flag.type.shape[0],) + (1,) * (rank - 1))
    return b.op("where", f, yes, no)


def _call_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: dict[str, Any]) -> list[Any]:
    return _as_list(b.op("call", *ins, body=_batched_body(attrs["body"], batched, size)))


def _cond_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: dict[str, Any]) -> list[Any]:
    pred, ops, flags = ins[0], ins[1:], batched[1:]
    then_b = _batched_body(attrs["then_body"], flags, size)
    else_b = _batched_body(attrs["else_body"], flags, size)
    if not batched[0]:
        return _as_list(b.op("cond", pred, *ops, then_body=then_b, else_body=else_b))
    # each example takes its own branch: run both, select per example (jax's select)
    flag = _as_flag(b, pred, size)
    yes, no = _as_list(b.op("call", *ops, body=then_b)), _as_list(b.op("call", *ops, body=else_b))
    return [_select(b, flag, t, e) for t, e in zip(yes, no, strict=True)]


def _carry_fixed_point(body: Subgraph, before: Sequence[bool], carry: Sequence[bool],
                       after: Sequence[bool]) -> tuple[list[bool], tuple[bool, ...]]:
    """Which carries are batched (those whose init is, and those the body makes batched from them, until nothing
    changes), and which results the body then gives batched."""
    cb = list(carry)
    while True:
        res = batched_results(body, (*before, *cb, *after))
        new = [c or r for c, r in zip(cb, res, strict=False)]
        if new == cb:
            return cb, res
        cb = new


def _scan_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: dict[str, Any]) -> list[Any]:
    body, nc, ncarry = attrs["body"], attrs["num_consts"], attrs["num_carry"]
    cf, xf = batched[:nc], batched[nc + ncarry:]
    cb, res = _carry_fixed_point(body, cf, batched[nc:nc + ncarry], xf)
    yb = res[ncarry:]
    init = [broadcast_batch(b, v, size) if c and not f else v
            for v, c, f in zip(ins[nc:nc + ncarry], cb, batched[nc:nc + ncarry], strict=True)]
    # a batched x is scanned along its own leading axis: the batch axis goes second
    xs = [b.op("moveaxis", x, source=(0,), destination=(1,)) if f else x for x, f in zip(ins[nc + ncarry:], xf,
                                                                                         strict=True)]
    keep = [k for k in range(ncarry) if not cb[k]] + [ncarry + j for j, f in enumerate(yb) if not f]
    step = _batched_body(body, (*cf, *cb, *xf), size, keep)
    out = _as_list(b.op("scan", *ins[:nc], *init, *xs, body=step, num_consts=nc, num_carry=ncarry,
                        length=attrs["length"], reverse=attrs["reverse"]))
    carry = [v if c else broadcast_batch(b, v, size) for v, c in zip(out[:ncarry], cb, strict=True)]
    ys = [b.op("moveaxis", y, source=(1,), destination=(0,)) if f else broadcast_batch(b, y, size)
          for y, f in zip(out[ncarry:], yb, strict=True)]
    return carry + ys


def _while_batch(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int,
                 attrs: dict[str, Any]) -> list[Any]:
    body, cond_body, nc = attrs["body"], attrs["cond_body"], attrs["num_consts"]
    ncarry = len(ins) - nc
    cf = tuple(batched[:nc])
    cb, _ = _carry_fixed_point(body, cf, batched[nc:], ())
    (pred_batched,) = batched_results(cond_body, (*cf, *cb))
    if pred_batched:
        if body.num_outputs > ncarry:
            raise OpTypeError(
                f"vmap of a while_loop (body {body.label}) whose predicate differs between examples, with stacked "
                "ys: each example would stack its own number of trips; return the values as carries instead")
        cb = [True] * ncarry
    init = [broadcast_batch(b, v, size) if c and not f else v for v, c, f in zip(ins[nc:], cb, batched[nc:],
                                                                                   strict=True)]
    flags = (*cf, *cb)
    if not pred_batched:
        # every y batched: their trip count is known only at run time, so they are not broadcast after the loop
        step = _batched_body(body, flags, size, [k for k in range(ncarry) if not cb[k]])
        test = _batched_body(cond_body, flags, size, (0,))
        out = _as_list(b.op("while_loop", *ins[:nc], *init, cond_body=test, body=step, num_consts=nc,
                            max_trip=attrs["max_trip"]))
        carry = [v if c else broadcast_batch(b, v, size) for v, c in zip(out[:ncarry], cb, strict=True)]
        return carry + [b.op("moveaxis", y, source=(1,), destination=(0,)) for y in out[ncarry:]]
    test, step = _while_any(cond_body, body, flags, size, ncarry)
    return _as_list(b.op("while_loop", *ins[:nc], *init, cond_body=test, body=step, num_consts=nc,
                         max_trip=attrs["max_trip"]))


def _while_any(cond_body: Subgraph, body: Subgraph, flags: tuple[bool, ...], size: int,
               ncarry: int) -> tuple[Subgraph, Subgraph]:
    """A while_loop with a batched predicate as one loop: go on while any example's predicate holds; an example's
    carry stays as it is once its own is false (``where(pred, new, old)``)."""
    from opgraph.core.builder import GraphBuilder

    def make() -> tuple[Subgraph, Subgraph]:
        test = _batched_body(cond_body, flags, size)
        step = _batched_body(body, flags, size)
        tb = GraphBuilder()
        params = [tb.input(t) for t in step.in_types]
        (pred,) = inline_body(tb, test, params)
        tb.output(tb.op("any", _as_flag(tb, pred, size)))
        sb = GraphBuilder()
        params = [sb.input(t) for t in step.in_types]
        (pred,) = inline_body(sb, test, params)
        flag = _as_flag(sb, pred, size)
        new = inline_body(sb, step, params)[:ncarry]
        old = params[len(params) - ncarry:]
        sb.output(*[_select(sb, flag, n, o) for n, o in zip(new, old, strict=True)])
        return (Subgraph(tb.freeze(), name=f"vmap_any({cond_body.name})"),
                Subgraph(sb.freeze(), name=f"vmap_while({body.name})"))

    return body.cache(("vmap-while-any", cond_body, flags, size), make)  # type: ignore[no-any-return]


# ---------------------------------------------------------------- workspaces (memory/plan.py counts them)
# A control op runs its bodies on their own plans: its workspace is the bodies' peaks (both of a while_loop,
# the larger branch of a cond) plus, for a loop, one carry (the one a trip reads while it makes the next).
def _static_bytes(types: Sequence[ValueType]) -> int:
    return sum(t.nbytes for t in types if isinstance(t, TensorType) and t.nbytes is not None)


def _call_workspace(attrs: Mapping[str, Any], peak: Callable[[Subgraph], int]) -> int:
    return peak(attrs["body"])


def _cond_workspace(attrs: Mapping[str, Any], peak: Callable[[Subgraph], int]) -> int:
    return max(peak(attrs["then_body"]), peak(attrs["else_body"]))


def _while_workspace(attrs: Mapping[str, Any], peak: Callable[[Subgraph], int]) -> int:
    body = attrs["body"]
    return peak(attrs["cond_body"]) + peak(body) + _static_bytes(body.in_types[attrs["num_consts"]:])


def _scan_workspace(attrs: Mapping[str, Any], peak: Callable[[Subgraph], int]) -> int:
    body, nc = attrs["body"], attrs["num_consts"]
    return peak(body) + _static_bytes(body.in_types[nc:nc + attrs["num_carry"]])


# ---------------------------------------------------------------- call 1300
def _call_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[ValueType, ...]:
    body: Subgraph = attrs["body"]
    check_params("call", "called", body, in_types, [f"argument {i}" for i in range(len(in_types))])
    return body.out_types


def _call_kernel(*args: np.ndarray, out: Any = None, body: Subgraph) -> Any:
    return _results(body_fn(body)(list(args)), out)


CALL = register_op(OpDef(
    name="call", id=1300, grad=_call_grad, infer=_call_infer, version=_version,
    attrs={"body": Attr(attr_subgraph, doc="the function called (a Subgraph)")},
    kernel=_call_kernel, workspace=_call_workspace, family=FAMILY,
    doc="call(*args, body): the results of the subgraph body on args (a function stored once, called by "
        "any number of call ops)",
))


# ---------------------------------------------------------------- cond 1301
def _cond_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[ValueType, ...]:
    if not in_types:
        raise OpTypeError("cond needs a predicate")
    pred, operands = in_types[0], in_types[1:]
    if not is_predicate(pred):
        raise OpTypeError(f"the predicate must be a one-element tensor, got {pred}")
    then_body: Subgraph = attrs["then_body"]
    else_body: Subgraph = attrs["else_body"]
    names = [f"operand {i}" for i in range(len(operands))]
    check_params("cond", "then", then_body, operands, names)
    check_params("cond", "else", else_body, operands, names)
    t_out, e_out = then_body.out_types, else_body.out_types
    if len(t_out) != len(e_out):
        raise OpTypeError(f"then body {then_body.label} returns {len(t_out)} result(s) and else body "
                          f"{else_body.label} returns {len(e_out)}")
    for i, (t, e) in enumerate(zip(t_out, e_out, strict=True)):
        if not isinstance(t, TensorType) or not isinstance(e, TensorType) or t.dtype != e.dtype or (
                t.shape is not None and e.shape is not None and len(t.shape) != len(e.shape)):
            raise OpTypeError(f"result {i} is {t} in then body {then_body.label} and {e} in else body "
                              f"{else_body.label}")
    return tuple(merge_types(t, e) for t, e in zip(t_out, e_out, strict=True))


def _cond_kernel(pred: np.ndarray, *operands: np.ndarray, out: Any = None, then_body: Subgraph,
                 else_body: Subgraph) -> Any:
    body = then_body if _truth(pred) else else_body
    return _results(body_fn(body)(list(operands)), out)


COND = register_op(OpDef(
    name="cond", id=1301, grad=_cond_grad, min_inputs=1, infer=_cond_infer, version=_version,
    attrs={"then_body": Attr(attr_subgraph, doc="the branch taken when pred is true"),
           "else_body": Attr(attr_subgraph, doc="the branch taken when pred is false")},
    kernel=_cond_kernel, workspace=_cond_workspace, family=FAMILY,
    doc="cond(pred, *operands, then_body, else_body): then_body(*operands) if pred (a one-element tensor) "
        "is nonzero, else else_body(*operands); both branches return the same dtypes and ranks",
))


# ---------------------------------------------------------------- while_loop 1302
def _while_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[ValueType, ...]:
    nc, ncarry = _counts(attrs, len(in_types))
    consts, init = in_types[:nc], in_types[nc:]
    names = [f"const {i}" for i in range(nc)] + [f"carry[{i}]" for i in range(ncarry)]
    cond_body: Subgraph = attrs["cond_body"]
    body: Subgraph = attrs["body"]
    check_params("while_loop", "cond", cond_body, in_types, names)
    check_params("while_loop", "loop", body, in_types, names)
    if cond_body.num_outputs != 1 or not is_predicate(cond_body.out_types[0]):
        got = ", ".join(repr(t) for t in cond_body.out_types) or "nothing"
        raise OpTypeError(f"cond body {cond_body.label} must return one one-element tensor, got {got}")
    check_results("while_loop", "loop", body, body.in_types[nc:], names[nc:], at_least=True)
    if attrs["max_trip"] is not None and attrs["max_trip"] < 0:
        raise OpTypeError(f"max_trip must be >= 0, got {attrs['max_trip']}")
    carry = tuple(merge_types(t, o) for t, o in zip(init, body.out_types[:ncarry], strict=True))
    del consts
    return carry + tuple(_stacked(t, None) for t in body.out_types[ncarry:])


def _while_kernel(*ins: np.ndarray, out: Any = None, cond_body: Subgraph, body: Subgraph, num_consts: int,
                  max_trip: int | None) -> Any:
    consts = list(ins[:num_consts])
    carry = list(ins[num_consts:])
    ncarry = len(carry)
    test, step = body_fn(cond_body), body_fn(body)
    ys: list[list[np.ndarray]] = [[] for _ in range(body.num_outputs - ncarry)]
    trips = 0
    while (max_trip is None or trips < max_trip) and _truth(test(consts + carry)[0]):
        res = step(consts + carry)
        carry = res[:ncarry]
        for acc, y in zip(ys, res[ncarry:], strict=True):
            acc.append(y)
        trips += 1
    if trips == 0:
        carry = [_fresh(c) for c in carry]
    stacked = []
    for acc, t in zip(ys, body.out_types[ncarry:], strict=True):
        if acc:
            stacked.append(np.stack(acc))
        else:
            stacked.append(_no_rows(t))
    return _results(carry + stacked, out)


WHILE_LOOP = register_op(OpDef(
    name="while_loop", id=1302, grad=_while_grad, infer=_while_infer, version=_version,
    attrs={"cond_body": Attr(attr_subgraph, doc="(*consts, *carry) -> one-element predicate"),
           "body": Attr(attr_subgraph, doc="(*consts, *carry) -> (*carry, *ys)"),
           "num_consts": Attr(attr_int, 0, "how many leading inputs are loop-invariant operands"),
           "max_trip": Attr(optional(attr_int), None, "stop after this many trips (None: no bound)")},
    kernel=_while_kernel, workspace=_while_workspace, family=FAMILY,
    doc="while_loop(*consts, *init, cond_body, body, num_consts=0, max_trip=None): carry = init; while "
        "cond_body(*consts, *carry) (and fewer than max_trip trips): carry, *ys = body(*consts, *carry); "
        "returns the final carry and each y stacked along a new leading axis of run-time length",
))


# ---------------------------------------------------------------- scan 1303
def _scan_layout(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[int, int, int]:
    nc, rest = _counts(attrs, len(in_types))
    ncarry = attrs["num_carry"]
    if not 0 <= ncarry <= rest:
        raise OpTypeError(f"num_carry={ncarry} but the op has {rest} input(s) after its {nc} const(s)")
    return nc, ncarry, rest - ncarry


def _scan_length(xs: Sequence[ValueType], length: int | None) -> int | None:
    lens: set[int | None] = set()
    for i, x in enumerate(xs):
        if not isinstance(x, TensorType) or x.shape is None or len(x.shape) == 0:
            raise OpTypeError(f"xs[{i}] must have a leading axis to scan over, got {x}")
        lens.add(x.shape[0])
    known = {n for n in lens if n is not None}
    if len(known) > 1:
        raise OpTypeError(f"the xs have different leading lengths {sorted(known)}")
    if length is not None:
        if length < 0:
            raise OpTypeError(f"length must be >= 0, got {length}")
        if known and length not in known:
            raise OpTypeError(f"length={length} but the xs have leading length {known.pop()}")
        return length
    if not xs:
        raise OpTypeError("scan without xs needs length=")
    return known.pop() if known else None


def _scan_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[ValueType, ...]:
    nc, ncarry, nx = _scan_layout(in_types, attrs)
    xs = in_types[nc + ncarry:]
    n = _scan_length(xs, attrs["length"])
    slices = tuple(TensorType(x.dtype, None if x.shape is None else x.shape[1:]) for x in xs)  # type: ignore[union-attr]
    names = ([f"const {i}" for i in range(nc)] + [f"carry[{i}]" for i in range(ncarry)]
             + [f"x[{i}]" for i in range(nx)])
    body: Subgraph = attrs["body"]
    check_params("scan", "scan", body, in_types[:nc + ncarry] + slices, names)
    check_results("scan", "scan", body, body.in_types[nc:nc + ncarry], names[nc:nc + ncarry], at_least=True)
    init = in_types[nc:nc + ncarry]
    carry = tuple(merge_types(t, o) for t, o in zip(init, body.out_types[:ncarry], strict=True))
    return carry + tuple(_stacked(t, n) for t in body.out_types[ncarry:])


def _scan_kernel(*ins: np.ndarray, out: Any = None, body: Subgraph, num_consts: int, num_carry: int,
                 length: int | None, reverse: bool) -> Any:
    consts = list(ins[:num_consts])
    carry = list(ins[num_consts:num_consts + num_carry])
    xs = ins[num_consts + num_carry:]
    n = length if length is not None else xs[0].shape[0]
    step = body_fn(body)
    y_types = body.out_types[num_carry:]
    outs = out if isinstance(out, tuple) else (out,) if out is not None else None
    ybufs: list[np.ndarray | None] = list(outs[num_carry:]) if outs is not None else [None] * len(y_types)
    for i in (range(n - 1, -1, -1) if reverse else range(n)):
        res = step(consts + carry + [x[i, ...] for x in xs])  # [i, ...]: a 0-d array, not a scalar
        carry = res[:num_carry]
        for j, y in enumerate(res[num_carry:]):
            buf = ybufs[j]
            if buf is None:
                buf = ybufs[j] = np.empty((n, *np.shape(y)), dtype=y_types[j].dtype)  # type: ignore[union-attr]
            buf[i] = y
    if n == 0:
        carry = [_fresh(c) for c in carry]
        for j, t in enumerate(y_types):
            if ybufs[j] is None:
                ybufs[j] = _no_rows(t)
    if outs is not None:
        for o, c in zip(outs[:num_carry], carry, strict=True):
            np.copyto(o, c)
        return out
    res_all = carry + ybufs
    return res_all[0] if len(res_all) == 1 else tuple(res_all)


SCAN = register_op(OpDef(
    name="scan", id=1303, grad=_scan_grad, infer=_scan_infer, version=_version,
    attrs={"body": Attr(attr_subgraph, doc="(*consts, *carry, *x_slices) -> (*carry, *ys)"),
           "num_consts": Attr(attr_int, 0, "how many leading inputs are loop-invariant operands"),
           "num_carry": Attr(attr_int, 0, "how many inputs after the consts are the initial carry"),
           "length": Attr(optional(attr_int), None, "the trip count (None: the xs' leading length)"),
           "reverse": Attr(attr_bool, False, "scan from the last slice to the first")},
    kernel=_scan_kernel, workspace=_scan_workspace, family=FAMILY,
    doc="scan(*consts, *init, *xs, body, num_consts=0, num_carry=0, length=None, reverse=False): for each "
        "leading slice x_i of the xs (in reverse with reverse=True): carry, *y_i = body(*consts, *carry, "
        "*x_i); returns the final carry and the y_i stacked (jax.lax.scan)",
))


# The sweep tells these rules which inputs need a cotangent (autodiff/reverse.py), so a loop's reverse pass
# computes no cotangent nobody asked for (an RNN's gradient for W alone skips U's, b's and the xs').
for _rule in (_call_grad, _cond_grad, _scan_grad, _while_grad):
    _rule.takes_needed = True  # type: ignore[attr-defined]

set_rules("jvp", {"call": _call_jvp, "cond": _cond_jvp, "scan": _scan_jvp, "while_loop": _while_jvp})


# ---------------------------------------------------------------- folding bounds
FOLD_WORK = 1 << 14
"""Constant folding runs a control op at build time only if it runs at most this many body ops in all."""


def body_work(s: Subgraph) -> float:
    """Ops one run of body ``s`` executes, nested loops multiplied by their trip counts (inf: unknown).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); b.output(b.exp(b.sin(x)))
    >>> body_work(Subgraph(b.freeze()))
    2.0
    """
    def make() -> float:
        g = s.graph
        total = 0.0
        for op in range(g.num_ops):
            kind = get_op(int(g.op_kind[op])).name
            if kind == "const":
                continue
            if get_op(kind).family == "control":
                ins = [g.type_of(v) for v in g.op_inputs(op).tolist()]
                total += _op_work(kind, g.attrs_of(op), [getattr(t, "shape", None) for t in ins])
            else:
                total += 1.0
        return total

    return s.cache(("fold-work",), make)  # type: ignore[no-any-return]


def _op_work(kind: str, attrs: Mapping[str, Any], shapes: Sequence[Any]) -> float:
    if kind == "call":
        return 1.0 + body_work(attrs["body"])
    if kind == "cond":
        return 1.0 + max(body_work(attrs["then_body"]), body_work(attrs["else_body"]))
    if kind == "while_loop":
        trips = attrs["max_trip"]
        if trips is None:
            return math.inf
        return 1.0 + trips * (body_work(attrs["cond_body"]) + body_work(attrs["body"]))
    if kind == "scan":
        n = attrs["length"]
        if n is None:
            xs = shapes[attrs["num_consts"] + attrs["num_carry"]:]
            n = xs[0][0] if xs and xs[0] else None
        if n is None:
            return math.inf
        return 1.0 + n * body_work(attrs["body"])
    return math.inf


def fold_work(kind: str, attrs: Mapping[str, Any], args: Sequence[np.ndarray]) -> float:
    """Body ops folding a control op of ``kind`` on constant ``args`` would run (inf: unbounded).

    >>> fold_work("while_loop", {"max_trip": None}, [])
    inf
    """
    return _op_work(kind, attrs, [np.shape(a) for a in args])


def _fold_guard(kind: str) -> Callable[[Mapping[str, Any], Sequence[np.ndarray]], bool]:
    def ok(attrs: Mapping[str, Any], args: Sequence[np.ndarray]) -> bool:
        return fold_work(kind, attrs, args) <= FOLD_WORK
    return ok


# ---------------------------------------------------------------- traits
# Folding runs a control op at build time: only while its work there is bounded (a while_loop may not stop).
for _kind in ("call", "cond", "while_loop", "scan"):
    get_op(_kind).fold_guard = _fold_guard(_kind)


set_rules("batch", {"call": _call_batch, "cond": _cond_batch, "scan": _scan_batch, "while_loop": _while_batch})
