"""GraphML: the bipartite networkx form of :mod:`opgraph.io.nx`, with what GraphML cannot hold as JSON strings.

:func:`to_graphml_graph` makes the networkx graph that is written as GraphML
and :func:`from_graphml_graph` reads one back, values and ops at the numbers
of their node ids; :func:`read_graphml` is networkx's reader with every
malformed ``<data>`` element named. The layout of the file is described in
:mod:`opgraph.io.formats` (which saves and loads ``.graphml`` files with
these functions).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import networkx as nx
import numpy as np
from networkx.readwrite.graphml import GraphMLReader

from opgraph.core.graph import Graph, Symbols
from opgraph.core.registry import CONST
from opgraph.core.types import VOID, TensorType
from opgraph.errors import FormatError, GraphError
from opgraph.io.formats import first_line, refuse_subgraphs
from opgraph.io.jsonfmt import decode_value, encode_value
from opgraph.io.jsonfmt.encoding import BadJson, decode_type
from opgraph.io.nx import build_from_networkx, to_networkx

_GRAPHML_MARK = "opgraph-networkx/1"


def _json(obj: Any) -> str:
    # ASCII only: the text then holds no character XML 1.0 forbids.
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"))


def _type_json(t: Any) -> dict[str, Any]:
    return dict(t.to_json())


def _type_from_json(obj: Any) -> Any:
    if obj == {"void": True}:
        return VOID
    return TensorType.from_json(obj)


def _node_id(node: tuple[str, int]) -> str:
    return ("v" if node[0] == "value" else "o") + str(node[1])


_MAX_ID = 2**62  # node ids and positions beyond this cannot index NumPy's int64 arrays
_ASCII_NUMBER = re.compile(r"0|[1-9][0-9]*")


def _node_key(text: str) -> tuple[str, int]:
    # Canonical ASCII numbers only: "v01" and "v1" (or "v\u00b2", which str.isdigit accepts) must not alias.
    if len(text) < 2 or text[0] not in "vo" or not _ASCII_NUMBER.fullmatch(text[1:]) or int(text[1:]) >= _MAX_ID:
        raise FormatError(f"node id {text!r} is neither v<number> nor o<number> (a number below 2**62, "
                          "without leading zeros)")
    return ("value" if text[0] == "v" else "op", int(text[1:]))


def _put_name(data: dict[str, Any], name: Any) -> None:
    if name is None:
        return
    if name.isprintable():
        data["name"] = name
    else:  # control characters: XML text cannot hold them (and parsers rewrite \r)
        data["name_json"] = _json(name)


def _parse_json(text: Any, where: str) -> Any:
    """The JSON text of a GraphML attribute; ``where`` names it ("node o3: attribute 'attrs'")."""
    if not isinstance(text, str):
        raise FormatError(f"{where}: expected JSON text, got {type(text).__name__} {text!r:.60}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError; too many digits; nesting too deep
        raise FormatError(f"{where}: invalid JSON: {first_line(exc)}") from None


def _json_list(text: Any, where: str) -> list[Any]:
    obj = _parse_json(text, where)
    if not isinstance(obj, list):
        raise FormatError(f"{where}: expected a JSON array, got {_short_json(obj)}")
    return obj


def _json_object(text: Any, where: str) -> dict[str, Any]:
    obj = _parse_json(text, where)
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: expected a JSON object, got {_short_json(obj)}")
    return obj


def _short_json(obj: Any) -> str:
    text = json.dumps(obj)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_value(x: Any, where: str, lo: int = 0, hi: int = _MAX_ID, *, strict: bool = False) -> int:
    """An int in [lo, hi): in JSON (``strict``) a JSON integer; in a GraphML attribute also an integral float or
    decimal text, as other writers may declare the key."""
    n: int | None = None
    if isinstance(x, int) and not isinstance(x, bool):
        n = x
    elif strict:
        pass
    elif isinstance(x, float) and math.isfinite(x) and x == int(x):
        n = int(x)
    elif isinstance(x, str) and re.fullmatch(r"-?[0-9]{1,20}", x.strip()):
        n = int(x)
    if n is None:
        raise FormatError(f"{where}: expected an integer, got {type(x).__name__} {x!r:.60}")
    if not lo <= n < hi:
        raise FormatError(f"{where}: {n} is out of range [{lo}, {'2**62' if hi == _MAX_ID else hi})")
    return n


def _decode(obj: Any, where: str, path: str) -> Any:
    try:
        return decode_value(obj, path)
    except (ValueError, TypeError, RecursionError) as exc:
        raise FormatError(f"{where}: {first_line(exc)}") from None


def _get_name(data: Mapping[str, Any], where: str) -> str | None:
    if "name_json" in data:
        name = _parse_json(data["name_json"], f"{where}: attribute 'name_json'")
        if not isinstance(name, str):
            raise FormatError(f"{where}: attribute 'name_json' is not a JSON string")
        return name
    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise FormatError(f"{where}: attribute 'name' must be a string, got {type(name).__name__} {name!r:.60}")
    return name


def _value_type(text: Any, where: str) -> Any:
    obj = _parse_json(text, where)
    try:
        return decode_type(obj, "")
    except BadJson as exc:
        raise FormatError(f"{where}: {exc.path + ': ' if exc.path else ''}{exc.message}") from None


def _extra_symbols(graph: Graph) -> dict[str, Any]:
    """Names networkx's form has no place for; constants are referred to by the id of their const op."""
    const_op = {int(dict(graph.attrs[graph.op_attr[op]])["index"]): int(op)
                for op in (graph.op_kind == CONST.id).nonzero()[0]}
    sym = graph.symbols
    return {"constants": [[const_op[c], n] for c, n in sorted(sym.constants.items()) if c in const_op],
            "descriptions": [[k, const_op[i], t] if k == "constant" else [k, i, t]
                             for (k, i), t in sorted(sym.descriptions.items()) if k != "constant" or i in const_op],
            "io": [[i, n] for i, n in sorted(sym.io.items())]}


def to_graphml_graph(graph: Graph) -> Any:
    """The networkx graph written to a .graphml file: :func:`~opgraph.io.nx.to_networkx` with plain attributes.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> b.output(b.op("sum", b.input(("float32", (2, 3)), name="x"), axis=1))
    >>> H = to_graphml_graph(b.freeze())
    >>> H.nodes["o0"]["attrs"], H.nodes["v0"]["type"]
    ('{"axis":[1],"keepdims":false}', '{"dtype":"float32","shape":[2,3]}')
    >>> from_graphml_graph(H) == b.freeze()
    True
    """

    refuse_subgraphs(graph, "GraphML")
    G = to_networkx(graph)
    H = nx.DiGraph()
    H.graph["format"] = _GRAPHML_MARK
    for key in ("inputs", "outputs"):
        H.graph[key] = _json([_node_id(n) for n in G.graph[key]])
    H.graph["updates"] = _json([[_node_id(s), _node_id(d)] for s, d in G.graph["updates"]])
    H.graph["symbols"] = _json(_extra_symbols(graph))
    meta = {}
    for key, value in graph.file_meta.items():
        try:
            meta[key] = encode_value(value, inline_limit=0)
        except TypeError:  # as in the JSON form: entries with no encoding are left out
            continue
        except ValueError as exc:  # nested past the JSON form's limit: the file could not be read back
            raise FormatError(f"file_meta entry {key!r}: {exc}") from None
    H.graph["file_meta"] = _json(meta)
    for node, data in G.nodes(data=True):
        out: dict[str, Any] = {"bipartite": int(data["bipartite"])}
        if node[0] == "value":
            out["type"] = _json(_type_json(data["type"]))
        else:
            out["kind"] = str(data["kind"])
            try:
                out["attrs"] = _json({k: encode_value(v, inline_limit=0) for k, v in data["attrs"].items()})
            except ValueError as exc:
                raise FormatError(f"op {node[1]} ({data['kind']}): an attribute: {exc}") from None
        _put_name(out, data.get("name"))
        H.add_node(_node_id(node), **out)
    for a, b, data in G.edges(data=True):
        out = {"index": int(data["index"])}
        if "indices" in data:
            out["indices"] = _json([int(i) for i in data["indices"]])
        H.add_edge(_node_id(a), _node_id(b), **out)
    return H


def from_graphml_graph(H: Any) -> Graph:
    """Inverse of :func:`to_graphml_graph` (the graph :func:`networkx.read_graphml` returns).

    A graph it cannot read is a :class:`~opgraph.errors.FormatError` naming
    the node (its id, name and op kind) or the edge, the attribute and what
    is wrong with it:

    >>> import networkx as nx
    >>> H = nx.DiGraph(format=_GRAPHML_MARK)
    >>> H.add_node("o0", bipartite=1, kind="exp", name="e", attrs="[1]")
    >>> from_graphml_graph(H)
    Traceback (most recent call last):
      ...
    opgraph.errors.FormatError: node o0 'e' (exp): attribute 'attrs': expected a JSON object, got [1]
    """

    if H.graph.get("format") != _GRAPHML_MARK:
        raise FormatError(f"not an opgraph GraphML graph (graph attribute format={H.graph.get('format')!r:.60}, "
                          f"expected {_GRAPHML_MARK!r})")
    # networkx's reader keeps the <default> values of keys aside: they apply to nodes (edges) without the attribute
    node_default = H.graph.get("node_default") or {}
    edge_default = H.graph.get("edge_default") or {}
    G = nx.DiGraph()
    names: dict[tuple[str, int], str | None] = {}
    wheres: dict[tuple[str, int], str] = {}  # node -> "node o3 'name' (kind)" for messages
    for node, raw in H.nodes(data=True):
        nid = str(node)
        key = _node_key(nid)
        data = {**node_default, **raw}
        name = _get_name(data, f"node {nid}")
        where = f"node {nid}" + ("" if name is None else f" {name!r}")
        if "bipartite" not in data:
            raise FormatError(f"{where}: missing attribute 'bipartite' (a node an edge names must be declared "
                              "with its data)")
        bip = _int_value(data["bipartite"], f"{where}: attribute 'bipartite'", 0, 2)
        if (bip == 0) != (key[0] == "value"):
            raise FormatError(f"{where}: bipartite={bip} does not match its id (v<number> is a value, bipartite=0; "
                              "o<number> an op, bipartite=1)")
        out: dict[str, Any] = {"bipartite": bip}
        if key[0] == "value":
            if "type" not in data:
                raise FormatError(f"{where}: missing attribute 'type'")
            out["type"] = _value_type(data["type"], f"{where}: attribute 'type'")
        else:
            kind = data.get("kind")
            if not isinstance(kind, str) or not kind:
                raise FormatError(f"{where}: attribute 'kind' must name an op kind, got {kind!r:.60}")
            where += f" ({kind})"
            attrs = _json_object(data.get("attrs", "{}"), f"{where}: attribute 'attrs'")
            out["kind"] = kind
            out["attrs"] = {k: _decode(v, f"{where}: attribute 'attrs'", f"attrs.{k}") for k, v in attrs.items()}
        names[key], wheres[key] = name, where
        G.add_node(key, **out)
    counts = Counter((str(a), str(b)) for a, b in H.edges())
    for a, b, raw in H.edges(data=True):
        ka, kb = _node_key(str(a)), _node_key(str(b))
        where = f"edge {a} -> {b}"
        if counts[(str(a), str(b))] > 1:
            raise FormatError(f"{where} appears {counts[(str(a), str(b))]} times (a value an op reads at several "
                              "positions has one edge, its 'indices' listing them)")
        if ka[0] == kb[0]:
            raise FormatError(f"{where} joins two {ka[0]}s; an edge joins a value and an op")
        data = {**edge_default, **raw}
        out = {}
        if ka[0] == "value" and "indices" in data:
            items = _json_list(data["indices"], f"{where}: attribute 'indices'")
            if not items:
                raise FormatError(f"{where}: attribute 'indices' is empty")
            out["indices"] = [_int_value(i, f"{where}: attribute 'indices'[{j}]", strict=True)
                              for j, i in enumerate(items)]
            out["index"] = out["indices"][0]
        elif "index" in data:
            out["index"] = _int_value(data["index"], f"{where}: attribute 'index'")
        else:
            raise FormatError(f"{where}: missing attribute 'index'")
        G.add_edge(ka, kb, **out)

    def gateway(x: Any, where: str) -> tuple[str, int]:
        if not isinstance(x, str):
            raise FormatError(f"{where}: expected a node id string, got {_short_json(x)}")
        try:
            key = _node_key(x)
        except FormatError as exc:
            raise FormatError(f"{where}: {exc}") from None
        if key not in G or key[0] != "value":
            raise FormatError(f"{where}: {x} is not a value node of the file")
        return key

    for key in ("inputs", "outputs"):
        what = f"graph attribute {key!r}"
        G.graph[key] = [gateway(n, f"{what}[{i}]") for i, n in enumerate(_json_list(H.graph.get(key, "[]"), what))]
    G.graph["updates"] = []
    for i, pair in enumerate(_json_list(H.graph.get("updates", "[]"), "graph attribute 'updates'")):
        what = f"graph attribute 'updates'[{i}]"
        if not (isinstance(pair, list) and len(pair) == 2):
            raise FormatError(f"{what}: expected a [source, destination] pair, got {_short_json(pair)}")
        G.graph["updates"].append((gateway(pair[0], f"{what}[0]"), gateway(pair[1], f"{what}[1]")))
    extra = _graphml_symbols(H.graph.get("symbols", "{}"), G)
    meta = {k: _decode(v, "graph attribute 'file_meta'", f"file_meta.{k}")
            for k, v in _json_object(H.graph.get("file_meta", "{}"), "graph attribute 'file_meta'").items()}
    # from_networkx numbers values in the order a GraphBuilder creates them, which a graph numbered otherwise
    # (TensCalc's, where op outputs come before the inputs they read) cannot match; the file's node ids can.
    # Each value is tagged with its node id while it is rebuilt, then the graph is put back in the file's order.
    for n, d in G.nodes(data=True):
        if n[0] == "value":
            d["name"] = f"v{n[1]}"
    try:
        h = build_from_networkx(G, lambda n: wheres.get(n, f"node {_node_id(n)}"))
        return _in_file_order(h, G, names, extra, meta)
    except FormatError:
        raise
    except GraphError as exc:
        raise FormatError(str(exc)) from exc


def _graphml_symbols(text: Any, G: Any) -> dict[str, Any]:
    """The graph attribute ``symbols``, checked against the file's nodes (see :func:`_extra_symbols`)."""
    where = "graph attribute 'symbols'"
    obj = _json_object(text, where)
    unknown = sorted(set(obj) - {"constants", "descriptions", "io"})
    if unknown:
        raise FormatError(f"{where}: unknown key(s) {unknown} (constants, descriptions, io)")

    def rows(key: str, width: int) -> list[list[Any]]:
        items = obj.get(key, [])
        if not isinstance(items, list):
            raise FormatError(f"{where}: {key}: expected a JSON array, got {_short_json(items)}")
        for i, row in enumerate(items):
            if not (isinstance(row, list) and len(row) == width):
                raise FormatError(f"{where}: {key}[{i}]: expected an array of {width} items, got {_short_json(row)}")
        return items

    def text_of(x: Any, at: str) -> str:
        if not isinstance(x, str):
            raise FormatError(f"{at}: expected a string, got {_short_json(x)}")
        return x

    def node(kind: str, x: Any, at: str) -> int:
        n = _int_value(x, at, strict=True)
        key = ("value" if kind == "value" else "op", n)
        if key not in G or (kind == "constant" and G.nodes[key].get("kind") != "const"):
            raise FormatError(f"{at}: the file has no {'const op' if kind == 'constant' else kind} "
                              f"{_node_id(key)}")
        return n

    constants = [[node("constant", c, f"{where}: constants[{i}][0]"), text_of(n, f"{where}: constants[{i}][1]")]
                 for i, (c, n) in enumerate(rows("constants", 2))]
    descriptions = []
    for i, (kind, n, t) in enumerate(rows("descriptions", 3)):
        at = f"{where}: descriptions[{i}]"
        if kind in ("constant", "value", "op"):
            n = node(kind, n, at)
        elif kind == "io":
            n = _int_value(n, at, strict=True)
        else:
            raise FormatError(f"{at}: unknown kind {_short_json(kind)} (constant, value, op or io)")
        descriptions.append([kind, n, text_of(t, at)])
    io = [[_int_value(r, f"{where}: io[{i}][0]", strict=True), text_of(n, f"{where}: io[{i}][1]")]
          for i, (r, n) in enumerate(rows("io", 2))]
    return {"constants": constants, "descriptions": descriptions, "io": io}


def _in_file_order(h: Graph, G: Any, names: Mapping[tuple[str, int], str | None], extra: Mapping[str, Any],
                   file_meta: Mapping[str, Any]) -> Graph:
    """``h`` (values named ``v<node id>``) renumbered as the file numbers it, with the file's names.

    Keeps h's own numbering when the file's ids are not exactly 0..n-1 (a GraphML file written by hand).
    """
    nv, no = h.num_values, h.num_ops
    vfile = np.array([int(h.symbols.values[v][1:]) for v in range(nv)], dtype=np.int64)  # h's value -> file id
    producer = {b[1]: a[1] for a, b in G.edges if a[0] == "op"}
    ofile = np.array([producer[int(vfile[outs[0]])] if len(outs := h.op_outputs(op)) else -1 for op in range(no)],
                     dtype=np.int64)  # h's op -> file id (-1: an op without outputs)
    loose = np.flatnonzero(ofile < 0)
    if len(loose):  # ops without outputs take the file ids left over, in order
        free = sorted(set(range(no)) - set(ofile.tolist()))
        ofile[loose] = (free + [-1] * len(loose))[:len(loose)]
    exact = np.array_equal(np.sort(vfile), np.arange(nv)) and np.array_equal(np.sort(ofile), np.arange(no))
    vperm = vfile if exact else np.arange(nv, dtype=np.int64)  # h's value -> result value
    operm = ofile if exact else np.arange(no, dtype=np.int64)
    op_at = np.argsort(operm)  # result op -> h's op
    v_at = np.argsort(vperm)  # result value -> h's value

    def csr(ptr: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = [vperm[ids[ptr[o]:ptr[o + 1]]] for o in op_at.tolist()]
        new_ptr = np.zeros(no + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=new_ptr[1:])
        return new_ptr, (np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64))

    in_ptr, in_ids = csr(h.in_ptr, h.in_ids)
    out_ptr, out_ids = csr(h.out_ptr, h.out_ids)
    prod = h.value_producer[v_at].astype(np.int64)
    value_names = {int(vperm[v]): nm for v in range(nv) if (nm := names[("value", int(vfile[v]))]) is not None}
    op_names = {int(operm[o]): nm for o in range(no) if (nm := names.get(("op", int(ofile[o])))) is not None}
    # Constants are written by the id of their const op: find each one's index in h's constants table.
    op_of_file = {int(f): o for o, f in enumerate(ofile.tolist())}

    def constant(file_op: int) -> int:
        return int(dict(h.attrs[h.op_attr[op_of_file[int(file_op)]]])["index"])

    # Value and op descriptions are keyed by file ids, io ones by gateway record.
    renumber = {"value": dict(zip(vfile.tolist(), vperm.tolist(), strict=True)),
                "op": dict(zip(ofile.tolist(), operm.tolist(), strict=True))}
    descriptions = {(str(k), constant(i) if k == "constant" else renumber.get(k, {}).get(int(i), int(i))): str(t)
                    for k, i, t in extra.get("descriptions", [])}
    symbols = Symbols(values=value_names, ops=op_names, descriptions=descriptions,
                      constants={constant(i): str(n) for i, n in extra.get("constants", [])},
                      io={int(i): str(n) for i, n in extra.get("io", [])})
    return Graph(
        op_kind=h.op_kind[op_at], op_attr=h.op_attr[op_at], op_version=h.op_version[op_at],
        in_ptr=in_ptr, in_ids=in_ids, out_ptr=out_ptr, out_ids=out_ids, value_type=h.value_type[v_at],
        value_producer=np.where(prod >= 0, operm[np.maximum(prod, 0)], -1), value_index=h.value_index[v_at],
        types=h.types, attrs=h.attrs, constants=h.constants, inputs=vperm[h.inputs], outputs=vperm[h.outputs],
        updates=vperm[h.updates.reshape(-1)].reshape(-1, 2), symbols=symbols, file_meta=file_meta,
    ).verify()


def read_graphml(path: str | os.PathLike[str]) -> Any:
    """networkx's GraphML reader, with each malformed <data> element named (node or edge, attribute, text)."""
    class Reader(GraphMLReader):  # type: ignore[misc]
        def find_graphml_keys(self, graph_element: Any) -> Any:
            try:
                return super().find_graphml_keys(graph_element)
            except KeyError as exc:  # networkx looks attr.type up in its table of types
                raise FormatError(f"a <key> element declares the unknown attr.type {exc} (GraphML has boolean, "
                                  "int, long, float, double and string)") from exc

        def decode_data_elements(self, graphml_keys: Any, obj_xml: Any) -> Any:
            try:
                return super().decode_data_elements(graphml_keys, obj_xml)
            except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
                raise FormatError(f"{_xml_where(obj_xml)}: {_bad_data(self, graphml_keys, obj_xml, exc)}") from exc

    reader = Reader()
    graphs = list(reader(path=os.fspath(path)))
    if not graphs:  # as networkx.read_graphml: a <graphml> root without the namespace
        with open(path, "rb") as f:
            text = f.read().replace(b"<graphml>", b'<graphml xmlns="http://graphml.graphdrawing.org/xmlns">')
        graphs = list(reader(string=text))
        if not graphs:
            raise FormatError("not a readable GraphML file: no <graph> element")
    return graphs[0]


def _xml_where(element: Any) -> str:
    tag = str(element.tag).rsplit("}", 1)[-1]
    if tag == "node":
        return f"node {element.get('id')}"
    if tag == "edge":
        return f"edge {element.get('source')} -> {element.get('target')}"
    return f"<{tag}> element"


def _bad_data(reader: Any, keys: Mapping[str, Any], element: Any, exc: BaseException) -> str:
    """Which <data> child of ``element`` networkx's reader could not convert, and why."""
    for data in element.findall(f"{{{reader.NS_GRAPHML}}}data"):
        key = data.get("key")
        if key not in keys:
            return f"<data key={key!r}> refers to no <key> element"
        name, type_ = keys[key]["name"], keys[key]["type"]
        text = data.text
        if text is None or len(data):
            continue
        try:
            reader.convert_bool[text.lower()] if type_ is bool else type_(text)
        except (ValueError, KeyError, TypeError, OverflowError):
            what = {int: "an integer", float: "a number", bool: "a boolean"}.get(type_, type_.__name__)
            return f"attribute {name!r}: {text!r:.60} is not {what}"
    return first_line(exc)
