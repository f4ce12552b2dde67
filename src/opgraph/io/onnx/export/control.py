"""ONNX export of the ops with subgraph bodies (:mod:`opgraph.ops.control`): ``call`` inlined, ``cond`` as ``If``,
``while_loop`` as ``Loop``, ``scan`` as ``Scan`` (or a ``Loop`` when it scans over nothing).

Their rules are in :data:`~opgraph.io.onnx.export.BODY_EXPORT`, not in :data:`~opgraph.io.onnx.export.EXPORT`.

    >>> import opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> from opgraph.io.onnx import to_onnx
    >>> sb = opgraph.GraphBuilder(); a = sb.input(("float32", (2,)), name="a"); sb.output(sb.negative(a))
    >>> b = opgraph.GraphBuilder(); x = b.input(("float32", (2,)), name="x")
    >>> b.output(b.op("call", x, body=Subgraph(sb.freeze())))
    >>> [n.op_type for n in to_onnx(b.freeze()).graph.node]
    ['Neg']
"""

from __future__ import annotations

from typing import cast

import numpy as np
from onnx import TensorProto

from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType
from opgraph.io.onnx.export import BODY_EXPORT, Exporter
from opgraph.io.onnx.export.common import AttrMap, Names, Types

_BOOL = TensorType(np.bool_, ())
_I64 = TensorType(np.int64, ())


def _pred(ex: Exporter, name: str, t: TensorType) -> str:
    """A one-element predicate (nonzero is true) as the bool scalar ONNX's If and Loop take."""
    if t.dtype != np.bool_:
        name = ex.one("Cast", name, to=TensorProto.BOOL)
    return name if t.shape == () else ex.one("Reshape", name, ex.ints([]))


@BODY_EXPORT.rule("call")
def _call(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return ex.inline(attrs["body"], ins)  # the body's nodes in place (ONNX functions take no outer tensors)


@BODY_EXPORT.rule("cond")
def _cond(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    # ONNX branches take no inputs: the operands are outer-scope names inside them
    branches = {key: ex.body(attrs[f"{which}_body"], list(ins[1:]), ex.fresh(which))
                for key, which in (("then_branch", "then"), ("else_branch", "else"))}
    return ex.node("If", [_pred(ex, ins[0], it[0])], n_out=len(ot), **branches)


@BODY_EXPORT.rule("while_loop")
def _while_loop(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    nc = int(attrs["num_consts"])
    consts, init = list(ins[:nc]), list(ins[nc:])
    test: Subgraph = attrs["cond_body"]
    pred_type = cast(TensorType, test.out_types[0])

    def going(sub: Exporter, formals: Names, results: Names) -> list[tuple[str, TensorType]]:
        # ONNX's Loop tests the condition the body returns: the cond body on the new carry
        return [(_pred(sub, sub.inline(test, [*consts, *results[:len(init)]])[0], pred_type), _BOOL)]

    body = ex.body(attrs["body"], [*consts, *[None] * len(init)], ex.fresh("loop"), lead=[_I64, _BOOL], head=going)
    first = _pred(ex, ex.inline(test, list(ins))[0], pred_type)
    trips = "" if attrs["max_trip"] is None else ex.const(np.int64(attrs["max_trip"]))
    return ex.node("Loop", [trips, first, *init], n_out=len(ot), body=body)


@BODY_EXPORT.rule("scan")
def _scan(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    nc, ncarry = int(attrs["num_consts"]), int(attrs["num_carry"])
    consts, carry, xs = list(ins[:nc]), list(ins[nc:nc + ncarry]), list(ins[nc + ncarry:])
    body: Subgraph = attrs["body"]
    ny = body.num_outputs - ncarry
    reverse = bool(attrs["reverse"])
    args: list[str | None] = [*consts, *[None] * (ncarry + len(xs))]
    if xs:  # ONNX's Scan: a reverse scan reads its inputs and writes its outputs from the end
        g = ex.body(body, args, ex.fresh("scan"))
        dirs = {"scan_input_directions": [1] * len(xs), "scan_output_directions": [1] * ny} if reverse else {}
        return ex.node("Scan", [*carry, *xs], n_out=len(ot), body=g, num_scan_inputs=len(xs), **dirs)
    # no xs (ONNX's Scan needs one to know its length): a Loop of `length` trips, its scan outputs flipped if reverse
    g = ex.body(body, args, ex.fresh("scan"), lead=[_I64, _BOOL],
                head=lambda sub, formals, results: [(formals[1], _BOOL)])
    outs = ex.node("Loop", [ex.const(np.int64(attrs["length"])), "", *carry], n_out=len(ot), body=g)
    if reverse:
        outs[ncarry:] = [ex.one("Slice", y, ex.ints([-1]), ex.ints([np.iinfo(np.int64).min]), ex.ints([0]),
                                ex.ints([-1])) for y in outs[ncarry:]]
    return outs
