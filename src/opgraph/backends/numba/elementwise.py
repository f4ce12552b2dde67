"""Elementwise ops on the register machine: one opcode per kind (the table below is the whole rule set).

Every op of a kind is emitted at once (:func:`elementwise`): one instruction per op, its operands' slots read
from the graph's columns, a run of ``n`` elements where the values are tensors (a scalar operand broadcasts
along the run; any other broadcast first gathers the operand to the result's shape). Boolean results of
``add``/``multiply``/``maximum``/``minimum`` are NumPy's logical or/and.

    >>> from opgraph.backends.numba import BACKEND
    >>> sorted(k for k in ("add", "sin", "where", "cast") if k in BACKEND.rules)
    ['add', 'cast', 'sin', 'where']
"""

from __future__ import annotations

import numpy as np

from opgraph.backends.numba import BACKEND
from opgraph.backends.numba.assemble import ALIAS_RULES, Assembler, Emitter
from opgraph.backends.numba.machine import ARITY, OP

KINDS: dict[str, str] = {
    "negative": "NEG", "abs": "ABS", "sign": "SIGN", "exp": "EXP", "expm1": "EXPM1", "log": "LOG",
    "log1p": "LOG1P", "log2": "LOG2", "log10": "LOG10", "sqrt": "SQRT", "square": "SQUARE", "reciprocal": "RECIP",
    "sin": "SIN", "cos": "COS", "tan": "TAN", "asin": "ASIN", "acos": "ACOS", "atan": "ATAN", "sinh": "SINH",
    "cosh": "COSH", "tanh": "TANH", "asinh": "ASINH", "acosh": "ACOSH", "atanh": "ATANH", "floor": "FLOOR",
    "ceil": "CEIL", "trunc": "TRUNC", "round": "RINT", "isnan": "ISNAN", "isinf": "ISINF",
    "isfinite": "ISFINITE", "logical_not": "NOT", "exp2": "EXP2", "cbrt": "CBRT", "erf": "ERF", "erfc": "ERFC",
    "signbit": "SIGNBIT",
    "add": "ADD", "subtract": "SUB", "multiply": "MUL", "divide": "DIV", "power": "POW", "maximum": "MAX",
    "minimum": "MIN", "fmax": "FMAX", "fmin": "FMIN", "atan2": "ATAN2", "hypot": "HYPOT", "equal": "EQ",
    "not_equal": "NE", "less": "LT", "less_equal": "LE", "greater": "GT", "greater_equal": "GE",
    "logical_and": "AND", "logical_or": "OR", "logical_xor": "XOR", "copysign": "COPYSIGN", "fmod": "FMOD",
    "remainder": "REM", "floor_divide": "FLOORDIV", "logaddexp": "LOGADDEXP",
    "where": "WHERE", "clip": "CLIP",
}
"""Op kind -> opcode name (see :mod:`opgraph.backends.numba.machine`)."""

BOOL_RESULT = {"ADD": "OR", "MUL": "AND", "MAX": "OR", "MIN": "AND", "FMAX": "OR", "FMIN": "AND", "SQUARE": "MOV",
               "ABS": "MOV"}
"""NumPy's meaning of arithmetic on booleans: the opcode that computes it."""


def elementwise(opcode: str) -> Emitter:
    """The emitter of an elementwise kind computing ``opcode`` (see the module doc).

    >>> callable(elementwise("ADD"))
    True
    """
    code = OP[opcode]
    arity = ARITY[code]
    bool_code = OP[BOOL_RESULT.get(opcode, opcode)]

    def emit(asm: Assembler, ops: np.ndarray) -> None:
        emit_elementwise(asm, ops, code, arity, bool_code)

    emit.__name__ = f"emit_{opcode.lower()}"
    return emit


def _is_bool(asm: Assembler, values: np.ndarray) -> np.ndarray:
    g = asm.graph
    per_type = np.array([getattr(t, "dtype", None) == np.bool_ for t in g.types], dtype=bool)
    return per_type[g.value_type[values]]


def emit_elementwise(asm: Assembler, ops: np.ndarray, code: int, arity: int, bool_code: int | None = None) -> None:
    """One instruction per op (a run over tensors; see the module doc)."""
    out = asm.output_of(ops)
    m = asm.size[out]
    ins = [asm.inputs_of(ops, k) for k in range(arity)]
    slots = [asm.slot[v] for v in ins]
    mask = np.zeros(len(ops), dtype=np.int64)
    odd = np.zeros(len(ops), dtype=bool)
    for k, v in enumerate(ins):
        s = asm.size[v]
        mask |= (s == m).astype(np.int64) << k
        odd |= (s != m) & (s != 1)
    codes = np.full(len(ops), code, dtype=np.int64)
    if bool_code is not None and bool_code != code:
        codes[_is_bool(asm, out)] = bool_code
    # other broadcasts: gather the operand to the result's shape first (one GATHER each)
    for i in np.flatnonzero(odd).tolist():
        shape = asm.shapes[int(out[i])]
        for k, v in enumerate(ins):
            vi = int(v[i])
            if asm.size[vi] not in (1, m[i]) or asm.shapes[vi] != shape:
                if asm.size[vi] == 1:
                    continue
                tmp = asm.alloc(int(m[i]))
                src = np.broadcast_to(asm.slots_of(vi), shape).ravel()  # type: ignore[arg-type]
                asm.gather(ops[i:i + 1], tmp, src, sub=0)
                slots[k][i] = tmp
                mask[i] |= 1 << k
    pad = [slots[k] if k < arity else 0 for k in range(3)]
    asm.emit(ops, codes, asm.slot[out], pad[0], pad[1], pad[2], m, mask, sub=1)


BACKEND.rules_from({kind: elementwise(op) for kind, op in KINDS.items()})


@BACKEND.rule("cast")
def emit_cast(asm: Assembler, ops: np.ndarray) -> None:
    """float64 -> bool tests for nonzero; every other cast between float64 and bool copies."""
    out = asm.output_of(ops)
    to_bool = _is_bool(asm, out) & ~_is_bool(asm, asm.inputs_of(ops, 0))
    emit_elementwise(asm, ops[to_bool], OP["NE0"], 1)
    emit_elementwise(asm, ops[~to_bool], OP["MOV"], 1)


@BACKEND.rule("positive", "conj", "real")
def emit_copy(asm: Assembler, ops: np.ndarray) -> None:
    """Views of their input (see the alias rule below): nothing to run."""


def _same_view(asm: Assembler, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return asm.output_of(ops), asm.inputs_of(ops, 0), np.zeros(len(ops), dtype=np.int64)


for _kind in ("positive", "conj", "real"):
    ALIAS_RULES[_kind] = _same_view
