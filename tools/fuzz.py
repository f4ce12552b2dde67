"""Fuzz opgraph's file loaders: mutate valid .cg sets, JSON, ONNX and GraphML files and load them.

Every mutated file must either load or raise an :class:`opgraph.errors.GraphError`
(a ``FormatError`` naming the problem), within a time and memory bound. Anything
else (another exception, a hang, a large allocation, a crash of the process) is a
failure; the file is saved for repro.

    python tools/fuzz.py [N]                 # N mutated files per format (default 100000)
    python tools/fuzz.py 2000 --formats json onnx --engine random --out fuzz-out
    python tools/fuzz.py --replay onnx 1234  # rebuild mutant 1234 of the random engine and load it

Engines: ``atheris`` (coverage-guided libFuzzer, when ``pip install atheris`` works
for this Python: the ``fuzz`` extra) mutates with libFuzzer's byte mutations and
this module's structure-aware ones; ``random`` draws mutant ``i`` from
``random.Random(f"{seed}:{format}:{i}")``, so every mutant can be rebuilt. Each
format runs in a child process that the parent restarts after a crash (the input
being loaded is then saved as a failure). The same mutators and the same check
drive ``tests/test_fuzz_loaders.py`` under hypothesis.

ONNX files are loaded twice: through ``opgraph.io.load(path)`` and through
``opgraph.io.onnx.from_onnx(bytes)`` (the loader wraps every exception of the
importer in a FormatError; the importer itself must raise only GraphErrors).
A GraphError that a catch-all made from another exception (the .cg reader's
``unexpected=True``, the ONNX importer's wrapper of its translators) is counted
apart, labelled with the exception it wraps: it is allowed, but it marks a
missing check.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import math
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import tracemalloc
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SEED_DIR = ROOT / "tests" / "data" / "fuzz_seeds"
FORMATS = ("cg", "json", "onnx", "graphml")
CG_SUFFIXES = (".cg", ".cgc", ".cgio", ".cgs")
SUFFIX = {"json": ".json", "onnx": ".onnx", "graphml": ".graphml"}
TIMEOUT_S = 5.0
"""Wall time one load may take (the seeds load in milliseconds)."""
MEM_FIXED = 64 << 20
MEM_PER_BYTE = 200
"""A load may allocate (tracemalloc peak) at most MEM_FIXED + MEM_PER_BYTE * (size of the files)."""

Files = dict[str, bytes]
"""A file set by suffix: four files for .cg, one for the other formats."""


# ----------------------------------------------------------------------------- seeds
@dataclass
class Seed:
    """A valid file (set) of one format."""

    fmt: str
    name: str
    files: Files


def _seed_graphs() -> list[tuple[str, Any]]:
    """Small graphs that exercise the formats: dtypes, attributes, names, constants, updates."""
    from opgraph import GraphBuilder

    graphs = []
    b = GraphBuilder()
    x = b.input(("float32", (None, 3)), name="x")
    c = b.constant(np.arange(3, dtype=np.float32), name="c")
    y = b.op("sum", b.multiply(b.add(x, c), 2.0), axis=1, name="total")
    b.output(b.exp(y), b.reshape(x, shape=(-1,)))
    b.describe("value", int(x), "the input")
    graphs.append(("small", b.freeze()))

    b = GraphBuilder()
    m = b.input(("float64", (4, 4)), name="m")
    u = b.input(("int16", None), name="u")
    s = b.input(("float32", (None, 3)), name="s")
    state = b.input(("float64", (4,)), name="state")
    w, v = b.op("eigh", b.add(m, b.permute_dims(m)), name="eig")
    lo, hi = b.op("split", b.reshape(m, shape=(16,)), sections=2)
    padded = b.op("pad", s, pad_width=((1, 1), (0, 0)), constant_value=-0.0)
    picked = b.op("getitem", m, index=(None, 1, slice(None, None, -1)))
    ein = b.op("einsum", m, m, subscripts="ij,jk->ik")
    total = b.op("sum", u, axis=None)
    flags = b.constant(np.array([True, False]), name="flags")
    b.update(b.add(state, 1.5), state)
    b.output(w, v, lo, hi, padded, picked, ein, total, flags)
    graphs.append(("rich", b.freeze()))

    b = GraphBuilder()  # ONNX-exportable: no update edges, no linalg
    x = b.input(("float32", (2, 3)), name="x")
    k = b.input(("int64", (3,)), name="k")
    z = b.op("matmul", x, b.permute_dims(x))
    r = b.op("max", b.reshape(b.tanh(x), shape=(3, 2)), axis=0)
    b.output(z, r, b.op("concat", x, x, axis=0), b.add(k, 1), b.op("getitem", x, index=(slice(0, 2), 1)))
    graphs.append(("exportable", b.freeze()))
    return graphs


def _onnx_models() -> list[tuple[str, bytes]]:
    """Hand-made ONNX models for importer paths an opgraph export does not take (Reshape, Expand, Slice, ...)."""
    from onnx import TensorProto, helper, numpy_helper

    def vi(name: str, elem: int, shape: Any) -> Any:
        return helper.make_tensor_value_info(name, elem, shape)

    F, I64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Expand", ["r", "eshape"], ["e"]),
        helper.make_node("Slice", ["e", "starts", "ends", "axes"], ["s"]),
        helper.make_node("Gemm", ["s", "w", "bias"], ["g"], alpha=0.5, transB=1),
        helper.make_node("Concat", ["g", "g"], ["cat"], axis=1),
        helper.make_node("Gather", ["cat", "idx"], ["gat"], axis=0),
        helper.make_node("ReduceMean", ["gat"], ["mean"], keepdims=0),
        helper.make_node("Softmax", ["cat"], ["sm"], axis=-1),
        helper.make_node("Transpose", ["sm"], ["t"], perm=[1, 0]),
        helper.make_node("Cast", ["t"], ["out"], to=TensorProto.DOUBLE),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("shape", np.array([2, 3], np.int64)), ("eshape", np.array([2, 3], np.int64)),
        ("starts", np.array([0], np.int64)), ("ends", np.array([2], np.int64)), ("axes", np.array([0], np.int64)),
        ("w", np.ones((4, 3), np.float32)), ("bias", np.zeros(4, np.float32)), ("idx", np.array([1, 0], np.int64))]]
    g1 = helper.make_graph(nodes, "mix", [vi("x", F, (6,))],
                           [vi("mean", F, ()), vi("out", TensorProto.DOUBLE, (8, 2))], initializer=inits)
    conv = [
        helper.make_node("Conv", ["img", "kern"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["c"], ["relu"]),
        helper.make_node("MaxPool", ["relu"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["pool"], ["flat"], axis=1),
        helper.make_node("Where", ["cond", "flat", "flat"], ["wh"]),
        helper.make_node("Pad", ["wh", "pads"], ["padded"], mode="constant"),
        helper.make_node("Unsqueeze", ["padded", "uax"], ["unsq"]),
        helper.make_node("ArgMax", ["unsq"], ["am"], axis=2, keepdims=1),
    ]
    inits2 = [numpy_helper.from_array(a, n) for n, a in [
        ("kern", np.ones((2, 1, 3, 3), np.float32)), ("pads", np.array([0, 1, 0, 1], np.int64)),
        ("uax", np.array([0], np.int64))]]
    g2 = helper.make_graph(conv, "conv", [vi("img", F, (1, 1, 4, 4)), vi("cond", TensorProto.BOOL, (1, 8))],
                           [vi("am", I64, (1, 1, 1))], initializer=inits2)
    return [(name, helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString())
            for name, g in (("mix", g1), ("conv", g2))]


def _read_seed_dir(directory: Path) -> list[Seed]:
    seeds: list[Seed] = []
    if not directory.is_dir():
        return seeds
    bases: dict[str, Files] = {}
    for p in sorted(directory.iterdir()):
        if p.suffix in CG_SUFFIXES:
            bases.setdefault(p.stem, {})[p.suffix] = p.read_bytes()
        else:
            for fmt, suffix in SUFFIX.items():
                if p.name.endswith(suffix):
                    seeds.append(Seed(fmt, p.name, {suffix: p.read_bytes()}))
    seeds += [Seed("cg", base, files) for base, files in sorted(bases.items()) if len(files) == 4]
    return seeds


def make_seeds(directory: Path | None = SEED_DIR) -> dict[str, list[Seed]]:
    """Valid seeds of every format: graphs saved by opgraph now, plus the files in ``directory`` (TensCalc's)."""
    import onnx

    from opgraph.io import save
    from opgraph.io.onnx import to_onnx

    out: dict[str, list[Seed]] = {f: [] for f in FORMATS}
    with tempfile.TemporaryDirectory() as tmp:
        for name, g in _seed_graphs():
            save(g, os.path.join(tmp, name + ".cg"))
            out["cg"].append(Seed("cg", name, {s: Path(tmp, name + s).read_bytes() for s in CG_SUFFIXES}))
            for fmt in ("json", "graphml"):
                save(g, os.path.join(tmp, name + SUFFIX[fmt]))
                out[fmt].append(Seed(fmt, name, {SUFFIX[fmt]: Path(tmp, name + SUFFIX[fmt]).read_bytes()}))
            if name == "exportable":
                out["onnx"].append(Seed("onnx", name, {".onnx": to_onnx(g).SerializeToString()}))
    for name, data in _onnx_models():
        onnx.checker.check_model(onnx.load_from_string(data))
        out["onnx"].append(Seed("onnx", name, {".onnx": data}))
    for s in _read_seed_dir(directory) if directory is not None else []:
        out[s.fmt].append(s)
    return out


# ----------------------------------------------------------------------------- byte mutations
def _interesting_int(rnd: random.Random, bits: int, old: int = 0) -> int:
    choices = [0, 1, -1, 2, 3, 7, 8, 16, 255, 256, 1000, (1 << 15) - 1, -(1 << 15), (1 << 16) - 1, (1 << 31) - 1,
               -(1 << 31), (1 << 32) - 1, (1 << 62), (1 << 63) - 1, -(1 << 63), old + 1, old - 1, old * 2, -old,
               old + 1000, 10 ** 9, rnd.randrange(-(1 << (bits - 1)), 1 << (bits - 1))]
    return rnd.choice(choices)


def _pack(value: int, width: int) -> bytes:
    bits = 8 * width
    value &= (1 << bits) - 1  # wrap into the field
    return value.to_bytes(width, "little")


def flip_bits(rnd: random.Random, data: bytes) -> tuple[bytes, str]:
    """Flip 1-8 random bits."""
    if not data:
        return bytes([rnd.randrange(256)]), "empty -> one byte"
    b = bytearray(data)
    where = []
    for _ in range(rnd.randint(1, 8)):
        i = rnd.randrange(len(b))
        b[i] ^= 1 << rnd.randrange(8)
        where.append(i)
    return bytes(b), f"flip bits at {where}"


def set_bytes(rnd: random.Random, data: bytes) -> tuple[bytes, str]:
    """Overwrite a few bytes with interesting values."""
    if not data:
        return data, "noop"
    b = bytearray(data)
    i = rnd.randrange(len(b))
    val = rnd.choice([0, 0xFF, 0x7F, 0x80, 0x01, rnd.randrange(256)])
    n = rnd.choice([1, 1, 2, 4, 8])
    b[i:i + n] = bytes([val]) * len(b[i:i + n])
    return bytes(b), f"set {n} bytes at {i} to {val:#x}"


def truncate(rnd: random.Random, data: bytes) -> tuple[bytes, str]:
    """Cut the file at a random length (often near the end)."""
    n = len(data)
    cut = rnd.choice([rnd.randrange(n + 1), max(0, n - rnd.randint(1, 16)), rnd.randrange(min(n, 16) + 1)])
    return data[:cut], f"truncate to {cut} of {n}"


def insert_bytes(rnd: random.Random, data: bytes) -> tuple[bytes, str]:
    """Insert random bytes or a copy of a chunk of the file."""
    i = rnd.randrange(len(data) + 1)
    if data and rnd.random() < 0.5:
        a = rnd.randrange(len(data))
        chunk = data[a:a + rnd.randint(1, 64)]
        how = f"insert copy of [{a}:{a + len(chunk)}] at {i}"
    else:
        chunk = rnd.randbytes(rnd.choice([1, 2, 4, 8, rnd.randint(1, 64)]))
        how = f"insert {chunk!r} at {i}"
    return data[:i] + chunk + data[i:], how


def delete_bytes(rnd: random.Random, data: bytes) -> tuple[bytes, str]:
    """Delete a random range."""
    if not data:
        return data, "noop"
    i = rnd.randrange(len(data))
    n = rnd.choice([1, 2, 4, 8, rnd.randint(1, 64)])
    return data[:i] + data[i + n:], f"delete [{i}:{i + n}]"


def splice(rnd: random.Random, data: bytes, other: bytes) -> tuple[bytes, str]:
    """Head of this file, tail of another file of the same kind."""
    i, j = rnd.randrange(len(data) + 1), rnd.randrange(len(other) + 1)
    return data[:i] + other[j:], f"splice [:{i}] + other[{j}:]"


BYTE_MUTATORS: list[Callable[[random.Random, bytes], tuple[bytes, str]]] = [
    flip_bits, set_bytes, truncate, insert_bytes, delete_bytes]


# ----------------------------------------------------------------------------- .cg structure
def _cg_width(data: bytes) -> int:
    return {16: 2, 32: 4, 64: 8}.get(data[0], 8) if data else 8


def _cg_fields(suffix: str, data: bytes) -> list[tuple[int, int]]:
    """(byte offset, width) of the integer fields at record boundaries (headers) that a walk of the file finds."""
    w = _cg_width(data)
    fmt = {2: "<h", 4: "<i", 8: "<q"}[w]
    n = len(data)

    def get(off: int) -> int | None:
        return struct.unpack_from(fmt, data, off)[0] if off + w <= n else None

    fields: list[tuple[int, int]] = []
    pos = 1
    for _ in range(100000):
        if pos + w > n:
            break
        if suffix == ".cg":
            t, nin, nout = get(pos), get(pos + w), get(pos + 2 * w)
            if t is None or nin is None or nout is None:
                break
            fields += [(pos, w), (pos + w, w), (pos + 2 * w, w)]
            if t == 0:
                pos += 3 * w
            elif nin < 0 or nout < 0:
                break
            else:
                fields += [(pos + (3 + k) * w, w) for k in range(min(nin + nout, 64))]
                pos += (3 + nin + nout) * w
        elif suffix == ".cgio":
            t, cnt = get(pos), get(pos + w)
            if t is None or cnt is None or cnt < 0:
                break
            fields += [(pos, w), (pos + w, w)] + [(pos + (2 + k) * w, w) for k in range(min(cnt, 64))]
            pos += (2 + (2 * cnt if t == 3 else cnt)) * w
        elif suffix == ".cgc":
            t, length = get(pos), get(pos + w)
            if t is None or length is None or length < 0:
                break
            fields += [(pos, w), (pos + w, w)]
            data_at = pos + 2 * w
            if t != 9001 and data_at + 8 <= n:  # ndim and sizes are int64 whatever the width
                ndim = struct.unpack_from("<q", data, data_at)[0]
                fields += [(data_at + 8 * k, 8) for k in range(1 + max(0, min(ndim, 8)))]
            elif t == 9001:
                fields.append((data_at, 8))  # the JSON length
            pos = data_at + length
        else:  # .cgs
            head = [get(pos + k * w) for k in range(4)]
            if None in head or head[2] < 0 or head[3] < 0:  # type: ignore[operator]
                break
            fields += [(pos + k * w, w) for k in range(4)]
            pos += 4 * w + head[2] + head[3]  # type: ignore[operator]
    return [f for f in fields if f[0] + f[1] <= n]


def mutate_cg_int(rnd: random.Random, suffix: str, data: bytes) -> tuple[bytes, str]:
    """Set an integer field at a record boundary (type, count, length, index, ndim, size) to an interesting value."""
    fields = _cg_fields(suffix, data)
    w = _cg_width(data)
    if not fields or rnd.random() < 0.2:  # any aligned integer
        if len(data) <= w:
            return data, "noop"
        fields = [(1 + w * rnd.randrange((len(data) - 1) // w), w)]
    off, width = rnd.choice(fields)
    old = int.from_bytes(data[off:off + width], "little", signed=True)
    new = _interesting_int(rnd, 8 * width, old)
    return data[:off] + _pack(new, width) + data[off + width:], f"int{8 * width} at byte {off}: {old} -> {new}"


def mutate_cg_metadata(rnd: random.Random, data: bytes) -> tuple[bytes, str]:
    """Mutate the JSON of the .cgc metadata record (type 9001), fixing its lengths so the record still parses."""
    w = _cg_width(data)
    fmt = {2: "<h", 4: "<i", 8: "<q"}[w]
    pos, n = 1, len(data)
    while pos + 2 * w <= n:
        t, length = struct.unpack_from(fmt, data, pos)[0], struct.unpack_from(fmt, data, pos + w)[0]
        if length < 0:
            break
        body = pos + 2 * w
        if t == 9001 and body + 8 <= n:
            j = struct.unpack_from("<q", data, body)[0]
            if j < 0 or body + 8 + j > n:
                break
            try:
                new_doc, how = mutate_json_value(rnd, json.loads(data[body + 8:body + 8 + j]))
                text = _dump_json(rnd, new_doc)
            except (ValueError, RecursionError):
                break
            pad = -j % 8
            rest = data[body + 8 + j + pad:pos + 2 * w + length]
            new_pad = -len(text) % 8
            rec = struct.pack("<q", len(text)) + text + b"\0" * new_pad + rest
            head = data[:pos] + _pack(t, w) + _pack(len(rec), w)
            return head + rec + data[body + length:], f"metadata JSON: {how}"
        pos = body + length
    return mutate_cg_int(rnd, ".cgc", data)


# ----------------------------------------------------------------------------- JSON structure
def _random_json(rnd: random.Random, depth: int = 0) -> Any:
    kind = rnd.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rnd.random() < 0.5
    if kind == 2:
        return _huge_number(rnd)
    if kind == 3:
        return rnd.choice(["", "x", "float64", "int64", "ndarray", "v0", "o0", "\u0000", "\udcff"[:0] + "é✓",
                           "A" * rnd.randint(0, 300), "base64", "op", "const"])
    if kind == 4:
        return rnd.randint(-3, 3)
    if kind == 5:
        return rnd.uniform(-1e3, 1e3)
    if kind == 6:
        return [_random_json(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]
    if kind == 7:
        return {rnd.choice(["dtype", "shape", "ndarray", "base64", "op", "attrs", "inputs", "x", ""]):
                _random_json(rnd, depth + 1) for _ in range(rnd.randint(0, 3))}
    return {"ndarray": {"dtype": rnd.choice(["float64", "int8", "bool", "complex128", "object", "<U3"]),
                        "shape": [_huge_number(rnd) if rnd.random() < 0.3 else rnd.randint(0, 3)
                                  for _ in range(rnd.randint(0, 3))],
                        "base64": base64.b64encode(rnd.randbytes(rnd.randint(0, 24))).decode()}}


def _huge_number(rnd: random.Random) -> Any:
    return rnd.choice([10 ** 400, -(10 ** 400), 2 ** 63, 2 ** 64, -(2 ** 63) - 1, 2 ** 31, 1e308, -1e308,
                       float("nan"), float("inf"), float("-inf"), 5e-324, -0.0, 10 ** 18, 1 << 40])


def _paths(doc: Any, limit: int = 5000) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    stack: list[tuple[tuple[Any, ...], Any]] = [((), doc)]
    while stack and len(out) < limit:
        path, node = stack.pop()
        out.append(path)
        if isinstance(node, dict):
            stack += [((*path, k), v) for k, v in node.items()]
        elif isinstance(node, list):
            stack += [((*path, i), v) for i, v in enumerate(node)]
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def mutate_json_value(rnd: random.Random, doc: Any) -> tuple[Any, str]:
    """Replace, delete, duplicate or retype one value of a parsed JSON document (a deep copy is changed)."""
    doc = copy.deepcopy(doc)
    paths = _paths(doc)
    path = rnd.choice(paths)
    node = _get(doc, path)
    op = rnd.randrange(10)
    if op == 0 and path:  # delete it
        parent = _get(doc, path[:-1])
        del parent[path[-1]]
        return doc, f"delete {list(path)}"
    if op == 1 and isinstance(node, list) and node:  # duplicate / drop / reverse elements
        sub = rnd.randrange(3)
        if sub == 0:
            node.insert(rnd.randrange(len(node) + 1), copy.deepcopy(rnd.choice(node)))
        elif sub == 1:
            node.pop(rnd.randrange(len(node)))
        else:
            node.reverse()
        return doc, f"list op {sub} at {list(path)}"
    if op == 2 and isinstance(node, dict):  # add a key seen elsewhere
        keys = [p[-1] for p in paths if p and isinstance(p[-1], str)]
        key = rnd.choice(keys) if keys else "x"
        node[key] = _random_json(rnd)
        return doc, f"add key {key!r} at {list(path)}"
    if op == 3:  # swap in another value of the document
        other = copy.deepcopy(_get(doc, rnd.choice(paths)))
        new = other
    elif op == 4 and isinstance(node, (int, float)) and not isinstance(node, bool):
        new = _interesting_int(rnd, 64, int(node) if not isinstance(node, float) or math.isfinite(node) else 0)
    elif op == 5:
        new = _huge_number(rnd)
    elif op == 6 and rnd.random() < 0.1:  # deep nesting
        new = _nested(rnd.choice([100, 1000, 100000]))
    else:
        new = _random_json(rnd)
    if not path:
        return new, f"replace document by {_short(new)}"
    _get(doc, path[:-1])[path[-1]] = new
    return doc, f"replace {list(path)} by {_short(new)}"


class _Nested:
    """A marker for a list nested ``depth`` times (written as text: json.dumps would recurse)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth


def _nested(depth: int) -> Any:
    return _Nested(depth)


def _short(x: Any) -> str:
    if isinstance(x, _Nested):
        return f"[[...]] nested {x.depth} deep"
    text = repr(x)
    return text if len(text) < 80 else text[:77] + "..."


def _dump_json(rnd: random.Random, doc: Any) -> bytes:
    marks: dict[str, _Nested] = {}

    def default(o: Any) -> Any:
        if isinstance(o, _Nested):
            key = f"@@nested{len(marks)}@@"
            marks[key] = o
            return key
        raise TypeError(type(o).__name__)

    text = json.dumps(doc, default=default, allow_nan=True, separators=rnd.choice([(",", ":"), (", ", ": ")]))
    for key, o in marks.items():
        text = text.replace(json.dumps(key), "[" * o.depth + "]" * o.depth)
    return text.encode()


def mutate_json_file(rnd: random.Random, data: bytes) -> tuple[bytes, str]:
    """A structure-aware mutation of a JSON file (falls back to a byte mutation when it does not parse)."""
    try:
        doc = json.loads(data)
        new, how = mutate_json_value(rnd, doc)
        return _dump_json(rnd, new), how
    except (ValueError, RecursionError):  # not JSON, or nested too deep for Python's copy and dump
        return rnd.choice(BYTE_MUTATORS)(rnd, data)


# ----------------------------------------------------------------------------- GraphML structure
_NS = "http://graphml.graphdrawing.org/xmlns"


def mutate_graphml_file(rnd: random.Random, data: bytes) -> tuple[bytes, str]:
    """Mutate a GraphML document: data values (JSON-aware), node ids, edge ends, key types, elements."""
    try:
        root = ET.fromstring(data)
    except Exception:  # ParseError, and LookupError for an encoding a flipped bit made up
        return rnd.choice(BYTE_MUTATORS)(rnd, data)
    ET.register_namespace("", _NS)
    parents = {c: p for p in root.iter() for c in p}
    elems = list(root.iter())
    datas = [e for e in elems if e.tag.endswith("}data") or e.tag == "data"]
    nodes = [e for e in elems if e.tag.endswith("}node")]
    edges = [e for e in elems if e.tag.endswith("}edge")]
    keys = [e for e in elems if e.tag.endswith("}key")]
    ids = [n.get("id", "") for n in nodes]
    op = rnd.randrange(8)
    how = "noop"
    if op <= 2 and datas:
        d = rnd.choice(datas)
        text = d.text or ""
        try:
            new_doc, h = mutate_json_value(rnd, json.loads(text))
            new_text = _dump_json(rnd, new_doc).decode()
        except (ValueError, RecursionError):
            new_text = None
        if new_text is not None and op < 2:
            d.text = new_text
            how = f"data key={d.get('key')}: {h}"
        else:
            d.text = str(rnd.choice([_interesting_int(rnd, 64), _huge_number(rnd), "", "x", "v0", "o0", "-1",
                                     "Infinity", "NaN", "1e999", "[]", "{}", '"s"', "127", "0", "1", "2"]))
            how = f"data key={d.get('key')} text {text[:40]!r} -> {d.text[:40]!r}"
    elif op == 3 and nodes:
        n = rnd.choice(nodes)
        new = rnd.choice([*ids, "v-1", "o-1", "v99999999999999999999", "x", "", "v1.5", "o007", "v٣"])
        how = f"node id {n.get('id')} -> {new}"
        n.set("id", new)
    elif op == 4 and edges:
        e = rnd.choice(edges)
        end = rnd.choice(["source", "target"])
        new = rnd.choice([*ids, "v99999", "o-3"])
        how = f"edge {e.get('source')}->{e.get('target')}: {end} -> {new}"
        e.set(end, new)
    elif op == 5 and keys:
        k = rnd.choice(keys)
        new = rnd.choice(["int", "long", "float", "double", "boolean", "string", "bogus"])
        how = f"key {k.get('id')} attr.type {k.get('attr.type')} -> {new}"
        k.set("attr.type", new)
    elif op == 6 and len(elems) > 1:
        e = rnd.choice(elems[1:])
        p = parents[e]
        if rnd.random() < 0.5:
            p.remove(e)
            how = f"remove <{e.tag.split('}')[-1]} {dict(e.attrib)}>"
        else:
            p.append(copy.deepcopy(e))
            how = f"duplicate <{e.tag.split('}')[-1]} {dict(e.attrib)}>"
    elif nodes:  # swap the data of two nodes
        a, b = rnd.choice(nodes), rnd.choice(nodes)
        a_id, b_id = a.get("id"), b.get("id")
        a.set("id", b_id or "")
        b.set("id", a_id or "")
        how = f"swap node ids {a_id} <-> {b_id}"
    return ET.tostring(root, encoding="utf-8", xml_declaration=True), how


# ----------------------------------------------------------------------------- ONNX structure
_ONNX_OPS: list[str] = []


def _onnx_op_names() -> list[str]:
    if not _ONNX_OPS:
        import onnx.defs

        _ONNX_OPS.extend(sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain in ("", "ai.onnx")}))
    return _ONNX_OPS


def mutate_onnx_proto(rnd: random.Random, data: bytes) -> tuple[bytes, str]:
    """Mutate a ModelProto through the onnx API: node kinds, inputs, attributes, initializers, shapes, opsets."""
    import onnx
    from onnx import helper, numpy_helper

    try:
        m = onnx.load_from_string(data)
    except Exception:
        return rnd.choice(BYTE_MUTATORS)(rnd, data)
    g = m.graph
    names = [n for node in g.node for n in list(node.input) + list(node.output)] + [i.name for i in g.initializer]
    names += [i.name for i in g.input] + ["", "nonexistent"]
    op = rnd.randrange(14)
    how = "noop"
    node = rnd.choice(g.node) if len(g.node) else None
    if op == 0 and node is not None:
        new = rnd.choice(_onnx_op_names())
        how = f"node {node.name or node.output[0]!r}: op_type {node.op_type} -> {new}"
        node.op_type = new
    elif op == 1 and node is not None and len(node.input):
        i = rnd.randrange(len(node.input))
        how = f"node {node.op_type}: drop input {i}"
        del node.input[i]
    elif op == 2 and node is not None:
        new = rnd.choice(names)
        how = f"node {node.op_type}: add input {new!r}"
        node.input.insert(rnd.randrange(len(node.input) + 1), new)
    elif op == 3 and node is not None and len(node.input):
        i = rnd.randrange(len(node.input))
        new = rnd.choice(names)
        how = f"node {node.op_type}: input {i} {node.input[i]!r} -> {new!r}"
        node.input[i] = new
    elif op == 4 and node is not None and len(node.output):
        i = rnd.randrange(len(node.output))
        if rnd.random() < 0.5:
            how = f"node {node.op_type}: drop output {i}"
            del node.output[i]
        else:
            new = rnd.choice(names)
            how = f"node {node.op_type}: output {i} -> {new!r}"
            node.output[i] = new
    elif op == 5 and node is not None:
        if len(node.attribute) and rnd.random() < 0.7:
            a = rnd.choice(node.attribute)
            how = f"node {node.op_type}: attribute {a.name} " + _mutate_attribute(rnd, a)
        else:
            name = rnd.choice(["axis", "axes", "perm", "to", "keepdims", "alpha", "pads", "kernel_shape", "value",
                               "strides", "group", "mode", "shape", "dilations", "auto_pad", "batch_dims"])
            a = helper.make_attribute(name, rnd.choice([0, 1, -1, 1 << 40, [0, 1], [], 1.5, "x"]))
            node.attribute.append(a)
            how = f"node {node.op_type}: add attribute {name}"
    elif op == 6 and len(g.initializer):
        t = rnd.choice(g.initializer)
        how = f"initializer {t.name}: " + _mutate_tensor(rnd, t)
    elif op == 7 and (len(g.input) or len(g.output)):
        vi = rnd.choice(list(g.input) + list(g.output))
        tt = vi.type.tensor_type
        sub = rnd.randrange(4)
        if sub == 0:
            tt.elem_type = rnd.choice([0, 1, 2, 7, 8, 9, 10, 11, 14, 16, 17, 23, 40, 1 << 20])
            how = f"value_info {vi.name}: elem_type -> {tt.elem_type}"
        elif sub == 1 and len(tt.shape.dim):
            d = rnd.choice(tt.shape.dim)
            d.dim_value = _interesting_int(rnd, 64, d.dim_value) if rnd.random() < 0.8 else 0
            how = f"value_info {vi.name}: a dim -> {d.dim_value}"
        elif sub == 2:
            tt.shape.dim.add().dim_value = rnd.choice([0, 1, 3, -1, 1 << 40])
            how = f"value_info {vi.name}: add a dim"
        else:
            vi.ClearField("type")
            how = f"value_info {vi.name}: clear type"
    elif op == 8 and (len(g.input) or len(g.output)):
        lst = rnd.choice([g.input, g.output]) if len(g.input) and len(g.output) else (g.input or g.output)
        i = rnd.randrange(len(lst))
        how = f"drop graph {'input' if lst is g.input else 'output'} {lst[i].name}"
        del lst[i]
    elif op == 9 and len(g.node) > 1:
        nodes = list(g.node)
        sub = rnd.randrange(3)
        if sub == 0:
            nodes.reverse()
        elif sub == 1:
            nodes.insert(rnd.randrange(len(nodes) + 1), copy.deepcopy(rnd.choice(nodes)))
        else:
            nodes.pop(rnd.randrange(len(nodes)))
        del g.node[:]
        g.node.extend(nodes)
        how = f"node list op {sub} (reverse, duplicate, drop)"
    elif op == 10:
        v = rnd.choice([0, 1, 7, 13, 17, 18, 21, 23, 99, -1, 1 << 40])
        if len(m.opset_import):
            how = f"opset {m.opset_import[0].version} -> {v}"
            m.opset_import[0].version = v
            if rnd.random() < 0.2:
                m.opset_import[0].domain = rnd.choice(["ai.onnx.ml", "com.microsoft", "x"])
    elif op == 11 and node is not None:
        node.domain = rnd.choice(["ai.onnx.ml", "com.microsoft", "ai.onnx", "x", "ai.onnx.preview.training"])
        how = f"node {node.op_type}: domain -> {node.domain}"
    elif op == 12:  # a Constant node with a random tensor, fed to a random node
        arr = np.ones(rnd.choice([0, 1, 2, 3]), dtype=rnd.choice([np.float32, np.int64, np.bool_, np.complex64]))
        t = numpy_helper.from_array(arr.reshape(rnd.choice([(-1,), (1, -1)])), "k")
        _mutate_tensor(rnd, t)
        g.node.insert(0, helper.make_node("Constant", [], ["k_out"], value=t))
        if node is not None and len(node.input):
            node.input[rnd.randrange(len(node.input))] = "k_out"
        how = "insert a Constant node of a mutated tensor"
    else:
        how = "rename a value: " + _rename(rnd, g, names)
    with contextlib.suppress(Exception):
        return m.SerializeToString(), how
    return data, "noop (not serializable)"


def _rename(rnd: random.Random, g: Any, names: list[str]) -> str:
    old, new = rnd.choice(names), rnd.choice(names)
    for node in g.node:
        for lst in (node.input, node.output):
            for i, n in enumerate(lst):
                if n == old and rnd.random() < 0.5:
                    lst[i] = new
    return f"{old!r} -> {new!r} (some uses)"


def _mutate_attribute(rnd: random.Random, a: Any) -> str:
    from onnx import AttributeProto

    sub = rnd.randrange(5)
    if sub == 0 and a.type == AttributeProto.INT:
        a.i = _interesting_int(rnd, 64, a.i)
        return f"i -> {a.i}"
    if sub == 1 and a.type == AttributeProto.INTS:
        vals = list(a.ints)
        if vals and rnd.random() < 0.6:
            k = rnd.randrange(len(vals))
            vals[k] = _interesting_int(rnd, 64, vals[k])
        else:
            vals = vals[:-1] if vals and rnd.random() < 0.5 else [*vals, rnd.choice([0, 1, -1, 1 << 40])]
        del a.ints[:]
        a.ints.extend(v for v in vals if -(1 << 63) <= v < (1 << 63))
        return f"ints -> {list(a.ints)}"
    if sub == 2 and a.type == AttributeProto.FLOAT:
        a.f = rnd.choice([float("nan"), float("inf"), -1.0, 0.0, 1e38, 3e38])
        return f"f -> {a.f}"
    if sub == 3:  # wrong type
        new_type = rnd.choice([AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.STRING, AttributeProto.INTS,
                               AttributeProto.TENSOR, AttributeProto.GRAPH, AttributeProto.UNDEFINED])
        a.type = new_type
        return f"type -> {new_type}"
    a.name = rnd.choice(["", "axis", "bogus", "perm", "to"])
    return f"renamed -> {a.name!r}"


def _mutate_tensor(rnd: random.Random, t: Any) -> str:
    sub = rnd.randrange(5)
    if sub == 0 and len(t.dims):
        k = rnd.randrange(len(t.dims))
        t.dims[k] = rnd.choice([0, -1, t.dims[k] + 1, 1 << 31, 1 << 40, (1 << 62)])
        return f"dims -> {list(t.dims)}"
    if sub == 1:
        t.data_type = rnd.choice([0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 21, 23, 99])
        return f"data_type -> {t.data_type}"
    if sub == 2 and t.raw_data:
        t.raw_data = t.raw_data[:rnd.randrange(len(t.raw_data) + 1)]
        return f"raw_data truncated to {len(t.raw_data)}"
    if sub == 3:
        t.raw_data = rnd.randbytes(rnd.choice([0, 1, 3, 8, 16, 64]))
        return f"raw_data -> {len(t.raw_data)} random bytes"
    t.dims.append(rnd.choice([0, 1, 2, 1 << 33]))
    return f"dims -> {list(t.dims)}"


# ----------------------------------------------------------------------------- mutants
@dataclass
class Mutant:
    """A mutated file set and how it was made."""

    fmt: str
    seed: str
    files: Files
    how: list[str] = field(default_factory=list)


def mutate(rnd: random.Random, seed: Seed, seeds: list[Seed]) -> Mutant:
    """Apply 1-3 mutations (byte-level or structure-aware for the format) to a seed."""
    files = dict(seed.files)
    how: list[str] = []
    for _ in range(rnd.choice([1, 1, 1, 2, 3])):
        suffix = rnd.choice(sorted(files))
        data = files[suffix]
        try:
            data, h = _mutate_one(rnd, seed, seeds, suffix, data)
        except Exception as exc:  # a mutator's own bug must not pass for a loader's: fall back to bytes
            data, h = flip_bits(rnd, data)
            h += f" (structure-aware mutator failed: {type(exc).__name__}: {exc})"
        files[suffix] = data
        how.append(f"{suffix}: {h}")
    return Mutant(seed.fmt, seed.name, files, how)


def _mutate_one(rnd: random.Random, seed: Seed, seeds: list[Seed], suffix: str, data: bytes) -> tuple[bytes, str]:
    kind = rnd.random()
    if kind < 0.45:
        return rnd.choice(BYTE_MUTATORS)(rnd, data)
    if kind < 0.5:
        others = [s.files[suffix] for s in seeds if suffix in s.files and s is not seed] or [data]
        return splice(rnd, data, rnd.choice(others))
    if seed.fmt == "cg":
        if suffix == ".cgc" and rnd.random() < 0.3:
            return mutate_cg_metadata(rnd, data)
        return mutate_cg_int(rnd, suffix, data)
    if seed.fmt == "json":
        return mutate_json_file(rnd, data)
    if seed.fmt == "graphml":
        return mutate_graphml_file(rnd, data)
    return mutate_onnx_proto(rnd, data)


# ----------------------------------------------------------------------------- the check
class LoadTimeout(BaseException):
    """Raised by the alarm in a load that ran too long (a BaseException: loaders catch Exception)."""


@dataclass
class Outcome:
    """What loading a mutant did: ``ok``, ``graph_error`` (label: the class) or ``failure`` (label: a key)."""

    kind: str
    label: str
    detail: str = ""


def _where(exc: BaseException) -> str:
    """The innermost opgraph frame of the traceback (else the innermost frame): file:function:line."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/opgraph/" in f.filename.replace(os.sep, "/")]
    f = (ours or frames or [None])[-1]
    if f is None:
        return "?"
    path = f.filename.replace(os.sep, "/")
    short = path.split("/opgraph/", 1)[1] if "/opgraph/" in path else os.path.basename(path)
    return f"{short}:{f.name}:{f.lineno}"


def _root_cause(exc: BaseException) -> BaseException:
    seen = set()
    while exc.__cause__ is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__
    return exc


@contextlib.contextmanager
def guard(timeout: float) -> Iterator[None]:
    """Raise LoadTimeout in the block after ``timeout`` seconds (when signals are usable here)."""
    def on_alarm(signum: int, frame: Any) -> None:
        raise LoadTimeout(f"load took more than {timeout} s")

    try:
        old = signal.signal(signal.SIGALRM, on_alarm)
    except (ValueError, AttributeError):  # not the main thread, or no SIGALRM
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _one(fn: Callable[[], Any], timeout: float, mem_limit: int | None) -> Outcome:
    from opgraph.errors import GraphError

    started = time.perf_counter()
    tracing = mem_limit is not None and not tracemalloc.is_tracing()
    if tracing:
        tracemalloc.start()
    try:
        with guard(timeout):
            fn()
        outcome = Outcome("ok", "ok")
    except LoadTimeout:
        outcome = Outcome("failure", "hang", f"more than {timeout} s")
    except GraphError as exc:
        label = type(exc).__name__ + ("(unexpected)" if getattr(exc, "unexpected", False) else "")
        root = _root_cause(exc)
        if not isinstance(root, GraphError):  # a catch-all turned this one into a GraphError: say what it was
            label += f" <- {type(root).__name__} @ {_where(root)}"
        outcome = Outcome("graph_error", label, str(exc).splitlines()[0] if str(exc) else "")
    except Exception as exc:  # RecursionError and MemoryError included
        outcome = Outcome("failure", f"{type(exc).__name__} @ {_where(exc)}",
                          "".join(traceback.format_exception(exc)[-12:]))
    finally:
        if tracing:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    if tracing and mem_limit is not None and peak > mem_limit and outcome.kind != "failure":
        outcome = Outcome("failure", "memory", f"tracemalloc peak {peak} bytes > {mem_limit}")
    elapsed = time.perf_counter() - started
    if elapsed > timeout and outcome.kind != "failure":
        outcome = Outcome("failure", "hang", f"took {elapsed:.1f} s")
    return outcome


def write_files(m: Mutant, directory: str) -> str:
    """Write the mutant's files into ``directory``; returns the path to load."""
    for suffix, data in m.files.items():
        with open(os.path.join(directory, "m" + suffix), "wb") as f:
            f.write(data)
    return os.path.join(directory, "m" + (".cg" if m.fmt == "cg" else SUFFIX[m.fmt]))


def check(m: Mutant, directory: str, *, timeout: float = TIMEOUT_S, memory: bool = True) -> list[Outcome]:
    """Load the mutant through opgraph.io.load (and, for ONNX, from_onnx(bytes)); one Outcome per load."""
    import opgraph.io
    from opgraph.io.onnx import from_onnx

    path = write_files(m, directory)
    size = sum(len(d) for d in m.files.values())
    limit = MEM_FIXED + MEM_PER_BYTE * size if memory else None
    outs = [_one(lambda: opgraph.io.load(path), timeout, limit)]
    if m.fmt == "onnx":
        outs.append(_one(lambda: from_onnx(m.files[".onnx"]), timeout, limit))
    return outs


# ----------------------------------------------------------------------------- the driver
@dataclass
class Stats:
    """Counts of one format's run."""

    tried: int = 0
    ok: int = 0
    errors: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def add(self, outs: list[Outcome]) -> None:
        self.tried += 1
        for o in outs:
            if o.kind == "ok":
                self.ok += 1
            elif o.kind == "graph_error":
                self.errors[o.label] += 1
            else:
                self.failures[o.label] += 1

    def to_json(self) -> dict[str, Any]:
        return {"tried": self.tried, "ok": self.ok, "errors": dict(self.errors), "failures": dict(self.failures),
                "seconds": self.seconds}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Stats:
        return cls(d["tried"], d["ok"], Counter(d["errors"]), Counter(d["failures"]), d["seconds"])

    def merge(self, other: Stats) -> None:
        self.tried += other.tried
        self.ok += other.ok
        self.errors.update(other.errors)
        self.failures.update(other.failures)
        self.seconds += other.seconds


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label)[:80].strip("_")


def save_failure(out: Path, m: Mutant, o: Outcome, ident: str) -> Path | None:
    """Keep the first 3 files of each distinct failure, with how they were made and the traceback.

    GraphErrors that wrap another exception go to ``wrapped/`` instead of ``failures/``.
    """
    if o.kind == "ok" or (o.kind == "graph_error" and "<-" not in o.label and "(unexpected)" not in o.label):
        return None
    base = out / ("failures" if o.kind == "failure" else "wrapped") / m.fmt / _slug(o.label)
    if base.is_dir() and len(list(base.iterdir())) >= 3:
        return None
    d = base / ident
    d.mkdir(parents=True, exist_ok=True)
    write_files(m, str(d))
    (d / "README.txt").write_text(f"format: {m.fmt}\nseed: {m.seed}\nmutations:\n  " + "\n  ".join(m.how)
                                  + f"\nfailure: {o.label}\n{o.detail}\n")
    return d


def random_mutant(fmt: str, i: int, seeds: dict[str, list[Seed]], salt: int = 0) -> Mutant:
    """Mutant ``i`` of ``fmt`` for the random engine (reproducible from ``(salt, fmt, i)``)."""
    rnd = random.Random(f"{salt}:{fmt}:{i}")
    seed = rnd.choice(seeds[fmt])
    return mutate(rnd, seed, seeds[fmt])


def _worker_random(fmt: str, start: int, stop: int, out: Path, salt: int, memory: bool) -> None:
    seeds = make_seeds()
    stats = Stats()
    cur = out / "current" / fmt
    cur.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    progress = out / f"progress.{fmt}.json"
    for i in range(start, stop):
        m = random_mutant(fmt, i, seeds, salt)
        (cur / "index").write_text(str(i))
        outs = check(m, str(cur), memory=memory)
        stats.add(outs)
        for o in outs:
            save_failure(out, m, o, f"random_{i}")
        if (i - start) % 500 == 499 or i == stop - 1:
            stats.seconds = time.perf_counter() - t0
            progress.write_text(json.dumps({"next": i + 1, "stats": stats.to_json()}))


def _encode_set(files: Files) -> bytes:
    """Four .cg files as one atheris input: (uint32 length, bytes) per suffix."""
    return b"".join(struct.pack("<I", len(files[s])) + files[s] for s in CG_SUFFIXES)


def _decode_set(data: bytes) -> Files:
    files, pos = {}, 0
    for s in CG_SUFFIXES:
        n = struct.unpack_from("<I", data, pos)[0] if pos + 4 <= len(data) else 0
        pos += 4
        files[s] = data[pos:pos + n]
        pos += n
    return files


def _worker_atheris(fmt: str, runs: int, out: Path, salt: int, memory: bool) -> None:
    import atheris

    with atheris.instrument_imports(include=["opgraph"]):
        import opgraph.io
        import opgraph.io.cg
        import opgraph.io.formats
        import opgraph.io.jsonfmt
        import opgraph.io.nx
        import opgraph.io.onnx  # noqa: F401
    seeds = make_seeds()
    corpus = out / "corpus" / fmt
    corpus.mkdir(parents=True, exist_ok=True)
    for k, s in enumerate(seeds[fmt]):
        (corpus / f"seed{k}").write_bytes(_encode_set(s.files) if fmt == "cg" else next(iter(s.files.values())))
    cur = out / "current" / fmt
    cur.mkdir(parents=True, exist_ok=True)
    stats = Stats()
    t0 = time.perf_counter()
    progress = out / f"progress.{fmt}.json"
    suffix = SUFFIX.get(fmt, ".cg")

    def files_of(data: bytes) -> Files:
        return _decode_set(data) if fmt == "cg" else {suffix: data}

    def one_input(data: bytes) -> None:
        m = Mutant(fmt, "atheris", files_of(data), ["libFuzzer/atheris mutation"])
        outs = check(m, str(cur), memory=memory)
        stats.add(outs)
        for o in outs:
            save_failure(out, m, o, f"atheris_{stats.tried}")
        if stats.tried % 500 == 0 or stats.tried >= runs:
            stats.seconds = time.perf_counter() - t0
            progress.write_text(json.dumps({"next": stats.tried, "stats": stats.to_json()}))

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rnd = random.Random(seed ^ salt)
        if rnd.random() < 0.4:
            return atheris.Mutate(data, max_size)
        # libFuzzer's corpus drifts towards files rejected early: start from a pristine seed now and then
        current = rnd.choice(seeds[fmt]) if rnd.random() < 0.3 else Seed(fmt, "input", files_of(data))
        m = mutate(rnd, current, seeds[fmt])
        new = _encode_set(m.files) if fmt == "cg" else m.files[suffix]
        return new[:max_size]

    args = [sys.argv[0], str(corpus), f"-runs={runs}", "-timeout=0", "-rss_limit_mb=4096", f"-seed={salt + 1}",
            f"-artifact_prefix={out}/crash-{fmt}-", "-max_len=65536", "-print_final_stats=0", "-close_fd_mask=0"]
    atheris.Setup(args, one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()


def _run_format(fmt: str, n: int, out: Path, engine: str, salt: int, memory: bool) -> Stats:
    """Run the child for one format until ``n`` mutants are done, restarting it after a crash."""
    total = Stats()
    progress = out / f"progress.{fmt}.json"
    start = 0
    crashes = 0
    t0 = time.perf_counter()
    while start < n and crashes < 50:
        progress.unlink(missing_ok=True)
        (out / "current" / fmt / "index").unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--worker", fmt, "--start", str(start), "--stop", str(n), "--out", str(out),
               "--engine", engine, "--salt", str(salt)] + ([] if memory else ["--no-memory"])
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        state = json.loads(progress.read_text()) if progress.exists() else {"next": start, "stats": Stats().to_json()}
        done = Stats.from_json(state["stats"])
        total.merge(done)
        if engine == "atheris":
            if proc.returncode != 0:
                total.failures[f"crash (exit {proc.returncode})"] += 1
                crashes += 1
                (out / f"atheris-{fmt}-{crashes}.log").write_text(proc.stdout[-20000:])
                start += max(done.tried, 1) + 1
                continue
            break
        if proc.returncode == 0 and state["next"] >= n:
            break
        # The child died: the mutant it was loading is in current/<fmt>; keep it and go on after it.
        crashes += 1
        if not (out / "current" / fmt / "index").exists():
            raise RuntimeError(f"the {fmt} fuzzing process failed before its first load:\n{proc.stdout[-3000:]}")
        idx = int((out / "current" / fmt / "index").read_text())
        dest = out / "failures" / fmt / f"crash_exit_{proc.returncode}" / f"random_{idx}"
        dest.mkdir(parents=True, exist_ok=True)
        for p in (out / "current" / fmt).iterdir():
            shutil.copy(p, dest / p.name)
        (dest / "log.txt").write_text(proc.stdout[-20000:])
        total.tried += 1
        total.failures[f"crash (exit {proc.returncode})"] += 1
        start = idx + 1
    total.seconds = time.perf_counter() - t0
    return total


def report(fmt: str, s: Stats) -> str:
    """One format's counts as text."""
    lines = [f"{fmt}: {s.tried} files tried, {s.ok} loads OK, "
             f"{sum(s.errors.values())} GraphError, {sum(s.failures.values())} failures, {s.seconds:.0f} s"]
    lines += [f"    GraphError {k}: {v}" for k, v in s.errors.most_common()]
    lines += [f"    FAILURE {k}: {v}" for k, v in s.failures.most_common()]
    return "\n".join(lines)


def atheris_status() -> str | None:
    """None when atheris imports here, else why not."""
    try:
        import atheris  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module doc."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("n", nargs="?", type=int, default=100_000, help="mutated files per format")
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    p.add_argument("--engine", choices=["auto", "atheris", "random"], default="auto")
    p.add_argument("--out", default="fuzz-out", help="directory for failing files and progress")
    p.add_argument("--salt", type=int, default=0, help="seed of the random engine (and of libFuzzer)")
    p.add_argument("--no-memory", action="store_true", help="skip the tracemalloc bound (faster)")
    p.add_argument("--replay", nargs=2, metavar=("FORMAT", "INDEX"), help="rebuild one random mutant and load it")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--stop", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.worker:
        if a.engine == "atheris":
            _worker_atheris(a.worker, a.stop - a.start, out, a.salt, not a.no_memory)
        else:
            _worker_random(a.worker, a.start, a.stop, out, a.salt, not a.no_memory)
        return 0
    if a.replay:
        fmt, i = a.replay[0], int(a.replay[1])
        m = random_mutant(fmt, i, make_seeds(), a.salt)
        d = out / "replay" / f"{fmt}_{i}"
        d.mkdir(parents=True, exist_ok=True)
        print(f"seed {m.seed}; mutations:\n  " + "\n  ".join(m.how))
        for o in check(m, str(d)):
            print(o.kind, o.label, o.detail)
        print(f"files in {d}")
        return 0
    engine = a.engine
    if engine in ("auto", "atheris"):
        why = atheris_status()
        if why is not None:
            print(f"atheris is not available ({why}); using the random mutator "
                  "(pip install atheris, or the 'fuzz' extra, to use it)")
            engine = "random"
        else:
            engine = "atheris"
    out.mkdir(parents=True, exist_ok=True)
    print(f"engine: {engine}; {a.n} mutated files per format; failures go to {out / 'failures'}", flush=True)
    bad = 0
    for fmt in a.formats:
        s = _run_format(fmt, a.n, out, engine, a.salt, not a.no_memory)
        bad += sum(s.failures.values())
        print(report(fmt, s), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
