"""GraphBuilder: append ops one by one, then ``freeze()`` into a :class:`Graph`.

This is also seed 003's explicit builder: inputs (``placeholder`` is the same
method), constants (``const``), ops, gradients later, and
``run(feeds, targets)`` on the needed subgraph.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input("float64", (2, 2), name="x")
    >>> w = b.constant(np.eye(2) * 3)
    >>> y = b.matmul(x, w)            # any registered op is a method
    >>> z = b.add(y, 1.0)             # Python numbers become constants
    >>> b.run({x: np.ones((2, 2))}, [z])[0]
    array([[4., 4.],
           [4., 4.]])

With ``hash_cons=True`` (the default) an op identical to an earlier one on
the same inputs returns the earlier outputs: common-subexpression
elimination while building.

    >>> b.matmul(x, w) == y
    True

How it is stored, and why: a builder of 10^7 ops must append an op in about
a microsecond and hold under 100 bytes per op, with the garbage collector
on. So it keeps no Python object per op or value. Every column is an
``array.array`` of unsigned machine integers (CPython stores those without
the slow argument parser its signed codes go through; the garbage collector
never looks inside), and ``freeze()`` derives the :class:`Graph`'s NumPy
columns from them in a few vectorised steps. Per op the builder keeps:

* a *signature* id: kind, attributes, version and output types, interned
  per builder (all ``add`` ops on two ``f64[8]`` share one);
* two input slots: the inputs of an op with at most two of them, else a
  row of a separate CSR table for the rare wider op;
* nothing for its outputs: outputs are numbered in op order, so the first
  output of op ``o`` is ``o`` plus an offset that changes only at an input
  placeholder or an op with other than one output (a short list of
  breakpoints).

Per value it keeps the type id and, for hash-consing, the head of the chain
of ops whose youngest input is that value (a second column links the chain).
Consumers of a value are mostly built soon after it, so a lookup touches
memory that is still in cache, where a global hash table would miss the
cache once per op; a value with many consumers moves its chain to a dict.
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import index as _index
from typing import Any, overload

import numpy as np

from opgraph.core import hooks
from opgraph.core.dtypes import as_dtype
from opgraph.core.graph import INDEX, PTR, Graph, Op, Symbols, Value
from opgraph.core.intern import Interner
from opgraph.core.registry import CONST, Attrs, OpDef, build_error, exact_key, get_op, resolve
from opgraph.core.types import TensorType, ValueType, as_type, dtype_and_shape, is_shape
from opgraph.errors import GraphError, OpTypeError

ValueLike = Value | int | float | bool | complex | np.ndarray | np.generic

_IDS = "I"
"""array code of id columns: unsigned 32-bit (ids are < 2**31, as in the frozen graph's int32)."""
assert array(_IDS).itemsize == 4
_NONE = 0xFFFFFFFF
"""An empty input slot."""
_WIDE = 0xFFFFFFFE
"""First input slot of an op with three or more inputs; the second slot is its row in the wide table."""
_SPILLED = 0xFFFFFFFF
"""Chain head of a value whose consumers moved to the spill dict (see ``_cse_spill``)."""
_CHAIN_MAX = 16
"""A hash-consing chain longer than this moves to a dict, so a value with many consumers stays O(1)."""
_NEW = object.__new__
_FOREIGN = "a value from another builder or graph was passed to this builder"
_INPUT_FORMS = ("GraphBuilder.input (placeholder) takes input(dtype, shape), e.g. input('float64', (2, 3)) "
                "(shape first is read the same), or one (dtype, shape) pair or TensorType")
_NO: Any = object()
"""Marks an absent positional argument of an op method."""


def _wait(take: Callable[[], Any]) -> None:
    """Take a builder's token that another thread holds: sleep (releasing the GIL) until it is back.

    Sharing one builder between threads is rare and the holder keeps the
    token for about a microsecond, so a short sleep, doubling up to a
    millisecond, costs less than a condition variable on every op.
    """
    delay = 0.0
    while True:
        time.sleep(delay)
        try:
            take()
            return
        except IndexError:
            delay = min(2 * delay or 1e-6, 1e-3)


class _ForeignValue(Exception):
    """An input of an op is a Value of another builder (see ``GraphBuilder.on_foreign_value``)."""


def _handle(owner: GraphBuilder, vid: int) -> Value:
    # Value(owner, vid) runs a Python-level __init__ (a fifth of the per-op budget); filling the
    # two slots of a bare instance makes the same object for less.
    v = _NEW(Value)
    v.owner = owner
    v.id = vid
    return v


def _zeros_to(col: array[int], n: int) -> None:
    """Extend ``col`` with zeros to at least ``n`` entries, by at least an eighth (amortised O(1))."""
    if n > len(col):
        col.frombytes(bytes(col.itemsize * max(n - len(col), len(col) >> 3, 1024)))


class _Derived(Sequence[int]):
    """A read-only integer column computed per index from the builder's columns.

    The builder used to keep one Python list per graph column; code that reads
    ``b._op_kind[op]`` and the like keeps working through these views.

    >>> _Derived(lambda i: i * i, lambda: 4)[-1]
    9
    """

    __slots__ = ("_get", "_len")

    def __init__(self, get: Callable[[int], int], length: Callable[[], int]) -> None:
        self._get = get
        self._len = length

    def __len__(self) -> int:
        return self._len()

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        n = self._len()
        if isinstance(i, slice):
            return [self._get(j) for j in range(*i.indices(n))]
        j = _index(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError("index out of range")
        return self._get(j)

    def __iter__(self) -> Iterator[int]:
        return (self._get(j) for j in range(self._len()))


def _view(col: array[int]) -> np.ndarray:
    """A NumPy view of an unsigned array.array column (``col`` cannot grow while the view lives)."""
    dtype = np.uint32 if col.itemsize == 4 else np.uint64
    return np.frombuffer(col, dtype=dtype) if len(col) else np.zeros(0, dtype=dtype)


def _fast(self: GraphBuilder, hot: tuple[Any, ...], kid: int, a: Any, c: Any) -> Value | None:
    """The common op, built without :meth:`GraphBuilder._build`: its output Value, or None for the general path.

    The common op: one input ``a`` (``c`` is ``_NO``) or two, Values of this
    builder, of a kind with a signature known from an earlier op on these
    input types, with one output (the caller has checked there are no
    attributes and no name). ``hot`` is the builder's ``_hot`` tuple. Both
    :meth:`GraphBuilder.op` and the op methods call this one function with
    plain positional arguments: a function with ``**attrs`` makes a dict per
    call, and each attribute read on the builder is slow (its class has
    ``__getattr__``), so the caller reads ``hot`` once.
    """
    try:
        if a.owner is not self or (c is not _NO and c.owner is not self):
            return None
    except AttributeError:  # an input is not a Value: _build makes constants of numbers
        return None
    take, give, vt, memo1, sigs, ins, hd, _ = hot
    try:
        take()
    except IndexError:  # another thread holds the builder
        _wait(take)
    try:
        ia: int = a.id
        if c is _NO:
            ic: int = _NONE
            vmax = ia
            memo = memo1((kid, vt[ia]))
        else:
            ic = c.id
            vmax = ia if ia > ic else ic
            memo = memo1((kid, vt[ia], vt[ic]))
        if memo is None:
            return None
        sid, out_tid = memo
        if hd is not None:
            try:
                head = hd[vmax]
            except IndexError:
                head = self._cse_reach(vmax)
            if head:
                ids = (ia,) if c is _NO else (ia, ic)
                hit = self._cse_lookup(sid, ids, vmax)
                if hit >= 0:
                    return _handle(self, self._first_out(hit))
                head = hd[vmax]
                if head == _SPILLED:
                    self._cse_spilled[(sid, *ids)] = len(sigs)
                else:
                    self._cse_link(len(sigs), head)
                    hd[vmax] = len(sigs) + 1
            else:  # the usual case: the first consumer of its youngest input
                hd[vmax] = len(sigs) + 1
        sigs.append(sid)
        ins.append(ia)
        ins.append(ic)
        vid = len(vt)
        vt.append(out_tid)
        v = _NEW(Value)  # see _handle
        v.owner = self
        v.id = vid
        return v
    finally:
        give(True)


def _op_method(kid: int, doc: str | None) -> Callable[..., Any]:
    """The method behind ``b.<kind>(...)``: :func:`_fast` for the common op, else :meth:`GraphBuilder._build`.

    The first two inputs are positional parameters, passed on to ``_fast`` as they are.
    """

    def method(self: GraphBuilder, a: Any = _NO, c: Any = _NO, /, *rest: ValueLike, name: str | None = None,
               **attrs: Any) -> Any:
        if name is None and not attrs and not rest:
            v = _fast(self, self._hot, kid, a, c)
            if v is not None:
                return v
        inputs = (a, c, *rest) if c is not _NO else (a, *rest) if a is not _NO else rest
        return self._build(get_op(kid), inputs, name, attrs)

    method.__doc__ = doc
    return method


_METHODS: dict[int, Callable[..., Any]] = {}


def _method_for(opdef: OpDef) -> Callable[..., Any]:
    """The op method of ``opdef``'s kind (one function per kind id, shared by all builders)."""
    fn = _METHODS.get(opdef.id)
    if fn is None:
        fn = _METHODS[opdef.id] = _op_method(opdef.id, opdef.doc)
    return fn


class GraphBuilder:
    """Builds a graph op by op; see the module doc for an example.

    ``hash_cons``: return existing outputs for an op identical to an earlier
    one (same kind, attributes and inputs) and one value for equal constants.

    Thread safety: one builder may be shared by several threads. Every change
    (an op, input, constant, output, update edge, name, description, the
    ``hash_cons`` switch) and ``freeze()`` hold the builder's lock, so ops
    built concurrently are appended whole, one after another, in some order,
    and the frozen graph is valid. The lock is a one-element token list
    (atomic ``pop``/``append``), which adds no measurable time per op
    (tests/test_sizes_threads.py; a ``threading.Lock`` would add ~10%).
    Threads still run one at a time under the GIL: sharing a builder is
    for convenience, not speed.
    """

    def __init__(self, *, hash_cons: bool = True) -> None:
        # Per op: signature id and two input slots (see the module doc).
        self._op_sig = array(_IDS)
        self._op_in = array(_IDS)
        # Inputs of ops with three or more, as CSR rows.
        self._wide_ptr = array("Q", [0])
        self._wide_ids = array(_IDS)
        # First output of op o is o + _seg_delta[k] for the last k with _seg_op[k] <= o;
        # _seg_first[k] is the first output of op _seg_op[k] (see _resync).
        self._seg_op: list[int] = [0]
        self._seg_delta: list[int] = [0]
        self._seg_first: list[int] = [0]
        # Per value: type id.
        self._value_type = array(_IDS)
        # Signatures: kind, attribute id, version and output type ids of a class of ops.
        self._sig_kind: list[int] = []
        self._sig_attr: list[int] = []
        self._sig_version: list[int] = []
        self._sig_outs: list[tuple[int, ...]] = []
        self._sig_ids: dict[tuple[Any, ...], int] = {}
        # (kind id, input type ids) or (kind id, exact attrs, input type ids) -> signature id; the
        # signatures with one output also in _memo1 as (signature id, output type id).
        self._memo: dict[tuple[Any, ...], int] = {}
        self._memo1: dict[tuple[Any, ...], tuple[int, int]] = {}
        self._type_table: Interner[ValueType] = Interner()
        self._types = self._type_table.items
        self._attr_table: Interner[Attrs] = Interner(key=exact_key)
        self._attrs = self._attr_table.items
        self._constants: list[np.ndarray] = []
        self._const_keys: dict[Any, tuple[int, int]] = {}
        self._inputs: list[int] = []
        self._outputs: list[int] = []
        self._updates: list[tuple[int, int]] = []
        self._value_names: dict[int, str] = {}
        self._name_owner: dict[str, int] = {}
        self._op_names: dict[int, str] = {}
        self._const_names: dict[int, str] = {}
        self._descriptions: dict[tuple[str, int], str] = {}
        # Hash-consing (None while hash_cons is off): per value, 1 + the latest op whose youngest
        # input it is (0: none); per op, 1 + the previous op of its chain (0: end). Both grow with
        # zeros in steps when an index past their end is needed, not once per value or op.
        self._cse_head: array[int] | None = None
        self._cse_next: array[int] | None = None
        self._cse_parked: tuple[array[int], array[int]] | None = None
        self._cse_spilled: dict[tuple[int, ...], int] = {}
        self._frozen: Graph | None = None
        self._frozen_ops = -1
        self._opdefs: dict[Any, tuple[OpDef, int]] = {}  # kind -> (definition, id for _fast or -1)
        # Given a Value of another builder passed to this one, returns this builder's Value standing for it:
        # how the body of a control-flow op captures values of the enclosing graph. None refuses them.
        self.on_foreign_value: Callable[[Value], Value] | None = None
        # Every change holds the builder's token (see the class doc): a one-element list that a thread
        # pop()s to enter and append()s to leave, both atomic. The pair costs ~15 ns where a
        # threading.Lock's acquire()/release() cost ~65 (acquire parses its arguments) on a ~600 ns op;
        # a thread that finds the list empty waits in _wait. The fast path reads the token's methods
        # and the columns it appends to from one tuple: an attribute of a class with __getattr__ is a
        # slow lookup. The columns are never replaced, so the tuple stays valid.
        token = [True]
        self._take = token.pop
        self._give = token.append
        self._token = token
        self._hot: tuple[Any, ...] = ()
        self.hash_cons = hash_cons  # sets _hot

    def _acquire(self) -> None:
        """Take the builder's token (wait while another thread holds it); :meth:`_release` gives it back."""
        try:
            self._take()
        except IndexError:
            _wait(self._take)

    def _release(self) -> None:
        self._give(True)

    @property
    def hash_cons(self) -> bool:
        """Whether an op identical to an earlier one returns the earlier outputs.

        Ops built while it is off are not found later.

        >>> GraphBuilder(hash_cons=False).hash_cons
        False
        """
        return self._cse_head is not None

    @hash_cons.setter
    def hash_cons(self, on: bool) -> None:
        self._acquire()
        try:
            if on and self._cse_head is None:
                self._cse_head, self._cse_next = self._cse_parked or (array(_IDS), array(_IDS))
                self._cse_parked = None
            elif not on and self._cse_head is not None:
                assert self._cse_next is not None
                self._cse_parked = (self._cse_head, self._cse_next)
                self._cse_head = self._cse_next = None
            self._set_hot()
        finally:
            self._release()

    def _set_hot(self) -> None:
        # What the fast path (_fast, op) reads, in one tuple: an attribute of a class with __getattr__ is
        # a slow lookup. The columns are never replaced, so the tuple stays valid until hash_cons changes.
        token = self._token
        self._hot = (token.pop, token.append, self._value_type, self._memo1.get, self._op_sig, self._op_in,
                     self._cse_head, self._opdefs.get)

    # ------------------------------------------------------------ interning
    def _sig_id(self, kid: int, aid: int, in_tids: tuple[int, ...], version: int,
                out_tids: tuple[int, ...]) -> int:
        # Keyed without version and outputs: they follow from kind, attributes and input types.
        key = (kid, aid, in_tids)
        sid = self._sig_ids.get(key)
        if sid is None:
            sid = self._sig_ids[key] = self._new_sig(kid, aid, version, out_tids)
        return sid

    def _new_sig(self, kid: int, aid: int, version: int, out_tids: tuple[int, ...]) -> int:
        sid = len(self._sig_kind)
        self._sig_kind.append(kid)
        self._sig_attr.append(aid)
        self._sig_version.append(version)
        self._sig_outs.append(out_tids)
        return sid

    # ------------------------------------------------------------ columns
    def _append_op(self, sid: int, ids: Sequence[int]) -> int:
        """Append an op and its outputs (no hash-consing bookkeeping); return its first output id."""
        self._op_sig.append(sid)
        ins = self._op_in
        if len(ids) <= 2:
            ins.append(ids[0] if ids else _NONE)
            ins.append(ids[1] if len(ids) == 2 else _NONE)
        else:
            ins.append(_WIDE)
            ins.append(len(self._wide_ptr) - 1)
            self._wide_ids.extend(ids)
            self._wide_ptr.append(len(self._wide_ids))
        out_tids = self._sig_outs[sid]
        first = len(self._value_type)
        self._value_type.extend(out_tids)
        if len(out_tids) != 1:
            self._resync()
        return first

    def _resync(self) -> None:
        """Start a new output offset for the next op after values were added other than one per op.

        The next op's first output is the next value id, so its offset is
        ``num_values - num_ops``; ops with one output keep it.
        """
        n_ops = len(self._op_sig)
        d = len(self._value_type) - n_ops
        seg_op, seg_delta, seg_first = self._seg_op, self._seg_delta, self._seg_first
        if seg_delta[-1] == d:
            return
        if seg_op[-1] == n_ops:  # no op has used the last offset yet: replace it
            if len(seg_op) > 1 and seg_delta[-2] == d:
                del seg_op[-1], seg_delta[-1], seg_first[-1]
            else:
                seg_delta[-1] = d
                seg_first[-1] = n_ops + d
        else:
            seg_op.append(n_ops)
            seg_delta.append(d)
            seg_first.append(n_ops + d)

    def _first_out(self, op: int) -> int:
        """Id of the first output of op ``op`` (the next value id when it has none)."""
        seg_op = self._seg_op
        k = 0 if len(seg_op) == 1 else bisect_right(seg_op, op) - 1
        return op + self._seg_delta[k]

    def _n_out(self, op: int) -> int:
        return len(self._sig_outs[self._op_sig[op]])

    def _inputs_of(self, op: int) -> tuple[int, ...]:
        ins = self._op_in
        x0, x1 = ins[2 * op], ins[2 * op + 1]
        if x0 == _WIDE:
            return tuple(self._wide_ids[self._wide_ptr[x1]:self._wide_ptr[x1 + 1]])
        if x0 == _NONE:
            return ()
        return (x0,) if x1 == _NONE else (x0, x1)

    def _producer(self, value: int) -> int:
        """The op producing ``value``, or -1 for an input."""
        if not 0 <= value < len(self._value_type):
            raise IndexError(f"value {value} out of range")
        i = bisect_left(self._inputs, value)
        if i < len(self._inputs) and self._inputs[i] == value:
            return -1
        # Not an input, so made by the last op whose first output is <= value: within an offset
        # segment that is value - offset, or the segment's last op (the one with several outputs).
        k = bisect_right(self._seg_first, value) - 1
        end = self._seg_op[k + 1] if k + 1 < len(self._seg_op) else len(self._op_sig)
        return min(value - self._seg_delta[k], end - 1)

    # ------------------------------------------------------------ hash-consing
    def _cse_reach(self, v: int) -> int:
        """Extend the chain heads with zeros to cover value ``v``; return its head."""
        hd = self._cse_head
        assert hd is not None
        _zeros_to(hd, max(v + 1, len(self._value_type)))
        return hd[v]

    def _cse_link(self, op: int, prev: int) -> None:
        """Chain op ``op`` to ``prev`` (1 + the previous op of its chain)."""
        nx = self._cse_next
        assert nx is not None
        _zeros_to(nx, op + 1)
        nx[op] = prev

    def _cse_lookup(self, sid: int, ids: tuple[int, ...], vmax: int) -> int:
        """The op with signature ``sid`` on inputs ``ids`` built before, or -1.

        ``vmax`` is the youngest input; only ops with the same youngest input
        can be equal, and they form one chain (newest first).
        """
        hd, nx = self._cse_head, self._cse_next
        assert hd is not None and nx is not None
        o = self._cse_reach(vmax)
        if o == _SPILLED:
            return self._cse_spilled.get((sid, *ids), -1)
        sigs, ins = self._op_sig, self._op_in
        k = len(ids)
        steps = 0
        while o:
            o -= 1
            # The signature fixes the number of inputs (their types are part of it).
            if sigs[o] == sid:
                if k == 2:
                    if ins[2 * o] == ids[0] and ins[2 * o + 1] == ids[1]:
                        return o
                elif k == 1:
                    if ins[2 * o] == ids[0]:
                        return o
                elif self._inputs_of(o) == ids:
                    return o
            steps += 1
            o = nx[o] if o < len(nx) else 0
        if steps > _CHAIN_MAX:
            self._cse_spill(vmax)
        return -1

    def _cse_spill(self, vmax: int) -> None:
        """Move the chain of ``vmax`` to the spill dict (a value with many consumers)."""
        hd, nx = self._cse_head, self._cse_next
        assert hd is not None and nx is not None
        spilled = self._cse_spilled
        o = hd[vmax]
        while o:
            o -= 1
            spilled.setdefault((self._op_sig[o], *self._inputs_of(o)), o)
            o = nx[o] if o < len(nx) else 0
        hd[vmax] = _SPILLED

    def _cse_insert(self, op: int, sid: int, ids: tuple[int, ...]) -> None:
        """Record op ``op`` (signature ``sid``, inputs ``ids``) for later lookups."""
        hd = self._cse_head
        assert hd is not None
        if not ids:  # no youngest input to hang it on; ops without inputs are rare
            self._cse_spilled.setdefault((sid,), op)
            return
        vmax = max(ids)
        head = self._cse_reach(vmax)
        if head == _SPILLED:
            self._cse_spilled.setdefault((sid, *ids), op)
            return
        if head:
            self._cse_link(op, head)
        hd[vmax] = op + 1

    # ------------------------------------------------------------ queries
    def type_of(self, value: int | Value) -> ValueType:
        """Type of a value built here.

        >>> b = GraphBuilder()
        >>> b.type_of(b.input(("int8", (2,))))
        i8[2]
        """
        return self._types[self._value_type[int(value)]]

    def name_of(self, value: int) -> str | None:
        """Name of a value built here, if any."""
        return self._value_names.get(int(value))

    def kind_of(self, op: int) -> str:
        """Kind name of op ``op``."""
        return get_op(self._sig_kind[self._op_sig[op]]).name

    def attrs_of(self, op: int) -> dict[str, Any]:
        """Attributes of op ``op``."""
        return dict(self._attrs[self._sig_attr[self._op_sig[op]]])

    def op_inputs(self, op: int) -> list[int]:
        """Input value ids of op ``op``.

        >>> b = GraphBuilder()
        >>> x = b.input(("float32", (3,)))
        >>> b.op_inputs(b.multiply(x, x).producer.id)
        [0, 0]
        """
        return list(self._inputs_of(_index(op)))

    def op_outputs(self, op: int) -> list[int]:
        """Output value ids of op ``op``.

        >>> b = GraphBuilder()
        >>> parts = b.split(b.input(("float32", (4,))), sections=2)
        >>> b.op_outputs(0), [p.id for p in parts]
        ([1, 2], [1, 2])
        """
        op = _index(op)
        first = self._first_out(op)
        return list(range(first, first + self._n_out(op)))

    def producer_of(self, value: int) -> Op | None:
        """The op producing ``value`` (None for an input)."""
        p = self._producer(_index(value))
        return None if p < 0 else Op(self, p)

    def _op_line(self, op: int) -> str:
        return f"{self.kind_of(op)}({', '.join('%' + str(v) for v in self.op_inputs(op))})"

    @property
    def op_version(self) -> Sequence[int]:
        """Versions of the ops built so far (a read-only sequence).

        >>> b = GraphBuilder()
        >>> y = b.negative(b.input(("float32", ())))
        >>> len(b.op_version), b.op_version[0] == int(b.freeze().op_version[0])
        (1, True)
        """
        return _Derived(lambda op: self._sig_version[self._op_sig[op]], self._num_ops)

    # Columns the builder kept as Python lists before; io.dask, io.onnx and autodiff read them.
    @property
    def _op_kind(self) -> Sequence[int]:
        return _Derived(lambda op: self._sig_kind[self._op_sig[op]], self._num_ops)

    @property
    def _op_attr(self) -> Sequence[int]:
        return _Derived(lambda op: self._sig_attr[self._op_sig[op]], self._num_ops)

    @property
    def _op_version(self) -> Sequence[int]:
        return self.op_version

    @property
    def _value_producer(self) -> Sequence[int]:
        return _Derived(self._producer, self._num_values)

    @property
    def _value_index(self) -> Sequence[int]:
        def index(v: int) -> int:
            p = self._producer(v)
            return 0 if p < 0 else v - self._first_out(p)
        return _Derived(index, self._num_values)

    def _num_ops(self) -> int:
        return len(self._op_sig)

    def _num_values(self) -> int:
        return len(self._value_type)

    @property
    def num_ops(self) -> int:
        """Number of ops built so far."""
        return len(self._op_sig)

    @property
    def num_values(self) -> int:
        """Number of values built so far."""
        return len(self._value_type)

    # ------------------------------------------------------------ building
    def _touch(self) -> None:
        self._frozen = None

    def input(self, type: Any, shape: Any = None, *, name: str | None = None) -> Value:
        """Declare an input (a placeholder, a ``set`` gateway in files).

        ``type`` is a :class:`TensorType`, a ``(dtype, shape)`` pair, or a dtype
        with ``shape`` given separately. A shape and a dtype cannot be taken for
        each other, so the shape first (``opgraph.numpy.placeholder``'s order)
        is read the same.

        >>> import opgraph
        >>> opgraph.GraphBuilder().input("float32", (None, 3), name="batch").type
        f32[?,3]
        >>> opgraph.GraphBuilder().placeholder((2, 3), "float64").type
        f64[2,3]
        """
        try:
            if shape is not None:
                type, shape = dtype_and_shape(type, shape)
            elif isinstance(type, tuple) and len(type) == 2:
                type = dtype_and_shape(*type)
            if shape is None and is_shape(type):
                raise OpTypeError(f"{type!r} is a shape without a dtype")
            t = as_type(type) if shape is None else TensorType(type, shape)
        except OpTypeError as exc:  # a bad dtype or shape: name the call and the user's line, as ops do
            raise build_error("input", [], f"{exc}; {_INPUT_FORMS}") from None
        self._acquire()
        try:
            self._touch()
            vid = len(self._value_type)
            self._value_type.append(self._type_table.id(t))
            self._inputs.append(vid)
            self._resync()
            if name is not None:
                self._set_name(vid, name)
            return Value(self, vid)
        finally:
            self._release()

    placeholder = input

    def build_placeholder(self, ty: Any, name: str | None = None) -> Value:
        """Seed 003's spelling of :meth:`input`."""
        return self.input(ty, name=name)

    def _set_name(self, vid: int, name: str) -> None:
        # name -> value as well as value -> name: a new name is checked in O(1), not against every name
        if name in self._name_owner:
            raise GraphError(f"a value named {name!r} exists already")
        old = self._value_names.get(vid)
        if old is not None:
            del self._name_owner[old]
        self._value_names[vid] = name
        self._name_owner[name] = vid

    def constant(self, value: Any, *, dtype: Any = None, name: str | None = None) -> Value:
        """Add a constant (a const op pointing into the constants table).

        With hash-consing, equal constants (dtype, shape and bytes) share one value.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder()
        >>> b.constant([1, 2]) == b.constant(np.array([1, 2]))
        True
        """
        arr = np.array(value, dtype=None if dtype is None else as_dtype(dtype))
        if arr.dtype not in (np.dtype(object),):
            try:
                arr = arr.astype(as_dtype(arr.dtype), copy=False)
            except OpTypeError as exc:
                raise build_error("const", [], str(exc)) from None
        else:
            raise build_error("const", [], f"cannot make a constant of {value!r}")
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        self._acquire()
        try:
            self._touch()
            key = None
            if self._cse_head is not None and name is None:
                data = arr.tobytes()
                if len(data) > 64:
                    import hashlib  # here, not at the top: it loads OpenSSL (~3 MB), which `import opgraph` need not

                    data = hashlib.blake2b(data, digest_size=20).digest()
                digest = data
                key = (arr.dtype.str, arr.shape, digest)
                hit = self._const_keys.get(key)
                if hit is not None and np.array_equal(self._constants[hit[1]], arr):
                    return Value(self, hit[0])
            cidx = len(self._constants)
            self._constants.append(arr)
            # One signature per constant: its attribute (the table index) is its own.
            tid = self._type_table.id(TensorType.of(arr))
            vid = self._append_op(self._new_sig(CONST.id, self._attr_table.id((("index", cidx),)), 0, (tid,)), ())
            if key is not None:
                self._const_keys[key] = (vid, cidx)
            if name is not None:
                self._set_name(vid, name)
                self._const_names[cidx] = name
            return Value(self, vid)
        finally:
            self._release()

    const = constant

    def build_const(self, val: Any, name: str | None = None) -> Value:
        """Seed 003's spelling of :meth:`constant`."""
        return self.constant(val, name=name)

    def _const_ops_index(self, vid: int) -> int:
        """Index in the constants table of constant value ``vid``."""
        return dict(self._attrs[self._sig_attr[self._op_sig[self._producer(vid)]]])["index"]

    def _as_value(self, x: ValueLike, like: Sequence[ValueType]) -> int:
        if isinstance(x, Value):
            if x.owner is not self:
                return self._foreign(x)
            return x.id
        if isinstance(x, (bool, int, float, complex)):
            # Python scalars are "weak" (NEP 50): they take the dtype of the
            # tensor operands, as in NumPy 2.
            dts = [t.dtype for t in like if isinstance(t, TensorType)]
            dt = np.result_type(*dts, x) if dts else np.result_type(x)
            return self.constant(np.array(x, dtype=as_dtype(dt))).id
        return self.constant(x).id

    def _foreign(self, v: Value) -> int:
        if self.on_foreign_value is None:
            raise GraphError(_FOREIGN)
        mine = self.on_foreign_value(v)
        if not isinstance(mine, Value) or mine.owner is not self:
            raise GraphError("on_foreign_value must return a Value of this builder")
        return mine.id

    def op(self, kind: str | int | OpDef, a: Any = _NO, c: Any = _NO, /, *rest: ValueLike,
           name: str | None = None, **attrs: Any) -> Any:
        """Append an op; return its output Value, or a tuple when it has 0 or several.

        Types are inferred here: a mismatch raises
        :class:`~opgraph.errors.OpBuildError` naming the op, the input types
        and the user's source line.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder()
        >>> x = b.input(("float64", (6,)))
        >>> a, c = b.op("split", x, sections=2)
        >>> a.type
        f64[3]
        """
        hot = self._hot
        entry = hot[7](kind)  # self._opdefs.get
        if entry is None:
            opdef = get_op(kind)
            # _fast knows a kind by its id: take it only for the definition the registry holds under that id.
            try:
                registered = get_op(opdef.id) is opdef
            except KeyError:
                registered = False
            entry = self._opdefs[kind] = (opdef, opdef.id if registered else -1)  # type: ignore[index]
        opdef, kid = entry
        if kid >= 0:
            if name is None and not attrs and not rest:
                v = _fast(self, hot, kid, a, c)
                if v is not None:
                    return v
            opdef = get_op(kid)  # as the op methods do: a kind registered again is seen
        inputs = (a, c, *rest) if c is not _NO else (a, *rest) if a is not _NO else rest
        return self._build(opdef, inputs, name, attrs)

    def _build(self, opdef: OpDef, inputs: Sequence[ValueLike], name: str | None,
               attrs: dict[str, Any]) -> Any:
        """Append an op of kind ``opdef`` (the general path behind :meth:`op` and the op methods)."""
        vt = self._value_type
        ids: list[int] = []
        try:
            for v in inputs:
                if v.owner is not self:  # type: ignore[union-attr]
                    raise _ForeignValue
                ids.append(v.id)  # type: ignore[union-attr]
        except (AttributeError, _ForeignValue):  # numbers and arrays become constants; foreign values captured
            tensor_types = [self.type_of(v) for v in inputs if isinstance(v, Value) and v.owner is self]
            ids = [self._as_value(v, tensor_types) for v in inputs]
        self._acquire()
        try:
            kid = opdef.id
            in_tids = tuple([vt[v] for v in ids])
            key: tuple[Any, ...] | None
            try:
                key = (kid, exact_key(attrs), in_tids) if attrs else (kid, *in_tids)
                sid = self._memo.get(key)
            except TypeError:  # unhashable attribute values (lists): normalise first
                sid, key = None, None
            if sid is None:
                r = resolve(opdef, [self._types[t] for t in in_tids], attrs)
                out_tids = tuple([self._type_table.id(t) for t in r.out_types])
                sid = self._sig_id(kid, self._attr_table.id(r.attrs), in_tids, r.version, out_tids)
                if key is not None:
                    self._memo[key] = sid
                    if len(out_tids) == 1:
                        self._memo1[key] = (sid, out_tids[0])
            n_out = len(self._sig_outs[sid])
            op = len(self._op_sig)
            if self._cse_head is not None:
                tids = tuple(ids)
                hit = self._cse_lookup(sid, tids, max(ids)) if ids else self._cse_spilled.get((sid,), -1)
                if hit >= 0:
                    first = self._first_out(hit)
                    return self._wrap(range(first, first + n_out))
                self._cse_insert(op, sid, tids)
            self._touch()
            first = self._append_op(sid, ids)
            if name is not None:
                self._op_names[op] = name
                if n_out == 1:
                    self._set_name(first, name)
            if n_out == 1:
                return Value(self, first)
            return self._wrap(range(first, first + n_out))
        finally:
            self._release()

    def _wrap(self, outs: Sequence[int]) -> Any:
        if len(outs) == 1:
            return Value(self, outs[0])
        return tuple(Value(self, v) for v in outs)

    def __getattr__(self, name: str) -> Any:
        # Called only when normal lookup fails: the first time an op kind is used as a method.
        if name.startswith("_"):
            raise AttributeError(name)
        kind = name[len("build_op_"):] if name.startswith("build_op_") else name
        try:
            opdef = get_op(kind)
        except KeyError:
            raise AttributeError(f"GraphBuilder has no attribute or op kind {name!r}") from None
        # Installed on the class, so later lookups are ordinary method lookups (a failed lookup and
        # a new closure per call cost more than the op itself). The method keeps the kind's id and
        # asks the registry for the definition, so re-registering a kind is seen; a method on the
        # class, unlike a bound one stored on the instance, makes no reference cycle.
        setattr(GraphBuilder, name, _method_for(opdef))
        return getattr(self, name)

    def build_grad_ops(self, loss: Value, values: Sequence[Value]) -> list[Value]:
        """Seed 003: append the gradient ops of scalar ``loss`` for ``values``; return the gradients.

        >>> import numpy as np, opgraph
        >>> b = opgraph.GraphBuilder()
        >>> x = b.input(("float64", (2,)), name="x")
        >>> (g,) = b.build_grad_ops(b.sum(b.square(x)), [x])
        >>> b.run({x: np.array([1.0, 2.0])}, [g])[0]
        array([2., 4.])
        """
        # Differentiating is opgraph.autodiff's job (a layer above core): it fills this hook when imported.
        return hooks.GRAD.get()(self, loss, list(values))

    def output(self, *values: Value) -> None:
        """Declare outputs (``get`` gateways), in order."""
        ids = [self._as_value(v, []) for v in values]  # before locking: numbers become constants
        self._acquire()
        try:
            self._touch()
            self._outputs.extend(ids)
        finally:
            self._release()

    def update(self, source: Value, destination: Value) -> None:
        """Declare an update edge (``copy`` gateway): after an evaluation,
        ``source``'s content becomes input ``destination``'s for the next one.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder()
        >>> s = b.input(("float64", ()), name="s")
        >>> b.update(b.add(s, 1.0), s)
        >>> len(b.freeze().updates)
        1
        """
        src, dst = self._as_value(source, []), self._as_value(destination, [])
        self._acquire()
        try:
            if dst not in self._inputs:
                raise GraphError(f"update destination %{dst} is not an input")
            if self.type_of(src) != self.type_of(dst):
                raise GraphError(f"update changes type: {self.type_of(src)} -> {self.type_of(dst)}")
            self._touch()
            self._updates.append((src, dst))
        finally:
            self._release()

    def name(self, value: Value, name: str) -> Value:
        """Give a value a symbolic name (kept in .cgs files and dumps)."""
        self._acquire()
        try:
            self._touch()
            self._set_name(value.id, name)
            return value
        finally:
            self._release()

    def name_op(self, op: int, name: str) -> None:
        """Give op ``op`` (its index) a name, shown in dumps and kept in files; op names need not be unique.

        >>> b = GraphBuilder(); y = b.exp(b.input(("float32", (2,))))
        >>> b.name_op(b.producer_of(y.id).id, "/act/Exp"); b.freeze().symbols.ops
        {0: '/act/Exp'}
        """
        self._acquire()
        try:
            if not 0 <= op < len(self._op_sig):
                raise GraphError(f"op {op} does not exist (the builder has {len(self._op_sig)} ops)")
            self._touch()
            self._op_names[int(op)] = name
        finally:
            self._release()

    def describe(self, kind: str, index: int, text: str) -> None:
        """Attach a description to a 'value', 'op' or 'constant' (the .cgs description)."""
        self._acquire()
        try:
            self._touch()
            self._descriptions[(kind, int(index))] = text
        finally:
            self._release()

    # ------------------------------------------------------------ freezing
    def _columns(self) -> dict[str, np.ndarray]:
        """The frozen graph's structure arrays, derived from the builder's columns (vectorised).

        The builder's arrays are read through NumPy views that end with this
        call (an array.array cannot grow while a view of it exists); every
        array returned is a new one.
        """
        n_ops, n_vals = len(self._op_sig), len(self._value_type)
        sig = _view(self._op_sig)
        # First outputs: the op index plus its segment's offset.
        if len(self._seg_op) == 1:
            op_out = np.arange(self._seg_delta[0], n_ops + self._seg_delta[0], dtype=INDEX)
        else:
            seg_len = np.diff(np.array([*self._seg_op, n_ops], dtype=PTR))
            op_out = np.repeat(np.array(self._seg_delta, dtype=INDEX), seg_len)
            op_out += np.arange(n_ops, dtype=INDEX)
        producer = np.full(n_vals, -1, dtype=INDEX)
        index = np.zeros(n_vals, dtype=INDEX)
        if all(len(o) == 1 for o in self._sig_outs):  # the usual graph: one output per op
            out_ptr = np.arange(n_ops + 1, dtype=PTR)
            out_ids = op_out
            producer[out_ids] = np.arange(n_ops, dtype=INDEX)
        else:
            n_out = np.array([len(o) for o in self._sig_outs], dtype=PTR)[sig]
            out_ptr = np.zeros(n_ops + 1, dtype=PTR)
            np.cumsum(n_out, out=out_ptr[1:])
            local = (np.arange(out_ptr[-1], dtype=PTR) - np.repeat(out_ptr[:-1], n_out)).astype(INDEX)
            out_ids = np.repeat(op_out, n_out) + local
            producer[out_ids] = np.repeat(np.arange(n_ops, dtype=INDEX), n_out)
            index[out_ids] = local
        # Inputs: the used slots in order are the CSR entries, except for wide ops' rows.
        slots = _view(self._op_in).reshape(n_ops, 2)
        used = slots != _NONE
        arity = used.view(np.uint8).sum(axis=1, dtype=PTR) if n_ops else np.zeros(0, PTR)
        wide = slots[:, 0] == _WIDE
        if wide.any():
            arity[wide] = np.diff(_view(self._wide_ptr).astype(PTR))[slots[wide, 1]]
        in_ptr = np.zeros(n_ops + 1, dtype=PTR)
        np.cumsum(arity, out=in_ptr[1:])
        if not wide.any():
            in_ids = slots[used].astype(INDEX)
        else:
            in_ids = np.empty(int(in_ptr[-1]), dtype=INDEX)
            narrow = ~wide
            first = narrow & used[:, 0]
            in_ids[in_ptr[:-1][first]] = slots[first, 0]
            second = narrow & used[:, 1]
            in_ids[in_ptr[:-1][second] + 1] = slots[second, 1]
            lens = arity[wide]  # wide rows were appended in op order
            starts = np.repeat(in_ptr[:-1][wide], lens)
            offsets = np.arange(int(lens.sum()), dtype=PTR) - np.repeat(np.cumsum(lens) - lens, lens)
            in_ids[starts + offsets] = _view(self._wide_ids)
        return {
            "op_kind": np.array(self._sig_kind or [0], dtype=INDEX)[sig],
            "op_attr": np.array(self._sig_attr or [0], dtype=INDEX)[sig],
            "op_version": np.array(self._sig_version or [0], dtype=INDEX)[sig],
            "in_ptr": in_ptr,
            "in_ids": in_ids,
            "out_ptr": out_ptr,
            "out_ids": out_ids,
            "value_type": _view(self._value_type).astype(INDEX),
            "value_producer": producer,
            "value_index": index,
        }

    def freeze(self) -> Graph:
        """The graph built so far, as an immutable columnar :class:`Graph`.

        The builder stays usable; freezing again without changes returns
        the same Graph object.

        >>> b = GraphBuilder()
        >>> y = b.exp(b.input(("float32", (2,))))
        >>> g = b.freeze()
        >>> g is b.freeze(), g.num_ops
        (True, 1)
        """
        self._acquire()
        try:
            # The op methods' fast path does not clear _frozen (a store less per op): the op count tells.
            if self._frozen is None or self._frozen_ops != len(self._op_sig):
                self._frozen = Graph(
                    **self._columns(),
                    types=self._types,
                    attrs=self._attrs,
                    constants=self._constants,
                    inputs=self._inputs,
                    outputs=self._outputs,
                    updates=self._updates,
                    symbols=Symbols(dict(self._value_names), dict(self._op_names),
                                    dict(self._const_names), dict(self._descriptions)),
                )
                self._frozen_ops = len(self._op_sig)
            return self._frozen
        finally:
            self._release()

    def run(self, feeds: Mapping[Any, Any] | None = None, targets: Sequence[Any] | None = None,
            *, backend: str = "numpy", **kw_feeds: Any) -> list[np.ndarray]:
        """Evaluate ``targets`` from ``feeds`` on the ops they need (seed 003's ``run``).

        Values built later are not affected; values of this builder, their
        ids or names are accepted as keys and targets. Keys and keywords
        follow :meth:`Graph.run` (inputs by name also as keywords).

        >>> import numpy as np, opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,)), name="x"); y = b.op("exp", x)
        >>> b.run({x: np.zeros(2)}, [y]), b.run(targets=[y], x=np.zeros(2))
        ([array([1., 1.])], [array([1., 1.])])
        """
        graph = self.freeze()
        feeds = {(k.id if isinstance(k, Value) else k): v for k, v in (feeds or {}).items()}
        targets = None if targets is None else [t.id if isinstance(t, Value) else t for t in targets]
        return graph.run(feeds, targets, backend=backend, **kw_feeds)
