"""How values, arrays and types are written as JSON data and read back, and the checks of JSON data."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from opgraph.core.dtypes import as_dtype
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import VOID, TensorType, ValueType, VoidType

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
MAX_DEPTH = 256
"""The deepest nesting of JSON arrays and objects a document may have (the top-level object is level 1).

Readers reject deeper text before parsing it, whatever ``sys.getrecursionlimit()`` is, and
writers refuse to write it. Every file opgraph itself makes stays far below it (an op
attribute sits at level 5, a constant's data at level 4 plus its rank, at most 64); only
attributes and ``file_meta`` entries nested about 250 levels deep meet it."""

_NUMERIC_REF = re.compile(r"%(0|[1-9][0-9]*)")
ALL_DIGITS = re.compile(r"[0-9]+")
_CANONICAL_NAN_BITS = 0x7FF8000000000000
_MAX_DIM = 2**62
_MAX_NDIM = 64
"""NumPy's most dimensions (so a constant's data nest at most this deep)."""
INT32 = (-(2**31), 2**31 - 1)

TOP_KEYS = ("format", "version", "subgraphs", "inputs", "constants", "ops", "outputs", "updates", "symbols",
            "file_meta")
BODY_KEYS = ("name", "inputs", "constants", "ops", "outputs", "updates", "symbols", "file_meta")
DEF_KEYS = ("value", "number", "type", "name", "description")
OP_KEYS = ("op", "id", "index", "inputs", "outputs", "attrs", "version", "name", "description")
CONST_KEYS = ("dtype", "shape", "data", "base64", "name", "description")
SYMBOL_KEYS = ("values", "ops", "constants", "io", "descriptions")


class BadJson(Exception):
    """A problem at a JSON path (turned into a FormatError naming the file)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


class Unencodable(Exception):
    """A value the attribute encoding cannot represent."""


class TooDeep(Exception):
    """A value nested deeper than :data:`MAX_DEPTH` allows (the writer refuses it; see :func:`too_deep`)."""


def key_path(path: str, key: str) -> str:
    """The JSON path of ``key`` inside the object at ``path`` (as problems are reported).

    >>> key_path("ops[2]", "attrs"), key_path("", "ops"), key_path("file_meta", "a b")
    ('ops[2].attrs', 'ops', 'file_meta["a b"]')
    """
    if key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def where_of(path: str) -> str:
    """``path`` for a message, naming the top level when it is empty.

    >>> where_of(""), where_of("ops[0]")
    ('(top level)', 'ops[0]')
    """
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
    raise BadJson(path, f"expected 'nan', 'inf', '-inf' or 'bits:<16 hex digits>', got {s!r}")


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
        return enc_value(value, inline_limit)
    except Unencodable as exc:
        raise TypeError(str(exc)) from None
    except TooDeep:
        raise ValueError(f"the value is nested more than {MAX_DEPTH} levels deep (opgraph.io.jsonfmt.MAX_DEPTH); "
                         f"JSON readers refuse it") from None


def enc_value(v: Any, limit: int, bodies: dict[Subgraph, int] | None = None, room: int = MAX_DEPTH) -> Any:
    """The JSON data of ``v``; raises :class:`TooDeep` (before recursing further) when tuples, lists
    and dicts nest more than ``room`` levels (each opens at least one JSON level)."""
    if isinstance(v, (tuple, list, dict)):
        room -= 1
        if room < 0:
            raise TooDeep()
    if isinstance(v, np.ndarray):
        return {"ndarray": encode_array(v, inline_limit=limit)}
    if isinstance(v, np.generic):
        if not isinstance(v, (np.bool_, np.number)):
            raise Unencodable(f"cannot encode NumPy scalar {v!r}")
        return {"numpy": encode_array(np.asarray(v), inline_limit=limit)}
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return _encode_float(float(v))
    if isinstance(v, complex):
        return {"complex": [_encode_float(v.real), _encode_float(v.imag)]}
    # (loops, not comprehensions: one Python frame per level of nesting)
    if isinstance(v, tuple):
        items = []
        for x in v:
            items.append(enc_value(x, limit, bodies, room))
        return items
    if isinstance(v, list):
        items = []
        for x in v:
            items.append(enc_value(x, limit, None, room))
        return {"list": items}
    if isinstance(v, dict):
        if all(type(k) is str for k in v):
            entries = {}
            for k, x in v.items():
                entries[k] = enc_value(x, limit, None, room)
            return {"dict": entries}
        pairs = []
        for k, x in v.items():
            pairs.append([enc_value(k, limit, None, room), enc_value(x, limit, None, room)])
        return {"dict": pairs}
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, Subgraph):
        if bodies is not None and v in bodies:
            return {"subgraph": bodies[v]}
        raise Unencodable(f"subgraph {v.label} can only be written as part of the graph that uses it (save_json)")
    raise Unencodable(f"cannot encode {type(v).__name__} value {v!r} as JSON")


def decode_value(obj: Any, path: str = "") -> Any:
    """Inverse of :func:`encode_value`; raises ``ValueError`` on malformed data.

    >>> decode_value([1, [2.0, {"float": "nan"}], {"list": ["a"]}])
    (1, (2.0, nan), ['a'])
    """
    try:
        deep = too_deep(obj, path, MAX_DEPTH)
        if deep is not None:
            raise deep
        return dec_value(obj, path)
    except BadJson as exc:
        raise ValueError(f"{where_of(exc.path)}: {exc.message}") from None


class BodyRef:
    """``{"subgraph": k}`` read from an op's attributes: record ``k`` of ``subgraphs``, resolved once all are read."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"{{'subgraph': {self.index}}}"


def has_ref(v: Any) -> bool:
    """Whether a decoded attribute value holds a :class:`BodyRef` (in nested tuples; no recursion)."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, BodyRef):
            return True
        if isinstance(x, tuple):
            stack.extend(x)
    return False


def swap_refs(v: Any, f: Callable[[BodyRef], Any]) -> Any:
    """``v`` with each :class:`BodyRef` replaced by ``f(ref)`` (one frame per level; values are bounded)."""
    if isinstance(v, BodyRef):
        return f(v)
    if isinstance(v, tuple):
        items = []
        for x in v:
            items.append(swap_refs(x, f))
        return tuple(items)
    return v


def dec_value(obj: Any, path: str, refs: bool = False) -> Any:
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise BadJson(path, "number out of range (write non-finite floats as {\"float\": ...})")
        return obj
    # (loops, not comprehensions: one Python frame per level of nesting, which MAX_DEPTH bounds)
    if isinstance(obj, list):
        items = []
        for i, x in enumerate(obj):
            items.append(dec_value(x, f"{path}[{i}]", refs))
        return tuple(items)
    if isinstance(obj, dict):
        if len(obj) != 1:
            raise BadJson(path, f"a tagged value must have exactly one key, got {sorted(obj)}")
        ((tag, body),) = obj.items()
        sub = key_path(path, tag)
        if tag == "float":
            return _decode_float_tag(body, sub)
        if tag == "subgraph":
            if not refs:
                raise BadJson(path, "a subgraph reference belongs in an op's attributes")
            if type(body) is not int or body < 0:
                raise BadJson(sub, f"expected the index of a record of 'subgraphs', got {short_repr(body)}")
            return BodyRef(body)
        if tag == "complex":
            if not (isinstance(body, list) and len(body) == 2):
                raise BadJson(sub, "expected [re, im]")
            parts = []
            for i, p in enumerate(body):
                p = dec_value(p, f"{sub}[{i}]")
                if type(p) is not float:
                    raise BadJson(f"{sub}[{i}]", f"expected a float, got {short_repr(p)}")
                parts.append(p)
            return complex(parts[0], parts[1])
        if tag == "list":
            if not isinstance(body, list):
                raise BadJson(sub, "expected an array")
            items = []
            for i, x in enumerate(body):
                items.append(dec_value(x, f"{sub}[{i}]"))
            return items
        if tag == "dict":
            if isinstance(body, dict):
                entries = {}
                for k, x in body.items():
                    entries[k] = dec_value(x, key_path(sub, k))
                return entries
            if isinstance(body, list):
                out: dict[Any, Any] = {}
                for i, pair in enumerate(body):
                    if not (isinstance(pair, list) and len(pair) == 2):
                        raise BadJson(f"{sub}[{i}]", "expected a [key, value] pair")
                    key = dec_value(pair[0], f"{sub}[{i}][0]")
                    try:
                        out[key] = dec_value(pair[1], f"{sub}[{i}][1]")
                    except TypeError:
                        raise BadJson(f"{sub}[{i}][0]", f"unhashable key {short_repr(key)}") from None
                return out
            raise BadJson(sub, "expected an object or an array of pairs")
        if tag == "bytes":
            return _b64(body, sub)
        if tag == "ndarray":
            return _decode_array(body, sub)
        if tag == "numpy":
            arr = _decode_array(body, sub)
            if arr.ndim != 0:
                raise BadJson(sub, "a NumPy scalar must have shape []")
            return arr[()]
        raise BadJson(path, f"unknown tag {tag!r} (expected float, complex, list, dict, bytes, ndarray, numpy or "
                            f"subgraph)")
    raise BadJson(path, f"unexpected JSON value {short_repr(obj)}")


def _b64(body: Any, path: str) -> bytes:
    if not isinstance(body, str):
        raise BadJson(path, "expected a base64 string")
    try:
        return base64.b64decode(body.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise BadJson(path, f"invalid base64: {exc}") from None


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
        except BadJson:
            continue
        if back.tobytes() == arr.tobytes():
            return nested
    return _NO_INLINE


def _check_shape(shape: Any, path: str) -> tuple[int, ...]:
    if not isinstance(shape, list):
        raise BadJson(path, f"expected a list of dimensions, got {short_repr(shape)}")
    if len(shape) > _MAX_NDIM:
        raise BadJson(path, f"{len(shape)} dimensions; NumPy arrays have at most {_MAX_NDIM}")
    for i, d in enumerate(shape):
        if type(d) is not int or not 0 <= d < _MAX_DIM:
            raise BadJson(f"{path}[{i}]", f"invalid dimension {d!r}")
    if math.prod(d for d in shape if d) >= _MAX_DIM:
        raise BadJson(path, f"shape {shape} is too large")
    return tuple(shape)


def _check_dtype(name: Any, path: str) -> np.dtype:
    if not isinstance(name, str):
        raise BadJson(path, f"expected a dtype name, got {name!r}")
    try:
        return as_dtype(name)
    except Exception:
        raise BadJson(path, f"unsupported dtype {name!r}") from None


def _decode_array(obj: Any, path: str) -> np.ndarray:
    if not isinstance(obj, dict):
        raise BadJson(path, "expected a constant object with dtype, shape and data or base64")
    check_keys(obj, ("dtype", "shape", "data", "base64"), path)
    return decode_array_body(obj, path)


def decode_array_body(obj: dict[str, Any], path: str) -> np.ndarray:
    for key in ("dtype", "shape"):
        if key not in obj:
            raise BadJson(path, f"missing key {key!r}")
    dtype = _check_dtype(obj["dtype"], key_path(path, "dtype"))
    shape = _check_shape(obj["shape"], key_path(path, "shape"))
    if ("data" in obj) == ("base64" in obj):
        raise BadJson(path, "a constant needs exactly one of 'data' and 'base64'")
    if "data" in obj:
        return _decode_inline(obj["data"], dtype, list(shape), key_path(path, "data"))
    bpath = key_path(path, "base64")
    raw = _b64(obj["base64"], bpath)
    size = math.prod(shape)
    if len(raw) != size * dtype.itemsize:
        raise BadJson(bpath, f"{len(raw)} bytes of data for {size} {dtype.name} elements of shape {list(shape)} "
                             f"(expected {size * dtype.itemsize})")
    arr = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)
    if dtype.kind == "b" and raw.translate(None, b"\x00\x01"):
        raise BadJson(bpath, "boolean data must be bytes 0 and 1")
    return arr


def _decode_inline(data: Any, dtype: np.dtype, shape: list[int], path: str) -> np.ndarray:
    kind = dtype.kind
    leaf_shape = [*shape, 2] if kind == "c" else shape
    leaves: list[Any] = []
    _flatten(data, leaf_shape, 0, [], leaves, path)

    def bad(k: int, why: str) -> BadJson:
        idx, pos = [], k
        for d in reversed(leaf_shape):
            idx.append(pos % d)
            pos //= d
        return BadJson(path + "".join(f"[{i}]" for i in reversed(idx)), why)

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
            raise BadJson(where, f"expected a scalar at depth {depth} for shape {shape}, got a nested "
                                 f"{'array' if isinstance(data, list) else 'object'}")
        out.append(data)
        return
    if not isinstance(data, list) or len(data) != shape[depth]:
        where = path + "".join(f"[{i}]" for i in index)
        got = f"an array of {len(data)}" if isinstance(data, list) else repr(data)
        raise BadJson(where, f"data do not match shape {shape}: expected an array of {shape[depth]} "
                             f"at depth {depth}, got {got}")
    for i, x in enumerate(data):
        index.append(i)
        _flatten(x, shape, depth + 1, index, out, path)
        index.pop()


# ----------------------------------------------------------------------------- types
def type_json(t: ValueType) -> dict[str, Any]:
    """A value type as the JSON form writes it (``{"void": true}`` for the void type).

    >>> import opgraph
    >>> type_json(opgraph.VOID)
    {'void': True}
    >>> decode_type(type_json(opgraph.VOID), "t") is opgraph.VOID
    True
    """
    if isinstance(t, VoidType):
        return {"void": True}
    return t.to_json()


def decode_type(obj: Any, path: str) -> ValueType:
    if not isinstance(obj, dict):
        raise BadJson(path, f"expected a type object like {{\"dtype\": \"float64\", \"shape\": [3]}}, got {obj!r}")
    if "void" in obj:
        if obj != {"void": True}:
            raise BadJson(path, "a void type is exactly {\"void\": true}")
        return VOID
    check_keys(obj, ("dtype", "shape"), path)
    if "dtype" not in obj or "shape" not in obj:
        raise BadJson(path, "a tensor type needs 'dtype' and 'shape'")
    name, shape = obj["dtype"], obj["shape"]
    if shape is not None:
        spath = key_path(path, "shape")
        if not isinstance(shape, list):
            raise BadJson(spath, f"expected a list of dimensions or null, got {shape!r}")
        for i, d in enumerate(shape):
            if d is not None and (type(d) is not int or not 0 <= d < _MAX_DIM):
                raise BadJson(f"{spath}[{i}]", f"invalid dimension {d!r} (a non-negative integer or null)")
        shape = tuple(shape)
    if not isinstance(name, str):
        raise BadJson(key_path(path, "dtype"), f"expected a dtype name, got {name!r}")
    try:
        return _tensor_type(name, shape)
    except Exception:
        raise BadJson(key_path(path, "dtype"), f"unsupported dtype {name!r}") from None


@functools.lru_cache(maxsize=4096)
def _tensor_type(dtype: str, shape: tuple[int | None, ...] | None) -> TensorType:
    # Files repeat a few types many times; dims are checked (exact ints or None) before this.
    return TensorType(as_dtype(dtype), shape)


# ----------------------------------------------------------------------------- reading: checks
def check_keys(obj: dict[str, Any], allowed: Sequence[str], path: str) -> None:
    """Raise :class:`BadJson` at the first key of ``obj`` that is not ``allowed``.

    >>> check_keys({"op": "exp"}, ("op", "name"), "ops[0]")
    >>> check_keys({"opp": "exp"}, ("op", "name"), "ops[0]")
    Traceback (most recent call last):
    ...
    opgraph.io.jsonfmt.encoding.BadJson: unknown key 'opp' (allowed: op, name)
    """
    for key in obj:
        if key not in allowed:
            raise BadJson(key_path(path, key), f"unknown key {key!r} (allowed: {', '.join(allowed)})")


def expect_object(x: Any, path: str, what: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise BadJson(path, f"expected {what} (a JSON object), got {short_repr(x)}")
    return x


def expect_array(x: Any, path: str, what: str) -> list[Any]:
    if not isinstance(x, list):
        raise BadJson(path, f"expected {what} (a JSON array), got {short_repr(x)}")
    return x


def expect_int(x: Any, path: str, what: str, lo: int | None = None, hi: int | None = None) -> int:
    """``x`` when it is a JSON integer within ``[lo, hi]``; else :class:`BadJson` at ``path`` naming ``what``.

    >>> expect_int(3, "ops[0].index", "an op index", lo=0)
    3
    >>> expect_int(True, "ops[0].index", "an op index")
    Traceback (most recent call last):
    ...
    opgraph.io.jsonfmt.encoding.BadJson: expected an op index (an integer), got true
    """
    if type(x) is not int:
        raise BadJson(path, f"expected {what} (an integer), got {short_repr(x)}")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        raise BadJson(path, f"{what} {x} is out of range")
    return x


def expect_str(x: Any, path: str, what: str) -> str:
    if not isinstance(x, str):
        raise BadJson(path, f"expected {what} (a string), got {short_repr(x)}")
    return x


def short_repr(x: Any, width: int = 60) -> str:
    """``x`` as JSON (its repr when it is not JSON data), cut to ``width`` characters, for messages.

    Made without recursion and only as far as the cut, so any nesting and size is cheap.

    >>> short_repr([1, "a"]), len(short_repr("x" * 100)), short_repr(json.loads("[" * 30 + "]" * 30), 20)
    ('[1, "a"]', 60, '[[[[[[[[[[[[[[[[[...')
    """
    parts: list[str] = []
    size = 0
    stack: list[Any] = [x]  # values, and closing brackets as _Close
    while stack and size <= width:
        v = stack.pop()
        if type(v) is _Close:
            s = v.text
        elif isinstance(v, (list, tuple, dict)):
            tup = isinstance(v, tuple)
            s = "{" if isinstance(v, dict) else "(" if tup else "["
            if not v:
                s += "}" if isinstance(v, dict) else ")" if tup else "]"
            else:
                items = list(v.items()) if isinstance(v, dict) else list(v)
                stack.append(_Close("}" if isinstance(v, dict) else ",)" if tup and len(v) == 1 else
                                    ")" if tup else "]"))
                for k in range(len(items) - 1, -1, -1):
                    item = items[k]
                    if isinstance(v, dict):
                        key = item[0] if isinstance(item[0], str) else str(item[0])
                        stack.append(item[1])
                        stack.append(_Close(("" if k == 0 else ", ") + json.dumps(key) + ": "))
                    else:
                        stack.append(item)
                        if k:
                            stack.append(_Close(", "))
        elif isinstance(v, (str, int, float, bool, type(None))):
            s = json.dumps(v)
        else:
            s = repr(v)
        parts.append(s)
        size += len(s)
    out = "".join(parts)
    return out if len(out) <= width and not stack else out[:width - 3] + "..."


class _Close:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def too_deep(obj: Any, path: str, room: int) -> BadJson | None:
    """The problem with ``obj`` (at JSON ``path``) when its arrays and objects nest more than ``room``
    levels, naming the path of the first one too deep (in document order); ``None`` when not.

    Tuples count as arrays. No recursion, so any nesting is measured safely.

    >>> too_deep({"a": [1, [2]]}, "file_meta", 2).message
    'nested too deeply: more than 2 levels of arrays and objects (opgraph.io.jsonfmt.MAX_DEPTH is 256)'
    >>> too_deep({"a": [1, [2]]}, "file_meta", 2).path, too_deep({"a": [1, [2]]}, "file_meta", 3)
    ('file_meta.a[1]', None)
    """
    containers = (list, tuple, dict)
    if not isinstance(obj, containers):
        return None
    level, depth = [obj], 1  # level by level (breadth first): the loops run in comprehensions
    while level and depth <= room:
        level = [c for x in level for c in (x.values() if isinstance(x, dict) else x) if isinstance(c, containers)]
        depth += 1
    if not level:
        return None
    # Again, in document order and with paths (rare: only for a document that is refused).
    walk: list[tuple[Any, int, str]] = [(obj, 1, path)]
    while walk:
        x, d, where = walk.pop()
        if d > room:
            if len(where) > 120:  # hundreds of "[0]": keep both ends
                where = f"{where[:60]}...{where[-40:]}"
            return BadJson(where, f"nested too deeply: more than {room} levels of arrays and objects "
                                  f"(opgraph.io.jsonfmt.MAX_DEPTH is {MAX_DEPTH})")
        items = list(x.items()) if isinstance(x, dict) else list(enumerate(x))
        for k, c in reversed(items):
            if isinstance(c, containers):
                walk.append((c, d + 1, key_path(where, str(k)) if isinstance(x, dict) else f"{where}[{k}]"))
    raise AssertionError("unreachable")


def expect_pairs(x: Any, path: str, width: int, what: str) -> list[list[Any]]:
    rows = expect_array(x, path, what)
    for i, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == width):
            raise BadJson(f"{path}[{i}]", f"expected an array of {width} items")
    return rows
