"""TensCalc's scalar functions (20001-20032) and ``scalars2ftensor``/``ftensor2scalars`` on the register machine.

Each scalar function is one instruction computing what TensCalc's generated C computes, in its order
(``Ssumprod`` is ``SUMPROD``, ``Splus_minus_dot`` is ``RSUBDOT``, ...), emitted for all ops of a kind at once:
the parameters (``Ssum``'s signs, ``Ssumprod``'s ``[m, s]``) are read once per distinct constant, not per op.
``ftensor2scalars`` emits nothing (its results are views of the tensor's slots, in column-major order);
``scalars2ftensor`` gathers its scalars (zeros elsewhere) into the tensor. Values of TensCalc's files carry no
shape: scalar functions give 0-d results, and ``scalars2ftensor`` the size its largest subscripts say.

    >>> from opgraph.backends.numba import BACKEND
    >>> "Ssumprod" in BACKEND.rules and "ftensor2scalars" in BACKEND.rules
    True
"""

from __future__ import annotations

import numpy as np

from opgraph.backends.base import BackendError
from opgraph.backends.numba import BACKEND
from opgraph.backends.numba.assemble import ALIAS_RULES, SHAPE_RULES, Assembler, Emitter, variadic_rows
from opgraph.backends.numba.elementwise import emit_elementwise
from opgraph.backends.numba.machine import OP
from opgraph.core.registry import CONST
from opgraph.ops.tenscalc import subscripts_matrix

UNARY = {"Sinv": "RECIP", "Sminus_inv_sqr": "MINVSQR", "Sexp": "EXP", "Slog": "LOG", "Scos": "COS",
         "Sminus_cos": "NEGCOS", "Ssin": "SIN", "Sminus_sin": "NEGSIN", "Sabs": "ABS", "Ssqrt": "SQRT",
         "SDsqrt": "DSQRT", "SDDsqrt": "DDSQRT", "Ssqr": "SQUARE", "S2times": "TWICE", "S2": "TWO", "Satan": "ATAN",
         "SDatan": "DATAN", "SDDatan": "DDATAN"}
"""One-operand scalar functions -> opcode."""

LISTS = {"Sminus_dot": "NEGDOT", "Sminus_dot_div": "NEGDOTDIV", "Splus_minus_dot": "RSUBDOT",
         "Splus_minus_dot_div": "RSUBDOTDIV", "Smin": "CMIN", "Smin0": "CMIN0", "Smax": "CMAX", "Smax0": "CMAX0",
         "Smax_abs": "CMAXABS", "Sclp": "CLP"}
"""Scalar functions over an operand list -> opcode (``n`` counts pairs where the opcode reads pairs)."""

PAIRED = {"NEGDOT": 0, "NEGDOTDIV": 1, "RSUBDOT": 1, "RSUBDOTDIV": 2, "CLP": 0}
"""Opcodes reading pairs, with how many single operands come first."""

SCALAR_KINDS = (*UNARY, *LISTS, "Ssum", "Ssumprod", "Sdiv", "Splus_sqr")


def _scalar_results(asm: Assembler, ops: np.ndarray) -> None:
    g = asm.graph
    lo, hi = g.out_ptr[ops], g.out_ptr[ops + 1]
    if np.any(hi - lo != 1):
        op = int(ops[np.flatnonzero(hi - lo != 1)[0]])
        raise BackendError(f"op {op} ({g.kind_of(op)}) has {int(hi[0] - lo[0])} results; TensCalc's scalar "
                           f"functions have one")
    outs = g.out_ids[lo].astype(np.int64)
    unknown = outs[asm.size[outs] < 0]
    if len(unknown):
        asm.set_shape(unknown, ())


for _kind in SCALAR_KINDS:
    SHAPE_RULES[_kind] = _scalar_results


def _unary(opcode: str) -> Emitter:
    code = OP[opcode]

    def emit(asm: Assembler, ops: np.ndarray) -> None:
        emit_elementwise(asm, ops, code, 1)

    emit.__name__ = f"emit_{opcode.lower()}"
    return emit


BACKEND.rules_from({kind: _unary(op) for kind, op in UNARY.items()})


@BACKEND.rule("Sdiv")
def emit_sdiv(asm: Assembler, ops: np.ndarray) -> None:
    """``a/b``."""
    emit_elementwise(asm, ops, OP["DIV"], 2)


def _params_by_attr(asm: Assembler, ops: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    g = asm.graph
    prod = g.value_producer[asm.inputs_of(ops, 0)].astype(np.int64)
    if np.any(prod < 0) or np.any(g.op_kind[np.maximum(prod, 0)] != CONST.id):
        bad = np.flatnonzero((prod < 0) | (g.op_kind[np.maximum(prod, 0)] != CONST.id))[0]
        op = int(ops[bad])
        raise BackendError(f"op {op} ({g.kind_of(op)}): its parameters are not a constant")
    attr = g.op_attr[prod]
    _, first, inv = np.unique(attr, return_index=True, return_inverse=True)
    return inv, [np.asarray(g.constant_of(int(prod[i]))) for i in first.tolist()]


@BACKEND.rule("Ssum")
def emit_ssum(asm: Assembler, ops: np.ndarray) -> None:
    """``+a1-a2+...``, signs read once per distinct sign constant."""
    inv, params = _params_by_attr(asm, ops)
    starts, counts = variadic_rows(asm, ops, skip=1)
    signs = [np.where(np.asarray(p, dtype=np.float64).ravel(order="F") > 0, 1.0, -1.0) for p in params]
    lens = np.array([len(s) for s in signs], dtype=np.int64)
    if np.any(lens[inv] != counts):
        op = int(ops[np.flatnonzero(lens[inv] != counts)[0]])
        raise BackendError(f"op {op} (Ssum): {int(lens[inv][0])} signs for {int(counts[0])} operands")
    cstart = np.array([asm.coef_list(s) for s in signs], dtype=np.int64)
    asm.emit(ops, OP["SSUM"], asm.slot[asm.output_of(ops)], starts, 0, cstart[inv], counts)


@BACKEND.rule("Ssumprod")
def emit_ssumprod(asm: Assembler, ops: np.ndarray) -> None:
    """Sum of ``s`` products of ``m`` operands, ``[m, s]`` read once per distinct parameter constant."""
    inv, params = _params_by_attr(asm, ops)
    ms = np.array([[int(x) for x in np.asarray(p).ravel(order="F")[:2]] for p in params], dtype=np.int64)
    starts, counts = variadic_rows(asm, ops, skip=1)
    m, s = ms[inv, 0], ms[inv, 1]
    if np.any(m * s != counts) or np.any(m < 1):
        op = int(ops[np.flatnonzero((m * s != counts) | (m < 1))[0]])
        raise BackendError(f"op {op} (Ssumprod): parameters do not fit its operands")
    asm.emit(ops, OP["SUMPROD"], asm.slot[asm.output_of(ops)], starts, m, 0, s)


@BACKEND.rule("Splus_sqr")
def emit_splus_sqr(asm: Assembler, ops: np.ndarray) -> None:
    """``a1*a1+a2*a2+...`` as a sum of products of each operand with itself."""
    g = asm.graph
    lo = g.in_ptr[ops].astype(np.int64)
    counts = (g.in_ptr[ops + 1] - g.in_ptr[ops]).astype(np.int64)
    idx = np.repeat(lo, counts) + (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))
    slots = np.repeat(asm.slot[g.in_ids[idx].astype(np.int64)], 2)
    starts = asm.operand_list(slots, 2 * counts)
    asm.emit(ops, OP["SUMPROD"], asm.slot[asm.output_of(ops)], starts, 2, 0, counts)


def _listed(opcode: str) -> Emitter:
    code = OP[opcode]
    singles = PAIRED.get(opcode)

    def emit(asm: Assembler, ops: np.ndarray) -> None:
        starts, counts = variadic_rows(asm, ops)
        n = counts if singles is None else (counts - singles) // 2
        if singles is not None and np.any((counts - singles) % 2 != 0):
            op = int(ops[np.flatnonzero((counts - singles) % 2 != 0)[0]])
            raise BackendError(f"op {op} ({asm.graph.kind_of(op)}): operands do not come in pairs")
        asm.emit(ops, code, asm.slot[asm.output_of(ops)], starts, 0, 0, n)

    emit.__name__ = f"emit_{opcode.lower()}"
    return emit


BACKEND.rules_from({kind: _listed(op) for kind, op in LISTS.items()})


# ---------------------------------------------------------------- tensors <-> scalars
def _ftensor_shapes(asm: Assembler, ops: np.ndarray) -> None:
    g = asm.graph
    for op in ops.tolist():
        outs = g.op_outputs(op)
        unknown = outs[asm.size[outs] < 0]
        if len(unknown):
            asm.set_shape(unknown, ())


def _ftensor_views(asm: Assembler, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Result ``k`` is the tensor's element ``k`` in column-major order: a view of that slot."""
    g = asm.graph
    res, src, off = [], [], []
    for op in ops.tolist():
        v = int(g.op_inputs(op)[0])
        outs = g.op_outputs(op).astype(np.int64)
        shape = asm.shapes[v]
        if shape is None:
            raise BackendError(f"op {op} (ftensor2scalars): the shape of its tensor {g.value_label(v)} is unknown")
        perm = np.arange(int(asm.size[v]), dtype=np.int64).reshape(shape).ravel(order="F")
        if len(perm) != len(outs):
            raise BackendError(f"op {op} (ftensor2scalars): a tensor of {len(perm)} entries cannot fill "
                               f"{len(outs)} outputs")
        res.append(outs)
        src.append(np.full(len(outs), v))
        off.append(perm)
    return np.concatenate(res), np.concatenate(src), np.concatenate(off)


SHAPE_RULES["ftensor2scalars"] = _ftensor_shapes
ALIAS_RULES["ftensor2scalars"] = _ftensor_views


@BACKEND.rule("ftensor2scalars")
def emit_ftensor2scalars(asm: Assembler, ops: np.ndarray) -> None:
    """Views of the tensor's slots (see the alias rule): nothing to run."""


def _subscripts(asm: Assembler, op: int) -> tuple[np.ndarray, tuple[int, ...]]:
    g = asm.graph
    ins = g.op_inputs(op).tolist()
    subs = asm.const_value(ins[0])
    if subs is None:
        raise BackendError(f"op {op} (scalars2ftensor): its subscripts are not a constant")
    subs = subscripts_matrix(subs, len(ins) - 1)
    if subs.shape[0] == 0:
        return subs, ()
    top = subs.max(axis=1) if subs.shape[1] else np.zeros(subs.shape[0], np.int64)
    return subs, tuple(int(t) for t in top)


def _scalars2ftensor_shapes(asm: Assembler, ops: np.ndarray) -> None:
    g = asm.graph
    for op in ops.tolist():
        out = int(g.op_outputs(op)[0])
        if asm.size[out] < 0:
            asm.set_shape(out, _subscripts(asm, op)[1])


SHAPE_RULES["scalars2ftensor"] = _scalars2ftensor_shapes


@BACKEND.rule("scalars2ftensor")
def emit_scalars2ftensor(asm: Assembler, ops: np.ndarray) -> None:
    """One GATHER per tensor: each entry from its scalar, zero where no subscript names it."""
    g = asm.graph
    for op in ops.tolist():
        ins = g.op_inputs(op).tolist()
        out = int(g.op_outputs(op)[0])
        subs, _ = _subscripts(asm, op)
        shape = asm.shapes[out]
        assert shape is not None
        slots = np.full(shape, asm.const_slot(0.0), dtype=np.int64)
        values = asm.slot[np.asarray(ins[1:], dtype=np.int64)]
        if subs.shape[0] == 0:
            slots = values[:1].reshape(()) if len(values) else slots
        elif len(values):
            if np.any(subs < 1) or any(int(subs[d].max()) > shape[d] for d in range(len(shape))):
                raise BackendError(f"op {op} (scalars2ftensor): subscripts outside a tensor of size {list(shape)}")
            slots[tuple(subs - 1)] = values
        asm.gather(np.array([op]), int(asm.slot[out]), slots.ravel())
