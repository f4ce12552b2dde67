"""The numba engine: a register machine for fine-grained graphs (many small ops), CasADi's SX virtual machine
as the model.

A graph of scalars and small tensors becomes one flat program (:mod:`~opgraph.backends.numba.assemble`: every
value a run of slots in one float64 register file, every op an instruction or none) that one interpreter runs
(:mod:`~opgraph.backends.numba.machine`), compiled by numba once per machine and cached on disk, never once per
graph: compiling a graph is O(n) NumPy work, so graphs of 10^6 ops compile in seconds. It runs float64 and bool
values (booleans as 0.0 and 1.0); each rule lives in the module named after its op's family. The same
instructions become standalone C (:mod:`opgraph.backends.c`, ``backend="c"``).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", ()), name="x")
    >>> b.output(b.op("add", b.op("sin", x), b.op("multiply", x, x)))
    >>> p = opgraph.compile(b.freeze(), backend="numba")
    >>> bool(float(p(np.float64(2.0))[0]) == np.sin(2.0) + 4.0)
    True
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from opgraph.backends.base import Backend, BackendError, Executable, OpInfo
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST, get_op
from opgraph.core.types import TensorType

SMALL = 1 << 16
"""Largest value (elements) the register machine claims for ops that are not elementwise."""

TENSCALC_UNTYPED = "tenscalc"
"""The family whose values carry no shape (TensCalc's files): the engine gives them theirs from the feeds."""


class MachineExecutable(Executable):
    """An assembled graph: ``exe(args) -> outputs`` on NumPy arrays (see :class:`~opgraph.backends.base.Executable`).

    Keeps one register file between calls (its constants written once); a call made while another runs on the
    same executable (another thread) gets a register file of its own.
    """

    def __init__(self, machine: Any, n_slots: int | None = None) -> None:
        self.machine = machine
        self._n_slots = machine.n_slots if n_slots is None else n_slots
        self._prepare()
        self._lock = threading.Lock()
        self._regs = self._fresh()
        self._ins = [(s, s + math.prod(shape), shape) for s, shape, _ in machine.inputs]
        self._outs = [(s, s + math.prod(shape), shape, dt) for s, shape, dt in machine.outputs]
        # inputs of one element go in with one vectorised write (a Python write per input costs ~1 us)
        self._scalars = [i for i, (lo, hi, _) in enumerate(self._ins) if hi - lo == 1]
        self._scalar_slots = np.array([self._ins[i][0] for i in self._scalars], dtype=np.int64)
        self._tensors = [i for i, (lo, hi, _) in enumerate(self._ins) if hi - lo != 1]
        self._all_scalars = len(self._scalars) == len(self._ins)

    def _prepare(self) -> None:
        """Get the program ready to run (the numba interpreter and the program's columns)."""
        from opgraph.backends.numba.machine import interpreter

        self._run = interpreter()
        p = self.machine.program
        self._cols = (p.code, p.dst, p.a, p.b, p.c, p.n, p.mask, p.args, p.coefs)

    def _execute(self, regs: np.ndarray) -> None:
        """Run the program on the register file ``regs``."""
        self._run(*self._cols, regs)

    def _fresh(self) -> np.ndarray:
        regs = np.zeros(self._n_slots, dtype=np.float64)
        regs[:len(self.machine.init)] = self.machine.init
        return regs

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        mine = self._lock.acquire(blocking=False)
        regs = self._regs if mine else self._fresh()
        try:
            if len(args) != len(self._ins):
                raise BackendError(f"{len(args)} inputs where the program takes {len(self._ins)}")
            if self._scalars:
                scalars = args if self._all_scalars else [args[i] for i in self._scalars]
                try:
                    regs[self._scalar_slots] = np.fromiter(scalars, np.float64, len(scalars))
                except (TypeError, ValueError):  # one element of another rank ((1, 1)), or a wrong size: one by one
                    for i in self._scalars:
                        regs[self._ins[i][0]] = self._check(i, args[i]).reshape(-1)[0]
            for i in self._tensors:
                lo, hi, _ = self._ins[i]
                regs[lo:hi] = self._check(i, args[i]).reshape(-1)
            self._execute(regs)
            return [regs[lo:hi].reshape(shape) != 0 if dt == np.bool_ else regs[lo:hi].reshape(shape).copy()
                    for lo, hi, shape, dt in self._outs]
        finally:
            if mine:
                self._lock.release()

    def _check(self, i: int, a: Any) -> np.ndarray:
        a = np.asarray(a)
        lo, hi, shape = self._ins[i]
        if a.size != hi - lo:
            raise BackendError(f"input {i} has shape {a.shape} where the program was compiled for {shape}")
        return a

    @property
    def source(self) -> str:
        """The program's first instructions, one per line (``Program.code`` shows it)."""
        return self.machine.program.listing()


class _Loop(Executable):
    """An elementwise region over large arrays compiled as one parallel loop."""

    def __init__(self, fn: Callable[[list[np.ndarray]], list[np.ndarray]]) -> None:
        self.fn = fn

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        return self.fn(list(args))


def _large(graph: Graph) -> bool:
    """True when a value of ``graph`` has more than :data:`SMALL` elements (by its type)."""
    used = np.unique(graph.value_type).tolist()
    return any(isinstance(t, TensorType) and t.is_static and int(np.prod(t.shape)) > SMALL  # type: ignore[arg-type]
               for t in (graph.types[i] for i in used if i < len(graph.types)))


def _machine_types(graph: Graph) -> bool:
    """True when the register machine can hold every value of ``graph`` (float64 and bool)."""
    used = np.unique(graph.value_type).tolist()
    return all(isinstance(t, TensorType) and t.dtype.name in MACHINE_DTYPES
               for t in (graph.types[i] for i in used if i < len(graph.types)))


MACHINE_DTYPES = frozenset({"float64", "bool"})
"""What the register machine computes in (booleans as 0.0 and 1.0)."""
LOOP_DTYPES = frozenset({"float32", "float64", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                         "uint32", "uint64"})
"""What an elementwise op over large arrays may compute in (one parallel loop, NumPy's own inner loops)."""


@dataclass
class NumbaBackend(Backend):
    """The register-machine engine (see the module doc)."""

    lowers_bodies: ClassVar[bool] = False

    def compile_graph(self, graph: Graph, *, device: str | None = None, donate: Sequence[int] = (),
                      input_shapes: Sequence[tuple[int, ...] | None] | None = None, threads: int | None = None,
                      fast_math: bool = False, **options: Any) -> Executable:
        """The graph as one register-machine program (``input_shapes``: shapes for inputs whose type has none);
        an elementwise region over large arrays (any value of more than :data:`SMALL` elements) as one parallel
        loop instead (:func:`~opgraph.backends.numba.fused.compile_elementwise`: ``threads``, ``fast_math``).

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (3,))); b.output(b.op("exp", x))
        >>> BACKEND.compile_graph(b.freeze())([np.zeros(3)])[0]
        array([1., 1., 1.])
        """
        if options:
            raise BackendError(f"the numba engine takes no options {sorted(options)} (it takes threads=, "
                               f"fast_math=)")
        from opgraph.backends.numba import fused
        from opgraph.backends.numba.assemble import assemble

        if _large(graph):
            why = fused.elementwise_region(graph)
            if why is None:
                fn = fused.compile_elementwise(graph, threads=threads, fast_math=fast_math)
                if fn is not None:
                    return _Loop(fn)
            if not _machine_types(graph):
                raise BackendError(f"numba runs large values of dtypes other than float64 and bool only as one "
                                   f"elementwise region, and this one is not: {why}")
        return MachineExecutable(assemble(graph, input_shapes))

    def why_not(self, info: OpInfo) -> str | None:
        """As :meth:`Backend.why_not`, and: static shapes (TensCalc's untyped values excepted), and values of at
        most :data:`SMALL` elements except for elementwise ops."""
        tenscalc = _family(info.kind) == TENSCALC_UNTYPED
        if tenscalc:  # parameters (signs, sizes, subscripts) are int64 constants, read when the program is built
            info = OpInfo(info.kind, info.attrs, tuple(_as_f64(t) for t in info.in_types), info.out_types,
                          info.op, info.version)
        elementwise = _elementwise(info.kind)
        if elementwise and _loop_op(info):  # large: one parallel loop in the op's own dtypes
            return self.why_not_loop(info)
        if info.kind in LOOP_ONLY:
            return f"numba runs {info.kind} only over arrays of more than {SMALL} elements"
        why = super().why_not(info)
        if why is not None:
            return why
        for t in (*info.in_types, *info.out_types):
            assert isinstance(t, TensorType)
            if t.shape is None or None in t.shape:
                if not tenscalc:
                    return f"numba runs static shapes, not {t}"
            elif not elementwise and int(np.prod(t.shape)) > SMALL:
                return f"numba runs {info.kind} on values of at most {SMALL} elements, not {t}"
        return None

    def why_not_loop(self, info: OpInfo) -> str | None:
        """Why an elementwise op over large arrays cannot be a step of one parallel loop (None: it can)."""
        from opgraph.backends.numba import fused

        if info.kind not in self.rules:
            return f"numba has no rule for {info.kind!r}"
        for t in (*info.in_types, *info.out_types):
            if not isinstance(t, TensorType) or t.dtype.name not in LOOP_DTYPES:
                return f"numba runs large elementwise ops on {', '.join(sorted(LOOP_DTYPES))}, not {t}"
        from opgraph.core.builder import GraphBuilder

        b = GraphBuilder(hash_cons=False)
        ins = [b.input(t) for t in info.in_types]
        out = b.op(info.kind, *ins, **dict(info.attrs))
        b.output(*(out if isinstance(out, tuple) else (out,)))
        return fused.elementwise_region(b.freeze())

    def first_compile_seconds(self) -> float:
        """About 30 s where numba has not compiled the interpreter in this process and has no cached copy on disk
        (its first use on a machine, or after an upgrade of numba or of this package); else 0.

        >>> from opgraph.backends.numba import machine
        >>> BACKEND.first_compile_seconds() in (0.0, machine.INTERPRETER_COMPILE_SECONDS)
        True
        """
        from opgraph.backends.numba import machine

        return 0.0 if machine.interpreter_ready() else machine.INTERPRETER_COMPILE_SECONDS

    def claims(self, graph: Graph) -> bool:
        """True when this engine runs every op of ``graph``, decided per kind and per type (vectorised), so a
        graph of 10^6 ops is not asked op by op; kinds with limits are asked op by op.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (3,))); b.output(b.op("exp", x))
        >>> BACKEND.claims(b.freeze())
        True
        """
        kinds = np.unique(graph.op_kind).tolist()
        names = {k: get_op(k).name for k in kinds if k != CONST.id}
        if any(n not in self.rules or n in LOOP_ONLY for n in names.values()):
            return False
        used = np.unique(graph.value_type)
        tenscalc_only = all(_family(n) == TENSCALC_UNTYPED or n in self.limits for n in names.values())
        big_ok = all(_elementwise(n) for n in names.values())
        for i, t in zip(used.tolist(), (graph.types[i] for i in used.tolist()), strict=True):
            if not isinstance(t, TensorType):
                return False
            if t.dtype.name not in self.dtypes:
                if not _tenscalc_parameters(graph, i):
                    return False
                continue
            if t.shape is None or None in t.shape:
                if not tenscalc_only:
                    return False
            elif int(np.prod(t.shape)) > SMALL and not big_ok:
                return False
        for k, n in names.items():
            if n in self.limits:
                for op in np.flatnonzero(graph.op_kind == k).tolist():
                    if self.why_not(OpInfo.of(graph, op)) is not None:
                        return False
        return True

    def owns(self, device: str | None) -> Callable[[Any, np.dtype, tuple[int, ...]], bool] | None:
        """NumPy arrays of the input's dtype and shape go to the program as they are."""
        from opgraph.backends.arrays import owns_numpy

        return owns_numpy


LOOP_ONLY = frozenset({"fused_elementwise"})
"""Kinds the engine runs only as steps of a parallel loop over large arrays."""


def _loop_op(info: OpInfo) -> bool:
    """True when an elementwise op reads or writes more than :data:`SMALL` elements."""
    return any(isinstance(t, TensorType) and t.is_static and int(np.prod(t.shape)) > SMALL  # type: ignore[arg-type]
               for t in (*info.in_types, *info.out_types))


def _as_f64(t: Any) -> Any:
    return TensorType("float64", t.shape) if isinstance(t, TensorType) and t.dtype.kind in "iu" else t


def _tenscalc_parameters(graph: Graph, type_id: int) -> bool:
    """True when every value of this type is a constant that only TensCalc ops read (their parameters)."""
    values = np.flatnonzero(graph.value_type == type_id)
    prod = graph.value_producer[values]
    if np.any(prod < 0) or np.any(graph.op_kind[prod] != CONST.id):
        return False
    reads = np.isin(graph.in_ids, values)
    readers = np.unique(np.searchsorted(graph.in_ptr, np.flatnonzero(reads), side="right") - 1)
    return all(_family(get_op(k).name) == TENSCALC_UNTYPED for k in np.unique(graph.op_kind[readers]).tolist())


def _family(kind: str) -> str:
    try:
        return get_op(kind).family
    except Exception:  # an unknown kind has no family
        return ""


def _elementwise(kind: str) -> bool:
    try:
        return bool(get_op(kind).elementwise)
    except Exception:
        return False


BACKEND = NumbaBackend("numba", dtypes=frozenset({"float64", "bool"}), module="numba", extra="fast",
                       doc="register machine for fine-grained graphs (scalars and small tensors)")

# the rules, one module per op family (imported for their registrations)
from opgraph.backends.numba import contraction as contraction_rules  # noqa: E402,F401
from opgraph.backends.numba import elementwise as elementwise_rules  # noqa: E402,F401
from opgraph.backends.numba import fused as fused_rules  # noqa: E402,F401
from opgraph.backends.numba import reduction as reduction_rules  # noqa: E402,F401
from opgraph.backends.numba import shape as shape_rules  # noqa: E402,F401
from opgraph.backends.numba import tenscalc as tenscalc_rules  # noqa: E402,F401
