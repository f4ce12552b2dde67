"""Dask task graphs: export a :class:`Graph` to run on Dask, import Dask graphs, and a Dask ``get``.

:func:`to_dask` turns a graph into a Dask graph ``{key: task}``: one task per
op calling a :class:`Kernel` (the op's NumPy kernel with its attributes),
constants and fed inputs as data, ``operator.getitem`` tasks picking the
outputs of multi-output ops (keyed by the tuple of their output names).
Keys are the value names of :func:`opgraph.io.dag.value_names`.

    >>> import numpy as np, opgraph, dask.threaded
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> b.output(b.op("sum", b.op("multiply", x, 2.0), axis=0, name="y"))
    >>> g = b.freeze()
    >>> form = to_dask(g, {"x": np.arange(3.0)})
    >>> dask.threaded.get(form.dsk, form.keys)
    (array(6.),)
    >>> from_dask(form.dsk, form.keys, inputs=form.inputs) == g
    True

:func:`from_dask` reads the tasks back: :class:`Kernel` calls, NumPy ufuncs
and reductions, ``operator`` arithmetic, ``functools.partial`` and
``dask.utils.apply`` wrappers. Any other callable is an error unless the
caller maps it explicitly with ``functions={callable: kind name or
translator}``, where a translator ``f(builder, *args, **kwargs)`` builds
opgraph ops for it; no Python code ends up inside the graph. :func:`get`
follows Dask's ``get(dsk, keys)`` protocol on top of that: import, then run
with opgraph's executor.

    >>> inc = lambda v: v + 1
    >>> get({"a": 1, "b": (inc, "a")}, "b", functions={inc: lambda b, v: b.add(v, 1)})
    array(2)
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from opgraph.core.builder import GraphBuilder
from opgraph.core.feeds import coerce_feed
from opgraph.core.graph import Graph, Value
from opgraph.core.registry import get_op, unknown_op_message
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import GraphError
from opgraph.io.dag import Constant, _tuple_dag, is_hashable, value_names


class Kernel:
    """A picklable task function: op ``kind``'s NumPy kernel with fixed attributes.

    >>> Kernel("sum", (("axis", (0,)), ("keepdims", False)))(np.ones((2, 3)))
    array([2., 2., 2.])
    """

    __slots__ = ("attrs", "kind", "version")

    def __init__(self, kind: str, attrs: Sequence[tuple[str, Any]] = (), version: int = 0) -> None:
        self.kind = kind
        self.attrs = tuple(attrs)
        self.version = version

    def __call__(self, *args: Any) -> Any:
        fn = get_op(self.kind).kernel_for(self.version)
        return fn(*[np.asarray(a) for a in args], **dict(self.attrs))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Kernel, (self.kind, self.attrs, self.version))

    def __repr__(self) -> str:
        return f"Kernel({self.kind!r}, {self.attrs!r})"


class DaskForm(NamedTuple):
    """A graph as a Dask graph: ``dsk``, the output ``keys`` and the ``inputs`` keys (data when fed)."""

    dsk: dict[Hashable, Any]
    keys: list[Hashable]
    inputs: tuple[Hashable, ...]


def to_dask(graph: Graph, feeds: Mapping[str, Any] | None = None) -> DaskForm:
    """Export ``graph`` as a Dask graph; ``feeds`` (by input name) become data entries.

    Inputs not fed are left out of ``dsk``: add them before running it.
    """
    form = _tuple_dag(graph, [str(name) for name in value_names(graph)])  # Dask keys are exact str
    dsk: dict[Hashable, Any] = {}
    for name, value in (feeds or {}).items():
        if name not in form.types:
            raise GraphError(f"{name!r} is not an input of the graph (inputs: {form.inputs})")
        dsk[name] = coerce_feed(graph, _input_id(graph, form, name), value)
    ops = {outs: int(op) for outs, op in zip(form.dag, graph.topological_order().tolist(), strict=True)}
    for outs, entry in form.dag.items():
        fn = entry["fn"]
        kind, attrs = (fn, ()) if isinstance(fn, str) else fn
        if kind == "const":
            dsk[outs[0]] = attrs[0][1].array
            continue
        task = (Kernel(kind, attrs, int(graph.op_version[ops[outs]])), *entry["args"])
        if len(outs) == 1:
            dsk[outs[0]] = task
        else:
            dsk[outs] = task
            for i, name in enumerate(outs):
                dsk[name] = (operator.getitem, outs, i)
    return DaskForm(dsk, list(form.outputs), form.inputs)


def _input_id(graph: Graph, form: Any, name: str) -> int:
    return int(graph.inputs[form.inputs.index(name)])


# ---------------------------------------------------------------- import
def _known_functions() -> dict[Any, str]:
    from opgraph.ops.elementwise import BINARY, UNARY
    from opgraph.ops.reduction import REDUCTIONS

    known: dict[Any, str] = {}
    for name, _id, uf, *_ in [*UNARY, *BINARY]:
        if isinstance(uf, np.ufunc):
            known.setdefault(uf, name)
    for name, _id, fn in REDUCTIONS:
        known[fn] = name
    known.update({operator.add: "add", operator.sub: "subtract", operator.mul: "multiply",
                  operator.truediv: "divide", operator.floordiv: "floor_divide", operator.mod: "remainder",
                  operator.pow: "power", operator.neg: "negative", operator.pos: "positive",
                  operator.abs: "abs", abs: "abs", np.round: "round", np.where: "where", np.clip: "clip"})
    return known


KNOWN = _known_functions()
"""Callables :func:`from_dask` maps to op kinds without being told (NumPy ufuncs and reductions, operator)."""

Translator = str | Callable[..., Any]


def _is_task(x: Any) -> bool:
    return type(x) is tuple and len(x) > 0 and callable(x[0])


def _is_key(x: Any, dsk: Mapping[Hashable, Any]) -> bool:
    try:
        return x in dsk
    except TypeError:
        return False


def _deps(expr: Any, dsk: Mapping[Hashable, Any], out: list[Hashable]) -> None:
    if _is_key(expr, dsk):
        out.append(expr)
    elif _is_task(expr):
        for a in expr[1:]:
            _deps(a, dsk, out)
    elif isinstance(expr, list):
        for a in expr:
            _deps(a, dsk, out)
    elif isinstance(expr, dict):
        for a in expr.values():
            _deps(a, dsk, out)


def _order(dsk: Mapping[Hashable, Any], roots: list[Hashable]) -> list[Hashable]:
    """Keys the roots need, dependencies first (iterative: Dask graphs may be deep chains)."""
    done: set[Hashable] = set()
    active: set[Hashable] = set()
    order: list[Hashable] = []
    for root in roots:
        stack: list[tuple[Hashable, bool]] = [(root, False)]
        while stack:
            key, finish = stack.pop()
            if finish:
                active.discard(key)
                done.add(key)
                order.append(key)
                continue
            if key in done:
                continue
            if key in active:
                raise GraphError(f"the Dask graph has a cycle through {key!r}")
            active.add(key)
            stack.append((key, True))
            deps: list[Hashable] = []
            _deps(dsk[key], dsk, deps)
            stack.extend((d, False) for d in reversed(deps) if d not in done)
    return order


_GENERATED = re.compile(r"_\d+_*")


def _kept_key(key: Hashable) -> str | None:
    # to_dask keys unnamed values "_<id>" as plain str (Dask accepts no str subclass such as
    # opgraph.io.dag.GeneratedName), so from_dask leaves values keyed that way unnamed
    return key if isinstance(key, str) and not _GENERATED.fullmatch(key) else None


class _Importer:
    def __init__(self, dsk: Mapping[Hashable, Any], inputs: Sequence[Hashable],
                 functions: Mapping[Any, Translator] | None, call_unknown: bool = False) -> None:
        self.dsk = dsk
        self.call_unknown = call_unknown
        self.inputs = set(inputs)
        self.functions = dict(functions or {})
        self.b = GraphBuilder(hash_cons=False)
        self.env: dict[Hashable, Any] = {}
        self.feeds: dict[int, Any] = {}
        self._computed: dict[int, np.ndarray] = {}  # values computed for Python calls (call_unknown)

    def key(self, key: Hashable) -> None:
        expr = self.dsk[key]
        if key in self.inputs:
            if _is_task(expr) or _is_key(expr, self.dsk):
                raise GraphError(f"input {key!r} must be data in the Dask graph, not a task")
            arr = np.asarray(expr)
            v = self.b.input(TensorType.of(arr), name=_kept_key(key))
            self.feeds[v.id] = arr
            self.env[key] = v
            return
        value = self.materialize(self.expr(expr, key))
        name = _kept_key(key)
        if isinstance(value, Value) and name is not None and value.name is None:
            self._name(value.id, name)
        self.env[key] = value

    def _name(self, vid: int, name: str) -> None:
        self.b._touch()
        self.b._set_name(vid, name)

    def expr(self, e: Any, where: Hashable) -> Any:
        if _is_key(e, self.dsk):
            return self.env[e]
        if _is_task(e):
            return self.call(e[0], [self.expr(a, where) for a in e[1:]], {}, where)
        if isinstance(e, list):
            return [self.expr(a, where) for a in e]
        if isinstance(e, (bool, int, float, complex, np.ndarray, np.generic)):
            return e  # task arguments stay Python data until an op takes them (scalars are then weakly typed)
        if isinstance(e, Constant):
            return e.array
        if isinstance(e, dict):  # keywords of apply tasks
            return {k: self.expr(v, where) for k, v in e.items()}
        if callable(e) or self.call_unknown:  # a function of an apply task, or data for a Python call
            return e
        raise GraphError(f"{where!r}: cannot import {type(e).__name__} {e!r} (opgraph values are tensors)")

    def materialize(self, x: Any) -> Any:
        """Data left over as a key's value become constants (inside lists and tuples too)."""
        if isinstance(x, list):
            return [self.materialize(a) for a in x]
        if isinstance(x, tuple):
            return tuple(self.materialize(a) for a in x)
        return x if isinstance(x, Value) else self.b.constant(x)

    def call(self, fn: Any, args: list[Any], kwargs: dict[str, Any], where: Hashable) -> Any:
        from dask.utils import apply

        if fn is apply:
            inner = args[0]
            pos = args[1] if len(args) > 1 else []
            kw = args[2] if len(args) > 2 else {}
            if not isinstance(pos, list) or not isinstance(kw, dict):
                raise GraphError(f"{where!r}: apply tasks need a list of arguments and a dict of keywords")
            return self.call(inner, pos, {**kwargs, **kw}, where)
        if isinstance(fn, functools.partial):
            return self.call(fn.func, [*fn.args, *args], {**fn.keywords, **kwargs}, where)
        if isinstance(fn, Kernel):
            return self.op(fn.kind, args, {**dict(fn.attrs), **kwargs}, where)
        if fn is operator.getitem and isinstance(args[0], (tuple, list)):
            return args[0][_int(args[1])]
        translator = self.functions.get(fn) if is_hashable(fn) else None
        if translator is None and is_hashable(fn):
            translator = KNOWN.get(fn)
        if translator is None and self.call_unknown:
            # get() runs the graph once on the data it holds, so calling the function now is exact
            return fn(*[self.concrete(a) for a in args], **{k: self.concrete(v) for k, v in kwargs.items()})
        if translator is None:
            name = getattr(fn, "__qualname__", repr(fn))
            raise GraphError(f"{where!r}: opgraph does not know the function {name}; map it to an op kind or a "
                             "translator with functions={fn: ...}")
        if isinstance(translator, str):
            return self.op(translator, args, kwargs, where)
        return translator(self.b, *args, **kwargs)

    def concrete(self, x: Any) -> Any:
        """``x`` with every opgraph value replaced by its computed array (for a call in Python)."""
        if isinstance(x, Value):
            hit = self._computed.get(x.id)
            if hit is None:
                self._evaluate(x.id)
                hit = self._computed[x.id]
            return hit
        if isinstance(x, list):
            return [self.concrete(a) for a in x]
        if isinstance(x, tuple):
            return tuple(self.concrete(a) for a in x)
        return x

    def _evaluate(self, vid: int) -> None:
        """Compute value ``vid`` with opgraph's executor, running only ops not computed before.

        Each call costs the ops it newly runs, not the size of the builder: freezing the
        whole builder for every Python call made a chain of n Python tasks O(n^2).
        Constants and fed inputs are known without running anything.
        """
        b, computed = self.b, self._computed

        def producer(v: int) -> int:
            op = b.producer_of(v)
            return -1 if op is None else op.id

        def known(v: int) -> bool:
            if v in computed:
                return True
            p = producer(v)
            if p < 0:
                computed[v] = np.asarray(self.feeds[v])
                return True
            if b.kind_of(p) == "const":
                arr = b._constants[b.attrs_of(p)["index"]].view()
                arr.flags.writeable = False  # as Graph.run hands out constants
                computed[v] = arr
                return True
            return False

        if known(vid):
            return
        # The ops to run, dependencies first (iterative: the builder may hold a deep chain).
        ops: list[int] = []
        seen: set[int] = set()
        stack: list[tuple[int, bool]] = [(producer(vid), False)]
        while stack:
            op, finish = stack.pop()
            if finish:
                ops.append(op)
                continue
            if op in seen:
                continue
            seen.add(op)
            stack.append((op, True))
            stack.extend((producer(v), False) for v in reversed(b.op_inputs(op)) if not known(v))
        # A graph of just those ops; every value they read that is already known is one of its inputs.
        ins = [b.op_inputs(op) for op in ops]
        outs = [b.op_outputs(op) for op in ops]
        boundary = list(dict.fromkeys(v for vs in ins for v in vs if v in computed))
        values = boundary + [v for vs in outs for v in vs]
        local = {v: k for k, v in enumerate(values)}
        types: dict[ValueType, int] = {}
        n_in = len(boundary)
        sub = Graph(
            op_kind=[get_op(b.kind_of(op)).id for op in ops],
            op_attr=range(len(ops)), attrs=[tuple(b.attrs_of(op).items()) for op in ops],
            op_version=[b.op_version[op] for op in ops],
            in_ptr=np.cumsum([0] + [len(vs) for vs in ins]), in_ids=[local[v] for vs in ins for v in vs],
            out_ptr=np.cumsum([0] + [len(vs) for vs in outs]), out_ids=range(n_in, len(values)),
            value_type=[types.setdefault(b.type_of(v), len(types)) for v in values],
            value_producer=[-1] * n_in + [k for k, vs in enumerate(outs) for _ in vs],
            value_index=[0] * n_in + [j for vs in outs for j in range(len(vs))],
            types=list(types), constants=[], inputs=range(n_in),
        )
        results = sub.run({k: computed[v] for k, v in enumerate(boundary)}, list(range(n_in, len(values))))
        computed.update(zip(values[n_in:], results, strict=True))

    def op(self, kind: str, args: list[Any], attrs: dict[str, Any], where: Hashable) -> Any:
        try:
            get_op(kind)
        except KeyError:
            raise GraphError(f"{where!r}: {unknown_op_message(kind)}") from None
        if kind in ("sum", "prod", "max", "min", "mean", "any", "all") and "keepdims" in attrs:
            attrs = {**attrs, "keepdims": bool(attrs["keepdims"])}
        for a in args:
            if isinstance(a, (list, tuple)):
                raise GraphError(f"{where!r}: {kind} got a list; opgraph ops take tensors")
        return self.b.op(kind, *args, **attrs)


def _int(x: Any) -> int:
    if isinstance(x, Value):
        raise GraphError("getitem with a computed index is not supported")
    return int(x)


def _flatten(keys: Any) -> list[Hashable]:
    if isinstance(keys, list):
        return [k for sub in keys for k in _flatten(sub)]
    return [keys]


def _leaves(x: Any) -> list[Value]:
    if isinstance(x, (list, tuple)):
        return [v for sub in x for v in _leaves(sub)]
    return [x]


def _import(dsk: Any, keys: Any, inputs: Sequence[Hashable], functions: Mapping[Any, Translator] | None,
            everything: bool = False, call_unknown: bool = False) -> tuple[_Importer, Any]:
    dsk = dsk.to_dict() if hasattr(dsk, "to_dict") else dict(dsk)
    wanted = _flatten(keys)
    for k in wanted:
        if not _is_key(k, dsk):
            raise KeyError(k)
    imp = _Importer(dsk, inputs, functions, call_unknown)
    for name in inputs:
        if name not in dsk:
            raise KeyError(name)
        imp.key(name)
    roots = list(dsk) if everything else wanted
    for key in _order(dsk, [k for k in roots if k not in imp.env]):
        if key not in imp.env:
            imp.key(key)

    def structure(k: Any) -> Any:
        return [structure(s) for s in k] if isinstance(k, list) else imp.env[k]

    return imp, structure(keys)


def from_dask(dsk: Mapping[Hashable, Any], keys: Any, *, inputs: Sequence[Hashable] = (),
              functions: Mapping[Any, Translator] | None = None) -> Graph:
    """Import a Dask graph (every key, in its order) as a :class:`Graph`; ``keys`` are the outputs.

    Outputs are the values of ``keys`` (a key or a nested list of keys; a
    key whose task returns a list or tuple contributes all its tensors).
    Keys in ``inputs`` become graph inputs typed by their data; other data
    become constants.
    """
    imp, result = _import(dsk, keys, inputs, functions, everything=True)
    imp.b.output(*_leaves(result))
    return imp.b.freeze()


def get(dsk: Mapping[Hashable, Any], keys: Any, *, functions: Mapping[Any, Translator] | None = None,
        call_unknown: bool = True, **kwargs: Any) -> Any:
    """Dask's ``get(dsk, keys)`` on opgraph: import (:func:`from_dask`), then run with opgraph's executor.

    Tasks calling functions opgraph knows (or ``functions`` maps) become
    opgraph ops. With ``call_unknown`` (the default, as Dask does) any other
    callable is called in Python while importing, on its arguments' computed
    values and on literal data of any type, and its result becomes a
    constant: exact, because ``get`` runs the graph once on the data the
    Dask graph holds. ``call_unknown=False`` refuses them as :func:`from_dask` does.

    A list of keys gives a tuple (nested lists, nested tuples); a task that
    builds a list gives a list. Results are NumPy arrays. Unknown keys raise
    KeyError; other keyword arguments are accepted and ignored, as Dask
    schedulers do.
    """
    imp, result = _import(dsk, keys, (), functions, call_unknown=call_unknown)
    leaves = _leaves(result)
    graph = imp.b.freeze()
    values = iter(graph.run(imp.feeds, [v.id for v in leaves]))

    def rebuild(x: Any, top: bool) -> Any:
        if isinstance(x, list):
            seq = [rebuild(s, top) for s in x]
            return tuple(seq) if top else seq
        if isinstance(x, tuple):
            return tuple(rebuild(s, False) for s in x)
        return next(values)

    def walk(k: Any, r: Any) -> Any:
        if isinstance(k, list):
            return tuple(walk(sk, sr) for sk, sr in zip(k, r, strict=True))
        return rebuild(r, False)

    return walk(keys, result)


__all__ = ["KNOWN", "DaskForm", "Kernel", "from_dask", "get", "to_dask"]
