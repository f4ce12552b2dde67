"""Dict DAG formats (seed 001, after mrocklin/dicdag) and conversions to and from a :class:`Graph`.

Four formats, all plain dicts keyed by variables (value names):

* **dag**: ``{out: {'fn': f, 'args': (in1, in2)}}``; a multi-output op is
  keyed by the tuple of its outputs and each output has an ``'_index'``
  entry ``{c: {'fn': '_index', 'args': ((c, d), 0)}}`` (the reduced
  index-dag of dicdag);
* **tuple-dag**: ``{(outs): {'fn': f, 'args': (ins)}}``;
* **index-dag**: a tuple-dag plus one ``'_index'`` entry per output, also
  for single outputs;
* **unidag** of jobs ``{job: (later jobs)}`` where a job is the hashable
  triple ``(args, fn, out)`` of one dag entry.

An op's ``fn`` is its kind name (``'exp'``) when it has no attributes, else
``(kind, ((name, value), ...))`` with the normalised attributes, e.g.
``('sum', (('axis', (1,)), ('keepdims', False)))``; on import
``(kind, {'axis': 1})`` is accepted too. A constant is
``('const', (('value', Constant(array)),))``. Values are named by the
graph's names, or ``_<id>`` when unnamed: such a made-up name is a
:class:`GeneratedName` (a ``str`` that marks it), which ``from_*`` does not
keep, while every string a user gave, ``'_0'`` included, becomes the value's
name. Graph inputs are not dag keys: a graph converts to a :class:`DagForm`
``(dag, inputs, outputs, types)`` where ``types`` maps each input name to
its type. :func:`inputs_of` and :func:`outputs_of` tell, from a bare dict,
which variables it reads without computing and computes without reading.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2, 3)), name="x")
    >>> s = b.op("sum", x, axis=1, name="s")
    >>> b.output(b.op("exp", s))
    >>> form = to_dag(b.freeze())
    >>> form.dag
    {'s': {'fn': ('sum', (('axis', (1,)), ('keepdims', False))), 'args': ('x',)}, '_2': {'fn': 'exp', 'args': ('s',)}}
    >>> form.inputs, form.outputs
    (('x',), ('_2',))
    >>> from_dag(*form) == b.freeze()
    True
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Graph
from opgraph.core.registry import get_op, unknown_op_message
from opgraph.core.types import ValueType, as_type
from opgraph.errors import GraphError

INDEX = "_index"
"""The ``fn`` of index entries (dicdag's ``index`` keyword)."""

Dag = dict[Hashable, dict[str, Any]]


class GeneratedName(str):
    """The name ``to_*`` makes up for an unnamed value (``_<id>``); ``from_*`` leaves such values unnamed.

    It is a ``str`` (equal to and hashing as the plain string, so dicts and
    hand-added entries find it) whose type alone marks it: a plain string,
    ``'_0'`` included, is a name the user gave and is kept.

    >>> GeneratedName("_3") == "_3", kept_name(GeneratedName("_3")), kept_name("_3")
    (True, None, '_3')
    """

    __slots__ = ()


class Constant:
    """A hashable wrapper of a constant array (so dag entries can be unidag jobs).

    >>> import numpy as np
    >>> Constant(np.arange(3)) == Constant([0, 1, 2]), hash(Constant(1.0)) == hash(Constant(1.0))
    (True, True)
    """

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = np.asarray(array)

    def _key(self) -> tuple[Any, ...]:
        return (self.array.dtype.str, self.array.shape, self.array.tobytes())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constant) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Constant({self.array!r})"


class DagForm(NamedTuple):
    """A graph as a dict DAG plus its gateways: ``(dag, inputs, outputs, types)``."""

    dag: dict[Hashable, dict[str, Any]]
    inputs: tuple[Hashable, ...]
    outputs: tuple[Hashable, ...]
    types: dict[Hashable, ValueType]


# ---------------------------------------------------------------- format conversions
def tuple_dag_to_index_dag(tdag: Mapping[Hashable, Mapping[str, Any]]) -> Dag:
    """Add an ``'_index'`` entry for every output of every op.

    >>> tuple_dag_to_index_dag({("c", "d"): {"fn": "split", "args": ("a",)}})["d"]
    {'fn': '_index', 'args': (('c', 'd'), 1)}
    """
    out: Dag = {}
    for outs, entry in tdag.items():
        out[outs] = dict(entry)
        for i, var in enumerate(outs):
            out[var] = {"fn": INDEX, "args": (outs, i)}
    return out


def _is_index(entry: Mapping[str, Any]) -> bool:
    return isinstance(entry["fn"], str) and entry["fn"] == INDEX


def index_dag_to_tuple_dag(idag: Mapping[Hashable, Mapping[str, Any]]) -> Dag:
    """Drop the ``'_index'`` entries (dicdag's ``remove_index_entries``).

    >>> index_dag_to_tuple_dag(tuple_dag_to_index_dag({("a",): {"fn": "exp", "args": ("x",)}}))
    {('a',): {'fn': 'exp', 'args': ('x',)}}
    """
    return {k: dict(v) for k, v in idag.items() if not _is_index(v)}


def remove_singleton_indices(idag: Mapping[Hashable, Mapping[str, Any]]) -> Dag:
    """Reduce an index-dag: a single-output op is keyed by its output directly (index-dag -> dag).

    >>> remove_singleton_indices({"a": {"fn": "_index", "args": (("a",), 0)},
    ...                           ("a",): {"fn": "exp", "args": ("x",)}})
    {'a': {'fn': 'exp', 'args': ('x',)}}
    """
    out: Dag = {}
    for k, v in idag.items():
        if _is_index(v):
            if len(v["args"][0]) != 1:
                out[k] = dict(v)
        elif isinstance(k, tuple) and len(k) == 1 and idag.get(k[0], {}).get("fn") == INDEX:
            out[k[0]] = dict(v)
        else:
            out[k] = dict(v)
    return out


def insert_single_indices(dag: Mapping[Hashable, Mapping[str, Any]]) -> Dag:
    """Inverse of :func:`remove_singleton_indices` (dag -> index-dag).

    >>> insert_single_indices({"a": {"fn": "exp", "args": ("x",)}})
    {('a',): {'fn': 'exp', 'args': ('x',)}, 'a': {'fn': '_index', 'args': (('a',), 0)}}
    """
    out: Dag = {}
    multi = _tuple_keys(dag)
    for k, v in dag.items():
        if not _is_index(v) and k not in multi:
            out[(k,)] = dict(v)
            out[k] = {"fn": INDEX, "args": ((k,), 0)}
        else:
            out[k] = dict(v)
    return out


def _tuple_keys(dag: Mapping[Hashable, Mapping[str, Any]]) -> set[Hashable]:
    return {v["args"][0] for v in dag.values() if _is_index(v)}


index_dag_to_dag = remove_singleton_indices
dag_to_index_dag = insert_single_indices


def dag_to_tuple_dag(dag: Mapping[Hashable, Mapping[str, Any]]) -> Dag:
    """dag -> tuple-dag (through the index-dag)."""
    return index_dag_to_tuple_dag(insert_single_indices(dag))


def tuple_dag_to_dag(tdag: Mapping[Hashable, Mapping[str, Any]]) -> Dag:
    """tuple-dag -> dag (through the index-dag)."""
    return remove_singleton_indices(tuple_dag_to_index_dag(tdag))


Job = tuple[Any, Any, Hashable]


def _job(dag: Mapping[Hashable, Mapping[str, Any]], var: Hashable) -> Job:
    return (tuple(dag[var]["args"]), dag[var]["fn"], var)


def dag_to_backward_unidag(dag: Mapping[Hashable, Mapping[str, Any]]) -> dict[Job, tuple[Job, ...]]:
    """``{job: (jobs it needs)}``; a job is ``(args, fn, out)``.

    >>> dag_to_backward_unidag({"b": {"fn": "exp", "args": ("a",)}})
    {(('a',), 'exp', 'b'): ()}
    """
    return {_job(dag, v): tuple(_job(dag, a) for a in dag[v]["args"] if is_hashable(a) and a in dag) for v in dag}


def is_hashable(x: Any) -> bool:
    """Whether ``x`` can be a dict key (its hash does not raise).

    >>> is_hashable(("a", 1)), is_hashable(["a"])
    (True, False)
    """
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _reverse(d: Mapping[Any, Sequence[Any]]) -> dict[Any, tuple[Any, ...]]:
    out: dict[Any, list[Any]] = {}
    for k, vs in d.items():
        for v in vs:
            out.setdefault(v, []).append(k)
    return {k: tuple(v) for k, v in out.items()}


def dag_to_unidag(dag: Mapping[Hashable, Mapping[str, Any]]) -> dict[Job, tuple[Job, ...]]:
    """``{job: (jobs that follow it)}``; jobs nothing follows map to ``()``.

    >>> dag = {"b": {"fn": "exp", "args": ("a",)}, "c": {"fn": "add", "args": ("a", "b")}}
    >>> dag_to_unidag(dag)[(("a",), "exp", "b")]
    ((('a', 'b'), 'add', 'c'),)
    """
    back = dag_to_backward_unidag(dag)
    forward = _reverse(back)
    return {job: forward.get(job, ()) for job in back}


def _jobs(unidag: Mapping[Job, Sequence[Job]]) -> list[Job]:
    """Every job of a unidag: the keys, then the jobs that appear only in their tuples (first seen first)."""
    jobs = dict.fromkeys(unidag)
    for linked in unidag.values():
        jobs.update(dict.fromkeys(linked))
    for job in jobs:
        if not (isinstance(job, tuple) and len(job) == 3):
            raise GraphError(f"unidag job {job!r} is not an (args, fn, out) triple")
    return list(jobs)


def backward_unidag_to_dag(unidag: Mapping[Job, Sequence[Job]]) -> Dag:
    """Inverse of :func:`dag_to_backward_unidag`; a job named only as needed is kept too.

    >>> a, b = (("x",), "exp", "a"), (("a",), "negative", "b")
    >>> backward_unidag_to_dag({b: (a,)})
    {'b': {'fn': 'negative', 'args': ('a',)}, 'a': {'fn': 'exp', 'args': ('x',)}}
    """
    return {out: {"fn": fn, "args": tuple(args)} for (args, fn, out) in _jobs(unidag)}


def unidag_to_dag(unidag: Mapping[Job, Sequence[Job]]) -> Dag:
    """Inverse of :func:`dag_to_unidag`: every job, as a key or only as a later job, is a dag entry.

    The seed's ``{a: (b, c), b: (c,)}`` keeps the terminal job ``c``:

    >>> a, b, c = (("x",), "exp", "a"), (("a",), "negative", "b"), (("a", "b"), "add", "c")
    >>> unidag_to_dag({a: (b, c), b: (c,)})
    {'a': {'fn': 'exp', 'args': ('x',)}, 'b': {'fn': 'negative', 'args': ('a',)}, 'c': {'fn': 'add', \
'args': ('a', 'b')}}
    >>> dag = {"b": {"fn": "exp", "args": ("a",)}, "c": {"fn": "add", "args": ("a", "b")}}
    >>> unidag_to_dag(dag_to_unidag(dag)) == dag
    True
    """
    return backward_unidag_to_dag(unidag)


def _as_tuple_dag(dag: Mapping[Hashable, Any]) -> Mapping[Hashable, Mapping[str, Any]]:
    """Any of the four formats as a tuple-dag (for :func:`inputs_of` / :func:`outputs_of`)."""
    if dag and not any(isinstance(v, Mapping) for v in dag.values()):
        dag = unidag_to_dag(dag)
    for key, entry in dag.items():
        if not (isinstance(entry, Mapping) and "fn" in entry and "args" in entry):
            raise GraphError(f"dag entry {key!r} is {entry!r}: expected {{'fn': ..., 'args': (...)}}")
    if not any(_is_index(v) for v in dag.values()) and all(isinstance(k, tuple) for k in dag):
        return dag  # keys all tuples and no '_index' entry: a tuple-dag, as dicdag reads it
    return dag_to_tuple_dag(dag)


def _reads(tdag: Mapping[Hashable, Mapping[str, Any]]) -> dict[Hashable, None]:
    return {a: None for entry in tdag.values() for a in entry["args"] if is_hashable(a)}


def inputs_of(dag: Mapping[Hashable, Any]) -> set[Hashable]:
    """The variables ``dag`` reads but does not compute (dicdag's ``inputs_of``), as a set.

    ``dag`` is a dag, tuple-dag, index-dag or unidag; a dict whose keys are
    all tuples and which has no ``'_index'`` entry reads as a tuple-dag, as
    in dicdag. A graph input no op reads is not among them (:class:`DagForm`
    keeps the graph's inputs).

    >>> inputs_of({("a",): {"fn": 1, "args": ("b", "c")}, ("b", "d"): {"fn": 2, "args": ("e",)},
    ...            ("f",): {"fn": 3, "args": ("d", "a")}}) == {"c", "e"}
    True
    >>> inputs_of({"y": {"fn": "add", "args": ("x", "z")}, "z": {"fn": "exp", "args": ("x",)}})
    {'x'}
    """
    tdag = _as_tuple_dag(dag)
    computed = {var for outs in tdag for var in outs}
    return {a for a in _reads(tdag) if a not in computed}


def outputs_of(dag: Mapping[Hashable, Any]) -> set[Hashable]:
    """The variables ``dag`` computes but no entry reads (dicdag's ``outputs_of``), as a set.

    ``dag`` is in any of the four formats, read as by :func:`inputs_of`. A
    graph output that also feeds another op is not among them
    (:class:`DagForm` keeps the graph's outputs).

    >>> outputs_of({("a",): {"fn": 1, "args": ("b", "c")}, ("b", "d"): {"fn": 2, "args": ("e",)},
    ...             ("f",): {"fn": 3, "args": ("d", "a")}})
    {'f'}
    >>> sorted(outputs_of({"y": {"fn": "add", "args": ("x", "z")}, ("z", "w"): {"fn": "split", "args": ("x",)},
    ...                    "z": {"fn": "_index", "args": (("z", "w"), 0)},
    ...                    "w": {"fn": "_index", "args": (("z", "w"), 1)}}))
    ['w', 'y']
    """
    tdag = _as_tuple_dag(dag)
    reads = _reads(tdag)
    return {var for outs in tdag for var in outs if var not in reads}


# ---------------------------------------------------------------- Graph <-> tuple-dag
def value_names(graph: Graph) -> list[str]:
    """A unique name per value: the graph's name, else a :class:`GeneratedName` ``_<id>`` (``_`` appended on a clash).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", ()), name="_1")
    >>> b.output(b.exp(x))
    >>> names = value_names(b.freeze())
    >>> names, [type(n).__name__ for n in names]
    (['_1', '_1_'], ['str', 'GeneratedName'])
    """
    taken = set(graph.symbols.values.values())
    names: list[str] = []
    for v in range(graph.num_values):
        name = graph.symbols.values.get(v)
        if name is None:
            made = f"_{v}"
            while made in taken:
                made += "_"
            taken.add(made)
            name = GeneratedName(made)
        names.append(name)
    return names


def op_fn(graph: Graph, op: int) -> Any:
    """The ``fn`` of op ``op``: kind name, or ``(kind, attribute pairs)``."""
    kind = graph.kind_of(op)
    if kind == "const":
        return ("const", (("value", Constant(graph.constant_of(op))),))
    attrs = graph.attrs[graph.op_attr[op]]
    return (kind, tuple(attrs)) if attrs else kind


def parse_fn(fn: Any) -> tuple[str, dict[str, Any]]:
    """``fn`` -> ``(kind, attrs)``; accepts a kind name, ``(kind, pairs)`` or ``(kind, dict)``.

    >>> parse_fn(("sum", {"axis": 1}))
    ('sum', {'axis': 1})
    """
    if isinstance(fn, str):
        kind, attrs = fn, {}
    elif isinstance(fn, tuple) and len(fn) == 2 and isinstance(fn[0], str):
        kind, attrs = fn[0], dict(fn[1])
    else:
        raise GraphError(f"cannot read op {fn!r}: expected a kind name or (kind, attributes)")
    if kind == INDEX:
        raise GraphError("'_index' entries belong to index-dags; convert to a tuple-dag first")
    if kind != "const":
        try:
            get_op(kind)
        except KeyError:
            raise GraphError(unknown_op_message(kind)) from None
    return kind, attrs


def to_tuple_dag(graph: Graph) -> DagForm:
    """A graph as a tuple-dag ``{(outs): {'fn': f, 'args': (ins)}}`` with its gateways.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (4,)), name="x")
    >>> lo, hi = b.op("split", x, sections=2)
    >>> b.output(b.op("add", lo, hi, name="s"))
    >>> to_tuple_dag(b.freeze()).dag
    {('_1', '_2'): {'fn': ('split', (('sections', 2), ('axis', 0))), 'args': ('x',)}, ('s',): {'fn': 'add', \
'args': ('_1', '_2')}}
    """
    return _tuple_dag(graph, value_names(graph))


def _tuple_dag(graph: Graph, names: Sequence[Hashable]) -> DagForm:
    # names[v] keys value v (io.dask passes plain strings: Dask keys must be exact str)
    if len(graph.updates):
        raise GraphError("dict DAG formats cannot express update edges")
    tdag: Dag = {}
    for op in graph.topological_order().tolist():
        outs = tuple(names[v] for v in graph.op_outputs(op).tolist())
        if not outs:
            raise GraphError(f"op {op} ({graph.kind_of(op)}) has no outputs; dict DAGs cannot key it")
        tdag[outs] = {"fn": op_fn(graph, op), "args": tuple(names[v] for v in graph.op_inputs(op).tolist())}
    inputs = tuple(names[v] for v in graph.inputs.tolist())
    return DagForm(tdag, inputs, tuple(names[v] for v in graph.outputs.tolist()),
                   {names[v]: graph.type_of(v) for v in graph.inputs.tolist()})


def _topo_keys(tdag: Mapping[Hashable, Mapping[str, Any]]) -> list[Hashable]:
    """Keys of a tuple-dag, producers first (depth first in insertion order, iterative)."""
    producer: dict[Hashable, Hashable] = {}
    for outs in tdag:
        for var in outs:
            if var in producer:
                raise GraphError(f"variable {var!r} is produced twice")
            producer[var] = outs
    state: dict[Hashable, int] = {}
    order: list[Hashable] = []
    for root in tdag:
        if root in state:
            continue
        stack: list[tuple[Hashable, bool]] = [(root, False)]
        while stack:
            key, done = stack.pop()
            if done:
                state[key] = 2
                order.append(key)
                continue
            if state.get(key) == 2:
                continue
            if state.get(key) == 1:
                raise GraphError(f"the dag has a cycle through {key!r}")
            state[key] = 1
            stack.append((key, True))
            for a in reversed(tdag[key]["args"]):
                p = producer.get(a) if is_hashable(a) else None
                if p is not None and state.get(p) != 2:
                    if state.get(p) == 1:
                        raise GraphError(f"the dag has a cycle through {p!r}")
                    stack.append((p, False))
    return order


def kept_name(name: Hashable) -> str | None:
    """The name a graph keeps for a DAG key: any string but a :class:`GeneratedName`, else None.

    >>> kept_name("loss"), kept_name("_0"), kept_name(GeneratedName("_0")), kept_name(("x", 0))
    ('loss', '_0', None, None)
    """
    if isinstance(name, str) and not isinstance(name, GeneratedName):
        return str(name)
    return None


def from_tuple_dag(tdag: Mapping[Hashable, Mapping[str, Any]], inputs: Iterable[Hashable],
                   outputs: Iterable[Hashable], types: Mapping[Hashable, Any]) -> Graph:
    """Build a :class:`Graph` from a tuple-dag; ``types`` gives each input's type.

    Inputs come first, then ops in dependency order. String variable names
    become value names, except the :class:`GeneratedName` keys ``to_*`` made
    up for unnamed values.

    >>> g = from_tuple_dag({("y",): {"fn": "exp", "args": ("x",)}}, ["x"], ["y"], {"x": ("float32", (2,))})
    >>> print(g)
    graph(%x: f32[2]) {
      %y: f32[2] = exp(%x)
      return %y
    }
    """
    b = GraphBuilder(hash_cons=False)
    env: dict[Hashable, Any] = {}
    for name in inputs:
        if name not in types:
            raise GraphError(f"no type given for input {name!r}")
        env[name] = b.input(as_type(types[name]), name=kept_name(name))
    for key in _topo_keys(tdag):
        entry = tdag[key]
        kind, attrs = parse_fn(entry["fn"])
        if kind == "const":
            value = attrs["value"]
            outs: Any = (b.constant(value.array if isinstance(value, Constant) else value),)
        else:
            args = []
            for a in entry["args"]:
                if not is_hashable(a) or a not in env:
                    raise GraphError(f"{key!r} uses {a!r}, which is neither an input nor computed")
                args.append(env[a])
            res = b.op(kind, *args, **attrs)
            outs = res if isinstance(res, tuple) else (res,)
        if len(outs) != len(key):
            raise GraphError(f"{key!r}: op {kind} has {len(outs)} outputs")
        for var, val in zip(key, outs, strict=True):
            env[var] = val
            name = kept_name(var)
            if name is not None:
                b.name(val, name)
    for o in outputs:
        if o not in env:
            raise GraphError(f"output {o!r} is neither an input nor computed")
        b.output(env[o])
    return b.freeze()


# ---------------------------------------------------------------- Graph <-> the other formats
def to_index_dag(graph: Graph) -> DagForm:
    """A graph as an index-dag (``'_index'`` entries for every output)."""
    form = to_tuple_dag(graph)
    return form._replace(dag=tuple_dag_to_index_dag(form.dag))


def from_index_dag(idag: Mapping[Hashable, Mapping[str, Any]], inputs: Iterable[Hashable],
                   outputs: Iterable[Hashable], types: Mapping[Hashable, Any]) -> Graph:
    """Inverse of :func:`to_index_dag`."""
    return from_tuple_dag(index_dag_to_tuple_dag(idag), inputs, outputs, types)


def to_dag(graph: Graph) -> DagForm:
    """A graph as a dag (reduced index-dag); see the module doc."""
    form = to_tuple_dag(graph)
    return form._replace(dag=tuple_dag_to_dag(form.dag))


def from_dag(dag: Mapping[Hashable, Mapping[str, Any]], inputs: Iterable[Hashable],
             outputs: Iterable[Hashable], types: Mapping[Hashable, Any]) -> Graph:
    """Inverse of :func:`to_dag`."""
    return from_tuple_dag(dag_to_tuple_dag(dag), inputs, outputs, types)


def to_unidag(graph: Graph) -> DagForm:
    """A graph as a unidag of jobs ``{(args, fn, out): (later jobs)}`` (built from :func:`to_dag`)."""
    form = to_dag(graph)
    return form._replace(dag=dag_to_unidag(form.dag))  # type: ignore[arg-type]


def from_unidag(unidag: Mapping[Job, Sequence[Job]], inputs: Iterable[Hashable],
                outputs: Iterable[Hashable], types: Mapping[Hashable, Any]) -> Graph:
    """Inverse of :func:`to_unidag`.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("int64", (3,)), name="x")
    >>> b.output(b.op("cumsum", b.op("square", x), axis=0))
    >>> g = b.freeze()
    >>> from_unidag(*to_unidag(g)) == g
    True
    """
    return from_dag(unidag_to_dag(unidag), inputs, outputs, types)


__all__ = [
    "INDEX", "Constant", "DagForm", "GeneratedName", "backward_unidag_to_dag", "dag_to_backward_unidag",
    "dag_to_index_dag", "dag_to_tuple_dag", "dag_to_unidag", "from_dag", "from_index_dag", "from_tuple_dag",
    "from_unidag", "index_dag_to_dag", "index_dag_to_tuple_dag", "inputs_of", "insert_single_indices", "op_fn",
    "outputs_of", "parse_fn", "remove_singleton_indices", "to_dag", "to_index_dag", "to_tuple_dag", "to_unidag",
    "tuple_dag_to_dag", "tuple_dag_to_index_dag", "unidag_to_dag", "value_names",
]
