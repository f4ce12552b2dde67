"""The jax engine's rules for control flow: ``call`` inlines its body, ``cond``, ``while_loop`` and ``scan``
lower to ``lax``.

    >>> from opgraph.backends.jax import BACKEND
    >>> BACKEND.supports("while_loop")
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from opgraph.backends.base import OpInfo, body_program
from opgraph.backends.jax import BACKEND, fix_result
from opgraph.core.subgraph import Subgraph


def _body_fn(body: Subgraph) -> Callable[..., tuple[Any, ...]]:
    """``body`` as a function of jax arrays returning its results as a tuple (its graph translated by the same
    rule table, nested bodies included; generated once per body). Traced inside the caller's ``jax.jit``."""
    def make() -> Callable[..., tuple[Any, ...]]:
        fn, consts, _src = body_program(BACKEND, body, lambda info: BACKEND.rules[info.kind](info), fix=fix_result)
        held = [jnp.asarray(c) for c in consts]
        return lambda *args: fn(held, *args)

    return body.cache(("jax-fn",), make)  # type: ignore[no-any-return]


def _results(res: Sequence[Any], n: int) -> Any:
    """A rule returns one value for a one-result op and a tuple otherwise (see straight_line)."""
    return res[0] if n == 1 else tuple(res)


def _truth(pred: Any) -> Any:
    """A one-element predicate as the scalar bool lax wants (nonzero is true, as in the NumPy kernel)."""
    return jnp.reshape(pred, ()).astype(bool)


@BACKEND.rule("call")
def _call(info: OpInfo) -> Callable[..., Any]:
    f, n = _body_fn(info.attrs["body"]), len(info.out_types)
    return lambda *args: _results(f(*args), n)


@BACKEND.rule("cond")
def _cond(info: OpInfo) -> Callable[..., Any]:
    then_f, else_f = _body_fn(info.attrs["then_body"]), _body_fn(info.attrs["else_body"])
    n = len(info.out_types)

    def cond(pred: Any, *operands: Any) -> Any:
        return _results(lax.cond(_truth(pred), lambda ops: tuple(then_f(*ops)), lambda ops: tuple(else_f(*ops)),
                                 operands), n)
    return cond


@BACKEND.rule("while_loop")
def _while_loop(info: OpInfo) -> Callable[..., Any]:
    a = info.attrs
    test, step = _body_fn(a["cond_body"]), _body_fn(a["body"])
    nc, max_trip, n = a["num_consts"], a["max_trip"], len(info.out_types)

    def while_loop(*ins: Any) -> Any:
        consts, init = ins[:nc], tuple(ins[nc:])
        if max_trip is None:
            out = lax.while_loop(lambda carry: _truth(test(*consts, *carry)[0]),
                                 lambda carry: tuple(step(*consts, *carry)), init)
        else:  # a trip counter joins the carry; the cond body is evaluated as well (bodies are pure)
            _, out = lax.while_loop(
                lambda s: (s[0] < max_trip) & _truth(test(*consts, *s[1])[0]),
                lambda s: (s[0] + 1, tuple(step(*consts, *s[1]))), (jnp.zeros((), np.int64), init))
        return _results(out, n)
    return while_loop


@BACKEND.rule("scan")
def _scan(info: OpInfo) -> Callable[..., Any]:
    a = info.attrs
    step = _body_fn(a["body"])
    nc, ncarry, length, reverse, n = a["num_consts"], a["num_carry"], a["length"], a["reverse"], len(info.out_types)

    def scan(*ins: Any) -> Any:
        consts, init, xs = ins[:nc], tuple(ins[nc:nc + ncarry]), tuple(ins[nc + ncarry:])

        def f(carry: tuple[Any, ...], x: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            res = step(*consts, *carry, *x)
            return tuple(res[:ncarry]), tuple(res[ncarry:])

        carry, ys = lax.scan(f, init, xs, length=length, reverse=reverse)
        return _results((*carry, *ys), n)
    return scan


def _carry_limit(body: Subgraph, first: int, count: int) -> str | None:
    """lax's loops keep each carry's type across trips: the body must return exactly the types it takes."""
    ins, outs = body.in_types[first:first + count], body.out_types[:count]
    for i, (t, o) in enumerate(zip(ins, outs, strict=True)):
        if t != o:
            return f"jax's loops need each carry to keep its type: body {body.label} takes carry[{i}] as {t} " \
                   f"and returns {o}"
    return None


@BACKEND.limit("cond")
def _cond_limit(info: OpInfo) -> str | None:
    t, e = info.attrs["then_body"], info.attrs["else_body"]
    for i, (a, b) in enumerate(zip(t.out_types, e.out_types, strict=True)):
        if a != b:
            return f"jax.lax.cond needs both branches to return the same types: result {i} is {a} in then " \
                   f"body {t.label} and {b} in else body {e.label}"
    return None


@BACKEND.limit("while_loop")
def _while_limit(info: OpInfo) -> str | None:
    body, nc = info.attrs["body"], info.attrs["num_consts"]
    ncarry = len(info.in_types) - nc
    if body.num_outputs > ncarry:
        return ("jax.lax.while_loop cannot stack per-trip results (ys): their length is known only at run time "
                "and jax.jit results have static shapes (a max_trip buffer would need slicing to the trip count "
                "outside jit)")
    return _carry_limit(body, nc, ncarry)


@BACKEND.limit("scan")
def _scan_limit(info: OpInfo) -> str | None:
    return _carry_limit(info.attrs["body"], info.attrs["num_consts"], info.attrs["num_carry"])
