"""The JSON form: exact round trips, the JSON Schema, every error path, random graphs."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opgraph
from opgraph import FormatError, Graph, GraphBuilder, Symbols
from opgraph.io import load, save
from opgraph.io.jsonfmt import (
    decode_value,
    dumps_json,
    encode_array,
    encode_value,
    from_json_dict,
    load_json,
    loads_json,
    save_json,
    to_json_dict,
)

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "docs" / "graph.schema.json").read_text())
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
FIELDS = ("op_kind", "op_attr", "op_version", "in_ptr", "in_ids", "out_ptr", "out_ids", "value_type",
          "value_producer", "value_index", "types", "attrs", "constants", "inputs", "outputs", "updates",
          "symbols", "file_meta")


# ----------------------------------------------------------------------------- helpers
def validate_schema(doc: Any) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)


def exact(value: Any) -> Any:
    """A key that tells apart every bit of floats (NaN payloads, -0.0) and container types."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return ("np", value.dtype.str, np.asarray(value).tobytes())
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, complex):
        return ("complex", exact(value.real), exact(value.imag))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(exact(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((exact(k), exact(v)) for k, v in value.items()))
    return (type(value).__name__, value)


def assert_identical(a: Graph, b: Graph) -> None:
    """Equal as graphs, with names, and bit for bit in every table entry that is used."""
    assert a == b
    assert a.equals(b, check_names=True)
    assert a.symbols == b.symbols
    for name in ("op_kind", "op_version", "in_ptr", "in_ids", "out_ptr", "out_ids", "value_producer",
                 "value_index", "inputs", "outputs", "updates"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    for v in range(a.num_values):
        assert a.type_of(v) == b.type_of(v)
    for op in range(a.num_ops):
        assert exact(a.attrs[a.op_attr[op]]) == exact(b.attrs[b.op_attr[op]]), f"op {op}"
    assert len(a.constants) == len(b.constants)
    for ca, cb in zip(a.constants, b.constants, strict=True):
        assert exact(ca) == exact(cb)
    assert exact(a.file_meta) == exact(b.file_meta)


def roundtrip(g: Graph, tmp_path: Path, **options: Any) -> Graph:
    path = tmp_path / "g.json"
    save_json(g, path, **options)
    validate_schema(json.loads(path.read_text(encoding="utf-8")))
    back = load_json(path)
    assert_identical(g, back)
    # Writing the loaded graph again gives the same text: the form is canonical.
    assert dumps_json(back, **options) == dumps_json(g, **options)
    return back


def remake(g: Graph, **changes: Any) -> Graph:
    """A copy of ``g`` with some constructor arguments replaced."""
    kw = {name: getattr(g, name) for name in FIELDS}
    kw.update(changes)
    return Graph(**kw)


def permute_ops(g: Graph, perm: list[int]) -> Graph:
    """The same graph with op ``i`` renumbered ``perm[i]`` (value numbering unchanged)."""
    inv = np.argsort(perm)
    ins = [g.op_inputs(int(o)).tolist() for o in inv]
    outs = [g.op_outputs(int(o)).tolist() for o in inv]
    producer = np.array([perm[p] if p >= 0 else -1 for p in g.value_producer.tolist()])
    symbols = Symbols(dict(g.symbols.values), {perm[k]: v for k, v in g.symbols.ops.items()},
                      dict(g.symbols.constants), dict(g.symbols.descriptions), dict(g.symbols.io))
    return remake(g, op_kind=g.op_kind[inv], op_attr=g.op_attr[inv], op_version=g.op_version[inv],
                  in_ptr=np.cumsum([0] + [len(x) for x in ins]), in_ids=[v for x in ins for v in x],
                  out_ptr=np.cumsum([0] + [len(x) for x in outs]), out_ids=[v for x in outs for v in x],
                  value_producer=producer, symbols=symbols)


def small_graph() -> Graph:
    b = GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    s = b.input(("float64", ()), name="s")
    y = b.op("multiply", x, 2.0, name="y")
    total = b.op("sum", y, name="total")
    b.output(y, total)
    b.update(b.add(s, total), s)
    return b.freeze()


def nan_with_bits(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


# ----------------------------------------------------------------------------- round trips
def test_small_graph_round_trip_and_layout(tmp_path: Path) -> None:
    g = small_graph()
    back = roundtrip(g, tmp_path)
    text = (tmp_path / "g.json").read_text()
    doc = json.loads(text)
    assert doc["format"] == "opgraph" and doc["version"] == 1
    assert [d["value"] for d in doc["inputs"]] == ["%x", "%s"]
    assert doc["outputs"] == ["%y", "%total"] and doc["updates"] == [["%5", "%s"]]
    mult = doc["ops"][1]
    assert mult["op"] == "multiply" and mult["id"] == opgraph.get_op("multiply").id
    assert mult["inputs"] == ["%x", "%2"] and mult["version"] == 12 and mult["name"] == "y"
    assert mult["outputs"] == [{"value": "%y", "type": {"dtype": "float64", "shape": [3]}}]
    # One op per line.
    assert sum(1 for line in text.splitlines() if line.lstrip().startswith('{"op": ')) == g.num_ops
    res = back.run({"x": np.arange(3.0), "s": np.array(1.0)})
    assert [r.tolist() for r in res] == [[0.0, 2.0, 4.0], 6.0]


def test_save_load_dispatch_by_extension(tmp_path: Path) -> None:
    g = small_graph()
    save(g, tmp_path / "m.json", inline_limit=0)
    assert_identical(load(tmp_path / "m.json"), g)
    assert "base64" in (tmp_path / "m.json").read_text()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inline_limit", [0, 256])
def test_every_dtype_constants_and_inputs(dtype: str, inline_limit: int, tmp_path: Path) -> None:
    dt = np.dtype(dtype)
    rng = np.random.default_rng(7)
    if dt.kind == "b":
        values = [np.array(True), np.array([True, False, True]), rng.random((2, 3)) > 0.5]
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        values = [np.array(info.max, dt), np.array([info.min, 0, 1, info.max], dt),
                  rng.integers(info.min, info.max, (3, 4), dtype=dt, endpoint=True)]
    else:
        real = np.dtype(f"f{dt.itemsize // 2}") if dt.kind == "c" else dt
        fi = np.finfo(real)
        special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, fi.max, -fi.max, fi.tiny, fi.smallest_subnormal,
                            fi.eps, 0.1, 1 / 3], dtype=real)
        values = [np.array(-0.0, dt), special.astype(dt), (rng.standard_normal((3, 5)) * 1e3).astype(dt)]
        if dt.kind == "c":
            mixed = np.empty(len(special), dt)
            mixed.real, mixed.imag = special, special[::-1]
            values.append(mixed)
    values.append(np.zeros((0, 3), dt))
    b = GraphBuilder()
    x = b.input((dtype, (2, None)), name="x")
    outs = [b.constant(v) for v in values]
    b.output(x, *outs)
    g = b.freeze()
    back = roundtrip(g, tmp_path, inline_limit=inline_limit)
    doc = to_json_dict(g, inline_limit=inline_limit)
    forms = {("base64" in c) for c in doc["constants"] if math.prod(c["shape"])}
    assert forms == ({True} if inline_limit == 0 else {False})
    for c_in, c_out in zip(g.constants, back.constants, strict=True):
        assert c_out.dtype == c_in.dtype and c_out.shape == c_in.shape and c_out.tobytes() == c_in.tobytes()


def test_inline_floats_are_short_and_exact() -> None:
    enc = encode_array(np.array([0.1, 1 / 3, -0.0, np.inf, np.nan], np.float32))
    assert enc["data"][:1] == [0.1] and enc["data"][2:] == [-0.0, "inf", "nan"]
    assert encode_array(np.array([1 + 2j], np.complex128))["data"] == [[1.0, 2.0]]
    assert encode_array(np.array(True))["data"] is True
    # A NaN with a sign or payload cannot be written inline: the constant goes to base64, exactly.
    odd = np.array([1.0, nan_with_bits(0xFFF8000000000000), nan_with_bits(0x7FF0000000000123)])
    enc = encode_array(odd)
    assert "base64" in enc
    assert from_json_dict({"format": "opgraph", "version": 1, "constants": [enc]}).constants[0].tobytes() \
        == odd.tobytes()


def test_large_constants_are_base64_in_the_same_document(tmp_path: Path) -> None:
    b = GraphBuilder()
    big = np.random.default_rng(0).standard_normal((40, 50))
    c = b.constant(big, name="weights")
    b.output(b.op("sum", c))
    g = b.freeze()
    roundtrip(g, tmp_path)
    doc = json.loads((tmp_path / "g.json").read_text())
    (entry,) = doc["constants"]
    assert set(entry) == {"dtype", "shape", "base64", "name"} and entry["shape"] == [40, 50]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]  # no side files
    small = to_json_dict(g, inline_limit=2000)["constants"][0]
    assert "data" in small and len(small["data"]) == 40


def test_unknown_dims_and_rank(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.input(("float32", (None, 3)), name="x")
    r = b.input(("int64", None), name="r")
    y = b.op("exp", x)
    b.output(b.op("sum", y, axis=1, keepdims=True), b.op("negative", r), b.op("sum", r))
    roundtrip(b.freeze(), tmp_path)
    doc = to_json_dict(b.freeze())
    assert doc["inputs"][1]["type"] == {"dtype": "int64", "shape": None}
    assert doc["inputs"][0]["type"]["shape"] == [None, 3]


def test_multi_output_ops(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.input(("float64", (6,)), name="x")
    parts = b.op("split", x, sections=3)
    m = b.input(("float64", (3, 3)), name="m")
    w, v = b.op("eigh", m)
    q, r = b.op("qr", m)
    b.output(*parts, w, v, q, r)
    g = b.freeze()
    back = roundtrip(g, tmp_path)
    doc = to_json_dict(g)
    assert [len(op["outputs"]) for op in doc["ops"]] == [3, 2, 2]
    a = np.arange(9.0).reshape(3, 3)
    feeds = {"x": np.arange(6.0), "m": a + a.T}
    for r1, r2 in zip(g.run(feeds), back.run(feeds), strict=True):
        np.testing.assert_array_equal(r1, r2)


def test_attrs_of_every_shape(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.input(("float64", (4, 6)), name="x")
    img = b.input(("float32", (1, 2, 8, 8)), name="img")
    k = b.input(("float32", (3, 2, 3, 3)), name="k")
    ops = [
        b.op("getitem", x, index=(slice(None, None, -1), None, Ellipsis, 2)),
        b.op("getitem", x, index=(slice(1, 3), 0)),
        b.op("pad", x, pad_width=((1, 2), (0, 1)), constant_value=-0.0),
        b.op("pad", x, pad_width=((1, 1), (1, 1)), constant_value=np.nan),
        b.op("pad", x, pad_width=((0, 1), (0, 0)), constant_value=np.inf),
        b.op("pad", x, pad_width=((0, 1), (0, 0)), constant_value=-np.inf),
        b.op("pad", x, pad_width=((0, 1), (0, 0)), constant_value=5e-324),
        b.op("pad", x, pad_width=((0, 1), (0, 0)), mode="edge"),
        b.op("sum", x), b.op("sum", x, axis=(0, -1), keepdims=True),
        b.op("var", x, axis=1, correction=1.0), b.op("std", x, correction=0.5),
        b.op("cast", x, dtype="int8"), b.op("cast", x, dtype=np.complex64),
        b.op("einsum", x, x, subscripts="ij,ij->i"),
        b.op("tensordot", x, x, axes=((0,), (0,))), b.op("tensordot", x, x, axes=0),
        b.op("reshape", x, shape=(6, -1)), b.op("permute_dims", x, axes=(1, 0)),
        b.op("conv2d", img, k, stride=2, padding=1), b.op("max_pool2d", img, kernel_size=2),
        b.op("pinv", x), b.op("pinv", x, rtol=1e-3),
        b.op("argmax", x, axis=1), b.op("concat", x, x, axis=1), b.op("split", x, sections=(1, 3), axis=0),
    ]
    flat = []
    for o in ops:
        flat.extend(o if isinstance(o, tuple) else [o])
    b.output(*flat)
    g = b.freeze()
    roundtrip(g, tmp_path)
    doc = to_json_dict(g)
    attrs = {json.dumps(op["attrs"]) for op in doc["ops"]}
    assert '{"index": [{"list": [1]}' not in attrs  # tuples are plain arrays
    pad = next(op for op in doc["ops"] if op["op"] == "pad")
    assert pad["attrs"]["pad_width"] == [[1, 2], [0, 1]] and math.copysign(1, pad["attrs"]["constant_value"]) < 0
    values = [op["attrs"].get("constant_value") for op in doc["ops"] if op["op"] == "pad"]
    assert {"float": "nan"} in values and {"float": "inf"} in values and {"float": "-inf"} in values
    assert 5e-324 in values


def test_nan_attrs_with_sign_or_payload_are_bit_exact(tmp_path: Path) -> None:
    # Graph.equals compares attribute tuples with ==, under which a NaN equals only the same
    # object; so this checks the attribute bits directly.
    b = GraphBuilder()
    x = b.input(("float64", (2,)), name="x")
    odd = nan_with_bits(0xFFF8000000000001)
    b.output(b.op("pad", x, pad_width=((0, 1),), constant_value=odd))
    g = b.freeze()
    doc = to_json_dict(g)
    assert doc["ops"][0]["attrs"]["constant_value"] == {"float": "bits:fff8000000000001"}
    validate_schema(doc)
    back = loads_json(dumps_json(g))
    (value,) = [v for k, v in back.attrs_of(0).items() if k == "constant_value"]
    assert struct.pack("<d", value) == struct.pack("<d", odd)
    assert exact(back.attrs) == exact(g.attrs) and back.symbols == g.symbols


def test_names_descriptions_and_symbols(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.input(("float64", (2,)), name="x")
    y = b.input(("float64", (2,)), name="12")          # all digits: referred to by number
    z = b.op("add", x, y, name="a b%c")                # any text can be a name
    w = b.op("exp", z, name="é")
    c = b.constant(np.arange(3.0), name="table")
    b.describe("value", w.id, "exp of the sum")
    b.describe("op", 0, "the addition")
    b.describe("constant", 0, "a table")
    b.output(w, c)
    g = b.freeze()
    sym = g.symbols
    g = remake(g, symbols=Symbols(
        values={**sym.values, 99: "ghost"},                      # names of values that do not exist
        ops={**sym.ops, 7: "ghost op"}, constants=dict(sym.constants),
        descriptions={**sym.descriptions, ("io", 0): "input record", ("other", 3): "?"},
        io={0: "x_in", 2: "w_out"}))
    roundtrip(g, tmp_path)
    doc = to_json_dict(g)
    assert doc["inputs"][1] == {"value": "%1", "type": {"dtype": "float64", "shape": [2]}, "name": "12"}
    assert doc["ops"][0]["inputs"] == ["%x", "%1"] and doc["ops"][0]["description"] == "the addition"
    assert doc["ops"][1]["outputs"][0] == {"value": "%é", "type": {"dtype": "float64", "shape": [2]},
                                           "description": "exp of the sum"}
    assert doc["constants"][0]["name"] == "table" and doc["constants"][0]["description"] == "a table"
    assert doc["symbols"]["io"] == [[0, "x_in"], [2, "w_out"]] and doc["symbols"]["values"] == [[99, "ghost"]]
    assert "é" in dumps_json(g)  # UTF-8, not escaped


def test_duplicate_names_are_referred_to_by_number(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.input(("float64", (2,)))
    y = b.op("exp", x)
    b.output(y)
    g = b.freeze()
    g = remake(g, symbols=Symbols(values={0: "v", 1: "v"}))
    roundtrip(g, tmp_path)
    doc = to_json_dict(g)
    assert doc["inputs"][0]["value"] == "%0" and doc["inputs"][0]["name"] == "v"
    assert doc["ops"][0]["inputs"] == ["%0"]


def test_value_numbering_is_kept(tmp_path: Path) -> None:
    # A named op output created before a later input: named values do not ascend in file order.
    b = GraphBuilder()
    x = b.input(("float64", (2,)), name="x")
    y = b.op("exp", x, name="y")
    z = b.input(("float64", (2,)), name="z")
    b.output(b.op("add", y, z, name="s"))
    g = b.freeze()
    assert (x.id, y.id, z.id) == (0, 1, 2)
    back = roundtrip(g, tmp_path)
    assert back.find_value("z") == 2 and back.find_value("y") == 1
    doc = to_json_dict(g)
    assert [d.get("number") for d in doc["inputs"]] == [0, 2]


def test_op_numbering_that_is_not_topological_is_kept(tmp_path: Path) -> None:
    g = small_graph()
    h = permute_ops(g, [3, 2, 1, 0, 4][:g.num_ops])
    h.verify()
    assert not h.is_topologically_ordered()
    back = roundtrip(h, tmp_path)
    doc = to_json_dict(h)
    assert [op["index"] for op in doc["ops"]] == back.topological_order().tolist()
    assert "index" not in to_json_dict(g)["ops"][0]
    np.testing.assert_array_equal(back.run({"x": np.ones(3)})[0], g.run({"x": np.ones(3)})[0])


def test_file_meta(tmp_path: Path) -> None:
    meta = {"magic": 64, "encodings": (10001, 10001), "order": [1, 2], "nested": {"a": (1.5, None), 2: b"\x00\xff"},
            "array": np.arange(4, dtype=np.int32), "scalar": np.float32(0.25), "z": 1 - 2j,
            "weird": object(), 3: "non-string key"}
    g = remake(small_graph(), file_meta=meta)
    back = load_json(_saved(g, tmp_path))
    expected = {k: v for k, v in meta.items() if k not in ("weird", 3)}
    assert exact(back.file_meta) == exact(expected)
    assert isinstance(back.file_meta["order"], list) and isinstance(back.file_meta["encodings"], tuple)
    validate_schema(to_json_dict(g))


def test_void_type_round_trip() -> None:
    g = small_graph()
    types = [*g.types, opgraph.VOID]
    doc = to_json_dict(remake(g, types=types))  # an unused void entry does not matter
    assert doc == to_json_dict(g)
    from opgraph.io.jsonfmt.encoding import decode_type, type_json

    assert decode_type(type_json(opgraph.VOID), "t") is opgraph.VOID


def test_hand_written_document_infers_types_versions_and_defaults() -> None:
    doc = {
        "format": "opgraph", "version": 1,
        "inputs": [{"value": "%x", "type": {"dtype": "float32", "shape": [2, 3]}}],
        "constants": [{"dtype": "float32", "shape": [], "data": 2}],
        "ops": [
            {"op": "const", "attrs": {"index": 0}, "outputs": [{"value": "%two"}]},
            {"op": "multiply", "inputs": ["%x", "%two"], "outputs": [{"value": "%y"}]},
            {"op": "sum", "inputs": ["%y"], "attrs": {"axis": [1]}, "outputs": [{"value": "%s"}]},
        ],
        "outputs": ["%s"],
    }
    validate_schema(doc)
    g = from_json_dict(doc)
    b = GraphBuilder()
    x = b.input(("float32", (2, 3)), name="x")
    y = b.op("multiply", x, b.constant(np.float32(2), name="two"))
    b.name(y, "y")
    b.output(b.name(b.op("sum", y, axis=1), "s"))
    expected = b.freeze()
    assert g == expected
    assert g.run({"x": np.ones((2, 3), np.float32)})[0].tolist() == [6.0, 6.0]


def test_encode_decode_value_tags() -> None:
    v = (1, -0.0, float("nan"), (), ("a", None, True), [1, (2,)], {"k": 1.5}, {1: "x"}, 1 + 2j, b"\x00",
         np.arange(3.0), np.int16(-3))
    enc = encode_value(v)
    json.dumps(enc, allow_nan=False)
    back = decode_value(json.loads(json.dumps(enc)))
    assert exact(back) == exact(v)
    with pytest.raises(TypeError):
        encode_value({1, 2})
    with pytest.raises(ValueError, match=r"\[0\]: unknown tag"):
        decode_value([{"set": [1]}])


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=5),
                         st.floats(allow_nan=True, allow_infinity=True),
                         st.complex_numbers(allow_nan=True, allow_infinity=True),
                         st.integers(0, 2**64 - 1).map(lambda b: nan_with_bits(0x7FF0000000000000 | b | 1)),
                         st.binary(max_size=4))
values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=3), inner, max_size=3)), max_leaves=10)


@given(values)
@settings(max_examples=200, deadline=None)
def test_value_encoding_is_exact(v: Any) -> None:
    text = json.dumps(encode_value(v), allow_nan=False)
    assert exact(decode_value(json.loads(text))) == exact(v)


# ----------------------------------------------------------------------------- schema
def test_schema_is_valid_and_rejects_junk() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    good = to_json_dict(small_graph())
    assert validator.is_valid(good)
    for bad in ({**good, "version": 2}, {**good, "extra": 1}, {**good, "outputs": ["y"]},
                {**good, "constants": [{"dtype": "float64", "shape": [], "data": 1.0, "base64": ""}]},
                {**good, "ops": [{"op": "exp", "attrs": {"a": {"float": "NaN"}}}]},
                {**good, "inputs": [{"value": "%x", "type": {"dtype": "float128", "shape": []}}]}):
        assert not validator.is_valid(bad)


# ----------------------------------------------------------------------------- errors
def _saved(g: Graph, tmp_path: Path, name: str = "g.json") -> Path:
    path = tmp_path / name
    save_json(g, path)
    return path


def _load_error(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "bad.json"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(FormatError) as info:
        load_json(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: "), msg
    return msg[len(str(path)) + 2:]


def _doc() -> dict[str, Any]:
    return json.loads(dumps_json(small_graph()))


def _edit(path: str, value: Any) -> Any:
    """A mutator setting the item at a dotted/indexed path of the document."""
    def mutate(doc: dict[str, Any]) -> dict[str, Any]:
        keys = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
        target = doc
        for k in keys[:-1]:
            target = target[k]
        if value is _DELETE:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value
        return doc
    return mutate


_DELETE = object()


@pytest.mark.parametrize("text, where, message", [
    ('{"format": "opgraph", ', "malformed JSON at line 1", "Expecting"),
    (b'{"format": "opgraph\xff"}', "not UTF-8", "byte"),
    ('{"format": "opgraph", "version": NaN}', "NaN is not JSON", ""),
    ('{"format": "opgraph", "format": "opgraph"}', "duplicate key 'format'", ""),
    ("[1, 2]", "(top level)", "expected an opgraph document"),
    ('{"format": "onnx", "version": 1}', "format:", "not an opgraph JSON graph"),
    ('{"format": "opgraph", "version": 3}', "version:", "unsupported version 3"),
    ('{"format": "opgraph", "version": "1"}', "version:", "unsupported version"),
    ('[' * 100000 + ']' * 100000, "", "nested too deeply"),
])
def test_malformed_files(tmp_path: Path, text: str, where: str, message: str) -> None:
    msg = _load_error(tmp_path, text)
    assert where in msg and message in msg, msg


@pytest.mark.parametrize("mutate, where, message", [
    (_edit("extra", 1), "extra", "unknown key 'extra'"),
    (_edit("ops[1].op", "frobnicate"), "ops[1].op", "unknown op kind 'frobnicate'"),
    (_edit("ops[1].id", 5), "ops[1].id", "kind id 5 disagrees"),
    (_edit("ops[1]", [1]), "ops[1]", "expected an op"),
    (_edit("ops[1].colour", "red"), "ops[1].colour", "unknown key"),
    (_edit("ops[1].inputs[1]", "%nope"), "ops[1].inputs[1]", "unknown value ref '%nope'"),
    (_edit("ops[1].inputs[1]", "%77"), "ops[1].inputs[1]", "unknown value ref '%77'"),
    (_edit("ops[1].inputs[0]", 3), "ops[1].inputs[0]", "expected a value ref"),
    (_edit("outputs[1]", "%ghost"), "outputs[1]", "unknown value ref"),
    (_edit("updates[0]", ["%5"]), "updates[0]", "expected an array of 2 items"),
    (_edit("updates[0][1]", "%q"), "updates[0][1]", "unknown value ref"),
    (_edit("inputs[0].type", "f64[3]"), "inputs[0].type", "expected a type object"),
    (_edit("inputs[0].type.dtype", "float128"), "inputs[0].type.dtype", "unsupported dtype 'float128'"),
    (_edit("inputs[0].type.shape", [-1]), "inputs[0].type.shape[0]", "invalid dimension -1"),
    (_edit("inputs[0].type.shape", [True]), "inputs[0].type.shape[0]", "invalid dimension True"),
    (_edit("inputs[0].type", _DELETE), "inputs[0]", "an input needs a 'type'"),
    (_edit("inputs[0].value", "x"), "inputs[0].value", "starts with '%'"),
    (_edit("inputs[0].value", "%007"), "inputs[0].value", "leading zeros"),
    (_edit("inputs[1].value", "%x"), "inputs[1].value", "ref '%x' is defined twice"),
    (lambda d: _edit("inputs[1].number", 1)(_edit("inputs[0].number", 1)(d)), "inputs[1]",
     "value number 1 is defined twice (first at inputs[0])"),
    (_edit("inputs[1].number", 60), "inputs[1]", "value number 60 is out of range"),
    (_edit("inputs[1].name", "t"), "inputs[1].name", "disagrees with ref '%s'"),
    (_edit("ops[0].outputs[0].value", "%5"), "ops[3].outputs[0]", "value number 5 is defined twice"),
    (_edit("ops[0].outputs[0].type.shape", [2]), "ops[0]", "graph fails verification"),
    (_edit("ops[1].outputs[0].type.dtype", "float32"), "ops[1]", "the type rule gives"),
    (_edit("ops[1].version", 3), "ops[1]", "version 3, the inputs select 12"),
    (_edit("ops[1].version", 2**40), "ops[1].version", "out of range"),
    (_edit("ops[1].version", 1.5), "ops[1].version", "expected a version"),
    (_edit("ops[2].attrs.axes", 1), "ops[2].attrs.axes", "sum has no attribute 'axes'"),
    (_edit("ops[2].attrs.axis", "rows"), "ops[2].attrs.axis", "invalid value 'rows'"),
    (_edit("ops[2].attrs.axis", {"set": [0]}), "ops[2].attrs.axis", "unknown tag 'set'"),
    (_edit("ops[2].attrs.axis", {"float": "NaN"}), "ops[2].attrs.axis.float", "expected 'nan'"),
    (_edit("ops[2].attrs.axis", {"a": 1, "b": 2}), "ops[2].attrs.axis", "exactly one key"),
    (_edit("ops[2].attrs.axis", "@1e400"), "ops[2].attrs.axis", "number out of range"),
    (_edit("ops[2].attrs.axis", float("inf")), "", "Infinity is not JSON"),
    (_edit("ops[0].attrs.index", 4), "ops[0]", "constant index 4 not in the constants table"),
    (_edit("ops[1].index", 9), "ops[1].index", "op number 9 is out of range"),
    (_edit("constants[0].dtype", "object"), "constants[0].dtype", "unsupported dtype 'object'"),
    (_edit("constants[0].shape", [2]), "constants[0].data", "data do not match shape [2]"),
    (_edit("constants[0].shape", [-2]), "constants[0].shape[0]", "invalid dimension -2"),
    (_edit("constants[0].data", "two"), "constants[0].data", "expected a number, 'nan', 'inf' or '-inf'"),
    (_edit("constants[0].data", [2.0]), "constants[0].data", "expected a scalar"),
    (_edit("constants[0]", {"dtype": "float32", "shape": [], "data": 1e39}), "constants[0].data",
     "1e+39 is out of range for float32"),
    (_edit("constants[0].data", "@1e400"), "constants[0].data", "number out of range"),
    (_edit("constants[0].base64", "AAAA"), "constants[0]", "exactly one of 'data' and 'base64'"),
    (_edit("constants[0]", {"dtype": "float64", "shape": [], "base64": "AAAA"}), "constants[0].base64",
     "3 bytes of data for 1 float64 elements"),
    (_edit("constants[0]", {"dtype": "int8", "shape": [1], "base64": "!!"}), "constants[0].base64",
     "invalid base64"),
    (_edit("constants[0]", {"dtype": "bool", "shape": [1], "base64": "Ag=="}), "constants[0].base64",
     "bytes 0 and 1"),
    (_edit("constants[0]", {"dtype": "int8", "shape": [2], "data": [1, 300]}), "constants[0].data[1]",
     "300 is out of range for int8"),
    (_edit("constants[0]", {"dtype": "int8", "shape": [2], "data": [1, 2.0]}), "constants[0].data[1]",
     "expected an integer"),
    (_edit("constants[0]", {"dtype": "bool", "shape": [1], "data": [1]}), "constants[0].data[0]",
     "expected true or false"),
    (_edit("constants[0]", {"dtype": "complex64", "shape": [1], "data": [1.0]}), "constants[0].data[0]",
     "data do not match shape [1, 2]"),
    (_edit("constants[0]", {"dtype": "float64", "shape": [], "data": 1.0, "fill": 0}), "constants[0].fill",
     "unknown key"),
    (_edit("symbols", {"io": [[0]]}), "symbols.io[0]", "expected an array of 2 items"),
    (_edit("symbols", {"values": [[0, "again"]]}), "symbols.values[0]", "values 0 is named twice"),
    (_edit("symbols", {"colours": []}), "symbols.colours", "unknown key"),
    (_edit("file_meta", {"k": {"bytes": "!"}}), "file_meta.k.bytes", "invalid base64"),
])
def test_every_error_names_the_json_path(tmp_path: Path, mutate: Any, where: str, message: str) -> None:
    msg = _load_error(tmp_path, json.dumps(mutate(_doc())).replace('"@1e400"', "1e400"))
    assert msg.startswith(where + ":") if where else "\n" not in msg, msg
    assert message in msg, msg
    assert "\n" not in msg.split("graph fails verification")[0]


def test_verification_failure_chains_the_verify_error(tmp_path: Path) -> None:
    doc = _edit("ops[1].version", 3)(_doc())
    with pytest.raises(FormatError) as info:
        loads_json(json.dumps(doc), source="m.json")
    assert isinstance(info.value.__cause__, opgraph.VerifyError)
    assert info.value.__cause__.problems == ["op 1 (multiply): version 3, the inputs select 12"]


def test_output_types_that_cannot_be_inferred(tmp_path: Path) -> None:
    doc = _doc()
    doc["ops"][1]["outputs"][0].pop("type")
    doc["ops"][2]["outputs"][0].pop("type")
    doc["ops"][1]["inputs"] = ["%x", "%total"]  # a forward ref to a value whose type is not known yet
    msg = _load_error(tmp_path, json.dumps(doc))
    assert msg.startswith("ops[1].inputs[1]:") and "not known here" in msg
    doc["ops"][1]["inputs"] = ["%x"]
    msg = _load_error(tmp_path, json.dumps(doc))
    assert msg.startswith("ops[1]:") and "type rule rejects" in msg


def test_loading_never_unpickles(tmp_path: Path) -> None:
    doc = _doc()
    doc["constants"][0] = {"dtype": "object", "shape": [], "base64": "gASVAAAAAAAAAAA="}
    assert "unsupported dtype 'object'" in _load_error(tmp_path, json.dumps(doc))


def test_saving_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    g = small_graph()
    bad_attrs = list(g.attrs)
    bad_attrs[int(g.op_attr[2])] = (("axis", None), ("keepdims", {1, 2}))
    with pytest.raises(ValueError, match=r"op 2 \(sum\): cannot encode set"):
        to_json_dict(remake(g, attrs=bad_attrs))
    with pytest.raises(opgraph.VerifyError):
        to_json_dict(remake(g, outputs=[99]))
    with pytest.raises(ValueError):
        to_json_dict(g, inline_limit=-1)
    assert not (tmp_path / "g.json").exists()


def test_save_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _saved(small_graph(), tmp_path)
    before = path.read_bytes()
    g = small_graph()
    bad_attrs = list(g.attrs)
    bad_attrs[int(g.op_attr[2])] = (("axis", object()),)
    with pytest.raises(ValueError):
        save_json(remake(g, attrs=bad_attrs), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]


# ----------------------------------------------------------------------------- random graphs
UNARY = ["negative", "abs", "exp", "tanh", "sin", "square", "sqrt", "sigmoid", "floor"]
BINARY = ["add", "subtract", "multiply", "maximum", "minimum", "divide", "hypot"]
REDUCE = ["sum", "max", "min", "mean", "prod"]


@st.composite
def random_graphs(draw: st.DrawFn) -> tuple[Graph, dict[str, np.ndarray]]:
    dtype = draw(st.sampled_from(["float32", "float64"]))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    b = GraphBuilder(hash_cons=draw(st.booleans()))
    n_inputs = draw(st.integers(1, 3))
    pool = [b.input((dtype, shape), name=f"in{i}") for i in range(n_inputs)]
    for _ in range(draw(st.integers(1, 10))):
        choice = draw(st.sampled_from(["unary", "binary", "const", "reduce"]))
        same_shape = [v for v in pool if v.shape == shape]
        if choice == "unary":
            v = b.op(draw(st.sampled_from(UNARY)), draw(st.sampled_from(pool)))
        elif choice == "binary":
            first = draw(st.sampled_from(pool))
            second = draw(st.sampled_from([v for v in pool if v.shape in (first.shape, ())]))
            v = b.op(draw(st.sampled_from(BINARY)), first, second)
        elif choice == "const":
            value = draw(st.floats(-4, 4, width=32, allow_subnormal=False) | st.sampled_from([-0.0, np.nan, np.inf]))
            v = b.op("multiply", draw(st.sampled_from(same_shape)), np.array(value, dtype))
        else:
            axis = draw(st.sampled_from([None, 0, -1]))
            v = b.op(draw(st.sampled_from(REDUCE)), draw(st.sampled_from(same_shape)), axis=axis,
                     keepdims=draw(st.booleans()))
        if v.name is None and draw(st.booleans()):
            b.name(v, f"v{v.id}")
        pool.append(v)
    outs = draw(st.lists(st.sampled_from(pool[n_inputs:]), min_size=1, max_size=3))
    b.output(*outs)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    feeds = {f"in{i}": rng.standard_normal(shape).astype(dtype) for i in range(n_inputs)}
    return b.freeze(), feeds


@given(random_graphs(), st.sampled_from([0, 4, 256]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_graphs_round_trip_and_compute_the_same(case: tuple[Graph, dict[str, np.ndarray]],
                                                       inline_limit: int) -> None:
    g, feeds = case
    text = dumps_json(g, inline_limit=inline_limit)
    validate_schema(json.loads(text))
    back = loads_json(text)
    assert_identical(g, back)
    with np.errstate(all="ignore"):
        expected, got = g.run(feeds), back.run(feeds)
    for e, r in zip(expected, got, strict=True):
        assert e.dtype == r.dtype and e.shape == r.shape
        np.testing.assert_array_equal(e, r)
