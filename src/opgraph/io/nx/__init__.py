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

from collections.abc import Callable, Mapping
from numbers import Integral
from typing import Any

import networkx as nx

from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Graph
from opgraph.core.registry import get_op, unknown_op_message
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
    """The inputs (or outputs) of op ``node`` by position; a GraphError (naming no node) when they are not 0..n-1."""
    edges = G.in_edges(node, data=True) if incoming else G.out_edges(node, data=True)
    ends = []
    for a, b, d in edges:
        positions = d["indices"] if "indices" in d else [d["index"]] if "index" in d else None
        if not isinstance(positions, (list, tuple)) or not positions:
            raise GraphError(f"edge {a!r} -> {b!r} has no position ('index', or a non-empty list 'indices'); "
                             f"got {positions!r}")
        for i in positions:
            if not isinstance(i, Integral) or isinstance(i, bool):
                raise GraphError(f"edge {a!r} -> {b!r} has position {i!r}, not an integer")
            ends.append((int(i), a if incoming else b))
    ends.sort(key=lambda e: e[0])
    if [i for i, _ in ends] != list(range(len(ends))):
        raise GraphError(f"{'input' if incoming else 'output'} edge indices {[i for i, _ in ends]} are not "
                         f"0..{len(ends) - 1}")
    return [n for _, n in ends]


def from_networkx(G: nx.DiGraph) -> Graph:
    """Build a :class:`Graph` from a DiGraph shaped like :func:`to_networkx`'s.

    Types are re-inferred from the input types and attributes (and must
    match the ``type`` of op outputs when given). Inputs and ops are created
    in the order of their value ids, so a builder-made graph comes back equal.
    A DiGraph of another shape (a node without ``bipartite`` 0 or 1, an edge
    between two values, a cycle, an op the registry rejects) is a
    :class:`~opgraph.errors.GraphError` naming the node and its op kind:

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> b.output(b.op("add", x, x))
    >>> G = to_networkx(b.freeze())
    >>> G.add_edge(("value", 1), ("op", 0), index=2)  # add reads its own output
    >>> from_networkx(G)
    Traceback (most recent call last):
      ...
    opgraph.errors.GraphError: node ('op', 0) (add) reads a value computed from its own output: ...
    """
    def where(node: Any) -> str:  # the node, its name and its op kind
        data = G.nodes[node] if node in G else {}
        text = f"node {node!r}"
        if data.get("name") is not None:
            text += f" {data['name']!r}"
        return text + (f" ({data.get('kind')})" if data.get("bipartite") == 1 else "")

    return build_from_networkx(G, where)


def build_from_networkx(G: nx.DiGraph, where: Callable[[Any], str]) -> Graph:
    """:func:`from_networkx`, with ``where(node)`` naming a node in error messages (a file's node ids, say)."""
    inputs, ops = _check_structure(G, where)

    def sort_key(event: tuple[str, Any]) -> tuple[Any, ...]:
        kind, node = event
        if kind == "input":
            return (0, node)
        try:
            outs = _ordered(G, node, False)
        except GraphError as exc:
            raise GraphError(f"{where(node)}: {exc}") from None
        return (0, min(outs)) if outs else (1, node)

    try:
        events = sorted([("input", v) for v in inputs] + [("op", o) for o in ops], key=sort_key)
    except TypeError:  # node keys of mixed kinds: fall back to a topological order
        events = []
    if events:
        try:
            return _build(G, events, where)
        except _NotReady:
            pass
    op_set = set(ops)
    topo = [n for n in nx.topological_sort(G) if n in op_set]  # acyclic: _check_structure made sure
    try:
        return _build(G, [("input", v) for v in inputs] + [("op", n) for n in topo], where)
    except _NotReady as exc:  # cannot happen once the structure is checked; never leak the marker
        raise GraphError(f"{where(exc.args[0])}: an input is not computed before it") from None


def _check_structure(G: nx.DiGraph, where: Callable[[Any], str]) -> tuple[list[Any], list[Any]]:
    """The inputs and op nodes of G, after checking that G is a DAG shaped like :func:`to_networkx`'s."""
    side: dict[Any, int] = {}
    for node, data in G.nodes(data=True):
        bip = data.get("bipartite")
        if not isinstance(bip, Integral) or isinstance(bip, bool) or bip not in (0, 1):
            raise GraphError(f"{where(node)}: bipartite={bip!r}; a value node has bipartite=0 and an op node 1")
        side[node] = int(bip)
        if bip == 1:
            if not isinstance(data.get("kind"), str):
                raise GraphError(f"{where(node)}: an op node needs a 'kind' string, got {data.get('kind')!r}")
            if not isinstance(data.get("attrs") or {}, Mapping):
                raise GraphError(f"{where(node)}: 'attrs' must be a dict, got {type(data['attrs']).__name__}")
    for a, b in G.edges():
        if side[a] == side[b]:
            kind = "values" if side[a] == 0 else "ops"
            raise GraphError(f"edge {where(a)} -> {where(b)} joins two {kind}; an edge joins a value and an op")
    gateways = {}
    for key in ("inputs", "outputs", "updates"):
        items = G.graph.get(key, [])
        if not isinstance(items, (list, tuple)):
            raise GraphError(f"G.graph[{key!r}] must be a list, got {type(items).__name__}")
        gateways[key] = list(items)
    pairs = []
    for pair in gateways["updates"]:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise GraphError(f"an update must be a (source, destination) pair, got {pair!r}")
        pairs.extend(pair)
    for key, nodes in (("inputs", gateways["inputs"]), ("outputs", gateways["outputs"]), ("updates", pairs)):
        for v in nodes:
            try:
                ok = v in side and side[v] == 0
            except TypeError:  # unhashable
                ok = False
            if not ok:
                raise GraphError(f"G.graph[{key!r}] names {v!r}, which is not a value node of the graph")
    inputs = gateways["inputs"]
    seen: set[Any] = set()
    for v in inputs:
        if v in seen:
            raise GraphError(f"{where(v)} is listed twice as an input")
        seen.add(v)
        if G.in_degree(v):
            raise GraphError(f"{where(v)} is listed as an input but {where(next(iter(G.predecessors(v))))} "
                             "computes it")
        if G.nodes[v].get("type") is None:
            raise GraphError(f"{where(v)} is an input without a 'type'")
    for v, s in side.items():
        if s == 0:
            if G.in_degree(v) > 1:
                raise GraphError(f"{where(v)} is computed by {G.in_degree(v)} ops: "
                                 f"{', '.join(where(p) for p in G.predecessors(v))}")
            if G.in_degree(v) == 0 and v not in seen:
                raise GraphError(f"value {where(v)} has no producer and is not an input")
    if not nx.is_directed_acyclic_graph(G):
        cycle = nx.find_cycle(G)
        op = next(a for a, _ in cycle if side[a] == 1)
        raise GraphError(f"{where(op)} reads a value computed from its own output: "
                         f"{' -> '.join(where(a) for a, _ in cycle)} -> {where(cycle[0][0])}")
    return inputs, [n for n, s in side.items() if s == 1]


class _NotReady(Exception):
    """Internal: an op's input is not built yet (the events are not in a topological order)."""


def _build(G: nx.DiGraph, events: list[tuple[str, Any]], where: Callable[[Any], str]) -> Graph:
    b = GraphBuilder(hash_cons=False)
    env: dict[Any, Any] = {}
    node: Any = None
    try:
        for what, node in events:
            data = G.nodes[node]
            if what == "input":
                env[node] = b.input(as_type(data["type"]), name=data.get("name"))
                continue
            ins = _ordered(G, node, True)
            if any(v not in env for v in ins):
                raise _NotReady(node)
            kind = data["kind"]
            attrs = dict(data.get("attrs") or {})
            if kind == "const":
                if set(attrs) != {"value"}:
                    raise GraphError(f"a const op has exactly the attribute 'value', got {sorted(attrs)}")
                if ins:
                    raise GraphError(f"a const op has no inputs, this one has {len(ins)}")
                res: Any = b.constant(attrs["value"])
            else:
                if isinstance(kind, str):
                    try:
                        get_op(kind)
                    except KeyError:
                        raise GraphError(unknown_op_message(kind)) from None
                res = b.op(kind, *[env[v] for v in ins], **attrs)
            outs = res if isinstance(res, tuple) else (res,)
            out_nodes = _ordered(G, node, False)
            if len(out_nodes) != len(outs):
                raise GraphError(f"has {len(out_nodes)} output edges, the op has {len(outs)} outputs")
            for vn, val in zip(out_nodes, outs, strict=True):
                want = G.nodes[vn].get("type")
                if want is not None and as_type(want) != val.type:
                    raise GraphError(f"output {where(vn)} has type {want}, the type rule gives {val.type}")
                name = G.nodes[vn].get("name")
                if name is not None:
                    b.name(val, name)
                env[vn] = val
        node = None
        for o in G.graph.get("outputs", []):
            b.output(env[o])
        for s, d in G.graph.get("updates", []):
            node = d
            b.update(env[s], env[d])
        return b.freeze()
    except _NotReady:
        raise
    except (GraphError, TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        text = str(exc).strip() or type(exc).__name__
        location = getattr(exc, "location", None)
        if location:  # the builder's "(at file:line)" is this module's call, not the user's line
            text = text.replace(f" (at {location})", "")
        if isinstance(exc, KeyError) and not (exc.args and isinstance(exc.args[0], str) and " " in exc.args[0]):
            text = f"missing {text}"  # a bare key, not a message such as the registry's "unknown op kind 'x'"
        elif isinstance(exc, KeyError):
            text = exc.args[0]
        raise GraphError(f"{where(node)}: {text}" if node is not None else text) from exc


__all__ = ["from_networkx", "to_networkx"]
