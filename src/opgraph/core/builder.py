"""GraphBuilder: append ops one by one, then ``freeze()`` into a :class:`Graph`.

This is also seed 003's explicit builder: placeholders, constants, ops,
gradients later, and ``run(feeds, targets)`` on the needed subgraph.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.placeholder("float64", (2, 2), name="x")
    >>> w = b.const(np.eye(2) * 3)
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
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.core import hooks
from opgraph.core.dtypes import as_dtype
from opgraph.core.graph import Graph, Op, Symbols, Value
from opgraph.core.registry import CONST, Attrs, OpDef, build_error, exact_key, get_op, resolve
from opgraph.core.types import TensorType, ValueType, as_type
from opgraph.errors import GraphError, OpTypeError

ValueLike = Value | int | float | bool | complex | np.ndarray | np.generic


class GraphBuilder:
    """Builds a graph op by op; see the module doc for an example.

    ``hash_cons``: return existing outputs for an op identical to an earlier
    one (same kind, attributes and inputs) and one value for equal constants.
    """

    def __init__(self, *, hash_cons: bool = True) -> None:
        self.hash_cons = hash_cons
        self._op_kind: list[int] = []
        self._op_attr: list[int] = []
        self._op_version: list[int] = []
        self._in_ptr: list[int] = [0]
        self._in_ids: list[int] = []
        self._out_ptr: list[int] = [0]
        self._out_ids: list[int] = []
        self._value_type: list[int] = []
        self._value_producer: list[int] = []
        self._value_index: list[int] = []
        self._types: list[ValueType] = []
        self._type_ids: dict[ValueType, int] = {}
        self._attrs: list[Attrs] = []
        self._attr_ids: dict[Any, int] = {}
        self._constants: list[np.ndarray] = []
        self._const_keys: dict[Any, int] = {}
        self._inputs: list[int] = []
        self._outputs: list[int] = []
        self._updates: list[tuple[int, int]] = []
        self._value_names: dict[int, str] = {}
        self._op_names: dict[int, str] = {}
        self._const_names: dict[int, str] = {}
        self._descriptions: dict[tuple[str, int], str] = {}
        self._cse: dict[tuple[Any, ...], tuple[int, ...]] = {}
        self._infer_memo: dict[tuple[Any, ...], tuple[tuple[int, ...], int]] = {}
        self._frozen: Graph | None = None
        self._opdefs: dict[Any, OpDef] = {}

    # ------------------------------------------------------------ interning
    def _type_id(self, t: ValueType) -> int:
        tid = self._type_ids.get(t)
        if tid is None:
            tid = self._type_ids[t] = len(self._types)
            self._types.append(t)
        return tid

    def _attr_id(self, a: Attrs) -> int:
        key = exact_key(a)
        aid = self._attr_ids.get(key)
        if aid is None:
            aid = self._attr_ids[key] = len(self._attrs)
            self._attrs.append(a)
        return aid

    def _new_value(self, tid: int, producer: int, index: int) -> int:
        vid = len(self._value_type)
        self._value_type.append(tid)
        self._value_producer.append(producer)
        self._value_index.append(index)
        return vid

    # ------------------------------------------------------------ queries
    def type_of(self, value: int | Value) -> ValueType:
        """Type of a value built here."""
        return self._types[self._value_type[int(value)]]

    def name_of(self, value: int) -> str | None:
        """Name of a value built here, if any."""
        return self._value_names.get(int(value))

    def kind_of(self, op: int) -> str:
        """Kind name of op ``op``."""
        return get_op(self._op_kind[op]).name

    def attrs_of(self, op: int) -> dict[str, Any]:
        """Attributes of op ``op``."""
        return dict(self._attrs[self._op_attr[op]])

    def op_inputs(self, op: int) -> list[int]:
        """Input value ids of op ``op``."""
        return self._in_ids[self._in_ptr[op]:self._in_ptr[op + 1]]

    def op_outputs(self, op: int) -> list[int]:
        """Output value ids of op ``op``."""
        return self._out_ids[self._out_ptr[op]:self._out_ptr[op + 1]]

    def producer_of(self, value: int) -> Op | None:
        """The op producing ``value`` (None for an input)."""
        p = self._value_producer[int(value)]
        return None if p < 0 else Op(self, p)

    def _op_line(self, op: int) -> str:
        return f"{self.kind_of(op)}({', '.join('%' + str(v) for v in self.op_inputs(op))})"

    @property
    def op_version(self) -> list[int]:
        """Versions of the ops built so far."""
        return self._op_version

    @property
    def num_ops(self) -> int:
        """Number of ops built so far."""
        return len(self._op_kind)

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
        with ``shape`` given separately.

        >>> import opgraph
        >>> opgraph.GraphBuilder().input("float32", (None, 3), name="batch").type
        f32[?,3]
        """
        t = as_type(type) if shape is None else TensorType(type, shape)
        self._touch()
        vid = self._new_value(self._type_id(t), -1, 0)
        self._inputs.append(vid)
        if name is not None:
            self._set_name(vid, name)
        return Value(self, vid)

    placeholder = input

    def build_placeholder(self, ty: Any, name: str | None = None) -> Value:
        """Seed 003's spelling of :meth:`input`."""
        return self.input(ty, name=name)

    def _set_name(self, vid: int, name: str) -> None:
        if name in self._value_names.values():
            raise GraphError(f"a value named {name!r} exists already")
        self._value_names[vid] = name

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
        self._touch()
        key = None
        if self.hash_cons and name is None:
            data = arr.tobytes()
            digest = data if len(data) <= 64 else hashlib.blake2b(data, digest_size=20).digest()
            key = (arr.dtype.str, arr.shape, digest)
            hit = self._const_keys.get(key)
            if hit is not None and np.array_equal(self._constants[self._const_ops_index(hit)], arr):
                return Value(self, hit)
        cidx = len(self._constants)
        self._constants.append(arr)
        op = len(self._op_kind)
        self._op_kind.append(CONST.id)
        self._op_attr.append(self._attr_id((("index", cidx),)))
        self._op_version.append(0)
        self._in_ptr.append(len(self._in_ids))
        vid = self._new_value(self._type_id(TensorType.of(arr)), op, 0)
        self._out_ids.append(vid)
        self._out_ptr.append(len(self._out_ids))
        if key is not None:
            self._const_keys[key] = vid
        if name is not None:
            self._set_name(vid, name)
            self._const_names[cidx] = name
        return Value(self, vid)

    const = constant

    def build_const(self, val: Any, name: str | None = None) -> Value:
        """Seed 003's spelling of :meth:`constant`."""
        return self.constant(val, name=name)

    def _const_ops_index(self, vid: int) -> int:
        return dict(self._attrs[self._op_attr[self._value_producer[vid]]])["index"]

    def _as_value(self, x: ValueLike, like: Sequence[ValueType]) -> int:
        if isinstance(x, Value):
            if x.owner is not self:
                raise GraphError("a value from another builder or graph was passed to this builder")
            return x.id
        if isinstance(x, (bool, int, float, complex)):
            # Python scalars are "weak" (NEP 50): they take the dtype of the
            # tensor operands, as in NumPy 2.
            dts = [t.dtype for t in like if isinstance(t, TensorType)]
            dt = np.result_type(*dts, x) if dts else np.result_type(x)
            return self.constant(np.array(x, dtype=as_dtype(dt))).id
        return self.constant(x).id

    def op(self, kind: str | int | OpDef, *inputs: ValueLike, name: str | None = None,
           **attrs: Any) -> Any:
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
        opdef = self._opdefs.get(kind)  # type: ignore[arg-type]
        if opdef is None:
            opdef = self._opdefs[kind] = get_op(kind)  # type: ignore[index]
        vt = self._value_type
        try:
            # Fast path: every input is a Value of this builder.
            ids = tuple([v.id for v in inputs if v.owner is self])  # type: ignore[union-attr]
            if len(ids) != len(inputs):
                raise GraphError("a value from another builder or graph was passed to this builder")
        except AttributeError:
            for v in inputs:
                if isinstance(v, Value) and v.owner is not self:
                    raise GraphError("a value from another builder or graph was passed to this builder") from None
            tensor_types = [self.type_of(v) for v in inputs if isinstance(v, Value)]
            ids = tuple(self._as_value(v, tensor_types) for v in inputs)
        in_tids = tuple([vt[v] for v in ids])
        try:
            key: Any = (opdef.id, exact_key(attrs), in_tids) if attrs else (opdef.id, in_tids)
            memo = self._infer_memo.get(key)
        except TypeError:  # unhashable attribute values (lists): normalise first
            memo, key = None, None
        if memo is None:
            r = resolve(opdef, [self._types[t] for t in in_tids], attrs)
            aid = self._attr_id(r.attrs)
            memo = (tuple(self._type_id(t) for t in r.out_types), r.version, aid)
            if key is not None:
                self._infer_memo[key] = memo
        out_tids, version, aid = memo
        if self.hash_cons:
            cse_key = (opdef.id, aid, ids)
            hit = self._cse.get(cse_key)
            if hit is not None:
                return self._wrap(hit)
        self._frozen = None
        op = len(self._op_kind)
        self._op_kind.append(opdef.id)
        self._op_attr.append(aid)
        self._op_version.append(version)
        in_ids = self._in_ids
        in_ids.extend(ids)
        self._in_ptr.append(len(in_ids))
        first = len(vt)
        if len(out_tids) == 1:  # the common case, without the general bookkeeping
            vt.append(out_tids[0])
            self._value_producer.append(op)
            self._value_index.append(0)
            self._out_ids.append(first)
            self._out_ptr.append(len(self._out_ids))
            outs: tuple[int, ...] = (first,)
        else:
            n_out = len(out_tids)
            outs = tuple(range(first, first + n_out))
            vt.extend(out_tids)
            self._value_producer.extend([op] * n_out)
            self._value_index.extend(range(n_out))
            self._out_ids.extend(outs)
            self._out_ptr.append(len(self._out_ids))
        if self.hash_cons:
            self._cse[cse_key] = outs
        if name is not None:
            self._op_names[op] = name
            if len(outs) == 1:
                self._set_name(outs[0], name)
        if len(outs) == 1:
            return Value(self, first)
        return self._wrap(outs)

    def _wrap(self, outs: tuple[int, ...]) -> Any:
        if len(outs) == 1:
            return Value(self, outs[0])
        return tuple(Value(self, v) for v in outs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name.startswith("build_op_"):
            name = name[len("build_op_"):]
        try:
            opdef = get_op(name)
        except KeyError:
            raise AttributeError(f"GraphBuilder has no attribute or op kind {name!r}") from None

        def build(*inputs: ValueLike, name: str | None = None, **attrs: Any) -> Any:
            return self.op(opdef, *inputs, name=name, **attrs)

        build.__doc__ = opdef.doc
        return build

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
        self._touch()
        for v in values:
            self._outputs.append(self._as_value(v, []))

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
        if dst not in self._inputs:
            raise GraphError(f"update destination %{dst} is not an input")
        if self.type_of(src) != self.type_of(dst):
            raise GraphError(f"update changes type: {self.type_of(src)} -> {self.type_of(dst)}")
        self._touch()
        self._updates.append((src, dst))

    def name(self, value: Value, name: str) -> Value:
        """Give a value a symbolic name (kept in .cgs files and dumps)."""
        self._touch()
        self._set_name(value.id, name)
        return value

    def describe(self, kind: str, index: int, text: str) -> None:
        """Attach a description to a 'value', 'op' or 'constant' (the .cgs description)."""
        self._touch()
        self._descriptions[(kind, int(index))] = text

    # ------------------------------------------------------------ freezing
    def freeze(self) -> Graph:
        """The graph built so far, as an immutable columnar :class:`Graph`.

        The builder stays usable; freezing again without changes returns
        the same Graph object.
        """
        if self._frozen is None:
            self._frozen = Graph(
                op_kind=self._op_kind,
                op_attr=self._op_attr,
                op_version=self._op_version,
                in_ptr=self._in_ptr,
                in_ids=self._in_ids,
                out_ptr=self._out_ptr,
                out_ids=self._out_ids,
                value_type=self._value_type,
                value_producer=self._value_producer,
                value_index=self._value_index,
                types=self._types,
                attrs=self._attrs,
                constants=self._constants,
                inputs=self._inputs,
                outputs=self._outputs,
                updates=self._updates,
                symbols=Symbols(dict(self._value_names), dict(self._op_names),
                                dict(self._const_names), dict(self._descriptions)),
            )
        return self._frozen

    def run(self, feeds: Mapping[Any, Any] | None = None, targets: Sequence[Any] | None = None,
            *, backend: str = "numpy") -> list[np.ndarray]:
        """Evaluate ``targets`` from ``feeds`` on the ops they need (seed 003's ``run``).

        Values built later are not affected; values of this builder, their
        ids or names are accepted as keys and targets.
        """
        graph = self.freeze()
        feeds = {(k.id if isinstance(k, Value) else k): v for k, v in (feeds or {}).items()}
        targets = None if targets is None else [t.id if isinstance(t, Value) else t for t in targets]
        return graph.run(feeds, targets, backend=backend)
