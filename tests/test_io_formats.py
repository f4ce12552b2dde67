"""The format registry: every format through opgraph.io.save/load and `opgraph convert`, on random graphs
(hypothesis) and on TensCalc's own .cg files; drawings; pickles refused without allow_pickle; atomic failures."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import opgraph.io
from opgraph import GraphBuilder
from opgraph.cli.main import main
from opgraph.core.builder import exact_key
from opgraph.core.graph import Graph
from opgraph.errors import FormatError
from opgraph.io.formats import (
    NotLoadableError,
    PickleRefusedError,
    UnknownFormatError,
    UnsupportedGraphError,
    format_for_path,
    formats,
    get_format,
)
from opgraph.io.nx.graphml import to_graphml_graph
from opgraph.passes.dce import dce
from test_io_cg import TC_CASES, TENSCALC, rich_graph
from test_io_dag import graphs

LOADABLE = [f.name for f in formats() if f.loadable]
DRAWINGS = [f.name for f in formats() if not f.loadable]
NUMERIC = {"onnx"}
"""Formats whose round trip may rewrite ops: compared by the outputs of ``run``."""
LIVE_ONLY = {"pytensor"}
"""Formats that keep only the ops the outputs need (a FunctionGraph has no dead ops)."""
RENUMBERING = {"dag", "tuple-dag", "index-dag", "unidag", "dask"}
"""Formats rebuilt with a GraphBuilder: a graph numbered otherwise (TensCalc's) comes back renumbered."""
REFUSE_TENSCALC = {"onnx", "pytensor"}
"""TensCalc's graphs (ops such as Vtprod, inputs of unknown rank) cannot be held by these."""
# PyTensor raises the recursion limit while a hypothesis example runs; hypothesis says so, harmlessly.
pytestmark = pytest.mark.filterwarnings("ignore:The recursion limit will not be reset")
HAS_DOT = shutil.which("dot") is not None
HYPOTHESIS = settings(max_examples=15, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def suffix(name: str) -> str:
    return get_format(name).suffixes[0]


# ----------------------------------------------------------------------------- comparisons
def structure(g: Graph) -> tuple[Any, ...]:
    """The graph up to value and op numbering: every op as a hash of its kind, attributes, version and the
    hashes of its inputs (so the whole history of every value), plus the outputs, updates and value names."""
    def digest(key: Any) -> str:
        return hashlib.sha256(repr(key).encode()).hexdigest()[:24]

    sig: list[str] = [""] * g.num_values
    for pos, v in enumerate(g.inputs.tolist()):
        sig[v] = digest(("input", pos, repr(g.type_of(v))))
    ops = []
    for op in g.topological_order().tolist():
        if g.kind_of(op) == "const":
            c = g.constant_of(op)
            head: Any = ("const", c.dtype.str, c.shape, c.tobytes())
        else:
            head = (g.kind_of(op), exact_key(g.attrs[g.op_attr[op]]), int(g.op_version[op]))
        o = digest((head, tuple(sig[v] for v in g.op_inputs(op).tolist())))
        ops.append(o)
        for i, v in enumerate(g.op_outputs(op).tolist()):
            sig[v] = digest((o, i, repr(g.type_of(v))))
    names = sorted((name, sig[v]) for v, name in g.symbols.values.items())
    return (sorted(ops), [sig[v] for v in g.outputs.tolist()], [(sig[s], sig[d]) for s, d in g.updates.tolist()],
            names)


def feeds_for(g: Graph) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(5)
    return {int(v): rng.standard_normal(g.type_of(int(v)).shape) for v in g.inputs}


def assert_round_trip(fmt: str, g: Graph, h: Graph) -> None:
    """``h`` (loaded back from format ``fmt``) against the original ``g``, as exactly as the format allows."""
    if fmt in NUMERIC:
        feeds = feeds_for(g)
        assert len(h.inputs) == len(g.inputs) and len(h.outputs) == len(g.outputs)
        got = h.run({int(hv): feeds[int(gv)] for hv, gv in zip(h.inputs, g.inputs, strict=True)})
        for a, b in zip(got, g.run(feeds), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    elif fmt in LIVE_ONLY:
        assert h == dce(g).graph
    else:
        assert h == g
        assert h.symbols.values == g.symbols.values


def no_leftovers(directory: Path, keep: set[str]) -> None:
    assert {p.name for p in directory.iterdir()} == keep


# ----------------------------------------------------------------------------- the registry
def test_suffixes_and_defaults() -> None:
    assert [f.name for f in formats()] == ["cg", "json", "onnx", "graphml", "dot", "svg", "png", "pdf", "dag",
                                           "tuple-dag", "index-dag", "unidag", "dask", "pytensor"]
    cases = {"m.cg": "cg", "m.CGIO": "cg", "dir.v2/m": "cg", "m": "cg", "m.json": "json", "m.onnx": "onnx",
             "m.graphml": "graphml", "m.gv": "dot", "m.dot": "dot", "m.svg": "svg", "m.png": "png", "m.pdf": "pdf",
             "m.dag.pkl": "dag", "m.tdag.pkl": "tuple-dag", "m.idag.pkl": "index-dag", "m.unidag.pkl": "unidag",
             "m.dask.pkl": "dask", "m.pytensor.pkl": "pytensor", "a.json.dag.pkl": "dag"}
    for path, name in cases.items():
        assert format_for_path(path).name == name, path
    assert format_for_path("m.txt", "json").name == "json"
    assert all(s.startswith(".") for f in formats() for s in f.suffixes)
    assert {f.name for f in formats() if f.pickle} == {"dag", "tuple-dag", "index-dag", "unidag", "dask", "pytensor"}


@pytest.mark.parametrize("path", ["m.txt", "m.pkl", "m.onnx.bak", "m.yaml"])
def test_unknown_extension_lists_the_known_ones(path: str) -> None:
    with pytest.raises(UnknownFormatError) as err:
        format_for_path(path)
    assert ".json" in str(err.value) and ".dask.pkl" in str(err.value) and ".graphml" in str(err.value)
    with pytest.raises(UnknownFormatError, match="known: cg, json"):
        get_format("yaml")


# ----------------------------------------------------------------------------- random graphs
@pytest.mark.parametrize("fmt", LOADABLE)
@HYPOTHESIS
@given(g=graphs())
def test_random_graphs_round_trip_through_save_and_load(fmt: str, g: Graph) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model" + suffix(fmt))
        opgraph.io.save(g, path)
        assert_round_trip(fmt, g, opgraph.io.load(path, allow_pickle=True))
        # The same through format= on a path whose name says nothing.
        opgraph.io.save(g, os.path.join(d, "plain"), format=fmt)
        assert_round_trip(fmt, g, opgraph.io.load(os.path.join(d, "plain"), format=fmt, allow_pickle=True))


@pytest.mark.parametrize("fmt", LOADABLE)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=graphs())
def test_random_graphs_round_trip_through_the_cli(fmt: str, g: Graph) -> None:
    with tempfile.TemporaryDirectory() as d:
        src, mid, back = (os.path.join(d, n) for n in ("src.json", "mid" + suffix(fmt), "back.json"))
        opgraph.io.save(g, src)
        assert main(["convert", src, mid]) == 0
        assert main(["convert", mid, back, "--allow-pickle"]) == 0
        assert_round_trip(fmt, g, opgraph.io.load(back))


# ----------------------------------------------------------------------------- TensCalc's files
@pytest.mark.parametrize("fmt", LOADABLE)
@pytest.mark.parametrize("case", TC_CASES)
def test_tenscalc_files_through_every_format(tmp_path: Path, case: str, fmt: str) -> None:
    g = opgraph.io.load(TENSCALC / case)
    path = tmp_path / ("model" + suffix(fmt))
    if fmt in REFUSE_TENSCALC:
        with pytest.raises(UnsupportedGraphError, match=f"the {fmt} format cannot hold this graph"):
            opgraph.io.save(g, path)
        no_leftovers(tmp_path, set())
        return
    opgraph.io.save(g, path)
    h = opgraph.io.load(path, allow_pickle=True)
    h.verify()
    if fmt in RENUMBERING:
        # TensCalc numbers op outputs before the inputs they read; a GraphBuilder cannot, so the graph comes
        # back renumbered: the same ops on the same values with the same names.
        assert structure(h) == structure(g)
    else:  # cg, json and graphml keep everything: numbering, names, descriptions, file_meta
        assert h.equals(g, check_names=True) and h.file_meta == g.file_meta


@pytest.mark.parametrize("case", TC_CASES)
def test_tenscalc_through_graphml_writes_the_same_cg_bytes(tmp_path: Path, case: str) -> None:
    opgraph.io.save(opgraph.io.load(TENSCALC / case), tmp_path / "g.graphml")
    opgraph.io.save(opgraph.io.load(tmp_path / "g.graphml"), tmp_path / "again.cg")
    for ext in get_format("cg").suffixes:
        assert (tmp_path / f"again{ext}").read_bytes() == Path(f"{TENSCALC / case}{ext}").read_bytes(), ext


@pytest.mark.parametrize("fmt", sorted(set(LOADABLE) - REFUSE_TENSCALC))
def test_tenscalc_files_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    for case in TC_CASES:
        g = opgraph.io.load(TENSCALC / case)
        mid, back = tmp_path / ("mid" + suffix(fmt)), tmp_path / "back.json"
        assert main(["convert", str(TENSCALC / case), str(mid)]) == 0
        assert main(["convert", str(mid), str(back), "--allow-pickle"]) == 0
        out, err = capsys.readouterr()
        assert err == "" and f"({fmt}: {g.num_ops} ops, {g.num_values} values)" in out
        back_graph = opgraph.io.load(back)
        assert structure(back_graph) == structure(g)
        if fmt not in RENUMBERING:
            assert back_graph == g


@pytest.mark.parametrize("fmt", sorted(REFUSE_TENSCALC))
def test_tenscalc_files_refused_by_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    out_path = tmp_path / ("out" + suffix(fmt))
    assert main(["convert", str(TENSCALC / TC_CASES[0]), str(out_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"opgraph: error: {out_path}: the {fmt} format cannot hold this graph: ")
    no_leftovers(tmp_path, set())


# ----------------------------------------------------------------------------- exactness details
@pytest.mark.parametrize("fmt", ["graphml", "json", "cg"])
def test_rich_graph_round_trips_exactly(tmp_path: Path, fmt: str) -> None:
    """Every dtype, unknown dims and rank, tuple and slice attributes, multi-output ops, an update edge,
    names and descriptions of values, ops, constants and io gateways."""
    g, feeds = rich_graph()
    opgraph.io.save(g, tmp_path / ("rich" + suffix(fmt)))
    h = opgraph.io.load(tmp_path / ("rich" + suffix(fmt)))
    assert h.equals(g, check_names=True)
    assert h.file_meta == g.file_meta or fmt == "cg"  # the .cg reader records how the file was written
    for a, b in zip(h.run(feeds), g.run(feeds), strict=True):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_graphml_encodes_what_graphml_cannot_hold(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.input(("float32", (2, None)), name="x\x01\r\ny")
    c = b.constant(np.array([np.nan, -0.0, np.inf], np.float32), name="c")
    s = b.op("sum", x, axis=(0,), keepdims=True, name="tab\there")
    b.output(b.op("concat", b.op("reshape", s, shape=(-1,)), c, axis=0))
    b.output(b.constant(np.array([1 + 2j]), name=""))
    g = b.freeze()
    opgraph.io.save(g, tmp_path / "g.graphml")
    h = opgraph.io.load(tmp_path / "g.graphml")
    assert h == g and h.symbols.values == g.symbols.values
    text = (tmp_path / "g.graphml").read_text()
    assert "\x01" not in text and "\\u0001" in text  # XML 1.0 cannot hold the control character itself
    H = to_graphml_graph(g)
    const = json.loads(H.nodes["o0"]["attrs"])["value"]["ndarray"]
    assert const["dtype"] == "float32" and const["shape"] == [3] and "base64" in const
    assert json.loads(H.nodes["o1"]["attrs"]) == {"axis": [0], "keepdims": True}
    assert json.loads(H.nodes["v0"]["type"]) == {"dtype": "float32", "shape": [2, None]}
    assert "name" not in H.nodes["v0"] and json.loads(H.nodes["v0"]["name_json"]) == "x\x01\r\ny"


def test_graphml_with_other_node_ids(tmp_path: Path) -> None:
    """Node ids that are not 0..n-1 (a file edited by hand): the graph is numbered in builder order."""
    import networkx as nx

    g = small_graph()
    H = nx.relabel_nodes(to_graphml_graph(g), lambda n: f"{n[0]}{int(n[1:]) * 10 + 7}")
    for key in ("inputs", "outputs"):
        H.graph[key] = json.dumps([f"{n[0]}{int(n[1:]) * 10 + 7}" for n in json.loads(H.graph[key])])
    nx.write_graphml(H, tmp_path / "edited.graphml")
    h = opgraph.io.load(tmp_path / "edited.graphml")
    assert h == g and h.symbols.values == g.symbols.values


def test_graphml_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.graphml"
    bad.write_text("<graphml><graph")
    with pytest.raises(FormatError, match=r"bad\.graphml: not a readable GraphML file"):
        opgraph.io.load(bad)
    import networkx as nx

    nx.write_graphml(nx.DiGraph([(1, 2)]), bad)
    with pytest.raises(FormatError, match=r"bad\.graphml: not an opgraph GraphML graph"):
        opgraph.io.load(bad)


def test_onnx_numeric_round_trip_and_garbage(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.input(("float32", (3, 4)), name="x")
    y = b.op("softmax", b.op("multiply", x, 2.0), axis=1)
    b.output(b.op("mean", y, axis=0), b.op("argmax", x, axis=1))
    g = b.freeze()
    opgraph.io.save(g, tmp_path / "m.onnx")
    h = opgraph.io.load(tmp_path / "m.onnx")
    xv = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    for a, c in zip(h.run({"x": xv}), g.run({"x": xv}), strict=True):
        assert a.dtype == c.dtype
        np.testing.assert_allclose(a, c, rtol=1e-6)
    (tmp_path / "junk.onnx").write_bytes(b"\x00not a model")
    with pytest.raises(FormatError, match=r"junk\.onnx"):
        opgraph.io.load(tmp_path / "junk.onnx")


def test_dask_file_runs_once_the_inputs_are_filled_in(tmp_path: Path) -> None:
    import dask.threaded

    b = GraphBuilder()
    x = b.input(("float64", (2, 4)), name="x")
    lo, hi = b.op("split", x, sections=2, axis=1)
    b.output(b.op("sum", b.op("multiply", lo, hi), axis=1, name="s"), hi)
    g = b.freeze()
    opgraph.io.save(g, tmp_path / "g.dask.pkl")
    with open(tmp_path / "g.dask.pkl", "rb") as f:
        form = pickle.load(f)
    assert set(form) == {"dsk", "keys", "inputs", "types"} and form["inputs"] == ("x",) and "x" not in form["dsk"]
    xv = np.arange(8.0).reshape(2, 4)
    got = dask.threaded.get({**form["dsk"], "x": xv}, form["keys"])
    for a, c in zip(got, g.run({"x": xv}), strict=True):
        np.testing.assert_array_equal(a, c)
    opgraph.io.save(g, tmp_path / "fed.dask.pkl", feeds={"x": xv})
    with open(tmp_path / "fed.dask.pkl", "rb") as f:
        fed = pickle.load(f)
    np.testing.assert_array_equal(dask.threaded.get(fed["dsk"], fed["keys"])[0], g.run({"x": xv})[0])
    assert opgraph.io.load(tmp_path / "fed.dask.pkl", allow_pickle=True) == g


# ----------------------------------------------------------------------------- drawings
def small_graph() -> Graph:
    b = GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    b.output(b.op("tanh", b.op("exp", x), name="y"))
    return b.freeze()


@pytest.mark.parametrize("fmt", DRAWINGS)
def test_drawings_are_written_and_not_loaded(tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    if fmt != "dot" and not HAS_DOT:
        pytest.skip("rendering svg/png/pdf needs the Graphviz 'dot' binary, which is not on PATH")
    g = small_graph()
    path = tmp_path / ("g" + suffix(fmt))
    opgraph.io.save(g, path)
    data = path.read_bytes()
    expect = {"dot": b"digraph opgraph {", "png": b"\x89PNG", "pdf": b"%PDF"}
    if fmt == "svg":
        assert b"<svg" in data and b"tanh" in data
    else:
        assert data.startswith(expect[fmt])
    if fmt == "dot":
        assert "tanh" in data.decode() and " -> " in data.decode()
    with pytest.raises(NotLoadableError, match="drawings"):
        opgraph.io.load(path)
    json_path = tmp_path / "g.json"
    opgraph.io.save(g, json_path)
    cli_out = tmp_path / ("cli" + suffix(fmt))
    assert main(["convert", str(json_path), str(cli_out)]) == 0
    assert cli_out.read_bytes()[:4] == data[:4]
    assert main(["convert", str(cli_out), str(tmp_path / "back.json")]) == 2
    _, err = capsys.readouterr()
    assert "drawings; they cannot be converted back" in err


def test_dot_drawing_via_gv_and_options(tmp_path: Path) -> None:
    opgraph.io.save(small_graph(), tmp_path / "g.gv", rankdir="LR")
    assert "rankdir" in (tmp_path / "g.gv").read_text() and "LR" in (tmp_path / "g.gv").read_text()


# ----------------------------------------------------------------------------- pickles
class _Tripwire:
    """Unpickling this creates a file: proof that a refused pickle was never unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.path),))


@pytest.mark.parametrize("fmt", [f.name for f in formats() if f.pickle])
def test_pickles_need_allow_pickle(tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    marker = tmp_path / "unpickled"
    path = tmp_path / ("evil" + suffix(fmt))
    path.write_bytes(pickle.dumps(_Tripwire(str(marker))))
    with pytest.raises(PickleRefusedError) as err:
        opgraph.io.load(path)
    assert "can run arbitrary code" in str(err.value) and "allow_pickle=True" in str(err.value)
    assert not marker.exists()
    assert main(["convert", str(path), str(tmp_path / "out.json")]) == 1
    _, out = capsys.readouterr()
    assert len(out.splitlines()) == 1 and "arbitrary code" in out and "--allow-pickle" in out
    assert not marker.exists() and not (tmp_path / "out.json").exists()
    # Allowed, the pickle runs (here: makes the marker) and what it holds is not a graph form.
    with pytest.raises(FormatError, match="evil"):
        opgraph.io.load(path, allow_pickle=True)
    assert marker.exists()


def test_non_pickle_formats_never_need_allow_pickle(tmp_path: Path) -> None:
    g = small_graph()
    for fmt in ("cg", "json", "graphml", "onnx"):
        opgraph.io.save(g, tmp_path / ("g" + suffix(fmt)))
        opgraph.io.load(tmp_path / ("g" + suffix(fmt)))


# ----------------------------------------------------------------------------- graphs a format cannot hold
def stateful_graph() -> Graph:
    b = GraphBuilder()
    s = b.input(("float64", ()), name="s")
    b.output(b.op("exp", s, name="e"))
    b.update(b.add(s, 1.0), s)
    return b.freeze()


@pytest.mark.parametrize("fmt", ["onnx", "dag", "tuple-dag", "index-dag", "unidag", "dask", "pytensor"])
def test_update_edges_are_refused_without_a_partial_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         fmt: str) -> None:
    g = stateful_graph()
    path = tmp_path / ("g" + suffix(fmt))
    with pytest.raises(UnsupportedGraphError, match=re.escape(f"{path}: the {fmt} format cannot hold this graph")):
        opgraph.io.save(g, path)
    no_leftovers(tmp_path, set())
    path.write_bytes(b"earlier")
    opgraph.io.save(g, tmp_path / "g.json")
    assert main(["convert", str(tmp_path / "g.json"), str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "update edges" in err
    assert path.read_bytes() == b"earlier"  # an earlier file is left as it was
    no_leftovers(tmp_path, {"g.json", path.name})
