"""Copy gateways of TensCalc .cg files, in particular ``saveScalarized``'s copies into scalarised inputs.

The fixture ``tests/data/tenscalc/copy`` was written by TensCalc itself
(``case_copy.m``: ``saveScalarized``, ``saveVectorized``, and the code of
``compile2matlab`` for the reference values, under GNU Octave 7.3). Its
``copy_step`` gateway sets ``x <- x - a*grad`` and ``a <- a/2``; in the
scalarised files the copy's destinations are the scalars that the
``ftensor2scalars`` of ``set_x``/``set_a`` make, which the loader turns into
update edges onto ``x`` and ``a``. Each set/get/copy step of
``reference.json`` is replayed on the loaded graph (per gateway, and as
compiled calls that apply the update edges), and saving gives back the four
files byte for byte.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import opgraph
import opgraph.io
from opgraph.errors import FormatError
from opgraph.io import cg

DATA = Path(__file__).parent / "data" / "tenscalc" / "copy"
SUFFIXES = (".cg", ".cgc", ".cgio", ".cgs")
VARIANTS = ("scalarized", "vectorized")
TOL = 1e-12  # reference.json's tolerance_hint


def reference() -> dict[str, Any]:
    return json.loads((DATA / "reference.json").read_text())


def check_output(got: np.ndarray, want: dict[str, Any], where: str) -> None:
    w = np.array(want["value"], dtype=np.float64)
    assert got.shape == tuple(want["shape"]), f"{where}/{want['name']}: shape {got.shape}"
    np.testing.assert_array_equal(w.ravel(order="F"), want["value_colmajor"])
    np.testing.assert_allclose(got, w, rtol=0, atol=TOL, err_msg=f"{where}/{want['name']}")


def replay(graph: opgraph.Graph, steps: list[dict[str, Any]]) -> list[str]:
    """Each step through the graph's gateways on an incremental context: set, get, and copy = the gateway's
    update edges (every source read before any destination is set). Returns the get steps checked."""
    gws = {gw.name: gw for gw in cg.gateways(graph)}
    ctx = opgraph.compile(graph).context()
    checked = []
    for step in steps:
        gw = gws[step["gateway"]]
        assert gw.kind == step["op"]
        if step["op"] == "set":
            ctx.set(gw.values[0], np.array(step["value"], dtype=np.float64))
        elif step["op"] == "get":
            for v, want in zip(gw.values, step["outputs"], strict=True):
                check_output(ctx.get(v), want, step["gateway"])
            checked.append(step["gateway"])
        else:
            news = [ctx.get(s) for s in gw.values]
            for d, arr in zip(gw.destinations, news, strict=True):
                ctx.set(d, arr)
    return checked


@pytest.mark.parametrize("variant", VARIANTS)
def test_copy_gateway_loads_as_update_edges(variant: str) -> None:
    g = opgraph.io.load(DATA / variant)
    gws = {gw.name: gw for gw in cg.gateways(g)}
    assert [gw.kind for gw in cg.gateways(g)] == ["get", "get", "set", "set", "set", "set", "copy"]
    x, a = gws["set_x"].values[0], gws["set_a"].values[0]
    copy = gws["copy_step"]
    assert copy.destinations == (x, a)
    assert sorted(map(tuple, g.updates.tolist())) == sorted(zip(copy.values, copy.destinations, strict=True))
    if variant == "scalarized":
        # The copied scalars are gathered by a scalars2ftensor into the set variable's new value.
        for src in copy.values:
            assert g.kind_of(int(g.value_producer[src])) == "scalars2ftensor"
    g.verify()


@pytest.mark.parametrize("variant", VARIANTS)
def test_set_get_copy_get_reproduces_tenscalc(variant: str) -> None:
    ref = reference()
    checked = replay(opgraph.io.load(DATA / variant), ref["steps"])
    assert checked.count("get_J_g") == 3 and checked.count("get_xn") == 2
    # The reference's own check of TensCalc against plain Octave formulas.
    for step in ref["steps"]:
        for out in step.get("outputs", ()):
            assert out["max_abs_diff_vs_plain_octave"] <= 1e-12


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_calls_apply_the_copy(variant: str) -> None:
    # A compiled call returns the gets and then applies every update edge: here exactly copy_step.
    g = opgraph.io.load(DATA / variant)
    gws = {gw.name: gw for gw in cg.gateways(g)}
    steps = reference()["steps"]
    feeds = {gws[s["gateway"]].values[0]: np.array(s["value"], dtype=np.float64) for s in steps if s["op"] == "set"}
    gets = [s for s in steps if s["op"] == "get"]
    order = [v for gw in cg.gateways(g) if gw.kind == "get" for v in gw.values]
    f = opgraph.compile(g)
    x, a = gws["set_x"].values[0], gws["set_a"].values[0]
    a0 = next(s for s in steps if s["gateway"] == "set_a")["value"]
    for it in range(3):
        out = dict(zip(order, f(feeds if it == 0 else {k: v for k, v in feeds.items() if k not in (x, a)}),
                       strict=True))
        for step in gets[2 * it:2 * it + 2]:
            for v, want in zip(gws[step["gateway"]].values, step["outputs"], strict=True):
                check_output(out[v], want, step["gateway"])
        if it < 2:  # the state is the copied values: this call's xn, and a halved (column-major entries)
            want_x = gets[2 * it + 1]["outputs"][0]["value_colmajor"]
            np.testing.assert_allclose(np.ravel(f.state(x), order="F"), want_x, rtol=0, atol=TOL)
            np.testing.assert_allclose(np.ravel(f.state(a)), [a0 / 2 ** (it + 1)], rtol=0, atol=TOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rewrite_is_byte_identical(variant: str, tmp_path: Path) -> None:
    g = opgraph.io.load(DATA / variant)
    opgraph.io.save(g, tmp_path / "again")
    for s in SUFFIXES:
        assert (tmp_path / f"again{s}").read_bytes() == (DATA / f"{variant}{s}").read_bytes(), s
    # The JSON form keeps what the .cg writer needs.
    opgraph.io.save(g, tmp_path / "g.json")
    h = opgraph.io.load(tmp_path / "g.json")
    assert h.equals(g, check_names=True)
    cg.save_cg(h, tmp_path / "via_json")
    for s in SUFFIXES:
        assert (tmp_path / f"via_json{s}").read_bytes() == (DATA / f"{variant}{s}").read_bytes(), s


def test_changed_graph_is_written_as_it_is(tmp_path: Path) -> None:
    # CSE merges the copy's scalars2ftensor with get_xn's: the file records no longer describe the graph, so it
    # is written with the update edges onto x and a (copies of tensors), and still computes TensCalc's values.
    # (Passes drop file_meta; it is put back so that the writer sees the loader's records and must refuse them.)
    g = opgraph.io.load(DATA / "scalarized")
    h = opgraph.passes.cse(g).graph.replace(file_meta=g.file_meta)
    assert h.num_ops < g.num_ops
    cg.save_cg(h, tmp_path / "cse")
    assert (tmp_path / "cse.cgio").read_bytes() != (DATA / "scalarized.cgio").read_bytes()
    k = opgraph.io.load(tmp_path / "cse")
    assert "cg_scalar_copies" not in k.file_meta
    replay(k, reference()["steps"])


# ---------------------------------------------------------------- hand-made TensCalc-style files
def write_set(base: Path, cg_ints: list[int], consts: list[tuple[int, bytes]], io_ints: list[int]) -> None:
    """A 32-bit file set as TensCalc's writers make it (no .cgs names)."""
    def ints(v: list[int]) -> bytes:
        return bytes([32]) + struct.pack(f"<{len(v)}i", *v)

    Path(f"{base}.cg").write_bytes(ints(cg_ints))
    Path(f"{base}.cgc").write_bytes(bytes([32]) + b"".join(struct.pack("<2i", t, len(d)) + d for t, d in consts))
    Path(f"{base}.cgio").write_bytes(ints(io_ints))
    Path(f"{base}.cgs").write_bytes(bytes([32]))


def subscripts(n: int) -> tuple[int, bytes]:
    """saveScalarized's 20002 subscripts constant of a full [n] vector: [1 x n] matrix 1..n."""
    return 20002, struct.pack(f"<3q{n}q", 2, 1, n, *range(1, n + 1))


def test_partial_permuted_copy(tmp_path: Path) -> None:
    # x: [3] set (variable 0), its scalars 1, 2, 3; 4 = exp(x(1)), 5 = x(3)^2; get x (7 = scalars2ftensor).
    # Copy pairs (4 -> 3), (5 -> 1): x <- [x(3)^2, x(2), exp(x(1))], x(2) untouched.
    write_set(tmp_path / "p",
              cg_ints=[30002, 1, 3, 0, 1, 2, 3, 20017, 1, 1, 1, 4, 20027, 1, 1, 3, 5, 0, 0, 6,
                       30001, 4, 1, 6, 1, 2, 3, 7],
              consts=[subscripts(3)], io_ints=[2, 1, 7, 1, 1, 0, 3, 2, 4, 5, 3, 1])
    g = opgraph.io.load(tmp_path / "p")
    [get, set_, copy] = cg.gateways(g)
    assert copy.destinations == set_.values and len(g.updates) == 1
    x = np.array([0.5, -2.0, 3.0])
    ctx = opgraph.compile(g).context()
    ctx.set(set_.values[0], x)
    np.testing.assert_array_equal(ctx.get(get.values[0]), x)
    new = ctx.get(copy.values[0])
    ctx.set(set_.values[0], new)
    np.testing.assert_allclose(ctx.get(get.values[0]), [x[2] ** 2, x[1], np.exp(x[0])], rtol=1e-15)
    cg.save_cg(g, tmp_path / "q")
    for s in SUFFIXES:
        assert (tmp_path / f"q{s}").read_bytes() == (tmp_path / f"p{s}").read_bytes(), s


def test_scalar_copies_of_two_gateways(tmp_path: Path) -> None:
    # Two copy records into the same set variable: one update edge each, each keeping the other entry.
    write_set(tmp_path / "t",
              cg_ints=[30002, 1, 2, 0, 1, 2, 20017, 1, 1, 1, 3, 0, 0, 4, 30001, 3, 1, 4, 1, 2, 5],
              consts=[subscripts(2)], io_ints=[2, 1, 5, 1, 1, 0, 3, 1, 3, 1, 3, 1, 3, 2])
    g = opgraph.io.load(tmp_path / "t")
    gws = cg.gateways(g)
    assert [gw.kind for gw in gws] == ["get", "set", "copy", "copy"] and len(g.updates) == 2
    ctx = opgraph.compile(g).context()
    for copy, want in ((gws[2], [np.exp(1.0), 2.0]), (gws[3], [1.0, np.exp(1.0)])):
        ctx.set(0, np.array([1.0, 2.0]))
        ctx.set(0, ctx.get(copy.values[0]))
        np.testing.assert_allclose(ctx.get(gws[0].values[0]), want, rtol=1e-15)
    cg.save_cg(g, tmp_path / "u")
    for s in SUFFIXES:
        assert (tmp_path / f"u{s}").read_bytes() == (tmp_path / f"t{s}").read_bytes(), s


@pytest.mark.parametrize("cg_ints,io_ints,message", [
    # destination computed by another function (test_io_cg.py's case)
    ([20017, 1, 1, 0, 1], [1, 1, 0, 3, 1, 0, 1],
     r"record 1 at byte offset 13: copy destination 1 is not an input \(it is produced by record 0\)"),
    # destination is a scalar of an ftensor2scalars whose tensor is computed, not set
    ([20017, 1, 1, 0, 1, 30002, 1, 2, 1, 2, 3], [1, 1, 0, 3, 1, 2, 3],
     r"record 1 at byte offset 13: copy destination 3 is not an input \(it is produced by record 1\)"),
    # ftensor2scalars of two tensors
    ([30002, 2, 2, 0, 1, 2, 3], [1, 1, 0, 1, 1, 1, 3, 1, 2, 3],
     r"record 2 at byte offset 25: copy destination 3 is not an input \(it is produced by record 0\)"),
    # the same scalar twice in one copy gateway
    ([30002, 1, 2, 0, 1, 2, 20017, 1, 1, 1, 3], [1, 1, 0, 3, 2, 3, 3, 1, 1],
     r"record 1 at byte offset 13: copy destination 1 is copied twice by one copy gateway"),
    # the set variable is also read as a tensor (its new value would need its size)
    ([30002, 1, 2, 0, 1, 2, 20017, 1, 1, 0, 3], [1, 1, 0, 3, 1, 3, 1],
     r"record 1 at byte offset 13: copy destination 1 is a scalar of variable 0, which record 1 reads as a tensor"),
    # out of range
    ([30002, 1, 2, 0, 1, 2], [1, 1, 0, 3, 1, 1, 99], r"record 1 at byte offset 13: copy destination variable 99"),
])
def test_malformed_copies_still_raise(tmp_path: Path, cg_ints: list[int], io_ints: list[int], message: str) -> None:
    write_set(tmp_path / "bad", cg_ints=cg_ints, consts=[], io_ints=io_ints)
    with pytest.raises(FormatError, match=message):
        opgraph.io.load(tmp_path / "bad")


def test_copy_into_scalars_needs_tenscalc_files(tmp_path: Path) -> None:
    # An opgraph file (with its metadata record) never copies into scalars: there it stays an error.
    b = opgraph.GraphBuilder()
    x = b.input(("float64", None), name="x")
    x0, _ = b.op("ftensor2scalars", x, nout=2)
    b.output(b.op("Sexp", x0))
    cg.save_cg(b.freeze(), tmp_path / "o")
    assert opgraph.io.load(tmp_path / "o").file_meta["cg_opgraph_metadata"]
    io = (tmp_path / "o.cgio").read_bytes()
    (tmp_path / "o.cgio").write_bytes(io + struct.pack("<4i", 3, 1, 3, 1))
    with pytest.raises(FormatError, match="copy destination 1 is not an input"):
        opgraph.io.load(tmp_path / "o")
