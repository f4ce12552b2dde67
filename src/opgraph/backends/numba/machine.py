"""The register machine: its instruction set (as data) and its interpreter (one numba function per machine).

A program is a few flat arrays (:class:`Instructions`), one row per instruction:
``code`` (the opcode), ``dst`` (the first result slot), ``a``, ``b``, ``c`` (the operands' first slots, or for
the variadic opcodes the start of their operand list in ``args``), ``n`` (how many elements, or operand groups)
and ``mask`` (which of ``a``, ``b``, ``c`` advance along a run: bit 0, 1, 2; a clear bit broadcasts a scalar).
Every value lives in one float64 register file ``r`` (booleans as 0.0 and 1.0), a small tensor as a run of
consecutive slots in C order. CasADi's SX virtual machine is the model; tinygrad's ``exec_alu`` the shape of
:func:`alu`: one function that folds any elementwise opcode, which the interpreter inlines.

Opcodes come in four groups, each a table below (:data:`UNARY`, :data:`BINARY`, :data:`TERNARY`,
:data:`VARIADIC`) that gives each opcode its number and its meaning in C (``x``, ``y``, ``z`` are the operands),
which the C writer (:mod:`opgraph.backends.c`) emits and the tests check against :func:`alu`:

* elementwise (unary, binary, ternary): ``r[dst+i] = f(r[a+i*sa], r[b+i*sb], r[c+i*sc])`` for ``i < n``;
* variadic, over the operand list ``args[a:]``: TensCalc's scalar sums of products (``SUMPROD``: ``n`` groups of
  ``b`` factors), signed sums (``SSUM``, signs in ``coefs[c:]``), running minima and maxima with C's NaN rule,
  reductions with NumPy's (``RSUM``, ``RMAX``, ...), and ``GATHER`` (``r[dst+i] = r[args[a+i]]``), which
  moves data for every shape op.

    >>> import numpy as np
    >>> from opgraph.backends.numba.machine import Instructions, OP, execute
    >>> prog = Instructions.of([(OP["MUL"], 2, 0, 1, 0, 1, 0), (OP["SIN"], 3, 2, 0, 0, 1, 0)])
    >>> r = np.array([2.0, 3.0, 0.0, 0.0]); execute(prog, r); bool(r[3] == np.sin(6.0))
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# ---------------------------------------------------------------- the instruction set (data)
UNARY: dict[str, tuple[int, str]] = {
    "MOV": (0, "x"), "NEG": (1, "-x"), "ABS": (2, "fabs(x)"),
    "SIGN": (3, "(x > 0 ? 1.0 : (x < 0 ? -1.0 : x))"),
    "EXP": (4, "exp(x)"), "EXPM1": (5, "expm1(x)"), "LOG": (6, "log(x)"), "LOG1P": (7, "log1p(x)"),
    "LOG2": (8, "log2(x)"), "LOG10": (9, "log10(x)"), "SQRT": (10, "sqrt(x)"), "SQUARE": (11, "x * x"),
    "RECIP": (12, "1.0 / x"), "SIN": (13, "sin(x)"), "COS": (14, "cos(x)"), "TAN": (15, "tan(x)"),
    "ASIN": (16, "asin(x)"), "ACOS": (17, "acos(x)"), "ATAN": (18, "atan(x)"), "SINH": (19, "sinh(x)"),
    "COSH": (20, "cosh(x)"), "TANH": (21, "tanh(x)"), "ASINH": (22, "asinh(x)"), "ACOSH": (23, "acosh(x)"),
    "ATANH": (24, "atanh(x)"), "FLOOR": (25, "floor(x)"), "CEIL": (26, "ceil(x)"), "TRUNC": (27, "trunc(x)"),
    "RINT": (28, "rint(x)"), "ISNAN": (29, "(double)(isnan(x) != 0)"), "ISINF": (30, "(double)(isinf(x) != 0)"),
    "ISFINITE": (31, "(double)(isfinite(x) != 0)"), "NOT": (32, "(double)(x == 0)"), "EXP2": (33, "exp2(x)"),
    "CBRT": (34, "cbrt(x)"), "ERF": (35, "erf(x)"), "ERFC": (36, "erfc(x)"),
    "SIGNBIT": (37, "(double)(signbit(x) != 0)"), "NE0": (38, "(double)(x != 0)"),
    "NEGCOS": (39, "-cos(x)"), "NEGSIN": (40, "-sin(x)"), "MINVSQR": (41, "-1.0 / (x * x)"),
    "DSQRT": (42, "0.5 * pow(x, -0.5)"), "DDSQRT": (43, "-0.25 * pow(x, -1.5)"), "TWICE": (44, "2.0 * x"),
    "TWO": (45, "2.0"), "DATAN": (46, "1.0 / (1.0 + x * x)"),
    "DDATAN": (47, "-2.0 * x / (1.0 + x * x) / (1.0 + x * x)"),
}
"""One operand: name -> (opcode, C expression of ``x``)."""

BINARY: dict[str, tuple[int, str]] = {
    "ADD": (64, "x + y"), "SUB": (65, "x - y"), "MUL": (66, "x * y"), "DIV": (67, "x / y"),
    "POW": (68, "pow(x, y)"), "MAX": (69, "og_maximum(x, y)"), "MIN": (70, "og_minimum(x, y)"),
    "FMAX": (71, "fmax(x, y)"), "FMIN": (72, "fmin(x, y)"), "ATAN2": (73, "atan2(x, y)"),
    "HYPOT": (74, "hypot(x, y)"), "EQ": (75, "(double)(x == y)"), "NE": (76, "(double)(x != y)"),
    "LT": (77, "(double)(x < y)"), "LE": (78, "(double)(x <= y)"), "GT": (79, "(double)(x > y)"),
    "GE": (80, "(double)(x >= y)"), "AND": (81, "(double)(x != 0 && y != 0)"),
    "OR": (82, "(double)(x != 0 || y != 0)"), "XOR": (83, "(double)((x != 0) != (y != 0))"),
    "COPYSIGN": (84, "copysign(x, y)"), "FMOD": (85, "fmod(x, y)"), "REM": (86, "og_remainder(x, y)"),
    "FLOORDIV": (87, "og_floor_divide(x, y)"), "LOGADDEXP": (88, "og_logaddexp(x, y)"),
}
"""Two operands: name -> (opcode, C expression of ``x`` and ``y``; ``og_*`` are NumPy's definitions, written
out in the C file's preamble)."""

TERNARY: dict[str, tuple[int, str]] = {
    "WHERE": (112, "(x != 0 ? y : z)"), "FMA": (113, "x * y + z"),
    "CLIP": (114, "og_minimum(og_maximum(x, y), z)"),
}
"""Three operands: name -> (opcode, C expression of ``x``, ``y`` and ``z``)."""

VARIADIC: dict[str, tuple[int, str]] = {
    "SUMPROD": (128, "sum over n groups of the product of b operands"),
    "SSUM": (129, "signed sum of n operands (signs in coefs[c:])"),
    "NEGDOT": (130, "-(sum of n products of 2)"),
    "RSUBDOT": (131, "args[a] - (sum of n products of 2 after it)"),
    "NEGDOTDIV": (132, "-(sum of n products of 2 after args[a]) / args[a]"),
    "RSUBDOTDIV": (133, "(args[a] - sum of n products of 2 after args[a+1]) / args[a+1]"),
    "CMIN": (134, "C's running min: m=x1; if (m>xi) m=xi"), "CMAX": (135, "C's running max"),
    "CMIN0": (136, "m=0; if (m>xi) m=xi"), "CMAX0": (137, "m=0; if (m<xi) m=xi"),
    "CMAXABS": (138, "m=|x1|; if (m<|xi|) m=|xi|"),
    "CLP": (139, "m=DBL_MAX; for pairs: if (bi<0) {t=-ai/bi; if (m>t) m=t;}"),
    "GATHER": (140, "r[dst+i] = r[args[a+i]], i < n"),
    "RSUM": (141, "sum of n operands, left to right"), "RPROD": (142, "product of n operands"),
    "RMAX": (143, "NumPy's max of n operands (NaN wins)"), "RMIN": (144, "NumPy's min of n operands"),
    "RANY": (145, "any of n operands nonzero"), "RALL": (146, "all of n operands nonzero"),
}
"""Variable operand lists (in ``args``): name -> (opcode, meaning)."""

OP: dict[str, int] = {name: code for table in (UNARY, BINARY, TERNARY, VARIADIC) for name, (code, _) in table.items()}
"""Every opcode by name."""
NAMES: dict[int, str] = {code: name for name, code in OP.items()}
ARITY: dict[int, int] = {**{c: 1 for c, _ in UNARY.values()}, **{c: 2 for c, _ in BINARY.values()},
                         **{c: 3 for c, _ in TERNARY.values()}}
"""Operand count of each elementwise opcode."""
FIRST_VARIADIC = 128
FIRST_TERNARY = 112
RUN = 256
"""Added to an elementwise opcode whose instruction runs over ``n`` elements (the assembler does it), so the
interpreter's common case, one element, reads no length."""

DBL_MAX = float(np.finfo(np.float64).max)
LOGE2 = math.log(2.0)

# numba reads module globals as compile-time constants: the interpreter's branches compare with these
(MOV, NEG, ABS, SIGN, EXP, EXPM1, LOG, LOG1P, LOG2, LOG10, SQRT, SQUARE, RECIP, SIN, COS, TAN, ASIN, ACOS, ATAN,
 SINH, COSH, TANH, ASINH, ACOSH, ATANH, FLOOR, CEIL, TRUNC, RINT, ISNAN, ISINF, ISFINITE, NOT, EXP2, CBRT, ERF,
 ERFC, SIGNBIT, NE0, NEGCOS, NEGSIN, MINVSQR, DSQRT, DDSQRT, TWICE, TWO, DATAN, DDATAN) = range(48)
(ADD, SUB, MUL, DIV, POW, MAX, MIN, FMAX, FMIN, ATAN2, HYPOT, EQ, NE, LT, LE, GT, GE, AND, OR, XOR, COPYSIGN,
 FMOD, REM, FLOORDIV, LOGADDEXP) = range(64, 89)
WHERE, FMA, CLIP = 112, 113, 114
(SUMPROD, SSUM, NEGDOT, RSUBDOT, NEGDOTDIV, RSUBDOTDIV, CMIN, CMAX, CMIN0, CMAX0, CMAXABS, CLP, GATHER, RSUM, RPROD,
 RMAX, RMIN, RANY, RALL) = range(128, 147)


@dataclass(frozen=True)
class Instructions:
    """A register-machine program: one row per instruction (see the module doc), plus the variadic opcodes'
    operand lists (``args``) and signs (``coefs``).

    >>> Instructions.of([(OP["ADD"], 2, 0, 1, 0, 1, 0)]).code.tolist()
    [64]
    """

    code: np.ndarray
    dst: np.ndarray
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    n: np.ndarray
    mask: np.ndarray
    args: np.ndarray
    coefs: np.ndarray

    @staticmethod
    def of(rows: Sequence[tuple[int, ...]], args: Sequence[int] = (), coefs: Sequence[float] = ()) -> Instructions:
        """A program from rows ``(code, dst, a, b, c, n, mask)`` (for examples and tests).

        >>> len(Instructions.of([(OP["NEG"], 1, 0, 0, 0, 1, 0)]))
        1
        """
        cols = np.array(rows, dtype=np.int32).reshape(-1, 7).T
        return Instructions(*cols[:6], cols[6].astype(np.int8), np.asarray(args, dtype=np.int32),
                            np.asarray(coefs, dtype=np.float64))

    def __len__(self) -> int:
        return len(self.code)

    def plain(self) -> Instructions:
        """The same program with elementwise runs given their plain opcodes (``n`` says the length; the
        interpreter's :data:`RUN` flag is its own shortcut), as the C writer reads it.

        >>> Instructions.of([(OP["ADD"] + RUN, 4, 0, 2, 0, 2, 3)]).plain().code.tolist()
        [64]
        """
        code = np.where(self.code >= RUN, self.code - RUN, self.code).astype(self.code.dtype)
        return Instructions(code, self.dst, self.a, self.b, self.c, self.n, self.mask, self.args, self.coefs)

    def flagged(self) -> Instructions:
        """The same program with the interpreter's :data:`RUN` flag on every elementwise instruction of ``n != 1``
        elements (what :func:`execute` runs; the assembler emits it so).

        >>> Instructions.of([(OP["ADD"], 4, 0, 2, 0, 2, 3)]).flagged().code.tolist() == [OP["ADD"] + RUN]
        True
        """
        code = np.where((self.code < FIRST_VARIADIC) & (self.n != 1), self.code + RUN, self.code)
        return Instructions(code.astype(self.code.dtype), self.dst, self.a, self.b, self.c, self.n, self.mask,
                            self.args, self.coefs)

    @property
    def nbytes(self) -> int:
        """Bytes the program's arrays take."""
        return sum(int(getattr(self, f).nbytes) for f in ("code", "dst", "a", "b", "c", "n", "mask", "args", "coefs"))

    def listing(self, limit: int = 50) -> str:
        """The first ``limit`` instructions, one per line (for reading and errors).

        >>> print(Instructions.of([(OP["ADD"], 2, 0, 1, 0, 1, 0)]).listing())
        0: r2 = ADD r0 r1
        """
        lines = []
        for k in range(min(limit, len(self))):
            code, d, a, b, c, n = (int(v[k]) for v in (self.code, self.dst, self.a, self.b, self.c, self.n))
            code = code - RUN if code >= RUN else code
            name = NAMES.get(code, str(code))
            run = f"[{n}]" if n != 1 else ""
            if code >= FIRST_VARIADIC:
                lines.append(f"{k}: r{d}{run if code == GATHER else ''} = {name} args[{a}:] n={n} b={b} c={c}")
            else:
                ops = " ".join(f"r{v}" for v in (a, b, c)[:ARITY[code]])
                lines.append(f"{k}: r{d}{run} = {name} {ops}")
        if len(self) > limit:
            lines.append(f"... ({len(self) - limit} more)")
        return "\n".join(lines)


# ---------------------------------------------------------------- the interpreter (numba)
def _maximum(x: float, y: float) -> float:
    if x != x:
        return x
    if y != y:
        return y
    return x if x >= y else y


def _minimum(x: float, y: float) -> float:
    if x != x:
        return x
    if y != y:
        return y
    return x if x <= y else y


def _remainder(x: float, y: float) -> float:
    if y == 0.0:
        return np.fmod(x, y) if x != x else math.nan
    m = np.fmod(x, y)
    if m != 0.0:
        if (y < 0.0) != (m < 0.0):
            m += y
    else:
        m = math.copysign(0.0, y)
    return m


def _floor_divide(x: float, y: float) -> float:
    # NumPy's npy_divmod (numpy/_core/src/npymath/npy_math_internal.h.src)
    if y == 0.0:
        return x / y
    m = np.fmod(x, y)
    div = (x - m) / y
    if m != 0.0 and (y < 0.0) != (m < 0.0):
        div -= 1.0
    if div != 0.0:
        fd = np.floor(div)
        if div - fd > 0.5:
            fd += 1.0
    else:
        fd = math.copysign(0.0, x / y)
    return fd


def _logaddexp(x: float, y: float) -> float:
    if x == y:
        return x + LOGE2
    t = x - y
    if t > 0:
        return x + math.log1p(math.exp(-t))
    if t <= 0:
        return y + math.log1p(math.exp(t))
    return t


def _cbrt(x: float) -> float:
    # a power is a few ulps from libm's cbrt (NumPy's and C's); one Newton step brings it to about an ulp
    if x == 0.0 or not math.isfinite(x):
        return x
    r = math.copysign(abs(x) ** (1.0 / 3.0), x)
    return r - (r * r * r - x) / (3.0 * r * r)


def _rint(x: float) -> float:
    r = np.floor(x)
    d = x - r
    if d > 0.5 or (d == 0.5 and r - 2.0 * np.floor(r * 0.5) != 0.0):
        r += 1.0
    return math.copysign(r, x) if r == 0.0 else r


def _alu(o: int, x: float, y: float, z: float) -> float:
    """Any elementwise opcode on its operands (the interpreter inlines this). One flat chain of comparisons with
    the opcode, which LLVM turns into one jump table: nested range tests cost a mispredicted branch each
    (measured 21 -> 18 ns per instruction on a random scalar DAG)."""
    if o == MOV:
        return x
    if o == NEG:
        return -x
    if o == ABS:
        return abs(x)
    if o == SIGN:
        return 1.0 if x > 0 else (-1.0 if x < 0 else x)
    if o == EXP:
        return math.exp(x)
    if o == EXPM1:
        return math.expm1(x)
    if o == LOG:
        return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)
    if o == LOG1P:
        return math.log1p(x) if x > -1 else (-math.inf if x == -1 else math.nan)
    if o == LOG2:
        return math.log2(x) if x > 0 else (-math.inf if x == 0 else math.nan)
    if o == LOG10:
        return math.log10(x) if x > 0 else (-math.inf if x == 0 else math.nan)
    if o == SQRT:
        return math.sqrt(x) if x >= 0 else math.nan
    if o == SQUARE:
        return x * x
    if o == RECIP:
        return 1.0 / x
    if o == SIN:
        return math.sin(x)
    if o == COS:
        return math.cos(x)
    if o == TAN:
        return math.tan(x)
    if o == ASIN:
        return math.asin(x) if -1 <= x <= 1 else math.nan
    if o == ACOS:
        return math.acos(x) if -1 <= x <= 1 else math.nan
    if o == ATAN:
        return math.atan(x)
    if o == SINH:
        return math.sinh(x)
    if o == COSH:
        return math.cosh(x)
    if o == TANH:
        return math.tanh(x)
    if o == ASINH:
        return math.asinh(x)
    if o == ACOSH:
        return math.acosh(x) if x >= 1 else math.nan
    if o == ATANH:
        return math.atanh(x) if -1 < x < 1 else (math.copysign(math.inf, x) if abs(x) == 1 else math.nan)
    if o == FLOOR:
        return np.floor(x) if math.isfinite(x) else x
    if o == CEIL:
        return np.ceil(x) if math.isfinite(x) else x
    if o == TRUNC:
        return np.trunc(x) if math.isfinite(x) else x
    if o == RINT:
        return _rint(x) if math.isfinite(x) else x
    if o == ISNAN:
        return 1.0 if x != x else 0.0
    if o == ISINF:
        return 1.0 if math.isinf(x) else 0.0
    if o == ISFINITE:
        return 1.0 if math.isfinite(x) else 0.0
    if o == NOT:
        return 1.0 if x == 0 else 0.0
    if o == EXP2:
        return 2.0 ** x
    if o == CBRT:
        return _cbrt(x)
    if o == ERF:
        return math.erf(x)
    if o == ERFC:
        return math.erfc(x)
    if o == SIGNBIT:
        return 1.0 if math.copysign(1.0, x) < 0 else 0.0
    if o == NE0:
        return 1.0 if x != 0 else 0.0
    if o == NEGCOS:
        return -math.cos(x)
    if o == NEGSIN:
        return -math.sin(x)
    if o == MINVSQR:
        return -1.0 / (x * x)
    if o == DSQRT:
        return 0.5 * x ** -0.5
    if o == DDSQRT:
        return -0.25 * x ** -1.5
    if o == TWICE:
        return 2.0 * x
    if o == TWO:
        return 2.0
    if o == DATAN:
        return 1.0 / (1.0 + x * x)
    if o == DDATAN:
        d = 1.0 + x * x
        return -2.0 * x / d / d
    if o == ADD:
        return x + y
    if o == SUB:
        return x - y
    if o == MUL:
        return x * y
    if o == DIV:
        return x / y
    if o == POW:
        return x ** y
    if o == MAX:
        return _maximum(x, y)
    if o == MIN:
        return _minimum(x, y)
    if o == FMAX:
        return y if x != x else (x if y != y else (x if x >= y else y))
    if o == FMIN:
        return y if x != x else (x if y != y else (x if x <= y else y))
    if o == ATAN2:
        return math.atan2(x, y)
    if o == HYPOT:
        return math.hypot(x, y)
    if o == EQ:
        return 1.0 if x == y else 0.0
    if o == NE:
        return 1.0 if x != y else 0.0
    if o == LT:
        return 1.0 if x < y else 0.0
    if o == LE:
        return 1.0 if x <= y else 0.0
    if o == GT:
        return 1.0 if x > y else 0.0
    if o == GE:
        return 1.0 if x >= y else 0.0
    if o == AND:
        return 1.0 if (x != 0 and y != 0) else 0.0
    if o == OR:
        return 1.0 if (x != 0 or y != 0) else 0.0
    if o == XOR:
        return 1.0 if ((x != 0) != (y != 0)) else 0.0
    if o == COPYSIGN:
        return math.copysign(x, y)
    if o == FMOD:
        return np.fmod(x, y)
    if o == REM:
        return _remainder(x, y)
    if o == FLOORDIV:
        return _floor_divide(x, y)
    if o == LOGADDEXP:
        return _logaddexp(x, y)
    if o == WHERE:
        return y if x != 0 else z
    if o == FMA:
        return x * y + z
    if o == CLIP:
        return _minimum(_maximum(x, y), z)
    return math.nan




def _variadic(o: int, d: int, a: int, b: int, c: int, n: int, args: Any, coefs: Any, r: Any) -> None:
    """One variadic instruction (see :data:`VARIADIC`)."""
    if o == SUMPROD:
        acc = 0.0
        k = a
        for g in range(n):
            p = r[args[k]]
            for j in range(1, b):
                p = p * r[args[k + j]]
            k += b
            acc = p if g == 0 else acc + p
        r[d] = acc
    elif o == SSUM:
        acc = 0.0
        for g in range(n):
            v = r[args[a + g]]
            if coefs[c + g] > 0:
                acc = v if g == 0 else acc + v
            else:
                acc = -v if g == 0 else acc - v
        r[d] = acc
    elif o == NEGDOT or o == RSUBDOT or o == NEGDOTDIV or o == RSUBDOTDIV:
        first = a + (0 if o == NEGDOT else (2 if o == RSUBDOTDIV else 1))
        acc = 0.0
        for g in range(n):
            t = r[args[first + 2 * g]] * r[args[first + 2 * g + 1]]
            acc = t if g == 0 else acc + t
        if o == NEGDOT:
            r[d] = -acc
        elif o == RSUBDOT:
            r[d] = r[args[a]] - acc
        elif o == NEGDOTDIV:
            r[d] = -acc / r[args[a]]
        else:
            r[d] = (r[args[a]] - acc) / r[args[a + 1]]
    elif o == GATHER:
        for i in range(n):
            r[d + i] = r[args[a + i]]
    elif o == CMIN or o == CMAX or o == CMIN0 or o == CMAX0 or o == CMAXABS:
        start = 0
        if o == CMIN0 or o == CMAX0:
            m = 0.0
        elif o == CMAXABS:
            m = abs(r[args[a]])
            start = 1
        else:
            m = r[args[a]]
            start = 1
        for i in range(start, n):
            v = r[args[a + i]]
            if o == CMIN or o == CMIN0:
                if m > v:
                    m = v
            elif o == CMAXABS:
                v = abs(v)
                if m < v:
                    m = v
            elif m < v:
                m = v
        r[d] = m
    elif o == CLP:
        m = DBL_MAX
        for g in range(n):
            x = r[args[a + 2 * g]]
            y = r[args[a + 2 * g + 1]]
            t = -x / y
            if y < 0 and m > t:
                m = t
        r[d] = m
    elif o == RSUM or o == RPROD:
        acc = 0.0 if o == RSUM else 1.0
        for i in range(n):
            acc = acc + r[args[a + i]] if o == RSUM else acc * r[args[a + i]]
        r[d] = acc
    elif o == RMAX or o == RMIN:
        m = r[args[a]]
        for i in range(1, n):
            m = _maximum(m, r[args[a + i]]) if o == RMAX else _minimum(m, r[args[a + i]])
        r[d] = m
    elif o == RANY or o == RALL:
        hit = 0.0 if o == RANY else 1.0
        for i in range(n):
            nz = r[args[a + i]] != 0
            if o == RANY and nz:
                hit = 1.0
            if o == RALL and not nz:
                hit = 0.0
        r[d] = hit


def _run(code: Any, dst: Any, a: Any, b: Any, c: Any, n: Any, mask: Any, args: Any, coefs: Any, r: Any) -> None:
    for k in range(code.shape[0]):
        o = code[k]
        if o < FIRST_TERNARY:  # one element, at most two operands: no length, no third operand to read
            r[dst[k]] = _alu(o, r[a[k]], r[b[k]], 0.0)
        elif o < FIRST_VARIADIC:
            r[dst[k]] = _alu(o, r[a[k]], r[b[k]], r[c[k]])
        elif o == SUMPROD:  # TensCalc's commonest instructions, inlined: no call, no second dispatch
            m = b[k]
            i = a[k]
            acc = 0.0
            for g in range(n[k]):
                p = r[args[i]]
                for j in range(1, m):
                    p = p * r[args[i + j]]
                i += m
                acc = p if g == 0 else acc + p
            r[dst[k]] = acc
        elif o == RSUBDOT:
            i = a[k] + 1
            acc = 0.0
            for g in range(n[k]):
                t = r[args[i]] * r[args[i + 1]]
                i += 2
                acc = t if g == 0 else acc + t
            r[dst[k]] = r[args[a[k]]] - acc
        elif o < RUN:
            _variadic(o, dst[k], a[k], b[k], c[k], n[k], args, coefs, r)
        else:
            _elementwise_run(o - RUN, dst[k], a[k], b[k], c[k], n[k], mask[k], r)


def _elementwise_run(o: int, d: int, sa: int, sb: int, sc: int, m: int, bits: int, r: Any) -> None:
    ia, ib, ic = bits & 1, (bits >> 1) & 1, (bits >> 2) & 1
    for i in range(m):
        r[d + i] = _alu(o, r[sa + i * ia], r[sb + i * ib], r[sc + i * ic])


def _by_rank(n_ranks: int, keys: Any, values: Any) -> tuple[Any, Any]:
    """Counting sort of ``values`` by ``keys`` (ranks): ``(ptr, sorted values)``, stable, O(n)."""
    ptr = np.zeros(n_ranks + 1, dtype=np.int64)
    for k in keys:
        ptr[k + 1] += 1
    for r in range(n_ranks):
        ptr[r + 1] += ptr[r]
    fill = ptr[:-1].copy()
    out = np.empty(values.shape[0], dtype=np.int64)
    for i in range(values.shape[0]):
        out[fill[keys[i]]] = values[i]
        fill[keys[i]] += 1
    return ptr, out


def _allocate(n_ranks: int, born: Any, values: Any, read: Any, reader: Any, first: int, slot: Any) -> int:
    last = np.full(slot.shape[0], -1, dtype=np.int64)
    for i in range(read.shape[0]):
        if reader[i] > last[read[i]]:
            last[read[i]] = reader[i]
    dies = np.empty(values.shape[0], dtype=np.int64)
    for i in range(values.shape[0]):
        dies[i] = max(born[i], last[values[i]])
    alloc_ptr, alloc_vals = _by_rank(n_ranks, born, values)
    free_ptr, free_vals = _by_rank(n_ranks, dies, values)
    stack = np.empty(values.shape[0], dtype=np.int64)
    top = 0
    nxt = first
    for r in range(n_ranks):
        for i in range(alloc_ptr[r], alloc_ptr[r + 1]):
            if top > 0:
                top -= 1
                s = stack[top]
            else:
                s = nxt
                nxt += 1
            slot[alloc_vals[i]] = s
        for i in range(free_ptr[r], free_ptr[r + 1]):
            stack[top] = slot[free_vals[i]]
            top += 1
    return nxt


def allocate(n_ranks: int, born: np.ndarray, values: np.ndarray, read: np.ndarray, reader: np.ndarray,
             first: int, slot: np.ndarray) -> int:
    """Slots for one-element ``values``, reused: at each op rank ``r``, the values born there (``born[i] == r``)
    take a freed slot (the last freed first, so the hot slots stay in cache) or a new one from ``first``; then
    the values whose last reader has rank ``r`` go back (``read[j]`` is read by an op of rank ``reader[j]``).
    Writes ``slot[values]``, returns the number of slots. One pass in numba (cached), O(values + reads + ranks).

    >>> slot = np.zeros(3, dtype=np.int64)   # value 1 reads 0, value 2 reads 1: each dies as the next is born
    >>> allocate(3, np.array([0, 1, 2]), np.array([0, 1, 2]), np.array([0, 1]), np.array([1, 2]), 10, slot)
    12
    >>> slot.tolist()
    [10, 11, 10]
    """
    got = _compiled.get("allocate")
    if got is None:
        import numba

        numba_by_rank = numba.njit(cache=True, nogil=True)(_by_rank)
        globals()["_by_rank"] = numba_by_rank
        got = _compiled["allocate"] = numba.njit(cache=True, nogil=True)(_allocate)
    return int(got(n_ranks, born.astype(np.int64), values.astype(np.int64), read.astype(np.int64),
                   reader.astype(np.int64), first, slot))


_compiled: dict[str, Any] = {}


INTERPRETER_COMPILE_SECONDS = 30.0
"""What numba takes to compile :func:`interpreter` from scratch (measured 25-35 s on 2 cores)."""


def interpreter_ready() -> bool:
    """True when :func:`interpreter` will not compile from scratch: compiled in this process already, or numba's
    on-disk cache holds an index for it (numba still checks that index when it loads; a stale one costs the
    compile after all, which is rare: a new numba or an edited machine.py).

    >>> isinstance(interpreter_ready(), bool)
    True
    """
    if "run" in _compiled:
        return True
    import os
    from pathlib import Path

    here = Path(__file__).resolve()
    folders = [here.parent / "__pycache__"]
    if os.environ.get("NUMBA_CACHE_DIR"):  # numba mirrors the source's absolute path under it
        folders.append(Path(os.environ["NUMBA_CACHE_DIR"]) / here.parent.relative_to(here.anchor))
    return any(any(f.glob(f"{here.stem}._run-*.nbi")) for f in folders if f.is_dir())


def interpreter() -> Any:
    """The interpreter, compiled by numba once per machine (``cache=True``: later processes load it from disk).

    >>> callable(interpreter())
    True
    """
    got = _compiled.get("run")
    if got is None:
        import numba

        opts = {"cache": True, "nogil": True, "error_model": "numpy"}
        inline = numba.njit(inline="always", error_model="numpy")
        for name in ("_maximum", "_minimum", "_remainder", "_floor_divide", "_logaddexp", "_rint", "_cbrt"):
            globals()[name] = inline(globals()[name])
        globals()["_alu"] = inline(_alu)
        globals()["_variadic"] = numba.njit(error_model="numpy", nogil=True)(_variadic)
        globals()["_elementwise_run"] = numba.njit(error_model="numpy", nogil=True)(_elementwise_run)
        got = _compiled["run"] = numba.njit(**opts)(_run)
    return got


def execute(prog: Instructions, regs: np.ndarray) -> None:
    """Run ``prog`` on the register file ``regs`` (float64, written in place); runs (``n != 1``) need no flag.

    >>> prog = Instructions.of([(OP["ADD"], 1, 0, 0, 0, 1, 0)])
    >>> r = np.array([2.0, 0.0]); execute(prog, r); r.tolist()
    [2.0, 4.0]
    """
    prog = prog.flagged()
    interpreter()(prog.code, prog.dst, prog.a, prog.b, prog.c, prog.n, prog.mask, prog.args, prog.coefs, regs)
