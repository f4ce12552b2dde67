"""A graph becomes a register-machine program: slots for values, instructions for ops, in O(n) NumPy.

:func:`assemble` works on the graph's columns, never with a Python call per op for the kinds that make up
fine-grained graphs (elementwise math, TensCalc's scalar functions): each kind's rule (an *emitter*, registered
with ``@BACKEND.rule`` in the engine's family modules) gets all ops of its kind at once, as an array, and adds
their instructions in bulk. Ops that only move data (reshape, a contiguous slice, ``ftensor2scalars``) emit
nothing: their results are views of their input's slots. Shape ops that reorder data become one ``GATHER`` whose
slot map is the op's own reference kernel run on the input's slot numbers, so every shape op NumPy can compute
moves data here the same way. Instructions are finally put in the graph's topological order (one stable sort).

    >>> import numpy as np, opgraph
    >>> from opgraph.backends.numba.assemble import assemble
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,)), name="x")
    >>> b.output(b.op("sin", b.op("multiply", x, 2.0)))
    >>> m = assemble(b.freeze())
    >>> print(m.program.listing())
    0: r67[2] = MUL r65 r0
    1: r69[2] = SIN r67
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph.backends.base import BackendError
from opgraph.backends.numba.machine import FIRST_VARIADIC, GATHER, RUN, Instructions
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST, get_op
from opgraph.core.types import TensorType

Emitter = Callable[["Assembler", np.ndarray], None]
"""A kind's rule on this engine: adds the instructions of the given ops (all of that kind) to the assembler."""

SHAPE_RULES: dict[str, Callable[[Assembler, np.ndarray], None]] = {}
"""Kind -> how it sets the shapes of its results when their types do not say (TensCalc's untyped files)."""


@dataclass
class Machine:
    """An assembled program: instructions, the register file's size and initial contents (constants), where each
    input goes and each output comes from.

    ``inputs``/``outputs`` are ``(first slot, shape, dtype)`` in the graph's input/output order.
    """

    program: Instructions
    n_slots: int
    init: np.ndarray
    """The register file's first ``len(init)`` slots: the constants, written once."""
    inputs: list[tuple[int, tuple[int, ...], np.dtype]]
    outputs: list[tuple[int, tuple[int, ...], np.dtype]]

    @property
    def nbytes(self) -> int:
        """Bytes the program and one register file take while running."""
        return self.program.nbytes + 8 * self.n_slots


@dataclass
class Assembler:
    """The state :func:`assemble` shares with the emitters (see the module doc)."""

    graph: Graph
    shapes: Shapes
    size: np.ndarray
    slot: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    rank: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _rows: list[np.ndarray] = field(default_factory=list)
    _args: list[np.ndarray] = field(default_factory=list)
    _coefs: list[np.ndarray] = field(default_factory=list)
    _n_args: int = 0
    _n_coefs: int = 0
    _consts: dict[float, int] = field(default_factory=dict)
    _extra_consts: list[float] = field(default_factory=list)
    n_slots: int = 0
    _const_base: int = 0
    int_type: type = np.int32
    """The program's integer type while it is built (int64 only for programs past 2**31 slots or ranks)."""

    # ---------------------------------------------------------------- facts emitters read
    def inputs_of(self, ops: np.ndarray, k: int) -> np.ndarray:
        """Value id of input ``k`` of each op."""
        return self.graph.in_ids[self.graph.in_ptr[ops] + k].astype(np.int64)

    def output_of(self, ops: np.ndarray, k: int = 0) -> np.ndarray:
        """Value id of output ``k`` of each op."""
        return self.graph.out_ids[self.graph.out_ptr[ops] + k].astype(np.int64)

    def set_shape(self, values: Any, shape: tuple[int, ...]) -> None:
        """Give values of unknown shape one (a shape rule's job)."""
        for v in np.atleast_1d(np.asarray(values)).tolist():
            self.shapes[v] = shape
        self.size[values] = math.prod(shape)

    def const_value(self, value: int) -> np.ndarray | None:
        """The array of a value produced by a constant op (None: not a constant)."""
        p = int(self.graph.value_producer[value])
        if p < 0 or self.graph.op_kind[p] != CONST.id:
            return None
        return self.graph.constant_of(p)

    def const_slot(self, x: float) -> int:
        """The slot of a constant the program needs (0.0 for padding, 1.0, a mean's divisor), shared."""
        key = float(x)
        got = self._consts.get(key)
        if got is None:
            got = self._consts[key] = self._const_base + len(self._extra_consts)
            self._extra_consts.append(key)
        return got

    def alloc(self, size: int) -> int:
        """A fresh run of ``size`` slots for a temporary."""
        start = self.n_slots
        self.n_slots += size
        return start

    # ---------------------------------------------------------------- what emitters add
    def emit(self, ops: np.ndarray, code: Any, dst: Any, a: Any = 0, b: Any = 0, c: Any = 0, n: Any = 1,
             mask: Any = 0, sub: int = 0) -> None:
        """Instructions, one per op of ``ops`` (columns broadcast); ``sub`` orders several instructions of
        one op (0 runs first)."""
        m = len(ops)
        if not m:
            return
        block = np.empty((8, m), dtype=self.int_type)
        block[0] = self.rank[ops] * 8 + sub
        for i, v in enumerate((code, dst, a, b, c, n, mask), start=1):
            block[i] = v
        self._rows.append(block)

    def operand_list(self, lists: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
        """Append operand lists (slots) to ``args``: ``lists`` is one flat array, ``lengths`` the length of each
        list (None: one list). Returns each list's start in ``args``."""
        flat = np.asarray(lists, dtype=np.int64).ravel()
        lengths = np.array([len(flat)]) if lengths is None else np.asarray(lengths, dtype=np.int64)
        starts = self._n_args + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self._args.append(flat)
        self._n_args += len(flat)
        return starts

    def coef_list(self, values: np.ndarray) -> int:
        """Append signs or weights to ``coefs``; returns where they start."""
        start = self._n_coefs
        self._coefs.append(np.asarray(values, dtype=np.float64).ravel())
        self._n_coefs += len(self._coefs[-1])
        return start

    def gather(self, ops: np.ndarray, dst: int, slots: np.ndarray, sub: int = 0) -> None:
        """``r[dst + i] = r[slots[i]]`` for one op; a view (no instruction) is the caller's business."""
        start = self.operand_list(slots)
        self.emit(ops, GATHER, dst, start, 0, 0, len(slots), sub=sub)

    def slots_of(self, value: int) -> np.ndarray:
        """The slot of each element of ``value``, in C order and its shape (the index trick of shape ops)."""
        shape = self.shapes[value]
        assert shape is not None
        return self.slot[value] + np.arange(int(self.size[value]), dtype=np.int64).reshape(shape)


ALIAS_RULES: dict[str, Callable[[Assembler, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray] | None]] = {}
"""Kind -> which of its ops' results are views: ``(result values, base values, offsets)``."""


class Shapes:
    """Each value's shape: its type's, or one given later (``shapes[v] = (2, 3)``); None where neither says.
    Per value only where given, so a graph of 10^7 scalars costs no list of 10^7 tuples."""

    def __init__(self, per_type: list[tuple[int, ...] | None], value_type: np.ndarray) -> None:
        self.per_type = per_type
        self.value_type = value_type
        self.given: dict[int, tuple[int, ...]] = {}

    def __getitem__(self, v: int) -> tuple[int, ...] | None:
        got = self.given.get(v)
        return got if got is not None else self.per_type[int(self.value_type[v])]

    def __setitem__(self, v: int, shape: tuple[int, ...]) -> None:
        self.given[v] = shape


def _shapes(graph: Graph, input_shapes: Sequence[tuple[int, ...] | None] | None
            ) -> tuple[Shapes, np.ndarray, np.ndarray]:
    """Each value's shape (None: unknown yet), its size (-1: unknown yet), and the constant ops."""
    per_type: list[tuple[int, ...] | None] = []
    for t in graph.types:
        if isinstance(t, TensorType) and t.shape is not None and None not in t.shape:
            per_type.append(tuple(int(s) for s in t.shape))  # type: ignore[arg-type]
        else:
            per_type.append(None)
    type_size = np.array([math.prod(s) if s is not None else -1 for s in per_type] + [-1], dtype=np.int64)
    shapes = Shapes(per_type, graph.value_type)
    size = type_size[graph.value_type]
    fixed: list[tuple[int, tuple[int, ...]]] = []
    if input_shapes is not None:
        fixed += [(v, tuple(int(d) for d in s)) for v, s in zip(graph.inputs.tolist(), input_shapes, strict=True)
                  if s is not None]
    const_ops = np.flatnonzero(graph.op_kind == CONST.id)
    cvals = graph.out_ids[graph.out_ptr[const_ops]]
    for op in const_ops[size[cvals] < 0].tolist():  # constants of untyped files: shapes from their arrays
        fixed.append((int(graph.out_ids[graph.out_ptr[op]]), tuple(graph.constant_of(op).shape)))
    for v, s in fixed:
        shapes[v] = s
        size[v] = math.prod(s)
    return shapes, size, const_ops


def assemble(graph: Graph, input_shapes: Sequence[tuple[int, ...] | None] | None = None,
             rules: Mapping[str, Emitter] | None = None) -> Machine:
    """The register-machine program computing ``graph`` (every op of a kind in ``rules``: the numba backend's
    rule table by default); ``input_shapes`` give inputs of unknown shape one (TensCalc's files).

    Raises :class:`~opgraph.backends.base.BackendError` naming the op when a kind has no rule or a shape is
    unknown.
    """
    if rules is None:
        from opgraph.backends.numba import BACKEND

        rules = BACKEND.rules
    g = graph
    n_ops, n_vals = g.num_ops, g.num_values
    shapes, size, const_ops = _shapes(g, input_shapes)
    order = g.topological_order()
    rank = np.empty(n_ops, dtype=np.int64)
    rank[order] = np.arange(n_ops, dtype=np.int64)
    kinds = g.op_kind
    by_kind: dict[int, np.ndarray] = {}
    if n_ops:
        sorted_ops = np.argsort(kinds, kind="stable")
        uk, starts = np.unique(kinds[sorted_ops], return_index=True)
        bounds = np.append(starts, n_ops)
        for i, k in enumerate(uk.tolist()):
            by_kind[k] = sorted_ops[bounds[i]:bounds[i + 1]]
    names = {k: get_op(k).name for k in by_kind}
    for k, name in names.items():
        if k != CONST.id and name not in rules:
            op = int(by_kind[k][0])
            raise BackendError(f"op {op} ({name}) has no rule on the numba engine")
    asm = Assembler(g, shapes, size)
    asm.rank = rank
    # results of unknown shape (TensCalc's untyped scalar functions) get theirs from their kind
    for k, ops in by_kind.items():
        rule = SHAPE_RULES.get(names[k])
        if rule is not None:
            rule(asm, ops)
    missing = np.flatnonzero(asm.size < 0)
    if len(missing):  # an input nothing reads needs no shape
        read = np.zeros(n_vals, dtype=bool)
        read[g.in_ids] = True
        read[g.outputs] = True
        idle = missing[~read[missing] & (g.value_producer[missing] < 0)]
        if len(idle):
            asm.set_shape(idle, ())
        missing = np.flatnonzero(asm.size < 0)
    if len(missing):
        v = int(missing[0])
        p = int(g.value_producer[v])
        what = f"input {g.value_label(v)}" if p < 0 else f"op {p} ({g.kind_of(p)}) result {g.value_label(v)}"
        raise BackendError(f"the numba engine needs static shapes: {what} has type {g.type_of(v)}")
    # views: results that are their input's slots (no instruction), resolved through chains of views
    base = np.full(n_vals, -1, dtype=np.int64)
    offset = np.zeros(n_vals, dtype=np.int64)
    for k, ops in by_kind.items():
        rule = ALIAS_RULES.get(names[k])
        if rule is not None:
            got = rule(asm, ops)
            if got is not None:
                res, src, off = got
                base[res], offset[res] = src, off
    is_view = base >= 0
    # storage: constants first (written once), then every other value that is not a view
    const_vals = g.out_ids[g.out_ptr[const_ops]].astype(np.int64) if len(const_ops) else np.zeros(0, np.int64)
    own = ~is_view
    own[const_vals] = False
    # integer constants are parameters the rules read when the program is built (TensCalc's signs, sizes,
    # subscripts): no slot for them
    float_type = np.array([getattr(t, "dtype", np.dtype("f8")).kind in "fb" for t in g.types] + [True])
    kept = float_type[g.value_type[const_vals]]
    const_ops, const_vals = const_ops[kept], const_vals[kept]
    slot = np.full(n_vals, -1, dtype=np.int64)
    csize = asm.size[const_vals]
    cstart = np.concatenate([[0], np.cumsum(csize)[:-1]]).astype(np.int64) if len(const_vals) else csize
    slot[const_vals] = cstart
    n_const = int(csize.sum())
    init_parts = [np.asarray(g.constant_of(op), dtype=np.float64).ravel() for op in const_ops.tolist()]
    asm._const_base = n_const
    # resolve chains of views (pointer jumping: O(n log depth))
    vb, vo = base.copy(), offset.copy()
    while True:
        chained = is_view.copy()
        chained[is_view] = is_view[vb[is_view]]
        if not chained.any():
            break
        idx = np.flatnonzero(chained)
        vo[idx] += vo[vb[idx]]
        vb[idx] = vb[vb[idx]]
    # room for the constants the emitters ask for (0.0, 1.0, divisors), then the values kept for the whole call
    # (inputs, results, tensors), then the scalars whose slots are reused once their last reader has run
    extra_room = 64
    first = n_const + extra_room
    reused = own & (asm.size == 1) & (g.value_producer >= 0)
    reused[g.inputs] = False
    reused[g.outputs] = False
    reused[vb[is_view]] = False  # a base of views lives as long as they do
    fixed = np.flatnonzero(own & ~reused)
    fsize = asm.size[fixed]
    slot[fixed] = first + np.concatenate([[0], np.cumsum(fsize)[:-1]]).astype(np.int64) if len(fixed) else fsize
    n_slots = first + int(fsize.sum())
    n_slots = _reuse_slots(g, rank, np.flatnonzero(reused), slot, n_slots)
    slot[is_view] = slot[vb[is_view]] + vo[is_view]
    asm.slot = slot
    asm.n_slots = n_slots
    if max(n_slots + extra_room, 8 * n_ops + 8, int(asm.size.max(initial=0))) >= 2**31:
        asm.int_type = np.int64
    for k, ops in by_kind.items():
        if k == CONST.id:
            continue
        rules[names[k]](asm, ops)
    if len(asm._extra_consts) > extra_room:
        raise BackendError(f"the numba engine ran out of constant room ({len(asm._extra_consts)} > {extra_room})")
    init = np.zeros(n_const + len(asm._extra_consts), dtype=np.float64)
    if init_parts:
        init[:n_const] = np.concatenate(init_parts)
    init[n_const:] = asm._extra_consts
    prog = _program(asm)
    _check_bounds(prog, asm.n_slots)
    ins = [(int(slot[v]), tuple(shapes[v]), _dtype(g, v)) for v in g.inputs.tolist()]  # type: ignore[arg-type]
    outs = [(int(slot[v]), tuple(shapes[v]), _dtype(g, v)) for v in g.outputs.tolist()]  # type: ignore[arg-type]
    return Machine(prog, asm.n_slots, init, ins, outs)


def _reuse_slots(g: Graph, rank: np.ndarray, values: np.ndarray, slot: np.ndarray, first: int) -> int:
    """Give ``values`` (one-element results) slots from ``first`` on, a slot going back to a free list once the
    value's last reader has run (:func:`~opgraph.backends.numba.machine.allocate`; an op's results are given
    slots before its operands' are freed, so no instruction writes a slot it reads). Returns the slots used."""
    if not len(values):
        return first
    n_ops = g.num_ops
    born = rank[g.value_producer[values]]
    reader = rank[np.repeat(np.arange(n_ops), np.diff(g.in_ptr))]
    from opgraph.backends.numba.machine import allocate

    return int(allocate(n_ops, born, values, g.in_ids, reader, first, slot))


def _check_bounds(prog: Instructions, n_slots: int) -> None:
    """Every slot an instruction reads or writes lies in the register file (the interpreter does not check:
    a rule's mistake would write over memory, so it is caught here, once, in vectorised NumPy)."""
    from opgraph.backends.numba.machine import ARITY, GATHER

    code = prog.code.astype(np.int64)
    n = prog.n.astype(np.int64)
    base = np.where(code >= RUN, code - RUN, code)
    elementwise = base < FIRST_VARIADIC
    width = np.where(elementwise | (base == GATHER), n, 1)  # an empty run writes nothing
    bad = (width > 0) & ((prog.dst < 0) | (prog.dst + width > n_slots))
    arity = np.zeros(FIRST_VARIADIC, dtype=np.int64)
    for c, k in ARITY.items():
        arity[c] = k
    ar = np.where(elementwise, arity[np.minimum(base, FIRST_VARIADIC - 1)], 0)
    mask = prog.mask.astype(np.int64)
    for k, col in enumerate((prog.a, prog.b, prog.c)):
        reads = elementwise & (ar > k) & (n > 0)
        span = np.where((mask >> k) & 1, n, 1)
        bad |= reads & ((col < 0) | (col + span > n_slots))
    if len(prog.args) and (prog.args.min() < 0 or prog.args.max() >= n_slots):
        raise BackendError(f"the numba engine built an operand list outside the register file ({n_slots} slots)")
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        row = Instructions(*(getattr(prog, f)[k:k + 1] for f in ("code", "dst", "a", "b", "c", "n", "mask")),
                           prog.args, prog.coefs)
        raise BackendError(f"the numba engine built instruction {k} outside the register file ({n_slots} slots): "
                           f"{row.listing()}")


def _dtype(g: Graph, v: int) -> np.dtype:
    t = g.type_of(v)
    return t.dtype if isinstance(t, TensorType) and t.dtype is not None else np.dtype("float64")


def _program(asm: Assembler) -> Instructions:
    rows = np.concatenate(asm._rows, axis=1) if asm._rows else np.zeros((8, 0), dtype=asm.int_type)
    keys = rows[0]
    if len(keys) > 1 and np.any(keys[1:] < keys[:-1]):
        rows = rows[:, np.argsort(keys, kind="stable")]
    _, code, dst, a, b, c, n, mask = rows
    if len(code) and (int(max(dst.max(), a.max(), b.max(), c.max(), n.max())) >= 2**31
                      or asm.n_slots >= 2**31):
        raise BackendError("the numba engine's program is larger than 2**31 slots")
    args = np.concatenate(asm._args).astype(np.int32) if asm._args else np.zeros(0, dtype=np.int32)
    coefs = np.concatenate(asm._coefs) if asm._coefs else np.zeros(0, dtype=np.float64)
    i32 = [np.ascontiguousarray(x, dtype=np.int32) for x in (code, dst, a, b, c, n)]
    return Instructions(*i32, mask.astype(np.int8), args, coefs).flagged()  # runs flagged: see machine.RUN


def variadic_rows(asm: Assembler, ops: np.ndarray, skip: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The slots of each op's inputs after the first ``skip`` (TensCalc's parameters), as one operand list per op
    appended to ``args``: returns ``(starts, counts)``."""
    g = asm.graph
    lo = g.in_ptr[ops].astype(np.int64) + skip
    hi = g.in_ptr[ops + 1].astype(np.int64)
    counts = hi - lo
    idx = np.repeat(lo, counts) + (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))
    vals = g.in_ids[idx].astype(np.int64)
    starts = asm.operand_list(asm.slot[vals], counts)
    return starts, counts
