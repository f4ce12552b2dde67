"""Subgraphs: graphs used as the bodies of ops (``call``, ``cond``, ``while_loop``, ``scan``).

A body is an ordinary :class:`~opgraph.core.graph.Graph` (its inputs are the
body's parameters, its outputs its results) wrapped in a :class:`Subgraph`,
and the wrapper is an attribute value of the ops that use it. Attributes are
interned, so a body used by ten ops is held once, and every pass that copies
an op's attributes carries its bodies along without knowing about them.
``graph.subgraphs`` lists a graph's bodies (first use first); files store
each once, as a record that ops refer to by index (docs/cg-format.md,
docs/json-format.md).

Two subgraphs are equal when their graphs are the same structure (a content
fingerprint, computed once): equal bodies intern to one, and an op with a
body hash-conses like any other op.

    >>> import numpy as np, opgraph
    >>> from opgraph.core.subgraph import Subgraph, subgraphs_of
    >>> def square_body():
    ...     b = opgraph.GraphBuilder()
    ...     x = b.input(("float64", (3,)), name="x")
    ...     b.output(b.multiply(x, x))
    ...     return Subgraph(b.freeze(), name="square")
    >>> body = square_body()
    >>> body == square_body(), len({body, square_body()})
    (True, 1)
    >>> body
    Subgraph('square': (f64[3]) -> (f64[3]), 1 op)
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> b.output(b.op("call", b.op("call", x, body=body), body=body))
    >>> g = b.freeze()
    >>> len(g.attrs), [s.name for s in subgraphs_of(g)]
    (1, ['square'])
    >>> g.run({"x": np.arange(3.0)})[0]
    array([ 0.,  1., 16.])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from opgraph.core.graph import Graph
    from opgraph.core.types import ValueType


class Subgraph:
    """A graph used as an op attribute (a function body); see the module doc.

    ``name`` is for messages and drawings only (the user's function name);
    it is not part of equality. ``cache(tag, make)`` keeps per-body derived
    objects (a compiled body per backend, a body's gradient) for as long as
    the body lives.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float32", (2,)), name="x"); b.output(b.exp(x))
    >>> s = Subgraph(b.freeze(), name="f")
    >>> s.in_types, s.out_types, s.num_inputs, s.num_outputs
    ((f32[2],), (f32[2],), 1, 1)
    """

    __slots__ = ("__weakref__", "_cache", "_key", "graph", "name")

    def __init__(self, graph: Graph, name: str = "") -> None:
        from opgraph.core.graph import Graph

        if isinstance(graph, Subgraph):
            graph = graph.graph
        if not isinstance(graph, Graph):
            raise TypeError(f"a subgraph is made from a Graph, not {type(graph).__name__}")
        self.graph = graph
        self.name = str(name or "")
        self._key: bytes | None = None
        self._cache: dict[Any, Any] = {}

    # ------------------------------------------------------------ signature
    @property
    def in_types(self) -> tuple[ValueType, ...]:
        """The types of the body's parameters (its graph's inputs), in order."""
        g = self.graph
        return tuple(g.types[int(g.value_type[v])] for v in g.inputs)

    @property
    def out_types(self) -> tuple[ValueType, ...]:
        """The types of the body's results (its graph's outputs), in order."""
        g = self.graph
        return tuple(g.types[int(g.value_type[v])] for v in g.outputs)

    @property
    def num_inputs(self) -> int:
        """How many parameters the body takes."""
        return len(self.graph.inputs)

    @property
    def num_outputs(self) -> int:
        """How many results the body returns."""
        return len(self.graph.outputs)

    @property
    def label(self) -> str:
        """``'name'`` or ``'<body>'``, for messages."""
        return repr(self.name) if self.name else "<body>"

    # ------------------------------------------------------------ identity
    @property
    def key(self) -> bytes:
        """A 16-byte fingerprint of the body's structure, types, attributes and constants."""
        if self._key is None:
            self._key = _fingerprint(self.graph)
        return self._key

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Subgraph) and (self is other or self.key == other.key)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return Subgraph, (self.graph, self.name)

    def cache(self, tag: Any, make: Callable[[], Any]) -> Any:
        """``make()`` once per ``tag`` for this body (e.g. its compiled form on one backend).

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("f8", ()), name="x"); b.output(b.exp(x))
        >>> s = Subgraph(b.freeze())
        >>> s.cache("n", lambda: [1]) is s.cache("n", lambda: [2])
        True
        """
        try:
            return self._cache[tag]
        except KeyError:
            value = self._cache[tag] = make()
            return value

    def __repr__(self) -> str:
        ins = ", ".join(repr(t) for t in self.in_types)
        outs = ", ".join(repr(t) for t in self.out_types)
        n = self.graph.num_ops
        return f"Subgraph({self.label}: ({ins}) -> ({outs}), {n} op{'s' if n != 1 else ''})"


def attr_subgraph(v: Any) -> Subgraph:
    """Normalise a body attribute: a :class:`Subgraph`, or a ``Graph`` to wrap.

    >>> attr_subgraph(3)
    Traceback (most recent call last):
    ...
    TypeError: expected a Graph or Subgraph (a body), got int
    """
    from opgraph.core.graph import Graph

    if isinstance(v, Subgraph):
        return v
    if isinstance(v, Graph):
        return Subgraph(v)
    raise TypeError(f"expected a Graph or Subgraph (a body), got {type(v).__name__}")


def attr_subgraphs(v: Any) -> tuple[Subgraph, ...]:
    """Normalise a tuple of bodies (the branches of a ``cond``).

    >>> attr_subgraphs(())
    ()
    """
    if isinstance(v, (list, tuple)):
        return tuple(attr_subgraph(x) for x in v)
    raise TypeError(f"expected a sequence of bodies, got {type(v).__name__}")


def bodies_in(value: Any) -> Iterator[Subgraph]:
    """The subgraphs in one attribute value (a body, or a tuple holding bodies).

    >>> list(bodies_in((1, 2)))
    []
    """
    if isinstance(value, Subgraph):
        yield value
    elif isinstance(value, tuple):
        for v in value:
            yield from bodies_in(v)


def subgraphs_of(graph: Graph, *, recursive: bool = False) -> tuple[Subgraph, ...]:
    """The distinct bodies the ops of ``graph`` use, in order of first use.

    With ``recursive=True`` the bodies of bodies are included, every body
    once and after the bodies it uses (the order files store them in: a body
    refers only to bodies before it); a body that uses itself, which only a
    graph made by hand can pretend, is a ValueError. Only the attribute table
    is scanned (it holds each distinct attribute set once), so this is cheap
    on large graphs.

    >>> import opgraph
    >>> sb = opgraph.GraphBuilder(); x = sb.input(("f8", ()), name="x"); sb.output(sb.exp(x))
    >>> inner = Subgraph(sb.freeze(), name="inner")
    >>> sb = opgraph.GraphBuilder(); x = sb.input(("f8", ()), name="x"); sb.output(sb.op("call", x, body=inner))
    >>> outer = Subgraph(sb.freeze(), name="outer")
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", ()), name="x")
    >>> b.output(b.op("call", x, body=outer))
    >>> [s.name for s in subgraphs_of(b.freeze())], [s.name for s in subgraphs_of(b.freeze(), recursive=True)]
    (['outer'], ['inner', 'outer'])
    """
    tag = ("subgraphs", recursive)
    cached = graph._cache.get(tag)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    # The attribute table is small; the op column is read only when some attribute holds a body.
    # Only a body or a tuple can hold a body: most attribute sets (a constant's index) are passed over at once.
    with_bodies = [aid for aid, attrs in enumerate(graph.attrs)
                   if any(isinstance(v, (Subgraph, tuple)) for _, v in attrs)
                   and any(True for _, v in attrs for _ in bodies_in(v))]
    seen: dict[Subgraph, None] = {}
    if with_bodies:
        op_attr = np.asarray(graph.op_attr)
        first_op: dict[int, int] = {}
        for aid in with_bodies:
            hits = np.flatnonzero(op_attr == aid)
            if len(hits):
                first_op[aid] = int(hits[0])
        for aid in sorted(first_op, key=first_op.__getitem__):
            for _, value in graph.attrs[aid]:
                seen.update((body, None) for body in bodies_in(value))
    if recursive:
        done: dict[Subgraph, None] = {}
        active: set[Subgraph] = set()

        def visit(s: Subgraph) -> None:
            if s in done:
                return
            if s in active:
                raise ValueError(f"subgraph {s.label} uses itself")
            active.add(s)
            for inner in subgraphs_of(s.graph):
                visit(inner)
            active.discard(s)
            done[s] = None

        for s in seen:
            visit(s)
        seen = done
    result = tuple(seen)
    graph._cache[tag] = result
    return result


def _fingerprint(g: Graph) -> bytes:
    # The same notion of equality as Graph.equals: ops and values in order, but types, attributes and constants
    # by value, not by their index in the interned tables (a pass or a loader may order those differently).
    import hashlib  # not at import time: it loads OpenSSL (tests/test_import_light.py)

    def digests(keys: list[Any]) -> np.ndarray:
        return np.array([int.from_bytes(hashlib.blake2b(repr(k).encode(), digest_size=8).digest(), "little",
                                        signed=True) for k in keys], dtype=np.int64)

    h = hashlib.blake2b(digest_size=16)
    for name in ("op_kind", "op_version", "in_ptr", "in_ids", "out_ptr", "out_ids", "inputs", "outputs", "updates"):
        h.update(name.encode())
        h.update(np.ascontiguousarray(getattr(g, name), dtype=np.int64).tobytes())
    h.update(digests([repr(t) for t in g.types])[np.asarray(g.value_type, dtype=np.int64)].tobytes()
             if len(g.types) else b"")
    h.update(digests(list(g._attr_keys()))[np.asarray(g.op_attr, dtype=np.int64)].tobytes() if len(g.attrs) else b"")
    return h.digest()
