"""Shape ops on the register machine: views where the result is a run of the input's slots, else one GATHER.

The slot map of an op is its own NumPy reference kernel run on the input's slot numbers (``pad`` pads with the
slot of its constant), so the engine moves data exactly as NumPy would for every shape op listed here. A result
whose slots are one ascending run of its input's (``reshape``, ``squeeze``, a contiguous ``getitem``) is a view:
no instruction.

    >>> from opgraph.backends.numba import BACKEND
    >>> "getitem" in BACKEND.rules and "reshape" in BACKEND.rules
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opgraph.backends.numba import BACKEND
from opgraph.backends.numba.assemble import ALIAS_RULES, Assembler
from opgraph.core.registry import get_op

MOVES = ("permute_dims", "broadcast_to", "concat", "stack", "getitem", "pad", "flip", "roll", "tile", "repeat",
         "moveaxis", "slice", "split", "expand_dims", "squeeze", "reshape", "copy")
"""Kinds whose results only move their inputs' elements."""


def slot_map(asm: Assembler, op: int, base: bool = True) -> list[np.ndarray]:
    """Where each element of each result of ``op`` comes from: its input's slots (``base``) or, for one-input
    ops, offsets into its input's run; by the op's reference kernel on those numbers."""
    g = asm.graph
    key = (op, base)
    memo: dict[Any, list[np.ndarray]] = asm.__dict__.setdefault("_slot_maps", {})
    if key in memo:
        return memo[key]
    ins = g.op_inputs(op).tolist()
    attrs = dict(g.attrs_of(op))
    kind = g.kind_of(op)
    idx = [asm.slots_of(v) if base else np.arange(int(asm.size[v]), dtype=np.int64).reshape(asm.shapes[v])
           for v in ins]
    if kind == "pad":
        if attrs.get("mode", "constant") == "constant":
            attrs["constant_value"] = asm.const_slot(float(attrs.get("constant_value", 0.0))) if base else -1
    kernel = get_op(kind).kernel_for(int(g.op_version[op]))
    got = kernel(*idx, **attrs)
    outs = list(got) if isinstance(got, (tuple, list)) else [got]
    memo[key] = [np.asarray(o, dtype=np.int64) for o in outs]
    return memo[key]


def _views(asm: Assembler, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    res, src, off = [], [], []
    for op in ops.tolist():
        ins = asm.graph.op_inputs(op)
        if len(ins) != 1:
            continue
        outs = asm.graph.op_outputs(op).tolist()
        for v, rel in zip(outs, slot_map(asm, op, base=False), strict=True):
            flat = rel.ravel()
            if flat.size and np.array_equal(flat, flat[0] + np.arange(flat.size)) and flat[0] >= 0:
                res.append(v)
                src.append(int(ins[0]))
                off.append(int(flat[0]))
            elif flat.size == 0:
                res.append(v)
                src.append(int(ins[0]))
                off.append(0)
    if not res:
        return None
    return np.array(res, dtype=np.int64), np.array(src, dtype=np.int64), np.array(off, dtype=np.int64)


def emit_moves(asm: Assembler, ops: np.ndarray) -> None:
    """A GATHER per result that is not a view of its input."""
    g = asm.graph
    for op in ops.tolist():
        ins = g.op_inputs(op).tolist()
        for k, v in enumerate(g.op_outputs(op).tolist()):
            if len(ins) == 1:
                rel = slot_map(asm, op, base=False)[k].ravel()
                if rel.size == 0 or (np.array_equal(rel, rel[0] + np.arange(rel.size)) and rel[0] >= 0):
                    continue  # a view (see _views)
            slots = slot_map(asm, op)[k].ravel()
            if slots.size:
                asm.gather(np.array([op]), int(asm.slot[v]), slots)


for _kind in MOVES:
    BACKEND.rule(_kind)(emit_moves)
    ALIAS_RULES[_kind] = _views
