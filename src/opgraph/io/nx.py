"""To and from :class:`networkx.DiGraph`: the bipartite graph of values and ops.

Nodes are ``("value", id)`` and ``("op", id)``. Value nodes carry
``bipartite=0``, ``type`` (a :class:`~opgraph.core.types.TensorType`) and
``name``; op nodes carry ``bipartite=1``, ``kind``, ``attrs`` (a dict; a
const op has ``{'value': array}``) and ``name``. An edge value -> op has
``index`` = the input position, an edge op -> value has ``index`` = the
output position, so ordered inputs and outputs survive (a value an op uses
at several positions has one edge whose ``indices`` lists them all). The graph's
gateways are in ``G.graph['inputs']``, ``['outputs']`` and ``['updates']``
(lists of value nodes; updates as ``(source, destination)`` pairs).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> b.output(b.op("subtract", b.op("exp", x), x))
    >>> g = b.freeze()
    >>> G = to_networkx(g)
    >>> G.nodes[("op", 1)]["kind"], G.edges[("value", 0), ("op", 1)]["index"]
    ('subtract', 1)
    >>> from_networkx(G) == g
    True
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Graph
from opgraph.core.types import as_type
from opgraph.errors import GraphError


def to_networkx(graph: Graph) -> nx.DiGraph:
    """The bipartite :class:`networkx.DiGraph` of ``graph`` (see the module doc)."""
    G = nx.DiGraph()
    for v in range(graph.num_values):
        G.add_node(("value", v), bipartite=0, type=graph.type_of(v), name=graph.name_of(v))
    for op in range(graph.num_ops):
        kind = graph.kind_of(op)
        attrs = {"value": graph.constant_of(op)} if kind == "const" else graph.attrs_of(op)
        G.add_node(("op", op), bipartite=1, kind=kind, attrs=attrs, name=graph.symbols.ops.get(op))
        for i, v in enumerate(graph.op_inputs(op).tolist()):
            if G.has_edge(("value", v), ("op", op)):  # a value used twice: one edge, all positions
                G.edges[("value", v), ("op", op)]["indices"].append(i)
            else:
                G.add_edge(("value", v), ("op", op), index=i, indices=[i])
        for i, v in enumerate(graph.op_outputs(op).tolist()):
            G.add_edge(("op", op), ("value", v), index=i)
    G.graph["inputs"] = [("value", v) for v in graph.inputs.tolist()]
    G.graph["outputs"] = [("value", v) for v in graph.outputs.tolist()]
    G.graph["updates"] = [(("value", s), ("value", d)) for s, d in graph.updates.tolist()]
    return G


def _ordered(G: nx.DiGraph, node: Any, incoming: bool) -> list[Any]:
    edges = G.in_edges(node, data=True) if incoming else G.out_edges(node, data=True)
    ends = sorted((i, (a if incoming else b)) for a, b, d in edges for i in d.get("indices", [d["index"]]))
    if [i for i, _ in ends] != list(range(len(ends))):
        raise GraphError(f"{node!r}: edge indices {[i for i, _ in ends]} are not 0..{len(ends) - 1}")
    return [n for _, n in ends]


def from_networkx(G: nx.DiGraph) -> Graph:
    """Build a :class:`Graph` from a DiGraph shaped like :func:`to_networkx`'s.

    Types are re-inferred from the input types and attributes (and must
    match the ``type`` of op outputs when given). Inputs and ops are created
    in the order of their value ids, so a builder-made graph comes back equal.
    """
    inputs = list(G.graph.get("inputs", []))
    ops = [n for n, d in G.nodes(data=True) if d.get("bipartite") == 1]
    values = {n for n, d in G.nodes(data=True) if d.get("bipartite") == 0}
    for v in values:
        if G.in_degree(v) == 0 and v not in inputs:
            raise GraphError(f"value node {v!r} has no producer and is not an input")

    def sort_key(event: tuple[str, Any]) -> tuple[Any, ...]:
        kind, node = event
        if kind == "input":
            return (0, node)
        outs = _ordered(G, node, incoming=False)
        return (0, min(outs)) if outs else (1, node)

    try:
        events = sorted([("input", v) for v in inputs] + [("op", o) for o in ops], key=sort_key)
    except TypeError:  # node keys of mixed kinds: fall back to a topological order
        events = [("input", v) for v in inputs] + [("op", n) for n in nx.topological_sort(G) if n in set(ops)]
    try:
        return _build(G, events)
    except _NotReady:
        topo = [n for n in nx.topological_sort(G) if G.nodes[n].get("bipartite") == 1]
        return _build(G, [("input", v) for v in inputs] + [("op", n) for n in topo])


class _NotReady(Exception):
    pass


def _build(G: nx.DiGraph, events: list[tuple[str, Any]]) -> Graph:
    b = GraphBuilder(hash_cons=False)
    env: dict[Any, Any] = {}
    for what, node in events:
        data = G.nodes[node]
        if what == "input":
            env[node] = b.input(as_type(data["type"]), name=data.get("name"))
            continue
        ins = _ordered(G, node, incoming=True)
        if any(v not in env for v in ins):
            raise _NotReady
        kind = data["kind"]
        attrs = dict(data.get("attrs") or {})
        if kind == "const":
            res: Any = b.constant(attrs["value"])
        else:
            res = b.op(kind, *[env[v] for v in ins], **attrs)
        outs = res if isinstance(res, tuple) else (res,)
        out_nodes = _ordered(G, node, incoming=False)
        if len(out_nodes) != len(outs):
            raise GraphError(f"{node!r} ({kind}) has {len(out_nodes)} output edges, the op has {len(outs)} outputs")
        for vn, val in zip(out_nodes, outs, strict=True):
            want = G.nodes[vn].get("type")
            if want is not None and as_type(want) != val.type:
                raise GraphError(f"{vn!r}: type {want} given, the type rule gives {val.type}")
            name = G.nodes[vn].get("name")
            if name is not None:
                b.name(val, name)
            env[vn] = val
    for o in G.graph.get("outputs", []):
        b.output(env[o])
    for s, d in G.graph.get("updates", []):
        b.update(env[s], env[d])
    return b.freeze()


__all__ = ["from_networkx", "to_networkx"]
