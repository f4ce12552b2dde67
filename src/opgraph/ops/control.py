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

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from opgraph.core import hooks
from opgraph.core.registry import Attr, OpDef, attr_bool, attr_int, optional, register_op, user_location
from opgraph.core.subgraph import Subgraph, attr_subgraph
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import OpTypeError

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


def _where() -> str:
    loc = user_location()
    return f" (at {loc})" if loc else ""


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


def _is_pred(t: ValueType) -> bool:
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
    if out is not None:
        outs = out if isinstance(out, tuple) else (out,)
        for o, r in zip(outs, res, strict=True):
            if o is not None and o is not r:
                np.copyto(o, r)
        return out
    return res[0] if len(res) == 1 else tuple(res)


def _truth(pred: np.ndarray) -> bool:
    p = np.asarray(pred)
    if p.size != 1:
        raise ValueError(f"the predicate must have one element, got shape {p.shape}")
    return bool(p.reshape(-1)[0])


def _fresh(a: np.ndarray) -> np.ndarray:
    return np.array(a, copy=True)


# ---------------------------------------------------------------- call 1300
def _call_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[ValueType, ...]:
    body: Subgraph = attrs["body"]
    check_params("call", "called", body, in_types, [f"argument {i}" for i in range(len(in_types))])
    return body.out_types


def _call_kernel(*args: np.ndarray, out: Any = None, body: Subgraph) -> Any:
    return _results(body_fn(body)(list(args)), out)


CALL = register_op(OpDef(
    name="call", id=1300, infer=_call_infer, version=_version,
    attrs={"body": Attr(attr_subgraph, doc="the function called (a Subgraph)")},
    kernels={"numpy": _call_kernel}, family=FAMILY,
    doc="call(*args, body): the results of the subgraph body on args (a function stored once, called by "
        "any number of call ops)",
))


# ---------------------------------------------------------------- cond 1301
def _cond_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[ValueType, ...]:
    if not in_types:
        raise OpTypeError("cond needs a predicate")
    pred, operands = in_types[0], in_types[1:]
    if not _is_pred(pred):
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
    name="cond", id=1301, min_inputs=1, infer=_cond_infer, version=_version,
    attrs={"then_body": Attr(attr_subgraph, doc="the branch taken when pred is true"),
           "else_body": Attr(attr_subgraph, doc="the branch taken when pred is false")},
    kernels={"numpy": _cond_kernel}, family=FAMILY,
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
    if cond_body.num_outputs != 1 or not _is_pred(cond_body.out_types[0]):
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
            shape = t.shape if isinstance(t, TensorType) and t.shape is not None and None not in t.shape else ()
            stacked.append(np.empty((0, *shape), dtype=t.dtype))  # type: ignore[union-attr]
    return _results(carry + stacked, out)


WHILE_LOOP = register_op(OpDef(
    name="while_loop", id=1302, infer=_while_infer, version=_version,
    attrs={"cond_body": Attr(attr_subgraph, doc="(*consts, *carry) -> one-element predicate"),
           "body": Attr(attr_subgraph, doc="(*consts, *carry) -> (*carry, *ys)"),
           "num_consts": Attr(attr_int, 0, "how many leading inputs are loop-invariant operands"),
           "max_trip": Attr(optional(attr_int), None, "stop after this many trips (None: no bound)")},
    kernels={"numpy": _while_kernel}, family=FAMILY,
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
        res = step(consts + carry + [x[i] for x in xs])
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
                shape = t.shape if isinstance(t, TensorType) and t.shape is not None and None not in t.shape else ()
                ybufs[j] = np.empty((0, *shape), dtype=t.dtype)  # type: ignore[union-attr]
    if outs is not None:
        for o, c in zip(outs[:num_carry], carry, strict=True):
            np.copyto(o, c)
        return out
    res_all = carry + ybufs
    return res_all[0] if len(res_all) == 1 else tuple(res_all)


SCAN = register_op(OpDef(
    name="scan", id=1303, infer=_scan_infer, version=_version,
    attrs={"body": Attr(attr_subgraph, doc="(*consts, *carry, *x_slices) -> (*carry, *ys)"),
           "num_consts": Attr(attr_int, 0, "how many leading inputs are loop-invariant operands"),
           "num_carry": Attr(attr_int, 0, "how many inputs after the consts are the initial carry"),
           "length": Attr(optional(attr_int), None, "the trip count (None: the xs' leading length)"),
           "reverse": Attr(attr_bool, False, "scan from the last slice to the first")},
    kernels={"numpy": _scan_kernel}, family=FAMILY,
    doc="scan(*consts, *init, *xs, body, num_consts=0, num_carry=0, length=None, reverse=False): for each "
        "leading slice x_i of the xs (in reverse with reverse=True): carry, *y_i = body(*consts, *carry, "
        "*x_i); returns the final carry and the y_i stacked (jax.lax.scan)",
))
