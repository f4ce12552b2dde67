"""Writing a graph as the JSON form, streamed a few thousand records at a time (:func:`save_json`)."""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from opgraph.core.atomic import atomic_files
from opgraph.core.gcpause import paused_gc
from opgraph.core.graph import Graph, ranges
from opgraph.core.registry import get_op
from opgraph.core.subgraph import Subgraph, subgraphs_of
from opgraph.errors import FormatError
from opgraph.io.jsonfmt.encoding import (
    ALL_DIGITS,
    DEFAULT_INLINE_LIMIT,
    FORMAT,
    MAX_DEPTH,
    VERSION,
    VERSION_PLAIN,
    TooDeep,
    Unencodable,
    enc_value,
    encode_array,
    key_path,
    too_deep,
    type_json,
)


# ----------------------------------------------------------------------------- writing
def _ref_safe(name: Any, counts: Counter[Any]) -> bool:
    return isinstance(name, str) and name != "" and counts[name] == 1 and not ALL_DIGITS.fullmatch(name)



_RECORD = 2
"""Levels a subgraph record sits below the top level (the ``subgraphs`` array, the record)."""
_ATTRS_LEVEL = 4
"""The level of an op's ``attrs`` object in a document (the document, ``ops``, the op, ``attrs``)."""
_META_LEVEL = 2
"""The level of the ``file_meta`` object."""


def _encode_fitting(value: Any, inline_limit: int, bodies: dict[Subgraph, int] | None, path: str,
                    level: int) -> Any:
    """``value`` encoded as the entry at ``path`` of an object at nesting ``level`` of the document.

    Raises :class:`FormatError` naming ``path`` (and the place inside it) when the entry would nest
    deeper than MAX_DEPTH: readers refuse such a file, so it is not written.
    """
    try:
        data = enc_value(value, inline_limit, bodies, MAX_DEPTH - level)
        deep = too_deep(data, path, MAX_DEPTH - level)
    except TooDeep:
        deep = too_deep(value, path, MAX_DEPTH - level)
    if deep is not None:
        raise FormatError(f"cannot write {path} as JSON: at {deep.path} it would open level {MAX_DEPTH + 1} of "
                          f"arrays and objects in the file; readers refuse files nested deeper than "
                          f"opgraph.io.jsonfmt.MAX_DEPTH = {MAX_DEPTH}")
    return data


def _encode_attrs(pairs: Any, inline_limit: int, bodies: dict[Subgraph, int] | None, op: int, kind: str,
                  base: int) -> dict[str, Any]:
    """An op's attributes as JSON data (``base``: levels above the document of the graph)."""
    keys = [k for k, _ in pairs]
    if any(type(k) is not str for k in keys) or len(set(keys)) != len(keys):
        raise ValueError(f"op {op} ({kind}): attribute names must be distinct strings, got {keys}")
    attrs = {}
    try:
        for k, v in pairs:
            attrs[k] = _encode_fitting(v, inline_limit, bodies, key_path("attrs", k), base + _ATTRS_LEVEL)
    except Unencodable as exc:
        raise ValueError(f"op {op} ({kind}): {exc}") from None
    except FormatError as exc:
        raise FormatError(f"op {op} ({kind}): {exc}") from None
    return attrs


def _file_meta(graph: Graph, inline_limit: int, base: int) -> dict[str, Any]:
    """The graph's file_meta entries that JSON can hold (others are format details of another format).

    An entry nested too deeply for readers is refused (:class:`FormatError`), not left out.
    """
    meta = {}
    for key, value in graph.file_meta.items():
        if type(key) is str:
            try:
                meta[key] = _encode_fitting(value, inline_limit, None, key_path("file_meta", key),
                                            base + _META_LEVEL)
            except Unencodable:
                continue
    return meta


def to_json_dict(graph: Graph, *, inline_limit: int = DEFAULT_INLINE_LIMIT) -> dict[str, Any]:
    """The JSON document of ``graph`` as Python data (see the module doc for the layout).

    The graph's structure is verified first (a graph that could not be read
    back is refused with :class:`~opgraph.errors.VerifyError`).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("int32", (None,)), name="n")
    >>> b.output(b.op("negative", x))
    >>> doc = to_json_dict(b.freeze())
    >>> doc["inputs"], doc["ops"][0]["inputs"], doc["outputs"]
    ([{'value': '%n', 'type': {'dtype': 'int32', 'shape': [None]}}], ['%n'], ['%1'])

    A graph with subgraph bodies is version 2: each distinct body (bodies of
    bodies too) is one record of ``doc["subgraphs"]``, and attributes refer
    to it as ``{"subgraph": index}``.
    """
    if inline_limit < 0:
        raise ValueError("inline_limit must be >= 0")
    order = list(subgraphs_of(graph, recursive=True))
    index = {body: k for k, body in enumerate(order)}
    doc = _graph_dict(graph, inline_limit, index, 0)
    if not order:
        return doc
    records = [{"name": body.name, **_graph_dict(body.graph, inline_limit, index, _RECORD)} for body in order]
    for r in records:
        del r["format"], r["version"]
    return {"format": FORMAT, "version": VERSION, "subgraphs": records,
            **{k: v for k, v in doc.items() if k not in ("format", "version")}}


def _graph_dict(graph: Graph, inline_limit: int, bodies: dict[Subgraph, int], base: int) -> dict[str, Any]:
    """The document of one graph (version 1 layout); its bodies' attributes refer to ``bodies``.

    ``base``: the levels of nesting above it (a subgraph record's).
    """

    if inline_limit < 0:
        raise ValueError("inline_limit must be >= 0")
    graph.verify(check_types=False)
    sym = graph.symbols
    n_vals, n_ops, n_consts = graph.num_values, graph.num_ops, len(graph.constants)
    counts = Counter(sym.values.values())
    labels = [f"%{v}" for v in range(n_vals)]
    named = set()
    for v, name in sym.values.items():
        if 0 <= v < n_vals and _ref_safe(name, counts):
            labels[v] = f"%{name}"
            named.add(v)
    types_json = [type_json(t) for t in graph.types]
    value_type = graph.value_type.tolist()
    descriptions = dict(sym.descriptions)
    used_desc: set[tuple[str, int]] = set()

    def desc(kind: str, index: int, entry: dict[str, Any]) -> None:
        text = descriptions.get((kind, index))
        if text is not None:
            entry["description"] = text
            used_desc.add((kind, index))

    order = graph.topological_order().tolist()
    doc_values = [int(v) for v in graph.inputs] + [int(v) for op in order for v in graph.op_outputs(op)]
    named_numbers = [v for v in doc_values if v in named]
    write_numbers = any(a >= b for a, b in itertools.pairwise(named_numbers))

    def definition(v: int) -> dict[str, Any]:
        entry: dict[str, Any] = {"value": labels[v]}
        if write_numbers and v in named:
            entry["number"] = v
        entry["type"] = types_json[value_type[v]]
        name = sym.values.get(v)
        if name is not None and v not in named:
            entry["name"] = name
        desc("value", v, entry)
        return entry

    constants = []
    for i, c in enumerate(graph.constants):
        entry = encode_array(c, inline_limit=inline_limit)
        if i in sym.constants:
            entry["name"] = sym.constants[i]
        desc("constant", i, entry)
        constants.append(entry)

    write_index = order != list(range(n_ops))
    kinds = graph.op_kind.tolist()
    attr_ids = graph.op_attr.tolist()
    versions = graph.op_version.tolist()
    attrs_json: dict[int, dict[str, Any]] = {}
    ops = []
    for op in order:
        opdef = get_op(kinds[op])
        aid = attr_ids[op]
        attrs = attrs_json.get(aid)
        if attrs is None:
            attrs = attrs_json[aid] = _encode_attrs(graph.attrs[aid], inline_limit, bodies, op, opdef.name, base)
        entry = {"op": opdef.name, "id": opdef.id}
        if write_index:
            entry["index"] = op
        entry["inputs"] = [labels[v] for v in graph.op_inputs(op).tolist()]
        entry["outputs"] = [definition(v) for v in graph.op_outputs(op).tolist()]
        entry["attrs"] = attrs
        entry["version"] = versions[op]
        if op in sym.ops:
            entry["name"] = sym.ops[op]
        desc("op", op, entry)
        ops.append(entry)

    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION_PLAIN,
        "inputs": [definition(int(v)) for v in graph.inputs],
        "constants": constants,
        "ops": ops,
        "outputs": [labels[int(v)] for v in graph.outputs],
        "updates": [[labels[int(s)], labels[int(d)]] for s, d in graph.updates],
    }
    symbols: dict[str, Any] = {}
    for key, table, n in (("values", sym.values, n_vals), ("ops", sym.ops, n_ops),
                          ("constants", sym.constants, n_consts)):
        rest = [[k, table[k]] for k in sorted(table) if not 0 <= k < n]
        if rest:
            symbols[key] = rest
    if sym.io:
        symbols["io"] = [[k, sym.io[k]] for k in sorted(sym.io)]
    rest_desc = [[k[0], k[1], t] for k, t in sorted(descriptions.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))
                 if k not in used_desc]
    if rest_desc:
        symbols["descriptions"] = rest_desc
    if symbols:
        doc["symbols"] = symbols
    meta = _file_meta(graph, inline_limit, base)
    if meta:
        doc["file_meta"] = meta
    return doc


def _compact(obj: Any, ascii_only: bool) -> str:
    return json.dumps(obj, ensure_ascii=ascii_only, allow_nan=False, separators=(", ", ": "))


_WRITE_CHUNK = 1 << 12
"""Ops (or values, constants) turned into text at a time when writing."""


def _json_lines(graph: Graph, inline_limit: int, ascii_only: bool, bodies: dict[Subgraph, int] | None = None,
                record_name: str | None = None) -> Iterator[str]:
    """The text of :func:`dumps_json`, a few thousand records at a time (no object per op kept).

    Gives exactly ``to_json_dict(graph)`` laid out as the module doc shows: one
    input, constant or op per line, every other top-level value on one line.
    With ``record_name`` it is the record of a body named so (``bodies`` numbers
    the records its attributes refer to): ``"name"`` instead of format and version.
    """
    if inline_limit < 0:
        raise ValueError("inline_limit must be >= 0")
    graph.verify(check_types=False)
    js = json.encoder.encode_basestring_ascii if ascii_only else json.encoder.encode_basestring
    order_bodies: list[Subgraph] = []
    base = 0 if record_name is None else _RECORD
    if record_name is None:
        order_bodies = list(subgraphs_of(graph, recursive=True))
        bodies = {body: k for k, body in enumerate(order_bodies)}
    sym = graph.symbols
    n_vals, n_ops, n_consts = graph.num_values, graph.num_ops, len(graph.constants)
    counts = Counter(sym.values.values())
    labels: dict[int, str] = {}  # JSON text of the "%<name>" refs; the others are "%<number>"
    for v, name in sym.values.items():
        if 0 <= v < n_vals and _ref_safe(name, counts):
            labels[v] = js(f"%{name}")

    def label(v: int) -> str:
        return labels.get(v) or f'"%{v}"'

    def text(s: Any) -> str:
        return js(s) if type(s) is str else _compact(s, ascii_only)

    types_json = [_compact(type_json(t), ascii_only) for t in graph.types]
    value_type = graph.value_type
    descriptions = sym.descriptions
    order = graph.topological_order()
    # Numbers of named values are written when they do not ascend in file order.
    named = np.zeros(n_vals, dtype=bool)
    named[list(labels)] = True
    out_order = graph.out_ids[ranges(graph.out_ptr[:-1][order], graph.out_ptr[1:][order])]
    named_numbers = np.concatenate([graph.inputs[named[graph.inputs]], out_order[named[out_order]]])
    del out_order
    write_numbers = bool(np.any(np.diff(named_numbers.astype(np.int64)) <= 0))

    def definition(v: int, tid: int) -> str:
        parts = ['{"value": ', label(v)]
        if write_numbers and v in labels:
            parts += [', "number": ', str(v)]
        parts += [', "type": ', types_json[tid]]
        name = sym.values.get(v)
        if name is not None and v not in labels:
            parts += [', "name": ', text(name)]
        desc = descriptions.get(("value", v), _ABSENT)
        if desc is not _ABSENT:
            parts += [', "description": ', text(desc)]
        parts.append("}")
        return "".join(parts)

    def inputs() -> Iterator[str]:
        ids = graph.inputs.tolist()
        tids = value_type[graph.inputs].tolist()
        for v, t in zip(ids, tids, strict=True):
            yield definition(v, t)

    def constants() -> Iterator[str]:
        for i, c in enumerate(graph.constants):
            entry = encode_array(c, inline_limit=inline_limit)
            if i in sym.constants:
                entry["name"] = sym.constants[i]
            desc = descriptions.get(("constant", i), _ABSENT)
            if desc is not _ABSENT:
                entry["description"] = desc
            yield _compact(entry, ascii_only)

    write_index = not np.array_equal(order, np.arange(n_ops))
    attrs_json: dict[int, str] = {}
    kind_json: dict[int, tuple[str, str]] = {}

    def ops() -> Iterator[str]:
        for lo in range(0, n_ops, _WRITE_CHUNK):
            chunk = order[lo:lo + _WRITE_CHUNK]
            in_start, in_end = graph.in_ptr[chunk], graph.in_ptr[chunk + 1]
            out_start, out_end = graph.out_ptr[chunk], graph.out_ptr[chunk + 1]
            ins = graph.in_ids[ranges(in_start, in_end)].tolist()
            outs_np = graph.out_ids[ranges(out_start, out_end)]
            outs = outs_np.tolist()
            out_types = value_type[outs_np].tolist()
            n_in = (in_end - in_start).tolist()
            n_out = (out_end - out_start).tolist()
            a = b = 0
            for op, kind, aid, version, ni, no in zip(chunk.tolist(), graph.op_kind[chunk].tolist(),
                                                       graph.op_attr[chunk].tolist(),
                                                       graph.op_version[chunk].tolist(), n_in, n_out, strict=True):
                head = kind_json.get(kind)
                if head is None:
                    opdef = get_op(kind)
                    head = kind_json[kind] = (opdef.name, f'{{"op": {js(opdef.name)}, "id": {opdef.id}')
                attrs = attrs_json.get(aid)
                if attrs is None:
                    attrs = attrs_json[aid] = _compact(_encode_attrs(graph.attrs[aid], inline_limit, bodies, op,
                                                                     head[0], base), ascii_only)
                parts = [head[1]]
                if write_index:
                    parts += [', "index": ', str(op)]
                parts += [', "inputs": [', ", ".join(label(v) for v in ins[a:a + ni]), '], "outputs": [',
                          ", ".join(definition(v, t) for v, t in zip(outs[b:b + no], out_types[b:b + no],
                                                                     strict=True)),
                          '], "attrs": ', attrs, ', "version": ', str(version)]
                a += ni
                b += no
                name = sym.ops.get(op, _ABSENT)
                if name is not _ABSENT:
                    parts += [', "name": ', text(name)]
                desc = descriptions.get(("op", op), _ABSENT)
                if desc is not _ABSENT:
                    parts += [', "description": ', text(desc)]
                parts.append("}")
                yield "".join(parts)

    symbols: dict[str, Any] = {}
    for key, table, n in (("values", sym.values, n_vals), ("ops", sym.ops, n_ops),
                          ("constants", sym.constants, n_consts)):
        rest = [[k, table[k]] for k in sorted(table) if not 0 <= k < n]
        if rest:
            symbols[key] = rest
    if sym.io:
        symbols["io"] = [[k, sym.io[k]] for k in sorted(sym.io)]
    # Descriptions of values, ops and constants that exist went into their definitions.
    limits = {"value": n_vals, "op": n_ops, "constant": n_consts}
    rest_desc = [[k[0], k[1], t] for k, t in sorted(descriptions.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))
                 if not (k[0] in limits and _is_index(k[1], limits[k[0]]))]
    if rest_desc:
        symbols["descriptions"] = rest_desc
    meta = _file_meta(graph, inline_limit, base)

    outputs_text = "[" + ", ".join(label(v) for v in graph.outputs.tolist()) + "]"
    updates_text = "[" + ", ".join(f"[{label(s)}, {label(d)}]" for s, d in graph.updates.tolist()) + "]"
    tail: list[tuple[str, Any]] = [("outputs", outputs_text), ("updates", updates_text)]
    if symbols:
        tail.append(("symbols", symbols))
    if meta:
        tail.append(("file_meta", meta))

    yield "{\n"
    if record_name is not None:
        yield f'  "name": {text(record_name)},\n'
    else:
        yield f'  "format": {_compact(FORMAT, ascii_only)},\n'
        yield f'  "version": {VERSION if order_bodies else VERSION_PLAIN},\n'
        if order_bodies:
            # Each body once, before the ops that use it; a record's text is the same layout, indented.
            yield '  "subgraphs": [\n'
            for k, body in enumerate(order_bodies):
                record = "".join(_json_lines(body.graph, inline_limit, ascii_only, bodies, body.name))
                comma = "," if k < len(order_bodies) - 1 else ""
                yield "    " + record.replace("\n", "\n    ") + comma + "\n"
            yield "  ],\n"
    for key, rows, count in (("inputs", inputs(), len(graph.inputs)), ("constants", constants(), n_consts),
                             ("ops", ops(), n_ops)):
        if not count:
            yield f'  "{key}": [],\n'
            continue
        yield f'  "{key}": [\n'
        batch: list[str] = []
        for k, row in enumerate(rows):
            batch.append(f"    {row},\n" if k < count - 1 else f"    {row}\n")
            if len(batch) >= _WRITE_CHUNK:
                yield "".join(batch)
                batch.clear()
        yield "".join(batch)
        yield "  ],\n"
    for k, (key, val) in enumerate(tail):
        comma = "," if k < len(tail) - 1 else ""
        head = f"  {json.dumps(key)}: "
        if isinstance(val, str):
            yield head + val + comma + "\n"
        else:
            rows = [f"{json.dumps(kk, ensure_ascii=ascii_only)}: {_compact(x, ascii_only)}" for kk, x in val.items()]
            yield head + "{\n" + "".join(f"    {row},\n" for row in rows[:-1]) + f"    {rows[-1]}\n  }}{comma}\n"
    yield "}"


_ABSENT = object()


def _is_index(k: Any, n: int) -> bool:
    """Whether ``k`` is an index below ``n`` (as dict lookups with ints see it)."""
    try:
        return bool(0 <= k < n) and k == int(k)
    except (TypeError, ValueError, OverflowError):
        return False


def dumps_json(graph: Graph, *, inline_limit: int = DEFAULT_INLINE_LIMIT) -> str:
    """The JSON text of ``graph``: one op, input or constant per line.

    >>> import opgraph
    >>> from opgraph.io.jsonfmt import loads_json
    >>> g = opgraph.GraphBuilder().freeze()
    >>> loads_json(dumps_json(g)) == g
    True
    """
    return "".join(_json_lines(graph, inline_limit, ascii_only=False))


def save_json(graph: Graph, path: str | os.PathLike[str], *, inline_limit: int = DEFAULT_INLINE_LIMIT) -> None:
    """Write ``graph`` to ``path`` as UTF-8 JSON, atomically.

    Constants with more than ``inline_limit`` elements are stored as base64.
    The text is written as it is made, a few thousand records at a time, so
    memory does not grow with the size of the file.

    >>> import os, tempfile, numpy as np, opgraph
    >>> from opgraph.io.jsonfmt import load_json
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2,)), name="x")
    >>> b.output(b.op("add", x, np.float32(-0.0)))
    >>> g = b.freeze()
    >>> p = os.path.join(tempfile.mkdtemp(), "g.json")
    >>> save_json(g, p)
    >>> load_json(p).equals(g, check_names=True)
    True
    """
    with atomic_files([path]) as (f,), paused_gc():
        try:
            for part in _json_lines(graph, inline_limit, ascii_only=False):
                f.write(part.encode("utf-8"))
        except UnicodeEncodeError:  # lone surrogates in a name: escape everything
            f.seek(0)
            f.truncate()
            for part in _json_lines(graph, inline_limit, ascii_only=True):
                f.write(part.encode("ascii"))
        f.write(b"\n")
