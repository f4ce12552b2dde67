"""networkx interop: the bipartite DiGraph and round trips to equal graphs."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from opgraph import GraphBuilder
from opgraph.core.graph import Graph
from opgraph.errors import GraphError
from opgraph.io.nx import from_networkx, to_networkx
from test_io_dag import graphs


def _graph() -> Graph:
    b = GraphBuilder()
    x = b.input(("float64", (4,)), name="x")
    lo, hi = b.op("split", x, sections=2)
    y = b.op("add", lo, lo)  # one value used twice
    z = b.op("sum", b.op("multiply", b.op("multiply", y, 3.0), hi), axis=0, name="z")
    s = b.input(("float64", ()), name="s")
    b.update(b.add(s, z), s)
    b.output(z, hi)
    return b.freeze()


def test_structure():
    g = _graph()
    G = to_networkx(g)
    assert nx.is_bipartite(G) and nx.is_directed_acyclic_graph(G)
    assert G.number_of_nodes() == g.num_ops + g.num_values
    split = ("op", 0)
    assert G.nodes[split]["kind"] == "split" and G.nodes[split]["attrs"] == {"sections": 2, "axis": 0}
    assert [G.edges[split, ("value", v)]["index"] for v in (1, 2)] == [0, 1]
    assert G.edges[("value", 1), ("op", 1)]["indices"] == [0, 1]
    assert G.nodes[("value", 0)]["name"] == "x" and G.nodes[("value", 0)]["type"].shape == (4,)
    const = next(n for n, d in G.nodes(data=True) if d.get("kind") == "const")
    np.testing.assert_array_equal(G.nodes[const]["attrs"]["value"], 3.0)
    assert G.graph["outputs"] == [("value", int(v)) for v in g.outputs]
    assert len(G.graph["updates"]) == 1


def test_round_trip_keeps_names_and_updates():
    g = _graph()
    back = from_networkx(to_networkx(g))
    assert back == g
    assert back.symbols.values == g.symbols.values
    feeds = {"x": np.arange(4.0), "s": np.float64(1.0)}
    for a, c in zip(back.run(feeds), g.run(feeds), strict=True):
        np.testing.assert_array_equal(a, c)


def test_relabelled_graph_still_builds():
    g = _graph()
    G = nx.relabel_nodes(to_networkx(g), {n: f"{n[0]}{n[1]}" for n in to_networkx(g)})
    G.graph.update({k: [f"{n[0]}{n[1]}" for n in v] for k, v in to_networkx(g).graph.items() if k != "updates"})
    G.graph["updates"] = []
    back = from_networkx(G)
    (_z, hi) = back.run({"x": np.arange(4.0)})
    np.testing.assert_array_equal(hi, [2.0, 3.0])


def test_errors():
    G = to_networkx(_graph())
    G.graph["inputs"] = G.graph["inputs"][:1]
    with pytest.raises(GraphError, match="no producer"):
        from_networkx(G)
    G = to_networkx(_graph())
    G.edges[("op", 0), ("value", 2)]["index"] = 5
    with pytest.raises(GraphError, match="edge indices"):
        from_networkx(G)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_round_trip(g: Graph):
    back = from_networkx(to_networkx(g))
    assert back == g
    assert back.symbols.values == g.symbols.values
