"""The opgraph command: every subcommand on JSON files, exit codes, one-line errors, --debug."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import opgraph.io
from opgraph import GraphBuilder
from opgraph.cli.main import ProgressBars, main
from opgraph.core import progress
from opgraph.io.jsonfmt import load_json, save_json

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A small graph with two inputs, two outputs and an update edge, saved as JSON, plus x.npy."""
    b = GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    s = b.input(("float64", ()), name="s")
    y = b.op("multiply", x, 2.0, name="y")
    total = b.op("sum", y, name="total")
    parts = b.op("split", y, sections=3)
    b.output(y, total)
    b.update(b.add(s, total), s)
    b.name(parts[0], "first")
    path = tmp_path / "model.json"
    save_json(b.freeze(), path)
    np.save(tmp_path / "x.npy", np.array([1.0, 2.0, 3.0]))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("opgraph: error: "), err
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], err


# ----------------------------------------------------------------------------- subcommands
def test_info(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    code, out, err = run(capsys, "info", model)
    assert code == 0 and err == ""
    for fragment in ("ops by kind", "multiply", "split", "const", "%x", "f64[3]", "%total", "f64[]",
                     "update", "%s", "memory estimate", "constants data"):
        assert fragment in out, fragment
    # values: x 24 + s 8 + const 8 + y 24 + total 8 + 3 parts 24 + add 8 = 104 bytes; constants 8 bytes.
    assert "104 B" in out and "112 B" in out


def test_validate_ok_and_invalid(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path) -> None:
    code, out, _ = run(capsys, "validate", model)
    assert code == 0 and out.startswith(f"{model}: ok (")
    doc = json.loads(model.read_text())
    doc["ops"][1]["version"] = 3
    doc["ops"][2]["version"] = 4
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, out, err = run(capsys, "validate", bad)
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"{bad}: invalid (2 problems)"
    assert sorted(lines[1:]) == ["  op 1 (multiply): version 3, the inputs select 12",
                                 "  op 2 (sum): version 4, the inputs select 12"]
    bad.write_text('{"format": "opgraph", "version": 1, "ops": [{"op": "nope"}]}')
    code, out, _ = run(capsys, "validate", bad)
    lines = out.splitlines()
    assert code == 1 and lines[0] == f"{bad}: invalid (1 problem)" and len(lines) == 2
    assert lines[1].startswith("  ops[0].op: unknown op kind 'nope'")


def test_convert_json_to_json(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path) -> None:
    out_path = tmp_path / "copy.txt"
    code, out, err = run(capsys, "convert", model, out_path, "--to", "json", "--inline-limit", "0")
    assert code == 0 and err == "" and "json" in out
    assert "base64" in out_path.read_text()
    assert load_json(out_path).equals(load_json(model), check_names=True)
    code, _, _ = run(capsys, "convert", model, tmp_path / "again.json")
    assert code == 0 and (tmp_path / "again.json").read_bytes() == model.read_bytes()


def test_convert_to_cg_and_back(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path) -> None:
    code, _, err = run(capsys, "convert", model, tmp_path / "m.cg")
    assert code == 0, err
    code, _, err = run(capsys, "convert", tmp_path / "m.cg", tmp_path / "back.json")
    assert code == 0, err
    original, back = load_json(model), load_json(tmp_path / "back.json")
    assert back.equals(original, check_names=True)
    # The JSON copy keeps the .cg reader's file_meta, so writing it back gives the same bytes.
    assert back.file_meta == opgraph.io.load(tmp_path / "m.cg").file_meta
    code, _, err = run(capsys, "convert", tmp_path / "back.json", tmp_path / "again.cg")
    assert code == 0, err
    for suffix in (".cg", ".cgc", ".cgio", ".cgs"):
        assert (tmp_path / f"again{suffix}").read_bytes() == (tmp_path / f"m{suffix}").read_bytes(), suffix
    code, _, err = run(capsys, "convert", model, tmp_path / "other", "--to", "cg")
    assert code == 0, err
    assert opgraph.io.load(tmp_path / "other") == original
    code, out, _ = run(capsys, "info", tmp_path / "m.cg")
    assert code == 0 and "multiply" in out


def test_convert_by_extension_and_by_name(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path) -> None:
    original = load_json(model)
    code, out, err = run(capsys, "convert", model, tmp_path / "m.graphml")
    assert code == 0 and err == "" and out == f"{model} -> {tmp_path / 'm.graphml'} (graphml: 5 ops, 9 values)\n"
    code, _, err = run(capsys, "convert", tmp_path / "m.graphml", tmp_path / "copy.data", "--to", "json")
    assert code == 0, err
    assert load_json(tmp_path / "copy.data") == original
    # --from reads a file whose name says nothing; the output here has no extension: a .cg set.
    code, _, err = run(capsys, "convert", tmp_path / "copy.data", tmp_path / "set", "--from", "json")
    assert code == 0, err
    assert opgraph.io.load(tmp_path / "set") == original
    code, out, _ = run(capsys, "info", tmp_path / "m.graphml")
    assert code == 0 and "split" in out


def test_convert_list_and_formats(capsys: pytest.CaptureFixture[str]) -> None:
    from opgraph.io.formats import formats

    code, listed, err = run(capsys, "convert", "--list")
    assert code == 0 and err == ""
    code, out, _ = run(capsys, "formats")
    assert code == 0 and out == listed
    for fmt in formats():
        assert fmt.name in out and all(s in out for s in fmt.suffixes), fmt.name
    assert "--allow-pickle" in out and "save only" in out


def test_formats_table_without_rich(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    code, out, _ = run(capsys, "formats")
    assert code == 0 and "┃" not in out
    assert any(line.split()[:2] == ["graphml", ".graphml"] for line in out.splitlines())


def test_convert_pickles_need_allow_pickle(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    b = GraphBuilder()
    b.output(b.op("exp", b.input(("float64", (2,)), name="x"), name="y"))
    save_json(b.freeze(), tmp_path / "g.json")
    code, _, err = run(capsys, "convert", tmp_path / "g.json", tmp_path / "g.dag.pkl")
    assert code == 0, err
    code, out, err = run(capsys, "convert", tmp_path / "g.dag.pkl", tmp_path / "back.json")
    assert code == 1 and out == "" and not (tmp_path / "back.json").exists()
    assert_one_line_error(err, "g.dag.pkl: dag files are Python pickles", "arbitrary code", "--allow-pickle")
    code, _, err = run(capsys, "convert", tmp_path / "g.dag.pkl", tmp_path / "back.json", "--allow-pickle")
    assert code == 0, err
    back = load_json(tmp_path / "back.json")
    assert back == b.freeze() and back.symbols.values == b.freeze().symbols.values
    code, _, err = run(capsys, "dump", tmp_path / "g.dag.pkl")  # only convert loads pickles
    assert code == 1
    assert_one_line_error(err, "opgraph convert --allow-pickle")


def test_convert_refuses_what_a_format_cannot_hold(capsys: pytest.CaptureFixture[str], model: Path,
                                                   tmp_path: Path) -> None:
    for name in ("m.onnx", "m.tdag.pkl", "m.pytensor.pkl"):
        code, out, err = run(capsys, "convert", model, tmp_path / name)
        assert code == 1 and out == ""
        assert_one_line_error(err, f"{tmp_path / name}: the ", "format cannot hold this graph", "update")
        assert not (tmp_path / name).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "x.npy"]


def test_convert_drawings(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path) -> None:
    code, _, err = run(capsys, "convert", model, tmp_path / "m.dot")
    assert code == 0, err
    assert (tmp_path / "m.dot").read_text().startswith("digraph opgraph {")
    code, _, err = run(capsys, "convert", tmp_path / "m.dot", tmp_path / "back.json")
    assert code == 2
    assert_one_line_error(err, "dot files are drawings")
    if shutil.which("dot") is None:
        pytest.skip("rendering SVG needs the Graphviz 'dot' binary, which is not on PATH")
    code, _, err = run(capsys, "convert", model, tmp_path / "m.svg")
    assert code == 0, err
    assert "<svg" in (tmp_path / "m.svg").read_text()


def test_run_prints_outputs(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path) -> None:
    code, out, err = run(capsys, "run", model, "--set", f"x={tmp_path / 'x.npy'}")
    assert code == 0 and err == ""
    assert out.splitlines() == ["%y = array([2., 4., 6.])", "%total = array(12.)"]
    code, out, _ = run(capsys, "run", model, "--set", f"%x={tmp_path / 'x.npy'}", "--get", "first", "--get", "%3")
    assert code == 0 and out.splitlines() == ["%first = array([2.])", "%y = array([2., 4., 6.])"]


def test_run_saves_npy_files(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path) -> None:
    outdir = tmp_path / "results"
    np.save(tmp_path / "s.npy", np.array(0.5))
    code, out, err = run(capsys, "run", model, "--set", f"x={tmp_path / 'x.npy'}", "--set", f"s={tmp_path / 's.npy'}",
                         "--get", "total", "--get", "%8", "-o", outdir)
    assert code == 0 and err == ""
    assert sorted(p.name for p in outdir.iterdir()) == ["8.npy", "total.npy"]
    assert np.load(outdir / "total.npy").tolist() == 12.0 and np.load(outdir / "8.npy").tolist() == 12.5
    assert out.splitlines() == [f"wrote {outdir / 'total.npy'}", f"wrote {outdir / '8.npy'}"]


def test_dump(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    code, out, _ = run(capsys, "dump", model)
    assert code == 0 and out == load_json(model).dump() + "\n"
    code, out, _ = run(capsys, "dump", model, "--limit", "1")
    assert code == 0 and "... 4 more ops" in out


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0 and all(c in out for c in ("info", "validate", "convert", "run", "dump"))
    code, out, _ = run(capsys, "run", "--help")
    assert code == 0 and "--set" in out
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"opgraph {opgraph.__version__}"


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("argv, fragments", [
    ([], ["choose a command"]),
    (["frobnicate"], ["invalid choice", "frobnicate"]),
    (["info"], ["required: FILE", "opgraph info --help"]),
    (["run", "m.json", "--set", "x"], ["--set expects NAME=FILE.npy"]),
    (["convert", "a.json", "b.json", "--to", "yaml"], ["invalid choice: 'yaml'"]),
    (["convert", "a.json"], ["required: OUT"]),
    (["convert", "a.json", "b.txt"], ["b.txt: unknown file extension '.txt'", ".graphml", ".dask.pkl", "--to"]),
    (["convert", "a.json", "b.cg", "--inline-limit", "3"], ["--inline-limit applies to JSON output only"]),
    (["dump", "a.json", "--limit", "many"], ["invalid int value"]),
])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], fragments: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert_one_line_error(err, *fragments)


def test_failures_exit_1_with_one_line(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    code, _, err = run(capsys, "info", missing)
    assert code == 1
    assert_one_line_error(err, str(missing), "No such file")

    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "opgraph", "version": 1, "ops": [{"op": "exp", "inputs": ["%q"]}]}')
    for cmd in ("info", "dump", "run"):
        code, _, err = run(capsys, cmd, bad)
        assert code == 1
        assert_one_line_error(err, str(bad), "ops[0].inputs[0]", "unknown value ref '%q'")

    doc = json.loads(model.read_text())
    doc["ops"][1]["version"] = 3
    doc["ops"][2]["version"] = 4
    bad.write_text(json.dumps(doc))
    code, _, err = run(capsys, "dump", bad)  # a multi-line verification report, shown on one line
    assert code == 1
    assert_one_line_error(err, "ops[1]", "graph fails verification", "version 3", "version 4")

    code, _, err = run(capsys, "run", model)
    assert code == 1
    assert_one_line_error(err, "missing feed", "%x")
    code, _, err = run(capsys, "run", model, "--set", f"y={tmp_path / 'x.npy'}")
    assert_one_line_error(err, "%y is computed by the graph")
    code, _, err = run(capsys, "run", model, "--set", f"nope={tmp_path / 'x.npy'}")
    assert code == 1
    assert_one_line_error(err, "no value named 'nope'")
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    code, _, err = run(capsys, "run", model, "--set", f"x={tmp_path / 'obj.npy'}")
    assert code == 1
    assert_one_line_error(err, f"--set x={tmp_path / 'obj.npy'}", "Python objects", "pickle")
    np.save(tmp_path / "wrong.npy", np.zeros(4))
    code, _, err = run(capsys, "run", model, "--set", f"x={tmp_path / 'wrong.npy'}")
    assert code == 1
    assert_one_line_error(err, "expects f64[3]", "shape (4,)")


def test_debug_shows_a_traceback(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    code, _, err = run(capsys, "--debug", "info", bad)
    assert code == 1
    assert "Traceback (most recent call last)" in err and "FormatError" in err
    assert err.splitlines()[-1].startswith("opgraph: error: ") and "malformed JSON" in err
    code, _, err = run(capsys, "info", bad, "--debug")  # also accepted after the command
    assert code == 1 and "Traceback" in err


def test_progress_bars_start_only_after_the_delay(capsys: pytest.CaptureFixture[str]) -> None:
    quick = ProgressBars(delay=10.0, force_terminal=True)
    with progress.installed(quick), progress.task("quick", total=1) as t:
        t.advance(1)
    quick.close()
    assert capsys.readouterr().err == ""  # finished before the delay: nothing drawn
    slow = ProgressBars(delay=0.01, force_terminal=True)
    with progress.installed(slow), progress.task("slow step", total=2) as t:
        time.sleep(0.3)
        t.advance(2)
    slow.close()
    assert "slow step" in capsys.readouterr().err
    failing = ProgressBars(delay=0.01, force_terminal=True)
    with pytest.raises(ZeroDivisionError), progress.installed(failing), progress.task("failing"):
        time.sleep(0.05)
        _ = 1 / 0
    failing.close()
    assert not progress.active()
    capsys.readouterr()


# ----------------------------------------------------------------------------- the installed script
def _command() -> list[str]:
    script = Path(sys.executable).with_name("opgraph")
    return [str(script)] if script.exists() else [sys.executable, "-m", "opgraph.cli.main"]


def test_console_script_in_a_subprocess(model: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    ok = subprocess.run([*_command(), "run", str(model), "--set", f"x={tmp_path / 'x.npy'}", "--get", "total"],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "%total = array(12.)" and ok.stderr == ""
    bad = subprocess.run([*_command(), "validate", str(tmp_path / "nope.json")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert bad.returncode == 1 and bad.stdout == ""
    assert_one_line_error(bad.stderr, "nope.json", "No such file")
    mod = subprocess.run([sys.executable, "-m", "opgraph.cli.main", "dump", str(model)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert mod.returncode == 0 and mod.stdout.startswith("graph(%x: f64[3], %s: f64[]) {")


# ----------------------------------------------------------------------------- docs/cli.md
def _console_commands(body: str) -> list[tuple[str, list[str]]]:
    commands: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif commands:
            commands[-1][1].append(line)
    return commands


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory as tests/test_docs.py prepares one: out/mlp_step.* (the demo's training step), examples/, .venv."""
    work = tmp_path_factory.mktemp("cli-doc")
    out = work / "out"
    out.mkdir()
    code = ("import sys; sys.path.insert(0, 'examples'); import demo, opgraph.io\n"
            "g = demo.build_step(64).graph\n"
            f"opgraph.io.save(g, {str(out / 'mlp_step.cg')!r}); opgraph.io.save(g, {str(out / 'mlp_step.json')!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)  # `.venv/bin/opgraph` as in the repository
    return work


def test_cli_doc_examples_run_as_written(capsys: pytest.CaptureFixture[str], demo_dir: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md follows the docs' fence convention (tests/test_docs.py): its console commands run in order in
    one directory; a command whose shown output starts with ``opgraph: error:`` fails with that line, every other
    one succeeds. ``opgraph`` commands run in this process (fast); the others in bash."""
    text = (ROOT / "docs" / "cli.md").read_text()
    assert all(re.findall(r"^```(\S*)", text, re.M)[::2]), "every opening fence has a language"
    for way in (".venv/bin/opgraph", ". .venv/bin/activate", "pip install -e ."):
        assert way in text[:1500], way
    monkeypatch.chdir(demo_dir)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    ran = set()
    for body in re.findall(r"```console\n(.*?)```", text, re.S):
        for command, expected in _console_commands(body):
            argv = shlex.split(command)
            if argv[0] == "opgraph" and not re.search(r"[|&;<>$]", command):
                code = main(argv[1:])
                out, err = capsys.readouterr()
                ran.add(argv[1])
            else:
                proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=300)
                code, out, err = proc.returncode, proc.stdout, proc.stderr
            if expected and expected[0].startswith("opgraph: error:"):
                # compared up to a trailing ellipsis, as tests/test_docs.py compares it (the engines installed vary)
                want = expected[0].rstrip()
                lines = (out + err).splitlines()
                seen = any(ln.startswith(want[:-3]) for ln in lines) if want.endswith("...") else want in lines
                assert code != 0 and seen, (command, out + err)
            else:
                assert code == 0, (command, out + err)
    assert ran >= {"info", "validate", "dump", "run", "convert", "formats", "optimize", "plan", "viz"}
    assert load_json("again.json").equals(load_json("model.json"), check_names=True)  # through GraphML
    assert load_json("packed.txt") == load_json("model.json")
    assert opgraph.io.load("model.cg") == load_json("model.json") == opgraph.io.load("out/mlp_step.cg")
    assert load_json("mlp2.json").equals(load_json("mlp.json"), check_names=True) or \
        load_json("mlp2.json").symbols.values == load_json("mlp.json").symbols.values


def test_convert_onnx_with_symbolic_dims(tmp_path: Path) -> None:
    """A symbolic dim stays symbolic; --input-shape fixes it, and is needed where a translation needs a size."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])
    axes = helper.make_tensor("ax", TensorProto.INT64, [1], [1])
    node = helper.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], initializer=[axes]),
                              opset_imports=[helper.make_opsetid("", 18)])
    src, dst = tmp_path / "m.onnx", tmp_path / "m.json"
    onnx.save(model, str(src))
    assert main(["convert", str(src), str(dst)]) == 0
    g = opgraph.io.load(str(dst))
    assert g.type_of(g.inputs[0]).shape == (None, 3)
    for n in (1, 5):
        feeds = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
        np.testing.assert_array_equal(g.run({"x": feeds})[0], feeds.sum(axis=1))
    assert main(["convert", str(src), str(dst), "--input-shape", "x=4,3"]) == 0
    g = opgraph.io.load(str(dst))
    assert g.type_of(g.inputs[0]).shape == (4, 3)
    feeds = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(g.run({"x": feeds})[0], feeds.sum(axis=1))
    assert main(["convert", str(src), str(dst), "--input-shape", "x=4,a"]) == 2
    assert main(["convert", str(dst), str(tmp_path / "n.cg"), "--input-shape", "x=4,3"]) == 2
    # auto_pad SAME pads by the spatial size: that dim must be given
    img = helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 1, "H", 5])
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 3, 3], [1.0] * 9)
    conv = helper.make_node("Conv", ["img", "w"], ["out"], auto_pad="SAME_UPPER")
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    onnx.save(helper.make_model(helper.make_graph([conv], "c", [img], [out], initializer=[w]),
                                opset_imports=[helper.make_opsetid("", 18)]), str(tmp_path / "c.onnx"))
    assert main(["convert", str(tmp_path / "c.onnx"), str(tmp_path / "c.json")]) == 1
    assert not (tmp_path / "c.json").exists()
    assert main(["convert", str(tmp_path / "c.onnx"), str(tmp_path / "c.json"), "--input-shape", "img=2,1,4,5"]) == 0


# ----------------------------------------------------------------------------- backends
@pytest.mark.parametrize("engine", [e for e in ("jax", "torch", "onnxruntime")
                                    if importlib.util.find_spec(e) is not None])
def test_run_and_plan_on_a_backend(capsys: pytest.CaptureFixture[str], model: Path, tmp_path: Path,
                                   engine: str) -> None:
    code, out, err = run(capsys, "run", model, "--set", f"x={tmp_path / 'x.npy'}", "--backend", engine)
    assert code == 0 and err == ""
    assert out.splitlines() == ["%y = array([2., 4., 6.])", "%total = array(12.)"]
    code, out, err = run(capsys, "plan", model, "--backend", engine)
    assert code == 0 and err == ""
    assert out.startswith(f"backend {engine} (device cpu); ") and "region 0 on " in out


def test_plan_on_an_unknown_backend_is_one_line(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    code, _out, err = run(capsys, "plan", model, "--backend", "tensorflow")
    assert code == 1
    assert_one_line_error(err, "unknown backend 'tensorflow'")
