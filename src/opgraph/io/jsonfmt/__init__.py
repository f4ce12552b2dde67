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
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import itertools
import json
import math
import os
import re
import struct
import sys
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np

from opgraph.core import progress
from opgraph.core.builder import exact_key
from opgraph.core.dtypes import as_dtype
from opgraph.core.gcpause import paused_gc
from opgraph.core.graph import Graph, Symbols
from opgraph.core.registry import CONST, OpDef, get_op, unknown_op_message
from opgraph.core.subgraph import Subgraph, subgraphs_of
from opgraph.core.types import VOID, TensorType, ValueType, VoidType
from opgraph.errors import FormatError, VerifyError
from opgraph.io._atomic import atomic_files

FORMAT = "opgraph"
"""Value of the top-level ``"format"`` key."""
VERSION = 2
"""The newest format version this module reads and writes (version 2 adds ``subgraphs``).

A graph without subgraphs is written as version 1, exactly as before
version 2 existed, so that its files stay readable by older opgraph."""
VERSION_PLAIN = 1
"""The version of a document without subgraphs."""
DEFAULT_INLINE_LIMIT = 256
"""Constants with more elements than this are written as base64."""

_NUMERIC_REF = re.compile(r"%(0|[1-9][0-9]*)")
_ALL_DIGITS = re.compile(r"[0-9]+")
_CANONICAL_NAN_BITS = 0x7FF8000000000000
_MAX_DIM = 2**62
_INT32 = (-(2**31), 2**31 - 1)

_TOP_KEYS = ("format", "version", "subgraphs", "inputs", "constants", "ops", "outputs", "updates", "symbols",
             "file_meta")
_BODY_KEYS = ("name", "inputs", "constants", "ops", "outputs", "updates", "symbols", "file_meta")
_DEF_KEYS = ("value", "number", "type", "name", "description")
_OP_KEYS = ("op", "id", "index", "inputs", "outputs", "attrs", "version", "name", "description")
_CONST_KEYS = ("dtype", "shape", "data", "base64", "name", "description")
_SYMBOL_KEYS = ("values", "ops", "constants", "io", "descriptions")


class _Bad(Exception):
    """A problem at a JSON path (turned into a FormatError naming the file)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


class _Unencodable(Exception):
    """A value the attribute encoding cannot represent."""


def _key_path(path: str, key: str) -> str:
    if key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _where(path: str) -> str:
    return path or "(top level)"


# ----------------------------------------------------------------------------- floats and values
def _float_bits(v: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", v))[0]


def _encode_float(v: float) -> Any:
    if math.isfinite(v):
        return float(v)
    if v == math.inf:
        return {"float": "inf"}
    if v == -math.inf:
        return {"float": "-inf"}
    bits = _float_bits(v)
    if bits == _CANONICAL_NAN_BITS:
        return {"float": "nan"}
    return {"float": f"bits:{bits:016x}"}


def _decode_float_tag(s: Any, path: str) -> float:
    if s == "nan":
        # np.nan itself: Graph.equals compares attribute tuples with ==, under
        # which NaN equals only the same object; graphs built with np.nan stay equal.
        return np.nan
    if s == "inf":
        return math.inf
    if s == "-inf":
        return -math.inf
    if isinstance(s, str) and re.fullmatch(r"bits:[0-9a-f]{16}", s):
        return struct.unpack("<d", struct.pack("<Q", int(s[5:], 16)))[0]
    raise _Bad(path, f"expected 'nan', 'inf', '-inf' or 'bits:<16 hex digits>', got {s!r}")


def encode_value(value: Any, *, inline_limit: int = DEFAULT_INLINE_LIMIT) -> Any:
    """Encode an attribute value (or ``file_meta`` entry) as JSON data, exactly.

    Tuples become arrays; see the module doc for the tagged forms. Raises
    ``TypeError`` for values that have no encoding.

    >>> encode_value((1, 2.5, None, "s", (True,)))
    [1, 2.5, None, 's', [True]]
    >>> encode_value(float("-inf")), encode_value([1])
    ({'float': '-inf'}, {'list': [1]})
    """
    try:
        return _enc(value, inline_limit)
    except _Unencodable as exc:
        raise TypeError(str(exc)) from None


def _enc(v: Any, limit: int, bodies: dict[Subgraph, int] | None = None) -> Any:
    if isinstance(v, np.ndarray):
        return {"ndarray": encode_array(v, inline_limit=limit)}
    if isinstance(v, np.generic):
        if not isinstance(v, (np.bool_, np.number)):
            raise _Unencodable(f"cannot encode NumPy scalar {v!r}")
        return {"numpy": encode_array(np.asarray(v), inline_limit=limit)}
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return _encode_float(float(v))
    if isinstance(v, complex):
        return {"complex": [_encode_float(v.real), _encode_float(v.imag)]}
    if isinstance(v, tuple):
        return [_enc(x, limit, bodies) for x in v]
    if isinstance(v, list):
        return {"list": [_enc(x, limit) for x in v]}
    if isinstance(v, dict):
        if all(type(k) is str for k in v):
            return {"dict": {k: _enc(x, limit) for k, x in v.items()}}
        return {"dict": [[_enc(k, limit), _enc(x, limit)] for k, x in v.items()]}
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, Subgraph):
        if bodies is not None and v in bodies:
            return {"subgraph": bodies[v]}
        raise _Unencodable(f"subgraph {v.label} can only be written as part of the graph that uses it (save_json)")
    raise _Unencodable(f"cannot encode {type(v).__name__} value {v!r} as JSON")


def decode_value(obj: Any, path: str = "") -> Any:
    """Inverse of :func:`encode_value`; raises ``ValueError`` on malformed data.

    >>> decode_value([1, [2.0, {"float": "nan"}], {"list": ["a"]}])
    (1, (2.0, nan), ['a'])
    """
    try:
        return _dec(obj, path)
    except _Bad as exc:
        raise ValueError(f"{_where(exc.path)}: {exc.message}") from None


class _BodyRef:
    """``{"subgraph": k}`` read from an op's attributes: record ``k`` of ``subgraphs``, resolved once all are read."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"{{'subgraph': {self.index}}}"


def _has_ref(v: Any) -> bool:
    return isinstance(v, _BodyRef) or (isinstance(v, tuple) and any(_has_ref(x) for x in v))


def _swap_refs(v: Any, f: Callable[[_BodyRef], Any]) -> Any:
    if isinstance(v, _BodyRef):
        return f(v)
    if isinstance(v, tuple):
        return tuple(_swap_refs(x, f) for x in v)
    return v


def _dec(obj: Any, path: str, refs: bool = False) -> Any:
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise _Bad(path, "number out of range (write non-finite floats as {\"float\": ...})")
        return obj
    if isinstance(obj, list):
        return tuple(_dec(x, f"{path}[{i}]", refs) for i, x in enumerate(obj))
    if isinstance(obj, dict):
        if len(obj) != 1:
            raise _Bad(path, f"a tagged value must have exactly one key, got {sorted(obj)}")
        ((tag, body),) = obj.items()
        sub = _key_path(path, tag)
        if tag == "float":
            return _decode_float_tag(body, sub)
        if tag == "subgraph":
            if not refs:
                raise _Bad(path, "a subgraph reference belongs in an op's attributes")
            if type(body) is not int or body < 0:
                raise _Bad(sub, f"expected the index of a record of 'subgraphs', got {_short(body)}")
            return _BodyRef(body)
        if tag == "complex":
            if not (isinstance(body, list) and len(body) == 2):
                raise _Bad(sub, "expected [re, im]")
            parts = []
            for i, p in enumerate(body):
                p = _dec(p, f"{sub}[{i}]")
                if type(p) is not float:
                    raise _Bad(f"{sub}[{i}]", f"expected a float, got {p!r}")
                parts.append(p)
            return complex(parts[0], parts[1])
        if tag == "list":
            if not isinstance(body, list):
                raise _Bad(sub, "expected an array")
            return [_dec(x, f"{sub}[{i}]") for i, x in enumerate(body)]
        if tag == "dict":
            if isinstance(body, dict):
                return {k: _dec(x, _key_path(sub, k)) for k, x in body.items()}
            if isinstance(body, list):
                out: dict[Any, Any] = {}
                for i, pair in enumerate(body):
                    if not (isinstance(pair, list) and len(pair) == 2):
                        raise _Bad(f"{sub}[{i}]", "expected a [key, value] pair")
                    key = _dec(pair[0], f"{sub}[{i}][0]")
                    try:
                        out[key] = _dec(pair[1], f"{sub}[{i}][1]")
                    except TypeError:
                        raise _Bad(f"{sub}[{i}][0]", f"unhashable key {key!r}") from None
                return out
            raise _Bad(sub, "expected an object or an array of pairs")
        if tag == "bytes":
            return _b64(body, sub)
        if tag == "ndarray":
            return _decode_array(body, sub)
        if tag == "numpy":
            arr = _decode_array(body, sub)
            if arr.ndim != 0:
                raise _Bad(sub, "a NumPy scalar must have shape []")
            return arr[()]
        raise _Bad(path, f"unknown tag {tag!r} (expected float, complex, list, dict, bytes, ndarray, numpy or "
                         f"subgraph)")
    raise _Bad(path, f"unexpected JSON value {obj!r}")


def _b64(body: Any, path: str) -> bytes:
    if not isinstance(body, str):
        raise _Bad(path, "expected a base64 string")
    try:
        return base64.b64decode(body.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise _Bad(path, f"invalid base64: {exc}") from None


# ----------------------------------------------------------------------------- arrays
def encode_array(arr: np.ndarray, *, inline_limit: int = DEFAULT_INLINE_LIMIT) -> dict[str, Any]:
    """Encode an array exactly: nested lists up to ``inline_limit`` elements, else base64.

    >>> encode_array(np.array([1.5, -0.0, np.inf], np.float32))
    {'dtype': 'float32', 'shape': [3], 'data': [1.5, -0.0, 'inf']}
    >>> encode_array(np.arange(3, dtype=np.int16), inline_limit=2)
    {'dtype': 'int16', 'shape': [3], 'base64': 'AAABAAIA'}
    """
    arr = np.asarray(arr)
    dtype = as_dtype(arr.dtype)
    arr = np.asarray(arr, dtype=dtype, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    head: dict[str, Any] = {"dtype": dtype.name, "shape": list(arr.shape)}
    if arr.size <= inline_limit:
        data = _inline(arr)
        if data is not _NO_INLINE:
            return {**head, "data": data}
    raw = arr.astype(dtype.newbyteorder("<"), copy=False).tobytes()
    return {**head, "base64": base64.b64encode(raw).decode("ascii")}


_NO_INLINE = object()


def _inline(arr: np.ndarray) -> Any:
    """Nested lists that decode to exactly ``arr``'s bytes, or _NO_INLINE."""
    kind = arr.dtype.kind
    if kind in "biu":
        return arr.tolist()
    parts = arr
    if kind == "c":
        parts = arr.reshape(-1).view(np.dtype(f"f{arr.dtype.itemsize // 2}")).reshape((*arr.shape, 2))
    flat = parts.reshape(-1)
    exact = flat.astype(np.float64).tolist()
    candidates = [exact]
    if flat.dtype != np.float64:
        # Shortest repr of the narrower type reads better; it is kept only if it reads back exactly.
        candidates.insert(0, [float(str(x)) for x in flat])
    for vals in candidates:
        leaves = [v if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf")) for v in vals]
        nested = np.array(leaves, dtype=object).reshape(parts.shape).tolist() if parts.ndim else leaves[0]
        try:
            back = _decode_inline(nested, arr.dtype, list(arr.shape), "")
        except _Bad:
            continue
        if back.tobytes() == arr.tobytes():
            return nested
    return _NO_INLINE


def _check_shape(shape: Any, path: str) -> tuple[int, ...]:
    if not isinstance(shape, list):
        raise _Bad(path, f"expected a list of dimensions, got {shape!r}")
    for i, d in enumerate(shape):
        if type(d) is not int or not 0 <= d < _MAX_DIM:
            raise _Bad(f"{path}[{i}]", f"invalid dimension {d!r}")
    if math.prod(d for d in shape if d) >= _MAX_DIM:
        raise _Bad(path, f"shape {shape} is too large")
    return tuple(shape)


def _check_dtype(name: Any, path: str) -> np.dtype:
    if not isinstance(name, str):
        raise _Bad(path, f"expected a dtype name, got {name!r}")
    try:
        return as_dtype(name)
    except Exception:
        raise _Bad(path, f"unsupported dtype {name!r}") from None


def _decode_array(obj: Any, path: str) -> np.ndarray:
    if not isinstance(obj, dict):
        raise _Bad(path, "expected a constant object with dtype, shape and data or base64")
    _check_keys(obj, ("dtype", "shape", "data", "base64"), path)
    return _decode_array_body(obj, path)


def _decode_array_body(obj: dict[str, Any], path: str) -> np.ndarray:
    for key in ("dtype", "shape"):
        if key not in obj:
            raise _Bad(path, f"missing key {key!r}")
    dtype = _check_dtype(obj["dtype"], _key_path(path, "dtype"))
    shape = _check_shape(obj["shape"], _key_path(path, "shape"))
    if ("data" in obj) == ("base64" in obj):
        raise _Bad(path, "a constant needs exactly one of 'data' and 'base64'")
    if "data" in obj:
        return _decode_inline(obj["data"], dtype, list(shape), _key_path(path, "data"))
    bpath = _key_path(path, "base64")
    raw = _b64(obj["base64"], bpath)
    size = math.prod(shape)
    if len(raw) != size * dtype.itemsize:
        raise _Bad(bpath, f"{len(raw)} bytes of data for {size} {dtype.name} elements of shape {list(shape)} "
                          f"(expected {size * dtype.itemsize})")
    arr = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)
    if dtype.kind == "b" and raw.translate(None, b"\x00\x01"):
        raise _Bad(bpath, "boolean data must be bytes 0 and 1")
    return arr


def _decode_inline(data: Any, dtype: np.dtype, shape: list[int], path: str) -> np.ndarray:
    kind = dtype.kind
    leaf_shape = [*shape, 2] if kind == "c" else shape
    leaves: list[Any] = []
    _flatten(data, leaf_shape, 0, [], leaves, path)

    def bad(k: int, why: str) -> _Bad:
        idx, pos = [], k
        for d in reversed(leaf_shape):
            idx.append(pos % d)
            pos //= d
        return _Bad(path + "".join(f"[{i}]" for i in reversed(idx)), why)

    if kind == "b":
        for k, v in enumerate(leaves):
            if type(v) is not bool:
                raise bad(k, f"expected true or false for {dtype.name}, got {v!r}")
        return np.array(leaves, dtype=dtype).reshape(shape)
    if kind in "iu":
        info = np.iinfo(dtype)
        for k, v in enumerate(leaves):
            if type(v) is not int:
                raise bad(k, f"expected an integer for {dtype.name}, got {v!r}")
            if not info.min <= v <= info.max:
                raise bad(k, f"{v} is out of range for {dtype.name}")
        return np.array(leaves, dtype=dtype).reshape(shape)
    vals: list[float] = []
    for k, v in enumerate(leaves):
        if type(v) is float:
            if not math.isfinite(v):
                raise bad(k, "number out of range")
            vals.append(v)
        elif type(v) is int:
            try:
                vals.append(float(v))
            except OverflowError:
                raise bad(k, f"{v} is out of range for {dtype.name}") from None
        elif v in ("nan", "inf", "-inf"):
            vals.append(float(v))
        else:
            raise bad(k, f"expected a number, 'nan', 'inf' or '-inf' for {dtype.name}, got {v!r}")
    part = np.dtype(f"f{dtype.itemsize // 2}") if kind == "c" else dtype
    wide = np.array(vals, dtype=np.float64)
    with np.errstate(over="ignore"):
        narrow = wide.astype(part)
    over = np.flatnonzero(np.isfinite(wide) & ~np.isfinite(narrow))
    if len(over):
        raise bad(int(over[0]), f"{vals[int(over[0])]!r} is out of range for {part.name}")
    if kind == "c":
        return narrow.view(dtype).reshape(shape)
    return narrow.reshape(shape)


def _flatten(data: Any, shape: list[int], depth: int, index: list[int], out: list[Any], path: str) -> None:
    if depth == len(shape):
        if isinstance(data, (list, dict)):
            where = path + "".join(f"[{i}]" for i in index)
            raise _Bad(where, f"expected a scalar at depth {depth} for shape {shape}, got a nested "
                              f"{'array' if isinstance(data, list) else 'object'}")
        out.append(data)
        return
    if not isinstance(data, list) or len(data) != shape[depth]:
        where = path + "".join(f"[{i}]" for i in index)
        got = f"an array of {len(data)}" if isinstance(data, list) else repr(data)
        raise _Bad(where, f"data do not match shape {shape}: expected an array of {shape[depth]} "
                          f"at depth {depth}, got {got}")
    for i, x in enumerate(data):
        index.append(i)
        _flatten(x, shape, depth + 1, index, out, path)
        index.pop()


# ----------------------------------------------------------------------------- types
def _type_json(t: ValueType) -> dict[str, Any]:
    if isinstance(t, VoidType):
        return {"void": True}
    return t.to_json()


def _decode_type(obj: Any, path: str) -> ValueType:
    if not isinstance(obj, dict):
        raise _Bad(path, f"expected a type object like {{\"dtype\": \"float64\", \"shape\": [3]}}, got {obj!r}")
    if "void" in obj:
        if obj != {"void": True}:
            raise _Bad(path, "a void type is exactly {\"void\": true}")
        return VOID
    _check_keys(obj, ("dtype", "shape"), path)
    if "dtype" not in obj or "shape" not in obj:
        raise _Bad(path, "a tensor type needs 'dtype' and 'shape'")
    name, shape = obj["dtype"], obj["shape"]
    if shape is not None:
        spath = _key_path(path, "shape")
        if not isinstance(shape, list):
            raise _Bad(spath, f"expected a list of dimensions or null, got {shape!r}")
        for i, d in enumerate(shape):
            if d is not None and (type(d) is not int or not 0 <= d < _MAX_DIM):
                raise _Bad(f"{spath}[{i}]", f"invalid dimension {d!r} (a non-negative integer or null)")
        shape = tuple(shape)
    if not isinstance(name, str):
        raise _Bad(_key_path(path, "dtype"), f"expected a dtype name, got {name!r}")
    try:
        return _tensor_type(name, shape)
    except Exception:
        raise _Bad(_key_path(path, "dtype"), f"unsupported dtype {name!r}") from None


@functools.lru_cache(maxsize=4096)
def _tensor_type(dtype: str, shape: tuple[int | None, ...] | None) -> TensorType:
    # Files repeat a few types many times; dims are checked (exact ints or None) before this.
    return TensorType(as_dtype(dtype), shape)


# ----------------------------------------------------------------------------- writing
def _ref_safe(name: Any, counts: Counter[Any]) -> bool:
    return isinstance(name, str) and name != "" and counts[name] == 1 and not _ALL_DIGITS.fullmatch(name)



def _file_meta(graph: Graph, inline_limit: int) -> dict[str, Any]:
    """The graph's file_meta entries that JSON can hold (others are format details of another format)."""
    meta = {}
    for key, value in graph.file_meta.items():
        if type(key) is str:
            try:
                meta[key] = _enc(value, inline_limit)
            except _Unencodable:
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
    doc = _graph_dict(graph, inline_limit, index)
    if not order:
        return doc
    records = [{"name": body.name, **_graph_dict(body.graph, inline_limit, index)} for body in order]
    for r in records:
        del r["format"], r["version"]
    return {"format": FORMAT, "version": VERSION, "subgraphs": records,
            **{k: v for k, v in doc.items() if k not in ("format", "version")}}


def _graph_dict(graph: Graph, inline_limit: int, bodies: dict[Subgraph, int]) -> dict[str, Any]:
    """The document of one graph (version 1 layout); its bodies' attributes refer to ``bodies``."""

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
    types_json = [_type_json(t) for t in graph.types]
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
            pairs = graph.attrs[aid]
            keys = [k for k, _ in pairs]
            if any(type(k) is not str for k in keys) or len(set(keys)) != len(keys):
                raise ValueError(f"op {op} ({opdef.name}): attribute names must be distinct strings, got {keys}")
            try:
                attrs = attrs_json[aid] = {k: _enc(v, inline_limit, bodies) for k, v in pairs}
            except _Unencodable as exc:
                raise ValueError(f"op {op} ({opdef.name}): {exc}") from None
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
    meta = _file_meta(graph, inline_limit)
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

    types_json = [_compact(_type_json(t), ascii_only) for t in graph.types]
    value_type = graph.value_type
    descriptions = sym.descriptions
    order = graph.topological_order()
    # Numbers of named values are written when they do not ascend in file order.
    named = np.zeros(n_vals, dtype=bool)
    named[list(labels)] = True
    out_order = graph.out_ids[_ranges(graph.out_ptr[:-1][order], graph.out_ptr[1:][order])]
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
            ins = graph.in_ids[_ranges(in_start, in_end)].tolist()
            outs_np = graph.out_ids[_ranges(out_start, out_end)]
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
                    pairs = graph.attrs[aid]
                    keys = [k for k, _ in pairs]
                    if any(type(k) is not str for k in keys) or len(set(keys)) != len(keys):
                        raise ValueError(f"op {op} ({head[0]}): attribute names must be distinct strings, got {keys}")
                    try:
                        attrs = attrs_json[aid] = _compact({k: _enc(v, inline_limit, bodies) for k, v in pairs},
                                                           ascii_only)
                    except _Unencodable as exc:
                        raise ValueError(f"op {op} ({head[0]}): {exc}") from None
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
    meta = _file_meta(graph, inline_limit)

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


# ----------------------------------------------------------------------------- reading: checks
def _check_keys(obj: dict[str, Any], allowed: Sequence[str], path: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _Bad(_key_path(path, key), f"unknown key {key!r} (allowed: {', '.join(allowed)})")


def _obj(x: Any, path: str, what: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise _Bad(path, f"expected {what} (a JSON object), got {_short(x)}")
    return x


def _arr(x: Any, path: str, what: str) -> list[Any]:
    if not isinstance(x, list):
        raise _Bad(path, f"expected {what} (a JSON array), got {_short(x)}")
    return x


def _int(x: Any, path: str, what: str, lo: int | None = None, hi: int | None = None) -> int:
    if type(x) is not int:
        raise _Bad(path, f"expected {what} (an integer), got {_short(x)}")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        raise _Bad(path, f"{what} {x} is out of range")
    return x


def _str(x: Any, path: str, what: str) -> str:
    if not isinstance(x, str):
        raise _Bad(path, f"expected {what} (a string), got {_short(x)}")
    return x


def _short(x: Any) -> str:
    s = json.dumps(x) if isinstance(x, (list, dict, str, int, float, bool, type(None))) else repr(x)
    return s if len(s) <= 60 else s[:57] + "..."


def _pairs(x: Any, path: str, width: int, what: str) -> list[list[Any]]:
    rows = _arr(x, path, what)
    for i, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == width):
            raise _Bad(f"{path}[{i}]", f"expected an array of {width} items")
    return rows


def _numeric_ref(ref: str) -> bool:
    """Whether ``ref`` is ``"%<number>"`` (no leading zeros): ``_NUMERIC_REF.fullmatch``, faster."""
    return ref.isascii() and ref[1:].isdigit() and ref[0] == "%" and (ref[1] != "0" or len(ref) == 2)


_BIG = 2**62
"""Numbers from here on are kept aside (in a dict) and stand as this value in the per-entry arrays."""


def _ref_code(ref: str, names: dict[str, int]) -> int:
    """A value ref as an integer: its number for ``"%<number>"``, else ``-1 - id`` of the interned ref."""
    if _numeric_ref(ref):
        v = int(ref[1:])
        if v < _BIG:
            return v
    code = names.get(ref)
    if code is None:
        code = names[ref] = -1 - len(names)
    return code


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, e)`` for each pair (int64)."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(ends, dtype=np.int64) - starts
    if len(lengths) == 0 or int(lengths.sum()) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))


def _assign_numbers(explicit: np.ndarray, path_of: Callable[[int], str], what: str,
                    big: dict[int, int]) -> np.ndarray:
    """Explicit numbers (-1: none) must be distinct and in range; the others take the free ones in order.

    Raises at the first offending entry in order, as a loop over the entries would. ``big``
    holds the numbers of entries that stand as ``_BIG``.
    """
    n = len(explicit)
    if n and int(explicit.min()) >= 0 and int(explicit.max()) < n and bool(np.all(explicit[1:] > explicit[:-1])):
        return explicit  # all given, distinct and in range (the writer's files): nothing to assign
    given = np.flatnonzero(explicit >= 0)
    nums = explicit[given]
    first_bad = n
    out_of_range = np.flatnonzero(nums >= n)
    if len(out_of_range):
        first_bad = int(given[out_of_range[0]])
    uniq, first = np.unique(nums, return_index=True)
    if len(uniq) != len(nums):
        again = np.ones(len(nums), dtype=bool)
        again[first] = False
        k = int(np.flatnonzero(again)[0])
        if int(given[k]) < first_bad:
            num = big.get(int(given[k]), int(nums[k]))
            earlier = int(given[first[np.searchsorted(uniq, num)]])
            raise _Bad(path_of(int(given[k])), f"{what} number {num} is defined twice (first at {path_of(earlier)})")
    if first_bad < n:
        raise _Bad(path_of(first_bad), f"{what} number {big.get(first_bad, int(explicit[first_bad]))} is out of range: "
                                       f"the file defines {n} {what}s")
    if len(given) == n:
        return explicit.copy()
    claimed = np.zeros(n, dtype=bool)
    claimed[nums] = True
    out = explicit.copy()
    out[explicit < 0] = np.flatnonzero(~claimed)[: n - len(given)]
    return out


# ----------------------------------------------------------------------------- reading: the text
class _Malformed(Exception):
    """A JSON syntax problem (malformed JSON), with its line and column."""


_WINDOW = 1 << 20
"""Characters (bytes) read at a time from a file."""
_MARGIN = 16
"""A parse that ends this close to the end of the window is tried again with more text."""
_WS = re.compile(r"[ \t\n\r]*").match
_SCAN = json.decoder.scanstring
_TRAILING_COMMA = sys.version_info >= (3, 13)  # json names a trailing comma from 3.13 on


class _Text:
    """JSON text read a window at a time, so that no more than a window and one element are in memory.

    ``source`` is a str (used as it is), bytes or a binary file (decoded as UTF-8, a
    window at a time). Positions in messages are those of the whole text.
    """

    def __init__(self, source: str | bytes | bytearray | BinaryIO, scan: Callable[[str, int], Any]) -> None:
        self.scan = scan
        self.i = 0  # position in buf
        self.off = 0  # position of buf[0] in the text
        self.lines = 0  # newlines before buf[0]
        self.last_nl = -1  # position of the last newline before buf[0]
        self._pending = b""  # bytes of a character cut by the window
        self._byte = 0  # bytes decoded so far (after a BOM)
        self._failed: str | None = None
        self.tick: Any = progress.NO_TASK  # the load's progress task, reported once per window
        if isinstance(source, str):
            self.buf = source[1:] if source.startswith("\ufeff") else source
            self.eof = True
            self._file: Any = None
            return
        self.buf = ""
        self.eof = False
        self._file = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
        head = self._file.read(3)
        self._pending = head[3:] if head == b"\xef\xbb\xbf" else head

    # -------------------------------------------------------------- windows
    def _decode(self) -> str:
        """The next window of text ('' at the end)."""
        raw = self._pending + self._file.read(_WINDOW)
        final = len(raw) == len(self._pending)
        cut = len(raw)
        if not final:  # keep a character the window cuts in two for the next one
            k = cut - 1
            while k >= 0 and cut - k < 4 and raw[k] & 0xC0 == 0x80:
                k -= 1
            if k >= 0 and raw[k] >= 0xC0 and cut - k < (2 if raw[k] < 0xE0 else 3 if raw[k] < 0xF0 else 4):
                cut = k
        try:
            text = raw[:cut].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _NotUtf8(self._byte + exc.start) from None
        self._byte += cut
        self.tick.advance(cut)
        self._pending = raw[cut:]
        if final:
            self.eof = True
        return text

    def _more(self) -> None:
        """Drop what is read and append the next window (at least doubling what is left)."""
        self._drop()
        parts = [self.buf]
        size = len(self.buf)
        while not self.eof and size < max(_WINDOW, 2 * len(self.buf)):
            part = self._decode()
            parts.append(part)
            size += len(part)
        self.buf = "".join(parts)

    def _drop(self) -> None:
        i, buf = self.i, self.buf
        if i:
            self.lines += buf.count("\n", 0, i)
            r = buf.rfind("\n", 0, i)
            if r >= 0:
                self.last_nl = self.off + r
            self.off += i
            self.buf = buf[i:]
            self.i = 0

    def check_rest(self) -> None:
        """Decode the rest of the text, which must be UTF-8 (before a syntax error is reported)."""
        while not self.eof:
            self._decode()

    # -------------------------------------------------------------- tokens
    def malformed(self, msg: str, pos: int) -> _Malformed:
        buf = self.buf
        line = self.lines + buf.count("\n", 0, pos) + 1
        r = buf.rfind("\n", 0, pos)
        col = pos - r if r >= 0 else self.off + pos - self.last_nl
        return _Malformed(f"malformed JSON at line {line} column {col}: {msg}")

    def ws(self) -> None:
        while True:
            self.i = _WS(self.buf, self.i).end()
            if self.i < len(self.buf) or self.eof:
                return
            self._more()

    def peek(self) -> str:
        """The next character ('' at the end); call after ws()."""
        return self.buf[self.i:self.i + 1]

    def at_end(self) -> bool:
        self.ws()
        return self.i >= len(self.buf)

    def value(self) -> Any:
        """Parse the JSON value at the current position."""
        return self._parse(self.scan)

    def string(self) -> str:
        """Parse the string whose opening quote is at the current position."""
        return self._parse(lambda buf, i: _SCAN(buf, i + 1, True))

    def _parse(self, fn: Callable[[str, int], tuple[Any, int]]) -> Any:
        while True:
            buf, i = self.buf, self.i
            try:
                obj, end = fn(buf, i)
            except StopIteration as exc:  # no value starts there
                msg, pos = "Expecting value", exc.value
            except json.JSONDecodeError as exc:
                msg, pos = exc.msg, exc.pos
            except (RecursionError, _Bad):
                raise
            except ValueError as exc:  # e.g. an integer with too many digits: try once more with more text
                if self.eof or self._failed == str(exc):
                    raise
                self._failed = str(exc)
                self._more()
                continue
            else:
                if self.eof or end + _MARGIN <= len(buf):  # a number could go on past the window
                    self.i = end
                    self._failed = None
                    return obj
                self._more()
                continue
            # An error far enough from the end of the window is an error of the whole text.
            if self.eof or (not msg.startswith("Unterminated string") and pos + _MARGIN < len(buf)):
                raise self.malformed(msg, pos)
            self._more()


class _NotUtf8(Exception):
    def __init__(self, byte: int) -> None:
        super().__init__(byte)
        self.byte = byte


def _stream_document(text: _Text, doc: _Doc) -> None:
    """Parse a document, feeding ``doc`` as json.loads would build it (same errors at the same places).

    The top-level object is parsed here, and the arrays of inputs, constants and ops
    element by element; every other value is parsed whole.
    """
    text.ws()
    if text.peek() != "{":
        doc.top = text.value()
        if not text.at_end():
            raise text.malformed("Extra data", text.i)
        return
    text.i += 1
    keys: list[str] = []
    text.ws()
    c = text.peek()
    if c == "}":
        text.i += 1
    elif c != '"':
        raise text.malformed("Expecting property name enclosed in double quotes", text.i)
    else:
        while True:
            key = text.string()
            text.ws()
            if text.peek() != ":":
                raise text.malformed("Expecting ':' delimiter", text.i)
            text.i += 1
            text.ws()
            keys.append(key)
            if key in _STREAMED and text.peek() == "[":
                _stream_array(text, doc.stream(key))
            else:
                doc.value(key, text.value())
            if _item_ends(text, "}"):
                break
            if text.peek() != '"':
                raise text.malformed("Expecting property name enclosed in double quotes", text.i)
    if len(set(keys)) != len(keys):
        _no_duplicates([(k, None) for k in keys])
    if not text.at_end():
        raise text.malformed("Extra data", text.i)


def _stream_array(text: _Text, take: Callable[[int, Any], None]) -> None:
    """Parse the array at the current position, handing each element to ``take(index, element)``."""
    text.i += 1
    text.ws()
    if text.peek() == "]":
        text.i += 1
        return
    k = 0
    while True:
        take(k, text.value())
        k += 1
        if _item_ends(text, "]"):
            return


def _item_ends(text: _Text, close: str) -> bool:
    """After an object member or array element: True past the closing ``close``, else False past the comma.

    Errors as json.loads gives them: a missing delimiter, and (where this Python's json rejects it
    with its own message) a trailing comma before ``close``.
    """
    text.ws()
    c = text.peek()
    if c == close:
        text.i += 1
        return True
    if c != ",":
        raise text.malformed("Expecting ',' delimiter", text.i)
    comma = text.i
    text.i += 1
    text.ws()
    if _TRAILING_COMMA and text.peek() == close:
        what = "object" if close == "}" else "array"
        raise text.malformed(f"Illegal trailing comma before end of {what}", comma)
    return False


# ----------------------------------------------------------------------------- reading: the document
_STREAMED = ("inputs", "constants", "ops")
_DEF_KEYSET = frozenset(_DEF_KEYS)
_OP_KEYSET = frozenset(_OP_KEYS)
_NONE = -(2**62)
"""An absent version or op index in the per-op arrays."""
# Classes of problems, in the order a document is checked (the first problem of the lowest class wins).
_C_CONSTANTS, _C_INPUTS, _C_OP_DEFS, _C_OP_INDEX, _C_OPS = 2, 3, 4, 6, 7
_R_KIND, _R_ID, _R_INPUTS, _R_ATTRS, _R_VERSION, _R_INFER, _R_NAME, _R_DESCRIPTION = range(8)


class _Doc:
    """What a document holds, gathered as it is read, in compact arrays (no object per op or value).

    The top-level values arrive through :meth:`value`; the elements of the inputs,
    constants and ops arrays one at a time through :meth:`stream`. A problem is kept
    (not raised) with its place in the order in which a document is checked, so that
    :meth:`graph` reports the same first problem whatever the order of the keys and
    however the document was read.
    """

    def __init__(self) -> None:
        self.top: Any = {}
        self.problem: tuple[tuple[int, ...], _Bad] | None = None
        # constants
        self.constants: list[np.ndarray] = []
        self.const_names: dict[int, str] = {}
        self.descriptions: dict[tuple[str, int], str] = {}
        # value definitions: inputs and op outputs, kept apart (inputs are numbered first)
        self.names: dict[str, int] = {}  # interned "%name" refs -> -1 - id
        self.type_ids: dict[ValueType, int] = {}
        self.types: list[ValueType] = []
        self.type_keys: dict[tuple[Any, ...], int] = {}
        self.defs = {"inputs": _Defs(), "ops": _Defs()}
        # ops, in file order
        self.n_ops = 0
        self.op_ndef = array("i")  # output definitions per op
        self.op_index = array("q")  # "index" (or _NONE)
        self.op_kind = array("i")
        self.op_version = array("q")  # (or _NONE)
        self.op_attr = array("i")
        self.op_nin = array("i")  # input refs read per op
        self.in_codes = array("q")  # the refs (see _ref_code)
        self.op_names: dict[int, str] = {}
        self.op_descriptions: dict[int, str] = {}
        self.attrs: list[tuple[tuple[str, Any], ...]] = []
        self.attr_ids: dict[Any, int] = {}
        self.attr_keys: dict[Any, int] = {}
        self.opdefs: dict[Any, OpDef] = {}
        self.checked_ops = 0  # ops whose own checks ran (up to the first op with a problem)
        self.big_index: dict[int, int] = {}  # op indices from _BIG on
        # subgraphs: the bodies attributes may refer to, and the attribute entries that refer to them
        self.bodies: list[Subgraph] = []
        self.in_body = False  # reading a record of "subgraphs" (it may refer only to earlier records)
        self.deferred: dict[int, tuple[OpDef, int, bool]] = {}  # attr id -> (kind, first op, all attrs given)

    # -------------------------------------------------------------- problems
    def keep(self, where: tuple[int, ...], exc: _Bad) -> None:
        if self.problem is None or where < self.problem[0]:
            self.problem = (where, exc)

    def wanted(self, cls: int) -> bool:
        """Whether a problem of class ``cls`` could still be the one reported."""
        return self.problem is None or cls < self.problem[0][0]

    # -------------------------------------------------------------- feeding
    def value(self, key: str, value: Any) -> None:
        self.top[key] = value
        if key in _STREAMED:  # not an array (an array is streamed)
            cls = {"constants": _C_CONSTANTS, "inputs": _C_INPUTS, "ops": _C_OP_DEFS}[key]
            what = {"constants": "the constants table", "inputs": "the inputs", "ops": "the ops"}[key]
            try:
                _arr(value, key, what)
            except _Bad as exc:
                self.keep((cls, -1), exc)

    def stream(self, key: str) -> Callable[[int, Any], None]:
        self.top[key] = _STREAMED_MARK
        return {"constants": self._constant, "inputs": self._input, "ops": self._op}[key]

    def feed(self, doc: Any) -> None:
        """Feed a document already parsed (``from_json_dict``)."""
        if not isinstance(doc, dict):
            self.top = doc
            return
        for key, value in doc.items():
            if key in _STREAMED and isinstance(value, list):
                take = self.stream(key)
                for k, x in enumerate(value):
                    take(k, x)
            else:
                self.value(key, value)

    # -------------------------------------------------------------- elements
    def _constant(self, i: int, c: Any) -> None:
        if not self.wanted(_C_CONSTANTS):
            return
        path = f"constants[{i}]"
        try:
            c = _obj(c, path, "a constant")
            _check_keys(c, _CONST_KEYS, path)
            self.constants.append(_decode_array_body(c, path))
            if "name" in c:
                self.const_names[i] = _str(c["name"], f"{path}.name", "a name")
            if "description" in c:
                self.descriptions[("constant", i)] = _str(c["description"], f"{path}.description", "a description")
        except _Bad as exc:
            self.keep((_C_CONSTANTS, i), exc)

    def _input(self, i: int, d: Any) -> None:
        if self.wanted(_C_INPUTS):
            try:
                self._def(self.defs["inputs"], d, lambda: f"inputs[{i}]")
            except _Bad as exc:
                self.keep((_C_INPUTS, i), exc)

    def _def(self, defs: _Defs, obj: Any, where: Callable[[], str]) -> None:
        """One value definition (the checks of the module doc, in their order)."""
        if type(obj) is not dict:
            _obj(obj, where(), "a value definition")
        if not obj.keys() <= _DEF_KEYSET:
            _check_keys(obj, _DEF_KEYS, where())
        ref = obj.get("value")
        if type(ref) is not str:
            if "value" not in obj:
                raise _Bad(where(), "missing key 'value' (the value's ref, like \"%x\" or \"%3\")")
            _str(ref, _key_path(where(), "value"), "a value ref")
        if ref[:1] != "%" or len(ref) < 2:
            raise _Bad(_key_path(where(), "value"), f"a value ref starts with '%', got {ref!r}")
        code = _ref_code(ref, self.names)
        numeric = code >= 0 or _numeric_ref(ref)
        if not numeric and _ALL_DIGITS.fullmatch(ref[1:]):
            raise _Bad(_key_path(where(), "value"), f"numeric ref {ref!r} has leading zeros")
        number = int(ref[1:]) if numeric else -1
        if "number" in obj:
            n = _int(obj["number"], _key_path(where(), "number"), "a value number", 0)
            if numeric and n != number:
                raise _Bad(_key_path(where(), "number"), f"number {n} disagrees with ref {ref!r}")
            number = n
        k = len(defs.code)
        if number >= _BIG:
            defs.big[k] = number
            number = _BIG
        if "name" in obj:
            name = _str(obj["name"], _key_path(where(), "name"), "a name")
            if not numeric and name != ref[1:]:
                raise _Bad(_key_path(where(), "name"), f"name {name!r} disagrees with ref {ref!r}")
            if numeric:
                defs.names[k] = name
        tid = -1
        if "type" in obj:
            tid = self._type(obj["type"], where)
        if "description" in obj:
            defs.descriptions[k] = _str(obj["description"], _key_path(where(), "description"), "a description")
        defs.code.append(code)
        defs.number.append(number)
        defs.type.append(tid)

    def _type(self, t: Any, where: Callable[[], str]) -> int:
        """The id of a value type (decoded once per distinct spelling)."""
        key = None
        if type(t) is dict and len(t) == 2:
            dt, shape = t.get("dtype"), t.get("shape")
            if type(dt) is str and type(shape) is list and all(type(d) is int or d is None for d in shape):
                key = (dt, *shape)
                hit = self.type_keys.get(key)
                if hit is not None:
                    return hit
        vt = _decode_type(t, _key_path(where(), "type"))
        tid = self.type_ids.get(vt)
        if tid is None:
            tid = self.type_ids[vt] = len(self.types)
            self.types.append(vt)
        if key is not None:
            self.type_keys[key] = tid
        return tid

    def _op(self, i: int, op: Any) -> None:
        if not self.wanted(_C_OP_DEFS):
            return
        try:
            if type(op) is not dict:
                _obj(op, f"ops[{i}]", "an op")
            if not op.keys() <= _OP_KEYSET:
                _check_keys(op, _OP_KEYS, f"ops[{i}]")
            outs = op.get("outputs", [])
            if type(outs) is not list:
                _arr(outs, f"ops[{i}].outputs", "the op's outputs")
            defs = self.defs["ops"]
            for j, d in enumerate(outs):
                self._def(defs, d, lambda j=j: f"ops[{i}].outputs[{j}]")
        except _Bad as exc:
            self.keep((_C_OP_DEFS, i), exc)
            return
        self.n_ops += 1
        self.op_ndef.append(len(outs))
        index = op.get("index", _NONE)
        if index is not _NONE and self.wanted(_C_OP_INDEX):
            try:
                index = _int(index, f"ops[{i}].index", "an op index", 0)
            except _Bad as exc:
                self.keep((_C_OP_INDEX, i), exc)
        if type(index) is not int:
            index = _NONE
        elif index >= _BIG:
            self.big_index[i] = index
            index = _BIG
        self.op_index.append(index)
        if self.wanted(_C_OPS):
            self._op_checks(i, op, outs)

    def _op_checks(self, i: int, op: dict[str, Any], outs: list[Any]) -> None:
        """The checks of one op that need no other part of the document (kind, inputs, attrs, ...)."""
        path = ""
        rank, j = _R_KIND, 0
        kind, version, aid, n_in = -1, _NONE, -1, 0
        try:
            kind_name = op.get("op")
            opdef = self.opdefs.get(kind_name) if type(kind_name) is str else None
            if opdef is None:
                path = f"ops[{i}]"
                if "op" not in op:
                    raise _Bad(path, "missing key 'op' (the op kind's name)")
                kind_name = _str(op["op"], f"{path}.op", "an op kind name")
                try:
                    opdef = self.opdefs[kind_name] = get_op(kind_name)
                except KeyError:
                    raise _Bad(f"{path}.op", unknown_op_message(kind_name)) from None
            kind = opdef.id
            if "id" in op:
                rank = _R_ID
                kid = op["id"]
                if type(kid) is not int or kid != kind:
                    path = f"ops[{i}]"
                    kid = _int(kid, f"{path}.id", "an op kind id")
                    raise _Bad(f"{path}.id", f"kind id {kid} disagrees with op {kind_name!r} (id {opdef.id})")
            rank = _R_INPUTS
            ins = op.get("inputs", _NO_REFS)
            if type(ins) is not list:
                j = -1
                _arr(ins, f"ops[{i}].inputs", "the op's inputs")
            codes, names = self.in_codes, self.names
            for j, ref in enumerate(ins):
                if type(ref) is not str:
                    raise _Bad(f"ops[{i}].inputs[{j}]",
                               f"expected a value ref (a string like \"%x\"), got {_short(ref)}")
                codes.append(_ref_code(ref, names))
                n_in += 1
            rank, j = _R_ATTRS, 0
            aid = self._attrs(op.get("attrs", _EMPTY), opdef, i)
            rank = _R_VERSION
            if "version" in op:
                v = op["version"]
                if type(v) is not int or not _INT32[0] <= v <= _INT32[1]:
                    _int(v, f"ops[{i}].version", "a version", *_INT32)
                version = v
            rank = _R_NAME
            if "name" in op:
                self.op_names[i] = _str(op["name"], f"ops[{i}].name", "a name")
            rank = _R_DESCRIPTION
            if "description" in op:
                self.op_descriptions[i] = _str(op["description"], f"ops[{i}].description", "a description")
        except _Bad as exc:
            self.keep((_C_OPS, i, rank, j), exc)
        self.op_kind.append(kind)
        self.op_version.append(version)
        self.op_attr.append(aid)
        self.op_nin.append(n_in)
        self.checked_ops += 1

    def _attrs(self, obj: Any, opdef: OpDef, i: int) -> int:
        """The attribute-table id of an op's attributes (checked once per distinct spelling and kind)."""
        try:
            key = (opdef.id, _spelling(obj))
        except TypeError:  # not JSON data (from_json_dict): check it every time
            key = None
        if key is not None:
            hit = self.attr_keys.get(key)
            if hit is not None:
                return hit
        attrs = _read_attrs(obj, opdef, f"ops[{i}].attrs")
        deferred = any(_has_ref(v) for _, v in attrs)
        ek = exact_key(_swap_refs(attrs, _ref_key) if deferred else attrs)
        aid = self.attr_ids.get(ek)
        if aid is None:
            aid = self.attr_ids[ek] = len(self.attrs)
            self.attrs.append(attrs)
            if deferred:
                self.deferred[aid] = (opdef, i, isinstance(obj, dict) and set(obj) == set(opdef.attrs))
        if key is not None:
            self.attr_keys[key] = aid
        return aid

    # -------------------------------------------------------------- the graph
    def graph(self, source: str, verify: bool) -> Graph:
        """Check what needs the whole document, then build (and verify) the Graph."""
        doc = _obj(self.top, "", "an opgraph document")
        _check_keys(doc, _TOP_KEYS, "")
        if doc.get("format") != FORMAT:
            raise _Bad("format", f"not an opgraph JSON graph: \"format\" is {_short(doc.get('format'))}, "
                                 f"expected \"{FORMAT}\"")
        version = doc.get("version")
        if type(version) is not int or version not in (VERSION_PLAIN, VERSION):
            raise _Bad("version", f"unsupported version {_short(version)}; this opgraph reads versions "
                                  f"{VERSION_PLAIN} to {VERSION}")
        if "subgraphs" in doc:
            if version < 2:
                raise _Bad("subgraphs", "subgraph records need version 2")
            self.bodies = _read_bodies(doc["subgraphs"], source, verify)
        if self.problem is not None and self.problem[0][0] <= _C_OP_DEFS:
            raise self.problem[1]
        constants = self.constants

        # Value definitions: inputs first, then op outputs in file order.
        di, do = self.defs["inputs"], self.defs["ops"]
        n_inputs = len(di.code)
        code = np.concatenate([np.frombuffer(di.code, np.int64), np.frombuffer(do.code, np.int64)])
        explicit = np.concatenate([np.frombuffer(di.number, np.int64), np.frombuffer(do.number, np.int64)])
        def_type = np.concatenate([np.frombuffer(di.type, np.int32), np.frombuffer(do.type, np.int32)])
        def_ptr = np.zeros(self.n_ops + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(self.op_ndef, np.int32), out=def_ptr[1:])

        def def_path(k: int) -> str:
            if k < n_inputs:
                return f"inputs[{k}]"
            i = int(np.searchsorted(def_ptr, k - n_inputs, side="right")) - 1
            return f"ops[{i}].outputs[{k - n_inputs - int(def_ptr[i])}]"

        big = {**di.big, **{n_inputs + k: v for k, v in do.big.items()}}
        numbers = _assign_numbers(explicit, def_path, "value", big)
        n_vals = len(numbers)
        named = np.flatnonzero(code < 0)
        name_ids = -1 - code[named]
        uniq, first = np.unique(name_ids, return_index=True)
        if len(uniq) != len(name_ids):
            again = np.ones(len(name_ids), dtype=bool)
            again[first] = False
            k = int(np.flatnonzero(again)[0])
            earlier = int(named[first[np.searchsorted(uniq, name_ids[k])]])
            raise _Bad(_key_path(def_path(int(named[k])), "value"),
                       f"ref {self._ref(int(code[named[k]]))!r} is defined twice (first at {def_path(earlier)})")
        name_number = np.full(len(self.names), -1, dtype=np.int64)
        name_number[uniq] = numbers[named[first]]
        missing = np.flatnonzero(def_type[:n_inputs] < 0)
        if len(missing):
            raise _Bad(def_path(int(missing[0])), "an input needs a 'type'")

        # Op numbers.
        if self.problem is not None and self.problem[0][0] <= _C_OP_INDEX:
            raise self.problem[1]
        index = np.frombuffer(self.op_index, np.int64)
        op_number = _assign_numbers(np.where(index == _NONE, -1, index), lambda i: f"ops[{i}].index", "op",
                                    self.big_index) if (index != _NONE).any() else np.arange(self.n_ops, dtype=np.int64)

        # The ops' own checks, input refs and inferred types: the first problem in file order.
        value_type = np.full(n_vals, -1, dtype=np.int32)
        value_type[numbers] = def_type
        self._resolve_bodies()
        ins = self._resolve_inputs(n_vals, name_number)
        self._infer_all(n_vals, n_inputs, numbers, def_ptr, value_type, ins)
        if self.problem is not None:
            raise self.problem[1]

        # Outputs and updates.
        def resolve(ref: Any, path: str) -> int:
            if not isinstance(ref, str):
                raise _Bad(path, f"expected a value ref (a string like \"%x\"), got {_short(ref)}")
            v = self._number(ref, n_vals, name_number)
            if v < 0:
                raise _Bad(path, f"unknown value ref {ref!r}")
            return v

        outputs = [resolve(r, f"outputs[{i}]") for i, r in enumerate(_arr(doc.get("outputs", []), "outputs",
                                                                           "the outputs"))]
        updates = [[resolve(s, f"updates[{i}][0]"), resolve(d, f"updates[{i}][1]")]
                   for i, (s, d) in enumerate(_pairs(doc.get("updates", []), "updates", 2, "the updates"))]

        # Symbols.
        descriptions = self.descriptions
        # (in the order of the definitions, as a loop over them gives)
        ref_of = {c: r for r, c in self.names.items()}
        given_names = {k: ref_of[c][1:] for k, c in zip(named.tolist(), code[named].tolist(), strict=True)}
        given_names.update({k: name for k, name in di.names.items()})
        given_names.update({n_inputs + k: name for k, name in do.names.items()})
        value_names = {int(numbers[k]): given_names[k] for k in sorted(given_names)}
        op_names = {int(op_number[i]): name for i, name in self.op_names.items()}
        for i, text in self.op_descriptions.items():
            descriptions[("op", int(op_number[i]))] = text
        for base, defs in ((0, di), (n_inputs, do)):
            for k, text in defs.descriptions.items():
                descriptions[("value", int(numbers[base + k]))] = text
        const_names = self.const_names
        io_names: dict[int, str] = {}
        if "symbols" in doc:
            sym = _obj(doc["symbols"], "symbols", "the symbols")
            _check_keys(sym, _SYMBOL_KEYS, "symbols")
            for key, table in (("values", value_names), ("ops", op_names), ("constants", const_names),
                               ("io", io_names)):
                for i, (k, name) in enumerate(_pairs(sym.get(key, []), f"symbols.{key}", 2, "[index, name] pairs")):
                    k = _int(k, f"symbols.{key}[{i}][0]", "an index")
                    if k in table:
                        raise _Bad(f"symbols.{key}[{i}]", f"{key} {k} is named twice")
                    table[k] = _str(name, f"symbols.{key}[{i}][1]", "a name")
            for i, (kind, k, text) in enumerate(_pairs(sym.get("descriptions", []), "symbols.descriptions", 3,
                                                       "[kind, index, text] triples")):
                key = (_str(kind, f"symbols.descriptions[{i}][0]", "a kind"),
                       _int(k, f"symbols.descriptions[{i}][1]", "an index"))
                if key in descriptions:
                    raise _Bad(f"symbols.descriptions[{i}]", f"{key} is described twice")
                descriptions[key] = _str(text, f"symbols.descriptions[{i}][2]", "a description")
        file_meta: dict[str, Any] = {}
        if "file_meta" in doc:
            for key, value in _obj(doc["file_meta"], "file_meta", "the file metadata").items():
                file_meta[key] = _dec(value, _key_path("file_meta", key))

        # Columnar arrays, with the tables in the order of first use (by value, by op).
        untyped = np.flatnonzero(value_type < 0)
        if len(untyped):
            raise _Bad(def_path(int(np.flatnonzero(numbers == untyped[0])[0])), "missing 'type'")
        types, value_type = _first_use(value_type, self.types)
        position = np.argsort(op_number) if self.n_ops else np.zeros(0, np.int64)  # file position of op k
        kinds = np.frombuffer(self.op_kind, np.int32)[position]
        versions = np.frombuffer(self.op_version, np.int64)[position]
        attrs_table, op_attr = _first_use(np.frombuffer(self.op_attr, np.int32)[position], self.attrs)
        n_in = np.frombuffer(self.op_nin, np.int32)
        in_ptr, in_ids = _permute_csr(n_in, ins, position)
        ndef = np.frombuffer(self.op_ndef, np.int32)
        out_ptr, out_ids = _permute_csr(ndef, numbers[n_inputs:], position)
        value_producer = np.full(n_vals, -1, dtype=np.int32)
        value_index = np.zeros(n_vals, dtype=np.int32)
        n_out = np.diff(out_ptr)
        value_producer[out_ids] = np.repeat(np.arange(self.n_ops, dtype=np.int32), n_out)
        value_index[out_ids] = np.arange(len(out_ids)) - np.repeat(out_ptr[:-1], n_out)
        graph = Graph(
            op_kind=kinds, op_attr=op_attr, op_version=versions, in_ptr=in_ptr, in_ids=in_ids,
            out_ptr=out_ptr, out_ids=out_ids, value_type=value_type, value_producer=value_producer,
            value_index=value_index, types=types, attrs=attrs_table, constants=constants,
            inputs=numbers[:n_inputs], outputs=outputs, updates=updates,
            symbols=Symbols(value_names, op_names, const_names, descriptions, io_names),
            file_meta=file_meta,
        )
        # Only the graph and what names a problem's place stay for verification.
        del kinds, versions, op_attr, in_ids, out_ids, value_producer, value_index, value_type, ins, n_in, ndef
        del code, explicit, def_type, named, name_ids, index, op_number, n_out, untyped
        self.__init__()  # type: ignore[misc]  # the arrays read from the document
        if verify:
            try:
                graph.verify()
            except VerifyError as exc:
                raise FormatError(f"{source}: {_verify_path(exc, position, numbers, def_path)}: graph fails "
                                  f"verification: {exc}") from exc
            except Exception as exc:
                raise FormatError(f"{source}: (top level): graph fails verification: "
                                  f"{type(exc).__name__}: {exc}") from exc
        return graph

    def _resolve_bodies(self) -> None:
        """Put the subgraphs in the attributes that refer to them, check those, and intern them again."""
        if not self.deferred:
            return
        n = len(self.bodies)
        for aid, (opdef, i, full) in self.deferred.items():
            path = f"ops[{i}].attrs"

            def body(ref: _BodyRef, where: str) -> Subgraph:
                if ref.index >= n:
                    if self.in_body:
                        raise _Bad(where, f"subgraph {ref.index} is not a record before this one (a record "
                                          f"refers only to records before it)")
                    raise _Bad(where, f"subgraph {ref.index} is not in 'subgraphs' ({n} record(s))")
                return self.bodies[ref.index]

            try:
                attrs = tuple((k, _swap_refs(v, lambda r, k=k: body(r, _key_path(path, k))))
                              for k, v in self.attrs[aid])
                self.attrs[aid] = _check_attrs(attrs, opdef, path, full)
            except _Bad as exc:
                self.keep((_C_OPS, i, _R_ATTRS, 0), exc)
        # Records with equal bodies (a hand-written file) make equal entries: one id each again.
        ids: dict[Any, int] = {}
        table: list[tuple[tuple[str, Any], ...]] = []
        lut = np.empty(len(self.attrs), dtype=np.int32)
        for aid, attrs in enumerate(self.attrs):
            try:
                key = exact_key(attrs)
            except TypeError:  # unresolved (a problem is kept): stays apart
                key = ("unresolved", aid)
            lut[aid] = ids.setdefault(key, len(table))
            if lut[aid] == len(table):
                table.append(attrs)
        if len(table) != len(self.attrs):
            self.attrs = table
            self.op_attr = array("i", lut[np.frombuffer(self.op_attr, np.int32)].tobytes())
        self.deferred = {}

    def _ref(self, code: int) -> str:
        if code >= 0:
            return f"%{code}"
        return next(r for r, c in self.names.items() if c == code)

    def _number(self, ref: str, n_vals: int, name_number: np.ndarray) -> int:
        """The value number of a ref, -1 if it names no value."""
        if _numeric_ref(ref):
            v = int(ref[1:])
            return v if v < n_vals else -1
        code = self.names.get(ref)
        return -1 if code is None else int(name_number[-1 - code])

    def _resolve_inputs(self, n_vals: int, name_number: np.ndarray) -> np.ndarray:
        """The input refs of the checked ops as value numbers; keeps the first unknown ref as a problem."""
        codes = np.frombuffer(self.in_codes, np.int64)
        if not len(codes) or (int(codes.min()) >= 0 and int(codes.max()) < n_vals):
            return codes  # numbers only, all in range
        ins = np.where(codes >= 0, codes, name_number[np.clip(-1 - codes, 0, len(name_number) - 1)]
                       if len(name_number) else -1)
        bad = np.flatnonzero((ins < 0) | (ins >= n_vals))
        if len(bad):
            k = int(bad[0])
            ptr = np.zeros(len(self.op_nin) + 1, dtype=np.int64)
            np.cumsum(np.frombuffer(self.op_nin, np.int32), out=ptr[1:])
            i = int(np.searchsorted(ptr, k, side="right")) - 1
            j = k - int(ptr[i])
            self.keep((_C_OPS, i, _R_INPUTS, j), _Bad(f"ops[{i}].inputs[{j}]",
                                                      f"unknown value ref {self._ref(int(codes[k]))!r}"))
        return ins

    def _infer_all(self, n_vals: int, n_inputs: int, numbers: np.ndarray, def_ptr: np.ndarray,
                   value_type: np.ndarray, ins: np.ndarray) -> None:
        """Types and versions a hand-written file leaves out, from the type rules, in file order."""
        checked = self.checked_ops
        version = np.frombuffer(self.op_version, np.int64)
        def_type = np.frombuffer(self.defs["ops"].type, np.int32)
        lacks = np.zeros(checked, dtype=bool)
        lacks |= version[:checked] == _NONE
        untyped = np.flatnonzero(def_type < 0)
        if len(untyped):
            at = np.unique(np.searchsorted(def_ptr, untyped, side="right") - 1)
            lacks[at[at < checked]] = True
        todo = np.flatnonzero(lacks)
        if not len(todo):
            return
        in_ptr = np.zeros(checked + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(self.op_nin, np.int32), out=in_ptr[1:])
        kinds, attr_ids = self.op_kind, self.op_attr
        for i in todo.tolist():
            if self.problem is not None and (_C_OPS, i, _R_INFER) > self.problem[0]:
                return  # an earlier problem is reported
            opdef = get_op(kinds[i])
            outs = numbers[n_inputs + def_ptr[i]:n_inputs + def_ptr[i + 1]]
            try:
                out_types, v = _infer(opdef, self.attrs[attr_ids[i]], ins[in_ptr[i]:in_ptr[i + 1]].tolist(),
                                      value_type, self.types, self.constants, f"ops[{i}]", self._ref, self.in_codes,
                                      int(in_ptr[i]))
                if version[i] == _NONE:
                    self.op_version[i] = v
                missing = [j for j in range(len(outs)) if def_type[def_ptr[i] + j] < 0]
                if missing:
                    if len(out_types) != len(outs):
                        raise _Bad(f"ops[{i}].outputs", f"{opdef.name} gives {len(out_types)} output(s), "
                                                        f"the file lists {len(outs)}")
                    for j in missing:
                        value_type[outs[j]] = self._type_id(out_types[j])
            except _Bad as exc:
                self.keep((_C_OPS, i, _R_INFER), exc)
                return

    def _type_id(self, t: ValueType) -> int:
        tid = self.type_ids.get(t)
        if tid is None:
            tid = self.type_ids[t] = len(self.types)
            self.types.append(t)
        return tid


class _Defs:
    """Value definitions in compact arrays: ref code, explicit number (-1: none), type id (-1: none)."""

    __slots__ = ("big", "code", "descriptions", "names", "number", "type")

    def __init__(self) -> None:
        self.big: dict[int, int] = {}  # numbers from _BIG on, by definition
        self.code = array("q")
        self.number = array("q")
        self.type = array("i")
        self.names: dict[int, str] = {}  # explicit names (of "%<number>" values), by definition
        self.descriptions: dict[int, str] = {}


def _ref_key(ref: _BodyRef) -> str:
    return f"\0subgraph {ref.index}"  # no attribute value is spelled so (interning before bodies are known)


def _read_bodies(raw: Any, source: str, verify: bool) -> list[Subgraph]:
    """The records of ``subgraphs``, in order; each may refer only to the records before it."""
    records = _arr(raw, "subgraphs", "the subgraph records")
    bodies: list[Subgraph] = []
    for k, rec in enumerate(records):
        path = f"subgraphs[{k}]"
        rec = _obj(rec, path, "a subgraph record (a graph with a 'name')")
        _check_keys(rec, _BODY_KEYS, path)
        name = _str(rec.get("name", ""), f"{path}.name", "a name")
        sub = _Doc()
        sub.bodies, sub.in_body = list(bodies), True
        sub.feed({"format": FORMAT, "version": VERSION, **{key: v for key, v in rec.items() if key != "name"}})
        try:
            graph = sub.graph(f"{source}: {path}", verify)
        except _Bad as exc:
            inner = exc.path
            raise _Bad(f"{path}{inner if inner.startswith('[') else '.' + inner}" if inner else path,
                       exc.message) from None
        bodies.append(Subgraph(graph, name=name))
    return bodies


_STREAMED_MARK = object()
"""Stands for an array of inputs, constants or ops that was read element by element."""
_EMPTY: dict[str, Any] = {}
_NO_REFS: list[Any] = []


def _spelling(x: Any) -> Any:
    """A hashable key that tells apart every JSON value (``1``, ``1.0``, ``true``; key order)."""
    t = type(x)
    if t is dict:
        return (dict, *[(k, _spelling(v)) for k, v in x.items()])
    if t is list:
        return (list, *[_spelling(v) for v in x])
    if t is float:
        return (float, x.hex())
    hash(x)
    return (t, x)


def _first_use(ids: np.ndarray, table: list[Any]) -> tuple[list[Any], np.ndarray]:
    """Renumber table ids in the order of their first use (the order a loop interning them gives)."""
    if not len(ids):
        return [], ids.astype(np.int32)
    uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    return [table[int(t)] for t in uniq[order]], rank[inverse]


def _permute_csr(counts: np.ndarray, ids: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR rows given in file order, reordered so that row k is the one at file position ``position[k]``."""
    ptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    if len(position) and not np.array_equal(position, np.arange(len(position))):
        out_counts = counts[position]
        ids = ids[_ranges(ptr[:-1][position], ptr[:-1][position] + out_counts)]
        np.cumsum(out_counts, out=ptr[1:])
    return ptr, ids


def from_json_dict(obj: Any, *, source: str = "<json>", verify: bool = True) -> Graph:
    """Build the :class:`Graph` a JSON document describes (inverse of :func:`to_json_dict`).

    Raises :class:`~opgraph.errors.FormatError` naming ``source`` and the JSON
    path of the first problem; the graph is verified unless ``verify=False``.

    >>> g = from_json_dict({"format": "opgraph", "version": 1,
    ...     "inputs": [{"value": "%x", "type": {"dtype": "float64", "shape": [2]}}],
    ...     "ops": [{"op": "exp", "inputs": ["%x"], "outputs": [{"value": "%y"}]}],
    ...     "outputs": ["%y"]})
    >>> print(g)
    graph(%x: f64[2]) {
      %y: f64[2] = exp(%x)
      return %y
    }
    >>> from_json_dict({"format": "opgraph", "version": 1, "ops": [{"op": "exp", "inputs": ["%q"]}]})
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: <json>: ops[0].inputs[0]: unknown value ref '%q'
    """
    doc = _Doc()
    doc.feed(obj)
    try:
        return doc.graph(source, verify)
    except _Bad as exc:
        raise FormatError(f"{source}: {_where(exc.path)}: {exc.message}") from None


def _verify_path(exc: VerifyError, position: np.ndarray, numbers: np.ndarray, def_path: Callable[[int], str]) -> str:
    """The JSON path of the first op (in file order) or value that verification problems name."""
    ops = [int(m.group(1)) for p in exc.problems if (m := re.match(r"op (\d+)", p))]
    ops = [int(position[op]) for op in ops if op < len(position)]
    if ops:
        return f"ops[{min(ops)}]"
    for p in exc.problems:
        m = re.match(r"value (\d+)", p)
        if m:
            hit = np.flatnonzero(numbers == int(m.group(1)))
            if len(hit):
                return def_path(int(hit[0]))
    return "(top level)"


def _read_attrs(obj: Any, opdef: OpDef, path: str) -> tuple[tuple[str, Any], ...]:
    """An op's attributes; those that refer to subgraph records are checked later (:meth:`_Doc._resolve_bodies`)."""
    obj = _obj(obj, path, "the op's attributes")
    if not obj and not opdef.attrs:
        return ()
    decoded = tuple((k, _dec(v, _key_path(path, k), True)) for k, v in obj.items())
    if any(_has_ref(v) for _, v in decoded):
        for k, _ in decoded:
            if k not in opdef.attrs:
                raise _Bad(_key_path(path, k), f"{opdef.name} has no attribute {k!r} "
                                               f"(it takes {', '.join(opdef.attrs) or 'none'})")
        return decoded
    return _check_attrs(decoded, opdef, path, set(obj) == set(opdef.attrs))


def _check_attrs(decoded: tuple[tuple[str, Any], ...], opdef: OpDef, path: str,
                 full: bool) -> tuple[tuple[str, Any], ...]:
    for k, v in decoded:
        spec = opdef.attrs.get(k)
        if spec is None:
            raise _Bad(_key_path(path, k), f"{opdef.name} has no attribute {k!r} "
                                           f"(it takes {', '.join(opdef.attrs) or 'none'})")
        try:
            spec.normalise(v)
        except Exception as exc:
            raise _Bad(_key_path(path, k), f"{opdef.name}: invalid value {v!r}: {exc}") from None
    try:
        normalised = opdef.normalise_attrs(dict(decoded))
    except Exception as exc:
        raise _Bad(path, f"{opdef.name}: {exc}") from None
    # Kept exactly as written when every attribute is given (the writer's case);
    # attributes left out (hand-written files) take their defaults.
    return decoded if full else normalised


def _infer(opdef: OpDef, attrs: tuple[tuple[str, Any], ...], ins: list[int], value_type: np.ndarray,
           types: list[ValueType], constants: list[np.ndarray], path: str, ref: Callable[[int], str],
           codes: Any, first: int) -> tuple[tuple[ValueType, ...], int]:
    attr_dict = dict(attrs)
    if opdef is CONST:
        idx = attr_dict.get("index")
        if not (type(idx) is int and 0 <= idx < len(constants)):
            raise _Bad(f"{path}.attrs.index", f"constant index {idx!r} is not in the constants table")
        return (TensorType.of(constants[idx]),), 0
    in_types = []
    for j, v in enumerate(ins):
        t = int(value_type[v])
        if t < 0:
            raise _Bad(f"{path}.inputs[{j}]", f"the type of {ref(codes[first + j])} is not known here; give the "
                                              f"op's output types and version, or list the ops in topological order")
        in_types.append(types[t])
    try:
        opdef.check_arity(len(in_types))
        out = tuple(opdef.infer(tuple(in_types), attr_dict))
        version = int(opdef.version(tuple(in_types), attr_dict))
    except Exception as exc:
        raise _Bad(path, f"{opdef.name}: type rule rejects inputs {tuple(in_types)}: {exc}") from None
    return out, version


def loads_json(text: str | bytes, *, source: str = "<string>", verify: bool = True) -> Graph:
    """Parse JSON text (as written by :func:`dumps_json`) into a verified Graph.

    Bytes are decoded a window at a time and the big arrays are read element by
    element, so memory stays a small multiple of the graph, not of the text.

    >>> loads_json('{"format": "opgraph", "version": 3}')
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: <string>: version: unsupported version 3; this opgraph reads versions 1 to 2
    >>> loads_json('{"format": ')
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: <string>: malformed JSON at line 1 column 12: Expecting value
    """
    return _load(text, source, verify)


def _load(source_data: str | bytes | BinaryIO, source: str, verify: bool) -> Graph:
    doc = _Doc()
    text = _Text(source_data, _SCANNER)
    with paused_gc(), progress.task(f"loading {source}: parsing JSON (bytes)",
                                    total=progress.byte_size(source_data)) as text.tick:
        try:
            try:
                _stream_document(text, doc)
            except (_Malformed, _Bad, RecursionError, ValueError):
                text.check_rest()  # text that is not UTF-8 is reported first, wherever it is
                raise
        except _NotUtf8 as exc:
            raise FormatError(f"{source}: not UTF-8 text (byte {exc.byte})") from None
        except _Malformed as exc:
            raise FormatError(f"{source}: {exc}") from None
        except _Bad as exc:
            raise FormatError(f"{source}: {exc.message}") from None
        except RecursionError:
            raise FormatError(f"{source}: malformed JSON: nested too deeply") from None
        except ValueError as exc:  # e.g. an integer with too many digits
            raise FormatError(f"{source}: malformed JSON: {exc}") from None
        try:
            with progress.task(f"loading {source}: building the graph"):
                return doc.graph(source, verify)
        except _Bad as exc:
            raise FormatError(f"{source}: {_where(exc.path)}: {exc.message}") from None


def _reject_constant(name: str) -> Any:
    raise _Bad("", f"malformed JSON: {name} is not JSON (write 'nan'/'inf' in constant data, "
                   f"{{\"float\": \"nan\"}} in attributes)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Bad("", f"malformed JSON: duplicate key {k!r} in an object")
            seen.add(k)
    return out


_SCANNER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_no_duplicates).scan_once


def load_json(path: str | os.PathLike[str], *, verify: bool = True) -> Graph:
    """Read a graph written by :func:`save_json`; never executes code.

    The file is read a window at a time. Raises
    :class:`~opgraph.errors.FormatError` naming the file and the JSON path of
    the problem (``OSError`` when the file cannot be read).

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "bad.json")
    >>> _ = open(p, "w").write('{"format": "opgraph", "version": 1, "ops": [{"op": "frobnicate"}]}')
    >>> load_json(p)
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: .../bad.json: ops[0].op: unknown op kind 'frobnicate': it is not a built-in op; ...
    """
    with open(path, "rb") as f:
        return _load(f, os.fspath(path), verify)


__all__ = [
    "DEFAULT_INLINE_LIMIT", "FORMAT", "VERSION", "VERSION_PLAIN", "decode_value", "dumps_json",
    "encode_array", "encode_value", "from_json_dict", "load_json", "loads_json", "save_json", "to_json_dict",
]
