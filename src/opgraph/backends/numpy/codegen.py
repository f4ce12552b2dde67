"""A compiled program written as one straight-line Python function (see :class:`Codegen`)."""

from __future__ import annotations

import keyword
import linecache
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from opgraph.backends.numpy.buffers import aligned_empty
from opgraph.memory.plan import PLANNED

if TYPE_CHECKING:
    from opgraph.backends.numpy.arena import CompiledGraph

SMALL_OUTPUT_BIN = 1 << 16
"""An output buffer of at most this many bytes that the plan shares between several values (values that die
before the output is computed) is allocated per value instead: a few small arrays cost less per call than
views of one buffer."""


def copy(a: Any) -> np.ndarray:
    """A fresh copy of ``a`` (what a generated program returns for an output it does not own).

    >>> copy([1.0])
    array([1.])
    """
    return np.array(a, copy=True)


def donation_ok(donated: tuple[Any, ...], others: tuple[Any, ...]) -> bool:
    """Whether a call's donated arrays may hold its results: distinct arrays that own their memory, C-contiguous
    and writeable, none of them the base of another argument (a view the program would read after the donated
    array is overwritten). Checked once per call; where it fails, the results get fresh buffers.

    >>> a, b = np.zeros(2), np.zeros(2)
    >>> donation_ok((a, b), ()), donation_ok((a, a), ()), donation_ok((a,), (a[:1],)), donation_ok((a[:1],), ())
    (True, False, False, False)
    """
    ids = set()
    for a in donated:
        if type(a) is not np.ndarray or a.base is not None or not (a.flags.c_contiguous and a.flags.writeable):
            return False
        ids.add(id(a))
    if len(ids) < len(donated):
        return False
    return not any(id(getattr(x, "base", None)) in ids for x in others)


def own(x: Any, ins: tuple[Any, ...]) -> np.ndarray:
    """A result the kernel allocated, copied if it is a view of one of the op's inputs (planned memory).

    >>> a = np.zeros(4)
    >>> own(a[:2], (a,)).flags.owndata, own(a, ()) is a
    (True, True)
    """
    x = np.asarray(x)
    if not x.flags.owndata and any(isinstance(i, np.ndarray) and np.shares_memory(x, i) for i in ins):
        x = x.copy()
    return x


def failing_op(exc: BaseException, fn: Callable[..., Any]) -> int | None:
    """The op whose line of the generated function ``fn`` raised ``exc`` (None if it was not raised there).

    >>> def fn(): pass
    >>> fn.line_op = [-1]
    >>> failing_op(ValueError(), fn) is None
    True
    """
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code is fn.__code__:
            line = tb.tb_lineno
        tb = tb.tb_next
    ops: list[int] = fn.line_op  # type: ignore[attr-defined]
    return ops[line - 1] if line is not None and 0 < line <= len(ops) and ops[line - 1] >= 0 else None


KEYWORD_OUT: frozenset[np.ufunc] = frozenset({np.maximum, np.minimum})
"""Ufuncs whose ``out`` the generated code passes by keyword: NumPy deprecates a third positional argument
to these (it reads like a third operand). Other ufuncs take ``out`` positionally, which NumPy documents
and which parses faster on small arrays."""

GENERATED_MODULE = "opgraph.backends.numpy.generated"
"""The ``__name__`` generated programs run under (no such module exists): a warning raised by their code is
attributed to opgraph, so the ``error::DeprecationWarning:opgraph.*`` filter of the tests covers them."""


class Codegen:
    """Writes a compiled program as one straight-line Python function, as torch.fx emits code.

    A kernel may offer ``kernel.specialize(in_types, out_types, attrs)``, returning ``(call, before, after)``
    where ``call(*inputs, *before, out, *after)`` (all positional: keywords cost a NumPy call a quarter of
    its time on small arrays) writes the op's result into ``out`` for inputs of exactly these types, e.g.
    ``np.add.reduce(x, axis, None, out, keepdims)``; or None. The generated line then calls it directly. As
    the hook runs once per op when the program is built, a kernel may also use it to prepare (load numba's
    loops for inputs this large) and return None.

    Everything that is the same on every call is bound once, as a global of the function: each kernel
    (a NumPy ufunc itself where the op's kernel is a plain ufunc), its attributes, the arena views, the
    constants, the state buffers of one parity, and the results of view ops on any of these (a reshape
    of an arena buffer is computed here, not per call). What remains per call is one line per kernel:
    ``k3(v1, s7, out=s9)``. Locals are the fed inputs, the fresh output buffers and values the kernels
    allocate; they die when the function returns. Line numbers map back to ops for error messages.
    """

    def __init__(self, cg: CompiledGraph, parity: int) -> None:
        self.cg = cg
        self.parity = parity
        self.ns: dict[str, Any] = {"_copyto": np.copyto, "_empty": np.empty, "_aligned_empty": aligned_empty,
                                   "_asarray": np.asarray, "_own": own, "_copy": copy, "_tuple": tuple,
                                   "_zip": zip}
        self.static: dict[int, Any] = {}
        self.names: dict[int, str] = {}
        self.lines: list[str] = []
        self.line_op: list[int] = [-1]  # line 1 is the def
        self._bound: dict[int, str] = {}

    def bind(self, prefix: str, obj: Any) -> str:
        """A global of the generated function holding ``obj`` (one per object)."""
        name = self._bound.get(id(obj))
        if name is None:
            name = self._bound[id(obj)] = f"{prefix}{len(self.ns)}"
            self.ns[name] = obj
        return name

    def emit(self, line: str, op: int = -1) -> None:
        self.lines.append("    " + line)
        self.line_op.append(op)

    def ref(self, v: int) -> str:
        return self.names[v]

    def set_static(self, v: int, arr: Any) -> None:
        self.static[v] = arr
        self.names[v] = self.bind("s", arr)

    def kwargs(self, attrs: Mapping[str, Any]) -> str:
        parts = []
        for k, val in attrs.items():
            if k.isidentifier() and not keyword.iskeyword(k):
                parts.append(f", {k}={self.bind('a', val)}")
            else:  # not a Python name: passed through a bound dict
                return f", **{self.bind('a', dict(attrs))}"
        return "".join(parts)

    def build(self) -> Callable[..., Any]:
        cg, p = self.cg, self.cg.plan
        for v, s in enumerate(cg._slots):
            if s is not None:
                self.set_static(v, s)
        for v, view in cg._state_views[self.parity].items():
            self.set_static(v, view)
        params = []
        other = cg._state_views[self.parity ^ 1]
        for v in cg._needed_inputs:
            self.static.pop(v, None)
            self.names[v] = f"v{v}"
            src = cg._carried.get(v)
            # a carried input defaults to the buffer the previous call (of the other parity) wrote
            params.append(f"v{v}" if src is None else f"v{v}={self.bind('s', other[src])}")
        donors = cg.donors()
        if donors:  # results written over donated arrays (opgraph.jit's donate_argnums), where the call allows it
            donated = sorted(set(donors.values()))
            others = [v for v in cg._needed_inputs if v not in donated]
            self.emit(f"_dn = {self.bind('f', donation_ok)}({tuple_expr([f'v{v}' for v in donated])}, "
                      f"{tuple_expr([f'v{v}' for v in others])})")
        for b in cg._output_bins:
            entries = cg._bin_values.get(b, [])
            # an allocation's line maps to the op making the value, which an out-of-memory error names
            producer = cg.graph.value_producer
            if len(entries) == 1 and entries[0][1] == 0:
                v, _off, _nb, dt, shape = entries[0]
                fresh = f"_empty({tuple(shape)!r}, {self.bind('d', dt)})"
                donor = donors.get(v)
                self.emit(f"v{v} = v{donor} if _dn else {fresh}" if donor is not None else f"v{v} = {fresh}",
                          int(producer[v]))
                self.names[v] = f"v{v}"
                continue
            small = p.bins[b].size <= SMALL_OUTPUT_BIN
            if not small:
                self.emit(f"_b{b} = _aligned_empty({p.bins[b].size})", int(producer[entries[0][0]]) if entries else -1)
            same: dict[tuple[int, np.dtype, tuple[int, ...]], str] = {}  # an in-place chain shares one view
            for v, off, nb, dt, shape in entries:
                name = same.get((off, dt, tuple(shape)))
                if name is None:
                    name = same[off, dt, tuple(shape)] = f"v{v}"
                    if small:  # its own small array: cheaper than a view of a shared buffer, and always safe
                        self.emit(f"v{v} = _empty({tuple(shape)!r}, {self.bind('d', dt)})", int(producer[v]))
                    else:
                        self.emit(f"v{v} = _b{b}[{off}:{off + nb}].view({self.bind('d', dt)})"
                                  f".reshape({tuple(shape)!r})", int(producer[v]))
                self.names[v] = name
        for fn, ins, outs, attrs, op, mode in cg.program:
            self.step(fn, ins, outs, attrs, op, mode)
        outputs = [self.ref(v) if v in cg._own_output else f"_copy({self.ref(v)})" for v in cg.outputs]
        sources = [self.ref(src) for src, _dst in cg.updates]
        self.emit(f"return {tuple_expr(outputs)}, {tuple_expr(sources)}")
        src = f"def _program({', '.join(params)}):\n" + "\n".join(self.lines) + "\n"
        filename = f"<opgraph program {id(cg):x}.{self.parity}>"
        code = compile(src, filename, "exec")
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # tracebacks show the line
        weakref.finalize(cg, linecache.cache.pop, filename, None)
        # The source holds only names made here, integers and shapes; every value from the graph
        # (attributes, constants, dtypes) is bound as a global, never written into the text.
        self.ns["__name__"] = GENERATED_MODULE  # set last: the names bound above are numbered by len(self.ns)
        exec(code, self.ns)
        fn = self.ns["_program"]
        fn.line_op = self.line_op
        fn.source = src
        return fn  # type: ignore[no-any-return]

    def step(self, fn: Callable[..., Any], ins: tuple[int, ...], outs: tuple[int, ...], attrs: dict[str, Any],
             op: int, mode: int) -> None:
        cg = self.cg
        args = ", ".join(self.ref(i) for i in ins)
        direct = getattr(fn, "ufunc", None)
        if mode == 1 and isinstance(direct, np.ufunc) and not attrs:
            # a ufunc given out always writes into it; out as a positional argument is parsed faster
            out = f"out={self.ref(outs[0])}" if direct in KEYWORD_OUT else self.ref(outs[0])
            self.emit(f"{self.bind('u', direct)}({args}, {out})", op)
            return
        specialize = getattr(fn, "specialize", None)
        if mode == 1 and specialize is not None:
            g = cg.graph
            got = specialize([g.type_of(i) for i in ins], [g.type_of(v) for v in outs], attrs)
            if got is not None:  # a call that writes into out, for exactly these types
                call, before, after = got
                parts = [args, *(self.bind("a", x) for x in before), self.ref(outs[0]),
                         *(self.bind("a", x) for x in after)]
                self.emit(f"{self.bind('r', call)}({', '.join(parts)})", op)
                return
        k, kw = self.bind("k", fn), self.kwargs(attrs)
        if mode == 1:
            o = self.ref(outs[0])
            self.emit(f"_r = {k}({args}, out={o}{kw})", op)
            self.emit(f"if _r is not {o}: _copyto({o}, _r, casting='unsafe')", op)
        elif mode == 4:
            if all(i in self.static for i in ins) and self.precompute(fn, ins, outs, attrs):
                return
            for v in outs:
                self.names[v] = f"v{v}"
            target = f"v{outs[0]}" if len(outs) == 1 else ", ".join(f"v{v}" for v in outs) + ","
            self.emit(f"{target} = {k}({args}{kw})", op)
        elif mode == 3:
            o, x = self.ref(outs[0]), self.ref(ins[0])
            rest = "".join(f", {self.ref(i)}" for i in ins[1:])
            self.emit(f"for _sl in {self.bind('c', cg._chunks[op])}:", op)
            self.emit(f"    _p = {o}[_sl]; _r = {k}({x}[_sl]{rest}, out=_p{kw})", op)
            self.emit("    if _r is not _p: _copyto(_p, _r, casting='unsafe')", op)
        elif mode == 2:
            self.emit(f"_os = {tuple_expr([self.ref(v) for v in outs])}; _r = {k}({args}, out=_os{kw})", op)
            self.emit("for _o, _x in _zip(_os, _r):", op)
            self.emit("    if _x is not _o: _copyto(_o, _x, casting='unsafe')", op)
        else:
            self.emit(f"_r = {k}({args}{kw})", op)
            results = ["_r"]
            if len(outs) != 1:
                self.emit("_r = _tuple(_r)", op)
                results = [f"_r[{i}]" for i in range(len(outs))]
            for v, x in zip(outs, results, strict=True):
                if cg.plan.kind[v] == PLANNED:
                    self.emit(f"_copyto({self.ref(v)}, _asarray({x}), casting='unsafe')", op)
                else:
                    self.names[v] = f"v{v}"
                    self.emit(f"v{v} = _own({x}, {tuple_expr([self.ref(i) for i in ins])})", op)

    def precompute(self, fn: Callable[..., Any], ins: tuple[int, ...], outs: tuple[int, ...],
                   attrs: dict[str, Any]) -> bool:
        """Compute a view op on fixed buffers once; False where the kernel copies (a view must stay a view)."""
        srcs = [self.static[i] for i in ins]
        try:
            r = fn(*srcs, **attrs)
        except Exception:  # run it per call instead, where the error names the op
            return False
        rs = (r,) if len(outs) == 1 else tuple(r)
        views = [a for a in srcs if isinstance(a, np.ndarray)]
        if not all(isinstance(x, np.ndarray) and any(np.may_share_memory(x, a) for a in views) for x in rs):
            return False
        for v, x in zip(outs, rs, strict=True):
            self.set_static(v, x)
        return True


def tuple_expr(items: Sequence[str]) -> str:
    """Python source of a tuple of the expressions ``items``.

    >>> tuple_expr(["a"]), tuple_expr([])
    ('(a,)', '()')
    """
    return "(" + "".join(f"{x}, " for x in items).rstrip(" ") + ")" if items else "()"
