"""The JSON form of a graph: readable, versioned and exact.

Seed 003 asks for a text form "similar to an MLIR dialect, but as JSON".
A file is one JSON object (version 1); the writer puts one record per line:

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

* ``"format": "opgraph"``, ``"version": 1``; a reader refuses other values.
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
constant}`` and ``{"numpy": constant}`` for a NumPy scalar.

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
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import gc
import itertools
import json
import math
import os
import re
import struct
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.core.builder import exact_key
from opgraph.core.dtypes import as_dtype
from opgraph.core.graph import Graph, Symbols
from opgraph.core.registry import CONST, OpDef, get_op
from opgraph.core.types import VOID, TensorType, ValueType, VoidType
from opgraph.errors import FormatError, VerifyError
from opgraph.io._atomic import atomic_files

FORMAT = "opgraph"
"""Value of the top-level ``"format"`` key."""
VERSION = 1
"""The format version this module writes and reads."""
DEFAULT_INLINE_LIMIT = 256
"""Constants with more elements than this are written as base64."""

_NUMERIC_REF = re.compile(r"%(0|[1-9][0-9]*)")
_ALL_DIGITS = re.compile(r"[0-9]+")
_CANONICAL_NAN_BITS = 0x7FF8000000000000
_MAX_DIM = 2**62
_INT32 = (-(2**31), 2**31 - 1)

_TOP_KEYS = ("format", "version", "inputs", "constants", "ops", "outputs", "updates", "symbols", "file_meta")
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


def _enc(v: Any, limit: int) -> Any:
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
        return [_enc(x, limit) for x in v]
    if isinstance(v, list):
        return {"list": [_enc(x, limit) for x in v]}
    if isinstance(v, dict):
        if all(type(k) is str for k in v):
            return {"dict": {k: _enc(x, limit) for k, x in v.items()}}
        return {"dict": [[_enc(k, limit), _enc(x, limit)] for k, x in v.items()]}
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": base64.b64encode(bytes(v)).decode("ascii")}
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


def _dec(obj: Any, path: str) -> Any:
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise _Bad(path, "number out of range (write non-finite floats as {\"float\": ...})")
        return obj
    if isinstance(obj, list):
        return tuple(_dec(x, f"{path}[{i}]") for i, x in enumerate(obj))
    if isinstance(obj, dict):
        if len(obj) != 1:
            raise _Bad(path, f"a tagged value must have exactly one key, got {sorted(obj)}")
        ((tag, body),) = obj.items()
        sub = _key_path(path, tag)
        if tag == "float":
            return _decode_float_tag(body, sub)
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
        raise _Bad(path, f"unknown tag {tag!r} (expected float, complex, list, dict, bytes, ndarray or numpy)")
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
                attrs = attrs_json[aid] = {k: _enc(v, inline_limit) for k, v in pairs}
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
        "version": VERSION,
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
    meta = {}
    for key, value in graph.file_meta.items():
        if type(key) is str:
            try:
                meta[key] = _enc(value, inline_limit)
            except _Unencodable:
                continue  # not JSON-able: format details of another format
    if meta:
        doc["file_meta"] = meta
    return doc


def _compact(obj: Any, ascii_only: bool) -> str:
    return json.dumps(obj, ensure_ascii=ascii_only, allow_nan=False, separators=(", ", ": "))


def _layout(doc: Mapping[str, Any], ascii_only: bool) -> str:
    lines = ["{"]
    items = list(doc.items())
    for k, (key, val) in enumerate(items):
        comma = "," if k < len(items) - 1 else ""
        head = f"  {json.dumps(key)}: "
        if isinstance(val, (list, dict)) and val and key not in ("outputs", "updates"):
            opening, closing = ("[", "]") if isinstance(val, list) else ("{", "}")
            rows = ([_compact(x, ascii_only) for x in val] if isinstance(val, list)
                    else [f"{json.dumps(kk, ensure_ascii=ascii_only)}: {_compact(x, ascii_only)}"
                          for kk, x in val.items()])
            lines.append(head + opening)
            lines.extend(f"    {row}," for row in rows[:-1])
            lines.append(f"    {rows[-1]}")
            lines.append(f"  {closing}{comma}")
        else:
            lines.append(head + _compact(val, ascii_only) + comma)
    lines.append("}")
    return "\n".join(lines)


def dumps_json(graph: Graph, *, inline_limit: int = DEFAULT_INLINE_LIMIT) -> str:
    """The JSON text of ``graph``: one op, input or constant per line.

    >>> import opgraph
    >>> g = opgraph.GraphBuilder().freeze()
    >>> loads_json(dumps_json(g)) == g
    True
    """
    return _layout(to_json_dict(graph, inline_limit=inline_limit), ascii_only=False)


def save_json(graph: Graph, path: str | os.PathLike[str], *, inline_limit: int = DEFAULT_INLINE_LIMIT) -> None:
    """Write ``graph`` to ``path`` as UTF-8 JSON, atomically.

    Constants with more than ``inline_limit`` elements are stored as base64.

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
    with _gc_paused():
        doc = to_json_dict(graph, inline_limit=inline_limit)
        try:
            data = _layout(doc, ascii_only=False).encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates in a name: escape everything
            data = _layout(doc, ascii_only=True).encode("ascii")
    with atomic_files([path]) as (f,):
        f.write(data + b"\n")


# ----------------------------------------------------------------------------- reading
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


class _Def:
    __slots__ = ("desc", "name", "number", "path", "ref", "type")

    def __init__(self, obj: Any, path: str) -> None:
        obj = _obj(obj, path, "a value definition")
        _check_keys(obj, _DEF_KEYS, path)
        self.path = path
        if "value" not in obj:
            raise _Bad(path, "missing key 'value' (the value's ref, like \"%x\" or \"%3\")")
        ref = _str(obj["value"], _key_path(path, "value"), "a value ref")
        if not ref.startswith("%") or len(ref) < 2:
            raise _Bad(_key_path(path, "value"), f"a value ref starts with '%', got {ref!r}")
        self.ref = ref
        self.number: int | None = None
        m = _NUMERIC_REF.fullmatch(ref)
        if m:
            self.number = int(m.group(1))
        elif _ALL_DIGITS.fullmatch(ref[1:]):
            raise _Bad(_key_path(path, "value"), f"numeric ref {ref!r} has leading zeros")
        if "number" in obj:
            n = _int(obj["number"], _key_path(path, "number"), "a value number", 0)
            if self.number is not None and n != self.number:
                raise _Bad(_key_path(path, "number"), f"number {n} disagrees with ref {ref!r}")
            self.number = n
        self.name: str | None = None
        if "name" in obj:
            self.name = _str(obj["name"], _key_path(path, "name"), "a name")
            if not m and self.name != ref[1:]:
                raise _Bad(_key_path(path, "name"), f"name {self.name!r} disagrees with ref {ref!r}")
        elif not m:
            self.name = ref[1:]
        self.type: ValueType | None = None
        if "type" in obj:
            self.type = _decode_type(obj["type"], _key_path(path, "type"))
        self.desc = _str(obj["description"], _key_path(path, "description"), "a description") \
            if "description" in obj else None


def _assign_numbers(explicit: list[int | None], paths: list[str], what: str) -> list[int]:
    """Explicit numbers must be distinct and in range; the others take the free ones in order."""
    n = len(explicit)
    seen: dict[int, str] = {}
    for num, path in zip(explicit, paths, strict=True):
        if num is None:
            continue
        if num >= n:
            raise _Bad(path, f"{what} number {num} is out of range: the file defines {n} {what}s")
        if num in seen:
            raise _Bad(path, f"{what} number {num} is defined twice (first at {seen[num]})")
        seen[num] = path
    free = iter(sorted(set(range(n)) - set(seen)))
    return [num if num is not None else next(free) for num in explicit]


def _pairs(x: Any, path: str, width: int, what: str) -> list[list[Any]]:
    rows = _arr(x, path, what)
    for i, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == width):
            raise _Bad(f"{path}[{i}]", f"expected an array of {width} items")
    return rows


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
    try:
        return _read(obj, source, verify)
    except _Bad as exc:
        raise FormatError(f"{source}: {_where(exc.path)}: {exc.message}") from None


def _read(doc: Any, source: str, verify: bool) -> Graph:
    doc = _obj(doc, "", "an opgraph document")
    _check_keys(doc, _TOP_KEYS, "")
    if doc.get("format") != FORMAT:
        raise _Bad("format", f"not an opgraph JSON graph: \"format\" is {_short(doc.get('format'))}, "
                             f"expected \"{FORMAT}\"")
    version = doc.get("version")
    if type(version) is not int or version != VERSION:
        raise _Bad("version", f"unsupported version {_short(version)}; this opgraph reads version {VERSION}")

    # Constants.
    constants: list[np.ndarray] = []
    const_names: dict[int, str] = {}
    descriptions: dict[tuple[str, int], str] = {}
    for i, c in enumerate(_arr(doc.get("constants", []), "constants", "the constants table")):
        path = f"constants[{i}]"
        c = _obj(c, path, "a constant")
        _check_keys(c, _CONST_KEYS, path)
        constants.append(_decode_array_body(c, path))
        if "name" in c:
            const_names[i] = _str(c["name"], f"{path}.name", "a name")
        if "description" in c:
            descriptions[("constant", i)] = _str(c["description"], f"{path}.description", "a description")

    # Value definitions: inputs, then the outputs of the ops in file order.
    defs: list[_Def] = [_Def(x, f"inputs[{i}]") for i, x in enumerate(_arr(doc.get("inputs", []), "inputs",
                                                                             "the inputs"))]
    n_inputs = len(defs)
    raw_ops = _arr(doc.get("ops", None), "ops", "the ops") if "ops" in doc else []
    op_objs: list[dict[str, Any]] = []
    op_defs: list[list[_Def]] = []
    for i, op in enumerate(raw_ops):
        path = f"ops[{i}]"
        op = _obj(op, path, "an op")
        _check_keys(op, _OP_KEYS, path)
        op_objs.append(op)
        outs = [_Def(x, f"{path}.outputs[{j}]") for j, x in enumerate(_arr(op.get("outputs", []),
                                                                            f"{path}.outputs", "the op's outputs"))]
        op_defs.append(outs)
        defs.extend(outs)
    numbers = _assign_numbers([d.number for d in defs], [d.path for d in defs], "value")
    n_vals = len(defs)
    refs: dict[str, int] = {f"%{v}": v for v in range(n_vals)}
    by_ref: dict[str, str] = {}
    for d, num in zip(defs, numbers, strict=True):
        d.number = num
        if d.ref in by_ref:
            raise _Bad(_key_path(d.path, "value"), f"ref {d.ref!r} is defined twice (first at {by_ref[d.ref]})")
        by_ref[d.ref] = d.path
        refs[d.ref] = num

    def resolve(ref: Any, path: str) -> int:
        if not isinstance(ref, str):
            raise _Bad(path, f"expected a value ref (a string like \"%x\"), got {_short(ref)}")
        v = refs.get(ref)
        if v is None:
            raise _Bad(path, f"unknown value ref {ref!r}")
        return v

    value_types: list[ValueType | None] = [None] * n_vals
    for d in defs:
        value_types[d.number] = d.type  # type: ignore[index]
    for d in defs[:n_inputs]:
        if d.type is None:
            raise _Bad(d.path, "an input needs a 'type'")

    # Ops.
    op_index = _assign_numbers(
        [None if "index" not in op else _int(op["index"], f"ops[{i}].index", "an op index", 0)
         for i, op in enumerate(op_objs)],
        [f"ops[{i}].index" for i in range(len(op_objs))], "op")
    n_ops = len(op_objs)
    kinds = [0] * n_ops
    versions = [0] * n_ops
    attr_tuples: list[tuple[tuple[str, Any], ...]] = [()] * n_ops
    in_lists: list[list[int]] = [[]] * n_ops
    out_lists: list[list[int]] = [[]] * n_ops
    op_names: dict[int, str] = {}
    position = [0] * n_ops
    for i, op in enumerate(op_objs):
        path = f"ops[{i}]"
        k = op_index[i]
        position[k] = i
        if "op" not in op:
            raise _Bad(path, "missing key 'op' (the op kind's name)")
        kind_name = _str(op["op"], f"{path}.op", "an op kind name")
        try:
            opdef = get_op(kind_name)
        except KeyError:
            raise _Bad(f"{path}.op", f"unknown op kind {kind_name!r}") from None
        if "id" in op:
            kid = _int(op["id"], f"{path}.id", "an op kind id")
            if kid != opdef.id:
                raise _Bad(f"{path}.id", f"kind id {kid} disagrees with op {kind_name!r} (id {opdef.id})")
        kinds[k] = opdef.id
        ins = [resolve(r, f"{path}.inputs[{j}]")
               for j, r in enumerate(_arr(op.get("inputs", []), f"{path}.inputs", "the op's inputs"))]
        in_lists[k] = ins
        outs = [d.number for d in op_defs[i]]
        out_lists[k] = outs  # type: ignore[assignment]
        attrs = _read_attrs(op.get("attrs", {}), opdef, f"{path}.attrs")
        attr_tuples[k] = attrs
        missing_type = [d for d in op_defs[i] if d.type is None]
        if "version" in op:
            versions[k] = _int(op["version"], f"{path}.version", "a version", *_INT32)
        if missing_type or "version" not in op:
            out_types, version = _infer(opdef, attrs, ins, value_types, constants, path, op)
            if "version" not in op:
                versions[k] = version
            if missing_type:
                if len(out_types) != len(outs):
                    raise _Bad(f"{path}.outputs", f"{opdef.name} gives {len(out_types)} output(s), "
                                                  f"the file lists {len(outs)}")
                for d, t in zip(op_defs[i], out_types, strict=True):
                    if d.type is None:
                        d.type = t
                        value_types[d.number] = t  # type: ignore[index]
        if "name" in op:
            op_names[k] = _str(op["name"], f"{path}.name", "a name")
        if "description" in op:
            descriptions[("op", k)] = _str(op["description"], f"{path}.description", "a description")

    outputs = [resolve(r, f"outputs[{i}]") for i, r in enumerate(_arr(doc.get("outputs", []), "outputs",
                                                                       "the outputs"))]
    updates = [[resolve(s, f"updates[{i}][0]"), resolve(d, f"updates[{i}][1]")]
               for i, (s, d) in enumerate(_pairs(doc.get("updates", []), "updates", 2, "the updates"))]

    # Symbols.
    value_names: dict[int, str] = {}
    for d in defs:
        if d.name is not None:
            value_names[d.number] = d.name  # type: ignore[index]
        if d.desc is not None:
            descriptions[("value", d.number)] = d.desc  # type: ignore[index]
    io_names: dict[int, str] = {}
    if "symbols" in doc:
        sym = _obj(doc["symbols"], "symbols", "the symbols")
        _check_keys(sym, _SYMBOL_KEYS, "symbols")
        for key, table in (("values", value_names), ("ops", op_names), ("constants", const_names), ("io", io_names)):
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

    # Interned tables and columnar arrays.
    types: list[ValueType] = []
    type_ids: dict[ValueType, int] = {}
    value_type = []
    for v, t in enumerate(value_types):
        if t is None:  # only possible for an op output whose op could not type it
            raise _Bad(next(d.path for d in defs if d.number == v), "missing 'type'")
        tid = type_ids.get(t)
        if tid is None:
            tid = type_ids[t] = len(types)
            types.append(t)
        value_type.append(tid)
    attrs_table: list[tuple[tuple[str, Any], ...]] = []
    attr_ids: dict[Any, int] = {}
    op_attr = []
    for a in attr_tuples:
        key = exact_key(a)
        aid = attr_ids.get(key)
        if aid is None:
            aid = attr_ids[key] = len(attrs_table)
            attrs_table.append(a)
        op_attr.append(aid)
    value_producer = [-1] * n_vals
    value_index = [0] * n_vals
    for k, outs in enumerate(out_lists):
        for j, v in enumerate(outs):
            value_producer[v] = k
            value_index[v] = j
    graph = Graph(
        op_kind=np.asarray(kinds, dtype=np.int64), op_attr=op_attr, op_version=versions,
        in_ptr=np.cumsum([0] + [len(x) for x in in_lists]), in_ids=[v for x in in_lists for v in x],
        out_ptr=np.cumsum([0] + [len(x) for x in out_lists]), out_ids=[v for x in out_lists for v in x],
        value_type=value_type, value_producer=value_producer, value_index=value_index,
        types=types, attrs=attrs_table, constants=constants,
        inputs=[d.number for d in defs[:n_inputs]], outputs=outputs, updates=updates,
        symbols=Symbols(value_names, op_names, const_names, descriptions, io_names),
        file_meta=file_meta,
    )
    if verify:
        try:
            graph.verify()
        except VerifyError as exc:
            raise FormatError(f"{source}: {_verify_path(exc, position, defs)}: graph fails verification: "
                              f"{exc}") from exc
        except Exception as exc:
            raise FormatError(f"{source}: (top level): graph fails verification: "
                              f"{type(exc).__name__}: {exc}") from exc
    return graph


def _verify_path(exc: VerifyError, position: list[int], defs: list[_Def]) -> str:
    """The JSON path of the first op (in file order) or value that verification problems name."""
    ops = [int(m.group(1)) for p in exc.problems if (m := re.match(r"op (\d+)", p))]
    ops = [position[op] for op in ops if op < len(position)]
    if ops:
        return f"ops[{min(ops)}]"
    for p in exc.problems:
        m = re.match(r"value (\d+)", p)
        if m:
            for d in defs:
                if d.number == int(m.group(1)):
                    return d.path
    return "(top level)"


def _read_attrs(obj: Any, opdef: OpDef, path: str) -> tuple[tuple[str, Any], ...]:
    obj = _obj(obj, path, "the op's attributes")
    if not obj and not opdef.attrs:
        return ()
    decoded = tuple((k, _dec(v, _key_path(path, k))) for k, v in obj.items())
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
    return decoded if set(obj) == set(opdef.attrs) else normalised


def _infer(opdef: OpDef, attrs: tuple[tuple[str, Any], ...], ins: list[int], value_types: list[ValueType | None],
           constants: list[np.ndarray], path: str, op: dict[str, Any]) -> tuple[tuple[ValueType, ...], int]:
    attr_dict = dict(attrs)
    if opdef is CONST:
        idx = attr_dict.get("index")
        if not (type(idx) is int and 0 <= idx < len(constants)):
            raise _Bad(f"{path}.attrs.index", f"constant index {idx!r} is not in the constants table")
        return (TensorType.of(constants[idx]),), 0
    in_types = []
    for j, v in enumerate(ins):
        t = value_types[v]
        if t is None:
            raise _Bad(f"{path}.inputs[{j}]", f"the type of {op['inputs'][j]} is not known here; give the op's "
                                              f"output types and version, or list the ops in topological order")
        in_types.append(t)
    try:
        opdef.check_arity(len(in_types))
        out = tuple(opdef.infer(tuple(in_types), attr_dict))
        version = int(opdef.version(tuple(in_types), attr_dict))
    except Exception as exc:
        raise _Bad(path, f"{opdef.name}: type rule rejects inputs {tuple(in_types)}: {exc}") from None
    return out, version


def loads_json(text: str | bytes, *, source: str = "<string>", verify: bool = True) -> Graph:
    """Parse JSON text (as written by :func:`dumps_json`) into a verified Graph.

    >>> loads_json('{"format": "opgraph", "version": 2}')
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: <string>: version: unsupported version 2; this opgraph reads version 1
    >>> loads_json('{"format": ')
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: <string>: malformed JSON at line 1 column 12: Expecting value
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise FormatError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    elif text.startswith("\ufeff"):
        text = text[1:]
    with _gc_paused():
        try:
            doc = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
        except json.JSONDecodeError as exc:
            raise FormatError(f"{source}: malformed JSON at line {exc.lineno} column {exc.colno}: "
                              f"{exc.msg}") from None
        except _Bad as exc:
            raise FormatError(f"{source}: {exc.message}") from None
        except RecursionError:
            raise FormatError(f"{source}: malformed JSON: nested too deeply") from None
        except ValueError as exc:  # e.g. an integer with too many digits
            raise FormatError(f"{source}: malformed JSON: {exc}") from None
        return from_json_dict(doc, source=source, verify=verify)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsing makes millions of acyclic objects and
    the collections it would trigger cost more than the parse itself."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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


def load_json(path: str | os.PathLike[str], *, verify: bool = True) -> Graph:
    """Read a graph written by :func:`save_json`; never executes code.

    Raises :class:`~opgraph.errors.FormatError` naming the file and the JSON
    path of the problem (``OSError`` when the file cannot be read).

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "bad.json")
    >>> _ = open(p, "w").write('{"format": "opgraph", "version": 1, "ops": [{"op": "frobnicate"}]}')
    >>> load_json(p)
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: .../bad.json: ops[0].op: unknown op kind 'frobnicate'
    """
    with open(path, "rb") as f:
        data = f.read()
    return loads_json(data, source=os.fspath(path), verify=verify)


__all__ = [
    "DEFAULT_INLINE_LIMIT", "FORMAT", "VERSION", "decode_value", "dumps_json", "encode_array", "encode_value",
    "from_json_dict", "load_json", "loads_json", "save_json", "to_json_dict",
]
