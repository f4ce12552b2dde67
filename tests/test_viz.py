"""opgraph.viz: DOT text structure (no Graphviz needed), rendering with dot, the missing-binary error, the CLI."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import opgraph
from opgraph.cli import main as cli_main
from opgraph.memory import plan_memory
from opgraph.viz import FANOUT, PALETTE, GraphvizNotFoundError, draw, graph_repr_svg, render, to_dot

ROOT = Path(__file__).resolve().parent.parent
HAVE_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAVE_DOT, reason="the Graphviz 'dot' binary is not on PATH "
                                                     "(apt-get install graphviz); rendering tests need it")


def mlp() -> opgraph.Graph:
    """x @ w1 + b1 -> relu -> @ w2 + b2 -> softmax, traced."""
    import opgraph.nn as nn

    def f(x, w1, b1, w2, b2):  # type: ignore[no-untyped-def]
        return nn.softmax(nn.relu(x @ w1 + b1) @ w2 + b2)

    f32 = np.float32
    return opgraph.trace(f, np.ones((8, 16), f32), np.ones((16, 32), f32), np.ones(32, f32),
                         np.ones((32, 4), f32), np.ones(4, f32))


def training_step() -> opgraph.Graph:
    """A loss output, a weight update (copy gateway), constants and a view (reshape)."""
    b = opgraph.GraphBuilder()
    w = b.input(("float32", (4, 3)), name="w")
    x = b.input(("float32", (8, 4)), name="x")
    y = b.op("matmul", x, w)
    b.output(b.op("sum", b.op("square", b.op("reshape", y, shape=(24,))), axis=0))
    g_w = b.op("matmul", b.op("permute_dims", x, axes=(1, 0)), b.op("multiply", y, 2.0))
    b.update(b.op("subtract", w, b.op("multiply", g_w, 0.01)), w)
    return b.freeze()


def chain(n: int, fan: bool = False) -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (16,)), name="x")
    y = x
    for i in range(n):
        y = b.op("add", y, x) if fan and i % 4 == 3 else b.op(("sin", "exp", "tanh", "negative")[i % 4], y)
    b.output(y)
    return b.freeze()


def nodes(dot: str) -> dict[str, str]:
    """Node id -> attribute text."""
    return {m[1]: m[2] for m in re.finditer(r"^  (\w+) \[(.*)\]$", dot, re.M)
            if m[1] not in ("graph", "node", "edge")}


def edges(dot: str) -> list[tuple[str, str, str]]:
    return [(m[1], m[2], m[3] or "") for m in re.finditer(r"^  (\w+) -> (\w+)(?: \[(.*)\])?$", dot, re.M)]


def label(attrs: str) -> str:
    m = re.search(r'label="((?:[^"\\]|\\.)*)"', attrs)
    assert m, attrs
    return m[1]


# ----------------------------------------------------------------------------- DOT text
def test_mlp_structure_counts_and_labels() -> None:
    g = mlp()
    dot = to_dot(g)
    assert dot.startswith("digraph opgraph {") and dot.rstrip().endswith("}")
    ns = nodes(dot)
    ops = {k: v for k, v in ns.items() if k.startswith("o")}
    vals = {k: v for k, v in ns.items() if k.startswith("v")}
    assert len(ops) == g.num_ops == 6 and len(vals) == g.num_values == 11 and "legend" in ns
    es = edges(dot)
    assert len(es) == int(np.diff(g.in_ptr).sum() + np.diff(g.out_ptr).sum())  # every input and output edge
    assert all('shape="box"' in a for a in ops.values()) and all('shape="ellipse"' in a for a in vals.values())
    assert [label(ops[f"o{i}"]).split("\\n")[0] for i in range(6)] == ["matmul", "add", "relu", "matmul", "add",
                                                                      "softmax"]
    assert label(ops["o5"]) == "softmax\\naxis=-1"  # key attributes
    assert label(vals["v0"]) == "%x\\nf32[8,16]\\n(input)" and 'peripheries="2"' in vals["v0"]
    assert label(vals["v5"]) == "%5\\nf32[8,32]"
    assert "(output)" in label(vals["v10"]) and 'penwidth="2.5"' in vals["v10"]
    # input positions on the edges of ops with several inputs, none on single-input ops
    assert ("v0", "o0", 'label="0"') in es and ("v1", "o0", 'label="1"') in es
    assert ("v6", "o2", "") in es and ("o0", "v5", "") in es
    assert "fillcolor=\"#8dd3c7\"" not in dot and "no memory plan" in dot


def test_plan_colours_values_by_slot() -> None:
    g = mlp()
    plan = plan_memory(g)
    dot = to_dot(g, plan=plan)
    assert dot == to_dot(g, plan=True)
    ns = nodes(dot)
    fills = {}
    for v in range(g.num_values):
        m = re.search(r'fillcolor="(#\w+)"', ns[f"v{v}"])
        fills[v] = m[1] if m else None
    for v in range(g.num_values):
        if v in plan.placement:
            assert fills[v] in PALETTE, v
        else:
            assert fills[v] is None, v  # inputs stay white
    # same colour <=> same (buffer, offset)
    for v in plan.placement:
        for w in plan.placement:
            assert (fills[v] == fills[w]) == (plan.placement[v] == plan.placement[w])
    assert "arena +0" in label(ns["v5"])
    legend = ns["legend"]
    assert "memory plan: fill colour = storage slot" in legend
    slots = set(plan.placement.values())
    assert legend.count("\u2588\u2588\u2588") == len(slots)


def test_updates_constants_and_views() -> None:
    g = training_step()
    dot = to_dot(g, plan=True)
    ns = nodes(dot)
    es = edges(dot)
    src, dst = (int(v) for v in g.updates[0])
    upd = [e for e in es if e[0] == f"v{src}" and e[1] == f"v{dst}"]
    assert len(upd) == 1 and 'style="dashed"' in upd[0][2] and 'label="update"' in upd[0][2]
    assert 'constraint="false"' in upd[0][2]
    const_ops = [o for o in range(g.num_ops) if g.kind_of(o) == "const"]
    assert len(const_ops) == 2
    for o in const_ops:  # const op + value drawn as one note, no op box
        assert f"o{o}" not in ns
        v = int(g.op_outputs(o)[0])
        assert 'shape="note"' in ns[f"v{v}"]
    assert sorted(label(ns[f"v{int(g.op_outputs(o)[0])}"]) for o in const_ops) == ["0.01", "2"]
    reshaped = next(int(g.op_outputs(o)[0]) for o in range(g.num_ops) if g.kind_of(o) == "reshape")
    assert "view of %" in label(ns[f"v{reshaped}"]) and "dashed" in ns[f"v{reshaped}"]


def test_collapse_beyond_max_ops() -> None:
    g = chain(100)
    dot = to_dot(g, max_ops=20)
    ns = nodes(dot)
    assert sum(k.startswith("o") for k in ns) == 20
    assert "... 80 more ops" in label(ns["collapsed"])
    es = edges(dot)
    assert ("v10", "collapsed", 'style=dotted') in es and ("collapsed", "v90", 'style=dotted') in es
    assert "v50" not in ns  # values inside the hidden part are dropped
    assert "collapsed" not in to_dot(g, max_ops=100)
    with pytest.raises(ValueError, match="max_ops"):
        to_dot(g, max_ops=1)


def test_high_fanout_values_get_reference_nodes() -> None:
    g = chain(40, fan=True)  # x is read by 10 adds
    dot = to_dot(g)
    refs = [k for k in nodes(dot) if k.startswith("r0_")]
    assert len(refs) == 10 + 1 - FANOUT  # sin reads x too
    assert all(label(nodes(dot)[r]) == "%x\\n(ref)" for r in refs)
    assert sum(1 for e in edges(dot) if e[0] == "v0") == FANOUT


def test_labels_are_escaped() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (2,)), name='a"b\\c')
    b.output(b.op("exp", x))
    dot = to_dot(b.freeze())
    assert 'label="%a\\"b\\\\c\\nf32[2]\\n(input)"' in dot


def test_bad_plan_argument() -> None:
    with pytest.raises(TypeError, match="MemoryPlan"):
        to_dot(mlp(), plan="yes")


def test_draw_returns_a_digraph_with_the_same_source() -> None:
    graphviz = pytest.importorskip("graphviz", reason="the graphviz Python package is not installed")
    g = training_step()
    d = draw(g, plan=True)
    assert isinstance(d, graphviz.Digraph)
    assert nodes(d.source.replace("\t", "  ")) == nodes(to_dot(g, plan=True))


# ----------------------------------------------------------------------------- rendering
@needs_dot
@pytest.mark.parametrize("fmt", ["svg", "png", "pdf"])
def test_render_formats(tmp_path: Path, fmt: str) -> None:
    out = render(mlp(), tmp_path / f"mlp.{fmt}", plan=True)
    data = Path(out).read_bytes()
    magic = {"svg": b"<svg", "png": b"\x89PNG", "pdf": b"%PDF"}[fmt]
    assert magic in data[:400]


@needs_dot
def test_render_svg_content_and_repr(tmp_path: Path) -> None:
    g = mlp()
    svg = Path(render(g, tmp_path / "g.svg", plan=True)).read_text()
    assert svg.count('class="node"') == g.num_ops + g.num_values + 1  # + legend
    assert "softmax" in svg and "%w1" in svg and "arena +0" in svg
    text = graph_repr_svg(g)
    assert text is not None and text.lstrip().startswith("<?xml") and "<svg" in text


@needs_dot
def test_render_a_few_hundred_ops_quickly(tmp_path: Path) -> None:
    import time

    t = time.perf_counter()
    render(chain(400, fan=True), tmp_path / "big.svg", plan=True)
    assert time.perf_counter() - t < 10


def test_missing_dot_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GraphvizNotFoundError, match=r"'dot' binary.*apt-get install graphviz") as exc:
        render(mlp(), tmp_path / "g.svg")
    assert isinstance(exc.value, FileNotFoundError)
    assert not (tmp_path / "g.svg").exists()
    assert graph_repr_svg(mlp()) is None  # notebooks fall back to the text repr
    render(mlp(), tmp_path / "g.dot")  # DOT text needs no binary
    assert (tmp_path / "g.dot").read_text().startswith("digraph")


def test_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown drawing format 'jpeg'"):
        render(mlp(), tmp_path / "g.jpeg")


# ----------------------------------------------------------------------------- CLI
@pytest.fixture
def model(tmp_path: Path) -> Path:
    from opgraph.io import save

    path = tmp_path / "step.json"
    save(training_step(), str(path))
    return path


@pytest.fixture
def with_viz(monkeypatch: pytest.MonkeyPatch) -> None:
    mods = tuple(cli_main.COMMAND_MODULES)
    if "opgraph.cli.viz_cmd" not in mods:
        monkeypatch.setattr(cli_main, "COMMAND_MODULES", (*mods, "opgraph.cli.viz_cmd"))


@pytest.mark.usefixtures("with_viz")
def test_cli_prints_dot_without_output(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    assert cli_main.main(["viz", str(model), "--plan", "--max-ops", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("digraph opgraph {") and "collapsed" in out and "memory plan" in out


@needs_dot
@pytest.mark.usefixtures("with_viz")
def test_cli_renders_svg(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path) -> None:
    out = tmp_path / "step.svg"
    assert cli_main.main(["viz", str(model), "-o", str(out), "--plan"]) == 0
    assert "<svg" in out.read_text() and "step.svg" in capsys.readouterr().out


@pytest.mark.usefixtures("with_viz")
def test_cli_errors(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli_main.main(["viz", str(model), "--max-ops", "1"]) == 2
    assert "--max-ops" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli_main.main(["viz", str(model), "-o", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'dot' binary" in err and "apt-get install graphviz" in err


def test_add_parser_on_own_parser() -> None:
    from opgraph.cli.viz_cmd import add_parser, run

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"), argparse.ArgumentParser(add_help=False))
    args = parser.parse_args(["viz", "g.json", "-o", "g.pdf"])
    assert args.func is run and args.output == "g.pdf" and not args.plan and args.max_ops == 300


def test_draw_without_the_graphviz_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "graphviz", None)
    with pytest.raises(ImportError, match=r"needs the optional package graphviz: pip install 'opgraph\[viz\]'"):
        draw(mlp())


def test_repr_svg_hook(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The line to add to Graph: def _repr_svg_(self): return opgraph.viz.graph_repr_svg(self)
    monkeypatch.setattr(opgraph.Graph, "_repr_svg_", lambda self: graph_repr_svg(self), raising=False)
    g = mlp()
    if HAVE_DOT:
        assert "<svg" in g._repr_svg_()  # type: ignore[attr-defined]
    monkeypatch.setenv("PATH", str(tmp_path))
    assert g._repr_svg_() is None  # type: ignore[attr-defined]


def test_bodies_drawn_once_as_clusters(tmp_path: Path) -> None:
    from opgraph.core.subgraph import Subgraph

    sb = opgraph.GraphBuilder()
    c, x = sb.input(("float64", (2,)), name="c"), sb.input(("float64", (2,)), name="x")
    sb.output(sb.add(sb.multiply(c, 0.5), x))
    step = Subgraph(sb.freeze(), name="step")
    b = opgraph.GraphBuilder()
    init, xs = b.input(("float64", (2,)), name="init"), b.input(("float64", (4, 2)), name="xs")
    first = b.op("scan", init, xs, body=step, num_carry=1)
    again = b.op("scan", first, xs, body=step, num_carry=1, reverse=True)
    b.output(again)
    dot = to_dot(b.freeze())
    # The body is drawn once (one cluster) although two scans use it; both scans name it.
    assert dot.count("subgraph cluster_") == 1 and dot.count("body=@step") == 2
    assert re.search(r'label="@step: 3 ops', dot)
    cluster = dot[dot.index("subgraph cluster_b0"):]
    assert "b0_o1" in cluster and "b0_v0 -> b0_o1" in cluster
    # Node ids inside the cluster never clash with the outer graph's.
    outer = dot[:dot.index("subgraph cluster_b0")]
    assert not re.search(r"\bb0_", outer)
    if HAVE_DOT:
        render(b.freeze(), tmp_path / "scan.svg")
        assert "@step" in (tmp_path / "scan.svg").read_text()
