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
:meth:`Graph.from_arrays` makes a checked graph straight from such arrays
(``docs/scale.md`` shows how to build graphs of 10^7-10^8 ops with it).

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

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from opgraph.core import accel, hooks
from opgraph.core.registry import CONST, Attrs, exact_key, get_op
from opgraph.core.subgraph import Subgraph, subgraphs_of
from opgraph.core.types import TensorType, ValueType, as_type
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


def csr_rows(ptr: np.ndarray) -> np.ndarray:
    """For each entry of a CSR array, the row it belongs to (``ptr`` is the row pointer).

    >>> csr_rows(np.array([0, 2, 2, 3])).tolist()
    [0, 0, 2]
    """
    counts = np.diff(ptr)
    return np.repeat(np.arange(len(counts), dtype=INDEX), counts)



def _const_index(attrs: Any) -> int:
    """A const op's ``index`` attribute, or -1 when it is missing or not an int64 (verify reports it).

    >>> _const_index((("index", 3),)), _const_index((("index", 2**64),)), _const_index((("index", "3"),))
    (3, -1, -1)
    """
    index = dict(attrs).get("index", -1)
    if isinstance(index, (int, np.integer)) and not isinstance(index, bool) and 0 <= index < 2**63:
        return int(index)
    return -1

def _const_index_fast(attrs: Any) -> int:
    """:func:`_const_index`, with the common ``(("index", i),)`` read without building a dict.

    >>> _const_index_fast((("index", 3),)), _const_index_fast((("index", True),)), _const_index_fast(())
    (3, -1, -1)
    """
    if len(attrs) == 1:
        name, index = attrs[0]
        if name == "index" and type(index) is int and 0 <= index < 2**63:
            return index
    return _const_index(attrs)


class Graph:
    """An immutable bipartite graph of ops and values (see the module doc).

    Build one with :class:`~opgraph.core.builder.GraphBuilder`, load it from
    a file, or make it from NumPy arrays with :meth:`from_arrays`, which
    checks them (the bulk path for large graphs, see ``docs/scale.md``). The
    constructor ``Graph(...)`` is the unchecked path: it takes all the arrays
    as they are, for code that made them valid by construction (call
    :meth:`verify` to check them).

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

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        """Pickle the arrays and tables (not the derived caches), e.g. to send a graph to a Dask worker.

        >>> import pickle, opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,)), name="x"); b.output(b.exp(x))
        >>> g = b.freeze()
        >>> pickle.loads(pickle.dumps(g)).equals(g, check_names=True)
        True
        """
        return _unpickle_graph, ({n: getattr(self, n) for n in _FIELDS},)

    def replace(self, **changes: Any) -> Graph:
        """The same graph with some of its arrays or tables replaced; the rest is shared, nothing is checked.

        For code that builds graphs from arrays it has already checked (file
        readers and writers, runtimes); call :meth:`verify` otherwise.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("f8", ()), name="x"); b.output(b.op("exp", x))
        >>> b.freeze().replace(outputs=[0]).outputs.tolist()
        [0]
        """
        return Graph(**{n: changes[n] if n in changes else getattr(self, n) for n in _FIELDS})

    @classmethod
    def from_arrays(
        cls,
        *,
        op_kind: Any,
        in_ptr: Any,
        in_ids: Any,
        out_ptr: Any,
        out_ids: Any,
        value_type: Any,
        types: Sequence[Any],
        op_attr: Any = None,
        attrs: Sequence[Any] = ((),),
        op_version: Any = None,
        value_producer: Any = None,
        value_index: Any = None,
        constants: Sequence[np.ndarray] = (),
        inputs: Any = None,
        outputs: Any = (),
        updates: Any = (),
        symbols: Symbols | None = None,
        file_meta: Mapping[str, Any] | None = None,
        check_types: bool = True,
    ) -> Graph:
        """Build a graph from NumPy arrays in its columnar layout, checking everything.

        The checked bulk constructor, for graphs too large to build op by op
        (10^7 ops and more; see ``docs/scale.md``). The arrays are those the
        graph keeps (see the module doc): ``op_kind`` holds registry ids
        (``get_op("add").id``), ``in_ptr``/``in_ids`` and ``out_ptr``/``out_ids``
        are CSR (op ``i``'s inputs are ``in_ids[in_ptr[i]:in_ptr[i+1]]``), and
        ``value_type`` indexes ``types``. Some may be left out:

        * ``op_attr``: all 0, with ``attrs`` defaulting to one empty entry;
        * ``op_version``: what each op's type rule selects for its inputs;
        * ``value_producer``/``value_index``: derived from the outputs;
        * ``inputs``: every value no op produces, in id order.

        Everything :meth:`verify` checks is checked (ids, CSR pointers, each
        value produced once, cycles, kinds, constants, and each op's output
        types and version against its type rule, once per distinct op
        signature), and also that attributes are normalised as the op kind's
        :meth:`~opgraph.core.registry.OpDef.normalise_attrs` gives them, and
        that the arrays hold integers that fit the graph's id type. Any
        problem raises one :class:`~opgraph.errors.VerifyError` listing them
        all, each naming the op (index and kind). It all takes a few vectorised
        passes: about 0.1-0.2 us per op.

        ``Graph(...)`` takes the same arrays without any check (for code that
        made them valid by construction, such as file readers that verify
        after loading). Either way, arrays that already have the graph's
        dtypes (``int32`` ids, ``int64`` CSR pointers) are kept, not copied,
        and made read-only; pass copies if you need to keep writing to them.

        >>> import numpy as np
        >>> from opgraph import Graph, TensorType, get_op
        >>> add, exp = get_op("add").id, get_op("exp").id
        >>> arrays = dict(
        ...     op_kind=np.array([add, exp]),      # op 0: v2 = add(v0, v1); op 1: v3 = exp(v2)
        ...     in_ptr=np.array([0, 2, 3]), in_ids=np.array([0, 1, 2]),
        ...     out_ptr=np.array([0, 1, 2]), out_ids=np.array([2, 3]),
        ...     value_type=np.zeros(4, dtype=np.int32), types=[TensorType("float64", (3,))],
        ...     outputs=[3])
        >>> g = Graph.from_arrays(**arrays)
        >>> print(g)
        graph(%0: f64[3], %1: f64[3]) {
          %2: f64[3] = add(%0, %1)
          %3: f64[3] = exp(%2)
          return %3
        }
        >>> g.run({0: np.zeros(3), 1: np.ones(3)})
        [array([2.71828183, 2.71828183, 2.71828183])]

        A bad array gives one error naming the op:

        >>> Graph.from_arrays(**{**arrays, "in_ids": np.array([0, 1, 3])})  # exp(v3) makes v3
        Traceback (most recent call last):
        ...
        opgraph.errors.VerifyError: graph is invalid (1 problem(s)):
          graph has a cycle through op 1 (exp) -> op 1 (exp)
        """
        problems: list[str] = []
        kind = _as_ids("op_kind", op_kind, INDEX, problems)
        n_ops = len(kind)

        def op_named(i: int) -> str:
            return f"op {i}" if i >= n_ops else cls._label_for(int(kind[i]), i)

        ptrs = {name: _as_ids(name, a, PTR, problems) for name, a in (("in_ptr", in_ptr), ("out_ptr", out_ptr))}
        ids = {name: _as_ids(name, a, INDEX, problems, ptr=ptrs[ptr_name], label=op_named)
               for name, ptr_name, a in (("in_ids", "in_ptr", in_ids), ("out_ids", "out_ptr", out_ids))}
        per_op = {name: _as_ids(name, a, INDEX, problems, label=op_named)
                  for name, a in (("op_attr", op_attr), ("op_version", op_version)) if a is not None}
        per_value = {name: _as_ids(name, a, INDEX, problems)
                     for name, a in (("value_type", value_type), ("value_producer", value_producer),
                                     ("value_index", value_index)) if a is not None}
        gateways = {name: _as_ids(name, a, INDEX, problems, ndim=None)
                    for name, a in (("inputs", inputs), ("outputs", outputs), ("updates", updates)) if a is not None}
        table: list[ValueType] = []
        for i, t in enumerate(types):
            try:
                table.append(as_type(t))
            except OpTypeError as exc:
                problems.append(f"types[{i}]: {exc}")
        attr_table: list[Attrs] = []
        for i, a in enumerate(attrs):
            try:
                attr_table.append(tuple((str(k), v) for k, v in (a.items() if isinstance(a, Mapping) else a)))
            except (TypeError, ValueError):
                problems.append(f"attrs[{i}]: {a!r} is not a mapping or a sequence of (name, value) pairs")
        if problems:
            raise VerifyError(problems)
        # What is left out is derived below; until then it is an empty placeholder (no memory
        # spent on arrays that are replaced), and the checks skip its length.
        derived = {name for name, a in (("op_version", op_version), ("value_producer", value_producer),
                                        ("value_index", value_index)) if a is None}
        empty = np.zeros(0, INDEX)
        fields: dict[str, Any] = dict(
            op_kind=kind, op_attr=per_op.get("op_attr", np.zeros(n_ops, INDEX)),
            op_version=per_op.get("op_version", empty), **ptrs, **ids, value_type=per_value["value_type"],
            value_producer=per_value.get("value_producer", empty), value_index=per_value.get("value_index", empty),
            types=table, attrs=attr_table, constants=constants, inputs=gateways.get("inputs", ()),
            outputs=gateways.get("outputs", ()), updates=gateways.get("updates", ()), symbols=symbols,
            file_meta=file_meta)
        graph = cls(**fields)
        # The structure first: deriving producers and inputs needs valid output ids.
        graph._verify_structure(problems, derived=derived)
        if problems:
            raise VerifyError(problems)
        if derived & {"value_producer", "value_index"}:
            producer, index = graph._derived_producers()
            fields["value_producer"] = producer if value_producer is None else fields["value_producer"]
            fields["value_index"] = index if value_index is None else fields["value_index"]
        if inputs is None:
            fields["inputs"] = np.flatnonzero(fields["value_producer"] == -1).astype(INDEX)
        if derived - {"op_version"} or inputs is None:
            arities = {k: v for k, v in graph._cache.items() if k[0] == "arity"}
            graph = cls(**fields)
            graph._cache.update(arities)  # the CSR pointers are the same arrays
        versions = graph._verify_collect(problems, check_types=check_types, fill_versions=op_version is None,
                                         strict_attrs=True, structure_checked=True)
        if problems:
            raise VerifyError(problems)
        if op_version is not None:
            return graph
        fields["op_version"] = versions
        filled = cls(**fields)
        filled._cache.update(graph._cache)  # orders, producers, arities: none depends on versions
        return filled

    def _derived_producers(self) -> tuple[np.ndarray, np.ndarray]:
        """``value_producer`` and ``value_index`` as the outputs CSR says (ids must be valid)."""
        producer = np.full(self.num_values, -1, dtype=INDEX)
        index = np.zeros(self.num_values, dtype=INDEX)
        a = self._arity("out")
        if a is not None:
            if a:
                table = self.out_ids.reshape(-1, a)
                producer[table] = np.arange(self.num_ops, dtype=INDEX)[:, None]
                index[table] = np.arange(a, dtype=INDEX)
        else:
            rows = csr_rows(self.out_ptr)
            producer[self.out_ids] = rows
            index[self.out_ids] = np.arange(len(self.out_ids)) - self.out_ptr[rows]
        return producer, index

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
            ops = csr_rows(self.in_ptr)[order]
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

    def _arity(self, side: str) -> int | None:
        """How many inputs (``side="in"``) or outputs (``"out"``) every op has; None if they differ.

        Many large graphs have one arity throughout (binary ops, one output
        each); then the CSR is a plain 2-D table and passes can reshape it
        instead of expanding row numbers per entry. Cached.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder()
        >>> x = b.input(("float64", (2,)))
        >>> b.output(b.add(b.exp(x), x))
        >>> g = b.freeze()
        >>> g._arity("in"), g._arity("out")
        (None, 1)
        """
        key = ("arity", side)
        if key not in self._cache:
            ptr = self.in_ptr if side == "in" else self.out_ptr
            n = len(ptr) - 1
            a = int(ptr[1] - ptr[0]) if n > 0 else 0
            uniform = _all_chunked(lambda lo, hi: ptr[lo + 1:hi + 1] - ptr[lo:hi] == a, n)
            self._cache[key] = a if uniform else None
        return self._cache[key]  # type: ignore[no-any-return]

    def is_topologically_ordered(self) -> bool:
        """True when every op's inputs are produced by ops before it."""
        hit = self._cache.get("ordered")
        if hit is None:
            a, n = self._arity("in"), self.num_ops
            if a == 0:
                hit = True
            elif a is not None:  # compare row by row against a broadcast column of op ids
                # Chunk by chunk, without keeping input_producers(): an ordered graph needs no more.
                vp, ids = self.value_producer, self.in_ids
                hit = _all_chunked(lambda lo, hi: vp[ids[lo * a:hi * a]].reshape(-1, a)
                                   < np.arange(lo, hi, dtype=INDEX)[:, None], n)
            else:
                vp, ids, ptr = self.value_producer, self.in_ids, self.in_ptr
                hit = _all_chunked(lambda lo, hi: vp[ids[ptr[lo]:ptr[hi]]] < csr_rows(ptr[lo:hi + 1]) + lo, n)
            self._cache["ordered"] = hit
        return hit

    def topological_order(self) -> np.ndarray:
        """Op indices in an order where producers come before consumers.

        Graphs made by a builder are already ordered (checked in one vectorised
        step) and keep their order. Others are sorted by level (the longest
        path from an op without producers), ops of one level by index; the
        order is the same whichever way it is computed: level by level with
        NumPy (wide graphs), in plain Python (deep graphs), or, for large
        graphs when numba is installed, in one compiled pass (see
        :mod:`opgraph.core.accel`). Raises :class:`GraphError` naming the ops
        on a cycle.

        >>> import numpy as np
        >>> from opgraph import Graph, TensorType, get_op
        >>> sin, exp = get_op("sin").id, get_op("exp").id
        >>> g = Graph.from_arrays(  # op 0: v2 = sin(v1), op 1: v1 = exp(v0): stored out of order
        ...     op_kind=np.array([sin, exp]), in_ptr=np.array([0, 1, 2]), in_ids=np.array([1, 0]),
        ...     out_ptr=np.array([0, 1, 2]), out_ids=np.array([2, 1]),
        ...     value_type=np.zeros(3, np.int32), types=[TensorType("float64", (2,))])
        >>> g.is_topologically_ordered(), g.topological_order()
        (False, array([1, 0], dtype=int32))
        """
        hit = self._cache.get("topo")
        if hit is not None:
            return hit
        if self.is_topologically_ordered():
            order = np.arange(self.num_ops, dtype=INDEX)
        else:
            order, cycle = self._level_order()
            if len(cycle):
                raise GraphError(self._cycle_message(cycle))
        order.flags.writeable = False
        self._cache["topo"] = order
        return order

    def op_dependencies(self) -> tuple[np.ndarray, np.ndarray]:
        """Op-to-op edges ``(src, dst)``: ``dst`` uses an output of ``src``."""
        hit = self._cache.get("op_edges")
        if hit is None:
            prod = self.input_producers()
            rows = csr_rows(self.in_ptr)
            keep = prod >= 0
            hit = self._cache["op_edges"] = (prod[keep].astype(INDEX), rows[keep])
        return hit

    def _level_order(self) -> tuple[np.ndarray, np.ndarray]:
        """``(order, cycle)``: ops by (level, index), or ops on a cycle (see ``accel._level_sort``)."""
        kernel = accel.topo_kernel(self.num_ops)
        if kernel is not None:
            ptr, pred, n = self.in_ptr, self.input_producers(), self.num_ops
            # Compiled code does not check bounds: run it only on sane arrays (a graph sorted
            # before verify() may not be); the NumPy path raises on anything else.
            if (len(ptr) == n + 1 and ptr[0] == 0 and ptr[-1] == len(pred)
                    and _all_chunked(lambda lo, hi: ptr[lo:hi] <= ptr[lo + 1:hi + 1], n)
                    and (not len(pred) or (int(pred.min()) >= -1 and int(pred.max()) < n))):
                table, arity = _padded(ptr, pred, self._arity("in"))
                order, cycle = kernel(ptr, table, arity)
                return order, cycle
        return self._kahn()

    def _kahn(self) -> tuple[np.ndarray, np.ndarray]:
        """Level-synchronous Kahn's algorithm: the NumPy path of :meth:`_level_order`."""
        n = self.num_ops
        src, dst = self.op_dependencies()
        indeg = np.bincount(dst, minlength=n)
        succ = dst[np.argsort(src, kind="stable")]
        sptr = np.zeros(n + 1, dtype=PTR)
        np.cumsum(np.bincount(src, minlength=n), out=sptr[1:])
        frontier = np.flatnonzero(indeg == 0).astype(INDEX)
        parts: list[np.ndarray] = []
        # One NumPy round per level while levels are wide (np.unique keeps each level sorted by index).
        while len(frontier) >= _NARROW:
            parts.append(frontier)
            nxt = succ[ranges(sptr[frontier], sptr[frontier + 1])]
            uniq, cnt = np.unique(nxt, return_counts=True)
            indeg[uniq] -= cnt
            frontier = uniq[indeg[uniq] == 0].astype(INDEX)
        # A narrow level means a deep graph (a chain costs one round per op), where NumPy's
        # per-call overhead dominates: finish with plain lists, still level by level.
        if len(frontier):
            deg, sp, sc = indeg.tolist(), sptr.tolist(), succ.tolist()
            level = frontier.tolist()
            tail: list[int] = []
            while level:
                tail += level
                nxt_level: list[int] = []
                for op in level:
                    for s in sc[sp[op]:sp[op + 1]]:
                        deg[s] -= 1
                        if not deg[s]:
                            nxt_level.append(s)
                nxt_level.sort()
                level = nxt_level
            parts.append(np.asarray(tail, dtype=INDEX))
        order = np.concatenate(parts).astype(INDEX, copy=False) if parts else np.zeros(0, INDEX)
        if len(order) < n:
            return np.zeros(0, INDEX), self._find_cycle(order)
        return order, np.zeros(0, INDEX)

    def _find_cycle(self, done: np.ndarray) -> np.ndarray:
        """Ops on one cycle, each using an output of the next (the last: of the first).

        ``done`` are the ops Kahn's algorithm could order. Every other op has
        a producer that is not done either (else it would have been ordered),
        so walking from producer to such producer must come back to an op
        already on the walk; from there on, the walk is a cycle.
        """
        stuck = np.ones(self.num_ops, dtype=bool)
        stuck[done] = False
        prod, ptr = self.input_producers(), self.in_ptr
        op = int(np.argmax(stuck))
        seen: dict[int, int] = {}
        walk: list[int] = []
        while op not in seen:
            seen[op] = len(walk)
            walk.append(op)
            op = next(int(p) for p in prod[ptr[op]:ptr[op + 1]] if p >= 0 and stuck[p])
        return np.asarray(walk[seen[op]:], dtype=INDEX)

    def _cycle_message(self, cycle: np.ndarray) -> str:
        # In data-flow order (producer first), starting from the lowest op index, so the
        # message does not depend on where the search entered the cycle.
        flow = [int(op) for op in cycle[::-1]]
        start = flow.index(min(flow))
        flow = flow[start:] + flow[:start]
        shown = [self._op_label(op) for op in flow[:_CYCLE_SHOWN]]
        if len(flow) > _CYCLE_SHOWN:
            shown.append(f"... ({len(flow)} ops on the cycle)")
        return "graph has a cycle through " + " -> ".join([*shown, self._op_label(flow[0])])

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
        succ = self.out_ids[ranges(self.out_ptr[cons], self.out_ptr[cons + 1])]
        counts = np.bincount(csr_rows(ptr), weights=n_out, minlength=self.num_values).astype(PTR)
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

        Every check is a few vectorised passes over the arrays (in chunks, so
        temporaries stay small), and the detailed messages are worked out only
        when a pass finds something wrong: a valid graph of 10^7 ops verifies
        in about a second.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder()
        >>> b.output(b.exp(b.input(("float64", (2,)))))
        >>> g = b.freeze()
        >>> g.verify() is g
        True
        """
        problems: list[str] = []
        self._verify_collect(problems, check_types=check_types)
        for body in subgraphs_of(self, recursive=True):  # each body once, however often and deep it is used
            found: list[str] = []
            body.graph._verify_collect(found, check_types=check_types)
            problems.extend(f"in body {body.label}: {p}" for p in found)
        if problems:
            raise VerifyError(problems)
        return self

    @property
    def subgraphs(self) -> tuple[Subgraph, ...]:
        """The bodies (:class:`~opgraph.core.subgraph.Subgraph`) this graph's ops use, first use first.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); b.output(b.exp(b.input(("float64", (2,)))))
        >>> b.freeze().subgraphs
        ()
        """
        return subgraphs_of(self)

    def _verify_collect(self, problems: list[str], *, check_types: bool = True, fill_versions: bool = False,
                        strict_attrs: bool = False, structure_checked: bool = False) -> np.ndarray | None:
        """Append every problem to ``problems``; with ``fill_versions``, return the versions the type rules select."""
        try:
            return self._verify_into(problems, check_types, fill_versions, strict_attrs, structure_checked)
        except Exception as exc:  # a broken graph must still give a report
            if not problems:
                raise
            problems.append(f"verification stopped early: {type(exc).__name__}: {exc}")
            return None

    def _op_label(self, op: int) -> str:
        return self._label_for(int(self.op_kind[op]), op)

    @staticmethod
    def _label_for(kind: int, op: int) -> str:
        """``op 3 (add)``: how problems name an op (unknown kinds included)."""
        try:
            name = get_op(kind).name
        except KeyError:
            name = f"<unknown kind {kind}>"
        return f"op {op} ({name})"

    def _verify_structure(self, problems: list[str], derived: Collection[str] = ()) -> None:
        """Array lengths, CSR pointers and ids in range: what every other check relies on.

        ``derived`` names arrays that are placeholders still to be derived (their lengths are not checked).
        """
        n_ops, n_vals = self.num_ops, self.num_values
        for name in ("op_attr", "op_version"):
            if name not in derived and len(getattr(self, name)) != n_ops:
                problems.append(f"{name} has {len(getattr(self, name))} entries for {n_ops} ops")
        for name in ("value_producer", "value_index"):
            if name not in derived and len(getattr(self, name)) != n_vals:
                problems.append(f"{name} has {len(getattr(self, name))} entries for {n_vals} values")
        for ptr_name, ids_name in (("in_ptr", "in_ids"), ("out_ptr", "out_ids")):
            why = self._csr_problem(ptr_name, ids_name)
            if why:
                problems.append(f"{ptr_name} is not a valid CSR pointer for {n_ops} ops and "
                                f"{len(getattr(self, ids_name))} ids: {why}")
        if problems:
            return
        # Dangling ids. Seen as unsigned, a negative id is huge, so one comparison finds both kinds.
        for ids_name, ptr, role in (("in_ids", self.in_ptr, "input"), ("out_ids", self.out_ptr, "output")):
            ids = getattr(self, ids_name)
            if _any_outside(ids, n_vals):
                bad = np.flatnonzero(_outside(ids, n_vals))[:20]
                for k, op in zip(bad.tolist(), _entry_rows(ptr, bad).tolist(), strict=True):
                    problems.append(f"{self._op_label(op)}: {role} refers to value {int(ids[k])}, "
                                    f"which does not exist (graph has {n_vals} values)")
        for name in ("inputs", "outputs"):
            ids = getattr(self, name)
            for v in ids[_outside(ids, n_vals)][:20]:
                problems.append(f"{name} gateway refers to value {int(v)}, which does not exist")
        up = self.updates.reshape(-1)
        for v in up[_outside(up, n_vals)][:20]:
            problems.append(f"update (copy) gateway refers to value {int(v)}, which does not exist")

    def _verify_into(self, problems: list[str], check_types: bool, fill_versions: bool = False,
                     strict_attrs: bool = False, structure_checked: bool = False) -> np.ndarray | None:
        if not structure_checked:
            self._verify_structure(problems)
            if problems:
                return None
        n_vals = self.num_values
        # Producers: a few whole-array comparisons decide whether all is well; only if not
        # are the (costlier) per-value diagnostics computed.
        if not self._producers_consistent():
            self._producer_problems(problems)
        if len(self.updates):
            is_input = np.zeros(n_vals, dtype=bool)
            is_input[self.inputs] = True
            for src, dst in self.updates.tolist():
                if not is_input[dst]:
                    problems.append(f"update (copy) destination value {dst} is not an input")
                elif self.types[self.value_type[src]] != self.types[self.value_type[dst]]:
                    problems.append(f"update (copy) {src} -> {dst} changes type "
                                    f"{self.types[self.value_type[src]]} -> {self.types[self.value_type[dst]]}")
        # Tables.
        n_before = len(problems)
        for name, table in (("value_type", self.types), ("op_attr", self.attrs)):
            ids = getattr(self, name)
            if _any_outside(ids, len(table)):
                for k in np.flatnonzero(_outside(ids, len(table)))[:20].tolist():
                    what = f"value {k}" if name == "value_type" else self._op_label(k)
                    problems.append(f"{what}: {name} {int(ids[k])} is not in its table ({len(table)} entries)")
        unknown = set()
        for k in self._kinds().tolist():
            try:
                get_op(k)
            except KeyError:
                unknown.add(k)
        for k in sorted(unknown):
            first = int(np.argmax(self.op_kind == k))
            problems.append(f"op {first}: unknown op kind id {k}")
        if len(problems) > n_before:
            return None
        # Cycles.
        try:
            self.topological_order()
        except GraphError as exc:
            problems.append(str(exc))
        self._verify_constants(problems)
        if (check_types or fill_versions) and not unknown:
            return self._verify_types(problems, fill_versions=fill_versions, strict_attrs=strict_attrs)
        return None

    def _kinds(self) -> np.ndarray:
        """The distinct op kind ids, sorted (cached)."""
        hit = self._cache.get("kinds")
        if hit is None:
            hit = self._cache["kinds"] = _distinct_small_ints(self.op_kind)
        return hit  # type: ignore[no-any-return]

    def _csr_problem(self, ptr_name: str, ids_name: str) -> str | None:
        """What is wrong with a CSR pointer, naming the first op where it goes wrong (None if nothing)."""
        ptr, n_ids, n_ops = getattr(self, ptr_name), len(getattr(self, ids_name)), self.num_ops
        if len(ptr) != n_ops + 1:
            return f"it has {len(ptr)} entries, not {n_ops + 1}"
        if ptr[0] != 0:
            return f"{ptr_name}[0] is {int(ptr[0])}, not 0"
        if n_ops and not _all_chunked(lambda lo, hi: ptr[lo:hi] <= ptr[lo + 1:hi + 1], n_ops):
            op = int(np.argmax(ptr[:-1] > ptr[1:]))
            return (f"it decreases at {self._op_label(op)} ({ptr_name}[{op}] = {int(ptr[op])}, "
                    f"{ptr_name}[{op + 1}] = {int(ptr[op + 1])})")
        if ptr[-1] != n_ids:
            return f"it ends at {int(ptr[-1])}, but {ids_name} has {n_ids} entries"
        return None

    def _producers_consistent(self) -> bool:
        """True when outputs, ``value_producer``, ``value_index`` and the inputs gateway all agree.

        Exactly when :meth:`_producer_problems` would find nothing: if every
        output entry (op ``r``, position ``p``, value ``v``) has
        ``value_producer[v] == r`` and ``value_index[v] == p``, no value is
        produced twice (two entries would need the same op and position);
        then the values not produced are the rest, and they must be exactly
        the declared inputs, each marked -1.
        """
        n_vals, n_out = self.num_values, len(self.out_ids)
        vp, vi, out_ids = self.value_producer, self.value_index, self.out_ids
        a = self._arity("out")
        if a is not None and a > 0:  # op r's outputs are out_ids[r*a:(r+1)*a]: compare as a table
            def agree(lo: int, hi: int) -> np.ndarray:
                ids = out_ids[lo * a:hi * a].reshape(-1, a)
                return (vp[ids] == np.arange(lo, hi, dtype=INDEX)[:, None]) & (vi[ids] == np.arange(a, dtype=INDEX))
            if not _all_chunked(agree, self.num_ops):
                return False
        elif a is None:
            ptr = self.out_ptr

            def agree_csr(lo: int, hi: int) -> np.ndarray:
                rows = csr_rows(ptr[lo:hi + 1])
                ids = out_ids[ptr[lo]:ptr[hi]]
                pos = np.arange(ptr[lo], ptr[hi]) - ptr[lo:hi][rows]
                return (vp[ids] == rows + lo) & (vi[ids] == pos)

            if not _all_chunked(agree_csr, self.num_ops):
                return False
        n_free = n_vals - n_out
        if np.count_nonzero(vp == -1) != n_free or len(self.inputs) != n_free:
            return False
        return bool(np.all(vp[self.inputs] == -1)) and len(np.unique(self.inputs)) == n_free

    def _producer_problems(self, problems: list[str]) -> None:
        n_vals = self.num_values
        counts = np.bincount(self.out_ids, minlength=n_vals)
        out_rows = csr_rows(self.out_ptr)
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

    def _verify_constants(self, problems: list[str]) -> None:
        """Const ops: a constant index in the table, no inputs, one output whose type fits the constant."""
        ops = np.flatnonzero(self.op_kind == CONST.id)
        if not len(ops):
            return
        # The index sits in the op's attributes; many const ops may share an attribute entry.
        attr_ids, where = np.unique(self.op_attr[ops], return_inverse=True)
        index = np.array([_const_index_fast(self.attrs[a]) for a in attr_ids.tolist()], dtype=np.int64)[where]
        bad_index = (index < 0) | (index >= len(self.constants))
        bad_arity = ~bad_index & ((self.out_ptr[ops + 1] - self.out_ptr[ops] != 1)
                                  | (self.in_ptr[ops + 1] != self.in_ptr[ops]))
        ok = ~(bad_index | bad_arity)
        found: list[tuple[int, str]] = []
        for op in ops[bad_index].tolist():
            idx = dict(self.attrs[int(self.op_attr[op])]).get("index")  # as stored: it may not even be an int
            found.append((op, f"op {op} (const): constant index {idx!r} not in the constants table"))
        for op in ops[bad_arity].tolist():
            found.append((op, f"op {op} (const): must have no inputs and one output"))
        # Whether a type accepts a constant depends only on the constant's dtype and shape:
        # intern those, then check each distinct (type, dtype and shape) pair once.
        ok_ops, ok_index = ops[ok], index[ok]
        out_type = self.value_type[self.out_ids[self.out_ptr[ok_ops]]]
        used, used_at = np.unique(ok_index, return_inverse=True)
        forms: dict[tuple[np.dtype, tuple[int, ...]], int] = {}
        consts = self.constants
        # (dtype, shape) keys: equal dtypes (byte order included) hash alike, and cost less than dtype.str.
        form_of = np.array([forms.setdefault((consts[c].dtype, consts[c].shape), len(forms))
                            for c in used.tolist()], dtype=np.int64)
        pair = out_type.astype(np.int64) * max(len(forms), 1) + form_of[used_at] if len(used) else out_type
        verdict: dict[int, bool] = {}
        for k, p in enumerate(pair.tolist()):
            if p not in verdict:
                t = self.types[int(out_type[k])]
                verdict[p] = isinstance(t, TensorType) and t.accepts(self.constants[int(ok_index[k])])
            if not verdict[p]:
                op, idx = int(ok_ops[k]), int(ok_index[k])
                found.append((op, f"op {op} (const): output type {self.types[int(out_type[k])]} does not "
                                  f"match constant {idx} ({TensorType.of(self.constants[idx])})"))
        problems.extend(msg for _, msg in sorted(found))

    def _arity_groups(self) -> Iterator[tuple[int, int, slice | np.ndarray]]:
        """Non-const ops grouped by (inputs, outputs) count: ``(a_in, a_out, ops)``, ``ops`` in index order.

        ``ops`` is a slice when one group holds every op (no gathers needed).
        """
        n = self.num_ops
        a_in, a_out = self._arity("in"), self._arity("out")
        is_const = self.op_kind == CONST.id
        if a_in is not None and a_out is not None and not is_const.any():
            if n:
                yield a_in, a_out, slice(0, n)
            return
        n_in, n_out = np.diff(self.in_ptr), np.diff(self.out_ptr)
        width = int(n_out.max(initial=0)) + 1
        key = n_in * width + n_out
        key[is_const] = -1
        groups = _distinct_small_ints(key)
        groups = groups[groups >= 0]
        if len(groups) <= 8:  # a pass per group beats sorting
            for g in groups.tolist():
                yield g // width, g % width, np.flatnonzero(key == g)
            return
        order = np.argsort(key, kind="stable")
        bounds = [*np.searchsorted(key[order], groups).tolist(), n]
        for g, lo, hi in zip(groups.tolist(), bounds[:-1], bounds[1:], strict=True):
            yield g // width, g % width, order[lo:hi]

    def _verify_types(self, problems: list[str], *, fill_versions: bool = False,
                      strict_attrs: bool = False) -> np.ndarray | None:
        """Check each op's output types and version against its type rule, once per distinct signature.

        A signature is (kind, attributes, version, input types, output types);
        with ``fill_versions`` the version is left out and the versions the
        type rules select are returned, one per op (None if a problem was found).
        """
        versions = np.zeros(self.num_ops, dtype=INDEX) if fill_versions else None
        # signature -> (problem found, version the type rule selects)
        results: dict[tuple[int, ...], tuple[bool, int]] = {}
        reported = 0
        # Known ranges of the signature columns: kind ids, attribute and type tables, versions.
        kinds = self._kinds()
        head = [(int(kinds[0]), int(kinds[-1])) if len(kinds) else (0, 0), (0, len(self.attrs) - 1)]
        if not fill_versions:
            head.append((int(self.op_version.min(initial=0)), int(self.op_version.max(initial=0))))
        for a_in, a_out, ops in self._arity_groups():
            count = ops.stop if isinstance(ops, slice) else len(ops)
            # In chunks, so the temporaries stay small (and in cache) however large the graph is.
            for start in range(0, count, _CHUNK):
                chunk = slice(start, min(count, start + _CHUNK)) if isinstance(ops, slice) \
                    else ops[start:start + _CHUNK]
                cols = self._signature_columns(chunk, a_in, a_out, with_version=not fill_versions)
                bounds = [*head, *[(0, len(self.types) - 1)] * (a_in + a_out)]
                packable = math.prod(hi - lo + 1 for lo, hi in bounds) < 1 << 62
                # Packed with the table sizes when they fit in an int64 key, else with this chunk's ranges.
                exact = _pack_columns(cols, bounds) if packable else None
                exact = exact or _pack_columns(cols)
                if exact is not None:
                    key, sizes, offsets = exact
                    total = math.prod(sizes)
                    # Few possible keys (the usual case): counting them is cheaper than hashing.
                    sigs = (np.flatnonzero(np.bincount(key, minlength=total)) if total <= 4 * len(key) + 4096
                            else np.unique(key))
                    rows = [_unpack(k, sizes, offsets) for k in sigs.tolist()]
                else:  # too many distinct values to pack into one int64: unique rows (a sort)
                    table = np.stack(cols, axis=1)
                    distinct, key = np.unique(table, axis=0, return_inverse=True)
                    key = key.reshape(-1)
                    rows = distinct.tolist()
                    sigs = np.arange(len(rows))
                new = [i for i, row in enumerate(rows) if tuple(row) not in results]
                if len(new) > 16:  # one sort finds every first occurrence
                    first_at = np.unique(key, return_index=True)[1]
                    firsts = {i: int(first_at[i]) for i in new}
                else:  # usually none after the first chunk: a pass for each
                    firsts = {i: int(np.argmax(key == sigs[i])) for i in new}
                chunk_versions = []
                for i, row in enumerate(rows):
                    sig = tuple(row)
                    hit = results.get(sig)
                    if hit is None:
                        op = start + firsts[i] if isinstance(chunk, slice) else int(chunk[firsts[i]])
                        hit = results[sig] = self._check_signature(problems, op, row, a_in, not fill_versions,
                                                                   strict_attrs)
                        reported += hit[0]
                        if reported >= 50:
                            return None
                    chunk_versions.append(hit[1])
                if versions is not None:
                    if len(set(chunk_versions)) == 1:
                        versions[chunk] = chunk_versions[0]
                    else:
                        versions[chunk] = np.asarray(chunk_versions, dtype=INDEX)[np.searchsorted(sigs, key)]
        if versions is not None:
            is_const = self.op_kind == CONST.id
            if is_const.any():
                versions[is_const] = int(CONST.version((), {}))
        return None if reported else versions

    def _signature_columns(self, chunk: slice | np.ndarray, a_in: int, a_out: int, *,
                           with_version: bool) -> list[np.ndarray]:
        """Kind, attribute id, (version,) input type ids, output type ids of the ops in ``chunk``."""
        cols = [self.op_kind[chunk], self.op_attr[chunk]]
        if with_version:
            cols.append(self.op_version[chunk])
        for ptr, ids, a in ((self.in_ptr, self.in_ids, a_in), (self.out_ptr, self.out_ids, a_out)):
            if not a:
                continue
            if isinstance(chunk, slice):  # every op has a entries: the ids are a plain table
                table = self.value_type[ids[chunk.start * a:chunk.stop * a]].reshape(-1, a)
            else:
                table = self.value_type[ids[ptr[chunk][:, None] + np.arange(a)]]
            cols.extend(table[:, j] for j in range(a))
        return cols

    def _check_signature(self, problems: list[str], op: int, row: list[int], a_in: int, has_version: bool,
                         strict_attrs: bool) -> tuple[bool, int]:
        """Run the type rule for one signature row (see :meth:`_verify_types`).

        Appends at most one problem, naming ``op`` (the first op with this
        signature); returns (whether it did, the version the rule selects).
        """
        opdef = get_op(row[0])
        attrs = self.attrs[row[1]]
        first_type = 3 if has_version else 2
        in_types = tuple(self.types[t] for t in row[first_type:first_type + a_in])
        out_types = tuple(self.types[t] for t in row[first_type + a_in:])
        label = f"op {op} ({opdef.name})"
        if strict_attrs:
            try:
                normal = opdef.normalise_attrs(dict(attrs))
            except OpTypeError as exc:
                problems.append(f"{label}: attributes {dict(attrs)} rejected: {exc}")
                return True, 0
            if not _same_attrs(normal, attrs):
                problems.append(f"{label}: attributes {attrs} are not normalised; expected {normal} "
                                f"(as {opdef.name}'s normalise_attrs gives them)")
                return True, 0
        try:
            opdef.check_arity(a_in)
            expect = tuple(opdef.infer(in_types, dict(attrs)))
            version = int(opdef.version(in_types, dict(attrs)))
        except OpTypeError as exc:
            problems.append(f"{label}: type rule rejects inputs {in_types}: {exc}")
            return True, 0
        except Exception as exc:  # a rule that crashes on these attributes or types: report, keep checking
            problems.append(f"{label}: type rule failed on inputs {in_types} and attributes "
                            f"{dict(attrs)}: {type(exc).__name__}: {exc}")
            return True, 0
        if expect != out_types:
            problems.append(f"{label}: outputs have types {out_types}, the type rule gives {expect}")
            return True, version
        if has_version and version != row[2]:
            problems.append(f"{label}: version {row[2]}, the inputs select {version}")
            return True, version
        return False, version

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
        """A readable listing, one op per line in topological order (``limit`` ops at most).

        Bodies of control-flow ops are shown as ``@name`` in the op's
        attributes and listed after the graph, each once.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,)), name="x"); b.output(b.exp(x))
        >>> print(b.freeze().dump())
        graph(%x: f64[2]) {
          %1: f64[2] = exp(%x)
          return %1
        }
        """
        bodies = subgraphs_of(self, recursive=True)
        labels: dict[Subgraph, str] = {}
        for i, body in enumerate(bodies):
            label = f"@{body.name or f'body{i}'}"
            labels[body] = label if label not in labels.values() else f"{label}#{i}"
        lines = self._dump_lines(limit, labels)
        for body in bodies:
            sub = body.graph._dump_lines(limit, labels)
            lines.append(f"{labels[body]} = {sub[0]}")
            lines.extend(sub[1:])
        return "\n".join(lines)

    def _dump_lines(self, limit: int | None, labels: Mapping[Subgraph, str]) -> list[str]:
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
            lines.append("  " + self._op_line(int(op), labels))
        if len(self.outputs):
            lines.append("  return " + ", ".join(self.value_label(int(v)) for v in self.outputs))
        for src, dst in self.updates:
            lines.append(f"  update {self.value_label(int(src))} -> {self.value_label(int(dst))}")
        lines.append("}")
        return lines

    def _op_line(self, op: int, labels: Mapping[Subgraph, str] | None = None) -> str:
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
            def show(v: Any) -> str:
                if isinstance(v, Subgraph):
                    return labels[v] if labels and v in labels else f"@{v.name or 'body'}"
                return repr(v)

            attr_s = " {" + ", ".join(f"{k}={show(v)}" for k, v in attrs.items()) + "}"
        name = self.symbols.ops.get(op)
        tail = f"  # {name}" if name else ""
        return f"{lhs} = {kind}({args}){attr_s}{tail}"

    # ------------------------------------------------------------ running
    def run(self, feeds: Mapping[Any, Any] | None = None, targets: Sequence[Any] | None = None,
            *, backend: str = "numpy", **kw_feeds: Any) -> list[np.ndarray]:
        """Evaluate ``targets`` (default: the graph's outputs) from ``feeds``.

        Only the ops the targets need run. Inputs are fed by a dict, by
        keywords, or both: ``run({"x": a})``, ``run(x=a)``. Dict keys are
        value ids, names, ``"%x"`` (the label dumps and the command line use)
        or :class:`Value` handles; a keyword is an input's name. Feeding one
        input twice is a :class:`~opgraph.errors.FeedError`
        (:func:`opgraph.core.feeds.resolve_feeds` is the rule, shared by every
        runtime). ``targets`` and ``backend`` are this method's parameters: an
        input with one of those names is fed through the dict, which always
        works. Targets are ids, names or Values too.

        >>> import numpy as np, opgraph
        >>> b = opgraph.GraphBuilder()
        >>> x = b.input(("float64", (2,)), name="x")
        >>> b.output(b.op("square", x))
        >>> g = b.freeze()
        >>> g.run({"x": np.array([3.0, 4.0])})
        [array([ 9., 16.])]
        >>> g.run(x=np.array([3.0, 4.0]))[0], g.run({"%x": np.array([1.0, 2.0])})[0]
        (array([ 9., 16.]), array([1., 4.]))
        """
        from opgraph.core.feeds import resolve_feeds, target_ids  # feeds imports this module

        ids = resolve_feeds(self, feeds, kw_feeds)
        tids = None if targets is None else target_ids(self, targets)
        # Running is opgraph.runtime's job (a layer above core): it fills this hook when imported.
        return hooks.RUN.get()(self, ids, tids, backend=backend)


class GraphAndWeights(NamedTuple):
    """A graph whose data are inputs, and their values: it unpacks as ``graph, weights = ...``.

    ``weights`` maps input names to their values (NumPy arrays, in the graph's input order), ready to feed
    (``graph.run({**weights, "x": x})``), to differentiate for, and to write back by name
    (``to_onnx(graph, weights=...)``, a torch ``state_dict``). What
    ``from_onnx(model, weights_as_inputs=True)`` (the initializers) and ``OpGraph.to_graph(data="inputs")`` (the
    tensors holding data) return; ``OpGraph.from_graph`` takes it back.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); w = b.input(("float64", (2,)), name="w"); b.output(b.op("exp", w))
    >>> graph, weights = GraphAndWeights(b.freeze(), {"w": np.zeros(2)})
    >>> graph.run(weights)
    [array([1., 1.])]
    """

    graph: Graph
    weights: dict[str, np.ndarray]


_NARROW = 64
"""Frontier size below which level-wise walks switch from NumPy to plain lists."""
_FIELDS = ("op_kind", "op_attr", "op_version", "in_ptr", "in_ids", "out_ptr", "out_ids", "value_type",
           "value_producer", "value_index", "types", "attrs", "constants", "inputs", "outputs", "updates",
           "symbols", "file_meta")
"""The arrays and tables a graph is made of: its constructor's arguments (the rest is derived)."""


def _unpickle_graph(fields: dict[str, Any]) -> Graph:
    return Graph(**fields)


_CHUNK = 1 << 18
"""Rows per chunk in the chunked checks of verify(): big enough to amortise NumPy's per-call
cost, small enough that the temporaries stay in cache and are not fresh pages each time."""
_CYCLE_SHOWN = 10
"""Ops of a cycle named in the error message."""


def _as_ids(name: str, a: Any, dtype: type, problems: list[str], *, ptr: np.ndarray | None = None,
            label: Callable[[int], str] | None = None, ndim: int | None = 1) -> np.ndarray:
    """``a`` as a contiguous integer array of ``dtype`` for :meth:`Graph.from_arrays`.

    A plain cast would wrap values that do not fit around (an int64 id of
    2^32 + 1 would become 1); those are reported instead, naming the op
    (``label``) when the array is per op, or per CSR entry of ``ptr``.

    >>> problems = []
    >>> _as_ids("in_ids", np.array([1, 2**32 + 1]), INDEX, problems)
    array([0, 0], dtype=int32)
    >>> problems
    ['in_ids[1] is 4294967297, outside the int32 range of graph ids']
    """
    arr = np.asarray(a)
    if arr.size == 0:
        return np.zeros((0, 2) if name == "updates" else 0, dtype=dtype)
    if ndim is not None and arr.ndim != ndim:
        problems.append(f"{name} must be one-dimensional, not of shape {arr.shape}")
        return np.zeros(arr.size, dtype=dtype)
    if arr.dtype.kind not in "iu":
        problems.append(f"{name} must hold integers, not {arr.dtype}")
        return np.zeros(arr.shape, dtype=dtype)
    if not np.can_cast(arr.dtype, dtype):
        info = np.iinfo(dtype)
        flat = arr.reshape(-1)
        out = np.empty(flat.shape, dtype=dtype)

        def fits(lo: int, hi: int) -> np.ndarray:
            # Checked and converted a chunk at a time: one pass over memory instead of three.
            part = flat[lo:hi]
            ok = np.array(part.min() >= info.min and part.max() <= info.max)
            out[lo:hi] = part
            return ok

        if _all_chunked(fits, len(flat)):
            return out.reshape(arr.shape)
        bad = np.flatnonzero((flat < info.min) | (flat > info.max))[:20]
        ops: list[int | None] = [None] * len(bad)
        if label is not None and ptr is None:
            ops = bad.tolist()
        elif label is not None and ptr is not None and len(ptr) and ptr[0] == 0 and np.all(ptr[:-1] <= ptr[1:]):
            ops = _entry_rows(ptr, bad).tolist()
        for k, op in zip(bad.tolist(), ops, strict=True):
            where = "" if op is None or label is None else f"{label(op)}: "
            problems.append(f"{where}{name}[{k}] is {int(flat[k])}, outside the "
                            f"{np.dtype(dtype).name} range of graph ids")
        return np.zeros(arr.shape, dtype=dtype)
    return np.ascontiguousarray(arr, dtype=dtype)


def _padded(ptr: np.ndarray, entries: np.ndarray, arity: int | None) -> tuple[np.ndarray, int]:
    """CSR entries as a table with a fixed number of entries per row (padded with -1), when cheap.

    Returns ``(table, width)``, or ``(entries, -1)`` to keep the CSR. A walk
    over a table finds a row's entries without reading the row pointers,
    one cache miss fewer per row on large graphs. Rows of up to 4 entries
    are padded when that at most doubles the entries.

    >>> _padded(np.array([0, 2, 3, 3]), np.array([5, 6, 7]), None)
    (array([ 5,  6,  7, -1, -1, -1]), 2)
    """
    if arity is not None:
        return entries, arity
    n = len(ptr) - 1
    width = int((ptr[1:] - ptr[:-1]).max(initial=0))
    if width > 4 or n * width > 2 * len(entries) + n:
        return entries, -1
    table = np.full((n, width), -1, dtype=entries.dtype)
    rows = csr_rows(ptr)
    table[rows, np.arange(len(entries)) - ptr[rows]] = entries
    return table.reshape(-1), width


def _all_chunked(test: Callable[[int, int], np.ndarray], n: int) -> bool:
    """True when ``test(lo, hi)`` is all true for every chunk ``[lo, hi)`` of ``range(n)``.

    >>> a = np.arange(10)
    >>> _all_chunked(lambda lo, hi: a[lo:hi] < 10, 10), _all_chunked(lambda lo, hi: a[lo:hi] < 9, 10)
    (True, False)
    """
    return all(bool(test(lo, min(n, lo + _CHUNK)).all()) for lo in range(0, n, _CHUNK))


def _outside(ids: np.ndarray, n: int) -> np.ndarray:
    """Mask of the ids not in ``range(n)``."""
    if ids.dtype == INDEX:  # as unsigned, negative ids are huge: one comparison finds both kinds
        return ids.view(np.uint32) >= n
    return (ids < 0) | (ids >= n)


def _any_outside(ids: np.ndarray, n: int) -> bool:
    """True when some id is not in ``range(n)`` (chunked, no full-size temporary)."""
    return not _all_chunked(lambda lo, hi: ~_outside(ids[lo:hi], n), len(ids))


def _entry_rows(ptr: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """The CSR row (op) of each of a few ``entries`` (a binary search each, no full expansion)."""
    return np.searchsorted(ptr, entries, side="right") - 1


def _distinct_small_ints(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values of an integer array (a bincount when they are small and non-negative).

    >>> _distinct_small_ints(np.array([5, 3, 5, 0]))
    array([0, 3, 5])
    """
    if not len(a):
        return np.zeros(0, dtype=np.int64)
    lo, hi = int(a.min()), int(a.max())
    if lo >= 0 and hi < 1 << 22:
        return np.flatnonzero(np.bincount(a, minlength=hi + 1))
    return np.unique(a).astype(np.int64)


def _pack_columns(cols: Sequence[np.ndarray], bounds: Sequence[tuple[int, int]] | None = None,
                  ) -> tuple[np.ndarray, list[int], list[int]] | None:
    """One exact int64 key per row of the columns (mixed radix), or None when it would overflow.

    Each column is offset by its lowest value and scaled by the ranges of the
    columns after it, so equal keys mean equal rows, with no hashing and no
    collision check. ``bounds`` are (lowest, highest) per column when known
    (table sizes, say), else they are measured. ``_unpack`` gives a row back
    from its key; the keys lie in ``range(math.prod(sizes))``.

    >>> key, sizes, offsets = _pack_columns([np.array([7, 7, 8]), np.array([1, 2, 1])])
    >>> key.tolist(), _unpack(int(key[1]), sizes, offsets)
    ([0, 1, 2], [7, 2])
    """
    if bounds is None:
        bounds = [(int(c.min()), int(c.max())) for c in cols]
    offsets = [lo for lo, _ in bounds]
    sizes = [hi - lo + 1 for lo, hi in bounds]
    if math.prod(sizes) >= 1 << 62:
        return None
    key = cols[0].astype(np.int64)
    if offsets[0]:
        key -= offsets[0]
    for c, lo, size in zip(cols[1:], offsets[1:], sizes[1:], strict=True):
        key *= size
        key += c
        if lo:
            key -= lo
    return key, sizes, offsets


def _unpack(key: int, sizes: list[int], offsets: list[int]) -> list[int]:
    """The row of column values packed into ``key`` by :func:`_pack_columns`."""
    row = []
    for size, lo in zip(sizes[::-1], offsets[::-1], strict=True):
        key, digit = divmod(key, size)
        row.append(digit + lo)
    return row[::-1]


def _same_attrs(a: Attrs, b: Attrs) -> bool:
    """Equal attributes, telling apart values Python calls equal (1 and 1.0) where possible."""
    try:
        return bool(exact_key(a) == exact_key(b))
    except TypeError:
        return bool(a == b)


def _reach(ptr: np.ndarray, adj: np.ndarray, start: np.ndarray, n: int) -> np.ndarray:
    """Mask of the nodes reachable from ``start`` (included) along a CSR adjacency.

    Entries of ``adj`` below 0 are ignored. Wide frontiers are expanded with
    NumPy, narrow ones (deep graphs) with plain lists.
    """
    mask = np.zeros(n, dtype=bool)
    frontier = np.unique(start)
    while len(frontier) >= _NARROW:
        mask[frontier] = True
        nxt = adj[ranges(ptr[frontier], ptr[frontier + 1])]
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


def ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, e)`` for each pair (int64; empty and reversed pairs give nothing), vectorised.

    >>> ranges(np.array([3, 10, 7]), np.array([5, 10, 9])).tolist()
    [3, 4, 7, 8]
    """
    starts = np.asarray(starts, dtype=PTR)
    lengths = np.asarray(ends, dtype=PTR) - starts
    keep = lengths > 0
    if not keep.all():
        starts, lengths = starts[keep], lengths[keep]
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=PTR)
    out = np.ones(total, dtype=PTR)
    offsets = np.cumsum(lengths) - lengths
    out[0] = starts[0]
    out[offsets[1:]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    return np.cumsum(out, out=out)


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
