"""The torch engine's rules for control flow (:mod:`opgraph.ops.control`): Python ``if``/``while``/``for``
over the bodies' generated functions (eager; under ``torch.compile`` each runs outside the compiled graph:
see :class:`~opgraph.backends.torch.TorchBackend`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from opgraph.backends.base import OpInfo, body_program
from opgraph.backends.torch import BACKEND, from_numpy
from opgraph.backends.torch.dtypes import Fn, fix, td
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType, ValueType


class _Body:
    """A body as a function of torch tensors returning its results as a tuple: its graph translated by the same
    rule table (nested bodies included), generated once per body; constants are moved to each device once."""

    def __init__(self, body: Subgraph) -> None:
        self.fn, self.consts, self.source = body_program(BACKEND, body, lambda info: BACKEND.rules[info.kind](info),
                                                         fix=fix)
        self.held: dict[torch.device, list[torch.Tensor]] = {}

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dev = args[0].device if args else _CPU
        held = self.held.get(dev)
        if held is None:
            held = self.held[dev] = [from_numpy(c, dev) for c in self.consts]
        return self.fn(held, *args)  # type: ignore[no-any-return]

    def own(self, results: Sequence[torch.Tensor], args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The results, each one that is an argument or a constant of the body cloned: the runtime hands an op's
        results to users as NumPy views, which must not alias a feed or a constant used by the next call."""
        shared = {id(a) for a in args} | {id(c) for held in self.held.values() for c in held}
        return [r.clone() if id(r) in shared else r for r in results]


_CPU = torch.device("cpu")


def _body_fn(body: Subgraph) -> _Body:
    return body.cache(("torch-fn",), lambda: _Body(body))  # type: ignore[no-any-return]


def _results(res: Sequence[torch.Tensor], n: int) -> Any:
    return res[0] if n == 1 else tuple(res)


def _truth(pred: torch.Tensor) -> bool:
    """A one-element predicate as a Python bool (nonzero, NaN included, is true: NumPy's ``bool``)."""
    return bool(pred.reshape(-1)[0])


def _empty_stack(t: ValueType, device: torch.device) -> torch.Tensor:
    """The stacked results of zero trips: as the NumPy kernel, shape (0, *t.shape) where t's shape is known."""
    shape = t.shape if isinstance(t, TensorType) and t.is_static else ()  # type: ignore[union-attr]
    return torch.empty((0, *shape), dtype=td(t.dtype), device=device)  # type: ignore[union-attr]


def _device_of(xs: Sequence[torch.Tensor]) -> torch.device:
    return xs[0].device if xs else _CPU


@BACKEND.rule("call")
def _call_rule(info: OpInfo) -> Fn:
    f, n = _body_fn(info.attrs["body"]), len(info.out_types)
    return lambda *args: _results(f.own(f(*args), args), n)


@BACKEND.rule("cond")
def _cond_rule(info: OpInfo) -> Fn:
    then_f, else_f = _body_fn(info.attrs["then_body"]), _body_fn(info.attrs["else_body"])
    n = len(info.out_types)

    def cond(pred: torch.Tensor, *operands: torch.Tensor) -> Any:
        f = then_f if _truth(pred) else else_f
        return _results(f.own(f(*operands), operands), n)
    return cond


@BACKEND.rule("while_loop")
def _while_loop_rule(info: OpInfo) -> Fn:
    a = info.attrs
    test, step = _body_fn(a["cond_body"]), _body_fn(a["body"])
    nc, max_trip, n = a["num_consts"], a["max_trip"], len(info.out_types)
    ncarry = len(info.in_types) - nc
    y_types = a["body"].out_types[ncarry:]

    def while_loop(*ins: torch.Tensor) -> Any:
        consts, carry = ins[:nc], ins[nc:]
        ys: list[list[torch.Tensor]] = [[] for _ in y_types]
        trips = 0
        while (max_trip is None or trips < max_trip) and _truth(test(*consts, *carry)[0]):
            res = step(*consts, *carry)
            carry = res[:ncarry]
            for acc, y in zip(ys, res[ncarry:], strict=True):
                acc.append(y)
            trips += 1
        dev = _device_of(ins)
        stacked = [torch.stack(acc) if acc else _empty_stack(t, dev) for acc, t in zip(ys, y_types, strict=True)]
        return _results([*step.own(carry, ins), *stacked], n)
    return while_loop


@BACKEND.rule("scan")
def _scan_rule(info: OpInfo) -> Fn:
    a = info.attrs
    step = _body_fn(a["body"])
    nc, ncarry, length, reverse, n = a["num_consts"], a["num_carry"], a["length"], a["reverse"], len(info.out_types)
    y_types = a["body"].out_types[ncarry:]

    def scan(*ins: torch.Tensor) -> Any:
        consts, carry, xs = ins[:nc], ins[nc:nc + ncarry], ins[nc + ncarry:]
        trips = length if length is not None else xs[0].shape[0]
        bufs: list[torch.Tensor | None] = [None] * len(y_types)
        for i in range(trips - 1, -1, -1) if reverse else range(trips):
            res = step(*consts, *carry, *(x[i] for x in xs))
            carry = res[:ncarry]
            for j, y in enumerate(res[ncarry:]):
                buf = bufs[j]
                if buf is None:  # each y's shape is known once the body has run (its type may leave dims open)
                    buf = bufs[j] = torch.empty((trips, *y.shape), dtype=y.dtype, device=y.device)
                buf[i] = y
        dev = _device_of(ins)
        ys = [b if b is not None else _empty_stack(t, dev) for b, t in zip(bufs, y_types, strict=True)]
        return _results([*step.own(carry, ins), *ys], n)
    return scan
