"""The JSON form of a graph: readable, versioned and exact.

Seed 003 asks for a text form "similar to an MLIR dialect, but as JSON".
A file is one JSON object (version 1, or 2 for a graph with subgraph
bodies); the writer puts one record per line:

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> b.output(b.op("multiply", x, 2.0, name="y"))
    >>> print(dumps_json(b.freeze()))
    {
      "format": "opgraph",
      "version": 1,
      "inputs": [
        {"value": "%x", "type": {"dtype": "float64", "shape": [3]}}
      ],
      "constants": [
        {"dtype": "float64", "shape": [], "data": 2.0}
      ],
      "ops": [
        {"op": "const", "id": 0, "inputs": [], "outputs": [{"value": "%1", ...}], "attrs": {"index": 0}, "version": 0},
        {"op": "multiply", "id": 202, "inputs": ["%x", "%1"], "outputs": [{"value": "%y", ...}], ..., "name": "y"}
      ],
      "outputs": ["%y"],
      "updates": []
    }

Layout (``docs/graph.schema.json`` is the JSON Schema of it):

* ``"format": "opgraph"``, ``"version": 1`` (2 when ``subgraphs`` is
  present; a graph without bodies is written as version 1, exactly as before
  version 2 existed); a reader refuses other values.
* ``subgraphs`` (version 2): the bodies of control-flow ops (``call``,
  ``cond``, ``while_loop``, ``scan``), each distinct body once, bodies of
  bodies included, inner bodies first. A record is a graph in this same
  layout (``inputs`` are the body's parameters, ``outputs`` its results)
  with a ``"name"`` (the body's name) and without ``format``, ``version``
  and ``subgraphs``. An attribute whose value is a body is
  ``{"subgraph": k}``, ``k`` the record's index; a record may refer only to
  records before it (so there are no cycles). Loading builds one
  :class:`~opgraph.core.subgraph.Subgraph` per record, shared by every op
  that refers to it.
* ``inputs``: value definitions of the graph's inputs, in gateway order.
* ``constants``: the constants table, in index order (``const`` ops refer to
  it by their ``index`` attribute).
* ``ops``: in topological order, each ``{"op": kind name, "id": kind id,
  "inputs": [refs], "outputs": [value definitions], "attrs": {...},
  "version": int}`` plus optional ``"name"``, ``"description"`` and
  ``"index"`` (the op's number, written for every op when the graph's op
  numbering is not itself a topological order).
* ``outputs``: refs; ``updates``: ``[source ref, destination ref]`` pairs.
* ``symbols`` (optional): names and descriptions that belong to no
  definition: io gateway names ``"io": [[record, name], ...]``,
  ``"descriptions": [[kind, index, text], ...]`` and names keyed by numbers
  that do not exist (``"values"``, ``"ops"``, ``"constants"``).
* ``file_meta`` (optional): ``Graph.file_meta``, each entry encoded like an
  attribute value; entries that cannot be encoded are left out.

**Value definitions** are ``{"value": ref, "type": type}`` with optional
``"number"``, ``"name"`` and ``"description"``. A **ref** is ``"%<name>"``
for a value whose name is unique and not all digits, else ``"%<number>"``
(``number`` is the value's id in the Graph). A ``"%<name>"`` ref implies the
name; ``"name"`` is written only for a value whose ref is a number. Numbers
of ``"%<name>"`` values are written as ``"number"`` unless they ascend in
file order; a definition without a number gets the lowest number no other
definition claims, in file order (inputs first, then op outputs). So the
value and op numbering of the Graph is kept exactly, and a hand-written file
may leave numbers out. Any value may also be referred to as ``"%<number>"``.

**Types** are ``{"dtype": name, "shape": [dims]}`` with ``null`` for an
unknown dim and ``"shape": null`` for unknown rank, or ``{"void": true}``.
A reader infers a missing output ``type`` or ``version`` from the op's type
rule (for hand-written files); the writer always writes both.

**Attribute values** (and ``file_meta`` entries): ``null``, booleans,
integers, strings and finite floats are themselves (floats are written with
Python's shortest round-trip repr, so ``-0.0`` and every bit survive);
JSON arrays are tuples. Everything else is a one-key object:
``{"float": "nan" | "inf" | "-inf" | "bits:<16 hex digits>"}`` (the last for
a NaN with another sign or payload), ``{"complex": [re, im]}``,
``{"list": [...]}``, ``{"dict": {...}}`` (or ``{"dict": [[key, value],
...]}`` for non-string keys), ``{"bytes": base64}``, ``{"ndarray":
constant}``, ``{"numpy": constant}`` for a NumPy scalar and (op attributes
only) ``{"subgraph": k}`` for a body.

**Constants** are ``{"dtype", "shape", "data"}`` with ``data`` nested lists
(a bare scalar for shape ``[]``): booleans, integers, floats in shortest
exact form, ``"nan"``, ``"inf"``, ``"-inf"``, complex numbers as
``[re, im]``. A constant with more than ``inline_limit`` elements (or whose
NaNs have a sign or payload JSON text would lose) is
``{"dtype", "shape", "base64"}``: its C-order little-endian bytes, in the
same document (no side files, no pickle). Optional ``name`` and
``description``.

**Nesting** is at most :data:`MAX_DEPTH` (256) levels of arrays and
objects. Readers measure it before parsing, without recursion, and refuse
deeper text with a :class:`~opgraph.errors.FormatError` at the bracket that
crosses it (line, column and byte offset), whatever the recursion limit;
writers refuse to write it (docs/json-format.md, "Nesting limit").

Reading never executes code. Every problem (malformed JSON, wrong format or
version, unknown op kind, dangling ref, bad type, constant data that
disagree with dtype or shape, a graph that fails :meth:`Graph.verify`)
raises one :class:`~opgraph.errors.FormatError` naming the file and the JSON
path, e.g. ``model.json: ops[12].inputs[1]: ...``.

**Large files.** A file is read a window (1 MiB) at a time and the inputs,
constants and ops arrays element by element: each element is checked and
reduced to a few integers in compact arrays (kind, version, attribute and
type ids, ref codes) and dropped, so no Python object per op or value is
kept and loading needs about the file's size in memory, not 15 times it.
When a document has several problems, the one reported is the one a
reader checking it part by part meets first: malformed JSON (not UTF-8
before anything), then the top-level keys, format and version, the
subgraph records (each checked as a whole document, in order; its problems
are reported as ``subgraphs[k].ops[2]...``), the constants, the inputs' and the ops' value definitions, value and op
numbers, then each op in file order; whatever the order of the keys and
whether the text came as a file, bytes, a str or a dict
(:func:`from_json_dict`). Writing streams too: the text is made a few
thousand records at a time and written as it goes.

The package is split by job: :mod:`~opgraph.io.jsonfmt.encoding` (values,
arrays, types, the checks of JSON data), :mod:`~opgraph.io.jsonfmt.writer`,
:mod:`~opgraph.io.jsonfmt.tokenizer` (the streaming JSON text reader) and
:mod:`~opgraph.io.jsonfmt.reader` (the document into a graph).
"""

from __future__ import annotations

from opgraph.io.jsonfmt.encoding import (
    DEFAULT_INLINE_LIMIT,
    FORMAT,
    MAX_DEPTH,
    VERSION,
    VERSION_PLAIN,
    decode_value,
    encode_array,
    encode_value,
)
from opgraph.io.jsonfmt.reader import from_json_dict, load_json, loads_json
from opgraph.io.jsonfmt.writer import dumps_json, save_json, to_json_dict

__all__ = [
    "DEFAULT_INLINE_LIMIT", "FORMAT", "MAX_DEPTH", "VERSION", "VERSION_PLAIN", "decode_value", "dumps_json",
    "encode_array", "encode_value", "from_json_dict", "load_json", "loads_json", "save_json", "to_json_dict",
]
