"""Reductions on the register machine: one variadic instruction per result element.

The reduced elements of each result element are found by the index trick of :mod:`.shape` (the input's slots,
reduced axes moved last), so any ``axis``/``keepdims`` works; ``mean`` divides the sum by the count.

    >>> from opgraph.backends.numba import BACKEND
    >>> "sum" in BACKEND.rules and "max" in BACKEND.rules
    True
"""

from __future__ import annotations

import numpy as np

from opgraph.backends.numba import BACKEND
from opgraph.backends.numba.assemble import Assembler, Emitter
from opgraph.backends.numba.machine import OP

REDUCTIONS = {"sum": "RSUM", "prod": "RPROD", "max": "RMAX", "min": "RMIN", "any": "RANY", "all": "RALL",
              "mean": "RSUM"}
"""Op kind -> the variadic opcode reducing one result element's inputs."""


def _groups(asm: Assembler, op: int) -> np.ndarray:
    """The input's slots as ``(result elements, reduced elements)``."""
    g = asm.graph
    v = int(g.op_inputs(op)[0])
    slots = asm.slots_of(v)
    axis = dict(g.attrs_of(op)).get("axis")
    nd = slots.ndim
    axes = tuple(range(nd)) if axis is None else tuple(a % nd for a in (axis if isinstance(axis, tuple) else (axis,)))
    keep = [d for d in range(nd) if d not in axes]
    moved = np.transpose(slots, keep + list(axes))
    red = int(np.prod([slots.shape[d] for d in axes])) if axes else 1
    return moved.reshape(int(np.prod([slots.shape[d] for d in keep])), red)


def reduction(kind: str) -> Emitter:
    """The emitter of a reduction kind (see the module doc).

    >>> callable(reduction("sum"))
    True
    """
    code = OP[REDUCTIONS[kind]]

    def emit(asm: Assembler, ops: np.ndarray) -> None:
        for op in ops.tolist():
            groups = _groups(asm, op)
            out = int(asm.output_of(np.array([op]))[0])
            m, red = groups.shape
            if m == 0:
                continue
            many = np.full(m, op)
            dst = asm.slot[out] + np.arange(m)
            if red == 0:  # NumPy's empty sum / product (max and min of nothing are refused by the type rule)
                fill = asm.const_slot(1.0 if kind in ("prod", "all") else 0.0)
                asm.emit(many, OP["MOV"], dst, fill)
                continue
            starts = asm.operand_list(groups, np.full(m, red))
            asm.emit(many, code, dst, starts, 0, 0, red)
            if kind == "mean":
                asm.emit(many, OP["DIV"], dst, dst, asm.const_slot(float(red)), sub=1)

    emit.__name__ = f"emit_{kind}"
    return emit


BACKEND.rules_from({kind: reduction(kind) for kind in REDUCTIONS})
