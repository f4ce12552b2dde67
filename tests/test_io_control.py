"""Storing control flow: subgraph bodies in JSON (version 2 ``subgraphs``) and .cg (record type 9002).

Every control op (call, cond, while_loop, scan) and nested bodies round-trip
through both formats: the graph loads back equal, bodies keep their names
and are shared (one object, one record, however many ops use them), and the
loaded graph computes what plain NumPy loops compute. Broken files (bad
references, truncated or flipped subgraph records, a record type from a newer
opgraph) are one clear FormatError; formats that cannot hold bodies say so.
"""

from __future__ import annotations

import json
import random
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import opgraph
import opgraph.io
from opgraph.core.subgraph import Subgraph
from opgraph.errors import FormatError, GraphError
from opgraph.io.cg import METADATA_RECORD, SUBGRAPH_RECORD, load_cg, save_cg
from opgraph.io.formats import UnsupportedGraphError
from opgraph.io.jsonfmt import dumps_json, from_json_dict, load_json, loads_json, save_json, to_json_dict

F64 = "float64"


# ----------------------------------------------------------------------------- graphs
def body(name: str, params: list[tuple[str, Any]], fn: Callable[..., Any]) -> Subgraph:
    sb = opgraph.GraphBuilder()
    xs = [sb.input(t, name=n) for n, t in params]
    outs = fn(sb, *xs)
    sb.output(*(outs if isinstance(outs, tuple) else (outs,)))
    return Subgraph(sb.freeze(), name=name)


def square() -> Subgraph:
    return body("square", [("x", (F64, (3,)))], lambda sb, x: sb.multiply(x, x))


def call_graph(uses: int = 3) -> opgraph.Graph:
    sq = square()
    b = opgraph.GraphBuilder()
    v = b.input((F64, (3,)), name="x")
    for _ in range(uses):
        v = b.op("call", b.multiply(v, 0.5), body=sq)
    b.output(v)
    return b.freeze()


def call_ref(x: np.ndarray, uses: int = 3) -> list[np.ndarray]:
    for _ in range(uses):
        x = (x * 0.5) ** 2
    return [x]


def cond_graph() -> opgraph.Graph:
    then_b = body("double", [("x", (F64, (3,))), ("y", (F64, ()))], lambda sb, x, y: sb.multiply(x, y))
    else_b = body("shift", [("x", (F64, (3,))), ("y", (F64, ()))], lambda sb, x, y: sb.subtract(sb.negative(x), y))
    b = opgraph.GraphBuilder()
    x, y = b.input((F64, (3,)), name="x"), b.input((F64, ()), name="y")
    pred = b.op("greater", b.sum(x), 0.0)
    b.output(b.op("cond", pred, x, y, then_body=then_b, else_body=else_b))
    return b.freeze()


def cond_ref(x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    return [x * y if x.sum() > 0 else -x - y]


def while_graph() -> opgraph.Graph:
    cond_b = body("below", [("limit", (F64, ())), ("i", (F64, ())), ("v", (F64, (3,)))],
                  lambda sb, limit, i, v: sb.op("less", i, limit))
    step = body("halve", [("limit", (F64, ())), ("i", (F64, ())), ("v", (F64, (3,)))],
                lambda sb, limit, i, v: (sb.add(i, 1.0), sb.add(sb.multiply(v, 0.5), 1.0), sb.sum(v)))
    b = opgraph.GraphBuilder()
    limit, v = b.input((F64, ()), name="limit"), b.input((F64, (3,)), name="v")
    i, v2, ys = b.op("while_loop", limit, b.multiply(limit, 0.0), v, cond_body=cond_b, body=step, num_consts=1)
    b.output(i, v2, ys)
    return b.freeze()


def while_ref(limit: np.ndarray, v: np.ndarray) -> list[np.ndarray]:
    i, ys = 0.0, []
    while i < limit:
        ys.append(v.sum())
        i, v = i + 1.0, v * 0.5 + 1.0
    return [np.float64(i), v, np.array(ys)]


def scan_graph() -> opgraph.Graph:
    cell = body("cell", [("c", (F64, (2,))), ("h", (F64, (2,))), ("x", (F64, (2,)))],
                lambda sb, c, h, x: (lambda h2: (h2, h2, sb.sum(h2)))(sb.tanh(sb.add(sb.multiply(h, c), x))))
    b = opgraph.GraphBuilder()
    c, h, xs = b.input((F64, (2,)), name="c"), b.input((F64, (2,)), name="h"), b.input((F64, (5, 2)), name="xs")
    b.output(*b.op("scan", c, h, xs, body=cell, num_consts=1, num_carry=1, reverse=True))
    return b.freeze()


def scan_ref(c: np.ndarray, h: np.ndarray, xs: np.ndarray) -> list[np.ndarray]:
    hs, sums = np.zeros_like(xs), np.zeros(len(xs))
    for t in range(len(xs) - 1, -1, -1):
        h = np.tanh(h * c + xs[t])
        hs[t], sums[t] = h, h.sum()
    return [h, hs, sums]


def nested_graph() -> opgraph.Graph:
    """A scan whose body runs a cond whose branches call one shared body (used at three depths)."""
    sq = square()
    pos = body("pos", [("v", (F64, (3,)))], lambda sb, v: sb.op("call", v, body=sq))
    neg = body("neg", [("v", (F64, (3,)))], lambda sb, v: sb.negative(sb.op("call", v, body=sq)))
    step = body("step", [("h", (F64, (3,))), ("x", (F64, ()))], lambda sb, h, x: (
        (lambda r: (sb.multiply(r, 0.25), sb.sum(r)))(
            sb.op("cond", sb.op("greater", x, 0.0), sb.add(h, x), then_body=pos, else_body=neg))))
    b = opgraph.GraphBuilder()
    h, xs = b.input((F64, (3,)), name="h"), b.input((F64, (4,)), name="xs")
    carry, ys = b.op("scan", h, xs, body=step, num_carry=1)
    b.output(b.op("call", carry, body=sq), ys)
    return b.freeze()


def nested_ref(h: np.ndarray, xs: np.ndarray) -> list[np.ndarray]:
    ys = []
    for x in xs:
        r = (h + x) ** 2 if x > 0 else -((h + x) ** 2)
        h = r * 0.25
        ys.append(r.sum())
    return [h ** 2, np.array(ys)]


RNG = np.random.default_rng(0)
CASES: dict[str, tuple[Callable[[], opgraph.Graph], Callable[..., list[np.ndarray]], list[dict[str, np.ndarray]]]] = {
    "call": (call_graph, call_ref, [{"x": RNG.normal(size=3)}]),
    "cond": (cond_graph, cond_ref, [{"x": np.array([1.0, 2.0, 0.5]), "y": np.array(3.0)},
                                    {"x": np.array([-1.0, -2.0, 0.5]), "y": np.array(3.0)}]),
    "while_loop": (while_graph, while_ref, [{"limit": np.array(4.0), "v": RNG.normal(size=3)},
                                            {"limit": np.array(0.0), "v": RNG.normal(size=3)}]),
    "scan": (scan_graph, scan_ref, [{"c": RNG.normal(size=2), "h": RNG.normal(size=2), "xs": RNG.normal(size=(5, 2))}]),
    "nested": (nested_graph, nested_ref, [{"h": RNG.normal(size=3), "xs": np.array([1.0, -0.5, 0.25, -2.0])}]),
}


def save_load(g: opgraph.Graph, fmt: str, tmp_path: Path) -> opgraph.Graph:
    path = tmp_path / ("m.json" if fmt == "json" else "m.cg")
    opgraph.io.save(g, path)
    return opgraph.io.load(path)


def cg_records(path: Path) -> list[tuple[int, int, int]]:
    """(type, byte offset of the record, data length) of each .cgc record."""
    data = path.read_bytes()
    w = data[0] // 8
    fmt = {2: "<h", 4: "<i", 8: "<q"}[w]
    out, pos = [], 1
    while pos < len(data):
        t = struct.unpack(fmt, data[pos:pos + w])[0]
        n = struct.unpack(fmt, data[pos + w:pos + 2 * w])[0]
        out.append((t, pos, n))
        pos += 2 * w + n
    return out


# ----------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("fmt", ["json", "cg"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_equal_and_computes_the_same(case: str, fmt: str, tmp_path: Path) -> None:
    make, ref, feeds = CASES[case]
    g = make()
    h = save_load(g, fmt, tmp_path)
    assert h.equals(g, check_names=True)
    assert [s.name for s in h.subgraphs] == [s.name for s in g.subgraphs]
    for s, t in zip(opgraph.core.subgraph.subgraphs_of(h, recursive=True),
                    opgraph.core.subgraph.subgraphs_of(g, recursive=True), strict=True):
        assert s.name == t.name and s == t
        assert s.graph.equals(t.graph, check_names=True)
    for feed in feeds:
        want = ref(*feed.values())
        got_g, got_h = g.run(feed), h.run(feed)
        for a, b, r in zip(got_g, got_h, want, strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(b, r, rtol=1e-12, atol=1e-12)


def test_while_loop_trip_count_is_data_dependent_after_load(tmp_path: Path) -> None:
    h = save_load(while_graph(), "cg", tmp_path)
    for n in (0, 1, 7):
        i, _, ys = h.run({"limit": np.array(float(n)), "v": np.ones(3)})
        assert i == n and ys.shape == (n,)


@pytest.mark.parametrize("fmt", ["json", "cg"])
def test_nested_bodies_load_as_one_shared_object(fmt: str, tmp_path: Path) -> None:
    """'square' is used by the top graph and by two bodies inside a body: one record, one object after load."""
    h = save_load(nested_graph(), fmt, tmp_path)
    found: dict[str, list[Subgraph]] = {}
    for s in opgraph.core.subgraph.subgraphs_of(h, recursive=True):
        for t in (s, *opgraph.core.subgraph.subgraphs_of(s.graph)):
            found.setdefault(t.name, []).append(t)
    assert sorted(found) == ["neg", "pos", "square", "step"]
    squares = found["square"]
    assert len(squares) == 3 and all(t is squares[0] for t in squares)


def test_body_used_by_three_ops_is_written_once(tmp_path: Path) -> None:
    one, three = call_graph(1), call_graph(3)
    assert len(three.subgraphs) == 1
    # JSON: one record, and the text grows by two ops, not by two bodies.
    doc1, doc3 = to_json_dict(one), to_json_dict(three)
    assert doc1["version"] == doc3["version"] == 2 and len(doc3["subgraphs"]) == 1
    assert dumps_json(three).count('"name": "square"') == 1
    ops_text = [json.dumps(o) for o in doc3["ops"] if o["op"] == "call"]
    assert len(ops_text) == 3 and all('"body": {"subgraph": 0}' in t for t in ops_text)
    # .cg: one subgraph record; the files grow by the two extra ops' records only.
    sizes = {}
    for name, g in (("one", one), ("three", three)):
        save_cg(g, tmp_path / name)
        recs = cg_records(tmp_path / f"{name}.cgc")
        assert [t for t, _, _ in recs].count(SUBGRAPH_RECORD) == 1
        sizes[name] = sum((tmp_path / f"{name}{s}").stat().st_size for s in (".cg", ".cgc", ".cgio", ".cgs"))
    body_len = next(n for t, _, n in cg_records(tmp_path / "one.cgc") if t == SUBGRAPH_RECORD)
    assert sizes["three"] - sizes["one"] < body_len / 2


@pytest.mark.parametrize("bits", [16, 32, 64])
def test_saving_a_loaded_file_again_gives_the_same_bytes(bits: int, tmp_path: Path) -> None:
    g = nested_graph()
    save_cg(g, tmp_path / "a", index_bits=bits)
    h = load_cg(tmp_path / "a")
    assert h.equals(g) and h.file_meta["cg_index_bits"] == bits
    save_cg(h, tmp_path / "b")
    for s in (".cg", ".cgc", ".cgio", ".cgs"):
        assert (tmp_path / f"a{s}").read_bytes() == (tmp_path / f"b{s}").read_bytes()
    save_json(g, tmp_path / "a.json")
    save_json(load_json(tmp_path / "a.json"), tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_files_without_subgraphs_keep_version_1_and_no_subgraph_record(tmp_path: Path) -> None:
    b = opgraph.GraphBuilder()
    x = b.input((F64, (3,)), name="x")
    b.output(b.exp(x))
    g = b.freeze()
    assert to_json_dict(g)["version"] == 1 and "subgraphs" not in to_json_dict(g)
    assert '"version": 1,' in dumps_json(g)
    save_cg(g, tmp_path / "m")
    assert [t for t, _, _ in cg_records(tmp_path / "m.cgc")] == [METADATA_RECORD]


def test_json_text_and_dict_forms_agree() -> None:
    g = nested_graph()
    text = dumps_json(g)
    assert json.loads(text) == to_json_dict(g)
    assert loads_json(text).equals(g) and from_json_dict(to_json_dict(g)).equals(g)
    # Records come inner first: each refers only to records before it.
    doc = to_json_dict(g)
    for k, rec in enumerate(doc["subgraphs"]):
        for ref in _refs(rec["ops"]):
            assert ref < k


def test_json_documents_with_subgraphs_follow_the_schema() -> None:
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parent.parent / "docs" / "graph.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for make, _, _ in CASES.values():
        validator.validate(to_json_dict(make()))
    bad = to_json_dict(call_graph(1))
    bad["subgraphs"][0]["version"] = 2
    assert not validator.is_valid(bad)


def _refs(obj: Any) -> list[int]:
    if isinstance(obj, dict):
        if set(obj) == {"subgraph"}:
            return [obj["subgraph"]]
        return [r for v in obj.values() for r in _refs(v)]
    if isinstance(obj, list):
        return [r for v in obj for r in _refs(v)]
    return []


def test_hand_written_json_may_order_keys_freely_and_leave_out_types() -> None:
    doc = to_json_dict(call_graph(2))
    reordered = {k: doc[k] for k in ("ops", "outputs", "inputs", "constants", "updates", "subgraphs", "version",
                                      "format")}
    for op in reordered["ops"]:
        for d in op["outputs"]:
            del d["type"]
        del op["version"]
    assert from_json_dict(reordered).equals(call_graph(2))


# ----------------------------------------------------------------------------- broken JSON
def _json_error(doc: Any) -> str:
    with pytest.raises(FormatError) as info:
        from_json_dict(doc, source="m.json")
    return str(info.value)


def test_json_reference_errors_name_the_place() -> None:
    doc = to_json_dict(nested_graph())
    bad = json.loads(json.dumps(doc))
    bad["ops"][-1]["attrs"]["body"] = {"subgraph": 9}
    assert "ops[" in _json_error(bad) and "subgraph 9 is not in 'subgraphs' (4 record(s))" in _json_error(bad)
    bad = json.loads(json.dumps(doc))
    k = next(i for i, r in enumerate(bad["subgraphs"]) if _refs(r["ops"]))
    op = next(i for i, o in enumerate(bad["subgraphs"][k]["ops"]) if _refs(o))
    key = next(a for a, v in bad["subgraphs"][k]["ops"][op]["attrs"].items() if _refs(v))
    bad["subgraphs"][k]["ops"][op]["attrs"][key] = {"subgraph": k}  # itself: a cycle
    msg = _json_error(bad)
    assert f"subgraphs[{k}].ops[{op}].attrs.{key}" in msg and "not a record before this one" in msg
    bad = json.loads(json.dumps(doc))
    bad["version"] = 1
    assert "subgraphs: subgraph records need version 2" in _json_error(bad)
    bad = json.loads(json.dumps(doc))
    bad["subgraphs"][0]["format"] = "opgraph"
    assert "subgraphs[0]" in _json_error(bad) and "format" in _json_error(bad)
    bad = json.loads(json.dumps(doc))
    bad["subgraphs"][0]["outputs"] = ["%nope"]
    assert "m.json: subgraphs[0].outputs[0]: unknown value ref '%nope'" in _json_error(bad)
    bad = json.loads(json.dumps(doc))
    bad["ops"][-1]["attrs"]["body"] = {"subgraph": -1}
    assert "expected the index of a record of 'subgraphs'" in _json_error(bad)
    bad = json.loads(json.dumps(doc))
    bad["file_meta"] = {"x": {"subgraph": 0}}
    assert "a subgraph reference belongs in an op's attributes" in _json_error(bad)


def test_json_body_of_the_wrong_signature_is_a_type_error_at_the_op() -> None:
    doc = to_json_dict(call_graph(1))
    other = to_json_dict(scan_graph())["subgraphs"][0]
    doc["subgraphs"] = [other]
    msg = _json_error(doc)
    assert "ops[" in msg and "called body 'cell' takes 3 parameter(s)" in msg


def test_json_refuses_newer_versions_clearly() -> None:
    with pytest.raises(FormatError, match="unsupported version 3; this opgraph reads versions 1 to 2"):
        loads_json('{"format": "opgraph", "version": 3}')


def test_json_truncated_and_flipped_subgraph_text_is_a_format_error(tmp_path: Path) -> None:
    text = dumps_json(nested_graph()).encode()
    lo, hi = text.index(b'"subgraphs"'), text.index(b'"inputs": [\n    {"value": "%h"')
    rnd = random.Random(1)
    path = tmp_path / "m.json"
    loaded = 0
    for k in range(300):
        data = bytearray(text)
        if k % 3 == 0:
            data = data[:rnd.randrange(lo, hi)]
        else:
            at = rnd.randrange(lo, hi)
            data[at] = rnd.choice(b'0123456789{}[]",:%ab -')
        path.write_bytes(bytes(data))
        try:
            h = load_json(path)
        except FormatError as exc:
            assert str(exc).startswith(str(path))
        else:
            h.verify()
            loaded += 1
    assert loaded < 300


# ----------------------------------------------------------------------------- broken .cg
def _with_cgc(tmp_path: Path, edit: Callable[[bytearray, list[tuple[int, int, int]]], None]) -> Path:
    save_cg(nested_graph(), tmp_path / "m")
    p = tmp_path / "m.cgc"
    data = bytearray(p.read_bytes())
    edit(data, cg_records(p))
    p.write_bytes(bytes(data))
    return tmp_path / "m"


def test_cg_unknown_record_type_is_named_with_its_offset(tmp_path: Path) -> None:
    def retype(data: bytearray, recs: list[tuple[int, int, int]]) -> None:
        _, off, _ = next(r for r in recs if r[0] == SUBGRAPH_RECORD)
        data[off:off + 4] = struct.pack("<i", 9050)

    base = _with_cgc(tmp_path, retype)
    off = next(o for t, o, _ in cg_records(base.with_suffix(".cgc")) if t == 9050)
    with pytest.raises(FormatError, match=rf"m\.cgc: record \d+ at byte offset {off}: unknown record type 9050: "
                                          r"not a constant, subgraph \(9002\) or metadata \(9001\) record type "
                                          r"this opgraph knows \(written by a newer opgraph\?\)"):
        load_cg(base)


def test_cg_subgraph_record_errors(tmp_path: Path) -> None:
    def header_edit(key: str, value: Any) -> Callable[[bytearray, list[tuple[int, int, int]]], None]:
        def edit(data: bytearray, recs: list[tuple[int, int, int]]) -> None:
            _, off, _ = next(r for r in recs if r[0] == SUBGRAPH_RECORD)
            start = off + 8
            j = struct.unpack("<q", data[start:start + 8])[0]
            head = json.loads(data[start + 8:start + 8 + j])
            head[key] = value
            new = json.dumps(head, separators=(",", ":")).encode().ljust(j)[:j]
            data[start + 8:start + 8 + j] = new
        return edit

    for key, value, msg in [("version", 7, "unsupported version 7 (this reader knows 1; written by a newer"),
                            ("format", "x", "not an opgraph subgraph header"),
                            ("files", [1, 2], "'files' must be the four file lengths"),
                            ("name", 5, "the name must be a string")]:
        d = tmp_path / key
        d.mkdir()
        with pytest.raises(FormatError, match=r"m\.cgc: record \d+ at byte offset \d+: subgraph record: "
                                              + re.escape(msg)):
            load_cg(_with_cgc(d, header_edit(key, value)))


def test_cg_error_inside_an_embedded_file_names_both_places(tmp_path: Path) -> None:
    def break_inner(data: bytearray, recs: list[tuple[int, int, int]]) -> None:
        _, off, _ = next(r for r in recs if r[0] == SUBGRAPH_RECORD)
        start = off + 8
        j = struct.unpack("<q", data[start:start + 8])[0]
        data[start + 8 + j] = 33  # the embedded .cg's magic byte

    with pytest.raises(FormatError, match=r"m\.cgc: record \d+ at byte offset \d+: subgraph 'square': embedded "
                                          r"\.cg: record 0 at byte offset 0: bad magic byte 33 .*the embedded "
                                          r"files start in .*m\.cgc: \.cg at byte offset \d+"):
        load_cg(_with_cgc(tmp_path, break_inner))


def test_cg_bad_body_reference_in_metadata(tmp_path: Path) -> None:
    g = call_graph(1)
    save_cg(g, tmp_path / "m")
    p = tmp_path / "m.cgc"
    data = p.read_bytes()
    data = data.replace(b'{"subgraph":1}', b'{"subgraph":0}')  # record 0 is a constant, not a body
    p.write_bytes(data)
    with pytest.raises(FormatError, match=r"opgraph metadata: attribute entry \d+: .*does not name a subgraph "
                                          r"record \(type 9002\)"):
        load_cg(tmp_path / "m")


def test_cg_flipped_and_truncated_subgraph_records_are_format_errors(tmp_path: Path) -> None:
    save_cg(nested_graph(), tmp_path / "m")
    p = tmp_path / "m.cgc"
    good = p.read_bytes()
    spans = [(o, o + 8 + n) for t, o, n in cg_records(p) if t == SUBGRAPH_RECORD]
    rnd = random.Random(2)
    outcomes = {"ok": 0, "error": 0}
    for k in range(400):
        lo, hi = rnd.choice(spans)
        data = bytearray(good)
        if k % 4 == 0:
            data = data[:rnd.randrange(lo, hi)]
        else:
            for _ in range(rnd.randint(1, 3)):
                data[rnd.randrange(lo, hi)] ^= 1 << rnd.randrange(8)
        p.write_bytes(bytes(data))
        try:
            h = load_cg(tmp_path / "m")
        except FormatError as exc:
            assert str(exc).startswith(str(p)) and not getattr(exc, "unexpected", False), exc
            outcomes["error"] += 1
        else:
            h.verify()
            outcomes["ok"] += 1
    assert outcomes["error"] > 200


def test_cg_constant_after_a_subgraph_record_is_refused(tmp_path: Path) -> None:
    g = call_graph(1)
    save_cg(g, tmp_path / "m")
    p = tmp_path / "m.cgc"
    recs = cg_records(p)
    data = p.read_bytes()
    (_, c_off, c_len), (_, s_off, s_len) = recs[0], recs[1]
    assert recs[1][0] == SUBGRAPH_RECORD
    const = data[c_off:c_off + 8 + c_len]
    sub = data[s_off:s_off + 8 + s_len]
    p.write_bytes(data[:c_off] + sub + const + data[s_off + 8 + s_len:])
    with pytest.raises(FormatError, match=r"constant record \(type \d+\) after a subgraph record"):
        load_cg(tmp_path / "m")


# ----------------------------------------------------------------------------- other formats
@pytest.mark.parametrize("suffix", [".dag.pkl", ".tdag.pkl", ".idag.pkl", ".unidag.pkl", ".dask.pkl"])
def test_pickled_python_forms_keep_bodies(suffix: str, tmp_path: Path) -> None:
    g = nested_graph()
    opgraph.io.save(g, tmp_path / f"m{suffix}")
    h = opgraph.io.load(tmp_path / f"m{suffix}", allow_pickle=True)
    assert h.equals(g) and [s.name for s in h.subgraphs] == ["step", "square"]
    feed = CASES["nested"][2][0]
    for a, r in zip(h.run(feed), nested_ref(*feed.values()), strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-12)


def test_networkx_form_keeps_bodies() -> None:
    from opgraph.io.nx import from_networkx, to_networkx

    g = cond_graph()
    assert from_networkx(to_networkx(g)).equals(g)


def test_dask_graph_of_control_flow_computes() -> None:
    import dask

    from opgraph.io.dask import to_dask

    feed = CASES["scan"][2][0]
    form = to_dask(scan_graph(), feeds=feed)
    for a, r in zip(dask.get(form.dsk, list(form.keys)), scan_ref(*feed.values()), strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-12)


@pytest.mark.parametrize("suffix, what", [(".graphml", "GraphML"), (".pytensor.pkl", "the PyTensor converter")])
def test_formats_without_control_flow_refuse_clearly(suffix: str, what: str, tmp_path: Path) -> None:
    path = tmp_path / f"m{suffix}"
    with pytest.raises(UnsupportedGraphError, match=rf"op \d+ \(scan\) has subgraph body 'cell': {what} does not "
                                                    r"support control flow \(the \.cg, \.json and \.onnx formats "
                                                    r"store it\)"):
        opgraph.io.save(scan_graph(), path)
    assert not path.exists()


def test_pytensor_converter_refuses_with_a_graph_error() -> None:
    from opgraph.io.pytensor import to_pytensor

    with pytest.raises(GraphError, match=r"op \d+ \(cond\) has subgraph body 'double': the PyTensor converter"):
        to_pytensor(cond_graph())


# ----------------------------------------------------------------------------- the CLI
def test_cli_info_lists_the_bodies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from opgraph.cli.main import main

    g = nested_graph()
    save_json(g, tmp_path / "m.json")
    assert main(["info", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    assert "subgraphs" in out
    bodies = {s.name: s for s in opgraph.core.subgraph.subgraphs_of(g, recursive=True)}
    assert sorted(bodies) == ["neg", "pos", "square", "step"]
    for name, sig in (("step", "(f64[3], f64[]) -> (f64[3], f64[])"), ("square", "(f64[3]) -> (f64[3])"),
                      ("neg", "(f64[3]) -> (f64[3])")):
        line = next(ln for ln in out.splitlines() if f" {name} " in ln and "->" in ln)
        assert sig in line and f" {bodies[name].graph.num_ops} " in line, line
