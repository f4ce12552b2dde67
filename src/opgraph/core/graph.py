"""The frozen, columnar, bipartite computation graph.

A :class:`Graph` keeps its structure in NumPy arrays (see DESIGN.md):

* ops: ``op_kind`` (registry id), ``op_attr`` (index into ``attrs``),
  ``op_version``; inputs and outputs as CSR (``in_ptr``/``in_ids``,
  ``out_ptr``/``out_ids``);
* values: ``value_type`` (index into ``types``), ``value_producer`` (op
  index, -1 for inputs), ``value_index`` (position among the producer's
  outputs);
* interned tables ``types``, ``attrs`` and ``constants``;
* io gateways: ``inputs`` (set), ``outputs`` (get), ``updates`` (copy:
  rows of ``[source, destination]``);
* optional symbols: names and descriptions of values, ops and constants.

Graphs are immutable; derived indices (consumers, topological order,
reachability) are computed with vectorised NumPy on first use and cached.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> y = b.op("exp", b.op("negative", x))
    >>> b.output(y)
    >>> g = b.freeze()
    >>> print(g)
    graph(%x: f64[3]) {
      %1: f64[3] = negative(%x)
      %2: f64[3] = exp(%1)
      return %2
    }
    >>> g.num_ops, g.num_values
    (2, 3)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph.core import hooks
from opgraph.core.registry import CONST, Attrs, exact_key, get_op
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import GraphError, OpTypeError, VerifyError

INDEX = np.int32
"""Integer type of op and value ids inside a graph."""
PTR = np.int64
"""Integer type of CSR row pointers."""


@dataclass(frozen=True)
class Symbols:
    """Optional names and descriptions (the .cgs file), keyed by index.

    ``descriptions`` is keyed by ``(kind, index)`` with kind one of
    ``"constant"``, ``"op"``, ``"value"`` and ``"io"``.

    >>> Symbols(values={0: "x"}).values[0]
    'x'
    """

    values: Mapping[int, str] = field(default_factory=dict)
    ops: Mapping[int, str] = field(default_factory=dict)
    constants: Mapping[int, str] = field(default_factory=dict)
    descriptions: Mapping[tuple[str, int], str] = field(default_factory=dict)
    io: Mapping[int, str] = field(default_factory=dict)
    """Names of io gateway records (.cgs record type 4), keyed by gateway record number."""


def _csr_rows(ptr: np.ndarray) -> np.ndarray:
    """For each entry of a CSR array, the row it belongs to."""
    counts = np.diff(ptr)
    return np.repeat(np.arange(len(counts), dtype=INDEX), counts)


class Graph:
    """An immutable bipartite graph of ops and values (see the module doc).

    Build one with :class:`~opgraph.core.builder.GraphBuilder` or load it from
    a file; the constructor takes the arrays as they are and does not check
    them (call :meth:`verify`).

    ``file_meta`` carries format details a reader found and a writer needs to
    write the same bytes again (for example how a TensCalc file encoded each
    constant); it is not part of structural equality.
    """

    __slots__ = (
        "_cache",
        "attrs",
        "constants",
        "file_meta",
        "in_ids",
        "in_ptr",
        "inputs",
        "op_attr",
        "op_kind",
        "op_version",
        "out_ids",
        "out_ptr",
        "outputs",
        "symbols",
        "types",
        "updates",
        "value_index",
        "value_producer",
        "value_type",
    )

    def __init__(
        self,
        *,
        op_kind: Any,
        op_attr: Any,
        op_version: Any,
        in_ptr: Any,
        in_ids: Any,
        out_ptr: Any,
        out_ids: Any,
        value_type: Any,
        value_producer: Any,
        value_index: Any,
        types: Sequence[ValueType],
        attrs: Sequence[Attrs],
        constants: Sequence[np.ndarray],
        inputs: Any = (),
        outputs: Any = (),
        updates: Any = (),
        symbols: Symbols | None = None,
        file_meta: Mapping[str, Any] | None = None,
    ) -> None:
        def arr(a: Any, dt: Any) -> np.ndarray:
            out = np.ascontiguousarray(a, dtype=dt)
            out.flags.writeable = False
            return out

        self.op_kind = arr(op_kind, INDEX)
        self.op_attr = arr(op_attr, INDEX)
        self.op_version = arr(op_version, INDEX)
        self.in_ptr = arr(in_ptr, PTR)
        self.in_ids = arr(in_ids, INDEX)
        self.out_ptr = arr(out_ptr, PTR)
        self.out_ids = arr(out_ids, INDEX)
        self.value_type = arr(value_type, INDEX)
        self.value_producer = arr(value_producer, INDEX)
        self.value_index = arr(value_index, INDEX)
        self.types = tuple(types)
        self.attrs = tuple(attrs)
        consts = []
        for c in constants:
            c = np.array(c, copy=True)
            c.flags.writeable = False
            consts.append(c)
        self.constants = tuple(consts)
        self.inputs = arr(inputs, INDEX).reshape(-1)
        self.outputs = arr(outputs, INDEX).reshape(-1)
        self.updates = arr(updates, INDEX).reshape(-1, 2)
        self.symbols = symbols or Symbols()
        self.file_meta = dict(file_meta or {})
        self._cache: dict[Any, Any] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(self, "_cache"):
            raise AttributeError("Graph is immutable; build a new one (GraphBuilder or a pass)")
        object.__setattr__(self, name, value)

    # ------------------------------------------------------------------ sizes
    @property
    def num_ops(self) -> int:
        """Number of ops (const ops included)."""
        return len(self.op_kind)

    @property
    def num_values(self) -> int:
        """Number of values."""
        return len(self.value_type)

    @property
    def nbytes(self) -> int:
        """Bytes held by the structure arrays (not constants, not tables).

        >>> import opgraph
        >>> opgraph.GraphBuilder().freeze().nbytes
        16
        """
        names = ("op_kind", "op_attr", "op_version", "in_ptr", "in_ids", "out_ptr", "out_ids",
                 "value_type", "value_producer", "value_index", "inputs", "outputs", "updates")
        return int(sum(getattr(self, n).nbytes for n in names))

    # --------------------------------------------------------------- handles
    def value(self, index: int | str) -> Value:
        """A handle on value ``index`` (or the value with that name)."""
        if isinstance(index, str):
            return Value(self, self.find_value(index))
        if not 0 <= index < self.num_values:
            raise IndexError(f"value {index} out of range (graph has {self.num_values})")
        return Value(self, int(index))

    def op(self, index: int) -> Op:
        """A handle on op ``index``."""
        if not 0 <= index < self.num_ops:
            raise IndexError(f"op {index} out of range (graph has {self.num_ops})")
        return Op(self, int(index))

    def ops(self) -> Iterator[Op]:
        """Handles on all ops, in index order."""
        return (Op(self, i) for i in range(self.num_ops))

    def values(self) -> Iterator[Value]:
        """Handles on all values, in index order."""
        return (Value(self, i) for i in range(self.num_values))

    def find_value(self, name: str) -> int:
        """Index of the value called ``name`` (KeyError if none)."""
        index = self._cache.get("names")
        if index is None:
            index = self._cache["names"] = {n: i for i, n in self.symbols.values.items()}
        try:
            return index[name]
        except KeyError:
            raise KeyError(f"no value named {name!r}") from None

    def op_inputs(self, op: int) -> np.ndarray:
        """Input value ids of op ``op``."""
        return self.in_ids[self.in_ptr[op]:self.in_ptr[op + 1]]

    def op_outputs(self, op: int) -> np.ndarray:
        """Output value ids of op ``op``."""
        return self.out_ids[self.out_ptr[op]:self.out_ptr[op + 1]]

    def type_of(self, value: int) -> ValueType:
        """Type of value ``value``."""
        return self.types[self.value_type[value]]

    def name_of(self, value: int) -> str | None:
        """Symbolic name of value ``value``, if any."""
        return self.symbols.values.get(int(value))

    def attrs_of(self, op: int) -> dict[str, Any]:
        """Attributes of op ``op`` as a dict."""
        return dict(self.attrs[self.op_attr[op]])

    def kind_of(self, op: int) -> str:
        """Kind name of op ``op``."""
        return get_op(int(self.op_kind[op])).name

    def constant_of(self, op: int) -> np.ndarray:
        """The array a const op produces."""
        return self.constants[self.attrs_of(op)["index"]]

    # ------------------------------------------------------- derived indices
    def consumers(self) -> tuple[np.ndarray, np.ndarray]:
        """Consumers CSR ``(ptr, ops)``: ops using value v are ``ops[ptr[v]:ptr[v+1]]``.

        An op that uses a value twice appears twice. Computed once, cached.
        """
        hit = self._cache.get("consumers")
        if hit is None:
            order = np.argsort(self.in_ids, kind="stable")
            ops = _csr_rows(self.in_ptr)[order]
            counts = np.bincount(self.in_ids, minlength=self.num_values)
            ptr = np.zeros(self.num_values + 1, dtype=PTR)
            np.cumsum(counts, out=ptr[1:])
            hit = self._cache["consumers"] = (ptr, ops)
        return hit

    def input_producers(self) -> np.ndarray:
        """For each entry of ``in_ids``, the op producing it (-1 for inputs)."""
        hit = self._cache.get("input_producers")
        if hit is None:
            hit = self._cache["input_producers"] = self.value_producer[self.in_ids]
        return hit

    def is_topologically_ordered(self) -> bool:
        """True when every op's inputs are produced by ops before it."""
        hit = self._cache.get("ordered")
        if hit is None:
            rows = _csr_rows(self.in_ptr)
            hit = self._cache["ordered"] = bool(np.all(self.input_producers() < rows))
        return hit

    def topological_order(self) -> np.ndarray:
        """Op indices in an order where producers come before consumers.

        Graphs made by a builder are already ordered (checked in one vectorised
        step); others are sorted by a level-by-level Kahn's algorithm. Raises
        :class:`GraphError` naming ops on a cycle.
        """
        hit = self._cache.get("topo")
        if hit is not None:
            return hit
        if self.is_topologically_ordered():
            order = np.arange(self.num_ops, dtype=INDEX)
        else:
            order, _levels = self._kahn()
            if len(order) < self.num_ops:
                stuck = np.setdiff1d(np.arange(self.num_ops), order)[:10]
                names = ", ".join(f"op {i} ({self.kind_of(i)})" for i in stuck)
                raise GraphError(f"graph has a cycle through {names}")
        order.flags.writeable = False
        self._cache["topo"] = order
        return order

    def op_dependencies(self) -> tuple[np.ndarray, np.ndarray]:
        """Op-to-op edges ``(src, dst)``: ``dst`` uses an output of ``src``."""
        hit = self._cache.get("op_edges")
        if hit is None:
            prod = self.input_producers()
            rows = _csr_rows(self.in_ptr)
            keep = prod >= 0
            hit = self._cache["op_edges"] = (prod[keep].astype(INDEX), rows[keep])
        return hit

    def _kahn(self) -> tuple[np.ndarray, list[int]]:
        n = self.num_ops
        src, dst = self.op_dependencies()
        indeg = np.bincount(dst, minlength=n)
        succ = dst[np.argsort(src, kind="stable")]
        sptr = np.zeros(n + 1, dtype=PTR)
        np.cumsum(np.bincount(src, minlength=n), out=sptr[1:])
        frontier = np.flatnonzero(indeg == 0).astype(INDEX)
        parts: list[np.ndarray] = []
        levels: list[int] = []
        # Level by level with NumPy while levels are wide; a narrow level means a deep
        # graph (a chain costs one NumPy round per op), so finish with plain lists.
        while len(frontier) >= _NARROW:
            parts.append(frontier)
            levels.append(len(frontier))
            nxt = succ[_ranges(sptr[frontier], sptr[frontier + 1])]
            uniq, cnt = np.unique(nxt, return_counts=True)
            indeg[uniq] -= cnt
            frontier = uniq[indeg[uniq] == 0].astype(INDEX)
        if len(frontier):
            deg, sp, sc = indeg.tolist(), sptr.tolist(), succ.tolist()
            stack = frontier.tolist()
            tail: list[int] = []
            while stack:
                op = stack.pop()
                tail.append(op)
                for k in range(sp[op], sp[op + 1]):
                    nxt_op = sc[k]
                    deg[nxt_op] -= 1
                    if deg[nxt_op] == 0:
                        stack.append(nxt_op)
            parts.append(np.asarray(tail, dtype=INDEX))
        order = np.concatenate(parts) if parts else np.zeros(0, INDEX)
        return order.astype(INDEX), levels

    def needed_ops(self, targets: Iterable[int]) -> np.ndarray:
        """Boolean mask of the ops needed to compute the values ``targets``.

        Walks producers backwards level by level with NumPy; the result is
        cached per target set.
        """
        targets = np.unique(np.asarray(list(targets), dtype=INDEX))
        key = ("needed", targets.tobytes())
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        start = self.value_producer[targets] if len(targets) else np.zeros(0, INDEX)
        mask = _reach(self.in_ptr, self.input_producers(), start[start >= 0], self.num_ops)
        mask.flags.writeable = False
        self._cache[key] = mask
        return mask

    def descendants(self, values: Iterable[int]) -> np.ndarray:
        """Boolean mask of the values that depend on any of ``values`` (included)."""
        succ_ptr, succ = self._cache.get("value_succ") or self._value_successors()
        return _reach(succ_ptr, succ, np.asarray(list(values), dtype=INDEX), self.num_values)

    def _value_successors(self) -> tuple[np.ndarray, np.ndarray]:
        # value -> values computed from it: consumers' outputs, as CSR over values.
        ptr, cons = self.consumers()
        n_out = np.diff(self.out_ptr)[cons]
        succ = self.out_ids[_ranges(self.out_ptr[cons], self.out_ptr[cons + 1])]
        counts = np.bincount(_csr_rows(ptr), weights=n_out, minlength=self.num_values).astype(PTR)
        sptr = np.zeros(self.num_values + 1, dtype=PTR)
        np.cumsum(counts, out=sptr[1:])
        self._cache["value_succ"] = (sptr, succ)
        return sptr, succ

    # ------------------------------------------------------------ checking
    def verify(self, *, check_types: bool = True) -> Graph:
        """Check every invariant; raise :class:`VerifyError` listing all problems.

        Checks: array lengths and CSR pointers; ids in range (dangling ids);
        each value produced at most once and consistent with
        ``value_producer``/``value_index``; values without producer are
        declared inputs; gateways; cycles; known op kinds, constants; and
        (``check_types``) each op's stored output types and version against
        its type rule, evaluated once per distinct op signature. Returns the
        graph so calls chain.
        """
        problems: list[str] = []
        try:
            self._verify_into(problems, check_types)
        except Exception as exc:  # a broken graph must still give a report
            if not problems:
                raise
            problems.append(f"verification stopped early: {type(exc).__name__}: {exc}")
        if problems:
            raise VerifyError(problems)
        return self

    def _op_label(self, op: int) -> str:
        try:
            kind = get_op(int(self.op_kind[op])).name
        except KeyError:
            kind = f"<unknown kind {int(self.op_kind[op])}>"
        return f"op {op} ({kind})"

    def _verify_into(self, problems: list[str], check_types: bool) -> None:
        n_ops, n_vals = self.num_ops, self.num_values
        for name in ("op_attr", "op_version"):
            if len(getattr(self, name)) != n_ops:
                problems.append(f"{name} has {len(getattr(self, name))} entries for {n_ops} ops")
        for name in ("value_producer", "value_index"):
            if len(getattr(self, name)) != n_vals:
                problems.append(f"{name} has {len(getattr(self, name))} entries for {n_vals} values")
        for ptr_name, ids_name in (("in_ptr", "in_ids"), ("out_ptr", "out_ids")):
            ptr, ids = getattr(self, ptr_name), getattr(self, ids_name)
            if len(ptr) != n_ops + 1 or ptr[0] != 0 or ptr[-1] != len(ids) or np.any(np.diff(ptr) < 0):
                problems.append(f"{ptr_name} is not a valid CSR pointer for {n_ops} ops and {len(ids)} ids")
        if problems:
            return
        # Dangling ids.
        for ids_name, ptr in (("in_ids", self.in_ptr), ("out_ids", self.out_ptr)):
            ids = getattr(self, ids_name)
            bad = np.flatnonzero((ids < 0) | (ids >= n_vals))
            rows = _csr_rows(ptr)
            for k in bad[:20]:
                role = "input" if ids_name == "in_ids" else "output"
                problems.append(f"{self._op_label(int(rows[k]))}: {role} refers to value {int(ids[k])}, "
                                f"which does not exist (graph has {n_vals} values)")
        for name in ("inputs", "outputs"):
            ids = getattr(self, name)
            for v in ids[(ids < 0) | (ids >= n_vals)][:20]:
                problems.append(f"{name} gateway refers to value {int(v)}, which does not exist")
        up = self.updates.reshape(-1)
        for v in up[(up < 0) | (up >= n_vals)][:20]:
            problems.append(f"update (copy) gateway refers to value {int(v)}, which does not exist")
        if problems:
            return
        # Producers.
        counts = np.bincount(self.out_ids, minlength=n_vals)
        out_rows = _csr_rows(self.out_ptr)
        for v in np.flatnonzero(counts > 1)[:20]:
            ops = out_rows[self.out_ids == v]
            problems.append(f"value {int(v)} is produced more than once: by "
                            + " and ".join(self._op_label(int(o)) for o in ops))
        pos = np.arange(len(self.out_ids)) - self.out_ptr[out_rows]
        once = counts[self.out_ids] == 1
        bad = np.flatnonzero(once & ((self.value_producer[self.out_ids] != out_rows)
                                     | (self.value_index[self.out_ids] != pos)))
        for k in bad[:20]:
            problems.append(f"{self._op_label(int(out_rows[k]))}: output {int(pos[k])} is value "
                            f"{int(self.out_ids[k])}, whose producer is recorded as "
                            f"op {int(self.value_producer[self.out_ids[k]])}")
        orphans = np.flatnonzero((counts == 0) & (self.value_producer != -1))
        for v in orphans[:20]:
            problems.append(f"value {int(v)} records producer op {int(self.value_producer[v])}, "
                            f"which does not list it as an output")
        is_input = np.zeros(n_vals, dtype=bool)
        is_input[self.inputs] = True
        for v in np.flatnonzero(is_input & (counts > 0))[:20]:
            problems.append(f"value {int(v)} is an input (set gateway) but is produced by "
                            f"{self._op_label(int(self.value_producer[v]))}")
        for v in np.flatnonzero((counts == 0) & ~is_input)[:20]:
            problems.append(f"value {int(v)} has no producer and is not an input")
        if len(np.unique(self.inputs)) != len(self.inputs):
            problems.append("an input is declared more than once")
        for src, dst in self.updates[:]:
            if not is_input[dst]:
                problems.append(f"update (copy) destination value {int(dst)} is not an input")
            elif self.types[self.value_type[src]] != self.types[self.value_type[dst]]:
                problems.append(f"update (copy) {int(src)} -> {int(dst)} changes type "
                                f"{self.types[self.value_type[src]]} -> {self.types[self.value_type[dst]]}")
        # Tables.
        n_before = len(problems)
        for name, table in (("value_type", self.types), ("op_attr", self.attrs)):
            ids = getattr(self, name)
            bad = np.flatnonzero((ids < 0) | (ids >= len(table)))
            for k in bad[:20]:
                what = f"value {k}" if name == "value_type" else self._op_label(int(k))
                problems.append(f"{what}: {name} {int(ids[k])} is not in its table ({len(table)} entries)")
        kinds = np.unique(self.op_kind)
        unknown = set()
        for k in kinds:
            try:
                get_op(int(k))
            except KeyError:
                unknown.add(int(k))
        for k in sorted(unknown):
            first = int(np.flatnonzero(self.op_kind == k)[0])
            problems.append(f"op {first}: unknown op kind id {k}")
        if len(problems) > n_before:
            return
        # Cycles.
        try:
            self.topological_order()
        except GraphError as exc:
            problems.append(str(exc))
        # Constants.
        for op in np.flatnonzero(self.op_kind == CONST.id):
            attrs = self.attrs_of(int(op))
            idx = attrs.get("index", -1)
            outs = self.op_outputs(int(op))
            if not (0 <= idx < len(self.constants)):
                problems.append(f"op {op} (const): constant index {idx} not in the constants table")
            elif len(outs) != 1 or self.in_ptr[op + 1] != self.in_ptr[op]:
                problems.append(f"op {op} (const): must have no inputs and one output")
            elif not self.type_of(int(outs[0])).accepts(self.constants[idx]):  # type: ignore[union-attr]
                problems.append(f"op {op} (const): output type {self.type_of(int(outs[0]))} does not "
                                f"match constant {idx} ({TensorType.of(self.constants[idx])})")
        if check_types and not unknown:
            self._verify_types(problems)

    def _verify_types(self, problems: list[str]) -> None:
        n_in = np.diff(self.in_ptr)
        n_out = np.diff(self.out_ptr)
        nonconst = self.op_kind != CONST.id
        # Group ops by (n_in, n_out); inside a group the signature is a fixed-width row,
        # so np.unique finds the distinct signatures and each type rule runs once per signature.
        arity = n_in * (int(n_out.max(initial=0)) + 1) + n_out
        del n_in, n_out
        reported = 0
        checked: set[tuple[int, ...]] = set()
        for key in np.unique(arity[nonconst]):
            group = np.flatnonzero(nonconst & (arity == key))
            a_in = int(self.in_ptr[group[0] + 1] - self.in_ptr[group[0]])
            a_out = int(self.out_ptr[group[0] + 1] - self.out_ptr[group[0]])
            # In chunks, so the temporaries stay small however large the graph is.
            for start in range(0, len(group), _VERIFY_CHUNK):
                ops = group[start:start + _VERIFY_CHUNK]
                cols = [self.op_kind[ops], self.op_attr[ops], self.op_version[ops]]
                for j in range(a_in):
                    cols.append(self.value_type[self.in_ids[self.in_ptr[ops] + j]])
                for j in range(a_out):
                    cols.append(self.value_type[self.out_ids[self.out_ptr[ops] + j]])
                sig = np.stack(cols, axis=1)
                first = _distinct_rows(sig)
                for row, op in zip(sig[first].tolist(), ops[first].tolist(), strict=True):
                    if tuple(row) in checked:
                        continue
                    checked.add(tuple(row))
                    reported += self._check_signature(problems, op, row, a_in)
                    if reported >= 50:
                        return

    def _check_signature(self, problems: list[str], op: int, row: list[int], a_in: int) -> int:
        """Run the type rule for one op signature row; return how many problems it added."""
        opdef = get_op(row[0])
        in_types = tuple(self.types[t] for t in row[3:3 + a_in])
        out_types = tuple(self.types[t] for t in row[3 + a_in:])
        attrs = dict(self.attrs[row[1]])
        try:
            opdef.check_arity(a_in)
            expect = tuple(opdef.infer(in_types, attrs))
            version = int(opdef.version(in_types, attrs))
        except OpTypeError as exc:
            problems.append(f"op {op} ({opdef.name}): type rule rejects inputs {in_types}: {exc}")
            return 1
        if expect != out_types:
            problems.append(f"op {op} ({opdef.name}): outputs have types {out_types}, the type rule gives {expect}")
            return 1
        if version != row[2]:
            problems.append(f"op {op} ({opdef.name}): version {row[2]}, the inputs select {version}")
            return 1
        return 0

    # ------------------------------------------------------------ equality
    def equals(self, other: Graph, *, check_names: bool = False) -> bool:
        """Structural equality: same ops, values, types, attributes, constants, gateways.

        Table order does not matter (types and attributes are compared by
        value); names matter only with ``check_names``.
        """
        if not isinstance(other, Graph):
            return False
        for name in ("op_kind", "op_version", "in_ptr", "in_ids", "out_ptr", "out_ids",
                     "value_producer", "value_index", "inputs", "outputs", "updates"):
            if not np.array_equal(getattr(self, name), getattr(other, name)):
                return False
        if not _same_interned(self.value_type, self.types, other.value_type, other.types):
            return False
        if not _same_interned(self.op_attr, self._attr_keys(), other.op_attr, other._attr_keys()):
            return False
        if check_names and (self.symbols != other.symbols):
            return False
        return True

    def _attr_keys(self) -> tuple[Any, ...]:
        # Const ops point into the constants table; compare the constants they
        # point at, not the index, so equal graphs may order constants differently.
        keys: list[Any] = [exact_key(a) for a in self.attrs]
        for op in np.flatnonzero(self.op_kind == CONST.id):
            aid = int(self.op_attr[op])
            c = self.constants[dict(self.attrs[aid])["index"]]
            keys[aid] = ("const", c.dtype.str, c.shape, c.tobytes())
        return tuple(keys)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and self.equals(other)

    __hash__ = None  # type: ignore[assignment]

    # ------------------------------------------------------------ printing
    def value_label(self, v: int) -> str:
        """``%name`` for a named value, else ``%id`` (as dumps print it)."""
        name = self.symbols.values.get(v)
        return f"%{name}" if name is not None else f"%{v}"

    def __repr__(self) -> str:
        return (f"<Graph: {self.num_ops} ops, {self.num_values} values, {len(self.inputs)} inputs, "
                f"{len(self.outputs)} outputs, {len(self.updates)} updates>")

    def __str__(self) -> str:
        return self.dump()

    def _repr_svg_(self) -> str | None:
        # Drawing is opgraph.viz's job (a layer above core), reached through the hook it fills; without it
        # Jupyter falls back to the text repr, as it does when Graphviz is missing.
        render = hooks.SVG.get_or_none()
        return None if render is None else render(self)

    def dump(self, limit: int | None = 2000) -> str:
        """A readable listing, one op per line in topological order (``limit`` ops at most)."""
        head = ", ".join(f"{self.value_label(int(v))}: {self.type_of(int(v))}" for v in self.inputs)
        lines = [f"graph({head}) {{"]
        try:
            order = self.topological_order()
        except GraphError:
            order = np.arange(self.num_ops)
        for k, op in enumerate(order):
            if limit is not None and k >= limit:
                lines.append(f"  ... {self.num_ops - limit} more ops")
                break
            lines.append("  " + self._op_line(int(op)))
        if len(self.outputs):
            lines.append("  return " + ", ".join(self.value_label(int(v)) for v in self.outputs))
        for src, dst in self.updates:
            lines.append(f"  update {self.value_label(int(src))} -> {self.value_label(int(dst))}")
        lines.append("}")
        return "\n".join(lines)

    def _op_line(self, op: int) -> str:
        outs = self.op_outputs(op)
        lhs = ", ".join(f"{self.value_label(int(v))}: {self.type_of(int(v))}" for v in outs) or "()"
        kind = self.kind_of(op)
        attrs = self.attrs_of(op)
        if kind == "const":
            c = self.constants[attrs["index"]]
            if c.ndim == 0:
                body = repr(c.item())
            elif c.size <= 8:
                body = np.array2string(c, separator=", ").replace("\n", "")
            else:
                body = f"<{c.size} values, index {attrs['index']}>"
            return f"{lhs} = const {body}"
        args = ", ".join(self.value_label(int(v)) for v in self.op_inputs(op))
        attr_s = ""
        if attrs:
            attr_s = " {" + ", ".join(f"{k}={v!r}" for k, v in attrs.items()) + "}"
        name = self.symbols.ops.get(op)
        tail = f"  # {name}" if name else ""
        return f"{lhs} = {kind}({args}){attr_s}{tail}"

    # ------------------------------------------------------------ running
    def run(self, feeds: Mapping[Any, Any] | None = None, targets: Sequence[Any] | None = None,
            *, backend: str = "numpy") -> list[np.ndarray]:
        """Evaluate ``targets`` (default: the graph's outputs) from ``feeds``.

        Only the ops the targets need run. Feeds and targets may be value
        ids, names or :class:`Value` handles.

        >>> import numpy as np, opgraph
        >>> b = opgraph.GraphBuilder()
        >>> x = b.input(("float64", (2,)), name="x")
        >>> b.output(b.op("square", x))
        >>> b.freeze().run({"x": np.array([3.0, 4.0])})
        [array([ 9., 16.])]
        """
        # Running is opgraph.runtime's job (a layer above core): it fills this hook when imported.
        return hooks.RUN.get()(self, feeds or {}, targets, backend=backend)


_NARROW = 64
"""Frontier size below which level-wise walks switch from NumPy to plain lists."""
_VERIFY_CHUNK = 1 << 20
"""Ops per chunk when verify() checks type rules."""


def _reach(ptr: np.ndarray, adj: np.ndarray, start: np.ndarray, n: int) -> np.ndarray:
    """Mask of the nodes reachable from ``start`` (included) along a CSR adjacency.

    Entries of ``adj`` below 0 are ignored. Wide frontiers are expanded with
    NumPy, narrow ones (deep graphs) with plain lists.
    """
    mask = np.zeros(n, dtype=bool)
    frontier = np.unique(start)
    while len(frontier) >= _NARROW:
        mask[frontier] = True
        nxt = adj[_ranges(ptr[frontier], ptr[frontier + 1])]
        nxt = np.unique(nxt[nxt >= 0])
        frontier = nxt[~mask[nxt]]
    if len(frontier):
        seen = mask.tolist()
        p, a = ptr, adj
        stack = frontier.tolist()
        for node in stack:
            seen[node] = True
        found: list[int] = []
        while stack:
            node = stack.pop()
            found.append(node)
            for nxt_node in a[p[node]:p[node + 1]].tolist():
                if nxt_node >= 0 and not seen[nxt_node]:
                    seen[nxt_node] = True
                    stack.append(nxt_node)
        mask[np.asarray(found, dtype=np.int64)] = True
    return mask


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, e)`` for each pair, vectorised."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=PTR)
    keep = lengths > 0
    starts, lengths = starts[keep], lengths[keep]
    offsets = np.cumsum(lengths) - lengths
    out = np.ones(total, dtype=PTR)
    out[0] = starts[0]
    out[offsets[1:]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return np.cumsum(out)


def hash_rows(rows: np.ndarray) -> np.ndarray:
    """One uint64 hash per row of a 2-D integer array (equal rows, equal hashes).

    >>> h = hash_rows(np.array([[1, 2], [1, 2], [2, 1]]))
    >>> bool(h[0] == h[1]), bool(h[0] == h[2])
    (True, False)
    """
    h = np.zeros(len(rows), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(rows.shape[1]):
            h ^= rows[:, j].astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(31)
    return h


def _distinct_rows(rows: np.ndarray) -> np.ndarray:
    """Indices of one representative of each distinct row of a 2-D int array.

    Rows are hashed to one uint64 each so a 1-D unique does the grouping;
    a hash collision is detected and then handled exactly by a row-wise unique.
    """
    if len(rows) == 0:
        return np.zeros(0, dtype=np.int64)
    h = hash_rows(rows)
    uniq = np.unique(h)
    if len(uniq) > 4096:  # many signatures: one sort does it all
        _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    else:
        inverse = np.searchsorted(uniq, h)
        first = np.empty(len(uniq), dtype=np.int64)
        first[inverse[::-1]] = np.arange(len(h) - 1, -1, -1)  # the last write is the first occurrence
    if np.array_equal(rows, rows[first[inverse]]):
        return first
    return np.unique(rows, axis=0, return_index=True)[1]


def _same_interned(ids_a: np.ndarray, table_a: Sequence[Any], ids_b: np.ndarray, table_b: Sequence[Any]) -> bool:
    if len(ids_a) != len(ids_b):
        return False
    # Map each of b's table entries to a's index for an equal entry, then compare ids.
    index_a: dict[Any, int] = {}
    for i, t in enumerate(table_a):
        index_a.setdefault(t, i)
    canon_a = np.array([index_a[t] for t in table_a], dtype=np.int64)
    map_b = np.array([index_a.get(t, -1 - i) for i, t in enumerate(table_b)], dtype=np.int64)
    if len(ids_a) == 0:
        return True
    return bool(np.array_equal(canon_a[ids_a], map_b[ids_b]))


class Value:
    """A light handle on one value of a graph or builder (for users and tests).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("int32", (2,)), name="x")
    >>> x.type, x.name
    (i32[2], 'x')
    """

    __slots__ = ("id", "owner")

    def __init__(self, owner: Any, id: int) -> None:
        self.owner = owner
        self.id = id

    @property
    def type(self) -> ValueType:
        """The value's type."""
        return self.owner.type_of(self.id)

    @property
    def shape(self) -> tuple[int | None, ...] | None:
        """The value's shape (None entries are unknown)."""
        return self.type.shape  # type: ignore[union-attr]

    @property
    def dtype(self) -> np.dtype:
        """The value's dtype."""
        return self.type.dtype  # type: ignore[union-attr]

    @property
    def name(self) -> str | None:
        """The value's symbolic name, if any."""
        return self.owner.name_of(self.id)

    @property
    def producer(self) -> Op | None:
        """The op producing this value, or None for an input."""
        if isinstance(self.owner, Graph):
            p = int(self.owner.value_producer[self.id])
            return None if p < 0 else Op(self.owner, p)
        return self.owner.producer_of(self.id)

    @property
    def consumers(self) -> list[Op]:
        """Ops that use this value (graphs only)."""
        ptr, ops = self.owner.consumers()
        return [Op(self.owner, int(o)) for o in ops[ptr[self.id]:ptr[self.id + 1]]]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Value) and other.owner is self.owner and other.id == self.id

    def __hash__(self) -> int:
        return hash((id(self.owner), self.id))

    def __index__(self) -> int:
        return self.id

    def __repr__(self) -> str:
        name = self.name
        return f"<Value %{name if name is not None else self.id}: {self.type}>"


class Op:
    """A light handle on one op of a graph.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (4,)))
    >>> y = b.op("sum", x, axis=0)
    >>> op = b.freeze().op(0)
    >>> op.kind, op.attrs, [v.type for v in op.outputs]
    ('sum', {'axis': (0,), 'keepdims': False}, [f32[]])
    """

    __slots__ = ("id", "owner")

    def __init__(self, owner: Any, id: int) -> None:
        self.owner = owner
        self.id = id

    @property
    def kind(self) -> str:
        """Kind name."""
        return self.owner.kind_of(self.id)

    @property
    def attrs(self) -> dict[str, Any]:
        """Attributes."""
        return self.owner.attrs_of(self.id)

    @property
    def version(self) -> int:
        """Version chosen when the op was built."""
        return int(self.owner.op_version[self.id])

    @property
    def inputs(self) -> list[Value]:
        """Input values, in order."""
        return [Value(self.owner, int(v)) for v in self.owner.op_inputs(self.id)]

    @property
    def outputs(self) -> list[Value]:
        """Output values, in order."""
        return [Value(self.owner, int(v)) for v in self.owner.op_outputs(self.id)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Op) and other.owner is self.owner and other.id == self.id

    def __hash__(self) -> int:
        return hash((id(self.owner), "op", self.id))

    def __repr__(self) -> str:
        return f"<Op {self.id}: {self.owner._op_line(self.id)}>"
