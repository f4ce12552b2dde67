"""The register-machine program as standalone C99: :func:`generate_c` writes a ``.c`` file and its header.

The instructions are the numba engine's (:mod:`opgraph.backends.numba.machine`; built by
:func:`~opgraph.backends.numba.assemble.assemble`), and so is every opcode's meaning: the C expression of each
elementwise opcode is the one the instruction-set tables give, NumPy's definitions of ``maximum``,
``remainder``, ``floor_divide``, ``logaddexp`` are ported into a preamble, the variadic opcodes into one C
function that mirrors the interpreter's. A program is written in one of two forms:

* **straight-line** (at most ``straight_line_max`` instructions): one statement per instruction
  (``r[5] = sin(r[3]);``), a loop for a run over a small tensor, sums of products unrolled;
* **interpreter** (bigger programs): the instruction columns as static byte strings and a small interpreter (a
  ``switch`` over the opcodes). Byte strings rather than ``{1, 2, ...}`` initialisers because the C compiler
  reads string literals about ten times faster per byte of data (gcc: 31 CPU s for 7*10^6 int32 as a list,
  0.8 s for 8 MB as octal escapes): 10^6 instructions compile in seconds, where the same program as
  straight-line code or as integer lists would take gcc minutes.

The C file includes only ``<math.h>``, ``<string.h>``, ``<stdint.h>`` and ``<float.h>``. Each entry point
(one per target set, ``targets={"get_J": [...]}``, like TensCalc's ``cmex2compute`` gateways; one called
``NAME`` otherwise) takes every input of the graph as a flat C-order float64 buffer (booleans as 0.0/1.0), in
the graph's input order, and writes its outputs the same way (see the header's comments).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", ()), name="x")
    >>> b.output(b.op("add", b.op("sin", x), b.op("multiply", x, x)))
    >>> src, hdr = generate_c(b.freeze(), name="f")
    >>> "int f_run(const double *const *inputs, double *const *outputs);" in hdr
    True
    >>> [line.strip() for line in src.splitlines() if "sin(" in line and "r[" in line]
    ['r[66] = sin(r[64]);']
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opgraph.backends.base import BackendError
from opgraph.backends.numba.assemble import Machine, assemble
from opgraph.backends.numba.machine import (
    BINARY,
    CLP,
    CMAX,
    CMAX0,
    CMAXABS,
    CMIN,
    CMIN0,
    FIRST_VARIADIC,
    GATHER,
    NEGDOT,
    NEGDOTDIV,
    RALL,
    RANY,
    RMAX,
    RMIN,
    RPROD,
    RSUBDOT,
    RSUBDOTDIV,
    RSUM,
    SSUM,
    SUMPROD,
    TERNARY,
    UNARY,
)
from opgraph.core.graph import Graph

STRAIGHT_LINE_MAX = 2000
"""Programs of at most this many instructions are written as straight-line code by default."""
CHUNK = 32
"""Straight-line code comes in functions of this many statements (see :func:`_entry_c`)."""
UNROLL_MAX = 64
"""Straight-line code writes a variadic instruction out term by term up to this many operands (a call to the
interpreter's variadic function past it)."""

EXPR: dict[int, str] = {code: expr for table in (UNARY, BINARY, TERNARY) for code, expr in table.values()}
"""Elementwise opcode -> its C expression of ``x``, ``y``, ``z`` (the instruction set's own tables)."""

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_OPERAND = re.compile(r"\b([xyz])\b")

PREAMBLE = r"""#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* NumPy's definitions (numpy/_core/src/npymath), so results equal NumPy's */
static double og_maximum(double x, double y) { return x != x ? x : (y != y ? y : (x >= y ? x : y)); }
static double og_minimum(double x, double y) { return x != x ? x : (y != y ? y : (x <= y ? x : y)); }
static double og_remainder(double x, double y) {
    double m;
    if (y == 0.0) return x != x ? fmod(x, y) : NAN;
    m = fmod(x, y);
    if (m != 0.0) { if ((y < 0.0) != (m < 0.0)) m += y; }
    else m = copysign(0.0, y);
    return m;
}
static double og_floor_divide(double x, double y) {
    double m, div, fd;
    if (y == 0.0) return x / y;
    m = fmod(x, y);
    div = (x - m) / y;
    if (m != 0.0 && (y < 0.0) != (m < 0.0)) div -= 1.0;
    if (div != 0.0) { fd = floor(div); if (div - fd > 0.5) fd += 1.0; }
    else fd = copysign(0.0, x / y);
    return fd;
}
static double og_logaddexp(double x, double y) {
    double t;
    if (x == y) return x + 0.693147180559945309417232121458176568;
    t = x - y;
    if (t > 0) return x + log1p(exp(-t));
    if (t <= 0) return y + log1p(exp(t));
    return t;
}
#if defined(__GNUC__)
#define OG_NOINLINE __attribute__((noinline))
#define OG_INLINE inline __attribute__((always_inline))
#else
#define OG_NOINLINE
#define OG_INLINE inline
#endif
/* the program's columns are little-endian byte strings: read them with memcpy (no alignment assumed) */
static int32_t og_i32(const unsigned char *p, long k) { int32_t v; memcpy(&v, p + 4 * k, 4); return v; }
static uint16_t og_u16(const unsigned char *p, long k) { uint16_t v; memcpy(&v, p + 2 * k, 2); return v; }
static double og_f64(const unsigned char *p, long k) { double v; memcpy(&v, p + 8 * k, 8); return v; }
static int og_little_endian(void) { const uint16_t one = 1; unsigned char c; memcpy(&c, &one, 1); return c == 1; }
"""

VARIADIC_C = r"""
/* one variadic instruction (mirrors opgraph.backends.numba.machine._variadic) */
static void og_variadic(int o, long d, long a, long b, long c, long n, const unsigned char *args,
                        const unsigned char *coefs, double *r) {
    long g, j, i, k, first, start;
    double acc = 0.0, p, v, t, m, x, y;
    switch (o) {
    case SUMPROD:
        k = a;
        for (g = 0; g < n; g++) {
            p = r[og_i32(args, k)];
            for (j = 1; j < b; j++) p = p * r[og_i32(args, k + j)];
            k += b;
            acc = g == 0 ? p : acc + p;
        }
        r[d] = acc;
        break;
    case SSUM:
        for (g = 0; g < n; g++) {
            v = r[og_i32(args, a + g)];
            if (og_f64(coefs, c + g) > 0) acc = g == 0 ? v : acc + v;
            else acc = g == 0 ? -v : acc - v;
        }
        r[d] = acc;
        break;
    case NEGDOT: case RSUBDOT: case NEGDOTDIV: case RSUBDOTDIV:
        first = a + (o == NEGDOT ? 0 : (o == RSUBDOTDIV ? 2 : 1));
        for (g = 0; g < n; g++) {
            t = r[og_i32(args, first + 2 * g)] * r[og_i32(args, first + 2 * g + 1)];
            acc = g == 0 ? t : acc + t;
        }
        if (o == NEGDOT) r[d] = -acc;
        else if (o == RSUBDOT) r[d] = r[og_i32(args, a)] - acc;
        else if (o == NEGDOTDIV) r[d] = -acc / r[og_i32(args, a)];
        else r[d] = (r[og_i32(args, a)] - acc) / r[og_i32(args, a + 1)];
        break;
    case GATHER:
        for (i = 0; i < n; i++) r[d + i] = r[og_i32(args, a + i)];
        break;
    case CMIN: case CMAX: case CMIN0: case CMAX0: case CMAXABS:
        start = 0;
        if (o == CMIN0 || o == CMAX0) m = 0.0;
        else if (o == CMAXABS) { m = fabs(r[og_i32(args, a)]); start = 1; }
        else { m = r[og_i32(args, a)]; start = 1; }
        for (i = start; i < n; i++) {
            v = r[og_i32(args, a + i)];
            if (o == CMIN || o == CMIN0) { if (m > v) m = v; }
            else if (o == CMAXABS) { v = fabs(v); if (m < v) m = v; }
            else if (m < v) m = v;
        }
        r[d] = m;
        break;
    case CLP:
        m = DBL_MAX;
        for (g = 0; g < n; g++) {
            x = r[og_i32(args, a + 2 * g)];
            y = r[og_i32(args, a + 2 * g + 1)];
            t = -x / y;
            if (y < 0 && m > t) m = t;
        }
        r[d] = m;
        break;
    case RSUM: case RPROD:
        acc = o == RSUM ? 0.0 : 1.0;
        for (i = 0; i < n; i++) acc = o == RSUM ? acc + r[og_i32(args, a + i)] : acc * r[og_i32(args, a + i)];
        r[d] = acc;
        break;
    case RMAX: case RMIN:
        m = r[og_i32(args, a)];
        for (i = 1; i < n; i++) {
            v = r[og_i32(args, a + i)];
            m = o == RMAX ? og_maximum(m, v) : og_minimum(m, v);
        }
        r[d] = m;
        break;
    case RANY: case RALL:
        m = o == RANY ? 0.0 : 1.0;
        for (i = 0; i < n; i++) {
            v = r[og_i32(args, a + i)];
            if (o == RANY && v != 0) m = 1.0;
            if (o == RALL && v == 0) m = 0.0;
        }
        r[d] = m;
        break;
    default:
        r[d] = NAN;
    }
}
"""

EXEC_TEMPLATE = r"""
/* the interpreter (mirrors opgraph.backends.numba.machine._run) */
static void @FNAME(@PARAMS) {
    long k, i, m, d, sa, sb, sc, ia, ib, ic;
    int o, bits;
    for (k = 0; k < @COUNT; k++) {
        o = @CODE;
        m = @N;
        d = @DST;
        sa = @A;
        sb = @B;
        sc = @C;
        if (o >= FIRST_VARIADIC) {
            og_variadic(o, d, sa, sb, sc, m, @ARGS, @COEFS, r);
        } else if (m == 1) {
            r[d] = og_alu(o, r[sa], r[sb], r[sc]);
        } else {
            bits = @MASK;
            ia = bits & 1; ib = (bits >> 1) & 1; ic = (bits >> 2) & 1;
            for (i = 0; i < m; i++) r[d + i] = og_alu(o, r[sa + i * ia], r[sb + i * ib], r[sc + i * ic]);
        }
    }
}
"""
"""The interpreter's loop; ``@NAME`` placeholders say how it reads each column (:func:`_exec_c`)."""


def _exec_c(fname: str, params: str, fill: Mapping[str, str]) -> str:
    text = EXEC_TEMPLATE.replace("@FNAME", fname).replace("@PARAMS", params)
    for key, expr in fill.items():
        text = text.replace(f"@{key}", expr)
    return text


EXEC_C = _exec_c(
    "og_exec", "long count, const unsigned char *code, const unsigned char *dst, const unsigned char *a,\n"
    "                    const unsigned char *b, const unsigned char *c, const unsigned char *n,\n"
    "                    const unsigned char *mask, const unsigned char *args, const unsigned char *coefs, double *r",
    {"COUNT": "count", "CODE": "code[k]", "MASK": "mask[k]", "ARGS": "args", "COEFS": "coefs",
     **{col.upper(): f"og_i32({col}, k)" for col in ("n", "dst", "a", "b", "c")}})
"""The interpreter of :func:`interpreter_c`: the program's columns come as arguments (int32 in memory)."""

_VARIADIC_NAMES = {"SUMPROD": SUMPROD, "SSUM": SSUM, "NEGDOT": NEGDOT, "RSUBDOT": RSUBDOT, "NEGDOTDIV": NEGDOTDIV,
                   "RSUBDOTDIV": RSUBDOTDIV, "CMIN": CMIN, "CMAX": CMAX, "CMIN0": CMIN0, "CMAX0": CMAX0,
                   "CMAXABS": CMAXABS, "CLP": CLP, "GATHER": GATHER, "RSUM": RSUM, "RPROD": RPROD, "RMAX": RMAX,
                   "RMIN": RMIN, "RANY": RANY, "RALL": RALL}


@dataclass(frozen=True)
class Entry:
    """One entry point of a C file: its prefix (``NAME`` or ``NAME_target``) and the machine it runs."""

    prefix: str
    machine: Machine

    @property
    def work_size(self) -> int:
        """Doubles of the register file (at least 1)."""
        return max(int(self.machine.n_slots), 1)


def _check_ident(what: str, name: str) -> None:
    if not _IDENT.match(name):
        raise BackendError(f"{what} {name!r} is not a C identifier (letters, digits, _; not first a digit)")


def machines_for(graph: Graph, targets: Mapping[str, Sequence[int]] | None = None,
                 input_shapes: Sequence[tuple[int, ...] | None] | None = None) -> dict[str | None, Machine]:
    """One assembled program per target set (``None``: the graph's outputs), each computing only what its
    targets need; every program takes all the graph's inputs.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", ()), name="x")
    >>> y = b.op("exp", x); z = b.op("sin", x); b.output(y, z)
    >>> ms = machines_for(b.freeze(), {"get_y": [y.id]})
    >>> list(ms), len(ms["get_y"].program), len(ms["get_y"].inputs)
    (['get_y'], 1, 1)
    """
    from opgraph.backends.numba import BACKEND as NUMBA
    from opgraph.passes.dce import dce

    if targets is None:
        return {None: assemble(graph, input_shapes, rules=NUMBA.rules)}
    out: dict[str | None, Machine] = {}
    no_updates = np.zeros((0, 2), dtype=graph.updates.dtype)
    for key, values in targets.items():
        sub = graph.replace(outputs=np.asarray([int(v) for v in values], dtype=graph.outputs.dtype),
                            updates=no_updates)
        out[key] = assemble(dce(sub).graph, input_shapes, rules=NUMBA.rules)
    return out


def generate_c(graph: Graph, *, name: str = "opgraph_program",
               input_shapes: Sequence[tuple[int, ...] | None] | None = None,
               straight_line_max: int = STRAIGHT_LINE_MAX,
               targets: Mapping[str, Sequence[int]] | None = None) -> tuple[str, str]:
    """``graph`` as standalone C99: ``(source_c, header_h)`` (see the module doc).

    ``targets`` maps entry names to value ids: one entry point ``NAME_<entry>_run`` per target set (None: one,
    ``NAME_run``, computing the graph's outputs). ``input_shapes`` give inputs of unknown shape one (TensCalc's
    files), in the graph's input order. Raises :class:`~opgraph.backends.base.BackendError` for an op the
    register machine has no rule for, or a name that is no C identifier.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (3,)), name="x")
    >>> y = b.op("exp", x); b.output(y, b.op("sum", y))
    >>> src, hdr = generate_c(b.freeze(), name="g", targets={"get_y": [y.id]})
    >>> [ln for ln in hdr.splitlines() if ln.startswith("#define g_get_y_N")]
    ['#define g_get_y_N_OUTPUTS 1']
    """
    _check_ident("the C name", name)
    if targets is not None and not targets:
        raise BackendError("targets={} asks for no entry point: give target sets, or None for the outputs")
    for key in targets or {}:
        _check_ident("the target set's name", key)
    machines = machines_for(graph, targets, input_shapes)
    entries = [Entry(name if key is None else f"{name}_{key}", m) for key, m in machines.items()]
    return write_c(name, entries, straight_line_max)


def write_c(name: str, entries: Sequence[Entry], straight_line_max: int = STRAIGHT_LINE_MAX) -> tuple[str, str]:
    """The C file and header for assembled programs (:func:`generate_c` after assembly; the ``c`` backend
    calls this on the program it assembled).

    >>> from opgraph.backends.numba.machine import Instructions, OP
    >>> prog = Instructions.of([(OP["MUL"], 2, 0, 1, 0, 1, 0)])
    >>> m = Machine(prog, 3, np.zeros(0), [(0, (), np.dtype("f8")), (1, (), np.dtype("f8"))],
    ...             [(2, (), np.dtype("f8"))])
    >>> src, hdr = write_c("m", [Entry("m", m)])
    >>> "r[2] = r[0] * r[1];" in src
    True
    """
    _check_ident("the C name", name)
    first = entries[0].machine
    in_sizes = [int(np.prod(shape)) for _, shape, _ in first.inputs]
    interp = [e for e in entries if len(e.machine.program) > straight_line_max]
    parts = [f"/* {name}.c: written by opgraph (opgraph.backends.c.codegen); standalone C99, link with -lm */\n",
             PREAMBLE]
    parts.append("".join(f"#define {k} {v}\n" for k, v in _VARIADIC_NAMES.items()))
    parts.append(f"#define FIRST_VARIADIC {FIRST_VARIADIC}\n")
    parts.append(VARIADIC_C)
    if interp:
        parts.append(_alu_c())
    parts.append(f"\nconst int {name}_n_inputs = {len(in_sizes)};\n")
    parts.append(f"const long {name}_input_sizes[] = {{{_ints(in_sizes)}}};\n")
    for e in entries:
        parts.append(_entry_c(e, len(e.machine.program) > straight_line_max))
    return "".join(parts), _header(name, entries, in_sizes)


def interpreter_c() -> str:
    """A C file holding only the interpreter, whose program comes at run time: ``int og_run(long count,
    code, dst, a, b, c, n, mask, args, coefs, double *r)`` over the columns of
    :class:`~opgraph.backends.numba.machine.Instructions` in memory (native byte order; uint8 ``code`` and
    ``mask``, int32 ``dst``, ``a``, ``b``, ``c``, ``n``, ``args``, float64 ``coefs``). The same text for every
    program, so it is compiled once (``backend="c"`` with ``embed=False``: the C counterpart of the numba
    engine's one interpreter).

    >>> "int og_run(long count" in interpreter_c()
    True
    """
    return "".join([
        "/* og_interpreter.c: written by opgraph (opgraph.backends.c.codegen); the program comes at run time */\n",
        PREAMBLE, "".join(f"#define {k} {v}\n" for k, v in _VARIADIC_NAMES.items()),
        f"#define FIRST_VARIADIC {FIRST_VARIADIC}\n", VARIADIC_C, _alu_c(), EXEC_C,
        "\nint og_run(long count, const unsigned char *code, const unsigned char *dst, const unsigned char *a,\n"
        "           const unsigned char *b, const unsigned char *c, const unsigned char *n,\n"
        "           const unsigned char *mask, const unsigned char *args, const unsigned char *coefs, double *r) {\n"
        "    og_exec(count, code, dst, a, b, c, n, mask, args, coefs, r);\n    return 0;\n}\n"])


def _ints(values: Sequence[int]) -> str:
    return ", ".join(str(int(v)) for v in values) if len(values) else "0"


def _alu_c() -> str:
    cases = "".join(f"    case {code}: return {expr};\n" for code, expr in sorted(EXPR.items()))
    return ("\n/* any elementwise opcode (the instruction set's C expressions) */\n"
            "static OG_INLINE double og_alu(int o, double x, double y, double z) {\n"
            "    (void)y; (void)z;\n    switch (o) {\n" + cases + "    }\n    return NAN;\n}\n")


_ESC_TEXT = [b"\\%o" % i for i in range(256)]
_ESCAPES = np.array([t.ljust(4) for t in _ESC_TEXT], dtype="S4").view(np.uint8).reshape(256, 4)
_ESC_LEN = np.array([len(t) for t in _ESC_TEXT], dtype=np.uint8)
_ESC32 = _ESCAPES.copy().view(np.uint32).ravel()
_KEEP32 = (np.arange(4) < _ESC_LEN[:, None].astype(np.int64)).astype(np.uint8).view(np.uint32).ravel()
_LINE = 64
"""Bytes per line of a byte-string literal."""
_BREAK = np.frombuffer(b'"\n "', dtype=np.uint8)


def _c_bytes(data: bytes) -> str:
    """``data`` as the lines of a C string literal, every byte an octal escape of as few digits as it needs
    (``\\0`` for a zero: an escape ends at the next backslash), vectorised: O(n) NumPy.

    >>> print(_c_bytes(bytes([0, 65, 255])))
    "\\0\\101\\377"
    """
    if not data:
        return '""'
    raw = np.frombuffer(data, dtype=np.uint8)
    lens = _ESC_LEN[raw]
    # one 4-byte gather per byte (the escape, left-aligned, and which of its 4 characters to keep)
    text = _ESC32.take(raw).view(np.uint8)[_KEEP32.take(raw).view(np.bool_)]
    # a line break (close the literal, open the next) before every _LINE-th byte
    lines = (len(raw) - 1) // _LINE
    ends = np.cumsum(lens[:lines * _LINE].reshape(lines, _LINE).sum(axis=1, dtype=np.int64))
    text = np.insert(text, np.repeat(ends, len(_BREAK)), np.tile(_BREAK, len(ends)))
    return '"' + text.tobytes().decode("ascii") + '"'


def _blob(var: str, arr: np.ndarray, dtype: str) -> str:
    data = np.ascontiguousarray(arr, dtype=dtype).tobytes()
    return f"static const unsigned char {var}[{len(data) + 1}] =\n    {_c_bytes(data)};\n"


def _entry_c(e: Entry, interpreted: bool) -> str:
    m, p = e.machine, e.prefix
    prog = m.program.plain()
    out_sizes = [int(np.prod(shape)) for _, shape, _ in m.outputs]
    parts = [f"\n/* ---- entry {p}: {len(prog)} instructions, {m.n_slots} slots, "
             f"{'interpreted' if interpreted else 'straight-line'} */\n"]
    parts.append(f"const int {p}_n_outputs = {len(out_sizes)};\n")
    parts.append(f"const long {p}_output_sizes[] = {{{_ints(out_sizes)}}};\n")
    parts.append(f"const long {p}_input_slots[] = {{{_ints([s for s, _, _ in m.inputs])}}};\n")
    parts.append(f"const long {p}_output_slots[] = {{{_ints([s for s, _, _ in m.outputs])}}};\n")
    parts.append(_blob(f"{p}_init", m.init, "<f8"))
    variadic = prog.code >= FIRST_VARIADIC
    needs_lists = interpreted or bool(variadic.any())
    if needs_lists:
        parts.append(_blob(f"{p}_args", prog.args, "<i4"))
        parts.append(_blob(f"{p}_coefs", prog.coefs, "<f8"))
    if interpreted:
        parts.append(_blob(f"{p}_code", prog.code, "u1"))
        parts.append(_blob(f"{p}_mask", prog.mask, "u1"))
        fill = {"COUNT": f"{len(prog)}L", "CODE": f"{p}_code[k]", "MASK": f"{p}_mask[k]", "ARGS": f"{p}_args",
                "COEFS": f"{p}_coefs"}
        for col in ("dst", "a", "b", "c", "n"):
            # each column as narrow as its values allow (the compiler's time is the text's length)
            values = getattr(prog, col)
            top = int(values.max()) if len(values) else 0
            dtype, read = ("u1", f"{p}_{col}[k]") if top < 1 << 8 else \
                ("<u2", f"og_u16({p}_{col}, k)") if top < 1 << 16 else ("<i4", f"og_i32({p}_{col}, k)")
            parts.append(_blob(f"{p}_{col}", values, dtype))
            fill[col.upper()] = read
        parts.append(_exec_c(f"{p}_exec", "double *r", fill))
        body = f"    if (!og_little_endian()) return -1;\n    {p}_exec(r);\n"
    else:
        # pieces of CHUNK statements, each a function of its own: gcc's alias analysis and dead-store pass
        # take time quadratic in the stores of one function (2000 statements: 4.6 CPU s in one, 1.5 s in pieces)
        lines = _statements(prog, p)
        calls = []
        for k in range(0, len(lines), CHUNK):
            parts.append(f"\nOG_NOINLINE static void {p}_part{k // CHUNK}(double *r) {{\n    long i;\n    (void)i;\n"
                         f"{''.join(lines[k:k + CHUNK])}}}\n")
            calls.append(f"    {p}_part{k // CHUNK}(r);\n")
        body = ("    if (!og_little_endian()) return -1;\n" if needs_lists else "") + "".join(calls)
    parts.append(f"\nint {p}_eval(double *work) {{\n    double *r = work;\n    (void)r;\n"
                 f"{body}    return 0;\n}}\n")
    n_init = len(m.init)
    parts.append(f"\nvoid {p}_init_ws(double *work) {{\n"
                 f"    memcpy(work, {p}_init, {n_init} * sizeof(double));\n}}\n")
    copy_in = "".join(
        f"    memcpy(work + {s}, inputs[{i}], {int(np.prod(shape))} * sizeof(double));\n"
        for i, (s, shape, _) in enumerate(m.inputs) if int(np.prod(shape)))
    copy_out = "".join(
        f"    memcpy(outputs[{i}], work + {s}, {int(np.prod(shape))} * sizeof(double));\n"
        for i, (s, shape, _) in enumerate(m.outputs) if int(np.prod(shape)))
    parts.append(f"\nint {p}_run_ws(const double *const *inputs, double *const *outputs, double *work) {{\n"
                 f"    int rc;\n    (void)inputs; (void)outputs;\n{copy_in}"
                 f"    rc = {p}_eval(work);\n    if (rc) return rc;\n{copy_out}    return 0;\n}}\n")
    parts.append(f"\nstatic double {p}_regs[{e.work_size}];\nstatic int {p}_ready = 0;\n"
                 f"\nint {p}_run(const double *const *inputs, double *const *outputs) {{\n"
                 f"    if (!{p}_ready) {{ {p}_init_ws({p}_regs); {p}_ready = 1; }}\n"
                 f"    return {p}_run_ws(inputs, outputs, {p}_regs);\n}}\n")
    return "".join(parts)


def _statements(prog: Any, prefix: str) -> list[str]:
    """Straight-line code: one statement (or loop) per instruction."""
    args = prog.args.tolist()
    coefs = prog.coefs.tolist()
    rows = zip(prog.code.tolist(), prog.dst.tolist(), prog.a.tolist(), prog.b.tolist(), prog.c.tolist(),
               prog.n.tolist(), prog.mask.tolist(), strict=True)
    out = []
    for o, d, a, b, c, n, mask in rows:
        if o < FIRST_VARIADIC:
            if n == 1:
                ops = {"x": f"r[{a}]", "y": f"r[{b}]", "z": f"r[{c}]"}
                out.append(f"    r[{d}] = {_OPERAND.sub(lambda mt: ops[mt.group(1)], EXPR[o])};\n")
            else:
                ops = {k: f"r[{s} + i]" if mask >> bit & 1 else f"r[{s}]"
                       for bit, (k, s) in enumerate((("x", a), ("y", b), ("z", c)))}
                out.append(f"    for (i = 0; i < {n}; i++) r[{d} + i] = "
                           f"{_OPERAND.sub(lambda mt: ops[mt.group(1)], EXPR[o])};\n")
            continue
        out.append(_variadic_statement(o, d, a, b, c, n, args, coefs, prefix))
    return out


def _variadic_statement(o: int, d: int, a: int, b: int, c: int, n: int, args: list[int], coefs: list[float],
                        prefix: str) -> str:
    """One variadic instruction written out term by term (the interpreter's order of operations), or a call."""
    def reg(k: int) -> str:
        return f"r[{args[k]}]"

    if o == SUMPROD and n * b <= UNROLL_MAX:
        terms = [" * ".join(reg(a + g * b + j) for j in range(b)) for g in range(n)]
        return f"    r[{d}] = {' + '.join(terms) if terms else '0.0'};\n"
    if o == SSUM and n <= UNROLL_MAX:
        text = ""
        for g in range(n):
            plus = coefs[c + g] > 0
            text += (reg(a + g) if plus else f"-{reg(a + g)}") if g == 0 else \
                (f" + {reg(a + g)}" if plus else f" - {reg(a + g)}")
        return f"    r[{d}] = {text or '0.0'};\n"
    if o in (NEGDOT, RSUBDOT, NEGDOTDIV, RSUBDOTDIV) and n <= UNROLL_MAX:
        first = a + (0 if o == NEGDOT else (2 if o == RSUBDOTDIV else 1))
        acc = " + ".join(f"{reg(first + 2 * g)} * {reg(first + 2 * g + 1)}" for g in range(n)) or "0.0"
        expr = {NEGDOT: f"-({acc})", RSUBDOT: f"{reg(a)} - ({acc})", NEGDOTDIV: f"-({acc}) / {reg(a)}",
                RSUBDOTDIV: f"({reg(a)} - ({acc})) / {reg(a + 1)}"}[o]
        return f"    r[{d}] = {expr};\n"
    if o == GATHER and n <= UNROLL_MAX:
        return "".join(f"    r[{d + i}] = {reg(a + i)};\n" for i in range(n))
    return f"    og_variadic({o}, {d}L, {a}L, {b}L, {c}L, {n}L, {prefix}_args, {prefix}_coefs, r);\n"


def _header(name: str, entries: Sequence[Entry], in_sizes: Sequence[int]) -> str:
    guard = f"{name.upper()}_H"
    lines = [f"/* {name}.h: written by opgraph (opgraph.backends.c.codegen) */",
             f"#ifndef {guard}", f"#define {guard}", "", "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
             "/* Every entry takes all the graph's inputs, in its input order, as flat C-order float64 buffers",
             "   (booleans as 0.0/1.0), and writes its outputs the same way; it returns 0 (-1: the machine is",
             "   not little-endian). NAME_run uses a static register file: it is NOT thread-safe. NAME_run_ws",
             "   runs on a caller's register file of NAME_WORK_SIZE doubles prepared once by NAME_init_ws",
             "   (one per thread, and per entry: each entry has its own layout). NAME_eval runs the program on",
             "   such a file whose NAME_input_slots hold the inputs; results are at NAME_output_slots. */",
             f"#define {name}_N_INPUTS {len(in_sizes)}",
             f"extern const int {name}_n_inputs;",
             f"extern const long {name}_input_sizes[];  /* elements of each input */"]
    for e in entries:
        p = e.prefix
        n_out = len(e.machine.outputs)
        lines += ["", f"/* entry {p}: {len(e.machine.program)} instructions */",
                  f"#define {p}_WORK_SIZE {e.work_size}", f"#define {p}_N_OUTPUTS {n_out}",
                  f"extern const int {p}_n_outputs;",
                  f"extern const long {p}_output_sizes[];  /* elements of each output */",
                  f"extern const long {p}_input_slots[];",
                  f"extern const long {p}_output_slots[];",
                  f"int {p}_run(const double *const *inputs, double *const *outputs);",
                  f"int {p}_run_ws(const double *const *inputs, double *const *outputs, double *work);",
                  f"void {p}_init_ws(double *work);",
                  f"int {p}_eval(double *work);"]
    if len(entries) > 1 or entries[0].prefix != name:
        lines += ["", f"#define {name}_WORK_SIZE {max(e.work_size for e in entries)}  /* the largest entry's */"]
    lines += ["", "#ifdef __cplusplus", "}", "#endif", f"#endif /* {guard} */", ""]
    return "\n".join(lines)
